"""The slice actuator: carry out the planner's decisions for one cluster's slices.

``reservation.plan_slices`` decides (pure); this part acts, in the order that
keeps the guarantee: give back pools no longer needed, claim pools (creating a
SliceReservation is the atomic claim; AlreadyExists means another was first,
and the pass re-plans at once with the winner's reservation known), release
whole slices whose claim held (every pod of the slice in one burst of
patches), and mark fully pinned reservations Bound. Each write is recorded in
``Expectations`` until the watches show it.

``PoolIndexCache`` keeps each shape's pool index between passes; it is rebuilt
only when a node of the shape changed in a way the decisions see.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from tpuslice.capacity.constraints import NO_CONSTRAINTS, CapacityConstraints
from tpuslice.capacity.plan import NO_CAPACITY_PLAN
from tpuslice.controller.capacity import Provisioner
from tpuslice.controller.expectations import Expectations
from tpuslice.controller.pinning import PinFence
from tpuslice.controller.recorder import Recorder
from tpuslice.model import constants as c
from tpuslice.model import events
from tpuslice.model.convert import (
    gke_slice_body,
    gke_slice_info,
    holder_spec,
    reservation_body,
    reservation_info,
    rfc3339,
    timestamp,
)
from tpuslice.model.records import (
    Admission,
    CapacityUnit,
    ClusterRef,
    Drain,
    ForceDelete,
    GkeSliceInfo,
    Handover,
    Move,
    ObjectKey,
    PodInfo,
    PodRelease,
    PoolRequest,
    ReservationInfo,
    Shape,
    ShapeMember,
    SlicePlan,
    SliceState,
    SliceStatus,
    Snapshot,
)
from tpuslice.planning.busy import move_message, with_moves
from tpuslice.planning.disruption import maintenance_before, revoked_drains
from tpuslice.planning.dynamic import partition_request, plan_dynamic_slices
from tpuslice.planning.elastic import next_timeout_in
from tpuslice.planning.groups import GroupHold, claims_wait_on
from tpuslice.planning.partitions import (
    partition_inventory,
    partition_pools,
    partition_shape,
    partition_slice_shape,
)
from tpuslice.planning.pinning import kept_for_pins, pin_marks, pin_rekeys
from tpuslice.planning.pools import (
    PoolIndex,
    eligible_pools,
    free_pools,
    handovers,
    kept_frees,
    plan_slices,
    pool_index,
    pool_request,
    quarantined_units,
    shape_pools,
)
from tpuslice.planning.queue import admission_for, decide_queue, shape_name
from tpuslice.policy.placement import (
    excluded_pools,
    namespace_wait,
    queued_priority,
    worker_tolerations,
)
from tpuslice.policy.rules import POLICY_DENIED, POLICY_VIOLATION
from tpuslice.policy.selection import governing
from tpuslice.runtime.kube import ApiError, ClusterApi
from tpuslice.runtime.metrics import Metrics, slice_last_created
from tpuslice.spec.bounds import SpecLimits
from tpuslice.spec.limits import check_limits, controller_errors
from tpuslice.spec.parts import SliceClusterSpec, SpecError
from tpuslice.spec.slices import parse_slice_parts
from tpuslice.status.conditions import MAX_SLICE_MESSAGE, Stall, truncate
from tpuslice.status.kueue import held_in_status

__all__ = [
    "PoolIndexCache",
    "SliceActuator",
    "SpecCache",
    "admission_matters",
    "avoiding",
    "decide_admission",
    "desired_of",
    "gang_need",
    "held_for_gang",
    "held_slices",
    "partition_admission",
    "placed",
    "queue_admission",
    "refused_by_policy",
    "shape_of",
]

log = logging.getLogger(__name__)

#: Re-plans within one pass after a lost claim (each may lose again to a faster holder).
CLAIM_REPLANS = 2

MULTIHOST_HINT = (
    "KubeRay created worker pods without the ray.io/worker-group-replica-name and "
    "ray.io/replica-host-index labels, so slices cannot be told apart: turn on KubeRay's "
    "multi-host indexing (ray-operator --feature-gates=RayMultiHostIndexing=true on KubeRay "
    "1.5; on by default from 1.6) and delete the RayCluster's worker pods"
)


#: Why a job's new slice waits while the pools it keeps are still in use.
KEPT_MESSAGE = (
    "waiting for the previous attempt's pods to leave the node pools this job keeps "
    "(no new claim: a retry gets the job's own pools)"
)


def shape_of(spec: SliceClusterSpec) -> Shape:
    """The shape whose queue the slices wait in: the slice's (accelerator, topology), or
    for dynamic slices the accelerator's partition queue (``partitions.partition_shape``:
    every topology competes for the same partitions)."""
    if spec.dynamic:
        return partition_shape(spec.shape.generation.gke_accelerator)
    return spec.shape.generation.gke_accelerator, spec.shape.topology


def held_slices(reservations: Iterable[ReservationInfo], ref: ClusterRef) -> int:
    """The slices of ``ref``'s group that hold a unit: one per slice, however many units
    (a dynamic slice's partitions) it holds."""
    return len({r.holder.replica_name for r in ref.own_in_group(reservations)})


def previous_pools(status: Mapping[str, Any]) -> dict[int, str]:
    """Slice index -> the unit it held (its node, else its node pool), as the status
    last said (a preference)."""
    return {
        int(s["index"]): s.get("node") or s["nodePool"]
        for s in status.get("slices") or []
        if s.get("nodePool") and s.get("index") is not None
    }


@dataclass
class SpecCache:
    """Parsed specs of the shape's other clusters, by (uid, generation): every pass reads
    the whole queue of its shape, and parsing each member's spec every time would cost a
    parse per member per pass. A spec over ``limits`` is None like an invalid one: its
    own pass ends InvalidSpec, so it must not hold a place in the queue either."""

    _specs: dict[tuple[str, int], SliceClusterSpec | None] = field(default_factory=dict)
    limits: SpecLimits = field(default_factory=SpecLimits)

    def parse(self, cluster: Mapping[str, Any]) -> SliceClusterSpec | None:
        meta = cluster.get("metadata") or {}
        key = (str(meta.get("uid") or ""), int(meta.get("generation") or 0))
        if key not in self._specs:
            self.forget(key[0])  # an older generation's
            try:
                spec = parse_slice_parts(cluster)
                check_limits(spec, self.limits)
                if unsupported := controller_errors(spec):
                    raise SpecError(unsupported)
                self._specs[key] = spec
            except SpecError:
                self._specs[key] = None
        return self._specs[key]

    def forget(self, uid: str) -> None:
        for key in [k for k in self._specs if k[0] == uid]:
            del self._specs[key]


def held_for_gang(slices: Sequence[SliceStatus], why: str) -> tuple[SliceStatus, ...]:
    """A gang-held group's slices as status shows them: a Reserved slice says it holds
    its pool and waits for the other groups (``why``) unless it already says more."""
    return tuple(
        replace(s, message=truncate(f"holds {s.node_pool}; {why}", MAX_SLICE_MESSAGE))
        if s.state == SliceState.RESERVED and s.node_pool and not s.message
        else s
        for s in slices
    )


def with_drains(final: SlicePlan, drained: SlicePlan) -> SlicePlan:
    """The plan after acting, with the drains of the plan that made them and their
    slices as that plan said (the re-plan sees the drained pods deleting and would only
    say "pods terminating", where the reader needs which node and why)."""
    if not drained.drains:
        return replace(final, drains=())
    names = {d.replica_name for d in drained.drains}
    said = {s.index: s for s in drained.slices if s.replica in names}
    slices = tuple(said.get(s.index, s) for s in final.slices)
    return replace(final, slices=slices, drains=drained.drains)


def desired_of(cluster: Mapping[str, Any], spec: SliceClusterSpec) -> int:
    """How many slices an object wants now: none when suspended, held by Kueue, or when it is a
    TPUSliceJob that has ended (its status says Complete or Failed). An elastic set
    wants the target its last pass wrote (``status.elastic.target``, the autoscaler's
    count clamped to the range), so another object's pass reads it from the object
    alone; its own pass reads its RayCluster's live count instead (``SliceSet.desired``)."""
    if spec.suspend:
        return 0
    status = cluster.get("status") or {}
    if held_in_status(status):
        return 0  # Kueue holds it: no place in the queue until admitted (status/kueue.py)
    for cond in status.get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return 0
    if spec.elastic is not None:
        written = (_elastic_status(status, spec.group_name) or {}).get("target")
        target = written if isinstance(written, int) and not isinstance(written, bool) else None
        return spec.desired_slices(target)
    return spec.slices


def _elastic_status(status: Mapping[str, Any], group: str) -> Any:
    """The status.elastic an elastic set's last pass wrote: the object's, or for a TPU
    group of spec.workerGroups its entry's in status.groups[]."""
    if "groups" not in status:
        return status.get("elastic")
    for entry in status.get("groups") or []:
        if isinstance(entry, Mapping) and entry.get("name") == group:
            return entry.get("elastic")
    return None


def gang_need(desired: int, spec: SliceClusterSpec) -> int:
    """The slices of ``desired`` a TPU group holds in its object's gang across groups:
    all of a fixed group's; an elastic group's minimum, as its own plan holds the
    minimum as a gang and the slices above it one by one (``planning.elastic``)."""
    return min(desired, spec.min_slices)


def pins_scope(spec: SliceClusterSpec, *, keep_pools: bool = False) -> bool:
    """Whether pin at admission covers the slices of ``spec`` when the setting is on:
    multi-host node-pool units of a gated, fixed slice count without capacity on
    demand, of an object that does not keep its pools between attempts (a job's
    hand-overs may change a unit's index). Elsewhere the gate path alone."""
    return (
        spec.gated
        and not spec.dynamic
        and spec.shape.hosts > 1
        and spec.elastic is None
        and not spec.provisions
        and not keep_pools
    )


def claims_ahead(spec: SliceClusterSpec, *, kind: str, pins: bool) -> bool:
    """Whether a slice set claims its units by replica index before KubeRay makes its
    pods (``plan_slices(claim_ahead=...)``): with pin at admission on (``pins``) and in
    its scope, for a TPUSliceCluster Kueue does not admit (its pods wait for Kueue, and
    a unit held for a suspended object would be held for nothing). Not a job (it keeps
    its pools between attempts) nor a service (a slice set per RayCluster, while the
    queue counts the service as one member over all of them: the indexes without pods
    would not add up the same in its own pass and in another's). Read from the spec and
    kind alone, so every pass counts another member's request the way its own does."""
    return (
        pins
        and kind == c.KIND_CLUSTER
        and spec.kueue is None
        and not spec.kueue_picks_pools
        and pins_scope(spec)
    )


#: With pin at admission, how long after its creation an object none of whose pods
#: exists yet still claims units ahead of them. A pod proves the namespace's quota
#: admitted the object (the queue's rule for an object without pods,
#: ``planning/queue.py``); before the first one, claiming ahead trusts that KubeRay will
#: make them soon. Past this, an object still without pods gives its placeholders back
#: (through the fence) and waits for its pods as without the setting, so an object
#: whose pods are never admitted holds nothing for long, whatever its priority.
AHEAD_WITHOUT_PODS_S = 600.0


def ahead_in_time(cluster: Mapping[str, Any], pods: Sequence[PodInfo], now: datetime) -> bool:
    """Whether an object may claim ahead of its pods now (``AHEAD_WITHOUT_PODS_S``): one of
    its pods exists, or it was created less than that long ago (or says no time)."""
    if any(not p.deleting for p in pods):
        return True
    created = timestamp(str((cluster.get("metadata") or {}).get("creationTimestamp") or ""))
    return created is None or (now - created).total_seconds() < AHEAD_WITHOUT_PODS_S


def _request(
    ref: ClusterRef,
    spec: SliceClusterSpec,
    cluster: Mapping[str, Any],
    pods: Sequence[PodInfo],
    reservations: Sequence[ReservationInfo],
    desired: int,
    *,
    pins: bool = False,
) -> PoolRequest:
    now = datetime.now(UTC)
    return pool_request(
        ref,
        hosts=spec.shape.hosts,
        desired_slices=desired,
        pods=pods,
        reservations=reservations,
        gang=spec.gang,
        priority=spec.priority,
        created=str((cluster.get("metadata") or {}).get("creationTimestamp") or ""),
        capacity_types=spec.capacity_types,
        previous_pools=previous_pools(cluster.get("status") or {}),
        minimum=None if spec.elastic is None else spec.elastic.min_slices,
        kueue_pools=spec.kueue_picks_pools,
        claim_ahead=claims_ahead(spec, kind=ref.kind, pins=pins)
        and ahead_in_time(cluster, pods, now),
        # the queue's decision is read from the snapshot alone; the wall clock only
        # moves which announced maintenance is "soon" (spec.disruption), and how long
        # an object without pods claims ahead of them
        maintenance_before=maintenance_before(now, spec.disruption.avoid_maintenance_within_s),
    )


def queue_admission(
    ref: ClusterRef,
    spec: SliceClusterSpec,
    snap: Snapshot,
    pods: Sequence[PodInfo],
    reservations: Sequence[ReservationInfo],
    index: PoolIndex,
    specs: SpecCache,
    desired: int | None = None,
    *,
    pins: bool = False,
) -> Admission | None:
    """What the shape's queue lets this cluster claim now, decided from the snapshot alone
    (every member's priority, creationTimestamp, pods and reservations; the shape's
    pools): every pass of every cluster, and an operator after a restart, computes the
    same decision. Members being deleted, ungated or with an invalid spec are not queued.

    None when nobody competes: every member's missing pools (counted from its
    reservations, without reading its pods) fit in the free eligible pools, so the order
    cannot matter and the planner picks by preference alone; None too when no admission
    could change this cluster's plan (``admission_matters``). Deciding the whole queue
    costs a pass over every member's pods and every pool; most passes need none of it.
    ``pins``: pin at admission is on, so the members in its scope claim for their
    indexes without pods too (``claims_ahead``)."""
    assert snap.cluster is not None
    if desired is None:
        desired = desired_of(snap.cluster, spec)
    own_reservations = ref.own(reservations)
    own = _request(ref, spec, snap.cluster, pods, own_reservations, desired, pins=pins)
    exist = len(index.matching)
    if not admission_matters(own, exist):
        return None
    return decide_admission(ref, spec, snap, own, reservations, index, specs, pins=pins)


def admission_matters(own: PoolRequest, exist: int) -> bool:
    """Whether the queue's word can change this cluster's plan. Not when it has no live
    slice without a pool (nothing to claim) and either holds all it wants (a running
    cluster's every resync) or holds nothing and fits the shape (no pods yet, no
    NotEnoughPools to say): then every admission gives the same plan, and the walk over
    every member of the shape (~10 ms at 1,000 members) is skipped. Held but short (a
    gang's partial set) still needs it: contention decides whether it gives back."""
    if own.claimable:
        return True
    return not (own.held >= own.desired or (own.held == 0 and own.desired <= exist))


def decide_admission(
    ref: ClusterRef,
    spec: SliceClusterSpec,
    snap: Snapshot,
    own: PoolRequest,
    reservations: Sequence[ReservationInfo],
    index: PoolIndex,
    specs: SpecCache,
    *,
    pins: bool = False,
) -> Admission | None:
    """``queue_admission`` past the shortcut: every member of the shape walked."""
    assert snap.cluster is not None
    shape = shape_of(spec)
    hosts, chips = spec.shape.hosts, spec.shape.chips_per_host
    exist = len(index.matching)
    by_holder: dict[tuple[str, str], list[ReservationInfo]] = {}
    for r in reservations:
        by_holder.setdefault((r.holder.uid, r.holder.group), []).append(r)
    members: list[
        tuple[ClusterRef, SliceClusterSpec, Mapping[str, Any], Sequence[PodInfo], int]
    ] = []
    others_missing = 0
    for member in snap.shape_members:
        meta = member.cluster.get("metadata") or {}
        parsed = specs.parse(member.cluster)
        if parsed is None or not parsed.gated or meta.get("deletionTimestamp"):
            continue
        uid = str(meta.get("uid") or "")
        waiting_turn = _not_at_turn(member.cluster, parsed, uid, by_holder)
        for other in parsed.tpu_groups():
            if shape_of(other) != shape or other.group_name in waiting_turn or other.dynamic:
                continue  # another shape, or a gang group whose earlier shape is not whole
            if CapacityUnit.for_hosts(other.shape.hosts) is not index.unit:
                continue  # a 2x4 of one 8-chip host takes nodes, of two 4-chip hosts pools
            group = other.group_name if parsed.grouped else ""
            other_desired = desired_of(member.cluster, other)
            held = len(by_holder.get((uid, group), []))
            if held >= other_desired:
                # Wants nothing (counted from its reservations, without reading its pods):
                # a slice it is replacing is counted in its own pass, which frees the old
                # pool and asks again with its exact request.
                continue
            if snap.policies:
                priority = _member_priority(snap.policies, member, other, other_desired - held)
                if priority is None:
                    continue  # refused, denied or at its namespace's limits: blocks nobody
                other = replace(other, priority=priority)
            if other_desired <= exist:
                others_missing += other_desired - held
            other_ref = _member_ref(member, uid, group)
            pods = [p for p in member.pods if p.group == group] if group else member.pods
            members.append((other_ref, other, member.cluster, pods, other_desired))
    eligible = eligible_pools(index, hosts=hosts, chips_per_host=chips)
    free = len(eligible) - sum(1 for r in reservations if r.pool in eligible)
    if own.desired <= exist and own.missing + others_missing <= free:
        return None
    requests = [own] + [
        _request(
            other_ref,
            other,
            cluster,
            member_pods,
            by_holder.get((other_ref.uid, other_ref.group), []),
            want,
            pins=pins,
        )
        for other_ref, other, cluster, member_pods, want in members
    ]
    pools = shape_pools(index, reservations, hosts=hosts, chips_per_host=chips)
    decision = decide_queue(shape, requests, pools, noun=index.unit.noun)
    return admission_for(decision, ref.queue_key)


def partition_admission(
    ref: ClusterRef,
    spec: SliceClusterSpec,
    snap: Snapshot,
    pods: Sequence[PodInfo],
    reservations: Sequence[ReservationInfo],
    gke_slices: Sequence[GkeSliceInfo],
    specs: SpecCache,
    desired: int,
    *,
    excluded: Collection[str] = (),
) -> Admission | None:
    """What the accelerator's partition queue lets this object's dynamic slices claim
    now: the pool queue's rules (planning/queue.py) over partitions, every member a
    DynamicSlice group of the same accelerator, whatever its topology; decided from the
    snapshot alone, as ``queue_admission``. None when no other member misses a partition
    and as many are free as it misses: the order cannot matter, the planner takes any
    free one (short of them it waits with the queue's message, naming the holders)."""
    assert snap.cluster is not None
    shape = shape_of(spec)
    own = partition_request(
        ref,
        chips=spec.shape.chips,
        hosts=spec.shape.hosts,
        desired_slices=desired,
        pods=pods,
        reservations=ref.own(reservations),
        gang=spec.gang,
        priority=spec.priority,
        created=str((snap.cluster.get("metadata") or {}).get("creationTimestamp") or ""),
    )
    if own.missing == 0 and not own.claimable:
        return None
    by_holder: dict[tuple[str, str], list[ReservationInfo]] = {}
    for r in reservations:
        by_holder.setdefault((r.holder.uid, r.holder.group), []).append(r)
    requests = [own]
    for member in snap.shape_members:
        meta = member.cluster.get("metadata") or {}
        parsed = specs.parse(member.cluster)
        if parsed is None or not parsed.gated or meta.get("deletionTimestamp"):
            continue
        uid = str(meta.get("uid") or "")
        for other in parsed.tpu_groups():
            if not other.dynamic or shape_of(other) != shape:
                continue
            group = other.group_name if parsed.grouped else ""
            other_desired = desired_of(member.cluster, other)
            held = by_holder.get((uid, group), [])
            slices_held = len({r.holder.replica_name for r in held})
            if slices_held >= other_desired:
                continue  # wants nothing, counted from its reservations alone
            if snap.policies:
                missing = other_desired - slices_held
                priority = _member_priority(snap.policies, member, other, missing)
                if priority is None:
                    continue  # refused, denied or at its namespace's limits
                other = replace(other, priority=priority)
            other_ref = _member_ref(member, uid, group)
            requests.append(
                partition_request(
                    other_ref,
                    chips=other.shape.chips,
                    hosts=other.shape.hosts,
                    desired_slices=other_desired,
                    pods=[p for p in member.pods if p.group == group] if group else member.pods,
                    reservations=held,
                    gang=other.gang,
                    priority=other.priority,
                    created=str(meta.get("creationTimestamp") or ""),
                )
            )
    pools = [
        p
        for p in partition_pools(partition_inventory(snap.nodes), reservations, gke_slices)
        if p.name not in excluded
    ]
    free = sum(1 for p in pools if p.eligible and p.holder is None)
    if len(requests) == 1 and own.desired <= len(pools) and own.missing <= free:
        # Alone, and as many partitions are free as it misses: the order cannot matter.
        # Short, it waits with the queue's word (who holds them), as a pool slice does.
        return None
    decision = decide_queue(shape, requests, pools, noun=CapacityUnit.PARTITION.noun)
    return admission_for(decision, ref.queue_key)


def _not_at_turn(
    cluster: Mapping[str, Any],
    spec: SliceClusterSpec,
    uid: str,
    by_holder: Mapping[tuple[str, str], Sequence[ReservationInfo]],
) -> set[str]:
    """The groups of another object's gang across groups that may not claim yet (an
    earlier group in the claim order is not whole, counted from its reservations): they
    set nothing aside in their shapes' queues, as their own pass claims nothing there,
    so no pool waits for a gang that waits on another shape; none of them when one
    group can never get its units."""
    gang = spec.gang_groups()
    if not gang:
        return set()
    if _stalled_not_enough(cluster):
        return {g.group_name for g in gang}  # one group can never fit: the gang never claims
    holds = [
        GroupHold(
            g.group_name,
            shape_of(g),
            gang_need(desired_of(cluster, g), g),
            len(by_holder.get((uid, g.group_name), ())),
        )
        for g in gang
    ]
    return {h.group for h in holds if claims_wait_on(holds, h.group) is not None}


def _stalled_not_enough(cluster: Mapping[str, Any]) -> bool:
    """Whether the object's last pass found a group that can never get its units (its
    status says Stalled with NotEnoughPools), read from the object as ``desired_of``
    reads Complete: another shape's units are not in this pass's snapshot."""
    for cond in (cluster.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Stalled" and cond.get("status") == "True":
            return bool(cond.get("reason") == events.NOT_ENOUGH_POOLS)
    return False


def refused_by_policy(cluster: Mapping[str, Any]) -> bool:
    """Whether the object's last pass refused it under a TPUSlicePolicy (its status says
    Stalled with PolicyDenied or PolicyViolation): read from the object, as ``desired_of``
    reads Complete, so every pass and a restarted operator leave it out of the queue."""
    for cond in (cluster.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Stalled" and cond.get("status") == "True":
            return cond.get("reason") in (POLICY_DENIED, POLICY_VIOLATION)
    return False


def _member_ref(member: ShapeMember, uid: str, group: str) -> ClusterRef:
    """The queue's name for one TPU group of another member of the shape."""
    meta = member.cluster.get("metadata") or {}
    return ClusterRef(
        meta.get("namespace", ""),
        meta.get("name", ""),
        uid,
        kind=member.cluster.get("kind") or c.KIND_CLUSTER,
        group=group,
    )


def _member_priority(
    policies: Sequence[Any], member: ShapeMember, spec: SliceClusterSpec, missing: int
) -> int | None:
    """The priority another member of the shape queues at under the policies, or None
    when it holds no place in the queue (``policy.placement.queued_priority``)."""
    if refused_by_policy(member.cluster):
        return None
    return queued_priority(policies, member.namespace_labels, member.namespace_usage, spec, missing)


def placed(index: PoolIndex, spec: SliceClusterSpec, snap: Snapshot) -> PoolIndex:
    """The pool index without the pools this object's slices may not use: a governing
    TPUSlicePolicy's pool labels missing, or a taint its workers do not tolerate
    (``policy.placement``). Pools it already holds stay its own: the planner frees a
    pool only when its slice is gone."""
    governed = governing(snap.policies, snap.namespace_labels) if snap.policies else ()
    tolerations = worker_tolerations(spec)
    # the same placement excludes the same units of one index (node-derived): every
    # object of a shape without policies shares one walk over the shape's nodes
    key = (repr(governed), json.dumps(tolerations, sort_keys=True, default=str))
    out = index.exclusions.get(key)
    if out is None:
        out = index.exclusions[key] = excluded_pools(index.matching, governed, tolerations)
    return index.narrowed(lambda name, _nodes: name not in out) if out else index


def placed_partitions(spec: SliceClusterSpec, snap: Snapshot) -> frozenset[str]:
    """The partitions (by pool) this object's dynamic slices may not use, as ``placed``
    for pools: a governing TPUSlicePolicy's pool labels missing, or a taint its workers
    do not tolerate. Those it holds stay its own until its slice is gone."""
    governed = governing(snap.policies, snap.namespace_labels) if snap.policies else ()
    units = {p.pool: p.nodes for p in partition_inventory(snap.nodes).values()}
    return excluded_pools(units, governed, worker_tolerations(spec))


def avoiding(index: PoolIndex, nodes: Collection[str]) -> PoolIndex:
    """The pool index without the nodes this object found busy (``planning.busy``): only
    an index of node units (single-host slices) is narrowed."""
    if index.unit is not CapacityUnit.NODE or not any(n in index.matching for n in nodes):
        return index
    return index.narrowed(lambda name, _nodes: name not in nodes)


def constrained(index: PoolIndex, limits: CapacityConstraints) -> PoolIndex:
    """The pool index narrowed to the pools capacity on demand lets this object use."""
    if (
        not limits.node_selector
        and not limits.promised_since
        and not any(pool in index.matching for pool in limits.excluded)
    ):
        return index
    return index.narrowed(limits.allows)


@dataclass
class PoolIndexCache:
    """Pool indexes per shape, versioned by node changes the decisions see."""

    _versions: dict[Shape, int] = field(default_factory=dict)
    _indexes: dict[tuple[Shape, CapacityUnit], tuple[int, PoolIndex]] = field(default_factory=dict)

    def nodes_changed(self, shape: Shape) -> None:
        """A node of ``shape`` changed in a way the decisions see (not a heartbeat)."""
        self._versions[shape] = self._versions.get(shape, 0) + 1

    def versions(self) -> dict[Shape, int]:
        """The versions now; read with the snapshot's nodes (no await in between)."""
        return dict(self._versions)

    def index(
        self, shape: Shape, snap: Snapshot, unit: CapacityUnit = CapacityUnit.NODE_POOL
    ) -> PoolIndex | None:
        """The shape's pool index, rebuilt only after ``nodes_changed``; None (the planner
        builds it) when nothing reports node changes, as in unit tests.

        Keyed by the version the snapshot's nodes were read at: a node event during an
        earlier await of this pass must not get stale nodes cached as current."""
        version = snap.node_versions.get(shape)
        if version is None:
            return None
        cached = self._indexes.get((shape, unit))
        if cached is not None and cached[0] == version:
            return cached[1]
        index = pool_index(snap.nodes, *shape, unit=unit)
        if version == self._versions.get(shape):
            self._indexes[(shape, unit)] = (version, index)
        return index

    def index_or_build(
        self, shape: Shape, snap: Snapshot, unit: CapacityUnit = CapacityUnit.NODE_POOL
    ) -> PoolIndex:
        """``index``, or the index built from the snapshot's nodes when none is kept."""
        return self.index(shape, snap, unit) or pool_index(snap.nodes, *shape, unit=unit)


@dataclass
class SliceActuator:
    kube: ClusterApi
    pending: Expectations
    recorder: Recorder
    metrics: Metrics
    pool_indexes: PoolIndexCache
    specs: SpecCache = field(default_factory=SpecCache)
    #: capacity on demand (controller/capacity.py); None: never asks for capacity
    provisioner: Provisioner | None = None
    #: the wall clock the busy-node rule reads (``planning.busy``)
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    #: asks for a pass of an object later (when a released pod will have waited enough)
    kick_later: Callable[[ObjectKey, float], None] | None = None
    #: pin at admission: the fence every let-go of a reservation passes, and the marks
    fence: PinFence | None = None

    def pins_on(self, spec: SliceClusterSpec, *, keep_pools: bool = False) -> bool:
        """Whether the slices of ``spec`` are pinned at admission (``--pin-at-admission``
        and ``pins_scope``)."""
        return (
            self.fence is not None
            and self.fence.enabled
            and pins_scope(spec, keep_pools=keep_pools)
        )

    async def let_go(self, reservation: ReservationInfo) -> bool:
        """Whether ``reservation`` may be deleted or handed over now (``PinFence``)."""
        return self.fence is None or await self.fence.let_go(reservation)

    def pools_short(self, spec: SliceClusterSpec, snap: Snapshot) -> str:
        """Why free node pools could not hold every slice of ``spec`` now ("" when they
        could), for spec.kueue.admissionGate: each TPU group's eligible pools that nobody
        holds (our unconfirmed claims counted), less those a governing policy or an
        untolerated taint keeps from it, against its slice count."""
        reservations = self.pending.reservations(snap.reservations)
        for group in spec.tpu_groups():
            shape = shape_of(group)
            unit = CapacityUnit.for_hosts(group.shape.hosts)
            index = self.pool_indexes.index_or_build(shape, snap, unit)
            free = free_pools(
                placed(index, group, snap),
                reservations,
                hosts=group.shape.hosts,
                chips_per_host=group.shape.chips_per_host,
            )
            if len(free) < group.slices:
                where = f" of group {group.group_name}" if spec.grouped else ""
                return (
                    f"{len(free)} free {shape_name(shape)} node pools for the "
                    f"{group.slices} slices{where}"
                )
        return ""

    async def act(
        self,
        ref: ClusterRef,
        spec: SliceClusterSpec,
        snap: Snapshot,
        previous: Mapping[str, Any],
        *,
        desired_slices: int | None = None,
        keep_pools: bool = False,
        avoid: Collection[str] = (),
        claims_wait: str = "",
        releases_wait: str = "",
        give_back: bool = False,
        ahead: bool = True,
    ) -> tuple[SlicePlan, Stall | None]:
        """Plan and act on every slice of ``ref``; the plan as it stands after acting, and
        a stall the plan revealed (pods KubeRay did not index, NotEnoughPools).

        ``desired_slices`` overrides the spec's count (a TPUSliceJob that ended wants
        none). ``keep_pools`` (a TPUSliceJob between attempts): pools of slices whose
        pods are gone stay held and go to the new attempt's slices (``handovers``), and
        while the job holds as many pools as it wants it claims none. ``avoid``: nodes
        the object found busy (``planning.busy``), never claimed for its single-host
        slices; a slice moved off a busy node in this pass is not put back on it.

        A TPU group of a gang across groups (``planning.groups``): ``claims_wait`` says
        why it may not claim now (an earlier group in the claim order is not whole: it
        claims nothing and asks for no capacity); ``releases_wait`` why its slices stay
        gated (not every group of the gang holds all its slices yet); ``give_back``
        frees the pools of its slices whose pods are all still gated (the gang never
        ran, and an earlier group lost pools: a gang holds no later shape while it
        waits on an earlier one). ``ahead`` False: no unit is claimed or kept for a
        replica index without pods (its KubeRay object was not applied).

        Capacity on demand is two calls: its constraints before planning, its plan
        (carried out) after the first plan. The slices are planned once when no claim
        is lost and nothing is written; once more after writes (the plan as it stands,
        for the report); and once more per lost claim, up to ``CLAIM_REPLANS`` (the
        winner's reservation known): at most ``CLAIM_REPLANS + 2`` times."""
        assert snap.cluster is not None
        shape = shape_of(spec)
        unit = CapacityUnit.PARTITION if spec.dynamic else CapacityUnit.for_hosts(spec.shape.hosts)
        # dynamic slices: GKE's Slices, read (a quorum LIST) once per pass, not watched
        gke_slices = (
            [gke_slice_info(o) for o in await self.kube.list_gke_slices()] if spec.dynamic else []
        )
        index = self.pool_indexes.index_or_build(shape, snap, unit)
        desired = desired_of(snap.cluster, spec) if desired_slices is None else desired_slices
        self.pending.observed(snap.reservations, snap.pods)
        if keep_pools and not spec.dynamic:
            # a dynamic slice's partitions are not handed to a job's retry: its Slice
            # names the old slice, so the retry forms its own (planning/dynamic.py)
            await self._hand_over(ref, spec, snap, desired)
        elif not spec.dynamic and self.fence is not None:
            # a unit kept for its index goes to the replica KubeRay made next (only
            # where a mark is or was: without the setting the pass skips the work)
            reservations_now = self.pending.reservations(snap.reservations)
            if self.fence.enabled or any(
                r.pinned or r.unpinned_at for r in ref.own(reservations_now)
            ):
                rekeys = pin_rekeys(
                    ref,
                    hosts=spec.shape.hosts,
                    pods=self.pending.pods(snap.pods),
                    reservations=reservations_now,
                )
                if rekeys:
                    await self._apply_handovers(ref, rekeys, reservations_now)
        pins = self.pins_on(spec, keep_pools=keep_pools)
        if give_back:
            await self._give_back(ref, snap, claims_wait)
        held_now = held_slices(self.pending.reservations(snap.reservations), ref)
        # At its namespace's TPUSlicePolicy limits: claims nothing, asks for no capacity.
        waits_on_namespace = namespace_wait(
            snap.policies,
            snap.namespace_labels,
            snap.namespace_usage,
            desired - held_now,
            spec.shape.chips,
        )
        prov = None
        if (
            self.provisioner is not None
            and not waits_on_namespace
            and not claims_wait
            and not spec.dynamic  # a dynamic slice's partitions are never provisioned
        ):
            prov = self.provisioner.begin(ref, spec, snap, previous)
        limits = prov.constraints if prov is not None else NO_CONSTRAINTS
        index = avoiding(placed(constrained(index, limits), spec, snap), avoid)
        preferred = limits.prefer(previous_pools(previous))
        now = self.clock()
        off_limits = placed_partitions(spec, snap) if spec.dynamic else frozenset()

        def plan() -> SlicePlan:
            pods = self.pending.pods(snap.pods)
            reservations = self.pending.reservations(snap.reservations)
            if spec.dynamic:
                waits = claims_wait or waits_on_namespace
                queued = (
                    partition_admission(
                        ref,
                        spec,
                        snap,
                        pods,
                        reservations,
                        gke_slices,
                        self.specs,
                        desired,
                        excluded=off_limits,
                    )
                    if spec.gated and not waits
                    else None
                )
                return plan_dynamic_slices(
                    ref,
                    topology=spec.shape.topology,
                    chips=spec.shape.chips,
                    hosts=spec.shape.hosts,
                    desired_slices=0 if claims_wait or waits_on_namespace else desired,
                    pods=pods,
                    nodes=snap.nodes,
                    reservations=reservations,
                    gke_slices=gke_slices,
                    gang=spec.gang,
                    allow_degraded=spec.allow_degraded,
                    now=now,
                    grace_seconds=spec.disruption.grace_period_s,
                    admission=queued,
                    excluded=off_limits,
                )
            held = len(ref.own_in_group(reservations))
            if keep_pools and held >= desired:
                admission: Admission | None = Admission(pools=(), message=KEPT_MESSAGE)
            elif claims_wait:
                admission = Admission(pools=(), message=claims_wait)
            elif waits_on_namespace:
                admission = Admission(pools=(), message=waits_on_namespace)
            elif spec.gated:
                admission = queue_admission(
                    ref,
                    spec,
                    snap,
                    pods,
                    reservations,
                    index,
                    self.specs,
                    desired,
                    pins=self.fence is not None and self.fence.enabled,
                )
            else:
                admission = None
            admission = limits.admit(admission)
            planned = plan_slices(
                ref,
                accelerator=spec.shape.generation.gke_accelerator,
                topology=spec.shape.topology,
                hosts=spec.shape.hosts,
                chips_per_host=spec.shape.chips_per_host,
                desired_slices=desired,
                gated=spec.gated,
                pods=pods,
                nodes=snap.nodes,
                reservations=reservations,
                previous_pools=preferred,
                inventory=index,
                gang=spec.gang,
                admission=admission,
                capacity_types=spec.capacity_types,
                now=now,
                minimum=None if spec.elastic is None else spec.elastic.min_slices,
                maintenance_before=maintenance_before(
                    now, spec.disruption.avoid_maintenance_within_s
                ),
                grace_seconds=spec.disruption.grace_period_s,
                kueue_pools=spec.kueue_picks_pools,
                claim_ahead=ahead
                and claims_ahead(spec, kind=ref.kind, pins=pins)
                and ahead_in_time(snap.cluster or {}, pods, now),
            )
            if keep_pools:
                frees = kept_frees(
                    planned.frees, ref, desired_slices=desired, reservations=reservations
                )
                planned = replace(planned, frees=frees)
            elif pins:
                frees = kept_for_pins(
                    planned.frees,
                    ref,
                    desired=desired,
                    hosts=spec.shape.hosts,
                    pods=pods,
                    reservations=reservations,
                )
                planned = replace(planned, frees=frees)
            return planned

        current = plan()
        stall = None
        if current.unindexed_pods:
            stall = Stall(events.MULTIHOST_INDEXING_DISABLED, MULTIHOST_HINT)
        capacity = NO_CAPACITY_PLAN
        if prov is not None:
            pods_now = self.pending.pods(snap.pods)
            reservations_now = self.pending.reservations(snap.reservations)
            capacity = await prov.act(current, pods_now, reservations_now, index)
        revoked = revoked_drains(current, capacity.decisions)
        for drain in revoked:  # the capacity executor deleted the pods
            self.metrics.slice_disrupted(drain.reason)
        self.metrics.quarantined(shape_name(shape_of(spec)), quarantined_units(index))
        drained, drained_plan = current.drains, current
        if drained:
            await self._unmark(snap, [d.pool for d in drained])
            await self._drain(ref, drained)
        if current.force_deletes:
            await self._force_delete(ref, current.force_deletes)
        moved = current
        if current.moves:
            await self._move(ref, current.moves, snap)
            index = avoiding(index, [m.pool for m in current.moves])  # for every plan below
            current = plan()
        acted = bool(moved.moves)
        acted = await self._free(ref, current.frees, snap, index.unit) or acted
        held, lost = await self._claim(ref, spec, current, index)
        for _ in range(CLAIM_REPLANS):
            if not lost:
                break
            # Someone else was faster: re-plan at once with the winner's reservation
            # known (another free pool, or the honest WaitingForCapacity naming the
            # holder; a gang gives its partial set back), instead of reporting the
            # winner's pool until the next pass.
            current = plan()
            acted = await self._free(ref, current.frees, snap, index.unit) or acted
            more, lost = await self._claim(ref, spec, current, index)
            held += more
        acted = acted or bool(held)
        if current.gke_slice_creates or current.gke_slice_deletes:
            await self._gke_slices(ref, current, snap)
            acted = True
        holding = {
            r.holder.replica_name
            for r in ref.own_in_group(self.pending.reservations(snap.reservations))
        }
        holding |= self.pending.created_by(ref.uid)
        releases = [r for r in current.releases if r.replica_name in holding]
        if (current.all_or_nothing and lost) or releases_wait:
            releases = []  # the gang is not complete: nothing of it may schedule
        releases = capacity.releases(releases)
        if releases:
            await self._release(releases, capacity.annotations)
            self.metrics.slices_released(
                slice_last_created(snap.pods, {r.replica_name for r in releases}), time.time()
            )
            acted = True
        await self._bind(current.binds, index.unit)
        await self._pin_marks(
            ref,
            spec,
            snap,
            current,
            index,
            desired=desired,
            enabled=pins and not releases_wait and not (current.all_or_nothing and lost),
        )
        final = with_drains(with_moves(plan() if acted else current, moved), drained_plan)
        if final.recheck_in is not None and self.kick_later is not None:
            self.kick_later(ref.key, final.recheck_in + 1.0)
        if spec.elastic is not None and self.kick_later is not None:
            # a pass when a waiting extra passes the autoscaler's timeout, to show it
            due = next_timeout_in(
                final.slices,
                snap.pods,
                spec.elastic.min_slices,
                spec.elastic.scale_up_timeout_seconds,
                now,
            )
            if due is not None:
                self.kick_later(ref.key, due + 1.0)
        if final.stalled and stall is None:
            stall = Stall(events.NOT_ENOUGH_POOLS, final.stalled)
        final, stall = capacity.report(final, stall)
        if revoked:
            final = replace(final, drains=(*final.drains, *revoked))
        if releases_wait:
            final = replace(final, slices=held_for_gang(final.slices, releases_wait))
        return final, stall

    async def _gke_slices(self, ref: ClusterRef, plan: SlicePlan, snap: Snapshot) -> None:
        """Delete the plan's Slices (each only the object of the uid the pass read), then
        create its new ones, each only over partitions this object holds now (a claim of
        this pass lost to another holder never gets a Slice). A create that finds the
        name taken is an earlier pass's: the name is a digest of holder and partitions."""
        for gone in plan.gke_slice_deletes:
            if await self.kube.delete_gke_slice(gone.name, gone.uid):
                log.info("%s %s: deleted GKE Slice %s", ref.kind, ref, gone.name)
                await self.recorder.normal(
                    ref,
                    events.SLICE_RELEASED,
                    f"deleted GKE Slice {gone.name} ({gone.reason or 'not Ready'}; partitions "
                    f"{', '.join(gone.partition_ids)})",
                )
        held = {r.pool for r in ref.own_in_group(self.pending.reservations(snap.reservations))}
        pool_of = {n.labels.get(c.NODE_LABEL_TPU_PARTITION_ID, ""): n.pool for n in snap.nodes}
        for new in plan.gke_slice_creates:
            if any(pool_of.get(pid) not in held for pid in new.partition_ids):
                continue
            body = gke_slice_body(
                new.name, new.holder, topology=new.topology, partition_ids=new.partition_ids
            )
            try:
                await self.kube.create_gke_slice(body)
            except ApiError as exc:
                if not exc.already_exists:
                    raise
                continue
            log.info("%s %s: created GKE Slice %s", ref.kind, ref, new.name)
            await self.recorder.normal(
                ref,
                events.SLICE_RESERVED,
                f"slice {new.holder.replica_index} ({new.holder.replica_name}) forming GKE "
                f"Slice {new.name} over partitions {', '.join(new.partition_ids)}",
            )

    async def _give_back(self, ref: ClusterRef, snap: Snapshot, why: str) -> None:
        """Delete this group's reservations whose slice's pods are all still gated
        (nothing ran there), each conditional on the uid the pass saw."""
        gated: dict[str, bool] = {}
        for pod in self.pending.pods(snap.pods):
            for name in pod.slice_names:
                gated[name] = gated.get(name, True) and pod.gated and not pod.pinned_pool
        for r in ref.own(self.pending.reservations(snap.reservations)):
            if not gated.get(r.holder.replica_name, True):
                continue
            if await self.let_go(r) and await self.kube.delete_reservation(r.pool, r.uid):
                self.pending.reservation_deleted(r.pool, time.monotonic(), r.uid)
                await self.recorder.normal(
                    ref,
                    events.SLICE_RELEASED,
                    f"released node pool {r.pool} (group {ref.group}, slice "
                    f"{r.holder.replica_name}, never started): {why}",
                )

    async def _hand_over(
        self, ref: ClusterRef, spec: SliceClusterSpec, snap: Snapshot, desired: int
    ) -> None:
        """Give the pools of slices without pods to the job's new slices: one conditional
        patch of each reservation's holder. A conflict (the reservation changed) is left
        to the next pass, which reads it again."""
        reservations = self.pending.reservations(snap.reservations)
        given = handovers(
            ref,
            hosts=spec.shape.hosts,
            desired_slices=desired,
            pods=self.pending.pods(snap.pods),
            reservations=reservations,
        )
        await self._apply_handovers(ref, given, reservations)

    async def _apply_handovers(
        self, ref: ClusterRef, given: Sequence[Handover], reservations: Sequence[ReservationInfo]
    ) -> None:
        """Each hand-over as one patch of the holder conditional on the resourceVersion
        the pass read; one to another replica index passes the fence first (a unit
        marked for pinning is pinned by index)."""
        by_pool = {r.pool: r for r in reservations}
        for handover in given:
            old = by_pool[handover.pool]
            if old.holder.replica_index != handover.holder.replica_index and not (
                await self.let_go(old)
            ):
                continue
            try:
                updated = await self.kube.hand_over_reservation(
                    handover.pool, holder_spec(handover.holder), old.resource_version
                )
            except ApiError as exc:
                if exc.conflict or exc.not_found:
                    continue
                raise
            self.pending.reservation_seen(reservation_info(updated), time.monotonic())
            await self.recorder.normal(
                ref,
                events.SLICE_HANDED_OVER,
                f"node pool {handover.pool} kept for slice {handover.holder.replica_index} "
                f"({handover.holder.replica_name}; it held {old.holder.replica_name} before)",
            )

    async def _unmark(self, snap: Snapshot, pools: Collection[str]) -> None:
        """Remove the pin mark of ``pools`` before their slice's pods are deleted: the
        replica KubeRay makes next is gated, not pinned to a unit being drained."""
        if self.fence is None:
            return
        reservations = self.pending.reservations(snap.reservations)
        for pool in dict.fromkeys(pools):
            r = reservations.get(pool)
            if r is not None and r.pinned:
                await self.fence.unmark(r)

    async def _pin_marks(
        self,
        ref: ClusterRef,
        spec: SliceClusterSpec,
        snap: Snapshot,
        plan: SlicePlan,
        index: PoolIndex,
        *,
        desired: int,
        enabled: bool,
    ) -> None:
        """Mark the reservations whose slices the webhook may pin at admission, and
        un-mark the rest (``planning.pinning.pin_marks``)."""
        if self.fence is None or spec.dynamic:
            return
        marks = pin_marks(
            ref,
            enabled=enabled,
            hosts=spec.shape.hosts,
            chips_per_host=spec.shape.chips_per_host,
            desired=desired,
            gang=spec.gang,
            pods=self.pending.pods(snap.pods),
            reservations=self.pending.reservations(snap.reservations),
            plan=plan,
            inventory=index,
        )
        for r in marks.unmark:
            await self.fence.unmark(r)
        for r in marks.mark:
            await self.fence.mark(r)

    async def _drain(self, ref: ClusterRef, drains: Sequence[Drain]) -> None:
        """Delete every pod of each disrupted slice in one go, with its grace period, so
        every host of the slice drains at once (a TPU slice is interrupted whole). The
        reservation stays until the pods are gone (then the slice's pool is freed as
        any slice without pods); the unit is not claimed while its signal lasts."""
        for drain in drains:
            for namespace, name in drain.pods:
                await self.kube.delete_pod(namespace, name, grace_seconds=drain.grace_seconds)
                self.pending.pod_deleted(namespace, name, time.monotonic())
            self.metrics.slice_disrupted(drain.reason)
            log.info(
                "%s %s: slice %s drained (%s): node %s %s",
                ref.kind,
                ref,
                drain.replica_name,
                drain.reason,
                drain.node,
                drain.signal,
            )
            await self.recorder.warning(
                ref,
                events.SLICE_DISRUPTED,
                f"slice {drain.index} ({drain.replica_name}) on {drain.pool} drained, "
                f"{len(drain.pods)} pods deleted together with grace {drain.grace_seconds}s "
                f"({drain.reason}): node {drain.node} {drain.signal}",
            )

    async def _force_delete(self, ref: ClusterRef, stuck: Sequence[ForceDelete]) -> None:
        """Delete with grace 0 the pods of drained slices that stay terminating on a host
        that is gone or tainted out-of-service (what Kubernetes' pod garbage collector
        does in the same two cases), so KubeRay can create the replacement replica."""
        for pod in stuck:
            await self.kube.delete_pod(pod.namespace, pod.name, grace_seconds=0)
            log.info(
                "%s %s: pod %s/%s force-deleted: node %s %s",
                ref.kind,
                ref,
                pod.namespace,
                pod.name,
                pod.node,
                pod.why,
            )
        nodes = sorted({p.node for p in stuck})
        await self.recorder.warning(
            ref,
            events.STUCK_PODS_DELETED,
            f"{len(stuck)} terminating pods deleted with grace 0: node(s) "
            f"{', '.join(nodes[:4])}{' ...' if len(nodes) > 4 else ''} gone or tainted "
            "node.kubernetes.io/out-of-service",
        )

    async def _move(self, ref: ClusterRef, moves: Sequence[Move], snap: Snapshot) -> None:
        """Take single-host slices off busy nodes: delete the slice's pods first (an
        unscheduled pod goes at once, and KubeRay recreates it gated), then the
        reservation, conditional on the uid the plan saw, so the released pod never
        finds the node free without a reservation behind it."""
        by_pool = self.pending.reservations(snap.reservations)
        for move in moves:
            for namespace, name in move.pods:
                await self.kube.delete_pod(namespace, name)
            held = by_pool.get(move.pool)
            if (
                held is not None
                and await self.let_go(held)
                and await self.kube.delete_reservation(move.pool, held.uid)
            ):
                self.pending.reservation_deleted(move.pool, time.monotonic(), held.uid)
            log.info(
                "%s %s: slice %s moves off node %s, which %s (its pod could not schedule "
                "for %.0fs)",
                ref.kind,
                ref,
                move.replica_name,
                move.pool,
                move.why,
                move.waited,
            )
            await self.recorder.warning(
                ref,
                events.SLICE_MOVED,
                f"slice {move.replica_name} leaves node {move.pool}: {move_message(move)}",
            )

    async def _free(
        self, ref: ClusterRef, pools: Sequence[str], snap: Snapshot, unit: CapacityUnit
    ) -> bool:
        """Delete the plan's frees, each conditional on the uid of the reservation the
        plan saw (indexed, or created by us and not indexed yet)."""
        by_pool = self.pending.reservations(snap.reservations)
        for pool in pools:
            held = by_pool.get(pool)
            if held is None or not await self.let_go(held):
                continue
            if await self.kube.delete_reservation(pool, held.uid):
                self.pending.reservation_deleted(pool, time.monotonic(), held.uid)
                replica = held.holder.replica_name
                log.info("%s %s: freed %s %s (slice %s)", ref.kind, ref, unit.noun, pool, replica)
                await self.recorder.normal(
                    ref,
                    events.SLICE_RELEASED,
                    f"released {unit.noun} {pool} (slice {replica} has no pods left)",
                )
        return bool(pools)

    async def _claim(
        self, ref: ClusterRef, spec: SliceClusterSpec, plan: SlicePlan, index: PoolIndex
    ) -> tuple[list[str], list[str]]:
        """Create the plan's reservations: the replicas now holding a pool, and the pools
        another holder had claimed first (their reservation is recorded as pending)."""
        held: list[str] = []
        lost: list[str] = []
        unit_shape = partition_slice_shape() if spec.dynamic else spec.shape
        for claim in plan.claims:
            body = reservation_body(
                claim.pool,
                claim.holder,
                gke_accelerator=spec.shape.generation.gke_accelerator,
                # a partition's claim is of the partition queue's shape (one 4x4x4
                # partition, 16 hosts), whatever the slice's topology
                accelerator_type=unit_shape.accelerator_type,
                topology=unit_shape.topology,
                hosts=unit_shape.hosts,
                node_pool=index.node_pool(claim.pool),
            )
            try:
                created = await self.kube.create_reservation(body)
            except ApiError as exc:
                if not exc.already_exists:
                    raise
                existing = reservation_info(await self.kube.get_reservation(claim.pool))
                self.pending.reservation_seen(existing, time.monotonic())
                if existing.holder == claim.holder:
                    held.append(claim.holder.replica_name)  # ours, from an earlier pass
                    continue
                lost.append(claim.pool)
                log.info(
                    "%s %s: %s %s claimed first by %s",
                    ref.kind,
                    ref,
                    index.unit.noun,
                    claim.pool,
                    existing.holder.describe(),
                )
                self.metrics.claims_lost.inc()
                await self.recorder.normal(
                    ref,
                    events.RESERVATION_LOST,
                    f"{index.unit.noun} {claim.pool} was claimed first by "
                    f"{existing.holder.describe()}; trying another",
                )
                continue
            self.pending.reservation_created(reservation_info(created), time.monotonic())
            held.append(claim.holder.replica_name)
            log.info(
                "%s %s: slice %s claimed %s %s",
                ref.kind,
                ref,
                claim.holder.replica_name,
                index.unit.noun,
                claim.pool,
            )
            await self.recorder.normal(
                ref,
                events.SLICE_RESERVED,
                f"slice {claim.holder.replica_index} ({claim.holder.replica_name}) "
                f"reserved {index.unit.noun} {claim.pool}",
            )
        return held, lost

    async def _release(
        self, releases: Sequence[PodRelease], annotations: Mapping[str, Mapping[str, str]]
    ) -> None:
        """Patch every pod of the slice(s) at once: the partly-released window is one RTT.
        A slice on a ProvisioningRequest's capacity gets its consume annotations too; a
        single-host slice's pod the time of its release (``planning.busy`` counts the
        time it cannot schedule from then)."""
        released_at = rfc3339(self.clock())

        async def one(release: PodRelease) -> None:
            notes = annotations.get(release.replica_name)
            if release.unit is CapacityUnit.NODE:
                notes = {**(notes or {}), c.ANNOTATION_RELEASED_AT: released_at}
            try:
                pin = release.unit.pin(release.pool)
                await self.kube.release_pod(release.namespace, release.name, pin, notes)
            except ApiError as exc:
                if exc.not_found:
                    return  # KubeRay deleted it; the slice is being replaced
                raise
            self.pending.pod_released(
                release.namespace, release.name, release.pool, time.monotonic()
            )
            log.info(
                "released pod %s/%s of slice %s to %s %s",
                release.namespace,
                release.name,
                release.replica_name,
                "GKE Slice" if release.unit is CapacityUnit.PARTITION else release.unit.noun,
                release.pool,
            )

        await asyncio.gather(*(one(r) for r in releases))

    async def _bind(self, pools: Sequence[str], unit: CapacityUnit) -> None:
        for pool in pools:
            if self.pending.is_bound(pool):
                continue  # sent by an earlier pass; the watch has not shown it yet
            try:
                await self.kube.set_reservation_phase(
                    pool, "Bound", f"every pod pinned to the {unit.noun}"
                )
            except ApiError as exc:
                if not exc.not_found:
                    raise
            self.pending.reservation_bound(pool, time.monotonic())
            log.info("%s %s bound: every pod of its slice pinned", unit.noun, pool)
