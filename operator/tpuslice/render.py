"""TPUSliceCluster -> KubeRay RayCluster, as a pure function over plain dicts.

The RayCluster is the whole product a user sees, so its expansion is one
function with golden tests and the ``tpuslice render`` command, and the
operator applies exactly what this returns (server-side apply, so fields set by
users or other controllers, such as Kueue, are left alone: we only send the
fields we own).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuslice import constants as c
from tpuslice.overrides import OwnedValue, merge_template
from tpuslice.spec import FieldError, SliceClusterSpec, SpecError, parse_cluster

__all__ = ["DEFAULT_HEAD_RESOURCES", "render_cluster", "render_raycluster"]

#: Head resources when the user gives none: the head runs GCS and the
#: dashboard, no TPU work, and a BestEffort head is the first pod evicted.
DEFAULT_HEAD_RESOURCES: Mapping[str, str] = {"cpu": "2", "memory": "8Gi"}


def _container_resources(resources: Mapping[str, str]) -> dict[str, Any]:
    """The shorthand ``resources: {cpu, memory}`` means requests = limits (Guaranteed QoS)."""
    if not resources:
        return {}
    return {"requests": dict(resources), "limits": dict(resources)}


def _owner_reference(spec: SliceClusterSpec) -> list[dict[str, Any]]:
    if not spec.uid:  # a local file read by `tpuslice render` has no uid yet
        return []
    return [
        {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND_CLUSTER,
            "name": spec.name,
            "uid": spec.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def worker_labels(spec: SliceClusterSpec) -> dict[str, str]:
    """Labels on every worker pod: the webhook's objectSelector and users' selectors use them."""
    return {
        c.LABEL_CLUSTER: spec.name,
        c.LABEL_ACCELERATOR_TYPE: spec.shape.accelerator_type,
        c.LABEL_TOPOLOGY: spec.shape.topology,
    }


def worker_annotations(spec: SliceClusterSpec) -> dict[str, str]:
    """What the TPU identity webhook reads besides KubeRay's labels (see identity.py)."""
    return {
        c.ANNOTATION_TPU_TYPE: spec.shape.generation.name,
        c.ANNOTATION_CHIPS_PER_HOST: str(spec.shape.chips_per_host),
        c.ANNOTATION_SLICES: str(spec.slices),
    }


def _head_template(
    spec: SliceClusterSpec, schema: Mapping[str, Any] | None
) -> tuple[dict[str, Any], list[FieldError]]:
    resources = {**DEFAULT_HEAD_RESOURCES, **spec.head.resources}
    base = {
        "spec": {
            "containers": [
                {
                    "name": c.HEAD_CONTAINER,
                    "image": spec.image,
                    "resources": _container_resources(resources),
                }
            ]
        }
    }
    return merge_template(base, spec.head.template, (), "spec.head.template", schema)


def _worker_owned(spec: SliceClusterSpec) -> list[OwnedValue]:
    chips = str(spec.shape.chips_per_host)
    container = ("spec", "containers", ("name", c.WORKER_CONTAINER), "resources")
    owned: list[OwnedValue] = [
        (
            ("spec", "nodeSelector", c.NODE_LABEL_ACCELERATOR),
            spec.shape.generation.gke_accelerator,
            "from spec.tpu.type",
        ),
        (
            ("spec", "nodeSelector", c.NODE_LABEL_TOPOLOGY),
            spec.shape.topology,
            "from spec.tpu.topology",
        ),
        ((*container, "requests", c.TPU_RESOURCE), chips, "chips per host from spec.tpu"),
        ((*container, "limits", c.TPU_RESOURCE), chips, "chips per host from spec.tpu"),
    ]
    owned += [
        (("metadata", "labels", key), value, "identifies the slice's pods")
        for key, value in worker_labels(spec).items()
    ]
    owned += [
        (("metadata", "annotations", key), value, "read by the TPU identity webhook")
        for key, value in worker_annotations(spec).items()
    ]
    if spec.gated:
        owned.append(
            (
                ("spec", "nodeSelector", c.NODE_LABEL_NODEPOOL),
                None,
                "set per slice to the reserved node pool; use reservation.policy None to pin pools "
                "yourself",
            )
        )
    return owned


def _worker_template(
    spec: SliceClusterSpec, schema: Mapping[str, Any] | None
) -> tuple[dict[str, Any], list[FieldError]]:
    chips = str(spec.shape.chips_per_host)
    resources = _container_resources(spec.worker.resources) or {"requests": {}, "limits": {}}
    resources["requests"][c.TPU_RESOURCE] = chips
    resources["limits"][c.TPU_RESOURCE] = chips
    pod_spec: dict[str, Any] = {
        "nodeSelector": {
            c.NODE_LABEL_ACCELERATOR: spec.shape.generation.gke_accelerator,
            c.NODE_LABEL_TOPOLOGY: spec.shape.topology,
        },
        "tolerations": [{"key": c.TPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": c.WORKER_CONTAINER, "image": spec.image, "resources": resources}],
    }
    if spec.gated:
        pod_spec["schedulingGates"] = [{"name": c.SCHEDULING_GATE}]
    base = {
        "metadata": {"labels": worker_labels(spec), "annotations": worker_annotations(spec)},
        "spec": pod_spec,
    }
    return merge_template(
        base, spec.worker.template, _worker_owned(spec), "spec.worker.template", schema
    )


def render_raycluster(
    spec: SliceClusterSpec, template_schema: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Build the RayCluster for a validated spec; raise SpecError on override problems.

    ``template_schema`` (``schema.template_schema`` of KubeRay's RayCluster CRD) makes
    every field of the pod-template overrides checked as the API server would."""
    head_template, head_conflicts = _head_template(spec, template_schema)
    worker_template, worker_conflicts = _worker_template(spec, template_schema)
    if head_conflicts or worker_conflicts:
        raise SpecError(head_conflicts + worker_conflicts)

    metadata: dict[str, Any] = {"name": spec.name}
    if spec.namespace:
        metadata["namespace"] = spec.namespace
    metadata["labels"] = {c.LABEL_CLUSTER: spec.name, c.LABEL_MANAGED_BY: c.MANAGED_BY}
    if owners := _owner_reference(spec):
        metadata["ownerReferences"] = owners
    ray_spec: dict[str, Any] = {
        "rayVersion": spec.ray_version,
        "headGroupSpec": {
            "rayStartParams": dict(spec.head.ray_start_params),
            "template": head_template,
        },
        "workerGroupSpecs": [
            {
                "groupName": c.WORKER_GROUP,
                "replicas": spec.slices,
                "minReplicas": spec.slices,
                "maxReplicas": spec.slices,
                "numOfHosts": spec.shape.hosts,
                "rayStartParams": dict(spec.worker.ray_start_params),
                "template": worker_template,
            }
        ],
    }
    # Only a requested suspension is sent: leaving the field out lets another
    # owner (Kueue admits RayClusters by flipping it) keep it.
    if spec.suspend:
        ray_spec["suspend"] = True
    return {
        "apiVersion": c.RAY_API_VERSION,
        "kind": c.RAY_KIND_CLUSTER,
        "metadata": metadata,
        "spec": ray_spec,
    }


def render_cluster(
    obj: Mapping[str, Any], template_schema: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Validate a TPUSliceCluster dict and render its RayCluster (SpecError on bad input)."""
    return render_raycluster(parse_cluster(obj), template_schema)
