"""The real node as a one-node single-host TPU pool: the labels and patches, without a node."""

from __future__ import annotations

import pytest

from tpusim.nodepools import TOPOLOGY_LABEL, pool_nodes
from tpusim.realtpu import KUBELET_OWNED_LABELS, capacity_patch, real_tpu_pool, tpu_node_labels


def test_labels_are_those_of_a_fake_single_host_pool_of_the_same_shape() -> None:
    pool = real_tpu_pool()
    labels = tpu_node_labels(pool)
    assert labels["cloud.google.com/gke-nodepool"] == "real-v6e-2x2"
    assert labels["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice"
    assert labels[TOPOLOGY_LABEL] == "2x2"
    assert labels["cloud.google.com/gke-accelerator-count"] == "4"
    assert labels["node.kubernetes.io/instance-type"] == "ct6e-standard-4t"
    (fake,) = pool_nodes(pool)
    fake_labels = fake["metadata"]["labels"]
    assert {k: v for k, v in fake_labels.items() if k not in KUBELET_OWNED_LABELS} == labels
    assert not KUBELET_OWNED_LABELS & labels.keys()


def test_a_multi_host_topology_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"4x4 has 16 chips.*single-host topology"):
        real_tpu_pool(topology="4x4")


def test_capacity_patch_escapes_the_slash_as_the_kubernetes_page_does() -> None:
    assert capacity_patch(4) == [
        {"op": "add", "path": "/status/capacity/google.com~1tpu", "value": "4"}
    ]
    assert capacity_patch(None) == [{"op": "remove", "path": "/status/capacity/google.com~1tpu"}]
    with pytest.raises(ValueError, match="chips must be at least 1"):
        capacity_patch(0)
