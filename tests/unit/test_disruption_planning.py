"""Choosing units with GKE's disruption signals in mind: a unit with a node being
terminated, maintained or in an UNHEALTHY partition is never claimed; scheduled
maintenance within spec.disruption.avoidMaintenanceWithin ranks a unit last."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.support.builders import node, nodes_of, slice_pods
from tpuslice.model.convert import node_info
from tpuslice.model.records import CapacityType, ClusterRef, NodeInfo, ShapePool, Taint
from tpuslice.planning.disruption import (
    DisruptionReason,
    Signal,
    drain_signal,
    maintenance_before,
    maintenance_message,
    scheduled_maintenance,
)
from tpuslice.planning.nodeclass import Fit, WantedShape, classify_pool
from tpuslice.planning.pools import plan_slices, prefer_pools

CLUSTER = ClusterRef("ml", "llm", "uid-llm")
WANTED = WantedShape("tpu-v6e-slice", "4x4", hosts=4, chips_per_host=4)
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
HOUR = 3600
TERMINATING = Taint("cloud.google.com/impending-node-termination", "true", "NoSchedule")
WINDOW = Taint("cloud.google.com/maintenance-window-started", "true", "NoSchedule")


def with_node(nodes: list[NodeInfo], name: str, **fields: Any) -> list[NodeInfo]:
    return [replace(n, **fields) if n.name == name else n for n in nodes]


def scheduled(nodes: list[NodeInfo], name: str, at: int) -> list[NodeInfo]:
    return with_node(nodes, name, labels={"cloud.google.com/scheduled-maintenance-time": str(at)})


def plan(**kw: Any) -> Any:
    args: dict[str, Any] = dict(
        accelerator="tpu-v6e-slice",
        topology="4x4",
        hosts=4,
        chips_per_host=4,
        desired_slices=1,
        gated=True,
        pods=slice_pods("tpu-aaaaa", 0),
        nodes=[],
        reservations=[],
        now=NOW,
    )
    args.update(kw)
    return plan_slices(CLUSTER, **args)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"taints": (TERMINATING,)}, "has the cloud.google.com/impending-node-termination taint"),
        ({"taints": (WINDOW,)}, "is in host maintenance"),
        (
            {"labels": {"cloud.google.com/active-node-maintenance": "ONGOING"}},
            "is in host maintenance",
        ),
        (
            {"labels": {"cloud.google.com/gke-tpu-partition-4x4x4-state": "UNHEALTHY"}},
            "has cloud.google.com/gke-tpu-partition-4x4x4-state=UNHEALTHY",
        ),
    ],
)
def test_a_disrupted_node_makes_its_pool_ineligible_naming_node_and_signal(
    fields: dict[str, Any], says: str
) -> None:
    nodes = with_node(nodes_of("pool-a"), "pool-a-2", **fields)
    fit = classify_pool("pool-a", nodes, WANTED)
    assert fit.fit is Fit.DISRUPTED
    assert fit.problem().startswith(f"has node pool-a-2 that {says}")
    assert "not claimed until it clears" in fit.problem()
    result = plan(nodes=nodes)
    assert result.claims == ()
    assert "pool-a has node pool-a-2 that" in result.slices[0].message


def test_degraded_partition_and_scheduled_maintenance_stay_claimable() -> None:
    nodes = with_node(
        nodes_of("pool-a"),
        "pool-a-0",
        labels={
            "cloud.google.com/gke-tpu-partition-4x4x4-state": "DEGRADED",
            "cloud.google.com/scheduled-maintenance-time": str(int(NOW.timestamp()) + HOUR),
        },
    )
    assert classify_pool("pool-a", nodes, WANTED).usable
    assert [c.pool for c in plan(nodes=nodes).claims] == ["pool-a"]


def test_the_taint_read_from_a_node_object_blocks_the_claim() -> None:
    raw = {
        "metadata": {
            "name": "n0",
            "labels": {
                "cloud.google.com/gke-nodepool": "p",
                "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                "cloud.google.com/gke-tpu-topology": "2x2",
            },
        },
        "spec": {"taints": [{"key": TERMINATING.key, "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"google.com/tpu": "4"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    one = WantedShape("tpu-v6e-slice", "2x2", hosts=1, chips_per_host=4)
    fit = classify_pool("n0", [node_info(raw)], one)
    assert fit.fit is Fit.DISRUPTED
    assert fit.problem() == (
        "has the cloud.google.com/impending-node-termination taint (GKE is terminating it); "
        "not claimed until it clears"
    )


def test_maintenance_within_the_window_ranks_last_and_says_when() -> None:
    soon = int(NOW.timestamp()) + HOUR
    nodes = scheduled(nodes_of("pool-a", "pool-b"), "pool-a-3", soon)
    cutoff = maintenance_before(NOW, 24 * HOUR)
    result = plan(nodes=nodes, maintenance_before=cutoff)
    assert [c.pool for c in result.claims] == ["pool-b"]
    # no other pool: the one with maintenance is taken, and status says when
    only = scheduled(nodes_of("pool-a"), "pool-a-3", soon)
    result = plan(nodes=only, maintenance_before=cutoff)
    assert [c.pool for c in result.claims] == ["pool-a"]
    assert result.slices[0].message == "node pool pool-a: maintenance at 2026-12-03T13:00:00Z"


def test_maintenance_outside_the_window_or_a_zero_window_is_not_avoided() -> None:
    later = int(NOW.timestamp()) + 48 * HOUR
    nodes = scheduled(nodes_of("pool-a", "pool-b"), "pool-a-0", later)
    assert [
        c.pool
        for c in plan(nodes=nodes, maintenance_before=maintenance_before(NOW, 24 * HOUR)).claims
    ] == ["pool-a"]
    assert maintenance_before(NOW, 0) is None and maintenance_before(None, 60) is None
    assert [c.pool for c in plan(nodes=nodes).claims] == ["pool-a"]


def test_among_pools_with_maintenance_the_latest_first_then_the_usual_order() -> None:
    base = int(NOW.timestamp())
    pools = [
        ShapePool("a", True, maintenance_at=base + HOUR),
        ShapePool("b", True, maintenance_at=base + 5 * HOUR),
        ShapePool("c", True),
        ShapePool("d", True, maintenance_at=base + 100 * HOUR),  # outside the window
        ShapePool("e", True, capacity_type=CapacityType.SPOT),
    ]
    cutoff = base + 24 * HOUR
    got = prefer_pools(pools, 5, maintenance_before=cutoff, by_name=True)
    assert [p.name for p in got] == ["c", "d", "e", "b", "a"]
    got = prefer_pools(pools, 5, maintenance_before=cutoff, capacity_types=(CapacityType.SPOT,))
    assert [p.name for p in got] == ["e", "c", "d", "b", "a"]
    # no cutoff: maintenance is not looked at (name order)
    assert [p.name for p in prefer_pools(pools, 5, by_name=True)] == list("abcde")


def test_scheduled_maintenance_is_the_earliest_valid_label() -> None:
    nodes = scheduled(scheduled(nodes_of("p"), "p-1", 2_000_000_000), "p-2", 1_900_000_000)
    nodes = with_node(nodes, "p-3", labels={"cloud.google.com/scheduled-maintenance-time": "soon"})
    assert scheduled_maintenance(nodes) == 1_900_000_000
    assert scheduled_maintenance(nodes_of("q")) is None
    assert maintenance_message(1_900_000_000) == "maintenance at 2030-03-17T17:46:40Z"


@pytest.mark.parametrize(
    ("fields", "signal", "reason"),
    [
        ({"taints": (TERMINATING,)}, Signal.TERMINATION, DisruptionReason.PREEMPTION),
        (
            {"taints": (TERMINATING,), "capacity_type": CapacityType.SPOT},
            Signal.TERMINATION,
            DisruptionReason.PREEMPTION,
        ),
        ({"taints": (WINDOW,)}, Signal.MAINTENANCE, DisruptionReason.MAINTENANCE),
        ({"ready": False}, Signal.NOT_READY, DisruptionReason.NODE_FAILURE),
        (
            {"labels": {"cloud.google.com/gke-tpu-partition-4x4x4-state": "UNHEALTHY"}},
            Signal.PARTITION_UNHEALTHY,
            DisruptionReason.NODE_FAILURE,
        ),
    ],
)
def test_drain_signal_and_its_reason(
    fields: dict[str, Any], signal: Signal, reason: DisruptionReason
) -> None:
    found = drain_signal(with_node(nodes_of("p"), "p-1", **fields))
    assert found is not None
    assert (found.node, found.signal, found.reason) == ("p-1", signal, reason)


def test_no_drain_signal_on_healthy_or_merely_scheduled_nodes() -> None:
    assert drain_signal(nodes_of("p")) is None
    assert drain_signal(scheduled(nodes_of("p"), "p-0", 1_900_000_000)) is None
    assert drain_signal([node("x", "p", schedulable=False)]) is None


def test_a_gang_that_must_take_pools_with_maintenance_takes_them_from_one_window() -> None:
    base = int(NOW.timestamp())
    pools = [
        ShapePool("a1", True, maintenance_at=base + 5 * HOUR),
        ShapePool("a2", True, maintenance_at=base + 5 * HOUR),
        ShapePool("b1", True, maintenance_at=base + 10 * HOUR),
        ShapePool("c", True),
    ]
    cutoff = base + 24 * HOUR
    got = prefer_pools(pools, 3, maintenance_before=cutoff, together=True)
    assert [p.name for p in got] == ["c", "a1", "a2"]  # one window: one restart
    # slices on their own take the latest maintenance first
    alone = prefer_pools(pools, 3, maintenance_before=cutoff)
    assert [p.name for p in alone] == ["c", "b1", "a1"]
    # no window has enough pools for all three: as ranked (the latest first)
    short = [*pools[:3], ShapePool("d", True, maintenance_at=base + HOUR)]
    got = prefer_pools(short, 3, maintenance_before=cutoff, together=True)
    assert [p.name for p in got] == ["b1", "a1", "a2"]


def test_inside_a_topology_block_a_gang_lines_up_its_windows_too() -> None:
    base = int(NOW.timestamp())
    cutoff = base + 24 * HOUR

    def pool(name: str, block: str, hours: int | None = None) -> ShapePool:
        at = None if hours is None else base + hours * HOUR
        return ShapePool(name, True, block=block, maintenance_at=at)

    # block x can hold all three, but only with maintenance: one window has two pools
    x = [pool("x1", "x", 5), pool("x2", "x", 5), pool("x3", "x", 10), pool("x4", "x")]
    got = prefer_pools(x, 3, maintenance_before=cutoff, together=True)
    assert [p.name for p in got] == ["x4", "x1", "x2"]  # one window: one restart
    # of two blocks that can each hold the gang, the one whose pools span fewer windows
    y = [pool("y1", "y", 4), pool("y2", "y", 8)]
    z = [pool("z1", "z", 3), pool("z2", "z", 3)]
    got = prefer_pools([*y, *z], 2, maintenance_before=cutoff, together=True)
    assert [p.name for p in got] == ["z1", "z2"]
    # the block the gang holds already still comes first
    anchor = [pool("y0", "y")]
    got = prefer_pools([*y, *z], 2, maintenance_before=cutoff, together=True, anchor=anchor)
    assert {p.name for p in got} == {"y1", "y2"}
