"""One level-based pass per TPUSliceJob: the RayJob applied, its slices held across retries.

The same parts as a TPUSliceCluster's pass (``reconcile.Reconciler``), in the
same order, with what differs for a job:

1. read the snapshot: the TPUSliceJob, its RayJob and the RayClusters KubeRay
   made for it (found by the ``tpuslice.dev/job`` label KubeRay copies onto
   them, never by name: each attempt's is ``<job>-<random>``), the pods of the
   job (labelled with its name and kind), nodes and reservations;
2. parse and render the RayJob (``spec.parse_job``, ``render.render_rayjob``);
3. apply it when needed (``applier.KubeRayApplier``);
4. plan and act on the slices with the job as the holder: while the job has
   not ended, pools whose slices' pods are gone stay held and are handed to the
   next attempt's slices (``SliceActuator.act(keep_pools=True)``), so a retry
   never waits in the queue; once the job has ended (or is suspended) it wants
   no slices, and each pool is released when its pods are gone;
5. write the status (``job_status.compute_job_status``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, ClassVar

from tpuslice.controller.reconciler import Reconciler, unparsed_slices, waiting_for_capacity
from tpuslice.controller.statuswriter import generation
from tpuslice.model import constants as c
from tpuslice.model import events
from tpuslice.model.records import ClusterKey, ClusterRef, SlicePlan, Snapshot
from tpuslice.render.kuberay import render_rayjob
from tpuslice.spec.job import SliceJobSpec, parse_job
from tpuslice.spec.parts import SpecError
from tpuslice.status.conditions import ClusterSlices, Stall
from tpuslice.status.job import JobObserved, compute_job_status, job_ended

__all__ = ["JobReconciler", "job_observed"]


def _current_cluster(
    ray_status: Mapping[str, Any], snap: Snapshot, desired: int, plan: SlicePlan
) -> ClusterSlices | None:
    """The current attempt's RayCluster and the job's slices on it (the slices of an
    attempt being torn down show as Releasing until their pods are gone)."""
    name = str(ray_status.get("rayClusterName") or "")
    if not name and not plan.slices:
        return None
    found = snap.rayclusters.get(name) if name else None
    ready = bool(found and found.get("state") == "ready")
    return ClusterSlices(name, desired, plan.slices, ray_cluster_ready=ready)


def job_observed(
    spec: SliceJobSpec,
    body: Mapping[str, Any],
    snap: Snapshot,
    plan: SlicePlan,
    desired: int,
    applied: bool,
    stall: Stall | None,
) -> JobObserved:
    """What this pass saw, for ``job_status.compute_job_status``."""
    ray_status = (snap.owned or {}).get("status") if snap.owned is not None else None
    return JobObserved(
        generation=generation(body),
        accelerator_type=spec.cluster.shape.accelerator_type,
        hosts_per_slice=spec.cluster.shape.hosts,
        chips_per_host=spec.cluster.shape.chips_per_host,
        ray_job=spec.name,
        desired_slices=spec.cluster.slices,
        ray_job_status=ray_status,
        cluster=_current_cluster(ray_status or {}, snap, desired, plan),
        suspend=spec.job.suspend,
        gated=spec.cluster.gated,
        applied=applied,
        stall=stall,
    )


def _invalid(body: Mapping[str, Any], stall: Stall) -> JobObserved:
    """For a spec that cannot be parsed: no shape is known, only the stall."""
    return JobObserved(
        generation=generation(body),
        accelerator_type="",
        hosts_per_slice=0,
        chips_per_host=0,
        ray_job=str((body.get("metadata") or {}).get("name", "")),
        desired_slices=unparsed_slices(body),
        ray_job_status=None,
        cluster=None,
        suspend=False,
        gated=False,
        applied=False,
        stall=stall,
    )


class JobReconciler(Reconciler):
    """TPUSliceJob passes: the parts of ``Reconciler``, a job's rules (module docstring)."""

    kind: ClassVar[str] = c.KIND_JOB

    async def _reconcile(self, key: ClusterKey, snap: Snapshot) -> None:
        body = snap.cluster
        if body is None:
            self.forget(key)
            return
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return  # the finalizer tears down
        ref = ClusterRef(
            meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""), kind=self.kind
        )
        previous = self.status.previous(key, body)
        try:
            spec = parse_job(body)
            rendered = render_rayjob(spec, await self.templates.get())
        except SpecError as exc:
            stall = Stall(events.INVALID_SPEC, str(exc))
            status = compute_job_status(_invalid(body, stall), previous, self.status.now())
            await self.status.write_status(body, previous, status, ())
            return
        applied = await self.applier.apply(rendered, snap.owned)
        self.pending.expire(time.monotonic())
        ray_status = (snap.owned or {}).get("status") or {}
        ended = job_ended(ray_status) if snap.owned is not None else False
        wants = not ended and not spec.job.suspend
        desired = spec.cluster.slices if wants else 0
        plan, plan_stall = await self.actuator.act(
            ref, spec.cluster, snap, previous, desired_slices=desired, keep_pools=wants
        )
        self._track_waiting(key, spec.cluster, waiting_for_capacity(plan))
        self.metrics.cluster_slices(self.object_key(key), (str(s.state) for s in plan.slices))
        observed = job_observed(
            spec, body, snap, plan, desired, applied.ok, applied.stall or plan_stall
        )
        status = compute_job_status(observed, previous, self.status.now())
        await self.status.write_status(body, previous, status, plan.slices)
