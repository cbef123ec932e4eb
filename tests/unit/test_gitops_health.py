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
