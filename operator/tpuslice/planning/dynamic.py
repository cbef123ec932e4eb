"""The per-slice plan of dynamic slices (TPU7x, ``spec.reservation.policy`` DynamicSlice).

The same ``SlicePlan`` the node-pool planner (planning/pools.py) gives, for the unit
kind ``CapacityUnit.PARTITION``: claims (one SliceReservation per partition), frees,
releases (pinned by ``cloud.google.com/gke-tpu-slice``), binds, drains and each slice's
status, plus the GKE Slices to create and delete. The shell (controller/actuator.py)
carries it out in the one pass of every kind.

One slice, from its pods and what the API server shows:

1. It holds fewer partitions than its topology needs: claim the rest
   (``partitions.choose_partitions``: one topology block; a gang all at once, in one
   block when it fits).
2. It holds them and has no Slice: create the Slice over them (named by
   ``partitions.gke_slice_name``) once its pods all exist (and, for a gang, once every
   slice holds its partitions). A held partition that became unusable is given back
   first and another claimed (it stays quarantined while unusable).
3. Its Slice forms (ACTIVATING): wait (the pass is run again after
   ``FORMING_RECHECK_SECONDS``: Slices are read, not watched).
4. Its Slice is ACTIVE (for a gang: every slice's): release its pods, pinned to the
   Slice, the gate removed, in one patch per pod.
5. Its Slice failed (``partitions.slice_stage``). Its pods never released: other
   partitions are claimed (the failed Slice's own are still held, so never chosen
   again), a new Slice is created over them, and only then the failed Slice deleted;
   with no other partition free, the failed Slice is deleted after a backoff and the
   slice waits. Its pods released: they are drained together (KubeRay replaces the
   slice under a new name), and the failed Slice is kept, its partitions held, until
   the slice of its index KubeRay made in its place has a Slice of its own, so that one
   forms elsewhere.
6. A held partition in no Slice of the slice, while the slice has a live Slice over
   others, or after its pods are gone, is given back, but never while a Slice that
   names it still exists (GKE's finalizer keeps a deleted Slice until its partitions
   are unlinked).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime

from tpuslice.model.convert import timestamp
from tpuslice.model.records import (
    Admission,
    Claim,
    ClusterRef,
    Drain,
    GangMode,
    GkeSliceCreate,
    GkeSliceInfo,
    NodeInfo,
    PodInfo,
    PodRelease,
    PoolRequest,
    ReservationInfo,
    SlicePlan,
    SliceState,
    SliceStatus,
)
from tpuslice.model.records import CapacityUnit as Unit
from tpuslice.planning.partitions import (
    DEGRADED,
    Partition,
    SliceStage,
    choose_partitions,
    free_partitions,
    gke_slice_name,
    partition_inventory,
    partition_problem,
    partitions_needed,
    slice_stage,
)
from tpuslice.planning.pools import (
    ReplicaPods,
    group_replicas,
    live_state,
    missing_slices,
    slice_holder,
)

__all__ = [
    "ACTIVE_RECHECK_SECONDS",
    "FORMING_RECHECK_SECONDS",
    "RETRY_AFTER_FAILURE_SECONDS",
    "partition_request",
    "plan_dynamic_slices",
]

#: How soon a pass looks again at a Slice that is forming (Slices are read each pass).
FORMING_RECHECK_SECONDS = 2.0
#: How soon a pass looks again at an ACTIVE Slice (a partition going UNHEALTHY changes
#: node labels and kicks a pass at once; a Slice failing otherwise is seen by this).
ACTIVE_RECHECK_SECONDS = 15.0
#: How long a failed Slice is kept when no other partitions are free, before it is
#: deleted and the slice retried on its own partitions (a backoff: GKE's controller
#: would fail it again at once if the partitions are still bad).
RETRY_AFTER_FAILURE_SECONDS = 30.0
_NOUN = "partition"


def _age(info: GkeSliceInfo, now: datetime | None) -> float | None:
    created = timestamp(info.created) if info.created else None
    return None if created is None or now is None else (now - created).total_seconds()


def partition_request(
    cluster: ClusterRef,
    *,
    chips: int,
    hosts: int,
    desired_slices: int,
    pods: Iterable[PodInfo],
    reservations: Iterable[ReservationInfo],
    gang: GangMode = GangMode.PER_SLICE,
    priority: int = 0,
    created: str = "",
) -> PoolRequest:
    """The object's entry in its accelerator's partition queue, in partitions, counted
    the way ``plan_dynamic_slices`` counts: ``held`` = the partitions its live slices
    hold (at most each slice's need), ``claimable`` = those its live slices still miss
    (a gang's only once the pods of every slice exist, as it claims all at once),
    ``idle`` = held by slices none of whose pods is released."""
    need = partitions_needed(chips)
    pods = list(pods)
    replicas, _ = group_replicas(pods, hosts)
    count: dict[str, int] = {}
    for x in reservations:
        if cluster.holds(x.holder):
            count[x.holder.replica_name] = count.get(x.holder.replica_name, 0) + 1
    live = [r for r in replicas.values() if r.live]
    held = {r.name: min(need, count.get(r.name, 0)) for r in live}
    short = sum(need - n for n in held.values())
    ready = gang != GangMode.ALL_SLICES or (
        len(live) >= desired_slices and all(len(r.live) == hosts for r in live)
    )
    return PoolRequest(
        key=cluster.queue_key,
        uid=cluster.uid,
        desired=desired_slices * need,
        held=sum(held.values()),
        claimable=short if ready else 0,
        gang=gang,
        priority=priority,
        created=created,
        idle=sum(held[r.name] for r in live if all(p.gated for p in r.live)),
        live_pods=sum(1 for p in pods if not p.deleting),
        per_slice=need,
    )


def plan_dynamic_slices(
    cluster: ClusterRef,
    *,
    topology: str,
    chips: int,
    hosts: int,
    desired_slices: int,
    pods: Iterable[PodInfo],
    nodes: Iterable[NodeInfo],
    reservations: Iterable[ReservationInfo],
    gke_slices: Sequence[GkeSliceInfo],
    gang: GangMode = GangMode.PER_SLICE,
    allow_degraded: bool = False,
    now: datetime | None = None,
    grace_seconds: int = 30,
    admission: Admission | None = None,
    excluded: Collection[str] = (),
) -> SlicePlan:
    """Decide one object's dynamic slices from a snapshot (the module's docstring).

    ``admission`` is the accelerator's partition queue's word (planning/queue.py): the
    partitions (by pool) it may claim now, its place in the queue, or NotEnoughPools;
    None when no queue governs it (nobody else wants partitions): any free one. A
    DEGRADED partition is outside the queue (``partitions.partition_pools``): an object
    allowing them may take one that is free whatever the queue says. ``excluded``: the
    partitions (by pool) its TPUSlicePolicies or untolerated taints keep it from
    claiming (``controller.actuator.placed_partitions``)."""
    need = partitions_needed(chips)
    replicas, unindexed = group_replicas(pods, hosts)
    inventory = partition_inventory(nodes)
    by_pool: dict[str, Partition] = {p.pool: p for p in inventory.values()}
    all_reservations = list(reservations)
    held_pools = {x.pool for x in all_reservations}
    ours: dict[str, list[ReservationInfo]] = {}
    for x in all_reservations:
        if cluster.holds(x.holder):
            ours.setdefault(x.holder.replica_name, []).append(x)
    mine = [
        s
        for s in gke_slices
        if s.owner == cluster.key and (not s.owner_uid or s.owner_uid == cluster.uid)
    ]
    stale = [s for s in gke_slices if s.owner == cluster.key and s not in mine]
    slices_of: dict[str, list[GkeSliceInfo]] = {}
    for s in mine:
        slices_of.setdefault(s.replica_name, []).append(s)
    owned_names = {s.name for s in mine}
    free = free_partitions(
        inventory,
        held_pools=held_pools,
        slices=gke_slices,
        ours=owned_names,
        allow_degraded=allow_degraded,
    )
    if excluded:
        free = [p for p in free if p.pool not in excluded]
    stalled = admission.stalled if admission is not None else None
    if admission is not None and admission.pools is not None:
        allowed = set(admission.pools)
        queued_free = [p for p in free if p.pool in allowed or p.state == DEGRADED]
    else:
        queued_free = free
    if stalled:
        queued_free = []

    def usable(pid: str) -> bool:
        p = inventory.get(pid)
        return p is not None and (
            partition_problem(p, owned_slices=owned_names, allow_degraded=allow_degraded) is None
        )

    def pid_of(x: ReservationInfo) -> str:
        p = by_pool.get(x.pool)
        return p.id if p is not None else x.pool

    claims: list[Claim] = []
    frees: list[str] = []
    releases: list[PodRelease] = []
    binds: list[str] = []
    drains: list[Drain] = []
    creates: list[GkeSliceCreate] = []
    deletes: list[GkeSliceInfo] = [s for s in stale if not s.deleting]
    statuses: dict[int, SliceStatus] = {}
    recheck: float | None = None

    ordered = sorted(
        replicas.values(), key=lambda r: (r.index if r.index is not None else 1 << 30, r.name)
    )
    live = [r for r in ordered if r.live]
    all_slices = gang == GangMode.ALL_SLICES

    # what each live slice holds, and which Slice of it is current
    held_ids: dict[str, list[str]] = {
        rep.name: sorted(pid_of(x) for x in ours.get(rep.name, [])) for rep in live
    }
    current: dict[str, GkeSliceInfo | None] = {}
    failed: dict[str, list[GkeSliceInfo]] = {}
    deleting: dict[str, list[GkeSliceInfo]] = {}
    for r in live:
        stages = [
            (s, slice_stage(s, allow_degraded=allow_degraded, age_seconds=_age(s, now)))
            for s in sorted(slices_of.get(r.name, []), key=lambda s: s.name)
        ]
        alive = [s for s, st in stages if st in (SliceStage.FORMING, SliceStage.ACTIVE)]
        current[r.name] = alive[0] if alive else None
        deletes += alive[1:]  # never two Slices for one slice: the first by name stays
        failed[r.name] = [s for s, st in stages if st is SliceStage.FAILED]
        deleting[r.name] = [s for s, st in stages if st is SliceStage.DELETING]

    # slices gone (no pods at all): delete their Slices, but keep a failed one while the
    # object still wants a slice of its index and none has a Slice yet (its partitions
    # stay held, so the slice KubeRay makes in its place forms elsewhere; decided below,
    # after the claims); free their partitions once no Slice names them any more
    served = {r.index for r in live if r.index is not None and current[r.name] is not None}
    kept_failed: list[GkeSliceInfo] = []
    for name in sorted(set(ours) | set(slices_of)):
        if name in replicas:
            continue
        for s in slices_of.get(name, []):
            if s.deleting:
                continue
            stage = slice_stage(s, allow_degraded=allow_degraded, age_seconds=_age(s, now))
            index = s.replica_index
            if (
                stage is SliceStage.FAILED
                and index is not None
                and index < desired_slices
                and index not in served
            ):
                kept_failed.append(s)
            else:
                deletes.append(s)
        named = {pid for s in slices_of.get(name, []) for pid in s.partition_ids}
        frees += [x.pool for x in ours.get(name, []) if pid_of(x) not in named]

    # which partitions each slice keeps, and how many it still has to claim
    short: dict[str, int] = {}
    drained: set[str] = set()
    for r in live:
        slice_now = current[r.name]
        locked = {pid for s in failed[r.name] + deleting[r.name] for pid in s.partition_ids}
        if slice_now is not None:
            keep = set(slice_now.partition_ids)
        else:
            usable_held = sorted(p for p in held_ids[r.name] if p not in locked and usable(p))
            keep = set(usable_held[:need])
        if failed[r.name] and slice_now is None and any(not p.gated for p in r.live):
            drained.add(r.name)
        # held partitions no Slice needs are given back; those a Slice names wait for it
        frees += [x.pool for x in ours.get(r.name, []) if pid_of(x) not in keep | locked]
        held_ids[r.name] = sorted(keep)
        short[r.name] = 0 if slice_now is not None else max(0, need - len(held_ids[r.name]))
        if r.name in drained:
            short[r.name] = 0  # KubeRay replaces the drained slice: the new one claims

    wanting = [r for r in live if short[r.name]]
    gang_pods = len(live) >= desired_slices and all(len(r.live) == hosts for r in live)
    claimed_now: set[str] = set()
    if wanting and (not all_slices or gang_pods):
        for group in [wanting] if all_slices else [[r] for r in wanting]:
            # a slice that holds some partitions takes the rest from their block; a gang
            # prefers the blocks it holds partitions in
            anchor = {inventory[pid].block for r in group for pid in held_ids[r.name]}
            left = [p for p in queued_free if p.id not in claimed_now]
            if len(group) == 1 and held_ids[group[0].name]:
                left = [p for p in left if p.block in anchor]
            chosen = choose_partitions(left, [short[r.name] for r in group], anchor_blocks=anchor)
            if chosen is None:
                # a part held that cannot be completed is given back while nothing ran
                # on it, so the slice (or gang) is not stuck on a block too full for it
                for r in group:
                    if all(p.gated for p in r.live) and not failed[r.name]:
                        frees += [
                            x.pool for x in ours.get(r.name, []) if pid_of(x) in held_ids[r.name]
                        ]
                        held_ids[r.name] = []
                        short[r.name] = need
                continue
            for r, ids in zip(group, chosen, strict=True):
                claims += [Claim(inventory[pid].pool, slice_holder(cluster, r)) for pid in ids]
                claimed_now.update(ids)

    # a kept failed Slice goes after the backoff when the slice of its index could claim
    # nothing else (no other partition is free: it retries on these once they are free)
    claiming = {c.holder.replica_name for c in claims}
    stuck = {r.index for r in live if short[r.name] and r.name not in claiming}
    for s in kept_failed:
        age = _age(s, now)
        if s.replica_index in stuck and (age is None or age >= RETRY_AFTER_FAILURE_SECONDS):
            deletes.append(s)
        elif s.replica_index in stuck and age is not None:
            recheck = _sooner(recheck, RETRY_AFTER_FAILURE_SECONDS - age)

    def whole(r: ReplicaPods) -> bool:
        """Holds all its partitions now (not counting this pass's claims)."""
        return short[r.name] == 0

    gang_held = not all_slices or (len(live) >= desired_slices and all(whole(r) for r in live))
    active = {
        name
        for name, info in current.items()
        if info is not None
        and slice_stage(info, allow_degraded=allow_degraded) is SliceStage.ACTIVE
    }
    gang_active = not all_slices or all(r.name in active for r in live)

    for r in ordered:
        if not r.live:
            if r.index is not None and r.index not in statuses:
                statuses[r.index] = SliceStatus(
                    r.index,
                    SliceState.RELEASING,
                    r.name,
                    message="pods terminating; its partitions stay held until they are gone",
                )
            continue
        index = r.index if r.index is not None else -1
        slice_now = current[r.name]
        complete = len(r.live) == hosts
        state, ready, message = SliceState.RESERVED, 0, ""
        for bad in failed[r.name]:
            why = f"GKE Slice {bad.name} {bad.reason or 'not Ready in time'}"
            why += f" ({bad.message})" if bad.message else ""
            released = [p for p in r.live if not p.gated]
            if released and slice_now is None:
                drains.append(
                    Drain(
                        bad.name,
                        r.name,
                        index,
                        tuple((p.namespace, p.name) for p in r.live),
                        _first_node(bad, inventory) or bad.name,
                        f"is in {why}",
                        "NodeFailure",
                        grace_seconds,
                    )
                )
            age = _age(bad, now)
            if r.name in drained:
                # kept until the slice KubeRay makes in this one's place has a Slice
                message = f"{why}; pods drained, KubeRay replaces the slice, which forms on "
                message += "other partitions"
            elif slice_now is not None:
                deletes.append(bad)  # its replacement exists: the failed one goes
                message = f"{why}; replaced by {slice_now.name}"
            elif short[r.name] and r.name not in {c.holder.replica_name for c in claims}:
                # nothing else to retry on: delete it after the backoff, then retry
                if age is None or age >= RETRY_AFTER_FAILURE_SECONDS:
                    deletes.append(bad)
                else:
                    recheck = _sooner(recheck, RETRY_AFTER_FAILURE_SECONDS - age)
                message = f"{why}; no other free partitions, retrying on its own"
            else:
                message = f"{why}; retrying on other partitions"
        if r.name in drained:
            state = SliceState.RELEASING
        elif slice_now is None and whole(r):
            if gang_held and complete:
                ids = tuple(held_ids[r.name])
                name = gke_slice_name(slice_holder(cluster, r), ids)
                creates.append(GkeSliceCreate(name, slice_holder(cluster, r), topology, ids))
                message = message or f"forming GKE Slice {name} over partitions {', '.join(ids)}"
                recheck = _sooner(recheck, FORMING_RECHECK_SECONDS)
            elif not complete:
                message = message or (
                    f"{len(r.live)} of {hosts} pods created; its Slice forms when all exist"
                )
            else:
                message = message or (
                    f"holds its partitions; its Slice forms when all {desired_slices} slices "
                    "hold theirs"
                )
        elif slice_now is None:
            if r.name in {c.holder.replica_name for c in claims}:
                message = message or "claiming partitions"
                recheck = _sooner(recheck, FORMING_RECHECK_SECONDS)
            else:
                state = SliceState.WAITING_FOR_CAPACITY
                detail = (
                    f"needs {need} free partitions of one topology block for {topology} "
                    f"({len(held_ids[r.name])} held, {len(free)} free)"
                )
                if stalled:
                    detail = stalled
                elif admission is not None and admission.message:
                    detail = admission.message
                elif all_slices and not gang_pods:
                    detail = (
                        f"waiting for the pods of every slice before claiming partitions "
                        f"for all {desired_slices} at once"
                    )
                message = f"{message}; {detail}" if message else detail
        else:
            stage = slice_stage(
                slice_now, allow_degraded=allow_degraded, age_seconds=_age(slice_now, now)
            )
            if stage is SliceStage.FORMING:
                message = message or (
                    f"GKE Slice {slice_now.name} {slice_now.reason or 'created'}; its pods "
                    "are released once it is ACTIVE"
                )
                recheck = _sooner(recheck, FORMING_RECHECK_SECONDS)
            elif not complete:
                message = f"{len(r.live)} of {hosts} pods created; released when all exist"
            elif not gang_active:
                message = f"GKE Slice {slice_now.name} ACTIVE; released when every slice's Slice is"
            else:
                # a formed Slice can still fail: looked at again (Slices are not watched)
                recheck = _sooner(recheck, ACTIVE_RECHECK_SECONDS)
                releases += [
                    PodRelease(p.namespace, p.name, slice_now.name, r.name, Unit.PARTITION)
                    for p in r.live
                    if p.gated
                ]
                state, ready = live_state(r, slice_now.name, hosts)
                if state in (SliceState.SCHEDULED, SliceState.READY):
                    binds += [x.pool for x in ours.get(r.name, []) if x.phase != "Bound"]
                message = message or (
                    f"GKE Slice {slice_now.name} over partitions "
                    f"{', '.join(slice_now.partition_ids)}"
                )
        if r.index is not None:
            statuses[r.index] = SliceStatus(index, state, r.name, None, ready, message)

    missing = missing_slices(statuses, desired_slices)
    return SlicePlan(
        claims=tuple(claims),
        releases=tuple(releases),
        frees=tuple(sorted(set(frees))),
        binds=tuple(sorted(set(binds))),
        slices=tuple(sorted([*statuses.values(), *missing], key=lambda s: s.index)),
        unindexed_pods=tuple(sorted(unindexed)),
        all_or_nothing=all_slices and bool(claims),
        recheck_in=recheck,
        drains=tuple(drains),
        gke_slice_creates=tuple(creates),
        gke_slice_deletes=tuple(_unique(deletes)),
        stalled=stalled or None,
    )


def _first_node(info: GkeSliceInfo, inventory: Mapping[str, Partition]) -> str:
    """The first node (by name) of the Slice's partitions, as a drain names one."""
    names = [n.name for pid in info.partition_ids if pid in inventory for n in inventory[pid].nodes]
    return min(names, default="")


def _sooner(current: float | None, seconds: float) -> float:
    return seconds if current is None else min(current, seconds)


def _unique(slices: Iterable[GkeSliceInfo]) -> list[GkeSliceInfo]:
    seen: dict[str, GkeSliceInfo] = {}
    for s in slices:
        seen.setdefault(s.name, s)
    return list(seen.values())
