"""`make bench` starts, and its watch handlers, figures and table on made-up events.

The entry is the folder hack/bench: `python hack/bench` puts hack/bench on sys.path, not
hack/ (where the folder hack/tpusim once shadowed the installed tpusim as an empty
namespace package, and the benchmark failed before it began)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.measure import (
    CpuWindow,
    request_delta,
    status_patch_figures,
    timeline,
    webhook_figures,
)
from bench.report import fmt_ms, table, writes
from bench.scenario import HOSTS
from bench.watches import Recorder

REPO = Path(__file__).resolve().parents[3]


def _recipe(target: str) -> str:
    recipe = re.search(rf"^{target}:.*\n\t(.+)$", (REPO / "Makefile").read_text(), re.M)
    assert recipe is not None
    return recipe.group(1)


def test_make_bench_runs_the_folder() -> None:
    assert _recipe("bench").startswith("$(PY) hack/bench --scale $(SCALE)")


def test_the_bench_imports_without_the_operator_and_answers_help() -> None:
    """Every module of the benchmark is imported before --help answers (cli imports the
    runs, which import the rest); -X importtime lists each import on stderr."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "hack/bench", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "--scale" in done.stdout and "--plot PATH" in done.stdout
    assert "--pin-at-admission" in done.stdout
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()]
    assert "bench.runs" in imported and "tpusim" in imported
    assert not [m for m in imported if m.split(".")[0] == "tpuslice"]


# ---------------------------------------------------------------- the recorder's timeline
# The benchmark's watch handlers fed with made-up events. The labels and the gate are
# written out here (what KubeRay and the operator put on a pod), not taken from
# bench.operator_api, so a wrong name there fails here.
GATE = "tpuslice.dev/slice-reservation"


def _pod(
    name: str,
    cluster: str,
    worker: bool,
    gated: bool = False,
    pool: str = "",
    node: str = "",
    ready: bool = False,
) -> dict[str, Any]:
    labels = {"ray.io/cluster": cluster, "ray.io/node-type": "worker" if worker else "head"}
    if worker:
        labels["ray.io/worker-group-replica-name"] = f"{cluster}-tpu-x"
    spec: dict[str, Any] = {}
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    if pool:
        spec["nodeSelector"] = {"cloud.google.com/gke-nodepool": pool}
    if node:
        spec["nodeName"] = node
    status = {"conditions": [{"type": "Ready", "status": "True"}]} if ready else {}
    return {"metadata": {"name": name, "labels": labels}, "spec": spec, "status": status}


def test_the_recorder_builds_one_clusters_timeline() -> None:
    rec = Recorder(namespace="ns")
    hosts = HOSTS
    rec.applied["c1"] = 10.0
    rec.on_tsc("ADDED", {"metadata": {"name": "c1"}}, 10.01)
    rec.on_raycluster("ADDED", {"metadata": {"name": "c1"}}, 10.5)
    rec.on_pod("ADDED", _pod("head", "c1", worker=False), 11.0)
    workers = [f"w{i}" for i in range(hosts)]
    for i, w in enumerate(workers):
        rec.on_pod("ADDED", _pod(w, "c1", worker=True, gated=True), 11.1 + i / 10)
    rec.on_reservation(
        "ADDED", {"spec": {"holder": {"namespace": "other", "name": "c1"}}}, 11.0
    )  # another namespace's holder of the same name: not ours
    rec.on_reservation("ADDED", {"spec": {"holder": {"namespace": "ns", "name": "c1"}}}, 11.2)
    rec.on_pod("MODIFIED", _pod("head", "c1", worker=False, node="cpu-0"), 11.3)
    for i, w in enumerate(workers):
        rec.on_pod("MODIFIED", _pod(w, "c1", worker=True, pool="v6e-0"), 12.0 + i / 100)
    for i, w in enumerate(workers):
        rec.on_pod("MODIFIED", _pod(w, "c1", True, pool="v6e-0", node=f"n{i}"), 12.5)
    rec.on_pod("MODIFIED", _pod("head", "c1", False, node="cpu-0", ready=True), 13.0)
    for w in workers[:-1]:
        rec.on_pod("MODIFIED", _pod(w, "c1", True, pool="v6e-0", node="n", ready=True), 13.1)
    status = {"conditions": [{"type": "Ready", "status": "False"}], "slices": []}
    rec.on_tsc("MODIFIED", {"metadata": {"name": "c1"}, "status": status}, 13.2)
    rec.on_tsc("MODIFIED", {"metadata": {"name": "c1"}, "status": status}, 13.3)  # kopf's
    times = rec.timelines(["c1"], pods=1 + hosts, workers=hosts)["c1"]
    assert times == {
        "created": 10.0,
        "rc_seen": 10.5,
        "first_pod": 11.0,
        "last_pod": 11.1 + (hosts - 1) / 10,
        "reserved": 11.2,
        "released": 12.0 + (hosts - 1) / 100,
        "scheduled": 12.5,
    }  # one worker not Ready yet: no "last pod Ready"
    rec.on_pod("MODIFIED", _pod(workers[-1], "c1", True, pool="v6e-0", node="n", ready=True), 14)
    rec.on_raycluster("MODIFIED", {"metadata": {"name": "c1"}, "status": {"state": "ready"}}, 15)
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    rec.on_tsc("MODIFIED", {"metadata": {"name": "c1"}, "status": ready}, 16.0)
    rec.on_tsc("MODIFIED", {"metadata": {"name": "c1"}, "status": {**ready, "x": 1}}, 17.0)
    times = rec.timelines(["c1"], pods=1 + hosts, workers=hosts)["c1"]
    assert (times["pods_ready"], times["rc_ready"], times["tsc_ready"]) == (14, 15, 16.0)
    # on the way to Ready: 2 status changes (False, then True), 3 MODIFIED events
    metrics = {
        "requests": {"PATCH tpusliceclusters/status": 3.0},
        "tpuslice_reconciles_total{result=success}": 5.0,
        "tpuslice_reconciles_total{result=error}": 1.0,
        "tpuslice_reconcile_duration_seconds_sum{result=success}": 0.5,
        "tpuslice_reconcile_duration_seconds_sum{result=error}": 0.1,
    }
    figures = status_patch_figures(rec, ["c1"], metrics)
    assert figures["status_patches_per_cluster"] == 3.0
    assert (figures["passes_per_cluster"], figures["pass_mean_seconds"]) == (6.0, 0.1)
    assert figures["status_changes_seen_per_cluster"]["max"] == 2.0
    assert figures["tsc_modified_seen_per_cluster"]["max"] == 3.0
    rows = {r["key"]: r for r in timeline(rec, ["c1"])}
    assert rows["tsc_ready"]["at_s"]["p50"] == 6.0
    assert rows["reserved"]["step_s"]["p50"] == pytest.approx(11.2 - (11.1 + (hosts - 1) / 10))


def test_webhook_figures_from_two_scrapes() -> None:
    before = {0.005: 10.0, 0.01: 10.0, 0.025: 10.0, math.inf: 10.0}
    after = {0.005: 100.0, 0.01: 108.0, 0.025: 110.0, math.inf: 110.0}
    figures = webhook_figures(before, after)
    assert figures["count"] == 100.0
    assert figures["p99"]["le"] == 0.025 and figures["p50"]["le"] == 0.005
    assert figures["buckets"]["0.01"] == 98.0


def test_the_table_prints_the_new_figures() -> None:
    result = {
        "clusters": 25,
        "nodes": 103,
        "operator": {
            "webhook_admission": {"p50": {"value": 0.0021}, "p99": {"value": 0.009, "le": 0.01}},
            "status_patches_per_cluster": 5.0,
            "status_changes_seen_per_cluster": {"p50": 5.0, "max": 6.0},
            "tsc_modified_seen_per_cluster": {"p50": 8.0, "max": 9.0},
        },
        "kuberay_first_pod_ratio": {"p50": 1.69, "p99": 1.5},
    }
    text = table(result)
    assert "webhook admission in the burst p50/p99, handler (n; bucket)" in text
    assert "2.1ms / 9.0ms (-; p99 <= 10.0ms)" in text
    assert re.search(r"RayCluster -> first pod, operator/direct run p50/p99 +1.69 / 1.50", text)
    assert "5.00; status changes 5.00/6.00, MODIFIED 8.00/9.00" in text
    assert fmt_ms(math.inf) == "+Inf" and fmt_ms(None) == "-"


def test_a_cpu_window_charges_this_process_and_the_machine() -> None:
    began = sum(os.times()[:2])
    window = CpuWindow({"benchmark": [os.getpid()], "gone": [2**22 + 7]})
    while sum(os.times()[:2]) - began < 0.3:  # CPU, not wall time, spent in the window
        pass
    figures = window.stop()
    # /proc's counters are sampled at ticks: well within the 0.3 s spent, not to the tick
    assert figures["by_component"]["benchmark"] >= 0.1
    assert figures["by_component"]["gone"] == 0.0
    # the machine's counters may lag a tick behind a process's (NOHZ), so only bounds
    assert 0.0 <= figures["machine_busy_share"] <= 1.0
    assert figures["others"] >= 0.0
    text = table(
        {
            "clusters": 1,
            "nodes": 4,
            "operator": {"cpu_to_ready": figures},
            "direct": {"cpu_to_ready": {**figures, "machine_busy_share": 0.5}},
        }
    )
    assert re.search(
        r"machine busy to all Ready: operator run / direct run +\d+% \(.*\) / 50%", text
    )
    assert re.search(
        r"CPU s to all Ready, operator run +benchmark \d+\.\d, gone 0\.0, others", text
    )


def test_the_api_servers_writes_between_two_scrapes() -> None:
    before = {"PATCH pods": 10.0, "LIST pods": 2.0, "POST events": 5.0}
    after = {"PATCH pods": 810.0, "LIST pods": 2.0, "POST events": 605.0, "WATCH pods": 1.0}
    served = request_delta(before, after)
    assert served == {"PATCH pods": 800, "POST events": 600, "WATCH pods": 1}
    assert writes(served) == "PATCH pods 800, POST events 600"


def test_make_bench_plot_writes_into_docs() -> None:
    assert _recipe("bench-plot") == "$(PY) hack/bench --plot $(BENCH_PLOT)"
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^BENCH_PLOT \?= docs/bench-scaling.svg$", makefile, re.M)
