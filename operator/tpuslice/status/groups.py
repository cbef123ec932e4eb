"""The status of a TPUSliceCluster of several worker groups: one entry per group in
``status.groups``, and the object's conditions over all of them. Pure.

Each TPU group is a slice set of its own (its shape, its pods), observed like the one
group of the one-group form; the object is Ready when every TPU group has its desired
slices Ready (an elastic group at least its minimum) and the RayCluster is ready
(KubeRay's ready state counts the CPU groups' pods too). An elastic group's range and
target are in its entry (``elastic``, the shape of status.elastic). ``status.slices``
and the top-level shape describe one group, so a grouped object shows its slices under
its groups only: the same slice index belongs to every group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tpuslice.status.conditions import (
    MAX_MESSAGE,
    Observed,
    compute_status,
    merge_conditions,
    ready_enough,
    scaling_condition,
    timeout_condition,
    truncate,
)

__all__ = [
    "ONE_GROUP_FIELDS",
    "CpuGroupObserved",
    "TpuGroupObserved",
    "elastic_conditions",
    "group_entries",
    "grouped_status",
    "groups_ready",
]

#: Top-level fields of the one-group status that name one shape or one group's slices.
ONE_GROUP_FIELDS = ("acceleratorType", "hostsPerSlice", "chipsPerHost", "slices")


@dataclass(frozen=True)
class TpuGroupObserved:
    """What the pass saw of one TPU group: its name, topology and slice set."""

    name: str
    topology: str
    observed: Observed


@dataclass(frozen=True)
class CpuGroupObserved:
    name: str
    replicas: int


def grouped_status(
    tpu_groups: Sequence[TpuGroupObserved],
    cpu_groups: Sequence[CpuGroupObserved],
    previous: Mapping[str, Any] | None,
    now: str,
) -> dict[str, Any]:
    """The whole status of a grouped object (``tpu_groups`` not empty, in spec order;
    CPU groups listed after them). Identical input gives identical output."""
    first = tpu_groups[0].observed
    combined = replace(
        first,
        desired_slices=sum(g.observed.desired_slices for g in tpu_groups),
        slices=[s for g in tpu_groups for s in g.observed.slices],
        # each elastic group's range is its own: the object has none of its own
        elastic=None,
        groups_ready=groups_ready(tpu_groups),
    )
    status = compute_status(combined, previous, now)
    for key in ONE_GROUP_FIELDS:
        status.pop(key, None)
    status["groups"] = group_entries(tpu_groups, cpu_groups, now)
    if first.stall is None and not first.suspended:
        earlier = (previous or {}).get("conditions") or []
        status["conditions"] += merge_conditions(earlier, elastic_conditions(tpu_groups), now)
    return status


def elastic_conditions(tpu_groups: Sequence[TpuGroupObserved]) -> list[dict[str, Any]]:
    """ScalingUp and ScaleUpTimedOut of a grouped object over its elastic groups: each
    True while any group's is, its message that group's, named; none without an elastic
    group."""
    out: list[dict[str, Any]] = []
    for rule in (scaling_condition, timeout_condition):
        found = [(g.name, c) for g in tpu_groups if (c := rule(g.observed)) is not None]
        if not found:
            continue
        name, chosen = next(((n, c) for n, c in found if c["status"] == "True"), found[0])
        message = truncate(f"group {name}: {chosen['message']}", MAX_MESSAGE)
        out.append({**chosen, "message": message})
    return out


def groups_ready(tpu_groups: Sequence[TpuGroupObserved]) -> bool | None:
    """With an elastic group, whether every TPU group has enough slices Ready (each by
    its own rule, ``ready_enough``: a fixed group all, an elastic one its minimum); None
    without one, where the slices counted together say it (every group's all)."""
    if all(g.observed.elastic is None for g in tpu_groups):
        return None
    return all(ready_enough(g.observed) for g in tpu_groups)


def group_entries(
    tpu_groups: Sequence[TpuGroupObserved], cpu_groups: Sequence[CpuGroupObserved], now: str
) -> list[dict[str, Any]]:
    """``status.groups``: each TPU group's shape and slices, then each CPU group's
    replicas (every kind's grouped status lists its groups the same way)."""
    groups: list[dict[str, Any]] = []
    for group in tpu_groups:
        one = compute_status(group.observed, None, now)
        groups.append(
            {
                "name": group.name,
                "acceleratorType": group.observed.accelerator_type,
                "topology": group.topology,
                "hostsPerSlice": group.observed.hosts_per_slice,
                "chipsPerHost": group.observed.chips_per_host,
                "desiredSlices": one["desiredSlices"],
                "readySlices": one["readySlices"],
                "sliceReadiness": one["sliceReadiness"],
                "slices": one["slices"],
            }
        )
        if "elastic" in one:
            groups[-1]["elastic"] = one["elastic"]
    groups += [{"name": g.name, "desiredReplicas": g.replicas} for g in cpu_groups]
    return groups
