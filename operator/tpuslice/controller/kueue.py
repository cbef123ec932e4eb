"""Reading Kueue's side of an object Kueue admits: the Workload of its RayCluster or
RayJob, and, for capacity on demand, the ProvisioningRequest admission checks of the
ClusterQueue behind its LocalQueue. Read-only (the chart grants get and list on
Kueue's workloads, localqueues, clusterqueues, admissioncheck and
provisioningrequestconfigs).

Reads in the pass, not watches: only objects Kueue admits pay for them (one LIST of
their namespace's Workloads by Kueue's ``kueue.x-k8s.io/job-uid`` label per pass, and
with capacity on demand on, a few GETs more), and a cluster without Kueue pays nothing
(every Kueue object of the cluster followed in memory would cost every operator). What
a pass reads is what changes the pass's decision anyway: Kueue writes the Workload's
Evicted condition before it suspends the job (kubernetes-sigs/kueue v0.17.0
pkg/controller/jobframework/reconciler.go), and the suspension is a watched change of
the RayCluster or RayJob that passes the object again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuslice.model import constants as c
from tpuslice.model.convert import workload_info
from tpuslice.model.records import KueueWorkload
from tpuslice.runtime.kube import ClusterApi
from tpuslice.status.kueue import ProvisioningCheck

__all__ = ["provisioning_checks", "read_workload"]


async def read_workload(kube: ClusterApi, namespace: str, job_uid: str) -> KueueWorkload | None:
    """The Workload Kueue made for the job of ``job_uid`` (the newest, should there be
    several); None when there is none, or no uid yet."""
    if not job_uid:
        return None
    items = await kube.read_kueue(
        "workloads", namespace=namespace, label_selector=f"{c.KUEUE_JOB_UID_LABEL}={job_uid}"
    )
    if not items:
        return None
    newest = max(items, key=lambda w: str((w.get("metadata") or {}).get("creationTimestamp")))
    return workload_info(newest)


def _spec(obj: Any) -> Mapping[str, Any]:
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    return spec if isinstance(spec, Mapping) else {}


def _check_names(cluster_queue: Mapping[str, Any]) -> list[str]:
    """The admission checks of a ClusterQueue: ``spec.admissionChecks`` or the names in
    ``spec.admissionChecksStrategy.admissionChecks`` (apis/kueue/v1beta2
    clusterqueue_types.go)."""
    spec = _spec(cluster_queue)
    names = [str(n) for n in spec.get("admissionChecks") or []]
    strategy = spec.get("admissionChecksStrategy") or {}
    names += [str(r.get("name")) for r in strategy.get("admissionChecks") or [] if r.get("name")]
    return names


async def provisioning_checks(
    kube: ClusterApi, namespace: str, queue: str
) -> tuple[ProvisioningCheck, ...]:
    """The ProvisioningRequest admission checks (controllerName
    ``kueue.x-k8s.io/provisioning-request``) of the ClusterQueue of LocalQueue ``queue``,
    each with its ProvisioningRequestConfig's ``managedResources``."""
    local = await kube.read_kueue("localqueues", namespace=namespace, name=queue)
    cluster_queue = str(_spec(local).get("clusterQueue") or "")
    if not cluster_queue:
        return ()
    found = await kube.read_kueue("clusterqueues", name=cluster_queue)
    out: list[ProvisioningCheck] = []
    for name in _check_names(found or {}):
        check = _spec(await kube.read_kueue("admissionchecks", name=name))
        if check.get("controllerName") != c.KUEUE_PROVREQ_CHECK:
            continue
        parameters = check.get("parameters") or {}
        managed: tuple[str, ...] = ()
        if parameters.get("kind") == "ProvisioningRequestConfig" and parameters.get("name"):
            config = await kube.read_kueue(
                "provisioningrequestconfigs", name=str(parameters["name"])
            )
            managed = tuple(str(r) for r in _spec(config).get("managedResources") or [])
        out.append(ProvisioningCheck(name, cluster_queue, managed))
    return tuple(out)
