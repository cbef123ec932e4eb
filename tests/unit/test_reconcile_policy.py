"""TPUSlicePolicy enforced by the pass: one pass through the real Reconciler against the
fake API (refusals, the clamped priority in the queue, the pools a slice may claim,
namespace limits), and no policy leaves the pass as it was."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.support.builders import holder, node, nodes_of, reservation
from tests.support.fake_kube import FakeKube
from tests.unit.test_reconcile import conditions_of, kinds
from tests.unit.test_reconcile_queue import HELD_B, body, claims, gang_pods, run
from tpuslice.model.records import ShapeMember, Snapshot, Taint, Usage
from tpuslice.policy.placement import (
    excluded_pools,
    slice_chips,
    tolerates,
    usage_by_namespace,
    worker_tolerations,
)
from tpuslice.policy.records import Policy, parse_policy, read_policy
from tpuslice.spec.cluster import parse_cluster

TEAM = {"team": "research"}


def policy(name: str = "research", **spec: Any) -> Policy:
    return parse_policy(
        {
            "metadata": {"name": name},
            "spec": {"namespaceSelector": {"matchLabels": TEAM}, **spec},
        }
    )


def one_slice(**spec: Any) -> dict[str, Any]:
    return {
        "tpu": {"type": "v6e", "topology": "4x4", "slices": 1},
        "ray": {"version": "2.54.0"},
        **spec,
    }


def snap_of(b: dict[str, Any], **fields: Any) -> Snapshot:
    """``ml/llm`` with one slice's gated pods and two free pools, plus ``fields``."""
    defaults: dict[str, Any] = {
        "cluster": b,
        "pods": gang_pods(replicas=1),
        "nodes": nodes_of("pool-a") + nodes_of("pool-b"),
        "reservations": [],
        "raycluster": None,
    }
    return Snapshot(**{**defaults, **fields})


def stalled(kube: FakeKube) -> tuple[str, str, str]:
    return conditions_of(kube.status)["Stalled"]


def test_no_policy_is_todays_pass() -> None:
    b = body()
    b["spec"] = one_slice()
    kube = run(snap_of(b, namespace_labels={"any": "thing"}))
    assert "apply" in kinds(kube) and len(claims(kube)) == 1


def test_a_namespace_no_policy_selects_is_denied_and_nothing_is_applied_or_claimed() -> None:
    b = body()
    b["spec"] = one_slice()
    kube = run(snap_of(b, policies=[policy()], namespace_labels={"team": "other"}))
    status, reason, message = stalled(kube)
    assert (status, reason) == ("True", "PolicyDenied")
    assert "research" in message and "metadata.namespace" in message
    assert "apply" not in kinds(kube) and claims(kube) == []
    assert ("event", "PolicyDenied") in kube.calls


def test_a_privileged_worker_template_is_refused_naming_the_field_and_the_policy() -> None:
    b = body()
    privileged = {"containers": [{"name": "ray-worker", "securityContext": {"privileged": True}}]}
    b["spec"] = one_slice(worker={"template": {"spec": privileged}})
    snap = snap_of(
        b, policies=[policy(podTemplate={"podSecurity": "baseline"})], namespace_labels=TEAM
    )
    kube = run(snap)
    status, reason, message = stalled(kube)
    assert (status, reason) == ("True", "PolicyViolation")
    assert "spec.worker.template.spec.containers[0].securityContext.privileged" in message
    assert "TPUSlicePolicy research" in message and "baseline" in message
    assert "apply" not in kinds(kube) and claims(kube) == []


def test_a_refused_object_that_was_admitted_keeps_its_pools_and_gives_back_empty_ones() -> None:
    b = body()
    b["spec"] = one_slice(reservation={"priority": 1})
    pods = gang_pods(replicas=1)  # slice tpu-llm0 has pods: its pool stays
    gone = holder("tpu-gone", 1)  # a slice without pods: its pool goes back
    held = [
        reservation("pool-a", holder(pods[0].replica_name or ""), uid="r-a"),
        reservation("pool-b", gone, uid="r-b"),
    ]
    snap = snap_of(
        b,
        pods=pods,
        reservations=held,
        policies=[policy(limits={"slicesPerObject": 0})],
        namespace_labels=TEAM,
    )
    kube = run(snap)
    assert stalled(kube)[:2] == ("True", "PolicyViolation")
    assert [c for c in kube.calls if c[0] == "free"] == [("free", "pool-b")]
    assert "apply" not in kinds(kube) and claims(kube) == []


def test_a_policy_that_cannot_be_parsed_fails_closed_for_the_namespaces_it_selects() -> None:
    broken = read_policy(
        {
            "metadata": {"name": "research"},
            "spec": {"namespaceSelector": {"matchLabels": TEAM}, "limits": {"slicesPerObject": -1}},
        }
    )
    assert broken.invalid and "spec.limits.slicesPerObject" in broken.invalid
    b = body()
    b["spec"] = one_slice()
    kube = run(snap_of(b, policies=[broken], namespace_labels=TEAM))
    status, reason, message = stalled(kube)
    assert (status, reason) == ("True", "PolicyViolation")
    assert "spec.limits.slicesPerObject" in message and claims(kube) == []
    with pytest.raises(ValueError, match="namespaceSelector"):
        read_policy({"metadata": {"name": "x"}, "spec": {"namespaceSelector": "nope"}})


def test_the_queue_uses_the_clamped_priority_of_every_member() -> None:
    # early asks 1000 but its policy allows at most 5; late asks 10 in a namespace of
    # no priority range: clamped, early no longer goes first
    early = body("early", "uid-early", "2026-01-01T00:00:00Z")
    early["spec"] = one_slice(reservation={"priority": 1000})
    early["metadata"]["namespace"] = "capped"
    early_pods = [replace(p, namespace="capped") for p in gang_pods("early", replicas=1)]
    late = body("late", "uid-late", "2026-01-02T00:00:00Z", reservation={"priority": 10})
    capped = policy(
        "capped", namespaceSelector={"matchLabels": {"tier": "low"}}, priority={"max": 5}
    )
    open_ = policy("open", namespaceSelector={"matchLabels": TEAM})
    snap = Snapshot(
        late,
        gang_pods("late", replicas=1),
        nodes_of("pool-a") + nodes_of("pool-b"),
        [HELD_B],
        None,
        shape_members=[ShapeMember(early, early_pods, namespace_labels={"tier": "low"})],
        policies=[capped, open_],
        namespace_labels=TEAM,
    )
    assert claims(run(snap, key=("TPUSliceCluster", "ml", "late"))) == ["pool-a"]
    # without the clamp the earlier, higher one is first and late waits
    unclamped = replace(snap, policies=[policy("capped", namespaceSelector={}), open_])
    assert claims(run(unclamped, key=("TPUSliceCluster", "ml", "late"))) == []


def test_a_pool_without_the_policys_labels_is_never_claimed() -> None:
    b = body()
    b["spec"] = one_slice()
    labelled = nodes_of("pool-b", labels={"tpuslice.dev/team": "research"})
    snap = snap_of(
        b,
        nodes=nodes_of("pool-a") + labelled,
        policies=[policy(pools={"nodeSelector": {"tpuslice.dev/team": "research"}})],
        namespace_labels=TEAM,
    )
    assert claims(run(snap)) == ["pool-b"]
    only_unlabelled = replace(snap, nodes=nodes_of("pool-a"))
    kube = run(only_unlabelled)
    assert claims(kube) == [] and "apply" in kinds(kube)


def test_a_pool_with_a_taint_the_workers_do_not_tolerate_is_never_claimed() -> None:
    b = body()
    b["spec"] = one_slice()
    gpu = Taint("dedicated", "inference", "NoSchedule")
    snap = snap_of(b, nodes=nodes_of("pool-a", taints=(gpu,)) + nodes_of("pool-b"))
    assert claims(run(snap)) == ["pool-b"]
    tolerating = {
        "template": {
            "spec": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]},
        }
    }
    b["spec"] = one_slice(worker=tolerating)
    only_a = replace(snap, cluster=b, nodes=nodes_of("pool-a", taints=(gpu,)))
    assert claims(run(only_a)) == ["pool-a"]


def test_an_object_at_its_namespaces_limit_waits_and_holds_nobody_back() -> None:
    limited = policy(limits={"slicesPerNamespace": 1})
    b = body()
    b["spec"] = one_slice()
    kube = run(snap_of(b, policies=[limited], namespace_labels=TEAM, namespace_usage=Usage(1, 16)))
    assert claims(kube) == []
    assert kube.status is not None
    (slice_,) = kube.status["slices"]
    assert slice_["state"] == "WaitingForCapacity"
    assert "spec.limits.slicesPerNamespace 1" in slice_["message"]
    assert "TPUSlicePolicy research" in slice_["message"]
    # an earlier member of the shape at its namespace's limit does not hold a later one back
    early = body("early", "uid-early", "2026-01-01T00:00:00Z")
    early["spec"] = one_slice()
    late = body("late", "uid-late", "2026-01-02T00:00:00Z")
    late["spec"] = one_slice()
    late["metadata"]["namespace"] = "free"
    free = policy("free", namespaceSelector={"matchLabels": {"team": "free"}})
    members = [
        ShapeMember(
            early,
            gang_pods("early", replicas=1),
            namespace_labels=TEAM,
            namespace_usage=Usage(1, 16),
        )
    ]
    snap = Snapshot(
        late,
        [replace(p, namespace="free") for p in gang_pods("late", replicas=1)],
        nodes_of("pool-a") + nodes_of("pool-b"),
        [HELD_B],
        None,
        shape_members=members,
        policies=[limited, free],
        namespace_labels={"team": "free"},
    )
    assert claims(run(snap, key=("TPUSliceCluster", "free", "late"))) == ["pool-a"]
    # under the limit, the earlier member goes first again
    members[0] = replace(members[0], namespace_usage=Usage(0, 0))
    waiting = replace(snap, shape_members=members)
    assert claims(run(waiting, key=("TPUSliceCluster", "free", "late"))) == []


def test_tolerations_follow_kubernetes_matching() -> None:
    taint = Taint("dedicated", "a", "NoSchedule")
    assert tolerates({"key": "dedicated", "value": "a"}, taint)
    assert not tolerates({"key": "dedicated", "value": "b"}, taint)
    assert tolerates({"operator": "Exists"}, taint)
    assert not tolerates({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, taint)
    spec = parse_cluster(body())
    # the operator's own TPU toleration, and node lifecycle taints are not judged here
    tpu = node("n", "p", taints=(Taint("google.com/tpu", "present", "NoSchedule"),))
    not_ready = node("m", "q", taints=(Taint("node.kubernetes.io/not-ready", "", "NoSchedule"),))
    assert excluded_pools({"p": [tpu], "q": [not_ready]}, (), worker_tolerations(spec)) == set()


def test_namespace_usage_counts_each_reservation_with_its_shapes_chips() -> None:
    by_shape = {
        ("tpu-v6e-slice", "4x4"): [reservation("a"), reservation("b", holder(namespace="x"))],
        ("tpu-v5p-slice", "2x2x4"): [reservation("c")],
    }
    assert usage_by_namespace(by_shape) == {"ml": Usage(2, 32), "x": Usage(1, 16)}
    assert slice_chips(("tpu-v6e-slice", "bogus")) == 0
