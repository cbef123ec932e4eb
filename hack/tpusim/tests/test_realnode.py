"""The real node's pure parts: rendered configs and argv, the API server's flags with and
without a node address, the host-leftover parsers on sample text, and the host lock.

Nothing here starts a process or touches the host; the real node itself is
exercised by the real-node tier (tests/realnode).
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import tomllib
from pathlib import Path

import pytest

from tpusim import ClusterSettings, LocalCluster, ToolPaths
from tpusim.certs import make_pki
from tpusim.hoststate import (
    BUILDAH_CHAIN_PREFIXES,
    CHAIN_PREFIXES,
    HostLock,
    HostRecord,
    RealNodeBusy,
    bridge_links,
    cgroup_mounts,
    cleanup_host,
    iptables_chains,
    iptables_cleanup_script,
    listening_sockets,
    mounts_under,
    our_processes,
    process_start,
    read_sysctls,
)
from tpusim.realnode import (
    PAUSE_IMAGE,
    REAL_NODE_LABEL,
    REAL_NODE_TOLERATION,
    NodePaths,
    RealNode,
    RealNodeSettings,
    cni_conflist,
    containerd_config,
    dns_a_records,
    dns_query,
    dnsmasq_argv,
    host_nameservers,
    host_python_pod,
    kube_proxy_argv,
    kubelet_argv,
    kubelet_config,
)

STATE = Path("/runs/r1/realnode")
PATHS = NodePaths(STATE)
SETTINGS = RealNodeSettings()


def _under_state(value: str) -> bool:
    return value.startswith(str(STATE) + "/")


# ---------------------------------------------------------------- containerd and CNI
def test_containerd_config_keeps_every_path_in_the_state_dir() -> None:
    config = tomllib.loads(containerd_config(PATHS))
    assert config["version"] == 2
    for key in ("root", "state", "temp"):
        assert _under_state(config[key]), key
    assert config["grpc"]["address"] == str(PATHS.containerd_socket)
    assert config["ttrpc"]["address"] == f"{PATHS.containerd_socket}.ttrpc"
    assert config["metrics"]["address"] == ""
    plugins = config["plugins"]
    assert _under_state(plugins["io.containerd.internal.v1.opt"]["path"])  # not /opt/containerd
    cri = plugins["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == PAUSE_IMAGE
    assert cri["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE on the runner
    assert cri["netns_mounts_under_state_dir"] is True  # not /run/netns
    assert cri["cni"] == {
        "bin_dir": "/usr/lib/cni",
        "conf_dir": str(PATHS.cni_conf_dir),
        "max_conf_num": 1,
    }
    assert cri["containerd"]["snapshotter"] == "overlayfs"
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"]["SystemdCgroup"] is False  # no systemd as PID 1
    assert _under_state(runc["options"]["Root"])  # runc state not in /run/containerd/runc


def test_cni_conflist_is_a_bridge_on_its_own_range_with_portmap() -> None:
    conf = cni_conflist(SETTINGS, PATHS, mtu=1400)
    bridge, portmap = conf["plugins"]
    assert bridge["type"] == "bridge" and bridge["bridge"] == "tpusim-br0"
    assert bridge["isGateway"] and bridge["ipMasq"] and bridge["hairpinMode"]
    assert bridge["mtu"] == 1400
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.245.0.0/24"}]]
    assert _under_state(bridge["ipam"]["dataDir"])  # not /var/lib/cni/networks
    assert portmap == {"type": "portmap", "capabilities": {"portMappings": True}}
    assert "mtu" not in cni_conflist(SETTINGS, PATHS)["plugins"][0]


# ---------------------------------------------------------------- kubelet, kube-proxy, dnsmasq
def test_kubelet_config_registers_tainted_with_webhook_auth_and_own_dirs() -> None:
    ca = Path("/runs/r1/pki/ca.crt")
    config = kubelet_config(SETTINGS, PATHS, "192.0.2.2", ca)
    assert config["kind"] == "KubeletConfiguration"
    assert config["apiVersion"] == "kubelet.config.k8s.io/v1beta1"
    assert config["containerRuntimeEndpoint"] == f"unix://{PATHS.containerd_socket}"
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["failSwapOn"] is False and config["failCgroupV1"] is False
    assert (config["address"], config["port"], config["readOnlyPort"]) == ("0.0.0.0", 10250, 0)
    assert (config["healthzBindAddress"], config["healthzPort"]) == ("127.0.0.1", 10248)
    assert config["authentication"] == {
        "anonymous": {"enabled": False},
        "webhook": {"enabled": True},
        "x509": {"clientCAFile": str(ca)},
    }
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["clusterDNS"] == ["192.0.2.2"] and config["clusterDomain"] == "cluster.local"
    assert config["registerWithTaints"] == [
        {"key": "tpusim.dev/real", "value": "true", "effect": "NoSchedule"}
    ]
    # Recorded and restored instead; True would make the kubelet refuse to start.
    assert config["protectKernelDefaults"] is False
    assert _under_state(config["podLogsDir"]) and _under_state(config["volumePluginDir"])
    assert config["imageGCHighThresholdPercent"] == 99
    assert config["evictionHard"]["nodefs.available"] == "1%"
    assert config["maxPods"] == 20


def test_kubelet_argv_names_the_node_and_labels_it() -> None:
    argv = kubelet_argv(Path("/tools/kubelet"), SETTINGS, PATHS, "192.0.2.2")
    assert argv[0] == "/tools/kubelet"
    assert f"--config={PATHS.kubelet_config}" in argv
    assert f"--kubeconfig={PATHS.kubelet_kubeconfig}" in argv
    assert f"--root-dir={PATHS.kubelet_root}" in argv
    assert "--hostname-override=tpusim-real" in argv
    assert "--node-ip=192.0.2.2" in argv
    assert f"--node-labels={REAL_NODE_LABEL}=true" in argv


def test_kube_proxy_flags_leave_host_sysctls_alone() -> None:
    argv = kube_proxy_argv(Path("/tools/kube-proxy"), SETTINGS, PATHS)
    for flag in (
        "--proxy-mode=iptables",
        "--cluster-cidr=10.245.0.0/24",
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
        "--iptables-localhost-nodeports=false",
        "--metrics-bind-address=127.0.0.1:10249",
        "--healthz-bind-address=127.0.0.1:10256",
        "--hostname-override=tpusim-real",
        f"--kubeconfig={PATHS.kube_proxy_kubeconfig}",
    ):
        assert flag in argv, flag


def test_dnsmasq_answers_the_service_name_on_the_node_address_only() -> None:
    resolv = "# generated\nsearch example.internal\nnameserver 10.255.255.53\nnameserver 192.0.2.2"
    upstreams = host_nameservers(resolv)
    assert upstreams == ["10.255.255.53", "192.0.2.2"]
    argv = dnsmasq_argv("192.0.2.2", PATHS, upstreams, "10.96.0.1", "cluster.local")
    assert argv[0] == "dnsmasq" and "--keep-in-foreground" in argv
    assert "--listen-address=192.0.2.2" in argv and "--bind-interfaces" in argv
    assert "--address=/kubernetes.default.svc.cluster.local/10.96.0.1" in argv
    assert "--local=/cluster.local/" in argv
    assert "--conf-file=/dev/null" in argv and "--no-resolv" in argv and "--user=root" in argv
    assert f"--pid-file={PATHS.dnsmasq_pid}" in argv
    # Forwarding to itself would loop.
    assert [a for a in argv if a.startswith("--server=")] == ["--server=10.255.255.53"]


def test_dns_query_and_answer_parsing() -> None:
    query = dns_query("kubernetes.default.svc.cluster.local", qid=7)
    assert query[:2] == b"\x00\x07"
    assert b"\x0akubernetes\x07default\x03svc\x07cluster\x05local\x00" in query
    # A response: the question, then a CNAME-less A answer using a name pointer.
    header = struct.pack("!HHHHHH", 7, 0x8180, 1, 1, 0, 0)
    answer = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 0, 4) + socket.inet_aton("10.96.0.1")
    assert dns_a_records(header + query[12:] + answer) == ["10.96.0.1"]
    nx = struct.pack("!HHHHHH", 7, 0x8183, 1, 0, 0, 0) + query[12:]
    assert dns_a_records(nx) == []


def test_placement_and_probe_pod_pin_to_the_real_node() -> None:
    placement = RealNode.placement()
    assert placement["nodeSelector"] == {"tpusim.dev/real": "true"}
    assert placement["tolerations"] == [REAL_NODE_TOLERATION]
    pod = host_python_pod("probe", "print(1)", namespace="ns")
    spec = pod["spec"]
    assert spec["tolerations"] == [REAL_NODE_TOLERATION]
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "tpusim-real"}
    (container,) = spec["containers"]
    assert container["image"] == PAUSE_IMAGE and container["command"][0] == "/usr/bin/python3"
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/usr", "/lib", "/lib64"}
    assert all(m["readOnly"] for m in container["volumeMounts"])


# ---------------------------------------------------------------- the API server's flags
def _cluster(tmp_path: Path, node_ip: str | None) -> LocalCluster:
    tools = ToolPaths(root=tmp_path / "tools", versions={})
    cluster = LocalCluster(ClusterSettings(tools=tools, run_dir=tmp_path / "run", node_ip=node_ip))
    cluster.ports["etcd"] = 2379
    return cluster


def test_apiserver_flags_without_a_node_address_are_unchanged(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    argv = _cluster(tmp_path, None).apiserver_argv(pki, 6443)
    assert argv[1:] == [
        "--etcd-servers=http://127.0.0.1:2379",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        "--secure-port=6443",
        f"--tls-cert-file={pki.apiserver_cert}",
        f"--tls-private-key-file={pki.apiserver_key}",
        f"--client-ca-file={pki.ca_cert}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--service-cluster-ip-range=10.96.0.0/16",
        "--authorization-mode=Node,RBAC",
        "--allow-privileged=true",
        "--endpoint-reconciler-type=none",
        "--profiling=false",
    ]


def test_apiserver_flags_with_a_node_address_publish_the_kubernetes_service(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path / "pki")
    plain = _cluster(tmp_path, None).apiserver_argv(pki, 6443)
    real = _cluster(tmp_path, "192.0.2.2").apiserver_argv(pki, 6443)
    assert set(plain) - set(real) == {
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none",
    }
    assert set(real) - set(plain) == {
        "--bind-address=0.0.0.0",
        "--advertise-address=192.0.2.2",
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        f"--kubelet-client-certificate={pki.admin_cert}",
        f"--kubelet-client-key={pki.admin_key}",
    }


def test_a_real_node_needs_a_node_address(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="node_ip"):
        RealNode(_cluster(tmp_path, None))


# ---------------------------------------------------------------- leftovers parsers
IPTABLES_SAVE = """\
# Generated by iptables-nft-save v1.8.9 (nf_tables) on Mon Dec  1 09:50:00 2026
*mangle
:PREROUTING ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:DOCKER-USER - [0:0]
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -j DOCKER-USER
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -j DROP
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-4f1c2b - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:NETAVARK-1D8721804F16F - [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -s 10.245.0.2/32 -m comment --comment "name: \\"tpusim\\" id: \\"a\\"" -j CNI-4f1c2b
-A POSTROUTING -s 10.88.0.0/16 -j NETAVARK-1D8721804F16F
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
-A CNI-4f1c2b -d 10.245.0.0/24 -j ACCEPT
COMMIT
"""


def test_iptables_chains_lists_ours_by_prefix() -> None:
    assert iptables_chains(IPTABLES_SAVE, CHAIN_PREFIXES) == [
        ("mangle", "KUBE-IPTABLES-HINT"),
        ("mangle", "KUBE-KUBELET-CANARY"),
        ("filter", "KUBE-FIREWALL"),
        ("filter", "KUBE-FORWARD"),
        ("nat", "CNI-4f1c2b"),
        ("nat", "CNI-HOSTPORT-DNAT"),
        ("nat", "KUBE-SERVICES"),
    ]
    assert iptables_chains(IPTABLES_SAVE, BUILDAH_CHAIN_PREFIXES) == [
        ("nat", "NETAVARK-1D8721804F16F")
    ]


def test_iptables_cleanup_script_unhooks_then_flushes_and_deletes_only_ours() -> None:
    script = iptables_cleanup_script(IPTABLES_SAVE, CHAIN_PREFIXES)
    assert script.splitlines() == [
        "*mangle",
        "-F KUBE-IPTABLES-HINT",
        "-F KUBE-KUBELET-CANARY",
        "-X KUBE-IPTABLES-HINT",
        "-X KUBE-KUBELET-CANARY",
        "COMMIT",
        "*filter",
        "-D INPUT -j KUBE-FIREWALL",
        '-D FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD',
        "-D OUTPUT -j KUBE-FIREWALL",
        "-F KUBE-FIREWALL",
        "-F KUBE-FORWARD",
        "-X KUBE-FIREWALL",
        "-X KUBE-FORWARD",
        "COMMIT",
        "*nat",
        "-D PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT",
        '-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-D POSTROUTING -s 10.245.0.2/32 -m comment --comment "name: \\"tpusim\\" id: \\"a\\""'
        " -j CNI-4f1c2b",
        "-F CNI-4f1c2b",
        "-F CNI-HOSTPORT-DNAT",
        "-F KUBE-SERVICES",
        "-X CNI-4f1c2b",
        "-X CNI-HOSTPORT-DNAT",
        "-X KUBE-SERVICES",
        "COMMIT",
    ]
    assert "DOCKER-USER" not in script and "MASQUERADE" not in script  # not ours
    assert "NETAVARK" not in script
    assert iptables_cleanup_script("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n", CHAIN_PREFIXES) == ""


PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:280A 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:2818 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 020200C0:0035 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1
   3: 0100007F:A0D2 0100007F:280A 01 00000000:00000000 00:00000000 00000000     0        0 4 1
"""
PROC_NET_TCP6 = """\
  sl  local_address                         remote_address                        st
   0: 00000000000000000000000000000000:280A 00000000000000000000000000000000:0000 0A 0
   1: 0000000000000000FFFF0000020200C0:1F90 00000000000000000000000000000000:0000 0A 0
   2: 00000000000000000000000001000000:1F91 00000000000000000000000000000000:0000 0A 0
"""
PROC_NET_UDP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
 113: 020200C0:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 5 2
"""


def test_listening_sockets_decodes_proc_net() -> None:
    assert listening_sockets(PROC_NET_TCP) == {
        ("127.0.0.1", 10250),
        ("127.0.0.1", 10264),
        ("192.0.2.2", 53),
    }  # the ESTABLISHED connection (state 01) is not listening
    assert listening_sockets(PROC_NET_TCP6) == {("::", 10250), ("192.0.2.2", 8080), ("::1", 8081)}
    assert listening_sockets(PROC_NET_UDP, udp=True) == {("192.0.2.2", 53)}
    assert listening_sockets(PROC_NET_UDP) == set()


MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/memory rw shared:9 - cgroup cgroup rw,memory
32 30 0:28 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw
40 22 254:0 /runs/r1/realnode/kubelet /runs/r1/realnode/kubelet rw shared:20 - ext4 /dev/vda rw
41 40 0:50 / /runs/r1/realnode/kubelet/pods/u1/volumes/kubernetes.io~projected/x rw - tmpfs t rw
42 22 0:51 / /runs/r1/realnode/containerd/state/cri/sandboxes/s1/shm rw - tmpfs shm rw
43 22 254:0 /data /mnt/with\\040space rw - ext4 /dev/vda rw
44 22 0:52 / /runs/r1/realnode-other rw - tmpfs tmpfs rw
"""


def test_mounts_under_lists_deepest_first_and_only_below_the_roots() -> None:
    assert mounts_under(MOUNTINFO, [str(STATE)]) == [
        "/runs/r1/realnode/kubelet/pods/u1/volumes/kubernetes.io~projected/x",
        "/runs/r1/realnode/containerd/state/cri/sandboxes/s1/shm",
        "/runs/r1/realnode/kubelet",
    ]
    assert mounts_under(MOUNTINFO, ["/mnt/with space"]) == ["/mnt/with space"]
    assert mounts_under(MOUNTINFO, ["/var/lib/kubelet"]) == []


def test_cgroup_mounts_finds_v1_and_v2_hierarchies() -> None:
    assert cgroup_mounts(MOUNTINFO) == ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified"]


# `ip -o link show`, shortened after the master/state fields the parser reads.
IP_LINK = """\
1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT\\    link/lo
4: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1400 qdisc pfifo_fast state UP\\    link/ether
5: tpusim-br0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1400 qdisc noqueue state UP\\    link/ether
6: veth5042a9f5@if2: <BROADCAST,UP> mtu 1400 qdisc noqueue master tpusim-br0 state UP\\    link/e
7: veth99@if3: <BROADCAST,MULTICAST,UP> mtu 1500 qdisc noqueue master docker0 state UP\\    link/e
"""


def test_bridge_links_finds_the_bridge_and_its_ports_only() -> None:
    assert bridge_links(IP_LINK, "tpusim-br0") == ["tpusim-br0", "veth5042a9f5"]
    assert bridge_links(IP_LINK, "tpusim-br1") == []


def test_our_processes_needs_a_component_binary_with_our_marker() -> None:
    state = str(STATE)
    procs = [
        (10, ["/tools/kubelet", f"--config={state}/kubelet-config.yaml"]),
        (11, ["/usr/bin/containerd", f"--config={state}/containerd.toml"]),
        (12, ["/usr/bin/containerd-shim-runc-v2", "-id", "x", "-address", f"{state}/c.sock"]),
        (13, ["/usr/sbin/dnsmasq", "--address=/kubernetes.default.svc.cluster.local/10.96.0.1"]),
        (20, ["/usr/bin/kubelet", "--config=/etc/kubernetes/kubelet.conf"]),  # someone else's
        (21, ["/usr/bin/python3", f"{state}/script.py"]),  # not a node component
        (22, []),
    ]
    found = our_processes(procs, [state, "/kubernetes.default.svc."])
    assert found == [
        (10, "kubelet"),
        (11, "containerd"),
        (12, "containerd-shim-runc-v2"),
        (13, "dnsmasq"),
    ]


def test_read_sysctls_reads_existing_and_skips_unknown() -> None:
    values = read_sysctls(["kernel.ostype", "no.such.sysctl"])
    assert values == {"kernel.ostype": "Linux"}


# ---------------------------------------------------------------- the host lock
def _record(run_dir: str, pid: int | None = None, **extra: object) -> HostRecord:
    pid = os.getpid() if pid is None else pid
    return HostRecord(
        run_dir=run_dir,
        state_dir=f"{run_dir}/realnode",
        node_name="tpusim-real",
        node_ip="192.0.2.2",
        bridge="tpusim-br0",
        pod_cidr="10.245.0.0/24",
        containerd_socket=f"{run_dir}/realnode/containerd.sock",
        kube_proxy="/tools/kube-proxy",
        owner_pid=pid,
        owner_start=process_start(pid),
        **extra,  # type: ignore[arg-type]
    )


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_second_real_node_is_refused_naming_the_owner(tmp_path: Path) -> None:
    lock = HostLock(tmp_path / "tpusim-realnode.lock")
    assert lock.claim(_record("/runs/a")) is None
    with pytest.raises(RealNodeBusy, match=r"/runs/a \(owner pid \d+\).*--dir /runs/a down"):
        lock.claim(_record("/runs/b"))
    with pytest.raises(RealNodeBusy, match="/runs/a"):
        lock.check("/runs/b")
    lock.check("/runs/a")  # its own run dir may start again
    owner = lock.owner()
    assert owner is not None and owner.run_dir == "/runs/a"


def test_no_cleanup_of_another_run_while_a_live_node_owns_the_host(tmp_path: Path) -> None:
    """The host-wide steps would break the live node: refused before doing anything."""
    lock = HostLock(tmp_path / "lock")
    lock.claim(_record("/runs/live"))
    with pytest.raises(RealNodeBusy, match=r"not cleaning up after /runs/old.*/runs/live"):
        cleanup_host(_record("/runs/old", pid=_dead_pid()), lock=lock)


def test_claim_after_release_is_clean_and_last_keeps_the_baseline(tmp_path: Path) -> None:
    lock = HostLock(tmp_path / "lock")
    first = _record("/runs/a", sysctls={"kernel.panic": "1"})
    lock.claim(first)
    first.cleaned = True
    lock.release(first)
    assert lock.owner() is None
    last = lock.last()
    assert last is not None and last.sysctls == {"kernel.panic": "1"}
    assert lock.claim(_record("/runs/b")) is None


def test_a_dead_owner_is_stale_and_handed_over_for_cleanup(tmp_path: Path) -> None:
    lock = HostLock(tmp_path / "lock")
    dead = _dead_pid()
    survivor = {"name": "dnsmasq", "pid": os.getpid(), "exe": "x"}  # outlives the harness
    lock.claim(_record("/runs/a", pid=dead, components=[survivor]))
    stale = lock.claim(_record("/runs/b"))
    assert stale is not None and stale.run_dir == "/runs/a"
    owner = lock.owner()
    assert owner is not None and owner.run_dir == "/runs/b"


def test_a_running_kubelet_keeps_a_detached_claim_alive(tmp_path: Path) -> None:
    """`up --real-node` exits; its node still owns the machine while the kubelet runs."""
    me = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")[0].decode()
    record = _record(
        "/runs/a",
        pid=_dead_pid(),
        components=[{"name": "kubelet", "pid": os.getpid(), "exe": me}],
    )
    lock = HostLock(tmp_path / "lock")
    lock.claim(record)
    with pytest.raises(RealNodeBusy):
        lock.claim(_record("/runs/b"))


def test_host_record_round_trips_through_its_state_file(tmp_path: Path) -> None:
    record = _record(str(tmp_path), sysctls={"vm.overcommit_memory": "0"})
    Path(record.state_dir).mkdir()
    record.save()
    loaded = HostRecord.load(Path(record.state_dir))
    assert loaded == record
    assert HostRecord.load(tmp_path / "nowhere") is None


def test_dnsmasq_reads_the_service_names_from_its_hosts_dir() -> None:
    argv = dnsmasq_argv("192.0.2.2", PATHS, ["192.0.2.53"], "10.96.0.1", "cluster.local")
    assert f"--hostsdir={PATHS.dns_hosts_dir}" in argv
