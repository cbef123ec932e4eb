"""Elastic slices (spec.elastic): the CRD's rules, the parse, the rendering for the Ray
autoscaler v2, the identity of an elastic set's workers, and planning and queueing with
a moving count (``plan``, ``req``, ``SHAPE`` and ``free_pools`` are the gang and queue
tests' helpers)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import jsonpatch
import pytest

from tests.support.builders import holder, nodes_of, reservation, slice_pods, tpu, tpuslice
from tests.support.crd import validate
from tests.support.fake_kube import FakeKube
from tests.unit.test_identity import env_of, kuberay_pod
from tests.unit.test_reconcile import UID, make, run
from tests.unit.test_reservation import CLUSTER, plan
from tests.unit.test_slicequeue import SHAPE, free_pools, req
from tests.unit.test_status import observed
from tpuslice.controller.actuator import desired_of
from tpuslice.controller.applier import applied_hash, with_live_autoscaling
from tpuslice.controller.cluster import live_desired
from tpuslice.model import constants as c
from tpuslice.model.convert import raycluster_info, worker_replicas
from tpuslice.model.records import GangMode, Holder, ShapePool, SliceState, Snapshot
from tpuslice.planning.elastic import PlanTerms, plan_terms
from tpuslice.planning.pools import pool_request
from tpuslice.planning.queue import decide_queue
from tpuslice.render.identity import IdentityError, mutate_pod
from tpuslice.render.kuberay import render, render_cluster
from tpuslice.runtime.kube import ApiError
from tpuslice.spec.bounds import SpecLimits
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.limits import limit_errors
from tpuslice.spec.parts import ElasticSpec, SpecError
from tpuslice.status.conditions import (
    ElasticCount,
    as_requested,
    compute_status,
    elastic_slices,
    slice_events,
)

CRDS = {
    c.KIND_CLUSTER: "tpuslice.dev_tpusliceclusters.yaml",
    c.KIND_JOB: "tpuslice.dev_tpuslicejobs.yaml",
    c.KIND_SERVICE: "tpuslice.dev_tpusliceservices.yaml",
}
KIND_FIELDS: dict[str, dict[str, Any]] = {
    c.KIND_CLUSTER: {},
    c.KIND_JOB: {"job": {"entrypoint": "python train.py"}},
    c.KIND_SERVICE: {"serve": {"serveConfigV2": "applications: []"}},
}


def elastic_obj(
    kind: str = c.KIND_CLUSTER, *, slices: int | None = None, **elastic: Any
) -> dict[str, Any]:
    fields = {"maxSlices": 4, **elastic}
    shape = tpu() if slices is None else tpu(slices=slices)
    return tpuslice(kind, tpu=shape, elastic=fields, **KIND_FIELDS[kind])


# --- the CRD -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(CRDS))
def test_every_kind_accepts_a_range_with_zero_minimum(kind: str) -> None:
    assert validate(CRDS[kind], elastic_obj(kind, minSlices=0, maxSlices=10)) == []


@pytest.mark.parametrize("kind", list(CRDS))
def test_elastic_and_several_fixed_slices_are_refused_naming_both_and_the_fix(kind: str) -> None:
    messages = validate(CRDS[kind], elastic_obj(kind, slices=2))
    assert any(
        "spec.elastic and spec.tpu.slices above 1 are exclusive" in m
        and "set spec.tpu.slices to 1" in m
        for m in messages
    ), messages
    assert validate(CRDS[kind], elastic_obj(kind, slices=1)) == []


@pytest.mark.parametrize(
    ("elastic", "fragment"),
    [
        ({"minSlices": 5, "maxSlices": 4}, "elastic.minSlices must not exceed elastic.maxSlices"),
        ({"maxSlices": 0}, "less than the minimum of 1"),
        ({"maxSlices": 4097}, "greater than the maximum of 4096"),
        ({"minSlices": -1}, "less than the minimum of 0"),
        ({"scaleUpTimeoutSeconds": 10}, "less than the minimum of 60"),
        ({"idleTimeoutSeconds": 604801}, "greater than the maximum of 604800"),
        ({"replicas": 3}, "Additional properties are not allowed"),
    ],
)
def test_bad_ranges_are_refused_at_apply(elastic: dict[str, Any], fragment: str) -> None:
    messages = validate(CRDS[c.KIND_CLUSTER], elastic_obj(**elastic))
    assert any(fragment in m for m in messages), messages


def test_max_slices_is_required() -> None:
    obj = elastic_obj()
    del obj["spec"]["elastic"]["maxSlices"]
    assert any(
        "'maxSlices' is a required property" in m for m in validate(CRDS[c.KIND_CLUSTER], obj)
    )


# --- the parse -----------------------------------------------------------------------


def test_parse_keeps_the_range_and_judges_bounds_at_the_maximum() -> None:
    spec = parse_cluster(
        elastic_obj(minSlices=2, maxSlices=6, idleTimeoutSeconds=120, scaleUpTimeoutSeconds=900)
    )
    assert spec.elastic == ElasticSpec(2, 6, 120, 900)
    assert spec.slices == 6 and spec.min_slices == 2
    assert spec.gang == GangMode.ALL_SLICES  # the minimum is a multislice gang
    assert parse_cluster(elastic_obj(minSlices=1)).gang == GangMode.PER_SLICE
    assert parse_cluster(tpuslice(tpu=tpu(slices=3))).min_slices == 3


@pytest.mark.parametrize(
    ("replicas", "target"), [(None, 1), (0, 1), (1, 1), (3, 3), (4, 4), (9, 4)]
)
def test_the_target_is_the_live_replicas_clamped_to_the_range(
    replicas: int | None, target: int
) -> None:
    spec = parse_cluster(elastic_obj(minSlices=1, maxSlices=4))
    assert spec.desired_slices(replicas) == target
    assert parse_cluster(tpuslice(tpu=tpu(slices=3))).desired_slices(replicas) == 3


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"minSlices": 3, "maxSlices": 2}, "spec.elastic.minSlices: 3 is more than"),
        ({"maxSlices": "4"}, "spec.elastic.maxSlices: must be an integer from 1 to 4096"),
        ({"maxSlices": None}, "spec.elastic.maxSlices: is required"),
        ({"scaleUpTimeoutSeconds": 5}, "spec.elastic.scaleUpTimeoutSeconds: must be an integer"),
        ({"idleTimeoutSeconds": True}, "spec.elastic.idleTimeoutSeconds: must be an integer"),
        ({"minReplicas": 1}, "spec.elastic.minReplicas: is not a field"),
    ],
)
def test_parse_errors_name_the_field(patch: dict[str, Any], expected: str) -> None:
    obj = elastic_obj(**patch)
    obj["spec"]["elastic"] = {k: v for k, v in obj["spec"]["elastic"].items() if v is not None}
    with pytest.raises(SpecError) as err:
        parse_cluster(obj)
    assert expected in str(err.value)


def test_parse_refuses_elastic_with_several_fixed_slices() -> None:
    with pytest.raises(SpecError) as err:
        parse_cluster(elastic_obj(slices=3))
    assert "spec.elastic: and spec.tpu.slices 3 are exclusive" in str(err.value)


def test_limits_judge_the_maximum_under_its_own_field() -> None:
    spec = parse_cluster(elastic_obj(maxSlices=10))
    errors = limit_errors(spec, SpecLimits(max_slices=8))
    assert [e.path for e in errors] == ["spec.elastic.maxSlices"]
    assert limit_errors(spec, SpecLimits(max_slices=10)) == []


# --- the rendering -------------------------------------------------------------------


def _group(rendered: dict[str, Any]) -> dict[str, Any]:
    spec = rendered["spec"]
    spec = spec.get("rayClusterSpec") or spec.get("rayClusterConfig") or spec
    group: dict[str, Any] = spec["workerGroupSpecs"][0]
    return group


def test_an_elastic_cluster_runs_the_autoscaler_v2_and_never_sends_replicas() -> None:
    rc = render_cluster(
        elastic_obj(minSlices=0, maxSlices=8, idleTimeoutSeconds=300, scaleUpTimeoutSeconds=1200)
    )
    spec = rc["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"] == {
        "version": "v2",
        "env": [{"name": "RAY_AUTOSCALER_RECONCILE_ALLOCATE_STATUS_TIMEOUT_S", "value": "1200"}],
    }
    group = _group(rc)
    assert "replicas" not in group
    assert (group["minReplicas"], group["maxReplicas"], group["numOfHosts"]) == (0, 8, 4)
    assert group["idleTimeoutSeconds"] == 300
    annotations = group["template"]["metadata"]["annotations"]
    assert annotations[c.ANNOTATION_ELASTIC] == "true"
    assert annotations[c.ANNOTATION_SLICES] == "8"


#: Ray's v2 provider removes hosts with this patch (ray-project/ray 2.60
#: python/ray/autoscaler/_private/kuberay/node_provider.py ``worker_delete_patch``);
#: tests/contract pins it against Ray itself.
DELETE_PATCH = [
    {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 0},
    {
        "op": "replace",
        "path": "/spec/workerGroupSpecs/0/scaleStrategy",
        "value": {"workersToDelete": ["w-0"]},
    },
]


@pytest.mark.parametrize("path", ["scaleStrategy", "scaleStrategy/workersToDelete"])
def test_the_autoscalers_replace_of_workers_to_delete_finds_its_target(path: str) -> None:
    """RFC 6902 4.3: a replace needs its target to exist, and KubeRay's CRD defaults no
    scaleStrategy, so the render carries an empty one (the API server as KubeRay's
    default left it: replicas defaulted to 0)."""
    rc = render_cluster(elastic_obj(minSlices=1, maxSlices=4))
    _group(rc)["replicas"] = 0
    value: Any = ["w-0"] if path.endswith("workersToDelete") else {"workersToDelete": ["w-0"]}
    patch = [{"op": "replace", "path": f"/spec/workerGroupSpecs/0/{path}", "value": value}]
    patched = jsonpatch.apply_patch(rc, patch)
    assert _group(patched)["scaleStrategy"] == {"workersToDelete": ["w-0"]}
    del _group(rc)["scaleStrategy"]  # a group rendered without it: Ray's patch is refused
    with pytest.raises(jsonpatch.JsonPatchConflict):
        jsonpatch.apply_patch(rc, DELETE_PATCH)


def test_the_autoscaler_defaults_are_left_to_it() -> None:
    rc = render_cluster(elastic_obj(minSlices=1, maxSlices=2))
    assert rc["spec"]["autoscalerOptions"] == {"version": "v2"}
    assert "idleTimeoutSeconds" not in _group(rc)


def test_the_ray_autoscaler_sees_both_tpu_node_selectors() -> None:
    """Ray's KubeRay autoscaling config adds TPU-<pod type>-head only when both GKE TPU
    selectors are in the group template (autoscaler/_private/kuberay/autoscaling_config.py)."""
    selector = _group(render_cluster(elastic_obj()))["template"]["spec"]["nodeSelector"]
    assert selector[c.NODE_LABEL_ACCELERATOR] == "tpu-v6e-slice"
    assert selector[c.NODE_LABEL_TOPOLOGY] == "4x4"


@pytest.mark.parametrize("kind", [c.KIND_JOB, c.KIND_SERVICE])
def test_jobs_and_services_render_the_same_elastic_cluster(kind: str) -> None:
    group = _group(render(elastic_obj(kind, minSlices=1, maxSlices=3)))
    assert "replicas" not in group and (group["minReplicas"], group["maxReplicas"]) == (1, 3)


def test_a_fixed_cluster_still_pins_its_count() -> None:
    rc = render_cluster(tpuslice(tpu=tpu(slices=2)))
    group = _group(rc)
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (2, 2, 2)
    assert "enableInTreeAutoscaling" not in rc["spec"]
    assert c.ANNOTATION_ELASTIC not in group["template"]["metadata"]["annotations"]


# --- identity ------------------------------------------------------------------------


def _worker(obj: dict[str, Any], replica: int) -> dict[str, Any]:
    group = _group(render_cluster(obj))
    return kuberay_pod(copy.deepcopy(group["template"]), group["numOfHosts"], replica, 0)


def test_an_elastic_worker_gets_no_megascale_settings_of_ours() -> None:
    env = env_of(mutate_pod(_worker(elastic_obj(minSlices=2, maxSlices=4), 3)).pod)
    assert not any(name.startswith("MEGASCALE_") for name in env), env
    assert env["TPU_WORKER_ID"] == "0"


def test_a_user_megascale_count_on_an_elastic_set_gets_the_slice_id() -> None:
    obj = elastic_obj(minSlices=2, maxSlices=4)
    obj["spec"]["worker"] = {
        "template": {
            "spec": {
                "containers": [
                    {"name": "ray-worker", "env": [{"name": "MEGASCALE_NUM_SLICES", "value": "2"}]}
                ]
            }
        }
    }
    env = env_of(mutate_pod(_worker(obj, 1)).pod)
    assert env["MEGASCALE_NUM_SLICES"] == "2"  # the user's, kept
    assert env["MEGASCALE_SLICE_ID"] == "1"


# --- planning with a moving count ----------------------------------------------------


PODS = {
    i: slice_pods(f"tpu-{'abcd'[i] * 5}", i) for i in range(4)
}  # replica tpu-aaaaa is index 0, tpu-bbbbb 1, ...


@pytest.mark.parametrize(
    ("held", "desired", "expected"),
    [
        (0, 3, PlanTerms(GangMode.ALL_SLICES, 2)),  # the minimum first, as a gang
        (1, 3, PlanTerms(GangMode.ALL_SLICES, 2)),
        (2, 3, PlanTerms(GangMode.PER_SLICE, 3, extra=True)),  # then one by one
        (2, 2, PlanTerms(GangMode.ALL_SLICES, 2)),
        (0, 0, PlanTerms(GangMode.ALL_SLICES, 0)),
    ],
)
def test_plan_terms_gang_the_minimum_and_take_extras_one_by_one(
    held: int, desired: int, expected: PlanTerms
) -> None:
    assert plan_terms(GangMode.ALL_SLICES, desired, held, minimum=2) == expected
    assert plan_terms(GangMode.ALL_SLICES, desired, held, minimum=None) == PlanTerms(
        GangMode.ALL_SLICES, desired
    )


def test_the_minimum_is_claimed_as_a_gang_and_extras_wait_for_it() -> None:
    """Target 3 over a minimum of 2: with one pool free nothing is claimed (the gang
    needs two); the extra slice waits too."""
    result = plan(
        gang=GangMode.ALL_SLICES,
        desired_slices=3,
        minimum=2,
        pods=PODS[0] + PODS[1] + PODS[2],
        nodes=nodes_of("pool-a"),
    )
    assert result.claims == ()
    assert {s.state for s in result.slices} == {SliceState.WAITING_FOR_CAPACITY}


def test_an_extra_slice_claims_alone_once_the_minimum_is_held() -> None:
    """Minimum 2 held, the autoscaler asked for 4: the one free pool goes to the first
    extra slice and it is released on its own; the fourth waits."""
    held = [
        reservation("pool-a", holder("tpu-aaaaa", 0)),
        reservation("pool-b", holder("tpu-bbbbb", 1)),
    ]
    result = plan(
        gang=GangMode.ALL_SLICES,
        desired_slices=4,
        minimum=2,
        pods=PODS[0] + PODS[1] + PODS[2] + PODS[3],
        nodes=nodes_of("pool-a") + nodes_of("pool-b") + nodes_of("pool-c"),
        reservations=held,
    )
    assert [(c.pool, c.holder.replica_name) for c in result.claims] == [("pool-c", "tpu-ccccc")]
    assert not result.all_or_nothing
    assert {r.replica_name for r in result.releases} >= {"tpu-ccccc"}
    assert result.slices[3].state == SliceState.WAITING_FOR_CAPACITY
    # the same with a fixed gang of 4 claims nothing: all or none
    fixed = plan(
        gang=GangMode.ALL_SLICES,
        desired_slices=4,
        pods=PODS[0] + PODS[1] + PODS[2] + PODS[3],
        nodes=nodes_of("pool-a") + nodes_of("pool-b") + nodes_of("pool-c"),
        reservations=held,
    )
    assert fixed.claims == ()


def test_a_slice_removed_by_the_autoscaler_frees_its_pool_once_its_pods_are_gone() -> None:
    """workersToDelete: KubeRay deletes the whole replica; the reservation of a slice
    with no pod left is freed (the existing rule), whatever the count."""
    result = plan(
        gang=GangMode.ALL_SLICES,
        desired_slices=2,
        minimum=1,
        pods=PODS[0],
        nodes=nodes_of("pool-a") + nodes_of("pool-b"),
        reservations=[
            reservation("pool-a", holder("tpu-aaaaa", 0)),
            reservation("pool-b", holder("tpu-bbbbb", 1)),
        ],
    )
    assert result.frees == ("pool-b",)


def test_pool_request_of_an_elastic_set_asks_for_its_minimum_then_for_extras() -> None:
    short = pool_request(
        CLUSTER,
        hosts=4,
        desired_slices=3,
        pods=PODS[0] + PODS[1] + PODS[2],
        reservations=[],
        gang=GangMode.ALL_SLICES,
        minimum=2,
    )
    assert (short.desired, short.gang, short.extra) == (2, GangMode.ALL_SLICES, False)
    grown = pool_request(
        CLUSTER,
        hosts=4,
        desired_slices=3,
        pods=PODS[0] + PODS[1] + PODS[2],
        reservations=[
            reservation("pool-a", holder("tpu-aaaaa", 0)),
            reservation("pool-b", holder("tpu-bbbbb", 1)),
        ],
        gang=GangMode.ALL_SLICES,
        minimum=2,
    )
    assert (grown.desired, grown.gang, grown.extra, grown.missing) == (
        3,
        GangMode.PER_SLICE,
        True,
        1,
    )


def test_extras_rank_after_a_newcomers_minimum_of_the_same_priority() -> None:
    """An elastic set created first, at its minimum and asking for more, does not take
    the one free pool from a later object's minimum; a higher priority still wins."""
    elastic = req("elastic", 4, t=1, held=2, claimable=2, gang=GangMode.PER_SLICE, extra=True)
    newcomer = req("newcomer", 1, t=5)
    held = [
        ShapePool(f"e{i}", True, holder=Holder("ml", "elastic", "uid-elastic", f"tpu-{i}", i))
        for i in range(2)
    ]
    pools = free_pools("p1") + held
    decision = decide_queue(SHAPE, [elastic, newcomer], pools)
    assert decision.admissions[newcomer.key].pools == ("p1",)
    assert decision.admissions[elastic.key].pools == ()
    urgent = decide_queue(
        SHAPE,
        [replace(elastic, priority=5), newcomer],
        pools,
    )
    assert urgent.admissions[elastic.key].pools == ("p1",)


def test_extras_beyond_the_pools_that_exist_are_not_stalled() -> None:
    """A fixed request larger than the shape is NotEnoughPools; an elastic set's extras
    take what exists and the autoscaler gives up on the rest after its timeout."""
    extra = req("elastic", 5, held=1, claimable=4, gang=GangMode.PER_SLICE, extra=True)
    decision = decide_queue(SHAPE, [extra], free_pools("p1", "p2"))
    admission = decision.admissions[extra.key]
    assert admission.stalled is None and len(admission.pools) == 2
    fixed = decide_queue(SHAPE, [req("fixed", 5, gang=GangMode.PER_SLICE)], free_pools("p1"))
    assert fixed.admissions[("TPUSliceCluster", "ml", "fixed")].stalled


def _raycluster(replicas: int | None) -> dict[str, Any]:
    group: dict[str, Any] = {"groupName": c.WORKER_GROUP, "minReplicas": 1, "maxReplicas": 4}
    if replicas is not None:
        group["replicas"] = replicas
    return {"spec": {"workerGroupSpecs": [group]}}


def test_the_live_count_is_the_tpu_groups_replicas() -> None:
    assert worker_replicas(_raycluster(3)) == 3
    assert worker_replicas(_raycluster(None)) is None
    assert worker_replicas(None) is None
    assert (
        worker_replicas({"spec": {"workerGroupSpecs": [{"groupName": "cpu", "replicas": 9}]}})
        is None
    )


def test_the_pass_plans_for_the_live_count_and_others_read_the_written_target() -> None:
    spec = parse_cluster(elastic_obj(minSlices=1, maxSlices=4))
    assert live_desired(spec, _raycluster(3)) == 3
    assert live_desired(spec, _raycluster(7)) == 4
    assert live_desired(spec, None) == 1
    assert live_desired(parse_cluster(tpuslice(tpu=tpu(slices=2))), _raycluster(7)) is None
    body = elastic_obj(minSlices=1, maxSlices=4)
    assert desired_of(body, spec) == 1
    body["status"] = {"elastic": {"target": 3}}
    assert desired_of(body, spec) == 3
    assert live_desired(replace(spec, suspend=True), _raycluster(3)) == 0


# --- status --------------------------------------------------------------------------


def _elastic_observed(*states: SliceState, minimum: int = 1, maximum: int = 4) -> Any:
    base = observed(*states, ray_cluster_ready=True)
    return replace(
        base,
        slices=as_requested(base.slices, minimum),
        elastic=ElasticCount(minimum, maximum, len(states)),
    )


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {x["type"]: (x["status"], x["reason"]) for x in status["conditions"]}


def test_scaling_up_never_turns_ready_false_and_waiting_extras_are_requested() -> None:
    waiting = SliceState.WAITING_FOR_CAPACITY
    status = compute_status(
        _elastic_observed(SliceState.READY, SliceState.READY, waiting), None, "T"
    )
    conds = _conditions(status)
    assert conds["Ready"] == ("True", "Ready")
    assert conds["ScalingUp"] == ("True", "SlicesRequested")
    assert [s["state"] for s in status["slices"]] == ["Ready", "Ready", "Requested"]
    assert status["elastic"] == {"minSlices": 1, "maxSlices": 4, "target": 3, "intactSlices": 2}
    assert status["sliceReadiness"] == "2/3 (1-4)"
    events = slice_events([], _elastic_observed(SliceState.READY, waiting).slices)
    assert ("Normal", "SliceRequested") in {(kind, reason) for kind, reason, _ in events}


def test_below_the_minimum_the_set_is_not_ready_and_its_slices_wait() -> None:
    waiting = SliceState.WAITING_FOR_CAPACITY
    status = compute_status(
        _elastic_observed(SliceState.READY, waiting, waiting, minimum=2), None, "T"
    )
    assert _conditions(status)["Ready"][0] == "False"
    # slice 1 is part of the minimum: it waits; slice 2 is an extra: Requested
    assert [s["state"] for s in status["slices"]] == ["Ready", "WaitingForCapacity", "Requested"]


def test_at_its_target_the_set_is_not_scaling() -> None:
    status = compute_status(_elastic_observed(SliceState.READY), None, "T")
    assert _conditions(status)["ScalingUp"] == ("False", "AtTarget")


def test_a_fixed_cluster_has_no_elastic_status() -> None:
    status = compute_status(observed(SliceState.READY), None, "T")
    assert "elastic" not in status and "ScalingUp" not in _conditions(status)
    assert status["sliceReadiness"] == "1/1"


# --- TPUSliceService: incremental upgrades of an elastic service ----------------------

INCREMENTAL = {
    "type": "NewClusterWithIncrementalUpgrade",
    "clusterUpgradeOptions": {"maxSurgePercent": 50, "gatewayClassName": "istio"},
}


def _service(upgrade: dict[str, Any], *, elastic: bool) -> dict[str, Any]:
    obj = elastic_obj(c.KIND_SERVICE)
    obj["spec"]["serve"]["upgradeStrategy"] = upgrade
    if not elastic:
        del obj["spec"]["elastic"]
    return obj


def test_an_elastic_service_may_upgrade_incrementally() -> None:
    obj = _service(INCREMENTAL, elastic=True)
    assert validate(CRDS[c.KIND_SERVICE], obj) == []
    rendered = render(obj)
    assert rendered["spec"]["upgradeStrategy"] == INCREMENTAL
    assert rendered["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True


def test_a_fixed_service_may_not_upgrade_incrementally() -> None:
    obj = _service(INCREMENTAL, elastic=False)
    messages = validate(CRDS[c.KIND_SERVICE], obj)
    assert any("NewClusterWithIncrementalUpgrade needs the Ray autoscaler" in m for m in messages)
    with pytest.raises(SpecError) as err:
        render(obj)
    assert "spec.serve.upgradeStrategy.type: NewClusterWithIncrementalUpgrade needs" in str(
        err.value
    )


def test_a_grouped_service_with_an_elastic_group_may_upgrade_incrementally() -> None:
    """An elastic TPU group runs the Ray autoscaler as spec.elastic does, so KubeRay
    accepts the incremental strategy; options without that type are refused."""
    obj = _service(copy.deepcopy(INCREMENTAL), elastic=False)
    del obj["spec"]["tpu"]
    obj["spec"].pop("worker", None)
    obj["spec"]["workerGroups"] = [
        {"name": "serve", "tpu": {"type": "v6e", "topology": "4x4"},
         "elastic": {"minSlices": 1, "maxSlices": 3}},
    ]  # fmt: skip
    assert validate(CRDS[c.KIND_SERVICE], obj) == []
    rendered = render(obj)
    assert rendered["spec"]["upgradeStrategy"]["type"] == "NewClusterWithIncrementalUpgrade"
    assert rendered["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    obj["spec"]["serve"]["upgradeStrategy"]["type"] = "NewCluster"
    messages = validate(CRDS[c.KIND_SERVICE], obj)
    assert any("clusterUpgradeOptions only applies to" in m for m in messages), messages


def test_upgrade_options_are_bounded() -> None:
    big = {**INCREMENTAL, "clusterUpgradeOptions": {"gatewayClassName": "x" * 5000}}
    with pytest.raises(SpecError) as err:
        render(_service(big, elastic=True))
    assert "spec.serve.upgradeStrategy.clusterUpgradeOptions: is" in str(err.value)


def test_a_job_or_service_cluster_is_ready_at_its_minimum_with_extras_requested() -> None:
    base = observed(SliceState.READY, SliceState.WAITING_FOR_CAPACITY)
    cluster = elastic_slices("train-x1", 2, base.slices, True, (1, 4))
    assert cluster.all_ready and cluster.blocked() is None
    entry = cluster.to_status()
    assert entry["sliceReadiness"] == "1/2 (1-4)"
    assert entry["elastic"] == {"minSlices": 1, "maxSlices": 4, "target": 2, "intactSlices": 1}
    assert [s["state"] for s in entry["slices"]] == ["Ready", "Requested"]
    fixed = elastic_slices("train-x1", 2, base.slices, True, None)
    assert not fixed.all_ready and fixed.blocked() is not None
    assert "elastic" not in fixed.to_status()
    below = elastic_slices("train-x1", 2, base.slices, True, (2, 4))
    assert not below.all_ready and below.blocked() is not None


# --- the apply: an edit never resets the autoscaler's count --------------------------


def _elastic_body(**elastic: Any) -> dict[str, Any]:
    body = tpuslice(uid=UID, generation=2, elastic={"minSlices": 1, "maxSlices": 4, **elastic})
    return body


def _live_raycluster(body: dict[str, Any], replicas: int, rendered_from: dict[str, Any]) -> Any:
    """The RayCluster as the watch shows it after the autoscaler set ``replicas``,
    applied by the operator from ``rendered_from``'s rendering."""
    rendered = render_cluster(rendered_from)
    rendered["metadata"]["annotations"] = {"tpuslice.dev/applied-hash": applied_hash(rendered)}
    rendered["metadata"]["resourceVersion"] = "41"
    rendered["spec"]["workerGroupSpecs"][0]["replicas"] = replicas
    return raycluster_info({**rendered, "status": {"state": "ready"}})


def test_with_live_replicas_carries_the_count_guarded_by_the_resource_version() -> None:
    body = _elastic_body()
    rendered = render_cluster(body)
    live = _live_raycluster(body, 3, body)
    sent = with_live_autoscaling(rendered, live)
    assert sent["spec"]["workerGroupSpecs"][0]["replicas"] == 3
    assert sent["metadata"]["resourceVersion"] == "41"
    assert "replicas" not in rendered["spec"]["workerGroupSpecs"][0]  # not changed in place
    assert with_live_autoscaling(rendered, None) == rendered  # a new RayCluster: KubeRay's default
    fixed = render_cluster(tpuslice(uid=UID, tpu=tpu(slices=2)))
    assert with_live_autoscaling(fixed, live) == fixed


def test_the_apply_keeps_hosts_the_autoscaler_named_for_deletion() -> None:
    """workerGroupSpecs is atomic for server-side apply: the rendered empty list would
    wipe the autoscaler's, so the live scaleStrategy goes with the live count."""
    body = _elastic_body()
    rendered = render_cluster(body)
    live = _live_raycluster(body, 1, body)
    live["spec"]["workerGroupSpecs"][0]["scaleStrategy"] = {"workersToDelete": ["w-1-2"]}
    sent = _group(with_live_autoscaling(rendered, live))
    assert sent["scaleStrategy"] == {"workersToDelete": ["w-1-2"]}
    assert sent["replicas"] == 1
    assert _group(rendered)["scaleStrategy"] == {"workersToDelete": []}  # not changed in place


def test_a_raycluster_made_before_scale_strategy_was_rendered_gets_it() -> None:
    body = _elastic_body()
    live = _live_raycluster(body, 2, body)
    del live["spec"]["workerGroupSpecs"][0]["scaleStrategy"]
    sent = _group(with_live_autoscaling(render_cluster(body), live))
    assert sent["scaleStrategy"] == {"workersToDelete": []} and sent["replicas"] == 2


def test_the_autoscalers_patches_alone_never_make_an_apply() -> None:
    """The count and workersToDelete moved by Ray's patch; the rendering did not."""
    body = _elastic_body()
    live = _live_raycluster(body, 1, body)
    patch = copy.deepcopy(DELETE_PATCH)
    patch[1]["value"] = {"workersToDelete": ["w-1-0"]}
    live["spec"] = jsonpatch.apply_patch({"spec": live["spec"]}, patch)["spec"]
    kube = FakeKube()
    run(make(kube, Snapshot(body, [], nodes_of("pool-a"), [], live)))
    assert kube.applied == []
    edited = FakeKube()
    run(
        make(
            edited,
            Snapshot(_elastic_body(idleTimeoutSeconds=120), [], nodes_of("pool-a"), [], live),
        )
    )
    (sent,) = edited.applied
    assert _group(sent)["scaleStrategy"] == {"workersToDelete": ["w-1-0"]}


def test_an_edit_of_an_elastic_cluster_applies_the_autoscalers_count() -> None:
    before = _elastic_body()
    after = _elastic_body(idleTimeoutSeconds=120)  # the user edits the range's settings
    live = _live_raycluster(before, 3, before)
    kube = FakeKube()
    snap = Snapshot(after, [], nodes_of("pool-a"), [], live)
    run(make(kube, snap))
    (sent,) = kube.applied
    group = sent["spec"]["workerGroupSpecs"][0]
    assert group["replicas"] == 3 and group["idleTimeoutSeconds"] == 120
    assert sent["metadata"]["resourceVersion"] == "41"


def test_a_count_moved_under_the_apply_is_not_a_stall() -> None:
    before = _elastic_body()
    live = _live_raycluster(before, 3, before)
    kube = FakeKube(apply_error=ApiError(409, "Conflict", "the object has been modified"))
    run(
        make(
            kube, Snapshot(_elastic_body(idleTimeoutSeconds=120), [], nodes_of("pool-a"), [], live)
        )
    )
    assert kube.status is not None
    stalled = next(x for x in kube.status["conditions"] if x["type"] == "Stalled")
    assert stalled["status"] == "False", kube.status["conditions"]


def test_the_pass_reserves_for_the_autoscalers_count() -> None:
    """The autoscaler asked for 2 slices over a minimum of 1: both claim a pool (the
    extra on its own once the minimum holds one), and status reports the target."""
    body = _elastic_body()
    live = _live_raycluster(body, 2, body)
    held = [reservation("pool-a", Holder("ml", "llm", UID, "tpu-aaaaa", 0))]
    pods_now = slice_pods("tpu-aaaaa", 0) + slice_pods("tpu-bbbbb", 1)
    kube = FakeKube()
    run(make(kube, Snapshot(body, pods_now, nodes_of("pool-a") + nodes_of("pool-b"), held, live)))
    assert ("claim", "pool-b") in kube.calls
    assert kube.status is not None
    assert kube.status["elastic"]["target"] == 2
    assert kube.status["desiredSlices"] == 2


def test_an_elastic_workers_replica_index_may_pass_its_maximum() -> None:
    """KubeRay numbers replicas as it scales; an elastic set's index bounds nothing of
    ours, while a fixed set's is still checked (its MEGASCALE_SLICE_ID)."""
    env = env_of(mutate_pod(_worker(elastic_obj(minSlices=1, maxSlices=2), 5)).pod)
    assert env["TPU_NAME"].endswith("-5")
    with pytest.raises(IdentityError):
        mutate_pod(_worker(tpuslice(tpu=tpu(slices=2)), 5))
