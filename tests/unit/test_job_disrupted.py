"""A TPUSliceJob attempt KubeRay fails within DISRUPTED_WITHIN_SECONDS of a disruption
of its slices says reason Disrupted (a preemption, not a crash); outside the bounds, or
with no disruption, KubeRay's reason stands."""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.test_job_status import conditions, observed, ray_status
from tests.unit.test_reconcile_owned import job_body
from tpuslice.controller.job import job_observed
from tpuslice.model.records import Drain, SlicePlan, Snapshot
from tpuslice.spec.job import parse_job
from tpuslice.status.job import compute_job_status

DISRUPTED_AT = "2026-12-01T00:00:00Z"


def disrupted(ray: dict[str, object], now: str, at: str = DISRUPTED_AT) -> dict[str, object]:
    seen = dataclasses.replace(
        observed(ray, None), disruption_reason="Preemption", disrupted_at=at, now=now
    )
    return compute_job_status(seen, None, now)


@pytest.mark.parametrize(
    ("end", "reason"),
    [
        ("2026-12-01T00:01:30Z", "Disrupted"),  # 90 s after the drain
        ("2026-11-30T23:59:00Z", "Disrupted"),  # Ray noticed the dead host first
        ("2026-12-01T00:10:00Z", "Disrupted"),  # the bound itself
        ("2026-12-01T00:10:01Z", "AppFailed"),  # it ran on for 10 minutes: its own failure
        ("2026-11-30T23:57:59Z", "AppFailed"),  # long before the disruption
    ],
)
def test_a_final_failure_near_a_disruption_is_disrupted(end: str, reason: str) -> None:
    ray = ray_status("Failed", "FAILED", failed=3, reason="AppFailed", endTime=end)
    # the pass runs much later: KubeRay's endTime decides, so the reason stays
    status = disrupted(ray, now="2026-12-02T00:00:00Z")
    assert conditions(status)["Failed"] == ("True", reason)
    message = next(c for c in status["conditions"] if c["type"] == "Failed")["message"]
    if reason == "Disrupted":
        assert message.startswith(
            "the job failed after 3 attempts just after a disruption of its slices "
            "(Preemption at 2026-12-01T00:00:00Z): AppFailed"
        )


def test_a_retry_right_after_a_disruption_says_so_and_a_later_one_does_not() -> None:
    ray = ray_status("Retrying", "FAILED", failed=1, reason="AppFailed", message="exit 1")
    soon = disrupted(ray, now="2026-12-01T00:02:00Z")
    assert conditions(soon)["Reconciling"] == ("True", "Disrupted")
    assert conditions(soon)["Failed"][0] == "False"
    later = disrupted(ray, now="2026-12-01T01:00:00Z")
    assert conditions(later)["Reconciling"] == ("True", "Retrying")


def test_no_disruption_leaves_kuberays_reason() -> None:
    ray = ray_status("Failed", "FAILED", failed=1, reason="AppFailed", endTime=DISRUPTED_AT)
    status = compute_job_status(observed(ray, None), None, DISRUPTED_AT)
    assert conditions(status)["Failed"] == ("True", "AppFailed")


def test_job_observed_takes_this_pass_drain_before_the_recorded_one() -> None:
    body = job_body()
    spec, snap = parse_job(body), Snapshot(body, [], [], [], None)
    previous = {"disruptions": {"lastReason": "Maintenance", "lastTime": "2026-11-01T00:00:00Z"}}
    kept = job_observed(spec, body, snap, SlicePlan(), 1, True, None, previous, DISRUPTED_AT)
    assert (kept.disruption_reason, kept.disrupted_at) == ("Maintenance", "2026-11-01T00:00:00Z")
    drain = Drain("p", "r", 0, (), "n", "is NotReady", "NodeFailure", 30)
    now = job_observed(
        spec, body, snap, SlicePlan(drains=(drain,)), 1, True, None, previous, DISRUPTED_AT
    )
    assert (now.disruption_reason, now.disrupted_at) == ("NodeFailure", DISRUPTED_AT)
