"""Command line: ``python -m tpusim up|down|status|add-pool|remove-pool|provisioner|...``.

`up` detaches by default (the cluster outlives the command, as `make
dev-cluster` wants); `up --foreground` keeps it in this process until Ctrl-C.
State (pids, ports, kubeconfig) lives in ``--dir`` so `down` and `status` from
another shell find it. `up --real-node` adds one real kubelet node
(tpusim.realnode; root); `down` takes it and every host change back, and
`cleanup-host` does that alone from the recorded state (after a crash).
`schedule-maintenance`, `start-maintenance`, `clear-maintenance`, `terminate`,
`unterminate`, `spot-notice` and `partition-state` put GKE's node signals on fake
nodes (tpusim.maintenance). `provisioner` runs the fake GKE provisioner (tpusim.provisioner) in the
foreground against the cluster of ``--dir`` (or ``--kubeconfig``); `slicectl` likewise runs the
simulated GKE slice controller for TPU7x dynamic slicing (tpusim.slicectl), `slice-create` makes a
Slice over named partitions and `slice-fault` fails or degrades one on demand.
`real-tpu-pool` makes the real node a one-node single-host TPU pool (GKE's TPU labels
and taint, ``google.com/tpu`` advertised; tpusim.realtpu); ``--leave`` takes it back.
`autoscale` sends one RayCluster patch exactly as Ray's autoscaler would
(tpusim.autoscaler): grow a worker group to ``--slices`` or name pods in
``workersToDelete`` with ``--delete-pod``.
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
from .cluster import ClusterSettings, LocalCluster, primary_address
from .hoststate import (
    STATE_DIR_NAME,
    HostLock,
    HostRecord,
    RealNodeBusy,
    cleanup_host,
    host_leftovers,
)
from .kueue import create_queues, pool_tpu_chips
from .nodepools import PRESETS, NodePool, default_pools, parse_pool_spec, pool_from_dict
from .processes import ComponentError, exit_on_signals, kill_recorded
from .realnode import REAL_NODE_LABEL, RealNode, drain_node
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
    if args.real_node:
        try:
            HostLock().check(directory)
        except RealNodeBusy as exc:
            print(exc, file=sys.stderr)
            return 1
    old_node = HostRecord.load(directory / STATE_DIR_NAME)
    if old_node is not None and not old_node.cleaned and not _cleanup_real_node(old_node):
        return 1
    for sub in ("logs", "pki", "etcd-data", "kubeconfig", "state.json", STATE_DIR_NAME):
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
        node_ip=primary_address() if args.real_node else None,
        kueue=args.kueue,
    )
    cluster = LocalCluster(settings)
    node = RealNode(cluster) if args.real_node else None
    exit_on_signals()
    began = time.monotonic()
    try:
        cluster.start()
        nodes = cluster.add_pools(pools)
        if args.kueue:
            # Every pool's chips under one ClusterQueue `tpu`, a LocalQueue `tpu` in default.
            create_queues(cluster.api, namespaces=["default"], tpu_chips=pool_tpu_chips(pools))
        if node is not None:
            node.start()
    except (ComponentError, RealNodeBusy) as exc:
        print(f"cluster failed to start: {exc}", file=sys.stderr)
        if node is not None:
            node.stop()
        cluster.stop()
        return 1
    except BaseException:
        if node is not None:
            node.stop()
        cluster.stop()
        raise
    elapsed = time.monotonic() - began
    print(
        f"local cluster up in {elapsed:.1f}s ({len(nodes)} fake nodes); logs in {cluster.log_dir}"
    )
    for step, secs in cluster.report.steps.items():
        print(f"  {step:<24} {secs:6.1f}s")
    if node is not None:
        print(f"real node {node.name} Ready ({settings.node_ip}, pods {node.settings.pod_cidr}):")
        for step, secs in node.report.steps.items():
            print(f"  {step:<24} {secs:6.1f}s")
        print(f"  pin pods with: {json.dumps(node.placement())}")
    print(f"\n  export KUBECONFIG={cluster.kubeconfig}")
    print(f"  {settings.tools.binary('kubectl')} get nodes -L cloud.google.com/gke-nodepool")
    if not args.foreground:
        print("\nstop it with: make dev-cluster-down")
        return 0
    print("\nrunning in the foreground; Ctrl-C stops it")
    everything = cluster.processes + (node.processes if node is not None else ())
    try:
        while all(p.alive() for p in everything):
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        if node is not None:
            node.stop()
        cluster.stop()
    return 0


def _cleanup_real_node(record: HostRecord, kubeconfig: Path | None = None) -> bool:
    """Drain (if the kubelet and API still answer) and clean up a recorded real node."""
    kubelet = next((c for c in record.components if c["name"] == "kubelet"), None)
    if kubeconfig is not None and kubeconfig.exists() and kubelet and _alive(kubelet):
        try:
            deleted = drain_node(
                kube.api_client(kubeconfig), record.node_name, Path(record.containerd_socket)
            )
            print(f"deleted {deleted} pods of real node {record.node_name}")
        except Exception as exc:  # the host cleanup below kills what is left
            print(f"could not drain {record.node_name} through the API: {exc}")
    try:
        report = cleanup_host(record, lock=HostLock())
    except RealNodeBusy as exc:
        print(exc, file=sys.stderr)
        return False
    for line in report.done:
        print(f"  {line}")
    for line in report.failed:
        print(f"  FAILED: {line}", file=sys.stderr)
    left = host_leftovers(record)
    for line in left:
        print(f"  left on the host: {line}", file=sys.stderr)
    return not report.failed and not left


def cmd_down(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    state = _load_state(directory)
    node = HostRecord.load(directory / STATE_DIR_NAME)
    node_ok = True
    if node is not None and not node.cleaned:
        kubeconfig = Path(state["kubeconfig"]) if state else None
        print(f"real node {node.node_name}:")
        node_ok = _cleanup_real_node(node, kubeconfig)
    if state is None:
        print(f"no cluster state in {directory}; nothing to stop")
        return 0 if node_ok else 1
    stopped = [
        c["name"]
        for c in reversed(state["components"])
        if kill_recorded(int(c["pid"]), str(c["exe"]))
    ]
    shutil.rmtree(directory / "etcd-data", ignore_errors=True)
    state["stopped"] = True
    (directory / "state.json").write_text(json.dumps(state, indent=2) + "\n")
    print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
    return 0 if node_ok else 1


def cmd_cleanup_host(args: argparse.Namespace) -> int:
    """Take back a real node's host changes from its recorded state (after a crash)."""
    directory: Path = args.dir.resolve()
    lock = HostLock()
    record = HostRecord.load(directory / STATE_DIR_NAME) or lock.owner()
    if record is None:
        left = host_leftovers(lock=lock)
        print(f"no real node recorded in {directory} or {lock.path}")
        for line in left:
            print(f"  left on the host: {line}")
        return 1 if left else 0
    print(f"cleaning up after real node {record.node_name} of {record.run_dir}")
    return 0 if _cleanup_real_node(record) else 1


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
    node = HostRecord.load(directory / STATE_DIR_NAME)
    if node is not None and not node.cleaned:
        print(f"  real node {node.node_name} ({node.node_ip}, pods {node.pod_cidr}):")
        for comp in node.components:
            alive = _alive(comp)
            running &= alive
            word = "running" if alive else "STOPPED"
            print(f"    {comp['name']:<22} pid {comp['pid']:<8} {word:<8} {comp['log']}")
    if not running:
        return 1
    api = kube.api_client(Path(state["kubeconfig"]))
    pools: dict[str, list[str]] = {}
    for node in kube.core_v1(api).list_node().items:
        labels = node.metadata.labels or {}
        pool = labels.get("cloud.google.com/gke-nodepool", "-")
        if labels.get(REAL_NODE_LABEL) == "true":
            pool = "(real node)"
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


POOL_SPEC_HELP = (
    "NAME:TYPE:TOPOLOGY:NODES[:CHIPS][,spot|flex-start|reservation=R|block=B|subblock=S"
    "|dynamic-slicing|partition=ID|partition-state=STATE|slice=NAME|slice-topology=T], "
    f"NAME:cpu:NODES or a preset: {', '.join(sorted(PRESETS))}"
)


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


def _targets(api: Any, names: Sequence[str]) -> list[Any]:
    """Nodes named directly or as ``pool:NAME`` (every node of that harness pool)."""
    core = kube.core_v1(api)
    found: list[Any] = []
    for name in names:
        if name.startswith("pool:"):
            nodes = kube.harness_nodes(api, name.removeprefix("pool:"))
            if not nodes:
                raise SystemExit(f"no nodes in pool {name.removeprefix('pool:')!r}")
            found += nodes
        else:
            found.append(core.read_node(name))
    return found


def cmd_disrupt(args: argparse.Namespace) -> int:
    """Play GKE's maintenance, termination, Spot or partition signal on nodes."""
    api = _api_for(args.dir)
    for node in _targets(api, args.node):
        try:
            kube.disrupt(
                api,
                node.metadata.name,
                args.action,
                in_s=getattr(args, "in_s", 0.0),
                latest_in_s=getattr(args, "latest_in_s", None),
                state=getattr(args, "state", ""),
            )
        except ValueError as exc:
            print(f"{node.metadata.name}: {exc}", file=sys.stderr)
            return 2
        print(f"{node.metadata.name}: {args.action}")
    return 0


def cmd_real_tpu_pool(args: argparse.Namespace) -> int:
    """Make the real node a one-node single-host TPU pool, or take that back."""
    from .realnode import REAL_NODE_LABEL
    from .realtpu import join_tpu_pool, leave_tpu_pool, real_tpu_pool

    api = _api_for(args.dir)
    nodes = kube.core_v1(api).list_node(label_selector=f"{REAL_NODE_LABEL}=true").items
    if not nodes:
        raise SystemExit(f"no real node (label {REAL_NODE_LABEL}=true): start with up --real-node")
    try:
        pool = real_tpu_pool(args.pool, args.type, args.topology, args.chips)
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    for node in nodes:
        if args.leave:
            leave_tpu_pool(api, node.metadata.name, pool)
            print(f"{node.metadata.name}: no longer in TPU pool {pool.name}")
        else:
            join_tpu_pool(api, node.metadata.name, pool)
            print(f"{node.metadata.name}: TPU pool {pool.name} ({pool.tpu_type} {pool.topology})")
    return 0


def cmd_provisioner(args: argparse.Namespace) -> int:
    """Install the ProvisioningRequest CRD and play GKE's side until Ctrl-C."""
    import logging

    from .provisioner import FakeProvisioner, ProvisionerSettings, install_crd
    from .provreq import Timings, parse_autoscaled_spec

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    api = kube.api_client(args.kubeconfig) if args.kubeconfig else _api_for(args.dir)
    if args.install_only:
        install_crd(api)
        print("ProvisioningRequest CRD installed")
        return 0
    timings = Timings(
        accept_delay_s=args.accept_delay,
        provision_delay_s=args.provision_delay,
        booking_s=args.booking,
        pending_retry_s=args.pending_retry,
        scale_down_delay_s=args.scale_down_delay,
    )
    try:
        declared = tuple(parse_autoscaled_spec(spec) for spec in args.autoscaled_pool)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    fake = FakeProvisioner(
        api,
        ProvisionerSettings(timings=timings, interval_s=args.interval, autoscaled_pools=declared),
    )
    exit_on_signals()
    fake.start()
    print(f"fake GKE provisioner running ({timings}); Ctrl-C stops it")
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        fake.stop(remove_pools=args.remove_pools)
    return 0


def cmd_slicectl(args: argparse.Namespace) -> int:
    """Install the Slice CRD and play GKE's slice controller until Ctrl-C."""
    import logging

    from .slicectl import SliceController, SliceControllerSettings, install_crd
    from .slices import Timings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    api = kube.api_client(args.kubeconfig) if args.kubeconfig else _api_for(args.dir)
    if args.install_only:
        install_crd(api)
        print("Slice CRD installed")
        return 0
    try:
        settings = SliceControllerSettings(
            timings=Timings(activation_s=args.activation), interval_s=args.interval
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ctl = SliceController(api, settings)
    exit_on_signals()
    ctl.start()
    print(f"simulated GKE slice controller running ({settings.timings}); Ctrl-C stops it")
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        ctl.stop()
    return 0


def cmd_slice_create(args: argparse.Namespace) -> int:
    """Create a Slice over named partitions, as a custom scheduler would."""
    from kubernetes import client

    from .slices import GROUP, KIND, PLURAL, RETRY_ANNOTATION, VERSION

    api = kube.api_client(args.kubeconfig) if args.kubeconfig else _api_for(args.dir)
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": args.name},
        "spec": {"type": "tpu7x", "topology": args.topology, "partitionIds": args.partition},
    }
    if args.retry_on_failure:
        body["metadata"]["annotations"] = {RETRY_ANNOTATION: "true"}
    client.CustomObjectsApi(api).create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    print(f"slice {args.name} created ({args.topology}, {len(args.partition)} partition(s))")
    return 0


def cmd_slice_fault(args: argparse.Namespace) -> int:
    """Put a fault on one Slice: the simulated controller acts on it next pass."""
    from .slicectl import SliceController

    api = kube.api_client(args.kubeconfig) if args.kubeconfig else _api_for(args.dir)
    SliceController(api).set_fault(args.name, args.fault)
    print(f"slice {args.name}: fault {args.fault}")
    return 0


def cmd_autoscale(args: argparse.Namespace) -> int:
    """Send one scale patch as Ray's autoscaler v2 would, and print it."""
    from .autoscaler import AutoscaleError, delete_pods, scale

    if args.delete_pod and args.group:
        print(
            "--group is for --slices; a deleted pod's group is its ray.io/group label",
            file=sys.stderr,
        )
        return 2
    api = kube.api_client(args.kubeconfig) if args.kubeconfig else _api_for(args.dir)
    try:
        if args.delete_pod:
            patch = delete_pods(api, args.namespace, args.cluster, args.delete_pod)
        else:
            patch = scale(api, args.namespace, args.cluster, args.group, args.slices)
    except AutoscaleError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(json.dumps(patch) if patch else "no change: Ray's autoscaler would send no patch")
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


DISRUPT_HELP = {
    "schedule-maintenance": "announce maintenance: scheduled-maintenance-time(-latest) labels",
    "start-maintenance": "maintenance begins: active-node-maintenance=ONGOING + window taint",
    "clear-maintenance": "maintenance over: every maintenance label and taint removed",
    "terminate": "impending-node-termination:NoSchedule taint",
    "unterminate": "remove the impending-node-termination taint",
    "spot-notice": "Spot reclaim notice (termination taint; Spot nodes only)",
    "partition-state": "set a tpu7x node's partition-4x4x4-state label",
    "out-of-service": "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute (node is off)",
    "in-service": "remove the node.kubernetes.io/out-of-service taint",
}


def _add_disrupt_commands(sub: Any) -> None:
    """GKE's node signals on demand (docs/local-cluster.md, tpusim.maintenance)."""
    for action, text in DISRUPT_HELP.items():
        cmd = sub.add_parser(action, help=text)
        cmd.add_argument("node", nargs="+", help="node name, or pool:NAME for a whole pool")
        if action == "schedule-maintenance":
            cmd.add_argument(
                "--in", dest="in_s", type=float, default=3600.0, help="seconds from now"
            )
            cmd.add_argument(
                "--latest-in", dest="latest_in_s", type=float, help="latest start (s from now)"
            )
        if action == "partition-state":
            cmd.add_argument(
                "--state", required=True, help="HEALTHY|DEGRADED|UNHEALTHY|UNSET|INCOMPLETE"
            )
        cmd.set_defaults(fn=cmd_disrupt, action=action)


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
        help=POOL_SPEC_HELP,
    )
    up.add_argument(
        "--timeout", type=float, default=180.0, help="per-component readiness bound (s)"
    )
    up.add_argument(
        "--real-node",
        action="store_true",
        help="also a real kubelet+containerd node (root; one per machine; tpusim.realnode)",
    )
    up.add_argument(
        "--kueue",
        action="store_true",
        help="also a real Kueue (tpusim.kueue) with ClusterQueue and LocalQueue `tpu` (default ns)",
    )
    up.set_defaults(fn=cmd_up)
    sub.add_parser("down", help="stop a cluster started by up").set_defaults(fn=cmd_down)
    sub.add_parser("status", help="components and node pools").set_defaults(fn=cmd_status)
    sub.add_parser(
        "cleanup-host",
        help="undo a real node's host changes from its recorded state (after a crash)",
    ).set_defaults(fn=cmd_cleanup_host)
    add = sub.add_parser("add-pool", help="add pools to a running cluster")
    add.add_argument("spec", nargs="+", help=POOL_SPEC_HELP)
    add.set_defaults(fn=cmd_add_pool)
    rm = sub.add_parser("remove-pool", help="delete every node of the named pools")
    rm.add_argument("name", nargs="+")
    rm.set_defaults(fn=cmd_remove_pool)
    _add_disrupt_commands(sub)
    real_tpu = sub.add_parser(
        "real-tpu-pool",
        help="the real node as a one-node single-host TPU pool (labels, taint, google.com/tpu)",
    )
    real_tpu.add_argument("--pool", default="real-v6e-2x2", help="gke-nodepool name")
    real_tpu.add_argument("--type", default="v6e", help="TPU type (v4, v5e, v5p, v6e, tpu7x)")
    real_tpu.add_argument("--topology", default="2x2", help="a single-host topology")
    real_tpu.add_argument("--chips", type=int, default=4, help="google.com/tpu to advertise")
    real_tpu.add_argument("--leave", action="store_true", help="take labels, taint, chips back")
    real_tpu.set_defaults(fn=cmd_real_tpu_pool)
    prov = sub.add_parser(
        "provisioner",
        help="fake GKE ProvisioningRequest provisioner in the foreground (docs/local-cluster.md)",
    )
    prov.add_argument("--kubeconfig", type=Path, help="default: the cluster of --dir")
    prov.add_argument("--install-only", action="store_true", help="install the CRD and exit")
    prov.add_argument("--interval", type=float, default=0.5, help="seconds between passes")
    prov.add_argument("--accept-delay", type=float, default=1.0, help="created -> Accepted (s)")
    prov.add_argument(
        "--provision-delay", type=float, default=3.0, help="Accepted -> nodes, Provisioned (s)"
    )
    prov.add_argument(
        "--booking", type=float, default=600.0, help="Provisioned -> BookingExpired (s)"
    )
    prov.add_argument(
        "--pending-retry",
        type=float,
        default=120.0,
        help="queued: no matching pool -> Failed after (s)",
    )
    prov.add_argument(
        "--scale-down-delay", type=float, default=30.0, help="empty pool -> removed after (s)"
    )
    prov.add_argument(
        "--remove-pools", action="store_true", help="on exit delete every node it made"
    )
    prov.add_argument(
        "--autoscaled-pool",
        action="append",
        default=[],
        metavar="SPEC",
        help="declare a single-host pool that exists with 0..MAX_NODES nodes and grows per "
        "request: NAME:TYPE:TOPOLOGY:MAX_NODES[,queued][,spot][,flex-start]"
        "[,reservation=NAME], or v6e-2x2-autoscaled / v6e-2x2-queued (repeatable)",
    )
    prov.set_defaults(fn=cmd_provisioner)
    ctl = sub.add_parser(
        "slicectl",
        help="simulated GKE slice controller (TPU7x Slices) in the foreground "
        "(docs/local-cluster.md)",
    )
    ctl.add_argument("--kubeconfig", type=Path, help="default: the cluster of --dir")
    ctl.add_argument("--install-only", action="store_true", help="install the CRD and exit")
    ctl.add_argument("--interval", type=float, default=0.5, help="seconds between passes")
    ctl.add_argument(
        "--activation", type=float, default=3.0, help="ACTIVATING -> ACTIVE (s, 0-3600)"
    )
    ctl.set_defaults(fn=cmd_slicectl)
    mk = sub.add_parser("slice-create", help="create a tpu7x Slice over named partitions")
    mk.add_argument("--kubeconfig", type=Path, help="default: the cluster of --dir")
    mk.add_argument("name", help="the Slice's name (at most 49 lowercase chars)")
    mk.add_argument("topology", help="AxBxC, e.g. 4x4x8 (two partitions)")
    mk.add_argument("partition", nargs="+", help="gke-tpu-partition-4x4x4-id of each partition")
    mk.add_argument(
        "--retry-on-failure", action="store_true", help="annotate slice.gke.io/retry-on-failure"
    )
    mk.set_defaults(fn=cmd_slice_create)
    fault = sub.add_parser("slice-fault", help="fail, degrade or stall one Slice on demand")
    fault.add_argument("--kubeconfig", type=Path, help="default: the cluster of --dir")
    fault.add_argument("name", help="the Slice's name")
    fault.add_argument(
        "fault",
        choices=["fail", "degrade", "never", "none"],
        help="fail: FAILED; degrade: ACTIVE_DEGRADED while set; never: stays ACTIVATING; "
        "none: clear",
    )
    fault.set_defaults(fn=cmd_slice_fault)
    auto = sub.add_parser(
        "autoscale",
        help="patch a RayCluster as Ray's autoscaler v2 does (docs/local-cluster.md)",
    )
    auto.add_argument("--kubeconfig", type=Path, help="default: the cluster of --dir")
    auto.add_argument("--namespace", required=True)
    auto.add_argument("--cluster", required=True, help="the RayCluster's name")
    what = auto.add_mutually_exclusive_group(required=True)
    what.add_argument("--slices", type=int, help="grow the group to this many replicas")
    what.add_argument(
        "--delete-pod",
        action="append",
        metavar="POD",
        help="name a worker pod in workersToDelete (repeatable; KubeRay deletes its slice)",
    )
    auto.add_argument("--group", help="worker group for --slices (default: the only one)")
    auto.set_defaults(fn=cmd_autoscale)
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
