"""The Elector (election.py) against an in-memory Lease store with the API server's
optimistic concurrency, on a fake clock: two instances, races, deadlines, hand-over."""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from tpuslice.runtime.election import Conflict, Elector
from tpuslice.runtime.election_rules import Timings
from tpuslice.runtime.health import Health
from tpuslice.runtime.kube import ApiError
from tpuslice.runtime.metrics import Metrics


class Clock:
    """A fake monotonic clock whose ``wait`` stands in for ``Event.wait``: the Elector's
    threads block in it until ``advance`` moves the time past their deadline (or their
    event is set), so the loops run at the test's pace and no test sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._cond = threading.Condition()
        self._threads: set[threading.Thread] = set()
        self._deadlines: dict[threading.Thread, float] = {}  # threads blocked in wait

    def __call__(self) -> float:
        return self.now

    def wait(self, event: threading.Event, seconds: float) -> bool:
        me = threading.current_thread()
        with self._cond:
            self._threads.add(me)
            deadline = self.now + seconds
            self._deadlines[me] = deadline
            self._cond.notify_all()
            # a short real timeout only to notice event.set(), which does not notify us
            while not event.is_set() and self.now < deadline:
                self._cond.wait(0.005)
            del self._deadlines[me]
            self._cond.notify_all()
            return event.is_set()

    def _settled(self) -> bool:
        """Every thread seen has ended or blocks in ``wait`` on a deadline still ahead."""
        return all(
            not t.is_alive() or self._deadlines.get(t, self.now) > self.now for t in self._threads
        )

    def _settle(self) -> None:
        assert self._cond.wait_for(self._settled, timeout=5), "the threads did not settle"

    def waiting(self, count: int) -> None:
        """Block until ``count`` threads wait on this clock (threads just started)."""
        with self._cond:
            assert self._cond.wait_for(lambda: len(self._deadlines) >= count, timeout=5)

    def advance(self, seconds: float) -> None:
        """Move the time on by ``seconds``, stopping at each deadline on the way and letting
        the woken threads run until they wait again (or end)."""
        with self._cond:
            self._settle()
            target = self.now + seconds
            while True:
                due = [d for d in self._deadlines.values() if d <= target]
                self.now = min(due) if due else target
                self._cond.notify_all()
                self._settle()
                if not due:
                    return


class FakeLeases:
    """One Lease with resourceVersion preconditions, as the API server keeps it: a create
    of an existing Lease and an update under a stale version both get 409."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.fail: Exception | None = None
        self.after_get: Callable[[], Any] | None = None  # runs once, after a read
        self.writes: list[str] = []

    def get(self, timeout: float) -> Mapping[str, Any] | None:
        if self.fail is not None:
            raise self.fail
        snapshot = copy.deepcopy(self.lease)
        hook, self.after_get = self.after_get, None
        if hook is not None:
            hook()
        return snapshot

    def create(self, body: Mapping[str, Any], timeout: float) -> Mapping[str, Any]:
        if self.fail is not None:
            raise self.fail
        if self.lease is not None:
            raise Conflict("exists")
        return self._store(body, "create")

    def update(self, body: Mapping[str, Any], timeout: float) -> Mapping[str, Any]:
        if self.fail is not None:
            raise self.fail
        if self.lease is None:
            raise ApiError(404, "NotFound", "gone")
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise Conflict("modified")
        return self._store(body, "update")

    def _store(self, body: Mapping[str, Any], verb: str) -> dict[str, Any]:
        self.version += 1
        self.lease = copy.deepcopy(dict(body))
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        self.writes.append(f"{verb} {body['spec']['holderIdentity'] or '-'}")
        return copy.deepcopy(self.lease)

    @property
    def holder(self) -> str | None:
        return None if self.lease is None else self.lease["spec"]["holderIdentity"]

    @property
    def transitions(self) -> int:
        assert self.lease is not None
        return int(self.lease["spec"]["leaseTransitions"])


def elector(
    store: FakeLeases, identity: str, clock: Clock, timings: Timings | None = None, **kw: Any
) -> Elector:
    return Elector(
        store,
        identity,
        namespace="ops",
        name="tpuslice-operator",
        timings=timings,
        clock=clock,
        wall=lambda: datetime.fromtimestamp(clock.now, UTC),  # renewTime changes each write
        wait=clock.wait,
        **kw,
    )


def test_one_leads_the_other_waits_then_takes_over_a_dead_leader() -> None:
    store, clock = FakeLeases(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.attempt() and store.holder == "a"
    assert not b.attempt()
    for _ in range(7):  # a renews every 2 s; b never gets it
        clock.now += 2
        assert a.attempt() and not b.attempt()
    assert store.writes == ["create a"] + ["update a"] * 7
    # a dies (stops renewing): b takes over a lease duration after it last saw a change
    clock.now += 14.9
    assert not b.attempt()
    clock.now += 0.1
    assert b.attempt() and store.holder == "b" and store.transitions == 1
    # a, back from a long pause, updates its own stale copy: 409, then it reads and
    # sees b: it must stop at once, not at its deadline
    assert not a.attempt()
    assert not a.attempt()
    reason = a.stop_reason()
    assert reason is not None and "held by b" in reason
    assert b.stop_reason() is None


def test_of_two_racing_creators_exactly_one_wins() -> None:
    store, clock = FakeLeases(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    store.after_get = a.attempt  # a creates between b's read (no Lease) and b's create
    assert not b.attempt()
    assert store.holder == "a" and store.writes == ["create a"]
    assert not b.attempt()  # now it waits
    assert not b.state.leading and a.state.leading


def test_of_two_racing_take_overs_exactly_one_wins() -> None:
    store, clock = FakeLeases(), Clock()
    dead = elector(store, "dead", clock)
    assert dead.attempt()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert not a.attempt() and not b.attempt()
    clock.now += 15
    store.after_get = b.attempt  # b takes over between a's read and a's write
    assert not a.attempt()
    assert store.holder == "b" and store.transitions == 1
    assert store.writes == ["create dead", "update b"]


def test_failing_renewals_stop_the_leader_at_the_deadline_counted_from_the_last_send() -> None:
    store, clock = FakeLeases(), Clock()
    health = Health(clock=clock, watch_grace_s=15)
    a = elector(store, "a", clock, health=health)
    assert a.attempt()
    last_sent = clock.now
    store.fail = OSError("connection refused")
    for _ in range(4):
        clock.now += 2
        assert not a.attempt()
        assert a.stop_reason() is None
    clock.now = last_sent + 9.99
    assert a.stop_reason() is None
    clock.now = last_sent + 10
    reason = a.stop_reason()
    assert reason is not None and "not renewed for 10s" in reason
    # and readiness says why once the failures outlast the grace
    clock.now = last_sent + 2 + 15.1
    assert "watching leases has failed" in health.readiness().text()


def test_the_watchdog_calls_on_lost_once_when_the_deadline_passes() -> None:
    store, clock = FakeLeases(), Clock()
    metrics = Metrics()
    a = elector(store, "a", clock, Timings(3, 2, 0.5), metrics=metrics)
    assert a.attempt()
    lost: list[str] = []
    called = threading.Event()

    def on_lost(reason: str) -> None:
        lost.append(reason)
        called.set()

    store.fail = OSError("down")
    a.keep(on_lost)
    clock.waiting(2)
    assert metrics.leader._value.get() == 1
    clock.advance(0.3)
    assert lost == []
    clock.advance(2)
    assert called.is_set()
    clock.advance(0.3)
    assert len(lost) == 1 and "renew deadline" in lost[0]
    assert metrics.leader._value.get() == 0
    a.release()  # stops the threads; past the deadline it writes nothing
    assert store.writes == ["create a"]


def test_keep_renews_on_its_own_thread() -> None:
    store, clock = FakeLeases(), Clock()
    a = elector(store, "a", clock, Timings(3, 2, 0.5))
    assert a.attempt()
    a.keep(lambda reason: pytest.fail(reason))
    clock.waiting(2)
    clock.advance(1.0)  # two retry periods
    a.release()
    assert store.writes[:3] == ["create a", "update a", "update a"]
    assert store.writes[-1] == "update -" and store.holder == ""


def test_release_hands_over_at_once() -> None:
    store, clock = FakeLeases(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.attempt() and not b.attempt()
    a.release()
    assert store.holder == "" and not a.state.leading
    clock.now += 2  # b's next try, long before a lease duration
    assert b.attempt() and store.holder == "b" and store.transitions == 1


def test_a_standby_releases_nothing() -> None:
    store, clock = FakeLeases(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.attempt() and not b.attempt()
    b.release()
    assert store.writes == ["create a"]


def test_a_restart_under_the_same_identity_leads_at_once() -> None:
    store, clock = FakeLeases(), Clock()
    assert elector(store, "pod-1", clock).attempt()
    clock.now += 1  # killed and restarted by the kubelet under the same pod name
    again = elector(store, "pod-1", clock)
    assert again.attempt() and store.writes == ["create pod-1", "update pod-1"]
    assert store.transitions == 0


def test_acquire_blocks_until_leading_or_stopped() -> None:
    store, clock = FakeLeases(), Clock()
    metrics, health = Metrics(), Health(clock=clock)
    holder = elector(store, "a", clock)
    assert holder.attempt()
    b = elector(store, "b", clock, Timings(3, 2, 0.5), metrics=metrics, health=health)
    stop = threading.Event()
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(b.acquire(stop)))
    thread.start()
    clock.waiting(1)
    clock.advance(0.3)
    assert result == [] and metrics.leader._value.get() == 0
    assert health.liveness().ok and health._beat is not None  # the start-up thread beats
    stop.set()
    thread.join(2)
    assert result == [False]
    holder.release()
    assert b.acquire(threading.Event())


def test_standby_is_logged_once_per_holder(caplog: pytest.LogCaptureFixture) -> None:
    store, clock = FakeLeases(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.attempt()
    with caplog.at_level(logging.INFO, logger="tpuslice.runtime.election"):
        for _ in range(3):
            clock.now += 2
            assert a.attempt() and not b.attempt()
    lines = [r.getMessage() for r in caplog.records if "standby" in r.getMessage()]
    assert len(lines) == 1 and "held by a" in lines[0]


def test_a_leader_that_is_not_alive_stops_renewing_and_so_stops() -> None:
    store, clock = FakeLeases(), Clock()
    a = elector(store, "a", clock, Timings(3, 2, 0.5))
    assert a.attempt()
    lost = threading.Event()
    alive = [True]
    a.keep(lambda reason: lost.set(), alive=lambda: alive[0])
    clock.waiting(2)
    clock.advance(0.5)  # one retry period
    assert store.writes[-1] == "update a"  # renewing while alive
    alive[0] = False  # the event loop hangs
    clock.advance(0.7)
    renewals = len(store.writes)
    clock.advance(1.2)  # still short of the renew deadline after the last renewal
    assert len(store.writes) == renewals  # no renewal any more
    assert not lost.is_set()
    clock.advance(2)  # the deadline passes
    assert lost.is_set()
    a.release()
