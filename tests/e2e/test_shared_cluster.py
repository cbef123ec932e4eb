"""What one tenant can do to the others in a shared cluster, on the local cluster.

- A TPUSliceCluster that can never have pods (its namespace's ResourceQuota refuses its
  TPU workers) asks for every pool of its shape at the highest priority: it sets nothing
  aside, and another team's 1-slice cluster becomes Ready.
- Hostile pods sent to the identity webhook (our labels, 40 TPU containers) are refused
  by the webhook's own rule, not by a timeout, while KubeRay's worker pods of a real
  cluster keep being admitted (no FailedToCreateWorkerPod).
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import (
    apply,
    delete_tsc,
    event_reasons,
    held_by,
    slice_pods,
    tsc,
    wait_condition,
)
from tpusim.operator_process import OperatorProcess

READY_S = 240


@pytest.fixture
def other_namespace(cluster: E2ECluster, namespace: str) -> Iterator[str]:
    name = f"{namespace[:50]}-o-{uuid.uuid4().hex[:4]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    cluster.core.delete_namespace(name)


def test_an_object_whose_pods_can_never_exist_blocks_nobody(
    cluster: E2ECluster, namespace: str, other_namespace: str, operator: OperatorProcess
) -> None:
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="no-tpu"),
        spec=client.V1ResourceQuotaSpec(hard={"requests.google.com/tpu": "0"}),
    )
    cluster.core.create_namespaced_resource_quota(namespace, quota)
    squatter = tsc(
        "squatter", slices=2, reservation={"gang": "AllSlices", "priority": 1_000_000_000}
    )
    apply(cluster, namespace, squatter)
    apply(cluster, other_namespace, tsc("ready"))
    wait_condition(cluster, other_namespace, "ready", "Ready", "True", timeout_s=READY_S)
    assert len(held_by(cluster, other_namespace, "ready")) == 1
    assert held_by(cluster, namespace, "squatter") == {}
    for ns, name in ((other_namespace, "ready"), (namespace, "squatter")):
        delete_tsc(cluster, ns, name)


def hostile(worker: Any, index: int) -> dict[str, Any]:
    """A pod with a real worker's labels (so the webhook reviews it) and 40 TPU containers."""
    meta = worker.metadata
    container = {
        "name": "c",
        "image": "busybox:1.36",
        "resources": {"limits": {"google.com/tpu": "1"}, "requests": {"google.com/tpu": "1"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"hostile-{index}",
            "labels": copy.deepcopy(meta.labels),
            "annotations": copy.deepcopy(meta.annotations or {}),
        },
        "spec": {"containers": [{**container, "name": f"c{i}"} for i in range(40)]},
    }


def test_hostile_reviews_are_refused_by_rule_while_real_workers_are_admitted(
    cluster: E2ECluster, namespace: str, other_namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, tsc("model"))
    wait_condition(cluster, namespace, "model", "Ready", "True", timeout_s=READY_S)
    worker = next(
        p
        for p in slice_pods(cluster, namespace, "model")
        if (p.metadata.labels or {}).get("ray.io/node-type") == "worker"
    )
    refusals: list[str] = []

    def flood() -> None:
        for i in range(20):
            try:
                cluster.core.create_namespaced_pod(namespace, hostile(worker, i))
                refusals.append("admitted")
            except ApiException as exc:
                refusals.append(str(exc.body))

    sender = threading.Thread(target=flood)
    sender.start()
    apply(cluster, other_namespace, tsc("during", topology="4x4"))
    sender.join(timeout=120)
    assert len(refusals) == 20
    assert all("containers requesting google.com/tpu" in r for r in refusals), refusals[:2]
    wait_condition(cluster, other_namespace, "during", "Ready", "True", timeout_s=READY_S)
    assert "FailedToCreateWorkerPod" not in event_reasons(cluster, other_namespace)
    for ns, name in ((other_namespace, "during"), (namespace, "model")):
        delete_tsc(cluster, ns, name)
