"""A host that stops answering: a drained slice's pods stay Terminating (no kubelet
confirms) and KubeRay makes no replacement while they exist. They are force-deleted
only where Kubernetes' own rules let them go (the node is gone, or NotReady and tainted
node.kubernetes.io/out-of-service); otherwise status names the host, since when, and
what clears it."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.builders import nodes_of, pod, tpu, tpuslice
from tests.support.fake_kube import FakeKube
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model.convert import node_info, pod_info
from tpuslice.model.records import Holder, NodeInfo, PodInfo, ReservationInfo, Snapshot, Taint
from tpuslice.planning.disruption import STUCK_AFTER_SECONDS, stuck_pods

NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
KEY = ("TPUSliceCluster", "ml", "llm")
OUT_OF_SERVICE = Taint("node.kubernetes.io/out-of-service", "nodeshutdown", "NoExecute")
#: the grace period ran out long enough ago: the pods are stuck
LONG_AGO = "2026-12-03T11:55:00Z"
SINCE = "2026-12-03T11:50:00Z"


def terminating(deadline: str = LONG_AGO, hosts: int = 4) -> list[PodInfo]:
    """The drained slice's pods, one per node of pool-a, all being deleted."""
    return [
        pod(
            f"llm-tpu-aaaaa-{h}",
            host=h,
            gated=False,
            pool="pool-a",
            node_name=f"pool-a-{h}",
            deleting=True,
            deletion_deadline=deadline,
        )
        for h in range(hosts)
    ]


def dead(nodes: list[NodeInfo], name: str, *taints: Taint) -> list[NodeInfo]:
    return [
        replace(n, ready=False, not_ready_since=SINCE, taints=taints) if n.name == name else n
        for n in nodes
    ]


def by_name(nodes: list[NodeInfo]) -> dict[str, NodeInfo]:
    return {n.name: n for n in nodes}


def test_pods_on_a_notready_node_without_the_taint_are_never_force_deleted() -> None:
    nodes = dead(nodes_of("pool-a"), "pool-a-2")
    stuck = stuck_pods(terminating(), by_name(nodes), NOW)
    assert stuck.force == ()
    assert stuck.message == (
        "node pool-a-2 NotReady since 2026-12-03T11:50:00Z; its pods cannot terminate until "
        "the node returns, is deleted by node repair, or is tainted "
        "node.kubernetes.io/out-of-service"
    )


def test_pods_on_an_out_of_service_node_or_a_node_gone_are_force_deleted() -> None:
    nodes = dead(nodes_of("pool-a"), "pool-a-2", OUT_OF_SERVICE)
    nodes = [n for n in nodes if n.name != "pool-a-3"]  # deleted by node repair
    stuck = stuck_pods(terminating(), by_name(nodes), NOW)
    assert [(f.name, f.node, f.why) for f in stuck.force] == [
        (
            "llm-tpu-aaaaa-2",
            "pool-a-2",
            "is NotReady and tainted node.kubernetes.io/out-of-service",
        ),
        ("llm-tpu-aaaaa-3", "pool-a-3", "is gone"),
    ]
    assert stuck.message == ""  # pods on Ready nodes are their kubelets' business


def test_the_taint_on_a_node_that_is_ready_again_forces_nothing() -> None:
    nodes = [
        replace(n, taints=(OUT_OF_SERVICE,)) if n.name == "pool-a-1" else n
        for n in nodes_of("pool-a")
    ]
    assert stuck_pods(terminating(), by_name(nodes), NOW).force == ()


def test_nothing_is_judged_within_the_grace_period_and_bound_then_a_recheck() -> None:
    nodes = [n for n in nodes_of("pool-a") if n.name != "pool-a-0"]
    deadline = NOW - timedelta(seconds=STUCK_AFTER_SECONDS - 10)
    stuck = stuck_pods(terminating(deadline.strftime("%Y-%m-%dT%H:%M:%SZ")), by_name(nodes), NOW)
    assert (stuck.force, stuck.message, stuck.recheck_in) == ((), "", 10.0)
    later = stuck_pods(
        terminating(deadline.strftime("%Y-%m-%dT%H:%M:%SZ")),
        by_name(nodes),
        NOW + timedelta(seconds=10),
    )
    assert [f.node for f in later.force] == ["pool-a-0"]


@pytest.mark.parametrize(
    "changes",
    [{"deleting": False}, {"node_name": None}, {"deletion_deadline": ""}],
)
def test_a_pod_not_deleting_unbound_or_without_deadline_is_left(changes: dict[str, Any]) -> None:
    pods = [replace(p, **changes) for p in terminating()]
    assert stuck_pods(pods, {}, NOW).force == ()
    assert stuck_pods(terminating(), {}, None).force == ()  # no clock, no judgement


def test_several_silent_hosts_name_the_first_and_count_the_rest() -> None:
    nodes = dead(dead(nodes_of("pool-a"), "pool-a-3"), "pool-a-1")
    nodes = [replace(n, not_ready_since="") if n.name == "pool-a-1" else n for n in nodes]
    message = stuck_pods(terminating(), by_name(nodes), NOW).message
    assert message.startswith("node pool-a-1 NotReady since an unknown time;")
    assert message.endswith("(1 more NotReady hosts hold pods of the slice)")


def test_the_converters_read_not_ready_since_and_the_deletion_deadline() -> None:
    ready = {"type": "Ready", "status": "Unknown", "lastTransitionTime": SINCE}
    record = node_info({"metadata": {"name": "n"}, "status": {"conditions": [ready]}})
    assert (record.ready, record.not_ready_since) == (False, SINCE)
    ready = {**ready, "status": "True"}
    healthy = node_info({"metadata": {"name": "n"}, "status": {"conditions": [ready]}})
    assert healthy.not_ready_since == ""
    meta = {"name": "p", "deletionTimestamp": LONG_AGO}
    assert pod_info({"metadata": meta}).deletion_deadline == LONG_AGO


# ---------------------------------------------------------------- the pass
def body() -> dict[str, Any]:
    return tpuslice(name="llm", uid="uid-llm", generation=1, tpu=tpu(topology="4x4", slices=1))


def held() -> ReservationInfo:
    return ReservationInfo(
        "pool-a", Holder("ml", "llm", "uid-llm", "tpu-aaaaa", 0), "Bound", uid="r"
    )


def run(snap: Snapshot) -> FakeKube:
    kube = FakeKube()
    reconciler = Reconciler(kube, lambda _: snap)
    reconciler.actuator.clock = lambda: NOW
    reconciler.status.fold_max_seconds = 0.0
    asyncio.run(reconciler.kick(KEY))
    return kube


def test_the_pass_force_deletes_only_the_pods_on_the_out_of_service_host() -> None:
    nodes = dead(nodes_of("pool-a", "pool-b"), "pool-a-2", OUT_OF_SERVICE)
    kube = run(Snapshot(body(), terminating(), nodes, [held()], None))
    assert [c[1] for c in kube.calls if c[0] == "delete-pod"] == ["llm-tpu-aaaaa-2"]
    assert kube.pod_grace == {"llm-tpu-aaaaa-2": 0}
    assert ("event", "StuckPodsForceDeleted") in kube.calls
    assert kube.status is not None
    entry = kube.status["slices"][0]
    assert entry["state"] == "Releasing"
    assert (
        "node pool-a-2 is NotReady and tainted node.kubernetes.io/out-of-service"
        in (entry["message"])
    )


def test_the_pass_says_which_host_holds_the_slice_and_deletes_nothing() -> None:
    nodes = dead(nodes_of("pool-a", "pool-b"), "pool-a-2")
    kube = run(Snapshot(body(), terminating(), nodes, [held()], None))
    assert not any(c[0] == "delete-pod" for c in kube.calls)
    assert kube.status is not None
    entry = kube.status["slices"][0]
    assert entry["message"].startswith(
        "pods terminating: node pool-a-2 NotReady since 2026-12-03T11:50:00Z;"
    )
