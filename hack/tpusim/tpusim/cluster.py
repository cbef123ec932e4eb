"""The local simulated GKE cluster: real control-plane processes on loopback.

Start order and readiness gates:
  etcd (/health) -> kube-apiserver (/readyz) -> kube-controller-manager and
  kube-scheduler (/healthz) -> KWOK (/healthz) -> KubeRay CRDs (Established)
  -> ray-operator (/readyz) -> the `default` service account exists
  [-> with ``kueue=True``: Kueue CRDs (Established) -> kueue (/readyz) ->
  its webhook configurations, until a dry-run RayCluster comes back suspended].
Each wait is bounded; a failure names the component and its log, and stops
whatever was already started.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import yaml
from kubernetes.client import ApiException

from . import kube
from . import kueue as kueue_setup
from .certs import PKI, make_pki, write_kubeconfig
from .nodepools import NodePool, pool_names
from .processes import ComponentError, Process, free_port, http_ok, start, wait_until
from .stages import write_stages
from .tools import ToolPaths

__all__ = ["ClusterSettings", "LocalCluster", "StartupReport", "primary_address"]

T = TypeVar("T")

#: How long a node's lease may go unrenewed before the node lifecycle controller calls
#: it NotReady (kube-controller-manager --node-monitor-grace-period; 40 s by default).
NODE_MONITOR_GRACE_SECONDS = 120


@dataclass(frozen=True)
class ClusterSettings:
    """Everything a LocalCluster needs; no global configuration anywhere."""

    tools: ToolPaths
    run_dir: Path
    #: Bound for each component to become ready (the apiserver is the slow one).
    ready_timeout_s: float = 180.0
    #: True for tests: components die with the harness. False for `make dev-cluster`.
    die_with_parent: bool = True
    kuberay_feature_gates: str = "RayMultiHostIndexing=true"
    #: KubeRay's ``--reconcile-concurrency`` (ray-operator/main.go; 1 by default,
    #: apis/config/v1alpha1/defaults.go): how many RayClusters it reconciles at once.
    kuberay_reconcile_concurrency: int = 1
    service_cidr: str = "10.96.0.0/16"
    service_ip: str = "10.96.0.1"
    pod_cidr: str = "10.244.0.0/16"
    #: KWOK's node leases (``--node-lease-duration-seconds``): KWOK renews each a quarter
    #: of it apart (kwok v0.7.0 pkg/kwok/controllers/controller.go, ``leaseDuration / 4``),
    #: so 40 s is 10 s between renewals, 400 lease writes a second at 4,000 nodes.
    node_lease_seconds: int = 40
    #: kube-controller-manager ``--node-monitor-grace-period``: how long a node's lease
    #: may go unrenewed before the node lifecycle controller calls it NotReady.
    node_monitor_grace_seconds: int = NODE_MONITOR_GRACE_SECONDS
    cluster_name: str = "tpusim"
    #: Keep etcd's data directory after stop (for post-mortems); logs are always kept.
    keep_etcd_data: bool = False
    #: The VM's own address (see ``primary_address``) when a real kubelet node
    #: (tpusim.realnode) joins; None keeps the loopback-only control plane. Pods
    #: on a real node reach the API server through the ``kubernetes`` Service
    #: (10.96.0.1), which kube-proxy forwards to its endpoints: the API server
    #: must then listen on and advertise an address pods can route to.
    node_ip: str | None = None
    #: Also run a real Kueue manager (tpusim.kueue; `make tools` builds it), wired
    #: to the API server by URL on loopback. Off: the cluster has no Kueue at all.
    kueue: bool = False
    #: Integrations and WaitForPodsReady timeout of that Kueue.
    kueue_config: kueue_setup.KueueConfig = field(default_factory=kueue_setup.KueueConfig)


@dataclass
class StartupReport:
    """Seconds each step took; printed by the CLI and kept in state.json."""

    steps: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.steps.values())


class LocalCluster:
    """Owns the processes of one local cluster; use as a context manager.

    ``start()`` leaves a running cluster and writes ``<run_dir>/kubeconfig`` and
    ``<run_dir>/state.json`` (pids, so `down` from another process can stop a
    detached cluster); ``stop()`` stops everything in reverse order.
    """

    def __init__(self, settings: ClusterSettings) -> None:
        self.settings = settings
        self.run_dir = settings.run_dir
        self.log_dir = settings.run_dir / "logs"
        self.kubeconfig = settings.run_dir / "kubeconfig"
        self.report = StartupReport()
        self.ports: dict[str, int] = {}
        #: The certificates of this cluster (set by ``start``; a real node signs with its CA).
        self.pki: PKI | None = None
        self._procs: list[Process] = []
        self._api: Any = None
        self._stopped = False

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def api(self) -> Any:
        """An ApiClient for the admin kubeconfig (created on first use)."""
        if self._api is None:
            self._api = kube.api_client(self.kubeconfig)
        return self._api

    @property
    def processes(self) -> tuple[Process, ...]:
        return tuple(self._procs)

    def start(self) -> None:
        """Start every component and wait for each; on failure stop all and raise."""
        missing = self.settings.tools.missing()
        if self.settings.kueue:
            missing += self.settings.tools.kueue_missing()
        if missing:
            raise ComponentError(
                "tools",
                None,
                f"not built in {self.settings.tools.root}: {', '.join(missing)}; run `make tools`",
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.settings.die_with_parent:
            atexit.register(self.stop)
        try:
            pki = self._step(
                "certificates", lambda: make_pki(self.run_dir / "pki", self.settings.service_ip)
            )
            self.pki = pki
            self._start_etcd()
            self._start_apiserver(pki)
            self._start_controller_manager(pki)
            self._start_scheduler()
            self._start_kwok()
            self._step("kuberay-crds", self._install_kuberay_crds)
            self._start_kuberay()
            self._step("default-serviceaccount", self._wait_default_serviceaccount)
            if self.settings.kueue:
                self._start_kueue(pki)
        except BaseException:
            self.stop()
            raise
        finally:
            self._write_state()

    def stop(self) -> None:
        """Stop all components (reverse start order); safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if self._api is not None:
            with contextlib.suppress(Exception):
                self._api.close()
        for proc in reversed(self._procs):
            proc.stop()
        if not self.settings.keep_etcd_data:
            shutil.rmtree(self.run_dir / "etcd-data", ignore_errors=True)
        self._write_state()

    # ------------------------------------------------------------ node pools
    def add_pools(self, pools: Iterable[NodePool], timeout_s: float = 60.0) -> list[str]:
        """Create pools and wait for all their nodes to be Ready."""
        pools = list(pools)
        pool_names(pools)
        names: list[str] = []
        for pool in pools:
            names += kube.create_pool(self.api, pool, self.settings.cluster_name)
        kube.wait_nodes_ready(self.api, names, timeout_s)
        return names

    # ------------------------------------------------------------ components
    def _step(self, name: str, fn: Callable[[], T]) -> T:
        """Run one start-up step, recording how long it took."""
        began = time.monotonic()
        result = fn()
        self.report.steps[name] = round(time.monotonic() - began, 2)
        return result

    def _launch(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        proc = start(
            name,
            argv,
            self.log_dir,
            env=env,
            die_with_parent=self.settings.die_with_parent,
        )
        self._procs.append(proc)
        return proc

    def _wait(self, proc: Process, url: str, context: ssl.SSLContext | None = None) -> None:
        self._step(
            proc.name,
            lambda: wait_until(
                lambda: http_ok(url, context),
                timeout_s=self.settings.ready_timeout_s,
                what=f"GET {url} == 200",
                process=proc,
            ),
        )

    def _bin(self, name: str) -> str:
        return str(self.settings.tools.binary(name))

    def _start_etcd(self) -> None:
        client_port, peer_port = free_port(), free_port()
        self.ports.update(etcd=client_port, etcd_peer=peer_port)
        peer = f"http://127.0.0.1:{peer_port}"
        proc = self._launch(
            "etcd",
            [
                self._bin("etcd"),
                "--name=local",
                f"--data-dir={self.run_dir / 'etcd-data'}",
                f"--listen-client-urls=http://127.0.0.1:{client_port}",
                f"--advertise-client-urls=http://127.0.0.1:{client_port}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=local={peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait(proc, f"http://127.0.0.1:{client_port}/health")

    def apiserver_argv(self, pki: PKI, port: int) -> list[str]:
        """The kube-apiserver command line (separate so tests can check the flags).

        Loopback-only by default, with ``--endpoint-reconciler-type=none``: no pod
        ever dials the API server, so the ``kubernetes`` Service has no endpoints.
        With ``node_ip`` set (a real node joins), it listens on every address and
        advertises ``node_ip``, so the lease reconciler publishes ``node_ip:port``
        as the Service's endpoint; it reaches kubelets by their InternalIP (the
        node names do not resolve) with the admin certificate (``system:masters``
        passes the kubelet's webhook authorization) for ``logs``/``exec``.
        """
        node_ip = self.settings.node_ip
        argv = [
            self._bin("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            f"--bind-address={'0.0.0.0' if node_ip else '127.0.0.1'}",
            f"--advertise-address={node_ip or '127.0.0.1'}",
            f"--secure-port={port}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={self.settings.service_cidr}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--profiling=false",
        ]
        if node_ip:
            argv += [
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--kubelet-client-certificate={pki.admin_cert}",
                f"--kubelet-client-key={pki.admin_key}",
            ]
        else:
            argv.insert(-1, "--endpoint-reconciler-type=none")
        return argv

    def _start_apiserver(self, pki: PKI) -> None:
        port = free_port()
        self.ports["apiserver"] = port
        proc = self._launch("kube-apiserver", self.apiserver_argv(pki, port))
        write_kubeconfig(
            self.kubeconfig, f"https://127.0.0.1:{port}", pki, self.settings.cluster_name
        )
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        ctx.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        self._wait(proc, f"https://127.0.0.1:{port}/readyz", ctx)

    def _start_controller_manager(self, pki: PKI) -> None:
        port = free_port()
        self.ports["kube-controller-manager"] = port
        proc = self._launch(
            "kube-controller-manager",
            [
                self._bin("kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_cert}",
                f"--cluster-signing-cert-file={pki.ca_cert}",
                f"--cluster-signing-key-file={pki.ca_key}",
                f"--service-cluster-ip-range={self.settings.service_cidr}",
                "--profiling=false",
                # A simulated node is NotReady only when tpusim says so (it writes the
                # condition, kube.set_node_not_ready); KWOK renews the node leases, and on
                # two loaded cores its renewals have lagged past the 40 s default (after
                # a test made and deleted 160 nodes, four new nodes went NotReady by lease
                # expiry, again and again, and a test's slices were drained for it).
                f"--node-monitor-grace-period={self.settings.node_monitor_grace_seconds}s",
            ],
        )
        self._wait(proc, f"https://127.0.0.1:{port}/healthz", _insecure())

    def _start_scheduler(self) -> None:
        port = free_port()
        self.ports["kube-scheduler"] = port
        proc = self._launch(
            "kube-scheduler",
            [
                self._bin("kube-scheduler"),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--profiling=false",
            ],
        )
        self._wait(proc, f"https://127.0.0.1:{port}/healthz", _insecure())

    def _start_kwok(self) -> None:
        port = free_port()
        self.ports["kwok"] = port
        stages = write_stages(self.settings.tools.kwok_stages, self.run_dir / "kwok-stages")
        configs = [f"--config={p}" for p in stages]
        proc = self._launch(
            "kwok",
            [
                self._bin("kwok"),
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--cidr={self.settings.pod_cidr}",
                f"--node-lease-duration-seconds={self.settings.node_lease_seconds}",
                f"--server-address=127.0.0.1:{port}",
                *configs,
            ],
        )
        self._wait(proc, f"http://127.0.0.1:{port}/healthz")

    def _install_kuberay_crds(self) -> None:
        self._install_crds("kuberay-crds", self.settings.tools.kuberay_crds)

    def _install_crds(self, name: str, path: Path) -> None:
        kubectl = [self._bin("kubectl"), f"--kubeconfig={self.kubeconfig}"]
        crds = str(path)
        _run(
            name,
            [*kubectl, "apply", "--server-side", "--force-conflicts", "-f", crds],
            self.log_dir,
        )
        # kubectl wait fails at once (".status.conditions accessor error: <nil>") on a CRD
        # whose status the API server has not written yet, instead of waiting for it
        # (seen under load): ask again a few times.
        for attempt in range(5):
            try:
                _run(
                    name,
                    [*kubectl, "wait", "--for=condition=Established", "--timeout=60s", "-f", crds],
                    self.log_dir,
                )
                break
            except ComponentError:
                if attempt == 4:
                    raise
                time.sleep(1.0)

    def _start_kuberay(self) -> None:
        metrics, probe = free_port(), free_port()
        self.ports.update(ray_operator_metrics=metrics, ray_operator_probe=probe)
        proc = self._launch(
            "ray-operator",
            [
                self._bin("ray-operator"),
                "--enable-leader-election=false",
                f"--metrics-addr=127.0.0.1:{metrics}",
                f"--health-probe-bind-address=127.0.0.1:{probe}",
                f"--feature-gates={self.settings.kuberay_feature_gates}",
                f"--reconcile-concurrency={self.settings.kuberay_reconcile_concurrency}",
                "--log-stdout-encoder=console",
                # With a real node, KubeRay (on the host, outside cluster DNS) reaches a
                # real Ray head's dashboard through the API server's service proxy.
                *(["--use-kubernetes-proxy"] if self.settings.node_ip else []),
            ],
            env={"KUBECONFIG": str(self.kubeconfig)},
        )
        self._wait(proc, f"http://127.0.0.1:{probe}/readyz")

    def _start_kueue(self, pki: PKI) -> None:
        """Kueue's CRDs, then its manager, then its webhook configurations (the last so the
        API server never calls a webhook that is not listening yet)."""
        tools, config = self.settings.tools, self.settings.kueue_config
        directory = self.run_dir / "kueue"
        webhook, health, metrics = free_port(), free_port(), free_port()
        self.ports.update(kueue_webhook=webhook, kueue_health=health, kueue_metrics=metrics)
        ca_bundle = kueue_setup.write_serving_cert(pki, directory / "certs")
        # The same certificate at the fixed path Kueue's metrics server reads, in an
        # overlay over /etc that only the Kueue process sees (private_etc_argv).
        etc_upper, etc_work = directory / "etc-upper", directory / "etc-work"
        etc_work.mkdir(parents=True, exist_ok=True)
        kueue_setup.write_serving_cert(
            pki, etc_upper / kueue_setup.METRICS_CERT_DIR.relative_to("/etc")
        )
        base_url = f"https://127.0.0.1:{webhook}"
        crds_dir = directory / "crds"
        crds_dir.mkdir(parents=True, exist_ok=True)
        for source in sorted(tools.kueue_crds.glob("*.yaml")):
            crds = [
                kueue_setup.conversion_patched_crd(crd, base_url, ca_bundle)
                for crd in kueue_setup.load_documents(source)
            ]
            (crds_dir / source.name).write_text(yaml.safe_dump_all(crds, sort_keys=False))
        self._step("kueue-crds", lambda: self._install_crds("kueue-crds", crds_dir))
        with contextlib.suppress(ApiException):  # 409: already there
            kube.core_v1(self.api).create_namespace(
                {"metadata": {"name": kueue_setup.KUEUE_NAMESPACE}}
            )
        config_path = directory / "config.yaml"
        manager_config = kueue_setup.manager_configuration(
            config,
            webhook_port=webhook,
            health_port=health,
            metrics_port=metrics,
            cert_dir=directory / "certs",
        )
        config_path.write_text(yaml.safe_dump(manager_config, sort_keys=False))
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(config.gates.items()))
        argv = [str(tools.kueue_binary), f"--config={config_path}", f"--feature-gates={gates}"]
        proc = self._launch(
            "kueue",
            kueue_setup.private_etc_argv(etc_upper, etc_work, argv, root=os.geteuid() == 0),
            env={"KUBECONFIG": str(self.kubeconfig)},
        )
        self._wait(proc, f"http://127.0.0.1:{health}/readyz")
        hooks_path = directory / "webhooks.yaml"
        hooks = kueue_setup.webhook_configurations(
            kueue_setup.load_documents(tools.kueue_webhooks), config, base_url, ca_bundle
        )
        hooks_path.write_text(yaml.safe_dump_all(hooks, sort_keys=False))
        kubectl = [self._bin("kubectl"), f"--kubeconfig={self.kubeconfig}"]
        _run(
            "kueue-webhooks",
            [*kubectl, "apply", "--server-side", "-f", str(hooks_path)],
            self.log_dir,
        )
        self._step(
            "kueue-webhooks",
            lambda: wait_until(
                lambda: kueue_setup.webhook_answers(self.api),
                timeout_s=self.settings.ready_timeout_s,
                what="a dry-run RayCluster with a queue label comes back suspended",
                process=proc,
            ),
        )

    def _wait_default_serviceaccount(self) -> None:
        core = kube.core_v1(self.api)

        def exists() -> bool:
            try:
                core.read_namespaced_service_account("default", "default")
                return True
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise

        cm = next(p for p in self._procs if p.name == "kube-controller-manager")
        wait_until(
            exists,
            timeout_s=self.settings.ready_timeout_s,
            what="service account default/default (service-account controller)",
            process=cm,
        )

    # ------------------------------------------------------------ state
    def _write_state(self) -> None:
        if not self.run_dir.exists():
            return
        state = {
            "kubeconfig": str(self.kubeconfig),
            "run_dir": str(self.run_dir),
            "ports": self.ports,
            "startup_seconds": asdict(self.report)["steps"],
            "stopped": self._stopped,
            "components": [
                {"name": p.name, "pid": p.pid, "exe": p.argv[0], "log": str(p.log)}
                for p in self._procs
            ],
        }
        (self.run_dir / "state.json").write_text(json.dumps(state, indent=2) + "\n")


def primary_address() -> str:
    """The VM's primary IPv4 address: the source address of its default route.

    A UDP socket "connected" to an outside address makes the kernel pick the
    route and source address without sending anything. This is the address a
    real node registers as its InternalIP and the API server advertises.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("198.51.100.1", 9))  # TEST-NET-2; nothing is sent
        except OSError as exc:
            raise RuntimeError(f"no default IPv4 route to find the node address: {exc}") from exc
        address = str(sock.getsockname()[0])
    if address.startswith("127.") or address == "0.0.0.0":
        raise RuntimeError(f"the default route's source address is {address}, not a real one")
    return address


def _insecure() -> ssl.SSLContext:
    """For /healthz of components serving self-signed certificates on loopback."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _run(name: str, argv: list[str], log_dir: Path, timeout_s: float = 120.0) -> None:
    """Run a one-shot command, logging to ``<log_dir>/<name>.log``; raise naming it."""
    log = log_dir / f"{name}.log"
    with log.open("ab") as out:
        out.write(f"# {' '.join(argv)}\n".encode())
        out.flush()
        try:
            subprocess.run(
                argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=True
            )
        except subprocess.CalledProcessError as exc:
            raise ComponentError(name, log, f"command failed with code {exc.returncode}") from exc
        except subprocess.TimeoutExpired as exc:
            raise ComponentError(name, log, f"command timed out after {timeout_s:.0f}s") from exc
