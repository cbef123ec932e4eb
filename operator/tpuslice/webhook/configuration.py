"""The MutatingWebhookConfiguration of the identity webhook, pointing at a URL (local
development and e2e) or at a Service (in cluster).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from tpuslice.model import constants as c
from tpuslice.webhook.admission import DEFAULT_TIMEOUT_SECONDS, HANDLER_ID, WEBHOOK_ENTRY_NAME

__all__ = [
    "ServiceRef",
    "webhook_configuration",
]

# --------------------------------------------------------------- configuration


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
    name: str = c.IDENTITY_WEBHOOK,
) -> dict[str, Any]:
    """The MutatingWebhookConfiguration, by URL (``https://127.0.0.1:9443``) or Service.

    ``url`` is the server's base URL; the handler id is appended as the path,
    the one path ``IdentityWebhookServer`` answers. ``reinvocationPolicy: IfNeeded`` lets
    the API server call us again after later webhooks changed the pod; the
    mutation is idempotent, so a second call changes nothing unless another
    webhook removed what we set.
    """
    if (url is None) == (service is None):
        raise ValueError("give exactly one of url (local) or service (in cluster)")
    if not 1 <= timeout_seconds <= 30:
        raise ValueError("timeoutSeconds must be between 1 and 30 (a Kubernetes limit)")
    client_config: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode("ascii")}
    if url is not None:
        if not url.startswith("https://"):
            raise ValueError(f"the API server calls webhooks over HTTPS only, got {url!r}")
        client_config["url"] = f"{url.rstrip('/')}/{HANDLER_ID}"
    elif service is not None:
        client_config["service"] = {
            "name": service.name,
            "namespace": service.namespace,
            "port": service.port,
            "path": f"/{HANDLER_ID}",
        }
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
                "objectSelector": {
                    "matchExpressions": [{"key": c.LABEL_CLUSTER, "operator": "Exists"}]
                },
                "failurePolicy": "Fail",
                "matchPolicy": "Equivalent",
                "sideEffects": "None",
                "timeoutSeconds": timeout_seconds,
                "reinvocationPolicy": "IfNeeded",
            }
        ],
    }
