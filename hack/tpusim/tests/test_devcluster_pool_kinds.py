"""Single-host pools, TPU7x dynamic-slicing sub-blocks and a formed Slice's nodes
carry the labels GKE gives them; the presets and the CLI forms make them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tpusim.__main__ import _load_pools
from tpusim.nodepools import (
    PARTITION_ID_LABEL,
    PARTITION_STATE_LABEL,
    PRESETS,
    SLICE_LABEL,
    TOPOLOGY_LABEL,
    TOPOLOGY_MODE_LABEL,
    TPUPool,
    default_pools,
    parse_pool_spec,
    pool_from_dict,
    pool_nodes,
    pool_partition_id,
    preset_pool,
    tpu_type_for_accelerator,
)

EXAMPLES = Path(__file__).parents[3] / "examples"
TPU_TAINT = [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}]


def labels_of(pool: TPUPool) -> list[dict[str, str]]:
    return [n["metadata"]["labels"] for n in pool_nodes(pool)]


@pytest.mark.parametrize(
    ("tpu_type", "topology", "chips", "accelerator", "machine"),
    [
        ("v4", "2x2x1", 4, "tpu-v4-podslice", "ct4p-hightpu-4t"),
        ("v5e", "1x1", 1, "tpu-v5-lite-podslice", "ct5lp-hightpu-1t"),
        ("v5e", "2x2", 4, "tpu-v5-lite-podslice", "ct5lp-hightpu-4t"),
        ("v5e", "2x4", 8, "tpu-v5-lite-podslice", "ct5lp-hightpu-8t"),
        ("v5p", "2x2x1", 4, "tpu-v5p-slice", "ct5p-hightpu-4t"),
        ("v6e", "1x1", 1, "tpu-v6e-slice", "ct6e-standard-1t"),
        ("v6e", "2x2", 4, "tpu-v6e-slice", "ct6e-standard-4t"),
        ("v6e", "2x4", 8, "tpu-v6e-slice", "ct6e-standard-8t"),
        ("tpu7x", "1x1x1", 1, "tpu7x", "tpu7x-standard-1t"),
        ("tpu7x", "2x2x1", 4, "tpu7x", "tpu7x-standard-4t"),
    ],
)
def test_single_host_pool_of_several_nodes(
    tpu_type: str, topology: str, chips: int, accelerator: str, machine: str
) -> None:
    """Each node of a single-host pool is one whole slice: the pool's topology, all the
    slice's chips, GKE's machine type and the TPU taint; no dynamic-slicing labels."""
    pool = TPUPool("single", tpu_type, topology, nodes=3, chips_per_node=chips)
    nodes = pool_nodes(pool)
    assert len({n["metadata"]["name"] for n in nodes}) == 3
    for node in nodes:
        labels = node["metadata"]["labels"]
        assert labels["cloud.google.com/gke-nodepool"] == "single"
        assert labels["cloud.google.com/gke-tpu-accelerator"] == accelerator
        assert labels[TOPOLOGY_LABEL] == topology
        assert labels["node.kubernetes.io/instance-type"] == machine
        assert labels["beta.kubernetes.io/instance-type"] == machine
        assert labels["cloud.google.com/machine-family"] == machine.split("-")[0]
        assert labels["cloud.google.com/gke-accelerator-count"] == str(chips)
        assert not {TOPOLOGY_MODE_LABEL, PARTITION_ID_LABEL, SLICE_LABEL} & set(labels)
        assert node["status"]["capacity"]["google.com/tpu"] == str(chips)
        assert node["status"]["allocatable"]["google.com/tpu"] == str(chips)
        assert node["spec"]["taints"] == TPU_TAINT


@pytest.mark.parametrize(
    ("tpu_type", "topology", "chips"),
    [("v6e", "2x2x1", 4), ("v5e", "1x1x1", 1), ("v4", "2x2", 4), ("tpu7x", "1x1", 1)],
)
def test_topology_of_the_wrong_dimension_is_rejected(
    tpu_type: str, topology: str, chips: int
) -> None:
    """GKE writes v5e/v6e topologies as AxB and the others as AxBxC; a pool in the
    other form would carry a label no GKE node has."""
    with pytest.raises(ValueError, match=f"{tpu_type} topologies are [23]-dimensional"):
        TPUPool("p", tpu_type, topology, 1, chips_per_node=chips)


def test_dynamic_slicing_pool_is_one_provision_only_sub_block() -> None:
    pool = TPUPool("ds", "tpu7x", "4x4x4", 16, dynamic_slicing=True)
    nodes = pool_nodes(pool)
    assert len(nodes) == 16
    partition = pool_partition_id(pool)
    for node in nodes:
        labels = node["metadata"]["labels"]
        assert labels[TOPOLOGY_MODE_LABEL] == "PROVISION_ONLY"
        assert labels[PARTITION_ID_LABEL] == partition
        assert labels[PARTITION_STATE_LABEL] == "HEALTHY"
        assert TOPOLOGY_LABEL not in labels
        assert SLICE_LABEL not in labels
        assert labels["cloud.google.com/gke-tpu-accelerator"] == "tpu7x"
        assert labels["node.kubernetes.io/instance-type"] == "tpu7x-standard-4t"
        assert node["status"]["capacity"]["google.com/tpu"] == "4"
        assert node["spec"]["taints"] == TPU_TAINT
    assert pool_partition_id(pool) == partition  # stable across runs
    other = TPUPool("ds2", "tpu7x", "4x4x4", 16, dynamic_slicing=True)
    assert pool_partition_id(other) != partition
    named = TPUPool("ds3", "tpu7x", "4x4x4", 16, dynamic_slicing=True, partition_id="p-0001")
    assert {n[PARTITION_ID_LABEL] for n in labels_of(named)} == {"p-0001"}
    degraded = TPUPool(
        "ds4", "tpu7x", "4x4x4", 16, dynamic_slicing=True, partition_state="DEGRADED"
    )
    assert {n[PARTITION_STATE_LABEL] for n in labels_of(degraded)} == {"DEGRADED"}


@pytest.mark.parametrize(("slice_topology", "wanted"), [(None, "4x4x4"), ("4x4x8", "4x4x8")])
def test_nodes_of_a_formed_slice(slice_topology: str | None, wanted: str) -> None:
    """Once a Slice is ACTIVE its nodes carry its name and topology, and keep the
    partition labels."""
    pool = TPUPool(
        "ds",
        "tpu7x",
        "4x4x4",
        16,
        dynamic_slicing=True,
        slice_name="team-a-train-0",
        slice_topology=slice_topology,
    )
    for labels in labels_of(pool):
        assert labels[SLICE_LABEL] == "team-a-train-0"
        assert labels[TOPOLOGY_LABEL] == wanted
        assert labels[TOPOLOGY_MODE_LABEL] == "PROVISION_ONLY"
        assert labels[PARTITION_ID_LABEL] == pool_partition_id(pool)


DS: dict[str, Any] = {
    "name": "p",
    "tpu_type": "tpu7x",
    "topology": "4x4x4",
    "nodes": 16,
    "dynamic_slicing": True,
}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tpu_type": "v5p"}, "one TPU7x sub-block"),
        ({"topology": "4x4x8", "nodes": 32}, "one TPU7x sub-block"),
        ({"topology": "2x2x2", "nodes": 2}, "one TPU7x sub-block"),
        ({"nodes": 64, "chips_per_node": 1}, "one TPU7x sub-block"),
        ({"nodes": 15}, "needs 16 hosts"),
        ({"partition_state": "healthy"}, "partition_state 'healthy' is not one of"),
        ({"partition_id": "a/b"}, "is not a label value"),
        ({"slice_name": "-s"}, "is not a label value"),
        ({"slice_name": "s" * 64}, "is not a label value"),
        ({"slice_topology": "4x4x8"}, "slice_topology needs slice_name"),
        ({"slice_name": "s", "slice_topology": "2x2x1"}, "whole 4x4x4 partitions"),
        ({"slice_name": "s", "slice_topology": "4x4x6"}, "whole 4x4x4 partitions"),
        ({"slice_name": "s", "slice_topology": "8x4x4"}, "non-decreasing"),
        ({"slice_name": "s", "slice_topology": "4x8"}, "whole 4x4x4 partitions"),
        ({"slice_name": "s", "slice_topology": "16x24x28"}, "at most 9216 chips"),
        ({"dynamic_slicing": False, "slice_name": "s"}, "slice_name describe a dynamic-slicing"),
        ({"dynamic_slicing": False, "partition_id": "x"}, "partition_id describe"),
        ({"dynamic_slicing": False, "partition_state": "UNSET"}, "partition_state describe"),
    ],
)
def test_invalid_dynamic_slicing_pools_are_rejected(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TPUPool(**{**DS, **kwargs})


def test_dynamic_slicing_in_both_forms() -> None:
    wanted = TPUPool(
        "ds",
        "tpu7x",
        "4x4x4",
        16,
        dynamic_slicing=True,
        partition_id="p1",
        partition_state="DEGRADED",
        slice_name="s1",
        slice_topology="4x4x8",
    )
    spec = "ds:tpu7x:4x4x4:16,dynamic-slicing,partition=p1,partition-state=DEGRADED,slice=s1"
    assert parse_pool_spec(spec + ",slice-topology=4x4x8") == wanted
    raw = {"name": "ds", "tpuType": "tpu7x", "topology": "4x4x4", "nodes": 16}
    extra = {"partitionId": "p1", "partitionState": "DEGRADED", "slice": "s1"}
    assert pool_from_dict({**raw, "dynamicSlicing": True, **extra, "sliceTopology": "4x4x8"}) == (
        wanted
    )
    with pytest.raises(ValueError, match="dynamicSlicing must be true or false"):
        pool_from_dict({**raw, "dynamicSlicing": "false"})
    for bad in ("ds:tpu7x:4x4x4:16,dynamic-slicing=yes", "ds:tpu7x:4x4x4:16,slice"):
        with pytest.raises(ValueError, match="bad pool spec"):
            parse_pool_spec(bad)


def test_single_host_preset_from_the_cli() -> None:
    """`add-pool v6e-2x2-single` (and `up --pool v6e-2x2-single`) make three
    ct6e-standard-4t nodes of one pool; the default pools stay as they were."""
    (pool,) = _load_pools(None, ["v6e-2x2-single"])
    assert pool == preset_pool("v6e-2x2-single") == TPUPool("v6e-2x2-single", "v6e", "2x2", 3)
    assert {n["node.kubernetes.io/instance-type"] for n in labels_of(pool)} == {"ct6e-standard-4t"}
    assert all(name == p.name for name, p in PRESETS.items())
    assert not {p.name for p in default_pools()} & set(PRESETS)
    dynamic = parse_pool_spec("tpu7x-4x4x4-dynamic")
    assert isinstance(dynamic, TPUPool) and dynamic.dynamic_slicing and dynamic.nodes == 16
    with pytest.raises(ValueError, match="no preset pool 'v6e-9x9'"):
        preset_pool("v6e-9x9")
    with pytest.raises(ValueError, match="or a preset"):
        parse_pool_spec("v6e-9x9")


def test_single_host_service_example_fits_the_preset_pool() -> None:
    """The demo's single-host service asks for slices of the preset pool's shape, and
    no more than it has nodes."""
    (doc,) = yaml.safe_load_all((EXAMPLES / "single-host-service.yaml").read_text())
    pool = preset_pool("v6e-2x2-single")
    (node,) = pool_nodes(TPUPool(pool.name, pool.tpu_type, pool.topology, 1))
    tpu = doc["spec"]["tpu"]
    labels = node["metadata"]["labels"]
    assert tpu_type_for_accelerator(labels["cloud.google.com/gke-tpu-accelerator"]) == tpu["type"]
    assert labels[TOPOLOGY_LABEL] == tpu["topology"]
    assert 1 < tpu["slices"] <= pool.nodes
