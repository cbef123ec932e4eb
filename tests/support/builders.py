"""Builders of the objects tests feed the operator: TPUSlice objects, nodes of TPU node
pools, worker pods and reservations.

Each builder gives a typical object (a v6e 4x4 slice of four hosts, owned by the cluster
``ml/llm``) and takes keyword overrides for what a test is about, so a test spells out
only what matters to it and every test builds the same object the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuslice.model import constants as c
from tpuslice.model.records import Holder, NodeInfo, PodInfo, ReservationInfo

__all__ = [
    "ACCELERATOR",
    "HOSTS",
    "TOPOLOGY",
    "holder",
    "node",
    "nodes_of",
    "partition_nodes",
    "pod",
    "reservation",
    "slice_pods",
    "tpu",
    "tpuslice",
]

ACCELERATOR = "tpu-v6e-slice"
TOPOLOGY = "4x4"
HOSTS = 4  # hosts of a v6e 4x4 slice
RAY_VERSION = "2.54.0"


# ------------------------------------------------------------ TPUSlice objects
def tpu(type_: str = "v6e", topology: str = TOPOLOGY, **fields: Any) -> dict[str, Any]:
    """``spec.tpu``; ``fields`` adds ``slices``, ``chipsPerHost`` and the like."""
    return {"type": type_, "topology": topology, **fields}


def tpuslice(
    kind: str = c.KIND_CLUSTER,
    name: str = "llm",
    *,
    namespace: str | None = "ml",
    uid: str | None = None,
    generation: int | None = None,
    tpu: Mapping[str, Any] | None = None,
    ray: str = RAY_VERSION,
    **spec: Any,
) -> dict[str, Any]:
    """A TPUSliceCluster, TPUSliceJob or TPUSliceService body. ``tpu`` is the whole
    ``spec.tpu`` (a v6e 4x4 by default); ``spec`` adds the other spec fields (``job``,
    ``serve``, ``reservation``, ``head``, ...) after ``tpu`` and ``ray``. Metadata
    fields left None are left out, as a body written by a user has no uid."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if uid is not None:
        metadata["uid"] = uid
    if generation is not None:
        metadata["generation"] = generation
    return {
        "apiVersion": c.API_VERSION,
        "kind": kind,
        "metadata": metadata,
        "spec": {
            "tpu": dict(tpu) if tpu is not None else _default_tpu(),
            "ray": {"version": ray},
            **spec,
        },
    }


def _default_tpu() -> dict[str, Any]:
    return {"type": "v6e", "topology": TOPOLOGY}


# ------------------------------------------------------------ nodes
def node(
    name: str,
    pool: str,
    *,
    accelerator: str = ACCELERATOR,
    topology: str = TOPOLOGY,
    chips: int = 4,
    ready: bool = True,
    schedulable: bool = True,
    **fields: Any,
) -> NodeInfo:
    """One TPU node of ``pool``; ``fields`` sets the other NodeInfo fields
    (``capacity_labels``, ``block``, ...)."""
    return NodeInfo(name, pool, accelerator, topology, chips, ready, schedulable, **fields)


def nodes_of(
    *pools: str,
    hosts: int = HOSTS,
    ready: bool = True,
    not_ready: int = 0,
    cordoned: int = 0,
    **fields: Any,
) -> list[NodeInfo]:
    """The ``hosts`` nodes ``<pool>-0`` ... of each pool, in order. The first ``not_ready``
    nodes of a pool are not ready and the first ``cordoned`` are unschedulable;
    ``fields`` goes to every ``node``."""
    return [
        node(
            f"{pool}-{i}",
            pool,
            ready=ready and i >= not_ready,
            schedulable=i >= cordoned,
            **fields,
        )
        for pool in pools
        for i in range(hosts)
    ]


def partition_nodes(
    pid: str,
    *,
    block: str | None = "b1",
    state: str = "HEALTHY",
    hosts: int = 16,
    gke_slice: str = "",
    topology: str = "",
    **fields: Any,
) -> list[NodeInfo]:
    """The nodes of the tpu7x sub-block pool ``sb-<pid>`` carrying dynamic-slicing
    partition ``pid`` in ``state``; ``gke_slice`` (with the Slice's ``topology``) once a
    GKE Slice formed on it."""
    labels = {
        c.NODE_LABEL_ACCELERATOR_TOPOLOGY_MODE: c.TOPOLOGY_MODE_PROVISION_ONLY,
        c.NODE_LABEL_TPU_PARTITION_ID: pid,
        c.NODE_LABEL_TPU_PARTITION_STATE: state,
    }
    if gke_slice:
        labels[c.NODE_LABEL_TPU_SLICE] = gke_slice
    return [
        node(
            f"sb-{pid}-{i}",
            f"sb-{pid}",
            accelerator="tpu7x",
            topology=topology,
            block=block,
            topology_mode=c.TOPOLOGY_MODE_PROVISION_ONLY,
            partition_labels=(c.NODE_LABEL_TPU_PARTITION_ID,),
            gke_slice=gke_slice,
            labels=labels,
            **fields,
        )
        for i in range(hosts)
    ]


# ------------------------------------------------------------ pods
def pod(
    name: str,
    *,
    namespace: str = "ml",
    cluster: str = "llm",
    replica: str | None = "tpu-aaaaa",
    index: int | None = 0,
    host: int | None = 0,
    gated: bool = True,
    pool: str | None = None,
    node_name: str | None = None,
    ready: bool = False,
    deleting: bool = False,
    **fields: Any,
) -> PodInfo:
    """One worker pod of ``replica`` (slice ``index``, host ``host``), gated and not yet
    placed by default; ``pool`` is the node pool it is pinned to. ``fields`` sets
    ``owner_kind``, ``ray_cluster``, ``created``."""
    return PodInfo(
        namespace,
        name,
        cluster,
        replica,
        index,
        host,
        gated,
        pool,
        node_name,
        ready,
        deleting,
        **fields,
    )


def slice_pods(
    replica: str = "tpu-aaaaa",
    index: int = 0,
    *,
    name: str = "{cluster}-{replica}-{host}",
    hosts: int = HOSTS,
    labelled: bool = True,
    cluster: str = "llm",
    **fields: Any,
) -> list[PodInfo]:
    """The ``hosts`` worker pods of one slice replica. ``name`` is a format of
    ``cluster``, ``replica`` and ``host``; ``labelled=False`` gives pods KubeRay has not
    labelled yet (no replica, index or host); ``fields`` goes to every ``pod``."""
    return [
        pod(
            name.format(cluster=cluster, replica=replica, host=h),
            cluster=cluster,
            replica=replica if labelled else None,
            index=index if labelled else None,
            host=h if labelled else None,
            **fields,
        )
        for h in range(hosts)
    ]


# ------------------------------------------------------------ reservations
def holder(
    replica: str = "tpu-aaaaa",
    index: int = 0,
    *,
    namespace: str = "ml",
    name: str = "llm",
    uid: str = "uid-llm",
    **fields: Any,
) -> Holder:
    """The slice replica a reservation holds its pool for; ``fields`` sets ``kind`` and
    ``ray_cluster``."""
    return Holder(namespace, name, uid, replica, index, **fields)


def reservation(
    pool: str,
    owner: Holder | None = None,
    *,
    phase: str | None = "Reserved",
    uid: str = "",
    resource_version: str = "",
) -> ReservationInfo:
    """The reservation of ``pool`` for ``owner`` (slice 0 of ``ml/llm`` by default);
    ``uid`` and ``resource_version`` are the SliceReservation object's."""
    return ReservationInfo(
        pool,
        owner if owner is not None else holder(),
        phase,
        uid=uid,
        resource_version=resource_version,
    )
