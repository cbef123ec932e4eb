"""The status writer: a TPUSlice object's status, written only when it changed.

``status.py`` (``job_status.py``, ``service_status.py``) computes the status
(pure); this part decides whether to send it (one writer per kind). A status
equal to what we last wrote, or to what the object shows, is not written. A
change that flips no condition and keeps observedGeneration (``status.may_fold``:
slice states, counts, messages, and ``SlicesReserved`` turning True) is held
until the status has been quiet for ``fold_quiet_seconds``, at most
``fold_max_seconds`` after the first held change, and written then (a pass is
asked for at that time): a slice goes Reserved -> Scheduled -> Ready within a
second, and writing each step would cost a status patch per step on the way to
Ready. A flipped condition or a new generation is written at once, with
whatever was held. Events are posted on transitions (slice states, Stalled,
Ready, Complete), once, with the write that made them true (a state held and
passed within the fold posts no event).

Where thousands of objects come up at once, a slice's steps lie tens of seconds
apart (the scheduler and the kubelets are busy), so the fold above writes each
step on its own. ``--status-batch-seconds`` (``fold_windows``) trades how soon
progress shows for fewer writes, as kube-controller-manager's
``--endpointslice-updates-batch-period`` does for EndpointSlices: a change that
flips no condition is written that long after the first one held, with every
change that came after it; conditions are written at once either way.
The times held are memory only: a restart writes at its first pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tpuslice.controller.recorder import Recorder
from tpuslice.model import constants as c
from tpuslice.model import events
from tpuslice.model.records import ClusterRef, ObjectKey, SliceStatus
from tpuslice.runtime.kube import ClusterApi
from tpuslice.status.conditions import (
    KUEUE_ADMITTED,
    failure_status,
    may_fold,
    removal_events,
    slice_events,
)

__all__ = [
    "FOLD_MAX_SECONDS",
    "FOLD_QUIET_SECONDS",
    "StatusWriter",
    "fold_windows",
    "generation",
]

#: A foldable status change is written once the status stayed the same this long...
FOLD_QUIET_SECONDS = 0.5
#: ... and at most this long after the first change held.
FOLD_MAX_SECONDS = 2.0


def fold_windows(batch_seconds: float) -> tuple[float, float]:
    """(quiet, at most) of the fold for a ``--status-batch-seconds`` setting: 0 is the
    fold of a moment (``FOLD_QUIET_SECONDS``, ``FOLD_MAX_SECONDS``); a batch of N seconds
    writes N seconds after the first change held, however many came after it (a quiet
    window shorter than the batch would write each step that lies further apart)."""
    if batch_seconds <= 0:
        return FOLD_QUIET_SECONDS, FOLD_MAX_SECONDS
    return float(batch_seconds), float(batch_seconds)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def generation(cluster: Mapping[str, Any] | None) -> int:
    try:
        return int(((cluster or {}).get("metadata") or {}).get("generation") or 0)
    except (TypeError, ValueError):
        return 0


def _condition(stanza: Mapping[str, Any], kind: str) -> tuple[str, str]:
    for cond in stanza.get("conditions") or []:
        if cond.get("type") == kind:
            return cond.get("status", ""), cond.get("reason", "")
    return "", ""


@dataclass
class StatusWriter:
    kube: ClusterApi
    recorder: Recorder
    #: Asks for one more pass after a delay (a foldable write held back).
    kick_later: Callable[[ObjectKey, float], None]
    fold_quiet_seconds: float = FOLD_QUIET_SECONDS
    fold_max_seconds: float = FOLD_MAX_SECONDS
    kind: str = c.KIND_CLUSTER  # of the objects this writer writes
    #: The monotonic clock the fold's windows are measured on.
    clock: Callable[[], float] = time.monotonic
    _written: dict[ObjectKey, dict[str, Any]] = field(default_factory=dict)
    #: a held status: (the status, when the first change was held, when it last changed)
    _held: dict[ObjectKey, tuple[dict[str, Any], float, float]] = field(default_factory=dict)

    def previous(self, key: ObjectKey, body: Mapping[str, Any]) -> dict[str, Any]:
        """The status this pass starts from: what we last wrote (the watch may not have
        shown it yet), else the object's."""
        return self._written.get(key) or dict(body.get("status") or {})

    def now(self) -> str:
        """The time stamp for conditions that change in this write."""
        return _now()

    async def write_status(
        self,
        body: Mapping[str, Any],
        previous: Mapping[str, Any],
        status: dict[str, Any],
        slices: Sequence[SliceStatus],
    ) -> None:
        """Write ``status`` (computed from ``previous``) unless nothing changed; events for
        the slices' and conditions' transitions."""
        meta = body["metadata"]
        key = (self.kind, meta["namespace"], meta["name"])
        if status == previous or status == dict(body.get("status") or {}):
            self._written[key] = status
            self._held.pop(key, None)
            return
        now = self.clock()
        if may_fold(previous, status):
            held = self._held.get(key)
            first = held[1] if held else now
            changed = held[2] if held and held[0] == status else now
            due = min(changed + self.fold_quiet_seconds, first + self.fold_max_seconds)
            if now < due:
                self._held[key] = (status, first, changed)
                self.kick_later(key, due - now)  # written then, or folded into a flip
                return
        await self.kube.patch_status(c.PLURALS[self.kind], meta["namespace"], meta["name"], status)
        self._written[key] = status
        self._held.pop(key, None)
        ref = ClusterRef(meta["namespace"], meta["name"], meta.get("uid", ""), kind=self.kind)
        for kind, reason, message in slice_events(previous.get("slices") or [], slices):
            if reason != events.SLICE_RESERVED:  # posted with the claim itself
                await self.recorder.post(ref, kind, reason, message)
        for kind, reason, message in removal_events(previous, status):
            await self.recorder.post(ref, kind, reason, message)
        await self._condition_events(ref, previous, status)

    async def write_failure(self, key: ObjectKey, cluster: Mapping[str, Any], message: str) -> None:
        """A failed pass: only the conditions change (Reconciling, with the error)."""
        status = failure_status(
            self.previous(key, cluster),
            generation(cluster),
            events.RECONCILE_ERROR,
            message,
            _now(),
        )
        await self.kube.patch_status(
            c.PLURALS[self.kind], key[1], key[2], {"conditions": status["conditions"]}
        )
        self._written[key] = status
        self._held.pop(key, None)

    def forget(self, key: ObjectKey) -> None:
        self._written.pop(key, None)
        self._held.pop(key, None)

    async def _condition_events(
        self, ref: ClusterRef, previous: Mapping[str, Any], status: Mapping[str, Any]
    ) -> None:
        late = _condition(status, events.SCALE_UP_TIMED_OUT)
        if late[0] == "True" and _condition(previous, events.SCALE_UP_TIMED_OUT)[0] != "True":
            message = next(
                x["message"] for x in status["conditions"] if x["type"] == events.SCALE_UP_TIMED_OUT
            )
            await self.recorder.warning(ref, events.SCALE_UP_TIMED_OUT, message)
        admitted = _condition(status, KUEUE_ADMITTED)
        if (
            admitted == ("False", "Evicted")
            and _condition(previous, KUEUE_ADMITTED)[1] != "Evicted"
        ):
            message = next(
                x["message"] for x in status["conditions"] if x["type"] == KUEUE_ADMITTED
            )
            await self.recorder.warning(ref, events.KUEUE_EVICTED, message)
        if admitted[1] == "DefaultLocalQueue" and _condition(previous, KUEUE_ADMITTED)[0] == "":
            message = next(
                x["message"] for x in status["conditions"] if x["type"] == KUEUE_ADMITTED
            )
            await self.recorder.normal(ref, events.KUEUE_DEFAULT_LOCAL_QUEUE, message)
        stalled = _condition(status, "Stalled")
        if stalled[0] == "True" and stalled != _condition(previous, "Stalled"):
            message = next(x["message"] for x in status["conditions"] if x["type"] == "Stalled")
            await self.recorder.warning(ref, stalled[1], message)
        if _condition(status, "Ready")[0] == "True" and _condition(previous, "Ready")[0] != "True":
            await self.recorder.normal(
                ref, events.CLUSTER_READY, f"{status.get('sliceReadiness')} slices ready"
            )
        complete = _condition(status, "Complete")
        if complete[0] == "True" and _condition(previous, "Complete")[0] != "True":
            message = next(x["message"] for x in status["conditions"] if x["type"] == "Complete")
            await self.recorder.normal(ref, complete[1], message)
