"""Liveness and readiness: what the kubelet's probes ask, answered from what we saw.

Liveness (``/healthz``) asks: is this process still working? A task on the
event loop beats once a second; a loop that has not beaten for ``loop_stall_s``
is hung, and a watch that is not failing yet has delivered nothing (no event,
no bookmark, not the end of its ``timeoutSeconds``) for ``watch_stuck_s`` is
stuck: a restart is the cure for both. It does not depend on the API server
being up: a failing watch is readiness's business, so an API outage does not
restart every operator replica at once.

Readiness (``/readyz``) asks whether this replica can do its part, and the
chart's Service sends webhook calls only to ready replicas. Every replica: the
loop is turning, no watch (nor the Lease, for a standby) has been failing for
longer than ``watch_grace_s`` (an unreachable API server, a revoked token),
the identity webhook, when on, is listening, and the process is not shutting
down. The leader (or the only instance, without leader election) also:
start-up finished (every followed kind listed once through the API server with
our credentials). A standby is ready without that: it serves the webhook, and
a rollout waits for it. kopf's own ``/healthz`` answered 200 while its client
could not reach the API server; that is the mistake this module exists to
avoid.

A standby has no kopf event loop yet: its start-up thread, trying for the
Lease every couple of seconds, beats instead. The webhook process (``tpuslice webhook``) has no
event loop and nothing to list: its main thread beats, and it is started once its
server listens.

The state is a few timestamps written from the loop and the watch threads and
read from the probe server's threads, so it is guarded by one lock. The clock
is injected so the verdicts are unit-tested without sleeping.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

__all__ = ["Health", "HealthServer", "Verdict", "serve_health"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    """A probe's answer: ok, and the reasons when not (the probe's response body)."""

    ok: bool
    reasons: tuple[str, ...] = ()

    def text(self) -> str:
        return "ok\n" if self.ok else "".join(f"{r}\n" for r in self.reasons)


class Health:
    """What the probes need to know, recorded by the parts that know it."""

    def __init__(
        self,
        *,
        loop_stall_s: float = 30.0,
        startup_grace_s: float = 300.0,
        watch_grace_s: float = 15.0,
        watch_stuck_s: float = 900.0,
        webhook: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.loop_stall_s = loop_stall_s
        self.startup_grace_s = startup_grace_s
        self.watch_grace_s = watch_grace_s
        self.watch_stuck_s = watch_stuck_s
        self._clock = clock
        self._lock = threading.Lock()
        self._born = clock()
        self._beat: float | None = None
        self._started = False
        self._webhook_expected = webhook
        self._webhook_listening = False
        self._standby = False
        self._stopping = False
        self._failing: dict[str, tuple[float, str]] = {}  # kind -> (since, last error)
        self._delivered: dict[str, float] = {}  # kind -> last answer (list, watch, event)

    # ------------------------------------------------------------ writers
    def beat(self) -> None:
        """The event loop is turning (called by a task on the loop)."""
        with self._lock:
            self._beat = self._clock()

    def started(self) -> None:
        """Start-up finished: every followed kind was listed once."""
        with self._lock:
            self._started = True

    def webhook_listening(self) -> None:
        with self._lock:
            self._webhook_listening = True

    def standby(self, yes: bool = True) -> None:
        """Waiting for the Lease: ready without having started (see the module docstring)."""
        with self._lock:
            self._standby = yes

    def shutting_down(self) -> None:
        """SIGTERM: not ready any more, so no new webhook call is routed here while the
        server drains the calls already on their way."""
        with self._lock:
            self._stopping = True

    def watch_ok(self, kind: str) -> None:
        """A list, a watch request or a watch event (bookmarks too) of ``kind`` came in."""
        with self._lock:
            self._failing.pop(kind, None)
            self._delivered[kind] = self._clock()

    def watch_ages(self) -> dict[str, float]:
        """Seconds since each followed kind last delivered (the metric)."""
        with self._lock:
            now = self._clock()
            return {kind: now - at for kind, at in self._delivered.items()}

    def watch_failed(self, kind: str, error: str) -> None:
        """A list or watch of ``kind`` failed; the first failure of a run is kept."""
        with self._lock:
            since = self._failing.get(kind, (self._clock(), ""))[0]
            self._failing[kind] = (since, error)

    # ------------------------------------------------------------ verdicts
    def liveness(self) -> Verdict:
        with self._lock:
            now = self._clock()
            if self._beat is None:
                if now - self._born <= self.startup_grace_s:
                    return Verdict(True)
                return Verdict(
                    False,
                    (f"the event loop has not started in {now - self._born:.0f}s",),
                )
            age = now - self._beat
            if age > self.loop_stall_s:
                return Verdict(False, (f"the event loop has not turned for {age:.0f}s",))
            # A watch that fails is the API server's trouble (readiness says so); a watch
            # that claims to be open yet has delivered nothing, not even the end of its
            # timeoutSeconds, for this long is stuck in this process: restart it.
            stuck = [
                f"watching {kind} has delivered nothing for {now - at:.0f}s"
                for kind, at in sorted(self._delivered.items())
                if kind not in self._failing and now - at > self.watch_stuck_s
            ]
            return Verdict(not stuck, tuple(stuck))

    def readiness(self) -> Verdict:
        alive = self.liveness()
        with self._lock:
            now = self._clock()
            reasons = list(alive.reasons)
            if self._stopping:
                reasons.append("shutting down")
            if self._beat is None:
                reasons.append("starting: the event loop has not turned yet")
            if not self._started and not self._standby:
                reasons.append("starting: pods, nodes and RayClusters not listed yet")
            if self._webhook_expected and not self._webhook_listening:
                reasons.append("the identity webhook is not listening yet")
            for kind, (since, error) in sorted(self._failing.items()):
                if now - since > self.watch_grace_s:
                    reasons.append(
                        f"watching {kind} has failed for {now - since:.0f}s: {error[:300]}"
                    )
        return Verdict(not reasons, tuple(reasons))


class _Handler(BaseHTTPRequestHandler):
    server: HealthServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/healthz":
            verdict = self.server.health.liveness()
        elif path == "/readyz":
            verdict = self.server.health.readiness()
        else:
            self._reply(HTTPStatus.NOT_FOUND, b"not found\n")
            return
        status = HTTPStatus.OK if verdict.ok else HTTPStatus.SERVICE_UNAVAILABLE
        self._reply(status, verdict.text().encode())

    def _reply(self, status: HTTPStatus, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Probes every few seconds are not worth a log line each."""


class HealthServer(ThreadingHTTPServer):
    """``/healthz`` and ``/readyz`` over plain HTTP, on threads of its own, so a busy
    or hung event loop cannot make the probe itself time out."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], health: Health) -> None:
        super().__init__(address, _Handler)
        self.health = health

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def serve_health(health: Health, port: int, addr: str = "0.0.0.0") -> HealthServer:
    """Start the probe server on a daemon thread (port 0 picks a free one)."""
    server = HealthServer((addr, port), health)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    log.info("serving /healthz and /readyz on %s:%d", addr, server.server_address[1])
    return server
