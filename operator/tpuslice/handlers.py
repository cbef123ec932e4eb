"""Thin kopf handlers: keep indexes of what matters, and turn every event into a kick.

Pods, nodes, RayClusters and reservations are followed through kopf indexes
(small records, server-side label selectors), never with change handlers, so
kopf writes no annotations on them. All decisions live in the pure modules and
``reconcile.py``; all API calls in ``kube.py``. Handlers are registered by
``register`` into a registry the caller owns, with intervals from the frozen
``OperatorConfig``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import kopf

from tpuslice import constants as c
from tpuslice import webhook
from tpuslice.config import OperatorConfig
from tpuslice.kube import Kube
from tpuslice.metrics import Metrics
from tpuslice.reconcile import ClusterKey, Reconciler, Snapshot, spec_shape
from tpuslice.reservation import NodeInfo, PodInfo, ReservationInfo
from tpuslice.snapshot import (
    cluster_record,
    node_info,
    pod_info,
    raycluster_info,
    reservation_info,
    reservation_shape,
)

__all__ = ["register"]

log = logging.getLogger(__name__)

TSC = (c.GROUP, c.VERSION, c.PLURAL_CLUSTER)
RESERVATIONS = (c.GROUP, c.VERSION, c.PLURAL_RESERVATION)
PODS = ("", "v1", "pods")
NODES = ("", "v1", "nodes")
RAYCLUSTERS = (c.RAY_GROUP, c.RAY_VERSION, c.RAY_PLURAL_CLUSTER)


def _first(store: Iterable[Any] | None) -> Any:
    for item in store or ():
        return item
    return None


def make_reader(indices: Mapping[str, Any]) -> Any:
    """A snapshot reader over kopf's live indexes (the same objects for the whole run)."""
    clusters = indices["tsc_index"]
    pods = indices["pod_index"]
    nodes = indices["node_index"]
    by_shape = indices["reservation_shape_index"]
    by_holder = indices["reservation_holder_index"]
    rayclusters = indices["raycluster_index"]

    def read(key: ClusterKey) -> Snapshot:
        cluster = _first(clusters.get(key))
        shape = spec_shape(cluster) if cluster is not None else None
        uid = (cluster or {}).get("metadata", {}).get("uid", "")
        reservations: dict[str, ReservationInfo] = {}
        for info in list(by_shape.get(shape, ())) + list(by_holder.get(uid, ())):
            reservations[info.pool] = info
        return Snapshot(
            cluster=cluster,
            pods=list(pods.get(key, ())),
            nodes=list(nodes.get(shape, ())) if shape else [],
            reservations=list(reservations.values()),
            raycluster=_first(rayclusters.get(key)),
        )

    return read


async def _start_webhook(
    settings: kopf.OperatorSettings, kube: Kube, config: OperatorConfig, logger: Any
) -> None:
    """Serve the TPU identity webhook and, unless told otherwise, apply its configuration."""
    assert config.webhook_port is not None
    service = None
    if config.webhook_service:
        service = webhook.ServiceRef(config.webhook_service, config.webhook_namespace or "default")
        hosts = webhook.service_hosts(service.name, service.namespace)
    else:
        hosts = [urlparse(config.webhook_url or "https://127.0.0.1").hostname or "127.0.0.1"]
    files = webhook.certificates_for(Path(config.webhook_cert_dir), hosts)
    webhook.configure_admission(
        settings,
        webhook.webhook_server(files, port=config.webhook_port, addr=config.webhook_addr),
    )
    if config.manage_webhook_configuration and (service or config.webhook_url):
        await kube.apply_webhook_configuration(
            webhook.webhook_configuration(
                ca_bundle=files.ca_bundle(), url=config.webhook_url, service=service
            )
        )
        logger.info(
            "TPU identity webhook configuration applied (%s)",
            config.webhook_url or f"service {service}",
        )


def register(
    registry: kopf.OperatorRegistry, config: OperatorConfig, metrics: Metrics | None = None
) -> None:
    """Register every handler of the operator into ``registry``, recording into ``metrics``."""
    reg: dict[str, Any] = {"registry": registry}
    metrics = metrics or Metrics()
    if config.webhook_port:
        webhook.register_identity_webhook(registry, metrics)
    last_nodes: dict[str, NodeInfo] = {}  # only to skip heartbeats that change nothing we use

    # ------------------------------------------------------------ start-up
    @kopf.on.login(**reg)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """In a pod: the service account; elsewhere: $KUBECONFIG (set from --kubeconfig)."""
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(**reg)
    async def configure(
        settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **kwargs: Any
    ) -> None:
        settings.persistence.finalizer = config.finalizer
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=c.GROUP, key="last-handled-configuration"
        )
        # server-side filters: only our pods, only TPU nodes, only our RayClusters
        settings.watching.label_selectors[PODS] = c.LABEL_CLUSTER
        settings.watching.label_selectors[NODES] = c.NODE_LABEL_ACCELERATOR
        settings.watching.label_selectors[RAYCLUSTERS] = c.LABEL_CLUSTER
        settings.posting.level = logging.WARNING
        kube = Kube.connect(config.kubeconfig, config.api_threads, metrics)
        memo.kube = kube
        memo.reconciler = Reconciler(kube, make_reader(kwargs), metrics=metrics)
        if config.webhook_port:
            await _start_webhook(settings, kube, config, logger)
        if not await kube.crd_exists(f"{c.RAY_PLURAL_CLUSTER}.{c.RAY_GROUP}"):
            logger.warning(
                "KubeRay's RayCluster CRD is not installed; every TPUSliceCluster "
                "will be Stalled (KubeRayNotInstalled) until it is"
            )

    @kopf.on.probe(id="api", **reg)
    async def api_requests(memo: kopf.Memo, **_: Any) -> int:
        return memo.kube.metrics.api_requests_sent() if "kube" in memo else 0

    # ------------------------------------------------------------ indexes
    @kopf.index(*TSC, id="tsc_index", **reg)
    def tsc_index(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
        return {(namespace or "", name): cluster_record(body)}

    @kopf.index(*PODS, labels={c.LABEL_CLUSTER: kopf.PRESENT}, id="pod_index", **reg)
    def pod_index(
        namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
    ) -> dict[Any, PodInfo]:
        return {(namespace or "", labels[c.LABEL_CLUSTER]): pod_info(body)}

    @kopf.index(*NODES, labels={c.NODE_LABEL_ACCELERATOR: kopf.PRESENT}, id="node_index", **reg)
    def node_index(labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, NodeInfo]:
        return {
            (labels[c.NODE_LABEL_ACCELERATOR], labels.get(c.NODE_LABEL_TOPOLOGY, "")): node_info(
                body
            )
        }

    @kopf.index(*RESERVATIONS, id="reservation_shape_index", **reg)
    def reservation_shape_index(body: kopf.Body, **_: Any) -> dict[Any, ReservationInfo]:
        return {reservation_shape(body): reservation_info(body)}

    @kopf.index(*RESERVATIONS, id="reservation_holder_index", **reg)
    def reservation_holder_index(body: kopf.Body, **_: Any) -> dict[Any, ReservationInfo]:
        info = reservation_info(body)
        return {info.holder.uid: info}

    @kopf.index(*RAYCLUSTERS, labels={c.LABEL_CLUSTER: kopf.PRESENT}, id="raycluster_index", **reg)
    def raycluster_index(
        namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> dict[Any, Any]:
        return {(namespace or "", name): raycluster_info(body)}

    # ------------------------------------------------------------ triggers
    @kopf.on.event(*TSC, **reg)
    async def cluster_changed(
        type: str, namespace: str | None, name: str, memo: kopf.Memo, **_: Any
    ) -> None:
        if type == "DELETED":
            memo.reconciler.forget((namespace or "", name))
            return
        await memo.reconciler.kick((namespace or "", name))

    @kopf.timer(*TSC, interval=config.resync_seconds, **reg)
    async def resync(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
        await memo.reconciler.kick((namespace or "", name))

    @kopf.on.event(*PODS, labels={c.LABEL_CLUSTER: kopf.PRESENT}, **reg)
    async def pod_changed(
        namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any
    ) -> None:
        await memo.reconciler.kick((namespace or "", labels[c.LABEL_CLUSTER]))

    @kopf.on.event(*RAYCLUSTERS, labels={c.LABEL_CLUSTER: kopf.PRESENT}, **reg)
    async def raycluster_changed(
        namespace: str | None, name: str, memo: kopf.Memo, **_: Any
    ) -> None:
        await memo.reconciler.kick((namespace or "", name))

    @kopf.on.event(*RESERVATIONS, **reg)
    async def reservation_changed(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        info = reservation_info(body)
        keys = {(info.holder.namespace, info.holder.name)}
        if type == "DELETED":  # a pool became free: wake whoever waits for its shape
            metrics.reservation_gone(info.pool)
            keys |= memo.reconciler.waiting_for(reservation_shape(body))
        else:
            metrics.reservation_seen(info.pool, info.phase)
        memo.reconciler.kick_soon(keys)

    @kopf.on.event(*NODES, labels={c.NODE_LABEL_ACCELERATOR: kopf.PRESENT}, **reg)
    async def node_changed(
        type: str,
        name: str,
        body: kopf.Body,
        memo: kopf.Memo,
        **kwargs: Any,
    ) -> None:
        info = node_info(body)
        if type != "DELETED" and last_nodes.get(name) == info:
            return
        last_nodes[name] = info
        if type == "DELETED":
            last_nodes.pop(name, None)
        shape = (info.accelerator, info.topology)
        memo.reconciler.nodes_changed(shape)
        keys = memo.reconciler.waiting_for(shape)
        keys |= {
            (r.holder.namespace, r.holder.name)
            for r in kwargs["reservation_shape_index"].get(shape, ())
            if r.pool == info.pool
        }
        memo.reconciler.kick_soon(keys)

    # ------------------------------------------------------------ release
    @kopf.on.delete(*TSC, **reg)
    async def tear_down(
        namespace: str | None,
        name: str,
        uid: str,
        memo: kopf.Memo,
        **kwargs: Any,
    ) -> None:
        """Delete the RayCluster, wait until its worker pods (which hold chips) are gone,
        then release every reservation of this cluster."""
        kube: Kube = memo.kube
        namespace = namespace or ""
        await kube.delete_raycluster(namespace, name)
        remaining = list(kwargs["pod_index"].get((namespace, name), ()))
        if remaining:
            raise kopf.TemporaryError(
                f"waiting for {len(remaining)} worker pods to terminate before releasing "
                f"node pools",
                delay=2,
            )
        for info in list(kwargs["reservation_holder_index"].get(uid, ())):
            await kube.delete_reservation(info.pool)
        memo.reconciler.forget((namespace or "", name))

    @kopf.timer(*RESERVATIONS, interval=config.sweep_seconds, **reg)
    async def sweep_orphan(body: kopf.Body, memo: kopf.Memo, logger: Any, **kwargs: Any) -> None:
        """Delete a reservation whose holder no longer exists and whose pods are gone."""
        info = reservation_info(body)
        holder = info.holder
        cluster = _first(kwargs["tsc_index"].get((holder.namespace, holder.name)))
        if cluster is not None and cluster.get("metadata", {}).get("uid") == holder.uid:
            return
        if any(
            p.replica_name == holder.replica_name
            for p in kwargs["pod_index"].get((holder.namespace, holder.name), ())
        ):
            return
        if await memo.kube.delete_reservation(info.pool, uid=body.metadata.uid):
            logger.info(
                "released node pool %s: its holder %s is gone", info.pool, holder.describe()
            )
