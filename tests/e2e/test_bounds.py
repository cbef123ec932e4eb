"""The CRDs' bounds, enforced by the real API server: a field over its maxLength is
refused at create with a message naming it, before anything reaches etcd or the
operator (the unit tier judges the same schemas offline, tests/unit/test_bounds.py)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import ApiException

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import kubectl
from tests.support.builders import tpu, tpuslice
from tpusim import kube
from tpusim.operator_process import OperatorProcess
from tpuslice.model import constants as c
from tpuslice.spec import bounds

MIB = 1024 * 1024


def _create(cluster: E2ECluster, namespace: str, plural: str, body: dict[str, Any]) -> Any:
    return cluster.custom.create_namespaced_custom_object(
        "tpuslice.dev", "v1alpha1", namespace, plural, body
    )


def _refused(cluster: E2ECluster, namespace: str, plural: str, body: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as err:
        _create(cluster, namespace, plural, body)
    assert err.value.status == 422, err.value.body
    return str(err.value.body)


def test_a_megabyte_runtime_env_is_refused_by_the_api_server_naming_the_field(
    cluster: E2ECluster, namespace: str, tpuslice_crds: None, operator: OperatorProcess
) -> None:
    env = "env_vars: {BLOB: '" + "x" * MIB + "'}\n"
    job = tpuslice(
        c.KIND_JOB,
        "big-env",
        namespace=None,
        tpu=tpu(),
        job={"entrypoint": "python train.py", "runtimeEnvYAML": env},
    )
    message = _refused(cluster, namespace, "tpuslicejobs", job)
    assert "spec.job.runtimeEnvYAML" in message
    assert str(bounds.MAX_YAML_STRING) in message  # "Too long: may not be more than ..."

    # At the bound it is accepted: the bound is the CRD's, not the request limit's. And
    # the operator handles it to the end: its status written, and its finalizer done on
    # delete (kopf's own annotations never copy the spec: 256 KiB for all annotations).
    job["metadata"]["name"] = "env-at-limit"
    job["spec"]["job"]["runtimeEnvYAML"] = "a: '" + "x" * (bounds.MAX_YAML_STRING - 5) + "'"
    _create(cluster, namespace, "tpuslicejobs", job)

    def handled() -> dict[str, Any] | None:
        got: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
            "tpuslice.dev", "v1alpha1", namespace, "tpuslicejobs", "env-at-limit"
        )
        return got if (got.get("status") or {}).get("conditions") else None

    kube.wait_for(handled, timeout_s=60, what="the operator's status on env-at-limit")
    kubectl(
        cluster, "delete", "tsj", "-n", namespace, "env-at-limit", "--wait=true", "--timeout=90s"
    )


def test_a_megabyte_serve_config_is_refused_naming_the_field(
    cluster: E2ECluster, namespace: str, tpuslice_crds: None
) -> None:
    service = tpuslice(
        c.KIND_SERVICE,
        "big-serve",
        namespace=None,
        tpu=tpu(),
        serve={"serveConfigV2": "applications: []\n# " + "x" * MIB},
    )
    message = _refused(cluster, namespace, "tpusliceservices", service)
    assert "spec.serve.serveConfigV2" in message
