"""The shell around ``leader.py``: read and write the Lease, on threads of its own.

``Elector.acquire`` blocks (the start-up thread) until this instance holds the
Lease; ``Elector.keep`` then renews it on a thread every retry period, and a
watchdog thread calls ``on_lost`` the moment the renew deadline passes without
a renewal (or the Lease names someone else). The operator's ``on_lost`` exits
the process at once, as kube-scheduler and kube-controller-manager do on a lost
Lease (controller-runtime's manager stops with "leader election lost" and its
callers exit): a process cannot be sure to cancel every request it has in
flight, a dead one can, and the kubelet restarts it as a standby. The threads
are not the kopf event loop, so a loop busy with a thousand reconciles never
delays a renewal; the Lease requests use ``Kube.call_sync`` on these threads,
never the reconcile executor.

``release`` hands the Lease over on a clean stop, after the caller stopped acting,
so a standby takes over on its next try instead of a lease duration later.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from tpuslice.runtime import election_rules as leader
from tpuslice.runtime.election_rules import Candidate, Kind, Timings
from tpuslice.runtime.health import Health
from tpuslice.runtime.kube import ApiError, Kube
from tpuslice.runtime.metrics import Metrics

__all__ = ["Conflict", "Elector", "KubeLeases", "LeaseStore"]

log = logging.getLogger(__name__)

#: How often the watchdog looks at the renew deadline.
WATCHDOG_SECONDS = 0.1
#: The health kind under which Lease requests are reported (readiness: answered recently).
HEALTH_KIND = "leases"


class Conflict(Exception):
    """A write lost a race (409): someone else wrote the Lease first."""


class LeaseStore(Protocol):
    """The three requests leader election makes; ``timeout`` bounds each (seconds)."""

    def get(self, timeout: float) -> Mapping[str, Any] | None: ...
    def create(self, body: Mapping[str, Any], timeout: float) -> Mapping[str, Any]: ...
    def update(self, body: Mapping[str, Any], timeout: float) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class KubeLeases:
    """One named Lease through ``Kube`` (a 409 becomes ``Conflict``)."""

    kube: Kube
    namespace: str
    name: str

    def get(self, timeout: float) -> Mapping[str, Any] | None:
        lease: Mapping[str, Any] | None = self.kube.get_lease(self.namespace, self.name, timeout)
        return lease

    def create(self, body: Mapping[str, Any], timeout: float) -> Mapping[str, Any]:
        return self._write(self.kube.create_lease, body, timeout)

    def update(self, body: Mapping[str, Any], timeout: float) -> Mapping[str, Any]:
        return self._write(self.kube.update_lease, body, timeout)

    @staticmethod
    def _write(
        send: Callable[[Mapping[str, Any], float], Any], body: Mapping[str, Any], timeout: float
    ) -> Mapping[str, Any]:
        try:
            answer: Mapping[str, Any] = send(body, timeout)
        except ApiError as exc:
            if exc.conflict:
                raise Conflict(exc.message) from exc
            raise
        return answer


class Elector:
    """One instance's side of the election for one Lease."""

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        *,
        namespace: str,
        name: str,
        timings: Timings | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        health: Health | None = None,
        metrics: Metrics | None = None,
        wait: Callable[[threading.Event, float], bool] = threading.Event.wait,
    ) -> None:
        """``clock`` times the deadlines and ``wait`` paces the loops (it returns True once
        the event is set, else after the seconds); a test passes a fake clock's pair so the
        loops advance with that clock instead of with real time."""
        self.store = store
        self.namespace = namespace
        self.name = name
        self.timings = timings or Timings()
        self._clock = clock
        self._wall = wall
        self._wait = wait
        self._health = health
        self._metrics = metrics
        self._lock = threading.Lock()
        self._state = Candidate(identity, self.timings)
        self._reported: str | None = None  # the holder last named in the log
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def state(self) -> Candidate:
        with self._lock:
            return self._state

    def _set(self, state: Candidate) -> None:
        with self._lock:
            self._state = state

    def _timeout(self, state: Candidate) -> float:
        """A renewal must answer before the deadline; a candidate's read, within one."""
        if state.renewed is None:
            return self.timings.renew_deadline
        left = self.timings.renew_deadline - (self._clock() - state.renewed)
        return max(0.2, left)

    # ------------------------------------------------------------ one try
    def attempt(self) -> bool:
        """Read the Lease (a leader skips the read and updates its own last write, as
        client-go does), decide, write. True when we hold the Lease afterwards."""
        state = self.state
        timeout = self._timeout(state)
        try:
            if not state.leading:
                state = leader.observe(state, self.store.get(timeout), self._clock())
                if leader.lost_to(state) is not None:
                    self._set(state)  # the watchdog stops us
                    return False
            decision = leader.decide(state, self._clock(), self._wall())
            if decision.kind is Kind.WAIT:
                self._set(state)
                self._answered()
                self._report_standby(decision.holder, decision.expires_in)
                return False
            assert decision.record is not None
            body = leader.lease_body(
                self.namespace, self.name, decision.record, decision.resource_version
            )
            sent = self._clock()
            if decision.kind is Kind.CREATE:
                answer = self.store.create(body, timeout)
            else:
                answer = self.store.update(body, timeout)
        except Conflict as exc:
            self._set(leader.forget(state))
            self._answered()
            log.debug("lost a race for the Lease %s: %s", self.lease, exc)
            return False
        except Exception as exc:
            self._set(leader.forget(state))
            if self._health is not None:
                self._health.watch_failed(HEALTH_KIND, f"{type(exc).__name__}: {exc}")
            log.warning("leader election: the Lease %s: %s", self.lease, exc)
            return False
        first = state.renewed is None
        self._set(leader.written(state, answer, sent))
        self._answered()
        if first:
            how = {
                Kind.CREATE: "created it",
                Kind.TAKE_OVER: f"took it over, transition {decision.record.transitions}",
                Kind.RENEW: "it already named us (a restart under the same identity)",
            }[decision.kind]
            log.info("became leader: the Lease %s (%s)", self.lease, how)
        self._reported = None
        return True

    def _answered(self) -> None:
        if self._health is not None:
            self._health.watch_ok(HEALTH_KIND)

    def _report_standby(self, holder: str, expires_in: float) -> None:
        if self._metrics is not None:
            self._metrics.leading(False)
        if holder == self._reported:
            return
        self._reported = holder
        log.info(
            "standby: the Lease %s is held by %s; serving the webhook only, taking over "
            "if it is not renewed for %.0fs (about %.0fs from now)",
            self.lease,
            holder,
            self.timings.lease_duration,
            expires_in,
        )

    # ------------------------------------------------------------ loops
    def acquire(self, stop: threading.Event) -> bool:
        """Try every retry period (with jitter) until we lead (True) or ``stop`` is set
        (False). Each turn tells the liveness probe that the start-up thread is alive."""
        if self._metrics is not None:
            self._metrics.leading(False)
        log.info("leader election: trying to acquire the Lease %s", self.lease)
        while not stop.is_set():
            if self._health is not None:
                self._health.beat()
            if self.attempt():
                return True
            self._wait(stop, self.timings.retry_period * random.uniform(1.0, leader.JITTER))
        return False

    def keep(
        self, on_lost: Callable[[str], None], alive: Callable[[], bool] = lambda: True
    ) -> None:
        """Renew every retry period on one thread; a watchdog thread calls ``on_lost``
        (once, with the reason) when we must stop acting. Call after ``acquire``.

        ``alive`` (the liveness verdict) is asked before each renewal: a leader whose
        event loop has stopped turning stops renewing, so it stops at the renew
        deadline and a standby takes over a lease duration later, instead of a hung
        leader holding the Lease until the liveness probe has it restarted."""
        if self._metrics is not None:
            self._metrics.leading(True)

        def renew() -> None:
            while not self._wait(self._stop, self.timings.retry_period):
                if not alive():
                    log.warning("not renewing the Lease %s: this instance is not alive", self.lease)
                    continue
                if not self.attempt() and self.state.renewed is not None:
                    log.warning(
                        "could not renew the Lease %s; stopping at the renew deadline "
                        "(%.0fs after the last renewal) if this goes on",
                        self.lease,
                        self.timings.renew_deadline,
                    )

        def watch() -> None:
            while not self._wait(self._stop, WATCHDOG_SECONDS):
                reason = self.stop_reason()
                if reason is not None:
                    if self._metrics is not None:
                        self._metrics.leading(False)
                    on_lost(reason)
                    return

        self._renewer = threading.Thread(target=renew, name="lease-renew", daemon=True)
        self._renewer.start()
        threading.Thread(target=watch, name="lease-watchdog", daemon=True).start()

    def stop_reason(self) -> str | None:
        """Why a leader must stop acting now, or None."""
        state = self.state
        holder = leader.lost_to(state)
        if holder is not None:
            return f"the Lease {self.lease} is now held by {holder or 'nobody'}"
        if leader.must_stop(state, self._clock()):
            return (
                f"the Lease {self.lease} was not renewed for "
                f"{self.timings.renew_deadline:.0f}s (the renew deadline)"
            )
        return None

    def release(self) -> None:
        """Stop renewing and hand the Lease over (no holder). Only after the caller has
        stopped acting; a failure is logged, the Lease then expires by itself."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=self.timings.renew_deadline)
        state = self.state
        record = leader.release_record(state, self._wall())
        if record is None or state.observed is None:
            return
        if leader.must_stop(state, self._clock()):
            return  # past the deadline another may hold it already: write nothing
        body = leader.lease_body(self.namespace, self.name, record, state.observed.resource_version)
        try:
            self.store.update(body, self._timeout(state))
        except Exception as exc:
            log.warning(
                "could not release the Lease %s (%s); it expires by itself", self.lease, exc
            )
            return
        self._set(Candidate(state.identity, self.timings))
        if self._metrics is not None:
            self._metrics.leading(False)
        log.info("released the Lease %s", self.lease)
