"""Contract with the real ``ray`` package: our TPU identity is what Ray needs.

Ray finds a TPU slice through the env GKE gives a pod: the webhook's
``TPU_NAME`` and ``TPU_WORKER_ID`` plus the device plugin's
``TPU_ACCELERATOR_TYPE`` and ``TPU_TOPOLOGY``. From them it derives the
resources and node labels ``ray.util.tpu.slice_placement_group`` reserves a
slice with: ``TPU-<pod-type>-head`` on worker 0 to find a slice, then one bundle
per host pinned by ``ray.io/tpu-slice-name``.

Two tiers:

1. In-process, every generation: the env ``identity.mutate_pod`` produces for
   each host is fed to Ray's own resource/label resolution (the code a raylet
   runs at start). Only the chip count is faked, because there is no TPU here.
2. A real local Ray cluster: ``ray start --head`` and one ``ray start`` per host
   of two slices, each process with exactly that host's env, then
   ``slice_placement_group`` must reserve whole slices; and a cluster of two TPU
   groups (``spec.workerGroups``), each group's slices whole and distinct in Ray.
   ``ray.cluster_utils`` cannot do this (it resolves every node in the driver's
   environment).

Processes are started in their own sessions and killed by process group (and,
as a safety net, by our unique temp dir in their command line), never by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from ray._private.accelerators import tpu as ray_tpu
from ray._private.resource_and_label_spec import ResourceAndLabelSpec

from tests.unit.test_groups import grouped, rendered_groups
from tests.unit.test_groups import kuberay_pod as groups_kuberay_pod
from tests.unit.test_identity import kuberay_pod, render_worker_template
from tpuslice.model import constants as c
from tpuslice.model.topology import SliceShape, slice_shape
from tpuslice.render.identity import mutate_pod
from tpuslice.render.kuberay import ray_node_labels
from tpuslice.spec.cluster import parse_cluster

pytestmark = pytest.mark.contract

# Ray rewrites 127.0.0.1 and localhost to the machine's outward address (its
# resolve_ip_for_localhost); another loopback address keeps every process on loopback.
HOST_IP = "127.0.0.2"
# Env names this test controls in every Ray process; anything inherited is dropped.
_OWNED_ENV = re.compile(r"^(TPU_|MEGASCALE_)")
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def kubelet_env(pod: Mapping[str, Any], container: int = 0) -> dict[str, str]:
    """The container env as the kubelet resolves it: downward API and ``$(VAR)`` expansion."""
    env: dict[str, str] = {}
    for entry in pod["spec"]["containers"][container].get("env") or []:
        if "valueFrom" in entry:
            field = entry["valueFrom"]["fieldRef"]["fieldPath"]
            assert field == "status.hostIP", f"unexpected downward-API field {field}"
            env[entry["name"]] = HOST_IP
        else:
            env[entry["name"]] = _VAR_REF.sub(
                lambda m: env.get(m.group(1), m.group(0)), entry["value"]
            )
    return env


def device_plugin_env(shape: SliceShape) -> dict[str, str]:
    """What GKE's TPU device plugin (not any webhook) sets in a TPU container."""
    return {
        c.ENV_TPU_ACCELERATOR_TYPE: shape.accelerator_type,
        c.ENV_TPU_TOPOLOGY: shape.topology,
    }


def host_envs(
    tpu_type: str, topology: str, slices: int, cph: int | None = None
) -> list[tuple[int, int, dict[str, str]]]:
    """(replica, host, env) for every worker pod of a cluster, through identity.mutate_pod."""
    shape = slice_shape(tpu_type, topology, cph)
    template, hosts = render_worker_template(tpu_type, topology, slices=slices, chips_per_host=cph)
    out = []
    for replica in range(slices):
        for host in range(hosts):
            pod = mutate_pod(kuberay_pod(template, hosts, replica, host)).pod
            out.append((replica, host, {**kubelet_env(pod), **device_plugin_env(shape)}))
    return out


# ------------------------------------------------------------------ tier 1: in process

SHAPES = [
    ("v4", "2x2x1", None),
    ("v4", "2x2x2", None),
    ("v4", "4x4x8", None),
    ("v5e", "2x4", None),
    ("v5e", "2x4", 4),
    ("v5e", "8x8", None),
    ("v5p", "2x2x1", None),
    ("v5p", "4x4x4", None),
    ("v6e", "1x1", None),
    ("v6e", "4x4", None),
    ("tpu7x", "2x2x1", None),
    ("tpu7x", "2x2x2", None),
    ("tpu7x", "4x4x8", None),
]


@pytest.mark.parametrize(("tpu_type", "topology", "cph"), SHAPES)
def test_ray_derives_slice_resources_and_labels(
    tpu_type: str, topology: str, cph: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    shape = slice_shape(tpu_type, topology, cph)
    version = shape.generation.ray_version
    # What slice_placement_group asks for: the pod type from (topology, version).
    pod_type = ray_tpu.infer_tpu_pod_type_from_topology(topology, version)
    assert pod_type == shape.ray_pod_type
    head_resource = f"TPU-{pod_type}-head"
    if cph is None and ray_tpu.TPUAcceleratorManager.is_valid_tpu_accelerator_topology(
        version, topology
    ):
        # Ray sizes bundles per host from its own default: it must match our hosts.
        assert ray_tpu.get_chips_per_host(topology, version) == shape.chips_per_host

    # Only the chip count is faked: there is no /dev/accel* here.
    monkeypatch.setattr(
        ray_tpu.TPUAcceleratorManager,
        "get_current_node_num_accelerators",
        staticmethod(lambda: shape.chips_per_host),
    )
    for name in [n for n in os.environ if _OWNED_ENV.match(n)]:
        monkeypatch.delenv(name)

    heads = []
    for replica, host, env in host_envs(tpu_type, topology, slices=2, cph=cph):
        with monkeypatch.context() as m:
            for name, value in env.items():
                m.setenv(name, value)
            spec = ResourceAndLabelSpec(resources={}).resolve(
                is_head=False, node_ip_address=HOST_IP
            )
        slice_name = f"tpu-{replica}"
        resources, labels = spec.resources, spec.labels
        assert resources["TPU"] == shape.chips_per_host
        assert resources[slice_name] == 1, "the slice-name resource on every host"
        assert resources[f"accelerator_type:TPU-{version.upper()}"] == 1
        assert (head_resource in resources) == (host == 0), "the head resource on worker 0 only"
        if host == 0:
            heads.append(slice_name)
        assert labels["ray.io/tpu-slice-name"] == slice_name
        assert labels["ray.io/tpu-worker-id"] == str(host)
        assert labels["ray.io/tpu-pod-type"] == pod_type
        assert labels["ray.io/tpu-topology"] == topology
        # The labels the operator writes in the worker group (KubeRay >= 1.5 passes
        # them to `ray start --labels`) are exactly the ones Ray derives itself, so
        # Ray never overrides them and the autoscaler sees the same values.
        for key, value in ray_node_labels(shape).items():
            assert labels[key] == value, key
    assert heads == ["tpu-0", "tpu-1"]


# --------------------------------------------------------- tier 2: a real Ray cluster


def _free_ports(count: int, taken: set[int]) -> list[int]:
    """Ports free now, distinct from each other and from ``taken`` (sockets held until all
    are chosen: a closed port is often handed out again at once)."""
    sockets, ports = [], []
    try:
        while len(ports) < count:
            s = socket.socket()
            sockets.append(s)
            s.bind((HOST_IP, 0))
            port = int(s.getsockname()[1])
            if port not in taken:
                ports.append(port)
                taken.add(port)
    finally:
        for s in sockets:
            s.close()
    return ports


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((HOST_IP, port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {HOST_IP}:{port} after {timeout}s")


class LocalRay:
    """Ray processes of one test: started in new sessions, stopped by process group."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        self.taken: set[int] = set()
        (self.gcs_port,) = _free_ports(1, self.taken)

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not _OWNED_ENV.match(k)}
        env.pop("RAY_ADDRESS", None)
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        return env

    def start(self, args: list[str], env: Mapping[str, str], log: str) -> None:
        names = [
            "--node-manager-port",
            "--object-manager-port",
            "--metrics-export-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
        ]
        ports = dict(zip(names, _free_ports(len(names), self.taken), strict=True))
        cmd = [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--block",
            f"--node-ip-address={HOST_IP}",
            "--disable-usage-stats",
            "--object-store-memory=80000000",
            "--include-log-monitor=false",
            *(f"{k}={v}" for k, v in ports.items()),
            *args,
        ]
        with open(self.root / f"{log}.log", "wb") as out:
            self.procs.append(
                subprocess.Popen(
                    cmd,
                    env={**self.base_env(), **env},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=self.root,
                )
            )

    def start_head(self) -> None:
        self.start(
            [
                "--head",
                f"--port={self.gcs_port}",
                f"--temp-dir={self.root / 'ray'}",
                "--include-dashboard=false",
                "--num-cpus=1",
            ],
            {},
            "head",
        )
        _wait_port(self.gcs_port, timeout=60)

    def start_worker(self, env: Mapping[str, str], chips: int, log: str) -> None:
        self.start(
            [
                f"--address={HOST_IP}:{self.gcs_port}",
                "--num-cpus=1",
                f"--resources={json.dumps({'TPU': chips})}",
            ],
            env,
            log,
        )

    def wait_started(self, logs: list[str], timeout: float) -> None:
        """``ray start`` prints this once its raylet registered; a 2-core machine needs time."""
        deadline = time.monotonic() + timeout
        for log in logs:
            path = self.root / f"{log}.log"
            while b"Ray runtime started" not in path.read_bytes():
                if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                    raise AssertionError(f"{log} did not start:\n{path.read_text()[-3000:]}")
                time.sleep(0.2)

    def run_driver(self, script: str, *args: str, timeout: float) -> Any:
        result = subprocess.run(
            [sys.executable, "-c", script, f"{HOST_IP}:{self.gcs_port}", *args],
            env=self.base_env(),
            capture_output=True,
            timeout=timeout,
            cwd=self.root,
            check=False,
        )
        if result.returncode != 0:
            logs = "\n".join(
                f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                for p in sorted(self.root.glob("*.log"))
            )
            raise AssertionError(
                f"driver failed ({result.returncode}):\n{result.stderr.decode()[-4000:]}\n{logs}"
            )
        return json.loads(result.stdout.decode().strip().splitlines()[-1])

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 3  # then SIGKILL: these are throwaway processes
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        # Safety net: anything of ours that left the process group names our temp dir.
        marker = str(self.root).encode()
        for pid_dir in Path("/proc").glob("[0-9]*"):
            try:
                if marker in (pid_dir / "cmdline").read_bytes():
                    os.kill(int(pid_dir.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue


@pytest.fixture
def local_ray() -> Iterator[LocalRay]:
    root = Path(tempfile.mkdtemp(prefix="tsr", dir="/tmp"))  # short: Ray's socket paths
    cluster = LocalRay(root)
    try:
        yield cluster
    finally:
        cluster.stop()
        if not os.environ.get("TPUSLICE_KEEP_RAY_DIR"):
            shutil.rmtree(root, ignore_errors=True)


DRIVER = r"""
import json, sys, time
import ray
from ray.util.tpu import slice_placement_group

address, topology, version, nodes, slices = sys.argv[1:6]
ray.init(address=address, _node_ip_address=address.split(":")[0], log_to_driver=False)
deadline = time.monotonic() + 120
while sum(n["Alive"] for n in ray.nodes()) < int(nodes):
    if time.monotonic() > deadline:
        raise SystemExit(f"only {sum(n['Alive'] for n in ray.nodes())} of {nodes} nodes joined")
    time.sleep(0.25)
alive = [n for n in ray.nodes() if n["Alive"]]
result = {
    "nodes": {n["NodeID"]: {"labels": n.get("Labels", {}), "resources": n["Resources"]}
              for n in alive},
    "groups": [],
}
kept = []
for _ in range(int(slices)):
    start = time.monotonic()
    spg = slice_placement_group(topology=topology, accelerator_version=version)
    ray.get(spg.placement_group.ready(), timeout=60)
    table = ray.util.placement_group_table(spg.placement_group)
    result["groups"].append({
        "num_hosts": spg.num_hosts,
        "nodes": list(table["bundles_to_node_id"].values()),
        "seconds": round(time.monotonic() - start, 2),
    })
    kept.append(spg)  # hold each slice so the next reservation must take another
for spg in kept:
    spg.shutdown()
print(json.dumps(result))
"""


@pytest.mark.parametrize(("tpu_type", "topology"), [("v6e", "4x4"), ("v4", "2x2x2")])
def test_slice_placement_group_reserves_whole_slices(
    tpu_type: str, topology: str, local_ray: LocalRay
) -> None:
    shape = slice_shape(tpu_type, topology)
    slices = 2
    envs = host_envs(tpu_type, topology, slices)
    local_ray.start_head()
    # One at a time: raylets started together on one address race for ports and
    # abort ("bind: Address already in use"), and overload a 2-core machine.
    for replica, host, env in envs:
        log = f"worker-{replica}-{host}"
        local_ray.start_worker(env, shape.chips_per_host, log)
        local_ray.wait_started([log], timeout=90)

    result = local_ray.run_driver(
        DRIVER,
        topology,
        shape.generation.ray_version,
        str(1 + len(envs)),
        str(slices),
        timeout=240,
    )
    nodes = result["nodes"]
    tpu_nodes = {nid: n for nid, n in nodes.items() if "ray.io/tpu-slice-name" in n["labels"]}
    assert len(tpu_nodes) == len(envs)
    # Ray itself derived every host's identity from the env of its process.
    seen = sorted(
        (n["labels"]["ray.io/tpu-slice-name"], n["labels"]["ray.io/tpu-worker-id"])
        for n in tpu_nodes.values()
    )
    assert seen == sorted((f"tpu-{r}", str(h)) for r, h, _ in envs)

    reserved = []
    for group in result["groups"]:
        assert group["num_hosts"] == shape.hosts
        hosts = group["nodes"]
        assert len(hosts) == len(set(hosts)) == shape.hosts, "one bundle per host"
        names = {tpu_nodes[nid]["labels"]["ray.io/tpu-slice-name"] for nid in hosts}
        assert len(names) == 1, f"bundles spread over slices {names}"
        (name,) = names
        members = {
            nid for nid, n in tpu_nodes.items() if n["labels"]["ray.io/tpu-slice-name"] == name
        }
        assert set(hosts) == members, "the whole slice, every host of it"
        reserved.append(name)
    assert sorted(reserved) == ["tpu-0", "tpu-1"], "two reservations take both slices"


# ------------------------------------------------ tier 2: two TPU groups of one cluster

GROUPS_DRIVER = r"""
import json, sys, time
import ray
from ray.util.tpu import slice_placement_group

address, version, nodes, asks = sys.argv[1:5]
ray.init(address=address, _node_ip_address=address.split(":")[0], log_to_driver=False)
deadline = time.monotonic() + 120
while sum(n["Alive"] for n in ray.nodes()) < int(nodes):
    if time.monotonic() > deadline:
        raise SystemExit(f"only {sum(n['Alive'] for n in ray.nodes())} of {nodes} nodes joined")
    time.sleep(0.25)
result = {
    "nodes": {n["NodeID"]: n.get("Labels", {}) for n in ray.nodes() if n["Alive"]},
    "groups": [],
}
kept = []
for ask in asks.split(","):
    topology, count = ask.split(":")
    for _ in range(int(count)):
        spg = slice_placement_group(topology=topology, accelerator_version=version)
        ray.get(spg.placement_group.ready(), timeout=60)
        table = ray.util.placement_group_table(spg.placement_group)
        result["groups"].append(
            {"topology": topology, "nodes": list(table["bundles_to_node_id"].values())}
        )
        kept.append(spg)  # held, so the next reservation must take another slice
for spg in kept:
    spg.shutdown()
print(json.dumps(result))
"""


def grouped_host_envs(obj: dict[str, Any]) -> list[tuple[str, int, int, dict[str, str]]]:
    """(group, replica, host, env) of every TPU host of a many-group cluster, through
    ``identity.mutate_pod`` and the kubelet, plus what GKE's device plugin sets."""
    spec = parse_cluster(obj)
    out = []
    for group_spec in spec.tpu_groups():
        group = rendered_groups(obj)[group_spec.group_name]
        for replica in range(group["replicas"]):
            for host in range(group.get("numOfHosts", 1)):
                pod = mutate_pod(groups_kuberay_pod(group, replica, host)).pod
                env = {**kubelet_env(pod), **device_plugin_env(group_spec.shape)}
                out.append((group_spec.group_name, replica, host, env))
    return out


def test_two_tpu_groups_are_two_sets_of_whole_slices_in_ray(local_ray: LocalRay) -> None:
    """A cluster of a 4-host v6e 4x4 training group and a single-host v6e 2x2 group of two
    independent slices: Ray derives a distinct slice per group replica (``train-0``,
    ``serve-0``, ``serve-1``) from the webhook's env, and ``slice_placement_group`` of each
    group's topology reserves exactly one whole slice of that group."""
    obj = grouped(
        {"name": "train", "tpu": {"type": "v6e", "topology": "4x4", "slices": 1}},
        {
            "name": "serve",
            "tpu": {"type": "v6e", "topology": "2x2", "slices": 2, "multislice": False},
        },
    )
    envs = grouped_host_envs(obj)
    assert [(g, r, h) for g, r, h, _ in envs] == [
        ("train", 0, 0),
        ("train", 0, 1),
        ("train", 0, 2),
        ("train", 0, 3),
        ("serve", 0, 0),
        ("serve", 1, 0),
    ]
    local_ray.start_head()
    for group, replica, host, env in envs:
        log = f"{group}-{replica}-{host}"
        local_ray.start_worker(env, 4, log)
        local_ray.wait_started([log], timeout=90)

    result = local_ray.run_driver(
        GROUPS_DRIVER, "v6e", str(1 + len(envs)), "4x4:1,2x2:2", timeout=240
    )
    labels = {nid: n for nid, n in result["nodes"].items() if "ray.io/tpu-slice-name" in n}
    members: dict[str, set[str]] = {}
    for nid, n in labels.items():
        members.setdefault(n["ray.io/tpu-slice-name"], set()).add(nid)
    assert {name: len(nodes) for name, nodes in members.items()} == {
        "train-0": 4,
        "serve-0": 1,
        "serve-1": 1,
    }
    reserved = []
    for group in result["groups"]:
        hosts = set(group["nodes"])
        names = {labels[nid]["ray.io/tpu-slice-name"] for nid in hosts}
        assert len(names) == 1, f"bundles spread over slices {names}"
        (name,) = names
        assert hosts == members[name], "the whole slice, every host of it"
        assert labels[next(iter(hosts))]["ray.io/tpu-topology"] == group["topology"]
        reserved.append(name)
    assert reserved[0] == "train-0"
    assert sorted(reserved[1:]) == ["serve-0", "serve-1"]
