"""Capacity on demand end to end: the operator asks GKE for node pools.

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

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
from kubernetes.client import ApiException

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import (
    GangWatch,
    InvariantWatch,
    Sampler,
    apply,
    condition,
    describe,
    event_reasons,
    get_tsc,
    held_by,
    kubectl,
    record,
    released,
    shape_pools,
    slice_pods,
    tsc,
    wait_condition,
)
from tpusim import kube
from tpusim.nodepools import TPUPool
from tpusim.operator_process import OperatorProcess
from tpusim.provisioner import (
    CONFIG_MAP,
    AutoscaledPool,
    FakeProvisioner,
    ProvisionerSettings,
    install_crd,
    uninstall_crd,
)
from tpusim.provreq import GROUP as PR_GROUP
from tpusim.provreq import NODEPOOL_LABEL, Fault, FaultRule, Timings
from tpusim.provreq import PLURAL as PR_PLURAL

TOPOLOGY, HOSTS = "2x4", 2  # v6e 2x4 on 4-chip hosts (shape_pools' default)
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
        # a single-host worker has no replica label: its slice is the pod itself
        replica = labels.get("ray.io/worker-group-replica-name") or pod.metadata.name
        assert by_replica.setdefault(replica, notes[CONSUME]) == notes[CONSUME]
    assert len(set(by_replica.values())) == len(by_replica)
    return by_replica


@dataclass
class ReleaseClock(Sampler):
    """Samples requests and pods every ``interval_s``: when each request was first seen
    Provisioned, and when each slice's pods were first all released (ungated) and all
    bound. Timestamps have the sampling's resolution (plus one list's latency), not the
    1 s of the API's condition times."""

    cluster: E2ECluster
    namespace: str
    interval_s: float = 0.1
    provisioned: dict[str, float] = field(default_factory=dict)  # request -> first seen
    released: dict[str, float] = field(default_factory=dict)  # request -> pods ungated
    bound: dict[str, float] = field(default_factory=dict)  # request -> pods bound

    def tick(self) -> None:
        with contextlib.suppress(Exception):  # a list during a restart; sample again
            self._sample()

    def _sample(self) -> None:
        now = time.monotonic()
        for name, req in requests(self.cluster, self.namespace).items():
            if provisioned_at(req) is not None:
                self.provisioned.setdefault(name, now)
        by_request: dict[str, list[Any]] = {}
        for pod in self.cluster.core.list_namespaced_pod(
            self.namespace, label_selector="ray.io/node-type=worker"
        ).items:
            consumed = (pod.metadata.annotations or {}).get(CONSUME)
            if consumed:
                by_request.setdefault(consumed, []).append(pod)
        for name, members in by_request.items():
            if len(members) < HOSTS:
                continue
            if all(released(p) for p in members):
                self.released.setdefault(name, now)
            if all(p.spec.node_name for p in members):
                self.bound.setdefault(name, now)


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
    with (
        InvariantWatch(cluster, namespace) as watch,
        GangWatch(cluster, namespace) as gangs,
        ReleaseClock(cluster, namespace) as clock,
    ):
        apply(cluster, namespace, capacity_tsc("gang", mode))
        wait_slices(
            cluster,
            namespace,
            "gang",
            lambda o: len(requests(cluster, namespace)) == 2,
            "two ProvisioningRequests",
        )
        obj = wait_condition(cluster, namespace, "gang", "Ready", "True", timeout_s=WAIT_S)
        ready_seen = time.time()
    watch.check()
    gangs.check(min_samples=5)
    made = requests(cluster, namespace)
    assert sorted(made) == ["gang-s0-1", "gang-s1-1"]
    consumers = check_consumers(cluster, namespace, "gang")
    assert sorted(consumers.values()) == ["gang-s0-1", "gang-s1-1"]
    for name in consumers.values():
        spec = made[name]["spec"]
        assert len(spec["podSets"]) == 1 and spec["podSets"][0]["count"] == HOSTS
        at = provisioned_at(made[name])
        assert at is not None
        # sampled every 0.1 s: request first seen Provisioned -> its slice's pods all
        # released (ungated, consume annotations on) and all bound to nodes
        if name in clock.provisioned and name in clock.released:
            record(
                f"capacity {mode}: Provisioned seen -> slice released",
                clock.released[name] - clock.provisioned[name],
            )
        if name in clock.provisioned and name in clock.bound:
            record(
                f"capacity {mode}: Provisioned seen -> slice bound",
                clock.bound[name] - clock.provisioned[name],
            )
        record(f"capacity {mode}: Provisioned -> cluster Ready seen", ready_seen - at.timestamp())
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


# ---------------------------------------------------------------- existing pools first
def add_pool(cluster: E2ECluster, name: str) -> None:
    pool = TPUPool(name, "v6e", TOPOLOGY, nodes=HOSTS)
    kube.wait_nodes_ready(cluster.api, kube.create_pool(cluster.api, pool))


def test_an_existing_pool_is_taken_without_asking(
    cluster: E2ECluster, namespace: str, capacity: FakeProvisioner
) -> None:
    """A free pool of the shape exists: the slice takes it and no request is ever made."""
    add_pool(cluster, "v6e-2x4-have")
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, capacity_tsc("have", slices=1))
        obj = wait_condition(cluster, namespace, "have", "Ready", "True", timeout_s=WAIT_S)
        # fast (a second): watch the Ready state long enough for a finding to persist
        kube.wait_for(lambda: watch.samples > watch.persist, timeout_s=30, what="samples")
    watch.check()
    assert held_by(cluster, namespace, "have") == {slices_of(obj)[0]["replica"]: "v6e-2x4-have"}
    assert requests(cluster, namespace) == {}
    assert "ProvisioningRequested" not in event_reasons(cluster, namespace)
    assert "provisioning" not in slices_of(obj)[0]


def test_a_pool_appearing_while_a_request_waits_wins_and_the_request_is_deleted(
    cluster: E2ECluster, namespace: str, capacity: FakeProvisioner
) -> None:
    """The autoscaler never provisions; someone adds a pool: the slice takes it (existing
    pools first) and its request is deleted."""
    capacity.configure(faults=[FaultRule(Fault("never"), namespace=namespace)])
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, capacity_tsc("late", slices=1))
        waiting = wait_slices(
            cluster,
            namespace,
            "late",
            lambda o: states(o) == ["Provisioning"] and len(requests(cluster, namespace)) == 1,
            "slice Provisioning with its request",
        )
        assert "late-s0-1" in slices_of(waiting)[0]["message"], slices_of(waiting)
        add_pool(cluster, "v6e-2x4-late")
        wait_condition(cluster, namespace, "late", "Ready", "True", timeout_s=WAIT_S)
        kube.wait_for(
            lambda: not requests(cluster, namespace),
            timeout_s=60,
            what="the waiting request deleted",
        )
    watch.check()
    assert set(held_by(cluster, namespace, "late").values()) == {"v6e-2x4-late"}
    assert "ProvisioningRequestDeleted" in event_reasons(cluster, namespace)


def test_a_gang_asks_only_for_the_pools_it_lacks(
    cluster: E2ECluster, namespace: str, capacity: FakeProvisioner
) -> None:
    """One free pool and a gang of two: one slice is left to the existing pool, only the
    other asks; the gang claims both pools at once when the second comes."""
    add_pool(cluster, "v6e-2x4-one")
    with InvariantWatch(cluster, namespace) as watch, GangWatch(cluster, namespace) as gangs:
        apply(cluster, namespace, capacity_tsc("mixed"))
        obj = wait_condition(cluster, namespace, "mixed", "Ready", "True", timeout_s=WAIT_S)
    watch.check()
    gangs.check(min_samples=5)  # the existing pool is not held alone while the other is provisioned
    made = requests(cluster, namespace)
    assert list(made) == ["mixed-s1-1"], list(made)
    pools = set(held_by(cluster, namespace, "mixed").values())
    assert "v6e-2x4-one" in pools and len(pools) == 2
    assert [bool(s.get("provisioning")) for s in slices_of(obj)] == [False, True]


# ---------------------------------------------------------------- failures
def test_a_failed_request_is_retried_after_backoff(
    cluster: E2ECluster, namespace: str, capacity: FakeProvisioner
) -> None:
    """Failed (a stock-out, not a configuration error): the next attempt after the
    backoff, counted in status.slices[].provisioning; then Ready."""
    capacity.configure(
        faults=[
            FaultRule(Fault("fail", reason="ResourcePoolExhausted"), namespace=namespace, times=1)
        ]
    )
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, capacity_tsc("retry", slices=1))
        obj = wait_condition(cluster, namespace, "retry", "Ready", "True", timeout_s=WAIT_S)
    watch.check()
    assert list(requests(cluster, namespace)) == ["retry-s0-2"]
    assert slices_of(obj)[0]["provisioning"] == {
        "request": "retry-s0-2",
        "attempt": 2,
        "failures": 1,
    }
    assert "ProvisioningRetry" in event_reasons(cluster, namespace)


def test_a_spent_retry_limit_stalls_until_the_limit_is_raised(
    cluster: E2ECluster, namespace: str, capacity: FakeProvisioner
) -> None:
    """Two stock-outs with retry.limit 1: the retry fails too, so the slice is Stalled
    (ProvisioningFailed, "retry limit 1 spent") and asks no more; raising the limit is a
    spec change that makes the third attempt, which provisions."""
    stockout = Fault("fail", reason="ResourcePoolExhausted")
    capacity.configure(faults=[FaultRule(stockout, namespace=namespace, times=2)])
    body = capacity_tsc(
        "spent", slices=1, retry={"limit": 1, "baseBackoffSeconds": 1, "maxBackoffSeconds": 2}
    )
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, body)
        stalled = wait_condition(
            cluster, namespace, "spent", "Stalled", "True", "ProvisioningFailed", timeout_s=WAIT_S
        )
        assert "retry.limit 1 spent" in condition(stalled, "Stalled")["message"]
        # stalled means stalled: no third request while the limit stays spent
        kube.wait_for(
            lambda: list(requests(cluster, namespace)) == ["spent-s0-2"],
            timeout_s=30,
            what="only the spent attempt's request left",
        )
        time.sleep(5)  # more than twice the backoff: a retry would have been made
        assert list(requests(cluster, namespace)) == ["spent-s0-2"]
        body["spec"]["reservation"]["provisioning"]["retry"]["limit"] = 3
        apply(cluster, namespace, body)
        obj = wait_condition(cluster, namespace, "spent", "Ready", "True", timeout_s=WAIT_S)
    watch.check()
    assert condition(obj, "Stalled")["status"] == "False"
    assert slices_of(obj)[0]["provisioning"] == {
        "request": "spent-s0-3",
        "attempt": 3,
        "failures": 2,
    }
    assert list(requests(cluster, namespace)) == ["spent-s0-3"]


def test_a_configuration_error_stalls_and_recovers_once_fixed(
    cluster: E2ECluster, namespace: str, capacity: FakeProvisioner
) -> None:
    """GKE refuses the request as configured (no queued-provisioning pool): Stalled with
    the autoscaler's message, the retry limit not spent; tried again every
    maxBackoffSeconds, so once GKE accepts (the fault used up) the slice comes."""
    refusal = Fault(
        "fail",
        reason="NoQueuedNodepoolAvailable",
        message="No nodepool with QueuedProvisioning enabled is available for scale up",
        at="validate",
    )
    capacity.configure(faults=[FaultRule(refusal, namespace=namespace, times=1)])
    body = capacity_tsc(
        "config",
        "QueuedProvisioning",
        slices=1,
        retry={"limit": 1, "baseBackoffSeconds": 1, "maxBackoffSeconds": 20},
    )
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, body)
        stalled = wait_condition(
            cluster, namespace, "config", "Stalled", "True", "ProvisioningFailed", timeout_s=WAIT_S
        )
        assert "NoQueuedNodepoolAvailable" in condition(stalled, "Stalled")["message"]
        obj = wait_condition(cluster, namespace, "config", "Ready", "True", timeout_s=WAIT_S)
    watch.check()
    assert condition(obj, "Stalled")["status"] == "False"
    assert slices_of(obj)[0]["provisioning"]["attempt"] == 2
    assert slices_of(obj)[0]["provisioning"]["failures"] == 0  # not counted against the limit


def test_booking_expired_before_the_slice_is_bound_asks_again(
    cluster: E2ECluster, namespace: str, capacity: FakeProvisioner
) -> None:
    """The pool comes with a NotReady node, so it never becomes eligible and the
    booking lapses: the slice asks again (a failure) and runs on the next pool."""
    capacity.configure(
        faults=[FaultRule(Fault("not-ready-node"), namespace=namespace, times=1)],
        bookingSeconds=8,
    )
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, capacity_tsc("expire", "QueuedProvisioning", slices=1))
        obj = wait_condition(cluster, namespace, "expire", "Ready", "True", timeout_s=WAIT_S)
    watch.check()
    entry = slices_of(obj)[0]
    assert entry["provisioning"]["attempt"] == 2 and entry["provisioning"]["failures"] == 1
    assert "ProvisioningRetry" in event_reasons(
        cluster, namespace
    )  # "expire-s0-1 lapsed (BookingExpired ...)"
    second = requests(cluster, namespace)["expire-s0-2"]
    assert entry["nodePool"] == second["status"]["provisioningClassDetails"]["NodePoolName"]


def test_revoked_capacity_replaces_the_slice_which_asks_again(
    cluster: E2ECluster, namespace: str, capacity: FakeProvisioner
) -> None:
    """GKE takes the VMs back under a running slice (CapacityRevoked): the slice is
    replaced (KubeRay makes a new replica), which asks again and runs on a new pool."""
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, capacity_tsc("revoke", "QueuedProvisioning", slices=1))
        first = wait_condition(cluster, namespace, "revoke", "Ready", "True", timeout_s=WAIT_S)
        before = slices_of(first)[0]
        capacity.revoke(namespace, before["provisioning"]["request"])
        obj = wait_slices(
            cluster,
            namespace,
            "revoke",
            lambda o: (
                ready(o)
                and slices_of(o)[0].get("replica") != before["replica"]
                and slices_of(o)[0].get("nodePool") not in (None, before["nodePool"])
            ),
            "Ready again on a new replica and pool",
        )
    watch.check()
    after = slices_of(obj)[0]
    assert after["provisioning"]["attempt"] == 2
    assert list(requests(cluster, namespace)) == [after["provisioning"]["request"]]
    assert "CapacityRevoked" in event_reasons(cluster, namespace)


def test_a_request_deleted_by_someone_is_recreated(
    cluster: E2ECluster, namespace: str, capacity: FakeProvisioner
) -> None:
    """Someone deletes the request of a slice that holds no pool: the next attempt is
    made (the count goes on from status), and the slice comes."""
    capacity.configure(faults=[FaultRule(Fault("never"), namespace=namespace, times=1)])
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, capacity_tsc("gone", slices=1))
        # seen by the fake GKE (its fault chosen) before it is deleted: deleted sooner,
        # the fault would go to the next request, which would then never provision
        kube.wait_for(
            lambda: bool(conditions_of(requests(cluster, namespace).get("gone-s0-1") or {})),
            timeout_s=WAIT_S,
            what="the first request, accepted by the fake GKE",
        )
        kubectl(
            cluster,
            "delete",
            "provisioningrequests.autoscaling.x-k8s.io",
            "-n",
            namespace,
            "gone-s0-1",
            "--wait=true",
        )
        obj = wait_condition(cluster, namespace, "gone", "Ready", "True", timeout_s=WAIT_S)
    watch.check()
    assert list(requests(cluster, namespace)) == ["gone-s0-2"]
    assert slices_of(obj)[0]["provisioning"]["attempt"] == 2


def test_operator_sigkilled_while_requests_wait(
    cluster: E2ECluster, namespace: str, capacity: FakeProvisioner, operator: OperatorProcess
) -> None:
    """SIGKILL while both requests of a gang wait; the capacity comes while no operator
    runs; the restarted operator goes on from the API server alone: the same requests
    (no second attempt), the gang Ready, nothing released early."""
    capacity.configure(provisionDelaySeconds=15)
    with InvariantWatch(cluster, namespace) as watch, GangWatch(cluster, namespace) as gangs:
        apply(cluster, namespace, capacity_tsc("crash", "QueuedProvisioning"))
        kube.wait_for(
            lambda: len(requests(cluster, namespace)) == 2,
            timeout_s=WAIT_S,
            what="both requests",
        )
        operator.kill()
        kube.wait_for(
            lambda: (
                all(provisioned_at(r) for r in requests(cluster, namespace).values())
                and len(shape_pools(cluster)) == 2
            ),
            timeout_s=WAIT_S,
            what="both provisioned while the operator is down",
        )
        operator.start()
        obj = wait_condition(cluster, namespace, "crash", "Ready", "True", timeout_s=WAIT_S)
    watch.check()
    gangs.check(
        max_partial_s=None, min_samples=5
    )  # a killed operator may leave a partial set a while
    assert sorted(requests(cluster, namespace)) == ["crash-s0-1", "crash-s1-1"]
    assert [s["provisioning"]["attempt"] for s in slices_of(obj)] == [1, 1]
    check_consumers(cluster, namespace, "crash")


def test_scaling_down_deletes_the_request_of_the_removed_slice(
    cluster: E2ECluster, namespace: str, capacity: FakeProvisioner
) -> None:
    """Two PerSlice slices on requested capacity, then one: the removed slice's request
    goes with its pool; the other keeps its own."""
    body = capacity_tsc("shrink")
    body["spec"]["reservation"]["gang"] = "PerSlice"
    with InvariantWatch(cluster, namespace) as watch:
        apply(cluster, namespace, body)
        wait_condition(cluster, namespace, "shrink", "Ready", "True", timeout_s=WAIT_S)
        body["spec"]["tpu"]["slices"] = 1
        apply(cluster, namespace, body)
        obj = wait_slices(
            cluster,
            namespace,
            "shrink",
            lambda o: (
                ready(o) and len(slices_of(o)) == 1 and len(requests(cluster, namespace)) == 1
            ),
            "one slice, one request",
        )
    watch.check()
    assert list(requests(cluster, namespace)) == [slices_of(obj)[0]["provisioning"]["request"]]


def test_a_missing_crd_stalls_and_recovers_by_itself(
    cluster: E2ECluster, namespace: str, capacity: FakeProvisioner
) -> None:
    """No ProvisioningRequest CRD: Stalled ProvisioningRequestNotInstalled; once it is
    installed the operator finds it by itself and the slice comes. (Last: it deletes
    the CRD, and every request with it.)"""
    capacity.stop()
    try:
        uninstall_crd(cluster.api)
        apply(cluster, namespace, capacity_tsc("nocrd", slices=1))
        wait_condition(
            cluster,
            namespace,
            "nocrd",
            "Stalled",
            "True",
            "ProvisioningRequestNotInstalled",
            timeout_s=WAIT_S,
        )
        assert templates(cluster, namespace) == []
    finally:
        capacity.start()  # installs the CRD again
    with InvariantWatch(cluster, namespace) as watch:
        obj = wait_condition(cluster, namespace, "nocrd", "Ready", "True", timeout_s=WAIT_S)
    watch.check()
    assert condition(obj, "Stalled")["status"] == "False"
    install_crd(cluster.api)


# ---------------------------------------------------------------- single-host: a node per slice
GROWN = ("v6e-2x2-grown", "v6e-2x2-grown-b")  # single-host pools declared with no nodes


def grown_nodes(cluster: E2ECluster) -> dict[str, Any]:
    return {
        n.metadata.name: n
        for pool in GROWN
        for n in cluster.core.list_node(label_selector=f"{NODEPOOL_LABEL}={pool}").items
    }


@pytest.mark.parametrize("mode", ["BestEffortAtomic", "QueuedProvisioning"])
def test_a_single_host_pool_grown_from_zero_serves_its_slices(
    cluster: E2ECluster, namespace: str, capacity: FakeProvisioner, mode: str
) -> None:
    """A single-host pool as GKE makes it, autoscaled from zero nodes: each waiting slice
    asks for one node (count 1), the fake grows that existing pool node by node, and each
    slice claims one of the new nodes (a SliceReservation per node) and is released onto
    it with its own request's consume annotations; no slice takes another's node.
    Best-effort: a two-slice gang, both nodes added to the one pool. Queued: one slice,
    its node in the pool its request names (GKE grows a queued pool for one request at a
    time)."""
    queued = mode == "QueuedProvisioning"
    declared = GROWN[:1]
    capacity.configure(
        autoscaled_pools=[
            AutoscaledPool(name, "v6e", "2x2", max_nodes=3, queued=queued) for name in declared
        ]
    )
    # GKE labels a queued pool with one request at a time (capacity-facts.md §2), so one
    # queued slice; a gang of queued single-host slices waits on it (README)
    slices = 1 if queued else 2
    body = capacity_tsc("small", mode, slices=slices)
    body["spec"]["tpu"]["topology"] = "2x2"
    try:
        with InvariantWatch(cluster, namespace) as watch:
            apply(cluster, namespace, body)
            obj = wait_condition(cluster, namespace, "small", "Ready", "True", timeout_s=WAIT_S)
        watch.check()
        made = requests(cluster, namespace)
        asked = [f"small-s{i}-1" for i in range(slices)]
        assert sorted(made) == asked
        assert all(r["spec"]["podSets"][0]["count"] == 1 for r in made.values())
        nodes = grown_nodes(cluster)
        held = slices_of(obj)
        assert len(nodes) == slices, sorted(nodes)  # grown by exactly the slices' nodes
        assert {e["node"] for e in held} == set(nodes)
        assert {e["nodePool"] for e in held} == set(declared)
        consumers = check_consumers(cluster, namespace, "small")
        assert sorted(consumers.values()) == asked
        if queued:
            for entry in held:
                status = made[entry["provisioning"]["request"]]["status"]
                assert status["provisioningClassDetails"]["NodePoolName"] == entry["nodePool"]
        else:
            # never the node-pool NotIn of a multi-host slice, which would keep the
            # autoscaler off the pool it must grow (from zero there is nothing to exclude)
            for name in made:
                template = cluster.core.read_namespaced_pod_template(name, namespace)
                affinity = template.template.spec.affinity
                assert NODEPOOL_LABEL not in str(affinity), affinity
    finally:
        kubectl(cluster, "delete", "tsc", "small", "-n", namespace, "--wait=true", check=False)
        capacity.configure(autoscaled_pools=[])
        for name in grown_nodes(cluster):
            kube.delete_node(cluster.api, name)
