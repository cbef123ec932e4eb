"""Slice-level disruption on fake pools with GKE's signals (hack/tpusim maintenance):
a pool with maintenance scheduled is avoided when another exists; a termination taint on
one node of a held pool drains the whole slice in one pass (never a torn slice), the
pool is quarantined until the taint goes, the replacement lands on a spare pool, and
status and the metric count the disruption apart from failures; a Spot notice counts
as a preemption; a host that stops answering is named in status until it is tainted
out-of-service. (An UNHEALTHY tpu7x partition is unit-tested only: the operator forms no
GKE Slice yet, so no partition node is ever claimable; tests/unit/test_disruption_planning.py.)"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import (
    InvariantWatch,
    Watch,
    apply,
    describe,
    event_reasons,
    get_tsc,
    held_by,
    kubectl,
    slice_pods,
    tsc,
    wait_condition,
)
from tpusim import kube
from tpusim.nodepools import TPUPool
from tpusim.operator_process import OperatorProcess

POOLS = ("v6e-dis-a", "v6e-dis-b", "v6e-dis-c")
SPOT = "v6e-dis-spot"
TIMEOUT_S = 240  # KubeRay, the scheduler and the operator share 2 cores with the test
HOUR = 3600


@dataclass
class TornSliceWatch(Watch):
    """A slice is torn when some of its pods are being deleted while others of the same
    replica live on: the operator deletes all of a drained slice's pods in one pass, so
    a torn slice may show in one sample (the deletes of one pass are a few ms apart)
    but never persist."""

    def sample(self) -> tuple[list[str], set[str]]:
        by_replica: dict[str, list[bool]] = defaultdict(list)
        for pod in self.cluster.core.list_namespaced_pod(
            self.namespace, label_selector="ray.io/worker-group-replica-name"
        ).items:
            replica = pod.metadata.labels["ray.io/worker-group-replica-name"]
            by_replica[replica].append(pod.metadata.deletion_timestamp is not None)
        torn = {
            f"slice {replica} torn: {sum(states)} of {len(states)} pods deleting"
            for replica, states in by_replica.items()
            if any(states) and not all(states)
        }
        return [], torn


@pytest.fixture
def pools(cluster: E2ECluster, namespace: str, operator: OperatorProcess) -> Iterator[list[str]]:
    """The test's v6e 4x4 pools; every other pool of that shape (the cluster's default
    ones) cordoned meanwhile, so the tests know which pools are free."""
    made = [TPUPool(name, "v6e", "4x4", nodes=4) for name in POOLS]
    made.append(TPUPool(SPOT, "v6e", "4x4", nodes=4, spot=True))
    others = [
        n.metadata.name
        for n in kube.harness_nodes(cluster.api)
        if (n.metadata.labels or {}).get("cloud.google.com/gke-tpu-topology") == "4x4"
        and not n.spec.unschedulable
    ]
    for node in others:
        kube.cordon(cluster.api, node)
    for pool in made:
        kube.wait_nodes_ready(cluster.api, kube.create_pool(cluster.api, pool))
    try:
        yield [p.name for p in made]
    finally:
        kubectl(
            cluster, "delete", "tsc", "--all", "-n", namespace, "--wait=true", "--timeout=120s",
            check=False,
        )  # fmt: skip
        for pool in made:
            kube.delete_pool(cluster.api, pool.name)
        for node in others:
            kube.cordon(cluster.api, node, unschedulable=False)


def nodes_of(cluster: E2ECluster, pool: str) -> list[str]:
    return sorted(n.metadata.name for n in kube.harness_nodes(cluster.api, pool))


def signal_pool(cluster: E2ECluster, pool: str, action: str, **kw: Any) -> None:
    for node in nodes_of(cluster, pool):
        kube.disrupt(cluster.api, node, action, **kw)


def status(cluster: E2ECluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(get_tsc(cluster, namespace, name).get("status") or {})


def test_a_pool_with_maintenance_soon_is_avoided_when_another_exists(
    cluster: E2ECluster, namespace: str, pools: list[str]
) -> None:
    first, second, third = POOLS
    signal_pool(cluster, first, "schedule-maintenance", in_s=HOUR)
    signal_pool(cluster, second, "schedule-maintenance", in_s=5 * HOUR)
    for node in nodes_of(cluster, SPOT):
        kube.cordon(cluster.api, node)
    apply(cluster, namespace, tsc("avoid", slices=2))
    wait_condition(cluster, namespace, "avoid", "Ready", "True", timeout_s=TIMEOUT_S)
    # the free pool first, then the later maintenance; the soonest is left
    assert sorted(held_by(cluster, namespace, "avoid").values()) == [second, third]
    entry = next(
        s for s in status(cluster, namespace, "avoid")["slices"] if s["nodePool"] == second
    )
    assert entry["maintenance"]["state"] == "Scheduled", entry
    assert "maintenance at " in entry["message"], entry
    conditions = {c["type"]: c for c in status(cluster, namespace, "avoid")["conditions"]}
    assert conditions["MaintenanceScheduled"]["status"] == "True"
    assert conditions["Ready"]["status"] == "True"


def test_a_termination_taint_drains_the_whole_slice_at_once_then_it_comes_back(
    cluster: E2ECluster, namespace: str, pools: list[str]
) -> None:
    for node in nodes_of(cluster, SPOT):
        kube.cordon(cluster.api, node)
    with (
        InvariantWatch(cluster, namespace) as invariant,
        TornSliceWatch(cluster, namespace) as torn,
    ):
        apply(cluster, namespace, tsc("drain", disruption={"gracePeriodSeconds": 20}))
        wait_condition(cluster, namespace, "drain", "Ready", "True", timeout_s=TIMEOUT_S)
        ((replica, pool),) = held_by(cluster, namespace, "drain").items()
        victim = nodes_of(cluster, pool)[1]
        kube.disrupt(cluster.api, victim, "terminate")

        def drained() -> dict[str, Any] | None:
            st = status(cluster, namespace, "drain")
            return st if (st.get("disruptions") or {}).get("total") == 1 else None

        st = kube.wait_for(drained, timeout_s=TIMEOUT_S, what="the disruption counted")
        assert st["disruptions"]["byReason"] == {"Preemption": 1}
        # the replacement comes back on another pool while the tainted one is quarantined
        wait_condition(cluster, namespace, "drain", "Ready", "True", timeout_s=TIMEOUT_S)
        # the drained pool goes once the old replica's pods are gone (with pin at
        # admission after the fence too: its mark came off at the drain, 15 s before)
        kube.wait_for(
            lambda: pool not in held_by(cluster, namespace, "drain").values() or None,
            timeout_s=60,
            what=f"the drained pool {pool} given back",
            describe=lambda: held_by(cluster, namespace, "drain"),
        )
        now_held = held_by(cluster, namespace, "drain")
        assert replica not in now_held, now_held
        entry = status(cluster, namespace, "drain")["slices"][0]
        assert entry["disruptions"] == 1 and entry["lastDisruption"]["node"] == victim
        assert entry["lastDisruption"]["reason"] == "Preemption"
        assert "SliceDisrupted" in event_reasons(cluster, namespace)
        for pod in slice_pods(cluster, namespace, "drain"):
            assert pod.spec.termination_grace_period_seconds == 20
            env = {e.name: e.value for e in pod.spec.containers[0].env or []}
            assert env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "15"
        # the taint goes: the pool may be claimed again (by anyone)
        kube.disrupt(cluster.api, victim, "unterminate")
    invariant.check()
    torn.check()


def test_a_spot_notice_counts_as_a_preemption(
    cluster: E2ECluster, namespace: str, pools: list[str]
) -> None:
    for pool in POOLS:  # only the Spot pool is free
        for node in nodes_of(cluster, pool):
            kube.cordon(cluster.api, node)
    apply(cluster, namespace, tsc("spot"))
    wait_condition(cluster, namespace, "spot", "Ready", "True", timeout_s=TIMEOUT_S)
    kube.disrupt(cluster.api, nodes_of(cluster, SPOT)[0], "spot-notice")
    kube.wait_for(
        lambda: (status(cluster, namespace, "spot").get("disruptions") or {}).get("byReason"),
        timeout_s=TIMEOUT_S,
        what="the Spot preemption counted",
    )
    assert status(cluster, namespace, "spot")["disruptions"]["byReason"] == {"Preemption": 1}

    # nowhere to go: the slice waits, naming the quarantined Spot pool and why
    def waiting() -> str | None:
        message = str(status(cluster, namespace, "spot")["slices"][0].get("message", ""))
        return message if "not claimed until it clears" in message else None

    kube.wait_for(
        waiting,
        timeout_s=TIMEOUT_S,
        what="the wait naming the quarantined pool",
        describe=lambda: describe(cluster, namespace, "spot"),
    )


def test_a_host_that_stops_answering_says_so_until_tainted_out_of_service(
    cluster: E2ECluster, namespace: str, pools: list[str]
) -> None:
    """A dead kubelet under a held pool: the slice is drained (NodeFailure) but the dead
    node's pods stay Terminating, so status names the host and what clears it; the
    out-of-service taint lets them be force-deleted and the slice comes back on a spare
    pool."""
    for node in nodes_of(cluster, SPOT):
        kube.cordon(cluster.api, node)
    apply(cluster, namespace, tsc("dead", disruption={"gracePeriodSeconds": 5}))
    wait_condition(cluster, namespace, "dead", "Ready", "True", timeout_s=TIMEOUT_S)
    ((_, pool),) = held_by(cluster, namespace, "dead").items()
    victim = nodes_of(cluster, pool)[1]
    kube.set_node_not_ready(cluster.api, victim)
    try:

        def named() -> str | None:
            slices = status(cluster, namespace, "dead").get("slices") or []
            message = " ".join(str(s.get("message", "")) for s in slices)
            return message if f"node {victim} NotReady since" in message else None

        message = kube.wait_for(named, timeout_s=TIMEOUT_S, what="the stuck host named")
        assert "tainted node.kubernetes.io/out-of-service" in message
        assert status(cluster, namespace, "dead")["disruptions"]["byReason"] == {"NodeFailure": 1}
        kube.disrupt(cluster.api, victim, "out-of-service")
        wait_condition(cluster, namespace, "dead", "Ready", "True", timeout_s=TIMEOUT_S)
        assert pool not in held_by(cluster, namespace, "dead").values()
        # who deletes the stuck pods first, the operator (Event StuckPodsForceDeleted) or
        # the pod garbage collector (same rule), is a race: only the outcome is checked
    finally:
        kube.disrupt(cluster.api, victim, "in-service")
        kube.restore_node(cluster.api, victim)
