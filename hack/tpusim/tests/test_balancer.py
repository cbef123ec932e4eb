"""The loopback balancer the e2e tier puts in front of several webhook servers: new
connections go to ready backends only, round robin, and stay with their backend."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tpusim.balancer import Backend, Balancer


class Named(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, name: str) -> None:
        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                while data := self.request.recv(100):
                    self.request.sendall(name.encode() + b":" + data)

        super().__init__(("127.0.0.1", 0), Handler)
        self.ready = True
        outer = self

        class Ready(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(HTTPStatus.OK if outer.ready else HTTPStatus.SERVICE_UNAVAILABLE)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.probe = ThreadingHTTPServer(("127.0.0.1", 0), Ready)
        for server in (self, self.probe):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    @property
    def backend(self) -> Backend:
        return Backend(self.server_address[1], f"http://127.0.0.1:{self.probe.server_address[1]}/")

    def close(self) -> None:
        for server in (self, self.probe):
            server.shutdown()
            server.server_close()


@pytest.fixture
def pair() -> Iterator[tuple[Named, Named, Balancer]]:
    a, b = Named("a"), Named("b")
    balancer = Balancer([a.backend, b.backend], interval_s=0.05)
    balancer.start()
    yield a, b, balancer
    balancer.stop()
    a.close()
    b.close()


def ask(port: int, conn: socket.socket | None = None) -> tuple[str, socket.socket]:
    conn = conn or socket.create_connection(("127.0.0.1", port), timeout=2)
    conn.sendall(b"hi")
    return conn.recv(100).decode().split(":")[0], conn


def test_new_connections_spread_over_ready_backends_and_stay_put(
    pair: tuple[Named, Named, Balancer],
) -> None:
    _, _, balancer = pair
    answers = set()
    for _ in range(4):
        name, conn = ask(balancer.port)
        again, _ = ask(balancer.port, conn)
        assert again == name  # a connection stays with its backend
        answers.add(name)
        conn.close()
    assert answers == {"a", "b"}


def test_a_backend_that_is_not_ready_gets_no_new_connection(
    pair: tuple[Named, Named, Balancer],
) -> None:
    a, b, balancer = pair
    kept, conn = ask(balancer.port)
    (a if kept == "a" else b).ready = False  # the one our connection uses
    time.sleep(0.3)
    assert {ask(balancer.port)[0] for _ in range(4)} == {"b" if kept == "a" else "a"}
    assert ask(balancer.port, conn)[0] == kept  # open connections go on
    a.ready = b.ready = False
    time.sleep(0.3)
    with socket.create_connection(("127.0.0.1", balancer.port), timeout=2) as refused:
        try:
            refused.sendall(b"hi")
            answer = refused.recv(100)
        except ConnectionResetError:
            answer = b""
        assert answer == b""  # closed: no endpoint
    assert balancer.refused == 1
