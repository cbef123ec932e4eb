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
from tpuslice.controller.cluster import elastic_count, live_desired, observed_of
from tpuslice.controller.statuswriter import generation
from tpuslice.model import constants as c
from tpuslice.model.convert import worker_replicas
from tpuslice.model.records import ClusterRef, Snapshot
from tpuslice.render.kuberay import render_rayservice
from tpuslice.spec.service import SliceServiceSpec, parse_service
from tpuslice.status.conditions import ClusterSlices, Stall, elastic_slices
from tpuslice.status.groups import (
    ONE_GROUP_FIELDS,
    CpuGroupObserved,
    TpuGroupObserved,
    group_entries,
    groups_ready,
)
from tpuslice.status.service import ServiceObserved, compute_service_status

__all__ = ["ServiceKind", "grouped_clusters", "service_clusters"]


def service_clusters(snap: Snapshot) -> list[str]:
    """The RayClusters of the service this pass plans for: those KubeRay has (not being
    deleted) and those whose pods are still there, by name."""
    names = {name for name, rc in snap.rayclusters.items() if not rc.get("deleting")}
    names |= {p.ray_cluster for p in snap.pods if p.ray_cluster}
    return sorted(names)


def grouped_clusters(
    parsed: SliceServiceSpec,
    body: Mapping[str, Any],
    snap: Snapshot,
    acted: Sequence[ActedSet],
    applied: Applied,
    stall: Stall | None,
    now: str,
) -> dict[str, ClusterSlices]:
    """Each RayCluster of a grouped service: its slices over every TPU group (counted
    together) and each group in its ``groups`` entries, as a grouped TPUSliceCluster's
    status.groups[] lists them."""
    by_cluster: dict[str, list[ActedSet]] = {}
    for each in acted:
        by_cluster.setdefault(each.slices.ref.ray_cluster, []).append(each)
    out: dict[str, ClusterSlices] = {}
    for name, sets in by_cluster.items():
        found = snap.rayclusters.get(name)
        cpu_groups = [
            CpuGroupObserved(g.name, g.desired_replicas(worker_replicas(found, g.name)))
            for g in parsed.cluster.cpu_groups
        ]
        tpu_groups = [
            TpuGroupObserved(
                one.slices.spec.group_name,
                one.slices.spec.shape.topology,
                observed_of(one.slices.spec, body, one.slices.snap, one.plan, applied, stall, now),
            )
            for one in sets
        ]
        out[name] = ClusterSlices(
            name,
            sum(
                one.slices.spec.slices if one.slices.desired is None else one.slices.desired
                for one in sets
            ),
            [s for one in sets for s in one.plan.slices],
            bool(found and found.get("state") == "ready"),
            groups=tuple(group_entries(tpu_groups, cpu_groups, now)),
            groups_ready=groups_ready(tpu_groups),
        )
    return out


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
        """A slice set per RayCluster (per TPU group of each, for spec.workerGroups), each
        seeing only its own pods. A service's status keeps slices per cluster, so no pool
        preference is read from it."""
        if parsed.cluster.grouped:
            return [
                SliceSet(
                    replace(ref, ray_cluster=name, group=group.group_name),
                    group,
                    replace(
                        snap,
                        pods=[
                            p
                            for p in snap.pods
                            if p.ray_cluster == name and p.group == group.group_name
                        ],
                        raycluster=snap.rayclusters.get(name),  # an elastic group's count
                    ),
                    {},
                    desired=live_desired(group, snap.rayclusters.get(name)),
                )
                for name in service_clusters(snap)
                for group in parsed.cluster.tpu_groups()
            ]
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
        if parsed.cluster.grouped:
            clusters = grouped_clusters(parsed, body, snap, acted, applied, stall, now)
        for each in [] if parsed.cluster.grouped else acted:
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
        status = compute_service_status(observed, previous, now)
        if parsed.cluster.grouped:  # the shape is each group's (status.*Cluster.groups)
            for key in ONE_GROUP_FIELDS:
                status.pop(key, None)
        return StatusOut(status)

    def invalid_status(
        self, body: Mapping[str, Any], stall: Stall, previous: Mapping[str, Any], now: str
    ) -> StatusOut:
        return StatusOut(compute_service_status(_invalid(body, stall), previous, now))
