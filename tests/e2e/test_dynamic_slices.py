"""TPU7x dynamic slicing end to end, against the simulated GKE slice controller
(tpusim.slicectl, run in this process): a TPUSliceCluster with spec.reservation.policy
DynamicSlice gets its slices formed as GKE Slices from free partitions, reserved whole
and pinned, and gives them back.

Five sub-block pools (one 4x4x4 partition each): two in block A, two in block B, and
one in block A inside a Slice another owner formed. Under a watch sampled throughout:
no pod released unless pinned to a Slice of its own slice whose every partition its
slice holds, no pod of a gang released before every Slice of the gang was ACTIVE, no
partition of the other owner's Slice ever held, and that Slice never touched; in the
queue scenario, no partition held by the lower-priority object while the higher one
exists."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import (
    REPLICA,
    Watch,
    apply,
    asks_for_tpu,
    delete_tsc,
    get_tsc,
    kubectl,
    released,
    reservations,
    tsc,
    wait_condition,
)
from tpusim import kube
from tpusim.nodepools import TPUPool
from tpusim.operator_process import OperatorProcess
from tpusim.slicectl import SliceController, SliceControllerSettings
from tpusim.slices import GROUP, PLURAL, VERSION, Timings

TIMEOUT_S = 240  # KubeRay, the scheduler and the operator share 2 cores with the test
SLICE_LABEL = "cloud.google.com/gke-tpu-slice"
OWNER_NAME = "tpuslice.dev/owner-name"
OWNER_REPLICA = "tpuslice.dev/slice"
FOREIGN = "team-b"
POOLS = {"ds-a1": "blk-a", "ds-a2": "blk-a", "ds-b1": "blk-b", "ds-b2": "blk-b"}
THEIRS = "ds-theirs"


def slices(cluster: E2ECluster) -> dict[str, dict[str, Any]]:
    found: Any = client.CustomObjectsApi(cluster.api).list_cluster_custom_object(
        GROUP, VERSION, PLURAL
    )
    return {s["metadata"]["name"]: s for s in found.get("items", [])}


def ready_reason(s: dict[str, Any]) -> str:
    for cond in (s.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") == "True":
            return str(cond.get("reason"))
    return ""


def ours(cluster: E2ECluster, name: str) -> dict[str, dict[str, Any]]:
    return {
        n: s
        for n, s in slices(cluster).items()
        if (s["metadata"].get("annotations") or {}).get(OWNER_NAME) == name
    }


def held_by(cluster: E2ECluster, namespace: str, name: str) -> list[str]:
    return sorted(
        r["spec"]["nodePool"]
        for r in reservations(cluster)
        if (r["spec"]["holder"]["namespace"], r["spec"]["holder"]["name"]) == (namespace, name)
    )


@dataclass
class DynamicSliceWatch(Watch):
    """The invariants of dynamic slices (the module's docstring); partition id = pool."""

    gangs: dict[str, int] = field(default_factory=dict)  # object name -> its slices
    #: object name -> the object ahead of it in the partition queue: it may hold no
    #: partition while that one exists (not being deleted)
    behind: dict[str, str] = field(default_factory=dict)
    _seen_gated: set[str] = field(default_factory=set)
    _checked: set[str] = field(default_factory=set)

    def sample(self) -> tuple[list[str], set[str]]:
        held = {
            r["spec"]["nodePool"]: r["spec"]["holder"]["replicaName"]
            for r in reservations(self.cluster)
        }
        gke = slices(self.cluster)
        instant: list[str] = []
        findings: set[str] = set()
        if THEIRS in held:
            instant.append(f"partition {THEIRS} of the other owner's Slice held by {held[THEIRS]}")
        if FOREIGN not in gke or gke[FOREIGN]["metadata"].get("deletionTimestamp"):
            instant.append(f"the other owner's Slice {FOREIGN} was deleted")
        for name, ahead in self.behind.items():
            mine = held_by(self.cluster, self.namespace, name)
            if mine and _exists(self.cluster, self.namespace, ahead):
                instant.append(f"{name} holds {', '.join(mine)} while {ahead} is ahead of it")
        # the client's models type every field optional; these pods are read whole
        pods: list[Any] = (
            client.CoreV1Api(self.cluster.api)
            .list_namespaced_pod(self.namespace, label_selector="tpuslice.dev/cluster")
            .items
        )
        for pod in pods:
            if pod.metadata.deletion_timestamp or not asks_for_tpu(pod):
                continue
            replica = (pod.metadata.labels or {}).get(REPLICA, pod.metadata.name)
            if not released(pod):
                self._seen_gated.add(pod.metadata.uid)
                continue
            pin = (pod.spec.node_selector or {}).get(SLICE_LABEL)
            if pin is None:
                if pod.metadata.uid in self._seen_gated:
                    findings.add(f"pod {pod.metadata.name} released without a Slice pin")
                continue
            s = gke.get(pin)
            notes = (s or {}).get("metadata", {}).get("annotations") or {}
            if s is None or notes.get(OWNER_REPLICA) != replica:
                findings.add(f"pod {pod.metadata.name} of {replica} pinned to Slice {pin}")
                continue
            for pid in s["spec"]["partitionIds"]:
                if held.get(pid) != replica:
                    findings.add(f"Slice {pin} of {replica} on {pid} held by {held.get(pid)}")
            owner = notes.get(OWNER_NAME, "")
            if pod.metadata.uid not in self._checked and owner in self.gangs:
                self._checked.add(pod.metadata.uid)
                active = [x for x in ours(self.cluster, owner).values() if ready_reason(x)]
                if len(active) < self.gangs[owner]:
                    instant.append(
                        f"pod {pod.metadata.name} of gang {owner} released with "
                        f"{len(active)} of {self.gangs[owner]} Slices ACTIVE"
                    )
        return instant, findings


def _exists(cluster: E2ECluster, namespace: str, name: str) -> bool:
    """Whether the TSC exists and is not being deleted."""
    try:
        return not get_tsc(cluster, namespace, name)["metadata"].get("deletionTimestamp")
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise


@pytest.fixture
def slice_controller(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> Iterator[SliceController]:
    pools = [
        TPUPool(
            name,
            "tpu7x",
            "4x4x4",
            nodes=16,
            dynamic_slicing=True,
            partition_id=name,
            topology_block=block,
        )
        for name, block in [*POOLS.items(), (THEIRS, "blk-a")]
    ]
    for pool in pools:
        kube.wait_nodes_ready(cluster.api, kube.create_pool(cluster.api, pool))
    settings = SliceControllerSettings(timings=Timings(activation_s=1), interval_s=0.5)
    with SliceController(cluster.api, settings) as ctl:
        client.CustomObjectsApi(cluster.api).create_cluster_custom_object(
            GROUP,
            VERSION,
            PLURAL,
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Slice",
                "metadata": {"name": FOREIGN},
                "spec": {"type": "tpu7x", "topology": "4x4x4", "partitionIds": [THEIRS]},
            },
        )
        kube.wait_for(
            lambda: ready_reason(slices(cluster).get(FOREIGN, {})) == "ACTIVE",
            timeout_s=60,
            what=f"the other owner's Slice {FOREIGN} ACTIVE",
        )
        yield ctl
        kubectl(
            cluster, "delete", "tsc", "--all", "-n", namespace, "--wait=true", "--timeout=120s",
            check=False,
        )  # fmt: skip
        kubectl(cluster, "delete", "slice", FOREIGN, "--wait=true", "--timeout=60s", check=False)
    for pool in pools:
        kube.delete_pool(cluster.api, pool.name)


def dynamic(name: str, topology: str, slices_: int = 1, **reservation: Any) -> dict[str, Any]:
    return tsc(
        name,
        type_="tpu7x",
        topology=topology,
        slices=slices_,
        reservation={"policy": "DynamicSlice", **reservation},
    )


def gone(cluster: E2ECluster, namespace: str, name: str) -> bool:
    return not ours(cluster, name) and not held_by(cluster, namespace, name)


def test_dynamic_slices_form_pin_retry_and_leave_nothing(
    cluster: E2ECluster, namespace: str, slice_controller: SliceController
) -> None:
    with DynamicSliceWatch(cluster, namespace, gangs={"pair": 2}) as watch:
        # a 2-slice gang of 4x4x4: one partition each, both in one block (A, whose other
        # partition is in someone else's Slice, has two free; so has B: A by name)
        apply(cluster, namespace, dynamic("pair", "4x4x4", 2, gang="AllSlices"))
        wait_condition(cluster, namespace, "pair", "Ready", "True", timeout_s=TIMEOUT_S)
        assert held_by(cluster, namespace, "pair") == ["ds-a1", "ds-a2"]
        formed = ours(cluster, "pair")
        assert len(formed) == 2 and all(ready_reason(s) == "ACTIVE" for s in formed.values())
        delete_tsc(cluster, namespace, "pair")
        kube.wait_for(
            lambda: gone(cluster, namespace, "pair"),
            timeout_s=TIMEOUT_S,
            what="the gang's Slices and reservations gone",
        )

        # a 4x4x8 slice from two free partitions of one block
        apply(cluster, namespace, dynamic("big", "4x4x8"))
        wait_condition(cluster, namespace, "big", "Ready", "True", timeout_s=TIMEOUT_S)
        (first,) = ours(cluster, "big")
        first_ids = sorted(slices(cluster)[first]["spec"]["partitionIds"])
        assert first_ids in (["ds-a1", "ds-a2"], ["ds-b1", "ds-b2"]), first_ids
        others = sorted(set(POOLS) - set(first_ids))

        # its Slice fails: formed again on the other block, the failed one deleted
        slice_controller.fail(first)

        def replaced() -> str | None:
            mine = ours(cluster, "big")
            if first in mine or len(mine) != 1:
                return None
            (name,) = mine
            if sorted(mine[name]["spec"]["partitionIds"]) != others:
                return None
            return name if held_by(cluster, namespace, "big") == others else None

        second = kube.wait_for(
            replaced,
            timeout_s=TIMEOUT_S,
            what="the failed Slice replaced on the other block's partitions",
            describe=lambda: (get_tsc(cluster, namespace, "big").get("status"), slices(cluster)),
        )
        wait_condition(cluster, namespace, "big", "Ready", "True", timeout_s=TIMEOUT_S)
        assert ready_reason(slices(cluster)[second]) == "ACTIVE"

        # a partition of the running slice goes UNHEALTHY (GKE's partition state label):
        # the slice is drained whole and counted as a disruption, formed again on the
        # first block's partitions (free again), and the unhealthy one is not claimed
        # while it stays so
        sick = others[0]
        before = (get_tsc(cluster, namespace, "big").get("status") or {}).get("disruptions") or {}
        counted = int(before.get("total", 0)) + 1  # the forced failure above drained it too
        slice_controller.set_partition_state(sick, "UNHEALTHY")

        def moved_off() -> dict[str, Any] | None:
            mine = ours(cluster, "big")
            status = get_tsc(cluster, namespace, "big").get("status") or {}
            if len(mine) != 1 or second in mine:
                return None
            (name,) = mine
            if sorted(mine[name]["spec"]["partitionIds"]) != first_ids:
                return None
            if held_by(cluster, namespace, "big") != first_ids:
                return None
            return status if (status.get("disruptions") or {}).get("total") == counted else None

        status = kube.wait_for(
            moved_off,
            timeout_s=TIMEOUT_S,
            what="the slice on an UNHEALTHY partition drained, counted and formed elsewhere",
            describe=lambda: (get_tsc(cluster, namespace, "big").get("status"), slices(cluster)),
        )
        # slice 0's entries (the drained replica's while its pods go, and the new one's)
        # carry its count; the last disruption names a node of the unhealthy partition
        entries = [e for e in status["slices"] if e.get("index") == 0]
        assert max(e.get("disruptions", 0) for e in entries) == counted, entries
        assert any(
            (e.get("lastDisruption") or {}).get("node", "").startswith(f"gke-tpusim-{sick}-")
            for e in entries
        ), entries
        wait_condition(cluster, namespace, "big", "Ready", "True", timeout_s=TIMEOUT_S)
        assert sick not in held_by(cluster, namespace, "big")
        slice_controller.set_partition_state(sick, "HEALTHY")

        # deleting leaves no Slice and no reservation of ours
        delete_tsc(cluster, namespace, "big")
        kube.wait_for(
            lambda: gone(cluster, namespace, "big"),
            timeout_s=TIMEOUT_S,
            what="big's Slices and reservations gone",
        )
        assert set(slices(cluster)) == {FOREIGN}
    watch.check()


def slice_message(cluster: E2ECluster, namespace: str, name: str) -> str:
    entries = (get_tsc(cluster, namespace, name).get("status") or {}).get("slices") or []
    return " | ".join(str(e.get("message", "")) for e in entries)


def test_dynamic_slices_wait_in_the_partition_queue_by_priority(
    cluster: E2ECluster, namespace: str, slice_controller: SliceController
) -> None:
    """Two 4x4x8 objects competing for the two partitions of block A (block B has one
    UNHEALTHY partition, so only A can ever hold a 4x4x8): the one created second with
    the higher priority forms first; the other waits holding nothing with its place in
    the queue, and forms once the first is deleted."""
    with DynamicSliceWatch(cluster, namespace, behind={"low": "high"}) as watch:
        # nothing can form until a partition of A is healthy again: both queue up
        slice_controller.set_partition_state("ds-a1", "UNHEALTHY")
        slice_controller.set_partition_state("ds-b1", "UNHEALTHY")
        apply(cluster, namespace, dynamic("low", "4x4x8"))
        kube.wait_for(
            lambda: (
                "needs 2 free partitions of one topology block"
                in slice_message(cluster, namespace, "low")
            ),
            timeout_s=TIMEOUT_S,
            what="low waiting for two partitions of one block",
            describe=lambda: get_tsc(cluster, namespace, "low").get("status"),
        )
        apply(cluster, namespace, dynamic("high", "4x4x8", priority=100))
        kube.wait_for(
            lambda: (
                slice_message(cluster, namespace, "low").startswith("2nd of 2 waiting")
                and slice_message(cluster, namespace, "high").startswith("1st of 2 waiting")
            ),
            timeout_s=TIMEOUT_S,
            what="high ahead of low in the partition queue",
            describe=lambda: (
                slice_message(cluster, namespace, "low"),
                slice_message(cluster, namespace, "high"),
            ),
        )
        assert held_by(cluster, namespace, "low") == held_by(cluster, namespace, "high") == []

        # block A whole again: the higher priority object takes it, the other keeps waiting
        slice_controller.set_partition_state("ds-a1", "HEALTHY")
        wait_condition(cluster, namespace, "high", "Ready", "True", timeout_s=TIMEOUT_S)
        assert held_by(cluster, namespace, "high") == ["ds-a1", "ds-a2"]
        kube.wait_for(
            lambda: "held by " in slice_message(cluster, namespace, "low"),
            timeout_s=TIMEOUT_S,
            what="low waiting, naming who holds the partitions",
            describe=lambda: slice_message(cluster, namespace, "low"),
        )
        message = slice_message(cluster, namespace, "low")
        assert message.startswith("1st of 1 waiting for tpu7x 4x4x4"), message
        assert f"{namespace}/high" in message, message
        assert held_by(cluster, namespace, "low") == []

        # the first deleted: the waiting one forms on the partitions it gave back
        delete_tsc(cluster, namespace, "high")
        wait_condition(cluster, namespace, "low", "Ready", "True", timeout_s=TIMEOUT_S)
        assert held_by(cluster, namespace, "low") == ["ds-a1", "ds-a2"]
        delete_tsc(cluster, namespace, "low")
        kube.wait_for(
            lambda: gone(cluster, namespace, "low"),
            timeout_s=TIMEOUT_S,
            what="low's Slice and reservations gone",
        )
        slice_controller.set_partition_state("ds-b1", "HEALTHY")
    watch.check()
