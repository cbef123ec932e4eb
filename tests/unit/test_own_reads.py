"""What a pass reads of its shape: its own reservations by holder (``Reservations``,
``ClusterRef.own``) and its units' nodes from the shape's unit index, never a walk over
every reservation or node of the shape unless a decision needs them all (a claim, the
queue). Those walks would make a restart's first passes O(N²) over a shape of N
objects; the view's answers must equal the walks they replace."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.support.builders import holder, nodes_of, reservation, slice_pods, tpu, tpuslice
from tests.support.fake_kube import FakeKube
from tpuslice.controller.expectations import Expectations
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model.convert import raycluster_info
from tpuslice.model.records import (
    ClusterRef,
    Holder,
    NodeInfo,
    ObjectKey,
    ReservationInfo,
    Reservations,
    Snapshot,
    held_by,
)

KEY: ObjectKey = ("TPUSliceCluster", "ml", "llm")
SHAPE = ("tpu-v6e-slice", "4x4")
UIDS = ("uid-a", "uid-b", "uid-c")
POOLS = ("p0", "p1", "p2", "p3")

holders = st.builds(
    Holder,
    namespace=st.just("ml"),
    name=st.sampled_from(("a", "b")),
    uid=st.sampled_from(UIDS),
    replica_name=st.sampled_from(("r0", "r1")),
    replica_index=st.sampled_from((0, 1)),
)
infos = st.builds(
    ReservationInfo,
    pool=st.sampled_from(POOLS),
    holder=holders,
    phase=st.sampled_from(("Reserved", "Bound")),
    uid=st.sampled_from(("", "u1", "u2")),
    pinned=st.booleans(),
)


def _by_walk(view: Reservations, uid: str) -> list[ReservationInfo]:
    return sorted((r for r in view if r.holder.uid == uid), key=lambda r: r.pool)


@given(
    shown=st.lists(infos, max_size=6),
    created=st.lists(infos, max_size=3),
    seen=st.lists(infos, max_size=2),
    deleted=st.lists(st.tuples(st.sampled_from(POOLS), st.sampled_from(("", "u1", "u2")))),
    pins=st.lists(st.tuples(st.sampled_from(POOLS), st.booleans()), max_size=3),
    indexed=st.booleans(),
)
def test_a_holders_reservations_read_by_holder_equal_a_walk_over_the_merged_view(
    shown: list[ReservationInfo],
    created: list[ReservationInfo],
    seen: list[ReservationInfo],
    deleted: list[tuple[str, str]],
    pins: list[tuple[str, bool]],
    indexed: bool,
) -> None:
    """Our unconfirmed claims, lost claims, deletions and pin marks over an index: each
    holder's reservations (by holder, the pass's read) are those a walk over the whole
    merged view finds, and each unit's is the view's."""
    pending = Expectations()
    for info in created:
        pending.reservation_created(info, now=0.0)
    for info in seen:
        pending.reservation_seen(info, now=0.0)
    for pool, uid in deleted:
        pending.reservation_deleted(pool, now=0.0, uid=uid)
    for pool, pinned in pins:
        pending.pin_written(pool, pinned, "", now=0.0)
    listed = list({r.pool: r for r in shown}.values())
    # as the snapshot reader makes it: one holder's reservations from the store's index
    base = (
        Reservations(
            lambda: listed,
            lambda u: [r for r in listed if r.holder.uid == u] if u == "uid-a" else None,
        )
        if indexed
        else listed
    )
    view = pending.reservations(base)
    for uid in UIDS:
        assert sorted(view.held_by(uid), key=lambda r: r.pool) == _by_walk(view, uid)
    for pool in POOLS:
        assert view.get(pool) == next((r for r in view if r.pool == pool), None)


def test_a_view_is_a_value_a_later_write_does_not_change() -> None:
    pending = Expectations()
    pending.reservation_created(reservation("p0", holder(uid="uid-a")), now=0.0)
    view = pending.reservations([])
    pending.reservation_created(reservation("p1", holder(uid="uid-a")), now=0.0)
    pending.reservation_deleted("p0", now=0.0)
    assert [r.pool for r in view] == ["p0"]
    assert [r.pool for r in view.held_by("uid-a")] == ["p0"]


def test_held_by_over_a_plain_list_walks_it() -> None:
    mine, theirs = reservation("p0", holder(uid="uid-a")), reservation("p1", holder(uid="uid-b"))
    assert held_by([mine, theirs], "uid-a") == [mine]
    ref = ClusterRef("ml", "llm", "uid-a")
    assert ref.own(Reservations.of([mine, theirs])) == [mine]


# ------------------------------------------------------------ a settled object's pass
def _settle(kube: FakeKube, state: dict[str, Snapshot], reconciler: Reconciler) -> None:
    """Put what the passes write (status, the RayCluster) into ``state`` until a pass
    writes nothing (at most four passes)."""
    written: dict[str, Any] = {}

    async def patch_status(plural: str, namespace: str, name: str, status: Any) -> None:
        kube.calls.append(("status",))
        written["status"] = dict(status)

    kube.patch_status = patch_status  # type: ignore[method-assign]
    for _ in range(4):
        kube.calls.clear()
        asyncio.run(reconciler.run_pass(KEY))
        if not kube.calls:
            return
        snap = state["snap"]
        body = dict(snap.cluster or {})
        if "status" in written:
            body["status"] = written["status"]
        ray = snap.raycluster
        if kube.applied:
            applied = kube.applied[-1]
            meta = {**applied["metadata"], "uid": "rc-uid", "resourceVersion": "1"}
            ray = raycluster_info({**applied, "metadata": meta})
            kube.applied.clear()
        state["snap"] = replace(snap, cluster=body, raycluster=ray)
    raise AssertionError(f"still writing after four passes: {kube.calls}")


def test_a_settled_objects_pass_reads_its_own_reservations_and_no_walk_of_the_shapes() -> None:
    """999 other objects' reservations and pools in the shape: the pass of an object that
    holds its slice and has nothing to claim never lists their reservations, and its
    status's maintenance reads the shape's unit index (kept until a node changes), never
    a walk over the shape's nodes."""
    ours = reservation("pool-0", holder("llm-tpu-aaaaa", 0, uid="uid-llm"), phase="Bound")
    others = [
        reservation(f"pool-{i}", holder(f"o{i}-tpu", 0, name=f"o{i}", uid=f"uid-{i}"))
        for i in range(1, 1000)
    ]
    pods = [
        replace(p, node_name=f"pool-0-{p.host_index}")
        for p in slice_pods("llm-tpu-aaaaa", name="w{host}", gated=False, pool="pool-0", ready=True)
    ]
    wholes: list[str] = []

    def every() -> list[ReservationInfo]:
        wholes.append("reservations")
        return [ours, *others]

    class Nodes(list[NodeInfo]):
        def __iter__(self) -> Iterator[NodeInfo]:
            wholes.append("nodes")
            return super().__iter__()

    body = tpuslice(uid="uid-llm", generation=1, tpu=tpu(slices=1))
    body["metadata"]["creationTimestamp"] = "2026-12-01T00:00:00Z"
    state = {
        "snap": Snapshot(body, pods, Nodes(nodes_of(*(f"pool-{i}" for i in range(1000)))), [], None)
    }

    def read(key: ObjectKey) -> Snapshot:
        # a view per snapshot, as the reader makes it: its own from the index by holder
        own = Reservations(every, lambda uid: [ours] if uid == "uid-llm" else None)
        return replace(state["snap"], reservations=own)

    kube = FakeKube()
    reconciler = Reconciler(kube, read)
    reconciler.pool_indexes.nodes_changed(SHAPE)  # the index is kept, as in the operator
    _settle(kube, state, reconciler)
    wholes.clear()
    asyncio.run(reconciler.run_pass(KEY))
    assert kube.calls == []  # settled: nothing written
    assert wholes == []  # and neither the shape's reservations nor its nodes walked
