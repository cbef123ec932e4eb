"""Parse, validate and default a TPUSliceCluster into a frozen, typed spec.

The CRD's schema and CEL rules reject most bad input at ``kubectl apply``; this
module applies the same rules (and the ones CEL cannot express) to plain dicts,
so ``tpuslice render`` on a laptop and the operator in the cluster judge a spec
the same way, and every later step works on typed, defaulted values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tpuslice import constants
from tpuslice.topology import SliceShape, TopologyError, slice_shape

__all__ = ["FieldError", "GroupSpec", "SliceClusterSpec", "SpecError", "parse_cluster"]

ReservationPolicy = Literal["NodePool", "None"]

_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_RAY_VERSION = re.compile(r"^([0-9]+)\.([0-9]+)\.([0-9]+)$")
_QUANTITY = re.compile(
    r"^[+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


@dataclass(frozen=True)
class FieldError:
    """One problem with one field: the path a user can find and what to do about it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """A TPUSliceCluster that cannot be turned into a RayCluster; lists every problem found."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class GroupSpec:
    """User settings for the head or the worker group (all optional)."""

    resources: Mapping[str, str] = field(default_factory=dict)
    ray_start_params: Mapping[str, str] = field(default_factory=dict)
    template: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SliceClusterSpec:
    """A validated TPUSliceCluster with every default applied."""

    name: str
    namespace: str  # "" for a local file without one (kubectl picks the namespace)
    uid: str
    shape: SliceShape
    slices: int
    ray_version: str
    image: str
    head: GroupSpec
    worker: GroupSpec
    reservation_policy: ReservationPolicy
    suspend: bool

    @property
    def gated(self) -> bool:
        """Whether worker pods wait for a reserved node pool before scheduling."""
        return self.reservation_policy == "NodePool"


def default_image(ray_version: str) -> str:
    """Ray's published TPU image for a version; the user can override ``spec.ray.image``."""
    return f"rayproject/ray:{ray_version}-py311-tpu"


def _ray_version_error(version: str) -> str | None:
    match = _RAY_VERSION.match(version)
    if not match:
        return f"{version!r} is not a Ray release version; write MAJOR.MINOR.PATCH, e.g. 2.54.0"
    found = tuple(int(g) for g in match.groups())
    if found < constants.MIN_RAY_VERSION:
        floor = ".".join(str(p) for p in constants.MIN_RAY_VERSION)
        return (
            f"Ray {version} is older than {floor}, the first release whose "
            f"ray.util.tpu.slice_placement_group names v4/v5p/TPU7x slices correctly; "
            f"set {floor} or newer"
        )
    return None


def _string_map(value: Any, path: str, errors: list[FieldError]) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        errors.append(FieldError(path, "must be a map of strings"))
        return {}
    return {str(k): str(v) for k, v in value.items()}


def _resources(value: Any, path: str, errors: list[FieldError], tpu_owned: bool) -> dict[str, str]:
    resources = _string_map(value, path, errors)
    for key, quantity in resources.items():
        if not _QUANTITY.match(quantity):
            errors.append(
                FieldError(f"{path}.{key}", f"{quantity!r} is not a quantity (e.g. 8, 500m, 32Gi)")
            )
    if tpu_owned and constants.TPU_RESOURCE in resources:
        errors.append(
            FieldError(
                f"{path}.{constants.TPU_RESOURCE}",
                "is set by the operator from spec.tpu (chips per host); remove it",
            )
        )
    return resources


def _group(raw: Any, path: str, errors: list[FieldError], *, tpu_owned: bool) -> GroupSpec:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        errors.append(FieldError(path, "must be an object"))
        return GroupSpec()
    template = raw.get("template")
    if template is None:
        template = {}
    elif not isinstance(template, Mapping):
        errors.append(FieldError(f"{path}.template", "must be a pod template object"))
        template = {}
    return GroupSpec(
        resources=_resources(raw.get("resources"), f"{path}.resources", errors, tpu_owned),
        ray_start_params=_string_map(raw.get("rayStartParams"), f"{path}.rayStartParams", errors),
        template=template,
    )


def parse_cluster(obj: Mapping[str, Any]) -> SliceClusterSpec:
    """Validate a TPUSliceCluster dict and return its defaulted spec, or raise SpecError."""
    errors: list[FieldError] = []
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name = str(metadata.get("name") or "")
    namespace = str(metadata.get("namespace") or "")

    if not name:
        errors.append(FieldError("metadata.name", "is required"))
    elif len(name) > constants.MAX_NAME_LENGTH:
        errors.append(
            FieldError(
                "metadata.name",
                f"{name!r} has {len(name)} characters; at most {constants.MAX_NAME_LENGTH} keep "
                f"the RayCluster, its services and pod hostnames within DNS limits",
            )
        )
    elif not _DNS1035_LABEL.match(name):
        errors.append(
            FieldError(
                "metadata.name",
                f"{name!r} must be a DNS-1035 label (lowercase letters, digits and '-', starting "
                f"with a letter) because it names the RayCluster's services",
            )
        )

    tpu = spec.get("tpu") or {}
    shape: SliceShape | None = None
    if not tpu.get("type"):
        errors.append(FieldError("spec.tpu.type", "is required, e.g. v6e"))
    if not tpu.get("topology"):
        errors.append(FieldError("spec.tpu.topology", "is required, e.g. 4x4"))
    if tpu.get("type") and tpu.get("topology"):
        chips_per_host = tpu.get("chipsPerHost")
        if chips_per_host is not None and (
            not isinstance(chips_per_host, int) or isinstance(chips_per_host, bool)
        ):
            errors.append(
                FieldError("spec.tpu.chipsPerHost", f"must be an integer, got {chips_per_host!r}")
            )
        else:
            try:
                shape = slice_shape(str(tpu["type"]), str(tpu["topology"]), chips_per_host)
            except TopologyError as exc:
                errors.append(FieldError(f"spec.tpu.{exc.field}", exc.message))

    slices = tpu.get("slices", 1)
    if not isinstance(slices, int) or isinstance(slices, bool) or slices < 1:
        errors.append(FieldError("spec.tpu.slices", f"must be an integer >= 1, got {slices!r}"))
        slices = 1

    ray = spec.get("ray") or {}
    ray_version = str(ray.get("version") or "")
    if not ray_version:
        errors.append(FieldError("spec.ray.version", "is required, e.g. 2.54.0"))
    elif problem := _ray_version_error(ray_version):
        errors.append(FieldError("spec.ray.version", problem))
    image = str(ray.get("image") or default_image(ray_version))

    head = _group(spec.get("head"), "spec.head", errors, tpu_owned=False)
    worker = _group(spec.get("worker"), "spec.worker", errors, tpu_owned=True)

    policy = (spec.get("reservation") or {}).get("policy", "NodePool")
    if policy not in ("NodePool", "None"):
        errors.append(FieldError("spec.reservation.policy", f"{policy!r} is not NodePool or None"))

    suspend = spec.get("suspend", False)
    if not isinstance(suspend, bool):
        errors.append(FieldError("spec.suspend", f"must be true or false, got {suspend!r}"))

    if errors or shape is None:
        raise SpecError(errors)
    return SliceClusterSpec(
        name=name,
        namespace=namespace,
        uid=str(metadata.get("uid") or ""),
        shape=shape,
        slices=slices,
        ray_version=ray_version,
        image=image,
        head=head,
        worker=worker,
        reservation_policy=policy,
        suspend=bool(suspend),
    )
