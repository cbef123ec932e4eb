"""What the benchmark creates: its scales, the TPUSliceClusters, the node pools under
them, and for the direct run the RayClusters the operator would have made of them."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench import operator_api as c
from tpusim import CPUPool, TPUPool
from tpusim.operator_process import tpuslice_command

#: The repository: hack/bench/bench/scenario.py is three folders down.
REPO = Path(__file__).resolve().parents[3]
HOSTS = 4  # v6e 4x4: 4 hosts of 4 chips
GANG_SLICES, GANG_HOSTS = 2, 2  # h: v6e 2x4 slices of 2 hosts with 4 chips each


@dataclass(frozen=True)
class Scale:
    clusters: int
    timeout_s: float  # bound of each wait (all Ready, all gone)
    apply_threads: int = 8
    gangs: int = 8  # h: 2-slice TSCs competing for ...
    gang_pools: int = 4  # ... this many v6e 2x4 pools (fewer than 2 per gang)
    #: KubeRay's reconcile concurrency, the same for the operator's and the direct run:
    #: at 1,000 clusters one worker cannot create the pods of every cluster before the
    #: wait's bound, so nothing settles and no restart or steady state can be measured
    kuberay_concurrency: int = 1
    #: KWOK's node lease and the controller-manager's grace period (tpusim's
    #: ``ClusterSettings``), the same for both runs. At 4,000 nodes the default 40 s lease
    #: is 400 renewals a second on this machine's two cores, more than KWOK keeps up
    #: with under a burst: leases lapsed past the 120 s grace, nodes went NotReady, and
    #: the operator drained the slices on them (as it must), so nothing settled.
    node_lease_seconds: int = 40
    node_monitor_grace_seconds: int = 120
    #: The operator's ``--status-batch-seconds`` (0: its default). At 1,000 a slice's
    #: steps lie tens of seconds apart (its pods scheduled -> Ready 22-45 s), each a
    #: status write of its own within the default's 2 s; a minute folds them into one,
    #: the setting the operator's docs give for a burst of that size.
    status_batch_seconds: int = 0


SCALES = {
    "small": Scale(clusters=25, timeout_s=300, gangs=8, gang_pools=4),
    "medium": Scale(clusters=200, timeout_s=900, gangs=40, gang_pools=10),
    "large": Scale(
        clusters=1000,
        timeout_s=900,
        gangs=100,
        gang_pools=20,
        kuberay_concurrency=8,
        node_lease_seconds=400,
        node_monitor_grace_seconds=900,
        status_batch_seconds=60,
    ),
}


def tsc(name: str, gated: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "tpu": {"type": "v6e", "topology": "4x4", "slices": 1},
        "ray": {"version": "2.54.0"},
        "head": {"resources": {"cpu": "1", "memory": "2Gi"}},
        "worker": {"resources": {"cpu": "4", "memory": "16Gi"}},
    }
    if not gated:
        spec["reservation"] = {"policy": "None"}
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND_CLUSTER,
        "metadata": {"name": name},
        "spec": spec,
    }


def gang_tsc(name: str) -> dict[str, Any]:
    """h: a multislice TSC; spec.reservation.gang is left to its default (AllSlices)."""
    body = tsc(name)
    body["spec"]["tpu"] = {"type": "v6e", "topology": "2x4", "chipsPerHost": 4}
    body["spec"]["tpu"]["slices"] = GANG_SLICES
    return body


def names(n: int) -> list[str]:
    return [f"b{i:04d}" for i in range(n)]


def pools(clusters: int) -> list[Any]:
    heads_per_node = 14  # 16-CPU nodes, 1-CPU heads
    return [TPUPool(f"v6e-{i:04d}", "v6e", "4x4", nodes=HOSTS) for i in range(clusters)] + [
        CPUPool("cpu", nodes=clusters // heads_per_node + 2)
    ]


def rendered_rayclusters(clusters: list[dict[str, Any]], timeout_s: float = 300) -> list[Any]:
    """The RayCluster of each TPUSliceCluster, in order, as the operator renders it: by the
    product's own command, `tpuslice render -f -` (every cluster in one call, one YAML
    document each on stdin and on stdout), not by importing the operator's renderer, so
    the benchmark depends on the operator's command line only, never on its modules."""
    done = subprocess.run(
        [str(tpuslice_command()), "render", "-f", "-"],
        input=yaml.safe_dump_all(clusters),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"tpuslice render exited {done.returncode}: {done.stderr.strip()}")
    rendered = [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]
    if len(rendered) != len(clusters):
        raise RuntimeError(f"tpuslice render: {len(rendered)} documents for {len(clusters)}")
    return rendered
