"""Fidelity of the local simulated GKE cluster: the real components do the real thing.

Each test proves one behaviour the operator will rely on is produced by the
real scheduler, garbage collector, API server or KubeRay, not by the harness.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import ApiException

from tests.e2e.helpers import (
    V6E_4X4,
    E2ECluster,
    condition,
    create_raycluster,
    holds,
    multihost_raycluster,
    pod_ready,
    pod_summary,
    terminating_pod,
    tpu_pod,
    wait_raycluster_ready,
    worker_pods,
)
from tests.support.builders import tpuslice
from tpusim import kube

pytestmark = pytest.mark.e2e


def _node_labels(cluster: E2ECluster, node_name: str) -> dict[str, str]:
    labels: dict[str, str] = cluster.core.read_node(node_name).metadata.labels
    return labels


def test_multihost_v6e_raycluster_becomes_ready_on_matching_tpu_nodes(
    cluster: E2ECluster, namespace: str
) -> None:
    create_raycluster(cluster, namespace, multihost_raycluster("v6e", replicas=2))
    status = wait_raycluster_ready(cluster, namespace, "v6e")["status"]
    assert status["state"] == "ready"

    workers = worker_pods(cluster, namespace, "v6e")
    assert len(workers) == 8  # 2 replicas x numOfHosts 4
    nodes = set()
    for pod in workers:
        assert pod_ready(pod), pod.metadata.name
        labels = _node_labels(cluster, pod.spec.node_name)
        for key, value in V6E_4X4.items():
            assert labels[key] == value, (pod.metadata.name, pod.spec.node_name)
        assert labels["cloud.google.com/gke-accelerator-count"] == "4"
        nodes.add(pod.spec.node_name)
    assert len(nodes) == 8, "each 4-chip pod needs a whole 4-chip host"
    # Multi-host indexing is on: 2 replicas x host indexes 0..3.
    replicas = {p.metadata.labels["ray.io/worker-group-replica-index"] for p in workers}
    hosts = {p.metadata.labels["ray.io/replica-host-index"] for p in workers}
    assert replicas == {"0", "1"} and hosts == {"0", "1", "2", "3"}

    (head,) = cluster.core.list_namespaced_pod(
        namespace, label_selector="ray.io/cluster=v6e,ray.io/node-type=head"
    ).items
    assert pod_ready(head)
    assert "cloud.google.com/gke-tpu-accelerator" not in _node_labels(cluster, head.spec.node_name)


def test_pod_asking_for_more_chips_than_any_node_stays_pending(
    cluster: E2ECluster, namespace: str
) -> None:
    cluster.core.create_namespaced_pod(namespace, tpu_pod("too-big", V6E_4X4, chips=8))

    def unschedulable() -> Any:
        pod = cluster.core.read_namespaced_pod("too-big", namespace)
        cond = condition(pod, "PodScheduled")
        return pod if cond is not None and cond.reason == "Unschedulable" else None

    pod = kube.wait_for(unschedulable, timeout_s=60, what="PodScheduled=False/Unschedulable")
    cond = condition(pod, "PodScheduled")
    assert pod.status.phase == "Pending"
    assert cond.status == "False"
    assert "Insufficient google.com/tpu" in cond.message
    assert pod.spec.node_name is None


def test_deleting_raycluster_removes_its_pods(cluster: E2ECluster, namespace: str) -> None:
    create_raycluster(cluster, namespace, multihost_raycluster("gone", replicas=1))
    wait_raycluster_ready(cluster, namespace, "gone")
    assert len(worker_pods(cluster, namespace, "gone")) == 4

    cluster.custom.delete_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", "gone")

    def no_pods() -> bool:
        pods = cluster.core.list_namespaced_pod(namespace, label_selector="ray.io/cluster=gone")
        return not pods.items

    kube.wait_for(
        no_pods,
        timeout_s=90,
        what="garbage collector + KWOK to remove the RayCluster's pods",
        describe=lambda: pod_summary(cluster, namespace),
    )


def test_gated_pod_schedules_after_one_patch_adding_selector_and_removing_gate(
    cluster: E2ECluster, namespace: str
) -> None:
    gate = [{"name": "tpuslice.dev/reservation"}]
    cluster.core.create_namespaced_pod(namespace, tpu_pod("gated", None, 4, schedulingGates=gate))

    def gated() -> Any:
        pod = cluster.core.read_namespaced_pod("gated", namespace)
        cond = condition(pod, "PodScheduled")
        return pod if cond is not None and cond.reason == "SchedulingGated" else None

    pod = kube.wait_for(gated, timeout_s=30, what="PodScheduled=False/SchedulingGated")
    assert pod.spec.node_name is None and pod.status.phase == "Pending"

    v5e = {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "2x4",
        "cloud.google.com/gke-nodepool": "v5e-2x4",
    }
    patch = [
        {"op": "add", "path": "/spec/nodeSelector", "value": v5e},
        {"op": "remove", "path": "/spec/schedulingGates"},
    ]
    cluster.core.patch_namespaced_pod("gated", namespace, patch)

    def running() -> Any:
        pod = cluster.core.read_namespaced_pod("gated", namespace)
        return pod if pod.spec.node_name and pod_ready(pod) else None

    pod = kube.wait_for(running, timeout_s=60, what="gated pod scheduled and running")
    labels = _node_labels(cluster, pod.spec.node_name)
    for key, value in v5e.items():
        assert labels[key] == value


def test_kuberay_replaces_a_whole_replica_when_one_pod_is_deleted(
    cluster: E2ECluster, namespace: str
) -> None:
    create_raycluster(cluster, namespace, multihost_raycluster("heal", replicas=2))
    wait_raycluster_ready(cluster, namespace, "heal")

    def replica(index: str) -> list[Any]:
        return [
            p
            for p in worker_pods(cluster, namespace, "heal")
            if p.metadata.labels.get("ray.io/worker-group-replica-index") == index
        ]

    old = replica("0")
    assert len(old) == 4
    old_name = old[0].metadata.labels["ray.io/worker-group-replica-name"]
    old_uids = {p.metadata.uid for p in old}
    other = {p.metadata.uid for p in replica("1")}
    cluster.core.delete_namespaced_pod(old[0].metadata.name, namespace)

    def replaced() -> bool:
        pods = replica("0")
        names = {p.metadata.labels["ray.io/worker-group-replica-name"] for p in pods}
        return (
            len(pods) == 4
            and names.isdisjoint({old_name})
            and len(names) == 1
            and not {p.metadata.uid for p in pods} & old_uids
            and all(pod_ready(p) for p in pods)
        )

    kube.wait_for(
        replaced,
        timeout_s=120,
        what="replica 0 recreated whole under a new replica name",
        describe=lambda: pod_summary(cluster, namespace),
    )
    # The untouched replica kept its pods.
    assert {p.metadata.uid for p in replica("1")} == other


def test_node_helpers_notready_cordon_delete(cluster: E2ECluster, namespace: str) -> None:
    """The harness's node faults are what the control plane sees as such."""
    api = cluster.api
    name = "gke-tpusim-v4-2x2x2-1"
    kube.set_node_not_ready(api, name)
    try:
        kube.wait_for(
            lambda: any(
                t.key == "node.kubernetes.io/not-ready"
                for t in cluster.core.read_node(name).spec.taints or []
            ),
            timeout_s=60,
            what="node lifecycle controller taints the NotReady node",
        )
        assert not kube.node_ready(cluster.core.read_node(name))
    finally:
        kube.restore_node(api, name)
    kube.wait_nodes_ready(api, [name])

    kube.cordon(api, name)
    try:
        assert cluster.core.read_node(name).spec.unschedulable
    finally:
        kube.cordon(api, name, unschedulable=False)


def _pod_on_dead_node(cluster: E2ECluster, namespace: str, node: str) -> str:
    """A running pod on ``node``; the node made NotReady; the pod deleted (left hanging)."""
    api = cluster.api
    cluster.core.create_namespaced_pod(namespace, tpu_pod("stuck", None, 4, nodeName=node))
    kube.wait_for(
        lambda: pod_ready(cluster.core.read_namespaced_pod("stuck", namespace)),
        timeout_s=60,
        what="pod running on its node",
    )
    kube.set_node_not_ready(api, node)
    cluster.core.delete_namespaced_pod("stuck", namespace)
    # a dead kubelet finishes nothing: the pod stays Terminating
    holds(
        lambda: terminating_pod(cluster, namespace, "stuck"),
        seconds=8,
        what="deletion hanging on the NotReady node",
    )
    return "stuck"


def test_deletion_on_a_notready_node_hangs_until_the_node_is_restored(
    cluster: E2ECluster, namespace: str
) -> None:
    node = "gke-tpusim-v4-2x2x2-0"
    try:
        pod = _pod_on_dead_node(cluster, namespace, node)
    finally:
        kube.restore_node(cluster.api, node)
    kube.wait_for(
        lambda: (
            not cluster.core.list_namespaced_pod(
                namespace, field_selector=f"metadata.name={pod}"
            ).items
        ),
        timeout_s=30,
        what="KWOK finishes the deletion once the node is back",
    )
    kube.wait_nodes_ready(cluster.api, [node])


def test_deletion_on_a_notready_node_hangs_until_the_node_is_deleted(
    cluster: E2ECluster, namespace: str
) -> None:
    from tpusim.nodepools import default_pools, pool_nodes

    node = "gke-tpusim-v4-2x2x2-1"
    (body,) = [n for p in default_pools() for n in pool_nodes(p) if n["metadata"]["name"] == node]
    try:
        pod = _pod_on_dead_node(cluster, namespace, node)
        kube.delete_node(cluster.api, node)  # GKE removes the VM
        kube.wait_for(
            lambda: (
                not cluster.core.list_namespaced_pod(
                    namespace, field_selector=f"metadata.name={pod}"
                ).items
            ),
            timeout_s=150,
            what="the pod garbage collector removes the orphan of the deleted node",
        )
    finally:
        try:
            cluster.core.read_node(node)
            kube.restore_node(cluster.api, node)
        except ApiException as exc:
            if exc.status != 404:
                raise
            cluster.core.create_node(body)
    kube.wait_nodes_ready(cluster.api, [node])


def test_tpuslicecluster_crd_installs_and_api_server_enforces_cel(
    cluster: E2ECluster, namespace: str, tpuslice_crds: None
) -> None:
    def tsc(name: str, tpu: dict[str, Any], ray: str = "2.54.0", **spec: Any) -> dict[str, Any]:
        return tpuslice(name=name, namespace=None, tpu=tpu, ray=ray, **spec)

    def create(body: dict[str, Any]) -> Any:
        return cluster.custom.create_namespaced_custom_object(
            "tpuslice.dev", "v1alpha1", namespace, "tpusliceclusters", body
        )

    v6e = {"type": "v6e", "topology": "4x4"}
    good = create(tsc("good", {"type": "v6e", "topology": "4x4", "slices": 2}))
    # schema defaults applied (gang has none: it follows spec.tpu.slices)
    assert good["spec"]["reservation"] == {"policy": "NodePool", "priority": 0}

    bad = [
        (tsc("x" * 54, {"type": "v6e", "topology": "4x4"}), "at most 53 characters"),
        (tsc("flat", {"type": "v6e", "topology": "2x2x2"}), "v5e and v6e slices are 2-dimensional"),
        (tsc("cube", {"type": "v4", "topology": "4x4"}), "v4 slices are 3-dimensional"),
        (tsc("hosts", {"type": "v6e", "topology": "4x4", "chipsPerHost": 8}), "does not fit"),
        (tsc("old", {"type": "v6e", "topology": "4x4"}, ray="2.53.0"), "at least 2.54.0"),
        (
            tsc("chips", v6e, worker={"resources": {"google.com/tpu": 4}}),
            "must not set google.com/tpu",
        ),
    ]
    for body, message in bad:
        with pytest.raises(ApiException) as err:
            create(body)
        assert err.value.status == 422, (body["metadata"]["name"], err.value.body)
        assert message in str(err.value.body), (body["metadata"]["name"], err.value.body)

    # Transition rule: the slice shape is immutable. The operator writes the object too
    # (finalizer, status), so a replace from a stale read is a 409 first: read again.
    for _ in range(10):
        live = cluster.custom.get_namespaced_custom_object(
            "tpuslice.dev", "v1alpha1", namespace, "tpusliceclusters", "good"
        )
        live["spec"]["tpu"]["topology"] = "2x4"
        with pytest.raises(ApiException) as err:
            cluster.custom.replace_namespaced_custom_object(
                "tpuslice.dev", "v1alpha1", namespace, "tpusliceclusters", "good", live
            )
        if err.value.status != 409:
            break
    assert err.value.status == 422 and "immutable" in str(err.value.body)

    # SliceReservation: named after its node pool.
    reservation = {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "SliceReservation",
        "metadata": {"name": "not-the-pool"},
        "spec": {
            "nodePool": "v6e-4x4-a",
            "holder": {"namespace": namespace, "name": "good", "uid": "u", "replicaName": "r"},
        },
    }
    with pytest.raises(ApiException) as err:
        cluster.custom.create_cluster_custom_object(
            "tpuslice.dev", "v1alpha1", "slicereservations", reservation
        )
    assert err.value.status == 422
    assert "metadata.name must equal spec.node" in str(err.value.body)
