"""Pin at admission in the identity webhook: which held node pool a new pod goes to.

``PinLookup.pool_for(pod)`` answers for a pod the admission decision is about to
admit: the node pool its slice's reservation holds when the leader marked that
reservation pinnable (``planning/pinning.py``), else None and the pod keeps its
gate. Two reads: the marked reservations by their holder's slice, kept current by a
watch of the SliceReservations on a thread of this process (``follow``), find the
name of the slice's marked reservation; then a live GET of that one reservation (a
quorum read) confirms the mark and the holder at the moment of admission. The fence
in the operator counts from the mark's removal, so what the GET saw is what the pin
rests on; the watched view only finds the name, and a stale one only leaves a pod
gated.

Why a watch: every pod of a new slice finds no mark (its slice is not held yet), and a
list after each such miss meant two LISTs of every SliceReservation a second during a
burst of pods, costly at thousands of pools; the watch delivers each change once, and
a mark written a moment ago shows within the watch's latency. The mark is an
annotation, which neither a label nor a field selector can select, so every
reservation's events come in and only the marked ones are kept. The watch is the
operator's own list+watch loop (``runtime.informers.follow_forever``): it resumes
from the last resourceVersion it saw (bookmarks too) when a watch request ends, and
lists again when the API server answers 410 Gone. Its state is not the webhook's
readiness (a failing watch leaves pods gated; it must not turn admission away).

Never fails open toward a pin: with no listing yet (a pod waits at most
``FIRST_LISTING_WAIT_SECONDS`` for the first), on any error (a read that
fails or times out, a body that does not parse) the answer is None, and the pod is
admitted gated as without the setting. The live GET runs on the webhook's own
thread for the request, bounded by its timeout (``Kube.get_reservation_sync``, 2 s,
below the webhook's own).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from tpuslice.model import constants as c
from tpuslice.model.convert import reservation_info
from tpuslice.model.records import Holder
from tpuslice.planning.pinning import holder_matches, pin_target, pod_slice
from tpuslice.runtime.health import Health
from tpuslice.runtime.informers import Followed, NamespacedName, follow_forever
from tpuslice.runtime.kube import Kube

__all__ = ["FIRST_LISTING_WAIT_SECONDS", "Marked", "PinLookup", "marked_record"]

log = logging.getLogger(__name__)

#: A pod admitted before the watch's first listing waits at most this long for it (the
#: webhook's process has just started); then it is admitted gated. Below the webhook's
#: timeout together with the live GET's.
FIRST_LISTING_WAIT_SECONDS = 1.0
#: At most one warning line per this many seconds about failed reads.
_WARN_EVERY_SECONDS = 60.0

SliceKey = tuple[str, str, str, int]  # the holder's (kind, namespace, name, replica index)


class Marked(NamedTuple):
    """A reservation marked pinnable, as the lookup keeps it: its name (what the live GET
    reads), the unit it holds, and its holder."""

    name: str
    pool: str
    holder: Holder

    @property
    def slice_key(self) -> SliceKey:
        h = self.holder
        return (h.kind, h.namespace, h.name, h.replica_index or 0)


def marked_record(obj: Mapping[str, Any]) -> Marked | None:
    """A watched SliceReservation as the lookup keeps it: None unless it is marked and
    names the replica index of its holder's slice (the webhook pins by that index)."""
    info = reservation_info(obj)
    if not info.pinned or info.holder.replica_index is None:
        return None
    name = str((obj.get("metadata") or {}).get("name") or info.pool)
    return Marked(name, info.pool, info.holder)


#: What the lookup watches: every SliceReservation, each shrunk to ``marked_record``.
RESERVATIONS = Followed(c.GROUP, c.VERSION, c.PLURAL_RESERVATION, marked_record)


class PinLookup:
    """The node pool a new pod is pinned to at admission, or None (see the module).
    ``deliver`` takes the watch's listings and events (``informers.Deliver``); ``follow``
    starts that watch."""

    def __init__(
        self,
        get_reservation: Callable[[str], Any],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._get = get_reservation
        self._clock = clock
        self._lock = threading.Lock()
        self._by_name: dict[str, Marked] = {}
        self._by_slice: dict[SliceKey, dict[str, Marked]] = {}
        self._listed = threading.Event()
        self._warned = -_WARN_EVERY_SECONDS

    # ------------------------------------------------------------ the watch's side
    def follow(self, kube: Kube) -> threading.Event:
        """Watch the SliceReservations on a daemon thread; set the returned event to stop.
        The watch reports to a health of its own, which no probe reads (see the module)."""
        stop = threading.Event()
        own = dataclasses.replace(kube, health=Health())
        threading.Thread(
            target=follow_forever,
            args=(own, RESERVATIONS, self.deliver, stop),
            name="watch-pin-marks",
            daemon=True,
        ).start()
        return stop

    def deliver(self, event: str | None, records: Mapping[NamespacedName, Marked | None]) -> None:
        """A full listing (``event`` None: it replaces what is kept) or one watch event;
        a record of None (not marked) or a DELETED event drops the reservation."""
        with self._lock:
            if event is None:
                self._by_name, self._by_slice = {}, {}
                self._listed.set()
            for (_, name), record in records.items():
                self._drop(name)
                if record is not None and event != "DELETED":
                    self._by_name[name] = record
                    self._by_slice.setdefault(record.slice_key, {})[name] = record

    def _drop(self, name: str) -> None:
        before = self._by_name.pop(name, None)
        if before is None:
            return
        same = self._by_slice.get(before.slice_key, {})
        same.pop(name, None)
        if not same:
            self._by_slice.pop(before.slice_key, None)

    def marked(self) -> int:
        """How many marked reservations are kept (tests, debugging)."""
        with self._lock:
            return len(self._by_name)

    # ------------------------------------------------------------ admission's side
    def pool_for(self, pod: Mapping[str, Any], namespace: str = "") -> str | None:
        """The node pool to pin ``pod`` to, or None (it stays gated)."""
        slice_ = pod_slice(pod, namespace)
        if slice_ is None:
            log.debug("a pod in %s is not one to pin (%s)", namespace, _facts(pod))
            return None
        try:
            key = (slice_.kind, slice_.namespace, slice_.name, slice_.replica_index)
            if not self._listed.wait(FIRST_LISTING_WAIT_SECONDS):
                log.debug("slice %s: the reservations are not listed yet", key)
                return None
            with self._lock:
                found = list(self._by_slice.get(key, {}).values())
            names = [m.name for m in found if holder_matches(slice_, m.holder)]
            if len(names) != 1:
                log.debug("slice %s: %d marked reservations", key, len(names))
                return None
            live = reservation_info(self._get(names[0]))
            pool = pin_target(slice_, live)
            log.debug("slice %s: %s (marked when read: %s)", key, pool or "not pinned", live.pinned)
            return pool
        except Exception as exc:
            self._warn(exc)
            return None

    def _warn(self, exc: Exception) -> None:
        now = self._clock()
        if now - self._warned >= _WARN_EVERY_SECONDS:
            self._warned = now
            log.warning("pin at admission: a read failed (%s); pods stay gated meanwhile", exc)


def _facts(pod: Mapping[str, Any]) -> str:
    """What decides whether a pod is one to pin, for a debug line."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    return (
        f"labels {sorted((meta.get('labels') or {}).items())}, gates "
        f"{spec.get('schedulingGates')}, nodeSelector {spec.get('nodeSelector')}"
    )
