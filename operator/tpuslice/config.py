"""Operator settings, read once at start into a frozen object and passed along."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OperatorConfig:
    """Everything `tpuslice run` can be told; handlers get it through kopf's memo."""

    kubeconfig: str | None = None
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    resync_seconds: float = 60.0  # safety-net reconcile of every TPUSliceCluster
    sweep_seconds: float = 60.0  # orphaned-reservation sweep interval
    liveness_port: int | None = 8080
    log_level: str = "INFO"
    api_threads: int = 32
    finalizer: str = "tpuslice.dev/finalizer"
