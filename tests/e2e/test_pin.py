"""Pin at admission (``--pin-at-admission``) on the local cluster.

A 2-slice gang (v6e 2x4, two hosts a slice) runs with the operator and the webhook
started with the setting. The leader holds and marks a unit for each replica index
before KubeRay makes any pod (a placeholder holder, ``~index-<n>``), so every pod,
the first ones included, and every replica KubeRay recreates is pinned by the
identity webhook at admission (created without the gate, annotated
``tpuslice.dev/pinned-at-admission``, never patched), onto the pool its index
holds, also while the operator is SIGKILLed and after the webhook process is
restarted. Deleting the object un-marks and frees the pools after the fence.

Throughout, ``InvariantWatch`` (by slice index) and ``PinWatch`` sample: no released
pod on a unit its slice (object, index) does not hold, no two slices on one unit, no
pod pinned at admission ever seen gated, and no pod of the gang bound to a node while
the gang holds fewer units than it has slices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import (
    REPO,
    InvariantWatch,
    Watch,
    apply,
    delete_tsc,
    describe,
    get_tsc,
    held_by,
    reservations,
    slice_pods,
)
from tests.e2e.test_gangs import READY_S, GangPools, gang, gang_pools, wait_ready
from tpusim import kube
from tpusim.operator_process import OperatorProcess

__all__ = ["gang_pools"]  # the fixture, used by name

PINNED = "tpuslice.dev/pinned-at-admission"
GATE = "tpuslice.dev/slice-reservation"
INDEX = "ray.io/worker-group-replica-index"
REPLICA = "ray.io/worker-group-replica-name"


@dataclass
class PinWatch(Watch):
    """Pods pinned at admission were never gated, and no pod of ``name`` is bound while
    its reservations cover fewer than ``slices`` slices (reservations read after pods)."""

    name: str = ""
    slices: int = 2
    persist: int = 3
    pinned_seen: set[str] = field(default_factory=set)
    _gated: set[str] = field(default_factory=set)

    def sample(self) -> tuple[list[str], set[str]]:
        pods = slice_pods(self.cluster, self.namespace, self.name)
        held = [
            r
            for r in reservations(self.cluster)
            if (r["spec"]["holder"]["namespace"], r["spec"]["holder"]["name"])
            == (self.namespace, self.name)
        ]
        instant: list[str] = []
        persistent: set[str] = set()
        for pod in pods:
            uid = pod.metadata.uid
            gated = any(g.name == GATE for g in pod.spec.scheduling_gates or [])
            if gated:
                self._gated.add(uid)
            annotations = pod.metadata.annotations or {}
            if PINNED in annotations:
                self.pinned_seen.add(uid)
                if uid in self._gated:
                    instant.append(f"pod {pod.metadata.name} pinned at admission was gated")
            if pod.metadata.deletion_timestamp or not pod.spec.node_name:
                continue
            if len(held) < self.slices:
                persistent.add(
                    f"pod {pod.metadata.name} bound while the gang holds {len(held)} units"
                )
        return instant, persistent

    def gated_seen(self) -> set[str]:
        """The pods of the object ever seen carrying the gate."""
        return set(self._gated)


def pinned_replica(
    cluster: E2ECluster, namespace: str, name: str, index: str, not_named: str
) -> list[Any] | None:
    """The live pods of the replica of ``index`` other than ``not_named``, when both exist
    and were pinned at admission; else None."""
    pods = [
        p
        for p in slice_pods(cluster, namespace, name)
        if not p.metadata.deletion_timestamp
        and (p.metadata.labels or {}).get(INDEX) == index
        and (p.metadata.labels or {}).get(REPLICA) != not_named
    ]
    if len(pods) == 2 and all(PINNED in (p.metadata.annotations or {}) for p in pods):
        return pods
    return None


def marked(cluster: E2ECluster, namespace: str, name: str) -> dict[str, str]:
    """replica index -> pool of the object's reservations marked for pinning."""
    return {
        str(r["spec"]["holder"].get("replicaIndex")): r["spec"]["nodePool"]
        for r in reservations(cluster)
        if (r["spec"]["holder"]["namespace"], r["spec"]["holder"]["name"]) == (namespace, name)
        and (r["metadata"].get("annotations") or {}).get("tpuslice.dev/pin") == "true"
    }


def two_marked(cluster: E2ECluster, namespace: str, name: str) -> dict[str, str] | None:
    found = marked(cluster, namespace, name)
    return found if len(found) == 2 else None


def test_pin_at_admission_under_operator_kill_and_webhook_restart(
    cluster: E2ECluster, namespace: str, gang_pools: GangPools, operator: OperatorProcess
) -> None:
    for name in ("pin-1", "pin-2"):
        gang_pools.add(name)
    logs = (cluster.run_dir or REPO / ".e2e-runs" / "existing") / "logs"
    operator.stop()
    pinned = OperatorProcess(
        cluster.kubeconfig,
        logs / "pin-operator.log",
        extra_args=("--resync-seconds=10", "--pin-at-admission"),
        webhook_args=("--pin-at-admission", "--log-level=DEBUG"),
        cwd=REPO,
    )
    pinned.start()
    name = "pinned"
    try:
        with (
            InvariantWatch(cluster, namespace, by_index=True) as watch,
            PinWatch(cluster, namespace, name=name) as pins,
        ):
            apply(cluster, namespace, gang(name))
            wait_ready(cluster, namespace, name, 2)
            marks = kube.wait_for(
                lambda: two_marked(cluster, namespace, name),
                timeout_s=60,
                what="both reservations marked",
                describe=lambda: reservations(cluster),
            )

            def recreate(index: str) -> str:
                """Delete a pod of slice ``index``; KubeRay makes the next replica of
                the index, which the webhook pins to the same pool at admission."""
                held = {v: k for k, v in held_by(cluster, namespace, name).items()}
                old = held[marks[index]]
                victim = next(
                    p
                    for p in slice_pods(cluster, namespace, name)
                    if (p.metadata.labels or {}).get(REPLICA) == old
                )
                cluster.core.delete_namespaced_pod(victim.metadata.name, namespace)
                pods = kube.wait_for(
                    lambda: pinned_replica(cluster, namespace, name, index, old),
                    timeout_s=READY_S,
                    what=f"slice {index}'s next replica pinned at admission",
                    describe=lambda: describe(cluster, namespace, name),
                )
                for pod in pods:
                    assert pod.spec.node_selector["cloud.google.com/gke-nodepool"] == marks[index]
                    assert (pod.metadata.annotations or {})[PINNED] == marks[index]
                return str(pods[0].metadata.labels[REPLICA])

            def rekeyed(index: str, replica: str) -> None:
                """The pass gave the index's pool to its new replica, which is Ready."""

                def done() -> bool:
                    slices = (get_tsc(cluster, namespace, name).get("status") or {}).get(
                        "slices"
                    ) or []
                    mine = [s for s in slices if str(s.get("index")) == index]
                    return held_by(cluster, namespace, name).get(replica) == marks[index] and any(
                        s.get("replica") == replica and s.get("state") == "Ready" for s in mine
                    )

                kube.wait_for(
                    done,
                    timeout_s=READY_S,
                    what=f"slice {index}'s pool held by its new replica {replica}, Ready",
                    describe=lambda: describe(cluster, namespace, name),
                )

            rekeyed("1", recreate("1"))
            wait_ready(cluster, namespace, name, 2)

            pinned.kill_operator()  # the webhook alone pins the next replica
            replica = recreate("0")
            pinned.start_operator()
            rekeyed("0", replica)
            wait_ready(cluster, namespace, name, 2)

            pinned.restart_webhook()
            rekeyed("1", recreate("1"))
            wait_ready(cluster, namespace, name, 2)
            assert marked(cluster, namespace, name) == marks  # same pools, same indexes
            held = held_by(cluster, namespace, name)
            assert sorted(held.values()) == sorted(marks.values())

            delete_tsc(cluster, namespace, name)
            assert not held_by(cluster, namespace, name)
        watch.check()
        pins.check()
        # the first two replicas' pods and three recreated replicas', two pods each: the
        # units are held by index before KubeRay makes the first pods
        assert len(pins.pinned_seen) == 10, pins.pinned_seen
    finally:
        pinned.stop()
        operator.start()


def pinned_operator(cluster: E2ECluster, log_name: str) -> OperatorProcess:
    logs = (cluster.run_dir or REPO / ".e2e-runs" / "existing") / "logs"
    return OperatorProcess(
        cluster.kubeconfig,
        logs / log_name,
        extra_args=("--resync-seconds=10", "--pin-at-admission"),
        webhook_args=("--pin-at-admission",),
        cwd=REPO,
    )


def every_pod_pinned(
    cluster: E2ECluster, namespace: str, name: str, pins: PinWatch, pods: int
) -> None:
    """Every pod of ``name`` was admitted pinned (the annotation, onto a unit the object
    holds) and none was ever seen gated."""
    live = [p for p in slice_pods(cluster, namespace, name) if not p.metadata.deletion_timestamp]
    assert len(live) == pods, [p.metadata.name for p in live]
    held = set(held_by(cluster, namespace, name).values())
    for pod in live:
        pool = (pod.metadata.annotations or {}).get(PINNED)
        assert pool in held, (pod.metadata.name, pool, held)
        assert pod.spec.node_selector["cloud.google.com/gke-nodepool"] == pool
    assert not pins.gated_seen(), pins.gated_seen()


def test_first_pods_of_new_clusters_are_pinned_and_scale_down_frees_a_unit(
    cluster: E2ECluster, namespace: str, gang_pools: GangPools, operator: OperatorProcess
) -> None:
    """A new 2-slice gang and a new 2-slice PerSlice TSC become Ready with every pod
    pinned at admission; the operator is SIGKILLed as the second one's first unit is
    claimed (before its pods exist) and converges the same; scaling the PerSlice TSC
    down to one slice frees one unit through the fence."""
    for name in ("first-1", "first-2", "first-3", "first-4"):
        gang_pools.add(name)
    operator.stop()
    pinned = pinned_operator(cluster, "pin-first-operator.log")
    pinned.start()
    try:
        with (
            InvariantWatch(cluster, namespace, by_index=True) as watch,
            PinWatch(cluster, namespace, name="first-gang") as gang_pins,
            PinWatch(cluster, namespace, name="first-each", slices=1) as each_pins,
        ):
            apply(cluster, namespace, gang("first-gang", gang="AllSlices"))
            wait_ready(cluster, namespace, "first-gang", 2)
            every_pod_pinned(cluster, namespace, "first-gang", gang_pins, 4)
            # Ready: every placeholder was taken over by its index's replica
            assert not [r for r in held_by(cluster, namespace, "first-gang") if r.startswith("~")]

            apply(cluster, namespace, gang("first-each", gang="PerSlice"))
            kube.wait_for(
                lambda: held_by(cluster, namespace, "first-each") or None,
                timeout_s=60,
                interval_s=0.02,
                what="first-each's first unit claimed",
            )
            pinned.kill_operator()
            pods_at_kill = len(slice_pods(cluster, namespace, "first-each"))
            pinned.start_operator()
            wait_ready(cluster, namespace, "first-each", 2)
            every_pod_pinned(cluster, namespace, "first-each", each_pins, 4)
            print(f"first-each: {pods_at_kill} pods existed when the operator was killed")

            body = gang("first-each", gang="PerSlice", slices=1)
            apply(cluster, namespace, body)
            kube.wait_for(
                lambda: len(held_by(cluster, namespace, "first-each")) == 1 or None,
                timeout_s=READY_S,
                what="first-each scaled down to one unit",
                describe=lambda: describe(cluster, namespace, "first-each"),
            )
            wait_ready(cluster, namespace, "first-each", 1)
            delete_tsc(cluster, namespace, "first-gang")
            delete_tsc(cluster, namespace, "first-each")
            assert not held_by(cluster, namespace, "first-gang")
            assert not held_by(cluster, namespace, "first-each")
        watch.check()
        gang_pins.check()
        each_pins.check()
        log = pinned.log_path.read_text(errors="replace")
        assert "~index-" in log  # this worktree's operator claimed by index
    finally:
        pinned.stop()
        operator.start()
