"""Kubernetes objects -> the small records the decisions need. Pure.

Our watches' stores keep these records (not whole objects) in memory, which keeps
the operator small at thousands of pods and nodes, and gives the pure modules
typed input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from tpuslice.model import constants as c
from tpuslice.model.records import (
    CapacityType,
    GkeSliceInfo,
    Holder,
    KueueWorkload,
    NodeInfo,
    ObjectKey,
    OwnedRequest,
    PodInfo,
    ProvisioningRequestInfo,
    RequestCondition,
    ReservationInfo,
    Taint,
)

__all__ = [
    "capacity_type",
    "cluster_record",
    "gke_slice_body",
    "gke_slice_info",
    "holder_spec",
    "namespace_labels",
    "node_info",
    "node_taints",
    "owned_request",
    "pass_inputs",
    "pod_info",
    "podtemplate_record",
    "provisioning_request_info",
    "ray_owner_info",
    "raycluster_info",
    "reservation_body",
    "reservation_info",
    "rfc3339",
    "worker_replicas",
    "workload_info",
]


# creationTimestamp feeds tpuslice_raycluster_creation_seconds; labels carry Kueue's
# queue-name and priority-class, which stand in for spec.kueue when it is absent.
_CLUSTER_METADATA = (
    "name",
    "namespace",
    "uid",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "labels",
)


def cluster_record(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a TPUSliceCluster, TPUSliceJob or TPUSliceService the reconcile reads.
    Dropping managedFields and the last-applied annotation keeps the index a fraction of
    the objects' size."""
    meta = obj.get("metadata") or {}
    return {
        "kind": obj.get("kind") or c.KIND_CLUSTER,
        "metadata": {k: meta[k] for k in _CLUSTER_METADATA if k in meta},
        "spec": obj.get("spec") or {},
        "status": obj.get("status") or {},
    }


def pass_inputs(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a TPUSlice object's own change a pass can act on: its uid, generation (a
    spec change; the kinds have a status subresource), deletion and labels (Kueue's
    queue-name label is a spec input). Not its status (the status writer starts from what
    it wrote), annotations or finalizers (kopf's bookkeeping, which ``cluster_record``
    drops), nor resourceVersion: our own status patch and kopf's annotation patches are
    MODIFIED events that change none of these, and each kicked a pass that found nothing
    to do."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    return (
        meta.get("uid"),
        meta.get("generation"),
        meta.get("deletionTimestamp"),
        tuple(sorted((str(k), str(v)) for k, v in labels.items())),
    )


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _condition_true(status: Mapping[str, Any], kind: str) -> bool:
    return any(
        cond.get("type") == kind and cond.get("status") == "True"
        for cond in status.get("conditions") or []
    )


def _unschedulable_since(status: Mapping[str, Any]) -> str:
    """lastTransitionTime of PodScheduled=False reason Unschedulable: the scheduler's
    verdict that no node fits the pod ("Pod Lifecycle", Pod conditions,
    https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-conditions)."""
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return str(cond.get("lastTransitionTime") or "")
    return ""


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    gates = {g.get("name") for g in spec.get("schedulingGates") or []}
    return PodInfo(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        cluster=labels.get(c.LABEL_CLUSTER, ""),
        replica_name=labels.get(c.KUBERAY_LABEL_REPLICA_NAME),
        replica_index=_int(labels.get(c.KUBERAY_LABEL_REPLICA_INDEX)),
        host_index=_int(labels.get(c.KUBERAY_LABEL_HOST_INDEX)),
        gated=c.SCHEDULING_GATE in gates,
        pinned_pool=_pinned_unit(spec.get("nodeSelector") or {}),
        node_name=spec.get("nodeName"),
        running_ready=status.get("phase") == "Running" and _condition_true(status, "Ready"),
        deleting=bool(meta.get("deletionTimestamp")),
        created=meta.get("creationTimestamp", ""),
        owner_kind=labels.get(c.LABEL_OWNER_KIND) or c.KIND_CLUSTER,
        ray_cluster=labels.get(c.KUBERAY_LABEL_CLUSTER, ""),
        unschedulable_since=_unschedulable_since(status),
        released_at=str((meta.get("annotations") or {}).get(c.ANNOTATION_RELEASED_AT) or ""),
        deletion_deadline=str(meta.get("deletionTimestamp") or ""),
        group=labels.get(c.KUBERAY_LABEL_GROUP, ""),
        kueue_gated=any(str(g).startswith(c.KUEUE_GATE_PREFIX) for g in gates),
    )


def capacity_type(labels: Mapping[str, str]) -> CapacityType:
    """How GKE provisioned the node, from the labels GKE sets on it.

    - ``cloud.google.com/reservation-name: <reservation>``: the VM consumes a Compute
      Engine reservation (GKE "Consuming reserved zonal resources",
      https://cloud.google.com/kubernetes-engine/docs/how-to/consuming-reservations;
      also the label of calendar-mode future reservations).
    - ``cloud.google.com/gke-spot: "true"``: a Spot VM (GKE "Spot VMs",
      https://cloud.google.com/kubernetes-engine/docs/how-to/spot-vms). Legacy preemptible
      VMs (``cloud.google.com/gke-preemptible: "true"``) share Spot's pricing and
      reclaim model and count as Spot.
    - ``cloud.google.com/gke-flex-start: "true"`` (or ``cloud.google.com/gke-provisioning:
      flex-start``): a flex-start VM (GKE "About flex-start",
      https://cloud.google.com/kubernetes-engine/docs/concepts/dws; TPU how-to
      https://cloud.google.com/kubernetes-engine/docs/how-to/dws-flex-start-training-tpu).
    - none of these: OnDemand.
    """
    if labels.get(c.NODE_LABEL_RESERVATION_NAME):
        return CapacityType.RESERVATION
    if "true" in (labels.get(c.NODE_LABEL_SPOT), labels.get(c.NODE_LABEL_PREEMPTIBLE)):
        return CapacityType.SPOT
    if (
        labels.get(c.NODE_LABEL_FLEX_START) == "true"
        or labels.get(c.NODE_LABEL_PROVISIONING) == "flex-start"
    ):
        return CapacityType.FLEX_START
    return CapacityType.ON_DEMAND


def node_info(node: Mapping[str, Any]) -> NodeInfo:
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or {}
    return NodeInfo(
        name=meta.get("name", ""),
        pool=labels.get(c.NODE_LABEL_NODEPOOL, ""),
        accelerator=labels.get(c.NODE_LABEL_ACCELERATOR, ""),
        topology=labels.get(c.NODE_LABEL_TOPOLOGY, ""),
        chips=_int(allocatable.get(c.TPU_RESOURCE)) or 0,
        ready=_condition_true(status, "Ready"),
        schedulable=not spec.get("unschedulable", False),
        capacity_type=capacity_type(labels),
        block=labels.get(c.NODE_LABEL_TOPOLOGY_BLOCK) or None,
        subblock=labels.get(c.NODE_LABEL_TOPOLOGY_SUBBLOCK) or None,
        capacity_labels={k: labels[k] for k in c.CAPACITY_SELECTOR_KEYS if k in labels},
        created=str(meta.get("creationTimestamp") or ""),
        topology_mode=labels.get(c.NODE_LABEL_ACCELERATOR_TOPOLOGY_MODE, ""),
        partition_labels=tuple(
            sorted(
                k
                for k in labels
                if k.startswith(c.NODE_LABEL_TPU_PARTITION_PREFIX)
                and k.endswith(c.NODE_LABEL_TPU_PARTITION_ID_SUFFIX)
            )
        ),
        gke_slice=labels.get(c.NODE_LABEL_TPU_SLICE, ""),
        labels=dict(labels),
        taints=node_taints(spec),
        not_ready_since=_not_ready_since(status),
    )


def _not_ready_since(status: Mapping[str, Any]) -> str:
    """When the node's Ready condition last left True (its lastTransitionTime while it
    is False or Unknown); empty on a Ready node."""
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            if cond.get("status") == "True":
                return ""
            return str(cond.get("lastTransitionTime") or "")
    return ""


def _pinned_unit(selector: Mapping[str, Any]) -> str | None:
    """The unit a released pod is pinned to: its node (a single-host slice), its GKE
    Slice (a dynamic slice), else its node pool (``CapacityUnit.pin``)."""
    return (
        selector.get(c.NODE_LABEL_HOSTNAME)
        or selector.get(c.NODE_LABEL_TPU_SLICE)
        or selector.get(c.NODE_LABEL_NODEPOOL)
    )


#: Taint effects that keep a pod off a node (PreferNoSchedule only discourages).
REPELLING_EFFECTS = ("NoSchedule", "NoExecute")


def node_taints(spec: Mapping[str, Any]) -> tuple[Taint, ...]:
    """The node's NoSchedule and NoExecute taints (core/v1 NodeSpec.taints)."""
    out = []
    for taint in spec.get("taints") or []:
        if isinstance(taint, Mapping) and taint.get("effect") in REPELLING_EFFECTS:
            out.append(
                Taint(str(taint.get("key") or ""), str(taint.get("value") or ""), taint["effect"])
            )
    return tuple(out)


def namespace_labels(namespace: Mapping[str, Any]) -> dict[str, str]:
    """What the operator keeps of a Namespace: its labels (TPUSlicePolicies select by them)."""
    labels = (namespace.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def reservation_info(obj: Mapping[str, Any]) -> ReservationInfo:
    spec = obj.get("spec") or {}
    holder = spec.get("holder") or {}
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return ReservationInfo(
        pool=spec.get("node")
        or spec.get("nodePool")
        or (obj.get("metadata") or {}).get("name", ""),
        holder=Holder(
            namespace=holder.get("namespace", ""),
            name=holder.get("name", ""),
            uid=holder.get("uid", ""),
            replica_name=holder.get("replicaName", ""),
            replica_index=_int(holder.get("replicaIndex")),
            kind=holder.get("kind") or c.KIND_CLUSTER,
            ray_cluster=holder.get("rayCluster") or "",
            group=holder.get("group") or "",
        ),
        phase=(obj.get("status") or {}).get("phase"),
        uid=str((obj.get("metadata") or {}).get("uid") or ""),
        resource_version=str((obj.get("metadata") or {}).get("resourceVersion") or ""),
        pinned=annotations.get(c.ANNOTATION_PIN) == "true",
        unpinned_at=str(annotations.get(c.ANNOTATION_PIN_REMOVED_AT) or ""),
    )


def reservation_shape(obj: Mapping[str, Any]) -> tuple[str, str]:
    spec = obj.get("spec") or {}
    return spec.get("gkeAccelerator", ""), spec.get("topology", "")


def holder_spec(holder: Holder) -> dict[str, Any]:
    """``spec.holder`` of a SliceReservation (the kind only when not a TPUSliceCluster, so
    reservations of clusters read the same by older versions)."""
    spec: dict[str, Any] = {
        "namespace": holder.namespace,
        "name": holder.name,
        "uid": holder.uid,
        "replicaName": holder.replica_name,
    }
    if holder.replica_index is not None:
        spec["replicaIndex"] = holder.replica_index
    if holder.kind != c.KIND_CLUSTER:
        spec["kind"] = holder.kind
    if holder.ray_cluster:
        spec["rayCluster"] = holder.ray_cluster
    if holder.group:
        spec["group"] = holder.group
    return spec


def reservation_body(
    pool: str,
    holder: Holder,
    *,
    gke_accelerator: str,
    accelerator_type: str,
    topology: str,
    hosts: int,
    node_pool: str | None = None,
) -> dict[str, Any]:
    """The claim of the unit ``pool``, named after it: a whole node pool, or (with
    ``node_pool``, the node's pool) one node of a single-host pool, ``spec.node``."""
    labels = {c.LABEL_CLUSTER: holder.name, c.LABEL_MANAGED_BY: c.MANAGED_BY}
    if holder.kind != c.KIND_CLUSTER:
        labels[c.LABEL_OWNER_KIND] = holder.kind
    spec: dict[str, Any] = {"nodePool": node_pool or pool}
    if node_pool is not None:
        spec["node"] = pool
    spec.update(
        {
            "gkeAccelerator": gke_accelerator,
            "acceleratorType": accelerator_type,
            "topology": topology,
            "hosts": hosts,
            "holder": holder_spec(holder),
        }
    )
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND_RESERVATION,
        "metadata": {"name": pool, "labels": labels},
        "spec": spec,
    }


def _owns_suspend(meta: Mapping[str, Any]) -> bool:
    """Whether our field manager set spec.suspend (KubeRay resumes only on an explicit false,
    so we must send one after lifting our own suspension, and only then)."""
    for entry in meta.get("managedFields") or []:
        if entry.get("manager") == c.FIELD_MANAGER:
            spec = ((entry.get("fieldsV1") or {}).get("f:spec")) or {}
            if "f:suspend" in spec:
                return True
    return False


def raycluster_info(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the reconcile compares and reports: our applied fields and KubeRay's state."""
    meta = obj.get("metadata") or {}
    return {
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "ownsSuspend": _owns_suspend(meta),
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
        "deleting": bool(meta.get("deletionTimestamp")),
        "labels": dict(meta.get("labels") or {}),
        "annotations": dict(meta.get("annotations") or {}),
        "ownerReferences": list(meta.get("ownerReferences") or []),
        "spec": obj.get("spec") or {},
        "state": (obj.get("status") or {}).get("state"),
    }


def worker_replicas(
    raycluster: Mapping[str, Any] | None, group_name: str = c.WORKER_GROUP
) -> int | None:
    """The ``replicas`` of a RayCluster's (``raycluster_info`` or the object) worker group
    ``group_name`` (the one-group form's TPU group by default): for an elastic set the
    Ray autoscaler's count. None when there is no RayCluster, no such group, or no count
    written (KubeRay's default, 0, not stored)."""
    if raycluster is None:
        return None
    for group in (raycluster.get("spec") or {}).get("workerGroupSpecs") or []:
        if isinstance(group, Mapping) and group.get("groupName") == group_name:
            replicas = group.get("replicas")
            if isinstance(replicas, int) and not isinstance(replicas, bool):
                return replicas
            return None
    return None


def workload_info(obj: Mapping[str, Any]) -> KueueWorkload:
    """A Kueue Workload as the status needs it (``records.KueueWorkload``)."""
    status = obj.get("status") or {}
    conditions = {
        str(cond.get("type")): cond
        for cond in status.get("conditions") or []
        if isinstance(cond, Mapping)
    }

    def true(kind: str) -> bool:
        return (conditions.get(kind) or {}).get("status") == "True"

    reserved = conditions.get("QuotaReserved") or {}
    evicted = conditions.get("Evicted") or {}
    ready = conditions.get("PodsReady") or {}
    checks = tuple(
        (
            str(check.get("name") or ""),
            str(check.get("state") or ""),
            str(check.get("message") or ""),
        )
        for check in status.get("admissionChecks") or []
        if isinstance(check, Mapping) and check.get("state") != "Ready"
    )
    return KueueWorkload(
        name=str((obj.get("metadata") or {}).get("name") or ""),
        admitted=true("Admitted"),
        pending="" if true("QuotaReserved") else str(reserved.get("message") or ""),
        evicted_reason=str(evicted.get("reason") or "") if true("Evicted") else "",
        evicted_message=str(evicted.get("message") or "") if true("Evicted") else "",
        cluster_queue=str((status.get("admission") or {}).get("clusterQueue") or ""),
        checks=checks,
        pods_not_ready_since=(
            str(ready.get("lastTransitionTime") or "")
            if true("Admitted") and ready.get("status") == "False"
            else ""
        ),
        admitted_since=(
            str((conditions.get("Admitted") or {}).get("lastTransitionTime") or "")
            if true("Admitted")
            else ""
        ),
        pods_ready=true("PodsReady"),
        pods_ready_reason=str(ready.get("reason") or "") if ready.get("status") == "False" else "",
        requeue_count=_count((status.get("requeueState") or {}).get("count")),
        requeue_at=str((status.get("requeueState") or {}).get("requeueAt") or ""),
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def ray_owner_info(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A RayJob or RayService: what ``raycluster_info`` keeps, and its whole status (the
    TPUSliceJob's and TPUSliceService's status is computed from it)."""
    return {**raycluster_info(obj), "status": dict(obj.get("status") or {})}


def rfc3339(when: datetime) -> str:
    """``when`` as the API server writes a timestamp (``2026-11-30T00:00:00Z``, whole
    seconds): what ``timestamp`` reads back."""
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def timestamp(value: Any) -> datetime | None:
    """An RFC 3339 timestamp of the API server (``2026-11-30T00:00:00Z``) as an aware
    UTC datetime; None when absent or not one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def provisioning_request_info(obj: Mapping[str, Any]) -> ProvisioningRequestInfo:
    """One of our ProvisioningRequests as the decisions need it: which slice and attempt
    (our labels and annotations), its class, conditions by type and class details."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    status = obj.get("status") or {}
    conditions: dict[str, RequestCondition] = {}
    for cond in status.get("conditions") or []:
        if not isinstance(cond, Mapping) or not cond.get("type"):
            continue
        conditions[str(cond["type"])] = RequestCondition(
            type=str(cond["type"]),
            status=str(cond.get("status") or "Unknown"),
            reason=str(cond.get("reason") or ""),
            message=str(cond.get("message") or ""),
            last_transition=timestamp(cond.get("lastTransitionTime")),
        )
    details = status.get("provisioningClassDetails") or {}
    return ProvisioningRequestInfo(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=str(meta.get("uid") or ""),
        raycluster=labels.get(c.LABEL_RAYCLUSTER, ""),
        slice_index=_int(labels.get(c.LABEL_SLICE_INDEX)),
        attempt=_int(labels.get(c.LABEL_PROVISIONING_ATTEMPT)) or 1,
        failures=max(0, _int(annotations.get(c.ANNOTATION_PROVISIONING_FAILURES)) or 0),
        class_name=str((obj.get("spec") or {}).get("provisioningClassName") or ""),
        spec_hash=str(annotations.get(c.ANNOTATION_PROVREQ_HASH) or ""),
        conditions=conditions,
        details={str(k): str(v) for k, v in details.items()}
        if isinstance(details, Mapping)
        else {},
        created=timestamp(meta.get("creationTimestamp")),
        deleting=bool(meta.get("deletionTimestamp")),
        revoked_pool=str(annotations.get(c.ANNOTATION_REVOKED_POOL) or "") or None,
    )


def _owner_of(meta: Mapping[str, Any]) -> ObjectKey:
    labels = meta.get("labels") or {}
    return (
        str(labels.get(c.LABEL_OWNER_KIND) or c.KIND_CLUSTER),
        str(meta.get("namespace") or ""),
        str(labels.get(c.LABEL_CLUSTER) or ""),
    )


def owned_request(obj: Mapping[str, Any]) -> OwnedRequest:
    return OwnedRequest(_owner_of(obj.get("metadata") or {}), provisioning_request_info(obj))


def podtemplate_record(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the shell needs of one of our PodTemplates: its owner, name, age, the uid of
    its controller (the request, once made its owner) and its template."""
    meta = obj.get("metadata") or {}
    controller = next(
        (
            str(o.get("uid") or "")
            for o in meta.get("ownerReferences") or []
            if o.get("controller") and o.get("kind") == c.PROVREQ_KIND
        ),
        "",
    )
    return {
        "owner": _owner_of(meta),
        "raycluster": str((meta.get("labels") or {}).get(c.LABEL_RAYCLUSTER) or ""),
        "namespace": str(meta.get("namespace") or ""),
        "name": str(meta.get("name") or ""),
        "created": str(meta.get("creationTimestamp") or ""),
        "controller": controller,
        "template": obj.get("template") or {},
    }


def gke_slice_info(obj: Mapping[str, Any]) -> GkeSliceInfo:
    """A GKE Slice -> its record; ``owner`` only when every owner annotation is there
    (a Slice someone else created, or edited away from us, is foreign)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    notes = meta.get("annotations") or {}
    kind = notes.get(c.ANNOTATION_SLICE_OWNER_KIND, "")
    namespace = notes.get(c.ANNOTATION_SLICE_OWNER_NAMESPACE, "")
    name = notes.get(c.ANNOTATION_SLICE_OWNER_NAME, "")
    ready = next(
        (
            cond
            for cond in (obj.get("status") or {}).get("conditions") or ()
            if isinstance(cond, Mapping) and cond.get("type") == "Ready"
        ),
        {},
    )
    ids = spec.get("partitionIds") or ()
    return GkeSliceInfo(
        name=str(meta.get("name") or ""),
        topology=str(spec.get("topology") or ""),
        partition_ids=tuple(str(i) for i in ids if isinstance(i, str)),
        owner=(kind, namespace, name) if kind and namespace and name else None,
        owner_uid=str(notes.get(c.ANNOTATION_SLICE_OWNER_UID) or ""),
        replica_name=str(notes.get(c.ANNOTATION_SLICE_REPLICA) or ""),
        replica_index=_int(notes.get(c.ANNOTATION_SLICE_INDEX)),
        ready=ready.get("status") == "True",
        reason=str(ready.get("reason") or ""),
        message=str(ready.get("message") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        uid=str(meta.get("uid") or ""),
        created=str(meta.get("creationTimestamp") or ""),
    )


def gke_slice_body(
    name: str, holder: Holder, *, topology: str, partition_ids: Sequence[str]
) -> dict[str, Any]:
    """The GKE Slice that links ``partition_ids`` into one ``topology`` slice for
    ``holder``'s slice (GKE "Use dynamic slicing with a custom scheduler": spec type,
    topology, partitionIds, all immutable). Cluster-scoped, so no owner reference can
    name the namespaced TPUSlice object: the annotations do, and the operator deletes
    the Slice itself."""
    notes = {
        c.ANNOTATION_SLICE_OWNER_KIND: holder.kind,
        c.ANNOTATION_SLICE_OWNER_NAMESPACE: holder.namespace,
        c.ANNOTATION_SLICE_OWNER_NAME: holder.name,
        c.ANNOTATION_SLICE_OWNER_UID: holder.uid,
        c.ANNOTATION_SLICE_REPLICA: holder.replica_name,
    }
    if holder.replica_index is not None:
        notes[c.ANNOTATION_SLICE_INDEX] = str(holder.replica_index)
    return {
        "apiVersion": f"{c.SLICE_GROUP}/{c.SLICE_VERSION}",
        "kind": c.SLICE_KIND,
        "metadata": {
            "name": name,
            "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY},
            "annotations": notes,
        },
        "spec": {
            "type": c.SLICE_TYPE_TPU7X,
            "topology": topology,
            "partitionIds": list(partition_ids),
        },
    }
