"""One level-based pass per TPUSliceService: the RayService applied, each of its RayClusters'
slices reserved apart, upgrades that never take the serving cluster's pools.

KubeRay makes a RayCluster for the RayService and, on an upgrade (a changed
cluster spec with ``upgradeStrategy: NewCluster``), a second, pending one; it
switches traffic once the pending cluster serves, and deletes the old one after
``rayClusterDeletionDelaySeconds``. The clusters are found by the
``tpuslice.dev/service`` label KubeRay copies onto them, and their pods by the
``ray.io/cluster`` label, never by names being equal. A pass:

1. parses and renders the RayService (``spec.parse_service``, ``render.render_rayservice``)
   and applies it when needed (``applier.KubeRayApplier``);
2. plans and acts on each RayCluster's slices on its own (``ClusterRef.ray_cluster``;
   its reservations carry ``spec.holder.rayCluster``): the pending cluster's slices
   claim free pools of the shape through the same queue as every other object, and
   the pools of the active cluster, whose pods are pinned, are never given back or
   taken; with no free pool the pending cluster waits and the status says
   ``UpgradeWaitingForCapacity`` while the active cluster keeps serving;
3. gives back the pools of a RayCluster KubeRay has deleted, once its pods are gone;
4. writes the status (``service_status.compute_service_status``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

from tpuslice.controller.reconciler import Reconciler, unparsed_slices, waiting_for_capacity
from tpuslice.controller.statuswriter import generation
from tpuslice.model import constants as c
from tpuslice.model import events
from tpuslice.model.records import ClusterKey, ClusterRef, Snapshot
from tpuslice.render.kuberay import render_rayservice
from tpuslice.spec.parts import SpecError
from tpuslice.spec.service import SliceServiceSpec, parse_service
from tpuslice.status.conditions import ClusterSlices, Stall
from tpuslice.status.service import ServiceObserved, compute_service_status

__all__ = ["ServiceReconciler", "service_clusters"]


def service_clusters(snap: Snapshot) -> list[str]:
    """The RayClusters of the service this pass plans for: those KubeRay has (not being
    deleted) and those whose pods are still there, by name."""
    names = {name for name, rc in snap.rayclusters.items() if not rc.get("deleting")}
    names |= {p.ray_cluster for p in snap.pods if p.ray_cluster}
    return sorted(names)


def _cluster_snapshot(snap: Snapshot, name: str) -> Snapshot:
    return replace(snap, pods=[p for p in snap.pods if p.ray_cluster == name])


def _invalid(body: Mapping[str, Any], stall: Stall) -> ServiceObserved:
    return ServiceObserved(
        generation=generation(body),
        accelerator_type="",
        hosts_per_slice=0,
        chips_per_host=0,
        ray_service=str((body.get("metadata") or {}).get("name", "")),
        desired_slices=unparsed_slices(body),
        ray_service_status=None,
        clusters={},
        gated=False,
        applied=False,
        stall=stall,
    )


class ServiceReconciler(Reconciler):
    """TPUSliceService passes: the parts of ``Reconciler``, a service's rules (above)."""

    kind: ClassVar[str] = c.KIND_SERVICE

    async def _reconcile(self, key: ClusterKey, snap: Snapshot) -> None:
        body = snap.cluster
        if body is None:
            self.forget(key)
            return
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return  # the finalizer tears down
        previous = self.status.previous(key, body)
        try:
            spec = parse_service(body)
            rendered = render_rayservice(spec, await self.templates.get())
        except SpecError as exc:
            stall = Stall(events.INVALID_SPEC, str(exc))
            status = compute_service_status(_invalid(body, stall), previous, self.status.now())
            await self.status.write_status(body, previous, status, ())
            return
        applied = await self.applier.apply(rendered, snap.owned)
        self.pending.expire(time.monotonic())
        clusters, plan_stall = await self._act(meta, spec, snap)
        await self._give_back_gone(meta, snap, set(clusters))
        ray_status = (snap.owned or {}).get("status") if snap.owned is not None else None
        observed = ServiceObserved(
            generation=generation(body),
            accelerator_type=spec.cluster.shape.accelerator_type,
            hosts_per_slice=spec.cluster.shape.hosts,
            chips_per_host=spec.cluster.shape.chips_per_host,
            ray_service=spec.name,
            desired_slices=spec.cluster.slices,
            ray_service_status=ray_status,
            clusters=clusters,
            gated=spec.cluster.gated,
            applied=applied.ok,
            stall=applied.stall or plan_stall,
        )
        status = compute_service_status(observed, previous, self.status.now())
        # Per-slice events are a TPUSliceCluster's and TPUSliceJob's: a service's status
        # keeps slices per cluster, and the conditions say where an upgrade stands.
        await self.status.write_status(body, previous, status, ())

    async def _act(
        self,
        meta: Mapping[str, Any],
        spec: SliceServiceSpec,
        snap: Snapshot,
    ) -> tuple[dict[str, ClusterSlices], Stall | None]:
        """Each RayCluster's slices planned and acted on apart; what each shows."""
        clusters: dict[str, ClusterSlices] = {}
        stall: Stall | None = None
        waiting = False
        states: list[str] = []
        for name in service_clusters(snap):
            ref = ClusterRef(
                meta.get("namespace", ""),
                meta.get("name", ""),
                meta.get("uid", ""),
                kind=self.kind,
                ray_cluster=name,
            )
            plan, plan_stall = await self.actuator.act(
                ref, spec.cluster, _cluster_snapshot(snap, name), {}
            )
            stall = stall or plan_stall
            found = snap.rayclusters.get(name)
            clusters[name] = ClusterSlices(
                name,
                spec.cluster.slices,
                plan.slices,
                ray_cluster_ready=bool(found and found.get("state") == "ready"),
            )
            waiting = waiting or waiting_for_capacity(plan)
            states.extend(str(s.state) for s in plan.slices)
        key = (meta.get("namespace", ""), meta.get("name", ""))
        self._track_waiting(key, spec.cluster, waiting)
        self.metrics.cluster_slices(self.object_key(key), states)
        return clusters, stall

    async def _give_back_gone(
        self, meta: Mapping[str, Any], snap: Snapshot, live: set[str]
    ) -> None:
        """Delete the reservations of RayClusters of the service that are gone (KubeRay
        deleted the old cluster after an upgrade, or the one it replaced) once no pod of
        theirs is left: no pass plans for them any more."""
        uid = meta.get("uid", "")
        with_pods = {p.replica_name for p in snap.pods}
        ref = ClusterRef(meta.get("namespace", ""), meta.get("name", ""), uid, kind=self.kind)
        gone = [
            r
            for r in self.pending.reservations(snap.reservations)
            if r.holder.uid == uid
            and r.holder.ray_cluster not in live
            and r.holder.replica_name not in with_pods
        ]
        for r in gone:
            if await self.kube.delete_reservation(r.pool, r.uid):
                self.pending.reservation_deleted(r.pool, time.monotonic(), r.uid)
                await self.recorder.normal(
                    ref,
                    events.SLICE_RELEASED,
                    f"released node pool {r.pool} (RayCluster {r.holder.ray_cluster or '?'} "
                    f"is gone)",
                )
