"""Gangs, the queue per shape and pool preference on the local cluster.

A multislice TPUSliceCluster (``spec.tpu.slices > 1``; ``spec.reservation.gang``
defaults to ``AllSlices`` then) holds a node pool for every slice or none, and no pod
of it is released before every slice holds one. Waiting clusters of one shape
(accelerator + topology) are served in order of ``spec.reservation.priority``, then
creation time; a later request never takes the pools an earlier one waits for; a
request larger than every pool of its shape is ``Stalled`` with ``NotEnoughPools``.
Among eligible pools, ``spec.reservation.capacityTypes`` orders the capacity types.

Every scenario runs over pools of its own, of a shape no other e2e test uses (v6e
2x4 on 4-chip hosts: two nodes a pool), added and removed by the ``gang_pools``
fixture, and most run under ``GangWatch``: a thread that samples pods, reservations
and TPUSliceClusters about every 100 ms and records any moment a gang's pod is
released while the gang holds fewer pools than it has slices, a pool with two
holders, or two slices' pods pinned to one pool.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from tests.e2e.helpers import E2ECluster, holds
from tests.e2e.operator_support import (
    NODEPOOL,
    GangWatch,
    apply,
    condition,
    delete_tsc,
    describe,
    desired_and_gang,
    event_reasons,
    get_tsc,
    held_by,
    kubectl,
    released,
    reservations,
    shape_pools,
    slice_pods,
    tsc,
    tsc_names,
    wait_condition,
)
from tpusim import kube
from tpusim.nodepools import TPUPool
from tpusim.operator_process import OperatorProcess

TOPOLOGY, HOSTS = "2x4", 2  # v6e 2x4 on 4-chip hosts (shape_pools' default)
SHAPE = "v6e 2x4"  # how the queue names the shape in its messages
READY_S = 180  # KubeRay, the scheduler and the operator share 2 cores with the test


# ---------------------------------------------------------------- objects
def gang(name: str, slices: int = 2, **reservation: Any) -> dict[str, Any]:
    """A TPUSliceCluster of v6e 2x4 slices (2 hosts of 4 chips each)."""
    body = tsc(name, type_="v6e", topology=TOPOLOGY, slices=slices)
    body["spec"]["tpu"]["chipsPerHost"] = 4
    if reservation:
        body["spec"]["reservation"] = reservation
    return body


def apply_together(cluster: E2ECluster, namespace: str, *bodies: dict[str, Any]) -> None:
    """One `kubectl apply` of several objects: created within milliseconds of each other."""
    kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(bodies))


@dataclass
class GangPools:
    """Node pools of the test's own shape; every one is gone after the test."""

    cluster: E2ECluster
    namespace: str
    added: list[str] = field(default_factory=list)

    def add(self, name: str, **kwargs: Any) -> TPUPool:
        pool = TPUPool(name, "v6e", TOPOLOGY, nodes=HOSTS, **kwargs)
        self.added.append(name)
        kube.wait_nodes_ready(self.cluster.api, kube.create_pool(self.cluster.api, pool))
        return pool

    def remove(self, name: str) -> None:
        kube.delete_pool(self.cluster.api, name)
        self.added.remove(name)


@pytest.fixture
def gang_pools(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess
) -> Iterator[GangPools]:
    """No pool of the shape exists when the test starts; at the end the test's clusters
    are deleted first (the operator frees their pools, the pods go), then its pools."""
    for leftover in shape_pools(cluster):
        kube.delete_pool(cluster.api, leftover)
    pools = GangPools(cluster, namespace)
    yield pools
    if operator.proc is None or operator.proc.poll() is not None:
        operator.start()  # a test that killed it and failed before restarting it
    delete_all = ("delete", "tsc", "--all", "-n", namespace, "--wait=true", "--timeout=120s")
    kubectl(cluster, *delete_all, check=False)
    kube.wait_for(
        lambda: not cluster.core.list_namespaced_pod(namespace).items,
        timeout_s=120,
        what=f"pods of {namespace} gone",
    )
    for name in {*pools.added, *shape_pools(cluster)}:
        kube.delete_pool(cluster.api, name)


# ---------------------------------------------------------------- reading state
def ready_with(cluster: E2ECluster, namespace: str, name: str, slices: int) -> bool:
    obj = get_tsc(cluster, namespace, name)
    ready = condition(obj, "Ready")
    return bool(
        ready.get("status") == "True"
        and ready.get("observedGeneration") == obj["metadata"]["generation"]
        and (obj.get("status") or {}).get("readySlices") == slices
        and len(held_by(cluster, namespace, name)) == slices
    )


def wait_ready(cluster: E2ECluster, namespace: str, name: str, slices: int) -> dict[str, Any]:
    kube.wait_for(
        lambda: ready_with(cluster, namespace, name, slices),
        timeout_s=READY_S,
        what=f"{namespace}/{name} Ready with {slices} slices, each holding a pool",
        describe=lambda: describe(cluster, namespace, name),
    )
    return get_tsc(cluster, namespace, name)


def waiting_with(
    cluster: E2ECluster, namespace: str, name: str, *fragments: str
) -> dict[str, Any] | None:
    """The TSC if it is WaitingForCapacity holding no pool, every slice of it waiting,
    its pods all gated, and every slice message and the Ready message saying
    ``fragments``; else None."""
    obj = get_tsc(cluster, namespace, name)
    ready = condition(obj, "Ready")
    slices = (obj.get("status") or {}).get("slices") or []
    desired, _ = desired_and_gang(obj)
    ok = (
        ready.get("status") == "False"
        and ready.get("reason") == "WaitingForCapacity"
        and ready.get("observedGeneration") == obj["metadata"]["generation"]
        and len(slices) == desired
        and all(s["state"] == "WaitingForCapacity" and not s.get("nodePool") for s in slices)
        and all(f in s.get("message", "") for s in slices for f in fragments)
        and all(f in ready.get("message", "") for f in fragments)
        and not held_by(cluster, namespace, name)
        and not any(released(p) for p in slice_pods(cluster, namespace, name))
    )
    return obj if ok else None


def wait_waiting(
    cluster: E2ECluster, namespace: str, name: str, *fragments: str, timeout_s: float = READY_S
) -> dict[str, Any]:
    return kube.wait_for(
        lambda: waiting_with(cluster, namespace, name, *fragments),
        timeout_s=timeout_s,
        what=f"{namespace}/{name} waiting, holding nothing, saying {fragments}",
        describe=lambda: describe(cluster, namespace, name),
    )


def holds_nothing_for(cluster: E2ECluster, namespace: str, name: str, seconds: float) -> None:
    def nothing() -> bool:
        pods = slice_pods(cluster, namespace, name)
        return not held_by(cluster, namespace, name) and not any(released(p) for p in pods)

    holds(nothing, seconds=seconds, what=f"{namespace}/{name} holding no pool, no pod released")


def held_text(cluster: E2ECluster, namespace: str, name: str) -> str:
    """How a wait message names a holder: ``held by ns/a (pool-1, pool-2)``."""
    pools = sorted(held_by(cluster, namespace, name).values())
    assert pools, f"{namespace}/{name} holds no pool"
    return f"held by {namespace}/{name} ({', '.join(pools)})"


def slice_entries(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list((obj.get("status") or {}).get("slices") or [])


def assert_all_or_nothing(cluster: E2ECluster, namespace: str) -> None:
    """Each TSC holds a pool for every slice or, if it is a gang that is not complete,
    none; every reservation's holder exists (no pool leaked); no pool held twice."""
    existing = tsc_names(cluster, namespace)
    ours = [r for r in reservations(cluster) if r["spec"]["holder"]["namespace"] == namespace]
    leaked = [
        r["spec"]["nodePool"]
        for r in ours
        if r["spec"]["holder"]["name"] not in existing
        or existing[r["spec"]["holder"]["name"]]["metadata"]["uid"] != r["spec"]["holder"]["uid"]
    ]
    assert leaked == [], f"pools held by clusters that no longer exist: {leaked}"
    twice = [p for p, n in Counter(r["spec"]["nodePool"] for r in ours).items() if n > 1]
    assert twice == [], f"pools with two reservations: {twice}"
    for name, obj in existing.items():
        desired, mode = desired_and_gang(obj)
        held = len(held_by(cluster, namespace, name))
        if mode == "AllSlices":
            assert held in (0, desired), (name, held, desired, describe(cluster, namespace, name))


def exactly_one(
    names: tuple[str, ...], is_it: Callable[[str], bool]
) -> Callable[[], tuple[str, str] | None]:
    """A wait_for check: (the one name for which ``is_it``, the other) or None."""

    def check() -> tuple[str, str] | None:
        yes = [n for n in names if is_it(n)]
        if len(yes) != 1:
            return None
        (winner,) = yes
        (other,) = [n for n in names if n != winner]
        return winner, other

    return check


# ---------------------------------------------------------------- scenarios
def test_a_two_gangs_over_two_pools_one_ready_one_holding_nothing_then_in_turn(
    cluster: E2ECluster, namespace: str, gang_pools: GangPools
) -> None:
    """Two 2-slice clusters applied together over exactly two free pools: one gets both
    and is Ready, the other waits holding no reservation at all (not one of the two),
    saying it is first in line, what it needs and who holds the pools; when the first
    is deleted the second gets both pools and is Ready."""
    for i in (1, 2):
        gang_pools.add(f"gang-a-{i}")
    with GangWatch(cluster, namespace) as watch:
        apply_together(cluster, namespace, gang("left"), gang("right"))
        winner, loser = kube.wait_for(
            exactly_one(("left", "right"), lambda n: ready_with(cluster, namespace, n, 2)),
            timeout_s=READY_S,
            what="exactly one of the two gangs Ready with both pools",
            describe=lambda: [describe(cluster, namespace, n) for n in ("left", "right")],
        )
        obj = wait_waiting(
            cluster,
            namespace,
            loser,
            f"1st of 1 waiting for {SHAPE}",
            "needs 2 node pools at once (holds 0)",
            held_text(cluster, namespace, winner),
        )
        assert obj["status"]["readySlices"] == 0 and obj["status"]["sliceReadiness"] == "0/2"
        assert condition(obj, "Stalled")["status"] == "False"
        assert condition(obj, "Reconciling")["status"] == "True"
        holds_nothing_for(cluster, namespace, loser, seconds=5)
        assert set(held_by(cluster, namespace, winner).values()) == {"gang-a-1", "gang-a-2"}
        assert "WaitingForCapacity" in event_reasons(cluster, namespace)
        assert_all_or_nothing(cluster, namespace)

        delete_tsc(cluster, namespace, winner)
        obj = wait_ready(cluster, namespace, loser, 2)
        assert {s["nodePool"] for s in slice_entries(obj)} == {"gang-a-1", "gang-a-2"}
        assert all(s["state"] == "Ready" for s in slice_entries(obj))
    watch.check()
    assert watch.ever_held[loser] == {"gang-a-1", "gang-a-2"}
    assert_all_or_nothing(cluster, namespace)


def test_b_a_waiting_gang_is_not_overtaken_by_later_smaller_clusters(
    cluster: E2ECluster, namespace: str, gang_pools: GangPools
) -> None:
    """Three pools, one held by a running 1-slice cluster. A 3-slice cluster waits (two
    free pools are set aside for it). 1-slice clusters created after it wait too, though
    a pool is free for each: strict order, no backfill. The pool freed when the first
    cluster goes is the 3-slice cluster's, which is then Ready; the small ones get pools
    only when pools are added, in the order they were created."""
    for i in (1, 2, 3):
        gang_pools.add(f"gang-b-{i}")
    with GangWatch(cluster, namespace) as watch:
        apply(cluster, namespace, gang("early", slices=1))
        wait_ready(cluster, namespace, "early", 1)
        apply(cluster, namespace, gang("big", slices=3))
        wait_waiting(
            cluster,
            namespace,
            "big",
            f"1st of 1 waiting for {SHAPE}",
            "needs 3 node pools at once (holds 0)",
            "2 free pools set aside for it",
            held_text(cluster, namespace, "early"),
        )
        # created after the gang; each would fit in a free pool
        apply(cluster, namespace, gang("late-1", slices=1))
        apply(cluster, namespace, gang("late-2", slices=1))
        for position, name in (("2nd", "late-1"), ("3rd", "late-2")):
            wait_waiting(
                cluster,
                namespace,
                name,
                f"{position} of 3 waiting for {SHAPE}",
                "needs 1 more node pool (holds 0)",
                "1 request ahead in the queue",
            )
        wait_waiting(cluster, namespace, "big", f"1st of 3 waiting for {SHAPE}")
        for name in ("big", "late-1", "late-2"):
            holds_nothing_for(cluster, namespace, name, seconds=3)

        delete_tsc(cluster, namespace, "early")  # its pool is freed: the head's, not late-1's
        wait_ready(cluster, namespace, "big", 3)
        for position, name in (("1st", "late-1"), ("2nd", "late-2")):
            wait_waiting(
                cluster,
                namespace,
                name,
                f"{position} of 2 waiting for {SHAPE}",
                held_text(cluster, namespace, "big"),
            )
        assert "late-1" not in watch.ever_held and "late-2" not in watch.ever_held

        gang_pools.add("gang-b-4")
        wait_ready(cluster, namespace, "late-1", 1)
        wait_waiting(cluster, namespace, "late-2", f"1st of 1 waiting for {SHAPE}")
        gang_pools.add("gang-b-5")
        wait_ready(cluster, namespace, "late-2", 1)
        assert set(held_by(cluster, namespace, "late-1").values()) == {"gang-b-4"}
    watch.check()
    assert_all_or_nothing(cluster, namespace)


def test_c_priority_reorders_the_queue(
    cluster: E2ECluster, namespace: str, gang_pools: GangPools
) -> None:
    """Two pools held by a running gang; a priority-0 gang waits first in line; a later
    gang with priority 10 goes ahead of it, and gets the pools when they are freed."""
    for i in (1, 2):
        gang_pools.add(f"gang-c-{i}")
    with GangWatch(cluster, namespace) as watch:
        apply(cluster, namespace, gang("holder"))
        wait_ready(cluster, namespace, "holder", 2)
        apply(cluster, namespace, gang("low"))
        wait_waiting(cluster, namespace, "low", f"1st of 1 waiting for {SHAPE}")
        apply(cluster, namespace, gang("high", priority=10))
        wait_waiting(
            cluster,
            namespace,
            "high",
            f"1st of 2 waiting for {SHAPE}",
            "needs 2 node pools at once (holds 0)",
            held_text(cluster, namespace, "holder"),
        )
        wait_waiting(cluster, namespace, "low", f"2nd of 2 waiting for {SHAPE}")

        delete_tsc(cluster, namespace, "holder")
        wait_ready(cluster, namespace, "high", 2)
        wait_waiting(
            cluster,
            namespace,
            "low",
            f"1st of 1 waiting for {SHAPE}",
            held_text(cluster, namespace, "high"),
        )
        holds_nothing_for(cluster, namespace, "low", seconds=3)
    watch.check()
    assert "low" not in watch.ever_held


def test_d_capacity_type_preference_picks_the_pool_and_status_says_which(
    cluster: E2ECluster, namespace: str, gang_pools: GangPools
) -> None:
    """One free pool of each capacity type, named so that name order alone would pick
    another: each cluster lands on the first type of its ``capacityTypes`` that is free,
    and status.slices[].capacityType says which type it got."""
    gang_pools.add("gang-d-a-spot", spot=True)
    gang_pools.add("gang-d-b-ondemand")
    gang_pools.add("gang-d-c-reserved", reservation="tpu-v6e-reserved")
    gang_pools.add("gang-d-d-flex", flex_start=True)
    cases = [
        ("res", ["Reservation", "OnDemand", "Spot"], "gang-d-c-reserved", "Reservation"),
        ("flex", ["FlexStart", "Spot"], "gang-d-d-flex", "FlexStart"),
        ("od", ["OnDemand"], "gang-d-b-ondemand", "OnDemand"),
        ("any", None, "gang-d-a-spot", "Spot"),  # no preference: the one left
    ]
    for name, types, pool, kind in cases:
        body = gang(name, slices=1, capacityTypes=types) if types else gang(name, slices=1)
        apply(cluster, namespace, body)
        obj = wait_ready(cluster, namespace, name, 1)
        (entry,) = slice_entries(obj)
        assert (entry["nodePool"], entry.get("capacityType")) == (pool, kind), (name, entry)
        assert set(held_by(cluster, namespace, name).values()) == {pool}
        for pod in slice_pods(cluster, namespace, name):
            assert pod.spec.node_selector[NODEPOOL] == pool
    # the order is the user's: the same two free pools, two orders, two pools
    delete_tsc(cluster, namespace, "any")
    delete_tsc(cluster, namespace, "od")
    for name, types, pool in (
        ("od-over-spot", ["OnDemand", "Spot"], "gang-d-b-ondemand"),
        ("spot-over-od", ["Spot", "OnDemand"], "gang-d-a-spot"),
    ):
        apply(cluster, namespace, gang(name, slices=1, capacityTypes=types))
        (entry,) = slice_entries(wait_ready(cluster, namespace, name, 1))
        assert entry["nodePool"] == pool, (name, entry)
        delete_tsc(cluster, namespace, name)


def test_e_more_slices_than_pools_is_stalled_not_enough_pools_until_pools_are_added(
    cluster: E2ECluster, namespace: str, gang_pools: GangPools
) -> None:
    """A 3-slice cluster over a shape with 2 pools can never be satisfied: Stalled
    NotEnoughPools naming both numbers, holding nothing, out of the queue (a 1-slice
    cluster created after it gets a pool). A third pool makes it wait in line; when the
    small cluster goes it is Ready."""
    for i in (1, 2):
        gang_pools.add(f"gang-e-{i}")
    with GangWatch(cluster, namespace) as watch:
        apply(cluster, namespace, gang("huge", slices=3))
        obj = wait_condition(
            cluster, namespace, "huge", "Stalled", "True", "NotEnoughPools", timeout_s=READY_S
        )
        message = condition(obj, "Stalled")["message"]
        assert (
            f"needs 3 node pools of {SHAPE} at once, but only 2 node pools of that shape exist"
            in message
        ), message
        assert condition(obj, "Ready")["status"] == "False"
        assert condition(obj, "Ready")["reason"] == "NotEnoughPools"
        assert held_by(cluster, namespace, "huge") == {}
        assert "NotEnoughPools" in event_reasons(cluster, namespace)

        apply(cluster, namespace, gang("small", slices=1))  # not blocked by a stalled one
        wait_ready(cluster, namespace, "small", 1)
        assert held_by(cluster, namespace, "huge") == {}
        assert not any(released(p) for p in slice_pods(cluster, namespace, "huge"))

        gang_pools.add("gang-e-3")
        wait_condition(cluster, namespace, "huge", "Stalled", "False", timeout_s=READY_S)
        wait_waiting(
            cluster,
            namespace,
            "huge",
            f"1st of 1 waiting for {SHAPE}",
            "needs 3 node pools at once (holds 0)",
            held_text(cluster, namespace, "small"),
        )
        delete_tsc(cluster, namespace, "small")
        wait_ready(cluster, namespace, "huge", 3)
    watch.check()


def test_f_operator_sigkilled_during_a_gang_claim_converges_to_all_or_nothing(
    cluster: E2ECluster, namespace: str, gang_pools: GangPools, operator: OperatorProcess
) -> None:
    """Two 2-slice gangs over three pools. The operator is SIGKILLed as soon as the
    first reservation of a gang exists (its other claim may not be made yet) and again
    as soon as the first pod is released, and started again each time. Throughout, no
    pod of a gang is released before the gang holds all its pools, and no pool has two
    holders; it ends with one gang Ready on two pools, the other holding nothing, one
    pool free, no reservation without its holder; deleting the first lets the second
    complete."""
    pools = {f"gang-f-{i}" for i in (1, 2, 3)}
    for name in sorted(pools):
        gang_pools.add(name)
    names = ("north", "south")
    kills: list[dict[str, Any]] = []

    def ours() -> list[dict[str, Any]]:
        return [r for r in reservations(cluster) if r["spec"]["nodePool"] in pools]

    with GangWatch(cluster, namespace) as watch:
        apply_together(cluster, namespace, *(gang(n) for n in names))
        kube.wait_for(ours, timeout_s=READY_S, interval_s=0.01, what="a gang's first claim")
        operator.kill()
        kills.append({"at": "first claim", "held": {r["spec"]["nodePool"] for r in ours()}})
        operator.start()
        kube.wait_for(
            lambda: any(released(p) for n in names for p in slice_pods(cluster, namespace, n)),
            timeout_s=READY_S,
            interval_s=0.02,
            what="a gang's first released pod",
            describe=lambda: [describe(cluster, namespace, n) for n in names],
        )
        operator.kill()
        kills.append({"at": "first release", "held": {r["spec"]["nodePool"] for r in ours()}})
        operator.start()

        winner, loser = kube.wait_for(
            exactly_one(names, lambda n: ready_with(cluster, namespace, n, 2)),
            timeout_s=READY_S,
            what="one gang Ready on two pools",
            describe=lambda: ([describe(cluster, namespace, n) for n in names], kills),
        )
        wait_waiting(
            cluster, namespace, loser, "needs 2 node pools at once (holds 0)", timeout_s=60
        )
        holds_nothing_for(cluster, namespace, loser, seconds=5)
        assert len(ours()) == 2, (ours(), kills)
        assert_all_or_nothing(cluster, namespace)

        delete_tsc(cluster, namespace, winner)
        wait_ready(cluster, namespace, loser, 2)
    print("kills:", kills, "longest partial holds:", dict(watch.longest_partial))
    watch.check(max_partial_s=None)  # a killed operator may leave a partial set a while
    assert_all_or_nothing(cluster, namespace)
    assert len(ours()) == 2


def test_regression_one_and_two_slices_then_the_first_grows_no_deadlock(
    cluster: E2ECluster, namespace: str, gang_pools: GangPools
) -> None:
    """The issue's deadlock: a 1-slice and a 2-slice cluster applied together over two
    pools, then the first scaled to 2 slices. Before gangs both ended holding one pool,
    slice 0 Ready and slice 1 waiting, for ever. Now one of them ends Ready with 2
    slices and the other waits holding nothing."""
    for i in (1, 2):
        gang_pools.add(f"gang-r-{i}")
    names = ("one", "two")

    def settled() -> bool:
        """Exactly one cluster holds pools, all it wants, and is Ready; the other none."""
        obj = {n: get_tsc(cluster, namespace, n) for n in names}
        held = {n: held_by(cluster, namespace, n) for n in names}
        ready = [n for n in names if ready_with(cluster, namespace, n, desired_and_gang(obj[n])[0])]
        return len(ready) == 1 and not held[next(n for n in names if n not in ready)]

    with GangWatch(cluster, namespace) as watch:
        apply_together(cluster, namespace, gang("one", slices=1), gang("two", slices=2))
        kube.wait_for(
            settled,
            timeout_s=READY_S,
            what="one cluster Ready, the other holding nothing",
            describe=lambda: [describe(cluster, namespace, n) for n in names],
        )
        apply(cluster, namespace, gang("one", slices=2))
        _, loser = kube.wait_for(
            exactly_one(names, lambda n: ready_with(cluster, namespace, n, 2)),
            timeout_s=READY_S,
            what="one of them Ready with 2 slices (no deadlock)",
            describe=lambda: [describe(cluster, namespace, n) for n in names],
        )
        wait_waiting(cluster, namespace, loser, "needs 2 node pools at once (holds 0)")
        holds_nothing_for(cluster, namespace, loser, seconds=5)
        assert_all_or_nothing(cluster, namespace)
    watch.check()


def test_regression_a_growing_cluster_and_a_gang_ahead_of_it_do_not_deadlock(
    cluster: E2ECluster, namespace: str, gang_pools: GangPools
) -> None:
    """The same deadlock in the order the race above can also take: the 1-slice cluster
    runs on pool A first, then a 2-slice gang that sorts ahead of it (here by priority;
    applied together it can by name within one creationTimestamp second) waits, with
    pool B set aside for it; then the first cluster grows to 2 slices. Its running slice
    keeps A (no preemption), so the gang ahead can never complete while it runs; if B
    stays set aside for that gang, neither ever completes. No deadlock means the grown
    cluster gets B and is Ready with 2 slices, and the gang waits holding nothing."""
    for i in (1, 2):
        gang_pools.add(f"gang-s-{i}")
    with GangWatch(cluster, namespace) as watch:
        apply(cluster, namespace, gang("grow", slices=1))
        wait_ready(cluster, namespace, "grow", 1)
        apply(cluster, namespace, gang("ahead", slices=2, priority=10))
        wait_waiting(
            cluster,
            namespace,
            "ahead",
            "needs 2 node pools at once (holds 0)",
            held_text(cluster, namespace, "grow"),
        )
        apply(cluster, namespace, gang("grow", slices=2))
        wait_ready(cluster, namespace, "grow", 2)
        wait_waiting(cluster, namespace, "ahead", held_text(cluster, namespace, "grow"))
        holds_nothing_for(cluster, namespace, "ahead", seconds=5)
    watch.check()
    assert "ahead" not in watch.ever_held
