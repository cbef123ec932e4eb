"""The status writer: a TPUSlice object's status, written only when it changed.

``status.py`` (``job_status.py``, ``service_status.py``) computes the status
(pure); this part decides whether to send it (one writer per kind). A status
equal to what we last wrote, or to what the object shows, is not written. A
change that is only progress (N of 4 pods created, hosts ready) is written at
most once per ``progress_seconds`` per object and folded into the next write:
the counts of a slice coming up arrive within a second or two, and each used
to be a write of its own. Events are posted on transitions (slice states,
Stalled, Ready, Complete), once, with the write that made them true.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tpuslice import constants as c
from tpuslice import events
from tpuslice.kube import ClusterApi
from tpuslice.recorder import Recorder
from tpuslice.records import ClusterKey, ClusterRef, SliceStatus
from tpuslice.status import Observed, compute_status, failure_status, progress_only, slice_events

__all__ = ["PROGRESS_WRITE_SECONDS", "StatusWriter", "generation"]

#: A status change that is only progress is written at most this often per cluster.
PROGRESS_WRITE_SECONDS = 1.0


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
    #: Asks for one more pass after a delay (a progress write held back).
    kick_later: Callable[[ClusterKey, float], None]
    progress_seconds: float = PROGRESS_WRITE_SECONDS
    kind: str = c.KIND_CLUSTER  # of the objects this writer writes
    _written: dict[ClusterKey, dict[str, Any]] = field(default_factory=dict)
    _last_write: dict[ClusterKey, float] = field(default_factory=dict)

    def previous(self, key: ClusterKey, body: Mapping[str, Any]) -> dict[str, Any]:
        """The status this pass starts from: what we last wrote (the watch may not have
        shown it yet), else the object's."""
        return self._written.get(key) or dict(body.get("status") or {})

    async def write(
        self, body: Mapping[str, Any], previous: Mapping[str, Any], observed: Observed
    ) -> None:
        """A TPUSliceCluster's status from what the pass observed."""
        status = compute_status(observed, previous, _now())
        await self.write_status(body, previous, status, observed.slices)

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
        key = (meta["namespace"], meta["name"])
        if status == previous or status == dict(body.get("status") or {}):
            self._written[key] = status
            return
        now = time.monotonic()
        wait = self._last_write.get(key, -math.inf) + self.progress_seconds - now
        if wait > 0 and progress_only(previous, status):
            self.kick_later(key, wait)  # folded into the next write, or written then
            return
        await self.kube.patch_status(c.PLURALS[self.kind], meta["namespace"], meta["name"], status)
        self._written[key] = status
        self._last_write[key] = now
        ref = ClusterRef(meta["namespace"], meta["name"], meta.get("uid", ""), kind=self.kind)
        for kind, reason, message in slice_events(previous.get("slices") or [], slices):
            if reason != events.SLICE_RESERVED:  # posted with the claim itself
                await self.recorder.post(ref, kind, reason, message)
        await self._condition_events(ref, previous, status)

    async def write_failure(
        self, key: ClusterKey, cluster: Mapping[str, Any], message: str
    ) -> None:
        """A failed pass: only the conditions change (Reconciling, with the error)."""
        status = failure_status(
            self.previous(key, cluster),
            generation(cluster),
            events.RECONCILE_ERROR,
            message,
            _now(),
        )
        await self.kube.patch_status(
            c.PLURALS[self.kind], key[0], key[1], {"conditions": status["conditions"]}
        )
        self._written[key] = status
        self._last_write[key] = time.monotonic()

    def forget(self, key: ClusterKey) -> None:
        self._written.pop(key, None)
        self._last_write.pop(key, None)

    async def _condition_events(
        self, ref: ClusterRef, previous: Mapping[str, Any], status: Mapping[str, Any]
    ) -> None:
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
