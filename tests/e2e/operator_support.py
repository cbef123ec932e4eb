"""Run `tpuslice run` as a real process next to the cluster, and read what it produced.

A subprocess, not an in-thread runner: scenario f SIGKILLs it mid-flight, and
the same tests then run against any cluster named by a kubeconfig.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.helpers import E2ECluster
from tpusim import kube
from tpusim.operator_process import OperatorProcess

GROUP, VERSION = "tpuslice.dev", "v1alpha1"
REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- objects
def tsc(
    name: str, *, type_: str = "v6e", topology: str = "4x4", slices: int = 1, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TPUSliceCluster",
        "metadata": {"name": name},
        "spec": {
            "tpu": {"type": type_, "topology": topology, "slices": slices},
            "ray": {"version": "2.54.0"},
            "head": {"resources": {"cpu": "1", "memory": "2Gi"}},
            "worker": {"resources": {"cpu": "4", "memory": "16Gi"}},
            **spec,
        },
    }
    return body


def kubectl(
    cluster: E2ECluster, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    from tpusim import ToolPaths

    tools = ToolPaths.for_repo(REPO)
    binary = str(tools.binary("kubectl")) if not tools.missing() else "kubectl"
    done = subprocess.run(
        [binary, f"--kubeconfig={cluster.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


def helm(
    cluster: E2ECluster, *args: str, check: bool = True, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    """The helm that `make tools` builds, against the test cluster."""
    from tpusim import ToolPaths

    binary = ToolPaths.for_repo(REPO).binary("helm")
    done = subprocess.run(
        [str(binary), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if check:
        assert done.returncode == 0, f"helm {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


def apply(cluster: E2ECluster, namespace: str, body: dict[str, Any]) -> None:
    kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))


def delete_tsc(cluster: E2ECluster, namespace: str, name: str, *, check: bool = True) -> None:
    """Delete and wait until it is gone: the finalizer has released its node pools."""
    kubectl(
        cluster, "delete", "tsc", "-n", namespace, name, "--wait=true", "--timeout=90s", check=check
    )


def event_reasons(cluster: E2ECluster, namespace: str) -> set[str]:
    """Reasons of every Event in ``namespace`` (ours, KubeRay's, the scheduler's)."""
    out = kubectl(cluster, "get", "events", "-n", namespace, "-o", "custom-columns=R:.reason")
    return set(out.stdout.split()[1:])  # first line is the column header


def get_tsc(cluster: E2ECluster, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "tpusliceclusters", name
    )
    return obj


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


def reservations(cluster: E2ECluster) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.custom.list_cluster_custom_object(
        GROUP, VERSION, "slicereservations"
    )["items"]
    return items


def held_by(cluster: E2ECluster, namespace: str, name: str) -> dict[str, str]:
    """replicaName -> pool for every reservation of one TPUSliceCluster."""
    return {
        r["spec"]["holder"]["replicaName"]: r["spec"]["nodePool"]
        for r in reservations(cluster)
        if (r["spec"]["holder"]["namespace"], r["spec"]["holder"]["name"]) == (namespace, name)
    }


def slice_pods(cluster: E2ECluster, namespace: str, name: str) -> list[Any]:
    pods: list[Any] = cluster.core.list_namespaced_pod(
        namespace, label_selector=f"tpuslice.dev/cluster={name}"
    ).items
    return pods


def describe(cluster: E2ECluster, namespace: str, name: str) -> Any:
    try:
        status = get_tsc(cluster, namespace, name).get("status")
    except Exception as exc:
        status = repr(exc)
    pods = [
        f"{p.metadata.name}:{p.status.phase}@{p.spec.node_name}"
        f"{' gated' if p.spec.scheduling_gates else ''}"
        for p in slice_pods(cluster, namespace, name)
    ]
    return {"status": status, "pods": pods, "reservations": held_by(cluster, namespace, name)}


def wait_condition(
    cluster: E2ECluster,
    namespace: str,
    name: str,
    kind: str,
    status: str,
    reason: str | None = None,
    timeout_s: float = 120,
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = get_tsc(cluster, namespace, name)
        cond = condition(obj, kind)
        generation = obj["metadata"]["generation"]
        if (
            cond.get("status") == status
            and (reason is None or cond.get("reason") == reason)
            and cond.get("observedGeneration") == generation
        ):
            return obj
        return None

    return kube.wait_for(
        check,
        timeout_s=timeout_s,
        what=f"{namespace}/{name} {kind}={status} {reason or ''}",
        describe=lambda: describe(cluster, namespace, name),
    )


def pool_of(node_name: str, cluster: E2ECluster) -> str:
    node = cluster.core.read_node(node_name)
    return str(node.metadata.labels["cloud.google.com/gke-nodepool"])


# ---------------------------------------------------------------- continuous invariants
@dataclass
class InvariantWatch:
    """Samples the cluster every few hundred ms while a scenario runs.

    Two properties must hold at every moment: no two slices (replicas) have
    live pods pinned to one node pool, and every released (ungated) live pod
    is pinned to the pool its own slice holds. A sample reads reservations
    before pods; a finding counts only if it persists for ``persist`` samples
    in a row, so a list that straddles a legitimate hand-over is not a finding.
    """

    cluster: E2ECluster
    namespace: str
    interval_s: float = 0.2
    persist: int = 5
    samples: int = 0
    violations: list[str] = field(default_factory=list)
    _streaks: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> InvariantWatch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                findings = self.sample()
            except Exception:
                findings = set()
            self.samples += 1
            for key in list(self._streaks):
                if key not in findings:
                    del self._streaks[key]
            for finding in findings:
                self._streaks[finding] += 1
                if self._streaks[finding] == self.persist:
                    self.violations.append(finding)
            time.sleep(self.interval_s)

    def sample(self) -> set[str]:
        held = {
            r["spec"]["nodePool"]: r["spec"]["holder"]["replicaName"]
            for r in reservations(self.cluster)
        }
        pinned: dict[str, set[str]] = defaultdict(set)
        findings: set[str] = set()
        for pod in self.cluster.core.list_pod_for_all_namespaces(
            label_selector="tpuslice.dev/cluster"
        ).items:
            if pod.metadata.deletion_timestamp:
                continue
            labels = pod.metadata.labels or {}
            replica = labels.get("ray.io/worker-group-replica-name", "?")
            gated = any(
                g.name == "tpuslice.dev/slice-reservation" for g in pod.spec.scheduling_gates or []
            )
            pool = (pod.spec.node_selector or {}).get("cloud.google.com/gke-nodepool")
            if pool:
                pinned[pool].add(replica)
            if not gated and pool is not None and held.get(pool) != replica:
                findings.add(
                    f"pod {pod.metadata.name} of slice {replica} released onto {pool} "
                    f"held by {held.get(pool)}"
                )
        for pool, replicas in pinned.items():
            if len(replicas) > 1:
                findings.add(f"pool {pool} has live pods of slices {sorted(replicas)}")
        return findings


TIMINGS: dict[str, list[float]] = {}


def record(name: str, seconds: float) -> None:
    TIMINGS.setdefault(name, []).append(seconds)


@pytest.fixture(scope="session")
def operator(cluster: E2ECluster, tpuslice_crds: None) -> Iterator[OperatorProcess]:
    """`tpuslice run` with the identity webhook served on loopback, for the whole session."""
    logs = (cluster.run_dir or REPO / ".e2e-runs" / "existing") / "logs"
    proc = OperatorProcess(
        cluster.kubeconfig, logs / "operator.log", extra_args=("--resync-seconds=10",), cwd=REPO
    )
    proc.start()
    yield proc
    proc.stop()
    # a configuration pointing at a stopped webhook would refuse our pods from now on
    kubectl(
        cluster, "delete", "mutatingwebhookconfiguration", "tpuslice-identity", "--ignore-not-found"
    )
    if TIMINGS:
        lines = [
            f"{k}: n={len(v)} max={max(v):.2f}s mean={sum(v) / len(v):.2f}s"
            for k, v in TIMINGS.items()
        ]
        (logs / "operator-timings.txt").write_text("\n".join(lines) + "\n")
