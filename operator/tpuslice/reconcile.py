"""One level-based reconcile per TPUSliceCluster, over a snapshot of the indexes.

Every trigger (the cluster's own events, its pods, its RayCluster, nodes and
reservations of its shape, a timer) lands in ``Reconciler.kick``. Kicks for a
cluster that is already reconciling are coalesced into one more pass, so a
burst of 200 pod events costs a few passes, not 200. A pass reads desired state
(the spec) and actual state (RayCluster, pods, nodes, reservations), acts on the
difference through kube.py, and writes status only when it changed.

The only memory kept between passes is a short-lived record of our own writes
that the watch has not delivered yet (a reservation just created, a pod just
released). It prevents duplicate writes; it is never the truth: after a restart
the indexes are listed afresh and the next pass decides from them alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from tpuslice import constants as c
from tpuslice import events
from tpuslice.convert import (
    controlled_by,
    is_subset,
    name_taken_message,
    raycluster_info,
    reservation_body,
    reservation_info,
)
from tpuslice.kube import ApiError, Kube
from tpuslice.metrics import Metrics, slice_last_created
from tpuslice.records import (
    ClusterKey,
    ClusterRef,
    PodInfo,
    PodRelease,
    ReservationInfo,
    Shape,
    SlicePlan,
    SliceState,
    Snapshot,
)
from tpuslice.render import render_raycluster
from tpuslice.reservation import PoolIndex, plan_slices, pool_index
from tpuslice.schema import template_schema
from tpuslice.spec import SliceClusterSpec, SpecError, parse_cluster
from tpuslice.status import (
    MAX_MESSAGE,
    Observed,
    Stall,
    compute_status,
    failure_status,
    progress_only,
    slice_events,
    truncate,
)

__all__ = [
    "ClusterKey",
    "Reconciler",
    "Shape",
    "Snapshot",
    "backoff_seconds",
    "error_text",
    "rejection_message",
]

log = logging.getLogger(__name__)

#: How long a write of ours may stay invisible in the indexes before we stop
#: assuming it (a relist can skip short-lived objects).
OVERLAY_TTL_SECONDS = 30.0
#: Re-plans within one pass after a lost claim (each may lose again to a faster holder).
CLAIM_REPLANS = 2
#: A failed pass is retried after RETRY_SECONDS, then twice as long each time it fails
#: again, up to MAX_BACKOFF_SECONDS; a success forgets the count.
RETRY_SECONDS = 5.0
MAX_BACKOFF_SECONDS = 300.0
#: While passes keep failing, a Warning event is posted at most this often per cluster.
FAILURE_EVENT_SECONDS = 300.0
#: How often to look again for KubeRay's CRD when it is missing, and how long a schema
#: read from it is used before it is read again (KubeRay upgraded under us).
SCHEMA_RETRY_SECONDS = 30.0
SCHEMA_MAX_AGE_SECONDS = 600.0
RAYCLUSTER_CRD = f"{c.RAY_PLURAL_CLUSTER}.{c.RAY_GROUP}"
#: A status change that is only progress (N of 4 pods created, hosts ready) is written
#: at most this often per cluster; the counts of a slice coming up arrive within a
#: second or two, and each used to be a status write of its own.
PROGRESS_WRITE_SECONDS = 1.0

MULTIHOST_HINT = (
    "KubeRay created worker pods without the ray.io/worker-group-replica-name and "
    "ray.io/replica-host-index labels, so slices cannot be told apart: turn on KubeRay's "
    "multi-host indexing (ray-operator --feature-gates=RayMultiHostIndexing=true on KubeRay "
    "1.5; on by default from 1.6) and delete the RayCluster's worker pods"
)
KUBERAY_HINT = (
    "the ray.io/v1 RayCluster CRD is not installed: install KubeRay >= 1.5 (helm install "
    "kuberay-operator kuberay/kuberay-operator) with multi-host indexing on; the operator "
    "retries on its own"
)


SnapshotReader = Callable[[ClusterKey], Snapshot]


def applied_hash(rendered: Mapping[str, Any]) -> str:
    """A digest of everything we send, kept on the RayCluster to notice removed fields."""
    return hashlib.sha256(json.dumps(rendered, sort_keys=True).encode()).hexdigest()[:16]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def shape_of(spec: SliceClusterSpec) -> Shape:
    return spec.shape.generation.gke_accelerator, spec.shape.topology


def spec_shape(cluster: Mapping[str, Any]) -> Shape | None:
    try:
        return shape_of(parse_cluster(cluster))
    except SpecError:
        return None


def backoff_seconds(failures: int) -> float:
    """Delay before the next pass after ``failures`` failed passes in a row (>= 1)."""
    return float(min(RETRY_SECONDS * 2 ** min(failures - 1, 30), MAX_BACKOFF_SECONDS))


def error_text(exc: BaseException) -> str:
    """One bounded line for a failed pass: what a user reads in the condition."""
    if isinstance(exc, ApiError):
        text = f"API server answered {exc.status} {exc.reason}: {exc.message}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return truncate(" ".join(text.split()), 1024)


_WORKER_TEMPLATE = re.compile(r"\.?spec\.workerGroupSpecs\[[^\]]*\]\.template")
_HEAD_TEMPLATE = re.compile(r"\.?spec\.headGroupSpec\.template")


def rejection_message(message: str) -> str:
    """The API server's reason for refusing our RayCluster, with the RayCluster's template
    paths written as the TPUSliceCluster fields they come from."""
    message = _WORKER_TEMPLATE.sub("spec.worker.template", message)
    message = _HEAD_TEMPLATE.sub("spec.head.template", message)
    return f"RayCluster rejected: {message}"


def _typed_patch_error(exc: ApiError) -> bool:
    """Server-side apply answers 500 when a field has the wrong type for the CRD's schema
    (an override whose resources is a string): the request's fault, not the server's."""
    return exc.status == 500 and "failed to create typed patch object" in exc.message


@dataclass
class _Failing:
    """A cluster whose passes fail: how often, when to try again, what was said."""

    count: int
    retry_at: float  # time.monotonic()
    generation: int
    error: str
    event_at: float = -math.inf


def _generation(cluster: Mapping[str, Any] | None) -> int:
    try:
        return int(((cluster or {}).get("metadata") or {}).get("generation") or 0)
    except (TypeError, ValueError):
        return 0


@dataclass
class _Overlay:
    """Our writes not yet seen through the watch, each with the time it was made.

    ``created`` also holds a reservation read back after a lost claim (another
    holder's), so the re-plan of the same pass sees that pool as taken."""

    created: dict[str, tuple[ReservationInfo, float]] = field(default_factory=dict)
    deleted: dict[str, float] = field(default_factory=dict)
    released: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)  # phase Bound sent, per pool
    applied: dict[ClusterKey, tuple[str, float]] = field(default_factory=dict)  # RayCluster hash

    def expire(self, now: float) -> None:
        def fresh(stamp: float) -> bool:
            return now - stamp <= OVERLAY_TTL_SECONDS

        self.created = {k: v for k, v in self.created.items() if fresh(v[1])}
        self.released = {k: v for k, v in self.released.items() if fresh(v[1])}
        self.deleted = {k: v for k, v in self.deleted.items() if fresh(v)}
        self.bound = {k: v for k, v in self.bound.items() if fresh(v)}
        self.applied = {k: v for k, v in self.applied.items() if fresh(v[1])}

    def reservations(self, indexed: Iterable[ReservationInfo]) -> list[ReservationInfo]:
        seen = {r.pool: r for r in indexed}
        for pool in [p for p in self.bound if p in seen and seen[p].phase == "Bound"]:
            del self.bound[pool]
        for pool, (info, _) in list(self.created.items()):
            if pool in seen and seen[pool].holder == info.holder:
                del self.created[pool]
        for pool in [p for p in self.deleted if p not in seen]:
            del self.deleted[pool]
        merged = {p: r for p, r in seen.items() if p not in self.deleted}
        merged.update({p: info for p, (info, _) in self.created.items()})
        return list(merged.values())

    def pods(self, indexed: Iterable[PodInfo]) -> list[PodInfo]:
        out = []
        for pod in indexed:
            key = (pod.namespace, pod.name)
            if key in self.released:
                if not pod.gated:
                    del self.released[key]
                else:
                    pod = replace(pod, gated=False, pinned_pool=self.released[key][0])
            out.append(pod)
        return out


@dataclass
class Reconciler:
    kube: Kube
    read: SnapshotReader
    _running: set[ClusterKey] = field(default_factory=set)
    _dirty: set[ClusterKey] = field(default_factory=set)
    _overlay: _Overlay = field(default_factory=_Overlay)
    _written: dict[ClusterKey, dict[str, Any]] = field(default_factory=dict)
    _waiting: dict[Shape, set[ClusterKey]] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _applied_once: set[ClusterKey] = field(default_factory=set)  # for the creation metric
    metrics: Metrics = field(default_factory=Metrics)
    _node_versions: dict[Shape, int] = field(default_factory=dict)
    _inventories: dict[Shape, tuple[int, PoolIndex]] = field(default_factory=dict)
    # Kicks held back until kopf has filled its indexes (see ``hold_until_indexed``).
    _held: set[ClusterKey] | None = None
    _last_status_write: dict[ClusterKey, float] = field(default_factory=dict)
    _kicks_later: set[ClusterKey] = field(default_factory=set)
    progress_write_seconds: float = PROGRESS_WRITE_SECONDS
    _failing: dict[ClusterKey, _Failing] = field(default_factory=dict)
    # KubeRay's pod-template schema, read from its CRD (None: not read or not there).
    _schema: Mapping[str, Any] | None = None
    _schema_read_at: float = -math.inf
    _schema_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    # ------------------------------------------------------------ start-up
    def hold_until_indexed(self) -> None:
        """Hold kicks until ``indexed``: our own watches are listed before kopf's indexes
        of clusters and reservations, and a pass over a snapshot without the cluster's
        reservations would claim pools it already holds."""
        if self._held is None:
            self._held = set()

    def indexed(self) -> None:
        """kopf's indexes are filled (kopf calls no handler before that): run what was held."""
        held, self._held = self._held, None
        if held:
            self.kick_soon(held)

    # ------------------------------------------------------------ nodes
    def nodes_changed(self, shape: Shape) -> None:
        """A node of ``shape`` changed in a way the decisions see (not a heartbeat)."""
        self._node_versions[shape] = self._node_versions.get(shape, 0) + 1

    def _inventory(self, shape: Shape, snap: Snapshot) -> PoolIndex | None:
        """The shape's pool index, rebuilt only after ``nodes_changed``; None (build it in
        the pass) when nothing reports node changes, as in unit tests.

        Keyed by the version the snapshot's nodes were read at: a node event during an
        earlier await of this pass must not get stale nodes cached as current."""
        version = snap.node_versions.get(shape)
        if version is None:
            return None
        cached = self._inventories.get(shape)
        if cached is not None and cached[0] == version:
            return cached[1]
        index = pool_index(snap.nodes, *shape)
        if version == self._node_versions.get(shape):
            self._inventories[shape] = (version, index)
        return index

    # ------------------------------------------------------------ triggers
    async def kick(self, key: ClusterKey) -> None:
        """Reconcile ``key`` now, or once more after the pass already running."""
        if self._held is not None:
            self._held.add(key)
            return
        if key in self._running:
            self._dirty.add(key)
            return
        self._running.add(key)
        try:
            while True:
                self._dirty.discard(key)
                began = time.perf_counter()
                snap: Snapshot | None = None
                try:
                    versions = dict(self._node_versions)  # read with the snapshot, no await
                    snap = replace(self.read(key), node_versions=versions)
                    if self._backing_off(key, snap):
                        return
                    await self._reconcile(key, snap)
                except Exception as exc:
                    self.metrics.reconciled(time.perf_counter() - began, ok=False)
                    await self._failed(key, snap, exc)
                    return
                self.metrics.reconciled(time.perf_counter() - began, ok=True)
                self._failing.pop(key, None)
                if key not in self._dirty:
                    return
        finally:
            self._running.discard(key)

    def _backing_off(self, key: ClusterKey, snap: Snapshot) -> bool:
        """Whether an earlier failure holds this pass back: until its retry time, unless
        the spec changed since (a fix is tried at once). A held-back pass is run then."""
        failing = self._failing.get(key)
        if failing is None or snap.cluster is None:
            return False
        wait = failing.retry_at - time.monotonic()
        if wait <= 0 or _generation(snap.cluster) != failing.generation:
            return False
        self._retry_later(key, wait)
        return True

    async def _failed(self, key: ClusterKey, snap: Snapshot | None, exc: Exception) -> None:
        """A pass raised: back off exponentially, say so on the object (a condition and a
        rate-limited event), and log the traceback once per distinct error."""
        before = self._failing.get(key)
        count = before.count + 1 if before else 1
        delay = backoff_seconds(count)
        error = error_text(exc)
        now = time.monotonic()
        cluster = snap.cluster if snap is not None else None
        failing = _Failing(count, now + delay, _generation(cluster), error)
        if before is not None:
            failing.event_at = before.event_at
        self._failing[key] = failing
        if before is None or before.error != error:
            log.exception("reconcile of %s/%s failed; retrying in %.0fs", *key, delay)
        else:
            log.warning(
                "reconcile of %s/%s failed again (%d in a row): %s; retrying in %.0fs",
                *key,
                count,
                error,
                delay,
            )
        self._retry_later(key, delay)
        if cluster is None or (cluster.get("metadata") or {}).get("deletionTimestamp"):
            return
        message = truncate(
            f"reconcile failed {count} time{'s' * (count != 1)} in a row, next attempt in "
            f"{delay:.0f}s: {error}",
            MAX_MESSAGE,
        )
        try:
            await self._write_failure(key, cluster, message)
            if now - failing.event_at >= FAILURE_EVENT_SECONDS:
                failing.event_at = now
                meta = cluster.get("metadata") or {}
                ref = ClusterRef(
                    meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
                )
                await self._event(ref, "Warning", events.RECONCILE_ERROR, message)
        except Exception as write_error:  # the API server may be what fails
            log.warning("could not report the failure on %s/%s: %s", *key, write_error)

    async def _write_failure(
        self, key: ClusterKey, cluster: Mapping[str, Any], message: str
    ) -> None:
        previous = self._written.get(key) or dict(cluster.get("status") or {})
        status = failure_status(
            previous, _generation(cluster), events.RECONCILE_ERROR, message, _now()
        )
        await self.kube.patch_cluster_status(key[0], key[1], {"conditions": status["conditions"]})
        self._written[key] = status
        self._last_status_write[key] = time.monotonic()

    async def _template_schema(self) -> Mapping[str, Any] | None:
        """KubeRay's pod-template schema from its CRD in the cluster, read once and again
        after SCHEMA_MAX_AGE_SECONDS (or SCHEMA_RETRY_SECONDS while it is missing)."""
        async with self._schema_lock:
            age = time.monotonic() - self._schema_read_at
            limit = SCHEMA_RETRY_SECONDS if self._schema is None else SCHEMA_MAX_AGE_SECONDS
            if age >= limit:
                self._schema_read_at = time.monotonic()
                try:
                    crd = await self.kube.get_crd(RAYCLUSTER_CRD)
                except ApiError as exc:
                    if not exc.not_found:
                        raise
                    self._schema = None  # KubeRay not installed: the apply says so
                else:
                    self._schema = template_schema(crd)
                    if self._schema is None:
                        log.warning(
                            "%s has no pod-template schema where KubeRay 1.5 has it; pod-template "
                            "overrides are judged by the API server alone",
                            RAYCLUSTER_CRD,
                        )
            return self._schema

    def forget_schema(self) -> None:
        """Read KubeRay's CRD again on the next pass (it may have changed)."""
        self._schema_read_at = -math.inf

    def _retry_later(self, key: ClusterKey, delay: float = RETRY_SECONDS) -> None:
        """One more pass after ``delay`` (at most one such pass pending per cluster)."""
        if key in self._kicks_later:
            return
        self._kicks_later.add(key)

        async def later() -> None:
            await asyncio.sleep(delay)
            self._kicks_later.discard(key)
            await self.kick(key)

        self._spawn(later())

    def kick_soon(self, keys: Iterable[ClusterKey]) -> None:
        """Kick other clusters without making the calling handler wait for them."""
        for key in keys:
            self._spawn(self.kick(key))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def waiting_for(self, shape: Shape) -> set[ClusterKey]:
        """Clusters with a slice waiting for capacity of this shape (kick them on changes)."""
        return set(self._waiting.get(shape, ()))

    def forget(self, key: ClusterKey) -> None:
        self._written.pop(key, None)
        self._last_status_write.pop(key, None)
        self._applied_once.discard(key)
        self._failing.pop(key, None)
        self.metrics.forget_cluster(key)
        for keys in self._waiting.values():
            keys.discard(key)

    # ------------------------------------------------------------ one pass
    async def _reconcile(self, key: ClusterKey, snap: Snapshot) -> None:
        body = snap.cluster
        if body is None:
            self.forget(key)
            return
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return  # the finalizer handler tears down; applying now would recreate
        ref = ClusterRef(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""))
        previous = self._written.get(key) or dict(body.get("status") or {})
        try:
            spec = parse_cluster(body)
            rendered = render_raycluster(spec, await self._template_schema())
        except SpecError as exc:
            await self._write_status(
                body,
                previous,
                self._stalled_observation(body, Stall(events.INVALID_SPEC, str(exc))),
            )
            return

        stall, applied = await self._apply_raycluster(rendered, snap.raycluster)
        if applied and snap.raycluster is None and key not in self._applied_once:
            self._applied_once.add(key)  # an apply was sent and the RayCluster was missing
            self.metrics.raycluster_created(meta.get("creationTimestamp", ""), time.time())
        self._overlay.expire(time.monotonic())
        plan, stall = await self._act_on_slices(ref, spec, snap, previous, stall)
        self._track_waiting(key, spec, plan)
        self.metrics.cluster_slices(key, (str(s.state) for s in plan.slices))
        ray_ready = bool(snap.raycluster and snap.raycluster.get("state") == "ready")
        observed = Observed(
            generation=int(meta.get("generation") or 0),
            accelerator_type=spec.shape.accelerator_type,
            hosts_per_slice=spec.shape.hosts,
            chips_per_host=spec.shape.chips_per_host,
            ray_cluster=spec.name,
            desired_slices=0 if spec.suspend else spec.slices,
            slices=plan.slices,
            ray_cluster_ready=ray_ready,
            suspended=spec.suspend,
            gated=spec.gated,
            applied=applied,
            stall=stall,
        )
        await self._write_status(body, previous, observed)

    def _stalled_observation(self, body: Mapping[str, Any], stall: Stall) -> Observed:
        """For a spec that cannot be parsed: no shape is known, only the stall."""
        spec = body.get("spec")
        tpu = spec.get("tpu") if isinstance(spec, Mapping) else None
        slices = tpu.get("slices") if isinstance(tpu, Mapping) else None
        return Observed(
            generation=_generation(body),
            accelerator_type="",
            hosts_per_slice=0,
            chips_per_host=0,
            ray_cluster=str((body.get("metadata") or {}).get("name", "")),
            desired_slices=slices if isinstance(slices, int) and slices >= 0 else 1,
            slices=(),
            ray_cluster_ready=False,
            suspended=False,
            gated=False,
            applied=False,
            stall=stall,
        )

    async def _apply_raycluster(
        self, rendered: Mapping[str, Any], actual: Mapping[str, Any] | None
    ) -> tuple[Stall | None, bool]:
        """Server-side apply when the RayCluster is missing, differs in a field we own, or
        was applied from a different rendering (the hash annotation): SSA then also removes
        fields we no longer send."""
        if (
            "suspend" not in rendered["spec"]
            and actual is not None
            and actual.get("ownsSuspend")
            and actual["spec"].get("suspend") is True
        ):
            # KubeRay 1.5 resumes only on an explicit `suspend: false`; removing the field
            # leaves the cluster suspended. Send false once, for a suspension we made.
            rendered = {**rendered, "spec": {**rendered["spec"], "suspend": False}}
        digest = applied_hash(rendered)
        rendered = {
            **rendered,
            "metadata": {
                **rendered["metadata"],
                "annotations": {c.ANNOTATION_APPLIED_HASH: digest},
            },
        }
        key = (rendered["metadata"].get("namespace", ""), rendered["metadata"]["name"])
        if actual is not None:
            self._overlay.applied.pop(key, None)
        elif key in self._overlay.applied and self._overlay.applied[key][0] == digest:
            return None, True  # applied by an earlier pass; the watch has not shown it yet
        wanted = {"labels": rendered["metadata"]["labels"], "spec": rendered["spec"]}
        owner_uid = rendered["metadata"]["ownerReferences"][0]["uid"]
        if (
            actual is not None
            and actual["annotations"].get(c.ANNOTATION_APPLIED_HASH) == digest
            and is_subset(wanted, actual)
            and controlled_by(actual["ownerReferences"], owner_uid)
        ):
            return None, True
        # Our watch follows only labelled RayClusters: before the first apply, make sure
        # the name is not another's (a forced apply would take it over, and the
        # finalizer later delete it). One GET per cluster creation, not per pass.
        existing = actual
        if existing is None:
            found = await self.kube.get_raycluster(*key)
            existing = None if found is None else raycluster_info(found)
        if existing is not None and not controlled_by(existing["ownerReferences"], owner_uid):
            return Stall(events.RAYCLUSTER_NAME_TAKEN, name_taken_message(key, existing)), False
        try:
            await self.kube.apply_raycluster(rendered)
        except ApiError as exc:
            if exc.not_found:
                return Stall(events.KUBERAY_NOT_INSTALLED, KUBERAY_HINT), False
            if exc.status in (400, 403, 409, 422) or _typed_patch_error(exc):
                if _typed_patch_error(exc):
                    self.forget_schema()  # the schema we judged by may be out of date
                return Stall(events.APPLY_REJECTED, rejection_message(exc.message)), False
            raise
        self._overlay.applied[key] = (digest, time.monotonic())
        return None, True

    async def _act_on_slices(
        self,
        ref: ClusterRef,
        spec: SliceClusterSpec,
        snap: Snapshot,
        previous: Mapping[str, Any],
        stall: Stall | None,
    ) -> tuple[SlicePlan, Stall | None]:
        previous_pools = {
            int(s["index"]): s["nodePool"]
            for s in previous.get("slices") or []
            if s.get("nodePool") and s.get("index") is not None
        }

        inventory = self._inventory(shape_of(spec), snap)

        def plan() -> SlicePlan:
            return plan_slices(
                ref,
                accelerator=spec.shape.generation.gke_accelerator,
                topology=spec.shape.topology,
                hosts=spec.shape.hosts,
                chips_per_host=spec.shape.chips_per_host,
                desired_slices=0 if spec.suspend else spec.slices,
                gated=spec.gated,
                pods=self._overlay.pods(snap.pods),
                nodes=snap.nodes,
                reservations=self._overlay.reservations(snap.reservations),
                previous_pools=previous_pools,
                inventory=inventory,
            )

        first = plan()
        if first.unindexed_pods and stall is None:
            stall = Stall(events.MULTIHOST_INDEXING_DISABLED, MULTIHOST_HINT)
        acted = await self._free(ref, first.frees, snap)
        held, lost = await self._claim(ref, spec, first)
        for _ in range(CLAIM_REPLANS):
            if not lost:
                break
            # Someone else was faster: re-plan at once with the winner's reservation in
            # the overlay (another free pool, or the honest WaitingForCapacity naming
            # the holder), instead of reporting the winner's pool until the next pass.
            first = plan()
            more, lost = await self._claim(ref, spec, first)
            held += more
        acted = acted or bool(held)
        holding = {r.holder.replica_name for r in snap.reservations if r.holder.uid == ref.uid}
        holding |= {
            i.holder.replica_name
            for i, _ in self._overlay.created.values()
            if i.holder.uid == ref.uid
        }
        releases = [r for r in first.releases if r.replica_name in holding]
        if releases:
            await self._release(releases)
            self.metrics.slices_released(
                slice_last_created(snap.pods, {r.replica_name for r in releases}), time.time()
            )
            acted = True
        for pool in first.binds:
            if pool in self._overlay.bound:
                continue  # sent by an earlier pass; the watch has not shown it yet
            try:
                await self.kube.set_reservation_phase(pool, "Bound", "every pod pinned to the pool")
            except ApiError as exc:
                if not exc.not_found:
                    raise
            self._overlay.bound[pool] = time.monotonic()
        return (plan() if acted else first), stall

    async def _free(self, ref: ClusterRef, pools: Sequence[str], snap: Snapshot) -> bool:
        by_pool = {r.pool: r for r in snap.reservations}
        for pool in pools:
            if await self.kube.delete_reservation(pool):
                self._overlay.deleted[pool] = time.monotonic()
                self._overlay.created.pop(pool, None)
                self._overlay.bound.pop(pool, None)
                replica = by_pool[pool].holder.replica_name if pool in by_pool else "?"
                await self._event(
                    ref,
                    "Normal",
                    events.SLICE_RELEASED,
                    f"released node pool {pool} (slice {replica} has no pods left)",
                )
        return bool(pools)

    async def _claim(
        self, ref: ClusterRef, spec: SliceClusterSpec, plan: SlicePlan
    ) -> tuple[list[str], list[str]]:
        """Create the plan's reservations: the replicas now holding a pool, and the pools
        another holder had claimed first (their reservation is put in the overlay)."""
        held: list[str] = []
        lost: list[str] = []
        for claim in plan.claims:
            body = reservation_body(
                claim.pool,
                claim.holder,
                gke_accelerator=spec.shape.generation.gke_accelerator,
                accelerator_type=spec.shape.accelerator_type,
                topology=spec.shape.topology,
                hosts=spec.shape.hosts,
            )
            try:
                created = await self.kube.create_reservation(body)
            except ApiError as exc:
                if not exc.already_exists:
                    raise
                existing = reservation_info(await self.kube.get_reservation(claim.pool))
                if existing.holder == claim.holder:
                    self._overlay.created[claim.pool] = (existing, time.monotonic())
                    held.append(claim.holder.replica_name)
                else:
                    self._overlay.created[claim.pool] = (existing, time.monotonic())
                    lost.append(claim.pool)
                    await self._event(
                        ref,
                        "Normal",
                        events.RESERVATION_LOST,
                        f"node pool {claim.pool} was claimed first by "
                        f"{existing.holder.describe()}; trying another",
                    )
                continue
            self._overlay.created[claim.pool] = (reservation_info(created), time.monotonic())
            self._overlay.deleted.pop(claim.pool, None)
            self._overlay.bound.pop(claim.pool, None)
            held.append(claim.holder.replica_name)
            await self._event(
                ref,
                "Normal",
                events.SLICE_RESERVED,
                f"slice {claim.holder.replica_index} ({claim.holder.replica_name}) "
                f"reserved node pool {claim.pool}",
            )
        return held, lost

    async def _release(self, releases: Sequence[PodRelease]) -> None:
        """Patch every pod of the slice(s) at once: the partly-released window is one RTT."""

        async def one(release: PodRelease) -> None:
            try:
                await self.kube.release_pod(release.namespace, release.name, release.pool)
            except ApiError as exc:
                if exc.not_found:
                    return  # KubeRay deleted it; the slice is being replaced
                raise
            self._overlay.released[(release.namespace, release.name)] = (
                release.pool,
                time.monotonic(),
            )

        await asyncio.gather(*(one(r) for r in releases))

    def _track_waiting(self, key: ClusterKey, spec: SliceClusterSpec, plan: SlicePlan) -> None:
        waiting = self._waiting.setdefault(shape_of(spec), set())
        if any(s.state == SliceState.WAITING_FOR_CAPACITY for s in plan.slices):
            waiting.add(key)
        else:
            waiting.discard(key)

    # ------------------------------------------------------------ status and events
    async def _write_status(
        self, body: Mapping[str, Any], previous: Mapping[str, Any], observed: Observed
    ) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        status = compute_status(observed, previous, _now())
        if status == previous or status == dict(body.get("status") or {}):
            self._written[key] = status
            return
        now = time.monotonic()
        wait = self._last_status_write.get(key, -math.inf) + self.progress_write_seconds - now
        if wait > 0 and progress_only(previous, status):
            self._retry_later(key, wait)  # folded into the next write, or written then
            return
        await self.kube.patch_cluster_status(meta["namespace"], meta["name"], status)
        self._written[key] = status
        self._last_status_write[key] = now
        ref = ClusterRef(meta["namespace"], meta["name"], meta.get("uid", ""))
        for kind, reason, message in slice_events(previous.get("slices") or [], observed.slices):
            if reason != events.SLICE_RESERVED:  # posted with the claim itself
                await self._event(ref, kind, reason, message)
        await self._condition_events(ref, previous, status)

    async def _condition_events(
        self, ref: ClusterRef, previous: Mapping[str, Any], status: Mapping[str, Any]
    ) -> None:
        def cond(stanza: Mapping[str, Any], kind: str) -> tuple[str, str]:
            for c_ in stanza.get("conditions") or []:
                if c_.get("type") == kind:
                    return c_.get("status", ""), c_.get("reason", "")
            return "", ""

        stalled = cond(status, "Stalled")
        if stalled[0] == "True" and stalled != cond(previous, "Stalled"):
            message = next(x["message"] for x in status["conditions"] if x["type"] == "Stalled")
            await self._event(ref, "Warning", stalled[1], message)
        if cond(status, "Ready")[0] == "True" and cond(previous, "Ready")[0] != "True":
            await self._event(
                ref, "Normal", events.CLUSTER_READY, f"{status.get('sliceReadiness')} slices ready"
            )

    async def _event(self, ref: ClusterRef, kind: str, reason: str, message: str) -> None:
        involved = {"metadata": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid}}
        await self.kube.post_event(involved, kind, reason, message)
