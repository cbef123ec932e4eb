"""Capacity on demand, the pure parts: names, the PodTemplate and ProvisioningRequest
bodies, the converter, backoff, and the per-slice state machine (capacity.decide)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import builders
from tpuslice.capacity.decide import (
    CLAIM_WITHIN_SECONDS,
    backoff_seconds,
    config_error,
    decide,
    retry_time,
)
from tpuslice.capacity.objects import (
    consume_annotations,
    podtemplate_body,
    podtemplate_owner_references,
    request_body,
    request_hash,
    request_name,
    worker_template_of,
)
from tpuslice.capacity.requests import (
    group_requests,
    history_from_status,
    pool_matches_selector,
    promised_pools,
    slices_to_provision,
)
from tpuslice.model import constants as c
from tpuslice.model import events
from tpuslice.model.convert import node_info, provisioning_request_info
from tpuslice.model.records import (
    NodeInfo,
    ProvisioningAction,
    ProvisioningRequestInfo,
    RequestCondition,
    SliceFacts,
    SliceProvisioning,
    SliceState,
    SliceStatus,
)
from tpuslice.render.kuberay import render_ray_cluster_spec
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.job import parse_job
from tpuslice.spec.parts import RetryPolicy, SliceClusterSpec

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def spec_of(provisioning: dict[str, Any] | None = None, **extra: Any) -> SliceClusterSpec:
    reservation: dict[str, Any] = dict(extra.pop("reservation", {}))
    if provisioning is not None:
        reservation["provisioning"] = provisioning
    obj = {
        "metadata": {"name": "llm", "namespace": "ml", "uid": "tsc-uid"},
        "spec": {
            "tpu": {"type": "v6e", "topology": "4x4", "slices": 2},
            "ray": {"version": "2.54.0"},
            "reservation": reservation,
            **extra,
        },
    }
    return parse_cluster(obj)


QUEUED = spec_of({"mode": "QueuedProvisioning"})
ATOMIC = spec_of(
    {
        "mode": "BestEffortAtomic",
        "parameters": {"ValidUntilSeconds": "3600"},
        "nodeSelector": {c.NODE_LABEL_SPOT: "true"},
        "retry": {"limit": 2, "baseBackoffSeconds": 60, "maxBackoffSeconds": 600},
    }
)


def worker_template(spec: SliceClusterSpec) -> dict[str, Any]:
    template = worker_template_of(render_ray_cluster_spec(spec))
    assert template is not None
    return dict(template)


# --------------------------------------------------------------------------- names


def test_request_name_is_raycluster_index_attempt() -> None:
    assert request_name("llm", 3, 1) == "llm-s3-1"


@given(
    st.from_regex(r"[a-z]([-a-z0-9]{0,51}[a-z0-9])?", fullmatch=True),
    st.integers(0, 4095),
    st.integers(1, 100_000),
)
def test_request_names_are_dns_labels_and_unique(cluster: str, index: int, attempt: int) -> None:
    name = request_name(cluster, index, attempt)
    assert len(name) <= 63 and DNS_LABEL.match(name), name
    assert name.endswith(f"-s{index}-{attempt}")
    assert name != request_name(cluster, index, attempt + 1)
    assert name != request_name(
        cluster + "x" if len(cluster) < 53 else cluster[:-1], index, attempt
    )


def test_the_longest_ordinary_name_is_not_shortened() -> None:
    assert request_name("a" * 53, 4095, 999) == "a" * 53 + "-s4095-999"


# ------------------------------------------------------------------------- bodies


def test_request_body_one_pod_set_of_hosts_pods() -> None:
    body = request_body(ATOMIC, raycluster="llm", index=1, attempt=2, failures=1)
    assert body["apiVersion"] == "autoscaling.x-k8s.io/v1"
    assert body["kind"] == "ProvisioningRequest"
    meta = body["metadata"]
    assert meta["name"] == "llm-s1-2" and meta["namespace"] == "ml"
    assert meta["labels"] == {
        "tpuslice.dev/cluster": "llm",
        "tpuslice.dev/raycluster": "llm",
        "tpuslice.dev/slice-index": "1",
        "tpuslice.dev/provisioning-attempt": "2",
        "app.kubernetes.io/managed-by": "tpuslice-operator",
    }
    assert meta["annotations"] == {
        "tpuslice.dev/provisioning-failures": "1",
        "tpuslice.dev/request-hash": request_hash(ATOMIC),
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "tpuslice.dev/v1alpha1",
            "kind": "TPUSliceCluster",
            "name": "llm",
            "uid": "tsc-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert body["spec"] == {
        "provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
        "podSets": [{"podTemplateRef": {"name": "llm-s1-2"}, "count": 4}],
        "parameters": {"ValidUntilSeconds": "3600"},
    }


def test_request_body_queued_class_without_parameters() -> None:
    body = request_body(QUEUED, raycluster="llm", index=0, attempt=1)
    assert body["spec"]["provisioningClassName"] == "queued-provisioning.gke.io"
    assert "parameters" not in body["spec"]


def test_request_body_of_a_job_names_its_raycluster_and_kind() -> None:
    job = parse_job(
        {
            "metadata": {"name": "train", "namespace": "ml", "uid": "j-uid"},
            "spec": {
                "tpu": {"type": "v6e", "topology": "2x4", "chipsPerHost": 4},
                "ray": {"version": "2.54.0"},
                "reservation": {"provisioning": {"mode": "QueuedProvisioning"}},
                "job": {"entrypoint": "python t.py"},
            },
        }
    ).cluster
    body = request_body(job, raycluster="train-abcde", index=0, attempt=1)
    assert body["metadata"]["name"] == "train-abcde-s0-1"
    assert body["metadata"]["labels"]["tpuslice.dev/owner-kind"] == "TPUSliceJob"
    assert body["metadata"]["labels"]["tpuslice.dev/cluster"] == "train"
    assert body["metadata"]["ownerReferences"][0]["kind"] == "TPUSliceJob"
    assert body["spec"]["podSets"][0]["count"] == 2


def test_request_body_refuses_without_a_mode() -> None:
    with pytest.raises(ValueError, match="asks for no requests"):
        request_body(spec_of({"mode": "None"}), raycluster="llm", index=0, attempt=1)


def test_request_hash_follows_the_immutable_spec() -> None:
    other = spec_of({"mode": "BestEffortAtomic", "parameters": {"ValidUntilSeconds": "60"}})
    assert request_hash(ATOMIC) != request_hash(other)
    assert request_hash(QUEUED) == request_hash(spec_of({"mode": "QueuedProvisioning"}))


def test_podtemplate_is_a_gate_free_copy_of_the_worker_scheduling_fields() -> None:
    template = worker_template(QUEUED)
    assert template["spec"]["schedulingGates"]  # the pods are gated
    body = podtemplate_body(
        QUEUED,
        raycluster="llm",
        index=0,
        attempt=1,
        worker_template=template,
        exclude_units=["pool-a"],
    )
    assert body["apiVersion"] == "v1" and body["kind"] == "PodTemplate"
    assert body["metadata"]["name"] == "llm-s0-1"
    assert body["metadata"]["ownerReferences"][0]["controller"] is False
    spec = body["template"]["spec"]
    assert "schedulingGates" not in spec
    assert spec["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "4x4",
    }
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert {
        "key": "cloud.google.com/gke-queued",
        "operator": "Exists",
        "effect": "NoSchedule",
    } in spec["tolerations"]
    assert "affinity" not in spec  # queued pools are dedicated: no NotIn
    (container,) = spec["containers"]
    assert container["name"] == "ray-worker" and container["image"]
    assert container["resources"]["requests"]["google.com/tpu"] == "4"
    assert container["resources"]["limits"]["google.com/tpu"] == "4"
    assert body["template"]["metadata"]["labels"]["tpuslice.dev/cluster"] == "llm"


def test_the_pods_carry_what_the_template_asks_for() -> None:
    """The real pods must match the template's scheduling fields (the autoscaler books
    for the template): capacity selector and queued toleration are rendered on them."""
    pod = worker_template(
        spec_of({"mode": "QueuedProvisioning", "nodeSelector": {c.NODE_LABEL_SPOT: "true"}})
    )
    assert pod["spec"]["nodeSelector"][c.NODE_LABEL_SPOT] == "true"
    assert {"key": c.QUEUED_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in pod["spec"][
        "tolerations"
    ]
    plain = worker_template(spec_of())
    assert all(t["key"] != c.QUEUED_TAINT_KEY for t in plain["spec"]["tolerations"])
    atomic = worker_template(ATOMIC)
    assert all(t["key"] != c.QUEUED_TAINT_KEY for t in atomic["spec"]["tolerations"])
    assert atomic["spec"]["nodeSelector"][c.NODE_LABEL_SPOT] == "true"


def test_a_user_override_of_a_capacity_key_is_refused() -> None:
    from tpuslice.spec.parts import SpecError

    spec = spec_of(
        {"mode": "BestEffortAtomic", "nodeSelector": {c.NODE_LABEL_SPOT: "true"}},
        worker={"template": {"spec": {"nodeSelector": {c.NODE_LABEL_SPOT: "false"}}}},
    )
    with pytest.raises(SpecError, match=r"spec\.reservation\.provisioning\.nodeSelector"):
        render_ray_cluster_spec(spec)


def test_non_queued_template_keeps_off_pools_with_nodes_in_every_term() -> None:
    user_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                ]
            }
        }
    }
    spec = spec_of(
        {"mode": "BestEffortAtomic", "nodeSelector": {c.NODE_LABEL_SPOT: "true"}},
        worker={"template": {"spec": {"affinity": user_affinity}}},
    )
    template = worker_template(spec)
    body = podtemplate_body(
        spec,
        raycluster="llm",
        index=0,
        attempt=1,
        worker_template=template,
        exclude_units=["pool-b", "pool-a", "pool-b"],
    )
    pod_spec = body["template"]["spec"]
    assert pod_spec["nodeSelector"][c.NODE_LABEL_SPOT] == "true"
    assert all(t["key"] != c.QUEUED_TAINT_KEY for t in pod_spec["tolerations"])
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    not_in = {
        "key": "cloud.google.com/gke-nodepool",
        "operator": "NotIn",
        "values": ["pool-a", "pool-b"],
    }
    assert len(terms) == 2 and all(not_in in t["matchExpressions"] for t in terms)
    # the worker template itself is unchanged
    assert worker_template(spec)["spec"]["affinity"] == user_affinity
    # deterministic, so the shell can compare it with the stored one
    again = podtemplate_body(
        spec,
        raycluster="llm",
        index=0,
        attempt=1,
        worker_template=template,
        exclude_units=["pool-a", "pool-b"],
    )
    assert again == body


def test_template_never_pins_a_pool_and_without_pools_has_no_affinity() -> None:
    template = worker_template(ATOMIC)
    template["spec"]["nodeSelector"][c.NODE_LABEL_NODEPOOL] = "pool-a"  # a released pod's copy
    body = podtemplate_body(ATOMIC, raycluster="llm", index=0, attempt=1, worker_template=template)
    assert c.NODE_LABEL_NODEPOOL not in body["template"]["spec"]["nodeSelector"]
    assert "affinity" not in body["template"]["spec"]


def test_template_keeps_host_ports_and_drops_the_rest_of_a_container() -> None:
    template = {
        "spec": {
            "containers": [
                {
                    "name": "w",
                    "image": "i",
                    "env": [{"name": "A", "value": "1"}],
                    "ports": [{"containerPort": 8471}, {"containerPort": 1, "hostPort": 1}],
                }
            ],
            "initContainers": [
                {"name": "init", "image": "j", "resources": {"requests": {"cpu": "1"}}}
            ],
        }
    }
    spec = podtemplate_body(QUEUED, raycluster="llm", index=0, attempt=1, worker_template=template)[
        "template"
    ]["spec"]
    assert spec["containers"] == [
        {"name": "w", "image": "i", "ports": [{"containerPort": 1, "hostPort": 1}]}
    ]
    assert spec["initContainers"] == [
        {"name": "init", "image": "j", "resources": {"requests": {"cpu": "1"}}}
    ]
    # selectors and the TPU toleration are there even if the template had none
    assert spec["nodeSelector"][c.NODE_LABEL_ACCELERATOR] == "tpu-v6e-slice"
    assert spec["tolerations"][0]["key"] == c.TPU_TAINT_KEY


def test_podtemplate_owner_references_make_the_request_its_only_controller() -> None:
    owners = podtemplate_owner_references(QUEUED, "llm-s0-1", "req-uid")
    assert [o["kind"] for o in owners] == ["ProvisioningRequest", "TPUSliceCluster"]
    assert owners[0] == {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "name": "llm-s0-1",
        "uid": "req-uid",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert sum(1 for o in owners if o["controller"]) == 1


def test_consume_annotations() -> None:
    assert consume_annotations("llm-s0-1", "queued-provisioning.gke.io") == {
        "autoscaling.x-k8s.io/consume-provisioning-request": "llm-s0-1",
        "autoscaling.x-k8s.io/provisioning-class-name": "queued-provisioning.gke.io",
    }


def test_worker_template_of_finds_the_tpu_group() -> None:
    assert worker_template_of({"workerGroupSpecs": [{"groupName": "cpu", "template": {}}]}) is None
    assert worker_template_of({}) is None
    assert worker_template_of(
        {"workerGroupSpecs": [{"groupName": "tpu", "template": {"a": 1}}]}
    ) == {"a": 1}


# ------------------------------------------------------------- records and helpers


def request_object(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {
            "name": "llm-s1-2",
            "namespace": "ml",
            "uid": "r-uid",
            "creationTimestamp": "2026-11-30T11:00:00Z",
            "labels": {
                "tpuslice.dev/raycluster": "llm",
                "tpuslice.dev/slice-index": "1",
                "tpuslice.dev/provisioning-attempt": "2",
            },
            "annotations": {
                "tpuslice.dev/provisioning-failures": "1",
                "tpuslice.dev/request-hash": "abc",
            },
        },
        "spec": {"provisioningClassName": "queued-provisioning.gke.io", "podSets": []},
        "status": status,
    }


def test_provisioning_request_info() -> None:
    info = provisioning_request_info(
        request_object(
            conditions=[
                {
                    "type": "Provisioned",
                    "status": "True",
                    "reason": "Provisioned",
                    "message": "done",
                    "lastTransitionTime": "2026-11-30T11:55:00Z",
                },
                {"type": "Accepted", "status": "True"},
                {"status": "True"},  # no type: ignored
            ],
            provisioningClassDetails={"NodePoolName": "dws-pool", "ResizeRequestName": "rr-1"},
        )
    )
    assert (info.name, info.namespace, info.uid) == ("llm-s1-2", "ml", "r-uid")
    assert (info.raycluster, info.slice_index, info.attempt, info.failures) == ("llm", 1, 2, 1)
    assert info.class_name == "queued-provisioning.gke.io" and info.spec_hash == "abc"
    assert info.created == datetime(2026, 11, 30, 11, 0, tzinfo=UTC)
    assert info.is_true("Provisioned") and info.is_true("Accepted")
    cond = info.condition("Provisioned")
    assert cond is not None and cond.last_transition == datetime(2026, 11, 30, 11, 55, tzinfo=UTC)
    assert info.node_pool == "dws-pool"
    assert not info.deleting and set(info.conditions) == {"Provisioned", "Accepted"}


def test_provisioning_request_info_of_a_bare_object() -> None:
    info = provisioning_request_info({"metadata": {"name": "x", "deletionTimestamp": "now"}})
    assert info.attempt == 1 and info.failures == 0 and info.slice_index is None
    assert info.deleting and info.node_pool is None and info.created is None


def test_node_info_keeps_the_capacity_labels() -> None:
    node = node_info(
        {
            "metadata": {
                "name": "n",
                "labels": {
                    c.NODE_LABEL_SPOT: "true",
                    "other": "x",
                    c.NODE_LABEL_COMPUTE_CLASS: "k",
                },
            }
        }
    )
    assert node.capacity_labels == {c.NODE_LABEL_SPOT: "true", c.NODE_LABEL_COMPUTE_CLASS: "k"}


def test_pool_matches_selector() -> None:
    def node(**labels: str) -> NodeInfo:
        return builders.node("n", "p", capacity_labels=labels)

    spot = {c.NODE_LABEL_SPOT: "true"}
    assert pool_matches_selector([node()], {})
    assert pool_matches_selector([node(**spot), node(**spot)], spot)
    assert not pool_matches_selector([node(**spot), node()], spot)
    assert not pool_matches_selector([], spot)


def test_history_from_status_round_trips_slice_status() -> None:
    entry = SliceStatus(
        1, SliceState.PROVISIONING, provisioning=SliceProvisioning("llm-s1-3", 3, 2)
    ).to_dict()
    assert entry["provisioning"] == {"request": "llm-s1-3", "attempt": 3, "failures": 2}
    status = {"slices": [entry, {"index": 0, "state": "Ready"}, {"provisioning": {}}, "junk"]}
    assert history_from_status(status) == {1: SliceProvisioning("llm-s1-3", 3, 2)}
    assert history_from_status({"slices": [{"index": 2, "provisioning": {"attempt": "x"}}]}) == {}


def test_slices_to_provision_leaves_the_first_to_free_pools() -> None:
    assert slices_to_provision([3, 1, 2], 0) == {1, 2, 3}
    assert slices_to_provision([3, 1, 2], 1) == {2, 3}
    assert slices_to_provision([3, 1, 2], 5) == frozenset()
    assert slices_to_provision([], 1) == frozenset()


# ------------------------------------------------------------------------ backoff


def test_backoff_doubles_from_the_base_up_to_the_max() -> None:
    retry = RetryPolicy(limit=10, base_backoff_seconds=60, max_backoff_seconds=1800)
    assert [backoff_seconds(n, retry) for n in range(8)] == [0, 60, 120, 240, 480, 960, 1800, 1800]
    assert backoff_seconds(10_000, retry) == 1800
    assert retry_time(NOW, 2, retry) == NOW + timedelta(seconds=120)


@given(st.integers(1, 86_400), st.integers(1, 604_800), st.integers(-3, 500), st.integers(0, 500))
def test_backoff_is_bounded_and_never_shrinks(base: int, high: int, n: int, more: int) -> None:
    if base > high:
        base, high = high, base
    retry = RetryPolicy(limit=100, base_backoff_seconds=base, max_backoff_seconds=high)
    wait = backoff_seconds(n, retry)
    assert 0 <= wait <= high
    assert (wait >= base) == (n >= 1)
    assert backoff_seconds(n + more, retry) >= wait


# ------------------------------------------------------------ configuration errors


@pytest.mark.parametrize(
    ("reason", "message", "expected"),
    [
        ("NoQueuedNodepoolAvailable", "", True),
        ("MultiplePodSetsUnsupported", "", True),
        ("Whatever", "No nodepool with QueuedProvisioning enabled is available for scale up", True),
        (
            "AdmissionError",
            "the queued provisioning feature currently supports only single PodSet per request",
            True,
        ),
        ("ResourcePoolExhausted", "zone out of TPUs", False),
        ("Expired", "ProvisioningRequest is expired", False),
        ("CapacityIsNotFound", "", False),
    ],
)
def test_config_error(reason: str, message: str, expected: bool) -> None:
    assert config_error(RequestCondition("Failed", "True", reason, message)) is expected
    assert not config_error(RequestCondition("Failed", "False", reason, message))
    assert not config_error(None)


# ------------------------------------------------------------------ the state machine


def cond(
    kind: str, status: str = "True", reason: str = "", message: str = "", ago: float = 60
) -> RequestCondition:
    return RequestCondition(kind, status, reason or kind, message, NOW - timedelta(seconds=ago))


def req(
    *conditions: RequestCondition,
    spec: SliceClusterSpec = QUEUED,
    attempt: int = 1,
    failures: int = 0,
    details: dict[str, str] | None = None,
    created_ago: float = 300,
    deleting: bool = False,
    class_name: str | None = None,
    spec_hash: str | None = None,
) -> ProvisioningRequestInfo:
    assert spec.provisioning is not None
    return ProvisioningRequestInfo(
        namespace="ml",
        name=request_name("llm", 0, attempt),
        uid="r-uid",
        raycluster="llm",
        slice_index=0,
        attempt=attempt,
        failures=failures,
        class_name=spec.provisioning.class_name if class_name is None else class_name,
        spec_hash=request_hash(spec) if spec_hash is None else spec_hash,
        conditions={x.type: x for x in conditions},
        details=details or {},
        created=NOW - timedelta(seconds=created_ago),
        deleting=deleting,
    )


WAITING = SliceFacts(index=0, raycluster="llm", pods_complete=True)
INCOMPLETE = SliceFacts(index=0, raycluster="llm", pods_complete=False)
WITH_POOL = SliceFacts(index=0, raycluster="llm", pods_complete=True, pool="dws-pool")
RUNNING = SliceFacts(
    index=0, raycluster="llm", pods_complete=True, pool="dws-pool", released=True, bound=True
)
RELEASED_UNBOUND = SliceFacts(
    index=0, raycluster="llm", pods_complete=True, pool="dws-pool", released=True
)
GONE = SliceFacts(index=0, raycluster="llm", exists=False)
ELIGIBLE = SliceFacts(index=0, raycluster="llm", pods_complete=True, eligible_pool=True)


def test_first_request_once_all_pods_exist_and_no_pool_is_free() -> None:
    d = decide(WAITING, None, QUEUED, now=NOW)
    assert d.action == ProvisioningAction.CREATE
    assert (d.create_attempt, d.failures, d.request, d.attempt) == (1, 0, "llm-s0-1", 1)
    assert d.delete is None and d.state == SliceState.PROVISIONING
    assert d.reason == events.PROVISIONING_REQUESTED
    assert "queued-provisioning.gke.io" in d.message


def test_no_request_while_pods_are_missing_or_a_pool_is_free() -> None:
    for facts in (INCOMPLETE, ELIGIBLE):
        d = decide(facts, None, QUEUED, now=NOW)
        assert d.action == ProvisioningAction.NONE and d.state is None


def test_history_continues_the_count() -> None:
    d = decide(WAITING, None, QUEUED, now=NOW, history=SliceProvisioning("llm-s0-2", 2, 1))
    assert (d.action, d.create_attempt, d.failures, d.request) == (
        ProvisioningAction.CREATE,
        3,
        1,
        "llm-s0-3",
    )


def test_history_past_the_limit_stalls_instead_of_asking() -> None:
    d = decide(WAITING, None, QUEUED, now=NOW, history=SliceProvisioning("llm-s0-5", 5, 4))
    assert d.action == ProvisioningAction.STALL
    assert d.stalled and "retry.limit 3 spent" in d.stalled and d.create_attempt is None


def test_not_wanted_deletes_the_request_of_a_slice_without_a_pool() -> None:
    for spec in (
        spec_of(),
        spec_of({"mode": "None"}),
        spec_of({"mode": "QueuedProvisioning"}, suspend=True),
    ):
        r = req()
        d = decide(WAITING, r, spec, now=NOW)
        assert d.action == ProvisioningAction.DELETE and d.delete == r.name
        assert decide(WAITING, None, spec, now=NOW).action == ProvisioningAction.NONE
        assert decide(RUNNING, r, spec, now=NOW).action == ProvisioningAction.KEEP
        assert decide(WAITING, req(deleting=True), spec, now=NOW).action == ProvisioningAction.WAIT


def test_policy_none_never_provisions() -> None:
    spec = spec_of({"mode": "None"}, reservation={"policy": "None"})
    assert decide(WAITING, None, spec, now=NOW).action == ProvisioningAction.NONE


def test_a_request_being_deleted_is_waited_for() -> None:
    d = decide(WAITING, req(deleting=True), QUEUED, now=NOW)
    assert d.action == ProvisioningAction.WAIT and d.state == SliceState.PROVISIONING
    assert "being deleted" in d.message
    assert decide(WITH_POOL, req(deleting=True), QUEUED, now=NOW).state is None


def test_a_gone_slice_loses_its_request() -> None:
    r = req(cond("Accepted"))
    d = decide(GONE, r, QUEUED, now=NOW)
    assert d.action == ProvisioningAction.DELETE and d.delete == r.name
    assert d.reason == events.PROVISIONING_REQUEST_DELETED
    assert decide(GONE, None, QUEUED, now=NOW).action == ProvisioningAction.NONE


def test_waiting_carries_the_autoscalers_own_message() -> None:
    r = req(
        cond("Accepted", reason="SuccessfullyQueued", message="queued"),
        cond("Provisioned", "False", "NotProvisioned", "Expected capacity in 2h (position 3)"),
    )
    d = decide(WAITING, r, QUEUED, now=NOW)
    assert d.action == ProvisioningAction.WAIT and d.state == SliceState.PROVISIONING
    assert "Expected capacity in 2h (position 3)" in d.message
    d = decide(WAITING, req(cond("Accepted", message="")), QUEUED, now=NOW)
    assert "accepted; waiting for capacity" in d.message


def test_an_unaccepted_request_says_so_and_hints_after_a_while() -> None:
    d = decide(WAITING, req(created_ago=10), QUEUED, now=NOW)
    assert d.action == ProvisioningAction.WAIT and "to accept" in d.message
    assert "provisioning requests enabled" not in d.message
    d = decide(WAITING, req(created_ago=600), QUEUED, now=NOW)
    assert "provisioning requests enabled" in d.message


def test_an_existing_pool_wins_over_a_pending_request() -> None:
    r = req(cond("Accepted"))
    d = decide(ELIGIBLE, r, QUEUED, now=NOW)
    assert d.action == ProvisioningAction.DELETE and d.delete == r.name
    # a failed one is simply not needed any more
    d = decide(ELIGIBLE, req(cond("Failed", reason="ResourcePoolExhausted")), QUEUED, now=NOW)
    assert d.action == ProvisioningAction.DELETE


def test_a_slice_that_claimed_an_existing_pool_drops_its_pending_request() -> None:
    d = decide(WITH_POOL, req(cond("Accepted")), QUEUED, now=NOW)
    assert d.action == ProvisioningAction.DELETE


def test_queued_provisioned_claims_the_named_pool_within_the_window() -> None:
    r = req(cond("Accepted"), cond("Provisioned", ago=30), details={"NodePoolName": "dws-pool"})
    d = decide(WAITING, r, QUEUED, now=NOW)
    assert d.action == ProvisioningAction.CLAIM and d.claim_pool == "dws-pool"
    assert not d.search_pools and d.reason == events.CAPACITY_PROVISIONED
    assert d.retry_at == NOW - timedelta(seconds=30) + timedelta(seconds=CLAIM_WITHIN_SECONDS)
    # the new pool is eligible now: it is claimed, the request is not deleted
    d = decide(ELIGIBLE, r, QUEUED, now=NOW)
    assert d.action == ProvisioningAction.CLAIM and d.delete is None


def test_queued_provisioned_without_a_pool_name_waits_until_the_deadline() -> None:
    d = decide(WAITING, req(cond("Provisioned", ago=30)), QUEUED, now=NOW)
    assert d.action == ProvisioningAction.WAIT and "names no node pool" in d.message
    assert d.retry_at is not None


def test_other_classes_search_fresh_whole_pools() -> None:
    r = req(cond("Provisioned", reason="CapacityIsProvisioned", ago=5), spec=ATOMIC)
    d = decide(WAITING, r, ATOMIC, now=NOW)
    assert d.action == ProvisioningAction.CLAIM and d.search_pools and d.claim_pool is None


def test_not_claimed_within_the_window_is_given_back_and_asked_again() -> None:
    r = req(cond("Provisioned", ago=CLAIM_WITHIN_SECONDS + 1), details={"NodePoolName": "p"})
    d = decide(WAITING, r, QUEUED, now=NOW)
    assert d.action == ProvisioningAction.RETRY
    assert (d.delete, d.create_attempt, d.failures) == ("llm-s0-1", 2, 1)
    assert d.reason == events.BOOKING_GIVEN_BACK
    # and when that spends the limit, Stalled
    r = req(cond("Provisioned", ago=CLAIM_WITHIN_SECONDS + 1), failures=3, attempt=4)
    assert decide(WAITING, r, QUEUED, now=NOW).action == ProvisioningAction.STALL


def test_a_claimed_pool_keeps_the_provisioned_request_until_the_release() -> None:
    r = req(cond("Provisioned", ago=30), details={"NodePoolName": "dws-pool"})
    assert decide(WITH_POOL, r, QUEUED, now=NOW).action == ProvisioningAction.KEEP


def test_a_running_slice_keeps_its_request() -> None:
    r = req(cond("Provisioned", ago=3600), cond("BookingExpired", ago=3000))
    d = decide(RUNNING, r, QUEUED, now=NOW)
    assert d.action == ProvisioningAction.KEEP and d.delete is None and d.state is None
    assert decide(RUNNING, None, QUEUED, now=NOW).action == ProvisioningAction.NONE


def test_capacity_revoked_replaces_a_running_slice() -> None:
    r = req(cond("Provisioned", ago=7200), cond("CapacityRevoked", ago=1))
    d = decide(RUNNING, r, QUEUED, now=NOW)
    assert d.action == ProvisioningAction.REPLACE and d.replace_slice
    assert d.delete == r.name and d.reason == events.CAPACITY_REVOKED
    assert d.failures == 0  # the end of a lease is no failure


@pytest.mark.parametrize("kind", ["BookingExpired", "Failed"])
def test_capacity_lost_before_every_pod_was_bound_replaces_the_slice(kind: str) -> None:
    r = req(cond("Provisioned", ago=700), cond(kind, ago=1))
    d = decide(RELEASED_UNBOUND, r, QUEUED, now=NOW)
    assert d.action == ProvisioningAction.REPLACE and d.failures == 1
    # bound pods ignore a late BookingExpired / Failed
    assert decide(RUNNING, r, QUEUED, now=NOW).action == ProvisioningAction.KEEP


@pytest.mark.parametrize("kind", ["BookingExpired", "CapacityRevoked", "Failed"])
def test_booking_lapsed_under_an_unreleased_pool_gives_it_back(kind: str) -> None:
    r = req(cond("Provisioned", ago=700), cond(kind, ago=1))
    d = decide(WITH_POOL, r, QUEUED, now=NOW)
    assert d.action == ProvisioningAction.GIVE_BACK and d.give_back
    assert d.delete is None  # kept: the next pass retries after the backoff from its time
    gang = SliceFacts(
        index=0, raycluster="llm", pods_complete=True, pool="dws-pool", gang_waiting=True
    )
    d = decide(gang, r, QUEUED, now=NOW)
    assert d.give_back and d.delete == r.name and d.failures == 0  # no failure of its own


def test_failed_is_retried_after_the_backoff() -> None:
    retry = QUEUED.provisioning.retry if QUEUED.provisioning else RetryPolicy()
    failed = cond("Failed", reason="ResourcePoolExhausted", message="no TPUs", ago=10)
    d = decide(WAITING, req(failed), QUEUED, now=NOW)
    assert d.action == ProvisioningAction.WAIT and d.state == SliceState.PROVISIONING
    assert d.retry_at == NOW - timedelta(seconds=10) + timedelta(seconds=retry.base_backoff_seconds)
    assert "no TPUs" in d.message and "attempt 2 at" in d.message
    assert d.reason == events.PROVISIONING_RETRY
    later = NOW + timedelta(seconds=retry.base_backoff_seconds)
    d = decide(WAITING, req(failed), QUEUED, now=later)
    assert d.action == ProvisioningAction.RETRY
    assert (d.delete, d.create_attempt, d.failures, d.request) == ("llm-s0-1", 2, 1, "llm-s0-2")


def test_the_second_failure_waits_twice_as_long() -> None:
    failed = cond("Failed", reason="ResourcePoolExhausted", ago=0)
    d = decide(WAITING, req(failed, attempt=2, failures=1), QUEUED, now=NOW)
    assert d.retry_at == NOW + timedelta(seconds=120)


def test_retry_waits_for_all_pods() -> None:
    failed = cond("Failed", reason="ResourcePoolExhausted", ago=10_000)
    d = decide(INCOMPLETE, req(failed), QUEUED, now=NOW)
    assert d.action == ProvisioningAction.WAIT and d.retry_at is None


def test_failures_past_the_limit_stall() -> None:
    failed = cond("Failed", reason="ResourcePoolExhausted", message="no TPUs")
    d = decide(WAITING, req(failed, attempt=4, failures=3), QUEUED, now=NOW)
    assert d.action == ProvisioningAction.STALL and d.stalled
    assert "4 failed attempts" in d.stalled and "raise the limit" in d.stalled
    assert d.reason == events.PROVISIONING_FAILED
    raised = spec_of({"mode": "QueuedProvisioning", "retry": {"limit": 10}})
    d = decide(
        WAITING,
        req(failed, spec=raised, attempt=4, failures=3),
        raised,
        now=NOW + timedelta(days=1),
    )
    assert d.action == ProvisioningAction.RETRY


def test_limit_zero_stalls_on_the_first_failure() -> None:
    spec = spec_of({"mode": "QueuedProvisioning", "retry": {"limit": 0}})
    d = decide(WAITING, req(cond("Failed"), spec=spec), spec, now=NOW)
    assert d.action == ProvisioningAction.STALL


@pytest.mark.parametrize("kind", ["BookingExpired", "CapacityRevoked"])
def test_lapsed_before_a_claim_is_retried_like_a_failure(kind: str) -> None:
    r = req(cond("Provisioned", ago=700), cond(kind, ago=1))
    d = decide(WAITING, r, QUEUED, now=NOW)
    assert d.action == ProvisioningAction.WAIT and d.retry_at is not None
    assert d.reason in (events.BOOKING_EXPIRED, events.CAPACITY_REVOKED)
    d = decide(WAITING, r, QUEUED, now=NOW + timedelta(hours=1))
    assert d.action == ProvisioningAction.RETRY and d.failures == 1


def test_configuration_error_stalls_with_the_autoscalers_message() -> None:
    failed = cond(
        "Failed",
        reason="NoQueuedNodepoolAvailable",
        message="No nodepool with QueuedProvisioning enabled is available for scale up",
        ago=10,
    )
    d = decide(WAITING, req(failed), QUEUED, now=NOW)
    assert d.action == ProvisioningAction.STALL and d.stalled
    assert "No nodepool with QueuedProvisioning enabled" in d.stalled
    assert d.failures == 0 and d.reason == events.PROVISIONING_FAILED
    assert d.retry_at == NOW - timedelta(seconds=10) + timedelta(seconds=1800)
    # tried again every maxBackoffSeconds, without spending the limit
    d = decide(WAITING, req(failed), QUEUED, now=NOW + timedelta(seconds=1800))
    assert d.action == ProvisioningAction.RETRY and d.failures == 0 and d.create_attempt == 2


def test_a_request_from_another_spec_is_replaced_before_it_is_provisioned() -> None:
    old = req(cond("Accepted"), class_name="best-effort-atomic-scale-up.autoscaling.x-k8s.io")
    d = decide(WAITING, old, QUEUED, now=NOW)
    assert d.action == ProvisioningAction.RETRY and d.failures == 0 and d.create_attempt == 2
    d = decide(WAITING, req(cond("Accepted"), spec_hash="other"), QUEUED, now=NOW)
    assert d.action == ProvisioningAction.RETRY
    # a provisioned one is used as it is
    d = decide(
        WAITING,
        req(cond("Provisioned", ago=5), spec_hash="other", details={"NodePoolName": "p"}),
        QUEUED,
        now=NOW,
    )
    assert d.action == ProvisioningAction.CLAIM


# ---------------------------------------------------------------- properties

conditions = st.lists(
    st.builds(
        RequestCondition,
        type=st.sampled_from(
            ["Accepted", "Provisioned", "Failed", "BookingExpired", "CapacityRevoked"]
        ),
        status=st.sampled_from(["True", "False", "Unknown"]),
        reason=st.sampled_from(["", "NoQueuedNodepoolAvailable", "ResourcePoolExhausted", "X"]),
        message=st.sampled_from(["", "queued", "No nodepool with QueuedProvisioning enabled"]),
        last_transition=st.one_of(
            st.none(), st.integers(0, 7200).map(lambda s: NOW - timedelta(seconds=s))
        ),
    ),
    max_size=5,
)
facts = st.builds(
    SliceFacts,
    index=st.just(0),
    raycluster=st.just("llm"),
    exists=st.booleans(),
    pods_complete=st.booleans(),
    pool=st.one_of(st.none(), st.just("pool-a")),
    released=st.booleans(),
    bound=st.booleans(),
    eligible_pool=st.booleans(),
    gang_waiting=st.booleans(),
)
specs = st.sampled_from([QUEUED, ATOMIC, spec_of(), spec_of({"mode": "None"})])


@st.composite
def requests(draw: st.DrawFn) -> ProvisioningRequestInfo | None:
    if draw(st.booleans()):
        return None
    spec = draw(st.sampled_from([QUEUED, ATOMIC]))
    attempt = draw(st.integers(1, 6))
    return req(
        *draw(conditions),
        spec=spec,
        attempt=attempt,
        failures=draw(st.integers(0, attempt - 1)),
        details=draw(st.sampled_from([{}, {"NodePoolName": "dws-pool"}])),
        created_ago=draw(st.integers(0, 7200)),
        deleting=draw(st.booleans()),
    )


@settings(max_examples=600, deadline=None)
@given(facts, requests(), specs, st.integers(0, 100_000))
def test_decide_is_total_and_keeps_its_promises(
    slice_: SliceFacts, request: ProvisioningRequestInfo | None, spec: SliceClusterSpec, later: int
) -> None:
    now = NOW + timedelta(seconds=later)
    d = decide(slice_, request, spec, now=now)
    assert d.index == 0
    if d.create_attempt is not None:
        # a request is asked for only for an existing slice with all its pods, holding
        # no pool, with no free pool there for it, and as the next attempt
        assert slice_.exists and slice_.pods_complete and slice_.pool is None
        assert not slice_.eligible_pool and not slice_.released
        assert spec.provisions
        assert d.create_attempt == (request.attempt if request else 0) + 1
        assert d.request == request_name("llm", 0, d.create_attempt)
        assert d.state == SliceState.PROVISIONING
        limit = spec.provisioning.retry.limit if spec.provisioning else 0
        assert d.failures <= limit
    if request is None:
        assert d.delete is None
    if d.delete is not None:
        assert request is not None and d.delete == request.name and not request.deleting
    if d.action == ProvisioningAction.RETRY:
        assert d.delete is not None and d.create_attempt is not None
    if d.give_back:
        assert slice_.pool is not None and not slice_.released
    if d.replace_slice:
        assert slice_.released
    if slice_.released and slice_.exists and request is not None and spec.provisions:
        # never deletes the request whose capacity a running slice uses, unless it is gone
        uses = request.is_true("Provisioned") and request.node_pool in (None, slice_.pool)
        assert d.delete is None or d.replace_slice or not uses
    if d.claim_pool is not None or d.search_pools:
        assert slice_.pool is None and spec.provisions
    assert d.stalled is None or d.action == ProvisioningAction.STALL
    assert (d.retry_at is None) or d.retry_at > now
    assert d.failures >= (request.failures if request else 0)


def test_group_requests_picks_the_newest_attempt_per_slice() -> None:
    def r(
        name: str, raycluster: str, index: int | None, attempt: int, deleting: bool = False
    ) -> ProvisioningRequestInfo:
        return ProvisioningRequestInfo(
            "ml", name, raycluster=raycluster, slice_index=index, attempt=attempt, deleting=deleting
        )

    a1, a2, b1 = r("llm-s0-1", "llm", 0, 1), r("llm-s0-2", "llm", 0, 2), r("llm-s1-1", "llm", 1, 1)
    stray = r("x", "", None, 1)
    gone = r("llm-s0-0", "llm", 0, 0, deleting=True)
    newest, extra = group_requests([a2, b1, stray, a1, gone])
    assert newest == {("llm", 0): a2, ("llm", 1): b1}
    assert extra == [stray, a1]


def test_the_decision_says_what_status_keeps() -> None:
    assert decide(INCOMPLETE, None, QUEUED, now=NOW).provisioning_status() is None
    created = decide(WAITING, None, QUEUED, now=NOW).provisioning_status()
    assert created == SliceProvisioning("llm-s0-1", 1, 0)
    failed = cond("Failed", reason="ResourcePoolExhausted", ago=10_000)
    dropped = decide(INCOMPLETE, req(failed), QUEUED, now=NOW)
    assert dropped.action == ProvisioningAction.WAIT
    given_back = decide(INCOMPLETE, req(cond("Provisioned", ago=10_000)), QUEUED, now=NOW)
    assert given_back.action == ProvisioningAction.DELETE
    assert given_back.provisioning_status() == SliceProvisioning("llm-s0-1", 1, 1)
    # the next pass, with no request, goes on from that count
    again = decide(WAITING, None, QUEUED, now=NOW, history=given_back.provisioning_status())
    assert (again.create_attempt, again.failures) == (2, 1)


def test_promised_pools_are_those_of_live_provisioned_requests() -> None:
    pool = {"NodePoolName": "dws-pool"}
    live = req(cond("Provisioned"), details=pool)
    assert promised_pools([live]) == {"dws-pool": "llm-s0-1"}
    assert promised_pools([req(cond("Provisioned", "False"), details=pool)]) == {}
    assert promised_pools([req(cond("Provisioned"), cond("BookingExpired"), details=pool)]) == {}
    assert promised_pools([req(cond("Provisioned"), details=pool, deleting=True)]) == {}
    assert promised_pools([req(cond("Provisioned"))]) == {}


def test_past_the_window_with_a_free_pool_the_request_is_just_dropped() -> None:
    r = req(cond("Provisioned", ago=CLAIM_WITHIN_SECONDS), details={"NodePoolName": "p"})
    d = decide(ELIGIBLE, r, QUEUED, now=NOW)
    assert d.action == ProvisioningAction.DELETE and d.create_attempt is None
    assert d.failures == 0 and d.reason == events.BOOKING_GIVEN_BACK


def test_a_slice_on_an_existing_pool_drops_a_leftover_request() -> None:
    never = req(cond("Failed", reason="ResourcePoolExhausted"))  # never provisioned
    for facts in (WITH_POOL, RUNNING, RELEASED_UNBOUND):
        d = decide(facts, never, QUEUED, now=NOW)
        assert d.action == ProvisioningAction.DELETE and not d.give_back and not d.replace_slice
    elsewhere = req(cond("Provisioned"), cond("CapacityRevoked"), details={"NodePoolName": "other"})
    for facts in (WITH_POOL, RUNNING):
        d = decide(facts, elsewhere, QUEUED, now=NOW)
        assert d.action == ProvisioningAction.DELETE and not d.give_back and not d.replace_slice


def test_a_provisioning_slice_explains_ready_false_and_posts_an_event() -> None:
    from tpuslice.status.conditions import Observed, desired_conditions, slice_events

    slices = [
        SliceStatus(0, SliceState.READY, "tpu-a", "pool-a", 4),
        SliceStatus(
            1,
            SliceState.PROVISIONING,
            "tpu-b",
            message="queued: expected in 2h",
            provisioning=SliceProvisioning("llm-s1-1", 1, 0),
        ),
    ]
    observed = Observed(
        generation=1,
        accelerator_type="v6e-16",
        hosts_per_slice=4,
        chips_per_host=4,
        ray_cluster="llm",
        desired_slices=2,
        slices=slices,
        ray_cluster_ready=True,
        suspended=False,
        gated=True,
        applied=True,
    )
    ready = next(x for x in desired_conditions(observed) if x["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "Provisioning"
    assert "slice 1: queued: expected in 2h" in ready["message"]
    (event,) = [e for e in slice_events([], slices) if e[1] == events.PROVISIONING_CAPACITY]
    assert event[0] == "Normal" and "queued: expected in 2h" in event[2]


def test_a_booking_the_pods_consumed_never_replaces_the_slice() -> None:
    """The OSS autoscaler sets BookingExpired with reason CapacityBookingConsumed as soon
    as the request's pods are bound; our pod store may show the binding later, so a
    released slice that looks unbound keeps its request (no replacement)."""
    consumed = req(
        cond(c.PROVREQ_PROVISIONED),
        cond(c.PROVREQ_BOOKING_EXPIRED, reason="CapacityBookingConsumed", ago=1),
    )
    assert decide(RELEASED_UNBOUND, consumed, QUEUED, now=NOW).action == ProvisioningAction.KEEP
    lapsed = req(
        cond(c.PROVREQ_PROVISIONED),
        cond(c.PROVREQ_BOOKING_EXPIRED, reason="CapacityReservationTimeExpired", ago=1),
    )
    assert decide(RELEASED_UNBOUND, lapsed, QUEUED, now=NOW).action == ProvisioningAction.REPLACE
