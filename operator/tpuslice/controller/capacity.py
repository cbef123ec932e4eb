"""The executor of capacity on demand: one ProvisioningRequest per waiting slice.

``tpuslice.capacity`` decides (pure); this part reads what the decisions need out
of a pass's snapshot and plan and carries the decisions out, inside
``SliceActuator.act`` (so every kind gets it alike), in two calls:

- **before planning** (``Provisioner.begin`` -> ``ProvisioningPass``): the object's
  requests as they will be once the watch shows our own writes (``Expectations``),
  and from them ``capacity.constraints``: the pools the planner may use (not one a
  live request of *another* object names, nor a revoked one, and only pools with
  the capacity ``nodeSelector``'s labels), each slice's preferred pool (its own
  request's), and whether the queue's NotEnoughPools applies.
- **after planning** (``ProvisioningPass.act``): the facts per slice
  (``records.SliceFacts``) from the plan, the pods and the reservations, then
  ``capacity.plan`` decides, and the writes follow in the order
  ``records.ProvisioningDecision`` gives: free the pool of a slice whose booking
  lapsed before its release, delete requests, create the PodTemplate then the
  request, then make the request the PodTemplate's controller owner; replace a
  slice whose capacity was revoked (delete its pods). Leftover PodTemplates (a crash
  between the two creates, a failed create) are deleted once they are older than
  ``LEFTOVER_TEMPLATE_SECONDS``; a template whose request exists but is not its
  owner yet is given the owner. The object is passed again at the earliest
  ``retry_at``. It returns the ``CapacityPlan``, whose releases, consume
  annotations and report the actuator uses.

Level-based: every write is decided again from the API server's state in the next
pass, and the objects' names are fixed by slice and attempt, so a crash at any line
leaves at worst a PodTemplate without its request (deleted as a leftover) or a
request whose template is not yet owned by it (given the owner). The only memory is
when the ProvisioningRequest CRD was last found missing (not asked again for
``MISSING_CRD_RETRY_SECONDS``); our own unconfirmed writes are in ``Expectations``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from tpuslice.capacity.constraints import CapacityConstraints, constraints
from tpuslice.capacity.facts import pods_by_replica, slice_facts
from tpuslice.capacity.objects import (
    podtemplate_body,
    podtemplate_owner_references,
    request_body,
    worker_template_of,
)
from tpuslice.capacity.plan import NO_CAPACITY_PLAN, CapacityPlan, fresh_pools, with_retired
from tpuslice.capacity.plan import plan as capacity_plan
from tpuslice.capacity.requests import (
    group_requests,
    history_from_status,
    lapsed,
)
from tpuslice.controller.expectations import Expectations
from tpuslice.controller.pinning import PinFence
from tpuslice.controller.recorder import Recorder
from tpuslice.model import constants as c
from tpuslice.model import events
from tpuslice.model.convert import provisioning_request_info, timestamp
from tpuslice.model.records import (
    CapacityUnit,
    ClusterRef,
    ObjectKey,
    OwnedRequest,
    PodInfo,
    ProvisioningDecision,
    ProvisioningRequestInfo,
    ProvisioningView,
    ReservationInfo,
    SliceFacts,
    SlicePlan,
    Snapshot,
)
from tpuslice.planning.pools import PoolIndex, eligible_pools
from tpuslice.render.kuberay import render_ray_cluster_spec
from tpuslice.runtime.kube import ApiError, ClusterApi
from tpuslice.spec.parts import SliceClusterSpec
from tpuslice.status.conditions import Stall

__all__ = [
    "LEFTOVER_TEMPLATE_SECONDS",
    "MISSING_CRD_RETRY_SECONDS",
    "Provisioner",
    "ProvisioningPass",
    "promised_elsewhere",
    "provisioning_view",
]

log = logging.getLogger(__name__)

#: How long a ProvisioningRequest CRD found missing is not asked for again.
MISSING_CRD_RETRY_SECONDS = 30.0
#: A PodTemplate of ours with no request of its name is deleted once this old (younger
#: ones may be this very pass's, or a create whose request the watch has not shown yet).
LEFTOVER_TEMPLATE_SECONDS = 30.0

KickLater = Callable[[ObjectKey, float], None]


def _no_kick(key: ObjectKey, delay: float) -> None:
    """No queue to ask (unit tests that drive passes themselves)."""


def promised_elsewhere(records: Iterable[OwnedRequest], owner: ObjectKey) -> dict[str, datetime]:
    """Pools a live request of another object names (provisioned, or not yet: GKE names
    it in provisioningClassDetails and its nodes may be seen first), each with the
    creation of the oldest such request (the epoch when unknown: all its nodes)."""
    mine: set[str] = set()
    others: dict[str, datetime] = {}
    for record in records:
        info = record.info
        if not info.node_pool or info.deleting or lapsed(info):
            continue
        if record.owner == owner:
            mine.add(info.node_pool)
            continue
        since = info.created or datetime.min.replace(tzinfo=UTC)
        others[info.node_pool] = min(others.get(info.node_pool, since), since)
    return {pool: since for pool, since in others.items() if pool not in mine}


def provisioning_view(
    requests: Iterable[OwnedRequest],
    templates: Iterable[Mapping[str, Any]],
    every_request: Iterable[OwnedRequest],
    owner: ObjectKey,
) -> ProvisioningView:
    """The snapshot's part for one object (``handlers.make_reader``)."""
    every = list(every_request)
    return ProvisioningView(
        requests=tuple(r.info for r in requests),
        templates=tuple(templates),
        promised_since=promised_elsewhere(every, owner),
        revoked_pools=frozenset(p for r in every if (p := r.info.lost_pool)),
    )


# ------------------------------------------------------------------ the part
@dataclass
class Provisioner:
    """Carries out ``capacity.plan`` for every object whose spec asks for capacity
    (or that still has requests of ours). ``kick_later`` is its reconciler's queue's
    (``KickQueue.kick_later``, earliest time wins): an object is passed again at the
    earliest time a decision asks for."""

    kube: ClusterApi
    recorder: Recorder
    pending: Expectations
    kick_later: KickLater = _no_kick
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    #: pin at admission's fence, asked before a reservation is given back
    fence: PinFence | None = None
    _missing_until: float = 0.0

    def _expected(self, view: ProvisioningView, owner: ObjectKey) -> ProvisioningView:
        """``view`` as it will be once the watch shows our own request writes (kept in
        ``pending``, the one store of them); what ``view`` confirms is forgotten there."""
        self.pending.requests_observed(owner, view.requests)
        return replace(view, requests=tuple(self.pending.requests(owner, view.requests)))

    def begin(
        self,
        ref: ClusterRef,
        spec: SliceClusterSpec,
        snap: Snapshot,
        previous: Mapping[str, Any],
    ) -> ProvisioningPass | None:
        """This pass's work for ``ref``, or None when there is none (no provisioning in
        the spec and no request or PodTemplate of ours)."""
        view = self._expected(snap.provisioning or ProvisioningView(), ref.key)
        if ref.ray_cluster:
            view = _one_cluster(view, ref.ray_cluster, snap)
        prov = spec.provisioning
        wanted = prov is not None and prov.enabled
        if not wanted and not view.requests and not view.templates:
            if not view.promised_elsewhere and not view.revoked_pools:
                return None
            # asks for nothing: only keep other objects' promised pools out of its way
            return ProvisioningPass(self, None, None, None, view, previous, None)
        return ProvisioningPass(self, ref, spec, snap, view, previous, self.clock())

    def crd_missing(self) -> bool:
        return time.monotonic() < self._missing_until

    def crd_found_missing(self) -> None:
        self._missing_until = time.monotonic() + MISSING_CRD_RETRY_SECONDS


class ProvisioningPass:
    """One pass of capacity-on-demand work for one object (see the module docstring)."""

    def __init__(
        self,
        provisioner: Provisioner,
        ref: ClusterRef | None,
        spec: SliceClusterSpec | None,
        snap: Snapshot | None,
        view: ProvisioningView | None,
        previous: Mapping[str, Any],
        now: datetime | None,
    ) -> None:
        self.p = provisioner
        self.ref = ref
        self.spec = spec
        self.snap = snap
        self.view = view or ProvisioningView()
        self.previous = previous
        self.now = now or datetime.now(UTC)
        #: what this object's planning may use (``capacity.constraints``)
        self.constraints = (
            constraints(self.view, spec)
            if spec is not None
            else CapacityConstraints(
                excluded=self.view.promised_elsewhere | self.view.revoked_pools,
                promised_since=self.view.promised_since,
            )
        )
        #: the one thing carrying out the writes learns: the CRD found missing
        self.stall: Stall | None = None
        self.newest: dict[tuple[str, int], ProvisioningRequestInfo] = {}
        self.extra: list[ProvisioningRequestInfo] = []
        if spec is not None:
            self.newest, self.extra = group_requests(self.view.requests)

    # ---------------------------------------------------------------- after planning
    async def act(
        self,
        plan: SlicePlan,
        pods: Sequence[PodInfo],
        reservations: Sequence[ReservationInfo],
        index: PoolIndex,
    ) -> CapacityPlan:
        """Decide every slice (``capacity.plan``) and carry the writes out (module
        docstring); the decisions, for the releases and the report."""
        if self.spec is None or self.ref is None:
            return NO_CAPACITY_PLAN
        spec, ref = self.spec, self.ref
        facts = slice_facts(
            ref,
            spec,
            plan,
            pods,
            reservations,
            eligible=eligible_pools(
                index, hosts=spec.shape.hosts, chips_per_host=spec.shape.chips_per_host
            ),
            pool_nodes=index.pools,
            newest=self.newest,
        )
        replicas = {s.index: s.replica for s in plan.slices}
        decided = capacity_plan(
            facts,
            self.newest,
            spec,
            now=self.now,
            history=with_retired(history_from_status(self.previous), self.extra),
            replicas=replicas,
            pool_nodes=index.pools,
        )
        by_replica = pods_by_replica(pods, spec.shape.hosts)
        for decision in decided.writes:
            await self._carry_out(ref, spec, decision, replicas, by_replica, index, facts)
        for request in self.extra:  # older attempts, retired ones, requests without labels
            if not await self._retire(request, None, index):
                await self._delete(ref, request.namespace, request.name, request.uid, "")
        await self._templates(ref, index)
        if decided.retry_at is not None:
            delay = max(1.0, (decided.retry_at - self.now).total_seconds() + 1.0)
            self.p.kick_later(ref.key, delay)
        return replace(decided, stall=self.stall or decided.stall)

    async def _carry_out(
        self,
        ref: ClusterRef,
        spec: SliceClusterSpec,
        d: ProvisioningDecision,
        replicas: Mapping[int, str | None],
        by_replica: Mapping[str, Sequence[PodInfo]],
        index: PoolIndex,
        facts: Mapping[int, SliceFacts],
    ) -> None:
        replica = replicas.get(d.index)
        if d.give_back and replica:
            held = next(
                (
                    r
                    for r in ref.own(
                        self.p.pending.reservations(self.snap.reservations if self.snap else ())
                    )
                    if r.holder.replica_name == replica
                ),
                None,
            )
            if (
                held is not None
                and (self.p.fence is None or await self.p.fence.let_go(held))
                and await self.p.kube.delete_reservation(held.pool, held.uid)
            ):
                self.p.pending.reservation_deleted(held.pool, time.monotonic(), held.uid)
            await self.p.recorder.normal(ref, d.reason or events.BOOKING_EXPIRED, d.message)
        if d.replace_slice and replica:
            for pod in by_replica.get(replica, []):
                if not pod.deleting:
                    await self.p.kube.delete_pod(pod.namespace, pod.name)
            await self.p.recorder.warning(ref, d.reason or events.CAPACITY_REVOKED, d.message)
        if d.delete:
            request = next((r for r in self.view.requests if r.name == d.delete), None)
            uid = request.uid if request is not None else ""
            posted = d.reason if d.create_attempt is None and not d.replace_slice else ""
            posted = "" if d.give_back else posted
            fact = facts.get(d.index)
            if not await self._retire(request, fact.pool if fact else None, index):
                await self._delete(ref, ref.namespace, d.delete, uid, posted, d.message)
        if d.create_attempt is not None:
            await self._create(ref, spec, d, replica, index, facts.get(d.index))

    async def _retire(
        self, request: ProvisioningRequestInfo | None, pool: str | None, index: PoolIndex
    ) -> bool:
        """Keep a CapacityRevoked request instead of deleting it while the pool it ran on
        (``pool``: the one its slice held) still has nodes, marked retired with that pool:
        GKE deletes the VMs after CapacityRevoked, and while the request exists no object
        may claim the pool (``restrict``). True when kept; once the pool has no nodes it
        is deleted like any other."""
        if request is None or not request.is_true(c.PROVREQ_CAPACITY_REVOKED):
            return False
        # a node unit's capacity is the node its slice held, not the whole pool named
        lost = (
            (request.revoked_pool or pool)
            if index.unit is CapacityUnit.NODE
            else (request.lost_pool or pool)
        )
        if not lost or not index.pools.get(lost):
            return False
        if request.revoked_pool == lost:
            return True
        if await self.p.kube.annotate_provisioning_request(
            request.namespace, request.name, {c.ANNOTATION_REVOKED_POOL: lost}
        ):
            self.p.pending.request_retired(request.namespace, request.name, lost, time.monotonic())
            log.info(
                "kept ProvisioningRequest %s/%s (CapacityRevoked) until node pool %s has no nodes",
                request.namespace,
                request.name,
                lost,
            )
        return True

    async def _delete(
        self,
        ref: ClusterRef,
        namespace: str,
        name: str,
        uid: str,
        reason: str,
        message: str = "",
    ) -> None:
        deleted = await self.p.kube.delete_provisioning_request(namespace, name, uid or None)
        self.p.pending.request_deleted(ref.key, namespace, name, time.monotonic())
        if deleted:
            log.info(
                "deleted ProvisioningRequest %s/%s: %s", namespace, name, message or "leftover"
            )
        if deleted and reason:
            await self.p.recorder.normal(ref, reason, message)
        # its PodTemplate goes with it (controller owner); delete it ourselves too, in
        # case the request never became its owner (a crash between the writes)
        await self.p.kube.delete_podtemplate(namespace, name)

    async def _create(
        self,
        ref: ClusterRef,
        spec: SliceClusterSpec,
        d: ProvisioningDecision,
        replica: str | None,
        index: PoolIndex,
        fact: SliceFacts | None,
    ) -> None:
        assert d.create_attempt is not None
        if self.p.crd_missing():
            self._not_installed(ref)
            return
        raycluster = fact.raycluster if fact is not None and fact.raycluster else spec.name
        worker = worker_template_of(render_ray_cluster_spec(spec)) or {}
        template = podtemplate_body(
            spec,
            raycluster=raycluster,
            index=d.index,
            attempt=d.create_attempt,
            worker_template=worker,
            exclude_units=sorted(index.pools),
        )
        body = request_body(
            spec,
            raycluster=raycluster,
            index=d.index,
            attempt=d.create_attempt,
            failures=d.failures,
        )
        namespace, name = ref.namespace, body["metadata"]["name"]
        template["metadata"]["namespace"] = namespace
        body["metadata"]["namespace"] = namespace
        try:
            await self.p.kube.create_podtemplate(template)
        except ApiError as exc:
            if not exc.already_exists:
                raise
            # ours from a pass that did not get to the request: make it this body
            await self._patch_template(namespace, name, {"template": template["template"]})
        try:
            created = await self.p.kube.create_provisioning_request(body)
        except ApiError as exc:
            if exc.not_found:
                self.p.crd_found_missing()
                await self.p.kube.delete_podtemplate(namespace, name)
                self._not_installed(ref)
                return
            if not exc.already_exists:
                await self.p.kube.delete_podtemplate(namespace, name)
                raise
            return  # made by an earlier pass; the watch shows it soon, and its owner is fixed
        self.p.pending.request_created(
            ref.key, provisioning_request_info(created), time.monotonic()
        )
        uid = str((created.get("metadata") or {}).get("uid") or "")
        if uid:
            await self._patch_template(
                namespace,
                name,
                {"metadata": {"ownerReferences": podtemplate_owner_references(spec, name, uid)}},
            )
        await self.p.recorder.normal(ref, d.reason or events.PROVISIONING_REQUESTED, d.message)
        log.info("created ProvisioningRequest %s/%s for slice %d", namespace, name, d.index)

    def _not_installed(self, ref: ClusterRef) -> None:
        self.stall = Stall(
            events.PROVISIONING_NOT_INSTALLED,
            "the ProvisioningRequest CRD (provisioningrequests.autoscaling.x-k8s.io) is not "
            "installed, so no capacity can be asked for; GKE serves it in versions with "
            "ProvisioningRequest support, elsewhere install the cluster autoscaler's CRD; "
            "looked for again every 30 s",
        )
        self.p.kick_later(ref.key, MISSING_CRD_RETRY_SECONDS + 1)

    async def _patch_template(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """A patch of one of our templates; one deleted meanwhile (with its request, or
        by us this pass) is no failure."""
        try:
            await self.p.kube.patch_podtemplate(namespace, name, patch)
        except ApiError as exc:
            if not exc.not_found:
                raise

    async def _templates(self, ref: ClusterRef, index: PoolIndex) -> None:
        """Leftover PodTemplates: with no request of their name, deleted once old enough;
        with a request that is not yet their owner, given it. A live, not yet
        provisioned best-effort request's template is refreshed (the pools to keep the
        autoscaler off change as pools come and go)."""
        requests = {r.name: r for r in self.view.requests}
        for template in self.view.templates:
            name = template["name"]
            request = requests.get(name)
            if request is None:
                created = timestamp(template.get("created"))
                age = (self.now - created).total_seconds() if created else 1e9
                if age >= LEFTOVER_TEMPLATE_SECONDS:
                    await self.p.kube.delete_podtemplate(template["namespace"], name)
                continue
            await self._refresh(template, request, index)
            if request.uid and template.get("controller") != request.uid and self.spec:
                await self._patch_template(
                    template["namespace"],
                    name,
                    {
                        "metadata": {
                            "ownerReferences": podtemplate_owner_references(
                                self.spec, name, request.uid
                            )
                        }
                    },
                )

    async def _refresh(
        self, template: Mapping[str, Any], request: ProvisioningRequestInfo, index: PoolIndex
    ) -> None:
        """A best-effort request not yet provisioned: its template's ``NotIn`` list
        (``objects.podtemplate_body``) follows the units that exist now, less those new
        since the request (the autoscaler re-reads templates every loop). Only the
        affinity is compared: the API server defaults the rest."""
        spec = self.spec
        prov = spec.provisioning if spec is not None else None
        if spec is None or prov is None or prov.queued or request.slice_index is None:
            return
        if request.is_true(c.PROVREQ_PROVISIONED) or lapsed(request) or request.deleting:
            return
        worker = worker_template_of(render_ray_cluster_spec(spec)) or {}
        wanted = podtemplate_body(
            spec,
            raycluster=request.raycluster or spec.name,
            index=request.slice_index,
            attempt=request.attempt,
            worker_template=worker,
            exclude_units=sorted(
                set(index.pools) - fresh_pools(index.pools, index.pools, [request])
            ),
        )["template"]
        affinity = wanted["spec"].get("affinity")
        if ((template.get("template") or {}).get("spec") or {}).get("affinity") == affinity:
            return
        await self._patch_template(
            template["namespace"],
            template["name"],
            {"template": {"spec": {"affinity": affinity}}},  # null removes it
        )


def _one_cluster(view: ProvisioningView, name: str, snap: Snapshot) -> ProvisioningView:
    """A TPUSliceService's pass plans one RayCluster (``ClusterRef.ray_cluster``): its own
    requests and templates, and those of RayClusters the service no longer has (KubeRay
    deleted them after an upgrade; deleting is idempotent, so every cluster's pass may)."""
    live = {n for n, rc in snap.rayclusters.items() if not rc.get("deleting")}

    def mine(raycluster: str) -> bool:
        return raycluster == name or (bool(raycluster) and raycluster not in live)

    return replace(
        view,
        requests=tuple(r for r in view.requests if mine(r.raycluster)),
        templates=tuple(t for t in view.templates if mine(str(t.get("raycluster") or ""))),
    )
