"""GKE's side of the ProvisioningRequest contract, as pure decisions (a simulation).

The cluster autoscaler cannot be built for CI here (the Go module proxy refuses
it), so the local cluster plays its part: ``tpusim.provisioner`` reads requests,
their PodTemplates, nodes and pods, asks ``decide`` what GKE would do next, and
carries that out. Everything in this module is data in, data out, so each rule
is unit-tested without a cluster. Nothing here is imported from the operator:
a fake GKE that shared the operator's tables would agree with its mistakes.

Sources (what each rule below cites):

- [types] kubernetes/autoscaler
  ``cluster-autoscaler/apis/provisioningrequest/autoscaling.x-k8s.io/v1/types.go``:
  the API, condition types, the two OSS classes, the consume annotations.
- [oss-processor] kubernetes/autoscaler ``cluster-autoscaler/processors/provreq/processor.go``:
  ``defaultReservationTime`` 10 min -> ``BookingExpired`` (reason
  ``CapacityReservationTimeExpired``); on main also ``BookingExpired`` as soon as
  every pod of the request is scheduled (``CapacityBookingConsumedReason``).
- [oss-conditions] kubernetes/autoscaler
  ``cluster-autoscaler/provisioningrequest/conditions/conditions.go``: the OSS
  reasons and messages (``Accepted``, ``CapacityIsProvisioned``, ``CapacityIsFound``,
  ``CapacityIsNotFound``, ``CapacityReservationTimeExpired``).
- [oss-client] kubernetes/autoscaler
  ``cluster-autoscaler/provisioningrequest/provreqclient/client.go``:
  ``ProvisioningRequests()`` fails the whole list when any request's PodTemplate is
  missing ("while fetching pod templates for List Provisioning Request ...").
- [gke-state] GoogleCloudPlatform/cluster-autoscaler
  ``pkg/provisioningrequests/provreqstate/state.go``: the queued class's states (a
  new request is initialised with ``Accepted=False NotAccepted``), reasons and
  messages (``SuccessfullyQueued``, ``Provisioned``, ``BookingExpired``,
  ``CapacityRevoked``), ``BookingDuration`` 10 min, and which conditions each state
  requires (``CapacityRevoked`` only with ``BookingExpired``).
- [gke-guard] same repo, ``pkg/provisioningrequests/reconciler/feature_guard_reconciler.go``:
  more than one PodSet -> ``Failed`` ``MultiplePodSetsUnsupported``.
- [gke-finalizer] same repo,
  ``pkg/provisioningrequests/reconciler/provisioning_request_finalizer.go``:
  ``Provisioned`` -> ``BookingExpired`` after ``BookingDuration`` whether or not pods
  came (the booking only shields the nodes from scale-down), ``BookingExpired`` ->
  ``CapacityRevoked`` once ``maxRunDurationSeconds`` (default 7 d) has passed since
  ``Provisioned`` ("as the VMs were deleted by the GCP").
- [gke-wrapper] same repo, ``pkg/provisioningrequests/queuedwrapper/wrapper.go``: the
  class name ``queued-provisioning.gke.io``, the ``maxRunDurationSeconds`` parameter
  and the ``provisioningClassDetails`` keys.
- [gke-scaleup] same repo, ``pkg/provisioningrequests/scaleup/orchestrator.go`` and
  ``scaleup/reasons/reasons.go``: no matching queued node pool ->
  ``Accepted=False NoQueuedNodepoolAvailable`` "No nodepool with QueuedProvisioning
  enabled is available for scale up", retried for ``pendingProvisioningRequestRetryPeriod``
  (2 min) after creation, then failed.
- [gke-pods] same repo, ``pkg/provisioningrequests/pods/pods.go``: queued pools carry
  the taint ``cloud.google.com/gke-queued=true:NoSchedule``.
- [gke-labels] same repo, ``pkg/cloudprovider/gke/labels/system_labels.go``:
  ``autoscaling.gke.io/provisioning-request`` on queued nodes names the Resize Request;
  the Resize Request's name is ``gke-<namespace[:20]>-<name[:20]>-<sha256(ns/name)[:16]>``
  (``pkg/cloudprovider/gke/gceclient/resizerequest``, ``ResizeRequestName``).
- [gke-doc] "Run a large-scale workload with flex-start with queued provisioning"
  https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest: queued
  pools are created with ``--flex-start --enable-queued-provisioning``, GKE allocates
  every requested node at once.

- [gke-tpus] "About TPUs in GKE" https://cloud.google.com/kubernetes-engine/docs/concepts/tpus
  and "Plan TPUs in GKE" https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus:
  a multi-host TPU slice node pool is atomic and immutable (no node can be added to it);
  a single-host pool is not; "Use TPUs with KubeRay" (docs.ray.io): GKE scales
  multi-host slices "atomically by node pools, rather than individual nodes". The
  autoscaler's rule: GoogleCloudPlatform/cluster-autoscaler@7d250507
  ``pkg/cloudprovider/gke/gke_cloud_provider_impl.go`` ``ResizeAtomically()`` (multi-host
  TPU, GPU slices, bulk provisioning only). That a single-host pool therefore grows one
  VM per pending slice, from 0 nodes (no Node objects) up to its max, is inferred from
  these (fleet-facts.md §2), not quoted.
- [oss-best-effort] kubernetes/autoscaler
  ``cluster-autoscaler/provisioningrequest/besteffortatomic/provisioning_class.go``: the
  best-effort-atomic class runs the ordinary scale-up over the existing node groups
  (each within its max size) for all of the request's pods at once.
- [gke-queued-pool] GKE CA ``pkg/autoprovisioning/injection.go`` (capacity-facts.md §2):
  the ``autoscaling.gke.io/provisioning-request`` label is written on the node pool, so
  a queued pool serves one request at a time.

Where the fake is simpler than GKE it says so (``docs/local-cluster.md`` lists it).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from .nodepools import (
    FLEX_START_LABEL,
    PROVISIONING_LABEL,
    RESERVATION_LABEL,
    SPOT_LABEL,
    TPU_RESOURCE,
    TPUPool,
    host_chips,
    node_name,
    pool_nodes,
    topology_chips,
    tpu_type_for_accelerator,
)

__all__ = [
    "BEST_EFFORT_CLASS",
    "CHECK_CAPACITY_CLASS",
    "CONSUME_ANNOTATION",
    "CRD_NAME",
    "FAULT_ANNOTATION",
    "GROUP",
    "GROUP_ANNOTATION",
    "NODE_OWNER_ANNOTATION",
    "PLURAL",
    "POOLS_ANNOTATION",
    "PROVISIONING_REQUEST_LABEL",
    "QUEUED_CLASS",
    "QUEUED_TAINT",
    "REVOKE_ANNOTATION",
    "VERSION",
    "AutoscaledPool",
    "Condition",
    "Decision",
    "Fault",
    "FaultRule",
    "GrowablePool",
    "NodeView",
    "PoolPlan",
    "PoolView",
    "Request",
    "Shape",
    "Timings",
    "choose_fault",
    "decide",
    "format_time",
    "free_nodes",
    "fresh_node_indexes",
    "grow_target",
    "node_group",
    "orphan_pools_to_remove",
    "parse_autoscaled_pools",
    "parse_fault",
    "parse_request",
    "parse_rules",
    "parse_time",
    "resize_request_name",
    "template_shape",
]

GROUP = "autoscaling.x-k8s.io"
VERSION = "v1"
PLURAL = "provisioningrequests"
CRD_NAME = f"{PLURAL}.{GROUP}"

# [types] and [gke-wrapper]
QUEUED_CLASS = "queued-provisioning.gke.io"
BEST_EFFORT_CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
CHECK_CAPACITY_CLASS = "check-capacity.autoscaling.x-k8s.io"
CLASSES = (QUEUED_CLASS, BEST_EFFORT_CLASS, CHECK_CAPACITY_CLASS)
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"
MAX_RUN_PARAMETER = "maxRunDurationSeconds"

ACCEPTED, PROVISIONED, FAILED = "Accepted", "Provisioned", "Failed"
BOOKING_EXPIRED, CAPACITY_REVOKED = "BookingExpired", "CapacityRevoked"

ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: [gke-labels] On queued nodes: the Resize Request that made them.
PROVISIONING_REQUEST_LABEL = "autoscaling.gke.io/provisioning-request"
#: [gke-pods] The taint of queued-provisioning pools.
QUEUED_TAINT: dict[str, str] = {
    "key": "cloud.google.com/gke-queued",
    "value": "true",
    "effect": "NoSchedule",
}

# The simulation's own marks (never GKE's): annotations, so labels stay GKE's.
#: On a node: the request (``namespace/name/uid``) whose pool it belongs to.
NODE_OWNER_ANNOTATION = "tpusim.dev/provisioning-request"
#: On a request: the pools made for it (comma-separated), once made; for a grown
#: pool, the group of nodes added for it (``GROUP_ANNOTATION``'s value).
POOLS_ANNOTATION = "tpusim.dev/pools"
#: On a node added to an existing (declared, autoscaled) pool for a request:
#: ``<pool>/<hash of the request's owner>``. The fake's bookkeeping (empty, revoked,
#: orphaned) then acts on that group, never on the pool's other nodes.
GROUP_ANNOTATION = "tpusim.dev/node-group"
#: On a request: its scripted fault (JSON or a bare kind); see ``parse_fault``.
FAULT_ANNOTATION = "tpusim.dev/fault"
#: On a request: any value revokes its capacity (CapacityRevoked, nodes deleted).
REVOKE_ANNOTATION = "tpusim.dev/revoke"

SIMULATED = " (simulated by tpusim)"

# [gke-state] reasons and messages of the queued class.
Q_NOT_ACCEPTED = ("NotAccepted", "Provisioning Request wasn't accepted.")
Q_ACCEPTED = ("SuccessfullyQueued", "Provisioning Request was successfully queued.")
Q_PROVISIONED = ("Provisioned", "Provisioning Request was successfully provisioned.")
Q_BOOKING_EXPIRED = (
    "BookingExpired",
    "Capacity booking for the Provisioning Request has expired and the nodes are now "
    "candidates for scale down when underutilized.",
)
Q_REVOKED = (
    "CapacityRevoked",
    "Capacity provisioned for the Provisioning Request was reclaimed and is no longer "
    "available in the cluster.",
)
# [gke-guard]
Q_MULTIPLE_POD_SETS = (
    "MultiplePodSetsUnsupported",
    "Provisioning Request doesn't support multiple PodSets, please define only 1.",
)
# [gke-scaleup]
Q_NO_QUEUED_POOL = (
    "NoQueuedNodepoolAvailable",
    "No nodepool with QueuedProvisioning enabled is available for scale up",
)
# [oss-conditions]
O_ACCEPTED = ("Accepted", "ProvisioningRequest is accepted by ClusterAutoscaler")
O_PROVISIONED = ("CapacityIsProvisioned", "Capacity is found in the cluster")
O_FOUND = ("CapacityIsFound", "Capacity is found in the cluster")
O_NOT_FOUND = ("CapacityIsNotFound", "Capacity is not found, CA will try to find it later.")
O_BOOKING_EXPIRED = ("CapacityReservationTimeExpired", "Capacity reservation time is expired")
# [oss-processor] on main; the string is the constant's name (its value was not read).
O_BOOKING_CONSUMED = (
    "CapacityBookingConsumed",
    "Capacity booking is consumed: every pod of the request is scheduled",
)
DEFAULT_FAIL = (
    "ResourcePoolExhausted",
    "Provisioning Request failed: the zone does not have enough resources available",
)

#: [gke-wrapper] DefaultMaxRunDuration.
DEFAULT_MAX_RUN_S = 7 * 24 * 3600.0


def format_time(epoch: float) -> str:
    """RFC 3339 seconds, as metav1.Time serialises."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> float:
    if not text:
        return 0.0
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


# ---------------------------------------------------------------- settings and faults


@dataclass(frozen=True)
class Timings:
    """How long each step takes, in seconds. GKE's own values where it has them.

    ``booking_s`` is [gke-state] BookingDuration / [oss-processor]
    defaultReservationTime (10 min); ``pending_retry_s`` is [gke-scaleup]'s 2 min.
    ``accept_delay_s``, ``provision_delay_s`` (request accepted -> nodes exist) and
    ``scale_down_delay_s`` (a pool with no pods after its booking -> removed; the
    autoscaler's ``--scale-down-unneeded-time``) are the simulation's choice: real
    queued TPU capacity can take hours.
    """

    accept_delay_s: float = 1.0
    provision_delay_s: float = 3.0
    booking_s: float = 600.0
    pending_retry_s: float = 120.0
    scale_down_delay_s: float = 30.0

    def with_overrides(self, raw: Mapping[str, Any]) -> Timings:
        """Override from camelCase or snake_case keys (the ConfigMap's ``settings``)."""
        fields = {
            "acceptDelaySeconds": "accept_delay_s",
            "provisionDelaySeconds": "provision_delay_s",
            "bookingSeconds": "booking_s",
            "pendingRetrySeconds": "pending_retry_s",
            "scaleDownDelaySeconds": "scale_down_delay_s",
        }
        changes: dict[str, float] = {}
        for key, value in raw.items():
            name = fields.get(key, key)
            if name not in fields.values():
                raise ValueError(f"unknown provisioner setting {key!r} ({', '.join(fields)})")
            changes[name] = float(value)
        return replace(self, **changes)


FAULT_KINDS = ("none", "fail", "never", "not-ready-node", "late-nodes", "revoke-after")


@dataclass(frozen=True)
class Fault:
    """A scripted misbehaviour of the fake GKE for one request.

    - ``fail``: ``Failed=True`` with ``reason``/``message`` (default a stock-out) when
      the capacity would have come (``at="provision"``; [gke-state]'s failed state),
      or at once without ``Accepted`` (``at="validate"``, like a configuration
      error: [gke-guard] ``MultiplePodSetsUnsupported``; GKE fails
      ``NoQueuedNodepoolAvailable`` only after [gke-scaleup]'s 2 min of retries
      (``Timings.pending_retry_s``), the fault at once);
    - ``never``: accepted, never provisioned (a queue that does not move: [gke-doc],
      requests wait in the queue until capacity is found, [gke-state]
      ``SuccessfullyQueued``);
    - ``not-ready-node``: the pool comes, node ``node`` (default the last) NotReady
      (nothing GKE documents as a request state; a VM or device plugin that does not
      come up, seen by the operator only through the Node);
    - ``late-nodes``: ``Provisioned=True`` first, the nodes ``seconds`` later (GKE sets
      Provisioned when the Resize Request succeeds, before the Nodes register:
      [gke-state], [gke-finalizer]);
    - ``revoke-after``: ``CapacityRevoked`` ``seconds`` after ``Provisioned``, nodes
      deleted ([gke-finalizer]: after ``maxRunDurationSeconds``; here sooner, on demand).
    """

    kind: str = "none"
    reason: str | None = None
    message: str | None = None
    at: str = "provision"
    node: int | None = None
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {self.kind!r} (one of {', '.join(FAULT_KINDS)})")
        if self.at not in ("provision", "validate"):
            raise ValueError(f"fault 'at' must be provision or validate, not {self.at!r}")

    def to_json(self) -> str:
        raw: dict[str, Any] = {"kind": self.kind}
        for key in ("reason", "message", "node"):
            if getattr(self, key) is not None:
                raw[key] = getattr(self, key)
        if self.at != "provision":
            raw["at"] = self.at
        if self.seconds:
            raw["seconds"] = self.seconds
        return json.dumps(raw, sort_keys=True)


def parse_fault(text: str | Mapping[str, Any] | None) -> Fault:
    """A fault from an annotation value: a bare kind (``never``) or JSON
    (``{"kind": "fail", "reason": "QuotaExceeded", "message": "..."}``)."""
    if text is None or text == "":
        return Fault()
    if isinstance(text, str):
        text = text.strip()
        if not text.startswith("{"):
            return Fault(kind=text)
        raw = json.loads(text)
    else:
        raw = dict(text)
    known = {"kind", "reason", "message", "at", "node", "seconds"}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"unknown fault fields: {', '.join(sorted(unknown))}")
    return Fault(
        kind=str(raw.get("kind", "none")),
        reason=raw.get("reason"),
        message=raw.get("message"),
        at=str(raw.get("at", "provision")),
        node=None if raw.get("node") is None else int(raw["node"]),
        seconds=float(raw.get("seconds", 0.0)),
    )


@dataclass(frozen=True)
class FaultRule:
    """Give ``fault`` to new requests that match (all given fields must match).

    ``times``: to at most that many requests (None: every one). Counting is done by
    the provisioner that applies it (in memory); the chosen fault is written onto the
    request (``FAULT_ANNOTATION``), so it sticks across restarts.
    """

    fault: Fault
    namespace: str | None = None
    name_regex: str | None = None
    provisioning_class: str | None = None
    times: int | None = None

    @property
    def key(self) -> str:
        return json.dumps(
            [self.fault.to_json(), self.namespace, self.name_regex, self.provisioning_class],
        )

    def matches(self, namespace: str, name: str, class_name: str) -> bool:
        if self.namespace is not None and namespace != self.namespace:
            return False
        if self.provisioning_class is not None and class_name != self.provisioning_class:
            return False
        return self.name_regex is None or re.fullmatch(self.name_regex, name) is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fault": json.loads(self.fault.to_json())}
        for key, value in (
            ("namespace", self.namespace),
            ("nameRegex", self.name_regex),
            ("provisioningClassName", self.provisioning_class),
            ("times", self.times),
        ):
            if value is not None:
                out[key] = value
        return out


def parse_rules(raw: Any) -> list[FaultRule]:
    """Rules from the ConfigMap's ``faults`` (a YAML/JSON list of mappings)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("faults must be a list")
    rules = []
    for item in raw:
        known = {"fault", "namespace", "nameRegex", "provisioningClassName", "times"}
        unknown = set(item) - known
        if unknown:
            raise ValueError(f"unknown fault rule fields: {', '.join(sorted(unknown))}")
        rules.append(
            FaultRule(
                fault=parse_fault(item.get("fault")),
                namespace=item.get("namespace"),
                name_regex=item.get("nameRegex"),
                provisioning_class=item.get("provisioningClassName"),
                times=None if item.get("times") is None else int(item["times"]),
            )
        )
    return rules


def choose_fault(
    rules: Sequence[FaultRule], used: Mapping[str, int], namespace: str, name: str, cls: str
) -> FaultRule | None:
    """The first rule that matches and has uses left."""
    for rule in rules:
        if rule.times is not None and used.get(rule.key, 0) >= rule.times:
            continue
        if rule.matches(namespace, name, cls):
            return rule
    return None


# ---------------------------------------------------------------- the request


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    time: float

    def to_api(self, generation: int) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": format_time(self.time),
            "observedGeneration": generation,
        }


@dataclass(frozen=True)
class Request:
    namespace: str
    name: str
    uid: str
    class_name: str
    pod_sets: tuple[tuple[str, int], ...]  # (template name, count)
    parameters: Mapping[str, str]
    annotations: Mapping[str, str]
    conditions: Mapping[str, Condition]
    details: Mapping[str, str]
    created: float
    generation: int = 1

    @property
    def owner(self) -> str:
        """The value of ``NODE_OWNER_ANNOTATION`` on the request's nodes."""
        return f"{self.namespace}/{self.name}/{self.uid}"

    def true(self, kind: str) -> Condition | None:
        cond = self.conditions.get(kind)
        return cond if cond is not None and cond.status == "True" else None

    @property
    def pools(self) -> tuple[str, ...]:
        raw = self.annotations.get(POOLS_ANNOTATION, "")
        return tuple(p for p in raw.split(",") if p)


def parse_request(obj: Mapping[str, Any]) -> Request:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    conditions = {}
    for raw in status.get("conditions") or []:
        conditions[raw["type"]] = Condition(
            raw["type"],
            raw.get("status", "Unknown"),
            raw.get("reason", ""),
            raw.get("message", ""),
            parse_time(raw.get("lastTransitionTime")),
        )
    pod_sets = tuple(
        ((ps.get("podTemplateRef") or {}).get("name", ""), int(ps.get("count", 0)))
        for ps in spec.get("podSets") or []
    )
    return Request(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        class_name=spec.get("provisioningClassName", ""),
        pod_sets=pod_sets,
        parameters=dict(spec.get("parameters") or {}),
        annotations=dict(meta.get("annotations") or {}),
        conditions=conditions,
        details=dict(status.get("provisioningClassDetails") or {}),
        created=parse_time(meta.get("creationTimestamp")),
        generation=int(meta.get("generation") or 1),
    )


def resize_request_name(namespace: str, name: str) -> str:
    """[gke-labels] GKE's Resize Request name for a request."""
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:16]
    return f"gke-{namespace[:20]}-{name[:20]}-{digest}"


# ---------------------------------------------------------------- what a template asks for


@dataclass(frozen=True)
class Shape:
    """The TPU slice a PodTemplate's pods fit, as the fake judges it."""

    accelerator: str
    tpu_type: str
    topology: str
    chips_per_host: int
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    pool_not_in: frozenset[str] = frozenset()
    pool_in: frozenset[str] | None = None
    #: ``kubernetes.io/hostname NotIn``: nodes the pods must not land on (existing
    #: nodes of the shape, so only new ones count).
    host_not_in: frozenset[str] = frozenset()

    def hosts(self, count: int) -> str | None:
        """None if ``count`` pods make whole slices of this shape, else why not."""
        chips = topology_chips(self.topology)
        if chips > self.chips_per_host and count * self.chips_per_host != chips:
            need = chips // self.chips_per_host
            return (
                f"count {count} does not match topology {self.topology}: a slice has "
                f"{need} hosts of {self.chips_per_host} chips"
            )
        return None


def _chips(spec: Mapping[str, Any]) -> int:
    total = 0
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get(TPU_RESOURCE)
        if value is None:
            value = (resources.get("limits") or {}).get(TPU_RESOURCE)
        if value is not None:
            total += int(str(value))
    return total


def _tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, str]) -> bool:
    for tol in tolerations:
        effect = tol.get("effect")
        if effect and effect != taint["effect"]:
            continue
        key, op = tol.get("key"), tol.get("operator", "Equal")
        if not key and op == "Exists":
            return True
        if key != taint["key"]:
            continue
        if op == "Exists" or tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def _pool_affinity(
    spec: Mapping[str, Any],
) -> tuple[frozenset[str], frozenset[str] | None, frozenset[str]]:
    """gke-nodepool NotIn / In and hostname NotIn of the required node affinity (other
    terms are ignored; the terms' expressions are pooled, not ORed: the templates the
    operator writes have one term)."""
    node_aff = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    not_in: set[str] = set()
    within: set[str] | None = None
    hosts_not_in: set[str] = set()
    for term in node_aff.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            values = {str(v) for v in expr.get("values") or []}
            if expr.get("key") == HOSTNAME_LABEL and expr.get("operator") == "NotIn":
                hosts_not_in |= values
            if expr.get("key") != NODEPOOL_LABEL:
                continue
            if expr.get("operator") == "NotIn":
                not_in |= values
            elif expr.get("operator") == "In":
                within = values if within is None else within & values
    return (
        frozenset(not_in),
        None if within is None else frozenset(within),
        frozenset(hosts_not_in),
    )


def template_shape(template: Mapping[str, Any]) -> Shape | str:
    """The shape of a PodTemplate object, or why no TPU pool GKE has would fit it.

    A pod fits a TPU pool only with both TPU selectors and the ``google.com/tpu``
    toleration (GKE CA ``pkg/cloudprovider/gke/tpu/tpu.go``, as the capacity facts
    sheet records), and it must ask for ``google.com/tpu`` chips.
    """
    spec = ((template.get("template") or {}).get("spec")) or {}
    selector = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
    accelerator, topology = selector.get(ACCELERATOR_LABEL), selector.get(TOPOLOGY_LABEL)
    if not accelerator or not topology:
        missing = [k for k in (ACCELERATOR_LABEL, TOPOLOGY_LABEL) if not selector.get(k)]
        return f"the pod template has no nodeSelector {' and '.join(missing)}"
    tpu_type = tpu_type_for_accelerator(accelerator)
    if tpu_type is None:
        return f"no GKE TPU has the accelerator {accelerator!r}"
    try:
        topology_chips(topology)
    except ValueError as exc:
        return str(exc)
    chips = _chips(spec)
    if chips <= 0:
        return f"the pod template requests no {TPU_RESOURCE}"
    tolerations = tuple(spec.get("tolerations") or [])
    tpu_taint = {"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
    if not _tolerates(tolerations, tpu_taint):
        return f"the pod template does not tolerate the {TPU_RESOURCE} NoSchedule taint"
    not_in, within, hosts_not_in = _pool_affinity(spec)
    return Shape(
        accelerator, tpu_type, topology, chips, selector, tolerations, not_in, within, hosts_not_in
    )


def pool_for(shape: Shape, name: str, count: int, *, queued: bool) -> TPUPool | str:
    """The TPUPool GKE would add for ``count`` pods of ``shape``, or why it cannot.

    Capacity labels come from the template's nodeSelector (spot, reservation,
    flex-start); a queued pool is a flex-start pool ([gke-doc]) unless the template
    asks for a reservation. Other nodeSelector keys (compute class, ...) become labels,
    so the pods fit the nodes made for them.
    """
    mismatch = shape.hosts(count)
    if mismatch:
        return mismatch
    selector = dict(shape.node_selector)
    spot = selector.pop(SPOT_LABEL, None) == "true"
    reservation = selector.pop(RESERVATION_LABEL, None)
    flex = selector.pop(FLEX_START_LABEL, None) == "true"
    if queued and not spot and not reservation:
        flex = True
    for key in (ACCELERATOR_LABEL, TOPOLOGY_LABEL, NODEPOOL_LABEL, PROVISIONING_REQUEST_LABEL):
        selector.pop(key, None)
    selector.pop(PROVISIONING_LABEL, None)
    try:
        return TPUPool(
            name,
            shape.tpu_type,
            shape.topology,
            count,
            chips_per_node=shape.chips_per_host,
            spot=spot,
            reservation=reservation,
            flex_start=flex,
            extra_labels=selector,
        )
    except ValueError as exc:
        return str(exc)


def pool_name(req: Request, index: int, shape: Shape, taken: Iterable[str]) -> str:
    """A fresh pool name for pod set ``index``: the template's own pin if it has one
    (nodeSelector gke-nodepool, or an In list), else one derived from the request,
    never one its NotIn list (or an existing pool) has."""
    pinned = shape.node_selector.get(NODEPOOL_LABEL)
    if pinned:
        return pinned
    avoid = set(shape.pool_not_in) | set(taken)
    if shape.pool_in is not None:
        free = sorted(shape.pool_in - avoid)
        if free:
            return free[0]
    prefix = "dws" if req.class_name == QUEUED_CLASS else "auto"
    digest = hashlib.sha256(f"{req.owner}/{index}".encode()).hexdigest()[:8]
    base = f"{prefix}-{shape.tpu_type}-{shape.topology}-{digest}"
    name, n = base, 1
    while name in avoid:
        name, n = f"{base}-{n}", n + 1
    return name


# ---------------------------------------------------------------- declared autoscaled pools

#: Bounds of a declaration (GKE's own limit is per cluster and zone; these keep the
#: fake's lists small): node count of one pool, pools declared at once.
MAX_POOL_NODES = 1000
MAX_AUTOSCALED_POOLS = 100
_AUTOSCALED_KEYS = frozenset(
    {"name", "tpuType", "accelerator", "topology", "maxNodes", "spot", "reservation"}
    | {"flexStart", "queued"}
)


@dataclass(frozen=True)
class AutoscaledPool:
    """A single-host TPU pool that exists in the cluster's configuration, with autoscaling
    from 0 to ``max_nodes`` ([gke-tpus]): GKE adds one VM per pending single-host slice.
    At 0 nodes it has no Node objects. ``queued``: created with
    ``--enable-queued-provisioning`` (so only the queued class grows it, and its nodes
    carry the queued taint); a queued pool without a capacity type is a flex-start pool
    ([gke-doc]). Multi-host shapes are refused: GKE grows those only as whole slices.
    """

    name: str
    tpu_type: str
    topology: str
    max_nodes: int
    spot: bool = False
    reservation: str | None = None
    flex_start: bool = False
    queued: bool = False

    def __post_init__(self) -> None:
        where = f"autoscaled pool {self.name!r}"
        if (
            not self.name
            or len(self.name) > 40
            or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", self.name)
        ):
            raise ValueError(
                f"{where}: name must be 1-40 lowercase letters, digits and '-', "
                f"starting with a letter (a GKE node pool name)"
            )
        try:
            chips = host_chips(self.tpu_type)
            topo_chips = topology_chips(self.topology)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if topo_chips not in chips:
            raise ValueError(
                f"{where}: topology {self.topology} has {topo_chips} chips, but a "
                f"{self.tpu_type} host has {' or '.join(map(str, chips))}; only single-host "
                f"shapes grow node by node (declare a topology of one host, e.g. "
                f"{'2x2x1' if len(self.topology.split('x')) == 3 else '2x2'})"
            )
        if not 1 <= self.max_nodes <= MAX_POOL_NODES:
            raise ValueError(f"{where}: maxNodes must be 1..{MAX_POOL_NODES}, not {self.max_nodes}")
        self.node_pool(1)  # the TPUPool's own checks (dimensions, one capacity type)

    @property
    def chips_per_host(self) -> int:
        return topology_chips(self.topology)

    def node_pool(self, nodes: int, zone: str = "us-east5-b") -> TPUPool:
        """The pool's ``nodes`` new VMs as a TPUPool (same name, labels, capacity)."""
        try:
            return TPUPool(
                self.name,
                self.tpu_type,
                self.topology,
                nodes,
                chips_per_node=self.chips_per_host,
                zone=zone,
                spot=self.spot,
                reservation=self.reservation,
                flex_start=self.flex_start
                or (self.queued and not self.spot and not self.reservation),
            )
        except ValueError as exc:
            raise ValueError(f"autoscaled {exc}") from None

    def node_labels(self, zone: str, cluster: str) -> dict[str, str]:
        """The labels every node of the pool carries (a node's own hostname left out)."""
        labels = dict(pool_nodes(self.node_pool(1, zone), cluster)[0]["metadata"]["labels"])
        labels.pop(HOSTNAME_LABEL, None)
        return labels

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "tpuType": self.tpu_type,
            "topology": self.topology,
            "maxNodes": self.max_nodes,
        }
        for key, value, default in (
            ("spot", self.spot, False),
            ("reservation", self.reservation, None),
            ("flexStart", self.flex_start, False),
            ("queued", self.queued, False),
        ):
            if value != default:
                out[key] = value
        return out


def _bool_field(raw: Mapping[str, Any], key: str, where: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{where}: {key} must be true or false, not {value!r}")
    return value


def parse_autoscaled_pools(raw: Any) -> list[AutoscaledPool]:
    """Pools from the ConfigMap's ``autoscaledPools``: a YAML list of mappings
    ``{name, tpuType | accelerator, topology, maxNodes, spot?, reservation?, flexStart?,
    queued?}``."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("autoscaledPools must be a list of pools")
    if len(raw) > MAX_AUTOSCALED_POOLS:
        raise ValueError(f"autoscaledPools: at most {MAX_AUTOSCALED_POOLS} pools, not {len(raw)}")
    pools: list[AutoscaledPool] = []
    for index, item in enumerate(raw):
        where = f"autoscaledPools[{index}]"
        if not isinstance(item, Mapping):
            raise ValueError(f"{where} must be a mapping")
        unknown = set(item) - _AUTOSCALED_KEYS
        if unknown:
            raise ValueError(
                f"{where}: unknown fields {', '.join(sorted(map(str, unknown)))} "
                f"(known: {', '.join(sorted(_AUTOSCALED_KEYS))})"
            )
        missing = [k for k in ("name", "topology", "maxNodes") if k not in item]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        tpu_type = item.get("tpuType")
        if "accelerator" in item:
            by_accelerator = tpu_type_for_accelerator(str(item["accelerator"]))
            if by_accelerator is None:
                raise ValueError(f"{where}: no GKE TPU has the accelerator {item['accelerator']!r}")
            if tpu_type is not None and tpu_type != by_accelerator:
                raise ValueError(
                    f"{where}: tpuType {tpu_type!r} disagrees with accelerator "
                    f"{item['accelerator']!r} ({by_accelerator}); give one of them"
                )
            tpu_type = by_accelerator
        if tpu_type is None:
            raise ValueError(f"{where}: give tpuType (v6e) or accelerator (tpu-v6e-slice)")
        max_nodes = item["maxNodes"]
        if isinstance(max_nodes, bool) or not isinstance(max_nodes, int):
            raise ValueError(f"{where}: maxNodes must be a whole number, not {max_nodes!r}")
        reservation = item.get("reservation")
        pools.append(
            AutoscaledPool(
                name=str(item["name"]),
                tpu_type=str(tpu_type),
                topology=str(item["topology"]),
                max_nodes=max_nodes,
                spot=_bool_field(item, "spot", where),
                reservation=None if reservation is None else str(reservation),
                flex_start=_bool_field(item, "flexStart", where),
                queued=_bool_field(item, "queued", where),
            )
        )
    names = [p.name for p in pools]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"autoscaledPools: duplicate pool names {', '.join(dupes)}")
    return pools


#: Declared pools the CLI takes by name (``provisioner --autoscaled-pool v6e-2x2-autoscaled``):
#: GKE's usual single-host serving pool, empty until a slice needs a node.
AUTOSCALED_PRESETS: Mapping[str, AutoscaledPool] = {
    "v6e-2x2-autoscaled": AutoscaledPool("v6e-2x2-autoscaled", "v6e", "2x2", max_nodes=4),
    "v6e-2x2-queued": AutoscaledPool("v6e-2x2-queued", "v6e", "2x2", max_nodes=4, queued=True),
}


def parse_autoscaled_spec(spec: str) -> AutoscaledPool:
    """The CLI shorthand ``NAME:TYPE:TOPOLOGY:MAX_NODES[,OPTION...]`` (options ``queued``,
    ``spot``, ``flex-start``, ``reservation=NAME``) or a preset's name
    (``AUTOSCALED_PRESETS``)."""
    if spec in AUTOSCALED_PRESETS:
        return AUTOSCALED_PRESETS[spec]
    head, *options = spec.split(",")
    parts = head.split(":")
    if len(parts) != 4:
        raise ValueError(
            f"bad autoscaled pool {spec!r}: want NAME:TYPE:TOPOLOGY:MAX_NODES[,OPTION...] "
            f"or a preset ({', '.join(sorted(AUTOSCALED_PRESETS))})"
        )
    raw: dict[str, Any] = {"name": parts[0], "tpuType": parts[1], "topology": parts[2]}
    try:
        raw["maxNodes"] = int(parts[3])
    except ValueError:
        raise ValueError(
            f"bad autoscaled pool {spec!r}: MAX_NODES {parts[3]!r} is not a number"
        ) from None
    flags = {"queued": "queued", "spot": "spot", "flex-start": "flexStart"}
    for option in options:
        key, _, value = option.partition("=")
        if key in flags and not value:
            raw[flags[key]] = True
        elif key == "reservation" and value:
            raw["reservation"] = value
        else:
            raise ValueError(
                f"bad autoscaled pool {spec!r}: unknown option {option!r} "
                f"(queued, spot, flex-start, reservation=NAME)"
            )
    (pool,) = parse_autoscaled_pools([raw])
    return pool


@dataclass(frozen=True)
class GrowablePool:
    """A declared pool as the cluster shows it now: its nodes (ours or not) and the
    Resize Requests (``PROVISIONING_REQUEST_LABEL`` values) its nodes carry."""

    pool: AutoscaledPool
    nodes: int = 0
    resize_requests: frozenset[str] = frozenset()


def _matches_pool(
    shape: Shape, pool: AutoscaledPool, *, queued: bool, zone: str, cluster: str
) -> bool:
    """Pods of ``shape`` would fit a new node of ``pool``: same single-host TPU shape,
    every nodeSelector key agreeing with the node's labels (capacity type, pool pin),
    the pool allowed by the gke-nodepool affinity, the class's kind of pool."""
    if pool.queued != queued:
        return False
    if (shape.tpu_type, shape.topology, shape.chips_per_host) != (
        pool.tpu_type,
        pool.topology,
        pool.chips_per_host,
    ):
        return False
    if pool.name in shape.pool_not_in or (
        shape.pool_in is not None and pool.name not in shape.pool_in
    ):
        return False
    labels = pool.node_labels(zone, cluster)
    return all(labels.get(k) == v for k, v in shape.node_selector.items())


def grow_target(
    req: Request,
    shape: Shape,
    count: int,
    pools: Sequence[GrowablePool],
    *,
    zone: str = "us-east5-b",
    cluster: str = "tpusim",
) -> tuple[AutoscaledPool | None, AutoscaledPool | None]:
    """Which declared pool GKE grows by ``count`` nodes for one pod set of ``req``:
    (the first matching pool with room, the first matching pool at all). Room: its
    nodes plus ``count`` within ``maxNodes``; for a queued pool also no node of another
    request's Resize Request ([gke-queued-pool]). The fake takes the first declared
    pool with room; GKE's expander chooses among node groups by its own policy."""
    queued = req.class_name == QUEUED_CLASS
    if topology_chips(shape.topology) != shape.chips_per_host:
        return None, None  # multi-host: only a whole new pool is one slice
    resize = resize_request_name(req.namespace, req.name)
    pinned = req.details.get("NodePoolName") if queued else None
    first: AutoscaledPool | None = None
    for state in pools:
        pool = state.pool
        if pinned and pool.name != pinned:
            continue
        if not _matches_pool(shape, pool, queued=queued, zone=zone, cluster=cluster):
            continue
        first = first or pool
        if state.nodes + count > pool.max_nodes:
            continue
        if pool.queued and state.resize_requests - {resize}:
            continue
        return pool, first
    return None, first


def fresh_node_indexes(
    pool: str, count: int, taken: Iterable[str], avoid: Iterable[str] = (), cluster: str = "tpusim"
) -> list[int]:
    """``count`` node indexes (``nodepools.node_name``) whose names are neither taken by
    the pool's existing nodes nor in ``avoid`` (a template's hostname NotIn list), the
    lowest first."""
    used = set(taken) | set(avoid)
    out: list[int] = []
    index = 0
    while len(out) < count:
        if node_name(pool, index, cluster) not in used:
            out.append(index)
        index += 1
    return out


def node_group(pool: str, owner: str, pod_set: int = 0) -> str:
    """The ``GROUP_ANNOTATION`` value of the nodes added to ``pool`` for pod set
    ``pod_set`` of the request ``owner``."""
    return f"{pool}/{hashlib.sha256(f'{owner}/{pod_set}'.encode()).hexdigest()[:10]}"


# ---------------------------------------------------------------- what the cluster shows


@dataclass(frozen=True)
class PoolView:
    """A pool made for a request, as the cluster shows it now."""

    name: str
    nodes: int
    pods: int  # pods bound to its nodes, not finished
    empty_since: float | None = None  # when the provisioner first saw it without pods


@dataclass(frozen=True)
class NodeView:
    """A node as ``check-capacity`` judges it."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, str], ...]
    ready: bool
    schedulable: bool
    free_chips: int


def free_nodes(shape: Shape, nodes: Iterable[NodeView]) -> int:
    """How many existing nodes could take one more pod of ``shape`` each."""
    count = 0
    for node in nodes:
        if not node.ready or not node.schedulable or node.free_chips < shape.chips_per_host:
            continue
        if {node.name, node.labels.get(HOSTNAME_LABEL, node.name)} & shape.host_not_in:
            continue
        if any(node.labels.get(k) != v for k, v in shape.node_selector.items()):
            continue
        pool = node.labels.get(NODEPOOL_LABEL, "")
        if pool in shape.pool_not_in or (shape.pool_in is not None and pool not in shape.pool_in):
            continue
        if all(
            t.get("effect") not in ("NoSchedule", "NoExecute") or _tolerates(shape.tolerations, t)
            for t in node.taints
        ):
            count += 1
    return count


# ---------------------------------------------------------------- decisions


@dataclass(frozen=True)
class PoolPlan:
    """A pool to create: ``pool`` with, on every node, ``labels`` and ``taints`` added.

    ``group`` set: ``pool.nodes`` nodes added to the existing pool ``pool.name`` instead,
    annotated with ``GROUP_ANNOTATION`` = ``group``, named with indexes the pool's
    nodes do not use and whose names are not in ``avoid_hosts``.
    """

    pool: TPUPool
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()
    not_ready_node: int | None = None
    group: str | None = None
    avoid_hosts: frozenset[str] = frozenset()

    @property
    def unit(self) -> str:
        """What the request owns: the group of nodes it added, else the whole pool."""
        return self.group or self.pool.name


@dataclass(frozen=True)
class _Waiting:
    """A queued request whose declared pool matches but has no room: it stays queued."""

    pool: str


@dataclass
class Decision:
    """What to do for one request in this pass (empty: nothing)."""

    conditions: list[Condition] = field(default_factory=list)
    details: dict[str, str] | None = None
    create: list[PoolPlan] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    annotations: dict[str, str | None] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.conditions or self.details is not None or self.create or self.delete
        ) or bool(self.annotations)

    def set(self, kind: str, status: str, reason_message: tuple[str, str], now: float) -> None:
        reason, message = reason_message
        self.conditions = [c for c in self.conditions if c.type != kind]
        self.conditions.append(Condition(kind, status, reason, message, now))
        self.log.append(f"{kind}={status} {reason}: {message}")


def _changed(req: Request, kind: str, status: str, reason: str, message: str) -> bool:
    cond = req.conditions.get(kind)
    return cond is None or (cond.status, cond.reason, cond.message) != (status, reason, message)


def _set(
    d: Decision, req: Request, kind: str, status: str, rm: tuple[str, str], now: float
) -> None:
    if _changed(req, kind, status, *rm):
        d.set(kind, status, rm, now)


def _max_run_s(req: Request) -> float:
    """[gke-wrapper] maxRunDurationSeconds; a bad value counts as absent (GKE ignores the
    parse error and uses the default)."""
    raw = req.parameters.get(MAX_RUN_PARAMETER)
    try:
        return float(int(raw)) if raw is not None else DEFAULT_MAX_RUN_S
    except ValueError:
        return DEFAULT_MAX_RUN_S


def _plans(
    req: Request,
    shapes: Sequence[Shape],
    taken: Iterable[str],
    fault: Fault,
    zone: str,
    growable: Sequence[GrowablePool] = (),
    cluster: str = "tpusim",
) -> list[PoolPlan] | str | _Waiting:
    queued = req.class_name == QUEUED_CLASS
    taken = set(taken)
    room = {g.pool.name: g for g in growable}  # what earlier pod sets already took
    resize = resize_request_name(req.namespace, req.name)
    plans: list[PoolPlan] = []
    for index, (shape, (_, count)) in enumerate(zip(shapes, req.pod_sets, strict=True)):
        labels: dict[str, str] = {}
        taints: tuple[Mapping[str, str], ...] = ()
        if queued:
            labels[PROVISIONING_REQUEST_LABEL] = resize
            taints = (dict(QUEUED_TAINT),)
        not_ready = None
        if fault.kind == "not-ready-node" and index == 0:
            not_ready = count - 1 if fault.node is None else max(0, min(fault.node, count - 1))
        target, match = grow_target(
            req, shape, count, list(room.values()), zone=zone, cluster=cluster
        )
        if target is not None:  # [gke-tpus], [oss-best-effort]: grow the existing pool
            state = room[target.name]
            grown = state.resize_requests | ({resize} if queued else set())
            room[target.name] = replace(state, nodes=state.nodes + count, resize_requests=grown)
            group = node_group(target.name, req.owner, index)
            pool = target.node_pool(count, zone)
            plans.append(
                PoolPlan(
                    pool, labels, taints, not_ready, group=group, avoid_hosts=shape.host_not_in
                )
            )
            continue
        if match is not None and queued:
            return _Waiting(match.name)  # [gke-doc]: queued until capacity is found
        name = req.details.get("NodePoolName") if queued else None
        name = name or pool_name(req, index, shape, taken)
        taken.add(name)
        new_pool = pool_for(shape, name, count, queued=queued)
        if isinstance(new_pool, str):
            return new_pool
        plans.append(PoolPlan(replace(new_pool, zone=zone), labels, taints, not_ready))
    return plans


def _queued_details(
    req: Request, pool: str, zone: str, shape: Shape, cluster: str
) -> dict[str, str]:
    """[gke-wrapper] the details GKE's queued class writes (resize-request mode).
    ``NodeGroupName`` (the MIG) is made up in GKE's style; nothing reads it."""
    return {
        "NodePoolName": pool,
        "NodeGroupName": f"gke-{cluster}-{pool}-grp",
        "ResizeRequestName": resize_request_name(req.namespace, req.name),
        "AcceleratorType": shape.accelerator,
        "SelectedZone": zone,
        "NodePoolAutoProvisioned": "false",
        "PodTemplateName": req.pod_sets[0][0],
        "ProvisioningMode": "resize_request",
    }


def _good(shapes: Sequence[Shape | str]) -> list[Shape]:
    return [s for s in shapes if not isinstance(s, str)]


def decide(
    req: Request,
    *,
    now: float,
    timings: Timings,
    fault: Fault,
    shapes: Sequence[Shape | str],
    pools: Sequence[PoolView],
    taken_pools: Iterable[str] = (),
    consumed: int = 0,
    free: Sequence[int] = (),
    zone: str = "us-east5-b",
    cluster: str = "tpusim",
    growable: Sequence[GrowablePool] = (),
) -> Decision:
    """What GKE does next for ``req``.

    ``shapes``: per pod set, its template's shape or why nothing fits (templates
    exist: the caller skips the pass otherwise, [oss-client]). ``pools``: the pools
    (or groups of nodes added to a pool) made for it that still have nodes.
    ``consumed``: its consuming pods bound to nodes. ``free``: per pod set, nodes that
    could take one more pod (check-capacity). ``growable``: the declared autoscaled
    pools as they are now; a single-host pod set that fits one with room grows it.
    """
    d = Decision()
    if req.class_name not in CLASSES:
        return d
    if req.true(CAPACITY_REVOKED):  # terminal ([gke-state]); its VMs are gone
        d.delete = [p.name for p in pools]
        return d
    if req.true(FAILED):  # terminal; a pool left behind goes once empty
        d.delete = [p.name for p in pools if _empty_for(p, 0.0, now, timings)]
        return d
    queued = req.class_name == QUEUED_CLASS
    fault_rm = (fault.reason or DEFAULT_FAIL[0], (fault.message or DEFAULT_FAIL[1]) + SIMULATED)
    accepted, provisioned = req.true(ACCEPTED), req.true(PROVISIONED)

    if not accepted:
        if queued and ACCEPTED not in req.conditions:
            _set(d, req, ACCEPTED, "False", Q_NOT_ACCEPTED, now)  # [gke-state] initialise
        if queued and len(req.pod_sets) > 1:
            _set(d, req, FAILED, "True", Q_MULTIPLE_POD_SETS, now)  # [gke-guard]
            return d
        if fault.kind == "fail" and fault.at == "validate":
            _set(d, req, FAILED, "True", fault_rm, now)
            return d
        problem = next((s for s in shapes if isinstance(s, str)), None)
        plans: list[PoolPlan] | str | _Waiting = []
        if problem is None:
            plans = _plans(req, _good(shapes), taken_pools, fault, zone, growable, cluster)
            if isinstance(plans, str):
                problem = plans
        if problem is not None and queued:
            rm = (Q_NO_QUEUED_POOL[0], f"{Q_NO_QUEUED_POOL[1]} (tpusim: {problem})")
            if now - req.created >= timings.pending_retry_s:
                _set(d, req, FAILED, "True", rm, now)  # [gke-scaleup] retried, then failed
            else:
                _set(d, req, ACCEPTED, "False", rm, now)
            return d
        if now - req.created < timings.accept_delay_s:
            return d
        _set(d, req, ACCEPTED, "True", Q_ACCEPTED if queued else O_ACCEPTED, now)
        if queued and isinstance(plans, list) and plans:
            first = plans[0].pool
            d.details = _queued_details(req, first.name, first.zone, _good(shapes)[0], cluster)
        elif queued and isinstance(plans, _Waiting):
            d.details = _queued_details(req, plans.pool, zone, _good(shapes)[0], cluster)
        if problem is not None:  # [oss-conditions] not found: stays, retried every loop
            msg = f"{O_NOT_FOUND[1]} (tpusim: {problem})"
            _set(d, req, PROVISIONED, "False", (O_NOT_FOUND[0], msg), now)
        return d

    if not provisioned:
        if fault.kind == "never":
            if not queued:
                _set(d, req, PROVISIONED, "False", O_NOT_FOUND, now)
            return d
        if now - accepted.time < timings.provision_delay_s:
            return d
        if fault.kind == "fail":
            _set(d, req, FAILED, "True", fault_rm, now)
            return d
        good = _good(shapes)
        if len(good) != len(shapes):
            problem = next(s for s in shapes if isinstance(s, str))
            msg = f"{O_NOT_FOUND[1]} (tpusim: {problem})"
            if queued:  # the template changed under an accepted request
                _set(d, req, FAILED, "True", (Q_NO_QUEUED_POOL[0], msg), now)
            else:
                _set(d, req, PROVISIONED, "False", (O_NOT_FOUND[0], msg), now)
            return d
        if req.class_name == CHECK_CAPACITY_CLASS:
            # [types]: check, create nothing; Provisioned once the capacity is there.
            enough = all(f >= count for f, (_, count) in zip(free, req.pod_sets, strict=False))
            if enough and len(free) == len(req.pod_sets):
                _set(d, req, PROVISIONED, "True", O_FOUND, now)
            else:
                _set(d, req, PROVISIONED, "False", O_NOT_FOUND, now)
            return d
        plans = _plans(req, good, taken_pools, fault, zone, growable, cluster)
        if isinstance(plans, str):
            _set(d, req, FAILED, "True", (Q_NO_QUEUED_POOL[0] if queued else "Failed", plans), now)
            return d
        if isinstance(plans, _Waiting):  # stays queued; tried again every pass
            return d
        if fault.kind != "late-nodes":
            d.create = plans
            d.annotations[POOLS_ANNOTATION] = ",".join(p.unit for p in plans)
            d.log.append(f"pools {d.annotations[POOLS_ANNOTATION]} created")
        _set(d, req, PROVISIONED, "True", Q_PROVISIONED if queued else O_PROVISIONED, now)
        return d

    # Provisioned (and maybe BookingExpired).
    if fault.kind == "late-nodes" and not req.pools and now - provisioned.time >= fault.seconds:
        good = _good(shapes)
        late = (
            _plans(req, good, taken_pools, fault, zone, growable, cluster)
            if len(good) == len(shapes)
            else []
        )
        if isinstance(late, list) and late:
            plans = late
            d.create = plans
            d.annotations[POOLS_ANNOTATION] = ",".join(p.unit for p in plans)
            d.log.append(f"pools {d.annotations[POOLS_ANNOTATION]} created (late)")
    expired = req.true(BOOKING_EXPIRED)
    revoke = REVOKE_ANNOTATION in req.annotations or (
        fault.kind == "revoke-after" and now - provisioned.time >= fault.seconds
    )
    if queued and expired and now - provisioned.time >= _max_run_s(req):
        revoke = True  # [gke-finalizer]: only from BookingExpired
    if revoke:
        if not expired:  # [gke-state]: CapacityRevoked requires BookingExpired
            _set(
                d,
                req,
                BOOKING_EXPIRED,
                "True",
                Q_BOOKING_EXPIRED if queued else O_BOOKING_EXPIRED,
                now,
            )
        _set(d, req, CAPACITY_REVOKED, "True", Q_REVOKED, now)
        d.delete = [p.name for p in pools]
        if d.delete:
            d.log.append(f"pools {','.join(d.delete)} deleted (capacity revoked)")
        return d
    if req.class_name == CHECK_CAPACITY_CLASS:
        if not expired and now - provisioned.time >= timings.booking_s:
            _set(d, req, BOOKING_EXPIRED, "True", O_BOOKING_EXPIRED, now)
        return d
    if not expired:
        total = sum(count for _, count in req.pod_sets)
        if not queued and consumed >= total:
            _set(d, req, BOOKING_EXPIRED, "True", O_BOOKING_CONSUMED, now)  # [oss-processor]
        elif now - provisioned.time >= timings.booking_s:
            rm = Q_BOOKING_EXPIRED if queued else O_BOOKING_EXPIRED
            _set(d, req, BOOKING_EXPIRED, "True", rm, now)  # [gke-finalizer] / [oss-processor]
        return d
    # Booking over: empty pools go ([gke-state] bookingExpiredMessage: "candidates for
    # scale down when underutilized").
    for pool in pools:
        if _empty_for(pool, expired.time, now, timings):
            d.delete.append(pool.name)
            d.log.append(f"pool {pool.name} removed (empty after booking)")
    return d


def _empty_for(pool: PoolView, since: float, now: float, timings: Timings) -> bool:
    """The pool ran no pod since ``since`` for the scale-down delay."""
    if pool.pods or pool.empty_since is None:
        return False
    return now - max(pool.empty_since, since) >= timings.scale_down_delay_s


def orphan_pools_to_remove(
    pools: Mapping[str, tuple[str, PoolView]],
    live_owners: Iterable[str],
    *,
    now: float,
    timings: Timings,
) -> list[str]:
    """Pools whose request is gone and that ran nothing for ``scale_down_delay_s``
    (GKE scales empty nodes down; a busy node stays). ``pools``: name -> (owner, view)."""
    live = set(live_owners)
    return [
        name
        for name, (owner, view) in sorted(pools.items())
        if owner not in live and _empty_for(view, 0.0, now, timings)
    ]
