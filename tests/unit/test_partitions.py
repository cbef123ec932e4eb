"""TPU7x dynamic slicing: partitions read off nodes, which are free, which a slice takes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.support.builders import holder, node, partition_nodes
from tpuslice.model import constants as c
from tpuslice.model.convert import gke_slice_body, gke_slice_info
from tpuslice.model.records import GkeSliceInfo, NodeInfo, Taint
from tpuslice.planning.partitions import (
    ACTIVATION_TIMEOUT_SECONDS,
    Partition,
    SliceStage,
    choose_partitions,
    free_partitions,
    gke_slice_name,
    partition_inventory,
    partition_problem,
    partitions_needed,
    retry_delay,
    slice_stage,
    unusable_partitions,
)

OWNER = ("TPUSliceCluster", "ml", "llm")


def partition(pid: str, **fields: Any) -> list[NodeInfo]:
    return partition_nodes(pid, **fields)


def inventory(*groups: list[NodeInfo]) -> dict[str, Partition]:
    return partition_inventory([n for g in groups for n in g])


def test_partitions_are_read_off_their_nodes() -> None:
    nodes = partition("p1") + partition("p2", block="b2", state="DEGRADED")
    sick = {**nodes[3].labels, c.NODE_LABEL_TPU_PARTITION_STATE: "UNHEALTHY"}
    nodes[3] = replace(nodes[3], labels=sick)
    found = partition_inventory([*nodes, node("v6e-0", "v6e-pool")])
    assert sorted(found) == ["p1", "p2"]
    assert found["p1"].pool == "sb-p1" and found["p1"].block == "b1"
    assert found["p1"].state == "UNHEALTHY"  # its worst node's
    assert found["p2"].state == "DEGRADED" and len(found["p2"].nodes) == 16


@pytest.mark.parametrize(
    ("nodes", "allow_degraded", "problem"),
    [
        (partition("p"), False, None),
        (partition("p", state="DEGRADED"), False, "is DEGRADED; not claimed until it clears"),
        (partition("p", state="DEGRADED"), True, None),
        (partition("p", state="UNHEALTHY"), True, "is UNHEALTHY; not claimed until it clears"),
        (partition("p", state="UNSET"), True, "is UNSET"),
        (partition("p", hosts=15), False, "has 15 nodes (needs 16)"),
        (partition("p", gke_slice="theirs"), False, "is in GKE Slice theirs; it belongs"),
        (partition("p", ready=False), False, "has 16 of 16 nodes NotReady"),
        (partition("p", schedulable=False), False, "has 16 of 16 nodes cordoned"),
        (
            partition(
                "p",
                taints=(Taint(c.NODE_TAINT_IMPENDING_TERMINATION, "", "NoSchedule"),),
            ),
            False,
            "has node sb-p-0 that",
        ),
    ],
)
def test_a_partition_is_usable_only_whole_healthy_and_outside_others_slices(
    nodes: list[NodeInfo], allow_degraded: bool, problem: str | None
) -> None:
    found = partition_problem(inventory(nodes)["p"], allow_degraded=allow_degraded)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_our_own_slice_does_not_make_a_partition_foreign() -> None:
    p = inventory(partition("p", gke_slice="ours"))["p"]
    assert partition_problem(p, owned_slices={"ours"}) is None


def test_free_partitions_skip_held_pools_and_partitions_of_others_slices() -> None:
    inv = inventory(*(partition(f"p{i}") for i in range(5)))
    foreign = GkeSliceInfo("theirs", "4x4x4", ("p1",))  # no owner annotations: not ours
    other = GkeSliceInfo("x", "4x4x4", ("p2",), owner=("TPUSliceCluster", "ml", "other"))
    mine = GkeSliceInfo("m", "4x4x4", ("p3",), owner=OWNER)
    free = free_partitions(inv, held_pools={"sb-p0"}, slices=[foreign, other, mine], ours={"m"})
    assert [p.id for p in free] == ["p3", "p4"]


def test_a_slice_takes_partitions_of_one_block_the_fullest_that_fits() -> None:
    inv = inventory(
        *(partition(f"a{i}", block="big") for i in range(4)),
        *(partition(f"s{i}", block="small") for i in range(2)),
        partition("lone", block="tiny"),
    )
    assert choose_partitions(list(inv.values()), [2]) == (("s0", "s1"),)
    assert choose_partitions(list(inv.values()), [3]) == (("a0", "a1", "a2"),)
    assert choose_partitions(list(inv.values()), [5]) is None  # no block has 5


def test_a_gang_prefers_one_block_then_as_few_as_fit() -> None:
    inv = inventory(
        *(partition(f"a{i}", block="A") for i in range(4)),
        *(partition(f"b{i}", block="B") for i in range(3)),
    )
    free = list(inv.values())
    assert choose_partitions(free, [2, 2]) == (("a0", "a1"), ("a2", "a3"))
    # 3 + 3: no block holds six; each slice whole in one block
    assert choose_partitions(free, [3, 3]) == (("b0", "b1", "b2"), ("a0", "a1", "a2"))
    # a gang already holding partitions in B keeps to B when it fits there
    assert choose_partitions(free, [2], anchor_blocks={"B"}) == (("b0", "b1"),)
    assert choose_partitions(free, [4, 4]) is None


def test_a_failed_slices_partitions_come_last() -> None:
    inv = inventory(*(partition(f"p{i}") for i in range(4)))
    assert choose_partitions(list(inv.values()), [2], avoid={"p0", "p1"}) == (("p2", "p3"),)


def test_unusable_partitions_are_those_a_failed_slice_leaves_quarantined() -> None:
    inv = inventory(partition("p0"), partition("p1", state="UNHEALTHY"))
    assert unusable_partitions(["p0", "p1", "gone"], inv) == ("gone", "p1")


def test_partitions_needed() -> None:
    assert partitions_needed(128) == 2 and partitions_needed(9216) == 144


def test_slice_names_are_short_labels_that_change_with_the_partitions() -> None:
    h = holder("tpu-aaaaa", 3, namespace="9-team", name="a" * 60)
    first = gke_slice_name(h, ["p1", "p2"])
    assert len(first) <= c.SLICE_MAX_NAME and first[0].isalpha()
    assert first == gke_slice_name(h, ["p2", "p1"])
    assert first != gke_slice_name(h, ["p1", "p3"])
    assert gke_slice_name(holder(), ["p1"]).startswith("ml-llm-0-")


def test_the_slice_body_names_its_owner_and_reads_back() -> None:
    h = holder()
    body = gke_slice_body("ml-llm-0-x", h, topology="4x4x8", partition_ids=["p1", "p2"])
    assert body["apiVersion"] == "accelerator.gke.io/v1beta1" and body["kind"] == "Slice"
    assert body["spec"] == {"type": "tpu7x", "topology": "4x4x8", "partitionIds": ["p1", "p2"]}
    body["status"] = {"conditions": [{"type": "Ready", "status": "True", "reason": "ACTIVE"}]}
    info = gke_slice_info(body)
    assert info.owner == OWNER and info.replica_name == h.replica_name
    assert info.partition_ids == ("p1", "p2") and info.ready and info.reason == "ACTIVE"
    del body["metadata"]["annotations"][c.ANNOTATION_SLICE_OWNER_NAME]
    assert gke_slice_info(body).owner is None


@pytest.mark.parametrize(
    ("reason", "ready", "degraded_ok", "age", "stage"),
    [
        ("", False, False, 0.0, SliceStage.FORMING),
        ("ACTIVATING", False, False, 10.0, SliceStage.FORMING),
        ("ACTIVATING", False, False, ACTIVATION_TIMEOUT_SECONDS + 1, SliceStage.FAILED),
        ("ACTIVE", True, False, 0.0, SliceStage.ACTIVE),
        ("ACTIVE_DEGRADED", True, False, 0.0, SliceStage.FAILED),
        ("ACTIVE_DEGRADED", True, True, 0.0, SliceStage.ACTIVE),
        ("FAILED", False, True, 0.0, SliceStage.FAILED),
        ("SliceCreationFailed", False, False, 0.0, SliceStage.FAILED),
    ],
)
def test_slice_stage(
    reason: str, ready: bool, degraded_ok: bool, age: float, stage: SliceStage
) -> None:
    info = GkeSliceInfo("s", "4x4x8", ("p1", "p2"), owner=OWNER, ready=ready, reason=reason)
    assert slice_stage(info, allow_degraded=degraded_ok, age_seconds=age) is stage


def test_missing_and_deleting_slices() -> None:
    assert slice_stage(None) is SliceStage.MISSING
    gone = GkeSliceInfo("s", "4x4x8", (), owner=OWNER, ready=True, reason="ACTIVE", deleting=True)
    assert slice_stage(gone) is SliceStage.DELETING


def test_retry_backoff_doubles_to_five_minutes() -> None:
    assert [retry_delay(n) for n in (0, 1, 2, 3)] == [0.0, 5.0, 10.0, 20.0]
    assert retry_delay(50) == 300.0


def test_a_long_namespace_is_cut_before_the_object_and_slice() -> None:
    name = gke_slice_name(holder("tpu-aaaaa", 1, namespace="n" * 60, name="big"), ["p1"])
    assert "-big-1-" in name and len(name) <= c.SLICE_MAX_NAME
