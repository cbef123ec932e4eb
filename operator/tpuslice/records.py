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

__all__ = [
    "Claim",
    "ClusterKey",
    "ClusterRef",
    "Holder",
    "NodeInfo",
    "PodInfo",
    "PodRelease",
    "ReservationInfo",
    "Shape",
    "SlicePlan",
    "SliceState",
    "SliceStatus",
    "Snapshot",
]

ClusterKey = tuple[str, str]  # (namespace, name)
Shape = tuple[str, str]  # (gke accelerator, topology)


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
    namespace: str
    name: str
    uid: str

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


@dataclass(frozen=True)
class NodeInfo:
    name: str
    pool: str
    accelerator: str
    topology: str
    chips: int
    ready: bool
    schedulable: bool


@dataclass(frozen=True)
class Holder:
    namespace: str
    name: str
    uid: str
    replica_name: str
    replica_index: int | None = None

    def describe(self) -> str:
        return f"{self.namespace}/{self.name} (slice {self.replica_name})"


@dataclass(frozen=True)
class ReservationInfo:
    pool: str
    holder: Holder
    phase: str | None = None
    #: The SliceReservation object's uid (a delete by the sweep is conditional on it).
    uid: str = ""


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

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"index": self.index}
        if self.replica:
            out["replica"] = self.replica
        if self.node_pool:
            out["nodePool"] = self.node_pool
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


@dataclass(frozen=True)
class Snapshot:
    """What the indexes hold for one cluster, read at the start of a pass."""

    cluster: Mapping[str, Any] | None
    pods: Sequence[PodInfo]
    nodes: Sequence[NodeInfo]
    reservations: Sequence[ReservationInfo]  # of the cluster's shape, and the cluster's own
    raycluster: Mapping[str, Any] | None
    # The node versions (``PoolIndexCache``) when ``nodes`` was read, so a pool index
    # built from these nodes is cached under the version they belong to, never a newer one.
    node_versions: Mapping[Shape, int] = field(default_factory=dict)
