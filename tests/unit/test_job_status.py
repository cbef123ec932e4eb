"""TPUSliceJob status from every RayJob state KubeRay 1.5 reports (rayjob_types.go),
terminal ones and retries included, and what kstatus and `kubectl wait` make of it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.support.crd import validate
from tests.support.gitops import kstatus
from tpuslice.model.records import SliceState, SliceStatus
from tpuslice.status.conditions import ClusterSlices, Stall
from tpuslice.status.job import JobObserved, attempts, compute_job_status

NOW = "2026-12-01T00:00:00Z"
READY = [SliceStatus(i, SliceState.READY, f"tpu-{i}", f"pool-{i}", 4) for i in range(2)]
WAITING = [
    SliceStatus(0, SliceState.READY, "tpu-a", "pool-a", 4),
    SliceStatus(1, SliceState.WAITING_FOR_CAPACITY, "tpu-b", None, 0, "needs a free pool"),
]


def observed(
    ray: dict[str, Any] | None,
    slices: list[SliceStatus] | None = None,
    *,
    suspend: bool = False,
    stall: Stall | None = None,
) -> JobObserved:
    cluster = None
    if slices is not None:
        cluster = ClusterSlices("train-x7k2p", 2, slices, ray_cluster_ready=slices == READY)
    return JobObserved(
        generation=2,
        accelerator_type="v6e-16",
        hosts_per_slice=4,
        chips_per_host=4,
        ray_job="train",
        desired_slices=2,
        ray_job_status=ray,
        cluster=cluster,
        suspend=suspend,
        gated=True,
        applied=True,
        stall=stall,
    )


def ray_status(deployment: str, job: str = "", **extra: Any) -> dict[str, Any]:
    return {
        "jobDeploymentStatus": deployment,
        "jobStatus": job,
        "rayClusterName": "train-x7k2p",
        "jobId": "train-abc",
        "startTime": "2026-11-30T00:00:00Z",
        **extra,
    }


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def as_object(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "TPUSliceJob",
        "metadata": {"name": "train", "namespace": "ml", "generation": 2},
        "spec": {
            "tpu": {"type": "v6e", "topology": "4x4", "slices": 2},
            "ray": {"version": "2.54.0"},
            "job": {"entrypoint": "python train.py"},
        },
        "status": status,
    }


# (case, RayJob status or None, slices, suspend) -> (Reconciling, Stalled, Complete, Failed,
# Suspended, reason, kstatus)
CASES: list[tuple[str, dict[str, Any] | None, list[SliceStatus] | None, bool, tuple[Any, ...]]] = [
    ("no RayJob yet", None, None, False, (True, False, False, False, False, "Pending")),
    ("New", ray_status(""), None, False, (True, False, False, False, False, "Pending")),
    (
        "Initializing, no cluster yet",
        ray_status("Initializing"),
        None,
        False,
        (True, False, False, False, False, "Initializing"),
    ),
    (
        "Initializing, waiting for capacity",
        ray_status("Initializing"),
        WAITING,
        False,
        (True, False, False, False, False, "WaitingForCapacity"),
    ),
    (
        "Initializing, slices ready",
        ray_status("Initializing"),
        READY,
        False,
        (True, False, False, False, False, "Initializing"),
    ),
    (
        "Running PENDING",
        ray_status("Running", "PENDING"),
        READY,
        False,
        (True, False, False, False, False, "Running"),
    ),
    (
        "Running RUNNING",
        ray_status("Running", "RUNNING"),
        READY,
        False,
        (True, False, False, False, False, "Running"),
    ),
    (
        "Running, a slice lost its pool",
        ray_status("Running", "RUNNING"),
        WAITING,
        False,
        (True, False, False, False, False, "WaitingForCapacity"),
    ),
    (
        "Waiting (InteractiveMode)",
        ray_status("Waiting"),
        READY,
        False,
        (False, False, False, False, False, "WaitingForSubmission"),
    ),
    (
        "Retrying after a failed attempt",
        ray_status("Retrying", "FAILED", failed=1, reason="AppFailed", message="exit 1"),
        None,
        False,
        (True, False, False, False, False, "Retrying"),
    ),
    (
        "New again after retrying",
        ray_status("", failed=1),
        None,
        False,
        (True, False, False, False, False, "Pending"),
    ),
    (
        "Complete SUCCEEDED",
        ray_status("Complete", "SUCCEEDED", succeeded=1, failed=1, endTime="2026-12-01T00:00:00Z"),
        None,
        False,
        (False, False, True, False, False, "JobSucceeded"),
    ),
    (
        "Complete STOPPED",
        ray_status("Complete", "STOPPED"),
        None,
        False,
        (False, True, False, True, False, "JobStopped"),
    ),
    (
        "Failed, retries exhausted",
        ray_status("Failed", "FAILED", failed=3, reason="AppFailed", message="exit 1"),
        None,
        False,
        (False, True, False, True, False, "AppFailed"),
    ),
    (
        "Failed, deadline",
        ray_status("Failed", "RUNNING", failed=1, reason="DeadlineExceeded"),
        READY,
        False,
        (False, True, False, True, False, "DeadlineExceeded"),
    ),
    (
        "Failed, submission",
        ray_status("Failed", "", failed=1, reason="SubmissionFailed"),
        None,
        False,
        (False, True, False, True, False, "SubmissionFailed"),
    ),
    (
        "ValidationFailed",
        ray_status("ValidationFailed", reason="ValidationFailed", message="bad spec"),
        None,
        False,
        (False, True, False, True, False, "RayJobValidationFailed"),
    ),
    (
        "Suspending",
        ray_status("Suspending"),
        READY,
        True,
        (True, False, False, False, False, "Suspending"),
    ),
    (
        "suspend asked, KubeRay not there yet",
        ray_status("Running", "RUNNING"),
        READY,
        True,
        (True, False, False, False, False, "Suspending"),
    ),
    (
        "Suspended",
        ray_status("Suspended"),
        None,
        True,
        (False, False, False, False, True, "Suspended"),
    ),
    (
        "Suspended, resume asked",
        ray_status("Suspended"),
        None,
        False,
        (True, False, False, False, False, "Resuming"),
    ),
    (
        "a deployment status a newer KubeRay added",
        ray_status("Scheduling"),
        READY,
        False,
        (True, False, False, False, False, "Reconciling"),
    ),
]


@pytest.mark.parametrize(
    ("ray", "slices", "suspend", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_every_rayjob_state(
    ray: dict[str, Any] | None,
    slices: list[SliceStatus] | None,
    suspend: bool,
    expected: tuple[Any, ...],
) -> None:
    status = compute_job_status(observed(ray, slices, suspend=suspend), None, NOW)
    got = conditions(status)
    names = ("Reconciling", "Stalled", "Complete", "Failed", "Suspended")
    for name, want in zip(names, expected[:5], strict=True):
        assert got[name][0] == ("True" if want else "False"), (name, got)
    true = [name for name, want in zip(names, expected[:5], strict=True) if want]
    reason_of = got[true[0]][1] if true else got["Reconciling"][1]
    assert reason_of == expected[5]
    assert validate("tpuslice.dev_tpuslicejobs.yaml", as_object(status)) == []


def test_kubectl_wait_and_kstatus_read_the_end() -> None:
    done = compute_job_status(
        observed(ray_status("Complete", "SUCCEEDED", succeeded=1), None), None, NOW
    )
    assert conditions(done)["Complete"] == ("True", "JobSucceeded")
    assert kstatus(as_object(done)) == "Current"
    failed = compute_job_status(
        observed(ray_status("Failed", "FAILED", failed=1, reason="AppFailed"), None), None, NOW
    )
    assert kstatus(as_object(failed)) == "Failed"
    running = compute_job_status(observed(ray_status("Running", "RUNNING"), READY), None, NOW)
    assert kstatus(as_object(running)) == "InProgress"


@pytest.mark.parametrize(
    ("ray", "expected"),
    [
        (None, 0),
        (ray_status(""), 0),
        (ray_status("Initializing"), 1),
        (ray_status("Running", "RUNNING"), 1),
        (ray_status("Retrying", failed=1), 1),
        (ray_status("", failed=1), 1),
        (ray_status("Initializing", failed=1), 2),
        (ray_status("Running", "RUNNING", failed=2), 3),
        (ray_status("Complete", "SUCCEEDED", succeeded=1, failed=2), 3),
        (ray_status("Complete", "STOPPED", failed=1), 2),
        (ray_status("Failed", "FAILED", failed=3), 3),
        (ray_status("ValidationFailed"), 0),
    ],
)
def test_attempts_count_retries(ray: dict[str, Any] | None, expected: int) -> None:
    assert attempts(ray) == expected


def test_status_carries_the_rayjob_fields_and_the_slices() -> None:
    ray = ray_status("Running", "RUNNING", failed=1, endTime=None)
    status = compute_job_status(observed(ray, WAITING), None, NOW)
    assert status["rayJob"] == "train" and status["rayCluster"] == "train-x7k2p"
    assert (status["jobStatus"], status["jobDeploymentStatus"]) == ("RUNNING", "Running")
    assert status["jobId"] == "train-abc" and status["startTime"] == "2026-11-30T00:00:00Z"
    assert "endTime" not in status
    assert (status["attempts"], status["failed"], status["succeeded"]) == (2, 1, 0)
    assert (status["readySlices"], status["desiredSlices"], status["sliceReadiness"]) == (
        1,
        2,
        "1/2",
    )
    assert [s["state"] for s in status["slices"]] == ["Ready", "WaitingForCapacity"]
    assert conditions(status)["SlicesReserved"] == ("False", "SlicesUnreserved")
    message = next(c for c in status["conditions"] if c["type"] == "Reconciling")["message"]
    assert "attempt 2" in message and "1 of 2 slices WaitingForCapacity" in message


def test_a_finished_job_desires_no_slices_and_reports_no_reservation() -> None:
    status = compute_job_status(
        observed(ray_status("Complete", "SUCCEEDED", succeeded=1), None), None, NOW
    )
    assert (status["desiredSlices"], status["sliceReadiness"], status["slices"]) == (0, "0/0", [])
    assert "SlicesReserved" not in conditions(status)


def test_retry_message_says_the_pools_are_kept() -> None:
    ray = ray_status("Retrying", "FAILED", failed=1, reason="AppFailed", message="exit 1")
    status = compute_job_status(observed(ray, None), None, NOW)
    message = next(c for c in status["conditions"] if c["type"] == "Reconciling")["message"]
    assert message.startswith("attempt 1 failed (AppFailed: exit 1); KubeRay starts attempt 2")
    assert "node pools the job holds" in message


def test_stall_wins_and_observed_generation_follows_the_kstatus_rules() -> None:
    stalled = compute_job_status(
        observed(None, stall=Stall("InvalidSpec", "spec.job.entrypoint: is required")),
        {"observedGeneration": 1},
        NOW,
    )
    assert conditions(stalled)["Stalled"] == ("True", "InvalidSpec")
    assert stalled["observedGeneration"] == 2
    pending = dataclasses.replace(observed(None), applied=False)
    assert compute_job_status(pending, {"observedGeneration": 1}, NOW)["observedGeneration"] == 1
    assert "observedGeneration" not in compute_job_status(pending, None, NOW)


def test_identical_input_identical_output_and_transition_times_kept() -> None:
    first = compute_job_status(observed(ray_status("Running", "RUNNING"), READY), None, NOW)
    again = compute_job_status(
        observed(ray_status("Running", "RUNNING"), READY), first, "2026-12-02T00:00:00Z"
    )
    assert again == first
    done = compute_job_status(
        observed(ray_status("Complete", "SUCCEEDED", succeeded=1), None),
        first,
        "2026-12-03T00:00:00Z",
    )
    times = {c["type"]: c["lastTransitionTime"] for c in done["conditions"]}
    assert times["Complete"] == "2026-12-03T00:00:00Z"  # flipped
    assert times["Failed"] == NOW  # stayed False
