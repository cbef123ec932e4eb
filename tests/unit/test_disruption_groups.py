"""An object of several TPU groups counts disruptions per slice in each group
(``status.groups[].slices``, and in a service's cluster sections), by group: slice
indexes are per group, so a drain of one group's slice 0 is never another's."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from tests.support.builders import nodes_of
from tpuslice.model.records import Drain
from tpuslice.planning.accounting import walk_nodes, with_disruptions, with_maintenance

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def drain(index: int, replica: str) -> Drain:
    return Drain("pool-a", replica, index, (), "pool-a-1", "is NotReady", "NodeFailure", 30)


def group(name: str, *replicas: str) -> dict[str, Any]:
    slices = [{"index": i, "replica": r, "nodePool": f"pool-{r}"} for i, r in enumerate(replicas)]
    return {"name": name, "slices": slices}


def counts(entry: dict[str, Any]) -> list[int | None]:
    return [s.get("disruptions") for s in entry["slices"]]


def test_a_drain_counts_in_its_own_group_only() -> None:
    status = {"groups": [group("trainer", "t0", "t1"), group("rollout", "r0"), {"name": "data"}]}
    out = with_disruptions(
        status,
        {},
        [drain(0, "r0")],
        NOW,
        {"rl": [drain(0, "r0")]},
        {("rl", "rollout"): [drain(0, "r0")]},
    )
    trainer, rollout, data = out["groups"]
    assert counts(trainer) == [None, None]
    assert counts(rollout) == [1]
    assert rollout["slices"][0]["lastDisruption"]["replica"] == "r0"
    assert data == {"name": "data"}  # a CPU group has no slices
    assert out["disruptions"]["total"] == 1

    # carried by group name to the next pass; a replica replaced without a drain fails
    later = with_disruptions(
        {"groups": [group("trainer", "t0", "t9"), group("rollout", "r5")]}, out, [], NOW
    )
    trainer, rollout = later["groups"]
    assert (rollout["slices"][0]["disruptions"], rollout["slices"][0].get("failures")) == (1, None)
    assert trainer["slices"][1]["failures"] == 1
    assert later["disruptions"]["failures"] == 1


def test_a_services_grouped_cluster_sections_count_per_group_and_cluster() -> None:
    status = {
        "activeCluster": {
            "name": "rl-a",
            "groups": [group("trainer", "a0"), group("rollout", "a1")],
        },
        "pendingCluster": {"name": "rl-b", "groups": [group("trainer", "b0")]},
    }
    out = with_disruptions(
        status,
        {},
        [drain(0, "a0")],
        NOW,
        {"rl-a": [drain(0, "a0")]},
        {("rl-a", "trainer"): [drain(0, "a0")]},
    )
    active, pending = out["activeCluster"]["groups"], out["pendingCluster"]["groups"]
    assert [counts(g) for g in active] == [[1], [None]]
    assert [counts(g) for g in pending] == [[None]]


def test_maintenance_shows_per_group_slice() -> None:
    nodes = [
        replace(n, labels={"cloud.google.com/scheduled-maintenance-time": "1796000000"})
        for n in nodes_of("pool-r0")
    ]
    out = with_maintenance(
        {"groups": [group("trainer", "t0"), group("rollout", "r0")]}, walk_nodes(nodes)
    )
    trainer, rollout = out["groups"]
    assert "maintenance" not in trainer["slices"][0]
    assert rollout["slices"][0]["maintenance"]["state"] == "Scheduled"
