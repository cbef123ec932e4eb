"""The leader-election state machine (``runtime.election_rules``) on a fake clock: no sleeps."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tpuslice.runtime.election_rules import (
    Candidate,
    Kind,
    Record,
    Timings,
    decide,
    forget,
    lease_body,
    lost_to,
    micro_time,
    must_stop,
    observe,
    record_of,
    release_record,
    written,
)

WALL = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
NS, NAME = "ops", "tpuslice-operator"


def stored(record: Record, version: int) -> dict[str, Any]:
    """The Lease as the API server would return it after a write."""
    body = lease_body(NS, NAME, record)
    body["metadata"]["resourceVersion"] = str(version)
    return body


def held_by(holder: str, version: int = 7, *, renew: datetime = WALL, **kw: Any) -> dict[str, Any]:
    stamp = micro_time(renew)
    return stored(Record(holder, 15, stamp, stamp, **kw), version)


def leader_at(now: float, identity: str = "a") -> Candidate:
    """``identity`` created the Lease at ``now`` and leads."""
    state = observe(Candidate(identity), None, now)
    decision = decide(state, now, WALL)
    assert decision.kind is Kind.CREATE and decision.record is not None
    return written(state, stored(decision.record, 1), now)


def test_defaults_are_client_gos_and_bad_timings_are_refused() -> None:
    assert Timings() == Timings(lease_duration=15, renew_deadline=10, retry_period=2)
    for bad in (
        {"lease_duration": 10, "renew_deadline": 10},
        {"renew_deadline": 2.4, "retry_period": 2},
        {"retry_period": 0},
        {"lease_duration": 15.5},
    ):
        with pytest.raises(ValueError):
            Timings(**bad)


def test_no_lease_is_created_and_then_we_lead() -> None:
    state = observe(Candidate("a"), None, 100.0)
    assert not state.leading
    decision = decide(state, 100.0, WALL)
    assert decision.kind is Kind.CREATE
    assert decision.record == Record(
        "a", 15, "2026-01-01T12:00:00.000000Z", "2026-01-01T12:00:00.000000Z", 0
    )
    assert decision.resource_version is None
    body = lease_body(NS, NAME, decision.record)
    assert "resourceVersion" not in body["metadata"]
    assert body["spec"]["holderIdentity"] == "a" and body["spec"]["leaseDurationSeconds"] == 15
    state = written(state, stored(decision.record, 1), 100.0)
    assert state.leading and state.renewed == 100.0
    assert state.observed is not None and state.observed.resource_version == "1"


def test_renewal_keeps_the_acquire_time_and_transitions_and_uses_the_version() -> None:
    state = leader_at(100.0)
    later = WALL + timedelta(seconds=2)
    decision = decide(state, 102.0, later)
    assert decision.kind is Kind.RENEW
    assert decision.record is not None
    assert decision.record.acquire_time == "2026-01-01T12:00:00.000000Z"
    assert decision.record.renew_time == "2026-01-01T12:00:02.000000Z"
    assert decision.record.transitions == 0
    assert decision.resource_version == "1"
    assert lease_body(NS, NAME, decision.record, "1")["metadata"]["resourceVersion"] == "1"


def test_another_holders_fresh_lease_blocks_until_a_whole_duration_without_change() -> None:
    state = observe(Candidate("b"), held_by("a"), 100.0)
    for now in (100.0, 107.0, 114.9):
        decision = decide(state, now, WALL)
        assert decision.kind is Kind.WAIT and decision.holder == "a"
        assert decision.expires_in == pytest.approx(115.0 - now)
    # the same record read again does not restart the wait ...
    state = observe(state, held_by("a", version=8), 110.0)
    assert decide(state, 114.9, WALL).kind is Kind.WAIT
    assert decide(state, 115.0, WALL).kind is Kind.TAKE_OVER
    # ... a renewal (a changed record) does
    renewed = held_by("a", version=9, renew=WALL + timedelta(seconds=12))
    state = observe(state, renewed, 112.0)
    assert decide(state, 126.9, WALL).kind is Kind.WAIT
    assert decide(state, 127.0, WALL).kind is Kind.TAKE_OVER


def test_an_expired_lease_is_taken_over_with_one_more_transition_under_its_version() -> None:
    state = observe(Candidate("b"), held_by("a", version=7, transitions=3), 100.0)
    decision = decide(state, 115.0, WALL)
    assert decision.kind is Kind.TAKE_OVER
    assert decision.record is not None
    assert decision.record.holder == "b" and decision.record.transitions == 4
    assert decision.record.acquire_time == micro_time(WALL)
    assert decision.resource_version == "7"  # a racing writer makes this a 409
    state = written(state, stored(decision.record, 8), 115.0)
    assert state.leading


def test_clock_skew_uses_our_own_observation_time_not_the_holders_renew_time() -> None:
    # the holder's clock is an hour slow: its renewTime looks long expired, but the
    # record just changed, so it is alive
    slow = held_by("a", renew=WALL - timedelta(hours=1))
    state = observe(Candidate("b"), slow, 100.0)
    assert decide(state, 101.0, WALL).kind is Kind.WAIT
    # the holder's clock is an hour fast: its renewTime is in our future, but the
    # record has not changed for a lease duration, so it is dead
    fast = held_by("a", version=8, renew=WALL + timedelta(hours=1))
    state = observe(Candidate("b"), fast, 100.0)
    assert decide(state, 115.0, WALL).kind is Kind.TAKE_OVER


def test_a_released_lease_is_taken_at_once() -> None:
    leader = leader_at(100.0)
    record = release_record(leader, WALL)
    assert record is not None and record.holder == "" and record.duration_s == 1
    state = observe(Candidate("b"), stored(record, 2), 101.0)
    decision = decide(state, 101.0, WALL)
    assert decision.kind is Kind.TAKE_OVER and decision.resource_version == "2"
    assert decision.record is not None and decision.record.transitions == 1


def test_only_a_leader_releases() -> None:
    standby = observe(Candidate("b"), held_by("a"), 100.0)
    assert release_record(standby, WALL) is None
    assert release_record(Candidate("b"), WALL) is None


def test_our_own_identity_is_renewed_at_once_after_a_restart() -> None:
    """The kubelet restarts a killed container under the same pod name."""
    state = observe(Candidate("a"), held_by("a", version=5, transitions=2), 100.0)
    assert not state.leading  # not until the renewal is written
    decision = decide(state, 100.0, WALL)
    assert decision.kind is Kind.RENEW and decision.resource_version == "5"
    assert decision.record is not None and decision.record.transitions == 2


def test_failing_to_renew_past_the_deadline_means_stop_acting() -> None:
    state = leader_at(100.0)
    assert not must_stop(state, 109.9)
    assert must_stop(state, 110.0)
    # a renewal sent at 108 moves the deadline to 118
    decision = decide(state, 108.0, WALL)
    assert decision.record is not None
    state = written(state, stored(decision.record, 2), 108.0)
    assert not must_stop(state, 117.9) and must_stop(state, 118.0)
    # failures (forget) do not move it
    assert must_stop(forget(state), 118.0)
    assert not must_stop(Candidate("x"), 1e9)  # never led: nothing to stop


def test_a_leader_stops_before_any_other_candidate_may_take_over() -> None:
    """The safety property: whatever the request latency, the standby's earliest
    take-over comes after the leader's deadline. The leader sends a renewal at
    ``sent``; the API server stores it ``latency`` later; the standby reads it
    ``poll`` after that and waits a lease duration from its own reading."""
    timings = Timings()
    for latency in (0.0, 0.5, 3.0, 9.0):
        for poll in (0.0, 1.0, 2.4):
            leader = leader_at(0.0)
            sent = 5.0
            decision = decide(leader, sent, WALL)
            assert decision.record is not None
            answer = stored(decision.record, 2)
            leader = written(leader, answer, sent)
            standby = observe(Candidate("b"), answer, sent + latency + poll)
            first_take_over = next(
                t / 10
                for t in range(0, 1000)
                if decide(standby, t / 10, WALL).kind is Kind.TAKE_OVER
            )
            assert must_stop(leader, first_take_over)
            margin = first_take_over - (sent + timings.renew_deadline)
            assert margin >= timings.lease_duration - timings.renew_deadline - 1e-9


def test_a_lease_taken_by_someone_else_while_we_led_is_lost_at_once() -> None:
    state = leader_at(100.0)
    assert lost_to(state) is None
    state = observe(state, held_by("c", version=9), 101.0)
    assert lost_to(state) == "c" and not state.leading
    # deleted: not lost, ours to create again (a racing create gets 409)
    assert lost_to(observe(leader_at(100.0), None, 101.0)) is None
    assert lost_to(observe(Candidate("b"), held_by("c"), 100.0)) is None  # never led


def test_metadata_only_changes_do_not_restart_the_wait() -> None:
    lease = held_by("a", version=7)
    state = observe(Candidate("b"), lease, 100.0)
    relabelled = {**lease, "metadata": {**lease["metadata"], "resourceVersion": "12"}}
    relabelled["metadata"]["labels"] = {"x": "y"}
    state = observe(state, relabelled, 110.0)
    assert state.observed is not None
    assert state.observed.since == 100.0 and state.observed.resource_version == "12"


def test_record_of_tolerates_missing_fields() -> None:
    assert record_of({}) == Record()
    assert record_of({"spec": {"holderIdentity": None, "leaseDurationSeconds": "x"}}) == Record()
    state = observe(Candidate("b"), {"metadata": {"resourceVersion": "3"}, "spec": {}}, 0.0)
    assert decide(state, 0.0, WALL).kind is Kind.TAKE_OVER  # nobody holds it


def test_deciding_without_an_observation_is_a_bug() -> None:
    with pytest.raises(ValueError):
        decide(Candidate("a"), 0.0, WALL)
    assert replace(Candidate("a"), renewed=1.0).leading is False
