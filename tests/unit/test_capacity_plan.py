"""One pass's capacity-on-demand decisions, decided after planning (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tpuslice.capacity.objects import request_hash, request_name
from tpuslice.capacity.plan import NO_CAPACITY_PLAN, CapacityPlan, plan
from tpuslice.model import constants as c
from tpuslice.model.records import (
    PodRelease,
    ProvisioningAction,
    ProvisioningRequestInfo,
    RequestCondition,
    SliceFacts,
    SlicePlan,
)
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.parts import SliceClusterSpec

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
QUEUED: SliceClusterSpec = parse_cluster(
    {
        "metadata": {"name": "llm", "namespace": "ml", "uid": "tsc-uid"},
        "spec": {
            "tpu": {"type": "v6e", "topology": "4x4", "slices": 2},
            "ray": {"version": "2.54.0"},
            "reservation": {"provisioning": {"mode": "QueuedProvisioning"}},
        },
    }
)


def provisioned(index: int) -> ProvisioningRequestInfo:
    assert QUEUED.provisioning is not None
    ok = RequestCondition(
        c.PROVREQ_PROVISIONED, "True", "Provisioned", "", NOW - timedelta(seconds=60)
    )
    return ProvisioningRequestInfo(
        namespace="ml",
        name=request_name("llm", index, 1),
        uid="r-uid",
        raycluster="llm",
        slice_index=index,
        class_name=QUEUED.provisioning.class_name,
        spec_hash=request_hash(QUEUED),
        conditions={c.PROVREQ_PROVISIONED: ok},
        details={"NodePoolName": f"dws-{index}"},
        created=NOW - timedelta(seconds=300),
    )


def test_nothing_to_decide_changes_nothing() -> None:
    decided = plan({}, {}, QUEUED, now=NOW, history={}, replicas={}, pool_nodes={})
    assert decided == NO_CAPACITY_PLAN
    slices = SlicePlan()
    assert decided.report(slices, None) == (slices, None)


def test_a_slice_on_its_provisioned_pool_is_released_with_the_consume_annotations() -> None:
    request = provisioned(0)
    fact = SliceFacts(index=0, raycluster="llm", pods_complete=True, pool="dws-0")
    decided = plan(
        {0: fact},
        {("llm", 0): request},
        QUEUED,
        now=NOW,
        history={},
        replicas={0: "tpu-aaaaa"},
        pool_nodes={},
    )
    assert decided.decisions[0].action == ProvisioningAction.KEEP
    assert decided.annotations["tpu-aaaaa"][c.ANNOTATION_CONSUME_PROVREQ] == request.name
    assert decided.held_back == frozenset()


def test_the_request_of_a_gone_slice_is_decided_and_held_back_releases_wait() -> None:
    decided = plan(
        {}, {("llm", 1): provisioned(1)}, QUEUED, now=NOW, history={}, replicas={}, pool_nodes={}
    )
    assert [d.index for d in decided.writes] == [1]
    assert decided.gone[0].delete == request_name("llm", 1, 1)
    held = CapacityPlan(held_back=frozenset({"tpu-bbbbb"}))
    releases = [PodRelease("ml", "w0", "p", "tpu-aaaaa"), PodRelease("ml", "w1", "q", "tpu-bbbbb")]
    assert [r.name for r in held.releases(releases)] == ["w0"]
