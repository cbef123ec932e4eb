"""The kick queue (coalescing, holding until indexed) and the backoff, on their own."""

from __future__ import annotations

import asyncio

from tpuslice.controller.queue import Backoff, KickQueue, backoff_seconds

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
