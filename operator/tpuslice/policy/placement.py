"""Where an object's slices may go and whether it may queue now, as the pass applies the
policy rules: pools left out of its pool index, its namespace's limits, its place in
its shape's queue.

Two rules narrow the pools a slice may claim, both as a set of pools left out of the
shape's pool index (as capacity on demand's constraints are):

- the governing TPUSlicePolicies' ``spec.pools.nodeSelector`` (``rules.pools_allowed``),
  judged on every node of the pool;
- a NoSchedule or NoExecute taint on a node of the pool that the worker pods do not
  tolerate, with or without a policy: a slice released onto such a pool would never
  schedule. The worker pods tolerate what ``spec.worker.template`` lists plus what the
  operator adds itself (``render/kuberay.py``: the TPU taint, and GKE's queued taint
  under queued provisioning).

The node lifecycle taints (``node.kubernetes.io/*``: not-ready, unreachable,
unschedulable, the pressure taints; Kubernetes "Taints and Tolerations", Taint based
evictions, https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/)
are not judged here: they mirror node conditions the planner already reads (Ready,
``spec.unschedulable``) and come and go with them. Nor are GKE's maintenance and
termination taints (``c.DISRUPTION_TAINT_KEYS``): the planner judges them itself
(planning/disruption.py), so a slice holding the unit is drained whole and the unit's
not-eligible message names the node and the signal.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tpuslice.model import constants as c
from tpuslice.model.records import NodeInfo, ReservationInfo, Shape, Taint, Usage
from tpuslice.model.topology import DYNAMIC_GENERATION, PARTITION_TOPOLOGY
from tpuslice.policy.records import Policy
from tpuslice.policy.rules import effective_priority, namespace_usage_allowed, pools_allowed
from tpuslice.policy.selection import governing
from tpuslice.spec.parts import SliceClusterSpec

__all__ = [
    "LIFECYCLE_TAINT_PREFIX",
    "excluded_pools",
    "limits_apply",
    "namespace_wait",
    "queued_priority",
    "slice_chips",
    "tolerates",
    "usage_by_namespace",
    "worker_tolerations",
]

#: The node lifecycle controller's taints (conditions the planner reads itself).
LIFECYCLE_TAINT_PREFIX = "node.kubernetes.io/"

#: What the operator adds to every worker pod (render/kuberay.py ``_worker_template``).
_TPU_TOLERATION: Mapping[str, str] = {
    "key": c.TPU_TAINT_KEY,
    "operator": "Exists",
    "effect": "NoSchedule",
}
_QUEUED_TOLERATION: Mapping[str, str] = {
    "key": c.QUEUED_TAINT_KEY,
    "operator": "Exists",
    "effect": "NoSchedule",
}


def tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    """core/v1 Toleration.ToleratesTaint (kubernetes/api core/v1/toleration.go): an
    effect, when set, must equal the taint's; a key, when set, must equal it (an empty
    key with ``Exists`` tolerates every taint); ``Exists`` ignores the value, ``Equal``
    (the default) needs the same value."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    if key and key != taint.key:
        return False
    if (toleration.get("operator") or "Equal") == "Exists":
        return True
    return bool(key) and (toleration.get("value") or "") == taint.value


def worker_tolerations(spec: SliceClusterSpec) -> list[Mapping[str, Any]]:
    """The tolerations the worker pods get: the template's and the operator's own."""
    template_spec = spec.worker.template.get("spec")
    listed = template_spec.get("tolerations") if isinstance(template_spec, Mapping) else None
    out: list[Mapping[str, Any]] = [t for t in listed or [] if isinstance(t, Mapping)]
    out.append(_TPU_TOLERATION)
    if spec.provisioning is not None and spec.provisioning.queued:
        out.append(_QUEUED_TOLERATION)
    return out


def _node_usable(
    node: NodeInfo, governed: Sequence[Policy], tolerations: Sequence[Mapping[str, Any]]
) -> bool:
    if governed and not pools_allowed(governed, node.labels):
        return False
    return all(
        taint.key.startswith(LIFECYCLE_TAINT_PREFIX)
        or taint.key in c.DISRUPTION_TAINT_KEYS
        or any(tolerates(t, taint) for t in tolerations)
        for taint in node.taints
    )


def excluded_pools(
    pools: Mapping[str, Iterable[NodeInfo]],
    governed: Sequence[Policy],
    tolerations: Sequence[Mapping[str, Any]],
) -> frozenset[str]:
    """The pools (name -> nodes) this object's slices must not claim: a node lacks a
    governing policy's pool labels, or carries a taint the workers do not tolerate."""
    return frozenset(
        name
        for name, nodes in pools.items()
        if not all(_node_usable(n, governed, tolerations) for n in nodes)
    )


def namespace_wait(
    policies: Sequence[Policy],
    namespace_labels: Mapping[str, str],
    in_use: Usage,
    missing: int,
    chips_per_slice: int,
) -> str:
    """Why an object that still misses ``missing`` slices waits on its namespace's
    limits (``spec.limits.slicesPerNamespace``, ``chipsPerNamespace``), naming the policy
    and the limit; empty when it may claim. Pools it holds count in ``in_use``."""
    if missing <= 0 or not policies:
        return ""
    refusals = namespace_usage_allowed(
        governing(policies, namespace_labels),
        in_use,
        Usage(missing, missing * chips_per_slice),
    )
    return f"waiting for its namespace's usage to drop: {refusals[0]}" if refusals else ""


def queued_priority(
    policies: Sequence[Policy],
    namespace_labels: Mapping[str, str],
    in_use: Usage,
    spec: SliceClusterSpec,
    missing: int,
) -> int | None:
    """The priority another object of the shape queues at (its own clamped into its
    governing policies' range), or None when it must not hold a place in the queue: its
    namespace is denied (policies exist and none selects it), or at its limits (it waits
    and blocks nobody)."""
    if not policies:
        return spec.priority
    governed = governing(policies, namespace_labels)
    if not governed or any(p.invalid for p in governed):
        return None
    if namespace_wait(policies, namespace_labels, in_use, missing, spec.shape.chips):
        return None
    return effective_priority(governed, spec.priority).value


def slice_chips(shape: Shape) -> int:
    """The TPU chips of one slice of ``shape`` (gkeAccelerator, topology): the product of
    the topology's dimensions ("4x4" is 16, "2x2x4" is 16), which is a reservation's
    hosts times chips per host; 0 for a topology that is not one."""
    parts = shape[1].split("x")
    if not all(p.isdigit() for p in parts):
        return 0
    return math.prod(int(p) for p in parts)


def usage_by_namespace(
    by_shape: Mapping[Shape, Iterable[ReservationInfo]],
) -> dict[str, Usage]:
    """Slices and chips each namespace's objects hold now, from the SliceReservations
    whose holder is in the namespace: one slice per holding slice (a TPU7x dynamic
    slice holds a reservation per 4x4x4 partition, yet is one slice), and each
    reservation's chips its shape's (a partition's shape is 4x4x4, 64 chips: a 4x4x8
    dynamic slice counts 128)."""
    held: dict[str, set[tuple[str, ...]]] = {}
    chips: dict[str, int] = {}
    for shape, reservations in list(by_shape.items()):
        per_unit = slice_chips(shape)
        partitions = shape == (DYNAMIC_GENERATION, PARTITION_TOPOLOGY)
        for r in list(reservations):
            h = r.holder
            ns = h.namespace
            # a pool or node is one slice's; partitions count once per holding slice
            one = (h.uid, h.group, h.ray_cluster, h.replica_name) if partitions else (r.pool,)
            held.setdefault(ns, set()).add(one)
            chips[ns] = chips.get(ns, 0) + per_unit
    return {ns: Usage(len(held[ns]), chips[ns]) for ns in held}


def limits_apply(policies: Sequence[Policy], namespace_labels: Mapping[str, str]) -> bool:
    """Whether a policy governing the namespace limits its slices or chips (only then
    is its usage worth counting)."""
    return any(
        p.limits.slices_per_namespace is not None or p.limits.chips_per_namespace is not None
        for p in governing(policies, namespace_labels)
    )
