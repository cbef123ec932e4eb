"""TPU7x dynamic slicing: the partition, the capacity unit a dynamic slice holds. Pure.

With ``spec.reservation.policy`` DynamicSlice a slice is not one node pool: it is a GKE
``Slice`` linking ``chips / 64`` free 4x4x4 partitions, and it holds each of them with a
SliceReservation of its own (``CapacityUnit.PARTITION``; one partition is one sub-block
node pool, so the reservation is named after that pool and two slices, of any policy,
never take one partition). This module reads the partitions off the nodes, says which
are free and usable and why not, chooses a slice's (and a multislice gang's)
partitions, names the Slice, and reads where a Slice stands.

Where the facts come from:

- GKE "Use dynamic slicing with a custom scheduler",
  https://cloud.google.com/kubernetes-engine/docs/how-to/create-dynamic-slices: nodes of
  a sub-block pool carry ``cloud.google.com/gke-tpu-partition-4x4x4-id`` and ``-state``
  (HEALTHY, DEGRADED usable; UNHEALTHY, UNSET, INCOMPLETE not); the Slice (spec ``type``,
  ``topology``, ``partitionIds``) and its Ready reasons (ACTIVATING, ACTIVE,
  ACTIVE_DEGRADED, FAILED, SliceCreationFailed, ...); an ACTIVE Slice's nodes labelled
  ``cloud.google.com/gke-tpu-slice=<Slice>``; the finalizer
  ``accelerator.gke.io/slice-finalizer``.
- "Configure TPUs with GKE dynamic slicing",
  https://cloud.google.com/kubernetes-engine/docs/how-to/use-gke-dynamic-slicing: one
  node pool per sub-block, 16 TPU VMs, 4x4x4 chips.
- GKE's own Kueue-based slice controller (AI-Hypercomputer/xpk, ``slice/``, as read in
  /work/shared/docs/fleet-facts.md section 3) asks Kueue's topology-aware scheduling for
  the slice inside one ``cloud.google.com/gce-topology-block`` (``podset-required-
  topology``), takes HEALTHY and DEGRADED partitions by default, and deletes a Slice
  that is FAILED or not Ready within its activation timeout (3 minutes).

What is chosen here where those are silent: a slice's partitions are all of one
topology block when the nodes say their block (ICI links stay inside a block; the
simulated controller in hack/tpusim refuses a Slice over two); a gang prefers one block
for all its slices, else as few blocks as it can, the fullest fitting block first (best
fit keeps the large free blocks whole for large slices); DEGRADED partitions only when
the caller allows them; partitions of a Slice that just failed are taken last.
"""

from __future__ import annotations

import enum
import hashlib
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tpuslice.model.constants import (
    NODE_LABEL_TPU_PARTITION_ID,
    NODE_LABEL_TPU_PARTITION_STATE,
    SLICE_MAX_NAME,
)
from tpuslice.model.records import (
    GkeSliceInfo,
    Holder,
    NodeInfo,
    ReservationInfo,
    Shape,
    ShapePool,
)
from tpuslice.model.topology import (
    CHIPS_PER_PARTITION,
    DYNAMIC_GENERATION,
    MULTI_HOST_CHIPS_PER_HOST,
    PARTITION_TOPOLOGY,
    SliceShape,
    dynamic_slice_shape,
)
from tpuslice.planning.disruption import blocking_signal
from tpuslice.planning.nodeclass import QUARANTINED

__all__ = [
    "ACTIVATION_TIMEOUT_SECONDS",
    "PARTITION_HOSTS",
    "Partition",
    "SliceStage",
    "choose_partitions",
    "free_partitions",
    "gke_slice_name",
    "partition_inventory",
    "partition_pools",
    "partition_problem",
    "partition_shape",
    "partition_slice_shape",
    "partitions_needed",
    "retry_delay",
    "slice_stage",
    "taken_by_slices",
    "unusable_partitions",
]

#: Hosts of one 4x4x4 partition (one sub-block node pool).
PARTITION_HOSTS = CHIPS_PER_PARTITION // MULTI_HOST_CHIPS_PER_HOST
HEALTHY = "HEALTHY"
DEGRADED = "DEGRADED"
#: The order a partition's state is judged in: its worst node's state wins.
_STATE_ORDER = ("UNHEALTHY", "INCOMPLETE", "UNSET", DEGRADED, HEALTHY)
#: A Slice not Ready this long after it was created is stale and replaced, as GKE's own
#: slice controller does (its ``--activation-timeout``, default 3 minutes).
ACTIVATION_TIMEOUT_SECONDS = 180
#: Backoff between attempts of one slice after its Slice failed.
RETRY_BASE_SECONDS = 5
RETRY_MAX_SECONDS = 300


@dataclass(frozen=True)
class Partition:
    """One 4x4x4 partition as its nodes describe it."""

    id: str
    #: the node pool of its nodes (a sub-block): the name its SliceReservation takes
    pool: str
    nodes: tuple[NodeInfo, ...]
    #: cloud.google.com/gce-topology-block when every node agrees on one
    block: str | None
    #: the worst state its nodes carry (UNSET when a node carries none)
    state: str
    #: GKE Slices (cloud.google.com/gke-tpu-slice) its nodes are in
    gke_slices: frozenset[str]
    #: how many node pools its nodes are in (1 for a partition GKE made)
    pools: int = 1


def partition_shape(accelerator: str) -> Shape:
    """The queue every dynamic slice of ``accelerator`` waits in: (accelerator, 4x4x4).

    Dynamic slices of every topology (4x4x4, 4x4x8, 8x8x8, ...) compete for the same
    4x4x4 partitions, so the shape of their queue is the partition's, not the slice's:
    one queue per accelerator, its units partitions. A partition's SliceReservation is
    of this shape too (it holds one 4x4x4 partition of 16 hosts), so every dynamic
    object reads every partition's reservation and the namespace usage counts its
    chips (64) per partition."""
    return accelerator, PARTITION_TOPOLOGY


def partition_slice_shape() -> SliceShape:
    """One partition as a slice shape (tpu7x 4x4x4, 16 hosts): what its SliceReservation
    says it holds."""
    return dynamic_slice_shape(DYNAMIC_GENERATION, PARTITION_TOPOLOGY)


def partitions_needed(chips: int) -> int:
    """Partitions a dynamic slice of ``chips`` chips links (one per 64 chips)."""
    return max(1, chips // CHIPS_PER_PARTITION)


def _worst(states: Iterable[str]) -> str:
    found = set(states)
    return next((s for s in _STATE_ORDER if s in found), "UNSET")


def partition_inventory(nodes: Iterable[NodeInfo]) -> dict[str, Partition]:
    """Every partition the nodes carry an id for, by id (nodes of ordinary pools are
    skipped)."""
    by_id: dict[str, list[NodeInfo]] = defaultdict(list)
    for node in nodes:
        pid = node.labels.get(NODE_LABEL_TPU_PARTITION_ID)
        if pid:
            by_id[pid].append(node)
    inventory = {}
    for pid, members in sorted(by_id.items()):
        members.sort(key=lambda n: n.name)
        blocks = {n.block for n in members}
        pools = sorted({n.pool for n in members})
        inventory[pid] = Partition(
            id=pid,
            pool=pools[0],
            nodes=tuple(members),
            block=blocks.pop() if len(blocks) == 1 else None,
            state=_worst(n.labels.get(NODE_LABEL_TPU_PARTITION_STATE, "UNSET") for n in members),
            gke_slices=frozenset(n.gke_slice for n in members if n.gke_slice),
            pools=len(pools),
        )
    return inventory


def partition_problem(
    partition: Partition,
    *,
    owned_slices: Collection[str] = (),
    allow_degraded: bool = False,
    accelerator: str = "tpu7x",
) -> str | None:
    """Why ``partition`` cannot be linked into a slice now (the rest of ``partition <id>
    ...``), or None when it can. A partition in someone else's Slice is never ours; one
    whose state is not usable is quarantined while that lasts."""
    nodes = partition.nodes
    if any(n.accelerator != accelerator for n in nodes):
        return f"has nodes that are not {accelerator}"
    if foreign := sorted(partition.gke_slices - set(owned_slices)):
        return f"is in GKE Slice {', '.join(foreign)}; it belongs to that Slice's owner"
    if partition.pools != 1:
        return f"spans {partition.pools} node pools"
    if len(nodes) != PARTITION_HOSTS:
        return f"has {len(nodes)} nodes (needs {PARTITION_HOSTS})"
    usable = (HEALTHY, DEGRADED) if allow_degraded else (HEALTHY,)
    if partition.state not in usable:
        return f"is {partition.state}; {QUARANTINED}"
    for node in nodes:
        if (signal := blocking_signal(node)) is not None:
            return f"has node {node.name} that {signal.describe()}; {QUARANTINED}"
    if not_ready := sum(1 for n in nodes if not n.ready):
        return f"has {not_ready} of {len(nodes)} nodes NotReady"
    if cordoned := sum(1 for n in nodes if not n.schedulable):
        return f"has {cordoned} of {len(nodes)} nodes cordoned"
    return None


def taken_by_slices(slices: Iterable[GkeSliceInfo], ours: Collection[str]) -> dict[str, str]:
    """Partition id -> the Slice holding it, for every Slice not named in ``ours`` (the
    object's own): a Slice holds its partitions from its creation until it is gone,
    whoever created it, so its partitions are taken before its nodes are labelled."""
    return {pid: s.name for s in slices if s.name not in ours for pid in s.partition_ids}


def free_partitions(
    inventory: Mapping[str, Partition],
    *,
    held_pools: Collection[str],
    slices: Iterable[GkeSliceInfo],
    ours: Collection[str] = (),
    allow_degraded: bool = False,
) -> list[Partition]:
    """The partitions a slice may claim now, by id: usable, in no Slice but ``ours``
    (``taken_by_slices``) and their pool held by no SliceReservation."""
    taken = taken_by_slices(slices, ours)
    return [
        p
        for pid, p in sorted(inventory.items())
        if pid not in taken
        and p.pool not in held_pools
        and partition_problem(p, owned_slices=ours, allow_degraded=allow_degraded) is None
    ]


def partition_pools(
    inventory: Mapping[str, Partition],
    reservations: Iterable[ReservationInfo],
    slices: Iterable[GkeSliceInfo],
) -> list[ShapePool]:
    """Every partition as the shape's queue counts units (by its pool's name): eligible
    when a slice could link it now (``partition_problem`` over HEALTHY partitions, the
    operator's own Slices not held against it) and it is in no Slice the operator did not
    make; its holder its SliceReservation's. The same for every object that reads it, so
    every member of the queue takes the same decision: a DEGRADED partition, which only
    objects allowing it take, is outside the queue (``plan_dynamic_slices``)."""
    slices = list(slices)
    ours = {s.name for s in slices if s.owner is not None}
    foreign = taken_by_slices(slices, ours)
    held = {r.pool: r.holder for r in reservations}
    return [
        ShapePool(
            name=p.pool,
            eligible=p.id not in foreign and partition_problem(p, owned_slices=ours) is None,
            holder=held.get(p.pool),
            block=p.block,
        )
        for p in sorted(inventory.values(), key=lambda p: p.pool)
    ]


def choose_partitions(
    free: Sequence[Partition],
    needs: Sequence[int],
    *,
    anchor_blocks: Collection[str | None] = (),
    avoid: Collection[str] = (),
) -> tuple[tuple[str, ...], ...] | None:
    """Partition ids for each slice of ``needs`` (partitions per slice), all or None.

    Each slice's partitions share one topology block (partitions without a block label
    count as one block of their own). The whole set prefers one block: the block of
    ``anchor_blocks`` (where the gang already holds partitions), else the fitting block
    with the fewest free partitions, then by name. When no block holds them all, each
    slice, largest first, goes to a block the set already uses when one fits, else the
    fullest fitting block. Within a block the partitions of ``avoid`` (a failed Slice's)
    come last, then by id. Pure and stable.
    """
    if not needs:
        return ()
    blocks: dict[str | None, list[Partition]] = defaultdict(list)
    for p in sorted(free, key=lambda p: (p.id in avoid, p.id)):
        blocks[p.block].append(p)

    def rank(block: str | None, size: int) -> tuple[bool, int, str]:
        return (block not in anchor_blocks, size, block or "")

    total = sum(needs)
    fitting = [b for b, ps in blocks.items() if len(ps) >= total]
    if fitting:
        home = min(fitting, key=lambda b: rank(b, len(blocks[b])))
        ids = [p.id for p in blocks[home]]
        out, at = [], 0
        for need in needs:
            out.append(tuple(ids[at : at + need]))
            at += need
        return tuple(out)
    left = {b: list(ps) for b, ps in blocks.items()}
    used: set[str | None] = set(anchor_blocks)
    chosen: dict[int, tuple[str, ...]] = {}
    for i in sorted(range(len(needs)), key=lambda i: (-needs[i], i)):
        need = needs[i]
        fits = [b for b, ps in left.items() if len(ps) >= need]
        if not fits:
            return None
        block = min(fits, key=lambda b: (b not in used, len(left[b]), b or ""))
        chosen[i] = tuple(p.id for p in left[block][:need])
        left[block] = left[block][need:]
        used.add(block)
    return tuple(chosen[i] for i in range(len(needs)))


def unusable_partitions(
    ids: Iterable[str], inventory: Mapping[str, Partition], *, allow_degraded: bool = False
) -> tuple[str, ...]:
    """Those of ``ids`` whose state is not usable now (or that are gone): what a failed
    Slice leaves quarantined, while its other partitions are given back."""
    usable = (HEALTHY, DEGRADED) if allow_degraded else (HEALTHY,)
    return tuple(
        sorted(
            pid
            for pid in ids
            if (p := inventory.get(pid)) is None
            or p.state not in usable
            or len(p.nodes) != PARTITION_HOSTS
        )
    )


def gke_slice_name(holder: Holder, partition_ids: Iterable[str]) -> str:
    """The Slice's name: ``<namespace>-<name>-<slice>``, cut to fit, and a digest of the
    holder and the partitions, so a retry on other partitions never waits for the failed
    Slice's name to be free, and two objects never share a name. At most 49 characters
    (GKE's Slice reference), a DNS-1035 label (it must start with a letter)."""
    index = holder.replica_name if holder.replica_index is None else str(holder.replica_index)
    group = f"{holder.group}-" if holder.group else ""
    room = SLICE_MAX_NAME - 9
    # the object and slice are kept whole before the namespace is cut
    tail = f"{holder.name}-{group}{index}"[: room - 2]
    base = f"{holder.namespace[: max(1, room - len(tail) - 1)]}-{tail}".lower()
    base = "".join(ch if ch.isascii() and (ch.isalnum() or ch == "-") else "-" for ch in base)
    if not base[:1].isalpha():
        base = f"s{base}"
    key = "/".join((holder.kind, holder.namespace, holder.name, holder.uid, holder.replica_name))
    digest = hashlib.sha256(f"{key}|{','.join(sorted(partition_ids))}".encode()).hexdigest()
    return f"{base[:room].rstrip('-')}-{digest[:8]}"


class SliceStage(enum.StrEnum):
    """Where one dynamic slice's GKE Slice stands, as the pass acts on it."""

    #: no Slice yet: create it over the held partitions
    MISSING = "Missing"
    #: created, not Ready yet (ACTIVATING, or no reason written)
    FORMING = "Forming"
    #: Ready: pin the slice's pods to it
    ACTIVE = "Active"
    #: FAILED, SliceCreationFailed, ACTIVE_DEGRADED when degraded slices are refused,
    #: or not Ready within ACTIVATION_TIMEOUT_SECONDS: delete it and retry elsewhere
    FAILED = "Failed"
    #: being deleted: GKE's finalizer holds it until its partitions are unlinked
    DELETING = "Deleting"


_FAILED_REASONS = frozenset({"FAILED", "SliceCreationFailed"})
_DEGRADED_REASON = "ACTIVE_DEGRADED"


def slice_stage(
    info: GkeSliceInfo | None,
    *,
    allow_degraded: bool = False,
    age_seconds: float | None = None,
) -> SliceStage:
    """The stage of ``info`` (None: no Slice). ``age_seconds`` since its creation makes a
    Slice still forming past ``ACTIVATION_TIMEOUT_SECONDS`` failed (stale)."""
    if info is None:
        return SliceStage.MISSING
    if info.deleting:
        return SliceStage.DELETING
    if info.reason in _FAILED_REASONS:
        return SliceStage.FAILED
    if info.reason == _DEGRADED_REASON:
        return SliceStage.ACTIVE if allow_degraded and info.ready else SliceStage.FAILED
    if info.ready:
        return SliceStage.ACTIVE
    if age_seconds is not None and age_seconds > ACTIVATION_TIMEOUT_SECONDS:
        return SliceStage.FAILED
    return SliceStage.FORMING


def retry_delay(failures: int) -> float:
    """Seconds before the next attempt after ``failures`` failed Slices of one slice:
    5 s doubling, at most 5 minutes."""
    if failures <= 0:
        return 0.0
    return float(min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2 ** min(failures - 1, 16)))
