"""Every TPU node GKE makes falls in one class against a slice shape, and a pool that
cannot hold a slice is named with one reason (nodeclass), which the planner obeys."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.builders import holder, node, nodes_of, reservation, slice_pods
from tpuslice.model.convert import node_info
from tpuslice.model.records import ClusterRef, NodeInfo
from tpuslice.planning.nodeclass import Fit, WantedShape, classify_node, classify_pool
from tpuslice.planning.pools import eligible_pools, plan_slices, pool_index, shape_pools

WANTED = WantedShape("tpu-v6e-slice", "4x4", hosts=4, chips_per_host=4)
BLOCK = {"topology_mode": "PROVISION_ONLY"}
PARTITION = {"partition_labels": ("cloud.google.com/gke-tpu-partition-4x4x4-id",)}
IN_SLICE = {"gke_slice": "team-a-train-0"}


@pytest.mark.parametrize(
    ("fields", "fit"),
    [
        ({}, Fit.USABLE),
        ({"accelerator": "tpu-v5-lite-podslice"}, Fit.OTHER_SHAPE),
        ({"topology": "8x8"}, Fit.OTHER_SHAPE),
        (BLOCK, Fit.SLICING_BLOCK),
        (PARTITION, Fit.SLICING_BLOCK),
        (IN_SLICE, Fit.IN_GKE_SLICE),
        # a Slice formed on a sub-block: its nodes keep their partition labels
        ({**IN_SLICE, **BLOCK, **PARTITION}, Fit.IN_GKE_SLICE),
        ({"ready": False}, Fit.NOT_READY),
        ({"schedulable": False}, Fit.CORDONED),
        ({"chips": 8}, Fit.CHIP_COUNT),
        ({"chips": 0}, Fit.CHIP_COUNT),
        # a block or someone's Slice is never ours, whatever its health
        ({**BLOCK, "ready": False}, Fit.SLICING_BLOCK),
        ({**IN_SLICE, "schedulable": False}, Fit.IN_GKE_SLICE),
    ],
)
def test_every_node_has_one_class(fields: dict[str, Any], fit: Fit) -> None:
    assert classify_node(node("n-0", "pool-a", **fields), WANTED).fit is fit


def test_a_node_of_a_slice_we_own_is_judged_like_an_ordinary_node() -> None:
    ours = node("n-0", "pool-a", **IN_SLICE, **PARTITION, **BLOCK)
    assert classify_node(ours, WANTED, owned_slices={"team-a-train-0"}).fit is Fit.USABLE
    other = node("n-1", "pool-a", gke_slice="someone-else")
    assert classify_node(other, WANTED, owned_slices={"team-a-train-0"}).fit is Fit.IN_GKE_SLICE


def pool(name: str = "pool-a", *, odd: int = 0, hosts: int = 4, **fields: Any) -> list[NodeInfo]:
    """``hosts`` healthy nodes of ``name``; the first ``odd`` of them get ``fields``."""
    return [node(f"{name}-{i}", name, **(fields if i < odd else {})) for i in range(hosts)]


@pytest.mark.parametrize(
    ("nodes", "fit", "message"),
    [
        (pool(), Fit.USABLE, ""),
        (pool(hosts=3), Fit.NODE_COUNT, "has 3 nodes (needs 4)"),
        ([], Fit.NODE_COUNT, "has 0 nodes (needs 4)"),
        (pool(odd=1, ready=False), Fit.NOT_READY, "has 1 of 4 nodes NotReady"),
        (pool(odd=2, schedulable=False), Fit.CORDONED, "has 2 of 4 nodes cordoned"),
        (
            pool(odd=1, chips=8),
            Fit.CHIP_COUNT,
            "has 1 of 4 nodes with 8 google.com/tpu (needs 4 per node)",
        ),
        (
            pool(odd=4, **IN_SLICE),
            Fit.IN_GKE_SLICE,
            "has 4 of 4 nodes in GKE Slice team-a-train-0 (cloud.google.com/gke-tpu-slice); "
            "they belong to that Slice's owner",
        ),
        (
            pool(odd=1, **PARTITION),
            Fit.SLICING_BLOCK,
            "is a dynamic-slicing sub-block (1 of 4 nodes PROVISION_ONLY in "
            "cloud.google.com/gke-accelerator-topology-mode or with a "
            "cloud.google.com/gke-tpu-partition-*-id label): its ICI is not active and no "
            "pod can run on it until a GKE Slice forms on it",
        ),
        (pool(odd=1, topology="2x2"), Fit.OTHER_SHAPE, "has 1 of 4 nodes of another"),
    ],
)
def test_every_pool_has_one_reason_and_its_message_names_the_numbers(
    nodes: list[NodeInfo], fit: Fit, message: str
) -> None:
    got = classify_pool("pool-a", nodes, WANTED)
    assert got.fit is fit
    assert got.usable == (fit is Fit.USABLE)
    assert got.problem().startswith(message) and bool(got.problem()) == bool(message)


def test_a_pool_that_is_never_ours_says_so_before_its_size_or_health() -> None:
    """A sub-block of 16 nodes for a 4-host shape is a block first, not a wrong size."""
    block = pool(hosts=16, odd=16, ready=False, **BLOCK)
    assert classify_pool("blk", block, WANTED).fit is Fit.SLICING_BLOCK
    sliced = pool(hosts=5, odd=1, **IN_SLICE)
    assert classify_pool("sl", sliced, WANTED).fit is Fit.IN_GKE_SLICE


def test_node_info_reads_the_dynamic_slicing_labels() -> None:
    labels = {
        "cloud.google.com/gke-nodepool": "sub-block-1",
        "cloud.google.com/gke-accelerator-topology-mode": "PROVISION_ONLY",
        "cloud.google.com/gke-tpu-partition-4x4x4-id": "p-7",
        "cloud.google.com/gke-tpu-partition-4x4x4-state": "HEALTHY",
        "cloud.google.com/gke-tpu-slice": "team-a-train-0",
        # the device plugin's sub-slice ids on ordinary v6e nodes are no partition
        "cloud.google.com/gke-tpu-slice-2x4-id": "s-1",
    }
    info = node_info({"metadata": {"name": "n", "labels": labels}})
    assert info.topology_mode == "PROVISION_ONLY"
    assert info.partition_labels == ("cloud.google.com/gke-tpu-partition-4x4x4-id",)
    assert info.gke_slice == "team-a-train-0"
    plain = node_info({"metadata": {"name": "n", "labels": {"cloud.google.com/gke-nodepool": "p"}}})
    assert (plain.topology_mode, plain.partition_labels, plain.gke_slice) == ("", (), "")


# ------------------------------------------------------------------ the planner obeys it
CLUSTER = ClusterRef("ml", "llm", "uid-llm")


def plan(nodes: list[NodeInfo], **kw: Any) -> Any:
    args: dict[str, Any] = dict(
        accelerator="tpu-v6e-slice",
        topology="4x4",
        hosts=4,
        chips_per_host=4,
        desired_slices=1,
        gated=True,
        pods=slice_pods("tpu-aaaaa", 0),
        nodes=nodes,
        reservations=[],
    )
    args.update(kw)
    return plan_slices(CLUSTER, **args)


@pytest.mark.parametrize(
    "fields", [BLOCK, PARTITION, IN_SLICE], ids=["block", "partition", "slice"]
)
def test_planner_never_claims_a_sub_block_or_someone_elses_slice(fields: dict[str, Any]) -> None:
    """Their labels match the shape (GKE sets a formed Slice's topology on its nodes), yet
    the slice waits and the message says why."""
    nodes = nodes_of("pool-a", **fields)
    result = plan(nodes)
    assert result.claims == () and result.releases == ()
    message = result.slices[0].message
    assert message.startswith("needs a free node pool of 4 ready nodes with tpu-v6e-slice/4x4")
    assert ("GKE Slice team-a-train-0" if fields is IN_SLICE else "dynamic-slicing sub-block") in (
        message
    )
    index = pool_index(nodes, "tpu-v6e-slice", "4x4")
    assert eligible_pools(index, hosts=4, chips_per_host=4) == frozenset()
    assert [p.eligible for p in shape_pools(index, (), hosts=4, chips_per_host=4)] == [False]


def test_planner_takes_the_ordinary_pool_next_to_a_sliced_one() -> None:
    nodes = nodes_of("pool-a", **IN_SLICE) + nodes_of("pool-b", **BLOCK) + nodes_of("pool-c")
    assert [c.pool for c in plan(nodes).claims] == ["pool-c"]


def test_planner_may_claim_a_slice_it_owns() -> None:
    """The seam for Slices the operator will create: their nodes are eligible."""
    nodes = nodes_of("pool-a", **IN_SLICE, **PARTITION, **BLOCK)
    index = pool_index(nodes, "tpu-v6e-slice", "4x4", owned_slices={"team-a-train-0"})
    assert eligible_pools(index, hosts=4, chips_per_host=4) == {"pool-a"}
    assert [c.pool for c in plan(nodes, inventory=index).claims] == ["pool-a"]


def test_a_held_pool_whose_nodes_join_a_slice_says_so() -> None:
    """A pool we hold that GKE then puts in a Slice: the slice's status names the Slice."""
    nodes = nodes_of("pool-a", **IN_SLICE)
    result = plan(
        nodes,
        pods=slice_pods("tpu-aaaaa", 0, gated=False, pool="pool-a"),
        reservations=[reservation("pool-a", holder("tpu-aaaaa", 0))],
    )
    assert "node pool pool-a has 4 of 4 nodes in GKE Slice team-a-train-0" in (
        result.slices[0].message
    )


def test_a_sub_block_without_a_topology_label_is_still_named_in_the_wait() -> None:
    """Before a GKE Slice forms, a dynamic-slicing sub-block's nodes carry no
    gke-tpu-topology: no topology matches, and the wait says why those pools are not
    used instead of only "no node pool matches"."""
    block = [
        node(f"blk-{i}", "tpu7x-blk", accelerator="tpu7x", topology="", **BLOCK) for i in range(16)
    ]
    result = plan_slices(
        ClusterRef("ml", "llm", "uid-llm"),
        accelerator="tpu7x",
        topology="4x4x4",
        hosts=16,
        chips_per_host=4,
        desired_slices=1,
        gated=True,
        pods=slice_pods("tpu-aaaaa", 0, hosts=16),
        nodes=block,
        reservations=[],
    )
    assert result.claims == ()
    message = result.slices[0].message
    assert "no node pool matches" in message, message
    assert "tpu7x-blk is a dynamic-slicing sub-block (PROVISION_ONLY)" in message, message
