"""Pod-template overrides: every bad override is a SpecError naming the user's field.

Without a schema (``tpuslice render`` on a laptop) the checks the merge itself
needs are made; with KubeRay's template schema (what the operator reads from
the cluster) every field is judged as the API server would, stricter where it
would silently drop something.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest

from tests.support.builders import tpuslice
from tests.support.crd import served_schema, to_jsonschema
from tests.support.kuberay import raycluster_crd
from tpuslice.render.kuberay import render_cluster
from tpuslice.spec.parts import SpecError
from tpuslice.spec.schema import compact, schema_errors, template_schema


def cluster(group: str = "worker", template: Any = None) -> dict[str, Any]:
    extra = {group: {"template": template}} if template is not None else {}
    return tpuslice(uid="u", **extra)


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    found = template_schema(raycluster_crd())
    assert found is not None and "spec" in found["properties"]
    return found


@pytest.fixture(scope="module")
def kuberay() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(to_jsonschema(served_schema(raycluster_crd(), "v1")))


def errors(template: Any, schema: dict[str, Any] | None, group: str = "worker") -> list[str]:
    with pytest.raises(SpecError) as err:
        render_cluster(cluster(group, template), schema)
    return [str(e) for e in err.value.errors]


# A named-list item whose name is a map or a list must be a field error, not a
# "TypeError: unhashable type" in the merge on every pass with no status.
@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (
            {"spec": {"containers": [{"name": {"a": "b"}}]}},
            "spec.worker.template.spec.containers[0].name: must be a string, got an object",
        ),
        (
            {"spec": {"schedulingGates": [{"name": ["x"]}]}},
            "spec.worker.template.spec.schedulingGates[0].name: must be a string, got a list",
        ),
        (
            {"spec": {"containers": [{"name": "ray-worker", "env": [{"name": {"k": 1}}]}]}},
            "spec.worker.template.spec.containers[0].env[0].name: must be a string, got an object",
        ),
        (
            {"spec": {"volumes": ["data"]}},
            "spec.worker.template.spec.volumes[0]: must be an object, got the string 'data'",
        ),
        (
            {"spec": {"containers": [{"image": "sidecar:1"}]}},
            "spec.worker.template.spec.containers[0].name: is required "
            "(items of containers merge by name)",
        ),
        (
            {"spec": {"initContainers": [{"name": "a"}, {"name": "a"}]}},
            "spec.worker.template.spec.initContainers[1].name: 'a' is given twice; "
            "names are unique",
        ),
    ],
)
def test_named_list_items_need_string_unique_names(template: Any, expected: str) -> None:
    assert errors(template, None) == [expected]


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (
            {"spec": {"nodeSelector": None}},
            "spec.worker.template.spec.nodeSelector: must be an object (the operator renders "
            "one), got null",
        ),
        (
            {"spec": {"containers": "ray-worker"}},
            "spec.worker.template.spec.containers: must be a list (the operator renders one), "
            "got the string 'ray-worker'",
        ),
        (
            {"metadata": []},
            "spec.worker.template.metadata: must be an object (the operator renders one), "
            "got a list",
        ),
        (
            {"spec": {"containers": [{"name": "ray-worker", "resources": "big"}]}},
            "spec.worker.template.spec.containers[0].resources: must be an object (the operator "
            "renders one), got the string 'big'",
        ),
    ],
)
def test_a_map_or_list_the_operator_renders_cannot_be_replaced_by_a_scalar(
    template: Any, expected: str
) -> None:
    """A null nodeSelector must not drop the TPU selectors silently."""
    assert errors(template, None) == [expected]


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        # Unchecked, server-side apply answers 500 for both.
        (
            {"spec": {"hostNetwork": "yes"}},
            "spec.worker.template.spec.hostNetwork: must be true or false, got the string 'yes'",
        ),
        (
            {"spec": {"containers": [{"name": "side", "image": "i", "resources": "1"}]}},
            "spec.worker.template.spec.containers[0].resources: must be an object, "
            "got the string '1'",
        ),
        (
            {"spec": {"nodeSelecter": {"a": "b"}}},
            "spec.worker.template.spec.nodeSelecter: is not a field here; did you mean "
            "nodeSelector?",
        ),
        (
            {
                "spec": {
                    "containers": [{"name": "ray-worker", "resources": {"limits": {"cpu": "x"}}}]
                }
            },
            "spec.worker.template.spec.containers[0].resources.limits.cpu: 'x' is not a "
            "quantity (e.g. 8, 500m, 32Gi)",
        ),
        (
            {"spec": {"priority": 2**40}},
            "spec.worker.template.spec.priority: 1099511627776 does not fit in int32",
        ),
        (
            {"metadata": {"labels": {"team": 5}}},
            "spec.worker.template.metadata.labels.team: must be a string, got the number 5",
        ),
        (
            {"spec": {"affinity": None}},
            "spec.worker.template.spec.affinity: must not be null; remove the key to leave it "
            "unset",
        ),
        (
            {
                "spec": {
                    "containers": [
                        {
                            "name": "side",
                            "image": "i",
                            "ports": [{"containerPort": 80}, {"containerPort": 80}],
                        }
                    ]
                }
            },
            "spec.worker.template.spec.containers[0].ports: has two items with "
            "containerPort=80, protocol=TCP; each must be unique",
        ),
    ],
)
def test_with_kuberays_schema_every_field_is_judged(
    template: Any, expected: str, schema: dict[str, Any]
) -> None:
    assert errors(template, schema) == [expected]


def test_head_template_is_judged_too(schema: dict[str, Any]) -> None:
    assert errors({"spec": {"hostPID": 1}}, schema, group="head") == [
        "spec.head.template.spec.hostPID: must be true or false, got the number 1"
    ]


def test_a_good_override_renders_and_kuberay_accepts_it(
    schema: dict[str, Any], kuberay: jsonschema.Draft7Validator
) -> None:
    template = {
        "metadata": {"labels": {"team": "research"}, "annotations": {"a/b": "c"}},
        "spec": {
            "serviceAccountName": "ray",
            "priorityClassName": "high",
            "tolerations": [{"key": "spot", "operator": "Exists"}],
            "containers": [
                {
                    "name": "ray-worker",
                    "env": [{"name": "A", "value": "1"}],
                    "resources": {"limits": {"memory": "64Gi"}},
                },
                {"name": "side", "image": "busybox", "ports": [{"containerPort": 80}]},
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }
    rendered = render_cluster(cluster("worker", template), schema)
    assert list(kuberay.iter_errors(rendered)) == []
    containers = rendered["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["ray-worker", "side"]


def test_errors_are_bounded(schema: dict[str, Any]) -> None:
    template = {"spec": {f"field{i}": i for i in range(50)}}
    assert len(errors(template, schema)) == 10


def test_compact_keeps_what_validation_reads() -> None:
    full = {
        "type": "object",
        "description": "long text",
        "properties": {"a": {"type": "string", "description": "x", "pattern": "^a"}},
        "required": ["a"],
    }
    assert compact(full) == {
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": "^a"}},
        "required": ["a"],
    }
    before = copy.deepcopy(full)
    assert schema_errors(compact(full), {"a": "b"}, partial=False) == [
        (("a",), "'b' does not match ^a")
    ]
    assert full == before


def test_a_crd_without_the_template_path_gives_no_schema() -> None:
    assert template_schema({"spec": {"versions": [{"name": "v1"}]}}) is None
    assert template_schema({}) is None
