"""TPUSlicePolicy: parsing, namespace selection, the refusals, priority clamping, pools
and namespace usage (tpuslice.policy), and the CRD judging policies the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.builders import tpu, tpuslice
from tests.support.crd import validate
from tpuslice.model.records import ProvisioningMode
from tpuslice.policy.records import Policy, PolicyError, parse_policy
from tpuslice.policy.rules import (
    POLICY_DENIED,
    POLICY_VIOLATION,
    ObjectFacts,
    Usage,
    check_object,
    effective_priority,
    facts_of,
    namespace_usage_allowed,
    pool_allowed,
    pools_allowed,
)
from tpuslice.policy.selection import governing, selects
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.job import parse_job
from tpuslice.spec.service import parse_service

POL = "tpuslice.dev_tpuslicepolicies.yaml"
EXAMPLE = Path(__file__).parents[2] / "examples" / "policy-two-teams.yaml"


def policy_body(name: str = "research", **spec: Any) -> dict[str, Any]:
    spec.setdefault("namespaceSelector", {"matchLabels": {"team": name}})
    return {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "TPUSlicePolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


def policy(name: str = "research", **spec: Any) -> Policy:
    return parse_policy(policy_body(name, **spec))


def facts(**fields: Any) -> ObjectFacts:
    fields.setdefault("slices", 1)
    fields.setdefault("chips_per_slice", 16)
    return ObjectFacts(**fields)


# ------------------------------------------------------------------------- parsing


def test_example_policies_parse_and_pass_the_crd() -> None:
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    assert [d["metadata"]["name"] for d in docs] == ["research", "serving"]
    for doc in docs:
        assert validate(POL, doc) == []
        parse_policy(doc)


def test_a_full_policy_parses_into_records() -> None:
    parsed = policy(
        pools={"nodeSelector": {"tpuslice.dev/team": "research"}},
        limits={"slicesPerObject": 4, "slicesPerNamespace": 8, "chipsPerNamespace": 64},
        priority={"min": 0, "max": 100, "priorityClassNames": ["high"]},
        provisioning={"modes": ["QueuedProvisioning"], "reservationNames": ["r1"]},
        podTemplate={"podSecurity": "restricted", "serviceAccountNames": ["ray"]},
        services={"types": ["ClusterIP"]},
    )
    assert parsed.pool_node_selector == {"tpuslice.dev/team": "research"}
    assert parsed.limits.slices_per_object == 4
    assert parsed.limits.chips_per_namespace == 64
    assert (parsed.priority.minimum, parsed.priority.maximum) == (0, 100)
    assert parsed.provisioning.modes == (ProvisioningMode.QUEUED,)
    assert parsed.provisioning.reservation_names == ("r1",)
    assert parsed.provisioning.compute_classes is None
    assert parsed.pod_security is not None and parsed.pod_security.value == "restricted"
    assert parsed.service_accounts == ("ray",)
    assert parsed.service_types == ("ClusterIP",)


BAD_POLICIES = [
    ({"namespaceSelector": None}, "spec.namespaceSelector"),
    ({"limits": {"slicesPerObject": -1}}, "spec.limits.slicesPerObject"),
    ({"limits": {"chipsPerNamespace": True}}, "spec.limits.chipsPerNamespace"),
    ({"limits": {"slices": 1}}, "spec.limits.slices"),
    ({"priority": {"min": 10, "max": 5}}, "spec.priority.min"),
    ({"priority": {"max": 10**10}}, "spec.priority.max"),
    ({"provisioning": {"modes": []}}, "spec.provisioning.modes"),
    ({"provisioning": {"modes": ["Fast"]}}, "spec.provisioning.modes[0]"),
    ({"provisioning": {"computeClasses": ["x" * 64]}}, "spec.provisioning.computeClasses[0]"),
    ({"podTemplate": {"podSecurity": "privileged"}}, "spec.podTemplate.podSecurity"),
    ({"services": {"types": ["Headless"]}}, "spec.services.types[0]"),
    ({"services": {"types": ["ClusterIP"] * 5}}, "spec.services.types"),
    (
        {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
        "spec.namespaceSelector.matchExpressions[0].values",
    ),
    (
        {
            "namespaceSelector": {
                "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
            }
        },
        "spec.namespaceSelector.matchExpressions[0].values",
    ),
    (
        {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}},
        "spec.namespaceSelector.matchExpressions[0].operator",
    ),
    (
        {"namespaceSelector": {"matchLabels": {f"k{i}": "v" for i in range(65)}}},
        "spec.namespaceSelector.matchLabels",
    ),
    ({"pools": {"nodeSelector": {"team": "x" * 64}}}, "spec.pools.nodeSelector.team"),
]


@pytest.mark.parametrize(("spec", "path"), BAD_POLICIES, ids=[p for _, p in BAD_POLICIES])
def test_bad_policies_are_refused_naming_the_field(spec: dict[str, Any], path: str) -> None:
    body = policy_body(**spec)
    if spec.get("namespaceSelector", {}) is None:
        del body["spec"]["namespaceSelector"]
    with pytest.raises(PolicyError) as caught:
        parse_policy(body)
    assert path in [e.path for e in caught.value.errors], caught.value
    assert "TPUSlicePolicy research" in str(caught.value)
    # The CRD refuses it too (the operator and the API server agree).
    assert validate(POL, body) != []


def test_the_crd_refuses_an_unknown_field_and_accepts_the_empty_selector() -> None:
    assert validate(POL, policy_body(namespaceSelector={})) == []
    assert validate(POL, policy_body(quota=1)) != []


# ----------------------------------------------------------------------- selection


SELECTIONS = [
    ({}, {}, True),
    ({"matchLabels": {"team": "a"}}, {"team": "a", "x": "y"}, True),
    ({"matchLabels": {"team": "a"}}, {"team": "b"}, False),
    ({"matchLabels": {"team": "a"}}, {}, False),
    (
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]},
        {"tier": "b"},
        True,
    ),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}, {}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {}, True),
    (
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]},
        {"tier": "a"},
        False,
    ),
    ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {"tier": ""}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, {}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, {"tier": "a"}, False),
    (
        {"matchLabels": {"team": "a"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]},
        {"team": "a"},
        False,
    ),
]


@pytest.mark.parametrize(("selector", "labels", "expected"), SELECTIONS)
def test_namespace_selector_matching(
    selector: dict[str, Any], labels: dict[str, str], expected: bool
) -> None:
    parsed = policy(namespaceSelector=selector)
    assert selects(parsed.namespace_selector, labels) is expected


def test_governing_returns_every_selecting_policy_by_name() -> None:
    everyone = policy("zz-everyone", namespaceSelector={})
    research = policy("research")
    serving = policy("serving")
    assert governing([everyone, serving, research], {"team": "research"}) == (
        research,
        everyone,
    )
    assert governing([serving, research], {"team": "other"}) == ()


# -------------------------------------------------------------------- default deny


def test_no_policy_in_the_cluster_allows_everything() -> None:
    assert check_object([], {"team": "x"}, facts(slices=1000, priority=10**9)) == []


def test_policies_that_select_no_namespace_deny_it_naming_them() -> None:
    refusals = check_object([policy("serving"), policy("research")], {"team": "x"}, facts())
    assert len(refusals) == 1
    (denied,) = refusals
    assert denied.reason == POLICY_DENIED
    assert denied.policy == "research, serving"
    assert "research, serving" in str(denied)


def test_a_denial_names_a_bounded_number_of_policies() -> None:
    many = [policy(f"p{i:02}") for i in range(9)]
    (denied,) = check_object(many, {}, facts())
    assert denied.policy == "p00, p01, p02, p03, p04 and 4 more"


def test_a_selected_namespace_with_an_allowed_object_has_no_refusal() -> None:
    assert check_object([policy("research"), policy("other")], {"team": "research"}, facts()) == []


# --------------------------------------------------------------------- the checks


def refusal_paths(policies: list[Policy], fact: ObjectFacts) -> list[tuple[str, str]]:
    refusals = check_object(policies, {"team": "research"}, fact)
    assert all(r.reason == POLICY_VIOLATION for r in refusals)
    return [(r.policy, r.path) for r in refusals]


def test_slices_per_object_strictest_wins_naming_each_policy() -> None:
    loose = policy("a-loose", namespaceSelector={}, limits={"slicesPerObject": 8})
    tight = policy("research", limits={"slicesPerObject": 2})
    assert refusal_paths([loose, tight], facts(slices=2)) == []
    assert refusal_paths([loose, tight], facts(slices=3)) == [("research", "spec.tpu.slices")]
    assert refusal_paths([loose, tight], facts(slices=9)) == [
        ("a-loose", "spec.tpu.slices"),
        ("research", "spec.tpu.slices"),
    ]
    (refusal,) = check_object([tight], {"team": "research"}, facts(slices=3))
    assert str(refusal) == (
        "spec.tpu.slices: asks for 3 slices; at most 2 per object "
        "(TPUSlicePolicy research: spec.limits.slicesPerObject 2)"
    )


PROVISIONING_CASES = [
    (
        {"modes": ["None"]},
        {"provisioning_mode": ProvisioningMode.QUEUED},
        "spec.reservation.provisioning.mode",
    ),
    ({"modes": ["None"]}, {"provisioning_mode": ProvisioningMode.NONE}, None),
    ({"modes": ["None"]}, {}, None),
    (
        {"provisioningClassNames": ["queued-provisioning.gke.io"]},
        {
            "provisioning_mode": ProvisioningMode.BEST_EFFORT_ATOMIC,
            "provisioning_class": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
        },
        "spec.reservation.provisioning.provisioningClassName",
    ),
    (
        {"provisioningClassNames": ["queued-provisioning.gke.io"]},
        {
            "provisioning_mode": ProvisioningMode.QUEUED,
            "provisioning_class": "queued-provisioning.gke.io",
        },
        None,
    ),
    (
        {"reservationNames": ["mine"]},
        {
            "provisioning_mode": ProvisioningMode.QUEUED,
            "capacity_selector": {"cloud.google.com/reservation-name": "theirs"},
        },
        "spec.reservation.provisioning.nodeSelector.cloud.google.com/reservation-name",
    ),
    (
        {"reservationNames": ["mine"]},
        {
            "provisioning_mode": ProvisioningMode.QUEUED,
            "capacity_selector": {"cloud.google.com/reservation-name": "mine"},
        },
        None,
    ),
    (
        {"computeClasses": ["tpu-cc"]},
        {
            "provisioning_mode": ProvisioningMode.QUEUED,
            "capacity_selector": {"cloud.google.com/compute-class": "other"},
        },
        "spec.reservation.provisioning.nodeSelector.cloud.google.com/compute-class",
    ),
]


@pytest.mark.parametrize(("rule", "fields", "refused"), PROVISIONING_CASES)
def test_provisioning_checks(
    rule: dict[str, Any], fields: dict[str, Any], refused: str | None
) -> None:
    paths = refusal_paths([policy(provisioning=rule)], facts(**fields))
    assert paths == ([("research", refused)] if refused else [])


@pytest.mark.parametrize(
    ("service_type", "refused"), [(None, False), ("ClusterIP", False), ("NodePort", True)]
)
def test_service_types(service_type: str | None, refused: bool) -> None:
    parsed = policy(services={"types": ["ClusterIP", "LoadBalancer"]})
    paths = refusal_paths([parsed], facts(service_type=service_type))
    assert paths == ([("research", "spec.serve.serveService.spec.type")] if refused else [])


@pytest.mark.parametrize(
    ("template_spec", "refused"),
    [
        ({"serviceAccountName": "ray"}, False),
        ({"serviceAccountName": "admin"}, True),
        ({}, True),  # runs as "default", not listed
    ],
)
def test_service_accounts(template_spec: dict[str, Any], refused: bool) -> None:
    parsed = policy(podTemplate={"serviceAccountNames": ["ray"]})
    fact = facts(templates=(("spec.worker.template", {"spec": template_spec}),))
    paths = refusal_paths([parsed], fact)
    expected = [("research", "spec.worker.template.spec.serviceAccountName")]
    assert paths == (expected if refused else [])


def test_listing_default_allows_templates_that_name_no_service_account() -> None:
    parsed = policy(podTemplate={"serviceAccountNames": ["default"]})
    assert refusal_paths([parsed], facts(templates=(("spec.head.template", {}),))) == []


def test_priority_class_names() -> None:
    parsed = policy(priority={"priorityClassNames": ["high"]})
    ok = facts(templates=(("spec.head.template", {"spec": {"priorityClassName": "high"}}),))
    bad = facts(templates=(("spec.head.template", {"spec": {"priorityClassName": "vip"}}),))
    assert refusal_paths([parsed], ok) == []
    assert refusal_paths([parsed], bad) == [
        ("research", "spec.head.template.spec.priorityClassName")
    ]


def test_pod_security_is_judged_once_at_the_strictest_level() -> None:
    baseline = policy("a-base", namespaceSelector={}, podTemplate={"podSecurity": "baseline"})
    restricted = policy("research", podTemplate={"podSecurity": "restricted"})
    template = {"spec": {"hostPID": True, "containers": [{"name": "ray-worker"}]}}
    fact = facts(templates=(("spec.worker.template", template),))
    paths = refusal_paths([baseline, restricted], fact)
    assert ("research", "spec.worker.template.spec.hostPID") in paths
    assert all(policy_name == "research" for policy_name, _ in paths)
    assert len(paths) == len(set(paths))  # not once per policy
    assert refusal_paths([baseline], fact) == [("a-base", "spec.worker.template.spec.hostPID")]


# ------------------------------------------------------------------------ priority


def test_priority_is_clamped_into_the_range_and_says_by_whom() -> None:
    parsed = [policy(priority={"min": 0, "max": 100})]
    assert effective_priority(parsed, 50).value == 50
    assert effective_priority(parsed, 50).clamped_by == ""
    high = effective_priority(parsed, 500)
    assert (high.value, high.clamped_by) == (100, "research")
    assert "spec.priority.max 100" in high.message
    low = effective_priority(parsed, -5)
    assert (low.value, low.clamped_by) == (0, "research")
    # Clamped, never refused:
    assert check_object(parsed, {"team": "research"}, facts(priority=500)) == []


def test_priority_ranges_intersect_and_an_empty_intersection_is_refused() -> None:
    a = policy("a", namespaceSelector={}, priority={"min": 10, "max": 100})
    b = policy("research", priority={"max": 50})
    assert effective_priority([a, b], 80).value == 50
    assert effective_priority([a, b], 0).value == 10
    c = policy("research", priority={"max": 5})
    refusals = check_object([a, c], {"team": "research"}, facts(priority=7))
    assert [(r.policy, r.path) for r in refusals] == [("a", "spec.reservation.priority")]
    assert "spec.priority.max 5" in refusals[0].limit
    assert effective_priority([a, c], 7).value == 7


# -------------------------------------------------------------- pools and usage


def test_pools_must_carry_every_governing_policys_labels() -> None:
    research = policy(pools={"nodeSelector": {"team": "research", "tier": "a"}})
    unlimited = policy("open")
    assert pool_allowed(research, {"team": "research", "tier": "a", "other": "x"})
    assert not pool_allowed(research, {"team": "research"})
    assert not pool_allowed(research, {"team": "serving", "tier": "a"})
    assert pool_allowed(unlimited, {})
    extra = policy("extra", pools={"nodeSelector": {"zone": "b"}})
    assert pools_allowed([research, unlimited], {"team": "research", "tier": "a"})
    assert not pools_allowed([research, extra], {"team": "research", "tier": "a"})


@pytest.mark.parametrize(
    ("in_use", "asking", "refused"),
    [
        (Usage(0, 0), Usage(4, 64), []),
        (
            Usage(4, 64),
            Usage(1, 16),
            ["spec.limits.slicesPerNamespace 4", "spec.limits.chipsPerNamespace 64"],
        ),
        (Usage(3, 48), Usage(1, 16), []),
        (Usage(0, 60), Usage(1, 16), ["spec.limits.chipsPerNamespace 64"]),
    ],
)
def test_namespace_usage(in_use: Usage, asking: Usage, refused: list[str]) -> None:
    parsed = policy(limits={"slicesPerNamespace": 4, "chipsPerNamespace": 64})
    refusals = namespace_usage_allowed([parsed], in_use, asking)
    assert [r.limit for r in refusals] == refused
    assert all(r.policy == "research" for r in refusals)


def test_no_namespace_limits_allow_any_usage() -> None:
    assert namespace_usage_allowed([policy()], Usage(10**5, 10**7), Usage(1, 1)) == []


# --------------------------------------------------------------- facts of a spec


def test_facts_of_a_cluster() -> None:
    body = tpuslice(
        tpu=tpu(slices=2),
        reservation={
            "priority": 7,
            "provisioning": {
                "mode": "QueuedProvisioning",
                "nodeSelector": {"cloud.google.com/reservation-name": "r1"},
            },
        },
        worker={"template": {"spec": {"serviceAccountName": "ray"}}},
    )
    fact = facts_of(parse_cluster(body))
    assert (fact.slices, fact.chips_per_slice, fact.priority) == (2, 16, 7)
    assert fact.provisioning_mode == ProvisioningMode.QUEUED
    assert fact.provisioning_class == "queued-provisioning.gke.io"
    assert fact.capacity_selector == {"cloud.google.com/reservation-name": "r1"}
    assert dict(fact.templates)["spec.worker.template"] == {"spec": {"serviceAccountName": "ray"}}
    assert fact.service_type is None


def test_facts_of_a_job_include_the_submitter_template() -> None:
    body = tpuslice(
        "TPUSliceJob",
        job={
            "entrypoint": "python train.py",
            "submitterPodTemplate": {"spec": {"containers": [{"name": "s", "image": "i"}]}},
        },
    )
    fact = facts_of(parse_job(body))
    assert [p for p, _ in fact.templates] == [
        "spec.head.template",
        "spec.worker.template",
        "spec.job.submitterPodTemplate",
    ]


@pytest.mark.parametrize(
    ("serve_service", "expected"),
    [
        (None, None),
        ({"spec": {"type": "LoadBalancer"}}, "LoadBalancer"),
        ({"metadata": {"name": "s"}}, "ClusterIP"),
    ],
)
def test_facts_of_a_service_carry_its_service_type(
    serve_service: dict[str, Any] | None, expected: str | None
) -> None:
    serve: dict[str, Any] = {"serveConfigV2": "applications: []"}
    if serve_service is not None:
        serve["serveService"] = serve_service
    fact = facts_of(parse_service(tpuslice("TPUSliceService", serve=serve)))
    assert fact.service_type == expected
