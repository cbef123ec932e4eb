"""A TPUSliceJob's spec: the shared cluster parts and ``spec.job``, which mirrors KubeRay's
RayJob spec: the fields the operator checks and defaults are typed here, and the
others it lets through (``JOB_PASSTHROUGH``) are kept as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpuslice.model import constants
from tpuslice.spec import bounds
from tpuslice.spec.parts import (
    _JOB_SPEC_FIELDS,
    _RUNTIME_ENV_EXAMPLE,
    SUBMISSION_MODES,
    FieldError,
    GroupSpec,
    OwnedClusterSpec,
    SpecError,
    SubmissionMode,
    _boolean,
    _cluster_parts,
    _integer,
    _metadata,
    _passthrough,
    _string,
    _yaml_map,
    as_object,
    object_labels,
)
from tpuslice.spec.values import described

__all__ = [
    "JOB_PASSTHROUGH",
    "JobSettings",
    "SliceJobSpec",
    "parse_job",
]


# ------------------------------------------------------------------ TPUSliceJob

#: RayJob spec fields (KubeRay 1.5) a TPUSliceJob passes through as written, and the
#: kind of value each takes. Everything else in spec.job is owned, refused or unknown.
JOB_PASSTHROUGH: Mapping[str, str] = {
    "jobId": "string",
    "metadata": "string map",
    "entrypointResources": "string",
    "entrypointNumCpus": "number",
    "entrypointNumGpus": "number",
    "submitterPodTemplate": "object",
    "submitterConfig": "object",
}
_JOB_OWNED = frozenset(
    {
        "entrypoint",
        "runtimeEnvYAML",
        "submissionMode",
        "shutdownAfterJobFinishes",
        "ttlSecondsAfterFinished",
        "activeDeadlineSeconds",
        "backoffLimit",
        "suspend",
    }
)
#: RayJob fields a TPUSliceJob refuses, and the fix (the CRD's CEL rules say the same).
_JOB_REFUSED: Mapping[str, str] = {
    "rayClusterSpec": "is rendered by the operator from spec.tpu, ray, head and worker; move "
    "its settings there (pod template overrides go in spec.head.template and "
    "spec.worker.template)",
    "clusterSelector": "is not supported: a TPUSliceJob makes its own slices; to run a job on "
    "an existing TPUSliceCluster, write a plain RayJob with clusterSelector ray.io/cluster: "
    "<its name>",
    "deletionStrategy": "is not supported (DeleteSelf would delete the RayJob the operator "
    "keeps); use shutdownAfterJobFinishes and ttlSecondsAfterFinished, and delete the "
    "TPUSliceJob to remove everything",
    "managedBy": "is not supported: a RayJob handed to MultiKueue runs in another cluster, "
    "where this operator cannot reserve its slices; remove it",
}


@dataclass(frozen=True)
class JobSettings:
    """spec.job: what KubeRay's RayJob gets besides its cluster."""

    entrypoint: str
    runtime_env_yaml: str
    submission_mode: SubmissionMode
    shutdown_after_job_finishes: bool
    ttl_seconds_after_finished: int | None
    active_deadline_seconds: int | None
    backoff_limit: int | None
    suspend: bool
    #: JOB_PASSTHROUGH fields the user set, as written.
    passthrough: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SliceJobSpec(OwnedClusterSpec):
    """A validated TPUSliceJob: its cluster parts and its job, every default applied."""

    job: JobSettings


def _submitter_config(value: Any, path: str, errors: list[FieldError]) -> None:
    config = as_object(value, path, errors, frozenset({"backoffLimit"}))
    _integer(config.get("backoffLimit"), f"{path}.backoffLimit", errors, 0)


def _job(raw: Any, head: GroupSpec | None, errors: list[FieldError]) -> JobSettings | None:
    if raw is None:
        errors.append(FieldError("spec.job", "is required (at least spec.job.entrypoint)"))
        return None
    job = as_object(raw, "spec.job", errors)
    if not isinstance(raw, Mapping):
        return None
    mode = job.get("submissionMode", "K8sJobMode")
    if mode not in SUBMISSION_MODES:
        errors.append(
            FieldError(
                "spec.job.submissionMode",
                f"{described(mode)} is not one of {', '.join(SUBMISSION_MODES)}",
            )
        )
        mode = "K8sJobMode"
    entrypoint = _string(
        job.get("entrypoint"), "spec.job.entrypoint", errors, bounds.MAX_ENTRYPOINT
    )
    if not entrypoint and mode != "InteractiveMode" and isinstance(job.get("entrypoint", ""), str):
        errors.append(
            FieldError(
                "spec.job.entrypoint",
                "is required (the command KubeRay submits, e.g. python train.py), unless "
                "spec.job.submissionMode is InteractiveMode",
            )
        )
    runtime_env = _string(
        job.get("runtimeEnvYAML"), "spec.job.runtimeEnvYAML", errors, bounds.MAX_YAML_STRING
    )
    if runtime_env:
        _yaml_map(runtime_env, "spec.job.runtimeEnvYAML", errors, _RUNTIME_ENV_EXAMPLE)
    shutdown = _boolean(
        job.get("shutdownAfterJobFinishes"), "spec.job.shutdownAfterJobFinishes", errors, True
    )
    suspend = _boolean(job.get("suspend"), "spec.job.suspend", errors, False)
    ttl = _integer(
        job.get("ttlSecondsAfterFinished"), "spec.job.ttlSecondsAfterFinished", errors, 0
    )
    deadline = _integer(
        job.get("activeDeadlineSeconds"), "spec.job.activeDeadlineSeconds", errors, 1
    )
    backoff = _integer(job.get("backoffLimit"), "spec.job.backoffLimit", errors, 0)
    passthrough = _passthrough(job, "spec.job", _JOB_OWNED, JOB_PASSTHROUGH, _JOB_REFUSED, errors)
    if "submitterConfig" in passthrough:
        _submitter_config(passthrough["submitterConfig"], "spec.job.submitterConfig", errors)

    # KubeRay's own RayJob validation (ValidateRayJobSpec, 1.5), judged here so the
    # user's field is named instead of a RayJob that ends ValidationFailed.
    if suspend and not shutdown:
        errors.append(
            FieldError(
                "spec.job.suspend",
                "needs spec.job.shutdownAfterJobFinishes true: KubeRay suspends a job by deleting "
                "its RayCluster; remove shutdownAfterJobFinishes: false or do not suspend",
            )
        )
    if ttl and not shutdown:
        errors.append(
            FieldError(
                "spec.job.ttlSecondsAfterFinished",
                "needs spec.job.shutdownAfterJobFinishes true (it is how long KubeRay keeps the "
                "finished job's RayCluster); remove one",
            )
        )
    if mode == "InteractiveMode" and backoff:
        errors.append(
            FieldError(
                "spec.job.backoffLimit",
                "must be 0 with submissionMode InteractiveMode: KubeRay cannot retry a job it "
                "did not submit; remove backoffLimit or change the mode",
            )
        )
    if mode == "SidecarMode":
        for key in ("submitterPodTemplate", "submitterConfig"):
            if key in passthrough:
                errors.append(
                    FieldError(
                        f"spec.job.{key}",
                        "does not apply to submissionMode SidecarMode (KubeRay submits from a "
                        "container in the head pod); remove it or use K8sJobMode",
                    )
                )
        restart = ((head.template if head else {}).get("spec") or {}).get("restartPolicy")
        if restart not in (None, "", "Never"):
            errors.append(
                FieldError(
                    "spec.head.template.spec.restartPolicy",
                    f"must be Never or unset with spec.job.submissionMode SidecarMode "
                    f"(the submitter runs in the head pod), got {described(restart)}",
                )
            )
    return JobSettings(
        entrypoint=entrypoint,
        runtime_env_yaml=runtime_env,
        submission_mode=mode,
        shutdown_after_job_finishes=shutdown,
        ttl_seconds_after_finished=ttl,
        active_deadline_seconds=deadline,
        backoff_limit=backoff,
        suspend=suspend,
        passthrough=passthrough,
    )


def parse_job(obj: Mapping[str, Any]) -> SliceJobSpec:
    """Validate a TPUSliceJob dict and return its defaulted spec, or raise SpecError."""
    errors: list[FieldError] = []
    name, namespace, uid, raw = _metadata(
        obj,
        constants.KIND_JOB,
        constants.MAX_JOB_NAME_LENGTH,
        "the RayJob's RayClusters (<name>-<5 characters>), their services and hostnames",
        "the RayJob's clusters",
        errors,
    )
    spec = as_object(raw, "spec", errors, _JOB_SPEC_FIELDS)
    cluster = _cluster_parts(
        spec,
        errors,
        name=name,
        namespace=namespace,
        uid=uid,
        owner_kind=constants.KIND_JOB,
        labels=object_labels(obj),
    )
    job = _job(spec.get("job"), cluster.head if cluster else None, errors)
    if cluster is not None and cluster.kueue is not None and job is not None and job.suspend:
        errors.append(
            FieldError(
                "spec.job.suspend",
                "cannot be true for an object Kueue admits (spec.kueue or the queue-name "
                "label): Kueue owns the RayJob's suspend; stop its LocalQueue instead",
            )
        )
    if cluster is not None and cluster.kueue is not None and cluster.elastic is not None:
        errors.append(
            FieldError(
                "spec.kueue",
                "cannot be combined with spec.elastic on a TPUSliceJob: Kueue's elastic jobs "
                "gate a scale-up's pods through the RayCluster's webhook, and the RayJob's "
                "(kubernetes-sigs/kueue v0.17.0 pkg/controller/jobs/rayjob/rayjob_webhook.go) "
                "gates none, so a scale-up would run before Kueue admits it; use a "
                "TPUSliceCluster, or remove one of them",
            )
        )
    if errors or cluster is None or job is None:
        raise SpecError(errors)
    return SliceJobSpec(cluster=cluster, job=job)
