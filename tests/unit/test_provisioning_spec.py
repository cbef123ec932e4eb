"""spec.reservation.provisioning: the parser (spec.py) and the CRD's schema and CEL rules
(crds/parts/cluster-spec.yaml), which must judge every object the same way."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.builders import tpu, tpuslice
from tests.support.crd import apply_defaults, load_crd, served_schema, validate
from tpuslice.model import constants as c
from tpuslice.model.records import ProvisioningMode
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.job import parse_job
from tpuslice.spec.parts import RetryPolicy, SpecError
from tpuslice.spec.service import parse_service

TSC = "tpuslice.dev_tpusliceclusters.yaml"
TSJ = "tpuslice.dev_tpuslicejobs.yaml"
TSS = "tpuslice.dev_tpusliceservices.yaml"


def cluster(provisioning: Any = None, **reservation: Any) -> dict[str, Any]:
    if provisioning is not None:
        reservation["provisioning"] = provisioning
    extra = {"reservation": reservation} if reservation else {}
    return tpuslice(uid="u-1", tpu=tpu(slices=2), **extra)


def parse_errors(obj: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as err:
        parse_cluster(obj)
    return str(err.value)


# ----------------------------------------------------------------------------- parser


def test_absent_is_todays_behaviour() -> None:
    spec = parse_cluster(cluster())
    assert spec.provisioning is None
    assert not spec.provisions


def test_queued_defaults() -> None:
    spec = parse_cluster(cluster({"mode": "QueuedProvisioning"}))
    prov = spec.provisioning
    assert prov is not None and spec.provisions
    assert prov.mode == ProvisioningMode.QUEUED and prov.queued
    assert prov.class_name == "queued-provisioning.gke.io"
    assert prov.retry == RetryPolicy(limit=3, base_backoff_seconds=60, max_backoff_seconds=1800)
    assert prov.parameters == {} and prov.node_selector == {}


def test_best_effort_atomic_class_and_pass_through() -> None:
    spec = parse_cluster(
        cluster(
            {
                "mode": "BestEffortAtomic",
                "parameters": {"ValidUntilSeconds": "3600"},
                "nodeSelector": {
                    c.NODE_LABEL_SPOT: "true",
                    c.NODE_LABEL_COMPUTE_CLASS: "tpu-class",
                },
                "retry": {"limit": 5, "baseBackoffSeconds": 10, "maxBackoffSeconds": 600},
            }
        )
    )
    prov = spec.provisioning
    assert prov is not None and not prov.queued
    assert prov.class_name == "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    assert prov.parameters == {"ValidUntilSeconds": "3600"}
    assert prov.node_selector == {
        "cloud.google.com/gke-spot": "true",
        "cloud.google.com/compute-class": "tpu-class",
    }
    assert prov.retry == RetryPolicy(5, 10, 600)


def test_class_override_keeps_the_modes_semantics() -> None:
    prov = parse_cluster(
        cluster({"mode": "QueuedProvisioning", "provisioningClassName": "my.queued.example"})
    ).provisioning
    assert prov is not None
    assert prov.class_name == "my.queued.example" and prov.queued


def test_mode_none_asks_for_nothing() -> None:
    spec = parse_cluster(cluster({"mode": "None"}))
    assert spec.provisioning is not None and not spec.provisions
    assert spec.provisioning.class_name == ""


def test_every_kind_parses_it() -> None:
    job = {
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            **cluster({"mode": "QueuedProvisioning"})["spec"],
            "job": {"entrypoint": "python t.py"},
        },
    }
    assert parse_job(job).cluster.provisions
    service = {
        "metadata": {"name": "svc", "namespace": "ml"},
        "spec": {
            **cluster({"mode": "BestEffortAtomic"})["spec"],
            "serve": {"serveConfigV2": "applications: []"},
        },
    }
    assert parse_service(service).cluster.provisions


BAD = [
    ({}, "spec.reservation.provisioning.mode: is required"),
    ({"mode": "Always"}, "spec.reservation.provisioning.mode: 'Always' is not one of"),
    ({"mode": "None", "provisioningClassName": "x.y"}, "provisioningClassName: has no effect"),
    ({"mode": "None", "parameters": {"a": "b"}}, "parameters: has no effect with mode None"),
    (
        {"mode": "BestEffortAtomic", "provisioningClassName": "Not_A_Class"},
        "provisioningClassName: 'Not_A_Class' is not a class name",
    ),
    (
        {"mode": "BestEffortAtomic", "parameters": {"long": "x" * 256}},
        "parameters.long: has 256 characters",
    ),
    (
        {"mode": "BestEffortAtomic", "parameters": {"n": 5.5}},
        "parameters.n: must be a string",
    ),
    (
        {"mode": "BestEffortAtomic", "nodeSelector": {"kubernetes.io/arch": "amd64"}},
        "nodeSelector.kubernetes.io/arch: is not a capacity key",
    ),
    (
        {"mode": "BestEffortAtomic", "nodeSelector": {c.NODE_LABEL_NODEPOOL: "pool-a"}},
        "nodeSelector.cloud.google.com/gke-nodepool: is set by the operator",
    ),
    (
        {"mode": "BestEffortAtomic", "nodeSelector": {c.NODE_LABEL_SPOT: "false"}},
        'nodeSelector.cloud.google.com/gke-spot: takes only "true"',
    ),
    (
        {"mode": "BestEffortAtomic", "nodeSelector": {c.NODE_LABEL_RESERVATION_NAME: "-bad"}},
        "nodeSelector.cloud.google.com/reservation-name: '-bad' is not a label value",
    ),
    (
        {"mode": "BestEffortAtomic", "retry": {"limit": -1}},
        "retry.limit: must be an integer from 0 to 100",
    ),
    (
        {"mode": "BestEffortAtomic", "retry": {"baseBackoffSeconds": 0}},
        "retry.baseBackoffSeconds: must be an integer from 1",
    ),
    (
        {"mode": "BestEffortAtomic", "retry": {"baseBackoffSeconds": 3600}},
        "retry.baseBackoffSeconds: (3600) must not exceed maxBackoffSeconds (1800",
    ),
    ({"mode": "BestEffortAtomic", "retry": {"tries": 2}}, "retry.tries: is not a field"),
    ({"mode": "BestEffortAtomic", "class": "x"}, "provisioning.class: is not a field"),
]


@pytest.mark.parametrize(("provisioning", "expected"), BAD)
def test_parser_errors_name_the_field(provisioning: dict[str, Any], expected: str) -> None:
    assert expected in parse_errors(cluster(provisioning))


def test_policy_none_refuses_provisioning() -> None:
    text = parse_errors(cluster({"mode": "QueuedProvisioning"}, policy="None"))
    assert "spec.reservation.provisioning: needs spec.reservation.policy NodePool" in text
    # mode None asks for nothing, so it does not conflict
    assert parse_cluster(cluster({"mode": "None"}, policy="None")).provisioning is not None


def test_not_an_object() -> None:
    assert "spec.reservation.provisioning: must be an object" in parse_errors(cluster("Queued"))


# ------------------------------------------------------------------------ CRD and CEL

# The same bad objects, by the fragment the API server's message carries.
CEL_BAD = [
    ({}, "'mode' is a required property"),
    ({"mode": "Always"}, "is not one of ['None', 'BestEffortAtomic', 'QueuedProvisioning']"),
    ({"mode": "None", "provisioningClassName": "x.y"}, "provisioningClassName has no effect"),
    ({"mode": "None", "parameters": {"a": "b"}}, "parameters has no effect with mode None"),
    ({"mode": "BestEffortAtomic", "provisioningClassName": "Not_A_Class"}, "does not match"),
    ({"mode": "BestEffortAtomic", "parameters": {"long": "x" * 256}}, "is too long"),
    ({"mode": "BestEffortAtomic", "parameters": {"n": 5.5}}, "is not of type 'string'"),
    (
        {"mode": "BestEffortAtomic", "nodeSelector": {"kubernetes.io/arch": "amd64"}},
        "nodeSelector takes only the capacity keys",
    ),
    (
        {"mode": "BestEffortAtomic", "nodeSelector": {c.NODE_LABEL_NODEPOOL: "pool-a"}},
        "nodeSelector takes only the capacity keys",
    ),
    (
        {"mode": "BestEffortAtomic", "nodeSelector": {c.NODE_LABEL_SPOT: "false"}},
        'take only "true"',
    ),
    (
        {"mode": "BestEffortAtomic", "nodeSelector": {c.NODE_LABEL_RESERVATION_NAME: "-bad"}},
        "does not match",
    ),
    ({"mode": "BestEffortAtomic", "retry": {"limit": -1}}, "less than the minimum of 0"),
    ({"mode": "BestEffortAtomic", "retry": {"baseBackoffSeconds": 0}}, "less than the minimum"),
    (
        {"mode": "BestEffortAtomic", "retry": {"baseBackoffSeconds": 3600}},
        "retry.baseBackoffSeconds must not exceed maxBackoffSeconds",
    ),
    ({"mode": "BestEffortAtomic", "retry": {"tries": 2}}, "Additional properties"),
    ({"mode": "BestEffortAtomic", "class": "x"}, "Additional properties"),
]


def test_the_two_tables_cover_the_same_cases() -> None:
    assert [p for p, _ in BAD] == [p for p, _ in CEL_BAD]


@pytest.mark.parametrize("crd_file", [TSC, TSJ, TSS])
@pytest.mark.parametrize(("provisioning", "fragment"), CEL_BAD)
def test_cel_rejects_naming_field_and_fix(
    crd_file: str, provisioning: dict[str, Any], fragment: str
) -> None:
    obj = cluster(provisioning)
    obj["kind"] = {TSC: "TPUSliceCluster", TSJ: "TPUSliceJob", TSS: "TPUSliceService"}[crd_file]
    if crd_file == TSJ:
        obj["spec"]["job"] = {"entrypoint": "python t.py"}
    if crd_file == TSS:
        obj["spec"]["serve"] = {"serveConfigV2": "applications: []"}
    messages = validate(crd_file, obj)
    assert any(fragment in m for m in messages), messages


def test_cel_policy_none_refuses_provisioning() -> None:
    messages = validate(TSC, cluster({"mode": "QueuedProvisioning"}, policy="None"))
    assert any("needs spec.reservation.policy NodePool" in m for m in messages), messages
    assert validate(TSC, cluster({"mode": "None"}, policy="None")) == []


GOOD = [
    {"mode": "None"},
    {"mode": "QueuedProvisioning"},
    {"mode": "QueuedProvisioning", "parameters": {"maxRunDurationSeconds": "86400"}},
    {
        "mode": "BestEffortAtomic",
        "provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
        "nodeSelector": {
            c.NODE_LABEL_SPOT: "true",
            c.NODE_LABEL_RESERVATION_NAME: "res-1",
            c.NODE_LABEL_COMPUTE_CLASS: "tpu",
            c.NODE_LABEL_FLEX_START: "true",
        },
        "retry": {"limit": 0, "baseBackoffSeconds": 1800, "maxBackoffSeconds": 1800},
    },
    {"mode": "BestEffortAtomic", "parameters": {"x": "y" * 255}},
]


@pytest.mark.parametrize("provisioning", GOOD)
def test_good_objects_pass_both(provisioning: dict[str, Any]) -> None:
    obj = cluster(provisioning)
    assert validate(TSC, obj) == []
    parse_cluster(obj)


def test_crd_defaults_equal_the_parsers() -> None:
    defaulted = apply_defaults(
        served_schema(load_crd(TSC)), cluster({"mode": "QueuedProvisioning"})
    )
    retry = defaulted["spec"]["reservation"]["provisioning"]["retry"]
    default = RetryPolicy()
    assert retry == {
        "limit": default.limit,
        "baseBackoffSeconds": default.base_backoff_seconds,
        "maxBackoffSeconds": default.max_backoff_seconds,
    }


def test_crd_allow_list_is_the_constants() -> None:
    schema = served_schema(load_crd(TSC))
    node_selector = schema["properties"]["spec"]["properties"]["reservation"]["properties"][
        "provisioning"
    ]["properties"]["nodeSelector"]
    rule = node_selector["x-kubernetes-validations"][0]["rule"]
    for key in c.CAPACITY_SELECTOR_KEYS:
        assert f"'{key}'" in rule
    assert rule.count("cloud.google.com/") == len(c.CAPACITY_SELECTOR_KEYS)
    true_only = node_selector["x-kubernetes-validations"][1]["rule"]
    assert all(f"'{key}'" in true_only for key in c.CAPACITY_SELECTOR_TRUE_ONLY)


def test_status_accepts_the_provisioning_entry() -> None:
    obj = cluster({"mode": "QueuedProvisioning"})
    obj["status"] = {
        "slices": [
            {
                "index": 0,
                "state": "Provisioning",
                "message": "queued: expected in 2h",
                "provisioning": {"request": "llm-s0-1", "attempt": 1, "failures": 0},
            }
        ]
    }
    assert validate(TSC, obj) == []
