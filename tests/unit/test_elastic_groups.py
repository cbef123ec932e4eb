"""Elastic TPU groups and CPU group ranges in spec.workerGroups: what the CRD and the
parser accept and refuse, how such a group renders, how its slices are planned and
what status shows of it."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from typing import Any

import pytest

from tests.support.builders import holder, nodes_of, reservation, slice_pods, tpuslice
from tests.support.crd import validate
from tests.support.fake_kube import FakeKube
from tpuslice.controller.actuator import desired_of, gang_need
from tpuslice.controller.applier import with_live_autoscaling
from tpuslice.controller.cluster import ClusterKind
from tpuslice.controller.job import JobKind
from tpuslice.controller.reconciler import Reconciler
from tpuslice.controller.service import ServiceKind
from tpuslice.model import constants as c
from tpuslice.model.convert import raycluster_info, worker_replicas
from tpuslice.model.records import (
    ClusterRef,
    Holder,
    NodeInfo,
    PodInfo,
    ReservationInfo,
    SliceState,
    SliceStatus,
    Snapshot,
)
from tpuslice.planning.elastic import workers_to_delete
from tpuslice.render.kuberay import render_cluster
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.job import parse_job
from tpuslice.spec.parts import ElasticSpec, SpecError
from tpuslice.spec.service import parse_service
from tpuslice.status.conditions import ClusterSlices, ElasticCount, Observed, removal_events
from tpuslice.status.groups import (
    CpuGroupObserved,
    TpuGroupObserved,
    grouped_status,
    groups_ready,
)

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


# --- rendering -------------------------------------------------------------------------


def rendered_groups(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["groupName"]: g for g in render_cluster(obj)["spec"]["workerGroupSpecs"]}


def test_an_elastic_group_and_a_cpu_range_render_for_the_autoscaler() -> None:
    rc = render_cluster(grouped())
    assert rc["spec"]["enableInTreeAutoscaling"] is True
    assert rc["spec"]["autoscalerOptions"] == {"version": c.AUTOSCALER_VERSION}
    groups = {g["groupName"]: g for g in rc["spec"]["workerGroupSpecs"]}
    trainer, rollout, data = groups["trainer"], groups["rollout"], groups["data"]
    # the fixed group keeps its pinned count; the autoscaler never moves it
    assert (trainer["replicas"], trainer["minReplicas"], trainer["maxReplicas"]) == (2, 2, 2)
    assert "scaleStrategy" not in trainer
    # the elastic group: the count is the autoscaler's, never sent by our field manager
    assert "replicas" not in rollout
    assert (rollout["minReplicas"], rollout["maxReplicas"]) == (1, 3)
    assert rollout["idleTimeoutSeconds"] == 120
    assert rollout["scaleStrategy"] == {"workersToDelete": []}
    annotations = rollout["template"]["metadata"]["annotations"]
    assert annotations[c.ANNOTATION_ELASTIC] == "true"
    assert annotations[c.ANNOTATION_SLICES] == "3"  # the bound of a replica index
    assert c.ANNOTATION_ELASTIC not in trainer["template"]["metadata"]["annotations"]
    # the CPU range likewise
    assert "replicas" not in data
    assert (data["minReplicas"], data["maxReplicas"]) == (1, 4)
    assert data["scaleStrategy"] == {"workersToDelete": []}


def test_a_cpu_range_alone_turns_the_autoscaler_on() -> None:
    rc = render_cluster(grouped(TRAINER, DATA))
    assert rc["spec"]["enableInTreeAutoscaling"] is True
    fixed = render_cluster(grouped(TRAINER, {"name": "data", "cpu": {"replicas": 2}}))
    assert "enableInTreeAutoscaling" not in fixed["spec"]
    assert "autoscalerOptions" not in fixed["spec"]


def test_the_one_allocate_timeout_is_the_groups() -> None:
    timed = with_entry(ROLLOUT, elastic={"maxSlices": 2, "scaleUpTimeoutSeconds": 900})
    rc = render_cluster(grouped(TRAINER, timed))
    assert rc["spec"]["autoscalerOptions"]["env"] == [
        {"name": c.ENV_AUTOSCALER_ALLOCATE_TIMEOUT, "value": "900"}
    ]
    other = {
        "name": "other",
        "tpu": {"type": "v5e", "topology": "2x4"},
        "elastic": {"maxSlices": 2, "scaleUpTimeoutSeconds": 600},
    }
    assert "spec.workerGroups[2].elastic.scaleUpTimeoutSeconds: differs" in errors_of(
        grouped(TRAINER, timed, other)
    )


def test_the_apply_carries_each_autoscaled_groups_live_count_and_deletions() -> None:
    rendered = render_cluster(grouped())
    rendered["metadata"]["ownerReferences"] = [{"uid": "u"}]
    live = copy.deepcopy(rendered)
    by_name = {g["groupName"]: g for g in live["spec"]["workerGroupSpecs"]}
    by_name["rollout"]["replicas"] = 2
    by_name["rollout"]["scaleStrategy"] = {"workersToDelete": ["rollout-abcde-0"]}
    by_name["data"]["replicas"] = 3
    by_name["trainer"]["replicas"] = 7  # someone else's edit of a fixed group: not carried
    actual = {**raycluster_info(live), "resourceVersion": "42"}
    body = with_live_autoscaling(rendered, actual)
    groups = {g["groupName"]: g for g in body["spec"]["workerGroupSpecs"]}
    assert groups["rollout"]["replicas"] == 2
    assert groups["rollout"]["scaleStrategy"] == {"workersToDelete": ["rollout-abcde-0"]}
    assert groups["data"]["replicas"] == 3
    assert groups["trainer"]["replicas"] == 2
    assert body["metadata"]["resourceVersion"] == "42"
    assert worker_replicas(actual, "rollout") == 2
    assert workers_to_delete(actual, "rollout") == frozenset({"rollout-abcde-0"})
    assert workers_to_delete(actual) == frozenset()  # no group named tpu


# --- planning --------------------------------------------------------------------------

V6E = ("tpu-v6e-slice", "4x4")
V5E = ("tpu-v5-lite-podslice", "2x4")
FIXED = {"name": "trainer", "tpu": {"type": "v6e", "topology": "4x4", "slices": 2}}
ELASTIC = {
    "name": "rollout",
    "tpu": {"type": "v5e", "topology": "2x4", "chipsPerHost": 4},
    "elastic": {"minSlices": 1, "maxSlices": 3},
}
OTHER = holder("tpu-zzzzz", 0, name="other", uid="uid-other")


def rl() -> dict[str, Any]:
    obj = grouped(FIXED, ELASTIC)
    obj["metadata"].update(name="rl", uid="uid-rl", creationTimestamp="2026-01-01T00:00:00Z")
    return obj


def rl_raycluster(rollout: int) -> dict[str, Any]:
    """The RayCluster as the autoscaler left it: ``rollout`` replicas of the rollout group."""
    rc = render_cluster(rl())
    for group in rc["spec"]["workerGroupSpecs"]:
        if group["groupName"] == "rollout":
            group["replicas"] = rollout
    rc["metadata"]["uid"] = "uid-rc"
    rc["metadata"]["ownerReferences"] = [{"uid": "uid-rl", "controller": True}]
    return raycluster_info(rc)


def rl_pods(rollout: int) -> list[PodInfo]:
    pods = [
        pod
        for i in range(2)
        for pod in slice_pods(f"trainer-{'ab'[i]}xxxx", i, cluster="rl", group="trainer")
    ]
    pods += [
        pod
        for i in range(rollout)
        for pod in slice_pods(f"rollout-{'abc'[i]}xxxx", i, hosts=2, cluster="rl", group="rollout")
    ]
    return pods


def mine(replica: str, index: int, group: str) -> Holder:
    return holder(replica, index, name="rl", uid="uid-rl", group=group)


def run_rl(
    rollout: int, nodes: list[NodeInfo], reservations: list[ReservationInfo], pods: int = -1
) -> FakeKube:
    kube = FakeKube()
    for r in reservations:
        kube.taken[r.pool] = r
    snapshot = Snapshot(
        rl(), rl_pods(rollout if pods < 0 else pods), nodes, reservations, rl_raycluster(rollout)
    )
    asyncio.run(Reconciler(kube, lambda _: snapshot).kick((c.KIND_CLUSTER, "ml", "rl")))
    return kube


def v6e(*pools: str) -> list[NodeInfo]:
    return nodes_of(*pools)


def v5e(*pools: str) -> list[NodeInfo]:
    return nodes_of(*pools, hosts=2, accelerator=V5E[0], topology=V5E[1])


def claims(kube: FakeKube) -> list[str]:
    return [call[1] for call in kube.calls if call[0] == "claim"]


def released(kube: FakeKube) -> list[str]:
    return [call[1] for call in kube.calls if call[0] == "release"]


def test_the_gang_holds_the_fixed_group_and_the_elastic_minimum_all_or_nothing() -> None:
    """A v6e pool another object holds leaves the trainer short: the rollout group's
    minimum may take its v5e pool (its shape is first in the claim order) but nothing
    starts, and no pool is taken for the extra the autoscaler already asked for."""
    kube = run_rl(2, v6e("v6e-a", "v6e-b") + v5e("v5e-a", "v5e-b"), [reservation("v6e-b", OTHER)])
    (claimed,) = claims(kube)
    assert claimed.startswith("v5e-")  # one pool of v5e, the minimum's
    assert released(kube) == []
    # the next pass: the minimum is held, the trainer still short; the extra waits too
    minimum = reservation(claimed, mine("rollout-axxxx", 0, "rollout"))
    nodes = v6e("v6e-a", "v6e-b") + v5e("v5e-a", "v5e-b")
    kube = run_rl(2, nodes, [reservation("v6e-b", OTHER), minimum])
    assert claims(kube) == [] and released(kube) == []
    assert kube.status is not None
    assert kube.status["conditions"][0]["status"] == "False"  # Ready


def test_once_every_minimum_is_held_the_gang_starts_and_extras_follow() -> None:
    kube = run_rl(2, v6e("v6e-a", "v6e-b") + v5e("v5e-a"), [])
    # the claim order: the minimum's v5e pool, then both v6e pools at once; the extra
    # finds no v5e pool left and waits, Requested
    assert claims(kube)[0] == "v5e-a" and sorted(claims(kube)[1:]) == ["v6e-a", "v6e-b"]
    rollout_released = [p for p in released(kube) if p.startswith("rl-rollout-")]
    assert len(released(kube)) == 4 + 4 + 2
    assert sorted(rollout_released) == ["rl-rollout-axxxx-0", "rl-rollout-axxxx-1"]
    assert kube.status is not None
    group = next(g for g in kube.status["groups"] if g["name"] == "rollout")
    assert group["elastic"]["minSlices"] == 1 and group["elastic"]["maxSlices"] == 3
    assert group["elastic"]["target"] == 2
    assert group["desiredSlices"] == 2
    assert [s["state"] for s in group["slices"]][1] == "Requested"  # waits for a pool


def test_the_elastic_group_grows_one_slice_at_a_time_as_the_autoscaler_asks() -> None:
    held = [
        reservation("v6e-a", mine("trainer-axxxx", 0, "trainer")),
        reservation("v6e-b", mine("trainer-bxxxx", 1, "trainer")),
        reservation("v5e-a", mine("rollout-axxxx", 0, "rollout")),
    ]
    nodes = v6e("v6e-a", "v6e-b") + v5e("v5e-a", "v5e-b", "v5e-c")
    # the autoscaler asked for a second slice: only it is claimed, whole, on its own
    kube = run_rl(2, nodes, held)
    (claimed,) = claims(kube)
    assert claimed in ("v5e-b", "v5e-c")
    assert {"rl-rollout-bxxxx-0", "rl-rollout-bxxxx-1"} <= set(released(kube))
    holder_of = kube.claimed[claimed]["spec"]["holder"]
    assert (holder_of["group"], holder_of["replicaName"]) == ("rollout", "rollout-bxxxx")
    # a target the group's pods have not reached yet claims nothing ahead of them
    kube = run_rl(3, nodes, held, pods=1)
    assert claims(kube) == []


# --- status ----------------------------------------------------------------------------


def observed(desired: int, ready: int, elastic: ElasticCount | None = None) -> Observed:
    return Observed(
        generation=1,
        accelerator_type="v6e-16",
        hosts_per_slice=4,
        chips_per_host=4,
        desired_slices=desired,
        gated=True,
        applied=True,
        elastic=elastic,
        ray_cluster="rl",
        slices=[
            SliceStatus(
                i,
                SliceState.READY if i < ready else SliceState.REQUESTED,
                f"r-{i}",
                node_pool=f"p-{i}" if i < ready else None,
            )
            for i in range(desired)
        ],
        ray_cluster_ready=True,
        suspended=False,
    )


def ready_of(status: dict[str, Any]) -> str:
    return next(cond["status"] for cond in status["conditions"] if cond["type"] == "Ready")


def test_a_grouped_object_is_ready_when_every_group_holds_its_minimum() -> None:
    fixed = TpuGroupObserved("trainer", "4x4", observed(2, 2))
    above = TpuGroupObserved("rollout", "2x4", observed(3, 1, ElasticCount(1, 3, 3)))
    status = grouped_status([fixed, above], [CpuGroupObserved("data", 2)], None, "")
    assert ready_of(status) == "True"  # the rollout's extras waiting keep nobody from work
    rollout = status["groups"][1]
    assert rollout["elastic"]["minSlices"] == 1 and rollout["elastic"]["target"] == 3
    assert "elastic" not in status and "elastic" not in status["groups"][0]
    assert status["groups"][2] == {"name": "data", "desiredReplicas": 2}
    # one ready slice more than a group needs never makes up for another group short
    short = TpuGroupObserved("trainer", "4x4", observed(2, 1))
    many = TpuGroupObserved("rollout", "2x4", observed(3, 3, ElasticCount(1, 3, 3)))
    assert ready_of(grouped_status([short, many], [], None, "")) == "False"


def test_a_cpu_ranges_desired_replicas_is_the_autoscalers_count_clamped() -> None:
    (data,) = parse_cluster(grouped()).cpu_groups
    assert [data.desired_replicas(n) for n in (None, 0, 2, 9)] == [1, 1, 2, 4]


def test_another_objects_pass_reads_a_groups_target_from_its_entry() -> None:
    spec = parse_cluster(rl())
    trainer, rollout = spec.tpu_groups()
    body = rl()
    assert desired_of(body, rollout) == 1  # nothing written yet: the minimum
    body["status"] = {"groups": [{"name": "rollout", "elastic": {"target": 3}}]}
    assert (desired_of(body, rollout), desired_of(body, trainer)) == (3, 2)
    assert (gang_need(3, rollout), gang_need(2, trainer)) == (1, 2)


def test_a_grouped_job_or_service_cluster_is_judged_group_by_group() -> None:
    fixed = TpuGroupObserved("trainer", "4x4", observed(2, 2))
    above = TpuGroupObserved("rollout", "2x4", observed(3, 1, ElasticCount(1, 3, 3)))
    assert groups_ready([fixed, fixed]) is None  # fixed groups: all their slices, together
    verdict = groups_ready([fixed, above])
    slices = [*fixed.observed.slices, *above.observed.slices]
    cluster = ClusterSlices("rl-abcde", 5, slices, True, groups_ready=verdict)
    assert cluster.all_ready and cluster.blocked() is None
    short = TpuGroupObserved("trainer", "4x4", observed(2, 1))
    cluster = replace(cluster, groups_ready=groups_ready([short, above]))
    assert not cluster.all_ready and cluster.blocked() is not None


def test_a_slice_an_elastic_group_loses_to_the_autoscaler_is_one_event_naming_the_group() -> None:
    before = {"groups": [{"name": "rollout", "elastic": {"target": 2}, "slices": []}]}
    removing = {"index": 1, "replica": "rollout-bxxxx"}
    after = {
        "groups": [
            {"name": "rollout", "elastic": {"target": 1, "removing": [removing]}, "slices": []}
        ]
    }
    ((kind, reason, message),) = removal_events(before, after)
    assert kind == "Normal"
    assert reason == "SliceRemovedByAutoscaler"
    assert message.startswith("group rollout: slice 1 (rollout-bxxxx)")
    assert removal_events(after, after) == []


def test_each_kinds_elastic_group_wants_its_own_groups_live_count() -> None:
    live = rl_raycluster(2)
    cluster_sets = ClusterKind().slice_sets(
        ClusterRef("ml", "rl", "uid-rl"), parse_cluster(rl()), Snapshot(rl(), [], [], [], live), {}
    )
    assert {s.spec.group_name: s.desired for s in cluster_sets} == {"trainer": None, "rollout": 2}

    job_body = {**rl(), "kind": c.KIND_JOB}
    job_body["spec"]["job"] = {"entrypoint": "python rl.py"}
    owned = {"status": {"rayClusterName": "rl-abcde", "jobDeploymentStatus": "Running"}}
    snap = Snapshot(job_body, [], [], [], None, owned=owned, rayclusters={"rl-abcde": live})
    job_sets = JobKind().slice_sets(
        ClusterRef("ml", "rl", "uid-rl", kind=c.KIND_JOB), parse_job(job_body), snap, {}
    )
    assert {s.spec.group_name: s.desired for s in job_sets} == {"trainer": 2, "rollout": 2}
    assert all(s.snap.raycluster is live for s in job_sets)

    service_body = {**rl(), "kind": c.KIND_SERVICE}
    service_body["spec"]["serve"] = {"serveConfigV2": "applications: []"}
    snap = Snapshot(service_body, [], [], [], None, owned={}, rayclusters={"rl-abcde": live})
    service_sets = ServiceKind().slice_sets(
        ClusterRef("ml", "rl", "uid-rl", kind=c.KIND_SERVICE), parse_service(service_body), snap, {}
    )
    assert {s.spec.group_name: s.desired for s in service_sets} == {
        "trainer": None,
        "rollout": 2,
    }


def test_a_grouped_object_scales_up_while_any_elastic_group_does() -> None:
    fixed = TpuGroupObserved("trainer", "4x4", observed(2, 2))
    above = TpuGroupObserved("rollout", "2x4", observed(3, 1, ElasticCount(1, 3, 3)))
    status = grouped_status([fixed, above], [], None, "")
    scaling = next(cond for cond in status["conditions"] if cond["type"] == "ScalingUp")
    assert scaling["status"] == "True" and scaling["reason"] == "SlicesRequested"
    assert scaling["message"].startswith("group rollout: the autoscaler asked for 3 slices")
    timed = next(cond for cond in status["conditions"] if cond["type"] == "ScaleUpTimedOut")
    assert timed["status"] == "False"
    at_target = TpuGroupObserved("rollout", "2x4", observed(1, 1, ElasticCount(1, 3, 1)))
    status = grouped_status([fixed, at_target], [], None, "")
    scaling = next(cond for cond in status["conditions"] if cond["type"] == "ScalingUp")
    assert scaling["status"] == "False"
    fixed_only = grouped_status([fixed], [], None, "")
    assert not any(cond["type"] == "ScalingUp" for cond in fixed_only["conditions"])
