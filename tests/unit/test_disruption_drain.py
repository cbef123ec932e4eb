"""A disrupted held unit drains its whole slice in one pass, with the grace period; the
unit is quarantined while the signal lasts; disruptions are counted apart from failures,
in status (read back each pass), as an event and as a metric."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from tests.support.builders import nodes_of, slice_pods, tpu, tpuslice
from tests.support.fake_kube import FakeKube
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model.records import Drain, Holder, Move, NodeInfo, ReservationInfo, Snapshot, Taint
from tpuslice.planning.accounting import with_disruptions
from tpuslice.planning.busy import move_message

NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
KEY = ("TPUSliceCluster", "ml", "llm")
TERMINATING = Taint("cloud.google.com/impending-node-termination", "true", "NoSchedule")


def body(status: dict[str, Any] | None = None, **disruption: Any) -> dict[str, Any]:
    spec_tpu = tpu(topology="4x4", slices=1)
    out = tpuslice(name="llm", uid="uid-llm", generation=1, tpu=spec_tpu)
    if disruption:
        out["spec"]["disruption"] = disruption
    if status is not None:
        out["status"] = status
    return out


def tainted(nodes: list[NodeInfo], name: str) -> list[NodeInfo]:
    return [replace(n, taints=(TERMINATING,)) if n.name == name else n for n in nodes]


def held() -> ReservationInfo:
    return ReservationInfo(
        "pool-a", Holder("ml", "llm", "uid-llm", "tpu-aaaaa", 0), "Bound", uid="r"
    )


def run(snap: Snapshot) -> tuple[FakeKube, Reconciler]:
    kube = FakeKube()
    reconciler = Reconciler(kube, lambda _: snap)
    reconciler.actuator.clock = lambda: NOW
    reconciler.status.fold_max_seconds = 0.0
    asyncio.run(reconciler.kick(KEY))
    return kube, reconciler


def running() -> list[Any]:
    return slice_pods("tpu-aaaaa", 0, gated=False, pool="pool-a", ready=True)


def test_a_termination_taint_on_one_node_drains_every_pod_of_the_slice_at_once() -> None:
    nodes = tainted(nodes_of("pool-a", "pool-b"), "pool-a-2")
    kube, reconciler = run(Snapshot(body(gracePeriodSeconds=45), running(), nodes, [held()], None))
    deleted = [c[1] for c in kube.calls if c[0] == "delete-pod"]
    assert deleted == [p.name for p in running()]
    assert set(kube.pod_grace.values()) == {45}
    assert ("event", "SliceDisrupted") in kube.calls
    assert kube.claimed == {}  # the replacement claims once KubeRay made its pods
    assert kube.status is not None
    entry, waiting = kube.status["slices"]  # the drained one, and its replacement to come
    assert (entry["state"], waiting["state"]) == ("Releasing", "Pending")
    assert entry["message"].startswith(
        "node pool-a-2 has the cloud.google.com/impending-node-termination taint"
    )
    assert entry["disruptions"] == 1
    assert entry["lastDisruption"] == {
        "reason": "Preemption",
        "time": "2026-12-03T12:00:00Z",
        "node": "pool-a-2",
        "replica": "tpu-aaaaa",
    }
    assert kube.status["disruptions"] == {
        "total": 1,
        "byReason": {"Preemption": 1},
        "failures": 0,
        "lastReason": "Preemption",
        "lastTime": "2026-12-03T12:00:00Z",
    }
    metrics = reconciler.metrics
    assert metrics.slice_disruptions.labels("Preemption")._value.get() == 1
    assert metrics.quarantined_units.labels("v6e 4x4")._value.get() == 1


def test_the_next_pass_neither_drains_again_nor_claims_the_quarantined_unit() -> None:
    nodes = tainted(nodes_of("pool-a", "pool-b"), "pool-a-2")
    first, _ = run(Snapshot(body(), running(), nodes, [held()], None))
    assert first.status is not None
    terminating = slice_pods("tpu-aaaaa", 0, gated=False, pool="pool-a", deleting=True)
    replacement = slice_pods("tpu-bbbbb", 0)  # KubeRay's new replica, gated
    kube, _ = run(Snapshot(body(first.status), terminating + replacement, nodes, [held()], None))
    assert not any(c[0] == "delete-pod" for c in kube.calls)
    assert list(kube.claimed) == ["pool-b"]
    assert kube.status is not None
    assert kube.status["disruptions"]["total"] == 1  # carried, not counted again
    # the replacement at index 0 follows a drain: not a failure
    assert kube.status["disruptions"]["failures"] == 0
    assert "failures" not in kube.status["slices"][0]
    # the pods are gone and the taint cleared: the unit is claimable again
    healed, _ = run(Snapshot(body(kube.status), replacement, nodes_of("pool-a"), [], None))
    assert list(healed.claimed) == ["pool-a"]


def test_a_slice_never_released_gives_the_unit_back_instead_of_draining() -> None:
    gated = slice_pods("tpu-aaaaa", 0)
    nodes = tainted(nodes_of("pool-a"), "pool-a-0")
    kube, _ = run(Snapshot(body(), gated, nodes, [held()], None))
    assert not any(c[0] == "delete-pod" for c in kube.calls)
    assert ("free", "pool-a") in kube.calls
    assert kube.status is not None
    assert "disruptions" not in kube.status


def test_counts_are_bounded_and_garbage_in_status_is_ignored() -> None:
    drain = Drain("p", "r", 0, (), "n", "is NotReady", "NodeFailure", 30)
    previous = {
        "disruptions": {"byReason": {"NodeFailure": "many", "Maintenance": 2, "Bogus": 9}},
        "slices": [{"index": 0, "disruptions": -4}],
    }
    out = with_disruptions({"slices": [{"index": 0}]}, previous, [drain], NOW)
    assert out["disruptions"]["byReason"] == {"Maintenance": 2, "NodeFailure": 1}
    assert out["disruptions"]["total"] == 3
    assert out["slices"][0]["disruptions"] == 1


def scheduled(nodes: list[NodeInfo], at: str) -> list[NodeInfo]:
    return [
        replace(n, labels={"cloud.google.com/scheduled-maintenance-time": at})
        if n.pool == "pool-a"
        else n
        for n in nodes
    ]


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_scheduled_maintenance_shows_per_slice_and_as_an_informational_condition() -> None:
    nodes = scheduled(nodes_of("pool-a"), "1796320800")  # 2026-12-03T18:00:00Z
    kube, _ = run(Snapshot(body(), running(), nodes, [held()], None))
    assert kube.status is not None
    (entry,) = kube.status["slices"]
    assert entry["maintenance"] == {"state": "Scheduled", "scheduledAt": "2026-12-03T18:00:00Z"}
    assert entry["message"] == "node pool pool-a: maintenance at 2026-12-03T18:00:00Z"
    assert not any(c[0] == "delete-pod" for c in kube.calls)  # scheduled only: no drain
    cond = conditions(kube.status)["MaintenanceScheduled"]
    assert (cond["status"], cond["reason"]) == ("True", "Scheduled")
    assert cond["message"].startswith("slice 0: maintenance scheduled at 2026-12-03T18:00:00Z")
    # maintenance done: the condition turns False (it existed), the entry goes
    later, _ = run(Snapshot(body(kube.status), running(), nodes_of("pool-a"), [held()], None))
    assert later.status is not None
    assert "maintenance" not in later.status["slices"][0]
    assert conditions(later.status)["MaintenanceScheduled"]["status"] == "False"


def test_no_maintenance_no_condition() -> None:
    kube, _ = run(Snapshot(body(), running(), nodes_of("pool-a"), [held()], None))
    assert kube.status is not None
    assert "MaintenanceScheduled" not in conditions(kube.status)
    assert "disruptions" not in kube.status


def test_the_drained_slice_keeps_its_why_when_the_pass_also_claims_for_another() -> None:
    nodes = tainted(nodes_of("pool-a", "pool-b"), "pool-a-0")
    other = slice_pods("tpu-bbbbb", 1)  # a second slice, gated, wanting a pool
    two = body()
    two["spec"]["tpu"]["slices"] = 2
    kube, _ = run(Snapshot(two, running() + other, nodes, [held()], None))
    assert list(kube.claimed) == ["pool-b"]  # acted, so the pass planned again
    assert kube.status is not None
    first = next(e for e in kube.status["slices"] if e["index"] == 0)
    assert first["state"] == "Releasing"
    assert first["message"].startswith("node pool-a-0 has the")
    assert first["disruptions"] == 1


def test_a_replica_replaced_without_a_drain_is_a_failure() -> None:
    previous = {"slices": [{"index": 0, "replica": "tpu-aaaaa", "state": "Ready"}]}
    out = with_disruptions({"slices": [{"index": 0, "replica": "tpu-ccccc"}]}, previous, [], NOW)
    assert out["slices"][0]["failures"] == 1
    assert out["disruptions"] == {"total": 0, "byReason": {}, "failures": 1}
    # after a drain of that replica, its replacement is not a failure
    drained = {
        "slices": [
            {
                "index": 0,
                "replica": "tpu-aaaaa",
                "lastDisruption": {"reason": "Maintenance", "replica": "tpu-aaaaa"},
            }
        ]
    }
    out = with_disruptions({"slices": [{"index": 0, "replica": "tpu-ccccc"}]}, drained, [], NOW)
    assert "failures" not in out["slices"][0] and "disruptions" not in out
    # the same replica, or a slice that had none yet: nothing
    same = with_disruptions({"slices": [{"index": 0, "replica": "tpu-aaaaa"}]}, previous, [], NOW)
    assert "failures" not in same["slices"][0]


def test_a_slice_moved_off_a_busy_node_is_not_a_failure() -> None:
    previous = {
        "slices": [
            {
                "index": 0,
                "replica": "llm-w-0",
                "node": "n-0",
                "state": "Releasing",
                "message": move_message(Move("n-0", "llm-w-0", (), 61.0, "is not ready")),
            }
        ]
    }
    out = with_disruptions({"slices": [{"index": 0, "replica": "llm-w-1"}]}, previous, [], NOW)
    assert "failures" not in out["slices"][0] and "disruptions" not in out
