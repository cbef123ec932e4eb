"""Several worker groups in one cluster (spec.workerGroups): what the CRD and the parser
refuse, how a grouped spec renders, and the identity each group's hosts get."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from tests.support.builders import slice_pods, tpuslice
from tests.support.crd import validate
from tests.support.fake_kube import FakeKube
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model import constants as c
from tpuslice.model.convert import raycluster_info
from tpuslice.model.records import PodInfo, Snapshot
from tpuslice.render.groups import NOT_ON_TPU_NODES
from tpuslice.render.identity import mutate_pod
from tpuslice.render.kuberay import render_cluster
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.job import parse_job
from tpuslice.spec.limits import controller_errors
from tpuslice.spec.parts import MAX_GROUP_NAME, CpuGroupSpec, SpecError
from tpuslice.spec.service import parse_service

TSC = "tpuslice.dev_tpusliceclusters.yaml"
TSJ = "tpuslice.dev_tpuslicejobs.yaml"
TSS = "tpuslice.dev_tpusliceservices.yaml"

TRAINER = {"name": "trainer", "tpu": {"type": "v6e", "topology": "4x4", "slices": 2}}
ROLLOUT = {
    "name": "rollout",
    "tpu": {"type": "v5e", "topology": "2x4", "slices": 3, "multislice": False},
    "resources": {"memory": "100Gi"},
}
DATA = {"name": "data", "cpu": {"replicas": 2}, "resources": {"cpu": "8", "memory": "32Gi"}}


def grouped(*groups: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A TPUSliceCluster in the many-group form (no spec.tpu)."""
    kept_tpu = spec.pop("tpu", None)
    obj = tpuslice(**spec)
    del obj["spec"]["tpu"]
    if kept_tpu is not None:  # mixing the forms, to be refused
        obj["spec"]["tpu"] = kept_tpu
    obj["spec"]["workerGroups"] = [copy.deepcopy(g) for g in groups or (TRAINER, ROLLOUT, DATA)]
    return obj


def errors_of(obj: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as info:
        parse_cluster(obj)
    return str(info.value)


def test_groups_parse_into_records_of_their_own_shapes() -> None:
    spec = parse_cluster(grouped())
    tpu_groups = spec.tpu_groups()
    assert [(g.group_name, g.shape.topology, g.slices, g.multislice) for g in tpu_groups] == [
        ("trainer", "4x4", 2, True),
        ("rollout", "2x4", 3, False),
    ]
    assert tpu_groups[1].worker.resources == {"memory": "100Gi"}
    assert spec.cpu_groups == (CpuGroupSpec("data", 2, spec.cpu_groups[0].worker),)
    assert spec.slices == 5  # what the per-object limits judge
    assert str(spec.gang) == "AllSlices"  # the gang spans the groups by default


def test_the_one_group_form_is_one_group_named_tpu() -> None:
    spec = parse_cluster(tpuslice())
    assert not spec.grouped
    assert spec.tpu_groups() == (spec,)
    assert spec.group_name == c.WORKER_GROUP


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        (grouped(tpu={"type": "v6e", "topology": "4x4"}), "cannot be mixed with spec.tpu"),
        (grouped(worker={"resources": {"cpu": "1"}}), "cannot be mixed with spec.worker"),
        (grouped(TRAINER, dict(TRAINER)), "names two groups"),
        (grouped({**TRAINER, "name": "head"}), "must not be head"),
        (grouped({**TRAINER, "name": "a" * (MAX_GROUP_NAME + 1)}), "at most 52 characters"),
        (grouped({**TRAINER, "name": "Trainer"}), "DNS-1035 label"),
        (grouped({**TRAINER, "cpu": {"replicas": 1}}), "exactly one of tpu"),
        (grouped({"name": "x"}), "exactly one of tpu"),
        (grouped(DATA), "needs at least one tpu group"),
        (grouped({**DATA, "cpu": {"replicas": -1}}, TRAINER), "from 0 to 4096"),
        (grouped({**TRAINER, "tpu": {"type": "v6e", "topology": "4x4x4"}}), "workerGroups[0].tpu"),
        (grouped({**TRAINER, "replicas": 2}), "workerGroups[0].replicas: is not a field"),
        (grouped(*[{**TRAINER, "name": f"g{i}"} for i in range(17)]), "1 to 16 groups"),
        (
            grouped({**TRAINER, "resources": {"google.com/tpu": "4"}}),
            "workerGroups[0].resources.google.com/tpu",
        ),
    ],
)
def test_bad_groups_are_refused_naming_the_field(obj: dict[str, Any], fragment: str) -> None:
    assert fragment in errors_of(obj)


def test_a_job_takes_groups_too() -> None:
    obj = grouped(kind=c.KIND_JOB, job={"entrypoint": "python train.py"})
    spec = parse_job(obj)
    assert [g.group_name for g in spec.cluster.tpu_groups()] == ["trainer", "rollout"]


def test_a_grouped_cluster_reserves_and_refuses_only_what_is_not_run() -> None:
    assert controller_errors(parse_cluster(grouped())) == []
    assert controller_errors(parse_cluster(grouped(reservation={"policy": "None"}))) == []
    assert controller_errors(parse_cluster(tpuslice())) == []
    job = parse_job(grouped(kind=c.KIND_JOB, job={"entrypoint": "python train.py"}))
    assert controller_errors(job.cluster) == []
    service = parse_service(grouped(kind=c.KIND_SERVICE, serve={"serveConfigV2": "x: 1"}))
    assert controller_errors(service.cluster) == []
    provisioned = grouped(reservation={"provisioning": {"mode": "BestEffortAtomic"}})
    assert "spec.reservation.provisioning" in str(controller_errors(parse_cluster(provisioned))[0])


def test_two_joined_groups_of_one_shape_are_refused_naming_the_fix() -> None:
    twin = {**TRAINER, "name": "twin"}
    (error,) = controller_errors(parse_cluster(grouped(TRAINER, twin)))
    assert "groups trainer and twin are both v6e 4x4" in str(error)
    assert "tpu.gang Independent" in str(error)
    independent = {**TRAINER, "name": "twin", "tpu": {**TRAINER["tpu"], "gang": "Independent"}}
    assert controller_errors(parse_cluster(grouped(TRAINER, independent))) == []
    per_slice = grouped(TRAINER, twin, reservation={"gang": "PerSlice"})
    assert controller_errors(parse_cluster(per_slice)) == []


def test_the_gang_across_groups_is_every_joined_tpu_group() -> None:
    spec = parse_cluster(grouped())
    assert [g.group_name for g in spec.gang_groups()] == ["trainer", "rollout"]
    alone = {**ROLLOUT, "tpu": {**ROLLOUT["tpu"], "gang": "Independent"}}
    assert parse_cluster(grouped(TRAINER, alone, DATA)).gang_groups() == ()
    assert parse_cluster(grouped(reservation={"gang": "PerSlice"})).gang_groups() == ()
    assert "workerGroups[0].tpu.gang: 'Alone' is not Joined or Independent" in errors_of(
        grouped({**TRAINER, "tpu": {**TRAINER["tpu"], "gang": "Alone"}})
    )


@pytest.mark.parametrize("crd", [TSC, TSJ, TSS])
def test_the_crds_accept_groups(crd: str) -> None:
    obj = grouped()
    if crd == TSJ:
        obj["spec"]["job"] = {"entrypoint": "python train.py"}
    if crd == TSS:
        obj["spec"]["serve"] = {"serveConfigV2": "applications: []"}
    assert validate(crd, obj) == []


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        (grouped(tpu={"type": "v6e", "topology": "4x4"}), "exactly one of spec.tpu"),
        (grouped(worker={"resources": {"cpu": "1"}}), "cannot be mixed with spec.worker"),
        (grouped(elastic={"maxSlices": 2}), "cannot be mixed with spec.worker or spec.elastic"),
        (grouped(TRAINER, dict(TRAINER)), "names must be unique"),
        (grouped({**TRAINER, "name": "head"}), "must not be head"),
        (grouped({**TRAINER, "name": "a" * 53}), "at most 52 characters"),
        (grouped({**TRAINER, "cpu": {"replicas": 1}}), "exactly one of tpu"),
        (grouped(*[{**TRAINER, "name": f"g{i}"} for i in range(17)]), "is too long"),
    ],
)
def test_the_crd_refuses_bad_groups(obj: dict[str, Any], fragment: str) -> None:
    messages = validate(TSC, obj)
    assert any(fragment in m for m in messages), messages


def test_neither_form_is_refused_by_the_crd() -> None:
    obj = tpuslice()
    del obj["spec"]["tpu"]
    assert any("exactly one of spec.tpu" in m for m in validate(TSC, obj))


def test_the_form_cannot_change_on_a_live_object() -> None:
    messages = validate(TSC, grouped(), old=tpuslice())
    assert any("cannot replace each other" in m for m in messages), messages
    assert validate(TSC, grouped(), old=grouped()) == []


# --- rendering -------------------------------------------------------------------------


def rendered_groups(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    groups = render_cluster(obj)["spec"]["workerGroupSpecs"]
    return {g["groupName"]: g for g in groups}


def test_each_entry_renders_one_worker_group_in_order() -> None:
    groups = render_cluster(grouped())["spec"]["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == ["trainer", "rollout", "data"]
    trainer, rollout, data = groups
    assert (trainer["replicas"], trainer["numOfHosts"]) == (2, 4)
    assert (rollout["replicas"], rollout["numOfHosts"]) == (3, 1)
    assert trainer["template"]["spec"]["nodeSelector"][c.NODE_LABEL_TOPOLOGY] == "4x4"
    assert rollout["template"]["spec"]["nodeSelector"][c.NODE_LABEL_TOPOLOGY] == "2x4"
    assert rollout["labels"][c.RAY_LABEL_TPU_POD_TYPE] == "v5litepod-8"
    assert rollout["template"]["metadata"]["annotations"][c.ANNOTATION_MULTISLICE] == "false"
    assert c.ANNOTATION_MULTISLICE not in trainer["template"]["metadata"]["annotations"]
    for tpu_group in (trainer, rollout):
        assert tpu_group["template"]["spec"]["schedulingGates"] == [{"name": c.SCHEDULING_GATE}]
    assert data["replicas"] == 2 and "numOfHosts" not in data


def test_a_cpu_group_is_plain_and_never_on_tpu_nodes() -> None:
    data = rendered_groups(grouped())["data"]
    pod = data["template"]["spec"]
    assert "schedulingGates" not in pod and "tolerations" not in pod and "nodeSelector" not in pod
    assert c.LABEL_CLUSTER not in (data["template"].get("metadata") or {}).get("labels", {})
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": [dict(NOT_ON_TPU_NODES)]}]


def test_every_term_of_a_cpu_groups_own_affinity_keeps_off_tpu_nodes() -> None:
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [term, {"matchFields": []}]
            }
        }
    }
    data = {**DATA, "template": {"spec": {"affinity": affinity}}}
    pod = rendered_groups(grouped(TRAINER, data))["data"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert len(terms["nodeSelectorTerms"]) == 2
    for t in terms["nodeSelectorTerms"]:
        assert dict(NOT_ON_TPU_NODES) in t["matchExpressions"]


def test_a_cpu_group_cannot_ask_for_chips_through_its_template() -> None:
    container = {"name": c.WORKER_CONTAINER, "resources": {"limits": {c.TPU_RESOURCE: "4"}}}
    data = {**DATA, "template": {"spec": {"containers": [container]}}}
    with pytest.raises(SpecError, match=r"workerGroups\[1\]\.template.*requests no TPU chips"):
        render_cluster(grouped(TRAINER, data))


def test_a_tpu_groups_template_problems_name_its_entry() -> None:
    trainer = {**TRAINER, "template": {"spec": {"nodeSelector": {c.NODE_LABEL_TOPOLOGY: "2x2"}}}}
    with pytest.raises(SpecError) as info:
        render_cluster(grouped(trainer))
    assert "spec.workerGroups[0].template.spec.nodeSelector" in str(info.value)
    assert "from spec.workerGroups[0].tpu.topology" in str(info.value)


def test_a_groups_template_is_bounded() -> None:
    big = {**DATA, "template": {"metadata": {"annotations": {"a": "x" * 70_000}}}}
    assert "workerGroups[1].template: is " in errors_of(grouped(TRAINER, big))


def test_the_one_group_form_renders_as_before() -> None:
    groups = render_cluster(tpuslice())["spec"]["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == [c.WORKER_GROUP]


# --- identity per group ----------------------------------------------------------------


def kuberay_pod(group: dict[str, Any], replica: int, host: int) -> dict[str, Any]:
    """What KubeRay (RayMultiHostIndexing on) sends to admission for one worker of ``group``."""
    meta = copy.deepcopy(group["template"].get("metadata") or {})
    labels = meta.setdefault("labels", {})
    labels.update(
        {
            c.KUBERAY_LABEL_CLUSTER: "llm",
            c.KUBERAY_LABEL_GROUP: group["groupName"],
            c.KUBERAY_LABEL_NODE_TYPE: "worker",
            c.KUBERAY_LABEL_REPLICA_INDEX: str(replica),
        }
    )
    if group.get("numOfHosts", 1) > 1:
        labels[c.KUBERAY_LABEL_HOST_INDEX] = str(host)
    meta["namespace"] = "ml"
    return {"metadata": meta, "spec": copy.deepcopy(group["template"]["spec"])}


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env") or []}


def all_hosts(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(group, mutated pod) of every TPU host of every group."""
    out = []
    for name, group in rendered_groups(obj).items():
        for replica in range(group["replicas"]):
            for host in range(group.get("numOfHosts", 1)):
                result = mutate_pod(kuberay_pod(group, replica, host))
                if result.identity is not None:
                    out.append((name, result.pod))
    return out


def test_identity_is_per_group_as_gkes_webhook_computes_it() -> None:
    """fleet-facts §5 (ai-on-gke/kuberay-tpu-webhook@ef658db main.go): TPU_NAME
    <group>-<replica>, hostname <group>-<replica>-<host>, MEGASCALE_SLICE_ID the replica
    index within the group, coordinator <group>-0-0.<cluster>-headless."""
    hosts = all_hosts(grouped())
    assert {g for g, _ in hosts} == {"trainer", "rollout"}  # CPU pods get no identity
    trainer = [(p, env_of(p)) for g, p in hosts if g == "trainer"]
    assert len(trainer) == 2 * 4
    for pod, env in trainer:
        replica = int(pod["metadata"]["labels"][c.KUBERAY_LABEL_REPLICA_INDEX])
        host = int(pod["metadata"]["labels"][c.KUBERAY_LABEL_HOST_INDEX])
        assert env["TPU_NAME"] == f"trainer-{replica}"
        assert pod["spec"]["hostname"] == f"trainer-{replica}-{host}"
        assert env["MEGASCALE_NUM_SLICES"] == "2"
        assert env["MEGASCALE_SLICE_ID"] == str(replica)
        assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "trainer-0-0.llm-headless"
    names = [env_of(p)["TPU_NAME"] for _, p in hosts]
    assert len(set(names)) == 2 + 3  # one per slice, unique across groups


def test_a_group_of_independent_slices_gets_no_megascale_env() -> None:
    rollout = [p for g, p in all_hosts(grouped()) if g == "rollout"]
    assert sorted(env_of(p)["TPU_NAME"] for p in rollout) == [f"rollout-{i}" for i in range(3)]
    for pod in rollout:
        assert not any(k.startswith("MEGASCALE_") for k in env_of(pod))


def test_independent_slices_get_no_megascale_even_when_the_user_asks() -> None:
    rollout = rendered_groups(grouped())["rollout"]
    pod = kuberay_pod(rollout, 1, 0)
    pod["spec"]["containers"][0]["env"].append({"name": "MEGASCALE_NUM_SLICES", "value": "3"})
    env = env_of(mutate_pod(pod).pod)
    assert "MEGASCALE_SLICE_ID" not in env and "MEGASCALE_COORDINATOR_ADDRESS" not in env


def test_a_group_name_at_the_limit_leaves_room_for_every_hostname() -> None:
    name = "g" * MAX_GROUP_NAME
    big = {"name": name, "tpu": {"type": "v5p", "topology": "16x16x24", "slices": 1}}
    group = rendered_groups(grouped(big))[name]
    last = group["numOfHosts"] - 1
    hostname = mutate_pod(kuberay_pod(group, 0, last)).pod["spec"]["hostname"]
    assert hostname == f"{name}-0-{last}"
    # the worst case: the highest replica index any object may have, the most hosts
    assert len(f"{name}-{c.MAX_SLICES - 1}-{last}") <= 63


# --- the pass: a slice set per TPU group, status.groups --------------------------------


def group_pods(group: str, slices: int, hosts: int, ready: bool) -> list[PodInfo]:
    return [
        pod
        for i in range(slices)
        for pod in slice_pods(
            f"{group}-{'abcde'[i]}xxxx",
            i,
            hosts=hosts,
            group=group,
            gated=False,
            ready=ready,
            node_name=f"{group}-node-{i}",
        )
    ]


def grouped_pass(ready_rollout: bool) -> dict[str, Any]:
    body = grouped(reservation={"policy": "None"}, uid="uid-rl", generation=1)
    rendered = render_cluster(body)
    rc = raycluster_info({**rendered, "status": {"state": "ready" if ready_rollout else ""}})
    pods = group_pods("trainer", 2, 4, True) + group_pods("rollout", 3, 1, ready_rollout)
    kube = FakeKube()
    snap = Snapshot(body, pods, [], [], rc)
    asyncio.run(Reconciler(kube, lambda key: snap).kick((c.KIND_CLUSTER, "ml", "llm")))
    assert kube.status is not None
    return kube.status


def test_each_tpu_group_is_observed_on_its_own_and_ready_together() -> None:
    status = grouped_pass(ready_rollout=True)
    groups = {g["name"]: g for g in status["groups"]}
    assert [g["name"] for g in status["groups"]] == ["trainer", "rollout", "data"]
    assert (groups["trainer"]["desiredSlices"], groups["trainer"]["readySlices"]) == (2, 2)
    assert groups["trainer"]["hostsPerSlice"] == 4
    assert [s["readyHosts"] for s in groups["trainer"]["slices"]] == [4, 4]
    assert (groups["rollout"]["desiredSlices"], groups["rollout"]["readySlices"]) == (3, 3)
    assert groups["rollout"]["acceleratorType"] == "v5litepod-8"
    assert groups["data"] == {"name": "data", "desiredReplicas": 2}
    assert (status["desiredSlices"], status["readySlices"]) == (5, 5)
    assert "slices" not in status and "acceleratorType" not in status
    ready = next(cond for cond in status["conditions"] if cond["type"] == "Ready")
    assert ready["status"] == "True", status["conditions"]


def test_a_grouped_cluster_is_not_ready_while_one_group_is_short() -> None:
    status = grouped_pass(ready_rollout=False)
    groups = {g["name"]: g for g in status["groups"]}
    assert groups["trainer"]["readySlices"] == 2 and groups["rollout"]["readySlices"] == 0
    ready = next(cond for cond in status["conditions"] if cond["type"] == "Ready")
    assert ready["status"] == "False"
