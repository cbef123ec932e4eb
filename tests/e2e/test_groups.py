"""Several worker groups in one TPUSliceCluster (spec.workerGroups) on the local cluster.

What is built: one KubeRay worker group per entry, TPU groups on nodes of their own
shape with identity per group, a CPU group never on TPU nodes, and the pass refusing
(InvalidSpec, naming the fix) a grouped spec it cannot reserve yet (reservation policy
NodePool; per-group reservation is designed in docs/architecture.md, "Several worker
groups: reservation"). So these scenarios run with ``reservation.policy: None``.

Each scenario runs over pools of its own shapes, v6e 2x4 on 4-chip hosts (a trainer
group) and v5e 2x4 on one 8-chip host (a rollout group), added and removed by the
``group_pools`` fixture.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import (
    NODEPOOL,
    apply,
    delete_tsc,
    describe,
    kubectl,
    wait_condition,
)
from tests.support.builders import tpuslice
from tpusim import kube
from tpusim.nodepools import TPUPool
from tpusim.operator_process import OperatorProcess

READY_S = 180
ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"


def grouped(name: str, **spec: Any) -> dict[str, Any]:
    """A trainer of 2 v6e 2x4 slices (2 hosts each), a rollout of 2 independent v5e 2x4
    slices (1 host each) and a CPU group of 2 replicas."""
    body = tpuslice(name=name, namespace=None, **spec)
    del body["spec"]["tpu"]
    small = {"cpu": "1", "memory": "2Gi"}
    body["spec"]["head"] = {"resources": small}
    body["spec"]["workerGroups"] = [
        {
            "name": "trainer",
            "tpu": {"type": "v6e", "topology": "2x4", "chipsPerHost": 4, "slices": 2},
            "resources": small,
        },
        {
            "name": "rollout",
            "tpu": {"type": "v5e", "topology": "2x4", "slices": 2, "multislice": False},
            "resources": small,
        },
        {"name": "data", "cpu": {"replicas": 2}, "resources": small},
    ]
    return body


@pytest.fixture
def group_pools(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> Iterator[list[str]]:
    pools = [
        TPUPool("grp-v6e-a", "v6e", "2x4", nodes=2),
        TPUPool("grp-v6e-b", "v6e", "2x4", nodes=2),
        TPUPool("grp-v5e", "v5e", "2x4", nodes=2, chips_per_node=8),
    ]
    for pool in pools:
        kube.wait_nodes_ready(cluster.api, kube.create_pool(cluster.api, pool))
    yield [p.name for p in pools]
    kubectl(cluster, "delete", "tsc", "--all", "-n", namespace, "--wait=true", check=False)
    for pool in pools:
        kube.delete_pool(cluster.api, pool.name)


def pods_by_group(cluster: E2ECluster, namespace: str, name: str) -> dict[str, list[Any]]:
    pods = cluster.core.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={name}")
    out: dict[str, list[Any]] = {}
    for pod in pods.items:
        if (pod.metadata.labels or {}).get("ray.io/node-type") == "worker":
            out.setdefault(pod.metadata.labels["ray.io/group"], []).append(pod)
    return out


def env(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or [] if e.value is not None}


def test_each_group_runs_on_its_own_shape_with_its_own_identity(
    cluster: E2ECluster, namespace: str, group_pools: list[str]
) -> None:
    apply(cluster, namespace, grouped("rl", reservation={"policy": "None"}))

    def all_running() -> dict[str, list[Any]] | None:
        groups = pods_by_group(cluster, namespace, "rl")
        counts = {g: len(p) for g, p in groups.items()}
        running = all(p.status.phase == "Running" for ps in groups.values() for p in ps)
        return groups if running and counts == {"trainer": 4, "rollout": 2, "data": 2} else None

    groups = kube.wait_for(
        all_running,
        timeout_s=READY_S,
        what="every group's pods running",
        describe=lambda: describe(cluster, namespace, "rl"),
    )
    for pod in groups["trainer"]:
        node = cluster.core.read_node(pod.spec.node_name)
        assert node.metadata.labels[ACCELERATOR] == "tpu-v6e-slice"
        replica = pod.metadata.labels["ray.io/worker-group-replica-index"]
        assert env(pod)["TPU_NAME"] == f"trainer-{replica}"
        assert env(pod)["MEGASCALE_NUM_SLICES"] == "2"
        assert env(pod)["MEGASCALE_COORDINATOR_ADDRESS"] == "trainer-0-0.rl-headless"
    for pod in groups["rollout"]:
        node = cluster.core.read_node(pod.spec.node_name)
        assert node.metadata.labels[ACCELERATOR] == "tpu-v5-lite-podslice"
        assert env(pod)["TPU_NAME"].startswith("rollout-")
        assert not any(k.startswith("MEGASCALE_") for k in env(pod))
    for pod in groups["data"]:
        labels = cluster.core.read_node(pod.spec.node_name).metadata.labels
        assert ACCELERATOR not in labels and labels.get(NODEPOOL) not in group_pools
    obj = wait_condition(cluster, namespace, "rl", "Ready", "True", timeout_s=READY_S)
    by_name = {g["name"]: g for g in obj["status"]["groups"]}
    assert (by_name["trainer"]["readySlices"], by_name["rollout"]["readySlices"]) == (2, 2)
    assert by_name["data"]["desiredReplicas"] == 2


def test_a_gated_grouped_cluster_is_refused_until_reservation_is_per_group(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, grouped("gated"))
    obj = wait_condition(cluster, namespace, "gated", "Stalled", "True", "InvalidSpec")
    message = next(c["message"] for c in obj["status"]["conditions"] if c["type"] == "Stalled")
    assert "spec.workerGroups" in message and "reservation.policy None" in message
    delete_tsc(cluster, namespace, "gated")


def test_the_api_server_refuses_mixing_the_two_forms(
    cluster: E2ECluster, namespace: str, tpuslice_crds: None
) -> None:
    body = grouped("mixed")
    body["spec"]["tpu"] = {"type": "v6e", "topology": "4x4"}
    stdin = yaml.safe_dump(body)
    result = kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=stdin, check=False)
    assert result.returncode != 0
    assert "exactly one of spec.tpu" in result.stderr
    assert kubectl(cluster, "get", "tsc", "mixed", "-n", namespace, check=False).returncode != 0
