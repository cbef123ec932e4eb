"""The plan of dynamic slices: partitions claimed, a GKE Slice formed, pods pinned to it,
a failed Slice replaced on other partitions, everything given back."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.support.builders import holder, partition_nodes, reservation, slice_pods
from tpuslice.model import constants as c
from tpuslice.model.records import (
    CapacityUnit,
    ClusterRef,
    GangMode,
    GkeSliceInfo,
    NodeInfo,
    PodInfo,
    ReservationInfo,
    SlicePlan,
    SliceState,
)
from tpuslice.planning.dynamic import plan_dynamic_slices

REF = ClusterRef("ml", "llm", "uid-llm")
NOW = datetime(2026, 12, 1, tzinfo=UTC)
HOSTS = 32  # 4x4x8: two partitions of 16 hosts


def nodes(*pids: str, block: str = "b1", **fields: Any) -> list[NodeInfo]:
    return [n for pid in pids for n in partition_nodes(pid, block=block, **fields)]


def pods(replica: str = "tpu-aaaaa", index: int = 0, **fields: Any) -> list[PodInfo]:
    return slice_pods(replica, index, hosts=HOSTS, **fields)


def held(pid: str, replica: str = "tpu-aaaaa", index: int = 0, **fields: Any) -> ReservationInfo:
    return reservation(f"sb-{pid}", holder(replica, index), **fields)


def gke_slice(
    name: str, pids: tuple[str, ...], replica: str = "tpu-aaaaa", **fields: Any
) -> GkeSliceInfo:
    base = GkeSliceInfo(
        name,
        "4x4x8",
        pids,
        owner=REF.key,
        owner_uid=REF.uid,
        replica_name=replica,
        uid=f"uid-{name}",
        created=(NOW - timedelta(seconds=10)).isoformat(),
    )
    return replace(base, **fields)


def plan(
    *,
    pod_list: list[PodInfo],
    node_list: list[NodeInfo],
    reservations: list[ReservationInfo] = [],  # noqa: B006
    slices: list[GkeSliceInfo] = [],  # noqa: B006
    desired: int = 1,
    gang: GangMode = GangMode.PER_SLICE,
) -> SlicePlan:
    return plan_dynamic_slices(
        REF,
        topology="4x4x8",
        chips=128,
        hosts=HOSTS,
        desired_slices=desired,
        pods=pod_list,
        nodes=node_list,
        reservations=reservations,
        gke_slices=slices,
        gang=gang,
        now=NOW,
    )


def test_a_slice_claims_two_partitions_of_one_block() -> None:
    got = plan(pod_list=pods(), node_list=nodes("p1", block="A") + nodes("p2", "p3", block="B"))
    assert sorted(cl.pool for cl in got.claims) == ["sb-p2", "sb-p3"]
    assert not got.gke_slice_creates and not got.releases
    assert got.slices[0].state is SliceState.RESERVED


def test_held_partitions_form_a_slice_named_after_the_slice() -> None:
    got = plan(
        pod_list=pods(),
        node_list=nodes("p1", "p2"),
        reservations=[held("p1"), held("p2")],
    )
    (create,) = got.gke_slice_creates
    assert create.partition_ids == ("p1", "p2") and create.topology == "4x4x8"
    assert create.name.startswith("ml-llm-0-") and len(create.name) <= c.SLICE_MAX_NAME
    assert not got.claims and not got.releases and got.recheck_in is not None
    assert "forming GKE Slice" in got.slices[0].message


def test_pods_are_released_to_the_slice_only_once_it_is_active() -> None:
    base = {
        "pod_list": pods(),
        "node_list": nodes("p1", "p2"),
        "reservations": [held("p1"), held("p2")],
    }
    forming = plan(**base, slices=[gke_slice("s", ("p1", "p2"), reason="ACTIVATING")])
    assert not forming.releases and not forming.gke_slice_creates
    assert "ACTIVATING" in forming.slices[0].message
    active = plan(**base, slices=[gke_slice("s", ("p1", "p2"), ready=True, reason="ACTIVE")])
    assert len(active.releases) == HOSTS
    assert {(r.pool, r.unit) for r in active.releases} == {("s", CapacityUnit.PARTITION)}
    assert CapacityUnit.PARTITION.pin("s") == {c.NODE_LABEL_TPU_SLICE: "s"}


def test_a_foreign_slices_partitions_are_never_taken() -> None:
    foreign = GkeSliceInfo("theirs", "4x4x8", ("p1", "p2"))
    got = plan(
        pod_list=pods(),
        node_list=nodes("p1", "p2", gke_slice="theirs", topology="4x4x8") + nodes("p3"),
        slices=[foreign],
    )
    assert not got.claims and not got.gke_slice_deletes
    assert got.slices[0].state is SliceState.WAITING_FOR_CAPACITY
    assert "1 free" in got.slices[0].message


def test_a_gang_claims_nothing_until_every_slice_has_pods_and_partitions_for_all() -> None:
    two = nodes("p1", "p2", "p3", "p4")
    half = plan(pod_list=pods(), node_list=two, desired=2, gang=GangMode.ALL_SLICES)
    assert not half.claims
    both = pods() + pods("tpu-bbbbb", 1)
    short = plan(
        pod_list=both, node_list=nodes("p1", "p2", "p3"), desired=2, gang=GangMode.ALL_SLICES
    )
    assert not short.claims
    full = plan(pod_list=both, node_list=two, desired=2, gang=GangMode.ALL_SLICES)
    assert len(full.claims) == 4 and full.all_or_nothing


def test_a_gang_is_released_only_when_both_slices_are_active() -> None:
    both = pods() + pods("tpu-bbbbb", 1)
    reservations = [held("p1"), held("p2"), held("p3", "tpu-bbbbb", 1), held("p4", "tpu-bbbbb", 1)]
    one_active = [
        gke_slice("s0", ("p1", "p2"), ready=True, reason="ACTIVE"),
        gke_slice("s1", ("p3", "p4"), "tpu-bbbbb", reason="ACTIVATING"),
    ]
    got = plan(
        pod_list=both,
        node_list=nodes("p1", "p2", "p3", "p4"),
        reservations=reservations,
        slices=one_active,
        desired=2,
        gang=GangMode.ALL_SLICES,
    )
    assert not got.releases
    both_active = [replace(one_active[1], ready=True, reason="ACTIVE"), one_active[0]]
    got = plan(
        pod_list=both,
        node_list=nodes("p1", "p2", "p3", "p4"),
        reservations=reservations,
        slices=both_active,
        desired=2,
        gang=GangMode.ALL_SLICES,
    )
    assert len(got.releases) == 2 * HOSTS


def test_a_failed_slice_is_replaced_on_other_partitions_before_it_is_deleted() -> None:
    failed = gke_slice("s", ("p1", "p2"), reason="FAILED", message="link down")
    node_list = nodes("p1", "p2", "p3", "p4")
    first = plan(
        pod_list=pods(),
        node_list=node_list,
        reservations=[held("p1"), held("p2")],
        slices=[failed],
    )
    assert sorted(cl.pool for cl in first.claims) == ["sb-p3", "sb-p4"]
    assert not first.gke_slice_deletes and not first.frees
    assert "GKE Slice s FAILED (link down); retrying on other partitions" in first.slices[0].message
    four = [held(p) for p in ("p1", "p2", "p3", "p4")]
    second = plan(pod_list=pods(), node_list=node_list, reservations=four, slices=[failed])
    (create,) = second.gke_slice_creates
    assert create.partition_ids == ("p3", "p4") and not second.frees
    new = gke_slice(create.name, ("p3", "p4"), reason="ACTIVATING")
    third = plan(pod_list=pods(), node_list=node_list, reservations=four, slices=[failed, new])
    assert [s.name for s in third.gke_slice_deletes] == ["s"] and not third.frees
    # the failed Slice is gone: its partitions are given back
    fourth = plan(pod_list=pods(), node_list=node_list, reservations=four, slices=[new])
    assert fourth.frees == ("sb-p1", "sb-p2") and not fourth.gke_slice_deletes


def test_released_pods_of_a_failed_slice_are_drained_and_its_successor_forms_elsewhere() -> None:
    failed = gke_slice("s", ("p1", "p2"), reason="FAILED", replica_index=0)
    node_list = nodes("p1", "p2", "p3", "p4")
    got = plan(
        pod_list=pods(gated=False, pool="s"),
        node_list=node_list,
        reservations=[held("p1"), held("p2")],
        slices=[failed],
    )
    (drain,) = got.drains
    assert len(drain.pods) == HOSTS and drain.pool == "s"
    assert drain.node == "sb-p1-0" and drain.signal == "is in GKE Slice s FAILED"
    assert not got.claims and not got.gke_slice_deletes and not got.frees
    assert got.slices[0].state is SliceState.RELEASING
    # KubeRay's new slice of index 0: the failed Slice (and its partitions) stay
    successor = pods("tpu-bbbbb", 0)
    got = plan(
        pod_list=successor,
        node_list=node_list,
        reservations=[held("p1"), held("p2")],
        slices=[failed],
    )
    assert sorted(cl.pool for cl in got.claims) == ["sb-p3", "sb-p4"]
    assert not got.gke_slice_deletes and not got.frees
    # once the successor has its Slice, the failed one goes, then its partitions
    new = gke_slice("n", ("p3", "p4"), "tpu-bbbbb", reason="ACTIVATING", replica_index=0)
    reservations = [held("p1"), held("p2"), held("p3", "tpu-bbbbb"), held("p4", "tpu-bbbbb")]
    got = plan(
        pod_list=successor, node_list=node_list, reservations=reservations, slices=[failed, new]
    )
    assert [s.name for s in got.gke_slice_deletes] == ["s"] and not got.frees
    got = plan(pod_list=successor, node_list=node_list, reservations=reservations, slices=[new])
    assert got.frees == ("sb-p1", "sb-p2")


def test_an_unhealthy_held_partition_is_given_back_and_another_claimed() -> None:
    got = plan(
        pod_list=pods(),
        node_list=nodes("p1") + nodes("p2", state="UNHEALTHY") + nodes("p3"),
        reservations=[held("p1"), held("p2")],
    )
    assert got.frees == ("sb-p2",)
    assert [cl.pool for cl in got.claims] == ["sb-p3"]
    assert not got.gke_slice_creates


def test_a_slice_gone_deletes_its_slice_and_frees_partitions_only_once_it_is_gone() -> None:
    mine = gke_slice("s", ("p1", "p2"), ready=True, reason="ACTIVE")
    gone = plan(
        pod_list=[],
        node_list=nodes("p1", "p2"),
        reservations=[held("p1"), held("p2")],
        slices=[mine],
        desired=0,
    )
    assert [s.name for s in gone.gke_slice_deletes] == ["s"] and not gone.frees
    deleting = plan(
        pod_list=[],
        node_list=nodes("p1", "p2"),
        reservations=[held("p1"), held("p2")],
        slices=[replace(mine, deleting=True)],
        desired=0,
    )
    assert not deleting.gke_slice_deletes and not deleting.frees
    after = plan(
        pod_list=[], node_list=nodes("p1", "p2"), reservations=[held("p1"), held("p2")], desired=0
    )
    assert after.frees == ("sb-p1", "sb-p2")


def test_a_stale_slice_of_an_earlier_object_of_the_same_name_is_deleted() -> None:
    old = gke_slice("old", ("p1", "p2"), owner_uid="uid-before")
    got = plan(pod_list=pods(), node_list=nodes("p1", "p2", "p3", "p4"), slices=[old])
    assert [s.name for s in got.gke_slice_deletes] == ["old"]
    assert sorted(cl.pool for cl in got.claims) == ["sb-p3", "sb-p4"]


def test_a_part_held_that_cannot_be_completed_in_its_block_is_given_back() -> None:
    got = plan(
        pod_list=pods(),
        node_list=nodes("p1", block="A") + nodes("p2", "p3", block="B"),
        reservations=[held("p1")],
    )
    assert got.frees == ("sb-p1",) and not got.claims
    assert got.slices[0].state is SliceState.WAITING_FOR_CAPACITY


def test_a_part_held_is_completed_from_its_own_block() -> None:
    got = plan(
        pod_list=pods(),
        node_list=nodes("p1", "p4", block="A") + nodes("p2", "p3", block="B"),
        reservations=[held("p1")],
    )
    assert [cl.pool for cl in got.claims] == ["sb-p4"] and not got.frees


def test_a_failed_slice_of_a_replaced_slice_is_kept_until_its_successor_has_a_slice() -> None:
    failed = gke_slice("s", ("p1", "p2"), reason="FAILED", replica_index=0)
    # the drained slice is gone and KubeRay has not made the new one yet: kept
    got = plan(
        pod_list=[],
        node_list=nodes("p1", "p2", "p3", "p4"),
        reservations=[held("p1"), held("p2")],
        slices=[failed],
    )
    assert not got.gke_slice_deletes and not got.frees
    # the object wants no slice of that index any more: deleted
    got = plan(
        pod_list=[],
        node_list=nodes("p1", "p2"),
        reservations=[held("p1"), held("p2")],
        slices=[failed],
        desired=0,
    )
    assert [s.name for s in got.gke_slice_deletes] == ["s"]


def test_a_kept_failed_slice_goes_after_the_backoff_when_nothing_else_is_free() -> None:
    young = gke_slice("s", ("p1", "p2"), reason="FAILED", replica_index=0)
    args: dict[str, Any] = {
        "pod_list": pods("tpu-bbbbb", 0),
        "node_list": nodes("p1", "p2"),
        "reservations": [held("p1"), held("p2")],
    }
    got = plan(**args, slices=[young])
    assert not got.gke_slice_deletes and got.recheck_in is not None
    old = replace(young, created=(NOW - timedelta(seconds=60)).isoformat())
    got = plan(**args, slices=[old])
    assert [s.name for s in got.gke_slice_deletes] == ["s"]
