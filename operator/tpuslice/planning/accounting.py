"""Disruptions counted apart from failures: per slice and per object, read back from the
object's own status each pass (nothing kept only in memory), plus each slice's
scheduled maintenance and the informational MaintenanceScheduled condition.

A disruption is a slice drained whole because GKE terminated, maintained or lost a
node of the unit it held (planning/disruption.py). Ray Train counts preemptions apart
from failures (``FailureConfig(max_preemption_failures=...)``); these counts let a user
tell the two apart from the object's status as well. Pure: the caller passes ``now``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from tpuslice.model.convert import rfc3339
from tpuslice.model.records import Drain, NodeInfo
from tpuslice.planning.busy import is_move_message
from tpuslice.planning.disruption import (
    ACTIVE_MAINTENANCE_LABEL,
    MAINTENANCE_ONGOING,
    MAINTENANCE_STARTED_TAINT,
    DisruptionReason,
    maintenance_message,
    scheduled_maintenance,
)

__all__ = [
    "CLUSTER_SECTIONS",
    "MAINTENANCE_CONDITION",
    "MAX_COUNT",
    "UnitNodes",
    "maintenance_condition",
    "walk_nodes",
    "with_disruptions",
    "with_maintenance",
]

#: The informational condition; Ready is not affected by it.
MAINTENANCE_CONDITION = "MaintenanceScheduled"
#: Counts stop here (an int32 in the CRD; a slice drained this often is a bug to report).
MAX_COUNT = 1_000_000
_REASONS = tuple(str(r) for r in DisruptionReason)


def _count(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return value
    return 0


#: The status sections of a TPUSliceService that carry a cluster's ``name`` and ``slices``.
CLUSTER_SECTIONS = ("activeCluster", "pendingCluster")


def with_disruptions(
    status: Mapping[str, Any],
    previous: Mapping[str, Any],
    drains: Sequence[Drain],
    now: datetime,
    by_cluster: Mapping[str, Sequence[Drain]] | None = None,
    by_group: Mapping[tuple[str, str], Sequence[Drain]] | None = None,
) -> dict[str, Any]:
    """``status`` with ``disruptions`` (object totals by reason, the last one, and the
    failures) and each ``slices[]`` entry's ``disruptions``/``lastDisruption``/``failures``
    carried from ``previous`` by slice index and advanced by this pass.

    A TPUSliceService's slices are per RayCluster (``activeCluster.slices``,
    ``pendingCluster.slices``): each section's entries are carried from the previous
    section of the same cluster ``name`` (an upgrade's pending cluster becomes the active
    one) and advanced by that cluster's drains (``by_cluster``: RayCluster name -> drains).
    An object of several groups has its slices per group (``groups[].slices``, at the top
    or in a service's cluster section), carried by group name and advanced by that
    group's drains (``by_group``: (RayCluster name, group) -> drains; slice indexes are
    per group, so one list of drains cannot serve two groups).

    A disruption is one of this pass's ``drains``. A failure is a slice index whose
    replica was replaced (KubeRay made a new replica at that index) without a drain of
    the old one: a crashed or evicted pod, a failed job attempt; everything else. A
    single-host slice the operator moved off a busy node (planning/busy.py) is neither."""
    out = dict(status)
    old = previous.get("disruptions")
    old = old if isinstance(old, Mapping) else {}
    old_by = old.get("byReason")
    old_by = old_by if isinstance(old_by, Mapping) else {}
    by_reason = {r: _count(old_by.get(r)) for r in _REASONS if _count(old_by.get(r))}
    totals: dict[str, Any] = {k: v for k, v in old.items() if k in ("lastReason", "lastTime")}
    failures = _count(old.get("failures"))
    for drain in drains:
        by_reason[drain.reason] = min(MAX_COUNT, by_reason.get(drain.reason, 0) + 1)
        totals["lastReason"], totals["lastTime"] = drain.reason, rfc3339(now)
    grouped = by_group or {}
    if isinstance(out.get("slices"), list):
        out["slices"], failed = _advance(out["slices"], previous.get("slices"), drains, now)
        failures = min(MAX_COUNT, failures + failed)
    if isinstance(out.get("groups"), list):
        out["groups"], failed = _advance_groups(
            out["groups"],
            previous.get("groups"),
            lambda group: [d for (_, g), ds in grouped.items() if g == group for d in ds],
            now,
        )
        failures = min(MAX_COUNT, failures + failed)
    for section in CLUSTER_SECTIONS:
        current = out.get(section)
        if not isinstance(current, Mapping):
            continue
        name = str(current.get("name") or "")
        before: Mapping[str, Any] = next(
            (
                previous[k]
                for k in CLUSTER_SECTIONS
                if isinstance(previous.get(k), Mapping) and previous[k].get("name") == name
            ),
            {},
        )
        section_out = dict(current)
        if isinstance(current.get("slices"), list):
            ours = (by_cluster or {}).get(name, ())
            section_out["slices"], failed = _advance(
                current["slices"], before.get("slices"), ours, now
            )
            failures = min(MAX_COUNT, failures + failed)
        if isinstance(current.get("groups"), list):
            section_out["groups"], failed = _advance_groups(
                current["groups"],
                before.get("groups"),
                _in_cluster(grouped, name),
                now,
            )
            failures = min(MAX_COUNT, failures + failed)
        out[section] = section_out
    if by_reason or failures or "disruptions" in previous:
        out["disruptions"] = {
            "total": min(MAX_COUNT, sum(by_reason.values())),
            "byReason": by_reason,
            "failures": failures,
            **totals,
        }
    return out


def _advance(
    entries: Sequence[Any], previous: Any, drains: Sequence[Drain], now: datetime
) -> tuple[list[Any], int]:
    """One list of slice entries with their counts carried from ``previous`` (the same
    list in the previous status) and advanced by ``drains``; and the failures found."""
    carried: dict[int, Mapping[str, Any]] = {}
    for entry in previous if isinstance(previous, list) else []:
        if isinstance(entry, Mapping) and isinstance(entry.get("index"), int):
            carried[entry["index"]] = entry
    drained = {d.index: d for d in drains}
    slices: list[Any] = []
    failures = 0
    for entry in entries:
        if not isinstance(entry, Mapping):
            slices.append(entry)
            continue
        entry = dict(entry)
        before = carried.get(entry.get("index", -1), {})
        count = _count(before.get("disruptions"))
        failed = _count(before.get("failures"))
        last = before.get("lastDisruption")
        old_replica, new_replica = before.get("replica"), entry.get("replica")
        drained_old = isinstance(last, Mapping) and last.get("replica") == old_replica
        moved_old = is_move_message(before.get("message"), str(before.get("node") or ""))
        replaced = bool(old_replica and new_replica and old_replica != new_replica)
        if replaced and not drained_old and not moved_old:
            failed = min(MAX_COUNT, failed + 1)
            failures += 1
        this = drained.get(entry.get("index", -1))
        if this is not None:
            count = min(MAX_COUNT, count + 1)
            last = {"reason": this.reason, "time": rfc3339(now)}
            if this.node:  # a revoked capacity names no node
                last["node"] = this.node
            last["replica"] = this.replica_name
        if count:
            entry["disruptions"] = count
        if failed:
            entry["failures"] = failed
        if isinstance(last, Mapping):
            entry["lastDisruption"] = dict(last)
        slices.append(entry)
    return slices, failures


def _in_cluster(
    grouped: Mapping[tuple[str, str], Sequence[Drain]], cluster: str
) -> Callable[[str], Sequence[Drain]]:
    """The drains of one RayCluster's group, by group name."""
    return lambda group: grouped.get((cluster, group), ())


def _advance_groups(
    groups: Sequence[Any],
    previous: Any,
    drains_of: Callable[[str], Sequence[Drain]],
    now: datetime,
) -> tuple[list[Any], int]:
    """``groups[]`` entries with each one's ``slices`` advanced as ``_advance`` does, from
    the previous entry of the same group name and that group's drains."""
    before = {
        str(g.get("name")): g
        for g in (previous if isinstance(previous, list) else [])
        if isinstance(g, Mapping)
    }
    out: list[Any] = []
    failures = 0
    for entry in groups:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("slices"), list):
            out.append(entry)
            continue
        name = str(entry.get("name"))
        slices, failed = _advance(
            entry["slices"], before.get(name, {}).get("slices"), drains_of(name), now
        )
        out.append({**entry, "slices": slices})
        failures += failed
    return out, failures


#: The nodes of the unit a status entry holds (its ``node``, else its ``nodePool``).
UnitNodes = Callable[[Mapping[str, Any]], Sequence[NodeInfo]]


def walk_nodes(nodes: Sequence[NodeInfo]) -> UnitNodes:
    """``UnitNodes`` by a walk over ``nodes`` for each entry: for a few nodes (the
    operator's pass reads its shapes' unit indexes instead, ``PoolIndex.pools``)."""

    def unit_nodes(entry: Mapping[str, Any]) -> Sequence[NodeInfo]:
        node, pool = entry.get("node"), entry.get("nodePool")
        if node:
            return [n for n in nodes if n.name == node]
        return [n for n in nodes if pool and n.pool == pool]

    return unit_nodes


def with_maintenance(status: Mapping[str, Any], unit_nodes: UnitNodes) -> dict[str, Any]:
    """Each held slice's ``maintenance`` (``scheduledAt`` and ``state``: Scheduled, or
    Ongoing once the window opened) from the nodes of the unit it holds; a
    TPUSliceService's in each cluster section, an object of several groups' in each
    ``groups[]`` entry."""
    out = _maintained_lists(status, unit_nodes)
    for section in CLUSTER_SECTIONS:
        current = out.get(section)
        if isinstance(current, Mapping):
            out[section] = _maintained_lists(current, unit_nodes)
    return out


def _maintained_lists(part: Mapping[str, Any], unit_nodes: UnitNodes) -> dict[str, Any]:
    """``part`` with its ``slices`` and each ``groups[]`` entry's ``slices`` maintained."""
    out = dict(part)
    if isinstance(out.get("slices"), list):
        out["slices"] = _maintained(out["slices"], unit_nodes)
    if isinstance(out.get("groups"), list):
        out["groups"] = [
            {**g, "slices": _maintained(g["slices"], unit_nodes)}
            if isinstance(g, Mapping) and isinstance(g.get("slices"), list)
            else g
            for g in out["groups"]
        ]
    return out


def _maintained(entries: Sequence[Any], unit_nodes: UnitNodes) -> list[Any]:
    slices: list[Any] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            slices.append(entry)
            continue
        entry = dict(entry)
        unit = unit_nodes(entry) if entry.get("nodePool") else []
        ongoing = any(
            n.labels.get(ACTIVE_MAINTENANCE_LABEL) == MAINTENANCE_ONGOING
            or any(t.key == MAINTENANCE_STARTED_TAINT for t in n.taints)
            for n in unit
        )
        at = scheduled_maintenance(unit)
        if ongoing:
            entry["maintenance"] = {"state": "Ongoing"}
        elif at is not None:
            stamp = maintenance_message(at).removeprefix("maintenance at ")
            entry["maintenance"] = {"state": "Scheduled", "scheduledAt": stamp}
        slices.append(entry)
    return slices


def maintenance_condition(
    status: Mapping[str, Any], previous: Mapping[str, Any], now: datetime, generation: int
) -> dict[str, Any] | None:
    """The MaintenanceScheduled condition (True while any slice's unit has maintenance
    scheduled or ongoing; its lastTransitionTime kept while the status stays), or None
    when it never was True and is not now (the condition appears once it matters)."""
    lists: list[tuple[str, Any]] = [("", status.get("slices"))]
    for section in CLUSTER_SECTIONS:
        current = status.get(section)
        if isinstance(current, Mapping):
            lists.append((f"{current.get('name') or section} ", current.get("slices")))
    held = [
        (f"{prefix}slice {e.get('index')}", e["maintenance"])
        for prefix, entries in lists
        for e in (entries if isinstance(entries, list) else [])
        if isinstance(e, Mapping) and isinstance(e.get("maintenance"), Mapping)
    ]
    before = next(
        (
            c
            for c in previous.get("conditions") or []
            if isinstance(c, Mapping) and c.get("type") == MAINTENANCE_CONDITION
        ),
        None,
    )
    if not held and before is None:
        return None
    value = "True" if held else "False"
    if held:
        parts = [
            f"{i}: maintenance {m.get('state', '').lower()}"
            + (f" at {m['scheduledAt']}" if m.get("scheduledAt") else "")
            for i, m in held
        ]
        message = (
            "; ".join(parts) + " (Ready is not affected; the slice is drained whole when it starts)"
        )
        reason = "Ongoing" if any(m.get("state") == "Ongoing" for _, m in held) else "Scheduled"
    else:
        message, reason = "no maintenance scheduled on the units the slices hold", "None"
    since = rfc3339(now)
    if before is not None and before.get("status") == value and before.get("lastTransitionTime"):
        since = str(before["lastTransitionTime"])
    return {
        "type": MAINTENANCE_CONDITION,
        "status": value,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }
