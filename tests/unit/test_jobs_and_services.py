"""TPUSliceJob and TPUSliceService: parsing, defaults, pass-through, and a cluster
rendered exactly as a TPUSliceCluster's with the same parts."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from tests.support.builders import tpu, tpuslice
from tpuslice.model import constants as c
from tpuslice.render.kuberay import (
    render,
    render_cluster,
    render_job,
    render_ray_cluster_spec,
    render_service,
)
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.job import parse_job
from tpuslice.spec.parts import SpecError
from tpuslice.spec.service import parse_service

HEAD: dict[str, Any] = {"resources": {"cpu": "8"}}
WORKER: dict[str, Any] = {
    "resources": {"cpu": "24", "memory": "180Gi"},
    "template": {"spec": {"serviceAccountName": "tpu"}},
}


def body(kind: str, **spec: Any) -> dict[str, Any]:
    """``ml/train`` of ``kind``: two v6e 4x4 slices with head and worker settings."""
    return tpuslice(
        kind,
        "train",
        uid="u-1",
        tpu=tpu(slices=2),
        head=copy.deepcopy(HEAD),
        worker=copy.deepcopy(WORKER),
        **spec,
    )


def job(**fields: Any) -> dict[str, Any]:
    return body(c.KIND_JOB, job={"entrypoint": "python train.py", **fields})


def service(**fields: Any) -> dict[str, Any]:
    return body(c.KIND_SERVICE, serve={"serveConfigV2": "applications: []", **fields})


def cluster() -> dict[str, Any]:
    return body(c.KIND_CLUSTER)


def errors(parse: Any, obj: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as err:
        parse(obj)
    return str(err.value)


# ------------------------------------------------------------------ parsing


def test_job_defaults() -> None:
    spec = parse_job(job())
    assert spec.job.submission_mode == "K8sJobMode"
    assert spec.job.shutdown_after_job_finishes is True  # unlike KubeRay's false
    assert spec.job.suspend is False
    assert (spec.job.backoff_limit, spec.job.ttl_seconds_after_finished) == (None, None)
    assert spec.cluster.owner_kind == c.KIND_JOB and not spec.cluster.suspend
    assert spec.cluster == dataclasses.replace(parse_cluster(cluster()), owner_kind=c.KIND_JOB)


def test_service_defaults() -> None:
    spec = parse_service(service())
    assert spec.serve.serve_config_v2 == "applications: []"
    assert spec.serve.passthrough == {}
    assert spec.cluster.owner_kind == c.KIND_SERVICE


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"entrypoint": None}, "spec.job.entrypoint: is required"),
        ({"submissionMode": "Batch"}, "spec.job.submissionMode: 'Batch' is not one of"),
        (
            {"suspend": True, "shutdownAfterJobFinishes": False},
            "spec.job.suspend: needs spec.job.shutdownAfterJobFinishes true",
        ),
        (
            {"ttlSecondsAfterFinished": 10, "shutdownAfterJobFinishes": False},
            "spec.job.ttlSecondsAfterFinished: needs spec.job.shutdownAfterJobFinishes",
        ),
        (
            {"submissionMode": "InteractiveMode", "backoffLimit": 1},
            "spec.job.backoffLimit: must be 0 with submissionMode InteractiveMode",
        ),
        (
            {"submissionMode": "SidecarMode", "submitterConfig": {"backoffLimit": 1}},
            "spec.job.submitterConfig: does not apply to submissionMode SidecarMode",
        ),
        ({"activeDeadlineSeconds": 0}, "spec.job.activeDeadlineSeconds: must be from 1"),
        ({"backoffLimit": -1}, "spec.job.backoffLimit: must be from 0"),
        ({"backoffLimit": "2"}, "spec.job.backoffLimit: must be an integer"),
        ({"runtimeEnvYAML": "pip: [a"}, "spec.job.runtimeEnvYAML: is not valid YAML"),
        ({"runtimeEnvYAML": "- a\n- b"}, "spec.job.runtimeEnvYAML: must be a YAML map"),
        ({"clusterSelector": {"ray.io/cluster": "x"}}, "spec.job.clusterSelector: is not supp"),
        ({"deletionStrategy": {}}, "spec.job.deletionStrategy: is not supported"),
        ({"managedBy": "kueue.x-k8s.io/multikueue"}, "spec.job.managedBy: is not supported"),
        ({"rayClusterSpec": {}}, "spec.job.rayClusterSpec: is rendered by the operator"),
        ({"entrypointNumCpus": "one"}, "spec.job.entrypointNumCpus: must be a number"),
        ({"submitterConfig": {"retries": 1}}, "spec.job.submitterConfig.retries: is not a field"),
        ({"preRunningDeadlineSeconds": 5}, "spec.job.preRunningDeadlineSeconds: is not a field"),
    ],
)
def test_job_errors_name_the_field_and_the_fix(fields: dict[str, Any], fragment: str) -> None:
    obj = job(**fields)
    obj["spec"]["job"] = {k: v for k, v in obj["spec"]["job"].items() if v is not None}
    assert fragment in errors(parse_job, obj)


def test_interactive_mode_needs_no_entrypoint() -> None:
    obj = job(submissionMode="InteractiveMode")
    del obj["spec"]["job"]["entrypoint"]
    assert parse_job(obj).job.entrypoint == ""


def test_sidecar_mode_needs_a_never_restarting_head() -> None:
    obj = job(submissionMode="SidecarMode")
    obj["spec"]["head"]["template"] = {"spec": {"restartPolicy": "Always"}}
    assert "spec.head.template.spec.restartPolicy: must be Never or unset" in errors(parse_job, obj)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        (
            {"upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade"}},
            "spec.serve.upgradeStrategy.type: NewClusterWithIncrementalUpgrade needs the Ray"
            " autoscaler",
        ),
        ({"upgradeStrategy": {"type": "Rolling"}}, "'Rolling' is not one of NewCluster, None"),
        (
            {"upgradeStrategy": {"clusterUpgradeOptions": {}}},
            "spec.serve.upgradeStrategy.clusterUpgradeOptions: only applies to",
        ),
        ({"rayClusterDeletionDelaySeconds": -1}, "rayClusterDeletionDelaySeconds: must be from 0"),
        ({"serviceUnhealthySecondThreshold": 60}, "is deprecated and ignored by KubeRay"),
        ({"rayClusterConfig": {}}, "spec.serve.rayClusterConfig: is rendered by the operator"),
        ({"serveConfigV2": ""}, "spec.serve.serveConfigV2: is required"),
        ({"serveConfigV2": "applications: [x"}, "spec.serve.serveConfigV2: is not valid YAML"),
        ({"excludeHeadPodFromServeSvc": "yes"}, "excludeHeadPodFromServeSvc: must be true or f"),
        ({"serveSvc": {}}, "spec.serve.serveSvc: is not a field"),
    ],
)
def test_service_errors_name_the_field_and_the_fix(fields: dict[str, Any], fragment: str) -> None:
    assert fragment in errors(parse_service, service(**fields))


def test_job_and_service_names_leave_room_for_kuberays_suffix() -> None:
    for make, parse in ((job, parse_job), (service, parse_service)):
        obj = make()
        obj["metadata"]["name"] = "a" * 47
        parse(obj)
        obj["metadata"]["name"] = "a" * 48
        assert "at most 47" in errors(parse, obj)


def test_cluster_parts_are_judged_alike_for_every_kind() -> None:
    for make, parse in ((cluster, parse_cluster), (job, parse_job), (service, parse_service)):
        obj = make()
        obj["spec"]["tpu"]["topology"] = "3x3"
        obj["spec"]["worker"]["rayStartParams"] = {"labels": "a=b"}
        text = errors(parse, obj)
        assert "spec.tpu.topology: v6e has no 3x3 slice" in text
        assert "spec.worker.rayStartParams.labels: is refused by KubeRay" in text


def test_each_kind_refuses_the_others_fields() -> None:
    assert "spec.job: is not a field" in errors(parse_cluster, {**cluster(), "spec": job()["spec"]})
    obj = job()
    obj["spec"]["suspend"] = True
    assert "spec.suspend: is not a field" in errors(parse_job, obj)
    assert "spec.job: is required" in errors(parse_job, cluster())
    assert "spec.serve: is required" in errors(parse_service, cluster())


# ---------------------------------------------------------------- rendering


def _without_owner_kind(ray_cluster_spec: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(ray_cluster_spec)
    del out["workerGroupSpecs"][0]["template"]["metadata"]["labels"][c.LABEL_OWNER_KIND]
    return out


@pytest.mark.parametrize(
    ("make", "field", "kind"),
    [(job, "rayClusterSpec", c.KIND_JOB), (service, "rayClusterConfig", c.KIND_SERVICE)],
)
def test_cluster_is_rendered_as_a_tpuslicecluster_s(make: Any, field: str, kind: str) -> None:
    rendered = render(make())
    ray_cluster_spec = rendered["spec"][field]
    assert _without_owner_kind(ray_cluster_spec) == render_cluster(cluster())["spec"]
    labels = ray_cluster_spec["workerGroupSpecs"][0]["template"]["metadata"]["labels"]
    assert labels[c.LABEL_OWNER_KIND] == kind
    assert labels[c.LABEL_CLUSTER] == "train"  # the identity webhook's objectSelector
    assert "suspend" not in ray_cluster_spec


def test_tpuslicecluster_pods_carry_no_owner_kind() -> None:
    spec = render_ray_cluster_spec(parse_cluster(cluster()))
    assert c.LABEL_OWNER_KIND not in spec["workerGroupSpecs"][0]["template"]["metadata"]["labels"]


def test_rayjob_metadata_owner_and_labels() -> None:
    metadata = render_job(job())["metadata"]
    assert metadata["labels"] == {c.LABEL_JOB: "train", c.LABEL_MANAGED_BY: c.MANAGED_BY}
    assert c.LABEL_CLUSTER not in metadata["labels"]  # KubeRay copies these to its clusters
    (owner,) = metadata["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (c.KIND_JOB, "u-1", True)


def test_rayservice_metadata_owner_and_labels() -> None:
    metadata = render_service(service())["metadata"]
    assert metadata["labels"] == {c.LABEL_SERVICE: "train", c.LABEL_MANAGED_BY: c.MANAGED_BY}
    assert metadata["ownerReferences"][0]["kind"] == c.KIND_SERVICE


def test_rayjob_fields() -> None:
    spec = render_job(
        job(
            backoffLimit=2,
            ttlSecondsAfterFinished=0,
            jobId="j-1",
            metadata={"team": "llm"},
            entrypointNumCpus=1,
            submitterConfig={"backoffLimit": 3},
        )
    )["spec"]
    assert spec["entrypoint"] == "python train.py"
    assert spec["submissionMode"] == "K8sJobMode"
    assert spec["shutdownAfterJobFinishes"] is True
    assert (spec["backoffLimit"], spec["ttlSecondsAfterFinished"]) == (2, 0)
    assert spec["jobId"] == "j-1" and spec["metadata"] == {"team": "llm"}
    assert spec["entrypointNumCpus"] == 1 and spec["submitterConfig"] == {"backoffLimit": 3}
    assert "suspend" not in spec and "activeDeadlineSeconds" not in spec
    assert render_job(job(suspend=True))["spec"]["suspend"] is True


def test_rayservice_fields() -> None:
    spec = render_service(
        service(upgradeStrategy={"type": "None"}, excludeHeadPodFromServeSvc=True)
    )["spec"]
    assert spec["serveConfigV2"] == "applications: []"
    assert spec["upgradeStrategy"] == {"type": "None"}
    assert spec["excludeHeadPodFromServeSvc"] is True


def test_render_by_kind() -> None:
    assert render(cluster())["kind"] == c.RAY_KIND_CLUSTER
    assert render(job())["kind"] == c.RAY_KIND_JOB
    assert render(service())["kind"] == c.RAY_KIND_SERVICE
    with pytest.raises(SpecError, match="'RayJob' is not one of"):
        render({**job(), "kind": "RayJob"})


def test_override_conflicts_are_reported_for_jobs_too() -> None:
    obj = job()
    obj["spec"]["worker"]["template"] = {
        "spec": {"nodeSelector": {c.NODE_LABEL_ACCELERATOR: "tpu-v5p-slice"}}
    }
    assert "is owned by the operator" in errors(render_job, obj)


def test_identity_of_a_job_pod_names_kuberays_cluster_not_the_job() -> None:
    """A RayJob's RayCluster is <job>-<random>: the webhook reads ray.io/cluster, so the
    hostnames and the MEGASCALE coordinator name the real headless Service."""
    from tests.unit.test_identity import kuberay_pod
    from tpuslice.render.identity import mutate_pod

    group = render_job(job())["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    pod = kuberay_pod(group["template"], group["numOfHosts"], 1, 2, cluster="train-x7k2p")
    env = {e["name"]: e.get("value") for e in mutate_pod(pod).pod["spec"]["containers"][0]["env"]}
    assert env[c.ENV_TPU_WORKER_ID] == "2" and env[c.ENV_TPU_NAME] == "tpu-1"
    assert env[c.ENV_TPU_WORKER_HOSTNAMES].split(",")[0] == "tpu-1-0.train-x7k2p-headless"
    assert env[c.ENV_MEGASCALE_COORDINATOR_ADDRESS].startswith("tpu-0-0.train-x7k2p-headless")
