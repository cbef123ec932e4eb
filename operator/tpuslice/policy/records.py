"""A TPUSlicePolicy object parsed into frozen records, every problem naming its field.

The CRD (crds/src/tpuslice.dev_tpuslicepolicies.yaml) refuses most bad policies at
``kubectl apply``; this parser applies the same rules to plain dicts, so a policy
that reaches the operator some other way (an older CRD, a test) is judged the same,
and every bound holds whatever the API server let through.

An absent allow-list allows everything; a present list allows only its items (the
schema makes every list non-empty, so "nothing allowed" is never an accident).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tpuslice.model.records import ProvisioningMode
from tpuslice.spec.parts import MAX_PRIORITY, FieldError, as_object
from tpuslice.spec.values import described

__all__ = [
    "KIND_POLICY",
    "LabelRequirement",
    "LabelSelector",
    "Limits",
    "PodSecurityLevel",
    "Policy",
    "PolicyError",
    "PriorityRule",
    "ProvisioningRule",
    "parse_policy",
    "parse_selector",
    "read_policy",
]

KIND_POLICY = "TPUSlicePolicy"

#: Bounds, the CRD's: every list and map a policy holds is small.
MAX_NAME = 253
MAX_LABEL_KEY = 317  # prefix (253) + "/" + name (63)
MAX_LABEL_VALUE = 63
MAX_MATCH_LABELS = 64
MAX_EXPRESSIONS = 32
MAX_VALUES = 64
MAX_POOL_LABELS = 32
MAX_LIST = 64
MAX_SLICES_PER_OBJECT = 1024
MAX_NAMESPACE_SLICES = 100_000
MAX_NAMESPACE_CHIPS = 10_000_000
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")


class PodSecurityLevel(StrEnum):
    """A Pod Security Standards level the pod templates must meet (the Privileged
    level is the absence of ``spec.podTemplate.podSecurity``)."""

    BASELINE = "baseline"
    RESTRICTED = "restricted"

    @property
    def rank(self) -> int:
        """Strictness, higher is stricter (restricted includes baseline)."""
        return 2 if self is PodSecurityLevel.RESTRICTED else 1


class PolicyError(ValueError):
    """A TPUSlicePolicy the operator cannot apply; lists every problem found."""

    def __init__(self, name: str, errors: list[FieldError]) -> None:
        super().__init__(f"TPUSlicePolicy {name}: " + "; ".join(str(e) for e in errors))
        self.name = name
        self.errors = errors


@dataclass(frozen=True)
class LabelRequirement:
    """One matchExpressions entry of a label selector."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class LabelSelector:
    """metav1.LabelSelector: every matchLabels pair and every expression must hold. The
    empty selector selects every namespace (as in Kubernetes)."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[LabelRequirement, ...] = ()


@dataclass(frozen=True)
class Limits:
    """spec.limits; None is no limit."""

    slices_per_object: int | None = None
    slices_per_namespace: int | None = None
    chips_per_namespace: int | None = None


@dataclass(frozen=True)
class PriorityRule:
    """spec.priority: the range of spec.reservation.priority (a value outside is clamped
    into it, see rules.effective_priority) and the PriorityClass names the pod templates
    may name (a name outside is refused)."""

    minimum: int | None = None
    maximum: int | None = None
    class_names: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ProvisioningRule:
    """spec.provisioning: what spec.reservation.provisioning may ask for."""

    modes: tuple[ProvisioningMode, ...] | None = None
    class_names: tuple[str, ...] | None = None
    reservation_names: tuple[str, ...] | None = None
    compute_classes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Policy:
    """One TPUSlicePolicy, validated."""

    name: str
    namespace_selector: LabelSelector
    pool_node_selector: Mapping[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    priority: PriorityRule = field(default_factory=PriorityRule)
    provisioning: ProvisioningRule = field(default_factory=ProvisioningRule)
    pod_security: PodSecurityLevel | None = None
    service_accounts: tuple[str, ...] | None = None
    service_types: tuple[str, ...] | None = None
    #: Why the policy cannot be applied (``read_policy``): non-empty, it refuses every
    #: object of the namespaces its selector selects until an admin fixes it.
    invalid: str = ""


#: An invalid policy's error, as kept and shown, is at most this long.
MAX_INVALID_TEXT = 512

_SPEC_FIELDS = frozenset(
    {"namespaceSelector", "pools", "limits", "priority", "provisioning", "podTemplate", "services"}
)
_SELECTOR_FIELDS = frozenset({"matchLabels", "matchExpressions"})
_EXPRESSION_FIELDS = frozenset({"key", "operator", "values"})
_POOLS_FIELDS = frozenset({"nodeSelector"})
_LIMITS_FIELDS = frozenset({"slicesPerObject", "slicesPerNamespace", "chipsPerNamespace"})
_PRIORITY_FIELDS = frozenset({"min", "max", "priorityClassNames"})
_PROVISIONING_FIELDS = frozenset(
    {"modes", "provisioningClassNames", "reservationNames", "computeClasses"}
)
_POD_TEMPLATE_FIELDS = frozenset({"podSecurity", "serviceAccountNames"})
_SERVICES_FIELDS = frozenset({"types"})


def _string(value: Any, path: str, max_length: int, errors: list[FieldError]) -> str:
    if not isinstance(value, str) or not value:
        errors.append(FieldError(path, f"must be a non-empty string, got {described(value)}"))
        return ""
    if len(value) > max_length:
        errors.append(FieldError(path, f"has {len(value)} characters; at most {max_length}"))
    return value


def _string_list(
    value: Any,
    path: str,
    errors: list[FieldError],
    *,
    max_items: int = MAX_LIST,
    max_length: int = MAX_NAME,
    choices: tuple[str, ...] = (),
) -> tuple[str, ...] | None:
    """An allow-list: None when absent; present lists hold 1..max_items strings."""
    if value is None:
        return None
    if not isinstance(value, list):
        errors.append(FieldError(path, f"must be a list of strings, got {described(value)}"))
        return None
    if not value:
        errors.append(
            FieldError(path, "is empty, which would allow nothing; remove it to allow anything")
        )
    if len(value) > max_items:
        errors.append(FieldError(path, f"has {len(value)} items; at most {max_items}"))
        return None
    out: list[str] = []
    for index, item in enumerate(value):
        where = f"{path}[{index}]"
        text = _string(item, where, max_length, errors)
        if choices and text and text not in choices:
            errors.append(
                FieldError(where, f"{described(text)} is not one of {', '.join(choices)}")
            )
        out.append(text)
    return tuple(out)


def _count(value: Any, path: str, high: int, errors: list[FieldError]) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
        errors.append(
            FieldError(path, f"must be an integer from 0 to {high}, got {described(value)}")
        )
        return None
    return value


def _label_map(value: Any, path: str, max_items: int, errors: list[FieldError]) -> dict[str, str]:
    raw = as_object(value, path, errors, frozenset()) if value is None else value
    if not isinstance(raw, Mapping):
        errors.append(FieldError(path, f"must be an object, got {described(raw)}"))
        return {}
    if len(raw) > max_items:
        errors.append(FieldError(path, f"has {len(raw)} labels; at most {max_items}"))
        return {}
    out: dict[str, str] = {}
    for key, item in raw.items():
        where = f"{path}.{key}"
        if not isinstance(key, str) or not key or len(key) > MAX_LABEL_KEY:
            errors.append(
                FieldError(where, f"is not a label key (at most {MAX_LABEL_KEY} characters)")
            )
            continue
        if not isinstance(item, str) or len(item) > MAX_LABEL_VALUE:
            errors.append(
                FieldError(where, f"must be a label value (a string of at most {MAX_LABEL_VALUE})")
            )
            continue
        out[key] = item
    return out


def parse_selector(value: Any, path: str, errors: list[FieldError]) -> LabelSelector:
    """A metav1.LabelSelector; In and NotIn need values, Exists and DoesNotExist take none."""
    raw = as_object(value, path, errors, _SELECTOR_FIELDS)
    labels = _label_map(raw.get("matchLabels"), f"{path}.matchLabels", MAX_MATCH_LABELS, errors)
    expressions: list[LabelRequirement] = []
    raw_expressions = raw.get("matchExpressions")
    if raw_expressions is not None and not isinstance(raw_expressions, list):
        errors.append(FieldError(f"{path}.matchExpressions", "must be a list"))
        raw_expressions = []
    if raw_expressions and len(raw_expressions) > MAX_EXPRESSIONS:
        errors.append(
            FieldError(
                f"{path}.matchExpressions",
                f"has {len(raw_expressions)} items; at most {MAX_EXPRESSIONS}",
            )
        )
        raw_expressions = []
    for index, item in enumerate(raw_expressions or []):
        where = f"{path}.matchExpressions[{index}]"
        expr = as_object(item, where, errors, _EXPRESSION_FIELDS)
        key = _string(expr.get("key"), f"{where}.key", MAX_LABEL_KEY, errors)
        operator = expr.get("operator")
        if operator not in SELECTOR_OPERATORS:
            errors.append(
                FieldError(
                    f"{where}.operator",
                    f"{described(operator)} is not one of {', '.join(SELECTOR_OPERATORS)}",
                )
            )
            continue
        raw_values = expr.get("values")
        if operator in ("In", "NotIn"):
            values = _string_list(
                raw_values,
                f"{where}.values",
                errors,
                max_items=MAX_VALUES,
                max_length=MAX_LABEL_VALUE,
            )
            if values is None:
                errors.append(
                    FieldError(f"{where}.values", f"is required with operator {operator}")
                )
                continue
        else:
            if raw_values:
                errors.append(
                    FieldError(f"{where}.values", f"must be empty with operator {operator}")
                )
            values = ()
        expressions.append(LabelRequirement(key=key, operator=str(operator), values=values))
    return LabelSelector(match_labels=labels, match_expressions=tuple(expressions))


def _priority(value: Any, errors: list[FieldError]) -> PriorityRule:
    path = "spec.priority"
    raw = as_object(value, path, errors, _PRIORITY_FIELDS)
    bounds: dict[str, int | None] = {}
    for key in ("min", "max"):
        item = raw.get(key)
        if item is None:
            bounds[key] = None
        elif (
            not isinstance(item, int)
            or isinstance(item, bool)
            or not -MAX_PRIORITY <= item <= MAX_PRIORITY
        ):
            errors.append(
                FieldError(
                    f"{path}.{key}",
                    f"must be an integer from {-MAX_PRIORITY} to {MAX_PRIORITY}, "
                    f"got {described(item)}",
                )
            )
            bounds[key] = None
        else:
            bounds[key] = item
    low, high = bounds["min"], bounds["max"]
    if low is not None and high is not None and low > high:
        errors.append(FieldError(f"{path}.min", f"({low}) must not exceed {path}.max ({high})"))
    names = _string_list(raw.get("priorityClassNames"), f"{path}.priorityClassNames", errors)
    return PriorityRule(minimum=low, maximum=high, class_names=names)


def _provisioning(value: Any, errors: list[FieldError]) -> ProvisioningRule:
    path = "spec.provisioning"
    raw = as_object(value, path, errors, _PROVISIONING_FIELDS)
    modes = _string_list(
        raw.get("modes"), f"{path}.modes", errors, max_items=3, choices=tuple(ProvisioningMode)
    )
    return ProvisioningRule(
        modes=None
        if modes is None
        else tuple(ProvisioningMode(m) for m in modes if m in tuple(ProvisioningMode)),
        class_names=_string_list(
            raw.get("provisioningClassNames"), f"{path}.provisioningClassNames", errors
        ),
        reservation_names=_string_list(
            raw.get("reservationNames"),
            f"{path}.reservationNames",
            errors,
            max_length=MAX_LABEL_VALUE,
        ),
        compute_classes=_string_list(
            raw.get("computeClasses"),
            f"{path}.computeClasses",
            errors,
            max_length=MAX_LABEL_VALUE,
        ),
    )


def parse_policy(obj: Mapping[str, Any]) -> Policy:
    """A TPUSlicePolicy object -> ``Policy``; raises ``PolicyError`` listing every field
    that is wrong (``spec.namespaceSelector`` is required: a policy governs someone)."""
    errors: list[FieldError] = []
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        name = "<unnamed>"
        errors.append(FieldError("metadata.name", "is required"))
    if obj.get("kind", KIND_POLICY) != KIND_POLICY:
        errors.append(
            FieldError("kind", f"must be {KIND_POLICY}, got {described(obj.get('kind'))}")
        )
    spec = as_object(obj.get("spec"), "spec", errors, _SPEC_FIELDS)
    if "namespaceSelector" not in spec:
        errors.append(
            FieldError(
                "spec.namespaceSelector",
                "is required: the namespaces this policy governs ({} selects every namespace)",
            )
        )
    selector = parse_selector(spec.get("namespaceSelector"), "spec.namespaceSelector", errors)
    pools = as_object(spec.get("pools"), "spec.pools", errors, _POOLS_FIELDS)
    pool_labels = (
        _label_map(pools["nodeSelector"], "spec.pools.nodeSelector", MAX_POOL_LABELS, errors)
        if "nodeSelector" in pools
        else {}
    )
    raw_limits = as_object(spec.get("limits"), "spec.limits", errors, _LIMITS_FIELDS)
    limits = Limits(
        slices_per_object=_count(
            raw_limits.get("slicesPerObject"),
            "spec.limits.slicesPerObject",
            MAX_SLICES_PER_OBJECT,
            errors,
        ),
        slices_per_namespace=_count(
            raw_limits.get("slicesPerNamespace"),
            "spec.limits.slicesPerNamespace",
            MAX_NAMESPACE_SLICES,
            errors,
        ),
        chips_per_namespace=_count(
            raw_limits.get("chipsPerNamespace"),
            "spec.limits.chipsPerNamespace",
            MAX_NAMESPACE_CHIPS,
            errors,
        ),
    )
    template = as_object(spec.get("podTemplate"), "spec.podTemplate", errors, _POD_TEMPLATE_FIELDS)
    level: PodSecurityLevel | None = None
    raw_level = template.get("podSecurity")
    if raw_level is not None:
        if raw_level in tuple(PodSecurityLevel):
            level = PodSecurityLevel(raw_level)
        else:
            errors.append(
                FieldError(
                    "spec.podTemplate.podSecurity",
                    f"{described(raw_level)} is not one of baseline, restricted (remove the "
                    f"field for no Pod Security check)",
                )
            )
    services = as_object(spec.get("services"), "spec.services", errors, _SERVICES_FIELDS)
    policy = Policy(
        name=name,
        namespace_selector=selector,
        pool_node_selector=pool_labels,
        limits=limits,
        priority=_priority(spec.get("priority"), errors),
        provisioning=_provisioning(spec.get("provisioning"), errors),
        pod_security=level,
        service_accounts=_string_list(
            template.get("serviceAccountNames"), "spec.podTemplate.serviceAccountNames", errors
        ),
        service_types=_string_list(
            services.get("types"),
            "spec.services.types",
            errors,
            max_items=4,
            choices=SERVICE_TYPES,
        ),
    )
    if errors:
        raise PolicyError(name, errors)
    return policy


def read_policy(obj: Mapping[str, Any]) -> Policy:
    """A TPUSlicePolicy as the operator enforces it: ``parse_policy``'s, or, when some
    field is wrong but ``spec.namespaceSelector`` is present and parses, a policy that
    fails closed (``Policy.invalid``: every object of the namespaces it selects is
    refused, naming the error), so a typo in a limit never opens those namespaces.
    Raises ``PolicyError`` when not even the selector can be read: there is nobody to
    govern, and the caller logs and ignores it."""
    try:
        return parse_policy(obj)
    except PolicyError as exc:
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        if not isinstance(spec, Mapping) or "namespaceSelector" not in spec:
            raise
        errors: list[FieldError] = []
        selector = parse_selector(spec["namespaceSelector"], "spec.namespaceSelector", errors)
        if errors:
            raise
        text = "; ".join(str(e) for e in exc.errors)
        if len(text) > MAX_INVALID_TEXT:
            text = text[: MAX_INVALID_TEXT - 3] + "..."
        return Policy(name=exc.name, namespace_selector=selector, invalid=text)
