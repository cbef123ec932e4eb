"""Capacity on demand: one ProvisioningRequest per waiting slice, all pure.

A slice whose pods all exist and for which no free matching node pool does asks the
cluster autoscaler for one (``spec.reservation.provisioning``): a PodTemplate (a
gate-free copy of the slice's scheduling fields) and a ProvisioningRequest
(``autoscaling.x-k8s.io/v1``) of ONE pod set of hosts-per-slice pods that owns it.
Once the request is ``Provisioned`` the slice claims a pool (queued class: the
pool the request's status names; other classes: any fresh whole pool the planner
finds eligible) with a SliceReservation as always, and the one release patch adds
the two consume annotations. Everything the decisions read lives in the API
server: the request (its attempt and failure count are its labels and annotations,
its conditions say where it stands) and ``status.slices[].provisioning``.

This module builds the two objects and decides, per slice and pass, what to do
about its request (``decide``); the shell creates, deletes, claims and reports.
Facts it relies on: /work/shared/docs/capacity-facts.md (sources named there) and
kubernetes/autoscaler ``apis/provisioningrequest/autoscaling.x-k8s.io/v1/types.go``.

Recognising a configuration error (``config_error``): a ``Failed`` request whose
reason is one GKE's autoscaler gives when the request cannot succeed as configured
(no queued pool, more than one pod set, a pod that fits no pool, a bad machine or
reservation, missing permissions; ``CONFIG_ERROR_REASONS``) or whose message says
so (``CONFIG_ERROR_MESSAGES``). Those make the cluster Stalled at once with the
autoscaler's message and are tried again every ``maxBackoffSeconds`` without
spending the retry limit (a pool made meanwhile is found by itself); every other
failure is retried with backoff up to the limit, then Stalled.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from tpuslice.model import constants as c
from tpuslice.model import events
from tpuslice.model.records import (
    NodeInfo,
    ProvisioningAction,
    ProvisioningDecision,
    ProvisioningMode,
    ProvisioningRequestInfo,
    RequestCondition,
    SliceFacts,
    SliceProvisioning,
    SliceState,
)
from tpuslice.render.kuberay import QUEUED_TOLERATION
from tpuslice.spec.parse import ProvisioningSpec, RetryPolicy, SliceClusterSpec

__all__ = [
    "ACCEPT_HINT_SECONDS",
    "CLAIM_WITHIN_SECONDS",
    "CONFIG_ERROR_MESSAGES",
    "CONFIG_ERROR_REASONS",
    "backoff_seconds",
    "config_error",
    "consume_annotations",
    "decide",
    "group_requests",
    "history_from_status",
    "lapsed",
    "podtemplate_body",
    "podtemplate_owner_references",
    "pool_matches_selector",
    "promised_pools",
    "request_body",
    "request_hash",
    "request_labels",
    "request_name",
    "retry_time",
    "slices_to_provision",
    "worker_template_of",
]

#: A provisioned request's capacity is booked for 10 minutes (PROVREQ_BOOKING_SECONDS).
#: A slice must hold its pool and be released well inside that: past this many seconds
#: after Provisioned=True without a claim, the request is given back and asked again
#: (3 minutes left for the release patch, scheduling and the image pull to begin).
CLAIM_WITHIN_SECONDS = 420
#: BookingExpired's reason when the request's pods were bound (OSS autoscaler).
BOOKING_CONSUMED = "CapacityBookingConsumed"
#: A request no autoscaler has accepted after this long gets a hint in the message.
ACCEPT_HINT_SECONDS = 120
#: Longest request (and PodTemplate) name: a label value, so it can be selected on.
MAX_REQUEST_NAME = 63

#: Failed reasons that mean "cannot succeed as configured" (GKE's cluster autoscaler:
#: pkg/provisioningrequests/scaleup/reasons/reasons.go, reconciler/reasons/reasons.go,
#: reconciler/feature_guard_reconciler.go).
CONFIG_ERROR_REASONS = frozenset(
    {
        "NoQueuedNodepoolAvailable",
        "MultiplePodSetsUnsupported",
        "ObtainabilityStrategyUnsupported",
        "ProvisioningRequestNotSchedulableInNodepool",
        "ProvisioningRequestSingleZoneInfeasible",
        "OutOfResources",
        "InvalidArgument",
        "InvalidMachineType",
        "InvalidGPUType",
        "ZoneNotSupported",
        "PermissionDenied",
        "PermissionsError",
        "UnsupportedOperation",
        "InvalidReservation",
        "ReservationNotFound",
        "ReservationIncompatible",
    }
)
#: Message fragments (lower case) that mean the same whatever the reason says.
CONFIG_ERROR_MESSAGES = (
    "no nodepool with queuedprovisioning enabled",
    "supports only single podset",
    "doesn't support multiple podsets",
)

_SCHEDULING_FIELDS = (
    "nodeSelector",
    "affinity",
    "tolerations",
    "priorityClassName",
    "runtimeClassName",
    "schedulerName",
    "topologySpreadConstraints",
)


# ------------------------------------------------------------------------- names


def request_name(raycluster: str, index: int, attempt: int) -> str:
    """``<raycluster>-s<index>-<attempt>``, the name of a slice's request and PodTemplate.

    By the RayCluster (not the TPUSlice object): RayCluster names are unique in a
    namespace across all three kinds, and a TPUSliceService has two clusters during an
    upgrade. Within 63 characters (53 + a 4-digit index + a 3-digit attempt fit);
    longer ones keep a prefix and a digest of the whole, so they stay unique."""
    name = f"{raycluster}-s{index}-{attempt}"
    if len(name) <= MAX_REQUEST_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    tail = f"-{digest}-s{index}-{attempt}"
    return raycluster[: max(1, MAX_REQUEST_NAME - len(tail))].rstrip("-") + tail


def request_labels(
    spec: SliceClusterSpec, raycluster: str, index: int, attempt: int
) -> dict[str, str]:
    """Labels of a slice's request and PodTemplate: the owner (as on its pods), the
    RayCluster, the slice index and the attempt."""
    labels = {
        c.LABEL_CLUSTER: spec.name,
        c.LABEL_RAYCLUSTER: raycluster,
        c.LABEL_SLICE_INDEX: str(index),
        c.LABEL_PROVISIONING_ATTEMPT: str(attempt),
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
    }
    if spec.owner_kind != c.KIND_CLUSTER:
        labels[c.LABEL_OWNER_KIND] = spec.owner_kind
    return labels


def _owner(spec: SliceClusterSpec, *, controller: bool) -> dict[str, Any]:
    return {
        "apiVersion": c.API_VERSION,
        "kind": spec.owner_kind,
        "name": spec.name,
        "uid": spec.uid,
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def _metadata(spec: SliceClusterSpec, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if spec.namespace:
        meta["namespace"] = spec.namespace
    meta["labels"] = dict(labels)
    return meta


# ---------------------------------------------------------------------- template


def worker_template_of(cluster_spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The TPU worker group's pod template in a rendered RayCluster spec (a RayJob's
    rayClusterSpec or a RayService's rayClusterConfig are the same)."""
    for group in cluster_spec.get("workerGroupSpecs") or []:
        if group.get("groupName") == c.WORKER_GROUP:
            template = group.get("template")
            return template if isinstance(template, Mapping) else None
    return None


def _container(raw: Mapping[str, Any]) -> dict[str, Any]:
    """What the autoscaler's simulation needs of a container: its requests (and the
    name and image a PodTemplate must have), and host ports, which limit placement."""
    out: dict[str, Any] = {"name": raw.get("name", ""), "image": raw.get("image", "")}
    if raw.get("resources"):
        out["resources"] = json.loads(json.dumps(raw["resources"]))
    ports = [dict(p) for p in raw.get("ports") or [] if p.get("hostPort")]
    if ports:
        out["ports"] = ports
    return out


def _with_not_in(affinity: Mapping[str, Any] | None, pools: Sequence[str]) -> dict[str, Any]:
    """``affinity`` with ``cloud.google.com/gke-nodepool NotIn pools`` required in every
    node selector term (terms are ORed, so each one must carry it)."""
    out = json.loads(json.dumps(affinity or {}))
    expression = {"key": c.NODE_LABEL_NODEPOOL, "operator": "NotIn", "values": list(pools)}
    node = out.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        term.setdefault("matchExpressions", []).append(dict(expression))
    required["nodeSelectorTerms"] = terms
    return out  # type: ignore[no-any-return]


def _tolerates(tolerations: Sequence[Mapping[str, Any]], key: str) -> bool:
    return any(
        t.get("key") == key or (not t.get("key") and t.get("operator") == "Exists")
        for t in tolerations
    )


def podtemplate_body(
    spec: SliceClusterSpec,
    *,
    raycluster: str,
    index: int,
    attempt: int,
    worker_template: Mapping[str, Any],
    exclude_pools: Collection[str] = (),
) -> dict[str, Any]:
    """The core/v1 PodTemplate a slice's request points at: a gate-free copy of the
    worker pods' scheduling fields (selectors including the TPU and capacity keys,
    tolerations, affinity, container requests), never pinned to a node pool. For a
    queued class it tolerates ``cloud.google.com/gke-queued``; for the others it
    requires ``cloud.google.com/gke-nodepool NotIn exclude_pools`` (the pools that
    have nodes already, so the autoscaler cannot count capacity across them).

    Owned by the TPUSlice object (not as controller) until the shell adds the request
    as its controller (``podtemplate_owner_references``). Deterministic, so the shell
    can compare it with the stored one: PodTemplates are mutable and the autoscaler
    re-reads them every loop, so a stale ``exclude_pools`` is refreshed by an update."""
    prov = spec.provisioning or ProvisioningSpec(mode=ProvisioningMode.NONE)
    pod_spec = worker_template.get("spec") or {}
    out_spec: dict[str, Any] = {}
    for key in _SCHEDULING_FIELDS:
        if pod_spec.get(key):
            out_spec[key] = json.loads(json.dumps(pod_spec[key]))
    selector = {
        k: v for k, v in (out_spec.get("nodeSelector") or {}).items() if k != c.NODE_LABEL_NODEPOOL
    }
    selector.setdefault(c.NODE_LABEL_ACCELERATOR, spec.shape.generation.gke_accelerator)
    selector.setdefault(c.NODE_LABEL_TOPOLOGY, spec.shape.topology)
    selector.update(prov.node_selector)
    out_spec["nodeSelector"] = dict(sorted(selector.items()))
    tolerations = list(out_spec.get("tolerations") or [])
    if not _tolerates(tolerations, c.TPU_TAINT_KEY):
        tolerations.append({"key": c.TPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
    if prov.queued and not _tolerates(tolerations, c.QUEUED_TAINT_KEY):
        tolerations.append(dict(QUEUED_TOLERATION))
    out_spec["tolerations"] = tolerations
    if not prov.queued and exclude_pools:
        out_spec["affinity"] = _with_not_in(out_spec.get("affinity"), sorted(set(exclude_pools)))
    out_spec["containers"] = [_container(x) for x in pod_spec.get("containers") or []]
    if pod_spec.get("initContainers"):
        out_spec["initContainers"] = [_container(x) for x in pod_spec["initContainers"]]
    template_meta = worker_template.get("metadata") or {}
    name = request_name(raycluster, index, attempt)
    meta = _metadata(spec, name, request_labels(spec, raycluster, index, attempt))
    if spec.uid:
        meta["ownerReferences"] = [_owner(spec, controller=False)]
    return {
        "apiVersion": "v1",
        "kind": c.PODTEMPLATE_KIND,
        "metadata": meta,
        "template": {
            "metadata": {"labels": dict(template_meta.get("labels") or {})},
            "spec": out_spec,
        },
    }


def podtemplate_owner_references(
    spec: SliceClusterSpec, request: str, request_uid: str
) -> list[dict[str, Any]]:
    """The PodTemplate's whole ownerReferences once its request exists: the request as
    controller (so the autoscaler never sees a request without its template for long:
    garbage collection deletes the template with it) and the TPUSlice object, not as
    controller (only one owner may be). For a merge patch of ``metadata.ownerReferences``."""
    owners = [
        {
            "apiVersion": c.PROVREQ_API_VERSION,
            "kind": c.PROVREQ_KIND,
            "name": request,
            "uid": request_uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    if spec.uid:
        owners.append(_owner(spec, controller=False))
    return owners


# ----------------------------------------------------------------------- request


def request_hash(spec: SliceClusterSpec) -> str:
    """Digest of what a request's immutable spec is made of (class, parameters, pod
    count): a request whose digest differs is replaced while not yet provisioned."""
    prov = spec.provisioning
    payload = {
        "class": prov.class_name if prov else "",
        "parameters": dict(sorted((prov.parameters if prov else {}).items())),
        "count": spec.shape.hosts,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def request_body(
    spec: SliceClusterSpec, *, raycluster: str, index: int, attempt: int, failures: int = 0
) -> dict[str, Any]:
    """The ProvisioningRequest of one slice: one pod set of hosts-per-slice pods of the
    PodTemplate of the same name, the mode's class (or the override), the parameters as
    written. Controller-owned by the TPUSlice object."""
    prov = spec.provisioning
    if prov is None or not prov.enabled:
        raise ValueError("spec.reservation.provisioning asks for no requests")
    name = request_name(raycluster, index, attempt)
    meta = _metadata(spec, name, request_labels(spec, raycluster, index, attempt))
    meta["annotations"] = {
        c.ANNOTATION_PROVISIONING_FAILURES: str(failures),
        c.ANNOTATION_PROVREQ_HASH: request_hash(spec),
    }
    if spec.uid:
        meta["ownerReferences"] = [_owner(spec, controller=True)]
    body: dict[str, Any] = {
        "apiVersion": c.PROVREQ_API_VERSION,
        "kind": c.PROVREQ_KIND,
        "metadata": meta,
        "spec": {
            "provisioningClassName": prov.class_name,
            "podSets": [{"podTemplateRef": {"name": name}, "count": spec.shape.hosts}],
        },
    }
    if prov.parameters:
        body["spec"]["parameters"] = dict(prov.parameters)
    return body


def consume_annotations(request: str, class_name: str) -> dict[str, str]:
    """Both annotations a pod consuming ``request`` carries (the release patch adds them)."""
    return {c.ANNOTATION_CONSUME_PROVREQ: request, c.ANNOTATION_PROVREQ_CLASS: class_name}


def history_from_status(status: Mapping[str, Any]) -> dict[int, SliceProvisioning]:
    """status.slices[].provisioning by slice index: the attempt and failure count to go
    on from when a slice has no request (deleted by us between attempts, or by someone)."""
    out: dict[int, SliceProvisioning] = {}
    for entry in status.get("slices") or []:
        prov = entry.get("provisioning") if isinstance(entry, Mapping) else None
        index = entry.get("index") if isinstance(entry, Mapping) else None
        if not isinstance(prov, Mapping) or not isinstance(index, int):
            continue
        try:
            out[index] = SliceProvisioning(
                request=str(prov.get("request") or ""),
                attempt=int(prov.get("attempt") or 0),
                failures=int(prov.get("failures") or 0),
            )
        except (TypeError, ValueError):
            continue
    return out


def group_requests(
    requests: Iterable[ProvisioningRequestInfo],
) -> tuple[dict[tuple[str, int], ProvisioningRequestInfo], list[ProvisioningRequestInfo]]:
    """Our requests of one TPUSlice object by slice, (raycluster, slice index) -> the
    newest attempt (the one ``decide`` is about), and the rest: older attempts of a
    slice, retired requests (``ProvisioningRequestInfo.retired``) and requests without
    our labels, which the shell deletes (a retired one once its pool has no nodes). A
    key with no live slice is decided with ``SliceFacts(index, raycluster,
    exists=False)``."""
    newest: dict[tuple[str, int], ProvisioningRequestInfo] = {}
    extra: list[ProvisioningRequestInfo] = []
    for request in sorted(requests, key=lambda r: (r.attempt, r.name)):
        if request.slice_index is None or not request.raycluster or request.retired:
            extra.append(request)
            continue
        key = (request.raycluster, request.slice_index)
        if key in newest:
            extra.append(newest[key])
        newest[key] = request
    return newest, [r for r in extra if not r.deleting]


def lapsed(request: ProvisioningRequestInfo) -> bool:
    """Whether the request's capacity is over: Failed, its booking expired, or revoked."""
    return any(
        request.is_true(kind)
        for kind in (c.PROVREQ_FAILED, c.PROVREQ_BOOKING_EXPIRED, c.PROVREQ_CAPACITY_REVOKED)
    )


def promised_pools(requests: Iterable[ProvisioningRequestInfo]) -> dict[str, str]:
    """Node pools a live provisioned request names (queued class): pool -> request name.

    A fresh queued pool is free and eligible to every slice of its shape the moment its
    nodes are Ready, so another waiting cluster could claim it first (Kueue met the same:
    kubernetes-sigs/kueue#9048). The planner should keep these pools for the slice whose
    request names them and out of everyone else's eligible set. Other classes name no
    pool (capacity-facts.md section 2), so their fresh pools cannot be promised."""
    out: dict[str, str] = {}
    for request in requests:
        pool = request.node_pool
        live = not lapsed(request) and not request.deleting
        if pool and request.is_true(c.PROVREQ_PROVISIONED) and live:
            out[pool] = request.name
    return out


def slices_to_provision(waiting: Iterable[int], free_pools: int) -> frozenset[int]:
    """Of the slices that wait for a pool (all pods created, no pool held), those that
    should ask for capacity: all but the first ``free_pools`` by index, which the
    existing free pools will serve (an AllSlices gang claims none of them until it can
    claim all, so its slices all wait while some pools are free)."""
    ordered = sorted(set(waiting))
    return frozenset(ordered[max(0, free_pools) :])


def pool_matches_selector(nodes: Iterable[NodeInfo], selector: Mapping[str, str]) -> bool:
    """Whether every node of a pool carries the capacity labels ``selector`` asks for
    (pods selecting them could not run elsewhere, so other pools are not eligible)."""
    if not selector:
        return True
    nodes = list(nodes)
    return bool(nodes) and all(
        all(n.capacity_labels.get(k) == v for k, v in selector.items()) for n in nodes
    )


# ----------------------------------------------------------------------- backoff


def backoff_seconds(failures: int, retry: RetryPolicy) -> int:
    """Wait before the attempt after the ``failures``-th failure: the base, doubled per
    failure after the first, never more than the max (0 before any failure)."""
    if failures <= 0:
        return 0
    doublings = min(failures - 1, 40)  # 2**40 s is far beyond any max
    return int(min(retry.max_backoff_seconds, retry.base_backoff_seconds * 2**doublings))


def retry_time(failed_at: datetime, failures: int, retry: RetryPolicy) -> datetime:
    """When the next attempt may be made after the ``failures``-th failure at ``failed_at``."""
    return failed_at + timedelta(seconds=backoff_seconds(failures, retry))


def config_error(condition: RequestCondition | None) -> bool:
    """Whether a Failed condition says the request cannot succeed as configured."""
    if condition is None or not condition.true:
        return False
    if condition.reason in CONFIG_ERROR_REASONS:
        return True
    text = condition.message.lower()
    return any(fragment in text for fragment in CONFIG_ERROR_MESSAGES)


# ---------------------------------------------------------------- the state machine


def _when(
    cond: RequestCondition | None, request: ProvisioningRequestInfo, now: datetime
) -> datetime:
    if cond is not None and cond.last_transition is not None:
        return cond.last_transition
    return request.created or now


def _said(cond: RequestCondition | None) -> str:
    """``Reason: message`` of a condition, as the autoscaler wrote it."""
    if cond is None:
        return ""
    if cond.reason and cond.message:
        return f"{cond.reason}: {cond.message}"
    return cond.reason or cond.message


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def decide(
    slice_: SliceFacts,
    request: ProvisioningRequestInfo | None,
    spec: SliceClusterSpec,
    *,
    now: datetime,
    history: SliceProvisioning | None = None,
    claim_within: float = CLAIM_WITHIN_SECONDS,
) -> ProvisioningDecision:
    """What to do about one slice's ProvisioningRequest now. Pure: the same input gives
    the same decision, so a pass interrupted anywhere is simply decided again.

    ``request`` is the slice's newest request of ours (None: none exists); ``history``
    the slice's ``status.slices[].provisioning`` (``history_from_status``), used when
    no request exists. ``now`` is timezone-aware UTC, like the request's timestamps.

    The cases, in order:

    - provisioning not wanted (absent, mode None, policy None, suspended): delete the
      request of a slice that holds no pool (a running slice keeps its own);
    - the request is being deleted: wait for it;
    - the slice is gone (scale-down, pods gone): delete its request;
    - the slice holds a pool that is not the request's capacity (the request was never
      provisioned, or names another pool): delete the request;
    - the slice is released (its pods run on the pool): keep the request while it runs;
      ``CapacityRevoked``, or ``BookingExpired``/``Failed`` before every pod was bound,
      means the capacity is gone: replace the slice (delete its pods; KubeRay makes a
      new replica, which asks again) and delete the request;
    - the slice holds the request's pool, not yet released: the request stays until
      the release; if its booking
      lapses first (``BookingExpired``/``CapacityRevoked``/``Failed``) the pool is given
      back (an existing pool again if its nodes are still there, else the slice asks
      again: a failure, unless only its gang held it back);
    - the slice holds no pool:
      - no request: create attempt N+1 once all its pods exist and no free pool is
        there for it, unless the retry limit is spent (Stalled);
      - a free existing pool is there for it and the request is not provisioned: delete
        the request (existing pools first, always);
      - ``Failed`` with a configuration error: Stalled with the autoscaler's message,
        tried again every maxBackoffSeconds without spending the limit;
      - ``Failed`` otherwise, ``BookingExpired``, ``CapacityRevoked``: retried after the
        backoff (the lapsed request stays until then: it keeps the time), up to the
        limit, then Stalled;
      - a request made from another spec (class, parameters) not yet provisioned:
        replaced by the next attempt;
      - ``Provisioned``: claim within ``claim_within`` seconds (queued: the pool its
        status names; others: any fresh whole pool), else give it back and ask again
        (a failure: capacity that never becomes a claimable pool ends Stalled);
      - otherwise wait, the slice Provisioning with the request's own message.
    """
    prov = spec.provisioning
    index = slice_.index
    if request is not None:
        attempt, failures = request.attempt, request.failures
    elif history is not None:
        attempt, failures = history.attempt, history.failures
    else:
        attempt, failures = 0, 0
    raycluster = slice_.raycluster or (request.raycluster if request else "") or spec.name

    def out(action: ProvisioningAction, **kw: Any) -> ProvisioningDecision:
        fields: dict[str, Any] = {
            "index": index,
            "request": request.name if request is not None else None,
            "attempt": attempt,
            "failures": failures,
        }
        fields.update(kw)
        return ProvisioningDecision(action, **fields)

    holds = slice_.pool is not None
    wanted = prov is not None and prov.enabled and spec.gated and not spec.suspend

    # ---- nothing to ask for
    if not wanted:
        if request is None:
            return out(ProvisioningAction.NONE)
        if holds or slice_.released:
            return out(ProvisioningAction.KEEP)
        if request.deleting:
            return out(ProvisioningAction.WAIT)
        return out(
            ProvisioningAction.DELETE,
            delete=request.name,
            reason=events.PROVISIONING_REQUEST_DELETED,
            message=f"deleting ProvisioningRequest {request.name}: spec.reservation."
            f"provisioning asks for no capacity",
        )
    assert prov is not None
    retry = prov.retry

    if request is not None and request.deleting:
        waiting = slice_.exists and not holds and not slice_.released
        return out(
            ProvisioningAction.WAIT,
            state=SliceState.PROVISIONING if waiting else None,
            message=f"ProvisioningRequest {request.name} is being deleted" if waiting else "",
        )

    # ---- the slice is gone
    if not slice_.exists:
        if request is None:
            return out(ProvisioningAction.NONE)
        return out(
            ProvisioningAction.DELETE,
            delete=request.name,
            reason=events.PROVISIONING_REQUEST_DELETED,
            message=f"slice {index} is gone; deleting ProvisioningRequest {request.name}",
        )

    failed = request.condition(c.PROVREQ_FAILED) if request else None
    expired = request.condition(c.PROVREQ_BOOKING_EXPIRED) if request else None
    revoked = request.condition(c.PROVREQ_CAPACITY_REVOKED) if request else None
    provisioned = request.condition(c.PROVREQ_PROVISIONED) if request else None
    is_failed = failed is not None and failed.true
    is_expired = expired is not None and expired.true
    is_revoked = revoked is not None and revoked.true
    is_provisioned = provisioned is not None and provisioned.true
    # The OSS autoscaler ends a booking as soon as the request's pods are bound
    # (processors/provreq/processor.go: BookingExpired reason CapacityBookingConsumed):
    # the capacity is in use, never lost; our pod store may show the binding later.
    consumed = is_expired and expired is not None and expired.reason == BOOKING_CONSUMED

    # Whether the pool the slice holds is the request's capacity: it was provisioned, and
    # (queued) it is the pool the request names. Otherwise the slice took an existing
    # pool and the request is merely left over.
    ours = is_provisioned and (
        not prov.queued or request is None or request.node_pool in (None, slice_.pool)
    )

    # ---- released: the slice runs (or starts) on the request's capacity
    if slice_.released:
        if request is None:
            return out(ProvisioningAction.NONE)
        if not ours:
            return out(
                ProvisioningAction.DELETE,
                delete=request.name,
                reason=events.PROVISIONING_REQUEST_DELETED,
                message=f"slice {index} runs on node pool {slice_.pool}, not on the capacity of "
                f"ProvisioningRequest {request.name}; deleting it",
            )
        lost: RequestCondition | None = None
        reason = ""
        if is_revoked:
            lost, reason = revoked, events.CAPACITY_REVOKED
        elif not slice_.bound and is_expired and not consumed:
            lost, reason = expired, events.BOOKING_EXPIRED
        elif not slice_.bound and is_failed:
            lost, reason = failed, events.PROVISIONING_RETRY
        if lost is None:
            return out(ProvisioningAction.KEEP)
        return out(
            ProvisioningAction.REPLACE,
            replace_slice=True,
            delete=request.name,
            reason=reason,
            # revoked after a run is the end of a lease, not a failure of the request
            failures=failures if is_revoked else failures + 1,
            message=f"ProvisioningRequest {request.name}: {_said(lost)}; the capacity under "
            f"slice {index} is gone, replacing the slice (it asks again)",
        )

    # ---- holds a pool, not released yet
    if holds:
        if request is None:
            return out(ProvisioningAction.NONE)
        if not ours:
            return out(
                ProvisioningAction.DELETE,
                delete=request.name,
                reason=events.PROVISIONING_REQUEST_DELETED,
                message=f"slice {index} holds node pool {slice_.pool}; deleting "
                f"ProvisioningRequest {request.name}",
            )
        lapsed = next((x for x in (revoked, expired, failed) if x is not None and x.true), None)
        if lapsed is not None:
            # the gang held it back, not the request: no failure, and nothing to wait for
            gang = slice_.gang_waiting
            return out(
                ProvisioningAction.GIVE_BACK,
                give_back=True,
                delete=request.name if gang else None,
                reason=events.BOOKING_EXPIRED,
                message=f"ProvisioningRequest {request.name}: {_said(lapsed)} before the "
                f"slice was released{' (its gang was short)' if gang else ''}; giving node "
                f"pool {slice_.pool} back",
            )
        return out(ProvisioningAction.KEEP)

    # ---- holds no pool
    def stall_spent(count: int, why: str) -> ProvisioningDecision:
        return out(
            ProvisioningAction.STALL,
            failures=count,
            reason=events.PROVISIONING_FAILED,
            stalled=f"slice {index}: {why}{count} failed attempts, spec.reservation."
            f"provisioning.retry.limit {retry.limit} spent; raise the limit to try again",
            state=SliceState.PROVISIONING,
            message=f"{why}retry limit {retry.limit} spent",
        )

    def create(count: int, why: str, reason: str) -> ProvisioningDecision:
        if count > retry.limit:
            return stall_spent(count, why)
        if not slice_.pods_complete and request is not None:
            # the next attempt waits for all pods; the count is kept in status meanwhile
            return out(
                ProvisioningAction.DELETE,
                delete=request.name,
                failures=count,
                reason=reason,
                state=SliceState.PROVISIONING,
                message=f"{why}asking again once all pods of the slice exist",
            )
        new = request_name(raycluster, index, attempt + 1)
        return out(
            ProvisioningAction.RETRY if request is not None else ProvisioningAction.CREATE,
            delete=request.name if request is not None else None,
            create_attempt=attempt + 1,
            failures=count,
            request=new,
            attempt=attempt + 1,
            reason=reason,
            state=SliceState.PROVISIONING,
            message=f"{why}asking the cluster autoscaler for a node pool: "
            f"ProvisioningRequest {new} ({prov.class_name}), attempt {attempt + 1}",
        )

    if request is None:
        if not slice_.pods_complete or slice_.eligible_pool:
            return out(ProvisioningAction.NONE)
        return create(failures, "", events.PROVISIONING_REQUESTED)

    live = is_provisioned and not (is_failed or is_expired or is_revoked)
    if slice_.eligible_pool and not live:
        return out(
            ProvisioningAction.DELETE,
            delete=request.name,
            reason=events.PROVISIONING_REQUEST_DELETED,
            message=f"a free node pool is there for slice {index}; deleting "
            f"ProvisioningRequest {request.name}",
        )

    if is_failed and config_error(failed):
        said = _said(failed)
        again = _when(failed, request, now) + timedelta(seconds=retry.max_backoff_seconds)
        if now >= again and slice_.pods_complete:
            return create(
                failures, f"{request.name} was refused ({said}); ", events.PROVISIONING_RETRY
            )
        return out(
            ProvisioningAction.STALL,
            reason=events.PROVISIONING_FAILED,
            stalled=f"slice {index}: the cluster autoscaler refused ProvisioningRequest "
            f"{request.name}: {said}; fix the node pools or spec.reservation.provisioning "
            f"(tried again at {_stamp(again)})",
            retry_at=again if again > now else None,
            state=SliceState.PROVISIONING,
            message=f"refused: {said}",
        )

    lapsed = failed if is_failed else revoked if is_revoked else expired if is_expired else None
    if lapsed is not None:
        count = failures + 1
        verb = "failed" if lapsed is failed else "lapsed"
        why = f"{request.name} {verb} ({_said(lapsed)}); "
        if count > retry.limit:
            return stall_spent(count, why)
        at = retry_time(_when(lapsed, request, now), count, retry)
        if now >= at and slice_.pods_complete:
            return create(count, why, events.PROVISIONING_RETRY)
        left = retry.limit - count
        return out(
            ProvisioningAction.WAIT,
            reason=events.PROVISIONING_RETRY
            if lapsed is failed
            else events.CAPACITY_REVOKED
            if lapsed is revoked
            else events.BOOKING_EXPIRED,
            retry_at=at if at > now else None,
            state=SliceState.PROVISIONING,
            message=f"{why}attempt {attempt + 1} at {_stamp(at)} ({left} more "
            f"retr{'y' if left == 1 else 'ies'} after it)",
        )

    if not is_provisioned and (
        request.class_name != prov.class_name
        or (request.spec_hash and request.spec_hash != request_hash(spec))
    ):
        return create(
            failures, f"{request.name} was made from another spec; ", events.PROVISIONING_RETRY
        )

    if is_provisioned:
        since = _when(provisioned, request, now)
        deadline = since + timedelta(seconds=claim_within)
        if now >= deadline and slice_.eligible_pool:
            # a free pool is there (maybe this one) but was not taken in time: drop the
            # request and let the planner treat the pool as any other
            return out(
                ProvisioningAction.DELETE,
                delete=request.name,
                reason=events.BOOKING_GIVEN_BACK,
                message=f"{request.name} was provisioned at {_stamp(since)} and not claimed "
                f"within {int(claim_within)} s; giving it back (a free node pool is there)",
            )
        if now >= deadline:
            return create(
                failures + 1,
                f"{request.name} was provisioned at {_stamp(since)} and no node pool of it could "
                f"be claimed within {int(claim_within)} s; given back; ",
                events.BOOKING_GIVEN_BACK,
            )
        if prov.queued:
            pool = request.node_pool
            if pool is None:
                return out(
                    ProvisioningAction.WAIT,
                    retry_at=deadline,
                    state=SliceState.PROVISIONING,
                    message=f"ProvisioningRequest {request.name} is provisioned but names no "
                    f"node pool yet (provisioningClassDetails.NodePoolName)",
                )
            return out(
                ProvisioningAction.CLAIM,
                claim_pool=pool,
                retry_at=deadline,
                reason=events.CAPACITY_PROVISIONED,
                state=SliceState.PROVISIONING,
                message=f"capacity provisioned (ProvisioningRequest {request.name}); claiming "
                f"node pool {pool} once its nodes are ready, by {_stamp(deadline)}",
            )
        return out(
            ProvisioningAction.CLAIM,
            search_pools=True,
            retry_at=deadline,
            reason=events.CAPACITY_PROVISIONED,
            state=SliceState.PROVISIONING,
            message=f"capacity provisioned (ProvisioningRequest {request.name}); claiming a "
            f"new whole node pool by {_stamp(deadline)}",
        )

    # ---- waiting for the autoscaler, in its own words (GKE: queue position, ETA)
    accepted = request.condition(c.PROVREQ_ACCEPTED)
    said = (provisioned.message if provisioned else "") or (accepted.message if accepted else "")
    if accepted is None or not accepted.true:
        age = (now - request.created).total_seconds() if request.created else 0.0
        text = f"waiting for the cluster autoscaler to accept ProvisioningRequest {request.name}"
        if said:
            text += f": {said}"
        elif age > ACCEPT_HINT_SECONDS:
            text += (
                f" (none has in {int(age)} s: is one running with provisioning requests "
                f"enabled, and does it serve class {request.class_name}?)"
            )
        return out(ProvisioningAction.WAIT, state=SliceState.PROVISIONING, message=text)
    head = f"ProvisioningRequest {request.name} ({request.class_name}) accepted"
    return out(
        ProvisioningAction.WAIT,
        state=SliceState.PROVISIONING,
        message=f"{head}: {said}" if said else f"{head}; waiting for capacity",
    )
