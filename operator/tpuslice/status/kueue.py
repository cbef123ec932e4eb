"""Kueue's hold on a TPUSlice object: whether Kueue has admitted its RayCluster or RayJob,
what the slices show meanwhile, and the ``KueueAdmitted`` condition.

The contract (README "Kueue"): Kueue owns admission, quota, priority and ``suspend``;
the operator owns which pools, the reservation, the pin and the identity. Kueue admits
a job by setting ``spec.suspend`` false and evicts it by setting it true again
(kubernetes-sigs/kueue v0.17.0 pkg/controller/jobframework/reconciler.go, ``startJob``
and ``stopJob``; the RayCluster and RayJob integrations' ``IsSuspended``/``Suspend`` read
and write that field), so the live object's ``suspend`` is the admission the pass acts
on, without reading Kueue's Workload. While it is suspended the object wants no slices:
no pool is claimed, pools it held are given back once its pods are gone (an eviction),
and it holds no place in the shape's queue (``held_in_status``), so a queue of objects
Kueue has not admitted never keeps pools from objects Kueue does not manage."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from tpuslice.model import constants as c
from tpuslice.model.convert import rfc3339, timestamp
from tpuslice.model.records import KueueView, KueueWorkload, SliceState, SliceStatus
from tpuslice.status.conditions import (
    KUEUE_ADMITTED,
    MAX_SLICE_MESSAGE,
    eviction_note,
    kueue_condition,
    truncate,
    waiting_message,
)

__all__ = [
    "KUEUE_ADMITTED",
    "PodsReadyTimeouts",
    "ProvisioningCheck",
    "held_in_status",
    "kueue_condition",
    "kueue_view",
    "pods_ready_deadline",
    "provisioning_conflict",
    "waiting_message",
    "with_admission",
    "with_eviction_deadline",
    "with_scale_up_wait",
]


def kueue_view(
    spec_queue: str,
    kind: str,
    name: str,
    live: Mapping[str, Any] | None,
    workload: KueueWorkload | None = None,
    gate: str = "",
) -> KueueView | None:
    """Kueue's hold on the KubeRay object ``kind``/``name`` (``live``: as the watch shows
    it, ``convert.raycluster_info`` or ``ray_owner_info``; None before it exists, when the
    applier creates it suspended). None when neither the spec (``spec_queue``) nor the
    live object names a LocalQueue. ``gate``: why the operator holds Kueue's admission
    (spec.kueue.admissionGate)."""
    live_labels = (live or {}).get("labels") or {}
    live_queue = str(live_labels.get(c.KUEUE_QUEUE_LABEL) or "")
    queue = spec_queue or live_queue
    if not queue:
        return None
    suspended = live is None or (live.get("spec") or {}).get("suspend") is True
    return KueueView(queue, not suspended, not spec_queue, kind, name, workload, gate)


def with_admission(
    view: KueueView, slices: Sequence[SliceStatus], desired: int
) -> tuple[SliceStatus, ...]:
    """A held object's slices: those still holding a pool (an eviction: their pods are
    terminating, the pool is given back once they are gone) say so; every other index
    up to ``desired`` is AwaitingAdmission."""
    message = waiting_message(view)
    evicted = view.workload.evicted_reason if view.workload is not None else ""
    why = f" (evicted: {evicted})" if evicted else ""
    holding = {
        s.index: replace(
            s,
            message=truncate(
                f"Kueue suspended {view.kind} {view.name}{why}; {s.message}".rstrip("; "),
                MAX_SLICE_MESSAGE,
            ),
        )
        for s in slices
        if s.node_pool
    }
    out = [
        holding.get(i) or SliceStatus(i, SliceState.AWAITING_ADMISSION, message=message)
        for i in range(desired)
    ]
    out += [s for i, s in sorted(holding.items()) if i >= desired]
    return tuple(out)


def held_in_status(status: Mapping[str, Any]) -> bool:
    """Whether an object's last written status says Kueue holds it (``KueueAdmitted``
    False): another object's pass counts it as wanting no slices, so it holds no place
    in the shape's queue."""
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == KUEUE_ADMITTED:
            return cond.get("status") == "False"
    return False


@dataclass(frozen=True)
class ProvisioningCheck:
    """A ProvisioningRequest admission check of the ClusterQueue behind the object's
    LocalQueue (``controller.kueue.provisioning_checks``)."""

    name: str
    cluster_queue: str
    #: its ProvisioningRequestConfig's ``managedResources``; empty: every resource
    managed_resources: tuple[str, ...] = ()


def provisioning_conflict(checks: Sequence[ProvisioningCheck]) -> str:
    """Why the operator's per-slice ProvisioningRequests and Kueue's would both ask for the
    same TPU capacity ("" when they would not).

    Kueue's ProvisioningRequest admission check makes one request for the whole
    Workload (every pod set but those asking for none of ``managedResources``, when that
    list is set: kubernetes-sigs/kueue v0.17.0 apis/kueue/v1beta2
    provisioningrequestconfig_types.go); GKE refuses a request of a Ray cluster with
    workers (ray-project/ray#57839), and granted it would be a second request for slices
    the operator already asks for one by one. A check whose ``managedResources`` leaves
    out ``google.com/tpu`` covers no TPU worker and leaves the TPU capacity to the
    operator."""
    for check in checks:
        if check.managed_resources and c.TPU_RESOURCE not in check.managed_resources:
            continue
        return (
            f"ClusterQueue {check.cluster_queue} has the ProvisioningRequest admission check "
            f"{check.name}, which would ask GKE for this object's TPU capacity as one "
            f"request beside the operator's per-slice ProvisioningRequests "
            f"(spec.reservation.provisioning); the operator makes none while it is there. "
            f"Set managedResources in its ProvisioningRequestConfig to the resources it "
            f"should provision without {c.TPU_RESOURCE} (for example [nvidia.com/gpu]), use "
            f"a LocalQueue whose ClusterQueue has no such check, or remove "
            f"spec.reservation.provisioning"
        )
    return ""


@dataclass(frozen=True)
class PodsReadyTimeouts:
    """Kueue's ``waitForPodsReady`` timeouts, as the operator is told them (an operator
    setting mirroring Kueue's Configuration: Kueue writes neither on the Workload, and
    its Configuration is a file of its manager, kubernetes-sigs/kueue v0.17.0
    apis/config/v1beta2/configuration_types.go ``WaitForPodsReady``). 0: not told, the
    status names no time. ``recovery_s`` None: Kueue's default, the timeout
    (apis/config/v1beta2/defaults.go); 0: Kueue's recovery check is off."""

    timeout_s: int = 0
    recovery_s: int | None = None


def pods_ready_deadline(
    workload: KueueWorkload | None, timeouts: PodsReadyTimeouts
) -> KueueWorkload | None:
    """The Workload with when Kueue evicts it unless every pod is ready, as Kueue's
    workload controller computes it (kubernetes-sigs/kueue v0.17.0
    pkg/controller/core/workload_controller.go ``admittedNotReadyWorkload``): while
    admitted and PodsReady is not True, with PodsReady absent or reason ``WaitForStart``,
    the Admitted condition's lastTransitionTime plus ``timeout``; with reason
    ``WaitForRecovery`` (a pod failed after all were ready), PodsReady's
    lastTransitionTime plus ``recoveryTimeout``. Kueue then evicts it with reason
    ``PodsReadyTimeout`` and requeues it after a backoff (``status.requeueState``)."""
    if workload is None or not timeouts.timeout_s or not workload.admitted_since:
        return workload
    if workload.pods_ready or workload.evicted_reason:
        return workload
    if workload.pods_ready_reason == "WaitForRecovery":
        recovery = timeouts.timeout_s if timeouts.recovery_s is None else timeouts.recovery_s
        since, seconds = workload.pods_not_ready_since, recovery
    elif workload.pods_ready_reason in ("", "WaitForStart", "PodsReady"):
        since, seconds = workload.admitted_since, timeouts.timeout_s
    else:
        return workload
    start = timestamp(since)
    if start is None or not seconds:
        return workload
    at = rfc3339(start + timedelta(seconds=seconds))
    return replace(workload, evicts_at=at, evict_timeout_s=seconds)


def with_eviction_deadline(
    view: KueueView, slices: Sequence[SliceStatus]
) -> tuple[SliceStatus, ...]:
    """An admitted object's slices that are not Ready say when Kueue evicts the object
    unless every pod is ready (``pods_ready_deadline``)."""
    workload = view.workload
    if workload is None or not workload.evicts_at:
        return tuple(slices)
    note = eviction_note(workload)
    return tuple(
        s
        if s.state == SliceState.READY
        else replace(s, message=truncate(f"{s.message}; {note}".lstrip("; "), MAX_SLICE_MESSAGE))
        for s in slices
    )


def with_scale_up_wait(
    slices: Sequence[SliceStatus], *, topology: bool = False
) -> tuple[SliceStatus, ...]:
    """An object Kueue admitted some of whose pods still carry a Kueue gate: its slices
    without a pool say they wait for Kueue, not for a pool. An elastic object's scale-up
    pods carry ``kueue.x-k8s.io/elastic-job`` until Kueue admits the new workload slice;
    with ``topology`` (Kueue chooses the node pools, ``SliceClusterSpec
    .kueue_picks_pools``) the pods carry ``kueue.x-k8s.io/topology`` until Kueue's
    TopologyUngater pins them to the pools it assigned."""
    note = (
        f"Kueue has not admitted the scale-up yet (its pods carry the {c.KUEUE_ELASTIC_JOB} "
        f"gate); no pool is claimed for it until Kueue removes the gate"
    )
    if topology:
        note = (
            f"waiting for Kueue to place the pods on the node pool it assigned (they carry "
            f"the {c.KUEUE_TOPOLOGY_GATE} gate); no pool is claimed until Kueue removes it"
        )
    return tuple(
        replace(s, message=truncate(f"{note}; {s.message}".rstrip("; "), MAX_SLICE_MESSAGE))
        if not s.node_pool and s.state != SliceState.READY
        else s
        for s in slices
    )
