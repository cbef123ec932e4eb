"""What a kind says to the one pass: the adapter each TPUSlice kind implements.

The pass (``reconciler.Reconciler``) is the same for every kind: read, backoff,
parse, render, apply, act on each slice set, give back what no slice set holds,
status, failure handling. A kind says only what differs, in the shape of Kueue's
``jobframework.GenericJob``: how its spec is parsed and rendered, which KubeRay
object it owns, its slice sets, and its status.

A slice set is the unit the pass acts on: one worker group's slices of one shape,
with the holder their reservations name, the capacity unit each slice takes (a
whole node pool today) and the gang rule of the spec. A TPUSliceCluster and a
TPUSliceJob have one; a TPUSliceService has one per RayCluster KubeRay keeps for it
(the active one and an upgrade's pending one). New shapes of capacity plug in here:
several worker groups are several slice sets of one object, an elastic count is a
slice set whose desired count moves, a single-host slice or a GKE dynamic slice is
another capacity unit of a slice set; none of them is a new copy of the pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tpuslice.controller.applier import Applied
from tpuslice.controller.statuswriter import generation
from tpuslice.model.records import ClusterRef, SlicePlan, SliceStatus, Snapshot
from tpuslice.spec.parts import OwnedClusterSpec, SliceClusterSpec
from tpuslice.status.conditions import Stall

__all__ = [
    "ActedSet",
    "KindAdapter",
    "OwnsKubeRayObject",
    "SliceSet",
    "StatusOut",
    "unparsed_fields",
    "unparsed_slices",
]


@dataclass(frozen=True)
class SliceSet:
    """One set of slices the pass plans and acts on as a whole."""

    ref: ClusterRef  # the holder its reservations name
    spec: SliceClusterSpec  # shape, slice count, gang and reservation rules
    snap: Snapshot  # the part of the object's snapshot this set sees (its pods)
    previous: Mapping[str, Any]  # the status its pools are preferred from
    desired: int | None = None  # None: the spec's count (none when suspended)
    keep_pools: bool = False  # keep a slice's pool while its pods are replaced


@dataclass(frozen=True)
class ActedSet:
    """A slice set and its plan as it stands after the pass acted on it."""

    slices: SliceSet
    plan: SlicePlan


@dataclass(frozen=True)
class StatusOut:
    """The status a kind computed, and the slices whose transitions become events."""

    status: dict[str, Any]
    slices: Sequence[SliceStatus] = ()


class KindAdapter(Protocol):
    """What a TPUSlice kind tells the pass (``reconciler.Reconciler``)."""

    #: The kind of the object (``constants.KIND_*``).
    kind: str
    #: Whether the pass counts the object's first apply in
    #: ``tpuslice_raycluster_creation_seconds`` (the TPUSliceCluster's own RayCluster).
    counts_creation: bool

    def parse(self, body: Mapping[str, Any]) -> Any:
        """The parsed spec (raises ``SpecError`` naming the field)."""
        ...

    def cluster_spec(self, parsed: Any) -> SliceClusterSpec:
        """The cluster parts of a parsed spec (its shape, for the queue)."""
        ...

    def render(self, parsed: Any, templates: Any) -> dict[str, Any]:
        """The KubeRay object to apply (raises ``SpecError``)."""
        ...

    def owned(self, snap: Snapshot) -> Mapping[str, Any] | None:
        """The KubeRay object of this kind as the snapshot shows it."""
        ...

    def slice_sets(
        self, ref: ClusterRef, parsed: Any, snap: Snapshot, previous: Mapping[str, Any]
    ) -> list[SliceSet]:
        """The slice sets the pass acts on now."""
        ...

    def status(
        self,
        parsed: Any,
        body: Mapping[str, Any],
        snap: Snapshot,
        acted: Sequence[ActedSet],
        applied: Applied,
        stall: Stall | None,
        previous: Mapping[str, Any],
        now: str,
    ) -> StatusOut:
        """The status after a pass that parsed the spec."""
        ...

    def invalid_status(
        self, body: Mapping[str, Any], stall: Stall, previous: Mapping[str, Any], now: str
    ) -> StatusOut:
        """The status of an object whose spec cannot be parsed or rendered."""
        ...


class OwnsKubeRayObject:
    """What a TPUSliceJob's and a TPUSliceService's adapters share: the KubeRay object they
    own (a RayJob, a RayService) is not a RayCluster, KubeRay makes the RayClusters, and
    the spec's cluster parts sit under ``cluster`` (``spec.parts.OwnedClusterSpec``)."""

    counts_creation = False

    def cluster_spec(self, parsed: OwnedClusterSpec) -> SliceClusterSpec:
        return parsed.cluster

    def owned(self, snap: Snapshot) -> Mapping[str, Any] | None:
        return snap.owned


def unparsed_fields(body: Mapping[str, Any], stall: Stall) -> dict[str, Any]:
    """What every kind's observed record holds for a spec that cannot be parsed: no
    shape is known, nothing was applied, only the stall and the count asked for."""
    return {
        "generation": generation(body),
        "accelerator_type": "",
        "hosts_per_slice": 0,
        "chips_per_host": 0,
        "desired_slices": unparsed_slices(body),
        "gated": False,
        "applied": False,
        "stall": stall,
    }


def unparsed_slices(body: Mapping[str, Any]) -> int:
    """``spec.tpu.slices`` of an object whose spec cannot be parsed, when it is a count,
    else 1: what the status of any kind reports as desired next to the stall."""
    spec = body.get("spec")
    tpu = spec.get("tpu") if isinstance(spec, Mapping) else None
    slices = tpu.get("slices") if isinstance(tpu, Mapping) else None
    return slices if isinstance(slices, int) and slices >= 0 else 1
