"""The MutatingWebhookConfiguration of the identity webhook and the
ValidatingWebhookConfiguration of the policy webhook, pointing at a URL (local
development and e2e) or at a Service (in cluster).

Which pods reach the webhook: a CREATE of a pod labelled ``tpuslice.dev/cluster``
(our worker templates) and ``ray.io/node-type: worker`` (KubeRay's label on every
worker pod: ray-project/kuberay ray-operator/controllers/ray/utils/constant.go
``RayNodeTypeLabelKey``, value ``WorkerNode`` in apis/ray/v1/raycluster_types.go),
in a namespace the ``namespaceSelector`` matches (by default every one but
``kube-system``, so a webhook outage never touches the cluster's own pods).
``failurePolicy``, ``timeoutSeconds`` and the ``namespaceSelector`` are operator
settings (``tpuslice run`` flags, set by the chart from its values); every
replica builds the same body from the same settings, so their applies agree.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuslice.model import constants as c
from tpuslice.webhook.admission import DEFAULT_TIMEOUT_SECONDS, HANDLER_ID, WEBHOOK_ENTRY_NAME
from tpuslice.webhook.policy_admission import (
    POLICY_HANDLER_ID,
    POLICY_WEBHOOK,
    POLICY_WEBHOOK_ENTRY_NAME,
)

__all__ = [
    "DEFAULT_FAILURE_POLICY",
    "DEFAULT_NAMESPACE_SELECTOR",
    "FAILURE_POLICIES",
    "NAMESPACE_NAME_LABEL",
    "POLICY_FAILURE_POLICY",
    "ServiceRef",
    "checked_namespace_selector",
    "object_selector",
    "parse_namespace_selector",
    "policy_webhook_configuration",
    "webhook_configuration",
]

#: The label Kubernetes puts on every namespace, its own name (Kubernetes >= 1.22,
#: "Well-Known Labels, Annotations and Taints": kubernetes.io/metadata.name).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
#: Every namespace but kube-system.
DEFAULT_NAMESPACE_SELECTOR: Mapping[str, Any] = {
    "matchExpressions": [
        {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": ["kube-system"]}
    ]
}
#: admissionregistration.k8s.io/v1 failurePolicy values.
FAILURE_POLICIES = ("Fail", "Ignore")
#: A TPU worker admitted without its identity hangs in JAX start-up; refusing it
#: makes KubeRay retry until the webhook answers again.
DEFAULT_FAILURE_POLICY = "Fail"
#: The policy webhook's: the pass enforces policies anyway (policy_webhook_configuration).
POLICY_FAILURE_POLICY = "Ignore"

_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
#: Bounds on a namespaceSelector given as a setting (far above any real one).
_MAX_SELECTOR_CHARS = 16 * 1024
_MAX_EXPRESSIONS = 32
_MAX_VALUES = 256


def object_selector() -> dict[str, Any]:
    """Our worker pods: the template label we render, and KubeRay's worker node type."""
    return {
        "matchExpressions": [
            {"key": c.LABEL_CLUSTER, "operator": "Exists"},
            {
                "key": c.KUBERAY_LABEL_NODE_TYPE,
                "operator": "In",
                "values": [c.KUBERAY_NODE_TYPE_WORKER],
            },
        ]
    }


def checked_namespace_selector(selector: Mapping[str, Any] | None) -> dict[str, Any]:
    """``selector`` checked (a LabelSelector), or the default: every namespace but kube-system.

    Raises ValueError naming the field that is wrong and what it must be.
    """
    if selector is None:
        return json.loads(json.dumps(DEFAULT_NAMESPACE_SELECTOR))  # type: ignore[no-any-return]
    where = "webhook namespaceSelector"
    if not isinstance(selector, Mapping):
        raise ValueError(f"{where} must be a label selector object, got {type(selector).__name__}")
    unknown = sorted(set(selector) - {"matchLabels", "matchExpressions"})
    if unknown:
        raise ValueError(
            f"{where}: unknown field(s) {', '.join(unknown)}; a label selector has only "
            f"matchLabels and matchExpressions"
        )
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise ValueError(f"{where}.matchLabels must map label names to string values")
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list) or len(expressions) > _MAX_EXPRESSIONS:
        raise ValueError(f"{where}.matchExpressions must be a list of at most {_MAX_EXPRESSIONS}")
    checked = [_expression(f"{where}.matchExpressions[{i}]", e) for i, e in enumerate(expressions)]
    # The fields as given (an empty list stays): the chart renders the same body.
    out: dict[str, Any] = {}
    if "matchLabels" in selector:
        out["matchLabels"] = dict(labels)
    if "matchExpressions" in selector:
        out["matchExpressions"] = checked
    return out


def _expression(where: str, expression: Any) -> dict[str, Any]:
    if not isinstance(expression, Mapping):
        raise ValueError(f"{where} must be an object with key, operator and values")
    unknown = sorted(set(expression) - {"key", "operator", "values"})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
    key, operator = expression.get("key"), expression.get("operator")
    values = expression.get("values") or []
    if not isinstance(key, str) or not key:
        raise ValueError(f"{where}.key must be a label name")
    if operator not in _OPERATORS:
        raise ValueError(f"{where}.operator {operator!r} must be one of {', '.join(_OPERATORS)}")
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{where}.values must be a list of strings")
    if len(values) > _MAX_VALUES:
        raise ValueError(f"{where}.values has {len(values)} entries; at most {_MAX_VALUES}")
    if (operator in ("In", "NotIn")) != bool(values):
        raise ValueError(
            f"{where}: operator {operator} "
            + ("needs at least one value" if values == [] else "takes no values")
        )
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


def parse_namespace_selector(text: str) -> dict[str, Any]:
    """A namespaceSelector given as JSON (the ``--webhook-namespace-selector`` flag), checked."""
    if len(text) > _MAX_SELECTOR_CHARS:
        raise ValueError(
            f"webhook namespaceSelector is {len(text)} characters; at most {_MAX_SELECTOR_CHARS}"
        )
    try:
        selector = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"webhook namespaceSelector is not JSON ({exc.msg}); give a label selector such as "
            f"{json.dumps(DEFAULT_NAMESPACE_SELECTOR)}"
        ) from None
    return checked_namespace_selector(selector)


# --------------------------------------------------------------- configuration


def _check_timeout(timeout_seconds: int) -> None:
    if not 1 <= timeout_seconds <= 30:
        raise ValueError("timeoutSeconds must be between 1 and 30 (a Kubernetes limit)")


@dataclass(frozen=True)
class ServiceRef:
    """The in-cluster Service in front of the operator's webhook port."""

    name: str
    namespace: str
    port: int = 443


def webhook_configuration(
    *,
    ca_bundle: bytes,
    url: str | None = None,
    service: ServiceRef | None = None,
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS,
    failure_policy: str = DEFAULT_FAILURE_POLICY,
    namespace_selector: Mapping[str, Any] | None = None,
    name: str = c.IDENTITY_WEBHOOK,
) -> dict[str, Any]:
    """The MutatingWebhookConfiguration, by URL (``https://127.0.0.1:9443``) or Service.

    ``url`` is the server's base URL; the handler id is appended as the path,
    the one path ``IdentityWebhookServer`` answers. ``reinvocationPolicy: IfNeeded`` lets
    the API server call us again after later webhooks changed the pod; the
    mutation is idempotent, so a second call changes nothing unless another
    webhook removed what we set. ``namespace_selector`` None: every namespace but
    kube-system.
    """
    _check_timeout(timeout_seconds)
    if failure_policy not in FAILURE_POLICIES:
        raise ValueError(
            f"failurePolicy {failure_policy!r} must be one of {', '.join(FAILURE_POLICIES)}"
        )
    client_config = _client_config(ca_bundle, url, service, HANDLER_ID)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {
            "name": name,
            "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY},
        },
        "webhooks": [
            {
                "name": WEBHOOK_ENTRY_NAME,
                "admissionReviewVersions": ["v1"],
                "clientConfig": client_config,
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "operations": ["CREATE"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": checked_namespace_selector(namespace_selector),
                "objectSelector": object_selector(),
                "failurePolicy": failure_policy,
                "matchPolicy": "Equivalent",
                "sideEffects": "None",
                "timeoutSeconds": timeout_seconds,
                "reinvocationPolicy": "IfNeeded",
            }
        ],
    }


def _client_config(
    ca_bundle: bytes, url: str | None, service: ServiceRef | None, path: str
) -> dict[str, Any]:
    """Where the API server calls: ``url`` with ``path`` appended, or the Service's ``path``."""
    if (url is None) == (service is None):
        raise ValueError("give exactly one of url (local) or service (in cluster)")
    client_config: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode("ascii")}
    if url is not None:
        if not url.startswith("https://"):
            raise ValueError(f"the API server calls webhooks over HTTPS only, got {url!r}")
        client_config["url"] = f"{url.rstrip('/')}/{path}"
    elif service is not None:
        client_config["service"] = {
            "name": service.name,
            "namespace": service.namespace,
            "port": service.port,
            "path": f"/{path}",
        }
    return client_config


def policy_webhook_configuration(
    *,
    ca_bundle: bytes,
    url: str | None = None,
    service: ServiceRef | None = None,
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration of the policy webhook (``policy_admission``):
    CREATE and UPDATE of the three TPUSlice kinds, in every namespace, on the same
    server and certificate as the identity webhook, at its own path.

    ``failurePolicy: Ignore``, always: the operator's pass enforces every policy
    whether or not admission ran, so a webhook that cannot answer must not block
    users' applies (nor the operator's own writes, nor finalizer removal); it only
    delays a refusal from ``kubectl apply`` to the object's status. Status writes go
    to the ``/status`` subresource, which the rules leave out; a DELETE is never sent.
    Every namespace: a policy may govern any of them, and with policies present a
    namespace no policy selects is refused.
    """
    _check_timeout(timeout_seconds)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {
            "name": POLICY_WEBHOOK,
            "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY},
        },
        "webhooks": [
            {
                "name": POLICY_WEBHOOK_ENTRY_NAME,
                "admissionReviewVersions": ["v1"],
                "clientConfig": _client_config(ca_bundle, url, service, POLICY_HANDLER_ID),
                "rules": [
                    {
                        "apiGroups": [c.GROUP],
                        "apiVersions": [c.VERSION],
                        "resources": [c.PLURAL_CLUSTER, c.PLURAL_JOB, c.PLURAL_SERVICE],
                        "operations": ["CREATE", "UPDATE"],
                        "scope": "Namespaced",
                    }
                ],
                "failurePolicy": POLICY_FAILURE_POLICY,
                "matchPolicy": "Equivalent",
                "sideEffects": "None",
                "timeoutSeconds": timeout_seconds,
            }
        ],
    }
