"""An elastic set's scale-up timeout and removals by the Ray autoscaler: what status
shows and which events are posted (once each), and the queue place of a slice the
autoscaler asks for again."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.support.builders import holder, nodes_of, reservation, slice_pods, tpuslice
from tests.support.fake_kube import FakeKube
from tests.unit.test_reconcile import UID, make, run
from tests.unit.test_service_status import ACTIVE, ray
from tests.unit.test_service_status import observed as service_observed
from tests.unit.test_slicequeue import req
from tests.unit.test_status import observed
from tpuslice.controller.applier import applied_hash
from tpuslice.model import constants as c
from tpuslice.model import events
from tpuslice.model.convert import raycluster_info, rfc3339
from tpuslice.model.records import SliceState, SliceStatus, Snapshot
from tpuslice.planning.elastic import (
    named_for_deletion,
    next_timeout_in,
    timed_out,
    workers_to_delete,
)
from tpuslice.planning.queue import queue_order
from tpuslice.render.kuberay import render_cluster
from tpuslice.status.conditions import (
    ElasticCount,
    as_requested,
    compute_status,
    elastic_slices,
    removal_events,
)
from tpuslice.status.service import compute_service_status

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
SLICES = (
    SliceStatus(0, SliceState.READY, "tpu-aaaaa", "pool-a", 4),
    SliceStatus(1, SliceState.REQUESTED, "tpu-bbbbb"),
    SliceStatus(2, SliceState.PROVISIONING, "tpu-ccccc"),
)


def pods_made(ago: dict[str, float]) -> list[Any]:
    """The pods of each replica made ``ago[replica]`` seconds before NOW."""
    out = []
    for index, (replica, seconds) in enumerate(ago.items()):
        out += slice_pods(replica, index, created=rfc3339(NOW - timedelta(seconds=seconds)))
    return out


# --- the timeout ----------------------------------------------------------------------


def test_a_waiting_extra_past_the_timeout_is_found_from_its_pods() -> None:
    pods = pods_made({"tpu-aaaaa": 9000, "tpu-bbbbb": 3700, "tpu-ccccc": 600})
    late = timed_out(SLICES, pods, 1, None, NOW)  # Ray's default, 3600 s
    assert [(t.index, t.replica) for t in late] == [(1, "tpu-bbbbb")]
    assert late[0].since == NOW - timedelta(seconds=3700)
    assert [t.index for t in timed_out(SLICES, pods, 1, 300, NOW)] == [1, 2]
    assert timed_out(SLICES, pods, 1, 7200, NOW) == ()
    # a slice of the minimum never times out (the autoscaler keeps minReplicas)
    assert timed_out(SLICES, pods, 3, 300, NOW) == ()


def test_a_pass_is_due_when_the_next_extra_passes_the_timeout() -> None:
    pods = pods_made({"tpu-aaaaa": 9000, "tpu-bbbbb": 3700, "tpu-ccccc": 600})
    assert next_timeout_in(SLICES, pods, 1, None, NOW) == 3000.0
    assert next_timeout_in(SLICES, pods, 1, 60, NOW) is None  # both are past it


def test_the_autoscalers_new_pods_start_the_wait_afresh() -> None:
    """Given up and asked again: a new replica with new pods, nothing timed out."""
    again = (SLICES[0], SliceStatus(1, SliceState.REQUESTED, "tpu-ddddd"))
    pods = pods_made({"tpu-aaaaa": 9000, "tpu-ddddd": 5})
    assert timed_out(again, pods, 1, 600, NOW) == ()


def _observed(timed: tuple[tuple[int, str], ...], removing: Any = ()) -> Any:
    base = observed(SliceState.READY, SliceState.WAITING_FOR_CAPACITY, ray_cluster_ready=True)
    return replace(
        base,
        slices=as_requested(base.slices, 1),
        elastic=ElasticCount(1, 4, 2, removing=removing, timed_out=timed, timeout_seconds=1800),
    )


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(x for x in status["conditions"] if x["type"] == kind)


def test_scale_up_timed_out_names_the_slice_and_how_long() -> None:
    status = compute_status(_observed(((1, "2026-11-30T11:00:00Z"),)), None, "t")
    cond = _condition(status, events.SCALE_UP_TIMED_OUT)
    assert (cond["status"], cond["reason"]) == ("True", "ScaleUpTimedOut")
    assert "slice 1 (waiting since 2026-11-30T11:00:00Z)" in cond["message"]
    assert "1800 s" in cond["message"]
    assert _condition(status, "Ready")["status"] == "True"  # the minimum still runs
    quiet = compute_status(_observed(()), None, "t")
    assert _condition(quiet, events.SCALE_UP_TIMED_OUT)["status"] == "False"
    # the same input writes the same status: no time-based churn
    assert compute_status(_observed(((1, "2026-11-30T11:00:00Z"),)), status, "t2") == status


# --- removals -------------------------------------------------------------------------


def test_the_slices_named_in_workers_to_delete() -> None:
    rc = {
        "spec": {
            "workerGroupSpecs": [
                {
                    "groupName": c.WORKER_GROUP,
                    "scaleStrategy": {"workersToDelete": ["llm-tpu-ccccc-2", "gone-pod"]},
                }
            ]
        }
    }
    named = workers_to_delete(rc)
    assert named == {"llm-tpu-ccccc-2", "gone-pod"}
    pods = slice_pods("tpu-aaaaa", 0) + slice_pods("tpu-ccccc", 2)
    assert named_for_deletion(named, pods) == ((2, "tpu-ccccc"),)
    assert workers_to_delete(None) == frozenset()
    assert workers_to_delete({"spec": {"workerGroupSpecs": [{"groupName": c.WORKER_GROUP}]}}) == (
        frozenset()
    )


def test_a_removal_is_announced_once() -> None:
    before = compute_status(_observed(()), None, "t")
    during = compute_status(_observed((), removing=((1, "tpu-1"),)), before, "t")
    assert during["elastic"]["removing"] == [{"index": 1, "replica": "tpu-1"}]
    (event,) = removal_events(before, during)
    assert event[1] == events.SLICE_REMOVED_BY_AUTOSCALER and "slice 1 (tpu-1)" in event[2]
    assert removal_events(during, during) == []  # a repeated pass posts nothing
    after = compute_status(_observed(()), during, "t")
    assert removal_events(during, after) == []  # gone after being seen named


def test_a_slice_gone_unseen_while_the_target_fell_is_announced() -> None:
    """The autoscaler named hosts of two slices: replicas fell by one (floor division)
    and KubeRay deleted both while the operator was away."""
    previous = {
        "elastic": {"target": 3},
        "slices": [{"index": i, "replica": f"tpu-{i}"} for i in range(3)],
    }
    status = {"elastic": {"target": 2}, "slices": [{"index": 0, "replica": "tpu-0"}]}
    found = removal_events(previous, status)
    assert [e[1] for e in found] == [events.SLICE_REMOVED_BY_AUTOSCALER] * 2
    assert "from 3 to 2" in found[0][2]
    # the same slices gone with the target unchanged (a drain, a failure): not the autoscaler
    assert removal_events({**previous, "elastic": {"target": 2}}, status) == []


def test_the_pass_reports_a_removal_and_its_event() -> None:
    body = tpuslice(uid=UID, generation=2, elastic={"minSlices": 1, "maxSlices": 4})
    rendered = render_cluster(body)
    rendered["metadata"]["annotations"] = {"tpuslice.dev/applied-hash": applied_hash(rendered)}
    group = rendered["spec"]["workerGroupSpecs"][0]
    group["replicas"] = 1
    group["scaleStrategy"] = {"workersToDelete": ["llm-tpu-bbbbb-0"]}
    live = raycluster_info({**rendered, "status": {"state": "ready"}})
    held = [
        reservation("pool-a", holder("tpu-aaaaa", 0, uid=UID)),
        reservation("pool-b", holder("tpu-bbbbb", 1, uid=UID)),
    ]
    pods = slice_pods("tpu-aaaaa", 0) + slice_pods("tpu-bbbbb", 1)
    kube = FakeKube()
    run(make(kube, Snapshot(body, pods, nodes_of("pool-a") + nodes_of("pool-b"), held, live)))
    assert kube.status is not None
    assert kube.status["elastic"]["removing"] == [{"index": 1, "replica": "tpu-bbbbb"}]
    assert ("event", events.SLICE_REMOVED_BY_AUTOSCALER) in kube.calls


def test_the_pass_shows_a_timed_out_extra() -> None:
    body = tpuslice(
        uid=UID,
        generation=2,
        elastic={"minSlices": 1, "maxSlices": 4, "scaleUpTimeoutSeconds": 600},
    )
    rendered = render_cluster(body)
    rendered["metadata"]["annotations"] = {"tpuslice.dev/applied-hash": applied_hash(rendered)}
    rendered["spec"]["workerGroupSpecs"][0]["replicas"] = 2
    live = raycluster_info({**rendered, "status": {"state": "ready"}})
    made = rfc3339(datetime.now(UTC) - timedelta(hours=1))
    pods = slice_pods("tpu-aaaaa", 0, created=made) + slice_pods("tpu-bbbbb", 1, created=made)
    held = [reservation("pool-a", holder("tpu-aaaaa", 0, uid=UID))]
    kube = FakeKube()
    run(make(kube, Snapshot(body, pods, nodes_of("pool-a"), held, live)))
    assert kube.status is not None
    cond = _condition(kube.status, events.SCALE_UP_TIMED_OUT)
    assert cond["status"] == "True" and "slice 1" in cond["message"], cond
    assert ("event", events.SCALE_UP_TIMED_OUT) in kube.calls


# --- the queue place ------------------------------------------------------------------


def test_an_extra_asked_for_again_keeps_its_objects_place() -> None:
    """The queue ranks by the object's creationTimestamp, not by its pods': an older
    elastic object whose extra the autoscaler re-asked for (new pods) still goes before
    a younger object's extra that has waited longer."""
    older = req("old", 2, t=1, held=1, claimable=1, extra=True)
    younger = req("new", 2, t=2, held=1, claimable=1, extra=True)
    assert [r.key[2] for r in queue_order([younger, older])] == ["old", "new"]


# --- jobs and services ----------------------------------------------------------------


def test_a_service_shows_its_serving_clusters_requested_slices_and_range() -> None:
    slices = [
        SliceStatus(0, SliceState.READY, "tpu-a", "pool-a", 4),
        SliceStatus(1, SliceState.WAITING_FOR_CAPACITY, "tpu-b", message="needs a pool"),
    ]
    active = elastic_slices(ACTIVE, 2, slices, True, (1, 4))
    active = replace(
        active, elastic=replace(active.elastic, timed_out=((1, "2026-11-30T11:00:00Z"),))
    )
    status = compute_service_status(service_observed(ray("True", active=ACTIVE), active), None, "t")
    assert status["sliceReadiness"] == "1/2 (1-4)" and status["desiredSlices"] == 2
    assert [s["state"] for s in status["activeCluster"]["slices"]] == ["Ready", "Requested"]
    assert _condition(status, "Ready")["status"] == "True"
    scaling = _condition(status, "ScalingUp")
    assert (scaling["status"], scaling["reason"]) == ("True", "SlicesRequested")
    assert "slice 1" in scaling["message"]
    assert _condition(status, events.SCALE_UP_TIMED_OUT)["status"] == "True"


def test_a_service_clusters_removal_is_announced_once_across_an_upgrade() -> None:
    entry = {"name": "llm-x", "elastic": {"target": 1, "removing": [{"index": 1, "replica": "r"}]}}
    before: dict[str, Any] = {"pendingCluster": {"name": "llm-x", "elastic": {"target": 2}}}
    (event,) = removal_events(before, {"pendingCluster": entry})
    assert event[1] == events.SLICE_REMOVED_BY_AUTOSCALER
    # the pending cluster became the active one: the same removal is not posted again
    assert removal_events({"pendingCluster": entry}, {"activeCluster": entry}) == []
