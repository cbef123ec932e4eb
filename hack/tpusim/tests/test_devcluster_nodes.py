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
        assert labels["cloud.google.com/gke-provisioning"] == "standard"
        assert not any(k.startswith("cloud.google.com/gce-topology-") for k in labels)
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


CAPACITY_LABELS = (
    "cloud.google.com/gke-spot",
    "cloud.google.com/reservation-name",
    "cloud.google.com/gke-flex-start",
)


@pytest.mark.parametrize(
    ("kwargs", "kind", "wanted"),
    [
        ({}, "on-demand", {"cloud.google.com/gke-provisioning": "standard"}),
        (
            {"spot": True},
            "spot",
            {"cloud.google.com/gke-spot": "true", "cloud.google.com/gke-provisioning": "spot"},
        ),
        (
            {"reservation": "tpu-res-1"},
            "reservation",
            {
                "cloud.google.com/reservation-name": "tpu-res-1",
                "cloud.google.com/gke-provisioning": "standard",
            },
        ),
        (
            {"flex_start": True},
            "flex-start",
            {
                "cloud.google.com/gke-flex-start": "true",
                "cloud.google.com/gke-provisioning": "flex-start",
            },
        ),
    ],
)
def test_capacity_type_labels(kwargs: dict[str, object], kind: str, wanted: dict[str, str]) -> None:
    """GKE's labels for how the VMs were provisioned, on every node of a multi-host pool;
    none of the other capacity types' labels, and never a taint beyond the TPU one (GKE
    taints Spot nodes only in Autopilot or auto-provisioned pools)."""
    pool = TPUPool("p", "v6e", "4x4", 4, **kwargs)  # type: ignore[arg-type]
    assert pool.capacity_type == kind
    for node in pool_nodes(pool):
        labels = node["metadata"]["labels"]
        assert {k: labels[k] for k in wanted} == wanted
        assert {k for k in CAPACITY_LABELS if k in labels} == set(wanted) & set(CAPACITY_LABELS)
        assert node["spec"]["taints"] == [
            {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}
        ]


def test_topology_block_subblock_and_host_labels() -> None:
    """Every VM of a pool in one block and sub-block; each its own host id, stable across
    runs and distinct between nodes and pools."""
    pool = TPUPool("p", "v6e", "4x4", 4, topology_block="b-1", topology_subblock="sb-2")
    nodes = [n["metadata"]["labels"] for n in pool_nodes(pool)]
    assert {n["cloud.google.com/gce-topology-block"] for n in nodes} == {"b-1"}
    assert {n["cloud.google.com/gce-topology-subblock"] for n in nodes} == {"sb-2"}
    hosts = [n["cloud.google.com/gce-topology-host"] for n in nodes]
    assert len(set(hosts)) == 4 and all(h and "/" not in h for h in hosts)
    again = [
        n["metadata"]["labels"]["cloud.google.com/gce-topology-host"] for n in pool_nodes(pool)
    ]
    assert again == hosts
    other = TPUPool("q", "v6e", "4x4", 4, topology_block="b-1")
    other_labels = [n["metadata"]["labels"] for n in pool_nodes(other)]
    assert not {n["cloud.google.com/gce-topology-host"] for n in other_labels} & set(hosts)
    assert all("cloud.google.com/gce-topology-subblock" not in n for n in other_labels)


def test_extra_labels_come_last() -> None:
    pool = TPUPool("s", "v6e", "2x2", 1, spot=True, extra_labels={"a": "b"})
    labels = pool_nodes(pool)[0]["metadata"]["labels"]
    assert labels["cloud.google.com/gke-spot"] == "true"
    assert labels["a"] == "b"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tpu_type": "v9"}, "unknown TPU type"),
        ({"nodes": 3}, "needs 4 hosts"),
        ({"chips_per_node": 2}, "hosts have"),
        ({"topology": "4xq"}, "bad topology"),
        ({"spot": True, "reservation": "r"}, "one capacity type, not spot and reservation"),
        ({"spot": True, "flex_start": True}, "one capacity type"),
        ({"reservation": "r", "flex_start": True}, "one capacity type"),
        ({"reservation": ""}, "empty reservation name"),
        ({"topology_subblock": "s"}, "sub-block lies within a block"),
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


def test_capacity_and_topology_in_both_forms() -> None:
    wanted = TPUPool("a", "v6e", "4x4", 4, spot=True, topology_block="b", topology_subblock="s")
    assert parse_pool_spec("a:v6e:4x4:4,spot,block=b,subblock=s") == wanted
    raw = {"name": "a", "tpuType": "v6e", "topology": "4x4", "nodes": 4, "spot": True}
    assert pool_from_dict({**raw, "topologyBlock": "b", "topologySubblock": "s"}) == wanted
    assert parse_pool_spec("r:v5e:2x4:2,reservation=res-a").reservation == "res-a"
    assert parse_pool_spec("f:v6e:2x4:2:4,flex-start").flex_start
    assert pool_from_dict({**raw, "spot": False, "flexStart": True}).flex_start
    bad_specs = ["a:v6e:4x4:4,preemptible", "a:v6e:4x4:4,reservation", "c:cpu:2,spot"]
    for bad in [*bad_specs, "a:v6e:4x4:4,spot,flex-start"]:
        with pytest.raises(ValueError, match="bad pool spec"):
            parse_pool_spec(bad)


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
