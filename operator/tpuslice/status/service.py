"""Status of a TPUSliceService, computed purely from its RayService's status and the
slices of each of its RayClusters.

KubeRay's RayService (rayservice_types.go, KubeRay 1.5) names an active cluster
(serving traffic) and, during an upgrade, a pending one; its ``Ready``
condition (``serviceStatus: Running`` before KubeRay 1.3) says requests are
served. A TPUSliceService is ``Ready`` only when traffic is served by a cluster
whose every slice is Ready on its reserved node pool: a service that answers
from a cluster missing a slice is not what was asked for.

An upgrade shows as ``Reconciling=True`` and ``UpgradeInProgress=True`` while
``Ready`` keeps describing the active cluster, so a service that keeps serving
through an upgrade waiting for capacity stays Ready and says so
(``UpgradeWaitingForCapacity``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuslice.status.conditions import (
    READY,
    RECONCILING,
    STALLED,
    ClusterSlices,
    ObservedObject,
    condition,
    merge_conditions,
    readiness_text,
    slices_reserved_condition,
    status_head,
)

__all__ = [
    "UPGRADE_IN_PROGRESS",
    "ServiceObserved",
    "compute_service_status",
    "service_conditions",
    "serving",
]

UPGRADE_IN_PROGRESS = "UpgradeInProgress"


@dataclass(frozen=True, kw_only=True)
class ServiceObserved(ObservedObject):
    """Everything a TPUSliceService's status depends on."""

    ray_service: str  # the RayService's name (the TPUSliceService's)
    #: The RayService's ``status`` stanza; None while there is no RayService yet.
    ray_service_status: Mapping[str, Any] | None
    #: Every RayCluster of the service the reconcile found (by owner reference and the
    #: tpuslice.dev/service label), by name; the active and pending ones among them
    #: are the ones the RayService's status names.
    clusters: Mapping[str, ClusterSlices]


def _ray_condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


def serving(status: Mapping[str, Any] | None) -> bool:
    """KubeRay says requests are served: its Ready condition, else (KubeRay before 1.3,
    no conditions) the deprecated ``serviceStatus: Running``."""
    if not status:
        return False
    ready = _ray_condition(status, "Ready")
    if ready is not None:
        return ready.get("status") == "True"
    return status.get("serviceStatus") == "Running"


def _cluster(observed: ServiceObserved, section: str) -> tuple[str, ClusterSlices | None]:
    """(name, slices) of the cluster ``activeServiceStatus`` / ``pendingServiceStatus``
    names; the name is '' when there is none."""
    status = observed.ray_service_status or {}
    name = str((status.get(section) or {}).get("rayClusterName") or "")
    if not name:
        return "", None
    return name, observed.clusters.get(name)


def _slices_text(cluster: ClusterSlices) -> str:
    return f"{cluster.ready_slices}/{cluster.desired_slices} slices ready"


@dataclass(frozen=True)
class _Verdict:
    ready: bool
    reason: str
    message: str
    reconciling: bool
    stalled: bool = False
    upgrade: tuple[str, str] | None = None  # (reason, message) while a pending cluster exists


def _pending(observed: ServiceObserved) -> tuple[str, str, str] | None:
    """(name, state, detail) of the pending cluster: the state is a blocking slice state
    (WaitingForCapacity, ...) or InProgress; None when there is no pending cluster."""
    name, pending = _cluster(observed, "pendingServiceStatus")
    if not name:
        return None
    if pending is None:
        return name, "InProgress", f"KubeRay is creating RayCluster {name}"
    blocked = pending.blocked()
    if blocked is not None:
        return name, blocked[0], f"{name}: {blocked[1]}"
    if pending.all_ready:
        return name, "InProgress", f"{name}: slices ready, waiting for Serve"
    return name, "InProgress", f"{name}: {_slices_text(pending)}"


def _upgrade(observed: ServiceObserved, active_name: str) -> tuple[str, str] | None:
    """(reason, message) of an upgrade under way, None without a pending cluster."""
    pending = _pending(observed)
    if pending is None:
        return None
    _, state, detail = pending
    keeps = f"; {active_name} keeps serving" if active_name else ""
    return f"Upgrade{state}", f"upgrade to {detail}{keeps}"


def _verdict(observed: ServiceObserved) -> _Verdict:
    if observed.stall is not None:
        stall = observed.stall
        return _Verdict(False, stall.reason, stall.message, reconciling=False, stalled=True)
    status = observed.ray_service_status
    if status is None:
        message = f"RayService {observed.ray_service} is not created yet"
        return _Verdict(False, "Pending", message, reconciling=True)
    ray_ready = _ray_condition(status, "Ready") or {}
    if ray_ready.get("reason") == "InitializingTimeout":
        return _Verdict(
            False,
            "RayServiceInitializingTimeout",
            f"KubeRay gave up starting the service: {ray_ready.get('message') or ''}".rstrip(": ")
            + "; change the spec (or the ray.io/initializing-timeout annotation) to try again",
            reconciling=False,
            stalled=True,
        )
    active_name, active = _cluster(observed, "activeServiceStatus")
    upgrade = _upgrade(observed, active_name if serving(status) else "")
    if serving(status) and active is not None and active.all_ready:
        message = f"traffic served by {active_name}: {_slices_text(active)}"
        return _Verdict(True, "Serving", message, reconciling=upgrade is not None, upgrade=upgrade)
    if active is not None and (blocked := active.blocked()) is not None:
        state, detail = blocked
        where = "serving" if serving(status) else "not serving yet"
        message = f"{active_name} ({where}): {detail}"
        return _Verdict(False, state, message, reconciling=True, upgrade=upgrade)
    if serving(status):
        what = _slices_text(active) if active is not None else "slices not observed yet"
        message = f"traffic served by {active_name or 'a cluster'}, but {what}"
        return _Verdict(False, "ActiveSlicesNotReady", message, reconciling=True, upgrade=upgrade)
    if active_name:
        reason = str(ray_ready.get("reason") or "NotServing")
        message = f"{active_name} does not serve: {ray_ready.get('message') or reason}"
        return _Verdict(False, reason, message, reconciling=True, upgrade=upgrade)
    if (first := _pending(observed)) is not None:  # KubeRay reports the first as pending
        _, state, detail = first
        reason = "Initializing" if state == "InProgress" else state
        return _Verdict(False, reason, detail, reconciling=True)
    message = "waiting for KubeRay to create the service's RayCluster"
    return _Verdict(False, "Initializing", message, reconciling=True)


def service_conditions(observed: ServiceObserved) -> list[dict[str, Any]]:
    """Conditions without timestamps; merge_conditions adds lastTransitionTime."""
    verdict = _verdict(observed)
    gen = observed.generation
    reconciling_reason, reconciling_message = verdict.reason, verdict.message
    if verdict.ready and verdict.upgrade is not None:
        reconciling_reason, reconciling_message = verdict.upgrade
    conditions = [
        condition(READY, verdict.ready, verdict.reason, verdict.message, gen),
        condition(
            RECONCILING,
            verdict.reconciling,
            reconciling_reason,
            reconciling_message if verdict.reconciling else "not in progress",
            gen,
        ),
        condition(
            STALLED,
            verdict.stalled,
            verdict.reason,
            verdict.message if verdict.stalled else "",
            gen,
        ),
    ]
    if verdict.stalled:
        return conditions
    upgrade = verdict.upgrade
    conditions.append(
        condition(
            UPGRADE_IN_PROGRESS,
            upgrade is not None,
            upgrade[0] if upgrade else "NoUpgrade",
            upgrade[1] if upgrade else "no upgrade in progress",
            gen,
        )
    )
    _, active = _cluster(observed, "activeServiceStatus")
    if active is not None:
        conditions += active.elastic_conditions(gen)
    if observed.gated:
        slices = [
            s
            for section in ("activeServiceStatus", "pendingServiceStatus")
            if (cluster := _cluster(observed, section)[1]) is not None
            for s in cluster.slices
        ]
        if slices:
            conditions.append(slices_reserved_condition(slices, gen))
    return conditions


def _cluster_status(name: str, cluster: ClusterSlices | None) -> dict[str, Any] | None:
    if not name:
        return None
    entry: dict[str, Any] = {"name": name}
    if cluster is not None:
        entry.update(cluster.to_status())
    return entry


def compute_service_status(
    observed: ServiceObserved, previous: Mapping[str, Any] | None, now: str
) -> dict[str, Any]:
    """The whole status stanza of a TPUSliceService; identical input gives identical output."""
    previous = previous or {}
    ray = observed.ray_service_status or {}
    status = status_head(previous, observed)
    status["rayService"] = observed.ray_service
    if ray.get("serviceStatus"):
        status["serviceStatus"] = ray["serviceStatus"]
    if isinstance(ray.get("numServeEndpoints"), int):
        status["numServeEndpoints"] = ray["numServeEndpoints"]
    _, active = _cluster(observed, "activeServiceStatus")
    ready = active.ready_slices if active is not None else 0
    desired = active.desired_slices if active is not None else observed.desired_slices
    elastic = active.elastic if active is not None else None
    # an elastic service wants the serving cluster's target, within its range
    status["desiredSlices"] = desired if elastic is not None else observed.desired_slices
    status["readySlices"] = ready
    status["sliceReadiness"] = readiness_text(ready, desired, elastic)
    for field, section in (
        ("activeCluster", "activeServiceStatus"),
        ("pendingCluster", "pendingServiceStatus"),
    ):
        entry = _cluster_status(*_cluster(observed, section))
        if entry is not None:
            status[field] = entry
    status["conditions"] = merge_conditions(
        previous.get("conditions") or [], service_conditions(observed), now
    )
    return status
