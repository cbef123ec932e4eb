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

import functools
import zlib
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from tpuslice.model.constants import (
    NODE_LABEL_HOSTNAME,
    NODE_LABEL_NODEPOOL,
    PLACEHOLDER_REPLICA_PREFIX,
)
from tpuslice.model.records import (
    Admission,
    CapacityType,
    CapacityUnit,
    Claim,
    ClusterRef,
    Drain,
    ForceDelete,
    GangMode,
    Handover,
    Holder,
    Move,
    NodeInfo,
    PodInfo,
    PodRelease,
    PoolRequest,
    ReservationInfo,
    Reservations,
    ShapePool,
    SlicePlan,
    SliceState,
    SliceStatus,
)
from tpuslice.planning.busy import busy_move, move_message
from tpuslice.planning.disruption import (
    drain_message,
    drain_signal,
    maintenance_message,
    scheduled_maintenance,
    stuck_pods,
)
from tpuslice.planning.elastic import plan_terms
from tpuslice.planning.kueue_tas import adopt, chosen_pools
from tpuslice.planning.nodeclass import (
    QUARANTINED,
    WantedShape,
    classify_pool,
    is_slicing_block,
)

__all__ = [
    "Placeholders",
    "PoolIndex",
    "ReplicaPods",
    "eligible_pools",
    "free_pools",
    "group_replicas",
    "handovers",
    "held_pin",
    "is_placeholder",
    "kept_frees",
    "live_state",
    "missing_slices",
    "placeholder_name",
    "placeholders",
    "plan_slices",
    "pool_facts",
    "pool_index",
    "pool_inventory",
    "pool_request",
    "prefer_pools",
    "quarantined_units",
    "shape_pools",
    "slice_holder",
]


#: What a slice needs from a node pool.
_Wanted = WantedShape


@dataclass
class ReplicaPods:
    """One slice's pods as KubeRay made them (a replica of the TPU group), by the replica
    name they share: the unit every per-slice plan (pools and dynamic slices) reads."""

    name: str
    index: int | None
    pods: list[PodInfo] = field(default_factory=list)

    @property
    def live(self) -> list[PodInfo]:
        return [p for p in self.pods if not p.deleting]


def _pool_problem(
    nodes: Sequence[NodeInfo], wanted: _Wanted, owned_slices: Collection[str] = ()
) -> str | None:
    """Why a pool with the right labels cannot hold the slice, or None if it can
    (nodeclass.classify_pool: a sub-block, someone's GKE Slice, the node count, health,
    chips)."""
    fit = classify_pool(nodes[0].pool if nodes else "", nodes, wanted, owned_slices)
    return None if fit.usable else fit.problem()


def pool_inventory(
    nodes: Iterable[NodeInfo], unit: CapacityUnit = CapacityUnit.NODE_POOL
) -> dict[str, list[NodeInfo]]:
    """The nodes of each unit, by the unit's name: by node pool, or each node on its own
    (a single-host pool holds as many single-host slices as it has nodes)."""
    pools: dict[str, list[NodeInfo]] = defaultdict(list)
    for node in nodes:
        pools[node.name if unit is CapacityUnit.NODE else node.pool].append(node)
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
    """The units of one shape: every unit by name, and those whose nodes all match. A
    unit is a node pool (a multi-host slice's), or one node (``unit`` Node: a single-host
    slice's); the planner calls both "pools", their names are unique in the cluster.

    Building it walks every node of the shape (4,000 at the design's scale), so the
    reconciler keeps one per shape until a node of that shape really changes,
    instead of rebuilding it in every pass.
    """

    pools: Mapping[str, Sequence[NodeInfo]]
    matching: Mapping[str, Sequence[NodeInfo]]
    #: pool_facts of every matching pool without holders, by (hosts, chips per host):
    #: they depend on the nodes alone, and the queue reads them in every pass.
    facts: dict[tuple[int, int], list[ShapePool]] = field(
        default_factory=dict, compare=False, repr=False
    )
    eligible: dict[tuple[int, int], frozenset[str]] = field(
        default_factory=dict, compare=False, repr=False
    )
    #: GKE Slices (cloud.google.com/gke-tpu-slice) whose nodes the operator may claim;
    #: a node in any other formed Slice makes its pool ineligible (nodeclass).
    owned_slices: frozenset[str] = frozenset()
    unit: CapacityUnit = CapacityUnit.NODE_POOL
    #: ``unit_problem`` by unit and wanted shape: it depends on the unit's nodes alone, so
    #: a narrowed index shares it. Every pass asks it of every unit of the shape (which
    #: are free, why not): kept, that walk classifies each node once per node change,
    #: not once per pass.
    problems: dict[tuple[str, WantedShape], str | None] = field(
        default_factory=dict, compare=False, repr=False
    )
    #: The units an object's placement keeps it from (``policy.placement``), by the
    #: placement's own key; over this index's units only, so not kept by a narrowed one.
    exclusions: dict[Any, frozenset[str]] = field(default_factory=dict, compare=False, repr=False)
    #: ``facts`` by unit name, by (hosts, chips per host).
    facts_by_name: dict[tuple[int, int], dict[str, ShapePool]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def unit_problem(self, name: str, wanted: WantedShape) -> str | None:
        """Why the unit ``name`` cannot hold a slice of ``wanted``, or None if it can
        (``_pool_problem`` over its nodes; a unit not in the index has no nodes)."""
        key = (name, wanted)
        if key not in self.problems:
            self.problems[key] = _pool_problem(self.pools.get(name, ()), wanted, self.owned_slices)
        return self.problems[key]

    def narrowed(self, keep: Callable[[str, Sequence[NodeInfo]], bool]) -> PoolIndex:
        """The index with only the matching units ``keep`` accepts (an object's
        constraints: capacity on demand, a policy's pools), with fresh caches: the facts
        of the whole index are not those of the narrowed one."""
        matching = {name: nodes for name, nodes in self.matching.items() if keep(name, nodes)}
        if len(matching) == len(self.matching):
            return self
        return replace(
            self, matching=matching, facts={}, eligible={}, exclusions={}, facts_by_name={}
        )

    def node_pool(self, unit_name: str) -> str | None:
        """The GKE node pool of a node unit (None for a node-pool unit, or one not known)."""
        if self.unit is not CapacityUnit.NODE:
            return None
        nodes = self.pools.get(unit_name)
        return nodes[0].pool if nodes else None


def pool_index(
    nodes: Iterable[NodeInfo],
    accelerator: str,
    topology: str,
    *,
    owned_slices: Collection[str] = (),
    unit: CapacityUnit = CapacityUnit.NODE_POOL,
) -> PoolIndex:
    pools = pool_inventory(nodes, unit)
    return PoolIndex(
        pools,
        _matching_pools(pools, accelerator, topology),
        owned_slices=frozenset(owned_slices),
        unit=unit,
    )


def pool_facts(
    name: str,
    nodes: Sequence[NodeInfo],
    *,
    hosts: int,
    chips_per_host: int,
    holder: Holder | None = None,
    owned_slices: Collection[str] = (),
) -> ShapePool:
    """What the queue and the preference need of one pool: eligible or not, who holds it,
    its capacity type and topology block (only when every node agrees on them).

    ``nodes`` are a pool of ``PoolIndex.matching`` (every node has the shape's labels), so
    the shape's accelerator and topology are those of its first node."""
    first = min(nodes, key=lambda n: n.name) if nodes else None
    blocks = {n.block for n in nodes}
    subblocks = {(n.block, n.subblock) for n in nodes}
    eligible = False
    if first is not None:
        wanted = _Wanted(first.accelerator, first.topology, hosts, chips_per_host)
        eligible = _pool_problem(nodes, wanted, owned_slices) is None
    return ShapePool(
        name=name,
        eligible=eligible,
        holder=holder,
        capacity_type=first.capacity_type if first else CapacityType.ON_DEMAND,
        block=blocks.pop() if len(blocks) == 1 else None,
        subblock=subblocks.pop()[1] if len(subblocks) == 1 else None,
        maintenance_at=scheduled_maintenance(nodes),
    )


def quarantined_units(inventory: PoolIndex) -> int:
    """How many units of the shape a disruption signal keeps from every claim (and drains
    the slice of): computed once per index, as the index is rebuilt when a node changes."""
    key = (-1, -1)
    if key not in inventory.eligible:
        names = frozenset(n for n, nodes in inventory.matching.items() if drain_signal(nodes))
        inventory.eligible[key] = names
    return len(inventory.eligible[key])


def eligible_pools(inventory: PoolIndex, *, hosts: int, chips_per_host: int) -> frozenset[str]:
    """Names of the shape's pools a slice could take if nobody held them."""
    key = (hosts, chips_per_host)
    names = inventory.eligible.get(key)
    if names is None:
        facts = shape_pools(inventory, (), hosts=hosts, chips_per_host=chips_per_host)
        names = inventory.eligible[key] = frozenset(f.name for f in facts if f.eligible)
    return names


def free_pools(
    inventory: PoolIndex,
    reservations: Iterable[ReservationInfo],
    *,
    hosts: int,
    chips_per_host: int,
) -> frozenset[str]:
    """The shape's pools a slice could take now: eligible and held by nobody (no queue
    order applied: what an object Kueue has not admitted yet may be told)."""
    held = {r.pool for r in reservations}
    return eligible_pools(inventory, hosts=hosts, chips_per_host=chips_per_host) - held


def shape_pools(
    inventory: PoolIndex,
    reservations: Iterable[ReservationInfo],
    *,
    hosts: int,
    chips_per_host: int,
) -> list[ShapePool]:
    """Every pool of the shape (``inventory.matching``), by name, with its holder."""
    facts = inventory.facts.get((hosts, chips_per_host))
    if facts is None:
        facts = [
            pool_facts(
                name,
                nodes,
                hosts=hosts,
                chips_per_host=chips_per_host,
                owned_slices=inventory.owned_slices,
            )
            for name, nodes in sorted(inventory.matching.items())
        ]
        inventory.facts[(hosts, chips_per_host)] = facts
    held = {r.pool: r.holder for r in reservations}
    if not held:
        return list(facts)
    return [replace(f, holder=held[f.name]) if f.name in held else f for f in facts]


def unit_facts(inventory: PoolIndex, name: str, *, hosts: int, chips_per_host: int) -> ShapePool:
    """``pool_facts`` of one unit of the index, held by nobody: from the index's facts
    (built once per index) when the unit matches the shape, else from its nodes."""
    key = (hosts, chips_per_host)
    by_name = inventory.facts_by_name.get(key)
    if by_name is None:
        facts = shape_pools(inventory, (), hosts=hosts, chips_per_host=chips_per_host)
        by_name = inventory.facts_by_name[key] = {f.name: f for f in facts}
    found = by_name.get(name)
    if found is not None:
        return found
    return pool_facts(
        name,
        inventory.matching.get(name, ()),
        hosts=hosts,
        chips_per_host=chips_per_host,
        owned_slices=inventory.owned_slices,
    )


def _capacity_rank(capacity_types: Sequence[CapacityType]) -> Mapping[CapacityType, int]:
    return {t: i for i, t in enumerate(dict.fromkeys(capacity_types))}


def spread_rank(spread: str, pool: str) -> int:
    """The place of ``pool`` in the claim order of the claimant ``spread`` (its uid):
    rendezvous (highest-random-weight) hashing, so every claimant has its own stable
    order of the same pools. Claimants that plan at once on views that do not yet show
    each other's claims then rarely pick the same pool, where a common order (by name)
    sends all of them to the first free one: one wins, the rest lose the create and plan
    again, together, for the next (measured at 1,000 clusters: 37 lost claims per
    reservation made). A pool taken by someone else moves no other pool in the order."""
    return zlib.crc32(f"{spread}/{pool}".encode())


def prefer_pools(
    candidates: Sequence[ShapePool],
    count: int,
    *,
    previous: Collection[str] = (),
    capacity_types: Sequence[CapacityType] = (),
    together: bool = False,
    anchor: Sequence[ShapePool] = (),
    by_name: bool = False,
    spread: str = "",
    maintenance_before: int | None = None,
) -> list[ShapePool]:
    """Up to ``count`` of ``candidates`` in the order of preference:

    (a) pools the slices held before (``previous``); then, for the rest,
    (b) when ``together`` (a multislice gang), pools of one
        ``cloud.google.com/gce-topology-subblock``, else of one
        ``cloud.google.com/gce-topology-block``, that can hold all of them, preferring
        the (sub-)block of ``anchor`` (the pools the gang holds already);
    (c) the user's ``capacity_types`` order (types not listed come after the listed);
    (c') for a multislice gang (``together``) whose pools must include some with
        maintenance soon, those of one window when enough exist (``_lined_up``), also
        inside the (sub-)block of (b), which prefers, after the anchor's, the
        (sub-)block whose pools span the fewest maintenance windows;
    (d) with ``spread`` (the claimant's uid, when no queue decides who takes which
        pool), the claimant's own order of the pools (``spread_rank``); else, and to
        break a tie, the pool name.
    Before (b)-(d): with ``maintenance_before`` (Unix s, spec.disruption
    .avoidMaintenanceWithin from now), pools with maintenance scheduled before it rank
    after all others, the latest maintenance first (a window costs the slice a restart;
    a later one costs it later). Pure and stable: the same input gives the same pools
    in the same order.
    ``by_name``: the candidates are already in name order (the queue keeps them so); with
    no preference to apply, the first ``count`` are the answer without sorting.
    """

    def soon(p: ShapePool) -> bool:
        return (
            maintenance_before is not None
            and p.maintenance_at is not None
            and p.maintenance_at < maintenance_before
        )

    if (
        by_name
        and not any(soon(p) for p in candidates)
        and not spread
        and not capacity_types
        and not together
        and not (previous and any(p.name in previous for p in candidates))
    ):
        return list(candidates[:count])
    rank = _capacity_rank(capacity_types)

    def key(p: ShapePool) -> tuple[int, int, int, int, str]:
        late = soon(p)
        return (
            int(late),
            -(p.maintenance_at or 0) if late else 0,
            rank.get(p.capacity_type, len(rank)),
            spread_rank(spread, p.name) if spread else 0,
            p.name,
        )

    left = sorted(candidates, key=lambda p: p.name)
    chosen = [p for p in left if p.name in previous][:count]
    left = [p for p in left if p not in chosen]
    k = count - len(chosen)
    if k <= 0:
        return chosen
    if together:
        placed = [*anchor, *chosen]
        for level in ("subblock", "block"):

            def domain(p: ShapePool, level: str = level) -> tuple[str | None, str | None]:
                return (p.block, p.subblock) if level == "subblock" else (p.block, None)

            groups: dict[tuple[str | None, str | None], list[ShapePool]] = {}
            for p in left:
                if p.block is not None and (level == "block" or p.subblock is not None):
                    groups.setdefault(domain(p), []).append(p)
            home = {domain(p) for p in placed}
            # inside a (sub-)block too, the pools with maintenance soon come from one
            # window when it has enough; among (sub-)blocks that can hold the gang, the
            # one whose pools span the fewest windows costs the job the fewest restarts
            fits = {
                g: _lined_up(sorted(ps, key=key)[:k], ps, key, soon)
                for g, ps in groups.items()
                if len(ps) >= k
            }
            if fits:
                best = min(
                    fits,
                    key=lambda g: (
                        g not in home,
                        len({p.maintenance_at for p in fits[g] if soon(p)}),
                        sorted(key(p) for p in fits[g]),
                        str(g),
                    ),
                )
                return chosen + fits[best]
    picked = sorted(left, key=key)[:k]
    if together:
        picked = _lined_up(picked, left, key, soon)
    return chosen + picked


def _lined_up(
    picked: list[ShapePool],
    left: Sequence[ShapePool],
    key: Callable[[ShapePool], Any],
    soon: Callable[[ShapePool], bool],
) -> list[ShapePool]:
    """A multislice gang's pools with maintenance soon, all of one window when the free
    pools allow: one window then costs the job one restart, not one per window. The
    pools without maintenance soon stay; the rest come from the latest window that has
    enough pools (else ``picked`` as is)."""
    late = [p for p in picked if soon(p)]
    if len({p.maintenance_at for p in late}) <= 1:
        return picked
    windows: dict[int | None, list[ShapePool]] = defaultdict(list)
    for p in sorted(left, key=key):
        if soon(p):
            windows[p.maintenance_at].append(p)
    fits = [at for at, ps in windows.items() if len(ps) >= len(late)]
    if not fits:
        return picked
    best = max(fits, key=lambda at: at or 0)
    return [p for p in picked if not soon(p)] + windows[best][: len(late)]


#: Matching pools a WaitingForCapacity message names (the rest are counted): the message
#: is repeated on every waiting slice, and a shape may have hundreds of pools.
CAPACITY_POOLS_LISTED = 5


def _capacity_message(
    wanted: _Wanted,
    inventory: PoolIndex,
    held: Mapping[str, Holder],
    taken_now: set[str],
    *,
    noun: str = "node pool",
) -> str:
    matching, units = inventory.matching, inventory.pools
    head = f"needs a free {noun} of {wanted.describe()}"
    if not matching:
        return f"{head}; no {noun} matches{_slicing_blocks(units or {}, matching)}"
    details: list[str] = []
    for name in matching:
        if len(details) == CAPACITY_POOLS_LISTED:
            break
        if name in held:
            details.append(f"{name} held by {held[name].describe()}")
        elif name in taken_now:
            details.append(f"{name} taken by another slice of this cluster")
        elif problem := inventory.unit_problem(name, wanted):
            details.append(f"{name} {problem}")
    count = len(matching)
    more = f", and {count - len(details)} more" if count > len(details) else ""
    blocks = _slicing_blocks(units or {}, matching)
    return f"{head}; {count} match: " + ", ".join(details) + more + blocks


def _slicing_blocks(
    units: Mapping[str, Sequence[NodeInfo]], matching: Mapping[str, Sequence[NodeInfo]]
) -> str:
    """``; pool-x is a dynamic-slicing sub-block ...`` for pools of the accelerator that no
    topology matches because no GKE Slice has formed on them yet (their nodes carry no
    cloud.google.com/gke-tpu-topology until one does), so a user sees why they are not
    used; empty when there are none."""
    names = sorted(
        {
            nodes[0].pool
            for name, nodes in units.items()
            if name not in matching and nodes and all(is_slicing_block(n) for n in nodes)
        }
    )
    if not names:
        return ""
    shown = ", ".join(names[:CAPACITY_POOLS_LISTED])
    more = (
        f" and {len(names) - CAPACITY_POOLS_LISTED} more"
        if len(names) > CAPACITY_POOLS_LISTED
        else ""
    )
    verb = "is a dynamic-slicing sub-block" if len(names) == 1 else "are dynamic-slicing sub-blocks"
    return (
        f"; {shown}{more} {verb} (PROVISION_ONLY): no pod can run on it until a GKE Slice "
        "forms on it, and a Slice's nodes belong to whoever made it"
    )


def _unfit_pools(wanted: _Wanted, inventory: PoolIndex, held: Mapping[str, Holder]) -> str:
    """Why matching pools nobody holds are not eligible (the queue's message names the
    holders): ``not eligible: pool-c 4 nodes cordoned``, and the accelerator's
    dynamic-slicing sub-blocks; empty when all are fine. A unit kept out for a GKE
    disruption signal is named first: the list is cut after a few, and that is the one
    reason the operator itself imposes (and that clears by itself)."""
    details = []
    for name in inventory.matching:
        if name not in held and (problem := inventory.unit_problem(name, wanted)):
            details.append(f"{name} {problem}")
    details.sort(key=lambda detail: QUARANTINED not in detail)
    blocks = _slicing_blocks(inventory.pools, inventory.matching).removeprefix("; ")
    if not details:
        return blocks
    shown = details[:CAPACITY_POOLS_LISTED]
    more = f", and {len(details) - len(shown)} more" if len(details) > len(shown) else ""
    return "not eligible: " + ", ".join(shown) + more + (f"; {blocks}" if blocks else "")


def group_replicas(pods: Iterable[PodInfo], hosts: int) -> tuple[dict[str, ReplicaPods], list[str]]:
    """Pods by slice. KubeRay labels replica name and host index only for multi-host
    groups; a single-host slice is one pod, so the pod's own name names the slice."""
    replicas: dict[str, ReplicaPods] = {}
    unindexed: list[str] = []
    for pod in pods:
        name = pod.slice_name(hosts)
        if name is None:
            if not pod.deleting:
                unindexed.append(pod.name)
            continue
        replica = replicas.setdefault(name, ReplicaPods(name, None))
        if pod.replica_index is not None:
            replica.index = pod.replica_index
        replica.pods.append(pod)
    return replicas, unindexed


def placeholder_name(index: int) -> str:
    """The replicaName a reservation claimed for replica ``index`` before its pods exist
    carries (``PLACEHOLDER_REPLICA_PREFIX``): never a name KubeRay gives a replica."""
    return f"{PLACEHOLDER_REPLICA_PREFIX}{index}"


def is_placeholder(replica_name: str | None) -> bool:
    return bool(replica_name) and str(replica_name).startswith(PLACEHOLDER_REPLICA_PREFIX)


@dataclass(frozen=True)
class Placeholders:
    """A pinned slice set's replica indexes without pods (pin at admission): those held
    by a placeholder reservation (by index), and those that want a unit now."""

    held: Mapping[int, ReservationInfo] = field(default_factory=dict)
    missing: tuple[int, ...] = ()


def placeholders(
    ours: Iterable[ReservationInfo], replicas: Mapping[str, ReplicaPods], desired: int
) -> Placeholders:
    """``held``: the set's placeholder reservations of an index below ``desired`` (the
    others are freed); ``missing``: the indexes below ``desired`` that no live replica
    has and no reservation of the set names (a unit being freed or kept for the index
    counts: never two units for one index), lowest first, and only as many as keep the
    set's live slices and units at most ``desired``: KubeRay picks which replica a
    scale-down removes, so a live replica may hold an index at or above the count."""
    mine = list(ours)
    held = {
        r.holder.replica_index: r
        for r in sorted(mine, key=lambda r: r.pool)
        if is_placeholder(r.holder.replica_name)
        and r.holder.replica_index is not None
        and 0 <= r.holder.replica_index < desired
    }
    live = [r for r in replicas.values() if r.live]
    holding = {r.holder.replica_name for r in mine}
    # a live replica about to take a placeholder over is counted once, by its unit
    taking = sum(1 for r in live if r.name not in holding and r.index in held)
    unit_only = sum(1 for r in mine if r.holder.replica_name not in {x.name for x in live})
    room = max(0, desired - (len(live) - taking) - unit_only)
    named = {r.holder.replica_index for r in mine} | {r.index for r in live}
    missing = tuple(i for i in range(desired) if i not in named)[:room]
    return Placeholders(held, missing)


def slice_holder(cluster: ClusterRef, replica: ReplicaPods) -> Holder:
    """The holder a claim for ``replica``'s slice names: the object, the slice and, for a
    service, its RayCluster and the TPU group."""
    return Holder(
        cluster.namespace,
        cluster.name,
        cluster.uid,
        replica.name,
        replica.index,
        kind=cluster.kind,
        ray_cluster=cluster.ray_cluster,
        group=cluster.group,
    )


def live_state(replica: ReplicaPods, pool: str | None, hosts: int) -> tuple[SliceState, int]:
    """Where a held slice stands from its pods alone (Ready, Scheduled or Reserved) and
    how many of its hosts are ready on ``pool`` (any pool when None)."""
    live = replica.live
    ready = sum(1 for p in live if p.running_ready and (pool is None or p.pinned_pool == pool))
    if len(live) == hosts and ready == hosts:
        return SliceState.READY, ready
    if len(live) == hosts and not any(p.gated for p in live):
        return SliceState.SCHEDULED, ready
    return SliceState.RESERVED, ready


def missing_slices(by_index: Mapping[int, SliceStatus], desired_slices: int) -> list[SliceStatus]:
    """A Pending entry per slice KubeRay has not made yet, on the indices no live slice
    holds. KubeRay picks which replica to remove on scale-down, so the live replicas need
    not hold indices 0..n-1: they are reported as they are, and the missing ones fill
    the free indices."""
    live_count = sum(1 for s in by_index.values() if s.state != SliceState.RELEASING)
    free_indices = (i for i in range(desired_slices + len(by_index)) if i not in by_index)
    return [
        SliceStatus(
            next(free_indices),
            SliceState.PENDING,
            message="waiting for KubeRay to create the slice's pods",
        )
        for _ in range(max(0, desired_slices - live_count))
    ]


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
    gang: GangMode = GangMode.PER_SLICE,
    admission: Admission | None = None,
    capacity_types: Sequence[CapacityType] = (),
    now: datetime | None = None,
    minimum: int | None = None,
    maintenance_before: int | None = None,
    grace_seconds: int = 30,
    kueue_pools: bool = False,
    claim_ahead: bool = False,
) -> SlicePlan:
    """Decide claims, releases and frees for one TPUSliceCluster from a snapshot.

    ``inventory``, when given, is ``pool_index(nodes, accelerator, topology)`` built
    earlier from the same nodes; ``nodes`` is then not read.

    ``gang``: with ``PerSlice`` every slice claims a pool and is released on its own.
    With ``AllSlices`` the cluster holds pools for all ``desired_slices`` or releases
    nothing: it claims only when every missing slice has live pods (the replica names
    the reservations are keyed by) and there are enough pools for all of them in this
    pass, and then claims them all at once (``SlicePlan.all_or_nothing``: the releases
    stand only if every claim holds). A gang that cannot complete gives back (frees)
    the pools its not-yet-released slices hold when another request could use them:
    when ``admission.contended``, when another cluster holds a pool of the shape (a
    lost race), when it is stalled, or always without a queue (``admission`` None).
    Slices already released keep their pools (no preemption).

    ``admission`` is the shape queue's decision for this cluster (slicequeue.py): the
    pools it may claim now, its place in the queue and the text explaining the wait.
    None means no queue: any free eligible pool.

    ``minimum``: an elastic set's minimum (``planning.elastic``): the gang rule covers
    the minimum alone, and the slices above it claim one by one once it is held.
    ``maintenance_before`` (planning.disruption.maintenance_before): pools with
    maintenance scheduled before it are taken last (``prefer_pools``), and a slice on
    one says "maintenance at <time>".

    A slice holding a unit one of whose nodes is being terminated, maintained, NotReady
    or in an UNHEALTHY partition (``disruption.drain_signal``) is drained: all its live
    pods deleted together with ``grace_seconds`` (``SlicePlan.drains``), so Ray sees one
    slice go, not a torn one. A slice whose pods were never released gives the unit
    back instead (nothing ran there). The unit stays ineligible while the signal lasts.
    A slice whose pods all terminate but stay on a host that stopped answering is judged
    by ``disruption.stuck_pods`` (with ``now``): force-deleted when the host is gone or
    tainted out-of-service (``SlicePlan.force_deletes``), else status names the host.

    ``now`` (the clock, for single-host slices): a slice holding a node whose released
    pod could not schedule there for ``busy.BUSY_AFTER_SECONDS`` moves
    (``SlicePlan.moves``); without it nothing moves.

    ``kueue_pools``: Kueue's topology-aware scheduling chose each slice's node pool
    (``SliceClusterSpec.kueue_picks_pools``): a slice claims only the pool its pods'
    nodeSelector names, or waits saying why (``kueue_tas.adopt``).

    ``claim_ahead`` (pin at admission, ``planning.pinning``): every replica index below
    ``desired_slices`` that no live replica has and no reservation names wants a unit
    now, before KubeRay makes its pods, as a slice with pods would (the same
    admission, gang rule and preference); it is claimed for a placeholder replica
    (``placeholder_name``), kept while the index is below ``desired_slices`` and
    taken over by the index's replica once it exists (``pinning.pin_rekeys``). A live
    replica of an index a placeholder holds never claims a unit of its own.
    """
    wanted = _Wanted(accelerator, topology, hosts, chips_per_host)
    replicas, unindexed = group_replicas(pods, hosts)
    shown = Reservations.of(reservations)  # read twice: own first, the rest if needed
    ours = {r.holder.replica_name: r for r in cluster.own(shown)}
    held_by_ours = {r.pool: r.holder for r in ours.values()}
    unit = CapacityUnit.for_hosts(hosts)
    inventory = inventory or pool_index(nodes, accelerator, topology, unit=unit)
    noun = inventory.unit.noun
    pools, matching = inventory.pools, inventory.matching
    previous_pools = previous_pools or {}
    all_slices = gang == GangMode.ALL_SLICES
    stalled = admission.stalled if admission is not None else None

    # Who holds the shape's other units, and which are free, are read only when a slice
    # claims or waits: a pass with nothing to claim reads its own reservations alone.
    @functools.cache
    def others() -> dict[str, Holder]:
        return {r.pool: r.holder for r in shown if not cluster.holds(r.holder)}

    @functools.cache
    def free() -> list[str]:
        held_by_others = others()
        units = [
            name
            for name in matching
            if name not in held_by_others
            and name not in held_by_ours
            and inventory.unit_problem(name, wanted) is None
        ]
        if admission is not None and admission.pools is not None:
            allowed = set(admission.pools)
            return [name for name in units if name in allowed]
        return units

    ahead = (
        placeholders(ours.values(), replicas, desired_slices)
        if claim_ahead and gated and not kueue_pools
        else Placeholders()
    )
    kept = {r.pool for r in ahead.held.values()}
    frees = sorted(
        r.pool for name, r in ours.items() if name not in replicas and r.pool not in kept
    )
    claims: list[Claim] = []
    releases: list[PodRelease] = []
    binds: list[str] = []
    moves: list[Move] = []
    drains: list[Drain] = []
    force_deletes: list[ForceDelete] = []
    nodes_by_name: dict[str, NodeInfo] | None = None  # built for a slice whose pods all go
    recheck_in: float | None = None
    taken_now: set[str] = set()
    by_index: dict[int, SliceStatus] = {}

    def facts(pool: str) -> ShapePool:
        return unit_facts(inventory, pool, hosts=hosts, chips_per_host=chips_per_host)

    def capacity_of(pool: str | None) -> CapacityType | None:
        nodes_of = pools.get(pool or "")
        return min(nodes_of, key=lambda n: n.name).capacity_type if nodes_of else None

    def status_for(replica: ReplicaPods, status: SliceStatus) -> None:
        if replica.index is None:
            return
        current = by_index.get(replica.index)
        # a replica being torn down never hides the one KubeRay created to replace it
        if current is None or current.state == SliceState.RELEASING:
            by_index[replica.index] = status

    ordered = sorted(
        replicas.values(), key=lambda r: (r.index if r.index is not None else 1 << 30, r.name)
    )
    live = [r for r in ordered if r.live]
    # a replica of an index a placeholder holds takes that reservation over (rekey)
    taking = {
        r.name: ahead.held[r.index]
        for r in live
        if r.name not in ours and r.index is not None and r.index in ahead.held
    }
    unheld = [r for r in live if r.name not in ours and r.name not in taking]
    ahead_replicas = [ReplicaPods(placeholder_name(i), i) for i in ahead.missing]
    live_indexes = {r.index for r in live}

    # ---- which pools to claim, for which slices
    assignment: dict[str, str] = {}  # replica name -> pool to claim now
    holding = [r for r in live if r.name in ours]
    if minimum is not None:
        terms = plan_terms(gang, desired_slices, len(holding), minimum)
        all_slices = terms.gang == GangMode.ALL_SLICES
        if all_slices:
            desired_slices = terms.desired
    claimants = sorted(
        [*unheld, *ahead_replicas],
        key=lambda r: (r.index if r.index is not None else 1 << 30, r.name),
    )
    held_count = len(holding) + len(ahead.held)
    need = max(0, desired_slices - held_count) if all_slices else len(claimants)
    gang_ready = len(claimants) >= need
    kueue_waits: dict[str, str] = {}
    if gated and not (stalled and all_slices):
        wanting = claimants[:need] if all_slices else claimants
        if not wanting:
            pass  # nothing to claim: neither the free units nor their holders are read
        elif kueue_pools:
            assignment, kueue_waits = adopt(
                [(r.name, r.live) for r in wanting],
                free(),
                matching=matching,
                held_by_others=others(),
                held_by_ours=held_by_ours,
                problem=lambda pool: inventory.unit_problem(pool, wanted),
                granted=admission.pools if admission is not None else None,
                queue_message=admission.message if admission is not None else "",
                noun=noun,
            )
        else:
            assignment = _assign(
                wanting,
                free(),
                facts=facts,
                previous=previous_pools,
                capacity_types=capacity_types,
                together=all_slices and desired_slices > 1,
                anchor=[
                    facts(r.pool) for r in [*(ours[h.name] for h in holding), *ahead.held.values()]
                ],
                # no queue decision names the pools: spread the claims of clusters that
                # plan at once (a queue's grant is already this cluster's own pools)
                spread=cluster.uid if admission is None or admission.pools is None else "",
                maintenance_before=maintenance_before,
            )
        if stalled:  # NotEnoughPools: keep what it has, take no more (Kueue's waits stay)
            assignment = {}
        if all_slices and not (gang_ready and len(assignment) == need):
            assignment = {}  # a gang claims every slice it misses at once, or none
    gang_complete = not all_slices or held_count + len(assignment) >= desired_slices
    give_back: set[str] = set()
    if all_slices and gated and not gang_complete:
        contended = (
            admission is None
            or admission.contended
            or bool(admission.stalled)
            or any(p in others() for p in matching)
        )
        if contended:
            give_back = {
                r.name
                for r in holding
                if all(p.gated for p in r.live) and not any(p.pinned_pool for p in r.live)
            }
            frees = sorted({*frees, *(ours[name].pool for name in give_back)})
            # a placeholder's unit too, unless a pod of its index is already pinned there
            pinned_there = {p.pinned_pool for r in live for p in r.live if p.pinned_pool}
            frees = sorted(
                {*frees, *(r.pool for r in ahead.held.values() if r.pool not in pinned_there)}
            )

    def waiting_message() -> str:
        if stalled:
            return stalled
        if admission is not None and admission.message:
            unfit = _unfit_pools(wanted, inventory, {**others(), **held_by_ours})
            return f"{admission.message}; {unfit}" if unfit else admission.message
        if all_slices and not gang_ready:
            return (
                f"waiting for the pods of every slice before claiming {desired_slices} "
                f"{noun}s at once ({len(live)} of {desired_slices} slices have pods)"
            )
        detail = _capacity_message(
            wanted,
            inventory,
            {**others(), **held_by_ours},
            set(assignment.values()),
            noun=noun,
        )
        if all_slices:
            return (
                f"all {desired_slices} slices need a {noun} at once ({len(holding)} "
                f"held, {len(free())} free): {detail}"
            )
        return detail

    for replica in ordered:
        index = replica.index if replica.index is not None else -1
        live_pods = replica.live
        reservation = ours.get(replica.name)
        pool = reservation.pool if reservation else None
        if not live_pods:
            if nodes_by_name is None:
                nodes_by_name = {n.name: n for n in nodes}
            stuck = stuck_pods(replica.pods, nodes_by_name, now)
            force_deletes += stuck.force
            if stuck.recheck_in is not None:
                recheck_in = (
                    stuck.recheck_in if recheck_in is None else min(recheck_in, stuck.recheck_in)
                )
            message = "pods terminating; the pool stays held until they are gone"
            if stuck.message:
                message = f"pods terminating: {stuck.message}"
            elif stuck.force:
                first = stuck.force[0]
                message = (
                    f"pods terminating: node {first.node} {first.why}; its pods are "
                    "force-deleted (grace 0) so KubeRay can replace the slice"
                )
            elif not pool:
                message = "pods terminating"
            status_for(
                replica,
                SliceStatus(
                    index,
                    SliceState.RELEASING,
                    replica.name,
                    pool,
                    message=message,
                    capacity_type=capacity_of(pool),
                ),
            )
            continue
        if not gated and reservation is None:
            state, ready = live_state(replica, None, hosts)
            if len(live_pods) < hosts:
                state = SliceState.PENDING
            status_for(replica, SliceStatus(index, state, replica.name, None, ready))
            continue
        if reservation is None and replica.name in taking:
            pool = taking[replica.name].pool
            status_for(
                replica,
                SliceStatus(
                    index,
                    SliceState.RESERVED,
                    replica.name,
                    pool,
                    0,
                    f"takes over {noun} {pool}, held for slice {index} before its pods existed",
                    capacity_of(pool),
                ),
            )
            continue
        if reservation is None:
            pool = assignment.get(replica.name)
            if pool is None:
                status_for(
                    replica,
                    SliceStatus(
                        index,
                        SliceState.WAITING_FOR_CAPACITY,
                        replica.name,
                        None,
                        0,
                        kueue_waits.get(replica.name) or waiting_message(),
                    ),
                )
                continue
            taken_now.add(pool)
            claims.append(Claim(pool, slice_holder(cluster, replica)))
        assert pool is not None
        signal = drain_signal(pools[pool]) if reservation is not None and pool in pools else None
        if signal is not None and all(p.gated for p in live_pods):
            frees = sorted({*frees, pool})
            status_for(
                replica,
                SliceStatus(
                    index,
                    SliceState.WAITING_FOR_CAPACITY,
                    replica.name,
                    None,
                    message=f"gave {noun} {pool} back before its pods ran: node "
                    f"{signal.node} {signal.describe()}",
                ),
            )
            continue
        if signal is not None:
            drains.append(
                Drain(
                    pool,
                    replica.name,
                    index,
                    tuple((p.namespace, p.name) for p in live_pods),
                    signal.node,
                    signal.describe(),
                    str(signal.reason),
                    grace_seconds,
                )
            )
            status_for(
                replica,
                SliceStatus(
                    index,
                    SliceState.RELEASING,
                    replica.name,
                    pool,
                    message=drain_message(
                        noun, pool, signal.node, signal.describe(), grace_seconds
                    ),
                    capacity_type=capacity_of(pool),
                ),
            )
            continue
        if reservation is not None and now is not None and inventory.unit is CapacityUnit.NODE:
            node = next(iter(inventory.pools.get(pool) or ()), None)
            move, due = busy_move(pool, replica.name, live_pods, now, node)
            if due is not None:
                recheck_in = due if recheck_in is None else min(recheck_in, due)
            if move is not None:
                moves.append(move)
                status_for(
                    replica,
                    SliceStatus(
                        index,
                        SliceState.RELEASING,
                        replica.name,
                        pool,
                        message=move_message(move),
                        capacity_type=capacity_of(pool),
                    ),
                )
                continue
        complete = len(live_pods) == hosts
        if complete and gang_complete:
            releases += [
                PodRelease(p.namespace, p.name, pool, replica.name, inventory.unit)
                for p in live_pods
                if p.gated
            ]
        state, ready = live_state(replica, pool, hosts)
        message = ""
        terminating = len(replica.pods) - len(live_pods)
        if replica.name in give_back:
            message = f"giving {noun} {pool} back: {waiting_message()}"
        elif not gang_complete and any(p.gated for p in live_pods):
            message = (
                f"holds {noun} {pool}; released when all {desired_slices} slices hold "
                f"one ({len(holding)} do): {waiting_message()}"
            )
        elif not complete and terminating:
            # KubeRay replaces a multi-host replica only once its deleted pods are gone; a
            # pod on a dead node stays until the node returns or is removed.
            message = (
                f"{len(live_pods)} of {hosts} pods live, {terminating} terminating; the pool "
                f"stays held until KubeRay has replaced them"
            )
            if pool in pools and (problem := inventory.unit_problem(pool, wanted)):
                message += f" ({noun} {pool} {problem})"
        elif not complete:
            message = f"{len(live_pods)} of {hosts} pods created; released when all exist"
        elif pool in pools and (problem := inventory.unit_problem(pool, wanted)):
            message = f"{noun} {pool} {problem}"
        elif pool not in pools:
            message = f"{noun} {pool} is gone" if noun == "node" else f"{noun} {pool} has no nodes"
        elif (at := scheduled_maintenance(pools[pool])) is not None:
            message = f"{noun} {pool}: {maintenance_message(at)}"
        if (
            state in (SliceState.SCHEDULED, SliceState.READY)
            and reservation is not None
            and (reservation.phase != "Bound")
        ):
            binds.append(pool)
        status_for(
            replica,
            SliceStatus(index, state, replica.name, pool, ready, message, capacity_of(pool)),
        )

    ahead_claims, drained_ahead = _ahead_slices(
        ahead,
        ahead_replicas,
        cluster,
        assignment=assignment,
        live_indexes=live_indexes,
        frees=frees,
        pools=pools,
        noun=noun,
        gang_short=None if gang_complete else (desired_slices, held_count),
        waiting_message=waiting_message,
        capacity_of=capacity_of,
        by_index=by_index,
    )
    claims += ahead_claims
    frees = sorted({*frees, *drained_ahead})
    missing = missing_slices(by_index, desired_slices)
    slices = tuple(sorted([*by_index.values(), *missing], key=lambda s: s.index))
    if inventory.unit is CapacityUnit.NODE:  # status names the node and its pool
        slices = tuple(
            replace(s, pool_of_node=inventory.node_pool(s.node_pool)) if s.node_pool else s
            for s in slices
        )
    return SlicePlan(
        claims=tuple(claims),
        releases=tuple(releases),
        frees=tuple(frees),
        binds=tuple(binds),
        slices=slices,
        unindexed_pods=tuple(sorted(unindexed)),
        all_or_nothing=all_slices and bool(claims),
        stalled=stalled,
        moves=tuple(moves),
        recheck_in=recheck_in,
        drains=tuple(drains),
        force_deletes=tuple(force_deletes),
    )


def _ahead_slices(
    ahead: Placeholders,
    wanting: Sequence[ReplicaPods],
    cluster: ClusterRef,
    *,
    assignment: Mapping[str, str],
    live_indexes: Collection[int | None],
    frees: Collection[str],
    pools: Mapping[str, Sequence[NodeInfo]],
    noun: str,
    gang_short: tuple[int, int] | None,
    waiting_message: Callable[[], str],
    capacity_of: Callable[[str | None], CapacityType | None],
    by_index: dict[int, SliceStatus],
) -> tuple[list[Claim], list[str]]:
    """The plan of the replica indexes without pods (``claim_ahead``): the claims of those
    the assignment gave a unit, each index's status (``by_index``: Reserved with its
    unit, honest that no pod exists yet; or waiting), and the placeholder units to give
    back because a disruption signal is on them (nothing ran there)."""
    claims: list[Claim] = []
    drained: list[str] = []
    wait = ""
    if gang_short is not None:
        desired, held = gang_short
        wait = f"; pinned once all {desired} slices hold one ({held} do)"
    for index, r in sorted(ahead.held.items()):
        if index in live_indexes:
            continue  # its replica exists: it reports the slice
        signal = drain_signal(pools[r.pool]) if r.pool in pools else None
        if signal is not None:
            drained.append(r.pool)
            message = (
                f"gave {noun} {r.pool} back before any pod: node {signal.node} {signal.describe()}"
            )
            by_index[index] = SliceStatus(index, SliceState.WAITING_FOR_CAPACITY, message=message)
            continue
        if r.pool in frees:
            message = f"giving {noun} {r.pool} back: {waiting_message()}"
            by_index[index] = SliceStatus(index, SliceState.WAITING_FOR_CAPACITY, message=message)
            continue
        by_index[index] = SliceStatus(
            index,
            SliceState.RESERVED,
            None,
            r.pool,
            0,
            f"holds {noun} {r.pool} before its pods exist: KubeRay's pods of slice {index} "
            f"are pinned to it at admission{wait}",
            capacity_of(r.pool),
        )
    for replica in wanting:
        index = replica.index if replica.index is not None else -1
        pool = assignment.get(replica.name)
        if pool is None:
            by_index[index] = SliceStatus(
                index, SliceState.WAITING_FOR_CAPACITY, message=waiting_message()
            )
            continue
        claims.append(Claim(pool, slice_holder(cluster, replica)))
        by_index[index] = SliceStatus(
            index,
            SliceState.RESERVED,
            None,
            pool,
            0,
            f"holds {noun} {pool} before its pods exist: KubeRay's pods of slice {index} "
            f"are pinned to it at admission{wait}",
            capacity_of(pool),
        )
    return claims, drained


def _assign(
    replicas: Sequence[ReplicaPods],
    free: Sequence[str],
    *,
    facts: Callable[[str], ShapePool],
    previous: Mapping[int, str],
    capacity_types: Sequence[CapacityType],
    together: bool,
    anchor: Sequence[ShapePool],
    spread: str = "",
    maintenance_before: int | None = None,
) -> dict[str, str]:
    """Pools for ``replicas`` (in their order) among ``free``: a replica whose pods were
    released already can only go back to the pool they are pinned to (a released pod's
    nodeSelector can no longer change); the others by ``prefer_pools``, each first to
    the pool its index held before."""
    out: dict[str, str] = {}
    left = list(free)
    rest: list[ReplicaPods] = []
    for replica in replicas:
        released = sorted({p.pinned_pool for p in replica.live if p.pinned_pool and not p.gated})
        if released:
            if released[0] in left:
                out[replica.name] = released[0]
                left.remove(released[0])
        else:
            rest.append(replica)
    prev = {r.name: previous[r.index] for r in rest if r.index is not None and r.index in previous}
    picked = prefer_pools(
        [facts(name) for name in left],
        len(rest),
        previous=set(prev.values()),
        capacity_types=capacity_types,
        together=together,
        anchor=[*anchor, *(facts(p) for p in out.values())],
        spread=spread,
        maintenance_before=maintenance_before,
    )
    names = [p.name for p in picked]
    for replica in rest:  # first the index's previous pool, then the next preferred
        if prev.get(replica.name) in names:
            out[replica.name] = prev[replica.name]
            names.remove(prev[replica.name])
    for replica in rest:
        if replica.name not in out and names:
            out[replica.name] = names.pop(0)
    return out


def held_pin(
    worker_template: Mapping[str, Any], reservations: Iterable[ReservationInfo]
) -> str | None:
    """Why an ungated object (``reservation.policy: None``) may not run: its worker
    template's nodeSelector pins its pods onto a node pool (or node) that a
    SliceReservation holds for another slice, whose pods would then share chips with
    them. None when it pins nothing held. Only the nodeSelector is read: the label
    selectors of affinity are the scheduler's to judge."""
    spec = worker_template.get("spec")
    selector = spec.get("nodeSelector") if isinstance(spec, Mapping) else None
    if not isinstance(selector, Mapping):
        return None
    held = {r.pool: r.holder for r in reservations}
    for label in (NODE_LABEL_NODEPOOL, NODE_LABEL_HOSTNAME):
        unit = selector.get(label)
        if isinstance(unit, str) and unit in held:
            return (
                f"spec.worker.template.spec.nodeSelector pins {label}={unit}, which "
                f"{held[unit].describe()} holds (a SliceReservation); with reservation.policy "
                "None, pin a pool nobody holds, or use reservation.policy NodePool"
            )
    return None


def pool_request(
    cluster: ClusterRef,
    *,
    hosts: int,
    desired_slices: int,
    pods: Iterable[PodInfo],
    reservations: Iterable[ReservationInfo],
    gang: GangMode = GangMode.PER_SLICE,
    priority: int = 0,
    created: str = "",
    capacity_types: Sequence[CapacityType] = (),
    previous_pools: Mapping[int, str] | None = None,
    minimum: int | None = None,
    maintenance_before: int | None = None,
    kueue_pools: bool = False,
    claim_ahead: bool = False,
) -> PoolRequest:
    """The cluster's entry in its shape's queue, counted the way plan_slices counts:
    ``held`` = its reservations of live slices, ``claimable`` = live slices without
    one, ``idle`` = held pools whose slice has no pod released yet, ``live_pods`` = its
    pods not being deleted (those not yet labelled with a slice too: any pod proves the
    namespace's quota admitted it). The shell builds one per gated TSC of the shape,
    from its pods and reservations (the same snapshot). ``kueue_pools``: Kueue chose
    each slice's pool (``kueue_tas``): those pools, not the ones its slices held before,
    are the ones the queue sets aside for it first. ``claim_ahead`` (pin at admission,
    as ``plan_slices``): a placeholder's unit is held and idle, an index without pods
    and without a unit is claimable, and a live replica of an index a placeholder
    holds claims nothing (it takes that unit over)."""
    pods = list(pods)
    replicas, _ = group_replicas(pods, hosts)
    ours = {r.holder.replica_name: r for r in cluster.own(reservations)}
    live = [r for r in replicas.values() if r.live]
    holding = [r for r in live if r.name in ours]
    ahead = (
        placeholders(ours.values(), replicas, desired_slices)
        if claim_ahead and not kueue_pools
        else Placeholders()
    )
    taking = [r for r in live if r.name not in ours and r.index in ahead.held]
    held = len(holding) + len(ahead.held)
    terms = plan_terms(gang, desired_slices, held, minimum)
    return PoolRequest(
        key=cluster.queue_key,
        uid=cluster.uid,
        desired=terms.desired,
        held=held,
        claimable=len(live) - len(holding) - len(taking) + len(ahead.missing),
        gang=terms.gang,
        extra=terms.extra,
        priority=priority,
        created=created,
        idle=sum(1 for r in holding if all(p.gated for p in r.live)) + len(ahead.held),
        capacity_types=tuple(capacity_types),
        previous=(
            chosen_pools(r.live for r in live if r.name not in ours)
            if kueue_pools
            else tuple(sorted(set((previous_pools or {}).values())))
        ),
        live_pods=sum(1 for p in pods if not p.deleting),
        maintenance_before=maintenance_before,
    )


def handovers(
    cluster: ClusterRef,
    *,
    hosts: int,
    desired_slices: int,
    pods: Iterable[PodInfo],
    reservations: Iterable[ReservationInfo],
) -> tuple[Handover, ...]:
    """Pools a TPUSliceJob keeps between attempts, given to the new attempt's slices.

    A retry makes a new RayCluster whose slices have new replica names. Each pool the
    job holds for a slice with no pods left (the old attempt's, gone) goes to a live
    slice of the job that holds no pool and has released no pod: to the slice of the
    same replica index (the same pools for the same slices, so ``TPU_WORKER_ID`` order
    and topology stay as they were). A pool whose old index the new attempt will have
    (below ``desired_slices``) waits for that slice, even when another slice wants a
    pool now: KubeRay creates the slices one by one and the old attempt's pods go one
    by one, so handing it to whoever is first would swap the pools (seen in CI). Only
    pools of an index the new attempt has no slice for (or none recorded) go to the
    rest, in index order. What no slice takes now stays held for the next
    (``kept_frees``): a retry never waits in the queue for capacity it had."""
    replicas, _ = group_replicas(pods, hosts)
    ours = cluster.own_in_group(reservations)
    holding = {r.holder.replica_name for r in ours}
    idle = sorted(
        (r for r in ours if r.holder.replica_name not in replicas),
        key=lambda r: (
            r.holder.replica_index if r.holder.replica_index is not None else 1 << 30,
            r.pool,
        ),
    )
    wanting = sorted(
        (
            rep
            for rep in replicas.values()
            if rep.name not in holding
            and rep.live
            and all(p.gated and not p.pinned_pool for p in rep.live)
        ),
        key=lambda rep: (rep.index if rep.index is not None else 1 << 30, rep.name),
    )
    given: dict[str, ReplicaPods] = {}
    for rep in wanting:  # the same replica index first
        same = next(
            (r for r in idle if r.pool not in given and r.holder.replica_index == rep.index), None
        )
        if same is not None:
            given[same.pool] = rep
    rest = [rep for rep in wanting if rep not in given.values()]
    unclaimed = (
        r
        for r in idle
        if r.pool not in given
        and (r.holder.replica_index is None or r.holder.replica_index >= desired_slices)
    )
    for r, rep in zip(unclaimed, rest, strict=False):
        given[r.pool] = rep
    return tuple(
        Handover(
            pool,
            Holder(
                cluster.namespace,
                cluster.name,
                cluster.uid,
                rep.name,
                rep.index,
                kind=cluster.kind,
                group=cluster.group,
            ),
        )
        for pool, rep in sorted(given.items())
    )


def kept_frees(
    frees: Sequence[str],
    cluster: ClusterRef,
    *,
    desired_slices: int,
    reservations: Iterable[ReservationInfo],
) -> tuple[str, ...]:
    """Of the planner's ``frees``, those a job that keeps its pools still gives back: only
    what it holds beyond ``desired_slices`` (the pools of slices whose pods are gone stay
    held until the job ends; a gang's give-back does not apply to what it already had)."""
    held = len(cluster.own_in_group(reservations))
    excess = max(0, held - desired_slices)
    return tuple(sorted(frees)[:excess])
