"""kopf's "indexes are filled" gate without its quadratic wake-ups (issue 17's restart).

kopf holds every object's handlers until every object of every indexed kind has
been indexed: one ``ToggleSet(all)`` with a toggle per object. Each object's
worker indexes its object, drops its toggle and then waits on the set's
``asyncio.Condition`` for the whole set to be on. kopf 1.45's ``make_toggle``,
``drop_toggle`` and ``drop_toggles`` ``notify_all`` on every call, so each of
N toggles dropped wakes every worker already waiting, which takes the lock,
finds the set still off and sleeps again: ~N²/2 wake-ups on the event loop
that also runs our passes. Measured in kopf's own watcher, worker and
processor with our handlers: the gate opened 24.4 s after the listing of 1,000
TPUSliceClusters and 1,000 SliceReservations, 0.44 s at 100 of each
(kopf/_cogs/aiokits/aiotoggles.py, kopf/_core/reactor/queueing.py,
processing.py).

The fix keeps kopf's semantics: a waiter only ever waits for the set's state
(``wait_for``), and that state changes through the set (adding or dropping a
toggle: notified here only when the state flips) or through a child toggle's
``turn_to`` (which notifies the same condition itself, unchanged). So every
waiter still wakes whenever its predicate may have become true. ``is_on`` is
cheap where it matters: ``all`` stops at the first toggle that is off.

Applied only to the kopf versions it was read against (``KNOWN_VERSIONS``):
with another version the operator runs kopf unchanged (a slower restart, never a
wrong one) and logs so; the unit test fails first, to have someone read the new
version's source.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Iterable
from typing import Any

__all__ = ["KNOWN_VERSIONS", "fold_index_gate_wakeups"]

log = logging.getLogger(__name__)

#: kopf versions whose ``ToggleSet`` this module was checked against.
KNOWN_VERSIONS = ("1.45.",)

_MARK = "_tpuslice_folded_wakeups"


def fold_index_gate_wakeups() -> bool:
    """Make kopf's ``ToggleSet`` notify its waiters only when its state flips. Idempotent;
    False (kopf left as it is) for a kopf version not in ``KNOWN_VERSIONS``."""
    from kopf._cogs.aiokits import aiotoggles  # a private module: hence the version check

    toggle_set: Any = aiotoggles.ToggleSet
    if getattr(toggle_set, _MARK, False):
        return True
    version = importlib.metadata.version("kopf")
    if not version.startswith(KNOWN_VERSIONS):
        log.warning(
            "kopf %s: its index gate is left as it is (checked for %s); a restart over "
            "many objects may take longer",
            version,
            ", ".join(f"{v}x" for v in KNOWN_VERSIONS),
        )
        return False

    async def make_toggle(self: Any, __val: bool = False, *, name: str | None = None) -> Any:
        toggle = aiotoggles.Toggle(__val, name=name, condition=self._condition)
        async with self._condition:
            was = self.is_on()
            self._toggles.add(toggle)
            if self.is_on() != was:
                self._condition.notify_all()
        return toggle

    async def drop_toggle(self: Any, toggle: Any) -> None:
        async with self._condition:
            was = self.is_on()
            self._toggles.discard(toggle)
            if self.is_on() != was:
                self._condition.notify_all()

    async def drop_toggles(self: Any, toggles: Iterable[Any]) -> None:
        async with self._condition:
            was = self.is_on()
            self._toggles.difference_update(toggles)
            if self.is_on() != was:
                self._condition.notify_all()

    toggle_set.make_toggle = make_toggle
    toggle_set.drop_toggle = drop_toggle
    toggle_set.drop_toggles = drop_toggles
    setattr(toggle_set, _MARK, True)
    return True
