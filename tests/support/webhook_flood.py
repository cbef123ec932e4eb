"""Flood the identity webhook's server with hostile clients and time valid reviews.

Starts ``IdentityWebhookServer`` in this process (loopback, a throwaway CA, the
production ``ServerLimits`` unless told otherwise), then runs the valid clients
twice: alone, and while hostile clients attack (idle TLS connections, requests
sent half and then stalled, TCP connections that never start TLS, bodies far
over the cap). A valid client behaves as
the API server plus KubeRay do: keep-alive connections, and a review refused (503
or a closed connection) is sent again until answered. Prints p50/p99 latency of a
review (first send to answer, retries 50 ms apart included), the retries, the server's peak
thread count and the process's peak RSS (clients included: they share the process).

    PYTHONPATH=operator:hack/tpusim python -m tests.support.webhook_flood --help

A measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import http.client
import json
import resource
import socket
import ssl
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.unit.test_webhook import _review, _worker
from tpuslice.webhook import admission
from tpuslice.webhook import certificates as webhookcerts
from tpuslice.webhook.server import IdentityWebhookServer, ServerLimits, serve_identity_webhook

PATH = f"/{admission.HANDLER_ID}?timeout=5s"


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    retries: int = 0
    unanswered: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _valid_client(
    port: int, context: ssl.SSLContext, reviews: int, name: str, tally: Tally
) -> None:
    body = json.dumps(_review(_worker(), name)).encode()
    conn: http.client.HTTPSConnection | None = None
    for _ in range(reviews):
        started = time.monotonic()
        retries = 0
        answered = False
        while not answered and time.monotonic() - started < 30:
            if conn is None:
                conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=15)
            try:
                conn.request("POST", PATH, body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                answered = response.status == 200
                if response.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = None
            if not answered:
                retries += 1
                time.sleep(0.05)  # a pause before sending again, as a refused pod's retry has
        with tally.lock:
            tally.retries += retries
            if answered:
                tally.latencies.append(time.monotonic() - started)
            else:
                tally.unanswered += 1
    if conn is not None:
        conn.close()


def _tls(port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=15)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def _wait_closed(sock: socket.socket, stop: threading.Event) -> None:
    sock.settimeout(0.5)
    while not stop.is_set():
        try:
            if not sock.recv(65536):
                return
        except TimeoutError:
            continue
        except OSError:
            return


def _stalled(port: int, context: ssl.SSLContext, stop: threading.Event) -> None:
    """Half a request, then nothing, again and again."""
    while not stop.is_set():
        try:
            with _tls(port, context) as sock:
                sock.sendall(f"POST {PATH} HTTP/1.1\r\nContent-Length: 9000\r\n\r\n{{".encode())
                _wait_closed(sock, stop)
        except OSError:
            pass


def _silent(port: int, stop: threading.Event) -> None:
    """A TCP connection that never starts its TLS handshake, again and again."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
                _wait_closed(sock, stop)
        except OSError:
            pass


def _huge(port: int, context: ssl.SSLContext, stop: threading.Event) -> None:
    """A body of 100 MiB, sent as fast as the server takes it."""
    chunk = b"x" * 65536
    while not stop.is_set():
        try:
            with _tls(port, context) as sock:
                head = f"POST {PATH} HTTP/1.1\r\nContent-Length: {100 << 20}\r\n\r\n"
                sock.sendall(head.encode())
                for _ in range(1600):
                    sock.sendall(chunk)
        except OSError:
            pass


def _idle(port: int, context: ssl.SSLContext, count: int, stop: threading.Event) -> None:
    """``count`` TLS connections that never send a request, reopened when closed."""
    open_: list[ssl.SSLSocket] = []
    while not stop.is_set():
        while len(open_) < count and not stop.is_set():
            try:
                sock = _tls(port, context)
                sock.setblocking(False)
                open_.append(sock)
            except OSError:
                break
        still: list[ssl.SSLSocket] = []
        for sock in open_:
            try:
                closed = sock.recv(1) == b""
            except (ssl.SSLWantReadError, BlockingIOError):
                closed = False
            except OSError:
                closed = True
            if closed:
                sock.close()
            else:
                still.append(sock)
        open_ = still
        stop.wait(0.05)
    for sock in open_:
        sock.close()


def _run_valid(port: int, context: ssl.SSLContext, clients: int, reviews: int) -> Tally:
    tally = Tally()
    threads = [
        threading.Thread(
            target=_valid_client, args=(port, context, reviews, f"v{i}", tally), name="valid"
        )
        for i in range(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return tally


def _report(label: str, tally: Tally) -> None:
    lat = sorted(tally.latencies)
    if not lat:
        print(f"{label}: no review answered ({tally.unanswered} unanswered)")
        return
    p50 = statistics.median(lat) * 1000
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
    print(
        f"{label}: {len(lat)} reviews answered, {tally.unanswered} unanswered, "
        f"{tally.retries} retries; latency p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
        f"max {lat[-1] * 1000:.1f} ms"
    )


def _server_threads() -> int:
    """The server's threads: its workers (the stdlib's "Thread-N" names), the waiting
    ones and the accept loop; the clients' threads here are all named."""
    names = ("Thread-", "identity-webhook")
    return sum(1 for t in threading.enumerate() if t.name.startswith(names))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--valid-clients", type=int, default=8)
    parser.add_argument("--reviews", type=int, default=25, help="per valid client")
    parser.add_argument("--idle", type=int, default=100, help="idle TLS connections held")
    parser.add_argument("--stalled", type=int, default=40, help="clients sending half requests")
    parser.add_argument("--silent", type=int, default=40, help="TCP clients that never start TLS")
    parser.add_argument("--huge", type=int, default=2, help="clients sending 100 MiB bodies")
    parser.add_argument("--max-connections", type=int, default=admission.MAX_CONNECTIONS)
    parser.add_argument(
        "--request-deadline", type=float, default=admission.REQUEST_DEADLINE_SECONDS
    )
    args = parser.parse_args(argv)
    for name in ("valid_clients", "reviews", "idle", "stalled", "silent", "huge"):
        if not 0 <= getattr(args, name) <= 2000:
            parser.error(f"--{name.replace('_', '-')}: must be from 0 to 2000")

    with tempfile.TemporaryDirectory() as tmp:
        files = webhookcerts.write_certificates(
            webhookcerts.build_certificates(["127.0.0.1"]), Path(tmp)
        )
        context = ssl.create_default_context(cadata=files.ca_bundle().decode())
        limits = ServerLimits(
            max_connections=args.max_connections, request_deadline=args.request_deadline
        )
        server: IdentityWebhookServer = serve_identity_webhook(
            files, port=0, addr="127.0.0.1", limits=limits
        )
        port = server.port
        print(f"limits: {limits}")
        rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            _report("alone", _run_valid(port, context, args.valid_clients, args.reviews))

            stop = threading.Event()
            hostile: list[threading.Thread] = [
                threading.Thread(
                    target=_idle, args=(port, context, args.idle, stop), daemon=True, name="idle"
                )
            ]
            hostile += [
                threading.Thread(
                    target=_stalled, args=(port, context, stop), daemon=True, name="stalled"
                )
                for _ in range(args.stalled)
            ]
            hostile += [
                threading.Thread(target=_huge, args=(port, context, stop), daemon=True, name="huge")
                for _ in range(args.huge)
            ]
            for thread in hostile:
                thread.start()
            peak = [0]

            def sample() -> None:
                while not stop.wait(0.1):
                    peak[0] = max(peak[0], _server_threads())

            sampler = threading.Thread(target=sample, daemon=True, name="sampler")
            sampler.start()
            stop.wait(2.0)  # let the attack fill the workers first
            flood: Any = _run_valid(port, context, args.valid_clients, args.reviews)
            stop.set()
            for thread in hostile:
                thread.join(20)
            _report(
                f"with {args.idle} idle, {args.stalled} stalled, {args.silent} silent, "
                f"{args.huge} huge-body clients",
                flood,
            )
            print(
                f"server threads at most: {peak[0]} (limit {limits.max_connections} "
                f"workers + {limits.max_waiting} waiting + the accept loop)"
            )
        finally:
            server.stop()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(f"peak RSS: {rss / 1024:.0f} MiB (at start of the run {rss_start / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()
