"""Several worker groups in one TPUSliceCluster (spec.workerGroups) on the local cluster.

What is built: one KubeRay worker group per entry, TPU groups on nodes of their own
shape with identity per group, a CPU group never on TPU nodes; under reservation policy
NodePool each TPU group's slices wait in their own shape's queue, and the groups are
one gang (every group's slices held, or none released; shapes claimed in one order).

The identity scenario runs over v6e 2x4 on 4-chip hosts (a trainer group) and v5e 2x4
on one 8-chip host (a rollout group), added and removed by the ``group_pools``
fixture, with ``reservation.policy: None``. The gated scenarios run the issue's
shapes: a trainer of one v6e 4x4 slice (4 hosts), a rollout of two v5e 2x4 slices (one
8-chip host each) and a CPU group; their pools are added by each scenario.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import (
    NODEPOOL,
    apply,
    condition,
    delete_tsc,
    describe,
    get_tsc,
    kubectl,
    released,
    reservations,
    wait_condition,
)
from tests.support.builders import tpuslice
from tpusim import autoscaler, kube
from tpusim.nodepools import TPUPool
from tpusim.operator_process import OperatorProcess

READY_S = 180
ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"


def grouped(name: str, **spec: Any) -> dict[str, Any]:
    """A trainer of 2 v6e 2x4 slices (2 hosts each), a rollout of 2 independent v5e 2x4
    slices (1 host each) and a CPU group of 2 replicas."""
    body = tpuslice(name=name, namespace=None, **spec)
    del body["spec"]["tpu"]
    small = {"cpu": "1", "memory": "2Gi"}
    body["spec"]["head"] = {"resources": small}
    body["spec"]["workerGroups"] = [
        {
            "name": "trainer",
            "tpu": {"type": "v6e", "topology": "2x4", "chipsPerHost": 4, "slices": 2},
            "resources": small,
        },
        {
            "name": "rollout",
            "tpu": {"type": "v5e", "topology": "2x4", "slices": 2, "multislice": False},
            "resources": small,
        },
        {"name": "data", "cpu": {"replicas": 2}, "resources": small},
    ]
    return body


@pytest.fixture
def group_pools(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> Iterator[list[str]]:
    pools = [
        TPUPool("grp-v6e-a", "v6e", "2x4", nodes=2),
        TPUPool("grp-v6e-b", "v6e", "2x4", nodes=2),
        TPUPool("grp-v5e", "v5e", "2x4", nodes=2, chips_per_node=8),
    ]
    for pool in pools:
        kube.wait_nodes_ready(cluster.api, kube.create_pool(cluster.api, pool))
    yield [p.name for p in pools]
    kubectl(cluster, "delete", "tsc", "--all", "-n", namespace, "--wait=true", check=False)
    for pool in pools:
        kube.delete_pool(cluster.api, pool.name)


def pods_by_group(cluster: E2ECluster, namespace: str, name: str) -> dict[str, list[Any]]:
    pods = cluster.core.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={name}")
    out: dict[str, list[Any]] = {}
    for pod in pods.items:
        if (pod.metadata.labels or {}).get("ray.io/node-type") == "worker":
            out.setdefault(pod.metadata.labels["ray.io/group"], []).append(pod)
    return out


def env(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or [] if e.value is not None}


def test_each_group_runs_on_its_own_shape_with_its_own_identity(
    cluster: E2ECluster, namespace: str, group_pools: list[str]
) -> None:
    apply(cluster, namespace, grouped("rl", reservation={"policy": "None"}))

    def all_running() -> dict[str, list[Any]] | None:
        groups = pods_by_group(cluster, namespace, "rl")
        counts = {g: len(p) for g, p in groups.items()}
        running = all(p.status.phase == "Running" for ps in groups.values() for p in ps)
        return groups if running and counts == {"trainer": 4, "rollout": 2, "data": 2} else None

    groups = kube.wait_for(
        all_running,
        timeout_s=READY_S,
        what="every group's pods running",
        describe=lambda: describe(cluster, namespace, "rl"),
    )
    for pod in groups["trainer"]:
        node = cluster.core.read_node(pod.spec.node_name)
        assert node.metadata.labels[ACCELERATOR] == "tpu-v6e-slice"
        replica = pod.metadata.labels["ray.io/worker-group-replica-index"]
        assert env(pod)["TPU_NAME"] == f"trainer-{replica}"
        assert env(pod)["MEGASCALE_NUM_SLICES"] == "2"
        assert env(pod)["MEGASCALE_COORDINATOR_ADDRESS"] == "trainer-0-0.rl-headless"
    for pod in groups["rollout"]:
        node = cluster.core.read_node(pod.spec.node_name)
        assert node.metadata.labels[ACCELERATOR] == "tpu-v5-lite-podslice"
        assert env(pod)["TPU_NAME"].startswith("rollout-")
        assert not any(k.startswith("MEGASCALE_") for k in env(pod))
    for pod in groups["data"]:
        labels = cluster.core.read_node(pod.spec.node_name).metadata.labels
        assert ACCELERATOR not in labels and labels.get(NODEPOOL) not in group_pools
    obj = wait_condition(cluster, namespace, "rl", "Ready", "True", timeout_s=READY_S)
    by_name = {g["name"]: g for g in obj["status"]["groups"]}
    assert (by_name["trainer"]["readySlices"], by_name["rollout"]["readySlices"]) == (2, 2)
    assert by_name["data"]["desiredReplicas"] == 2


def rl_gang(name: str, **spec: Any) -> dict[str, Any]:
    """The issue's heterogeneous cluster: a trainer of one v6e 4x4 slice, a rollout of two
    independent v5e 2x4 slices (one 8-chip host each) and a CPU group, policy NodePool
    (the groups one gang by default)."""
    body = grouped(name, **spec)
    trainer, rollout, _data = body["spec"]["workerGroups"]
    trainer["tpu"] = {"type": "v6e", "topology": "4x4", "slices": 1}
    rollout["tpu"] = {"type": "v5e", "topology": "2x4", "slices": 2, "multislice": False}
    return body


TRAINER_POOL = "gang-v6e-4x4"
ROLLOUT_POOL = "gang-v5e-2x4"


def trainer_pool(name: str = TRAINER_POOL) -> TPUPool:
    return TPUPool(name, "v6e", "4x4", nodes=4)


def rollout_pool(name: str = ROLLOUT_POOL) -> TPUPool:
    return TPUPool(name, "v5e", "2x4", nodes=2, chips_per_node=8)


@pytest.fixture
def gang_pools(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> Iterator[list[str]]:
    """Pools a scenario creates (by name, through ``add_pool``), removed afterwards; every
    TPU node already in the cluster (the default pools, of the trainer's and the rollout's
    shapes too) cordoned meanwhile, so only the scenario's pools can be taken."""
    others = [
        n.metadata.name
        for n in kube.harness_nodes(cluster.api)
        if "cloud.google.com/gke-tpu-accelerator" in (n.metadata.labels or {})
        and not n.spec.unschedulable
    ]
    for node in others:
        kube.cordon(cluster.api, node)
    made: list[str] = []
    try:
        yield made
    finally:
        kubectl(cluster, "delete", "tsc", "--all", "-n", namespace, "--wait=true", check=False)
        for name in made:
            kube.delete_pool(cluster.api, name)
        for node in others:
            kube.cordon(cluster.api, node, unschedulable=False)


def add_pool(cluster: E2ECluster, made: list[str], pool: TPUPool) -> None:
    kube.wait_nodes_ready(cluster.api, kube.create_pool(cluster.api, pool))
    made.append(pool.name)


def groups_of(cluster: E2ECluster, namespace: str, name: str) -> dict[str, set[str]]:
    """group -> the pools its reservations hold, for one object."""
    out: dict[str, set[str]] = {}
    for r in reservations(cluster):
        h = r["spec"]["holder"]
        if (h["namespace"], h["name"]) == (namespace, name):
            out.setdefault(h.get("group", ""), set()).add(r["spec"]["nodePool"])
    return out


def tpu_pods_released(cluster: E2ECluster, namespace: str, name: str) -> list[Any]:
    groups = pods_by_group(cluster, namespace, name)
    return [p for g in ("trainer", "rollout") for p in groups.get(g, []) if released(p)]


def test_a_gated_grouped_cluster_is_held_all_or_nothing_and_ready_together(
    cluster: E2ECluster, namespace: str, gang_pools: list[str]
) -> None:
    add_pool(cluster, gang_pools, rollout_pool())
    apply(cluster, namespace, rl_gang("rl"))
    # only the rollout's shape exists: it holds its nodes, and no TPU pod of either
    # group is released; the CPU group runs (it never waits for TPU pools)
    kube.wait_for(
        lambda: groups_of(cluster, namespace, "rl").get("rollout") == {ROLLOUT_POOL} or None,
        timeout_s=READY_S,
        what="the rollout group holding its nodes",
        describe=lambda: describe(cluster, namespace, "rl"),
    )
    kube.wait_for(
        lambda: (
            all(
                p.status.phase == "Running" for p in pods_by_group(cluster, namespace, "rl")["data"]
            )
            or None
        ),
        timeout_s=READY_S,
        what="the CPU group running",
    )
    assert tpu_pods_released(cluster, namespace, "rl") == []

    def rollout_says_why() -> bool:
        groups = (get_tsc(cluster, namespace, "rl").get("status") or {}).get("groups") or []
        rollout: dict[str, Any] = next((g for g in groups if g["name"] == "rollout"), {})
        slices = rollout.get("slices") or []
        return bool(slices) and all(
            "every group of the gang" in s.get("message", "") for s in slices
        )

    # the status is written by the pass after the claims the reservations show
    kube.wait_for(
        rollout_says_why,
        timeout_s=READY_S,
        what="the rollout's slices saying they wait for every group of the gang",
        describe=lambda: describe(cluster, namespace, "rl"),
    )
    # the trainer's pool arrives: every group is released, Ready together
    add_pool(cluster, gang_pools, trainer_pool())
    obj = wait_condition(cluster, namespace, "rl", "Ready", "True", timeout_s=READY_S)
    assert groups_of(cluster, namespace, "rl") == {
        "trainer": {TRAINER_POOL},
        "rollout": {ROLLOUT_POOL},
    }
    groups = pods_by_group(cluster, namespace, "rl")
    for group, pool in (("trainer", TRAINER_POOL), ("rollout", ROLLOUT_POOL)):
        for pod in groups[group]:
            labels = cluster.core.read_node(pod.spec.node_name).metadata.labels
            assert labels[NODEPOOL] == pool, (group, pod.metadata.name)
    for pod in groups["data"]:
        labels = cluster.core.read_node(pod.spec.node_name).metadata.labels
        assert labels.get(NODEPOOL) not in gang_pools
    by_name = {g["name"]: g for g in obj["status"]["groups"]}
    assert (by_name["trainer"]["readySlices"], by_name["rollout"]["readySlices"]) == (1, 2)


def test_two_gangs_over_scarce_pools_never_deadlock(
    cluster: E2ECluster, namespace: str, gang_pools: list[str]
) -> None:
    """Pools for one gang at a time: one runs whole while the other holds no TPU pod
    released; once the first is deleted the second runs whole. Neither holds part of
    the other's shapes for ever (the shapes are claimed in one order)."""
    add_pool(cluster, gang_pools, trainer_pool())
    add_pool(cluster, gang_pools, rollout_pool())
    apply(cluster, namespace, rl_gang("first"))
    apply(cluster, namespace, rl_gang("second"))

    def one_ready() -> str | None:
        ready = [
            n
            for n in ("first", "second")
            if condition(get_tsc(cluster, namespace, n), "Ready").get("status") == "True"
        ]
        return ready[0] if len(ready) == 1 else None

    winner = kube.wait_for(
        one_ready,
        timeout_s=READY_S,
        what="one of the two gangs Ready",
        describe=lambda: [describe(cluster, namespace, n) for n in ("first", "second")],
    )
    loser = "second" if winner == "first" else "first"
    assert tpu_pods_released(cluster, namespace, loser) == []
    assert groups_of(cluster, namespace, loser).get("trainer", set()) == set()
    delete_tsc(cluster, namespace, winner)
    wait_condition(cluster, namespace, loser, "Ready", "True", timeout_s=READY_S)
    assert groups_of(cluster, namespace, loser) == {
        "trainer": {TRAINER_POOL},
        "rollout": {ROLLOUT_POOL},
    }


def test_a_group_removed_from_the_spec_releases_its_pools(
    cluster: E2ECluster, namespace: str, gang_pools: list[str]
) -> None:
    add_pool(cluster, gang_pools, trainer_pool())
    add_pool(cluster, gang_pools, rollout_pool())
    body = rl_gang("rl")
    apply(cluster, namespace, body)
    wait_condition(cluster, namespace, "rl", "Ready", "True", timeout_s=READY_S)
    body["spec"]["workerGroups"] = [
        g for g in body["spec"]["workerGroups"] if g["name"] != "rollout"
    ]
    apply(cluster, namespace, body)
    kube.wait_for(
        lambda: "rollout" not in groups_of(cluster, namespace, "rl") or None,
        timeout_s=READY_S,
        what="the rollout group's reservations given back",
        describe=lambda: describe(cluster, namespace, "rl"),
    )
    assert groups_of(cluster, namespace, "rl") == {"trainer": {TRAINER_POOL}}
    obj = wait_condition(cluster, namespace, "rl", "Ready", "True", timeout_s=READY_S)
    assert [g["name"] for g in obj["status"]["groups"]] == ["trainer", "data"]


def held_slices(cluster: E2ECluster, namespace: str, name: str) -> dict[str, set[str]]:
    """group -> the slices (replica names) its reservations hold, for one object."""
    out: dict[str, set[str]] = {}
    for r in reservations(cluster):
        h = r["spec"]["holder"]
        if (h["namespace"], h["name"]) == (namespace, name):
            out.setdefault(h.get("group", ""), set()).add(h["replicaName"])
    return out


def test_an_elastic_group_grows_by_a_whole_slice_and_the_other_group_stays(
    cluster: E2ECluster, namespace: str, gang_pools: list[str]
) -> None:
    """A fixed trainer and an elastic rollout (v5e 2x4 slices of one 8-chip host, 1 to 2)
    in one gang: Ready at the rollout's minimum; the slice the autoscaler adds is reserved
    whole and runs, and the trainer's reservation is untouched."""
    add_pool(cluster, gang_pools, trainer_pool())
    add_pool(cluster, gang_pools, rollout_pool())
    body = rl_gang("el")
    rollout = body["spec"]["workerGroups"][1]
    rollout["tpu"] = {"type": "v5e", "topology": "2x4", "multislice": False}
    rollout["elastic"] = {"minSlices": 1, "maxSlices": 2}
    apply(cluster, namespace, body)
    wait_condition(cluster, namespace, "el", "Ready", "True", timeout_s=READY_S)
    before = held_slices(cluster, namespace, "el")
    assert len(before["trainer"]) == 1 and len(before["rollout"]) == 1, before

    autoscaler.scale(cluster.api, namespace, "el", "rollout", 2)

    def grown() -> dict[str, Any] | None:
        obj = get_tsc(cluster, namespace, "el")
        groups = {g["name"]: g for g in (obj.get("status") or {}).get("groups") or []}
        entry = groups.get("rollout") or {}
        ok = (
            entry.get("readySlices") == 2
            and (entry.get("elastic") or {}).get("target") == 2
            and len(held_slices(cluster, namespace, "el").get("rollout", ())) == 2
            and condition(obj, "Ready").get("status") == "True"
        )
        return obj if ok else None

    kube.wait_for(
        grown,
        timeout_s=READY_S,
        what="the rollout group's second slice reserved and Ready",
        describe=lambda: describe(cluster, namespace, "el"),
    )
    after = held_slices(cluster, namespace, "el")
    assert after["trainer"] == before["trainer"]
    assert before["rollout"] < after["rollout"]
    assert len(tpu_pods_released(cluster, namespace, "el")) == 4 + 2


def test_the_api_server_refuses_mixing_the_two_forms(
    cluster: E2ECluster, namespace: str, tpuslice_crds: None
) -> None:
    body = grouped("mixed")
    body["spec"]["tpu"] = {"type": "v6e", "topology": "4x4"}
    stdin = yaml.safe_dump(body)
    result = kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=stdin, check=False)
    assert result.returncode != 0
    assert "exactly one of spec.tpu" in result.stderr
    assert kubectl(cluster, "get", "tsc", "mixed", "-n", namespace, check=False).returncode != 0
