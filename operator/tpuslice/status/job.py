"""Status of a TPUSliceJob, computed purely from its RayJob's status and its slices.

KubeRay's RayJob reports two state machines (rayjob_types.go, KubeRay 1.5):
``jobStatus`` is the Ray job's own (``""``, PENDING, RUNNING, STOPPED,
SUCCEEDED, FAILED) and ``jobDeploymentStatus`` KubeRay's around it (``""``/New,
Initializing, Waiting, Running, Retrying, Suspending, Suspended, Complete,
Failed, ValidationFailed). A TPUSliceJob turns them into conditions tools
already read:

- ``Reconciling`` / ``Stalled`` in kstatus convention (Flux, Argo CD,
  ``kubectl wait``): Reconciling while the job is on its way (waiting for
  capacity, starting, running, retrying); Stalled when it ended badly or cannot
  go on without someone's change;
- ``Complete`` / ``Failed`` as a Kubernetes Job has them, so
  ``kubectl wait --for=condition=Complete`` waits for success. KubeRay's
  deployment status ``Complete`` also covers a job someone stopped (jobStatus
  STOPPED); that is not a success here: Failed, reason JobStopped. KubeRay
  moves a failed attempt that may retry straight to Retrying, so a
  ``Failed`` deployment status is final;
- ``Suspended`` as a Kubernetes Job has it;
- ``SlicesReserved`` while the job's current RayCluster has slices.

An attempt KubeRay fails (Retrying, or Failed after the last one) within
``DISRUPTED_WITHIN_SECONDS`` of a disruption of the job's slices (a slice drained
whole, or replaced for revoked capacity: planning/accounting.py) gets the reason
``Disrupted`` instead of KubeRay's, its message naming the disruption, so a user tells
a preemption from a crash. KubeRay counts it in ``backoffLimit`` all the same.

Every condition carries the generation it was computed for; the caller writes
the result only when it differs (as for a TPUSliceCluster, status.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuslice.model.convert import timestamp
from tpuslice.status.conditions import (
    RECONCILING,
    STALLED,
    ClusterSlices,
    ObservedObject,
    condition,
    kueue_condition,
    merge_conditions,
    slices_reserved_condition,
    status_head,
    waiting_message,
)

__all__ = [
    "COMPLETE",
    "DISRUPTED",
    "DISRUPTED_WITHIN_SECONDS",
    "FAILED",
    "SUSPENDED",
    "JobObserved",
    "attempts",
    "compute_job_status",
    "job_conditions",
    "job_ended",
]

COMPLETE = "Complete"
FAILED = "Failed"
SUSPENDED = "Suspended"

#: The reason of an attempt that failed because its slices were disrupted.
DISRUPTED = "Disrupted"
#: How long after a disruption of its slices an attempt's failure is put down to it.
#: The chain from the drain to KubeRay's verdict: the pods' grace period (default 30 s),
#: Ray noticing its workers gone (GCS health checks, tens of seconds), Ray Train
#: restarting on what is left until its ``max_failures`` or its preemption budget runs
#: out, and KubeRay's poll of the Ray job. A few minutes in all; 10 minutes leaves a wide
#: margin, while a job that ran 10 minutes on its replacement slices failed on its own.
DISRUPTED_WITHIN_SECONDS = 600
#: A failure seen up to this long before the disruption is recorded still counts: Ray
#: may notice a dead host before its node turns NotReady (about 40 s) and the slice is
#: drained.
DISRUPTED_BEFORE_SECONDS = 120

#: KubeRay's deployment statuses in which an attempt is under way.
_ATTEMPT_UNDER_WAY = frozenset({"Initializing", "Waiting", "Running"})


@dataclass(frozen=True, kw_only=True)
class JobObserved(ObservedObject):
    """Everything a TPUSliceJob's status depends on."""

    ray_job: str  # the RayJob's name (the TPUSliceJob's)
    #: The RayJob's ``status`` stanza; None while there is no RayJob yet.
    ray_job_status: Mapping[str, Any] | None
    #: The current attempt's RayCluster (``status.rayClusterName``) and its slices;
    #: None while KubeRay has not made it (or has deleted it after the job ended).
    cluster: ClusterSlices | None
    suspend: bool  # spec.job.suspend
    #: The latest disruption of the job's slices (``status.disruptions``: reason and
    #: RFC 3339 time; this pass's drains included); empty when none.
    disruption_reason: str = ""
    disrupted_at: str = ""
    #: The pass's clock (RFC 3339): when a failure without KubeRay's ``endTime`` was seen.
    now: str = ""


def _count(status: Mapping[str, Any], key: str) -> int:
    value = status.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def attempts(ray_job_status: Mapping[str, Any] | None) -> int:
    """Attempts started so far. KubeRay counts finished attempts (``failed``,
    ``succeeded``); the one under way, and a stopped one (counted in neither), are
    added here."""
    status = ray_job_status or {}
    finished = _count(status, "failed") + _count(status, "succeeded")
    deployment = status.get("jobDeploymentStatus") or ""
    if deployment in _ATTEMPT_UNDER_WAY:
        return finished + 1
    if deployment == "Complete" and status.get("jobStatus") != "SUCCEEDED":
        return finished + 1  # stopped: KubeRay counts it neither way
    return finished


#: KubeRay's deployment statuses after which the RayJob never starts another attempt.
_ENDED = frozenset({"Complete", "Failed", "ValidationFailed"})


def job_ended(ray_job_status: Mapping[str, Any] | None) -> bool:
    """True once KubeRay has finished with the job (succeeded, stopped, failed after its
    last retry, or refused): it wants no more slices."""
    return (ray_job_status or {}).get("jobDeploymentStatus") in _ENDED


@dataclass(frozen=True)
class _Verdict:
    reason: str
    message: str
    reconciling: bool = False
    stalled: bool = False
    complete: bool = False
    failed: bool = False
    suspended: bool = False
    terminal: bool = False  # the job is over: no SlicesReserved, no slices desired


def _kuberay_detail(status: Mapping[str, Any]) -> str:
    reason, message = status.get("reason") or "", status.get("message") or ""
    if reason and message:
        return f"{reason}: {message}"
    return reason or message


def _disruption(observed: JobObserved, status: Mapping[str, Any], ended: bool) -> str:
    """``Preemption at 2026-12-03T12:00:00Z`` when the failed attempt's failure (KubeRay's
    ``endTime`` of a job that ended, else the pass's clock) falls within the bounds of
    the latest disruption of the job's slices; "" otherwise."""
    at = timestamp(observed.disrupted_at)
    failed = timestamp(status.get("endTime")) if ended else None
    failed = failed or timestamp(observed.now)
    if at is None or failed is None:
        return ""
    after = (failed - at).total_seconds()
    if not -DISRUPTED_BEFORE_SECONDS <= after <= DISRUPTED_WITHIN_SECONDS:
        return ""
    return f"{observed.disruption_reason or 'a disruption'} at {observed.disrupted_at}"


def _running(observed: JobObserved, status: Mapping[str, Any], deployment: str) -> _Verdict:
    """Initializing, Running, or a deployment status this version does not know (a newer
    KubeRay's): the job is on its way; the slices say what it waits for."""
    cluster = observed.cluster
    number = attempts(status)
    if cluster is not None and (blocked := cluster.blocked()) is not None:
        state, detail = blocked
        return _Verdict(state, f"attempt {number}, RayCluster {cluster.name}: {detail}", True)
    if deployment == "Initializing" or cluster is None:
        where = f"RayCluster {cluster.name}" if cluster else "its RayCluster"
        return _Verdict(
            "Initializing", f"attempt {number}: KubeRay is starting the job on {where}", True
        )
    if deployment != "Running":
        return _Verdict(
            "Reconciling", f"attempt {number}: RayJob deployment status {deployment}", True
        )
    job = status.get("jobId") or "the job"
    state = status.get("jobStatus") or "submitted"
    slices = f"{cluster.ready_slices}/{cluster.desired_slices} slices ready"
    return _Verdict("Running", f"attempt {number}: {job} {state} on {cluster.name}, {slices}", True)


def _verdict(observed: JobObserved) -> _Verdict:
    if observed.stall is not None:
        return _Verdict(observed.stall.reason, observed.stall.message, stalled=True)
    status = observed.ray_job_status
    kueue = observed.kueue
    ended = (status or {}).get("jobDeploymentStatus") in _ENDED
    if kueue is not None and not kueue.admitted and not observed.suspend and not ended:
        return _Verdict("AwaitingAdmission", waiting_message(kueue), True)
    if status is None:
        return _Verdict("Pending", f"RayJob {observed.ray_job} is not created yet", True)
    deployment = status.get("jobDeploymentStatus") or ""
    job_status = status.get("jobStatus") or ""
    detail = _kuberay_detail(status)
    number = attempts(status)
    after = f"after {number} attempt{'s' * (number != 1)}"
    if deployment == "Complete" and job_status == "SUCCEEDED":
        return _Verdict("JobSucceeded", f"the job succeeded {after}", complete=True, terminal=True)
    if deployment == "Complete":
        what = "was stopped" if job_status == "STOPPED" else f"ended {job_status or 'unknown'}"
        return _Verdict(
            "JobStopped" if job_status == "STOPPED" else "JobEnded",
            f"the job {what} {after}" + (f" ({detail})" if detail else ""),
            stalled=True,
            failed=True,
            terminal=True,
        )
    if deployment == "Failed":
        disrupted = _disruption(observed, status, ended=True)
        return _Verdict(
            DISRUPTED if disrupted else str(status.get("reason") or "JobFailed"),
            f"the job failed {after}"
            + (f" just after a disruption of its slices ({disrupted})" if disrupted else "")
            + (f": {detail}" if detail else ""),
            stalled=True,
            failed=True,
            terminal=True,
        )
    if deployment == "ValidationFailed":
        return _Verdict(
            "RayJobValidationFailed",
            f"KubeRay refused the RayJob ({detail or 'no detail given'}); KubeRay does not "
            f"look at it again: fix the spec, then delete and re-create the TPUSliceJob",
            stalled=True,
            failed=True,
            terminal=True,
        )
    if deployment == "Suspended":
        if observed.suspend:
            return _Verdict("Suspended", "spec.job.suspend is true", suspended=True, terminal=True)
        return _Verdict("Resuming", "spec.job.suspend is false; KubeRay starts the job again", True)
    if deployment == "Suspending" or observed.suspend:
        return _Verdict(
            "Suspending", "KubeRay is deleting the job's RayCluster; its node pools follow", True
        )
    if deployment == "Retrying":
        disrupted = _disruption(observed, status, ended=False)
        return _Verdict(
            DISRUPTED if disrupted else "Retrying",
            f"attempt {number} failed"
            + (f" just after a disruption of its slices ({disrupted})" if disrupted else "")
            + (f" ({detail})" if detail else "")
            + f"; KubeRay starts attempt {number + 1} on a new RayCluster, which gets the "
            f"node pools the job holds",
            True,
        )
    if deployment == "Waiting":
        cluster = observed.cluster.name if observed.cluster else "the job's RayCluster"
        return _Verdict(
            "WaitingForSubmission",
            f"submissionMode InteractiveMode: submit the job to {cluster} and set spec.job.jobId",
        )
    if deployment == "":
        return _Verdict("Pending", "KubeRay has not started the RayJob yet", True)
    return _running(observed, status, deployment)


def job_conditions(observed: JobObserved) -> list[dict[str, Any]]:
    """Conditions without timestamps; merge_conditions adds lastTransitionTime."""
    verdict = _verdict(observed)
    gen = observed.generation
    reason, message = verdict.reason, verdict.message
    conditions = [
        condition(
            RECONCILING,
            verdict.reconciling,
            reason,
            message if verdict.reconciling else "not in progress",
            gen,
        ),
        condition(STALLED, verdict.stalled, reason, message if verdict.stalled else "", gen),
        condition(COMPLETE, verdict.complete, reason, message if verdict.complete else "", gen),
        condition(FAILED, verdict.failed, reason, message if verdict.failed else "", gen),
        condition(
            SUSPENDED,
            verdict.suspended,
            reason,
            message if verdict.suspended else "spec.job.suspend is false",
            gen,
        ),
    ]
    cluster = observed.cluster
    if observed.gated and cluster is not None and not verdict.terminal and not verdict.stalled:
        conditions.append(slices_reserved_condition(cluster.slices, gen))
    if cluster is not None and not verdict.terminal and not verdict.stalled:
        conditions += cluster.elastic_conditions(gen)
    if observed.kueue is not None:
        conditions.append(kueue_condition(observed.kueue, gen))
    return conditions


def compute_job_status(
    observed: JobObserved, previous: Mapping[str, Any] | None, now: str
) -> dict[str, Any]:
    """The whole status stanza of a TPUSliceJob; identical input gives identical output."""
    previous = previous or {}
    verdict = _verdict(observed)
    ray = observed.ray_job_status or {}
    status = status_head(previous, observed)
    status["rayJob"] = observed.ray_job
    cluster_name = ray.get("rayClusterName") or (observed.cluster.name if observed.cluster else "")
    if cluster_name:
        status["rayCluster"] = cluster_name
    if observed.cluster is not None:
        status.update(observed.cluster.to_status())
    else:
        desired = 0 if verdict.terminal else observed.desired_slices
        status.update(ClusterSlices("", desired, (), ray_cluster_ready=False).to_status())
    for key, field in (
        ("jobId", "jobId"),
        ("jobStatus", "jobStatus"),
        ("jobDeploymentStatus", "jobDeploymentStatus"),
        ("reason", "jobReason"),
        ("startTime", "startTime"),
        ("endTime", "endTime"),
    ):
        if ray.get(key):
            status[field] = ray[key]
    status["attempts"] = attempts(ray)
    status["succeeded"] = _count(ray, "succeeded")
    status["failed"] = _count(ray, "failed")
    status["conditions"] = merge_conditions(
        previous.get("conditions") or [], job_conditions(observed), now
    )
    return status
