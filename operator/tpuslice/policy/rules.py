"""A policy's decisions as data: what it refuses in an object, the priority an object
queues at, the pools and the usage a namespace may have.

No policy in the cluster: nothing is refused (the operator works as without this
package). Any policy present: a namespace no policy selects is refused outright
(``PolicyDenied``, naming the policies an admin could extend). Several policies
selecting one namespace all apply: an object must satisfy each, so on every
dimension the strictest wins (the smallest limit, the narrowest allow-list, the
intersection of the priority ranges, the strictest Pod Security level).

Every refusal names the policy, the object's field and the limit it broke.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpuslice.model import constants
from tpuslice.model.records import ProvisioningMode, Usage
from tpuslice.policy.podsecurity import pod_security_violations
from tpuslice.policy.records import Limits, Policy
from tpuslice.policy.selection import governing
from tpuslice.spec.parts import OwnedClusterSpec, SliceClusterSpec

__all__ = [
    "POLICY_DENIED",
    "POLICY_VIOLATION",
    "ObjectFacts",
    "PriorityDecision",
    "Refusal",
    "Usage",
    "check_object",
    "effective_priority",
    "facts_of",
    "namespace_usage_allowed",
    "pool_allowed",
    "pools_allowed",
]

#: Reasons (conditions and Events): no policy selects the namespace; a governing
#: policy refuses a field of the object.
POLICY_DENIED = "PolicyDenied"
POLICY_VIOLATION = "PolicyViolation"
#: A PolicyDenied message names at most this many policies.
MAX_NAMED_POLICIES = 5
#: The ServiceAccount a pod runs as when its template names none.
DEFAULT_SERVICE_ACCOUNT = "default"


@dataclass(frozen=True)
class Refusal:
    """One thing a policy does not allow: which policy, which field, which limit."""

    reason: str
    policy: str
    path: str
    limit: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message} (TPUSlicePolicy {self.policy}: {self.limit})"


@dataclass(frozen=True)
class ObjectFacts:
    """What a policy judges of one TPUSlice object, as plain values (``facts_of`` reads
    them from a parsed spec; the shell may build them another way)."""

    slices: int
    chips_per_slice: int
    priority: int = 0
    provisioning_mode: ProvisioningMode | None = None
    provisioning_class: str = ""
    #: spec.reservation.provisioning.nodeSelector (reservation name, compute class, ...).
    capacity_selector: Mapping[str, str] = field(default_factory=dict)
    #: (path, pod template as written) of the head, worker and submitter templates.
    templates: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    #: spec.serve.serveService.spec.type; None without a serveService (KubeRay's default
    #: Service is ClusterIP).
    service_type: str | None = None


@dataclass(frozen=True)
class PriorityDecision:
    """The priority an object queues at: its own, or clamped into the governing
    policies' range (``clamped_by`` names the policy whose bound applied)."""

    value: int
    clamped_by: str = ""
    message: str = ""


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def facts_of(spec: SliceClusterSpec | OwnedClusterSpec) -> ObjectFacts:
    """The facts of a parsed TPUSliceCluster, TPUSliceJob or TPUSliceService spec."""
    cluster = spec.cluster if isinstance(spec, OwnedClusterSpec) else spec
    templates: list[tuple[str, Mapping[str, Any]]] = [
        ("spec.head.template", cluster.head.template),
        ("spec.worker.template", cluster.worker.template),
    ]
    service_type: str | None = None
    job = getattr(spec, "job", None)
    if job is not None and "submitterPodTemplate" in job.passthrough:
        templates.append(
            ("spec.job.submitterPodTemplate", _map(job.passthrough["submitterPodTemplate"]))
        )
    serve = getattr(spec, "serve", None)
    if serve is not None and "serveService" in serve.passthrough:
        kind = _map(_map(serve.passthrough["serveService"]).get("spec")).get("type")
        service_type = kind if isinstance(kind, str) else "ClusterIP"
    provisioning = cluster.provisioning
    return ObjectFacts(
        slices=cluster.slices,
        chips_per_slice=cluster.shape.chips,
        priority=cluster.priority,
        provisioning_mode=provisioning.mode if provisioning else None,
        provisioning_class=provisioning.class_name if provisioning else "",
        capacity_selector=dict(provisioning.node_selector) if provisioning else {},
        templates=tuple(templates),
        service_type=service_type,
    )


def _denied(policies: Sequence[Policy]) -> Refusal:
    names = sorted(p.name for p in policies)
    shown = ", ".join(names[:MAX_NAMED_POLICIES])
    if len(names) > MAX_NAMED_POLICIES:
        shown += f" and {len(names) - MAX_NAMED_POLICIES} more"
    return Refusal(
        reason=POLICY_DENIED,
        policy=shown,
        path="metadata.namespace",
        limit="spec.namespaceSelector selects no such namespace",
        message=(
            "no TPUSlicePolicy governs this namespace, and with policies in the cluster "
            f"that means denied; ask an admin to select it in one of: {shown}"
        ),
    )


def _invalid(policy: Policy) -> Refusal:
    return Refusal(
        reason=POLICY_VIOLATION,
        policy=policy.name,
        path="metadata.namespace",
        limit=f"the policy is invalid: {policy.invalid}",
        message=(
            "a TPUSlicePolicy governing this namespace cannot be applied, so nothing here "
            "is allowed until an admin fixes it"
        ),
    )


def _refusal(policy: Policy, path: str, limit: str, message: str) -> Refusal:
    return Refusal(POLICY_VIOLATION, policy.name, path, limit, message)


def _allowed(value: str, allowed: tuple[str, ...] | None) -> bool:
    return allowed is None or value in allowed


def _listed(allowed: tuple[str, ...]) -> str:
    return ", ".join(allowed)


def _slices(policy: Policy, facts: ObjectFacts) -> Iterable[Refusal]:
    limit = policy.limits.slices_per_object
    if limit is not None and facts.slices > limit:
        yield _refusal(
            policy,
            "spec.tpu.slices",
            f"spec.limits.slicesPerObject {limit}",
            f"asks for {facts.slices} slices; at most {limit} per object",
        )


def _priority_classes(policy: Policy, facts: ObjectFacts) -> Iterable[Refusal]:
    allowed = policy.priority.class_names
    if allowed is None:
        return
    for path, template in facts.templates:
        name = _map(template.get("spec")).get("priorityClassName")
        if isinstance(name, str) and name not in allowed:
            yield _refusal(
                policy,
                f"{path}.spec.priorityClassName",
                f"spec.priority.priorityClassNames [{_listed(allowed)}]",
                f"PriorityClass {name!r} is not allowed; use one of {_listed(allowed)}",
            )


def _provisioning(policy: Policy, facts: ObjectFacts) -> Iterable[Refusal]:
    rule = policy.provisioning
    base = "spec.reservation.provisioning"
    if facts.provisioning_mode is None:
        return
    if rule.modes is not None and facts.provisioning_mode not in rule.modes:
        modes = _listed(tuple(str(m) for m in rule.modes))
        yield _refusal(
            policy,
            f"{base}.mode",
            f"spec.provisioning.modes [{modes}]",
            f"mode {str(facts.provisioning_mode)!r} is not allowed; use one of {modes}",
        )
    if (
        rule.class_names is not None
        and facts.provisioning_class
        and facts.provisioning_class not in rule.class_names
    ):
        yield _refusal(
            policy,
            f"{base}.provisioningClassName",
            f"spec.provisioning.provisioningClassNames [{_listed(rule.class_names)}]",
            f"class {facts.provisioning_class!r} is not allowed; use one of "
            f"{_listed(rule.class_names)}",
        )
    for key, allowed, field_name in (
        (constants.NODE_LABEL_RESERVATION_NAME, rule.reservation_names, "reservationNames"),
        (constants.NODE_LABEL_COMPUTE_CLASS, rule.compute_classes, "computeClasses"),
    ):
        value = facts.capacity_selector.get(key)
        if value is not None and allowed is not None and value not in allowed:
            yield _refusal(
                policy,
                f"{base}.nodeSelector.{key}",
                f"spec.provisioning.{field_name} [{_listed(allowed)}]",
                f"{value!r} is not allowed; use one of {_listed(allowed)}",
            )


def _service(policy: Policy, facts: ObjectFacts) -> Iterable[Refusal]:
    allowed = policy.service_types
    if facts.service_type is not None and not _allowed(facts.service_type, allowed):
        assert allowed is not None
        yield _refusal(
            policy,
            "spec.serve.serveService.spec.type",
            f"spec.services.types [{_listed(allowed)}]",
            f"Service type {facts.service_type!r} is not allowed; use one of {_listed(allowed)}",
        )


def _service_accounts(policy: Policy, facts: ObjectFacts) -> Iterable[Refusal]:
    allowed = policy.service_accounts
    if allowed is None:
        return
    for path, template in facts.templates:
        spec = _map(template.get("spec"))
        name = spec.get("serviceAccountName") or spec.get("serviceAccount")
        account = name if isinstance(name, str) and name else DEFAULT_SERVICE_ACCOUNT
        if account not in allowed:
            yield _refusal(
                policy,
                f"{path}.spec.serviceAccountName",
                f"spec.podTemplate.serviceAccountNames [{_listed(allowed)}]",
                f"ServiceAccount {account!r} is not allowed"
                + (" (none named: the namespace's default)" if not name else "")
                + f"; use one of {_listed(allowed)}",
            )


def _pod_security(policies: Sequence[Policy], facts: ObjectFacts) -> Iterable[Refusal]:
    """Checked once, at the strictest level any governing policy sets (restricted
    includes baseline), naming the first policy by name that sets it."""
    leveled = [p for p in policies if p.pod_security is not None]
    if not leveled:
        return
    level = max((p.pod_security for p in leveled if p.pod_security), key=lambda lv: lv.rank)
    strictest = min((p for p in leveled if p.pod_security == level), key=lambda p: p.name)
    for path, template in facts.templates:
        for violation in pod_security_violations(template, path, level):
            yield _refusal(
                strictest,
                violation.path,
                f"spec.podTemplate.podSecurity {level} ({violation.control})",
                violation.message,
            )


def _priority_range(policies: Sequence[Policy]) -> tuple[int | None, str, int | None, str]:
    """The intersection of the governing policies' ranges: (low, its policy, high, its policy)."""
    low: int | None = None
    high: int | None = None
    low_by = high_by = ""
    for policy in policies:
        rule = policy.priority
        if rule.minimum is not None and (low is None or rule.minimum > low):
            low, low_by = rule.minimum, policy.name
        if rule.maximum is not None and (high is None or rule.maximum < high):
            high, high_by = rule.maximum, policy.name
    return low, low_by, high, high_by


def effective_priority(policies: Sequence[Policy], priority: int) -> PriorityDecision:
    """The priority an object of the governing ``policies`` queues at: its
    ``spec.reservation.priority`` clamped into their range. Clamping, not refusing,
    because priority only orders the queue: an object asking too high still runs, in
    the place its namespace is allowed (the status says so). A range that is empty
    (policies that disagree) is a refusal, in ``check_object``."""
    low, low_by, high, high_by = _priority_range(policies)
    if low is not None and high is not None and low > high:
        return PriorityDecision(priority)
    if high is not None and priority > high:
        return PriorityDecision(
            high,
            high_by,
            f"spec.reservation.priority {priority} clamped to {high} "
            f"(TPUSlicePolicy {high_by}: spec.priority.max {high})",
        )
    if low is not None and priority < low:
        return PriorityDecision(
            low,
            low_by,
            f"spec.reservation.priority {priority} raised to {low} "
            f"(TPUSlicePolicy {low_by}: spec.priority.min {low})",
        )
    return PriorityDecision(priority)


def _empty_priority_range(policies: Sequence[Policy]) -> Iterable[Refusal]:
    low, low_by, high, high_by = _priority_range(policies)
    if low is not None and high is not None and low > high:
        by = next(p for p in policies if p.name == low_by)
        yield _refusal(
            by,
            "spec.reservation.priority",
            f"spec.priority.min {low} above TPUSlicePolicy {high_by}'s spec.priority.max {high}",
            "the policies governing this namespace allow no priority at all; an admin must "
            "make their spec.priority ranges overlap",
        )


def check_object(
    policies: Sequence[Policy], namespace_labels: Mapping[str, str], facts: ObjectFacts
) -> list[Refusal]:
    """Every refusal of one object in a namespace with ``namespace_labels`` by the
    cluster's ``policies`` (all of them; ``governing`` picks those that apply).
    Empty: allowed. The numeric priority is never refused, only clamped
    (``effective_priority``); namespace usage is judged apart
    (``namespace_usage_allowed``), since it depends on the other objects."""
    if not policies:
        return []
    governed = governing(policies, namespace_labels)
    if not governed:
        return [_denied(policies)]
    broken = [_invalid(p) for p in governed if p.invalid]
    if broken:
        return broken
    refusals: list[Refusal] = []
    for policy in governed:
        for check in (_slices, _priority_classes, _provisioning, _service, _service_accounts):
            refusals.extend(check(policy, facts))
    refusals.extend(_empty_priority_range(governed))
    refusals.extend(_pod_security(governed, facts))
    return refusals


def pool_allowed(policy: Policy, node_labels: Mapping[str, str]) -> bool:
    """Whether a pool (or node) with ``node_labels`` may hold the slices of the
    namespaces ``policy`` governs: it carries every ``spec.pools.nodeSelector`` label.
    Taints are not this rule's: the planner judges them against the slice's
    tolerations whether or not a policy exists."""
    return all(node_labels.get(k) == v for k, v in policy.pool_node_selector.items())


def pools_allowed(policies: Sequence[Policy], node_labels: Mapping[str, str]) -> bool:
    """``pool_allowed`` by every governing policy (each one's labels are required)."""
    return all(pool_allowed(p, node_labels) for p in policies)


def namespace_usage_allowed(
    policies: Sequence[Policy], in_use: Usage, asking: Usage
) -> list[Refusal]:
    """Whether a namespace already using ``in_use`` may take ``asking`` more, under each
    governing policy's ``spec.limits`` (slices and chips in use per namespace). Empty:
    allowed. A refusal here means wait (the object is not wrong; others may finish)."""
    refusals: list[Refusal] = []
    for policy in policies:
        limits: Limits = policy.limits
        for what, used, more, limit, name in (
            (
                "slices",
                in_use.slices,
                asking.slices,
                limits.slices_per_namespace,
                "slicesPerNamespace",
            ),
            ("chips", in_use.chips, asking.chips, limits.chips_per_namespace, "chipsPerNamespace"),
        ):
            if limit is not None and used + more > limit:
                refusals.append(
                    _refusal(
                        policy,
                        "spec.tpu.slices",
                        f"spec.limits.{name} {limit}",
                        f"the namespace uses {used} {what} and this asks for {more}; "
                        f"at most {limit} in use per namespace",
                    )
                )
    return refusals
