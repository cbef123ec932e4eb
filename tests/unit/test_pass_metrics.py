"""The process-wide metrics of passes of every kind: counted by (kind, namespace, name),
so objects of two kinds never overwrite each other's slices or queue places."""

from __future__ import annotations

from typing import Any

from tests.support.builders import nodes_of
from tests.support.fake_kube import FakeKube
from tests.unit.test_reconcile_owned import (
    JOB_UID,
    SVC_UID,
    job_body,
    owned,
    run,
    service_body,
    worker_pods,
)
from tpuslice.controller.job import JobKind
from tpuslice.controller.reconciler import Reconciler
from tpuslice.controller.service import ServiceKind
from tpuslice.model.records import Snapshot
from tpuslice.runtime.metrics import Metrics

SHAPE = "v6e 4x4"


def value(m: Metrics, name: str, **labels: str) -> float:
    got = m.registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def cluster_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "TPUSliceCluster",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "generation": 1},
        "spec": {
            "tpu": {"type": "v6e", "topology": "4x4", "slices": 1},
            "ray": {"version": "2.54.0"},
        },
    }


def job_snapshot(pools: tuple[str, ...]) -> Snapshot:
    pods = worker_pods("train", "TPUSliceJob", "att-0", "train-a")
    return Snapshot(
        job_body(), pods, nodes_of(*pools), [], None, owned=owned(JOB_UID, {"jobStatus": "RUNNING"})
    )


def cluster_snapshot(name: str, pools: tuple[str, ...]) -> Snapshot:
    pods = worker_pods(name, "TPUSliceCluster", f"{name}-0", name)
    return Snapshot(cluster_body(name), pods, nodes_of(*pools), [], None)


def service_snapshot(pools: tuple[str, ...]) -> Snapshot:
    pods = worker_pods("serve", "TPUSliceService", "new-0", "serve-a")
    return Snapshot(
        service_body(),
        pods,
        nodes_of(*pools),
        [],
        None,
        owned=owned(SVC_UID, {"pendingServiceStatus": {"rayClusterName": "serve-a"}}),
        rayclusters={"serve-a": {"state": None}},
    )


def test_the_queue_length_of_a_shape_counts_waiting_objects_of_every_kind() -> None:
    metrics = Metrics()
    clusters = Reconciler(FakeKube(), lambda key: cluster_snapshot("a", ()), metrics=metrics)
    jobs = Reconciler(FakeKube(), lambda key: job_snapshot(()), metrics=metrics, adapter=JobKind())
    services = Reconciler(
        FakeKube(), lambda key: service_snapshot(()), metrics=metrics, adapter=ServiceKind()
    )
    run(clusters, ("TPUSliceCluster", "ml", "a"))
    run(jobs, ("TPUSliceJob", "ml", "train"))
    run(services, ("TPUSliceService", "ml", "serve"))
    assert value(metrics, "tpuslice_queue_length", shape=SHAPE) == 3
    clusters.forget(("TPUSliceCluster", "ml", "a"))
    assert value(metrics, "tpuslice_queue_length", shape=SHAPE) == 2


def test_a_cluster_and_a_job_of_one_name_both_count_their_slices() -> None:
    metrics = Metrics()
    clusters = Reconciler(
        FakeKube(), lambda key: cluster_snapshot("train", ("pool-a",)), metrics=metrics
    )
    jobs = Reconciler(
        FakeKube(), lambda key: job_snapshot(("pool-b",)), metrics=metrics, adapter=JobKind()
    )
    run(clusters, ("TPUSliceCluster", "ml", "train"))
    run(jobs, ("TPUSliceJob", "ml", "train"))
    total = sum(
        value(metrics, "tpuslice_slices", state=state)
        for state in ("Pending", "WaitingForCapacity", "Reserved", "Scheduled", "Ready")
    )
    assert total == 2


def test_a_service_pass_reports_its_slices() -> None:
    metrics = Metrics()
    services = Reconciler(
        FakeKube(),
        lambda key: service_snapshot(("pool-a",)),
        metrics=metrics,
        adapter=ServiceKind(),
    )
    run(services, ("TPUSliceService", "ml", "serve"))
    total = sum(
        value(metrics, "tpuslice_slices", state=state)
        for state in ("Pending", "WaitingForCapacity", "Reserved", "Scheduled", "Ready")
    )
    assert total == 1
