"""The one registry of TPUSlice kinds: each kind's adapter of the pass. Every table that
dispatches on a kind (the reconcilers, kopf's handlers) is derived from it."""

from __future__ import annotations

from collections.abc import Mapping

from tpuslice.controller.adapter import KindAdapter
from tpuslice.controller.cluster import ClusterKind
from tpuslice.controller.job import JobKind
from tpuslice.controller.service import ServiceKind

__all__ = ["KINDS"]

#: kind -> its adapter, in the order the operator starts following them.
KINDS: Mapping[str, KindAdapter] = {
    adapter.kind: adapter for adapter in (ClusterKind(), JobKind(), ServiceKind())
}
