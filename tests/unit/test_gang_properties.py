"""Property-based tests of the planner and the queue over random inventories and requests.

A small world: node pools of one shape (random capacity types, topology blocks, a few
unhealthy), several TPUSliceClusters (random slices, gang mode, priority, creation
time) whose pods KubeRay creates bit by bit, and one shared table of SliceReservations
where creating an existing one fails (the atomic claim). Each step runs one
cluster's pass the way the shell is to run it: build every request of the shape from
the (possibly stale) snapshot, decide the queue, plan, free, claim, re-plan after a
lost claim, release. The invariants are checked after every step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuslice.controller.actuator import admission_matters
from tpuslice.model.records import (
    Admission,
    CapacityType,
    ClusterRef,
    GangMode,
    NodeInfo,
    PodInfo,
    PoolRequest,
    ReservationInfo,
    ShapePool,
    SlicePlan,
)
from tpuslice.planning.pinning import pin_rekeys
from tpuslice.planning.pools import (
    plan_slices,
    pool_index,
    pool_request,
    prefer_pools,
    shape_pools,
)
from tpuslice.planning.queue import admission_for, decide_queue, queue_order

# Per-test settings (a profile loaded here would change test_fuzz's too). Deterministic
# in CI; GANG_EXAMPLES=3000 for a deeper, random search.
_EXAMPLES = int(os.environ.get("GANG_EXAMPLES", "0"))
GANG = settings(
    derandomize=not _EXAMPLES,
    database=None,
    max_examples=_EXAMPLES or 150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ACC, TOPO, HOSTS, CHIPS = "tpu-v6e-slice", "4x4", 2, 4
SHAPE = (ACC, TOPO)
CAPACITY = list(CapacityType)


@dataclass
class Cluster:
    ref: ClusterRef
    desired: int
    gang: GangMode
    priority: int
    created: str
    capacity_types: tuple[CapacityType, ...]
    pods: dict[str, PodInfo] = field(default_factory=dict)  # pod name -> pod
    ready_passes: int = 0
    done: bool = False

    @property
    def key(self) -> tuple[str, str, str]:
        return self.ref.key


@dataclass
class World:
    nodes: list[NodeInfo]
    clusters: list[Cluster]
    reservations: dict[str, ReservationInfo] = field(default_factory=dict)
    history: list[dict[str, ReservationInfo]] = field(default_factory=list)
    lost: int = 0
    #: pin at admission: each index without pods claims ahead (a placeholder holder),
    #: and the index's replica takes the reservation over (``pin_rekeys``)
    ahead: bool = False

    def cluster(self, uid: str) -> Cluster:
        return next(c for c in self.clusters if c.ref.uid == uid)


@st.composite
def worlds(draw: st.DrawFn, *, healthy: bool = False) -> World:
    n_pools = draw(st.integers(1, 6))
    nodes: list[NodeInfo] = []
    for i in range(n_pools):
        cap = draw(st.sampled_from(CAPACITY))
        block = draw(st.sampled_from([None, "b1", "b2"]))
        sub = draw(st.sampled_from([None, "s1", "s2"])) if block else None
        sick = not healthy and draw(st.integers(0, 9)) == 0
        nodes += [
            NodeInfo(
                f"p{i}-n{h}",
                f"p{i}",
                ACC,
                TOPO,
                CHIPS,
                not (sick and h == 0),
                True,
                cap,
                block,
                sub,
            )
            for h in range(HOSTS)
        ]
    clusters = []
    for j in range(draw(st.integers(1, 4))):
        clusters.append(
            Cluster(
                ClusterRef("ml", f"c{j}", f"uid-{j}"),
                desired=draw(st.integers(1, 4)),
                gang=draw(st.sampled_from(list(GangMode))),
                priority=draw(st.integers(0, 2)),
                created=f"2026-12-01T00:00:{draw(st.integers(0, 3)):02d}Z",
                capacity_types=tuple(draw(st.permutations(CAPACITY))[: draw(st.integers(0, 4))]),
            )
        )
    return World(nodes, clusters)


def kuberay_creates_pods(c: Cluster, count: int) -> None:
    """KubeRay makes up to ``count`` more pods, replica by replica, host by host."""
    for index in range(c.desired):
        for host in range(HOSTS):
            name = f"{c.ref.name}-r{index}-{host}"
            if name in c.pods:
                continue
            if count <= 0:
                return
            c.pods[name] = PodInfo(
                "ml", name, c.ref.name, f"{c.ref.name}-r{index}", index, host,
                True, None, None, False, False,
            )  # fmt: skip
            count -= 1


def requests(world: World, reservations: list[ReservationInfo]) -> list[PoolRequest]:
    return [
        pool_request(
            c.ref,
            hosts=HOSTS,
            desired_slices=c.desired,
            gang=c.gang,
            pods=c.pods.values(),
            reservations=reservations,
            priority=c.priority,
            created=c.created,
            capacity_types=c.capacity_types,
            claim_ahead=world.ahead,
        )
        for c in world.clusters
        if not c.done
    ]


def plan_for(
    world: World, c: Cluster, reservations: list[ReservationInfo], admission: Admission | None
) -> SlicePlan:
    return plan_slices(
        c.ref,
        accelerator=ACC,
        topology=TOPO,
        hosts=HOSTS,
        chips_per_host=CHIPS,
        desired_slices=c.desired,
        gated=True,
        pods=list(c.pods.values()),
        nodes=world.nodes,
        reservations=reservations,
        gang=c.gang,
        admission=admission,
        capacity_types=c.capacity_types,
        claim_ahead=world.ahead,
    )


def rekey(world: World, c: Cluster) -> None:
    """The shell's take-over before planning: a placeholder's reservation goes to the
    live replica of its index (one conditional patch: only if it is still the same)."""
    for handover in pin_rekeys(
        c.ref, hosts=HOSTS, pods=c.pods.values(), reservations=world.reservations.values()
    ):
        old = world.reservations[handover.pool]
        world.reservations[handover.pool] = replace(old, holder=handover.holder)


def one_pass(
    world: World, c: Cluster, stale: int, crash_after: int | None = None, queue: bool = True
) -> None:
    """One reconcile of ``c`` as the shell is to run it; ``stale`` passes-old snapshot;
    ``crash_after``: the operator dies after that many claims (nothing else happens)."""
    if world.ahead:
        rekey(world, c)
    snap = world.history[-stale] if 0 < stale <= len(world.history) else world.reservations
    snapshot = list(snap.values())
    index = pool_index(world.nodes, ACC, TOPO)
    decision = decide_queue(
        SHAPE, requests(world, snapshot), shape_pools(index, snapshot, hosts=HOSTS,
                                                      chips_per_host=CHIPS)
    )  # fmt: skip
    check_decision(decision, requests(world, snapshot), shape_pools(index, snapshot,
                   hosts=HOSTS, chips_per_host=CHIPS))  # fmt: skip
    admission = admission_for(decision, c.key) if queue else None  # None: today's shell
    plan = plan_for(world, c, snapshot, admission)
    own = next(r for r in requests(world, snapshot) if r.key == c.key)
    if queue and not admission_matters(own, len(index.matching)):
        # the shell skips the queue here (actuator.queue_admission): it must not matter
        assert plan_for(world, c, snapshot, None) == plan, (own, admission)
    if crash_after is not None:
        for claim in plan.claims[:crash_after]:
            world.reservations.setdefault(claim.pool, ReservationInfo(claim.pool, claim.holder))
        return
    for _ in range(4):
        for pool in plan.frees:
            held = world.reservations.get(pool)
            if held is not None and held.holder.uid == c.ref.uid:
                del world.reservations[pool]
        lost = False
        for claim in plan.claims:
            if claim.pool in world.reservations:
                lost = True
                world.lost += 1
                continue
            world.reservations[claim.pool] = ReservationInfo(claim.pool, claim.holder)
        if not lost:
            break
        # re-plan at once with the winner's reservation seen (the shell's overlay)
        plan = plan_for(world, c, list(world.reservations.values()), admission)
    else:
        plan = replace(plan, releases=())
    holding = {
        r.holder.replica_name: r.pool
        for r in world.reservations.values()
        if r.holder.uid == c.ref.uid
    }
    for release in plan.releases:
        if holding.get(release.replica_name) == release.pool:
            pod = c.pods[release.name]
            c.pods[release.name] = replace(pod, gated=False, pinned_pool=release.pool)
    if stale == 0 and c.gang == GangMode.ALL_SLICES:
        # a gang that cannot complete keeps no unreleased pool while another could use it
        now = list(world.reservations.values())
        reqs = {r.key: r for r in requests(world, now)}
        me = reqs[c.key]
        exist = len({n.pool for n in world.nodes})
        others = any(
            k != c.key and r.missing > 0 and r.desired <= exist for k, r in reqs.items()
        ) or any(r.holder.uid != c.ref.uid for r in now)
        if me.held < me.desired and (others or me.desired > exist):
            assert me.idle == 0, (c.key, me)


def finish_ready_clusters(world: World, after: int) -> None:
    """A cluster whose every slice was released for ``after`` passes is deleted."""
    for c in world.clusters:
        if c.done or len(c.pods) < c.desired * HOSTS:
            continue
        if all(not p.gated for p in c.pods.values()):
            c.ready_passes += 1
            if c.ready_passes >= after:
                c.done = True
                c.pods.clear()
                for pool in [p for p, r in world.reservations.items()
                             if r.holder.uid == c.ref.uid]:  # fmt: skip
                    del world.reservations[pool]


def check_world(world: World) -> None:
    for c in world.clusters:
        released = [p for p in c.pods.values() if not p.gated]
        # never two holders of a pool: every released pod runs on a pool its slice holds
        for pod in released:
            held = world.reservations.get(pod.pinned_pool or "")
            assert held is not None and held.holder.uid == c.ref.uid, pod
            assert held.holder.replica_name == pod.replica_name, pod
        # never a partly released gang: once one pod of an AllSlices gang is released,
        # every desired slice holds a pool of its own
        if c.gang == GangMode.ALL_SLICES and released:
            replicas = {
                r.holder.replica_name
                for r in world.reservations.values()
                if r.holder.uid == c.ref.uid
            }
            assert len(replicas) >= c.desired, (c.key, replicas)
    pinned: dict[str, str] = {}
    for c in world.clusters:
        for pod in c.pods.values():
            if pod.pinned_pool:
                assert pinned.setdefault(pod.pinned_pool, c.ref.uid) == c.ref.uid


def check_decision(decision: object, reqs: list[PoolRequest], pools: list[ShapePool]) -> None:
    from tpuslice.model.records import QueueDecision

    assert isinstance(decision, QueueDecision)
    exist = len(pools)
    free = {p.name for p in pools if p.eligible and p.holder is None}
    by_key = {r.key: r for r in reqs}
    # NotEnoughPools exactly when the request wants more pools than the shape has
    assert set(decision.not_enough) == {r.key for r in reqs if r.missing > 0 and r.desired > exist}
    order = [by_key[k] for k in decision.order]
    assert order == queue_order(r for r in reqs if r.missing > 0 and r.desired <= exist)
    granted: set[str] = set()
    for r in order:
        a = decision.admissions[r.key]
        assert a.pools is not None and set(a.pools) <= free
        assert not granted & set(a.pools), "two requests granted one pool"
        granted |= set(a.pools)
        assert len(a.pools) <= a.set_aside <= r.missing
        if r.gang == GangMode.ALL_SLICES:
            assert len(a.pools) in (0, r.missing)

    # strict order: a request gets pools set aside only if every earlier one got all
    # it misses; and every free pool is set aside unless nobody in the queue wants it
    # (except a gang that could complete only with pools running slices of later
    # requests hold: it yields to them, or the two would wait for each other for ever;
    # and a request none of whose pods exists: nothing proves they ever will)
    def yields(j: int) -> bool:
        q = order[j]
        running_after = sum(max(0, x.held - x.idle) for x in order[j + 1 :])
        return q.gang == GangMode.ALL_SLICES and q.missing > exist - q.held - running_after

    def passed_over(j: int) -> bool:
        return not order[j].has_pods or yields(j)

    for i, r in enumerate(order):
        if not r.has_pods:
            assert decision.admissions[r.key].set_aside == 0, r
            assert decision.admissions[r.key].position is not None, r  # keeps its place
        if decision.admissions[r.key].set_aside:
            for j, q in enumerate(order[:i]):
                if passed_over(j):
                    assert decision.admissions[q.key].set_aside == 0, (q, r)
                else:
                    assert decision.admissions[q.key].set_aside == q.missing, (q, r)
    total = sum(decision.admissions[r.key].set_aside for r in order)
    wanted = sum(r.missing for j, r in enumerate(order) if not passed_over(j))
    assert total == min(len(free), wanted)
    # progress: the first request with pods, if it fits and is ready, is granted (one
    # without pods before it blocks nothing, but past one a request is served whole)
    with_pods = [r for r in order if r.has_pods]
    if with_pods:
        head = with_pods[0]
        partial = head.gang == GangMode.PER_SLICE and head is order[0]
        ready = head.claimable >= head.missing or (partial and head.claimable > 0)
        fits = head.missing <= len(free) or (partial and free)
        if ready and fits:
            assert decision.admissions[head.key].pools


STEPS = st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(0, 3), st.integers(0, 5))


@GANG
@given(worlds(), st.lists(STEPS, min_size=5, max_size=60), st.booleans(), st.booleans())
def test_random_passes_keep_every_invariant(
    world: World, steps: list[tuple[int, int, int, int]], queue: bool, ahead: bool
) -> None:
    """Random interleavings with stale snapshots (lost races) and operator kills in the
    middle of a gang's claims, with the queue and without it (the gang rules of the
    planner alone), with units claimed ahead of pods (pin at admission) and without:
    never two holders, never a partly released gang."""
    world.ahead = ahead
    for who, new_pods, stale, crash in steps:
        live = [c for c in world.clusters if not c.done]
        if not live:
            break
        c = live[who % len(live)]
        kuberay_creates_pods(c, new_pods)
        world.history.append(dict(world.reservations))
        one_pass(world, c, stale if stale < 3 else 0, crash if crash < 2 else None, queue)
        check_world(world)
        finish_ready_clusters(world, after=3)
        check_world(world)


@GANG
@given(worlds(healthy=True), st.integers(0, 2**16), st.booleans())
def test_every_cluster_that_fits_the_shape_completes_in_turn(
    world: World, seed: int, ahead: bool
) -> None:
    """No deadlock, no starvation: with healthy pools and clusters that finish, every
    cluster whose slices fit the shape gets all of them, the others are NotEnoughPools
    (units claimed ahead of pods or not)."""
    world.ahead = ahead
    exist = len({n.pool for n in world.nodes})
    rounds = 0
    while rounds < 40 and any(not c.done and c.desired <= exist for c in world.clusters):
        rounds += 1
        for k in range(len(world.clusters)):
            c = world.clusters[(k + seed + rounds) % len(world.clusters)]
            if c.done:
                continue
            kuberay_creates_pods(c, (seed >> k) % 3 + 1)
            world.history.append(dict(world.reservations))
            one_pass(world, c, stale=1 if (seed + rounds + k) % 5 == 0 else 0)
            check_world(world)
        finish_ready_clusters(world, after=2)
    assert all(c.done for c in world.clusters if c.desired <= exist), [
        (c.key, c.desired, c.gang) for c in world.clusters if not c.done
    ]
    # and whoever could never fit was told so, holding nothing it does not run on
    snapshot = list(world.reservations.values())
    index = pool_index(world.nodes, ACC, TOPO)
    decision = decide_queue(
        SHAPE, requests(world, snapshot),
        shape_pools(index, snapshot, hosts=HOSTS, chips_per_host=CHIPS),
    )  # fmt: skip
    assert {k for k in decision.not_enough} == {
        c.key for c in world.clusters if not c.done and c.desired > exist
    }


@GANG
@given(worlds(healthy=True), st.integers(0, 2**16), st.sampled_from(list(GangMode)))
def test_a_cluster_whose_pods_are_never_created_starves_nobody(
    world: World, seed: int, gang: GangMode
) -> None:
    """A squatter first in the queue (the highest priority, the oldest, every pool of
    the shape wanted) whose pods the namespace's quota never admits: every other cluster
    that fits the shape still completes, and the squatter holds nothing."""
    exist = len({n.pool for n in world.nodes})
    squatter = Cluster(
        ClusterRef("ml", "squat", "uid-squat"),
        desired=exist,
        gang=gang,
        priority=1_000_000_000,
        created="2026-11-30T00:00:00Z",
        capacity_types=(),
    )
    world.clusters.append(squatter)
    rounds = 0
    while rounds < 40 and any(
        not c.done and c.desired <= exist and c is not squatter for c in world.clusters
    ):
        rounds += 1
        for k in range(len(world.clusters)):
            c = world.clusters[(k + seed + rounds) % len(world.clusters)]
            if c.done:
                continue
            if c is not squatter:
                kuberay_creates_pods(c, (seed >> k) % 3 + 1)
            world.history.append(dict(world.reservations))
            one_pass(world, c, stale=1 if (seed + rounds + k) % 5 == 0 else 0)
            check_world(world)
            assert not any(r.holder.uid == "uid-squat" for r in world.reservations.values())
        finish_ready_clusters(world, after=2)
    assert all(c.done for c in world.clusters if c.desired <= exist and c is not squatter), [
        (c.key, c.desired, c.gang) for c in world.clusters if not c.done
    ]


pool_strategy = st.builds(
    ShapePool,
    name=st.sampled_from([f"p{i}" for i in range(8)]),
    eligible=st.just(True),
    capacity_type=st.sampled_from(CAPACITY),
    block=st.sampled_from([None, "b1", "b2"]),
    subblock=st.sampled_from([None, "s1", "s2"]),
)


@GANG
@given(
    st.lists(pool_strategy, max_size=8, unique_by=lambda p: p.name),
    st.integers(0, 8),
    st.sets(st.sampled_from([f"p{i}" for i in range(8)])),
    st.permutations(CAPACITY),
    st.integers(0, 4),
    st.booleans(),
)
def test_pool_preference_order(
    pools: list[ShapePool],
    count: int,
    previous: set[str],
    capacity: list[CapacityType],
    listed: int,
    together: bool,
) -> None:
    order = capacity[:listed]
    chosen = prefer_pools(pools, count, previous=previous, capacity_types=order, together=together)
    names = [p.name for p in chosen]
    assert len(names) == len(set(names)) == min(count, len(pools))
    assert set(names) <= {p.name for p in pools}
    # (a) previous pools first
    prev = sorted(p.name for p in pools if p.name in previous)[:count]
    assert names[: len(prev)] == prev
    rest = chosen[len(prev) :]
    left = [p for p in pools if p.name not in prev]

    def key(p: ShapePool) -> tuple[int, str]:
        return (order.index(p.capacity_type) if p.capacity_type in order else len(order)), p.name

    k = len(rest)
    if together and k:
        subs: dict[tuple[str | None, str | None], int] = {}
        blocks: dict[str | None, int] = {}
        for p in left:
            if p.block is not None:
                blocks[p.block] = blocks.get(p.block, 0) + 1
                if p.subblock is not None:
                    subs[(p.block, p.subblock)] = subs.get((p.block, p.subblock), 0) + 1
        if any(n >= k for n in subs.values()):
            # (b) one sub-block when one can hold them all
            assert len({(p.block, p.subblock) for p in rest}) == 1 and rest[0].subblock
        elif any(n >= k for n in blocks.values()):
            assert len({p.block for p in rest}) == 1 and rest[0].block
        else:
            assert rest == sorted(left, key=key)[:k]
        assert rest == sorted(rest, key=key)  # (c)+(d) within the (sub-)block
    else:
        # (c) capacity types in the user's order, (d) then names
        assert rest == sorted(left, key=key)[:k]
