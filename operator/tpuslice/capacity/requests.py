"""Capacity on demand: an object's requests as a whole, pure.

Which request of each slice is the one ``decide`` is about (``group_requests``),
the history a status keeps of them, the pools live requests promise, which waiting
slices ask at all, and whether a pool has the capacity labels asked for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tpuslice.model import constants as c
from tpuslice.model.records import (
    NodeInfo,
    ProvisioningRequestInfo,
    SliceProvisioning,
)

__all__ = [
    "group_requests",
    "history_from_status",
    "lapsed",
    "pool_matches_selector",
    "promised_pools",
    "slices_to_provision",
]


def history_from_status(status: Mapping[str, Any]) -> dict[int, SliceProvisioning]:
    """status.slices[].provisioning by slice index: the attempt and failure count to go
    on from when a slice has no request (deleted by us between attempts, or by someone)."""
    out: dict[int, SliceProvisioning] = {}
    for entry in status.get("slices") or []:
        prov = entry.get("provisioning") if isinstance(entry, Mapping) else None
        index = entry.get("index") if isinstance(entry, Mapping) else None
        if not isinstance(prov, Mapping) or not isinstance(index, int):
            continue
        try:
            out[index] = SliceProvisioning(
                request=str(prov.get("request") or ""),
                attempt=int(prov.get("attempt") or 0),
                failures=int(prov.get("failures") or 0),
            )
        except (TypeError, ValueError):
            continue
    return out


def group_requests(
    requests: Iterable[ProvisioningRequestInfo],
) -> tuple[dict[tuple[str, int], ProvisioningRequestInfo], list[ProvisioningRequestInfo]]:
    """Our requests of one TPUSlice object by slice, (raycluster, slice index) -> the
    newest attempt (the one ``decide`` is about), and the rest: older attempts of a
    slice, retired requests (``ProvisioningRequestInfo.retired``) and requests without
    our labels, which the shell deletes (a retired one once its pool has no nodes). A
    key with no live slice is decided with ``SliceFacts(index, raycluster,
    exists=False)``."""
    newest: dict[tuple[str, int], ProvisioningRequestInfo] = {}
    extra: list[ProvisioningRequestInfo] = []
    for request in sorted(requests, key=lambda r: (r.attempt, r.name)):
        if request.slice_index is None or not request.raycluster or request.retired:
            extra.append(request)
            continue
        key = (request.raycluster, request.slice_index)
        if key in newest:
            extra.append(newest[key])
        newest[key] = request
    return newest, [r for r in extra if not r.deleting]


def lapsed(request: ProvisioningRequestInfo) -> bool:
    """Whether the request's capacity is over: Failed, its booking expired, or revoked."""
    return any(
        request.is_true(kind)
        for kind in (c.PROVREQ_FAILED, c.PROVREQ_BOOKING_EXPIRED, c.PROVREQ_CAPACITY_REVOKED)
    )


def promised_pools(requests: Iterable[ProvisioningRequestInfo]) -> dict[str, str]:
    """Node pools a live provisioned request names (queued class): pool -> request name.

    A fresh queued pool is free and eligible to every slice of its shape the moment its
    nodes are Ready, so another waiting cluster could claim it first (Kueue met the same:
    kubernetes-sigs/kueue#9048). The planner should keep these pools for the slice whose
    request names them and out of everyone else's eligible set. Other classes name no
    pool (capacity-facts.md section 2), so their fresh pools cannot be promised."""
    out: dict[str, str] = {}
    for request in requests:
        pool = request.node_pool
        live = not lapsed(request) and not request.deleting
        if pool and request.is_true(c.PROVREQ_PROVISIONED) and live:
            out[pool] = request.name
    return out


def slices_to_provision(waiting: Iterable[int], free_pools: int) -> frozenset[int]:
    """Of the slices that wait for a pool (all pods created, no pool held), those that
    should ask for capacity: all but the first ``free_pools`` by index, which the
    existing free pools will serve (an AllSlices gang claims none of them until it can
    claim all, so its slices all wait while some pools are free)."""
    ordered = sorted(set(waiting))
    return frozenset(ordered[max(0, free_pools) :])


def pool_matches_selector(nodes: Iterable[NodeInfo], selector: Mapping[str, str]) -> bool:
    """Whether every node of a pool carries the capacity labels ``selector`` asks for
    (pods selecting them could not run elsewhere, so other pools are not eligible)."""
    if not selector:
        return True
    nodes = list(nodes)
    return bool(nodes) and all(
        all(n.capacity_labels.get(k) == v for k, v in selector.items()) for n in nodes
    )
