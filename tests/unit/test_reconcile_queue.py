"""The shell's use of the queue and gangs : one pass against the fake API."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.builders import nodes_of
from tests.support.fake_kube import FakeKube
from tests.unit.test_reconcile import UID, cluster_body, conditions_of, kinds
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model.records import (
    ClusterRef,
    Holder,
    PodInfo,
    ReservationInfo,
    ShapeMember,
    Snapshot,
)


def gang_pods(cluster: str = "llm", replicas: int = 2) -> list[PodInfo]:
    """Four gated pods per replica, every replica's pods created."""
    return [
        PodInfo(
            "ml",
            f"{cluster}-w{r}{h}",
            cluster,
            f"tpu-{cluster}{r}",
            r,
            h,
            True,
            None,
            None,
            False,
            False,
        )
        for r in range(replicas)
        for h in range(4)
    ]


def body(
    name: str = "llm", uid: str = UID, created: str = "2026-01-01T00:00:00Z", **spec: Any
) -> dict[str, Any]:
    out = cluster_body(**spec)
    out["metadata"] = {**out["metadata"], "name": name, "uid": uid, "creationTimestamp": created}
    return out


def two_slices(**reservation: Any) -> dict[str, Any]:
    return {
        "tpu": {"type": "v6e", "topology": "4x4", "slices": 2},
        "ray": {"version": "2.54.0"},
        "reservation": reservation,
    }


def run(
    snap: Snapshot,
    kube: FakeKube | None = None,
    key: tuple[str, str, str] = ("TPUSliceCluster", "ml", "llm"),
) -> FakeKube:
    kube = kube or FakeKube()
    asyncio.run(Reconciler(kube, lambda _: snap).kick(key))
    return kube


def claims(kube: FakeKube) -> list[str]:
    return [c[1] for c in kube.calls if c[0] == "claim"]


OTHER = Holder("ml", "other", "uid-other", "tpu-zzzzz", 0)
HELD_B = ReservationInfo("pool-b", OTHER)


def test_a_two_slice_gang_with_one_free_pool_claims_nothing_and_says_why() -> None:
    b = body()
    b["spec"] = two_slices()
    kube = run(Snapshot(b, gang_pods(), nodes_of("pool-a") + nodes_of("pool-b"), [HELD_B], None))
    assert claims(kube) == [] and "release" not in kinds(kube)
    assert kube.status is not None
    messages = [s.get("message", "") for s in kube.status["slices"]]
    assert all(s["state"] == "WaitingForCapacity" for s in kube.status["slices"])
    assert any("waiting for v6e 4x4" in m and "at once" in m for m in messages), messages
    assert any("held by ml/other (pool-b)" in m for m in messages), messages


def test_a_two_slice_gang_with_two_free_pools_claims_both_and_releases_both() -> None:
    b = body()
    b["spec"] = two_slices()
    kube = run(Snapshot(b, gang_pods(), nodes_of("pool-a") + nodes_of("pool-b"), [], None))
    assert sorted(claims(kube)) == ["pool-a", "pool-b"]
    assert len([c for c in kube.calls if c[0] == "release"]) == 8


def test_a_later_cluster_does_not_take_the_pool_an_earlier_gang_waits_for() -> None:
    early = body("early", "uid-early", "2026-01-01T00:00:00Z")
    early["spec"] = two_slices()
    late = body("late", "uid-late", "2026-01-02T00:00:00Z")
    snap = Snapshot(
        late,
        gang_pods("late", replicas=1),
        nodes_of("pool-a") + nodes_of("pool-b"),
        [HELD_B],
        None,
        shape_members=[ShapeMember(early, gang_pods("early"))],
    )
    kube = run(snap, key=("TPUSliceCluster", "ml", "late"))
    assert claims(kube) == []
    assert kube.status is not None
    (slice_,) = kube.status["slices"]
    assert slice_["state"] == "WaitingForCapacity"
    assert slice_["message"].startswith("2nd of 2 waiting for v6e 4x4"), slice_["message"]


def test_priority_puts_a_later_cluster_first() -> None:
    early = body("early", "uid-early", "2026-01-01T00:00:00Z")
    early["spec"] = two_slices()
    late = body("late", "uid-late", "2026-01-02T00:00:00Z", reservation={"priority": 10})
    snap = Snapshot(
        late,
        gang_pods("late", replicas=1),
        nodes_of("pool-a") + nodes_of("pool-b"),
        [HELD_B],
        None,
        shape_members=[ShapeMember(early, gang_pods("early"))],
    )
    assert claims(run(snap, key=("TPUSliceCluster", "ml", "late"))) == ["pool-a"]


def test_more_slices_than_pools_of_the_shape_is_stalled_not_enough_pools() -> None:
    b = body()
    b["spec"] = two_slices()
    kube = run(Snapshot(b, gang_pods(), nodes_of("pool-a"), [], None))
    # one pool of the shape exists at all: no wait will do
    stalled = conditions_of(kube.status)["Stalled"]
    assert stalled[:2] == ("True", "NotEnoughPools"), stalled
    assert "2" in stalled[2] and "1" in stalled[2]
    assert ("event", "NotEnoughPools") in kube.calls


def test_a_gang_that_loses_a_claim_and_finds_no_other_pool_releases_nothing_and_gives_back() -> (
    None
):
    b = body()
    b["spec"] = two_slices()
    kube = FakeKube(taken={"pool-b": ReservationInfo("pool-b", OTHER)})
    snap = Snapshot(b, gang_pods(), nodes_of("pool-a") + nodes_of("pool-b"), [], None)
    run(snap, kube)
    assert "release" not in kinds(kube)
    assert sorted(claims(kube)) == ["pool-a", "pool-b"]
    assert [c[1] for c in kube.calls if c[0] == "free"] == ["pool-a"]  # the partial set


def test_a_gang_that_loses_a_claim_completes_with_another_free_pool() -> None:
    b = body()
    b["spec"] = two_slices()
    kube = FakeKube(taken={"pool-b": ReservationInfo("pool-b", OTHER)})
    snap = Snapshot(
        b, gang_pods(), nodes_of("pool-a") + nodes_of("pool-b") + nodes_of("pool-c"), [], None
    )
    run(snap, kube)
    assert set(claims(kube)) - {"pool-b"} == {"pool-a", "pool-c"}
    assert [c for c in kube.calls if c[0] == "free"] == []
    released = {c[2] for c in kube.calls if c[0] == "release"}
    assert released == {"pool-a", "pool-c"}


def test_queue_metrics_count_the_waiting_and_time_the_wait() -> None:
    from tests.unit.test_metrics import value
    from tpuslice.runtime.metrics import Metrics

    b = body()
    b["spec"] = two_slices()
    snaps = [Snapshot(b, gang_pods(), nodes_of("pool-a") + nodes_of("pool-b"), [HELD_B], None)]
    m = Metrics()
    reconciler = Reconciler(FakeKube(), lambda _: snaps[0], metrics=m)

    async def scenario() -> None:
        await reconciler.kick(("TPUSliceCluster", "ml", "llm"))
        assert value(m, "tpuslice_queue_length", shape="v6e 4x4") == 1
        snaps[0] = Snapshot(b, gang_pods(), nodes_of("pool-a") + nodes_of("pool-b"), [], None)
        await reconciler.kick(("TPUSliceCluster", "ml", "llm"))

    asyncio.run(scenario())
    assert value(m, "tpuslice_queue_length", shape="v6e 4x4") == 0
    assert value(m, "tpuslice_queue_wait_seconds_count", shape="v6e 4x4") == 1


def test_without_competition_the_queue_is_not_decided_at_all() -> None:
    """Every member's missing pools fit in the free ones: no order to keep (the cheap
    path); one more wanting member than free pools: the queue decides."""
    from tpuslice.controller.actuator import SpecCache, queue_admission
    from tpuslice.planning.pools import pool_index
    from tpuslice.spec.cluster import parse_cluster

    me = body("me", "uid-me", "2026-01-02T00:00:00Z")
    other = body("other", "uid-other", "2026-01-01T00:00:00Z")
    two_pools = nodes_of("pool-a") + nodes_of("pool-b")
    index = pool_index(two_pools, "tpu-v6e-slice", "4x4")
    members = [ShapeMember(other, gang_pods("other", replicas=1))]
    mine = gang_pods("me", replicas=1)
    ref = ClusterRef("ml", "me", "uid-me")
    snap = Snapshot(me, mine, two_pools, [], None, shape_members=members)
    assert queue_admission(ref, parse_cluster(me), snap, mine, [], index, SpecCache()) is None
    third = Holder("ml", "third", "uid-third", "tpu-t0", 0)
    one_free = [ReservationInfo("pool-b", third)]
    snap = Snapshot(me, mine, two_pools, one_free, None, shape_members=members)
    admission = queue_admission(ref, parse_cluster(me), snap, mine, one_free, index, SpecCache())
    assert admission is not None and admission.pools == ()
    assert "1st of 1 waiting" in admission.message and "1 request ahead" in admission.message


def test_forgetting_a_deleted_cluster_drops_its_parsed_specs() -> None:
    other = body("other", "uid-other")
    reconciler = Reconciler(FakeKube(), lambda _: Snapshot(None, [], [], [], None))
    assert reconciler.actuator.specs.parse(other) is not None
    assert reconciler.actuator.specs._specs
    reconciler.forget(("TPUSliceCluster", "ml", "other"), uid="uid-other")
    assert not reconciler.actuator.specs._specs


def test_a_waiting_gang_says_why_the_pool_nobody_holds_is_not_eligible() -> None:
    from dataclasses import replace

    b = body()
    b["spec"] = two_slices()
    cordoned = [replace(n, schedulable=False) for n in nodes_of("pool-c")]
    kube = run(Snapshot(b, gang_pods(), nodes_of("pool-a") + cordoned, [], None))
    assert kube.status is not None
    messages = [s.get("message", "") for s in kube.status["slices"]]
    assert any("waiting for v6e 4x4" in m and "not eligible: pool-c" in m for m in messages), (
        messages
    )


def test_a_cluster_whose_pods_the_quota_refuses_does_not_keep_pools_from_a_ready_one() -> None:
    """Measured: priority 1e9, as many slices as the shape has pools, and a worker
    template the namespace's ResourceQuota refuses, so KubeRay never creates its pods.
    Another team's ready 1-slice cluster claims a pool at once; once the squatter's pods
    exist, it is the head of the queue again and the 1-slice cluster waits behind it."""
    squat = body("squat", "uid-squat", "2026-01-01T00:00:00Z")
    squat["spec"] = two_slices(priority=1_000_000_000)
    late = body("late", "uid-late", "2026-01-02T00:00:00Z")
    pools = nodes_of("pool-a") + nodes_of("pool-b")

    def late_pass(squat_pods: list[PodInfo]) -> FakeKube:
        snap = Snapshot(
            late,
            gang_pods("late", replicas=1),
            pools,
            [],
            None,
            shape_members=[ShapeMember(squat, squat_pods)],
        )
        return run(snap, key=("TPUSliceCluster", "ml", "late"))

    assert claims(late_pass([])) == ["pool-a"]
    kube = late_pass(gang_pods("squat", replicas=1))
    assert claims(kube) == []
    assert kube.status is not None
    (slice_,) = kube.status["slices"]
    assert slice_["message"].startswith("2nd of 2 waiting for v6e 4x4"), slice_["message"]
