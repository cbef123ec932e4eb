"""spec.reservation.policy DynamicSlice: tpu7x only, the topologies a GKE Slice can take."""

from __future__ import annotations

from typing import Any

import pytest

from tpuslice.model.topology import TopologyError, dynamic_slice_shape
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.parts import SpecError


def obj(tpu: dict[str, Any], **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "tpu": tpu,
        "ray": {"version": "2.54.0"},
        "reservation": {"policy": "DynamicSlice"},
    }
    base.update(spec)
    return {"metadata": {"name": "llm", "namespace": "ml", "uid": "u"}, "spec": base}


def errors_of(raw: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as caught:
        parse_cluster(raw)
    return str(caught.value)


@pytest.mark.parametrize(
    ("topology", "hosts"),
    [("4x4x4", 16), ("4x4x8", 32), ("4x4x12", 48), ("4x12x16", 192), ("16x24x24", 2304)],
)
def test_every_slice_topology_of_whole_partitions(topology: str, hosts: int) -> None:
    spec = parse_cluster(obj({"type": "tpu7x", "topology": topology}))
    assert spec.dynamic and spec.gated
    assert spec.shape.topology == topology
    assert spec.shape.hosts == hosts and spec.shape.chips_per_host == 4


def test_a_pool_topology_is_judged_by_the_pool_rules_without_the_policy() -> None:
    assert "spec.tpu.topology: tpu7x has no 4x4x12 slice" in errors_of(
        obj({"type": "tpu7x", "topology": "4x4x12"}, reservation={})
    )


@pytest.mark.parametrize(
    ("tpu", "expected"),
    [
        ({"type": "v6e", "topology": "4x4"}, "spec.tpu.type: v6e has no dynamic slicing"),
        ({"type": "tpu7x", "topology": "4x4x6"}, "spec.tpu.topology: dynamic slice 4x4x6: every"),
        ({"type": "tpu7x", "topology": "2x2x4"}, "sub-slices below 4x4x4 are not supported"),
        ({"type": "tpu7x", "topology": "2x2x1"}, "sub-slices below 4x4x4 are not supported"),
        (
            {"type": "tpu7x", "topology": "8x4x4"},
            "must not decrease (GKE's Slice rule); write 4x4x8",
        ),
        (
            {"type": "tpu7x", "topology": "16x24x28"},
            "has 10752 chips; a GKE Slice links at most 9216",
        ),
        (
            {"type": "tpu7x", "topology": "4x4x8", "chipsPerHost": 1},
            "spec.tpu.chipsPerHost: a dynamic slice is built from 4-chip hosts",
        ),
    ],
)
def test_refused_topologies_name_the_field(tpu: dict[str, Any], expected: str) -> None:
    assert expected in errors_of(obj(tpu))


def test_each_worker_group_is_judged_as_a_dynamic_slice() -> None:
    raw = obj({})
    del raw["spec"]["tpu"]
    raw["spec"]["workerGroups"] = [
        {"name": "a", "tpu": {"type": "tpu7x", "topology": "4x4x12"}},
        {"name": "b", "tpu": {"type": "tpu7x", "topology": "4x4x2"}},
    ]
    assert "spec.workerGroups[1].tpu.topology: dynamic slice 4x4x2: sub-slices" in errors_of(raw)


def test_provisioning_needs_node_pools() -> None:
    raw = obj(
        {"type": "tpu7x", "topology": "4x4x8"},
        reservation={"policy": "DynamicSlice", "provisioning": {"mode": "BestEffortAtomic"}},
    )
    assert "spec.reservation.provisioning: needs spec.reservation.policy NodePool" in errors_of(raw)


def test_the_shape_function_says_which_input_is_wrong() -> None:
    with pytest.raises(TopologyError) as caught:
        dynamic_slice_shape("v7x", "4x4x5")
    assert caught.value.field == "topology"
    assert dynamic_slice_shape("v7x", "4x8x8").chips == 256


def test_partition_health_takes_degraded_partitions_only_when_asked() -> None:
    tpu = {"type": "tpu7x", "topology": "4x4x8"}
    assert not parse_cluster(obj(tpu)).allow_degraded
    both = {"policy": "DynamicSlice", "partitionHealth": "HealthyAndDegraded"}
    assert parse_cluster(obj(tpu, reservation=both)).allow_degraded
    bad = {"policy": "DynamicSlice", "partitionHealth": "Any"}
    assert "spec.reservation.partitionHealth: 'Any' is not Healthy or" in errors_of(
        obj(tpu, reservation=bad)
    )
