"""Objects and bounded waits the e2e tests share (no bare sleeps anywhere)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from tpusim import kube

TPU_TOLERATION = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
V6E_4X4 = {
    "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
    "cloud.google.com/gke-tpu-topology": "4x4",
}
IMAGE = "rayproject/ray:2.54.0-py311-tpu"


@dataclass(frozen=True)
class E2ECluster:
    """What a test gets: the kubeconfig, an API client and (local only) the run dir."""

    kubeconfig: Path
    api: Any
    run_dir: Path | None

    @property
    def core(self) -> Any:
        return kube.core_v1(self.api)

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.api)


def tpu_pod(name: str, selector: dict[str, str] | None, chips: int, **spec: Any) -> dict[str, Any]:
    """A pod asking for ``chips`` TPU chips and tolerating the TPU taint."""
    resources = {"cpu": "1", "memory": "1Gi", "google.com/tpu": str(chips)}
    pod_spec: dict[str, Any] = {
        "tolerations": [TPU_TOLERATION],
        "containers": [
            {
                "name": "main",
                "image": IMAGE,
                "resources": {"requests": resources, "limits": copy.deepcopy(resources)},
            }
        ],
        **spec,
    }
    if selector:
        pod_spec["nodeSelector"] = selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod_spec}


def multihost_raycluster(name: str, replicas: int = 2) -> dict[str, Any]:
    """A hand-written RayCluster: one multi-host v6e 4x4 worker group, as a user writes it."""
    worker_res = {"cpu": "8", "memory": "32Gi", "google.com/tpu": "4"}
    head_res = {"cpu": "1", "memory": "2Gi"}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {
            "rayVersion": "2.54.0",
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "ray-head",
                                "image": IMAGE,
                                "resources": {"requests": head_res, "limits": dict(head_res)},
                            }
                        ]
                    }
                },
            },
            "workerGroupSpecs": [
                {
                    "groupName": "tpu",
                    "replicas": replicas,
                    "minReplicas": 0,
                    "maxReplicas": replicas,
                    "numOfHosts": 4,
                    "rayStartParams": {},
                    "template": {
                        "spec": {
                            "nodeSelector": dict(V6E_4X4),
                            "tolerations": [TPU_TOLERATION],
                            "containers": [
                                {
                                    "name": "ray-worker",
                                    "image": IMAGE,
                                    "resources": {
                                        "requests": worker_res,
                                        "limits": dict(worker_res),
                                    },
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


def pod_ready(pod: Any) -> bool:
    """Running with the Ready condition True."""
    if pod.status.phase != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def condition(pod: Any, kind: str) -> Any:
    """The pod condition of type ``kind`` or None."""
    for cond in pod.status.conditions or []:
        if cond.type == kind:
            return cond
    return None


def get_raycluster(cluster: E2ECluster, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayclusters", name
    )
    return obj


def create_raycluster(cluster: E2ECluster, namespace: str, body: dict[str, Any]) -> None:
    cluster.custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", body)


def wait_raycluster_ready(
    cluster: E2ECluster, namespace: str, name: str, timeout_s: float = 120
) -> dict[str, Any]:
    """Wait for RayCluster status.state == ready (all pods running and ready)."""

    def ready() -> dict[str, Any] | None:
        obj = get_raycluster(cluster, namespace, name)
        return obj if obj.get("status", {}).get("state") == "ready" else None

    return kube.wait_for(
        ready,
        timeout_s=timeout_s,
        what=f"RayCluster {namespace}/{name} state ready",
        describe=lambda: (
            get_raycluster(cluster, namespace, name).get("status"),
            pod_summary(cluster, namespace),
        ),
    )


def worker_pods(cluster: E2ECluster, namespace: str, name: str) -> list[Any]:
    selector = f"ray.io/cluster={name},ray.io/node-type=worker"
    pods: list[Any] = cluster.core.list_namespaced_pod(namespace, label_selector=selector).items
    return pods


def pod_summary(cluster: E2ECluster, namespace: str) -> list[str]:
    """One line per pod: name, phase, node, deletion state (for timeout messages)."""
    out = []
    for pod in cluster.core.list_namespaced_pod(namespace).items:
        gone = " deleting" if pod.metadata.deletion_timestamp else ""
        out.append(f"{pod.metadata.name}:{pod.status.phase}@{pod.spec.node_name}{gone}")
    return out


def holds(
    check: Callable[[], object], *, seconds: float, what: str, interval_s: float = 0.5
) -> None:
    """Assert ``check()`` stays truthy for ``seconds`` (polled): the opposite of wait_for."""
    deadline = time.monotonic() + seconds
    while True:
        state = check()
        assert state, f"{what} stopped holding after {seconds - (deadline - time.monotonic()):.1f}s"
        if time.monotonic() >= deadline:
            return
        time.sleep(interval_s)


def terminating_pod(cluster: E2ECluster, namespace: str, name: str) -> Any:
    """The pod if it still exists and is being deleted, else None."""
    pods = cluster.core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}")
    for pod in pods.items:
        if pod.metadata.deletion_timestamp:
            return pod
    return None
