"""A real TPU-shaped Ray worker: a TPUSliceJob of one v6e 2x2 slice on the real node.

The real node is a one-node single-host v6e 2x2 pool (tests/realnode/tpu_support.py),
so the operator reserves it, KubeRay's worker pod runs Ray for real there, and the
entrypoint runs a Ray task on that worker reporting the TPU environment the identity
webhook set (docs/tpu-identity.md, single-host slices) and Ray's own view of the TPU
host (``ray.util.tpu`` and the node's resources and labels in Ray). Both are checked
against the worker pod the API server stored.

No chip backs the node (no ``/dev/accel*``), so Ray detects none itself: the ``TPU``
resource the worker has is KubeRay's, from the container's ``google.com/tpu`` limit,
and Ray's chip count reads 0; the test asserts exactly that.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.operator_support import apply, kubectl
from tests.realnode.conftest import NodeCluster
from tests.realnode.tpu_support import (
    GROUP,
    VERSION,
    chart_operator,
    dashboard_get,
    python_entrypoint,
    real_tpu_node,
    slice_body,
)
from tpusim import kube
from tpusim.nodepools import TPU_RESOURCE

#: Identity env a single-host worker gets (docs/tpu-identity.md) and env Ray reads.
ENV_KEYS = (
    "TPU_WORKER_ID",
    "TPU_NAME",
    "TPU_WORKER_HOSTNAMES",
    "TPU_DEVICE_PLUGIN_HOST_IP",
    "TPU_DEVICE_PLUGIN_ADDR",
    "MEGASCALE_NUM_SLICES",
    "MEGASCALE_SLICE_ID",
    "TPU_ACCELERATOR_TYPE",
    "TPU_TOPOLOGY",
    "TPU_VISIBLE_CHIPS",
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S",
)

#: The entrypoint: one task pinned to the (only) worker node, reporting what it sees.
VIEW_SCRIPT = """
import json, os, socket, time
import ray
from ray.util import tpu as rtpu
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

KEYS = %(keys)r
ray.init()
head = ray.get_runtime_context().get_node_id()
deadline = time.time() + 120
while True:
    workers = [n for n in ray.nodes() if n["Alive"] and n["NodeID"] != head]
    if workers or time.time() > deadline:
        break
    time.sleep(1)
(worker,) = workers

def call(fn):
    try:
        return fn()
    except Exception as exc:
        return "raised " + type(exc).__name__

def view():
    ctx = ray.get_runtime_context()
    return {
        "env": {k: os.environ.get(k) for k in KEYS},
        "hostname": socket.gethostname(),
        "node_id": ctx.get_node_id(),
        "pod_name": call(rtpu.get_current_pod_name),
        "pod_worker_count": call(rtpu.get_current_pod_worker_count),
        "chips_on_node": call(rtpu.get_num_tpu_chips_on_node),
        "accelerator_ids": ctx.get_accelerator_ids(),
    }

pinned = NodeAffinitySchedulingStrategy(worker["NodeID"], soft=False)
out = {"task": ray.get(ray.remote(num_cpus=0)(view).options(scheduling_strategy=pinned).remote())}
tpu = worker["Resources"].get("TPU")
if tpu:
    # a task that asks for the slice's chips, as a TPU workload does
    out["tpu_task"] = ray.get(ray.remote(num_cpus=0, resources={"TPU": tpu})(view).remote())
out["ray_node"] = {"resources": worker["Resources"], "labels": worker.get("Labels") or {}}
name = out["task"]["pod_name"]
out["slice_name_from_node"] = rtpu.get_tpu_slice_name_from_node(worker)
out["slice_nodes"] = len(rtpu.get_tpu_nodes_for_slice(name)) if name else None
print("TPUVIEW " + json.dumps(out, sort_keys=True))
"""


@pytest.fixture(scope="module")
def operator_ns(
    node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    with (
        real_tpu_node(node_cluster),
        chart_operator(
            node_cluster, "tpuslice-tpu-worker", tmp_path_factory.mktemp("values")
        ) as namespace,
    ):
        yield namespace


def _ray_job(cluster: NodeCluster, namespace: str) -> dict[str, Any]:
    items: list[dict[str, Any]] = cluster.custom.list_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayjobs"
    )["items"]
    (job,) = items
    return job


def test_a_ray_task_on_the_real_tpu_worker_sees_the_identity_the_webhook_set(
    node_cluster: NodeCluster, operator_ns: str, workload_ns: str
) -> None:
    cluster = node_cluster
    began = time.monotonic()
    node = cluster.core.read_node(cluster.node_name)
    assert node.status.allocatable[TPU_RESOURCE] == "4"
    body = slice_body(cluster, "TPUSliceJob", "tpu-view")
    body["spec"]["job"] = {
        "entrypoint": python_entrypoint(VIEW_SCRIPT % {"keys": ENV_KEYS}),
        "submissionMode": "HTTPMode",
        "backoffLimit": 0,
        # keep the cluster after the job, to read the job's logs from its dashboard
        "shutdownAfterJobFinishes": False,
    }
    apply(cluster, workload_ns, body)

    def job() -> dict[str, Any]:
        obj: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
            GROUP, VERSION, workload_ns, "tpuslicejobs", "tpu-view"
        )
        return obj

    def finished() -> str | None:
        state = (job().get("status") or {}).get("jobStatus")
        return state if state in {"SUCCEEDED", "FAILED"} else None

    outcome = kube.wait_for(
        finished,
        timeout_s=420,
        what="TPUSliceJob tpu-view finished",
        describe=lambda: {
            "status": job().get("status"),
            "pods": kubectl(
                cluster, "get", "pods", "-n", workload_ns, "-o", "wide", check=False
            ).stdout,
        },
    )
    ray_job = _ray_job(cluster, workload_ns)
    ray_cluster = ray_job["status"]["rayClusterName"]
    logs = dashboard_get(
        cluster, workload_ns, ray_cluster, f"/api/jobs/{ray_job['status']['jobId']}/logs"
    )["logs"]
    assert outcome == "SUCCEEDED", logs[-3000:]
    (line,) = [x for x in logs.splitlines() if x.startswith("TPUVIEW ")]
    seen = json.loads(line.removeprefix("TPUVIEW "))
    print(f"\nRay's view from the real TPU worker: {json.dumps(seen, indent=1)}")

    (worker,) = [
        p
        for p in cluster.core.list_namespaced_pod(
            workload_ns, label_selector=f"ray.io/cluster={ray_cluster},ray.io/node-type=worker"
        ).items
    ]
    assert worker.spec.node_name == cluster.node_name
    (container,) = [c for c in worker.spec.containers if c.name == "ray-worker"]
    assert container.resources.limits[TPU_RESOURCE] == "4"
    set_env = {e.name: e.value for e in container.env or []}
    task = seen["task"]
    env = task["env"]
    # what the webhook set for a single-host slice (docs/tpu-identity.md), as Ray's task saw it
    assert set_env["TPU_WORKER_ID"] == env["TPU_WORKER_ID"] == "0"
    assert set_env["TPU_NAME"] == env["TPU_NAME"]
    assert env["TPU_NAME"].endswith("-0"), env  # <group>-<replica index>
    assert env["TPU_WORKER_HOSTNAMES"] is None and "TPU_WORKER_HOSTNAMES" not in set_env
    assert env["MEGASCALE_NUM_SLICES"] is None and env["MEGASCALE_SLICE_ID"] is None
    assert env["TPU_DEVICE_PLUGIN_HOST_IP"] == worker.status.host_ip  # the downward API
    assert env["TPU_DEVICE_PLUGIN_ADDR"] == f"{worker.status.host_ip}:2112"
    assert (
        env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"]
        == set_env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"]
    )
    # GKE's device plugin, not the webhook, adds these; there is none here
    assert env["TPU_ACCELERATOR_TYPE"] is None and env["TPU_TOPOLOGY"] is None
    assert task["hostname"] == worker.metadata.name
    # Ray's view: the slice name from TPU_NAME, no chip detected (no /dev/accel*)
    assert task["pod_name"] == env["TPU_NAME"]
    assert task["chips_on_node"] == 0
    # Ray 2.60 derives the host count from TPU_ACCELERATOR_TYPE (the device plugin's) and
    # fails on None instead of answering None (ray/_private/accelerators/tpu.py,
    # get_tpu_cores_per_chip(None).startswith): without the device plugin it raises
    assert task["pod_worker_count"] == "raised AttributeError"
    labels = seen["ray_node"]["labels"]
    resources = seen["ray_node"]["resources"]
    print(f"worker node in Ray: resources {resources}, labels {labels}")
    # Ray's TPU labels: slice name and worker id Ray derived from the webhook's env, pod
    # type, topology and accelerator type from the operator's group labels (ray start --labels)
    tpu_labels = {k: v for k, v in labels.items() if k.startswith(("ray.io/tpu-", "ray.io/acc"))}
    assert tpu_labels == {
        "ray.io/tpu-slice-name": env["TPU_NAME"],
        "ray.io/tpu-worker-id": "0",
        "ray.io/tpu-pod-type": "v6e-4",
        "ray.io/tpu-topology": "2x2",
        "ray.io/accelerator-type": "TPU-V6E",
    }, labels
    assert seen["slice_name_from_node"] == env["TPU_NAME"] and seen["slice_nodes"] == 1
    # the TPU resource is KubeRay's, from the container's google.com/tpu limit; with no chip
    # detected Ray adds neither the slice-name resource nor TPU-v6e-4-head
    assert resources.get("TPU") == 4.0, resources
    assert env["TPU_NAME"] not in resources and "TPU-v6e-4-head" not in resources, resources
    assert task["accelerator_ids"]["TPU"] == [] and env["TPU_VISIBLE_CHIPS"] is None
    # a task asking for the four chips gets them as Ray's TPU ids and TPU_VISIBLE_CHIPS
    tpu_task = seen["tpu_task"]
    assert tpu_task["node_id"] == task["node_id"]
    assert tpu_task["accelerator_ids"]["TPU"] == ["0", "1", "2", "3"]
    assert tpu_task["env"]["TPU_VISIBLE_CHIPS"] == "0,1,2,3"
    print(f"test took {time.monotonic() - began:.1f}s")
    kubectl(
        cluster, "delete", "tsj", "tpu-view", "-n", workload_ns, "--wait=true", "--timeout=120s"
    )
