"""Capacity on demand: the per-slice request state machine (``decide``), pure.

Everything it reads lives in the API server: the request (its attempt and failure
count are its labels and annotations, its conditions say where it stands) and
``status.slices[].provisioning``.

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

from datetime import datetime, timedelta
from typing import Any

from tpuslice.capacity.objects import request_hash, request_name
from tpuslice.model import constants as c
from tpuslice.model import events
from tpuslice.model.records import (
    ProvisioningAction,
    ProvisioningDecision,
    ProvisioningRequestInfo,
    RequestCondition,
    SliceFacts,
    SliceProvisioning,
    SliceState,
)
from tpuslice.spec.parse import RetryPolicy, SliceClusterSpec

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


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


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
    index = slice_.index
    if request is not None:
        attempt, failures = request.attempt, request.failures
    elif history is not None:
        attempt, failures = history.attempt, history.failures
    else:
        attempt, failures = 0, 0
    raycluster = slice_.raycluster or (request.raycluster if request else "") or spec.name

    def out(action: ProvisioningAction, **kw: Any) -> ProvisioningDecision:
        fields: dict[str, Any] = {
            "index": index,
            "request": request.name if request is not None else None,
            "attempt": attempt,
            "failures": failures,
        }
        fields.update(kw)
        return ProvisioningDecision(action, **fields)

    holds = slice_.pool is not None
    wanted = prov is not None and prov.enabled and spec.gated and not spec.suspend

    # ---- nothing to ask for
    if not wanted:
        if request is None:
            return out(ProvisioningAction.NONE)
        if holds or slice_.released:
            return out(ProvisioningAction.KEEP)
        if request.deleting:
            return out(ProvisioningAction.WAIT)
        return out(
            ProvisioningAction.DELETE,
            delete=request.name,
            reason=events.PROVISIONING_REQUEST_DELETED,
            message=f"deleting ProvisioningRequest {request.name}: spec.reservation."
            f"provisioning asks for no capacity",
        )
    assert prov is not None
    retry = prov.retry

    if request is not None and request.deleting:
        waiting = slice_.exists and not holds and not slice_.released
        return out(
            ProvisioningAction.WAIT,
            state=SliceState.PROVISIONING if waiting else None,
            message=f"ProvisioningRequest {request.name} is being deleted" if waiting else "",
        )

    # ---- the slice is gone
    if not slice_.exists:
        if request is None:
            return out(ProvisioningAction.NONE)
        return out(
            ProvisioningAction.DELETE,
            delete=request.name,
            reason=events.PROVISIONING_REQUEST_DELETED,
            message=f"slice {index} is gone; deleting ProvisioningRequest {request.name}",
        )

    failed = request.condition(c.PROVREQ_FAILED) if request else None
    expired = request.condition(c.PROVREQ_BOOKING_EXPIRED) if request else None
    revoked = request.condition(c.PROVREQ_CAPACITY_REVOKED) if request else None
    provisioned = request.condition(c.PROVREQ_PROVISIONED) if request else None
    is_failed = failed is not None and failed.true
    is_expired = expired is not None and expired.true
    is_revoked = revoked is not None and revoked.true
    is_provisioned = provisioned is not None and provisioned.true
    # The OSS autoscaler ends a booking as soon as the request's pods are bound
    # (processors/provreq/processor.go: BookingExpired reason CapacityBookingConsumed):
    # the capacity is in use, never lost; our pod store may show the binding later.
    consumed = is_expired and expired is not None and expired.reason == BOOKING_CONSUMED

    # Whether the pool the slice holds is the request's capacity: it was provisioned, and
    # (queued) it is the pool the request names. Otherwise the slice took an existing
    # pool and the request is merely left over.
    ours = is_provisioned and (
        not prov.queued or request is None or request.node_pool in (None, slice_.pool)
    )

    # ---- released: the slice runs (or starts) on the request's capacity
    if slice_.released:
        if request is None:
            return out(ProvisioningAction.NONE)
        if not ours:
            return out(
                ProvisioningAction.DELETE,
                delete=request.name,
                reason=events.PROVISIONING_REQUEST_DELETED,
                message=f"slice {index} runs on node pool {slice_.pool}, not on the capacity of "
                f"ProvisioningRequest {request.name}; deleting it",
            )
        lost: RequestCondition | None = None
        reason = ""
        if is_revoked:
            lost, reason = revoked, events.CAPACITY_REVOKED
        elif not slice_.bound and is_expired and not consumed:
            lost, reason = expired, events.BOOKING_EXPIRED
        elif not slice_.bound and is_failed:
            lost, reason = failed, events.PROVISIONING_RETRY
        if lost is None:
            return out(ProvisioningAction.KEEP)
        return out(
            ProvisioningAction.REPLACE,
            replace_slice=True,
            delete=request.name,
            reason=reason,
            # revoked after a run is the end of a lease, not a failure of the request
            failures=failures if is_revoked else failures + 1,
            message=f"ProvisioningRequest {request.name}: {_said(lost)}; the capacity under "
            f"slice {index} is gone, replacing the slice (it asks again)",
        )

    # ---- holds a pool, not released yet
    if holds:
        if request is None:
            return out(ProvisioningAction.NONE)
        if not ours:
            return out(
                ProvisioningAction.DELETE,
                delete=request.name,
                reason=events.PROVISIONING_REQUEST_DELETED,
                message=f"slice {index} holds node pool {slice_.pool}; deleting "
                f"ProvisioningRequest {request.name}",
            )
        lapsed = next((x for x in (revoked, expired, failed) if x is not None and x.true), None)
        if lapsed is not None:
            # the gang held it back, not the request: no failure, and nothing to wait for
            gang = slice_.gang_waiting
            return out(
                ProvisioningAction.GIVE_BACK,
                give_back=True,
                delete=request.name if gang else None,
                reason=events.BOOKING_EXPIRED,
                message=f"ProvisioningRequest {request.name}: {_said(lapsed)} before the "
                f"slice was released{' (its gang was short)' if gang else ''}; giving node "
                f"pool {slice_.pool} back",
            )
        return out(ProvisioningAction.KEEP)

    # ---- holds no pool
    def stall_spent(count: int, why: str) -> ProvisioningDecision:
        return out(
            ProvisioningAction.STALL,
            failures=count,
            reason=events.PROVISIONING_FAILED,
            stalled=f"slice {index}: {why}{count} failed attempts, spec.reservation."
            f"provisioning.retry.limit {retry.limit} spent; raise the limit to try again",
            state=SliceState.PROVISIONING,
            message=f"{why}retry limit {retry.limit} spent",
        )

    def create(count: int, why: str, reason: str) -> ProvisioningDecision:
        if count > retry.limit:
            return stall_spent(count, why)
        if not slice_.pods_complete and request is not None:
            # the next attempt waits for all pods; the count is kept in status meanwhile
            return out(
                ProvisioningAction.DELETE,
                delete=request.name,
                failures=count,
                reason=reason,
                state=SliceState.PROVISIONING,
                message=f"{why}asking again once all pods of the slice exist",
            )
        new = request_name(raycluster, index, attempt + 1)
        return out(
            ProvisioningAction.RETRY if request is not None else ProvisioningAction.CREATE,
            delete=request.name if request is not None else None,
            create_attempt=attempt + 1,
            failures=count,
            request=new,
            attempt=attempt + 1,
            reason=reason,
            state=SliceState.PROVISIONING,
            message=f"{why}asking the cluster autoscaler for a node pool: "
            f"ProvisioningRequest {new} ({prov.class_name}), attempt {attempt + 1}",
        )

    if request is None:
        if not slice_.pods_complete or slice_.eligible_pool:
            return out(ProvisioningAction.NONE)
        return create(failures, "", events.PROVISIONING_REQUESTED)

    live = is_provisioned and not (is_failed or is_expired or is_revoked)
    if slice_.eligible_pool and not live:
        return out(
            ProvisioningAction.DELETE,
            delete=request.name,
            reason=events.PROVISIONING_REQUEST_DELETED,
            message=f"a free node pool is there for slice {index}; deleting "
            f"ProvisioningRequest {request.name}",
        )

    if is_failed and config_error(failed):
        said = _said(failed)
        again = _when(failed, request, now) + timedelta(seconds=retry.max_backoff_seconds)
        if now >= again and slice_.pods_complete:
            return create(
                failures, f"{request.name} was refused ({said}); ", events.PROVISIONING_RETRY
            )
        return out(
            ProvisioningAction.STALL,
            reason=events.PROVISIONING_FAILED,
            stalled=f"slice {index}: the cluster autoscaler refused ProvisioningRequest "
            f"{request.name}: {said}; fix the node pools or spec.reservation.provisioning "
            f"(tried again at {_stamp(again)})",
            retry_at=again if again > now else None,
            state=SliceState.PROVISIONING,
            message=f"refused: {said}",
        )

    lapsed = failed if is_failed else revoked if is_revoked else expired if is_expired else None
    if lapsed is not None:
        count = failures + 1
        verb = "failed" if lapsed is failed else "lapsed"
        why = f"{request.name} {verb} ({_said(lapsed)}); "
        if count > retry.limit:
            return stall_spent(count, why)
        at = retry_time(_when(lapsed, request, now), count, retry)
        if now >= at and slice_.pods_complete:
            return create(count, why, events.PROVISIONING_RETRY)
        left = retry.limit - count
        return out(
            ProvisioningAction.WAIT,
            reason=events.PROVISIONING_RETRY
            if lapsed is failed
            else events.CAPACITY_REVOKED
            if lapsed is revoked
            else events.BOOKING_EXPIRED,
            retry_at=at if at > now else None,
            state=SliceState.PROVISIONING,
            message=f"{why}attempt {attempt + 1} at {_stamp(at)} ({left} more "
            f"retr{'y' if left == 1 else 'ies'} after it)",
        )

    if not is_provisioned and (
        request.class_name != prov.class_name
        or (request.spec_hash and request.spec_hash != request_hash(spec))
    ):
        return create(
            failures, f"{request.name} was made from another spec; ", events.PROVISIONING_RETRY
        )

    if is_provisioned:
        since = _when(provisioned, request, now)
        deadline = since + timedelta(seconds=claim_within)
        if now >= deadline and slice_.eligible_pool:
            # a free pool is there (maybe this one) but was not taken in time: drop the
            # request and let the planner treat the pool as any other
            return out(
                ProvisioningAction.DELETE,
                delete=request.name,
                reason=events.BOOKING_GIVEN_BACK,
                message=f"{request.name} was provisioned at {_stamp(since)} and not claimed "
                f"within {int(claim_within)} s; giving it back (a free node pool is there)",
            )
        if now >= deadline:
            return create(
                failures + 1,
                f"{request.name} was provisioned at {_stamp(since)} and no node pool of it could "
                f"be claimed within {int(claim_within)} s; given back; ",
                events.BOOKING_GIVEN_BACK,
            )
        if prov.queued:
            pool = request.node_pool
            if pool is None:
                return out(
                    ProvisioningAction.WAIT,
                    retry_at=deadline,
                    state=SliceState.PROVISIONING,
                    message=f"ProvisioningRequest {request.name} is provisioned but names no "
                    f"node pool yet (provisioningClassDetails.NodePoolName)",
                )
            return out(
                ProvisioningAction.CLAIM,
                claim_pool=pool,
                retry_at=deadline,
                reason=events.CAPACITY_PROVISIONED,
                state=SliceState.PROVISIONING,
                message=f"capacity provisioned (ProvisioningRequest {request.name}); claiming "
                f"node pool {pool} once its nodes are ready, by {_stamp(deadline)}",
            )
        return out(
            ProvisioningAction.CLAIM,
            search_pools=True,
            retry_at=deadline,
            reason=events.CAPACITY_PROVISIONED,
            state=SliceState.PROVISIONING,
            message=f"capacity provisioned (ProvisioningRequest {request.name}); claiming a "
            f"new whole node pool by {_stamp(deadline)}",
        )

    # ---- waiting for the autoscaler, in its own words (GKE: queue position, ETA)
    accepted = request.condition(c.PROVREQ_ACCEPTED)
    said = (provisioned.message if provisioned else "") or (accepted.message if accepted else "")
    if accepted is None or not accepted.true:
        age = (now - request.created).total_seconds() if request.created else 0.0
        text = f"waiting for the cluster autoscaler to accept ProvisioningRequest {request.name}"
        if said:
            text += f": {said}"
        elif age > ACCEPT_HINT_SECONDS:
            text += (
                f" (none has in {int(age)} s: is one running with provisioning requests "
                f"enabled, and does it serve class {request.class_name}?)"
            )
        return out(ProvisioningAction.WAIT, state=SliceState.PROVISIONING, message=text)
    head = f"ProvisioningRequest {request.name} ({request.class_name}) accepted"
    return out(
        ProvisioningAction.WAIT,
        state=SliceState.PROVISIONING,
        message=f"{head}: {said}" if said else f"{head}; waiting for capacity",
    )
