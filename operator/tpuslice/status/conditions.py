"""Status of a TPUSliceCluster: conditions in kstatus convention, computed purely.

Flux, Argo CD and ``kubectl wait`` read these, so the rules are strict:
``Ready`` is False from the first pass until every slice runs on its reserved
pool and the RayCluster is ready; ``Reconciling`` is True while converging on
its own (including waiting for capacity that may free up); ``Stalled`` is True
only when a change from someone is needed; every condition carries the
generation it was computed for, and ``lastTransitionTime`` moves only when
``status`` flips. The caller writes the result only when it differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tpuslice.model import constants as c
from tpuslice.model import events
from tpuslice.model.records import KueueView, KueueWorkload, SliceState, SliceStatus

__all__ = [
    "KUEUE_ADMITTED",
    "MAX_MESSAGE",
    "MAX_SLICE_MESSAGE",
    "ElasticCount",
    "Stall",
    "as_requested",
    "compute_status",
    "elastic_slices",
    "elastic_status",
    "eviction_note",
    "failure_status",
    "index_ranges",
    "kueue_condition",
    "may_fold",
    "merge_conditions",
    "readiness",
    "readiness_text",
    "removal_events",
    "scaling_condition",
    "slice_events",
    "status_head",
    "timeout_condition",
    "truncate",
    "waiting_message",
]

READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"
SLICES_RESERVED = "SlicesReserved"
#: The condition each kind's status carries for an object Kueue admits (status/kueue.py).
KUEUE_ADMITTED = "KueueAdmitted"
#: An elastic set's: slices the Ray autoscaler asked for are not all Ready yet.
SCALING_UP = "ScalingUp"
#: An elastic set's: a slice it asked for waited past the autoscaler's allocate timeout.
SCALE_UP_TIMED_OUT = events.SCALE_UP_TIMED_OUT

#: Longest condition message written. The CRD allows 32,768 characters (and refuses the
#: whole status write beyond that); a message is read by people, so it summarises.
MAX_MESSAGE = 4096
#: Slices a condition message names one by one before it says "and N more".
MAX_NAMED = 8
#: Longest message of one entry of status.slices (there may be 4,096 entries).
MAX_SLICE_MESSAGE = 512
#: Characters of status.slices[].message in all, so the status of a 4,096-slice cluster
#: stays far from the API server's request and etcd's object limits; later entries
#: carry no message (the conditions still summarise them).
SLICE_MESSAGES_BUDGET = 65536

# The order in which a not-ready slice explains the cluster's Ready=False.
_BLOCKING_ORDER = (
    SliceState.AWAITING_ADMISSION,
    SliceState.WAITING_FOR_CAPACITY,
    SliceState.REQUESTED,
    SliceState.PROVISIONING,
    SliceState.PENDING,
    SliceState.RESERVED,
    SliceState.RELEASING,
    SliceState.SCHEDULED,
)


@dataclass(frozen=True)
class Stall:
    """A reason the cluster cannot converge without someone changing something."""

    reason: str
    message: str


@dataclass(frozen=True)
class ElasticCount:
    """An elastic set's range and the target the Ray autoscaler set (its RayCluster's
    ``replicas`` clamped to the range): what ``status.elastic`` reports."""

    min_slices: int
    max_slices: int
    target: int
    #: slices (index, replica) a pod of which the autoscaler named in workersToDelete
    removing: tuple[tuple[int, str], ...] = ()
    #: Requested slices past the autoscaler's allocate timeout: (index, waiting since,
    #: RFC 3339; a time, not a duration, so a repeated pass writes the same status)
    timed_out: tuple[tuple[int, str], ...] = ()
    #: the timeout they are judged by (spec.elastic.scaleUpTimeoutSeconds or Ray's default)
    timeout_seconds: int = c.AUTOSCALER_ALLOCATE_TIMEOUT_DEFAULT_SECONDS


def elastic_slices(
    name: str,
    desired: int,
    slices: Sequence[SliceStatus],
    ray_cluster_ready: bool,
    elastic: tuple[int, int] | None,
) -> ClusterSlices:
    """One RayCluster's slices; for an elastic set (``elastic`` its min and max) with the
    range, the target ``desired`` and the waiting extras shown as Requested."""
    if elastic is None:
        return ClusterSlices(name, desired, slices, ray_cluster_ready=ray_cluster_ready)
    low, high = elastic
    return ClusterSlices(
        name,
        desired,
        as_requested(slices, low),
        ray_cluster_ready=ray_cluster_ready,
        elastic=ElasticCount(low, high, desired),
    )


def as_requested(slices: Sequence[SliceStatus], minimum: int) -> list[SliceStatus]:
    """An elastic set's slices with those above its ``minimum`` that wait for capacity
    shown as Requested: the autoscaler asked for them, and the set is Ready without them."""
    return [
        replace(s, state=SliceState.REQUESTED)
        if s.index >= minimum and s.state == SliceState.WAITING_FOR_CAPACITY
        else s
        for s in slices
    ]


@dataclass(frozen=True, kw_only=True)
class ObservedObject:
    """What the status of every TPUSlice kind depends on alike, gathered by the pass:
    each kind's record (``Observed``, ``job.JobObserved``, ``service.ServiceObserved``)
    adds what its KubeRay object says."""

    generation: int
    accelerator_type: str
    hosts_per_slice: int
    chips_per_host: int
    desired_slices: int  # spec.tpu.slices, or an elastic set's target
    gated: bool  # reservation.policy NodePool
    applied: bool  # the KubeRay object for this generation was applied (or needed no change)
    stall: Stall | None = None
    #: spec.elastic's range and the live target; None for a fixed count.
    elastic: ElasticCount | None = None
    #: Kueue's hold on the KubeRay object (status/kueue.py); None when Kueue has no part.
    kueue: KueueView | None = None


@dataclass(frozen=True, kw_only=True)
class Observed(ObservedObject):
    """Everything a TPUSliceCluster's status depends on."""

    ray_cluster: str
    slices: Sequence[SliceStatus]
    ray_cluster_ready: bool
    suspended: bool
    #: A grouped object's: whether every TPU group has enough slices Ready
    #: (``ready_enough`` of each); None for one group, judged from ``slices``.
    groups_ready: bool | None = None


def truncate(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    cut = max(0, limit - 40)
    return f"{text[:cut]} ... ({len(text) - cut} more characters)"[:limit]


def index_ranges(indices: Iterable[int], limit: int = 200) -> str:
    """``0-3, 7, 9-12`` for sorted or unsorted slice indices; at most about ``limit``
    characters, the rest counted (``... 4,000 in all``)."""
    ordered = sorted(set(indices))
    runs: list[tuple[int, int]] = []
    for i in ordered:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    parts: list[str] = []
    length = 0
    for first, last in runs:
        part = str(first) if first == last else f"{first}-{last}"
        if parts and length + len(part) + 2 > limit:
            return ", ".join(parts) + f", ... ({len(ordered):,} in all)"
        parts.append(part)
        length += len(part) + 2
    return ", ".join(parts)


def _condition(
    kind: str, status: bool, reason: str, message: str, generation: int
) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "observedGeneration": generation,
        "reason": reason,
        "message": truncate(message, MAX_MESSAGE),
    }


def _blocked_detail(blocked: Sequence[SliceStatus]) -> str:
    """Blocked slices grouped by message (thousands of waiting slices mostly share one),
    within MAX_MESSAGE: the groups that fit, then a count of the rest."""
    groups: dict[str, list[int]] = {}
    for s in blocked:
        groups.setdefault(truncate(s.message, MAX_SLICE_MESSAGE), []).append(s.index)
    parts: list[str] = []
    length, shown = 0, 0
    budget = MAX_MESSAGE - 200
    for message, indices in groups.items():
        who = f"slice {indices[0]}" if len(indices) == 1 else f"slices {index_ranges(indices)}"
        part = f"{who}: {message}" if message else who
        if parts and length + len(part) > budget:
            rest = len(blocked) - shown
            return "; ".join(parts) + f"; and {rest:,} more slice{'s' * (rest != 1)}"
        parts.append(part)
        length += len(part) + 2
        shown += len(indices)
    return "; ".join(parts)


def _not_ready_reason(observed: Observed) -> tuple[str, str]:
    for state in _BLOCKING_ORDER:
        blocked = [s for s in observed.slices if s.state == state]
        if blocked:
            detail = _blocked_detail(blocked)
            return str(
                state
            ), f"{len(blocked)} of {observed.desired_slices} slices {state}: {detail}"
    if not observed.ray_cluster_ready:
        return "RayClusterNotReady", f"RayCluster {observed.ray_cluster} is not ready yet"
    return "Reconciling", "converging"


def _ready_slices(observed: Observed) -> int:
    """Ready slices, at most the desired count (a replica KubeRay is about to remove on
    scale-down may still be ready)."""
    ready = sum(1 for s in observed.slices if s.state == SliceState.READY)
    return min(ready, observed.desired_slices)


def ready_enough(observed: Observed) -> bool:
    """Every wanted slice Ready; for an elastic set its minimum, so the autoscaler's
    scaling never turns Ready False; for a grouped object every group's own verdict."""
    if observed.groups_ready is not None:
        return observed.groups_ready
    ready = _ready_slices(observed)
    if observed.elastic is not None:
        return ready >= observed.elastic.min_slices
    return ready == observed.desired_slices


def scaling_condition(observed: Observed) -> dict[str, Any] | None:
    """ScalingUp of an elastic set: True while slices the autoscaler asked for are not
    Ready (reason SlicesRequested while some wait for capacity, else SlicesStarting),
    False at its target. None for a fixed count."""
    if observed.elastic is None:
        return None
    return _scaling(observed.slices, observed.desired_slices, observed.generation)


def _scaling(slices: Sequence[SliceStatus], target: int, generation: int) -> dict[str, Any]:
    ready = min(sum(1 for s in slices if s.state == SliceState.READY), target)
    if ready >= target:
        return _condition(
            SCALING_UP, False, "AtTarget", f"{ready} of {target} slices ready", generation
        )
    requested = [s for s in slices if s.state == SliceState.REQUESTED]
    if requested:
        return _condition(
            SCALING_UP,
            True,
            "SlicesRequested",
            f"the autoscaler asked for {target} slices, {ready} ready; {len(requested)} "
            f"Requested: {_blocked_detail(requested)}",
            generation,
        )
    return _condition(
        SCALING_UP,
        True,
        "SlicesStarting",
        f"the autoscaler asked for {target} slices, {ready} ready",
        generation,
    )


def timeout_condition(observed: ObservedObject) -> dict[str, Any] | None:
    """ScaleUpTimedOut of an elastic set: True while a Requested slice has waited longer
    than the autoscaler's allocate timeout (it gives the slice up and deletes its pods;
    asked again, the slice keeps the object's place in the queue), naming each slice
    and how long. None for a fixed count."""
    if observed.elastic is None:
        return None
    return _timeout(observed.elastic, observed.generation)


def _timeout(elastic: ElasticCount, generation: int) -> dict[str, Any]:
    limit = elastic.timeout_seconds
    if not elastic.timed_out:
        return _condition(
            SCALE_UP_TIMED_OUT,
            False,
            "WithinTimeout",
            f"no Requested slice waited longer than {limit} s",
            generation,
        )
    named = ", ".join(f"slice {i} (waiting since {t})" for i, t in elastic.timed_out[:MAX_NAMED])
    more = len(elastic.timed_out) - MAX_NAMED
    if more > 0:
        named += f" and {more} more"
    return _condition(
        SCALE_UP_TIMED_OUT,
        True,
        SCALE_UP_TIMED_OUT,
        f"waited for capacity longer than the autoscaler's {limit} s "
        f"(spec.elastic.scaleUpTimeoutSeconds): {named}; the Ray autoscaler gives "
        f"{'it' if len(elastic.timed_out) == 1 else 'them'} up and deletes the pods, "
        f"and a slice it asks for again keeps this object's place in the queue",
        generation,
    )


def _elastic_entry(elastic: ElasticCount, slices: Sequence[SliceStatus]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "minSlices": elastic.min_slices,
        "maxSlices": elastic.max_slices,
        "target": elastic.target,
        "intactSlices": sum(1 for s in slices if s.state == SliceState.READY),
    }
    if elastic.removing:
        entry["removing"] = [{"index": i, "replica": r} for i, r in elastic.removing]
    return entry


def removal_events(
    previous: Mapping[str, Any], status: Mapping[str, Any]
) -> list[tuple[str, str, str]]:
    """(type, reason, message) of SliceRemovedByAutoscaler, once per removed slice: a
    slice newly in ``status.elastic.removing`` (a pod of it named in workersToDelete),
    or one that vanished from ``status.slices`` while the target went down without
    ever being seen named (the operator was away while KubeRay deleted it). Read from
    the two statuses alone, so a pass repeated writes no second event. An elastic
    group's (status.groups[], by name) say which group."""
    out = _removals(previous, status) + _group_removals(previous, status)
    # a TPUSliceService's clusters, matched by name (an upgrade's pending cluster
    # becomes the active one)
    fields = ("activeCluster", "pendingCluster")
    earlier = {e.get("name"): e for f in fields if (e := previous.get(f))}
    for field in fields:
        after = status.get(field) or {}
        if after:
            before = earlier.get(after.get("name")) or {}
            out += _removals(before, after) + _group_removals(before, after)
    return out


def _group_removals(
    previous: Mapping[str, Any], status: Mapping[str, Any]
) -> list[tuple[str, str, str]]:
    """``removal_events`` of each elastic group's entry in ``status.groups``."""
    before = {g.get("name"): g for g in previous.get("groups") or [] if isinstance(g, Mapping)}
    return [
        (kind, reason, f"group {entry.get('name')}: {message}")
        for entry in status.get("groups") or []
        if isinstance(entry, Mapping) and entry.get("elastic")
        for kind, reason, message in _removals(before.get(entry.get("name")) or {}, entry)
    ]


def _removals(previous: Mapping[str, Any], status: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``removal_events`` of one slices-status part (crds/parts/slices-status.yaml)."""
    before = previous.get("elastic") or {}
    after = status.get("elastic") or {}
    if not after:
        return []
    seen = {(e.get("index"), e.get("replica")) for e in before.get("removing") or []}
    out = []
    for entry in after.get("removing") or []:
        key = (entry.get("index"), entry.get("replica"))
        if key not in seen:
            out.append(
                (
                    "Normal",
                    events.SLICE_REMOVED_BY_AUTOSCALER,
                    f"slice {key[0]} ({key[1]}): the Ray autoscaler named its pods in "
                    f"workersToDelete (target {after.get('target')}); KubeRay deletes the "
                    f"whole slice and its node pool is given back once its pods are gone",
                )
            )
    lowered = int(after.get("target", 0)) < int(before.get("target", 0))
    now = {s.get("replica") for s in status.get("slices") or []}
    for entry in previous.get("slices") or []:
        key = (entry.get("index"), entry.get("replica"))
        if lowered and key[1] and key[1] not in now and key not in seen:
            out.append(
                (
                    "Normal",
                    events.SLICE_REMOVED_BY_AUTOSCALER,
                    f"slice {key[0]} ({key[1]}) is gone: the Ray autoscaler lowered the "
                    f"target from {before.get('target')} to {after.get('target')}",
                )
            )
    return out


def elastic_status(observed: ObservedObject, slices: Sequence[SliceStatus]) -> dict[str, Any]:
    """status.elastic: the range, the autoscaler's target, and the intact slices (every
    host running and ready; a slice KubeRay is removing is not intact)."""
    assert observed.elastic is not None
    return _elastic_entry(observed.elastic, slices)


def readiness_text(ready: int, desired: int, elastic: ElasticCount | None) -> str:
    """``ready/desired``, and an elastic set's range: ``ready/target (min-max)``."""
    text = f"{ready}/{desired}"
    if elastic is not None:
        text += f" ({elastic.min_slices}-{elastic.max_slices})"
    return text


def readiness(ready: int, observed: ObservedObject) -> str:
    """The Slices printer column: ready/desired, and an elastic set's range."""
    return readiness_text(ready, observed.desired_slices, observed.elastic)


def desired_conditions(observed: Observed) -> list[dict[str, Any]]:
    """Conditions without timestamps; merge_conditions adds lastTransitionTime."""
    gen = observed.generation
    if observed.stall is not None:
        stall = observed.stall
        conditions = [
            _condition(READY, False, stall.reason, stall.message, gen),
            _condition(RECONCILING, False, stall.reason, "stalled; see Stalled", gen),
            _condition(STALLED, True, stall.reason, stall.message, gen),
        ]
    elif observed.suspended:
        conditions = [
            _condition(READY, False, "Suspended", "spec.suspend is true", gen),
            _condition(RECONCILING, False, "Suspended", "spec.suspend is true", gen),
            _condition(STALLED, False, "Suspended", "spec.suspend is true", gen),
        ]
    elif ready_enough(observed) and observed.ray_cluster_ready:
        message = f"{_ready_slices(observed)} of {observed.desired_slices} slices ready"
        if observed.elastic is not None:
            message += (
                f" (elastic {observed.elastic.min_slices}-{observed.elastic.max_slices}, "
                f"at least {observed.elastic.min_slices} needed)"
            )
        conditions = [
            _condition(READY, True, "Ready", message, gen),
            _condition(RECONCILING, False, "Ready", message, gen),
            _condition(STALLED, False, "Ready", message, gen),
        ]
    else:
        reason, message = _not_ready_reason(observed)
        conditions = [
            _condition(READY, False, reason, message, gen),
            _condition(RECONCILING, True, reason, message, gen),
            _condition(STALLED, False, reason, "converging", gen),
        ]
    if observed.gated and observed.stall is None and not observed.suspended:
        unreserved = [
            s.index for s in observed.slices if not s.node_pool and s.state != SliceState.RELEASING
        ]
        conditions.append(
            _condition(
                SLICES_RESERVED,
                not unreserved,
                "AllSlicesReserved" if not unreserved else "SlicesUnreserved",
                "every slice holds a node pool"
                if not unreserved
                else "slices without a node pool: " + index_ranges(unreserved),
                gen,
            )
        )
    scaling = scaling_condition(observed)
    if scaling is not None and observed.stall is None and not observed.suspended:
        conditions.append(scaling)
    timeout = timeout_condition(observed)
    if timeout is not None and observed.stall is None and not observed.suspended:
        conditions.append(timeout)
    if observed.kueue is not None:
        conditions.append(kueue_condition(observed.kueue, gen))
    return conditions


def merge_conditions(
    previous: Sequence[Mapping[str, Any]], desired: Sequence[Mapping[str, Any]], now: str
) -> list[dict[str, Any]]:
    """Keep lastTransitionTime when only reason/message changed."""
    before = {c.get("type"): c for c in previous}
    merged = []
    for cond in desired:
        old = before.get(cond["type"])
        same = old is not None and old.get("status") == cond["status"]
        stamp = old.get("lastTransitionTime", now) if same and old is not None else now
        merged.append({**cond, "lastTransitionTime": stamp})
    return merged


def status_head(previous: Mapping[str, Any], observed: ObservedObject) -> dict[str, Any]:
    """The first fields of every TPUSlice kind's status: ``observedGeneration`` (this
    generation once it was applied or judged, else the one before) and the slice shape."""
    judged = observed.applied or observed.stall is not None
    observed_generation = observed.generation if judged else previous.get("observedGeneration")
    head: dict[str, Any] = {}
    if observed_generation is not None:
        head["observedGeneration"] = observed_generation
    head.update(
        {
            "acceleratorType": observed.accelerator_type,
            "hostsPerSlice": observed.hosts_per_slice,
            "chipsPerHost": observed.chips_per_host,
        }
    )
    return head


def compute_status(
    observed: Observed, previous: Mapping[str, Any] | None, now: str
) -> dict[str, Any]:
    """The whole status stanza; identical input gives identical output (no spurious writes)."""
    previous = previous or {}
    ready = _ready_slices(observed)
    status = status_head(previous, observed)
    status.update(
        {
            "rayCluster": observed.ray_cluster,
            "desiredSlices": observed.desired_slices,
            "readySlices": ready,
            "sliceReadiness": readiness(ready, observed),
            "slices": _slice_entries(observed.slices),
            "conditions": merge_conditions(
                previous.get("conditions") or [], desired_conditions(observed), now
            ),
        }
    )
    if observed.elastic is not None:
        status["elastic"] = elastic_status(observed, observed.slices)
    return status


def _slice_entries(slices: Sequence[SliceStatus]) -> list[dict[str, Any]]:
    """status.slices, each message bounded and all messages together within a budget."""
    out = []
    budget = SLICE_MESSAGES_BUDGET
    for s in slices:
        entry = s.to_dict()
        if "message" in entry:
            message = truncate(str(entry["message"]), MAX_SLICE_MESSAGE)
            if len(message) > budget:
                del entry["message"]
            else:
                entry["message"] = message
                budget -= len(message)
        out.append(entry)
    return out


def failure_status(
    previous: Mapping[str, Any], generation: int, reason: str, message: str, now: str
) -> dict[str, Any]:
    """``previous`` with Ready/Reconciling/Stalled saying a pass failed (the operator
    retries by itself: Reconciling, not Stalled); every other field is kept, so
    observedGeneration still names the last generation fully applied."""
    conditions = [
        _condition(READY, False, reason, message, generation),
        _condition(RECONCILING, True, reason, message, generation),
        _condition(STALLED, False, reason, "retrying by itself", generation),
    ]
    ours = {c["type"] for c in conditions}
    kept = [c for c in previous.get("conditions") or [] if c.get("type") not in ours]
    merged = merge_conditions(previous.get("conditions") or [], conditions, now)
    return {**previous, "conditions": merged + kept}


def slice_events(
    previous: Sequence[Mapping[str, Any]], current: Sequence[SliceStatus]
) -> list[tuple[str, str, str]]:
    """(type, reason, message) for every slice whose state changed since the last status."""
    before = {(s.get("index"), s.get("replica")): s.get("state") for s in previous}
    out = []
    for s in current:
        if before.get((s.index, s.replica)) == str(s.state):
            continue
        reason = events.SLICE_STATE_REASONS.get(s.state)
        if reason is None:
            continue
        where = ""
        if s.node_pool and s.pool_of_node:
            where = f" on node {s.node_pool} (pool {s.pool_of_node})"
        elif s.node_pool:
            where = f" on node pool {s.node_pool}"
        text = f"slice {s.index} ({s.replica or 'not created'}) {s.state}{where}"
        if s.message:
            text += f": {s.message}"
        kind = "Warning" if s.state == SliceState.WAITING_FOR_CAPACITY else "Normal"
        out.append((kind, reason, text))
    return out


def _without_progress(status: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **status,
        "slices": [
            {k: v for k, v in s.items() if k not in ("readyHosts", "message")}
            for s in status.get("slices") or []
        ],
        "conditions": [
            {k: v for k, v in c_.items() if k != "message"} for c_ in status.get("conditions") or []
        ],
    }


def _verdict(status: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        status.get("observedGeneration"),
        tuple(
            sorted(
                # SlicesReserved turning True folds; turning False is ``_reserved_lost``
                (c_.get("type"), "" if c_.get("type") == SLICES_RESERVED else c_.get("status"))
                for c_ in status.get("conditions") or []
            )
        ),
        tuple(
            (s.get("index"), repr(s.get("provisioning")))
            for s in status.get("slices") or []
            if s.get("provisioning") is not None
        ),
        repr(status.get("busyNodes")),
    )


def may_fold(previous: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """True when ``status`` changes nothing a reader acts on: the same observedGeneration
    and every condition with the same status (True/False/Unknown), so kstatus, Argo CD
    and ``kubectl wait`` read it as before; only slice states, counts, reasons and
    messages moved. Such a write may wait a moment to fold with the next one (a slice
    going Reserved -> Scheduled -> Ready within a second is one write, not three); a
    flipped condition or a new generation is written at once. So is a change of any
    ``slices[].provisioning``: the operator reads the attempt and failure counts back
    from status (a request deleted by someone is followed by the next attempt, not a
    second attempt 1), so they are written with the request they describe; and so is a
    change of ``busyNodes``, read back to keep the next claims off a busy node.

    One flip folds: ``SlicesReserved`` turning True. It is progress on the way to Ready,
    not a verdict (kstatus reads Ready, Reconciling and Stalled, which a write flipping
    them carries at once, with whatever was held), and the slices' claims come a moment
    before their release and scheduling: written at once it was a status patch of its
    own on every object's way to Ready. Turning False (a slice lost its unit) is written
    at once."""
    return (
        previous != status
        and bool(previous)
        and _verdict(previous) == _verdict(status)
        and not _reserved_lost(previous, status)
    )


def _condition_status(status: Mapping[str, Any], kind: str) -> str:
    return next(
        (str(c_.get("status")) for c_ in status.get("conditions") or [] if c_.get("type") == kind),
        "",
    )


def _reserved_lost(previous: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """SlicesReserved was True and is no more: a slice lost its unit."""
    return (
        _condition_status(previous, SLICES_RESERVED) == "True"
        and _condition_status(status, SLICES_RESERVED) != "True"
    )


# ------------------------------------------- shared with job_status and service_status


@dataclass(frozen=True)
class ClusterSlices:
    """One RayCluster's slices as the reconcile observed them. A TPUSliceJob has one per
    attempt and a TPUSliceService one per upgrade, each made by KubeRay under its own
    name (``<owner>-<random>``), so status keys slices by that name."""

    name: str
    desired_slices: int
    slices: Sequence[SliceStatus]
    ray_cluster_ready: bool
    #: An elastic set's range and target; None for a fixed count.
    elastic: ElasticCount | None = None
    #: status.groups[] entries of a cluster of several worker groups (its slices are
    #: listed there, not in ``slices``); () for one group.
    groups: tuple[Mapping[str, Any], ...] = ()
    #: With an elastic group among them, every group's own verdict
    #: (``status.groups.groups_ready``); None: judged from ``slices``.
    groups_ready: bool | None = None

    @property
    def ready_slices(self) -> int:
        """Ready slices, at most the desired count."""
        return min(sum(1 for s in self.slices if s.state == SliceState.READY), self.desired_slices)

    @property
    def all_ready(self) -> bool:
        """Every wanted slice Ready; for an elastic set its minimum (scaling never makes
        the cluster not ready); with groups, each group's by its own rule."""
        if self.groups_ready is not None:
            return self.groups_ready
        if self.elastic is not None:
            return self.ready_slices >= self.elastic.min_slices
        return self.desired_slices > 0 and self.ready_slices == self.desired_slices

    def blocked(self) -> tuple[str, str] | None:
        """(state, message) of the slices that keep this cluster from being ready, in the
        order the TPUSliceCluster's Ready=False explains them; None when none is blocked
        (nor for an elastic set at its minimum: slices the autoscaler added and that wait
        show as Requested, and block nothing)."""
        if (self.elastic is not None or self.groups_ready is not None) and self.all_ready:
            return None
        for state in _BLOCKING_ORDER:
            blocked = [s for s in self.slices if s.state == state]
            if blocked:
                detail = _blocked_detail(blocked)
                return str(state), (
                    f"{len(blocked)} of {self.desired_slices} slices {state}: {detail}"
                )
        return None

    def elastic_conditions(self, generation: int) -> list[dict[str, Any]]:
        """ScalingUp and ScaleUpTimedOut of an elastic set's RayCluster (a TPUSliceJob's
        current one, a TPUSliceService's serving one); none for a fixed count."""
        if self.elastic is None:
            return []
        return [
            _scaling(self.slices, self.desired_slices, generation),
            _timeout(self.elastic, generation),
        ]

    def to_status(self) -> dict[str, Any]:
        """The slices-status part of the CRDs (crds/parts/slices-status.yaml)."""
        out: dict[str, Any] = {
            "desiredSlices": self.desired_slices,
            "readySlices": self.ready_slices,
            "sliceReadiness": readiness_text(self.ready_slices, self.desired_slices, self.elastic),
            "slices": _slice_entries(self.slices),
        }
        if self.elastic is not None:
            out["elastic"] = _elastic_entry(self.elastic, self.slices)
        if self.groups:  # the same slice index is in every group: listed per group
            del out["slices"]
            out["groups"] = [dict(g) for g in self.groups]
        return out


def condition(
    kind: str, status: bool, reason: str, message: str, generation: int
) -> dict[str, Any]:
    """One condition without lastTransitionTime (``merge_conditions`` adds it), message
    bounded to MAX_MESSAGE."""
    return _condition(kind, status, reason, message, generation)


def waiting_message(view: KueueView) -> str:
    """Why a slice waits for Kueue, naming the queue and where it came from, and what
    Kueue's Workload says: an eviction and its reason, why quota is not reserved, the
    admission checks not Ready."""
    where = (
        f"the namespace's default LocalQueue {view.queue} (Kueue's webhook labelled it; set "
        f"spec.kueue to choose another)"
        if view.defaulted
        else f"LocalQueue {view.queue}"
    )
    said = (
        f"Kueue has not admitted {view.kind} {view.name} ({where}); no node pool is "
        f"claimed until it does"
    )
    if view.gate:
        said += (
            f"; the operator holds Kueue's admission (spec.kueue.admissionGate "
            f"UntilPoolsFree) until free node pools could hold every slice: {view.gate}"
        )
    workload = view.workload
    if workload is None:
        return said
    if workload.evicted_reason:
        said = (
            f"Kueue evicted {view.kind} {view.name} ({workload.evicted_reason}: "
            f"{workload.evicted_message}); its node pools are given back once its pods are "
            f"gone, and it waits in {where} again"
        )
        if workload.requeue_at:
            said += f" from {workload.requeue_at} (Kueue's requeue backoff)"
    if workload.pending:
        said += f"; Kueue: {workload.pending}"
    for name, state, message in workload.checks:
        said += f"; admission check {name} {state}" + (f": {message}" if message else "")
    return said


def eviction_note(workload: KueueWorkload) -> str:
    """When Kueue's WaitForPodsReady evicts an admitted object whose pods are not all
    ready (``status.kueue.pods_ready_deadline``)."""
    setting = "recoveryTimeout" if workload.pods_ready_reason == "WaitForRecovery" else "timeout"
    again = f" (evicted {workload.requeue_count} times before)" if workload.requeue_count else ""
    return (
        f"Kueue evicts at {workload.evicts_at} unless every pod is ready: waitForPodsReady "
        f"{setting} {workload.evict_timeout_s}s{again}"
    )


def kueue_condition(view: KueueView, generation: int) -> dict[str, Any]:
    """``KueueAdmitted``: True once Kueue has unsuspended the object, False while it holds
    it: reason ``Evicted`` after Kueue evicted it (Kueue's own reason in the message),
    ``AdmissionGated`` while the operator holds Kueue's admission for free pools
    (spec.kueue.admissionGate), ``DefaultLocalQueue`` when Kueue chose the queue, else
    ``AwaitingAdmission``."""
    if view.admitted:
        default = " (the namespace's default LocalQueue)" if view.defaulted else ""
        message = f"Kueue admitted {view.kind} {view.name} through LocalQueue {view.queue}"
        workload = view.workload
        if workload is not None and workload.evicts_at:
            default += f"; {eviction_note(workload)}"
        elif workload is not None and workload.admitted_since and not workload.pods_ready:
            recovering = workload.pods_ready_reason == "WaitForRecovery"
            since = workload.pods_not_ready_since if recovering else workload.admitted_since
            setting = "recoveryTimeout" if recovering else "timeout"
            default += (
                f"; its pods are not all ready: if Kueue's waitForPodsReady is on, Kueue "
                f"evicts it once waitForPodsReady.{setting} has passed since {since} (tell "
                f"the operator the timeout, --kueue-pods-ready-timeout, to see when)"
            )
        return condition(KUEUE_ADMITTED, True, "Admitted", message + default, generation)
    if view.workload is not None and view.workload.evicted_reason:
        reason = "Evicted"
    elif view.gate:
        reason = "AdmissionGated"
    elif view.defaulted:
        reason = "DefaultLocalQueue"
    else:
        reason = "AwaitingAdmission"
    return condition(KUEUE_ADMITTED, False, reason, waiting_message(view), generation)


def slices_reserved_condition(slices: Sequence[SliceStatus], generation: int) -> dict[str, Any]:
    """SlicesReserved: every slice (but those releasing) holds a node pool."""
    unreserved = [s.index for s in slices if not s.node_pool and s.state != SliceState.RELEASING]
    return _condition(
        SLICES_RESERVED,
        not unreserved,
        "AllSlicesReserved" if not unreserved else "SlicesUnreserved",
        "every slice holds a node pool"
        if not unreserved
        else "slices without a node pool: " + index_ranges(unreserved),
        generation,
    )
