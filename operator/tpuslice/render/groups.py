"""A CPU worker group of a many-group cluster (spec.workerGroups[].cpu), as a KubeRay
worker group: plain Ray workers beside the TPU slices, for Ray Data preprocessing or
anything else that needs no chip.

A CPU group is never gated and never reserved: its pods schedule as soon as KubeRay
makes them, so they never wait for TPU pools (and TPU slices never wait for them).
They must not land on TPU nodes either, where they would take a host a slice needs:
every node selector term gets ``cloud.google.com/gke-tpu-accelerator DoesNotExist``
(GKE labels every TPU node with it [doc: "About TPUs in GKE",
https://cloud.google.com/kubernetes-engine/docs/concepts/tpus]), after the user's
template is merged, so an override cannot drop it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuslice.model import constants as c
from tpuslice.spec.overrides import merge_template
from tpuslice.spec.parts import CpuGroupSpec, FieldError, SliceClusterSpec

__all__ = ["NOT_ON_TPU_NODES", "cpu_worker_group", "keep_off_tpu_nodes"]

#: The node selector requirement that keeps a pod off every GKE TPU node.
NOT_ON_TPU_NODES: Mapping[str, Any] = {
    "key": c.NODE_LABEL_ACCELERATOR,
    "operator": "DoesNotExist",
}


def keep_off_tpu_nodes(pod_spec: dict[str, Any]) -> None:
    """Add ``NOT_ON_TPU_NODES`` to every required node selector term of ``pod_spec`` (one
    term holding only it when there is none). Terms are ORed, so each needs it."""
    required = (
        pod_spec.setdefault("affinity", {})
        .setdefault("nodeAffinity", {})
        .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    )
    terms: list[dict[str, Any]] = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        expressions: list[Mapping[str, Any]] = term.setdefault("matchExpressions", [])
        if dict(NOT_ON_TPU_NODES) not in [dict(e) for e in expressions]:
            expressions.append(dict(NOT_ON_TPU_NODES))


def _container_resources(resources: Mapping[str, str]) -> dict[str, Any]:
    if not resources:
        return {}
    return {"requests": dict(resources), "limits": dict(resources)}


def cpu_worker_group(
    spec: SliceClusterSpec,
    group: CpuGroupSpec,
    path: str,
    schema: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], list[FieldError]]:
    """The KubeRay worker group of ``group`` (at ``path`` in the spec, for messages) and
    the problems of its template override."""
    container: dict[str, Any] = {"name": c.WORKER_CONTAINER, "image": spec.image}
    if resources := _container_resources(group.worker.resources):
        container["resources"] = resources
    base = {"spec": {"containers": [container]}}
    owned = [
        (
            ("spec", "containers", ("name", c.WORKER_CONTAINER), "resources", kind, c.TPU_RESOURCE),
            None,
            "a CPU group requests no TPU chips; use a tpu group",
        )
        for kind in ("requests", "limits")
    ]
    template, problems = merge_template(
        base, group.worker.template, owned, f"{path}.template", schema
    )
    keep_off_tpu_nodes(template.setdefault("spec", {}))
    out: dict[str, Any] = {
        "groupName": group.name,
        "replicas": group.replicas,
        "minReplicas": group.replicas,
        "maxReplicas": group.replicas,
        "rayStartParams": dict(group.worker.ray_start_params),
        "template": template,
    }
    if group.max_replicas is not None:
        # the count is the autoscaler's, as an elastic TPU group's (``render.kuberay``)
        del out["replicas"]
        out["scaleStrategy"] = {"workersToDelete": []}
        out["maxReplicas"] = group.max_replicas
    return out, problems
