"""Golden-file and rule tests of the rendering: TPUSliceCluster -> RayCluster,
TPUSliceJob -> RayJob, TPUSliceService -> RayService.

Regenerate the golden files after an intended change with
``UPDATE_GOLDEN=1 make test-unit`` and review the diff.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support.crd import served_schema, to_jsonschema
from tests.support.kuberay import kuberay_crd, raycluster_crd
from tpuslice.model import constants as c
from tpuslice.model.topology import GENERATIONS, slice_shape
from tpuslice.render.kuberay import render, render_cluster
from tpuslice.spec.parts import SpecError

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p.name.removesuffix(".in.yaml") for p in GOLDEN.glob("*.in.yaml"))
#: The examples that render (a TPUSlicePolicy is cluster policy, not a workload).
EXAMPLES = sorted(
    p
    for p in (Path(__file__).parents[2] / "examples").glob("*.yaml")
    if "kind: TPUSlicePolicy" not in p.read_text()
)


def _load(name: str) -> dict[str, Any]:
    return yaml.safe_load((GOLDEN / f"{name}.in.yaml").read_text())


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str) -> None:
    rendered = yaml.safe_dump(render(_load(case)), sort_keys=False)
    golden = GOLDEN / f"{case}.out.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert rendered == golden.read_text()


def _categories(body: dict[str, Any]) -> set[str]:
    """What a golden input exercises: its kind, TPU generation, host and slice layout,
    and the optional spec parts that change the rendering."""
    spec = body["spec"]
    groups = spec.get("workerGroups", [])
    tpu = spec["tpu"] if not groups else next(g["tpu"] for g in groups if "tpu" in g)
    shape = slice_shape(tpu["type"], tpu["topology"], tpu.get("chipsPerHost"))
    found = {body["kind"], shape.generation.name}
    found.add("multi-host" if shape.multi_host else "single-host")
    if tpu.get("slices", 1) > 1:
        found.add("multi-slice")
    if any("template" in spec.get(group, {}) for group in ("head", "worker")):
        found.add("pod template overrides")
    if spec.get("reservation", {}).get("policy") == "None":
        found.add("reservation policy None")
    if "elastic" in spec:
        found.add("elastic")
    if groups:
        found.add("several worker groups")
        found |= {"cpu group" for g in groups if "cpu" in g}
    return found


def test_golden_cases_cover_the_issue_list() -> None:
    """Every kind and TPU generation, single- and multi-host, multi-slice, template
    overrides, the ungated policy and an elastic range each have a golden case."""
    wanted = {c.KIND_CLUSTER, c.KIND_JOB, c.KIND_SERVICE, *(g.name for g in GENERATIONS)}
    wanted |= {"single-host", "multi-host", "multi-slice"}
    wanted |= {"pod template overrides", "reservation policy None", "elastic"}
    wanted |= {"several worker groups", "cpu group"}
    covered = set().union(*(_categories(_load(case)) for case in CASES))
    assert wanted - covered == set()


@pytest.fixture(scope="module")
def kuberay_validator() -> jsonschema.Draft7Validator:
    schema = served_schema(raycluster_crd(), "v1")
    return jsonschema.Draft7Validator(to_jsonschema(schema, strict=True))


SOURCES = [*(GOLDEN / f"{c}.in.yaml" for c in CASES), *EXAMPLES]
PLURAL = {
    c.RAY_KIND_CLUSTER: c.RAY_PLURAL_CLUSTER,
    c.RAY_KIND_JOB: c.RAY_PLURAL_JOB,
    c.RAY_KIND_SERVICE: c.RAY_PLURAL_SERVICE,
}


@pytest.fixture(scope="module")
def kuberay_validators() -> dict[str, jsonschema.Draft7Validator]:
    """Strict validators of KubeRay's own CRDs, by kind (unknown fields refused)."""
    return {
        kind: jsonschema.Draft7Validator(
            to_jsonschema(served_schema(kuberay_crd(plural), "v1"), strict=True)
        )
        for kind, plural in PLURAL.items()
    }


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_rendered_object_matches_kuberays_crd(
    source: Path, kuberay_validators: dict[str, jsonschema.Draft7Validator]
) -> None:
    rendered = render(yaml.safe_load(source.read_text()))
    validator = kuberay_validators[rendered["kind"]]
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(rendered)]
    assert errors == []


def test_every_kind_is_covered_by_golden_files() -> None:
    kinds = {_load(case)["kind"] for case in CASES}
    assert kinds == {c.KIND_CLUSTER, c.KIND_JOB, c.KIND_SERVICE}


def test_kuberay_validator_is_not_vacuous(kuberay_validator: jsonschema.Draft7Validator) -> None:
    rendered = render_cluster(_load("v4-2x2x2"))
    rendered["spec"]["workerGroupSpecs"][0]["numOfHostz"] = 2
    assert not kuberay_validator.is_valid(rendered)


def _worker(rendered: dict[str, Any]) -> dict[str, Any]:
    return rendered["spec"]["workerGroupSpecs"][0]  # type: ignore[no-any-return]


def test_worker_group_fixes_replicas_and_hosts_from_the_topology() -> None:
    group = _worker(render_cluster(_load("v5e-4x4-two-slices")))
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (2, 2, 2)
    assert group["numOfHosts"] == 4
    pod = group["template"]["spec"]
    assert pod["nodeSelector"] == {
        c.NODE_LABEL_ACCELERATOR: "tpu-v5-lite-podslice",
        c.NODE_LABEL_TOPOLOGY: "4x4",
    }
    (container,) = pod["containers"]
    assert container["resources"]["requests"][c.TPU_RESOURCE] == "4"
    assert container["resources"]["limits"][c.TPU_RESOURCE] == "4"
    assert pod["schedulingGates"] == [{"name": c.SCHEDULING_GATE}]


def test_head_never_gets_tpu_settings() -> None:
    head = render_cluster(_load("v6e-16x16"))["spec"]["headGroupSpec"]["template"]
    text = yaml.safe_dump(head)
    assert "google.com/tpu" not in text and "gke-tpu" not in text
    assert "schedulingGates" not in head["spec"]


def test_policy_none_renders_no_gate_and_suspend_only_when_asked() -> None:
    rendered = render_cluster(_load("v6e-policy-none"))
    assert "schedulingGates" not in _worker(rendered)["template"]["spec"]
    assert rendered["spec"]["suspend"] is True
    assert "suspend" not in render_cluster(_load("v4-2x2x2"))["spec"]


def test_owner_reference_is_controller_and_blocks_deletion() -> None:
    (owner,) = render_cluster(_load("v4-2x2x2"))["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "TPUSliceCluster",
        "name": "v4-small",
        "uid": "11111111-1111-1111-1111-111111111111",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_without_uid_no_owner_reference_and_no_namespace() -> None:
    obj = _load("v4-2x2x2")
    del obj["metadata"]["uid"], obj["metadata"]["namespace"]
    metadata = render_cluster(obj)["metadata"]
    assert "ownerReferences" not in metadata and "namespace" not in metadata


def test_overrides_merge_by_documented_rules() -> None:
    rendered = render_cluster(_load("v6e-overrides"))
    pod = _worker(rendered)["template"]["spec"]
    assert pod["serviceAccountName"] == "ray-tpu"
    assert pod["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    # the equal TPU toleration is kept once; the spot one is appended
    assert [t["key"] for t in pod["tolerations"]] == ["google.com/tpu", "cloud.google.com/gke-spot"]
    # containers merge by name; TPU chips repeated with the same value are accepted
    (worker,) = pod["containers"]
    assert worker["resources"]["limits"] == {
        "cpu": "24",
        "memory": "180Gi",
        "google.com/tpu": "4",
        "example.com/foo": "1",
    }
    assert pod["schedulingGates"] == [
        {"name": c.SCHEDULING_GATE},
        {"name": "example.com/other-gate"},
    ]
    assert "podAntiAffinity" in pod["affinity"]
    head = rendered["spec"]["headGroupSpec"]["template"]["spec"]
    assert [x["name"] for x in head["containers"]] == ["ray-head", "sidecar"]
    assert head["containers"][0]["resources"]["limits"] == {"cpu": "4", "memory": "8Gi"}


@pytest.mark.parametrize(
    ("path", "value", "fragment"),
    [
        (
            ["spec", "nodeSelector"],
            {c.NODE_LABEL_ACCELERATOR: "tpu-v5p-slice"},
            'spec.worker.template.spec.nodeSelector["cloud.google.com/gke-tpu-accelerator"]: is '
            "owned by the operator (from spec.tpu.type: 'tpu-v6e-slice')",
        ),
        (
            ["spec", "nodeSelector"],
            {c.NODE_LABEL_TOPOLOGY: "4x4"},
            'nodeSelector["cloud.google.com/gke-tpu-topology"]',
        ),
        (
            ["spec", "nodeSelector"],
            {c.NODE_LABEL_NODEPOOL: "pool-a"},
            "set per slice to the reserved node pool; use reservation.policy None",
        ),
        (
            ["spec", "containers"],
            [{"name": "ray-worker", "resources": {"requests": {"google.com/tpu": "8"}}}],
            "spec.worker.template.spec.containers[name=ray-worker].resources.requests"
            '["google.com/tpu"]',
        ),
        (
            ["metadata", "labels"],
            {c.LABEL_TOPOLOGY: "8x8"},
            'spec.worker.template.metadata.labels["tpuslice.dev/topology"]',
        ),
    ],
)
def test_override_of_an_owned_field_is_an_error(path: list[str], value: Any, fragment: str) -> None:
    obj = copy.deepcopy(_load("v6e-2x2-single-host"))
    target = obj["spec"].setdefault("worker", {}).setdefault("template", {})
    for step in path[:-1]:
        target = target.setdefault(step, {})
    target[path[-1]] = value
    with pytest.raises(SpecError) as err:
        render_cluster(obj)
    assert fragment in str(err.value)


def test_policy_none_lets_the_user_pin_a_pool() -> None:
    obj = _load("v6e-policy-none")
    obj["spec"]["worker"] = {"template": {"spec": {"nodeSelector": {c.NODE_LABEL_NODEPOOL: "p"}}}}
    assert (
        _worker(render_cluster(obj))["template"]["spec"]["nodeSelector"][c.NODE_LABEL_NODEPOOL]
        == "p"
    )


def test_render_does_not_mutate_its_input() -> None:
    obj = _load("v6e-overrides")
    before = copy.deepcopy(obj)
    render_cluster(obj)
    assert obj == before


@pytest.mark.parametrize(
    ("grace", "drain"), [(30, "25"), (120, "115"), (6, "3"), (1, "0"), (0, "0")]
)
def test_grace_period_renders_termination_grace_and_rays_drain_deadline(
    grace: int, drain: str
) -> None:
    body = _load("v6e-2x2-single-host")
    body["spec"]["disruption"] = {"gracePeriodSeconds": grace}
    pod = _worker(render_cluster(body))["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == grace
    (container,) = pod["containers"]
    assert {"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": drain} in container["env"]
    head = render_cluster(body)["spec"]["headGroupSpec"]["template"]["spec"]
    assert "terminationGracePeriodSeconds" not in head


def test_a_template_grace_period_that_disagrees_is_refused_naming_the_field() -> None:
    body = _load("v6e-2x2-single-host")
    body["spec"]["worker"] = {"template": {"spec": {"terminationGracePeriodSeconds": 5}}}
    with pytest.raises(SpecError, match=r"spec\.disruption\.gracePeriodSeconds"):
        render_cluster(body)
