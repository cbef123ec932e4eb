"""Our own writes that the watches have not shown yet: the expectations of one process.

A pass acts on a snapshot of the indexes, and a write of ours (a reservation
created or deleted, a pod released, a KubeRay object applied, a
ProvisioningRequest created, deleted or marked retired, a reservation's pin mark)
reaches the indexes only when its watch event arrives, tens of milliseconds later.
Without this record the next pass, kicked by the write's own side effects, would
read the old state and write again (a second claim, a second patch, a second
request). It is never the truth: after a restart it is empty and the next pass decides from the API
server's state alone.

One store serves every kind and every shape, while each pass reads it through a
view of its own (one shape's reservations, one object's requests). So reading
never changes it: a view that does not show an entry proves nothing about it.
Entries go only in explicit steps: ``observed`` (a view shows the write took
effect), ``reservation_gone`` (the watch's delete event) and ``expire`` (older than
``TTL_SECONDS``: a relist can skip short-lived objects).

Pure: the caller passes the clock, so it is tested without sleeping.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from tpuslice.model.records import (
    ObjectKey,
    PodInfo,
    ProvisioningRequestInfo,
    ReservationInfo,
    Reservations,
)

__all__ = ["TTL_SECONDS", "Expectations"]

#: How long a write of ours may stay invisible in the indexes before we stop assuming it.
TTL_SECONDS = 30.0

RequestKey = tuple[str, str]  # a ProvisioningRequest's (namespace, name)


@dataclass
class Expectations:
    """Writes not yet seen through the watches, each with the time (monotonic) it was made.

    ``created`` also holds a reservation read back after a lost claim (another
    holder's), so the re-plan of the same pass sees that pool as taken. ``deleted``
    holds the uid of the reservation deleted: only that one is hidden, a newer claim
    of the pool shows."""

    created: dict[str, tuple[ReservationInfo, float]] = field(default_factory=dict)
    deleted: dict[str, tuple[str, float]] = field(default_factory=dict)
    released: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)  # phase Bound sent, per pool
    #: pods of a drained slice deleted (shown deleting until the watch shows it)
    pods_deleted: dict[tuple[str, str], float] = field(default_factory=dict)
    applied: dict[ObjectKey, tuple[str, float]] = field(default_factory=dict)  # by (kind, ns, name)
    #: ProvisioningRequests: created (with their owner), deleted, marked retired (its pool)
    requests_created: dict[RequestKey, tuple[ObjectKey, ProvisioningRequestInfo, float]] = field(
        default_factory=dict
    )
    requests_deleted: dict[RequestKey, tuple[ObjectKey, float]] = field(default_factory=dict)
    requests_retired: dict[RequestKey, tuple[str, float]] = field(default_factory=dict)
    #: a reservation's pin-at-admission mark written (value, removal time, when written)
    pins: dict[str, tuple[bool, str, float]] = field(default_factory=dict)

    # ------------------------------------------------------------ recording
    def reservation_created(self, info: ReservationInfo, now: float) -> None:
        self.created[info.pool] = (info, now)
        self.deleted.pop(info.pool, None)
        self.bound.pop(info.pool, None)

    def reservation_seen(self, info: ReservationInfo, now: float) -> None:
        """A reservation read back after AlreadyExists (ours from an earlier pass, or
        another's): the indexes will show it, the re-plan must see it now."""
        self.created[info.pool] = (info, now)

    def reservation_deleted(self, pool: str, now: float, uid: str = "") -> None:
        """The reservation ``uid`` of ``pool`` deleted ("" when unknown: any of the pool)."""
        self.deleted[pool] = (uid, now)
        self.created.pop(pool, None)
        self.bound.pop(pool, None)

    def pin_written(self, pool: str, pinned: bool, removed_at: str, now: float) -> None:
        """The pin-at-admission mark of ``pool``'s reservation set (or removed at
        ``removed_at``): the next pass must not write it again, nor miss a removal."""
        self.pins[pool] = (pinned, removed_at, now)

    def pod_released(self, namespace: str, name: str, pool: str, now: float) -> None:
        self.released[(namespace, name)] = (pool, now)

    def pod_deleted(self, namespace: str, name: str, now: float) -> None:
        """A pod of a drained slice deleted: the next pass must not drain it again."""
        self.pods_deleted[(namespace, name)] = now

    def reservation_bound(self, pool: str, now: float) -> None:
        self.bound[pool] = now

    def ray_applied(self, key: ObjectKey, digest: str, now: float) -> None:
        """A RayCluster, RayJob or RayService (``key``: its kind, namespace, name) applied."""
        self.applied[key] = (digest, now)

    def request_created(self, owner: ObjectKey, info: ProvisioningRequestInfo, now: float) -> None:
        key = (info.namespace, info.name)
        self.requests_created[key] = (owner, info, now)
        self.requests_deleted.pop(key, None)

    def request_deleted(self, owner: ObjectKey, namespace: str, name: str, now: float) -> None:
        self.requests_deleted[(namespace, name)] = (owner, now)
        self.requests_created.pop((namespace, name), None)

    def request_retired(self, namespace: str, name: str, pool: str, now: float) -> None:
        """A CapacityRevoked request kept, marked retired with the pool it ran on."""
        self.requests_retired[(namespace, name)] = (pool, now)

    # ------------------------------------------------------------ forgetting
    def expire(self, now: float) -> None:
        """Forget every write older than ``TTL_SECONDS``."""

        def fresh(stamp: float) -> bool:
            return now - stamp <= TTL_SECONDS

        self.created = {k: v for k, v in self.created.items() if fresh(v[1])}
        self.released = {k: v for k, v in self.released.items() if fresh(v[1])}
        self.deleted = {k: v for k, v in self.deleted.items() if fresh(v[1])}
        self.bound = {k: v for k, v in self.bound.items() if fresh(v)}
        self.pods_deleted = {k: v for k, v in self.pods_deleted.items() if fresh(v)}
        self.applied = {k: v for k, v in self.applied.items() if fresh(v[1])}
        self.requests_created = {k: v for k, v in self.requests_created.items() if fresh(v[2])}
        self.requests_deleted = {k: v for k, v in self.requests_deleted.items() if fresh(v[1])}
        self.requests_retired = {k: v for k, v in self.requests_retired.items() if fresh(v[1])}
        self.pins = {k: v for k, v in self.pins.items() if fresh(v[2])}

    def observed(
        self,
        reservations: Iterable[ReservationInfo] = (),
        pods: Iterable[PodInfo] = (),
    ) -> None:
        """Forget the writes these indexed objects show took effect: a reservation
        created (shown with its holder), the phase Bound (shown Bound), a pod released
        (shown ungated), a deleted pool's newer reservation (shown with another uid).
        What a view does not show proves nothing (it may be another shape's).

        Only the units with an entry are looked up in the view: a pass reads every
        reservation of its shape, and a walk over them all in every pass would make a
        restart's first passes O(N²) over a shape."""
        pools = {*self.created, *self.bound, *self.deleted, *self.pins}
        shown = Reservations.of(reservations)
        for pool in pools:
            r = shown.get(pool)
            if r is None:
                continue
            made = self.created.get(r.pool)
            if made is not None and made[0].holder == r.holder:
                del self.created[r.pool]
            if r.phase == "Bound":
                self.bound.pop(r.pool, None)
            gone = self.deleted.get(r.pool)
            if gone is not None and gone[0] and r.uid and r.uid != gone[0]:
                del self.deleted[r.pool]
            pin = self.pins.get(r.pool)
            if pin is not None and pin[0] == r.pinned:
                del self.pins[r.pool]
        for pod in pods:
            if not pod.gated:
                self.released.pop((pod.namespace, pod.name), None)
            if pod.deleting:
                self.pods_deleted.pop((pod.namespace, pod.name), None)

    def reservation_gone(self, pool: str, uid: str = "") -> None:
        """The watch showed the reservation ``uid`` of ``pool`` deleted."""
        self.pins.pop(pool, None)
        gone = self.deleted.get(pool)
        if gone is not None and (not gone[0] or not uid or gone[0] == uid):
            del self.deleted[pool]

    def requests_observed(self, owner: ObjectKey, shown: Iterable[ProvisioningRequestInfo]) -> None:
        """Forget the request writes ``shown`` (every request of ``owner``, as indexed)
        proves: a created one shown, a deleted one of ``owner`` not shown any more, a
        retired one shown retired."""
        listed = list(shown)
        keys = {(r.namespace, r.name) for r in listed}
        for key in [k for k in self.requests_created if k in keys]:
            del self.requests_created[key]
        for key, (gone_owner, _) in list(self.requests_deleted.items()):
            if gone_owner == owner and key not in keys:
                del self.requests_deleted[key]
        for r in listed:
            if r.retired:
                self.requests_retired.pop((r.namespace, r.name), None)

    def ray_seen(self, key: ObjectKey) -> None:
        self.applied.pop(key, None)

    # ------------------------------------------------------------ reading (pure)
    def applied_digest(self, key: ObjectKey) -> str | None:
        """The hash of a KubeRay object we applied that the watch has not shown yet."""
        entry = self.applied.get(key)
        return entry[0] if entry else None

    def is_bound(self, pool: str) -> bool:
        return pool in self.bound

    def created_by(self, uid: str) -> set[str]:
        """Replica names of ``uid``'s reservations created but not yet indexed."""
        return {i.holder.replica_name for i, _ in self.created.values() if i.holder.uid == uid}

    def reservations(self, indexed: Iterable[ReservationInfo]) -> Reservations:
        """The indexed reservations with our unconfirmed creations and deletions applied
        (a creation the index already shows reads as the index has it).

        A view (``Reservations``) that merges only what is read of it: the whole list at
        its first read, one holder's reservations (``held_by``) from the index's by
        holder and the entries of that holder alone. It holds copies of the entries as
        they are now, so a write recorded later never changes a view already read."""
        shown = Reservations.of(indexed)
        if not (self.created or self.deleted or self.pins):
            return shown  # nothing unconfirmed: the index as it is
        created = {pool: info for pool, (info, _) in self.created.items()}
        deleted = {pool: uid for pool, (uid, _) in self.deleted.items()}
        pins = {pool: (pinned, removed_at) for pool, (pinned, removed_at, _) in self.pins.items()}

        def merged(
            seen: Iterable[ReservationInfo], claimed: Mapping[str, ReservationInfo]
        ) -> list[ReservationInfo]:
            by_pool = {r.pool: r for r in seen}
            out = {p: r for p, r in by_pool.items() if not _hidden(deleted, r)}
            for pool, info in claimed.items():
                if pool not in by_pool or by_pool[pool].holder != info.holder:
                    out[pool] = info
                else:
                    out[pool] = by_pool[pool]
            for pool, (pinned, removed_at) in pins.items():
                if pool in out and out[pool].pinned != pinned:
                    out[pool] = replace(
                        out[pool], pinned=pinned, unpinned_at=removed_at or out[pool].unpinned_at
                    )
            return list(out.values())

        def held(uid: str) -> list[ReservationInfo]:
            # a creation for another holder of a unit this holder is shown with takes the
            # unit from it, as in the whole list
            mine = {p: i for p, i in created.items() if i.holder.uid == uid}
            taken = {p for p, i in created.items() if i.holder.uid != uid}
            own = [r for r in shown.held_by(uid) if r.pool not in taken]
            return merged(own, mine)

        return Reservations(lambda: merged(shown, created), held)

    def pods(self, indexed: Iterable[PodInfo]) -> list[PodInfo]:
        """The indexed pods, those we released and the index shows gated shown released
        (ungated, pinned), and those we deleted shown deleting."""
        out = []
        for pod in indexed:
            entry = self.released.get((pod.namespace, pod.name))
            if entry is not None and pod.gated:
                pod = replace(pod, gated=False, pinned_pool=entry[0])
            if not pod.deleting and (pod.namespace, pod.name) in self.pods_deleted:
                pod = replace(pod, deleting=True)
            out.append(pod)
        return out

    def requests(
        self, owner: ObjectKey, shown: Iterable[ProvisioningRequestInfo]
    ) -> list[ProvisioningRequestInfo]:
        """``owner``'s indexed requests as they will be once the watch shows our writes:
        one we created is there, one we deleted is not, one we retired reads retired."""
        listed = [r for r in shown if (r.namespace, r.name) not in self.requests_deleted]
        out = [
            replace(r, revoked_pool=self.requests_retired[(r.namespace, r.name)][0])
            if (r.namespace, r.name) in self.requests_retired and not r.retired
            else r
            for r in listed
        ]
        keys = {(r.namespace, r.name) for r in listed}
        out += [
            info
            for key, (o, info, _) in self.requests_created.items()
            if o == owner and key not in keys
        ]
        return out


def _hidden(deleted: Mapping[str, str], r: ReservationInfo) -> bool:
    """Whether our deletion of ``r``'s unit hides it: the uid deleted is ``r``'s (or
    either is unknown)."""
    gone = deleted.get(r.pool)
    return gone is not None and (not gone or not r.uid or gone == r.uid)
