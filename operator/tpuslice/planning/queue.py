"""The queue per shape (accelerator + topology): who may claim which pools now. Pure.

Every cluster that wants pools of a shape is a ``PoolRequest``, read by the shell
from API objects alone (the TSC's priority, creationTimestamp, slices and gang; its
SliceReservations; its pods), so every pass of every cluster, and every operator
after a restart, computes the same decision from the same objects. No memory.

The rules (``decide_queue``):

1. **Order**: ``priority`` (higher first), then the slices an object cannot run
   without before extras (an elastic set that holds its minimum and misses only
   slices the autoscaler added, ``PoolRequest.extra``, ranks after every request of
   its priority that misses its minimum), then ``creationTimestamp`` (older first),
   then namespace/name and uid (a stable tie-break).
2. **NotEnoughPools**: a request whose ``desired`` slices exceed every pool of the
   shape that exists (healthy or not, held or not) can never be satisfied: it leaves
   the queue (it neither claims nor sets pools aside) and is Stalled with a message
   naming both numbers, until pools are added or its spec changes. PerSlice requests
   too: otherwise a 5-slice request over 3 pools would sit at the head for ever.
   Extras above an elastic minimum are never stalled: they take what there is, and
   the autoscaler gives up on the rest after its own timeout.
3. **Strict order, no backfill**: walking the queue head first, each request sets
   aside ``min(free, missing)`` of the free eligible pools (missing = desired - held).
   An AllSlices request is granted only when it got all it misses *and* its pods are
   there for all of them (``claimable >= missing``); a PerSlice request is granted
   what it set aside, up to ``claimable``. Pools set aside for an earlier request are
   never offered to a later one, granted or not: a 1-slice request created after a
   4-slice one waiting for 4 pools does not take a freed pool. "Free" means no
   SliceReservation exists by the time of the pass (a pool given back in this pass
   counts in the next one, triggered by its deletion).
4. **Which pools**: the pools set aside for a request are concrete, chosen by
   ``reservation.prefer_pools`` among those no earlier request took, so two requests
   in one decision never name the same pool and a later request never takes the
   pools an earlier, not yet ready one would prefer; a race can only come from passes that read
   different snapshots, and then the SliceReservation create decides (AlreadyExists =
   lost), and the loser gives its partial set back (plan_slices).
5. **No deadlock with running slices**: an AllSlices gang that could complete only
   with pools held by running slices of requests queued *after* it (a running
   cluster that grows behind a higher-priority gang) would wait for them while they
   wait for the pools it sets aside. Such a gang keeps its place but sets nothing
   aside; the requests after it are served, and it is served once pools come back.
   (PerSlice requests take what is free and run it, so they never wait in a cycle.)
6. **Only for requests whose pods exist**: pools are set aside only for a request with
   at least one live worker pod (``PoolRequest.has_pods``). A pod is charged to the
   namespace's ResourceQuota when it is created, gated or not, so an existing pod
   proves the quota admitted it; a request with none may never get any (a quota that
   refuses its worker template), and a priority alone must not let it hold every pool
   of the shape from everyone else. Such a request keeps its place and its message
   (waiting for its pods to be created, holding nothing for now) but sets nothing
   aside, is not counted ahead of anyone, and the requests after it are served as if
   it were not there; once one of its pods exists it sets aside as any other. It
   never yields under rule 5 either: it has nothing to yield, and holds no running
   slice that a gang ahead of it could wait for. Past it, a PerSlice request is
   granted only whole (every pool it misses, each slice with its pods), as a gang is:
   one that ran part of its slices in the pools the earlier request would have had
   would otherwise, once the earlier one's pods exist, wait for its pools while the
   earlier one waits for the pools it runs on (no preemption), for ever.
7. **Contention**: a request is ``contended`` when another request of the shape is in
   the queue; an AllSlices gang that cannot complete frees the pools its unreleased
   slices hold when contended, so it never keeps a partial set beyond a pass while
   another request could use it. (Under strict order the head gains nothing by
   keeping them: the freed pools are set aside for it again in the next pass.)
8. **Units of a slice**: a request whose slice takes several units
   (``PoolRequest.per_slice``: a TPU7x dynamic slice's 4x4x4 partitions, all of one
   topology block; its queue is the accelerator's ``partitions.partition_shape``) counts
   every number above in units. What is set aside for it is as many of its slices, in
   order, as fit whole in the blocks, then free units of the blocks it uses (so a later
   request cannot split what it waits to complete); it is granted whole slices only (a
   gang: all of them), never a part of a slice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tpuslice.model.records import (
    Admission,
    GangMode,
    ObjectKey,
    PoolRequest,
    QueueDecision,
    Shape,
    ShapePool,
)
from tpuslice.model.topology import TopologyError, resolve_generation
from tpuslice.planning.partitions import Partition, choose_partitions
from tpuslice.planning.pools import prefer_pools
from tpuslice.status.conditions import MAX_SLICE_MESSAGE, truncate

__all__ = [
    "HOLDERS_LISTED",
    "admission_for",
    "decide_queue",
    "holders_summary",
    "not_enough_message",
    "ordinal",
    "queue_message",
    "queue_order",
    "requests_by_shape",
    "shape_name",
]

#: Holders a wait message names (the rest are counted).
HOLDERS_LISTED = 3


def shape_name(shape: Shape) -> str:
    """``v6e 4x4`` for (``tpu-v6e-slice``, ``4x4``); the GKE value if unknown."""
    accelerator, topology = shape
    try:
        name = resolve_generation(accelerator).name
    except TopologyError:
        name = accelerator
    return f"{name} {topology}"


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st, 101st, 111th."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def holders_summary(pools: Iterable[ShapePool], *, exclude_uid: str = "") -> str:
    """Who holds the shape's pools, naming a holder's pools when it has few:
    ``ml/a (pool-1, pool-2), ml/b (pool-3), and 4 more holders``; ``ml/c (5 pools)``."""
    return _Holders(pools).summary(exclude_uid)


class _Holders:
    """The shape's holders ranked once per decision (most pools first), so each waiting
    request's message costs the few holders it names, not a pass over every pool."""

    def __init__(self, pools: Iterable[ShapePool]) -> None:
        held: dict[tuple[str, str], list[str]] = {}
        for p in pools:
            if p.holder is not None:
                who = (p.holder.uid, f"{p.holder.namespace}/{p.holder.name}")
                held.setdefault(who, []).append(p.name)
        self.ranked = sorted(held.items(), key=lambda kv: (-len(kv[1]), kv[0][1], kv[0][0]))
        self.uids = {uid for uid, _ in held}

    def summary(self, exclude_uid: str = "") -> str:
        """The first holders (``HOLDERS_LISTED``) by name, the rest counted: the walk stops
        at the last one named, so a decision with a message for each of a thousand waiting
        requests does not walk a thousand holders for each."""
        parts: list[str] = []
        for (uid, who), names in self.ranked:
            if len(parts) == HOLDERS_LISTED:
                break
            if uid == exclude_uid:
                continue
            named = (
                _plural(len(names), "pool")
                if len(names) > HOLDERS_LISTED
                else ", ".join(sorted(names))
            )
            parts.append(f"{who} ({named})")
        others = len(self.ranked) - len(parts) - (exclude_uid in self.uids)
        if others:
            parts.append(f"and {_plural(others, 'more holder')}")
        return ", ".join(parts)


def queue_message(
    *,
    position: int,
    waiting: int,
    shape: str,
    desired: int,
    held: int,
    gang: GangMode,
    set_aside: int,
    ahead: int,
    holders: str,
    ready: bool = True,
    yielding: bool = False,
    noun: str = "node pool",
    has_pods: bool = True,
) -> str:
    """``2nd of 3 waiting for v6e 4x4: needs 4 node pools at once (holds 0); 1 free
    pool set aside for it, the rest go to 1 request ahead; held by ml/a (2)``."""
    missing = max(0, desired - held)
    what = (
        f"needs {_plural(desired, noun)} at once"
        if gang == GangMode.ALL_SLICES and desired > 1
        else f"needs {_plural(missing, 'more ' + noun)}"
    )
    parts = [f"{ordinal(position)} of {waiting} waiting for {shape}: {what} (holds {held})"]
    if set_aside:
        parts.append(f"{_plural(set_aside, 'free ' + noun.split()[-1])} set aside for it")
    if ahead:
        parts.append(f"{_plural(ahead, 'request')} ahead in the queue")
    if yielding:
        parts.append(
            f"the {noun}s it lacks are held by running slices of clusters queued after it, "
            "so they are served first"
        )
    if not has_pods:
        parts.append(
            "waiting for its pods to be created (none exists yet), so it holds nothing "
            "for now and the requests after it are served"
        )
    elif not ready:
        parts.append("waiting for the pods of its slices")
    if holders:
        parts.append(f"held by {holders}")
    return truncate("; ".join(parts), MAX_SLICE_MESSAGE)


def not_enough_message(
    *, shape: str, desired: int, exist: int, gang: GangMode, noun: str = "node pool"
) -> str:
    """The NotEnoughPools message: how many exist and how many it needs."""
    how = " at once" if gang == GangMode.ALL_SLICES and desired > 1 else ""
    return truncate(
        f"needs {_plural(desired, noun)} of {shape}{how}, but "
        f"{'only ' if exist else ''}{_plural(exist, noun)} of that shape "
        f"{'exists' if exist == 1 else 'exist'}; add {noun}s or lower spec.tpu.slices",
        MAX_SLICE_MESSAGE,
    )


def queue_order(requests: Iterable[PoolRequest]) -> list[PoolRequest]:
    """Head first: priority (higher first), minimums before extras, creationTimestamp
    (older first; a missing one last), then namespace/name and uid."""
    return sorted(
        requests,
        key=lambda r: (-r.priority, r.extra, r.created == "", r.created, r.key, r.uid),
    )


def decide_queue(
    shape: Shape,
    requests: Sequence[PoolRequest],
    pools: Sequence[ShapePool],
    *,
    noun: str = "node pool",
) -> QueueDecision:
    """The decision for one shape (see the module docstring for the rules).

    ``requests``: every cluster of the shape with a gated slice policy (those wanting
    nothing are fine to include); ``pools``: every pool of the shape
    (``reservation.shape_pools``).
    """
    name = shape_name(shape)
    exist = len(pools)
    by_name = sorted(pools, key=lambda p: p.name)
    free = [p for p in by_name if p.eligible and p.holder is None]
    admissions: dict[ObjectKey, Admission] = {}
    wanting = [r for r in requests if r.missing > 0]
    stalled = [r for r in wanting if r.desired > exist and not r.extra]
    order = queue_order(r for r in wanting if r.desired <= exist or r.extra)
    for r in stalled:
        admissions[r.key] = Admission(
            pools=(),
            contended=True,
            stalled=not_enough_message(
                shape=name, desired=r.desired, exist=exist, gang=r.gang, noun=noun
            ),
        )

    avail = len(free)
    remaining = _FreeInOrder(free)
    holding: dict[str, list[ShapePool]] = {}
    for p in by_name:
        if p.holder is not None:
            holding.setdefault(p.holder.uid, []).append(p)
    holders = _Holders(by_name)
    granted: dict[ObjectKey, tuple[ShapePool, ...]] = {}
    set_aside: dict[ObjectKey, int] = {}
    # Pools held by running slices of the requests queued after each one: a gang ahead
    # can never get those (no preemption), and the holders wait behind it for more. A
    # request without pods runs no slice, so it adds nothing.
    behind_running = [0] * (len(order) + 1)
    for i in range(len(order) - 1, -1, -1):
        q = order[i]
        running = max(0, q.held - q.idle) if q.has_pods else 0
        behind_running[i] = behind_running[i + 1] + running
    yields: set[ObjectKey] = set()
    passed_over = False  # a request without pods is ahead: those after it are served whole
    for i, r in enumerate(order):
        if not r.has_pods:
            # Nothing proves its pods can ever exist (rule 6): it keeps its place but
            # sets nothing aside, so it blocks nobody after it.
            set_aside[r.key] = 0
            granted[r.key] = ()
            passed_over = True
            continue
        if r.gang == GangMode.ALL_SLICES and r.missing > exist - r.held - behind_running[i + 1]:
            # It could only complete with pools that running slices of clusters queued
            # after it hold, and they wait for pools it would set aside: a deadlock. It
            # keeps its place but sets nothing aside until those clusters have theirs.
            yields.add(r.key)
            set_aside[r.key] = 0
            granted[r.key] = ()
            continue
        take = min(avail, r.missing)
        avail -= take
        set_aside[r.key] = take
        # the pools set aside are concrete, so a later request never takes the ones an
        # earlier (not yet ready, or still short) request would prefer
        picks: tuple[ShapePool, ...] = ()
        whole = take  # of the picks, those that make up whole slices
        together = r.gang == GangMode.ALL_SLICES and r.desired > 1
        if take and r.per_slice > 1:
            picks, whole = _block_picks(remaining.left(), r, take, holding.get(r.uid, ()))
            remaining.take(picks)
        elif take and remaining.first_are_preferred(r, together):
            picks = remaining.take_first(take)
        elif take:
            picks = tuple(
                prefer_pools(
                    remaining.left(),
                    take,
                    previous=set(r.previous),
                    capacity_types=r.capacity_types,
                    together=together,
                    anchor=holding.get(r.uid, ()),
                    by_name=True,
                    maintenance_before=r.maintenance_before,
                )
            )
            remaining.take(picks)
        if r.gang == GangMode.ALL_SLICES or passed_over:
            count = r.missing if whole == r.missing and r.claimable >= r.missing else 0
        else:
            count = _whole_slices(r, min(whole, r.claimable))
        picks = picks[:count]
        granted[r.key] = picks

    waiting = [r for r in order if len(granted[r.key]) < r.missing]
    position = {r.key: i + 1 for i, r in enumerate(waiting)}
    set_aside_so_far = 0  # requests of the order so far that had pools set aside
    for r in order:
        contended = len(order) > 1
        ahead = set_aside_so_far
        set_aside_so_far += set_aside[r.key] > 0
        if r.key not in position:
            admissions[r.key] = Admission(
                pools=tuple(p.name for p in granted[r.key]),
                contended=contended,
                set_aside=set_aside[r.key],
            )
            continue
        ready = r.claimable >= r.missing
        yielding = r.key in yields
        message = queue_message(
            position=position[r.key],
            waiting=len(waiting),
            shape=name,
            desired=r.desired,
            held=r.held,
            gang=r.gang,
            set_aside=set_aside[r.key] - len(granted[r.key]),
            ahead=ahead,
            holders=holders.summary(r.uid),
            ready=ready,
            yielding=yielding,
            noun=noun,
            has_pods=r.has_pods,
        )
        admissions[r.key] = Admission(
            pools=tuple(p.name for p in granted[r.key]),
            position=position[r.key],
            waiting=len(waiting),
            contended=contended,
            set_aside=set_aside[r.key],
            message=message,
        )
    return QueueDecision(
        admissions=admissions,
        order=tuple(r.key for r in order),
        waiting=tuple(r.key for r in waiting),
        not_enough=tuple(r.key for r in queue_order(stalled)),
    )


class _FreeInOrder:
    """The free eligible pools no earlier request took, in name order. A request with no
    preference to apply takes the first ones (what ``prefer_pools`` answers then) without
    a walk over the rest, so a decision over a thousand requests and pools is not a
    thousand walks of a thousand pools."""

    def __init__(self, pools: Sequence[ShapePool]) -> None:
        self._pools = list(pools)
        self._taken: set[str] = set()
        self._start = 0  # every pool before it is taken
        self._any_maintenance = any(p.maintenance_at is not None for p in pools)

    def first_are_preferred(self, r: PoolRequest, together: bool) -> bool:
        """Whether ``prefer_pools`` would answer the first free pools for ``r``: no
        previous pools, capacity types, gang placement or maintenance to weigh."""
        return not (
            r.previous
            or r.capacity_types
            or together
            or (r.maintenance_before is not None and self._any_maintenance)
        )

    def left(self) -> list[ShapePool]:
        return [p for p in self._pools[self._start :] if p.name not in self._taken]

    def take_first(self, count: int) -> tuple[ShapePool, ...]:
        picks: list[ShapePool] = []
        i = self._start
        while len(picks) < count and i < len(self._pools):
            if self._pools[i].name not in self._taken:
                picks.append(self._pools[i])
            i += 1
        self.take(picks)
        return tuple(picks)

    def take(self, picks: Iterable[ShapePool]) -> None:
        self._taken.update(p.name for p in picks)
        while self._start < len(self._pools) and self._pools[self._start].name in self._taken:
            self._start += 1


def _needs(r: PoolRequest) -> list[int]:
    """The units each slice ``r`` misses takes, whole slices first: a slice that holds
    some of its units already takes the rest (the last, smaller need)."""
    full, rest = divmod(r.missing, r.per_slice)
    return [r.per_slice] * full + ([rest] if rest else [])


def _whole_slices(r: PoolRequest, units: int) -> int:
    """The most of ``units`` that make up whole slices of ``r``'s needs, in order."""
    if r.per_slice == 1:
        return units
    out = 0
    for need in _needs(r):
        if out + need > units:
            break
        out += need
    return out


def _block_picks(
    free: Sequence[ShapePool], r: PoolRequest, take: int, held: Sequence[ShapePool]
) -> tuple[tuple[ShapePool, ...], int]:
    """``take`` of ``free`` set aside for ``r``, whose slices each take ``per_slice`` units
    of one topology block (a dynamic slice's partitions): as many of its slices, in
    order, as fit whole (``partitions.choose_partitions``, preferring the blocks it holds
    units in), then the rest from the blocks it uses, then the fullest of free units
    (so a later request does not split what the head waits to complete). Also how many
    of the picks make up whole slices."""
    by_name = {p.name: p for p in free}
    stand_ins = [
        Partition(p.name, p.name, (), p.block, "HEALTHY", frozenset())
        for p in sorted(free, key=lambda p: p.name)
    ]
    needs = _needs(r)
    anchor = {p.block for p in held}
    chosen: tuple[tuple[str, ...], ...] = ()
    for k in range(len(needs), 0, -1):
        fit = choose_partitions(stand_ins, needs[:k], anchor_blocks=anchor)
        if fit is not None:
            chosen = fit
            break
    names = [name for ids in chosen for name in ids]
    whole = len(names)
    used = {by_name[n].block for n in names} | anchor
    counts: dict[str | None, int] = {}
    for p in free:
        counts[p.block] = counts.get(p.block, 0) + 1
    picked = set(names)
    rest = sorted(
        (p for p in free if p.name not in picked),
        key=lambda p: (p.block not in used, -counts[p.block], p.block or "", p.name),
    )
    names += [p.name for p in rest[: max(0, take - whole)]]
    return tuple(by_name[n] for n in names[:take]), min(whole, take)


def admission_for(decision: QueueDecision, key: ObjectKey) -> Admission:
    """The cluster's admission; one that wants nothing may claim nothing (a PerSlice
    replica KubeRay is about to remove on scale-down must not take a pool)."""
    return decision.admissions.get(key) or Admission(pools=())


def requests_by_shape(
    requests: Mapping[ObjectKey, tuple[Shape, PoolRequest]],
) -> dict[Shape, list[PoolRequest]]:
    """Group the shell's requests by shape (one decision per shape)."""
    out: dict[Shape, list[PoolRequest]] = {}
    for shape, request in requests.values():
        out.setdefault(shape, []).append(request)
    return out
