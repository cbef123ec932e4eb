"""Start the operator: a fresh kopf registry, our handlers, kopf's event loop."""

from __future__ import annotations

import logging
import os

import kopf

from tpuslice.config import OperatorConfig
from tpuslice.handlers import register
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
    liveness = f"http://0.0.0.0:{config.liveness_port}/healthz" if config.liveness_port else None
    kopf.run(
        registry=registry,
        standalone=True,
        clusterwide=not config.namespaces,
        namespaces=list(config.namespaces),
        liveness_endpoint=liveness,
        memo=kopf.Memo(config=config),
    )
