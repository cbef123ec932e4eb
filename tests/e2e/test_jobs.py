"""TPUSliceJob on the local cluster with the real KubeRay.

KubeRay makes each attempt's RayCluster (``<job>-<random>``) and the submitter Job.
The local cluster's pods never run Ray: the submitter pod is completed by KWOK, and
KubeRay then fails the attempt after its 30 s grace period
(``JobDeploymentStatusTransitionGracePeriodExceeded``), so with ``backoffLimit: 1``
every job here runs two real attempts and ends ``Failed``. What is checked on the way:

- the first attempt's cluster gets its slices reserved (SliceReservations held by
  the TPUSliceJob) and released, and KubeRay creates its submitter;
- the retry's new RayCluster gets the same pools back, slice by slice, without passing
  through the queue: the reservations are the same objects (same uid) from the first
  claim to the end, and a TPUSliceCluster of the same shape that waits for capacity
  meanwhile gets nothing until the job has ended;
- the job ends Failed (kstatus Stalled) and its pools are given back once its pods
  are gone; the waiting cluster then gets them;
- a TPUSliceJob deleted while running leaves nothing behind.

Two pools of v5e 2x4 (4-chip hosts: two nodes a pool) are added and removed by the
``job_pools`` fixture, which cordons the default pool of that shape meanwhile;
``InvariantWatch`` samples pods and reservations throughout.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import (
    GROUP,
    NODEPOOL,
    VERSION,
    InvariantWatch,
    apply,
    condition,
    event_reasons,
    kubectl,
    reservations,
    shape_nodes,
    tsc,
)
from tests.support.gitops import argocd_health, kstatus
from tpusim import kube
from tpusim.nodepools import TPUPool
from tpusim.operator_process import OperatorProcess

TYPE, TOPOLOGY, HOSTS = "v5e", "2x4", 2
ACCELERATOR = "tpu-v5-lite-podslice"
TIMEOUT_S = 240  # KubeRay, the scheduler and the operator share 2 cores with the test
POOLS = ("jobs-v5e-a", "jobs-v5e-b")
JOB_LUA = Path(__file__).resolve().parents[2] / "docs" / "gitops" / "argocd-health-tpuslicejob.lua"


def tsj(name: str, slices: int = 2, **job: Any) -> dict[str, Any]:
    body = tsc(name, type_=TYPE, topology=TOPOLOGY, slices=slices)
    body["kind"] = "TPUSliceJob"
    body["spec"]["tpu"]["chipsPerHost"] = 4
    body["spec"]["job"] = {"entrypoint": "python -c 'print(1)'", **job}
    return body


def get_tsj(cluster: E2ECluster, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "tpuslicejobs", name
    )
    return obj


def job_reservations(cluster: E2ECluster, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    """pool -> reservation, for the reservations held by the TPUSliceJob."""
    return {
        r["spec"]["nodePool"]: r
        for r in reservations(cluster)
        if r["spec"]["holder"].get("kind") == "TPUSliceJob"
        and (r["spec"]["holder"]["namespace"], r["spec"]["holder"]["name"]) == (namespace, name)
    }


def describe_job(cluster: E2ECluster, namespace: str, name: str) -> Any:
    try:
        status = get_tsj(cluster, namespace, name).get("status")
    except Exception as exc:
        status = repr(exc)
    pods = [
        f"{p.metadata.name}:{p.status.phase}@{p.spec.node_name}"
        f"{' gated' if p.spec.scheduling_gates else ''}"
        for p in cluster.core.list_namespaced_pod(namespace).items
    ]
    return {
        "status": status,
        "pods": pods,
        "held": sorted(job_reservations(cluster, namespace, name)),
    }


def slices_ready_on(obj: dict[str, Any], cluster_name: str) -> dict[int, str] | None:
    """index -> pool when every desired slice of the attempt on ``cluster_name`` is Ready."""
    status = obj.get("status") or {}
    slices = [s for s in status.get("slices") or [] if s.get("state") == "Ready"]
    if status.get("rayCluster") != cluster_name or len(slices) != status.get("desiredSlices"):
        return None
    return {int(s["index"]): str(s["nodePool"]) for s in slices}


@pytest.fixture
def job_pools(cluster: E2ECluster, namespace: str, operator: OperatorProcess) -> Iterator[None]:
    """The test's own two pools; every other node of the shape (the default pool
    ``v5e-2x4``) cordoned meanwhile, which makes its pool ineligible. Free pools of a
    shape are taken in each cluster's own hash order, so a third free pool would be
    taken as often as these."""
    others = [
        n.metadata.name
        for n in shape_nodes(cluster, ACCELERATOR, TOPOLOGY)
        if n.metadata.labels[NODEPOOL] not in POOLS and not n.spec.unschedulable
    ]
    for node in others:
        kube.cordon(cluster.api, node)
    for name in POOLS:
        pool = TPUPool(name, TYPE, TOPOLOGY, nodes=HOSTS)
        kube.wait_nodes_ready(cluster.api, kube.create_pool(cluster.api, pool))
    yield
    for kind in ("tpuslicejobs", "tpusliceclusters"):
        kubectl(
            cluster,
            "delete",
            kind,
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
    for node in others:
        kube.cordon(cluster.api, node, unschedulable=False)


def wait_job(cluster: E2ECluster, namespace: str, name: str, check: Any, what: str) -> Any:
    return kube.wait_for(
        lambda: check(get_tsj(cluster, namespace, name)),
        timeout_s=TIMEOUT_S,
        what=f"{namespace}/{name}: {what}",
        describe=lambda: describe_job(cluster, namespace, name),
    )


def test_a_retry_gets_the_jobs_pools_back_without_the_queue(
    cluster: E2ECluster, namespace: str, job_pools: None
) -> None:
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, tsj("train", backoffLimit=1))

        # attempt 1: its cluster's slices reserved by the job, KubeRay's submitter made
        def first(obj: dict[str, Any]) -> tuple[str, dict[int, str]] | None:
            name = (obj.get("status") or {}).get("rayCluster") or ""
            ready = slices_ready_on(obj, name) if name else None
            return (name, ready) if ready and obj["status"].get("attempts") == 1 else None

        first_cluster, first_pools = wait_job(
            cluster, namespace, "train", first, "attempt 1 with 2 slices Ready"
        )
        assert first_cluster.startswith("train-")
        # GitOps tools read the real object as on its way
        running = get_tsj(cluster, namespace, "train")
        assert argocd_health(running, JOB_LUA)["status"] == "Progressing", running["status"]
        assert kstatus(running) == "InProgress"
        assert sorted(first_pools.values()) == sorted(POOLS)
        held = job_reservations(cluster, namespace, "train")
        uids = {pool: r["metadata"]["uid"] for pool, r in held.items()}
        assert set(uids) == set(POOLS)
        assert all(
            r["spec"]["holder"]["uid"] == get_tsj(cluster, namespace, "train")["metadata"]["uid"]
            for r in held.values()
        )
        kube.wait_for(
            lambda: (
                client.BatchV1Api(cluster.api)
                .list_namespaced_job(
                    namespace, label_selector="ray.io/originated-from-cr-name=train"
                )
                .items
            ),
            timeout_s=TIMEOUT_S,
            what="KubeRay's submitter Job for the RayJob",
        )

        # a cluster of the same shape arrives and waits: every pool is the job's
        waiting = tsc("waiter", type_=TYPE, topology=TOPOLOGY, slices=2)
        waiting["spec"]["tpu"]["chipsPerHost"] = 4
        apply(cluster, namespace, waiting)

        # attempt 2 on a new RayCluster: the same pools, slice by slice, same reservations
        def second(obj: dict[str, Any]) -> tuple[str, dict[int, str]] | None:
            name = (obj.get("status") or {}).get("rayCluster") or ""
            if name in ("", first_cluster) or obj["status"].get("attempts") != 2:
                return None
            ready = slices_ready_on(obj, name)
            return (name, ready) if ready else None

        second_cluster, second_pools = wait_job(
            cluster, namespace, "train", second, "attempt 2 with 2 slices Ready on a new cluster"
        )
        assert second_pools == first_pools
        held = job_reservations(cluster, namespace, "train")
        assert {pool: r["metadata"]["uid"] for pool, r in held.items()} == uids
        replicas = {
            p.metadata.labels["ray.io/worker-group-replica-name"]
            for p in cluster.core.list_namespaced_pod(
                namespace, label_selector=f"ray.io/cluster={second_cluster},ray.io/node-type=worker"
            ).items
        }
        assert {r["spec"]["holder"]["replicaName"] for r in held.values()} == replicas
        assert "SliceHandedOver" in event_reasons(cluster, namespace)
        tsc_obj = cluster.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "tpusliceclusters", "waiter"
        )
        assert condition(tsc_obj, "Ready").get("reason") == "WaitingForCapacity", tsc_obj

        # the job ends Failed (both attempts failed); its pools go once its pods are gone
        ended = wait_job(
            cluster,
            namespace,
            "train",
            lambda o: o if condition(o, "Failed").get("status") == "True" else None,
            "Failed=True",
        )
        assert condition(ended, "Stalled").get("status") == "True"
        assert condition(ended, "Complete").get("status") == "False"
        assert ended["status"]["attempts"] == 2
        assert argocd_health(ended, JOB_LUA)["status"] == "Degraded"
        assert kstatus(ended) == "Failed"
        kube.wait_for(
            lambda: not job_reservations(cluster, namespace, "train"),
            timeout_s=TIMEOUT_S,
            what="the ended job's reservations deleted",
            describe=lambda: describe_job(cluster, namespace, "train"),
        )
        assert not cluster.core.list_namespaced_pod(
            namespace, label_selector="tpuslice.dev/owner-kind=TPUSliceJob"
        ).items
        # the waiting cluster now gets the pools
        kube.wait_for(
            lambda: (
                condition(
                    cluster.custom.get_namespaced_custom_object(
                        GROUP, VERSION, namespace, "tpusliceclusters", "waiter"
                    ),
                    "Ready",
                ).get("status")
                == "True"
            ),
            timeout_s=TIMEOUT_S,
            what="the waiting cluster Ready on the pools the job gave back",
        )
    watch.check(min_samples=20)


def test_a_deleted_job_leaves_nothing_behind(
    cluster: E2ECluster, namespace: str, job_pools: None
) -> None:
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, tsj("short", slices=1, backoffLimit=0))
        wait_job(
            cluster,
            namespace,
            "short",
            lambda o: slices_ready_on(o, (o.get("status") or {}).get("rayCluster") or "-"),
            "1 slice Ready",
        )
        assert len(job_reservations(cluster, namespace, "short")) == 1
        kubectl(cluster, "delete", "tsj", "short", "-n", namespace, "--wait=true", "--timeout=120s")
    for plural in ("rayjobs", "rayclusters"):
        assert not cluster.custom.list_namespaced_custom_object("ray.io", "v1", namespace, plural)[
            "items"
        ], plural
    assert not job_reservations(cluster, namespace, "short")
    kube.wait_for(
        lambda: (
            not cluster.core.list_namespaced_pod(namespace).items
            and not client.BatchV1Api(cluster.api).list_namespaced_job(namespace).items
        ),
        timeout_s=120,
        what="the job's pods and submitter Job gone",
    )
    watch.check()
