"""The benchmark's eyes: raw watches (JSON lines, receive time on this machine's
monotonic clock) and the recorders that keep the first time each thing was seen."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from bench import operator_api as c
from bench.scenario import GANG_HOSTS, GANG_SLICES, HOSTS
from tpusim.benchstats import summary


@dataclass
class Recorder:
    """First-seen times (monotonic seconds) of everything the watches saw."""

    namespace: str = ""  # reservations are cluster-scoped: only holders in this namespace
    lock: threading.Lock = field(default_factory=threading.Lock)
    applied: dict[str, float] = field(default_factory=dict)  # create call returned
    rc_created: dict[str, float] = field(default_factory=dict)
    first_pod: dict[str, float] = field(default_factory=dict)  # by RayCluster
    pod_added: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    pod_released: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    ready: dict[str, float] = field(default_factory=dict)
    window: Counter[str] | None = None  # counts changes while the steady window is open
    # the timeline, by RayCluster (= TSC) name, then pod name: every pod (head and workers)
    pod_seen: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    pod_scheduled: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    pod_ready: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    worker_released: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    reserved: dict[str, float] = field(default_factory=dict)  # first reservation of a holder
    # TSC status on the way to Ready: changes of .status and MODIFIED events seen
    tsc_status: dict[str, str] = field(default_factory=dict)
    status_changes: Counter[str] = field(default_factory=Counter)
    tsc_modified: Counter[str] = field(default_factory=Counter)

    def count(self, what: str) -> None:
        if self.window is not None:
            self.window[what] += 1

    def on_raycluster(self, kind: str, obj: Mapping[str, Any], t: float) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            if kind == "ADDED":
                self.rc_created.setdefault(name, t)
            if (obj.get("status") or {}).get("state") == "ready":
                self.ready.setdefault("rc/" + name, t)

    def on_pod(self, kind: str, obj: Mapping[str, Any], t: float) -> None:
        if kind not in ("ADDED", "MODIFIED"):
            return
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        spec = obj.get("spec") or {}
        with self.lock:
            cluster = labels.get(c.KUBERAY_LABEL_CLUSTER)
            if cluster:
                self.first_pod.setdefault(cluster, t)
                pod = meta["name"]
                self.pod_seen[cluster].setdefault(pod, t)
                if spec.get("nodeName"):
                    self.pod_scheduled[cluster].setdefault(pod, t)
                if any(
                    x.get("type") == "Ready" and x.get("status") == "True"
                    for x in (obj.get("status") or {}).get("conditions") or []
                ):
                    self.pod_ready[cluster].setdefault(pod, t)
            replica = labels.get(c.KUBERAY_LABEL_REPLICA_NAME)
            if labels.get(c.KUBERAY_LABEL_NODE_TYPE) != "worker" or not replica:
                return
            self.pod_added[replica].setdefault(meta["name"], t)
            gates = {g.get("name") for g in spec.get("schedulingGates") or []}
            if c.SCHEDULING_GATE not in gates and (spec.get("nodeSelector") or {}).get(
                c.NODE_LABEL_NODEPOOL
            ):
                self.pod_released[replica].setdefault(meta["name"], t)
                if cluster:
                    self.worker_released[cluster].setdefault(meta["name"], t)

    def on_tsc(self, kind: str, obj: Mapping[str, Any], t: float) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            self.count(f"tpusliceclusters {kind}")
            if "tsc/" + name not in self.ready:  # on the way to Ready (that change included)
                if kind == "MODIFIED":
                    self.tsc_modified[name] += 1
                status = json.dumps(obj.get("status") or {}, sort_keys=True)
                if status != self.tsc_status.get(name, "{}"):
                    self.status_changes[name] += 1
                self.tsc_status[name] = status
            for cond in (obj.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "Ready" and cond.get("status") == "True":
                    self.ready.setdefault("tsc/" + name, t)

    def on_reservation(self, kind: str, obj: Mapping[str, Any], t: float) -> None:
        holder = (obj.get("spec") or {}).get("holder") or {}
        with self.lock:
            self.count(f"slicereservations {kind}")
            if kind != "DELETED" and holder.get("namespace") == self.namespace:
                self.reserved.setdefault(holder.get("name", ""), t)

    def on_event(self, kind: str, obj: Mapping[str, Any], t: float) -> None:
        if obj.get("reportingComponent") == c.FIELD_MANAGER:
            with self.lock:
                self.count(f"events {kind}")

    def ready_count(self, prefix: str) -> int:
        with self.lock:
            return sum(1 for k in self.ready if k.startswith(prefix))

    def slice_release(self) -> list[float]:
        """Per complete slice: last pod released - last pod created (both as seen)."""
        with self.lock:
            out = []
            for replica, added in self.pod_added.items():
                released = self.pod_released.get(replica, {})
                if len(added) >= HOSTS and len(released) >= HOSTS:
                    out.append(max(0.0, max(released.values()) - max(added.values())))
            return out

    def timelines(
        self, items: Iterable[str], pods: int, workers: int
    ) -> dict[str, dict[str, float]]:
        """Per cluster, the first-seen time of each milestone (benchstats.OPERATOR_MILESTONES);
        a "last pod ..." milestone only once all ``pods`` (head included; ``workers`` of
        them released) reached it."""

        def last(seen: Mapping[str, float], need: int) -> float | None:
            return max(seen.values()) if len(seen) >= need and seen else None

        out: dict[str, dict[str, float]] = {}
        with self.lock:
            for name in items:
                times = {
                    "created": self.applied.get(name),
                    "rc_seen": self.rc_created.get(name),
                    "first_pod": self.first_pod.get(name),
                    "last_pod": last(self.pod_seen.get(name, {}), pods),
                    "reserved": self.reserved.get(name),
                    "released": last(self.worker_released.get(name, {}), workers),
                    "scheduled": last(self.pod_scheduled.get(name, {}), pods),
                    "pods_ready": last(self.pod_ready.get(name, {}), pods),
                    "rc_ready": self.ready.get("rc/" + name),
                    "tsc_ready": self.ready.get("tsc/" + name),
                }
                out[name] = {k: v for k, v in times.items() if v is not None}
        return out


@dataclass
class GangRecorder:
    """h: first-seen times per gang (TSC = RayCluster name) from the pod, TSC and
    SliceReservation watches of the gang run."""

    namespace: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    applied: dict[str, float] = field(default_factory=dict)  # create call returned
    first_pod: dict[str, float] = field(default_factory=dict)
    # gang -> replica -> pod -> first seen ungated and pinned
    released: dict[str, dict[str, dict[str, float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict))
    )
    ready: dict[str, float] = field(default_factory=dict)
    held: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    partial_since: dict[str, float] = field(default_factory=dict)
    longest_partial: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def on_pod(self, kind: str, obj: Mapping[str, Any], t: float) -> None:
        if kind not in ("ADDED", "MODIFIED"):
            return
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        gang = labels.get(c.KUBERAY_LABEL_CLUSTER)
        if not gang:
            return
        with self.lock:
            self.first_pod.setdefault(gang, t)
            replica = labels.get(c.KUBERAY_LABEL_REPLICA_NAME)
            if labels.get(c.KUBERAY_LABEL_NODE_TYPE) != "worker" or not replica:
                return
            spec = obj.get("spec") or {}
            gates = {g.get("name") for g in spec.get("schedulingGates") or []}
            if c.SCHEDULING_GATE not in gates and (spec.get("nodeSelector") or {}).get(
                c.NODE_LABEL_NODEPOOL
            ):
                self.released[gang][replica].setdefault(meta["name"], t)
                self._partial(gang, t)

    def on_tsc(self, kind: str, obj: Mapping[str, Any], t: float) -> None:
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                with self.lock:
                    self.ready.setdefault(obj["metadata"]["name"], t)

    def on_reservation(self, kind: str, obj: Mapping[str, Any], t: float) -> None:
        holder = (obj.get("spec") or {}).get("holder") or {}
        if holder.get("namespace") != self.namespace:
            return
        gang, pool = holder.get("name", ""), obj["spec"].get("nodePool", "")
        with self.lock:
            if kind == "DELETED":
                self.held[gang].discard(pool)
            else:
                self.held[gang].add(pool)
            self._partial(gang, t)

    def _partial(self, gang: str, t: float) -> None:
        """Track how long a gang holds some, not all, pools with no pod released (lock held)."""
        partial = 0 < len(self.held[gang]) < GANG_SLICES and not self.released.get(gang)
        if partial:
            self.partial_since.setdefault(gang, t)
        elif gang in self.partial_since:
            since = self.partial_since.pop(gang)
            self.longest_partial[gang] = max(self.longest_partial[gang], t - since)

    def figures(self) -> dict[str, Any]:
        """Per complete gang: first pod -> last slice released, and first -> last slice
        released (a slice is released when all its pods are)."""
        completion, spread = [], []
        with self.lock:
            for gang, replicas in self.released.items():
                done = [max(p.values()) for p in replicas.values() if len(p) >= GANG_HOSTS]
                if len(done) >= GANG_SLICES and gang in self.first_pod:
                    completion.append(max(0.0, max(done) - self.first_pod[gang]))
                    spread.append(max(done) - min(done))
            longest = max(self.longest_partial.values(), default=0.0)
        return {
            "first_pod_to_last_slice_released_s": summary(completion),
            "slice_release_spread_s": summary(spread),
            "longest_partial_hold_s": round(longest, 3),
        }


class Watch(threading.Thread):
    """A raw watch (JSON lines, no model classes) calling ``handler(type, object, t)``."""

    def __init__(
        self, api: Any, path: str, handler: Callable[[str, Any, float], None], **params: str
    ) -> None:
        super().__init__(daemon=True, name=f"watch {path}")
        self.api, self.path, self.handler, self.params = api, path, handler, params
        self.stopped = threading.Event()
        self.synced = threading.Event()
        self._response: Any = None

    def run(self) -> None:
        version = ""
        while not self.stopped.is_set():
            query = {"watch": "1", "timeoutSeconds": "600", **self.params}
            if version:
                query["resourceVersion"] = version
            try:
                self._response = self.api.rest_client.request(
                    "GET",
                    f"{self.api.configuration.host}{self.path}?{urlencode(query)}",
                    headers={"Accept": "application/json"},
                    _request_timeout=(10, 700),
                ).response  # the urllib3 response, not read yet: iterate its lines
                self.synced.set()
                for line in self._response:
                    t = time.monotonic()
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        version = ""  # expired: list again (first-seen times are kept)
                        break
                    version = event["object"]["metadata"].get("resourceVersion", version)
                    self.handler(event["type"], event["object"], t)
            except Exception:
                if self.stopped.is_set():
                    return
                time.sleep(0.5)

    def stop(self) -> None:
        self.stopped.set()
        if self._response is not None:
            with contextlib.suppress(Exception):
                self._response.shutdown()


def start_watches(api: Any, namespace: str, rec: Recorder, operator: bool) -> list[Watch]:
    ns = f"/namespaces/{namespace}"
    watches = [
        Watch(api, f"/apis/ray.io/v1{ns}/rayclusters", rec.on_raycluster),
        Watch(api, f"/api/v1{ns}/pods", rec.on_pod, labelSelector=c.KUBERAY_LABEL_CLUSTER),
    ]
    if operator:
        watches += [
            Watch(api, f"/apis/{c.GROUP}/{c.VERSION}{ns}/tpusliceclusters", rec.on_tsc),
            Watch(api, f"/apis/{c.GROUP}/{c.VERSION}/slicereservations", rec.on_reservation),
            Watch(api, f"/api/v1{ns}/events", rec.on_event),
        ]
    for w in watches:
        w.start()
    for w in watches:
        w.synced.wait(30)
    return watches
