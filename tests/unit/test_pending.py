"""The record of our own unconfirmed writes, on its own (a fake clock)."""

from __future__ import annotations

from tests.support.builders import pod
from tpuslice.controller.expectations import TTL_SECONDS, PendingWrites
from tpuslice.model.records import Holder, ReservationInfo

OURS = Holder("ml", "llm", "uid-llm", "tpu-aaaaa", 0)
THEIRS = Holder("ml", "other", "uid-other", "tpu-zzzzz", 0)


def test_a_created_reservation_is_seen_until_the_index_shows_it() -> None:
    pending = PendingWrites()
    pending.reservation_created(ReservationInfo("pool-a", OURS), now=0.0)
    assert [r.pool for r in pending.reservations([])] == ["pool-a"]
    assert pending.created_by("uid-llm") == {"tpu-aaaaa"}
    assert [r.pool for r in pending.reservations([ReservationInfo("pool-a", OURS)])] == ["pool-a"]
    assert pending.created == {}  # the index has it: forgotten


def test_a_lost_claim_shows_the_winner_until_indexed() -> None:
    pending = PendingWrites()
    pending.reservation_seen(ReservationInfo("pool-a", THEIRS), now=0.0)
    (seen,) = pending.reservations([])
    assert seen.holder == THEIRS
    assert pending.created_by("uid-llm") == set()


def test_a_deleted_reservation_is_hidden_until_the_index_drops_it() -> None:
    pending = PendingWrites()
    pending.reservation_bound("pool-a", now=0.0)
    pending.reservation_deleted("pool-a", now=0.0)
    assert not pending.is_bound("pool-a")
    assert pending.reservations([ReservationInfo("pool-a", OURS)]) == []
    assert pending.reservations([]) == []
    assert pending.deleted == {}


def test_a_released_pod_reads_as_released_and_pinned_until_the_watch_shows_it() -> None:
    pending = PendingWrites()
    pending.pod_released("ml", "w0", "pool-a", now=0.0)
    (shown,) = pending.pods([pod("w0")])
    assert not shown.gated and shown.pinned_pool == "pool-a"
    assert pending.pods([pod("w0", gated=False)])[0].pinned_pool is None
    assert pending.released == {}


def test_entries_expire_after_the_ttl() -> None:
    pending = PendingWrites()
    pending.reservation_created(ReservationInfo("pool-a", OURS), now=0.0)
    pending.ray_applied(("RayCluster", "ml", "llm"), "abc", now=0.0)
    pending.expire(now=TTL_SECONDS)
    assert pending.applied_digest(("RayCluster", "ml", "llm")) == "abc"
    pending.expire(now=TTL_SECONDS + 0.1)
    assert pending.reservations([]) == []
    assert pending.applied_digest(("RayCluster", "ml", "llm")) is None


def test_a_bound_phase_is_forgotten_once_the_index_shows_bound() -> None:
    pending = PendingWrites()
    pending.reservation_bound("pool-a", now=0.0)
    pending.reservations([ReservationInfo("pool-a", OURS, phase="Reserved")])
    assert pending.is_bound("pool-a")
    pending.reservations([ReservationInfo("pool-a", OURS, phase="Bound")])
    assert not pending.is_bound("pool-a")
