"""The kick queue (coalescing, holding until indexed) and the backoff, on their own."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tpuslice.controller.queue import (
    Backoff,
    KickQueue,
    Lane,
    PassSlots,
    backoff_seconds,
    lane_of,
)

KEY = ("TPUSliceCluster", "ml", "llm")


def test_backoff_doubles_from_5s_and_is_capped_at_5_minutes() -> None:
    assert [backoff_seconds(n) for n in range(1, 9)] == [5, 10, 20, 40, 80, 160, 300, 300]
    assert backoff_seconds(10_000) == 300


def test_a_failing_cluster_waits_unless_its_generation_changed_and_success_forgets() -> None:
    backoff = Backoff()
    assert backoff.wait(KEY, 1, now=100.0) == 0  # never failed
    first = backoff.failed(KEY, 1, "boom", now=100.0)
    assert (first.count, first.delay, first.new_error, first.event_due) == (1, 5, True, True)
    assert backoff.wait(KEY, 1, now=102.0) == 3.0
    assert backoff.wait(KEY, 2, now=102.0) == 0  # the user changed the spec: try at once
    assert backoff.wait(KEY, 1, now=106.0) == 0  # the wait is over
    backoff.event_posted(KEY, now=100.0)
    second = backoff.failed(KEY, 1, "boom", now=106.0)
    assert (second.count, second.delay, second.new_error) == (2, 10, False)
    assert not second.event_due  # one Warning per FAILURE_EVENT_SECONDS
    third = backoff.failed(KEY, 1, "other", now=500.0)
    assert third.new_error and third.event_due
    backoff.succeeded(KEY)
    assert backoff.failing(KEY) is None and backoff.wait(KEY, 1, now=500.0) == 0


def test_an_event_not_posted_is_still_due_on_the_next_failure() -> None:
    backoff = Backoff()
    assert backoff.failed(KEY, 1, "boom", now=0.0).event_due
    # (the status write failed, so the event was never posted)
    assert backoff.failed(KEY, 1, "boom", now=5.0).event_due


def test_kicks_during_a_pass_fold_into_one_more_pass() -> None:
    runs: list[int] = []

    async def scenario() -> None:
        gate = asyncio.Event()

        async def run(key: tuple[str, str, str]) -> None:
            runs.append(len(runs))
            if len(runs) == 1:
                await gate.wait()

        queue = KickQueue(run)
        first = asyncio.create_task(queue.kick(KEY))
        await asyncio.sleep(0)
        for _ in range(10):
            await queue.kick(KEY)  # returns at once: the pass is running
        gate.set()
        await first

    asyncio.run(scenario())
    assert runs == [0, 1]


def test_kicks_are_held_until_indexed_then_run_once_each() -> None:
    runs: list[tuple[str, str, str]] = []

    async def scenario() -> None:
        async def run(key: tuple[str, str, str]) -> None:
            runs.append(key)

        queue = KickQueue(run)
        queue.hold_until_indexed()
        await queue.kick(KEY)
        await queue.kick(KEY)
        await queue.kick(("TPUSliceCluster", "ml", "other"))
        assert runs == []
        queue.indexed()
        await queue.drain()
        queue.indexed()  # later calls are no-ops
        await queue.drain()

    asyncio.run(scenario())
    assert sorted(runs) == [("TPUSliceCluster", "ml", "llm"), ("TPUSliceCluster", "ml", "other")]


def test_kick_later_keeps_at_most_one_pending_pass() -> None:
    runs: list[tuple[str, str, str]] = []

    async def scenario() -> None:
        async def run(key: tuple[str, str, str]) -> None:
            runs.append(key)

        queue = KickQueue(run)
        queue.kick_later(KEY, 0.01)
        queue.kick_later(KEY, 0.01)
        assert queue.pending_later(KEY)
        await queue.drain()
        assert not queue.pending_later(KEY)

    asyncio.run(scenario())
    assert runs == [KEY]


def test_a_sooner_kick_later_replaces_a_later_one() -> None:
    """A status held back for 0.05 s is not kept waiting by a retry pass set for 60 s."""
    runs: list[float] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def run(key: tuple[str, str, str]) -> None:
            runs.append(loop.time() - start)

        queue = KickQueue(run)
        queue.kick_later(KEY, 60.0)
        queue.kick_later(KEY, 0.05)
        queue.kick_later(KEY, 30.0)  # later than the pending one: no change
        await queue.drain()

    asyncio.run(scenario())
    assert len(runs) == 1 and runs[0] < 5.0


def test_kicks_soon_before_the_pass_starts_fold_into_that_pass() -> None:
    """At start-up a cluster is kicked by its listing, the held kicks and its reservations
    before its pass starts: one pass, not one per kick; a kick after it started still gets
    one more."""
    runs: list[tuple[str, str, str]] = []

    async def scenario() -> None:
        started, gate = asyncio.Event(), asyncio.Event()

        async def run(key: tuple[str, str, str]) -> None:
            runs.append(key)
            if key == KEY and not gate.is_set():
                started.set()
                await gate.wait()

        queue = KickQueue(run)
        other = ("TPUSliceCluster", "ml", "other")
        queue.kick_soon([KEY, other])
        queue.kick_soon([KEY])
        queue.kick_soon([KEY, other])
        await started.wait()
        assert sorted(runs) == [KEY, other]  # one pass each so far
        queue.kick_soon([KEY])  # KEY's pass is running: one more after it
        gate.set()
        await queue.drain()

    asyncio.run(scenario())
    assert sorted(runs) == [KEY, KEY, ("TPUSliceCluster", "ml", "other")]


def _key(name: str) -> tuple[str, str, str]:
    return ("TPUSliceCluster", "ml", name)


def test_a_first_pass_goes_ahead_of_waiting_re_passes() -> None:
    """With every slot taken, an object that never had a pass is served before objects
    kicked again by their pods' events, even those that asked first."""
    runs: list[str] = []

    async def scenario() -> None:
        hold = asyncio.Event()

        async def run(key: tuple[str, str, str]) -> None:
            runs.append(key[2])
            if key[2] == "busy":
                await hold.wait()

        queue = KickQueue(run, PassSlots(1))
        await queue.kick(_key("old-a"))
        await queue.kick(_key("old-b"))
        busy = asyncio.create_task(queue.kick(_key("busy")))
        await asyncio.sleep(0)
        queue.kick_soon([_key("old-a"), _key("old-b")])  # re-passes, asked first
        queue.kick_soon([_key("new")])  # a first pass
        for _ in range(3):
            await asyncio.sleep(0)
        assert runs == ["old-a", "old-b", "busy"]  # everyone waits for the one slot
        hold.set()
        await busy
        await queue.drain()

    asyncio.run(scenario())
    assert runs == ["old-a", "old-b", "busy", "new", "old-a", "old-b"]


def test_no_more_passes_run_at_once_than_there_are_slots() -> None:
    running: list[int] = [0]
    most: list[int] = [0]

    async def scenario() -> None:
        async def run(key: tuple[str, str, str]) -> None:
            running[0] += 1
            most[0] = max(most[0], running[0])
            for _ in range(3):
                await asyncio.sleep(0)
            running[0] -= 1

        slots = PassSlots(2)
        kinds = [KickQueue(run, slots), KickQueue(run, slots)]  # two kinds, one bound
        for i in range(6):
            kinds[i % 2].kick_soon([_key(f"c{i}")])
        for queue in kinds:
            await queue.drain()
        assert slots.waiting == 0

    asyncio.run(scenario())
    assert most == [2]


def test_a_waiter_cancelled_after_its_slot_was_handed_over_gives_the_slot_back() -> None:
    async def scenario() -> None:
        slots = PassSlots(1)
        await slots.acquire(_key("a"))
        waiter = asyncio.create_task(slots.acquire(_key("b")))
        await asyncio.sleep(0)
        slots.release(_key("a"))  # handed to b's waiter ...
        waiter.cancel()  # ... which is cancelled before it runs
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        await asyncio.wait_for(slots.acquire(_key("c")), timeout=1)  # the slot is free

        cancelled = asyncio.create_task(slots.acquire(_key("d")))  # waits behind c
        await asyncio.sleep(0)
        cancelled.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await cancelled
        assert slots.waiting == 0
        slots.release(_key("c"))
        await asyncio.wait_for(slots.acquire(_key("e")), timeout=1)

    asyncio.run(scenario())


def test_a_forgotten_object_has_its_first_pass_ahead_again() -> None:
    runs: list[str] = []

    async def scenario() -> None:
        hold = asyncio.Event()

        async def run(key: tuple[str, str, str]) -> None:
            runs.append(key[2])
            if key[2] == "busy":
                await hold.wait()

        slots = PassSlots(1)
        queue = KickQueue(run, slots)
        await queue.kick(_key("old"))
        await queue.kick(_key("again"))
        slots.forget(_key("again"))  # deleted, and made again under that name
        busy = asyncio.create_task(queue.kick(_key("busy")))
        await asyncio.sleep(0)
        queue.kick_soon([_key("old"), _key("again")])
        for _ in range(3):
            await asyncio.sleep(0)
        hold.set()
        await busy
        await queue.drain()

    asyncio.run(scenario())
    assert runs == ["old", "again", "busy", "again", "old"]


def test_lanes_release_then_first_then_again() -> None:
    assert [lane_of(first, releasing) for first, releasing in FIRST_RELEASING] == [
        Lane.RELEASE,
        Lane.RELEASE,
        Lane.FIRST,
        Lane.AGAIN,
    ]


FIRST_RELEASING = [(True, True), (False, True), (True, False), (False, False)]


def test_a_release_pass_goes_ahead_of_first_passes_and_re_passes() -> None:
    """With every slot taken, the pass kicked by a pod that completed a slice takes the
    freed slot before a first pass and before re-passes that asked earlier."""
    runs: list[str] = []

    async def scenario() -> None:
        hold = asyncio.Event()

        async def run(key: tuple[str, str, str]) -> None:
            runs.append(key[2])
            if key[2] == "busy":
                await hold.wait()

        queue = KickQueue(run, PassSlots(1))
        for name in ("old", "whole"):
            await queue.kick(_key(name))
        busy = asyncio.create_task(queue.kick(_key("busy")))
        await asyncio.sleep(0)
        queue.kick_soon([_key("old")])  # a re-pass, asked first
        queue.kick_soon([_key("new")])  # a first pass
        queue.kick_soon([_key("whole")], releasing=True)  # its slice is whole
        for _ in range(3):
            await asyncio.sleep(0)
        hold.set()
        await busy
        await queue.drain()

    asyncio.run(scenario())
    assert runs == ["old", "whole", "busy", "whole", "new", "old"]


@pytest.mark.parametrize("awaited", [False, True], ids=["kick_soon", "kick"])
def test_a_waiting_re_pass_moves_up_when_a_release_kick_comes(awaited: bool) -> None:
    """The object's pass already waits in the re-pass lane when its slice completes: it
    moves to the release lane (one pass, not a second one), whichever way it is kicked."""
    runs: list[str] = []

    async def scenario() -> None:
        hold = asyncio.Event()

        async def run(key: tuple[str, str, str]) -> None:
            runs.append(key[2])
            if key[2] == "busy":
                await hold.wait()

        queue = KickQueue(run, PassSlots(1))
        for name in ("a", "b"):
            await queue.kick(_key(name))
        busy = asyncio.create_task(queue.kick(_key("busy")))
        await asyncio.sleep(0)
        queue.kick_soon([_key("a"), _key("b")])
        for _ in range(3):
            await asyncio.sleep(0)  # both wait in the re-pass lane
        if awaited:
            await queue.kick(_key("b"), releasing=True)  # b's pass is running: folded
        else:
            queue.kick_soon([_key("b")], releasing=True)
        await asyncio.sleep(0)
        hold.set()
        await busy
        await queue.drain()

    asyncio.run(scenario())
    assert runs == ["a", "b", "busy", "b", "a"]


def test_a_release_kick_during_a_pass_makes_the_next_pass_a_release_pass() -> None:
    """The kick comes while the object's pass runs: the pass after it waits in the
    release lane, ahead of a re-pass that waited longer."""
    runs: list[str] = []

    async def scenario() -> None:
        gate = asyncio.Event()
        hold = asyncio.Event()

        async def run(key: tuple[str, str, str]) -> None:
            runs.append(key[2])
            if key[2] == "busy":
                await hold.wait()
            if key[2] == "x" and runs.count("x") == 2:  # its first pass after start-up
                await gate.wait()

        queue = KickQueue(run, PassSlots(2))
        for name in ("old", "x"):
            await queue.kick(_key(name))
        busy = asyncio.create_task(queue.kick(_key("busy")))
        x = asyncio.create_task(queue.kick(_key("x")))
        await asyncio.sleep(0)  # both slots taken: busy's and x's
        queue.kick_soon([_key("old")])  # a re-pass
        queue.kick_soon([_key("new")])  # a first pass
        queue.kick_soon([_key("x")], releasing=True)  # during x's pass: one more
        for _ in range(3):
            await asyncio.sleep(0)
        gate.set()  # x's slot goes to the first pass; x's next waits in the release lane
        await x
        hold.set()
        await busy
        await queue.drain()

    asyncio.run(scenario())
    assert runs[2:] == ["busy", "x", "new", "x", "old"]


def test_a_follow_up_waits_behind_first_passes_and_ahead_of_re_passes() -> None:
    """The pass after a first pass that created a KubeRay object: a burst of creates gets
    its KubeRay objects first, and the new objects are planned before the re-passes."""
    runs: list[str] = []

    async def scenario() -> None:
        hold = asyncio.Event()

        async def run(key: tuple[str, str, str]) -> None:
            runs.append(key[2])
            if key[2] == "busy":
                await hold.wait()

        queue = KickQueue(run, PassSlots(1))
        for name in ("old", "x"):
            await queue.kick(_key(name))
        busy = asyncio.create_task(queue.kick(_key("busy")))
        await asyncio.sleep(0)
        queue.kick_soon([_key("old")])  # a re-pass, asked first
        queue.follow_up(_key("x"))  # x's first pass created its KubeRay object
        queue.kick_soon([_key("new")])  # a first pass, asked last
        for _ in range(3):
            await asyncio.sleep(0)
        hold.set()
        await busy
        await queue.drain()

    asyncio.run(scenario())
    assert runs == ["old", "x", "busy", "new", "x", "old"]
    assert lane_of(first=False, releasing=False, follow_up=True) is Lane.FOLLOW_UP


def test_a_follow_up_asked_during_the_pass_runs_right_after_it() -> None:
    runs: list[str] = []

    async def scenario() -> None:
        queue: KickQueue

        async def run(key: tuple[str, str, str]) -> None:
            runs.append(key[2])
            if len(runs) == 1:
                queue.follow_up(key)

        queue = KickQueue(run, PassSlots(1))
        await queue.kick(_key("x"))  # the follow-up runs in the same kick

    asyncio.run(scenario())
    assert runs == ["x", "x"]


def test_no_follow_up_starts_while_a_first_pass_runs() -> None:
    """A free slot stays free for a follow-up while a first pass runs (a re-pass takes
    it); the follow-up starts once no first pass runs."""
    runs: list[str] = []

    async def scenario() -> None:
        hold = asyncio.Event()

        async def run(key: tuple[str, str, str]) -> None:
            runs.append(key[2])
            if key[2] == "new":
                await hold.wait()

        queue = KickQueue(run, PassSlots(4))
        for name in ("x", "old"):
            await queue.kick(_key(name))
        new = asyncio.create_task(queue.kick(_key("new")))  # a first pass, held open
        await asyncio.sleep(0)
        queue.follow_up(_key("x"))
        queue.kick_soon([_key("old")])
        for _ in range(5):
            await asyncio.sleep(0)
        assert runs[2:] == ["new", "old"]  # x's follow-up waits with slots free
        hold.set()
        await new
        await queue.drain()

    asyncio.run(scenario())
    assert runs[2:] == ["new", "old", "x"]


def test_a_held_follow_up_promoted_to_the_release_lane_starts_at_once() -> None:
    runs: list[str] = []

    async def scenario() -> None:
        hold = asyncio.Event()

        async def run(key: tuple[str, str, str]) -> None:
            runs.append(key[2])
            if key[2] == "new":
                await hold.wait()

        queue = KickQueue(run, PassSlots(4))
        await queue.kick(_key("x"))
        new = asyncio.create_task(queue.kick(_key("new")))
        await asyncio.sleep(0)
        queue.follow_up(_key("x"))
        for _ in range(3):
            await asyncio.sleep(0)
        queue.kick_soon([_key("x")], releasing=True)  # its slice completed
        for _ in range(3):
            await asyncio.sleep(0)
        assert runs[:3] == ["x", "new", "x"]  # while the first pass still runs
        hold.set()
        await new
        await queue.drain()

    asyncio.run(scenario())
