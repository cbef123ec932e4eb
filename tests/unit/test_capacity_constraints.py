"""What capacity on demand allows the planner, computed before planning (pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tpuslice.capacity.constraints import NO_CONSTRAINTS, constraints
from tpuslice.model import constants as c
from tpuslice.model.records import (
    Admission,
    NodeInfo,
    ProvisioningRequestInfo,
    ProvisioningView,
    RequestCondition,
)
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.parts import SliceClusterSpec


def spec_of(provisioning: dict[str, Any] | None = None) -> SliceClusterSpec:
    reservation = {"provisioning": provisioning} if provisioning is not None else {}
    return parse_cluster(
        {
            "metadata": {"name": "llm", "namespace": "ml", "uid": "tsc-uid"},
            "spec": {
                "tpu": {"type": "v6e", "topology": "4x4", "slices": 2},
                "ray": {"version": "2.54.0"},
                "reservation": reservation,
            },
        }
    )


def node(pool: str, **labels: str) -> NodeInfo:
    return NodeInfo(
        f"{pool}-n0", pool, "tpu-v6e-slice", "4x4", 4, True, True, capacity_labels=labels
    )


def provisioned(index: int, pool: str, **more: str) -> ProvisioningRequestInfo:
    conditions = {c.PROVREQ_PROVISIONED: RequestCondition(c.PROVREQ_PROVISIONED, "True")}
    conditions.update({k: RequestCondition(k, v) for k, v in more.items()})
    return ProvisioningRequestInfo(
        "ml",
        f"llm-{index}-1",
        raycluster="llm",
        slice_index=index,
        conditions=conditions,
        details={"NodePoolName": pool},
    )


#: a promise of unknown age: every node of its pool
ANY_TIME = datetime.min.replace(tzinfo=UTC)
STALLED = Admission(pools=(), stalled="no pool count of the shape will do")


def test_an_object_without_capacity_on_demand_is_limited_only_by_others_promises() -> None:
    view = ProvisioningView(promised_since={"p1": ANY_TIME}, revoked_pools=frozenset({"p2"}))
    limits = constraints(view, spec_of())
    assert limits.excluded == {"p1", "p2"}
    assert not limits.allows("p1", [node("p1")]) and limits.allows("p3", [node("p3")])
    assert limits.admit(STALLED) == STALLED
    assert limits.prefer({0: "old"}) == {0: "old"}


def test_asking_for_capacity_narrows_by_selector_and_waives_not_enough_pools() -> None:
    spec = spec_of({"mode": "QueuedProvisioning", "nodeSelector": {c.NODE_LABEL_SPOT: "true"}})
    limits = constraints(ProvisioningView(), spec)
    assert limits.allows("spot", [node("spot", **{c.NODE_LABEL_SPOT: "true"})])
    assert not limits.allows("plain", [node("plain")])
    assert limits.admit(STALLED) is None
    assert limits.admit(None) is None


def test_a_provisioned_request_makes_its_pool_the_slices_preferred_one() -> None:
    view = ProvisioningView(
        requests=(
            provisioned(0, "dws-0"),
            provisioned(1, "dws-1", **{c.PROVREQ_BOOKING_EXPIRED: "True"}),
        )
    )
    limits = constraints(view, spec_of({"mode": "QueuedProvisioning"}))
    assert limits.prefer({0: "old", 1: "old"}) == {0: "dws-0", 1: "old"}


def test_no_constraints_change_nothing() -> None:
    assert NO_CONSTRAINTS.allows("any", [node("any")])
    assert NO_CONSTRAINTS.admit(STALLED) == STALLED
    assert not NO_CONSTRAINTS.narrows
