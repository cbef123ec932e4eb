"""The record of our own unconfirmed writes, on its own (a fake clock)."""

from __future__ import annotations

from tests.support.builders import pod
from tpuslice.controller.expectations import TTL_SECONDS, Expectations
from tpuslice.model.records import Holder, ProvisioningRequestInfo, ReservationInfo

OURS = Holder("ml", "llm", "uid-llm", "tpu-aaaaa", 0)
THEIRS = Holder("ml", "other", "uid-other", "tpu-zzzzz", 0)


def test_a_created_reservation_is_seen_until_the_index_shows_it() -> None:
    pending = Expectations()
    pending.reservation_created(ReservationInfo("pool-a", OURS), now=0.0)
    assert [r.pool for r in pending.reservations([])] == ["pool-a"]
    assert pending.created_by("uid-llm") == {"tpu-aaaaa"}
    assert [r.pool for r in pending.reservations([ReservationInfo("pool-a", OURS)])] == ["pool-a"]
    pending.observed([ReservationInfo("pool-a", OURS)])
    assert pending.created == {}  # the index has it: forgotten


def test_a_lost_claim_shows_the_winner_until_indexed() -> None:
    pending = Expectations()
    pending.reservation_seen(ReservationInfo("pool-a", THEIRS), now=0.0)
    (seen,) = pending.reservations([])
    assert seen.holder == THEIRS
    assert pending.created_by("uid-llm") == set()


def test_a_deleted_reservation_is_hidden_until_the_index_drops_it() -> None:
    pending = Expectations()
    pending.reservation_bound("pool-a", now=0.0)
    pending.reservation_deleted("pool-a", now=0.0)
    assert not pending.is_bound("pool-a")
    assert pending.reservations([ReservationInfo("pool-a", OURS)]) == []
    assert pending.reservations([]) == []
    pending.reservation_gone("pool-a")
    assert pending.deleted == {}


def test_a_released_pod_reads_as_released_and_pinned_until_the_watch_shows_it() -> None:
    pending = Expectations()
    pending.pod_released("ml", "w0", "pool-a", now=0.0)
    (shown,) = pending.pods([pod("w0")])
    assert not shown.gated and shown.pinned_pool == "pool-a"
    assert pending.pods([pod("w0", gated=False)])[0].pinned_pool is None
    pending.observed(pods=[pod("w0", gated=False)])
    assert pending.released == {}


def test_entries_expire_after_the_ttl() -> None:
    pending = Expectations()
    pending.reservation_created(ReservationInfo("pool-a", OURS), now=0.0)
    pending.ray_applied(("RayCluster", "ml", "llm"), "abc", now=0.0)
    pending.expire(now=TTL_SECONDS)
    assert pending.applied_digest(("RayCluster", "ml", "llm")) == "abc"
    pending.expire(now=TTL_SECONDS + 0.1)
    assert pending.reservations([]) == []
    assert pending.applied_digest(("RayCluster", "ml", "llm")) is None


def test_a_bound_phase_is_forgotten_once_the_index_shows_bound() -> None:
    pending = Expectations()
    pending.reservation_bound("pool-a", now=0.0)
    pending.observed([ReservationInfo("pool-a", OURS, phase="Reserved")])
    assert pending.is_bound("pool-a")
    pending.observed([ReservationInfo("pool-a", OURS, phase="Bound")])
    assert not pending.is_bound("pool-a")


def test_reading_never_changes_the_store() -> None:
    pending = Expectations()
    pending.reservation_created(ReservationInfo("pool-a", OURS), now=0.0)
    pending.reservation_deleted("pool-b", now=0.0, uid="uid-b")
    pending.pod_released("ml", "w0", "pool-a", now=0.0)
    pending.reservation_bound("pool-a", now=0.0)
    before = repr(pending)
    pending.reservations([ReservationInfo("pool-a", OURS, phase="Bound")])
    pending.reservations([])  # another shape's view: pool-b is not in it
    pending.pods([pod("w0", gated=False)])
    assert repr(pending) == before


def test_a_view_without_the_pool_keeps_its_delete() -> None:
    pending = Expectations()
    pending.reservation_deleted("pool-b", now=0.0, uid="uid-b")
    pending.observed([ReservationInfo("pool-a", OURS, uid="uid-a")])  # one shape's view
    assert pending.reservations([ReservationInfo("pool-b", OURS, uid="uid-b")]) == []


def test_a_delete_hides_only_the_reservation_it_deleted() -> None:
    pending = Expectations()
    pending.reservation_deleted("pool-a", now=0.0, uid="uid-old")
    newer = ReservationInfo("pool-a", THEIRS, uid="uid-new")
    assert pending.reservations([newer]) == [newer]
    pending.observed([newer])
    assert pending.deleted == {}


def test_request_writes_are_expected_per_owner_until_observed() -> None:
    owner = ("TPUSliceCluster", "ml", "llm")
    made = ProvisioningRequestInfo("ml", "llm-0-1")
    old = ProvisioningRequestInfo("ml", "llm-0-0")
    pending = Expectations()
    pending.request_created(owner, made, now=0.0)
    pending.request_deleted(owner, "ml", "llm-0-0", now=0.0)
    assert pending.requests(owner, [old]) == [made]
    assert pending.requests(("TPUSliceCluster", "ml", "other"), []) == []
    pending.requests_observed(owner, [made])
    assert pending.requests_created == {} and pending.requests_deleted == {}
    pending.request_retired("ml", "llm-0-1", "pool-a", now=0.0)
    (retired,) = pending.requests(owner, [made])
    assert retired.revoked_pool == "pool-a"
    pending.expire(now=TTL_SECONDS + 0.1)
    assert pending.requests_retired == {}
