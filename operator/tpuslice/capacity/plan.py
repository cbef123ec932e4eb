"""What capacity on demand does in a pass, decided after the planner planned (pure).

Given each slice's facts (``records.SliceFacts``, read off the pass's plan by the
shell), the object's newest request per slice and its history, ``plan`` decides
every slice (``requests.decide``) and every request of a slice that is gone, and
returns one ``CapacityPlan``: the decisions whose writes the shell's executor
carries out in order, the releases of the planner's plan that must wait (a slice
given back, replaced, or holding a pool that is most likely its request's capacity
before the request says Provisioned), the consume annotations each standing release
carries, and the report over the planner's slice states (state, message,
``status.slices[].provisioning``, the ProvisioningFailed stall, the earliest
``retry_at``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TypeVar

from tpuslice.capacity.decide import decide
from tpuslice.capacity.objects import consume_annotations
from tpuslice.capacity.requests import lapsed
from tpuslice.model import constants as c
from tpuslice.model import events
from tpuslice.model.convert import timestamp
from tpuslice.model.records import (
    NodeInfo,
    PodRelease,
    ProvisioningAction,
    ProvisioningDecision,
    ProvisioningRequestInfo,
    SliceFacts,
    SlicePlan,
    SliceProvisioning,
    SliceState,
)
from tpuslice.spec.parts import SliceClusterSpec
from tpuslice.status.conditions import Stall

__all__ = [
    "FRESH_HOLD_SECONDS",
    "NO_CAPACITY_PLAN",
    "CapacityPlan",
    "fresh_hold",
    "fresh_pools",
    "plan",
    "with_retired",
]

#: How long a best-effort slice holding a pool newer than its waiting request waits for
#: the request's Provisioned before the pool counts as an existing one.
FRESH_HOLD_SECONDS = 30.0

PoolNodes = Mapping[str, Sequence[NodeInfo]]
Release = TypeVar("Release", bound=PodRelease)


@dataclass(frozen=True)
class CapacityPlan:
    """One pass's capacity-on-demand decisions for one object."""

    #: slice index -> its decision (live slices)
    decisions: Mapping[int, ProvisioningDecision] = field(default_factory=dict)
    #: decisions about requests of slices that are gone
    gone: tuple[ProvisioningDecision, ...] = ()
    #: replica names whose release waits this pass
    held_back: frozenset[str] = frozenset()
    #: replica name -> the consume annotations its release patch carries
    annotations: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: the capacity stall (ProvisioningFailed, or the shell's ProvisioningRequestNotInstalled)
    stall: Stall | None = None

    @property
    def writes(self) -> tuple[ProvisioningDecision, ...]:
        """Every decision, in the order its writes are carried out."""
        return (*self.decisions.values(), *self.gone)

    @property
    def retry_at(self) -> datetime | None:
        """When the object should be passed again (the earliest decision's)."""
        times = [d.retry_at for d in self.writes if d.retry_at is not None]
        return min(times) if times else None

    def releases(self, releases: Iterable[Release]) -> list[Release]:
        """The planner's releases that stand (none of a slice held back)."""
        return [r for r in releases if r.replica_name not in self.held_back]

    def report(self, plan: SlicePlan, stall: Stall | None) -> tuple[SlicePlan, Stall | None]:
        """The plan's slices with each decision's state, message and provisioning status;
        the stall (a plan's own stall comes first)."""
        if not self.decisions and self.stall is None:
            return plan, stall
        slices = []
        for status in plan.slices:
            d = self.decisions.get(status.index)
            if d is None:
                slices.append(status)
                continue
            updated = replace(status, provisioning=d.provisioning_status())
            if d.state is not None and status.state in (
                SliceState.WAITING_FOR_CAPACITY,
                SliceState.PENDING,
                SliceState.PROVISIONING,
            ):
                updated = replace(updated, state=d.state, message=d.message or status.message)
            slices.append(updated)
        return replace(plan, slices=tuple(slices)), stall or self.stall


NO_CAPACITY_PLAN = CapacityPlan()


def plan(
    facts: Mapping[int, SliceFacts],
    newest: Mapping[tuple[str, int], ProvisioningRequestInfo],
    spec: SliceClusterSpec,
    *,
    now: datetime,
    history: Mapping[int, SliceProvisioning],
    replicas: Mapping[int, str | None],
    pool_nodes: PoolNodes,
) -> CapacityPlan:
    """Decide every slice of ``facts`` and every request in ``newest`` whose slice is
    gone; ``replicas`` maps slice index -> replica name (the planner's plan),
    ``pool_nodes`` pool -> its nodes."""
    decisions: dict[int, ProvisioningDecision] = {}
    held_back: set[str] = set()
    for fact in facts.values():
        request = newest.get((fact.raycluster, fact.index))
        decision = decide(fact, request, spec, now=now, history=history.get(fact.index))
        held = fresh_hold(fact, request, spec, now, pool_nodes)
        if held is not None:
            replica = replicas.get(fact.index)
            if replica:
                held_back.add(replica)
            if decision.action == ProvisioningAction.DELETE:
                decision = held
        decisions[fact.index] = decision
    keys = {(f.raycluster, f.index) for f in facts.values()}
    gone = tuple(
        decide(SliceFacts(key[1], key[0], exists=False), request, spec, now=now)
        for key, request in newest.items()
        if key not in keys
    )
    for d in (*decisions.values(), *gone):
        replica = replicas.get(d.index)
        if replica and (d.give_back or d.replace_slice):
            held_back.add(replica)
    annotations: dict[str, Mapping[str, str]] = {}
    for index, decision in decisions.items():
        request = newest.get((facts[index].raycluster, index))
        replica = replicas.get(index)
        if (
            decision.action == ProvisioningAction.KEEP
            and request is not None
            and replica
            and not decision.delete
        ):
            annotations[replica] = consume_annotations(request.name, request.class_name)
    stalled = next((d.stalled for d in (*decisions.values(), *gone) if d.stalled), None)
    return CapacityPlan(
        decisions=decisions,
        gone=gone,
        held_back=frozenset(held_back),
        annotations=annotations,
        stall=Stall(events.PROVISIONING_FAILED, stalled) if stalled else None,
    )


def fresh_hold(
    fact: SliceFacts,
    request: ProvisioningRequestInfo | None,
    spec: SliceClusterSpec,
    now: datetime,
    pool_nodes: PoolNodes,
) -> ProvisioningDecision | None:
    """A best-effort slice holding (not yet released) a pool whose nodes are younger
    than its waiting request and younger than FRESH_HOLD_SECONDS: the pool is most
    likely the request's capacity, seen before the request's Provisioned (two
    watches). The release waits for that, so the pods carry the consume annotations;
    after FRESH_HOLD_SECONDS the pool counts as any existing one."""
    prov = spec.provisioning
    if prov is None or prov.queued or request is None or fact.pool is None:
        return None
    if fact.released or request.is_true(c.PROVREQ_PROVISIONED) or lapsed(request):
        return None
    if fact.pool not in fresh_pools([fact.pool], pool_nodes, [request]):
        return None
    stamps = [timestamp(n.created) for n in pool_nodes.get(fact.pool, ())]
    newest = max(t for t in stamps if t is not None)
    left = FRESH_HOLD_SECONDS - (now - newest).total_seconds()
    if left <= 0:
        return None
    return ProvisioningDecision(
        ProvisioningAction.WAIT,
        index=fact.index,
        request=request.name,
        attempt=request.attempt,
        failures=request.failures,
        retry_at=now + timedelta(seconds=left),
        message=f"holds {fact.held}, new since ProvisioningRequest "
        f"{request.name}: waiting for the request to say Provisioned before the release",
    )


def fresh_pools(
    free: Iterable[str], pool_nodes: PoolNodes, outstanding: Sequence[ProvisioningRequestInfo]
) -> set[str]:
    """Free pools whose every node was created after the oldest outstanding request.

    Creation timestamps have whole seconds: a node stamped in the same second as the
    request may be older than it (a pool added just before the slice asked; seen in CI
    as a gang of two asking twice, its one existing pool taken for a request's). Such a
    node counts as existing: a request's own capacity takes longer than that to come."""
    since = [r.created for r in outstanding if r.created is not None]
    if not since:
        return set()
    oldest = min(since)
    out = set()
    for pool in free:
        stamps = [timestamp(n.created) for n in pool_nodes.get(pool, ())]
        if stamps and all(t is not None and t > oldest for t in stamps):
            out.add(pool)
    return out


def with_retired(
    history: dict[int, SliceProvisioning], extra: Iterable[ProvisioningRequestInfo]
) -> dict[int, SliceProvisioning]:
    """A retired request still there counts in its slice's history: the next attempt is
    numbered after it even if status lost the count (the names never collide)."""
    for request in extra:
        index = request.slice_index
        if not request.retired or index is None:
            continue
        known = history.get(index)
        if known is None or known.attempt < request.attempt:
            failures = max(request.failures, known.failures if known else 0)
            history[index] = SliceProvisioning(request.name, request.attempt, failures)
    return history
