"""The parts every TPUSlice kind shares, parsed, validated and defaulted into frozen,
typed records: ``tpu``, ``ray``, ``head``, ``worker``, ``reservation`` (``SliceClusterSpec``).

The CRD's schema and CEL rules reject most bad input at ``kubectl apply``; these
modules apply the same rules (and the ones CEL cannot express) to plain dicts,
so ``tpuslice render`` on a laptop and the operator in the cluster judge a spec
the same way, and every later step works on typed, defaulted values. The three
kinds share their cluster parts, parsed by one function into one record, so a
TPUSliceJob's or TPUSliceService's RayCluster is rendered by exactly the code a
TPUSliceCluster's is; ``cluster.py``, ``job.py`` and ``service.py`` add what each
kind has of its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from tpuslice.model import constants
from tpuslice.model.records import CapacityType, GangMode, ProvisioningMode
from tpuslice.model.topology import (
    SliceShape,
    TopologyError,
    dynamic_slice_shape,
    slice_shape,
)
from tpuslice.spec import bounds
from tpuslice.spec.values import described
from tpuslice.spec.yamlcheck import yaml_map_problem

__all__ = [
    "CpuGroupSpec",
    "DisruptionSpec",
    "ElasticSpec",
    "FieldError",
    "GroupSpec",
    "KueueSpec",
    "OwnedClusterSpec",
    "ProvisioningSpec",
    "RetryPolicy",
    "SliceClusterSpec",
    "SpecError",
    "TpuGroupSpec",
    "WorkerGroupSpec",
    "as_object",
    "default_image",
    "kueue_pool_level",
    "object_labels",
]

ReservationPolicy = Literal["NodePool", "DynamicSlice", "None"]
RESERVATION_POLICIES: tuple[ReservationPolicy, ...] = ("NodePool", "DynamicSlice", "None")
SubmissionMode = Literal["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"]
SUBMISSION_MODES: tuple[SubmissionMode, ...] = (
    "K8sJobMode",
    "HTTPMode",
    "InteractiveMode",
    "SidecarMode",
)

_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_RAY_VERSION = re.compile(r"^([0-9]+)\.([0-9]+)\.([0-9]+)$")
_QUANTITY = re.compile(
    r"^[+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


@dataclass(frozen=True)
class FieldError:
    """One problem with one field: the path a user can find and what to do about it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """A TPUSliceCluster that cannot be turned into a RayCluster; lists every problem found."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class GroupSpec:
    """User settings for the head or the worker group (all optional)."""

    resources: Mapping[str, str] = field(default_factory=dict)
    ray_start_params: Mapping[str, str] = field(default_factory=dict)
    template: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TpuGroupSpec:
    """One TPU entry of spec.workerGroups: slices of one shape, each on a node pool of its own."""

    name: str
    shape: SliceShape
    slices: int
    worker: GroupSpec
    #: False for independent slices: no MEGASCALE env, each slice its own job.
    multislice: bool = True
    #: tpu.gang Joined (the default): in the object's gang across TPU groups when
    #: spec.reservation.gang is AllSlices; False (Independent): claims on its own.
    joined: bool = True
    #: The entry's elastic range (``slices`` is then 1); None for a fixed count.
    elastic: ElasticSpec | None = None


@dataclass(frozen=True)
class CpuGroupSpec:
    """One CPU entry of spec.workerGroups: plain KubeRay workers, never on TPU nodes.

    Either a fixed ``replicas`` or, with ``max_replicas``, a range the Ray autoscaler
    moves (``replicas`` is then the minimum). The two are exclusive, as an elastic TPU
    group's range is with its tpu.slices: one field owns the count, and a count inside a
    range would be the autoscaler's to change at once anyway."""

    name: str
    replicas: int
    worker: GroupSpec
    #: cpu.maxReplicas; None for a fixed count.
    max_replicas: int | None = None

    @property
    def autoscaled(self) -> bool:
        return self.max_replicas is not None

    def desired_replicas(self, live: int | None) -> int:
        """The workers wanted now: ``replicas``, or for a range the RayCluster's ``live``
        count (the autoscaler's) clamped to it, the minimum while none is written."""
        if self.max_replicas is None or live is None:
            return self.replicas
        return max(self.replicas, min(self.max_replicas, live))


WorkerGroupSpec = TpuGroupSpec | CpuGroupSpec


@dataclass(frozen=True)
class RetryPolicy:
    """spec.reservation.provisioning.retry: failed attempts retried ``limit`` times, after
    ``base_backoff_seconds`` doubling per failure up to ``max_backoff_seconds``. The
    defaults are Kueue's ProvisioningRequestConfig retryStrategy defaults."""

    limit: int = 3
    base_backoff_seconds: int = 60
    max_backoff_seconds: int = 1800


#: The class each mode asks for.
PROVISIONING_CLASSES: Mapping[ProvisioningMode, str] = {
    ProvisioningMode.BEST_EFFORT_ATOMIC: constants.PROVREQ_CLASS_BEST_EFFORT_ATOMIC,
    ProvisioningMode.QUEUED: constants.PROVREQ_CLASS_QUEUED,
}


@dataclass(frozen=True)
class ProvisioningSpec:
    """spec.reservation.provisioning, validated and defaulted."""

    mode: ProvisioningMode
    #: The request's provisioningClassName: the mode's class unless overridden ("" for None).
    class_name: str = ""
    parameters: Mapping[str, str] = field(default_factory=dict)
    #: Capacity node labels (constants.CAPACITY_SELECTOR_KEYS) of the pods and the template.
    node_selector: Mapping[str, str] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    @property
    def enabled(self) -> bool:
        """Whether slices without a free pool ask for capacity."""
        return self.mode != ProvisioningMode.NONE

    @property
    def queued(self) -> bool:
        """Queued semantics: the pool is the one the request names, nodes are tainted
        cloud.google.com/gke-queued. Decided by the mode, not by an overridden class."""
        return self.mode == ProvisioningMode.QUEUED


#: spec.disruption defaults and bounds (the CRD's). Scheduled maintenance on TPUs is
#: announced about seven days ahead (Cloud TPU "View maintenance notifications":
#: "SCHEDULED: Maintenance will get seven days notice"), so the default window is that
#: whole notice: a unit with any announced maintenance ranks after every unit without.
#: It is a preference, never a refusal, so a long window costs nothing when no other
#: unit exists. The grace period matches Ray's own drain deadline default
#: (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S = 30.0, ray 2.60 ray/_private/ray_constants.py),
#: Kubernetes' default terminationGracePeriodSeconds (30) and a Spot VM's notice (about
#: 30 s, GKE "Spot VMs").
DEFAULT_AVOID_MAINTENANCE_WITHIN_S = 604_800
MAX_AVOID_MAINTENANCE_WITHIN_S = 2_592_000
DEFAULT_GRACE_PERIOD_S = 30
MAX_GRACE_PERIOD_S = 3_600


@dataclass(frozen=True)
class DisruptionSpec:
    """spec.disruption: how slices meet GKE's host maintenance and terminations."""

    #: Units whose nodes have maintenance scheduled within this many seconds rank last.
    avoid_maintenance_within_s: int = DEFAULT_AVOID_MAINTENANCE_WITHIN_S
    #: The TPU workers' terminationGracePeriodSeconds and Ray's drain deadline base.
    grace_period_s: int = DEFAULT_GRACE_PERIOD_S


@dataclass(frozen=True)
class ElasticSpec:
    """spec.elastic: the Ray autoscaler moves the slice count between ``min_slices`` and
    ``max_slices``; the timeouts are None when the autoscaler's defaults apply."""

    min_slices: int
    max_slices: int
    idle_timeout_seconds: int | None = None
    scale_up_timeout_seconds: int | None = None

    def target(self, replicas: int | None) -> int:
        """The slices wanted now: the RayCluster's live ``replicas`` (the autoscaler's
        count) clamped to the range, as KubeRay and the autoscaler clamp it; ``None``
        (no RayCluster yet, or KubeRay's default not written) is the minimum."""
        if replicas is None:
            return self.min_slices
        return max(self.min_slices, min(self.max_slices, replicas))


@dataclass(frozen=True)
class KueueSpec:
    """spec.kueue: the LocalQueue Kueue admits the KubeRay object through and its
    WorkloadPriorityClass; rendered as Kueue's labels on the RayCluster or RayJob."""

    queue_name: str
    priority_class: str = ""
    #: spec.kueue.admissionGate: "UntilPoolsFree" (hold Kueue's admission through its
    #: admission-gated-by annotation until free pools could hold every slice) or ""
    admission_gate: str = ""


@dataclass(frozen=True)
class SliceClusterSpec:
    """A validated TPUSliceCluster with every default applied."""

    name: str
    namespace: str  # "" for a local file without one (kubectl picks the namespace)
    uid: str
    shape: SliceShape
    #: spec.tpu.slices; for an elastic object its most slices (spec.elastic.maxSlices),
    #: so every bound and policy limit judges the largest count the autoscaler may reach.
    slices: int
    ray_version: str
    image: str
    head: GroupSpec
    worker: GroupSpec
    reservation_policy: ReservationPolicy
    suspend: bool
    #: spec.reservation.partitionHealth HealthyAndDegraded: a dynamic slice also takes
    #: DEGRADED partitions and keeps an ACTIVE_DEGRADED Slice.
    allow_degraded: bool = False
    #: The kind whose object this cluster belongs to: its own RayCluster for a
    #: TPUSliceCluster, the RayCluster(s) KubeRay makes for a TPUSliceJob or
    #: TPUSliceService. Decides owner references and the pods' owner-kind label.
    owner_kind: str = constants.KIND_CLUSTER
    #: AllSlices: the slices hold all their pools or none; PerSlice: each on its own.
    gang: GangMode = GangMode.PER_SLICE
    #: Queue order within a shape: higher first, then older first.
    priority: int = 0
    #: Preferred capacity types of node pools, first most wanted (a preference, not a filter).
    capacity_types: tuple[CapacityType, ...] = ()
    #: spec.reservation.provisioning; None when absent (slices only wait for pools).
    provisioning: ProvisioningSpec | None = None
    #: spec.elastic; None for a fixed count (spec.tpu.slices).
    elastic: ElasticSpec | None = None
    #: spec.kueue, or the object's ``kueue.x-k8s.io/queue-name`` label copied; None when
    #: the object names no LocalQueue.
    kueue: KueueSpec | None = None

    @property
    def min_slices(self) -> int:
        """Slices held as a gang whatever the autoscaler does: all of a fixed object's."""
        return self.slices if self.elastic is None else self.elastic.min_slices

    def desired_slices(self, replicas: int | None) -> int:
        """Slices wanted now: spec.tpu.slices, or for an elastic object the live
        ``replicas`` of its RayCluster clamped to the range (``ElasticSpec.target``)."""
        return self.slices if self.elastic is None else self.elastic.target(replicas)

    #: spec.disruption, defaulted.
    disruption: DisruptionSpec = field(default_factory=DisruptionSpec)
    #: The KubeRay worker group this spec's TPU slices render as (ray.io/group).
    group_name: str = constants.WORKER_GROUP
    #: Whether the slices are one multislice (MEGASCALE env when more than one).
    multislice: bool = True
    #: A TPU group's tpu.gang: whether it joins the object's gang across TPU groups.
    joined: bool = True
    #: spec.workerGroups in order; () for the one-group form (spec.tpu + spec.worker).
    #: With groups, ``shape``/``worker`` are the first TPU group's and ``slices`` is the
    #: sum over TPU groups (what the per-object limits judge).
    worker_groups: tuple[WorkerGroupSpec, ...] = ()

    @property
    def grouped(self) -> bool:
        """Whether the spec uses spec.workerGroups (the many-group form)."""
        return bool(self.worker_groups)

    def tpu_groups(self) -> tuple[SliceClusterSpec, ...]:
        """One spec per TPU group, each as a one-group spec of its own shape, name and
        worker settings, so every one-group step (render, identity, an elastic set's
        planning) serves a group as is; an elastic group's ``slices`` is its maximum."""
        if not self.worker_groups:
            return (self,)
        return tuple(
            replace(
                self,
                shape=g.shape,
                slices=g.slices if g.elastic is None else g.elastic.max_slices,
                worker=g.worker,
                group_name=g.name,
                multislice=g.multislice,
                joined=g.joined,
                elastic=g.elastic,
                worker_groups=(),
            )
            for g in self.worker_groups
            if isinstance(g, TpuGroupSpec)
        )

    def gang_groups(self) -> tuple[SliceClusterSpec, ...]:
        """The TPU groups held as one gang across groups: with spec.reservation.gang
        AllSlices, every Joined TPU group (``tpu.gang``), when there are two or more;
        () otherwise (each group is its own gang, or the object has one group)."""
        if not self.grouped or self.gang != GangMode.ALL_SLICES:
            return ()
        joined = tuple(g for g in self.tpu_groups() if g.joined)
        return joined if len(joined) > 1 else ()

    @property
    def cpu_groups(self) -> tuple[CpuGroupSpec, ...]:
        return tuple(g for g in self.worker_groups if isinstance(g, CpuGroupSpec))

    @property
    def scale_up_timeout_seconds(self) -> int | None:
        """The autoscaler's allocate timeout (one per cluster): spec.elastic's or the one
        every elastic group that sets it agrees on (the parser refuses two); None for
        Ray's default."""
        if self.elastic is not None:
            return self.elastic.scale_up_timeout_seconds
        given = [
            g.elastic.scale_up_timeout_seconds
            for g in self.worker_groups
            if isinstance(g, TpuGroupSpec) and g.elastic is not None
        ]
        return next((t for t in given if t is not None), None)

    @property
    def autoscaled(self) -> bool:
        """Whether the Ray autoscaler runs in the cluster: spec.elastic, an elastic TPU
        group or a CPU group's range (each moves a group's count)."""
        if self.elastic is not None:
            return True
        return any(
            g.elastic is not None if isinstance(g, TpuGroupSpec) else g.autoscaled
            for g in self.worker_groups
        )

    @property
    def provisions(self) -> bool:
        """Whether slices without a free pool ask the cluster autoscaler for one."""
        return self.provisioning is not None and self.provisioning.enabled

    @property
    def gated(self) -> bool:
        """Whether worker pods wait for a reserved node pool before scheduling."""
        return self.reservation_policy != "None"

    @property
    def dynamic(self) -> bool:
        """Whether each slice is formed as a GKE Slice over tpu7x partitions it holds
        (``planning.partitions``) instead of held as one node pool."""
        return self.reservation_policy == "DynamicSlice"

    @property
    def kueue_picks_pools(self) -> bool:
        """Whether Kueue's topology-aware scheduling chooses each slice's node pool (the
        worker template asks for the node-pool level, accepted only with spec.kueue):
        the planner then adopts the pool Kueue's nodeSelector names on the slice's pods
        (``planning.kueue_tas``) instead of choosing one."""
        return self.kueue is not None and bool(kueue_pool_level(self.worker.template))


@dataclass(frozen=True)
class OwnedClusterSpec:
    """The cluster parts of a kind that owns a KubeRay object other than a RayCluster (a
    RayJob, a RayService): the object is named, placed and owned as the TPUSlice object."""

    cluster: SliceClusterSpec

    @property
    def name(self) -> str:
        return self.cluster.name

    @property
    def namespace(self) -> str:
        return self.cluster.namespace

    @property
    def uid(self) -> str:
        return self.cluster.uid


def default_image(ray_version: str) -> str:
    """Ray's published TPU image for a version; the user can override ``spec.ray.image``."""
    return f"rayproject/ray:{ray_version}-py311-tpu"


def _ray_version_error(version: str) -> str | None:
    match = _RAY_VERSION.match(version)
    if not match:
        return f"{version!r} is not a Ray release version; write MAJOR.MINOR.PATCH, e.g. 2.54.0"
    found = tuple(int(g) for g in match.groups())
    if found < constants.MIN_RAY_VERSION:
        floor = ".".join(str(p) for p in constants.MIN_RAY_VERSION)
        return (
            f"Ray {version} is older than {floor}, the first release whose "
            f"ray.util.tpu.slice_placement_group names v4/v5p/TPU7x slices correctly; "
            f"set {floor} or newer"
        )
    return None


def as_object(
    value: Any, path: str, errors: list[FieldError], known: frozenset[str] | None = None
) -> Mapping[str, Any]:
    """``value`` as a map ({} when absent or wrong); with ``known``, unknown keys are
    errors too (the CRD refuses them; a typo must not vanish on the way)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        errors.append(FieldError(path, f"must be an object, got {described(value)}"))
        return {}
    if known is not None:
        for key in value:
            if key not in known:
                errors.append(
                    FieldError(
                        f"{path}.{key}", f"is not a field; use one of {', '.join(sorted(known))}"
                    )
                )
    return value


def _string(value: Any, path: str, errors: list[FieldError], max_length: int = 0) -> str:
    """A string field ('' when absent)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        errors.append(FieldError(path, f"must be a string, got {described(value)}"))
        return ""
    if max_length and len(value) > max_length:
        errors.append(FieldError(path, _too_long(len(value), max_length)))
    return value


def _too_long(length: int, max_length: int) -> str:
    return (
        f"has {length} characters; at most {max_length} (see README.md, Limits); shorten it "
        f"or move the content into the image or a file it reads"
    )


def _string_map(
    value: Any,
    path: str,
    errors: list[FieldError],
    max_entries: int = bounds.MAX_START_PARAMS,
    max_value: int = bounds.MAX_MAP_VALUE,
) -> dict[str, str]:
    """A map of at most ``max_entries`` strings of at most ``max_value`` characters;
    integers are accepted and written as strings."""
    out: dict[str, str] = {}
    raw = as_object(value, path, errors)
    if len(raw) > max_entries:
        errors.append(FieldError(path, f"has {len(raw)} entries; at most {max_entries}"))
        return out  # the entries are not looked at: there may be very many
    for key, item in raw.items():
        if isinstance(item, str):
            if len(item) > max_value:
                errors.append(FieldError(f"{path}.{key}", _too_long(len(item), max_value)))
            out[str(key)] = item
        elif isinstance(item, int) and not isinstance(item, bool):
            out[str(key)] = str(item)
        else:
            errors.append(FieldError(f"{path}.{key}", f"must be a string, got {described(item)}"))
    return out


def _template_size(value: Any, path: str, errors: list[FieldError]) -> None:
    """A free-form object no larger than its ``bounds.TEMPLATE_BYTES`` as JSON: the CRD
    schema cannot bound an object whose fields it does not know, so this is its bound."""
    limit = bounds.TEMPLATE_BYTES[re.sub(r"\[[0-9]+\]", "[]", path)]  # one cap per list
    size = bounds.json_size(value)
    if size > limit:
        errors.append(
            FieldError(
                path,
                f"is {size} bytes as JSON; at most {limit} (see README.md, Limits); keep "
                f"large content (scripts, configuration) in the image, a ConfigMap or a volume",
            )
        )


def _resources(value: Any, path: str, errors: list[FieldError], tpu_owned: bool) -> dict[str, str]:
    resources = _string_map(value, path, errors, bounds.MAX_RESOURCES, bounds.MAX_QUANTITY)
    for key, quantity in resources.items():
        if len(quantity) > bounds.MAX_QUANTITY:
            continue  # reported by _string_map
        if not _QUANTITY.match(quantity):
            errors.append(
                FieldError(f"{path}.{key}", f"{quantity!r} is not a quantity (e.g. 8, 500m, 32Gi)")
            )
    if tpu_owned and constants.TPU_RESOURCE in resources:
        errors.append(
            FieldError(
                f"{path}.{constants.TPU_RESOURCE}",
                "is set by the operator from spec.tpu (chips per host); remove it",
            )
        )
    return resources


def _refuse_sub_slicing(template: Mapping[str, Any], path: str, errors: list[FieldError]) -> None:
    """GKE's sub-slicing annotation asks its webhooks for a slice smaller than the node
    pool's topology (Ray's TPU sub-slicing guide, ray-project/ray PR #65404); every slice
    of ours takes a whole pool of spec.tpu.topology, so it is refused here as well as by
    the CRD (an object stored before the CRD's rule never passed it)."""
    metadata = template.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    if isinstance(annotations, Mapping) and constants.ANNOTATION_GKE_SLICE_TOPOLOGY in annotations:
        errors.append(
            FieldError(
                f"{path}.metadata.annotations[{constants.ANNOTATION_GKE_SLICE_TOPOLOGY}]",
                "asks for sub-slicing, which is not supported yet (each slice takes a whole "
                "node pool of spec.tpu.topology); remove it and set spec.tpu.topology to the "
                "slice's own shape",
            )
        )


#: The TAS annotations of the node-pool level forms (judged by ``_kueue_pool_level``).
_KUEUE_POOL_LEVEL_KEYS = frozenset(
    {
        constants.KUEUE_REQUIRED_TOPOLOGY,
        constants.KUEUE_SLICE_REQUIRED_TOPOLOGY,
        constants.KUEUE_SLICE_SIZE,
    }
)


def _template_annotations(template: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = template.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def kueue_pool_level(template: Mapping[str, Any]) -> dict[str, str]:
    """The TAS annotations of the node-pool level forms on a worker template (empty
    when it has none); whether they are a valid request is ``_kueue_pool_level``'s."""
    return {
        str(k): str(v)
        for k, v in _template_annotations(template).items()
        if k in _KUEUE_POOL_LEVEL_KEYS
    }


def _refuse_kueue_topology(
    template: Mapping[str, Any], path: str, errors: list[FieldError], *, tpu_group: bool
) -> None:
    """Kueue's topology-aware scheduling annotations (``kueue.x-k8s.io/podset-*``: required,
    preferred, unconstrained, slice topology, multi-level constraints, pod set groups;
    kubernetes-sigs/kueue v0.17.0 apis/kueue/v1beta2/topology_types.go) make Kueue choose
    the nodes of a pod set, gate its pods with ``kueue.x-k8s.io/topology`` and add the
    chosen domain's labels to their nodeSelector when it lifts the gate
    (pkg/controller/tas/topology_ungater.go); the operator chooses a node pool per slice
    and pins the pods to it. A gated pod's nodeSelector can only be added to, never
    changed, so the two choices can only meet where Kueue's domain is a node pool: on a
    TPU group the node-pool level forms are judged by ``_kueue_pool_level`` (the
    operator then adopts Kueue's pool); every other level and annotation is refused,
    and on a CPU group every one (its pods are not the operator's to place, and Kueue
    would place them on the TPU flavor's nodes)."""
    keep = _KUEUE_POOL_LEVEL_KEYS if tpu_group else frozenset()
    annotations = _template_annotations(template)
    for key in sorted(k for k in annotations if str(k).startswith(constants.KUEUE_TAS_PREFIX)):
        if key in keep:
            continue
        errors.append(
            FieldError(
                f"{path}.metadata.annotations[{key}]",
                "asks Kueue's topology-aware scheduling to place the workers, which the "
                "operator places on a reserved node pool per slice; remove it (Kueue still "
                "admits the object by quota), or on a TPU group let Kueue choose each "
                f"slice's node pool: {constants.KUEUE_SLICE_REQUIRED_TOPOLOGY}: "
                f"{constants.NODE_LABEL_NODEPOOL} with {constants.KUEUE_SLICE_SIZE} the "
                "slice's hosts",
            )
        )


def _kueue_pool_level(
    template: Mapping[str, Any],
    path: str,
    errors: list[FieldError],
    *,
    hosts: int,
    one_slice: bool,
    kueue: bool,
    policy: str,
    provisioning: bool,
) -> None:
    """A TPU group's node-pool level TAS request: Kueue then chooses each slice's node
    pool and the operator holds and pins that pool (README "Kueue"). Accepted as
    ``podset-slice-required-topology: cloud.google.com/gke-nodepool`` with
    ``podset-slice-size`` the slice's hosts (Kueue puts every ``hosts`` pods of the pod
    set in one pool: one slice per pool), or ``podset-required-topology:
    cloud.google.com/gke-nodepool`` when the group has exactly one slice (every pod in
    one pool); only with spec.kueue, reservation.policy NodePool, multi-host slices
    (a single-host slice holds a node, not a pool) and no capacity on demand (Kueue
    admits onto pools that exist)."""
    found = kueue_pool_level(template)
    if not found:
        return
    at = f"{path}.metadata.annotations"
    pool = constants.NODE_LABEL_NODEPOOL
    required = found.get(constants.KUEUE_REQUIRED_TOPOLOGY)
    per_slice = found.get(constants.KUEUE_SLICE_REQUIRED_TOPOLOGY)
    size = found.get(constants.KUEUE_SLICE_SIZE)
    first = f"{at}[{sorted(found)[0]}]"
    why = ""
    if not kueue:
        why = "needs spec.kueue (Kueue chooses the pool only for an object it admits); "
        why += "set spec.kueue.queueName or remove it"
    elif policy != "NodePool":
        why = "needs spec.reservation.policy NodePool (Kueue's choice is a node pool the "
        why += "operator then holds); remove it or set the policy NodePool"
    elif provisioning:
        why = "cannot be used with spec.reservation.provisioning (Kueue admits onto node "
        why += "pools that exist); remove one of them"
    elif hosts == 1:
        why = "needs multi-host slices (a single-host slice holds one node, not a node "
        why += "pool); remove it"
    if why:
        errors.append(FieldError(first, why))
        return
    if required is not None and per_slice is not None:
        errors.append(
            FieldError(
                f"{at}[{constants.KUEUE_REQUIRED_TOPOLOGY}]",
                f"cannot be combined with {constants.KUEUE_SLICE_REQUIRED_TOPOLOGY}; keep the "
                "slice form only",
            )
        )
        return
    if required is not None:
        if required != pool:
            errors.append(
                FieldError(
                    f"{at}[{constants.KUEUE_REQUIRED_TOPOLOGY}]",
                    f"{described(required)} is not the node-pool level; only {pool} is "
                    "accepted (Kueue's domain is then the pool the operator holds)",
                )
            )
        elif not one_slice:
            errors.append(
                FieldError(
                    f"{at}[{constants.KUEUE_REQUIRED_TOPOLOGY}]",
                    "would put every slice's pods in one node pool, which holds one slice; "
                    f"use {constants.KUEUE_SLICE_REQUIRED_TOPOLOGY}: {pool} with "
                    f'{constants.KUEUE_SLICE_SIZE}: "{hosts}" (one pool per slice)',
                )
            )
        if size is not None:
            errors.append(
                FieldError(
                    f"{at}[{constants.KUEUE_SLICE_SIZE}]",
                    f"goes with {constants.KUEUE_SLICE_REQUIRED_TOPOLOGY}; remove it",
                )
            )
        return
    if per_slice is None:
        errors.append(
            FieldError(
                f"{at}[{constants.KUEUE_SLICE_SIZE}]",
                f"needs {constants.KUEUE_SLICE_REQUIRED_TOPOLOGY}: {pool} beside it",
            )
        )
        return
    if per_slice != pool:
        errors.append(
            FieldError(
                f"{at}[{constants.KUEUE_SLICE_REQUIRED_TOPOLOGY}]",
                f"{described(per_slice)} is not the node-pool level; only {pool} is accepted "
                "(Kueue's domain is then the pool the operator holds)",
            )
        )
    if size != str(hosts):
        errors.append(
            FieldError(
                f"{at}[{constants.KUEUE_SLICE_SIZE}]",
                f"must be the slice's hosts, \"{hosts}\" (each slice's pods in one node "
                f"pool), got {described(size)}",
            )
        )


def _group(
    raw: Any,
    path: str,
    errors: list[FieldError],
    *,
    tpu_owned: bool,
    known: frozenset[str] = frozenset(),
    tpu_group: bool = True,
) -> GroupSpec:
    """Resources, rayStartParams and template of the head, spec.worker or a workerGroups
    entry (whose other ``known`` fields are read by the caller)."""
    raw = as_object(raw, path, errors, _GROUP_FIELDS | known if known else _GROUP_FIELDS)
    template = raw.get("template")
    if template is None:
        template = {}
    elif not isinstance(template, Mapping):
        errors.append(FieldError(f"{path}.template", "must be a pod template object"))
        template = {}
    else:
        _template_size(template, f"{path}.template", errors)
    if tpu_owned:
        _refuse_sub_slicing(template, f"{path}.template", errors)
        _refuse_kueue_topology(template, f"{path}.template", errors, tpu_group=tpu_group)
    ray_start_params = _string_map(raw.get("rayStartParams"), f"{path}.rayStartParams", errors)
    if "labels" in ray_start_params:
        errors.append(
            FieldError(
                f"{path}.rayStartParams.labels",
                "is refused by KubeRay >= 1.5 (Ray node labels belong in the group's labels "
                "field); the operator sets the TPU workers' ray.io/accelerator-type, "
                "ray.io/tpu-pod-type and ray.io/tpu-topology there; remove it",
            )
        )
    return GroupSpec(
        resources=_resources(raw.get("resources"), f"{path}.resources", errors, tpu_owned),
        ray_start_params=ray_start_params,
        template=template,
    )


_CLUSTER_PARTS = frozenset(
    {
        "tpu",
        "elastic",
        "ray",
        "head",
        "worker",
        "workerGroups",
        "reservation",
        "disruption",
        "kueue",
    }
)
_KUEUE_FIELDS = frozenset({"queueName", "priorityClassName", "admissionGate"})
#: Kueue's names (a LocalQueue, a WorkloadPriorityClass) are label values of its labels.
MAX_KUEUE_NAME = 63
_WORKER_GROUP_FIELDS = frozenset(
    {"name", "tpu", "cpu", "elastic", "resources", "rayStartParams", "template"}
)
_GROUP_TPU_FIELDS = frozenset({"type", "topology", "slices", "chipsPerHost", "multislice", "gang"})
#: A TPU group's tpu.gang values: Joined (the default) or Independent.
GROUP_GANGS = ("Joined", "Independent")
_CPU_FIELDS = frozenset({"replicas", "minReplicas", "maxReplicas"})
#: Kueue makes one PodSet per worker group plus the head's, at most 18 (MaxPodSets), so 17
#: worker groups at most [read: kubernetes-sigs/kueue@ff69552e
#: pkg/controller/jobframework/constants.go]; 16 leaves one to spare.
MAX_WORKER_GROUPS = 16
#: A group's hostname is ``<group>-<replica>-<host>``, one DNS label (63): 5 characters are
#: kept for the replica (KubeRay's replica names add 5 random ones) and 4 for the host index.
MAX_GROUP_NAME = 63 - 1 - 5 - 1 - 4
_MAX_CPU_REPLICAS = constants.MAX_SLICES
_ELASTIC_FIELDS = frozenset(
    {"minSlices", "maxSlices", "idleTimeoutSeconds", "scaleUpTimeoutSeconds"}
)
#: Bounds of spec.elastic's timeouts (the CRD's): a week at most; the autoscaler's
#: allocate timeout below a minute would give up on slices before their pods can start.
MAX_ELASTIC_TIMEOUT = 604_800
MIN_SCALE_UP_TIMEOUT = 60
_DISRUPTION_FIELDS = frozenset({"avoidMaintenanceWithin", "gracePeriodSeconds"})
_SPEC_FIELDS = _CLUSTER_PARTS | {"suspend"}
_JOB_SPEC_FIELDS = _CLUSTER_PARTS | {"job"}
_SERVICE_SPEC_FIELDS = _CLUSTER_PARTS | {"serve"}
_TPU_FIELDS = frozenset({"type", "topology", "slices", "chipsPerHost"})
_RAY_FIELDS = frozenset({"version", "image"})
_GROUP_FIELDS = frozenset({"resources", "rayStartParams", "template"})
_RESERVATION_FIELDS = frozenset(
    {"policy", "gang", "priority", "capacityTypes", "provisioning", "partitionHealth"}
)
#: spec.reservation.partitionHealth, as GKE's own slice controller's
#: --default-slice-health-node-affinity (HEALTHY, or HEALTHY_AND_DEGRADED).
PARTITION_HEALTH = ("Healthy", "HealthyAndDegraded")
_PROVISIONING_FIELDS = frozenset(
    {"mode", "provisioningClassName", "parameters", "nodeSelector", "retry"}
)
_RETRY_FIELDS = frozenset({"limit", "baseBackoffSeconds", "maxBackoffSeconds"})
_CLASS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
#: Bounds of spec.reservation.provisioning.retry (the CRD's).
MAX_RETRY_LIMIT = 100
MAX_BASE_BACKOFF = 86_400
MAX_MAX_BACKOFF = 604_800
#: spec.reservation.priority bounds (those of a PriorityClass value).
MAX_PRIORITY = 1_000_000_000


def _metadata(
    obj: Any, kind: str, max_name: int, what: str, services_of: str, errors: list[FieldError]
) -> tuple[str, str, str, Any]:
    """(name, namespace, uid, raw spec) of an object of ``kind``. For the messages:
    ``what`` the name must keep within DNS limits, ``services_of`` whose Kubernetes
    Services it names."""
    if not isinstance(obj, Mapping):
        problem = f"a {kind} is an object, not {described(obj)}"
        raise SpecError([FieldError("metadata", problem)])
    metadata = as_object(obj.get("metadata"), "metadata", errors)
    name = _string(metadata.get("name"), "metadata.name", errors)
    namespace = _string(metadata.get("namespace"), "metadata.namespace", errors)
    uid = _string(metadata.get("uid"), "metadata.uid", errors)
    if metadata.get("name") in (None, ""):
        errors.append(FieldError("metadata.name", "is required"))
    elif not name:
        pass  # not a string: reported
    elif len(name) > max_name:
        errors.append(
            FieldError(
                "metadata.name",
                f"{name!r} has {len(name)} characters; at most {max_name} keep {what} "
                f"within DNS limits",
            )
        )
    elif not _DNS1035_LABEL.match(name):
        errors.append(
            FieldError(
                "metadata.name",
                f"{name!r} must be a DNS-1035 label (lowercase letters, digits and '-', starting "
                f"with a letter) because it names {services_of}'s services",
            )
        )
    return name, namespace, uid, obj.get("spec")


def _shape(
    tpu: Mapping[str, Any], path: str, errors: list[FieldError], *, dynamic: bool = False
) -> SliceShape | None:
    """The slice shape of a ``tpu`` object (spec.tpu or a group's); None when wrong.
    ``dynamic``: formed as a GKE Slice (policy DynamicSlice), whose topologies are not
    those of node pools (``topology.dynamic_slice_shape``)."""
    shape: SliceShape | None = None
    tpu_type = _string(tpu.get("type"), f"{path}.type", errors)
    topology = _string(tpu.get("topology"), f"{path}.topology", errors)
    if tpu.get("type") in (None, ""):
        errors.append(FieldError(f"{path}.type", "is required, e.g. v6e"))
    if tpu.get("topology") in (None, ""):
        errors.append(FieldError(f"{path}.topology", "is required, e.g. 4x4"))
    if tpu_type and topology:
        chips_per_host = tpu.get("chipsPerHost")
        if chips_per_host is not None and (
            not isinstance(chips_per_host, int) or isinstance(chips_per_host, bool)
        ):
            errors.append(
                FieldError(
                    f"{path}.chipsPerHost",
                    f"must be an integer, got {described(chips_per_host)}",
                )
            )
        else:
            try:
                resolve = dynamic_slice_shape if dynamic else slice_shape
                shape = resolve(tpu_type, topology, chips_per_host)
            except TopologyError as exc:
                errors.append(FieldError(f"{path}.{exc.field}", exc.message))
    return shape


def _slices(tpu: Mapping[str, Any], path: str, errors: list[FieldError]) -> int:
    slices = tpu.get("slices", 1)
    if (
        not isinstance(slices, int)
        or isinstance(slices, bool)
        or not 1 <= slices <= constants.MAX_SLICES
    ):
        errors.append(
            FieldError(
                f"{path}.slices",
                f"must be an integer from 1 to {constants.MAX_SLICES}, got {described(slices)}",
            )
        )
        slices = 1
    return slices


def _worker_groups(
    spec: Mapping[str, Any], errors: list[FieldError], *, dynamic: bool = False
) -> tuple[WorkerGroupSpec, ...]:
    """spec.workerGroups: several TPU and CPU groups, each named, of its own shape.

    The one-group form (spec.tpu, spec.worker, spec.elastic) cannot be mixed in: a spec
    says its groups one way only."""
    mixed = [f"spec.{key}" for key in ("tpu", "worker", "elastic") if key in spec]
    if mixed:
        errors.append(
            FieldError(
                "spec.workerGroups",
                f"cannot be mixed with {', '.join(mixed)}: spec.tpu and spec.worker describe one "
                "TPU group named tpu, spec.workerGroups every group; move their settings into "
                "a workerGroups entry and remove them (an elastic group's range goes in its "
                "entry's elastic)",
            )
        )
    raw = spec.get("workerGroups")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_WORKER_GROUPS:
        errors.append(
            FieldError(
                "spec.workerGroups",
                f"must be a list of 1 to {MAX_WORKER_GROUPS} groups (Kueue admits at most 17 "
                f"worker PodSets), got {described(raw)}",
            )
        )
        return ()
    groups: list[WorkerGroupSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        path = f"spec.workerGroups[{i}]"
        entry = as_object(item, path, errors, _WORKER_GROUP_FIELDS)
        name = _string(entry.get("name"), f"{path}.name", errors)
        if not name:
            errors.append(FieldError(f"{path}.name", "is required, e.g. trainer"))
        elif len(name) > MAX_GROUP_NAME or not _DNS1035_LABEL.match(name):
            errors.append(
                FieldError(
                    f"{path}.name",
                    f"{name!r} must be a DNS-1035 label of at most {MAX_GROUP_NAME} characters "
                    "so each hostname <group>-<replica>-<host> fits 63; choose a shorter name",
                )
            )
        elif name == "head":
            errors.append(
                FieldError(f"{path}.name", "must not be head (KubeRay and Kueue reserve it)")
            )
        elif name in seen:
            errors.append(FieldError(f"{path}.name", f"{name!r} names two groups; rename one"))
        seen.add(name)
        if ("tpu" in entry) == ("cpu" in entry):
            errors.append(
                FieldError(
                    path,
                    "takes exactly one of tpu (a TPU slice group) or cpu (a CPU group); set "
                    "one and remove the other",
                )
            )
            continue
        if "elastic" in entry and "tpu" not in entry:
            errors.append(
                FieldError(
                    f"{path}.elastic",
                    "is a TPU group's slice range; a CPU group's range is cpu.minReplicas "
                    "and cpu.maxReplicas",
                )
            )
        if "tpu" in entry:
            tpu = as_object(entry.get("tpu"), f"{path}.tpu", errors, _GROUP_TPU_FIELDS)
            shape = _shape(tpu, f"{path}.tpu", errors, dynamic=dynamic)
            slices = _slices(tpu, f"{path}.tpu", errors)
            elastic = _elastic(entry.get("elastic"), slices, errors, f"{path}.elastic")
            multislice = _boolean(tpu.get("multislice"), f"{path}.tpu.multislice", errors, True)
            group_gang = tpu.get("gang", GROUP_GANGS[0])
            if group_gang not in GROUP_GANGS:
                errors.append(
                    FieldError(
                        f"{path}.tpu.gang",
                        f"{described(group_gang)} is not {' or '.join(GROUP_GANGS)}",
                    )
                )
            worker = _group(entry, path, errors, tpu_owned=True, known=_WORKER_GROUP_FIELDS)
            if shape is not None:
                joined = group_gang != "Independent"
                groups.append(
                    TpuGroupSpec(name, shape, slices, worker, multislice, joined, elastic)
                )
        else:
            replicas, high = _cpu_count(entry.get("cpu"), f"{path}.cpu", errors)
            # tpu_owned: a CPU group requests no chips and never asks for sub-slicing either
            worker = _group(
                entry, path, errors, tpu_owned=True, known=_WORKER_GROUP_FIELDS, tpu_group=False
            )
            groups.append(CpuGroupSpec(name, replicas, worker, high))
    timeouts = {
        i: item["elastic"]["scaleUpTimeoutSeconds"]
        for i, item in enumerate(raw)
        if isinstance(item, Mapping)
        and isinstance(item.get("elastic"), Mapping)
        and item["elastic"].get("scaleUpTimeoutSeconds") is not None
    }
    if len({str(t) for t in timeouts.values()}) > 1:
        errors.append(
            FieldError(
                f"spec.workerGroups[{max(timeouts)}].elastic.scaleUpTimeoutSeconds",
                f"differs from another group's ({', '.join(map(str, timeouts.values()))}): the "
                "Ray autoscaler has one allocate timeout per cluster; give every elastic "
                "group the same or set it on one",
            )
        )
    if not any("tpu" in g for g in raw if isinstance(g, Mapping)):
        errors.append(
            FieldError(
                "spec.workerGroups",
                "needs at least one tpu group (a cluster of CPU groups only needs no "
                "tpuslice-operator; use a plain RayCluster)",
            )
        )
    return tuple(groups)


def _cpu_count(raw: Any, path: str, errors: list[FieldError]) -> tuple[int, int | None]:
    """A CPU group's count: ``replicas`` (fixed; the maximum None) or the range
    ``minReplicas`` (default 0) to ``maxReplicas``, exclusive with each other."""
    cpu = as_object(raw, path, errors, _CPU_FIELDS)
    if "maxReplicas" not in cpu:
        if "minReplicas" in cpu:
            errors.append(FieldError(f"{path}.minReplicas", "needs cpu.maxReplicas, e.g. 8"))
        replicas = cpu.get("replicas")
        if (
            not isinstance(replicas, int)
            or isinstance(replicas, bool)
            or not 0 <= replicas <= _MAX_CPU_REPLICAS
        ):
            errors.append(
                FieldError(
                    f"{path}.replicas",
                    f"must be an integer from 0 to {_MAX_CPU_REPLICAS} (or give a range in "
                    f"minReplicas and maxReplicas), got {described(replicas)}",
                )
            )
            replicas = 0
        return replicas, None
    if "replicas" in cpu:
        errors.append(
            FieldError(
                f"{path}.replicas",
                "and cpu.maxReplicas are exclusive: a fixed count or a range the Ray "
                "autoscaler moves; remove one",
            )
        )
    low = _bounded(cpu, "minReplicas", path, 0, 0, _MAX_CPU_REPLICAS, errors)
    high = _bounded(cpu, "maxReplicas", path, 1, 1, _MAX_CPU_REPLICAS, errors)
    if low > high:
        errors.append(
            FieldError(
                f"{path}.minReplicas",
                f"{low} is more than cpu.maxReplicas {high}; lower minReplicas or raise "
                "maxReplicas",
            )
        )
    return low, high


def _cluster_parts(
    spec: Mapping[str, Any],
    errors: list[FieldError],
    *,
    name: str,
    namespace: str,
    uid: str,
    owner_kind: str,
    suspend: bool = False,
    labels: Mapping[str, Any] | None = None,
) -> SliceClusterSpec | None:
    """The shared parts (tpu, ray, head, worker, reservation) as a SliceClusterSpec
    for the object named; None when something is wrong (reported in ``errors``)."""
    groups: tuple[WorkerGroupSpec, ...] = ()
    # The policy decides which topologies are valid, so it is read before the shapes
    # (and judged with the rest of spec.reservation below).
    raw_reservation = spec.get("reservation")
    dynamic = (
        isinstance(raw_reservation, Mapping) and raw_reservation.get("policy") == "DynamicSlice"
    )
    if "workerGroups" in spec:
        groups = _worker_groups(spec, errors, dynamic=dynamic)
        tpu_groups = [g for g in groups if isinstance(g, TpuGroupSpec)]
        shape = tpu_groups[0].shape if tpu_groups else None
        # judged at each elastic group's maximum; the gang default counts the minimums
        slices = sum(g.slices if g.elastic is None else g.elastic.max_slices for g in tpu_groups)
        slices = slices or 1
        held = sum(g.slices if g.elastic is None else g.elastic.min_slices for g in tpu_groups)
    else:
        tpu = as_object(spec.get("tpu"), "spec.tpu", errors, _TPU_FIELDS)
        shape = _shape(tpu, "spec.tpu", errors, dynamic=dynamic)
        slices = _slices(tpu, "spec.tpu", errors)
        held = slices

    elastic = _elastic(spec.get("elastic"), slices, errors)
    if elastic is not None:
        slices = elastic.max_slices
        held = elastic.min_slices

    ray = as_object(spec.get("ray"), "spec.ray", errors, _RAY_FIELDS)
    ray_version = _string(ray.get("version"), "spec.ray.version", errors)
    if ray.get("version") in (None, ""):
        errors.append(FieldError("spec.ray.version", "is required, e.g. 2.54.0"))
    elif ray_version and (problem := _ray_version_error(ray_version)):
        errors.append(FieldError("spec.ray.version", problem))
    image = _string(ray.get("image"), "spec.ray.image", errors, max_length=512)
    image = image or default_image(ray_version)

    head = _group(spec.get("head"), "spec.head", errors, tpu_owned=False)
    worker = _group(spec.get("worker"), "spec.worker", errors, tpu_owned=True)
    first_tpu = next((g for g in groups if isinstance(g, TpuGroupSpec)), None)
    if first_tpu is not None:
        worker = first_tpu.worker

    reservation = as_object(
        spec.get("reservation"), "spec.reservation", errors, _RESERVATION_FIELDS
    )
    policy = reservation.get("policy", "NodePool")
    if policy not in RESERVATION_POLICIES or not isinstance(policy, str):
        errors.append(
            FieldError(
                "spec.reservation.policy",
                f"{described(policy)} is not NodePool, DynamicSlice or None",
            )
        )
    gang, priority, capacity_types = _queueing(reservation, held, errors)
    provisioning = _provisioning(reservation.get("provisioning"), errors)
    health = reservation.get("partitionHealth", PARTITION_HEALTH[0])
    if health not in PARTITION_HEALTH:
        errors.append(
            FieldError(
                "spec.reservation.partitionHealth",
                f"{described(health)} is not {' or '.join(PARTITION_HEALTH)}",
            )
        )
    if provisioning is not None and provisioning.enabled and policy != "NodePool":
        errors.append(
            FieldError(
                "spec.reservation.provisioning",
                "needs spec.reservation.policy NodePool (a provisioned pool is held for its "
                "slice like any other); remove provisioning or set the policy NodePool",
            )
        )
    kueue = _kueue(spec.get("kueue"), labels or {}, errors)
    if kueue is not None and kueue.admission_gate and policy == "DynamicSlice":
        errors.append(
            FieldError(
                "spec.kueue.admissionGate",
                "is not supported with spec.reservation.policy DynamicSlice (whether free "
                "partitions could form every slice is not judged before admission); remove it",
            )
        )
    pool_level_groups = [
        (f"spec.workerGroups[{i}].template", g)
        for i, g in enumerate(spec.get("workerGroups") or [])
        if isinstance(g, Mapping) and "tpu" in g
    ]
    tpu_by_name = {g.name: g for g in groups if isinstance(g, TpuGroupSpec)}
    targets = [
        (path, tpu_by_name[str(raw.get("name"))])
        for path, raw in pool_level_groups
        if str(raw.get("name")) in tpu_by_name
    ]
    single = [("spec.worker.template", worker, shape, slices, elastic)] if not groups else []
    for path, tpu_group, group_shape, group_slices, group_elastic in [
        *single,
        *((p, g.worker, g.shape, g.slices, g.elastic) for p, g in targets),
    ]:
        if group_shape is None:
            continue
        _kueue_pool_level(
            tpu_group.template,
            path,
            errors,
            hosts=group_shape.hosts,
            one_slice=group_slices == 1 and group_elastic is None,
            kueue=kueue is not None,
            policy=str(policy),
            provisioning=provisioning is not None and provisioning.enabled,
        )
    if shape is None:
        return None
    return SliceClusterSpec(
        name=name,
        namespace=namespace,
        uid=uid,
        shape=shape,
        slices=slices,
        ray_version=ray_version,
        image=image,
        head=head,
        worker=worker,
        reservation_policy=policy,
        allow_degraded=health == "HealthyAndDegraded",
        suspend=suspend,
        owner_kind=owner_kind,
        gang=gang,
        priority=priority,
        capacity_types=capacity_types,
        provisioning=provisioning,
        elastic=elastic,
        disruption=_disruption(spec.get("disruption"), errors),
        worker_groups=groups,
        kueue=kueue,
    )


def object_labels(obj: Any) -> Mapping[str, Any]:
    """The labels of an object as given (empty when absent or not a map)."""
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def _kueue_name(value: Any, path: str, errors: list[FieldError]) -> str:
    name = _string(value, path, errors, max_length=MAX_KUEUE_NAME)
    if name and not _CLASS_NAME.match(name):
        errors.append(
            FieldError(path, f"{name!r} is not a Kueue object name (lowercase DNS subdomain)")
        )
        return ""
    return name


def _kueue(raw: Any, labels: Mapping[str, Any], errors: list[FieldError]) -> KueueSpec | None:
    """spec.kueue; when absent, the object's own ``kueue.x-k8s.io/queue-name`` (and
    ``priority-class``) labels, as a user of Kueue labels any job."""
    if raw is None:
        queue = labels.get(constants.KUEUE_QUEUE_LABEL)
        if not queue:
            return None
        path = f"metadata.labels[{constants.KUEUE_QUEUE_LABEL}]"
        name = _kueue_name(queue, path, errors)
        priority = _kueue_name(
            labels.get(constants.KUEUE_PRIORITY_LABEL, ""),
            f"metadata.labels[{constants.KUEUE_PRIORITY_LABEL}]",
            errors,
        )
        return KueueSpec(name, priority) if name else None
    kueue = as_object(raw, "spec.kueue", errors, _KUEUE_FIELDS)
    if kueue.get("queueName") in (None, ""):
        errors.append(FieldError("spec.kueue.queueName", "is required (the LocalQueue's name)"))
        return None
    name = _kueue_name(kueue.get("queueName"), "spec.kueue.queueName", errors)
    priority = _kueue_name(
        kueue.get("priorityClassName", ""), "spec.kueue.priorityClassName", errors
    )
    gate = kueue.get("admissionGate", "")
    if gate not in ("", constants.ADMISSION_GATE_POOLS_FREE):
        errors.append(
            FieldError(
                "spec.kueue.admissionGate",
                f"must be {constants.ADMISSION_GATE_POOLS_FREE} or absent, not {described(gate)}",
            )
        )
        gate = ""
    return KueueSpec(name, priority, str(gate)) if name else None


def _disruption(raw: Any, errors: list[FieldError]) -> DisruptionSpec:
    path = "spec.disruption"
    spec = as_object(raw, path, errors, _DISRUPTION_FIELDS)
    return DisruptionSpec(
        avoid_maintenance_within_s=_bounded(
            spec,
            "avoidMaintenanceWithin",
            path,
            DEFAULT_AVOID_MAINTENANCE_WITHIN_S,
            0,
            MAX_AVOID_MAINTENANCE_WITHIN_S,
            errors,
        ),
        grace_period_s=_bounded(
            spec, "gracePeriodSeconds", path, DEFAULT_GRACE_PERIOD_S, 0, MAX_GRACE_PERIOD_S, errors
        ),
    )


def _elastic(
    raw: Any, slices: int, errors: list[FieldError], path: str = "spec.elastic"
) -> ElasticSpec | None:
    """spec.elastic, or a TPU group's elastic at ``path`` (None when absent), exclusive
    with the group's tpu.slices above 1."""
    if raw is None:
        return None
    elastic = as_object(raw, path, errors, _ELASTIC_FIELDS)
    bad = len(errors)
    tpu = "spec.tpu" if path == "spec.elastic" else path.removesuffix(".elastic") + ".tpu"
    if slices > 1:
        errors.append(
            FieldError(
                path,
                f"and {tpu}.slices {slices} are exclusive: an elastic set's slice count "
                f"moves between {path}.minSlices and maxSlices; set {tpu}.slices to 1 "
                f"(or remove it) and give the range in {path}, or remove {path}",
            )
        )
    if elastic.get("maxSlices") is None:
        errors.append(FieldError(f"{path}.maxSlices", "is required, e.g. 4"))
    low = _bounded(elastic, "minSlices", path, 0, 0, constants.MAX_SLICES, errors)
    high = _bounded(elastic, "maxSlices", path, 1, 1, constants.MAX_SLICES, errors)
    if low > high:
        errors.append(
            FieldError(
                f"{path}.minSlices",
                f"{low} is more than {path}.maxSlices {high}; lower minSlices or raise maxSlices",
            )
        )
    idle = elastic.get("idleTimeoutSeconds")
    scale_up = elastic.get("scaleUpTimeoutSeconds")
    if idle is not None:
        idle = _bounded(
            elastic,
            "idleTimeoutSeconds",
            path,
            0,
            0,
            MAX_ELASTIC_TIMEOUT,
            errors,
        )
    if scale_up is not None:
        scale_up = _bounded(
            elastic,
            "scaleUpTimeoutSeconds",
            path,
            MIN_SCALE_UP_TIMEOUT,
            MIN_SCALE_UP_TIMEOUT,
            MAX_ELASTIC_TIMEOUT,
            errors,
        )
    if len(errors) > bad:
        return None
    return ElasticSpec(low, high, idle, scale_up)


def _bounded(
    raw: Mapping[str, Any],
    key: str,
    path: str,
    default: int,
    low: int,
    high: int,
    errors: list[FieldError],
) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        errors.append(
            FieldError(
                f"{path}.{key}",
                f"must be an integer from {low} to {high}, got {described(value)}",
            )
        )
        return default
    return value


def _retry(raw: Any, errors: list[FieldError]) -> RetryPolicy:
    path = "spec.reservation.provisioning.retry"
    retry = as_object(raw, path, errors, _RETRY_FIELDS)
    default = RetryPolicy()
    limit = _bounded(retry, "limit", path, default.limit, 0, MAX_RETRY_LIMIT, errors)
    base = _bounded(
        retry, "baseBackoffSeconds", path, default.base_backoff_seconds, 1, MAX_BASE_BACKOFF, errors
    )
    high = _bounded(
        retry, "maxBackoffSeconds", path, default.max_backoff_seconds, 1, MAX_MAX_BACKOFF, errors
    )
    if base > high:
        errors.append(
            FieldError(
                f"{path}.baseBackoffSeconds",
                f"({base}) must not exceed maxBackoffSeconds ({high}; defaults 60 and 1800); "
                f"lower the base or raise the max",
            )
        )
    return RetryPolicy(limit=limit, base_backoff_seconds=base, max_backoff_seconds=high)


def _capacity_selector(raw: Any, errors: list[FieldError]) -> dict[str, str]:
    path = "spec.reservation.provisioning.nodeSelector"
    selector = _string_map(raw, path, errors)
    allowed = constants.CAPACITY_SELECTOR_KEYS
    owned = {
        constants.NODE_LABEL_ACCELERATOR: "from spec.tpu.type",
        constants.NODE_LABEL_TOPOLOGY: "from spec.tpu.topology",
        constants.NODE_LABEL_NODEPOOL: "set per slice to the node pool it holds",
    }
    for key, value in selector.items():
        where = f"{path}.{key}"
        if key in owned:
            errors.append(FieldError(where, f"is set by the operator ({owned[key]}); remove it"))
        elif key not in allowed:
            errors.append(
                FieldError(
                    where,
                    f"is not a capacity key; use one of {', '.join(allowed)} (other "
                    f"selectors go in spec.worker.template)",
                )
            )
        elif key in constants.CAPACITY_SELECTOR_TRUE_ONLY and value != "true":
            errors.append(
                FieldError(where, f'takes only "true" (GKE\'s label value), got {described(value)}')
            )
        elif len(value) > 63 or not _LABEL_VALUE.match(value):
            errors.append(
                FieldError(
                    where,
                    f"{described(value)} is not a label value (at most 63 letters, digits, "
                    f"'-', '_' or '.', starting and ending with a letter or digit)",
                )
            )
    return selector


def _provisioning(raw: Any, errors: list[FieldError]) -> ProvisioningSpec | None:
    """spec.reservation.provisioning (None when absent)."""
    if raw is None:
        return None
    path = "spec.reservation.provisioning"
    if not isinstance(raw, Mapping):
        errors.append(FieldError(path, f"must be an object, got {described(raw)}"))
        return None
    prov = as_object(raw, path, errors, _PROVISIONING_FIELDS)
    modes = [str(m) for m in ProvisioningMode]
    raw_mode = prov.get("mode")
    if raw_mode is None:
        errors.append(FieldError(f"{path}.mode", f"is required: one of {', '.join(modes)}"))
        return None
    if not isinstance(raw_mode, str) or raw_mode not in modes:
        errors.append(
            FieldError(f"{path}.mode", f"{described(raw_mode)} is not one of {', '.join(modes)}")
        )
        return None
    mode = ProvisioningMode(raw_mode)
    override = _string(prov.get("provisioningClassName"), f"{path}.provisioningClassName", errors)
    parameters = _string_map(prov.get("parameters"), f"{path}.parameters", errors)
    if mode == ProvisioningMode.NONE:
        for key in ("provisioningClassName", "parameters"):
            if prov.get(key):
                errors.append(
                    FieldError(
                        f"{path}.{key}",
                        "has no effect with mode None; remove it or set mode BestEffortAtomic "
                        "or QueuedProvisioning",
                    )
                )
    if override and (len(override) > 253 or not _CLASS_NAME.match(override)):
        errors.append(
            FieldError(
                f"{path}.provisioningClassName",
                f"{described(override)} is not a class name (a DNS subdomain of at most 253 "
                f"characters, e.g. {constants.PROVREQ_CLASS_QUEUED})",
            )
        )
    if len(parameters) > 100:
        errors.append(
            FieldError(f"{path}.parameters", f"has {len(parameters)} entries; at most 100")
        )
    for key, value in parameters.items():
        if len(value) > 255:
            errors.append(
                FieldError(
                    f"{path}.parameters.{key}",
                    f"has {len(value)} characters; a ProvisioningRequest parameter takes "
                    f"at most 255",
                )
            )
    class_name = override or PROVISIONING_CLASSES.get(mode, "")
    return ProvisioningSpec(
        mode=mode,
        class_name=class_name,
        parameters=parameters,
        node_selector=_capacity_selector(prov.get("nodeSelector"), errors),
        retry=_retry(prov.get("retry"), errors),
    )


def _boolean(value: Any, path: str, errors: list[FieldError], default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        errors.append(FieldError(path, f"must be true or false, got {described(value)}"))
        return default
    return value


def _integer(
    value: Any, path: str, errors: list[FieldError], minimum: int, why: str = ""
) -> int | None:
    """An optional int32 field of at least ``minimum`` (None when absent or wrong)."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        errors.append(FieldError(path, f"must be an integer, got {described(value)}"))
        return None
    if not minimum <= value <= _INT32_MAX:
        errors.append(FieldError(path, f"must be from {minimum} to {_INT32_MAX}, got {value}{why}"))
        return None
    return value


#: Examples in the messages of the YAML-in-a-string fields.
_RUNTIME_ENV_EXAMPLE = "'pip: [jax[tpu]]'"
_SERVE_CONFIG_EXAMPLE = "'applications: [{name: llm, import_path: serve_llm:app}]'"


def _passthrough_value(expected: str, value: Any, path: str, errors: list[FieldError]) -> Any:
    """One pass-through value checked for its kind of value (KubeRay's schema judges the
    rest)."""
    if expected == "string":
        return _string(value, path, errors, bounds.STRING_BOUNDS.get(path, 0))
    if expected == "string map":
        return _string_map(value, path, errors)
    if expected == "number":
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            errors.append(
                FieldError(path, f"must be a number of at least 0, got {described(value)}")
            )
        return value
    if expected == "boolean":
        return _boolean(value, path, errors, False)
    if expected == "object":
        if not isinstance(value, Mapping):
            errors.append(FieldError(path, f"must be an object, got {described(value)}"))
        elif path in bounds.TEMPLATE_BYTES:
            _template_size(value, path, errors)
    return value


def _passthrough(
    raw: Mapping[str, Any],
    path: str,
    owned: frozenset[str],
    allowed: Mapping[str, str],
    refused: Mapping[str, str],
    errors: list[FieldError],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"{path}.{key}"
        if key in owned:
            continue
        if key in refused:
            errors.append(FieldError(where, refused[key]))
        elif key in allowed:
            out[str(key)] = _passthrough_value(allowed[key], value, where, errors)
        else:
            known = ", ".join(sorted(owned | set(allowed)))
            errors.append(FieldError(where, f"is not a field; use one of {known}"))
    return out


def _yaml_map(value: str, path: str, errors: list[FieldError], example: str) -> None:
    """KubeRay parses these strings as YAML maps; say so here rather than in its events.
    Only a string within its bound is parsed (``yamlcheck`` says why and how)."""
    if len(value) > bounds.STRING_BOUNDS[path]:
        return  # reported as too long by _string; a huge string is never parsed
    problem = yaml_map_problem(value)
    if problem is not None:
        errors.append(FieldError(path, f"{problem}; e.g. {example}"))


_INT32_MAX = 2**31 - 1


def _queueing(
    reservation: Mapping[str, Any], slices: int, errors: list[FieldError]
) -> tuple[GangMode, int, tuple[CapacityType, ...]]:
    """spec.reservation.gang (default AllSlices for a multislice cluster: its slices run
    one job), priority and capacityTypes."""
    default_gang = GangMode.ALL_SLICES if slices > 1 else GangMode.PER_SLICE
    raw_gang = reservation.get("gang", str(default_gang))
    modes = [str(m) for m in GangMode]
    if not isinstance(raw_gang, str) or raw_gang not in modes:
        errors.append(
            FieldError(
                "spec.reservation.gang", f"{described(raw_gang)} is not {' or '.join(modes)}"
            )
        )
        raw_gang = str(default_gang)
    priority = reservation.get("priority", 0)
    if (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or not -MAX_PRIORITY <= priority <= MAX_PRIORITY
    ):
        errors.append(
            FieldError(
                "spec.reservation.priority",
                f"must be an integer from -{MAX_PRIORITY} to {MAX_PRIORITY} (higher is served "
                f"first), got {described(priority)}",
            )
        )
        priority = 0
    raw_types = reservation.get("capacityTypes", [])
    types: list[CapacityType] = []
    known = [str(t) for t in CapacityType]
    if not isinstance(raw_types, list):
        errors.append(
            FieldError(
                "spec.reservation.capacityTypes", f"must be a list, got {described(raw_types)}"
            )
        )
        raw_types = []
    for i, raw in enumerate(raw_types):
        path = f"spec.reservation.capacityTypes[{i}]"
        if not isinstance(raw, str) or raw not in known:
            errors.append(FieldError(path, f"{described(raw)} is not one of {', '.join(known)}"))
        elif CapacityType(raw) in types:
            errors.append(FieldError(path, f"{raw} is listed twice; list each type once"))
        else:
            types.append(CapacityType(raw))
    return GangMode(raw_gang), priority, tuple(types)
