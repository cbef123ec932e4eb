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
from typing import Any

from tpuslice.model import constants as c
from tpuslice.model.records import KueueView, KueueWorkload, SliceState, SliceStatus
from tpuslice.status.conditions import (
    KUEUE_ADMITTED,
    MAX_SLICE_MESSAGE,
    kueue_condition,
    truncate,
    waiting_message,
)

__all__ = [
    "KUEUE_ADMITTED",
    "ProvisioningCheck",
    "held_in_status",
    "kueue_condition",
    "kueue_view",
    "provisioning_conflict",
    "waiting_message",
    "with_admission",
]


def kueue_view(
    spec_queue: str,
    kind: str,
    name: str,
    live: Mapping[str, Any] | None,
    workload: KueueWorkload | None = None,
) -> KueueView | None:
    """Kueue's hold on the KubeRay object ``kind``/``name`` (``live``: as the watch shows
    it, ``convert.raycluster_info`` or ``ray_owner_info``; None before it exists, when the
    applier creates it suspended). None when neither the spec (``spec_queue``) nor the
    live object names a LocalQueue."""
    live_labels = (live or {}).get("labels") or {}
    live_queue = str(live_labels.get(c.KUEUE_QUEUE_LABEL) or "")
    queue = spec_queue or live_queue
    if not queue:
        return None
    suspended = live is None or (live.get("spec") or {}).get("suspend") is True
    return KueueView(queue, not suspended, not spec_queue, kind, name, workload)


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
