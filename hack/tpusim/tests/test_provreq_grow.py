"""Single-host pools grown node by node by the fake GKE provisioner, without a cluster.

The pure rules (``tpusim.provreq``: declared pools, which pool a request grows, fresh
node names, hostname NotIn) are walked with ``decide``; the bookkeeping that keeps each
request's added nodes apart from the rest of a shared pool runs ``FakeProvisioner``
passes over an in-memory API.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from kubernetes.client import ApiException

from tpusim import kube, provisioner
from tpusim.nodepools import TPUPool, node_name, pool_nodes
from tpusim.provisioner import FakeProvisioner, ProvisionerSettings
from tpusim.provreq import (
    AUTOSCALED_PRESETS,
    BEST_EFFORT_CLASS,
    GROUP_ANNOTATION,
    NODE_OWNER_ANNOTATION,
    POOLS_ANNOTATION,
    PROVISIONING_REQUEST_LABEL,
    QUEUED_CLASS,
    QUEUED_TAINT,
    AutoscaledPool,
    Decision,
    Fault,
    GrowablePool,
    NodeView,
    Request,
    Shape,
    Timings,
    decide,
    free_nodes,
    fresh_node_indexes,
    parse_autoscaled_pools,
    parse_autoscaled_spec,
    parse_request,
    resize_request_name,
    template_shape,
)

FAST = Timings(
    accept_delay_s=1, provision_delay_s=3, booking_s=60, pending_retry_s=20, scale_down_delay_s=5
)
V6E_2X2 = {
    "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
    "cloud.google.com/gke-tpu-topology": "2x2",
}
TOLERATIONS = [
    {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "cloud.google.com/gke-queued", "operator": "Exists", "effect": "NoSchedule"},
]
SINGLE = AutoscaledPool("v6e-single", "v6e", "2x2", max_nodes=4)
QUEUED_SINGLE = AutoscaledPool("v6e-queued", "v6e", "2x2", max_nodes=4, queued=True)


def template(
    selector: dict[str, str] | None = None,
    chips: int = 4,
    name: str = "t",
    affinity: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": dict(V6E_2X2 if selector is None else selector),
        "tolerations": TOLERATIONS,
        "containers": [
            {"name": "w", "image": "x", "resources": {"requests": {"google.com/tpu": str(chips)}}}
        ],
    }
    if affinity:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": affinity}]
                }
            }
        }
    return {"metadata": {"name": name, "namespace": "ns"}, "template": {"spec": spec}}


def shape(**kw: Any) -> Shape:
    result = template_shape(template(**kw))
    assert isinstance(result, Shape), result
    return result


def request(cls: str = BEST_EFFORT_CLASS, count: int = 2, name: str = "slice-0") -> Request:
    return parse_request(
        {
            "metadata": {
                "namespace": "ns",
                "name": name,
                "uid": f"uid-{name}",
                "creationTimestamp": "2027-01-15T08:00:00Z",
            },
            "spec": {
                "provisioningClassName": cls,
                "podSets": [{"podTemplateRef": {"name": "t"}, "count": count}],
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


def step(
    req: Request, at: float, growable: list[GrowablePool], s: Shape
) -> tuple[Request, Decision]:
    d = decide(
        req, now=CREATED + at, timings=FAST, fault=NO_FAULT, shapes=[s], pools=[], growable=growable
    )
    return apply(req, d), d


def walk(
    req: Request, growable: list[GrowablePool], s: Shape | None = None
) -> tuple[Request, Decision]:
    """Accepted at 1 s, provisioned at 4 s: the request and the decision of that step."""
    s = s or shape()
    req, _ = step(req, 0, growable, s)
    req, _ = step(req, 1, growable, s)
    return step(req, 4, growable, s)


# ---------------------------------------------------------------- declaring pools


def test_declared_pools_parse_from_either_key_and_round_trip() -> None:
    pools = parse_autoscaled_pools(
        [
            {"name": "a", "tpuType": "v6e", "topology": "2x2", "maxNodes": 3},
            {
                "name": "b",
                "accelerator": "tpu-v4-podslice",
                "topology": "2x2x1",
                "maxNodes": 2,
                "queued": True,
            },
            {"name": "c", "tpuType": "v5e", "topology": "2x4", "maxNodes": 1, "spot": True},
        ]
    )
    assert [(p.name, p.tpu_type, p.chips_per_host, p.queued) for p in pools] == [
        ("a", "v6e", 4, False),
        ("b", "v4", 4, True),
        ("c", "v5e", 8, False),
    ]
    assert parse_autoscaled_pools([p.to_dict() for p in pools]) == pools
    # a queued pool without a capacity type is a flex-start pool
    assert pools[1].node_pool(1).capacity_type == "flex-start"
    assert pools[2].node_labels("us-east5-b", "tpusim")["cloud.google.com/gke-spot"] == "true"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ({"name": "m", "tpuType": "v6e", "topology": "4x4", "maxNodes": 4}, "only single-host"),
        ({"name": "m", "tpuType": "v4", "topology": "2x2x2", "maxNodes": 4}, "2x2x1"),
        (
            {"name": "m", "tpuType": "v6e", "topology": "2x2", "maxNodes": 0},
            "maxNodes must be 1..1000",
        ),
        ({"name": "m", "tpuType": "v6e", "topology": "2x2", "maxNodes": 1001}, "1..1000"),
        ({"name": "m", "tpuType": "v6e", "topology": "2x2", "maxNodes": "2"}, "whole number"),
        ({"name": "m", "tpuType": "v9", "topology": "2x2", "maxNodes": 1}, "unknown TPU type"),
        ({"name": "m", "accelerator": "tpu-v9", "topology": "2x2", "maxNodes": 1}, "tpu-v9"),
        (
            {
                "name": "m",
                "tpuType": "v4",
                "accelerator": "tpu-v6e-slice",
                "topology": "2x2",
                "maxNodes": 1,
            },
            "disagrees",
        ),
        ({"name": "m", "topology": "2x2", "maxNodes": 1}, "give tpuType"),
        ({"name": "m", "tpuType": "v6e", "maxNodes": 1}, "missing topology"),
        ({"name": "m", "tpuType": "v6e", "topology": "2x2", "maxNodes": 1, "size": 3}, "size"),
        ({"name": "M_1", "tpuType": "v6e", "topology": "2x2", "maxNodes": 1}, "lowercase"),
        (
            {"name": "m", "tpuType": "v6e", "topology": "2x2", "maxNodes": 1, "queued": "yes"},
            "true or false",
        ),
        (
            {
                "name": "m",
                "tpuType": "v6e",
                "topology": "2x2",
                "maxNodes": 1,
                "spot": True,
                "reservation": "r",
            },
            "one capacity type",
        ),
    ],
)
def test_declared_pool_errors_name_the_field(raw: dict[str, Any], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_autoscaled_pools([raw])


def test_declared_pools_refuse_duplicates_and_non_lists() -> None:
    raw = {"name": "a", "tpuType": "v6e", "topology": "2x2", "maxNodes": 1}
    with pytest.raises(ValueError, match="duplicate pool names a"):
        parse_autoscaled_pools([raw, raw])
    with pytest.raises(ValueError, match="must be a list"):
        parse_autoscaled_pools(raw)
    assert parse_autoscaled_pools(None) == []


# ---------------------------------------------------------------- which pool grows


def test_best_effort_grows_a_matching_pool_with_room_else_makes_a_new_pool() -> None:
    req, d = walk(request(count=2), [GrowablePool(SINGLE, nodes=1)])
    (plan,) = d.create
    assert (plan.pool.name, plan.pool.nodes, plan.pool.capacity_type) == (
        "v6e-single",
        2,
        "on-demand",
    )
    assert plan.group is not None and plan.group.startswith("v6e-single/")
    assert plan.labels == {} and plan.taints == ()
    assert req.annotations[POOLS_ANNOTATION] == plan.group
    assert req.conditions["Provisioned"].status == "True"
    # 3 nodes + 2 > maxNodes 4: today's behaviour, a whole new pool of its own
    _, d = walk(request(count=2), [GrowablePool(SINGLE, nodes=3)])
    (plan,) = d.create
    assert plan.group is None and plan.pool.name.startswith("auto-v6e-2x2-")


def test_room_is_counted_across_pod_sets_of_one_request() -> None:
    req = dataclasses.replace(request(count=2), pod_sets=(("t", 2), ("t", 2)))
    s, room = shape(), [GrowablePool(SINGLE, nodes=1)]
    for at in (1, 4):
        d = decide(
            req,
            now=CREATED + at,
            timings=FAST,
            fault=NO_FAULT,
            shapes=[s, s],
            pools=[],
            growable=room,
        )
        req = apply(req, d)
    grown, new = d.create
    assert (grown.pool.name, grown.group is not None) == ("v6e-single", True)
    assert new.group is None  # 1 + 2 + 2 > 4
    assert req.annotations[POOLS_ANNOTATION] == f"{grown.group},{new.pool.name}"


@pytest.mark.parametrize(
    ("kw", "pool", "grows"),
    [
        ({}, SINGLE, True),
        # capacity selectors must agree with the pool's labels
        ({"selector": {**V6E_2X2, "cloud.google.com/gke-spot": "true"}}, SINGLE, False),
        (
            {"selector": {**V6E_2X2, "cloud.google.com/gke-spot": "true"}},
            dataclasses.replace(SINGLE, spot=True),
            True,
        ),
        ({}, dataclasses.replace(SINGLE, spot=True), True),  # no selector: any capacity
        ({"selector": {**V6E_2X2, "cloud.google.com/gke-nodepool": "v6e-single"}}, SINGLE, True),
        ({"selector": {**V6E_2X2, "cloud.google.com/gke-nodepool": "other"}}, SINGLE, False),
        # gke-nodepool affinity
        (
            {
                "affinity": [
                    {
                        "key": "cloud.google.com/gke-nodepool",
                        "operator": "NotIn",
                        "values": ["v6e-single"],
                    }
                ]
            },
            SINGLE,
            False,
        ),
        (
            {
                "affinity": [
                    {
                        "key": "cloud.google.com/gke-nodepool",
                        "operator": "In",
                        "values": ["x", "v6e-single"],
                    }
                ]
            },
            SINGLE,
            True,
        ),
        (
            {
                "affinity": [
                    {"key": "cloud.google.com/gke-nodepool", "operator": "In", "values": ["x"]}
                ]
            },
            SINGLE,
            False,
        ),
        # another shape
        (
            {"selector": {**V6E_2X2, "cloud.google.com/gke-tpu-topology": "1x1"}, "chips": 1},
            SINGLE,
            False,
        ),
        # the queued kind of pool is for the queued class only
        ({}, QUEUED_SINGLE, False),
    ],
)
def test_best_effort_grows_only_a_pool_its_pods_fit(
    kw: dict[str, Any], pool: AutoscaledPool, grows: bool
) -> None:
    _, d = walk(request(count=1), [GrowablePool(pool)], shape(**kw))
    (plan,) = d.create
    assert (plan.group is not None) == grows
    assert (plan.pool.name == pool.name) == grows


def test_a_multi_host_shape_never_grows_a_single_host_pool() -> None:
    # v5e 2x4 on 4-chip hosts is a two-host slice; the declared 2x4 pool has 8-chip hosts
    eight = AutoscaledPool("v5e-8", "v5e", "2x4", max_nodes=8)
    sel = {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "2x4",
    }
    _, d = walk(request(count=2), [GrowablePool(eight)], shape(selector=sel, chips=4))
    (plan,) = d.create
    assert plan.group is None and plan.pool.nodes == 2
    _, d = walk(request(count=2), [GrowablePool(eight)], shape(selector=sel, chips=8))
    (plan,) = d.create
    assert (plan.group is not None, plan.pool.chips_per_node) == (True, 8)


def test_queued_grows_a_queued_pool_and_names_it_in_the_details() -> None:
    req, d = walk(request(QUEUED_CLASS, count=2), [GrowablePool(QUEUED_SINGLE, nodes=2)])
    assert req.details["NodePoolName"] == "v6e-queued"
    (plan,) = d.create
    assert (plan.pool.name, plan.pool.nodes, plan.pool.capacity_type) == (
        "v6e-queued",
        2,
        "flex-start",
    )
    assert plan.labels == {PROVISIONING_REQUEST_LABEL: resize_request_name("ns", "slice-0")}
    assert plan.taints == (QUEUED_TAINT,)
    assert req.conditions["Provisioned"].reason == "Provisioned"
    # a non-queued pool is never grown by the queued class: a queued pool of its own
    req, d = walk(request(QUEUED_CLASS, count=2), [GrowablePool(SINGLE)])
    (plan,) = d.create
    assert plan.group is None and plan.pool.name == req.details["NodePoolName"] != "v6e-single"


def test_queued_request_whose_pool_is_full_stays_queued_until_room_comes() -> None:
    s = shape()
    full = [GrowablePool(QUEUED_SINGLE, nodes=3)]
    req, d = walk(request(QUEUED_CLASS, count=2), full, s)
    assert req.details["NodePoolName"] == "v6e-queued"
    assert req.conditions["Accepted"].reason == "SuccessfullyQueued"
    assert not d.create and "Provisioned" not in req.conditions and "Failed" not in req.conditions
    req, d = step(req, 200, full, s)  # long after the pending retry period: still queued
    assert not d
    req, d = step(req, 201, [GrowablePool(QUEUED_SINGLE, nodes=2)], s)
    (plan,) = d.create
    assert plan.pool.name == "v6e-queued" and plan.pool.nodes == 2


def test_queued_pool_serves_one_resize_request_at_a_time() -> None:
    busy = [GrowablePool(QUEUED_SINGLE, nodes=1, resize_requests=frozenset({"gke-other"}))]
    req, d = walk(request(QUEUED_CLASS, count=1), busy)
    assert not d.create and req.details["NodePoolName"] == "v6e-queued"
    own = frozenset({resize_request_name("ns", "slice-0")})
    _, d = walk(request(QUEUED_CLASS, count=1), [GrowablePool(QUEUED_SINGLE, 1, own)])
    assert d.create and d.create[0].group is not None


# ---------------------------------------------------------------- node names and hostnames


def test_fresh_node_indexes_skip_taken_and_excluded_names() -> None:
    taken = [node_name("p", 0), node_name("p", 2)]
    assert fresh_node_indexes("p", 3, taken, avoid=[node_name("p", 1)]) == [3, 4, 5]
    assert fresh_node_indexes("p", 0, taken) == []
    nodes = pool_nodes(TPUPool("p", "v6e", "2x2", 2), indexes=[3, 5])
    assert [n["metadata"]["name"] for n in nodes] == [node_name("p", 3), node_name("p", 5)]
    with pytest.raises(ValueError, match="2 distinct numbers"):
        pool_nodes(TPUPool("p", "v6e", "2x2", 2), indexes=[1, 1])


def test_hostname_not_in_is_read_and_check_capacity_skips_those_nodes() -> None:
    expr = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1", "n2"]}
    s = shape(affinity=[expr])
    assert s.host_not_in == {"n1", "n2"}
    tpu_taint = {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}

    def node(name: str) -> NodeView:
        labels = {**V6E_2X2, "kubernetes.io/hostname": name}
        return NodeView(name, labels, (tpu_taint,), ready=True, schedulable=True, free_chips=4)

    assert free_nodes(s, [node("n1"), node("n2"), node("n3")]) == 1
    assert free_nodes(shape(), [node("n1"), node("n2"), node("n3")]) == 3


# ---------------------------------------------------------------- the provisioner's bookkeeping


class _Listed:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = copy.deepcopy(items)


class _Core:
    """The CoreV1Api calls the provisioner makes, over dicts in memory."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.templates: list[dict[str, Any]] = []
        self.config: dict[str, str] | None = None

    def list_pod_template_for_all_namespaces(self) -> _Listed:
        return _Listed(self.templates)

    def list_node(self) -> _Listed:
        return _Listed(list(self.nodes.values()))

    def list_pod_for_all_namespaces(self) -> _Listed:
        return _Listed([])

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        if self.config is None:
            raise ApiException(status=404)
        return dataclasses.make_dataclass("CM", ["data"])(dict(self.config))

    def replace_namespaced_config_map(self, name: str, namespace: str, body: Any) -> None:
        self.config = dict(body["data"])

    def create_node(self, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        if name in self.nodes:
            raise ApiException(status=409)
        node = copy.deepcopy(body)
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]  # KWOK's part
        self.nodes[name] = node

    def delete_node(self, name: str) -> None:
        if self.nodes.pop(name, None) is None:
            raise ApiException(status=404)


class _Custom:
    """The CustomObjectsApi calls the provisioner makes, for ProvisioningRequests."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    def add(self, name: str, template: str, count: int) -> None:
        self.objects[name] = {
            "metadata": {
                "namespace": "ns",
                "name": name,
                "uid": f"uid-{name}",
                "resourceVersion": "1",
                "creationTimestamp": "2027-01-15T08:00:00Z",
                "annotations": {},
            },
            "spec": {
                "provisioningClassName": BEST_EFFORT_CLASS,
                "podSets": [{"podTemplateRef": {"name": template}, "count": count}],
            },
        }

    def list_cluster_custom_object(self, *_: str) -> dict[str, Any]:
        return {"items": copy.deepcopy(list(self.objects.values()))}

    def get_namespaced_custom_object(self, *args: str) -> dict[str, Any]:
        return copy.deepcopy(self.objects[args[-1]])

    def patch_namespaced_custom_object(self, *args: Any) -> None:
        *_, name, body = args
        annotations = self.objects[name]["metadata"]["annotations"]
        for key, value in body["metadata"]["annotations"].items():
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value

    def patch_namespaced_custom_object_status(self, *args: Any) -> None:
        *_, name, body = args
        self.objects[name]["status"] = copy.deepcopy(body["status"])


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeProvisioner, _Core, _Custom]:
    core, custom = _Core(), _Custom()
    monkeypatch.setattr(kube, "core_v1", lambda api: core)
    monkeypatch.setattr(provisioner.client, "CustomObjectsApi", lambda api: custom)
    settings = ProvisionerSettings(timings=FAST, autoscaled_pools=(SINGLE,))
    return FakeProvisioner(object(), settings), core, custom


def _group_of(core: _Core) -> dict[str, str | None]:
    return {
        name: (n["metadata"]["annotations"] or {}).get(GROUP_ANNOTATION)
        for name, n in sorted(core.nodes.items())
    }


def test_grown_nodes_are_named_apart_and_removed_per_request_only(
    fake: tuple[FakeProvisioner, _Core, _Custom],
) -> None:
    prov, core, custom = fake
    existing = pool_nodes(TPUPool("v6e-single", "v6e", "2x2", 1))[0]  # not ours
    core.nodes[existing["metadata"]["name"]] = existing
    excluded = [node_name("v6e-single", 0), node_name("v6e-single", 1)]
    hosts = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": excluded}
    core.templates = [template(name="ta", affinity=[hosts]), template(name="tb")]
    custom.add("a", "ta", 2)  # grows the pool by 2, never naming a node it excludes
    custom.add("b", "tb", 1)  # the pool's last room, in the same pass
    custom.add("c", "tb", 1)  # no room left: a whole pool of its own
    for at in (0, 1, 4):
        prov.reconcile_once(CREATED + at)
    pools = prov.pools()
    group_a = custom.objects["a"]["metadata"]["annotations"][POOLS_ANNOTATION]
    group_b = custom.objects["b"]["metadata"]["annotations"][POOLS_ANNOTATION]
    pool_c = custom.objects["c"]["metadata"]["annotations"][POOLS_ANNOTATION]
    assert {pools[group_a], pools[group_b], pools[pool_c]} == {
        "ns/a/uid-a",
        "ns/b/uid-b",
        "ns/c/uid-c",
    }
    assert pool_c.startswith("auto-v6e-2x2-")
    single = {k: v for k, v in _group_of(core).items() if "v6e-single" in k}
    assert single == {
        node_name("v6e-single", 0): None,
        node_name("v6e-single", 1): group_b,
        node_name("v6e-single", 2): group_a,
        node_name("v6e-single", 3): group_a,
    }
    grown = core.nodes[node_name("v6e-single", 2)]["metadata"]
    assert grown["annotations"][NODE_OWNER_ANNOTATION] == "ns/a/uid-a"
    assert grown["labels"]["cloud.google.com/gke-nodepool"] == "v6e-single"
    assert grown["labels"]["kubernetes.io/hostname"] == node_name("v6e-single", 2)

    prov.revoke("ns", "a")  # CapacityRevoked: a's nodes go, the pool's others stay
    prov.reconcile_once(CREATED + 5)
    assert custom.objects["a"]["status"]["conditions"][-1]["type"] == "CapacityRevoked"
    assert sorted(k for k in core.nodes if "v6e-single" in k) == [
        node_name("v6e-single", 0),
        node_name("v6e-single", 1),
    ]
    del custom.objects["b"]  # its owner gave it up: its group goes once empty
    prov.reconcile_once(CREATED + 6)
    assert node_name("v6e-single", 1) in core.nodes
    prov.reconcile_once(CREATED + 12)
    assert [k for k in core.nodes if "v6e-single" in k] == [node_name("v6e-single", 0)]
    assert any(k.startswith(f"gke-tpusim-{pool_c}-") for k in core.nodes)  # c's pool stays


def test_declared_pools_come_from_the_config_map_and_a_bad_one_is_ignored(
    fake: tuple[FakeProvisioner, _Core, _Custom],
) -> None:
    prov, core, _ = fake
    assert prov._read_config()[2] == [SINGLE]
    prov.configure(autoscaled_pools=[QUEUED_SINGLE])
    assert prov._read_config()[2] == [QUEUED_SINGLE]
    prov.configure()  # no key: the settings' list applies
    assert prov._read_config()[2] == [SINGLE]
    core.config = {"autoscaledPools": "- {name: m, tpuType: v6e, topology: 4x4, maxNodes: 2}\n"}
    assert prov._read_config()[2] == [SINGLE]
    assert any("only single-host" in line for line in prov.events)
    with pytest.raises(ValueError, match="duplicate"):
        ProvisionerSettings(autoscaled_pools=(SINGLE, SINGLE))


def test_cli_spec_and_presets_declare_pools() -> None:
    pool = parse_autoscaled_spec("serve:v5e:2x2:6,queued,reservation=r1")
    assert (pool.name, pool.tpu_type, pool.max_nodes, pool.queued) == ("serve", "v5e", 6, True)
    assert pool.reservation == "r1" and pool.node_pool(1).capacity_type == "reservation"
    assert parse_autoscaled_spec("v6e-2x2-autoscaled") == AUTOSCALED_PRESETS["v6e-2x2-autoscaled"]
    assert AUTOSCALED_PRESETS["v6e-2x2-queued"].queued
    for bad, why in (
        ("serve:v6e:2x2", "want NAME:TYPE"),
        ("serve:v6e:2x2:many", "not a number"),
        ("serve:v6e:2x2:2,fast", "unknown option 'fast'"),
        ("serve:v6e:4x4:2", "only single-host"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_autoscaled_spec(bad)
