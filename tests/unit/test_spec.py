"""Parsing and defaults of a TPUSliceCluster spec."""

from __future__ import annotations

from typing import Any

import pytest

from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.parts import SpecError


def obj(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"tpu": {"type": "v6e", "topology": "4x4"}, "ray": {"version": "2.54.0"}}
    base.update(spec)
    return {"metadata": {"name": "llm", "namespace": "ml", "uid": "u"}, "spec": base}


def test_defaults() -> None:
    spec = parse_cluster(obj())
    assert spec.slices == 1
    assert spec.reservation_policy == "NodePool" and spec.gated
    assert spec.image == "rayproject/ray:2.54.0-py311-tpu"
    assert spec.suspend is False
    assert spec.shape.hosts == 4


def test_policy_none_is_not_gated() -> None:
    assert not parse_cluster(obj(reservation={"policy": "None"})).gated


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"tpu": {"type": "v6e"}}, "spec.tpu.topology: is required"),
        ({"tpu": {"topology": "4x4"}}, "spec.tpu.type: is required"),
        ({"tpu": {"type": "v6e", "topology": "4x4", "slices": 0}}, "spec.tpu.slices: must be an"),
        (
            {"tpu": {"type": "v6e", "topology": "4x4", "chipsPerHost": "four"}},
            "spec.tpu.chipsPerHost: must be an integer",
        ),
        ({"ray": {}}, "spec.ray.version: is required"),
        ({"ray": {"version": "2.54"}}, "spec.ray.version: '2.54' is not a Ray release version"),
        ({"ray": {"version": "2.53.1"}}, "Ray 2.53.1 is older than 2.54.0"),
        (
            {"worker": {"resources": {"google.com/tpu": 4}}},
            "spec.worker.resources.google.com/tpu: is set by the operator",
        ),
        ({"head": {"resources": {"memory": "lots"}}}, "spec.head.resources.memory: 'lots' is not"),
        ({"reservation": {"policy": "Pool"}}, "spec.reservation.policy: 'Pool' is not NodePool"),
        ({"suspend": "yes"}, "spec.suspend: must be true or false"),
        ({"worker": {"template": []}}, "spec.worker.template: must be a pod template object"),
        (
            {
                "worker": {
                    "template": {
                        "metadata": {
                            "annotations": {"cloud.google.com/gke-tpu-slice-topology": "2x4"}
                        }
                    }
                }
            },
            "spec.worker.template.metadata.annotations[cloud.google.com/gke-tpu-slice-topology]:"
            " asks for sub-slicing, which is not supported yet",
        ),
    ],
)
def test_errors_name_the_field(patch: dict[str, Any], expected: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_cluster(obj(**patch))
    assert expected in str(err.value)


def test_all_errors_are_reported_at_once() -> None:
    bad = obj(tpu={"type": "v9", "topology": "4x4", "slices": -1}, ray={"version": "1.0.0"})
    bad["metadata"]["name"] = "Bad_Name"
    with pytest.raises(SpecError) as err:
        parse_cluster(bad)
    paths = [e.path for e in err.value.errors]
    assert paths == ["metadata.name", "spec.tpu.type", "spec.tpu.slices", "spec.ray.version"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"metadata": {"name": "llm"}, "spec": []}, "spec: must be an object, got a list"),
        ({"metadata": "llm", "spec": {}}, "metadata: must be an object, got 'llm'"),
        ({"metadata": {"name": ["llm"]}, "spec": {}}, "metadata.name: must be a string, got a"),
        (obj(tpu="v6e-16"), "spec.tpu: must be an object, got 'v6e-16'"),
        (obj(tpu={"type": {"v6e": 1}, "topology": "4x4"}), "spec.tpu.type: must be a string"),
        (obj(tpu={"type": "v6e", "topology": "4x4", "slices": 4097}), "from 1 to 4096, got 4097"),
        (obj(tpu={"type": "v6e", "topology": "4x4", "slices": True}), "from 1 to 4096, got True"),
        (obj(ray={"version": 2.54}), "spec.ray.version: must be a string, got 2.54"),
        (obj(ray={"version": "2.54.0", "image": ["x"]}), "spec.ray.image: must be a string"),
        (obj(reservation="None"), "spec.reservation: must be an object, got 'None'"),
        (obj(reservation={"policy": ["None"]}), "spec.reservation.policy: a list is not NodePool"),
        (obj(head=[]), "spec.head: must be an object, got a list"),
        (obj(head={"resources": {"cpu": 0.5}}), "spec.head.resources.cpu: must be a string"),
        (obj(worker={"rayStartParams": {"a": {"b": 1}}}), "rayStartParams.a: must be a string"),
        (
            obj(wroker={}),
            "spec.wroker: is not a field; use one of disruption, elastic, head, kueue, ray, "
            "reservation",
        ),
        (obj(tpu={"type": "v6e", "topology": "4x4", "slice": 2}), "spec.tpu.slice: is not a field"),
        (obj(worker={"templates": {}}), "spec.worker.templates: is not a field"),
    ],
)
def test_any_json_is_judged_field_by_field(body: Any, expected: str) -> None:
    """Arbitrary input is a SpecError naming the field, never a TypeError."""
    with pytest.raises(SpecError) as err:
        parse_cluster(body)
    assert expected in str(err.value)


def test_not_an_object_at_all() -> None:
    with pytest.raises(SpecError, match="metadata: a TPUSliceCluster is an object, not a list"):
        parse_cluster([])  # type: ignore[arg-type]


def test_integers_in_string_maps_are_written_as_strings() -> None:
    spec = parse_cluster(obj(head={"resources": {"cpu": 4}, "rayStartParams": {"num-cpus": 0}}))
    assert spec.head.resources == {"cpu": "4"} and spec.head.ray_start_params == {"num-cpus": "0"}


def test_sub_slicing_annotation_is_refused_on_workers_only() -> None:
    """The head never runs on TPU nodes; GKE's webhooks read the annotation on TPU pods."""
    annotations = {"cloud.google.com/gke-tpu-slice-topology": "2x4"}
    spec = parse_cluster(obj(head={"template": {"metadata": {"annotations": annotations}}}))
    assert spec.head.template["metadata"]["annotations"] == annotations
    worker = parse_cluster(obj(worker={"template": {"metadata": {"annotations": {"a": "b"}}}}))
    assert worker.worker.template["metadata"]["annotations"] == {"a": "b"}
