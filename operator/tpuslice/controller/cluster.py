"""The TPUSliceCluster adapter of the pass: one RayCluster of the object's name, one
slice set (one per TPU group of spec.workerGroups), and the TPUSliceCluster status
(``status.conditions.compute_status``; ``status.groups.grouped_status`` for groups)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from tpuslice.controller.adapter import ActedSet, SliceSet, StatusOut, unparsed_fields
from tpuslice.controller.applier import Applied
from tpuslice.controller.statuswriter import generation
from tpuslice.model import constants as c
from tpuslice.model.convert import rfc3339, timestamp, worker_replicas
from tpuslice.model.records import (
    ClusterRef,
    KueueView,
    KueueWorkload,
    PodInfo,
    SlicePlan,
    SliceStatus,
    Snapshot,
)
from tpuslice.planning.elastic import (
    limit_seconds,
    named_for_deletion,
    timed_out,
    workers_to_delete,
)
from tpuslice.render.kuberay import render_raycluster
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.parts import ElasticSpec, SliceClusterSpec
from tpuslice.status.conditions import (
    ElasticCount,
    Observed,
    Stall,
    as_requested,
    compute_status,
)
from tpuslice.status.groups import CpuGroupObserved, TpuGroupObserved, grouped_status
from tpuslice.status.kueue import (
    kueue_view,
    with_admission,
    with_eviction_deadline,
    with_scale_up_wait,
)

__all__ = [
    "ClusterKind",
    "admitted_snapshot",
    "elastic_count",
    "group_previous",
    "kueue_of",
    "live_desired",
    "observed_of",
    "stalled_observation",
]


def live_desired(spec: SliceClusterSpec, raycluster: Mapping[str, Any] | None) -> int | None:
    """The slices a set of ``raycluster`` wants in this pass: None (the spec's count) for a
    fixed set; for an elastic one the autoscaler's live ``replicas`` clamped to the range,
    none when suspended."""
    if spec.elastic is None:
        return None
    return 0 if spec.suspend else spec.desired_slices(worker_replicas(raycluster, spec.group_name))


def kueue_of(
    spec: SliceClusterSpec,
    raycluster: Mapping[str, Any] | None,
    workload: KueueWorkload | None = None,
    gate: str = "",
) -> KueueView | None:
    """Kueue's hold on the TPUSliceCluster's RayCluster (``status.kueue.kueue_view``)."""
    queue = spec.kueue.queue_name if spec.kueue is not None else ""
    return kueue_view(queue, c.RAY_KIND_CLUSTER, spec.name, raycluster, workload, gate)


def admitted_snapshot(snap: Snapshot, held: bool) -> Snapshot:
    """The snapshot a slice set plans from: pods Kueue still gates are not there yet, and
    while Kueue holds the object (``held``) no pod that still waits for a pool is either,
    so nothing is claimed or released for it (the planner claims for every slice whose
    pods exist). Pods already released stay: their pools are kept until they are gone."""

    # a slice any of whose pods Kueue still gates (an elastic scale-up Kueue has not
    # admitted; Kueue ungates them one by one) is left out whole, so no claim is made
    # for it on the pods Kueue ungated first
    gated = {_replica_key(p) for p in snap.pods if p.kueue_gated}

    def waits(pod: PodInfo) -> bool:
        return pod.kueue_gated or _replica_key(pod) in gated or (held and pod.gated)

    if not any(waits(p) for p in snap.pods):
        return snap
    return replace(snap, pods=[p for p in snap.pods if not waits(p)])


def _replica_key(pod: PodInfo) -> tuple[str, str, str]:
    """The slice a pod belongs to: its RayCluster, group and replica (its own name when
    it has no replica, so an unindexed pod stands alone)."""
    return (pod.ray_cluster or pod.cluster, pod.group, pod.replica_name or f"pod:{pod.name}")


def admitted_desired(
    spec: SliceClusterSpec, raycluster: Mapping[str, Any] | None, kueue: KueueView | None
) -> int | None:
    """``live_desired``, except that a Kueue-managed set Kueue admitted takes its count
    from the spec here, not from ``desired_of``'s reading of the last status (which may
    still say Kueue held it)."""
    desired = live_desired(spec, raycluster)
    return spec.slices if kueue is not None and desired is None else desired


def observed_of(
    spec: SliceClusterSpec,
    body: Mapping[str, Any],
    snap: Snapshot,
    plan: SlicePlan,
    applied: Applied,
    stall: Stall | None,
    now: str = "",
) -> Observed:
    """What this pass saw, for ``status.compute_status``: an elastic set's slices above
    its minimum that wait for capacity shown as Requested, those the autoscaler removes
    and those past its timeout at ``now`` (the status time stamp)."""
    live = worker_replicas(snap.raycluster, spec.group_name)
    desired = 0 if spec.suspend else spec.desired_slices(live)
    slices: Sequence[SliceStatus] = plan.slices
    elastic = None
    if spec.elastic is not None:
        slices = as_requested(plan.slices, spec.elastic.min_slices)
        elastic = elastic_count(
            spec.elastic, desired, slices, snap.raycluster, snap.pods, now, spec.group_name
        )
    kueue = kueue_of(spec, snap.raycluster, snap.workload, snap.admission_gate)
    if kueue is not None and not kueue.admitted and not spec.suspend:
        slices = with_admission(kueue, slices, desired)
    elif kueue is not None and kueue.admitted:
        slices = with_eviction_deadline(kueue, slices)
        if any(p.kueue_gated for p in snap.pods):
            slices = with_scale_up_wait(slices, topology=spec.kueue_picks_pools)
    return Observed(
        generation=generation(body),
        accelerator_type=spec.shape.accelerator_type,
        hosts_per_slice=spec.shape.hosts,
        chips_per_host=spec.shape.chips_per_host,
        ray_cluster=spec.name,
        desired_slices=desired,
        slices=slices,
        ray_cluster_ready=bool(snap.raycluster and snap.raycluster.get("state") == "ready"),
        suspended=spec.suspend,
        gated=spec.gated,
        applied=applied.ok,
        stall=stall,
        elastic=elastic,
        kueue=kueue,
    )


def elastic_count(
    elastic: ElasticSpec,
    desired: int,
    slices: Sequence[SliceStatus],
    raycluster: Mapping[str, Any] | None,
    pods: Sequence[PodInfo],
    now: str,
    group: str = c.WORKER_GROUP,
) -> ElasticCount:
    """status.elastic's inputs for one RayCluster's TPU group ``group`` (and its
    ``pods``): the range and target, the slices the autoscaler is removing (named in the
    group's workersToDelete) and the Requested slices past its allocate timeout (judged
    at ``now``; none without a time)."""
    limit = elastic.scale_up_timeout_seconds
    when = timestamp(now)
    late = () if when is None else timed_out(slices, pods, elastic.min_slices, limit, when)
    return ElasticCount(
        elastic.min_slices,
        elastic.max_slices,
        desired,
        removing=named_for_deletion(workers_to_delete(raycluster, group), pods),
        timed_out=tuple((t.index, rfc3339(t.since)) for t in late),
        timeout_seconds=limit_seconds(limit),
    )


def _pods_of(snap: Snapshot, group: str) -> list[PodInfo]:
    return [p for p in snap.pods if p.group == group]


def group_previous(previous: Mapping[str, Any], group: str) -> dict[str, Any]:
    """The status a TPU group's slices are preferred from: the object's, with the
    group's own ``status.groups[].slices`` as ``slices`` (the pools its slices held)."""
    entry = next(
        (
            g
            for g in previous.get("groups") or []
            if isinstance(g, Mapping) and g.get("name") == group
        ),
        {},
    )
    return {**previous, "slices": list(entry.get("slices") or [])}


def stalled_observation(body: Mapping[str, Any], stall: Stall) -> Observed:
    """For a spec that cannot be parsed: no shape is known, only the stall."""
    return Observed(
        **unparsed_fields(body, stall),
        ray_cluster=str((body.get("metadata") or {}).get("name", "")),
        slices=(),
        ray_cluster_ready=False,
        suspended=False,
    )


class ClusterKind:
    """TPUSliceCluster: the RayCluster of its name and its one set of slices."""

    kind = c.KIND_CLUSTER
    counts_creation = True

    def parse(self, body: Mapping[str, Any]) -> SliceClusterSpec:
        return parse_cluster(body)

    def cluster_spec(self, parsed: SliceClusterSpec) -> SliceClusterSpec:
        return parsed

    def render(self, parsed: SliceClusterSpec, templates: Any) -> dict[str, Any]:
        return render_raycluster(parsed, templates)

    def owned(self, snap: Snapshot) -> Mapping[str, Any] | None:
        return snap.raycluster

    def slice_sets(
        self,
        ref: ClusterRef,
        parsed: SliceClusterSpec,
        snap: Snapshot,
        previous: Mapping[str, Any],
    ) -> list[SliceSet]:
        kueue = kueue_of(parsed, snap.raycluster)
        held = kueue is not None and not kueue.admitted  # Kueue's: no slices until admitted
        snap = admitted_snapshot(snap, held)
        if parsed.grouped:  # a slice set per TPU group, each seeing its group's pods only
            return [
                SliceSet(
                    replace(ref, group=group.group_name),
                    group,
                    replace(snap, pods=_pods_of(snap, group.group_name)),
                    group_previous(previous, group.group_name),
                    desired=0 if held else admitted_desired(group, snap.raycluster, kueue),
                )
                for group in parsed.tpu_groups()
            ]
        desired = 0 if held else admitted_desired(parsed, snap.raycluster, kueue)
        return [SliceSet(ref, parsed, snap, previous, desired=desired)]

    def status(
        self,
        parsed: SliceClusterSpec,
        body: Mapping[str, Any],
        snap: Snapshot,
        acted: Sequence[ActedSet],
        applied: Applied,
        stall: Stall | None,
        previous: Mapping[str, Any],
        now: str,
    ) -> StatusOut:
        if parsed.grouped:
            tpu_groups = [
                TpuGroupObserved(
                    one.slices.spec.group_name,
                    one.slices.spec.shape.topology,
                    observed_of(
                        one.slices.spec, body, one.slices.snap, one.plan, applied, stall, now
                    ),
                )
                for one in acted
            ]
            cpu_groups = [
                CpuGroupObserved(
                    g.name, g.desired_replicas(worker_replicas(snap.raycluster, g.name))
                )
                for g in parsed.cpu_groups
            ]
            return StatusOut(grouped_status(tpu_groups, cpu_groups, previous, now))
        (only,) = acted
        observed = observed_of(parsed, body, snap, only.plan, applied, stall, now)
        return StatusOut(compute_status(observed, previous, now), observed.slices)

    def invalid_status(
        self, body: Mapping[str, Any], stall: Stall, previous: Mapping[str, Any], now: str
    ) -> StatusOut:
        return StatusOut(compute_status(stalled_observation(body, stall), previous, now))
