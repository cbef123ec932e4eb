"""Capacity on demand: the per-slice request state machine (``decide``), pure.

Everything it reads lives in the API server: the request (its attempt and failure
count are its labels and annotations, its conditions say where it stands) and
``status.slices[].provisioning``. ``decide`` is a chain of named steps, each of one
situation of the slice: provisioning not wanted (``_not_wanted``), its request being
deleted (``_deleting``), the slice gone (``_gone``), released (``_released``), holding
a pool (``_holding``), or holding none (``_without_pool``: refused, lapsed and retried,
made from another spec, provisioned and to be claimed, or waiting for the autoscaler).

Recognising a configuration error (``config_error``): a ``Failed`` request whose
reason is one GKE's autoscaler gives when the request cannot succeed as configured
(no queued pool, more than one pod set, a pod that fits no pool, a bad machine or
reservation, missing permissions; ``CONFIG_ERROR_REASONS``) or whose message says
so (``CONFIG_ERROR_MESSAGES``). Those make the cluster Stalled at once with the
autoscaler's message and are tried again every ``maxBackoffSeconds`` without
spending the retry limit (a pool made meanwhile is found by itself); every other
failure is retried with backoff up to the limit, then Stalled.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from tpuslice.capacity.objects import request_hash, request_name
from tpuslice.model import constants as c
from tpuslice.model import events
from tpuslice.model.convert import rfc3339
from tpuslice.model.records import (
    CapacityUnit,
    ProvisioningAction,
    ProvisioningDecision,
    ProvisioningRequestInfo,
    RequestCondition,
    SliceFacts,
    SliceProvisioning,
    SliceState,
)
from tpuslice.spec.parts import ProvisioningSpec, RetryPolicy, SliceClusterSpec

__all__ = [
    "ACCEPT_HINT_SECONDS",
    "BOOKING_CONSUMED",
    "CLAIM_WITHIN_SECONDS",
    "CONFIG_ERROR_MESSAGES",
    "CONFIG_ERROR_REASONS",
    "backoff_seconds",
    "config_error",
    "decide",
    "retry_time",
]

#: A provisioned request's capacity is booked for 10 minutes (PROVREQ_BOOKING_SECONDS).
#: A slice must hold its pool and be released well inside that: past this many seconds
#: after Provisioned=True without a claim, the request is given back and asked again
#: (3 minutes left for the release patch, scheduling and the image pull to begin).
CLAIM_WITHIN_SECONDS = 420
#: BookingExpired's reason when the request's pods were bound (OSS autoscaler).
BOOKING_CONSUMED = "CapacityBookingConsumed"
#: A request no autoscaler has accepted after this long gets a hint in the message.
ACCEPT_HINT_SECONDS = 120

#: Failed reasons that mean "cannot succeed as configured" (GKE's cluster autoscaler:
#: pkg/provisioningrequests/scaleup/reasons/reasons.go, reconciler/reasons/reasons.go,
#: reconciler/feature_guard_reconciler.go).
CONFIG_ERROR_REASONS = frozenset(
    {
        "NoQueuedNodepoolAvailable",
        "MultiplePodSetsUnsupported",
        "ObtainabilityStrategyUnsupported",
        "ProvisioningRequestNotSchedulableInNodepool",
        "ProvisioningRequestSingleZoneInfeasible",
        "OutOfResources",
        "InvalidArgument",
        "InvalidMachineType",
        "InvalidGPUType",
        "ZoneNotSupported",
        "PermissionDenied",
        "PermissionsError",
        "UnsupportedOperation",
        "InvalidReservation",
        "ReservationNotFound",
        "ReservationIncompatible",
    }
)
#: Message fragments (lower case) that mean the same whatever the reason says.
CONFIG_ERROR_MESSAGES = (
    "no nodepool with queuedprovisioning enabled",
    "supports only single podset",
    "doesn't support multiple podsets",
)

# ----------------------------------------------------------------------- backoff


def backoff_seconds(failures: int, retry: RetryPolicy) -> int:
    """Wait before the attempt after the ``failures``-th failure: the base, doubled per
    failure after the first, never more than the max (0 before any failure)."""
    if failures <= 0:
        return 0
    doublings = min(failures - 1, 40)  # 2**40 s is far beyond any max
    return int(min(retry.max_backoff_seconds, retry.base_backoff_seconds * 2**doublings))


def retry_time(failed_at: datetime, failures: int, retry: RetryPolicy) -> datetime:
    """When the next attempt may be made after the ``failures``-th failure at ``failed_at``."""
    return failed_at + timedelta(seconds=backoff_seconds(failures, retry))


def config_error(condition: RequestCondition | None) -> bool:
    """Whether a Failed condition says the request cannot succeed as configured."""
    if condition is None or not condition.true:
        return False
    if condition.reason in CONFIG_ERROR_REASONS:
        return True
    text = condition.message.lower()
    return any(fragment in text for fragment in CONFIG_ERROR_MESSAGES)


# ---------------------------------------------------------------- the state machine


def _when(
    cond: RequestCondition | None, request: ProvisioningRequestInfo, now: datetime
) -> datetime:
    if cond is not None and cond.last_transition is not None:
        return cond.last_transition
    return request.created or now


def _said(cond: RequestCondition | None) -> str:
    """``Reason: message`` of a condition, as the autoscaler wrote it."""
    if cond is None:
        return ""
    if cond.reason and cond.message:
        return f"{cond.reason}: {cond.message}"
    return cond.reason or cond.message


def decide(
    slice_: SliceFacts,
    request: ProvisioningRequestInfo | None,
    spec: SliceClusterSpec,
    *,
    now: datetime,
    history: SliceProvisioning | None = None,
    claim_within: float = CLAIM_WITHIN_SECONDS,
) -> ProvisioningDecision:
    """What to do about one slice's ProvisioningRequest now. Pure: the same input gives
    the same decision, so a pass interrupted anywhere is simply decided again.

    ``request`` is the slice's newest request of ours (None: none exists); ``history``
    the slice's ``status.slices[].provisioning`` (``history_from_status``), used when
    no request exists. ``now`` is timezone-aware UTC, like the request's timestamps.

    The cases, in order:

    - provisioning not wanted (absent, mode None, policy None, suspended): delete the
      request of a slice that holds no pool (a running slice keeps its own);
    - the request is being deleted: wait for it;
    - the slice is gone (scale-down, pods gone): delete its request;
    - the slice holds a pool that is not the request's capacity (the request was never
      provisioned, or names another pool): delete the request;
    - the slice is released (its pods run on the pool): keep the request while it runs;
      ``CapacityRevoked``, or ``BookingExpired``/``Failed`` before every pod was bound,
      means the capacity is gone: replace the slice (delete its pods; KubeRay makes a
      new replica, which asks again) and delete the request;
    - the slice holds the request's pool, not yet released: the request stays until
      the release; if its booking
      lapses first (``BookingExpired``/``CapacityRevoked``/``Failed``) the pool is given
      back (an existing pool again if its nodes are still there, else the slice asks
      again: a failure, unless only its gang held it back);
    - the slice holds no pool:
      - an elastic extra behind a lower one that asks (``asks_after``): no request (one
        not provisioned is withdrawn), Requested until its turn;
      - no request: create attempt N+1 once all its pods exist and no free pool is
        there for it, unless the retry limit is spent (Stalled);
      - a free existing pool is there for it and the request is not provisioned: delete
        the request (existing pools first, always);
      - ``Failed`` with a configuration error: Stalled with the autoscaler's message,
        tried again every maxBackoffSeconds without spending the limit;
      - ``Failed`` otherwise, ``BookingExpired``, ``CapacityRevoked``: retried after the
        backoff (the lapsed request stays until then: it keeps the time), up to the
        limit, then Stalled;
      - a request made from another spec (class, parameters) not yet provisioned:
        replaced by the next attempt;
      - ``Provisioned``: claim within ``claim_within`` seconds (queued: the pool its
        status names; others: any fresh whole pool), else give it back and ask again
        (a failure: capacity that never becomes a claimable pool ends Stalled);
      - otherwise wait, the slice Provisioning with the request's own message.
    """
    prov = spec.provisioning
    if not (prov is not None and prov.enabled and spec.gated and not spec.suspend):
        return _not_wanted(_Context.of(slice_, request, spec, history))
    one = _Context.of(slice_, request, spec, history)
    said = _Conditions.of(request)
    for step in (_deleting, _gone):
        decided = step(one)
        if decided is not None:
            return decided
    if slice_.released:
        return _released(one, said)
    if slice_.pool is not None:
        return _holding(one, said)
    return _without_pool(one, said, now, claim_within)


@dataclass(frozen=True)
class _Context:
    """One slice's decision in the making: what every step's answer names."""

    slice_: SliceFacts
    request: ProvisioningRequestInfo | None
    spec: SliceClusterSpec
    attempt: int
    failures: int
    raycluster: str

    @classmethod
    def of(
        cls,
        slice_: SliceFacts,
        request: ProvisioningRequestInfo | None,
        spec: SliceClusterSpec,
        history: SliceProvisioning | None,
    ) -> _Context:
        if request is not None:
            attempt, failures = request.attempt, request.failures
        elif history is not None:
            attempt, failures = history.attempt, history.failures
        else:
            attempt, failures = 0, 0
        raycluster = slice_.raycluster or (request.raycluster if request else "") or spec.name
        return cls(slice_, request, spec, attempt, failures, raycluster)

    @property
    def index(self) -> int:
        return self.slice_.index

    @property
    def prov(self) -> ProvisioningSpec:
        assert self.spec.provisioning is not None
        return self.spec.provisioning

    def out(self, action: ProvisioningAction, **kw: Any) -> ProvisioningDecision:
        fields: dict[str, Any] = {
            "index": self.index,
            "request": self.request.name if self.request is not None else None,
            "attempt": self.attempt,
            "failures": self.failures,
        }
        fields.update(kw)
        return ProvisioningDecision(action, **fields)

    def delete(self, reason: str, message: str, **kw: Any) -> ProvisioningDecision:
        assert self.request is not None
        return self.out(
            ProvisioningAction.DELETE,
            delete=self.request.name,
            reason=reason,
            message=message,
            **kw,
        )

    def stall_spent(self, count: int, why: str) -> ProvisioningDecision:
        limit = self.prov.retry.limit
        return self.out(
            ProvisioningAction.STALL,
            failures=count,
            reason=events.PROVISIONING_FAILED,
            stalled=f"slice {self.index}: {why}{count} failed attempts, spec.reservation."
            f"provisioning.retry.limit {limit} spent; raise the limit to try again",
            state=SliceState.PROVISIONING,
            message=f"{why}retry limit {limit} spent",
        )

    def create(self, count: int, why: str, reason: str) -> ProvisioningDecision:
        """Ask again (attempt N+1), unless the retry limit is spent or pods are missing."""
        request, attempt = self.request, self.attempt
        if count > self.prov.retry.limit:
            return self.stall_spent(count, why)
        if not self.slice_.pods_complete and request is not None:
            # the next attempt waits for all pods; the count is kept in status meanwhile
            return self.delete(
                reason,
                f"{why}asking again once all pods of the slice exist",
                failures=count,
                state=SliceState.PROVISIONING,
            )
        new = request_name(self.raycluster, self.index, attempt + 1)
        return self.out(
            ProvisioningAction.RETRY if request is not None else ProvisioningAction.CREATE,
            delete=request.name if request is not None else None,
            create_attempt=attempt + 1,
            failures=count,
            request=new,
            attempt=attempt + 1,
            reason=reason,
            state=SliceState.PROVISIONING,
            message=f"{why}asking the cluster autoscaler for a {self.slice_.unit.noun}: "
            f"ProvisioningRequest {new} ({self.prov.class_name}), attempt {attempt + 1}",
        )


@dataclass(frozen=True)
class _Conditions:
    """The request's conditions the decision reads (None: no such condition)."""

    failed: RequestCondition | None = None
    expired: RequestCondition | None = None
    revoked: RequestCondition | None = None
    provisioned: RequestCondition | None = None

    @classmethod
    def of(cls, request: ProvisioningRequestInfo | None) -> _Conditions:
        if request is None:
            return cls()
        return cls(
            request.condition(c.PROVREQ_FAILED),
            request.condition(c.PROVREQ_BOOKING_EXPIRED),
            request.condition(c.PROVREQ_CAPACITY_REVOKED),
            request.condition(c.PROVREQ_PROVISIONED),
        )

    @property
    def is_failed(self) -> bool:
        return self.failed is not None and self.failed.true

    @property
    def is_expired(self) -> bool:
        return self.expired is not None and self.expired.true

    @property
    def is_revoked(self) -> bool:
        return self.revoked is not None and self.revoked.true

    @property
    def is_provisioned(self) -> bool:
        return self.provisioned is not None and self.provisioned.true

    @property
    def consumed(self) -> bool:
        """The OSS autoscaler ends a booking as soon as the request's pods are bound
        (processors/provreq/processor.go: BookingExpired reason CapacityBookingConsumed):
        the capacity is in use, never lost; our pod store may show the binding later."""
        return (
            self.is_expired and self.expired is not None and self.expired.reason == BOOKING_CONSUMED
        )

    def ours(self, one: _Context) -> bool:
        """Whether the pool the slice holds is the request's capacity: it was provisioned,
        and (queued) it is the pool the request names. Otherwise the slice took an
        existing pool and the request is merely left over."""
        request = one.request
        return self.is_provisioned and (
            not one.prov.queued
            or request is None
            or request.node_pool in (None, one.slice_.unit_pool or one.slice_.pool)
        )


def _not_wanted(one: _Context) -> ProvisioningDecision:
    """Provisioning not wanted: delete the request of a slice that holds no pool."""
    request = one.request
    if request is None:
        return one.out(ProvisioningAction.NONE)
    if one.slice_.pool is not None or one.slice_.released:
        return one.out(ProvisioningAction.KEEP)
    if request.deleting:
        return one.out(ProvisioningAction.WAIT)
    return one.delete(
        events.PROVISIONING_REQUEST_DELETED,
        f"deleting ProvisioningRequest {request.name}: spec.reservation."
        f"provisioning asks for no capacity",
    )


def _deleting(one: _Context) -> ProvisioningDecision | None:
    """The request is being deleted: wait for it."""
    request, slice_ = one.request, one.slice_
    if request is None or not request.deleting:
        return None
    waiting = slice_.exists and slice_.pool is None and not slice_.released
    return one.out(
        ProvisioningAction.WAIT,
        state=SliceState.PROVISIONING if waiting else None,
        message=f"ProvisioningRequest {request.name} is being deleted" if waiting else "",
    )


def _gone(one: _Context) -> ProvisioningDecision | None:
    """The slice is gone (scale-down, pods gone): delete its request."""
    if one.slice_.exists:
        return None
    if one.request is None:
        return one.out(ProvisioningAction.NONE)
    return one.delete(
        events.PROVISIONING_REQUEST_DELETED,
        f"slice {one.index} is gone; deleting ProvisioningRequest {one.request.name}",
    )


def _released(one: _Context, said: _Conditions) -> ProvisioningDecision:
    """The slice runs (or starts) on a pool: keep the request while it runs on its
    capacity, replace the slice when that capacity is gone."""
    request, slice_, index = one.request, one.slice_, one.index
    if request is None:
        return one.out(ProvisioningAction.NONE)
    if not said.ours(one):
        return one.delete(
            events.PROVISIONING_REQUEST_DELETED,
            f"slice {index} runs on {slice_.held}, not on the capacity of "
            f"ProvisioningRequest {request.name}; deleting it",
        )
    lost: RequestCondition | None = None
    reason = ""
    if said.is_revoked:
        lost, reason = said.revoked, events.CAPACITY_REVOKED
    elif not slice_.bound and said.is_expired and not said.consumed:
        lost, reason = said.expired, events.BOOKING_EXPIRED
    elif not slice_.bound and said.is_failed:
        lost, reason = said.failed, events.PROVISIONING_RETRY
    if lost is None:
        return one.out(ProvisioningAction.KEEP)
    return one.out(
        ProvisioningAction.REPLACE,
        replace_slice=True,
        delete=request.name,
        reason=reason,
        # revoked after a run is the end of a lease, not a failure of the request
        failures=one.failures if said.is_revoked else one.failures + 1,
        message=f"ProvisioningRequest {request.name}: {_said(lost)}; the capacity under "
        f"slice {index} is gone, replacing the slice (it asks again)",
    )


def _holding(one: _Context, said: _Conditions) -> ProvisioningDecision:
    """The slice holds a pool, not released yet: the request stays until the release;
    a booking that lapses first gives the pool back."""
    request, slice_, index = one.request, one.slice_, one.index
    if request is None:
        return one.out(ProvisioningAction.NONE)
    if not said.ours(one):
        return one.delete(
            events.PROVISIONING_REQUEST_DELETED,
            f"slice {index} holds {slice_.held}; deleting ProvisioningRequest {request.name}",
        )
    lapsed = next(
        (x for x in (said.revoked, said.expired, said.failed) if x is not None and x.true), None
    )
    if lapsed is None:
        return one.out(ProvisioningAction.KEEP)
    # the gang held it back, not the request: no failure, and nothing to wait for
    gang = slice_.gang_waiting
    return one.out(
        ProvisioningAction.GIVE_BACK,
        give_back=True,
        delete=request.name if gang else None,
        reason=events.BOOKING_EXPIRED,
        message=f"ProvisioningRequest {request.name}: {_said(lapsed)} before the "
        f"slice was released{' (its gang was short)' if gang else ''}; giving "
        f"{slice_.held} back",
    )


def _without_pool(
    one: _Context, said: _Conditions, now: datetime, claim_within: float
) -> ProvisioningDecision:
    """The slice holds no pool: ask, wait, retry, stall or claim."""
    request, slice_, index = one.request, one.slice_, one.index
    live = said.is_provisioned and not (said.is_failed or said.is_expired or said.is_revoked)
    if slice_.asks_after is not None and not live:
        return _awaits_turn(one)
    if request is None:
        if not slice_.pods_complete or slice_.eligible_pool:
            return one.out(ProvisioningAction.NONE)
        return one.create(one.failures, "", events.PROVISIONING_REQUESTED)
    if slice_.eligible_pool and not live:
        return one.delete(
            events.PROVISIONING_REQUEST_DELETED,
            f"a free {slice_.unit.noun} is there for slice {index}; deleting "
            f"ProvisioningRequest {request.name}",
        )
    for step in (_refused, _lapsed_retry):
        decided = step(one, request, said, now)
        if decided is not None:
            return decided
    if not said.is_provisioned and (
        request.class_name != one.prov.class_name
        or (request.spec_hash and request.spec_hash != request_hash(one.spec))
    ):
        return one.create(
            one.failures, f"{request.name} was made from another spec; ", events.PROVISIONING_RETRY
        )
    if said.is_provisioned:
        return _provisioned(one, request, said, now, claim_within)
    return _waiting(one, request, said, now)


def _awaits_turn(one: _Context) -> ProvisioningDecision:
    """An elastic extra behind a lower one that asks: no request of its own (one not yet
    provisioned is withdrawn), asked for once the lower one holds a pool or is gone."""
    request = one.request
    message = (
        f"above spec.elastic.minSlices capacity is asked for one slice at a time; slice "
        f"{one.slice_.asks_after} asks first"
    )
    if request is None:
        return one.out(
            ProvisioningAction.NONE, state=SliceState.WAITING_FOR_CAPACITY, message=message
        )
    return one.delete(
        events.PROVISIONING_REQUEST_DELETED,
        f"{message}; deleting ProvisioningRequest {request.name}",
        state=SliceState.WAITING_FOR_CAPACITY,
    )


def _refused(
    one: _Context, request: ProvisioningRequestInfo, said: _Conditions, now: datetime
) -> ProvisioningDecision | None:
    """``Failed`` with a configuration error: Stalled with the autoscaler's message,
    tried again every maxBackoffSeconds without spending the limit."""
    failed = said.failed
    if failed is None or not failed.true or not config_error(failed):
        return None
    text = _said(failed)
    retry = one.prov.retry
    again = _when(failed, request, now) + timedelta(seconds=retry.max_backoff_seconds)
    if now >= again and one.slice_.pods_complete:
        return one.create(
            one.failures, f"{request.name} was refused ({text}); ", events.PROVISIONING_RETRY
        )
    return one.out(
        ProvisioningAction.STALL,
        reason=events.PROVISIONING_FAILED,
        stalled=f"slice {one.index}: the cluster autoscaler refused ProvisioningRequest "
        f"{request.name}: {text}; fix the node pools or spec.reservation.provisioning "
        f"(tried again at {rfc3339(again)})",
        retry_at=again if again > now else None,
        state=SliceState.PROVISIONING,
        message=f"refused: {text}",
    )


def _lapsed_retry(
    one: _Context, request: ProvisioningRequestInfo, said: _Conditions, now: datetime
) -> ProvisioningDecision | None:
    """``Failed`` otherwise, ``BookingExpired``, ``CapacityRevoked``: retried after the
    backoff (the lapsed request stays until then: it keeps the time), up to the limit."""
    lapsed = (
        said.failed
        if said.is_failed
        else said.revoked
        if said.is_revoked
        else said.expired
        if said.is_expired
        else None
    )
    if lapsed is None:
        return None
    retry = one.prov.retry
    count = one.failures + 1
    verb = "failed" if lapsed is said.failed else "lapsed"
    why = f"{request.name} {verb} ({_said(lapsed)}); "
    if count > retry.limit:
        return one.stall_spent(count, why)
    at = retry_time(_when(lapsed, request, now), count, retry)
    if now >= at and one.slice_.pods_complete:
        return one.create(count, why, events.PROVISIONING_RETRY)
    left = retry.limit - count
    return one.out(
        ProvisioningAction.WAIT,
        reason=events.PROVISIONING_RETRY
        if lapsed is said.failed
        else events.CAPACITY_REVOKED
        if lapsed is said.revoked
        else events.BOOKING_EXPIRED,
        retry_at=at if at > now else None,
        state=SliceState.PROVISIONING,
        message=f"{why}attempt {one.attempt + 1} at {rfc3339(at)} ({left} more "
        f"retr{'y' if left == 1 else 'ies'} after it)",
    )


def _provisioned(
    one: _Context,
    request: ProvisioningRequestInfo,
    said: _Conditions,
    now: datetime,
    claim_within: float,
) -> ProvisioningDecision:
    """``Provisioned``: claim within ``claim_within`` seconds (queued: the pool its
    status names; others: any fresh whole pool), else give it back and ask again."""
    since = _when(said.provisioned, request, now)
    deadline = since + timedelta(seconds=claim_within)
    if now >= deadline and one.slice_.eligible_pool:
        # a free pool is there (maybe this one) but was not taken in time: drop the
        # request and let the planner treat the pool as any other
        return one.delete(
            events.BOOKING_GIVEN_BACK,
            f"{request.name} was provisioned at {rfc3339(since)} and not claimed "
            f"within {int(claim_within)} s; giving it back (a free {one.slice_.unit.noun} is "
            "there)",
        )
    if now >= deadline:
        return one.create(
            one.failures + 1,
            f"{request.name} was provisioned at {rfc3339(since)} and no "
            f"{one.slice_.unit.noun} of it could "
            f"be claimed within {int(claim_within)} s; given back; ",
            events.BOOKING_GIVEN_BACK,
        )
    if one.prov.queued:
        pool = request.node_pool
        if pool is None:
            return one.out(
                ProvisioningAction.WAIT,
                retry_at=deadline,
                state=SliceState.PROVISIONING,
                message=f"ProvisioningRequest {request.name} is provisioned but names no "
                f"node pool yet (provisioningClassDetails.NodePoolName)",
            )
        return one.out(
            ProvisioningAction.CLAIM,
            claim_pool=pool,
            retry_at=deadline,
            reason=events.CAPACITY_PROVISIONED,
            state=SliceState.PROVISIONING,
            message=f"capacity provisioned (ProvisioningRequest {request.name}); claiming "
            f"{_in_pool(one.slice_.unit, pool)} once its nodes are ready, by "
            f"{rfc3339(deadline)}",
        )
    return one.out(
        ProvisioningAction.CLAIM,
        search_pools=True,
        retry_at=deadline,
        reason=events.CAPACITY_PROVISIONED,
        state=SliceState.PROVISIONING,
        message=f"capacity provisioned (ProvisioningRequest {request.name}); claiming a "
        f"{_new_unit(one.slice_.unit)} by {rfc3339(deadline)}",
    )


def _in_pool(unit: CapacityUnit, pool: str) -> str:
    """What a queued request's capacity is in messages: its pool, or a node new in it."""
    return f"node pool {pool}" if unit is CapacityUnit.NODE_POOL else f"a new node of pool {pool}"


def _new_unit(unit: CapacityUnit) -> str:
    return "new whole node pool" if unit is CapacityUnit.NODE_POOL else "new node"


def _waiting(
    one: _Context, request: ProvisioningRequestInfo, said: _Conditions, now: datetime
) -> ProvisioningDecision:
    """Waiting for the autoscaler, in its own words (GKE: queue position, ETA)."""
    provisioned = said.provisioned
    accepted = request.condition(c.PROVREQ_ACCEPTED)
    words = (provisioned.message if provisioned else "") or (accepted.message if accepted else "")
    if accepted is None or not accepted.true:
        age = (now - request.created).total_seconds() if request.created else 0.0
        text = f"waiting for the cluster autoscaler to accept ProvisioningRequest {request.name}"
        if words:
            text += f": {words}"
        elif age > ACCEPT_HINT_SECONDS:
            text += (
                f" (none has in {int(age)} s: is one running with provisioning requests "
                f"enabled, and does it serve class {request.class_name}?)"
            )
        return one.out(ProvisioningAction.WAIT, state=SliceState.PROVISIONING, message=text)
    head = f"ProvisioningRequest {request.name} ({request.class_name}) accepted"
    return one.out(
        ProvisioningAction.WAIT,
        state=SliceState.PROVISIONING,
        message=f"{head}: {words}" if words else f"{head}; waiting for capacity",
    )
