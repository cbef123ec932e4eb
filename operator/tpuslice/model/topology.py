"""TPU generations and slice shapes: the arithmetic everything else builds on.

A TPUSliceCluster names a generation and a topology; from those two (and, only
for the ambiguous v5e/v6e ``2x4``, the chips per host) follow the GKE node
labels to select, the chips each pod requests, how many pods one slice needs,
and the accelerator-type name Ray matches slices by. Getting any of them wrong
fails silently on a real cluster (pods that never schedule, a Ray pod type that
never matches), so the rules live here once, as pure functions, with tables of
tests over every generation.

Shapes follow what GKE offers and what Ray >= 2.54 accepts in
``ray.util.tpu.slice_placement_group`` (its ``VALID_TPU_TOPOLOGY`` table), so a
cluster we build is one Ray can reserve. TPU7x additionally accepts the
single-chip ``1x1x1`` GKE offers on ``tpu7x-standard-1t``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "CHIPS_PER_PARTITION",
    "DYNAMIC_GENERATION",
    "GENERATIONS",
    "MAX_DYNAMIC_SLICE_CHIPS",
    "PARTITION_TOPOLOGY",
    "Generation",
    "SliceShape",
    "TopologyError",
    "dynamic_slice_shape",
    "generation_names",
    "resolve_generation",
    "slice_shape",
]


class TopologyError(ValueError):
    """A TPU type, topology or chips-per-host value that no GKE slice has.

    ``field`` names the input that is wrong (``type``, ``topology`` or
    ``chipsPerHost``) so callers can prefix their own path (``spec.tpu.``).
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Generation:
    """One TPU generation as GKE and Ray name it."""

    name: str  # canonical short name used in our API: v4, v5e, v5p, v6e, tpu7x
    gke_accelerator: str  # value of cloud.google.com/gke-tpu-accelerator
    type_prefix: str  # accelerator-type prefix: TPU_ACCELERATOR_TYPE is "<prefix>-<n>"
    ray_version: str  # Ray's accelerator_version spelling (slice_placement_group)
    dimensions: int  # 2 for v5e/v6e, 3 for the others
    cores_per_chip: int  # 2 where type names count TensorCores, 1 where they count chips
    host_chip_options: tuple[int, ...]  # chips per host of GKE's machine types
    shapes: frozenset[str]  # topologies GKE offers (and Ray accepts)
    aliases: tuple[str, ...]  # other spellings users write (GKE label, Ray name)
    shape_rule: str  # the offered shapes in words, for error messages


def _larger_3d_shapes(max_x: int, max_y: int, max_z: int) -> set[str]:
    """Shapes whose every dimension is a multiple of 4 (whole 4-chip hosts)."""
    return {
        f"{x}x{y}x{z}"
        for x, y, z in itertools.product(
            range(4, max_x + 1, 4), range(4, max_y + 1, 4), range(4, max_z + 1, 4)
        )
    }


_SMALL_3D = {"2x2x1", "2x2x2", "2x2x4", "2x4x4"}
_SHAPES_2D = frozenset({"1x1", "2x2", "2x4", "2x8", "4x4", "4x8", "8x8", "8x16", "16x16"})

GENERATIONS: tuple[Generation, ...] = (
    Generation(
        name="v4",
        gke_accelerator="tpu-v4-podslice",
        type_prefix="v4",
        ray_version="v4",
        dimensions=3,
        cores_per_chip=2,
        host_chip_options=(4,),
        shapes=frozenset(_SMALL_3D | _larger_3d_shapes(12, 12, 16)),
        aliases=("tpu-v4-podslice",),
        shape_rule="2x2x1, 2x2x2, 2x2x4, 2x4x4, or AxBxC with A and B in 4, 8, 12 "
        "and C in 4, 8, 12, 16",
    ),
    Generation(
        name="v5e",
        gke_accelerator="tpu-v5-lite-podslice",
        type_prefix="v5litepod",
        ray_version="v5litepod",
        dimensions=2,
        cores_per_chip=1,
        host_chip_options=(1, 4, 8),
        shapes=_SHAPES_2D,
        aliases=("v5litepod", "tpu-v5-lite-podslice"),
        shape_rule="1x1, 2x2, 2x4, 2x8, 4x4, 4x8, 8x8, 8x16, 16x16",
    ),
    Generation(
        name="v5p",
        gke_accelerator="tpu-v5p-slice",
        type_prefix="v5p",
        ray_version="v5p",
        dimensions=3,
        cores_per_chip=2,
        host_chip_options=(4,),
        shapes=frozenset(_SMALL_3D | _larger_3d_shapes(16, 16, 24)),
        aliases=("tpu-v5p-slice",),
        shape_rule="2x2x1, 2x2x2, 2x2x4, 2x4x4, or AxBxC with A and B multiples of 4 up to 16 "
        "and C a multiple of 4 up to 24",
    ),
    Generation(
        name="v6e",
        gke_accelerator="tpu-v6e-slice",
        type_prefix="v6e",
        ray_version="v6e",
        dimensions=2,
        cores_per_chip=1,
        host_chip_options=(1, 4, 8),
        shapes=_SHAPES_2D,
        aliases=("tpu-v6e-slice",),
        shape_rule="1x1, 2x2, 2x4, 2x8, 4x4, 4x8, 8x8, 8x16, 16x16",
    ),
    Generation(
        name="tpu7x",
        gke_accelerator="tpu7x",
        type_prefix="tpu7x",
        ray_version="v7x",
        dimensions=3,
        cores_per_chip=2,
        host_chip_options=(1, 4),
        shapes=frozenset(
            {"1x1x1", "2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4"}
            | {"4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"}
        ),
        aliases=("v7x", "tpu-v7x"),
        shape_rule="1x1x1, 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8, 4x8x8, 8x8x8, 8x8x16, 8x16x16",
    ),
)

_BY_SPELLING: dict[str, Generation] = {
    spelling: gen for gen in GENERATIONS for spelling in (gen.name, *gen.aliases)
}

_TOPOLOGY_SYNTAX = re.compile(r"^[0-9]+(x[0-9]+)*$")

#: Chips on one multi-host TPU VM, for every generation (GKE's ``-4t`` machines).
MULTI_HOST_CHIPS_PER_HOST = 4


def generation_names() -> list[str]:
    """Every spelling a user may write in ``spec.tpu.type``, canonical names first."""
    return [g.name for g in GENERATIONS] + [a for g in GENERATIONS for a in g.aliases]


def resolve_generation(tpu_type: str) -> Generation:
    """Map any accepted spelling (short name, GKE label value, Ray name) to a generation."""
    gen = _BY_SPELLING.get(tpu_type.strip().lower())
    if gen is None:
        raise TopologyError(
            "type",
            f"unknown TPU type {tpu_type!r}; use one of "
            + ", ".join(g.name for g in GENERATIONS)
            + " (GKE label values such as tpu-v6e-slice are accepted too)",
        )
    return gen


@dataclass(frozen=True)
class SliceShape:
    """Everything that follows from (generation, topology, chips per host)."""

    generation: Generation
    topology: str
    chips: int
    chips_per_host: int
    hosts: int

    @property
    def accelerator_type(self) -> str:
        """``TPU_ACCELERATOR_TYPE`` / Ray pod type, e.g. ``v6e-16`` or ``v4-16``."""
        return f"{self.generation.type_prefix}-{self.chips * self.generation.cores_per_chip}"

    @property
    def ray_pod_type(self) -> str:
        """The pod type as Ray spells it in resource and label names (``v7x-16``)."""
        return f"{self.generation.ray_version}-{self.chips * self.generation.cores_per_chip}"

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    def to_dict(self) -> dict[str, object]:
        """The CLI's and the status's view; key names are part of the public contract."""
        return {
            "generation": self.generation.name,
            "gkeAccelerator": self.generation.gke_accelerator,
            "topology": self.topology,
            "chips": self.chips,
            "chipsPerHost": self.chips_per_host,
            "hosts": self.hosts,
            "acceleratorType": self.accelerator_type,
            "multiHost": self.multi_host,
        }


def parse_topology(topology: str, generation: Generation) -> tuple[int, ...]:
    """Split ``AxB[xC]`` into positive integers, checking the generation's dimensionality."""
    text = topology.strip()
    example = "4x4" if generation.dimensions == 2 else "2x2x2"
    if not _TOPOLOGY_SYNTAX.match(text):
        raise TopologyError(
            "topology",
            f"malformed topology {topology!r}: write {generation.dimensions} positive "
            f"integers joined by 'x', for example {example}",
        )
    dims = tuple(int(part) for part in text.split("x"))
    if len(dims) != generation.dimensions:
        raise TopologyError(
            "topology",
            f"{generation.name} topologies have {generation.dimensions} dimensions, "
            f"got {len(dims)} in {topology!r}; for example {example}",
        )
    if any(d == 0 for d in dims):
        raise TopologyError(
            "topology", f"topology {topology!r} has a zero dimension; every dimension is >= 1"
        )
    canonical = "x".join(str(d) for d in dims)
    if canonical != text:
        raise TopologyError(
            "topology", f"write topology {topology!r} as {canonical}, as GKE labels nodes"
        )
    return dims


def _product(values: Iterable[int]) -> int:
    result = 1
    for v in values:
        result *= v
    return result


def host_chip_choices(generation: Generation, chips: int) -> tuple[int, ...]:
    """Chips-per-host values a slice of ``chips`` chips can be built from, default first.

    A slice that fits one machine of the generation is one host with all its
    chips; v5e/v6e ``2x4`` (8 chips) is one 8-chip host by default, as Ray
    assumes, or two 4-chip hosts. Anything larger is 4-chip hosts.
    """
    single = tuple(c for c in generation.host_chip_options if c == chips)
    if chips > MULTI_HOST_CHIPS_PER_HOST and chips % MULTI_HOST_CHIPS_PER_HOST == 0:
        return (*single, MULTI_HOST_CHIPS_PER_HOST)
    return single


def slice_shape(tpu_type: str, topology: str, chips_per_host: int | None = None) -> SliceShape:
    """Resolve a type and topology into a full slice shape, or raise TopologyError."""
    generation = resolve_generation(tpu_type)
    dims = parse_topology(topology, generation)
    canonical = "x".join(str(d) for d in dims)
    if canonical not in generation.shapes:
        raise TopologyError(
            "topology",
            f"{generation.name} has no {canonical} slice; use one of: {generation.shape_rule}",
        )
    chips = _product(dims)
    choices = host_chip_choices(generation, chips)
    if chips_per_host is None:
        chips_per_host = choices[0]
    elif chips_per_host not in choices:
        raise TopologyError(
            "chipsPerHost",
            f"{generation.name} {canonical} cannot be built from {chips_per_host}-chip hosts; "
            f"use chipsPerHost {' or '.join(str(c) for c in choices)}, or leave it unset "
            f"(default {choices[0]})",
        )
    return SliceShape(
        generation=generation,
        topology=canonical,
        chips=chips,
        chips_per_host=chips_per_host,
        hosts=chips // chips_per_host,
    )


# TPU7x dynamic slicing (GKE "Use dynamic slicing with a custom scheduler",
# https://cloud.google.com/kubernetes-engine/docs/how-to/create-dynamic-slices, and the
# Slice reference, https://cloud.google.com/kubernetes-engine/docs/reference/crds/slice):
# a Slice links whole 4x4x4 partitions (one sub-block, one node pool of 16 hosts each),
# so its topology is AxBxC with every dimension a multiple of 4, A <= B <= C, at most
# 9,216 chips (one TPU7x pod), and it needs chips / 64 partitions. Sub-slices (below
# 4x4x4, GKE 1.36+) take one partition id and a shape GKE lists; they are not supported.

#: The topology of one dynamic-slicing partition, and its chips.
PARTITION_TOPOLOGY = "4x4x4"
CHIPS_PER_PARTITION = 64
#: The most chips one GKE Slice may link.
MAX_DYNAMIC_SLICE_CHIPS = 9216
#: The generation (and GKE accelerator) with dynamic slicing.
DYNAMIC_GENERATION = "tpu7x"


def dynamic_slice_shape(
    tpu_type: str, topology: str, chips_per_host: int | None = None
) -> SliceShape:
    """The shape of a slice formed as a GKE Slice (``spec.reservation.policy``
    DynamicSlice), or raise TopologyError naming the input that is wrong.

    Unlike ``slice_shape`` it accepts every topology a Slice can take, not only those
    GKE offers as node pools (``4x4x12`` is a Slice of three partitions, never a pool).
    """
    generation = resolve_generation(tpu_type)
    if generation.name != DYNAMIC_GENERATION:
        raise TopologyError(
            "type",
            f"{generation.name} has no dynamic slicing; spec.reservation.policy "
            f"DynamicSlice is for {DYNAMIC_GENERATION} (use the policy NodePool)",
        )
    dims = parse_topology(topology, generation)
    canonical = "x".join(str(d) for d in dims)
    chips = _product(dims)
    if any(d % 4 for d in dims):
        smaller = all(d <= 4 for d in dims) and chips < CHIPS_PER_PARTITION
        raise TopologyError(
            "topology",
            f"dynamic slice {canonical}: sub-slices below {PARTITION_TOPOLOGY} are not "
            "supported; use AxBxC with every dimension a multiple of 4"
            if smaller
            else f"dynamic slice {canonical}: every dimension must be a multiple of 4 "
            f"(whole {PARTITION_TOPOLOGY} partitions), e.g. 4x4x8",
        )
    if list(dims) != sorted(dims):
        raise TopologyError(
            "topology",
            f"dynamic slice {canonical}: dimensions must not decrease (GKE's Slice "
            f"rule); write {'x'.join(str(d) for d in sorted(dims))}",
        )
    if chips > MAX_DYNAMIC_SLICE_CHIPS:
        raise TopologyError(
            "topology",
            f"dynamic slice {canonical} has {chips} chips; a GKE Slice links at most "
            f"{MAX_DYNAMIC_SLICE_CHIPS}",
        )
    if chips_per_host not in (None, MULTI_HOST_CHIPS_PER_HOST):
        raise TopologyError(
            "chipsPerHost",
            f"a dynamic slice is built from {MULTI_HOST_CHIPS_PER_HOST}-chip hosts; use "
            f"chipsPerHost {MULTI_HOST_CHIPS_PER_HOST} or leave it unset",
        )
    return SliceShape(
        generation=generation,
        topology=canonical,
        chips=chips,
        chips_per_host=MULTI_HOST_CHIPS_PER_HOST,
        hosts=chips // MULTI_HOST_CHIPS_PER_HOST,
    )
