"""Start the operator: the shell around kopf.

In order: logging; ``/metrics`` and ``/healthz`` + ``/readyz``; one API client
(``Kube``); the admission webhooks and their configurations (``serving.py``) unless
they run apart (``--webhook-port=0`` next to ``tpuslice webhook``,
``webhook_process.py``); then,
with leader election, wait as a standby until this instance holds the Lease
(``election.py``), keep it renewed, and only then run kopf: reconciles, claims,
releases, status writes and the orphan sweep happen in the leader alone, while
every replica answers admission calls.

kopf runs on a thread of its own with a stop flag (it logs that it ignores OS
signals there), because the main thread owns SIGTERM and SIGINT: a stop has
steps kopf does not know. The replica turns not ready and the webhook drains
(answers close their connections) at once; kopf stops; the API calls already
sent finish; the Lease is released, so a standby takes over within a retry
period instead of a lease duration; and once the drain time is over the
webhook stops. A lost Lease ends the process at once instead (``exit_now``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass

import kopf
from kopf._core.engines.peering import Identity  # kopf.run's type; not re-exported

from tpuslice.controller.handlers import register
from tpuslice.main.webhook_process import stop_on_signals
from tpuslice.runtime.config import OperatorConfig
from tpuslice.runtime.election import Elector, KubeLeases
from tpuslice.runtime.health import Health, serve_health
from tpuslice.runtime.informers import followed_kinds
from tpuslice.runtime.kube import Kube
from tpuslice.runtime.logcontext import ObjectPrefix
from tpuslice.runtime.metrics import Metrics, serve
from tpuslice.webhook.serving import IdentityWebhook, start_identity_webhook

__all__ = ["exit_now", "run_operator"]

log = logging.getLogger(__name__)

#: How long kopf gets to stop (its handlers finish or are cancelled) after SIGTERM.
KOPF_STOP_SECONDS = 20.0


def exit_now(reason: str) -> None:
    """Leave at once: leadership is lost, and another instance may take over within
    seconds. No cleanup may run (it could still write); the kubelet restarts us."""
    log.critical("stopping at once: %s; exiting so that nothing acts twice", reason)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(1)


def _configure_logging(config: OperatorConfig) -> None:
    level = getattr(logging, config.log_level.upper(), logging.INFO)
    kopf.configure(verbose=level <= logging.DEBUG, log_format=kopf.LogFormat.PLAIN)
    logging.getLogger().setLevel(level)
    for handler in logging.getLogger().handlers:
        handler.addFilter(ObjectPrefix())
    if level > logging.DEBUG:
        # kopf logs every successful handler call at INFO: one line per pod event.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)


def run_operator(config: OperatorConfig) -> None:
    """Run until SIGTERM/SIGINT (or, with leader election, until the Lease is lost)."""
    _configure_logging(config)
    stopping = stop_on_signals()
    metrics = Metrics()
    if config.metrics_port:
        serve(metrics, config.metrics_port, config.metrics_addr)
    health = Health(webhook=bool(config.webhook_port))
    metrics.watch_ages_from(health.watch_ages)
    if config.leader_elect:
        health.standby()
    if config.liveness_port:
        # Before anything else, so a start-up that never finishes is seen by the probes.
        serve_health(health, config.liveness_port)
    kube = Kube.connect(
        config.kubeconfig,
        config.api_threads,
        metrics,
        health,
        held_open=len(followed_kinds(config.namespaces)),
    )
    hook = start_identity_webhook(config, kube, health) if config.webhook_port else None
    drain = _Drain(health, hook)
    elector: Elector | None = None
    failed, stopped = False, True
    try:
        if config.leader_elect:
            elector = Elector(
                KubeLeases(kube, config.lease_namespace, config.lease_name),
                config.identity,
                namespace=config.lease_namespace,
                name=config.lease_name,
                health=health,
                metrics=metrics,
            )
            if not elector.acquire(stopping):
                return
            elector.keep(exit_now, alive=lambda: health.liveness().ok)
            health.standby(False)
        else:
            metrics.leading(True)
        failed, stopped = _run_kopf(config, kube, health, metrics, stopping, drain)
    finally:
        _stop(config, kube, elector if stopped else None, drain, stopping)
    if failed:
        raise SystemExit(1)


def _run_kopf(
    config: OperatorConfig,
    kube: Kube,
    health: Health,
    metrics: Metrics,
    stopping: threading.Event,
    drain: _Drain,
) -> tuple[bool, bool]:
    """kopf on its own thread until we are told to stop. Returns whether kopf ended by
    itself (a failure), and whether it has stopped (if not, the Lease is not released:
    it expires, a lease duration after kopf's last chance to act)."""
    registry = kopf.OperatorRegistry()
    register(registry)
    kopf_stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            kopf.run(
                registry=registry,
                standalone=True,  # no kopf peering: the Lease decides who acts
                clusterwide=not config.namespaces,
                namespaces=list(config.namespaces),
                # kopf would derive it from the user name, which a container's numeric
                # user (65532, no passwd entry) does not have: KeyError from getpwuid.
                identity=Identity(config.identity),
                stop_flag=kopf_stop,
                memo=kopf.Memo(config=config, health=health, kube=kube, metrics=metrics),
            )
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="kopf", daemon=True)
    thread.start()
    while thread.is_alive() and not stopping.wait(0.5):
        pass
    if stopping.is_set():
        drain.begin()  # first, while kopf stops: the Service stops sending calls here
    kopf_stop.set()
    thread.join(KOPF_STOP_SECONDS)
    if thread.is_alive():
        log.warning(
            "kopf did not stop within %.0fs; the Lease is left to expire", KOPF_STOP_SECONDS
        )
    if errors:
        log.error("kopf stopped with an error", exc_info=errors[0])
    return not stopping.is_set(), not thread.is_alive()


@dataclass
class _Drain:
    """From SIGTERM on: not ready, and every webhook answer closes its connection."""

    health: Health
    hook: IdentityWebhook | None
    began: float | None = None

    def begin(self) -> None:
        if self.began is None:
            self.began = time.monotonic()
            self.health.shutting_down()
            if self.hook is not None:
                self.hook.drain()

    def finish(self, seconds: float) -> None:
        """Keep answering until ``seconds`` after ``begin``, then stop the webhook."""
        if self.hook is None:
            return
        rest = seconds - (time.monotonic() - (self.began or time.monotonic()))
        if rest > 0:
            log.info("identity webhook: draining for %.1fs more", rest)
            time.sleep(rest)
        self.hook.stop()


def _stop(
    config: OperatorConfig,
    kube: Kube,
    elector: Elector | None,
    drain: _Drain,
    stopping: threading.Event,
) -> None:
    """Stop acting, hand the Lease over, let the webhook drain, stop it."""
    drain.begin()
    # Requests already on their way (a reconcile's last patch) finish before the Lease
    # is released: after the release another instance may act.
    kube.executor.shutdown(wait=True, cancel_futures=True)
    if elector is not None:
        elector.release()
    drain.finish(config.shutdown_drain_seconds if stopping.is_set() else 0.0)
