"""Fake GKE node pools: a declarative pool description -> the Node objects GKE would make.

The local cluster is only useful if the real scheduler sees the same labels,
taints and capacity it would see on GKE; a pod spec that schedules here must
schedule there and vice versa. Everything in this module is pure data in, data
out, so the GKE shape of a node is unit-tested without a cluster.

The TPU type table is deliberately local and written from GKE's documentation
("About TPUs in GKE", "Plan TPUs in GKE": machine types, the
``cloud.google.com/gke-tpu-accelerator`` values, chips per host), never imported
from the operator: a fake GKE that took its labels from ``tpuslice.model.topology``
would mirror a wrong label there and every e2e scenario would still pass.

How GKE provisioned a pool's VMs shows in node labels, also written from GKE's
documentation (see ``TPUPool``): Spot (``cloud.google.com/gke-spot``), a specific
Compute Engine reservation (``cloud.google.com/reservation-name``), flex-start
(``cloud.google.com/gke-flex-start``), each with the matching
``cloud.google.com/gke-provisioning`` value; and where the VMs sit in the data
centre (``cloud.google.com/gce-topology-block`` / ``-subblock`` / ``-host``).

Three kinds of TPU pool, as GKE makes them (see ``TPUPool``):

- multi-host: one slice; ``nodes * chips_per_node`` is the topology's chips.
- single-host: each node is a slice of its own (``topology`` fits one VM), so the
  pool may have any number of nodes; ``preset_pool("v6e-2x2-single")`` is three
  ``ct6e-standard-4t`` nodes of ``2x2``.
- dynamic slicing (TPU7x, GKE 1.35+): a ``PROVISION_ONLY`` pool of one 4x4x4
  sub-block, 16 nodes carrying partition labels and no ``gke-tpu-topology``;
  ``slice_name`` gives its nodes the labels GKE's slice controller writes once a
  ``Slice`` over them is ACTIVE (the controller itself is not simulated here).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FLEX_START_LABEL",
    "KWOK_ANNOTATION",
    "PARTITION_ID_LABEL",
    "PARTITION_STATES",
    "PARTITION_STATE_LABEL",
    "PARTITION_TOPOLOGY",
    "POOL_ANNOTATION",
    "PRESETS",
    "PROVISIONING_LABEL",
    "PROVISION_ONLY",
    "RESERVATION_LABEL",
    "SLICE_LABEL",
    "SPOT_LABEL",
    "TOPOLOGY_BLOCK_LABEL",
    "TOPOLOGY_HOST_LABEL",
    "TOPOLOGY_LABEL",
    "TOPOLOGY_MODE_LABEL",
    "TOPOLOGY_SUBBLOCK_LABEL",
    "TPU_RESOURCE",
    "TPU_TAINT",
    "CPUPool",
    "NodePool",
    "TPUPool",
    "default_pools",
    "host_chips",
    "node_name",
    "parse_pool_spec",
    "pool_from_dict",
    "pool_names",
    "pool_nodes",
    "pool_partition_id",
    "preset_pool",
    "topology_chips",
    "topology_host",
    "tpu_type_for_accelerator",
]

#: KWOK manages exactly the Nodes carrying this annotation (its controller flag
#: ``--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake``).
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
#: Marks nodes the harness created, so remove/cleanup never touches other nodes.
#: An annotation, not a label: the labels must stay exactly GKE's.
POOL_ANNOTATION = "tpuslice.dev/devcluster-pool"
TPU_RESOURCE = "google.com/tpu"
TPU_TAINT: dict[str, str] = {"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}

# Capacity-type labels. Sources (GKE documentation):
# - Spot: "Run fault-tolerant workloads at lower costs with Spot VMs"
#   https://cloud.google.com/kubernetes-engine/docs/how-to/spot-vms and "About cluster
#   autoscaling" https://cloud.google.com/kubernetes-engine/docs/concepts/cluster-autoscaler
#   ("GKE automatically adds the cloud.google.com/gke-spot=true label" to Spot nodes);
#   "About node pool auto-creation"
#   https://cloud.google.com/kubernetes-engine/docs/concepts/node-auto-provisioning names
#   both node labels, cloud.google.com/gke-spot=true and cloud.google.com/gke-provisioning=spot
#   (GKE's cluster autoscaler, pkg/cloudprovider/gke/labels/system_labels.go, has the
#   provisioning values standard, spot, flex-start, preemptible). On a
#   Standard node pool GKE adds labels only, no taint (the NoSchedule taint is for
#   Autopilot and auto-provisioned pools, or one the user adds).
# - Reservation: "Consuming reserved zonal resources"
#   https://cloud.google.com/kubernetes-engine/docs/how-to/consuming-reservations
#   (workloads select the node label cloud.google.com/reservation-name=<reservation>;
#   GKE's autoscaler writes it on the nodes it makes for a specific reservation,
#   ReservationNameLabel in system_labels.go). Whether a hand-made Standard pool that
#   consumes a reservation carries it too is not stated there; the fake assumes it does,
#   as the operator reads capacity types from this label.
# - Flex-start: "About flex-start VMs" https://cloud.google.com/kubernetes-engine/docs/concepts/dws
#   and "Run a small batch workload with TPUs and flex-start VMs"
#   https://cloud.google.com/kubernetes-engine/docs/how-to/dws-flex-start-training-tpu
#   (workloads select cloud.google.com/gke-flex-start: "true"); GKE's provisioning label
#   then reads flex-start. No taint for flex-start without queued provisioning.
SPOT_LABEL = "cloud.google.com/gke-spot"
RESERVATION_LABEL = "cloud.google.com/reservation-name"
FLEX_START_LABEL = "cloud.google.com/gke-flex-start"
PROVISIONING_LABEL = "cloud.google.com/gke-provisioning"  # standard | spot | flex-start
# Physical topology labels, "Schedule GKE workloads with Topology Aware Scheduling"
# https://cloud.google.com/ai-hypercomputer/docs/workloads/schedule-gke-workloads-tas:
# gce-topology-block is "the organization-specific ID of the reserved block in which the
# VM is located", gce-topology-subblock "of the sub-block", gce-topology-host "the ID of
# the host on which the VM is located"; the more values two VMs share, the closer they are.
TOPOLOGY_BLOCK_LABEL = "cloud.google.com/gce-topology-block"
TOPOLOGY_SUBBLOCK_LABEL = "cloud.google.com/gce-topology-subblock"
TOPOLOGY_HOST_LABEL = "cloud.google.com/gce-topology-host"


TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
# TPU7x dynamic slicing, GKE documentation "Use dynamic slicing with a custom
# scheduler" and "Configure TPUs with GKE dynamic slicing" (GKE 1.35+): one node
# pool per sub-block (16 VMs, a 4x4x4 partition) created with
# --accelerator-topology-mode=provision_only; its nodes carry the topology mode and the
# partition's id and state. ICI is not active until GKE's slice controller forms a Slice
# over the partitions; it then labels the Slice's nodes with gke-tpu-slice and the
# Slice's gke-tpu-topology (the doc's table says "added by slice controller").
# Assumption, not stated by the doc: a PROVISION_ONLY node carries no gke-tpu-topology
# before any Slice forms.
TOPOLOGY_MODE_LABEL = "cloud.google.com/gke-accelerator-topology-mode"
PROVISION_ONLY = "PROVISION_ONLY"
PARTITION_TOPOLOGY = "4x4x4"
PARTITION_ID_LABEL = f"cloud.google.com/gke-tpu-partition-{PARTITION_TOPOLOGY}-id"
PARTITION_STATE_LABEL = f"cloud.google.com/gke-tpu-partition-{PARTITION_TOPOLOGY}-state"
#: The doc's partition states; HEALTHY and DEGRADED partitions are usable.
PARTITION_STATES = ("HEALTHY", "DEGRADED", "UNHEALTHY", "UNSET", "INCOMPLETE")
SLICE_LABEL = "cloud.google.com/gke-tpu-slice"
_PARTITION_HOSTS = 16
# A label value: at most 63 characters, alphanumerics at both ends, "-", "_", "." inside.
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True)
class _TPUType:
    """The GKE machines of one TPU generation, as GKE's documentation lists them."""

    accelerator: str  # cloud.google.com/gke-tpu-accelerator
    chips_per_host: tuple[int, ...]  # chips of the generation's machine types
    machine_family: str  # cloud.google.com/machine-family
    machine_type: str  # format string over the chips per host
    cpu_per_chip: int  # vCPU of the 4-chip host / 4
    memory_gib_per_chip: int
    dimensions: int  # of its topologies: 2 (AxB) or 3 (AxBxC)


# Machine types and single-host shapes: "Plan TPUs in GKE"
# https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus and "About TPUs in
# GKE" https://cloud.google.com/kubernetes-engine/docs/concepts/tpus. Single-host shapes:
# v4 and v5p 2x2x1 on one 4-chip VM; v5e and v6e 1x1, 2x2, 2x4 on the 1-, 4- and 8-chip
# VMs; TPU7x 2x2x1 on tpu7x-standard-4t and 1x1x1 on tpu7x-standard-1t (xpk lists that
# machine type with exactly the 1x1x1 topology: AI-Hypercomputer/xpk@073d687d
# src/xpk/core/system_characteristics.py). vCPU and memory of the 4-chip VMs: "TPU7x
# (Ironwood)" https://cloud.google.com/tpu/docs/tpu7x (v5p 208 vCPU / 448 GB, v6e 180 /
# 720, TPU7x 224 / 960); the 1- and 8-chip VMs are scaled per chip, close enough for
# the scheduler's fit.
_TPU_TYPES: dict[str, _TPUType] = {
    # ct4p-hightpu-4t
    "v4": _TPUType("tpu-v4-podslice", (4,), "ct4p", "ct4p-hightpu-{chips}t", 60, 100, 3),
    # ct5lp-hightpu-1t / -4t / -8t
    "v5e": _TPUType(
        "tpu-v5-lite-podslice", (1, 4, 8), "ct5lp", "ct5lp-hightpu-{chips}t", 28, 48, 2
    ),
    # ct5p-hightpu-4t
    "v5p": _TPUType("tpu-v5p-slice", (4,), "ct5p", "ct5p-hightpu-{chips}t", 52, 112, 3),
    # ct6e-standard-1t / -4t / -8t
    "v6e": _TPUType("tpu-v6e-slice", (1, 4, 8), "ct6e", "ct6e-standard-{chips}t", 45, 180, 2),
    # tpu7x-standard-4t, and tpu7x-standard-1t for 1x1x1
    "tpu7x": _TPUType("tpu7x", (1, 4), "tpu7x", "tpu7x-standard-{chips}t", 56, 240, 3),
}


@dataclass(frozen=True)
class TPUPool:
    """One GKE TPU node pool; a multi-host pool is exactly one slice.

    ``nodes * chips_per_node`` must equal the chips in ``topology`` for a
    multi-host slice (GKE creates the pool as a unit). A single-host pool may
    have any number of nodes, each one slice of ``topology``.

    Capacity type, at most one (no flag: on-demand): ``spot`` (Spot VMs),
    ``reservation`` (the VMs consume that specific Compute Engine reservation),
    ``flex_start`` (flex-start VMs). A node has one ``gke-provisioning`` value, so
    a pool that is two of these is refused; a test that wants a node GKE would
    not make says so with ``extra_labels``.

    ``topology_block`` / ``topology_subblock``: the block and sub-block every VM
    of the pool sits in (a compact placement: one pool, one sub-block); each node
    also gets its own ``gce-topology-host``. Unset: no topology labels, as on
    nodes GKE does not expose a topology for.

    ``dynamic_slicing``: a TPU7x pool made for GKE's dynamic slicing, exactly one
    4x4x4 sub-block (16 nodes of 4 chips) in ``PROVISION_ONLY`` mode. Its nodes
    carry ``partition_id`` (default: a stable id derived from the pool) and
    ``partition_state`` and no ``gke-tpu-topology``: no workload can run on them
    until a ``Slice`` is formed. ``slice_name`` says one is, over the whole pool:
    every node then carries ``gke-tpu-slice`` and the Slice's ``gke-tpu-topology``
    (``slice_topology``, default 4x4x4; larger when the Slice spans other pools'
    partitions too). A Slice over part of a sub-block (a sub-slice) is not modelled.
    """

    name: str
    tpu_type: str
    topology: str
    nodes: int
    chips_per_node: int = 4
    zone: str = "us-east5-b"
    spot: bool = False
    reservation: str | None = None
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    flex_start: bool = False
    topology_block: str | None = None
    topology_subblock: str | None = None
    dynamic_slicing: bool = False
    partition_id: str | None = None
    partition_state: str = "HEALTHY"
    slice_name: str | None = None
    slice_topology: str | None = None

    @property
    def capacity_type(self) -> str:
        """The capacity type in GKE's words: ``spot``, ``reservation``, ``flex-start`` or
        ``on-demand``."""
        if self.spot:
            return "spot"
        if self.reservation:
            return "reservation"
        if self.flex_start:
            return "flex-start"
        return "on-demand"

    def __post_init__(self) -> None:
        if self.tpu_type not in _TPU_TYPES:
            raise ValueError(
                f"pool {self.name}: unknown TPU type {self.tpu_type!r} "
                f"(one of {', '.join(sorted(_TPU_TYPES))})"
            )
        allowed = _TPU_TYPES[self.tpu_type].chips_per_host
        if self.chips_per_node not in allowed:
            raise ValueError(
                f"pool {self.name}: {self.tpu_type} hosts have {allowed} chips, "
                f"not {self.chips_per_node}"
            )
        if self.nodes < 0:
            raise ValueError(f"pool {self.name}: nodes must be >= 0")
        dims = len(self.topology.split("x"))
        wanted_dims = _TPU_TYPES[self.tpu_type].dimensions
        if dims != wanted_dims:
            form = "AxB" if wanted_dims == 2 else "AxBxC"
            raise ValueError(
                f"pool {self.name}: {self.tpu_type} topologies are {wanted_dims}-dimensional "
                f"({form}), not {self.topology!r}"
            )
        chips = topology_chips(self.topology)
        if chips > self.chips_per_node:
            if self.nodes * self.chips_per_node != chips:
                raise ValueError(
                    f"pool {self.name}: a {self.topology} slice needs "
                    f"{chips // self.chips_per_node} hosts of {self.chips_per_node} chips, "
                    f"not {self.nodes}"
                )
        elif chips != self.chips_per_node:
            raise ValueError(
                f"pool {self.name}: topology {self.topology} has {chips} chips "
                f"but hosts have {self.chips_per_node}"
            )
        flags = {"spot": self.spot, "reservation": bool(self.reservation)}
        flags["flex_start"] = self.flex_start
        kinds = [kind for kind, on in flags.items() if on]
        if len(kinds) > 1:
            raise ValueError(
                f"pool {self.name}: a node pool has one capacity type, not {' and '.join(kinds)}"
            )
        if self.reservation == "":
            raise ValueError(f"pool {self.name}: an empty reservation name")
        if self.topology_subblock and not self.topology_block:
            raise ValueError(
                f"pool {self.name}: a topology sub-block lies within a block; set topology_block"
            )
        self._check_dynamic_slicing()

    def _check_dynamic_slicing(self) -> None:
        if not self.dynamic_slicing:
            given = [
                name
                for name, on in (
                    ("partition_id", self.partition_id is not None),
                    ("partition_state", self.partition_state != "HEALTHY"),
                    ("slice_name", self.slice_name is not None),
                    ("slice_topology", self.slice_topology is not None),
                )
                if on
            ]
            if given:
                raise ValueError(
                    f"pool {self.name}: {', '.join(given)} describe a dynamic-slicing pool; "
                    f"set dynamic_slicing"
                )
            return
        if (self.tpu_type, self.topology, self.chips_per_node) != ("tpu7x", PARTITION_TOPOLOGY, 4):
            raise ValueError(
                f"pool {self.name}: a dynamic-slicing pool is one TPU7x sub-block: tpu_type "
                f"tpu7x, topology {PARTITION_TOPOLOGY}, {_PARTITION_HOSTS} nodes of 4 chips"
            )
        if self.partition_id is not None and not _LABEL_VALUE.fullmatch(self.partition_id):
            raise ValueError(
                f"pool {self.name}: partition_id {self.partition_id!r} is not a label value "
                f"(at most 63 letters, digits, '-', '_', '.'; alphanumeric at both ends)"
            )
        if self.partition_state not in PARTITION_STATES:
            raise ValueError(
                f"pool {self.name}: partition_state {self.partition_state!r} is not one of "
                f"{', '.join(PARTITION_STATES)}"
            )
        if self.slice_topology is not None and self.slice_name is None:
            raise ValueError(f"pool {self.name}: slice_topology needs slice_name (the Slice)")
        if self.slice_name is not None and not _LABEL_VALUE.fullmatch(self.slice_name):
            raise ValueError(
                f"pool {self.name}: slice_name {self.slice_name!r} is not a label value "
                f"(at most 63 letters, digits, '-', '_', '.'; alphanumeric at both ends)"
            )
        if self.slice_topology is not None:
            _check_slice_topology(self.name, self.slice_topology)


def _check_slice_topology(pool: str, topology: str) -> None:
    """A Slice made of whole 4x4x4 partitions, this pool's among them: three dimensions,
    each a multiple of 4, non-decreasing (the Slice API's rule, fleet-facts §3 from
    AI-Hypercomputer/xpk@250d4b3c slice/api/v1beta1/slice_types.go)."""
    try:
        dims = [int(d) for d in topology.split("x")]
    except ValueError:
        dims = []
    if (
        len(dims) != 3
        or any(d < 4 or d % 4 for d in dims)
        or dims != sorted(dims)
        or math.prod(dims) > 9216  # a TPU7x pod
    ):
        raise ValueError(
            f"pool {pool}: slice_topology {topology!r} is not a Slice of whole "
            f"{PARTITION_TOPOLOGY} partitions (AxBxC, each a multiple of 4, non-decreasing, "
            f"at most 9216 chips)"
        )


@dataclass(frozen=True)
class CPUPool:
    """A plain CPU node pool (Ray heads, the operator); no taint, no TPU."""

    name: str
    nodes: int
    cpu: int = 16
    memory_gib: int = 64
    machine_type: str = "n2-standard-16"
    zone: str = "us-east5-b"


NodePool = TPUPool | CPUPool


def tpu_type_for_accelerator(accelerator: str) -> str | None:
    """The TPU type (``v6e``) whose nodes carry ``cloud.google.com/gke-tpu-accelerator`` =
    ``accelerator`` (``tpu-v6e-slice``), or None for a value GKE does not use."""
    for name, tpu in _TPU_TYPES.items():
        if tpu.accelerator == accelerator:
            return name
    return None


def host_chips(tpu_type: str) -> tuple[int, ...]:
    """The chips of ``tpu_type``'s machine types (its single-host shapes have exactly one
    of these many chips), or ValueError naming the known types."""
    tpu = _TPU_TYPES.get(tpu_type)
    if tpu is None:
        raise ValueError(f"unknown TPU type {tpu_type!r} (one of {', '.join(sorted(_TPU_TYPES))})")
    return tpu.chips_per_host


def topology_chips(topology: str) -> int:
    """Chips in a topology string such as ``4x4`` or ``2x2x2``."""
    try:
        dims = [int(d) for d in topology.split("x")]
    except ValueError:
        raise ValueError(f"bad topology {topology!r}") from None
    if not 2 <= len(dims) <= 3 or any(d < 1 for d in dims):
        raise ValueError(f"bad topology {topology!r}")
    return math.prod(dims)


def node_name(pool: str, index: int, cluster: str = "tpusim") -> str:
    """GKE-like node name, stable across runs so logs from two runs compare."""
    return f"gke-{cluster}-{pool}-{index}"


def topology_host(pool: str, index: int, cluster: str = "tpusim") -> str:
    """A stable, opaque ``gce-topology-host`` value per node (GKE's are IDs, not names)."""
    return hashlib.sha256(f"{cluster}/{pool}/{index}".encode()).hexdigest()[:16]


def pool_partition_id(pool: TPUPool, cluster: str = "tpusim") -> str:
    """The 4x4x4 partition id of a dynamic-slicing pool: the one given, else a stable
    opaque id (GKE's are ids, not names), so a Slice made later can name it."""
    if pool.partition_id is not None:
        return pool.partition_id
    return "p" + hashlib.sha256(f"{cluster}/{pool.name}/partition".encode()).hexdigest()[:15]


def _base_labels(pool: str, name: str, machine_type: str, zone: str) -> dict[str, str]:
    region = zone.rsplit("-", 1)[0]
    return {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/instance-type": machine_type,
        "beta.kubernetes.io/os": "linux",
        "cloud.google.com/gke-boot-disk": "pd-balanced",
        "cloud.google.com/gke-container-runtime": "containerd",
        "cloud.google.com/gke-nodepool": pool,
        "cloud.google.com/gke-os-distribution": "cos",
        "cloud.google.com/gke-provisioning": "standard",
        "cloud.google.com/machine-family": machine_type.split("-", 1)[0],
        "cloud.google.com/private-node": "false",
        "failure-domain.beta.kubernetes.io/region": region,
        "failure-domain.beta.kubernetes.io/zone": zone,
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": machine_type,
        "topology.gke.io/zone": zone,
        "topology.kubernetes.io/region": region,
        "topology.kubernetes.io/zone": zone,
    }


def _resources(cpu: int, memory_gib: int, tpu: int | None) -> tuple[dict[str, str], ...]:
    """Capacity and allocatable; allocatable keeps GKE's system reservation out."""
    capacity = {
        "cpu": str(cpu),
        "memory": f"{memory_gib}Gi",
        "pods": "110",
        "ephemeral-storage": "100Gi",
    }
    allocatable = {
        "cpu": f"{cpu * 1000 - min(cpu * 10 + 60, 2000)}m",
        "memory": f"{math.floor(memory_gib * 0.9)}Gi",
        "pods": "110",
        "ephemeral-storage": "90Gi",
    }
    if tpu is not None:
        capacity[TPU_RESOURCE] = allocatable[TPU_RESOURCE] = str(tpu)
    return capacity, allocatable


def _node(
    name: str,
    pool: str,
    labels: dict[str, str],
    taints: list[dict[str, str]],
    resources: tuple[dict[str, str], ...],
) -> dict[str, Any]:
    capacity, allocatable = resources
    spec: dict[str, Any] = {"taints": taints} if taints else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1], POOL_ANNOTATION: pool},
        },
        "spec": spec,
        "status": {"capacity": capacity, "allocatable": allocatable},
    }


def pool_nodes(
    pool: NodePool, cluster: str = "tpusim", indexes: Iterable[int] | None = None
) -> list[dict[str, Any]]:
    """The Node objects (as API dicts) GKE would register for ``pool``.

    ``indexes``: the node indexes to name them by (``node_name``), one per node; default
    ``0 .. nodes-1``. Nodes added to a pool that already has some take indexes its
    existing nodes do not use.
    """
    chosen = list(range(pool.nodes) if indexes is None else indexes)
    if len(chosen) != pool.nodes or len(set(chosen)) != len(chosen) or min(chosen, default=0) < 0:
        raise ValueError(
            f"pool {pool.name}: indexes must be {pool.nodes} distinct numbers >= 0, not {chosen}"
        )
    nodes = []
    for i in chosen:
        name = node_name(pool.name, i, cluster)
        if isinstance(pool, CPUPool):
            labels = _base_labels(pool.name, name, pool.machine_type, pool.zone)
            nodes.append(
                _node(name, pool.name, labels, [], _resources(pool.cpu, pool.memory_gib, None))
            )
            continue
        tpu = _TPU_TYPES[pool.tpu_type]
        machine_type = tpu.machine_type.format(chips=pool.chips_per_node)
        labels = _base_labels(pool.name, name, machine_type, pool.zone)
        labels["cloud.google.com/machine-family"] = tpu.machine_family
        labels["cloud.google.com/gke-tpu-accelerator"] = tpu.accelerator
        labels["cloud.google.com/gke-accelerator-count"] = str(pool.chips_per_node)
        if not pool.dynamic_slicing:
            labels[TOPOLOGY_LABEL] = pool.topology
        else:
            labels[TOPOLOGY_MODE_LABEL] = PROVISION_ONLY
            labels[PARTITION_ID_LABEL] = pool_partition_id(pool, cluster)
            labels[PARTITION_STATE_LABEL] = pool.partition_state
            if pool.slice_name is not None:
                labels[SLICE_LABEL] = pool.slice_name
                labels[TOPOLOGY_LABEL] = pool.slice_topology or PARTITION_TOPOLOGY
        if pool.spot:
            labels[SPOT_LABEL] = "true"
            labels[PROVISIONING_LABEL] = "spot"
        if pool.reservation:
            labels[RESERVATION_LABEL] = pool.reservation
        if pool.flex_start:
            labels[FLEX_START_LABEL] = "true"
            labels[PROVISIONING_LABEL] = "flex-start"
        if pool.topology_block:
            labels[TOPOLOGY_BLOCK_LABEL] = pool.topology_block
            labels[TOPOLOGY_HOST_LABEL] = topology_host(pool.name, i, cluster)
            if pool.topology_subblock:
                labels[TOPOLOGY_SUBBLOCK_LABEL] = pool.topology_subblock
        labels.update(pool.extra_labels)
        resources = _resources(
            tpu.cpu_per_chip * pool.chips_per_node,
            tpu.memory_gib_per_chip * pool.chips_per_node,
            pool.chips_per_node,
        )
        nodes.append(_node(name, pool.name, labels, [dict(TPU_TAINT)], resources))
    return nodes


def pool_from_dict(raw: Mapping[str, Any]) -> NodePool:
    """Build a pool from a YAML/JSON mapping (``tpuType`` absent means a CPU pool)."""
    known = {"name", "tpuType", "topology", "nodes", "chipsPerNode", "zone", "spot"}
    known |= {"reservation", "flexStart", "topologyBlock", "topologySubblock"}
    known |= {"labels", "cpu", "memoryGiB", "machineType"}
    known |= {"dynamicSlicing", "partitionId", "partitionState", "slice", "sliceTopology"}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"unknown node pool fields: {', '.join(sorted(unknown))}")
    name, nodes = str(raw["name"]), int(raw["nodes"])
    zone = str(raw.get("zone", "us-east5-b"))
    if "tpuType" not in raw:
        return CPUPool(
            name,
            nodes,
            cpu=int(raw.get("cpu", 16)),
            memory_gib=int(raw.get("memoryGiB", 64)),
            machine_type=str(raw.get("machineType", "n2-standard-16")),
            zone=zone,
        )
    return TPUPool(
        name,
        str(raw["tpuType"]),
        str(raw["topology"]),
        nodes,
        chips_per_node=int(raw.get("chipsPerNode", 4)),
        zone=zone,
        spot=bool(raw.get("spot", False)),
        reservation=raw.get("reservation"),
        extra_labels={str(k): str(v) for k, v in dict(raw.get("labels", {})).items()},
        flex_start=bool(raw.get("flexStart", False)),
        topology_block=raw.get("topologyBlock"),
        topology_subblock=raw.get("topologySubblock"),
        dynamic_slicing=_flag(raw, "dynamicSlicing"),
        partition_id=_optional_str(raw, "partitionId"),
        partition_state=str(raw.get("partitionState", "HEALTHY")),
        slice_name=_optional_str(raw, "slice"),
        slice_topology=_optional_str(raw, "sliceTopology"),
    )


def _flag(raw: Mapping[str, Any], key: str) -> bool:
    """A YAML boolean; a string such as "false" would otherwise read as true."""
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"node pool field {key} must be true or false, not {value!r}")
    return value


def _optional_str(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    return None if value is None else str(value)


def default_pools() -> tuple[NodePool, ...]:
    """The pools `make dev-cluster` and the e2e tier start with.

    Two whole v6e 4x4 slices so a two-replica multi-host worker group fits, one
    slice each of v5e 2x4 (4-chip hosts) and v4 2x2x2, and CPU nodes for heads.
    """
    return (
        TPUPool("v6e-4x4-a", "v6e", "4x4", nodes=4),
        TPUPool("v6e-4x4-b", "v6e", "4x4", nodes=4),
        TPUPool("v5e-2x4", "v5e", "2x4", nodes=2),
        TPUPool("v4-2x2x2", "v4", "2x2x2", nodes=2),
        CPUPool("cpu", nodes=3),
    )


#: Named pools the CLI takes in place of a spec (``add-pool v6e-2x2-single``); not
#: started by default, so ``default_pools`` (which the e2e counts rely on) is unchanged.
PRESETS: Mapping[str, TPUPool] = {
    # Three single-host v6e 2x2 slices: three ct6e-standard-4t VMs of one pool, each its
    # own slice, as a single-host serving pool looks on GKE.
    "v6e-2x2-single": TPUPool("v6e-2x2-single", "v6e", "2x2", nodes=3),
    # One TPU7x sub-block for dynamic slicing, no Slice formed yet.
    "tpu7x-4x4x4-dynamic": TPUPool(
        "tpu7x-4x4x4-dynamic", "tpu7x", PARTITION_TOPOLOGY, nodes=16, dynamic_slicing=True
    ),
    # Four TPU7x sub-blocks of one topology block, free and HEALTHY: a and b are the
    # partitions of a 4x4x8 Slice (tpusim.slicectl forms it; docs/local-cluster.md), c
    # and d the ones `make demo-slices` leaves to the operator. Fixed partition ids, so
    # a Slice manifest can name them.
    **{
        f"tpu7x-4x4x4-block1-{sub}": TPUPool(
            f"tpu7x-4x4x4-block1-{sub}",
            "tpu7x",
            PARTITION_TOPOLOGY,
            nodes=16,
            dynamic_slicing=True,
            partition_id=f"tpusim-block1-{sub}",
            topology_block="tpusim-block1",
            topology_subblock=f"tpusim-block1-{sub}",
        )
        for sub in ("a", "b", "c", "d")
    },
}

#: The presets of one topology block's two sub-blocks, for a 4x4x8 dynamic slice.
DYNAMIC_BLOCK_PRESETS = ("tpu7x-4x4x4-block1-a", "tpu7x-4x4x4-block1-b")


def preset_pool(name: str) -> TPUPool:
    """The preset pool ``name`` (one of ``PRESETS``)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"no preset pool {name!r} (one of {', '.join(sorted(PRESETS))})") from None


def pool_names(pools: Iterable[NodePool]) -> list[str]:
    """Names of ``pools`` in order, rejecting duplicates (they would share nodes)."""
    names = [p.name for p in pools]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"duplicate node pool names: {', '.join(sorted(dupes))}")
    return names


def parse_pool_spec(spec: str) -> NodePool:
    """Parse the CLI shorthand ``NAME:TYPE:TOPOLOGY:NODES[:CHIPS][,OPTION...]``,
    ``NAME:cpu:NODES`` or a preset's name (``PRESETS``). Options of a TPU pool:
    ``spot``, ``flex-start``, ``reservation=NAME``, ``block=ID``, ``subblock=ID``,
    ``dynamic-slicing``, ``partition=ID``, ``partition-state=STATE``, ``slice=NAME``,
    ``slice-topology=AxBxC`` (see ``TPUPool``)."""
    if spec in PRESETS:
        return PRESETS[spec]
    head, *options = spec.split(",")
    parts = head.split(":")
    try:
        if len(parts) == 3 and parts[1] == "cpu" and not options:
            return CPUPool(parts[0], int(parts[2]))
        if len(parts) in (4, 5):
            chips = int(parts[4]) if len(parts) == 5 else 4
            extra = _pool_options(options)
            return TPUPool(
                parts[0], parts[1], parts[2], int(parts[3]), chips_per_node=chips, **extra
            )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad pool spec {spec!r}: {exc}") from None
    raise ValueError(
        f"bad pool spec {spec!r}: want NAME:TYPE:TOPOLOGY:NODES[:CHIPS][,OPTION...], "
        f"NAME:cpu:NODES or a preset ({', '.join(sorted(PRESETS))})"
    )


#: Option with a value -> the TPUPool field it sets.
_VALUE_OPTIONS = {
    "reservation": "reservation",
    "block": "topology_block",
    "subblock": "topology_subblock",
    "partition": "partition_id",
    "partition-state": "partition_state",
    "slice": "slice_name",
    "slice-topology": "slice_topology",
}
#: Option without a value -> the TPUPool flag it sets.
_FLAG_OPTIONS = {"spot": "spot", "flex-start": "flex_start", "dynamic-slicing": "dynamic_slicing"}


def _pool_options(options: Iterable[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for option in options:
        key, _, value = option.partition("=")
        if key in _FLAG_OPTIONS and not value:
            out[_FLAG_OPTIONS[key]] = True
        elif key in _VALUE_OPTIONS and value:
            out[_VALUE_OPTIONS[key]] = value
        else:
            raise ValueError(
                f"unknown option {option!r} (spot, flex-start, dynamic-slicing, "
                f"reservation=NAME, block=ID, subblock=ID, partition=ID, "
                f"partition-state=STATE, slice=NAME, slice-topology=AxBxC)"
            )
    return out
