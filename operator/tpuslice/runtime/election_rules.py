"""Leader election over a ``coordination.k8s.io/v1`` Lease: every decision, as pure functions.

Only the leader reconciles, claims node pools, ungates pods, writes status and
sweeps; every replica serves the identity webhook. This module decides, from
what a GET of the Lease returned and from our own clock, whether to create the
Lease, renew it, take it over or wait, and when a leader must stop acting. The
shell (``election.py``) does the requests; nothing here sleeps or talks to the
API server, so the rules are unit-tested on a fake clock.

The rules are client-go's ``tools/leaderelection`` (what kube-scheduler,
kube-controller-manager and controller-runtime use), with its defaults (lease
15 s, renew deadline 10 s, retry 2 s):

- A candidate never trusts the ``renewTime`` another host wrote: its clock may
  be skewed. It notes *its own* clock when it first sees the Lease's record
  change, and takes the Lease over only after ``leaseDurationSeconds`` without
  a change. That tolerates any clock offset between hosts; it relies only on
  clocks running at similar rates (the ratio lease/deadline, 1.5 by default,
  is the tolerated rate difference).
- Every write carries the ``resourceVersion`` that was read (or is a create),
  so of two candidates racing for an expired Lease exactly one succeeds; the
  other gets 409 and reads again.
- A Lease whose holder is our own identity is ours to renew at once: in a
  cluster the identity is the pod name, which a restarted container keeps, so
  an operator killed and restarted by the kubelet leads again without waiting
  out its own old Lease.
- A leader that has not renewed for ``renew_deadline`` stops acting. Here the
  deadline counts from when the last successful renewal was *sent*, which is
  before the API server stored it and so before any other candidate could have
  seen it: the leader stops at least ``lease_duration - renew_deadline`` (5 s)
  before anyone may take over. (client-go counts from the end of its renew
  attempt, a little later.)
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "JITTER",
    "Candidate",
    "Decision",
    "Kind",
    "Observed",
    "Record",
    "Timings",
    "decide",
    "forget",
    "lease_body",
    "lost_to",
    "micro_time",
    "must_stop",
    "observe",
    "record_of",
    "release_record",
    "written",
]

#: A waiting candidate retries after retry_period x uniform(1, JITTER), as client-go
#: does, so candidates started together do not keep colliding.
JITTER = 1.2


@dataclass(frozen=True)
class Timings:
    """Lease duration, renew deadline and retry period, in seconds (client-go's defaults)."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        # client-go's own checks: a deadline that is not shorter than the lease lets
        # a leader act while another has taken over; one within a retry of the
        # deadline gives a single failed renewal no second chance.
        if self.retry_period <= 0:
            raise ValueError("the retry period must be positive")
        if self.lease_duration <= self.renew_deadline:
            raise ValueError("the lease duration must be longer than the renew deadline")
        if self.renew_deadline <= JITTER * self.retry_period:
            raise ValueError(f"the renew deadline must be longer than {JITTER} x the retry period")
        if self.lease_duration != int(self.lease_duration):
            raise ValueError("the lease duration is whole seconds (leaseDurationSeconds)")


@dataclass(frozen=True)
class Record:
    """The fields of a Lease's spec that leader election reads and writes."""

    holder: str = ""  # "" : nobody holds it (released)
    duration_s: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0

    def to_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_s,
            "leaseTransitions": self.transitions,
        }
        if self.acquire_time:
            spec["acquireTime"] = self.acquire_time
        if self.renew_time:
            spec["renewTime"] = self.renew_time
        return spec


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def record_of(lease: Mapping[str, Any]) -> Record:
    """The leader-election record of a Lease object as the API server returned it."""
    spec = lease.get("spec") or {}
    return Record(
        holder=str(spec.get("holderIdentity") or ""),
        duration_s=_int(spec.get("leaseDurationSeconds")),
        acquire_time=spec.get("acquireTime"),
        renew_time=spec.get("renewTime"),
        transitions=_int(spec.get("leaseTransitions")),
    )


def micro_time(when: datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC): acquireTime, renewTime."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_body(
    namespace: str, name: str, record: Record, resource_version: str | None = None
) -> dict[str, Any]:
    """The Lease to create (no ``resource_version``) or to update under that version."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": record.to_spec(),
    }


@dataclass(frozen=True)
class Observed:
    """The Lease as last read, and *our* clock when its record last changed."""

    record: Record | None  # None: there is no Lease
    resource_version: str | None
    since: float


@dataclass(frozen=True)
class Candidate:
    """One instance's view of the election. ``renewed`` is when the last write that
    made or kept us leader was sent (our clock); None: we have not led yet."""

    identity: str
    timings: Timings = Timings()
    observed: Observed | None = None
    renewed: float | None = None

    @property
    def leading(self) -> bool:
        return (
            self.renewed is not None
            and self.observed is not None
            and self.observed.record is not None
            and self.observed.record.holder == self.identity
        )


def observe(state: Candidate, lease: Mapping[str, Any] | None, now: float) -> Candidate:
    """Fold in what a GET returned (None for 404). The observation time restarts only
    when the record changed: an unchanged record keeps ageing towards expiry."""
    record = record_of(lease) if lease is not None else None
    version = str((lease or {}).get("metadata", {}).get("resourceVersion") or "") or None
    seen = state.observed
    if seen is not None and seen.record == record:
        return replace(state, observed=replace(seen, resource_version=version))
    return replace(state, observed=Observed(record, version, now))


def forget(state: Candidate) -> Candidate:
    """A write lost a race (409) or failed: read the Lease again before the next try.

    The next observation starts a new wait, which can only make us more patient."""
    return replace(state, observed=None)


class Kind(enum.Enum):
    CREATE = "create"  # no Lease yet
    RENEW = "renew"  # we hold it
    TAKE_OVER = "take-over"  # released, or not renewed for a whole lease duration
    WAIT = "wait"  # another holder renewed it less than a lease duration ago


@dataclass(frozen=True)
class Decision:
    kind: Kind
    record: Record | None = None  # what to write (all but WAIT)
    resource_version: str | None = None  # the update's precondition (RENEW, TAKE_OVER)
    holder: str = ""  # WAIT: who holds it
    expires_in: float = 0.0  # WAIT: seconds until it could be taken if not renewed


def decide(state: Candidate, now: float, wall: datetime) -> Decision:
    """What to do next, given the last observation; ``wall`` stamps acquire/renew times
    (for people reading the Lease: no decision depends on them)."""
    seen = state.observed
    if seen is None:
        raise ValueError("observe the Lease before deciding")
    stamp = micro_time(wall)
    ours = Record(
        holder=state.identity,
        duration_s=int(state.timings.lease_duration),
        acquire_time=stamp,
        renew_time=stamp,
    )
    record = seen.record
    if record is None:
        return Decision(Kind.CREATE, ours)
    if record.holder == state.identity:
        kept = replace(
            ours, acquire_time=record.acquire_time or stamp, transitions=record.transitions
        )
        return Decision(Kind.RENEW, kept, seen.resource_version)
    expires_in = seen.since + record.duration_s - now
    if record.holder and expires_in > 0:
        return Decision(Kind.WAIT, holder=record.holder, expires_in=expires_in)
    return Decision(
        Kind.TAKE_OVER, replace(ours, transitions=record.transitions + 1), seen.resource_version
    )


def written(state: Candidate, lease: Mapping[str, Any], sent: float) -> Candidate:
    """A create or update succeeded (``lease`` is the API server's answer): we lead,
    counting from ``sent``, when the request left."""
    observed = observe(replace(state, observed=None), lease, sent).observed
    return replace(state, observed=observed, renewed=sent)


def must_stop(state: Candidate, now: float) -> bool:
    """We led, and the last successful renewal was sent ``renew_deadline`` or more ago:
    stop acting now, before any other candidate may consider the Lease expired."""
    return state.renewed is not None and now - state.renewed >= state.timings.renew_deadline


def lost_to(state: Candidate) -> str | None:
    """We led, and the Lease now names someone else ("" : nobody): who. None otherwise.

    Only an outside hand makes this happen (the Lease edited, or deleted and made
    again by another candidate): stop at once."""
    if state.renewed is None or state.observed is None:
        return None
    record = state.observed.record
    if record is None or record.holder == state.identity:
        return None  # gone (deleted): ours to create again, and a racing create gets 409
    return record.holder


def release_record(state: Candidate, wall: datetime) -> Record | None:
    """What a leader writes when it stops on purpose (after it stopped acting): no
    holder, so a standby takes over on its next try instead of after a lease duration.
    None when we do not hold the Lease."""
    if not state.leading or state.observed is None or state.observed.record is None:
        return None
    stamp = micro_time(wall)
    return Record(
        holder="",
        duration_s=1,
        acquire_time=stamp,
        renew_time=stamp,
        transitions=state.observed.record.transitions,
    )
