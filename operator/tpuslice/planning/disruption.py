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
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from tpuslice.model import constants as c
from tpuslice.model.records import CapacityType, NodeInfo

__all__ = [
    "ACTIVE_MAINTENANCE_LABEL",
    "IMPENDING_TERMINATION_TAINT",
    "MAINTENANCE_STARTED_TAINT",
    "PARTITION_STATE_LABEL",
    "SCHEDULED_MAINTENANCE_LABEL",
    "DisruptionReason",
    "NodeSignal",
    "Signal",
    "blocking_signal",
    "drain_message",
    "drain_signal",
    "maintenance_before",
    "maintenance_message",
    "scheduled_maintenance",
]

SCHEDULED_MAINTENANCE_LABEL = "cloud.google.com/scheduled-maintenance-time"
ACTIVE_MAINTENANCE_LABEL = "cloud.google.com/active-node-maintenance"
MAINTENANCE_ONGOING = "ONGOING"
MAINTENANCE_STARTED_TAINT = c.NODE_TAINT_MAINTENANCE_STARTED
IMPENDING_TERMINATION_TAINT = c.NODE_TAINT_IMPENDING_TERMINATION
PARTITION_STATE_LABEL = "cloud.google.com/gke-tpu-partition-4x4x4-state"
PARTITION_UNHEALTHY = "UNHEALTHY"
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
    keys = {t.key for t in node.taints}
    spot = node.capacity_type is CapacityType.SPOT
    if IMPENDING_TERMINATION_TAINT in keys:
        return NodeSignal(node.name, Signal.TERMINATION, spot)
    if (
        node.labels.get(ACTIVE_MAINTENANCE_LABEL) == MAINTENANCE_ONGOING
        or MAINTENANCE_STARTED_TAINT in keys
    ):
        return NodeSignal(node.name, Signal.MAINTENANCE, spot)
    if node.labels.get(PARTITION_STATE_LABEL) == PARTITION_UNHEALTHY:
        return NodeSignal(node.name, Signal.PARTITION_UNHEALTHY, spot)
    if with_ready and not node.ready:
        return NodeSignal(node.name, Signal.NOT_READY, spot)
    return None


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
