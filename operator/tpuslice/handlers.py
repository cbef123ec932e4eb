"""Thin kopf handlers: keep indexes of what matters, and turn every event into a kick.

kopf follows TPUSliceClusters and SliceReservations (indexes of small records,
the finalizer, timers). Pods, nodes and RayClusters, the numerous kinds, are
followed by our own watches (``watches.py``) into stores, so kopf keeps no
per-object state for them and writes nothing on them. All decisions live in the
pure modules and ``reconcile.py``; all API calls in ``kube.py``. Handlers are
registered by ``register`` into a registry the caller owns, with intervals from
the frozen ``OperatorConfig``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from tpuslice import constants as c
from tpuslice.config import OperatorConfig
from tpuslice.convert import (
    cluster_record,
    controlled_by,
    raycluster_info,
    reservation_info,
    reservation_shape,
)
from tpuslice.health import Health
from tpuslice.kube import Kube
from tpuslice.kube import credentials as kube_credentials
from tpuslice.metrics import Metrics
from tpuslice.reconcile import Reconciler, spec_shape
from tpuslice.records import ClusterKey, ReservationInfo, Snapshot
from tpuslice.sweep import is_orphan
from tpuslice.watches import Watches, node_kicks, pod_kicks

__all__ = ["register"]

log = logging.getLogger(__name__)

#: How long the API server keeps one of kopf's watch requests open before ending it.
KOPF_WATCH_SERVER_SECONDS = 290
#: How often the event loop tells the liveness probe it is turning.
HEARTBEAT_SECONDS = 1.0
#: How long one call of the finalizer handler waits for a cluster's pods to be gone.
TEARDOWN_WAIT_SECONDS = 60.0

TSC = (c.GROUP, c.VERSION, c.PLURAL_CLUSTER)
RESERVATIONS = (c.GROUP, c.VERSION, c.PLURAL_RESERVATION)


def _first(store: Iterable[Any] | None) -> Any:
    for item in store or ():
        return item
    return None


def make_reader(indices: Mapping[str, Any], watches: Watches) -> Any:
    """A snapshot reader over kopf's live indexes and our watches' stores (the same
    objects for the whole run)."""
    clusters = indices["tsc_index"]
    by_shape = indices["reservation_shape_index"]
    by_holder = indices["reservation_holder_index"]

    def read(key: ClusterKey) -> Snapshot:
        cluster = _first(clusters.get(key))
        shape = spec_shape(cluster) if cluster is not None else None
        uid = (cluster or {}).get("metadata", {}).get("uid", "")
        reservations: dict[str, ReservationInfo] = {}
        for info in list(by_shape.get(shape, ())) + list(by_holder.get(uid, ())):
            reservations[info.pool] = info
        return Snapshot(
            cluster=cluster,
            pods=watches.pods_of(key),
            nodes=watches.nodes_of(shape) if shape else [],
            reservations=list(reservations.values()),
            raycluster=watches.raycluster(key),
        )

    return read


async def _beat(health: Health) -> None:
    """Tell the liveness probe, once a second, that the event loop is turning."""
    while True:
        health.beat()
        await asyncio.sleep(HEARTBEAT_SECONDS)


def register(
    registry: kopf.OperatorRegistry, config: OperatorConfig, metrics: Metrics | None = None
) -> None:
    """Register every handler of the operator into ``registry``, recording into ``metrics``."""
    reg: dict[str, Any] = {"registry": registry}
    metrics = metrics or Metrics()

    # ------------------------------------------------------------ start-up
    @kopf.on.login(**reg)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """In a pod: the service account; elsewhere: --kubeconfig, else $KUBECONFIG.

        Through the kubernetes client's own configuration, as ``Kube`` logs in: in a pod
        that is the API server's address from ``KUBERNETES_SERVICE_HOST``. kopf's
        ``login_with_service_account`` dials ``kubernetes.default.svc`` instead, so it
        needs cluster DNS that ``Kube`` does not, and the operator looked started while
        kopf could not reach the API server (seen on a real node without DNS)."""
        creds = kube_credentials(config.kubeconfig)
        return kopf.ConnectionInfo(
            server=creds.server,
            ca_path=creds.ca_path,
            insecure=creds.insecure,
            scheme=creds.scheme,
            token=creds.token,
            certificate_path=creds.certificate_path,
            private_key_path=creds.private_key_path,
        )

    @kopf.on.startup(**reg)
    async def configure(
        settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **kwargs: Any
    ) -> None:
        settings.persistence.finalizer = config.finalizer
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=c.GROUP, key="last-handled-configuration"
        )
        settings.posting.level = logging.WARNING
        # Bounded watches of TPUSliceClusters and SliceReservations (kopf's default is
        # none): the server ends each after server_timeout, the client gives up on a
        # silent connection after client_timeout, so a half-open stream cannot hide.
        settings.watching.server_timeout = KOPF_WATCH_SERVER_SECONDS
        settings.watching.client_timeout = KOPF_WATCH_SERVER_SECONDS + 30
        settings.watching.connect_timeout = 30
        health: Health = memo.health
        memo.heartbeat = asyncio.get_running_loop().create_task(_beat(health))
        kube: Kube = memo.kube  # made by app.run_operator, shared with leader election
        watches = Watches()
        reconciler = Reconciler(kube, make_reader(kwargs, watches), metrics=metrics)
        memo.watches, memo.reconciler = watches, reconciler
        reconciler.hold_until_indexed()
        shape_index = kwargs["reservation_shape_index"]

        def holders_of(shape: tuple[str, str], pool: str) -> set[ClusterKey]:
            return {
                (r.holder.namespace, r.holder.name)
                for r in shape_index.get(shape, ())
                if r.pool == pool
            }

        def on_nodes(changes: list[Any]) -> None:
            shapes, keys = node_kicks(changes, reconciler.waiting_for, holders_of)
            for shape in shapes:
                reconciler.nodes_changed(shape)
            reconciler.kick_soon(keys)

        await watches.start(
            kube,
            config.namespaces,
            on_pods=lambda changes: reconciler.kick_soon(pod_kicks(changes)),
            on_nodes=on_nodes,
            on_rayclusters=lambda changes: reconciler.kick_soon({ch.key for ch in changes}),
        )
        logger.info(
            "listed %d TPU nodes, %d pods and %d RayClusters of TPUSliceClusters",
            len(watches.nodes),
            len(watches.pods),
            len(watches.rayclusters),
        )
        if not await kube.crd_exists(f"{c.RAY_PLURAL_CLUSTER}.{c.RAY_GROUP}"):
            logger.warning(
                "KubeRay's RayCluster CRD is not installed; every TPUSliceCluster "
                "will be Stalled (KubeRayNotInstalled) until it is"
            )
        health.started()

    @kopf.on.cleanup(**reg)
    async def stop(memo: kopf.Memo, **_: Any) -> None:
        if "watches" in memo:
            memo.watches.stop()
        if memo.get("heartbeat") is not None:
            memo.heartbeat.cancel()

    # ------------------------------------------------------------ indexes
    @kopf.index(*TSC, id="tsc_index", **reg)
    def tsc_index(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
        return {(namespace or "", name): cluster_record(body)}

    @kopf.index(*RESERVATIONS, id="reservation_shape_index", **reg)
    def reservation_shape_index(body: kopf.Body, **_: Any) -> dict[Any, ReservationInfo]:
        return {reservation_shape(body): reservation_info(body)}

    @kopf.index(*RESERVATIONS, id="reservation_holder_index", **reg)
    def reservation_holder_index(body: kopf.Body, **_: Any) -> dict[Any, ReservationInfo]:
        info = reservation_info(body)
        return {info.holder.uid: info}

    # ------------------------------------------------------------ triggers
    @kopf.on.event(*TSC, **reg)
    async def cluster_changed(
        type: str, namespace: str | None, name: str, memo: kopf.Memo, **_: Any
    ) -> None:
        memo.reconciler.indexed()  # kopf calls handlers only once its indexes are filled
        if type == "DELETED":
            memo.reconciler.forget((namespace or "", name))
            return
        await memo.reconciler.kick((namespace or "", name))

    @kopf.timer(*TSC, interval=config.resync_seconds, **reg)
    async def resync(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
        await memo.reconciler.kick((namespace or "", name))

    @kopf.on.event(*RESERVATIONS, **reg)
    async def reservation_changed(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        memo.reconciler.indexed()
        info = reservation_info(body)
        keys = {(info.holder.namespace, info.holder.name)}
        if type == "DELETED":  # a pool became free: wake whoever waits for its shape
            metrics.reservation_gone(info.pool)
            keys |= memo.reconciler.waiting_for(reservation_shape(body))
        else:
            metrics.reservation_seen(info.pool, info.phase)
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
        then release every reservation of this cluster.

        The wait is on our pod store, in the handler, for up to a minute: each kopf
        retry (TemporaryError) patches the TSC's progress annotation, and retrying
        every 2 s while 1,000 clusters were torn down sent ~100 patches a second."""
        kube: Kube = memo.kube
        namespace = namespace or ""
        ours = memo.watches.raycluster((namespace, name))
        if ours is None:  # not labelled (someone removed our label), or none at all
            found = await kube.get_raycluster(namespace, name)
            ours = None if found is None else raycluster_info(found)
        if ours is not None and controlled_by(ours["ownerReferences"], uid):
            await kube.delete_raycluster(namespace, name, ours["uid"])
        # else: none, or another's RayCluster of that name: never deleted.
        remaining = await memo.watches.pods_gone((namespace, name), TEARDOWN_WAIT_SECONDS)
        if remaining:
            raise kopf.TemporaryError(
                f"waiting for {len(remaining)} worker pods to terminate before releasing "
                f"node pools",
                delay=1,
            )
        for info in list(kwargs["reservation_holder_index"].get(uid, ())):
            await kube.delete_reservation(info.pool)
        memo.reconciler.forget((namespace or "", name))

    @kopf.timer(*RESERVATIONS, interval=config.sweep_seconds, **reg)
    async def sweep_orphan(body: kopf.Body, memo: kopf.Memo, logger: Any, **kwargs: Any) -> None:
        """Delete a reservation whose holder no longer exists and whose pods are gone,
        only if the holder is in a namespace this instance watches (``is_orphan``)."""
        info = reservation_info(body)
        holder = info.holder
        cluster = _first(kwargs["tsc_index"].get((holder.namespace, holder.name)))
        live_uid = (cluster or {}).get("metadata", {}).get("uid")
        pods = any(
            p.replica_name == holder.replica_name
            for p in memo.watches.pods_of((holder.namespace, holder.name))
        )
        if not is_orphan(holder, live_uid, pods, config.namespaces):
            return
        if await memo.kube.delete_reservation(info.pool, uid=body.metadata.uid):
            logger.info(
                "released node pool %s: its holder %s is gone", info.pool, holder.describe()
            )
