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


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _object(
    value: Any, path: str, errors: list[FieldError], known: frozenset[str] | None = None
) -> Mapping[str, Any]:
    """``value`` as a map ({} when absent or wrong); with ``known``, unknown keys are
    errors too (the CRD refuses them; a typo must not vanish on the way)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        errors.append(FieldError(path, f"must be an object, got {_describe(value)}"))
        return {}
    if known is not None:
        for key in value:
            if key not in known:
                errors.append(
                    FieldError(
                        f"{path}.{key}", f"is not a field; use one of {', '.join(sorted(known))}"
                    )
                )
    return value


def _string(value: Any, path: str, errors: list[FieldError], max_length: int = 0) -> str:
    """A string field ('' when absent)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        errors.append(FieldError(path, f"must be a string, got {_describe(value)}"))
        return ""
    if max_length and len(value) > max_length:
        errors.append(FieldError(path, f"has {len(value)} characters; at most {max_length}"))
    return value


def _string_map(value: Any, path: str, errors: list[FieldError]) -> dict[str, str]:
    """A map of strings; integers are accepted and written as strings."""
    out: dict[str, str] = {}
    for key, item in _object(value, path, errors).items():
        if isinstance(item, str):
            out[str(key)] = item
        elif isinstance(item, int) and not isinstance(item, bool):
            out[str(key)] = str(item)
        else:
            errors.append(FieldError(f"{path}.{key}", f"must be a string, got {_describe(item)}"))
    return out


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
    raw = _object(raw, path, errors, _GROUP_FIELDS)
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


_SPEC_FIELDS = frozenset({"tpu", "ray", "head", "worker", "reservation", "suspend"})
_TPU_FIELDS = frozenset({"type", "topology", "slices", "chipsPerHost"})
_RAY_FIELDS = frozenset({"version", "image"})
_GROUP_FIELDS = frozenset({"resources", "rayStartParams", "template"})
_RESERVATION_FIELDS = frozenset({"policy"})


def parse_cluster(obj: Mapping[str, Any]) -> SliceClusterSpec:
    """Validate a TPUSliceCluster dict and return its defaulted spec, or raise SpecError."""
    errors: list[FieldError] = []
    if not isinstance(obj, Mapping):
        problem = f"a TPUSliceCluster is an object, not {_describe(obj)}"
        raise SpecError([FieldError("metadata", problem)])
    metadata = _object(obj.get("metadata"), "metadata", errors)
    spec = _object(obj.get("spec"), "spec", errors, _SPEC_FIELDS)
    name = _string(metadata.get("name"), "metadata.name", errors)
    namespace = _string(metadata.get("namespace"), "metadata.namespace", errors)
    uid = _string(metadata.get("uid"), "metadata.uid", errors)

    if metadata.get("name") in (None, ""):
        errors.append(FieldError("metadata.name", "is required"))
    elif not name:
        pass  # not a string: reported
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

    tpu = _object(spec.get("tpu"), "spec.tpu", errors, _TPU_FIELDS)
    shape: SliceShape | None = None
    tpu_type = _string(tpu.get("type"), "spec.tpu.type", errors)
    topology = _string(tpu.get("topology"), "spec.tpu.topology", errors)
    if tpu.get("type") in (None, ""):
        errors.append(FieldError("spec.tpu.type", "is required, e.g. v6e"))
    if tpu.get("topology") in (None, ""):
        errors.append(FieldError("spec.tpu.topology", "is required, e.g. 4x4"))
    if tpu_type and topology:
        chips_per_host = tpu.get("chipsPerHost")
        if chips_per_host is not None and (
            not isinstance(chips_per_host, int) or isinstance(chips_per_host, bool)
        ):
            errors.append(
                FieldError(
                    "spec.tpu.chipsPerHost", f"must be an integer, got {_describe(chips_per_host)}"
                )
            )
        else:
            try:
                shape = slice_shape(tpu_type, topology, chips_per_host)
            except TopologyError as exc:
                errors.append(FieldError(f"spec.tpu.{exc.field}", exc.message))

    slices = tpu.get("slices", 1)
    if (
        not isinstance(slices, int)
        or isinstance(slices, bool)
        or not 1 <= slices <= constants.MAX_SLICES
    ):
        errors.append(
            FieldError(
                "spec.tpu.slices",
                f"must be an integer from 1 to {constants.MAX_SLICES}, got {_describe(slices)}",
            )
        )
        slices = 1

    ray = _object(spec.get("ray"), "spec.ray", errors, _RAY_FIELDS)
    ray_version = _string(ray.get("version"), "spec.ray.version", errors)
    if ray.get("version") in (None, ""):
        errors.append(FieldError("spec.ray.version", "is required, e.g. 2.54.0"))
    elif ray_version and (problem := _ray_version_error(ray_version)):
        errors.append(FieldError("spec.ray.version", problem))
    image = _string(ray.get("image"), "spec.ray.image", errors, max_length=512)
    image = image or default_image(ray_version)

    head = _group(spec.get("head"), "spec.head", errors, tpu_owned=False)
    worker = _group(spec.get("worker"), "spec.worker", errors, tpu_owned=True)

    reservation = _object(spec.get("reservation"), "spec.reservation", errors, _RESERVATION_FIELDS)
    policy = reservation.get("policy", "NodePool")
    if policy not in ("NodePool", "None") or not isinstance(policy, str):
        errors.append(
            FieldError("spec.reservation.policy", f"{_describe(policy)} is not NodePool or None")
        )

    suspend = spec.get("suspend", False)
    if not isinstance(suspend, bool):
        errors.append(
            FieldError("spec.suspend", f"must be true or false, got {_describe(suspend)}")
        )

    if errors or shape is None:
        raise SpecError(errors)
    return SliceClusterSpec(
        name=name,
        namespace=namespace,
        uid=uid,
        shape=shape,
        slices=slices,
        ray_version=ray_version,
        image=image,
        head=head,
        worker=worker,
        reservation_policy=policy,
        suspend=bool(suspend),
    )
