"""kstatus-style conditions from observations."""

from __future__ import annotations

from typing import Any

from tpuslice.model.records import SliceState, SliceStatus
from tpuslice.status.conditions import Observed, Stall, compute_status, slice_events

T0, T1 = "2026-11-30T00:00:00Z", "2026-11-30T00:01:00Z"


def observed(*states: SliceState, **kw: Any) -> Observed:
    args: dict[str, Any] = dict(
        generation=3,
        accelerator_type="v6e-16",
        hosts_per_slice=4,
        chips_per_host=4,
        ray_cluster="llm",
        desired_slices=len(states),
        slices=[
            SliceStatus(
                i,
                s,
                f"tpu-{i}",
                f"pool-{i}"
                if s != SliceState.WAITING_FOR_CAPACITY and s != SliceState.PENDING
                else None,
                4 if s == SliceState.READY else 0,
                "needs a pool" if s == SliceState.WAITING_FOR_CAPACITY else "",
            )
            for i, s in enumerate(states)
        ],
        ray_cluster_ready=all(s == SliceState.READY for s in states),
        suspended=False,
        gated=True,
        applied=True,
    )
    args.update(kw)
    return Observed(**args)


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_ready_when_every_slice_and_the_raycluster_are_ready() -> None:
    status = compute_status(observed(SliceState.READY, SliceState.READY), None, T0)
    assert conditions(status) == {
        "Ready": ("True", "Ready"),
        "Reconciling": ("False", "Ready"),
        "Stalled": ("False", "Ready"),
        "SlicesReserved": ("True", "AllSlicesReserved"),
    }
    assert status["observedGeneration"] == 3
    assert (status["readySlices"], status["desiredSlices"], status["sliceReadiness"]) == (
        2,
        2,
        "2/2",
    )
    assert all(c["observedGeneration"] == 3 for c in status["conditions"])


def test_waiting_for_capacity_is_reconciling_not_stalled() -> None:
    status = compute_status(observed(SliceState.READY, SliceState.WAITING_FOR_CAPACITY), None, T0)
    cond = conditions(status)
    assert cond["Ready"] == ("False", "WaitingForCapacity")
    assert cond["Reconciling"] == ("True", "WaitingForCapacity")
    assert cond["Stalled"][0] == "False"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"] == "1 of 2 slices WaitingForCapacity: slice 1: needs a pool"


def test_slices_ready_but_raycluster_not() -> None:
    status = compute_status(observed(SliceState.READY, ray_cluster_ready=False), None, T0)
    assert conditions(status)["Ready"] == ("False", "RayClusterNotReady")


def test_stalled_sets_observed_generation_and_no_reconciling() -> None:
    stall = Stall("KubeRayNotInstalled", "install KubeRay")
    status = compute_status(observed(SliceState.PENDING, stall=stall, applied=False), None, T0)
    cond = conditions(status)
    assert cond["Stalled"] == ("True", "KubeRayNotInstalled")
    assert cond["Ready"] == ("False", "KubeRayNotInstalled")
    assert cond["Reconciling"][0] == "False"
    assert "SlicesReserved" not in cond
    assert status["observedGeneration"] == 3


def test_observed_generation_waits_for_apply() -> None:
    prev = {"observedGeneration": 2}
    status = compute_status(observed(SliceState.PENDING, applied=False), prev, T0)
    assert status["observedGeneration"] == 2
    assert "observedGeneration" not in compute_status(
        observed(SliceState.PENDING, applied=False), None, T0
    )


def test_suspended() -> None:
    status = compute_status(observed(suspended=True), None, T0)
    assert conditions(status)["Ready"] == ("False", "Suspended")
    assert conditions(status)["Reconciling"][0] == "False"


def test_transition_time_kept_when_only_reason_changes() -> None:
    first = compute_status(observed(SliceState.PENDING), None, T0)
    second = compute_status(observed(SliceState.WAITING_FOR_CAPACITY), first, T1)
    ready = next(c for c in second["conditions"] if c["type"] == "Ready")
    assert (ready["reason"], ready["lastTransitionTime"]) == ("WaitingForCapacity", T0)
    third = compute_status(observed(SliceState.READY), second, T1)
    ready = next(c for c in third["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["lastTransitionTime"]) == ("True", T1)


def test_same_observation_same_status() -> None:
    first = compute_status(observed(SliceState.READY), None, T0)
    assert compute_status(observed(SliceState.READY), first, T1) == first


def test_slice_events_on_transitions_only() -> None:
    before = compute_status(observed(SliceState.RESERVED), None, T0)["slices"]
    now = [SliceStatus(0, SliceState.SCHEDULED, "tpu-0", "pool-0")]
    assert slice_events(before, now) == [
        ("Normal", "SliceScheduled", "slice 0 (tpu-0) Scheduled on node pool pool-0")
    ]
    assert slice_events([s.to_dict() for s in now], now) == []
    waiting = [SliceStatus(0, SliceState.WAITING_FOR_CAPACITY, "tpu-0", None, 0, "needs a pool")]
    assert slice_events([], waiting) == [
        ("Warning", "WaitingForCapacity", "slice 0 (tpu-0) WaitingForCapacity: needs a pool")
    ]


def test_may_fold_is_anything_but_a_condition_flip_or_a_new_generation() -> None:
    from dataclasses import replace

    from tpuslice.status.conditions import may_fold

    scheduled = observed(SliceState.SCHEDULED)
    before = compute_status(scheduled, None, T0)
    one_up = replace(scheduled, slices=[replace(scheduled.slices[0], ready_hosts=1)])
    assert may_fold(before, compute_status(one_up, before, T1))  # a count
    reserved = observed(SliceState.RESERVED)
    assert may_fold(before, compute_status(reserved, before, T1))  # a slice state
    ready = observed(SliceState.READY)
    assert not may_fold(before, compute_status(ready, before, T1))  # Ready flips
    assert not may_fold(before, {**before, "observedGeneration": 7})  # a new generation
    assert not may_fold(before, before)  # no change at all
    assert not may_fold({}, before)  # the first status is never held
    asked = {**before, "slices": [{**before["slices"][0], "provisioning": {"attempt": 1}}]}
    assert not may_fold(before, asked)  # the attempt count is read back: never held
    moved = {**asked, "slices": [{**asked["slices"][0], "readyHosts": 3}]}
    assert may_fold(asked, moved)


def test_slices_reserved_turning_true_folds_and_turning_false_does_not() -> None:
    """The claims come a moment before the release and scheduling: SlicesReserved turning
    True is held with them (one write on the way to Ready, not two); a slice losing its
    unit is written at once."""
    from tpuslice.status.conditions import may_fold

    def reserved(status: dict[str, Any]) -> str:
        return next(c["status"] for c in status["conditions"] if c["type"] == "SlicesReserved")

    pending = compute_status(observed(SliceState.PENDING), None, T0)
    claimed = compute_status(observed(SliceState.RESERVED), pending, T1)
    assert (reserved(pending), reserved(claimed)) == ("False", "True")
    assert may_fold(pending, claimed)
    assert not may_fold(claimed, compute_status(observed(SliceState.PENDING), claimed, T1))
    ready = compute_status(observed(SliceState.READY), pending, T1)
    assert not may_fold(pending, ready)  # Ready flips: at once, the reserved flip with it


def test_thousands_of_blocked_slices_give_a_bounded_summary_the_crd_accepts() -> None:
    """Listing every slice, a Ready message passes the CRD's 32,768 characters from ~550
    pending slices on, and every status write is refused."""
    import json

    from tests.support.crd import validate
    from tpuslice.status.conditions import MAX_MESSAGE

    capacity = "needs a free node pool of 4 ready nodes with tpu-v6e-slice/4x4; " + "x" * 900
    slices = [
        SliceStatus(i, SliceState.WAITING_FOR_CAPACITY, f"tpu-{i:05d}", None, 0, capacity)
        if i % 3
        else SliceStatus(i, SliceState.PENDING, message="waiting for KubeRay to create pods")
        for i in range(4096)
    ]
    status = compute_status(observed(slices=slices, desired_slices=4096), None, T0)
    for cond in status["conditions"]:
        assert len(cond["message"]) <= MAX_MESSAGE, cond["type"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"].startswith("2730 of 4096 slices WaitingForCapacity: slices 1-2, 4-5")
    assert "more slices" in ready["message"] or "in all" in ready["message"]
    reserved = next(c for c in status["conditions"] if c["type"] == "SlicesReserved")
    assert reserved["message"].startswith("slices without a node pool: 0-4095")
    assert len(json.dumps(status)) < 1_000_000  # etcd stores objects up to 1.5 MiB
    assert all(len(s.get("message", "")) <= 512 for s in status["slices"])
    obj = {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "TPUSliceCluster",
        "metadata": {"name": "llm"},
        "spec": {"tpu": {"type": "v6e", "topology": "4x4"}, "ray": {"version": "2.54.0"}},
        "status": status,
    }
    assert validate("tpuslice.dev_tpusliceclusters.yaml", obj) == []


def test_blocked_slices_with_one_message_are_one_group() -> None:
    slices = [
        SliceStatus(i, SliceState.WAITING_FOR_CAPACITY, f"tpu-{i}", None, 0, "needs a pool")
        for i in (0, 1, 2, 5)
    ]
    status = compute_status(observed(slices=slices, desired_slices=6), None, T0)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"] == "4 of 6 slices WaitingForCapacity: slices 0-2, 5: needs a pool"


def test_a_huge_stall_message_is_cut_and_says_so() -> None:
    from tpuslice.status.conditions import MAX_MESSAGE, truncate

    status = compute_status(observed(stall=Stall("RayClusterRejected", "y" * 100_000)), None, T0)
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert MAX_MESSAGE - 40 < len(stalled["message"]) <= MAX_MESSAGE
    assert stalled["message"].endswith("more characters)")
    assert truncate("short", 10) == "short"


def test_index_ranges_are_bounded() -> None:
    from tpuslice.status.conditions import index_ranges

    assert index_ranges([3, 0, 1, 2, 7, 9, 10]) == "0-3, 7, 9-10"
    text = index_ranges(range(0, 8192, 2), limit=100)
    assert len(text) < 130 and text.endswith("(4,096 in all)")
