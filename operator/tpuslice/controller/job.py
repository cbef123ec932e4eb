"""The TPUSliceJob adapter of the pass: the RayJob applied, its slices held across retries.

What differs from a TPUSliceCluster:

1. the snapshot holds the TPUSliceJob, its RayJob and the RayClusters KubeRay
   made for it (found by the ``tpuslice.dev/job`` label KubeRay copies onto
   them, never by name: each attempt's is ``<job>-<random>``), and the pods of
   the job (labelled with its name and kind);
2. the RayJob is parsed and rendered (``spec.job.parse_job``,
   ``render.kuberay.render_rayjob``);
3. its one slice set (one per TPU group of spec.workerGroups, each in its own shape's
   queue) has the job as the holder: while the job has not ended,
   pools whose slices' pods are gone stay held and are handed to the next
   attempt's slices (``keep_pools``), so a retry never waits in the queue; once
   the job has ended (or is suspended) it wants no slices, and each pool is
   released when its pods are gone;
4. the status is ``status.job.compute_job_status``.
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
from tpuslice.controller.cluster import (
    admitted_snapshot,
    elastic_count,
    group_previous,
    observed_of,
)
from tpuslice.controller.statuswriter import generation
from tpuslice.model import constants as c
from tpuslice.model.convert import worker_replicas
from tpuslice.model.records import ClusterRef, KueueView, KueueWorkload, SlicePlan, Snapshot
from tpuslice.render.kuberay import render_rayjob
from tpuslice.spec.job import SliceJobSpec, parse_job
from tpuslice.status.conditions import ClusterSlices, Stall, elastic_slices
from tpuslice.status.groups import (
    ONE_GROUP_FIELDS,
    CpuGroupObserved,
    TpuGroupObserved,
    group_entries,
    groups_ready,
)
from tpuslice.status.job import JobObserved, compute_job_status, job_ended
from tpuslice.status.kueue import kueue_view

__all__ = ["JobKind", "grouped_job_status", "job_kueue", "job_observed"]


def _current_cluster(
    ray_status: Mapping[str, Any],
    snap: Snapshot,
    desired: int,
    plan: SlicePlan,
    elastic: tuple[int, int] | None,
) -> ClusterSlices | None:
    """The current attempt's RayCluster and the job's slices on it (the slices of an
    attempt being torn down show as Releasing until their pods are gone)."""
    name = str(ray_status.get("rayClusterName") or "")
    if not name and not plan.slices:
        return None
    found = snap.rayclusters.get(name) if name else None
    ready = bool(found and found.get("state") == "ready")
    return elastic_slices(name, desired, plan.slices, ready, elastic)


def with_elastic_detail(
    cluster: ClusterSlices | None, spec: SliceJobSpec, snap: Snapshot, now: str
) -> ClusterSlices | None:
    """The current attempt's elastic count with the slices the autoscaler removes and
    those past its timeout (``cluster.elastic_count``)."""
    elastic = spec.cluster.elastic
    if cluster is None or cluster.elastic is None or elastic is None:
        return cluster
    found = snap.rayclusters.get(cluster.name) if cluster.name else None
    count = elastic_count(elastic, cluster.desired_slices, cluster.slices, found, snap.pods, now)
    return replace(cluster, elastic=count)


def _range(spec: SliceJobSpec) -> tuple[int, int] | None:
    elastic = spec.cluster.elastic
    return None if elastic is None else (elastic.min_slices, elastic.max_slices)


def job_observed(
    spec: SliceJobSpec,
    body: Mapping[str, Any],
    snap: Snapshot,
    plan: SlicePlan,
    desired: int,
    applied: bool,
    stall: Stall | None,
    previous: Mapping[str, Any] | None = None,
    now: str = "",
) -> JobObserved:
    """What this pass saw, for ``status.job.compute_job_status``; the latest disruption
    of the job's slices is this pass's drain, else the one ``previous`` status records."""
    ray_status = (snap.owned or {}).get("status") if snap.owned is not None else None
    last = (previous or {}).get("disruptions")
    last = last if isinstance(last, Mapping) else {}
    reason, at = str(last.get("lastReason") or ""), str(last.get("lastTime") or "")
    if plan.drains:
        reason, at = plan.drains[-1].reason, now
    return JobObserved(
        generation=generation(body),
        accelerator_type=spec.cluster.shape.accelerator_type,
        hosts_per_slice=spec.cluster.shape.hosts,
        chips_per_host=spec.cluster.shape.chips_per_host,
        ray_job=spec.name,
        desired_slices=spec.cluster.slices if spec.cluster.elastic is None else desired,
        ray_job_status=ray_status,
        cluster=with_elastic_detail(
            _current_cluster(ray_status or {}, snap, desired, plan, _range(spec)), spec, snap, now
        ),
        suspend=spec.job.suspend,
        gated=spec.cluster.gated,
        applied=applied,
        stall=stall,
        kueue=job_kueue(spec, snap.owned, snap.workload, snap.admission_gate),
        disruption_reason=reason,
        disrupted_at=at,
        now=now,
    )


def job_kueue(
    spec: SliceJobSpec,
    rayjob: Mapping[str, Any] | None,
    workload: KueueWorkload | None = None,
    gate: str = "",
) -> KueueView | None:
    """Kueue's hold on the TPUSliceJob's RayJob (``status.kueue.kueue_view``): Kueue admits
    the RayJob, and KubeRay makes no RayCluster while it is suspended."""
    kueue = spec.cluster.kueue
    queue = kueue.queue_name if kueue else ""
    return kueue_view(queue, c.RAY_KIND_JOB, spec.name, rayjob, workload, gate)


def grouped_job_status(
    parsed: SliceJobSpec,
    body: Mapping[str, Any],
    snap: Snapshot,
    acted: Sequence[ActedSet],
    applied: Applied,
    stall: Stall | None,
    previous: Mapping[str, Any],
    now: str,
) -> dict[str, Any]:
    """A grouped TPUSliceJob's status: the job's conditions over every TPU group's slices
    (desiredSlices and readySlices count them all), and each group in ``status.groups``
    as a grouped TPUSliceCluster lists them (``status.slices`` is for one group)."""
    plans = [one.plan for one in acted]
    combined = replace(
        plans[0],
        slices=tuple(s for plan in plans for s in plan.slices),
        drains=tuple(d for plan in plans for d in plan.drains),
    )
    desired = sum(one.slices.desired or 0 for one in acted)
    spec = replace(parsed, cluster=replace(parsed.cluster, slices=desired))
    tpu_groups = [
        TpuGroupObserved(
            one.slices.spec.group_name,
            one.slices.spec.shape.topology,
            replace(
                observed_of(one.slices.spec, body, one.slices.snap, one.plan, applied, stall, now),
                desired_slices=one.slices.desired or 0,
            ),
        )
        for one in acted
    ]
    observed = job_observed(spec, body, snap, combined, desired, applied.ok, stall, previous, now)
    if observed.cluster is not None:  # an elastic group is judged at its own minimum
        cluster = replace(observed.cluster, groups_ready=groups_ready(tpu_groups))
        observed = replace(observed, cluster=cluster)
    status = compute_job_status(observed, previous, now)
    for key in ONE_GROUP_FIELDS:
        status.pop(key, None)
    current = acted[0].slices.snap.raycluster if acted else None
    cpu_groups = [
        CpuGroupObserved(g.name, g.desired_replicas(worker_replicas(current, g.name)))
        for g in parsed.cluster.cpu_groups
    ]
    status["groups"] = group_entries(tpu_groups, cpu_groups, now)
    return status


def _invalid(body: Mapping[str, Any], stall: Stall) -> JobObserved:
    """For a spec that cannot be parsed: no shape is known, only the stall."""
    return JobObserved(
        **unparsed_fields(body, stall),
        ray_job=str((body.get("metadata") or {}).get("name", "")),
        ray_job_status=None,
        cluster=None,
        suspend=False,
    )


class JobKind(OwnsKubeRayObject):
    """TPUSliceJob: the RayJob of its name and one set of slices kept across retries."""

    kind = c.KIND_JOB

    def parse(self, body: Mapping[str, Any]) -> SliceJobSpec:
        return parse_job(body)

    def render(self, parsed: SliceJobSpec, templates: Any) -> dict[str, Any]:
        return render_rayjob(parsed, templates)

    def slice_sets(
        self, ref: ClusterRef, parsed: SliceJobSpec, snap: Snapshot, previous: Mapping[str, Any]
    ) -> list[SliceSet]:
        ray_status = (snap.owned or {}).get("status") or {}
        ended = job_ended(ray_status) if snap.owned is not None else False
        kueue = job_kueue(parsed, snap.owned)
        held = kueue is not None and not kueue.admitted  # Kueue's: no slices until admitted
        wants = not ended and not parsed.job.suspend and not held
        snap = admitted_snapshot(snap, held)
        name = str(ray_status.get("rayClusterName") or "")
        current = snap.rayclusters.get(name) if name else None
        if parsed.cluster.grouped:  # a slice set per TPU group, each seeing its group's pods
            return [
                SliceSet(
                    replace(ref, group=group.group_name),
                    group,
                    # the current attempt's RayCluster: an elastic group's live count
                    replace(
                        snap,
                        pods=[p for p in snap.pods if p.group == group.group_name],
                        raycluster=current,
                    ),
                    group_previous(previous, group.group_name),
                    desired=group.desired_slices(worker_replicas(current, group.group_name))
                    if wants
                    else 0,
                    keep_pools=wants,
                )
                for group in parsed.cluster.tpu_groups()
            ]
        desired = parsed.cluster.desired_slices(worker_replicas(current)) if wants else 0
        return [SliceSet(ref, parsed.cluster, snap, previous, desired=desired, keep_pools=wants)]

    def status(
        self,
        parsed: SliceJobSpec,
        body: Mapping[str, Any],
        snap: Snapshot,
        acted: Sequence[ActedSet],
        applied: Applied,
        stall: Stall | None,
        previous: Mapping[str, Any],
        now: str,
    ) -> StatusOut:
        if parsed.cluster.grouped:
            return StatusOut(
                grouped_job_status(parsed, body, snap, acted, applied, stall, previous, now)
            )
        (only,) = acted
        desired = only.slices.desired or 0
        observed = job_observed(
            parsed, body, snap, only.plan, desired, applied.ok, stall, previous, now
        )
        return StatusOut(compute_job_status(observed, previous, now), only.plan.slices)

    def invalid_status(
        self, body: Mapping[str, Any], stall: Stall, previous: Mapping[str, Any], now: str
    ) -> StatusOut:
        return StatusOut(compute_job_status(_invalid(body, stall), previous, now))
