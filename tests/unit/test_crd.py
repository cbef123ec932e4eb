"""The CRDs judged offline: schema (unknown fields rejected) and every CEL rule.

The CEL rules repeat tpuslice.topology's rules in another language, so a grid
test proves they agree: for every generation and many shapes, the API server
accepts exactly what the operator can render.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.crd import failing_rules, load_crd, rules_at, validate
from tpuslice.topology import (
    GENERATIONS,
    TopologyError,
    generation_names,
    resolve_generation,
    slice_shape,
)

TSC = "tpuslice.dev_tpusliceclusters.yaml"
RES = "tpuslice.dev_slicereservations.yaml"
EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


def cluster(**tpu: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "TPUSliceCluster",
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": {"tpu": {"type": "v6e", "topology": "4x4", **tpu}, "ray": {"version": "2.54.0"}},
    }


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(example: Path) -> None:
    for doc in yaml.safe_load_all(example.read_text()):
        assert validate(TSC, doc) == []


def with_spec(patch: dict[str, Any], name: str = "llm") -> dict[str, Any]:
    obj = cluster()
    obj["metadata"]["name"] = name
    for key, value in patch.items():
        obj["spec"][key] = (
            {**obj["spec"].get(key, {}), **value} if isinstance(value, dict) else value
        )
    return obj


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        (with_spec({"tpu": {"type": "v9"}}), "is not one of"),
        (with_spec({"tpu": {"topology": "4x4x4"}}), "v5e and v6e slices are 2-dimensional"),
        (
            with_spec({"tpu": {"topology": "3x3"}}),
            "v5e and v6e slices are 2-dimensional and one of",
        ),
        (with_spec({"tpu": {"topology": "0x4"}}), "must be positive integers joined by 'x'"),
        (with_spec({"tpu": {"topology": "4 x 4"}}), "must be positive integers joined by 'x'"),
        (with_spec({"tpu": {"type": "v4", "topology": "2x2"}}), "v4 slices are 3-dimensional"),
        (with_spec({"tpu": {"type": "v5p", "topology": "4x4x28"}}), "v5p slices are 3-dimensional"),
        (
            with_spec({"tpu": {"type": "tpu7x", "topology": "4x4"}}),
            "tpu7x slices are 3-dimensional",
        ),
        (with_spec({"tpu": {"slices": 0}}), "less than the minimum of 1"),
        (with_spec({"tpu": {"chipsPerHost": 8}}), "spec.tpu.chipsPerHost does not fit"),
        (with_spec({"tpu": {"chipsPerHost": 3}}), "is not one of [1, 4, 8]"),
        (with_spec({"ray": {"version": "2.53.0"}}), "at least 2.54.0"),
        (with_spec({"ray": {"version": "latest"}}), "at least 2.54.0"),
        (
            with_spec({"worker": {"resources": {"google.com/tpu": 4}}}),
            "must not set google.com/tpu",
        ),
        (with_spec({"worker": {"resources": {"memory": "lots"}}}), "does not match"),
        (with_spec({"worker": {"replicas": 3}}), "Additional properties are not allowed"),
        (with_spec({"reservation": {"policy": "Pool"}}), "is not one of ['NodePool', 'None']"),
        (with_spec({}, name="a" * 54), "metadata.name must be at most 53 characters"),
        (with_spec({}, name="9lives"), "must be a DNS-1035 label"),
        (with_spec({}, name="my.cluster"), "must be a DNS-1035 label"),
    ],
)
def test_bad_objects_are_rejected_with_a_message_naming_the_field(
    obj: dict[str, Any], fragment: str
) -> None:
    messages = validate(TSC, obj)
    assert any(fragment in m for m in messages), messages


def test_name_at_the_limit_is_accepted() -> None:
    assert validate(TSC, with_spec({}, name="a" * 53)) == []


def test_missing_required_fields() -> None:
    obj = cluster()
    del obj["spec"]["ray"]
    assert any("'ray' is a required property" in m for m in validate(TSC, obj))


def test_slice_shape_is_immutable_but_slices_are_not() -> None:
    old = cluster(slices=1)
    assert validate(TSC, cluster(slices=3), old=old) == []
    changed = validate(TSC, cluster(topology="2x2"), old=old)
    assert any("spec.tpu.type, topology and chipsPerHost are immutable" in m for m in changed)
    changed = validate(TSC, cluster(topology="2x4", chipsPerHost=4), old=cluster(topology="2x4"))
    assert any("immutable" in m for m in changed)


def test_defaults_are_applied() -> None:
    from tests.support.crd import apply_defaults, served_schema

    defaulted = apply_defaults(served_schema(load_crd(TSC)), cluster())
    assert defaulted["spec"]["tpu"]["slices"] == 1
    assert defaulted["spec"]["reservation"] == {"policy": "NodePool"}
    assert defaulted["spec"]["suspend"] is False


def test_type_enum_is_every_spelling_the_operator_accepts() -> None:
    schema = load_crd(TSC)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    enum = schema["properties"]["spec"]["properties"]["tpu"]["properties"]["type"]["enum"]
    assert sorted(enum) == sorted(generation_names())


def _python_accepts(tpu_type: str, topology: str, cph: int | None) -> bool:
    try:
        slice_shape(tpu_type, topology, cph)
    except TopologyError:
        return False
    return True


def _grid(dims: int, values: tuple[int, ...]) -> list[str]:
    return ["x".join(str(v) for v in combo) for combo in itertools.product(values, repeat=dims)]


SHAPE_GRID = (
    _grid(2, (0, 1, 2, 3, 4, 8, 16, 32))
    + _grid(3, (1, 2, 3, 4, 8, 12, 16, 24, 28))
    + ["4x4x4x4", "x4", "4x", "04x4"]
)


@pytest.mark.parametrize("generation", [g.name for g in GENERATIONS])
def test_cel_and_python_agree_on_every_shape(generation: str) -> None:
    """CEL accepts exactly the (topology, chipsPerHost) pairs the operator can render."""
    rules = rules_at(TSC, "spec", "tpu")
    host_rules = [r for r in rules if "chipsPerHost" in r["rule"]]
    disagreements = []
    for topology in SHAPE_GRID:
        tpu: dict[str, Any] = {"type": generation, "topology": topology}
        shape_ok = failing_rules(rules, tpu) == []
        if shape_ok != _python_accepts(generation, topology, None):
            disagreements.append((topology, None, shape_ok))
        for cph in (1, 4, 8):
            cel_ok = shape_ok and failing_rules(host_rules, {**tpu, "chipsPerHost": cph}) == []
            if cel_ok != _python_accepts(generation, topology, cph):
                disagreements.append((topology, cph, cel_ok))
    assert disagreements == []


@pytest.mark.parametrize("spelling", generation_names())
def test_cel_treats_every_spelling_like_its_generation(spelling: str) -> None:
    rules = rules_at(TSC, "spec", "tpu")
    canonical = resolve_generation(spelling).name
    for topology in ("4x4", "2x4", "2x2x2", "2x2x1", "1x1x1", "16x16x24"):
        for cph in (None, 4, 8):
            extra = {} if cph is None else {"chipsPerHost": cph}
            assert failing_rules(rules, {"type": spelling, "topology": topology, **extra}) == (
                failing_rules(rules, {"type": canonical, "topology": topology, **extra})
            )


def test_every_generation_is_in_the_grid() -> None:
    assert {g.name for g in GENERATIONS} <= set(generation_names())


def reservation(**spec: Any) -> dict[str, Any]:
    base = {
        "nodePool": "pool-a",
        "gkeAccelerator": "tpu-v6e-slice",
        "acceleratorType": "v6e-16",
        "topology": "4x4",
        "hosts": 4,
        "holder": {
            "namespace": "ml",
            "name": "llm",
            "uid": "u-1",
            "replicaName": "tpu-abcde",
            "replicaIndex": 0,
        },
    }
    return {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "SliceReservation",
        "metadata": {"name": "pool-a"},
        "spec": {**base, **spec},
        "status": {"phase": "Reserved"},
    }


def test_reservation_valid_and_named_after_its_pool() -> None:
    assert validate(RES, reservation()) == []
    assert any("must equal spec.nodePool" in m for m in validate(RES, reservation(nodePool="b")))


def test_reservation_spec_is_immutable() -> None:
    old = reservation()
    new = copy.deepcopy(old)
    new["spec"]["holder"]["name"] = "thief"
    assert any("spec is immutable" in m for m in validate(RES, new, old=old))
    status_only = copy.deepcopy(old)
    status_only["status"]["phase"] = "Bound"
    assert validate(RES, status_only, old=old) == []


def test_status_example_from_the_design_is_valid() -> None:
    obj = cluster(slices=2)
    obj["status"] = {
        "observedGeneration": 3,
        "acceleratorType": "v6e-16",
        "hostsPerSlice": 4,
        "chipsPerHost": 4,
        "rayCluster": "llm",
        "desiredSlices": 2,
        "readySlices": 1,
        "sliceReadiness": "1/2",
        "slices": [
            {
                "index": 0,
                "replica": "tpu-ab12c",
                "nodePool": "pool-a",
                "state": "Ready",
                "readyHosts": 4,
            },
            {"index": 1, "replica": "tpu-x9y8z", "state": "WaitingForCapacity"},
        ],
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "observedGeneration": 3,
                "lastTransitionTime": "2026-11-30T00:00:00Z",
                "reason": "WaitingForCapacity",
                "message": "slice 1 needs a free node pool",
            },
        ],
    }
    assert validate(TSC, obj) == []


@pytest.mark.parametrize("crd_file", [TSC, RES])
def test_crds_are_small_and_described(crd_file: str) -> None:
    path = Path(__file__).parents[2] / "crds" / crd_file
    assert path.stat().st_size < 64 * 1024

    def undocumented(schema: dict[str, Any], where: str) -> list[str]:
        missing = [] if "description" in schema or where.endswith("metadata") else [where]
        for name, sub in (schema.get("properties") or {}).items():
            missing += undocumented(sub, f"{where}.{name}")
        if "items" in schema:
            missing += undocumented(schema["items"], f"{where}[]")
        return missing

    schema = load_crd(crd_file)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert undocumented(schema, "") == []


@pytest.mark.parametrize("crd_file", [TSC, RES])
def test_printer_columns_are_well_formed(crd_file: str) -> None:
    columns = load_crd(crd_file)["spec"]["versions"][0]["additionalPrinterColumns"]
    for column in columns:
        assert set(column) <= {"name", "type", "jsonPath", "description", "priority", "format"}
        assert column["jsonPath"].startswith(".")
