"""Gangs, the queue per shape and pool preference: readable examples."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.builders import holder, nodes_of, reservation, slice_pods
from tests.unit.test_reservation import CLUSTER, plan
from tpuslice.model.records import (
    Admission,
    CapacityType,
    ClusterRef,
    GangMode,
    Holder,
    NodeInfo,
    PoolRequest,
    ReservationInfo,
    ShapePool,
    SliceState,
)
from tpuslice.planning.pools import pool_index, pool_request, prefer_pools, shape_pools
from tpuslice.planning.queue import (
    admission_for,
    decide_queue,
    holders_summary,
    ordinal,
    queue_message,
    shape_name,
)

SHAPE = ("tpu-v6e-slice", "4x4")
OTHER = Holder("ml", "other", "uid-other", "tpu-zzzzz", 0)


def req(name: str, desired: int, **kw: Any) -> PoolRequest:
    args: dict[str, Any] = dict(
        key=("TPUSliceCluster", "ml", name),
        uid=f"uid-{name}",
        desired=desired,
        held=0,
        claimable=desired,
        gang=GangMode.ALL_SLICES,
        created=f"2026-12-01T00:00:0{kw.pop('t', 0)}Z",
    )
    args.update(kw)
    return PoolRequest(**args)


def free_pools(*names: str, **kw: Any) -> list[ShapePool]:
    return [ShapePool(n, True, **kw) for n in names]


# ------------------------------------------------------------------ gang in the planner


def test_all_slices_claims_every_pool_at_once_and_releases_only_with_them() -> None:
    result = plan(
        gang=GangMode.ALL_SLICES,
        pods=slice_pods("tpu-aaaaa", 0) + slice_pods("tpu-bbbbb", 1),
        nodes=nodes_of("pool-a") + nodes_of("pool-b"),
    )
    assert [c.pool for c in result.claims] == ["pool-a", "pool-b"]
    assert len(result.releases) == 8 and result.all_or_nothing


def test_all_slices_with_one_pool_for_two_slices_claims_nothing() -> None:
    """The measured deadlock: no slice takes the one free pool alone."""
    result = plan(
        gang=GangMode.ALL_SLICES,
        pods=slice_pods("tpu-aaaaa", 0) + slice_pods("tpu-bbbbb", 1),
        nodes=nodes_of("pool-a"),
    )
    assert result.claims == () and result.releases == ()
    assert {s.state for s in result.slices} == {SliceState.WAITING_FOR_CAPACITY}
    assert result.slices[0].message.startswith(
        "all 2 slices need a node pool at once (0 held, 1 free): "
    )


def test_all_slices_waits_for_the_pods_of_every_slice_before_claiming() -> None:
    result = plan(
        gang=GangMode.ALL_SLICES,
        pods=slice_pods("tpu-aaaaa", 0),
        nodes=nodes_of("pool-a") + nodes_of("pool-b"),
    )
    assert result.claims == ()
    assert result.slices[0].message == (
        "waiting for the pods of every slice before claiming 2 node pools at once "
        "(1 of 2 slices have pods)"
    )


def test_a_partial_gang_gives_its_unreleased_pool_back_when_it_cannot_complete() -> None:
    """After a lost race (the other pool went to another cluster) or a crash mid-claim."""
    result = plan(
        gang=GangMode.ALL_SLICES,
        pods=slice_pods("tpu-aaaaa", 0) + slice_pods("tpu-bbbbb", 1),
        nodes=nodes_of("pool-a") + nodes_of("pool-b"),
        reservations=[
            reservation("pool-a", holder("tpu-aaaaa", 0)),
            ReservationInfo("pool-b", OTHER),
        ],
    )
    assert result.frees == ("pool-a",) and result.claims == () and result.releases == ()
    assert result.slices[0].message.startswith("giving node pool pool-a back: ")


def test_an_uncontended_partial_gang_in_a_queue_keeps_its_pool() -> None:
    result = plan(
        gang=GangMode.ALL_SLICES,
        pods=slice_pods("tpu-aaaaa", 0) + slice_pods("tpu-bbbbb", 1),
        nodes=nodes_of("pool-a") + nodes_of("pool-b", not_ready=1),
        reservations=[reservation("pool-a", holder("tpu-aaaaa", 0))],
        admission=Admission(pools=(), contended=False, message="1st of 1 waiting"),
    )
    assert result.frees == () and result.releases == ()
    assert result.slices[0].state == SliceState.RESERVED
    assert result.slices[0].message == (
        "holds node pool pool-a; released when all 2 slices hold one (1 do): 1st of 1 waiting; "
        "not eligible: pool-b has 1 of 4 nodes NotReady"
    )


def test_a_running_slice_of_a_gang_is_never_given_back() -> None:
    """Slice 1 was replaced after a node failure: slice 0 keeps running on its pool."""
    running = slice_pods("tpu-aaaaa", 0, gated=False, pool="pool-a", ready=True)
    result = plan(
        gang=GangMode.ALL_SLICES,
        pods=running + slice_pods("tpu-ccccc", 1),
        nodes=nodes_of("pool-a") + nodes_of("pool-b"),
        reservations=[reservation("pool-a", holder("tpu-aaaaa", 0), phase="Bound")],
    )
    assert result.frees == ()
    assert [c.pool for c in result.claims] == ["pool-b"]
    assert {r.replica_name for r in result.releases} == {"tpu-ccccc"}


def test_admission_limits_the_pools_a_cluster_may_claim() -> None:
    kwargs: dict[str, Any] = dict(
        pods=slice_pods("tpu-aaaaa", 0) + slice_pods("tpu-bbbbb", 1),
        nodes=nodes_of("pool-a") + nodes_of("pool-b") + nodes_of("pool-c"),
    )
    only_c = plan(admission=Admission(pools=("pool-c",)), **kwargs)
    assert [c.pool for c in only_c.claims] == ["pool-c"]
    gang = plan(gang=GangMode.ALL_SLICES, admission=Admission(pools=("pool-c",)), **kwargs)
    assert gang.claims == ()
    stalled = plan(admission=Admission(pools=(), stalled="needs 5 node pools"), **kwargs)
    assert stalled.claims == () and stalled.stalled == "needs 5 node pools"
    assert stalled.slices[0].message == "needs 5 node pools"


def test_slice_status_says_which_capacity_type_the_slice_got() -> None:
    spot = [NodeInfo(f"s{i}", "pool-s", "tpu-v6e-slice", "4x4", 4, True, True,
                     CapacityType.SPOT) for i in range(4)]  # fmt: skip
    result = plan(pods=slice_pods("tpu-aaaaa", 0), nodes=spot, desired_slices=1)
    assert result.slices[0].capacity_type == CapacityType.SPOT
    assert result.slices[0].to_dict()["capacityType"] == "Spot"


# ------------------------------------------------------------------ pool preference


def test_preference_previous_then_capacity_type_then_name() -> None:
    pools = [
        ShapePool("a", True, capacity_type=CapacityType.SPOT),
        ShapePool("b", True, capacity_type=CapacityType.ON_DEMAND),
        ShapePool("c", True, capacity_type=CapacityType.RESERVATION),
        ShapePool("d", True, capacity_type=CapacityType.RESERVATION),
    ]
    order = [CapacityType.RESERVATION, CapacityType.ON_DEMAND, CapacityType.SPOT]
    names = [p.name for p in prefer_pools(pools, 4, capacity_types=order)]
    assert names == ["c", "d", "b", "a"]
    names = [p.name for p in prefer_pools(pools, 2, previous={"a"}, capacity_types=order)]
    assert names == ["a", "c"]
    assert [p.name for p in prefer_pools(pools, 2)] == ["a", "b"]  # no preference: names


def test_a_multislice_gang_stays_in_one_sub_block_then_one_block() -> None:
    pools = [
        ShapePool("a", True, block="b1", subblock="s1"),
        ShapePool("b", True, block="b1", subblock="s2"),
        ShapePool("c", True, block="b2", subblock="s3"),
        ShapePool("d", True, block="b2", subblock="s3"),
        ShapePool("e", True, block="b1", subblock="s2"),
    ]
    assert [p.name for p in prefer_pools(pools, 2, together=True)] == ["b", "e"]
    assert [p.name for p in prefer_pools(pools, 3, together=True)] == ["a", "b", "e"]
    assert [p.name for p in prefer_pools(pools, 2)] == ["a", "b"]  # PerSlice: names
    anchored = prefer_pools(
        pools, 2, together=True, anchor=[ShapePool("x", True, block="b2", subblock="s3")]
    )
    assert [p.name for p in anchored] == ["c", "d"]


def test_planner_picks_pools_of_one_block_for_a_gang() -> None:
    def blocked(name: str, block: str) -> list[NodeInfo]:
        return [NodeInfo(f"{name}-{i}", name, "tpu-v6e-slice", "4x4", 4, True, True,
                         block=block) for i in range(4)]  # fmt: skip

    nodes = blocked("pool-a", "b1") + blocked("pool-b", "b2") + blocked("pool-c", "b2")
    result = plan(
        gang=GangMode.ALL_SLICES,
        pods=slice_pods("tpu-aaaaa", 0) + slice_pods("tpu-bbbbb", 1),
        nodes=nodes,
    )
    # the block that holds both; which slice takes which of its pools is the cluster's own
    # claim order (reservation.spread_rank)
    assert sorted(c.pool for c in result.claims) == ["pool-b", "pool-c"]


# ------------------------------------------------------------------ the queue


def test_order_is_priority_then_creation_time() -> None:
    decision = decide_queue(
        SHAPE,
        [req("late", 1, t=3), req("early", 1, t=1), req("urgent", 1, t=5, priority=10)],
        free_pools("p1"),
    )
    assert decision.order == (
        ("TPUSliceCluster", "ml", "urgent"),
        ("TPUSliceCluster", "ml", "early"),
        ("TPUSliceCluster", "ml", "late"),
    )
    assert decision.admissions[("TPUSliceCluster", "ml", "urgent")].pools == ("p1",)
    assert decision.waiting == (
        ("TPUSliceCluster", "ml", "early"),
        ("TPUSliceCluster", "ml", "late"),
    )


def test_a_later_smaller_request_does_not_overtake_a_waiting_gang() -> None:
    """3 pools free, a 4-slice gang first: the 1-slice cluster after it waits."""
    decision = decide_queue(
        SHAPE,
        [req("big", 4, t=1), req("small", 1, t=2)],
        [*free_pools("p1", "p2", "p3"), ShapePool("p4", True, OTHER)],
    )
    big, small = (
        decision.admissions[("TPUSliceCluster", "ml", "big")],
        decision.admissions[("TPUSliceCluster", "ml", "small")],
    )
    assert big.pools == () and big.set_aside == 3 and big.position == 1
    assert small.pools == () and small.position == 2
    assert big.message == (
        "1st of 2 waiting for v6e 4x4: needs 4 node pools at once (holds 0); "
        "3 free pools set aside for it; held by ml/other (p4)"
    )
    assert small.message == (
        "2nd of 2 waiting for v6e 4x4: needs 1 more node pool (holds 0); "
        "1 request ahead in the queue; held by ml/other (p4)"
    )


def test_two_gangs_over_two_pools_one_gets_both_the_other_nothing() -> None:
    decision = decide_queue(SHAPE, [req("a", 2, t=1), req("b", 2, t=2)], free_pools("p1", "p2"))
    assert decision.admissions[("TPUSliceCluster", "ml", "a")].pools == ("p1", "p2")
    assert decision.admissions[("TPUSliceCluster", "ml", "b")].pools == ()
    assert decision.admissions[("TPUSliceCluster", "ml", "b")].contended


def test_a_request_larger_than_the_shape_is_stalled_and_leaves_the_queue() -> None:
    decision = decide_queue(
        SHAPE, [req("huge", 3, t=1), req("small", 1, t=2)], free_pools("p1", "p2")
    )
    assert decision.not_enough == (("TPUSliceCluster", "ml", "huge"),)
    assert decision.admissions[("TPUSliceCluster", "ml", "huge")].stalled == (
        "needs 3 node pools of v6e 4x4 at once, but only 2 node pools of that shape exist; "
        "add node pools or lower spec.tpu.slices"
    )
    assert decision.admissions[("TPUSliceCluster", "ml", "small")].pools == ("p1",)


def test_a_gang_not_ready_yet_keeps_its_place() -> None:
    decision = decide_queue(
        SHAPE, [req("a", 2, t=1, claimable=1), req("b", 1, t=2)], free_pools("p1", "p2", "p3")
    )
    assert decision.admissions[("TPUSliceCluster", "ml", "a")].pools == ()
    assert decision.admissions[("TPUSliceCluster", "ml", "a")].set_aside == 2
    assert (
        "waiting for the pods of its slices"
        in decision.admissions[("TPUSliceCluster", "ml", "a")].message
    )
    assert decision.admissions[("TPUSliceCluster", "ml", "b")].pools == (
        "p3",
    )  # beyond what a needs


def test_a_cluster_wanting_nothing_may_claim_nothing() -> None:
    decision = decide_queue(SHAPE, [req("done", 1, held=1, claimable=0)], free_pools("p1"))
    assert admission_for(decision, ("TPUSliceCluster", "ml", "done")) == Admission(pools=())


def test_pool_request_counts_like_the_planner() -> None:
    ref = ClusterRef("ml", "llm", "uid-llm")
    request = pool_request(
        ref,
        hosts=4,
        desired_slices=3,
        gang=GangMode.ALL_SLICES,
        pods=slice_pods("tpu-aaaaa", 0, gated=False, pool="pool-a")
        + slice_pods("tpu-bbbbb", 1)
        + slice_pods("tpu-ccccc", 2, hosts=1),
        reservations=[
            reservation("pool-a", holder("tpu-aaaaa", 0)),
            reservation("pool-b", holder("tpu-bbbbb", 1)),
        ],
        priority=2,
        created="2026-12-01T00:00:00Z",
    )
    assert (request.held, request.claimable, request.idle, request.missing) == (2, 1, 1, 1)
    assert request.live_pods == 9 and request.has_pods
    assert request.key == ("TPUSliceCluster", "ml", "llm") and request.uid == CLUSTER.uid


def test_shape_pools_reads_eligibility_holders_and_blocks() -> None:
    nodes = nodes_of("pool-a") + nodes_of("pool-b", not_ready=1)
    index = pool_index(nodes, "tpu-v6e-slice", "4x4")
    facts = shape_pools(index, [ReservationInfo("pool-a", OTHER)], hosts=4, chips_per_host=4)
    assert [(p.name, p.eligible, p.holder) for p in facts] == [
        ("pool-a", True, OTHER),
        ("pool-b", False, None),
    ]


def test_text_builders() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th",
    ]  # fmt: skip
    assert shape_name(SHAPE) == "v6e 4x4" and shape_name(("tpu-x", "2x2")) == "tpu-x 2x2"
    many = [ShapePool(f"p{i}", True, Holder("ml", f"c{i % 5}", f"u{i % 5}", "r")) for i in range(9)]
    assert holders_summary(many) == (
        "ml/c0 (p0, p5), ml/c1 (p1, p6), ml/c2 (p2, p7), and 2 more holders"
    )
    # the request's own holding is neither named nor counted, wherever it ranks
    assert holders_summary(many, exclude_uid="u1") == (
        "ml/c0 (p0, p5), ml/c2 (p2, p7), ml/c3 (p3, p8), and 1 more holder"
    )
    assert holders_summary(many, exclude_uid="u4") == (
        "ml/c0 (p0, p5), ml/c1 (p1, p6), ml/c2 (p2, p7), and 1 more holder"
    )
    assert holders_summary(many[:3], exclude_uid="u0") == "ml/c1 (p1), ml/c2 (p2)"
    assert holders_summary(many[:1], exclude_uid="u0") == ""
    long = queue_message(
        position=1, waiting=1, shape="v6e 4x4", desired=2, held=0,
        gang=GangMode.ALL_SLICES, set_aside=0, ahead=0, holders="x" * 2000,
    )  # fmt: skip
    assert len(long) <= 512


def test_a_gang_ahead_does_not_deadlock_a_running_cluster_that_grows_behind_it() -> None:
    """Regression (e2e test_gangs): ``grow`` runs one slice on pool A and is scaled to two;
    ``ahead`` (priority 10, two slices) is first in the queue. ``ahead`` can never
    complete while A is held by grow's running slice, so it must not keep the free B
    from grow."""
    grow_holds = Holder("ml", "grow", "uid-grow", "tpu-g0", 0)
    pools = [ShapePool("a", True, grow_holds), ShapePool("b", True)]
    ahead = req("ahead", 2, t=2, priority=10)
    grow = req("grow", 2, t=1, held=1, claimable=1)
    decision = decide_queue(SHAPE, [ahead, grow], pools)
    assert decision.order == (("TPUSliceCluster", "ml", "ahead"), ("TPUSliceCluster", "ml", "grow"))
    assert decision.admissions[("TPUSliceCluster", "ml", "grow")].pools == ("b",)
    waiting = decision.admissions[("TPUSliceCluster", "ml", "ahead")]
    assert waiting.pools == () and waiting.set_aside == 0 and waiting.position == 1
    assert "held by running slices of clusters queued after it" in waiting.message


def test_a_gang_ahead_still_blocks_later_clusters_whose_pools_are_only_idle() -> None:
    """Pools of a later cluster that are held but not running (its gated partial set)
    come back: the gang ahead keeps the free pools set aside."""
    idle = Holder("ml", "late", "uid-late", "tpu-l0", 0)
    pools = [ShapePool("a", True, idle), ShapePool("b", True)]
    ahead = req("ahead", 2, t=1)
    late = req("late", 2, t=2, held=1, claimable=1, idle=1)
    decision = decide_queue(SHAPE, [ahead, late], pools)
    assert decision.admissions[("TPUSliceCluster", "ml", "ahead")].set_aside == 1
    assert decision.admissions[("TPUSliceCluster", "ml", "late")].pools == ()


def test_a_cluster_and_a_job_of_one_name_are_two_entries_of_the_shapes_queue() -> None:
    """The queue keys by (kind, namespace, name): a TPUSliceCluster and a TPUSliceJob named
    alike in one namespace each get their own place and their own pools. (Their pods
    exist but KubeRay has not labelled them with a slice yet: pools are set aside, none
    is granted.)"""
    cluster = ClusterRef("ml", "train", "uid-c", kind="TPUSliceCluster")
    job = ClusterRef("ml", "train", "uid-j", kind="TPUSliceJob")
    unlabelled = slice_pods(cluster="train", labelled=False)
    requests = [
        pool_request(ref, hosts=4, desired_slices=1, pods=unlabelled, reservations=[], created=t)
        for ref, t in ((cluster, "2026-01-01T00:00:00Z"), (job, "2026-01-01T00:00:01Z"))
    ]
    decision = decide_queue(SHAPE, requests, free_pools("p1", "p2"))
    assert decision.order == (cluster.key, job.key)
    first, second = admission_for(decision, cluster.key), admission_for(decision, job.key)
    assert (first.position, first.set_aside) == (1, 1)
    assert (second.position, second.set_aside) == (2, 1)


# ------------------------------------------------------------------ requests without pods

SQUAT = ("TPUSliceCluster", "ml", "squat")
READY = ("TPUSliceCluster", "ml", "ready")


def test_a_request_without_pods_sets_nothing_aside_and_blocks_nobody() -> None:
    """Measured: priority 1e9, every pool of the shape wanted, a worker template the
    namespace's ResourceQuota refuses (KubeRay can never create its pods). It keeps its
    place, but another team's ready 1-slice cluster gets its pool at once."""
    squat = req("squat", 3, t=2, priority=1_000_000_000, claimable=0)
    ready = req("ready", 1, t=1)
    decision = decide_queue(SHAPE, [ready, squat], free_pools("p1", "p2", "p3"))
    assert decision.order == (SQUAT, READY)
    assert decision.admissions[READY].pools == ("p1",)
    waiting = decision.admissions[SQUAT]
    assert (waiting.pools, waiting.set_aside, waiting.position, waiting.waiting) == ((), 0, 1, 1)
    assert decision.waiting == (SQUAT,)
    assert waiting.message == (
        "1st of 1 waiting for v6e 4x4: needs 3 node pools at once (holds 0); "
        "waiting for its pods to be created (none exists yet), so it holds nothing for now "
        "and the requests after it are served"
    )


def test_a_request_without_pods_is_not_counted_ahead_of_those_it_does_not_block() -> None:
    """A 2-slice gang behind it with one free pool: the free pool is set aside for the
    gang, whose message names no request ahead of it."""
    squat = req("squat", 1, t=1, priority=5, claimable=0, gang=GangMode.PER_SLICE)
    gang = req("gang", 2, t=2)
    decision = decide_queue(SHAPE, [squat, gang], [*free_pools("p1"), ShapePool("p2", True, OTHER)])
    behind = decision.admissions[("TPUSliceCluster", "ml", "gang")]
    assert (behind.pools, behind.set_aside, behind.position) == ((), 1, 2)
    assert behind.message == (
        "2nd of 2 waiting for v6e 4x4: needs 2 node pools at once (holds 0); "
        "1 free pool set aside for it; held by ml/other (p2)"
    )


def test_once_its_pods_exist_it_sets_aside_again() -> None:
    """The same squatter once KubeRay made one slice's pods (gated, so the quota admitted
    them): it is an ordinary head of the queue again and the 1-slice cluster waits."""
    squat = req("squat", 3, t=2, priority=1_000_000_000, claimable=1, live_pods=4)
    decision = decide_queue(SHAPE, [req("ready", 1, t=1), squat], free_pools("p1", "p2", "p3"))
    head, behind = decision.admissions[SQUAT], decision.admissions[READY]
    assert (head.pools, head.set_aside, head.position) == ((), 3, 1)
    assert "waiting for the pods of its slices" in head.message
    assert (behind.pools, behind.set_aside, behind.position) == ((), 0, 2)
    assert "1 request ahead in the queue" in behind.message


def test_pods_not_yet_labelled_with_a_slice_count_as_pods() -> None:
    ref = ClusterRef("ml", "squat", "uid-squat")
    built = {
        name: pool_request(ref, hosts=4, desired_slices=3, pods=pods, reservations=[])
        for name, pods in (
            ("none", []),
            ("deleting", slice_pods(cluster="squat", deleting=True)),
            ("unlabelled", slice_pods(cluster="squat", labelled=False)),
        )
    }
    assert [(r.live_pods, r.has_pods) for r in built.values()] == [
        (0, False),
        (0, False),
        (4, True),
    ]
    free = free_pools("p1", "p2", "p3")
    assert decide_queue(SHAPE, [built["none"]], free).admissions[ref.key].set_aside == 0
    assert decide_queue(SHAPE, [built["unlabelled"]], free).admissions[ref.key].set_aside == 3


def test_a_gang_without_pods_says_it_waits_for_its_pods_not_that_it_yields() -> None:
    """Behind it a running cluster grows: the pods rule comes first (nothing proves the
    gang can ever run), and the grower gets the free pool either way."""
    grow_holds = Holder("ml", "grow", "uid-grow", "tpu-g0", 0)
    pools = [ShapePool("a", True, grow_holds), ShapePool("b", True)]
    ahead = req("ahead", 2, t=2, priority=10, claimable=0)
    grow = req("grow", 2, t=1, held=1, claimable=1)
    decision = decide_queue(SHAPE, [ahead, grow], pools)
    assert decision.admissions[("TPUSliceCluster", "ml", "grow")].pools == ("b",)
    waiting = decision.admissions[("TPUSliceCluster", "ml", "ahead")]
    assert waiting.set_aside == 0 and "waiting for its pods to be created" in waiting.message
    assert "held by running slices" not in waiting.message


def test_past_a_request_without_pods_a_per_slice_request_is_served_whole() -> None:
    """Found by the property test: a 2-slice PerSlice cluster ran one slice on a pool the
    earlier cluster (no pods yet) would have had; once the earlier one's pods existed,
    each ran one slice and waited for the other's pool, for ever. Past a request without
    pods it gets nothing until all its slices have pods, then all at once."""
    early = req("early", 2, t=1, claimable=0, gang=GangMode.PER_SLICE)
    half = req("half", 2, t=2, claimable=1, live_pods=2, gang=GangMode.PER_SLICE)
    free = free_pools("p1", "p2")
    waits = decide_queue(SHAPE, [early, half], free).admissions[("TPUSliceCluster", "ml", "half")]
    assert (waits.pools, waits.set_aside, waits.position) == ((), 2, 2)
    assert "waiting for the pods of its slices" in waits.message
    whole = decide_queue(SHAPE, [early, req("half", 2, t=2, gang=GangMode.PER_SLICE)], free)
    assert whole.admissions[("TPUSliceCluster", "ml", "half")].pools == ("p1", "p2")
    # first in the queue, the same request takes what its pods can use, as before
    alone = decide_queue(SHAPE, [half], free).admissions[("TPUSliceCluster", "ml", "half")]
    assert alone.pools == ("p1",)


_POOL_NAMES = [f"pool-{i}" for i in range(8)]


@st.composite
def _queues(draw: st.DrawFn) -> tuple[list[PoolRequest], list[ShapePool]]:
    pools = [
        ShapePool(
            name,
            eligible=draw(st.booleans()) or i < 4,
            capacity_type=draw(st.sampled_from(list(CapacityType))),
            block=draw(st.sampled_from([None, "b1", "b2"])),
            maintenance_at=draw(st.sampled_from([None, None, 100, 200])),
        )
        for i, name in enumerate(_POOL_NAMES)
    ]
    requests = []
    for i in range(draw(st.integers(1, 6))):
        desired = draw(st.integers(1, 3))
        requests.append(
            req(
                f"r{i}",
                desired,
                t=i,
                claimable=draw(st.integers(0, desired)),
                gang=draw(st.sampled_from(list(GangMode))),
                previous=tuple(draw(st.lists(st.sampled_from(_POOL_NAMES), max_size=2))),
                capacity_types=tuple(
                    draw(st.lists(st.sampled_from(list(CapacityType)), max_size=1))
                ),
                maintenance_before=draw(st.sampled_from([None, 150])),
            )
        )
    return requests, pools


@settings(max_examples=300, deadline=None)
@given(_queues())
def test_taking_the_first_free_pools_is_what_the_preference_would_answer(
    queue: tuple[list[PoolRequest], list[ShapePool]],
) -> None:
    """The queue takes the first free pools in name order for a request with no
    preference to weigh, without asking ``prefer_pools``: the decision is the same as
    when every request asks it."""
    from tpuslice.planning import queue as queue_module

    requests, pools = queue
    fast = decide_queue(SHAPE, requests, pools)
    asked = queue_module._FreeInOrder.first_are_preferred
    try:
        queue_module._FreeInOrder.first_are_preferred = lambda self, r, together: False  # type: ignore[method-assign]
        slow = decide_queue(SHAPE, requests, pools)
    finally:
        queue_module._FreeInOrder.first_are_preferred = asked  # type: ignore[method-assign]
    assert fast == slow
