"""The operator on the local simulated GKE cluster, scenario by scenario.

Each scenario is what a user would do and see: apply a TPUSliceCluster, watch
conditions, pods, reservations. The real scheduler places pods, the real
KubeRay creates and replaces them, the real garbage collector deletes them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.helpers import E2ECluster, holds, multihost_raycluster, terminating_pod
from tests.e2e.operator_support import (
    REPO,
    InvariantWatch,
    OperatorProcess,
    apply,
    condition,
    delete_tsc,
    describe,
    event_reasons,
    get_tsc,
    held_by,
    kubectl,
    pool_of,
    record,
    reservations,
    slice_pods,
    tsc,
    wait_condition,
)
from tpusim import kube
from tpusim.nodepools import TPUPool, default_pools, pool_nodes


def add_pool(cluster: E2ECluster, pool: TPUPool) -> list[str]:
    names = kube.create_pool(cluster.api, pool)
    kube.wait_nodes_ready(cluster.api, names)
    return names


def measure_release_latency(cluster: E2ECluster, namespace: str, name: str) -> None:
    """Last pod of a slice created -> that slice's pods ungated (from the API's own times)."""
    by_replica: dict[str, list[Any]] = {}
    for pod in slice_pods(cluster, namespace, name):
        replica = str((pod.metadata.labels or {}).get("ray.io/worker-group-replica-name") or "")
        by_replica.setdefault(replica, []).append(pod)
    for pods in by_replica.values():
        last_created = max(p.metadata.creation_timestamp for p in pods)
        scheduled = [
            c.last_transition_time
            for p in pods
            for c in p.status.conditions or []
            if c.type == "PodScheduled" and c.status == "True"
        ]
        if scheduled:
            record(
                "last pod created -> slice scheduled",
                (max(scheduled) - last_created).total_seconds(),
            )


def test_a_two_slices_on_two_free_pools_become_ready(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    began = time.monotonic()
    apply(cluster, namespace, tsc("llm", slices=2))
    kube.wait_for(
        lambda: cluster.custom.list_namespaced_custom_object(
            "ray.io", "v1", namespace, "rayclusters"
        )["items"],
        timeout_s=30,
        what="RayCluster",
    )
    record("apply -> RayCluster created", time.monotonic() - began)
    done = kubectl(
        cluster,
        "wait",
        "-n",
        namespace,
        "--for=condition=Ready",
        "tsc/llm",
        "--timeout=120s",
        check=False,
    )
    assert done.returncode == 0, (done.stderr, describe(cluster, namespace, "llm"))
    record("apply -> Ready", time.monotonic() - began)
    obj = get_tsc(cluster, namespace, "llm")
    status = obj["status"]
    assert (status["readySlices"], status["desiredSlices"], status["sliceReadiness"]) == (
        2,
        2,
        "2/2",
    )
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    pools = {s["nodePool"] for s in status["slices"]}
    assert len(pools) == 2 and all(s["state"] == "Ready" for s in status["slices"])
    # each slice's pods run on the nodes of its own pool, and nowhere else
    held = held_by(cluster, namespace, "llm")
    assert set(held.values()) == pools
    for pod in slice_pods(cluster, namespace, "llm"):
        replica = pod.metadata.labels["ray.io/worker-group-replica-name"]
        assert pool_of(pod.spec.node_name, cluster) == held[replica]
        assert pod.spec.node_selector["cloud.google.com/gke-nodepool"] == held[replica]
        assert not pod.spec.scheduling_gates
    measure_release_latency(cluster, namespace, "llm")
    printed = kubectl(cluster, "get", "tsc", "-n", namespace).stdout
    assert "v6e-16" in printed and "2/2" in printed and "True" in printed


def test_b_per_slice_one_free_pool_one_slice_runs_the_other_waits_until_a_pool_is_free(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    """PerSlice: each slice takes a pool and starts alone. Two pools of the shape exist,
    one cordoned (not eligible): one slice runs, the other waits, gated, until the
    second pool is uncordoned."""
    first = TPUPool("v6e-2x8-one", "v6e", "2x8", nodes=4)
    second = TPUPool("v6e-2x8-two", "v6e", "2x8", nodes=4)
    add_pool(cluster, first)
    cordoned = add_pool(cluster, second)
    for node in cordoned:
        kube.cordon(cluster.api, node)
    try:
        body = tsc("wide", topology="2x8", slices=2, reservation={"gang": "PerSlice"})
        apply(cluster, namespace, body)
        wait_condition(cluster, namespace, "wide", "Ready", "False", "WaitingForCapacity")

        # wait until one slice runs; the other's pods must all still be gated
        def one_running() -> Any:
            pods = slice_pods(cluster, namespace, "wide")
            running = [p for p in pods if p.status.phase == "Running"]
            return pods if len(pods) == 8 and len(running) == 4 else None

        pods = kube.wait_for(
            one_running,
            timeout_s=90,
            what="one slice running",
            describe=lambda: describe(cluster, namespace, "wide"),
        )
        for pod in pods:
            if pod.status.phase != "Running":
                assert [g.name for g in pod.spec.scheduling_gates] == [
                    "tpuslice.dev/slice-reservation"
                ]
                assert pod.spec.node_name is None
        obj = get_tsc(cluster, namespace, "wide")
        ready = condition(obj, "Ready")
        assert ready["reason"] == "WaitingForCapacity"
        assert "1st of 1 waiting for v6e 2x8: needs 1 more node pool (holds 1)" in ready["message"]
        assert condition(obj, "Reconciling")["status"] == "True"
        assert condition(obj, "Stalled")["status"] == "False"
        assert "WaitingForCapacity" in event_reasons(cluster, namespace)
        assert set(held_by(cluster, namespace, "wide").values()) == {first.name}
        for node in cordoned:
            kube.cordon(cluster.api, node, unschedulable=False)
        wait_condition(cluster, namespace, "wide", "Ready", "True", timeout_s=90)
        assert set(held_by(cluster, namespace, "wide").values()) == {first.name, second.name}
    finally:
        delete_tsc(cluster, namespace, "wide", check=False)
        kube.delete_pool(cluster.api, first.name)
        kube.delete_pool(cluster.api, second.name)


def test_c_two_clusters_compete_for_one_pool(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    spec = {"tpu": {"type": "v5e", "topology": "2x4", "chipsPerHost": 4}}
    with InvariantWatch(cluster, namespace) as watch:
        for name in ("first", "second"):
            body = tsc(name, type_="v5e", topology="2x4")
            body["spec"]["tpu"].update(spec["tpu"])
            apply(cluster, namespace, body)

        def one_ready() -> Any:
            states = {
                n: condition(get_tsc(cluster, namespace, n), "Ready") for n in ("first", "second")
            }
            winners = [n for n, c in states.items() if c.get("status") == "True"]
            return winners if len(winners) == 1 else None

        (winner,) = kube.wait_for(
            one_ready,
            timeout_s=120,
            what="exactly one Ready",
            describe=lambda: [describe(cluster, namespace, n) for n in ("first", "second")],
        )
        loser = "second" if winner == "first" else "first"
        waiting = wait_condition(
            cluster, namespace, loser, "Ready", "False", "WaitingForCapacity", timeout_s=30
        )
        assert f"held by {namespace}/{winner} (v5e-2x4)" in condition(waiting, "Ready")["message"]
        holders = [r for r in reservations(cluster) if r["spec"]["nodePool"] == "v5e-2x4"]
        assert [r["spec"]["holder"]["name"] for r in holders] == [winner]
        delete_tsc(cluster, namespace, winner)
        wait_condition(cluster, namespace, loser, "Ready", "True", timeout_s=120)
    watch.check()


def test_d_deleting_the_cluster_removes_everything_and_releases_the_pool(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, tsc("gone", type_="v4", topology="2x2x2"))
    wait_condition(cluster, namespace, "gone", "Ready", "True")
    assert held_by(cluster, namespace, "gone") != {}
    # One sweep task, no kopf timer per reservation: reservations carry no finalizer.
    ours = [
        r
        for r in reservations(cluster)
        if (r["spec"]["holder"]["namespace"], r["spec"]["holder"]["name"]) == (namespace, "gone")
    ]
    assert [r["metadata"].get("finalizers") or [] for r in ours] == [[] for _ in ours]
    delete_tsc(cluster, namespace, "gone")
    # The finalizer released the pools before the TSC could go.
    assert held_by(cluster, namespace, "gone") == {}
    assert (
        cluster.custom.list_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters")[
            "items"
        ]
        == []
    )
    kube.wait_for(
        lambda: not slice_pods(cluster, namespace, "gone"), timeout_s=60, what="worker pods deleted"
    )


def test_e_node_failure_moves_the_slice_and_recovers(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess, restore_nodes: list[str]
) -> None:
    apply(cluster, namespace, tsc("sturdy"))
    obj = wait_condition(cluster, namespace, "sturdy", "Ready", "True")
    (before,) = obj["status"]["slices"]
    failed_pool = before["nodePool"]
    victim = kube.harness_nodes(cluster.api, failed_pool)[0].metadata.name
    with InvariantWatch(cluster, namespace) as watch:
        restore_nodes.append(victim)
        kube.delete_node(cluster.api, victim)  # GKE removes the VM; its pods are orphaned

        def moved() -> Any:
            """The replacement slice Ready; the old one may still be listed as Releasing."""
            obj = get_tsc(cluster, namespace, "sturdy")
            fresh = [
                s
                for s in obj["status"]["slices"]
                if s.get("replica") != before["replica"] and s["state"] == "Ready"
            ]
            return fresh[0] if fresh and condition(obj, "Ready").get("status") == "True" else None

        after = kube.wait_for(
            moved,
            timeout_s=180,
            what="slice replaced and Ready again",
            describe=lambda: describe(cluster, namespace, "sturdy"),
        )
    assert after["nodePool"] != failed_pool  # the damaged pool has 3 of 4 nodes
    watch.check()
    assert {"SliceReserved", "SliceReleased", "SliceReady"} <= event_reasons(cluster, namespace)
    assert failed_pool not in held_by(cluster, namespace, "sturdy").values()


def test_the_pool_stays_held_while_a_pod_on_a_dead_node_terminates(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    """A node's kubelet dies; the operator drains the slice whole (a NotReady host is a
    node failure) and the pod on the dead node hangs Terminating (tpusim: a dead kubelet
    finishes nothing). KubeRay replaces a multi-host replica only once its deleted pods
    are gone, so for as long as it terminates the slice keeps its pool (terminating pods
    still hold chips), claims no other and names the host and what clears it.
    When the node returns the pod goes, KubeRay replaces the replica, the new one becomes
    Ready and the old replica's reservation is released."""
    evict_soon = {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 2,
    }
    body = tsc("held")
    body["spec"]["worker"]["template"] = {"spec": {"tolerations": [evict_soon]}}
    apply(cluster, namespace, body)
    obj = wait_condition(cluster, namespace, "held", "Ready", "True")
    (before,) = obj["status"]["slices"]
    old_replica, old_pool = before["replica"], before["nodePool"]
    victim_pod = slice_pods(cluster, namespace, "held")[0]
    victim = victim_pod.spec.node_name
    restored = False
    try:
        with InvariantWatch(cluster, namespace) as watch:
            kube.set_node_not_ready(cluster.api, victim)
            kube.wait_for(
                lambda: terminating_pod(cluster, namespace, victim_pod.metadata.name),
                timeout_s=90,
                what="the pod on the dead node evicted (taint manager) and left Terminating",
                describe=lambda: describe(cluster, namespace, "held"),
            )

            def still_held() -> bool:
                # the drained slice's entry says why its pool stays held: its pods are
                # terminating, then (past their grace) which host keeps them so
                slices = (get_tsc(cluster, namespace, "held").get("status") or {}).get(
                    "slices"
                ) or []
                said = " ".join(str(s.get("message", "")) for s in slices)
                return bool(
                    terminating_pod(cluster, namespace, victim_pod.metadata.name)
                    and held_by(cluster, namespace, "held") == {old_replica: old_pool}
                    and ("the pool stays held" in said or f"node {victim} NotReady since" in said)
                )

            kube.wait_for(
                still_held,
                timeout_s=30,
                what="status naming the dead host",
                describe=lambda: describe(cluster, namespace, "held"),
            )
            holds(still_held, seconds=10, what="pool held while its pod terminates")
            kube.restore_node(cluster.api, victim)
            restored = True

            def replaced() -> Any:
                obj = get_tsc(cluster, namespace, "held")
                fresh = [
                    s
                    for s in obj["status"]["slices"]
                    if s.get("replica") != old_replica and s["state"] == "Ready"
                ]
                ready = condition(obj, "Ready").get("status") == "True"
                released = old_replica not in held_by(cluster, namespace, "held")
                return fresh[0] if fresh and ready and released else None

            after = kube.wait_for(
                replaced,
                timeout_s=180,
                what="replacement slice Ready and the old replica's pool released",
                describe=lambda: describe(cluster, namespace, "held"),
            )
        watch.check()
        assert held_by(cluster, namespace, "held") == {after["replica"]: after["nodePool"]}
        assert "SliceReleased" in event_reasons(cluster, namespace)
    finally:
        if not restored:
            kube.restore_node(cluster.api, victim)
        kube.wait_nodes_ready(cluster.api, [victim])


@pytest.fixture
def restore_nodes(cluster: E2ECluster) -> Iterator[list[str]]:
    """Nodes a test deletes come back afterwards (GKE repairs a pool as a unit)."""
    deleted: list[str] = []
    yield deleted
    wanted = {
        n["metadata"]["name"]: n
        for pool in default_pools()
        if isinstance(pool, TPUPool)
        for n in pool_nodes(pool)
    }
    for name in deleted:
        cluster.core.create_node(wanted[name])
    kube.wait_nodes_ready(cluster.api, deleted)


def test_f_operator_killed_while_reserving_and_releasing_converges(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, tsc("crashy", slices=2))
        kube.wait_for(
            lambda: held_by(cluster, namespace, "crashy"),
            timeout_s=60,
            interval_s=0.05,
            what="first reservation",
        )
        operator.kill()
        operator.start()
        kube.wait_for(
            lambda: any(
                not p.spec.scheduling_gates for p in slice_pods(cluster, namespace, "crashy")
            ),
            timeout_s=60,
            interval_s=0.05,
            what="first released pod",
        )
        operator.kill()
        operator.start()
        wait_condition(cluster, namespace, "crashy", "Ready", "True", timeout_s=120)
    watch.check()
    assert len(set(held_by(cluster, namespace, "crashy").values())) == 2


def test_g_slices_one_two_one(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, tsc("elastic", slices=1))
    wait_condition(cluster, namespace, "elastic", "Ready", "True")
    apply(cluster, namespace, tsc("elastic", slices=2))
    obj = wait_condition(cluster, namespace, "elastic", "Ready", "True")
    assert obj["status"]["sliceReadiness"] == "2/2"
    rc = cluster.custom.get_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayclusters", "elastic"
    )
    assert rc["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    assert len(held_by(cluster, namespace, "elastic")) == 2
    apply(cluster, namespace, tsc("elastic", slices=1))
    obj = wait_condition(cluster, namespace, "elastic", "Ready", "True")
    assert obj["status"]["sliceReadiness"] == "1/1"
    kube.wait_for(
        lambda: len(held_by(cluster, namespace, "elastic")) == 1,
        timeout_s=60,
        what="surplus reservation released",
        describe=lambda: describe(cluster, namespace, "elastic"),
    )
    assert len(slice_pods(cluster, namespace, "elastic")) == 4


BAD_SPECS = [
    ({"tpu": {"type": "v6e", "topology": "4x4x4"}}, "v5e and v6e slices are 2-dimensional"),
    ({"tpu": {"type": "v4", "topology": "2x2x3"}}, "v4 slices are 3-dimensional and one of"),
    ({"tpu": {"type": "v9", "topology": "4x4"}}, 'Unsupported value: "v9"'),
    (
        {"tpu": {"type": "v6e", "topology": "4x4", "chipsPerHost": 8}},
        "spec.tpu.chipsPerHost does not fit the topology",
    ),
    ({"ray": {"version": "2.53.0"}}, "at least 2.54.0"),
    ({"worker": {"resources": {"google.com/tpu": "4"}}}, "must not set google.com/tpu"),
]


@pytest.mark.parametrize(("patch", "message"), BAD_SPECS, ids=[m for _, m in BAD_SPECS])
def test_h_bad_specs_are_rejected_at_apply(
    cluster: E2ECluster,
    namespace: str,
    tpuslice_crds: None,
    patch: dict[str, Any],
    message: str,
) -> None:
    import yaml

    body = tsc("bad")
    for key, value in patch.items():
        body["spec"][key] = {**body["spec"].get(key, {}), **value}
    done = kubectl(
        cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body), check=False
    )
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def test_h_policy_none_schedules_pods_directly(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(
        cluster,
        namespace,
        tsc("free", type_="v4", topology="2x2x2", reservation={"policy": "None"}),
    )
    wait_condition(cluster, namespace, "free", "Ready", "True")
    pods = slice_pods(cluster, namespace, "free")
    assert len(pods) == 2 and all(not p.spec.scheduling_gates for p in pods)
    assert held_by(cluster, namespace, "free") == {}
    assert "SlicesReserved" not in {
        c["type"] for c in get_tsc(cluster, namespace, "free")["status"]["conditions"]
    }


def test_raycluster_deleted_by_hand_is_recreated_and_others_fields_are_kept(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, tsc("kept", type_="v4", topology="2x2x2"))
    wait_condition(cluster, namespace, "kept", "Ready", "True")
    # another controller (Kueue, a policy engine) owns a label on the RayCluster
    kubectl(
        cluster,
        "label",
        "raycluster",
        "-n",
        namespace,
        "kept",
        "team=research",
        "--field-manager=someone-else",
    )
    apply(
        cluster,
        namespace,
        tsc(
            "kept",
            type_="v4",
            topology="2x2x2",
            worker={"resources": {"cpu": "6", "memory": "16Gi"}},
        ),
    )

    def updated() -> Any:
        rc = cluster.custom.get_namespaced_custom_object(
            "ray.io", "v1", namespace, "rayclusters", "kept"
        )
        container = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
        return rc if container["resources"]["requests"]["cpu"] == "6" else None

    rc = kube.wait_for(updated, timeout_s=30, what="resources change applied")
    assert rc["metadata"]["labels"]["team"] == "research"
    old_uid = rc["metadata"]["uid"]
    kubectl(cluster, "delete", "raycluster", "-n", namespace, "kept", "--wait=false")
    kube.wait_for(
        lambda: (
            cluster.custom.get_namespaced_custom_object(
                "ray.io", "v1", namespace, "rayclusters", "kept"
            )["metadata"]["uid"]
            != old_uid
        ),
        timeout_s=60,
        what="RayCluster recreated",
    )
    wait_condition(cluster, namespace, "kept", "Ready", "True")


def test_a_raycluster_name_taken_by_another_is_never_modified_or_deleted(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    """A hand-written RayCluster of the TPUSliceCluster's name stays exactly as it is:
    the TPUSliceCluster is Stalled naming it, and deleting the TPUSliceCluster leaves it."""
    mine = multihost_raycluster("taken", replicas=1)
    mine["metadata"]["namespace"] = namespace
    cluster.custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", mine)
    before = cluster.custom.get_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayclusters", "taken"
    )
    apply(cluster, namespace, tsc("taken", type_="v4", topology="2x2x2"))
    obj = wait_condition(cluster, namespace, "taken", "Stalled", "True", "RayClusterNameTaken")
    assert f"RayCluster {namespace}/taken already exists" in condition(obj, "Stalled")["message"]
    assert "RayClusterNameTaken" in event_reasons(cluster, namespace)
    delete_tsc(cluster, namespace, "taken")
    after = cluster.custom.get_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayclusters", "taken"
    )
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"].get("deletionTimestamp") is None
    assert after["metadata"].get("ownerReferences") is None
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    managers = {m["manager"] for m in after["metadata"].get("managedFields") or []}
    assert "tpuslice-operator" not in managers, managers


def test_suspend_releases_the_pools_and_resume_gets_them_back(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, tsc("napper", type_="v4", topology="2x2x2"))
    wait_condition(cluster, namespace, "napper", "Ready", "True")
    apply(cluster, namespace, tsc("napper", type_="v4", topology="2x2x2", suspend=True))
    obj = wait_condition(cluster, namespace, "napper", "Ready", "False", "Suspended")
    assert obj["status"]["desiredSlices"] == 0
    kube.wait_for(
        lambda: (
            not held_by(cluster, namespace, "napper")
            and not slice_pods(cluster, namespace, "napper")
        ),
        timeout_s=60,
        what="pods gone and pool released",
        describe=lambda: describe(cluster, namespace, "napper"),
    )
    apply(cluster, namespace, tsc("napper", type_="v4", topology="2x2x2", suspend=False))
    wait_condition(cluster, namespace, "napper", "Ready", "True")


def test_single_host_slice_reserves_a_one_node_pool(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> None:
    """KubeRay labels single-host workers with the replica index only; the slice holds
    its one node, and status names the node and its pool."""
    pool = TPUPool("v6e-2x2-solo", "v6e", "2x2", nodes=1)
    (node,) = add_pool(cluster, pool)
    try:
        apply(cluster, namespace, tsc("solo", topology="2x2"))
        obj = wait_condition(cluster, namespace, "solo", "Ready", "True")
        (entry,) = obj["status"]["slices"]
        assert (entry["nodePool"], entry["node"]) == (pool.name, node)
        assert entry["readyHosts"] == 1
        (pod,) = slice_pods(cluster, namespace, "solo")
        assert entry["replica"] == pod.metadata.name
    finally:
        delete_tsc(cluster, namespace, "solo", check=False)
        kube.delete_pool(cluster.api, pool.name)


def test_every_example_applies_cleanly(
    cluster: E2ECluster, namespace: str, tpuslice_crds: None
) -> None:
    """examples/ as a user applies them: the API server (CRD schema, CEL, defaults)
    accepts each, all three kinds (a server-side dry run: most need pools this cluster
    does not have, and the TPUSliceJob's entrypoint would never finish here)."""
    files = sorted((REPO / "examples").glob("*.yaml"))
    kinds = set()
    for path in files:
        kinds |= {d["kind"] for d in yaml.safe_load_all(path.read_text()) if d}
        done = kubectl(
            cluster, "apply", "--dry-run=server", "-n", namespace, "-f", str(path), check=False
        )
        assert done.returncode == 0, f"{path.name}: {done.stdout}{done.stderr}"
    assert {"TPUSliceCluster", "TPUSliceJob", "TPUSliceService"} <= kinds
