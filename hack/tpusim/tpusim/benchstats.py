"""The arithmetic of `make bench` (hack/bench), pure and unit-tested without a cluster.

- percentiles and summaries of latencies (nearest rank);
- per-cluster timelines: the first-seen time of each milestone of one cluster (TSC
  created, RayCluster seen, first and last pod seen, reservation seen, pods ungated
  and pinned, scheduled, Ready, RayCluster ready, TSC Ready) summarised as p50/p99
  per milestone, both since the cluster was created ("at") and since the previous
  milestone of the same cluster ("step"), and printed side by side for the
  operator run and the direct run;
- quantiles of a Prometheus histogram from its cumulative buckets (the delta of two
  scrapes, as ``histogram_quantile`` computes it), for the webhook's admission
  latency during the pod burst;
- the summary of a py-spy profile in its raw (collapsed stack) format: samples by
  thread group, by the module of the innermost frame, inclusive shares (kopf, our
  code, JSON decoding) and the top functions;
- the series of the scaling plot (figures against the number of clusters, from the
  .bench/results-<scale>.json files) and the plot itself (matplotlib, imported only
  when a plot is written).

Like the rest of tpusim it never imports the operator: the benchmark hands it
plain times and texts.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DIRECT_MILESTONES",
    "OPERATOR_MILESTONES",
    "PANELS",
    "Milestone",
    "Panel",
    "bucket_quantile",
    "histogram_buckets",
    "histogram_delta",
    "load_results",
    "percentile",
    "plot_series",
    "profile_report",
    "profile_summary",
    "ratio",
    "summary",
    "text_samples",
    "timeline_summary",
    "timeline_table",
    "write_plot",
]


# ---------------------------------------------------------------- statistics
def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    data = sorted(values)
    if not data:
        return None
    rank = max(1, math.ceil(q / 100 * len(data)))
    return data[rank - 1]


def summary(values: Iterable[float]) -> dict[str, Any]:
    data = list(values)
    return {
        "n": len(data),
        "p50": percentile(data, 50),
        "p99": percentile(data, 99),
        "max": max(data) if data else None,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


# ---------------------------------------------------------------- timelines
@dataclass(frozen=True)
class Milestone:
    key: str
    label: str


#: The milestones of one TPUSliceCluster in the operator run, in the order they are
#: expected; every time is the benchmark's first sight of it (a watch event's receive
#: time, or the create call's return for ``created``).
OPERATOR_MILESTONES = (
    Milestone("created", "created (TSC / RayCluster create returned)"),
    Milestone("rc_seen", "RayCluster seen"),
    Milestone("first_pod", "first pod seen (admitted)"),
    Milestone("last_pod", "last pod seen (all admitted)"),
    Milestone("reserved", "reservation seen"),
    Milestone("released", "last worker ungated + pinned"),
    Milestone("scheduled", "last pod scheduled (nodeName)"),
    Milestone("pods_ready", "last pod Ready"),
    Milestone("rc_ready", "RayCluster ready"),
    Milestone("tsc_ready", "TSC Ready"),
)
#: The direct run's RayClusters have no TSC, reservation or gate.
DIRECT_MILESTONES = tuple(
    m for m in OPERATOR_MILESTONES if m.key not in ("reserved", "released", "tsc_ready")
)


def timeline_summary(
    timelines: Mapping[str, Mapping[str, float]], milestones: Sequence[Milestone]
) -> list[dict[str, Any]]:
    """Per milestone: how many clusters reached it, p50/p99 of its time since the
    cluster's ``created`` ("at") and since the latest of the cluster's earlier
    milestones ("step": how long it came after everything listed before it; negative
    when it came first, e.g. a reservation claimed before the last pod was seen)."""
    at: dict[str, list[float]] = {m.key: [] for m in milestones}
    step: dict[str, list[float]] = {m.key: [] for m in milestones}
    for times in timelines.values():
        start = times.get(milestones[0].key)
        if start is None:
            continue
        previous = start
        for m in milestones:
            t = times.get(m.key)
            if t is None:
                continue
            at[m.key].append(t - start)
            step[m.key].append(t - previous)
            previous = max(previous, t)
    return [
        {
            "key": m.key,
            "label": m.label,
            "n": len(at[m.key]),
            "at_s": summary(at[m.key]),
            "step_s": summary(step[m.key]),
        }
        for m in milestones
    ]


def _secs(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if abs(value) < 1 else f"{value:.2f}s"


def timeline_table(
    operator: Sequence[Mapping[str, Any]], direct: Sequence[Mapping[str, Any]] = ()
) -> str:
    """The operator's and the direct run's timeline summaries side by side."""
    rows = [("", "operator: at p50/p99", "step p50/p99", "direct: at p50/p99", "step p50/p99")]
    by_key = {row["key"]: row for row in direct}
    for row in operator:
        other = by_key.get(row["key"])
        cells = [row["label"] + f" ({row['n']})"]
        for r in (row, other):
            if r is None or not r["n"]:
                cells += ["-", "-"]
                continue
            cells += [
                f"{_secs(r['at_s']['p50'])} / {_secs(r['at_s']['p99'])}",
                f"{_secs(r['step_s']['p50'])} / {_secs(r['step_s']['p99'])}",
            ]
        rows.append((cells[0], cells[1], cells[2], cells[3], cells[4]))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    )


# ---------------------------------------------------------------- histograms
def histogram_buckets(
    samples: Iterable[tuple[str, Mapping[str, str], float]],
    name: str,
    where: Mapping[str, str] | None = None,
) -> dict[float, float]:
    """Cumulative bucket counts of histogram ``name`` by upper bound (``le``), summed over
    its other labels (only samples whose labels include ``where``), from (sample name,
    labels, value) triples of a /metrics scrape."""
    out: dict[float, float] = {}
    for sample, labels, value in samples:
        if sample != f"{name}_bucket" or "le" not in labels:
            continue
        if where and any(labels.get(k) != v for k, v in where.items()):
            continue
        le = float(labels["le"])  # "+Inf" -> inf
        out[le] = out.get(le, 0.0) + value
    return dict(sorted(out.items()))


_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def text_samples(text: str, prefix: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of the samples in a Prometheus text scrape whose name starts
    with ``prefix``; a few lines of one metric out of a large scrape (the API server's,
    megabytes), without the strictness of a full parser: other lines are not read."""
    out = []
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"') for k, v in _LABEL.findall(m.group("labels") or "")}
        out.append((m.group("name"), labels, value))
    return out


def histogram_delta(
    before: Mapping[float, float], after: Mapping[float, float]
) -> dict[float, float]:
    """The observations between two scrapes of the same histogram."""
    return {le: after[le] - before.get(le, 0.0) for le in sorted(after)}


def bucket_quantile(buckets: Mapping[float, float], q: float) -> dict[str, Any]:
    """Quantile q (0..1) of cumulative buckets, interpolated linearly within the bucket
    as Prometheus' ``histogram_quantile`` does (``value``), and the upper bound of that
    bucket (``le``: the quantile is at most this). In the +Inf bucket the value is the
    largest finite bound. None for no observations."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return {"count": 0, "value": None, "le": None}
    rank = q * total
    lower, below = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                finite = [b for b in bounds if not math.isinf(b)]
                return {"count": total, "value": finite[-1] if finite else None, "le": le}
            inside = count - below
            value = lower + (le - lower) * ((rank - below) / inside if inside else 1.0)
            return {"count": total, "value": value, "le": le}
        lower, below = le, count
    return {"count": total, "value": None, "le": None}  # not reached: +Inf holds total


# ---------------------------------------------------------------- py-spy profiles
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]*)(?::(?P<line>\d+))?\)$")
_THREAD = re.compile(r"^thread \((?P<id>[^)]*)\)(?:: (?P<name>.*))?$")

#: Module of a frame, by the first match in its file's path.
MODULE_GROUPS = (
    ("/json/", "json"),
    ("/kopf/", "kopf"),
    ("/tpuslice/", "tpuslice (ours)"),
    ("/kubernetes/", "kubernetes client"),
    ("/urllib3/", "urllib3"),
    ("/aiohttp/", "aiohttp"),
    ("/yarl/", "aiohttp"),
    ("/multidict/", "aiohttp"),
    ("/asyncio/", "asyncio"),
    ("/prometheus_client/", "prometheus_client"),
    ("/jsonpatch", "jsonpatch"),
    ("/jsonpointer", "jsonpatch"),
    ("/jsonschema", "jsonschema"),
    ("/yaml/", "yaml"),
    ("/logging/", "logging"),
    ("/copy.py", "copy (deepcopy)"),
    ("/ssl.py", "sockets + TLS"),
    ("/socket.py", "sockets + TLS"),
    ("/selectors.py", "sockets + TLS"),
    ("/socketserver.py", "http.server"),
    ("/http/", "http.server"),
    ("/threading.py", "threading"),
)


def module_of(path: str) -> str:
    p = "/" + path.replace("\\", "/")
    for needle, group in MODULE_GROUPS:
        if needle in p:
            return group
    return "other"


def thread_group(name: str, frames: Sequence[str]) -> str:
    """The operator's threads (named in tpuslice.main.app, follow, kube, webhook, election);
    the webhook's per-request threads are http.server's, known by their stack."""
    if name == "kopf":
        return "kopf loop (kopf + our passes)"
    if name.startswith("watch-"):
        return "our watches"
    if name.startswith("kube_"):  # tpuslice.runtime.kube's executor: every API call of a pass
        return "our API calls (kube threads)"
    if name == "identity-webhook" or any("process_request_thread" in f for f in frames):
        return "webhook threads"
    if name.startswith("lease-"):
        return "leader election"
    if name == "MainThread":
        return "main"
    return "other threads"


def _split(line: str) -> tuple[list[str], int] | None:
    line = line.strip()
    if not line or " " not in line:
        return None
    stack, _, count = line.rpartition(" ")
    try:
        n = int(count)
    except ValueError:
        return None
    return stack.split(";"), n


def profile_summary(
    collapsed: Iterable[str], *, rate_hz: float = 100.0, top: int = 15
) -> dict[str, Any]:
    """Summarise py-spy's raw output (``--format raw --threads``: one line per stack,
    frames ``func (file:line)`` separated by ``;`` after a ``thread (id): name`` frame,
    then a count). py-spy leaves out threads it finds idle, but with ``--nonblocking``
    many stacks still end in a blocking call (a socket read, a selector, a queue or
    condition wait): those are counted as ``waiting`` (per thread group) and left out
    of every other split, so the rest is about the CPU time; samples / rate of it is
    about CPU seconds."""
    waiting = 0
    waiting_by_thread: Counter[str] = Counter()
    total = 0
    by_thread: Counter[str] = Counter()
    by_thread_module: dict[str, Counter[str]] = {}
    self_module: Counter[str] = Counter()
    inclusive_module: Counter[str] = Counter()
    self_func: Counter[str] = Counter()
    inclusive_func: Counter[str] = Counter()
    json_decode = json_encode = 0
    for line in collapsed:
        parsed = _split(line)
        if parsed is None:
            continue
        frames, n = parsed
        name = ""
        if frames and (m := _THREAD.match(frames[0])):
            name = m.group("name") or ""
            frames = frames[1:]
        if frames and frames[0].startswith("process "):  # --subprocesses
            frames = frames[1:]
        parsed_frames = []
        for f in frames:
            fm = _FRAME.match(f)
            func, path = (fm.group("func"), fm.group("file")) if fm else (f, "")
            parsed_frames.append((func, path))
        group = thread_group(name, frames)
        if parsed_frames and _waits(*parsed_frames[-1]):
            waiting += n
            waiting_by_thread[group] += n
            continue
        total += n
        by_thread[group] += n
        leaf_module = module_of(parsed_frames[-1][1]) if parsed_frames else "other"
        by_thread_module.setdefault(group, Counter())[leaf_module] += n
        self_module[leaf_module] += n
        if parsed_frames:
            func, path = parsed_frames[-1]
            self_func[f"{func} ({_short(path)})"] += n
        for mod in {module_of(path) for _, path in parsed_frames} - {"threading", "other"}:
            inclusive_module[mod] += n
        for key in {f"{func} ({_short(path)})" for func, path in parsed_frames}:
            inclusive_func[key] += n
        if _in_json(parsed_frames, "decoder.py", ("loads", "load")):
            json_decode += n
        elif _in_json(parsed_frames, "encoder.py", ("dumps", "dump")):
            json_encode += n

    def share(counter: Counter[str]) -> list[dict[str, Any]]:
        return [
            {"name": k, "samples": v, "share": round(v / total, 4) if total else 0.0}
            for k, v in counter.most_common()
        ]

    everything = total + waiting
    return {
        "samples": total,
        "waiting_samples": waiting,
        "waiting_share": round(waiting / everything, 4) if everything else 0.0,
        "waiting_by_thread": [
            {"name": k, "samples": v, "share": round(v / everything, 4)}
            for k, v in waiting_by_thread.most_common()
        ],
        "rate_hz": rate_hz,
        "cpu_seconds_est": round(total / rate_hz, 2) if rate_hz else None,
        "by_thread": share(by_thread),
        "by_thread_module": {
            g: share(c)[:6]
            for g, c in sorted(by_thread_module.items(), key=lambda x: -by_thread[x[0]])
        },
        "self_by_module": share(self_module),
        "inclusive_by_module": share(inclusive_module),
        "json_decode_share": round(json_decode / total, 4) if total else 0.0,
        "json_encode_share": round(json_encode / total, 4) if total else 0.0,
        "top_self": share(self_func)[:top],
        "top_inclusive": share(inclusive_func)[:top],
    }


#: Innermost frames that block (the last part of the function's name, and the file):
#: a thread sampled there waits for the network, a lock, a queue or a timer.
_WAITS = {
    ("select", "selectors.py"),
    ("poll", "selectors.py"),
    ("read", "ssl.py"),
    ("recv", "ssl.py"),
    ("recv_into", "ssl.py"),
    ("readinto", "socket.py"),
    ("accept", "socket.py"),
    ("wait", "threading.py"),
    ("_wait_for_tstate_lock", "threading.py"),
    ("_worker", "concurrent/futures/thread.py"),  # idle executor thread: queue.get
    ("get", "queue.py"),
    ("sleep", ""),
}


def _waits(func: str, path: str) -> bool:
    name, p = func.rsplit(".", 1)[-1], path.replace("\\", "/")
    return any(name == w and p.endswith(f) for w, f in _WAITS)


def _in_json(frames: Sequence[tuple[str, str]], module: str, entries: tuple[str, ...]) -> bool:
    """A frame in json/<module>, or a call of one of json's ``entries`` (loads, dumps)."""
    for func, path in frames:
        p = path.replace("\\", "/")
        if p.endswith("json/" + module):
            return True
        if p.endswith("json/__init__.py") and func.rsplit(".", 1)[-1] in entries:
            return True
    return False


def _short(path: str) -> str:
    """A frame's file without the site-packages or repository prefix."""
    p = path.replace("\\", "/")
    for marker in ("site-packages/", "/operator/", "/lib/python3."):
        if marker in p:
            tail = p.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker == "/lib/python3." and "/" in tail else tail
    return p


def profile_report(s: Mapping[str, Any]) -> str:
    """A few screens of text from ``profile_summary``."""

    def pct(x: float) -> str:
        return f"{100 * x:5.1f}%"

    out = [
        f"samples on CPU: {s['samples']} at {s['rate_hz']:.0f} Hz (~{s['cpu_seconds_est']} CPU s);"
        f" left out as waiting in a blocking call: {s['waiting_samples']}"
        f" ({pct(s['waiting_share']).strip()} of all samples)",
    ]
    out += [f"  waiting {pct(r['share'])}  {r['name']}" for r in s["waiting_by_thread"]]
    out += ["", "on CPU, by thread (and the innermost frame's module):"]
    for row in s["by_thread"]:
        out.append(f"  {pct(row['share'])}  {row['name']}")
        for mod in s["by_thread_module"].get(row["name"], []):
            share = mod["samples"] / s["samples"] if s["samples"] else 0.0
            out.append(f"           {pct(share)}  {mod['name']}")
    out += ["", "self time by module:"]
    out += [f"  {pct(r['share'])}  {r['name']}" for r in s["self_by_module"]]
    out += ["", "inclusive (stacks through the module at any depth; they overlap):"]
    out += [f"  {pct(r['share'])}  {r['name']}" for r in s["inclusive_by_module"]]
    out += [
        f"  {pct(s['json_decode_share'])}  JSON decoding (json.loads anywhere)",
        f"  {pct(s['json_encode_share'])}  JSON encoding",
        "",
        "top functions, self:",
    ]
    out += [f"  {pct(r['share'])}  {r['name']}" for r in s["top_self"]]
    out += ["", "top functions, inclusive:"]
    out += [f"  {pct(r['share'])}  {r['name']}" for r in s["top_inclusive"]]
    return "\n".join(out)


# ---------------------------------------------------------------- the scaling plot
@dataclass(frozen=True)
class Panel:
    title: str
    #: (series label, path into a results JSON); the first path found is used, so an
    #: older results file can name the same figure by another key
    series: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...]
    factor: float = 1.0  # unit of the plot: 1000 for milliseconds
    target: float | None = None  # the design's target, drawn as a dashed line
    #: a figure about every cluster of a run (all Ready): no point for a run that hit
    #: its bound, where it would be the time of the few that got there
    every_cluster: bool = False


PANELS = (
    Panel(
        "c. all Ready (s)",
        (
            ("operator", (("operator", "ready_seconds"),)),
            ("direct", (("direct", "ready_seconds"),)),
        ),
        every_cluster=True,
    ),
    Panel(
        "operator run / direct run",
        (
            ("c. all Ready", (("overhead_ratio",),)),
            ("KubeRay RayCluster -> first pod p50", (("kuberay_first_pod_ratio", "p50"),)),
        ),
        target=1.15,
    ),
    Panel(
        "a. TSC created -> RayCluster seen (s)",
        (
            ("p50", (("operator", "tsc_to_raycluster_s", "p50"),)),
            ("p99", (("operator", "tsc_to_raycluster_s", "p99"),)),
        ),
        target=0.10,
    ),
    Panel(
        "KubeRay: RayCluster -> first pod, p50 (s)",
        (
            ("operator run", (("operator", "raycluster_to_first_pod_s", "p50"),)),
            ("direct run", (("direct", "raycluster_to_first_pod_s", "p50"),)),
        ),
    ),
    Panel(
        "b. last pod -> slice released (ms)",
        (
            ("p50", (("operator", "slice_release_s", "p50"),)),
            ("p99", (("operator", "slice_release_s", "p99"),)),
        ),
        factor=1000.0,
        target=100.0,
    ),
    Panel(
        "webhook admission during the burst (ms)",
        (
            ("p99 in the handler", (("operator", "webhook_admission", "p99", "value"),)),
            ("p50 in the handler", (("operator", "webhook_admission", "p50", "value"),)),
            (
                "p99 as the API server timed it",
                (("operator", "webhook_admission_apiserver", "p99", "value"),),
            ),
        ),
        factor=1000.0,
        target=10.0,
    ),
    Panel(
        "status patches per cluster to Ready",
        (
            (
                "PATCH tpusliceclusters/status",
                (
                    ("operator", "status_patches_per_cluster"),
                    # results written before the figure existed: the run's total
                    ("operator", "operator_metrics", "requests", "PATCH tpusliceclusters/status"),
                ),
            ),
        ),
        target=3.0,
    ),
    Panel(
        "d. operator peak RSS (MiB)",
        (("peak RSS", (("operator", "proc", "peak_rss_mib"),)),),
        target=160.0,
    ),
    Panel(
        "g. restart (s)",
        (
            ("every cluster had a pass", (("operator", "restart", "reconciled_seconds"),)),
            ("ready", (("operator", "restart", "healthy_seconds"),)),
        ),
        target=10.0,
    ),
)


def _dig(data: Any, path: Sequence[str]) -> float | None:
    for key in path:
        if not isinstance(data, Mapping) or key not in data:
            return None
        data = data[key]
    if isinstance(data, bool) or not isinstance(data, int | float) or math.isinf(data):
        return None
    return float(data)


def load_results(directory: Path) -> list[dict[str, Any]]:
    """The results-<scale>.json files present, smallest first (unreadable ones,
    profiled and memtraced runs, whose timings the sampler or tracemalloc moved, and
    ``--ungated`` and ``--pin-at-admission`` runs, which measure another workload or
    setting, skipped)."""
    out = []
    for path in directory.glob("results-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        skipped = ("profiled", "memtraced", "ungated", "pinned")
        if not isinstance(data, dict) or any(data.get(k) for k in skipped):
            continue
        if isinstance(data.get("clusters"), int) and data["clusters"] > 0:
            out.append(data)
    return sorted(out, key=lambda r: (r["clusters"], str(r.get("scale"))))


def _value(result: Mapping[str, Any], paths: Sequence[Sequence[str]]) -> float | None:
    for i, path in enumerate(paths):
        v = _dig(result, path)
        if v is not None:
            # a fallback path names a run's total where the figure is per cluster
            return v / result["clusters"] if i and path[-1].startswith("PATCH ") else v
    return None


def _hit_bound(result: Mapping[str, Any], run: str) -> bool:
    """The run (``operator``, ``direct``) ended at its bound with some cluster not Ready."""
    data = result.get(run)
    return isinstance(data, Mapping) and data.get("all_ready") is False


def plot_series(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per panel of ``PANELS``: its series as (clusters, value) points (a run without the
    figure leaves no point) and its target; then, per run, the timeline's p50 "at" of
    each milestone."""
    panels = []
    for panel in PANELS:
        lines = []
        for label, paths in panel.series:
            points = [
                (int(r["clusters"]), v * panel.factor)
                for r in results
                if not (panel.every_cluster and _hit_bound(r, paths[0][0]))
                and (v := _value(r, paths)) is not None
            ]
            lines.append({"label": label, "points": points})
        panels.append({"title": panel.title, "series": lines, "target": panel.target})
    for run in ("operator", "direct"):
        lines = []
        for m in OPERATOR_MILESTONES[1:]:
            points = []
            for r in results:
                rows = (r.get(run) or {}).get("timeline") or []
                row = next((x for x in rows if x.get("key") == m.key), None)
                v = _dig(row, ("at_s", "p50")) if row else None
                if v is not None:
                    points.append((int(r["clusters"]), v))
            if points:
                lines.append({"label": m.label.split(" (")[0], "points": points})
        panels.append(
            {"title": f"{run} run: p50 time since created (s)", "series": lines, "target": None}
        )
    return panels


def write_plot(results: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Draw ``plot_series(results)`` as one figure (SVG or PNG by the suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "tpuslice-bench"  # stable ids: diffs stay small
    panels = plot_series(results)
    cols = 3
    rows = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 4.6, rows * 3.2), squeeze=False)
    ticks = sorted({int(r["clusters"]) for r in results})
    names = {int(r["clusters"]): str(r.get("scale", "")) for r in results}
    for ax, panel in zip(axes.flat, panels, strict=False):
        for line in panel["series"]:
            if line["points"]:
                xs, ys = zip(*line["points"], strict=True)
                ax.plot(xs, ys, marker="o", label=line["label"])
        if panel["target"] is not None:
            ax.axhline(panel["target"], color="grey", linestyle="--", linewidth=1, label="target")
        ax.set_title(panel["title"], fontsize=9)
        ax.set_xscale("log")
        ax.set_xlim(ticks[0] / 1.8, ticks[-1] * 1.8)
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{names[t]}\n{t}" for t in ticks], fontsize=7)
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(True, alpha=0.3)
        if any(line["points"] for line in panel["series"]):
            ax.legend(fontsize=6)
        else:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    machine: Mapping[str, Any] = next(
        (r["machine"] for r in results if isinstance(r.get("machine"), Mapping)), {}
    )
    fig.suptitle(
        "make bench: figures against the number of TPUSliceClusters "
        f"({machine.get('nproc', '?')} CPUs, {machine.get('cpu', '')}); x: clusters",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None)
    plt.close(fig)
    return path
