"""TPU7x dynamic slices in the accelerator's partition queue: served by priority then
arrival, the head's partitions set aside, a gang holding nothing until every slice can
form, and TPUSlicePolicy limits counting a dynamic slice as one slice."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.builders import holder, partition_nodes, reservation, slice_pods, tpuslice
from tests.support.fake_kube import FakeKube
from tpuslice.controller.actuator import shape_of
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model.records import (
    Admission,
    ClusterRef,
    GangMode,
    Holder,
    NodeInfo,
    PoolRequest,
    ReservationInfo,
    ShapeMember,
    ShapePool,
    SliceState,
    Snapshot,
    Usage,
)
from tpuslice.planning.dynamic import partition_request, plan_dynamic_slices
from tpuslice.planning.partitions import partition_inventory, partition_pools, partition_shape
from tpuslice.planning.queue import decide_queue
from tpuslice.policy.placement import usage_by_namespace
from tpuslice.spec.slices import parse_slice_parts

SHAPE = partition_shape("tpu7x")
HOSTS = 32  # 4x4x8: two partitions of 16 hosts


def pools(*spec: tuple[str, str], held: dict[str, Holder] | None = None) -> list[ShapePool]:
    """Partitions as the queue sees them: (pool, block)."""
    return [
        ShapePool(name, True, holder=(held or {}).get(name), block=block) for name, block in spec
    ]


def request(name: str, *, slices: int = 1, per_slice: int = 2, **fields: Any) -> PoolRequest:
    base: dict[str, Any] = {
        "key": ("TPUSliceCluster", "ml", name),
        "uid": f"uid-{name}",
        "desired": slices * per_slice,
        "held": 0,
        "claimable": slices * per_slice,
        "live_pods": 1,
        "per_slice": per_slice,
    }
    base.update(fields)
    return PoolRequest(**base)


def test_the_queue_shape_is_the_accelerators_partition() -> None:
    assert SHAPE == ("tpu7x", "4x4x4")
    for topology in ("4x4x4", "4x4x8", "8x8x8"):
        body = tpuslice(
            tpu={"type": "tpu7x", "topology": topology}, reservation={"policy": "DynamicSlice"}
        )
        assert shape_of(parse_slice_parts(body)) == SHAPE


def test_the_higher_priority_request_is_served_first_though_created_later() -> None:
    old = request("old", created="2026-01-01T00:00:00Z")
    new = request("new", created="2026-01-02T00:00:00Z", priority=10)
    d = decide_queue(SHAPE, [old, new], pools(("sb-p1", "b1"), ("sb-p2", "b1")), noun="partition")
    assert d.order == (new.key, old.key)
    assert sorted(d.admissions[new.key].pools or ()) == ["sb-p1", "sb-p2"]
    waiting = d.admissions[old.key]
    assert waiting.pools == ()
    assert waiting.message.startswith("1st of 1 waiting for tpu7x 4x4x4: needs 2 more partitions")
    assert "1 request ahead" in waiting.message


def test_the_heads_partitions_are_set_aside_from_a_later_request_that_fits() -> None:
    # the head gang needs 4 partitions, 3 are free: a later 1-slice request (2) gets none
    head = request("head", slices=2, gang=GangMode.ALL_SLICES, priority=5)
    later = request("later")
    free = pools(("sb-p1", "b1"), ("sb-p2", "b1"), ("sb-p3", "b1"))
    taken = pools(("sb-p4", "b1"), held={"sb-p4": holder(uid="uid-x", name="x")})
    d = decide_queue(SHAPE, [later, head], free + taken, noun="partition")
    assert d.admissions[head.key].pools == ()  # a gang holds nothing until all can form
    assert d.admissions[head.key].set_aside == 3
    assert d.admissions[later.key].pools == ()
    assert d.admissions[head.key].message.startswith("1st of 2 waiting")
    assert d.admissions[later.key].message.startswith("2nd of 2 waiting")


def test_a_slice_is_granted_only_partitions_of_one_block() -> None:
    # two free partitions, but in two blocks: a 4x4x8 cannot form, nothing is granted
    r = request("a")
    d = decide_queue(SHAPE, [r], pools(("sb-p1", "b1"), ("sb-p2", "b2")), noun="partition")
    assert d.admissions[r.key].pools == ()
    assert d.admissions[r.key].set_aside == 2
    d = decide_queue(
        SHAPE,
        [r],
        pools(("sb-p1", "b1"), ("sb-p2", "b2"), ("sb-p3", "b2")),
        noun="partition",
    )
    assert sorted(d.admissions[r.key].pools or ()) == ["sb-p2", "sb-p3"]


def test_per_slice_requests_are_granted_whole_slices_only() -> None:
    r = request("a", slices=2)
    free = pools(("sb-p1", "b1"), ("sb-p2", "b1"), ("sb-p3", "b2"), ("sb-p4", "b3"))
    d = decide_queue(SHAPE, [r], free, noun="partition")
    assert d.admissions[r.key].set_aside == 4
    assert sorted(d.admissions[r.key].pools or ()) == ["sb-p1", "sb-p2"]


def test_not_enough_partitions_stalls_the_request() -> None:
    r = request("big", slices=2)
    d = decide_queue(SHAPE, [r], pools(("sb-p1", "b1"), ("sb-p2", "b1")), noun="partition")
    assert d.not_enough == (r.key,)
    assert "needs 4 partitions of tpu7x 4x4x4" in (d.admissions[r.key].stalled or "")


REF = ClusterRef("ml", "llm", "uid-llm")


def test_the_request_counts_partitions_of_live_slices() -> None:
    pods = slice_pods(hosts=HOSTS) + slice_pods("tpu-bbbbb", 1, hosts=16)
    held = [reservation("sb-p1", holder())]
    r = partition_request(
        REF, chips=128, hosts=HOSTS, desired_slices=2, pods=pods, reservations=held
    )
    assert (r.desired, r.held, r.claimable, r.per_slice) == (4, 1, 3, 2)
    gang = partition_request(
        REF,
        chips=128,
        hosts=HOSTS,
        desired_slices=2,
        pods=pods,
        reservations=held,
        gang=GangMode.ALL_SLICES,
    )
    assert gang.claimable == 0  # the second slice's pods are not all there


def nodes(*pids: str, block: str = "b1") -> list[NodeInfo]:
    return [n for pid in pids for n in partition_nodes(pid, block=block)]


def test_the_planner_claims_only_what_the_queue_admits() -> None:
    common: dict[str, Any] = {
        "topology": "4x4x8",
        "chips": 128,
        "hosts": HOSTS,
        "desired_slices": 1,
        "pods": slice_pods(hosts=HOSTS),
        "nodes": nodes("p1", "p2", "p3", "p4"),
        "reservations": [],
        "gke_slices": [],
    }
    plan = plan_dynamic_slices(REF, **common, admission=Admission(pools=("sb-p3", "sb-p4")))
    assert sorted(c.pool for c in plan.claims) == ["sb-p3", "sb-p4"]
    wait = Admission(pools=(), position=2, waiting=2, message="2nd of 2 waiting for tpu7x 4x4x4")
    plan = plan_dynamic_slices(REF, **common, admission=wait)
    assert not plan.claims
    (s,) = plan.slices
    assert s.state == SliceState.WAITING_FOR_CAPACITY
    assert s.message == "2nd of 2 waiting for tpu7x 4x4x4"
    plan = plan_dynamic_slices(REF, **common, admission=Admission(pools=(), stalled="too big"))
    assert not plan.claims and plan.stalled == "too big"


def test_partitions_as_pools_of_the_queue() -> None:
    inventory = partition_inventory(
        nodes("p1", "p2") + [n for n in partition_nodes("p3", state="UNHEALTHY")]
    )
    held = [reservation("sb-p2", holder())]
    out = {p.name: p for p in partition_pools(inventory, held, [])}
    assert out["sb-p1"].eligible and out["sb-p1"].holder is None and out["sb-p1"].block == "b1"
    assert out["sb-p2"].holder == holder()
    assert not out["sb-p3"].eligible


def test_a_dynamic_slice_counts_as_one_slice_and_its_chips_toward_namespace_limits() -> None:
    slice0 = holder("tpu-aaaaa", 0)
    slice1 = holder("tpu-bbbbb", 1)
    by_shape = {
        SHAPE: [
            reservation("sb-p1", slice0),
            reservation("sb-p2", slice0),
            reservation("sb-p3", slice1),
            reservation("sb-p4", slice1),
        ],
        ("tpu-v6e-slice", "4x4"): [reservation("v6e-a", holder(uid="uid-other", name="o"))],
    }
    assert usage_by_namespace(by_shape) == {"ml": Usage(3, 2 * 128 + 16)}


# ------------------------------------------------------------ two objects, one pass each
def dynamic(name: str, *, priority: int, created: str) -> dict[str, Any]:
    body = tpuslice(
        name=name,
        uid=f"uid-{name}",
        generation=1,
        tpu={"type": "tpu7x", "topology": "4x4x8"},
        reservation={"policy": "DynamicSlice", "priority": priority},
    )
    body["metadata"]["creationTimestamp"] = created
    return body


LOW = dynamic("low", priority=0, created="2026-01-01T00:00:00Z")
HIGH = dynamic("high", priority=100, created="2026-01-02T00:00:00Z")


def run(kube: FakeKube, me: dict[str, Any], other: dict[str, Any], held: list[Any]) -> None:
    name, other_name = me["metadata"]["name"], other["metadata"]["name"]
    snap = Snapshot(
        me,
        slice_pods(hosts=HOSTS, cluster=name),
        nodes("p1", "p2"),
        held,
        None,
        shape_members=[ShapeMember(other, slice_pods(hosts=HOSTS, cluster=other_name))],
    )
    asyncio.run(Reconciler(kube, lambda _: snap).kick(("TPUSliceCluster", "ml", name)))


def test_of_two_objects_the_higher_priority_one_takes_the_partitions() -> None:
    kube = FakeKube()
    run(kube, LOW, HIGH, [])
    assert not kube.claimed  # set aside for the higher priority object created later
    assert kube.status is not None
    (entry,) = kube.status["slices"]
    assert entry["state"] == "WaitingForCapacity"
    assert entry["message"].startswith("1st of 1 waiting for tpu7x 4x4x4")

    kube = FakeKube()
    run(kube, HIGH, LOW, [])
    assert sorted(kube.claimed) == ["sb-p1", "sb-p2"]

    # the high one holds them: the low one waits, holding nothing
    taken: list[ReservationInfo] = [
        reservation(p, holder(uid="uid-high", name="high")) for p in ("sb-p1", "sb-p2")
    ]
    kube = FakeKube()
    run(kube, LOW, HIGH, taken)
    assert not kube.claimed
    assert kube.status is not None
    (entry,) = kube.status["slices"]
    assert entry["message"].startswith("1st of 1 waiting for tpu7x 4x4x4: needs 2 more")
    assert "held by ml/high (sb-p1, sb-p2)" in entry["message"]


def test_partitions_a_policy_keeps_the_object_from_are_never_claimed() -> None:
    plan = plan_dynamic_slices(
        REF,
        topology="4x4x8",
        chips=128,
        hosts=HOSTS,
        desired_slices=1,
        pods=slice_pods(hosts=HOSTS),
        nodes=nodes("p1", "p2", "p3", "p4"),
        reservations=[],
        gke_slices=[],
        excluded={"sb-p1"},
    )
    assert sorted(c.pool for c in plan.claims) == ["sb-p2", "sb-p3"]


def test_a_dynamic_group_of_a_gang_across_groups_counts_partitions() -> None:
    # two tpu7x groups joined in one gang: 3 partitions hold a 4x4x8 and a 4x4x4, so
    # the gang is not NotEnoughPools (no node pool of either topology exists)
    body = tpuslice(
        uid="uid-rl", name="rl", reservation={"policy": "DynamicSlice", "gang": "AllSlices"}
    )
    del body["spec"]["tpu"]
    body["spec"]["workerGroups"] = [
        {"name": "trainer", "tpu": {"type": "tpu7x", "topology": "4x4x8"}},
        {"name": "rollout", "tpu": {"type": "tpu7x", "topology": "4x4x4"}},
    ]
    pods = slice_pods("trainer-axxxx", 0, hosts=HOSTS, cluster="rl", group="trainer")
    pods += slice_pods("rollout-axxxx", 0, hosts=16, cluster="rl", group="rollout")
    snap = Snapshot(body, pods, nodes("p1", "p2", "p3"), [], None)
    kube = FakeKube()
    asyncio.run(Reconciler(kube, lambda _: snap).kick(("TPUSliceCluster", "ml", "rl")))
    assert kube.status is not None
    stalled = [c for c in kube.status["conditions"] if c["type"] == "Stalled"]
    assert all(c["status"] == "False" for c in stalled), stalled
    assert len(kube.claimed) in (1, 3)  # the first group's, or both


def test_a_partitions_claim_is_of_the_partition_shape() -> None:
    kube = FakeKube()
    snap = Snapshot(LOW, slice_pods(hosts=HOSTS, cluster="low"), nodes("p1", "p2"), [], None)
    asyncio.run(Reconciler(kube, lambda _: snap).kick(("TPUSliceCluster", "ml", "low")))
    assert sorted(kube.claimed) == ["sb-p1", "sb-p2"]
    spec = kube.claimed["sb-p1"]["spec"]
    assert (spec["gkeAccelerator"], spec["topology"], spec["hosts"]) == ("tpu7x", "4x4x4", 16)
    assert spec["acceleratorType"] == "tpu7x-128"
