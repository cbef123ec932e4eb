#!/usr/bin/env python3
"""`make bench [SCALE=small|medium|large]`: the operator next to KubeRay on the local cluster.

One run, one local simulated GKE cluster (etcd, kube-apiserver, scheduler,
controller-manager, KWOK, KubeRay), one fake v6e 4x4 node pool (4 nodes) per
TPUSliceCluster plus CPU nodes for the heads. In order:

  f. floor: create+delete ConfigMaps one at a time (bare API-server write latency);
  operator run: `tpuslice run` as a separate process with --metrics-port; every
     TPUSliceCluster (v6e 4x4, one slice) is created at once from a thread pool;
     watches (raw JSON lines, receive time taken on this machine's monotonic
     clock) record when each RayCluster, each pod, each release and each Ready
     condition was seen:
     a. TSC created -> RayCluster seen, next to KubeRay's RayCluster seen ->
        first pod seen, and the ratio of the two;
     b. last pod of a slice seen -> every pod of the slice seen ungated and pinned;
     c. first create -> every TSC Ready;
     e. then 60 s of steady state: the operator's API writes (POST/PUT/PATCH/DELETE from its
        /metrics, the leader's Lease renewals left out) and the TSC / SliceReservation /
        Event changes seen by watches;
     d. the operator's peak RSS (VmHWM) and CPU seconds from /proc;
     g. then a restart: the operator stopped and started again over the same
        clusters; seconds until healthy and until every cluster had a pass (its
        tpuslice_slices gauge is full), and its writes until then plus 30 s (the
        webhook configuration apply at start is one);
  direct run: the operator stopped and its webhook configuration deleted, the
     same RayClusters (rendered by tpuslice.render.kuberay, reservation policy None, so
     no gate) created directly; c. compares first create -> every RayCluster ready;
  gang run: h. gang completion time for multislice clusters under contention: the
     operator started again, G 2-slice TPUSliceClusters (v6e 2x4 on 4-chip hosts,
     gang AllSlices by default) created at once over P < 2G free v6e 2x4 pools, so
     at most P/2 gangs run at a time and the rest wait in the shape's queue; each
     gang is deleted as soon as it is Ready (released in turn), freeing its pools for
     the next. Per gang: first pod seen -> the gang's last slice seen released (all
     its pods ungated and pinned), p50/p99, which includes its time in the queue;
     first create -> every gang has been Ready; the spread between a gang's first
     and last slice released; the longest time a gang held some but not all of its
     pools with no pod released (from a watch on SliceReservations).

Both the operator run and the direct run also record a per-cluster timeline
(tpusim.benchstats.OPERATOR_MILESTONES: created, RayCluster seen, first and last
pod seen, reservation seen, last worker ungated and pinned, last pod scheduled,
last pod Ready, RayCluster ready, TSC Ready), printed as p50/p99 per milestone
since the cluster was created ("at") and since its previous milestone ("step"),
with the raw times in the run's folder (timeline-operator.json,
timeline-direct.json). The operator run adds: the identity webhook's admission
latency during the pod burst (p50/p99 from the
tpuslice_webhook_admission_duration_seconds buckets scraped before the first create
and after all Ready), status patches per cluster on the way to Ready (the operator's
PATCH tpusliceclusters/status count / clusters, and per cluster the status changes
and MODIFIED events its watch saw), and KubeRay's RayCluster -> first pod in the
operator run over the direct run's. With --profile[=HZ] py-spy samples the operator
from the first create until all Ready (profile-operator.txt: raw collapsed stacks,
which speedscope opens; profile-operator-summary.txt: CPU by thread, by module,
JSON decoding, top functions).

Prints a table and writes .bench/results-<scale>.json, then redraws
.bench/bench-scaling.svg from every results-<scale>.json present (`make bench-plot`
draws docs/bench-scaling.svg). Every wait is bounded; a phase that times out is
reported with what it reached, and the run goes on. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from kubernetes.client import ApiException
from prometheus_client.parser import text_string_to_metric_families

from tpusim import (
    ClusterSettings,
    CPUPool,
    LocalCluster,
    ToolPaths,
    TPUPool,
    benchstats,
    kube,
)
from tpusim.operator_process import OperatorProcess
from tpusim.processes import exit_on_signals
from tpuslice.model import constants as c
from tpuslice.render.kuberay import render_cluster

# The arithmetic lives in tpusim.benchstats (pure, unit-tested); these names stay here.
percentile, summary, ratio = benchstats.percentile, benchstats.summary, benchstats.ratio

REPO = Path(__file__).resolve().parents[1]
HOSTS = 4  # v6e 4x4: 4 hosts of 4 chips
WEBHOOK_CONFIG = "tpuslice-identity"


@dataclass(frozen=True)
class Scale:
    clusters: int
    timeout_s: float  # bound of each wait (all Ready, all gone)
    apply_threads: int = 8
    gangs: int = 8  # h: 2-slice TSCs competing for ...
    gang_pools: int = 4  # ... this many v6e 2x4 pools (fewer than 2 per gang)


SCALES = {
    "small": Scale(clusters=25, timeout_s=300, gangs=8, gang_pools=4),
    "medium": Scale(clusters=200, timeout_s=900, gangs=40, gang_pools=10),
    "large": Scale(clusters=1000, timeout_s=900, gangs=100, gang_pools=20),
}
#: Taints a node carries until the node lifecycle controller has seen it Ready.
NODE_LIFECYCLE_TAINTS = frozenset(
    {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.cloudprovider.kubernetes.io/uninitialized",
    }
)
GANG_SLICES, GANG_HOSTS = 2, 2  # h: v6e 2x4 slices of 2 hosts with 4 chips each


# ---------------------------------------------------------------- watches
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


# ---------------------------------------------------------------- objects
def tsc(name: str, gated: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "tpu": {"type": "v6e", "topology": "4x4", "slices": 1},
        "ray": {"version": "2.54.0"},
        "head": {"resources": {"cpu": "1", "memory": "2Gi"}},
        "worker": {"resources": {"cpu": "4", "memory": "16Gi"}},
    }
    if not gated:
        spec["reservation"] = {"policy": "None"}
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND_CLUSTER,
        "metadata": {"name": name},
        "spec": spec,
    }


def wait_watching(core: Any, custom: Any, timeout_s: float = 120) -> float:
    """Wait until the operator reconciles a new TPUSliceCluster, and return how long that
    took. /readyz is about our own watches and the webhook; kopf starts watching
    TPUSliceClusters after that, and TSCs created before its watch is up are handled
    from its first listing, all at once: in one small run every TSC created in the
    first 170 ms was first seen by kopf 0.83 s later, which figure a then counted as
    the operator's. A suspended canary (KubeRay makes no pods for it) in a namespace
    of its own is created, its status waited for, and deleted."""
    ns, name = "bench-canary", "canary"
    make_namespace(core, ns)
    body = tsc(name)
    body["spec"]["suspend"] = True
    began = time.monotonic()
    custom.create_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_CLUSTER, body)

    def reconciled() -> bool:
        obj = custom.get_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_CLUSTER, name)
        return bool((obj.get("status") or {}).get("observedGeneration"))

    kube.wait_for(reconciled, timeout_s=timeout_s, what="the operator's first pass (canary)")
    seconds = time.monotonic() - began
    custom.delete_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_CLUSTER, name)

    def gone() -> bool:
        try:
            custom.get_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_CLUSTER, name)
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    kube.wait_for(gone, timeout_s=timeout_s, what="the canary TSC gone")
    return seconds


def gang_tsc(name: str) -> dict[str, Any]:
    """h: a multislice TSC; spec.reservation.gang is left to its default (AllSlices)."""
    body = tsc(name)
    body["spec"]["tpu"] = {"type": "v6e", "topology": "2x4", "chipsPerHost": 4}
    body["spec"]["tpu"]["slices"] = GANG_SLICES
    return body


def names(n: int) -> list[str]:
    return [f"b{i:04d}" for i in range(n)]


def create_all(
    create: Callable[[str], None], items: list[str], threads: int, rec: Recorder | GangRecorder
) -> float:
    """Create every item from a thread pool; return the monotonic time of the first call."""
    began = time.monotonic()

    def one(name: str) -> None:
        for attempt in range(5):
            try:
                create(name)
                break
            except Exception:
                if attempt == 4:
                    raise
                time.sleep(1)
        with rec.lock:
            rec.applied[name] = time.monotonic()

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, items))
    return began


# ---------------------------------------------------------------- the operator process
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE"}  # not GET, LIST, WATCH
#: The leader's Lease renewals (a PUT every 2 s) are a heartbeat, not work: not counted.
NOT_WORK = {"leases"}


def operator_metrics(operator: OperatorProcess) -> dict[str, Any]:
    """API writes by verb/resource and the counters of the operator's /metrics."""
    out: dict[str, Any] = {"writes": 0.0, "requests": {}}
    for family in text_string_to_metric_families(operator.metrics_text()):
        for s in family.samples:
            if s.name == "tpuslice_api_requests_total":
                out["requests"][f"{s.labels['verb']} {s.labels['resource']}"] = s.value
                if s.labels["verb"] in WRITE_VERBS and s.labels["resource"] not in NOT_WORK:
                    out["writes"] += s.value
            elif s.name.endswith(("_sum", "_count", "_total")) and not s.labels.get("le"):
                key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()))
                out[key] = s.value
    return out


# ---------------------------------------------------------------- phases
def slices_reported(operator: OperatorProcess) -> int:
    """Slices in the operator's tpuslice_slices gauge: a cluster is in it after its first
    pass since the process started."""
    return int(
        sum(
            s.value
            for family in text_string_to_metric_families(operator.metrics_text())
            for s in family.samples
            if s.name == "tpuslice_slices"
        )
    )


def restart(operator: OperatorProcess, scale: Scale, slices: int, quiet_s: float) -> dict[str, Any]:
    """g. Stop the operator and start it again over the Ready clusters: how long until it
    has reconciled every one (kopf's and our watches' listing included), and whether
    that restart writes anything (a level-based reconcile over unchanged state should not)."""
    print("  g: restarting the operator", flush=True)
    operator.stop()
    began = time.monotonic()
    operator.start(timeout_s=scale.timeout_s)
    healthy = time.monotonic() - began
    ok, _ = wait_count(
        "slices reported after restart", lambda: slices_reported(operator), slices, scale.timeout_s
    )
    reconciled = time.monotonic() - began
    time.sleep(quiet_s)
    metrics = operator_metrics(operator)
    return {
        "healthy_seconds": round(healthy, 2),
        "all_reconciled": ok,
        "reconciled_seconds": round(reconciled, 2),
        "quiet_seconds": quiet_s,
        "writes": metrics["writes"],
        "write_requests": {
            k: v for k, v in metrics["requests"].items() if k.split()[0] in WRITE_VERBS
        },
        "proc": operator.proc_stats(),
    }


def wait_count(
    what: str, current: Callable[[], int], target: int, timeout_s: float
) -> tuple[bool, float]:
    """Poll until ``current() >= target`` (or, for a target of 0, until it is 0: things
    left to go); (reached, seconds waited). Prints progress."""
    began = time.monotonic()
    last_print = 0.0
    while True:
        n = current()
        now = time.monotonic()
        if (n <= 0) if target == 0 else (n >= target):
            return True, now - began
        shown = f"{n} left" if target == 0 else f"{n}/{target}"
        if now - began > timeout_s:
            print(f"  ! {what}: {shown} after {timeout_s:.0f}s, going on", flush=True)
            return False, now - began
        if now - last_print > 30:
            print(f"  {what}: {shown} ({now - began:.0f}s)", flush=True)
            last_print = now
        time.sleep(0.5)


def floor(core: Any, namespace: str, count: int = 50) -> dict[str, Any]:
    creates, deletes = [], []
    for i in range(count):
        body = {"metadata": {"name": f"floor-{i}"}, "data": {"k": "v"}}
        t = time.perf_counter()
        core.create_namespaced_config_map(namespace, body, _preload_content=False)
        creates.append(time.perf_counter() - t)
        t = time.perf_counter()
        core.delete_namespaced_config_map(f"floor-{i}", namespace, _preload_content=False)
        deletes.append(time.perf_counter() - t)
    return {"create_s": summary(creates), "delete_s": summary(deletes)}


def body(response: Any) -> Any:
    """JSON of a ``_preload_content=False`` answer (a RESTResponse or a urllib3 response)."""
    data = response.read() if hasattr(response, "response") else response.data
    return json.loads(data)


def make_namespace(core: Any, name: str) -> None:
    core.create_namespace({"metadata": {"name": name}})
    kube.wait_for(
        lambda: bool(core.list_namespaced_service_account(name).items),
        timeout_s=60,
        what=f"service account in {name}",
    )


def count_pods(core: Any, namespace: str) -> int:
    r = core.list_namespaced_pod(namespace, _preload_content=False, limit=10000)
    return len(body(r)["items"])


def delete_and_wait(core: Any, custom: Any, namespace: str, plural: str, timeout_s: float) -> bool:
    """Delete every object one by one from a thread pool (a single deletecollection of
    1,000 objects outlived the API server's request timeout) and wait for their pods."""
    group, version = (c.GROUP, c.VERSION) if plural == "tpusliceclusters" else ("ray.io", "v1")
    listed = custom.list_namespaced_custom_object(group, version, namespace, plural)
    names = [item["metadata"]["name"] for item in listed.get("items") or []]

    def one(name: str) -> None:
        with contextlib.suppress(Exception):  # already gone, or retried by the wait below
            custom.delete_namespaced_custom_object(
                group, version, namespace, plural, name, _preload_content=False
            )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))
    ok, _ = wait_count(
        f"pods of {namespace} gone",
        lambda: count_pods(core, namespace),
        0,
        timeout_s,
    )
    return ok


def operator_run(
    cluster: LocalCluster,
    scale: Scale,
    steady_s: float,
    run_dir: Path,
    result: dict[str, Any],
    profile_rate: int = 0,
    gated: bool = True,
) -> None:
    """Fill ``result`` as figures come in, so an interrupted run still reports them.
    With ``profile_rate`` (Hz) py-spy samples the operator from the first create until
    every TSC is Ready (or the bound). ``gated`` False (``--ungated``): the TSCs say
    ``reservation.policy: None``, so the operator renders and the identity webhook admits,
    but no gate, no reservation and no pod patch: what the guarantee costs on top."""
    core, custom = kube.core_v1(cluster.api), custom_api(cluster.api)
    ns = "bench-operator"
    make_namespace(core, ns)
    operator = OperatorProcess(
        cluster.kubeconfig,
        run_dir / "logs" / "operator.log",
        extra_args=("--log-level=WARNING",),
        cwd=REPO,
    )
    operator.start()
    result["canary_seconds"] = round(wait_watching(core, custom), 2)
    rec, items = Recorder(namespace=ns), names(scale.clusters)
    profiler: Profiler | None = None
    try:
        watches = start_watches(cluster.api, ns, rec, operator=True)
        webhook_before = webhook_buckets(operator)
        apiserver_before = apiserver_webhook_buckets(cluster.api)
        if profile_rate:
            assert operator.proc is not None
            profiler = Profiler(operator.proc.pid, run_dir / "profile-operator.txt", profile_rate)
            profiler.start()
        print(f"  creating {len(items)} TPUSliceClusters", flush=True)
        began = create_all(
            lambda n: custom.create_namespaced_custom_object(
                c.GROUP, c.VERSION, ns, c.PLURAL_CLUSTER, tsc(n, gated), _preload_content=False
            ),
            items,
            scale.apply_threads,
            rec,
        )
        result["create_seconds"] = round(time.monotonic() - began, 2)
        ok, _ = wait_count(
            "TPUSliceClusters Ready", lambda: rec.ready_count("tsc/"), len(items), scale.timeout_s
        )
        with rec.lock:
            ready_times = [t for k, t in rec.ready.items() if k.startswith("tsc/")]
        result["all_ready"] = ok
        result["ready"] = len(ready_times)
        result["ready_seconds"] = round(max(ready_times) - began, 2) if ready_times else None
        if profiler is not None:
            result["profile"] = profiler.stop()
            profiler = None
        result.update(latencies(rec, items))
        result["proc_after_ready"] = operator.proc_stats()
        before = operator_metrics(operator)
        result["webhook_admission"] = webhook_figures(webhook_before, webhook_buckets(operator))
        result["webhook_admission_apiserver"] = webhook_figures(
            apiserver_before, apiserver_webhook_buckets(cluster.api)
        )
        result.update(status_patch_figures(rec, items, before))
        result["timeline"] = timeline(rec, items, raw_path=run_dir / "timeline-operator.json")
        with rec.lock:
            rec.window = Counter()
        print(f"  steady state: {steady_s:.0f}s", flush=True)
        time.sleep(steady_s)
        with rec.lock:
            seen, rec.window = dict(rec.window or {}), None
        after = operator_metrics(operator)
        result["steady"] = {
            "seconds": steady_s,
            "operator_writes": after["writes"] - before["writes"],
            "operator_requests": {
                k: v - before["requests"].get(k, 0)
                for k, v in after["requests"].items()
                if v != before["requests"].get(k, 0)
            },
            "changes_seen_by_watches": seen,
        }
        result["proc"] = operator.proc_stats()
        result["operator_metrics"] = after
        result["restart"] = restart(operator, scale, len(items), min(steady_s, 30.0))
        for w in watches:
            w.stop()
        print("  deleting TPUSliceClusters", flush=True)
        result["teardown_complete"] = delete_and_wait(
            core, custom, ns, c.PLURAL_CLUSTER, scale.timeout_s
        )
        wait_count(
            "reservations released",
            lambda: len(
                custom.list_cluster_custom_object(c.GROUP, c.VERSION, c.PLURAL_RESERVATION)["items"]
            ),
            0,
            120,
        )
    finally:
        if profiler is not None:
            with contextlib.suppress(Exception):
                result["profile"] = profiler.stop()
        if "tsc_to_raycluster_s" not in result:  # interrupted: report what was reached
            result.update(latencies(rec, items), ready=rec.ready_count("tsc/"))
            result["timeline"] = timeline(rec, items, raw_path=run_dir / "timeline-operator.json")
        if "proc" not in result:
            with contextlib.suppress(Exception):
                result["proc"] = operator.proc_stats()
        operator.stop()
        delete_webhook_configuration(cluster)


def latencies(rec: Recorder, items: list[str]) -> dict[str, Any]:
    with rec.lock:
        to_rc = [rec.rc_created[n] - rec.applied[n] for n in items if n in rec.rc_created]
        to_pod = [rec.first_pod[n] - rec.rc_created[n] for n in items if n in rec.first_pod]
    a, k = summary(to_rc), summary(to_pod)
    return {
        "tsc_to_raycluster_s": a,
        "raycluster_to_first_pod_s": k,
        "ratio_p50": ratio(a["p50"], k["p50"]),
        "ratio_p99": ratio(a["p99"], k["p99"]),
        "slice_release_s": summary(rec.slice_release()),
    }


def timeline(
    rec: Recorder,
    items: list[str],
    milestones: tuple[benchstats.Milestone, ...] = benchstats.OPERATOR_MILESTONES,
    raw_path: Path | None = None,
) -> list[dict[str, Any]]:
    """The per-cluster timeline summarised per milestone (p50/p99 "at" and "step");
    the raw per-cluster times (seconds since created) go to ``raw_path``."""
    per_cluster = rec.timelines(items, pods=1 + HOSTS, workers=HOSTS)
    if raw_path is not None:
        with contextlib.suppress(OSError):
            raw_path.parent.mkdir(parents=True, exist_ok=True)
            raw_path.write_text(
                json.dumps(
                    {
                        n: {k: round(t - times["created"], 4) for k, t in times.items()}
                        for n, times in per_cluster.items()
                        if "created" in times
                    },
                    indent=1,
                )
                + "\n"
            )
    return benchstats.timeline_summary(per_cluster, milestones)


WEBHOOK_HISTOGRAM = "tpuslice_webhook_admission_duration_seconds"


def webhook_buckets(operator: OperatorProcess) -> dict[float, float]:
    """The identity webhook's admission histogram (every result label summed)."""
    return benchstats.histogram_buckets(
        (
            (s.name, s.labels, s.value)
            for family in text_string_to_metric_families(operator.metrics_text())
            for s in family.samples
        ),
        WEBHOOK_HISTOGRAM,
    )


#: The API server's own view of each webhook call: the round trip (TLS, the request,
#: our server's threads and the handler), by webhook name, operation and type.
APISERVER_WEBHOOK_HISTOGRAM = "apiserver_admission_webhook_admission_duration_seconds"


def apiserver_webhook_buckets(api: Any) -> dict[float, float]:
    """The API server's admission latency histogram of our identity webhook (all
    operations; {} when /metrics cannot be read)."""
    try:
        response = api.rest_client.request(
            "GET",
            f"{api.configuration.host}/metrics",
            headers={"Accept": "text/plain"},
            _request_timeout=(10, 60),
        )
        if response.status != 200:
            return {}
        text = response.read().decode()
    except Exception:
        return {}
    return benchstats.histogram_buckets(
        benchstats.text_samples(text, APISERVER_WEBHOOK_HISTOGRAM),
        APISERVER_WEBHOOK_HISTOGRAM,
        where={"name": f"identity.{c.GROUP}", "type": "admit"},
    )


def webhook_figures(before: Mapping[float, float], after: Mapping[float, float]) -> dict[str, Any]:
    """Admission latency (time in the handler, in-process) of the calls between two scrapes:
    p50/p99 from the buckets, interpolated, and the bucket bound each falls in."""
    delta = benchstats.histogram_delta(before, after)
    return {
        "p50": benchstats.bucket_quantile(delta, 0.50),
        "p99": benchstats.bucket_quantile(delta, 0.99),
        "count": benchstats.bucket_quantile(delta, 0.99)["count"],
        "buckets": {str(le): n for le, n in delta.items()},
    }


def status_patch_figures(
    rec: Recorder, items: list[str], metrics: Mapping[str, Any]
) -> dict[str, Any]:
    """Status patches per cluster on the way to Ready: the operator's own count (mean over
    the clusters) and, per cluster, the status changes and MODIFIED events the TSC watch
    saw until its Ready (kopf's annotation and finalizer patches are MODIFIED events too)."""
    patches = metrics.get("requests", {}).get("PATCH tpusliceclusters/status", 0.0)
    with rec.lock:
        changes = [float(rec.status_changes[n]) for n in items if "tsc/" + n in rec.ready]
        modified = [float(rec.tsc_modified[n]) for n in items if "tsc/" + n in rec.ready]
    return {
        "status_patches": patches,
        "status_patches_per_cluster": round(patches / len(items), 2) if items else None,
        "status_changes_seen_per_cluster": summary(changes),
        "tsc_modified_seen_per_cluster": summary(modified),
    }


class Profiler:
    """py-spy attached to a running process (``record --nonblocking``: the target is not
    paused to sample, so the run's timings move less), raw collapsed stacks with thread
    names; ``stop`` ends it and summarises the file (tpusim.benchstats.profile_summary)."""

    def __init__(self, pid: int, out: Path, rate_hz: int) -> None:
        self.pid, self.out, self.rate_hz = pid, out, rate_hz
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def binary() -> str | None:
        beside = Path(sys.executable).with_name("py-spy")
        return str(beside) if beside.exists() else shutil.which("py-spy")

    def start(self) -> None:
        binary = self.binary()
        if binary is None:
            print("  ! --profile: py-spy not found (make install installs it)", flush=True)
            return
        self.out.parent.mkdir(parents=True, exist_ok=True)
        with open(self.out.with_suffix(".log"), "wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    "record",
                    f"--pid={self.pid}",
                    f"--rate={self.rate_hz}",
                    "--format=raw",
                    "--threads",
                    "--nonblocking",
                    f"--output={self.out}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        print(f"  profiling the operator (py-spy, {self.rate_hz} Hz) -> {self.out}", flush=True)

    def stop(self) -> dict[str, Any] | None:
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if not self.out.exists():
            print(f"  ! py-spy wrote nothing; see {self.out.with_suffix('.log')}", flush=True)
            return None
        with open(self.out) as f:
            s = benchstats.profile_summary(f, rate_hz=self.rate_hz)
        report = self.out.with_name(self.out.stem + "-summary.txt")
        report.write_text(benchstats.profile_report(s) + "\n")
        return {
            "raw": str(self.out),
            "summary": str(report),
            **{k: s[k] for k in ("samples", "rate_hz", "cpu_seconds_est")},
            **{k: s[k] for k in ("by_thread", "self_by_module", "inclusive_by_module")},
            **{k: s[k] for k in ("json_decode_share", "json_encode_share", "top_self")},
        }


def direct_run(cluster: LocalCluster, scale: Scale, run_dir: Path | None = None) -> dict[str, Any]:
    core, custom = kube.core_v1(cluster.api), custom_api(cluster.api)
    ns = "bench-direct"
    make_namespace(core, ns)
    rec = Recorder()
    watches = start_watches(cluster.api, ns, rec, operator=False)
    items = names(scale.clusters)

    def create(name: str) -> None:
        body = render_cluster({**tsc(name, gated=False), "metadata": {"name": name}})
        body["metadata"]["namespace"] = ns
        custom.create_namespaced_custom_object(
            "ray.io", "v1", ns, "rayclusters", body, _preload_content=False
        )

    print(f"  creating {len(items)} RayClusters directly", flush=True)
    began = create_all(create, items, scale.apply_threads, rec)
    ok, _ = wait_count(
        "RayClusters ready", lambda: rec.ready_count("rc/"), len(items), scale.timeout_s
    )
    with rec.lock:
        ready_times = [t for k, t in rec.ready.items() if k.startswith("rc/")]
        to_pod = [rec.first_pod[n] - rec.rc_created[n] for n in items if n in rec.first_pod]
    for w in watches:
        w.stop()
    result = {
        "all_ready": ok,
        "ready": len(ready_times),
        "ready_seconds": round(max(ready_times) - began, 2) if ready_times else None,
        "raycluster_to_first_pod_s": summary(to_pod),
        "timeline": timeline(
            rec,
            items,
            benchstats.DIRECT_MILESTONES,
            run_dir / "timeline-direct.json" if run_dir else None,
        ),
    }
    print("  deleting RayClusters", flush=True)
    result["teardown_complete"] = delete_and_wait(core, custom, ns, "rayclusters", 300)
    return result


def delete_webhook_configuration(cluster: LocalCluster) -> None:
    """The webhook refuses our pods while its configuration points at a stopped operator."""
    subprocess.run(
        [
            str(ToolPaths.for_repo(REPO).binary("kubectl")),
            f"--kubeconfig={cluster.kubeconfig}",
            "delete",
            "mutatingwebhookconfiguration",
            WEBHOOK_CONFIG,
            "--ignore-not-found",
        ],
        capture_output=True,
        timeout=60,
    )


def gang_run(cluster: LocalCluster, scale: Scale, run_dir: Path, result: dict[str, Any]) -> None:
    """h. ``scale.gangs`` 2-slice TSCs at once over ``scale.gang_pools`` v6e 2x4 pools;
    each deleted as soon as it is Ready. Fills ``result`` as figures come in."""
    core, custom = kube.core_v1(cluster.api), custom_api(cluster.api)
    ns = "bench-gangs"
    make_namespace(core, ns)
    gang_pools = [
        TPUPool(f"gang-{i:04d}", "v6e", "2x4", nodes=GANG_HOSTS) for i in range(scale.gang_pools)
    ]
    result.update(gangs=scale.gangs, slices=GANG_SLICES, pools=len(gang_pools))
    print(f"  adding {len(gang_pools)} v6e 2x4 pools", flush=True)
    nodes = [n for p in gang_pools for n in kube.create_pool(cluster.api, p)]
    kube.wait_nodes_ready(cluster.api, nodes, timeout_s=300)
    operator = OperatorProcess(
        cluster.kubeconfig,
        run_dir / "logs" / "operator-gangs.log",
        extra_args=("--log-level=WARNING",),
        cwd=REPO,
    )
    operator.start()
    rec, items = GangRecorder(ns), [f"g{i:04d}" for i in range(scale.gangs)]
    prefix = f"/apis/{c.GROUP}/{c.VERSION}"
    pods_path = f"/api/v1/namespaces/{ns}/pods"
    watches = [
        Watch(cluster.api, pods_path, rec.on_pod, labelSelector=c.KUBERAY_LABEL_CLUSTER),
        Watch(cluster.api, f"{prefix}/namespaces/{ns}/tpusliceclusters", rec.on_tsc),
        Watch(cluster.api, f"{prefix}/slicereservations", rec.on_reservation),
    ]
    try:
        for w in watches:
            w.start()
        for w in watches:
            w.synced.wait(30)
        print(
            f"  creating {len(items)} TPUSliceClusters of {GANG_SLICES} slices over "
            f"{len(gang_pools)} pools",
            flush=True,
        )
        began = create_all(
            lambda n: custom.create_namespaced_custom_object(
                c.GROUP, c.VERSION, ns, c.PLURAL_CLUSTER, gang_tsc(n), _preload_content=False
            ),
            items,
            scale.apply_threads,
            rec,
        )
        deleted: set[str] = set()
        deadline, last_print = time.monotonic() + scale.timeout_s, time.monotonic()
        while len(deleted) < len(items):
            with rec.lock:
                done = [n for n in items if n in rec.ready and n not in deleted]
            for name in done:  # released in turn: its pools go to the next in the queue
                with contextlib.suppress(Exception):
                    custom.delete_namespaced_custom_object(
                        c.GROUP, c.VERSION, ns, c.PLURAL_CLUSTER, name, _preload_content=False
                    )
                deleted.add(name)
            now = time.monotonic()
            if now > deadline:
                with rec.lock:  # who holds what when the queue stopped moving
                    held = {g: sorted(p) for g, p in rec.held.items() if p and g not in deleted}
                result["held_at_bound"] = held
                print(
                    f"  ! gangs Ready: {len(deleted)}/{len(items)} at the bound; holding: {held}",
                    flush=True,
                )
                break
            if now - last_print > 30:
                print(
                    f"  gangs Ready: {len(deleted)}/{len(items)} ({now - began:.0f}s)", flush=True
                )
                last_print = now
            time.sleep(0.2)
        with rec.lock:
            ready_times = list(rec.ready.values())
        result["all_ready"] = len(deleted) == len(items)
        result["ready"] = len(ready_times)
        result["all_ready_seconds"] = round(max(ready_times) - began, 2) if ready_times else None
        result.update(rec.figures())
        result["proc"] = operator.proc_stats()
        print("  deleting the rest", flush=True)
        result["teardown_complete"] = delete_and_wait(
            core, custom, ns, c.PLURAL_CLUSTER, scale.timeout_s
        )
    finally:
        if "first_pod_to_last_slice_released_s" not in result:
            result.update(rec.figures(), ready=len(rec.ready))
        for w in watches:
            w.stop()
        operator.stop()
        delete_webhook_configuration(cluster)
        for pool in gang_pools:
            with contextlib.suppress(Exception):
                kube.delete_pool(cluster.api, pool.name, timeout_s=120)


def custom_api(api: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api)


# ---------------------------------------------------------------- setup and report
def pools(clusters: int) -> list[Any]:
    heads_per_node = 14  # 16-CPU nodes, 1-CPU heads
    return [TPUPool(f"v6e-{i:04d}", "v6e", "4x4", nodes=HOSTS) for i in range(clusters)] + [
        CPUPool("cpu", nodes=clusters // heads_per_node + 2)
    ]


def add_pools(cluster: LocalCluster, wanted: list[Any]) -> int:
    with ThreadPoolExecutor(8) as pool:
        created = [
            n
            for chunk in pool.map(lambda p: kube.create_pool(cluster.api, p), wanted)
            for n in chunk
        ]
    core = kube.core_v1(cluster.api)

    def ready() -> int:
        r = core.list_node(_preload_content=False)
        return sum(
            1
            for n in body(r)["items"]
            if any(
                x["type"] == "Ready" and x["status"] == "True"
                for x in n.get("status", {}).get("conditions") or []
            )
            and not any(
                t.get("key") in NODE_LIFECYCLE_TAINTS for t in n.get("spec", {}).get("taints") or []
            )
        )

    # Ready is not yet schedulable: the node lifecycle controller takes the not-ready
    # taint off on its next round (--node-monitor-period, 5 s). Measured from Ready
    # alone, the operator run (the first) had every head pod unschedulable for its
    # first ~5 s ("103 node(s) had untolerated taint") and the direct run did not.
    wait_count("nodes Ready and untainted", ready, len(created), 600)
    return len(created)


def machine() -> dict[str, Any]:
    mem_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    versions = dict(
        line.split("=", 1)
        for line in (REPO / "hack/versions.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kib / 2**20, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        **versions,
    }


def fmt(value: Any, unit: str = "s") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}{unit}" if unit else f"{value:.2f}"
    return f"{value}{unit}"


def fmt_ms(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "+Inf"
    return f"{value * 1000:.1f}ms"


def table(r: Mapping[str, Any]) -> str:
    op, direct, fl = r.get("operator", {}), r.get("direct", {}), r.get("floor", {})
    a, k = op.get("tsc_to_raycluster_s", {}), op.get("raycluster_to_first_pod_s", {})
    b = op.get("slice_release_s", {})
    proc = op.get("proc", op.get("proc_after_ready", {}))
    steady = op.get("steady", {})
    restarted = op.get("restart", {})
    kr, wh = r.get("kuberay_first_pod_ratio") or {}, op.get("webhook_admission") or {}
    wa = op.get("webhook_admission_apiserver") or {}
    sc = op.get("status_changes_seen_per_cluster") or {}
    md = op.get("tsc_modified_seen_per_cluster") or {}
    om = op.get("operator_metrics") or {}
    rows = [
        ("scale", f"{r['clusters']} TSCs, {r['nodes']} nodes, {r['clusters'] * HOSTS} workers"),
        (
            "f  API write floor (ConfigMap create) p50/p99",
            f"{fmt(fl.get('create_s', {}).get('p50'))} / {fmt(fl.get('create_s', {}).get('p99'))}",
        ),
        (
            "a  TSC created -> RayCluster seen p50/p99 (n)",
            f"{fmt(a.get('p50'))} / {fmt(a.get('p99'))} ({a.get('n')})",
        ),
        (
            "   KubeRay: RayCluster -> first pod p50/p99 (n)",
            f"{fmt(k.get('p50'))} / {fmt(k.get('p99'))} ({k.get('n')})",
        ),
        (
            "   ratio p50 / p99 (target <= 1.0)",
            f"{fmt(op.get('ratio_p50'), '')} / {fmt(op.get('ratio_p99'), '')}",
        ),
        (
            "b  last pod -> slice released p50/p99 (n)",
            f"{fmt(b.get('p50'))} / {fmt(b.get('p99'))} ({b.get('n')})",
        ),
        (
            "c  all Ready: operator / direct",
            f"{fmt(op.get('ready_seconds'))} ({op.get('ready')}) / "
            f"{fmt(direct.get('ready_seconds'))} ({direct.get('ready')})",
        ),
        ("   overhead ratio", fmt(r.get("overhead_ratio"), "")),
        (
            "   KubeRay RayCluster -> first pod, operator/direct run p50/p99",
            f"{fmt(kr.get('p50'), '')} / {fmt(kr.get('p99'), '')}",
        ),
        (
            "   webhook admission in the burst p50/p99, handler (n; bucket)",
            f"{fmt_ms(wh.get('p50', {}).get('value'))} / {fmt_ms(wh.get('p99', {}).get('value'))} "
            f"({fmt(wh.get('count'), '')}; p99 <= {fmt_ms(wh.get('p99', {}).get('le'))})",
        ),
        (
            "   webhook admission in the burst p50/p99, API server's view",
            f"{fmt_ms(wa.get('p50', {}).get('value'))} / {fmt_ms(wa.get('p99', {}).get('value'))} "
            f"({fmt(wa.get('count'), '')}; p99 <= {fmt_ms(wa.get('p99', {}).get('le'))})",
        ),
        (
            "   status patches per TSC to Ready (metrics); watch p50/max",
            f"{fmt(op.get('status_patches_per_cluster'), '')}; status changes "
            f"{fmt(sc.get('p50'), '')}/{fmt(sc.get('max'), '')}, MODIFIED "
            f"{fmt(md.get('p50'), '')}/{fmt(md.get('max'), '')}",
        ),
        (
            "   claims: SliceReservation creates sent / lost to another claimant",
            f"{fmt(om.get('requests', {}).get('POST slicereservations'), '')} / "
            f"{fmt(om.get('tpuslice_claims_lost_total'), '')}",
        ),
        (
            "d  operator peak RSS / CPU seconds",
            f"{fmt(proc.get('peak_rss_mib'), ' MiB')} / {fmt(proc.get('cpu_seconds'))}",
        ),
        (
            f"e  operator API writes in {fmt(steady.get('seconds'))} steady state",
            f"{fmt(steady.get('operator_writes'), '')}; watches saw "
            f"{steady.get('changes_seen_by_watches')}",
        ),
        (
            "g  restart: healthy / every cluster reconciled",
            f"{fmt(restarted.get('healthy_seconds'))} / {fmt(restarted.get('reconciled_seconds'))}",
        ),
        (
            "   restart: writes until reconciled + quiet, RSS",
            f"{fmt(restarted.get('writes'), '')} (+{fmt(restarted.get('quiet_seconds'))}); "
            f"{fmt(restarted.get('proc', {}).get('peak_rss_mib'), ' MiB')}",
        ),
    ]
    gangs = r.get("gangs", {})
    if gangs:
        h = gangs.get("first_pod_to_last_slice_released_s", {})
        spread = gangs.get("slice_release_spread_s", {})
        rows += [
            (
                "h  gangs: first pod -> last slice released p50/p99 (n)",
                f"{fmt(h.get('p50'))} / {fmt(h.get('p99'))} ({h.get('n')})",
            ),
            (
                f"   {gangs.get('gangs')} gangs of {gangs.get('slices')} over "
                f"{gangs.get('pools')} pools: all Ready",
                f"{fmt(gangs.get('all_ready_seconds'))} ({gangs.get('ready')})",
            ),
            (
                "   slices' release spread p50/p99; longest partial hold",
                f"{fmt(spread.get('p50'))} / {fmt(spread.get('p99'))}; "
                f"{fmt(gangs.get('longest_partial_hold_s'))}",
            ),
        ]
    width = max(len(x) for x, _ in rows)
    return "\n".join(f"{x:<{width}}  {y}" for x, y in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="small")
    parser.add_argument("--clusters", type=int, default=None, help="override the scale's count")
    parser.add_argument("--steady-seconds", type=float, default=60.0)
    parser.add_argument("--skip-direct", action="store_true")
    parser.add_argument("--skip-gangs", action="store_true", help="skip h (the gang run)")
    parser.add_argument("--gangs", type=int, default=None, help="h: override the gang count")
    parser.add_argument(
        "--gang-pools", type=int, default=None, help="h: override the v6e 2x4 pool count"
    )
    parser.add_argument(
        "--profile",
        nargs="?",
        type=int,
        const=100,
        default=0,
        metavar="HZ",
        help="sample the operator with py-spy (default 100 Hz) from the first create until "
        "every TSC is Ready; raw stacks and a summary in the run's folder (the sampler "
        "takes CPU from the same cores: a profiled run's timings are not comparable)",
    )
    parser.add_argument(
        "--ungated",
        action="store_true",
        help="the operator run's TSCs with reservation.policy None (rendering and the identity "
        "webhook, no gate, reservation or pod patch): the reservation's own cost, by "
        "difference with a normal run; results-<scale>-ungated.json, not plotted",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="PATH",
        help="only draw the figures against scale from .bench/results-*.json into PATH "
        "(.svg or .png; make bench-plot) and exit",
    )
    args = parser.parse_args()
    out_dir = REPO / ".bench"
    if args.plot:
        return plot(out_dir, args.plot)
    scale = SCALES[args.scale]
    scale = replace(
        scale,
        clusters=args.clusters or scale.clusters,
        gangs=args.gangs or scale.gangs,
        gang_pools=args.gang_pools or scale.gang_pools,
    )
    run_dir = out_dir / f"run-{args.scale}-{time.strftime('%Y%m%d-%H%M%S')}"
    exit_on_signals()
    result: dict[str, Any] = {
        "scale": args.scale,
        "clusters": scale.clusters,
        "machine": machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run_dir": str(run_dir),
        "profiled": bool(args.profile),
        "ungated": bool(args.ungated),
    }
    began = time.monotonic()
    cluster = LocalCluster(ClusterSettings(tools=ToolPaths.for_repo(REPO), run_dir=run_dir))
    try:
        print(f"starting the local cluster in {run_dir}", flush=True)
        cluster.start()
        kubectl = [
            str(ToolPaths.for_repo(REPO).binary("kubectl")),
            f"--kubeconfig={cluster.kubeconfig}",
        ]
        crds = [a for p in sorted((REPO / "crds").glob("*.yaml")) for a in ("-f", str(p))]
        subprocess.run([*kubectl, "apply", "--server-side", *crds], check=True, capture_output=True)
        subprocess.run(
            [*kubectl, "wait", "--for=condition=Established", "--timeout=60s", *crds],
            check=True,
            capture_output=True,
        )
        print(f"adding {scale.clusters} v6e 4x4 pools", flush=True)
        t = time.monotonic()
        result["nodes"] = add_pools(cluster, pools(scale.clusters))
        result["nodes_seconds"] = round(time.monotonic() - t, 1)
        core = kube.core_v1(cluster.api)
        make_namespace(core, "bench-floor")
        print("f: API write floor", flush=True)
        result["floor"] = floor(core, "bench-floor")
        print("operator run", flush=True)
        operator_run(
            cluster,
            scale,
            args.steady_seconds,
            run_dir,
            result.setdefault("operator", {}),
            profile_rate=args.profile,
            gated=not args.ungated,
        )
        if not args.skip_direct:
            print("direct run (no operator)", flush=True)
            result["direct"] = direct_run(cluster, scale, run_dir)
            result["overhead_ratio"] = ratio(
                result["operator"].get("ready_seconds"), result["direct"].get("ready_seconds")
            )
            op_k = result["operator"].get("raycluster_to_first_pod_s", {})
            direct_k = result["direct"].get("raycluster_to_first_pod_s", {})
            result["kuberay_first_pod_ratio"] = {
                q: ratio(op_k.get(q), direct_k.get(q)) for q in ("p50", "p99")
            }
        if not args.skip_gangs:
            print("h: gang run (multislice clusters under contention)", flush=True)
            gang_run(cluster, scale, run_dir, result.setdefault("gangs", {}))
    except BaseException as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(f"bench stopped: {result['error']}", flush=True)
    finally:
        cluster.stop()
        result["wall_seconds"] = round(time.monotonic() - began, 1)
        result.setdefault("nodes", scale.clusters * HOSTS)
        out_dir.mkdir(exist_ok=True)
        # a profiled run's timings are not comparable: it keeps out of the plot's file
        suffix = ("-profiled" if args.profile else "") + ("-ungated" if args.ungated else "")
        path = out_dir / f"results-{args.scale}{suffix}.json"
        path.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print()
        print(table(result))
        print()
        print("timeline per cluster (at: since created; step: since the latest row above it)")
        print(
            benchstats.timeline_table(
                result.get("operator", {}).get("timeline") or [],
                (result.get("direct") or {}).get("timeline") or [],
            )
        )
        profile = result.get("operator", {}).get("profile")
        if profile:
            print(f"\nprofile (py-spy): {profile['summary']}")
            for row in profile["by_thread"]:
                print(f"  {100 * row['share']:5.1f}%  {row['name']}")
            print(f"  {100 * profile['json_decode_share']:5.1f}%  JSON decoding (any thread)")
        print(f"\nJSON: {path}")
        with contextlib.suppress(Exception):  # matplotlib missing: the table is enough
            benchstats.write_plot(benchstats.load_results(out_dir), out_dir / "bench-scaling.svg")
            print(f"plot of every scale's results: {out_dir / 'bench-scaling.svg'}")
    return 1 if "error" in result else 0


def plot(results_dir: Path, path: Path) -> int:
    results = benchstats.load_results(results_dir)
    if not results:
        print(f"no results-<scale>.json in {results_dir}: run make bench first", file=sys.stderr)
        return 1
    benchstats.write_plot(results, path)
    scales = ", ".join(f"{r.get('scale')} ({r['clusters']})" for r in results)
    print(f"{path}: {scales}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
