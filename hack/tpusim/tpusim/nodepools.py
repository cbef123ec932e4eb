"""Fake GKE node pools: a declarative pool description -> the Node objects GKE would make.

The local cluster is only useful if the real scheduler sees the same labels,
taints and capacity it would see on GKE; a pod spec that schedules here must
schedule there and vice versa. Everything in this module is pure data in, data
out, so the GKE shape of a node is unit-tested without a cluster.

The TPU type table is deliberately local and written from GKE's documentation
("About TPUs in GKE", "Plan TPUs in GKE": machine types, the
``cloud.google.com/gke-tpu-accelerator`` values, chips per host), never imported
from the operator: a fake GKE that took its labels from ``tpuslice.topology``
would mirror a wrong label there and every e2e scenario would still pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "KWOK_ANNOTATION",
    "POOL_ANNOTATION",
    "TPU_RESOURCE",
    "TPU_TAINT",
    "CPUPool",
    "NodePool",
    "TPUPool",
    "default_pools",
    "parse_pool_spec",
    "pool_from_dict",
    "pool_names",
    "pool_nodes",
    "topology_chips",
]

#: KWOK manages exactly the Nodes carrying this annotation (its controller flag
#: ``--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake``).
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
#: Marks nodes the harness created, so remove/cleanup never touches other nodes.
#: An annotation, not a label: the labels must stay exactly GKE's.
POOL_ANNOTATION = "tpuslice.dev/devcluster-pool"
TPU_RESOURCE = "google.com/tpu"
TPU_TAINT: dict[str, str] = {"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}


@dataclass(frozen=True)
class _TPUType:
    """The GKE machines of one TPU generation, as GKE's documentation lists them."""

    accelerator: str  # cloud.google.com/gke-tpu-accelerator
    chips_per_host: tuple[int, ...]  # chips of the generation's machine types
    machine_family: str  # cloud.google.com/machine-family
    machine_type: str  # format string over the chips per host
    cpu_per_chip: int  # vCPU of the 4-chip host / 4
    memory_gib_per_chip: int


_TPU_TYPES: dict[str, _TPUType] = {
    # ct4p-hightpu-4t
    "v4": _TPUType("tpu-v4-podslice", (4,), "ct4p", "ct4p-hightpu-{chips}t", 60, 100),
    # ct5lp-hightpu-1t / -4t / -8t
    "v5e": _TPUType("tpu-v5-lite-podslice", (1, 4, 8), "ct5lp", "ct5lp-hightpu-{chips}t", 28, 48),
    # ct5p-hightpu-4t
    "v5p": _TPUType("tpu-v5p-slice", (4,), "ct5p", "ct5p-hightpu-{chips}t", 52, 112),
    # ct6e-standard-1t / -4t / -8t
    "v6e": _TPUType("tpu-v6e-slice", (1, 4, 8), "ct6e", "ct6e-standard-{chips}t", 45, 180),
    # tpu7x-standard-4t (and the 1-chip host of the 1x1x1 shape)
    "tpu7x": _TPUType("tpu7x", (1, 4), "tpu7x", "tpu7x-standard-{chips}t", 56, 240),
}


@dataclass(frozen=True)
class TPUPool:
    """One GKE TPU node pool; a multi-host pool is exactly one slice.

    ``nodes * chips_per_node`` must equal the chips in ``topology`` for a
    multi-host slice (GKE creates the pool as a unit). A single-host pool may
    have any number of nodes, each one slice of ``topology``.
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


def pool_nodes(pool: NodePool, cluster: str = "tpusim") -> list[dict[str, Any]]:
    """The Node objects (as API dicts) GKE would register for ``pool``."""
    nodes = []
    for i in range(pool.nodes):
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
        labels["cloud.google.com/gke-tpu-topology"] = pool.topology
        labels["cloud.google.com/gke-accelerator-count"] = str(pool.chips_per_node)
        if pool.spot:
            labels["cloud.google.com/gke-spot"] = "true"
        if pool.reservation:
            labels["cloud.google.com/reservation-name"] = pool.reservation
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
    known |= {"reservation", "labels", "cpu", "memoryGiB", "machineType"}
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
    )


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


def pool_names(pools: Iterable[NodePool]) -> list[str]:
    """Names of ``pools`` in order, rejecting duplicates (they would share nodes)."""
    names = [p.name for p in pools]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"duplicate node pool names: {', '.join(sorted(dupes))}")
    return names


def parse_pool_spec(spec: str) -> NodePool:
    """Parse the CLI shorthand ``NAME:TYPE:TOPOLOGY:NODES[:CHIPS]`` or ``NAME:cpu:NODES``."""
    parts = spec.split(":")
    try:
        if len(parts) == 3 and parts[1] == "cpu":
            return CPUPool(parts[0], int(parts[2]))
        if len(parts) in (4, 5):
            chips = int(parts[4]) if len(parts) == 5 else 4
            return TPUPool(parts[0], parts[1], parts[2], int(parts[3]), chips_per_node=chips)
    except ValueError as exc:
        raise ValueError(f"bad pool spec {spec!r}: {exc}") from None
    raise ValueError(
        f"bad pool spec {spec!r}: want NAME:TYPE:TOPOLOGY:NODES[:CHIPS] or NAME:cpu:NODES"
    )
