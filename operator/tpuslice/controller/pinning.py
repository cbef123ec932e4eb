"""Pin at admission in the operator: the mark's writes and the fence every let-go of a
reservation passes (``planning/pinning.py`` decides; this module reads and writes).

``PinFence.let_go(reservation)`` answers whether a reservation may be deleted or
handed to another slice now. With the setting off and no mark or removal time on
the reservation as the pass saw it, at once (no read: the default path costs
nothing). Otherwise the reservation is read live (a GET is a quorum read; our own
mark written a moment ago is seen even when the watch has not shown it): marked, the
mark is removed with the time and the answer is no; removed less than the fence ago,
no; past it, the holder's pods are listed live and the answer is no while any is
pinned to the unit. Each no asks for a pass of the holder when the fence can next
pass. Every delete of a reservation in the operator (the pass's frees and give-backs,
a removed group's or RayCluster's, a lapsed booking's, the finalizer's, the orphan
sweep's) asks first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from tpuslice.controller.expectations import Expectations
from tpuslice.model import constants as c
from tpuslice.model.convert import reservation_info, rfc3339
from tpuslice.model.records import ObjectKey, ReservationInfo
from tpuslice.planning.pinning import PIN_FENCE_MARGIN_SECONDS, FenceStep, fence, pinned_to
from tpuslice.runtime.kube import ApiError, ClusterApi

__all__ = ["PinFence"]

log = logging.getLogger(__name__)


def _no_kick(key: ObjectKey, seconds: float) -> None:
    return None


@dataclass
class PinFence:
    """The fence (``let_go``) and the mark's writes (``mark``, ``unmark``), one per process."""

    kube: ClusterApi
    #: the process's one store of unconfirmed writes (a mark written shows at once)
    pending: Expectations = field(default_factory=Expectations)
    #: ``--pin-at-admission``: the pass marks reservations (``planning.pinning.pin_marks``)
    enabled: bool = False
    #: the webhook's timeoutSeconds plus ``PIN_FENCE_MARGIN_SECONDS``
    fence_s: float = 5.0 + PIN_FENCE_MARGIN_SECONDS
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    #: asks for a pass of the holder (kind, namespace, name) in that many seconds
    kick_later: Callable[[ObjectKey, float], None] = _no_kick

    async def let_go(self, seen: ReservationInfo) -> bool:
        """Whether ``seen`` may be deleted, or handed to another slice, now."""
        if not self.enabled and not seen.pinned and not seen.unpinned_at:
            return True
        try:
            live = reservation_info(await self.kube.get_reservation(seen.pool))
        except ApiError as exc:
            if exc.not_found:
                return True  # gone: the caller's delete finds it so
            raise
        if seen.uid and live.uid and live.uid != seen.uid:
            return True  # another claim now: the caller's uid precondition refuses
        owner = live.holder.owner
        step = fence(live, self.clock(), self.fence_s)
        if step.step is FenceStep.LET_GO:
            return True
        if step.step is FenceStep.UNMARK:
            await self.unmark(live)
            self.kick_later(owner, step.wait_s + 1.0)
            return False
        if step.step is FenceStep.WAIT:
            self.kick_later(owner, step.wait_s + 1.0)
            return False
        pods = await self.kube.list_pods(
            live.holder.namespace, f"{c.LABEL_CLUSTER}={live.holder.name}"
        )
        pinned = pinned_to(pods, live.pool)
        if pinned:
            log.info(
                "keeping %s: pods %s are pinned to it (%s)",
                live.pool,
                ", ".join(sorted(pinned)[:4]),
                live.holder.describe(),
            )
            self.kick_later(owner, self.fence_s)
            return False
        return True

    async def mark(self, reservation: ReservationInfo) -> None:
        """Mark ``reservation`` pinnable (only that object: conditional on its uid)."""
        if await self._annotate(reservation, {c.ANNOTATION_PIN: "true"}):
            self.pending.pin_written(reservation.pool, True, "", time.monotonic())
            log.info("marked %s for pinning at admission", reservation.pool)

    async def unmark(self, reservation: ReservationInfo) -> None:
        """Remove the mark and record when (the fence counts from it)."""
        when = rfc3339(self.clock())
        if await self._annotate(
            reservation, {c.ANNOTATION_PIN: None, c.ANNOTATION_PIN_REMOVED_AT: when}
        ):
            self.pending.pin_written(reservation.pool, False, when, time.monotonic())
        log.info("un-marked %s for pinning at admission (%s)", reservation.pool, when)

    async def _annotate(self, reservation: ReservationInfo, notes: dict[str, str | None]) -> bool:
        """False when the reservation is gone or is another one now."""
        try:
            await self.kube.annotate_reservation(reservation.pool, reservation.uid, notes)
        except ApiError as exc:
            if not (exc.not_found or exc.conflict):
                raise
            return False
        return True
