"""Start the operator: a fresh kopf registry, our handlers, kopf's event loop."""

from __future__ import annotations

import logging
import os

import kopf
from kopf._core.engines.peering import Identity  # kopf.run's type; not re-exported

from tpuslice.config import OperatorConfig
from tpuslice.handlers import register
from tpuslice.health import Health, serve_health
from tpuslice.metrics import Metrics, serve


def run_operator(config: OperatorConfig) -> None:
    """Run until SIGTERM/SIGINT. One replica (kopf peering off): see the chart's Recreate."""
    if config.kubeconfig:
        # kopf logs in through the official client, which reads $KUBECONFIG.
        os.environ["KUBECONFIG"] = config.kubeconfig
    level = getattr(logging, config.log_level.upper(), logging.INFO)
    kopf.configure(verbose=level <= logging.DEBUG, log_format=kopf.LogFormat.PLAIN)
    logging.getLogger().setLevel(level)
    if level > logging.DEBUG:
        # kopf logs every successful handler call at INFO: one line per pod event.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    registry = kopf.OperatorRegistry()
    metrics = Metrics()
    register(registry, config, metrics)
    if config.metrics_port:
        serve(metrics, config.metrics_port, config.metrics_addr)
    health = Health(webhook=bool(config.webhook_port))
    if config.liveness_port:
        # Before kopf starts, so a start-up that never finishes is seen by the probes.
        serve_health(health, config.liveness_port)
    kopf.run(
        registry=registry,
        standalone=True,
        clusterwide=not config.namespaces,
        namespaces=list(config.namespaces),
        # kopf would derive it from the user name, which a container's numeric
        # user (65532, no passwd entry) does not have: KeyError from getpwuid.
        identity=Identity(config.identity),
        memo=kopf.Memo(config=config, health=health),
    )
