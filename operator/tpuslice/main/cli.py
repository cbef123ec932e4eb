"""The ``tpuslice`` command: see what a TPUSliceCluster, TPUSliceJob or TPUSliceService
becomes, and run the operator.

Invalid input exits with status 2 and one message per problem on stderr,
naming the field and the fix; stdout stays empty, so ``tpuslice render -f x |
kubectl apply -f -`` never applies half a result.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from tpuslice.controller.queue import PASS_SLOTS
from tpuslice.model import constants
from tpuslice.model.topology import TopologyError, slice_shape
from tpuslice.render.kuberay import RENDERERS, render
from tpuslice.spec.bounds import MAX_HOSTS_CEILING, SpecLimits
from tpuslice.spec.parts import SpecError

EXIT_INVALID = 2


class InputError(Exception):
    """Bad user input; the CLI prints the lines and exits with status 2."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)


def _format_table(row: dict[str, object]) -> str:
    width = max(len(k) for k in row)
    return "\n".join(f"{k.upper():<{width}}  {v}" for k, v in row.items()) + "\n"


def _cmd_topology(args: argparse.Namespace, out: TextIO) -> None:
    try:
        shape = slice_shape(args.type, args.topology, args.chips_per_host)
    except TopologyError as exc:
        flag = {"type": "--type", "topology": "--topology", "chipsPerHost": "--chips-per-host"}
        raise InputError([f"{flag[exc.field]}: {exc.message}"]) from exc
    row = shape.to_dict()
    if args.output == "json":
        out.write(json.dumps(row, indent=2) + "\n")
    elif args.output == "yaml":
        out.write(yaml.safe_dump(row, sort_keys=False))
    else:
        out.write(_format_table(row))


class _RenderDumper(yaml.SafeDumper):
    """Multi-line strings (serveConfigV2, runtimeEnvYAML) as literal blocks, as users
    write them, instead of one escaped line."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value and not value.startswith(" ") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_RenderDumper.add_representer(str, _represent_str)

#: The kinds ``tpuslice render`` reads, as messages name them.
_KINDS = ", ".join(list(RENDERERS)[:-1]) + f" or {list(RENDERERS)[-1]}"


def _documents(stream: TextIO, source: str) -> Iterator[tuple[int, Any]]:
    try:
        for number, doc in enumerate(yaml.safe_load_all(stream), start=1):
            if doc is not None:
                yield number, doc
    except yaml.YAMLError as exc:
        raise InputError([f"{source}: not valid YAML: {exc}"]) from exc


def _render_documents(stream: TextIO, source: str) -> list[dict[str, Any]]:
    rendered: list[dict[str, Any]] = []
    problems: list[str] = []
    for number, doc in _documents(stream, source):
        where = f"{source} document {number}"
        if not isinstance(doc, dict) or doc.get("kind") not in RENDERERS:
            kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
            problems.append(f"{where}: kind {kind!r} is not {_KINDS}")
            continue
        if doc.get("apiVersion") != constants.API_VERSION:
            problems.append(
                f"{where}: apiVersion {doc.get('apiVersion')!r} must be {constants.API_VERSION}"
            )
            continue
        try:
            rendered.append(render(doc))
        except SpecError as exc:
            name = (doc.get("metadata") or {}).get("name", "?")
            problems += [f"{where} ({name}): {error}" for error in exc.errors]
    if problems:
        raise InputError(problems)
    if not rendered:
        raise InputError([f"{source}: no {_KINDS} found"])
    return rendered


def _cmd_render(args: argparse.Namespace, out: TextIO) -> None:
    if args.filename == "-":
        clusters = _render_documents(sys.stdin, "stdin")
    else:
        try:
            with open(args.filename, encoding="utf-8") as handle:
                clusters = _render_documents(handle, args.filename)
        except OSError as exc:
            raise InputError([f"-f {args.filename}: {exc.strerror}"]) from exc
    out.write(yaml.dump_all(clusters, Dumper=_RenderDumper, sort_keys=False))


def instance_identity(env: Mapping[str, str]) -> str:
    """The pod name (``POD_NAME``, set by the chart from the downward API), else
    ``<host>-<pid>``: unique per process, readable in logs, never the user name."""
    return env.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


#: Where a pod finds its own namespace (the service account's mounted token dir).
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _context_namespace(kubeconfig: str | None) -> str | None:
    from kubernetes import config as k8s_config

    try:
        _, active = k8s_config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except Exception:  # no kubeconfig, or an unreadable one: the run itself will say so
        return None
    return (active or {}).get("context", {}).get("namespace") or None


def lease_namespace(
    flag: str | None,
    env: Mapping[str, str],
    kubeconfig: str | None,
    *,
    service_account_file: Path = SERVICE_ACCOUNT_NAMESPACE,
) -> str:
    """Where the Lease lives: ``--leader-elect-namespace``, else ``POD_NAMESPACE`` (the
    chart sets it), else the pod's own namespace, else the kubeconfig context's, else
    ``default``. The operator's own namespace is the Kubernetes convention, and the
    chart's Role grants the Lease there and nowhere else."""
    if flag:
        return flag
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    if kubeconfig is None and service_account_file.exists():
        return service_account_file.read_text().strip() or "default"
    return _context_namespace(kubeconfig) or "default"


def _webhook_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The MutatingWebhookConfiguration's settings, checked before anything starts."""
    from tpuslice.webhook import configuration as webhook_config

    problems = []
    selector = None
    if args.webhook_namespace_selector is not None:
        try:
            selector = webhook_config.parse_namespace_selector(args.webhook_namespace_selector)
        except ValueError as exc:
            problems.append(f"--webhook-namespace-selector: {exc}")
    if not 1 <= args.webhook_timeout_seconds <= 30:
        problems.append(
            f"--webhook-timeout-seconds: {args.webhook_timeout_seconds} must be between 1 and 30 "
            f"(a Kubernetes limit)"
        )
    if problems:
        raise InputError(problems)
    return {
        "webhook_timeout_seconds": args.webhook_timeout_seconds,
        "pin_at_admission": args.pin_at_admission,
        "pin_fence_margin_seconds": max(0.0, args.pin_fence_margin_seconds),
        "webhook_failure_policy": args.webhook_failure_policy,
        "webhook_namespace_selector": selector,
    }


def _webhook_config(args: argparse.Namespace) -> dict[str, Any]:
    """The settings ``run`` and ``webhook`` share: the API client, the process's own
    probes and metrics, the webhooks' server, certificates and configurations."""
    return {
        "kubeconfig": args.kubeconfig,
        "identity": instance_identity(os.environ),
        "shutdown_drain_seconds": args.shutdown_drain_seconds,
        "liveness_port": args.liveness_port or None,
        "log_level": args.log_level,
        "webhook_port": args.webhook_port or None,
        "webhook_addr": args.webhook_addr,
        "webhook_url": args.webhook_url,
        "webhook_service": args.webhook_service,
        "webhook_namespace": args.webhook_namespace or os.environ.get("POD_NAMESPACE"),
        "webhook_cert_dir": args.webhook_cert_dir,
        "webhook_secret": args.webhook_secret,
        "manage_webhook_configuration": not args.no_manage_webhook_configuration,
        **_webhook_settings(args),
        "metrics_port": args.metrics_port or None,
        "metrics_addr": args.metrics_addr,
    }


def _cmd_run(args: argparse.Namespace, out: TextIO) -> None:
    from tpuslice.main.app import run_operator  # kopf is imported only when running
    from tpuslice.runtime.config import OperatorConfig
    from tpuslice.runtime.memory import limit_malloc_arenas

    limit_malloc_arenas()  # before kopf's and the request threads start
    run_operator(
        OperatorConfig(
            **_webhook_config(args),
            namespaces=tuple(args.namespaces),
            resync_seconds=args.resync_seconds,
            sweep_seconds=args.sweep_seconds,
            leader_elect=args.leader_elect,
            lease_namespace=lease_namespace(
                args.leader_elect_namespace, os.environ, args.kubeconfig
            ),
            lease_name=args.leader_elect_lease_name,
            max_slices_per_object=args.max_slices_per_object,
            max_hosts_per_object=args.max_hosts_per_object,
            concurrent_passes=args.concurrent_passes,
            status_batch_seconds=args.status_batch_seconds,
            kueue_pods_ready_timeout_s=args.kueue_pods_ready_timeout,
            kueue_pods_ready_recovery_timeout_s=args.kueue_pods_ready_recovery_timeout,
        )
    )


def _cmd_webhook(args: argparse.Namespace, out: TextIO) -> None:
    from tpuslice.main.webhook_process import run_webhook  # never imports kopf
    from tpuslice.runtime.config import OperatorConfig
    from tpuslice.runtime.memory import limit_malloc_arenas

    limit_malloc_arenas()  # before the server's threads start

    if not args.webhook_port:
        raise InputError(["--webhook-port: this command serves the webhooks; give a port"])
    # No Lease: every replica answers admission calls, and none acts on the cluster.
    run_webhook(OperatorConfig(**_webhook_config(args), leader_elect=False))


#: The longest waitForPodsReady timeout the flags take (Kueue's own has no bound).
_A_WEEK = 7 * 24 * 3600


def _seconds_up_to(ceiling: int) -> Any:
    """An argparse type: whole seconds from 0 to ``ceiling``, else a usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds") from None
        if not 0 <= value <= ceiling:
            raise argparse.ArgumentTypeError(f"must be from 0 to {ceiling}, got {value}")
        return value

    return parse


def _count_from_1_to(ceiling: int) -> Any:
    """An argparse type: an integer from 1 to ``ceiling``, else a usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not 1 <= value <= ceiling:
            raise argparse.ArgumentTypeError(f"must be from 1 to {ceiling}, got {value}")
        return value

    return parse


def _add_process_flags(parser: argparse.ArgumentParser) -> None:
    """The API client, logging, probes, drain and metrics of a long-running command."""
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="path to a kubeconfig (default: in-cluster config, then $KUBECONFIG / ~/.kube/config)",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR")
    )
    parser.add_argument(
        "--liveness-port",
        type=int,
        default=8080,
        help="serve /healthz (liveness) and /readyz (readiness) on this port (0 disables)",
    )
    parser.add_argument(
        "--shutdown-drain-seconds",
        type=float,
        default=5.0,
        help="after SIGTERM, keep answering webhook calls this long (not ready, each "
        "answer closing its connection) so none in flight is refused",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=8000,
        help="serve Prometheus /metrics on this port (0 disables; see docs/metrics.md)",
    )
    parser.add_argument("--metrics-addr", default="0.0.0.0", help="listen address of /metrics")


def _add_webhook_flags(parser: argparse.ArgumentParser, *, port_help: str) -> None:
    """The webhooks' server, certificates and configurations (``run`` and ``webhook``)."""
    hook = parser.add_argument_group("admission webhooks (TPU identity, TPUSlicePolicy)")
    hook.add_argument(
        "--webhook-port",
        type=int,
        default=9443,
        help=port_help,
    )
    hook.add_argument(
        "--webhook-addr", default=None, help="listen address (default: all interfaces)"
    )
    hook.add_argument(
        "--webhook-url",
        default=None,
        help="out of cluster: base URL the API server calls, e.g. https://127.0.0.1:9443",
    )
    hook.add_argument(
        "--webhook-service",
        default=None,
        help="in cluster: the Service in front of the webhook port",
    )
    hook.add_argument(
        "--webhook-namespace",
        default=None,
        help="namespace of --webhook-service (default: $POD_NAMESPACE)",
    )
    hook.add_argument(
        "--webhook-cert-dir",
        default="/tmp/tpuslice-webhook",
        help="tls.crt, tls.key and ca.crt are used if present (cert-manager); "
        "otherwise a self-signed set is written here",
    )
    hook.add_argument(
        "--webhook-secret",
        default=None,
        help="a Secret in --webhook-namespace through which every replica shares one CA "
        "and serving certificate (the first fills it; the chart renders it empty); "
        "default: the cert dir only",
    )
    hook.add_argument(
        "--no-manage-webhook-configuration",
        action="store_true",
        help="do not apply the MutatingWebhookConfiguration (e.g. cert-manager's "
        "CA injector maintains it)",
    )
    hook.add_argument(
        "--webhook-timeout-seconds",
        type=int,
        default=5,
        help="timeoutSeconds of the configuration (1-30): how long the API server waits "
        "for an answer before applying the failure policy",
    )
    hook.add_argument(
        "--pin-at-admission",
        action="store_true",
        help="pin a new TPU pod to its slice's already-held, healthy node pool at admission "
        "(the leader marks the reservation; the identity webhook removes the gate and sets "
        "the nodeSelector): no gate and no release patch for the pods of a held slice, and a "
        "replica KubeRay recreates lands on its index's pool at once. Give it to both `run` "
        "and `webhook` (README.md, Pin at admission)",
    )
    hook.add_argument(
        "--pin-fence-margin-seconds",
        type=float,
        default=10.0,
        help="with --pin-at-admission: seconds beyond --webhook-timeout-seconds between "
        "removing a node pool's pin mark and letting the pool go",
    )
    hook.add_argument(
        "--webhook-failure-policy",
        choices=("Fail", "Ignore"),
        default="Fail",
        help="failurePolicy of the configuration: Fail (default) refuses TPU worker pods "
        "while the webhook is unreachable (KubeRay retries); Ignore admits them without "
        "their TPU identity, and they hang in JAX start-up",
    )
    hook.add_argument(
        "--webhook-namespace-selector",
        default=None,
        metavar="JSON",
        help="namespaceSelector of the configuration, a label selector as JSON "
        "(default: every namespace but kube-system, "
        '{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"NotIn",'
        '"values":["kube-system"]}]})',
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpuslice",
        description="TPUSlice tools: inspect TPU slice shapes, render RayClusters, RayJobs "
        "and RayServices, run the operator.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    topology = commands.add_parser(
        "topology",
        help="show what a TPU type and topology mean on GKE",
        description="Resolve a TPU type and topology into chips, hosts and the names GKE "
        "and Ray use.",
    )
    topology.add_argument(
        "--type",
        required=True,
        help="v4, v5e, v5p, v6e, tpu7x or a GKE accelerator label value such as tpu-v6e-slice",
    )
    topology.add_argument("--topology", required=True, help="e.g. 4x4 or 2x2x2")
    topology.add_argument(
        "--chips-per-host",
        type=int,
        default=None,
        help="only to settle v5e/v6e 2x4: 8 (one host, default) or 4",
    )
    topology.add_argument("-o", "--output", choices=("json", "yaml", "table"), default="table")
    topology.set_defaults(func=_cmd_topology)

    render = commands.add_parser(
        "render",
        help="print the RayCluster, RayJob or RayService each TPUSlice object becomes",
        description="Read TPUSliceCluster, TPUSliceJob and TPUSliceService YAML (several "
        "documents allowed) and print the RayCluster, RayJob or RayService each becomes.",
    )
    render.add_argument("-f", "--filename", required=True, help="a YAML file, or - for stdin")
    render.set_defaults(func=_cmd_render)

    run = commands.add_parser(
        "run",
        help="run the operator",
        description="Run the operator against the current kubeconfig (or the in-cluster "
        "config), watching all namespaces unless --namespace is given.",
    )
    _add_process_flags(run)
    run.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        dest="namespaces",
        help="watch only this namespace (repeatable; default: all namespaces)",
    )
    run.add_argument(
        "--resync-seconds",
        type=float,
        default=60.0,
        help="every TPUSlice object has a pass about this often (the safety net under the "
        "events), spread over the interval",
    )
    run.add_argument(
        "--sweep-seconds",
        type=float,
        default=60.0,
        help="how often each SliceReservation is checked for a holder that is gone",
    )
    election = run.add_argument_group("leader election")
    election.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="act only while holding a coordination.k8s.io Lease; otherwise serve the "
        "webhook as a standby (default: on; --no-leader-elect: act unconditionally)",
    )
    election.add_argument(
        "--leader-elect-namespace",
        default=None,
        help="namespace of the Lease (default: $POD_NAMESPACE, the pod's own namespace, "
        "the kubeconfig context's, else default)",
    )
    election.add_argument(
        "--leader-elect-lease-name",
        default="tpuslice-operator",
        help="name of the Lease; instances sharing it elect one leader",
    )
    run.add_argument(
        "--concurrent-passes",
        type=_count_from_1_to(1024),
        default=PASS_SLOTS,
        help="passes running at once, every kind together; an object's first pass goes "
        "ahead of waiting re-passes (default %(default)s)",
    )
    run.add_argument(
        "--status-batch-seconds",
        type=_seconds_up_to(constants.MAX_STATUS_BATCH_SECONDS),
        default=0,
        metavar="SECONDS",
        help="write a status change that flips no condition (slice states, counts, "
        "messages) this long after the first one, with every change after it: fewer "
        "status writes where hundreds of objects come up at once, progress shown that "
        "much later; conditions are written at once (default 0: within 2 s; at most "
        f"{constants.MAX_STATUS_BATCH_SECONDS})",
    )
    limits = run.add_argument_group("limits (README.md, Limits)")
    limits.add_argument(
        "--max-slices-per-object",
        type=_count_from_1_to(constants.MAX_SLICES),
        default=SpecLimits().max_slices,
        help="most spec.tpu.slices one TPUSlice object may ask for; more ends its pass "
        f"InvalidSpec (default %(default)s, at most {constants.MAX_SLICES})",
    )
    limits.add_argument(
        "--max-hosts-per-object",
        type=_count_from_1_to(MAX_HOSTS_CEILING),
        default=SpecLimits().max_hosts,
        help="most TPU hosts (worker pods: slices x hosts per slice) one TPUSlice object "
        f"may ask for (default %(default)s, at most {MAX_HOSTS_CEILING})",
    )
    kueue = run.add_argument_group("Kueue (README.md, Kueue)")
    kueue.add_argument(
        "--kueue-pods-ready-timeout",
        type=_seconds_up_to(_A_WEEK),
        default=0,
        metavar="SECONDS",
        help="Kueue's waitForPodsReady.timeout, as Kueue's Configuration sets it: the "
        "status of an admitted object whose pods are not all ready says when Kueue "
        "evicts it (default 0: not told, the status names no time)",
    )
    kueue.add_argument(
        "--kueue-pods-ready-recovery-timeout",
        type=_seconds_up_to(_A_WEEK),
        default=None,
        metavar="SECONDS",
        help="Kueue's waitForPodsReady.recoveryTimeout (default: the timeout, as Kueue's; "
        "0: Kueue's recovery check is off)",
    )
    _add_webhook_flags(
        run,
        port_help="HTTPS port of the webhooks served in this process (0: not here, when "
        "`tpuslice webhook` serves them in a process of its own, as the chart does)",
    )
    run.set_defaults(func=_cmd_run)

    webhook = commands.add_parser(
        "webhook",
        help="serve the admission webhooks alone (no reconciles, no Lease)",
        description="Serve the TPU identity and TPUSlicePolicy admission webhooks in a "
        "process of their own, next to `tpuslice run --webhook-port=0`: admission never "
        "waits on the reconcile loop, and a flood of admission calls never slows the leader.",
    )
    _add_process_flags(webhook)
    _add_webhook_flags(webhook, port_help="HTTPS port of the webhooks")
    webhook.set_defaults(func=_cmd_webhook)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args, sys.stdout)
    except InputError as exc:
        for line in exc.lines:
            print(f"error: {line}", file=sys.stderr)
        return EXIT_INVALID
    return 0


if __name__ == "__main__":
    sys.exit(main())
