"""Whole-node-pool reservation per slice: inventory, eligibility and decisions, all pure.

One multi-host TPU slice is exactly one GKE node pool, and a slice is useless
unless every host runs. So no pod of a slice may schedule until (a) the slice
holds a whole matching pool and (b) all of its pods exist; then every pod is
pinned to that pool in one patch that also removes our gate. The truth
(reservations, pods, nodes) lives in the API server; this module turns a
snapshot of it into actions, and the same snapshot always gives the same
actions, so a crash at any line only delays the next pass.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tpuslice.records import (
    Claim,
    ClusterRef,
    Holder,
    NodeInfo,
    PodInfo,
    PodRelease,
    ReservationInfo,
    SlicePlan,
    SliceState,
    SliceStatus,
)

__all__ = ["PoolIndex", "plan_slices", "pool_index", "pool_inventory"]


@dataclass(frozen=True)
class _Wanted:
    """What a slice needs from a node pool."""

    accelerator: str
    topology: str
    hosts: int
    chips_per_host: int

    def describe(self) -> str:
        return f"{self.hosts} ready nodes with {self.accelerator}/{self.topology}"


@dataclass
class _Replica:
    name: str
    index: int | None
    pods: list[PodInfo] = field(default_factory=list)

    @property
    def live(self) -> list[PodInfo]:
        return [p for p in self.pods if not p.deleting]


def _pool_problem(nodes: Sequence[NodeInfo], wanted: _Wanted) -> str | None:
    """Why a pool with the right labels cannot hold the slice, or None if it can."""
    if len(nodes) != wanted.hosts:
        return f"has {len(nodes)} nodes (needs {wanted.hosts})"
    not_ready = [n.name for n in nodes if not n.ready]
    if not_ready:
        return f"has {len(not_ready)} of {len(nodes)} nodes NotReady"
    cordoned = [n.name for n in nodes if not n.schedulable]
    if cordoned:
        return f"has {len(cordoned)} of {len(nodes)} nodes cordoned"
    short = [n.name for n in nodes if n.chips < wanted.chips_per_host]
    if short:
        return f"has nodes with fewer than {wanted.chips_per_host} google.com/tpu"
    return None


def pool_inventory(nodes: Iterable[NodeInfo]) -> dict[str, list[NodeInfo]]:
    pools: dict[str, list[NodeInfo]] = defaultdict(list)
    for node in nodes:
        pools[node.pool].append(node)
    return dict(pools)


def _matching_pools(
    pools: Mapping[str, Sequence[NodeInfo]], accelerator: str, topology: str
) -> dict[str, Sequence[NodeInfo]]:
    return {
        name: nodes
        for name, nodes in sorted(pools.items())
        if nodes and all(n.accelerator == accelerator and n.topology == topology for n in nodes)
    }


@dataclass(frozen=True)
class PoolIndex:
    """The node pools of one shape: every pool by name, and those whose nodes all match.

    Building it walks every node of the shape (4,000 at the design's scale), so the
    reconciler keeps one per shape until a node of that shape really changes,
    instead of rebuilding it in every pass.
    """

    pools: Mapping[str, Sequence[NodeInfo]]
    matching: Mapping[str, Sequence[NodeInfo]]


def pool_index(nodes: Iterable[NodeInfo], accelerator: str, topology: str) -> PoolIndex:
    pools = pool_inventory(nodes)
    return PoolIndex(pools, _matching_pools(pools, accelerator, topology))


#: Matching pools a WaitingForCapacity message names (the rest are counted): the message
#: is repeated on every waiting slice, and a shape may have hundreds of pools.
CAPACITY_POOLS_LISTED = 5


def _capacity_message(
    wanted: _Wanted,
    matching: Mapping[str, Sequence[NodeInfo]],
    held: Mapping[str, Holder],
    taken_now: set[str],
) -> str:
    head = f"needs a free node pool of {wanted.describe()}"
    if not matching:
        return f"{head}; no node pool matches"
    details: list[str] = []
    for name, nodes in matching.items():
        if len(details) == CAPACITY_POOLS_LISTED:
            break
        if name in held:
            details.append(f"{name} held by {held[name].describe()}")
        elif name in taken_now:
            details.append(f"{name} taken by another slice of this cluster")
        elif problem := _pool_problem(nodes, wanted):
            details.append(f"{name} {problem}")
    count = len(matching)
    more = f", and {count - len(details)} more" if count > len(details) else ""
    return f"{head}; {count} match: " + ", ".join(details) + more


def _group_replicas(pods: Iterable[PodInfo], hosts: int) -> tuple[dict[str, _Replica], list[str]]:
    """Pods by slice. KubeRay labels replica name and host index only for multi-host
    groups; a single-host slice is one pod, so the pod's own name names the slice."""
    replicas: dict[str, _Replica] = {}
    unindexed: list[str] = []
    for pod in pods:
        name = pod.replica_name
        if name is None and hosts == 1 and pod.replica_index is not None:
            name = pod.name
        elif name is None or pod.host_index is None:
            if not pod.deleting:
                unindexed.append(pod.name)
            continue
        replica = replicas.setdefault(name, _Replica(name, None))
        if pod.replica_index is not None:
            replica.index = pod.replica_index
        replica.pods.append(pod)
    return replicas, unindexed


def _live_state(replica: _Replica, pool: str | None, hosts: int) -> tuple[SliceState, int]:
    live = replica.live
    ready = sum(1 for p in live if p.running_ready and (pool is None or p.pinned_pool == pool))
    if len(live) == hosts and ready == hosts:
        return SliceState.READY, ready
    if len(live) == hosts and not any(p.gated for p in live):
        return SliceState.SCHEDULED, ready
    return SliceState.RESERVED, ready


def plan_slices(
    cluster: ClusterRef,
    *,
    accelerator: str,
    topology: str,
    hosts: int,
    chips_per_host: int,
    desired_slices: int,
    gated: bool,
    pods: Iterable[PodInfo],
    nodes: Iterable[NodeInfo],
    reservations: Iterable[ReservationInfo],
    previous_pools: Mapping[int, str] | None = None,
    inventory: PoolIndex | None = None,
) -> SlicePlan:
    """Decide claims, releases and frees for one TPUSliceCluster from a snapshot.

    ``inventory``, when given, is ``pool_index(nodes, accelerator, topology)`` built
    earlier from the same nodes; ``nodes`` is then not read.
    """
    wanted = _Wanted(accelerator, topology, hosts, chips_per_host)
    replicas, unindexed = _group_replicas(pods, hosts)
    all_reservations = list(reservations)
    ours = {r.holder.replica_name: r for r in all_reservations if r.holder.uid == cluster.uid}
    held_by_others = {r.pool: r.holder for r in all_reservations if r.holder.uid != cluster.uid}
    held_by_ours = {r.pool: r.holder for r in ours.values()}
    inventory = inventory or pool_index(nodes, accelerator, topology)
    pools, matching = inventory.pools, inventory.matching
    previous_pools = previous_pools or {}

    frees = tuple(sorted(r.pool for name, r in ours.items() if name not in replicas))
    claims: list[Claim] = []
    releases: list[PodRelease] = []
    binds: list[str] = []
    taken_now: set[str] = set()
    by_index: dict[int, SliceStatus] = {}

    def status_for(replica: _Replica, status: SliceStatus) -> None:
        if replica.index is None:
            return
        current = by_index.get(replica.index)
        # a replica being torn down never hides the one KubeRay created to replace it
        if current is None or current.state == SliceState.RELEASING:
            by_index[replica.index] = status

    ordered = sorted(
        replicas.values(), key=lambda r: (r.index if r.index is not None else 1 << 30, r.name)
    )
    for replica in ordered:
        index = replica.index if replica.index is not None else -1
        live = replica.live
        reservation = ours.get(replica.name)
        pool = reservation.pool if reservation else None
        if not live:
            status_for(
                replica,
                SliceStatus(
                    index,
                    SliceState.RELEASING,
                    replica.name,
                    pool,
                    message="pods terminating; the pool stays held until they are gone"
                    if pool
                    else "pods terminating",
                ),
            )
            continue
        if not gated and reservation is None:
            state, ready = _live_state(replica, None, hosts)
            if len(live) < hosts:
                state = SliceState.PENDING
            status_for(replica, SliceStatus(index, state, replica.name, None, ready))
            continue
        if reservation is None:
            pool = _choose_pool(
                replica,
                index,
                matching,
                wanted,
                held_by_others,
                held_by_ours,
                taken_now,
                previous_pools,
            )
            if pool is None:
                message = _capacity_message(
                    wanted, matching, {**held_by_others, **held_by_ours}, taken_now
                )
                status_for(
                    replica,
                    SliceStatus(
                        index, SliceState.WAITING_FOR_CAPACITY, replica.name, None, 0, message
                    ),
                )
                continue
            taken_now.add(pool)
            claims.append(
                Claim(
                    pool,
                    Holder(
                        cluster.namespace, cluster.name, cluster.uid, replica.name, replica.index
                    ),
                )
            )
        assert pool is not None
        complete = len(live) == hosts
        if complete:
            releases += [
                PodRelease(p.namespace, p.name, pool, replica.name) for p in live if p.gated
            ]
        state, ready = _live_state(replica, pool, hosts)
        message = ""
        terminating = len(replica.pods) - len(live)
        if not complete and terminating:
            # KubeRay replaces a multi-host replica only once its deleted pods are gone; a
            # pod on a dead node stays until the node returns or is removed.
            message = (
                f"{len(live)} of {hosts} pods live, {terminating} terminating; the pool "
                f"stays held until KubeRay has replaced them"
            )
            if pool in pools and (problem := _pool_problem(pools[pool], wanted)):
                message += f" (node pool {pool} {problem})"
        elif not complete:
            message = f"{len(live)} of {hosts} pods created; released when all exist"
        elif pool in pools and (problem := _pool_problem(pools[pool], wanted)):
            message = f"node pool {pool} {problem}"
        elif pool not in pools:
            message = f"node pool {pool} has no nodes"
        if (
            state in (SliceState.SCHEDULED, SliceState.READY)
            and reservation is not None
            and (reservation.phase != "Bound")
        ):
            binds.append(pool)
        status_for(replica, SliceStatus(index, state, replica.name, pool, ready, message))

    # KubeRay picks which replica to remove on scale-down, so the live replicas need
    # not hold indices 0..n-1: report them all, plus a Pending entry per missing one.
    live_count = sum(1 for s in by_index.values() if s.state != SliceState.RELEASING)
    free_indices = (i for i in range(desired_slices + len(by_index)) if i not in by_index)
    missing = [
        SliceStatus(
            next(free_indices),
            SliceState.PENDING,
            message="waiting for KubeRay to create the slice's pods",
        )
        for _ in range(max(0, desired_slices - live_count))
    ]
    slices = tuple(sorted([*by_index.values(), *missing], key=lambda s: s.index))
    return SlicePlan(
        claims=tuple(claims),
        releases=tuple(releases),
        frees=frees,
        binds=tuple(binds),
        slices=slices,
        unindexed_pods=tuple(sorted(unindexed)),
    )


def _choose_pool(
    replica: _Replica,
    index: int,
    matching: Mapping[str, Sequence[NodeInfo]],
    wanted: _Wanted,
    held_by_others: Mapping[str, Holder],
    held_by_ours: Mapping[str, Holder],
    taken_now: set[str],
    previous_pools: Mapping[int, str],
) -> str | None:
    """A free, healthy, whole pool; prefer where the pods are already pinned, then the
    pool this replica index held before, then a stable (name) order."""
    free = [
        name
        for name, nodes in matching.items()
        if name not in held_by_others
        and name not in held_by_ours
        and name not in taken_now
        and _pool_problem(nodes, wanted) is None
    ]
    released = sorted({p.pinned_pool for p in replica.live if p.pinned_pool and not p.gated})
    if released:  # a released pod's nodeSelector can no longer change: only its pool will do
        return released[0] if released[0] in free else None
    previous = previous_pools.get(index)
    if previous in free:
        return previous
    return free[0] if free else None
