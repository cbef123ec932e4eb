"""Kubernetes objects -> the records the decisions and indexes keep."""

from __future__ import annotations

from tests.support import builders
from tpuslice.controller.applier import is_subset
from tpuslice.model.convert import cluster_record, node_info, pod_info, raycluster_info
from tpuslice.spec.cluster import parse_cluster


def test_pod_record_reads_kuberay_labels_gate_and_pin() -> None:
    pod = {
        "metadata": {
            "name": "w0",
            "namespace": "ml",
            "creationTimestamp": "2026-11-30T00:00:00Z",
            "labels": {
                "tpuslice.dev/cluster": "llm",
                "ray.io/worker-group-replica-name": "tpu-abcde",
                "ray.io/worker-group-replica-index": "1",
                "ray.io/replica-host-index": "3",
            },
        },
        "spec": {
            "schedulingGates": [
                {"name": "tpuslice.dev/slice-reservation"},
                {"name": "kueue.x-k8s.io/admission"},
            ],
            "nodeSelector": {"cloud.google.com/gke-nodepool": "pool-a"},
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    info = pod_info(pod)
    assert (info.replica_name, info.replica_index, info.host_index) == ("tpu-abcde", 1, 3)
    assert info.gated and info.pinned_pool == "pool-a" and info.running_ready
    assert not info.deleting


def test_node_record() -> None:
    node = {
        "metadata": {
            "name": "n0",
            "labels": {
                "cloud.google.com/gke-nodepool": "pool-a",
                "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                "cloud.google.com/gke-tpu-topology": "4x4",
            },
        },
        "spec": {"unschedulable": True},
        "status": {
            "allocatable": {"google.com/tpu": "4"},
            "conditions": [{"type": "Ready", "status": "False"}],
        },
    }
    info = node_info(node)
    assert (info.pool, info.chips, info.ready, info.schedulable) == ("pool-a", 4, False, False)


def test_cluster_record_keeps_what_the_reconcile_reads_only() -> None:
    body = {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "TPUSliceCluster",
        "metadata": {
            "name": "llm",
            "namespace": "ml",
            "uid": "u",
            "generation": 2,
            "creationTimestamp": "2026-11-30T00:00:00Z",
            "labels": {"kueue.x-k8s.io/queue-name": "tpu"},
            "managedFields": [{"manager": "kubectl"}] * 50,
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
        },
        "spec": {"tpu": {"type": "v6e"}},
        "status": {"readySlices": 1},
    }
    assert cluster_record(body) == {
        "kind": "TPUSliceCluster",
        "metadata": {
            "name": "llm",
            "namespace": "ml",
            "uid": "u",
            "generation": 2,
            "creationTimestamp": "2026-11-30T00:00:00Z",
            "labels": {"kueue.x-k8s.io/queue-name": "tpu"},
        },
        "spec": {"tpu": {"type": "v6e"}},
        "status": {"readySlices": 1},
    }


def test_raycluster_record_knows_who_set_suspend() -> None:
    ours = {
        "metadata": {
            "managedFields": [
                {"manager": "tpuslice-operator", "fieldsV1": {"f:spec": {"f:suspend": {}}}}
            ]
        }
    }
    kueue = {
        "metadata": {
            "managedFields": [{"manager": "kueue", "fieldsV1": {"f:spec": {"f:suspend": {}}}}]
        }
    }
    assert raycluster_info(ours)["ownsSuspend"] is True
    assert raycluster_info(kueue)["ownsSuspend"] is False


def test_is_subset_ignores_extra_fields_but_not_changed_or_missing_ones() -> None:
    actual = {"a": {"b": 1, "x": 2}, "l": [{"n": 1, "extra": True}]}
    assert is_subset({"a": {"b": 1}, "l": [{"n": 1}]}, actual)
    assert not is_subset({"a": {"b": 2}}, actual)
    assert not is_subset({"a": {"c": 1}}, actual)
    assert not is_subset({"l": [{"n": 1}, {"n": 2}]}, actual)


def test_node_record_reads_capacity_type_and_topology_block() -> None:
    from tpuslice.model.records import CapacityType

    def node(**labels: str) -> dict[str, object]:
        return {"metadata": {"name": "n", "labels": labels}, "status": {}}

    cases = [
        ({}, CapacityType.ON_DEMAND),
        ({"cloud.google.com/reservation-name": "res-1"}, CapacityType.RESERVATION),
        ({"cloud.google.com/gke-spot": "true"}, CapacityType.SPOT),
        ({"cloud.google.com/gke-spot": "false"}, CapacityType.ON_DEMAND),
        ({"cloud.google.com/gke-preemptible": "true"}, CapacityType.SPOT),
        ({"cloud.google.com/gke-flex-start": "true"}, CapacityType.FLEX_START),
        ({"cloud.google.com/gke-provisioning": "flex-start"}, CapacityType.FLEX_START),
        ({"cloud.google.com/reservation-name": ""}, CapacityType.ON_DEMAND),
    ]
    for labels, expected in cases:
        assert node_info(node(**labels)).capacity_type == expected, labels
    info = node_info(
        node(
            **{
                "cloud.google.com/gce-topology-block": "blk-1",
                "cloud.google.com/gce-topology-subblock": "sub-2",
            }
        )
    )
    assert (info.block, info.subblock) == ("blk-1", "sub-2")
    assert (node_info(node()).block, node_info(node()).subblock) == (None, None)


def test_the_queue_name_label_reaches_the_pass_through_the_record() -> None:
    """The pass parses the index's record, not the body: the object's own Kueue label
    (spec.kueue absent) must survive the record."""
    body = builders.tpuslice(uid="u")
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "tpu"}
    spec = parse_cluster(cluster_record(body))
    assert spec.kueue is not None and spec.kueue.queue_name == "tpu"
