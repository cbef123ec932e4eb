"""The TPUSliceService adapter of the pass: the RayService applied, each of its RayClusters'
slices a slice set of its own, upgrades that never take the serving cluster's pools.

KubeRay makes a RayCluster for the RayService and, on an upgrade (a changed
cluster spec with ``upgradeStrategy: NewCluster``), a second, pending one; it
switches traffic once the pending cluster serves, and deletes the old one after
``rayClusterDeletionDelaySeconds``. The clusters are found by the
``tpuslice.dev/service`` label KubeRay copies onto them, and their pods by the
``ray.io/cluster`` label, never by names being equal. What differs from a
TPUSliceCluster:

1. the RayService is parsed and rendered (``spec.service.parse_service``,
   ``render.kuberay.render_rayservice``);
2. each RayCluster is a slice set of its own (``ClusterRef.ray_cluster``; its
   reservations carry ``spec.holder.rayCluster``): the pending cluster's slices
   claim free pools of the shape through the same queue as every other object,
   and the pools of the active cluster, whose pods are pinned, are never given
   back or taken; with no free pool the pending cluster waits and the status says
   ``UpgradeWaitingForCapacity`` while the active cluster keeps serving. The pools
   of a RayCluster KubeRay has deleted are given back by the pass once its pods are
   gone (no slice set holds them any more);
3. the status is ``status.service.compute_service_status``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from tpuslice.controller.adapter import (
    ActedSet,
    OwnsKubeRayObject,
    SliceSet,
    StatusOut,
    unparsed_fields,
)
from tpuslice.controller.applier import Applied
from tpuslice.controller.cluster import elastic_count, live_desired
from tpuslice.controller.statuswriter import generation
from tpuslice.model import constants as c
from tpuslice.model.convert import worker_replicas
from tpuslice.model.records import ClusterRef, Snapshot
from tpuslice.render.kuberay import render_rayservice
from tpuslice.spec.service import SliceServiceSpec, parse_service
from tpuslice.status.conditions import ClusterSlices, Stall, elastic_slices
from tpuslice.status.service import ServiceObserved, compute_service_status

__all__ = ["ServiceKind", "service_clusters"]


def service_clusters(snap: Snapshot) -> list[str]:
    """The RayClusters of the service this pass plans for: those KubeRay has (not being
    deleted) and those whose pods are still there, by name."""
    names = {name for name, rc in snap.rayclusters.items() if not rc.get("deleting")}
    names |= {p.ray_cluster for p in snap.pods if p.ray_cluster}
    return sorted(names)


def _invalid(body: Mapping[str, Any], stall: Stall) -> ServiceObserved:
    return ServiceObserved(
        **unparsed_fields(body, stall),
        ray_service=str((body.get("metadata") or {}).get("name", "")),
        ray_service_status=None,
        clusters={},
    )


class ServiceKind(OwnsKubeRayObject):
    """TPUSliceService: the RayService of its name, a slice set per RayCluster of it."""

    kind = c.KIND_SERVICE

    def parse(self, body: Mapping[str, Any]) -> SliceServiceSpec:
        return parse_service(body)

    def render(self, parsed: SliceServiceSpec, templates: Any) -> dict[str, Any]:
        return render_rayservice(parsed, templates)

    def slice_sets(
        self,
        ref: ClusterRef,
        parsed: SliceServiceSpec,
        snap: Snapshot,
        previous: Mapping[str, Any],
    ) -> list[SliceSet]:
        """A slice set per RayCluster, each seeing only its own pods. A service's status
        keeps slices per cluster, so no pool preference is read from it."""
        return [
            SliceSet(
                replace(ref, ray_cluster=name),
                parsed.cluster,
                replace(snap, pods=[p for p in snap.pods if p.ray_cluster == name]),
                {},
                desired=live_desired(parsed.cluster, snap.rayclusters.get(name)),
            )
            for name in service_clusters(snap)
        ]

    def status(
        self,
        parsed: SliceServiceSpec,
        body: Mapping[str, Any],
        snap: Snapshot,
        acted: Sequence[ActedSet],
        applied: Applied,
        stall: Stall | None,
        previous: Mapping[str, Any],
        now: str,
    ) -> StatusOut:
        clusters: dict[str, ClusterSlices] = {}
        for each in acted:
            name = each.slices.ref.ray_cluster
            found = snap.rayclusters.get(name)
            elastic = parsed.cluster.elastic
            desired = parsed.cluster.desired_slices(worker_replicas(found))
            clusters[name] = elastic_slices(
                name,
                desired,
                each.plan.slices,
                bool(found and found.get("state") == "ready"),
                None if elastic is None else (elastic.min_slices, elastic.max_slices),
            )
            if elastic is not None:
                shown = clusters[name].slices
                count = elastic_count(elastic, desired, shown, found, each.slices.snap.pods, now)
                clusters[name] = replace(clusters[name], elastic=count)
        ray_status = (snap.owned or {}).get("status") if snap.owned is not None else None
        observed = ServiceObserved(
            generation=generation(body),
            accelerator_type=parsed.cluster.shape.accelerator_type,
            hosts_per_slice=parsed.cluster.shape.hosts,
            chips_per_host=parsed.cluster.shape.chips_per_host,
            ray_service=parsed.name,
            desired_slices=parsed.cluster.slices,
            ray_service_status=ray_status,
            clusters=clusters,
            gated=parsed.cluster.gated,
            applied=applied.ok,
            stall=stall,
        )
        # Per-slice events are a TPUSliceCluster's and TPUSliceJob's: a service's status
        # keeps slices per cluster, and the conditions say where an upgrade stands.
        return StatusOut(compute_service_status(observed, previous, now))

    def invalid_status(
        self, body: Mapping[str, Any], stall: Stall, previous: Mapping[str, Any], now: str
    ) -> StatusOut:
        return StatusOut(compute_service_status(_invalid(body, stall), previous, now))
