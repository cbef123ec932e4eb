"""Talking to the cluster: node-pool operations and bounded waits.

Thin functions over the ``kubernetes`` client that tests and the CLI share.
They work against any cluster with KWOK watching ``kwok.x-k8s.io/node=fake``,
not only the local one, so the e2e tier can run on kind too.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client import ApiException

from .maintenance import node_taints, patch_for
from .nodepools import KWOK_ANNOTATION, POOL_ANNOTATION, NodePool, pool_nodes
from .stages import DEAD_KUBELET_ANNOTATION

__all__ = [
    "WaitTimeout",
    "api_client",
    "apiextensions_v1",
    "cordon",
    "core_v1",
    "create_pool",
    "delete_node",
    "delete_pool",
    "disrupt",
    "harness_nodes",
    "node_ready",
    "restore_node",
    "set_node_not_ready",
    "wait_for",
    "wait_nodes_ready",
]

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A bounded wait ran out; the message says what and the last thing seen.

    An AssertionError so pytest shows it as a test failure, not an error.
    """


def api_client(kubeconfig: Path) -> Any:
    """An ApiClient for ``kubeconfig`` (no global default configuration touched)."""
    return config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]


def core_v1(api: Any) -> Any:
    """CoreV1Api typed as Any: we pass plain dicts, which the typed stubs reject."""
    return client.CoreV1Api(api)


def apiextensions_v1(api: Any) -> Any:
    """ApiextensionsV1Api typed as Any (CRDs are passed as plain dicts)."""
    return client.ApiextensionsV1Api(api)


def install_crd(api: Any, body: dict[str, Any], timeout_s: float = 60.0) -> None:
    """Create (or replace) the CRD ``body`` and wait until it is Established: the fakes
    of GKE's APIs (ProvisioningRequest, Slice) install theirs this way."""
    ext = apiextensions_v1(api)
    name = body["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        current = ext.read_custom_resource_definition(name)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(name, body)

    def established() -> bool:
        crd = ext.read_custom_resource_definition(name)
        conditions = (crd.status and crd.status.conditions) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_for(established, timeout_s=timeout_s, what=f"CRD {name} Established")


def uninstall_crd(api: Any, name: str, timeout_s: float = 60.0) -> None:
    """Delete the CRD ``name`` (and every object of it) and wait until it is gone."""
    ext = apiextensions_v1(api)
    try:
        ext.delete_custom_resource_definition(name)
    except ApiException as exc:
        if exc.status != 404:
            raise

    def gone() -> bool:
        try:
            ext.read_custom_resource_definition(name)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    wait_for(gone, timeout_s=timeout_s, what=f"CRD {name} deleted")


def wait_for(
    check: Callable[[], T | None],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.5,
    describe: Callable[[], object] | None = None,
) -> T:
    """Poll ``check`` until it returns something truthy and return that.

    On timeout raise WaitTimeout naming ``what`` and, if given, ``describe()``
    (the state a human needs to see why it never happened).
    """
    deadline = time.monotonic() + timeout_s
    last_error: ApiException | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except ApiException as exc:
            last_error = exc
        if time.monotonic() > deadline:
            state = ""
            if describe is not None:
                try:
                    state = f"; last state: {describe()}"
                except ApiException as exc:
                    state = f"; describe failed: {exc.reason}"
            err = f"; last API error: {last_error.status} {last_error.reason}" if last_error else ""
            raise WaitTimeout(f"timed out after {timeout_s:.0f}s waiting for {what}{state}{err}")
        time.sleep(interval_s)


def node_ready(node: Any) -> bool:
    """True when the Node's Ready condition is True."""
    for cond in (node.status and node.status.conditions) or []:
        if cond.type == "Ready":
            return bool(cond.status == "True")
    return False


def create_pool(api: Any, pool: NodePool, cluster: str = "tpusim") -> list[str]:
    """Create the pool's Nodes (KWOK then marks them Ready); return their names."""
    core = core_v1(api)
    names = []
    for node in pool_nodes(pool, cluster):
        core.create_node(body=node)
        names.append(node["metadata"]["name"])
    return names


def wait_nodes_ready(api: Any, names: Iterable[str], timeout_s: float = 60.0) -> None:
    """Wait until every named node is Ready (KWOK's node-initialize stage ran)."""
    core = core_v1(api)
    wanted = set(names)

    def not_ready() -> list[str]:
        nodes = core.list_node().items
        ready = {n.metadata.name for n in nodes if node_ready(n)}
        return sorted(wanted - ready)

    wait_for(
        lambda: not not_ready(),
        timeout_s=timeout_s,
        what=f"{len(wanted)} nodes Ready (is KWOK running and watching kwok.x-k8s.io/node=fake?)",
        describe=lambda: f"not ready: {not_ready()}",
    )


def harness_nodes(api: Any, pool: str | None = None) -> list[Any]:
    """Nodes this harness created (optionally of one pool)."""
    selector = f"cloud.google.com/gke-nodepool={pool}" if pool else None
    nodes = core_v1(api).list_node(label_selector=selector).items
    return [n for n in nodes if POOL_ANNOTATION in (n.metadata.annotations or {})]


def delete_node(api: Any, name: str) -> None:
    """Delete one node, as GKE does when it removes a VM; pods on it are orphaned (the
    pod garbage collector deletes them after its quarantine, about a minute)."""
    try:
        core_v1(api).delete_node(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def delete_pool(api: Any, pool: str, timeout_s: float = 60.0) -> None:
    """Delete every node of ``pool`` and wait until they are gone."""
    for node in harness_nodes(api, pool):
        delete_node(api, node.metadata.name)
    wait_for(
        lambda: not harness_nodes(api, pool),
        timeout_s=timeout_s,
        what=f"nodes of pool {pool} deleted",
    )


def disrupt(
    api: Any,
    name: str,
    action: str,
    *,
    in_s: float = 3600.0,
    latest_in_s: float | None = None,
    state: str = "",
) -> None:
    """Put one of GKE's node signals on a node (``tpusim.maintenance``: the actions of
    ``python -m tpusim schedule-maintenance|start-maintenance|...``); ValueError when it
    does not apply to that node."""
    core = core_v1(api)
    node = core.read_node(name)
    patch = patch_for(
        action,
        node.metadata.labels or {},
        node_taints(node),
        now_s=time.time(),
        in_s=in_s,
        latest_in_s=latest_in_s,
        state=state,
    )
    core.patch_node(name, patch)


def cordon(api: Any, name: str, unschedulable: bool = True) -> None:
    """Cordon (or uncordon) a node like `kubectl cordon`."""
    core_v1(api).patch_node(name, {"spec": {"unschedulable": unschedulable}})


def _mark_pods(api: Any, node: str, value: str | None) -> None:
    """Set (or with None remove) the dead-kubelet mark on every pod bound to ``node``."""
    core = core_v1(api)
    for pod in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items:
        marked = (pod.metadata.annotations or {}).get(DEAD_KUBELET_ANNOTATION)
        if (marked is None) == (value is None):
            continue
        try:
            core.patch_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                {"metadata": {"annotations": {DEAD_KUBELET_ANNOTATION: value}}},
            )
        except ApiException as exc:
            if exc.status != 404:  # gone meanwhile
                raise


def set_node_not_ready(api: Any, name: str, reason: str = "KubeletNotReady") -> None:
    """Make a node NotReady and keep it so, like a node whose kubelet died.

    KWOK's node-initialize stage flips any managed node whose Ready is not True
    back to True, so first take the node away from KWOK (drop its annotation),
    then write Ready=False as a dead kubelet's last status would. Nothing
    heartbeats the node afterwards, so the node lifecycle controller also sees
    its lease expire and taints it, as on a real cluster. Every pod on the node
    is marked (``stages.DEAD_KUBELET_ANNOTATION``): deleting it hangs, Terminating,
    until ``restore_node`` or ``delete_node`` (KWOK's pod-delete stage, as the local
    cluster runs it, skips marked pods). Pods bound to the node later are not marked;
    the node's not-ready taint keeps the scheduler away from it within seconds.

    The pods are marked first: a controller that acts on the NotReady at once (the
    operator drains a slice whose node is NotReady) must find their deletions hanging,
    as with a dead kubelet, not finished by KWOK in the moment before the mark.
    """
    core = core_v1(api)
    _mark_pods(api, name, name)
    core.patch_node(name, {"metadata": {"annotations": {KWOK_ANNOTATION[0]: None}}})
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": "Ready",
        "status": "False",
        "reason": reason,
        "message": "simulated by tpusim",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    core.patch_node_status(name, {"status": {"conditions": [condition]}})
    _mark_pods(api, name, name)  # any pod bound in between


def restore_node(api: Any, name: str) -> None:
    """Hand a node made NotReady back to KWOK, which marks it Ready again and finishes the
    deletions that hung meanwhile."""
    _mark_pods(api, name, None)
    core_v1(api).patch_node(
        name, {"metadata": {"annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]}}}
    )
