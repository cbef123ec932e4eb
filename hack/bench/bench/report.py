"""The table `make bench` prints from a run's results."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.measure import APISERVER_WRITE_VERBS
from bench.scenario import HOSTS
from tpusim import benchstats


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


def busy(cpu: Mapping[str, Any]) -> str:
    """How busy the machine was in a ``CpuWindow``: share of all its cores, CPU seconds."""
    if not cpu:
        return "-"
    return (
        f"{100 * (cpu.get('machine_busy_share') or 0):.0f}% "
        f"({fmt(cpu.get('machine_busy_seconds'))} in {fmt(cpu.get('wall_seconds'))})"
    )


def by_component(cpu: Mapping[str, Any]) -> str:
    """A ``CpuWindow``'s CPU seconds per component, largest first, then the rest."""
    if not cpu:
        return "-"
    parts = [f"{name} {secs:.1f}" for name, secs in (cpu.get("by_component") or {}).items()]
    return ", ".join([*parts, f"others {cpu.get('others', 0):.1f}"])


def writes(served: Mapping[str, int], top: int = 8) -> str:
    """The API server's writes in a window, per object to Ready: the largest first."""
    shown = [
        f"{key} {n}" for key, n in served.items() if key.split(" ", 1)[0] in APISERVER_WRITE_VERBS
    ]
    return ", ".join(shown[:top]) if shown else "-"


def table(r: Mapping[str, Any]) -> str:
    op, direct, fl = r.get("operator", {}), r.get("direct", {}), r.get("floor", {})
    a, k = op.get("tsc_to_raycluster_s", {}), op.get("raycluster_to_first_pod_s", {})
    b = op.get("slice_release_s", {})
    proc = op.get("proc", op.get("proc_after_ready", {}))
    hook = op.get("proc_webhook") or {}
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
            "   passes per TSC to Ready; mean wall time of a pass",
            f"{fmt(op.get('passes_per_cluster'), '')}; {fmt_ms(op.get('pass_mean_seconds'))}",
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
            "d  webhook process (`tpuslice webhook`) peak RSS / CPU seconds",
            f"{fmt(hook.get('peak_rss_mib'), ' MiB')} / {fmt(hook.get('cpu_seconds'))}",
        ),
        (
            "   machine busy to all Ready: operator run / direct run",
            f"{busy(op.get('cpu_to_ready') or {})} / {busy(direct.get('cpu_to_ready') or {})}",
        ),
        ("   CPU s to all Ready, operator run", by_component(op.get("cpu_to_ready") or {})),
        ("   CPU s to all Ready, direct run", by_component(direct.get("cpu_to_ready") or {})),
        (
            "   API server writes to all Ready, operator run",
            writes(op.get("apiserver_requests_to_ready") or {}),
        ),
        (
            "   API server writes to all Ready, direct run",
            writes(direct.get("apiserver_requests_to_ready") or {}),
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


def print_report(result: Mapping[str, Any], path: Path) -> None:
    """The table, the per-cluster timeline of both runs, the profile's split by thread (if
    profiled), and where the results were written."""
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
