"""Decisions of the whole-slice reservation, from snapshots."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.support.builders import holder, nodes_of, reservation, slice_pods
from tpuslice.model.records import (
    ClusterRef,
    Holder,
    NodeInfo,
    PodInfo,
    ReservationInfo,
    SliceState,
)
from tpuslice.planning.pools import plan_slices

CLUSTER = ClusterRef("ml", "llm", "uid-llm")
OTHER = Holder("ml", "other", "uid-other", "tpu-zzzzz", 0)


def plan(cluster: ClusterRef = CLUSTER, **kw: Any) -> Any:
    args: dict[str, Any] = dict(
        accelerator="tpu-v6e-slice",
        topology="4x4",
        hosts=4,
        chips_per_host=4,
        desired_slices=2,
        gated=True,
        pods=[],
        nodes=[],
        reservations=[],
    )
    args.update(kw)
    return plan_slices(cluster, **args)


def test_two_complete_slices_two_free_pools_claim_distinct_pools_and_release_all() -> None:
    result = plan(
        pods=slice_pods("tpu-aaaaa", 0) + slice_pods("tpu-bbbbb", 1),
        nodes=nodes_of("pool-a") + nodes_of("pool-b"),
    )
    assert [(c.pool, c.holder.replica_name) for c in result.claims] == [
        ("pool-a", "tpu-aaaaa"),
        ("pool-b", "tpu-bbbbb"),
    ]
    assert len(result.releases) == 8
    assert {(r.replica_name, r.pool) for r in result.releases} == {
        ("tpu-aaaaa", "pool-a"),
        ("tpu-bbbbb", "pool-b"),
    }
    assert [s.state for s in result.slices] == [SliceState.RESERVED, SliceState.RESERVED]


def test_incomplete_slice_is_reserved_but_never_released() -> None:
    result = plan(
        pods=slice_pods("tpu-aaaaa", 0, hosts=3), nodes=nodes_of("pool-a"), desired_slices=1
    )
    assert [c.pool for c in result.claims] == ["pool-a"]
    assert result.releases == ()
    (status,) = result.slices
    assert status.state == SliceState.RESERVED
    assert status.message == "3 of 4 pods created; released when all exist"


def test_one_pool_two_slices_the_second_waits_with_a_useful_message() -> None:
    result = plan(
        pods=slice_pods("tpu-aaaaa", 0) + slice_pods("tpu-bbbbb", 1), nodes=nodes_of("pool-a")
    )
    assert [c.holder.replica_name for c in result.claims] == ["tpu-aaaaa"]
    assert {r.replica_name for r in result.releases} == {"tpu-aaaaa"}
    waiting = result.slices[1]
    assert waiting.state == SliceState.WAITING_FOR_CAPACITY
    assert waiting.message == (
        "needs a free node pool of 4 ready nodes with tpu-v6e-slice/4x4; 1 match: "
        "pool-a taken by another slice of this cluster"
    )


def test_pool_held_by_another_cluster_is_not_eligible() -> None:
    result = plan(
        pods=slice_pods("tpu-aaaaa", 0),
        nodes=nodes_of("pool-a"),
        desired_slices=1,
        reservations=[ReservationInfo("pool-a", OTHER)],
    )
    assert result.claims == () and result.releases == ()
    assert result.slices[0].message.endswith("pool-a held by ml/other (slice tpu-zzzzz)")


def test_unhealthy_or_wrong_size_pools_are_not_eligible_and_are_explained() -> None:
    nodes = (
        nodes_of("a-small", hosts=2)
        + nodes_of("b-notready", not_ready=1)
        + nodes_of("c-cordoned", cordoned=2)
        + nodes_of("d-other-topology", topology="8x8")
        + nodes_of("e-big-hosts", chips=8)
        + nodes_of("f-in-a-gke-slice", gke_slice="team-a-0")
    )
    result = plan(pods=slice_pods("tpu-aaaaa", 0), nodes=nodes, desired_slices=1)
    assert result.claims == ()
    assert result.slices[0].message == (
        "needs a free node pool of 4 ready nodes with tpu-v6e-slice/4x4; 5 match: "
        "a-small has 2 nodes (needs 4), b-notready has 1 of 4 nodes NotReady, "
        "c-cordoned has 2 of 4 nodes cordoned, "
        "e-big-hosts has 4 of 4 nodes with 8 google.com/tpu (needs 4 per node), "
        "f-in-a-gke-slice has 4 of 4 nodes in GKE Slice team-a-0 "
        "(cloud.google.com/gke-tpu-slice); they belong to that Slice's owner"
    )


def test_capacity_message_names_a_few_pools_and_counts_the_rest() -> None:
    """Repeated on every waiting slice: 300 held pools must not make it 300 names long."""
    nodes = [n for i in range(300) for n in nodes_of(f"p{i:03d}")]
    reservations = [
        ReservationInfo(f"p{i:03d}", Holder("ml", "other", "uid-other", f"r{i}", i))
        for i in range(300)
    ]
    result = plan(
        pods=slice_pods("tpu-aaaaa", 0), nodes=nodes, desired_slices=1, reservations=reservations
    )
    message = result.slices[0].message
    assert message.startswith(
        "needs a free node pool of 4 ready nodes with tpu-v6e-slice/4x4; 300 match: "
        "p000 held by ml/other (slice r0), "
    )
    assert message.endswith(", and 295 more") and len(message) < 400


def test_no_matching_pool_at_all() -> None:
    result = plan(pods=slice_pods("tpu-aaaaa", 0), desired_slices=1)
    assert result.slices[0].message.endswith("; no node pool matches")


def test_held_slice_releases_only_its_gated_pods() -> None:
    pods = slice_pods("tpu-aaaaa", 0, gated=False, pool="pool-a")[:2] + slice_pods()[2:]
    result = plan(
        pods=pods,
        nodes=nodes_of("pool-a"),
        reservations=[reservation("pool-a", holder("tpu-aaaaa", 0))],
        desired_slices=1,
    )
    assert result.claims == ()
    assert [r.name for r in result.releases] == ["llm-tpu-aaaaa-2", "llm-tpu-aaaaa-3"]


def test_ready_slice_is_bound_once() -> None:
    pods = slice_pods("tpu-aaaaa", 0, gated=False, pool="pool-a", ready=True)
    result = plan(
        pods=pods,
        nodes=nodes_of("pool-a"),
        reservations=[reservation("pool-a", holder("tpu-aaaaa", 0))],
        desired_slices=1,
    )
    assert result.slices[0].state == SliceState.READY and result.slices[0].ready_hosts == 4
    assert result.binds == ("pool-a",)
    again = plan(
        pods=pods,
        nodes=nodes_of("pool-a"),
        desired_slices=1,
        reservations=[reservation("pool-a", holder("tpu-aaaaa", 0), phase="Bound")],
    )
    assert again.binds == () and again.claims == () and again.releases == () and again.frees == ()


def test_reservation_of_a_vanished_replica_is_freed_and_terminating_pods_keep_it() -> None:
    result = plan(
        reservations=[reservation("pool-a", holder("tpu-gone1", 0))], nodes=nodes_of("pool-a")
    )
    assert result.frees == ("pool-a",)
    terminating = plan(
        reservations=[reservation("pool-a", holder("tpu-old01", 0))],
        nodes=nodes_of("pool-a"),
        pods=slice_pods("tpu-old01", 0, gated=False, pool="pool-a", deleting=True),
    )
    assert terminating.frees == ()
    assert terminating.slices[0].state == SliceState.RELEASING


def test_replacement_replica_is_shown_over_the_terminating_one_and_waits_for_the_pool() -> None:
    old = slice_pods("tpu-old01", 0, gated=False, pool="pool-a", deleting=True)
    new = slice_pods("tpu-new01", 0)
    result = plan(
        pods=old + new,
        nodes=nodes_of("pool-a"),
        desired_slices=1,
        reservations=[reservation("pool-a", holder("tpu-old01", 0))],
    )
    assert result.claims == ()  # pool-a is still held for the old replica's terminating pods
    assert result.slices[0].replica == "tpu-new01"
    assert result.slices[0].state == SliceState.WAITING_FOR_CAPACITY


def test_previous_pool_of_the_index_is_preferred() -> None:
    result = plan(
        pods=slice_pods("tpu-new01", 1),
        nodes=nodes_of("pool-a") + nodes_of("pool-b"),
        previous_pools={1: "pool-b"},
    )
    assert [c.pool for c in result.claims] == ["pool-b"]


def test_released_pods_can_only_go_back_to_their_pool() -> None:
    pods = slice_pods("tpu-aaaaa", 0, gated=False, pool="pool-a")
    result = plan(
        pods=pods,
        nodes=nodes_of("pool-a") + nodes_of("pool-b"),
        desired_slices=1,
        reservations=[ReservationInfo("pool-a", OTHER)],
    )
    assert result.claims == ()
    taken_back = plan(pods=pods, nodes=nodes_of("pool-a") + nodes_of("pool-b"), desired_slices=1)
    assert [c.pool for c in taken_back.claims] == ["pool-a"]


def test_pods_without_multi_host_labels_are_reported() -> None:
    bare = PodInfo(
        "ml", "llm-tpu-worker-x", "llm", None, None, None, True, None, None, False, False
    )
    result = plan(pods=[bare], nodes=nodes_of("pool-a"))
    assert result.unindexed_pods == ("llm-tpu-worker-x",)
    assert result.claims == ()


def test_single_host_slices_are_named_by_their_pod() -> None:
    """KubeRay sets only the replica index on single-host workers."""
    single = [
        PodInfo("ml", f"dev-tpu-worker-{i}", "dev", None, i, None, True, None, None, False, False)
        for i in range(2)
    ]
    nodes = [NodeInfo(f"n{i}", f"p{i}", "tpu-v6e-slice", "2x2", 4, True, True) for i in range(2)]
    result = plan(pods=single, nodes=nodes, topology="2x2", hosts=1, desired_slices=2)
    assert result.unindexed_pods == ()
    # a single-host slice holds one node (its own unit), and is pinned to it
    claimed = {c.holder.replica_name: c.pool for c in result.claims}
    assert sorted(claimed) == ["dev-tpu-worker-0", "dev-tpu-worker-1"]
    assert sorted(claimed.values()) == ["n0", "n1"]
    assert [r.name for r in result.releases] == ["dev-tpu-worker-0", "dev-tpu-worker-1"]
    assert [r.unit.pin(r.pool) for r in result.releases] == [
        {"kubernetes.io/hostname": claimed[r.name]} for r in result.releases
    ]


def test_policy_none_never_claims() -> None:
    pods = slice_pods("tpu-aaaaa", 0, gated=False, ready=True)
    result = plan(pods=pods, nodes=nodes_of("pool-a"), gated=False, desired_slices=1)
    assert result.claims == () and result.releases == ()
    assert result.slices[0].state == SliceState.READY


def test_live_replicas_at_any_index_count_and_missing_ones_are_pending() -> None:
    result = plan(pods=slice_pods("tpu-ccccc", 2), nodes=nodes_of("pool-a"), desired_slices=2)
    assert [(s.index, s.state) for s in result.slices] == [
        (0, SliceState.PENDING),
        (2, SliceState.RESERVED),
    ]


def test_after_scale_down_the_surviving_replica_may_keep_index_one() -> None:
    """KubeRay chooses which replica to delete; the one left can be index 1."""
    pods = slice_pods("tpu-bbbbb", 1, gated=False, pool="pool-b", ready=True)
    result = plan(
        pods=pods,
        nodes=nodes_of("pool-b"),
        desired_slices=1,
        reservations=[reservation("pool-b", holder("tpu-bbbbb", 1), phase="Bound")],
    )
    assert [(s.index, s.state) for s in result.slices] == [(1, SliceState.READY)]


def test_same_snapshot_same_plan() -> None:
    """The plan depends on the snapshot only: not on the order the informers list the
    objects in, nor on an earlier plan (no state kept between calls). The snapshot has
    more free pools than slices, so a planner that took pools in listing order would
    choose differently for the two orders."""

    def snapshot(reverse: bool) -> dict[str, Any]:
        pods = slice_pods("tpu-bbbbb", 1) + slice_pods("tpu-aaaaa", 0)
        nodes = nodes_of("pool-b") + nodes_of("pool-a") + nodes_of("pool-d") + nodes_of("pool-c")
        held = [ReservationInfo("pool-d", OTHER, "Bound")]
        if reverse:
            pods, nodes = pods[::-1], nodes[::-1]
        return dict(pods=pods, nodes=nodes, reservations=held)

    def unordered_releases(result: Any) -> Any:
        """Releases follow the pods' listing order; each is one independent patch."""
        return replace(result, releases=frozenset(result.releases))

    first = unordered_releases(plan(**snapshot(reverse=False)))
    assert len(first.claims) == 2  # two of the three free pools: a choice was made
    # a plan of another snapshot in between, where tpu-aaaaa can only get pool-c
    between = plan(pods=slice_pods("tpu-aaaaa", 0), nodes=nodes_of("pool-c"), desired_slices=1)
    assert [c.pool for c in between.claims] == ["pool-c"]
    assert unordered_releases(plan(**snapshot(reverse=True))) == first
    assert unordered_releases(plan(**snapshot(reverse=False))) == first


def test_a_held_slice_with_a_node_not_ready_is_drained_whole_and_keeps_its_pool() -> None:
    """A dead host interrupts the whole slice: its live pods are deleted together (the
    one already terminating is not deleted again), the pool stays held until they are
    gone, and the message names the node."""
    pods = slice_pods("tpu-aaaaa", 0, gated=False, pool="pool-a", ready=True)
    pods[1] = slice_pods("tpu-aaaaa", 0, gated=False, pool="pool-a", deleting=True)[1]
    ours = ReservationInfo("pool-a", Holder("ml", "llm", "uid-llm", "tpu-aaaaa", 0), "Bound")
    result = plan(
        pods=pods,
        nodes=nodes_of("pool-a", not_ready=2) + nodes_of("pool-b"),
        desired_slices=1,
        reservations=[ours],
    )
    assert result.frees == () and result.claims == () and result.releases == ()
    (drain,) = result.drains
    assert drain.pods == tuple(("ml", p.name) for p in pods if not p.deleting)
    assert (drain.node, drain.reason, drain.grace_seconds) == ("pool-a-0", "NodeFailure", 30)
    released = [s for s in result.slices if s.replica == "tpu-aaaaa"]
    (entry,) = released
    assert (entry.state, entry.node_pool) == (SliceState.RELEASING, "pool-a")
    assert entry.message.startswith("node pool-a-0 is NotReady: every pod of the slice")


def test_the_sweep_deletes_only_orphans_of_namespaces_it_watches() -> None:
    from tpuslice.planning.sweep import is_orphan, watches_namespace

    holder = Holder("ml", "llm", "uid-1", "tpu-abc")
    # a cluster-wide instance: the holder is gone and its pods too -> orphan
    assert is_orphan(holder, None, False, ())
    # ... but not while the cluster lives, nor while a pod of the slice remains
    assert not is_orphan(holder, "uid-1", False, ())
    assert not is_orphan(holder, None, True, ())
    # a TSC of the same name but another uid (deleted and made again) is not the holder
    assert is_orphan(holder, "uid-2", False, ())
    # an instance watching other namespaces sees neither the cluster nor its pods:
    # that is no evidence, so it never deletes
    assert not is_orphan(holder, None, False, ("team-a", "team-b"))
    assert is_orphan(holder, None, False, ("team-a", "ml"))
    assert watches_namespace((), "anything") and not watches_namespace(("a",), "b")


def test_clusters_of_one_shape_without_a_queue_start_their_claims_at_different_pools() -> None:
    """No queue decision (everyone fits): each cluster claims in its own order of the free
    pools, so clusters planning at once on the same view rarely pick the same pool (by
    name, all of them went for the first free one and all but one lost the create)."""
    nodes = [n for i in range(40) for n in nodes_of(f"pool-{i:02d}")]
    picks = []
    for i in range(40):
        ref = ClusterRef("ml", f"c{i}", f"uid-{i}")
        result = plan(ref, pods=slice_pods("tpu-aaaaa", 0), nodes=nodes, desired_slices=1)
        (claim,) = result.claims
        picks.append(claim.pool)
    # 40 independent picks over 40 pools: the same pool for all (name order) was the herd
    assert len(set(picks)) >= 20


def test_a_clusters_claim_order_is_stable_and_skips_only_what_is_taken() -> None:
    """The same view gives the same pool in every pass, and a pool someone else took moves
    the cluster to its next pool without changing its order of the rest."""
    nodes = [n for i in range(8) for n in nodes_of(f"pool-{i}")]
    first = plan(pods=slice_pods("tpu-aaaaa", 0), nodes=nodes, desired_slices=1).claims[0].pool
    again = plan(pods=slice_pods("tpu-aaaaa", 0), nodes=nodes, desired_slices=1).claims[0].pool
    assert first == again
    taken = ReservationInfo(first, OTHER, "Reserved")
    second = plan(
        pods=slice_pods("tpu-aaaaa", 0), nodes=nodes, desired_slices=1, reservations=[taken]
    ).claims[0]
    assert second.pool != first
    third_taken = ReservationInfo(second.pool, Holder("ml", "x", "uid-x", "tpu-x", 0), "Reserved")
    third = plan(
        pods=slice_pods("tpu-aaaaa", 0),
        nodes=nodes,
        desired_slices=1,
        reservations=[taken, third_taken],
    ).claims[0]
    assert third.pool not in (first, second.pool)
    # a pool the cluster would not have picked, taken by another, changes nothing
    elsewhere = next(f"pool-{i}" for i in range(8) if f"pool-{i}" not in (first, second.pool))
    unchanged = plan(
        pods=slice_pods("tpu-aaaaa", 0),
        nodes=nodes,
        desired_slices=1,
        reservations=[ReservationInfo(elsewhere, OTHER, "Reserved")],
    ).claims[0]
    assert unchanged.pool == first
