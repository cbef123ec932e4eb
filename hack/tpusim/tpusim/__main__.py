"""Command line: ``python -m tpusim up|down|status|add-pool|remove-pool|images``.

`up` detaches by default (the cluster outlives the command, as `make
dev-cluster` wants); `up --foreground` keeps it in this process until Ctrl-C.
State (pids, ports, kubeconfig) lives in ``--dir`` so `down` and `status` from
another shell find it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from . import kube
from .cluster import ClusterSettings, LocalCluster
from .nodepools import NodePool, default_pools, parse_pool_spec, pool_from_dict
from .processes import ComponentError, exit_on_signals, kill_recorded
from .tools import ToolPaths, find_repo_root


def _load_state(directory: Path) -> dict[str, Any] | None:
    path = directory / "state.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _alive(component: dict[str, Any]) -> bool:
    try:
        exe = Path(f"/proc/{component['pid']}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    return bool(exe == component["exe"])


def _load_pools(path: Path | None, specs: Sequence[str]) -> list[NodePool]:
    pools: list[NodePool] = []
    if path is not None:
        raw = yaml.safe_load(path.read_text())
        pools += [
            pool_from_dict(p) for p in (raw.get("pools", raw) if isinstance(raw, dict) else raw)
        ]
    pools += [parse_pool_spec(s) for s in specs]
    return pools if (path is not None or specs) else list(default_pools())


def cmd_up(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    state = _load_state(directory)
    if state and any(_alive(c) for c in state["components"]):
        print(f"a cluster is already running from {directory}; stop it with `down` first")
        return 1
    for sub in ("logs", "pki", "etcd-data", "kubeconfig", "state.json"):
        target = directory / sub
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    pools = _load_pools(args.pools, args.pool)
    settings = ClusterSettings(
        tools=ToolPaths.for_repo(find_repo_root()),
        run_dir=directory,
        ready_timeout_s=args.timeout,
        die_with_parent=args.foreground,
    )
    cluster = LocalCluster(settings)
    exit_on_signals()
    began = time.monotonic()
    try:
        cluster.start()
        nodes = cluster.add_pools(pools)
    except ComponentError as exc:
        print(f"cluster failed to start: {exc}", file=sys.stderr)
        cluster.stop()
        return 1
    except BaseException:
        cluster.stop()
        raise
    elapsed = time.monotonic() - began
    print(
        f"local cluster up in {elapsed:.1f}s ({len(nodes)} fake nodes); logs in {cluster.log_dir}"
    )
    for step, secs in cluster.report.steps.items():
        print(f"  {step:<24} {secs:6.1f}s")
    print(f"\n  export KUBECONFIG={cluster.kubeconfig}")
    print(f"  {settings.tools.binary('kubectl')} get nodes -L cloud.google.com/gke-nodepool")
    if not args.foreground:
        print("\nstop it with: make dev-cluster-down")
        return 0
    print("\nrunning in the foreground; Ctrl-C stops it")
    try:
        while all(p.alive() for p in cluster.processes):
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    state = _load_state(directory)
    if state is None:
        print(f"no cluster state in {directory}; nothing to stop")
        return 0
    stopped = [
        c["name"]
        for c in reversed(state["components"])
        if kill_recorded(int(c["pid"]), str(c["exe"]))
    ]
    shutil.rmtree(directory / "etcd-data", ignore_errors=True)
    state["stopped"] = True
    (directory / "state.json").write_text(json.dumps(state, indent=2) + "\n")
    print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    state = _load_state(directory)
    if state is None:
        print(f"no cluster state in {directory}")
        return 1
    running = True
    for comp in state["components"]:
        alive = _alive(comp)
        running &= alive
        word = "running" if alive else "STOPPED"
        print(f"  {comp['name']:<24} pid {comp['pid']:<8} {word:<8} {comp['log']}")
    if not running:
        return 1
    api = kube.api_client(Path(state["kubeconfig"]))
    pools: dict[str, list[str]] = {}
    for node in kube.core_v1(api).list_node().items:
        pool = (node.metadata.labels or {}).get("cloud.google.com/gke-nodepool", "-")
        flag = "Ready" if kube.node_ready(node) else "NotReady"
        if node.spec.unschedulable:
            flag += ",cordoned"
        pools.setdefault(pool, []).append(f"{node.metadata.name}({flag})")
    for pool, nodes in sorted(pools.items()):
        print(f"  pool {pool}: {' '.join(nodes)}")
    print(f"  KUBECONFIG={state['kubeconfig']}")
    return 0


def _api_for(directory: Path) -> Any:
    state = _load_state(directory.resolve())
    if state is None:
        raise SystemExit(f"no cluster state in {directory}")
    return kube.api_client(Path(state["kubeconfig"]))


def cmd_add_pool(args: argparse.Namespace) -> int:
    api = _api_for(args.dir)
    names: list[str] = []
    for pool in _load_pools(None, args.spec):
        names += kube.create_pool(api, pool)
    kube.wait_nodes_ready(api, names)
    print(f"added {len(names)} nodes")
    return 0


def cmd_remove_pool(args: argparse.Namespace) -> int:
    api = _api_for(args.dir)
    for name in args.name:
        kube.delete_pool(api, name)
    print(f"removed pools: {', '.join(args.name)}")
    return 0


def cmd_images(args: argparse.Namespace) -> int:
    """Build (or reuse) the real-node tier's images; print where the tars are."""
    import logging

    from .images import ImageBuildError, build_images, check_images, clean_images

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    root = find_repo_root()
    cache = args.cache_dir or ToolPaths.for_repo(root).root
    if args.clean:
        clean_images(cache)
        print(f"removed {cache / 'images'}")
        return 0
    try:
        built = build_images(root, cache, ray=args.ray)
        checked = check_images(built, cache) if args.check else {}
    except ImageBuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    for image in (built.operator, built.ray):
        if image is not None:
            print(f"{image.ref}\t{image.tar}\t{'cached' if image.cached else 'built'}")
    for step, secs in {**built.steps, **checked}.items():
        print(f"  {step:<34} {secs:6.1f}s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpusim", description=__doc__)
    parser.add_argument(
        "--dir", type=Path, default=Path(".dev-cluster"), help="state/log directory"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the cluster and the node pools")
    up.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C stops it")
    up.add_argument("--pools", type=Path, help="YAML list of pools (default: the standard set)")
    up.add_argument(
        "--pool",
        action="append",
        default=[],
        help="NAME:TYPE:TOPOLOGY:NODES[:CHIPS] or NAME:cpu:NODES",
    )
    up.add_argument(
        "--timeout", type=float, default=180.0, help="per-component readiness bound (s)"
    )
    up.set_defaults(fn=cmd_up)
    sub.add_parser("down", help="stop a cluster started by up").set_defaults(fn=cmd_down)
    sub.add_parser("status", help="components and node pools").set_defaults(fn=cmd_status)
    add = sub.add_parser("add-pool", help="add pools to a running cluster")
    add.add_argument("spec", nargs="+", help="NAME:TYPE:TOPOLOGY:NODES[:CHIPS] or NAME:cpu:NODES")
    add.set_defaults(fn=cmd_add_pool)
    rm = sub.add_parser("remove-pool", help="delete every node of the named pools")
    rm.add_argument("name", nargs="+")
    rm.set_defaults(fn=cmd_remove_pool)
    images = sub.add_parser(
        "images", help="build the operator image (and the Ray image) with buildah, no daemon"
    )
    images.add_argument("--ray", action="store_true", help="also the Ray head image")
    images.add_argument("--cache-dir", type=Path, help="default: the tools cache directory")
    images.add_argument("--check", action="store_true", help="smoke-run the images after")
    images.add_argument("--clean", action="store_true", help="remove the images cache instead")
    images.set_defaults(fn=cmd_images)
    args = parser.parse_args(argv)
    result: int = args.fn(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
