"""Figures read off the operator and the API server: the operator's /metrics (API
writes, the identity webhook's admission histogram, slices reported), the
per-cluster latencies and timeline from a Recorder, the API server's view of the
webhook, py-spy's profile of the operator, and the machine the run was on."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench import operator_api as c
from bench.scenario import HOSTS, REPO
from bench.watches import Recorder
from tpusim import benchstats
from tpusim.benchstats import ratio, summary
from tpusim.operator_process import OperatorProcess
from tpusim.processes import cpu_seconds

WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE"}  # not GET, LIST, WATCH
#: The same in ``apiserver_request_total``, whose verbs also name a server-side apply
#: and a delete of a collection.
APISERVER_WRITE_VERBS = WRITE_VERBS | {"APPLY", "DELETECOLLECTION"}
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
            for family in text_string_to_metric_families(
                operator.metrics_text(operator.webhook_metrics_port or None)
            )
            for s in family.samples
        ),
        WEBHOOK_HISTOGRAM,
    )


#: The API server's own view of each webhook call: the round trip (TLS, the request,
#: our server's threads and the handler), by webhook name, operation and type.
APISERVER_WEBHOOK_HISTOGRAM = "apiserver_admission_webhook_admission_duration_seconds"


def apiserver_metrics(api: Any) -> str:
    """The API server's /metrics scrape ("" when it cannot be read)."""
    try:
        response = api.rest_client.request(
            "GET",
            f"{api.configuration.host}/metrics",
            headers={"Accept": "text/plain"},
            _request_timeout=(10, 60),
        )
        if response.status != 200:
            return ""
        return str(response.read().decode())
    except Exception:
        return ""


def apiserver_webhook_buckets(api: Any) -> dict[float, float]:
    """The API server's admission latency histogram of our identity webhook (all
    operations; {} when /metrics cannot be read)."""
    text = apiserver_metrics(api)
    if not text:
        return {}
    return benchstats.histogram_buckets(
        benchstats.text_samples(text, APISERVER_WEBHOOK_HISTOGRAM),
        APISERVER_WEBHOOK_HISTOGRAM,
        where={"name": f"identity.{c.GROUP}", "type": "admit"},
    )


def apiserver_requests(api: Any) -> dict[str, float]:
    """Requests the API server has served, by "VERB resource[/subresource]", from its
    ``apiserver_request_total`` counter (every client's: the operator's, kopf's,
    KubeRay's, the scheduler's, the kubelets', this benchmark's)."""
    out: dict[str, float] = {}
    for _name, labels, value in benchstats.text_samples(
        apiserver_metrics(api), "apiserver_request_total{"
    ):
        sub = labels.get("subresource", "")
        key = f"{labels.get('verb', '')} {labels.get('resource', '')}{'/' + sub if sub else ''}"
        out[key] = out.get(key, 0.0) + value
    return out


def request_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, int]:
    """What was served between two ``apiserver_requests``, largest first (WATCH and
    LIST and GET included)."""
    delta = {k: int(v - before.get(k, 0.0)) for k, v in after.items()}
    return dict(sorted(((k, v) for k, v in delta.items() if v > 0), key=lambda kv: -kv[1]))


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
    passes = sum(v for k, v in metrics.items() if k.startswith("tpuslice_reconciles_total{"))
    pass_seconds = sum(
        v for k, v in metrics.items() if k.startswith("tpuslice_reconcile_duration_seconds_sum{")
    )
    return {
        "status_patches": patches,
        "status_patches_per_cluster": round(patches / len(items), 2) if items else None,
        "status_changes_seen_per_cluster": summary(changes),
        "tsc_modified_seen_per_cluster": summary(modified),
        # every pass since start, of any kind: the TSCs are the only objects of the run
        "passes_per_cluster": round(passes / len(items), 2) if items else None,
        "pass_mean_seconds": round(pass_seconds / passes, 4) if passes else None,
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


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, all) CPU seconds of the machine since boot, summed over its CPUs: the
    ``cpu`` line of ``/proc/stat`` (proc(5)); idle and iowait are the not-busy part."""
    line = Path("/proc/stat").read_text().splitlines()[0].split()
    ticks = [int(v) for v in line[1:9]]  # user nice system idle iowait irq softirq steal
    idle = ticks[3] + ticks[4]
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - idle) / hz, sum(ticks) / hz


class CpuWindow:
    """The CPU seconds each component of a run spent in a window, and how busy the whole
    machine was: whether a run is bound by the machine's cores (then every CPU second a
    component adds stretches everyone's time), and who spent them.

    ``pids``: component name -> its processes (one name may stand for several, e.g.
    two KWOK processes); a process gone by ``stop`` counts up to its last reading."""

    def __init__(self, pids: Mapping[str, list[int]]) -> None:
        self.pids = {name: list(each) for name, each in pids.items()}
        self.began = time.monotonic()
        self.machine = machine_cpu_seconds()
        self.start_cpu = {
            pid: cpu_seconds(pid) or 0.0 for each in self.pids.values() for pid in each
        }

    def stop(self) -> dict[str, Any]:
        wall = time.monotonic() - self.began
        busy0, all0 = self.machine
        busy1, all1 = machine_cpu_seconds()
        spent: dict[str, float] = {}
        for name, each in self.pids.items():
            total = 0.0
            for pid in each:
                now = cpu_seconds(pid)
                if now is not None:
                    total += max(0.0, now - self.start_cpu[pid])
            spent[name] = round(total, 1)
        busy = busy1 - busy0
        return {
            "wall_seconds": round(wall, 1),
            "machine_busy_seconds": round(busy, 1),
            "machine_busy_share": round(busy / (all1 - all0), 3) if all1 > all0 else None,
            "by_component": dict(sorted(spent.items(), key=lambda kv: -kv[1])),
            "others": round(max(0.0, busy - sum(spent.values())), 1),
        }
