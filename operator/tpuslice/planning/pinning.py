"""Pin at admission (``--pin-at-admission``): which held units the identity webhook may
pin a new pod to, and the fence before such a unit is let go.

Without it a TPU pod is created gated and released by a patch once its whole slice's
unit is held. With it, a reservation of a multi-host slice whose whole unit is held
and healthy (for a gang: every slice of it) carries the mark ``tpuslice.dev/pin``; the
identity webhook then pins a new pod of that slice (same object, group, RayCluster
of a service, and replica index) to the unit in its mutation: no gate, no later
patch. The slice is keyed by its replica index, not its replica name: KubeRay
recreates a failed replica under a new name with the same index
(docs/local-cluster.md), and its new pods land on the unit the index still holds.

The fence: a webhook that read "marked" may admit its pod up to its timeout later
(and later still, behind other admission webhooks). So the leader removes the mark
first, records when (``tpuslice.dev/pin-removed-at``, on the object: a restart keeps
it), and lets the unit go (free, hand to another index) only once that time plus the
webhook's ``timeoutSeconds`` and a margin has passed and a live read of the holder's
pods finds none pinned to the unit (``fence``, ``pinned_to``). Pods created after the
mark is gone are gated as before.

Everything here is pure: reservations, pods and a clock in, decisions out. The
shell parts: ``controller/pinning.py`` (the fence and the marks' writes) and
``webhook/pinning.py`` (the webhook's lookup).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from tpuslice.model import constants as c
from tpuslice.model.convert import timestamp
from tpuslice.model.records import (
    ClusterRef,
    GangMode,
    Handover,
    Holder,
    PodInfo,
    ReservationInfo,
    SlicePlan,
)
from tpuslice.planning.pools import (
    PoolIndex,
    group_replicas,
    is_placeholder,
    pool_facts,
    slice_holder,
)

__all__ = [
    "PIN_FENCE_MARGIN_SECONDS",
    "Fence",
    "FenceStep",
    "PinMarks",
    "PodSlice",
    "fence",
    "holder_matches",
    "kept_for_pins",
    "pin_marks",
    "pin_rekeys",
    "pin_target",
    "pinned_pod",
    "pinned_to",
    "pod_slice",
]

#: Beyond the webhook's ``timeoutSeconds``: other mutating and validating webhooks
#: may run after ours before the pod is written, and the annotation keeps whole
#: seconds. A pod written later still is caught by the live read only if it exists
#: by then; the API server ends a request at its own timeout (60 s by default), so a
#: margin near that closes the gap entirely at the cost of slower frees.
PIN_FENCE_MARGIN_SECONDS = 10.0


class FenceStep(StrEnum):
    """What must happen before a reservation may be let go."""

    LET_GO = "LetGo"  # never marked: delete (or hand over) at once
    UNMARK = "Unmark"  # marked: remove the mark first, then wait
    WAIT = "Wait"  # the mark was removed less than the fence ago
    READ_PODS = "ReadPods"  # the fence passed: let go only if no pod is pinned to it


@dataclass(frozen=True)
class Fence:
    step: FenceStep
    #: for WAIT and UNMARK: seconds until the fence passes
    wait_s: float = 0.0


def fence(reservation: ReservationInfo, now: datetime, fence_s: float) -> Fence:
    """Where ``reservation`` stands in the fence at ``now``, with the fence ``fence_s``
    (the webhook's timeout plus the margin) counted from the mark's removal. A
    removal time that does not read is treated as a mark still there."""
    if reservation.pinned:
        return Fence(FenceStep.UNMARK, fence_s)
    if not reservation.unpinned_at:
        return Fence(FenceStep.LET_GO)
    removed = timestamp(reservation.unpinned_at)
    if removed is None:
        return Fence(FenceStep.UNMARK, fence_s)
    # +1: the annotation holds whole seconds, cut down
    left = (removed - now).total_seconds() + 1.0 + fence_s
    if left > 0:
        return Fence(FenceStep.WAIT, left)
    return Fence(FenceStep.READ_PODS)


def pinned_to(pods: Iterable[Mapping[str, Any]], pool: str) -> list[str]:
    """The names of ``pods`` (API objects, as a live LIST returns them) whose nodeSelector
    pins them to the node pool or node ``pool``: a pod the webhook pinned is a pod of the
    unit's slice, whether or not a watch has shown it yet."""
    names = []
    for pod in pods:
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        if pool in (selector.get(c.NODE_LABEL_NODEPOOL), selector.get(c.NODE_LABEL_HOSTNAME)):
            names.append(str((pod.get("metadata") or {}).get("name") or ""))
    return names


# ---------------------------------------------------------------- the marks
@dataclass(frozen=True)
class PinMarks:
    """The mark writes of one slice set's pass: reservations to mark, and to un-mark."""

    mark: tuple[ReservationInfo, ...] = ()
    unmark: tuple[ReservationInfo, ...] = ()


def pin_marks(
    cluster: ClusterRef,
    *,
    enabled: bool,
    hosts: int,
    chips_per_host: int,
    desired: int,
    gang: GangMode,
    pods: Iterable[PodInfo],
    reservations: Iterable[ReservationInfo],
    plan: SlicePlan,
    inventory: PoolIndex,
) -> PinMarks:
    """Which of the slice set's reservations carry the mark after this pass.

    A reservation is pinnable when the setting is on for the set (``enabled``: the
    caller's scope, multi-host units of a fixed slice count, no capacity on demand,
    its releases not held back), its holder's replica index is below ``desired``, the
    plan neither frees nor drains it, its unit is eligible (whole, healthy, no
    disruption signal: ``pool_facts``), and its slice's pods are pinned nowhere else.
    A placeholder's reservation (claimed for a replica index before its pods exist,
    ``pools.placeholder_name``) is pinnable as soon as it is held: KubeRay's first pods
    of the index are then pinned at admission.
    A reservation whose slice has no live pods left (gone, or terminating while
    KubeRay replaces the replica) stays pinnable only if already marked (kept for the
    replica KubeRay makes next, ``kept_for_pins``). A gang
    (``AllSlices``) marks all of its slices or none: a pod pinned at admission never
    schedules before every slice of its gang is held. Everything else that is marked
    is un-marked (the first step of the fence)."""
    ours = cluster.own(reservations)
    replicas, _ = group_replicas(pods, hosts)
    drained = {d.pool for d in plan.drains} | {m.pool for m in plan.moves}
    out = set(plan.frees) | drained
    pinnable: list[ReservationInfo] = []
    if enabled and hosts > 1:
        for r in ours:
            index = r.holder.replica_index
            if index is None or not 0 <= index < desired or r.pool in out:
                continue
            nodes = inventory.matching.get(r.pool, ())
            facts = pool_facts(
                r.pool,
                nodes,
                hosts=hosts,
                chips_per_host=chips_per_host,
                owned_slices=inventory.owned_slices,
            )
            if not nodes or not facts.eligible:
                continue
            replica = replicas.get(r.holder.replica_name)
            if is_placeholder(r.holder.replica_name):
                pinnable.append(r)  # held before KubeRay made the index's pods
                continue
            if replica is None or not replica.live:
                # its pods gone or going (KubeRay replaces the replica): a marked unit
                # stays marked for the index's next replica, never newly marked
                if r.pinned:
                    pinnable.append(r)
                continue
            if any(p.pinned_pool not in (None, r.pool) for p in replica.live):
                continue
            pinnable.append(r)
        indexes = {r.holder.replica_index for r in pinnable}
        if gang == GangMode.ALL_SLICES and len(indexes) < desired:
            pinnable = []
    keep = {r.pool for r in pinnable}
    return PinMarks(
        mark=tuple(r for r in pinnable if not r.pinned),
        unmark=tuple(r for r in ours if r.pinned and r.pool not in keep),
    )


def kept_for_pins(
    frees: Sequence[str],
    cluster: ClusterRef,
    *,
    desired: int,
    hosts: int,
    pods: Iterable[PodInfo],
    reservations: Iterable[ReservationInfo],
) -> tuple[str, ...]:
    """The plan's ``frees`` less the marked reservations kept for their index: a slice
    whose pods are all gone keeps its marked unit while its index is below
    ``desired`` (KubeRay makes the next replica of that index, whose pods the webhook
    pins there), as long as the set then holds no more units than ``desired``."""
    ours = cluster.own(reservations)
    replicas, _ = group_replicas(pods, hosts)
    held_indexes = {
        r.holder.replica_index
        for r in ours
        if r.pool not in frees and r.holder.replica_name in replicas
    }
    candidates: dict[int, ReservationInfo] = {}
    for r in sorted(ours, key=lambda r: r.pool):
        index = r.holder.replica_index
        if (
            r.pool in frees
            and r.pinned
            and not is_placeholder(r.holder.replica_name)
            and r.holder.replica_name not in replicas
            and index is not None
            and 0 <= index < desired
            and index not in held_indexes
        ):
            candidates.setdefault(index, r)
    kept = [candidates[i] for i in sorted(candidates)]
    # never more units held than the set's count: the highest indexes go first
    held_after = len(ours) - len(frees) + len(kept)
    while kept and held_after > desired:
        kept.pop()
        held_after -= 1
    keep = {r.pool for r in kept}
    return tuple(p for p in frees if p not in keep)


def pin_rekeys(
    cluster: ClusterRef,
    *,
    hosts: int,
    pods: Iterable[PodInfo],
    reservations: Iterable[ReservationInfo],
) -> tuple[Handover, ...]:
    """Our reservations whose slice has no pods left, given to the live replica of the
    same index that holds nothing: the replica KubeRay made next. Only when its pods
    are pinned to that unit alone (the webhook pinned them), or are all gated and the
    unit is still marked (kept for it): the same index keeps its unit, so the
    identity and topology of the slice stay as they were. A placeholder's reservation
    (claimed before the index had pods) goes to the index's first replica whose pods
    are pinned to it or all gated, marked or not (pods that came before the mark, or
    that the webhook did not pin, are released by the pass's patch). One conditional
    patch each (the holder's replica name; ``kube.hand_over_reservation``)."""
    replicas, _ = group_replicas(pods, hosts)
    ours = cluster.own(reservations)
    holding = {r.holder.replica_name for r in ours}
    out: list[Handover] = []
    for r in ours:
        if r.holder.replica_name in replicas or r.holder.replica_index is None:
            continue
        fits = []
        for rep in replicas.values():
            if rep.index != r.holder.replica_index or rep.name in holding or not rep.live:
                continue
            pins = {p.pinned_pool for p in rep.live if p.pinned_pool}
            kept = r.pinned or is_placeholder(r.holder.replica_name)
            if pins == {r.pool} or (not pins and kept and all(p.gated for p in rep.live)):
                fits.append(rep)
        if len(fits) == 1:
            out.append(Handover(r.pool, slice_holder(cluster, fits[0])))
    return tuple(out)


# ---------------------------------------------------------------- the webhook's decision
@dataclass(frozen=True)
class PodSlice:
    """The slice a new pod says it belongs to, by its labels: the object (kind,
    namespace, name), its worker group, its RayCluster and its replica index."""

    kind: str
    namespace: str
    name: str
    group: str
    ray_cluster: str
    replica_index: int


def pod_slice(pod: Mapping[str, Any], namespace: str = "") -> PodSlice | None:
    """The slice of a pod the webhook may pin: a multi-host worker (KubeRay's replica
    name label) carrying our gate, pinned to no unit yet, not a dynamic slice's. None
    for any other pod (it is left as it is: gated, released by the pass)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    gates = {g.get("name") for g in spec.get("schedulingGates") or [] if isinstance(g, Mapping)}
    selector = spec.get("nodeSelector") or {}
    name = labels.get(c.LABEL_CLUSTER)
    index = labels.get(c.KUBERAY_LABEL_REPLICA_INDEX)
    if (
        not name
        or not labels.get(c.KUBERAY_LABEL_REPLICA_NAME)
        or c.SCHEDULING_GATE not in gates
        or c.NODE_LABEL_NODEPOOL in selector
        or c.NODE_LABEL_HOSTNAME in selector
        or annotations.get(c.ANNOTATION_DYNAMIC_SLICE) == "true"
        or not isinstance(index, str)
        or not index.isdigit()
    ):
        return None
    return PodSlice(
        kind=labels.get(c.LABEL_OWNER_KIND) or c.KIND_CLUSTER,
        namespace=str(meta.get("namespace") or namespace),
        name=str(name),
        group=str(labels.get(c.KUBERAY_LABEL_GROUP) or ""),
        ray_cluster=str(labels.get(c.KUBERAY_LABEL_CLUSTER) or ""),
        replica_index=int(index),
    )


def holder_matches(pod: PodSlice, holder: Holder) -> bool:
    """Whether ``holder`` holds the pod's slice: the same object and replica index, the
    same group (a one-group holder names none), and for a service the same RayCluster."""
    return (
        (holder.kind, holder.namespace, holder.name) == (pod.kind, pod.namespace, pod.name)
        and holder.replica_index == pod.replica_index
        and holder.group in ("", pod.group)
        and holder.ray_cluster in ("", pod.ray_cluster)
    )


def pin_target(pod: PodSlice, reservation: ReservationInfo) -> str | None:
    """The node pool to pin the pod to: the reservation's, when it is marked and its
    holder holds the pod's slice; else None (the pod stays gated)."""
    if reservation.pinned and holder_matches(pod, reservation.holder):
        return reservation.pool
    return None


def pinned_pod(pod: Mapping[str, Any], pool: str) -> dict[str, Any]:
    """``pod`` pinned to node pool ``pool`` at admission: our gate removed (others kept),
    ``nodeSelector cloud.google.com/gke-nodepool`` set, as the release patch does."""
    spec = dict(pod.get("spec") or {})
    gates = [
        g
        for g in spec.get("schedulingGates") or []
        if not (isinstance(g, Mapping) and g.get("name") == c.SCHEDULING_GATE)
    ]
    if gates:
        spec["schedulingGates"] = gates
    else:
        spec.pop("schedulingGates", None)
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), c.NODE_LABEL_NODEPOOL: pool}
    return {**pod, "spec": spec}
