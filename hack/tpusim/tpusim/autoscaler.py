"""A stand-in for Ray's autoscaler: the exact RayCluster patches it sends, on demand.

The e2e tier scales elastic TPU slices without a Ray head, so it needs to write
what Ray's autoscaler v2 writes, no more and no less. The patches follow Ray
2.60's ``KubeRayProvider`` (ray-project/ray, python/ray/autoscaler/v2/
instance_manager/cloud_providers/kuberay/cloud_provider.py,
``_initialize_scale_request`` and ``_submit_scale_request``; the patch shapes
from ray/autoscaler/_private/kuberay/node_provider.py ``worker_replica_patch``
and ``worker_delete_patch``):

- one JSON patch (``application/json-patch+json``) on the RayCluster;
- scale up: ``replace /spec/workerGroupSpecs/<i>/replicas`` with the new count
  (Ray divides the host count by ``numOfHosts`` and caps it at ``maxReplicas``;
  here the count is given in slices, so the cap is all that is left);
- scale down: ``replace /spec/workerGroupSpecs/<i>/scaleStrategy`` with
  ``{"workersToDelete": [pods]}``, with ``replicas`` lowered to ``(workers -
  named) // numOfHosts``; KubeRay then deletes each named pod's whole replica;
- nothing while a named pod still exists, and once they are all gone the next
  patch clears the list (``workersToDelete: []``).

Ray never lowers ``replicas`` without naming pods, so neither does this module.
tests/contract/test_ray_kuberay_autoscaler.py checks that these functions and
Ray's provider write the same patches for the same cluster.

The pure part (``worker_group``, ``live_workers``, ``scale_patch``,
``delete_patch``) takes the RayCluster and pods as the API returns them; the
shell (``scale``, ``delete_pods``) reads them, builds the patch and sends it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client

__all__ = [
    "JSON_PATCH",
    "MAX_PODS",
    "MAX_SLICES",
    "AutoscaleError",
    "WorkerGroup",
    "delete_patch",
    "delete_pods",
    "group_of_pods",
    "live_workers",
    "scale",
    "scale_patch",
    "worker_group",
]

KUBERAY_API_GROUP = "ray.io"
KUBERAY_API_VERSION = "v1"
RAYCLUSTERS = "rayclusters"
JSON_PATCH = "application/json-patch+json"
# KubeRay's pod labels, the ones Ray's provider reads (node_provider.py KUBERAY_LABEL_KEY_*).
CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
GROUP_LABEL = "ray.io/group"
# Bounds on what the harness is asked for; far above any local cluster.
MAX_SLICES = 1024
MAX_PODS = 4096

Patch = list[dict[str, Any]]


class AutoscaleError(ValueError):
    """A scale request Ray's autoscaler would not send; the message says why and what to do."""


@dataclass(frozen=True)
class WorkerGroup:
    """The fields of one ``workerGroupSpecs`` entry that Ray's provider reads."""

    index: int
    name: str
    replicas: int
    min_replicas: int
    max_replicas: int | None
    hosts: int
    workers_to_delete: tuple[str, ...]

    @property
    def path(self) -> str:
        return f"/spec/workerGroupSpecs/{self.index}"


def _count(group: Mapping[str, Any], key: str, default: int | None, where: str) -> int | None:
    value = group.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AutoscaleError(f"{where}.{key} is {value!r}; expected a non-negative integer")
    return value


def worker_group(raycluster: Mapping[str, Any], name: str | None = None) -> WorkerGroup:
    """The worker group ``name`` of a RayCluster (the only one when ``name`` is None).

    Defaults are KubeRay's as Ray reads them: ``replicas`` 1 and ``numOfHosts`` 1
    when absent (node_provider.py ``_worker_group_replicas``/``_num_of_hosts``),
    no cap without ``maxReplicas``.
    """
    groups = (raycluster.get("spec") or {}).get("workerGroupSpecs") or []
    names = [g.get("groupName") for g in groups]
    cluster = (raycluster.get("metadata") or {}).get("name", "?")
    if name is None:
        if len(groups) != 1:
            raise AutoscaleError(
                f"RayCluster {cluster} has worker groups {names}; name one with --group"
            )
        index = 0
    elif name in names:
        index = names.index(name)
    else:
        raise AutoscaleError(f"RayCluster {cluster} has no worker group {name!r}; it has {names}")
    group = groups[index]
    where = f"spec.workerGroupSpecs[{index}]"
    hosts = _count(group, "numOfHosts", 1, where)
    if not hosts:
        raise AutoscaleError(f"{where}.numOfHosts is 0; a group has at least one host")
    deletes = (group.get("scaleStrategy") or {}).get("workersToDelete") or []
    return WorkerGroup(
        index=index,
        name=str(names[index]),
        replicas=_count(group, "replicas", 1, where) or 0,
        min_replicas=_count(group, "minReplicas", 0, where) or 0,
        max_replicas=_count(group, "maxReplicas", None, where),
        hosts=hosts,
        workers_to_delete=tuple(str(w) for w in deletes),
    )


def _is_worker_of(pod: Mapping[str, Any], group: str | None) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(
        labels.get(NODE_TYPE_LABEL) == "worker"
        and (group is None or labels.get(GROUP_LABEL) == group)
    )


def live_workers(pods: Iterable[Mapping[str, Any]], group: str) -> list[str]:
    """Names of the group's worker pods not being deleted: what Ray counts as instances."""
    return [
        p["metadata"]["name"]
        for p in pods
        if _is_worker_of(p, group) and "deletionTimestamp" not in p["metadata"]
    ]


def group_of_pods(pods: Iterable[Mapping[str, Any]], names: Sequence[str]) -> str:
    """The one worker group the named pods belong to (Ray deletes per group)."""
    labels = {
        p["metadata"]["name"]: (p["metadata"].get("labels") or {})
        for p in pods
        if _is_worker_of(p, None)
    }
    unknown = [n for n in names if n not in labels]
    if unknown:
        raise AutoscaleError(f"{unknown} are not Ray worker pods of this cluster")
    groups = sorted({str(labels[n].get(GROUP_LABEL)) for n in names})
    if len(groups) != 1:
        raise AutoscaleError(f"the pods belong to groups {groups}; name pods of one group")
    return groups[0]


def _replace(path: str, value: Any) -> dict[str, Any]:
    return {"op": "replace", "path": path, "value": value}


def _workers(group: WorkerGroup, live: Sequence[str]) -> tuple[int, Patch]:
    """Ray's current worker count for the group, and the patch clearing finished deletes.

    Refuses while a pod named in ``workersToDelete`` still exists: Ray's
    provider sends nothing then and reports an error until KubeRay deleted it.
    """
    pending = sorted(set(group.workers_to_delete) & set(live))
    if pending:
        raise AutoscaleError(
            f"group {group.name} still deletes {pending}; wait until those pods are gone"
        )
    observed = sum(1 for name in live if name not in group.workers_to_delete)
    workers = max(max(group.replicas, group.min_replicas) * group.hosts, observed)
    clear = [_replace(f"{group.path}/scaleStrategy", {"workersToDelete": []})]
    return workers, clear if group.workers_to_delete else []


def _capped(group: WorkerGroup, replicas: int) -> int:
    return replicas if group.max_replicas is None else min(replicas, group.max_replicas)


def scale_patch(group: WorkerGroup, slices: int, live: Sequence[str]) -> Patch:
    """The JSON patch growing ``group`` to ``slices`` replicas (capped at ``maxReplicas``).

    Empty when nothing changes, as Ray sends no patch then.
    """
    if isinstance(slices, bool) or not 0 <= slices <= MAX_SLICES:
        raise AutoscaleError(f"--slices is {slices}; expected 0..{MAX_SLICES}")
    workers, clear = _workers(group, live)
    if slices < workers // group.hosts:
        raise AutoscaleError(
            f"group {group.name} has {workers // group.hosts} slices; Ray's autoscaler "
            f"never lowers replicas to {slices} without naming pods: use --delete-pod"
        )
    target = _capped(group, slices)
    resize = [] if target == group.replicas else [_replace(f"{group.path}/replicas", target)]
    return resize + clear


def delete_patch(group: WorkerGroup, pods: Sequence[str], live: Sequence[str]) -> Patch:
    """The JSON patch naming ``pods`` in ``workersToDelete``, ``replicas`` lowered as Ray does."""
    if not 0 < len(pods) <= MAX_PODS:
        raise AutoscaleError(f"--delete-pod names {len(pods)} pods; expected 1..{MAX_PODS}")
    if len(set(pods)) != len(pods):
        raise AutoscaleError(f"--delete-pod names a pod twice: {list(pods)}")
    absent = [p for p in pods if p not in live]
    if absent:
        raise AutoscaleError(f"{absent} are not live worker pods of group {group.name}")
    workers, _ = _workers(group, live)
    target = _capped(group, (workers - len(pods)) // group.hosts)
    resize = [] if target == group.replicas else [_replace(f"{group.path}/replicas", target)]
    return [*resize, _replace(f"{group.path}/scaleStrategy", {"workersToDelete": list(pods)})]


# ------------------------------------------------------------------ shell


def _read(api: Any, namespace: str, cluster: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The RayCluster and its pods as plain API dicts (camelCase, as Ray's client sees them)."""
    # Typed as Any: the objects are plain dicts, which the client's typed stubs do not say.
    custom: Any = client.CustomObjectsApi(api)
    core: Any = client.CoreV1Api(api)
    raycluster: dict[str, Any] = custom.get_namespaced_custom_object(
        KUBERAY_API_GROUP, KUBERAY_API_VERSION, namespace, RAYCLUSTERS, cluster
    )
    pod_list = core.list_namespaced_pod(namespace, label_selector=f"{CLUSTER_LABEL}={cluster}")
    pods: list[dict[str, Any]] = api.sanitize_for_serialization(pod_list)["items"]
    return raycluster, pods


def _send(api: Any, namespace: str, cluster: str, patch: Patch) -> None:
    if patch:
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            KUBERAY_API_GROUP,
            KUBERAY_API_VERSION,
            namespace,
            RAYCLUSTERS,
            cluster,
            patch,
            _content_type=JSON_PATCH,
        )


def scale(api: Any, namespace: str, cluster: str, group: str | None, slices: int) -> Patch:
    """Grow a worker group to ``slices`` as Ray's autoscaler would; returns the patch sent."""
    raycluster, pods = _read(api, namespace, cluster)
    spec = worker_group(raycluster, group)
    patch = scale_patch(spec, slices, live_workers(pods, spec.name))
    _send(api, namespace, cluster, patch)
    return patch


def delete_pods(api: Any, namespace: str, cluster: str, names: Sequence[str]) -> Patch:
    """Name worker pods in ``workersToDelete`` as Ray's autoscaler would; returns the patch sent."""
    raycluster, pods = _read(api, namespace, cluster)
    spec = worker_group(raycluster, group_of_pods(pods, names))
    patch = delete_patch(spec, names, live_workers(pods, spec.name))
    _send(api, namespace, cluster, patch)
    return patch
