"""GKE's maintenance and termination signals on fake nodes, on demand.

A real GKE node learns of a host event from labels and taints GKE writes; the
fake nodes never get them, so the operator's disruption handling could not be
exercised locally. These pure functions build the node patches that play GKE's
part; :func:`apply` sends them. The signals and their sources:

* ``cloud.google.com/scheduled-maintenance-time=<Unix seconds>``: "When an
  upcoming maintenance is scheduled by the VM but isn't active, GKE adds
  scheduled-maintenance-time to the node label" (GPU and TPU machine types from
  GKE 1.31.1-gke.2008000). GKE documentation "Monitor maintenance events",
  https://cloud.google.com/kubernetes-engine/docs/how-to/view-maintenance-events
* ``cloud.google.com/scheduled-maintenance-time-latest`` (the latest start the
  window can be moved to, Compute Engine's ``latestWindowStartTime``),
  ``cloud.google.com/active-node-maintenance=ONGOING`` and the taints
  ``cloud.google.com/maintenance-window-started`` and
  ``cloud.google.com/impending-node-termination``: the node keys of GKE's
  maintenance handling, "Manage disruption to GKE nodes that don't live migrate",
  https://cloud.google.com/kubernetes-engine/docs/concepts/handle-disruption-gpu-tpu
  (the exact key spellings were read from GKE's maintenance controller constants;
  the taint effects are not documented there: NoSchedule is assumed, as the
  impending-termination taint is the node being cordoned).
* Spot: Compute Engine gives a Spot VM about 30 seconds of notice before it
  reclaims it ("Spot VMs", https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms).
  The fake notice is the impending-termination taint on a node that carries
  ``cloud.google.com/gke-spot=true``; which Kubernetes-visible mark GKE puts on a
  Spot node during its notice is not documented, so this is an assumption.
* ``node.kubernetes.io/out-of-service=nodeshutdown:NoExecute``: Kubernetes' own taint
  for a node shut down without its kubelet noticing; the pod garbage collector then
  force-deletes the node's terminating pods (Kubernetes "Node Shutdowns",
  non-graceful node shutdown, https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/).
  An administrator puts it on a NotReady node once the machine is surely off.
* tpu7x partition state ``cloud.google.com/gke-tpu-partition-4x4x4-state``
  (HEALTHY, DEGRADED, UNHEALTHY, UNSET, INCOMPLETE): "Use dynamic slicing with a
  custom scheduler" (GKE documentation, GKE 1.35+).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .nodepools import PARTITION_STATE_LABEL, PARTITION_STATES, SPOT_LABEL

__all__ = [
    "ACTIVE_MAINTENANCE_LABEL",
    "IMPENDING_TERMINATION_TAINT",
    "MAINTENANCE_STARTED_TAINT",
    "MAX_NOTICE_S",
    "OUT_OF_SERVICE_TAINT",
    "SCHEDULED_MAINTENANCE_LABEL",
    "SCHEDULED_MAINTENANCE_LATEST_LABEL",
    "clear_maintenance",
    "clear_termination",
    "node_taints",
    "out_of_service",
    "partition_state",
    "patch_for",
    "schedule_maintenance",
    "spot_notice",
    "start_maintenance",
    "terminate",
]

SCHEDULED_MAINTENANCE_LABEL = "cloud.google.com/scheduled-maintenance-time"
SCHEDULED_MAINTENANCE_LATEST_LABEL = "cloud.google.com/scheduled-maintenance-time-latest"
ACTIVE_MAINTENANCE_LABEL = "cloud.google.com/active-node-maintenance"
ONGOING = "ONGOING"
MAINTENANCE_STARTED_TAINT = "cloud.google.com/maintenance-window-started"
IMPENDING_TERMINATION_TAINT = "cloud.google.com/impending-node-termination"
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
#: Scheduled maintenance gets about seven days' notice (Cloud TPU "View maintenance
#: notifications"); a fake window further out than a year is a typo.
MAX_NOTICE_S = 365 * 24 * 3600

Patch = dict[str, Any]


def _taints_with(taints: Iterable[Mapping[str, Any]], key: str, present: bool) -> list[Any]:
    """``taints`` with ``key`` (NoSchedule) added or removed, others kept in order.

    Node ``spec.taints`` has no merge key, so a patch replaces the whole list: the
    caller passes the node's current taints.
    """
    kept = [dict(t) for t in taints if t.get("key") != key]
    if present:
        kept.append({"key": key, "value": "true", "effect": "NoSchedule"})
    return kept


def schedule_maintenance(now_s: float, in_s: float, latest_in_s: float | None = None) -> Patch:
    """Labels announcing maintenance ``in_s`` seconds from ``now_s`` (Unix seconds)."""
    for name, value in (("in", in_s), ("latest-in", latest_in_s)):
        if value is not None and not 0 <= value <= MAX_NOTICE_S:
            raise ValueError(f"--{name} must be 0..{MAX_NOTICE_S} seconds, got {value}")
    if latest_in_s is not None and latest_in_s < in_s:
        raise ValueError(f"--latest-in ({latest_in_s}) must not be before --in ({in_s})")
    labels: dict[str, str | None] = {SCHEDULED_MAINTENANCE_LABEL: str(int(now_s + in_s))}
    labels[SCHEDULED_MAINTENANCE_LATEST_LABEL] = (
        None if latest_in_s is None else str(int(now_s + latest_in_s))
    )
    return {"metadata": {"labels": labels}}


def start_maintenance(taints: Sequence[Mapping[str, Any]]) -> Patch:
    """The window opened: ONGOING label, the window-started taint, schedule labels gone."""
    return {
        "metadata": {
            "labels": {
                ACTIVE_MAINTENANCE_LABEL: ONGOING,
                SCHEDULED_MAINTENANCE_LABEL: None,
                SCHEDULED_MAINTENANCE_LATEST_LABEL: None,
            }
        },
        "spec": {"taints": _taints_with(taints, MAINTENANCE_STARTED_TAINT, True)},
    }


def clear_maintenance(taints: Sequence[Mapping[str, Any]]) -> Patch:
    """Maintenance done (or cancelled): every maintenance label and taint gone."""
    return {
        "metadata": {
            "labels": {
                ACTIVE_MAINTENANCE_LABEL: None,
                SCHEDULED_MAINTENANCE_LABEL: None,
                SCHEDULED_MAINTENANCE_LATEST_LABEL: None,
            }
        },
        "spec": {"taints": _taints_with(taints, MAINTENANCE_STARTED_TAINT, False)},
    }


def terminate(taints: Sequence[Mapping[str, Any]]) -> Patch:
    """GKE is about to terminate the node: the impending-termination taint."""
    return {"spec": {"taints": _taints_with(taints, IMPENDING_TERMINATION_TAINT, True)}}


def clear_termination(taints: Sequence[Mapping[str, Any]]) -> Patch:
    """Take the impending-termination taint away (the node came back)."""
    return {"spec": {"taints": _taints_with(taints, IMPENDING_TERMINATION_TAINT, False)}}


def out_of_service(taints: Sequence[Mapping[str, Any]], present: bool) -> Patch:
    """Add (or remove) ``node.kubernetes.io/out-of-service=nodeshutdown:NoExecute``, the
    value and effect of Kubernetes' documented example."""
    kept = [dict(t) for t in taints if t.get("key") != OUT_OF_SERVICE_TAINT]
    if present:
        kept.append({"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"})
    return {"spec": {"taints": kept}}


def spot_notice(labels: Mapping[str, str], taints: Sequence[Mapping[str, Any]]) -> Patch:
    """The Spot reclaim notice: only a Spot node can get one (the fake's assumption above)."""
    if labels.get(SPOT_LABEL) != "true":
        raise ValueError(
            f"a Spot notice needs a Spot node ({SPOT_LABEL}=true); "
            "make the pool with the ,spot flag or use `terminate`"
        )
    return terminate(taints)


def partition_state(labels: Mapping[str, str], state: str) -> Patch:
    """Set a dynamic-slicing node's partition state label."""
    if state not in PARTITION_STATES:
        raise ValueError(
            f"partition state must be one of {', '.join(PARTITION_STATES)}, got {state!r}"
        )
    if PARTITION_STATE_LABEL not in labels:
        raise ValueError(
            f"the node has no {PARTITION_STATE_LABEL} label; only dynamic-slicing (tpu7x) "
            "pools have partitions (pool flag ,dynamic-slicing)"
        )
    return {"metadata": {"labels": {PARTITION_STATE_LABEL: state}}}


def patch_for(
    action: str,
    labels: Mapping[str, str],
    taints: Sequence[Mapping[str, Any]],
    *,
    now_s: float,
    in_s: float = 0.0,
    latest_in_s: float | None = None,
    state: str = "",
) -> Patch:
    """The patch of one command-line action (the names of ``python -m tpusim``)."""
    if action == "schedule-maintenance":
        return schedule_maintenance(now_s, in_s, latest_in_s)
    if action == "start-maintenance":
        return start_maintenance(taints)
    if action == "clear-maintenance":
        return clear_maintenance(taints)
    if action == "terminate":
        return terminate(taints)
    if action == "unterminate":
        return clear_termination(taints)
    if action == "spot-notice":
        return spot_notice(labels, taints)
    if action in ("out-of-service", "in-service"):
        return out_of_service(taints, action == "out-of-service")
    if action == "partition-state":
        return partition_state(labels, state)
    raise ValueError(f"unknown action {action!r}")


def node_taints(node: Any) -> list[dict[str, Any]]:
    """A client node's taints as plain dicts (what the patch builders take)."""
    return [{"key": t.key, "value": t.value, "effect": t.effect} for t in (node.spec.taints or [])]
