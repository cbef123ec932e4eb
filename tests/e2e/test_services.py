"""TPUSliceService on the local cluster with the real KubeRay.

KubeRay makes the RayService's RayCluster (``<service>-<random>``), the
operator reserves its slices and releases its pods onto them. The local
cluster's pods never run Ray, so Serve never answers and KubeRay keeps that
cluster as the pending one ("waiting for Serve"), the furthest the local
cluster allows; KubeRay also starts no upgrade cluster before the first one has
served. The upgrade is therefore played the way KubeRay plays it: the test
makes a second RayCluster of the service (the same spec, the service's labels,
owned by the RayService), and later deletes the older one, as KubeRay does after
switching traffic. Checked on the way, with ``InvariantWatch`` sampling all along:

- the new cluster's slices claim a spare pool while the first cluster keeps its
  pool (the same SliceReservation object throughout);
- with no spare pool a third cluster's slices wait, holding nothing, and the pools
  of the serving clusters are never taken;
- once the older cluster is deleted and its pods are gone, its pool is given back
  and the waiting cluster gets it;
- deleting the TPUSliceService leaves no RayService, RayCluster, pod or reservation.

Pools of a shape no other e2e test uses (v5p 2x2x2: two 4-chip hosts a pool).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import (
    GROUP,
    VERSION,
    InvariantWatch,
    apply,
    condition,
    kubectl,
    reservations,
    tsc,
)
from tpusim import autoscaler, kube
from tpusim.nodepools import TPUPool
from tpusim.operator_process import OperatorProcess

TYPE, TOPOLOGY, HOSTS = "v5p", "2x2x2", 2
POOLS = ("svc-v5p-a", "svc-v5p-b")
TIMEOUT_S = 240


def tss(name: str) -> dict[str, Any]:
    body = tsc(name, type_=TYPE, topology=TOPOLOGY, slices=1)
    body["kind"] = "TPUSliceService"
    body["spec"]["serve"] = {
        "serveConfigV2": "applications:\n- name: llm\n  import_path: serve_llm:app\n"
    }
    return body


def get_tss(cluster: E2ECluster, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "tpusliceservices", name
    )
    return obj


def service_reservations(
    cluster: E2ECluster, namespace: str, name: str
) -> dict[str, dict[str, Any]]:
    """RayCluster name -> its reservation (one slice per cluster here)."""
    return {
        r["spec"]["holder"].get("rayCluster", ""): r
        for r in reservations(cluster)
        if r["spec"]["holder"].get("kind") == "TPUSliceService"
        and (r["spec"]["holder"]["namespace"], r["spec"]["holder"]["name"]) == (namespace, name)
    }


def workers_of(cluster: E2ECluster, namespace: str, raycluster: str) -> list[Any]:
    pods: list[Any] = cluster.core.list_namespaced_pod(
        namespace, label_selector=f"ray.io/cluster={raycluster},ray.io/node-type=worker"
    ).items
    return [p for p in pods if not p.metadata.deletion_timestamp]


def gated(pod: Any) -> bool:
    return any(g.name == "tpuslice.dev/slice-reservation" for g in pod.spec.scheduling_gates or [])


def running_on_its_pool(cluster: E2ECluster, namespace: str, name: str, raycluster: str) -> bool:
    held = service_reservations(cluster, namespace, name).get(raycluster)
    pods = workers_of(cluster, namespace, raycluster)
    return bool(
        held
        and len(pods) == HOSTS
        and all(
            not gated(p)
            and p.status.phase == "Running"
            and (p.spec.node_selector or {}).get("cloud.google.com/gke-nodepool")
            == held["spec"]["nodePool"]
            for p in pods
        )
    )


def describe_service(cluster: E2ECluster, namespace: str, name: str) -> Any:
    try:
        status = get_tss(cluster, namespace, name).get("status")
    except Exception as exc:
        status = repr(exc)
    pods = [
        f"{p.metadata.name}:{p.status.phase}@{p.spec.node_name}{' gated' if gated(p) else ''}"
        for p in cluster.core.list_namespaced_pod(namespace).items
    ]
    held = {
        k: r["spec"]["nodePool"] for k, r in service_reservations(cluster, namespace, name).items()
    }
    return {"status": status, "pods": pods, "held": held}


def upgrade_cluster(
    cluster: E2ECluster,
    namespace: str,
    service: str,
    like: str,
    name: str,
    *,
    without_replicas: bool = False,
) -> None:
    """A RayCluster of the service as KubeRay makes one for an upgrade: the same spec,
    the RayService's labels (KubeRay copies them), owned by the RayService; for an
    incremental upgrade every worker group's ``replicas`` left out."""
    original = cluster.custom.get_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayclusters", like
    )
    rayservice = cluster.custom.get_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayservices", service
    )
    labels = {
        k: v
        for k, v in (original["metadata"].get("labels") or {}).items()
        if k.startswith("tpuslice.dev/") or k == "app.kubernetes.io/managed-by"
    }
    body = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "ray.io/v1",
                    "kind": "RayService",
                    "name": service,
                    "uid": rayservice["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": copy.deepcopy(original["spec"]),
    }
    if without_replicas:
        for group in body["spec"]["workerGroupSpecs"]:
            group.pop("replicas", None)
    cluster.custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", body)


@pytest.fixture
def service_pools(cluster: E2ECluster, namespace: str, operator: OperatorProcess) -> Iterator[None]:
    for name in POOLS:
        kube.wait_nodes_ready(
            cluster.api, kube.create_pool(cluster.api, TPUPool(name, TYPE, TOPOLOGY, nodes=HOSTS))
        )
    yield
    kubectl(
        cluster,
        "delete",
        "tss",
        "--all",
        "-n",
        namespace,
        "--wait=true",
        "--timeout=120s",
        check=False,
    )
    kube.wait_for(
        lambda: not cluster.core.list_namespaced_pod(namespace).items,
        timeout_s=120,
        what=f"pods of {namespace} gone",
    )
    for name in POOLS:
        kube.delete_pool(cluster.api, name)


def test_a_services_clusters_get_slices_and_an_upgrade_never_takes_the_serving_pools(
    cluster: E2ECluster, namespace: str, service_pools: None
) -> None:
    name = "serve"
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, tss(name))

        def first() -> str | None:
            obj = get_tss(cluster, namespace, name)
            pending = ((obj.get("status") or {}).get("pendingCluster") or {}).get("name")
            if pending and running_on_its_pool(cluster, namespace, name, pending):
                return str(pending)
            return None

        first_cluster = kube.wait_for(
            first,
            timeout_s=TIMEOUT_S,
            what="the RayService's cluster with its slice reserved and running",
            describe=lambda: describe_service(cluster, namespace, name),
        )
        assert first_cluster.startswith(f"{name}-")
        kube.wait_for(
            lambda: (
                "slices ready, waiting for Serve"
                in condition(get_tss(cluster, namespace, name), "Ready").get("message", "")
            ),
            timeout_s=60,
            what="Ready=False saying the slices are ready and Serve is awaited",
            describe=lambda: describe_service(cluster, namespace, name),
        )
        first_reservation = service_reservations(cluster, namespace, name)[first_cluster]

        # an upgrade with a spare pool: the new cluster's slice takes it
        upgrade_cluster(cluster, namespace, name, first_cluster, f"{name}-upgrade-b")
        kube.wait_for(
            lambda: running_on_its_pool(cluster, namespace, name, f"{name}-upgrade-b"),
            timeout_s=TIMEOUT_S,
            what="the upgrade cluster running on a spare pool",
            describe=lambda: describe_service(cluster, namespace, name),
        )
        held = service_reservations(cluster, namespace, name)
        assert held[first_cluster]["metadata"]["uid"] == first_reservation["metadata"]["uid"]
        assert {r["spec"]["nodePool"] for r in held.values()} == set(POOLS)

        # an upgrade with no spare pool: it waits, holding nothing, taking nothing
        upgrade_cluster(cluster, namespace, name, first_cluster, f"{name}-upgrade-c")
        kube.wait_for(
            lambda: len(workers_of(cluster, namespace, f"{name}-upgrade-c")) == HOSTS,
            timeout_s=TIMEOUT_S,
            what="KubeRay made the third cluster's worker pods",
        )
        time.sleep(10)  # a few passes (resync 10 s): it must keep waiting
        assert all(gated(p) for p in workers_of(cluster, namespace, f"{name}-upgrade-c"))
        held = service_reservations(cluster, namespace, name)
        assert f"{name}-upgrade-c" not in held
        assert running_on_its_pool(cluster, namespace, name, first_cluster)
        assert running_on_its_pool(cluster, namespace, name, f"{name}-upgrade-b")

        # the old cluster goes (as after KubeRay's switch): its pool goes to the waiting one
        kubectl(
            cluster,
            "delete",
            "raycluster",
            f"{name}-upgrade-b",
            "-n",
            namespace,
            "--wait=true",
            "--timeout=120s",
        )
        kube.wait_for(
            lambda: running_on_its_pool(cluster, namespace, name, f"{name}-upgrade-c"),
            timeout_s=TIMEOUT_S,
            what="the waiting cluster running on the pool the deleted one gave back",
            describe=lambda: describe_service(cluster, namespace, name),
        )
        assert f"{name}-upgrade-b" not in service_reservations(cluster, namespace, name)
        assert running_on_its_pool(cluster, namespace, name, first_cluster)

        kubectl(cluster, "delete", "tss", name, "-n", namespace, "--wait=true", "--timeout=120s")

    def kuberay_left() -> list[str]:
        return [
            f"{plural}/{o['metadata']['name']}"
            for plural in ("rayservices", "rayclusters")
            for o in cluster.custom.list_namespaced_custom_object(
                "ray.io", "v1", namespace, plural
            )["items"]
        ]

    kube.wait_for(
        lambda: not kuberay_left(),
        timeout_s=120,
        what="no RayService or RayCluster left",
        describe=kuberay_left,
    )
    kube.wait_for(
        lambda: not cluster.core.list_namespaced_pod(namespace).items,
        timeout_s=120,
        what="the service's pods gone",
    )
    assert not service_reservations(cluster, namespace, name)
    watch.check(min_samples=20)


EXTRA_POOL = "svc-v5p-c"
REPLICA_NAME = "ray.io/worker-group-replica-name"


def elastic_tss(name: str) -> dict[str, Any]:
    """An elastic TPUSliceService (1 to 2 slices) upgraded by KubeRay's incremental
    strategy (the gateway class is never reached on the local cluster)."""
    body = tss(name)
    body["spec"]["elastic"] = {"minSlices": 1, "maxSlices": 2}
    body["spec"]["serve"]["upgradeStrategy"] = {
        "type": "NewClusterWithIncrementalUpgrade",
        "clusterUpgradeOptions": {
            "gatewayClassName": "istio",
            "maxSurgePercent": 50,
            "stepSizePercent": 10,
            "intervalSeconds": 10,
        },
    }
    return body


def pools_held(cluster: E2ECluster, namespace: str, name: str) -> dict[str, dict[str, str]]:
    """RayCluster name -> {pool: reservation uid} of the service's reservations."""
    held: dict[str, dict[str, str]] = {}
    for r in reservations(cluster):
        holder = r["spec"]["holder"]
        if holder.get("kind") == "TPUSliceService" and (
            holder["namespace"],
            holder["name"],
        ) == (namespace, name):
            held.setdefault(holder.get("rayCluster", ""), {})[r["spec"]["nodePool"]] = r[
                "metadata"
            ]["uid"]
    return held


def placed_slices(cluster: E2ECluster, namespace: str, name: str, raycluster: str) -> int:
    """Slices of ``raycluster`` whose every host runs ungated on a pool the cluster holds."""
    pools = set(pools_held(cluster, namespace, name).get(raycluster, {}))
    replicas: dict[str, list[Any]] = {}
    for pod in workers_of(cluster, namespace, raycluster):
        replicas.setdefault((pod.metadata.labels or {}).get(REPLICA_NAME, ""), []).append(pod)
    return sum(
        1
        for pods in replicas.values()
        if len(pods) == HOSTS
        and all(
            not gated(p)
            and p.status.phase == "Running"
            and (p.spec.node_selector or {}).get("cloud.google.com/gke-nodepool") in pools
            for p in pods
        )
    )


def test_an_incremental_upgrade_reserves_the_new_clusters_slices_and_never_the_serving_ones(
    cluster: E2ECluster, namespace: str, service_pools: None
) -> None:
    """KubeRay's NewClusterWithIncrementalUpgrade, played at the capacity level: the new
    cluster starts at its minimum and the Ray autoscaler grows it while it shrinks the
    serving one (the local cluster runs no Ray, no gateway and KubeRay without the
    ``RayServiceIncrementalUpgrade`` gate, so the test makes the new cluster as KubeRay
    does and sends the autoscaler's patches with ``tpusim.autoscaler``). Every slice of
    the new cluster is reserved whole before its pods run; the serving cluster's pools
    are never taken, and a slice the autoscaler asks for with no free pool waits until
    the serving cluster's scale-down gives one back."""
    name = "inc"
    kube.wait_nodes_ready(
        cluster.api, kube.create_pool(cluster.api, TPUPool(EXTRA_POOL, TYPE, TOPOLOGY, nodes=HOSTS))
    )
    try:
        with InvariantWatch(cluster, namespace) as watch:
            apply(cluster, namespace, elastic_tss(name))

            def serving() -> str | None:
                obj = get_tss(cluster, namespace, name)
                rc = ((obj.get("status") or {}).get("pendingCluster") or {}).get("name")
                return rc if rc and placed_slices(cluster, namespace, name, rc) == 1 else None

            old = str(
                kube.wait_for(
                    serving,
                    timeout_s=TIMEOUT_S,
                    what="the service's cluster with its minimum slice reserved and running",
                    describe=lambda: describe_service(cluster, namespace, name),
                )
            )
            autoscaler.scale(cluster.api, namespace, old, None, 2)
            kube.wait_for(
                lambda: placed_slices(cluster, namespace, name, old) == 2,
                timeout_s=TIMEOUT_S,
                what="the serving cluster grown to 2 slices on 2 pools",
                describe=lambda: describe_service(cluster, namespace, name),
            )
            serving_pools = pools_held(cluster, namespace, name)[old]
            (free_pool,) = {*POOLS, EXTRA_POOL} - set(serving_pools)

            # the upgrade's cluster starts at its minimum: the one free pool
            new = f"{name}-incremental"
            # the new cluster as KubeRay 1.5 makes it for this strategy: no replicas, so it
            # starts at minReplicas and the Ray autoscaler grows it with Serve's target
            # capacity (ray-operator/controllers/ray/rayservice_controller.go,
            # isPendingClusterForUpgrade)
            upgrade_cluster(cluster, namespace, name, old, new, without_replicas=True)
            kube.wait_for(
                lambda: placed_slices(cluster, namespace, name, new) == 1,
                timeout_s=TIMEOUT_S,
                what="the new cluster's minimum slice on the free pool",
                describe=lambda: describe_service(cluster, namespace, name),
            )
            held = pools_held(cluster, namespace, name)
            assert held[old] == serving_pools
            assert set(held[new]) == {free_pool}

            # Serve's target capacity rises: a second slice, no free pool, so it waits
            autoscaler.scale(cluster.api, namespace, new, None, 2)
            kube.wait_for(
                lambda: len(workers_of(cluster, namespace, new)) == 2 * HOSTS,
                timeout_s=TIMEOUT_S,
                what="KubeRay made the new cluster's second slice",
            )
            time.sleep(10)  # a few passes (resync 10 s): it must keep waiting
            assert sum(gated(p) for p in workers_of(cluster, namespace, new)) == HOSTS
            held = pools_held(cluster, namespace, name)
            assert held[old] == serving_pools
            assert set(held[new]) == {free_pool}
            assert placed_slices(cluster, namespace, name, old) == 2

            # the serving cluster's capacity falls: Ray removes one of its slices
            replica = (workers_of(cluster, namespace, old)[0].metadata.labels or {})[REPLICA_NAME]
            host = next(
                p.metadata.name
                for p in workers_of(cluster, namespace, old)
                if (p.metadata.labels or {}).get(REPLICA_NAME) == replica
            )
            autoscaler.delete_pods(cluster.api, namespace, old, [host])
            kube.wait_for(
                lambda: placed_slices(cluster, namespace, name, new) == 2,
                timeout_s=TIMEOUT_S,
                what="the new cluster's second slice on the pool the serving one gave back",
                describe=lambda: describe_service(cluster, namespace, name),
            )
            held = pools_held(cluster, namespace, name)
            assert len(held[old]) == 1 and set(held[old]) < set(serving_pools)
            assert held[old].items() <= serving_pools.items()  # the kept slice's claim
            assert len(held[new]) == 2 and not set(held[new]) & set(held[old])
            assert placed_slices(cluster, namespace, name, old) == 1

            kubectl(
                cluster, "delete", "tss", name, "-n", namespace, "--wait=true", "--timeout=120s"
            )
            kube.wait_for(
                lambda: (
                    not pools_held(cluster, namespace, name)
                    and not cluster.core.list_namespaced_pod(namespace).items
                ),
                timeout_s=120,
                what="the service's pods and reservations gone",
            )
            watch.check(min_samples=20)
    finally:
        kube.delete_pool(cluster.api, EXTRA_POOL)
