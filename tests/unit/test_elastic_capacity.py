"""Capacity on demand for an elastic slice set: the minimum asks as a fixed set does;
above it capacity is asked for one slice at a time, and a slice the autoscaler gave up
loses its request."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.support.builders import holder, reservation, slice_pods
from tpuslice.capacity.decide import decide
from tpuslice.capacity.facts import one_extra_at_a_time, slice_facts
from tpuslice.capacity.objects import request_hash, request_name
from tpuslice.model import constants as c
from tpuslice.model.records import (
    ClusterRef,
    PodInfo,
    ProvisioningAction,
    ProvisioningRequestInfo,
    RequestCondition,
    SliceFacts,
    SlicePlan,
    SliceState,
    SliceStatus,
)
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.parts import SliceClusterSpec

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
REF = ClusterRef("ml", "llm", "uid-llm")
REPLICAS = ("tpu-aaaaa", "tpu-bbbbb", "tpu-ccccc", "tpu-ddddd")


def elastic_spec(minimum: int, maximum: int = 4) -> SliceClusterSpec:
    return parse_cluster(
        {
            "metadata": {"name": "llm", "namespace": "ml", "uid": "uid-llm"},
            "spec": {
                "tpu": {"type": "v6e", "topology": "4x4"},
                "elastic": {"minSlices": minimum, "maxSlices": maximum},
                "ray": {"version": "2.60.0"},
                "reservation": {"provisioning": {"mode": "QueuedProvisioning"}},
            },
        }
    )


def waiting_plan(count: int, held: int = 0) -> tuple[SlicePlan, list[PodInfo]]:
    """``count`` slices with all pods created; the first ``held`` hold a pool."""
    slices = tuple(
        SliceStatus(
            i,
            SliceState.RESERVED if i < held else SliceState.WAITING_FOR_CAPACITY,
            REPLICAS[i],
            node_pool=f"pool-{i}" if i < held else None,
        )
        for i in range(count)
    )
    pods = [p for i in range(count) for p in slice_pods(REPLICAS[i], i)]
    return SlicePlan(slices=slices), pods


def facts_of(spec: SliceClusterSpec, count: int, held: int) -> dict[int, SliceFacts]:
    plan, pods = waiting_plan(count, held)
    return slice_facts(
        REF,
        spec,
        plan,
        pods,
        [reservation(f"pool-{i}", holder(REPLICAS[i], i)) for i in range(held)],
        eligible=frozenset(f"pool-{i}" for i in range(held)),
        pool_nodes={},
        newest={},
    )


def request(index: int, *conditions: RequestCondition) -> ProvisioningRequestInfo:
    spec = elastic_spec(1)
    assert spec.provisioning is not None
    return ProvisioningRequestInfo(
        namespace="ml",
        name=request_name("llm", index, 1),
        uid="r-uid",
        raycluster="llm",
        slice_index=index,
        attempt=1,
        class_name=spec.provisioning.class_name,
        spec_hash=request_hash(spec),
        conditions={x.type: x for x in conditions},
        details={"NodePoolName": f"dws-{index}"},
        created=NOW - timedelta(seconds=300),
    )


def cond(kind: str) -> RequestCondition:
    return RequestCondition(kind, "True", kind, "", NOW - timedelta(seconds=60))


def test_only_the_lowest_waiting_extra_asks() -> None:
    facts = facts_of(elastic_spec(1), count=4, held=1)
    assert [facts[i].asks_after for i in range(4)] == [None, None, 1, 1]
    decisions = {i: decide(facts[i], None, elastic_spec(1), now=NOW) for i in (1, 2, 3)}
    assert decisions[1].action == ProvisioningAction.CREATE
    for i in (2, 3):
        assert decisions[i].action == ProvisioningAction.NONE
        assert decisions[i].state == SliceState.WAITING_FOR_CAPACITY
        assert "one slice at a time; slice 1 asks first" in decisions[i].message


def test_the_minimum_asks_whole() -> None:
    """Below the minimum every waiting slice of it asks at once, as a fixed set's."""
    facts = facts_of(elastic_spec(3), count=4, held=0)
    assert [facts[i].asks_after for i in range(4)] == [None, None, None, None]
    assert one_extra_at_a_time({0, 1, 2, 3, 5}, 3) == [3, 5]


def test_a_fixed_set_is_untouched() -> None:
    spec = parse_cluster(
        {
            "metadata": {"name": "llm", "namespace": "ml", "uid": "uid-llm"},
            "spec": {
                "tpu": {"type": "v6e", "topology": "4x4", "slices": 4},
                "ray": {"version": "2.60.0"},
                "reservation": {"provisioning": {"mode": "QueuedProvisioning"}},
            },
        }
    )
    facts = facts_of(spec, count=4, held=1)
    assert all(f.asks_after is None for f in facts.values())


def test_an_extra_behind_the_one_asking_withdraws_a_request_not_yet_provisioned() -> None:
    behind = SliceFacts(index=2, raycluster="llm", pods_complete=True, asks_after=1)
    accepted = request(2, cond(c.PROVREQ_ACCEPTED))
    d = decide(behind, accepted, elastic_spec(1), now=NOW)
    assert d.action == ProvisioningAction.DELETE and d.delete == accepted.name
    assert d.state == SliceState.WAITING_FOR_CAPACITY
    # capacity already provisioned for it is claimed, not thrown away
    provisioned = request(2, cond(c.PROVREQ_ACCEPTED), cond(c.PROVREQ_PROVISIONED))
    assert decide(behind, provisioned, elastic_spec(1), now=NOW).action == (
        ProvisioningAction.CLAIM
    )


def test_the_request_of_an_extra_the_autoscaler_gave_up_is_withdrawn() -> None:
    """The autoscaler's timeout deleted the extra's pods (workersToDelete): the slice is
    gone, and its outstanding request is deleted by the slice-gone rule."""
    spec = elastic_spec(1)
    plan, pods = waiting_plan(2, held=1)
    facts = slice_facts(
        REF,
        spec,
        plan,
        [p for p in pods if p.replica_name == REPLICAS[0]],
        [reservation("pool-0", holder(REPLICAS[0], 0))],
        eligible=frozenset({"pool-0"}),
        pool_nodes={},
        newest={("llm", 1): request(1, cond(c.PROVREQ_ACCEPTED))},
    )
    assert not facts[1].exists
    d = decide(facts[1], request(1, cond(c.PROVREQ_ACCEPTED)), spec, now=NOW)
    assert d.action == ProvisioningAction.DELETE and d.delete == request_name("llm", 1, 1)
