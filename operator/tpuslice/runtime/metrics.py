"""Prometheus metrics of the operator: one ``Metrics`` object, created at start-up and passed in.

Every metric lives in the ``CollectorRegistry`` of its ``Metrics`` instance, not
in prometheus-client's process-wide default registry, so tests make as many as
they like without clashes and the operator exports only what is listed in
docs/metrics.md. The recording methods are small and synchronous (a counter
increment, a histogram observation), so the hooks in kube.py, reconcile.py and
webhook.py stay one line each; the arithmetic that turns snapshots into
latencies (timestamps, per-slice maxima, per-cluster gauge deltas) is here and
is unit-tested without a cluster.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tpuslice.model.records import ObjectKey, PodInfo

__all__ = ["Metrics", "parse_timestamp", "serve", "slice_last_created"]

log = logging.getLogger(__name__)

#: Pass and API latencies: milliseconds to tens of seconds.
FAST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: End-to-end latencies measured from a creationTimestamp (whole seconds).
SLOW_BUCKETS = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


def parse_timestamp(value: str) -> float | None:
    """An RFC 3339 creationTimestamp as epoch seconds; None when empty or malformed."""
    if not value:
        return None
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


class _WatchAges(Collector):
    """Seconds since each kind our watches follow last delivered (list, event, bookmark)."""

    def __init__(self, ages: Callable[[], Mapping[str, float]]) -> None:
        self._ages = ages

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "tpuslice_watch_last_delivery_age_seconds",
            "Seconds since the operator's watch of each kind last delivered a listing, an "
            "event or a bookmark",
            labels=["kind"],
        )
        for kind, age in sorted(self._ages().items()):
            family.add_metric([kind], round(age, 3))
        yield family


class Metrics:
    """All metrics of one operator process, in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.reconciles = Counter(
            "tpuslice_reconciles",
            "Reconcile passes of a TPUSliceCluster, by result (success or error).",
            ["result"],
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "tpuslice_reconcile_duration_seconds",
            "Wall time of one reconcile pass, API calls included, by result.",
            ["result"],
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.raycluster_created_seconds = Histogram(
            "tpuslice_raycluster_creation_seconds",
            "TPUSliceCluster creationTimestamp -> the first successful apply of its RayCluster "
            "(creationTimestamp has 1 s resolution).",
            buckets=SLOW_BUCKETS,
            registry=r,
        )
        self.slice_release_seconds = Histogram(
            "tpuslice_slice_release_seconds",
            "Last pod of a slice created (creationTimestamp) -> every pod of the slice "
            "ungated and pinned to its node pool (the release patches answered).",
            buckets=SLOW_BUCKETS,
            registry=r,
        )
        self.slices = Gauge(
            "tpuslice_slices",
            "Slices of all TPUSliceClusters, TPUSliceJobs and TPUSliceServices by state (Pending, "
            "WaitingForCapacity, Reserved, Scheduled, Ready, Releasing), as of each one's last "
            "pass.",
            ["state"],
            registry=r,
        )
        self.queue_length = Gauge(
            "tpuslice_queue_length",
            "Objects of every kind waiting for node pools of one TPU shape (a slice "
            "WaitingForCapacity, or Stalled NotEnoughPools), as of each one's last pass.",
            ["shape"],
            registry=r,
        )
        self.queue_wait_seconds = Histogram(
            "tpuslice_queue_wait_seconds",
            "How long a TPUSliceCluster waited in its shape's queue: from the pass that first "
            "found it waiting to the pass that found it waiting no more (as seen by this "
            "process; a restart starts the clock again).",
            ["shape"],
            buckets=SLOW_BUCKETS,
            registry=r,
        )
        self.slice_disruptions = Counter(
            "tpuslice_slice_disruptions",
            "Slices drained whole because a node of the unit they held was disrupted, by "
            "reason (Maintenance, Preemption, CapacityRevoked, NodeFailure); counted apart "
            "from failures.",
            ["reason"],
            registry=r,
        )
        self.quarantined_units = Gauge(
            "tpuslice_quarantined_units",
            "Units (node pools, or nodes of single-host pools) of each TPU shape that no slice "
            "claims because a node is terminating, in maintenance, NotReady or UNHEALTHY, "
            "as of the shape's last pass.",
            ["shape"],
            registry=r,
        )
        self.reservations = Gauge(
            "tpuslice_reservations",
            "SliceReservations by status.phase as the operator's watch sees them "
            "(Unset before the first phase is written).",
            ["phase"],
            registry=r,
        )
        self.api_requests = Counter(
            "tpuslice_api_requests",
            "Requests the operator's own code sent to the API server, by HTTP verb and resource "
            "(kopf's watches and its finalizer patches are not included).",
            ["verb", "resource"],
            registry=r,
        )
        self.claims_lost = Counter(
            "tpuslice_claims_lost",
            "SliceReservation creates answered AlreadyExists with another holder: a claim "
            "lost to a faster claimant of the same pool (each costs a read of the winner and "
            "a re-plan). Many per reservation made mean claimants collide on the same pools.",
            registry=r,
        )
        self.webhook_seconds = Histogram(
            "tpuslice_webhook_admission_duration_seconds",
            "Time in the TPU identity admission handler, by result (mutated, unchanged, "
            "refused, error).",
            ["result"],
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            "tpuslice_errors",
            "Errors by kind: api (a non-2xx answer or a failed request), reconcile (a pass "
            "raised and is retried), webhook (the admission handler raised unexpectedly), "
            "event (an Event could not be posted), metrics_server.",
            ["kind"],
            registry=r,
        )
        self.leader = Gauge(
            "tpuslice_leader",
            "1 while this instance leads (holds the Lease: it reconciles, claims, releases "
            "and sweeps; always 1 without leader election), 0 while it is a standby that "
            "serves the identity webhook only.",
            registry=r,
        )
        # process_resident_memory_bytes, process_cpu_seconds_total, ... (Linux /proc)
        ProcessCollector(registry=r)
        #: Keyed by (kind, namespace, name): a TPUSliceCluster and a TPUSliceJob of one
        #: name in one namespace are two contributions, not one.
        self._slices_by_cluster: dict[ObjectKey, Tally[str]] = {}
        #: Who waits for each shape, of every kind: one reconciler per kind reports here,
        #: so the gauge counts them all rather than the last kind that passed.
        self._waiting_by_shape: dict[str, set[ObjectKey]] = {}
        self._reservation_phase: dict[str, str] = {}

    # ------------------------------------------------------------ reconcile
    def reconciled(self, seconds: float, ok: bool) -> None:
        result = "success" if ok else "error"
        self.reconciles.labels(result).inc()
        self.reconcile_seconds.labels(result).observe(seconds)
        if not ok:
            self.errors.labels("reconcile").inc()

    def raycluster_created(self, cluster_created: str, now: float) -> None:
        """Observe creation latency; ``now`` is epoch seconds of the successful apply."""
        start = parse_timestamp(cluster_created)
        if start is not None:
            self.raycluster_created_seconds.observe(max(0.0, now - start))

    def slices_released(self, last_pod_created: Iterable[str], now: float) -> None:
        """One observation per released slice: ``now`` minus its newest pod's creationTimestamp."""
        for created in last_pod_created:
            start = parse_timestamp(created)
            if start is not None:
                self.slice_release_seconds.observe(max(0.0, now - start))

    def slice_disrupted(self, reason: str) -> None:
        """One slice drained whole (planning/disruption.py)."""
        self.slice_disruptions.labels(reason).inc()

    def quarantined(self, shape: str, units: int) -> None:
        """The units of ``shape`` quarantined as of this pass."""
        self.quarantined_units.labels(shape).set(units)

    def cluster_slices(self, key: ObjectKey, states: Iterable[str]) -> None:
        """Replace one cluster's contribution to ``tpuslice_slices`` (a delta, not a recount)."""
        new = Tally(states)
        old = self._slices_by_cluster.get(key, Tally())
        if new == old:
            return
        for state in set(old) | set(new):
            delta = new[state] - old[state]
            if delta:
                self.slices.labels(state).inc(delta)
        if new:
            self._slices_by_cluster[key] = new
        else:
            self._slices_by_cluster.pop(key, None)

    def forget_cluster(self, key: ObjectKey) -> None:
        """An object is gone: its slices and its places in the shapes' queues."""
        self.cluster_slices(key, ())
        for shape, keys in self._waiting_by_shape.items():
            if key in keys:
                keys.discard(key)
                self.queue_length.labels(shape).set(len(keys))

    def shape_waiting(self, shape: str, key: ObjectKey, waits: bool) -> None:
        """Whether one object waits for pools of ``shape`` as of its last pass;
        ``tpuslice_queue_length{shape}`` is the count of those that do, of every kind."""
        keys = self._waiting_by_shape.setdefault(shape, set())
        if waits:
            keys.add(key)
        else:
            keys.discard(key)
        self.queue_length.labels(shape).set(len(keys))

    def waited(self, shape: str, seconds: float) -> None:
        self.queue_wait_seconds.labels(shape).observe(seconds)

    # ------------------------------------------------------------ reservations
    def reservation_seen(self, pool: str, phase: str | None) -> None:
        new = phase or "Unset"
        old = self._reservation_phase.get(pool)
        if old == new:
            return
        if old is not None:
            self.reservations.labels(old).dec()
        self.reservations.labels(new).inc()
        self._reservation_phase[pool] = new

    def reservation_gone(self, pool: str) -> None:
        old = self._reservation_phase.pop(pool, None)
        if old is not None:
            self.reservations.labels(old).dec()

    # ------------------------------------------------------------ leader election
    def leading(self, yes: bool) -> None:
        self.leader.set(1 if yes else 0)

    # ------------------------------------------------------------ API, webhook, errors
    def watch_ages_from(self, ages: Callable[[], Mapping[str, float]]) -> None:
        """Export ``tpuslice_watch_last_delivery_age_seconds{kind}``, read from ``ages``
        at scrape time (a gauge set on every event would cost a call per event)."""
        self.registry.register(_WatchAges(ages))

    def api_request(self, verb: str, resource: str) -> None:
        self.api_requests.labels(verb, resource).inc()

    def api_error(self) -> None:
        self.errors.labels("api").inc()

    def admission(self, seconds: float, result: str) -> None:
        self.webhook_seconds.labels(result).observe(seconds)
        if result == "error":
            self.errors.labels("webhook").inc()

    def error(self, kind: str) -> None:
        self.errors.labels(kind).inc()

    def api_writes(self) -> int:
        """Non-GET requests so far (what the steady-state check of the benchmark reads)."""
        total = 0.0
        for family in self.api_requests.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("verb") != "GET":
                    total += sample.value
        return int(total)


def slice_last_created(pods: Iterable[PodInfo], replicas: Iterable[str]) -> list[str]:
    """The newest pod creationTimestamp of each named slice (replica) that has one.

    RFC 3339 in one format sorts as text, so the string maximum is the latest.
    """
    newest: dict[str, str] = dict.fromkeys(replicas, "")
    for pod in pods:
        for name in pod.slice_names & newest.keys():
            newest[name] = max(newest[name], pod.created)
    return [stamp for stamp in newest.values() if stamp]


def serve(metrics: Metrics, port: int, addr: str = "0.0.0.0") -> bool:
    """Serve /metrics in a daemon thread; a port in use is logged and counted, not fatal.

    Metrics are for people and dashboards; the operator's job (reservations,
    releases) must not stop because another process holds the port.
    """
    try:
        start_http_server(port, addr=addr, registry=metrics.registry)
    except OSError as exc:
        log.error("metrics: cannot listen on %s:%d (%s); metrics are not served", addr, port, exc)
        metrics.error("metrics_server")
        return False
    return True
