"""controller/capacity.py, the executor of capacity on demand, in whole passes against the fake API.

The decisions themselves are test_provisioning.py's; here: which writes a pass makes
and in which order, what the planner may claim, and what the status says.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.support.builders import nodes_of, slice_pods, tpu, tpuslice
from tests.support.fake_kube import FakeKube
from tests.unit.test_reconcile import cluster_body, pods
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model import constants as c
from tpuslice.model.records import (
    Holder,
    NodeInfo,
    ProvisioningRequestInfo,
    ProvisioningView,
    RequestCondition,
    ReservationInfo,
    Snapshot,
)

UID = "uid-llm"
#: a promise of unknown age: every node of its pool
ANY_TIME = datetime.min.replace(tzinfo=UTC)


def body(mode: str = "BestEffortAtomic", **provisioning: Any) -> dict[str, Any]:
    return cluster_body(reservation={"provisioning": {"mode": mode, **provisioning}})


def plain_body() -> dict[str, Any]:
    return cluster_body()


def request(
    name: str = "llm-s0-1",
    *,
    provisioned: bool = False,
    pool: str | None = None,
    cls: str = c.PROVREQ_CLASS_BEST_EFFORT_ATOMIC,
    owner: str = "llm",
) -> ProvisioningRequestInfo:
    now = datetime.now(UTC)  # the pass reads the clock too
    conditions = {"Accepted": RequestCondition("Accepted", "True", "Accepted", "", now)}
    if provisioned:
        conditions["Provisioned"] = RequestCondition(
            "Provisioned", "True", "Provisioned", "", now - timedelta(seconds=5)
        )
    return ProvisioningRequestInfo(
        namespace="ml",
        name=name,
        uid=f"uid-{name}",
        raycluster=owner,
        slice_index=0,
        attempt=int(name.rsplit("-", 1)[1]),
        class_name=cls,
        conditions=conditions,
        details={"NodePoolName": pool} if pool else {},
        created=now - timedelta(seconds=10),
    )


def run(kube: FakeKube, snap: Snapshot, passes: int = 1) -> Reconciler:
    reconciler = Reconciler(kube, lambda key: snap)

    async def go() -> None:
        for _ in range(passes):
            await reconciler.kick(("TPUSliceCluster", "ml", "llm"))

    asyncio.run(go())
    return reconciler


def writes(kube: FakeKube) -> list[tuple[Any, ...]]:
    return [x for x in kube.calls if x[0] not in ("status", "event", "apply")]


def slice_status(kube: FakeKube) -> dict[str, Any]:
    assert kube.status is not None
    return dict(kube.status["slices"][0])


def test_no_pool_creates_the_podtemplate_then_the_request_then_owns_the_template() -> None:
    kube = FakeKube()
    run(kube, Snapshot(body(), pods(), [], [], None, provisioning=ProvisioningView()))
    assert writes(kube) == [
        ("create-podtemplate", "llm-s0-1"),
        ("create-request", "llm-s0-1"),
        ("patch-podtemplate", "llm-s0-1"),
    ]
    template = kube.podtemplates[("ml", "llm-s0-1")]
    owners = template["metadata"]["ownerReferences"]
    assert [o["kind"] for o in owners if o["controller"]] == ["ProvisioningRequest"]
    assert owners[0]["uid"] == "uid-llm-s0-1"
    spec = template["template"]["spec"]
    assert "schedulingGates" not in spec
    assert c.NODE_LABEL_NODEPOOL not in spec["nodeSelector"]
    made = kube.requests[("ml", "llm-s0-1")]
    assert made["spec"]["podSets"] == [{"podTemplateRef": {"name": "llm-s0-1"}, "count": 4}]
    entry = slice_status(kube)
    assert entry["state"] == "Provisioning"
    assert entry["provisioning"] == {"request": "llm-s0-1", "attempt": 1, "failures": 0}
    assert ("event", "ProvisioningRequested") in kube.calls


def test_a_request_the_watch_has_not_shown_yet_is_not_asked_for_twice() -> None:
    kube = FakeKube()
    run(kube, Snapshot(body(), pods(), [], [], None, provisioning=ProvisioningView()), passes=3)
    assert [x for x in kube.calls if x[0] == "create-request"] == [("create-request", "llm-s0-1")]
    assert not [x for x in kube.calls if x[0] == "delete-request"]


def test_provisioned_capacity_is_claimed_and_released_with_the_consume_annotations() -> None:
    kube = FakeKube()
    view = ProvisioningView(requests=(request(provisioned=True),))
    run(kube, Snapshot(body(), pods(), nodes_of("auto-a"), [], None, provisioning=view))
    assert ("claim", "auto-a") in kube.calls
    assert {x[1] for x in kube.calls if x[0] == "release"} == {f"w{i}" for i in range(4)}
    assert kube.annotations["w0"] == {
        c.ANNOTATION_CONSUME_PROVREQ: "llm-s0-1",
        c.ANNOTATION_PROVREQ_CLASS: c.PROVREQ_CLASS_BEST_EFFORT_ATOMIC,
    }
    assert not [x for x in kube.calls if x[0] == "delete-request"]


def test_a_free_pool_while_the_request_waits_wins_and_the_request_goes() -> None:
    """A request not provisioned yet does not own a free pool: the pool is claimed, the
    request deleted, the pods released without consume annotations."""
    kube = FakeKube()
    view = ProvisioningView(requests=(request(),))
    run(kube, Snapshot(body(), pods(), nodes_of("have"), [], None, provisioning=view))
    assert ("claim", "have") in kube.calls
    assert ("delete-request", "llm-s0-1") in kube.calls
    assert kube.annotations == {}


def test_a_missing_crd_stalls_removes_the_template_and_is_not_asked_again_at_once() -> None:
    kube = FakeKube()
    kube.provreq_installed = False
    run(kube, Snapshot(body(), pods(), [], [], None, provisioning=ProvisioningView()), passes=2)
    assert [x for x in kube.calls if x[0] == "create-request"] == [("create-request", "llm-s0-1")]
    assert ("delete-podtemplate", "llm-s0-1") in kube.calls and kube.podtemplates == {}
    assert kube.status is not None
    stalled = next(x for x in kube.status["conditions"] if x["type"] == "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "ProvisioningRequestNotInstalled")


def test_leftover_templates_are_deleted_and_a_request_becomes_its_templates_owner() -> None:
    old = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    owner = ("TPUSliceCluster", "ml", "llm")
    leftover = {
        "owner": owner,
        "namespace": "ml",
        "name": "llm-s0-7",
        "created": old,
        "controller": "",
        "template": {},
    }
    just_now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    young = {**leftover, "name": "llm-s0-8", "created": just_now}
    unowned = {**leftover, "name": "llm-s0-1"}
    kube = FakeKube()
    kube.podtemplates[("ml", "llm-s0-1")] = {"metadata": {"name": "llm-s0-1"}}
    view = ProvisioningView(requests=(request(),), templates=(leftover, young, unowned))
    run(kube, Snapshot(body(), pods(), [], [], None, provisioning=view))
    assert ("delete-podtemplate", "llm-s0-7") in kube.calls
    assert ("delete-podtemplate", "llm-s0-8") not in kube.calls
    assert ("patch-podtemplate", "llm-s0-1") in kube.calls
    owners = kube.podtemplates[("ml", "llm-s0-1")]["metadata"]["ownerReferences"]
    assert owners[0]["uid"] == "uid-llm-s0-1" and owners[0]["controller"] is True


def test_pools_without_the_selected_capacity_labels_are_not_eligible() -> None:
    kube = FakeKube()
    spec = body(nodeSelector={"cloud.google.com/gke-spot": "true"})
    run(
        kube,
        Snapshot(spec, pods(), nodes_of("on-demand"), [], None, provisioning=ProvisioningView()),
    )
    assert "claim" not in [x[0] for x in kube.calls]
    assert ("create-request", "llm-s0-1") in kube.calls
    selector = kube.podtemplates[("ml", "llm-s0-1")]["template"]["spec"]["nodeSelector"]
    assert selector["cloud.google.com/gke-spot"] == "true"
    # the best-effort template keeps the autoscaler off the pool that has nodes
    affinity = kube.podtemplates[("ml", "llm-s0-1")]["template"]["spec"]["affinity"]
    term = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": c.NODE_LABEL_NODEPOOL, "operator": "NotIn", "values": ["on-demand"]} in term[
        "nodeSelectorTerms"
    ][0]["matchExpressions"]
    kube2 = FakeKube()
    run(
        kube2,
        Snapshot(
            spec,
            pods(),
            nodes_of("spot", capacity_labels={"cloud.google.com/gke-spot": "true"}),
            [],
            None,
            provisioning=ProvisioningView(),
        ),
    )
    assert ("claim", "spot") in kube2.calls


def test_a_pool_promised_to_another_objects_request_is_not_claimed() -> None:
    kube = FakeKube()
    view = ProvisioningView(promised_since={"dws-a": ANY_TIME})
    run(kube, Snapshot(plain_body(), pods(), nodes_of("dws-a"), [], None, provisioning=view))
    assert "claim" not in [x[0] for x in kube.calls]
    kube2 = FakeKube()
    run(
        kube2,
        Snapshot(
            plain_body(), pods(), nodes_of("dws-a") + nodes_of("free"), [], None, provisioning=view
        ),
    )
    assert ("claim", "free") in kube2.calls and ("claim", "dws-a") not in kube2.calls


def test_queued_slice_claims_the_pool_its_request_names() -> None:
    kube = FakeKube()
    named = request(provisioned=True, pool="dws-b", cls=c.PROVREQ_CLASS_QUEUED)
    view = ProvisioningView(requests=(named,))
    snap = Snapshot(
        body("QueuedProvisioning"),
        pods(),
        nodes_of("dws-a") + nodes_of("dws-b"),
        [],
        None,
        provisioning=view,
    )
    run(kube, snap)
    assert ("claim", "dws-b") in kube.calls and ("claim", "dws-a") not in kube.calls
    assert kube.annotations["w0"][c.ANNOTATION_CONSUME_PROVREQ] == "llm-s0-1"


def test_a_running_slice_keeps_its_request_and_a_removed_slice_loses_it() -> None:
    held = ReservationInfo("auto-a", Holder("ml", "llm", UID, "tpu-aaaaa", 0), "Bound")
    view = ProvisioningView(requests=(request(provisioned=True),))
    kube = FakeKube()
    run(
        kube,
        Snapshot(
            body(),
            pods(gated=False, pool="auto-a"),
            nodes_of("auto-a"),
            [held],
            None,
            provisioning=view,
        ),
    )
    assert not [x for x in kube.calls if x[0] == "delete-request"]
    gone = FakeKube()
    run(gone, Snapshot(body(), [], nodes_of("auto-a"), [held], None, provisioning=view))
    assert ("delete-request", "llm-s0-1") in gone.calls


def test_an_object_without_provisioning_makes_no_capacity_calls() -> None:
    kube = FakeKube()
    run(kube, Snapshot(plain_body(), pods(), [], [], None, provisioning=ProvisioningView()))
    assert not [x for x in kube.calls if "request" in x[0] or "podtemplate" in x[0]]


def test_a_waiting_best_effort_template_follows_the_pools_that_have_nodes() -> None:
    owner = ("TPUSliceCluster", "ml", "llm")
    stored = {
        "owner": owner,
        "namespace": "ml",
        "name": "llm-s0-1",
        "created": "",
        "controller": "uid-llm-s0-1",
        "template": {"spec": {"nodeSelector": {}}},
    }
    kube = FakeKube()
    kube.podtemplates[("ml", "llm-s0-1")] = {"metadata": {"name": "llm-s0-1"}, "template": {}}
    spec = body(nodeSelector={"cloud.google.com/gke-spot": "true"})
    view = ProvisioningView(requests=(request(),), templates=(stored,))
    run(kube, Snapshot(spec, pods(), nodes_of("busy"), [], None, provisioning=view))
    assert ("patch-podtemplate", "llm-s0-1") in kube.calls
    patched = kube.podtemplates[("ml", "llm-s0-1")]["template"]["spec"]["affinity"]
    term = patched["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["busy"]


def test_a_services_pass_for_one_raycluster_sees_only_its_requests() -> None:
    """A TPUSliceService plans each RayCluster apart: the pass for ``svc-a`` decides
    svc-a's requests and those of RayClusters the service no longer has, never the
    pending upgrade cluster's."""
    from tpuslice.controller.capacity import Provisioner
    from tpuslice.controller.expectations import Expectations
    from tpuslice.controller.recorder import Recorder
    from tpuslice.model.records import ClusterRef
    from tpuslice.spec.slices import parse_slice_parts

    kube = FakeKube()
    provisioner = Provisioner(kube, Recorder(kube), Expectations())
    mine = request("svc-a-s0-1", owner="svc-a")
    upgrade = request("svc-b-s0-1", owner="svc-b")
    dead = request("svc-old-s0-1", owner="svc-old")
    view = ProvisioningView(requests=(mine, upgrade, dead))
    snap = Snapshot(
        body(), [], [], [], None, rayclusters={"svc-a": {}, "svc-b": {}}, provisioning=view
    )
    ref = ClusterRef("ml", "svc", "uid-svc", kind="TPUSliceService", ray_cluster="svc-a")
    work = provisioner.begin(ref, parse_slice_parts(body()), snap, {})
    assert work is not None
    assert {r.name for r in work.view.requests} == {"svc-a-s0-1", "svc-old-s0-1"}


# ---------------------------------------------------------------- the other kinds
def test_a_job_asks_for_its_current_rayclusters_slice_by_that_rayclusters_name() -> None:
    """A TPUSliceJob goes through the same actuator: the request is named by the
    attempt's RayCluster (``<job>-<random>``) and labelled with the owner kind."""
    from tpuslice.controller.job import JobKind
    from tpuslice.model.convert import ray_owner_info

    job = tpuslice(
        c.KIND_JOB,
        "train",
        uid="uid-train",
        generation=1,
        tpu=tpu(slices=1),
        job={"entrypoint": "python train.py"},
        reservation={"provisioning": {"mode": "QueuedProvisioning"}},
    )
    workers = slice_pods(
        "tpu-bbbbb",
        name="w{host}",
        cluster="train",
        owner_kind="TPUSliceJob",
        ray_cluster="train-x7k2p",
    )
    rayjob = ray_owner_info(
        {
            "metadata": {
                "name": "train",
                "namespace": "ml",
                "uid": "ray-uid",
                "ownerReferences": [{"uid": "uid-train", "controller": True}],
            },
            "status": {"jobDeploymentStatus": "Initializing", "rayClusterName": "train-x7k2p"},
        }
    )
    snap = Snapshot(job, workers, [], [], None, owned=rayjob, provisioning=ProvisioningView())
    kube = FakeKube()
    asyncio.run(
        Reconciler(kube, lambda key: snap, adapter=JobKind()).kick(("TPUSliceJob", "ml", "train"))
    )
    made = kube.requests[("ml", "train-x7k2p-s0-1")]
    assert made["metadata"]["labels"][c.LABEL_OWNER_KIND] == "TPUSliceJob"
    assert made["metadata"]["labels"][c.LABEL_RAYCLUSTER] == "train-x7k2p"
    assert made["metadata"]["ownerReferences"][0]["kind"] == "TPUSliceJob"
    assert made["spec"]["provisioningClassName"] == c.PROVREQ_CLASS_QUEUED
    template = kube.podtemplates[("ml", "train-x7k2p-s0-1")]["template"]["spec"]
    assert any(t.get("key") == c.QUEUED_TAINT_KEY for t in template["tolerations"])


def test_a_gang_leaves_the_first_slices_to_free_pools_and_asks_for_the_rest() -> None:
    spec = body()
    spec["spec"]["tpu"]["slices"] = 2
    two = pods() + slice_pods("tpu-bbbbb", 1, name="v{host}")
    kube = FakeKube()
    run(kube, Snapshot(spec, two, nodes_of("have"), [], None, provisioning=ProvisioningView()))
    assert [x for x in kube.calls if x[0] == "create-request"] == [("create-request", "llm-s1-1")]
    assert "claim" not in [x[0] for x in kube.calls]  # the gang needs both pools at once
    # the next pass, the request waiting: slice 0 still left to the free pool
    waiting = replace(request("llm-s1-1"), slice_index=1)
    again = FakeKube()
    view = ProvisioningView(requests=(waiting,))
    run(again, Snapshot(spec, two, nodes_of("have"), [], None, provisioning=view))
    assert not [x for x in again.calls if x[0] in ("create-request", "delete-request")]


def test_a_pool_stamped_in_the_requests_second_is_an_existing_pool() -> None:
    """Timestamps have whole seconds: a free pool whose nodes carry the same second as
    the gang's one request is not that request's capacity (seen in CI: the pool had been
    added just before, and slice 0 asked too). Slice 0 stays left to it."""
    spec = body()
    spec["spec"]["tpu"]["slices"] = 2
    two = pods() + slice_pods("tpu-bbbbb", 1, name="v{host}")
    second = datetime.now(UTC).replace(microsecond=0)
    same = [replace(n, created=second.strftime("%Y-%m-%dT%H:%M:%SZ")) for n in nodes_of("have")]
    waiting = replace(request("llm-s1-1"), slice_index=1, created=second)
    kube = FakeKube()
    view = ProvisioningView(requests=(waiting,))
    run(kube, Snapshot(spec, two, same, [], None, provisioning=view))
    assert not [x for x in kube.calls if x[0] in ("create-request", "delete-request")], kube.calls


def test_a_pool_newer_than_the_waiting_request_waits_for_its_provisioned_before_release() -> None:
    """Best-effort: the slice holds a pool whose nodes came after its request, and the
    watch has not shown the request's Provisioned yet: the release waits (so the pods
    carry the consume annotations), for at most FRESH_HOLD_SECONDS of the nodes' age."""
    now = datetime.now(UTC)

    def fresh(pool: str, age: float) -> list[NodeInfo]:
        stamp = (now - timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return [replace(n, created=stamp) for n in nodes_of(pool)]

    held = ReservationInfo("auto-a", Holder("ml", "llm", UID, "tpu-aaaaa", 0))
    waiting = replace(request(), created=now - timedelta(seconds=120))
    view = ProvisioningView(requests=(waiting,))
    kube = FakeKube()
    run(kube, Snapshot(body(), pods(), fresh("auto-a", 2), [held], None, provisioning=view))
    assert not [x for x in kube.calls if x[0] in ("release", "delete-request")], kube.calls
    late = FakeKube()
    run(late, Snapshot(body(), pods(), fresh("auto-a", 60), [held], None, provisioning=view))
    assert ("delete-request", "llm-s0-1") in late.calls
    assert {x[1] for x in late.calls if x[0] == "release"} == {f"w{i}" for i in range(4)}


def revoked(info: ProvisioningRequestInfo, **changes: Any) -> ProvisioningRequestInfo:
    now = datetime.now(UTC)
    conditions = {
        **info.conditions,
        "BookingExpired": RequestCondition("BookingExpired", "True", "BookingExpired", "", now),
        "CapacityRevoked": RequestCondition("CapacityRevoked", "True", "Revoked", "", now),
    }
    return replace(info, conditions=conditions, **changes)


def test_revoked_capacity_keeps_its_request_and_its_pool_from_everyone_until_the_nodes_go() -> None:
    """GKE deletes the VMs after CapacityRevoked, but their nodes linger: the slice is
    replaced, and its request is kept (marked with the pool) so that no slice, the
    replacement included, claims the pool before its nodes are gone."""
    held = ReservationInfo("auto-a", Holder("ml", "llm", UID, "tpu-aaaaa", 0), "Bound")
    running = [
        replace(p, node_name=f"auto-a-{p.host_index}") for p in pods(gated=False, pool="auto-a")
    ]
    lost = revoked(request(provisioned=True))
    kube = FakeKube()
    kube.requests[("ml", "llm-s0-1")] = {"metadata": {"name": "llm-s0-1"}}
    view = ProvisioningView(requests=(lost,))
    run(kube, Snapshot(body(), running, nodes_of("auto-a"), [held], None, provisioning=view))
    assert {x[1] for x in kube.calls if x[0] == "delete-pod"} == {f"w{i}" for i in range(4)}
    assert ("annotate-request", "llm-s0-1", {c.ANNOTATION_REVOKED_POOL: "auto-a"}) in kube.calls
    assert not [x for x in kube.calls if x[0] == "delete-request"]

    # KubeRay's new replica, the pool's nodes still there: it asks again, claims nothing
    retired = replace(lost, revoked_pool="auto-a")
    view = ProvisioningView(requests=(retired,), revoked_pools=frozenset({"auto-a"}))
    new = [replace(p, replica_name="tpu-bbbbb", name=f"n{p.host_index}") for p in pods()]
    kube = FakeKube()
    run(kube, Snapshot(body(), new, nodes_of("auto-a"), [], None, provisioning=view))
    assert "claim" not in [x[0] for x in kube.calls]
    assert ("create-request", "llm-s0-2") in kube.calls
    assert not [x for x in kube.calls if x[0] == "delete-request"]
    assert slice_status(kube)["provisioning"]["attempt"] == 2

    # another object does not claim it either
    other = FakeKube()
    run(other, Snapshot(plain_body(), pods(), nodes_of("auto-a"), [], None, provisioning=view))
    assert "claim" not in [x[0] for x in other.calls]

    # the nodes are gone: the retired request goes
    kube = FakeKube()
    view = ProvisioningView(
        requests=(retired, request("llm-s0-2")), revoked_pools=view.revoked_pools
    )
    run(kube, Snapshot(body(), new, [], [], None, provisioning=view))
    assert ("delete-request", "llm-s0-1") in kube.calls
    assert ("delete-request", "llm-s0-2") not in kube.calls


def test_the_attempt_count_is_written_with_the_request_it_describes() -> None:
    """The attempt and failure counts are read back from status (a request deleted by
    someone is followed by attempt 2, not a second attempt 1): a status that changes
    them is written at once, never held to fold with the next change."""
    kube = FakeKube()
    snaps = [Snapshot(body(), pods()[:3], [], [], None, provisioning=ProvisioningView())]
    reconciler = Reconciler(kube, lambda key: snaps[0])

    async def scenario() -> None:
        await reconciler.kick(
            ("TPUSliceCluster", "ml", "llm")
        )  # 3 of 4 pods: the first status, no request
        assert kube.status is not None and "provisioning" not in kube.status["slices"][0]
        snaps[0] = replace(snaps[0], pods=pods())
        await reconciler.kick(
            ("TPUSliceCluster", "ml", "llm")
        )  # all pods: the request, and its count
        assert ("create-request", "llm-s0-1") in kube.calls
        assert kube.status["slices"][0]["provisioning"]["attempt"] == 1

    asyncio.run(scenario())
