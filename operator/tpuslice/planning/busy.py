"""Busy nodes: a single-host slice whose node is taken by pods the operator did not place.

A reservation makes the operator's slices share nodes fairly among themselves; it
cannot keep out a pod someone else placed on the node (a ``spec.nodeName`` pod, a
DaemonSet, a pod of another scheduler) that holds the node's ``google.com/tpu``. The
slice's released pod is pinned to that node (``kubernetes.io/hostname``), so the
scheduler answers Unschedulable for as long as the other pod stays, and the slice
would wait forever on a node it holds. After ``BUSY_AFTER_SECONDS`` of that, the
planner moves the slice: it deletes the reservation and the slice's pod (KubeRay
recreates it, gated), and the object remembers the node in ``status.busyNodes`` for
``BUSY_NODE_MEMORY_SECONDS`` so the next claim goes to another node.

Only single-host slices move: a multi-host slice holds a whole node pool, and a node
of it taken by someone else leaves no other node of the pool to go to; the next
pool is a different slice (other hosts, other ICI links), and the pods of a
multi-host slice move together or not at all, which KubeRay does by replacing the
replica when a node fails. All pure: the clock's ``now`` is an argument.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from tpuslice.model.convert import rfc3339, timestamp
from tpuslice.model.records import Move, NodeInfo, PodInfo, SlicePlan

__all__ = [
    "BUSY_AFTER_SECONDS",
    "BUSY_NODES_KEPT",
    "BUSY_NODE_MEMORY_SECONDS",
    "avoided_nodes",
    "busy_move",
    "busy_nodes_status",
    "is_move_message",
    "move_message",
    "unschedulable_for",
    "with_moves",
]

#: How long a released single-host pod may stay Unschedulable on its reserved node
#: before the slice moves: long enough for pods we released a moment ago to leave
#: (the scheduler retries an unschedulable pod at most every 60 s by default,
#: kube-scheduler's podMaxInUnschedulablePodsDuration, "Scheduler Configuration"
#: https://kubernetes.io/docs/reference/scheduling/config/), short against a job's run.
BUSY_AFTER_SECONDS = 60.0
#: At most this many busy nodes are remembered per object (status.busyNodes, maxItems).
BUSY_NODES_KEPT = 16
#: A busy node is avoided this long after it was found busy, then tried again.
BUSY_NODE_MEMORY_SECONDS = 600.0
#: How every move message ends (``is_move_message`` knows a move by it).
_MOVING = "; moving to another node"


def unschedulable_for(pod: PodInfo, now: datetime) -> float | None:
    """Seconds a released pod has been Unschedulable since its release; None when it is
    not released, not pinned, or the scheduler has not said Unschedulable.

    The clock starts at the later of the condition's lastTransitionTime and the release
    (``released_at``): the API server gives a gated pod PodScheduled=False
    (SchedulingGated) when it is created (kubernetes@v1.30 pkg/registry/core/pod/
    strategy.go, applySchedulingGatedCondition), and the scheduler's Unschedulable keeps
    that lastTransitionTime because the status stays False (pkg/api/v1/pod/util.go,
    UpdatePodCondition), so the condition's time alone is the pod's creation."""
    if pod.gated or pod.deleting or not pod.pinned_pool or pod.node_name:
        return None
    since = timestamp(pod.unschedulable_since)
    if since is None:
        return None
    released = timestamp(pod.released_at)
    if released is not None and released > since:
        since = released
    return max(0.0, (now - since).total_seconds())


def busy_move(
    pool: str,
    replica_name: str,
    pods: Sequence[PodInfo],
    now: datetime,
    node: NodeInfo | None = None,
) -> tuple[Move | None, float | None]:
    """The move of a single-host slice holding ``pool`` (the node ``node``, None when it is
    gone) whose live ``pods`` are all released to it and Unschedulable for
    ``BUSY_AFTER_SECONDS`` (else None), and the seconds until it would be (None when
    nothing is waiting to become busy). The move says why the node cannot take them: it
    is gone, not ready or cordoned (the scheduler's own reasons), else it is taken."""
    if not pods or any(p.pinned_pool != pool for p in pods):
        return None, None
    waits = [unschedulable_for(p, now) for p in pods]
    if any(w is None for w in waits):
        return None, None
    waited = min(w for w in waits if w is not None)
    if waited < BUSY_AFTER_SECONDS:
        return None, BUSY_AFTER_SECONDS - waited
    move = Move(pool, replica_name, tuple((p.namespace, p.name) for p in pods), waited, _why(node))
    return move, None


def _why(node: NodeInfo | None) -> str:
    if node is None:
        return "is gone"
    if not node.ready:
        return "is not ready"
    if not node.schedulable:
        return "is cordoned"
    return Move.why


def move_message(move: Move) -> str:
    """The slice's status message the pass that moves it writes."""
    return (
        f"node {move.pool} {move.why} (the released pod could not schedule for "
        f"{BUSY_AFTER_SECONDS:.0f}s){_MOVING}"
    )


def is_move_message(message: object, node: str) -> bool:
    """Whether a slice's status ``message`` is the one the pass that moved it off
    ``node`` wrote (``move_message``, whatever the node's state was)."""
    return (
        isinstance(message, str)
        and message.startswith(f"node {node} ")
        and message.endswith(_MOVING)
    )


def with_moves(final: SlicePlan, moved: SlicePlan) -> SlicePlan:
    """The plan as it stands after acting (``final``), with the moves of the plan that
    made them (``moved``) and their slices' states as that plan said: the plan after
    acting sees the moved slice's pod still there and its node left out, and would say
    it waits for capacity, where the reader needs why it moves."""
    if not moved.moves:
        return final
    names = {m.replica_name for m in moved.moves}
    said = {s.index: s for s in moved.slices if s.replica in names}
    slices = tuple(said.get(s.index, s) for s in final.slices)
    return replace(final, slices=slices, moves=moved.moves)


def _entries(status: Mapping[str, Any], now: datetime) -> dict[str, datetime]:
    """status.busyNodes still remembered at ``now``: node -> when it was found busy.
    Entries that are not a node name with a readable time are dropped."""
    out: dict[str, datetime] = {}
    entries = status.get("busyNodes")
    if not isinstance(entries, list):
        return out
    for entry in entries[: BUSY_NODES_KEPT * 2]:
        if not isinstance(entry, Mapping):
            continue
        node, since = entry.get("node"), timestamp(entry.get("since"))
        if not isinstance(node, str) or not node or since is None:
            continue
        if (now - since).total_seconds() >= BUSY_NODE_MEMORY_SECONDS:
            continue
        out[node] = max(since, out.get(node, since))
    return out


def avoided_nodes(status: Mapping[str, Any], now: datetime) -> frozenset[str]:
    """The nodes an object's next claims avoid: its status.busyNodes not yet expired."""
    return frozenset(_entries(status, now))


def busy_nodes_status(
    previous: Mapping[str, Any], moved: Iterable[str], now: datetime
) -> list[dict[str, str]] | None:
    """status.busyNodes after this pass: the previous entries not expired, and the nodes
    moved off now (found busy at ``now``), newest first, at most ``BUSY_NODES_KEPT``.
    None when the status never had the field and there is nothing to say (the field
    appears on objects that met a busy node only); ``[]`` once it had (a merge patch
    leaves a field out of the patch as it was)."""
    entries = _entries(previous, now)
    for node in moved:
        entries[node] = now
    if not entries and "busyNodes" not in previous:
        return None
    newest = sorted(entries.items(), key=lambda item: (item[1], item[0]), reverse=True)
    return [{"node": node, "since": rfc3339(since)} for node, since in newest[:BUSY_NODES_KEPT]]
