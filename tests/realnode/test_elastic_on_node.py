"""Elastic on the real node: Ray's real autoscaler v2 adds and removes a TPU slice.

A TPUSliceCluster with ``spec.elastic`` (minSlices 0, maxSlices 1, one v6e 2x2 slice)
on the real node (a one-node single-host pool, tests/realnode/tpu_support.py): the
head runs on the node with KubeRay's in-tree autoscaler sidecar (autoscaler v2, as
the operator renders it). A driver ``kubectl exec``'d into the head asks for
``{"TPU": 4}``, the slice's chips, a demand no running node can meet:

- the real autoscaler patches the RayCluster's group ``replicas`` to 1 (its KubeRay
  provider, ray 2.60 ``autoscaler/v2/instance_manager/cloud_providers/kuberay``);
- the operator reserves the node (a SliceReservation held by the cluster) and releases
  the gated worker, which runs Ray on the node and runs the task;
- the demand ends; after ``idleTimeoutSeconds`` the autoscaler removes the idle worker
  (``scaleStrategy.workersToDelete`` naming it, or ``replicas`` back to 0), KubeRay
  deletes it and the operator frees the reservation.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.operator_support import apply, kubectl, wait_condition
from tests.realnode.conftest import REPO, NodeCluster
from tests.realnode.tpu_support import GROUP, VERSION, chart_operator, real_tpu_node, slice_body
from tpusim import ToolPaths, kube

IDLE_S = 20
TASK_S = 5

#: The demand: one task asking for the slice's four chips; prints when it ran.
DEMAND_SCRIPT = f"""
import socket, time
import ray
ray.init(address="auto", logging_level="ERROR")

@ray.remote(num_cpus=0, resources={{"TPU": 4}})
def on_tpu():
    time.sleep({TASK_S})
    return socket.gethostname()

print("SUBMITTED", flush=True)
print("RAN_ON " + ray.get(on_tpu.remote(), timeout=600), flush=True)
"""


@pytest.fixture(scope="module")
def operator_ns(
    node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    with (
        real_tpu_node(node_cluster),
        chart_operator(
            node_cluster, "tpuslice-elastic", tmp_path_factory.mktemp("values")
        ) as namespace,
    ):
        yield namespace


def _raycluster(cluster: NodeCluster, namespace: str, name: str) -> dict[str, Any]:
    items: list[dict[str, Any]] = cluster.custom.list_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayclusters", label_selector=f"tpuslice.dev/cluster={name}"
    )["items"]
    (rc,) = items
    return rc


def _held(cluster: NodeCluster, namespace: str, name: str) -> list[str]:
    return [
        r["metadata"]["name"]
        for r in cluster.custom.list_cluster_custom_object(GROUP, VERSION, "slicereservations")[
            "items"
        ]
        if r["spec"]["holder"].get("name") == name
        and r["spec"]["holder"].get("namespace") == namespace
    ]


def _workers(cluster: NodeCluster, namespace: str, name: str) -> list[Any]:
    pods: list[Any] = cluster.core.list_namespaced_pod(
        namespace, label_selector=f"tpuslice.dev/cluster={name},ray.io/node-type=worker"
    ).items
    return pods


def test_the_real_autoscaler_adds_and_removes_the_tpu_slice(
    node_cluster: NodeCluster, operator_ns: str, workload_ns: str
) -> None:
    cluster = node_cluster
    name = "elastic"
    began = time.monotonic()
    body = slice_body(
        cluster,
        "TPUSliceCluster",
        name,
        elastic={"minSlices": 0, "maxSlices": 1, "idleTimeoutSeconds": IDLE_S},
    )
    apply(cluster, workload_ns, body)
    wait_condition(cluster, workload_ns, name, "Ready", "True", timeout_s=300)
    rc = _raycluster(cluster, workload_ns, name)
    rc_name = rc["metadata"]["name"]
    assert rc["spec"]["enableInTreeAutoscaling"] is True
    (group,) = rc["spec"]["workerGroupSpecs"]
    assert (group.get("replicas") or 0) == 0 and group["maxReplicas"] == 1
    (head,) = cluster.core.list_namespaced_pod(
        workload_ns, label_selector=f"ray.io/cluster={rc_name},ray.io/node-type=head"
    ).items
    containers = [c.name for c in head.spec.containers]
    assert "autoscaler" in containers, containers
    assert not _workers(cluster, workload_ns, name) and not _held(cluster, workload_ns, name)
    ready_s = time.monotonic() - began

    lines: list[str] = []
    driver = subprocess.Popen(
        [
            str(ToolPaths.for_repo(REPO).binary("kubectl")),
            f"--kubeconfig={cluster.kubeconfig}",
            "exec",
            "-n",
            workload_ns,
            head.metadata.name,
            "-c",
            "ray-head",
            "--",
            "python",
            "-c",
            DEMAND_SCRIPT,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def read() -> None:
        assert driver.stdout is not None
        lines.extend(line.rstrip("\n") for line in driver.stdout)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    demanded = time.monotonic()

    def autoscaler_log() -> str:
        out = kubectl(
            cluster, "logs", "-n", workload_ns, head.metadata.name, "-c", "autoscaler",
            "--tail=40", check=False,
        )  # fmt: skip
        return out.stdout + out.stderr

    try:
        # the real autoscaler raises replicas; the operator reserves and releases the slice
        kube.wait_for(
            lambda: (
                _raycluster(cluster, workload_ns, name)["spec"]["workerGroupSpecs"][0].get(
                    "replicas"
                )
                == 1
            ),
            timeout_s=180,
            what="the autoscaler's replicas 1",
            describe=lambda: {"driver": lines[-10:], "autoscaler": autoscaler_log()},
        )
        scaled_s = time.monotonic() - demanded
        held = kube.wait_for(
            lambda: _held(cluster, workload_ns, name),
            timeout_s=120,
            what="the node reserved for the added slice",
        )
        assert held == [cluster.node_name], held
        driver.wait(timeout=300)
        reader.join(timeout=5)
        ran = [x for x in lines if x.startswith("RAN_ON ")]
        assert ran, lines[-20:]
        ran_s = time.monotonic() - demanded
        (worker,) = _workers(cluster, workload_ns, name)
        assert ran[0].removeprefix("RAN_ON ") == worker.metadata.name
        assert worker.spec.node_name == cluster.node_name
    finally:
        if driver.poll() is None:
            driver.kill()
    idle_from = time.monotonic()

    # the demand is over: after idleTimeoutSeconds the autoscaler removes the slice
    def scaled_down() -> dict[str, Any] | None:
        (g,) = _raycluster(cluster, workload_ns, name)["spec"]["workerGroupSpecs"]
        asked = (g.get("replicas") or 0) == 0 or bool(
            (g.get("scaleStrategy") or {}).get("workersToDelete")
        )
        return g if asked else None

    removal = kube.wait_for(
        scaled_down,
        timeout_s=IDLE_S + 180,
        what="the autoscaler scaling the idle slice down",
        describe=autoscaler_log,
    )
    down_s = time.monotonic() - idle_from
    print(f"\nthe autoscaler's scale-down: replicas {removal.get('replicas')}, "
          f"scaleStrategy {removal.get('scaleStrategy')}")  # fmt: skip
    kube.wait_for(
        lambda: not _workers(cluster, workload_ns, name),
        timeout_s=120,
        what="the worker gone",
    )
    kube.wait_for(
        lambda: not _held(cluster, workload_ns, name),
        timeout_s=120,
        what="the reservation freed",
    )
    freed_s = time.monotonic() - idle_from
    st = cluster.custom.get_namespaced_custom_object(
        GROUP, VERSION, workload_ns, "tpusliceclusters", name
    )["status"]
    conditions = {c["type"]: c["status"] for c in st.get("conditions") or []}
    assert conditions.get("Ready") == "True", st  # scaling never makes it not Ready
    print(
        f"ready {ready_s:.1f}s, replicas 1 {scaled_s:.1f}s after the demand, task done "
        f"{ran_s:.1f}s after it, scale-down asked {down_s:.1f}s after idle, node freed "
        f"{freed_s:.1f}s after idle, total {time.monotonic() - began:.1f}s"
    )
    kubectl(cluster, "delete", "tsc", name, "-n", workload_ns, "--wait=true", "--timeout=120s")
