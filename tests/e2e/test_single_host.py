"""Single-host slices on a GKE-shaped single-host pool (3 nodes of v6e 2x2, as GKE builds
single-host TPU pools: many one-VM slices per pool): each slice holds one node.

Under an invariant watch sampled throughout: no two of our slices on one node, and no
pod of a gang released before the whole gang holds its nodes."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.helpers import E2ECluster, tpu_pod
from tests.e2e.operator_support import (
    InvariantWatch,
    apply,
    delete_tsc,
    event_reasons,
    get_tsc,
    kubectl,
    reservations,
    slice_pods,
    tsc,
    wait_condition,
)
from tpusim import kube
from tpusim.nodepools import TPUPool
from tpusim.operator_process import OperatorProcess

POOL = "v6e-2x2-single"
TIMEOUT_S = 240  # KubeRay, the scheduler and the operator share 2 cores with the test


@pytest.fixture
def single_host_pool(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> Iterator[list[str]]:
    nodes = kube.create_pool(cluster.api, TPUPool(POOL, "v6e", "2x2", nodes=3))
    kube.wait_nodes_ready(cluster.api, nodes)
    yield list(nodes)
    for plural in ("tpusliceclusters", "tpuslicejobs", "tpusliceservices"):
        kubectl(
            cluster, "delete", plural, "--all", "-n", namespace, "--wait=true", "--timeout=120s",
            check=False,
        )  # fmt: skip
    kube.wait_for(
        lambda: not cluster.core.list_namespaced_pod(namespace).items,
        timeout_s=120,
        what=f"pods of {namespace} gone",
    )
    kube.delete_pool(cluster.api, POOL)


def held_by(cluster: E2ECluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        r
        for r in reservations(cluster)
        if r["spec"]["holder"]["namespace"] == namespace and r["spec"]["holder"]["name"] == name
    ]


def gang(name: str) -> dict[str, Any]:
    return tsc(name, topology="2x2", slices=2, reservation={"gang": "AllSlices"})


def test_two_single_host_gangs_share_a_three_node_pool_in_turn(
    cluster: E2ECluster, namespace: str, single_host_pool: list[str]
) -> None:
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, gang("first"))
        wait_condition(cluster, namespace, "first", "Ready", "True", timeout_s=TIMEOUT_S)
        held = held_by(cluster, namespace, "first")
        assert len(held) == 2, held
        for r in held:  # a node each, named after it, in the single-host pool
            assert r["metadata"]["name"] == r["spec"]["node"], r
            assert r["spec"]["nodePool"] == POOL
            assert r["spec"]["node"] in single_host_pool
        node_of = {r["spec"]["holder"]["replicaName"]: r["spec"]["node"] for r in held}
        workers = [
            p
            for p in slice_pods(cluster, namespace, "first")
            if (p.metadata.labels or {}).get("ray.io/node-type") == "worker"
        ]
        assert len(workers) == 2
        for pod in workers:
            assert (
                pod.spec.node_selector.get("kubernetes.io/hostname") == node_of[pod.metadata.name]
            )
            assert pod.spec.node_name == node_of[pod.metadata.name]

        # a second gang of two: one node is free, so it waits holding nothing
        apply(cluster, namespace, gang("second"))

        def waits_in_nodes() -> str | None:
            slices = (get_tsc(cluster, namespace, "second").get("status") or {}).get("slices")
            messages = [s.get("message", "") for s in slices or []]
            states = {s.get("state") for s in slices or []}
            if len(messages) == 2 and states == {"WaitingForCapacity"}:
                return str(messages[0])
            return None

        message = kube.wait_for(
            waits_in_nodes, timeout_s=TIMEOUT_S, what="the second gang waiting for nodes"
        )
        assert "node" in message and "node pool" not in message, message
        assert held_by(cluster, namespace, "second") == []

        # the first gang leaves: the second gets two nodes and becomes Ready
        delete_tsc(cluster, namespace, "first")
        wait_condition(cluster, namespace, "second", "Ready", "True", timeout_s=TIMEOUT_S)
        assert len(held_by(cluster, namespace, "second")) == 2
    watch.check()


def running_on_held_nodes(
    cluster: E2ECluster, namespace: str, name: str, slices: int
) -> list[str] | None:
    """The nodes held by ``name``'s ``slices`` single-host slices once each has its worker
    Running, released and pinned to that node; None before. (A TPUSliceService counts
    only its active RayCluster as ready, and Serve never starts on these fake nodes.)"""
    nodes = [
        r["spec"].get("node")
        for r in reservations(cluster)
        if (r["spec"]["holder"]["namespace"], r["spec"]["holder"]["name"]) == (namespace, name)
    ]
    if len(nodes) != slices or not all(nodes):
        return None
    workers = cluster.core.list_namespaced_pod(
        namespace, label_selector="ray.io/node-type=worker"
    ).items
    running = {
        p.spec.node_name
        for p in workers
        if p.status.phase == "Running"
        and not p.spec.scheduling_gates
        and (p.spec.node_selector or {}).get("kubernetes.io/hostname") == p.spec.node_name
    }
    return [str(n) for n in nodes] if set(nodes) <= running else None


def test_a_job_and_a_service_on_single_host_slices_each_hold_nodes(
    cluster: E2ECluster, namespace: str, single_host_pool: list[str]
) -> None:
    """KubeRay's single-host TPU samples (a RayService of v6e 2x2 slices, as the vLLM
    one) on a GKE single-host pool: the job's two slices and the service's one hold
    three nodes of the one pool, each pinned to its own."""
    job = tsc("train", topology="2x2", slices=2)
    job["kind"] = "TPUSliceJob"
    job["spec"]["job"] = {"entrypoint": "python -c 'print(1)'"}
    service = tsc("serve", topology="2x2", slices=1)
    service["kind"] = "TPUSliceService"
    service["spec"]["serve"] = {
        "serveConfigV2": "applications:\n- name: llm\n  import_path: serve_llm:app\n"
    }
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, job)
        apply(cluster, namespace, service)
        for name, slices in (("train", 2), ("serve", 1)):
            kube.wait_for(
                functools.partial(running_on_held_nodes, cluster, namespace, name, slices),
                timeout_s=TIMEOUT_S,
                what=f"{name}'s {slices} single-host slices running on the nodes they hold",
            )
        held = [r for r in reservations(cluster) if r["spec"]["holder"]["namespace"] == namespace]
        assert sorted(r["spec"]["holder"]["name"] for r in held) == ["serve", "train", "train"]
        assert sorted(r["spec"]["node"] for r in held) == sorted(single_host_pool)
    watch.check()


def test_a_slice_whose_node_is_taken_by_a_foreign_pod_moves_to_another_node(
    cluster: E2ECluster, namespace: str, single_host_pool: list[str]
) -> None:
    """A pod the operator did not place (no tpuslice label, bound by spec.nodeName)
    holds all 4 chips of one node. With the other two nodes cordoned the slice can only
    claim that node; once they are back, the slice's pod has been Unschedulable there
    for 60 s, the slice moves, and the cluster ends Ready on another node, never the
    busy one, which status.busyNodes names."""
    busy, *others = single_host_pool
    foreign = tpu_pod("foreign", None, 4, nodeName=busy)
    cluster.core.create_namespaced_pod(namespace, foreign)
    for name in others:
        kube.cordon(cluster.api, name)
    try:
        apply(cluster, namespace, tsc("moves", topology="2x2"))

        def pinned_and_unschedulable() -> bool:
            held = held_by(cluster, namespace, "moves")
            workers = [
                p
                for p in slice_pods(cluster, namespace, "moves")
                if (p.spec.node_selector or {}).get("kubernetes.io/hostname") == busy
            ]
            conds = [
                c
                for p in workers
                for c in p.status.conditions or []
                if c.type == "PodScheduled" and c.reason == "Unschedulable"
            ]
            return [r["spec"]["node"] for r in held] == [busy] and bool(conds)

        kube.wait_for(
            pinned_and_unschedulable,
            timeout_s=TIMEOUT_S,
            what=f"the slice pinned to the busy node {busy} and Unschedulable",
        )
    finally:
        for name in others:
            kube.cordon(cluster.api, name, unschedulable=False)
    try:
        wait_condition(cluster, namespace, "moves", "Ready", "True", timeout_s=TIMEOUT_S)
        held = held_by(cluster, namespace, "moves")
        assert [r["spec"]["node"] for r in held] != [busy], held
        assert len(held) == 1 and held[0]["spec"]["node"] in others, held
        for pod in slice_pods(cluster, namespace, "moves"):
            assert pod.spec.node_name != busy, pod.metadata.name
        status = get_tsc(cluster, namespace, "moves")["status"]
        assert [b["node"] for b in status.get("busyNodes") or []] == [busy], status
        assert "SliceMovedOffBusyNode" in event_reasons(cluster, namespace)
    finally:
        cluster.core.delete_namespaced_pod("foreign", namespace, grace_period_seconds=0)
