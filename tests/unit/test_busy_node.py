"""A single-host slice whose node is held by pods the operator did not place moves.

The rule over time with an injected clock (``planning.busy``), and the pass through
the real ``Reconciler``: a released pod Unschedulable for 61 s loses its node and
reservation, the status says why and keeps the node in ``busyNodes``, and the next
pass claims another node, never the busy one; at 59 s nothing moves."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.support.builders import node, pod, tpu, tpuslice
from tests.support.fake_kube import FakeKube
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model import constants as c
from tpuslice.model.convert import pod_info
from tpuslice.model.records import Holder, NodeInfo, PodInfo, ReservationInfo, Snapshot
from tpuslice.planning.busy import (
    BUSY_NODES_KEPT,
    avoided_nodes,
    busy_move,
    busy_nodes_status,
    move_message,
    unschedulable_for,
)

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
KEY = ("TPUSliceCluster", "ml", "llm")
BUSY = "gke-v6e-single-0"


def stamp(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def nodes(count: int = 2) -> list[NodeInfo]:
    return [node(f"gke-v6e-single-{i}", "v6e-single", topology="2x2") for i in range(count)]


def body(status: dict[str, Any] | None = None) -> dict[str, Any]:
    out = tpuslice(name="llm", uid="uid-llm", generation=1, tpu=tpu(topology="2x2", slices=1))
    if status is not None:
        out["status"] = status
    return out


def released(
    unschedulable_ago: float | None, *, released_ago: float = 3600.0, name: str = "llm-w-0"
) -> PodInfo:
    """The slice's one pod, released and pinned to the busy node; the scheduler said
    Unschedulable that long ago (None: it did not), and it was released that long ago."""
    return pod(
        name,
        replica=None,
        index=0,
        host=None,
        gated=False,
        pool=BUSY,
        unschedulable_since="" if unschedulable_ago is None else stamp(unschedulable_ago),
        released_at=stamp(released_ago),
    )


def held() -> ReservationInfo:
    return ReservationInfo(BUSY, Holder("ml", "llm", "uid-llm", "llm-w-0", 0), uid="r-0")


def run(snap: Snapshot) -> FakeKube:
    kube = FakeKube()
    reconciler = Reconciler(kube, lambda _: snap)
    reconciler.actuator.clock = lambda: NOW
    reconciler.status.fold_max_seconds = 0.0  # write at once what the pass computed
    asyncio.run(reconciler.kick(KEY))
    return kube


# ---------------------------------------------------------------- the rule over time


def test_the_wait_counts_from_the_release_not_from_the_gated_condition() -> None:
    # the condition keeps the SchedulingGated time (creation) when it turns Unschedulable
    pinned = released(3600.0, released_ago=30.0)
    assert unschedulable_for(pinned, NOW) == 30.0
    assert unschedulable_for(released(61.0, released_ago=3600.0), NOW) == 61.0


def test_a_gated_or_schedulable_pod_is_never_waiting() -> None:
    assert unschedulable_for(released(None), NOW) is None
    gated = pod("w", replica=None, host=None, unschedulable_since=stamp(600))
    assert unschedulable_for(gated, NOW) is None


def test_a_slice_moves_after_sixty_seconds_and_not_before() -> None:
    move, due = busy_move(BUSY, "llm-w-0", [released(59.0)], NOW)
    assert move is None and due == 1.0
    move, due = busy_move(BUSY, "llm-w-0", [released(61.0)], NOW)
    assert move is not None and due is None
    assert move.pool == BUSY and move.pods == (("ml", "llm-w-0"),)


def test_the_move_says_why_the_node_cannot_take_the_pod() -> None:
    """The scheduler's Unschedulable has several causes on a held node: the message names
    the one the node shows (gone, not ready, cordoned), else the node is taken."""
    waited = [released(61.0)]
    cases = [
        (None, "is gone"),
        (node(BUSY, "v6e-single", topology="2x2", ready=False), "is not ready"),
        (node(BUSY, "v6e-single", topology="2x2", schedulable=False), "is cordoned"),
        (node(BUSY, "v6e-single", topology="2x2"), "is taken by pods the operator did not place"),
    ]
    for shown, why in cases:
        move, _ = busy_move(BUSY, "llm-w-0", waited, NOW, shown)
        assert move is not None and move.why == why
        assert move_message(move).startswith(f"node {BUSY} {why} (the released pod")


def test_a_pod_pinned_elsewhere_does_not_move_the_slice() -> None:
    assert busy_move("gke-v6e-single-1", "llm-w-0", [released(600.0)], NOW) == (None, None)


def test_busy_nodes_are_remembered_ten_minutes_sixteen_at_most_newest_first() -> None:
    previous = {
        "busyNodes": [
            {"node": "old", "since": stamp(601)},
            {"node": "recent", "since": stamp(300)},
            {"node": 7, "since": stamp(1)},  # not a node name: dropped
        ]
    }
    assert avoided_nodes(previous, NOW) == {"recent"}
    out = busy_nodes_status(previous, ["new"], NOW)
    assert out == [
        {"node": "new", "since": stamp(0)},
        {"node": "recent", "since": stamp(300)},
    ]
    many = busy_nodes_status({}, [f"n{i:02d}" for i in range(40)], NOW)
    assert many is not None and len(many) == BUSY_NODES_KEPT


def test_the_field_appears_only_once_a_node_was_busy_and_then_stays_empty() -> None:
    assert busy_nodes_status({}, [], NOW) is None
    expired = {"busyNodes": [{"node": "old", "since": stamp(601)}]}
    assert busy_nodes_status(expired, [], NOW) == []


def test_pod_info_reads_unschedulable_and_the_release_time() -> None:
    obj = {
        "metadata": {
            "name": "w",
            "namespace": "ml",
            "annotations": {c.ANNOTATION_RELEASED_AT: stamp(5)},
        },
        "spec": {"nodeSelector": {"kubernetes.io/hostname": BUSY}},
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "lastTransitionTime": stamp(90),
                }
            ]
        },
    }
    info = pod_info(obj)
    assert info.unschedulable_since == stamp(90)
    assert info.released_at == stamp(5)
    gated = {**obj, "status": {"conditions": [{**obj["status"]["conditions"][0]}]}}
    gated["status"]["conditions"][0]["reason"] = "SchedulingGated"
    assert pod_info(gated).unschedulable_since == ""


# ---------------------------------------------------------------- through the pass


def test_unschedulable_for_61s_frees_the_node_deletes_the_pod_and_says_why() -> None:
    kube = run(Snapshot(body(), [released(61.0)], nodes(), [held()], None))
    assert ("delete-pod", "llm-w-0") in kube.calls
    assert ("free", BUSY) in kube.calls
    deleted = kube.calls.index(("delete-pod", "llm-w-0"))
    assert deleted < kube.calls.index(("free", BUSY))  # the pod first: never free unheld
    assert kube.claimed == {}  # not back onto the busy node, nor another before KubeRay
    assert ("event", "SliceMovedOffBusyNode") in kube.calls
    assert kube.status is not None
    (entry,) = kube.status["slices"]
    assert entry["state"] == "Releasing"
    assert entry["message"] == (
        f"node {BUSY} is taken by pods the operator did not place (the released pod "
        "could not schedule for 60s); moving to another node"
    )
    assert kube.status["busyNodes"] == [{"node": BUSY, "since": stamp(0)}]


def test_unschedulable_for_59s_changes_nothing() -> None:
    kube = run(Snapshot(body(), [released(59.0)], nodes(), [held()], None))
    assert not any(call[0] in ("delete-pod", "free", "claim") for call in kube.calls)
    assert kube.status is not None
    assert "busyNodes" not in kube.status
    assert kube.status["slices"][0]["state"] == "Scheduled"


def test_the_next_pass_claims_another_node_and_never_the_busy_one() -> None:
    first = run(Snapshot(body(), [released(61.0)], nodes(), [held()], None))
    assert first.status is not None
    recreated = pod("llm-w-1", replica=None, index=0, host=None)  # KubeRay's, gated
    kube = run(Snapshot(body(first.status), [recreated], nodes(), [], None))
    assert list(kube.claimed) == ["gke-v6e-single-1"]
    assert kube.selectors == {"llm-w-1": {"kubernetes.io/hostname": "gke-v6e-single-1"}}
    # the release says when, so the wait is counted from it next time
    assert kube.annotations["llm-w-1"][c.ANNOTATION_RELEASED_AT] == stamp(0)
    assert kube.status is not None
    assert kube.status["busyNodes"] == first.status["busyNodes"]


def test_with_only_the_busy_node_left_the_slice_waits_instead_of_going_back() -> None:
    first = run(Snapshot(body(), [released(61.0)], nodes(1), [held()], None))
    assert first.status is not None
    recreated = pod("llm-w-1", replica=None, index=0, host=None)
    kube = run(Snapshot(body(first.status), [recreated], nodes(1), [], None))
    assert kube.claimed == {}
    assert kube.status is not None
    assert kube.status["slices"][0]["state"] == "WaitingForCapacity"
