"""Table tests of the slice arithmetic for every generation."""

from __future__ import annotations

import pytest

from tpuslice.model.topology import GENERATIONS, TopologyError, resolve_generation, slice_shape

# type, topology, chipsPerHost, gke label, chips, chips/host, hosts, accelerator type
SHAPES = [
    # v4: 3D, 4-chip hosts, names count TensorCores (2 per chip)
    ("v4", "2x2x1", None, "tpu-v4-podslice", 4, 4, 1, "v4-8"),
    ("v4", "2x2x2", None, "tpu-v4-podslice", 8, 4, 2, "v4-16"),
    ("v4", "2x2x4", None, "tpu-v4-podslice", 16, 4, 4, "v4-32"),
    ("v4", "4x4x4", None, "tpu-v4-podslice", 64, 4, 16, "v4-128"),
    ("v4", "12x12x16", None, "tpu-v4-podslice", 2304, 4, 576, "v4-4608"),
    ("tpu-v4-podslice", "2x4x4", None, "tpu-v4-podslice", 32, 4, 8, "v4-64"),
    # v5e: 2D, names count chips, 1/4/8-chip hosts
    ("v5e", "1x1", None, "tpu-v5-lite-podslice", 1, 1, 1, "v5litepod-1"),
    ("v5e", "2x2", None, "tpu-v5-lite-podslice", 4, 4, 1, "v5litepod-4"),
    ("v5e", "2x4", None, "tpu-v5-lite-podslice", 8, 8, 1, "v5litepod-8"),
    ("v5e", "2x4", 4, "tpu-v5-lite-podslice", 8, 4, 2, "v5litepod-8"),
    ("v5litepod", "4x4", None, "tpu-v5-lite-podslice", 16, 4, 4, "v5litepod-16"),
    ("tpu-v5-lite-podslice", "16x16", None, "tpu-v5-lite-podslice", 256, 4, 64, "v5litepod-256"),
    # v5p: 3D, cores counted
    ("v5p", "2x2x1", None, "tpu-v5p-slice", 4, 4, 1, "v5p-8"),
    ("v5p", "4x4x4", None, "tpu-v5p-slice", 64, 4, 16, "v5p-128"),
    ("v5p", "16x16x24", None, "tpu-v5p-slice", 6144, 4, 1536, "v5p-12288"),
    # v6e: 2D, chips counted
    ("v6e", "1x1", None, "tpu-v6e-slice", 1, 1, 1, "v6e-1"),
    ("v6e", "2x2", None, "tpu-v6e-slice", 4, 4, 1, "v6e-4"),
    ("v6e", "2x4", 8, "tpu-v6e-slice", 8, 8, 1, "v6e-8"),
    ("v6e", "2x4", 4, "tpu-v6e-slice", 8, 4, 2, "v6e-8"),
    ("v6e", "2x8", None, "tpu-v6e-slice", 16, 4, 4, "v6e-16"),
    ("v6e", "4x4", None, "tpu-v6e-slice", 16, 4, 4, "v6e-16"),
    ("v6e", "16x16", None, "tpu-v6e-slice", 256, 4, 64, "v6e-256"),
    ("tpu-v6e-slice", "8x8", None, "tpu-v6e-slice", 64, 4, 16, "v6e-64"),
    # TPU7x: 3D, cores counted, 1x1x1 on a 1-chip machine
    ("tpu7x", "1x1x1", None, "tpu7x", 1, 1, 1, "tpu7x-2"),
    ("tpu7x", "2x2x1", None, "tpu7x", 4, 4, 1, "tpu7x-8"),
    ("tpu7x", "2x2x2", None, "tpu7x", 8, 4, 2, "tpu7x-16"),
    ("v7x", "8x16x16", None, "tpu7x", 2048, 4, 512, "tpu7x-4096"),
]


@pytest.mark.parametrize(
    ("tpu_type", "topology", "cph", "gke", "chips", "per_host", "hosts", "acc_type"), SHAPES
)
def test_slice_shape(
    tpu_type: str,
    topology: str,
    cph: int | None,
    gke: str,
    chips: int,
    per_host: int,
    hosts: int,
    acc_type: str,
) -> None:
    shape = slice_shape(tpu_type, topology, cph)
    assert shape.generation.gke_accelerator == gke
    assert (shape.chips, shape.chips_per_host, shape.hosts) == (chips, per_host, hosts)
    assert shape.accelerator_type == acc_type
    assert shape.multi_host is (hosts > 1)
    assert shape.hosts * shape.chips_per_host == shape.chips


def test_two_by_four_defaults_to_one_eight_chip_host_like_ray() -> None:
    for gen in ("v5e", "v6e"):
        shape = slice_shape(gen, "2x4")
        assert (shape.chips_per_host, shape.hosts, shape.multi_host) == (8, 1, False)


def test_ray_pod_type_uses_rays_spelling() -> None:
    assert slice_shape("tpu7x", "2x2x2").ray_pod_type == "v7x-16"
    assert slice_shape("v5e", "4x4").ray_pod_type == "v5litepod-16"
    assert slice_shape("v4", "2x2x2").ray_pod_type == "v4-16"


def test_cli_dict_keys_are_the_public_contract() -> None:
    assert list(slice_shape("v6e", "4x4").to_dict()) == [
        "generation",
        "gkeAccelerator",
        "topology",
        "chips",
        "chipsPerHost",
        "hosts",
        "acceleratorType",
        "multiHost",
    ]


def test_every_generation_resolves_by_every_spelling() -> None:
    for gen in GENERATIONS:
        for spelling in (gen.name, *gen.aliases, gen.gke_accelerator, gen.name.upper()):
            assert resolve_generation(spelling) is gen


@pytest.mark.parametrize(
    ("tpu_type", "topology", "cph", "field", "fragment"),
    [
        ("v9", "4x4", None, "type", "unknown TPU type 'v9'; use one of v4, v5e, v5p, v6e, tpu7x"),
        ("v6e", "4x", None, "topology", "malformed topology '4x'"),
        ("v6e", "4by4", None, "topology", "for example 4x4"),
        ("v6e", "4x4x4", None, "topology", "v6e topologies have 2 dimensions, got 3"),
        ("v4", "4x4", None, "topology", "v4 topologies have 3 dimensions, got 2"),
        ("v6e", "0x4", None, "topology", "zero dimension"),
        ("v6e", "3x3", None, "topology", "v6e has no 3x3 slice; use one of: 1x1, 2x2"),
        ("v6e", "4x2", None, "topology", "v6e has no 4x2 slice"),
        ("v4", "2x2x3", None, "topology", "v4 has no 2x2x3 slice"),
        ("v4", "16x16x16", None, "topology", "A and B in 4, 8, 12"),
        ("v5p", "4x4x28", None, "topology", "C a multiple of 4 up to 24"),
        ("tpu7x", "16x16x16", None, "topology", "tpu7x has no 16x16x16 slice"),
        ("v6e", "4x4", 8, "chipsPerHost", "use chipsPerHost 4"),
        ("v6e", "2x4", 1, "chipsPerHost", "use chipsPerHost 8 or 4"),
        ("v6e", "1x1", 4, "chipsPerHost", "use chipsPerHost 1"),
        ("v4", "2x2x2", 8, "chipsPerHost", "use chipsPerHost 4"),
        ("v5p", "2x2x1", 1, "chipsPerHost", "use chipsPerHost 4"),
        ("tpu7x", "1x1x1", 4, "chipsPerHost", "use chipsPerHost 1"),
    ],
)
def test_rejections_name_the_field_and_the_fix(
    tpu_type: str, topology: str, cph: int | None, field: str, fragment: str
) -> None:
    with pytest.raises(TopologyError) as err:
        slice_shape(tpu_type, topology, cph)
    assert err.value.field == field
    assert fragment in str(err.value)


def test_shape_tables_match_rays_counts() -> None:
    """Ray 2.54+ accepts 40 v4, 100 v5p and 10 v7x shapes; we add only tpu7x 1x1x1."""
    sizes = {g.name: len(g.shapes) for g in GENERATIONS}
    assert sizes == {"v4": 40, "v5e": 9, "v5p": 100, "v6e": 9, "tpu7x": 11}
