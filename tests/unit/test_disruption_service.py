"""A TPUSliceService counts disruptions per slice in each cluster section
(``activeCluster.slices``, ``pendingCluster.slices``), carried by cluster name across
an upgrade, besides the object totals; maintenance shows per slice there too."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from tests.support.builders import nodes_of
from tests.support.fake_kube import FakeKube
from tests.unit.test_reconcile_owned import SVC_UID, held, owned, service_body, worker_pods
from tpuslice.controller.reconciler import Reconciler
from tpuslice.controller.service import ServiceKind
from tpuslice.model.records import Drain, Snapshot, Taint
from tpuslice.planning.accounting import (
    maintenance_condition,
    walk_nodes,
    with_disruptions,
    with_maintenance,
)

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
TERMINATING = Taint("cloud.google.com/impending-node-termination", "true", "NoSchedule")


def drain(index: int, replica: str) -> Drain:
    return Drain("pool-a", replica, index, (), "pool-a-1", "is NotReady", "NodeFailure", 30)


def section(name: str, *replicas: str) -> dict[str, Any]:
    slices = [{"index": i, "replica": r, "nodePool": f"pool-{r}"} for i, r in enumerate(replicas)]
    return {"name": name, "slices": slices}


def test_each_cluster_section_counts_its_own_drains_per_slice() -> None:
    status = {
        "activeCluster": section("serve-a", "a0", "a1"),
        "pendingCluster": section("serve-b", "b0"),
    }
    out = with_disruptions(
        status,
        {},
        [drain(1, "a1"), drain(0, "b0")],
        NOW,
        {"serve-a": [drain(1, "a1")], "serve-b": [drain(0, "b0")]},
    )
    active, pending = out["activeCluster"]["slices"], out["pendingCluster"]["slices"]
    assert [e.get("disruptions") for e in active] == [None, 1]
    assert active[1]["lastDisruption"]["replica"] == "a1"
    assert pending[0]["disruptions"] == 1
    assert out["disruptions"]["total"] == 2


def test_an_upgraded_cluster_keeps_its_counts_and_a_replacement_without_drain_fails() -> None:
    before = with_disruptions(
        {"pendingCluster": section("serve-b", "b0")},
        {},
        [drain(0, "b0")],
        NOW,
        {"serve-b": [drain(0, "b0")]},
    )
    # serve-b now serves; its slice 0 got KubeRay's new replica after the drain (no
    # failure), then another one without a drain (a failure)
    promoted = with_disruptions({"activeCluster": section("serve-b", "b9")}, before, [], NOW)
    entry = promoted["activeCluster"]["slices"][0]
    assert (entry["disruptions"], entry.get("failures")) == (1, None)
    again = with_disruptions({"activeCluster": section("serve-b", "b10")}, promoted, [], NOW)
    assert again["activeCluster"]["slices"][0]["failures"] == 1
    assert again["disruptions"]["failures"] == 1


def test_maintenance_shows_in_the_cluster_sections_and_the_condition_names_the_cluster() -> None:
    nodes = [
        replace(n, labels={"cloud.google.com/scheduled-maintenance-time": "1796000000"})
        for n in nodes_of("pool-a0")
    ]
    out = with_maintenance({"activeCluster": section("serve-a", "a0")}, walk_nodes(nodes))
    assert out["activeCluster"]["slices"][0]["maintenance"]["state"] == "Scheduled"
    cond = maintenance_condition(out, {}, NOW, 1)
    assert cond is not None
    assert cond["status"] == "True"
    assert cond["message"].startswith("serve-a slice 0: maintenance scheduled at ")


def test_the_pass_counts_a_drained_active_slice_in_the_active_section() -> None:
    pods = worker_pods("serve", "TPUSliceService", "act-0", "serve-a", gated=False, pool="pool-a")
    serving = held(
        "pool-a", "act-0", uid=SVC_UID, kind="TPUSliceService", name="serve", ray_cluster="serve-a"
    )
    nodes = [
        replace(n, taints=(TERMINATING,)) if n.name == "pool-a-1" else n
        for n in nodes_of("pool-a", "pool-b")
    ]
    snap = Snapshot(
        service_body(),
        pods,
        nodes,
        [serving],
        None,
        owned=owned(SVC_UID, {"activeServiceStatus": {"rayClusterName": "serve-a"}}),
        rayclusters={"serve-a": {"state": "ready"}},
    )
    kube = FakeKube()
    reconciler = Reconciler(kube, lambda key: snap, adapter=ServiceKind())
    reconciler.actuator.clock = lambda: NOW
    reconciler.status.fold_max_seconds = 0.0
    asyncio.run(reconciler.kick(("TPUSliceService", "ml", "serve")))
    assert kube.status is not None
    entry = kube.status["activeCluster"]["slices"][0]
    assert entry["disruptions"] == 1
    assert entry["lastDisruption"]["reason"] == "Preemption"
    assert kube.status["disruptions"]["byReason"] == {"Preemption": 1}
