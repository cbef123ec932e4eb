"""Which policies govern a namespace: label selectors over the namespace's labels.

The matching is metav1.LabelSelector's (k8s.io/apimachinery pkg/labels selector
semantics, as documented on "Labels and Selectors",
https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/): every
matchLabels pair and every expression must hold; ``NotIn`` and ``DoesNotExist`` hold
for a namespace without the key; the empty selector selects every namespace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tpuslice.policy.records import LabelRequirement, LabelSelector, Policy

__all__ = ["governing", "selects"]


def _holds(requirement: LabelRequirement, labels: Mapping[str, str]) -> bool:
    present = requirement.key in labels
    if requirement.operator == "Exists":
        return present
    if requirement.operator == "DoesNotExist":
        return not present
    if requirement.operator == "In":
        return present and labels[requirement.key] in requirement.values
    # NotIn: a namespace without the key is not in the set.
    return not present or labels[requirement.key] not in requirement.values


def selects(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy every part of ``selector``."""
    return all(labels.get(k) == v for k, v in selector.match_labels.items()) and all(
        _holds(r, labels) for r in selector.match_expressions
    )


def governing(
    policies: Iterable[Policy], namespace_labels: Mapping[str, str]
) -> tuple[Policy, ...]:
    """The policies whose ``spec.namespaceSelector`` selects the namespace, by name.

    Several may: all of them apply (the object must satisfy each), so on every
    dimension the strictest wins. Sorted so refusals read the same on every pass.
    """
    return tuple(
        sorted(
            (p for p in policies if selects(p.namespace_selector, namespace_labels)),
            key=lambda p: p.name,
        )
    )
