"""The runs, in the order `make bench` makes them (see the package's docstring): the
write floor, the operator run (with its steady state and restart), the direct run and
the gang run; ``run_all`` drives them on one local cluster and writes the results."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes.client import ApiException

from bench import operator_api as c
from bench.cluster import (
    add_pools,
    custom_api,
    delete_and_wait,
    delete_webhook_configuration,
    make_namespace,
    wait_count,
)
from bench.measure import (
    WRITE_VERBS,
    CpuWindow,
    Profiler,
    apiserver_requests,
    apiserver_webhook_buckets,
    latencies,
    machine,
    operator_metrics,
    request_delta,
    slices_reported,
    status_patch_figures,
    timeline,
    webhook_buckets,
    webhook_figures,
)
from bench.memtrace import MemTrace, memtrace_env
from bench.plot import redraw
from bench.report import print_report
from bench.scenario import (
    GANG_HOSTS,
    GANG_SLICES,
    HOSTS,
    REPO,
    Scale,
    gang_tsc,
    names,
    pools,
    rendered_rayclusters,
    tsc,
)
from bench.watches import GangRecorder, Recorder, Watch, start_watches
from tpusim import ClusterSettings, LocalCluster, ToolPaths, TPUPool, benchstats, kube
from tpusim.benchstats import ratio, summary
from tpusim.operator_process import OperatorProcess
from tpusim.processes import exit_on_signals


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


def restart(
    operator: OperatorProcess,
    scale: Scale,
    slices: int,
    quiet_s: float,
    profile_rate: int = 0,
    run_dir: Path | None = None,
) -> dict[str, Any]:
    """g. Stop the operator's process (SIGTERM) and start it again over the Ready clusters:
    how long until it has reconciled every one (our watches' listing included), and
    whether that restart writes anything (a level-based reconcile over unchanged state
    should not). The webhook process keeps answering, as in the chart, where it is a
    Deployment of its own and a rollout or a crash of the operator leaves it running.
    With ``profile_rate`` py-spy samples the new process from its spawn until every object
    had a pass (profile-restart.txt): its start-up and the first passes over settled
    objects."""
    print("  g: restarting the operator (the webhook keeps answering)", flush=True)
    operator.stop_operator()
    profilers: list[tuple[Profiler, threading.Timer]] = []

    def profile(pid: int) -> None:
        if profile_rate and run_dir is not None:
            profiler = Profiler(pid, run_dir / "profile-restart.txt", profile_rate)
            # py-spy finds no interpreter in a process that has only just been exec'd
            timer = threading.Timer(0.3, profiler.start)
            profilers.append((profiler, timer))
            timer.start()

    began = time.monotonic()
    operator.start_operator(timeout_s=scale.timeout_s, on_spawn=profile)
    healthy = time.monotonic() - began
    try:
        ok, _ = wait_count(
            "slices reported after restart",
            lambda: slices_reported(operator),
            slices,
            scale.timeout_s,
        )
    finally:
        profile_result = None
        for profiler, timer in profilers:
            timer.join()
            profile_result = profiler.stop()
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
        **({"profile": profile_result} if profile_result else {}),
    }


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


def operator_run(
    cluster: LocalCluster,
    scale: Scale,
    steady_s: float,
    run_dir: Path,
    result: dict[str, Any],
    profile_rate: int = 0,
    gated: bool = True,
    memtrace: bool = False,
    pinned: bool = False,
    restart_profile_rate: int = 0,
) -> None:
    """Fill ``result`` as figures come in, so an interrupted run still reports them.
    With ``profile_rate`` (Hz) py-spy samples the operator from the first create until
    every TSC is Ready (or the bound), and the restart; with ``restart_profile_rate`` the
    restart alone. ``gated`` False (``--ungated``): the TSCs say
    ``reservation.policy: None``, so the operator renders and the identity webhook admits,
    but no gate, no reservation and no pod patch: what the guarantee costs on top.
    ``pinned`` (``--pin-at-admission``): the operator and its webhook run with the
    setting."""
    core, custom = kube.core_v1(cluster.api), custom_api(cluster.api)
    ns = "bench-operator"
    make_namespace(core, ns)
    operator = OperatorProcess(
        cluster.kubeconfig,
        run_dir / "logs" / "operator.log",
        extra_args=("--log-level=WARNING", *pin_args(pinned), *batch_args(scale)),
        webhook_args=pin_args(pinned),
        cwd=REPO,
        env=memtrace_env(run_dir / "memtrace") if memtrace else {},
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
        traced = None
        if memtrace:
            assert operator.proc is not None
            traced = MemTrace(operator.proc.pid, run_dir / "memtrace")
            traced.snap()
        print(f"  creating {len(items)} TPUSliceClusters", flush=True)
        cpu = CpuWindow(component_pids(cluster, operator))
        served = apiserver_requests(cluster.api)
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
        result["cpu_to_ready"] = cpu.stop()
        result["apiserver_requests_to_ready"] = request_delta(
            served, apiserver_requests(cluster.api)
        )
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
        result["proc_webhook"] = operator.proc_stats(webhook=True)  # `tpuslice webhook`
        result["operator_metrics"] = after
        if traced is not None:
            traced.snap()
            result["memtrace"] = traced.report(len(items))
        result["restart"] = restart(
            operator,
            scale,
            len(items),
            min(steady_s, 30.0),
            profile_rate or restart_profile_rate,
            run_dir,
        )
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


def direct_run(cluster: LocalCluster, scale: Scale, run_dir: Path | None = None) -> dict[str, Any]:
    core, custom = kube.core_v1(cluster.api), custom_api(cluster.api)
    ns = "bench-direct"
    make_namespace(core, ns)
    items = names(scale.clusters)
    # Rendered before the clock starts, all in one `tpuslice render`: the direct run
    # times what KubeRay does with RayClusters, not a process start per cluster.
    print(f"  rendering {len(items)} RayClusters (tpuslice render)", flush=True)
    bodies = rendered_rayclusters([tsc(n, gated=False) for n in items])
    rayclusters = dict(zip(items, bodies, strict=True))
    rec = Recorder()
    watches = start_watches(cluster.api, ns, rec, operator=False)

    def create(name: str) -> None:
        raycluster = rayclusters[name]
        raycluster["metadata"]["namespace"] = ns
        custom.create_namespaced_custom_object(
            "ray.io", "v1", ns, "rayclusters", raycluster, _preload_content=False
        )

    print(f"  creating {len(items)} RayClusters directly", flush=True)
    cpu = CpuWindow(component_pids(cluster))
    before = apiserver_requests(cluster.api)
    began = create_all(create, items, scale.apply_threads, rec)
    ok, _ = wait_count(
        "RayClusters ready", lambda: rec.ready_count("rc/"), len(items), scale.timeout_s
    )
    cpu_to_ready = cpu.stop()
    served = request_delta(before, apiserver_requests(cluster.api))
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
        "cpu_to_ready": cpu_to_ready,
        "apiserver_requests_to_ready": served,
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


def component_pids(
    cluster: LocalCluster, operator: OperatorProcess | None = None
) -> dict[str, list[int]]:
    """The processes whose CPU a run's ``CpuWindow`` splits: the local cluster's
    components by name, the operator and its webhook process, and this benchmark
    (its watches and create threads share the machine too)."""
    pids: dict[str, list[int]] = {}
    for proc in cluster.processes:
        pids.setdefault(proc.name, []).append(proc.pid)
    if operator is not None and operator.proc is not None:
        pids["operator"] = [operator.proc.pid]
    if operator is not None and operator.webhook_proc is not None:
        pids["webhook"] = [operator.webhook_proc.pid]
    pids["benchmark"] = [os.getpid()]
    return pids


def pin_args(pinned: bool) -> tuple[str, ...]:
    """The flag of ``--pin-at-admission`` runs, for the operator and its webhook alike."""
    return ("--pin-at-admission",) if pinned else ()


def batch_args(scale: Scale) -> tuple[str, ...]:
    """The operator's ``--status-batch-seconds`` of this scale (none: its default)."""
    if not scale.status_batch_seconds:
        return ()
    return (f"--status-batch-seconds={scale.status_batch_seconds}",)


def gang_run(
    cluster: LocalCluster,
    scale: Scale,
    run_dir: Path,
    result: dict[str, Any],
    pinned: bool = False,
) -> None:
    """h. ``scale.gangs`` 2-slice TSCs at once over ``scale.gang_pools`` v6e 2x4 pools;
    each deleted as soon as it is Ready. Fills ``result`` as figures come in.
    ``pinned``: the operator and its webhook run with ``--pin-at-admission``."""
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
        extra_args=("--log-level=WARNING", *pin_args(pinned), *batch_args(scale)),
        webhook_args=pin_args(pinned),
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


def run_all(
    scale_name: str,
    scale: Scale,
    out_dir: Path,
    *,
    steady_s: float = 60.0,
    profile_rate: int = 0,
    ungated: bool = False,
    skip_direct: bool = False,
    skip_gangs: bool = False,
    memtrace: bool = False,
    pinned: bool = False,
    restart_profile_rate: int = 0,
) -> int:
    """One run of every phase on a fresh local cluster; the results go to
    ``out_dir``/results-<scale>[-profiled][-memtraced][-ungated][-pinned].json, a table
    to stdout (``pinned``: the operator and its webhook with ``--pin-at-admission``). Exit status
    1 if a phase stopped the run (the results so far are written all the same)."""
    run_dir = out_dir / f"run-{scale_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    exit_on_signals()
    result: dict[str, Any] = {
        "scale": scale_name,
        "clusters": scale.clusters,
        "machine": machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run_dir": str(run_dir),
        "profiled": bool(profile_rate),
        "restart_profiled": bool(profile_rate or restart_profile_rate),
        "ungated": bool(ungated),
        "pinned": bool(pinned),
        "memtraced": bool(memtrace),
        "kuberay_reconcile_concurrency": scale.kuberay_concurrency,
        "status_batch_seconds": scale.status_batch_seconds,
        "node_lease_seconds": scale.node_lease_seconds,
        "node_monitor_grace_seconds": scale.node_monitor_grace_seconds,
    }
    began = time.monotonic()
    cluster = LocalCluster(
        ClusterSettings(
            tools=ToolPaths.for_repo(REPO),
            run_dir=run_dir,
            kuberay_reconcile_concurrency=scale.kuberay_concurrency,
            node_lease_seconds=scale.node_lease_seconds,
            node_monitor_grace_seconds=scale.node_monitor_grace_seconds,
        )
    )
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
            steady_s,
            run_dir,
            result.setdefault("operator", {}),
            profile_rate=profile_rate,
            gated=not ungated,
            memtrace=memtrace,
            pinned=pinned,
            restart_profile_rate=restart_profile_rate,
        )
        if not skip_direct:
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
        if not skip_gangs:
            print("h: gang run (multislice clusters under contention)", flush=True)
            gang_run(cluster, scale, run_dir, result.setdefault("gangs", {}), pinned=pinned)
    except BaseException as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(f"bench stopped: {result['error']}", flush=True)
    finally:
        cluster.stop()
        result["wall_seconds"] = round(time.monotonic() - began, 1)
        result.setdefault("nodes", scale.clusters * HOSTS)
        out_dir.mkdir(exist_ok=True)
        # a profiled run's timings are not comparable: it keeps out of the plot's file
        suffix = (
            ("-profiled" if profile_rate else "")
            + ("-memtraced" if memtrace else "")
            + ("-ungated" if ungated else "")
            + ("-pinned" if pinned else "")
        )
        path = out_dir / f"results-{scale_name}{suffix}.json"
        path.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print_report(result, path)
        redraw(out_dir)
    return 1 if "error" in result else 0
