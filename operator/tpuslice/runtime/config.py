"""Operator settings, read once at start into a frozen object and passed along."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpuslice.spec.bounds import SpecLimits


@dataclass(frozen=True)
class OperatorConfig:
    """Everything `tpuslice run` can be told; handlers get it through kopf's memo."""

    kubeconfig: str | None = None
    #: Who this instance is (the pod name in a cluster, else host and pid): kopf's
    #: identity, never derived from the user name (a numeric user may have none).
    identity: str = "tpuslice-operator"
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    resync_seconds: float = 60.0  # safety-net reconcile of every TPUSliceCluster
    sweep_seconds: float = 60.0  # orphaned-reservation sweep interval
    # Leader election (election.py): only the holder of this Lease acts; every
    # instance serves the webhook. Off: this instance acts as if it led.
    leader_elect: bool = True
    lease_namespace: str = "default"
    lease_name: str = "tpuslice-operator"
    #: SIGTERM -> exit: the webhook keeps answering (each answer closing its
    #: connection) while the Service stops sending calls here.
    shutdown_drain_seconds: float = 5.0
    liveness_port: int | None = 8080
    log_level: str = "INFO"
    api_threads: int = 32
    #: passes running at once, every kind together (``controller.queue.PassSlots``)
    concurrent_passes: int = 16
    #: A status change that flips no condition is written this many seconds after the
    #: first one held, with every change after it (0: within 2 s;
    #: ``controller.statuswriter.fold_windows``).
    status_batch_seconds: int = 0
    finalizer: str = "tpuslice.dev/finalizer"
    # TPU identity webhook (see docs/tpu-identity.md); port None disables it.
    webhook_port: int | None = 9443
    webhook_addr: str | None = None  # listen address; None: all interfaces
    webhook_url: str | None = None  # out of cluster: the API server calls this base URL
    webhook_service: str | None = None  # in cluster: the Service in front of the port
    webhook_namespace: str | None = None  # the Service's namespace
    webhook_cert_dir: str = "/tmp/tpuslice-webhook"  # tls.crt/tls.key/ca.crt used if present
    #: The Secret (in webhook_namespace) every replica shares its CA and serving
    #: certificate through (webhookcerts.py); None: the cert dir only.
    webhook_secret: str | None = None
    webhook_cert_check_seconds: float = 60.0  # re-read the Secret or mounted files
    manage_webhook_configuration: bool = True  # apply the MutatingWebhookConfiguration
    # The configuration's settings (webhook/configuration.py): the same on every replica.
    webhook_timeout_seconds: int = 5  # 1-30, a Kubernetes limit
    #: Pin at admission (planning/pinning.py): the leader marks held units pinnable and
    #: the identity webhook pins a new pod of such a slice in its mutation (no gate, no
    #: release patch). Given to both ``run`` and ``webhook``.
    pin_at_admission: bool = False
    #: The fence beyond the webhook's timeout before a marked unit is let go.
    pin_fence_margin_seconds: float = 10.0
    webhook_failure_policy: str = "Fail"  # or Ignore: pods admitted without an identity
    #: A checked LabelSelector of the namespaces whose pods are sent to the webhook;
    #: None: every namespace but kube-system.
    webhook_namespace_selector: dict[str, Any] | None = None
    # Prometheus /metrics (docs/metrics.md); port None disables it.
    metrics_port: int | None = 8000
    metrics_addr: str = "0.0.0.0"  # all interfaces: Prometheus scrapes the pod IP
    #: The most slices and hosts (worker pods) one TPUSlice object may ask for; more
    #: ends its pass InvalidSpec. Defaults and reasons: ``spec.bounds.SpecLimits``.
    max_slices_per_object: int = SpecLimits.max_slices
    max_hosts_per_object: int = SpecLimits.max_hosts
    #: Kueue's waitForPodsReady timeout and recoveryTimeout in seconds, mirrored from
    #: Kueue's Configuration (it publishes neither): the status says when Kueue evicts an
    #: admitted object whose pods are not all ready. 0: not told; recovery None: the
    #: timeout (Kueue's default).
    kueue_pods_ready_timeout_s: int = 0
    kueue_pods_ready_recovery_timeout_s: int | None = None
