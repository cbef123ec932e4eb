"""Pin at admission, the first pods too: a unit claimed for each replica index before
KubeRay makes its pods (a placeholder holder), counted in the shape's queue, marked
once held, freed through the fence when the index goes, and taken over by the index's
first replica. Pure planning over the test builders, then one pass over the fake."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from tests.support.builders import holder, nodes_of, reservation, slice_pods, tpu, tpuslice
from tests.support.fake_kube import FakeKube
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model import constants as c
from tpuslice.model.records import (
    Admission,
    ClusterRef,
    GangMode,
    PodInfo,
    ReservationInfo,
    SlicePlan,
    SliceState,
    Snapshot,
)
from tpuslice.planning.pinning import kept_for_pins, pin_marks, pin_rekeys
from tpuslice.planning.pools import (
    is_placeholder,
    placeholder_name,
    plan_slices,
    pool_index,
    pool_request,
    shape_pools,
)
from tpuslice.planning.queue import admission_for, decide_queue

REF = ClusterRef("ml", "llm", "uid-llm")
HOSTS = 4
POOLS = ("pool-a", "pool-b", "pool-c")
SHAPE = ("tpu-v6e-slice", "4x4")


def ahead(index: int, pool: str, **kw: Any) -> ReservationInfo:
    """The reservation of ``pool`` claimed for ``index`` before its pods existed."""
    return replace(reservation(pool, holder(placeholder_name(index), index), uid=f"u-{pool}"), **kw)


def plan(
    pods: list[PodInfo] | None = None,
    reservations: list[ReservationInfo] | None = None,
    *,
    desired: int = 2,
    gang: GangMode = GangMode.PER_SLICE,
    pools: tuple[str, ...] = POOLS,
    admission: Admission | None = None,
    claim_ahead: bool = True,
    **nodes: Any,
) -> SlicePlan:
    return plan_slices(
        REF,
        accelerator=SHAPE[0],
        topology=SHAPE[1],
        hosts=HOSTS,
        chips_per_host=4,
        desired_slices=desired,
        gated=True,
        pods=pods or [],
        nodes=nodes_of(*pools, **nodes),
        reservations=reservations or [],
        gang=gang,
        admission=admission,
        claim_ahead=claim_ahead,
    )


def claimed(p: SlicePlan) -> set[int | None]:
    """The indexes the plan claims for, each a distinct unit."""
    assert len({claim.pool for claim in p.claims}) == len(p.claims)
    return {claim.holder.replica_index for claim in p.claims}


# ---------------------------------------------------------------- the claims
def test_the_placeholder_name_is_one_kuberay_never_gives() -> None:
    name = placeholder_name(3)
    assert is_placeholder(name) and not is_placeholder("tpu-group-x7k2p")
    assert "~" in name  # not a label value: KubeRay's replica names are


def test_each_index_without_pods_claims_a_unit_now() -> None:
    p = plan()
    assert claimed(p) == {0, 1}
    assert {claim.holder.replica_name for claim in p.claims} == {"~index-0", "~index-1"}
    assert [(s.index, s.state, s.node_pool, s.replica) for s in p.slices] == [
        (claim.holder.replica_index, SliceState.RESERVED, claim.pool, None) for claim in p.claims
    ]
    assert "before its pods exist" in p.slices[0].message
    # with the setting off nothing is claimed before pods exist
    off = plan(claim_ahead=False)
    assert off.claims == () and {s.state for s in off.slices} == {SliceState.PENDING}


def test_an_index_with_a_live_replica_or_a_unit_claims_no_placeholder() -> None:
    pods = slice_pods("tpu-aaaaa", 0)
    p = plan(pods, [reservation("pool-a", holder("tpu-aaaaa", 0))])
    assert claimed(p) == {1} and p.claims[0].pool != "pool-a"
    # index 1 held by a placeholder already, index 0 by its replica: nothing more
    held = [reservation("pool-a", holder("tpu-aaaaa", 0)), ahead(1, "pool-b")]
    assert plan(pods, held).claims == ()


def test_a_gang_claims_every_missing_index_at_once_or_none() -> None:
    one_free = plan(gang=GangMode.ALL_SLICES, pools=("pool-a",))
    assert one_free.claims == ()
    both = plan(gang=GangMode.ALL_SLICES)
    assert claimed(both) == {0, 1} and both.all_or_nothing
    # a replica with gated pods and a missing index: both held, so its pods are released
    pods = slice_pods("tpu-aaaaa", 0)
    mixed = plan(pods, [reservation("pool-a", holder("tpu-aaaaa", 0))], gang=GangMode.ALL_SLICES)
    assert claimed(mixed) == {1} and len(mixed.releases) == HOSTS


def test_a_gang_that_cannot_complete_gives_its_placeholders_back_when_contended() -> None:
    held = [ahead(0, "pool-a")]
    contended = Admission(pools=(), contended=True, message="2nd of 2 waiting")
    p = plan(reservations=held, gang=GangMode.ALL_SLICES, admission=contended)
    assert p.frees == ("pool-a",) and p.claims == ()
    assert p.slices[0].state == SliceState.WAITING_FOR_CAPACITY


def test_scale_down_frees_the_placeholder_of_an_index_beyond_the_count() -> None:
    held = [ahead(0, "pool-a"), ahead(1, "pool-b")]
    p = plan(reservations=held, desired=1)
    assert p.frees == ("pool-b",) and p.claims == ()
    # and the freed placeholder is never kept for its index (it is beyond the count)
    marked = [replace(r, pinned=True) for r in held]
    assert kept_for_pins(p.frees, REF, desired=1, hosts=HOSTS, pods=[], reservations=marked) == (
        "pool-b",
    )


def test_a_placeholder_on_a_disrupted_unit_is_given_back() -> None:
    p = plan(reservations=[ahead(0, "pool-a")], desired=1, pools=("pool-a",), not_ready=1)
    assert p.frees == ("pool-a",)


# ---------------------------------------------------------------- the queue
def request(pods: list[PodInfo], reservations: list[ReservationInfo], **kw: Any) -> Any:
    return pool_request(
        kw.pop("ref", REF),
        hosts=HOSTS,
        desired_slices=kw.pop("desired", 2),
        pods=pods,
        reservations=reservations,
        claim_ahead=kw.pop("claim_ahead", True),
        **kw,
    )


def test_indexes_without_pods_count_as_claimable_and_placeholders_as_held() -> None:
    r = request([], [])
    assert (r.held, r.claimable, r.idle) == (0, 2, 0)
    r = request([], [ahead(0, "pool-a")])
    assert (r.held, r.claimable, r.idle) == (1, 1, 1)
    # the replica of index 0 exists and takes the placeholder over: it claims nothing
    r = request(slice_pods("tpu-aaaaa", 0), [ahead(0, "pool-a")])
    assert (r.held, r.claimable) == (1, 1)
    assert request([], [], claim_ahead=False).claimable == 0


def test_a_higher_priority_waiting_object_is_not_overtaken() -> None:
    other = ClusterRef("ml", "big", "uid-big")
    big_pods = slice_pods("tpu-bbbbb", 0, cluster="big") + slice_pods("tpu-ccccc", 1, cluster="big")
    big = request(big_pods, [], ref=other, priority=10, gang=GangMode.ALL_SLICES, claim_ahead=False)
    mine = request([], [], created="2026-01-01T00:00:00Z")
    index = pool_index(nodes_of(*POOLS), *SHAPE)
    pools = shape_pools(index, [], hosts=HOSTS, chips_per_host=4)
    decision = decide_queue(SHAPE, [mine, big], pools)
    assert len(admission_for(decision, other.queue_key).pools or ()) == 2
    mine_now = admission_for(decision, REF.queue_key)
    assert mine_now.pools is not None and len(mine_now.pools) == 1  # the one left over
    p = plan(admission=mine_now)
    assert len(p.claims) == 1
    # the big one takes all three: nothing for the placeholders
    big3 = replace(big, desired=3, claimable=3)
    decision = decide_queue(SHAPE, [mine, big3], pools)
    assert admission_for(decision, REF.queue_key).pools == ()
    assert plan(admission=admission_for(decision, REF.queue_key)).claims == ()


# ---------------------------------------------------------------- marks and the rekey
def marks(reservations: list[ReservationInfo], *, desired: int = 2, gang: GangMode) -> set[str]:
    out = pin_marks(
        REF,
        enabled=True,
        hosts=HOSTS,
        chips_per_host=4,
        desired=desired,
        gang=gang,
        pods=[],
        reservations=reservations,
        plan=SlicePlan(),
        inventory=pool_index(nodes_of(*POOLS), *SHAPE),
    )
    return {r.pool for r in out.mark}


def test_a_held_placeholder_is_marked_a_gang_only_whole() -> None:
    both = [ahead(0, "pool-a"), ahead(1, "pool-b")]
    assert marks(both, gang=GangMode.PER_SLICE) == {"pool-a", "pool-b"}
    assert marks(both, gang=GangMode.ALL_SLICES) == {"pool-a", "pool-b"}
    assert marks(both[:1], gang=GangMode.ALL_SLICES) == set()
    assert marks(both[:1], gang=GangMode.PER_SLICE) == {"pool-a"}


def test_the_first_live_replica_takes_the_placeholder_over() -> None:
    held = [ahead(0, "pool-a")]
    pinned = slice_pods("tpu-aaaaa", 0, gated=False, pool="pool-a")
    (given,) = pin_rekeys(REF, hosts=HOSTS, pods=pinned, reservations=held)
    assert (given.pool, given.holder.replica_name, given.holder.replica_index) == (
        "pool-a",
        "tpu-aaaaa",
        0,
    )
    # its pods came gated (before the mark): it takes the placeholder over, unmarked too
    gated = slice_pods("tpu-aaaaa", 0)
    assert len(pin_rekeys(REF, hosts=HOSTS, pods=gated, reservations=held)) == 1
    # pinned elsewhere, or of another index: not this unit
    elsewhere = slice_pods("tpu-aaaaa", 0, gated=False, pool="pool-b")
    assert pin_rekeys(REF, hosts=HOSTS, pods=elsewhere, reservations=held) == ()
    other = slice_pods("tpu-aaaaa", 1)
    assert pin_rekeys(REF, hosts=HOSTS, pods=other, reservations=held) == ()


def test_a_replica_waiting_for_the_rekey_never_claims_a_second_unit() -> None:
    pods = slice_pods("tpu-aaaaa", 0)
    p = plan(pods, [ahead(0, "pool-a")], desired=1)
    assert p.claims == () and p.frees == () and p.releases == ()
    (status,) = p.slices
    assert (status.state, status.node_pool, status.replica) == (
        SliceState.RESERVED,
        "pool-a",
        "tpu-aaaaa",
    )
    # once re-keyed, the gated pods are released onto that unit by the normal patch
    rekeyed = [reservation("pool-a", holder("tpu-aaaaa", 0))]
    after = plan(pods, rekeyed, desired=1)
    assert after.claims == () and {r.pool for r in after.releases} == {"pool-a"}


# ---------------------------------------------------------------- a pass
def test_a_pass_claims_and_marks_every_index_before_any_pod_exists() -> None:
    kube = FakeKube()
    body = tpuslice(uid="uid-llm", generation=1, tpu=tpu(slices=2))
    snap = Snapshot(body, [], nodes_of(*POOLS), [], None)
    reconciler = Reconciler(kube, lambda key: snap)
    assert reconciler.fence is not None
    reconciler.fence.enabled = True
    asyncio.run(reconciler.kick(("TPUSliceCluster", "ml", "llm")))
    claims = [call for call in kube.calls if call[0] == "claim"]
    assert len(claims) == 2
    holders = {body["spec"]["holder"]["replicaName"] for body in kube.claimed.values()}
    assert holders == {"~index-0", "~index-1"}
    # marked in the same pass (the fake shows the create only to the next pass's read)
    marked = {call[1] for call in kube.calls if call[0] == "annotate"}
    assert marked == set(kube.claimed)
    # both before the apply that makes KubeRay create the replicas' pods
    kinds = [call[0] for call in kube.calls]
    assert kinds.index("apply") > max(i for i, k in enumerate(kinds) if k in ("claim", "annotate"))
    # with the setting off the same pass claims nothing
    kube = FakeKube()
    asyncio.run(Reconciler(kube, lambda key: snap).kick(("TPUSliceCluster", "ml", "llm")))
    assert not [call for call in kube.calls if call[0] == "claim"]
    assert "apply" in [call[0] for call in kube.calls]
    assert c.PLACEHOLDER_REPLICA_PREFIX == "~index-"


def test_a_live_replica_above_the_count_leaves_no_room_for_a_placeholder() -> None:
    # scaled 2 -> 1 and KubeRay removed index 0: the replica of index 1 runs on
    pods = slice_pods("tpu-bbbbb", 1, gated=False, pool="pool-b")
    held = [reservation("pool-b", holder("tpu-bbbbb", 1))]
    assert plan(pods, held, desired=1).claims == ()
    assert request(pods, held, desired=1).claimable == 0
    # index 0's old unit still being freed: no placeholder for index 0 either
    going = [*held, reservation("pool-a", holder("tpu-aaaaa", 0))]
    assert plan(pods, going, desired=2).claims == ()


def test_a_pass_after_a_kill_between_claim_and_mark_marks_and_claims_nothing_more() -> None:
    held = [ahead(0, "pool-a"), ahead(1, "pool-b")]
    kube = FakeKube(taken={r.pool: r for r in held})
    body = tpuslice(uid="uid-llm", generation=1, tpu=tpu(slices=2))
    snap = Snapshot(body, [], nodes_of(*POOLS), held, None)
    reconciler = Reconciler(kube, lambda key: snap)
    assert reconciler.fence is not None
    reconciler.fence.enabled = True
    asyncio.run(reconciler.kick(("TPUSliceCluster", "ml", "llm")))
    assert not [call for call in kube.calls if call[0] in ("claim", "free")]
    assert all(kube.taken[r.pool].pinned for r in held)
    kinds = [call[0] for call in kube.calls]
    assert kinds.index("apply") > max(i for i, k in enumerate(kinds) if k == "annotate")


def test_nothing_is_held_ahead_of_pods_that_cannot_come() -> None:
    """The RayCluster's name is another's: the pass claims nothing before (or after) the
    apply it refuses; nor after an earlier pass's apply was refused."""
    kube = FakeKube()
    kube.rayclusters[("ml", "llm")] = {
        "metadata": {
            "name": "llm",
            "namespace": "ml",
            "uid": "theirs",
            "ownerReferences": [
                {"kind": "RayJob", "name": "training", "uid": "job-uid", "controller": True}
            ],
        },
        "spec": {},
    }
    body = tpuslice(uid="uid-llm", generation=1, tpu=tpu(slices=2))
    reconciler = Reconciler(kube, lambda key: Snapshot(body, [], nodes_of(*POOLS), [], None))
    assert reconciler.fence is not None
    reconciler.fence.enabled = True
    asyncio.run(reconciler.kick(("TPUSliceCluster", "ml", "llm")))
    assert "claim" not in [call[0] for call in kube.calls]
    refused = {
        **body,
        "status": {
            "conditions": [{"type": "Stalled", "status": "True", "reason": "RayClusterRejected"}]
        },
    }
    kube = FakeKube()
    reconciler = Reconciler(kube, lambda key: Snapshot(refused, [], nodes_of(*POOLS), [], None))
    assert reconciler.fence is not None
    reconciler.fence.enabled = True
    asyncio.run(reconciler.kick(("TPUSliceCluster", "ml", "llm")))
    kinds = [call[0] for call in kube.calls]
    assert "apply" in kinds and kinds.index("apply") < kinds.index("claim")


def test_an_object_whose_pods_never_come_stops_claiming_ahead() -> None:
    """Past AHEAD_WITHOUT_PODS_S without a pod (a quota that refuses them), nothing is
    claimed ahead and the placeholders go back: the queue's rule for an object without
    pods holds again, whatever its priority."""
    body = tpuslice(uid="uid-llm", generation=1, tpu=tpu(slices=2))
    body["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
    kube = FakeKube()
    reconciler = Reconciler(kube, lambda key: Snapshot(body, [], nodes_of(*POOLS), [], None))
    assert reconciler.fence is not None
    reconciler.fence.enabled = True
    asyncio.run(reconciler.kick(("TPUSliceCluster", "ml", "llm")))
    assert "claim" not in [call[0] for call in kube.calls]
    held = [ahead(0, "pool-a")]
    kube = FakeKube(taken={r.pool: r for r in held})
    reconciler = Reconciler(kube, lambda key: Snapshot(body, [], nodes_of(*POOLS), held, None))
    assert reconciler.fence is not None
    reconciler.fence.enabled = True
    asyncio.run(reconciler.kick(("TPUSliceCluster", "ml", "llm")))
    assert ("free", "pool-a") in kube.calls and "claim" not in [c[0] for c in kube.calls]
    # one of its pods exists: it claims ahead for the other index again
    pods = slice_pods("tpu-aaaaa", 0)
    kube = FakeKube()
    reconciler = Reconciler(kube, lambda key: Snapshot(body, pods, nodes_of(*POOLS), [], None))
    assert reconciler.fence is not None
    reconciler.fence.enabled = True
    asyncio.run(reconciler.kick(("TPUSliceCluster", "ml", "llm")))
    holders = {b["spec"]["holder"]["replicaName"] for b in kube.claimed.values()}
    assert holders == {"tpu-aaaaa", "~index-1"}
