"""Passes of TPUSliceJobs and TPUSliceServices against a fake API, and the pure rules of
a job keeping its pools between attempts (``reservation.handovers``, ``kept_frees``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.builders import holder, nodes_of, reservation, slice_pods, tpu, tpuslice
from tests.support.fake_kube import FakeKube
from tpuslice.controller.job import JobKind
from tpuslice.controller.reconciler import Reconciler
from tpuslice.controller.service import ServiceKind, service_clusters
from tpuslice.model import constants as c
from tpuslice.model.convert import ray_owner_info
from tpuslice.model.records import ClusterRef, PodInfo, ReservationInfo, Snapshot
from tpuslice.planning.pools import handovers, kept_frees

JOB_UID, SVC_UID = "uid-train", "uid-serve"
JOB = ClusterRef("ml", "train", JOB_UID, kind="TPUSliceJob")


def job_body(**job: Any) -> dict[str, Any]:
    return tpuslice(
        c.KIND_JOB,
        "train",
        uid=JOB_UID,
        generation=1,
        tpu=tpu(slices=1),
        job={"entrypoint": "python train.py", "backoffLimit": 2, **job},
    )


def service_body() -> dict[str, Any]:
    return tpuslice(
        c.KIND_SERVICE,
        "serve",
        uid=SVC_UID,
        generation=1,
        tpu=tpu(slices=1),
        serve={"serveConfigV2": "applications: []\n"},
    )


def worker_pods(
    owner: str,
    kind: str,
    replica: str,
    ray_cluster: str,
    *,
    index: int = 0,
    gated: bool = True,
    pool: str | None = None,
    deleting: bool = False,
) -> list[PodInfo]:
    """One slice's workers of ``owner``'s RayCluster; running and ready once ungated."""
    return slice_pods(
        replica,
        index,
        name="{replica}-w{host}",
        cluster=owner,
        gated=gated,
        pool=pool,
        ready=not gated,
        deleting=deleting,
        owner_kind=kind,
        ray_cluster=ray_cluster,
    )


def held(
    pool: str, replica: str, *, index: int = 0, uid: str = JOB_UID, **owner: Any
) -> ReservationInfo:
    owner.setdefault("kind", c.KIND_JOB)
    owner.setdefault("name", "train")
    return reservation(
        pool,
        holder(replica, index, uid=uid, **owner),
        phase="Bound",
        uid=f"r-{pool}",
        resource_version="7",
    )


def owned(uid: str, status: dict[str, Any]) -> dict[str, Any]:
    """A RayJob / RayService as the watch shows it: ours (controlled by ``uid``)."""
    return ray_owner_info(
        {
            "metadata": {
                "name": "x",
                "namespace": "ml",
                "uid": "ray-uid",
                "ownerReferences": [{"uid": uid, "controller": True}],
            },
            "status": status,
        }
    )


def run(reconciler: Any, key: tuple[str, str, str]) -> None:
    asyncio.run(reconciler.kick(key))


# ---------------------------------------------------------------- the pure rules
def test_a_new_attempts_slices_get_the_pools_of_the_old_ones_by_index() -> None:
    pods = worker_pods("train", "TPUSliceJob", "new-1", "train-b", index=1) + worker_pods(
        "train", "TPUSliceJob", "new-0", "train-b", index=0
    )
    reservations = [held("pool-a", "old-0", index=0), held("pool-b", "old-1", index=1)]
    given = handovers(JOB, hosts=4, desired_slices=2, pods=pods, reservations=reservations)
    assert [(h.pool, h.holder.replica_name, h.holder.replica_index) for h in given] == [
        ("pool-a", "new-0", 0),
        ("pool-b", "new-1", 1),
    ]
    assert all(h.holder.kind == "TPUSliceJob" and h.holder.uid == JOB_UID for h in given)


def test_a_pool_waits_for_the_new_slice_of_its_own_index() -> None:
    """KubeRay made the new slice 1 first, and the old slice 1 still has pods: the old
    slice 0's pool is not given to the new slice 1 (that swapped the pools in CI); it
    waits for the new slice 0. A pool of an index the new attempt has no slice for goes
    to whoever wants one."""
    old_1 = worker_pods("train", "TPUSliceJob", "old-1", "train-a", index=1, pool="pool-b")
    new_1 = worker_pods("train", "TPUSliceJob", "new-1", "train-b", index=1)
    reservations = [held("pool-a", "old-0", index=0), held("pool-b", "old-1", index=1)]
    given = handovers(JOB, hosts=4, desired_slices=2, pods=old_1 + new_1, reservations=reservations)
    assert given == ()
    spare = [held("pool-a", "old-0", index=0), held("pool-c", "old-2", index=2)]
    given = handovers(JOB, hosts=4, desired_slices=2, pods=old_1 + new_1, reservations=spare)
    assert [(h.pool, h.holder.replica_name) for h in given] == [("pool-c", "new-1")]


def test_no_handover_while_the_old_slice_has_pods_or_to_a_released_slice() -> None:
    terminating = worker_pods("train", "TPUSliceJob", "old-0", "train-a", deleting=True)
    new = worker_pods("train", "TPUSliceJob", "new-0", "train-b")
    assert (
        handovers(
            JOB,
            hosts=4,
            desired_slices=1,
            pods=terminating + new,
            reservations=[held("pool-a", "old-0")],
        )
        == ()
    )
    released = worker_pods("train", "TPUSliceJob", "new-0", "train-b", gated=False, pool="pool-x")
    assert (
        handovers(
            JOB, hosts=4, desired_slices=1, pods=released, reservations=[held("pool-a", "old-0")]
        )
        == ()
    )
    # another holder's pool is never handed over
    other = held("pool-a", "old-0", uid="someone-else")
    assert handovers(JOB, hosts=4, desired_slices=1, pods=new, reservations=[other]) == ()


def test_a_job_keeps_what_it_wants_and_gives_back_the_excess() -> None:
    reservations = [held("pool-a", "old-0"), held("pool-b", "old-1", index=1)]
    assert kept_frees(["pool-a", "pool-b"], JOB, desired_slices=2, reservations=reservations) == ()
    assert kept_frees(["pool-a", "pool-b"], JOB, desired_slices=1, reservations=reservations) == (
        "pool-a",
    )
    assert kept_frees(["pool-a", "pool-b"], JOB, desired_slices=0, reservations=reservations) == (
        "pool-a",
        "pool-b",
    )


# ---------------------------------------------------------------- TPUSliceJob passes
def test_a_retry_hands_the_pool_over_and_releases_the_new_slice_without_a_claim() -> None:
    kube = FakeKube()
    snap = Snapshot(
        job_body(),
        worker_pods("train", "TPUSliceJob", "new-0", "train-b"),
        nodes_of("pool-a", "pool-b"),
        [held("pool-a", "old-0")],
        None,
        owned=owned(JOB_UID, {"jobDeploymentStatus": "Running", "rayClusterName": "train-b"}),
    )
    run(Reconciler(kube, lambda key: snap, adapter=JobKind()), ("TPUSliceJob", "ml", "train"))
    assert ("handover", "pool-a", "new-0") in kube.calls
    assert not [c for c in kube.calls if c[0] == "claim"]
    assert sorted(c for c in kube.calls if c[0] == "release") == [
        ("release", f"new-0-w{i}", "pool-a") for i in range(4)
    ]
    assert kube.status is not None and kube.status["rayCluster"] == "train-b"
    assert kube.status["slices"][0]["nodePool"] == "pool-a"


def test_between_attempts_the_job_keeps_its_pool_and_claims_nothing() -> None:
    kube = FakeKube()
    snap = Snapshot(
        job_body(),
        [],
        nodes_of("pool-a", "pool-b"),
        [held("pool-a", "old-0")],
        None,
        owned=owned(JOB_UID, {"jobDeploymentStatus": "Retrying", "failed": 1}),
    )
    run(Reconciler(kube, lambda key: snap, adapter=JobKind()), ("TPUSliceJob", "ml", "train"))
    assert not [c for c in kube.calls if c[0] in ("free", "claim", "handover")], kube.calls
    assert kube.status is not None and kube.status["attempts"] == 1


def test_an_ended_job_gives_its_pools_back_once_its_pods_are_gone() -> None:
    kube = FakeKube()
    snap = Snapshot(
        job_body(),
        [],
        nodes_of("pool-a"),
        [held("pool-a", "old-0")],
        None,
        owned=owned(JOB_UID, {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}),
    )
    run(Reconciler(kube, lambda key: snap, adapter=JobKind()), ("TPUSliceJob", "ml", "train"))
    assert ("free", "pool-a") in kube.calls
    assert kube.status is not None
    complete = next(c for c in kube.status["conditions"] if c["type"] == "Complete")
    assert complete["status"] == "True"


def test_the_rayjob_is_applied_with_the_jobs_labels() -> None:
    kube = FakeKube()
    snap = Snapshot(job_body(), [], nodes_of("pool-a"), [], None)
    run(Reconciler(kube, lambda key: snap, adapter=JobKind()), ("TPUSliceJob", "ml", "train"))
    (rayjob,) = kube.applied
    assert rayjob["kind"] == "RayJob"
    assert rayjob["metadata"]["labels"]["tpuslice.dev/job"] == "train"
    assert rayjob["metadata"]["ownerReferences"][0]["kind"] == "TPUSliceJob"


# ---------------------------------------------------------------- TPUSliceService passes
def test_each_cluster_of_a_service_is_planned_apart_and_the_serving_pool_is_kept() -> None:
    kube = FakeKube()
    active = worker_pods("serve", "TPUSliceService", "act-0", "serve-a", gated=False, pool="pool-a")
    upgrade = worker_pods("serve", "TPUSliceService", "new-0", "serve-b")
    serving = held(
        "pool-a", "act-0", uid=SVC_UID, kind="TPUSliceService", name="serve", ray_cluster="serve-a"
    )
    snap = Snapshot(
        service_body(),
        active + upgrade,
        nodes_of("pool-a", "pool-b"),
        [serving],
        None,
        owned=owned(
            SVC_UID,
            {
                "activeServiceStatus": {"rayClusterName": "serve-a"},
                "pendingServiceStatus": {"rayClusterName": "serve-b"},
            },
        ),
        rayclusters={"serve-a": {"state": "ready"}, "serve-b": {"state": None}},
    )
    assert service_clusters(snap) == ["serve-a", "serve-b"]
    run(
        Reconciler(kube, lambda key: snap, adapter=ServiceKind()),
        ("TPUSliceService", "ml", "serve"),
    )
    assert [c for c in kube.calls if c[0] == "claim"] == [("claim", "pool-b")]
    assert not [c for c in kube.calls if c[0] == "free"]
    assert sorted(c for c in kube.calls if c[0] == "release") == [
        ("release", f"new-0-w{i}", "pool-b") for i in range(4)
    ]


def test_an_upgrade_without_a_spare_pool_waits_and_says_so() -> None:
    kube = FakeKube()
    active = worker_pods("serve", "TPUSliceService", "act-0", "serve-a", gated=False, pool="pool-a")
    upgrade = worker_pods("serve", "TPUSliceService", "new-0", "serve-b")
    serving = held(
        "pool-a", "act-0", uid=SVC_UID, kind="TPUSliceService", name="serve", ray_cluster="serve-a"
    )
    snap = Snapshot(
        service_body(),
        active + upgrade,
        nodes_of("pool-a"),
        [serving],
        None,
        owned=owned(
            SVC_UID,
            {
                "activeServiceStatus": {"rayClusterName": "serve-a"},
                "pendingServiceStatus": {"rayClusterName": "serve-b"},
                "serviceStatus": "Running",
            },
        ),
        rayclusters={"serve-a": {"state": "ready"}, "serve-b": {"state": None}},
    )
    run(
        Reconciler(kube, lambda key: snap, adapter=ServiceKind()),
        ("TPUSliceService", "ml", "serve"),
    )
    assert not [c for c in kube.calls if c[0] in ("claim", "free", "release")], kube.calls
    assert kube.status is not None
    reasons = {c["type"]: c["reason"] for c in kube.status["conditions"]}
    assert "UpgradeWaitingForCapacity" in reasons.values(), kube.status["conditions"]


def test_the_pool_of_a_cluster_kuberay_deleted_is_given_back_once_its_pods_are_gone() -> None:
    kube = FakeKube()
    old = held(
        "pool-a",
        "old-0",
        uid=SVC_UID,
        kind="TPUSliceService",
        name="serve",
        ray_cluster="serve-old",
    )
    snap = Snapshot(service_body(), [], nodes_of("pool-a"), [old], None, owned=owned(SVC_UID, {}))
    run(
        Reconciler(kube, lambda key: snap, adapter=ServiceKind()),
        ("TPUSliceService", "ml", "serve"),
    )
    assert ("free", "pool-a") in kube.calls


@pytest.mark.parametrize(
    ("body", "adapter", "key"),
    [
        (job_body, JobKind(), ("TPUSliceJob", "ml", "train")),
        (service_body, ServiceKind(), ("TPUSliceService", "ml", "serve")),
    ],
)
def test_a_job_or_service_with_a_bad_spec_is_stalled_naming_the_field(
    body: Any, adapter: Any, key: tuple[str, str, str]
) -> None:
    """The pass is the same for every kind: a spec error ends the pass as InvalidSpec
    naming the field, with the count the object asked for, and nothing applied."""
    bad = body()
    bad["spec"]["tpu"]["topology"] = "3x3"
    kube = FakeKube()
    run(Reconciler(kube, lambda k: Snapshot(bad, [], [], [], None), adapter=adapter), key)
    stalled = next(x for x in kube.status["conditions"] if x["type"] == "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "InvalidSpec")
    assert "spec.tpu.topology" in stalled["message"]
    assert not [call for call in kube.calls if call[0] == "apply"]
