"""Single-host slices on GKE's usual single-host pools: each node is one slice's unit.

GKE builds a single-host TPU pool as many one-VM slices, grown node by node, so the
unit a single-host slice holds whole is a node, not the pool (fleet-facts.md §2)."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.builders import node, pod, tpu, tpuslice
from tests.support.fake_kube import FakeKube
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model.convert import reservation_info
from tpuslice.model.records import (
    Holder,
    NodeInfo,
    PodInfo,
    ReservationInfo,
    ShapeMember,
    Snapshot,
)


def single_host_pool(pool: str = "v6e-single", nodes: int = 3) -> list[NodeInfo]:
    """A GKE single-host pool: ``nodes`` TPU VMs of v6e 2x2 (4 chips each)."""
    return [node(f"gke-{pool}-{i}", pool, topology="2x2") for i in range(nodes)]


def body(name: str = "llm", uid: str = "uid-llm", slices: int = 2, **spec: Any) -> dict[str, Any]:
    out = tpuslice(
        name=name,
        uid=uid,
        generation=1,
        tpu=tpu(topology="2x2", slices=slices),
        reservation={"gang": "AllSlices"},
        **spec,
    )
    out["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:0{len(name) % 10}Z"
    return out


def workers(cluster: str = "llm", slices: int = 2) -> list[PodInfo]:
    """One gated worker per slice: KubeRay labels single-host workers with the replica
    index only, so the pod's own name names the slice."""
    return [
        pod(f"{cluster}-worker-{i}", cluster=cluster, replica=None, index=i, host=None)
        for i in range(slices)
    ]


def run(snap: Snapshot, key: tuple[str, str, str] = ("TPUSliceCluster", "ml", "llm")) -> FakeKube:
    kube = FakeKube()
    asyncio.run(Reconciler(kube, lambda _: snap).kick(key))
    return kube


def test_a_two_slice_gang_on_a_three_node_pool_holds_two_nodes_and_pins_each_pod() -> None:
    kube = run(Snapshot(body(), workers(), single_host_pool(), [], None))
    claimed = kube.claimed
    assert len(claimed) == 2
    for name, reservation in claimed.items():
        assert reservation["spec"]["node"] == name  # named after the node it holds
        assert reservation["spec"]["nodePool"] == "v6e-single"
        info = reservation_info(reservation)
        assert info.pool == name
    pinned = sorted(sel["kubernetes.io/hostname"] for sel in kube.selectors.values())
    assert pinned == sorted(claimed)
    assert all(set(sel) == {"kubernetes.io/hostname"} for sel in kube.selectors.values())


def test_a_second_gang_waits_holding_nothing_and_says_it_in_nodes() -> None:
    first = Holder("ml", "first", "uid-first", "first-worker-0", 0)
    held = [
        ReservationInfo("gke-v6e-single-0", first),
        ReservationInfo(
            "gke-v6e-single-1", Holder("ml", "first", "uid-first", "first-worker-1", 1)
        ),
    ]
    snap = Snapshot(
        body(),
        workers(),
        single_host_pool(),
        held,
        None,
        shape_members=[ShapeMember(body("first", "uid-first"), workers("first"))],
    )
    kube = run(snap)
    assert kube.claimed == {} and kube.selectors == {}
    assert kube.status is not None
    messages = [s.get("message", "") for s in kube.status["slices"]]
    assert all(s["state"] == "WaitingForCapacity" for s in kube.status["slices"])
    assert any("needs 2 nodes at once" in m for m in messages), messages
    assert not any("node pool" in m for m in messages), messages


def test_one_slice_takes_one_node_of_a_pool_with_more_nodes() -> None:
    kube = run(Snapshot(body(slices=1), workers(slices=1), single_host_pool(), [], None))
    assert len(kube.claimed) == 1
    assert len(kube.selectors) == 1


def test_status_names_the_node_and_its_pool() -> None:
    kube = run(Snapshot(body(slices=1), workers(slices=1), single_host_pool(), [], None))
    assert kube.status is not None
    (entry,) = kube.status["slices"]
    assert entry["nodePool"] == "v6e-single"
    assert entry["node"] in kube.claimed
