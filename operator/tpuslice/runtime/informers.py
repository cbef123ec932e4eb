"""Following a kind into memory: list+watch loops, the stores they fill, and the kicks.

Every kind a pass reads is followed here, our own included: kopf handles only the
finalizer of TPUSliceClusters, TPUSliceJobs and TPUSliceServices, and keeps no
index. kopf keeps a worker, a queue and
per-object state for every watched object, and its start-up waits for every
indexed object with a cost that grows with the square of their number
(measured: minutes at 4,000 nodes, 24 s at 1,000 TSCs and 1,000 reservations,
docs/performance.md). Here each kind is listed in pages and watched on a
thread of its own, objects are shrunk into small records on that thread, and
the records are folded into a ``RecordStore`` on the event loop. What each
change kicks is decided by pure functions (``pod_kicks``, ``node_kicks``).
``Watches.start`` returns only when every kind has been listed once, so no
pass ever sees a half-filled store.

Top to bottom: ``Change`` and ``RecordStore`` (pure), ``Followed`` (what a kind
is and how to shrink it), ``apply`` (a delivery folded into a store), the kick
rules, ``followed_kinds`` (what we follow, for RBAC), ``Watches`` (the
stores), and ``follow`` with its loop, the only code here that calls the API
server (through ``kube.Kube``'s transport, counted in its metrics).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tpuslice.model import constants as c
from tpuslice.model.convert import (
    cluster_record,
    namespace_labels,
    node_info,
    owned_request,
    pod_info,
    podtemplate_record,
    ray_owner_info,
    raycluster_info,
    reservation_info,
    reservation_shape,
)
from tpuslice.model.records import (
    NodeInfo,
    ObjectKey,
    OwnedRequest,
    PodInfo,
    ReservationInfo,
    Shape,
)
from tpuslice.model.wire import decode_event, decode_page
from tpuslice.policy.records import Policy, PolicyError, read_policy
from tpuslice.runtime.kube import ApiError, Kube, api_path

__all__ = [
    "Change",
    "Deliver",
    "Followed",
    "GroupIndex",
    "KeyIndex",
    "NamespacedName",
    "RecordStore",
    "ReservationRecord",
    "Watches",
    "apply",
    "follow",
    "follow_forever",
    "followed_kinds",
    "iter_lines",
    "node_kicks",
    "object_key",
    "owned_cluster_kicks",
    "pod_kicks",
    "policy_record",
    "release_kicks",
    "reservation_record",
]

log = logging.getLogger(__name__)

#: A watch request ends after this long and is reopened from the last resourceVersion.
WATCH_SECONDS = 290

LIST_PAGE_SIZE = 500

#: How often to look again for a kind whose CRD is missing (KubeRay installed later).
MISSING_KIND_RETRY_SECONDS = 30.0

R = TypeVar("R")
NamespacedName = tuple[str, str]  # (namespace or "", name)


@dataclass(frozen=True)
class Change(Generic[R]):
    """One object's record before and after (None: absent); both None never happens."""

    key: NamespacedName
    old: R | None
    new: R | None

    @property
    def deleted(self) -> bool:
        return self.new is None

    @property
    def record(self) -> R:
        """The current record, or the last one of a deleted object."""
        record = self.new if self.new is not None else self.old
        assert record is not None
        return record


@dataclass
class RecordStore(Generic[R]):
    """Records by object key, and by the group key ``group_of`` gives each record; or, with
    ``groups_of``, by each of the keys it gives (a TPUSlice object is a member of the queue
    of each shape it has; a reservation is found by its shape and by its holder)."""

    group_of: Callable[[R], Hashable]
    groups_of: Callable[[R], Iterable[Hashable]] | None = None
    _records: dict[NamespacedName, R] = field(default_factory=dict)
    _groups: dict[Hashable, dict[NamespacedName, R]] = field(default_factory=dict)
    #: with ``groups_of``: the groups each record was put in, so taking it out again does
    #: not call ``groups_of`` a second time (for our kinds, a parse of the spec)
    _member_of: dict[NamespacedName, tuple[Hashable, ...]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: NamespacedName) -> R | None:
        return self._records.get(key)

    def values(self) -> list[R]:
        return list(self._records.values())

    def group(self, group: Hashable) -> list[R]:
        return list(self._groups.get(group, {}).values())

    def object_keys(self) -> list[NamespacedName]:
        return list(self._records)

    def group_keys(self) -> list[Hashable]:
        return list(self._groups)

    def groups_where(self, wanted: Callable[[Hashable], bool]) -> list[R]:
        """The records of every group whose key ``wanted`` accepts."""
        return [
            r for g, members in list(self._groups.items()) if wanted(g) for r in members.values()
        ]

    def put(self, key: NamespacedName, record: R) -> Change[R]:
        old = self._records.get(key)
        if old is not None:
            self._ungroup(key, old)
        self._records[key] = record
        groups = self._groups_of(record)
        if self.groups_of is not None:
            self._member_of[key] = groups
        for group in groups:
            self._groups.setdefault(group, {})[key] = record
        return Change(key, old, record)

    def remove(self, key: NamespacedName) -> Change[R] | None:
        old = self._records.pop(key, None)
        if old is None:
            return None
        self._ungroup(key, old)
        return Change(key, old, None)

    def replace(self, records: Mapping[NamespacedName, R], namespace: str = "") -> list[Change[R]]:
        """Make the store equal to a fresh listing (of one ``namespace``, or of all when
        empty); the changes a watch would have shown.

        Objects gone from the listing come back as deletions, so a relist after a
        dropped watch (410 Gone) loses no DELETED event."""
        gone = [
            k for k in self._records if k not in records and (not namespace or k[0] == namespace)
        ]
        changes = [change for key in gone if (change := self.remove(key)) is not None]
        for key, record in records.items():
            if self._records.get(key) != record:
                changes.append(self.put(key, record))
        return changes

    def _groups_of(self, record: R) -> tuple[Hashable, ...]:
        if self.groups_of is not None:
            return tuple(dict.fromkeys(self.groups_of(record)))
        return (self.group_of(record),)

    def _ungroup(self, key: NamespacedName, record: R) -> None:
        if self.groups_of is not None:
            groups = self._member_of.pop(key, ())
        else:
            groups = (self.group_of(record),)
        for group in groups:
            members = self._groups.get(group)
            if members is not None:
                members.pop(key, None)
                if not members:
                    del self._groups[group]


class KeyIndex(Mapping[NamespacedName, list[R]]):
    """A store read as an index by object key: (namespace, name) -> [its record] (the form
    of the indexes the snapshot reader, the finalizer and the sweep read)."""

    def __init__(self, store: RecordStore[R]) -> None:
        self._store = store

    def __getitem__(self, key: NamespacedName) -> list[R]:
        record = self._store.get(key)
        if record is None:
            raise KeyError(key)
        return [record]

    def __iter__(self) -> Iterator[NamespacedName]:
        return iter(self._store.object_keys())

    def __len__(self) -> int:
        return len(self._store)


class GroupIndex(Mapping[Hashable, list[Any]]):
    """A store read as an index by group: each group key ``tag`` marks (``(tag, key)``;
    every group when ``tag`` is None) -> the records of the group, each through
    ``project``."""

    def __init__(
        self,
        store: RecordStore[R],
        tag: str | None = None,
        project: Callable[[R], Any] = lambda record: record,
    ) -> None:
        self._store, self._tag, self._project = store, tag, project

    def __getitem__(self, key: Hashable) -> list[Any]:
        records = self._store.group(key if self._tag is None else (self._tag, key))
        if not records:
            raise KeyError(key)
        return list(map(self._project, records))

    def __iter__(self) -> Iterator[Hashable]:
        for group in self._store.group_keys():
            if self._tag is None:
                yield group
            elif isinstance(group, tuple) and len(group) == 2 and group[0] == self._tag:
                yield group[1]

    def __len__(self) -> int:
        return sum(1 for _ in self)


Deliver = Callable[[str | None, dict[NamespacedName, Any]], None]


@dataclass(frozen=True)
class Followed:
    """A kind the operator lists and watches itself, and how to shrink its objects."""

    group: str
    version: str
    plural: str
    convert: Callable[[Mapping[str, Any]], Any]
    label_selector: str = ""
    namespace: str = ""  # "" for all namespaces (and for cluster-scoped kinds)
    #: ``convert`` reads ``metadata.managedFields``, which are otherwise never decoded
    #: (``model.wire``).
    managed_fields: bool = False

    def path(self) -> str:
        return api_path(self.group, self.version, self.plural, namespace=self.namespace)

    def query(self) -> dict[str, str]:
        return {"labelSelector": self.label_selector} if self.label_selector else {}


def object_key(obj: Mapping[str, Any]) -> NamespacedName:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def iter_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Whole lines out of a stream of chunks (a watch sends one JSON event per line)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from (line for line in lines if line.strip())
    if pending.strip():
        yield pending


POD_GONE_POLL_SECONDS = 0.5


def _pod_group(pod: PodInfo) -> ObjectKey:
    return pod.owner


def _job_cluster_group(cluster: Mapping[str, Any]) -> ObjectKey:
    return c.KIND_JOB, cluster["namespace"], cluster["labels"].get(c.LABEL_JOB, "")


def _service_cluster_group(cluster: Mapping[str, Any]) -> ObjectKey:
    return c.KIND_SERVICE, cluster["namespace"], cluster["labels"].get(c.LABEL_SERVICE, "")


def _node_group(node: NodeInfo) -> Shape:
    return node.accelerator, node.topology


def _no_group(_: Any) -> None:
    return None


def _request_group(record: OwnedRequest) -> ObjectKey:
    return record.owner


def _template_group(record: Mapping[str, Any]) -> ObjectKey:
    return record["owner"]  # type: ignore[no-any-return]


#: A SliceReservation's record: its shape (``convert.reservation_shape``) and its info.
ReservationRecord = tuple[Shape, ReservationInfo]


def reservation_record(obj: Mapping[str, Any]) -> ReservationRecord:
    return reservation_shape(obj), reservation_info(obj)


def _reservation_groups(record: ReservationRecord) -> tuple[Hashable, ...]:
    shape, info = record
    return (("shape", shape), ("holder", info.holder.uid))


def apply(
    store: RecordStore[Any],
    event: str | None,
    records: Mapping[NamespacedName, Any],
    namespace: str = "",
) -> list[Change[Any]]:
    """Fold one delivery (a listing of ``namespace`` or of all, or one watch event) into
    ``store``; the real changes.

    A MODIFIED whose record equals the stored one (a node heartbeat, a pod status
    field we do not keep) is no change at all."""
    if event is None:
        return store.replace(records, namespace)
    changes = []
    for key, record in records.items():
        if event == "DELETED":
            gone = store.remove(key)
            if gone is not None:
                changes.append(gone)
        elif store.get(key) != record:
            changes.append(store.put(key, record))
    return changes


def pod_kicks(changes: Iterable[Change[PodInfo]]) -> set[ObjectKey]:
    """The owners (TPUSliceCluster, TPUSliceJob or TPUSliceService) of changed pods."""
    return {_pod_group(ch.record) for ch in changes}


def release_kicks(
    changes: Iterable[Change[PodInfo]],
    pods_of: Callable[[ObjectKey], list[PodInfo]],
    hosts_of: Callable[[ObjectKey, str], int | None],
) -> set[ObjectKey]:
    """The owners whose next pass may release a slice: a changed pod, carrying our gate
    (and no gate of Kueue's) and not being deleted, whose slice now has all its pods
    (``hosts_of`` the pod's owner and worker group: hosts per slice; None when unknown or
    not gated), each carrying our gate and none being deleted. Such a pass goes ahead of
    re-passes (``queue.Lane.RELEASE``): it is the one that ungates the slice, whether its
    pool is held already or is claimed in the same pass.

    Read off the pod records alone; a slice completes once, so this is true for about one
    change per slice (the last pod's creation), not for the changes that follow (the
    release itself ungates the pods)."""
    keys: set[ObjectKey] = set()
    hosts: dict[tuple[ObjectKey, str], int | None] = {}
    slices: dict[ObjectKey, dict[tuple[str, str, str], list[PodInfo]]] = {}

    def slice_of(pod: PodInfo) -> tuple[str, str, str] | None:
        wanted = (pod.owner, pod.group)
        if wanted not in hosts:
            hosts[wanted] = hosts_of(*wanted)
        per_slice = hosts[wanted]
        name = pod.slice_name(per_slice) if per_slice else None
        return None if name is None else (pod.group, pod.ray_cluster, name)

    for ch in changes:
        pod = ch.new
        if pod is None or not pod.gated or pod.deleting or pod.kueue_gated:
            continue
        owner = pod.owner
        key = None if owner in keys else slice_of(pod)
        if key is None:
            continue
        if owner not in slices:  # the owner's pods by slice, once per delivery
            by_slice: dict[tuple[str, str, str], list[PodInfo]] = {}
            for other in pods_of(owner):
                if (its := slice_of(other)) is not None:
                    by_slice.setdefault(its, []).append(other)
            slices[owner] = by_slice
        mates = slices[owner].get(key, [])
        wanted = hosts[(owner, pod.group)] or 0
        if (
            len(mates) == wanted
            and len({p.host_index for p in mates}) == wanted
            and all(p.gated and not p.deleting and not p.kueue_gated for p in mates)
        ):
            keys.add(owner)
    return keys


def owned_cluster_kicks(changes: Iterable[Change[dict[str, Any]]]) -> set[ObjectKey]:
    """The TPUSliceJobs / TPUSliceServices whose RayClusters (made by KubeRay) changed."""
    keys: set[ObjectKey] = set()
    for ch in changes:
        labels = ch.record["labels"]
        namespace = ch.record["namespace"]
        if labels.get(c.LABEL_JOB):
            keys.add((c.KIND_JOB, namespace, labels[c.LABEL_JOB]))
        if labels.get(c.LABEL_SERVICE):
            keys.add((c.KIND_SERVICE, namespace, labels[c.LABEL_SERVICE]))
    return keys


def node_kicks(
    changes: Iterable[Change[NodeInfo]],
    waiting_for: Callable[[Shape], set[ObjectKey]],
    holders_of: Callable[[Shape, set[str]], set[ObjectKey]],
) -> tuple[set[Shape], set[ObjectKey]]:
    """The shapes whose pool index is stale, and the objects to kick: those waiting for
    capacity of the shape, and the holder of each changed node's unit (its pool, or the
    node itself for a single-host slice). ``holders_of(shape, units)`` is asked once per
    shape for every unit of the batch: a listing delivers every node of a shape at once."""
    units: dict[Shape, set[str]] = {}
    for ch in changes:
        for record in (ch.old, ch.new):
            if record is None:
                continue
            units.setdefault(_node_group(record), set()).update((record.pool, record.name))
    keys: set[ObjectKey] = set()
    for shape, names in units.items():
        keys |= holders_of(shape, names) | waiting_for(shape)
    return set(units), keys


def policy_record(obj: Mapping[str, Any]) -> Policy | None:
    """A TPUSlicePolicy as enforced (``policy.records.read_policy``: one with a bad field
    but a readable selector fails closed); None, logged, for one whose
    ``spec.namespaceSelector`` cannot be read (it governs nobody)."""
    try:
        return read_policy(obj)
    except PolicyError as exc:
        log.warning("ignoring %s (no namespace selector to enforce it on)", exc)
        return None


def followed_kinds(namespaces: Iterable[str]) -> list[Followed]:
    """What the operator lists and watches itself (the chart grants list+watch on each):
    TPU nodes; the pods labelled with a TPUSlice object; the RayClusters of
    TPUSliceClusters; the RayJobs and RayServices of TPUSliceJobs and TPUSliceServices and
    the RayClusters KubeRay makes for them (labelled by KubeRay with the owner's labels);
    our ProvisioningRequests and their PodTemplates (labelled with their object; a missing
    ProvisioningRequest CRD is an empty store, looked for again every 30 s);
    per namespace when the operator is namespace-scoped. TPUSlicePolicies and the labels
    of every Namespace (which policies govern it) are followed cluster-wide in any case,
    and so are SliceReservations (cluster-scoped). Our own kinds, TPUSliceClusters,
    TPUSliceJobs and TPUSliceServices, too: kopf watches them as well, for their finalizer,
    but keeps no index of them (``handlers.store_indexes`` reads these stores)."""
    kinds = [
        Followed("", "v1", "nodes", node_info, c.NODE_LABEL_ACCELERATOR),
        Followed(c.GROUP, c.VERSION, c.PLURAL_POLICY, policy_record),
        Followed("", "v1", "namespaces", namespace_labels),
        Followed(c.GROUP, c.VERSION, c.PLURAL_RESERVATION, reservation_record),
    ]
    ray = (c.RAY_GROUP, c.RAY_VERSION)
    for ns in list(namespaces) or [""]:
        kinds += [
            Followed(c.GROUP, c.VERSION, plural, cluster_record, "", ns)
            for plural in c.PLURALS.values()
        ]
        kinds += [
            Followed("", "v1", "pods", pod_info, c.LABEL_CLUSTER, ns),
            *(
                Followed(
                    *ray, c.RAY_PLURAL_CLUSTER, raycluster_info, label, ns, managed_fields=True
                )
                for label in (c.LABEL_CLUSTER, c.LABEL_JOB, c.LABEL_SERVICE)
            ),
            Followed(*ray, c.RAY_PLURAL_JOB, ray_owner_info, c.LABEL_JOB, ns),
            Followed(*ray, c.RAY_PLURAL_SERVICE, ray_owner_info, c.LABEL_SERVICE, ns),
            Followed(
                c.PROVREQ_GROUP,
                c.PROVREQ_VERSION,
                c.PROVREQ_PLURAL,
                owned_request,
                c.LABEL_CLUSTER,
                ns,
            ),
            Followed("", "v1", c.PODTEMPLATE_PLURAL, podtemplate_record, c.LABEL_CLUSTER, ns),
        ]
    return kinds


def _store_name(kind: Followed) -> str:
    """Which of ``Watches``' stores a followed kind fills."""
    if kind.plural == c.RAY_PLURAL_CLUSTER and kind.label_selector == c.LABEL_JOB:
        return "job_clusters"
    if kind.plural == c.RAY_PLURAL_CLUSTER and kind.label_selector == c.LABEL_SERVICE:
        return "service_clusters"
    return kind.plural


@dataclass
class Watches:
    """The stores, and the watches that fill them."""

    pods: RecordStore[PodInfo] = field(default_factory=lambda: RecordStore(_pod_group))
    nodes: RecordStore[NodeInfo] = field(default_factory=lambda: RecordStore(_node_group))
    rayclusters: RecordStore[dict[str, Any]] = field(default_factory=lambda: RecordStore(_no_group))
    rayjobs: RecordStore[dict[str, Any]] = field(default_factory=lambda: RecordStore(_no_group))
    rayservices: RecordStore[dict[str, Any]] = field(default_factory=lambda: RecordStore(_no_group))
    job_clusters: RecordStore[dict[str, Any]] = field(
        default_factory=lambda: RecordStore(_job_cluster_group)
    )
    service_clusters: RecordStore[dict[str, Any]] = field(
        default_factory=lambda: RecordStore(_service_cluster_group)
    )
    provisioningrequests: RecordStore[OwnedRequest] = field(
        default_factory=lambda: RecordStore(_request_group)
    )
    podtemplates: RecordStore[dict[str, Any]] = field(
        default_factory=lambda: RecordStore(_template_group)
    )
    tpuslicepolicies: RecordStore[Policy | None] = field(
        default_factory=lambda: RecordStore(_no_group)
    )
    namespaces: RecordStore[dict[str, str]] = field(default_factory=lambda: RecordStore(_no_group))
    #: TPUSliceClusters, TPUSliceJobs and TPUSliceServices (``convert.cluster_record``), by
    #: key and by each shape ``object_shapes`` gives (the controller's spec parsing)
    tpusliceclusters: RecordStore[dict[str, Any]] = field(
        default_factory=lambda: RecordStore(_no_group)
    )
    tpuslicejobs: RecordStore[dict[str, Any]] = field(
        default_factory=lambda: RecordStore(_no_group)
    )
    tpusliceservices: RecordStore[dict[str, Any]] = field(
        default_factory=lambda: RecordStore(_no_group)
    )
    slicereservations: RecordStore[ReservationRecord] = field(
        default_factory=lambda: RecordStore(_no_group, _reservation_groups)
    )
    object_shapes: Callable[[Mapping[str, Any]], Iterable[Shape]] = lambda _: ()
    _stops: list[threading.Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        for kind in c.PLURALS:
            self.objects(kind).groups_of = self.object_shapes

    def objects(self, kind: str) -> RecordStore[dict[str, Any]]:
        """The store of our kind ``kind`` (TPUSliceCluster, TPUSliceJob, TPUSliceService)."""
        store: RecordStore[dict[str, Any]] = getattr(self, c.PLURALS[kind])
        return store

    def pods_of(self, key: ObjectKey) -> list[PodInfo]:
        """The pods of the TPUSlice object ``key``."""
        return self.pods.group(key)

    async def pods_gone(
        self,
        key: ObjectKey,
        timeout: float,
        poll: float = POD_GONE_POLL_SECONDS,
    ) -> list[PodInfo]:
        """Wait up to ``timeout`` seconds for the object's pods to leave the store; the
        pods still there. Polls the store (a dict lookup), never the API server."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.pods_of(key) and loop.time() < deadline:
            await asyncio.sleep(poll)
        return self.pods_of(key)

    def requests_of(self, owner: ObjectKey) -> list[OwnedRequest]:
        """The ProvisioningRequests of one TPUSlice object (kind, namespace, name)."""
        return self.provisioningrequests.group(owner)

    def templates_of(self, owner: ObjectKey) -> list[dict[str, Any]]:
        return self.podtemplates.group(owner)

    def every_request(self) -> list[OwnedRequest]:
        return self.provisioningrequests.values()

    def nodes_of(self, shape: Shape) -> list[NodeInfo]:
        return self.nodes.group(shape)

    def nodes_of_accelerator(self, accelerator: str) -> list[NodeInfo]:
        """Every node of ``accelerator``, of any topology (a TPU7x partition queue's:
        the nodes of every Slice formed over its partitions carry that Slice's)."""
        return self.nodes.groups_where(
            lambda g: isinstance(g, tuple) and bool(g) and g[0] == accelerator
        )

    def policies(self) -> list[Policy]:
        """Every TPUSlicePolicy the operator enforces (those without a readable
        selector left out)."""
        return [p for p in self.tpuslicepolicies.values() if p is not None]

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        return self.namespaces.get(("", namespace)) or {}

    def ray_object(self, key: ObjectKey) -> dict[str, Any] | None:
        """The KubeRay object of the TPUSlice object ``key``, of the same namespace and
        name and of the KubeRay kind ``constants.RAY_KIND_OF`` gives: a TPUSliceCluster's
        RayCluster, a TPUSliceJob's RayJob, a TPUSliceService's RayService."""
        stores = {
            c.RAY_KIND_CLUSTER: self.rayclusters,
            c.RAY_KIND_JOB: self.rayjobs,
            c.RAY_KIND_SERVICE: self.rayservices,
        }
        return stores[c.RAY_KIND_OF[key[0]]].get(key[1:])

    def owned_clusters(self, key: ObjectKey) -> dict[str, dict[str, Any]]:
        """The RayClusters KubeRay made for a TPUSliceJob's RayJob or a TPUSliceService's
        RayService, by name (none for a TPUSliceCluster, whose RayCluster is its own)."""
        made = {c.RAY_KIND_JOB: self.job_clusters, c.RAY_KIND_SERVICE: self.service_clusters}
        store = made.get(c.RAY_KIND_OF[key[0]])
        return {} if store is None else {rc["name"]: rc for rc in store.group(key)}

    async def start(
        self,
        kube: Kube,
        namespaces: Iterable[str],
        on_pods: Callable[[list[Change[PodInfo]]], None],
        on_nodes: Callable[[list[Change[NodeInfo]]], None],
        on_rayclusters: Callable[[list[Change[dict[str, Any]]]], None],
        on_owned: Callable[[list[Change[dict[str, Any]]], str], None] | None = None,
        on_requests: Callable[[list[Change[OwnedRequest]]], None] | None = None,
        on_policies: Callable[[list[Change[Any]]], None] | None = None,
        on_objects: Callable[[list[Change[dict[str, Any]]], str], None] | None = None,
        on_reservations: Callable[[list[Change[ReservationRecord]]], None] | None = None,
    ) -> None:
        """Follow every kind (per namespace when the operator is namespace-scoped); return
        when each has been listed once. ``on_owned`` gets the changes of RayJobs,
        RayServices and their RayClusters, with the kind of TPUSlice object they belong to;
        ``on_policies`` the changes of TPUSlicePolicies and of Namespaces' labels;
        ``on_objects`` those of our own kinds, with the kind; ``on_reservations`` those of
        SliceReservations. The kinds are listed concurrently."""

        def owned(kind: str) -> Callable[[list[Any]], None]:
            return lambda changes: on_owned(changes, kind) if on_owned else None

        notify: dict[str, Callable[[list[Any]], None]] = {
            "pods": on_pods,
            "nodes": on_nodes,
            c.RAY_PLURAL_CLUSTER: on_rayclusters,
            c.RAY_PLURAL_JOB: owned(c.KIND_JOB),
            "job_clusters": owned(c.KIND_JOB),
            c.RAY_PLURAL_SERVICE: owned(c.KIND_SERVICE),
            "service_clusters": owned(c.KIND_SERVICE),
            c.PROVREQ_PLURAL: on_requests or (lambda _: None),
            c.PODTEMPLATE_PLURAL: lambda _: None,
            c.PLURAL_POLICY: on_policies or (lambda _: None),
            "namespaces": on_policies or (lambda _: None),
            c.PLURAL_RESERVATION: on_reservations or (lambda _: None),
        }
        for kind, plural in c.PLURALS.items():
            notify[plural] = functools.partial(_of_kind, on_objects, kind)

        def deliver(kind: Followed) -> Deliver:
            name = _store_name(kind)
            return _deliver_into(getattr(self, name), notify[name], kind.namespace)

        # every kind listed at once (each on its thread): one after another, the start-up
        # waited for the sum of the listings (4,000 nodes, then 5,000 pods, ...)
        kinds = list(followed_kinds(namespaces))
        self._stops += await asyncio.gather(*(follow(kube, k, deliver(k)) for k in kinds))

    def stop(self) -> None:
        for stop in self._stops:
            stop.set()


def _of_kind(
    on_objects: Callable[[list[Change[dict[str, Any]]], str], None] | None,
    kind: str,
    changes: list[Change[dict[str, Any]]],
) -> None:
    if on_objects is not None:
        on_objects(changes, kind)


def _deliver_into(
    store: RecordStore[Any], notify: Callable[[list[Any]], None], namespace: str
) -> Deliver:
    def deliver(event: str | None, records: dict[NamespacedName, Any]) -> None:
        changes = apply(store, event, records, namespace)
        if changes:
            notify(changes)

    return deliver


async def follow(kube: Kube, kind: Followed, deliver: Deliver) -> threading.Event:
    """List ``kind``, then watch it forever on a thread of its own; return once the first
    listing was delivered. Returns the event that stops the thread.

    ``deliver`` runs on the calling event loop with ``(None, records)`` for a full
    listing (the first one and every relist after the watch fell too far behind) and
    ``(event type, {key: record})`` for each watch event. Converting objects into
    records happens on the watch thread, so whole objects never reach the loop."""
    loop = asyncio.get_running_loop()
    listed: asyncio.Future[None] = loop.create_future()
    stop = threading.Event()

    def on_loop(event: str | None, records: dict[NamespacedName, Any]) -> None:
        deliver(event, records)
        if event is None and not listed.done():
            listed.set_result(None)

    def emit(event: str | None, records: dict[NamespacedName, Any]) -> None:
        loop.call_soon_threadsafe(on_loop, event, records)

    threading.Thread(
        target=follow_forever,
        args=(kube, kind, emit, stop),
        name=f"watch-{kind.plural}",
        daemon=True,
    ).start()
    await listed
    return stop


def follow_forever(
    kube: Kube,
    kind: Followed,
    emit: Deliver,
    stop: threading.Event,
) -> None:
    version: str | None = None
    backoff = 1.0
    while not stop.is_set():
        try:
            if version is None:
                records, version = _list_all(kube, kind)
                kube.health.watch_ok(kind.plural)
                emit(None, records)
            version = _watch_once(kube, kind, version, emit, stop)
            backoff = 1.0
        except Exception as exc:  # also connection resets, read timeouts, bad JSON
            api_error = exc if isinstance(exc, ApiError) else None
            if api_error is not None and api_error.status == 410:
                version = None  # our resourceVersion is too old (normal): list again
                continue
            kube.metrics.api_error()
            if api_error is not None and api_error.not_found:
                kube.health.watch_ok(kind.plural)  # the API server answered
                version = None  # the CRD is not installed (KubeRay): nothing to follow yet
                emit(None, {})
                stop.wait(MISSING_KIND_RETRY_SECONDS)
                continue
            kube.health.watch_failed(kind.plural, f"{type(exc).__name__}: {exc}")
            log.warning("watching %s failed: %s; retrying in %.0fs", kind.plural, exc, backoff)
            stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)


def _list_all(kube: Kube, kind: Followed) -> tuple[dict[NamespacedName, Any], str]:
    """Every object (in pages), converted; and the resourceVersion to watch from."""
    records: dict[NamespacedName, Any] = {}
    token = ""
    while True:
        query = dict(kind.query(), limit=str(LIST_PAGE_SIZE))
        if token:
            query["continue"] = token
        kube.metrics.api_request("LIST", kind.plural)
        data = kube.send("GET", kind.path(), query, None, None).read()
        page = decode_page(data, managed_fields=kind.managed_fields)
        for obj in page.items:
            records[object_key(obj)] = kind.convert(obj)
        meta = page.metadata
        token = meta.get("continue") or ""
        if not token:
            return records, str(meta.get("resourceVersion") or "")


def _watch_once(
    kube: Kube,
    kind: Followed,
    version: str,
    emit: Deliver,
    stop: threading.Event,
) -> str:
    """One watch request from ``version`` until the server ends it; the newest version."""
    query = dict(
        kind.query(),
        watch="1",
        resourceVersion=version,
        allowWatchBookmarks="true",
        timeoutSeconds=str(WATCH_SECONDS),
    )
    kube.metrics.api_request("WATCH", kind.plural)
    response = kube.send("GET", kind.path(), query, None, None, (10, WATCH_SECONDS + 30))
    kube.health.watch_ok(kind.plural)
    try:
        for line in iter_lines(response.response.stream(64 * 1024)):
            if stop.is_set():
                break
            event_type, obj = decode_event(line, managed_fields=kind.managed_fields)
            if event_type == "ERROR":
                raise ApiError(
                    int(obj.get("code") or 500),
                    str(obj.get("reason") or "WatchError"),
                    str(obj.get("message") or obj),
                )
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            kube.health.watch_ok(kind.plural)
            if event_type in ("ADDED", "MODIFIED", "DELETED"):
                emit(event_type, {object_key(obj): kind.convert(obj)})
    finally:
        response.response.release_conn()
    return version
