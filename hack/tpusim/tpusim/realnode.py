"""One real kubelet node (containerd, CNI bridge, kube-proxy) joined to the local cluster.

The fake KWOK nodes run no containers. For tests that need a real pod (the
operator from its chart, with its webhook reached through a Service, probes,
logs and exec), this module starts on the host, next to a LocalCluster whose
``ClusterSettings.node_ip`` is set:

  containerd (own config, root, state and sockets under ``<run_dir>/realnode``)
  -> the pause image imported (built once from ``pause.c``, no registry)
  -> dnsmasq on NODE_IP:53 (``kubernetes.default.svc.cluster.local`` ->
     10.96.0.1, the rest forwarded to the host's nameserver: kopf dials that name)
  -> the kubelet (client cert ``system:node:<name>``, registered with the taint
     ``tpusim.dev/real=true:NoSchedule`` and the label ``tpusim.dev/real=true``)
     until the Node is Ready
  -> kube-proxy (iptables mode, flags that leave host sysctls alone) healthy.

Each wait is bounded and names the component and its log. Pods land on the
node only if they tolerate the taint; pin them with :meth:`RealNode.placement`.
Images come in as docker-archive tars through :meth:`RealNode.load_image`.

Everything the node changes outside its run directory is recorded first and
taken back by :func:`tpusim.hoststate.cleanup_host` (also from another process,
``python -m tpusim --dir D down`` or ``cleanup-host``); one real node per
machine (a host-wide lock). See tpusim/hoststate.py for the list.

Choices that differ from a kubeadm node, and why:
* ``protectKernelDefaults: false``: with true the kubelet refuses to start
  unless the host already has its six sysctls (kernel.panic=10,
  kernel.panic_on_oops=1, vm.overcommit_memory=1, ...), so we would have to set
  them ourselves anyway and the kubelet would exit on any host that differs.
  Instead the values are recorded before start and restored at stop.
* ``restrict_oom_score_adj`` in containerd: the sandbox asks for
  oom_score_adj -998; lowering it needs CAP_SYS_RESOURCE, which this kind of
  runner lacks (runc then fails with "can't get final child's PID from pipe").
* ``netns_mounts_under_state_dir``: pod network namespaces are bind-mounted in
  containerd's state dir, not /run/netns.
* ``podLogsDir`` and ``volumePluginDir`` in our directory, not /var/log/pods and
  /usr/libexec/kubernetes (the kubelet creates the latter for FlexVolume).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import yaml
from kubernetes.client import ApiException

from . import kube
from .certs import issue_client_cert, write_client_kubeconfig
from .cluster import LocalCluster, StartupReport
from .hoststate import (
    HOST_PATHS,
    LOCK_PATH,
    STATE_DIR_NAME,
    CleanupReport,
    HostLock,
    HostRecord,
    all_processes,
    cleanup_host,
    our_processes,
    port_conflicts,
    process_start,
    read_sysctls,
)
from .processes import ComponentError, Process, http_ok, start, wait_until
from .servicedns import ServiceDNS
from .tools import ToolPaths

__all__ = [
    "PAUSE_IMAGE",
    "REAL_NODE_LABEL",
    "REAL_NODE_TAINT",
    "REAL_NODE_TOLERATION",
    "NodePaths",
    "RealNode",
    "RealNodeSettings",
    "cni_conflist",
    "containerd_config",
    "dnsmasq_argv",
    "drain_node",
    "host_nameservers",
    "host_python_pod",
    "kube_proxy_argv",
    "kubelet_argv",
    "kubelet_config",
    "pause_image_tar",
]

T = TypeVar("T")

PAUSE_IMAGE = "localhost/pause:3.10"
#: Label and taint of the real node: nothing lands there unless it asks to.
REAL_NODE_LABEL = "tpusim.dev/real"
REAL_NODE_TAINT = {"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}
REAL_NODE_TOLERATION = {
    "key": REAL_NODE_LABEL,
    "operator": "Equal",
    "value": "true",
    "effect": "NoSchedule",
}
#: Debian's locations (packages containerd, runc, containernetworking-plugins).
CNI_BIN_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "portmap", "loopback")
HOST_COMMANDS = (
    "containerd",
    "containerd-shim-runc-v2",
    "runc",
    "ctr",
    "dnsmasq",
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip",
    "buildah",
    "gcc",
)
_GCC_FLAGS = ("-Os", "-static", "-s", "-Wall", "-Wextra")
# sun_path is 108 bytes; containerd appends ".ttrpc" to the gRPC socket.
_MAX_SOCKET_PATH = 100


@dataclass(frozen=True)
class RealNodeSettings:
    """What a RealNode needs beyond its cluster; all defaults fit one VM."""

    name: str = "tpusim-real"
    #: Not 10.244.0.0/16: KWOK hands fake pods addresses from that range.
    pod_cidr: str = "10.245.0.0/24"
    bridge: str = "tpusim-br0"
    max_pods: int = 20
    #: Bound for each piece (containerd socket, DNS answer, Node Ready, kube-proxy).
    ready_timeout_s: float = 90.0
    #: Bound for deleting the node's pods through the API before teardown.
    drain_timeout_s: float = 30.0
    lock_path: Path = LOCK_PATH
    cluster_domain: str = "cluster.local"


@dataclass(frozen=True)
class NodePaths:
    """The node's files, all under ``<run_dir>/realnode``."""

    state_dir: Path

    @property
    def containerd_config(self) -> Path:
        return self.state_dir / "containerd.toml"

    @property
    def containerd_dir(self) -> Path:
        return self.state_dir / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.state_dir / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.state_dir / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.state_dir / "cni" / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.state_dir / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.state_dir / "kubelet-config.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.state_dir / "kubelet.kubeconfig"

    @property
    def kube_proxy_kubeconfig(self) -> Path:
        return self.state_dir / "kube-proxy.kubeconfig"

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def pod_logs(self) -> Path:
        return self.state_dir / "pod-logs"

    @property
    def volume_plugins(self) -> Path:
        return self.state_dir / "volume-plugins"

    @property
    def dnsmasq_pid(self) -> Path:
        return self.state_dir / "dnsmasq.pid"

    @property
    def dns_hosts_dir(self) -> Path:
        """dnsmasq's ``--hostsdir``: the Services' names (tpusim.servicedns)."""
        return self.state_dir / "dns-hosts"


# ---------------------------------------------------------------- rendering (pure)
def _toml_str(value: str) -> str:
    return json.dumps(value)  # a TOML basic string for the paths and names we use


def containerd_config(paths: NodePaths, sandbox_image: str = PAUSE_IMAGE) -> str:
    """containerd 1.6 config (version 2): every path ours, CRI on our CNI config.

    Only the shim sockets stay in /run/containerd/s (a constant in 1.6).
    """
    d = paths.containerd_dir
    cri = '[plugins."io.containerd.grpc.v1.cri"'
    lines = [
        "version = 2",
        f"root = {_toml_str(str(d / 'root'))}",
        f"state = {_toml_str(str(d / 'state'))}",
        f"temp = {_toml_str(str(d / 'tmp'))}",
        "",
        "[grpc]",
        f"  address = {_toml_str(str(paths.containerd_socket))}",
        "",
        "[ttrpc]",
        f"  address = {_toml_str(str(paths.containerd_socket) + '.ttrpc')}",
        "",
        "[metrics]",
        '  address = ""',
        "",
        '[plugins."io.containerd.internal.v1.opt"]',
        f"  path = {_toml_str(str(d / 'opt'))}",
        "",
        f"{cri}]",
        f"  sandbox_image = {_toml_str(sandbox_image)}",
        "  restrict_oom_score_adj = true",
        "  netns_mounts_under_state_dir = true",
        '  stream_server_address = "127.0.0.1"',
        '  stream_server_port = "0"',
        "",
        f"{cri}.cni]",
        f"  bin_dir = {_toml_str(str(CNI_BIN_DIR))}",
        f"  conf_dir = {_toml_str(str(paths.cni_conf_dir))}",
        "  max_conf_num = 1",
        "",
        f"{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        "",
        f"{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        "",
        f"{cri}.containerd.runtimes.runc.options]",
        "  SystemdCgroup = false",
        f"  Root = {_toml_str(str(d / 'runc'))}",
        "",
    ]
    return "\n".join(lines)


def cni_conflist(
    settings: RealNodeSettings, paths: NodePaths, mtu: int | None = None
) -> dict[str, Any]:
    """Bridge + host-local IPAM + portmap: real pod IPs on ``settings.bridge``.

    ``mtu`` is the uplink's: the bridge plugin defaults to 1500, and on a VM
    whose interface has less (1400 here) pods' large packets to the outside
    would be dropped.
    """
    bridge: dict[str, Any] = {
        "type": "bridge",
        "bridge": settings.bridge,
        "isGateway": True,
        "ipMasq": True,
        "hairpinMode": True,
    }
    if mtu:
        bridge["mtu"] = mtu
    return {
        "cniVersion": "0.4.0",
        "name": "tpusim",
        "plugins": [
            {
                **bridge,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": settings.pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(paths.cni_ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(
    settings: RealNodeSettings, paths: NodePaths, node_ip: str, ca_file: Path
) -> dict[str, Any]:
    """KubeletConfiguration (kubelet.config.k8s.io/v1beta1, field names as in v1.34).

    Webhook authn/authz against the API server and x509 with the cluster CA,
    so the API server's client cert (``system:masters``) may call logs/exec;
    no read-only port; healthz on loopback; evictions and image GC set so a
    shared, mostly full disk never evicts or deletes the imported images.
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "failCgroupV1": False,
        "address": "0.0.0.0",
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": settings.cluster_domain,
        "clusterDNS": [node_ip],
        "resolvConf": "/etc/resolv.conf",
        "podLogsDir": str(paths.pod_logs),
        "volumePluginDir": str(paths.volume_plugins),
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 99,
        "imageGCLowThresholdPercent": 98,
        "serializeImagePulls": False,
        "maxPods": settings.max_pods,
        "protectKernelDefaults": False,
        "registerNode": True,
        "registerWithTaints": [dict(REAL_NODE_TAINT)],
    }


def kubelet_argv(
    kubelet: Path, settings: RealNodeSettings, paths: NodePaths, node_ip: str
) -> list[str]:
    """Flags for what KubeletConfiguration cannot say (identity, dirs, labels)."""
    return [
        str(kubelet),
        f"--config={paths.kubelet_config}",
        f"--kubeconfig={paths.kubelet_kubeconfig}",
        f"--root-dir={paths.kubelet_root}",
        f"--cert-dir={paths.kubelet_root / 'pki'}",
        f"--hostname-override={settings.name}",
        f"--node-ip={node_ip}",
        f"--node-labels={REAL_NODE_LABEL}=true",
        "--v=2",
    ]


def kube_proxy_argv(kube_proxy: Path, settings: RealNodeSettings, paths: NodePaths) -> list[str]:
    """iptables mode; the conntrack and localhost flags keep host sysctls as they are.

    ``--conntrack-max-per-core=0`` leaves nf_conntrack_max, the two timeouts at
    0 leave theirs (cmd/kube-proxy/app/server_linux.go setupConntrack), and
    ``--iptables-localhost-nodeports=false`` skips route_localnet=1.
    """
    return [
        str(kube_proxy),
        f"--kubeconfig={paths.kube_proxy_kubeconfig}",
        f"--hostname-override={settings.name}",
        "--proxy-mode=iptables",
        f"--cluster-cidr={settings.pod_cidr}",
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
        "--iptables-localhost-nodeports=false",
        "--metrics-bind-address=127.0.0.1:10249",
        "--healthz-bind-address=127.0.0.1:10256",
        "--v=2",
    ]


def uplink_mtu(address: str) -> int | None:
    """The MTU of the interface that carries ``address`` (None if not found)."""
    done = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False
    )
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[3].split("/")[0] == address:
            mtu = _read(f"/sys/class/net/{parts[1]}/mtu").strip()
            return int(mtu) if mtu.isdigit() else None
    return None


def host_nameservers(resolv_conf: str) -> list[str]:
    """The ``nameserver`` addresses of a resolv.conf text."""
    servers = []
    for line in resolv_conf.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            servers.append(parts[1])
    return servers


def dnsmasq_argv(
    node_ip: str, paths: NodePaths, upstreams: list[str], service_ip: str, domain: str
) -> list[str]:
    """dnsmasq answering the in-cluster names, forwarding the rest.

    Only NODE_IP:53 (``--bind-interfaces``), no /etc/dnsmasq.conf, /etc/hosts or
    resolv.conf. ``kubernetes.default.svc`` (kopf dials it) is fixed; other
    Services' names come from the hosts files in ``paths.dns_hosts_dir``, which
    tpusim.servicedns keeps in step with the API (dnsmasq rereads them itself);
    any other ``<domain>`` name answers NXDOMAIN locally instead of going to the
    host's resolver. ``--user=root`` so it never changes uid.
    """
    argv = [
        "dnsmasq",
        "--keep-in-foreground",
        "--log-facility=-",
        "--conf-file=/dev/null",
        "--user=root",
        f"--pid-file={paths.dnsmasq_pid}",
        f"--listen-address={node_ip}",
        "--bind-interfaces",
        "--port=53",
        "--no-resolv",
        "--no-hosts",
        f"--hostsdir={paths.dns_hosts_dir}",
        f"--local=/{domain}/",
        f"--address=/kubernetes.default.svc.{domain}/{service_ip}",
    ]
    argv += [f"--server={s}" for s in upstreams if s != node_ip]
    return argv


def dns_query(name: str, qid: int = 0x7470) -> bytes:
    """A DNS query packet for the A record of ``name`` (recursion desired)."""
    header = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split("."))
    return header + labels + b"\0" + struct.pack("!HH", 1, 1)


def dns_a_records(packet: bytes) -> list[str]:
    """IPv4 addresses in the answer section of a DNS response."""

    def skip_name(off: int) -> int:
        while True:
            length = packet[off]
            if length == 0:
                return off + 1
            if length & 0xC0 == 0xC0:
                return off + 2
            off += length + 1

    _qid, _flags, questions, answers, _ns, _ar = struct.unpack("!HHHHHH", packet[:12])
    off = 12
    for _ in range(questions):
        off = skip_name(off) + 4
    found = []
    for _ in range(answers):
        off = skip_name(off)
        rtype, _rclass, _ttl, length = struct.unpack("!HHIH", packet[off : off + 10])
        off += 10
        if rtype == 1 and length == 4:
            found.append(socket.inet_ntoa(packet[off : off + 4]))
        off += length
    return found


def resolve_via(server: str, name: str, timeout_s: float = 0.25) -> list[str]:
    """Ask ``server``:53 over UDP for ``name``'s A records (empty on no answer)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.sendto(dns_query(name), (server, 53))
            data, _ = sock.recvfrom(4096)
        except OSError:
            return []
    return dns_a_records(data)


def host_python_pod(
    name: str,
    script: str,
    *,
    namespace: str = "default",
    node: str = "tpusim-real",
) -> dict[str, Any]:
    """A Pod that runs the host's python3 on the real node: a probe without an image.

    The container is the pause image with the host's /usr (and /usr/lib, /usr/lib64
    as /lib, /lib64, for the ELF interpreter) mounted read-only, so on a merged-/usr
    host like Debian 12 ``/usr/bin/python3 -c script`` runs in the pod's own
    network namespace, DNS and service account: enough to check that a pod
    reaches ``https://kubernetes.default.svc``. Needs a namespace that admits
    hostPath volumes (not Pod Security ``restricted``).
    """
    volumes = [
        ("host-usr", "/usr", "/usr"),
        ("host-lib", "/usr/lib", "/lib"),  # /usr/lib64/ld-linux-x86-64.so.2 -> /lib/...
        ("host-lib64", "/usr/lib64", "/lib64"),
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [dict(REAL_NODE_TOLERATION)],
            "containers": [
                {
                    "name": "probe",
                    "image": PAUSE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/usr/bin/python3", "-c", script],
                    "volumeMounts": [
                        {"name": v, "mountPath": target, "readOnly": True}
                        for v, _src, target in volumes
                    ],
                }
            ],
            "volumes": [
                {"name": v, "hostPath": {"path": src, "type": "Directory"}}
                for v, src, _target in volumes
            ],
        },
    }


# ---------------------------------------------------------------- the pause image
def pause_image_tar(tools: ToolPaths, log_dir: Path) -> Path:
    """The pause image as a docker-archive tar in the tools cache, built once.

    ``gcc -Os -static`` of pause.c, then ``buildah from scratch`` + copy,
    entrypoint ``/pause``, user 65535, tagged ``localhost/pause:3.10`` and
    pushed to ``docker-archive:``. buildah uses a throwaway ``--root`` and
    ``--runroot`` (vfs driver: no mounts), and its blob-info cache under
    /var/lib/containers is removed again if this build created it. The tar's
    name carries a hash of the source and flags, so an edit rebuilds it.
    """
    source = Path(__file__).with_name("pause.c")
    digest = hashlib.sha256(
        source.read_bytes() + " ".join((*_GCC_FLAGS, PAUSE_IMAGE)).encode()
    ).hexdigest()[:12]
    out_dir = tools.root / "pause"
    tar = out_dir / f"pause-{digest}.tar"
    if tar.exists():
        return tar
    out_dir.mkdir(parents=True, exist_ok=True)
    with _flock(out_dir / ".lock"):
        if tar.exists():
            return tar
        had_containers = os.path.lexists("/var/lib/containers")
        work = Path(tempfile.mkdtemp(prefix="build-", dir=out_dir))
        try:
            binary = work / "pause"
            _logged("pause-image", ["gcc", *_GCC_FLAGS, "-o", str(binary), str(source)], log_dir)
            buildah = [
                "buildah",
                f"--root={work / 'storage'}",
                f"--runroot={work / 'run'}",
                "--storage-driver=vfs",
            ]
            ctr = _logged("pause-image", [*buildah, "from", "scratch"], log_dir).strip()
            _logged("pause-image", [*buildah, "copy", ctr, str(binary), "/pause"], log_dir)
            _logged(
                "pause-image",
                [*buildah, "config", "--entrypoint", '["/pause"]', "--user", "65535:65535", ctr],
                log_dir,
            )
            _logged("pause-image", [*buildah, "commit", "--quiet", ctr, PAUSE_IMAGE], log_dir)
            partial = work / "pause.tar"
            _logged(
                "pause-image",
                [
                    *buildah,
                    "push",
                    "--quiet",
                    PAUSE_IMAGE,
                    f"docker-archive:{partial}:{PAUSE_IMAGE}",
                ],
                log_dir,
            )
            partial.replace(tar)
        finally:
            shutil.rmtree(work, ignore_errors=True)
            if not had_containers:
                shutil.rmtree("/var/lib/containers", ignore_errors=True)
    return tar


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _logged(name: str, argv: list[str], log_dir: Path, timeout_s: float = 600.0) -> str:
    """Run a one-shot command, append its output to ``<log_dir>/<name>.log``, return stdout."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise ComponentError(name, log, f"{argv[0]} timed out after {timeout_s:.0f}s") from exc
    except OSError as exc:
        raise ComponentError(name, log, f"cannot run {argv[0]}: {exc}") from exc
    with log.open("a") as out:
        out.write(f"# {' '.join(argv)}\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        raise ComponentError(name, log, f"{' '.join(argv[:3])} failed with code {done.returncode}")
    return done.stdout


# ---------------------------------------------------------------- the node
class RealNode:
    """A real kubelet node of a running LocalCluster; use as a context manager.

    ``start()`` leaves the Node Ready with kube-proxy healthy, or stops
    whatever it started and raises ComponentError naming the piece and its
    log (RealNodeBusy if another real node owns the machine). ``stop()``
    deletes the node's pods through the API, then takes everything back
    (tpusim.hoststate.cleanup_host) and deletes the Node object. Stop the
    node before its cluster (nested ``with`` blocks do).
    """

    def __init__(self, cluster: LocalCluster, settings: RealNodeSettings | None = None) -> None:
        if cluster.settings.node_ip is None:
            raise ValueError(
                "a real node needs ClusterSettings(node_ip=tpusim.primary_address()): "
                "the API server must listen where pods can reach it"
            )
        self.cluster = cluster
        self.settings = settings or RealNodeSettings()
        self.node_ip: str = cluster.settings.node_ip
        self.paths = NodePaths(cluster.run_dir / STATE_DIR_NAME)
        self.log_dir = cluster.log_dir
        self.lock = HostLock(self.settings.lock_path)
        self.report = StartupReport()
        self.record: HostRecord | None = None
        self.cleanup_report: CleanupReport | None = None
        #: Seconds the last stop() took (drain + host cleanup).
        self.stop_seconds: float | None = None
        self._procs: list[Process] = []
        #: Publishes the Services' names to dnsmasq while this object's process lives.
        self.service_dns: ServiceDNS | None = None
        self._stopped = False

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> RealNode:
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
    def name(self) -> str:
        return self.settings.name

    @property
    def socket(self) -> Path:
        return self.paths.containerd_socket

    @property
    def processes(self) -> tuple[Process, ...]:
        return tuple(self._procs)

    @staticmethod
    def placement() -> dict[str, Any]:
        """Pod spec fields that put a pod on the real node and nowhere else."""
        return {
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "tolerations": [dict(REAL_NODE_TOLERATION)],
        }

    def start(self) -> None:
        """Start containerd, dnsmasq, the kubelet and kube-proxy; wait for each."""
        self._preflight()
        self.paths.state_dir.mkdir(parents=True, exist_ok=True)
        tools = self.cluster.settings.tools
        record = HostRecord(
            run_dir=str(self.cluster.run_dir),
            state_dir=str(self.paths.state_dir),
            node_name=self.name,
            node_ip=self.node_ip,
            bridge=self.settings.bridge,
            pod_cidr=self.settings.pod_cidr,
            containerd_socket=str(self.socket),
            kube_proxy=str(tools.binary("kube-proxy")),
            owner_pid=os.getpid(),
            owner_start=process_start(os.getpid()),
            started_at=time.time(),
        )
        stale = self._step("host-lock", lambda: self.lock.claim(record))
        self.record = record
        self._stopped = False
        if self.cluster.settings.die_with_parent:
            atexit.register(self.stop)
        try:
            if stale is not None:
                self._clean_stale(stale)
            # The baseline is taken after any stale node was cleaned up.
            record.sysctls = read_sysctls()
            record.preexisting = [p for p in HOST_PATHS if os.path.lexists(p)]
            self._save()
            conflicts = port_conflicts(self.node_ip)
            if conflicts:
                raise ComponentError("real-node", None, "ports taken: " + "; ".join(conflicts))
            self._step("node-config", self._write_config)
            tar = self._step("pause-image", lambda: pause_image_tar(tools, self.log_dir))
            self._start_containerd()
            self._step("pause-import", lambda: self.load_image(tar))
            self.paths.dns_hosts_dir.mkdir(parents=True, exist_ok=True)
            self._start_dnsmasq()
            self.service_dns = ServiceDNS(
                self.cluster.api,
                self.paths.dns_hosts_dir / "services",
                self.settings.cluster_domain,
            )
            self.service_dns.start()
            self._start_kubelet()
            self._start_kube_proxy()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Delete the node's pods, stop everything, take back every host change."""
        if self._stopped or self.record is None:
            return
        self._stopped = True
        began = time.monotonic()
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        kubelet = next((p for p in self._procs if p.name == "kubelet"), None)
        if kubelet is not None and kubelet.alive():
            with contextlib.suppress(Exception):
                drain_node(self.cluster.api, self.name, self.socket, self.settings.drain_timeout_s)
        if self.service_dns is not None:
            self.service_dns.stop()
        self.cleanup_report = cleanup_host(self.record, lock=self.lock)
        for proc in self._procs:
            with contextlib.suppress(Exception):
                proc.popen.wait(timeout=5)
        with contextlib.suppress(Exception):
            kube.core_v1(self.cluster.api).delete_node(self.name, _request_timeout=10)
        self.stop_seconds = round(time.monotonic() - began, 2)

    # ------------------------------------------------------------ images
    def load_image(self, tar: Path, timeout_s: float = 600.0) -> list[str]:
        """Import a docker-archive (or OCI) tar into the node's containerd for the kubelet.

        Names are kept (``localhost/tpuslice-operator:0.1.0``); pods use them
        with ``imagePullPolicy: Never`` (or IfNotPresent). Returns the names.
        """
        out = _logged(
            "ctr-import",
            [*self._ctr(), "images", "import", str(tar)],
            self.log_dir,
            timeout_s=timeout_s,
        )
        return re.findall(r"unpacking (\S+) \(", out)

    def images(self) -> list[str]:
        """Image names in the node's containerd (k8s.io namespace)."""
        return _logged("ctr", [*self._ctr(), "images", "ls", "-q"], self.log_dir).split()

    def rss_mib(self) -> dict[str, float]:
        """Resident memory of the node's processes (shims summed), MiB."""
        out: dict[str, float] = {}
        marker = [str(self.paths.state_dir)]
        for pid, name in our_processes(all_processes(), marker):
            for line in _read(f"/proc/{pid}/status").splitlines():
                if line.startswith("VmRSS:"):
                    out[name] = out.get(name, 0.0) + int(line.split()[1]) / 1024
        return {k: round(v, 1) for k, v in out.items()}

    def _ctr(self) -> list[str]:
        return ["ctr", f"--address={self.socket}", "--namespace=k8s.io"]

    # ------------------------------------------------------------ start-up pieces
    def _preflight(self) -> None:
        if os.geteuid() != 0:
            raise ComponentError("real-node", None, "needs root (containerd, iptables, mounts)")
        missing = [c for c in HOST_COMMANDS if shutil.which(c) is None]
        missing += [str(CNI_BIN_DIR / p) for p in CNI_PLUGINS if not (CNI_BIN_DIR / p).exists()]
        if missing:
            raise ComponentError(
                "real-node",
                None,
                f"missing on this host: {', '.join(missing)}; run `bash hack/realnode-deps.sh`",
            )
        tools = self.cluster.settings.tools
        for binary in ("kubelet", "kube-proxy"):
            if not os.access(tools.binary(binary), os.X_OK):
                raise ComponentError(binary, None, f"not built in {tools.bin}; run `make tools`")
        if len(str(self.socket)) > _MAX_SOCKET_PATH:
            raise ComponentError(
                "containerd", None, f"socket path too long for a unix socket: {self.socket}"
            )
        if "apiserver" not in self.cluster.ports or self.cluster.pki is None:
            raise ComponentError("real-node", None, "start the LocalCluster before its real node")

    def _clean_stale(self, stale: HostRecord) -> None:
        report = self._step(
            "stale-cleanup", lambda: cleanup_host(stale, lock=self.lock, taking_over=True)
        )
        if report.failed:
            raise ComponentError(
                "real-node",
                None,
                f"a dead real node of {stale.run_dir} left things cleanup could not remove: "
                f"{'; '.join(report.failed)}; fix them, then "
                f"`python -m tpusim --dir {stale.run_dir} cleanup-host`",
            )

    def _write_config(self) -> None:
        pki = self.cluster.pki
        assert pki is not None  # checked in _preflight
        server = f"https://127.0.0.1:{self.cluster.ports['apiserver']}"
        cert, key = issue_client_cert(
            pki, self.paths.pki, "kubelet", f"system:node:{self.name}", "system:nodes"
        )
        write_client_kubeconfig(
            self.paths.kubelet_kubeconfig,
            server,
            pki.ca_cert,
            cert,
            key,
            name=self.cluster.settings.cluster_name,
            user=f"system:node:{self.name}",
        )
        cert, key = issue_client_cert(pki, self.paths.pki, "kube-proxy", "system:kube-proxy")
        write_client_kubeconfig(
            self.paths.kube_proxy_kubeconfig,
            server,
            pki.ca_cert,
            cert,
            key,
            name=self.cluster.settings.cluster_name,
            user="system:kube-proxy",
        )
        config = kubelet_config(self.settings, self.paths, self.node_ip, pki.ca_cert)
        self.paths.kubelet_config.write_text(yaml.safe_dump(config, sort_keys=False))
        self.paths.containerd_config.write_text(containerd_config(self.paths))
        self.paths.cni_conf_dir.mkdir(parents=True, exist_ok=True)
        conflist = cni_conflist(self.settings, self.paths, uplink_mtu(self.node_ip))
        (self.paths.cni_conf_dir / "10-tpusim.conflist").write_text(json.dumps(conflist, indent=2))
        for directory in (self.paths.pod_logs, self.paths.volume_plugins, self.paths.kubelet_root):
            directory.mkdir(parents=True, exist_ok=True)

    def _start_containerd(self) -> None:
        self.paths.containerd_dir.mkdir(parents=True, exist_ok=True)
        proc = self._launch(
            "containerd", ["containerd", f"--config={self.paths.containerd_config}"]
        )

        def serving() -> bool:
            if not self.socket.exists():
                return False
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                try:
                    sock.connect(str(self.socket))
                except OSError:
                    return False
            return True

        self._wait(proc, serving, f"socket {self.socket} accepting")

    def _start_dnsmasq(self) -> None:
        upstreams = host_nameservers(_read("/etc/resolv.conf"))
        domain = self.settings.cluster_domain
        service_ip = self.cluster.settings.service_ip
        argv = dnsmasq_argv(self.node_ip, self.paths, upstreams, service_ip, domain)
        argv[0] = shutil.which("dnsmasq") or argv[0]
        proc = self._launch("dnsmasq", argv)
        name = f"kubernetes.default.svc.{domain}"
        self._wait(
            proc,
            lambda: service_ip in resolve_via(self.node_ip, name),
            f"{self.node_ip}:53 answering {name} -> {service_ip}",
        )

    def _start_kubelet(self) -> None:
        tools = self.cluster.settings.tools
        proc = self._launch(
            "kubelet",
            kubelet_argv(tools.binary("kubelet"), self.settings, self.paths, self.node_ip),
        )
        self._wait(proc, lambda: http_ok("http://127.0.0.1:10248/healthz"), "kubelet /healthz")
        core = kube.core_v1(self.cluster.api)

        def node_ready() -> bool:
            try:
                return kube.node_ready(core.read_node(self.name, _request_timeout=5))
            except ApiException:
                return False

        self._wait(proc, node_ready, f"Node {self.name} Ready", step="node-ready")

    def _start_kube_proxy(self) -> None:
        tools = self.cluster.settings.tools
        proc = self._launch(
            "kube-proxy", kube_proxy_argv(tools.binary("kube-proxy"), self.settings, self.paths)
        )
        self._wait(proc, lambda: http_ok("http://127.0.0.1:10256/healthz"), "kube-proxy /healthz")

    # ------------------------------------------------------------ helpers
    def _step(self, name: str, fn: Callable[[], T]) -> T:
        began = time.monotonic()
        result = fn()
        self.report.steps[name] = round(time.monotonic() - began, 2)
        return result

    def _launch(self, name: str, argv: list[str]) -> Process:
        if not os.path.isabs(argv[0]):
            argv = [shutil.which(argv[0]) or argv[0], *argv[1:]]
        proc = start(
            name, argv, self.log_dir, die_with_parent=self.cluster.settings.die_with_parent
        )
        self._procs.append(proc)
        assert self.record is not None
        self.record.components.append(
            {"name": name, "pid": proc.pid, "exe": argv[0], "log": str(proc.log)}
        )
        self._save()
        return proc

    def _wait(
        self, proc: Process, check: Callable[[], bool], what: str, step: str | None = None
    ) -> None:
        self._step(
            step or proc.name,
            lambda: wait_until(
                check, timeout_s=self.settings.ready_timeout_s, what=what, process=proc
            ),
        )

    def _save(self) -> None:
        if self.record is not None:
            self.record.save()
            self.lock.update(self.record)


def drain_node(api: Any, node: str, containerd_socket: Path, timeout_s: float = 30.0) -> int:
    """Cordon ``node`` and delete its pods through the API; wait for their containers.

    The kubelet then stops each pod's sandbox the normal way (CNI DEL frees
    the address and removes the masquerade rule). Returns how many pods were
    deleted; whatever is still running after ``timeout_s`` is killed by the
    host cleanup instead.
    """
    core = kube.core_v1(api)
    # Bounded calls: an API server in graceful shutdown may accept and never answer.
    core.patch_node(node, {"spec": {"unschedulable": True}}, _request_timeout=10)
    pods = core.list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={node}", _request_timeout=10
    ).items
    for pod in pods:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                grace_period_seconds=1,
                _request_timeout=10,
            )
    ctr = ["ctr", f"--address={containerd_socket}", "--namespace=k8s.io", "tasks", "ls"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            listed = subprocess.run(ctr, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            break
        if "RUNNING" not in listed:
            break
        time.sleep(0.5)
    return len(pods)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
