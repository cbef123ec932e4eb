"""Which reservations the orphan sweep may delete: pure rules, no API calls.

A reservation outlives its holder when the holder was deleted while the
operator was down, or its finalizer was removed by hand. The sweep gives such
pools back, but only pools whose holder this instance can see: a
namespace-scoped instance must never judge holders in namespaces it does not
watch (their clusters and pods only look gone from here).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from tpuslice.model.records import Holder, ReservationInfo

__all__ = ["is_orphan", "orphans", "watches_namespace"]


def watches_namespace(namespaces: Collection[str], namespace: str) -> bool:
    """Whether an instance watching ``namespaces`` (empty: every namespace) sees
    ``namespace``: its TPUSliceClusters and pods, so whether it can know a holder there."""
    return not namespaces or namespace in namespaces


def is_orphan(
    holder: Holder,
    live_uid: str | None,
    replica_pods: bool,
    namespaces: Collection[str],
) -> bool:
    """Whether the sweep may delete a reservation of ``holder``: it is in a namespace this
    instance watches (otherwise its cluster and pods are invisible here and only look
    gone: a namespace-scoped instance deleted the live reservations of every other
    namespace), the object of that kind and name there is gone or another one
    (``live_uid``), and no pod of the slice is left (terminating pods still hold chips)."""
    if not watches_namespace(namespaces, holder.namespace):
        return False
    return live_uid != holder.uid and not replica_pods


def orphans(
    reservations: Iterable[ReservationInfo],
    live_uid: Callable[[Holder], str | None],
    replica_has_pods: Callable[[Holder], bool],
    namespaces: Collection[str],
) -> list[ReservationInfo]:
    """The reservations the sweep deletes now, in pool order: ``live_uid`` gives the uid of
    the object (of the holder's kind) of the holder's name (None: none),
    ``replica_has_pods`` whether any pod of the holder's slice is left."""
    return sorted(
        (
            r
            for r in reservations
            if is_orphan(
                r.holder,
                live_uid(r.holder),
                replica_has_pods(r.holder),
                namespaces,
            )
        ),
        key=lambda r: r.pool,
    )
