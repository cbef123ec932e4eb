"""Capacity on demand end to end (issue 15): the operator asks GKE for node pools.

A TPUSliceCluster with ``spec.reservation.provisioning`` whose slices find no free
node pool gets one ProvisioningRequest per waiting slice; the fake GKE provisioner
(``tpusim.provisioner``, a simulation: docs/local-cluster.md) turns each into a whole
pool, and the slice claims it with a SliceReservation and is released with the
request's consume annotations. Every scenario runs over a shape no default pool has
(v6e 2x4 on 4-chip hosts: two nodes a slice), under ``InvariantWatch`` (no pod
released before its slice holds a whole pool, no pool with two slices' pods), and
every test ends by deleting its clusters and checking that no ProvisioningRequest
or PodTemplate of the namespace is left.

Waits are generous (2 shared cores, maybe another e2e run next to this one) and
nothing is asserted about durations; the time from a request's ``Provisioned`` to
its slice's release is recorded (``operator-timings.txt``, docs/performance.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from kubernetes.client import ApiException

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import (
    InvariantWatch,
    apply,
    condition,
    describe,
    event_reasons,
    get_tsc,
    held_by,
    kubectl,
    record,
    slice_pods,
    tsc,
    wait_condition,
)
from tpusim import kube
from tpusim.nodepools import POOL_ANNOTATION
from tpusim.operator_process import OperatorProcess
from tpusim.provisioner import (
    CONFIG_MAP,
    FakeProvisioner,
    ProvisionerSettings,
)
from tpusim.provreq import GROUP as PR_GROUP
from tpusim.provreq import PLURAL as PR_PLURAL
from tpusim.provreq import Timings

ACCELERATOR, TOPOLOGY, HOSTS = "tpu-v6e-slice", "2x4", 2
NODEPOOL = "cloud.google.com/gke-nodepool"
CONSUME = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS = "autoscaling.x-k8s.io/provisioning-class-name"
WAIT_S = 240  # KubeRay, the scheduler, the operator and the fake share 2 cores
TIMINGS = Timings(
    accept_delay_s=0.5,
    provision_delay_s=2.0,
    booking_s=120.0,
    pending_retry_s=5.0,
    scale_down_delay_s=2.0,
)


# ---------------------------------------------------------------- objects
def capacity_tsc(
    name: str,
    mode: str = "BestEffortAtomic",
    slices: int = 2,
    retry: dict[str, int] | None = None,
    **provisioning: Any,
) -> dict[str, Any]:
    body = tsc(name, type_="v6e", topology=TOPOLOGY, slices=slices)
    body["spec"]["tpu"]["chipsPerHost"] = 4
    prov: dict[str, Any] = {"mode": mode, **provisioning}
    prov["retry"] = retry or {"limit": 3, "baseBackoffSeconds": 2, "maxBackoffSeconds": 10}
    body["spec"]["reservation"] = {"provisioning": prov}
    return body


def requests(cluster: E2ECluster, namespace: str) -> dict[str, dict[str, Any]]:
    try:
        items = cluster.custom.list_namespaced_custom_object(PR_GROUP, "v1", namespace, PR_PLURAL)
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    return {o["metadata"]["name"]: o for o in items["items"]}


def templates(cluster: E2ECluster, namespace: str) -> list[str]:
    return [t.metadata.name for t in cluster.core.list_namespaced_pod_template(namespace).items]


def conditions_of(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (request.get("status") or {}).get("conditions") or []}


def shape_pools(cluster: E2ECluster) -> set[str]:
    selector = (
        f"cloud.google.com/gke-tpu-accelerator={ACCELERATOR},"
        f"cloud.google.com/gke-tpu-topology={TOPOLOGY}"
    )
    return {
        n.metadata.labels[NODEPOOL]
        for n in cluster.core.list_node(label_selector=selector).items
        if POOL_ANNOTATION in (n.metadata.annotations or {})
    }


def slices_of(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list((obj.get("status") or {}).get("slices") or [])


def wait_slices(
    cluster: E2ECluster,
    namespace: str,
    name: str,
    check: Any,
    what: str,
    timeout_s: float = WAIT_S,
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        obj = get_tsc(cluster, namespace, name)
        return obj if check(obj) else None

    return kube.wait_for(
        probe,
        timeout_s=timeout_s,
        what=f"{namespace}/{name}: {what}",
        describe=lambda: {
            **describe(cluster, namespace, name),
            "requests": {
                n: {k: (v["status"], v.get("reason")) for k, v in conditions_of(r).items()}
                for n, r in requests(cluster, namespace).items()
            },
        },
    )


def provisioned_at(request: dict[str, Any]) -> datetime | None:
    cond = conditions_of(request).get("Provisioned")
    if not cond or cond["status"] != "True":
        return None
    return datetime.fromisoformat(cond["lastTransitionTime"].replace("Z", "+00:00"))


def check_consumers(cluster: E2ECluster, namespace: str, name: str) -> dict[str, str]:
    """Every worker pod consumes exactly its own slice's request (both annotations);
    replica name -> request."""
    by_replica: dict[str, str] = {}
    for pod in slice_pods(cluster, namespace, name):
        labels = pod.metadata.labels or {}
        if labels.get("ray.io/node-type") != "worker":
            continue
        notes = pod.metadata.annotations or {}
        assert notes.get(CONSUME), f"{pod.metadata.name} has no {CONSUME}"
        assert notes.get(CLASS), f"{pod.metadata.name} has no {CLASS}"
        replica = labels["ray.io/worker-group-replica-name"]
        assert by_replica.setdefault(replica, notes[CONSUME]) == notes[CONSUME]
    assert len(set(by_replica.values())) == len(by_replica)
    return by_replica


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def fake(cluster: E2ECluster, operator: OperatorProcess) -> Iterator[FakeProvisioner]:
    """The fake provisioner, its CRD installed; the operator restarted once, so it lists
    requests at once (it looks for a CRD that was missing only every 30 s)."""
    provisioner = FakeProvisioner(cluster.api, ProvisionerSettings(timings=TIMINGS, interval_s=0.3))
    with provisioner:
        operator.stop()
        operator.start()
        yield provisioner
    try:
        cluster.core.delete_namespaced_config_map(CONFIG_MAP[1], CONFIG_MAP[0])
    except ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture
def capacity(
    cluster: E2ECluster, namespace: str, operator: OperatorProcess, fake: FakeProvisioner
) -> Iterator[FakeProvisioner]:
    """No pool of the shape when the test starts, no fault; at the end the test's
    clusters are deleted and nothing of capacity on demand is left in the namespace."""
    for leftover in shape_pools(cluster):
        kube.delete_pool(cluster.api, leftover)
    fake.configure()
    errors = len(fake.errors)
    yield fake
    if operator.proc is None or operator.proc.poll() is not None:
        operator.start()  # a test that killed it and failed before restarting it
    delete_all = ("delete", "tsc", "--all", "-n", namespace, "--wait=true", "--timeout=180s")
    kubectl(cluster, *delete_all, check=False)
    kube.wait_for(
        lambda: not requests(cluster, namespace) and not templates(cluster, namespace),
        timeout_s=120,
        what=f"no ProvisioningRequest or PodTemplate left in {namespace}",
        describe=lambda: (list(requests(cluster, namespace)), templates(cluster, namespace)),
    )
    kube.wait_for(
        lambda: not cluster.core.list_namespaced_pod(namespace).items,
        timeout_s=120,
        what=f"pods of {namespace} gone",
    )
    fake.configure()
    for name in shape_pools(cluster):
        kube.delete_pool(cluster.api, name)
    assert fake.errors[errors:] == []


def ready(obj: dict[str, Any]) -> bool:
    cond = condition(obj, "Ready")
    return cond.get("status") == "True" and cond.get("observedGeneration") == obj["metadata"].get(
        "generation"
    )


def states(obj: dict[str, Any]) -> list[str]:
    return [s["state"] for s in slices_of(obj)]


# ---------------------------------------------------------------- from zero pools
@pytest.mark.parametrize("mode", ["BestEffortAtomic", "QueuedProvisioning"])
def test_a_two_slice_gang_from_zero_pools_becomes_ready(
    cluster: E2ECluster, namespace: str, capacity: FakeProvisioner, mode: str
) -> None:
    """No pool of the shape exists: each slice asks for one, both pools come, the gang
    claims both, every pod is released with its own request's consume annotations and
    the cluster is Ready. The requests stay while the slices run."""
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, capacity_tsc("gang", mode))
        wait_slices(
            cluster,
            namespace,
            "gang",
            lambda o: len(requests(cluster, namespace)) == 2,
            "two ProvisioningRequests",
        )
        obj = wait_condition(cluster, namespace, "gang", "Ready", "True", timeout_s=WAIT_S)
        released = time.time()
    assert watch.violations == [], watch.violations
    made = requests(cluster, namespace)
    assert sorted(made) == ["gang-s0-1", "gang-s1-1"]
    for request in made.values():
        spec = request["spec"]
        assert len(spec["podSets"]) == 1 and spec["podSets"][0]["count"] == HOSTS
        at = provisioned_at(request)
        assert at is not None
        record(f"capacity {mode}: request Provisioned -> cluster Ready", released - at.timestamp())
    consumers = check_consumers(cluster, namespace, "gang")
    assert sorted(consumers.values()) == ["gang-s0-1", "gang-s1-1"]
    pools = set(held_by(cluster, namespace, "gang").values())
    assert len(pools) == 2 and pools <= set(capacity.pools())
    entries = slices_of(obj)
    assert [e["provisioning"]["attempt"] for e in entries] == [1, 1]
    if mode == "QueuedProvisioning":
        # each slice runs on the pool its own request names
        for entry in entries:
            named = conditions_of(made[entry["provisioning"]["request"]])
            details = made[entry["provisioning"]["request"]]["status"]["provisioningClassDetails"]
            assert entry["nodePool"] == details["NodePoolName"], (entry, named)
    reasons = event_reasons(cluster, namespace)
    assert {"ProvisioningRequested", "SliceReserved", "Ready"} <= reasons, reasons
