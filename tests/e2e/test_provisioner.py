"""The fake GKE provisioner (tpusim.provisioner) on the local cluster, with no operator.

It grades the fake itself: the CRD as the API server enforces it, a queued request
becoming a whole tainted pool that consuming pods run on, best-effort-atomic pools
that honour NotIn and go after an idle booking, check-capacity creating nothing, a
missing PodTemplate stalling every request, and the scripted faults.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiException

from tests.e2e.helpers import TPU_TOLERATION, V6E_4X4, E2ECluster, tpu_pod
from tpusim import kube
from tpusim.provisioner import CONFIG_MAP, FakeProvisioner, ProvisionerSettings
from tpusim.provreq import (
    BEST_EFFORT_CLASS,
    CHECK_CAPACITY_CLASS,
    CONSUME_ANNOTATION,
    GROUP,
    PLURAL,
    QUEUED_CLASS,
    Fault,
    FaultRule,
    Timings,
    resize_request_name,
)

QUEUED_TOLERATION = {
    "key": "cloud.google.com/gke-queued",
    "operator": "Equal",
    "value": "true",
    "effect": "NoSchedule",
}
TIMINGS = Timings(
    accept_delay_s=0.5,
    provision_delay_s=1.0,
    booking_s=8.0,
    pending_retry_s=5.0,
    scale_down_delay_s=1.0,
)
NODEPOOL = "cloud.google.com/gke-nodepool"


@pytest.fixture(scope="module")
def fake(cluster: E2ECluster) -> Iterator[FakeProvisioner]:
    provisioner = FakeProvisioner(cluster.api, ProvisionerSettings(timings=TIMINGS, interval_s=0.3))
    with provisioner:
        yield provisioner
        assert provisioner.errors == []
    try:
        cluster.core.delete_namespaced_config_map(CONFIG_MAP[1], CONFIG_MAP[0])
    except ApiException as exc:
        if exc.status != 404:
            raise
    assert not kube.harness_nodes(cluster.api) or all(
        "tpusim.dev/provisioning-request" not in (n.metadata.annotations or {})
        for n in kube.harness_nodes(cluster.api)
    )


@pytest.fixture(autouse=True)
def no_faults(fake: FakeProvisioner) -> None:
    fake.configure()


def make_template(
    cluster: E2ECluster,
    namespace: str,
    name: str,
    selector: dict[str, str] | None = None,
    chips: int = 4,
    tolerations: list[dict[str, Any]] | None = None,
    affinity: dict[str, Any] | None = None,
) -> None:
    spec = tpu_pod(name, V6E_4X4 if selector is None else selector, chips)["spec"]
    spec["tolerations"] = tolerations or [TPU_TOLERATION]
    if affinity:
        spec["affinity"] = affinity
    body = {"metadata": {"name": name}, "template": {"spec": spec}}
    cluster.core.create_namespaced_pod_template(namespace, body)


def make_request(
    cluster: E2ECluster,
    namespace: str,
    name: str,
    cls: str,
    templates: list[str],
    count: int = 4,
    parameters: dict[str, str] | None = None,
    version: str = "v1",
) -> None:
    body = {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "ProvisioningRequest",
        "metadata": {"name": name},
        "spec": {
            "provisioningClassName": cls,
            "podSets": [{"podTemplateRef": {"name": t}, "count": count} for t in templates],
            **({"parameters": parameters} if parameters else {}),
        },
    }
    cluster.custom.create_namespaced_custom_object(GROUP, version, namespace, PLURAL, body)


def get_request(cluster: E2ECluster, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
        GROUP, "v1", namespace, PLURAL, name
    )
    return obj


def conditions(cluster: E2ECluster, namespace: str, name: str) -> dict[str, tuple[str, str]]:
    status = get_request(cluster, namespace, name).get("status") or {}
    return {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions") or []}


def wait_condition(
    cluster: E2ECluster, namespace: str, name: str, kind: str, timeout_s: float = 30.0
) -> dict[str, tuple[str, str]]:
    def check() -> dict[str, tuple[str, str]] | None:
        conds = conditions(cluster, namespace, name)
        return conds if conds.get(kind, ("",))[0] == "True" else None

    return kube.wait_for(
        check,
        timeout_s=timeout_s,
        what=f"{namespace}/{name} {kind}=True",
        describe=lambda: conditions(cluster, namespace, name),
    )


def pool_nodes(cluster: E2ECluster, pool: str) -> list[Any]:
    return list(cluster.core.list_node(label_selector=f"{NODEPOOL}={pool}").items)


def pool_nodes_registered(cluster: E2ECluster, pool: str, count: int = 4) -> list[Any]:
    """The pool's nodes once ``count`` have registered: Provisioned=True is written
    before any Node does (as on GKE), so the nodes come a little after the condition."""

    def registered() -> list[Any] | None:
        nodes = pool_nodes(cluster, pool)
        return nodes if len(nodes) == count else None

    return kube.wait_for(
        registered,
        timeout_s=30,
        what=f"{count} nodes of pool {pool}",
        describe=lambda: [n.metadata.name for n in pool_nodes(cluster, pool)],
    )


def owned_pools(fake: FakeProvisioner, namespace: str, name: str) -> list[str]:
    return sorted(
        p for p, owner in fake.pools().items() if owner.startswith(f"{namespace}/{name}/")
    )


def test_crd_enforces_immutable_spec_and_serves_v1beta1(
    cluster: E2ECluster, namespace: str, fake: FakeProvisioner
) -> None:
    make_template(cluster, namespace, "t")
    make_request(cluster, namespace, "r", CHECK_CAPACITY_CLASS, ["t"], count=1)
    patch = {"spec": {"podSets": [{"podTemplateRef": {"name": "t"}, "count": 2}]}}
    with pytest.raises(ApiException) as err:
        cluster.custom.patch_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, "r", patch)
    assert err.value.status == 422 and "Value is immutable" in str(err.value.body)
    long = {"spec": {"parameters": {"x": "a" * 256}}}
    with pytest.raises(ApiException) as err:
        make_request(
            cluster,
            namespace,
            "r2",
            BEST_EFFORT_CLASS,
            ["t"],
            parameters=long["spec"]["parameters"],
        )
    assert err.value.status == 422
    make_request(cluster, namespace, "old", CHECK_CAPACITY_CLASS, ["t"], count=1, version="v1beta1")
    assert get_request(cluster, namespace, "old")["spec"]["podSets"][0]["count"] == 1


def test_queued_request_gets_a_whole_tainted_pool_that_consumers_run_on(
    cluster: E2ECluster, namespace: str, fake: FakeProvisioner
) -> None:
    make_template(cluster, namespace, "slice", tolerations=[TPU_TOLERATION, QUEUED_TOLERATION])
    make_request(cluster, namespace, "slice-0", QUEUED_CLASS, ["slice"])
    wait_condition(cluster, namespace, "slice-0", "Provisioned")
    details = get_request(cluster, namespace, "slice-0")["status"]["provisioningClassDetails"]
    pool = details["NodePoolName"]
    assert details["ResizeRequestName"] == resize_request_name(namespace, "slice-0")
    nodes = pool_nodes_registered(cluster, pool)
    for node in nodes:
        labels = node.metadata.labels
        assert labels["autoscaling.gke.io/provisioning-request"] == details["ResizeRequestName"]
        assert labels["cloud.google.com/gke-tpu-topology"] == "4x4"
        assert labels["cloud.google.com/gke-flex-start"] == "true"
        taints = {(t.key, t.effect) for t in node.spec.taints}
        # (and node.kubernetes.io/not-ready until KWOK reports the node Ready)
        assert {
            ("google.com/tpu", "NoSchedule"),
            ("cloud.google.com/gke-queued", "NoSchedule"),
        } <= taints
    kube.wait_nodes_ready(cluster.api, [n.metadata.name for n in nodes])
    for i in range(4):
        pod = tpu_pod(f"w{i}", {**V6E_4X4, NODEPOOL: pool}, 4)
        pod["spec"]["tolerations"] = [TPU_TOLERATION, QUEUED_TOLERATION]
        pod["metadata"]["annotations"] = {
            CONSUME_ANNOTATION: "slice-0",
            "autoscaling.x-k8s.io/provisioning-class-name": QUEUED_CLASS,
        }
        cluster.core.create_namespaced_pod(namespace, pod)

    def running_on_pool() -> bool:
        pods = cluster.core.list_namespaced_pod(namespace).items
        names = {n.metadata.name for n in nodes}
        return len(pods) == 4 and all(
            p.status.phase == "Running" and p.spec.node_name in names for p in pods
        )

    kube.wait_for(running_on_pool, timeout_s=30, what="4 consumers Running on the new pool")
    conds = wait_condition(cluster, namespace, "slice-0", "BookingExpired", timeout_s=20)
    assert conds["BookingExpired"] == ("True", "BookingExpired")
    fake.wait_idle(passes=5)
    assert len(pool_nodes(cluster, pool)) == 4  # busy nodes stay after the booking
    cluster.core.delete_collection_namespaced_pod(namespace)
    kube.wait_for(
        lambda: not pool_nodes(cluster, pool), timeout_s=30, what=f"empty pool {pool} removed"
    )


def test_queued_refuses_two_pod_sets(
    cluster: E2ECluster, namespace: str, fake: FakeProvisioner
) -> None:
    make_template(cluster, namespace, "t")
    make_request(cluster, namespace, "two", QUEUED_CLASS, ["t", "t"])
    conds = wait_condition(cluster, namespace, "two", "Failed")
    assert conds == {
        "Accepted": ("False", "NotAccepted"),
        "Failed": ("True", "MultiplePodSetsUnsupported"),
    }


def test_best_effort_honours_not_in_and_an_idle_pool_goes_after_booking(
    cluster: E2ECluster, namespace: str, fake: FakeProvisioner
) -> None:
    held = ["v6e-4x4-a", "v6e-4x4-b"]
    expr = {"key": NODEPOOL, "operator": "NotIn", "values": held}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expr]}]
            }
        }
    }
    make_template(cluster, namespace, "t", affinity=affinity)
    make_request(cluster, namespace, "be", BEST_EFFORT_CLASS, ["t"])
    wait_condition(cluster, namespace, "be", "Provisioned")
    status = get_request(cluster, namespace, "be")["status"]
    assert not status.get("provisioningClassDetails")  # OSS classes name no pool
    (pool,) = owned_pools(fake, namespace, "be")
    assert pool not in held
    nodes = pool_nodes_registered(cluster, pool)
    taints = {t.key for n in nodes for t in n.spec.taints}
    assert taints - {"node.kubernetes.io/not-ready"} == {"google.com/tpu"}  # not queued
    conds = wait_condition(cluster, namespace, "be", "BookingExpired", timeout_s=20)
    assert conds["BookingExpired"] == ("True", "CapacityReservationTimeExpired")
    kube.wait_for(lambda: not pool_nodes(cluster, pool), timeout_s=20, what="idle pool removed")


def test_check_capacity_finds_existing_nodes_and_creates_none(
    cluster: E2ECluster, namespace: str, fake: FakeProvisioner
) -> None:
    v4 = {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v4-podslice",
        "cloud.google.com/gke-tpu-topology": "2x2x2",
    }
    make_template(cluster, namespace, "t", selector=v4)
    make_request(cluster, namespace, "cc", CHECK_CAPACITY_CLASS, ["t"], count=2)
    conds = wait_condition(cluster, namespace, "cc", "Provisioned")
    assert conds["Provisioned"] == ("True", "CapacityIsFound")
    make_request(cluster, namespace, "cc3", CHECK_CAPACITY_CLASS, ["t"], count=3)
    kube.wait_for(
        lambda: conditions(cluster, namespace, "cc3").get("Provisioned", ("",))[0] == "False",
        timeout_s=20,
        what="cc3 Provisioned=False",
    )
    assert fake.pools() == {}


def test_a_missing_template_stalls_every_request(
    cluster: E2ECluster, namespace: str, fake: FakeProvisioner
) -> None:
    # the orphan first: a pass of the provisioner between the two creates must already
    # see it, or it would rightly accept "ok" on its own
    make_template(cluster, namespace, "t")
    make_request(cluster, namespace, "orphan", BEST_EFFORT_CLASS, ["missing"])
    make_request(cluster, namespace, "ok", BEST_EFFORT_CLASS, ["t"])
    fake.wait_idle(passes=6)
    assert conditions(cluster, namespace, "ok") == {}
    assert any("while fetching pod templates" in e and "orphan" in e for e in fake.events)
    make_template(cluster, namespace, "missing")
    wait_condition(cluster, namespace, "ok", "Provisioned")
    wait_condition(cluster, namespace, "orphan", "Provisioned")
    for name in ("ok", "orphan"):
        cluster.custom.delete_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, name)
    kube.wait_for(
        lambda: fake.pools() == {}, timeout_s=20, what="pools of deleted requests removed"
    )


def test_scripted_faults_from_the_config_map(
    cluster: E2ECluster, namespace: str, fake: FakeProvisioner
) -> None:
    fake.configure(
        faults=[
            FaultRule(
                Fault("fail", reason="QuotaExceeded", message="no quota"),
                name_regex="fl-.*",
                times=1,
            ),
            FaultRule(Fault("not-ready-node", node=1), name_regex="nr-.*"),
            FaultRule(Fault("late-nodes", seconds=4), name_regex="lt-.*"),
            FaultRule(Fault("never"), name_regex="nv-.*"),
        ]
    )
    tolerations = [TPU_TOLERATION, QUEUED_TOLERATION]
    make_template(cluster, namespace, "t", tolerations=tolerations)
    for name in ("fl-0", "fl-1", "nr-0", "lt-0", "nv-0"):
        make_request(cluster, namespace, name, QUEUED_CLASS, ["t"])
    conds = wait_condition(cluster, namespace, "fl-0", "Failed")
    assert conds["Failed"] == ("True", "QuotaExceeded")
    wait_condition(cluster, namespace, "fl-1", "Provisioned")  # times=1: the next one works

    wait_condition(cluster, namespace, "lt-0", "Provisioned")
    late_pool = get_request(cluster, namespace, "lt-0")["status"]["provisioningClassDetails"]
    assert not pool_nodes(cluster, late_pool["NodePoolName"])  # Provisioned before the VMs
    kube.wait_for(
        lambda: len(pool_nodes(cluster, late_pool["NodePoolName"])) == 4,
        timeout_s=20,
        what="late nodes registered",
    )

    wait_condition(cluster, namespace, "nr-0", "Provisioned")
    (pool,) = owned_pools(fake, namespace, "nr-0")

    def one_not_ready() -> list[str] | None:
        nodes = pool_nodes(cluster, pool)
        bad = sorted(n.metadata.name for n in nodes if not kube.node_ready(n))
        return bad if len(nodes) == 4 and len(bad) == 1 else None

    assert kube.wait_for(one_not_ready, timeout_s=20, what="one NotReady node") == [
        f"gke-tpusim-{pool}-1"
    ]
    fake.revoke(namespace, "nr-0")
    conds = wait_condition(cluster, namespace, "nr-0", "CapacityRevoked")
    assert conds["BookingExpired"][0] == "True"
    kube.wait_for(lambda: not pool_nodes(cluster, pool), timeout_s=20, what="revoked pool gone")

    assert conditions(cluster, namespace, "nv-0") == {"Accepted": ("True", "SuccessfullyQueued")}
    annotations = get_request(cluster, namespace, "nv-0")["metadata"]["annotations"]
    assert annotations["tpusim.dev/fault"] == Fault("never").to_json()


def test_max_run_duration_revokes_capacity(
    cluster: E2ECluster, namespace: str, fake: FakeProvisioner
) -> None:
    make_template(cluster, namespace, "t", tolerations=[TPU_TOLERATION, QUEUED_TOLERATION])
    make_request(
        cluster, namespace, "mrd", QUEUED_CLASS, ["t"], parameters={"maxRunDurationSeconds": "10"}
    )
    wait_condition(cluster, namespace, "mrd", "Provisioned")
    pool = get_request(cluster, namespace, "mrd")["status"]["provisioningClassDetails"][
        "NodePoolName"
    ]
    conds = wait_condition(cluster, namespace, "mrd", "CapacityRevoked", timeout_s=30)
    assert conds["CapacityRevoked"] == ("True", "CapacityRevoked")
    kube.wait_for(lambda: not pool_nodes(cluster, pool), timeout_s=20, what="revoked pool gone")
    assert conds["BookingExpired"][0] == "True"  # GKE revokes from BookingExpired only
