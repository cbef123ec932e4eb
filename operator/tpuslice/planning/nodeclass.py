"""Whether a TPU node, and the node pool it is in, can hold one slice of a shape, and why not.

Every TPU node GKE makes falls in exactly one class against a wanted shape, so every
pool that cannot hold a slice is named with one reason. The reasons are data (a
``Fit`` and the counts behind it), so a status can say them in pools today and in
nodes later, and the planner's eligibility and its messages come from this one place.

Where the facts come from:

- A multi-host slice is one node pool whose nodes all carry the slice's
  ``cloud.google.com/gke-tpu-accelerator`` and ``cloud.google.com/gke-tpu-topology``,
  each with its chips as the ``google.com/tpu`` resource (GKE "Plan TPUs in GKE",
  https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus).
- TPU7x dynamic slicing (GKE "Use dynamic slicing with a custom scheduler",
  https://docs.cloud.google.com/kubernetes-engine/docs/how-to/create-dynamic-slices):
  a sub-block pool is created with ``--accelerator-topology-mode=provision_only``; its
  nodes carry ``cloud.google.com/gke-accelerator-topology-mode: PROVISION_ONLY`` and
  ``cloud.google.com/gke-tpu-partition-<shape>-id``; "ICI is not active", so "you
  can't run workloads on these node pools directly": a Slice must form on them first.
- When a Slice forms, GKE's slice controller labels its nodes
  ``cloud.google.com/gke-tpu-slice=<Slice name>`` and sets their
  ``cloud.google.com/gke-tpu-topology`` to the Slice's topology (same page). Such nodes
  then look like an ordinary pool of that topology, but they belong to whoever created
  the Slice. For a node pool they are never claimable: a Slice's nodes are reached only
  through ``reservation.policy: DynamicSlice``, which reserves the partitions and forms
  the Slice itself (planning/partitions.py, planning/dynamic.py); ``owned_slices``
  names the Slices a caller may treat as its own.
- A node with GKE's impending-termination taint, in host maintenance, or in an
  UNHEALTHY tpu7x partition (planning.disruption) is about to lose its slice: its unit
  is not claimed until the signal clears.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from tpuslice.model.constants import (
    NODE_LABEL_ACCELERATOR_TOPOLOGY_MODE,
    NODE_LABEL_TPU_PARTITION_ID_SUFFIX,
    NODE_LABEL_TPU_PARTITION_PREFIX,
    NODE_LABEL_TPU_SLICE,
    TOPOLOGY_MODE_PROVISION_ONLY,
    TPU_RESOURCE,
)
from tpuslice.model.records import NodeInfo
from tpuslice.planning.disruption import blocking_signal

__all__ = [
    "QUARANTINED",
    "Fit",
    "NodeFit",
    "PoolFit",
    "WantedShape",
    "classify_node",
    "classify_pool",
    "in_foreign_slice",
    "is_slicing_block",
]

#: How the reason of a unit kept out for a GKE disruption signal ends.
QUARANTINED = "not claimed until it clears"


class Fit(enum.Enum):
    """One node's (or one pool's) class against a wanted shape; the order of the
    members is the order a pool's reasons are looked for (the first that applies wins)."""

    #: labels, chips and health all match: the node can host one of the slice's pods
    USABLE = "Usable"
    #: its accelerator or topology label is not the shape's
    OTHER_SHAPE = "OtherShape"
    #: inside a formed GKE Slice someone else owns
    IN_GKE_SLICE = "InGKESlice"
    #: a dynamic-slicing sub-block (PROVISION_ONLY or a partition id): no ICI until a
    #: Slice forms on it
    SLICING_BLOCK = "SlicingBlock"
    #: (pool only) not exactly one node per host of the slice
    NODE_COUNT = "NodeCount"
    #: GKE is terminating a node, maintaining it, or its tpu7x partition is UNHEALTHY
    DISRUPTED = "Disrupted"
    NOT_READY = "NotReady"
    CORDONED = "Cordoned"
    #: the right labels, but a different google.com/tpu than the shape's chips per host
    CHIP_COUNT = "ChipCount"


@dataclass(frozen=True)
class WantedShape:
    """What one slice needs of a node pool."""

    accelerator: str
    topology: str
    hosts: int
    chips_per_host: int

    def describe(self) -> str:
        return f"{self.hosts} ready nodes with {self.accelerator}/{self.topology}"


@dataclass(frozen=True)
class NodeFit:
    """One node's class; ``gke_slice`` names the Slice for ``IN_GKE_SLICE``, ``signal``
    the disruption of ``DISRUPTED`` (the rest of ``node <name> ...``)."""

    node: str
    fit: Fit
    gke_slice: str = ""
    signal: str = ""


@dataclass(frozen=True)
class PoolFit:
    """One pool's class and the counts that explain it.

    ``nodes`` is how many of the pool's ``total`` nodes have the reason; ``found`` and
    ``needed`` are the two numbers compared (nodes for ``NODE_COUNT``, google.com/tpu
    for ``CHIP_COUNT``); ``gke_slice`` the Slice of ``IN_GKE_SLICE``.
    """

    pool: str
    fit: Fit
    nodes: int = 0
    total: int = 0
    found: int = 0
    needed: int = 0
    gke_slice: str = ""
    #: DISRUPTED: the first disrupted node (by name) and what it says
    node: str = ""
    signal: str = ""

    @property
    def usable(self) -> bool:
        return self.fit is Fit.USABLE

    def problem(self) -> str:
        """Why the pool cannot hold the slice, as the rest of ``<pool> ...``; empty when
        it can."""
        of = f"{self.nodes} of {self.total} nodes"
        if self.total == 1 and self.fit in (
            Fit.NOT_READY,
            Fit.CORDONED,
            Fit.CHIP_COUNT,
            Fit.DISRUPTED,
        ):
            return self._one_node()
        match self.fit:
            case Fit.USABLE:
                return ""
            case Fit.OTHER_SHAPE:
                return f"has {of} of another accelerator or topology"
            case Fit.IN_GKE_SLICE:
                return (
                    f"has {of} in GKE Slice {self.gke_slice} ({NODE_LABEL_TPU_SLICE}); "
                    "they belong to that Slice's owner"
                )
            case Fit.SLICING_BLOCK:
                return (
                    f"is a dynamic-slicing sub-block ({of} {TOPOLOGY_MODE_PROVISION_ONLY} "
                    f"in {NODE_LABEL_ACCELERATOR_TOPOLOGY_MODE} or with a "
                    f"{NODE_LABEL_TPU_PARTITION_PREFIX}*{NODE_LABEL_TPU_PARTITION_ID_SUFFIX} "
                    "label): its ICI is not active and no pod can run on it until a GKE "
                    "Slice forms on it"
                )
            case Fit.NODE_COUNT:
                return f"has {self.found} nodes (needs {self.needed})"
            case Fit.DISRUPTED:
                return f"has node {self.node} that {self.signal}; {QUARANTINED}"
            case Fit.NOT_READY:
                return f"has {of} NotReady"
            case Fit.CORDONED:
                return f"has {of} cordoned"
            case Fit.CHIP_COUNT:
                return f"has {of} with {self.found} {TPU_RESOURCE} (needs {self.needed} per node)"

    def _one_node(self) -> str:
        """The same, for a unit of one node (a single-host slice's)."""
        if self.fit is Fit.NOT_READY:
            return "is NotReady"
        if self.fit is Fit.CORDONED:
            return "is cordoned"
        if self.fit is Fit.DISRUPTED:
            return f"{self.signal}; {QUARANTINED}"
        return f"has {self.found} {TPU_RESOURCE} (needs {self.needed})"


def is_slicing_block(node: NodeInfo) -> bool:
    """A node of a dynamic-slicing sub-block: PROVISION_ONLY, or a partition id label."""
    return node.topology_mode == TOPOLOGY_MODE_PROVISION_ONLY or bool(node.partition_labels)


def in_foreign_slice(node: NodeInfo, owned_slices: Collection[str]) -> bool:
    """A node of a formed GKE Slice not in ``owned_slices``."""
    return bool(node.gke_slice) and node.gke_slice not in owned_slices


def classify_node(
    node: NodeInfo, wanted: WantedShape, owned_slices: Collection[str] = ()
) -> NodeFit:
    """The class of one node against ``wanted`` (health last: a node of a block or of
    someone's Slice is never ours, however healthy).

    A node in a Slice of ``owned_slices`` keeps its partition labels, but its ICI is
    active (the Slice formed), so it is judged like an ordinary node.
    """
    if node.accelerator != wanted.accelerator or node.topology != wanted.topology:
        return NodeFit(node.name, Fit.OTHER_SHAPE)
    if in_foreign_slice(node, owned_slices):
        return NodeFit(node.name, Fit.IN_GKE_SLICE, node.gke_slice)
    if not node.gke_slice and is_slicing_block(node):
        return NodeFit(node.name, Fit.SLICING_BLOCK)
    if (signal := blocking_signal(node)) is not None:
        return NodeFit(node.name, Fit.DISRUPTED, signal=signal.describe())
    if not node.ready:
        return NodeFit(node.name, Fit.NOT_READY)
    if not node.schedulable:
        return NodeFit(node.name, Fit.CORDONED)
    if node.chips != wanted.chips_per_host:
        return NodeFit(node.name, Fit.CHIP_COUNT)
    return NodeFit(node.name, Fit.USABLE)


def classify_pool(
    pool: str,
    nodes: Sequence[NodeInfo],
    wanted: WantedShape,
    owned_slices: Collection[str] = (),
) -> PoolFit:
    """The class of one pool: its nodes' reasons in ``Fit`` order, the node count
    (exactly ``wanted.hosts`` nodes) checked after the reasons that make the pool never
    ours and before the health of its nodes. An empty pool has 0 nodes (``NODE_COUNT``).
    """
    by_fit: dict[Fit, list[NodeFit]] = {}
    for n in nodes:  # one walk, grouped by class (every pool of the shape, every pass)
        node_fit = classify_node(n, wanted, owned_slices)
        by_fit.setdefault(node_fit.fit, []).append(node_fit)
    total = len(nodes)
    if len(by_fit) == 1 and Fit.USABLE in by_fit and total == wanted.hosts:
        return PoolFit(pool, Fit.USABLE, total, total)

    def with_fit(fit: Fit) -> list[NodeFit]:
        return by_fit.get(fit, [])

    for fit in (Fit.OTHER_SHAPE, Fit.IN_GKE_SLICE, Fit.SLICING_BLOCK):
        if found := with_fit(fit):
            slices = sorted({f.gke_slice for f in found if f.gke_slice})
            return PoolFit(pool, fit, len(found), total, gke_slice=", ".join(slices))
    if total != wanted.hosts:
        return PoolFit(pool, Fit.NODE_COUNT, total, total, found=total, needed=wanted.hosts)
    if found := sorted(with_fit(Fit.DISRUPTED), key=lambda f: f.node):
        first = found[0]
        return PoolFit(pool, Fit.DISRUPTED, len(found), total, node=first.node, signal=first.signal)
    for fit in (Fit.NOT_READY, Fit.CORDONED):
        if found := with_fit(fit):
            return PoolFit(pool, fit, len(found), total)
    if found := with_fit(Fit.CHIP_COUNT):
        by_name = {n.name: n for n in nodes}
        chips = min(by_name[f.node].chips for f in found)
        odd = [f for f in found if by_name[f.node].chips == chips]
        return PoolFit(
            pool, Fit.CHIP_COUNT, len(odd), total, found=chips, needed=wanted.chips_per_host
        )
    return PoolFit(pool, Fit.USABLE, total, total)
