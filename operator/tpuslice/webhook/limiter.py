"""How often the identity webhook repeats one warning: a small limiter keyed by cause.

A RayCluster of 64 hosts creates 64 pods from one template, so one wrong env
value in that template is the same warning 64 times, and again on every
recreation. ``CauseLimiter`` lets the first ``per_window`` of a cause through in
each window and counts the rest, so the next one emitted can say how many were
held back. Pure apart from the clock, which is injected (tests turn it by hand)
and a lock (the server answers in several threads).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

__all__ = ["OVERFLOW_CAUSE", "CauseLimiter"]

#: The one cause every new cause is counted under while ``max_causes`` are being tracked.
OVERFLOW_CAUSE = ("overflow",)


@dataclass
class _Window:
    start: float
    emitted: int = 0
    suppressed: int = 0


class CauseLimiter:
    """At most ``per_window`` emissions of each cause per ``window_seconds``.

    Memory is bounded by ``max_causes``: when it is reached, causes whose window
    has ended are forgotten; when that is not enough, further new causes share
    ``OVERFLOW_CAUSE``, so even a stream of distinct causes emits at most
    ``(max_causes + 1) * per_window`` times per window.
    """

    def __init__(
        self,
        *,
        window_seconds: float = 60.0,
        per_window: int = 1,
        max_causes: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_seconds <= 0 or per_window < 1 or max_causes < 1:
            raise ValueError(
                "CauseLimiter needs window_seconds > 0, per_window >= 1 and max_causes >= 1"
            )
        self.window_seconds = window_seconds
        self.per_window = per_window
        self.max_causes = max_causes
        self._clock = clock
        self._windows: dict[Hashable, _Window] = {}
        self._lock = threading.Lock()

    def admit(self, cause: Hashable) -> int | None:
        """None: hold this one back. Otherwise emit it; the int is how many of the same
        cause were held back since the last one emitted (0 when none were)."""
        now = self._clock()
        with self._lock:
            key = self._tracked(cause, now)
            window = self._windows.get(key)
            held = 0
            if window is None or now - window.start >= self.window_seconds:
                held = window.suppressed if window is not None else 0
                window = _Window(start=now)
                self._windows.pop(key, None)
                self._windows[key] = window  # re-inserted: the dict stays oldest-first
            if window.emitted >= self.per_window:
                window.suppressed += 1
                return None
            window.emitted += 1
            return held

    def _tracked(self, cause: Hashable, now: float) -> Hashable:
        """``cause``, or ``OVERFLOW_CAUSE`` when no room is left for a new one."""
        if cause in self._windows or len(self._windows) < self.max_causes:
            return cause
        # An ended window's held-back count is reported only if its cause recurs;
        # forgetting it here loses that sentence, never a refusal or a patch.
        for key in [k for k, w in self._windows.items() if now - w.start >= self.window_seconds]:
            del self._windows[key]
        return cause if len(self._windows) < self.max_causes else OVERFLOW_CAUSE

    def __len__(self) -> int:
        with self._lock:
            return len(self._windows)
