"""Capacity on demand for single-host slices: the unit asked for, excluded and claimed is
a node, and GKE grows an existing single-host pool node by node (fleet-facts.md §2), so
a request's capacity is the nodes made since it, never the pool's older nodes."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.support.builders import node, pod
from tpuslice.capacity.constraints import constraints
from tpuslice.capacity.decide import decide
from tpuslice.capacity.facts import queued_capacity, slice_facts
from tpuslice.capacity.objects import (
    podtemplate_body,
    request_hash,
    request_name,
    worker_template_of,
)
from tpuslice.model import constants as c
from tpuslice.model.convert import rfc3339
from tpuslice.model.records import (
    CapacityUnit,
    ClusterRef,
    NodeInfo,
    ProvisioningAction,
    ProvisioningRequestInfo,
    ProvisioningView,
    RequestCondition,
    SliceFacts,
    SlicePlan,
    SliceState,
    SliceStatus,
)
from tpuslice.render.kuberay import render_ray_cluster_spec
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.parts import SliceClusterSpec

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
ASKED = NOW - timedelta(seconds=120)  # when the request was made


def single_host_spec(mode: str) -> SliceClusterSpec:
    return parse_cluster(
        {
            "metadata": {"name": "llm", "namespace": "ml", "uid": "tsc-uid"},
            "spec": {
                "tpu": {"type": "v6e", "topology": "2x2", "slices": 2},
                "ray": {"version": "2.54.0"},
                "reservation": {"provisioning": {"mode": mode}},
            },
        }
    )


QUEUED = single_host_spec("QueuedProvisioning")
ATOMIC = single_host_spec("BestEffortAtomic")


def vm(name: str, pool: str, age_s: float) -> NodeInfo:
    """A single-host TPU VM made ``age_s`` before NOW."""
    return node(name, pool, topology="2x2", created=rfc3339(NOW - timedelta(seconds=age_s)))


def request(spec: SliceClusterSpec, pool: str = "", *conditions: str) -> ProvisioningRequestInfo:
    assert spec.provisioning is not None
    return ProvisioningRequestInfo(
        namespace="ml",
        name=request_name("llm", 0, 1),
        uid="r-uid",
        raycluster="llm",
        slice_index=0,
        class_name=spec.provisioning.class_name,
        spec_hash=request_hash(spec),
        conditions={k: RequestCondition(k, "True") for k in conditions},
        details={"NodePoolName": pool} if pool else {},
        created=ASKED,
    )


def units(*nodes: NodeInfo) -> dict[str, list[NodeInfo]]:
    """A node-unit pool index's units: each node by its own name."""
    return {n.name: [n] for n in nodes}


def test_a_single_host_request_keeps_off_existing_nodes_not_off_their_pool() -> None:
    """GKE grows a single-host pool by the request's nodes: the template must fit a new
    node of an existing pool, and no node that is already there (one held by a gated
    slice looks free to the autoscaler)."""
    template = worker_template_of(render_ray_cluster_spec(ATOMIC))
    assert template is not None
    body = podtemplate_body(
        ATOMIC,
        raycluster="llm",
        index=0,
        attempt=1,
        worker_template=template,
        exclude_units=["gke-single-1", "gke-single-0"],
    )
    (term,) = body["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {
            "key": c.NODE_LABEL_HOSTNAME,
            "operator": "NotIn",
            "values": ["gke-single-0", "gke-single-1"],
        }
    ]


def test_a_queued_requests_capacity_is_the_named_pools_nodes_made_since_it() -> None:
    old, new = vm("gke-dws-0", "dws", age_s=600), vm("gke-dws-1", "dws", age_s=30)
    other = vm("gke-plain-0", "plain", age_s=30)
    index = units(old, new, other)
    mine = [request(QUEUED, "dws")]
    free = [old.name, new.name, other.name]
    assert queued_capacity(free, index, mine, CapacityUnit.NODE) == {new.name}
    # a multi-host slice's capacity is the named pool itself
    assert queued_capacity(["dws", "plain"], {}, mine, CapacityUnit.NODE_POOL) == {"dws"}
    assert queued_capacity(free, index, [], CapacityUnit.NODE) == set()


def test_another_objects_promise_takes_only_the_nodes_made_since_it() -> None:
    """Of a single-host pool that another object's queued request names, only the nodes
    new since that request are its capacity; the older nodes stay anyone's. A node-pool
    unit named by the promise is kept from everyone, as before."""
    view = ProvisioningView(promised_since={"dws": ASKED})
    limits = constraints(view, ATOMIC)
    old, new = vm("gke-dws-0", "dws", age_s=600), vm("gke-dws-1", "dws", age_s=30)
    same_second = vm("gke-dws-2", "dws", age_s=120)
    assert limits.allows(old.name, [old])
    assert not limits.allows(new.name, [new])
    assert not limits.allows(same_second.name, [same_second])  # may be the request's
    assert limits.allows("gke-plain-0", [vm("gke-plain-0", "plain", age_s=30)])
    assert not limits.allows("dws", [old, new])  # the whole pool, as a multi-host unit


def holding(pool: str, node_pool: str) -> SliceFacts:
    return SliceFacts(
        index=0,
        raycluster="llm",
        pods_complete=True,
        pool=pool,
        unit=CapacityUnit.NODE,
        unit_pool=node_pool,
    )


def test_a_slice_holding_a_node_of_the_queued_pool_keeps_its_request() -> None:
    """The request names the node's pool, not the node: a held node of that pool is the
    request's capacity; a node of another pool is not, and the request goes."""
    provisioned = request(QUEUED, "dws", c.PROVREQ_ACCEPTED, c.PROVREQ_PROVISIONED)
    kept = decide(holding("gke-dws-1", "dws"), provisioned, QUEUED, now=NOW)
    assert kept.action == ProvisioningAction.KEEP
    dropped = decide(holding("gke-plain-0", "plain"), provisioned, QUEUED, now=NOW)
    assert dropped.action == ProvisioningAction.DELETE
    assert "slice 0 holds node gke-plain-0" in dropped.message


def test_messages_speak_of_nodes() -> None:
    waiting = SliceFacts(index=0, raycluster="llm", pods_complete=True, unit=CapacityUnit.NODE)
    asked = decide(waiting, None, ATOMIC, now=NOW)
    assert asked.action == ProvisioningAction.CREATE
    assert "asking the cluster autoscaler for a node:" in asked.message
    provisioned = request(ATOMIC, "", c.PROVREQ_ACCEPTED, c.PROVREQ_PROVISIONED)
    provisioned = _provisioned_at(provisioned, NOW - timedelta(seconds=5))
    claim = decide(waiting, provisioned, ATOMIC, now=NOW)
    assert claim.action == ProvisioningAction.CLAIM
    assert "claiming a new node by" in claim.message
    queued = request(QUEUED, "dws", c.PROVREQ_ACCEPTED, c.PROVREQ_PROVISIONED)
    claim = decide(waiting, _provisioned_at(queued, NOW - timedelta(seconds=5)), QUEUED, now=NOW)
    assert "claiming a new node of pool dws once its nodes are ready" in claim.message


def _provisioned_at(r: ProvisioningRequestInfo, when: datetime) -> ProvisioningRequestInfo:
    conditions: dict[str, Any] = dict(r.conditions)
    conditions[c.PROVREQ_PROVISIONED] = RequestCondition(
        c.PROVREQ_PROVISIONED, "True", last_transition=when
    )
    return replace(r, conditions=conditions)


def test_single_host_slices_are_found_by_their_pods_own_names() -> None:
    """KubeRay labels a single-host worker with its replica index only: the slice is the
    pod (as the planner names it), so its facts see its pod and it asks for a node."""
    pods = [
        pod(f"llm-tpu-worker-{i}", cluster="llm", replica=None, index=i, host=None)
        for i in range(2)
    ]
    plan = SlicePlan(
        slices=tuple(
            SliceStatus(i, SliceState.WAITING_FOR_CAPACITY, p.name, None, 0, "")
            for i, p in enumerate(pods)
        )
    )
    facts = slice_facts(
        ClusterRef("ml", "llm", "tsc-uid"),
        ATOMIC,
        plan,
        pods,
        [],
        eligible=frozenset(),
        pool_nodes={},
        newest={},
    )
    assert [(f.exists, f.pods_complete, f.unit) for f in facts.values()] == [
        (True, True, CapacityUnit.NODE)
    ] * 2
    assert decide(facts[0], None, ATOMIC, now=NOW).action == ProvisioningAction.CREATE
