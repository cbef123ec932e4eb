"""A termination taint on the real TPU node: the slice drains whole with Ray draining for real.

A TPUSliceCluster of one v6e 2x2 slice on the real node (a one-node single-host
pool, tests/realnode/tpu_support.py) with ``spec.disruption.gracePeriodSeconds``.
A driver in the Ray head keeps a task busy on the TPU worker and watches the GCS.
Then GKE's ``cloud.google.com/impending-node-termination:NoSchedule`` taint lands on
the node (``kube.disrupt(..., "terminate")``, as ``python -m tpusim terminate``):

- the operator deletes the slice's pod with the grace period;
- the kubelet sends SIGTERM, and Ray's ``ray start --block`` marks its node draining
  in the GCS with a deadline of ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S`` (rendered
  from the grace period) before it exits (``ray/_private/node.py``,
  ``_drain_node_before_shutdown``, Ray 2.60), which the head's driver sees;
- status counts a disruption with its reason and the node it came from;
- the node is quarantined (the only unit of that shape: the slice waits, saying why)
  until the taint goes, then the slice comes back on it.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.operator_support import apply, event_reasons, kubectl, wait_condition
from tests.realnode.conftest import REPO, NodeCluster
from tests.realnode.tpu_support import (
    GROUP,
    VERSION,
    chart_operator,
    real_tpu_node,
    slice_body,
)
from tpusim import ToolPaths, kube

GRACE_S = 20
DRAIN_TIMEOUT_S = 15  # what the operator renders for a 20 s grace (planning/disruption.py)
WATCH_LIMIT_S = 240

#: A driver in the head: a busy task on the TPU worker (so the drain lasts until its
#: deadline), then the GCS polled for the worker draining and dying.
WATCH_SCRIPT = """
import json, time
import ray
from ray._private.state import state as gcs
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init(address="auto", logging_level="ERROR")
head = ray.get_runtime_context().get_node_id()
deadline = time.time() + 120
while True:
    workers = [n for n in ray.nodes() if n["Alive"] and n["NodeID"] != head]
    if workers or time.time() > deadline:
        break
    time.sleep(0.5)
(worker,) = workers
wid = worker["NodeID"]

@ray.remote(num_cpus=0)
def busy():
    time.sleep(3600)

ref = busy.options(scheduling_strategy=NodeAffinitySchedulingStrategy(wid, soft=False)).remote()
time.sleep(2)
print("READY " + wid, flush=True)
out = {"node_id": wid, "draining": None, "died": None}
end = time.time() + %(limit)d
while time.time() < end:
    now_ms = int(time.time() * 1000)
    drains = gcs.get_draining_nodes()
    if out["draining"] is None and wid in drains:
        out["draining"] = {"seen_ms": now_ms, "deadline_ms": drains[wid]}
    node = next(n for n in ray.nodes() if n["NodeID"] == wid)
    if not node["Alive"]:
        out["died"] = {
            "seen_ms": now_ms,
            "reason": str(node.get("DeathReason")),
            "message": node.get("DeathReasonMessage"),
        }
        break
    time.sleep(0.2)
print("DRAIN " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def operator_ns(
    node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    with (
        real_tpu_node(node_cluster),
        chart_operator(
            node_cluster, "tpuslice-disruption", tmp_path_factory.mktemp("values")
        ) as namespace,
    ):
        yield namespace


def _status(cluster: NodeCluster, namespace: str, name: str) -> dict[str, Any]:
    obj = cluster.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "tpusliceclusters", name
    )
    return dict(obj.get("status") or {})


def _worker_pods(cluster: NodeCluster, namespace: str, name: str) -> list[Any]:
    pods: list[Any] = cluster.core.list_namespaced_pod(
        namespace, label_selector=f"tpuslice.dev/cluster={name},ray.io/node-type=worker"
    ).items
    return pods


class HeadWatcher:
    """``WATCH_SCRIPT`` by ``kubectl exec`` in the head, read line by line in a thread."""

    def __init__(self, cluster: NodeCluster, namespace: str, head_pod: str) -> None:
        script = WATCH_SCRIPT % {"limit": WATCH_LIMIT_S}
        self.proc = subprocess.Popen(
            [
                str(ToolPaths.for_repo(REPO).binary("kubectl")),
                f"--kubeconfig={cluster.kubeconfig}",
                "exec",
                "-n",
                namespace,
                head_pod,
                "-c",
                "ray-head",
                "--",
                "python",
                "-c",
                script,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("READY "):
                self.ready.set()

    def result(self, timeout_s: float) -> dict[str, Any]:
        try:
            self.proc.wait(timeout=timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self.thread.join(timeout=5)
        found = [x for x in self.lines if x.startswith("DRAIN ")]
        assert found, "\n".join(self.lines[-40:])
        result: dict[str, Any] = json.loads(found[-1].removeprefix("DRAIN "))
        return result


def test_a_termination_taint_drains_the_real_ray_worker_and_the_slice_comes_back(
    node_cluster: NodeCluster, operator_ns: str, workload_ns: str
) -> None:
    cluster = node_cluster
    name = "drain"
    began = time.monotonic()
    body = slice_body(cluster, "TPUSliceCluster", name, disruption={"gracePeriodSeconds": GRACE_S})
    apply(cluster, workload_ns, body)
    wait_condition(cluster, workload_ns, name, "Ready", "True", timeout_s=300)
    ready_s = time.monotonic() - began
    (worker,) = _worker_pods(cluster, workload_ns, name)
    assert worker.spec.node_name == cluster.node_name
    assert worker.spec.termination_grace_period_seconds == GRACE_S
    (container,) = [c for c in worker.spec.containers if c.name == "ray-worker"]
    env = {e.name: e.value for e in container.env or []}
    assert env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == str(DRAIN_TIMEOUT_S)
    (head,) = cluster.core.list_namespaced_pod(
        workload_ns, label_selector=f"ray.io/cluster={name},ray.io/node-type=head"
    ).items

    watcher = HeadWatcher(cluster, workload_ns, head.metadata.name)
    assert watcher.ready.wait(180), "\n".join(watcher.lines[-40:])
    tainted_at = time.time()
    kube.disrupt(cluster.api, cluster.node_name, "terminate")
    try:
        # the slice's pod is deleted, with the grace period the object asks for
        def deleting() -> Any:
            pod = cluster.core.read_namespaced_pod(worker.metadata.name, workload_ns)
            return pod if pod.metadata.deletion_timestamp is not None else None

        deleted = kube.wait_for(deleting, timeout_s=60, what="the worker pod deleted")
        assert deleted.metadata.deletion_grace_period_seconds == GRACE_S
        delete_s = time.time() - tainted_at

        # Ray drains the worker with a deadline before it exits
        ray_view = watcher.result(timeout_s=GRACE_S + 60)
        print(f"\nthe head's view of the drain: {ray_view}")
        drain, died = ray_view["draining"], ray_view["died"]
        assert drain is not None, ray_view
        assert died is not None, ray_view
        assert drain["seen_ms"] <= died["seen_ms"]
        window_ms = drain["deadline_ms"] - drain["seen_ms"]
        assert 0 < window_ms <= DRAIN_TIMEOUT_S * 1000, ray_view
        assert drain["seen_ms"] / 1000 >= tainted_at
        # the busy task keeps the node from finishing early: it goes at its deadline
        assert died["seen_ms"] >= drain["deadline_ms"] - 2000, ray_view
        # GCS's NodeDeathInfo at the deadline: both ends of it race in Ray itself. The
        # raylet leaving a PREEMPTION drain is AUTOSCALER_DRAIN_PREEMPTED (3) with the
        # drain's message; ``ray start``'s own wait ending at the same instant kills
        # the raylet first, EXPECTED_TERMINATION (1) "received SIGTERM"
        # (ray/_private/node.py, _drain_node_before_shutdown then kill_all_processes).
        # Never UNEXPECTED_TERMINATION (2): the kubelet's SIGKILL comes only at the
        # pod's grace, after the drain's deadline.
        expected_deaths = {
            "3": "Node received SIGTERM; draining before shutdown.",
            "1": "received SIGTERM",
        }
        assert died["reason"] in expected_deaths, ray_view
        assert died["message"] == expected_deaths[died["reason"]], ray_view

        # status: one disruption, its reason and node
        def counted() -> dict[str, Any] | None:
            st = _status(cluster, workload_ns, name)
            return st if (st.get("disruptions") or {}).get("total") == 1 else None

        st = kube.wait_for(counted, timeout_s=120, what="the disruption counted")
        assert st["disruptions"]["byReason"] == {"Preemption": 1}, st["disruptions"]
        entry = st["slices"][0]
        assert entry["disruptions"] == 1 and entry["lastDisruption"]["node"] == cluster.node_name
        assert entry["lastDisruption"]["reason"] == "Preemption"
        assert "SliceDisrupted" in event_reasons(cluster, workload_ns)

        # quarantined: the only unit of the shape is not claimed while the taint stays
        def waiting() -> str | None:
            message = str(_status(cluster, workload_ns, name)["slices"][0].get("message", ""))
            return message if "not claimed until it clears" in message else None

        message = kube.wait_for(
            waiting,
            timeout_s=120,
            what="the slice waiting on the quarantined node",
            describe=lambda: _status(cluster, workload_ns, name),
        )
        assert "impending-node-termination" in message, message
        time.sleep(5)  # a pass or more: still nothing runs on the tainted node
        assert not [
            p
            for p in _worker_pods(cluster, workload_ns, name)
            if p.spec.node_name and p.metadata.deletion_timestamp is None
        ]
    finally:
        kube.disrupt(cluster.api, cluster.node_name, "unterminate")
    untainted_at = time.monotonic()

    # the taint is gone: the slice comes back on the node, a new Ray worker joins
    wait_condition(cluster, workload_ns, name, "Ready", "True", timeout_s=300)
    back_s = time.monotonic() - untainted_at
    (again,) = _worker_pods(cluster, workload_ns, name)
    assert again.metadata.uid != worker.metadata.uid and again.spec.node_name == cluster.node_name
    st = _status(cluster, workload_ns, name)
    assert st["disruptions"]["total"] == 1
    print(
        f"ready {ready_s:.1f}s, pod deleted {delete_s:.1f}s after the taint, "
        f"drain window {window_ms / 1000:.1f}s, back {back_s:.1f}s after the taint went, "
        f"total {time.monotonic() - began:.1f}s"
    )
    kubectl(cluster, "delete", "tsc", name, "-n", workload_ns, "--wait=true", "--timeout=120s")
