"""GKE's disruption signals on a unit's nodes: what blocks a claim, what drains a slice,
and when maintenance is scheduled. Pure: everything is read from node labels, taints
and conditions in the snapshot, so a restarted operator derives the same quarantine.

A host event on one VM of a TPU slice interrupts the whole slice (GKE "Manage
disruption to GKE nodes that don't live migrate",
https://cloud.google.com/kubernetes-engine/docs/concepts/handle-disruption-gpu-tpu), so
one node's signal speaks for its whole unit. The signals:

- ``cloud.google.com/scheduled-maintenance-time=<Unix seconds>``: "When an upcoming
  maintenance is scheduled by the VM but isn't active, GKE adds
  scheduled-maintenance-time to the node label" (GPUs and TPUs from GKE
  1.31.1-gke.2008000; GKE "Monitor maintenance events",
  https://cloud.google.com/kubernetes-engine/docs/how-to/view-maintenance-events).
- ``cloud.google.com/active-node-maintenance=ONGOING`` and the taint
  ``cloud.google.com/maintenance-window-started``: the window opened, workloads are
  being stopped; the taint ``cloud.google.com/impending-node-termination``: GKE is
  about to terminate the node (the key spellings of GKE's maintenance handling, same
  "Manage disruption" page).
- tpu7x partition state ``cloud.google.com/gke-tpu-partition-4x4x4-state``: ``UNHEALTHY``
  (``DEGRADED`` stays usable; GKE "Use dynamic slicing with a custom scheduler").
- Node ``Ready`` not True (a host that stopped answering).

A host that stops answering leaves the drained slice's pods ``Terminating``: only its
kubelet confirms a graceful deletion, and KubeRay makes no replacement replica while
the old replica's pods exist. Kubernetes lets such pods go in exactly two cases, and
``stuck_pods`` force-deletes (grace 0) in those two only, once the pod's grace period
is ``STUCK_AFTER_SECONDS`` past:

- the node object is gone (GKE node repair deletes it): the pod garbage collector
  force-deletes pods bound to a node that no longer exists (kubernetes/kubernetes
  pkg/controller/podgc/gc_controller.go, ``gcOrphaned``);
- the node is NotReady and carries ``node.kubernetes.io/out-of-service``: an
  administrator's statement that the host is shut down; the pod garbage collector
  force-deletes its terminating pods and volumes are detached (Kubernetes "Node
  Shutdowns", non-graceful node shutdown,
  https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/; same file,
  ``gcTerminating``).

The operator doing it too changes nothing Kubernetes would not do; it saves the garbage
collector's period and quarantine. A NotReady node without that taint may still run the
pods (a network partition), so their pods are never force-deleted: status says which
host is gone, since when, and what clears it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from tpuslice.model import constants as c
from tpuslice.model import events
from tpuslice.model.convert import timestamp
from tpuslice.model.records import (
    CapacityType,
    Drain,
    ForceDelete,
    NodeInfo,
    PodInfo,
    ProvisioningDecision,
    SlicePlan,
    SliceState,
)

__all__ = [
    "ACTIVE_MAINTENANCE_LABEL",
    "IMPENDING_TERMINATION_TAINT",
    "MAINTENANCE_STARTED_TAINT",
    "OUT_OF_SERVICE_TAINT",
    "PARTITION_STATE_LABEL",
    "SCHEDULED_MAINTENANCE_LABEL",
    "STUCK_AFTER_SECONDS",
    "DisruptionReason",
    "NodeSignal",
    "Signal",
    "StuckPods",
    "blocking_signal",
    "drain_message",
    "drain_signal",
    "maintenance_before",
    "maintenance_message",
    "revoked_drains",
    "scheduled_maintenance",
    "stuck_pods",
]

SCHEDULED_MAINTENANCE_LABEL = "cloud.google.com/scheduled-maintenance-time"
ACTIVE_MAINTENANCE_LABEL = "cloud.google.com/active-node-maintenance"
MAINTENANCE_ONGOING = "ONGOING"
MAINTENANCE_STARTED_TAINT = c.NODE_TAINT_MAINTENANCE_STARTED
IMPENDING_TERMINATION_TAINT = c.NODE_TAINT_IMPENDING_TERMINATION
PARTITION_STATE_LABEL = "cloud.google.com/gke-tpu-partition-4x4x4-state"
PARTITION_UNHEALTHY = "UNHEALTHY"
#: Kubernetes' taint for a node shut down without the kubelet noticing (Kubernetes
#: "Well-Known Labels, Annotations and Taints", node.kubernetes.io/out-of-service).
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
#: How long past its grace period (``metadata.deletionTimestamp``) a deleting pod waits
#: before its host is judged not to answer: a live kubelet confirms within seconds of the
#: deadline; 60 s also covers the pod garbage collector's 40 s quarantine of pods on a
#: missing node (kubernetes/kubernetes pkg/controller/podgc/gc_controller.go, ``quarantineTime``),
#: so a node object re-created under the same name is seen first.
STUCK_AFTER_SECONDS = 60
#: A scheduled-maintenance label further out than this (10 years) is not a time GKE
#: wrote; it is ignored rather than ranked.
_MAX_EPOCH = 4_102_444_800  # 2100-01-01


class Signal(enum.Enum):
    """What one node says, in the order a unit's signals are looked for."""

    TERMINATION = "ImpendingTermination"
    MAINTENANCE = "MaintenanceOngoing"
    PARTITION_UNHEALTHY = "PartitionUnhealthy"
    NOT_READY = "NotReady"


class DisruptionReason(enum.StrEnum):
    """Why a slice was drained, as status and the metric count it (apart from failures)."""

    MAINTENANCE = "Maintenance"
    PREEMPTION = "Preemption"
    CAPACITY_REVOKED = "CapacityRevoked"
    NODE_FAILURE = "NodeFailure"


@dataclass(frozen=True)
class NodeSignal:
    """One node's signal; ``describe`` is the rest of ``node <name> ...``."""

    node: str
    signal: Signal
    spot: bool = False

    def describe(self) -> str:
        match self.signal:
            case Signal.TERMINATION:
                return f"has the {IMPENDING_TERMINATION_TAINT} taint (GKE is terminating it)"
            case Signal.MAINTENANCE:
                return f"is in host maintenance ({ACTIVE_MAINTENANCE_LABEL}={MAINTENANCE_ONGOING})"
            case Signal.PARTITION_UNHEALTHY:
                return f"has {PARTITION_STATE_LABEL}={PARTITION_UNHEALTHY}"
            case Signal.NOT_READY:
                return "is NotReady"

    @property
    def reason(self) -> DisruptionReason:
        """The accounting reason: a termination is a preemption (Spot reclaim, or GKE
        restarting reserved and on-demand TPUs "due to defragmentation reasons"),
        maintenance is maintenance, a dead or unhealthy host a node failure."""
        if self.signal is Signal.TERMINATION:
            return DisruptionReason.PREEMPTION
        if self.signal is Signal.MAINTENANCE:
            return DisruptionReason.MAINTENANCE
        return DisruptionReason.NODE_FAILURE


def _signal(node: NodeInfo, *, with_ready: bool) -> NodeSignal | None:
    # every pass judges every node of its shape: a healthy node (no taint, no label of
    # ours) is answered without building anything
    keys = {t.key for t in node.taints} if node.taints else ()
    labels = node.labels
    found: Signal | None = None
    if IMPENDING_TERMINATION_TAINT in keys:
        found = Signal.TERMINATION
    elif (
        labels.get(ACTIVE_MAINTENANCE_LABEL) == MAINTENANCE_ONGOING
        or MAINTENANCE_STARTED_TAINT in keys
    ):
        found = Signal.MAINTENANCE
    elif labels.get(PARTITION_STATE_LABEL) == PARTITION_UNHEALTHY:
        found = Signal.PARTITION_UNHEALTHY
    elif with_ready and not node.ready:
        found = Signal.NOT_READY
    if found is None:
        return None
    return NodeSignal(node.name, found, node.capacity_type is CapacityType.SPOT)


def blocking_signal(node: NodeInfo) -> NodeSignal | None:
    """The signal that keeps ``node``'s unit from being claimed (NotReady is judged by
    nodeclass on its own), or None."""
    return _signal(node, with_ready=False)


def drain_signal(nodes: Iterable[NodeInfo]) -> NodeSignal | None:
    """The first (by node name) signal that drains a held unit's whole slice, or None
    when every node is Ready, untainted and out of maintenance."""
    for node in sorted(nodes, key=lambda n: n.name):
        if (found := _signal(node, with_ready=True)) is not None:
            return found
    return None


def scheduled_maintenance(nodes: Sequence[NodeInfo]) -> int | None:
    """The earliest scheduled maintenance (Unix seconds) among ``nodes``; a host event on
    any of them interrupts the whole unit. None when no node has a valid label."""
    times = []
    for node in nodes:
        raw = node.labels.get(SCHEDULED_MAINTENANCE_LABEL, "")
        if raw.isdigit() and 0 < int(raw) < _MAX_EPOCH:
            times.append(int(raw))
    return min(times) if times else None


def maintenance_before(now: datetime | None, within_s: int) -> int | None:
    """The Unix time before which scheduled maintenance makes a unit rank last
    (``spec.disruption.avoidMaintenanceWithin``); None (no ranking) without a clock or
    with a window of 0."""
    if now is None or within_s <= 0:
        return None
    return int(now.timestamp()) + within_s


def drain_message(noun: str, pool: str, node: str, signal: str, grace_seconds: int) -> str:
    """The status message of a slice the pass drains."""
    return (
        f"node {node} {signal}: every pod of the slice is deleted together "
        f"(grace {grace_seconds}s); {noun} {pool} is quarantined until every node is Ready, "
        "untainted and out of maintenance"
    )


def maintenance_message(at: int) -> str:
    """``maintenance at 2026-12-03T18:00:00Z``."""
    return f"maintenance at {datetime.fromtimestamp(at, UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


@dataclass(frozen=True)
class StuckPods:
    """What a slice whose pods are all terminating can do about the ones that stay.

    ``force``: pods to delete with grace 0 (their host is gone or out of service);
    ``message``: the status message naming the NotReady host that holds the rest and what
    clears it ("" when none does); ``recheck_in``: seconds until a pod still in its
    grace period may be judged stuck (None when none is)."""

    force: tuple[ForceDelete, ...] = ()
    message: str = ""
    recheck_in: float | None = None


def stuck_pods(
    pods: Iterable[PodInfo], nodes: Mapping[str, NodeInfo], now: datetime | None
) -> StuckPods:
    """Judge ``pods`` (a drained slice's, deleting) against the nodes they are bound to
    (``nodes`` by name: the snapshot's TPU nodes; one missing is gone). Without a clock
    nothing is judged. A pod on a Ready node is its kubelet's business and is left."""
    if now is None:
        return StuckPods()
    force: list[ForceDelete] = []
    silent: dict[str, str] = {}  # NotReady node -> since
    recheck: float | None = None
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        deadline = timestamp(pod.deletion_deadline)
        if not pod.deleting or not pod.node_name or deadline is None:
            continue
        wait = STUCK_AFTER_SECONDS - (now - deadline).total_seconds()
        if wait > 0:
            recheck = wait if recheck is None else min(recheck, wait)
            continue
        node = nodes.get(pod.node_name)
        if node is None:
            force.append(ForceDelete(pod.namespace, pod.name, pod.node_name, "is gone"))
        elif node.ready:
            continue
        elif any(t.key == OUT_OF_SERVICE_TAINT for t in node.taints):
            why = f"is NotReady and tainted {OUT_OF_SERVICE_TAINT}"
            force.append(ForceDelete(pod.namespace, pod.name, pod.node_name, why))
        else:
            silent[node.name] = node.not_ready_since
    message = ""
    if silent:
        name = min(silent)
        since = silent[name] or "an unknown time"
        message = (
            f"node {name} NotReady since {since}; its pods cannot terminate until the node "
            f"returns, is deleted by node repair, or is tainted {OUT_OF_SERVICE_TAINT}"
        )
        if len(silent) > 1:
            message += f" ({len(silent) - 1} more NotReady hosts hold pods of the slice)"
    return StuckPods(tuple(force), message, recheck)


#: What a slice replaced for revoked capacity says in its ``Drain.signal``.
REVOKED_SIGNAL = "lost the capacity its ProvisioningRequest provided (CapacityRevoked)"


def revoked_drains(
    plan: SlicePlan, decisions: Mapping[int, ProvisioningDecision]
) -> tuple[Drain, ...]:
    """The slices capacity on demand replaces because GKE revoked their request's
    capacity (``capacity.decide``: REPLACE with reason CapacityRevoked), as drains for
    the accounting (reason ``CapacityRevoked``): a revocation ends a lease, it is not
    a failure of the slice. Only a slice the plan still shows live counts (one already
    Releasing was counted when its pods were deleted), so a decision repeated while
    the pods go is counted once. Its pods are deleted by the capacity executor."""
    by_index = {s.index: s for s in plan.slices}
    out = []
    for index, decision in sorted(decisions.items()):
        if not decision.replace_slice or decision.reason != events.CAPACITY_REVOKED:
            continue
        entry = by_index.get(index)
        if entry is None or not entry.replica or entry.state is SliceState.RELEASING:
            continue
        out.append(
            Drain(
                pool=entry.node_pool or "",
                replica_name=entry.replica,
                index=index,
                pods=(),
                node="",
                signal=REVOKED_SIGNAL,
                reason=str(DisruptionReason.CAPACITY_REVOKED),
                grace_seconds=0,
            )
        )
    return tuple(out)
