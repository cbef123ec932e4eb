"""A TPUSliceService's spec: the shared cluster parts and ``spec.serve``, which mirrors
KubeRay's RayService spec: the fields the operator checks and defaults are typed here,
and the others it lets through (``SERVE_PASSTHROUGH``) are kept as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpuslice.model import constants
from tpuslice.spec import bounds
from tpuslice.spec.parts import (
    _SERVE_CONFIG_EXAMPLE,
    _SERVICE_SPEC_FIELDS,
    FieldError,
    OwnedClusterSpec,
    SpecError,
    _cluster_parts,
    _integer,
    _metadata,
    _passthrough,
    _string,
    _yaml_map,
    as_object,
    object_labels,
)
from tpuslice.spec.values import described

__all__ = [
    "SERVE_PASSTHROUGH",
    "ServeSettings",
    "SliceServiceSpec",
    "parse_service",
]


# -------------------------------------------------------------- TPUSliceService

#: RayService spec fields (KubeRay 1.5) a TPUSliceService passes through as written.
SERVE_PASSTHROUGH: Mapping[str, str] = {
    "upgradeStrategy": "object",
    "rayClusterDeletionDelaySeconds": "integer",
    "serveService": "object",
    "excludeHeadPodFromServeSvc": "boolean",
}
_SERVE_OWNED = frozenset({"serveConfigV2"})
_SERVE_REFUSED: Mapping[str, str] = {
    "rayClusterConfig": "is rendered by the operator from spec.tpu, ray, head and worker; move "
    "its settings there (pod template overrides go in spec.head.template and "
    "spec.worker.template)",
    "serviceUnhealthySecondThreshold": "is deprecated and ignored by KubeRay; remove it",
    "deploymentUnhealthySecondThreshold": "is deprecated and ignored by KubeRay; remove it",
}
UPGRADE_TYPES = ("NewCluster", "None", "NewClusterWithIncrementalUpgrade")


@dataclass(frozen=True)
class ServeSettings:
    """spec.serve: what KubeRay's RayService gets besides its cluster."""

    serve_config_v2: str
    #: SERVE_PASSTHROUGH fields the user set, as written.
    passthrough: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SliceServiceSpec(OwnedClusterSpec):
    """A validated TPUSliceService: its cluster parts and its Serve settings."""

    serve: ServeSettings


def _upgrade_strategy(value: Any, errors: list[FieldError], *, elastic: bool) -> None:
    """KubeRay's incremental upgrade needs the Ray autoscaler (KubeRay's RayService
    validation), which runs in an autoscaled cluster (``elastic``: spec.elastic, an
    elastic TPU group or a CPU group's range); its options are bounded here (a free-form
    object the CRD cannot bound)."""
    path = "spec.serve.upgradeStrategy"
    strategy = as_object(value, path, errors)
    kind = strategy.get("type")
    incremental = kind == "NewClusterWithIncrementalUpgrade"
    for key in strategy:
        if key == "clusterUpgradeOptions":
            options = f"{path}.clusterUpgradeOptions"
            if not incremental:
                errors.append(
                    FieldError(
                        options,
                        "only applies to NewClusterWithIncrementalUpgrade; remove it or set "
                        "that type",
                    )
                )
            elif not isinstance(strategy[key], Mapping):
                errors.append(
                    FieldError(options, f"must be an object, got {described(strategy[key])}")
                )
            elif (size := bounds.json_size(strategy[key])) > bounds.TEMPLATE_BYTES[options]:
                errors.append(
                    FieldError(
                        options,
                        f"is {size} bytes as JSON; at most {bounds.TEMPLATE_BYTES[options]}",
                    )
                )
        elif key != "type":
            errors.append(FieldError(f"{path}.{key}", "is not a field; use type"))
    if incremental and not elastic:
        errors.append(
            FieldError(
                f"{path}.type",
                "NewClusterWithIncrementalUpgrade needs the Ray autoscaler (KubeRay requires "
                "it), which runs with spec.elastic or, in spec.workerGroups, an elastic TPU "
                "group or a CPU group's range; set one or use NewCluster (the default) or None",
            )
        )
    elif kind is not None and kind not in UPGRADE_TYPES:
        errors.append(
            FieldError(
                f"{path}.type", f"{described(kind)} is not one of {', '.join(UPGRADE_TYPES)}"
            )
        )


def _serve(raw: Any, errors: list[FieldError], *, elastic: bool) -> ServeSettings | None:
    if raw is None:
        errors.append(FieldError("spec.serve", "is required (at least spec.serve.serveConfigV2)"))
        return None
    serve = as_object(raw, "spec.serve", errors)
    if not isinstance(raw, Mapping):
        return None
    config = _string(
        serve.get("serveConfigV2"), "spec.serve.serveConfigV2", errors, bounds.MAX_YAML_STRING
    )
    if serve.get("serveConfigV2") in (None, ""):
        errors.append(
            FieldError(
                "spec.serve.serveConfigV2",
                "is required: the Serve applications as a YAML string, e.g. "
                + _SERVE_CONFIG_EXAMPLE,
            )
        )
    elif config:
        _yaml_map(config, "spec.serve.serveConfigV2", errors, _SERVE_CONFIG_EXAMPLE)
    passthrough = _passthrough(
        serve, "spec.serve", _SERVE_OWNED, SERVE_PASSTHROUGH, _SERVE_REFUSED, errors
    )
    if "upgradeStrategy" in passthrough:
        _upgrade_strategy(passthrough["upgradeStrategy"], errors, elastic=elastic)
    if "rayClusterDeletionDelaySeconds" in passthrough:
        _integer(
            passthrough["rayClusterDeletionDelaySeconds"],
            "spec.serve.rayClusterDeletionDelaySeconds",
            errors,
            0,
        )
    return ServeSettings(serve_config_v2=config, passthrough=passthrough)


def parse_service(obj: Mapping[str, Any]) -> SliceServiceSpec:
    """Validate a TPUSliceService dict and return its defaulted spec, or raise SpecError."""
    errors: list[FieldError] = []
    name, namespace, uid, raw = _metadata(
        obj,
        constants.KIND_SERVICE,
        constants.MAX_JOB_NAME_LENGTH,
        "the RayService's RayClusters (<name>-<5 characters>), their services and hostnames",
        "the RayService",
        errors,
    )
    spec = as_object(raw, "spec", errors, _SERVICE_SPEC_FIELDS)
    cluster = _cluster_parts(
        spec,
        errors,
        name=name,
        namespace=namespace,
        uid=uid,
        owner_kind=constants.KIND_SERVICE,
        labels=object_labels(obj),
    )
    autoscaled = cluster.autoscaled if cluster is not None else spec.get("elastic") is not None
    serve = _serve(spec.get("serve"), errors, elastic=autoscaled)
    if cluster is not None and cluster.kueue is not None:
        where = (
            "spec.kueue" if "kueue" in spec else f"metadata.labels[{constants.KUEUE_QUEUE_LABEL}]"
        )
        errors.append(
            FieldError(
                where,
                "is not supported on a TPUSliceService yet: Kueue would admit each RayCluster "
                "of an upgrade on its own; remove it",
            )
        )
    if errors or cluster is None or serve is None:
        raise SpecError(errors)
    return SliceServiceSpec(cluster=cluster, serve=serve)
