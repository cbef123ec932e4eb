"""Pin at admission: the marks, the kept units, the re-keys, the fence (an injected
clock, no sleeps), the webhook's decision, and a pass that marks and keeps."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.support.builders import holder, nodes_of, reservation, slice_pods, tpu, tpuslice
from tests.support.fake_kube import FakeKube
from tests.unit.test_identity import kuberay_pod, render_worker_template
from tpuslice.controller.expectations import Expectations
from tpuslice.controller.pinning import PinFence
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model import constants as c
from tpuslice.model.records import (
    ClusterRef,
    Drain,
    GangMode,
    PodInfo,
    ReservationInfo,
    SlicePlan,
    Snapshot,
)
from tpuslice.planning.pinning import (
    FenceStep,
    fence,
    holder_matches,
    kept_for_pins,
    pin_marks,
    pin_rekeys,
    pin_target,
    pinned_pod,
    pinned_to,
    pod_slice,
)
from tpuslice.planning.pools import pool_index

REF = ClusterRef("ml", "llm", "uid-llm")
NOW = datetime(2026, 12, 6, 3, 0, 0, tzinfo=UTC)
HOSTS = 4


def marked(pool: str, replica: str = "tpu-aaaaa", index: int = 0, **kw: Any) -> ReservationInfo:
    return replace(reservation(pool, holder(replica, index), uid=f"uid-{pool}"), pinned=True, **kw)


def held(pool: str, replica: str = "tpu-aaaaa", index: int = 0) -> ReservationInfo:
    return reservation(pool, holder(replica, index), uid=f"uid-{pool}")


def released(replica: str, index: int, pool: str) -> list[PodInfo]:
    return slice_pods(replica, index, gated=False, pool=pool)


def marks(
    reservations: list[ReservationInfo],
    pods: list[PodInfo],
    *,
    desired: int = 1,
    gang: GangMode = GangMode.PER_SLICE,
    plan: SlicePlan | None = None,
    enabled: bool = True,
    pools: tuple[str, ...] = ("pool-a", "pool-b"),
    **nodes: Any,
) -> tuple[set[str], set[str]]:
    inventory = pool_index(nodes_of(*pools, **nodes), "tpu-v6e-slice", "4x4")
    out = pin_marks(
        REF,
        enabled=enabled,
        hosts=HOSTS,
        chips_per_host=4,
        desired=desired,
        gang=gang,
        pods=pods,
        reservations=reservations,
        plan=plan or SlicePlan(),
        inventory=inventory,
    )
    return {r.pool for r in out.mark}, {r.pool for r in out.unmark}


# ---------------------------------------------------------------- the marks
def test_a_held_healthy_slice_is_marked_once() -> None:
    assert marks([held("pool-a")], slice_pods(gated=True)) == ({"pool-a"}, set())
    assert marks([marked("pool-a")], released("tpu-aaaaa", 0, "pool-a")) == (set(), set())


def test_a_gang_is_marked_whole_or_not_at_all() -> None:
    one = [held("pool-a")]
    pods = slice_pods() + slice_pods("tpu-bbbbb", 1)
    assert marks(one, pods, desired=2, gang=GangMode.ALL_SLICES) == (set(), set())
    both = [held("pool-a"), held("pool-b", "tpu-bbbbb", 1)]
    assert marks(both, pods, desired=2, gang=GangMode.ALL_SLICES) == ({"pool-a", "pool-b"}, set())
    # one unit unhealthy: every mark of the gang goes
    lost = [marked("pool-a"), marked("pool-b", "tpu-bbbbb", 1)]
    assert marks(lost, pods, desired=2, gang=GangMode.ALL_SLICES, not_ready=1) == (
        set(),
        {"pool-a", "pool-b"},
    )


def test_an_unhealthy_drained_freed_or_surplus_unit_is_unmarked() -> None:
    pods = released("tpu-aaaaa", 0, "pool-a")
    assert marks([marked("pool-a")], pods, cordoned=1) == (set(), {"pool-a"})
    drain = Drain("pool-a", "tpu-aaaaa", 0, (), "pool-a-0", "is NotReady", "NotReady", 30)
    assert marks([marked("pool-a")], pods, plan=SlicePlan(drains=(drain,))) == (set(), {"pool-a"})
    assert marks([marked("pool-a")], pods, plan=SlicePlan(frees=("pool-a",))) == (set(), {"pool-a"})
    assert marks([marked("pool-a")], pods, desired=0) == (set(), {"pool-a"})
    assert marks([marked("pool-a")], pods, enabled=False) == (set(), {"pool-a"})


def test_a_slice_without_pods_stays_marked_only_if_it_was() -> None:
    assert marks([marked("pool-a")], []) == (set(), set())
    assert marks([held("pool-a")], []) == (set(), set())
    # its pods terminating (KubeRay replaces the replica): a gang keeps both marks
    going = slice_pods("tpu-bbbbb", 1, gated=False, pool="pool-b", deleting=True)
    pods = released("tpu-aaaaa", 0, "pool-a") + going
    gang = [marked("pool-a"), marked("pool-b", "tpu-bbbbb", 1)]
    assert marks(gang, pods, desired=2, gang=GangMode.ALL_SLICES) == (set(), set())


# ---------------------------------------------------------------- kept and re-keyed
def test_a_marked_unit_of_a_gone_replica_is_kept_for_its_index() -> None:
    frees = ("pool-a",)
    kept = kept_for_pins(
        frees, REF, desired=1, hosts=HOSTS, pods=[], reservations=[marked("pool-a")]
    )
    assert kept == ()
    unmarked = kept_for_pins(
        frees, REF, desired=1, hosts=HOSTS, pods=[], reservations=[held("pool-a")]
    )
    assert unmarked == frees
    # scaled down: index 1 is beyond the count, and never more units than slices
    surplus = [marked("pool-a"), marked("pool-b", "tpu-bbbbb", 1)]
    assert kept_for_pins(
        ("pool-b",),
        REF,
        desired=1,
        hosts=HOSTS,
        pods=released("tpu-aaaaa", 0, "pool-a"),
        reservations=surplus,
    ) == ("pool-b",)


def test_the_next_replica_of_the_index_takes_the_unit() -> None:
    pinned = released("tpu-ccccc", 0, "pool-a")
    (given,) = pin_rekeys(REF, hosts=HOSTS, pods=pinned, reservations=[held("pool-a")])
    assert (given.pool, given.holder.replica_name, given.holder.replica_index) == (
        "pool-a",
        "tpu-ccccc",
        0,
    )
    gated = slice_pods("tpu-ccccc", 0)
    assert pin_rekeys(REF, hosts=HOSTS, pods=gated, reservations=[held("pool-a")]) == ()
    assert len(pin_rekeys(REF, hosts=HOSTS, pods=gated, reservations=[marked("pool-a")])) == 1
    # another index, or the old replica still terminating: nothing
    other = released("tpu-ccccc", 1, "pool-a")
    assert pin_rekeys(REF, hosts=HOSTS, pods=other, reservations=[held("pool-a")]) == ()
    old = slice_pods("tpu-aaaaa", 0, deleting=True, gated=False, pool="pool-a")
    assert pin_rekeys(REF, hosts=HOSTS, pods=old + pinned, reservations=[held("pool-a")]) == ()


# ---------------------------------------------------------------- the fence
def test_the_fence_unmarks_waits_then_reads_pods() -> None:
    wait = 15.0
    assert fence(held("pool-a"), NOW, wait).step is FenceStep.LET_GO
    assert fence(marked("pool-a"), NOW, wait).step is FenceStep.UNMARK
    removed = replace(held("pool-a"), unpinned_at="2026-12-06T03:00:00Z")
    step = fence(removed, NOW + timedelta(seconds=5), wait)
    assert step.step is FenceStep.WAIT and step.wait_s == 11.0  # whole seconds: +1
    assert fence(removed, NOW + timedelta(seconds=16), wait).step is FenceStep.READ_PODS
    unreadable = replace(held("pool-a"), unpinned_at="soon")
    assert fence(unreadable, NOW, wait).step is FenceStep.UNMARK


def test_pinned_to_reads_the_node_selector_of_live_pods() -> None:
    pods = [
        {"metadata": {"name": "a"}, "spec": {"nodeSelector": {c.NODE_LABEL_NODEPOOL: "pool-a"}}},
        {"metadata": {"name": "b"}, "spec": {"nodeSelector": {c.NODE_LABEL_NODEPOOL: "pool-b"}}},
        {"metadata": {"name": "c"}, "spec": {}},
    ]
    assert pinned_to(pods, "pool-a") == ["a"]


def _fence(kube: FakeKube, *, enabled: bool = True, now: datetime = NOW) -> PinFence:
    kicks: list[tuple[Any, float]] = []
    made = PinFence(kube, Expectations(), enabled=enabled, fence_s=15.0, clock=lambda: now)
    made.kick_later = lambda key, s: kicks.append((key, s))
    return made


def test_pin_fence_lets_an_unmarked_reservation_go_without_a_read() -> None:
    kube = FakeKube(taken={"pool-a": held("pool-a")})
    assert asyncio.run(_fence(kube, enabled=False).let_go(held("pool-a"))) is True
    assert kube.calls == []


def test_pin_fence_unmarks_then_waits_then_checks_pods_live() -> None:
    kube = FakeKube(taken={"pool-a": marked("pool-a")})
    first = _fence(kube)
    assert asyncio.run(first.let_go(held("pool-a"))) is False  # the live read saw the mark
    assert kube.taken["pool-a"].pinned is False
    assert kube.taken["pool-a"].unpinned_at == "2026-12-06T03:00:00Z"
    assert (
        asyncio.run(_fence(kube, now=NOW + timedelta(seconds=10)).let_go(held("pool-a"))) is False
    )
    later = _fence(kube, now=NOW + timedelta(seconds=20))
    kube.live_pods = [
        {"metadata": {"name": "w0"}, "spec": {"nodeSelector": {c.NODE_LABEL_NODEPOOL: "pool-a"}}}
    ]
    assert asyncio.run(later.let_go(held("pool-a"))) is False
    kube.live_pods = []
    assert asyncio.run(later.let_go(held("pool-a"))) is True
    assert ("list-pods", "ml", "tpuslice.dev/cluster=llm") in kube.calls


# ---------------------------------------------------------------- the webhook's decision
def _worker(index: int = 1) -> dict[str, Any]:
    template, hosts = render_worker_template("v6e", "4x4", slices=2)
    pod = kuberay_pod(template, hosts, replica=index, host=2)
    pod.setdefault("metadata", {}).setdefault("namespace", "ml")
    return pod


def test_pod_slice_of_a_gated_multihost_worker() -> None:
    pod = _worker()
    found = pod_slice(pod)
    assert found is not None and found.replica_index == 1
    assert found.kind == c.KIND_CLUSTER and found.namespace == "ml"
    assert pod_slice(pinned_pod(pod, "pool-a")) is None  # already pinned: left alone


def test_the_webhook_pins_only_to_a_marked_reservation_of_its_slice() -> None:
    pod = pod_slice(_worker())
    assert pod is not None
    mine = marked("pool-a", "tpu-old", 1, holder=replace(holder("tpu-old", 1), name=pod.name))
    assert pin_target(pod, mine) == "pool-a"
    assert pin_target(pod, replace(mine, pinned=False)) is None
    other_index = replace(mine, holder=replace(mine.holder, replica_index=0))
    assert pin_target(pod, other_index) is None
    other_group = replace(mine, holder=replace(mine.holder, group="not-" + pod.group))
    assert not holder_matches(pod, other_group.holder)


def test_pinned_pod_drops_only_our_gate_and_sets_the_pool() -> None:
    pod = {"spec": {"schedulingGates": [{"name": c.SCHEDULING_GATE}, {"name": "other"}]}}
    out = pinned_pod(pod, "pool-a")
    assert out["spec"]["schedulingGates"] == [{"name": "other"}]
    assert out["spec"]["nodeSelector"] == {c.NODE_LABEL_NODEPOOL: "pool-a"}
    assert (
        "schedulingGates"
        not in pinned_pod({"spec": {"schedulingGates": [{"name": c.SCHEDULING_GATE}]}}, "p")["spec"]
    )


# ---------------------------------------------------------------- a pass
def _pass(snap: Snapshot, kube: FakeKube) -> Reconciler:
    reconciler = Reconciler(kube, lambda key: snap)
    assert reconciler.fence is not None
    reconciler.fence.enabled = True
    asyncio.run(reconciler.kick(("TPUSliceCluster", "ml", "llm")))
    return reconciler


def _body() -> dict[str, Any]:
    return tpuslice(uid="uid-llm", generation=1, tpu=tpu(slices=1))


def test_a_pass_marks_the_held_unit_and_keeps_it_when_the_replica_is_gone() -> None:
    kube = FakeKube(taken={"pool-a": held("pool-a")})
    pods = slice_pods(name="w{host}", gated=False, pool="pool-a", ready=True)
    _pass(Snapshot(_body(), pods, nodes_of("pool-a"), [held("pool-a")], None), kube)
    assert ("annotate", "pool-a", {c.ANNOTATION_PIN: "true"}) in kube.calls
    # the replica's pods are gone: the marked unit is kept for index 0, not freed
    kube = FakeKube(taken={"pool-a": marked("pool-a")})
    _pass(Snapshot(_body(), [], nodes_of("pool-a"), [marked("pool-a")], None), kube)
    assert ("free", "pool-a") not in kube.calls
    # KubeRay's next replica of index 0, pinned at admission: the unit is handed to it
    kube = FakeKube(taken={"pool-a": marked("pool-a")})
    fresh = slice_pods("tpu-ccccc", 0, name="n{host}", gated=False, pool="pool-a")
    _pass(Snapshot(_body(), fresh, nodes_of("pool-a"), [marked("pool-a")], None), kube)
    assert ("handover", "pool-a", "tpu-ccccc") in kube.calls
    assert ("free", "pool-a") not in kube.calls


def test_a_pass_frees_a_marked_unit_only_through_the_fence() -> None:
    kube = FakeKube(taken={"pool-a": marked("pool-a")})
    body = tpuslice(uid="uid-llm", generation=1, tpu=tpu(slices=1), suspend=True)
    _pass(Snapshot(body, [], nodes_of("pool-a"), [marked("pool-a")], None), kube)
    assert ("free", "pool-a") not in kube.calls
    assert any(
        call[0] == "annotate" and call[2].get(c.ANNOTATION_PIN, "x") is None for call in kube.calls
    )
