"""Pods, nodes and RayClusters: followed by our own watches into stores, each change a kick.

kopf still handles TPUSliceClusters and SliceReservations (finalizer, timers,
indexes); the three kinds here are the numerous ones, and kopf's per-object
machinery for them cost minutes of start-up and most of the operator's memory
at 4,000 nodes (docs/performance.md). Each watch runs on its own thread in
kube.py and delivers small records to the event loop; ``Watches.start`` returns
only when every kind has been listed once, so no reconcile ever sees a
half-filled store. What each change kicks is decided by pure functions here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tpuslice import constants as c
from tpuslice.convert import node_info, pod_info, raycluster_info
from tpuslice.kube import Deliver, Followed, Kube
from tpuslice.records import ClusterKey, NodeInfo, PodInfo, Shape
from tpuslice.store import Change, ObjectKey, RecordStore

__all__ = ["Watches", "apply", "followed_kinds", "node_kicks", "pod_kicks"]

POD_GONE_POLL_SECONDS = 0.5


def _pod_group(pod: PodInfo) -> ClusterKey:
    return pod.namespace, pod.cluster


def _node_group(node: NodeInfo) -> Shape:
    return node.accelerator, node.topology


def _no_group(_: Any) -> None:
    return None


def apply(
    store: RecordStore[Any],
    event: str | None,
    records: Mapping[ObjectKey, Any],
    namespace: str = "",
) -> list[Change[Any]]:
    """Fold one delivery (a listing of ``namespace`` or of all, or one watch event) into
    ``store``; the real changes.

    A MODIFIED whose record equals the stored one (a node heartbeat, a pod status
    field we do not keep) is no change at all."""
    if event is None:
        return store.replace(records, namespace)
    changes = []
    for key, record in records.items():
        if event == "DELETED":
            gone = store.remove(key)
            if gone is not None:
                changes.append(gone)
        elif store.get(key) != record:
            changes.append(store.put(key, record))
    return changes


def pod_kicks(changes: Iterable[Change[PodInfo]]) -> set[ClusterKey]:
    return {_pod_group(ch.record) for ch in changes}


def node_kicks(
    changes: Iterable[Change[NodeInfo]],
    waiting_for: Callable[[Shape], set[ClusterKey]],
    holders_of: Callable[[Shape, str], set[ClusterKey]],
) -> tuple[set[Shape], set[ClusterKey]]:
    """The shapes whose pool index is stale, and the clusters to kick: those waiting for
    capacity of the shape, and the holder of each changed node's pool."""
    shapes: set[Shape] = set()
    keys: set[ClusterKey] = set()
    for ch in changes:
        for record in (ch.old, ch.new):
            if record is None:
                continue
            shape = _node_group(record)
            shapes.add(shape)
            keys |= holders_of(shape, record.pool)
    for shape in shapes:
        keys |= waiting_for(shape)
    return shapes, keys


def followed_kinds(namespaces: Iterable[str]) -> list[Followed]:
    """What the operator lists and watches itself (the chart grants list+watch on each):
    TPU nodes, and the pods and RayClusters labelled with a TPUSliceCluster, per
    namespace when the operator is namespace-scoped."""
    kinds = [Followed("", "v1", "nodes", node_info, c.NODE_LABEL_ACCELERATOR)]
    for ns in list(namespaces) or [""]:
        kinds.append(Followed("", "v1", "pods", pod_info, c.LABEL_CLUSTER, ns))
        kinds.append(
            Followed(
                c.RAY_GROUP,
                c.RAY_VERSION,
                c.RAY_PLURAL_CLUSTER,
                raycluster_info,
                c.LABEL_CLUSTER,
                ns,
            )
        )
    return kinds


@dataclass
class Watches:
    """The three stores, and the watches that fill them."""

    pods: RecordStore[PodInfo] = field(default_factory=lambda: RecordStore(_pod_group))
    nodes: RecordStore[NodeInfo] = field(default_factory=lambda: RecordStore(_node_group))
    rayclusters: RecordStore[dict[str, Any]] = field(default_factory=lambda: RecordStore(_no_group))
    _stops: list[threading.Event] = field(default_factory=list)

    def pods_of(self, key: ClusterKey) -> list[PodInfo]:
        return self.pods.group(key)

    async def pods_gone(
        self, key: ClusterKey, timeout: float, poll: float = POD_GONE_POLL_SECONDS
    ) -> list[PodInfo]:
        """Wait up to ``timeout`` seconds for the cluster's pods to leave the store; the
        pods still there. Polls the store (a dict lookup), never the API server."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.pods_of(key) and loop.time() < deadline:
            await asyncio.sleep(poll)
        return self.pods_of(key)

    def nodes_of(self, shape: Shape) -> list[NodeInfo]:
        return self.nodes.group(shape)

    def raycluster(self, key: ClusterKey) -> dict[str, Any] | None:
        return self.rayclusters.get(key)

    async def start(
        self,
        kube: Kube,
        namespaces: Iterable[str],
        on_pods: Callable[[list[Change[PodInfo]]], None],
        on_nodes: Callable[[list[Change[NodeInfo]]], None],
        on_rayclusters: Callable[[list[Change[dict[str, Any]]]], None],
    ) -> None:
        """Follow every kind (per namespace when the operator is namespace-scoped); return
        when each has been listed once."""
        notify: dict[str, Callable[[list[Any]], None]] = {
            "pods": on_pods,
            "nodes": on_nodes,
            c.RAY_PLURAL_CLUSTER: on_rayclusters,
        }
        stores: dict[str, RecordStore[Any]] = {
            "pods": self.pods,
            "nodes": self.nodes,
            c.RAY_PLURAL_CLUSTER: self.rayclusters,
        }
        for kind in followed_kinds(namespaces):
            deliver = _deliver_into(stores[kind.plural], notify[kind.plural], kind.namespace)
            self._stops.append(await kube.follow(kind, deliver))

    def stop(self) -> None:
        for stop in self._stops:
            stop.set()


def _deliver_into(
    store: RecordStore[Any], notify: Callable[[list[Any]], None], namespace: str
) -> Deliver:
    def deliver(event: str | None, records: dict[ObjectKey, Any]) -> None:
        changes = apply(store, event, records, namespace)
        if changes:
            notify(changes)

    return deliver
