"""kopf's index gate with wake-ups only when its state flips (tpuslice.runtime.kopfgate)."""

from __future__ import annotations

import asyncio

from kopf._cogs.aiokits import aiotoggles

from tpuslice.runtime.kopfgate import fold_index_gate_wakeups


def test_the_installed_kopf_is_one_the_fold_was_checked_against() -> None:
    """A kopf upgrade fails here first: read its aiotoggles.py and processing.py, then
    add the version to KNOWN_VERSIONS (or drop the module if kopf fixed it)."""
    assert fold_index_gate_wakeups()
    assert fold_index_gate_wakeups()  # idempotent


def _gate_run(objects: int) -> tuple[int, list[int]]:
    """kopf's use of the gate: a toggle per object; each object's worker drops its own once
    indexed and waits for the whole set (``ToggleSet.wait_for``). Objects are indexed one
    after another with the loop turning in between, as kopf's index handlers run in its
    thread pool. Returns how often the waiters' predicate ran in all, and how many
    toggles were left when each waiter woke for good."""
    checks = 0
    woke_with: list[int] = []

    async def scenario() -> None:
        gate = aiotoggles.ToggleSet(all)
        toggles = [await gate.make_toggle(name=str(i)) for i in range(objects)]

        def whole_set_on() -> bool:  # ToggleSet.wait_for(True)'s predicate, counted
            nonlocal checks
            checks += 1
            return gate.is_on()

        async def worker(toggle: aiotoggles.Toggle) -> None:
            await indexed[toggle.name].wait()
            await gate.drop_toggle(toggle)
            async with gate._condition:
                await gate._condition.wait_for(whole_set_on)
            woke_with.append(len(gate))

        indexed = {t.name: asyncio.Event() for t in toggles}
        workers = [asyncio.create_task(worker(t)) for t in toggles]
        for toggle in toggles:  # kopf indexes the objects one by one
            indexed[toggle.name].set()
            for _ in range(3):
                await asyncio.sleep(0)
        await asyncio.gather(*workers)

    asyncio.run(scenario())
    return checks, woke_with


def test_every_waiter_wakes_once_the_last_toggle_is_dropped() -> None:
    fold_index_gate_wakeups()
    checks, woke_with = _gate_run(300)
    assert woke_with == [0] * 300  # all woke, and only once the set was empty
    # each waiter's predicate runs about twice, not once per toggle dropped after it
    # (kopf 1.45 as shipped: one check per waiter per drop, ~45,000 for 300 objects)
    assert checks < 5 * 300, checks


def test_a_child_toggle_turned_on_still_wakes_the_waiters() -> None:
    """The set's state also changes through a child's turn_to, which notifies the shared
    condition itself: the fold must not lose those wake-ups."""
    fold_index_gate_wakeups()

    async def scenario() -> bool:
        gate = aiotoggles.ToggleSet(all)
        child = await gate.make_toggle(False, name="child")
        waiter = asyncio.create_task(gate.wait_for(True))
        await asyncio.sleep(0)
        assert not waiter.done()
        await child.turn_to(True)
        await asyncio.wait_for(waiter, 1)
        added = await gate.make_toggle(False, name="late")  # the set turns off again
        off = asyncio.create_task(gate.wait_for(False))
        await asyncio.wait_for(off, 1)
        await gate.drop_toggle(added)
        return gate.is_on()

    assert asyncio.run(scenario())
