"""The identity webhook's HTTPS server: ``POST /<HANDLER_ID>`` over TLS (stdlib
``http.server``, HTTP/1.1 keep-alive, a thread per connection), on threads of its own.

Why threads, and not kopf's admission server: kopf answers admission requests
on the asyncio event loop that also runs every reconcile and status patch, so
under load each pod KubeRay creates waited behind that queue (RayCluster to
first pod: 13 s without the webhook, 35 s with it, at 200 clusters). Here a
request waits only for the GIL, which a busy event loop hands over every few
milliseconds (``sys.getswitchinterval``), and the decision itself is a pure
function that takes milliseconds.
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import ssl
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from tpuslice.model import constants as c
from tpuslice.runtime.metrics import Metrics
from tpuslice.webhook.admission import (
    HANDLER_ID,
    IDLE_TIMEOUT_SECONDS,
    MAX_BODY_BYTES,
    BadReview,
    admission_response,
    timed_admission_response,
)
from tpuslice.webhook.certificates import CertFiles

__all__ = [
    "IdentityWebhookServer",
    "serve_identity_webhook",
]

log = logging.getLogger(__name__)

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
