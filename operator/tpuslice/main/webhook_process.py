"""``tpuslice webhook``: the admission webhooks in a process of their own.

Why apart from ``tpuslice run``: KubeRay creates a RayCluster's pods one request
at a time, and every TPU worker's create waits for the identity webhook. Served
from threads of the operator process, the webhook shares one GIL with kopf's loop
and the passes a burst of pods sets off, so the API server waited on it several
times longer than the handler took (docs/performance.md, "The webhook in a
process of its own"). Here nothing else runs: no kopf (never imported), no Lease,
no pass; an admission flood can cost this process its memory limit, never the
leader's.

In order: logging; ``/metrics`` (this process's own registry: the webhook's
latency and its API requests); ``/healthz`` + ``/readyz``; one ``Kube``; the read
caches the webhooks answer from (``serving.ReadCaches``); the server, its
certificates and its configurations (``serving.start_identity_webhook``, the code
``tpuslice run`` uses when it serves them itself). The main thread then beats
for the liveness probe until SIGTERM; then it turns not ready, drains (each answer
closes its connection) for ``shutdown_drain_seconds`` so the Service stops sending
calls here before the server stops.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType

from tpuslice.runtime.config import OperatorConfig
from tpuslice.runtime.health import Health, serve_health
from tpuslice.runtime.kube import Kube
from tpuslice.runtime.metrics import Metrics, serve
from tpuslice.webhook.serving import ReadCaches, start_identity_webhook

__all__ = ["API_THREADS", "BEAT_SECONDS", "run_webhook", "stop_on_signals"]

log = logging.getLogger(__name__)

#: Requests this process sends are few (the certificates' Secret, the configurations,
#: the policy cache's reads); the webhook's own threads send them.
API_THREADS = 4
#: How often the main thread tells the liveness probe it turns.
BEAT_SECONDS = 1.0


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (the main thread owns them)."""
    stopping = threading.Event()

    def handler(signum: int, _: FrameType | None) -> None:
        if not stopping.is_set():
            log.info("%s received: stopping", signal.Signals(signum).name)
        stopping.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stopping


def _configure_logging(config: OperatorConfig) -> None:
    logging.basicConfig(
        level=getattr(logging, config.log_level.upper(), logging.INFO),
        format="[%(asctime)s] %(name)-20.20s [%(levelname)-8.8s] %(message)s",
    )


def run_webhook(config: OperatorConfig, stopping: threading.Event | None = None) -> None:
    """Serve the webhooks until SIGTERM/SIGINT (or ``stopping``, for tests)."""
    assert config.webhook_port is not None
    _configure_logging(config)
    stopping = stopping or stop_on_signals()
    metrics = Metrics()
    if config.metrics_port:
        serve(metrics, config.metrics_port, config.metrics_addr)
    health = Health(webhook=True)
    health.beat()
    health_server = serve_health(health, config.liveness_port) if config.liveness_port else None
    kube = Kube.connect(config.kubeconfig, API_THREADS, metrics, health)
    caches = ReadCaches.of(kube, pin_at_admission=config.pin_at_admission)
    hook = start_identity_webhook(config, kube, health, caches)
    health.started()  # nothing to list first: the pin watch lists on its own (pods stay
    # gated until it has), the policy cache reads on demand
    log.info("admission webhooks serving on port %d", config.webhook_port)
    while not stopping.wait(BEAT_SECONDS):
        health.beat()
    deadline = time.monotonic() + config.shutdown_drain_seconds
    health.shutting_down()
    hook.drain()
    while (rest := deadline - time.monotonic()) > 0:
        time.sleep(min(rest, BEAT_SECONDS))
        health.beat()
    hook.stop()
    caches.stop()
    kube.executor.shutdown(wait=False, cancel_futures=True)
    if health_server is not None:
        health_server.stop()
