"""Several worker groups in one cluster (spec.workerGroups): what the CRD and the parser
refuse, how a grouped spec renders, and the identity each group's hosts get."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.support.builders import tpuslice
from tests.support.crd import validate
from tpuslice.model import constants as c
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.job import parse_job
from tpuslice.spec.limits import controller_errors
from tpuslice.spec.parts import MAX_GROUP_NAME, CpuGroupSpec, SpecError

TSC = "tpuslice.dev_tpusliceclusters.yaml"
TSJ = "tpuslice.dev_tpuslicejobs.yaml"
TSS = "tpuslice.dev_tpusliceservices.yaml"

TRAINER = {"name": "trainer", "tpu": {"type": "v6e", "topology": "4x4", "slices": 2}}
ROLLOUT = {
    "name": "rollout",
    "tpu": {"type": "v5e", "topology": "2x4", "slices": 3, "multislice": False},
    "resources": {"memory": "100Gi"},
}
DATA = {"name": "data", "cpu": {"replicas": 2}, "resources": {"cpu": "8", "memory": "32Gi"}}


def grouped(*groups: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A TPUSliceCluster in the many-group form (no spec.tpu)."""
    kept_tpu = spec.pop("tpu", None)
    obj = tpuslice(**spec)
    del obj["spec"]["tpu"]
    if kept_tpu is not None:  # mixing the forms, to be refused
        obj["spec"]["tpu"] = kept_tpu
    obj["spec"]["workerGroups"] = [copy.deepcopy(g) for g in groups or (TRAINER, ROLLOUT, DATA)]
    return obj


def errors_of(obj: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as info:
        parse_cluster(obj)
    return str(info.value)


def test_groups_parse_into_records_of_their_own_shapes() -> None:
    spec = parse_cluster(grouped())
    tpu_groups = spec.tpu_groups()
    assert [(g.group_name, g.shape.topology, g.slices, g.multislice) for g in tpu_groups] == [
        ("trainer", "4x4", 2, True),
        ("rollout", "2x4", 3, False),
    ]
    assert tpu_groups[1].worker.resources == {"memory": "100Gi"}
    assert spec.cpu_groups == (CpuGroupSpec("data", 2, spec.cpu_groups[0].worker),)
    assert spec.slices == 5  # what the per-object limits judge
    assert str(spec.gang) == "AllSlices"  # the gang spans the groups by default


def test_the_one_group_form_is_one_group_named_tpu() -> None:
    spec = parse_cluster(tpuslice())
    assert not spec.grouped
    assert spec.tpu_groups() == (spec,)
    assert spec.group_name == c.WORKER_GROUP


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        (grouped(tpu={"type": "v6e", "topology": "4x4"}), "cannot be mixed with spec.tpu"),
        (grouped(worker={"resources": {"cpu": "1"}}), "cannot be mixed with spec.worker"),
        (grouped(TRAINER, dict(TRAINER)), "names two groups"),
        (grouped({**TRAINER, "name": "head"}), "must not be head"),
        (grouped({**TRAINER, "name": "a" * (MAX_GROUP_NAME + 1)}), "at most 52 characters"),
        (grouped({**TRAINER, "name": "Trainer"}), "DNS-1035 label"),
        (grouped({**TRAINER, "cpu": {"replicas": 1}}), "exactly one of tpu"),
        (grouped({"name": "x"}), "exactly one of tpu"),
        (grouped(DATA), "needs at least one tpu group"),
        (grouped({**DATA, "cpu": {"replicas": -1}}, TRAINER), "from 0 to 4096"),
        (grouped({**TRAINER, "tpu": {"type": "v6e", "topology": "4x4x4"}}), "workerGroups[0].tpu"),
        (grouped({**TRAINER, "replicas": 2}), "workerGroups[0].replicas: is not a field"),
        (grouped(*[{**TRAINER, "name": f"g{i}"} for i in range(17)]), "1 to 16 groups"),
        (
            grouped({**TRAINER, "resources": {"google.com/tpu": "4"}}),
            "workerGroups[0].resources.google.com/tpu",
        ),
    ],
)
def test_bad_groups_are_refused_naming_the_field(obj: dict[str, Any], fragment: str) -> None:
    assert fragment in errors_of(obj)


def test_a_job_takes_groups_too() -> None:
    obj = grouped(kind=c.KIND_JOB, job={"entrypoint": "python train.py"})
    spec = parse_job(obj)
    assert [g.group_name for g in spec.cluster.tpu_groups()] == ["trainer", "rollout"]


def test_the_pass_refuses_groups_it_cannot_reserve_yet() -> None:
    gated = parse_cluster(grouped())
    assert "reservation.policy None" in str(controller_errors(gated)[0])
    free = parse_cluster(grouped(reservation={"policy": "None"}))
    assert controller_errors(free) == []
    assert controller_errors(parse_cluster(tpuslice())) == []


@pytest.mark.parametrize("crd", [TSC, TSJ, TSS])
def test_the_crds_accept_groups(crd: str) -> None:
    obj = grouped()
    if crd == TSJ:
        obj["spec"]["job"] = {"entrypoint": "python train.py"}
    if crd == TSS:
        obj["spec"]["serve"] = {"serveConfigV2": "applications: []"}
    assert validate(crd, obj) == []


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        (grouped(tpu={"type": "v6e", "topology": "4x4"}), "exactly one of spec.tpu"),
        (grouped(worker={"resources": {"cpu": "1"}}), "cannot be mixed with spec.worker"),
        (grouped(elastic={"maxSlices": 2}), "cannot be mixed with spec.worker or spec.elastic"),
        (grouped(TRAINER, dict(TRAINER)), "names must be unique"),
        (grouped({**TRAINER, "name": "head"}), "must not be head"),
        (grouped({**TRAINER, "name": "a" * 53}), "at most 52 characters"),
        (grouped({**TRAINER, "cpu": {"replicas": 1}}), "exactly one of tpu"),
        (grouped(*[{**TRAINER, "name": f"g{i}"} for i in range(17)]), "is too long"),
    ],
)
def test_the_crd_refuses_bad_groups(obj: dict[str, Any], fragment: str) -> None:
    messages = validate(TSC, obj)
    assert any(fragment in m for m in messages), messages


def test_neither_form_is_refused_by_the_crd() -> None:
    obj = tpuslice()
    del obj["spec"]["tpu"]
    assert any("exactly one of spec.tpu" in m for m in validate(TSC, obj))


def test_the_form_cannot_change_on_a_live_object() -> None:
    messages = validate(TSC, grouped(), old=tpuslice())
    assert any("cannot replace each other" in m for m in messages), messages
    assert validate(TSC, grouped(), old=grouped()) == []
