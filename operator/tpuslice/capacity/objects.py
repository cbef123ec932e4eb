"""Capacity on demand: the two objects one waiting slice asks with, all pure.

A slice whose pods all exist and for which no free matching node pool does asks the
cluster autoscaler for one (``spec.reservation.provisioning``): a PodTemplate (a
gate-free copy of the slice's scheduling fields) and a ProvisioningRequest
(``autoscaling.x-k8s.io/v1``) of ONE pod set of hosts-per-slice pods that owns it.
Once the request is ``Provisioned`` the slice claims a pool (queued class: the
pool the request's status names; other classes: any fresh whole pool the planner
finds eligible) with a SliceReservation as always, and the one release patch adds
the two consume annotations (``consume_annotations``). This module names and builds
those objects; ``decide`` says when. Facts it relies on:
/work/shared/docs/capacity-facts.md (sources named there) and kubernetes/autoscaler
``apis/provisioningrequest/autoscaling.x-k8s.io/v1/types.go``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from tpuslice.model import constants as c
from tpuslice.model.records import CapacityUnit, ProvisioningMode
from tpuslice.render.kuberay import QUEUED_TOLERATION
from tpuslice.spec.parts import ProvisioningSpec, SliceClusterSpec

__all__ = [
    "MAX_REQUEST_NAME",
    "consume_annotations",
    "podtemplate_body",
    "podtemplate_owner_references",
    "request_body",
    "request_hash",
    "request_labels",
    "request_name",
    "worker_template_of",
]

#: Longest request (and PodTemplate) name: a label value, so it can be selected on.
MAX_REQUEST_NAME = 63

_SCHEDULING_FIELDS = (
    "nodeSelector",
    "affinity",
    "tolerations",
    "priorityClassName",
    "runtimeClassName",
    "schedulerName",
    "topologySpreadConstraints",
)


# ------------------------------------------------------------------------- names


def request_name(raycluster: str, index: int, attempt: int) -> str:
    """``<raycluster>-s<index>-<attempt>``, the name of a slice's request and PodTemplate.

    By the RayCluster (not the TPUSlice object): RayCluster names are unique in a
    namespace across all three kinds, and a TPUSliceService has two clusters during an
    upgrade. Within 63 characters (53 + a 4-digit index + a 3-digit attempt fit);
    longer ones keep a prefix and a digest of the whole, so they stay unique."""
    name = f"{raycluster}-s{index}-{attempt}"
    if len(name) <= MAX_REQUEST_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    tail = f"-{digest}-s{index}-{attempt}"
    return raycluster[: max(1, MAX_REQUEST_NAME - len(tail))].rstrip("-") + tail


def request_labels(
    spec: SliceClusterSpec, raycluster: str, index: int, attempt: int
) -> dict[str, str]:
    """Labels of a slice's request and PodTemplate: the owner (as on its pods), the
    RayCluster, the slice index and the attempt."""
    labels = {
        c.LABEL_CLUSTER: spec.name,
        c.LABEL_RAYCLUSTER: raycluster,
        c.LABEL_SLICE_INDEX: str(index),
        c.LABEL_PROVISIONING_ATTEMPT: str(attempt),
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
    }
    if spec.owner_kind != c.KIND_CLUSTER:
        labels[c.LABEL_OWNER_KIND] = spec.owner_kind
    return labels


def _owner(spec: SliceClusterSpec, *, controller: bool) -> dict[str, Any]:
    return {
        "apiVersion": c.API_VERSION,
        "kind": spec.owner_kind,
        "name": spec.name,
        "uid": spec.uid,
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def _metadata(spec: SliceClusterSpec, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if spec.namespace:
        meta["namespace"] = spec.namespace
    meta["labels"] = dict(labels)
    return meta


# ---------------------------------------------------------------------- template


def worker_template_of(cluster_spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The TPU worker group's pod template in a rendered RayCluster spec (a RayJob's
    rayClusterSpec or a RayService's rayClusterConfig are the same)."""
    for group in cluster_spec.get("workerGroupSpecs") or []:
        if group.get("groupName") == c.WORKER_GROUP:
            template = group.get("template")
            return template if isinstance(template, Mapping) else None
    return None


def _container(raw: Mapping[str, Any]) -> dict[str, Any]:
    """What the autoscaler's simulation needs of a container: its requests (and the
    name and image a PodTemplate must have), and host ports, which limit placement."""
    out: dict[str, Any] = {"name": raw.get("name", ""), "image": raw.get("image", "")}
    if raw.get("resources"):
        out["resources"] = json.loads(json.dumps(raw["resources"]))
    ports = [dict(p) for p in raw.get("ports") or [] if p.get("hostPort")]
    if ports:
        out["ports"] = ports
    return out


def _with_not_in(
    affinity: Mapping[str, Any] | None, key: str, values: Sequence[str]
) -> dict[str, Any]:
    """``affinity`` with ``key NotIn values`` required in every node selector term (terms
    are ORed, so each one must carry it)."""
    out = json.loads(json.dumps(affinity or {}))
    expression = {"key": key, "operator": "NotIn", "values": list(values)}
    node = out.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        term.setdefault("matchExpressions", []).append(dict(expression))
    required["nodeSelectorTerms"] = terms
    return out  # type: ignore[no-any-return]


def _tolerates(tolerations: Sequence[Mapping[str, Any]], key: str) -> bool:
    return any(
        t.get("key") == key or (not t.get("key") and t.get("operator") == "Exists")
        for t in tolerations
    )


def podtemplate_body(
    spec: SliceClusterSpec,
    *,
    raycluster: str,
    index: int,
    attempt: int,
    worker_template: Mapping[str, Any],
    exclude_units: Collection[str] = (),
) -> dict[str, Any]:
    """The core/v1 PodTemplate a slice's request points at: a gate-free copy of the
    worker pods' scheduling fields (selectors including the TPU and capacity keys,
    tolerations, affinity, container requests), never pinned to a node pool. For a
    queued class it tolerates ``cloud.google.com/gke-queued``; for the others it
    requires that the pods fit none of ``exclude_units``, the units of the shape that
    exist already, so the autoscaler cannot count capacity that is there (held by a
    gated slice, or another object's): ``cloud.google.com/gke-nodepool NotIn`` the node
    pools of a multi-host slice (GKE makes such a pool as one slice, so new capacity is a
    new pool), ``kubernetes.io/hostname NotIn`` the nodes of a single-host slice (GKE
    grows a single-host pool node by node, so the request may grow an existing pool,
    and a new node's name is never in the list).

    Owned by the TPUSlice object (not as controller) until the shell adds the request
    as its controller (``podtemplate_owner_references``). Deterministic, so the shell
    can compare it with the stored one: PodTemplates are mutable and the autoscaler
    re-reads them every loop, so a stale ``exclude_units`` is refreshed by an update."""
    prov = spec.provisioning or ProvisioningSpec(mode=ProvisioningMode.NONE)
    pod_spec = worker_template.get("spec") or {}
    out_spec: dict[str, Any] = {}
    for key in _SCHEDULING_FIELDS:
        if pod_spec.get(key):
            out_spec[key] = json.loads(json.dumps(pod_spec[key]))
    selector = {
        k: v for k, v in (out_spec.get("nodeSelector") or {}).items() if k != c.NODE_LABEL_NODEPOOL
    }
    selector.setdefault(c.NODE_LABEL_ACCELERATOR, spec.shape.generation.gke_accelerator)
    selector.setdefault(c.NODE_LABEL_TOPOLOGY, spec.shape.topology)
    selector.update(prov.node_selector)
    out_spec["nodeSelector"] = dict(sorted(selector.items()))
    tolerations = list(out_spec.get("tolerations") or [])
    if not _tolerates(tolerations, c.TPU_TAINT_KEY):
        tolerations.append({"key": c.TPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
    if prov.queued and not _tolerates(tolerations, c.QUEUED_TAINT_KEY):
        tolerations.append(dict(QUEUED_TOLERATION))
    out_spec["tolerations"] = tolerations
    if not prov.queued and exclude_units:
        label = CapacityUnit.for_hosts(spec.shape.hosts).label
        out_spec["affinity"] = _with_not_in(
            out_spec.get("affinity"), label, sorted(set(exclude_units))
        )
    out_spec["containers"] = [_container(x) for x in pod_spec.get("containers") or []]
    if pod_spec.get("initContainers"):
        out_spec["initContainers"] = [_container(x) for x in pod_spec["initContainers"]]
    template_meta = worker_template.get("metadata") or {}
    name = request_name(raycluster, index, attempt)
    meta = _metadata(spec, name, request_labels(spec, raycluster, index, attempt))
    if spec.uid:
        meta["ownerReferences"] = [_owner(spec, controller=False)]
    return {
        "apiVersion": "v1",
        "kind": c.PODTEMPLATE_KIND,
        "metadata": meta,
        "template": {
            "metadata": {"labels": dict(template_meta.get("labels") or {})},
            "spec": out_spec,
        },
    }


def podtemplate_owner_references(
    spec: SliceClusterSpec, request: str, request_uid: str
) -> list[dict[str, Any]]:
    """The PodTemplate's whole ownerReferences once its request exists: the request as
    controller (so the autoscaler never sees a request without its template for long:
    garbage collection deletes the template with it) and the TPUSlice object, not as
    controller (only one owner may be). For a merge patch of ``metadata.ownerReferences``."""
    owners = [
        {
            "apiVersion": c.PROVREQ_API_VERSION,
            "kind": c.PROVREQ_KIND,
            "name": request,
            "uid": request_uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    if spec.uid:
        owners.append(_owner(spec, controller=False))
    return owners


# ----------------------------------------------------------------------- request


def request_hash(spec: SliceClusterSpec) -> str:
    """Digest of what a request's immutable spec is made of (class, parameters, pod
    count): a request whose digest differs is replaced while not yet provisioned."""
    prov = spec.provisioning
    payload = {
        "class": prov.class_name if prov else "",
        "parameters": dict(sorted((prov.parameters if prov else {}).items())),
        "count": spec.shape.hosts,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def request_body(
    spec: SliceClusterSpec, *, raycluster: str, index: int, attempt: int, failures: int = 0
) -> dict[str, Any]:
    """The ProvisioningRequest of one slice: one pod set of hosts-per-slice pods of the
    PodTemplate of the same name, the mode's class (or the override), the parameters as
    written. Controller-owned by the TPUSlice object."""
    prov = spec.provisioning
    if prov is None or not prov.enabled:
        raise ValueError("spec.reservation.provisioning asks for no requests")
    name = request_name(raycluster, index, attempt)
    meta = _metadata(spec, name, request_labels(spec, raycluster, index, attempt))
    meta["annotations"] = {
        c.ANNOTATION_PROVISIONING_FAILURES: str(failures),
        c.ANNOTATION_PROVREQ_HASH: request_hash(spec),
    }
    if spec.uid:
        meta["ownerReferences"] = [_owner(spec, controller=True)]
    body: dict[str, Any] = {
        "apiVersion": c.PROVREQ_API_VERSION,
        "kind": c.PROVREQ_KIND,
        "metadata": meta,
        "spec": {
            "provisioningClassName": prov.class_name,
            "podSets": [{"podTemplateRef": {"name": name}, "count": spec.shape.hosts}],
        },
    }
    if prov.parameters:
        body["spec"]["parameters"] = dict(prov.parameters)
    return body


def consume_annotations(request: str, class_name: str) -> dict[str, str]:
    """Both annotations a pod consuming ``request`` carries (the release patch adds them)."""
    return {c.ANNOTATION_CONSUME_PROVREQ: request, c.ANNOTATION_PROVREQ_CLASS: class_name}
