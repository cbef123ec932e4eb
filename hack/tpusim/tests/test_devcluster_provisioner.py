"""The fake GKE provisioner's decisions (tpusim.provreq) and its CRD, without a cluster.

Each test walks a request through time with ``run``: ``decide`` is asked what GKE does
next, and its decision is applied to the request as the provisioner would write it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import celpy
import jsonschema
import pytest

from tests.support.crd import to_jsonschema
from tpusim.nodepools import pool_nodes
from tpusim.provisioner import load_crd
from tpusim.provreq import (
    BEST_EFFORT_CLASS,
    CHECK_CAPACITY_CLASS,
    FAULT_ANNOTATION,
    POOLS_ANNOTATION,
    PROVISIONING_REQUEST_LABEL,
    QUEUED_CLASS,
    QUEUED_TAINT,
    REVOKE_ANNOTATION,
    Decision,
    Fault,
    FaultRule,
    NodeView,
    PoolView,
    Request,
    Shape,
    Timings,
    choose_fault,
    decide,
    free_nodes,
    orphan_pools_to_remove,
    parse_fault,
    parse_request,
    parse_rules,
    pool_for,
    resize_request_name,
    template_shape,
)

T0 = 1_800_000_000.0
FAST = Timings(
    accept_delay_s=1, provision_delay_s=3, booking_s=60, pending_retry_s=20, scale_down_delay_s=5
)
V6E = {
    "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
    "cloud.google.com/gke-tpu-topology": "4x4",
}
TPU_TOLERATION = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}


def template(
    selector: dict[str, str] | None = None,
    chips: int | None = 4,
    tolerations: list[dict[str, Any]] | None = None,
    not_in: list[str] | None = None,
) -> dict[str, Any]:
    resources = {"requests": {"google.com/tpu": str(chips)}} if chips is not None else {}
    spec: dict[str, Any] = {
        "nodeSelector": dict(V6E if selector is None else selector),
        "tolerations": [TPU_TOLERATION] if tolerations is None else tolerations,
        "containers": [{"name": "w", "image": "x", "resources": resources}],
    }
    if not_in:
        expr = {"key": "cloud.google.com/gke-nodepool", "operator": "NotIn", "values": not_in}
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [expr]}]
                }
            }
        }
    return {"metadata": {"name": "t", "namespace": "ns"}, "template": {"spec": spec}}


def shape(**kw: Any) -> Shape:
    result = template_shape(template(**kw))
    assert isinstance(result, Shape), result
    return result


def request(
    cls: str = QUEUED_CLASS,
    pod_sets: int = 1,
    count: int = 4,
    parameters: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Request:
    return parse_request(
        {
            "metadata": {
                "namespace": "ns",
                "name": "slice-0",
                "uid": "u1",
                "creationTimestamp": "2027-01-15T08:00:00Z",
                "annotations": annotations or {},
            },
            "spec": {
                "provisioningClassName": cls,
                "podSets": [{"podTemplateRef": {"name": "t"}, "count": count}] * pod_sets,
                "parameters": parameters or {},
            },
        }
    )


CREATED = request().created


def apply(req: Request, d: Decision) -> Request:
    conditions = dict(req.conditions)
    for cond in d.conditions:
        conditions[cond.type] = cond
    annotations = {k: v for k, v in {**req.annotations, **d.annotations}.items() if v is not None}
    details = {**req.details, **(d.details or {})}
    return dataclasses.replace(req, conditions=conditions, annotations=annotations, details=details)


NO_FAULT = Fault()


def run(req: Request, at: float, fault: Fault = NO_FAULT, **kw: Any) -> tuple[Request, Decision]:
    kw.setdefault("shapes", [shape()] * len(req.pod_sets))
    kw.setdefault("pools", [])
    d = decide(req, now=CREATED + at, timings=FAST, fault=fault, **kw)
    return apply(req, d), d


def status(req: Request) -> dict[str, tuple[str, str]]:
    return {k: (c.status, c.reason) for k, c in req.conditions.items()}


# ---------------------------------------------------------------- the CRD


def test_crd_schema_matches_upstream_limits() -> None:
    crd = load_crd()
    assert crd["spec"]["group"] == "autoscaling.x-k8s.io"
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["shortNames"] == ["provreq", "provreqs"]
    v1, v1beta1 = crd["spec"]["versions"]
    assert (v1["name"], v1["storage"], v1beta1["name"], v1beta1["storage"]) == (
        "v1",
        True,
        "v1beta1",
        False,
    )
    assert v1["subresources"] == {"status": {}}
    assert v1["schema"] == v1beta1["schema"]
    validator = jsonschema.Draft7Validator(to_jsonschema(v1["schema"]["openAPIV3Schema"]))
    good = {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {"name": "r"},
        "spec": {
            "provisioningClassName": QUEUED_CLASS,
            "podSets": [{"podTemplateRef": {"name": "t"}, "count": 4}],
            "parameters": {"maxRunDurationSeconds": "3600"},
        },
    }
    assert list(validator.iter_errors(good)) == []

    def bad(path: list[Any], value: Any) -> bool:
        obj = copy.deepcopy(good)
        node = obj
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return bool(list(validator.iter_errors(obj)))

    assert bad(["spec", "podSets", 0, "count"], 0)
    assert bad(["spec", "podSets"], [])
    assert bad(["spec", "podSets"], good["spec"]["podSets"] * 33)
    assert bad(["spec", "parameters", "x"], "a" * 256)
    assert not bad(["spec", "parameters", "x"], "a" * 255)
    assert bad(["spec", "provisioningClassName"], "Not_A_DNS_Name")
    assert bad(["spec", "podSets", 0, "podTemplateRef"], {})
    assert bad(["spec", "unknown"], 1)


def test_crd_spec_fields_are_immutable() -> None:
    spec = load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    env = celpy.Environment()
    for name, old, new in (
        ("podSets", [{"count": 4}], [{"count": 2}]),
        ("provisioningClassName", QUEUED_CLASS, BEST_EFFORT_CLASS),
        ("parameters", {"a": "1"}, {"a": "2"}),
    ):
        (rule,) = spec["properties"][name]["x-kubernetes-validations"]
        assert rule == {"rule": "self == oldSelf", "message": "Value is immutable"}
        program = env.program(env.compile(rule["rule"]))
        same = {"self": celpy.json_to_cel(old), "oldSelf": celpy.json_to_cel(old)}
        changed = {"self": celpy.json_to_cel(new), "oldSelf": celpy.json_to_cel(old)}
        assert bool(program.evaluate(same)) and not bool(program.evaluate(changed))


# ---------------------------------------------------------------- templates and pools


def test_template_shape_reads_selectors_chips_and_pool_affinity() -> None:
    s = shape(not_in=["v6e-4x4-a"])
    assert (s.tpu_type, s.topology, s.chips_per_host) == ("v6e", "4x4", 4)
    assert s.pool_not_in == {"v6e-4x4-a"}


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"selector": {"cloud.google.com/gke-tpu-topology": "4x4"}}, "gke-tpu-accelerator"),
        ({"selector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"}}, "topology"),
        ({"selector": {**V6E, "cloud.google.com/gke-tpu-accelerator": "tpu-v9"}}, "tpu-v9"),
        ({"chips": None}, "requests no google.com/tpu"),
        ({"tolerations": []}, "does not tolerate"),
    ],
)
def test_template_without_a_tpu_shape_says_why(kw: dict[str, Any], why: str) -> None:
    result = template_shape(template(**kw))
    assert isinstance(result, str) and why in result


def test_pool_for_count_must_make_a_whole_slice() -> None:
    assert "4 hosts of 4 chips" in str(pool_for(shape(), "p", 3, queued=False))
    pool = pool_for(shape(), "p", 4, queued=False)
    assert not isinstance(pool, str) and pool.nodes == 4 and pool.capacity_type == "on-demand"


def test_pool_capacity_labels_come_from_the_template_selector() -> None:
    spot = shape(selector={**V6E, "cloud.google.com/gke-spot": "true", "example.com/x": "y"})
    pool = pool_for(spot, "p", 4, queued=False)
    assert not isinstance(pool, str)
    labels = pool_nodes(pool)[0]["metadata"]["labels"]
    assert labels["cloud.google.com/gke-spot"] == "true"
    assert labels["cloud.google.com/gke-provisioning"] == "spot"
    assert labels["example.com/x"] == "y"
    queued = pool_for(shape(), "p", 4, queued=True)  # queued pools are flex-start pools
    assert not isinstance(queued, str) and queued.capacity_type == "flex-start"
    both = shape(selector={**V6E, "cloud.google.com/gke-spot": "true"})
    reserved = dataclasses.replace(
        both, node_selector={**both.node_selector, "cloud.google.com/reservation-name": "r"}
    )
    assert "one capacity type" in str(pool_for(reserved, "p", 4, queued=False))


def test_resize_request_name_is_gkes() -> None:
    name = resize_request_name("a" * 30, "b" * 30)
    assert name.startswith(f"gke-{'a' * 20}-{'b' * 20}-") and len(name.rsplit("-", 1)[1]) == 16


# ---------------------------------------------------------------- queued provisioning


def test_queued_happy_path_pool_details_booking_and_scale_down() -> None:
    req, d = run(request(), 0)
    assert status(req) == {"Accepted": ("False", "NotAccepted")}
    req, d = run(req, 1)
    assert status(req)["Accepted"] == ("True", "SuccessfullyQueued")
    pool = req.details["NodePoolName"]
    assert req.details["ResizeRequestName"] == resize_request_name("ns", "slice-0")
    assert req.details["ProvisioningMode"] == "resize_request"
    assert req.details["AcceleratorType"] == "tpu-v6e-slice"
    req, d = run(req, 3)
    assert not d  # provision delay counts from Accepted
    req, d = run(req, 4)
    assert status(req)["Provisioned"] == ("True", "Provisioned")
    (plan,) = d.create
    assert (plan.pool.name, plan.pool.nodes, plan.not_ready_node) == (pool, 4, None)
    assert plan.labels == {PROVISIONING_REQUEST_LABEL: resize_request_name("ns", "slice-0")}
    assert plan.taints == (QUEUED_TAINT,)
    assert req.annotations[POOLS_ANNOTATION] == pool
    busy = [PoolView(pool, 4, 4, None)]
    req, d = run(req, 30, pools=busy, consumed=4)
    assert not d  # queued: consumed or not, the booking runs its 10 minutes
    req, d = run(req, 64, pools=busy, consumed=4)
    assert status(req)["BookingExpired"] == ("True", "BookingExpired")
    req, d = run(req, 100, pools=busy)
    assert not d  # pods run there: no scale-down
    empty = [PoolView(pool, 4, 0, CREATED + 100)]
    req, d = run(req, 104, pools=empty)
    assert not d.delete
    req, d = run(req, 105, pools=empty)
    assert d.delete == [pool]


def test_queued_refuses_more_than_one_pod_set() -> None:
    req, d = run(request(pod_sets=2), 5)
    assert status(req) == {
        "Accepted": ("False", "NotAccepted"),
        "Failed": ("True", "MultiplePodSetsUnsupported"),
    }
    assert "only 1" in req.conditions["Failed"].message
    _, d = run(req, 10)
    assert not d  # Failed is terminal


def test_queued_without_a_matching_pool_is_retried_then_fails() -> None:
    bad = template_shape(template(selector={"cloud.google.com/gke-tpu-topology": "4x4"}))
    req, _ = run(request(), 2, shapes=[bad])
    assert status(req)["Accepted"] == ("False", "NoQueuedNodepoolAvailable")
    assert "No nodepool with QueuedProvisioning enabled" in req.conditions["Accepted"].message
    req, _ = run(req, 20, shapes=[bad])
    assert status(req)["Failed"] == ("True", "NoQueuedNodepoolAvailable")
    req, _ = run(request(count=3), 25)  # a count that is not a whole 4x4 slice
    assert status(req)["Failed"] == ("True", "NoQueuedNodepoolAvailable")
    assert "count 3 does not match topology 4x4" in req.conditions["Failed"].message


def test_queued_max_run_duration_revokes_only_after_booking() -> None:
    req, _ = run(request(parameters={"maxRunDurationSeconds": "30"}), 1)
    req, d = run(req, 4)
    pools = [PoolView(p.pool.name, 4, 4, None) for p in d.create]
    req, d = run(req, 40, pools=pools)
    assert "CapacityRevoked" not in req.conditions  # GKE revokes from BookingExpired only
    req, d = run(req, 64, pools=pools)
    assert status(req)["BookingExpired"][0] == "True"
    req, d = run(req, 65, pools=pools)
    assert status(req)["CapacityRevoked"] == ("True", "CapacityRevoked")
    assert d.delete == [pools[0].name]  # the VMs are gone, pods or not
    _, d = run(req, 70, pools=pools)
    assert d.delete == [pools[0].name] and not d.conditions  # a leftover node goes too


# ---------------------------------------------------------------- best-effort atomic, check


def test_best_effort_avoids_not_in_pools_and_sets_no_details() -> None:
    s = shape(not_in=["taken"])
    req, _ = run(request(BEST_EFFORT_CLASS), 1, shapes=[s])
    assert status(req)["Accepted"] == ("True", "Accepted")
    req, d = run(req, 4, shapes=[s], taken_pools={"auto-taken"})
    assert status(req)["Provisioned"] == ("True", "CapacityIsProvisioned")
    assert req.details == {}  # OSS classes leave provisioningClassDetails empty
    (plan,) = d.create
    assert plan.pool.name not in ("taken", "auto-taken") and plan.taints == ()
    assert PROVISIONING_REQUEST_LABEL not in plan.labels


def test_best_effort_booking_ends_when_consumed_or_after_timeout() -> None:
    req, _ = run(request(BEST_EFFORT_CLASS), 1)
    provisioned, _ = run(req, 4)
    req, _ = run(provisioned, 10, consumed=3)
    assert "BookingExpired" not in req.conditions
    req, _ = run(provisioned, 10, consumed=4)
    assert status(req)["BookingExpired"] == ("True", "CapacityBookingConsumed")
    req, _ = run(provisioned, 64)
    assert status(req)["BookingExpired"] == ("True", "CapacityReservationTimeExpired")


def test_best_effort_without_a_shape_is_not_found_and_stays() -> None:
    bad = template_shape(template(chips=None))
    req, _ = run(request(BEST_EFFORT_CLASS), 1, shapes=[bad])
    assert status(req)["Provisioned"] == ("False", "CapacityIsNotFound")
    assert "requests no google.com/tpu" in req.conditions["Provisioned"].message
    req, d = run(req, 500, shapes=[bad])
    assert "Failed" not in req.conditions and not d.create


def test_best_effort_may_have_several_pod_sets_one_pool_each() -> None:
    req, _ = run(request(BEST_EFFORT_CLASS, pod_sets=2), 1)
    req, d = run(req, 4)
    assert len({p.pool.name for p in d.create}) == 2


def test_check_capacity_never_creates_nodes() -> None:
    req, _ = run(request(CHECK_CAPACITY_CLASS), 1)
    req, d = run(req, 4, free=[3])
    assert status(req)["Provisioned"] == ("False", "CapacityIsNotFound") and not d.create
    req, d = run(req, 5, free=[4])
    assert status(req)["Provisioned"] == ("True", "CapacityIsFound") and not d.create
    req, _ = run(req, 66)
    assert status(req)["BookingExpired"][0] == "True"


def test_free_nodes_counts_matching_schedulable_nodes_with_chips() -> None:
    s = shape(not_in=["held"])
    tpu_taint = {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}

    def node(pool: str = "p", free: int = 4, **kw: Any) -> NodeView:
        labels = {**V6E, "cloud.google.com/gke-nodepool": pool}
        base = {"ready": True, "schedulable": True, "taints": (tpu_taint,)}
        return NodeView(name="n", labels=labels, free_chips=free, **{**base, **kw})

    nodes = [
        node(),
        node(free=0),
        node(pool="held"),
        node(ready=False),
        node(schedulable=False),
        node(taints=(tpu_taint, QUEUED_TAINT)),
    ]
    assert free_nodes(s, nodes) == 1


# ---------------------------------------------------------------- faults


def test_fault_fail_after_accepted_or_at_validation() -> None:
    fault = Fault("fail", reason="QuotaExceeded", message="no quota")
    req, _ = run(request(), 1, fault)
    assert status(req)["Accepted"][0] == "True"
    req, d = run(req, 4, fault)
    assert status(req)["Failed"] == ("True", "QuotaExceeded") and not d.create
    assert req.conditions["Failed"].message.startswith("no quota")
    req, _ = run(request(BEST_EFFORT_CLASS), 0, Fault("fail", at="validate"))
    assert status(req) == {"Failed": ("True", "ResourcePoolExhausted")}


def test_fault_never_provisions() -> None:
    req, _ = run(request(), 1, Fault("never"))
    req, d = run(req, 500, Fault("never"))
    assert "Provisioned" not in req.conditions and not d
    req, _ = run(request(BEST_EFFORT_CLASS), 1, Fault("never"))
    req, _ = run(req, 500, Fault("never"))
    assert status(req)["Provisioned"] == ("False", "CapacityIsNotFound")


def test_fault_not_ready_node() -> None:
    req, _ = run(request(), 1, Fault("not-ready-node"))
    _, d = run(req, 4, Fault("not-ready-node"))
    assert d.create[0].not_ready_node == 3
    _, d = run(req, 4, Fault("not-ready-node", node=0))
    assert d.create[0].not_ready_node == 0


def test_fault_late_nodes_provisioned_first() -> None:
    late = Fault("late-nodes", seconds=10)
    req, _ = run(request(), 1, late)
    req, d = run(req, 4, late)
    assert status(req)["Provisioned"][0] == "True" and not d.create
    req, d = run(req, 13, late)
    assert not d.create
    req, d = run(req, 14, late)
    assert len(d.create) == 1 and req.annotations[POOLS_ANNOTATION]
    _, d = run(req, 15, late)
    assert not d.create  # made once


@pytest.mark.parametrize("cls", [QUEUED_CLASS, BEST_EFFORT_CLASS])
def test_revocation_on_demand_or_scripted(cls: str) -> None:
    req, _ = run(request(cls), 1)
    req, d = run(req, 4)
    pools = [PoolView(p.pool.name, 4, 4, None) for p in d.create]
    revoked, d = run(req, 10, Fault("revoke-after", seconds=6), pools=pools)
    assert status(revoked)["BookingExpired"][0] == "True"  # CapacityRevoked implies it
    assert status(revoked)["CapacityRevoked"] == ("True", "CapacityRevoked")
    assert d.delete == [pools[0].name]
    asked = dataclasses.replace(req, annotations={**req.annotations, REVOKE_ANNOTATION: "x"})
    revoked, d = run(asked, 5, pools=pools)
    assert status(revoked)["CapacityRevoked"][0] == "True" and d.delete


def test_parse_fault_and_rules() -> None:
    assert parse_fault("never") == Fault("never")
    assert parse_fault(None) == Fault()
    fault = parse_fault('{"kind": "fail", "reason": "R", "message": "m", "at": "validate"}')
    assert fault == Fault("fail", reason="R", message="m", at="validate")
    assert parse_fault(fault.to_json()) == fault
    with pytest.raises(ValueError, match="unknown fault"):
        parse_fault("explode")
    with pytest.raises(ValueError, match="unknown fault fields"):
        parse_fault('{"kind": "never", "when": 1}')
    rules = parse_rules(
        [
            {"fault": {"kind": "fail"}, "nameRegex": ".*-s0-0", "times": 1},
            {"fault": "never", "namespace": "slow"},
        ]
    )
    assert parse_rules([r.to_dict() for r in rules]) == rules
    assert choose_fault(rules, {}, "ns", "tsc-s0-0", QUEUED_CLASS) == rules[0]
    assert choose_fault(rules, {rules[0].key: 1}, "ns", "tsc-s0-0", QUEUED_CLASS) is None
    assert choose_fault(rules, {}, "slow", "tsc-s1-0", QUEUED_CLASS) == rules[1]
    assert choose_fault(rules, {}, "ns", "tsc-s1-0", QUEUED_CLASS) is None
    only_be = FaultRule(Fault("never"), provisioning_class=BEST_EFFORT_CLASS)
    assert choose_fault([only_be], {}, "ns", "a", QUEUED_CLASS) is None


def test_timings_overrides() -> None:
    t = Timings().with_overrides({"bookingSeconds": 5, "scale_down_delay_s": "1"})
    assert (t.booking_s, t.scale_down_delay_s, t.accept_delay_s) == (5.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="unknown provisioner setting"):
        Timings().with_overrides({"bookingMinutes": 1})


# ---------------------------------------------------------------- deleted requests


def test_orphan_pools_go_once_empty() -> None:
    pools = {
        "busy": ("ns/gone/u", PoolView("busy", 4, 2, None)),
        "idle": ("ns/gone/u", PoolView("idle", 4, 0, T0)),
        "fresh": ("ns/gone/u", PoolView("fresh", 4, 0, T0 + 4)),
        "live": ("ns/here/u", PoolView("live", 4, 0, T0)),
    }
    assert orphan_pools_to_remove(pools, ["ns/here/u"], now=T0 + 5, timings=FAST) == ["idle"]


def test_fault_annotation_round_trip() -> None:
    fault = Fault("revoke-after", seconds=3)
    req = request(annotations={FAULT_ANNOTATION: fault.to_json()})
    assert parse_fault(req.annotations[FAULT_ANNOTATION]) == fault
    assert json.loads(fault.to_json()) == {"kind": "revoke-after", "seconds": 3}
