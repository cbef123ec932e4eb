"""A TCP balancer on loopback: what the chart's webhook Service is to the API server, for
operators that run as local processes (the e2e tier has no in-cluster Service).

The webhook configuration names one URL, the balancer's; behind it, as kube-proxy
behind a ClusterIP, each new connection goes to one of the *ready* backends,
round robin, and stays with it until either side closes it (conntrack keeps an
established flow on its endpoint). Readiness is each backend's ``/readyz``,
polled every ``interval_s``, as the endpoints controller follows pod readiness.
A connection to a backend that refuses it is closed, not retried elsewhere:
kube-proxy does not retry either. So a test through it sees what a Service
would give: a replica that stops must first turn not ready and let its open
connections finish, or admission calls fail.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Backend", "Balancer"]


@dataclass
class Backend:
    """One endpoint: where to connect, and where its readiness is read."""

    port: int
    ready_url: str
    ready: bool = False
    connections: int = 0  # connections sent here so far


@dataclass
class Balancer:
    backends: Sequence[Backend]
    port: int = 0  # 0: pick a free one
    interval_s: float = 0.2
    refused: int = 0  # connections closed because no backend was ready or it refused
    _stop: threading.Event = field(default_factory=threading.Event)
    _listener: socket.socket | None = None
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> int:
        """Listen on 127.0.0.1 and start routing; returns the port."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        listener.settimeout(0.2)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._poll()
        for target, name in ((self._poll_forever, "balancer-ready"), (self._accept, "balancer")):
            threading.Thread(target=target, name=name, daemon=True).start()
        return self.port

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.close()

    # ------------------------------------------------------------ readiness
    def _poll(self) -> None:
        for backend in self.backends:
            try:
                with urllib.request.urlopen(backend.ready_url, timeout=1) as response:
                    backend.ready = response.status == 200
            except OSError:
                backend.ready = False

    def _poll_forever(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll()

    def _pick(self) -> Backend | None:
        with self._lock:
            ready = [b for b in self.backends if b.ready]
            if not ready:
                return None
            chosen = ready[self._next % len(ready)]  # the first connection: the first backend
            self._next += 1
            chosen.connections += 1
            return chosen

    # ------------------------------------------------------------ traffic
    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        backend = self._pick()
        upstream = None
        if backend is not None:
            try:
                upstream = socket.create_connection(("127.0.0.1", backend.port), timeout=2)
            except OSError:
                upstream = None
        if upstream is None:
            self.refused += 1
            client.close()
            return
        upstream.settimeout(None)
        ended = [0]
        lock = threading.Lock()

        def pump(src: socket.socket, dst: socket.socket) -> None:
            """One direction; the second to end closes both sockets."""
            try:
                while chunk := src.recv(65536):
                    dst.sendall(chunk)
            except OSError:
                pass
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            with lock:
                ended[0] += 1
                last = ended[0] == 2
            if last:
                src.close()
                dst.close()

        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
        pump(client, upstream)
