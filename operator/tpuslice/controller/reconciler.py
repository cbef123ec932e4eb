"""One level-based pass for every TPUSlice kind, as a short sequence of named steps.

A pass reads desired state (the spec) and actual state (the KubeRay object, pods,
nodes, reservations) from a snapshot of the indexes, acts on the difference
through named parts, and writes status only when it changed:

1. read the snapshot; an object in backoff waits (``queue.Backoff``);
2. parse the spec and render the KubeRay object (the kind's adapter);
3. apply it when needed (``applier.KubeRayApplier``);
4. plan and act on each of the kind's slice sets (``actuator.SliceActuator``), and
   give back the pools no slice set holds any more once their pods are gone;
5. write status and events (the kind's status, ``statuswriter.StatusWriter``).

What differs between kinds is the adapter's (``adapter.KindAdapter``: parse, render,
the owned object, the slice sets, the status); the pass is written once. A pass that
raises is reported on the object (a condition, a rate-limited event) and retried
with backoff. The only memory kept between passes is the record of our own
unconfirmed writes (``expectations.Expectations``) and caches; after a restart the
next pass decides from the API server's state alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tpuslice.controller.actuator import (
    PoolIndexCache,
    SliceActuator,
    SpecCache,
    claims_ahead,
    desired_of,
    gang_need,
    shape_of,
)
from tpuslice.controller.adapter import ActedSet, KindAdapter, SliceSet
from tpuslice.controller.applier import (
    Applied,
    KubeRayApplier,
    TemplateSchema,
    gate_held,
    kueue_managed,
)
from tpuslice.controller.capacity import Provisioner
from tpuslice.controller.cluster import ClusterKind
from tpuslice.controller.expectations import Expectations
from tpuslice.controller.kueue import provisioning_checks, read_workload
from tpuslice.controller.pinning import PinFence
from tpuslice.controller.queue import Backoff, Failure, KickQueue, PassSlots
from tpuslice.controller.recorder import Recorder
from tpuslice.controller.statuswriter import StatusWriter, fold_windows, generation
from tpuslice.model import constants as c
from tpuslice.model import events
from tpuslice.model.convert import pass_inputs
from tpuslice.model.records import (
    CapacityUnit,
    ClusterRef,
    Drain,
    GangMode,
    NodeInfo,
    ObjectKey,
    Shape,
    SlicePlan,
    SliceState,
    Snapshot,
)
from tpuslice.planning.accounting import (
    MAINTENANCE_CONDITION,
    UnitNodes,
    maintenance_condition,
    with_disruptions,
    with_maintenance,
)
from tpuslice.planning.busy import avoided_nodes, busy_nodes_status
from tpuslice.planning.groups import GroupHold, claims_wait_on, gang_whole
from tpuslice.planning.partitions import partition_inventory, partitions_needed
from tpuslice.planning.pools import PoolIndex, held_pin
from tpuslice.planning.queue import not_enough_message, shape_name
from tpuslice.policy.rules import check_object, effective_priority, facts_of
from tpuslice.policy.selection import governing
from tpuslice.runtime.kube import ApiError, ClusterApi
from tpuslice.runtime.logcontext import current_object
from tpuslice.runtime.metrics import Metrics
from tpuslice.spec.bounds import SpecLimits
from tpuslice.spec.limits import check_limits, controller_errors
from tpuslice.spec.parts import SliceClusterSpec, SpecError
from tpuslice.spec.slices import parse_slice_parts
from tpuslice.status.conditions import MAX_MESSAGE, Stall, truncate
from tpuslice.status.kueue import PodsReadyTimeouts, pods_ready_deadline, provisioning_conflict

__all__ = [
    "Reconciler",
    "SnapshotReader",
    "created_only",
    "error_text",
    "gang_claims_message",
    "gang_release_message",
    "policy_stall",
    "spec_shape",
    "spec_shapes",
]

log = logging.getLogger(__name__)

#: The Stalled reasons of an apply the API server or the applier refused: no pods follow.
APPLY_STALLS = frozenset(
    {events.RAYCLUSTER_NAME_TAKEN, events.APPLY_REJECTED, events.KUBERAY_NOT_INSTALLED}
)

SnapshotReader = Callable[[ObjectKey], Snapshot]


def spec_shape(cluster: Mapping[str, Any]) -> Shape | None:
    """The shape of a TPUSliceCluster's, TPUSliceJob's or TPUSliceService's slices."""
    try:
        return shape_of(parse_slice_parts(cluster))
    except SpecError:
        return None


def spec_shapes(cluster: Mapping[str, Any]) -> tuple[Shape, ...]:
    """The shapes of every TPU group of an object of any kind (one for the one-group
    form; () when the spec cannot be parsed): the queues its slices wait in."""
    try:
        groups = parse_slice_parts(cluster).tpu_groups()
    except SpecError:
        return ()
    return tuple(dict.fromkeys(shape_of(g) for g in groups))


#: A policy refusal names at most this many refusals (the rest are counted).
MAX_REFUSALS_SHOWN = 3


def policy_stall(snap: Snapshot, parsed: Any) -> Stall | None:
    """The TPUSlicePolicy refusals of a parsed spec (``policy.rules.check_object``) as one
    stall (reason PolicyDenied or PolicyViolation), or None when allowed or no policy
    exists. The numeric priority is clamped, not refused; namespace limits make the object
    wait (``SliceActuator.act``), they are no refusal."""
    if not snap.policies:
        return None
    refusals = check_object(snap.policies, snap.namespace_labels, facts_of(parsed))
    if not refusals:
        return None
    shown = "; ".join(str(r) for r in refusals[:MAX_REFUSALS_SHOWN])
    if len(refusals) > MAX_REFUSALS_SHOWN:
        shown += f"; and {len(refusals) - MAX_REFUSALS_SHOWN} more"
    return Stall(refusals[0].reason, truncate(shown, MAX_MESSAGE))


def pinned_stall(snap: Snapshot, spec: SliceClusterSpec) -> Stall | None:
    """An ungated object pinning its workers onto capacity a reservation holds
    (``planning.pools.held_pin``) is refused: its pods would share chips with the
    holder's slice."""
    if spec.gated:
        return None
    why = held_pin(spec.worker.template, snap.reservations)
    return Stall(events.PINNED_TO_HELD, why) if why else None


def _in_gang(each: SliceSet) -> bool:
    """Whether a slice set is a TPU group of its object's gang across groups."""
    spec = each.spec
    return bool(each.ref.group) and spec.gated and spec.joined and spec.gang == GangMode.ALL_SLICES


def gang_claims_message(earlier: GroupHold) -> str:
    """Why a gang's group does not claim yet: an earlier group in the claim order."""
    return (
        f"waiting for group {earlier.group} ({shape_name(earlier.shape)}) to hold all "
        f"{earlier.desired} of its slices (holds {earlier.held}): the groups of one gang "
        "claim their shapes in one order, so two gangs never wait on each other"
    )


def gang_release_message(holds: Sequence[GroupHold]) -> str:
    """Why a gang's slices stay gated: the groups that do not hold all their slices."""
    short = [f"{g.group} holds {g.held} of {g.desired}" for g in holds if not g.whole]
    return (
        "released when every group of the gang holds all its slices ("
        + ("; ".join(short) or "all do now")
        + ")"
    )


def error_text(exc: BaseException) -> str:
    """One bounded line for a failed pass: what a user reads in the condition."""
    if isinstance(exc, ApiError):
        text = f"API server answered {exc.status} {exc.reason}: {exc.message}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return truncate(" ".join(text.split()), 1024)


#: Slice states that wait for a pool of the shape (kicked when its pools change): a
#: Provisioning slice claims the pool its request brings once the nodes are Ready.
WAITING_STATES = (SliceState.WAITING_FOR_CAPACITY, SliceState.PROVISIONING)


def waiting_for_capacity(plan: SlicePlan) -> bool:
    """A plan with a slice waiting for a pool of its shape (or NotEnoughPools)."""
    return bool(plan.stalled) or any(s.state in WAITING_STATES for s in plan.slices)


def _busy_nodes_kept(status: dict[str, Any], previous: Mapping[str, Any]) -> dict[str, Any]:
    """A status computed without acting (an invalid or refused spec) keeps the busy nodes
    and the disruption totals the object remembers: they are read back from status by
    the next pass."""
    kept = dict(status)
    for name in ("busyNodes", "disruptions"):
        if name in previous and name not in kept:
            kept[name] = previous[name]
    return kept


def created_only(owned: Mapping[str, Any] | None, applied: Applied, snap: Snapshot) -> bool:
    """Whether a pass ends once it has created the object's KubeRay object, leaving the
    rest (Kueue's Workload, planning each slice set, giving back, status) to its
    follow-up (``KickQueue.follow_up``, at once, in its own lane behind first passes).

    Planning the slice sets is most of a pass (every pool of the shape is classified
    for the queue), and in a burst of creates every first pass waited for the whole
    passes of the objects created before it, so KubeRay started seconds late. Nothing
    is lost by waiting for the follow-up: the apply was sent and answered (not a
    stall, not the applied digest of an earlier pass), the watch shows no KubeRay object
    and no pod of the object (KubeRay makes the pods after the object exists; their
    scheduling gates are in the rendered template, not in what the plan does), so there
    is nothing to claim, release or give back yet; the status write that the first pass
    would make is made by the follow-up instead (no extra write). A crash in between
    leaves the object to the pass every object gets at start-up. An object whose slices
    are pinned at admission does not end here (the caller checks): its plan marks the
    units its pods are pinned to, so it runs right after the apply as it always did."""
    return owned is None and applied.sent and applied.ok and applied.stall is None and not snap.pods


def failure_message(failure: Failure) -> str:
    count = failure.count
    return truncate(
        f"reconcile failed {count} time{'s' * (count != 1)} in a row, next attempt in "
        f"{failure.delay:.0f}s: {failure.error}",
        MAX_MESSAGE,
    )


@dataclass
class Reconciler:
    """The parts of the shell wired together, and the one pass that uses them for the
    objects of one kind (``adapter``: what the kind says; ``kinds.KINDS``).

    Reconcilers of different kinds share ``pending`` and ``pool_indexes`` (one record
    of our writes, one index of the pools per process)."""

    kube: ClusterApi
    read: SnapshotReader
    metrics: Metrics = field(default_factory=Metrics)
    pending: Expectations = field(default_factory=Expectations)
    pool_indexes: PoolIndexCache = field(default_factory=PoolIndexCache)
    backoff: Backoff = field(default_factory=Backoff)
    schema: TemplateSchema | None = None  # shared between kinds when given
    adapter: KindAdapter = field(default_factory=ClusterKind)
    #: The slices and hosts one object may ask for (the operator's setting).
    limits: SpecLimits = field(default_factory=SpecLimits)
    #: the bound on passes at once, shared by every kind's reconciler
    slots: PassSlots = field(default_factory=PassSlots)
    #: Kueue's waitForPodsReady timeouts as the operator is told them (the status says
    #: when Kueue evicts an admitted object whose pods are not all ready).
    pods_ready: PodsReadyTimeouts = field(default_factory=PodsReadyTimeouts)
    #: pin at admission's fence and marks, shared by every kind (None: a fence of its own,
    #: off)
    fence: PinFence | None = None
    #: ``--status-batch-seconds``: how long a status change that flips no condition may
    #: wait for the next (0: a moment; ``statuswriter.fold_windows``)
    status_batch_seconds: float = 0.0
    _waiting: dict[Shape, set[ObjectKey]] = field(default_factory=dict)
    _waiting_since: dict[ObjectKey, float] = field(default_factory=dict)  # the queue metric
    _applied_once: set[ObjectKey] = field(default_factory=set)  # for the creation metric
    #: each object's ``convert.pass_inputs`` as of its last event (``inputs_changed``)
    _inputs: dict[ObjectKey, tuple[Any, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.queue = KickQueue(self.run_pass, self.slots)
        self.recorder = Recorder(self.kube)
        if self.schema is None:
            self.schema = TemplateSchema(self.kube)
        self.templates: TemplateSchema = self.schema
        self.applier = KubeRayApplier(self.kube, self.pending, self.templates)
        self.actuator = SliceActuator(
            self.kube,
            self.pending,
            self.recorder,
            self.metrics,
            self.pool_indexes,
            specs=SpecCache(limits=self.limits),
        )
        self.actuator.kick_later = self.queue.kick_later
        if self.fence is None:
            self.fence = PinFence(self.kube, self.pending, kick_later=self.queue.kick_later)
        self.actuator.fence = self.fence
        self.actuator.provisioner = Provisioner(
            self.kube,
            self.recorder,
            self.pending,
            kick_later=self.queue.kick_later,
            fence=self.fence,
        )
        quiet, at_most = fold_windows(self.status_batch_seconds)
        self.status = StatusWriter(
            self.kube,
            self.recorder,
            self.queue.kick_later,
            fold_quiet_seconds=quiet,
            fold_max_seconds=at_most,
            kind=self.kind,
        )

    @property
    def kind(self) -> str:
        """The kind of object this reconciler's passes are for."""
        return self.adapter.kind

    # ------------------------------------------------------------ what handlers call
    async def kick(self, key: ObjectKey) -> None:
        await self.queue.kick(key)

    def kick_soon(self, keys: Iterable[ObjectKey], releasing: bool = False) -> None:
        self.queue.kick_soon(keys, releasing=releasing)

    def hold_until_indexed(self) -> None:
        self.queue.hold_until_indexed()

    def indexed(self) -> None:
        self.queue.indexed()

    def nodes_changed(self, shape: Shape) -> None:
        self.pool_indexes.nodes_changed(shape)

    def waiting_for(self, shape: Shape) -> set[ObjectKey]:
        """Clusters with a slice waiting for capacity of this shape (kick them on changes)."""
        return set(self._waiting.get(shape, ()))

    def inputs_changed(self, key: ObjectKey, body: Mapping[str, Any]) -> bool:
        """Whether the object's event changed what a pass reads of it (remembered for
        the next event)."""
        now = pass_inputs(body)
        before = self._inputs.get(key)
        self._inputs[key] = now
        return before != now

    def forget(self, key: ObjectKey, uid: str = "") -> None:
        """A cluster is gone: drop what is kept of it (``uid`` also drops its parsed specs,
        kept for the shape's queue)."""
        self.status.forget(key)
        self.slots.forget(key)
        if uid:
            self.actuator.specs.forget(uid)
        self._applied_once.discard(key)
        self._inputs.pop(key, None)
        self.backoff.succeeded(key)
        self.metrics.forget_cluster(key)
        self._waiting_since.pop(key, None)
        for keys in self._waiting.values():
            keys.discard(key)

    # ------------------------------------------------------------ one pass
    async def run_pass(self, key: ObjectKey) -> None:
        """One pass over ``key``; never raises (a failure is reported and backed off).
        Every line logged during the pass names the object (``runtime.logcontext``)."""
        named = current_object.set("/".join(key))
        try:
            await self._run_pass(key)
        finally:
            current_object.reset(named)

    async def _run_pass(self, key: ObjectKey) -> None:
        began = time.perf_counter()
        snap: Snapshot | None = None
        try:
            versions = self.pool_indexes.versions()  # with the snapshot, no await between
            snap = replace(self.read(key), node_versions=versions)
            if snap.cluster is not None:
                wait = self.backoff.wait(key, generation(snap.cluster), time.monotonic())
                if wait > 0:
                    self.queue.kick_later(key, wait)
                    return
            await self._reconcile(key, snap)
        except Exception as exc:
            self.metrics.reconciled(time.perf_counter() - began, ok=False)
            await self._failed(key, snap.cluster if snap else None, exc)
            return
        self.metrics.reconciled(time.perf_counter() - began, ok=True)
        self.backoff.succeeded(key)

    async def _reconcile(self, key: ObjectKey, snap: Snapshot) -> None:
        body = snap.cluster
        if body is None:
            self.forget(key)
            return
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            return  # the finalizer handler tears down; applying now would recreate
        kind = self.adapter
        ref = ClusterRef.of(body, kind.kind)
        previous = self.status.previous(key, body)
        try:
            parsed = kind.parse(body)
            check_limits(kind.cluster_spec(parsed), self.limits)
            if unsupported := controller_errors(kind.cluster_spec(parsed)):
                raise SpecError(unsupported)
            refused = policy_stall(snap, parsed) or pinned_stall(snap, kind.cluster_spec(parsed))
            rendered = None if refused else kind.render(parsed, await self.templates.get())
        except SpecError as exc:
            invalid = Stall(events.INVALID_SPEC, str(exc))
            out = kind.invalid_status(body, invalid, previous, self.status.now())
            kept = _busy_nodes_kept(out.status, previous)
            await self.status.write_status(body, previous, kept, out.slices)
            return
        if refused is not None or rendered is None:
            why = refused or Stall(events.INVALID_SPEC, "nothing rendered")
            await self._refused(key, ref, body, snap, kind.cluster_spec(parsed), why, previous)
            return
        owned = kind.owned(snap)
        gate = self._admission_gate(kind.cluster_spec(parsed), snap, owned)
        first: tuple[list[ActedSet], Stall | None] | None = None
        read = (
            await self.applier.read_name(rendered, owned)
            if self._claims_first(kind.kind, kind.cluster_spec(parsed), rendered, owned, previous)
            else None
        )
        if read is not None and not read.taken:
            # pin at admission: each index's unit claimed and marked before the apply
            # that makes KubeRay create (or add) the replicas, so the webhook pins their
            # first pods; a pod that still comes first is gated and released as before
            first = await self._act(
                kind.slice_sets(ref, parsed, snap, previous),
                snap.policies,
                snap.namespace_labels,
                avoid=avoided_nodes(previous, self.actuator.clock()),
            )
        applied = await self.applier.apply(rendered, owned, admission_gate=bool(gate), read=read)
        if kind.counts_creation:
            self._count_creation(key, body, owned, applied)
        pins = any(self.actuator.pins_on(g) for g in kind.cluster_spec(parsed).tpu_groups())
        if not pins and created_only(owned, applied, snap):
            self.queue.follow_up(key)
            return
        self.pending.expire(time.monotonic())
        now = self.actuator.clock()
        snap, kueue_stall = await self._kueue(snap, kind.cluster_spec(parsed), rendered, owned)
        snap = replace(snap, admission_gate=gate)
        sets = kind.slice_sets(ref, parsed, snap, previous)
        if kueue_stall is not None:  # never two requests for one slice: Kueue's, ours
            sets = [replace(s, spec=replace(s.spec, provisioning=None)) for s in sets]
        if first is not None and applied.stall is None:
            acted, plan_stall = first
        else:
            # an apply that failed makes no pods: no unit is held ahead of them (the
            # units claimed before it are given back, through the fence)
            acted, plan_stall = await self._act(
                sets,
                snap.policies,
                snap.namespace_labels,
                avoid=avoided_nodes(previous, now),
                ahead=applied.stall is None,
            )
        live = {(each.slices.ref.ray_cluster, each.slices.ref.group) for each in acted}
        await self._give_back_unheld(ref, snap, live)
        waits = {shape_of(spec): False for spec in kind.cluster_spec(parsed).tpu_groups()}
        for each in acted:
            shape = shape_of(each.slices.spec)
            waits[shape] = waits.get(shape, False) or waiting_for_capacity(each.plan)
        if gate:  # held for free pools: passed again when the shape's pools change
            waits = dict.fromkeys(waits, True)
        self._track_waiting(key, waits)
        states = (str(s.state) for each in acted for s in each.plan.slices)
        self.metrics.cluster_slices(key, states)
        stall = applied.stall or kueue_stall or plan_stall
        out = kind.status(parsed, body, snap, acted, applied, stall, previous, self.status.now())
        moved = [m.pool for each in acted for m in each.plan.moves]
        busy = busy_nodes_status(previous, moved, now)
        if busy is not None:
            out.status["busyNodes"] = busy
        drains = [d for each in acted for d in each.plan.drains]
        by_cluster: dict[str, list[Drain]] = {}
        by_group: dict[tuple[str, str], list[Drain]] = {}
        for each in acted:  # a RayCluster's drains over all its groups, and each group's
            ref = each.slices.ref
            by_cluster.setdefault(ref.ray_cluster, []).extend(each.plan.drains)
            by_group.setdefault((ref.ray_cluster, ref.group), []).extend(each.plan.drains)
        status = with_maintenance(
            with_disruptions(out.status, previous, drains, now, by_cluster, by_group),
            self._unit_nodes(kind.cluster_spec(parsed), snap),
        )
        condition = maintenance_condition(status, previous, now, generation(body))
        if condition is not None:
            status["conditions"] = [
                *(
                    c
                    for c in status.get("conditions") or []
                    if c.get("type") != MAINTENANCE_CONDITION
                ),
                condition,
            ]
        await self.status.write_status(body, previous, status, out.slices)

    def _unit_nodes(self, spec: SliceClusterSpec, snap: Snapshot) -> UnitNodes:
        """The nodes of a status entry's unit, from the unit indexes of the object's
        shapes (``PoolIndexCache``: kept per shape until one of its nodes changes). A walk
        over the shape's nodes for each entry would make a restart's first passes O(N²)
        over a shape of N objects."""
        shapes = list(dict.fromkeys(shape_of(group) for group in spec.tpu_groups()))
        indexes: dict[tuple[Shape, CapacityUnit], PoolIndex] = {}

        def unit_nodes(entry: Mapping[str, Any]) -> Sequence[NodeInfo]:
            node = entry.get("node")
            unit = CapacityUnit.NODE if node else CapacityUnit.NODE_POOL
            name = str(node or entry.get("nodePool") or "")
            for shape in shapes:
                if (shape, unit) not in indexes:
                    indexes[(shape, unit)] = self.pool_indexes.index_or_build(shape, snap, unit)
                found = indexes[(shape, unit)].pools.get(name)
                if found:
                    return found
            return ()

        return unit_nodes

    def _claims_first(
        self,
        kind: str,
        spec: SliceClusterSpec,
        rendered: Mapping[str, Any],
        owned: Mapping[str, Any] | None,
        previous: Mapping[str, Any],
    ) -> bool:
        """Whether the pass acts on the slices before it applies the KubeRay object: with
        pin at admission, for an object every TPU group of which claims its units before
        its pods exist (``actuator.claims_ahead``), that Kueue does not admit (the live
        object may carry a queue label the spec does not: then its pods wait for Kueue,
        and the pass keeps its usual order), and whose last apply was not refused (a
        RayCluster name taken, a rejected template: no pods come, so nothing is held
        ahead of them until an apply succeeds)."""
        pins = self.fence is not None and self.fence.enabled
        groups = spec.tpu_groups()
        refused = any(
            cond.get("type") == "Stalled"
            and cond.get("status") == "True"
            and cond.get("reason") in APPLY_STALLS
            for cond in previous.get("conditions") or []
            if isinstance(cond, Mapping)
        )
        return (
            pins
            and bool(groups)
            and not refused
            and all(claims_ahead(g, kind=kind, pins=pins) for g in groups)
            and not kueue_managed(rendered, owned)
        )

    def _admission_gate(
        self, spec: SliceClusterSpec, snap: Snapshot, owned: Mapping[str, Any] | None
    ) -> str:
        """spec.kueue.admissionGate UntilPoolsFree: why the KubeRay object keeps the
        operator's gate in Kueue's admission-gated-by annotation ("" once it need not).
        Only at create or while the live object still carries it (the gate is never put
        back, and Kueue refuses adding it later); lifted once free node pools could hold
        every slice (``SliceActuator.pools_short``). Pools are not claimed before Kueue
        admits, so another object may take them between the lift and the claim."""
        if spec.kueue is None or spec.kueue.admission_gate != c.ADMISSION_GATE_POOLS_FREE:
            return ""
        if owned is not None and not gate_held(owned):
            return ""
        if owned is not None and (owned.get("spec") or {}).get("suspend") is not True:
            return ""  # admitted all the same (Kueue's AdmissionGatedBy gate is off)
        return self.actuator.pools_short(spec, snap)

    async def _kueue(
        self,
        snap: Snapshot,
        spec: SliceClusterSpec,
        rendered: Mapping[str, Any],
        owned: Mapping[str, Any] | None,
    ) -> tuple[Snapshot, Stall | None]:
        """For an object Kueue admits: the snapshot with the Workload of its KubeRay
        object, and with capacity on demand, a stall when a ProvisioningRequest admission
        check of its ClusterQueue would ask for the same TPU capacity (controller/kueue.py).
        Nothing is read for any other object."""
        if not kueue_managed(rendered, owned):
            return snap, None
        live = owned or {}
        workload = pods_ready_deadline(
            await read_workload(self.kube, spec.namespace, str(live.get("uid") or "")),
            self.pods_ready,
        )
        stall = None
        if spec.provisions:
            queue = (
                spec.kueue.queue_name
                if spec.kueue is not None
                else str((live.get("labels") or {}).get(c.KUEUE_QUEUE_LABEL) or "")
            )
            checks = await provisioning_checks(self.kube, spec.namespace, queue)
            if problem := provisioning_conflict(checks):
                stall = Stall(events.KUEUE_PROVISIONING_CHECK, problem)
        return replace(snap, workload=workload), stall

    async def _refused(
        self,
        key: ObjectKey,
        ref: ClusterRef,
        body: Mapping[str, Any],
        snap: Snapshot,
        spec: SliceClusterSpec,
        stall: Stall,
        previous: Mapping[str, Any],
    ) -> None:
        """A TPUSlicePolicy refuses the object: Stalled naming the policy, field and limit
        (an Event on the transition), nothing rendered or applied, nothing claimed. What
        an object admitted earlier already has stays (its KubeRay object, its pools and
        released pods), except pools whose slices have no pods left, given back as
        usual; it waits in no queue."""
        await self._give_back_unheld(ref, snap, set())
        self._track_waiting(key, {shape_of(group): False for group in spec.tpu_groups()})
        out = self.adapter.invalid_status(body, stall, previous, self.status.now())
        kept = _busy_nodes_kept(out.status, previous)
        await self.status.write_status(body, previous, kept, out.slices)

    async def _act(
        self,
        slice_sets: Iterable[SliceSet],
        policies: Sequence[Any] = (),
        labels: Mapping[str, str] | None = None,
        avoid: frozenset[str] = frozenset(),
        ahead: bool = True,
    ) -> tuple[list[ActedSet], Stall | None]:
        """Each slice set planned and acted on; the first stall any of them revealed. The
        priority each queues at is clamped into the governing TPUSlicePolicies' range;
        ``avoid``, the nodes the object found busy (status.busyNodes), is every set's.

        The TPU groups of a gang across groups (``SliceClusterSpec.gang_groups``) act in
        the claim order of ``planning.groups``: a group claims only once every earlier
        group holds all its slices, and no group's pods are released until every group
        does; the pass that completes the gang acts on its groups once more to release
        them. A TPUSliceService's RayClusters are each a gang of their own. Other slice
        sets (CPU groups have none) act on their own. ``ahead`` False: no unit is claimed
        (or kept) for a replica index without pods (``actuator.claims_ahead``)."""
        sets = list(slice_sets)
        # one gang per RayCluster (a TPUSliceService's active and pending ones apart)
        by_cluster: dict[str, list[SliceSet]] = {}
        for each in sets:
            if _in_gang(each):
                by_cluster.setdefault(each.ref.ray_cluster, []).append(each)
        gangs = [
            sorted(members, key=lambda each: (shape_of(each.spec), each.spec.group_name))
            for members in by_cluster.values()
            if len(members) > 1
        ]
        gang_of = {id(each): gang for gang in gangs for each in gang}
        ordered = [each for gang in gangs for each in gang]
        ordered += [each for each in sets if id(each) not in gang_of]
        governed = governing(policies, labels or {}) if policies else ()
        whole_before = {id(gang): gang_whole(self._holds(gang)) for gang in gangs}
        released = {
            id(gang): any(not p.gated for each in gang for p in each.snap.pods) for gang in gangs
        }
        # A group that can never get its units (more slices than its shape has) keeps the
        # whole gang from completing: no group claims, and one that never ran gives back.
        never = {
            id(each): why for gang in gangs for each in gang if (why := self._never_fits(each))
        }

        async def act(each: SliceSet, *, release: bool) -> tuple[SlicePlan, Stall | None]:
            spec = each.spec
            if governed:
                spec = replace(spec, priority=effective_priority(governed, spec.priority).value)
            claims_wait, releases_wait, give_back = "", "", False
            desired = each.desired
            gang = gang_of.get(id(each))
            if gang is not None:
                holds = self._holds(gang)
                if not gang_whole(holds) and not released[id(gang)]:
                    # an elastic group's slices above its minimum wait for the gang's
                    # first start: no pool is held for an extra while the minimums are
                    # not (a running gang's extras keep theirs while a slice is replaced)
                    desired = self._gang_need(each)
                short = [never[id(g)] for g in gang if id(g) in never]
                if short:  # a group that never fits says NotEnoughPools in its own plan
                    claims_wait = "" if id(each) in never else short[0]
                elif (earlier := claims_wait_on(holds, spec.group_name)) is not None:
                    claims_wait = gang_claims_message(earlier)
                give_back = bool(claims_wait) and not released[id(gang)]
                if not release:
                    releases_wait = gang_release_message(holds)
            return await self.actuator.act(
                each.ref,
                spec,
                each.snap,
                each.previous,
                desired_slices=desired,
                keep_pools=each.keep_pools,
                avoid=avoid,
                claims_wait=claims_wait,
                releases_wait=releases_wait,
                give_back=give_back,
                ahead=ahead,
            )

        plans: dict[int, tuple[SlicePlan, Stall | None]] = {}
        for each in ordered:
            gang = gang_of.get(id(each))
            release = gang is None or whole_before[id(gang)]
            plans[id(each)] = await act(each, release=release)
        for gang in gangs:
            if not whole_before[id(gang)] and gang_whole(self._holds(gang)):
                for each in gang:  # every group holds all its slices now: release them
                    plans[id(each)] = await act(each, release=True)
        acted: list[ActedSet] = []
        stall: Stall | None = None
        for each in sets:
            plan, plan_stall = plans[id(each)]
            acted.append(ActedSet(each, plan))
            stall = stall or plan_stall
        return acted, stall

    def _holds(self, gang: Sequence[SliceSet]) -> list[GroupHold]:
        """Each gang group's wanted slices and the pools its live slices hold, from the
        pods and reservations as this operator's writes left them (``Expectations``)."""
        out: list[GroupHold] = []
        for each in gang:
            desired = self._gang_need(each)
            live = {
                name
                for p in self.pending.pods(each.snap.pods)
                if not p.deleting
                for name in p.slice_names
            }
            held = sum(
                1
                for r in each.ref.own(self.pending.reservations(each.snap.reservations))
                if r.holder.replica_name in live
            )
            out.append(GroupHold(each.spec.group_name, shape_of(each.spec), desired, held))
        return out

    @staticmethod
    def _desired(each: SliceSet) -> int:
        assert each.snap.cluster is not None
        return desired_of(each.snap.cluster, each.spec) if each.desired is None else each.desired

    @classmethod
    def _gang_need(cls, each: SliceSet) -> int:
        """The slices a group holds in the gang across groups: all of a fixed group's, an
        elastic group's minimum (``gang_need``); the slices above it are extras its own
        plan claims one by one once the gang is whole (``planning.elastic``)."""
        return gang_need(cls._desired(each), each.spec)

    def _never_fits(self, each: SliceSet) -> str:
        """Why a gang group can never hold its slices (more than its shape's units exist,
        the NotEnoughPools of queue rule 2), or ""."""
        spec = each.spec
        shape = shape_of(spec)
        if spec.dynamic:
            # in partitions: every partition of the accelerator, its need per slice
            unit = CapacityUnit.PARTITION
            exist = len(partition_inventory(each.snap.nodes))
            desired = self._gang_need(each) * partitions_needed(spec.shape.chips)
        else:
            unit = CapacityUnit.for_hosts(spec.shape.hosts)
            index = self.pool_indexes.index_or_build(shape, each.snap, unit)
            desired, exist = self._gang_need(each), len(index.matching)
        if desired <= exist:
            return ""
        return (
            f"group {spec.group_name} "
            + not_enough_message(
                shape=shape_name(shape),
                desired=desired,
                exist=exist,
                gang=spec.gang,
                noun=unit.noun,
            )
            + ", so no group of the gang claims"
        )

    async def _give_back_unheld(
        self, ref: ClusterRef, snap: Snapshot, live: set[tuple[str, str]]
    ) -> None:
        """Delete the object's reservations that no slice set of this pass holds, by
        (RayCluster, group) (a TPUSliceService's RayCluster KubeRay deleted after an
        upgrade, or the one it replaced; a TPU group removed from spec.workerGroups)
        once no pod of theirs is left: no pass plans for them any more. The pods of a TPU
        group removed from spec.workerGroups are deleted first: KubeRay leaves the pods of
        a worker group that is gone from its RayCluster running (ray-project/kuberay#5132,
        #5142 are open), so they would hold their units for ever."""
        await self._delete_removed_groups(ref, snap, live)
        with_pods = {n for p in snap.pods for n in p.slice_names}
        gone = [
            r
            for r in self.pending.reservations(snap.reservations).held_by(ref.uid)
            if (r.holder.ray_cluster, r.holder.group) not in live
            and r.holder.replica_name not in with_pods
        ]
        for r in gone:
            if await self.actuator.let_go(r) and await self.kube.delete_reservation(r.pool, r.uid):
                self.pending.reservation_deleted(r.pool, time.monotonic(), r.uid)
                what = (
                    f"group {r.holder.group} is gone from spec.workerGroups"
                    if r.holder.group and not r.holder.ray_cluster
                    else f"RayCluster {r.holder.ray_cluster or '?'} is gone"
                )
                await self.recorder.normal(
                    ref, events.SLICE_RELEASED, f"released node pool {r.pool} ({what})"
                )

    async def _delete_removed_groups(
        self, ref: ClusterRef, snap: Snapshot, live: set[tuple[str, str]]
    ) -> None:
        """Delete the live pods of held slices whose TPU group is gone from the spec while
        their RayCluster is still planned (not a refused object's: it keeps what it has)."""
        clusters = {cluster for cluster, _ in live}
        removed = {
            (r.holder.group, r.holder.replica_name)
            for r in self.pending.reservations(snap.reservations).held_by(ref.uid)
            if r.holder.group
            and r.holder.ray_cluster in clusters
            and (r.holder.ray_cluster, r.holder.group) not in live
        }
        if not removed:
            return
        doomed = [
            p
            for p in snap.pods
            if not p.deleting
            and any(p.group == group and replica in p.slice_names for group, replica in removed)
        ]
        for pod in doomed:
            await self.kube.delete_pod(pod.namespace, pod.name)
        for group in sorted({p.group for p in doomed}):
            await self.recorder.normal(
                ref,
                events.SLICE_TERMINATING,
                f"deleting the pods of group {group}: it is gone from spec.workerGroups "
                "(KubeRay leaves a removed group's pods running); its units are given back "
                "once they are gone",
            )

    def _count_creation(
        self,
        key: ObjectKey,
        body: Mapping[str, Any],
        owned: Mapping[str, Any] | None,
        applied: Applied,
    ) -> None:
        if applied.ok and owned is None and key not in self._applied_once:
            self._applied_once.add(key)  # an apply was sent and the RayCluster was missing
            created = (body.get("metadata") or {}).get("creationTimestamp", "")
            self.metrics.raycluster_created(created, time.time())

    def _track_waiting(self, key: ObjectKey, waits: Mapping[Shape, bool]) -> None:
        """Who waits for each shape (kicked when its pools change), and the queue metrics:
        ``waits`` says, for each shape of the object's TPU groups, whether one waits."""
        for shape, waiting_now in waits.items():
            waiting = self._waiting.setdefault(shape, set())
            if waiting_now:
                waiting.add(key)
            else:
                waiting.discard(key)
            self.metrics.shape_waiting(shape_name(shape), key, waiting_now)
        label = shape_name(next(iter(waits))) if waits else ""
        if any(waits.values()):
            self._waiting_since.setdefault(key, time.monotonic())
        else:
            since = self._waiting_since.pop(key, None)
            if since is not None:
                self.metrics.waited(label, time.monotonic() - since)

    async def _failed(
        self, key: ObjectKey, cluster: Mapping[str, Any] | None, exc: Exception
    ) -> None:
        """A pass raised: back off exponentially, say so on the object (a condition and a
        rate-limited event), and log the traceback once per distinct error."""
        failure = self.backoff.failed(key, generation(cluster), error_text(exc), time.monotonic())
        if failure.new_error:
            log.exception("reconcile of %s/%s/%s failed; retrying in %.0fs", *key, failure.delay)
        else:
            log.warning(
                "reconcile of %s/%s/%s failed again (%d in a row): %s; retrying in %.0fs",
                *key,
                failure.count,
                failure.error,
                failure.delay,
            )
        self.queue.kick_later(key, failure.delay)
        if cluster is None or (cluster.get("metadata") or {}).get("deletionTimestamp"):
            return
        message = failure_message(failure)
        try:
            await self.status.write_failure(key, cluster, message)
            if failure.event_due:
                ref = ClusterRef.of(cluster, self.kind)
                await self.recorder.warning(ref, events.RECONCILE_ERROR, message)
                self.backoff.event_posted(key, time.monotonic())
        except Exception as write_error:  # the API server may be what fails
            log.warning("could not report the failure on %s/%s/%s: %s", *key, write_error)
