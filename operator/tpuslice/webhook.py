"""The TPU identity mutating webhook: a thin kopf handler over identity.py.

Three pieces, each usable on its own:

- ``register_identity_webhook(registry)`` adds the ``@kopf.on.mutate`` handler
  for pods (CREATE only, pods labelled ``tpuslice.dev/cluster``);
  ``configure_admission(settings, server)`` makes kopf serve it without kopf
  managing any webhook configuration (we apply ours, so its failure policy,
  selector and timeout are ours).
- ``build_certificates`` / ``write_certificates`` make a CA and a serving
  certificate with ``cryptography`` (kopf's own generator needs
  certbuilder/oscrypto, which fail on OpenSSL 3), for ``kopf.WebhookServer``.
- ``webhook_configuration`` builds the MutatingWebhookConfiguration, pointing
  at a URL (local development and e2e) or at a Service (in cluster).

Why ``failurePolicy: Fail``: a TPU worker admitted without its identity hangs in
JAX initialisation; refusing it makes KubeRay retry until the webhook is back.
The objectSelector limits that to our pods, so no other pod in the cluster ever
depends on this webhook.
"""

from __future__ import annotations

import base64
import datetime
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from tpuslice import constants as c
from tpuslice import pki
from tpuslice.identity import IdentityError, MutationResult, mutate_pod
from tpuslice.metrics import Metrics

__all__ = [
    "HANDLER_ID",
    "WEBHOOK_ENTRY_NAME",
    "CertBundle",
    "CertFiles",
    "ServiceRef",
    "admission_warnings",
    "build_certificates",
    "certificates_for",
    "configure_admission",
    "identity_handler",
    "register_identity_webhook",
    "service_hosts",
    "timed_identity_handler",
    "webhook_configuration",
    "webhook_server",
    "write_certificates",
]

#: kopf routes ``POST <server path>/<handler id>`` to the handler with that id.
HANDLER_ID = c.IDENTITY_WEBHOOK
#: ``webhooks[].name``: Kubernetes requires a qualified name of three or more segments.
WEBHOOK_ENTRY_NAME = f"identity.{c.GROUP}"
#: Kubernetes allows 1-30 s; a pure function answers in milliseconds, and a short
#: timeout turns a hung webhook into a quick refusal that KubeRay retries.
DEFAULT_TIMEOUT_SECONDS = 5


# ----------------------------------------------------------------------- handler


def admission_warnings(result: MutationResult) -> list[str]:
    """Admission warnings (shown to the client that created the pod) for kept/replaced values."""
    warnings = [
        f"{c.IDENTITY_WEBHOOK}: kept {note.name} as set in container {note.container!r}; "
        f"it differs from the value computed for this pod"
        for note in result.kept
    ]
    warnings += [
        f"{c.IDENTITY_WEBHOOK}: replaced "
        + (f"{note.name} in container {note.container!r}" if note.container else note.name)
        + " (a placeholder or a value that peers could not resolve)"
        for note in result.replaced
    ]
    return warnings


def identity_handler(
    body: Mapping[str, Any],
    patch: kopf.Patch,
    warnings: list[str],
    logger: Any,
    **_: Any,
) -> None:
    """Admit a pod with its TPU identity, or refuse it with the reason.

    The mutation is handed to kopf as a patch function over the pod; kopf diffs
    the result into the JSON patch it returns, so an already mutated pod
    (reinvocation) yields an empty patch.
    """
    try:
        result = mutate_pod(body)
    except IdentityError as err:
        raise kopf.AdmissionError(str(err), code=403) from None
    if result.identity is None:
        return
    spec = result.pod["spec"]

    def apply(raw: Any) -> None:
        raw["spec"] = spec

    patch.fns.append(apply)
    for text in admission_warnings(result):
        warnings.append(text)
        logger.warning(text)


def timed_identity_handler(metrics: Metrics) -> Callable[..., None]:
    """``identity_handler`` observed into ``metrics``: latency by mutated/unchanged/refused/error.

    A wrapper, so identity_handler stays a plain function its tests call directly.
    """

    def handler(**kwargs: Any) -> None:
        began = time.perf_counter()
        fns = len(kwargs["patch"].fns)
        result = "error"
        try:
            identity_handler(**kwargs)
            result = "mutated" if len(kwargs["patch"].fns) > fns else "unchanged"
        except kopf.AdmissionError:
            result = "refused"
            raise
        finally:
            metrics.admission(time.perf_counter() - began, result)

    return handler


def register_identity_webhook(
    registry: kopf.OperatorRegistry | None = None, metrics: Metrics | None = None
) -> None:
    """Register the mutating handler on ``registry`` (kopf's default registry if None).

    The label filter repeats the configuration's objectSelector so that a
    kopf-managed configuration (``settings.admission.managed``) would be safe too.
    """
    kopf.on.mutate(
        group="",
        version="v1",
        plural="pods",
        id=HANDLER_ID,
        operations=["CREATE"],
        labels={c.LABEL_CLUSTER: kopf.PRESENT},
        side_effects=False,
        registry=registry,
    )(identity_handler if metrics is None else timed_identity_handler(metrics))


# -------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class CertBundle:
    """PEM bytes of a CA, and of a serving certificate and key signed by it."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class CertFiles:
    """Where ``write_certificates`` put a bundle: the arguments of ``kopf.WebhookServer``."""

    ca: Path
    cert: Path
    key: Path

    def ca_bundle(self) -> bytes:
        return self.ca.read_bytes()


def service_hosts(service: str, namespace: str) -> list[str]:
    """The names the API server uses to reach ``service`` in ``namespace``."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def build_certificates(
    hosts: Sequence[str],
    *,
    valid_days: int = 365,
    now: datetime.datetime | None = None,
) -> CertBundle:
    """A fresh CA and a serving certificate for ``hosts`` (DNS names or IP addresses);
    the first host is the subject's common name, all of them are SANs (what Go checks)."""
    if not hosts:
        raise ValueError("a serving certificate needs at least one host name or IP address")
    valid = datetime.timedelta(days=valid_days)
    ca = pki.new_ca(f"{c.IDENTITY_WEBHOOK}-ca", valid=valid, now=now)
    cert, key = pki.issue(
        ca, hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, hosts=hosts, valid=valid, now=now
    )
    return CertBundle(
        ca_pem=ca[0].public_bytes(serialization.Encoding.PEM),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=pki.key_pem(key),
    )


def write_certificates(bundle: CertBundle, directory: Path) -> CertFiles:
    """Write ``ca.crt``, ``tls.crt`` and ``tls.key`` (mode 0600) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    files = CertFiles(
        ca=directory / "ca.crt", cert=directory / "tls.crt", key=directory / "tls.key"
    )
    files.ca.write_bytes(bundle.ca_pem)
    files.cert.write_bytes(bundle.cert_pem)
    fd = os.open(files.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(bundle.key_pem)
    return files


def certificates_for(directory: Path, hosts: Sequence[str]) -> CertFiles:
    """Certificates mounted by cert-manager (tls.crt, tls.key, ca.crt) if present in
    ``directory``, else a fresh self-signed set for ``hosts`` written there."""
    mounted = CertFiles(
        ca=directory / "ca.crt", cert=directory / "tls.crt", key=directory / "tls.key"
    )
    if all(p.exists() for p in (mounted.ca, mounted.cert, mounted.key)):
        return mounted
    return write_certificates(build_certificates(hosts), directory)


# ------------------------------------------------------------------ server wiring


def webhook_server(
    certs: CertFiles,
    *,
    port: int,
    addr: str | None = None,
    host: str | None = None,
) -> kopf.WebhookServer:
    """kopf's HTTPS server with our certificate; ``addr`` None listens on all interfaces."""
    return kopf.WebhookServer(
        addr=addr,
        port=port,
        host=host,
        certfile=str(certs.cert),
        pkeyfile=str(certs.key),
        cafile=str(certs.ca),
    )


def configure_admission(settings: kopf.OperatorSettings, server: kopf.WebhookServer) -> None:
    """Call from an ``@kopf.on.startup`` handler: serve admission, manage no configuration."""
    settings.admission.server = server
    settings.admission.managed = None


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
    which is how kopf finds the handler. ``reinvocationPolicy: IfNeeded`` lets
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
