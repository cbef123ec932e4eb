"""Metric recording: each hook observes what docs/metrics.md says, once, into its own registry."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, cast

import pytest

from tests.support.builders import nodes_of
from tests.support.fake_kube import FakeKube
from tests.unit.test_reconcile import cluster_body, pods
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model import constants as c
from tpuslice.model.records import Snapshot
from tpuslice.render.identity import IdentityError, MutationResult
from tpuslice.runtime.kube import ApiError, Kube
from tpuslice.runtime.metrics import Metrics, parse_timestamp, serve, slice_last_created
from tpuslice.webhook import admission as webhook


def value(m: Metrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


def test_each_instance_has_its_own_registry() -> None:
    a, b = Metrics(), Metrics()
    a.api_request("GET", "pods")
    assert value(a, "tpuslice_api_requests_total", verb="GET", resource="pods") == 1
    assert value(b, "tpuslice_api_requests_total", verb="GET", resource="pods") == 0


def test_parse_timestamp() -> None:
    assert parse_timestamp("1970-01-01T00:00:10Z") == 10.0
    assert parse_timestamp("") is None
    assert parse_timestamp("yesterday") is None


def test_slice_last_created_takes_the_newest_pod_of_each_named_slice() -> None:
    stamps = ["2025-01-01T00:00:01Z", "2025-01-01T00:00:09Z", "", "2025-01-01T00:00:03Z"]
    infos = [replace(p, created=s) for p, s in zip(pods(), stamps, strict=True)]
    other = replace(infos[0], replica_name="tpu-other", created="2025-01-01T00:01:00Z")
    assert slice_last_created([*infos, other], {"tpu-aaaaa"}) == ["2025-01-01T00:00:09Z"]
    assert slice_last_created(infos, {"tpu-none"}) == []


def test_slices_gauge_is_replaced_per_cluster_and_forgotten() -> None:
    m = Metrics()
    m.cluster_slices(("TPUSliceCluster", "ns", "a"), ["Reserved", "Reserved"])
    m.cluster_slices(("TPUSliceCluster", "ns", "b"), ["Pending"])
    m.cluster_slices(("TPUSliceCluster", "ns", "a"), ["Ready", "Reserved"])
    assert value(m, "tpuslice_slices", state="Reserved") == 1
    assert value(m, "tpuslice_slices", state="Ready") == 1
    assert value(m, "tpuslice_slices", state="Pending") == 1
    m.forget_cluster(("TPUSliceCluster", "ns", "a"))
    m.forget_cluster(("TPUSliceCluster", "ns", "gone"))
    assert value(m, "tpuslice_slices", state="Reserved") == 0
    assert value(m, "tpuslice_slices", state="Ready") == 0
    assert value(m, "tpuslice_slices", state="Pending") == 1


def test_reservations_gauge_follows_phase_changes_and_deletes() -> None:
    m = Metrics()
    m.reservation_seen("pool-a", None)
    m.reservation_seen("pool-b", "Bound")
    m.reservation_seen("pool-a", "Bound")
    m.reservation_seen("pool-a", "Bound")  # a repeat of the same phase counts once
    assert value(m, "tpuslice_reservations", phase="Unset") == 0
    assert value(m, "tpuslice_reservations", phase="Bound") == 2
    m.reservation_gone("pool-a")
    m.reservation_gone("pool-never-seen")
    assert value(m, "tpuslice_reservations", phase="Bound") == 1


def test_api_writes_count_everything_but_get() -> None:
    m = Metrics()
    for verb in ("GET", "GET", "PATCH", "POST", "DELETE"):
        m.api_request(verb, "pods")
    assert m.api_writes() == 3


def test_reconcile_pass_records_result_creation_release_and_slices() -> None:
    m = Metrics()
    body = cluster_body()
    body["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z"
    workers = [replace(p, created="2025-01-01T00:00:02Z") for p in pods()]
    snap = Snapshot(body, workers, nodes_of("pool-a"), [], None)
    reconciler = Reconciler(FakeKube(), lambda key: snap, metrics=m)

    async def twice() -> None:
        await reconciler.kick(("TPUSliceCluster", "ml", "llm"))
        await reconciler.kick(("TPUSliceCluster", "ml", "llm"))

    asyncio.run(twice())
    assert value(m, "tpuslice_reconciles_total", result="success") == 2
    assert value(m, "tpuslice_reconcile_duration_seconds_count", result="success") == 2
    # the RayCluster was missing in both snapshots, but only the first apply created it
    assert value(m, "tpuslice_raycluster_creation_seconds_count") == 1
    assert value(m, "tpuslice_slice_release_seconds_count") >= 1
    created_to_release = value(m, "tpuslice_slice_release_seconds_sum")
    assert created_to_release > 0  # now - 2025-01-01T00:00:02Z
    assert value(m, "tpuslice_slices", state="Scheduled") == 1
    reconciler.forget(("TPUSliceCluster", "ml", "llm"))
    assert value(m, "tpuslice_slices", state="Scheduled") == 0


def test_failed_pass_counts_an_error() -> None:
    m = Metrics()

    def broken(key: Any) -> Snapshot:
        raise RuntimeError("index gone")

    async def once() -> None:
        reconciler = Reconciler(FakeKube(), broken, metrics=m)
        await reconciler.kick(("TPUSliceCluster", "ml", "llm"))
        for task in list(reconciler.queue._tasks):
            task.cancel()

    asyncio.run(once())
    assert value(m, "tpuslice_reconciles_total", result="error") == 1
    assert value(m, "tpuslice_errors_total", kind="reconcile") == 1


def test_kube_call_counts_requests_and_failures() -> None:
    m = Metrics()
    kube = Kube(api=None, executor=ThreadPoolExecutor(1), metrics=m)
    answers: list[Any] = [{"ok": True}, ApiError(404, "NotFound", "gone")]

    def fake_call(*_: Any) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    kube.request = fake_call  # type: ignore[method-assign]

    async def calls() -> None:
        await kube.call("PATCH", "/x", resource="pods")
        with pytest.raises(ApiError):
            await kube.call("GET", "/y", resource="slicereservations")

    asyncio.run(calls())
    assert value(m, "tpuslice_api_requests_total", verb="PATCH", resource="pods") == 1
    assert value(m, "tpuslice_api_requests_total", verb="GET", resource="slicereservations") == 1
    assert value(m, "tpuslice_errors_total", kind="api") == 1


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


@pytest.mark.parametrize(
    ("outcome", "result"),
    [("mutate", "mutated"), ("nothing", "unchanged"), ("refuse", "refused"), ("crash", "error")],
)
def test_webhook_latency_by_result(
    monkeypatch: pytest.MonkeyPatch, outcome: str, result: str
) -> None:
    pod = {"metadata": {"labels": {c.LABEL_CLUSTER: "llm"}}, "spec": {}}

    def fake_mutate(pod: dict[str, Any]) -> MutationResult:
        if outcome == "refuse":
            raise IdentityError("no")
        if outcome == "crash":
            raise KeyError("spec")
        if outcome == "nothing":  # e.g. reinvocation: identity found, already set
            return MutationResult(pod=pod, identity=cast(Any, object()))
        return MutationResult(pod={**pod, "spec": {"hostname": "h"}}, identity=cast(Any, object()))

    monkeypatch.setattr(webhook, "mutate_pod", fake_mutate)
    m = Metrics()
    with contextlib.suppress(KeyError):
        webhook.timed_admission_response(_review(pod), m)
    assert value(m, "tpuslice_webhook_admission_duration_seconds_count", result=result) == 1
    assert value(m, "tpuslice_errors_total", kind="webhook") == (result == "error")


def test_webhook_bad_review_is_not_an_admission() -> None:
    m = Metrics()
    with pytest.raises(webhook.BadReview):
        webhook.timed_admission_response({"kind": "Pod"}, m)
    assert (
        m.registry.get_sample_value(
            "tpuslice_webhook_admission_duration_seconds_count", {"result": "error"}
        )
        is None
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_serve_exports_the_registry_and_survives_a_taken_port() -> None:
    m = Metrics()
    m.api_request("PATCH", "pods")
    port = _free_port()
    assert serve(m, port, "127.0.0.1")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    assert 'tpuslice_api_requests_total{resource="pods",verb="PATCH"} 1.0' in text
    assert "python_gc" not in text  # only our registry, not the process-wide default one
    other = Metrics()
    assert not serve(other, port, "127.0.0.1")
    assert value(other, "tpuslice_errors_total", kind="metrics_server") == 1
