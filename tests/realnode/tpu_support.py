"""The real node as a one-node single-host v6e 2x2 TPU pool, and the operator from the chart.

Shared by the modules that run a TPU worker for real (test_tpu_worker_on_node,
test_disruption_on_node, test_elastic_on_node). The node gets GKE's TPU labels,
taint and ``google.com/tpu: 4`` (tpusim.realtpu) for one module and has them taken
back after it, so the other real-node modules see the plain node they expect.

The chart's operator runs in a pod on the real node, so it tolerates the TPU taint
too; TPU worker pods tolerate the real node's own taint through
``spec.worker.template`` (the only fake-free way onto it) and heads are pinned to
the node by hostname.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.e2e.operator_support import helm, kubectl
from tests.realnode.conftest import REAL_TOLERATION, NodeCluster
from tests.realnode.test_chart_on_node import (
    CHART,
    RELEASE,
    WEBHOOK_CONFIG,
    restricted_namespace,
    values_file,
    wait_operator_ready,
)
from tpusim.nodepools import TPU_TAINT, TPUPool
from tpusim.realtpu import join_tpu_pool, leave_tpu_pool, real_tpu_pool

GROUP, VERSION = "tpuslice.dev", "v1alpha1"
TPU_TOLERATION = {"key": TPU_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}
HEAD_RESOURCES = {"cpu": "500m", "memory": "1Gi"}
#: Small: the real node is the 2-core build machine, shared with the head and the operator.
WORKER_RESOURCES = {"cpu": "500m", "memory": "1Gi"}


@contextmanager
def real_tpu_node(cluster: NodeCluster) -> Iterator[TPUPool]:
    pool = real_tpu_pool()
    join_tpu_pool(cluster.api, cluster.node_name, pool)
    try:
        yield pool
    finally:
        leave_tpu_pool(cluster.api, cluster.node_name, pool)


@contextmanager
def chart_operator(cluster: NodeCluster, namespace: str, values_dir: Path) -> Iterator[str]:
    """One operator replica from the chart on the real node (tolerating the TPU taint)."""
    restricted_namespace(cluster, namespace)
    values = values_file(
        cluster,
        values_dir / "values.yaml",
        replicaCount=1,
        tolerations=[REAL_TOLERATION, TPU_TOLERATION],
    )
    helm(
        cluster,
        "install",
        RELEASE,
        str(CHART),
        "-n",
        namespace,
        "-f",
        str(values),
        "--wait",
        "--timeout=3m",
    )
    try:
        wait_operator_ready(cluster, namespace, replicas=1)
        yield namespace
    finally:
        helm(cluster, "uninstall", RELEASE, "-n", namespace, "--wait", "--timeout=2m", check=False)
        kubectl(
            cluster,
            "delete",
            "mutatingwebhookconfiguration",
            WEBHOOK_CONFIG,
            "--ignore-not-found",
            check=False,
        )


def slice_body(cluster: NodeCluster, kind: str, name: str, **spec: Any) -> dict[str, Any]:
    """A TPUSlice object of one v6e 2x2 slice whose head and worker run on the real node."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": kind,
        "metadata": {"name": name},
        "spec": {
            "tpu": {"type": "v6e", "topology": "2x2"},
            "ray": {
                "version": cluster.ray_image.tag.split("-")[0],
                "image": cluster.ray_image.ref,
            },
            "head": {
                "resources": HEAD_RESOURCES,
                "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                "template": {
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": cluster.node_name},
                        "tolerations": [REAL_TOLERATION, TPU_TOLERATION],
                        "containers": [{"name": "ray-head", "imagePullPolicy": "Never"}],
                    }
                },
            },
            "worker": {
                "resources": WORKER_RESOURCES,
                "template": {
                    "spec": {
                        "tolerations": [REAL_TOLERATION],
                        "containers": [{"name": "ray-worker", "imagePullPolicy": "Never"}],
                    }
                },
            },
            **spec,
        },
    }


def python_entrypoint(script: str) -> str:
    """A shell command running ``script`` with the image's python; base64 keeps any quoting
    out of the way of KubeRay's submitter command line."""
    encoded = base64.b64encode(script.encode()).decode()
    return f"python -c \"import base64; exec(base64.b64decode('{encoded}'))\""


def dashboard_get(cluster: NodeCluster, namespace: str, ray_cluster: str, path: str) -> Any:
    """GET on a Ray head's dashboard through the API server's service proxy (the real
    node's DNS resolves no Service names; KubeRay takes the same path)."""
    proxy = f"/api/v1/namespaces/{namespace}/services/http:{ray_cluster}-head-svc:dashboard/proxy"
    out = kubectl(cluster, "get", "--raw", proxy + path)
    return json.loads(out.stdout)


def head_exec(
    cluster: NodeCluster, namespace: str, ray_cluster: str, script: str, timeout_s: int = 120
) -> str:
    """Run a Python ``script`` in the Ray head container (a driver next to the GCS)."""
    pods = cluster.core.list_namespaced_pod(
        namespace, label_selector=f"ray.io/cluster={ray_cluster},ray.io/node-type=head"
    ).items
    (head,) = pods
    out = kubectl(
        cluster,
        "exec",
        "-n",
        namespace,
        head.metadata.name,
        "-c",
        "ray-head",
        f"--request-timeout={timeout_s}s",
        "--",
        "python",
        "-c",
        script,
    )
    return out.stdout
