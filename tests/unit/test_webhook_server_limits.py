"""The identity webhook's server against clients that try to take it down: bodies
too large, more connections than workers, requests sent half or byte by byte,
idle connections, a decision too slow, and all of it while valid reviews arrive.

Each test starts the real server over TLS on a loopback port with small limits
(tenths of a second), and waits on sockets with timeouts, never on sleeps.
"""

from __future__ import annotations

import http.client
import json
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_webhook import _review, _worker
from tpuslice.webhook import admission as webhook
from tpuslice.webhook import certificates as webhookcerts
from tpuslice.webhook import server as webhook_server
from tpuslice.webhook.server import IdentityWebhookServer, ServerLimits

PATH = f"/{webhook.HANDLER_ID}?timeout=5s"
Serve = Callable[..., IdentityWebhookServer]


@pytest.fixture
def tls(tmp_path: Path) -> tuple[webhookcerts.CertFiles, ssl.SSLContext]:
    files = webhookcerts.write_certificates(
        webhookcerts.build_certificates(["127.0.0.1"]), tmp_path
    )
    return files, ssl.create_default_context(cadata=files.ca_bundle().decode())


@pytest.fixture
def serve(tls: tuple[webhookcerts.CertFiles, ssl.SSLContext]) -> Iterator[Serve]:
    """Start a server with the given ``ServerLimits`` fields; stopped after the test."""
    started: list[IdentityWebhookServer] = []

    def start(**limits: Any) -> IdentityWebhookServer:
        server = webhook_server.serve_identity_webhook(
            tls[0], port=0, addr="127.0.0.1", limits=ServerLimits(**limits)
        )
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _connect(server: IdentityWebhookServer, context: ssl.SSLContext) -> ssl.SSLSocket:
    """A TLS connection whose handshake is done: the server holds a worker for it."""
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def _review_bytes(uid: str, *, pad_to: int = 0) -> bytes:
    body = json.dumps(_review(_worker(), uid)).encode()
    return body + b" " * max(0, pad_to - len(body))  # JSON allows trailing blanks


def _head(length: int, *, extra: str = "") -> bytes:
    return (
        f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n"
    ).encode()


def _response(sock: ssl.SSLSocket) -> tuple[http.client.HTTPResponse, bytes]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response, response.read()


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """True once the server closed the connection (end of stream or a reset)."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except (ConnectionResetError, ssl.SSLError):
        pass
    return True


def _admit(server: IdentityWebhookServer, context: ssl.SSLContext, uid: str) -> int:
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    try:
        conn.request("POST", PATH, _review_bytes(uid), {"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    if response.status == 200:
        assert json.loads(raw)["response"]["uid"] == uid
    return response.status


def _admit_until_answered(
    server: IdentityWebhookServer, context: ssl.SSLContext, uid: str, *, within: float
) -> int:
    """As KubeRay does after a refusal: try again until answered 200 (or give up)."""
    end = time.monotonic() + within
    tries = 0
    while time.monotonic() < end:
        tries += 1
        try:
            if _admit(server, context, uid) == 200:
                return tries
        except (OSError, http.client.HTTPException):
            pass  # closed without an answer: all workers and the 503 lane were busy
    raise AssertionError(f"review {uid} not answered in {within} s ({tries} tries)")


def test_body_cap_is_the_api_servers_own_request_limit() -> None:
    assert webhook.MAX_BODY_BYTES == 3 * 1024 * 1024
    assert ServerLimits().max_body_bytes == webhook.MAX_BODY_BYTES


def test_an_oversized_body_is_refused_from_its_headers(
    serve: Serve, tls: tuple[webhookcerts.CertFiles, ssl.SSLContext]
) -> None:
    server = serve()
    with _connect(server, tls[1]) as sock:
        # 64 KiB of the announced 3 MiB + 1: the answer must come without the rest.
        sock.sendall(_head(webhook.MAX_BODY_BYTES + 1) + b"x" * 64 * 1024)
        response, raw = _response(sock)
        assert response.status == 413
        assert response.getheader("Connection") == "close"
        assert raw == f"body over {webhook.MAX_BODY_BYTES} bytes\n".encode()
        assert _closed_by_server(sock, within=5)


def test_a_connection_beyond_the_workers_gets_503_at_once_while_they_keep_working(
    serve: Serve,
    tls: tuple[webhookcerts.CertFiles, ssl.SSLContext],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = serve(max_connections=2, worker_wait=0.2, request_deadline=30.0)
    context = tls[1]
    decided = server.answer
    both_deciding = threading.Barrier(3)
    release = threading.Event()

    def slow_answer(review: Any) -> dict[str, Any]:
        both_deciding.wait(5)
        release.wait(10)  # both workers busy deciding, not waiting on a client
        return decided(review)

    monkeypatch.setattr(server, "answer", slow_answer)
    statuses: dict[str, int] = {}

    def admit(uid: str) -> None:
        statuses[uid] = _admit(server, context, uid)

    slow = [threading.Thread(target=admit, args=(f"slow{i}",)) for i in range(2)]
    for thread in slow:
        thread.start()
    try:
        both_deciding.wait(5)
        started = time.monotonic()
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
        try:
            conn.request("POST", PATH, _review_bytes("extra"))
            extra = conn.getresponse()
            assert (extra.status, extra.read()) == (503, b"all workers busy\n")
            assert extra.getheader("Retry-After") == "1"
            assert extra.getheader("Connection") == "close"
        finally:
            conn.close()
        # Not queued behind the 10 s the slow ones may take.
        assert time.monotonic() - started < 5
    finally:
        release.set()
        for thread in slow:
            thread.join(10)
    assert statuses == {"slow0": 200, "slow1": 200}


def test_a_stalled_request_gives_its_worker_to_a_new_connection(
    serve: Serve, tls: tuple[webhookcerts.CertFiles, ssl.SSLContext]
) -> None:
    """A client that sends half a request cannot keep a worker from the API server's
    next call: the connection that has waited longest for its client is closed."""
    server = serve(max_connections=2, worker_wait=5.0, request_deadline=30.0)
    stalled = [_connect(server, tls[1]) for _ in range(2)]  # both workers taken
    try:
        for sock in stalled:
            sock.sendall(_head(9000) + b"{")
        assert _admit(server, tls[1], "valid") == 200
        # One of them was closed for it (whichever waited longest: its handler
        # thread may have started reading before the other's or after).
        readable, _, _ = select.select(stalled, [], [], 5)
        assert any(_closed_by_server(sock, within=2) for sock in readable)
    finally:
        for sock in stalled:
            sock.close()


def test_beyond_the_waiting_connections_a_connection_is_closed_unanswered(
    serve: Serve, tls: tuple[webhookcerts.CertFiles, ssl.SSLContext]
) -> None:
    server = serve(max_connections=1, max_waiting=0, request_deadline=30.0)
    with _connect(server, tls[1]) as held:
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        with pytest.raises((ssl.SSLError, OSError)):
            tls[1].wrap_socket(raw, server_hostname="127.0.0.1").recv(1)
        raw.close()
        held.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        response, body = _response(held)
        assert (response.status, body) == (200, b"ok\n")


def test_an_idle_connection_gives_its_worker_to_a_new_one(
    serve: Serve, tls: tuple[webhookcerts.CertFiles, ssl.SSLContext]
) -> None:
    """Idle keep-alive connections (the API server's, or a tenant's) never shut out a call."""
    server = serve(max_connections=1, idle_timeout=30.0, worker_wait=5.0)
    with _connect(server, tls[1]) as idle:
        body = _review_bytes("first")
        idle.sendall(_head(len(body)) + body)
        response, _ = _response(idle)
        assert response.status == 200  # and now idle, holding the only worker
        assert _admit(server, tls[1], "second") == 200
        assert _closed_by_server(idle, within=5)


def test_a_client_that_never_starts_tls_gives_its_worker_to_a_new_connection(
    serve: Serve, tls: tuple[webhookcerts.CertFiles, ssl.SSLContext]
) -> None:
    server = serve(max_connections=1, worker_wait=5.0, handshake_timeout=30.0)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as silent:
        assert _admit(server, tls[1], "valid") == 200  # not after 30 s, nor a 503
        assert _closed_by_server(silent, within=5)


def test_a_half_sent_request_is_dropped_at_the_deadline_and_frees_its_worker(
    serve: Serve, tls: tuple[webhookcerts.CertFiles, ssl.SSLContext]
) -> None:
    server = serve(max_connections=1, request_deadline=0.2, idle_timeout=30.0)
    body = _review_bytes("stalled")
    with _connect(server, tls[1]) as sock:
        started = time.monotonic()
        sock.sendall(_head(len(body)) + body[:10])
        assert _closed_by_server(sock, within=5)
        assert time.monotonic() - started < 3  # the deadline, not the idle timeout
    assert _admit_until_answered(server, tls[1], "next", within=10) >= 1


def test_a_request_trickled_byte_by_byte_is_dropped_at_the_deadline(
    serve: Serve, tls: tuple[webhookcerts.CertFiles, ssl.SSLContext]
) -> None:
    """Each byte arrives well within the idle timeout; the request as a whole does not."""
    server = serve(request_deadline=0.3, idle_timeout=30.0)
    head = _head(10, extra="X-Padding: " + "p" * 2000 + "\r\n")
    sent = 0
    with _connect(server, tls[1]) as sock:
        started = time.monotonic()
        closed = False
        while sent < len(head) and not closed:
            try:
                sock.sendall(head[sent : sent + 1])
                sent += 1
                closed = _closed_by_server(sock, within=0.05)  # also the pace
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                closed = True
        assert closed and sent < len(head)
        assert time.monotonic() - started < 5


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(
    serve: Serve, tls: tuple[webhookcerts.CertFiles, ssl.SSLContext]
) -> None:
    server = serve(idle_timeout=0.2, request_deadline=30.0)
    with _connect(server, tls[1]) as sock:
        body = _review_bytes("u1")
        sock.sendall(_head(len(body)) + body)
        response, _ = _response(sock)
        assert response.status == 200 and response.getheader("Connection") is None
        started = time.monotonic()
        assert _closed_by_server(sock, within=5)
        assert time.monotonic() - started < 3


def test_a_decision_past_the_deadline_is_answered_503_and_logged_once(
    serve: Serve,
    tls: tuple[webhookcerts.CertFiles, ssl.SSLContext],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = serve(request_deadline=0.2)
    decided = server.answer

    def slow_answer(review: Any) -> dict[str, Any]:
        threading.Event().wait(0.5)  # a decision stuck past the deadline
        return decided(review)

    monkeypatch.setattr(server, "answer", slow_answer)
    caplog.set_level(logging.WARNING, logger=webhook_server.__name__)
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=tls[1], timeout=10)
    try:
        conn.request("POST", PATH, _review_bytes("late"))
        response = conn.getresponse()
        assert (response.status, response.read()) == (503, b"deadline exceeded\n")
        assert response.getheader("Retry-After") == "1"
    finally:
        conn.close()
    lines = [r.getMessage() for r in caplog.records if r.name == webhook_server.__name__]
    assert len(lines) == 1 and "not decided within 0.2 s" in lines[0]


def test_request_bodies_in_flight_share_one_budget(
    serve: Serve,
    tls: tuple[webhookcerts.CertFiles, ssl.SSLContext],
) -> None:
    server = serve(
        max_body_bytes=64 * 1024, max_body_bytes_in_flight=100 * 1024, request_deadline=30.0
    )
    reserved = threading.Event()
    budget = server.body_budget
    take = budget.take

    def take_and_tell(n: int) -> bool:
        taken = take(n)
        if taken:
            reserved.set()
        return taken

    budget.take = take_and_tell  # type: ignore[method-assign]
    body = _review_bytes("first", pad_to=60 * 1024)
    with _connect(server, tls[1]) as first, _connect(server, tls[1]) as second:
        first.sendall(_head(len(body)) + body[:1000])
        assert reserved.wait(5)
        second.sendall(_head(len(body)))
        response, raw = _response(second)
        assert (response.status, raw) == (503, b"too many request bodies at once\n")
        assert response.getheader("Retry-After") == "1"

        first.sendall(body[1000:])
        response, raw = _response(first)
        assert response.status == 200 and json.loads(raw)["response"]["uid"] == "first"


def test_valid_reviews_are_answered_during_a_hostile_flood(
    serve: Serve, tls: tuple[webhookcerts.CertFiles, ssl.SSLContext]
) -> None:
    """Six hostile clients against four workers: stalled requests, bodies over the
    cap, connections that never start TLS. Valid reviews, retried after a 503 as
    KubeRay retries a refused pod, are all answered."""
    server = serve(
        max_connections=4,
        max_waiting=2,
        handshake_timeout=0.3,
        idle_timeout=0.3,
        request_deadline=0.3,
    )
    context = tls[1]
    stop = threading.Event()
    attacks = [0]

    def hostile(kind: int) -> None:
        while not stop.is_set():
            try:
                raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
                if kind == 0:  # no TLS at all: held until the handshake timeout
                    _closed_by_server(raw, within=5)
                    raw.close()
                else:
                    with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                        if kind == 1:  # half a request, then nothing
                            sock.sendall(_head(5000) + b"{")
                        else:  # a body far over the cap
                            sock.sendall(_head(webhook.MAX_BODY_BYTES * 4) + b"x" * 32 * 1024)
                        _closed_by_server(sock, within=5)
                attacks[0] += 1
            except (OSError, ssl.SSLError):
                attacks[0] += 1

    threads = [threading.Thread(target=hostile, args=(i % 3,), daemon=True) for i in range(6)]
    for thread in threads:
        thread.start()
    try:
        tries = [_admit_until_answered(server, context, f"v{i}", within=20) for i in range(8)]
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert len(tries) == 8
    assert attacks[0] > 0
    assert not any(thread.is_alive() for thread in threads)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_connections", 0),
        ("max_connections", 2.5),
        ("max_waiting", -1),
        ("worker_wait", "1"),
        ("listen_backlog", True),
        ("request_deadline", float("nan")),
        ("idle_timeout", 0),
        ("handshake_timeout", float("inf")),
        ("max_body_bytes_in_flight", 1024),
    ],
)
def test_limits_out_of_bounds_are_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"ServerLimits.{field}: must be"):
        ServerLimits(**{field: value})


def test_the_listen_backlog_is_the_limits(serve: Serve) -> None:
    assert serve().request_queue_size == webhook.LISTEN_BACKLOG == 128
    assert serve(listen_backlog=7).request_queue_size == 7
