"""TPUSlice kinds -> KubeRay objects, as pure functions over plain dicts.

A TPUSliceCluster becomes a RayCluster, a TPUSliceJob a RayJob, a
TPUSliceService a RayService. The cluster is the whole product a user sees, so
its expansion is one function (``render_ray_cluster_spec``) with golden tests
and the ``tpuslice render`` command; the RayJob's ``rayClusterSpec`` and the
RayService's ``rayClusterConfig`` are exactly what it returns for the same
parts. The operator applies exactly what these return (server-side apply, so
fields set by users or other controllers, such as Kueue, are left alone: we
only send the fields we own).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuslice.model import constants as c
from tpuslice.model.topology import SliceShape
from tpuslice.render.groups import cpu_worker_group
from tpuslice.spec.bounds import CEILING, SpecLimits
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.job import SliceJobSpec, parse_job
from tpuslice.spec.limits import check_limits
from tpuslice.spec.overrides import OwnedValue, merge_template
from tpuslice.spec.parts import CpuGroupSpec, FieldError, SliceClusterSpec, SpecError
from tpuslice.spec.service import SliceServiceSpec, parse_service

__all__ = [
    "DEFAULT_HEAD_RESOURCES",
    "kueue_labels",
    "ray_node_labels",
    "render",
    "render_cluster",
    "render_job",
    "render_ray_cluster_spec",
    "render_raycluster",
    "render_rayjob",
    "render_rayservice",
    "render_service",
]

#: GKE taints queued-provisioning nodes cloud.google.com/gke-queued=true:NoSchedule; the
#: cluster autoscaler tolerates it only in its simulation, so the real pods must.
QUEUED_TOLERATION: Mapping[str, str] = {
    "key": c.QUEUED_TAINT_KEY,
    "operator": "Exists",
    "effect": "NoSchedule",
}

#: Head resources when the user gives none: the head runs GCS and the
#: dashboard, no TPU work, and a BestEffort head is the first pod evicted.
DEFAULT_HEAD_RESOURCES: Mapping[str, str] = {"cpu": "2", "memory": "8Gi"}


def _container_resources(resources: Mapping[str, str]) -> dict[str, Any]:
    """The shorthand ``resources: {cpu, memory}`` means requests = limits (Guaranteed QoS)."""
    if not resources:
        return {}
    return {"requests": dict(resources), "limits": dict(resources)}


def _owner_reference(spec: SliceClusterSpec) -> list[dict[str, Any]]:
    """The owning TPUSlice object as controller (garbage collection deletes what it owns)."""
    if not spec.uid:  # a local file read by `tpuslice render` has no uid yet
        return []
    return [
        {
            "apiVersion": c.API_VERSION,
            "kind": spec.owner_kind,
            "name": spec.name,
            "uid": spec.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def _metadata(spec: SliceClusterSpec, owner_label: str) -> dict[str, Any]:
    """Name, namespace, our labels and the owner reference of a rendered KubeRay object."""
    metadata: dict[str, Any] = {"name": spec.name}
    if spec.namespace:
        metadata["namespace"] = spec.namespace
    metadata["labels"] = {owner_label: spec.name, c.LABEL_MANAGED_BY: c.MANAGED_BY}
    metadata["labels"].update(kueue_labels(spec))
    if owners := _owner_reference(spec):
        metadata["ownerReferences"] = owners
    return metadata


def kueue_labels(spec: SliceClusterSpec) -> dict[str, str]:
    """Kueue's labels of the KubeRay object (``spec.kueue``): the LocalQueue and the
    WorkloadPriorityClass. Kueue's webhook suspends a labelled RayCluster or RayJob at
    create and its controller unsuspends it at admission (kubernetes-sigs/kueue v0.17.0
    pkg/controller/jobframework: ``ApplyDefaultForSuspend``, reconciler ``startJob``);
    the applier sends ``suspend: true`` at create too, never false
    (``applier.with_admission_hold``)."""
    if spec.kueue is None:
        return {}
    labels = {c.KUEUE_QUEUE_LABEL: spec.kueue.queue_name}
    if spec.kueue.priority_class:
        labels[c.KUEUE_PRIORITY_LABEL] = spec.kueue.priority_class
    return labels


def worker_labels(spec: SliceClusterSpec) -> dict[str, str]:
    """Labels on every worker pod: the webhook's objectSelector and users' selectors use them.

    A TPUSliceJob's or TPUSliceService's pods also name their owner's kind, so they
    are never taken for the pods of a TPUSliceCluster of the same name."""
    labels = {
        c.LABEL_CLUSTER: spec.name,
        c.LABEL_ACCELERATOR_TYPE: spec.shape.accelerator_type,
        c.LABEL_TOPOLOGY: spec.shape.topology,
    }
    if spec.owner_kind != c.KIND_CLUSTER:
        labels[c.LABEL_OWNER_KIND] = spec.owner_kind
    return labels


def ray_node_labels(shape: SliceShape) -> dict[str, str]:
    """Ray node labels of every host of a slice of ``shape``, as Ray derives them on a TPU
    host (``TPUAcceleratorManager``: ``TPU-<VERSION>``, the pod type from
    ``TPU_ACCELERATOR_TYPE`` normalised to Ray's spelling, the topology).

    Written in the worker group's ``labels``: KubeRay passes them to ``ray start
    --labels`` and the Ray autoscaler reads them from the RayCluster spec, so label
    selectors and autoscaling see the slices before any pod has started. The values
    equal Ray's own, so Ray never overrides them (tests/contract checks it)."""
    version = shape.generation.ray_version
    return {
        c.RAY_LABEL_ACCELERATOR_TYPE: f"TPU-{version.upper()}",
        c.RAY_LABEL_TPU_POD_TYPE: shape.ray_pod_type,
        c.RAY_LABEL_TPU_TOPOLOGY: shape.topology,
    }


def worker_annotations(spec: SliceClusterSpec) -> dict[str, str]:
    """What the TPU identity webhook reads besides KubeRay's labels (see identity.py)."""
    annotations = {
        c.ANNOTATION_TPU_TYPE: spec.shape.generation.name,
        c.ANNOTATION_CHIPS_PER_HOST: str(spec.shape.chips_per_host),
        # an elastic set's maximum: the bound of a replica index, not a live count
        c.ANNOTATION_SLICES: str(spec.slices),
    }
    if spec.elastic is not None:
        annotations[c.ANNOTATION_ELASTIC] = "true"
    if not spec.multislice:
        annotations[c.ANNOTATION_MULTISLICE] = "false"
    if spec.dynamic:
        annotations[c.ANNOTATION_DYNAMIC_SLICE] = "true"
    return annotations


def _head_template(
    spec: SliceClusterSpec, schema: Mapping[str, Any] | None
) -> tuple[dict[str, Any], list[FieldError]]:
    resources = {**DEFAULT_HEAD_RESOURCES, **spec.head.resources}
    base = {
        "spec": {
            "containers": [
                {
                    "name": c.HEAD_CONTAINER,
                    "image": spec.image,
                    "resources": _container_resources(resources),
                }
            ]
        }
    }
    return merge_template(base, spec.head.template, (), "spec.head.template", schema)


#: Ray's SIGTERM drain deadline: ``ray start --block`` marks its node draining (reason
#: PREEMPTION, with a deadline) and waits up to this many seconds (default 30.0; 0 = no
#: drain) [read: ray 2.60.0 ray/_private/ray_constants.py, RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S].
RAY_DRAIN_TIMEOUT_ENV = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"
#: Seconds of the grace period left after Ray's drain deadline, so ``ray start`` exits on
#: its own before the kubelet's SIGKILL at the end of terminationGracePeriodSeconds.
DRAIN_MARGIN_SECONDS = 5


def drain_timeout(grace_seconds: int) -> int:
    """Ray's drain deadline for a pod with ``grace_seconds`` of termination grace: the
    grace less ``DRAIN_MARGIN_SECONDS``, at least half of it (0 stays 0: no drain)."""
    return max(grace_seconds - DRAIN_MARGIN_SECONDS, grace_seconds // 2)


def _worker_owned(spec: SliceClusterSpec, tpu_path: str = "spec.tpu") -> list[OwnedValue]:
    chips = str(spec.shape.chips_per_host)
    container = ("spec", "containers", ("name", c.WORKER_CONTAINER), "resources")
    owned: list[OwnedValue] = [
        (
            ("spec", "nodeSelector", c.NODE_LABEL_ACCELERATOR),
            spec.shape.generation.gke_accelerator,
            f"from {tpu_path}.type",
        ),
        (
            ("spec", "nodeSelector", c.NODE_LABEL_TOPOLOGY),
            spec.shape.topology,
            f"from {tpu_path}.topology",
        ),
        ((*container, "requests", c.TPU_RESOURCE), chips, f"chips per host from {tpu_path}"),
        ((*container, "limits", c.TPU_RESOURCE), chips, f"chips per host from {tpu_path}"),
        (
            ("spec", "terminationGracePeriodSeconds"),
            spec.disruption.grace_period_s,
            "from spec.disruption.gracePeriodSeconds",
        ),
        (
            (*container[:-1], "env", ("name", RAY_DRAIN_TIMEOUT_ENV), "value"),
            str(drain_timeout(spec.disruption.grace_period_s)),
            "from spec.disruption.gracePeriodSeconds",
        ),
    ]
    owned += [
        (("metadata", "labels", key), value, "identifies the slice's pods")
        for key, value in worker_labels(spec).items()
    ]
    owned += [
        (("metadata", "annotations", key), value, "read by the TPU identity webhook")
        for key, value in worker_annotations(spec).items()
    ]
    if spec.provisioning is not None:
        owned += [
            (
                ("spec", "nodeSelector", key),
                value,
                "from spec.reservation.provisioning.nodeSelector",
            )
            for key, value in spec.provisioning.node_selector.items()
        ]
    if spec.gated:
        owned.append(
            (
                ("spec", "nodeSelector", c.NODE_LABEL_NODEPOOL),
                None,
                "set per slice to the reserved node pool; use reservation.policy None to pin pools "
                "yourself",
            )
        )
    return owned


def _worker_template(
    spec: SliceClusterSpec, schema: Mapping[str, Any] | None, path: str = "spec.worker"
) -> tuple[dict[str, Any], list[FieldError]]:
    chips = str(spec.shape.chips_per_host)
    resources = _container_resources(spec.worker.resources) or {"requests": {}, "limits": {}}
    resources["requests"][c.TPU_RESOURCE] = chips
    resources["limits"][c.TPU_RESOURCE] = chips
    pod_spec: dict[str, Any] = {
        "nodeSelector": {
            c.NODE_LABEL_ACCELERATOR: spec.shape.generation.gke_accelerator,
            c.NODE_LABEL_TOPOLOGY: spec.shape.topology,
        },
        "tolerations": [{"key": c.TPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": c.WORKER_CONTAINER,
                "image": spec.image,
                "resources": resources,
                # a disrupted slice's pods are deleted with this grace (planning/disruption.py);
                # KubeRay sets none itself (ray-project/kuberay#5004)
                "env": [
                    {
                        "name": RAY_DRAIN_TIMEOUT_ENV,
                        "value": str(drain_timeout(spec.disruption.grace_period_s)),
                    }
                ],
            }
        ],
        "terminationGracePeriodSeconds": spec.disruption.grace_period_s,
    }
    if spec.gated:
        pod_spec["schedulingGates"] = [{"name": c.SCHEDULING_GATE}]
    if spec.provisioning is not None:
        # capacity keys: the pods go only where the request's template asks GKE to build
        pod_spec["nodeSelector"].update(spec.provisioning.node_selector)
        if spec.provisions and spec.provisioning.queued:
            pod_spec["tolerations"].append(dict(QUEUED_TOLERATION))
    base = {
        "metadata": {"labels": worker_labels(spec), "annotations": worker_annotations(spec)},
        "spec": pod_spec,
    }
    # a group's shape is its entry's tpu; the one-group form's is spec.tpu
    tpu_path = "spec.tpu" if path == "spec.worker" else f"{path}.tpu"
    owned = _worker_owned(spec, tpu_path)
    return merge_template(base, spec.worker.template, owned, f"{path}.template", schema)


def render_ray_cluster_spec(
    spec: SliceClusterSpec,
    template_schema: Mapping[str, Any] | None = None,
    limits: SpecLimits = CEILING,
) -> dict[str, Any]:
    """The RayCluster ``spec`` for a validated cluster spec; raise SpecError on override
    problems. The same dict is a RayCluster's spec, a RayJob's ``rayClusterSpec`` and a
    RayService's ``rayClusterConfig``.

    ``template_schema`` (``schema.template_schema`` of KubeRay's RayCluster CRD) makes
    every field of the pod-template overrides checked as the API server would.

    No worker group is rendered with more replicas (slices) or pods (hosts) than
    ``limits`` allow: the pass judges the operator's setting before rendering, and
    this guard holds whatever the caller, at most the ceiling nothing raises."""
    check_limits(spec, limits)
    head_template, conflicts = _head_template(spec, template_schema)
    groups: list[dict[str, Any]] = []
    if not spec.grouped:
        groups.append(_tpu_worker_group(spec, template_schema, "spec.worker", conflicts))
    tpu_groups = iter(spec.tpu_groups())
    for index, entry in enumerate(spec.worker_groups):
        path = f"spec.workerGroups[{index}]"
        if isinstance(entry, CpuGroupSpec):
            group, problems = cpu_worker_group(spec, entry, path, template_schema)
            conflicts += problems
            groups.append(group)
        else:  # the TPU groups come in the entries' order
            groups.append(_tpu_worker_group(next(tpu_groups), template_schema, path, conflicts))
    if conflicts:
        raise SpecError(conflicts)
    ray_spec: dict[str, Any] = {
        "rayVersion": spec.ray_version,
        "headGroupSpec": {
            "rayStartParams": dict(spec.head.ray_start_params),
            "template": head_template,
        },
        "workerGroupSpecs": groups,
    }
    if spec.autoscaled:
        _autoscaler(ray_spec, spec.scale_up_timeout_seconds)
    # Only a requested suspension is sent: leaving the field out lets another
    # owner (Kueue admits RayClusters by flipping it) keep it. Suspension of a job
    # is the RayJob's (spec.job.suspend), never its cluster's.
    if spec.suspend:
        ray_spec["suspend"] = True
    return ray_spec


def _tpu_worker_group(
    spec: SliceClusterSpec,
    schema: Mapping[str, Any] | None,
    path: str,
    conflicts: list[FieldError],
) -> dict[str, Any]:
    """The KubeRay worker group of one TPU group (``spec`` as ``tpu_groups`` gives it; at
    ``path`` for messages); its template's problems are added to ``conflicts``."""
    template, problems = _worker_template(spec, schema, path)
    conflicts += problems
    group = {
        "groupName": spec.group_name,
        "replicas": spec.slices,
        "minReplicas": spec.slices,
        "maxReplicas": spec.slices,
        "numOfHosts": spec.shape.hosts,
        "labels": ray_node_labels(spec.shape),
        "rayStartParams": dict(spec.worker.ray_start_params),
        "template": template,
    }
    if spec.elastic is not None:
        elastic = spec.elastic
        autoscaled_group(group, elastic.min_slices, elastic.max_slices)
        if elastic.idle_timeout_seconds is not None:
            group["idleTimeoutSeconds"] = elastic.idle_timeout_seconds
    return group


def autoscaled_group(group: dict[str, Any], low: int, high: int) -> None:
    """A worker group whose count KubeRay's in-tree Ray autoscaler, v2, moves between
    ``low`` and ``high`` (an elastic TPU set, a CPU group's range).

    ``replicas`` is not rendered: the count is the autoscaler's. On a new RayCluster
    KubeRay's CRD default (0) stands, which KubeRay and the autoscaler read as
    ``minReplicas`` (``max(replicas, minReplicas)``, ray-project/ray 2.60
    python/ray/autoscaler/v2/instance_manager/cloud_providers/kuberay/cloud_provider.py).
    KubeRay's ``workerGroupSpecs`` is an atomic list for server-side apply, so an apply
    onto an existing RayCluster must still carry a count: the applier adds the live one,
    guarded by the resourceVersion it read (``applier.with_live_autoscaling``), and an
    edit of the TPUSlice object, or a fixed object made elastic, keeps the count.

    ``scaleStrategy`` is rendered empty so that it exists: the autoscaler removes hosts
    with a JSON patch ``replace .../scaleStrategy`` (ray-project/ray 2.60
    python/ray/autoscaler/_private/kuberay/node_provider.py ``worker_delete_patch``),
    KubeRay's CRD gives the field no default, and a JSON-patch ``replace`` needs its
    target to exist (RFC 6902 section 4.3, "The target location MUST exist"). An empty
    ``workersToDelete`` makes a replace of the list itself succeed too. The applier
    carries a live list the autoscaler wrote, as it carries the count."""
    group.pop("replicas", None)
    group["scaleStrategy"] = {"workersToDelete": []}
    group["minReplicas"] = low
    group["maxReplicas"] = high


def _autoscaler(ray_spec: dict[str, Any], scale_up_timeout_seconds: int | None) -> None:
    """The autoscaler of every autoscaled group of the cluster (one per cluster, so one
    allocate timeout: ``SliceClusterSpec.scale_up_timeout_seconds``)."""
    ray_spec["enableInTreeAutoscaling"] = True
    options: dict[str, Any] = {"version": c.AUTOSCALER_VERSION}
    if scale_up_timeout_seconds is not None:
        options["env"] = [
            {"name": c.ENV_AUTOSCALER_ALLOCATE_TIMEOUT, "value": str(scale_up_timeout_seconds)}
        ]
    ray_spec["autoscalerOptions"] = options


def render_raycluster(
    spec: SliceClusterSpec, template_schema: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Build the RayCluster of a TPUSliceCluster; raise SpecError on override problems."""
    ray_spec = render_ray_cluster_spec(spec, template_schema)
    metadata = _metadata(spec, c.LABEL_CLUSTER)
    if spec.kueue is not None and spec.autoscaled:
        kueue_elastic(metadata, ray_spec)
    return {
        "apiVersion": c.RAY_API_VERSION,
        "kind": c.RAY_KIND_CLUSTER,
        "metadata": metadata,
        "spec": ray_spec,
    }


def kueue_elastic(metadata: dict[str, Any], ray_spec: dict[str, Any]) -> None:
    """An autoscaled RayCluster Kueue admits is one of Kueue's elastic jobs: annotated
    ``kueue.x-k8s.io/elastic-job: "true"`` and its head and every worker template gated
    ``kueue.x-k8s.io/elastic-job``. Kueue refuses an autoscaled RayCluster otherwise, and
    its webhook requires the gate on every template (kubernetes-sigs/kueue v0.17.0
    pkg/controller/jobs/raycluster/raycluster_webhook.go ``validateElasticJob``); it is
    rendered rather than left to Kueue's create-time defaulting so that our applies,
    which own the templates, keep it. Kueue removes it from a scale-up's pods once it
    admits the new workload slice (pkg/workloadslicing ``StartWorkloadSlicePods``); the
    operator claims nothing for a slice while any of its pods carries it."""
    metadata["annotations"] = {**(metadata.get("annotations") or {}), c.KUEUE_ELASTIC_JOB: "true"}
    templates = [ray_spec["headGroupSpec"]["template"]]
    templates += [group["template"] for group in ray_spec["workerGroupSpecs"]]
    for template in templates:
        pod_spec = template.setdefault("spec", {})
        gates = list(pod_spec.get("schedulingGates") or [])
        if not any(g.get("name") == c.KUEUE_ELASTIC_JOB for g in gates):
            gates.append({"name": c.KUEUE_ELASTIC_JOB})
        pod_spec["schedulingGates"] = gates


def render_rayjob(
    spec: SliceJobSpec, template_schema: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Build the RayJob of a TPUSliceJob: its pass-through fields as written, the fields
    the operator owns, and the rendered cluster as ``rayClusterSpec``.

    The RayJob's labels (``tpuslice.dev/job``) are copied by KubeRay to every RayCluster
    it makes for the job (one per attempt), which is how they are found."""
    job = spec.job
    ray_job: dict[str, Any] = dict(job.passthrough)
    if job.entrypoint:
        ray_job["entrypoint"] = job.entrypoint
    if job.runtime_env_yaml:
        ray_job["runtimeEnvYAML"] = job.runtime_env_yaml
    ray_job["submissionMode"] = job.submission_mode
    ray_job["shutdownAfterJobFinishes"] = job.shutdown_after_job_finishes
    if job.ttl_seconds_after_finished is not None:
        ray_job["ttlSecondsAfterFinished"] = job.ttl_seconds_after_finished
    if job.active_deadline_seconds is not None:
        ray_job["activeDeadlineSeconds"] = job.active_deadline_seconds
    if job.backoff_limit is not None:
        ray_job["backoffLimit"] = job.backoff_limit
    # As for a RayCluster: only a requested suspension is sent, so Kueue, which
    # admits a RayJob by flipping spec.suspend, keeps the field when we do not ask.
    if job.suspend:
        ray_job["suspend"] = True
    ray_job["rayClusterSpec"] = render_ray_cluster_spec(spec.cluster, template_schema)
    return {
        "apiVersion": c.RAY_API_VERSION,
        "kind": c.RAY_KIND_JOB,
        "metadata": _metadata(spec.cluster, c.LABEL_JOB),
        "spec": ray_job,
    }


def render_rayservice(
    spec: SliceServiceSpec, template_schema: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Build the RayService of a TPUSliceService: its pass-through fields as written,
    ``serveConfigV2``, and the rendered cluster as ``rayClusterConfig``.

    KubeRay copies the RayService's labels (``tpuslice.dev/service``) to every
    RayCluster it makes for the service (one per upgrade)."""
    ray_service: dict[str, Any] = dict(spec.serve.passthrough)
    ray_service["serveConfigV2"] = spec.serve.serve_config_v2
    ray_service["rayClusterConfig"] = render_ray_cluster_spec(spec.cluster, template_schema)
    return {
        "apiVersion": c.RAY_API_VERSION,
        "kind": c.RAY_KIND_SERVICE,
        "metadata": _metadata(spec.cluster, c.LABEL_SERVICE),
        "spec": ray_service,
    }


def render_cluster(
    obj: Mapping[str, Any], template_schema: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Validate a TPUSliceCluster dict and render its RayCluster (SpecError on bad input)."""
    return render_raycluster(parse_cluster(obj), template_schema)


def render_job(
    obj: Mapping[str, Any], template_schema: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Validate a TPUSliceJob dict and render its RayJob (SpecError on bad input)."""
    return render_rayjob(parse_job(obj), template_schema)


def render_service(
    obj: Mapping[str, Any], template_schema: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Validate a TPUSliceService dict and render its RayService (SpecError on bad input)."""
    return render_rayservice(parse_service(obj), template_schema)


#: kind -> the function that renders an object of it (``tpuslice render``).
RENDERERS = {
    c.KIND_CLUSTER: render_cluster,
    c.KIND_JOB: render_job,
    c.KIND_SERVICE: render_service,
}


def render(
    obj: Mapping[str, Any], template_schema: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Render a TPUSliceCluster, TPUSliceJob or TPUSliceService by its ``kind``."""
    renderer = RENDERERS.get(str(obj.get("kind")))
    if renderer is None:
        kinds = ", ".join(RENDERERS)
        raise SpecError([FieldError("kind", f"{obj.get('kind')!r} is not one of {kinds}")])
    return renderer(obj, template_schema)
