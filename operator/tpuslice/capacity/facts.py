"""What capacity planning knows of each slice of one object, from the slice plan and the
snapshot: the input of ``capacity.plan``.

Pure: the executor (``controller/capacity.py``) reads the snapshot and the pool index and
passes plain values in, so the rule of which slices still wait for capacity (and which
of them may be served by a free pool instead of a request) is tested without the shell.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from tpuslice.capacity.plan import PoolNodes, fresh_pools
from tpuslice.capacity.requests import lapsed, slices_to_provision
from tpuslice.model import constants as c
from tpuslice.model.records import (
    CapacityUnit,
    ClusterRef,
    GangMode,
    PodInfo,
    ProvisioningMode,
    ProvisioningRequestInfo,
    ReservationInfo,
    SliceFacts,
    SlicePlan,
    SliceState,
)
from tpuslice.spec.parts import SliceClusterSpec

__all__ = ["one_extra_at_a_time", "pods_by_replica", "queued_capacity", "slice_facts"]


def pods_by_replica(pods: Iterable[PodInfo], hosts: int) -> dict[str, list[PodInfo]]:
    """The pods of each slice, by the name the planner gives it (``PodInfo.slice_name``:
    KubeRay's replica name, a single-host slice's pod name); pods of no slice left out."""
    out: dict[str, list[PodInfo]] = {}
    for pod in pods:
        name = pod.slice_name(hosts)
        if name:
            out.setdefault(name, []).append(pod)
    return out


def queued_capacity(
    free: Iterable[str],
    pool_nodes: PoolNodes,
    outstanding: Sequence[ProvisioningRequestInfo],
    unit: CapacityUnit,
) -> set[str]:
    """The free units that are the capacity of the object's outstanding queued requests
    (the pool each names in provisioningClassDetails, even before Provisioned). A
    multi-host slice's is the named pool itself; a single-host slice's are the nodes of
    the named pool made since the request (GKE grows that pool by the request's nodes;
    the ones there before are any slice's)."""
    named = {r.node_pool for r in outstanding if r.node_pool}
    if unit is CapacityUnit.NODE_POOL:
        return named & set(free)
    in_named = [u for u in free if _pool_of(u, pool_nodes) in named]
    return fresh_pools(in_named, pool_nodes, [r for r in outstanding if r.node_pool in named])


def _pool_of(unit: str | None, pool_nodes: PoolNodes) -> str | None:
    """The GKE node pool of ``unit`` (a node pool's own name, or a node's pool)."""
    nodes = pool_nodes.get(unit or "")
    return nodes[0].pool if nodes else None


def slice_facts(
    ref: ClusterRef,
    spec: SliceClusterSpec,
    plan: SlicePlan,
    pods: Sequence[PodInfo],
    reservations: Sequence[ReservationInfo],
    *,
    eligible: frozenset[str],
    pool_nodes: PoolNodes,
    newest: Mapping[tuple[str, int], ProvisioningRequestInfo],
) -> dict[int, SliceFacts]:
    """Each planned slice's facts, by slice index.

    ``eligible``: the pools of the slice shape that may serve a slice; ``pool_nodes``:
    their nodes (creation times); ``newest``: the object's newest request per
    (RayCluster, slice index). A slice waits for capacity when its pods all exist, it
    holds no pool and no live request serves it; of those, as many as there are free
    existing pools (not a request's own fresh capacity) are marked served by a pool
    instead of asking, in index order, so which slices ask stays put while they wait."""
    prov = spec.provisioning
    hosts = spec.shape.hosts
    held = {r.holder.replica_name: r.pool for r in ref.own(reservations)}
    claimed = {cl.holder.replica_name: cl.pool for cl in plan.claims}
    by_replica = pods_by_replica(pods, hosts)
    taken = {r.pool for r in reservations} | set(claimed.values())
    free = {p for p in eligible if p not in taken}
    # Free pools that serve slices without asking: not the capacity of this object's own
    # outstanding requests. Queued pools are named (even before Provisioned). A
    # best-effort pool is not: a free pool whose nodes are all younger than the oldest
    # outstanding request counts as a request's (it may even be seen before the
    # request's Provisioned: two watches).
    outstanding = [r for r in newest.values() if not lapsed(r) and not r.deleting]
    live = {
        k: r
        for k, r in newest.items()
        if r.is_true(c.PROVREQ_PROVISIONED) and not lapsed(r) and not r.deleting
    }
    unit = CapacityUnit.for_hosts(hosts)
    if prov is not None and prov.mode == ProvisioningMode.QUEUED:
        capacity = queued_capacity(free, pool_nodes, outstanding, unit)
    else:
        capacity = fresh_pools(free, pool_nodes, outstanding)
    free_existing = len(free - capacity)
    desired = sum(1 for s in plan.slices if s.state != SliceState.RELEASING)
    holding = set(held) | set(claimed)
    gang_short = (
        spec.gang == GangMode.ALL_SLICES
        and len({s.replica for s in plan.slices if s.replica in holding}) < desired
    )
    out: dict[int, SliceFacts] = {}
    waiting: list[int] = []
    for status in plan.slices:
        replica = status.replica
        live_pods = [p for p in by_replica.get(replica or "", []) if not p.deleting]
        raycluster = next((p.ray_cluster for p in live_pods if p.ray_cluster), "") or spec.name
        pool = held.get(replica or "") or claimed.get(replica or "")
        complete = len(live_pods) == hosts
        exists = status.state != SliceState.RELEASING and bool(live_pods)
        out[status.index] = SliceFacts(
            index=status.index,
            raycluster=raycluster,
            exists=exists,
            pods_complete=complete,
            pool=pool,
            released=any(not p.gated for p in live_pods),
            bound=complete and all(p.node_name for p in live_pods),
            gang_waiting=gang_short and pool is not None and all(p.gated for p in live_pods),
            unit=unit,
            unit_pool=_pool_of(pool, pool_nodes),
        )
        if exists and pool is None and complete and (raycluster, status.index) not in live:
            waiting.append(status.index)
    if spec.suspend:
        return out
    asking = slices_to_provision(waiting, free_existing)
    for i in waiting:
        if i not in asking:
            out[i] = replace(out[i], eligible_pool=True)
    if spec.elastic is not None:
        extras = one_extra_at_a_time(asking, spec.elastic.min_slices)
        for i in extras[1:]:
            out[i] = replace(out[i], asks_after=extras[0])
    return out


def one_extra_at_a_time(asking: Iterable[int], minimum: int) -> list[int]:
    """The slices above an elastic ``minimum`` that would ask for capacity, lowest index
    first: only the first may ask (the others get ``asks_after``). The autoscaler adds
    extras one by one and gives each up after its timeout, so asking for all at once
    would book capacity for slices it may no longer want; the minimum is asked for
    whole, as a fixed set's slices are."""
    return sorted(i for i in asking if i >= minimum)
