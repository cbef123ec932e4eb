"""A TPUSliceCluster's spec: the shared cluster parts and ``spec.suspend``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuslice.model import constants
from tpuslice.spec.parts import (
    _SPEC_FIELDS,
    FieldError,
    SliceClusterSpec,
    SpecError,
    _cluster_parts,
    _metadata,
    as_object,
    object_labels,
)
from tpuslice.spec.values import described

__all__ = [
    "parse_cluster",
]


def parse_cluster(obj: Mapping[str, Any]) -> SliceClusterSpec:
    """Validate a TPUSliceCluster dict and return its defaulted spec, or raise SpecError."""
    errors: list[FieldError] = []
    name, namespace, uid, raw = _metadata(
        obj,
        constants.KIND_CLUSTER,
        constants.MAX_NAME_LENGTH,
        "the RayCluster, its services and pod hostnames",
        "the RayCluster",
        errors,
    )
    spec = as_object(raw, "spec", errors, _SPEC_FIELDS)
    suspend = spec.get("suspend", False)
    if not isinstance(suspend, bool):
        errors.append(
            FieldError("spec.suspend", f"must be true or false, got {described(suspend)}")
        )
    cluster = _cluster_parts(
        spec,
        errors,
        name=name,
        namespace=namespace,
        uid=uid,
        owner_kind=constants.KIND_CLUSTER,
        suspend=bool(suspend),
        labels=object_labels(obj),
    )
    if cluster is not None and cluster.kueue is not None and suspend is True:
        errors.append(
            FieldError(
                "spec.suspend",
                "cannot be true for an object Kueue admits (spec.kueue or the queue-name "
                "label): Kueue owns the RayCluster's suspend; stop its LocalQueue instead",
            )
        )
    if errors or cluster is None:
        raise SpecError(errors)
    return cluster
