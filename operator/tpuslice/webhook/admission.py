"""The TPU identity mutating webhook: a small HTTPS server over identity.py, in its own threads.

Four pieces, each usable on its own:

- ``admission_response(review)`` is the whole admission decision as a pure
  function, AdmissionReview v1 in, AdmissionReview v1 out: ``mutate_pod`` on a
  pod CREATE, its changes as an RFC 6902 JSON patch (``json_patch``: only the
  fields we changed, so the API server's audit log shows what we set), a
  refusal (403) with the reason on ``IdentityError``.
  ``timed_admission_response`` is the same, observed into ``Metrics``.
- ``IdentityWebhookServer`` serves it: ``POST /<HANDLER_ID>`` over TLS (stdlib
  ``http.server``, HTTP/1.1 keep-alive, a thread per connection), started by
  ``serve_identity_webhook``.
- ``build_certificates`` / ``write_certificates`` make a CA and a serving
  certificate with ``cryptography`` (kopf's own generator needs
  certbuilder/oscrypto, which fail on OpenSSL 3).
- ``webhook_configuration`` builds the MutatingWebhookConfiguration, pointing
  at a URL (local development and e2e) or at a Service (in cluster).

Why threads, and not kopf's admission server: kopf answers admission requests
on the asyncio event loop that also runs every reconcile and status patch, so
under load each pod KubeRay creates waited behind that queue (RayCluster to
first pod: 13 s without the webhook, 35 s with it, at 200 clusters). Here a
request waits only for the GIL, which a busy event loop hands over every few
milliseconds (``sys.getswitchinterval``), and the decision itself is a pure
function that takes milliseconds.

Why ``failurePolicy: Fail``: a TPU worker admitted without its identity hangs in
JAX initialisation; refusing it makes KubeRay retry until the webhook is back.
The objectSelector limits that to our pods, so no other pod in the cluster ever
depends on this webhook, and the short ``timeoutSeconds`` turns a hung webhook
into a quick refusal.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import os
import socket
import socketserver
import ssl
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from tpuslice.model import constants as c
from tpuslice.render.identity import IdentityError, MutationResult, mutate_pod
from tpuslice.runtime.metrics import Metrics
from tpuslice.webhook import pki

__all__ = [
    "HANDLER_ID",
    "MAX_BODY_BYTES",
    "WEBHOOK_ENTRY_NAME",
    "BadReview",
    "CertBundle",
    "CertFiles",
    "IdentityWebhookServer",
    "ServiceRef",
    "admission_outcome",
    "admission_response",
    "admission_warnings",
    "build_certificates",
    "certificates_for",
    "issue_serving",
    "serve_identity_webhook",
    "service_hosts",
    "timed_admission_response",
    "webhook_configuration",
    "write_certificates",
]

log = logging.getLogger(__name__)

#: The server answers ``POST /<HANDLER_ID>``; the configuration's URL or Service path ends in it.
HANDLER_ID = c.IDENTITY_WEBHOOK
#: ``webhooks[].name``: Kubernetes requires a qualified name of three or more segments.
WEBHOOK_ENTRY_NAME = f"identity.{c.GROUP}"
#: Kubernetes allows 1-30 s; a pure function answers in milliseconds, and a short
#: timeout turns a hung webhook into a quick refusal that KubeRay retries.
DEFAULT_TIMEOUT_SECONDS = 5
#: Larger request bodies get 413. The API server caps an object at about 1.5 MiB
#: (etcd's request limit), so a real AdmissionReview stays well below this.
MAX_BODY_BYTES = 8 * 1024 * 1024
#: A connection idle (or stalled mid-request) this long is closed; the API
#: server's client keeps idle connections for 90 s and opens a new one as needed.
IDLE_TIMEOUT_SECONDS = 60.0

_REVIEW_API_VERSION = "admission.k8s.io/v1"


# ---------------------------------------------------------------------- decision


class BadReview(ValueError):
    """The request body is not an AdmissionReview v1 request (the server answers 400)."""


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


def _request_of(review: Any) -> Mapping[str, Any]:
    if not isinstance(review, Mapping):
        raise BadReview("the body is not a JSON object")
    if review.get("apiVersion") != _REVIEW_API_VERSION or review.get("kind") != "AdmissionReview":
        raise BadReview(
            f"expected an AdmissionReview of {_REVIEW_API_VERSION}, got "
            f"{review.get('kind')!r} of {review.get('apiVersion')!r}"
        )
    request = review.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise BadReview("the AdmissionReview has no request with a uid")
    return request


def _is_pod_create(request: Mapping[str, Any]) -> bool:
    """A CREATE of a pod itself: not of a subresource (pods/binding, pods/eviction are
    CREATEs too), which our configuration's rules never send but a hand-made one might."""
    resource = request.get("resource")
    return (
        isinstance(resource, Mapping)
        and request.get("operation") == "CREATE"
        and resource.get("group", "") == ""
        and resource.get("resource") == "pods"
        and not request.get("subResource")
    )


def _pod_ref(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    name = meta.get("name") or f"{meta.get('generateName') or ''}*"
    return f"{meta.get('namespace') or '?'}/{name}"


def admission_response(review: Mapping[str, Any]) -> dict[str, Any]:
    """The AdmissionReview answering ``review``: admit a pod with its TPU identity, or refuse it.

    Only a CREATE of a pod labelled ``tpuslice.dev/cluster`` is looked at (the
    label repeats the configuration's objectSelector); anything else is allowed
    unchanged. An already mutated pod (reinvocation) gets no patch, because
    ``mutate_pod`` is idempotent. Raises ``BadReview`` for a body that is not an
    AdmissionReview v1 request.
    """
    request = _request_of(review)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    answer = {"apiVersion": _REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}
    pod = request.get("object")
    if not _is_pod_create(request):
        return answer
    if not isinstance(pod, Mapping):
        raise BadReview("a pod CREATE without the pod as request.object")
    if c.LABEL_CLUSTER not in ((pod.get("metadata") or {}).get("labels") or {}):
        return answer
    try:
        result = mutate_pod(pod)
    except IdentityError as err:
        response["allowed"] = False
        response["status"] = {"code": HTTPStatus.FORBIDDEN.value, "message": str(err)}
        return answer
    if result.identity is None:
        return answer
    warnings = admission_warnings(result)
    for text in warnings:
        log.warning("pod %s: %s", _pod_ref(pod), text)
    if warnings:
        response["warnings"] = warnings
    ops = json_patch(pod, result.pod)
    if not ops:
        return answer
    response["patchType"] = "JSONPatch"
    response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode("ascii")
    return answer


def json_patch(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """RFC 6902 operations that turn ``old`` into ``new``: objects key by key, arrays of
    the same length item by item, any other difference replaced whole (an env list that
    grew is one ``replace`` of the list).

    Exact by construction and cheap: an equal subtree costs one C-level comparison, so
    a pod's patch costs about as much as comparing it once. ``jsonpatch.make_patch``
    (used before) searches for list moves and was the webhook's largest CPU cost under
    a pod burst (docs/performance.md); its patches were smaller, not more correct."""
    if old == new:
        return []
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        ops: list[dict[str, Any]] = [
            {"op": "remove", "path": f"{path}/{_pointer_token(key)}"}
            for key in old
            if key not in new
        ]
        for key, value in new.items():
            at = f"{path}/{_pointer_token(key)}"
            if key in old:
                ops += json_patch(old[key], value, at)
            else:
                ops.append({"op": "add", "path": at, "value": value})
        return ops
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [
            op
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            for op in json_patch(a, b, f"{path}/{i}")
        ]
    return [{"op": "replace", "path": path, "value": new}]


def _pointer_token(key: Any) -> str:
    """A JSON Pointer reference token (RFC 6901: ``~`` as ``~0``, ``/`` as ``~1``)."""
    return str(key).replace("~", "~0").replace("/", "~1")


def admission_outcome(answer: Mapping[str, Any]) -> str:
    """The metric label of an ``admission_response`` answer: mutated, unchanged or refused."""
    response = answer["response"]
    if not response["allowed"]:
        return "refused"
    return "mutated" if "patch" in response else "unchanged"


def timed_admission_response(review: Mapping[str, Any], metrics: Metrics) -> dict[str, Any]:
    """``admission_response`` observed into ``metrics``: latency by mutated/unchanged/refused,
    or ``error`` (also counted in ``tpuslice_errors_total{kind="webhook"}``) when it raises.

    A body that is not an AdmissionReview (``BadReview``) is not an admission and
    is not observed.
    """
    began = time.perf_counter()
    result = "error"
    try:
        answer = admission_response(review)
        result = admission_outcome(answer)
        return answer
    except BadReview:
        result = ""
        raise
    finally:
        if result:
            metrics.admission(time.perf_counter() - began, result)


# -------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class CertBundle:
    """PEM bytes of a CA, and of a serving certificate and key signed by it; the CA's
    key too when we made the CA (kept in the shared Secret, to issue the next serving
    certificate under the same CA: the configuration's caBundle then never changes)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    ca_key_pem: bytes = b""


@dataclass(frozen=True)
class CertFiles:
    """Where ``write_certificates`` put a bundle: what ``IdentityWebhookServer`` serves with."""

    ca: Path
    cert: Path
    key: Path

    def ca_bundle(self) -> bytes:
        return self.ca.read_bytes()

    def contents(self) -> tuple[bytes, bytes, bytes]:
        """What is being served (CA, certificate, key): compared to notice a rotation."""
        return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()


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
    ca_valid_days: int | None = None,
    now: datetime.datetime | None = None,
) -> CertBundle:
    """A fresh CA (valid ``ca_valid_days``, default ``valid_days``) and a serving
    certificate for ``hosts`` (DNS names or IP addresses); the first host is the
    subject's common name, all of them are SANs (what Go checks)."""
    valid = datetime.timedelta(days=ca_valid_days or valid_days)
    ca = pki.new_ca(f"{c.IDENTITY_WEBHOOK}-ca", valid=valid, now=now)
    return issue_serving(ca, hosts, valid_days=valid_days, now=now)


def issue_serving(
    ca: pki.Issued,
    hosts: Sequence[str],
    *,
    valid_days: int = 365,
    now: datetime.datetime | None = None,
) -> CertBundle:
    """A serving certificate for ``hosts`` signed by ``ca``, bundled with that CA."""
    if not hosts:
        raise ValueError("a serving certificate needs at least one host name or IP address")
    valid = datetime.timedelta(days=valid_days)
    cert, key = pki.issue(
        ca, hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, hosts=hosts, valid=valid, now=now
    )
    return CertBundle(
        ca_pem=ca[0].public_bytes(serialization.Encoding.PEM),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=pki.key_pem(key),
        ca_key_pem=pki.key_pem(ca[1]),
    )


def write_certificates(bundle: CertBundle, directory: Path) -> CertFiles:
    """Write ``ca.crt``, ``tls.crt`` and ``tls.key`` (mode 0600) into ``directory``.

    The CA's key is never written: only the shared Secret keeps it."""
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


# ------------------------------------------------------------------------ server


class _AdmissionHandler(BaseHTTPRequestHandler):
    """One connection: HTTP/1.1 keep-alive, every answer with a Content-Length."""

    protocol_version = "HTTP/1.1"
    server_version = c.IDENTITY_WEBHOOK
    sys_version = ""
    timeout = IDLE_TIMEOUT_SECONDS
    # Headers and body leave in one TLS record (flushed after each request), and
    # without Nagle's delay: a small answer must not wait for the client's ACK.
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True
    server: IdentityWebhookServer

    def setup(self) -> None:
        super().setup()
        # The TLS handshake runs here, in the connection's own thread, so a slow
        # or broken client never holds up the accept loop.
        connection = self.connection
        assert isinstance(connection, ssl.SSLSocket)
        connection.do_handshake()

    def handle_expect_100(self) -> bool:
        # The stdlib leaves "100 Continue" in our write buffer; the client waits for it.
        answer = super().handle_expect_100()
        self.wfile.flush()
        return answer

    def do_POST(self) -> None:
        body = self._read_body()
        if body is None:
            return
        # The API server appends ``?timeout=5s``; only the path routes.
        if urlsplit(self.path).path != f"/{HANDLER_ID}":
            self._reply(HTTPStatus.NOT_FOUND, b"not found\n")
            return
        try:
            review = json.loads(body)
        except (ValueError, RecursionError) as err:
            self._reply(HTTPStatus.BAD_REQUEST, f"not JSON: {err}\n".encode())
            return
        try:
            answer = self.server.answer(review)
        except BadReview as err:
            self._reply(HTTPStatus.BAD_REQUEST, f"{err}\n".encode())
            return
        except Exception as err:
            log.exception("identity webhook: the admission handler failed")
            message = f"internal error: {type(err).__name__}\n".encode()
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, message)
            return
        payload = json.dumps(answer, separators=(",", ":")).encode()
        # Draining (SIGTERM): answer, then close, so the API server's next call opens
        # a new connection, which the Service sends to a replica that is not stopping.
        self._reply(
            HTTPStatus.OK,
            payload,
            content_type="application/json",
            close=self.server.draining.is_set(),
        )

    def do_GET(self) -> None:
        if urlsplit(self.path).path == "/healthz":
            self._reply(HTTPStatus.OK, b"ok\n")
        else:
            self._reply(HTTPStatus.NOT_FOUND, b"not found\n")

    def _read_body(self) -> bytes | None:
        """The request body by Content-Length; None (the connection then closes) after
        a 4xx answer, or when the client went away mid-body."""
        raw = self.headers.get("Content-Length")
        if raw is None:
            self._reply(HTTPStatus.LENGTH_REQUIRED, b"Content-Length required\n", close=True)
            return None
        try:
            length = int(raw)
        except ValueError:
            length = -1
        if length < 0:
            self._reply(HTTPStatus.BAD_REQUEST, b"bad Content-Length\n", close=True)
            return None
        if length > MAX_BODY_BYTES:
            self._reply(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"body over {MAX_BODY_BYTES} bytes\n".encode(),
                close=True,
            )
            return None
        body = self.rfile.read(length)
        if len(body) < length:  # the client went away mid-body
            self.close_connection = True
            return None
        return body

    def _reply(
        self,
        status: HTTPStatus,
        body: bytes,
        *,
        content_type: str = "text/plain; charset=utf-8",
        close: bool = False,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Per-request lines (and the stdlib's own errors) at debug, not on stderr."""
        log.debug("identity webhook: %s %s", self.address_string(), format % args)


def _tls_context(files: CertFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    context.load_cert_chain(files.cert, files.key)
    return context


class IdentityWebhookServer(ThreadingHTTPServer):
    """``admission_response`` over HTTPS, in threads of its own (off the kopf event loop).

    ``POST /<HANDLER_ID>`` with an AdmissionReview answers 200 with one (a refusal
    is an answer too); a body that is no AdmissionReview gets 400, a failure of
    the handler 500 (``failurePolicy: Fail`` then refuses the pod), other paths
    404, ``GET /healthz`` 200. A daemon thread per connection; the API server
    reuses connections (HTTP/1.1 keep-alive). Nothing is bound until ``start()``.
    The certificate is read at construction and again by ``reload`` (a rotation:
    new connections get the new one). ``drain`` makes every answer close its
    connection, for the seconds between SIGTERM and ``stop``.
    """

    daemon_threads = True

    def __init__(
        self,
        files: CertFiles,
        *,
        port: int,
        addr: str | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.metrics = metrics
        self.context = _tls_context(files)
        self.draining = threading.Event()
        # addr None: every interface, IPv6 too where the host has it (as kopf's server did).
        self._dual_stack = addr is None and socket.has_dualstack_ipv6()
        host = "::" if self._dual_stack else (addr or "")
        if ":" in host:
            self.address_family = socket.AF_INET6
        self._thread: threading.Thread | None = None
        super().__init__((host, port), _AdmissionHandler, bind_and_activate=False)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def reload(self, files: CertFiles) -> None:
        """Serve ``files`` from the next connection on (one reference swap: a handshake
        never sees the new certificate with the old key)."""
        self.context = _tls_context(files)

    def drain(self) -> None:
        self.draining.set()

    def answer(self, review: Any) -> dict[str, Any]:
        if self.metrics is None:
            return admission_response(review)
        return timed_admission_response(review, self.metrics)

    def server_bind(self) -> None:
        # Not HTTPServer.server_bind: its socket.getfqdn() may wait on reverse DNS.
        if self._dual_stack:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = self.port

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, client = self.socket.accept()
        sock.settimeout(IDLE_TIMEOUT_SECONDS)
        return self.context.wrap_socket(
            sock, server_side=True, do_handshake_on_connect=False
        ), client

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed outside the handler's own error handling: log, no stderr."""
        err = sys.exc_info()[1]
        if isinstance(err, ssl.SSLEOFError | ConnectionError | TimeoutError):
            log.debug("identity webhook: connection from %s closed: %s", client_address, err)
        elif isinstance(err, ssl.SSLError):
            # e.g. the API server does not trust our certificate (a wrong caBundle)
            log.warning("identity webhook: TLS with %s failed: %s", client_address, err)
        else:
            log.error("identity webhook: connection from %s failed", client_address, exc_info=err)

    def start(self) -> int:
        """Bind, listen and serve in a daemon thread; returns the bound port (for port 0)."""
        if self._thread is not None:
            raise RuntimeError("the identity webhook server is already started")
        try:
            self.server_bind()
            self.server_activate()
        except BaseException:
            self.server_close()
            raise
        self._thread = threading.Thread(
            target=self.serve_forever, name="identity-webhook", daemon=True
        )
        self._thread.start()
        return self.port

    def stop(self) -> None:
        """Stop accepting and close the listening socket (open connections end on their own)."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
            self._thread = None
        self.server_close()


def serve_identity_webhook(
    files: CertFiles,
    *,
    port: int,
    addr: str | None = None,
    metrics: Metrics | None = None,
) -> IdentityWebhookServer:
    """Serve the identity webhook from its own threads; the returned server is started.

    ``addr`` None listens on all interfaces. Raises OSError when the port cannot
    be bound: with ``failurePolicy: Fail``, no webhook means no TPU worker pods.
    """
    server = IdentityWebhookServer(files, port=port, addr=addr, metrics=metrics)
    bound = server.start()
    log.info("TPU identity webhook listening on %s:%d (path /%s)", addr or "*", bound, HANDLER_ID)
    return server


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
