"""A real Kueue in the local cluster: a queue-labelled RayCluster is suspended at create
and admitted (unsuspended) when the ClusterQueue's TPU quota allows.

This module starts its own cluster with ``ClusterSettings(kueue=True)`` (the session
cluster has no Kueue) and runs first on its worker (conftest orders it), so it stops
before that worker's session cluster starts. No operator: this checks the harness and
Kueue alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import E2ECluster, multihost_raycluster
from tpusim import ClusterSettings, CPUPool, LocalCluster, ToolPaths, TPUPool, kube
from tpusim.kueue import QUEUE_LABEL, create_queues, pool_tpu_chips

REPO = Path(__file__).resolve().parents[2]
POOLS = (TPUPool("v6e-4x4-kueue", "v6e", "4x4", nodes=4), CPUPool("cpu-kueue", nodes=1))
NAMESPACE = "kueue-e2e"


@pytest.fixture(scope="module")
def kueue_cluster() -> Iterator[E2ECluster]:
    run_dir = REPO / ".e2e-runs" / datetime.now().strftime("kueue-%Y%m%d-%H%M%S-%f")
    local = LocalCluster(
        ClusterSettings(tools=ToolPaths.for_repo(REPO), run_dir=run_dir, kueue=True)
    )
    began = time.monotonic()
    try:
        local.start()
        local.add_pools(POOLS)
        kube.core_v1(local.api).create_namespace({"metadata": {"name": NAMESPACE}})
        create_queues(local.api, namespaces=[NAMESPACE], tpu_chips=pool_tpu_chips(POOLS))
    except BaseException:
        local.stop()
        raise
    startup = {
        **local.report.steps,
        "total_with_pools_and_queues": round(time.monotonic() - began, 2),
    }
    (run_dir / "startup.json").write_text(json.dumps(startup, indent=2) + "\n")
    try:
        yield E2ECluster(kubeconfig=local.kubeconfig, api=local.api, run_dir=run_dir)
    finally:
        local.stop()


def _raycluster(cluster: E2ECluster, name: str) -> dict[str, Any]:
    result: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
        "ray.io", "v1", NAMESPACE, "rayclusters", name
    )
    return result


def _workload(cluster: E2ECluster, owner: str) -> dict[str, Any] | None:
    """The Workload Kueue made for RayCluster ``owner`` (matched by owner reference)."""
    items = cluster.custom.list_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", NAMESPACE, "workloads"
    )["items"]
    for item in items:
        refs = item["metadata"].get("ownerReferences") or []
        if any(r["kind"] == "RayCluster" and r["name"] == owner for r in refs):
            return dict(item)
    return None


def _condition(workload: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for cond in (workload or {}).get("status", {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


def _queued(name: str) -> dict[str, Any]:
    body = multihost_raycluster(name, replicas=1)  # 4 hosts x 4 chips: the whole pool
    body["metadata"]["labels"] = {QUEUE_LABEL: "tpu"}
    return body


def test_kueue_suspends_at_create_and_admits_when_quota_allows(kueue_cluster: E2ECluster) -> None:
    cluster = kueue_cluster
    custom = cluster.custom
    timings: dict[str, float] = {}
    began = time.monotonic()

    custom.create_namespaced_custom_object("ray.io", "v1", NAMESPACE, "rayclusters", _queued("a"))
    # The webhook suspended it inside the create request: the stored object says so.
    assert _raycluster(cluster, "a")["spec"].get("suspend") is True

    def admitted(name: str) -> bool:
        return _raycluster(cluster, name)["spec"].get("suspend") is False and (
            _condition(_workload(cluster, name), "Admitted").get("status") == "True"
        )

    kube.wait_for(
        lambda: admitted("a"),
        timeout_s=60,
        what="RayCluster a admitted and unsuspended by Kueue",
        describe=lambda: _workload(cluster, "a"),
    )
    timings["a_admitted"] = round(time.monotonic() - began, 2)
    # KubeRay acts on the unsuspended cluster: its worker pods appear.
    kube.wait_for(
        lambda: (
            len(
                cluster.core.list_namespaced_pod(
                    NAMESPACE, label_selector="ray.io/cluster=a,ray.io/node-type=worker"
                ).items
            )
            == 4
        ),
        timeout_s=60,
        what="4 worker pods of RayCluster a",
    )

    custom.create_namespaced_custom_object("ray.io", "v1", NAMESPACE, "rayclusters", _queued("b"))

    def pending_for_tpu_quota() -> bool:
        # v0.17.0 says "couldn't assign flavors to pod set tpu: insufficient unused
        # quota for google.com/tpu in flavor tpu, 16 more needed".
        reserved = _condition(_workload(cluster, "b"), "QuotaReserved")
        message = reserved.get("message", "")
        return reserved.get("reason") == "Pending" and "quota for google.com/tpu" in message

    kube.wait_for(
        pending_for_tpu_quota,
        timeout_s=60,
        what="RayCluster b's Workload pending for quota",
        describe=lambda: _workload(cluster, "b"),
    )
    assert _raycluster(cluster, "b")["spec"].get("suspend") is True
    assert not cluster.core.list_namespaced_pod(NAMESPACE, label_selector="ray.io/cluster=b").items

    mark = time.monotonic()
    custom.delete_namespaced_custom_object("ray.io", "v1", NAMESPACE, "rayclusters", "a")
    kube.wait_for(
        lambda: admitted("b"),
        timeout_s=60,
        what="RayCluster b admitted once a's quota is free",
        describe=lambda: _workload(cluster, "b"),
    )
    timings["b_admitted_after_a_deleted"] = round(time.monotonic() - mark, 2)
    assert cluster.run_dir is not None
    (cluster.run_dir / "kueue-timings.json").write_text(json.dumps(timings, indent=2) + "\n")
