"""The identity webhook's HTTPS server: ``POST /<HANDLER_ID>`` over TLS (stdlib
``http.server``, HTTP/1.1 keep-alive, a thread per connection), on threads of its own.
The policy webhook (``policy_admission``) shares it, its connections and its limits,
at ``POST /<POLICY_HANDLER_ID>``.

Why threads, and not kopf's admission server: kopf answers admission requests
on the asyncio event loop that also runs every reconcile and status patch, so
under load each pod KubeRay creates waited behind that queue (RayCluster to
first pod: 13 s without the webhook, 35 s with it, at 200 clusters). Here a
request waits only for the GIL, which a busy event loop hands over every few
milliseconds (``sys.getswitchinterval``), and the decision itself is a pure
function that takes milliseconds.

Why limits on everything: any pod that can reach the port can call it, and with
``failurePolicy: Fail`` a server that cannot answer refuses every TPU worker pod.
So at most ``max_connections`` connections hold a thread. One more takes the
worker of the connection that has waited longest on its client (handshake, idle
keep-alive, a request still arriving), else waits a moment in a bounded lane,
else gets 503 (never an unbounded queue). The TLS handshake, the wait for a
request and each request (headers, body and decision) have their own deadline,
so a client that sends half a request, or one byte a second, is dropped; bodies
are capped one by one and all together. ``ServerLimits`` holds the numbers; docs/reliability.md
("Webhook under load") has what a flood of hostile clients does to valid calls.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import socket
import socketserver
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from tpuslice.model import constants as c
from tpuslice.runtime.metrics import Metrics
from tpuslice.webhook.admission import (
    HANDLER_ID,
    HANDSHAKE_TIMEOUT_SECONDS,
    IDLE_TIMEOUT_SECONDS,
    LISTEN_BACKLOG,
    MAX_BODY_BYTES,
    MAX_BODY_BYTES_IN_FLIGHT,
    MAX_CONNECTIONS,
    MAX_WAITING_CONNECTIONS,
    REQUEST_DEADLINE_SECONDS,
    RETRY_AFTER_SECONDS,
    WORKER_WAIT_SECONDS,
    BadReview,
    Pin,
    admission_response,
    timed_admission_response,
)
from tpuslice.webhook.certificates import CertFiles
from tpuslice.webhook.policy_admission import POLICY_HANDLER_ID

__all__ = [
    "IdentityWebhookServer",
    "ServerLimits",
    "serve_identity_webhook",
]

log = logging.getLogger(__name__)

#: The request line and headers together; the stdlib alone allows 100 lines of 64 KiB.
_MAX_HEAD_BYTES = 64 * 1024
#: After an answer that closes a connection whose request was not read to the end
#: (413, 503): read and drop what the client still sends, at most this long and this
#: much, before closing. Closing with unread bytes makes the kernel send a reset,
#: and a reset can reach the client before it has read our answer.
_LINGER_SECONDS = 1.0
_LINGER_BYTES = 256 * 1024
#: How often a connection waiting for a worker looks again for one to close.
_WAITING_POLL_SECONDS = 0.05
#: At most one warning line per kind (turned away, missed deadline) this often.
_WARN_EVERY_SECONDS = 60.0


# ------------------------------------------------------------------------ limits


@dataclass(frozen=True)
class ServerLimits:
    """What one client, or many, may hold of the server: the defaults are
    admission.py's constants; tests pass small ones."""

    max_connections: int = MAX_CONNECTIONS
    max_waiting: int = MAX_WAITING_CONNECTIONS
    worker_wait: float = WORKER_WAIT_SECONDS
    listen_backlog: int = LISTEN_BACKLOG
    handshake_timeout: float = HANDSHAKE_TIMEOUT_SECONDS
    idle_timeout: float = IDLE_TIMEOUT_SECONDS
    request_deadline: float = REQUEST_DEADLINE_SECONDS
    max_body_bytes: int = MAX_BODY_BYTES
    max_body_bytes_in_flight: int = MAX_BODY_BYTES_IN_FLIGHT
    retry_after_seconds: int = RETRY_AFTER_SECONDS

    def __post_init__(self) -> None:
        counts = {
            "max_connections": (self.max_connections, 1, 4096),
            "max_waiting": (self.max_waiting, 0, 1024),
            "listen_backlog": (self.listen_backlog, 1, 65535),
            "max_body_bytes": (self.max_body_bytes, 1, 64 * 1024 * 1024),
            "max_body_bytes_in_flight": (
                self.max_body_bytes_in_flight,
                self.max_body_bytes,
                1024 * 1024 * 1024,
            ),
            "retry_after_seconds": (self.retry_after_seconds, 1, 3600),
        }
        for name, (value, low, high) in counts.items():
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(
                    f"ServerLimits.{name}: must be a whole number from {low} to {high}, "
                    f"got {value!r}"
                )
        for name in ("handshake_timeout", "idle_timeout", "request_deadline", "worker_wait"):
            value = getattr(self, name)
            seconds = isinstance(value, int | float) and not isinstance(value, bool)
            if not seconds or not 0 < value <= 600:  # NaN fails the comparison too
                raise ValueError(
                    f"ServerLimits.{name}: must be seconds above 0 and at most 600, got {value!r}"
                )


class _ByteBudget:
    """Bytes of request bodies held at once, by all connections together."""

    def __init__(self, total: int) -> None:
        self._free = total
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if n > self._free:
                return False
            self._free -= n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self._free += n


class _RareWarning:
    """A warning logged at most once per interval, with how many it stood for: a
    flood of hostile connections must not become a flood of log lines."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._next = 0.0
        self._unlogged = 0
        self._lock = threading.Lock()

    def warn(self, message: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now < self._next:
                self._unlogged += 1
                return
            unlogged, self._unlogged = self._unlogged, 0
            self._next = now + self._interval
        more = f" ({unlogged} more since the last such line)" if unlogged else ""
        log.warning("identity webhook: %s%s", message, more)


class _DeadlineReader(io.RawIOBase):
    """The connection's bytes, every read bounded by one deadline for the whole
    request (a per-read timeout lets a client trickle one byte a second for ever)
    and by a byte budget (reads past it see end of stream)."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        self.deadline = 0.0
        self.budget = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.budget <= 0:
            return 0
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed")
        self._sock.settimeout(remaining)
        with memoryview(buffer) as view:
            n = self._sock.recv_into(view[: self.budget])
        self.budget -= n
        return n


def _linger_close(sock: socket.socket) -> None:
    """Send our FIN, then drop what the client still sends (bounded), so the close
    does not become a reset that may destroy the answer before the client reads it."""
    end = time.monotonic() + _LINGER_SECONDS
    try:
        sock.shutdown(socket.SHUT_WR)  # an SSLSocket: plain TCP from here on
        dropped = 0
        while dropped < _LINGER_BYTES:
            remaining = end - time.monotonic()
            if remaining <= 0:
                break
            sock.settimeout(remaining)
            chunk = sock.recv(64 * 1024)
            if not chunk:
                break
            dropped += len(chunk)
    except OSError:
        pass  # the client went away first: nothing left to protect


# ------------------------------------------------------------------------ server


class _AdmissionHandler(BaseHTTPRequestHandler):
    """One connection: HTTP/1.1 keep-alive, every answer with a Content-Length."""

    protocol_version = "HTTP/1.1"
    server_version = c.IDENTITY_WEBHOOK
    sys_version = ""
    # The socket's timeout is the server's business: the handshake's from
    # get_request, then the reader's deadlines.
    timeout = None
    # Headers and body leave in one TLS record (flushed after each request), and
    # without Nagle's delay: a small answer must not wait for the client's ACK.
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True
    server: IdentityWebhookServer
    reader: _DeadlineReader
    buffered: io.BufferedReader
    #: When the current request must be answered (``time.monotonic()``).
    deadline: float
    #: The current request is still arriving (see ``IdentityWebhookServer.waits_on_client``).
    waiting = False

    def setup(self) -> None:
        super().setup()
        # The TLS handshake runs here, in the connection's own thread, so a slow
        # or broken client never holds up the accept loop.
        connection = self.connection
        assert isinstance(connection, ssl.SSLSocket)
        # A client that never finishes its handshake is waiting like any other.
        self.server.waits_on_client(id(self), connection)
        self.waiting = True
        try:
            connection.do_handshake()
        finally:
            sent_away = not self.stop_waiting_on_client()
        if sent_away:
            raise ConnectionAbortedError("closed for a new connection during the TLS handshake")
        self.rfile.close()
        self.reader = _DeadlineReader(connection)
        self.buffered = io.BufferedReader(self.reader)
        self.rfile = self.buffered
        self.deadline = 0.0

    def handle_one_request(self) -> None:
        """One request: wait for its first byte (the idle timeout), then read and
        answer it before the request deadline."""
        limits = self.server.limits
        self.reader.deadline = time.monotonic() + limits.idle_timeout
        self.reader.budget = 1
        self.server.waits_on_client(id(self), self.connection)
        try:
            started = self.buffered.peek(1)
        except (TimeoutError, OSError):
            started = b""  # idle too long, or the client went away
        if not self.server.stops_waiting(id(self)):
            started = b""  # closed for a new connection while all workers were busy
        if not started:
            self.close_connection = True
            return
        self.deadline = time.monotonic() + limits.request_deadline
        self.reader.deadline = self.deadline
        self.reader.budget = _MAX_HEAD_BYTES + limits.max_body_bytes
        # Until the request is read, the client may be stalling on purpose.
        self.server.waits_on_client(id(self), self.connection)
        self.waiting = True
        try:
            super().handle_one_request()
        except TimeoutError:  # in a write: the client reads no answers
            self.close_connection = True
        finally:
            self.stop_waiting_on_client()
        if self.reader.budget <= 0:
            self.close_connection = True

    def stop_waiting_on_client(self) -> bool:
        """The request is read (or failed): its connection may no longer be closed
        for a new one. False when it was, meanwhile (the connection then closes)."""
        if not self.waiting:
            return True
        self.waiting = False
        if self.server.stops_waiting(id(self)):
            return True
        self.close_connection = True
        return False

    def log_error(self, format: str, *args: Any) -> None:
        if args and isinstance(args[-1], TimeoutError):  # the stdlib's "Request timed out"
            self.server.missed_deadline.warn(
                f"dropped a request from {self.address_string()}: not received within "
                f"{self.server.limits.request_deadline:g} s"
            )
            return
        super().log_error(format, *args)

    def handle_expect_100(self) -> bool:
        # The stdlib leaves "100 Continue" in our write buffer; the client waits for it.
        answer = super().handle_expect_100()
        self.wfile.flush()
        return answer

    def do_POST(self) -> None:
        reserved = self._reserve_body()
        if reserved is None:
            return
        try:
            self._answer_review(reserved)
        finally:
            self.server.body_budget.give(reserved)

    def _answer_review(self, length: int) -> None:
        body = self.rfile.read(length)
        if not self.stop_waiting_on_client() or len(body) < length:
            self.close_connection = True  # the client went away mid-body, or was sent away
            return
        # The API server appends ``?timeout=5s``; only the path routes.
        decide = self.server.handler_for(urlsplit(self.path).path)
        if decide is None:
            self._reply(HTTPStatus.NOT_FOUND, b"not found\n")
            return
        try:
            review = json.loads(body)
        except (ValueError, RecursionError) as err:
            self._reply(HTTPStatus.BAD_REQUEST, f"not JSON: {err}\n".encode())
            return
        try:
            answer = decide(review)
        except BadReview as err:
            self._reply(HTTPStatus.BAD_REQUEST, f"{err}\n".encode())
            return
        except Exception as err:
            log.exception("identity webhook: the admission handler failed")
            message = f"internal error: {type(err).__name__}\n".encode()
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, message)
            return
        if time.monotonic() > self.deadline:
            # The API server has given up on this call; say so to anyone still listening.
            self.server.missed_deadline.warn(
                f"answered 503 to a request from {self.address_string()}: not decided within "
                f"{self.server.limits.request_deadline:g} s"
            )
            self._reply_busy(b"deadline exceeded\n")
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
        if not self.stop_waiting_on_client():
            return
        if urlsplit(self.path).path == "/healthz":
            self._reply(HTTPStatus.OK, b"ok\n")
        else:
            self._reply(HTTPStatus.NOT_FOUND, b"not found\n")

    def _reserve_body(self) -> int | None:
        """The request's Content-Length, reserved in the server's body budget; None
        (the connection then closes) after a 4xx or 503 answer, before any of the
        body is read."""
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
        limit = self.server.limits.max_body_bytes
        if length > limit:
            self._reply(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"body over {limit} bytes\n".encode(),
                close=True,
                linger=True,
            )
            return None
        if not self.server.body_budget.take(length):
            self._reply_busy(b"too many request bodies at once\n")
            return None
        return length

    def _reply_busy(self, body: bytes) -> None:
        self._reply(
            HTTPStatus.SERVICE_UNAVAILABLE,
            body,
            close=True,
            linger=True,
            retry_after=self.server.limits.retry_after_seconds,
        )

    def _reply(
        self,
        status: HTTPStatus,
        body: bytes,
        *,
        content_type: str = "text/plain; charset=utf-8",
        close: bool = False,
        linger: bool = False,
        retry_after: int | None = None,
    ) -> None:
        """Answer; ``linger`` when the request was not read to its end (implies close)."""
        # A client that reads no answers blocks our write at most this long.
        self.connection.settimeout(self.server.limits.request_deadline)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        if close or linger:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)
        if linger:
            self.wfile.flush()
            _linger_close(self.connection)

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

    ``POST /<HANDLER_ID>`` (and ``/<POLICY_HANDLER_ID>`` with a ``policy_answer``) with
    an AdmissionReview answers 200 with one (a refusal is an answer too); a body that
    is no AdmissionReview gets 400, a failure of the handler 500 (``failurePolicy``
    then decides: the identity webhook's Fail refuses the pod, the policy webhook's
    Ignore admits the object), other paths 404, ``GET /healthz`` 200. A daemon thread
    per connection, at most ``limits.max_connections`` of them (the next gets 503,
    see ``ServerLimits``); the API server reuses connections (HTTP/1.1 keep-alive).
    Nothing is bound until ``start()``.
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
        limits: ServerLimits | None = None,
        policy_answer: Callable[[Any], dict[str, Any]] | None = None,
        pin: Pin | None = None,
    ) -> None:
        self.metrics = metrics
        self.policy_answer = policy_answer
        self.pin = pin
        self.limits = limits or ServerLimits()
        self.request_queue_size = self.limits.listen_backlog
        self.context = _tls_context(files)
        self.draining = threading.Event()
        self.body_budget = _ByteBudget(self.limits.max_body_bytes_in_flight)
        self.missed_deadline = _RareWarning(_WARN_EVERY_SECONDS)
        self.turned_away = _RareWarning(_WARN_EVERY_SECONDS)
        self._workers = threading.BoundedSemaphore(self.limits.max_connections)
        self._waiting = threading.BoundedSemaphore(max(1, self.limits.max_waiting))
        # Connections whose worker waits for the client (the next request, or the
        # rest of one), longest waiting first.
        self._waiting_on_client: dict[int, socket.socket] = {}
        self._waiting_on_client_lock = threading.Lock()
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

    def handler_for(self, path: str) -> Callable[[Any], dict[str, Any]] | None:
        """The decision a request path routes to: the identity webhook's, the policy
        webhook's (when given), else None (404)."""
        if path == f"/{HANDLER_ID}":
            return self.answer
        if path == f"/{POLICY_HANDLER_ID}":
            return self.policy_answer
        return None

    def answer(self, review: Any) -> dict[str, Any]:
        if self.metrics is None:
            return admission_response(review, pin=self.pin)
        return timed_admission_response(review, self.metrics, self.pin)

    def server_bind(self) -> None:
        # Not HTTPServer.server_bind: its socket.getfqdn() may wait on reverse DNS.
        if self._dual_stack:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = self.port

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, client = self.socket.accept()
        sock.settimeout(self.limits.handshake_timeout)
        return self.context.wrap_socket(
            sock, server_side=True, do_handshake_on_connect=False
        ), client

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection on a thread of its own if a worker is free; else hand
        it to a waiting thread (the accept loop itself never waits)."""
        if not self._workers.acquire(blocking=False):
            self._wait_for_a_worker(request, client_address)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._workers.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._workers.release()

    def waits_on_client(self, key: int, connection: socket.socket) -> None:
        """From now the connection's worker waits for its client: for a request (idle
        keep-alive), or for the rest of one. Such a connection may be closed to
        give its worker to a new connection, longest waiting first."""
        with self._waiting_on_client_lock:
            self._waiting_on_client.pop(key, None)
            self._waiting_on_client[key] = connection

    def stops_waiting(self, key: int) -> bool:
        """False when the connection was closed for a new one meanwhile."""
        with self._waiting_on_client_lock:
            return self._waiting_on_client.pop(key, None) is not None

    def _close_longest_waiting(self) -> bool:
        with self._waiting_on_client_lock:
            if not self._waiting_on_client:
                return False
            connection = self._waiting_on_client.pop(next(iter(self._waiting_on_client)))
        # The TCP socket under the TLS: its worker, waiting in a read, sees the end of
        # the stream and returns to the pool.
        with contextlib.suppress(OSError):
            socket.socket.shutdown(connection, socket.SHUT_RDWR)
        return True

    def _wait_for_a_worker(self, request: Any, client_address: Any) -> None:
        if self.limits.max_waiting == 0 or not self._waiting.acquire(blocking=False):
            self.turned_away.warn(
                f"closed a connection from {client_address[0]} unanswered: all "
                f"{self.limits.max_connections} workers busy and "
                f"{self.limits.max_waiting} connections waiting"
            )
            self.shutdown_request(request)
            return
        try:
            threading.Thread(
                target=self._serve_when_a_worker_is_free,
                args=(request, client_address),
                name="identity-webhook-waiting",
                daemon=True,
            ).start()
        except BaseException:
            self._waiting.release()
            self.shutdown_request(request)
            raise

    def _serve_when_a_worker_is_free(self, request: ssl.SSLSocket, client_address: Any) -> None:
        """Wait up to ``worker_wait`` for a worker, closing a connection that waits on
        its client (checked again every ``_WAITING_POLL_SECONDS``: one may start to
        wait meanwhile); then serve, or answer 503."""
        end = time.monotonic() + self.limits.worker_wait
        try:
            while True:
                if self._close_longest_waiting():
                    log.debug("identity webhook: closed a waiting connection for a new one")
                remaining = end - time.monotonic()
                if self._workers.acquire(timeout=max(0.0, min(remaining, _WAITING_POLL_SECONDS))):
                    break
                if remaining <= 0:
                    self.turned_away.warn(
                        f"answered 503 to a connection from {client_address[0]}: all "
                        f"{self.limits.max_connections} workers busy for "
                        f"{self.limits.worker_wait:g} s"
                    )
                    self._answer_busy(request)
                    return
        finally:
            self._waiting.release()
        self.process_request_thread(request, client_address)

    def _answer_busy(self, request: ssl.SSLSocket) -> None:
        """503 with Retry-After after the handshake and the request's first bytes (an
        answer before the request confuses HTTP clients), then close; all of it
        within the handshake timeout."""
        end = time.monotonic() + self.limits.handshake_timeout
        body = b"all workers busy\n"
        answer = (
            f"HTTP/1.1 503 Service Unavailable\r\n"
            f"Server: {c.IDENTITY_WEBHOOK}\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"Retry-After: {self.limits.retry_after_seconds}\r\n"
            f"Connection: close\r\n\r\n"
        ).encode() + body
        try:
            request.do_handshake()
            request.settimeout(max(0.001, end - time.monotonic()))
            if request.recv(64 * 1024):
                request.settimeout(max(0.001, end - time.monotonic()))
                request.sendall(answer)
                _linger_close(request)
        except (OSError, ValueError) as err:
            log.debug("identity webhook: a turned-away connection ended: %s", err)
        finally:
            self.shutdown_request(request)

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
    limits: ServerLimits | None = None,
    policy_answer: Callable[[Any], dict[str, Any]] | None = None,
    pin: Pin | None = None,
) -> IdentityWebhookServer:
    """Serve the identity webhook from its own threads; the returned server is started.

    ``addr`` None listens on all interfaces; ``limits`` None is ``ServerLimits()``;
    ``policy_answer`` (the policy webhook's decision) is served on its own path, with
    the same limits, when given.
    Raises OSError when the port cannot be bound: with ``failurePolicy: Fail``, no
    webhook means no TPU worker pods.
    """
    server = IdentityWebhookServer(
        files,
        port=port,
        addr=addr,
        metrics=metrics,
        limits=limits,
        policy_answer=policy_answer,
        pin=pin,
    )
    bound = server.start()
    log.info("TPU identity webhook listening on %s:%d (path /%s)", addr or "*", bound, HANDLER_ID)
    return server
