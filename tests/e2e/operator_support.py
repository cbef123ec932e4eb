"""Run `tpuslice run` as a real process next to the cluster, and read what it produced.

A subprocess, not an in-thread runner: scenario f SIGKILLs it mid-flight, and
the same tests then run against any cluster named by a kubeconfig.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import pytest
import yaml

from tests.e2e.helpers import E2ECluster
from tests.support.builders import tpu, tpuslice
from tpusim import kube
from tpusim.nodepools import TPU_RESOURCE
from tpusim.operator_process import OperatorProcess as OperatorProcess

GROUP, VERSION = "tpuslice.dev", "v1alpha1"
REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- objects
def tsc(
    name: str, *, type_: str = "v6e", topology: str = "4x4", slices: int = 1, **spec: Any
) -> dict[str, Any]:
    """A TPUSliceCluster as a user applies it, with small head and worker resources."""
    return tpuslice(
        name=name,
        namespace=None,
        tpu=tpu(type_, topology, slices=slices),
        **{
            "head": {"resources": {"cpu": "1", "memory": "2Gi"}},
            "worker": {"resources": {"cpu": "4", "memory": "16Gi"}},
            **spec,
        },
    )


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
GATE = "tpuslice.dev/slice-reservation"
NODEPOOL = "cloud.google.com/gke-nodepool"
HOSTNAME = "kubernetes.io/hostname"
REPLICA = "ray.io/worker-group-replica-name"


def released(pod: Any) -> bool:
    return not any(g.name == GATE for g in pod.spec.scheduling_gates or [])


def asks_for_tpu(pod: Any) -> bool:
    return any(
        TPU_RESOURCE in ((c.resources and c.resources.requests) or {}) for c in pod.spec.containers
    )


class Sampler:
    """A daemon thread that calls ``tick`` about every ``interval_s`` (a field of each
    subclass) from ``__enter__`` to ``__exit__``: the shared part of the scenario
    watches. Not a dataclass itself, so its subclasses keep their own field order."""

    interval_s: float
    _stop: threading.Event
    _thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=type(self).__name__)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.tick()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def tick(self) -> None:
        raise NotImplementedError


@dataclass
class Watch(Sampler):
    """What the scenario watches share: ``sample`` returns findings that count at once
    and findings that count only once they persist for ``persist`` samples in a row (a
    list may straddle a legitimate hand-over); a sample that fails (a list during a
    restart) is counted in ``errors``; ``check`` fails a watch that did not see."""

    cluster: E2ECluster
    namespace: str
    interval_s: float = 0.2
    persist: int = 5
    samples: int = 0
    errors: int = 0
    violations: list[str] = field(default_factory=list)
    _streaks: dict[str, int] = field(default_factory=dict)

    def sample(self) -> tuple[list[str], set[str]]:
        raise NotImplementedError

    def tick(self) -> None:
        try:
            instant, persistent = self.sample()
        except Exception:
            self.errors += 1
            instant, persistent = [], set()
        self.samples += 1
        self.violations += instant
        self._streaks = {f: self._streaks.get(f, 0) + 1 for f in persistent}
        self.violations += [f for f, n in self._streaks.items() if n == self.persist]

    def check(self, *, min_samples: int = 5) -> None:
        """The scenario ran under the watch, the watch saw, and nothing it looks for
        happened."""
        assert self.samples > min_samples, f"only {self.samples} samples ({self.errors} failed)"
        assert self.errors < self.samples / 2, f"{self.errors} of {self.samples} samples failed"
        assert self.violations == [], self.violations


@dataclass
class InvariantWatch(Watch):
    """Samples the cluster every few hundred ms while a scenario runs.

    Three properties must hold at every moment: no two slices (replicas) have
    live pods pinned to one unit (a node pool, or a node for single-host slices); every
    released (ungated) live pod that is pinned is pinned to the unit its own slice
    holds; and a TPU pod once seen gated is never released without a pin (it could
    then schedule anywhere). A sample reads reservations before pods; every finding
    must persist (``Watch``). A single-host worker has no replica label: its slice is
    named by the pod itself.
    """

    _seen_gated: set[str] = field(default_factory=set)
    #: With pin at admission a slice is its (object, replica index): KubeRay's next
    #: replica of an index is pinned to the unit the index holds before the operator
    #: writes the new replica name into the reservation. A released pod then counts as
    #: on its own slice's unit when the holder is its object and index.
    by_index: bool = field(default_factory=lambda: bool(pin_flags()))

    def sample(self) -> tuple[list[str], set[str]]:
        found = reservations(self.cluster)
        held = {
            r["spec"].get("node") or r["spec"]["nodePool"]: r["spec"]["holder"]["replicaName"]
            for r in found
        }
        slot = {
            r["spec"].get("node") or r["spec"]["nodePool"]: (
                r["spec"]["holder"]["namespace"],
                r["spec"]["holder"]["name"],
                str(r["spec"]["holder"].get("replicaIndex")),
            )
            for r in found
        }
        pinned: dict[str, set[str]] = defaultdict(set)
        findings: set[str] = set()
        for pod in self.cluster.core.list_pod_for_all_namespaces(
            label_selector="tpuslice.dev/cluster"
        ).items:
            if pod.metadata.deletion_timestamp:
                continue
            labels = pod.metadata.labels or {}
            replica = labels.get(REPLICA) or pod.metadata.name
            selector = pod.spec.node_selector or {}
            pool = selector.get(HOSTNAME) or selector.get(NODEPOOL)
            if pool:
                pinned[pool].add(replica)
            if not released(pod):
                self._seen_gated.add(pod.metadata.uid)
                continue
            index = (
                pod.metadata.namespace,
                labels.get("tpuslice.dev/cluster"),
                labels.get("ray.io/worker-group-replica-index"),
            )
            if self.by_index and pool is not None and slot.get(pool) == index:
                continue
            if pool is not None and held.get(pool) != replica:
                findings.add(
                    f"pod {pod.metadata.name} of slice {replica} released onto {pool} "
                    f"held by {held.get(pool)}"
                )
            if pool is None and pod.metadata.uid in self._seen_gated and asks_for_tpu(pod):
                findings.add(f"pod {pod.metadata.name} of slice {replica} released unpinned")
        for pool, replicas in pinned.items():
            if len(replicas) > 1:
                findings.add(f"pool {pool} has live pods of slices {sorted(replicas)}")
        return [], findings


def pin_flags() -> tuple[str, ...]:
    """``--pin-at-admission`` for the session's operator and webhook when
    ``TPUSLICE_E2E_PIN_AT_ADMISSION=1`` (the e2e tests run with the setting on)."""
    return ("--pin-at-admission",) if os.environ.get("TPUSLICE_E2E_PIN_AT_ADMISSION") == "1" else ()


TIMINGS: dict[str, list[float]] = {}


def record(name: str, seconds: float) -> None:
    TIMINGS.setdefault(name, []).append(seconds)


@pytest.fixture(scope="session")
def operator(cluster: E2ECluster, tpuslice_crds: None) -> Iterator[OperatorProcess]:
    """`tpuslice run` with the identity webhook served on loopback, for the whole session."""
    logs = (cluster.run_dir or REPO / ".e2e-runs" / "existing") / "logs"
    pin = pin_flags()
    proc = OperatorProcess(
        cluster.kubeconfig,
        logs / "operator.log",
        extra_args=("--resync-seconds=10", *pin),
        webhook_args=pin,
        cwd=REPO,
    )
    proc.start()
    yield proc
    proc.stop()
    # a configuration pointing at a stopped webhook would refuse our pods from now on
    kubectl(
        cluster, "delete", "mutatingwebhookconfiguration", "tpuslice-identity", "--ignore-not-found"
    )
    # and the policy webhook's (Ignore) would make every TPUSlice apply wait on a dead port
    kubectl(
        cluster,
        "delete",
        "validatingwebhookconfiguration",
        "tpuslice-policy",
        "--ignore-not-found",
    )
    if TIMINGS:
        lines = [
            f"{k}: n={len(v)} max={max(v):.2f}s mean={sum(v) / len(v):.2f}s"
            for k, v in TIMINGS.items()
        ]
        (logs / "operator-timings.txt").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- gangs
def shape_nodes(
    cluster: E2ECluster, accelerator: str = "tpu-v6e-slice", topology: str = "2x4"
) -> list[Any]:
    """The harness's nodes (``kube.harness_nodes``) of one TPU shape."""
    shape = {
        "cloud.google.com/gke-tpu-accelerator": accelerator,
        "cloud.google.com/gke-tpu-topology": topology,
    }
    return [
        n
        for n in kube.harness_nodes(cluster.api)
        if shape.items() <= (n.metadata.labels or {}).items()
    ]


def shape_pools(
    cluster: E2ECluster, accelerator: str = "tpu-v6e-slice", topology: str = "2x4"
) -> set[str]:
    """The harness's pools of one TPU shape."""
    return {n.metadata.labels[NODEPOOL] for n in shape_nodes(cluster, accelerator, topology)}


def tsc_names(cluster: E2ECluster, namespace: str) -> dict[str, dict[str, Any]]:
    items = cluster.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "tpusliceclusters"
    )["items"]
    return {o["metadata"]["name"]: o for o in items}


def desired_and_gang(obj: dict[str, Any]) -> tuple[int, str]:
    """spec.tpu.slices (0 when suspended) and the gang mode, with the API's default."""
    spec = obj["spec"]
    slices = 0 if spec.get("suspend") else int(spec["tpu"].get("slices", 1))
    default = "AllSlices" if int(spec["tpu"].get("slices", 1)) > 1 else "PerSlice"
    return slices, (spec.get("reservation") or {}).get("gang") or default


@dataclass
class GangWatch(Watch):
    """Samples TSCs, pods and reservations about every ``interval_s`` while a scenario runs.

    Each sample lists the namespace's TSCs, then its pods, then every reservation, then
    the TSCs again; a finding about a cluster counts only if the cluster was there,
    unchanged (uid, generation) and not being deleted in both TSC lists, so a deletion
    that frees pools between two lists is not a finding. Findings:

    - a pod of an ``AllSlices`` cluster released (its gate gone) since the previous
      sample while the cluster's reservations cover fewer slices than it has
      (reservations are read after the pods, so they are no older than the release);
    - two reservations naming one pool;
    - live pods of two slices pinned to one pool, or a released pod pinned to a pool
      its slice does not hold (for ``persist`` samples in a row: a list may straddle
      a legitimate hand-over).

    It also records, per cluster, every pool it ever held (``ever_held``) and the
    longest time it held some but not all of its pools with no pod released
    (``longest_partial``).
    """

    interval_s: float = 0.1
    persist: int = 3
    #: With pin at admission a slice is its (object, replica index), as in
    #: ``InvariantWatch``: a replica's pods are pinned to the unit its index holds
    #: (a placeholder's, ``~index-<n>``) before the pass writes the replica's name.
    by_index: bool = field(default_factory=lambda: bool(pin_flags()))
    ever_held: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    longest_partial: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    _partial_since: dict[str, float] = field(default_factory=dict)
    _released: set[str] = field(default_factory=set)

    def sample(self) -> tuple[list[str], set[str]]:
        now = time.monotonic()
        before = tsc_names(self.cluster, self.namespace)
        pods = [
            p
            for p in self.cluster.core.list_namespaced_pod(
                self.namespace, label_selector="tpuslice.dev/cluster"
            ).items
            if not p.metadata.deletion_timestamp
        ]
        all_reservations = reservations(self.cluster)
        after = tsc_names(self.cluster, self.namespace)
        stable = {
            name: obj
            for name, obj in after.items()
            if name in before
            and not obj["metadata"].get("deletionTimestamp")
            and not before[name]["metadata"].get("deletionTimestamp")
            and (obj["metadata"]["uid"], obj["metadata"]["generation"])
            == (before[name]["metadata"]["uid"], before[name]["metadata"]["generation"])
        }
        instant: list[str] = []
        persistent: set[str] = set()

        for pool, n in Counter(r["spec"]["nodePool"] for r in all_reservations).items():
            if n > 1:
                instant.append(f"pool {pool} has {n} reservations")
        holder_of = {r["spec"]["nodePool"]: r["spec"]["holder"] for r in all_reservations}
        holding: dict[str, set[str]] = defaultdict(set)  # TSC name -> replicas holding
        for pool, h in holder_of.items():
            if h["namespace"] == self.namespace:
                self.ever_held[h["name"]].add(pool)
                if h["name"] in stable and h["uid"] == stable[h["name"]]["metadata"]["uid"]:
                    holding[h["name"]].add(h["replicaName"])

        pinned: dict[str, set[tuple[str, str]]] = defaultdict(set)
        released_now: set[str] = set()
        released_by: dict[str, int] = defaultdict(int)
        for pod in pods:
            name = (pod.metadata.labels or {}).get("tpuslice.dev/cluster", "?")
            replica = (pod.metadata.labels or {}).get(REPLICA, "?")
            pool = (pod.spec.node_selector or {}).get(NODEPOOL)
            if pool:
                pinned[pool].add((name, replica))
            if not released(pod):
                continue
            released_now.add(pod.metadata.uid)
            released_by[name] += 1
            h = holder_of.get(pool or "")
            mismatch = h is None or (h["name"], h["replicaName"]) != (name, replica)
            index = (pod.metadata.labels or {}).get("ray.io/worker-group-replica-index")
            slot = (h["namespace"], h["name"], str(h.get("replicaIndex"))) if h else None
            if self.by_index and slot == (self.namespace, name, index):
                mismatch = False
            if pool and name in stable and mismatch:
                persistent.add(
                    f"released pod {pod.metadata.name} of {name}/{replica} pinned to {pool} "
                    f"held by {h and (h['name'], h['replicaName'])}"
                )
            if pod.metadata.uid in self._released or name not in stable:
                continue
            desired, mode = desired_and_gang(stable[name])
            if mode == "AllSlices" and len(holding[name]) < desired:
                instant.append(
                    f"pod {pod.metadata.name} of gang {name} released while the gang holds "
                    f"{len(holding[name])} of {desired} pools"
                )
        for pool, who in pinned.items():
            if len({w[1] for w in who}) > 1:
                persistent.add(f"pool {pool} has live pods of slices {sorted(who)}")
        self._released = released_now

        for name, obj in stable.items():
            desired, mode = desired_and_gang(obj)
            partial = 0 < len(holding[name]) < desired and not released_by[name]
            if mode == "AllSlices" and partial:
                since = self._partial_since.setdefault(name, now)
                self.longest_partial[name] = max(self.longest_partial[name], now - since)
            else:
                self._partial_since.pop(name, None)
        return instant, persistent

    def check(self, *, max_partial_s: float | None = 10.0, min_samples: int = 20) -> None:
        """``Watch.check``, and no gang held a partial set longer than ``max_partial_s``."""
        super().check(min_samples=min_samples)
        if max_partial_s is not None:
            longest = {n: round(s, 2) for n, s in self.longest_partial.items() if s > max_partial_s}
            assert longest == {}, f"gangs holding a partial set longer than {max_partial_s}s"
