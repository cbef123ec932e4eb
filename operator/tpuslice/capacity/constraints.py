"""What capacity on demand allows the planner, computed before it plans (pure).

The planner knows node pools, reservations and the queue; capacity on demand adds
what only ProvisioningRequests say: a pool promised to another object's live
request, or whose capacity GKE revoked, is no one else's to claim; an object's
capacity ``nodeSelector`` narrows the pools it may take; a slice whose own request
is Provisioned prefers the pool the request names; and an object that asks for
capacity is never held back as NotEnoughPools (it takes the free pools it may and
asks for the rest). ``constraints`` reads all of it off the object's
``ProvisioningView`` once per pass; the shell applies it to the pool index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from tpuslice.capacity.requests import group_requests, lapsed, pool_matches_selector
from tpuslice.model import constants as c
from tpuslice.model.convert import timestamp
from tpuslice.model.records import Admission, NodeInfo, ProvisioningView
from tpuslice.spec.parts import SliceClusterSpec

__all__ = ["NO_CONSTRAINTS", "CapacityConstraints", "constraints"]


@dataclass(frozen=True)
class CapacityConstraints:
    """The planner's limits from capacity on demand for one object and pass."""

    #: pools no pass of this object may claim: promised to another object's request,
    #: or revoked (their nodes are about to be deleted)
    excluded: frozenset[str] = frozenset()
    #: a promised pool -> since when: of a single-host pool only the nodes made since are
    #: the other request's (the node units of ``allows``)
    promised_since: Mapping[str, datetime] = field(default_factory=dict)
    #: the capacity nodeSelector: a pool whose nodes lack these labels is not eligible
    node_selector: Mapping[str, str] = field(default_factory=dict)
    #: slice index -> the pool its own Provisioned request names
    preferred: Mapping[int, str] = field(default_factory=dict)
    #: the object asks for capacity: the queue's NotEnoughPools does not hold it back
    asks_for_capacity: bool = False

    @property
    def narrows(self) -> bool:
        return bool(self.excluded or self.node_selector)

    def allows(self, unit: str, nodes: Sequence[NodeInfo]) -> bool:
        """Whether the planner may use ``unit`` (of ``nodes``: a node pool, or one node)
        for this object."""
        if unit in self.excluded or not pool_matches_selector(nodes, self.node_selector):
            return False
        return not any(n.name == unit and self._promised(n) for n in nodes)

    def _promised(self, node: NodeInfo) -> bool:
        """A node of a pool promised elsewhere, made since the promise (at the same
        second too: creation stamps have whole seconds, so it may be the request's)."""
        since = self.promised_since.get(node.pool or "")
        if since is None:
            return False
        created = timestamp(node.created)
        return created is None or created >= since.replace(microsecond=0)

    def prefer(self, previous_pools: Mapping[int, str]) -> dict[int, str]:
        """Slice index -> preferred pool: the pool its own live request names first."""
        return {**previous_pools, **self.preferred}

    def admit(self, admission: Admission | None) -> Admission | None:
        """The queue's admission, without its NotEnoughPools stall for an object that
        asks for capacity."""
        if admission is not None and admission.stalled and self.asks_for_capacity:
            return None
        return admission


NO_CONSTRAINTS = CapacityConstraints()


def constraints(view: ProvisioningView, spec: SliceClusterSpec) -> CapacityConstraints:
    """The limits ``view`` (the object's requests, and the pools other objects' requests
    name) puts on planning ``spec``'s slices."""
    prov = spec.provisioning
    asks = prov is not None and prov.enabled
    preferred: dict[int, str] = {}
    if asks or view.requests:
        newest, _ = group_requests(view.requests)
        for (_, index), request in newest.items():
            pool = request.node_pool
            if pool and request.is_true(c.PROVREQ_PROVISIONED) and not lapsed(request):
                preferred[index] = pool
    return CapacityConstraints(
        excluded=view.promised_elsewhere | view.revoked_pools,
        promised_since=view.promised_since,
        node_selector=dict(prov.node_selector) if prov is not None and asks else {},
        preferred=preferred,
        asks_for_capacity=asks,
    )
