"""The TPU identity webhook called by the real API server over TLS.

The operator process serves the webhook on loopback and applies the
MutatingWebhookConfiguration itself; KubeRay creates the pods, so every pod here
went through admission exactly as on GKE.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiException

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import (
    OperatorProcess,
    apply,
    describe,
    event_reasons,
    kubectl,
    slice_pods,
    tsc,
    wait_condition,
)
from tpusim import kube

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def env_of(pod: Any) -> dict[str, str]:
    (container,) = [c for c in pod.spec.containers if c.name == "ray-worker"]
    return {e.name: e.value for e in container.env or [] if e.value is not None}


def identity(pod: Any) -> tuple[int, int]:
    labels = pod.metadata.labels
    return int(labels["ray.io/worker-group-replica-index"]), int(
        labels["ray.io/replica-host-index"]
    )


def assert_identity(pod: Any, cluster_name: str, slices: int, hosts: int) -> None:
    r, h = identity(pod)
    env = env_of(pod)
    assert pod.spec.hostname == f"tpu-{r}-{h}" and DNS_LABEL.match(pod.spec.hostname)
    assert pod.spec.subdomain == f"{cluster_name}-headless"
    assert env["TPU_WORKER_ID"] == str(h)
    assert env["TPU_NAME"] == f"tpu-{r}"
    assert env["TPU_WORKER_HOSTNAMES"].split(",") == [
        f"tpu-{r}-{j}.{cluster_name}-headless" for j in range(hosts)
    ]
    if slices > 1:
        assert env["MEGASCALE_NUM_SLICES"] == str(slices)
        assert env["MEGASCALE_SLICE_ID"] == str(r)
        assert env["MEGASCALE_COORDINATOR_ADDRESS"] == f"tpu-0-0.{cluster_name}-headless"
    else:
        assert "MEGASCALE_NUM_SLICES" not in env
    assert env["TPU_DEVICE_PLUGIN_ADDR"] == "$(TPU_DEVICE_PLUGIN_HOST_IP):2112"
    names = [e.name for c in pod.spec.containers for e in c.env or []]
    assert len(names) == len(set(names)), "an env var appears twice"


def test_every_worker_gets_a_unique_correct_identity_and_again_after_a_failure(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, tsc("ident", slices=2))
    wait_condition(cluster, namespace, "ident", "Ready", "True")
    pods = slice_pods(cluster, namespace, "ident")
    assert len(pods) == 8
    for pod in pods:
        assert_identity(pod, "ident", slices=2, hosts=4)
    assert len({identity(p) for p in pods}) == 8  # no duplicate (slice, worker id)
    # a host fails: KubeRay replaces the whole slice; the new pods get the same identities
    victim = next(p for p in pods if identity(p) == (1, 2))
    old_replica = victim.metadata.labels["ray.io/worker-group-replica-name"]
    cluster.core.delete_namespaced_pod(victim.metadata.name, namespace)

    def replaced() -> list[Any] | None:
        pods = [
            p for p in slice_pods(cluster, namespace, "ident") if not p.metadata.deletion_timestamp
        ]
        fresh = [
            p
            for p in pods
            if identity(p)[0] == 1
            and p.metadata.labels["ray.io/worker-group-replica-name"] != old_replica
        ]
        return fresh if len(fresh) == 4 else None

    fresh = kube.wait_for(
        replaced,
        timeout_s=90,
        what="slice 1 recreated",
        describe=lambda: describe(cluster, namespace, "ident"),
    )
    for pod in fresh:
        assert_identity(pod, "ident", slices=2, hosts=4)
    wait_condition(cluster, namespace, "ident", "Ready", "True")


def test_with_the_webhook_down_our_pods_are_refused_and_others_are_not(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, tsc("refused", type_="v4", topology="2x2x2"))
    wait_condition(cluster, namespace, "refused", "Ready", "True")
    worker = slice_pods(cluster, namespace, "refused")[0]
    operator.kill()
    try:
        plain = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "plain"},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]},
        }
        cluster.core.create_namespaced_pod(namespace, plain)  # not ours: admitted
        head = {  # ours, but not a worker (a Ray head needs no TPU identity): admitted
            **plain,
            "metadata": {
                "name": "head",
                "labels": {"tpuslice.dev/cluster": "refused", "ray.io/node-type": "head"},
            },
        }
        cluster.core.create_namespaced_pod(namespace, head)
        cluster.core.delete_namespaced_pod("head", namespace, grace_period_seconds=0)
        ours = {
            **plain,
            "metadata": {
                "name": "ours",
                "labels": {"tpuslice.dev/cluster": "refused", "ray.io/node-type": "worker"},
            },
        }
        with pytest.raises(ApiException) as refused:
            cluster.core.create_namespaced_pod(namespace, ours)
        assert "tpuslice-identity" in str(refused.value.body)
        # KubeRay's own attempts are refused too: the replica stays short
        cluster.core.delete_namespaced_pod(worker.metadata.name, namespace)
        kube.wait_for(
            lambda: "FailedToCreateWorkerPod" in event_reasons(cluster, namespace),
            timeout_s=60,
            what="KubeRay's refused pod creation event",
        )
    finally:
        operator.start()
    # KubeRay retries, the webhook admits, the slice is whole and Ready again
    wait_condition(cluster, namespace, "refused", "Ready", "True", timeout_s=180)
    for pod in slice_pods(cluster, namespace, "refused"):
        if not pod.metadata.deletion_timestamp:
            assert_identity(pod, "refused", slices=1, hosts=2)


def test_webhook_configuration_is_scoped_to_our_pods(
    cluster: E2ECluster, operator: OperatorProcess
) -> None:
    config = yaml.safe_load(
        kubectl(
            cluster, "get", "mutatingwebhookconfiguration", "tpuslice-identity", "-o", "yaml"
        ).stdout
    )
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Fail"
    assert hook["objectSelector"]["matchExpressions"] == [
        {"key": "tpuslice.dev/cluster", "operator": "Exists"},
        {"key": "ray.io/node-type", "operator": "In", "values": ["worker"]},
    ]
    assert hook["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
    ]
    assert [r["operations"] for r in hook["rules"]] == [["CREATE"]]
    assert hook["timeoutSeconds"] <= 10
