"""Every input has a bound: the CRD schemas bound every free-form string, list and map
(a walker fails on a new field added without one), the parse step enforces the same
numbers and bounds the free-form templates by size, the slices and hosts of one object
are capped by an operator setting, render never exceeds the limits, and YAML strings
are parsed with libyaml, once per distinct string."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.builders import tpu, tpuslice
from tests.support.crd import load_crd, validate
from tests.support.fake_kube import FakeKube
from tpuslice.controller.actuator import SpecCache
from tpuslice.controller.job import JobKind
from tpuslice.controller.reconciler import Reconciler
from tpuslice.main.cli import build_parser
from tpuslice.model import constants as c
from tpuslice.model.records import Snapshot
from tpuslice.render.kuberay import render_ray_cluster_spec
from tpuslice.spec import bounds, yamlcheck
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.job import parse_job
from tpuslice.spec.limits import RAISE_HOSTS, RAISE_SLICES, limit_errors
from tpuslice.spec.parts import SpecError
from tpuslice.spec.service import parse_service

TSC = "tpuslice.dev_tpusliceclusters.yaml"
TSJ = "tpuslice.dev_tpuslicejobs.yaml"
TSS = "tpuslice.dev_tpusliceservices.yaml"
KINDS = {TSC: c.KIND_CLUSTER, TSJ: c.KIND_JOB, TSS: c.KIND_SERVICE}


# ------------------------------------------------------------- the schema walker


def _spec_schema(crd_file: str) -> dict[str, Any]:
    schema = load_crd(crd_file)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]  # type: ignore[no-any-return]


def unbounded(
    schema: dict[str, Any], path: str, rules: tuple[tuple[str, str], ...] = ()
) -> Iterator[str]:
    """Every node under ``schema`` a user can make arbitrarily large: a string without
    maxLength (or enum), a list without maxItems, a map without maxProperties, a
    free-form object the parse step does not cap (``bounds.TEMPLATE_BYTES``) unless a
    CEL rule above it refuses it outright (``!has(self.<field>)``: the API server
    answers with the rule's message, whatever the size). ``rules``: (rule, path of the
    node it is on) of every ancestor."""
    rules += tuple((r["rule"], path) for r in schema.get("x-kubernetes-validations") or [])
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        refused = any(f"!has(self{path[len(at) :]})" in rule for rule, at in rules if at != path)
        if path not in bounds.TEMPLATE_BYTES and not refused:
            yield f"{path}: free-form object with no size cap in bounds.TEMPLATE_BYTES"
        return
    kind = schema.get("type")
    is_string = kind == "string" or schema.get("x-kubernetes-int-or-string")
    if is_string and "enum" not in schema and "maxLength" not in schema:
        yield f"{path}: string without maxLength"
    if kind == "array":
        if "maxItems" not in schema:
            yield f"{path}: list without maxItems"
        yield from unbounded(schema["items"], f"{path}[]", rules)
    if isinstance(schema.get("additionalProperties"), dict):
        if "maxProperties" not in schema:
            yield f"{path}: map without maxProperties"
        yield from unbounded(schema["additionalProperties"], f"{path}.*", rules)
    for key, sub in (schema.get("properties") or {}).items():
        yield from unbounded(sub, f"{path}.{key}", rules)


@pytest.mark.parametrize("crd_file", [TSC, TSJ, TSS])
def test_every_free_form_field_of_the_spec_is_bounded(crd_file: str) -> None:
    assert list(unbounded(_spec_schema(crd_file), "spec")) == []


def test_the_walker_finds_each_kind_of_unbounded_field() -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "mode": {"type": "string", "enum": ["A", "B"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "blob": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "gone": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
        "x-kubernetes-validations": [{"rule": "!has(self.gone)"}],
    }
    assert sorted(unbounded(schema, "spec")) == [
        "spec.blob: free-form object with no size cap in bounds.TEMPLATE_BYTES",
        "spec.labels.*: string without maxLength",
        "spec.labels: map without maxProperties",
        "spec.name: string without maxLength",
        "spec.tags: list without maxItems",
    ]


def test_every_capped_template_is_a_free_form_field_of_some_kind() -> None:
    """A cap for a field no CRD has (renamed, removed) is a stale bound."""
    found = set()
    for crd_file in (TSC, TSJ, TSS):
        node = _spec_schema(crd_file)
        for path in bounds.TEMPLATE_BYTES:
            sub: Any = node
            for step in path.split(".")[1:]:
                sub = (sub.get("properties") or {}).get(step.removesuffix("[]"), {})
                if step.endswith("[]"):
                    sub = sub.get("items", {})
            if sub.get("x-kubernetes-preserve-unknown-fields"):
                found.add(path)
    assert found == set(bounds.TEMPLATE_BYTES)


def _node(crd_file: str, path: str) -> dict[str, Any]:
    node: Any = _spec_schema(crd_file)
    for step in path.split(".")[1:]:
        node = node["properties"][step]
    return node  # type: ignore[no-any-return]


@pytest.mark.parametrize(("path", "limit"), sorted(bounds.STRING_BOUNDS.items()))
def test_the_crd_and_the_parse_step_bound_each_string_alike(path: str, limit: int) -> None:
    crd_file = TSJ if path.startswith("spec.job") else TSS
    assert _node(crd_file, path)["maxLength"] == limit


@pytest.mark.parametrize(
    ("crd_file", "path", "entries", "value"),
    [
        (TSC, "spec.head.resources", bounds.MAX_RESOURCES, bounds.MAX_QUANTITY),
        (TSC, "spec.worker.resources", bounds.MAX_RESOURCES, bounds.MAX_QUANTITY),
        (TSC, "spec.head.rayStartParams", bounds.MAX_START_PARAMS, bounds.MAX_MAP_VALUE),
        (TSC, "spec.worker.rayStartParams", bounds.MAX_START_PARAMS, bounds.MAX_MAP_VALUE),
        (TSJ, "spec.job.metadata", bounds.MAX_START_PARAMS, bounds.MAX_MAP_VALUE),
    ],
)
def test_the_crd_and_the_parse_step_bound_each_map_alike(
    crd_file: str, path: str, entries: int, value: int
) -> None:
    node = _node(crd_file, path)
    assert (node["maxProperties"], node["additionalProperties"]["maxLength"]) == (entries, value)


def test_the_largest_object_the_bounds_allow_fits_the_request_limit() -> None:
    """etcd's default request limit, 1.5 MiB, with room for the rendered copy's own fields."""
    job = (
        bounds.MAX_YAML_STRING
        + bounds.MAX_ENTRYPOINT
        + bounds.TEMPLATE_BYTES["spec.head.template"]
        + bounds.TEMPLATE_BYTES["spec.worker.template"]
        + bounds.TEMPLATE_BYTES["spec.job.submitterPodTemplate"]
    )
    service = (
        bounds.MAX_YAML_STRING
        + bounds.TEMPLATE_BYTES["spec.head.template"]
        + bounds.TEMPLATE_BYTES["spec.worker.template"]
        + bounds.TEMPLATE_BYTES["spec.serve.serveService"]
    )
    assert max(job, service) < 1024 * 1024 < 1_572_864


def test_the_api_server_refuses_a_megabyte_runtime_env_naming_the_field() -> None:
    obj = tpuslice(c.KIND_JOB, "train", job={"entrypoint": "python t.py"})
    obj["spec"]["job"]["runtimeEnvYAML"] = "a: " + "x" * (1024 * 1024)
    messages = validate(TSJ, obj)
    assert any(m.startswith("spec.job.runtimeEnvYAML:") and "is too long" in m for m in messages)


# ------------------------------------------------------------------ the parse step


def _job(**job: Any) -> dict[str, Any]:
    return tpuslice(c.KIND_JOB, "train", job={"entrypoint": "python t.py", **job})


def _error(parse: Any, obj: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as err:
        parse(obj)
    return str(err.value)


@pytest.mark.parametrize(
    ("field", "limit"),
    [
        ("entrypoint", bounds.MAX_ENTRYPOINT),
        ("runtimeEnvYAML", bounds.MAX_YAML_STRING),
        ("jobId", bounds.MAX_SHORT_STRING),
        ("entrypointResources", bounds.MAX_MAP_VALUE),
    ],
)
def test_a_job_string_over_its_bound_is_refused_naming_field_and_limit(
    field: str, limit: int
) -> None:
    at_limit = "a: " + "x" * (limit - 3)
    assert parse_job(_job(**{field: at_limit}))
    message = _error(parse_job, _job(**{field: at_limit + "x"}))
    assert f"spec.job.{field}: has {limit + 1} characters; at most {limit}" in message


def test_a_serve_config_over_its_bound_is_refused_naming_field_and_limit() -> None:
    limit = bounds.MAX_YAML_STRING
    obj = tpuslice(c.KIND_SERVICE, "serve", serve={"serveConfigV2": "a: " + "x" * limit})
    message = _error(parse_service, obj)
    assert f"spec.serve.serveConfigV2: has {limit + 3} characters; at most {limit}" in message


def _big_template(size: int) -> dict[str, Any]:
    """A template of ``size`` + 40 bytes as JSON: {"metadata":{"annotations":{"note":""}}}."""
    return {"metadata": {"annotations": {"note": "x" * size}}}


@pytest.mark.parametrize("group", ["head", "worker"])
def test_a_pod_template_over_its_size_is_refused_naming_field_and_limit(group: str) -> None:
    limit = bounds.TEMPLATE_BYTES[f"spec.{group}.template"]
    assert parse_cluster(tpuslice(**{group: {"template": _big_template(limit - 100)}}))
    message = _error(parse_cluster, tpuslice(**{group: {"template": _big_template(limit)}}))
    assert f"spec.{group}.template: is {limit + 40} bytes as JSON; at most {limit}" in message


def test_pass_through_objects_over_their_size_are_refused() -> None:
    job = _job(
        submitterPodTemplate=_big_template(bounds.TEMPLATE_BYTES["spec.job.submitterPodTemplate"])
    )
    assert "spec.job.submitterPodTemplate: is " in _error(parse_job, job)
    service = tpuslice(
        c.KIND_SERVICE,
        "serve",
        serve={"serveConfigV2": "a: 1", "serveService": _big_template(32 * 1024)},
    )
    assert "spec.serve.serveService: is " in _error(parse_service, service)


def test_maps_over_their_size_are_refused_naming_the_field() -> None:
    params = {f"opt-{i}": "1" for i in range(bounds.MAX_START_PARAMS + 1)}
    message = _error(parse_cluster, tpuslice(worker={"rayStartParams": params}))
    assert f"spec.worker.rayStartParams: has {bounds.MAX_START_PARAMS + 1} entries" in message
    long_value = {"resources": '{"x": "' + "y" * bounds.MAX_MAP_VALUE + '"}'}
    message = _error(parse_cluster, tpuslice(head={"rayStartParams": long_value}))
    assert "spec.head.rayStartParams.resources: has" in message
    message = _error(parse_cluster, tpuslice(head={"resources": {"cpu": "1" * 65}}))
    assert "spec.head.resources.cpu: has 65 characters; at most 64" in message


# ------------------------------------------------------------- slices and hosts


def _cluster(type_: str = "v6e", topology: str = "4x4", slices: int = 1) -> Any:
    return parse_cluster(tpuslice(tpu=tpu(type_, topology, slices=slices)))


def test_slices_over_the_setting_name_the_field_the_limit_and_the_setting() -> None:
    (error,) = limit_errors(_cluster(slices=65), bounds.SpecLimits())
    assert error.path == "spec.tpu.slices"
    assert "65 is more than the 64 slices" in error.message
    assert RAISE_SLICES in error.message
    assert limit_errors(_cluster(slices=64), bounds.SpecLimits()) == []


def test_hosts_over_the_setting_name_the_field_the_limit_and_the_setting() -> None:
    """Two of the largest v5p slices fit the default, three do not."""
    assert limit_errors(_cluster("v5p", "16x16x24", 2), bounds.SpecLimits()) == []
    (error,) = limit_errors(_cluster("v5p", "16x16x24", 3), bounds.SpecLimits())
    assert error.path == "spec.tpu.slices"
    assert "are 4608 hosts" in error.message and "more than the 4096" in error.message
    assert RAISE_HOSTS in error.message


def test_every_single_slice_shape_fits_the_default_hosts() -> None:
    assert limit_errors(_cluster("v5p", "16x16x24", 1), bounds.SpecLimits()) == []


def test_at_the_ceiling_no_setting_is_offered() -> None:
    (error,) = limit_errors(_cluster(slices=4096), bounds.SpecLimits(4095, 65_000))
    assert RAISE_SLICES in error.message
    spec = dataclasses.replace(_cluster(), slices=bounds.CEILING.max_slices + 1)
    (error,) = limit_errors(spec, bounds.CEILING)
    assert "--max-slices" not in error.message


@pytest.mark.parametrize(("slices", "hosts"), [(0, 10), (4097, 10), (1, 0), (1, 65_001)])
def test_settings_outside_their_range_are_refused(slices: int, hosts: int) -> None:
    with pytest.raises(ValueError, match="per object must be from 1 to"):
        bounds.SpecLimits(slices, hosts)


def test_the_pass_ends_invalid_spec_over_the_setting_and_applies_nothing() -> None:
    body = tpuslice(
        c.KIND_JOB,
        "train",
        uid="uid-train",
        generation=1,
        tpu=tpu(slices=3),
        job={"entrypoint": "python t.py"},
    )
    kube = FakeKube()
    reconciler = Reconciler(
        kube,
        lambda key: Snapshot(body, [], [], [], None),
        adapter=JobKind(),
        limits=bounds.SpecLimits(max_slices=2),
    )
    asyncio.run(reconciler.kick(("ml", "train")))
    stalled = next(x for x in kube.status["conditions"] if x["type"] == "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "InvalidSpec")
    assert "spec.tpu.slices: 3 is more than the 2 slices" in stalled["message"]
    assert "--max-slices-per-object" in stalled["message"]
    assert not [call for call in kube.calls if call[0] == "apply"]


def test_render_never_renders_more_than_the_limits() -> None:
    with pytest.raises(SpecError, match=r"spec\.tpu\.slices: 3 is more than the 2"):
        render_ray_cluster_spec(_cluster(slices=3), limits=bounds.SpecLimits(2, 100))
    with pytest.raises(SpecError, match="are 12 hosts"):
        render_ray_cluster_spec(_cluster(slices=3), limits=bounds.SpecLimits(3, 8))
    over_ceiling = dataclasses.replace(_cluster("v5p", "16x16x24"), slices=43)  # 66048 hosts
    with pytest.raises(SpecError, match="66048 hosts"):
        render_ray_cluster_spec(over_ceiling)
    group = render_ray_cluster_spec(_cluster(slices=2), limits=bounds.SpecLimits(2, 8))
    assert group["workerGroupSpecs"][0]["replicas"] == 2


def test_the_settings_are_flags_of_run_with_checked_ranges(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(["run"])
    assert (args.max_slices_per_object, args.max_hosts_per_object) == (64, 4096)
    args = build_parser().parse_args(["run", "--max-slices-per-object", "128"])
    assert args.max_slices_per_object == 128
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--max-hosts-per-object", "70000"])
    assert "must be from 1 to 65000, got 70000" in capsys.readouterr().err


# ------------------------------------------------------------------- YAML parsing


def test_yaml_is_parsed_with_libyaml_when_pyyaml_has_it() -> None:
    assert yaml.__with_libyaml__, "the lock file's PyYAML wheel is built with libyaml"
    assert yamlcheck.LOADER is yaml.CSafeLoader


def test_a_yaml_string_is_parsed_once_however_many_passes_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    parse = yamlcheck._parse

    def counting(value: str) -> str | None:
        calls.append(value)
        return parse(value)

    monkeypatch.setattr(yamlcheck, "_parse", counting)
    yamlcheck.cache_clear()
    env = "pip: [jax]\nenv_vars: {A: '1'}\n"
    for _ in range(3):
        parse_job(_job(runtimeEnvYAML=env))
    assert calls == [env]
    bad = "- a list\n"
    for _ in range(2):
        assert "must be a YAML map, got a list" in _error(parse_job, _job(runtimeEnvYAML=bad))
    assert calls == [env, bad]


def test_a_yaml_string_over_its_bound_is_never_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(yamlcheck, "_parse", calls.append)
    yamlcheck.cache_clear()
    _error(parse_job, _job(runtimeEnvYAML="a: " + "x" * bounds.MAX_YAML_STRING))
    assert calls == []


def test_the_outcome_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(yamlcheck, "CACHE_ENTRIES", 3)
    yamlcheck.cache_clear()
    for i in range(10):
        yamlcheck.yaml_map_problem(f"a: {i}")
    assert len(yamlcheck._outcomes) == 3


def test_an_object_over_the_setting_holds_no_place_in_its_shapes_queue() -> None:
    """Its own pass ends InvalidSpec, so the queue of its shape must not wait for it."""
    body = tpuslice(uid="uid-big", generation=1, tpu=tpu(slices=3))
    assert SpecCache(limits=bounds.SpecLimits(max_slices=2)).parse(body) is None
    assert SpecCache(limits=bounds.SpecLimits(max_slices=3)).parse(body) is not None
