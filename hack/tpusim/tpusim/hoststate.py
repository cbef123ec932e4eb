"""What the real node changes on the host, the host-wide lock, and taking it all back.

A real kubelet node (tpusim.realnode) cannot keep to its run directory the way
the control plane does: the kubelet, containerd and the CNI plugins write fixed
host paths even when told to use their own directories, kube-proxy, the kubelet
and the CNI plugins install iptables chains, the bridge plugin creates a bridge
and turns on IPv4 forwarding, the kubelet changes kernel sysctls
(``setupKernelTunables``), makes ``kubepods`` cgroups in every v1 hierarchy and
bind-mounts its root directory, and the fixed ports (10250, 10248, 10249,
10256, NODE_IP:53) are host-wide. So:

* Before anything is changed, a :class:`HostRecord` notes the sysctl values,
  which of the fixed paths already existed, and (as they start) the pids of
  the node's processes. It is kept both in ``<run_dir>/realnode/state.json``
  and in the host-wide lock file ``/run/tpusim-realnode.lock``, so cleanup
  works from another process, after the harness was SIGKILLed, and even after
  the run directory was deleted.
* :class:`HostLock` allows one real node per machine (the paths, ports,
  bridge and chains above are shared) and names the owner when it refuses.
* :func:`cleanup_host` takes everything back, in an order that never removes
  something still in use, by recorded pid (a recycled pid is never signalled).
* :func:`host_leftovers` lists whatever of ours is still on the host, for
  tests to assert empty after each run.

The parsers of /proc and ``iptables-save`` output are pure functions so the
unit tests can check them on sample text.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .processes import kill_recorded

__all__ = [
    "BUILDAH_CHAIN_PREFIXES",
    "CHAIN_PREFIXES",
    "FIXED_PORTS",
    "HOST_PATHS",
    "LOCK_PATH",
    "STATE_DIR_NAME",
    "SYSCTLS",
    "CleanupReport",
    "HostLock",
    "HostRecord",
    "RealNodeBusy",
    "all_processes",
    "bridge_links",
    "cleanup_host",
    "host_leftovers",
    "iptables_chains",
    "iptables_cleanup_script",
    "listening_sockets",
    "mounts_under",
    "our_processes",
    "port_conflicts",
    "process_start",
    "read_sysctls",
]

#: The one real node of this machine holds this file (flock for each update).
LOCK_PATH = Path("/run/tpusim-realnode.lock")
#: The real node's own directory under the cluster's run directory.
STATE_DIR_NAME = "realnode"

#: Sysctls something of the node may change, recorded before start and restored.
#: The first six are the kubelet's ``setupKernelTunables`` (v1.34,
#: pkg/kubelet/cm/container_manager_linux.go): with protectKernelDefaults false
#: it sets them, with true it refuses to start unless the host already has them.
#: ip_forward: the CNI bridge plugin enables it for isGateway/ipMasq. The rest
#: are what kube-proxy would touch without our flags (checked, never expected
#: to change).
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
    "net.netfilter.nf_conntrack_tcp_be_liberal",
)

#: Host paths written even though every component has its own directories:
#: the kubelet's device-plugin socket (/var/lib/kubelet/device-plugins, a
#: constant) and /var/log/containers symlinks; libcni's result cache
#: (/var/lib/cni); containerd's shim sockets (/run/containerd/s, a constant in
#: 1.6). The others are defaults we override, listed in case a version stops
#: honouring the override. Removed at cleanup only if they did not exist before.
HOST_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/run/containerd",
    "/run/netns",
    "/opt/containerd",
    "/usr/libexec/kubernetes",
    "/run/dnsmasq",
)

#: iptables chains of the kubelet and kube-proxy (KUBE-*) and of the CNI bridge
#: (ipMasq) and portmap plugins (CNI-*).
CHAIN_PREFIXES = ("KUBE-", "CNI-")
#: buildah/podman RUN networking (netavark) leaves these; removed when no such
#: process runs, because an image build of the same test session made them.
BUILDAH_CHAIN_PREFIXES = ("NETAVARK",)
_BUILDERS = ("buildah", "podman", "netavark", "aardvark-dns")

#: Fixed ports of the node (TCP). DNS is NODE_IP:53 (TCP and UDP).
FIXED_PORTS = {
    10250: "kubelet",
    10248: "kubelet healthz",
    10249: "kube-proxy metrics",
    10256: "kube-proxy healthz",
}
COMPONENT_EXES = ("kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "dnsmasq")

_MNT_DETACH = 2


class RealNodeBusy(RuntimeError):
    """Another real node owns this machine (message names its run dir and pid)."""


# ---------------------------------------------------------------- the record
@dataclass
class HostRecord:
    """What one real node did to the host, written before it does it."""

    run_dir: str
    state_dir: str
    node_name: str
    node_ip: str
    bridge: str
    pod_cidr: str
    containerd_socket: str
    kube_proxy: str
    owner_pid: int
    owner_start: str
    sysctls: dict[str, str] = field(default_factory=dict)
    preexisting: list[str] = field(default_factory=list)
    components: list[dict[str, Any]] = field(default_factory=list)
    started_at: float = 0.0
    cleaned: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostRecord:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def state_json(self) -> Path:
        return Path(self.state_dir) / "state.json"

    def save(self) -> None:
        """Write ``<state_dir>/state.json`` (atomically; the lock keeps a copy)."""
        path = self.state_json
        if not path.parent.exists():
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, state_dir: Path) -> HostRecord | None:
        path = state_dir / "state.json"
        if not path.exists():
            return None
        return cls.from_dict(json.loads(path.read_text()))

    def alive(self) -> bool:
        """True while the owner process, the kubelet or containerd still runs.

        Not dnsmasq or the shims: they outlive a SIGKILLed harness (dnsmasq
        drops the parent-death signal when it sets its credentials; shims are
        reparented), so they would keep a dead node's claim forever. The owner
        alone is not enough either: ``up --real-node`` exits and leaves the
        node running.
        """
        if process_start(self.owner_pid) == self.owner_start and self.owner_start:
            return True
        return any(
            _runs(int(c["pid"]), str(c["exe"]))
            for c in self.components
            if c["name"] in ("kubelet", "containerd")
        )


def process_start(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks): pid reuse guard."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _runs(pid: int, exe: str) -> bool:
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return argv0 == exe and state != "Z"


# ---------------------------------------------------------------- the lock
class HostLock:
    """One real node per machine: a JSON file, every update under ``flock``.

    The claim must outlive the process that made it (``up --real-node``
    detaches), so it is the file's content, not a held lock: ``{"owner":
    record or null, "last": record}``. A claim whose owner and components are
    all gone is stale; the next claimant takes it over and gets the stale
    record back to clean up first.
    """

    def __init__(self, path: Path = LOCK_PATH) -> None:
        self.path = path

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = b""
            while chunk := os.read(fd, 65536):
                raw += chunk
            try:
                data: dict[str, Any] = json.loads(raw) if raw.strip() else {}
            except ValueError:
                data = {}
            before = json.dumps(data, sort_keys=True)
            yield data
            if json.dumps(data, sort_keys=True) != before:
                os.lseek(fd, 0, os.SEEK_SET)
                os.ftruncate(fd, 0)
                os.write(fd, (json.dumps(data, indent=2) + "\n").encode())
        finally:
            os.close(fd)

    def owner(self) -> HostRecord | None:
        with self._locked() as data:
            return HostRecord.from_dict(data["owner"]) if data.get("owner") else None

    def last(self) -> HostRecord | None:
        """The current owner, else the last one (for sysctl baselines)."""
        with self._locked() as data:
            rec = data.get("owner") or data.get("last")
            return HostRecord.from_dict(rec) if rec else None

    def check(self, run_dir: Path | str | None = None) -> None:
        """Raise RealNodeBusy now if a live real node (of another run dir) owns the machine.

        For callers that want to refuse before starting a control plane; the
        authoritative test is :meth:`claim`.
        """
        owner = self.owner()
        if owner is not None and owner.alive() and owner.run_dir != str(run_dir):
            raise RealNodeBusy(self.busy_message(owner))

    def busy_message(self, owner: HostRecord) -> str:
        return (
            f"a real node already runs on this machine: node {owner.node_name} of "
            f"{owner.run_dir} (owner pid {owner.owner_pid}); stop it with "
            f"`python -m tpusim --dir {owner.run_dir} down` (lock: {self.path})"
        )

    def claim(self, record: HostRecord) -> HostRecord | None:
        """Claim the machine for ``record``; return a stale previous owner to clean.

        Raises RealNodeBusy, naming the owner, if another live real node has it.
        """
        with self._locked() as data:
            stale = None
            if data.get("owner"):
                prev = HostRecord.from_dict(data["owner"])
                same = (prev.run_dir, prev.owner_pid, prev.owner_start) == (
                    record.run_dir,
                    record.owner_pid,
                    record.owner_start,
                )
                if prev.alive() and not same:
                    raise RealNodeBusy(self.busy_message(prev))
                stale = None if prev.cleaned else prev
            data["owner"] = record.to_dict()
            return stale

    def update(self, record: HostRecord) -> None:
        """Store the record's progress (pids) if it still owns the machine."""
        with self._locked() as data:
            owner = data.get("owner")
            if owner and owner.get("run_dir") == record.run_dir:
                data["owner"] = record.to_dict()

    def release(self, record: HostRecord) -> None:
        """Give the machine up (only if ``record`` owns it); keep it as "last"."""
        with self._locked() as data:
            owner = data.get("owner")
            if owner and owner.get("run_dir") == record.run_dir:
                data["owner"] = None
                data["last"] = record.to_dict()


# ---------------------------------------------------------------- pure parsers
def iptables_chains(save_text: str, prefixes: Sequence[str]) -> list[tuple[str, str]]:
    """(table, chain) of every chain in ``iptables-save`` output named with a prefix."""
    found = []
    table = ""
    for line in save_text.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":"):
            chain = line[1:].split()[0]
            if chain.startswith(tuple(prefixes)):
                found.append((table, chain))
    return found


_JUMP = re.compile(r"\s-[jg]\s+(\S+)")


def iptables_cleanup_script(save_text: str, prefixes: Sequence[str]) -> str:
    """An ``iptables-restore --noflush`` script removing our chains, atomically per table.

    Rules in other chains (built-in or not) that jump to one of ours are
    deleted (``-D`` with the rule exactly as saved), then our chains are
    flushed and deleted. Empty when there is nothing of ours.
    """
    tables: dict[str, tuple[list[str], list[str]]] = {}
    order: list[str] = []
    table = ""
    prefix = tuple(prefixes)
    for line in save_text.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
            if table not in tables:
                tables[table] = ([], [])
                order.append(table)
        elif line.startswith(":"):
            chain = line[1:].split()[0]
            if chain.startswith(prefix):
                tables[table][1].append(chain)
        elif line.startswith("-A "):
            chain = line.split()[1]
            target = _JUMP.search(line)
            if not chain.startswith(prefix) and target and target.group(1).startswith(prefix):
                tables[table][0].append("-D " + line[3:])
    out: list[str] = []
    for name in order:
        deletes, chains = tables[name]
        if not deletes and not chains:
            continue
        out.append(f"*{name}")
        out += deletes
        out += [f"-F {c}" for c in chains]
        out += [f"-X {c}" for c in chains]
        out.append("COMMIT")
    return "\n".join(out) + "\n" if out else ""


def _hex_address(text: str) -> str:
    """An address of /proc/net/{tcp,udp}[6] (host byte order hex words) as text."""
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return ".".join(str(b) for b in reversed(raw))
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
    flat = b"".join(words)
    if flat[:12] == b"\0" * 10 + b"\xff\xff":
        return ".".join(str(b) for b in flat[12:])
    import ipaddress

    return str(ipaddress.IPv6Address(flat))


def listening_sockets(proc_net_text: str, *, udp: bool = False) -> set[tuple[str, int]]:
    """(address, port) of listening TCP (state 0A) or bound UDP (state 07) sockets."""
    wanted = "07" if udp else "0A"
    found = set()
    for line in proc_net_text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 4 or parts[3] != wanted:
            continue
        address, port = parts[1].rsplit(":", 1)
        found.add((_hex_address(address), int(port, 16)))
    return found


def _unescape_mount(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def mounts_under(mountinfo_text: str, roots: Iterable[str]) -> list[str]:
    """Mount points (from /proc/self/mountinfo) at or below any of ``roots``, deepest first."""
    roots = [r.rstrip("/") for r in roots]
    found = []
    for line in mountinfo_text.splitlines():
        parts = line.split()
        if len(parts) < 5:
            continue
        point = _unescape_mount(parts[4])
        if any(point == r or point.startswith(r + "/") for r in roots):
            found.append(point)
    return sorted(found, key=lambda p: (p.count("/"), p), reverse=True)


def cgroup_mounts(mountinfo_text: str) -> list[str]:
    """Mount points of every cgroup (v1) and cgroup2 hierarchy."""
    points = []
    for line in mountinfo_text.splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0] if right else ""
        if fstype in ("cgroup", "cgroup2"):
            points.append(_unescape_mount(left.split()[4]))
    return points


def bridge_links(ip_link_text: str, bridge: str) -> list[str]:
    """Interfaces of ``ip -o link show`` output: the bridge itself and its ports."""
    found = []
    for line in ip_link_text.splitlines():
        match = re.match(r"\d+:\s+([^:@\s]+)(?:@\S+)?:", line)
        if not match:
            continue
        name = match.group(1)
        if name == bridge or f" master {bridge} " in f"{line} ":
            found.append(name)
    return found


def our_processes(
    procs: Iterable[tuple[int, Sequence[str]]], markers: Sequence[str]
) -> list[tuple[int, str]]:
    """(pid, name) of node processes: a component binary with a marker in its argv.

    Markers are our state directory (every component gets a path in it) and
    dnsmasq's answer for ``kubernetes.default.svc``, so another project's
    kubelet or dnsmasq on the same host is never reported or killed.
    """
    found = []
    for pid, argv in procs:
        if not argv:
            continue
        name = os.path.basename(argv[0])
        if name not in COMPONENT_EXES:
            continue
        if any(m and m in arg for arg in argv[1:] for m in markers):
            found.append((pid, name))
    return found


def read_sysctls(names: Iterable[str] = SYSCTLS) -> dict[str, str]:
    """Current values of the sysctls that exist on this kernel."""
    values = {}
    for name in names:
        path = Path("/proc/sys") / name.replace(".", "/")
        with contextlib.suppress(OSError):
            values[name] = " ".join(path.read_text().split())
    return values


# ---------------------------------------------------------------- host readers
def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def all_processes() -> list[tuple[int, list[str]]]:
    """(pid, argv) of every process with a command line (not kernel threads, zombies)."""
    procs = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if raw:
            procs.append((int(entry.name), [a.decode(errors="replace") for a in raw.split(b"\0")]))
    return procs


def _iptables_tools() -> list[tuple[str, str]]:
    """(save, restore) command pairs in use: the default (nft) ones, plus legacy if loaded."""
    tools = [("iptables-save", "iptables-restore"), ("ip6tables-save", "ip6tables-restore")]
    for names, pair in (
        ("/proc/net/ip_tables_names", ("iptables-legacy-save", "iptables-legacy-restore")),
        ("/proc/net/ip6_tables_names", ("ip6tables-legacy-save", "ip6tables-legacy-restore")),
    ):
        # Reading legacy tables that are not in use would load the legacy modules.
        if _read(names).strip() and shutil.which(pair[0]):
            tools.append(pair)
    return [t for t in tools if shutil.which(t[0])]


def _save(tool: str) -> str:
    try:
        done = subprocess.run([tool], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _builders_running() -> bool:
    return any(os.path.basename(argv[0]) in _BUILDERS for _, argv in all_processes())


def _chain_prefixes() -> tuple[str, ...]:
    return CHAIN_PREFIXES + (() if _builders_running() else BUILDAH_CHAIN_PREFIXES)


def _node_markers(record: HostRecord | None) -> list[str]:
    markers = [f"/{STATE_DIR_NAME}/", "/kubernetes.default.svc."]
    if record is not None:
        markers.append(record.state_dir)
    return markers


def _mount_roots(record: HostRecord | None) -> list[str]:
    roots = ["/var/lib/kubelet", "/run/containerd", "/run/netns"]
    if record is not None:
        roots.append(record.state_dir)
    return roots


# ---------------------------------------------------------------- cleanup
@dataclass
class CleanupReport:
    """What cleanup did and what it could not do (each a human-readable line)."""

    done: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def cleanup_host(
    record: HostRecord,
    *,
    lock: HostLock | None = None,
    taking_over: bool = False,
    log: Callable[[str], None] | None = None,
) -> CleanupReport:
    """Take back everything ``record``'s node did to the host; safe to repeat.

    Refuses (RealNodeBusy) while another live real node owns the machine: the
    host-wide steps (chains, bridge, cgroups, fixed paths) would break it.
    ``taking_over`` is for the new owner cleaning up after a stale one. The
    lock is released when everything came back.

    Order (each step best effort, failures collected):
    kubelet and kube-proxy (so nothing restarts pods) -> every process in the
    kubepods cgroups (the pods) -> ``kube-proxy --cleanup`` -> dnsmasq ->
    containerd -> its shims -> iptables chains (ip and ip6) -> the bridge and
    its ports -> mounts under the state dir and the fixed paths -> kubepods
    cgroups -> fixed paths that did not exist before -> the state dir's bulk
    (containerd's content store, the kubelet root) -> sysctls -> the lock.
    """
    lock = lock or HostLock()
    owner = lock.owner()
    if not taking_over and owner is not None and owner.run_dir != record.run_dir and owner.alive():
        raise RealNodeBusy(f"not cleaning up after {record.run_dir}: " + lock.busy_message(owner))
    report = CleanupReport()
    say = log or (lambda _msg: None)

    def did(msg: str) -> None:
        report.done.append(msg)
        say(msg)

    def failed(msg: str) -> None:
        report.failed.append(msg)
        say(f"FAILED: {msg}")

    comps = {str(c["name"]): c for c in record.components}

    def stop(name: str) -> None:
        comp = comps.get(name)
        if comp and kill_recorded(int(comp["pid"]), str(comp["exe"])):
            did(f"stopped {name} (pid {comp['pid']})")

    stop("kubelet")
    stop("kube-proxy")
    _kill_pods(did)
    _kube_proxy_cleanup(record, did, failed)
    stop("dnsmasq")
    stop("containerd")
    markers = _node_markers(record)
    for pid, name in our_processes(all_processes(), markers):
        # Shims (not in containerd's process group) and anything a lost record missed.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            did(f"killed {name} (pid {pid})")
    _remove_chains(did, failed)
    _remove_links(record.bridge, did, failed)
    _unmount_all(_mount_roots(record), did, failed)
    _remove_cgroups(did, failed)
    for path in HOST_PATHS:
        if path not in record.preexisting and os.path.lexists(path):
            _safe_rmtree(Path(path), did, failed)
        elif path == "/run/netns":
            for entry in Path(path).glob("cni-*"):
                _safe_rmtree(entry, did, failed)
    state_dir = Path(record.state_dir)
    if state_dir.is_dir():
        for entry in state_dir.iterdir():
            if entry.name != "state.json":
                _safe_rmtree(entry, did, failed, quiet=True)
    _restore_sysctls(record.sysctls, did, failed)
    record.cleaned = not report.failed
    record.save()
    if record.cleaned:
        lock.release(record)
    return report


def _kill_pods(did: Callable[[str], None]) -> None:
    """SIGKILL every process in a kubepods cgroup (the pods' containers), a few rounds."""
    for _ in range(20):
        pids = _kubepods_pids()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        did(f"killed {len(pids)} pod processes")
        time.sleep(0.25)


def _kubepods_dirs() -> list[Path]:
    mountinfo = _read("/proc/self/mountinfo")
    return [
        Path(p) / "kubepods" for p in cgroup_mounts(mountinfo) if (Path(p) / "kubepods").is_dir()
    ]


def _kubepods_pids() -> set[int]:
    pids: set[int] = set()
    for top in _kubepods_dirs():
        for procs in top.rglob("cgroup.procs"):
            for line in _read(str(procs)).split():
                if line.isdigit():
                    pids.add(int(line))
    return pids


def _kube_proxy_cleanup(
    record: HostRecord, did: Callable[[str], None], failed: Callable[[str], None]
) -> None:
    """``kube-proxy --cleanup``: its iptables chains and leftovers of the other modes.

    v1.34 removes the rules of every mode (iptables, ipvs, nftables) whatever
    ``--proxy-mode`` says (cmd/kube-proxy/app/server_linux.go platformCleanup).
    """
    if not os.access(record.kube_proxy, os.X_OK):
        return
    try:
        done = subprocess.run(
            [record.kube_proxy, "--cleanup", "--proxy-mode=iptables", "--v=0"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        failed(f"kube-proxy --cleanup: {exc}")
        return
    if done.returncode == 0:
        did("kube-proxy --cleanup")
    # A non-zero code only means some mode had nothing to clean; our own chain
    # removal below is what the leftovers check relies on.


def _remove_chains(did: Callable[[str], None], failed: Callable[[str], None]) -> None:
    prefixes = _chain_prefixes()
    for save, restore in _iptables_tools():
        script = iptables_cleanup_script(_save(save), prefixes)
        if not script:
            continue
        chains = script.count("\n-X ")
        done = subprocess.run(
            [restore, "--noflush"], input=script, capture_output=True, text=True, timeout=60
        )
        if done.returncode == 0:
            did(f"{restore}: removed {chains} chains")
        else:
            failed(f"{restore} --noflush: {done.stderr.strip()[:300]}")


def _remove_links(bridge: str, did: Callable[[str], None], failed: Callable[[str], None]) -> None:
    text = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    # Ports first, the bridge last.
    for name in sorted(bridge_links(text, bridge), key=lambda n: n == bridge):
        done = subprocess.run(["ip", "link", "del", name], capture_output=True, text=True)
        if done.returncode == 0:
            did(f"deleted link {name}")
        elif "Cannot find device" not in done.stderr:
            failed(f"ip link del {name}: {done.stderr.strip()}")


def _unmount_all(
    roots: list[str], did: Callable[[str], None], failed: Callable[[str], None]
) -> None:
    """Unmount everything below ``roots``, deepest first, lazily if busy; a few passes
    because the kubelet's rshared root and propagation can stack mounts."""
    libc = ctypes.CDLL(None, use_errno=True)
    count = 0
    for _ in range(10):
        points = mounts_under(_read("/proc/self/mountinfo"), roots)
        if not points:
            break
        for point in points:
            target = point.encode()
            if libc.umount2(target, 0) != 0:
                err = ctypes.get_errno()
                if err == errno.EINVAL:  # already gone (a stacked duplicate)
                    continue
                if libc.umount2(target, _MNT_DETACH) != 0:
                    continue
            count += 1
    left = mounts_under(_read("/proc/self/mountinfo"), roots)
    if count:
        did(f"unmounted {count} mounts")
    if left:
        failed(f"still mounted: {', '.join(left[:5])}")


def _remove_cgroups(did: Callable[[str], None], failed: Callable[[str], None]) -> None:
    for top in _kubepods_dirs():
        for _ in range(20):
            for dirpath, _dirs, _files in os.walk(top, topdown=False):
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)
            if not top.exists():
                did(f"removed cgroup {top}")
                break
            for pid in _kubepods_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.25)
        else:
            failed(f"cgroup {top} not removable (processes left: {sorted(_kubepods_pids())[:5]})")


def _safe_rmtree(
    path: Path, did: Callable[[str], None], failed: Callable[[str], None], quiet: bool = False
) -> None:
    """Delete ``path`` unless something is still mounted at or below it.

    Never recursing through a mount is the safety that matters: a pod's
    hostPath bind mount can point anywhere on the host.
    """
    left = mounts_under(_read("/proc/self/mountinfo"), [str(path)])
    if left:
        failed(f"not deleting {path}: still mounted {left[0]}")
        return
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        return
    except OSError as exc:
        failed(f"delete {path}: {exc}")
        return
    if not quiet:
        did(f"removed {path}")


def _restore_sysctls(
    before: dict[str, str], did: Callable[[str], None], failed: Callable[[str], None]
) -> None:
    now = read_sysctls(before)
    for name, value in before.items():
        if now.get(name, value) == value:
            continue
        try:
            (Path("/proc/sys") / name.replace(".", "/")).write_text(value + "\n")
            did(f"restored {name}={value} (was {now[name]})")
        except OSError as exc:
            failed(f"restore {name}={value}: {exc}")


# ---------------------------------------------------------------- leftovers
def host_leftovers(record: HostRecord | None = None, lock: HostLock | None = None) -> list[str]:
    """Anything of a real node still on the host; empty after a clean teardown.

    Processes, fixed ports, the bridge, iptables chains, mounts, kubepods
    cgroups, fixed paths that did not exist before, sysctls that differ from
    the recorded values, and a claimed lock. ``record`` defaults to the lock's
    current or last owner (the baseline for sysctls and pre-existing paths).
    """
    lock = lock or HostLock()
    if record is None:
        record = lock.last()
    found: list[str] = []
    for pid, name in our_processes(all_processes(), _node_markers(record)):
        found.append(f"process {name} (pid {pid})")
    found += _port_leftovers(record.node_ip if record else None)
    bridge = record.bridge if record else "tpusim-br0"
    text = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [f"link {name}" for name in bridge_links(text, bridge)]
    prefixes = CHAIN_PREFIXES + BUILDAH_CHAIN_PREFIXES
    for save, _restore in _iptables_tools():
        for table, chain in iptables_chains(_save(save), prefixes):
            hint = (
                " (buildah RUN networking; build with --network host)"
                if "NETAVARK" in chain
                else ""
            )
            found.append(f"{save.split('-')[0]} {table} chain {chain}{hint}")
    found += [
        f"mount {p}" for p in mounts_under(_read("/proc/self/mountinfo"), _mount_roots(record))
    ]
    found += [f"cgroup {p}" for p in _kubepods_dirs()]
    preexisting = set(record.preexisting) if record else set()
    found += [f"path {p}" for p in HOST_PATHS if p not in preexisting and os.path.lexists(p)]
    if record is not None:
        now = read_sysctls(record.sysctls)
        found += [
            f"sysctl {name}={now[name]} (was {value})"
            for name, value in record.sysctls.items()
            if name in now and now[name] != value
        ]
    owner = lock.owner()
    if owner is not None:
        found.append(f"lock {lock.path} claimed by {owner.run_dir} (pid {owner.owner_pid})")
    return found


def _port_leftovers(node_ip: str | None) -> list[str]:
    tcp = listening_sockets(_read("/proc/net/tcp")) | listening_sockets(_read("/proc/net/tcp6"))
    udp = listening_sockets(_read("/proc/net/udp"), udp=True) | listening_sockets(
        _read("/proc/net/udp6"), udp=True
    )
    found = [
        f"port {port} ({FIXED_PORTS[port]}) listening on {addr}"
        for addr, port in sorted(tcp)
        if port in FIXED_PORTS
    ]
    if node_ip:
        for proto, socks in (("tcp", tcp), ("udp", udp)):
            if (node_ip, 53) in socks:
                found.append(f"port {node_ip}:53/{proto} (dnsmasq) in use")
    return found


def port_conflicts(node_ip: str) -> list[str]:
    """The node's fixed ports already taken on this host (checked before start)."""
    return _port_leftovers(node_ip)
