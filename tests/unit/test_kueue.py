"""Kueue and the operator: spec.kueue parsed and refused where Kueue and the operator would
both decide, Kueue's labels rendered, and the applier never unsuspending what Kueue holds."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from tests.support.builders import nodes_of, slice_pods, tpuslice
from tests.support.builders import tpu as tpu_spec
from tests.support.fake_kube import FakeKube
from tpuslice.controller.actuator import desired_of
from tpuslice.controller.applier import (
    applied_hash,
    kueue_managed,
    with_admission_hold,
    with_resume,
)
from tpuslice.controller.job import JobKind
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model import constants as c
from tpuslice.model.convert import ray_owner_info, raycluster_info, workload_info
from tpuslice.model.records import Holder, KueueWorkload, ReservationInfo, Snapshot
from tpuslice.render.kuberay import render_cluster, render_job
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.job import parse_job
from tpuslice.spec.parts import KueueSpec, SpecError
from tpuslice.spec.service import parse_service
from tpuslice.status.kueue import PodsReadyTimeouts, pods_ready_deadline

QUEUE = "kueue.x-k8s.io/queue-name"


def tsc(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"tpu": {"type": "v6e", "topology": "4x4"}, "ray": {"version": "2.54.0"}}
    base.update(spec)
    meta: dict[str, Any] = {"name": "llm", "namespace": "ml", "uid": "u"}
    if labels:
        meta["labels"] = labels
    return {"metadata": meta, "spec": base}


def tsj(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    body = tsc(labels, job={"entrypoint": "python train.py"}, **spec)
    return body


def errors_of(fn: Any, body: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as info:
        fn(body)
    return str(info.value)


def test_spec_kueue_is_parsed_and_the_queue_label_is_copied_when_absent() -> None:
    spec = parse_cluster(tsc(kueue={"queueName": "tpu", "priorityClassName": "high"}))
    assert spec.kueue == KueueSpec("tpu", "high")
    labelled = parse_cluster(tsc({QUEUE: "team-a", c.KUEUE_PRIORITY_LABEL: "low"}))
    assert labelled.kueue == KueueSpec("team-a", "low")
    # spec.kueue wins over the label
    both = parse_cluster(tsc({QUEUE: "team-a"}, kueue={"queueName": "tpu"}))
    assert both.kueue == KueueSpec("tpu", "")
    assert parse_cluster(tsc()).kueue is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (tsc(kueue={}), "spec.kueue.queueName: is required"),
        (tsc(kueue={"queueName": "Not_A_Name"}), "spec.kueue.queueName: 'Not_A_Name' is not"),
        (tsc(kueue={"queueName": "q", "extra": 1}), "spec.kueue.extra: is not a field"),
        (tsc(kueue={"queueName": "q"}, suspend=True), "spec.suspend: cannot be true"),
        (
            tsc(
                worker={
                    "template": {
                        "metadata": {
                            "annotations": {
                                "kueue.x-k8s.io/podset-required-topology": (
                                    "cloud.google.com/gce-topology-block"
                                )
                            }
                        }
                    }
                }
            ),
            "spec.worker.template.metadata.annotations[kueue.x-k8s.io/podset-required-topology]",
        ),
        (
            tsc(
                worker={
                    "template": {
                        "metadata": {
                            "annotations": {
                                "kueue.x-k8s.io/podset-preferred-topology": (
                                    "cloud.google.com/gke-nodepool"
                                )
                            }
                        }
                    }
                }
            ),
            "annotations[kueue.x-k8s.io/podset-preferred-topology]: asks Kueue's",
        ),
    ],
)
def test_refusals_name_the_field(body: dict[str, Any], expected: str) -> None:
    assert expected in errors_of(parse_cluster, body)


def test_kueue_topology_annotation_on_the_head_is_left_to_kueue() -> None:
    head = {"template": {"metadata": {"annotations": {c.KUEUE_REQUIRED_TOPOLOGY: "rack"}}}}
    assert parse_cluster(tsc(head=head)).head.template


def test_job_suspend_is_refused_with_kueue_and_a_service_refuses_kueue() -> None:
    job = tsj(kueue={"queueName": "q"})
    job["spec"]["job"]["suspend"] = True
    assert "spec.job.suspend: cannot be true" in errors_of(parse_job, job)
    service = tsc({QUEUE: "q"}, serve={"serveConfigV2": "applications: []\n"})
    assert f"metadata.labels[{QUEUE}]: is not supported" in errors_of(parse_service, service)


def test_render_carries_kueue_labels_and_never_suspend() -> None:
    rc = render_cluster(tsc(kueue={"queueName": "tpu", "priorityClassName": "high"}))
    assert rc["metadata"]["labels"][QUEUE] == "tpu"
    assert rc["metadata"]["labels"][c.KUEUE_PRIORITY_LABEL] == "high"
    assert "suspend" not in rc["spec"]
    job = render_job(tsj({QUEUE: "tpu"}))
    assert job["metadata"]["labels"][QUEUE] == "tpu"
    assert "suspend" not in job["spec"]
    assert QUEUE not in render_cluster(tsc())["metadata"]["labels"]


def live(rendered: dict[str, Any], suspend: bool | None, manager: str, **labels: str) -> Any:
    """``rendered`` as the watch shows it, with ``suspend`` set by ``manager``."""
    spec = dict(rendered["spec"])
    if suspend is not None:
        spec["suspend"] = suspend
    fields = {"manager": manager, "fieldsV1": {"f:spec": {"f:suspend": {}}}}
    meta = {
        **rendered["metadata"],
        "labels": {**rendered["metadata"]["labels"], **labels},
        "resourceVersion": "7",
        "managedFields": [fields],
    }
    return raycluster_info({**rendered, "metadata": meta, "spec": spec})


def test_apply_suspends_at_create_then_carries_only_a_live_suspension() -> None:
    rendered = render_cluster(tsc(kueue={"queueName": "tpu"}))
    created = with_admission_hold(rendered, None)
    assert created["spec"]["suspend"] is True and "resourceVersion" not in created["metadata"]
    # still held: true carried, guarded by the resourceVersion it was read at
    held = with_admission_hold(rendered, live(rendered, True, c.FIELD_MANAGER))
    assert held["spec"]["suspend"] is True and held["metadata"]["resourceVersion"] == "7"
    # admitted: Kueue's false is left alone, never sent back
    admitted = with_admission_hold(rendered, live(rendered, False, "kueue"))
    assert "suspend" not in admitted["spec"] and "resourceVersion" not in admitted["metadata"]


def test_resume_is_never_sent_for_an_object_kueue_admits() -> None:
    plain = render_cluster(tsc())
    # Kueue's webhook labelled and suspended it inside our create (default LocalQueue),
    # and the field is recorded under our manager: no false is sent
    defaulted = live(plain, True, c.FIELD_MANAGER, **{QUEUE: "default"})
    assert kueue_managed(plain, defaulted)
    assert "suspend" not in with_resume(plain, defaulted)["spec"]
    body = with_admission_hold(plain, defaulted)
    assert body["spec"]["suspend"] is True
    assert body["metadata"]["labels"][QUEUE] == "default"  # Kueue's label carried
    # without Kueue, a suspension of ours is still lifted by an explicit false
    ours = live(plain, True, c.FIELD_MANAGER)
    assert with_resume(plain, ours)["spec"]["suspend"] is False
    assert "suspend" not in with_admission_hold(plain, ours)["spec"]


# ------------------------------------------------------------ the pass and Kueue's hold
UID = "uid-llm"
KEY = ("TPUSliceCluster", "ml", "llm")


def queued_body(**spec: Any) -> dict[str, Any]:
    return tpuslice(
        uid=UID, generation=1, tpu=tpu_spec(slices=1), kueue={"queueName": "tpu"}, **spec
    )


def live_rc(body: dict[str, Any], suspend: bool, **labels: str) -> dict[str, Any]:
    rendered = render_cluster(body)
    rendered["metadata"]["annotations"] = {c.ANNOTATION_APPLIED_HASH: applied_hash(rendered)}
    rendered["metadata"]["labels"].update(labels)
    rendered["metadata"]["resourceVersion"] = "9"
    rendered["spec"]["suspend"] = suspend
    return raycluster_info(rendered)


def one_pass(snap: Snapshot) -> FakeKube:
    kube = FakeKube()
    asyncio.run(Reconciler(kube, lambda key: snap).kick(KEY))
    return kube


def condition_of(status: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    assert status is not None
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_first_pass_creates_suspended_claims_nothing_and_says_awaiting_admission() -> None:
    kube = one_pass(Snapshot(queued_body(), [], nodes_of("pool-a"), [], None))
    (applied,) = kube.applied
    assert applied["spec"]["suspend"] is True
    assert applied["metadata"]["labels"][QUEUE] == "tpu"
    assert not [call for call in kube.calls if call[0] == "claim"]
    assert kube.status is not None
    assert kube.status["slices"][0]["state"] == "AwaitingAdmission"
    assert "LocalQueue tpu" in kube.status["slices"][0]["message"]
    admitted = condition_of(kube.status, "KueueAdmitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "AwaitingAdmission")
    assert condition_of(kube.status, "Ready")["reason"] == "AwaitingAdmission"


def test_no_claim_while_suspended_nor_for_pods_kueue_gates_then_claims_once_admitted() -> None:
    body = queued_body()
    suspended = Snapshot(body, slice_pods(), nodes_of("pool-a"), [], live_rc(body, True))
    held = one_pass(suspended)
    assert not [call for call in held.calls if call[0] in ("claim", "release", "apply")]
    gated = Snapshot(
        body, slice_pods(kueue_gated=True), nodes_of("pool-a"), [], live_rc(body, False)
    )
    assert not [call for call in one_pass(gated).calls if call[0] == "claim"]
    admitted = one_pass(Snapshot(body, slice_pods(), nodes_of("pool-a"), [], live_rc(body, False)))
    assert ("claim", "pool-a") in admitted.calls
    assert not admitted.applied  # Kueue's false is not ours to send, nothing else changed
    assert condition_of(admitted.status, "KueueAdmitted")["status"] == "True"


def test_eviction_gives_the_pool_back_and_the_slice_says_why() -> None:
    body = queued_body()
    reservation = ReservationInfo("pool-a", Holder("ml", "llm", UID, "tpu-aaaaa", 0), "Bound")
    pods = slice_pods(gated=False, pool="pool-a", deleting=True)
    kube = one_pass(Snapshot(body, pods, nodes_of("pool-a"), [reservation], live_rc(body, True)))
    assert kube.status is not None
    (entry,) = kube.status["slices"]
    assert entry["nodePool"] == "pool-a" and "Kueue suspended RayCluster llm" in entry["message"]
    gone = one_pass(Snapshot(body, [], nodes_of("pool-a"), [reservation], live_rc(body, True)))
    assert ("free", "pool-a") in gone.calls


def test_an_object_kueue_holds_takes_no_place_in_the_queue() -> None:
    spec = parse_cluster(queued_body())
    held = {"status": {"conditions": [{"type": "KueueAdmitted", "status": "False"}]}}
    admitted = {"status": {"conditions": [{"type": "KueueAdmitted", "status": "True"}]}}
    assert desired_of(held, spec) == 0
    assert desired_of(admitted, spec) == 1


def test_default_local_queue_is_announced_and_held() -> None:
    body = tpuslice(uid=UID, generation=1, tpu=tpu_spec(slices=1))
    live = live_rc(body, True, **{QUEUE: "default"})
    kube = one_pass(Snapshot(body, slice_pods(), nodes_of("pool-a"), [], live))
    assert not [call for call in kube.calls if call[0] == "claim"]
    admitted = condition_of(kube.status, "KueueAdmitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "DefaultLocalQueue")
    assert "default LocalQueue default" in admitted["message"]
    assert ("event", "KueueDefaultLocalQueue") in kube.calls  # announced once
    # nothing to apply: the rendering is as live, and the suspension is Kueue's
    assert not kube.applied
    body["status"] = kube.status
    again = one_pass(Snapshot(body, slice_pods(), nodes_of("pool-a"), [], live))
    assert ("event", "KueueDefaultLocalQueue") not in again.calls


# ------------------------------------------------------------ Kueue's Workload and checks
def workload(uid: str, **conditions: tuple[str, str, str]) -> dict[str, Any]:
    """A Workload of the job ``uid`` with ``conditions``: type -> (status, reason, message)."""
    return {
        "metadata": {
            "name": "raycluster-llm-1a2b3",
            "namespace": "ml",
            "labels": {c.KUEUE_JOB_UID_LABEL: uid},
            "creationTimestamp": "2026-12-05T00:00:00Z",
        },
        "status": {
            "conditions": [
                {"type": kind, "status": status, "reason": reason, "message": message}
                for kind, (status, reason, message) in conditions.items()
            ],
            "admission": {"clusterQueue": "tpu"},
        },
    }


def test_an_eviction_says_kueues_reason_gives_the_pool_back_and_posts_an_event() -> None:
    body = queued_body()
    body["status"] = {
        "conditions": [{"type": "KueueAdmitted", "status": "True", "reason": "Admitted"}]
    }
    live = {**live_rc(body, True), "uid": "rc-uid"}
    evicted = workload(
        "rc-uid",
        Evicted=("True", "PodsReadyTimeout", "Exceeded the PodsReady timeout ml/llm"),
        QuotaReserved=("False", "Pending", "couldn't assign flavors"),
    )
    evicted["status"]["requeueState"] = {"count": 1, "requeueAt": "2026-12-05T10:01:00Z"}
    reservation = ReservationInfo("pool-a", Holder("ml", "llm", UID, "tpu-aaaaa", 0), "Bound")
    pods = slice_pods(gated=False, pool="pool-a", deleting=True)
    kube = FakeKube()
    kube.kueue = {("workloads", "ml", "raycluster-llm-1a2b3"): evicted}
    snap = Snapshot(body, pods, nodes_of("pool-a"), [reservation], live)
    asyncio.run(Reconciler(kube, lambda key: snap).kick(KEY))
    admitted = condition_of(kube.status, "KueueAdmitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "Evicted")
    assert "PodsReadyTimeout: Exceeded the PodsReady timeout" in admitted["message"]
    assert "Kueue: couldn't assign flavors" in admitted["message"]
    assert "again from 2026-12-05T10:01:00Z (Kueue's requeue backoff)" in admitted["message"]
    assert ("event", "KueueEvicted") in kube.calls
    assert kube.status is not None
    assert "(evicted: PodsReadyTimeout)" in kube.status["slices"][0]["message"]


def test_nothing_of_kueue_is_read_for_an_object_kueue_does_not_admit() -> None:
    kube = one_pass(Snapshot(tpuslice(uid=UID, generation=1), [], nodes_of("pool-a"), [], None))
    assert not [call for call in kube.calls if call[0] == "read-kueue"]


def provisioning_queue(managed: list[str] | None) -> dict[tuple[str, str, str], dict[str, Any]]:
    config: dict[str, Any] = {"spec": {"provisioningClassName": "queued-provisioning.gke.io"}}
    if managed is not None:
        config["spec"]["managedResources"] = managed
    return {
        ("localqueues", "ml", "tpu"): {"spec": {"clusterQueue": "tpu-cq"}},
        ("clusterqueues", "", "tpu-cq"): {"spec": {"admissionChecks": ["dws"]}},
        ("admissionchecks", "", "dws"): {
            "spec": {
                "controllerName": "kueue.x-k8s.io/provisioning-request",
                "parameters": {
                    "apiGroup": "kueue.x-k8s.io",
                    "kind": "ProvisioningRequestConfig",
                    "name": "dws-config",
                },
            }
        },
        ("provisioningrequestconfigs", "", "dws-config"): config,
    }


@pytest.mark.parametrize(
    ("managed", "conflict"),
    [(None, True), (["google.com/tpu"], True), (["nvidia.com/gpu"], False)],
)
def test_a_provisioning_admission_check_covering_tpus_stops_our_requests(
    managed: list[str] | None, conflict: bool
) -> None:
    body = queued_body(reservation={"provisioning": {"mode": "QueuedProvisioning"}})
    kube = FakeKube()
    kube.kueue = provisioning_queue(managed)
    snap = Snapshot(body, slice_pods(), [], [], {**live_rc(body, False), "uid": "rc-uid"})
    asyncio.run(Reconciler(kube, lambda key: snap).kick(KEY))
    stalled = condition_of(kube.status, "Stalled")
    made = [call for call in kube.calls if call[0] == "create-request"]
    if conflict:
        assert (stalled["status"], stalled["reason"]) == ("True", "KueueProvisioningCheck")
        assert (
            "managedResources" in stalled["message"] and "ClusterQueue tpu-cq" in stalled["message"]
        )
        assert not made
    else:
        assert stalled["status"] == "False"
        assert made


# ------------------------------------------------------------ a TPUSliceJob, and groups
def test_a_job_kueue_holds_creates_its_rayjob_suspended_and_claims_nothing() -> None:
    body = tpuslice(
        c.KIND_JOB,
        "train",
        uid="uid-train",
        generation=1,
        tpu=tpu_spec(slices=1),
        kueue={"queueName": "tpu"},
        job={"entrypoint": "python train.py"},
    )
    kube = FakeKube()
    snap = Snapshot(body, [], nodes_of("pool-a"), [], None)
    asyncio.run(
        Reconciler(kube, lambda key: snap, adapter=JobKind()).kick(("TPUSliceJob", "ml", "train"))
    )
    (applied,) = kube.applied
    assert applied["kind"] == "RayJob" and applied["spec"]["suspend"] is True
    assert applied["metadata"]["labels"][QUEUE] == "tpu"
    assert condition_of(kube.status, "KueueAdmitted")["status"] == "False"
    assert condition_of(kube.status, "Reconciling")["reason"] == "AwaitingAdmission"
    # Kueue's RayJob: suspended, KubeRay made a cluster anyway; its pods are not claimed for
    rayjob = ray_owner_info(
        {
            "metadata": {
                "name": "train",
                "namespace": "ml",
                "uid": "ray-uid",
                "labels": {QUEUE: "tpu"},
                "ownerReferences": [{"uid": "uid-train", "controller": True}],
            },
            "spec": {"suspend": True},
            "status": {"jobDeploymentStatus": "Suspended", "rayClusterName": "train-x"},
        }
    )
    pods = slice_pods(cluster="train", owner_kind=c.KIND_JOB, ray_cluster="train-x")
    held = Snapshot(body, pods, nodes_of("pool-a"), [], None, owned=rayjob)
    again = FakeKube()
    asyncio.run(
        Reconciler(again, lambda key: held, adapter=JobKind()).kick(("TPUSliceJob", "ml", "train"))
    )
    assert not [call for call in again.calls if call[0] == "claim"]


def test_groups_kueue_holds_claim_nothing_and_say_so() -> None:
    groups = [
        {"name": "a", "tpu": {"type": "v6e", "topology": "4x4", "slices": 1}},
        {"name": "b", "tpu": {"type": "v6e", "topology": "2x4", "slices": 1}},
    ]
    body = {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND_CLUSTER,
        "metadata": {"name": "llm", "namespace": "ml", "uid": UID, "generation": 1},
        "spec": {"workerGroups": groups, "ray": {"version": "2.54.0"}, "kueue": {"queueName": "q"}},
    }
    kube = one_pass(Snapshot(body, [], nodes_of("pool-a"), [], None))
    assert kube.applied[0]["spec"]["suspend"] is True
    assert not [call for call in kube.calls if call[0] == "claim"]
    assert condition_of(kube.status, "KueueAdmitted")["reason"] == "AwaitingAdmission"


def test_the_first_pass_after_admission_claims_though_the_last_status_said_held() -> None:
    body = tpuslice(uid=UID, generation=1, tpu=tpu_spec(slices=2), kueue={"queueName": "tpu"})
    body["status"] = {
        "conditions": [{"type": "KueueAdmitted", "status": "False", "reason": "AwaitingAdmission"}]
    }
    pods = slice_pods() + slice_pods("tpu-bbbbb", 1)
    nodes = nodes_of("pool-a") + nodes_of("pool-b")
    kube = one_pass(Snapshot(body, pods, nodes, [], live_rc(body, False)))
    assert {("claim", "pool-a"), ("claim", "pool-b")} <= set(kube.calls)


def _admitted_waiting(pods_ready: tuple[str, str, str], ready_at: str) -> dict[str, Any]:
    found = workload(
        "rc-uid",
        QuotaReserved=("True", "QuotaReserved", ""),
        Admitted=("True", "Admitted", ""),
        PodsReady=pods_ready,
    )
    found["status"]["conditions"][1]["lastTransitionTime"] = "2026-12-05T10:00:00Z"
    found["status"]["conditions"][2]["lastTransitionTime"] = ready_at
    return found


def _admitted_message(found: dict[str, Any], timeouts: PodsReadyTimeouts) -> str:
    body = queued_body()
    live = {**live_rc(body, False), "uid": "rc-uid"}
    kube = FakeKube()
    kube.kueue = {("workloads", "ml", "raycluster-llm-1a2b3"): found}
    snap = Snapshot(body, [], [], [], live)
    asyncio.run(Reconciler(kube, lambda key: snap, pods_ready=timeouts).kick(KEY))
    slices = [s for s in kube.status["slices"] if s["state"] != "Ready"]
    assert slices and all(
        ("Kueue evicts at" in s["message"]) == bool(timeouts.timeout_s) for s in slices
    ), slices
    return str(condition_of(kube.status, "KueueAdmitted")["message"])


def test_an_admitted_object_whose_pods_wait_says_since_when_kueue_counts() -> None:
    """Not told Kueue's timeout: the message names the time it counts from, the
    Admitted condition's (Kueue's WaitForStart), not PodsReady's, which Kueue may have
    set False before admission."""
    found = _admitted_waiting(("False", "WaitForStart", "not ready"), "2026-12-05T09:00:00Z")
    message = _admitted_message(found, PodsReadyTimeouts())
    assert "waitForPodsReady.timeout has passed since 2026-12-05T10:00:00Z" in message
    assert "--kueue-pods-ready-timeout" in message


def test_told_kueues_timeout_the_status_says_when_kueue_evicts() -> None:
    found = _admitted_waiting(("False", "WaitForStart", "not ready"), "2026-12-05T09:00:00Z")
    found["status"]["requeueState"] = {"count": 2}
    message = _admitted_message(found, PodsReadyTimeouts(300))
    assert (
        "Kueue evicts at 2026-12-05T10:05:00Z unless every pod is ready: waitForPodsReady "
        "timeout 300s (evicted 2 times before)"
    ) in message


def test_the_eviction_deadline_follows_kueues_rules() -> None:
    """kubernetes-sigs/kueue v0.17.0 workload_controller.go admittedNotReadyWorkload."""

    def info(pods_ready: tuple[str, str, str] | None) -> KueueWorkload:
        conds: dict[str, tuple[str, str, str]] = {"Admitted": ("True", "Admitted", "")}
        if pods_ready is not None:
            conds["PodsReady"] = pods_ready
        found = workload("rc-uid", **conds)
        for cond in found["status"]["conditions"]:
            cond["lastTransitionTime"] = (
                "2026-12-05T10:00:00Z" if cond["type"] == "Admitted" else "2026-12-05T11:00:00Z"
            )
        return workload_info(found)

    told = PodsReadyTimeouts(600)
    start = pods_ready_deadline(info(None), told)  # PodsReady not written yet: WaitForStart
    assert start is not None and (start.evicts_at, start.evict_timeout_s) == (
        "2026-12-05T10:10:00Z",
        600,
    )
    recovering = pods_ready_deadline(info(("False", "WaitForRecovery", "")), told)
    assert recovering is not None and recovering.evicts_at == "2026-12-05T11:10:00Z"
    own = pods_ready_deadline(info(("False", "WaitForRecovery", "")), PodsReadyTimeouts(600, 60))
    assert own is not None and own.evicts_at == "2026-12-05T11:01:00Z"
    off = pods_ready_deadline(info(("False", "WaitForRecovery", "")), PodsReadyTimeouts(600, 0))
    assert off is not None and off.evicts_at == ""
    ready = pods_ready_deadline(info(("True", "Started", "")), told)
    assert ready is not None and ready.evicts_at == ""
    untold = pods_ready_deadline(info(None), PodsReadyTimeouts())
    assert untold is not None and untold.evicts_at == ""
    assert pods_ready_deadline(None, told) is None


GATED_BY = c.KUEUE_ADMISSION_GATED_BY


def gated_body(slices: int = 1) -> dict[str, Any]:
    return tpuslice(
        uid=UID,
        generation=1,
        tpu=tpu_spec(slices=slices),
        kueue={"queueName": "tpu", "admissionGate": "UntilPoolsFree"},
    )


def test_admission_gate_is_parsed_and_refused_where_it_cannot_be_judged() -> None:
    spec = parse_cluster(tsc(kueue={"queueName": "tpu", "admissionGate": "UntilPoolsFree"}))
    assert spec.kueue == KueueSpec("tpu", "", "UntilPoolsFree")
    assert "spec.kueue.admissionGate" in errors_of(
        parse_cluster, tsc(kueue={"queueName": "tpu", "admissionGate": "Always"})
    )
    dynamic = tsc(
        kueue={"queueName": "tpu", "admissionGate": "UntilPoolsFree"},
        reservation={"policy": "DynamicSlice"},
    )
    dynamic["spec"]["tpu"] = {"type": "tpu7x", "topology": "4x4x4"}
    assert "spec.kueue.admissionGate" in errors_of(parse_cluster, dynamic)


def test_without_free_pools_the_object_is_created_with_the_admission_gate() -> None:
    """Pool-a is another's: the RayCluster is created suspended and gated by the operator
    in Kueue's admission-gated-by annotation; nothing is claimed; the status says why."""
    other = ReservationInfo("pool-a", Holder("ml", "other", "uid-o", "tpu-zzzzz", 0), "Bound")
    kube = one_pass(Snapshot(gated_body(), [], nodes_of("pool-a"), [other], None))
    (applied,) = kube.applied
    assert applied["metadata"]["annotations"][GATED_BY] == c.POOLS_FREE_GATE
    assert applied["spec"]["suspend"] is True
    assert not [call for call in kube.calls if call[0] == "claim"]
    admitted = condition_of(kube.status, "KueueAdmitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "AdmissionGated")
    assert "0 free v6e 4x4 node pools for the 1 slices" in admitted["message"]


def test_the_gate_stays_while_pools_are_short_and_is_lifted_once_they_are_free() -> None:
    body = gated_body(slices=2)
    live = live_rc(body, True)
    live["annotations"][GATED_BY] = c.POOLS_FREE_GATE
    # one free pool of two: the gate is kept (no apply needed: the live object has it)
    short = one_pass(Snapshot(body, [], nodes_of("pool-a"), [], live))
    assert short.applied == []
    assert condition_of(short.status, "KueueAdmitted")["reason"] == "AdmissionGated"
    # two free pools: an apply without the annotation (our field manager owns it, so the
    # apply removes it); still suspended, nothing claimed before Kueue admits
    free = one_pass(Snapshot(body, [], nodes_of("pool-a", "pool-b"), [], live))
    (applied,) = free.applied
    assert GATED_BY not in applied["metadata"]["annotations"]
    assert applied["spec"]["suspend"] is True
    assert not [call for call in free.calls if call[0] == "claim"]
    assert condition_of(free.status, "KueueAdmitted")["reason"] == "AwaitingAdmission"


def test_a_lifted_gate_is_never_put_back() -> None:
    """Once the live object lacks the gate (lifted, or the object made before the field
    was set) the operator never adds it: Kueue refuses adding one after creation."""
    body = gated_body()
    other = ReservationInfo("pool-a", Holder("ml", "other", "uid-o", "tpu-zzzzz", 0), "Bound")
    kube = one_pass(Snapshot(body, [], nodes_of("pool-a"), [other], live_rc(body, True)))
    assert kube.applied == []
    assert condition_of(kube.status, "KueueAdmitted")["reason"] == "AwaitingAdmission"


def test_an_admitted_object_drops_a_gate_kueue_ignored() -> None:
    """Kueue's AdmissionGatedBy feature gate off: Kueue admits despite the annotation; the
    operator lifts its gate rather than keep it on a running object."""
    body = gated_body()
    live = live_rc(body, False)
    live["annotations"][GATED_BY] = c.POOLS_FREE_GATE
    other = ReservationInfo("pool-a", Holder("ml", "other", "uid-o", "tpu-zzzzz", 0), "Bound")
    kube = one_pass(Snapshot(body, [], nodes_of("pool-a"), [other], live))
    (applied,) = kube.applied
    assert GATED_BY not in applied["metadata"]["annotations"]


# ------------------------------------------------------------ Kueue's elastic jobs


def elastic_body() -> dict[str, Any]:
    return tpuslice(
        uid=UID,
        generation=1,
        tpu=tpu_spec(slices=1),
        kueue={"queueName": "tpu"},
        elastic={"minSlices": 1, "maxSlices": 2},
    )


def test_an_elastic_cluster_kueue_admits_is_one_of_kueues_elastic_jobs() -> None:
    """Kueue v0.17 admits an autoscaled RayCluster only as an elastic job: annotated, and
    every template gated kueue.x-k8s.io/elastic-job (its webhook's validateElasticJob)."""
    rc = render_cluster(elastic_body())
    assert rc["metadata"]["annotations"] == {c.KUEUE_ELASTIC_JOB: "true"}
    assert rc["spec"]["enableInTreeAutoscaling"] is True
    templates = [rc["spec"]["headGroupSpec"]["template"]]
    templates += [g["template"] for g in rc["spec"]["workerGroupSpecs"]]
    for template in templates:
        names = [g["name"] for g in template["spec"]["schedulingGates"]]
        assert c.KUEUE_ELASTIC_JOB in names
    (worker,) = rc["spec"]["workerGroupSpecs"]
    names = [g["name"] for g in worker["template"]["spec"]["schedulingGates"]]
    assert names == [c.SCHEDULING_GATE, c.KUEUE_ELASTIC_JOB]  # ours stays
    # not elastic, or not Kueue's: nothing of it
    plain = render_cluster(queued_body())
    assert "annotations" not in plain["metadata"]
    body = elastic_body()
    del body["spec"]["kueue"]
    assert "annotations" not in render_cluster(body)["metadata"]


def test_the_elastic_job_annotation_is_applied_with_the_digest() -> None:
    kube = one_pass(Snapshot(elastic_body(), [], nodes_of("pool-a"), [], None))
    (applied,) = kube.applied
    annotations = applied["metadata"]["annotations"]
    assert annotations[c.KUEUE_ELASTIC_JOB] == "true"
    assert c.ANNOTATION_APPLIED_HASH in annotations
    # created at the minimum count, so Kueue's Workload asks quota for those slices
    assert applied["spec"]["workerGroupSpecs"][0]["replicas"] == 1


def test_a_tpuslicejob_keeps_kueue_and_elastic_apart() -> None:
    body = tsj(kueue={"queueName": "q"}, elastic={"minSlices": 1, "maxSlices": 2})
    assert "rayjob_webhook.go" in errors_of(parse_job, body)


def test_an_elastic_scale_up_waits_for_kueues_gate_then_claims() -> None:
    """Admitted at one slice (held on pool-a); the autoscaler asks for a second; its pods
    carry Kueue's elastic-job gate, one already ungated: nothing is claimed for it though
    pool-b is free. Once Kueue ungates them all, the reservation applies."""
    body = elastic_body()
    live = live_rc(body, False)
    live["spec"]["workerGroupSpecs"][0]["replicas"] = 2
    held = ReservationInfo("pool-a", Holder("ml", "llm", UID, "tpu-aaaaa", 0), "Bound")
    first = slice_pods(gated=False, pool="pool-a")
    second = slice_pods("tpu-bbbbb", 1)
    partly = [replace(p, kueue_gated=i > 0) for i, p in enumerate(second)]
    nodes = nodes_of("pool-a", "pool-b")
    waiting = one_pass(Snapshot(body, first + partly, nodes, [held], live))
    assert not [call for call in waiting.calls if call[0] == "claim"]
    assert waiting.status is not None
    second_state = next(s for s in waiting.status["slices"] if s["index"] == 1)
    assert "Kueue has not admitted the scale-up" in second_state["message"], second_state
    admitted = one_pass(Snapshot(body, first + second, nodes, [held], live))
    assert ("claim", "pool-b") in admitted.calls


def test_the_admission_gate_judges_every_tpu_group() -> None:
    """Group a's v6e 4x4 pool is free, group b's v6e 2x4 has none: the gate holds and
    names the group short of pools."""
    groups = [
        {"name": "a", "tpu": {"type": "v6e", "topology": "4x4", "slices": 1}},
        {"name": "b", "tpu": {"type": "v6e", "topology": "2x4", "slices": 1}},
    ]
    body = {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND_CLUSTER,
        "metadata": {"name": "llm", "namespace": "ml", "uid": UID, "generation": 1},
        "spec": {
            "workerGroups": groups,
            "ray": {"version": "2.54.0"},
            "kueue": {"queueName": "q", "admissionGate": "UntilPoolsFree"},
        },
    }
    kube = one_pass(Snapshot(body, [], nodes_of("pool-a"), [], None))
    (applied,) = kube.applied
    assert applied["metadata"]["annotations"][GATED_BY] == c.POOLS_FREE_GATE
    admitted = condition_of(kube.status, "KueueAdmitted")
    assert admitted["reason"] == "AdmissionGated"
    assert "0 free v6e 2x4 node pools for the 1 slices of group b" in admitted["message"]
