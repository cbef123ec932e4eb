"""The domain records the pure core works on and answers with.

Small frozen values: what the decisions need of a pod, a node, a reservation
and a cluster (read from API objects by ``convert.py``), and the planner's
answer (claims, releases, slice states). Keeping them apart from the planner
lets every part of the shell and every test name them without importing the
planner, and keeps ``reservation.py`` about decisions alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from tpuslice.model.constants import (
    KIND_CLUSTER,
    NODE_LABEL_HOSTNAME,
    NODE_LABEL_NODEPOOL,
    NODE_LABEL_TPU_SLICE,
    PROVREQ_CAPACITY_REVOKED,
    PROVREQ_DETAIL_NODE_POOL,
)

__all__ = [
    "Admission",
    "CapacityType",
    "CapacityUnit",
    "Claim",
    "ClusterRef",
    "GangMode",
    "GkeSliceCreate",
    "GkeSliceInfo",
    "Handover",
    "Holder",
    "KueueView",
    "KueueWorkload",
    "Move",
    "NodeInfo",
    "ObjectKey",
    "OwnedRequest",
    "PodInfo",
    "PodRelease",
    "PoolRequest",
    "ProvisioningAction",
    "ProvisioningDecision",
    "ProvisioningMode",
    "ProvisioningRequestInfo",
    "ProvisioningView",
    "QueueDecision",
    "RequestCondition",
    "ReservationInfo",
    "Reservations",
    "Shape",
    "ShapeMember",
    "ShapePool",
    "SliceFacts",
    "SlicePlan",
    "SliceProvisioning",
    "SliceState",
    "SliceStatus",
    "Snapshot",
    "Taint",
    "Usage",
    "held_by",
]

#: (kind, namespace, name) of a TPUSliceCluster, TPUSliceJob or TPUSliceService: the one
#: key of the pass, its queue, backoff, status writer, waiting sets, metrics and the
#: record of our writes (one job and one cluster of the same name in a namespace stay apart).
ObjectKey = tuple[str, str, str]
Shape = tuple[str, str]  # (gke accelerator, topology)


class CapacityUnit(StrEnum):
    """What one slice holds whole (a SliceReservation's unit).

    A multi-host slice is exactly one GKE node pool (GKE creates and scales such a pool
    as one atomic slice); a single-host slice is one TPU VM, and a single-host pool holds
    as many slices as it has nodes ("Use TPUs with KubeRay"; fleet-facts.md §2)."""

    NODE_POOL = "NodePool"
    NODE = "Node"
    #: one tpu7x dynamic-slicing partition (a 4x4x4 sub-block, one node pool of 16
    #: hosts); a dynamic slice holds chips / 64 of them (planning/partitions.py)
    PARTITION = "Partition"

    @classmethod
    def for_hosts(cls, hosts: int) -> CapacityUnit:
        return cls.NODE if hosts == 1 else cls.NODE_POOL

    @property
    def noun(self) -> str:
        """What messages call one unit: ``node pool`` or ``node``."""
        if self is CapacityUnit.PARTITION:
            return "partition"
        return "node" if self is CapacityUnit.NODE else "node pool"

    @property
    def label(self) -> str:
        """The node label a released pod is pinned by: a node's hostname, a node pool's
        name, or for partitions the GKE Slice they form (its nodes carry
        ``cloud.google.com/gke-tpu-slice=<Slice>`` once it is ACTIVE)."""
        if self is CapacityUnit.PARTITION:
            return NODE_LABEL_TPU_SLICE
        return NODE_LABEL_HOSTNAME if self is CapacityUnit.NODE else NODE_LABEL_NODEPOOL

    def pin(self, name: str) -> dict[str, str]:
        """The nodeSelector that pins a released pod to the unit ``name``."""
        return {self.label: name}


class GangMode(StrEnum):
    """How the slices of one cluster get their pools (``spec.reservation.gang``)."""

    ALL_SLICES = "AllSlices"  # all desired slices hold a pool, or none is released
    PER_SLICE = "PerSlice"  # each slice claims and is released on its own (the old way)


class CapacityType(StrEnum):
    """How GKE provisioned a node pool's VMs, read from node labels (convert.node_info)."""

    RESERVATION = "Reservation"
    ON_DEMAND = "OnDemand"
    SPOT = "Spot"
    FLEX_START = "FlexStart"


class ProvisioningMode(StrEnum):
    """``spec.reservation.provisioning.mode``: how a slice without a free pool asks for one."""

    NONE = "None"  # it waits (WaitingForCapacity), as without the field
    BEST_EFFORT_ATOMIC = "BestEffortAtomic"  # best-effort-atomic-scale-up.autoscaling.x-k8s.io
    QUEUED = "QueuedProvisioning"  # queued-provisioning.gke.io (DWS flex-start, queued)


class SliceState(StrEnum):
    """Where one slice stands; shown in status.slices[].state."""

    PENDING = "Pending"  # KubeRay is still creating the slice's pods
    WAITING_FOR_CAPACITY = "WaitingForCapacity"  # no free matching node pool
    PROVISIONING = "Provisioning"  # no free pool; a ProvisioningRequest asks for one
    RESERVED = "Reserved"  # pool held; pods not (all) released yet
    SCHEDULED = "Scheduled"  # every pod released and pinned; not all running/ready
    READY = "Ready"  # every pod running and ready on the reserved pool
    RELEASING = "Releasing"  # pods terminating; the pool stays held until they are gone
    # a slice above an elastic set's minimum that the Ray autoscaler asked for and that
    # waits for capacity (shown in status; the planner says WaitingForCapacity)
    REQUESTED = "Requested"
    # the KubeRay object is Kueue's and Kueue has not admitted it (it is suspended): no
    # pool is claimed for the slice (status.kueue)
    AWAITING_ADMISSION = "AwaitingAdmission"


@dataclass(frozen=True)
class KueueWorkload:
    """The few fields of Kueue's Workload of a RayCluster or RayJob the status needs
    (``convert.workload_info``; kubernetes-sigs/kueue v0.17.0 apis/kueue/v1beta2
    workload_types.go: the QuotaReserved, Admitted and Evicted conditions,
    ``status.admission.clusterQueue``, ``status.admissionChecks``)."""

    name: str
    admitted: bool = False
    #: why Kueue has not reserved quota (QuotaReserved False), e.g. "insufficient unused
    #: quota for google.com/tpu in flavor tpu, 16 more needed"
    pending: str = ""
    #: Kueue's eviction (Evicted True): its reason (PodsReadyTimeout, Preempted,
    #: InactiveWorkload, AdmissionCheck, ClusterQueueStopped, ...) and message
    evicted_reason: str = ""
    evicted_message: str = ""
    cluster_queue: str = ""
    #: admission checks not Ready yet: (name, state, message)
    checks: tuple[tuple[str, str, str], ...] = ()
    #: admitted, and the PodsReady condition False since this time (RFC 3339)
    pods_not_ready_since: str = ""
    #: the Admitted condition's lastTransitionTime (RFC 3339) while it is True
    admitted_since: str = ""
    #: the PodsReady condition is True (every pod ready or succeeded)
    pods_ready: bool = False
    #: the PodsReady condition's reason while it is False (WaitForStart, WaitForRecovery)
    pods_ready_reason: str = ""
    #: when Kueue's WaitForPodsReady evicts it unless every pod is ready (RFC 3339), and
    #: the timeout that gives it (``status.kueue.pods_ready_deadline``; "" / 0 when the
    #: operator is not told Kueue's timeout or nothing counts)
    evicts_at: str = ""
    evict_timeout_s: int = 0
    #: its WaitForPodsReady evictions so far (``status.requeueState.count``) and when
    #: Kueue queues it again after the last one's backoff (``requeueAt``, RFC 3339)
    requeue_count: int = 0
    requeue_at: str = ""


@dataclass(frozen=True)
class KueueView:
    """What the pass knows of Kueue's hold on the object's RayCluster or RayJob."""

    queue: str  # the LocalQueue (spec.kueue, the object's label, or the live object's)
    admitted: bool  # the live object exists and is not suspended
    #: the queue came from Kueue's webhook (a LocalQueue named ``default`` in the
    #: namespace), not from the TPUSlice object
    defaulted: bool
    kind: str  # RayCluster or RayJob
    name: str
    #: its Workload as this pass read it; None when none was read (none yet, or Kueue's
    #: API not served)
    workload: KueueWorkload | None = None
    #: the operator holds Kueue's admission (spec.kueue.admissionGate): why ("" when not)
    gate: str = ""


@dataclass(frozen=True)
class ClusterRef:
    """The TPUSlice object a pass is for (of ``kind``: cluster, job or service)."""

    namespace: str
    name: str
    uid: str
    kind: str = KIND_CLUSTER
    #: A TPUSliceService plans the slices of each of its RayClusters apart (the active
    #: one and an upgrade's pending one): the RayCluster this pass plans for; "" for a
    #: TPUSliceCluster or TPUSliceJob, whose slices are one set.
    ray_cluster: str = ""
    #: The TPU worker group of spec.workerGroups whose slices this pass plans; "" for the
    #: one-group form (spec.tpu + spec.worker), whose reservations name no group.
    group: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def key(self) -> ObjectKey:
        """The object's one key, (kind, namespace, name)."""
        return (self.kind, self.namespace, self.name)

    @classmethod
    def of(cls, body: Mapping[str, Any], kind: str, ray_cluster: str = "") -> ClusterRef:
        """The reference to the object ``body`` of ``kind``: the one place it is built."""
        meta = body.get("metadata") or {}
        return cls(
            str(meta.get("namespace") or ""),
            str(meta.get("name") or ""),
            str(meta.get("uid") or ""),
            kind=kind,
            ray_cluster=ray_cluster,
        )

    @property
    def queue_key(self) -> ObjectKey:
        """The key of this slice set in its shape's queue: the object's key, with the
        group's name after the object's for a group (two groups of one object may share
        a shape, and each is a request of its own; they sort next to each other)."""
        if not self.group:
            return self.key
        return (self.kind, self.namespace, f"{self.name}/{self.group}")

    def holds(self, holder: Holder) -> bool:
        """Whether a reservation of ``holder`` is one of this pass's own."""
        return (
            holder.uid == self.uid
            and holder.ray_cluster == self.ray_cluster
            and holder.group == self.group
        )

    def holds_in_group(self, holder: Holder) -> bool:
        """Whether ``holder`` is this object's, of this pass's group (any RayCluster of
        it: a TPUSliceService's counts span its RayClusters)."""
        return holder.uid == self.uid and holder.group == self.group

    def own(self, reservations: Iterable[ReservationInfo]) -> list[ReservationInfo]:
        """The reservations of ``reservations`` that are this pass's own (``holds``),
        found by holder (``held_by``), not by a walk over the shape's."""
        return [r for r in held_by(reservations, self.uid) if self.holds(r.holder)]

    def own_in_group(self, reservations: Iterable[ReservationInfo]) -> list[ReservationInfo]:
        """The reservations of this object's group (``holds_in_group``), by holder."""
        return [r for r in held_by(reservations, self.uid) if self.holds_in_group(r.holder)]


@dataclass(frozen=True)
class PodInfo:
    """The few fields of a worker pod the decisions need (kept in an in-memory index)."""

    namespace: str
    name: str
    cluster: str
    replica_name: str | None
    replica_index: int | None
    host_index: int | None
    gated: bool  # carries our scheduling gate
    pinned_pool: str | None  # nodeSelector cloud.google.com/gke-nodepool
    node_name: str | None
    running_ready: bool
    deleting: bool
    created: str = ""  # creationTimestamp, for latency metrics
    owner_kind: str = KIND_CLUSTER  # tpuslice.dev/owner-kind (absent on a TSC's pods)
    ray_cluster: str = ""  # ray.io/cluster: the RayCluster the pod belongs to
    #: lastTransitionTime of the condition PodScheduled=False reason Unschedulable (the
    #: scheduler found no node for it); empty when the pod has no such condition
    unschedulable_since: str = ""
    #: constants.ANNOTATION_RELEASED_AT: when the operator released it (single-host)
    released_at: str = ""
    #: metadata.deletionTimestamp: for a pod, the time its grace period runs out (the
    #: API server sets it to the deletion request's time plus the grace); empty when
    #: the pod is not being deleted
    deletion_deadline: str = ""
    #: ray.io/group: the worker group (one slice set per TPU group of spec.workerGroups)
    group: str = ""
    #: carries a scheduling gate of Kueue's (``kueue.x-k8s.io/...``: topology-aware
    #: scheduling, an elastic job's scale-up): Kueue has not admitted it yet
    kueue_gated: bool = False

    @property
    def owner(self) -> ObjectKey:
        return self.owner_kind, self.namespace, self.cluster

    @property
    def slice_names(self) -> frozenset[str]:
        """The names its slice may go by when the hosts per slice are not at hand: its
        replica's, and its own (a single-host slice's)."""
        return frozenset(n for n in (self.replica_name, self.name) if n)

    def slice_name(self, hosts: int) -> str | None:
        """The slice the pod belongs to, in a group of ``hosts`` hosts per slice: KubeRay
        labels replica name and host index only for multi-host groups; a single-host
        slice is one pod, so the pod's own name names it. None: no slice (yet)."""
        if self.replica_name is None and hosts == 1 and self.replica_index is not None:
            return self.name
        if self.replica_name is None or self.host_index is None:
            return None
        return self.replica_name


@dataclass(frozen=True)
class NodeInfo:
    name: str
    pool: str
    accelerator: str
    topology: str
    chips: int
    ready: bool
    schedulable: bool
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    # cloud.google.com/gce-topology-block / -subblock, when GKE labels the node
    block: str | None = None
    subblock: str | None = None
    # its labels of constants.CAPACITY_SELECTOR_KEYS (spec.reservation.provisioning.nodeSelector)
    capacity_labels: Mapping[str, str] = field(default_factory=dict)
    # metadata.creationTimestamp (RFC 3339): a pool whose nodes are all younger than a
    # best-effort ProvisioningRequest may be its capacity (no name says so)
    created: str = ""
    # GKE dynamic slicing (constants.NODE_LABEL_ACCELERATOR_TOPOLOGY_MODE and after):
    # the node's topology mode, its partition id label keys, and the formed GKE Slice it
    # is in; empty on every node of an ordinary TPU pool
    topology_mode: str = ""
    partition_labels: tuple[str, ...] = ()
    gke_slice: str = ""
    #: metadata.labels: a TPUSlicePolicy's spec.pools.nodeSelector is judged on them.
    labels: Mapping[str, str] = field(default_factory=dict)
    #: spec.taints that keep pods off (NoSchedule, NoExecute): a pool whose nodes carry
    #: one the worker template does not tolerate is never claimed for it.
    taints: tuple[Taint, ...] = ()
    #: lastTransitionTime of the Ready condition when it is not True (the host stopped
    #: answering then); empty on a Ready node or one without the condition's time
    not_ready_since: str = ""


@dataclass(frozen=True)
class Taint:
    """A node taint (core/v1 Taint): key, value and effect."""

    key: str
    value: str = ""
    effect: str = ""


@dataclass(frozen=True)
class Usage:
    """Slices and TPU chips: held by a namespace's objects, or asked for by one object
    (a TPUSlicePolicy's per-namespace limits are judged on them)."""

    slices: int = 0
    chips: int = 0


@dataclass(frozen=True)
class Holder:
    namespace: str
    name: str
    uid: str
    replica_name: str
    replica_index: int | None = None
    kind: str = KIND_CLUSTER  # of the holding object
    ray_cluster: str = ""  # a TPUSliceService's: the RayCluster the slice belongs to
    group: str = ""  # the spec.workerGroups TPU group; "" for the one-group form

    def describe(self) -> str:
        what = "" if self.kind == KIND_CLUSTER else f"{self.kind} "
        group = f"group {self.group}, " if self.group else ""
        return f"{what}{self.namespace}/{self.name} ({group}slice {self.replica_name})"

    @property
    def owner(self) -> ObjectKey:
        return self.kind, self.namespace, self.name


@dataclass(frozen=True)
class GkeSliceInfo:
    """A GKE Slice (accelerator.gke.io/v1beta1) as the planner needs it: which partitions
    it links, whose it is, and how far its Ready condition got.

    ``owner`` is the TPUSlice object (kind, namespace, name) its annotations name, None
    for a Slice the operator did not create (never touched, its partitions never taken);
    ``reason`` is the Ready condition's reason ("" before GKE's controller wrote one).
    """

    name: str
    topology: str
    partition_ids: tuple[str, ...]
    owner: ObjectKey | None = None
    owner_uid: str = ""
    replica_name: str = ""
    replica_index: int | None = None
    ready: bool = False
    reason: str = ""
    message: str = ""
    deleting: bool = False
    #: metadata.uid (a delete is conditional on it) and creationTimestamp (RFC 3339)
    uid: str = ""
    created: str = ""


@dataclass(frozen=True)
class GkeSliceCreate:
    """Create the GKE Slice ``name`` linking ``partition_ids`` into one ``topology``
    slice for ``holder``'s slice (planning/dynamic.py)."""

    name: str
    holder: Holder
    topology: str
    partition_ids: tuple[str, ...]


@dataclass(frozen=True)
class ReservationInfo:
    pool: str
    holder: Holder
    phase: str | None = None
    #: The SliceReservation object's uid (a delete by the sweep is conditional on it).
    uid: str = ""
    #: Its resourceVersion (a hand-over is conditional on it).
    resource_version: str = ""
    #: constants.ANNOTATION_PIN: the identity webhook may pin its slice's new pods here
    pinned: bool = False
    #: constants.ANNOTATION_PIN_REMOVED_AT: when that mark was last removed (RFC 3339)
    unpinned_at: str = ""


class Reservations(Sequence[ReservationInfo]):
    """The reservations one pass reads, each unit once: every reservation of the
    object's shapes and every one it holds.

    Most of a pass reads only the object's own reservations (``held_by``) or a few units
    (``get``); only a decision over the whole shape (which units are free, the shape's
    queue) reads them all. A walk over the shape's reservations in each of the many
    places a pass asks for its own would make the first passes after a restart O(N²)
    over a shape of N objects; here the whole list is built at its first read, and an
    object's own come from ``held``, the store's index by holder, when the reader has
    one. A value: everything it reads was taken when it was made (``held`` included:
    it answers for the one holder the reader copied)."""

    def __init__(
        self,
        every: Callable[[], Iterable[ReservationInfo]],
        held: Callable[[str], Sequence[ReservationInfo] | None] = lambda _: None,
    ) -> None:
        self._every = every
        self._held = held
        self._items: list[ReservationInfo] | None = None
        self._by_pool: dict[str, ReservationInfo] | None = None
        self._by_uid: dict[str, list[ReservationInfo]] | None = None

    @classmethod
    def of(cls, items: Iterable[ReservationInfo]) -> Reservations:
        """The reservations ``items``."""
        if isinstance(items, Reservations):
            return items
        listed = list(items)
        return cls(lambda: listed)

    def _all(self) -> list[ReservationInfo]:
        # each unit once: the last of a unit's wins, as a re-read would
        if self._items is None:
            self._items = list({r.pool: r for r in self._every()}.values())
        return self._items

    def held_by(self, uid: str) -> Sequence[ReservationInfo]:
        """The reservations whose holder is the object ``uid`` (any group or RayCluster
        of it), without a walk over the others when the reader indexed them."""
        own = self._held(uid)
        if own is not None:
            return own
        if self._by_uid is None:
            self._by_uid = {}
            for r in self._all():
                self._by_uid.setdefault(r.holder.uid, []).append(r)
        return self._by_uid.get(uid, [])

    def get(self, pool: str) -> ReservationInfo | None:
        """The reservation of the unit ``pool``, if this view has one."""
        if self._by_pool is None:
            self._by_pool = {r.pool: r for r in self._all()}
        return self._by_pool.get(pool)

    def __getitem__(self, i: Any) -> Any:
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[ReservationInfo]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Reservations | list | tuple):
            return self._all() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Reservations({self._all()!r})"


def held_by(reservations: Iterable[ReservationInfo], uid: str) -> Sequence[ReservationInfo]:
    """The reservations of ``reservations`` whose holder is the object ``uid``: from a
    ``Reservations`` view without a walk over the rest, else by one walk."""
    if isinstance(reservations, Reservations):
        return reservations.held_by(uid)
    return [r for r in reservations if r.holder.uid == uid]


@dataclass(frozen=True)
class Handover:
    """Give ``pool``, held by a slice of ours that has no pods left, to another slice of
    ours (a TPUSliceJob's retry: the new RayCluster's slice takes the old one's pool)."""

    pool: str
    holder: Holder  # the new holder: same object, the new slice's replica


@dataclass(frozen=True)
class Move:
    """Take a single-host slice off a node that pods the operator did not place hold:
    delete the slice's ``pods`` (KubeRay recreates them gated) and its reservation of
    ``pool`` (planning/busy.py)."""

    pool: str
    replica_name: str
    pods: tuple[tuple[str, str], ...]  # (namespace, name)
    #: how long the released pod could not schedule, in seconds
    waited: float
    #: why it could not, as the status message says it (``planning.busy.busy_move``)
    why: str = "is taken by pods the operator did not place"


@dataclass(frozen=True)
class Drain:
    """Delete every pod of a slice at once, each with ``grace_seconds``: a node of the
    unit it holds is being terminated, maintained, has failed or its partition is
    UNHEALTHY (planning/disruption.py), and a TPU slice is interrupted whole."""

    pool: str
    replica_name: str
    index: int
    pods: tuple[tuple[str, str], ...]  # (namespace, name)
    node: str  # the first disrupted node, by name
    signal: str  # what it says (the rest of "node <name> ...")
    reason: str  # DisruptionReason: Maintenance, Preemption, CapacityRevoked, NodeFailure
    grace_seconds: int


@dataclass(frozen=True)
class ForceDelete:
    """Delete one pod with grace 0: a drained slice's pod stuck terminating on a host
    that is gone or shut down for good (planning/disruption.py, ``stuck_pods``), so
    KubeRay, which replaces a replica only once its old pods are gone, can go on."""

    namespace: str
    name: str
    node: str
    why: str  # the rest of "node <name> ...": is gone, or is NotReady and tainted ...


@dataclass(frozen=True)
class Claim:
    """Create a SliceReservation for ``pool``: the atomic claim (AlreadyExists = lost)."""

    pool: str
    holder: Holder


@dataclass(frozen=True)
class PodRelease:
    """One patch: pin to the unit the slice holds (its pool, or its node) and remove our
    gate, for one pod."""

    namespace: str
    name: str
    pool: str  # the unit's name: a node pool, or a node for a single-host slice
    replica_name: str
    unit: CapacityUnit = CapacityUnit.NODE_POOL


@dataclass(frozen=True)
class SliceProvisioning:
    """status.slices[].provisioning: the slice's ProvisioningRequest and its count of
    attempts and failures (read back by provisioning.history_from_status, so the retry
    limit holds across restarts and across requests deleted by someone)."""

    request: str
    attempt: int
    failures: int = 0

    def to_dict(self) -> dict[str, object]:
        return {"request": self.request, "attempt": self.attempt, "failures": self.failures}


@dataclass(frozen=True)
class SliceStatus:
    index: int
    state: SliceState
    replica: str | None = None
    node_pool: str | None = None
    ready_hosts: int = 0
    message: str = ""
    capacity_type: CapacityType | None = None  # of the pool it holds
    provisioning: SliceProvisioning | None = None
    #: A single-host slice holds a node (``node_pool`` is then the node's name): the
    #: node pool that node belongs to, which status shows as ``nodePool`` beside ``node``.
    pool_of_node: str | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"index": self.index}
        if self.replica:
            out["replica"] = self.replica
        if self.node_pool and self.pool_of_node:
            out["nodePool"] = self.pool_of_node
            out["node"] = self.node_pool
        elif self.node_pool:
            out["nodePool"] = self.node_pool
        if self.capacity_type:
            out["capacityType"] = str(self.capacity_type)
        out["state"] = str(self.state)
        out["readyHosts"] = self.ready_hosts
        if self.message:
            out["message"] = self.message
        if self.provisioning:
            out["provisioning"] = self.provisioning.to_dict()
        return out


@dataclass(frozen=True)
class SlicePlan:
    """What to do now, and what to report. Releases of a replica run only if its claim held."""

    claims: tuple[Claim, ...] = ()
    releases: tuple[PodRelease, ...] = ()
    frees: tuple[str, ...] = ()  # pools whose reservation this cluster no longer needs
    binds: tuple[str, ...] = ()  # pools whose reservation should show phase Bound
    slices: tuple[SliceStatus, ...] = ()
    unindexed_pods: tuple[str, ...] = ()  # worker pods without KubeRay's multi-host labels
    # AllSlices: the releases complete a gang together with this plan's claims, so the
    # shell may send them only if every claim of the plan held; after a lost claim it
    # re-plans (the new plan frees the partial set) instead.
    all_or_nothing: bool = False
    stalled: str | None = None  # a NotEnoughPools message: no pool count of the shape will do
    #: single-host slices to move off a node held by pods the operator did not place
    moves: tuple[Move, ...] = ()
    #: seconds until a released pod that cannot schedule has waited long enough to move
    recheck_in: float | None = None
    #: slices whose held unit is disrupted: all their pods deleted together
    drains: tuple[Drain, ...] = ()
    #: pods of drained slices stuck terminating on hosts that are gone or shut down
    force_deletes: tuple[ForceDelete, ...] = ()
    #: dynamic slices (planning/dynamic.py): GKE Slices to create over held partitions,
    #: and Slices of ours to delete (failed, stale, or of a slice that is gone)
    gke_slice_creates: tuple[GkeSliceCreate, ...] = ()
    gke_slice_deletes: tuple[GkeSliceInfo, ...] = ()


@dataclass(frozen=True)
class ShapeMember:
    """Another TPUSliceCluster of the same shape, as the shape's queue needs it."""

    cluster: Mapping[str, Any]  # convert.cluster_record
    pods: Sequence[PodInfo]
    #: Its namespace's labels and usage (which TPUSlicePolicies govern it, whether its
    #: namespace is at a limit); empty when no policy exists.
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    namespace_usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class Snapshot:
    """What the indexes hold for one cluster, read at the start of a pass."""

    cluster: Mapping[str, Any] | None
    pods: Sequence[PodInfo]
    nodes: Sequence[NodeInfo]
    reservations: Sequence[ReservationInfo]  # of the cluster's shape, and the cluster's own
    raycluster: Mapping[str, Any] | None
    #: A TPUSliceJob's RayJob or a TPUSliceService's RayService (convert.ray_owner_info).
    owned: Mapping[str, Any] | None = None
    #: The RayClusters KubeRay made for that RayJob or RayService, by name.
    rayclusters: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The other TPUSliceClusters of the cluster's shape (the shape's queue).
    shape_members: Sequence[ShapeMember] = ()
    # The node versions (``PoolIndexCache``) when ``nodes`` was read, so a pool index
    # built from these nodes is cached under the version they belong to, never a newer one.
    node_versions: Mapping[Shape, int] = field(default_factory=dict)
    # Capacity on demand: its ProvisioningRequests and PodTemplates, others' promised pools.
    provisioning: ProvisioningView | None = None
    # Every TPUSlicePolicy of the cluster (``policy.records.Policy``; typed Any because
    # the model sits below the policy package), the object's namespace's labels, and the
    # slices and chips its namespace's objects hold now.
    policies: Sequence[Any] = ()
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    namespace_usage: Usage = field(default_factory=Usage)
    # Kueue's Workload of the object's RayCluster or RayJob, read by the pass for an
    # object Kueue admits (``controller.kueue``); None otherwise.
    workload: KueueWorkload | None = None
    # why the operator holds Kueue's admission of the object (spec.kueue.admissionGate:
    # too few free pools); "" when it does not.
    admission_gate: str = ""


# ------------------------------------------------------------------ the queue per shape


@dataclass(frozen=True)
class PoolRequest:
    """One cluster wanting pools of a shape, as the shell reads it from the API server:
    the TSC (uid, priority, creationTimestamp, slices, gang), its SliceReservations
    (``held``, ``idle``) and its pods (``claimable``, ``live_pods``). Never from memory."""

    key: ObjectKey
    uid: str
    desired: int  # spec.tpu.slices, an elastic set's target or minimum (0 when suspended)
    held: int  # pools its reservations hold now, any phase
    claimable: int  # live slices (KubeRay made their pods) that hold no pool yet
    gang: GangMode = GangMode.PER_SLICE
    priority: int = 0  # spec.reservation.priority, higher first
    created: str = ""  # metadata.creationTimestamp (RFC 3339, UTC: sorts as text)
    idle: int = 0  # of ``held``: pools whose slice has no pod released yet
    capacity_types: tuple[CapacityType, ...] = ()  # spec.reservation.capacityTypes
    previous: tuple[str, ...] = ()  # pools its slices held before (status.slices[].nodePool)
    live_pods: int = 0  # its worker pods not being deleted, gated or not
    #: Only slices above an elastic minimum are missing (``planning.elastic``): ranked
    #: after every other request of the same priority that misses its minimum.
    extra: bool = False
    #: Unix time before which a pool's scheduled maintenance ranks it last (None: ignored)
    maintenance_before: int | None = None
    #: Units one slice holds: 1 for a node pool or node; a dynamic slice's partitions
    #: (``partitions.partitions_needed``), all of one topology block. Every count above is
    #: in units, so the queue's rules read the same for both.
    per_slice: int = 1

    @property
    def missing(self) -> int:
        return max(0, self.desired - self.held)

    @property
    def has_pods(self) -> bool:
        """Whether any of its worker pods exists. A pod is charged to the namespace's
        ResourceQuota when it is created, gated or not, so one that exists proves its
        pods are admitted; without one (a quota that refuses its worker template, or
        KubeRay not there yet) the queue sets nothing aside for it. ``held`` and
        ``claimable`` count live slices, each with a pod, so they count as pods too."""
        return self.live_pods > 0 or self.held > 0 or self.claimable > 0


@dataclass(frozen=True)
class ShapePool:
    """One node pool of the shape: every pool whose nodes carry the shape's labels."""

    name: str
    eligible: bool  # nodeclass.classify_pool found it usable for the shape
    holder: Holder | None = None  # its SliceReservation's holder, if any
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    block: str | None = None
    subblock: str | None = None
    #: the earliest cloud.google.com/scheduled-maintenance-time of its nodes (Unix s)
    maintenance_at: int | None = None


@dataclass(frozen=True)
class Admission:
    """The queue's word for one cluster in this pass; plan_slices obeys it.

    ``pools`` are the pools it may claim now (already in its preference order);
    ``None`` means no queue governs the cluster (any free eligible pool)."""

    pools: tuple[str, ...] | None = None
    position: int | None = None  # 1-based among the shape's waiting requests
    waiting: int = 0  # how many requests of the shape wait (for "2nd of 3")
    contended: bool = False  # another request of the shape wants pools now
    set_aside: int = 0  # free pools counted for it in this pass (granted or not yet)
    stalled: str | None = None  # NotEnoughPools message: leaves the queue
    message: str = ""  # why it waits (queue_message), for WaitingForCapacity


@dataclass(frozen=True)
class QueueDecision:
    """Per shape: who may claim which pools now, who waits where, who cannot fit."""

    admissions: Mapping[ObjectKey, Admission] = field(default_factory=dict)
    order: tuple[ObjectKey, ...] = ()  # the queue, head first (stalled ones left out)
    waiting: tuple[ObjectKey, ...] = ()  # of ``order``: still short after this pass
    not_enough: tuple[ObjectKey, ...] = ()  # NotEnoughPools: out of the queue


# ------------------------------------------------------------ capacity on demand


@dataclass(frozen=True)
class RequestCondition:
    """One status condition of a ProvisioningRequest."""

    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str = ""
    message: str = ""
    last_transition: datetime | None = None

    @property
    def true(self) -> bool:
        return self.status == "True"


@dataclass(frozen=True)
class ProvisioningRequestInfo:
    """What the decisions need of one of our ProvisioningRequests
    (``convert.provisioning_request_info``)."""

    namespace: str
    name: str
    uid: str = ""
    raycluster: str = ""  # tpuslice.dev/raycluster
    slice_index: int | None = None  # tpuslice.dev/slice-index
    attempt: int = 1  # tpuslice.dev/provisioning-attempt
    failures: int = 0  # tpuslice.dev/provisioning-failures: counted before this attempt
    class_name: str = ""
    spec_hash: str = ""  # tpuslice.dev/request-hash: what it was created from
    conditions: Mapping[str, RequestCondition] = field(default_factory=dict)  # by type
    details: Mapping[str, str] = field(default_factory=dict)  # provisioningClassDetails
    created: datetime | None = None
    deleting: bool = False
    revoked_pool: str | None = None  # tpuslice.dev/revoked-node-pool: its slice was replaced

    def condition(self, kind: str) -> RequestCondition | None:
        return self.conditions.get(kind)

    def is_true(self, kind: str) -> bool:
        cond = self.conditions.get(kind)
        return cond is not None and cond.true

    @property
    def node_pool(self) -> str | None:
        """The node pool GKE's queued class made for it (provisioningClassDetails)."""
        return self.details.get(PROVREQ_DETAIL_NODE_POOL) or None

    @property
    def retired(self) -> bool:
        """Its slice was replaced after CapacityRevoked: no longer any slice's request,
        kept only to keep its pool from every object while the pool has nodes."""
        return self.revoked_pool is not None

    @property
    def lost_pool(self) -> str | None:
        """The node pool whose capacity GKE revoked under this request, if known: the one
        we recorded when we replaced its slice, else the pool its queued class named."""
        if self.revoked_pool:
            return self.revoked_pool
        return self.node_pool if self.is_true(PROVREQ_CAPACITY_REVOKED) else None


@dataclass(frozen=True)
class OwnedRequest:
    """One of our ProvisioningRequests in the watch's store, with the TPUSlice object it
    belongs to (kind, namespace, name: from its labels)."""

    owner: ObjectKey
    info: ProvisioningRequestInfo


@dataclass(frozen=True)
class ProvisioningView:
    """What a snapshot holds of capacity on demand for one TPUSlice object: its own
    ProvisioningRequests and PodTemplates (``convert.podtemplate_record``), and the
    node pools live requests of *other* objects name (``capacity.requests.promised_pools``)."""

    requests: Sequence[ProvisioningRequestInfo] = ()
    templates: Sequence[Mapping[str, Any]] = ()
    #: each pool a live request of another object names -> the creation of the oldest
    #: such request: of a single-host pool only the nodes made since are promised (GKE
    #: grows the pool)
    promised_since: Mapping[str, datetime] = field(default_factory=dict)
    #: pools of CapacityRevoked requests of *any* object (``lost_pool``): kept from all
    revoked_pools: frozenset[str] = frozenset()

    @property
    def promised_elsewhere(self) -> frozenset[str]:
        """The pools live requests of other objects name."""
        return frozenset(self.promised_since)


@dataclass(frozen=True)
class SliceFacts:
    """One slice as the per-slice provisioning decision sees it (``capacity.decide``).

    ``exists`` is False when the slice is gone: its index is beyond spec.tpu.slices
    (scale-down), it is suspended, or its pods are gone and not being replaced."""

    index: int
    raycluster: str = ""  # the RayCluster it belongs to (names its requests)
    exists: bool = True
    pods_complete: bool = False  # all hostsPerSlice live pods created
    pool: str | None = None  # the unit its SliceReservation holds (a node pool, or a node)
    released: bool = False  # some pod of it is ungated (pinned to ``pool``)
    bound: bool = False  # every pod of it is bound to a node
    eligible_pool: bool = False  # a free existing unit is there for it in this pass
    gang_waiting: bool = False  # holds its unit, unreleased only because its gang is short
    unit: CapacityUnit = CapacityUnit.NODE_POOL  # what ``pool`` names
    #: the GKE node pool of ``pool`` (``pool`` itself for a node-pool unit): what a queued
    #: request's provisioningClassDetails.NodePoolName is compared with
    unit_pool: str | None = None
    #: an elastic extra (above the minimum) that waits for capacity while the extra of
    #: this lower index asks: capacity above the minimum is asked one slice at a time
    asks_after: int | None = None

    @property
    def held(self) -> str:
        """The unit it holds as messages name it: ``node pool p`` or ``node n``."""
        return f"{self.unit.noun} {self.pool}"


class ProvisioningAction(StrEnum):
    NONE = "None"  # no request and none wanted
    WAIT = "Wait"  # a request is outstanding; nothing to do but watch it
    CREATE = "Create"  # create the PodTemplate, then the request (``create_attempt``)
    DELETE = "Delete"  # delete the request (its PodTemplate goes with it)
    CLAIM = "Claim"  # capacity is provisioned: claim a pool for the slice
    RETRY = "Retry"  # delete the request and create the next attempt
    GIVE_BACK = "GiveBack"  # free the slice's unreleased pool: its booking lapsed
    KEEP = "Keep"  # the slice runs on the request's capacity: keep the request
    STALL = "Stall"  # cannot converge without someone's change
    REPLACE = "Replace"  # the capacity is gone under a released slice: replace the slice


@dataclass(frozen=True)
class ProvisioningDecision:
    """What to do about one slice's ProvisioningRequest in this pass, and what to report.

    The fields say everything the shell must do; ``action`` names the case (tests,
    logs, events). Order for the shell: give the pool back, delete ``delete``, then
    create ``create_attempt`` (PodTemplate first); claim as the planner does."""

    action: ProvisioningAction
    index: int
    #: Provisioning while a request is outstanding; None leaves the planner's state.
    state: SliceState | None = None
    message: str = ""  # for status.slices[].message (the request's own text included)
    reason: str = ""  # Event reason on a transition (events.py)
    create_attempt: int | None = None  # create the request of this attempt number
    failures: int = 0  # failures counted before ``create_attempt`` (or the kept request)
    delete: str | None = None  # name of the request to delete
    claim_pool: str | None = None  # queued: the pool provisioningClassDetails names
    search_pools: bool = False  # other classes: claim any fresh whole eligible pool
    give_back: bool = False  # free the pool the slice holds (never released yet)
    replace_slice: bool = False  # delete the slice's pods; KubeRay makes a new replica
    stalled: str | None = None  # Stalled message (reason ProvisioningFailed)
    retry_at: datetime | None = None  # pass again no later than this (backoff, deadlines)
    request: str | None = None  # the request the slice consumes or waits for, if any
    attempt: int = 0  # attempt number of ``request`` (or of the last one, 0 for none)

    def provisioning_status(self) -> SliceProvisioning | None:
        """What status.slices[].provisioning should say after this decision is carried
        out (None: the slice never asked); read back by provisioning.history_from_status."""
        if self.attempt <= 0:
            return None
        return SliceProvisioning(self.request or "", self.attempt, self.failures)
