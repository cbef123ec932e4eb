"""The chart with its NetworkPolicy on: TPU worker pods are still admitted.

One release with ``networkPolicy.enabled=true``, the webhook port open only to
the address the API server's calls come from on this node (the host reaches the
pod over the node's bridge) and the API server named by the ``kubernetes``
Service's endpoint, as a user of a shared cluster would install it. The API
server must still reach the identity webhook through its Service, the operator
the API server, and a one-slice TPUSliceCluster become Ready with every worker
mutated. The reservation policy (on by default) is checked on the real API
server in the same release: the operator's own claims pass, an admin's create
is refused with the policy's message.

The real node's bridge CNI does not enforce NetworkPolicy, so this proves the
rendered policy is accepted and that nothing else in the chart's NetworkPolicy
configuration (ports, probe port, values) breaks admission; the enforcement
itself belongs to a cluster whose network plugin enforces it (GKE Dataplane V2).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client import ApiException

from tests.e2e.operator_support import (
    apply,
    held_by,
    helm,
    kubectl,
    slice_pods,
    tsc,
    wait_condition,
)
from tests.realnode.conftest import NodeCluster
from tests.realnode.test_chart_on_node import (
    CHART,
    IDENTITY_ENV,
    POD_CIDR,
    RELEASE,
    WEBHOOK_CONFIG,
    WEBHOOK_PODS,
    restricted_namespace,
    values_file,
    wait_operator_ready,
    wait_webhook_routed,
)
from tpusim import primary_address

pytestmark = pytest.mark.realnode

NAMESPACE = "tpuslice-netpol"


def api_server_endpoint(cluster: NodeCluster) -> tuple[str, int]:
    """Where the ``kubernetes`` Service sends pods: the API server's own address and port."""
    endpoints = json.loads(
        kubectl(cluster, "get", "endpoints", "kubernetes", "-n", "default", "-o", "json").stdout
    )
    (subset,) = endpoints["subsets"]
    (address,) = subset["addresses"]
    (port,) = subset["ports"]
    return address["ip"], int(port["port"])


#: A one-slice cluster's identity: the multislice settings (MEGASCALE_*) are set only
#: when a cluster has several slices.
ONE_SLICE_ENV = tuple(k for k in IDENTITY_ENV if not k.startswith("MEGASCALE_"))


def test_webhook_admits_tpu_pods_with_the_network_policy_on(
    node_cluster: NodeCluster,
    workload_ns: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    cluster = node_cluster
    restricted_namespace(cluster, NAMESPACE)
    api_ip, api_port = api_server_endpoint(cluster)
    # The API server runs in the host's network namespace: its calls to the pod leave
    # by the bridge (the gateway address) or carry the node's primary address.
    gateway = str(next(POD_CIDR.hosts()))
    control_plane = sorted({f"{primary_address()}/32", f"{gateway}/32", f"{api_ip}/32"})
    network_policy: dict[str, Any] = {
        "enabled": True,
        "webhookFrom": [{"ipBlock": {"cidr": cidr}} for cidr in control_plane],
        "apiServerTo": [{"ipBlock": {"cidr": f"{api_ip}/32"}}],
        "apiServerPorts": [api_port],
    }
    values = values_file(
        cluster,
        tmp_path_factory.mktemp("values-netpol") / "values.yaml",
        replicaCount=1,
        webhook={"replicaCount": 1},
        networkPolicy=network_policy,
    )
    helm(
        cluster,
        "install",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "-f",
        str(values),
        "--wait",
        "--timeout=3m",
    )
    try:
        (pod,) = wait_operator_ready(cluster, NAMESPACE, replicas=1)
        (hook,) = wait_operator_ready(cluster, NAMESPACE, replicas=1, selector=WEBHOOK_PODS)
        # the policies as rendered are the ones the API server keeps: the webhook pods'
        # admit the control plane to the webhook port, the operator pods' nothing but metrics
        policy = json.loads(
            kubectl(
                cluster, "get", "networkpolicy", f"{RELEASE}-webhook", "-n", NAMESPACE, "-o", "json"
            ).stdout
        )["spec"]
        assert policy["policyTypes"] == ["Ingress", "Egress"]
        assert policy["ingress"][0]["from"] == network_policy["webhookFrom"]
        assert hook.metadata.labels.items() >= policy["podSelector"]["matchLabels"].items()
        operator_policy = json.loads(
            kubectl(cluster, "get", "networkpolicy", RELEASE, "-n", NAMESPACE, "-o", "json").stdout
        )["spec"]
        assert pod.metadata.labels.items() >= operator_policy["podSelector"]["matchLabels"].items()
        assert [r["ports"] for r in operator_policy["ingress"]] == [
            [{"port": "metrics", "protocol": "TCP"}]
        ]
        # the API server reaches the webhook through its Service, and a labelled TPU
        # worker pod is admitted with its TPU identity
        wait_webhook_routed(cluster, workload_ns)
        apply(cluster, workload_ns, tsc("netpol", slices=1))
        wait_condition(cluster, workload_ns, "netpol", "Ready", "True", timeout_s=180)
        workers = [
            p
            for p in slice_pods(cluster, workload_ns, "netpol")
            if "ray.io/worker-group-replica-name" in (p.metadata.labels or {})
        ]
        assert workers
        for worker in workers:
            (container,) = [c for c in worker.spec.containers if c.name == "ray-worker"]
            env = {e.name for e in container.env or []}
            assert set(ONE_SLICE_ENV) <= env, f"{worker.metadata.name} lacks {ONE_SLICE_ENV}"
        # the operator's claim passed the reservation policy; an admin's is refused
        (pool,) = held_by(cluster, workload_ns, "netpol").values()
        reservation = {
            "apiVersion": "tpuslice.dev/v1alpha1",
            "kind": "SliceReservation",
            "metadata": {"name": f"{pool}-admin"},
            "spec": {
                "nodePool": f"{pool}-admin",
                "holder": {"namespace": workload_ns, "name": "x", "uid": "u", "replicaName": "r"},
            },
        }
        with pytest.raises(ApiException) as refused:
            cluster.custom.create_cluster_custom_object(
                "tpuslice.dev", "v1alpha1", "slicereservations", reservation
            )
        assert refused.value.status == 403
        assert "written only by the tpuslice operator" in str(refused.value.body)
        kubectl(
            cluster,
            "delete",
            "tsc",
            "netpol",
            "-n",
            workload_ns,
            "--wait=true",
            "--timeout=120s",
        )
    finally:
        helm(cluster, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=2m", check=False)
        kubectl(
            cluster,
            "delete",
            "mutatingwebhookconfiguration",
            WEBHOOK_CONFIG,
            "--ignore-not-found",
            check=False,
        )
