"""The real node as a one-node, single-host GKE TPU pool, so a TPU worker pod runs Ray for real.

The real kubelet node (tpusim.realnode) joins with no accelerator. To make it a
TPU host as the operator and the scheduler see one on GKE, it gets, through the
API (never through the kubelet's flags, so the same node can be a TPU host for
one test module and a plain node for the next):

- GKE's TPU node labels, exactly those the fake pools carry for a single-host
  pool of the same shape (``tpusim.nodepools.pool_nodes``: node pool,
  accelerator, topology, accelerator count, machine type, zone). Sources: GKE
  "About TPUs in GKE" and "Plan TPUs in GKE"
  (https://cloud.google.com/kubernetes-engine/docs/concepts/tpus,
  https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus).
- GKE's TPU taint ``google.com/tpu=present:NoSchedule`` (same pages: GKE taints
  TPU nodes so that only pods that ask for TPUs land there). The real node's own
  taint ``tpusim.dev/real`` stays: a TPU pod must still opt in to the real node.
- ``google.com/tpu: <chips>`` as an extended resource, the way Kubernetes
  documents for a resource no device plugin advertises: a JSON PATCH of the
  node's status capacity with the path ``/status/capacity/google.com~1tpu``
  ("Advertise Extended Resources for a Node",
  https://kubernetes.io/docs/tasks/administer-cluster/extended-resource-node/).
  The kubelet copies capacity into allocatable at its next status update, so the
  scheduler sees it there; nothing backs it (no ``/dev/accel*``), which is what a
  test of the operator and of Ray's view of a TPU host needs.

The labels and patches are pure functions; ``join_tpu_pool`` and ``leave_tpu_pool``
apply and take them back on a live node. Never imports the operator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .kube import core_v1, wait_for
from .nodepools import TPU_RESOURCE, TPU_TAINT, TPUPool, pool_nodes, topology_chips

__all__ = [
    "KUBELET_OWNED_LABELS",
    "capacity_patch",
    "join_tpu_pool",
    "leave_tpu_pool",
    "real_tpu_pool",
    "tpu_node_labels",
]

#: Labels the kubelet sets on registration; the real node keeps its own values.
KUBELET_OWNED_LABELS = frozenset(
    {
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
    }
)

#: The JSON Pointer escape of "/" in a key ("~1"), as the Kubernetes page spells it.
_TPU_CAPACITY_PATH = "/status/capacity/" + TPU_RESOURCE.replace("~", "~0").replace("/", "~1")


def real_tpu_pool(
    name: str = "real-v6e-2x2", tpu_type: str = "v6e", topology: str = "2x2", chips: int = 4
) -> TPUPool:
    """A one-node single-host pool of ``topology`` on ``chips``-chip hosts; ValueError when
    the topology needs more than one host (a multi-host slice cannot be one node)."""
    if topology_chips(topology) != chips:
        raise ValueError(
            f"pool {name}: topology {topology} has {topology_chips(topology)} chips, but the real "
            f"node is one host of {chips}: pick a single-host topology (for v6e with 4 chips: 2x2)"
        )
    return TPUPool(name=name, tpu_type=tpu_type, topology=topology, nodes=1, chips_per_node=chips)


def tpu_node_labels(pool: TPUPool) -> dict[str, str]:
    """The labels GKE gives a node of ``pool`` (a one-node single-host pool), without those
    the kubelet owns."""
    if pool.nodes != 1:
        raise ValueError(f"pool {pool.name}: nodes must be 1 for the real node, not {pool.nodes}")
    (node,) = pool_nodes(pool)
    labels: dict[str, str] = node["metadata"]["labels"]
    return {k: v for k, v in labels.items() if k not in KUBELET_OWNED_LABELS}


def capacity_patch(chips: int | None) -> list[dict[str, Any]]:
    """The JSON patch of node status that advertises ``google.com/tpu: chips`` (``add``
    replaces an existing value), or takes it away (``chips`` None)."""
    if chips is None:
        return [{"op": "remove", "path": _TPU_CAPACITY_PATH}]
    if chips < 1:
        raise ValueError(f"chips must be at least 1, not {chips}")
    return [{"op": "add", "path": _TPU_CAPACITY_PATH, "value": str(chips)}]


def _taints(node: Any) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in {"key": t.key, "value": t.value, "effect": t.effect}.items() if v}
        for t in node.spec.taints or []
    ]


def join_tpu_pool(api: Any, node_name: str, pool: TPUPool, timeout_s: float = 120.0) -> None:
    """Make ``node_name`` the one node of ``pool``: labels, the TPU taint, and
    ``google.com/tpu`` in capacity; returns once the kubelet has it in allocatable."""
    core = core_v1(api)
    labels = tpu_node_labels(pool)
    node = core.read_node(node_name)
    taints = _taints(node)
    if not any(t["key"] == TPU_TAINT["key"] for t in taints):
        taints.append(dict(TPU_TAINT))
    core.patch_node(node_name, {"metadata": {"labels": labels}, "spec": {"taints": taints}})
    core.patch_node_status(node_name, capacity_patch(pool.chips_per_node))

    def advertised() -> bool:
        allocatable: Mapping[str, str] = core.read_node(node_name).status.allocatable or {}
        return allocatable.get(TPU_RESOURCE) == str(pool.chips_per_node)

    wait_for(advertised, timeout_s=timeout_s, what=f"{TPU_RESOURCE} allocatable on {node_name}")


def leave_tpu_pool(api: Any, node_name: str, pool: TPUPool, timeout_s: float = 60.0) -> None:
    """Take back everything ``join_tpu_pool`` gave ``node_name`` (labels, taint, resource)."""
    core = core_v1(api)
    node = core.read_node(node_name)
    taints = [t for t in _taints(node) if t["key"] != TPU_TAINT["key"]]
    labels: dict[str, str | None] = dict.fromkeys(tpu_node_labels(pool))
    core.patch_node(node_name, {"metadata": {"labels": labels}, "spec": {"taints": taints}})
    if TPU_RESOURCE in (node.status.capacity or {}):
        core.patch_node_status(node_name, capacity_patch(None))

    def withdrawn() -> bool:
        allocatable: Mapping[str, str] = core.read_node(node_name).status.allocatable or {}
        return TPU_RESOURCE not in allocatable

    wait_for(withdrawn, timeout_s=timeout_s, what=f"{TPU_RESOURCE} gone from {node_name}")
