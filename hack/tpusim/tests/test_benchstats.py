"""tpusim.benchstats: the arithmetic of `make bench` (percentiles, per-cluster timelines,
histogram quantiles, py-spy profile summaries, the scaling plot's series), on made-up input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tpusim import benchstats as bs


# ---------------------------------------------------------------- percentiles
def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert bs.percentile(values, 50) == 50.0
    assert bs.percentile(values, 99) == 99.0
    assert bs.percentile(values, 100) == 100.0
    assert bs.percentile([3.0], 99) == 3.0
    assert bs.percentile([], 50) is None
    assert bs.summary([2.0, 1.0, 3.0]) == {"n": 3, "p50": 2.0, "p99": 3.0, "max": 3.0}
    assert bs.summary([]) == {"n": 0, "p50": None, "p99": None, "max": None}


def test_ratio_of_missing_or_zero_is_none() -> None:
    assert bs.ratio(3.0, 2.0) == 1.5
    assert bs.ratio(None, 2.0) is None
    assert bs.ratio(1.0, 0.0) is None
    assert bs.ratio(1.0, None) is None


# ---------------------------------------------------------------- timelines
def _timeline(**offsets: float) -> dict[str, float]:
    return {k: 100.0 + v for k, v in offsets.items()}


def test_timeline_at_and_step_per_milestone() -> None:
    timelines = {
        "a": _timeline(created=0, rc_seen=1.0, first_pod=3.0, last_pod=3.5, tsc_ready=10.0),
        "b": _timeline(created=0, rc_seen=2.0, first_pod=5.0, last_pod=5.5, tsc_ready=14.0),
    }
    rows = {r["key"]: r for r in bs.timeline_summary(timelines, bs.OPERATOR_MILESTONES)}
    assert [r["key"] for r in bs.timeline_summary(timelines, bs.OPERATOR_MILESTONES)] == [
        m.key for m in bs.OPERATOR_MILESTONES
    ]
    assert rows["created"]["at_s"]["p50"] == 0.0
    assert rows["rc_seen"]["at_s"] == {"n": 2, "p50": 1.0, "p99": 2.0, "max": 2.0}
    assert rows["first_pod"]["step_s"]["p50"] == 2.0 and rows["first_pod"]["step_s"]["p99"] == 3.0
    # a milestone nobody reached: counted 0, no figures
    assert rows["reserved"]["n"] == 0 and rows["reserved"]["at_s"]["p50"] is None
    # a step skips the milestones a cluster did not reach: last pod -> TSC Ready
    assert rows["tsc_ready"]["step_s"]["p50"] == pytest.approx(6.5)
    assert rows["tsc_ready"]["step_s"]["p99"] == pytest.approx(8.5)


def test_a_step_is_negative_when_the_milestone_came_first() -> None:
    """E.g. the reservation claimed before KubeRay created the last pod."""
    timelines = {"a": _timeline(created=0, last_pod=2.0, reserved=1.5, released=2.1)}
    rows = {r["key"]: r for r in bs.timeline_summary(timelines, bs.OPERATOR_MILESTONES)}
    assert rows["reserved"]["step_s"]["p50"] == pytest.approx(-0.5)
    # the next step counts from the latest earlier milestone (the last pod), not the
    # reservation that came before it
    assert rows["released"]["step_s"]["p50"] == pytest.approx(0.1)


def test_a_cluster_without_a_creation_time_is_left_out() -> None:
    timelines = {"a": {"rc_seen": 5.0}, "b": _timeline(created=0, rc_seen=1.0)}
    rows = {r["key"]: r for r in bs.timeline_summary(timelines, bs.OPERATOR_MILESTONES)}
    assert rows["rc_seen"]["n"] == 1 and rows["rc_seen"]["at_s"]["p50"] == 1.0


def test_the_direct_run_has_no_reservation_gate_or_tsc() -> None:
    keys = [m.key for m in bs.DIRECT_MILESTONES]
    assert "reserved" not in keys and "released" not in keys and "tsc_ready" not in keys
    assert keys[0] == "created" and "rc_ready" in keys


def test_timeline_table_puts_both_runs_side_by_side() -> None:
    op = bs.timeline_summary(
        {"a": _timeline(created=0, rc_seen=0.25, tsc_ready=12.0)}, bs.OPERATOR_MILESTONES
    )
    direct = bs.timeline_summary(
        {"a": _timeline(created=0, rc_seen=0.01, rc_ready=3.0)}, bs.DIRECT_MILESTONES
    )
    text = bs.timeline_table(op, direct)
    lines = text.splitlines()
    assert "operator: at p50/p99" in lines[0] and "direct: at p50/p99" in lines[0]
    rc = next(line for line in lines if line.startswith("RayCluster seen"))
    assert "250ms / 250ms" in rc and "10ms / 10ms" in rc
    tsc = next(line for line in lines if line.startswith("TSC Ready"))
    assert "12.00s / 12.00s" in tsc and tsc.rstrip().endswith("-")
    assert len(lines) == 1 + len(bs.OPERATOR_MILESTONES)
    assert "direct" not in bs.timeline_table(op).splitlines()[1]


# ---------------------------------------------------------------- histograms
SCRAPE = [
    ("h_bucket", {"result": "mutated", "le": "0.005"}, 90.0),
    ("h_bucket", {"result": "mutated", "le": "0.01"}, 98.0),
    ("h_bucket", {"result": "mutated", "le": "0.025"}, 100.0),
    ("h_bucket", {"result": "mutated", "le": "+Inf"}, 100.0),
    ("h_bucket", {"result": "unchanged", "le": "0.005"}, 0.0),
    ("h_bucket", {"result": "unchanged", "le": "0.01"}, 0.0),
    ("h_bucket", {"result": "unchanged", "le": "0.025"}, 0.0),
    ("h_bucket", {"result": "unchanged", "le": "+Inf"}, 0.0),
    ("h_count", {"result": "mutated"}, 100.0),
    ("other_bucket", {"le": "1"}, 7.0),
]


def test_histogram_buckets_sum_the_labels_by_bound() -> None:
    buckets = bs.histogram_buckets(SCRAPE, "h")
    assert buckets == {0.005: 90.0, 0.01: 98.0, 0.025: 100.0, math.inf: 100.0}
    assert bs.histogram_buckets(SCRAPE, "missing") == {}


def test_histogram_buckets_of_some_labels_only() -> None:
    """The API server's webhook histogram: our webhook's calls, not another's."""
    scrape = [
        ("w_bucket", {"name": "identity.tpuslice.dev", "type": "admit", "le": "0.005"}, 3.0),
        ("w_bucket", {"name": "identity.tpuslice.dev", "type": "admit", "le": "+Inf"}, 4.0),
        ("w_bucket", {"name": "other.example.com", "type": "admit", "le": "0.005"}, 50.0),
        ("w_bucket", {"name": "other.example.com", "type": "admit", "le": "+Inf"}, 50.0),
    ]
    where = {"name": "identity.tpuslice.dev", "type": "admit"}
    assert bs.histogram_buckets(scrape, "w", where=where) == {0.005: 3.0, math.inf: 4.0}
    assert bs.histogram_buckets(scrape, "w")[math.inf] == 54.0


def test_text_samples_reads_one_metric_out_of_a_scrape() -> None:
    text = "\n".join(
        [
            "# HELP w_seconds [STABLE] Webhook latency",
            "# TYPE w_seconds histogram",
            'w_seconds_bucket{name="identity.tpuslice.dev",operation="CREATE",le="0.005"} 7',
            'w_seconds_bucket{name="identity.tpuslice.dev",operation="CREATE",le="+Inf"} 9',
            'w_seconds_sum{name="identity.tpuslice.dev",operation="CREATE"} 0.25',
            "w_seconds_count 9",
            'other_metric{a="b"} 1',
            "w_seconds_bucket{broken 1",
            'w_seconds_bucket{le="1"} not-a-number',
        ]
    )
    samples = bs.text_samples(text, "w_seconds")
    assert samples[0] == (
        "w_seconds_bucket",
        {"name": "identity.tpuslice.dev", "operation": "CREATE", "le": "0.005"},
        7.0,
    )
    assert [s[0] for s in samples] == [
        "w_seconds_bucket",
        "w_seconds_bucket",
        "w_seconds_sum",
        "w_seconds_count",
    ]
    assert bs.histogram_buckets(samples, "w_seconds") == {0.005: 7.0, math.inf: 9.0}


def test_bucket_quantile_interpolates_like_prometheus() -> None:
    buckets = {0.005: 90.0, 0.01: 98.0, 0.025: 100.0, math.inf: 100.0}
    p99 = bs.bucket_quantile(buckets, 0.99)
    # rank 99 lies in (0.01, 0.025]: 1 of its 2 observations -> halfway
    assert p99["le"] == 0.025 and p99["value"] == pytest.approx(0.0175)
    assert p99["count"] == 100.0
    p50 = bs.bucket_quantile(buckets, 0.5)
    assert p50["le"] == 0.005 and p50["value"] == pytest.approx(0.005 * 50 / 90)


def test_bucket_quantile_in_the_inf_bucket_is_the_largest_bound() -> None:
    buckets = {0.005: 1.0, 0.01: 1.0, math.inf: 10.0}
    q = bs.bucket_quantile(buckets, 0.99)
    assert q["le"] == math.inf and q["value"] == 0.01


def test_bucket_quantile_of_nothing() -> None:
    assert bs.bucket_quantile({}, 0.99) == {"count": 0, "value": None, "le": None}
    assert bs.bucket_quantile({0.005: 0.0, math.inf: 0.0}, 0.5)["value"] is None


def test_histogram_delta_is_what_happened_between_two_scrapes() -> None:
    before = {0.005: 10.0, 0.01: 10.0, math.inf: 10.0}
    after = {0.005: 10.0, 0.01: 19.0, math.inf: 20.0}
    delta = bs.histogram_delta(before, after)
    assert delta == {0.005: 0.0, 0.01: 9.0, math.inf: 10.0}
    # a histogram that appeared between the scrapes: all of it is new
    assert bs.histogram_delta({}, after) == after


# ---------------------------------------------------------------- profiles
BOOT = ["Thread._bootstrap (threading.py:1002)", "Thread.run (threading.py:982)"]
LOOP = ["run_forever (asyncio/base_events.py:608)", "_run_once (asyncio/base_events.py:1922)"]
HTTP = ["process_request_thread (socketserver.py:691)", "handle (http/server.py:432)"]
DECODE = ["loads (json/__init__.py:346)", "raw_decode (json/decoder.py:353)"]
PASS = ["handler (kopf/_core/actions/execution.py:1)", "run_pass (tpuslice/reconcile.py:10)"]
WEBHOOK = [*HTTP, "do_POST (tpuslice/webhook.py:300)"]
ENCODE = ["dumps (json/__init__.py:231)", "encode (json/encoder.py:200)"]
STACKS = [  # py-spy --format raw --threads: the thread, then the frames, outermost first
    ("kopf", [*LOOP, *PASS, "plan (tpuslice/reservation.py:5)"], 30),
    ("kopf", [*LOOP, "process (kopf/_core/reactor/processing.py:3)"], 20),
    ("watch-pods", ["run (tpuslice/follow.py:400)", *DECODE], 25),
    ("watch-pods", ["run (tpuslice/follow.py:400)", "to_record (tpuslice/convert.py:9)"], 5),
    ("Thread-7 (process_request_thread)", [*WEBHOOK, *DECODE], 5),
    ("Thread-7 (process_request_thread)", [*WEBHOOK, "make_patch (jsonpatch.py:10)", *ENCODE], 10),
    ("lease-renew", ["renew (tpuslice/election.py:1)", "request (urllib3/connectionpool.py:7)"], 5),
    ("kube_3", ["_worker (concurrent/futures/thread.py:83)", "call (tpuslice/kube.py:270)"], 2),
]
RAW = "\n".join(
    [
        f"thread ({100 + i}): {name};" + ";".join([*BOOT, *frames]) + f" {n}"
        for i, (name, frames, n) in enumerate(STACKS)
    ]
    + ["not a stack line", ""]
)


def test_profile_summary_splits_by_thread_module_and_json() -> None:
    s = bs.profile_summary(RAW.splitlines(), rate_hz=50)
    assert s["samples"] == 102 and s["cpu_seconds_est"] == 2.04
    threads = {r["name"]: r["samples"] for r in s["by_thread"]}
    assert threads == {
        "kopf loop (kopf + our passes)": 50,
        "our watches": 30,
        "webhook threads": 15,
        "leader election": 5,
        "our API calls (kube threads)": 2,
    }
    assert s["by_thread"][0]["share"] == round(50 / 102, 4)
    self_mod = {r["name"]: r["samples"] for r in s["self_by_module"]}
    assert self_mod["tpuslice (ours)"] == 37 and self_mod["kopf"] == 20
    assert self_mod["json"] == 40 and self_mod["urllib3"] == 5
    inclusive = {r["name"]: r["samples"] for r in s["inclusive_by_module"]}
    assert inclusive["kopf"] == 50 and inclusive["tpuslice (ours)"] == 82
    assert inclusive["asyncio"] == 50
    assert s["json_decode_share"] == round(30 / 102, 4)
    assert s["json_encode_share"] == round(10 / 102, 4)
    assert s["top_self"][0]["name"] == "plan (tpuslice/reservation.py)"
    assert s["top_self"][0]["samples"] == 30
    watch_mods = {r["name"]: r["samples"] for r in s["by_thread_module"]["our watches"]}
    assert watch_mods == {"json": 25, "tpuslice (ours)": 5}


def test_profile_summary_leaves_blocking_calls_out_as_waiting() -> None:
    """--nonblocking samples also catch threads blocked in a read, a selector, a wait."""
    lines = [
        "thread (1): kopf;run_forever (asyncio/base_events.py:1);"
        "EpollSelector.select (selectors.py:468) 40",
        "thread (2): kube_0;_worker (concurrent/futures/thread.py:81) 30",
        "thread (2): kube_0;call (tpuslice/kube.py:1);SSLSocket.read (ssl.py:1134) 20",
        "thread (2): kube_0;call (tpuslice/kube.py:1);SSLSocket.send (ssl.py:1200) 6",
        "thread (3): kopf;deepcopy (copy.py:128) 4",
    ]
    s = bs.profile_summary(lines, rate_hz=100)
    assert s["samples"] == 10 and s["waiting_samples"] == 90 and s["waiting_share"] == 0.9
    assert s["cpu_seconds_est"] == 0.1
    waiting = {r["name"]: r["samples"] for r in s["waiting_by_thread"]}
    assert waiting == {"kopf loop (kopf + our passes)": 40, "our API calls (kube threads)": 50}
    assert {r["name"]: r["samples"] for r in s["self_by_module"]} == {
        "sockets + TLS": 6,
        "copy (deepcopy)": 4,
    }
    assert "left out as waiting in a blocking call: 90 (90.0% of all samples)" in (
        bs.profile_report(s)
    )


def test_profile_summary_of_full_filenames_and_of_nothing() -> None:
    line = (
        "thread (1): watch-nodes;run (/work/x/operator/tpuslice/follow.py:1);"
        "loads (/usr/lib/python3.11/json/__init__.py:346) 4"
    )
    s = bs.profile_summary([line])
    assert s["json_decode_share"] == 1.0
    assert s["top_inclusive"][0]["name"] in {"run (tpuslice/follow.py)", "loads (json/__init__.py)"}
    empty = bs.profile_summary([])
    assert empty["samples"] == 0 and empty["by_thread"] == [] and empty["json_decode_share"] == 0


def test_profile_report_names_every_section() -> None:
    text = bs.profile_report(bs.profile_summary(RAW.splitlines(), rate_hz=100))
    for heading in ("by thread", "self time by module", "inclusive", "top functions, self"):
        assert heading in text
    assert " 49.0%  kopf loop (kopf + our passes)" in text
    assert "  2.0%  our API calls (kube threads)" in text
    assert " 29.4%  JSON decoding" in text


# ---------------------------------------------------------------- the scaling plot
def _result(scale: str, clusters: int, **operator: object) -> dict[str, object]:
    return {
        "scale": scale,
        "clusters": clusters,
        "machine": {"nproc": 2, "cpu": "test CPU"},
        "operator": {
            "ready_seconds": clusters / 10,
            "tsc_to_raycluster_s": {"p50": 1.0, "p99": 1.5},
            "slice_release_s": {"p50": 0.05, "p99": 0.2},
            **operator,
        },
        "direct": {"ready_seconds": clusters / 20},
        "overhead_ratio": 2.0,
    }


def _panel(panels: list[dict[str, object]], title: str) -> dict[str, list[object]]:
    panel = next(p for p in panels if p["title"] == title)
    return {s["label"]: s["points"] for s in panel["series"]}  # type: ignore[attr-defined]


def test_plot_series_points_per_scale_and_gaps() -> None:
    results = [
        _result("small", 25, status_patches_per_cluster=6.0),
        _result("medium", 200, webhook_admission={"p99": {"value": 0.004}}),
    ]
    panels = bs.plot_series(results)
    assert _panel(panels, "c. all Ready (s)") == {
        "operator": [(25, 2.5), (200, 20.0)],
        "direct": [(25, 1.25), (200, 10.0)],
    }
    # milliseconds panels are scaled; a figure only one run has gives one point
    assert _panel(panels, "b. last pod -> slice released (ms)")["p99"] == [
        (25, 200.0),
        (200, 200.0),
    ]
    webhook = _panel(panels, "webhook admission during the burst (ms)")
    assert webhook["p99 in the handler"] == [(200, 4.0)] and webhook["p50 in the handler"] == []
    status = _panel(panels, "status patches per cluster to Ready")
    assert status["PATCH tpusliceclusters/status"] == [(25, 6.0)]
    targets = {p["title"]: p["target"] for p in panels}
    assert targets["a. TSC created -> RayCluster seen (s)"] == 0.10
    assert targets["webhook admission during the burst (ms)"] == 10.0


def test_plot_series_leaves_out_all_ready_of_a_run_that_hit_its_bound() -> None:
    bounded = _result("large", 1000, all_ready=False, ready=2)
    points = _panel(
        bs.plot_series([_result("small", 25, all_ready=True), bounded]), "c. all Ready (s)"
    )
    assert points["operator"] == [(25, 2.5)]


def test_plot_series_reads_older_results_by_their_keys() -> None:
    """A results file from before the per-cluster figure: the run's PATCH count / clusters."""
    old = _result(
        "small", 25, operator_metrics={"requests": {"PATCH tpusliceclusters/status": 125}}
    )
    status = _panel(bs.plot_series([old]), "status patches per cluster to Ready")
    assert status["PATCH tpusliceclusters/status"] == [(25, 5.0)]


def test_plot_series_timeline_panels() -> None:
    op = bs.timeline_summary(
        {"a": _timeline(created=0, rc_seen=0.5, tsc_ready=9.0)}, bs.OPERATOR_MILESTONES
    )
    panels = bs.plot_series([_result("small", 25, timeline=op)])
    lines = _panel(panels, "operator run: p50 time since created (s)")
    assert lines["RayCluster seen"] == [(25, 0.5)] and lines["TSC Ready"] == [(25, 9.0)]
    assert _panel(panels, "direct run: p50 time since created (s)") == {}


def test_load_results_sorted_by_scale_skipping_junk(tmp_path: Path) -> None:
    (tmp_path / "results-large.json").write_text(json.dumps(_result("large", 1000)))
    (tmp_path / "results-small.json").write_text(json.dumps(_result("small", 25)))
    (tmp_path / "results-broken.json").write_text("{not json")
    (tmp_path / "results-empty.json").write_text(json.dumps({"scale": "x"}))
    (tmp_path / "other.json").write_text(json.dumps(_result("medium", 200)))
    profiled = {**_result("small", 25), "profiled": True}
    (tmp_path / "results-small-profiled.json").write_text(json.dumps(profiled))
    ungated = {**_result("medium", 200), "ungated": True}
    (tmp_path / "results-medium-ungated.json").write_text(json.dumps(ungated))
    pinned = {**_result("medium", 200), "pinned": True}
    (tmp_path / "results-medium-pinned.json").write_text(json.dumps(pinned))
    assert [r["scale"] for r in bs.load_results(tmp_path)] == ["small", "large"]


def test_write_plot_svg_is_reproducible(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    results = [_result("small", 25), _result("medium", 200), _result("large", 1000)]
    first = bs.write_plot(results, tmp_path / "a.svg").read_bytes()
    second = bs.write_plot(results, tmp_path / "b.svg").read_bytes()
    assert first.startswith(b"<?xml") and b"TPUSliceClusters" in first
    assert first == second  # no date, stable ids: a re-plot of the same results is no diff
    png = bs.write_plot(results[:1], tmp_path / "c.png").read_bytes()
    assert png.startswith(b"\x89PNG")
