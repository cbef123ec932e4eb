"""Property-based tests: any JSON-like input is a field error or a RayCluster KubeRay accepts.

Spec parsing, pod-template overrides and rendering, over arbitrary input and
over mostly well-formed input with faults at every depth (strategies in
tests/support/fuzz.py). The oracle for "KubeRay accepts" is KubeRay's own CRD
schema through jsonschema (tests/support/crd.py), not the operator's own
validator, so a hole in ``tpuslice.spec.schema`` fails here.

Deterministic in CI: the ``ci`` profile derandomizes (the same examples every
run) with a bounded count, a few seconds in all. For a deeper, random search:
``HYPOTHESIS_PROFILE=deep .venv/bin/python -m pytest tests/unit/test_fuzz.py``.
"""

from __future__ import annotations

import os
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.crd import served_schema, to_jsonschema, validate
from tests.support.fuzz import BASES, base_cluster, from_schema, json_values, mutations
from tests.support.kuberay import raycluster_crd
from tpuslice.render.kuberay import render_cluster
from tpuslice.spec.parts import SpecError
from tpuslice.spec.schema import template_schema

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "deep",
    max_examples=5000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

TSC_CRD = "tpuslice.dev_tpusliceclusters.yaml"
SCHEMA = template_schema(raycluster_crd())
assert SCHEMA is not None
KUBERAY = jsonschema.Draft7Validator(to_jsonschema(served_schema(raycluster_crd(), "v1")))
SPEC_KEYS = st.sampled_from(
    [
        "metadata",
        "spec",
        "name",
        "namespace",
        "uid",
        "tpu",
        "type",
        "topology",
        "slices",
        "chipsPerHost",
        "ray",
        "version",
        "image",
        "head",
        "worker",
        "resources",
        "rayStartParams",
        "template",
        "reservation",
        "policy",
        "suspend",
    ]
)
BASE = base_cluster("llm", BASES[0], slices=2)


def judged(obj: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """Render with KubeRay's template schema. Only SpecError may escape, and each of its
    errors names a field of the input."""
    try:
        return render_cluster(obj, SCHEMA), []
    except SpecError as exc:
        assert exc.errors, "a SpecError without errors names nothing"
        for error in exc.errors:
            assert error.path.split(".")[0].split("[")[0] in ("metadata", "spec"), error
            assert error.message.strip(), error
        return None, [str(e) for e in exc.errors]


def assert_error_or_kuberay_accepts(obj: Any) -> None:
    rendered, _ = judged(obj)
    if rendered is not None:
        problems = [f"{list(e.absolute_path)}: {e.message}" for e in KUBERAY.iter_errors(rendered)]
        assert problems == [], obj


@given(json_values(SPEC_KEYS))
def test_any_json_value_is_a_field_error_or_a_valid_raycluster(obj: Any) -> None:
    if not isinstance(obj, dict):
        obj = {"spec": obj}
    assert_error_or_kuberay_accepts(obj)


@given(mutations(BASE, json_values(SPEC_KEYS)))
def test_a_valid_cluster_with_any_node_replaced(obj: Any) -> None:
    assert_error_or_kuberay_accepts(obj)


@pytest.mark.parametrize("group", ["head", "worker"])
@given(template=from_schema(SCHEMA))
def test_any_pod_template_override(group: str, template: Any) -> None:
    obj = base_cluster("llm", BASES[0])
    obj["spec"][group]["template"] = template
    assert_error_or_kuberay_accepts(obj)


@given(template=from_schema(SCHEMA))
def test_without_a_schema_only_spec_errors_escape(template: Any) -> None:
    """`tpuslice render` has no KubeRay CRD: fewer checks, but never a crash."""
    obj = base_cluster("llm", BASES[3])
    obj["spec"]["worker"]["template"] = template
    try:
        render_cluster(obj)
    except SpecError as exc:
        assert all(e.path.startswith("spec.worker.template") for e in exc.errors)


@settings(max_examples=60)
@given(mutations(BASE, json_values(SPEC_KEYS)))
def test_what_the_crd_accepts_the_operator_renders(obj: Any) -> None:
    """The CRD (schema + CEL) and spec.py judge a TPUSliceCluster alike: an object the API
    server would store never stalls on a rule the CRD already has."""
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        return
    if not isinstance(obj["metadata"].get("name"), str):
        return  # the API server names every object before the CRD's rules see it
    if validate(TSC_CRD, obj):
        return
    _, errors = judged(obj)
    assert all(e.startswith(("spec.head.template", "spec.worker.template")) for e in errors), errors


def test_the_properties_can_fail() -> None:
    """The oracle is not vacuous: a template the operator would refuse fails KubeRay's schema."""
    obj = base_cluster("llm", BASES[0])
    obj["spec"]["worker"]["template"] = {"spec": {"hostNetwork": "yes"}}
    with pytest.raises(SpecError):
        render_cluster(obj, SCHEMA)
    rendered = render_cluster(obj)  # no schema: rendered as given
    assert not KUBERAY.is_valid(rendered)
