"""The domain records the pure core works on and answers with.

Small frozen values: what the decisions need of a pod, a node, a reservation
and a cluster (read from API objects by ``convert.py``), and the planner's
answer (claims, releases, slice states). Keeping them apart from the planner
lets every part of the shell and every test name them without importing the
planner, and keeps ``reservation.py`` about decisions alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tpuslice.constants import KIND_CLUSTER

__all__ = [
    "Admission",
    "CapacityType",
    "Claim",
    "ClusterKey",
    "ClusterRef",
    "GangMode",
    "Handover",
    "Holder",
    "NodeInfo",
    "OwnerKey",
    "PodInfo",
    "PodRelease",
    "PoolRequest",
    "QueueDecision",
    "ReservationInfo",
    "Shape",
    "ShapeMember",
    "ShapePool",
    "SlicePlan",
    "SliceState",
    "SliceStatus",
    "Snapshot",
]

ClusterKey = tuple[str, str]  # (namespace, name)
#: (kind, namespace, name) of a TPUSliceCluster, TPUSliceJob or TPUSliceService: a pod's
#: owner (one job and one cluster of the same name in a namespace stay apart).
OwnerKey = tuple[str, str, str]
Shape = tuple[str, str]  # (gke accelerator, topology)


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


class SliceState(StrEnum):
    """Where one slice stands; shown in status.slices[].state."""

    PENDING = "Pending"  # KubeRay is still creating the slice's pods
    WAITING_FOR_CAPACITY = "WaitingForCapacity"  # no free matching node pool
    RESERVED = "Reserved"  # pool held; pods not (all) released yet
    SCHEDULED = "Scheduled"  # every pod released and pinned; not all running/ready
    READY = "Ready"  # every pod running and ready on the reserved pool
    RELEASING = "Releasing"  # pods terminating; the pool stays held until they are gone


@dataclass(frozen=True)
class ClusterRef:
    """The TPUSlice object a pass is for (of ``kind``: cluster, job or service)."""

    namespace: str
    name: str
    uid: str
    kind: str = KIND_CLUSTER

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


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

    @property
    def owner(self) -> OwnerKey:
        return self.owner_kind, self.namespace, self.cluster


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


@dataclass(frozen=True)
class Holder:
    namespace: str
    name: str
    uid: str
    replica_name: str
    replica_index: int | None = None
    kind: str = KIND_CLUSTER  # of the holding object

    def describe(self) -> str:
        what = "" if self.kind == KIND_CLUSTER else f"{self.kind} "
        return f"{what}{self.namespace}/{self.name} (slice {self.replica_name})"

    @property
    def owner(self) -> OwnerKey:
        return self.kind, self.namespace, self.name


@dataclass(frozen=True)
class ReservationInfo:
    pool: str
    holder: Holder
    phase: str | None = None
    #: The SliceReservation object's uid (a delete by the sweep is conditional on it).
    uid: str = ""
    #: Its resourceVersion (a hand-over is conditional on it).
    resource_version: str = ""


@dataclass(frozen=True)
class Handover:
    """Give ``pool``, held by a slice of ours that has no pods left, to another slice of
    ours (a TPUSliceJob's retry: the new RayCluster's slice takes the old one's pool)."""

    pool: str
    holder: Holder  # the new holder: same object, the new slice's replica


@dataclass(frozen=True)
class Claim:
    """Create a SliceReservation for ``pool``: the atomic claim (AlreadyExists = lost)."""

    pool: str
    holder: Holder


@dataclass(frozen=True)
class PodRelease:
    """One patch: add the pool nodeSelector and remove our gate, for one pod."""

    namespace: str
    name: str
    pool: str
    replica_name: str


@dataclass(frozen=True)
class SliceStatus:
    index: int
    state: SliceState
    replica: str | None = None
    node_pool: str | None = None
    ready_hosts: int = 0
    message: str = ""
    capacity_type: CapacityType | None = None  # of the pool it holds

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"index": self.index}
        if self.replica:
            out["replica"] = self.replica
        if self.node_pool:
            out["nodePool"] = self.node_pool
        if self.capacity_type:
            out["capacityType"] = str(self.capacity_type)
        out["state"] = str(self.state)
        out["readyHosts"] = self.ready_hosts
        if self.message:
            out["message"] = self.message
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


@dataclass(frozen=True)
class ShapeMember:
    """Another TPUSliceCluster of the same shape, as the shape's queue needs it."""

    cluster: Mapping[str, Any]  # convert.cluster_record
    pods: Sequence[PodInfo]


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


# ------------------------------------------------------------------ the queue per shape


@dataclass(frozen=True)
class PoolRequest:
    """One cluster wanting pools of a shape, as the shell reads it from the API server:
    the TSC (uid, priority, creationTimestamp, slices, gang), its SliceReservations
    (``held``, ``idle``) and its pods (``claimable``). Never from memory."""

    key: ClusterKey
    uid: str
    desired: int  # spec.tpu.slices (0 when suspended)
    held: int  # pools its reservations hold now, any phase
    claimable: int  # live slices (KubeRay made their pods) that hold no pool yet
    gang: GangMode = GangMode.PER_SLICE
    priority: int = 0  # spec.reservation.priority, higher first
    created: str = ""  # metadata.creationTimestamp (RFC 3339, UTC: sorts as text)
    idle: int = 0  # of ``held``: pools whose slice has no pod released yet
    capacity_types: tuple[CapacityType, ...] = ()  # spec.reservation.capacityTypes
    previous: tuple[str, ...] = ()  # pools its slices held before (status.slices[].nodePool)

    @property
    def missing(self) -> int:
        return max(0, self.desired - self.held)


@dataclass(frozen=True)
class ShapePool:
    """One node pool of the shape: every pool whose nodes carry the shape's labels."""

    name: str
    eligible: bool  # whole, Ready, schedulable, enough chips (reservation._pool_problem)
    holder: Holder | None = None  # its SliceReservation's holder, if any
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    block: str | None = None
    subblock: str | None = None


@dataclass(frozen=True)
class Admission:
    """The queue's word for one cluster in this pass; plan_slices obeys it.

    ``pools`` are the pools it may claim now (already in its preference order);
    ``None`` means no queue governs the cluster (any free eligible pool, as before)."""

    pools: tuple[str, ...] | None = None
    position: int | None = None  # 1-based among the shape's waiting requests
    waiting: int = 0  # how many requests of the shape wait (for "2nd of 3")
    contended: bool = False  # another request of the shape wants pools now
    set_aside: int = 0  # free pools counted for it in this pass (granted or not yet)
    stalled: str | None = None  # NotEnoughPools message: leaves the queue
    message: str = ""  # why it waits (queue_message), for WaitingForCapacity

    @property
    def may_claim(self) -> int | None:
        return None if self.pools is None else len(self.pools)


@dataclass(frozen=True)
class QueueDecision:
    """Per shape: who may claim which pools now, who waits where, who cannot fit."""

    admissions: Mapping[ClusterKey, Admission] = field(default_factory=dict)
    order: tuple[ClusterKey, ...] = ()  # the queue, head first (stalled ones left out)
    waiting: tuple[ClusterKey, ...] = ()  # of ``order``: still short after this pass
    not_enough: tuple[ClusterKey, ...] = ()  # NotEnoughPools: out of the queue
