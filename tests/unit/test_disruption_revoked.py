"""A slice replaced because GKE revoked its ProvisioningRequest's capacity is a
disruption (reason CapacityRevoked), counted once, never a failure."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from tests.support.builders import nodes_of
from tests.support.fake_kube import FakeKube
from tests.unit.test_provisioner import body, request, revoked, run
from tests.unit.test_reconcile import pods
from tpuslice.model import events
from tpuslice.model.records import (
    Holder,
    ProvisioningAction,
    ProvisioningDecision,
    ProvisioningView,
    ReservationInfo,
    SlicePlan,
    SliceState,
    SliceStatus,
    Snapshot,
)
from tpuslice.planning.accounting import with_disruptions
from tpuslice.planning.disruption import revoked_drains

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
UID = "uid-llm"


def replaced(index: int, reason: str = events.CAPACITY_REVOKED) -> ProvisioningDecision:
    return ProvisioningDecision(
        ProvisioningAction.REPLACE, index, reason=reason, replace_slice=True, delete="r"
    )


def slice_plan(*states: SliceState) -> SlicePlan:
    return SlicePlan(
        slices=tuple(SliceStatus(i, s, f"tpu-{i}", f"pool-{i}") for i, s in enumerate(states))
    )


def test_only_a_live_slice_replaced_for_revoked_capacity_is_a_disruption() -> None:
    plan = slice_plan(SliceState.READY, SliceState.RELEASING, SliceState.READY)
    decisions = {
        0: replaced(0),
        1: replaced(1),  # its pods are going already: counted when they were deleted
        2: replaced(2, events.BOOKING_EXPIRED),  # never ran: not a disruption
    }
    (drain,) = revoked_drains(plan, decisions)
    assert (drain.index, drain.replica_name, drain.pool, drain.reason) == (
        0,
        "tpu-0",
        "pool-0",
        "CapacityRevoked",
    )
    status = with_disruptions({"slices": [{"index": 0, "replica": "tpu-0"}]}, {}, [drain], NOW)
    assert status["disruptions"]["byReason"] == {"CapacityRevoked": 1}
    assert status["slices"][0]["lastDisruption"] == {
        "reason": "CapacityRevoked",
        "time": "2026-12-03T12:00:00Z",
        "replica": "tpu-0",
    }


def test_the_pass_counts_a_revoked_slice_and_its_replacement_is_no_failure() -> None:
    held = ReservationInfo("auto-a", Holder("ml", "llm", UID, "tpu-aaaaa", 0), "Bound")
    running = [
        replace(p, node_name=f"auto-a-{p.host_index}", running_ready=True)
        for p in pods(gated=False, pool="auto-a")
    ]
    view = ProvisioningView(requests=(revoked(request(provisioned=True)),))
    kube = FakeKube()
    kube.requests[("ml", "llm-s0-1")] = {"metadata": {"name": "llm-s0-1"}}
    reconciler = run(
        kube, Snapshot(body(), running, nodes_of("auto-a"), [held], None, provisioning=view)
    )
    assert kube.status is not None
    assert kube.status["disruptions"]["byReason"] == {"CapacityRevoked": 1}
    assert kube.status["slices"][0]["lastDisruption"]["reason"] == "CapacityRevoked"
    metric = reconciler.metrics.slice_disruptions.labels("CapacityRevoked")
    assert metric._value.get() == 1
    # KubeRay's new replica at index 0 follows the revocation: not a failure
    new = [replace(p, replica_name="tpu-bbbbb", name=f"n{p.host_index}") for p in pods()]
    after = FakeKube()
    run(
        after,
        Snapshot(
            {**body(), "status": kube.status}, new, [], [], None, provisioning=ProvisioningView()
        ),
    )
    assert after.status is not None
    assert after.status["disruptions"]["total"] == 1
    assert after.status["disruptions"]["failures"] == 0
