"""Thin kopf handlers, the kicks of our watches' changes, and ``register``.

kopf drives TPUSliceClusters, TPUSliceJobs and TPUSliceServices for their finalizer
(``on_delete``) alone. Every kind a pass reads, ours and SliceReservations included,
is followed by ``runtime/informers.py`` into stores, read as indexes through
``store_indexes``; each change is a kick (``objects_changed``,
``reservations_changed``, and the pod, node and KubeRay rules of the informers).
Every decision lives in the pure modules and in the parts that
``reconciler.Reconciler`` wires; every API call in ``runtime/kube.py``.
``register`` only wires these functions into a registry the caller owns; the
functions read what they need from kopf's memo (``config``, ``health``, ``kube``,
made by ``app.py``, and ``watches``, ``indices``, ``reconcilers``, made by
``configure``).

Two tasks per process go over every object, rather than a kopf timer per object
(a task on each): the resync (``resync_forever``: every object has a pass about every
``--resync-seconds``, spread over the interval) and the orphan sweep
(``sweep_forever``: every reservation whose holder is gone).
"""

from __future__ import annotations

import asyncio
import logging
import operator
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar, overload

import kopf

from tpuslice.controller.actuator import PoolIndexCache
from tpuslice.controller.applier import TemplateSchema, controlled_by
from tpuslice.controller.capacity import provisioning_view
from tpuslice.controller.expectations import Expectations
from tpuslice.controller.kinds import KINDS
from tpuslice.controller.pinning import PinFence
from tpuslice.controller.queue import PassSlots
from tpuslice.controller.reconciler import Reconciler, SnapshotReader, spec_shapes
from tpuslice.model import constants as c
from tpuslice.model.convert import (
    gke_slice_info,
    raycluster_info,
)
from tpuslice.model.records import (
    Holder,
    NodeInfo,
    ObjectKey,
    ReservationInfo,
    Reservations,
    Shape,
    ShapeMember,
    Snapshot,
    Usage,
)
from tpuslice.model.topology import DYNAMIC_GENERATION
from tpuslice.planning.partitions import partition_shape
from tpuslice.planning.sweep import orphans, watches_namespace
from tpuslice.policy.placement import limits_apply, usage_by_namespace
from tpuslice.runtime.config import OperatorConfig
from tpuslice.runtime.health import Health
from tpuslice.runtime.informers import (
    Change,
    GroupIndex,
    KeyIndex,
    ReservationRecord,
    Watches,
    node_kicks,
    owned_cluster_kicks,
    pod_kicks,
    release_kicks,
)
from tpuslice.runtime.kube import ClusterApi, Kube
from tpuslice.runtime.kube import credentials as kube_credentials
from tpuslice.runtime.metrics import Metrics
from tpuslice.spec.bounds import SpecLimits
from tpuslice.spec.parts import SliceClusterSpec
from tpuslice.status.kueue import PodsReadyTimeouts

__all__ = [
    "make_reader",
    "register",
    "sweep_once",
    "tear_down",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: How long the API server keeps one of kopf's watch requests open before ending it.
KOPF_WATCH_SERVER_SECONDS = 290
#: How often the event loop tells the liveness probe it is turning.
HEARTBEAT_SECONDS = 1.0
#: How long one call of the finalizer handler waits for a cluster's pods to be gone.
TEARDOWN_WAIT_SECONDS = 60.0

TSC = (c.GROUP, c.VERSION, c.PLURAL_CLUSTER)
TSJ = (c.GROUP, c.VERSION, c.PLURAL_JOB)
TSS = (c.GROUP, c.VERSION, c.PLURAL_SERVICE)
#: plural -> kind, for handlers registered on more than one of our kinds.
KIND_OF_PLURAL = {plural: kind for kind, plural in c.PLURALS.items()}


def _first(store: Iterable[Any] | None) -> Any:
    for item in store or ():
        return item
    return None


# ------------------------------------------------------------ the snapshot reader
#: kind -> the prefix of its indexes (``<prefix>_index``, ``<prefix>_shape_index``,
#: ``store_indexes``).
INDEX_PREFIX = {c.KIND_CLUSTER: "tsc", c.KIND_JOB: "tsj", c.KIND_SERVICE: "tss"}


class _Lazy(Sequence[T]):
    """A sequence read from the stores only when a pass looks at it: most passes never
    read the other members of their shape (``actuator.admission_matters``), and listing
    them costs a store lookup per member (1,000 at a time at scale). Read at the first
    look, not with the rest of the snapshot: a view at most one pass step newer, which the
    queue's decisions take as they take any snapshot (level-based, same rules)."""

    def __init__(self, read: Callable[[], list[T]]) -> None:
        self._read: Callable[[], list[T]] | None = read
        self._items: list[T] = []

    def _all(self) -> list[T]:
        if self._read is not None:
            self._items, self._read = self._read(), None
        return self._items

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[T]: ...
    def __getitem__(self, i: int | slice) -> T | Sequence[T]:
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._all())


def _nodes_of_shapes(watches: Watches, shapes: Sequence[Shape]) -> list[NodeInfo]:
    """The nodes of every shape of an object, each once; one shape's are disjoint already
    (``_nodes_for``), and a pass of the common one-shape object copies no dict of them."""
    if len(shapes) == 1:
        return _nodes_for(watches, shapes[0])
    return list({n.name: n for s in shapes for n in _nodes_for(watches, s)}.values())


def _nodes_for(watches: Watches, shape: Shape | None) -> list[NodeInfo]:
    """The nodes of ``shape``, and its accelerator's nodes without a topology label: a
    TPU7x dynamic-slicing sub-block has none until a GKE Slice forms on it, and is read
    only so that status can say why it is not used. For a partition queue's shape
    (``partitions.partition_shape``) every node of the accelerator: its partitions'
    nodes carry the topology of the Slice formed over them, whatever it is."""
    if not shape:
        return []
    if shape == partition_shape(DYNAMIC_GENERATION):
        return watches.nodes_of_accelerator(shape[0])
    nodes = watches.nodes_of(shape)
    return nodes + watches.nodes_of((shape[0], "")) if shape[1] else nodes


def make_reader(
    indices: Mapping[str, Any], watches: Watches, kind: str = c.KIND_CLUSTER
) -> SnapshotReader:
    """A snapshot reader for objects of ``kind`` over kopf's live indexes and our stores
    (the same objects for the whole run): the object, its pods and KubeRay objects, the
    nodes of its shapes (one per TPU group), and the reservations of its shapes and its
    own (a spec whose shape changed still sees the pools it holds of the old one). A
    shape's queue holds the objects of every kind with a TPU group of that shape."""
    clusters = indices[f"{INDEX_PREFIX[kind]}_index"]
    shape_indexes = [
        (member_kind, indices[f"{prefix}_shape_index"])
        for member_kind, prefix in INDEX_PREFIX.items()
        if f"{prefix}_shape_index" in indices
    ]
    by_shape = indices["reservation_shape_index"]
    by_holder = indices["reservation_holder_index"]

    def read(key: ObjectKey) -> Snapshot:
        policies = watches.policies()
        labels = watches.namespace_labels(key[1]) if policies else {}
        usage = (
            usage_by_namespace(by_shape).get(key[1], Usage())
            if limits_apply(policies, labels)
            else Usage()
        )
        cluster = _first(clusters.get(key[1:]))
        shapes = spec_shapes(cluster) if cluster is not None else ()
        uid = (cluster or {}).get("metadata", {}).get("uid", "")
        # copies of the store's groups now (a pass awaits, and the stores move on); the
        # whole list is merged only if the pass reads it (``Reservations``)
        of_shapes = [list(by_shape.get(shape, ())) for shape in shapes]
        own = list(by_holder.get(uid, ()))

        def every() -> list[ReservationInfo]:
            return [info for infos in of_shapes for info in infos] + own

        def members() -> list[ShapeMember]:
            out = []
            seen = {uid}  # an object of several shapes is one member (its groups apart)
            usages = usage_by_namespace(by_shape) if policies else {}
            for member_kind, index in shape_indexes:
                others = [other for shape in shapes for other in list(index.get(shape, ()))]
                for other in others:
                    meta = other.get("metadata") or {}
                    if meta.get("uid") not in seen:
                        seen.add(meta.get("uid"))
                        ns = meta.get("namespace", "")
                        other_key = (member_kind, ns, meta.get("name", ""))
                        member = ShapeMember(other, watches.pods_of(other_key))
                        if policies:
                            member = replace(
                                member,
                                namespace_labels=watches.namespace_labels(ns),
                                namespace_usage=usages.get(ns, Usage()),
                            )
                        out.append(member)
            return out

        ray = watches.ray_object(key)
        own_raycluster = c.RAY_KIND_OF[kind] == c.RAY_KIND_CLUSTER
        provisioning = provisioning_view(
            watches.requests_of(key),
            watches.templates_of(key),
            watches.every_request(),
            key,
        )
        return Snapshot(
            cluster=cluster,
            pods=watches.pods_of(key),
            nodes=_nodes_of_shapes(watches, shapes),
            reservations=Reservations(every, lambda u: own if u == uid else None),
            raycluster=ray if own_raycluster else None,
            owned=None if own_raycluster else ray,
            rayclusters=watches.owned_clusters(key),
            shape_members=_Lazy(members),
            provisioning=provisioning,
            policies=policies,
            namespace_labels=labels,
            namespace_usage=usage,
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


class NoEssence(kopf.DiffBaseStorage):
    """kopf's change detection with nothing to compare: every object's essence is empty,
    fetched as empty and never stored.

    kopf keeps an object's "last handled" essence (by default in an annotation) to tell a
    create from an update from a resume, for handlers of those causes and their diffs.
    The operator has none: every change runs the one pass, kicked by events, and its only
    changing handler is the deletion's, which kopf finds by the deletionTimestamp alone.
    Stored, the essence would cost a PATCH of every new object (and one per change of
    its labels or annotations) and a deep copy of the whole body on every event; an
    annotation with the spec in it could also outgrow the 256 KiB that every annotation
    of an object together may hold (apimachinery's TotalAnnotationSizeLimitB), and then
    kopf could never patch the object again, its finalizer included. kopf documents
    custom diff-base storages (``kopf.DiffBaseStorage``, "Persistence" in its docs)."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return kopf.BodyEssence()

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def _configure_kopf(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    settings.persistence.finalizer = config.finalizer
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = NoEssence()
    settings.posting.level = logging.WARNING
    # Bounded watches of our kinds (kopf's default is none):
    # the server ends each after server_timeout, the client gives up on a silent
    # connection after client_timeout, so a half-open stream cannot hide.
    settings.watching.server_timeout = KOPF_WATCH_SERVER_SECONDS
    settings.watching.client_timeout = KOPF_WATCH_SERVER_SECONDS + 30
    settings.watching.connect_timeout = 30


def store_indexes(watches: Watches) -> dict[str, Mapping[Any, Any]]:
    """Our stores of TPUSlice objects and SliceReservations, read as the indexes the
    snapshot reader, the finalizer and the sweep take: ``<prefix>_index`` by (namespace,
    name), ``<prefix>_shape_index`` by shape, reservations by shape and by holder uid.

    kopf keeps no index: it holds every handler until each indexed object has been
    indexed, through a toggle per object whose every change wakes every waiter, so N
    objects cost about N²/2 wake-ups at start-up (docs/architecture.md, "kopf, and what it
    is not patched for"); our watches list each kind in pages instead."""
    out: dict[str, Mapping[Any, Any]] = {}
    for kind, prefix in INDEX_PREFIX.items():
        out[f"{prefix}_index"] = KeyIndex(watches.objects(kind))
        out[f"{prefix}_shape_index"] = GroupIndex(watches.objects(kind))
    out["reservation_shape_index"] = GroupIndex(watches.slicereservations, "shape", _info)
    out["reservation_holder_index"] = GroupIndex(watches.slicereservations, "holder", _info)
    return out


#: A reservation record's info (a C-level getter: the reader projects a whole shape's
#: records in every pass).
_info: Callable[[ReservationRecord], ReservationInfo] = operator.itemgetter(1)


async def configure(
    settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **_: Any
) -> None:
    """Start-up: kopf's settings, our watches (every kind listed once before any pass), the
    reconcilers (kicks held until then), the heartbeat and the sweep."""
    config: OperatorConfig = memo.config
    metrics: Metrics = memo.metrics
    _configure_kopf(settings, config)
    health: Health = memo.health
    memo.heartbeat = asyncio.get_running_loop().create_task(_beat(health))
    kube: Kube = memo.kube  # made by app.run_operator, shared with leader election
    watches = Watches(object_shapes=spec_shapes)
    indices = store_indexes(watches)
    memo.indices = indices
    # One record of our writes, one index of the pools and one template schema for every
    # kind: a pass of one kind sees the claims a pass of another made a moment ago.
    pending, pool_indexes, templates = Expectations(), PoolIndexCache(), TemplateSchema(kube)
    slots = PassSlots(config.concurrent_passes)
    fence = PinFence(
        kube,
        pending,
        enabled=config.pin_at_admission,
        fence_s=config.webhook_timeout_seconds + config.pin_fence_margin_seconds,
        kick_later=lambda key, seconds: (
            memo.reconcilers[key[0]].queue.kick_later(key, seconds)
            if key[0] in memo.reconcilers
            else None
        ),
    )
    memo.fence = fence
    reconcilers = {
        kind: Reconciler(
            kube,
            make_reader(indices, watches, kind),
            metrics=metrics,
            pending=pending,
            pool_indexes=pool_indexes,
            schema=templates,
            adapter=adapter,
            limits=SpecLimits(config.max_slices_per_object, config.max_hosts_per_object),
            slots=slots,
            fence=fence,
            pods_ready=PodsReadyTimeouts(
                config.kueue_pods_ready_timeout_s, config.kueue_pods_ready_recovery_timeout_s
            ),
            status_batch_seconds=config.status_batch_seconds,
        )
        for kind, adapter in KINDS.items()
    }
    reconciler = reconcilers[c.KIND_CLUSTER]
    memo.watches, memo.reconciler = watches, reconciler
    memo.reconcilers = reconcilers
    memo.indexed = asyncio.Event()
    for each in memo.reconcilers.values():
        each.hold_until_indexed()
    shape_index = indices["reservation_shape_index"]

    def holders_of(shape: Shape, units: set[str]) -> set[ObjectKey]:
        """The holders of any of ``units`` (pools, or single-host nodes), and the owner of
        a revoked request kept for one of them (it deletes the request once the pool has
        no nodes). A node of the dynamic generation may be a partition's, whose claim is
        of the partition queue's shape."""
        shapes = [shape]
        if shape[0] == DYNAMIC_GENERATION:
            shapes.append(partition_shape(DYNAMIC_GENERATION))
        held = {r.holder.owner for s in shapes for r in shape_index.get(s, ()) if r.pool in units}
        return held | {r.owner for r in watches.every_request() if r.info.lost_pool in units}

    def waiters(shape: Shape) -> set[ObjectKey]:
        """Those waiting for ``shape``; for a node of the dynamic generation, of any
        topology or none, also those waiting in its partition queue."""
        keys = waiting_for(memo, shape)
        if shape[0] == DYNAMIC_GENERATION:
            keys |= waiting_for(memo, partition_shape(DYNAMIC_GENERATION))
        return keys

    def hosts_of(key: ObjectKey, group: str) -> int | None:
        """Hosts per slice of an object's worker group, from its spec (parsed once per
        generation by the shape's spec cache); None when unknown or not gated."""
        prefix = INDEX_PREFIX.get(key[0])
        each = memo.reconcilers.get(key[0])
        if prefix is None or each is None or f"{prefix}_index" not in indices:
            return None
        cluster = _first(indices[f"{prefix}_index"].get(key[1:]))
        return (
            None if cluster is None else hosts_per_slice(each.actuator.specs.parse(cluster), group)
        )

    def on_pods(changes: list[Any]) -> None:
        releasing = release_kicks(changes, watches.pods_of, hosts_of)
        kick_owners(memo, pod_kicks(changes) - releasing)
        kick_owners(memo, releasing, releasing=True)

    def on_nodes(changes: list[Any]) -> None:
        shapes, keys = node_kicks(changes, waiters, holders_of)
        if any(shape[0] == DYNAMIC_GENERATION for shape in shapes):
            shapes.add(partition_shape(DYNAMIC_GENERATION))  # its index reads them all
        for shape in shapes:
            reconciler.nodes_changed(shape)
        kick_owners(memo, keys)

    await watches.start(
        kube,
        config.namespaces,
        on_pods=on_pods,
        on_nodes=on_nodes,
        on_rayclusters=lambda changes: reconciler.kick_soon(
            {(c.KIND_CLUSTER, *ch.key) for ch in changes}
        ),
        on_owned=lambda changes, _kind: kick_owners(memo, owned_cluster_kicks(changes)),
        on_requests=lambda changes: kick_owners(memo, {ch.record.owner for ch in changes}),
        on_policies=lambda _changes: kick_every_object(memo, indices),
        on_objects=lambda changes, kind: objects_changed(memo, changes, kind),
        on_reservations=lambda changes: reservations_changed(memo, changes),
    )
    _indexed(memo)  # every store is listed: the held kicks run
    logger.info(
        "listed %d TPUSlice objects, %d SliceReservations, %d TPU nodes, %d pods and "
        "%d RayClusters of TPUSliceClusters",
        sum(len(watches.objects(kind)) for kind in INDEX_PREFIX),
        len(watches.slicereservations),
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
        sweep_forever(kube, indices, watches, memo.indexed, config, fence=fence)
    )
    memo.resyncer = asyncio.get_running_loop().create_task(resync_forever(memo, config))
    health.started()


async def stop(memo: kopf.Memo, **_: Any) -> None:
    if "watches" in memo:
        memo.watches.stop()
    for task in ("heartbeat", "sweeper", "resyncer"):
        if memo.get(task) is not None:
            memo[task].cancel()


# ------------------------------------------------------------ triggers
def _indexed(memo: kopf.Memo) -> None:
    """Every store is listed: release the kicks that waited for it."""
    for reconciler in memo.reconcilers.values():
        reconciler.indexed()
    memo.indexed.set()


def kick_owners(memo: kopf.Memo, owners: Iterable[ObjectKey], releasing: bool = False) -> None:
    """Kick each owner (kind, namespace, name) in the reconciler of its kind
    (``releasing``: in the release lane, ``informers.release_kicks``)."""
    by_kind: dict[str, set[ObjectKey]] = {}
    for key in owners:
        by_kind.setdefault(key[0], set()).add(key)
    for kind, keys in by_kind.items():
        if kind in memo.reconcilers:
            memo.reconcilers[kind].kick_soon(keys, releasing=releasing)


def hosts_per_slice(spec: SliceClusterSpec | None, group: str) -> int | None:
    """Hosts per slice of the TPU group named ``group`` (``ray.io/group``) of a parsed
    spec; None for an invalid or ungated spec, or a group it has not (a CPU group)."""
    if spec is None or not spec.gated:
        return None
    for each in spec.tpu_groups():
        if each.group_name == group:
            return each.shape.hosts
    return None


def kick_every_object(memo: kopf.Memo, indices: Mapping[str, Any]) -> None:
    """A TPUSlicePolicy or a Namespace's labels changed: a pass for every TPUSlice
    object (of every namespace, not only those the change affects: policies change
    rarely, and each pass of an unaffected object finds nothing to do)."""
    keys = {
        (kind, *name)
        for kind, prefix in INDEX_PREFIX.items()
        if f"{prefix}_index" in indices
        for name in list(indices[f"{prefix}_index"].keys())
    }
    kick_owners(memo, keys)


def waiting_for(memo: kopf.Memo, shape: Shape) -> set[ObjectKey]:
    """Every object, of any kind, with a slice waiting for capacity of ``shape``."""
    return {
        key for reconciler in memo.reconcilers.values() for key in reconciler.waiting_for(shape)
    }


def objects_changed(memo: kopf.Memo, changes: Iterable[Change[dict[str, Any]]], kind: str) -> None:
    """TPUSliceClusters, TPUSliceJobs or TPUSliceServices changed (our watch of ``kind``):
    a pass for each, unless a change changed nothing a pass reads
    (``convert.pass_inputs``: our status patch, kopf's finalizer); added or deleted, its
    shapes' queues changed and their waiting move on."""
    reconciler = memo.reconcilers[kind]
    kicks: set[ObjectKey] = set()
    for change in changes:
        key = (kind, *change.key)
        if change.old is None or change.new is None:
            for shape in spec_shapes(change.record):
                kicks |= waiting_for(memo, shape) - {key}
        if change.new is None:
            uid = str((change.record.get("metadata") or {}).get("uid") or "")
            reconciler.forget(key, uid=uid)
            kicks.discard(key)
        elif reconciler.inputs_changed(key, change.new):
            kicks.add(key)
    kick_owners(memo, kicks)


def resync_slot(key: ObjectKey, slots: int) -> int:
    """Which of ``slots`` steps of the resync interval the object ``key`` has its pass in:
    a hash of its key, so the objects spread over the interval, and each keeps its step
    across restarts and across the other objects coming and going."""
    return zlib.crc32("/".join(key).encode()) % slots


async def resync_forever(
    memo: kopf.Memo,
    config: OperatorConfig,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """The safety net under the events: every object of every kind has a pass about every
    ``config.resync_seconds``, in steps of about a second (``resync_slot``), so a
    thousand objects are a few passes a second, not a thousand at once. Each pass reads
    the stores as any other (a kick while one runs folds into it) and waits in the
    re-pass lane, behind first passes and releases. The first step comes one step after
    start-up: each object's listing already gave it a pass."""
    await memo.indexed.wait()
    slots = max(1, round(config.resync_seconds))
    step = 0
    while True:
        await sleep(config.resync_seconds / slots)
        step = (step + 1) % slots
        due = {
            (kind, *name)
            for kind in memo.reconcilers
            for name in memo.watches.objects(kind).object_keys()
            if resync_slot((kind, *name), slots) == step
        }
        kick_owners(memo, due)


def reservations_changed(memo: kopf.Memo, changes: Iterable[Change[ReservationRecord]]) -> None:
    """SliceReservations changed (our watch): a pass for each holder; a pool freed or
    taken moves its shape's queue, so those waiting for the shape get one too."""
    metrics: Metrics = memo.metrics
    kicks: set[ObjectKey] = set()
    for change in changes:
        shape, info = change.record
        kicks.add(info.holder.owner)
        if change.new is None:
            metrics.reservation_gone(info.pool)
            memo.reconciler.pending.reservation_gone(info.pool, info.uid)
        else:
            metrics.reservation_seen(info.pool, info.phase)
        if change.old is None or change.new is None:
            kicks |= waiting_for(memo, shape)
    kick_owners(memo, kicks)


# ------------------------------------------------------------ release
async def tear_down(
    kube: ClusterApi,
    watches: Watches,
    holder_index: Mapping[str, Iterable[ReservationInfo]],
    namespace: str,
    name: str,
    uid: str,
    wait_seconds: float = TEARDOWN_WAIT_SECONDS,
    kind: str = c.KIND_CLUSTER,
    fence: PinFence | None = None,
) -> list[str]:
    """Delete the object's RayCluster (RayJob, RayService; only if this object controls
    it), wait until its worker pods (which hold chips) are gone, then release every
    reservation it holds. The pods still there after ``wait_seconds`` (nothing released
    then).

    The wait is on our pod store, for up to a minute per call: each kopf retry
    patches the object's progress annotation, and retrying every 2 s while 1,000
    clusters were torn down sent ~100 patches a second."""
    plural = c.RAY_PLURALS[c.RAY_KIND_OF[kind]]
    key = (kind, namespace, name)
    ours = watches.ray_object(key)
    if ours is None:  # not labelled (someone removed our label), or none at all
        found = await kube.get_ray(plural, namespace, name)
        ours = None if found is None else raycluster_info(found)
    if ours is not None and controlled_by(ours["ownerReferences"], uid):
        await kube.delete_ray(plural, namespace, name, ours["uid"])
    # else: none, or another's object of that name: never deleted.
    remaining = await watches.pods_gone(key, wait_seconds)
    if remaining:
        return [p.name for p in remaining]
    # its GKE Slices (dynamic slices) go before the reservations of their partitions,
    # which are freed only once GKE's finalizer let the Slices go
    held = list(holder_index.get(uid, ()))
    if held:
        slices = [gke_slice_info(o) for o in await kube.list_gke_slices()]
        mine = [s for s in slices if s.owner == key and s.owner_uid in ("", uid)]
        for s in mine:
            if not s.deleting:
                await kube.delete_gke_slice(s.name, s.uid)
        if mine:
            return [f"GKE Slice {s.name}" for s in mine]
    fenced = []
    for info in held:
        if fence is not None and not await fence.let_go(info):
            fenced.append(f"node pool {info.pool} (pin at admission's fence)")
            continue
        await kube.delete_reservation(info.pool, info.uid)
    return fenced


async def on_delete(
    namespace: str | None,
    name: str,
    uid: str,
    memo: kopf.Memo,
    resource: kopf.Resource,
    **_: Any,
) -> None:
    """The finalizer of a TPUSliceCluster, TPUSliceJob or TPUSliceService: ``tear_down``,
    retried by kopf while pods remain."""
    kind = KIND_OF_PLURAL[resource.plural]
    key = (kind, namespace or "", name)
    remaining = await tear_down(
        memo.kube,
        memo.watches,
        memo.indices["reservation_holder_index"],
        *key[1:],
        uid,
        kind=kind,
        fence=memo.fence,
    )
    if remaining:
        raise kopf.TemporaryError(
            f"waiting for {len(remaining)} worker pods (or GKE Slices) to go before "
            "releasing node pools or partitions",
            delay=1,
        )
    memo.reconcilers[kind].forget(key, uid=uid)


# ------------------------------------------------------------ the sweep
async def sweep_once(
    kube: ClusterApi,
    indices: Mapping[str, Any],
    watches: Watches,
    namespaces: Iterable[str],
    fence: PinFence | None = None,
) -> list[str]:
    """Delete every reservation whose holder (of any kind) no longer exists and whose
    pods are gone, if the holder is in a namespace this instance watches; the pools
    given back. Each delete
    is conditional on the reservation's uid (a new claim of the pool is never deleted)."""
    every = [info for infos in list(indices["reservation_holder_index"].values()) for info in infos]

    def live_uid(holder: Holder) -> str | None:
        prefix = INDEX_PREFIX.get(holder.kind)
        if prefix is None:  # a kind this version does not reconcile: never swept
            return holder.uid
        cluster = _first(indices[f"{prefix}_index"].get((holder.namespace, holder.name)))
        uid = (cluster or {}).get("metadata", {}).get("uid")
        return str(uid) if uid else None

    def replica_has_pods(holder: Holder) -> bool:
        return any(holder.replica_name in p.slice_names for p in watches.pods_of(holder.owner))

    found = orphans(every, live_uid, replica_has_pods, tuple(namespaces))
    # A gone holder's GKE Slices (dynamic slices) go first; its partitions are freed in
    # a later round, once GKE's finalizer let its Slices go.
    with_slices: set[tuple[ObjectKey, str]] = set()
    if found:
        watched = tuple(namespaces)
        for s in (gke_slice_info(o) for o in await kube.list_gke_slices()):
            if s.owner is None or not watches_namespace(watched, s.owner[1]):
                continue
            holder = Holder(s.owner[1], s.owner[2], s.owner_uid, s.replica_name, kind=s.owner[0])
            if live_uid(holder) == s.owner_uid:
                continue
            with_slices.add((s.owner, s.owner_uid))
            if not s.deleting and await kube.delete_gke_slice(s.name, s.uid):
                log.info("deleted GKE Slice %s: its holder %s is gone", s.name, holder.describe())
    freed = []
    for info in found:
        if (info.holder.owner, info.holder.uid) in with_slices:
            continue
        if fence is not None and not await fence.let_go(info):
            continue
        if await kube.delete_reservation(info.pool, info.uid):
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
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    fence: PinFence | None = None,
) -> None:
    """``sweep_once`` every ``config.sweep_seconds``, never before every store is listed
    (an empty index of clusters would make every holder look gone). ``sleep`` is the pause
    between rounds; a test passes a fake one to run the rounds at its own pace."""
    await indexed.wait()
    while True:
        await sleep(config.sweep_seconds)
        try:
            await sweep_once(kube, indices, watches, config.namespaces, fence)
        except Exception as exc:  # the next round tries again
            log.warning("the orphan sweep failed: %s", exc)


# ------------------------------------------------------------ wiring
def register(registry: kopf.OperatorRegistry) -> None:
    """Wire every handler into ``registry``. The memo that ``kopf.run`` gets must hold
    ``config``, ``health``, ``kube`` and ``metrics`` (``app.py`` makes it)."""
    reg: dict[str, Any] = {"registry": registry}
    kopf.on.login(**reg)(login)
    kopf.on.startup(**reg)(configure)
    kopf.on.cleanup(**reg)(stop)
    for resource in (TSC, TSJ, TSS):
        kopf.on.delete(*resource, id="tear_down", **reg)(on_delete)
