"""The fake GKE nodes carry exactly GKE's TPU labels, taint and capacity."""

from __future__ import annotations

import pytest

from tpusim.nodepools import (
    KWOK_ANNOTATION,
    POOL_ANNOTATION,
    CPUPool,
    TPUPool,
    default_pools,
    parse_pool_spec,
    pool_from_dict,
    pool_names,
    pool_nodes,
    topology_chips,
)


@pytest.mark.parametrize(
    ("tpu_type", "topology", "nodes", "accelerator", "machine"),
    [
        ("v6e", "4x4", 4, "tpu-v6e-slice", "ct6e-standard-4t"),
        ("v5e", "2x4", 2, "tpu-v5-lite-podslice", "ct5lp-hightpu-4t"),
        ("v4", "2x2x2", 2, "tpu-v4-podslice", "ct4p-hightpu-4t"),
        ("v5p", "2x2x4", 4, "tpu-v5p-slice", "ct5p-hightpu-4t"),
        ("tpu7x", "2x2x2", 2, "tpu7x", "tpu7x-standard-4t"),
    ],
)
def test_tpu_pool_labels_taint_capacity(
    tpu_type: str, topology: str, nodes: int, accelerator: str, machine: str
) -> None:
    pool = TPUPool("p", tpu_type, topology, nodes)
    made = pool_nodes(pool)
    assert [n["metadata"]["name"] for n in made] == [f"gke-tpusim-p-{i}" for i in range(nodes)]
    for node in made:
        labels = node["metadata"]["labels"]
        assert labels["cloud.google.com/gke-nodepool"] == "p"
        assert labels["cloud.google.com/gke-tpu-accelerator"] == accelerator
        assert labels["cloud.google.com/gke-tpu-topology"] == topology
        assert labels["cloud.google.com/gke-accelerator-count"] == "4"
        assert labels["node.kubernetes.io/instance-type"] == machine
        assert labels["kubernetes.io/hostname"] == node["metadata"]["name"]
        assert "cloud.google.com/gke-spot" not in labels
        assert node["spec"]["taints"] == [
            {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}
        ]
        assert node["status"]["capacity"]["google.com/tpu"] == "4"
        assert node["status"]["allocatable"]["google.com/tpu"] == "4"
        annotations = node["metadata"]["annotations"]
        assert annotations[KWOK_ANNOTATION[0]] == KWOK_ANNOTATION[1]
        assert annotations[POOL_ANNOTATION] == "p"


def test_cpu_pool_has_no_taint_and_no_tpu() -> None:
    (node,) = pool_nodes(CPUPool("cpu", 1))
    assert "taints" not in node["spec"]
    assert "google.com/tpu" not in node["status"]["capacity"]
    assert "cloud.google.com/gke-tpu-accelerator" not in node["metadata"]["labels"]
    assert node["metadata"]["labels"]["cloud.google.com/gke-nodepool"] == "cpu"


def test_optional_gke_labels() -> None:
    pool = TPUPool("s", "v6e", "2x2", 1, spot=True, reservation="res-1", extra_labels={"a": "b"})
    labels = pool_nodes(pool)[0]["metadata"]["labels"]
    assert labels["cloud.google.com/gke-spot"] == "true"
    assert labels["cloud.google.com/reservation-name"] == "res-1"
    assert labels["a"] == "b"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tpu_type": "v9"}, "unknown TPU type"),
        ({"nodes": 3}, "needs 4 hosts"),
        ({"chips_per_node": 2}, "hosts have"),
        ({"topology": "4xq"}, "bad topology"),
    ],
)
def test_invalid_pools_are_rejected(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"name": "p", "tpu_type": "v6e", "topology": "4x4", "nodes": 4}
    with pytest.raises(ValueError, match=message):
        TPUPool(**{**base, **kwargs})  # type: ignore[arg-type]


def test_single_host_pool_may_have_many_nodes() -> None:
    assert len(pool_nodes(TPUPool("s", "v5e", "2x4", 3, chips_per_node=8))) == 3


def test_topology_chips() -> None:
    assert topology_chips("4x4") == 16
    assert topology_chips("2x2x2") == 8


def test_parse_and_dict_forms_agree() -> None:
    assert parse_pool_spec("a:v6e:4x4:4") == TPUPool("a", "v6e", "4x4", 4)
    assert parse_pool_spec("c:cpu:2") == CPUPool("c", 2)
    assert pool_from_dict({"name": "a", "tpuType": "v6e", "topology": "4x4", "nodes": 4}) == (
        TPUPool("a", "v6e", "4x4", 4)
    )
    with pytest.raises(ValueError, match="unknown node pool fields"):
        pool_from_dict({"name": "a", "nodes": 1, "bogus": 1})
    with pytest.raises(ValueError, match="bad pool spec"):
        parse_pool_spec("nonsense")


def test_default_pools_cover_the_issue() -> None:
    pools = default_pools()
    names = pool_names(pools)
    assert len(set(names)) == len(names)
    v6e = [
        p for p in pools if isinstance(p, TPUPool) and p.tpu_type == "v6e" and p.topology == "4x4"
    ]
    assert len(v6e) >= 2 and all(p.nodes == 4 for p in v6e)
    assert any(isinstance(p, TPUPool) and p.tpu_type == "v5e" and p.nodes == 2 for p in pools)
    assert any(isinstance(p, TPUPool) and p.tpu_type == "v4" for p in pools)
    assert any(isinstance(p, CPUPool) for p in pools)
    with pytest.raises(ValueError, match="duplicate"):
        pool_names([CPUPool("x", 1), CPUPool("x", 2)])
