"""Kueue's topology-aware scheduling at the node-pool level: the worker-template annotations
accepted or refused at apply, and Kueue's pool adopted as each slice's only pool."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from tests.support.builders import holder, nodes_of, reservation, slice_pods
from tpuslice.controller.applier import is_subset, with_kueue_admission
from tpuslice.controller.cluster import admitted_snapshot
from tpuslice.model import constants as c
from tpuslice.model.convert import raycluster_info
from tpuslice.model.records import (
    Admission,
    ClusterRef,
    GangMode,
    Holder,
    SliceState,
    SliceStatus,
    Snapshot,
)
from tpuslice.planning.kueue_tas import kueue_choice
from tpuslice.planning.pools import plan_slices, pool_request
from tpuslice.render.kuberay import render_cluster, render_job
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.parts import SpecError
from tpuslice.status.kueue import with_scale_up_wait

CLUSTER = ClusterRef("ml", "llm", "uid-llm")
OTHER = Holder("ml", "other", "uid-other", "tpu-zzzzz", 0)
POOL = c.NODE_LABEL_NODEPOOL
SLICE_LEVEL = {c.KUEUE_SLICE_REQUIRED_TOPOLOGY: POOL, c.KUEUE_SLICE_SIZE: "4"}
ANNOTATIONS = "spec.worker.template.metadata.annotations"


def tsc(annotations: dict[str, str], *, kueue: bool = True, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "tpu": {"type": "v6e", "topology": "4x4", "slices": 2},
        "ray": {"version": "2.54.0"},
        "worker": {"template": {"metadata": {"annotations": annotations}}},
    }
    if kueue:
        body["kueue"] = {"queueName": "tpu"}
    body.update(spec)
    return {"metadata": {"name": "llm", "namespace": "ml", "uid": "u"}, "spec": body}


def errors(body: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as info:
        parse_cluster(body)
    return str(info.value)


# ------------------------------------------------------------ the spec


def test_slice_level_node_pool_with_the_slice_hosts_is_accepted() -> None:
    spec = parse_cluster(tsc(SLICE_LEVEL))
    assert spec.kueue_picks_pools
    assert not parse_cluster(tsc({}, kueue=True)).kueue_picks_pools


def test_required_node_pool_level_is_accepted_for_one_slice_only() -> None:
    one = tsc({c.KUEUE_REQUIRED_TOPOLOGY: POOL}, tpu={"type": "v6e", "topology": "4x4"})
    assert parse_cluster(one).kueue_picks_pools
    two = errors(tsc({c.KUEUE_REQUIRED_TOPOLOGY: POOL}))
    assert f"{ANNOTATIONS}[{c.KUEUE_REQUIRED_TOPOLOGY}]: would put every slice's pods" in two
    assert f'{c.KUEUE_SLICE_SIZE}: "4"' in two


@pytest.mark.parametrize(
    ("annotations", "spec", "expected"),
    [
        (
            SLICE_LEVEL,
            {"kueue": False},
            f"{ANNOTATIONS}[{c.KUEUE_SLICE_REQUIRED_TOPOLOGY}]: needs spec.kueue",
        ),
        (
            SLICE_LEVEL,
            {"reservation": {"policy": "None"}},
            "needs spec.reservation.policy NodePool",
        ),
        (
            {**SLICE_LEVEL, c.KUEUE_SLICE_SIZE: "2"},
            {},
            f'{ANNOTATIONS}[{c.KUEUE_SLICE_SIZE}]: must be the slice\'s hosts, "4"',
        ),
        (
            {c.KUEUE_SLICE_REQUIRED_TOPOLOGY: "cloud.google.com/gce-topology-block"},
            {},
            f"{ANNOTATIONS}[{c.KUEUE_SLICE_REQUIRED_TOPOLOGY}]: 'cloud.google.com/gce-"
            "topology-block' is not the node-pool level",
        ),
        (
            {c.KUEUE_SLICE_SIZE: "4"},
            {},
            f"{ANNOTATIONS}[{c.KUEUE_SLICE_SIZE}]: needs {c.KUEUE_SLICE_REQUIRED_TOPOLOGY}",
        ),
        (
            {c.KUEUE_PREFERRED_TOPOLOGY: POOL},
            {},
            f"{ANNOTATIONS}[{c.KUEUE_PREFERRED_TOPOLOGY}]: asks Kueue's topology-aware",
        ),
        (
            {"kueue.x-k8s.io/podset-unconstrained-topology": "true"},
            {},
            "[kueue.x-k8s.io/podset-unconstrained-topology]: asks Kueue's",
        ),
        (
            {**SLICE_LEVEL, c.KUEUE_REQUIRED_TOPOLOGY: POOL},
            {},
            f"[{c.KUEUE_REQUIRED_TOPOLOGY}]: cannot be combined",
        ),
        (
            SLICE_LEVEL,
            {"tpu": {"type": "v6e", "topology": "2x2", "slices": 2}},
            "needs multi-host slices",
        ),
    ],
)
def test_other_levels_and_forms_are_refused_naming_the_field_and_the_fix(
    annotations: dict[str, str], spec: dict[str, Any], expected: str
) -> None:
    assert expected in errors(tsc(annotations, **spec))


def test_worker_groups_judge_each_tpu_group_and_refuse_a_cpu_group() -> None:
    tpu_group = {
        "name": "trainer",
        "tpu": {"type": "v6e", "topology": "4x4", "slices": 2},
        "template": {"metadata": {"annotations": SLICE_LEVEL}},
    }
    cpu_group = {
        "name": "cpus",
        "cpu": {"replicas": 1},
        "template": {"metadata": {"annotations": SLICE_LEVEL}},
    }
    body = tsc({}, workerGroups=[tpu_group])
    del body["spec"]["tpu"], body["spec"]["worker"]
    spec = parse_cluster(body)
    assert [g.kueue_picks_pools for g in spec.tpu_groups()] == [True]
    body["spec"]["workerGroups"] = [tpu_group, cpu_group]
    refused = errors(body)
    assert f"spec.workerGroups[1].template.metadata.annotations[{c.KUEUE_SLICE_SIZE}]" in refused
    assert "spec.workerGroups[0]" not in refused


# ------------------------------------------------------------ adoption


def kueue_placed(replica: str, index: int, *pools: str) -> list[Any]:
    """A slice's pods after Kueue's ungater: still gated by the operator, pinned by
    Kueue's nodeSelector (one pool per pod, cycling through ``pools``)."""
    pods = slice_pods(replica, index)
    return [replace(p, pinned_pool=pools[i % len(pools)]) for i, p in enumerate(pods)]


def plan(**kw: Any) -> Any:
    args: dict[str, Any] = dict(
        accelerator="tpu-v6e-slice",
        topology="4x4",
        hosts=4,
        chips_per_host=4,
        desired_slices=2,
        gated=True,
        pods=[],
        nodes=nodes_of("pool-a", "pool-b", "pool-c", "pool-d"),
        reservations=[],
        kueue_pools=True,
    )
    args.update(kw)
    return plan_slices(CLUSTER, **args)


def test_each_slice_claims_exactly_the_pool_kueue_pinned_its_pods_to() -> None:
    pods = kueue_placed("tpu-aaaaa", 0, "pool-d") + kueue_placed("tpu-bbbbb", 1, "pool-c")
    result = plan(pods=pods)
    assert sorted((cl.holder.replica_name, cl.pool) for cl in result.claims) == [
        ("tpu-aaaaa", "pool-d"),
        ("tpu-bbbbb", "pool-c"),
    ]
    assert {(r.replica_name, r.pool) for r in result.releases} == {
        ("tpu-aaaaa", "pool-d"),
        ("tpu-bbbbb", "pool-c"),
    }
    # without Kueue's choice the planner picks by its own preference: other pools
    free_choice = plan(pods=[replace(p, pinned_pool=None) for p in pods], kueue_pools=False)
    assert sorted(cl.pool for cl in free_choice.claims) != ["pool-c", "pool-d"]


def test_pods_of_a_slice_on_different_pools_wait_and_claim_nothing_elsewhere() -> None:
    pods = kueue_placed("tpu-aaaaa", 0, "pool-a", "pool-b") + kueue_placed("tpu-bbbbb", 1, "pool-c")
    result = plan(pods=pods)
    assert [(cl.holder.replica_name, cl.pool) for cl in result.claims] == [("tpu-bbbbb", "pool-c")]
    waiting = result.slices[0]
    assert waiting.state == SliceState.WAITING_FOR_CAPACITY
    assert "Kueue and the operator disagree" in waiting.message
    assert "pool-a (2 pods), pool-b (2 pods)" in waiting.message


def test_pods_pinned_to_nodes_by_a_hostname_level_say_the_topology_is_wrong() -> None:
    pods = kueue_placed("tpu-aaaaa", 0, "pool-a-0", "pool-a-1", "pool-a-2", "pool-a-3")
    result = plan(pods=pods, desired_slices=1)
    assert result.claims == ()
    assert "a Topology level below the node pool" in result.slices[0].message


def test_a_pool_held_by_another_object_is_never_swapped_for_a_free_one() -> None:
    pods = kueue_placed("tpu-aaaaa", 0, "pool-a") + kueue_placed("tpu-bbbbb", 1, "pool-b")
    result = plan(pods=pods, reservations=[reservation("pool-a", OTHER)])
    assert [cl.pool for cl in result.claims] == ["pool-b"]
    assert "pool-a is held by ml/other (slice tpu-zzzzz)" in result.slices[0].message
    assert "pool-c" not in {cl.pool for cl in result.claims}


def test_a_gang_claims_nothing_while_one_slice_cannot_have_kueues_pool() -> None:
    pods = kueue_placed("tpu-aaaaa", 0, "pool-a") + kueue_placed("tpu-bbbbb", 1, "pool-b")
    result = plan(
        pods=pods,
        reservations=[reservation("pool-b", OTHER)],
        gang=GangMode.ALL_SLICES,
    )
    assert result.claims == ()
    assert "pool-b is held by ml/other" in result.slices[1].message


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        (nodes_of("pool-a", not_ready=1) + nodes_of("pool-b"), "node pool pool-a "),
        (
            nodes_of("pool-a", topology="2x4", hosts=2) + nodes_of("pool-b"),
            "pool-a has no nodes of this slice's shape",
        ),
    ],
)
def test_an_ineligible_pool_is_named_with_why(nodes: list[Any], expected: str) -> None:
    pods = kueue_placed("tpu-aaaaa", 0, "pool-a") + kueue_placed("tpu-bbbbb", 1, "pool-b")
    result = plan(pods=pods, nodes=nodes)
    assert [cl.pool for cl in result.claims] == ["pool-b"]
    assert expected in result.slices[0].message
    assert "Kueue and the operator disagree" in result.slices[0].message


def test_the_queue_still_decides_when_kueues_pool_may_be_claimed() -> None:
    pods = kueue_placed("tpu-aaaaa", 0, "pool-a") + kueue_placed("tpu-bbbbb", 1, "pool-b")
    granted = Admission(pools=("pool-b",), message="2nd of 2 waiting for v6e 4x4")
    result = plan(pods=pods, admission=granted)
    assert [cl.pool for cl in result.claims] == ["pool-b"]
    assert "the queue does not grant pool-a now: 2nd of 2" in result.slices[0].message


def test_the_queue_sets_kueues_pools_aside_first() -> None:
    pods = kueue_placed("tpu-aaaaa", 0, "pool-d") + kueue_placed("tpu-bbbbb", 1, "pool-c")
    request = pool_request(
        CLUSTER,
        hosts=4,
        desired_slices=2,
        pods=pods,
        reservations=[],
        previous_pools={0: "pool-a"},
        kueue_pools=True,
    )
    assert request.previous == ("pool-c", "pool-d")


def test_a_slice_kueue_still_gates_is_not_planned_at_all() -> None:
    gated = [replace(p, kueue_gated=True) for p in slice_pods("tpu-bbbbb", 1)]
    placed = kueue_placed("tpu-aaaaa", 0, "pool-a")
    # one pod of the second slice already ungated and placed: the slice still waits whole
    gated[0] = replace(gated[0], kueue_gated=False, pinned_pool="pool-b")
    snap = Snapshot(None, placed + gated, nodes_of("pool-a", "pool-b"), [], None)
    planned = admitted_snapshot(snap, held=False)
    assert {p.replica_name for p in planned.pods} == {"tpu-aaaaa"}
    result = plan(pods=planned.pods)
    assert [(cl.holder.replica_name, cl.pool) for cl in result.claims] == [("tpu-aaaaa", "pool-a")]


def test_a_held_slice_is_released_on_its_pool_and_choice_reads_only_live_pods() -> None:
    pods = kueue_placed("tpu-aaaaa", 0, "pool-a")
    result = plan(
        pods=pods,
        desired_slices=1,
        reservations=[reservation("pool-a", holder("tpu-aaaaa", 0))],
    )
    assert {r.pool for r in result.releases} == {"pool-a"}
    gone = [replace(pods[0], deleting=True, pinned_pool="pool-z"), *pods[1:]]
    assert kueue_choice(gone).pool == "pool-a"
    unplaced = [replace(pods[0], pinned_pool=None), *pods[1:]]
    assert kueue_choice(unplaced).pool is None
    assert "none (1 pods)" in kueue_choice(unplaced).describe()


def test_a_slice_waiting_for_kueues_ungater_says_so() -> None:
    (waiting,) = with_scale_up_wait(
        [SliceStatus(0, SliceState.WAITING_FOR_CAPACITY, "tpu-aaaaa", None)], topology=True
    )
    assert f"carry the {c.KUEUE_TOPOLOGY_GATE} gate" in waiting.message
    assert "scale-up" not in waiting.message


# ------------------------------------------------------------ the applier keeps Kueue's gate


def admitted_by_kueue(rendered: dict[str, Any]) -> dict[str, Any]:
    """``rendered`` as Kueue leaves it at admission (podset.Merge): its pod-set label,
    Workload annotation and topology gate on the TPU worker template."""
    live = copy.deepcopy(rendered)
    spec = live["spec"].get("rayClusterSpec") or live["spec"]
    template = spec["workerGroupSpecs"][0]["template"]
    template.setdefault("metadata", {}).setdefault("labels", {})["kueue.x-k8s.io/podset"] = "tpu"
    template["metadata"].setdefault("annotations", {})["kueue.x-k8s.io/workload"] = "wl"
    template["spec"].setdefault("schedulingGates", []).append({"name": c.KUEUE_TOPOLOGY_GATE})
    live["spec"]["suspend"] = False
    return live


@pytest.mark.parametrize("render", [render_cluster, render_job])
def test_an_apply_carries_kueues_template_additions(render: Any) -> None:
    body = tsc(SLICE_LEVEL)
    body["spec"]["job"] = {"entrypoint": "python train.py"} if render is render_job else None
    if render is render_cluster:
        del body["spec"]["job"]
    rendered = render(body)
    live = raycluster_info(admitted_by_kueue(rendered))
    assert not is_subset({"spec": rendered["spec"]}, live)  # the gate list differs
    carried = with_kueue_admission(rendered, live)
    spec = carried["spec"].get("rayClusterSpec") or carried["spec"]
    template = spec["workerGroupSpecs"][0]["template"]
    assert template["spec"]["schedulingGates"][-1] == {"name": c.KUEUE_TOPOLOGY_GATE}
    assert template["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "tpu"
    assert template["metadata"]["annotations"]["kueue.x-k8s.io/workload"] == "wl"
    without_suspend = {k: v for k, v in carried["spec"].items() if k != "suspend"}
    assert is_subset({"spec": without_suspend}, live)
    assert with_kueue_admission(rendered, None) == rendered
