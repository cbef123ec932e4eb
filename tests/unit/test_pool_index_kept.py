"""What the shape's pool index keeps between passes: each unit's problem, its facts and
an object's placement exclusions, computed once per index (an index is rebuilt when a
node of the shape changes), so a pass does not classify every node of the shape."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.builders import ACCELERATOR, HOSTS, TOPOLOGY, nodes_of, tpu, tpuslice
from tpuslice.controller import actuator
from tpuslice.model.records import Snapshot, Taint
from tpuslice.planning import pools
from tpuslice.planning.nodeclass import WantedShape
from tpuslice.spec.cluster import parse_cluster

WANTED = WantedShape(ACCELERATOR, TOPOLOGY, HOSTS, 4)


def _counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[Any]:
    calls: list[Any] = []
    real = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_units_problem_is_classified_once_per_index(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, pools, "_pool_problem")
    index = pools.pool_index(
        nodes_of("pool-a") + nodes_of("pool-b", cordoned=1), ACCELERATOR, TOPOLOGY
    )
    assert index.unit_problem("pool-a", WANTED) is None
    assert index.unit_problem("pool-b", WANTED)  # a cordoned node: why it cannot hold one
    assert index.unit_problem("pool-a", WANTED) is None
    narrowed = index.narrowed(lambda name, _nodes: name == "pool-a")
    assert narrowed.unit_problem("pool-a", WANTED) is None  # shared: the same nodes
    assert len(calls) == 2
    # a node change rebuilds the index, and the answer with it
    rebuilt = pools.pool_index(nodes_of("pool-a", cordoned=1), ACCELERATOR, TOPOLOGY)
    assert rebuilt.unit_problem("pool-a", WANTED)
    assert len(calls) == 3


def test_a_units_facts_come_from_the_indexs_facts() -> None:
    index = pools.pool_index(nodes_of("pool-a", "pool-b"), ACCELERATOR, TOPOLOGY)
    first = pools.unit_facts(index, "pool-a", hosts=HOSTS, chips_per_host=4)
    assert first.eligible and first.name == "pool-a"
    assert pools.unit_facts(index, "pool-a", hosts=HOSTS, chips_per_host=4) is first
    gone = pools.unit_facts(index, "pool-x", hosts=HOSTS, chips_per_host=4)
    assert not gone.eligible  # not in the index: no nodes, never eligible


def test_a_placement_walks_the_shapes_nodes_once_per_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _counting(monkeypatch, actuator, "excluded_pools")
    tainted = nodes_of("pool-b", taints=(Taint("team", "other", "NoSchedule"),))
    index = pools.pool_index(nodes_of("pool-a") + tainted, ACCELERATOR, TOPOLOGY)
    spec = parse_cluster(tpuslice(tpu=tpu(slices=1))).tpu_groups()[0]
    snap = Snapshot(None, [], [], [], None)
    for _ in range(3):  # every pass of every object with the same placement
        placed = actuator.placed(index, spec, snap)
        assert set(placed.matching) == {"pool-a"}  # the untolerated taint keeps pool-b
    assert len(calls) == 1
    tolerating = tpuslice(tpu=tpu(slices=1))
    tolerating["spec"]["worker"] = {
        "template": {"spec": {"tolerations": [{"key": "team", "operator": "Exists"}]}}
    }
    other = parse_cluster(tolerating).tpu_groups()[0]
    assert set(actuator.placed(index, other, snap).matching) == {"pool-a", "pool-b"}
    assert len(calls) == 2  # another placement, its own walk
