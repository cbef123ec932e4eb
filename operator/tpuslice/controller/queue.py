"""When a cluster's pass runs: the kick queue, and the backoff of failing clusters.

Every trigger (the cluster's own events, its pods, its RayCluster, nodes and
reservations of its shape, a timer) is a kick. Kicks for a cluster whose pass
is running coalesce into one more pass, so a burst of 200 pod events costs a
few passes, not 200. Kicks are held at start-up until our watches have listed every
kind (a pass without the cluster's reservations would claim pools it already
holds), and folded there: an object kicked by its own listing and by each of its
reservations' has one pass.

``PassSlots`` bounds how many passes run at once, for every kind together, and
lets an object that has had no pass since start-up go ahead of the re-passes
that pod and node events keep kicking for objects already in flight: passes
share one event loop and one pool of API threads, so with every pass let in at
once a new object's first pass (the one that applies its RayCluster) took its
turn behind all of them, and each pass's wall time grew with their number.
Ahead of both goes a pass kicked by a pod change that completed a slice
(``informers.release_kicks``): it is the pass that ungates the slice, and in the
re-pass lane it waited seconds behind the passes of every object in flight. A
first pass that created the object's KubeRay object ends there and asks for its
follow-up (``KickQueue.follow_up``), the pass that plans its slices and writes its
status, which waits behind the first passes and ahead of the re-passes (``Lane``
says why this order).

``Backoff`` is pure (the caller passes the clock): a cluster whose passes fail
waits 5 s, then twice as long each time, up to 5 minutes; a success or a new
generation (the user changed the spec) ends the wait.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from tpuslice.model.records import ObjectKey

__all__ = [
    "PASS_SLOTS",
    "Backoff",
    "Failure",
    "KickQueue",
    "Lane",
    "PassSlots",
    "backoff_seconds",
    "lane_of",
]

#: A failed pass is retried after RETRY_SECONDS, then twice as long each time it fails
#: again, up to MAX_BACKOFF_SECONDS; a success forgets the count.
RETRY_SECONDS = 5.0
MAX_BACKOFF_SECONDS = 300.0
#: Passes running at once (every kind together): enough to keep the API threads busy
#: (a pass makes its requests one after another), few enough that a pass is not spread
#: thin over hundreds of others on the one event loop.
PASS_SLOTS = 16
#: While passes keep failing, a Warning event is posted at most this often per cluster.
FAILURE_EVENT_SECONDS = 300.0


def backoff_seconds(failures: int) -> float:
    """Delay before the next pass after ``failures`` failed passes in a row (>= 1)."""
    return float(min(RETRY_SECONDS * 2 ** min(failures - 1, 30), MAX_BACKOFF_SECONDS))


@dataclass
class Failure:
    """A cluster whose passes fail: how often, when to try again, what was said."""

    count: int
    retry_at: float  # monotonic
    generation: int
    error: str
    event_at: float = -math.inf
    #: This failure's error differs from the one before (log its traceback).
    new_error: bool = True
    #: A Warning event is due (the first, or FAILURE_EVENT_SECONDS after the last one).
    event_due: bool = False

    @property
    def delay(self) -> float:
        return backoff_seconds(self.count)


@dataclass
class Backoff:
    """The failing clusters, and whether an earlier failure holds a pass back."""

    _failing: dict[ObjectKey, Failure] = field(default_factory=dict)

    def wait(self, key: ObjectKey, generation: int, now: float) -> float:
        """Seconds the pass must still wait (0: run it). A changed generation is a fix
        to try at once."""
        failing = self._failing.get(key)
        if failing is None or generation != failing.generation:
            return 0.0
        return max(0.0, failing.retry_at - now)

    def failed(self, key: ObjectKey, generation: int, error: str, now: float) -> Failure:
        before = self._failing.get(key)
        count = before.count + 1 if before else 1
        failure = Failure(count, now + backoff_seconds(count), generation, error)
        failure.new_error = before is None or before.error != error
        failure.event_at = before.event_at if before else -math.inf
        failure.event_due = now - failure.event_at >= FAILURE_EVENT_SECONDS
        self._failing[key] = failure
        return failure

    def event_posted(self, key: ObjectKey, now: float) -> None:
        """The failure's Warning event went out: the next one waits FAILURE_EVENT_SECONDS."""
        failing = self._failing.get(key)
        if failing is not None:
            failing.event_at, failing.event_due = now, False

    def succeeded(self, key: ObjectKey) -> None:
        self._failing.pop(key, None)

    def failing(self, key: ObjectKey) -> Failure | None:
        return self._failing.get(key)


class Lane(IntEnum):
    """Where a pass waits for a slot; a freed slot goes to the lowest lane with a waiter.

    A release pass (its kick came from a pod change that completed a slice, so the pass
    may ungate it) goes first: its wait is the whole of the time from the last pod of a
    slice to its release, and a slice completes once, so the lane holds at most one pass
    per slice that became whole. First passes (no pass since start-up) come next: the
    pass that applies a new object's RayCluster is a short head start on KubeRay's work
    of seconds, so one pass time behind a release costs it little, while a release
    behind every first pass of a burst of creates waited for all of them. The pass
    that follows a first pass which created the KubeRay object (it plans the slices and
    writes status; no pod exists yet, KubeRay makes them seconds later) comes after the
    first passes, so a burst of creates gets its KubeRay objects before any of them is
    planned, and before the re-passes, so a new object's status and its place in its
    shape's queue do not wait behind the objects in flight. Re-passes, kicked by
    everything else, come last."""

    RELEASE = 0
    FIRST = 1
    FOLLOW_UP = 2
    AGAIN = 3


def lane_of(first: bool, releasing: bool, follow_up: bool = False) -> Lane:
    """The lane of a pass: releasing first, then an object's first pass, then the
    follow-up of a first pass, then the rest."""
    if releasing:
        return Lane.RELEASE
    if follow_up:
        return Lane.FOLLOW_UP
    return Lane.FIRST if first else Lane.AGAIN


@dataclass
class PassSlots:
    """At most ``size`` passes at once; when a slot frees, it goes to the waiter of the
    lowest ``Lane`` (release, first, follow-up, again), each lane in the order it came. A
    slot is handed from the pass that ends to the one that waits, so a pass arriving
    meanwhile cannot jump the lanes. A waiting pass whose object gets a release kick moves
    to the release lane (``promote``).

    While a first pass runs, no follow-up starts (a slot may stay free, or go to a
    re-pass): the passes share one event loop, and a first pass that creates a KubeRay
    object is a millisecond of the loop between two API round trips, while its follow-up
    takes the loop for many (it classifies every pool of its shape); in a burst of
    creates, a first pass whose answer came back waited for every follow-up that had
    started meanwhile. Re-passes are not held: a first pass may be a whole one (at
    start-up, every object's), and re-passes of objects in flight must not wait for it."""

    size: int = PASS_SLOTS
    _busy: int = 0
    _release: deque[tuple[ObjectKey, asyncio.Future[Lane]]] = field(default_factory=deque)
    _first: deque[tuple[ObjectKey, asyncio.Future[Lane]]] = field(default_factory=deque)
    _follow_up: deque[tuple[ObjectKey, asyncio.Future[Lane]]] = field(default_factory=deque)
    _again: deque[tuple[ObjectKey, asyncio.Future[Lane]]] = field(default_factory=deque)
    _passed: set[ObjectKey] = field(default_factory=set)
    #: the objects whose first pass holds a slot now (they hold back the follow-up lane)
    _first_running: set[ObjectKey] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("PassSlots needs at least one slot")

    def _lanes(self) -> tuple[deque[tuple[ObjectKey, asyncio.Future[Lane]]], ...]:
        return self._release, self._first, self._follow_up, self._again

    @property
    def waiting(self) -> int:
        return sum(not f.done() for lane in self._lanes() for _, f in lane)

    async def acquire(
        self, key: ObjectKey, releasing: bool = False, follow_up: bool = False
    ) -> None:
        """Wait for a slot for ``key``'s pass (give it back with ``release(key)``); a
        ``releasing`` pass waits in the release lane, a ``follow_up`` in its own."""
        first = key not in self._passed
        self._passed.add(key)
        entry = (key, asyncio.get_running_loop().create_future())
        self._lanes()[lane_of(first, releasing, follow_up)].append(entry)
        self._hand_out()
        try:
            await entry[1]
        except asyncio.CancelledError:
            turn = entry[1]
            if turn.done() and not turn.cancelled():
                self.release(key)  # the slot was handed over as the waiter was cancelled
            else:
                for lane in self._lanes():
                    if entry in lane:
                        lane.remove(entry)
            raise

    def _hand_out(self) -> None:
        """Free slots to the waiters, lowest lane first; none to the follow-up lane while a
        first pass runs."""
        for lane, waiters in zip(Lane, self._lanes(), strict=True):
            if lane is Lane.FOLLOW_UP and self._first_running:
                continue
            while waiters and self._busy < self.size:
                key, turn = waiters.popleft()
                if turn.done():
                    continue
                self._busy += 1
                if lane is Lane.FIRST:
                    self._first_running.add(key)
                turn.set_result(lane)
            if self._busy >= self.size:
                return

    def promote(self, key: ObjectKey) -> None:
        """``key``'s pass, if it waits in a later lane, moves to the end of the release
        lane (its object got a release kick while it waited)."""
        for lane in (self._first, self._follow_up, self._again):
            for entry in lane:
                if entry[0] == key and not entry[1].done():
                    lane.remove(entry)
                    self._release.append(entry)
                    self._hand_out()  # a held follow-up may find a free slot there
                    return

    def release(self, key: ObjectKey) -> None:
        """``key``'s pass ended: its slot goes to the next waiter, release lane first."""
        self._busy -= 1
        self._first_running.discard(key)
        self._hand_out()

    def forget(self, key: ObjectKey) -> None:
        """The object is gone: one of that name made later has its first pass ahead."""
        self._passed.discard(key)


@dataclass
class KickQueue:
    """Runs ``run(key)`` for kicked clusters: one pass at a time per cluster, kicks during
    a pass folded into one more."""

    run: Callable[[ObjectKey], Awaitable[None]]
    #: shared by the kinds' queues: the bound is on passes of every kind together
    slots: PassSlots = field(default_factory=PassSlots)
    _running: set[ObjectKey] = field(default_factory=set)
    _dirty: set[ObjectKey] = field(default_factory=set)
    _later: dict[ObjectKey, asyncio.TimerHandle] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    # Keys with a spawned pass that has not started yet: another kick_soon for them is
    # folded into it (that pass reads the stores when it starts, after this kick's cause).
    _queued: set[ObjectKey] = field(default_factory=set)
    # Kicks held back until every store is listed (see ``hold_until_indexed``).
    _held: set[ObjectKey] | None = None
    # Keys with a release kick (``kick(releasing=True)``) that no started pass has read
    # yet: their next pass waits in the release lane.
    _releasing: set[ObjectKey] = field(default_factory=set)
    # Keys whose next pass is the follow-up of a first pass (``follow_up``).
    _following: set[ObjectKey] = field(default_factory=set)

    def hold_until_indexed(self) -> None:
        """Hold kicks until ``indexed``: the listing of one kind kicks objects whose
        reservations or pods another kind's listing has not delivered yet."""
        if self._held is None:
            self._held = set()

    def indexed(self) -> None:
        """Every kind is listed: run what was held, each object once."""
        held, self._held = self._held, None
        if held:
            self.kick_soon(held)

    async def kick(self, key: ObjectKey, releasing: bool = False) -> None:
        """Run ``key``'s pass now, or once more after the pass already running.
        ``releasing``: the kick's cause may let the pass release a slice (its pass goes
        in the release lane of ``PassSlots``, and one already waiting moves there)."""
        if releasing:
            self._mark_releasing(key)
        if self._held is not None:
            self._held.add(key)
            return
        if key in self._running:
            self._dirty.add(key)
            return
        self._running.add(key)
        try:
            while True:
                await self.slots.acquire(
                    key, releasing=key in self._releasing, follow_up=key in self._following
                )
                try:
                    # kicks while the pass waited for its slot are folded into it: it
                    # reads the stores when it starts
                    self._dirty.discard(key)
                    self._releasing.discard(key)
                    self._following.discard(key)
                    await self.run(key)
                finally:
                    self.slots.release(key)
                if key not in self._dirty:
                    return
        finally:
            self._running.discard(key)

    def follow_up(self, key: ObjectKey) -> None:
        """One more pass for ``key`` at once, in the follow-up lane (``Lane.FOLLOW_UP``):
        called by a first pass that created the object's KubeRay object and left the rest
        to this pass. During ``key``'s own pass it is the pass after it, in the same
        task (the pass that asked is still running, so its kick loop runs it)."""
        self._following.add(key)
        if key in self._running and self._held is None:
            self._dirty.add(key)
        else:
            self.kick_soon((key,))

    def _mark_releasing(self, key: ObjectKey) -> None:
        """``key``'s next pass waits in the release lane, and one already waiting for a
        slot moves there."""
        self._releasing.add(key)
        self.slots.promote(key)

    def kick_soon(self, keys: Iterable[ObjectKey], releasing: bool = False) -> None:
        """Kick clusters without making the caller wait for their passes. A key whose
        spawned pass has not started yet gets no second one: at start-up every cluster is
        kicked by its own listing, by the held kicks and by its reservations', and each
        extra pass ran the whole pass again, one after another on the loop (a release
        kick still marks it, so that pass waits in the release lane)."""
        for key in keys:
            if releasing:
                self._mark_releasing(key)
            if key in self._queued:
                continue
            self._queued.add(key)
            self._spawn(self._kick_queued(key))

    async def _kick_queued(self, key: ObjectKey) -> None:
        self._queued.discard(key)
        await self.kick(key)

    def kick_later(self, key: ObjectKey, delay: float) -> None:
        """One more pass after ``delay``: at most one such pass pending per cluster, at
        the earliest time asked for (a sooner one replaces a later one; that pass asks
        again for what it still waits for, as every pass decides from scratch)."""
        loop = asyncio.get_running_loop()
        current = self._later.get(key)
        if current is not None:
            if current.when() <= loop.time() + delay:
                return
            current.cancel()
        self._later[key] = loop.call_later(delay, self._fire_later, key)

    def _fire_later(self, key: ObjectKey) -> None:
        self._later.pop(key, None)
        self.kick_soon((key,))

    def pending_later(self, key: ObjectKey) -> bool:
        return key in self._later

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for every spawned and every pending later pass (tests)."""
        while self._tasks or self._later:
            if self._tasks:
                await asyncio.gather(*list(self._tasks))
            else:
                await asyncio.sleep(0.005)
