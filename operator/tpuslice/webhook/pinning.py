"""Pin at admission in the identity webhook: which held node pool a new pod goes to.

``PinLookup.pool_for(pod)`` answers for a pod the admission decision is about to
admit: the node pool its slice's reservation holds when the leader marked that
reservation pinnable (``planning/pinning.py``), else None and the pod keeps its
gate. Two reads: a list of every SliceReservation, kept ``ttl_s`` seconds, finds the
name of the slice's marked reservation (its holder keyed by object and replica
index); then a live GET of that one reservation (a quorum read) confirms the mark and
the holder at the moment of admission. The fence in the operator counts from the
mark's removal, so what the GET saw is what the pin rests on; the cached list only
finds the name, and a stale one only leaves a pod gated.

Never fails open toward a pin: any error (a read that fails or times out, a body
that does not parse) answers None, and the pod is admitted gated as without the
setting. Reads run on the webhook's own threads, each bounded by ``read_timeout_s``
(below the webhook's own timeout).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tpuslice.model.convert import reservation_info
from tpuslice.model.records import Holder
from tpuslice.planning.pinning import holder_matches, pin_target, pod_slice

__all__ = ["DEFAULT_TTL_SECONDS", "PinLookup"]

log = logging.getLogger(__name__)

#: How long a list of the reservations is used to find a slice's reservation by name.
DEFAULT_TTL_SECONDS = 2.0
#: A pod whose slice the list shows no marked reservation for lists again once the
#: list is this old: a mark written a moment ago is seen by the next pods, and a burst
#: of pods that cannot be pinned (a new slice's) costs at most two lists a second.
MISS_TTL_SECONDS = 0.5
#: At most one warning line per this many seconds about failed reads.
_WARN_EVERY_SECONDS = 60.0

SliceKey = tuple[str, str, str, int]  # the holder's (kind, namespace, name, replica index)


class PinLookup:
    """The node pool a new pod is pinned to at admission, or None (see the module)."""

    def __init__(
        self,
        list_reservations: Callable[[], Any],
        get_reservation: Callable[[str], Any],
        *,
        ttl_s: float = DEFAULT_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._list = list_reservations
        self._get = get_reservation
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._marked: dict[SliceKey, list[tuple[str, Holder]]] = {}
        self._listed_at: float | None = None
        self._warned = -_WARN_EVERY_SECONDS

    def pool_for(self, pod: Mapping[str, Any], namespace: str = "") -> str | None:
        """The node pool to pin ``pod`` to, or None (it stays gated)."""
        slice_ = pod_slice(pod, namespace)
        if slice_ is None:
            log.debug("a pod in %s is not one to pin (%s)", namespace, _facts(pod))
            return None
        try:
            key = (slice_.kind, slice_.namespace, slice_.name, slice_.replica_index)
            found = self._marked_now(self._ttl_s).get(key)
            if not found:
                found = self._marked_now(MISS_TTL_SECONDS).get(key)
            names = [pool for pool, h in found or () if holder_matches(slice_, h)]
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

    def _marked_now(self, max_age: float) -> dict[SliceKey, list[tuple[str, Holder]]]:
        """The marked reservations by their holder's slice, from a list at most
        ``max_age`` seconds old (threads arriving during a list use its result)."""
        with self._lock:
            now = self._clock()
            if self._listed_at is None or now - self._listed_at >= max_age:
                self._listed_at = now
                marked: dict[SliceKey, list[tuple[str, Holder]]] = {}
                self._marked = marked
                found = self._list()
                for item in (found or {}).get("items") or []:
                    info = reservation_info(item)
                    h = info.holder
                    if info.pinned and h.replica_index is not None:
                        key = (h.kind, h.namespace, h.name, h.replica_index)
                        marked.setdefault(key, []).append((info.pool, h))
            return self._marked

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
