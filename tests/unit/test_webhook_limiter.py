"""Repeated warnings of the identity webhook: the cause-keyed limiter, turned by a hand clock,
and the admission answers and log lines it holds back."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.unit.test_identity import kuberay_pod, render_worker_template
from tpuslice.model import constants as c
from tpuslice.webhook import admission
from tpuslice.webhook.limiter import OVERFLOW_CAUSE, CauseLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_per_window_per_cause_and_the_held_back_count_said_next() -> None:
    clock = Clock()
    limiter = CauseLimiter(window_seconds=60, clock=clock)
    assert limiter.admit("a") == 0
    assert [limiter.admit("a") for _ in range(5)] == [None] * 5
    assert limiter.admit("b") == 0, "another cause has its own window"
    clock.now += 59.9
    assert limiter.admit("a") is None
    clock.now += 0.1
    assert limiter.admit("a") == 6, "the next window's first says how many were held back"
    assert limiter.admit("a") is None
    clock.now += 60
    assert limiter.admit("a") == 1
    clock.now += 60
    assert limiter.admit("a") == 0


def test_per_window_lets_that_many_through() -> None:
    limiter = CauseLimiter(window_seconds=10, per_window=3, clock=Clock())
    assert [limiter.admit("a") for _ in range(5)] == [0, 0, 0, None, None]


def test_causes_are_bounded_and_overflow_shares_one_window() -> None:
    clock = Clock()
    limiter = CauseLimiter(window_seconds=60, max_causes=3, clock=clock)
    assert [limiter.admit(n) for n in range(3)] == [0, 0, 0]
    # full: new causes share the overflow window, so a flood of distinct causes is one line
    assert [limiter.admit(n) for n in range(3, 100)] == [0] + [None] * 96
    assert len(limiter) == 4, "three causes and the overflow"
    assert limiter.admit(OVERFLOW_CAUSE) is None, "the flood's window is the overflow's"
    assert limiter.admit(1) is None, "a tracked cause keeps its own window"
    clock.now += 60
    # ended windows are forgotten to make room; the new cause is tracked again
    assert limiter.admit(500) == 0
    assert len(limiter) <= 4


@pytest.mark.parametrize("kwargs", [{"window_seconds": 0}, {"per_window": 0}, {"max_causes": 0}])
def test_limits_must_be_positive(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="window_seconds > 0"):
        CauseLimiter(**kwargs)


def _review(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "operation": "CREATE",
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "object": pod,
        },
    }


def _pods_with_kept_tpu_name(count: int) -> list[dict[str, Any]]:
    template, hosts = render_worker_template("v6e", "4x4", slices=2)
    template["spec"]["containers"][0]["env"] = [{"name": "TPU_NAME", "value": "mine"}]
    return [kuberay_pod(template, hosts, replica=i // hosts, host=i % hosts) for i in range(count)]


def test_a_clusters_pods_warn_once_per_window(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limiter = CauseLimiter(window_seconds=admission.WARNING_WINDOW_SECONDS, clock=clock)
    caplog.set_level(logging.WARNING, logger=admission.__name__)
    answers = [
        admission.admission_response(_review(pod), limiter=limiter)["response"]
        for pod in _pods_with_kept_tpu_name(8)
    ]
    assert all(a["allowed"] and "patch" in a for a in answers), "every pod is still mutated"
    assert [len(a.get("warnings", [])) for a in answers] == [1] + [0] * 7
    assert len(caplog.records) == 1 and "kept TPU_NAME" in caplog.records[0].getMessage()
    clock.now += admission.WARNING_WINDOW_SECONDS
    (later,) = _pods_with_kept_tpu_name(1)
    warnings = admission.admission_response(_review(later), limiter=limiter)["response"]["warnings"]
    assert warnings == [
        "tpuslice-identity: kept TPU_NAME as set in container 'ray-worker'; it differs from "
        "the value computed for this pod (7 more like this held back in the last 60 s)"
    ]
    # another RayCluster's pods are another cause
    (other,) = _pods_with_kept_tpu_name(1)
    other["metadata"]["labels"][c.KUBERAY_LABEL_CLUSTER] = "other"
    assert admission.admission_response(_review(other), limiter=limiter)["response"]["warnings"]


def test_refusals_are_always_answered_but_logged_once_per_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limiter = CauseLimiter(clock=Clock())
    caplog.set_level(logging.WARNING, logger=admission.__name__)
    pods = _pods_with_kept_tpu_name(5)
    for pod in pods:
        del pod["metadata"]["annotations"][c.ANNOTATION_SLICES]
    answers = [admission.admission_response(_review(p), limiter=limiter) for p in pods]
    assert all(a["response"]["status"]["code"] == 403 for a in answers)
    assert all(c.ANNOTATION_SLICES in a["response"]["status"]["message"] for a in answers)
    (record,) = caplog.records
    assert record.getMessage().startswith("refused pod ml/llm-tpu-worker-*: ")
