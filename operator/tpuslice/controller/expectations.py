"""Our own writes that the watches have not shown yet: the expectations of one process.

A pass acts on a snapshot of the indexes, and a write of ours (a reservation
created, a pod released, a RayCluster applied) reaches the indexes only when
its watch event arrives, tens of milliseconds later. Without this record the
next pass, kicked by the write's own side effects, would read the old state
and write again (a second claim, a second patch). Each entry is dropped as
soon as the indexes show the write, or after ``TTL_SECONDS`` (a relist can skip
short-lived objects). It is never the truth: after a restart it is empty and
the next pass decides from the API server's state alone.

Pure: the caller passes the clock, so it is tested without sleeping.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from tpuslice.model.records import OwnerKey, PodInfo, ReservationInfo

__all__ = ["TTL_SECONDS", "PendingWrites"]

#: How long a write of ours may stay invisible in the indexes before we stop assuming it.
TTL_SECONDS = 30.0


@dataclass
class PendingWrites:
    """Writes not yet seen through the watches, each with the time (monotonic) it was made.

    ``created`` also holds a reservation read back after a lost claim (another
    holder's), so the re-plan of the same pass sees that pool as taken."""

    created: dict[str, tuple[ReservationInfo, float]] = field(default_factory=dict)
    deleted: dict[str, float] = field(default_factory=dict)
    released: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)  # phase Bound sent, per pool
    applied: dict[OwnerKey, tuple[str, float]] = field(default_factory=dict)  # by (kind, ns, name)

    # ------------------------------------------------------------ recording
    def reservation_created(self, info: ReservationInfo, now: float) -> None:
        self.created[info.pool] = (info, now)
        self.deleted.pop(info.pool, None)
        self.bound.pop(info.pool, None)

    def reservation_seen(self, info: ReservationInfo, now: float) -> None:
        """A reservation read back after AlreadyExists (ours from an earlier pass, or
        another's): the indexes will show it, the re-plan must see it now."""
        self.created[info.pool] = (info, now)

    def reservation_deleted(self, pool: str, now: float) -> None:
        self.deleted[pool] = now
        self.created.pop(pool, None)
        self.bound.pop(pool, None)

    def pod_released(self, namespace: str, name: str, pool: str, now: float) -> None:
        self.released[(namespace, name)] = (pool, now)

    def reservation_bound(self, pool: str, now: float) -> None:
        self.bound[pool] = now

    def ray_applied(self, key: OwnerKey, digest: str, now: float) -> None:
        """A RayCluster, RayJob or RayService (``key``: its kind, namespace, name) applied."""
        self.applied[key] = (digest, now)

    # ------------------------------------------------------------ reading
    def expire(self, now: float) -> None:
        def fresh(stamp: float) -> bool:
            return now - stamp <= TTL_SECONDS

        self.created = {k: v for k, v in self.created.items() if fresh(v[1])}
        self.released = {k: v for k, v in self.released.items() if fresh(v[1])}
        self.deleted = {k: v for k, v in self.deleted.items() if fresh(v)}
        self.bound = {k: v for k, v in self.bound.items() if fresh(v)}
        self.applied = {k: v for k, v in self.applied.items() if fresh(v[1])}

    def applied_digest(self, key: OwnerKey) -> str | None:
        """The hash of a KubeRay object we applied that the watch has not shown yet."""
        entry = self.applied.get(key)
        return entry[0] if entry else None

    def ray_seen(self, key: OwnerKey) -> None:
        self.applied.pop(key, None)

    def is_bound(self, pool: str) -> bool:
        return pool in self.bound

    def created_by(self, uid: str) -> set[str]:
        """Replica names of ``uid``'s reservations created but not yet indexed."""
        return {i.holder.replica_name for i, _ in self.created.values() if i.holder.uid == uid}

    def reservations(self, indexed: Iterable[ReservationInfo]) -> list[ReservationInfo]:
        """The indexed reservations with our unconfirmed creations and deletions applied;
        entries the index already shows are dropped."""
        seen = {r.pool: r for r in indexed}
        for pool in [p for p in self.bound if p in seen and seen[p].phase == "Bound"]:
            del self.bound[pool]
        for pool, (info, _) in list(self.created.items()):
            if pool in seen and seen[pool].holder == info.holder:
                del self.created[pool]
        for pool in [p for p in self.deleted if p not in seen]:
            del self.deleted[pool]
        merged = {p: r for p, r in seen.items() if p not in self.deleted}
        merged.update({p: info for p, (info, _) in self.created.items()})
        return list(merged.values())

    def pods(self, indexed: Iterable[PodInfo]) -> list[PodInfo]:
        """The indexed pods, those we released shown released (ungated, pinned)."""
        out = []
        for pod in indexed:
            key = (pod.namespace, pod.name)
            if key in self.released:
                if not pod.gated:
                    del self.released[key]
                else:
                    pod = replace(pod, gated=False, pinned_pool=self.released[key][0])
            out.append(pod)
        return out
