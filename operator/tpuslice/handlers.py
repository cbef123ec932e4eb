"""Thin kopf handlers: module-level functions that turn events into kicks, and ``register``.

kopf follows TPUSliceClusters and SliceReservations (indexes of small records,
the TSC finalizer, the resync timer). Pods, nodes and RayClusters are followed
by ``follow.py`` into stores. Every decision lives in the pure modules and in
the parts that ``reconcile.Reconciler`` wires; every API call in ``kube.py``.
``register`` only wires these functions into a registry the caller owns, with
intervals from the frozen ``OperatorConfig``; the functions read what they
need from kopf's memo (``config``, ``health``, ``kube``, made by ``app.py``,
and ``watches``, ``reconciler``, made by ``configure``).

Reservations carry no kopf finalizer and no timer: one sweep task per process
(``sweep_forever``) looks at every reservation once per interval, where a kopf
timer per reservation kept a task, and a finalizer, on each of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from tpuslice import constants as c
from tpuslice.applier import controlled_by
from tpuslice.config import OperatorConfig
from tpuslice.convert import cluster_record, raycluster_info, reservation_info, reservation_shape
from tpuslice.follow import Watches, node_kicks, pod_kicks
from tpuslice.health import Health
from tpuslice.kube import ClusterApi, Kube
from tpuslice.kube import credentials as kube_credentials
from tpuslice.metrics import Metrics
from tpuslice.reconcile import Reconciler, SnapshotReader, spec_shape
from tpuslice.records import ClusterKey, Holder, ReservationInfo, Shape, ShapeMember, Snapshot
from tpuslice.sweep import orphans

__all__ = [
    "make_reader",
    "register",
    "sweep_once",
    "tear_down",
]

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


# ------------------------------------------------------------ the snapshot reader
def make_reader(indices: Mapping[str, Any], watches: Watches) -> SnapshotReader:
    """A snapshot reader over kopf's live indexes and our stores (the same objects for the
    whole run): the cluster, its pods and RayCluster, the nodes of its shape, and the
    reservations of its shape and its own (a spec whose shape changed still sees the pools
    it holds of the old one)."""
    clusters = indices["tsc_index"]
    clusters_by_shape = indices["tsc_shape_index"]
    by_shape = indices["reservation_shape_index"]
    by_holder = indices["reservation_holder_index"]

    def read(key: ClusterKey) -> Snapshot:
        cluster = _first(clusters.get(key))
        shape = spec_shape(cluster) if cluster is not None else None
        uid = (cluster or {}).get("metadata", {}).get("uid", "")
        reservations: dict[str, ReservationInfo] = {}
        for info in list(by_shape.get(shape, ())) + list(by_holder.get(uid, ())):
            reservations[info.pool] = info
        members = []
        for other in list(clusters_by_shape.get(shape, ())) if shape else []:
            meta = other.get("metadata") or {}
            other_key = (meta.get("namespace", ""), meta.get("name", ""))
            if other_key != key:
                members.append(ShapeMember(other, watches.pods_of(other_key)))
        return Snapshot(
            cluster=cluster,
            pods=watches.pods_of(key),
            nodes=watches.nodes_of(shape) if shape else [],
            reservations=list(reservations.values()),
            raycluster=watches.raycluster(key),
            shape_members=members,
        )

    return read


# ------------------------------------------------------------ start-up and shut-down
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo | None:
    """In a pod: the service account; elsewhere: --kubeconfig, else $KUBECONFIG.

    Through the kubernetes client's own configuration, as ``Kube`` logs in: in a pod
    that is the API server's address from ``KUBERNETES_SERVICE_HOST``. kopf's
    ``login_with_service_account`` dials ``kubernetes.default.svc`` instead, so it needs
    cluster DNS that ``Kube`` does not, and the operator looked started while kopf could
    not reach the API server (seen on a real node without DNS)."""
    config: OperatorConfig = memo.config
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


async def _beat(health: Health) -> None:
    """Tell the liveness probe, once a second, that the event loop is turning."""
    while True:
        health.beat()
        await asyncio.sleep(HEARTBEAT_SECONDS)


def _configure_kopf(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    settings.persistence.finalizer = config.finalizer
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=c.GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    # Bounded watches of TPUSliceClusters and SliceReservations (kopf's default is none):
    # the server ends each after server_timeout, the client gives up on a silent
    # connection after client_timeout, so a half-open stream cannot hide.
    settings.watching.server_timeout = KOPF_WATCH_SERVER_SECONDS
    settings.watching.client_timeout = KOPF_WATCH_SERVER_SECONDS + 30
    settings.watching.connect_timeout = 30


async def configure(
    settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **indices: Any
) -> None:
    """Start-up: kopf's settings, our watches (listed once before any pass), the
    reconciler (kicks held until kopf's indexes are filled), the heartbeat and the sweep."""
    config: OperatorConfig = memo.config
    metrics: Metrics = memo.metrics
    _configure_kopf(settings, config)
    health: Health = memo.health
    memo.heartbeat = asyncio.get_running_loop().create_task(_beat(health))
    kube: Kube = memo.kube  # made by app.run_operator, shared with leader election
    watches = Watches()
    reconciler = Reconciler(kube, make_reader(indices, watches), metrics=metrics)
    memo.watches, memo.reconciler = watches, reconciler
    memo.indexed = asyncio.Event()
    reconciler.hold_until_indexed()
    shape_index = indices["reservation_shape_index"]

    def holders_of(shape: Shape, pool: str) -> set[ClusterKey]:
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
    memo.sweeper = asyncio.get_running_loop().create_task(
        sweep_forever(kube, indices, watches, memo.indexed, config)
    )
    health.started()


async def stop(memo: kopf.Memo, **_: Any) -> None:
    if "watches" in memo:
        memo.watches.stop()
    for task in ("heartbeat", "sweeper"):
        if memo.get(task) is not None:
            memo[task].cancel()


# ------------------------------------------------------------ indexes
def tsc_index(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace or "", name): cluster_record(body)}


def tsc_shape_index(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """TPUSliceClusters by shape: the members of each shape's queue."""
    record = cluster_record(body)
    shape = spec_shape(record)
    return {shape: record} if shape is not None else {}


def reservation_shape_index(body: kopf.Body, **_: Any) -> dict[Any, ReservationInfo]:
    return {reservation_shape(body): reservation_info(body)}


def reservation_holder_index(body: kopf.Body, **_: Any) -> dict[Any, ReservationInfo]:
    info = reservation_info(body)
    return {info.holder.uid: info}


# ------------------------------------------------------------ triggers
def _indexed(memo: kopf.Memo) -> None:
    """kopf calls handlers only once its indexes are filled: release what waited for them."""
    memo.reconciler.indexed()
    memo.indexed.set()


async def cluster_changed(
    type: str, namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    _indexed(memo)
    key = (namespace or "", name)
    if type in ("ADDED", "DELETED"):  # the shape's queue changed: its waiting move on
        shape = spec_shape(body)
        if shape is not None:
            memo.reconciler.kick_soon(memo.reconciler.waiting_for(shape) - {key})
    if type == "DELETED":
        memo.reconciler.forget(key, uid=str(body.get("metadata", {}).get("uid") or ""))
        return
    await memo.reconciler.kick(key)


async def resync(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    await memo.reconciler.kick((namespace or "", name))


async def reservation_changed(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _indexed(memo)
    metrics: Metrics = memo.metrics
    info = reservation_info(body)
    keys = {(info.holder.namespace, info.holder.name)}
    if type == "DELETED":
        metrics.reservation_gone(info.pool)
    else:
        metrics.reservation_seen(info.pool, info.phase)
    if type in ("ADDED", "DELETED"):  # a pool freed or taken: the shape's queue moves
        keys |= memo.reconciler.waiting_for(reservation_shape(body))
    memo.reconciler.kick_soon(keys)


# ------------------------------------------------------------ release
async def tear_down(
    kube: ClusterApi,
    watches: Watches,
    holder_index: Mapping[str, Iterable[ReservationInfo]],
    namespace: str,
    name: str,
    uid: str,
    wait_seconds: float = TEARDOWN_WAIT_SECONDS,
) -> list[str]:
    """Delete the cluster's RayCluster (only if this TSC controls it), wait until its
    worker pods (which hold chips) are gone, then release every reservation of the
    cluster. The pods still there after ``wait_seconds`` (nothing released then).

    The wait is on our pod store, for up to a minute per call: each kopf retry
    patches the TSC's progress annotation, and retrying every 2 s while 1,000
    clusters were torn down sent ~100 patches a second."""
    ours = watches.raycluster((namespace, name))
    if ours is None:  # not labelled (someone removed our label), or none at all
        found = await kube.get_raycluster(namespace, name)
        ours = None if found is None else raycluster_info(found)
    if ours is not None and controlled_by(ours["ownerReferences"], uid):
        await kube.delete_raycluster(namespace, name, ours["uid"])
    # else: none, or another's RayCluster of that name: never deleted.
    remaining = await watches.pods_gone((namespace, name), wait_seconds)
    if remaining:
        return [p.name for p in remaining]
    for info in list(holder_index.get(uid, ())):
        await kube.delete_reservation(info.pool)
    return []


async def on_delete(
    namespace: str | None, name: str, uid: str, memo: kopf.Memo, **indices: Any
) -> None:
    """The TSC's finalizer: ``tear_down``, retried by kopf while pods remain."""
    key = (namespace or "", name)
    remaining = await tear_down(
        memo.kube, memo.watches, indices["reservation_holder_index"], *key, uid
    )
    if remaining:
        raise kopf.TemporaryError(
            f"waiting for {len(remaining)} worker pods to terminate before releasing node pools",
            delay=1,
        )
    memo.reconciler.forget(key, uid=uid)


# ------------------------------------------------------------ the sweep
async def sweep_once(
    kube: ClusterApi,
    indices: Mapping[str, Any],
    watches: Watches,
    namespaces: Iterable[str],
) -> list[str]:
    """Delete every reservation whose holder no longer exists and whose pods are gone, if
    the holder is in a namespace this instance watches; the pools given back. Each delete
    is conditional on the reservation's uid (a new claim of the pool is never deleted)."""
    clusters = indices["tsc_index"]
    every = [info for infos in list(indices["reservation_holder_index"].values()) for info in infos]

    def live_uid(key: ClusterKey) -> str | None:
        cluster = _first(clusters.get(key))
        uid = (cluster or {}).get("metadata", {}).get("uid")
        return str(uid) if uid else None

    def replica_has_pods(holder: Holder) -> bool:
        return any(
            p.replica_name == holder.replica_name
            for p in watches.pods_of((holder.namespace, holder.name))
        )

    freed = []
    for info in orphans(every, live_uid, replica_has_pods, tuple(namespaces)):
        if await kube.delete_reservation(info.pool, uid=info.uid or None):
            log.info(
                "released node pool %s: its holder %s is gone", info.pool, info.holder.describe()
            )
            freed.append(info.pool)
    return freed


async def sweep_forever(
    kube: ClusterApi,
    indices: Mapping[str, Any],
    watches: Watches,
    indexed: asyncio.Event,
    config: OperatorConfig,
) -> None:
    """``sweep_once`` every ``config.sweep_seconds``, never before kopf's indexes are filled
    (an empty index of clusters would make every holder look gone)."""
    await indexed.wait()
    while True:
        await asyncio.sleep(config.sweep_seconds)
        try:
            await sweep_once(kube, indices, watches, config.namespaces)
        except Exception as exc:  # the next round tries again
            log.warning("the orphan sweep failed: %s", exc)


# ------------------------------------------------------------ wiring
def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Wire every handler into ``registry``. The memo that ``kopf.run`` gets must hold
    ``config``, ``health``, ``kube`` and ``metrics`` (``app.py`` makes it)."""
    reg: dict[str, Any] = {"registry": registry}
    kopf.on.login(**reg)(login)
    kopf.on.startup(**reg)(configure)
    kopf.on.cleanup(**reg)(stop)
    kopf.index(*TSC, id="tsc_index", **reg)(tsc_index)
    kopf.index(*TSC, id="tsc_shape_index", **reg)(tsc_shape_index)
    kopf.index(*RESERVATIONS, id="reservation_shape_index", **reg)(reservation_shape_index)
    kopf.index(*RESERVATIONS, id="reservation_holder_index", **reg)(reservation_holder_index)
    kopf.on.event(*TSC, **reg)(cluster_changed)
    kopf.timer(*TSC, interval=config.resync_seconds, **reg)(resync)
    kopf.on.event(*RESERVATIONS, **reg)(reservation_changed)
    kopf.on.delete(*TSC, id="tear_down", **reg)(on_delete)
