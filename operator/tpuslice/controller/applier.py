"""The KubeRay applier: server-side apply of the RayCluster, RayJob or RayService that
``render.py`` made, only when needed.

We own only the fields we send (field manager ``tpuslice-operator``); KubeRay's
and users' fields stay theirs. An apply is sent when the RayCluster is
missing, differs in a field we own, or was applied from a different rendering
(the hash annotation, so SSA also removes fields we no longer send). A
RayCluster of the same name that we do not control is never touched. The
API server's refusals become a ``Stall`` that names the TPUSliceCluster field
at fault.

KubeRay's pod-template schema, read from its CRD, is kept here too: the
renderer judges overrides by it, and an apply refused for a type error means
it may be out of date.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpuslice.controller.expectations import Expectations
from tpuslice.model import constants as c
from tpuslice.model import events
from tpuslice.model.convert import raycluster_info, worker_replicas
from tpuslice.runtime.kube import ApiError, ClusterApi
from tpuslice.spec.schema import template_schema
from tpuslice.status.conditions import Stall

__all__ = [
    "Applied",
    "KubeRayApplier",
    "NameRead",
    "TemplateSchema",
    "applied_hash",
    "controlled_by",
    "gate_held",
    "is_subset",
    "kueue_managed",
    "name_taken_message",
    "rejection_message",
    "with_admission_hold",
    "with_kueue_admission",
    "with_kueue_count",
    "with_live_autoscaling",
]

log = logging.getLogger(__name__)

#: How often to look again for KubeRay's CRD when it is missing, and how long a schema
#: read from it is used before it is read again (KubeRay upgraded under us).
SCHEMA_RETRY_SECONDS = 30.0
SCHEMA_MAX_AGE_SECONDS = 600.0
RAYCLUSTER_CRD = f"{c.RAY_PLURAL_CLUSTER}.{c.RAY_GROUP}"

KUBERAY_HINT = (
    "the ray.io/v1 RayCluster CRD is not installed: install KubeRay >= 1.5 (helm install "
    "kuberay-operator kuberay/kuberay-operator) with multi-host indexing on; the operator "
    "retries on its own"
)


def applied_hash(rendered: Mapping[str, Any]) -> str:
    """A digest of everything we send, kept on the RayCluster to notice removed fields."""
    return hashlib.sha256(json.dumps(rendered, sort_keys=True).encode()).hexdigest()[:16]


def controlled_by(owner_references: Sequence[Mapping[str, Any]], uid: str) -> bool:
    """True when the object's controller owner reference names ``uid``."""
    return any(o.get("uid") == uid and o.get("controller") for o in owner_references)


def name_taken_message(key: tuple[str, str, str], raycluster: Mapping[str, Any]) -> str:
    """Why a TPUSlice object cannot have its RayCluster (RayJob, RayService), naming the
    one in the way."""
    kind, namespace, name = key
    controller = next((o for o in raycluster["ownerReferences"] if o.get("controller")), None)
    owner = (
        f"controlled by {controller.get('kind')} {controller.get('name')}"
        if controller
        else "not controlled by any object"
    )
    return (
        f"{kind} {namespace}/{name} already exists and is {owner}; the operator never "
        f"modifies or deletes it. Rename this object, or delete that {kind} "
        f"if it is no longer needed"
    )


def is_subset(wanted: Any, actual: Any) -> bool:
    """True when every field in ``wanted`` has the same value in ``actual`` (SSA is a no-op)."""
    if isinstance(wanted, Mapping):
        return isinstance(actual, Mapping) and all(
            k in actual and is_subset(v, actual[k]) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(wanted) == len(actual)
            and all(is_subset(w, a) for w, a in zip(wanted, actual, strict=True))
        )
    return bool(wanted == actual)


_CLUSTER_SPEC = r"\.?spec\.(?:rayClusterSpec\.|rayClusterConfig\.)?"
_WORKER_TEMPLATE = re.compile(_CLUSTER_SPEC + r"workerGroupSpecs\[[^\]]*\]\.template")
_HEAD_TEMPLATE = re.compile(_CLUSTER_SPEC + r"headGroupSpec\.template")


def rejection_message(message: str, kind: str = c.RAY_KIND_CLUSTER) -> str:
    """The API server's reason for refusing our RayCluster (RayJob, RayService), with the
    cluster's template paths written as the TPUSlice object's fields they come from."""
    message = _WORKER_TEMPLATE.sub("spec.worker.template", message)
    message = _HEAD_TEMPLATE.sub("spec.head.template", message)
    return f"{kind} rejected: {message}"


def _typed_patch_error(exc: ApiError) -> bool:
    """Server-side apply answers 500 when a field has the wrong type for the CRD's schema
    (an override whose resources is a string): the request's fault, not the server's."""
    return exc.status == 500 and "failed to create typed patch object" in exc.message


def kueue_managed(rendered: Mapping[str, Any], actual: Mapping[str, Any] | None) -> bool:
    """Whether Kueue admits this KubeRay object: we render its queue label (spec.kueue),
    or the live object carries one (Kueue's webhook labels a RayCluster created in a
    namespace with a LocalQueue named ``default``: jobframework
    ``ApplyDefaultLocalQueue``, kubernetes-sigs/kueue v0.17.0)."""
    labels = (rendered.get("metadata") or {}).get("labels") or {}
    live = (actual or {}).get("labels") or {}
    return c.KUEUE_QUEUE_LABEL in labels or c.KUEUE_QUEUE_LABEL in live


def gate_held(actual: Mapping[str, Any] | None) -> bool:
    """Whether the live KubeRay object carries the operator's gate in Kueue's
    admission-gated-by annotation (spec.kueue.admissionGate). The gate can only be there
    from the create (Kueue's webhook refuses adding one later) and the operator's field
    manager owns the annotation: an apply without it removes it, and Kueue then admits
    the Workload (kubernetes-sigs/kueue v0.17.0 pkg/controller/jobframework/reconciler.go
    ``UpdateAdmissionGatedBy``, pkg/controller/core/workload_controller.go)."""
    value = str(((actual or {}).get("annotations") or {}).get(c.KUEUE_ADMISSION_GATED_BY) or "")
    return c.POOLS_FREE_GATE in (g.strip() for g in value.split(","))


def with_resume(rendered: Mapping[str, Any], actual: Mapping[str, Any] | None) -> dict[str, Any]:
    """KubeRay 1.5 resumes only on an explicit ``suspend: false``; removing the field leaves
    the cluster suspended. Send false once, for a suspension we made, never for an object
    Kueue admits: its suspension is Kueue's even when our field manager holds the field
    (Kueue's webhook suspends inside our create request)."""
    if (
        "suspend" not in rendered["spec"]
        and actual is not None
        and actual.get("ownsSuspend")
        and actual["spec"].get("suspend") is True
        and not kueue_managed(rendered, actual)
    ):
        return {**rendered, "spec": {**rendered["spec"], "suspend": False}}
    return dict(rendered)


def with_admission_hold(
    rendered: Mapping[str, Any], actual: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The apply of a RayCluster or RayJob Kueue admits: ``suspend: true`` at create, and
    afterwards carried only while the live object is suspended, guarded by the
    ``resourceVersion`` it was read at; never ``false``. Kueue's labels the live object
    carries and we do not render (the default LocalQueue's) are carried as well.

    Kueue admits by an update that sets ``spec.suspend`` false, which makes Kueue's
    manager the field's owner; an apply that left the field out while our manager still
    owned it would remove it, and a RayCluster without ``suspend`` runs. Carrying the live
    true keeps the field held until Kueue changes it, the ``resourceVersion`` makes an
    apply read before Kueue's admission fail (409) instead of suspending again, and once
    Kueue owns ``false`` our applies leave the field alone. The rendering and its digest
    never hold ``suspend`` for this, so no apply is sent only because Kueue moved it."""
    out = dict(rendered)
    if rendered.get("kind") not in (c.RAY_KIND_CLUSTER, c.RAY_KIND_JOB):
        return out
    if not kueue_managed(rendered, actual):
        return out
    metadata = dict(rendered["metadata"])
    labels = dict(metadata.get("labels") or {})
    live_labels = (actual or {}).get("labels") or {}
    for key in (c.KUEUE_QUEUE_LABEL, c.KUEUE_PRIORITY_LABEL):
        if key not in labels and key in live_labels:
            labels[key] = live_labels[key]
    metadata["labels"] = labels
    spec = dict(rendered["spec"])
    if actual is None:
        spec["suspend"] = True
    elif actual["spec"].get("suspend") is True:
        spec["suspend"] = True
        if actual.get("resourceVersion"):
            metadata["resourceVersion"] = actual["resourceVersion"]
    out["metadata"] = metadata
    out["spec"] = spec
    return out


def with_kueue_count(
    rendered: Mapping[str, Any], actual: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The create of one of Kueue's elastic RayClusters with each autoscaled group's count
    at its minimum. The render leaves ``replicas`` to the autoscaler, so a new RayCluster
    takes KubeRay's CRD default, 0, which KubeRay reads as the minimum; but Kueue's
    webhook builds the Workload from ``replicas`` as it stands (kubernetes-sigs/kueue
    v0.17.0 pkg/controller/jobs/raycluster/common.go ``BuildPodSets``), and would ask no
    quota for the slices the cluster starts with. Later applies carry the live count."""
    out = dict(rendered)
    annotations = (rendered.get("metadata") or {}).get("annotations") or {}
    if actual is not None or annotations.get(c.KUEUE_ELASTIC_JOB) != "true":
        return out
    spec = rendered["spec"]
    groups = [
        {**g, "replicas": g["minReplicas"]}
        if "replicas" not in g and isinstance(g.get("minReplicas"), int)
        else g
        for g in spec.get("workerGroupSpecs") or []
    ]
    out["spec"] = {**spec, "workerGroupSpecs": groups}
    return out


def _kueue_key(key: Any) -> bool:
    return str(key).startswith(c.KUEUE_GATE_PREFIX)


def _carry_kueue_template(
    template: Mapping[str, Any], live: Mapping[str, Any]
) -> Mapping[str, Any]:
    """``template`` with what Kueue added to the ``live`` one at admission: its labels,
    annotations and scheduling gates (``kueue.x-k8s.io/...``) that the rendering lacks."""
    meta = template.get("metadata") or {}
    live_meta = live.get("metadata") or {}
    spec = template.get("spec") or {}
    gates = list(spec.get("schedulingGates") or [])
    names = {g.get("name") for g in gates if isinstance(g, Mapping)}
    added_gates = [
        g
        for g in (live.get("spec") or {}).get("schedulingGates") or []
        if isinstance(g, Mapping) and _kueue_key(g.get("name")) and g.get("name") not in names
    ]
    out_meta = dict(meta)
    for field_name in ("labels", "annotations"):
        mine = dict(meta.get(field_name) or {})
        theirs = {
            k: v
            for k, v in (live_meta.get(field_name) or {}).items()
            if _kueue_key(k) and k not in mine
        }
        if theirs:
            out_meta[field_name] = {**mine, **theirs}
    if not added_gates and out_meta == meta:
        return template
    out = {**template, "metadata": out_meta}
    if added_gates:
        out["spec"] = {**spec, "schedulingGates": gates + added_gates}
    return out


def with_kueue_admission(
    rendered: Mapping[str, Any], actual: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The apply (and the comparison before it) carrying what Kueue wrote into the pod
    templates when it admitted the object: its pod-set label and Workload annotation,
    and its scheduling gates, ``kueue.x-k8s.io/topology`` of topology-aware scheduling
    above all (kubernetes-sigs/kueue v0.17.0 pkg/podset/podset.go ``Merge``, called by
    the RayCluster and RayJob integrations' ``RunWithPodSetsInfo``). KubeRay declares
    ``workerGroupSpecs`` without a list type, so an apply sets every field of every
    group: sent without them, the apply would take Kueue's gate off the template (new
    pods would be placed by no one) and its label off (Kueue's TopologyUngater finds a
    pod set's pods by it), and a gate list longer than the rendering's would make every
    pass apply. Only Kueue's keys are carried; the rest stays as rendered."""
    out = dict(rendered)
    if actual is None:
        return out
    prefix = "rayClusterSpec" if rendered.get("kind") == c.RAY_KIND_JOB else ""
    spec = rendered.get("spec") or {}
    live_spec = actual.get("spec") or {}
    cluster = spec.get(prefix) if prefix else spec
    live_cluster = live_spec.get(prefix) if prefix else live_spec
    if not isinstance(cluster, Mapping) or not isinstance(live_cluster, Mapping):
        return out
    new_cluster = dict(cluster)
    head = (cluster.get("headGroupSpec") or {}).get("template")
    live_head = (live_cluster.get("headGroupSpec") or {}).get("template")
    if isinstance(head, Mapping) and isinstance(live_head, Mapping):
        carried_head = _carry_kueue_template(head, live_head)
        if carried_head is not head:
            new_cluster["headGroupSpec"] = {**cluster["headGroupSpec"], "template": carried_head}
    live_groups = {
        g.get("groupName"): g.get("template")
        for g in live_cluster.get("workerGroupSpecs") or []
        if isinstance(g, Mapping) and isinstance(g.get("template"), Mapping)
    }
    groups = []
    for group in cluster.get("workerGroupSpecs") or []:
        live_template = live_groups.get(group.get("groupName"))
        template = group.get("template")
        if isinstance(template, Mapping) and live_template is not None:
            carried = _carry_kueue_template(template, live_template)
            if carried is not template:
                group = {**group, "template": carried}
        groups.append(group)
    if "workerGroupSpecs" in cluster:
        new_cluster["workerGroupSpecs"] = groups
    out["spec"] = {**spec, prefix: new_cluster} if prefix else new_cluster
    return out


def with_live_autoscaling(
    rendered: Mapping[str, Any], actual: Mapping[str, Any] | None
) -> dict[str, Any]:
    """An elastic RayCluster's apply carrying the autoscaler's live ``replicas`` and
    ``scaleStrategy``, guarded by the ``resourceVersion`` they were read at.

    The render never sends ``replicas`` for an elastic set (the autoscaler owns the
    count), but KubeRay declares ``workerGroupSpecs`` without a list type
    (ray-project/kuberay ray-operator/apis/ray/v1/raycluster_types.go), so server-side
    apply treats the list as atomic: whoever applies it sets every field of every group,
    and a group sent without ``replicas`` would have its count removed (then defaulted
    to 0, read as ``minReplicas``). Likewise the rendered empty ``workersToDelete``
    would wipe a list of hosts the autoscaler named and KubeRay has not deleted yet, so
    the live ``scaleStrategy`` is sent when there is one. The ``resourceVersion`` makes
    the API server refuse the apply (409) if the autoscaler changed anything since the
    watch showed it: the next pass, kicked by that change, applies again with the new
    values. A new RayCluster gets the rendering (KubeRay's default count, the minimum).
    Every group the render sends without ``replicas`` is the autoscaler's (an elastic
    TPU group, a CPU group's range) and carries its own live values; fixed groups are
    sent as rendered. RayJobs and RayServices are left as rendered: KubeRay makes their
    RayClusters from the template and the autoscaler patches those."""
    out = dict(rendered)
    if rendered.get("kind") != c.RAY_KIND_CLUSTER or actual is None:
        return out
    spec = rendered["spec"]
    if not spec.get("enableInTreeAutoscaling"):
        return out
    groups: list[Mapping[str, Any]] = []
    changed = False
    for group in spec.get("workerGroupSpecs") or []:
        carried = _live_values(actual, str(group.get("groupName")))
        if "replicas" in group or not carried:
            groups.append(group)
            continue
        groups.append(_carry(group, carried))
        changed = True
    if not changed:
        return out
    out["spec"] = {**spec, "workerGroupSpecs": groups}
    if actual.get("resourceVersion"):
        out["metadata"] = {**rendered["metadata"], "resourceVersion": actual["resourceVersion"]}
    return out


def _live_values(actual: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The live count and ``scaleStrategy`` of the RayCluster's worker group ``name``."""
    live_group = _live_worker_group(actual, name)
    if live_group is None:
        return {}
    carried: dict[str, Any] = {}
    live = worker_replicas(actual, name)
    if live is not None:
        carried["replicas"] = live
    strategy = live_group.get("scaleStrategy")
    if isinstance(strategy, Mapping):
        carried["scaleStrategy"] = dict(strategy)
    return carried


def _carry(group: Mapping[str, Any], carried: Mapping[str, Any]) -> dict[str, Any]:
    """The rendered group with the live values: a count only where the render sent none,
    the live ``scaleStrategy`` always (the render's is only there to exist)."""
    out = dict(group)
    if "replicas" in carried and "replicas" not in group:
        out["replicas"] = carried["replicas"]
    if "scaleStrategy" in carried:
        out["scaleStrategy"] = carried["scaleStrategy"]
    return out


def _live_worker_group(actual: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """The worker group ``name`` of a RayCluster as the watch shows it, None without it."""
    for group in (actual.get("spec") or {}).get("workerGroupSpecs") or []:
        if isinstance(group, Mapping) and group.get("groupName") == name:
            return group
    return None


@dataclass(frozen=True)
class Applied:
    """The applier's answer: whether the RayCluster is as rendered (sent or already so),
    else why not."""

    ok: bool
    stall: Stall | None = None
    #: An apply request was sent in this pass.
    sent: bool = False


@dataclass
class TemplateSchema:
    """KubeRay's pod-template schema from its CRD in the cluster, read once and again after
    SCHEMA_MAX_AGE_SECONDS (or SCHEMA_RETRY_SECONDS while it is missing)."""

    kube: ClusterApi
    _schema: Mapping[str, Any] | None = None
    _read_at: float = -math.inf
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def get(self) -> Mapping[str, Any] | None:
        async with self._lock:
            age = time.monotonic() - self._read_at
            limit = SCHEMA_RETRY_SECONDS if self._schema is None else SCHEMA_MAX_AGE_SECONDS
            if age >= limit:
                self._read_at = time.monotonic()
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

    def forget(self) -> None:
        """Read KubeRay's CRD again on the next use (it may have changed)."""
        self._read_at = -math.inf


def _owner_uid(rendered: Mapping[str, Any]) -> str:
    """The uid of the TPUSlice object that owns a rendered KubeRay object."""
    return str(rendered["metadata"]["ownerReferences"][0]["uid"])


@dataclass(frozen=True)
class NameRead:
    """The KubeRay object of a rendered name as one read found it (None: no such
    object), and the uid of the TPUSlice object the rendering belongs to."""

    existing: Mapping[str, Any] | None
    owner_uid: str

    @property
    def taken(self) -> bool:
        """Another's object holds the name: a forced apply would take it over."""
        return self.existing is not None and not controlled_by(
            self.existing["ownerReferences"], self.owner_uid
        )


@dataclass
class KubeRayApplier:
    kube: ClusterApi
    pending: Expectations
    schema: TemplateSchema

    async def read_name(
        self, rendered: Mapping[str, Any], actual: Mapping[str, Any] | None
    ) -> NameRead:
        """The KubeRay object of ``rendered``'s name (``NameRead.taken``: another's): what
        the watch shows (``actual``), else one GET. ``apply`` reads it before a first
        apply; a pass that acts before it applies reads it first and hands the read to
        ``apply``, so the name costs one GET."""
        if actual is not None:
            return NameRead(existing=actual, owner_uid=_owner_uid(rendered))
        found = await self.kube.get_ray(
            c.RAY_PLURALS[str(rendered["kind"])],
            rendered["metadata"].get("namespace", ""),
            rendered["metadata"]["name"],
        )
        existing = None if found is None else raycluster_info(found)
        return NameRead(existing=existing, owner_uid=_owner_uid(rendered))

    async def apply(
        self,
        rendered: Mapping[str, Any],
        actual: Mapping[str, Any] | None,
        *,
        admission_gate: bool = False,
        read: NameRead | None = None,
    ) -> Applied:
        """Make the RayCluster, RayJob or RayService what ``rendered`` says, if it is ours
        to make. ``actual``: what the watch shows of it (``convert.raycluster_info`` or
        ``ray_owner_info``), None when the watch shows none. ``admission_gate``: carry
        the operator's gate in Kueue's admission-gated-by annotation (``gate_held``).
        ``read``: this pass's ``read_name``, used instead of a second GET."""
        rendered = with_resume(rendered, actual)
        digest = applied_hash(rendered)
        # the rendering's own annotations (Kueue's elastic-job opt-in) and the digest
        annotations = dict(rendered["metadata"].get("annotations") or {})
        annotations[c.ANNOTATION_APPLIED_HASH] = digest
        if admission_gate:
            annotations[c.KUEUE_ADMISSION_GATED_BY] = c.POOLS_FREE_GATE
        rendered = {
            **rendered,
            "metadata": {**rendered["metadata"], "annotations": annotations},
        }
        kind = str(rendered["kind"])
        key = (kind, rendered["metadata"].get("namespace", ""), rendered["metadata"]["name"])
        if actual is not None:
            self.pending.ray_seen(key)
        elif self.pending.applied_digest(key) == digest:
            return Applied(ok=True)  # applied by an earlier pass; the watch has not shown it
        # compared with the live count and workersToDelete carried in, so the autoscaler's
        # patches alone never make an apply
        rendered = with_kueue_admission(rendered, actual)
        carried = with_live_autoscaling(rendered, actual)
        wanted = {"labels": rendered["metadata"]["labels"], "spec": carried["spec"]}
        owner_uid = _owner_uid(rendered)
        if (
            actual is not None
            and actual["annotations"].get(c.ANNOTATION_APPLIED_HASH) == digest
            and is_subset(wanted, actual)
            and controlled_by(actual["ownerReferences"], owner_uid)
            and gate_held(actual) == admission_gate
        ):
            return Applied(ok=True)
        # Our watch follows only labelled RayClusters: before the first apply, make sure
        # the name is not another's (a forced apply would take it over, and the
        # finalizer later delete it). One GET per cluster creation, not per pass.
        name = read or await self.read_name(rendered, actual)
        if name.taken:
            assert name.existing is not None
            stall = Stall(events.RAYCLUSTER_NAME_TAKEN, name_taken_message(key, name.existing))
            return Applied(ok=False, stall=stall)
        existing = name.existing
        body = with_admission_hold(
            with_kueue_count(with_live_autoscaling(rendered, existing), existing), existing
        )
        try:
            await self.kube.apply_ray(body)
        except ApiError as exc:
            if exc.conflict and "resourceVersion" in body["metadata"]:
                # the autoscaler moved the count since the watch showed it: the watch
                # event of that change passes the object again, with the new count
                return Applied(ok=False)
            if exc.not_found:
                return Applied(ok=False, stall=Stall(events.KUBERAY_NOT_INSTALLED, KUBERAY_HINT))
            if exc.status in (400, 403, 409, 422) or _typed_patch_error(exc):
                if _typed_patch_error(exc):
                    self.schema.forget()  # the schema we judged by may be out of date
                stall = Stall(events.APPLY_REJECTED, rejection_message(exc.message, kind))
                return Applied(ok=False, stall=stall)
            raise
        self.pending.ray_applied(key, digest, time.monotonic())
        return Applied(ok=True, sent=True)
