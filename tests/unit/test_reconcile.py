"""One reconcile pass against a fake API: what it writes, and when it writes nothing."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tests.support.builders import nodes_of, slice_pods, tpu, tpuslice
from tests.support.fake_kube import FakeKube
from tpuslice.controller.applier import applied_hash
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model.convert import raycluster_info
from tpuslice.model.records import Holder, PodInfo, ReservationInfo, Snapshot
from tpuslice.render.kuberay import render_cluster
from tpuslice.runtime.kube import ApiError

UID = "uid-llm"


def cluster_body(**spec: Any) -> dict[str, Any]:
    """The TPUSliceCluster ``ml/llm``: one v6e 4x4 slice, plus ``spec``."""
    return tpuslice(uid=UID, generation=1, tpu=tpu(slices=1), **spec)


def pods(**fields: Any) -> list[PodInfo]:
    """The four workers ``w0``..``w3`` of slice 0 (``tpu-aaaaa``) of ``ml/llm``."""
    return slice_pods(name="w{host}", **fields)


def run(reconciler: Reconciler) -> None:
    asyncio.run(reconciler.kick(("TPUSliceCluster", "ml", "llm")))


def make(kube: FakeKube, snap: Snapshot) -> Reconciler:
    return Reconciler(kube, lambda key: snap)


def kinds(kube: FakeKube) -> list[Any]:
    return [c[0] for c in kube.calls]


def test_first_pass_applies_claims_releases_and_reports() -> None:
    kube = FakeKube()
    snap = Snapshot(cluster_body(), pods(), nodes_of("pool-a"), [], None)
    run(make(kube, snap))
    assert ("apply", "llm") in kube.calls and ("claim", "pool-a") in kube.calls
    assert [c for c in kube.calls if c[0] == "release"] == [
        ("release", f"w{i}", "pool-a") for i in range(4)
    ]
    assert kube.status is not None
    ready = next(c for c in kube.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    assert kube.status["slices"][0]["nodePool"] == "pool-a"


def test_steady_state_makes_no_api_writes() -> None:
    body = cluster_body()
    rendered = render_cluster(body)
    rendered["metadata"]["annotations"] = {"tpuslice.dev/applied-hash": applied_hash(rendered)}
    rc = raycluster_info({**rendered, "status": {"state": "ready"}})
    reservation = ReservationInfo("pool-a", Holder("ml", "llm", UID, "tpu-aaaaa", 0), "Bound")
    snap = Snapshot(
        body, pods(gated=False, ready=True, pool="pool-a"), nodes_of("pool-a"), [reservation], rc
    )
    first = FakeKube()
    run(make(first, snap))
    # the first pass reports Ready once: status, the slice's event, the cluster's event
    assert first.calls == [("status",), ("event", "SliceReady"), ("event", "Ready")]
    body["status"] = first.status
    second = FakeKube()
    run(make(second, Snapshot(body, snap.pods, snap.nodes, snap.reservations, rc)))
    assert second.calls == []


def test_kuberay_missing_is_stalled_with_the_fix() -> None:
    kube = FakeKube(apply_error=ApiError(404, "NotFound", "the server could not find"))
    run(make(kube, Snapshot(cluster_body(), [], nodes_of("pool-a"), [], None)))
    assert kube.status is not None
    stalled = next(c for c in kube.status["conditions"] if c["type"] == "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "KubeRayNotInstalled")
    assert "install KubeRay" in stalled["message"]
    assert ("event", "KubeRayNotInstalled") in kube.calls


def test_pods_without_multihost_labels_stall_and_are_never_released() -> None:
    kube = FakeKube()
    run(make(kube, Snapshot(cluster_body(), pods(labelled=False), nodes_of("pool-a"), [], None)))
    assert "release" not in kinds(kube) and "claim" not in kinds(kube)
    stalled = next(c for c in kube.status["conditions"] if c["type"] == "Stalled")  # type: ignore[index]
    assert stalled["reason"] == "MultiHostIndexingDisabled"
    assert "--feature-gates=RayMultiHostIndexing=true" in stalled["message"]


def test_override_conflict_is_stalled_invalid_spec_and_nothing_applied() -> None:
    body = cluster_body(
        worker={
            "template": {"spec": {"nodeSelector": {"cloud.google.com/gke-tpu-topology": "8x8"}}}
        }
    )
    kube = FakeKube()
    run(make(kube, Snapshot(body, [], [], [], None)))
    assert "apply" not in kinds(kube)
    stalled = next(c for c in kube.status["conditions"] if c["type"] == "Stalled")  # type: ignore[index]
    assert stalled["reason"] == "InvalidSpec"
    assert "gke-tpu-topology" in stalled["message"]


def test_lost_claim_releases_nothing() -> None:
    other = ReservationInfo("pool-a", Holder("ml", "other", "uid-other", "tpu-zzzzz", 0))
    kube = FakeKube(taken={"pool-a": other})
    reconciler = make(kube, Snapshot(cluster_body(), pods(), nodes_of("pool-a"), [], None))
    run(reconciler)
    assert ("claim", "pool-a") in kube.calls
    assert "release" not in kinds(kube)
    assert ("event", "ReservationConflict") in kube.calls
    # the claim lost to another holder is counted (tpuslice_claims_lost_total)
    assert reconciler.metrics.claims_lost._value.get() == 1


def test_the_loser_of_a_claim_replans_at_once_and_takes_another_free_pool() -> None:
    """The loser must not report Reserved on the winner's pool until a resync."""
    other = ReservationInfo("pool-a", Holder("ml", "other", "uid-other", "tpu-zzzzz", 0))
    kube = FakeKube(taken={"pool-a": other})
    run(
        make(
            kube,
            Snapshot(cluster_body(), pods(), nodes_of("pool-a") + nodes_of("pool-b"), [], None),
        )
    )
    assert [c for c in kube.calls if c[0] == "claim"] == [("claim", "pool-a"), ("claim", "pool-b")]
    (slice_,) = kube.status["slices"]
    assert slice_["nodePool"] == "pool-b" and slice_["state"] != "WaitingForCapacity"


def test_the_loser_with_no_other_pool_says_who_holds_it_in_the_same_pass() -> None:
    other = ReservationInfo("pool-a", Holder("ml", "other", "uid-other", "tpu-zzzzz", 0))
    kube = FakeKube(taken={"pool-a": other})
    run(make(kube, Snapshot(cluster_body(), pods(), nodes_of("pool-a"), [], None)))
    (slice_,) = kube.status["slices"]
    assert slice_["state"] == "WaitingForCapacity" and "nodePool" not in slice_
    assert "held by ml/other (pool-a)" in slice_["message"]


def test_deleting_cluster_is_left_to_the_finalizer() -> None:
    body = cluster_body()
    body["metadata"]["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    kube = FakeKube()
    run(make(kube, Snapshot(body, pods(), nodes_of("pool-a"), [], None)))
    assert kube.calls == []


def test_lifting_suspend_reapplies_although_every_sent_field_matches() -> None:
    suspended = cluster_body(suspend=True)
    rendered = render_cluster(suspended)
    rendered["metadata"]["annotations"] = {"tpuslice.dev/applied-hash": applied_hash(rendered)}
    rendered["metadata"]["managedFields"] = [
        {
            "manager": "tpuslice-operator",
            "operation": "Apply",
            "fieldsV1": {"f:spec": {"f:suspend": {}}},
        }
    ]
    rc = raycluster_info(rendered)
    kube = FakeKube()
    run(make(kube, Snapshot(cluster_body(suspend=False), [], [], [], rc)))
    assert ("apply", "llm") in kube.calls
    assert kube.applied[-1]["spec"]["suspend"] is False  # KubeRay resumes only on false


def test_someone_elses_suspend_is_left_alone() -> None:
    """Kueue suspends RayClusters it has not admitted; we never send suspend then."""
    body = cluster_body()
    rendered = render_cluster(body)
    rendered["metadata"]["annotations"] = {"tpuslice.dev/applied-hash": applied_hash(rendered)}
    rendered["spec"]["suspend"] = True
    rendered["metadata"]["managedFields"] = [
        {"manager": "kueue", "operation": "Update", "fieldsV1": {"f:spec": {"f:suspend": {}}}}
    ]
    kube = FakeKube()
    run(make(kube, Snapshot(body, [], [], [], raycluster_info(rendered))))
    assert "apply" not in kinds(kube)


def test_repeated_passes_before_the_watch_catches_up_write_once() -> None:
    """A second pass on the same (stale) snapshot neither re-applies the RayCluster nor
    re-sends phase Bound: both writes are remembered until the watch shows them."""
    reservation = ReservationInfo("pool-a", Holder("ml", "llm", UID, "tpu-aaaaa", 0), None)
    snap = Snapshot(
        cluster_body(), pods(gated=False, pool="pool-a"), nodes_of("pool-a"), [reservation], None
    )
    kube = FakeKube()
    reconciler = make(kube, snap)

    async def twice() -> None:
        await reconciler.kick(("TPUSliceCluster", "ml", "llm"))
        await reconciler.kick(("TPUSliceCluster", "ml", "llm"))

    asyncio.run(twice())
    assert kinds(kube).count("apply") == 1
    assert [c for c in kube.calls if c[0] == "phase"] == [("phase", "pool-a", "Bound")]


def test_pool_index_is_rebuilt_only_after_a_node_change() -> None:
    shape = ("tpu-v6e-slice", "4x4")
    snap = Snapshot(cluster_body(), pods(), nodes_of("pool-a"), [], None)
    kube = FakeKube()
    reconciler = make(kube, snap)

    def read(pool: str) -> Snapshot:
        return Snapshot(
            cluster_body(),
            [],
            nodes_of(pool),
            [],
            None,
            node_versions=reconciler.pool_indexes.versions(),
        )

    assert reconciler.pool_indexes.index(shape, read("pool-a")) is None  # no node events: per pass
    reconciler.nodes_changed(shape)
    first = reconciler.pool_indexes.index(shape, read("pool-a"))
    assert first is not None and list(first.matching) == ["pool-a"]
    assert (
        reconciler.pool_indexes.index(shape, read("pool-b")) is first
    )  # unchanged version: cached
    run(reconciler)
    assert ("claim", "pool-a") in kube.calls
    reconciler.nodes_changed(shape)
    again = reconciler.pool_indexes.index(shape, read("pool-b"))
    assert again is not None and list(again.matching) == ["pool-b"]


def test_nodes_read_before_a_node_change_are_not_cached_as_current() -> None:
    """A node event during an await of a pass bumps the version; that pass's (older)
    nodes are used once but never cached under the new version."""
    shape = ("tpu-v6e-slice", "4x4")
    reconciler = make(FakeKube(), Snapshot(cluster_body(), [], [], [], None))
    reconciler.nodes_changed(shape)
    stale = Snapshot(
        cluster_body(),
        [],
        nodes_of("pool-old"),
        [],
        None,
        node_versions=reconciler.pool_indexes.versions(),
    )
    reconciler.nodes_changed(shape)  # arrives while the pass is awaiting the API
    used = reconciler.pool_indexes.index(shape, stale)
    assert used is not None and list(used.matching) == ["pool-old"]
    fresh = Snapshot(
        cluster_body(),
        [],
        nodes_of("pool-new"),
        [],
        None,
        node_versions=reconciler.pool_indexes.versions(),
    )
    current = reconciler.pool_indexes.index(shape, fresh)
    assert current is not None and list(current.matching) == ["pool-new"]


def test_a_foldable_status_change_is_held_until_quiet_and_a_flip_is_written_at_once() -> None:
    """Hosts coming up one by one: the first status is written, the next count is held
    (a pass is scheduled for when it is due) and written once due; the Ready flip is
    written at once."""
    from dataclasses import replace as with_

    released = pods(gated=False, pool="pool-a")
    reservation = ReservationInfo("pool-a", Holder("ml", "llm", UID, "tpu-aaaaa", 0), "Bound")
    snaps = [
        Snapshot(cluster_body(), released, nodes_of("pool-a"), [reservation], None),
        Snapshot(
            cluster_body(),
            [with_(released[0], running_ready=True), *released[1:]],
            nodes_of("pool-a"),
            [reservation],
            None,
        ),
    ]
    kube = FakeKube()
    reconciler = Reconciler(kube, lambda key: snaps[0])

    async def scenario() -> None:
        await reconciler.kick(("TPUSliceCluster", "ml", "llm"))
        assert kube.status is not None and kube.status["slices"][0]["readyHosts"] == 0
        writes = kinds(kube).count("status")
        snaps[0] = snaps[1]
        await reconciler.kick(("TPUSliceCluster", "ml", "llm"))
        assert kinds(kube).count("status") == writes  # held: only a count changed
        assert reconciler.queue.pending_later(("TPUSliceCluster", "ml", "llm"))
        reconciler.status.fold_quiet_seconds = 0.0
        await reconciler.kick(("TPUSliceCluster", "ml", "llm"))
        assert kinds(kube).count("status") == writes + 1
        assert kube.status["slices"][0]["readyHosts"] == 1
        reconciler.status.fold_quiet_seconds = 60.0
        rendered = render_cluster(cluster_body())
        rendered["metadata"]["annotations"] = {"tpuslice.dev/applied-hash": applied_hash(rendered)}
        snaps[0] = with_(
            snaps[1],
            pods=[with_(p, running_ready=True) for p in released],
            raycluster=raycluster_info({**rendered, "status": {"state": "ready"}}),
        )
        await reconciler.kick(("TPUSliceCluster", "ml", "llm"))
        assert kinds(kube).count("status") == writes + 2  # Ready flipped: not held
        assert conditions_of(kube.status)["Ready"][0] == "True"

    asyncio.run(scenario())


def conditions_of(status: dict[str, Any] | None) -> dict[str, tuple[str, str, str]]:
    assert status is not None
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in status["conditions"]}


TYPED_PATCH_500 = ApiError(
    500,
    "InternalError",
    "failed to create typed patch object (ml/llm; ray.io/v1, Kind=RayCluster): "
    '.spec.workerGroupSpecs[groupName="tpu"].template.spec.hostNetwork: expected boolean, '
    "got &{yes string}",
)


def test_apply_answered_500_typed_patch_is_rayclusterrejected_naming_the_users_field() -> None:
    """A 500 must not be re-raised every 5 s with a traceback and no status on the
    cluster. (With KubeRay's schema such an override is already an
    InvalidSpec; here the CRD has none, as an older or unknown KubeRay might.)"""
    kube = FakeKube(apply_error=TYPED_PATCH_500)
    kube.crd = {"spec": {"versions": []}}
    reconciler = make(kube, Snapshot(cluster_body(), [], nodes_of("pool-a"), [], None))
    run(reconciler)
    stalled = conditions_of(kube.status)["Stalled"]
    assert stalled[:2] == ("True", "RayClusterRejected")
    assert "spec.worker.template.spec.hostNetwork: expected boolean" in stalled[2]
    assert ("event", "RayClusterRejected") in kube.calls
    assert reconciler.backoff.failing(("TPUSliceCluster", "ml", "llm")) is None


def test_a_raycluster_of_that_name_not_ours_is_never_applied_and_the_cluster_is_stalled() -> None:
    """A forced server-side apply would take another's RayCluster over."""
    kube = FakeKube()
    body = cluster_body()
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    kube.rayclusters[(ns, name)] = {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": "theirs",
            "ownerReferences": [
                {"kind": "RayJob", "name": "training", "uid": "job-uid", "controller": True}
            ],
        },
        "spec": {},
    }
    reconciler = make(kube, Snapshot(body, [], nodes_of("pool-a"), [], None))
    run(reconciler)
    assert "apply" not in kinds(kube) and "claim" not in kinds(kube)
    stalled = conditions_of(kube.status)["Stalled"]
    assert stalled[:2] == ("True", "RayClusterNameTaken")
    assert (
        f"RayCluster {ns}/{name} already exists and is controlled by RayJob training"
        in (stalled[2])
    )
    assert ("event", "RayClusterNameTaken") in kube.calls


def test_the_name_is_checked_once_before_the_first_apply_not_on_every_pass() -> None:
    kube = FakeKube()
    reconciler = make(kube, Snapshot(cluster_body(), [], nodes_of("pool-a"), [], None))
    run(reconciler)
    run(reconciler)  # the overlay remembers the apply until the watch shows it
    assert len(kube.raycluster_reads) == 1
    assert kinds(kube).count("apply") == 1


def test_an_override_kuberay_would_refuse_is_invalid_spec_before_any_apply() -> None:
    body = cluster_body(worker={"template": {"spec": {"hostNetwork": "yes"}}})
    kube = FakeKube()
    reconciler = make(kube, Snapshot(body, [], [], [], None))
    run(reconciler)
    run(reconciler)
    assert "apply" not in kinds(kube)
    stalled = conditions_of(kube.status)["Stalled"]
    assert stalled[:2] == ("True", "InvalidSpec")
    assert "spec.worker.template.spec.hostNetwork: must be true or false" in stalled[2]
    assert kube.crd_reads == 1  # read once, kept


def test_without_kuberays_crd_the_apply_says_kuberay_is_missing() -> None:
    body = cluster_body(worker={"template": {"spec": {"hostNetwork": "yes"}}})
    kube = FakeKube(apply_error=ApiError(404, "NotFound", "the server could not find"))
    kube.crd = None
    run(make(kube, Snapshot(body, [], [], [], None)))
    assert conditions_of(kube.status)["Stalled"][:2] == ("True", "KubeRayNotInstalled")


class FailingKube(FakeKube):
    """The API server answers 500 to every server-side apply."""

    def __init__(self) -> None:
        super().__init__(apply_error=ApiError(500, "InternalError", "etcdserver: timeout"))


def test_a_failing_pass_is_a_reconciling_condition_with_backoff_and_one_event() -> None:
    kube = FailingKube()
    reconciler = make(kube, Snapshot(cluster_body(), [], nodes_of("pool-a"), [], None))
    key = ("TPUSliceCluster", "ml", "llm")

    async def scenario() -> list[float]:
        delays = []
        for _ in range(4):
            await reconciler.kick(key)
            delays.append(reconciler.backoff._failing[key].retry_at - time.monotonic())
            reconciler.backoff._failing[key].retry_at = 0  # as if the backoff had passed
        return delays

    delays = asyncio.run(scenario())
    assert [round(d) for d in delays] == [5, 10, 20, 40]
    cond = conditions_of(kube.status)
    assert cond["Ready"][:2] == ("False", "ReconcileError")
    assert cond["Reconciling"][:2] == ("True", "ReconcileError")
    assert cond["Stalled"][:2] == ("False", "ReconcileError")
    assert cond["Ready"][2] == (
        "reconcile failed 4 times in a row, next attempt in 40s: API server answered 500 "
        "InternalError: etcdserver: timeout"
    )
    assert [c for c in kube.calls if c[0] == "event"] == [("event", "ReconcileError")]
    assert kinds(kube).count("apply") == 4


def test_kicks_during_the_backoff_wait_unless_the_spec_changed() -> None:
    kube = FailingKube()
    snap = Snapshot(cluster_body(), [], nodes_of("pool-a"), [], None)
    reconciler = make(kube, snap)
    key = ("TPUSliceCluster", "ml", "llm")

    async def scenario() -> None:
        await reconciler.kick(key)
        for _ in range(5):  # pod events, the resync timer
            await reconciler.kick(key)
        assert kinds(kube).count("apply") == 1
        assert reconciler.queue.pending_later(key)  # the held-back pass is scheduled
        fixed = cluster_body()
        fixed["metadata"]["generation"] = 2
        reconciler.read = lambda _: Snapshot(fixed, [], nodes_of("pool-a"), [], None)
        await reconciler.kick(key)  # a new generation is tried at once
        assert kinds(kube).count("apply") == 2

    asyncio.run(scenario())


def test_success_forgets_the_failures(caplog: Any) -> None:
    import logging

    kube = FailingKube()
    reconciler = make(kube, Snapshot(cluster_body(), [], nodes_of("pool-a"), [], None))
    key = ("TPUSliceCluster", "ml", "llm")

    async def scenario() -> None:
        with caplog.at_level(logging.WARNING, logger="tpuslice.controller.reconciler"):
            for _ in range(3):
                await reconciler.kick(key)
                reconciler.backoff._failing[key].retry_at = 0
        kube.apply_error = None
        await reconciler.kick(key)

    asyncio.run(scenario())
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1  # once per distinct error, then one line each
    assert len(caplog.records) == 3
    assert reconciler.backoff.failing(("TPUSliceCluster", "ml", "llm")) is None
    cond = conditions_of(kube.status)
    assert cond["Stalled"][0] == "False" and cond["Ready"][1] != "ReconcileError"


def test_failure_keeps_the_rest_of_the_status() -> None:
    from tpuslice.status.conditions import failure_status

    previous = {
        "observedGeneration": 3,
        "readySlices": 1,
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "Pending", "lastTransitionTime": "t0"},
            {"type": "SlicesReserved", "status": "True", "reason": "AllSlicesReserved"},
        ],
    }
    status = failure_status(previous, 4, "ReconcileError", "boom", "t1")
    assert status["observedGeneration"] == 3 and status["readySlices"] == 1
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Ready"]["lastTransitionTime"] == "t0"  # still False: no transition
    assert by_type["Reconciling"]["status"] == "True"
    assert by_type["SlicesReserved"]["reason"] == "AllSlicesReserved"
