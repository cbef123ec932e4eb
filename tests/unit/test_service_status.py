"""TPUSliceService status from the RayService states KubeRay 1.5 reports (its Ready
condition or serviceStatus, the active and pending cluster) and each cluster's slices:
Ready means traffic served by a cluster whose every slice is Ready on its pool."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.support.crd import validate
from tests.support.gitops import kstatus
from tpuslice.model.records import SliceState, SliceStatus
from tpuslice.status.conditions import ClusterSlices, Stall
from tpuslice.status.service import ServiceObserved, compute_service_status, serving

NOW = "2026-12-01T00:00:00Z"
ACTIVE, PENDING = "llm-a1b2c", "llm-d3e4f"


def ready_slices() -> list[SliceStatus]:
    return [SliceStatus(0, SliceState.READY, "tpu-a", "pool-a", 4)]


def slices_in(state: SliceState, message: str = "") -> list[SliceStatus]:
    pool = None if state in (SliceState.WAITING_FOR_CAPACITY, SliceState.PENDING) else "pool-b"
    return [SliceStatus(0, state, "tpu-b", pool, 0, message)]


def cluster(name: str, slices: list[SliceStatus]) -> ClusterSlices:
    return ClusterSlices(name, 1, slices, ray_cluster_ready=slices == ready_slices())


def ray(
    ready: str | None = None,
    reason: str = "",
    active: str = "",
    pending: str = "",
    **extra: Any,
) -> dict[str, Any]:
    status: dict[str, Any] = {**extra}
    if ready is not None:
        status["conditions"] = [
            {"type": "Ready", "status": ready, "reason": reason, "message": reason}
        ]
    if active:
        status["activeServiceStatus"] = {"rayClusterName": active}
    if pending:
        status["pendingServiceStatus"] = {"rayClusterName": pending}
    return status


def observed(
    status: dict[str, Any] | None, *clusters: ClusterSlices, stall: Stall | None = None
) -> ServiceObserved:
    return ServiceObserved(
        generation=3,
        accelerator_type="v6e-16",
        hosts_per_slice=4,
        chips_per_host=4,
        ray_service="llm",
        desired_slices=1,
        ray_service_status=status,
        clusters={c.name: c for c in clusters},
        gated=True,
        applied=True,
        stall=stall,
    )


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def as_object(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "TPUSliceService",
        "metadata": {"name": "llm", "namespace": "ml", "generation": 3},
        "spec": {
            "tpu": {"type": "v6e", "topology": "4x4"},
            "ray": {"version": "2.54.0"},
            "serve": {"serveConfigV2": "applications: []"},
        },
        "status": status,
    }


WAIT = SliceState.WAITING_FOR_CAPACITY
# case -> (Ready, Reconciling, Stalled, UpgradeInProgress, Ready reason, Reconciling reason)
CASES: list[tuple[str, ServiceObserved, tuple[Any, ...]]] = [
    (
        "no RayService yet",
        observed(None),
        (False, True, False, False, "Pending", "Pending"),
    ),
    (
        "RayService without status",
        observed({}),
        (False, True, False, False, "Initializing", "Initializing"),
    ),
    (
        "first cluster waiting for capacity",
        observed(
            ray("False", "Initializing", pending=PENDING),
            cluster(PENDING, slices_in(WAIT, "needs a free pool")),
        ),
        (False, True, False, False, "WaitingForCapacity", "WaitingForCapacity"),
    ),
    (
        "first cluster's slices ready, Serve deploying",
        observed(ray("False", "Initializing", pending=PENDING), cluster(PENDING, ready_slices())),
        (False, True, False, False, "Initializing", "Initializing"),
    ),
    (
        "serving, every slice ready",
        observed(
            ray("True", "NonZeroServeEndpoints", active=ACTIVE), cluster(ACTIVE, ready_slices())
        ),
        (True, False, False, False, "Serving", "Serving"),
    ),
    (
        "serving (serviceStatus only, KubeRay < 1.3)",
        observed(
            {"serviceStatus": "Running", "activeServiceStatus": {"rayClusterName": ACTIVE}},
            cluster(ACTIVE, ready_slices()),
        ),
        (True, False, False, False, "Serving", "Serving"),
    ),
    (
        "serving but a slice is being recreated",
        observed(
            ray("True", "NonZeroServeEndpoints", active=ACTIVE),
            cluster(ACTIVE, slices_in(SliceState.SCHEDULED)),
        ),
        (False, True, False, False, "Scheduled", "Scheduled"),
    ),
    (
        "serving, slices not observed",
        observed(ray("True", "NonZeroServeEndpoints", active=ACTIVE)),
        (False, True, False, False, "ActiveSlicesNotReady", "ActiveSlicesNotReady"),
    ),
    (
        "active cluster stopped serving",
        observed(
            ray("False", "ZeroServeEndpoints", active=ACTIVE), cluster(ACTIVE, ready_slices())
        ),
        (False, True, False, False, "ZeroServeEndpoints", "ZeroServeEndpoints"),
    ),
    (
        "upgrade waiting for capacity, active keeps serving",
        observed(
            ray("True", "NonZeroServeEndpoints", active=ACTIVE, pending=PENDING),
            cluster(ACTIVE, ready_slices()),
            cluster(PENDING, slices_in(WAIT, "needs a free pool; the active cluster's is held")),
        ),
        (True, True, False, True, "Serving", "UpgradeWaitingForCapacity"),
    ),
    (
        "upgrade's cluster not created yet",
        observed(
            ray("True", "NonZeroServeEndpoints", active=ACTIVE, pending=PENDING),
            cluster(ACTIVE, ready_slices()),
        ),
        (True, True, False, True, "Serving", "UpgradeInProgress"),
    ),
    (
        "upgrade's slices ready, waiting for Serve to switch",
        observed(
            ray("True", "NonZeroServeEndpoints", active=ACTIVE, pending=PENDING),
            cluster(ACTIVE, ready_slices()),
            cluster(PENDING, ready_slices()),
        ),
        (True, True, False, True, "Serving", "UpgradeInProgress"),
    ),
    (
        "after the switch, the old cluster releasing",
        observed(
            ray("True", "NonZeroServeEndpoints", active=PENDING),
            cluster(PENDING, ready_slices()),
            cluster(ACTIVE, slices_in(SliceState.RELEASING)),
        ),
        (True, False, False, False, "Serving", "Serving"),
    ),
    (
        "KubeRay gave up initializing",
        observed(ray("False", "InitializingTimeout", pending=PENDING)),
        (
            False,
            False,
            True,
            None,
            "RayServiceInitializingTimeout",
            "RayServiceInitializingTimeout",
        ),
    ),
    (
        "operator stall",
        observed(
            ray("True", active=ACTIVE), stall=Stall("KubeRayNotInstalled", "no RayService CRD")
        ),
        (False, False, True, None, "KubeRayNotInstalled", "KubeRayNotInstalled"),
    ),
]


@pytest.mark.parametrize(("obs", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_rayservice_state(obs: ServiceObserved, expected: tuple[Any, ...]) -> None:
    status = compute_service_status(obs, None, NOW)
    got = conditions(status)
    ready, reconciling, stalled, upgrade, ready_reason, reconciling_reason = expected
    assert got["Ready"] == ("True" if ready else "False", ready_reason)
    assert got["Reconciling"] == ("True" if reconciling else "False", reconciling_reason)
    assert got["Stalled"][0] == ("True" if stalled else "False")
    if upgrade is None:
        assert "UpgradeInProgress" not in got
    else:
        assert got["UpgradeInProgress"][0] == ("True" if upgrade else "False")
    assert validate("tpuslice.dev_tpusliceservices.yaml", as_object(status)) == []
    verdict = kstatus(as_object(status))
    assert verdict == (
        "Failed" if stalled else "InProgress" if reconciling or not ready else "Current"
    )


def test_status_names_the_active_and_pending_clusters_with_their_slices() -> None:
    obs = observed(
        ray(
            "True",
            "NonZeroServeEndpoints",
            active=ACTIVE,
            pending=PENDING,
            serviceStatus="Running",
            numServeEndpoints=5,
        ),
        cluster(ACTIVE, ready_slices()),
        cluster(PENDING, slices_in(WAIT, "needs a free pool")),
    )
    status = compute_service_status(obs, None, NOW)
    assert status["rayService"] == "llm" and status["serviceStatus"] == "Running"
    assert status["numServeEndpoints"] == 5
    assert status["activeCluster"]["name"] == ACTIVE
    assert status["activeCluster"]["sliceReadiness"] == "1/1"
    assert status["pendingCluster"]["slices"][0]["state"] == "WaitingForCapacity"
    assert status["sliceReadiness"] == "1/1"
    reconciling = next(c for c in status["conditions"] if c["type"] == "Reconciling")
    assert reconciling["message"].endswith(f"{ACTIVE} keeps serving")
    assert conditions(status)["SlicesReserved"] == ("False", "SlicesUnreserved")


def test_serving_reads_the_ready_condition_before_service_status() -> None:
    assert serving({"serviceStatus": "Running"})
    assert not serving(
        {"serviceStatus": "Running", "conditions": [{"type": "Ready", "status": "False"}]}
    )
    assert not serving(None) and not serving({})


def test_identical_input_identical_output() -> None:
    obs = observed(ray("True", active=ACTIVE), cluster(ACTIVE, ready_slices()))
    first = compute_service_status(obs, None, NOW)
    assert compute_service_status(obs, first, "2026-12-02T00:00:00Z") == first
    not_applied = dataclasses.replace(obs, applied=False)
    assert (
        compute_service_status(not_applied, {"observedGeneration": 2}, NOW)["observedGeneration"]
        == 2
    )
