"""Elastic slice sets (spec.elastic): how a moving slice count is planned and queued.

The Ray autoscaler moves an elastic set's count between its minimum and maximum; every
slice still takes a whole capacity unit. The minimum is what the object cannot run
without, so it is planned like a fixed set: a gang when the spec says so, ranked in its
shape's queue by priority and age. The slices above it are extras the autoscaler asked
for: each is reserved on its own as its pods appear, and in the queue they rank after
every other object's minimum of the same priority, so an elastic set at its maximum
never starves a newcomer's minimum. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from tpuslice.model import constants as c
from tpuslice.model.convert import timestamp
from tpuslice.model.records import GangMode, PodInfo, SliceState, SliceStatus

__all__ = [
    "PlanTerms",
    "TimedOut",
    "limit_seconds",
    "named_for_deletion",
    "next_timeout_in",
    "plan_terms",
    "timed_out",
    "waiting_extras",
    "workers_to_delete",
]

#: Bound of the names read from a RayCluster's workersToDelete: at most every host of
#: the largest slice set the operator renders (spec.bounds), a list the API server
#: already bounds by the object's size.
MAX_WORKERS_TO_DELETE = 65536


@dataclass(frozen=True)
class PlanTerms:
    """What the planner and the queue plan for now: the gang rule, the slices it applies
    to and whether only extras above an elastic minimum are missing."""

    gang: GangMode
    desired: int
    extra: bool = False


def plan_terms(gang: GangMode, desired: int, held: int, minimum: int | None) -> PlanTerms:
    """The terms for an object holding ``held`` live slices that wants ``desired``.

    ``minimum`` None (a fixed set): the spec's gang over every slice. Otherwise, while
    the minimum is not held, the minimum alone (as a gang if ``gang`` says so; the
    extras wait for the next pass); once it is, every wanted slice one by one, ranked as
    extras. A target at or below the minimum is the minimum's terms."""
    if minimum is None:
        return PlanTerms(gang, desired)
    if held < minimum or desired <= minimum:
        return PlanTerms(gang, min(desired, minimum))
    return PlanTerms(GangMode.PER_SLICE, desired, extra=True)


def workers_to_delete(
    raycluster: Mapping[str, Any] | None, group_name: str = c.WORKER_GROUP
) -> frozenset[str]:
    """The pod names the Ray autoscaler named in the TPU group ``group_name``'s
    ``scaleStrategy.workersToDelete`` (KubeRay deletes each one's whole replica with
    multi-host indexing); empty without a RayCluster or a list."""
    if raycluster is None:
        return frozenset()
    for group in (raycluster.get("spec") or {}).get("workerGroupSpecs") or []:
        if isinstance(group, Mapping) and group.get("groupName") == group_name:
            named = (group.get("scaleStrategy") or {}).get("workersToDelete") or []
            if not isinstance(named, list):
                return frozenset()
            return frozenset(n for n in named[:MAX_WORKERS_TO_DELETE] if isinstance(n, str))
    return frozenset()


def named_for_deletion(
    named: frozenset[str], pods: Iterable[PodInfo]
) -> tuple[tuple[int, str], ...]:
    """The slices (index, replica) the autoscaler is removing: a pod of each is named in
    ``workersToDelete``. Once all its pods are gone a slice leaves this list (the names
    may stay in the RayCluster until the autoscaler's next patch clears them)."""
    found = {
        (p.replica_index, p.replica_name)
        for p in pods
        if p.name in named and p.replica_name and p.replica_index is not None
    }
    return tuple(sorted((i, r) for i, r in found if i is not None and r is not None))


#: The states of a slice above the minimum that waits for a unit: the pods exist, gated.
WAITING_STATES = frozenset(
    {SliceState.REQUESTED, SliceState.WAITING_FOR_CAPACITY, SliceState.PROVISIONING}
)


@dataclass(frozen=True)
class TimedOut:
    """A slice above the minimum whose pods waited longer than the autoscaler's
    allocate timeout: the autoscaler gives it up and deletes its pods."""

    index: int
    replica: str
    since: datetime  # its oldest live pod's creationTimestamp


def waiting_extras(
    slices: Sequence[SliceStatus], pods: Iterable[PodInfo], minimum: int
) -> tuple[TimedOut, ...]:
    """Every slice above ``minimum`` that waits for a unit, with its oldest live pod's
    creation time (slices without a dated live pod left out). Ray's autoscaler v2 counts
    an instance from its pod's creation and terminates one that runs no Ray within
    ``RAY_AUTOSCALER_RECONCILE_ALLOCATE_STATUS_TIMEOUT_S`` (ray-project/ray 2.60
    python/ray/autoscaler/v2/instance_manager/reconciler.py ``_handle_stuck_instances``,
    the default in config.py); a gated pod never runs Ray."""
    oldest: dict[str, datetime] = {}
    for pod in pods:
        made = timestamp(pod.created)
        if pod.replica_name and not pod.deleting and made is not None:
            oldest[pod.replica_name] = min(made, oldest.get(pod.replica_name, made))
    return tuple(
        TimedOut(s.index, s.replica, oldest[s.replica])
        for s in slices
        if s.index >= minimum and s.state in WAITING_STATES and s.replica in oldest
    )


def limit_seconds(timeout_seconds: int | None) -> int:
    """spec.elastic.scaleUpTimeoutSeconds, else the autoscaler's default."""
    if timeout_seconds is None:
        return c.AUTOSCALER_ALLOCATE_TIMEOUT_DEFAULT_SECONDS
    return timeout_seconds


def timed_out(
    slices: Sequence[SliceStatus],
    pods: Iterable[PodInfo],
    minimum: int,
    timeout_seconds: int | None,
    now: datetime,
) -> tuple[TimedOut, ...]:
    """The waiting extras whose oldest pod was made more than the timeout before
    ``now``: derived from the pods alone, so every pass (and every operator) finds the
    same, and a slice the autoscaler asks for again (new pods) starts afresh."""
    limit = timedelta(seconds=limit_seconds(timeout_seconds))
    return tuple(t for t in waiting_extras(slices, pods, minimum) if now - t.since > limit)


def next_timeout_in(
    slices: Sequence[SliceStatus],
    pods: Iterable[PodInfo],
    minimum: int,
    timeout_seconds: int | None,
    now: datetime,
) -> float | None:
    """Seconds until the next waiting extra passes the timeout (None: none will), so a
    pass is made then to show it before the autoscaler deletes its pods."""
    limit = timedelta(seconds=limit_seconds(timeout_seconds))
    due = [
        (t.since + limit - now).total_seconds()
        for t in waiting_extras(slices, pods, minimum)
        if now - t.since <= limit
    ]
    return min(due) if due else None
