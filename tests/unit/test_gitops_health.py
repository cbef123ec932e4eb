"""Argo CD's Lua health check and kstatus's rules on real TPUSliceCluster objects.

The fixtures are status objects captured from the e2e tier (tests/e2e/test_chart.py
writes them on every run, to <run dir>/gitops-status): the operator's own
output, not hand-written guesses. Variants derived from them cover what the
scenario does not reach (a spec change not yet observed, suspend, deletion).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.gitops import argocd_health, kstatus

FIXTURES = Path(__file__).parent / "fixtures" / "gitops"


def captured(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return obj


@pytest.mark.parametrize(
    ("name", "argocd", "kstatus_result"),
    [
        ("reconciling", "Progressing", "InProgress"),
        ("waiting-for-capacity", "Progressing", "InProgress"),
        ("ready", "Healthy", "Current"),
        ("stalled", "Degraded", "Failed"),
    ],
)
def test_captured_objects(name: str, argocd: str, kstatus_result: str) -> None:
    obj = captured(name)
    health = argocd_health(obj)
    assert health["status"] == argocd
    assert kstatus(obj) == kstatus_result
    ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] in health["message"]  # the user sees why


def test_messages_name_the_reason() -> None:
    assert argocd_health(captured("waiting-for-capacity"))["message"].startswith(
        "WaitingForCapacity: "
    )
    assert "InvalidSpec" in argocd_health(captured("stalled"))["message"]


def test_spec_change_not_yet_observed_is_progressing_even_if_ready() -> None:
    obj = copy.deepcopy(captured("ready"))
    obj["metadata"]["generation"] += 1
    assert argocd_health(obj)["status"] == "Progressing"
    assert kstatus(obj) == "InProgress"


def test_stale_stall_is_not_degraded() -> None:
    """A Stalled condition from an older generation says nothing about the new spec."""
    obj = copy.deepcopy(captured("stalled"))
    obj["metadata"]["generation"] += 1
    assert argocd_health(obj)["status"] == "Progressing"
    assert kstatus(obj) == "InProgress"


def test_no_status_yet() -> None:
    obj = {k: v for k, v in captured("ready").items() if k != "status"}
    assert argocd_health(obj)["status"] == "Progressing"
    assert kstatus(obj) == "Current"  # kstatus: no conditions at all reads as Current


def test_suspended() -> None:
    obj = copy.deepcopy(captured("ready"))
    for cond in obj["status"]["conditions"]:
        cond.update(status="False", reason="Suspended", message="spec.suspend is true")
    assert argocd_health(obj)["status"] == "Suspended"
    assert kstatus(obj) == "InProgress"


def test_deleting() -> None:
    obj = copy.deepcopy(captured("ready"))
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert kstatus(obj) == "Terminating"


# ------------------------------------------------- TPUSliceJob and TPUSliceService
# Their objects come from the pure status functions (job_status, service_status),
# the same code the reconcile will write them with; the e2e tier does not reach
# these kinds yet, so there are no captured fixtures for them.

JOB_LUA = FIXTURES.parents[3] / "docs" / "gitops" / "argocd-health-tpuslicejob.lua"
SERVICE_LUA = FIXTURES.parents[3] / "docs" / "gitops" / "argocd-health-tpusliceservice.lua"


def _job_object(
    deployment: str, job: str = "", suspend: bool = False, **extra: Any
) -> dict[str, Any]:
    from tests.unit.test_job_status import READY, as_object, observed, ray_status
    from tpuslice.status.job import compute_job_status

    ray = ray_status(deployment, job, **extra) if deployment != "-" else None
    cluster = READY if deployment in ("Initializing", "Running") else None
    status = compute_job_status(
        observed(ray, cluster, suspend=suspend), None, "2026-12-01T00:00:00Z"
    )
    return as_object(status)


@pytest.mark.parametrize(
    ("deployment", "job", "extra", "argocd", "fragment"),
    [
        ("-", "", {}, "Progressing", "Pending"),
        ("Initializing", "", {}, "Progressing", "Initializing"),
        ("Running", "RUNNING", {}, "Progressing", "Running"),
        ("Retrying", "FAILED", {"failed": 1}, "Progressing", "Retrying"),
        ("Complete", "SUCCEEDED", {"succeeded": 1}, "Healthy", "JobSucceeded"),
        ("Complete", "STOPPED", {}, "Degraded", "JobStopped"),
        ("Failed", "FAILED", {"failed": 2, "reason": "AppFailed"}, "Degraded", "AppFailed"),
        ("ValidationFailed", "", {"message": "bad"}, "Degraded", "RayJobValidationFailed"),
        ("Suspended", "", {"suspend": True}, "Suspended", "Suspended"),
    ],
)
def test_job_health(
    deployment: str, job: str, extra: dict[str, Any], argocd: str, fragment: str
) -> None:
    suspend = bool(extra.pop("suspend", False))
    obj = _job_object(deployment, job, suspend, **extra)
    health = argocd_health(obj, JOB_LUA)
    assert health["status"] == argocd
    assert health["message"].startswith(fragment)


def test_job_health_waits_for_the_current_generation() -> None:
    obj = _job_object("Complete", "SUCCEEDED", succeeded=1)
    obj["metadata"]["generation"] += 1
    assert argocd_health(obj, JOB_LUA)["status"] == "Progressing"
    assert argocd_health({"metadata": {"generation": 1}}, JOB_LUA)["status"] == "Progressing"


def _service_object(name: str) -> dict[str, Any]:
    from tests.unit.test_service_status import CASES, as_object
    from tpuslice.status.service import compute_service_status

    obs = next(case[1] for case in CASES if case[0] == name)
    return as_object(compute_service_status(obs, None, "2026-12-01T00:00:00Z"))


@pytest.mark.parametrize(
    ("case", "argocd", "fragment"),
    [
        ("no RayService yet", "Progressing", "Pending"),
        ("first cluster waiting for capacity", "Progressing", "WaitingForCapacity"),
        ("serving, every slice ready", "Healthy", "Serving"),
        ("serving but a slice is being recreated", "Progressing", "Scheduled"),
        ("upgrade waiting for capacity, active keeps serving", "Healthy", "Serving"),
        ("KubeRay gave up initializing", "Degraded", "RayServiceInitializingTimeout"),
    ],
)
def test_service_health(case: str, argocd: str, fragment: str) -> None:
    health = argocd_health(_service_object(case), SERVICE_LUA)
    assert health["status"] == argocd
    assert health["message"].startswith(fragment)


def test_service_health_says_an_upgrade_waits_for_capacity() -> None:
    health = argocd_health(
        _service_object("upgrade waiting for capacity, active keeps serving"), SERVICE_LUA
    )
    assert "UpgradeWaitingForCapacity" in health["message"]
    obj = _service_object("serving, every slice ready")
    obj["metadata"]["generation"] += 1
    assert argocd_health(obj, SERVICE_LUA)["status"] == "Progressing"
