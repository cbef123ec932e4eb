"""Elastic TPU groups and CPU group ranges in spec.workerGroups: what the CRD and the
parser accept and refuse, how such a group renders, how its slices are planned and
what status shows of it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.support.builders import tpuslice
from tests.support.crd import validate
from tpuslice.model import constants as c
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.parts import ElasticSpec, SpecError

TSC = "tpuslice.dev_tpusliceclusters.yaml"
TSJ = "tpuslice.dev_tpuslicejobs.yaml"
TSS = "tpuslice.dev_tpusliceservices.yaml"

TRAINER = {"name": "trainer", "tpu": {"type": "v6e", "topology": "4x4", "slices": 2}}
ROLLOUT = {
    "name": "rollout",
    "tpu": {"type": "v6e", "topology": "2x4"},
    "elastic": {"minSlices": 1, "maxSlices": 3, "idleTimeoutSeconds": 120},
}
DATA = {"name": "data", "cpu": {"minReplicas": 1, "maxReplicas": 4}}


def grouped(*groups: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A TPUSliceCluster in the many-group form (no spec.tpu)."""
    obj = tpuslice(**spec)
    del obj["spec"]["tpu"]
    obj["spec"]["workerGroups"] = [copy.deepcopy(g) for g in groups or (TRAINER, ROLLOUT, DATA)]
    return obj


def errors_of(obj: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as info:
        parse_cluster(obj)
    return str(info.value)


def with_entry(base: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**copy.deepcopy(base), **fields}


# --- the API ---------------------------------------------------------------------------


def test_an_elastic_group_and_a_cpu_range_parse() -> None:
    spec = parse_cluster(grouped())
    trainer, rollout = spec.tpu_groups()
    assert trainer.elastic is None and trainer.slices == 2
    assert rollout.elastic == ElasticSpec(1, 3, idle_timeout_seconds=120)
    assert rollout.slices == 3  # judged at its maximum, as spec.elastic is
    (data,) = spec.cpu_groups
    assert (data.replicas, data.max_replicas, data.autoscaled) == (1, 4, True)
    assert spec.autoscaled and spec.elastic is None
    assert spec.slices == 5  # every limit judges the most the autoscaler may reach
    assert spec.gang == "AllSlices"  # the minimums (2 + 1) are more than one slice


def test_a_fixed_grouped_cluster_runs_no_autoscaler() -> None:
    fixed = grouped(TRAINER, {"name": "data", "cpu": {"replicas": 2}})
    assert not parse_cluster(fixed).autoscaled


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        (grouped(elastic={"maxSlices": 2}), "cannot be mixed with spec.elastic"),
        (
            grouped(with_entry(ROLLOUT, tpu={"type": "v6e", "topology": "2x4", "slices": 2})),
            "spec.workerGroups[0].elastic: and spec.workerGroups[0].tpu.slices 2 are exclusive",
        ),
        (
            grouped(with_entry(ROLLOUT, elastic={"minSlices": 3, "maxSlices": 2})),
            "spec.workerGroups[0].elastic.minSlices: 3 is more than",
        ),
        (
            grouped(with_entry(ROLLOUT, elastic={"minSlices": 1})),
            "spec.workerGroups[0].elastic.maxSlices: is required",
        ),
        (
            grouped(with_entry(ROLLOUT, elastic={"maxSlices": 2, "scaleUpTimeoutSeconds": 5})),
            "spec.workerGroups[0].elastic.scaleUpTimeoutSeconds",
        ),
        (
            grouped(TRAINER, with_entry(DATA, elastic={"maxSlices": 2})),
            "spec.workerGroups[1].elastic: is a TPU group's slice range",
        ),
        (
            grouped(TRAINER, with_entry(DATA, cpu={"replicas": 1, "maxReplicas": 2})),
            "spec.workerGroups[1].cpu.replicas: and cpu.maxReplicas are exclusive",
        ),
        (
            grouped(TRAINER, with_entry(DATA, cpu={"minReplicas": 3, "maxReplicas": 2})),
            "spec.workerGroups[1].cpu.minReplicas: 3 is more than cpu.maxReplicas 2",
        ),
        (
            grouped(TRAINER, with_entry(DATA, cpu={"minReplicas": 3})),
            "spec.workerGroups[1].cpu.minReplicas: needs cpu.maxReplicas",
        ),
    ],
)
def test_bad_ranges_are_refused_naming_the_field(obj: dict[str, Any], fragment: str) -> None:
    assert fragment in errors_of(obj)


@pytest.mark.parametrize("crd", [TSC, TSJ, TSS])
def test_the_crds_accept_elastic_groups_and_cpu_ranges(crd: str) -> None:
    obj = grouped()
    if crd == TSJ:
        obj["spec"]["job"] = {"entrypoint": "python train.py"}
    if crd == TSS:
        obj["spec"]["serve"] = {"serveConfigV2": "applications: []"}
    assert validate(crd, obj) == []


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        (grouped(elastic={"maxSlices": 2}), "cannot be mixed with spec.worker or spec.elastic"),
        (
            grouped(with_entry(ROLLOUT, tpu={"type": "v6e", "topology": "2x4", "slices": 2})),
            "elastic needs a tpu group whose tpu.slices is 1",
        ),
        (
            grouped(TRAINER, with_entry(DATA, elastic={"maxSlices": 2})),
            "elastic needs a tpu group",
        ),
        (
            grouped(with_entry(ROLLOUT, elastic={"minSlices": 3, "maxSlices": 2})),
            "elastic.minSlices must not exceed elastic.maxSlices",
        ),
        (grouped(with_entry(ROLLOUT, elastic={"minSlices": 1})), "'maxSlices' is a required"),
        (
            grouped(TRAINER, with_entry(DATA, cpu={"replicas": 1, "maxReplicas": 2})),
            "takes replicas (a fixed count) or maxReplicas",
        ),
        (grouped(TRAINER, with_entry(DATA, cpu={})), "takes replicas (a fixed count)"),
        (
            grouped(TRAINER, with_entry(DATA, cpu={"minReplicas": 3, "maxReplicas": 2})),
            "cpu.minReplicas needs cpu.maxReplicas and must not exceed it",
        ),
    ],
)
def test_the_crd_refuses_bad_ranges(obj: dict[str, Any], fragment: str) -> None:
    messages = validate(TSC, obj)
    assert any(fragment in m for m in messages), messages


def test_one_elastic_schema_serves_spec_elastic_and_every_group() -> None:
    import yaml

    from tests.support.crd import ROOT

    crd = yaml.safe_load((ROOT / "crds" / TSC).read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    top = dict(spec["properties"]["elastic"])
    entry = dict(spec["properties"]["workerGroups"]["items"]["properties"]["elastic"])
    top.pop("description")
    entry.pop("description")
    assert top == entry
    assert c.WORKER_GROUP == "tpu"
