"""The operator with a real Kueue: Kueue admits, the operator places.

One cluster with ``ClusterSettings(kueue=True)`` and one operator for the module (it
runs right after test_kueue_harness.py, before the session cluster starts; conftest
orders it). The ClusterQueue ``tpu`` has the chips of one v6e 4x4 slice; there are
two such pools, so a second queued object waits for Kueue's quota, never for a pool.

What it shows, in order: a queued TPUSliceCluster is admitted and claims a pool; a
second one is created suspended with Kueue's label, claims nothing and says
AwaitingAdmission; an edit of it is applied and it stays suspended; once the quota
is free Kueue admits it, Kueue's field manager owns ``spec.suspend`` and an edit never
suspends it again; in a namespace with a LocalQueue named ``default`` an object that
names no queue is held by Kueue and says so; a Kueue topology annotation on the TPU
workers below the node-pool level is refused naming the field. Then: the status says when Kueue's
WaitForPodsReady evicts, and the eviction gives the pool back; a job is placed; an
admission gate holds Kueue until the pools are free; an elastic scale-up waits for
Kueue's gate; with topology-aware scheduling at the node-pool level Kueue chooses each
slice's pool and the operator holds exactly that one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import (
    apply,
    condition,
    describe,
    event_reasons,
    get_tsc,
    held_by,
    kubectl,
    slice_pods,
    tsc,
    wait_condition,
)
from tpusim import ClusterSettings, CPUPool, LocalCluster, ToolPaths, TPUPool, autoscaler, kube
from tpusim.kueue import (
    QUEUE_LABEL,
    KueueConfig,
    create_queues,
    create_tas_queues,
    local_queue,
    pool_tpu_chips,
)
from tpusim.operator_process import OperatorProcess

REPO = Path(__file__).resolve().parents[2]
#: Kueue's topology-aware scheduling gets pools of its own shape (v5p 2x2x2, two hosts of
#: four chips), so the v6e 4x4 tests never see them: three pools for a two-slice object,
#: so Kueue's choice is a real choice.
TAS_POOLS = tuple(TPUPool(f"v5p-2x2x2-tas-{x}", "v5p", "2x2x2", nodes=2) for x in "abc")
POOLS: tuple[TPUPool | CPUPool, ...] = (
    TPUPool("v6e-4x4-kq-a", "v6e", "4x4", nodes=4),
    TPUPool("v6e-4x4-kq-b", "v6e", "4x4", nodes=4),
    CPUPool("cpu-kq", nodes=1),
    *TAS_POOLS,
)
NODEPOOL = "cloud.google.com/gke-nodepool"
QUEUED = "kueue-op"  # a LocalQueue tpu
DEFAULTED = "kueue-default"  # a LocalQueue named default
ONE_SLICE_CHIPS = 16
#: Kueue's WaitForPodsReady timeout: short, so the eviction test sees one; long enough for
#: an admitted object whose pools are free to be Ready well within it.
PODS_READY_TIMEOUT_S = 45
MANAGER = "tpuslice-operator"
HASH = "tpuslice.dev/applied-hash"


@pytest.fixture(scope="module")
def kueue_operator() -> Iterator[E2ECluster]:
    run_dir = REPO / ".e2e-runs" / datetime.now().strftime("kueue-op-%Y%m%d-%H%M%S-%f")
    local = LocalCluster(
        ClusterSettings(
            tools=ToolPaths.for_repo(REPO),
            run_dir=run_dir,
            kueue=True,
            kueue_config=KueueConfig(
                pods_ready_timeout_s=PODS_READY_TIMEOUT_S,
                feature_gates={"AdmissionGatedBy": True, "ElasticJobsViaWorkloadSlices": True},
            ),
        )
    )
    proc: OperatorProcess | None = None
    try:
        local.start()
        local.add_pools(POOLS)
        core = kube.core_v1(local.api)
        for name in (QUEUED, DEFAULTED):
            core.create_namespace({"metadata": {"name": name}})
        create_queues(local.api, namespaces=[QUEUED], tpu_chips=ONE_SLICE_CHIPS)
        create_queues(local.api, namespaces=[QUEUED], tpu_chips=2 * ONE_SLICE_CHIPS, name="big")
        create_tas_queues(
            local.api,
            namespaces=[QUEUED],
            tpu_chips=pool_tpu_chips(TAS_POOLS),
            node_labels={
                "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
                "cloud.google.com/gke-tpu-topology": "2x2x2",
            },
        )
        cluster = E2ECluster(kubeconfig=local.kubeconfig, api=local.api, run_dir=run_dir)
        cluster.custom.create_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", DEFAULTED, "localqueues",
            local_queue(DEFAULTED, "default", "tpu"),
        )  # fmt: skip
        _install_crds(cluster)
        proc = OperatorProcess(
            local.kubeconfig,
            run_dir / "logs" / "operator.log",
            extra_args=(
                "--resync-seconds=10",
                f"--kueue-pods-ready-timeout={PODS_READY_TIMEOUT_S}",
            ),
            cwd=REPO,
        )
        proc.start()
        yield cluster
    finally:
        if proc is not None:
            proc.stop()
        local.stop()


def _install_crds(cluster: E2ECluster) -> None:
    crds = sorted(str(p) for p in (REPO / "crds").glob("*.yaml"))
    files = [arg for path in crds for arg in ("-f", path)]
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", *files)
    kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s", *files)


def _raycluster(cluster: E2ECluster, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
            "ray.io", "v1", namespace, "rayclusters", name
        )
    except Exception:  # not there yet
        return None
    return found


def _suspend_owners(raycluster: dict[str, Any]) -> list[str]:
    """The field managers (manager/operation) owning the RayCluster's spec.suspend."""
    return [
        f"{entry['manager']}/{entry['operation']}"
        for entry in raycluster["metadata"].get("managedFields") or []
        if "f:suspend" in ((entry.get("fieldsV1") or {}).get("f:spec") or {})
    ]


def _edit_head(cluster: E2ECluster, namespace: str, name: str, cpus: str) -> str:
    """Change the head's rayStartParams (a field Kueue's pod sets do not include) and wait
    for the RayCluster applied from it; return its applied hash."""
    before = (_raycluster(cluster, namespace, name) or {})["metadata"]["annotations"][HASH]
    patch = json.dumps({"spec": {"head": {"rayStartParams": {"num-cpus": cpus}}}})
    kubectl(cluster, "patch", "tsc", "-n", namespace, name, "--type=merge", "-p", patch)

    def applied() -> str | None:
        rc = _raycluster(cluster, namespace, name) or {}
        digest = str(rc["metadata"]["annotations"][HASH])
        params = rc["spec"]["headGroupSpec"].get("rayStartParams") or {}
        return digest if digest != before and params.get("num-cpus") == cpus else None

    return kube.wait_for(applied, timeout_s=60, what=f"{namespace}/{name} edit applied")


def _no_claim_for(cluster: E2ECluster, namespace: str, name: str, seconds: float) -> None:
    """For ``seconds``: no reservation names the object and none of its pods is released."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert held_by(cluster, namespace, name) == {}, describe(cluster, namespace, name)
        for pod in slice_pods(cluster, namespace, name):
            gates = [g.name for g in pod.spec.scheduling_gates or []]
            assert "tpuslice.dev/slice-reservation" in gates, pod.metadata.name
        time.sleep(1)


def test_kueue_admits_and_the_operator_places(kueue_operator: E2ECluster) -> None:
    cluster = kueue_operator
    record: dict[str, Any] = {}
    began = time.monotonic()

    # b: admitted (the quota is free) and placed
    apply(cluster, QUEUED, tsc("b", kueue={"queueName": "tpu"}))
    wait_condition(cluster, QUEUED, "b", "KueueAdmitted", "True", "Admitted", timeout_s=120)
    wait_condition(cluster, QUEUED, "b", "Ready", "True", timeout_s=180)
    assert len(held_by(cluster, QUEUED, "b")) == 1
    record["b_ready_s"] = round(time.monotonic() - began, 2)

    # a: the quota is b's; created suspended with Kueue's label, claims nothing
    apply(cluster, QUEUED, tsc("a", kueue={"queueName": "tpu"}))
    held = wait_condition(
        cluster, QUEUED, "a", "KueueAdmitted", "False", "AwaitingAdmission", timeout_s=60
    )
    rc = _raycluster(cluster, QUEUED, "a")
    assert rc is not None and rc["spec"]["suspend"] is True
    assert rc["metadata"]["labels"][QUEUE_LABEL] == "tpu"
    assert [s["state"] for s in held["status"]["slices"]] == ["AwaitingAdmission"]
    assert condition(held, "Ready")["reason"] == "AwaitingAdmission"
    record["a_suspend_owners_at_create"] = _suspend_owners(rc)
    _no_claim_for(cluster, QUEUED, "a", seconds=5)

    # an edit of a while Kueue holds it is applied and leaves it suspended
    _edit_head(cluster, QUEUED, "a", "1")
    time.sleep(3)  # any later apply (or KubeRay acting on an unsuspended cluster) shows
    rc = _raycluster(cluster, QUEUED, "a")
    assert rc is not None and rc["spec"]["suspend"] is True
    record["a_suspend_owners_after_edit"] = _suspend_owners(rc)
    _no_claim_for(cluster, QUEUED, "a", seconds=3)

    # the quota comes free: Kueue admits a, the operator claims for it
    kubectl(cluster, "delete", "tsc", "-n", QUEUED, "b", "--wait=true", "--timeout=90s")
    mark = time.monotonic()
    wait_condition(cluster, QUEUED, "a", "KueueAdmitted", "True", "Admitted", timeout_s=120)
    wait_condition(cluster, QUEUED, "a", "Ready", "True", timeout_s=180)
    assert len(held_by(cluster, QUEUED, "a")) == 1
    record["a_ready_after_b_deleted_s"] = round(time.monotonic() - mark, 2)
    rc = _raycluster(cluster, QUEUED, "a")
    assert rc is not None and rc["spec"]["suspend"] is False
    owners = _suspend_owners(rc)
    record["a_suspend_owners_admitted"] = owners
    assert owners and not any(o.startswith(f"{MANAGER}/") for o in owners), owners

    # an edit of the admitted object never suspends it again
    _edit_head(cluster, QUEUED, "a", "2")
    time.sleep(3)
    rc = _raycluster(cluster, QUEUED, "a")
    assert rc is not None and rc["spec"]["suspend"] is False
    assert not any(o.startswith(f"{MANAGER}/") for o in _suspend_owners(rc))
    assert condition(get_tsc(cluster, QUEUED, "a"), "Ready")["status"] == "True"

    # the namespace's default LocalQueue: Kueue takes an object that names no queue
    apply(cluster, DEFAULTED, tsc("c"))
    defaulted = wait_condition(
        cluster, DEFAULTED, "c", "KueueAdmitted", "False", "DefaultLocalQueue", timeout_s=60
    )
    assert "default LocalQueue default" in condition(defaulted, "KueueAdmitted")["message"]
    rc = _raycluster(cluster, DEFAULTED, "c")
    assert rc is not None and rc["metadata"]["labels"][QUEUE_LABEL] == "default"
    record["c_suspend_owners_defaulted"] = _suspend_owners(rc)
    kube.wait_for(
        lambda: "KueueDefaultLocalQueue" in event_reasons(cluster, DEFAULTED),
        timeout_s=30,
        what="the KueueDefaultLocalQueue event",
    )
    _no_claim_for(cluster, DEFAULTED, "c", seconds=5)
    rc = _raycluster(cluster, DEFAULTED, "c")
    assert rc is not None and rc["spec"]["suspend"] is True  # the operator never resumed it
    kubectl(cluster, "delete", "tsc", "-n", QUEUED, "a", "--wait=true", "--timeout=90s")
    wait_condition(cluster, DEFAULTED, "c", "KueueAdmitted", "True", "Admitted", timeout_s=120)
    wait_condition(cluster, DEFAULTED, "c", "Ready", "True", timeout_s=180)

    # a Kueue topology annotation on the TPU workers below the node-pool level is
    # refused, naming the field (the node-pool level is adopted: the TAS test below)
    annotated = tsc(
        "d",
        kueue={"queueName": "tpu"},
        worker={
            "resources": {"cpu": "4", "memory": "16Gi"},
            "template": {
                "metadata": {
                    "annotations": {
                        "kueue.x-k8s.io/podset-required-topology": "kubernetes.io/hostname"
                    }
                }
            },
        },
    )
    apply(cluster, QUEUED, annotated)
    stalled = wait_condition(cluster, QUEUED, "d", "Stalled", "True", "InvalidSpec", timeout_s=60)
    assert "kueue.x-k8s.io/podset-required-topology" in condition(stalled, "Stalled")["message"]
    assert _raycluster(cluster, QUEUED, "d") is None

    assert cluster.run_dir is not None
    (cluster.run_dir / "kueue-operator.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


def test_a_wait_for_pods_ready_eviction_gives_the_pools_back(kueue_operator: E2ECluster) -> None:
    """After the test above c (the default LocalQueue's) holds one pool. e asks for two
    slices, each on its own (PerSlice), through a ClusterQueue with quota for both: Kueue
    admits it, one slice claims the free pool and runs, the other finds none, so e's pods
    are not all ready within Kueue's timeout. Kueue evicts e: its pool is given back, and
    its status and an event carry Kueue's reason."""
    cluster = kueue_operator
    assert len(held_by(cluster, DEFAULTED, "c")) == 1
    apply(
        cluster,
        QUEUED,
        tsc("e", slices=2, kueue={"queueName": "big"}, reservation={"gang": "PerSlice"}),
    )
    wait_condition(cluster, QUEUED, "e", "KueueAdmitted", "True", "Admitted", timeout_s=60)
    kube.wait_for(
        lambda: len(held_by(cluster, QUEUED, "e")) == 1,
        timeout_s=60,
        what="e holds the free pool for one slice",
        describe=lambda: describe(cluster, QUEUED, "e"),
    )
    # admitted with a slice waiting: the status says when Kueue evicts it
    deadline = kube.wait_for(
        lambda: (
            "Kueue evicts at"
            in condition(get_tsc(cluster, QUEUED, "e"), "KueueAdmitted").get("message", "")
        ),
        timeout_s=30,
        what="e's KueueAdmitted says when Kueue evicts it",
        describe=lambda: describe(cluster, QUEUED, "e"),
    )
    assert deadline
    admitted = condition(get_tsc(cluster, QUEUED, "e"), "KueueAdmitted")["message"]
    assert f"waitForPodsReady timeout {PODS_READY_TIMEOUT_S}s" in admitted, admitted
    waiting = [
        s for s in get_tsc(cluster, QUEUED, "e")["status"]["slices"] if not s.get("nodePool")
    ]
    assert waiting and all("Kueue evicts at" in s["message"] for s in waiting), waiting
    mark = time.monotonic()
    evicted = wait_condition(
        cluster,
        QUEUED,
        "e",
        "KueueAdmitted",
        "False",
        "Evicted",
        timeout_s=PODS_READY_TIMEOUT_S + 90,
    )
    message = condition(evicted, "KueueAdmitted")["message"]
    assert "PodsReadyTimeout" in message, message
    kube.wait_for(
        lambda: held_by(cluster, QUEUED, "e") == {},
        timeout_s=90,
        what="e's pool given back after Kueue's eviction",
        describe=lambda: describe(cluster, QUEUED, "e"),
    )
    assert "KueueEvicted" in event_reasons(cluster, QUEUED)
    assert cluster.run_dir is not None
    (cluster.run_dir / "kueue-eviction.json").write_text(
        json.dumps({"evicted_after_s": round(time.monotonic() - mark, 2), "message": message})
        + "\n"
    )


def test_a_job_kueue_admits_is_placed_and_its_cluster_is_not_queued_twice(
    kueue_operator: E2ECluster,
) -> None:
    """A TPUSliceJob through ClusterQueue big: Kueue admits the RayJob; the RayCluster
    KubeRay makes for it carries the copied queue label but is not a second Workload
    (Kueue skips a job whose ancestor it manages), and the operator claims its pool."""
    cluster = kueue_operator
    kubectl(cluster, "delete", "tsc", "-n", QUEUED, "e", "--ignore-not-found", "--wait=true")
    kube.wait_for(
        lambda: held_by(cluster, QUEUED, "e") == {},
        timeout_s=90,
        what="e's pools given back",
    )
    body = tsc("j", kueue={"queueName": "big"})
    body["kind"] = "TPUSliceJob"
    body["spec"]["job"] = {"entrypoint": "python -c 'print(1)'", "backoffLimit": 0}
    apply(cluster, QUEUED, body)

    def job() -> dict[str, Any]:
        found: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
            "tpuslice.dev", "v1alpha1", QUEUED, "tpuslicejobs", "j"
        )
        return found

    def admitted_and_held() -> str | None:
        obj = job()
        admitted = condition(obj, "KueueAdmitted").get("status") == "True"
        held = [
            r
            for r in cluster.custom.list_cluster_custom_object(
                "tpuslice.dev", "v1alpha1", "slicereservations"
            )["items"]
            if r["spec"]["holder"].get("kind") == "TPUSliceJob"
            and r["spec"]["holder"]["name"] == "j"
        ]
        name = str((obj.get("status") or {}).get("rayCluster") or "")
        # KubeRay names the cluster in the RayJob's status one reconcile before it
        # creates it, so the name alone does not mean the RayCluster exists yet
        exists = name != "" and _raycluster(cluster, QUEUED, name) is not None
        return name if admitted and held and exists else None

    ray_cluster = kube.wait_for(
        admitted_and_held,
        timeout_s=120,
        what="j admitted by Kueue, its slice holding a pool and its RayCluster created",
        describe=lambda: job().get("status"),
    )
    rayjob = cluster.custom.get_namespaced_custom_object("ray.io", "v1", QUEUED, "rayjobs", "j")
    assert rayjob["metadata"]["labels"][QUEUE_LABEL] == "big"
    # KubeRay's RayJob spec.suspend is a plain bool with omitempty: Kueue's false is absent
    assert not rayjob["spec"].get("suspend")
    rc = _raycluster(cluster, QUEUED, ray_cluster)
    assert rc is not None and rc["spec"].get("suspend") is not True
    workloads = cluster.custom.list_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", QUEUED, "workloads"
    )["items"]
    owners = [
        ref["kind"]
        for w in workloads
        for ref in w["metadata"].get("ownerReferences") or []
        if ref["name"] in ("j", ray_cluster)
    ]
    assert owners == ["RayJob"], owners


def test_an_admission_gate_holds_kueue_until_the_pools_are_free(
    kueue_operator: E2ECluster,
) -> None:
    """g asks for two slices with spec.kueue.admissionGate UntilPoolsFree through big
    (quota for both) while c holds one of the two pools: its RayCluster is created with
    the operator's gate in Kueue's admission-gated-by annotation, Kueue's Workload says
    AdmissionGated, nothing is claimed. Once c is gone both pools are free: the gate is
    lifted, Kueue admits g and the operator places it."""
    cluster = kueue_operator
    kubectl(cluster, "delete", "tsj", "-n", QUEUED, "j", "--ignore-not-found", "--wait=true")
    kube.wait_for(
        lambda: (
            not [
                r
                for r in cluster.custom.list_cluster_custom_object(
                    "tpuslice.dev", "v1alpha1", "slicereservations"
                )["items"]
                if r["spec"]["holder"]["namespace"] == QUEUED
            ]
        ),
        timeout_s=90,
        what="no pool held in the queued namespace",
    )
    assert len(held_by(cluster, DEFAULTED, "c")) == 1
    gate = {"queueName": "big", "admissionGate": "UntilPoolsFree"}
    apply(cluster, QUEUED, tsc("g", slices=2, kueue=gate))
    held = wait_condition(
        cluster, QUEUED, "g", "KueueAdmitted", "False", "AdmissionGated", timeout_s=60
    )
    assert (
        "1 free v6e 4x4 node pools for the 2 slices" in condition(held, "KueueAdmitted")["message"]
    )
    rc = _raycluster(cluster, QUEUED, "g")
    assert rc is not None
    assert rc["metadata"]["annotations"]["kueue.x-k8s.io/admission-gated-by"] == (
        "tpuslice.dev/pools-free"
    )

    def gated_workload() -> dict[str, Any] | None:
        for w in cluster.custom.list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", QUEUED, "workloads"
        )["items"]:
            refs = w["metadata"].get("ownerReferences") or []
            reserved = [
                x for x in (w.get("status") or {}).get("conditions") or []
                if x["type"] == "QuotaReserved"
            ]  # fmt: skip
            if any(r["name"] == "g" for r in refs) and reserved:
                found: dict[str, Any] = w
                return found if reserved[0]["reason"] == "AdmissionGated" else None
        return None

    kube.wait_for(gated_workload, timeout_s=60, what="g's Workload gated by the operator")
    _no_claim_for(cluster, QUEUED, "g", seconds=3)
    mark = time.monotonic()
    kubectl(cluster, "delete", "tsc", "-n", DEFAULTED, "c", "--wait=true", "--timeout=90s")
    wait_condition(cluster, QUEUED, "g", "KueueAdmitted", "True", "Admitted", timeout_s=120)
    wait_condition(cluster, QUEUED, "g", "Ready", "True", timeout_s=180)
    assert len(held_by(cluster, QUEUED, "g")) == 2
    rc = _raycluster(cluster, QUEUED, "g")
    assert rc is not None
    assert "kueue.x-k8s.io/admission-gated-by" not in rc["metadata"].get("annotations", {})
    assert cluster.run_dir is not None
    (cluster.run_dir / "kueue-admission-gate.json").write_text(
        json.dumps({"ready_after_pools_free_s": round(time.monotonic() - mark, 2)}) + "\n"
    )


def test_an_elastic_scale_up_waits_for_kueues_gate(kueue_operator: E2ECluster) -> None:
    """x is elastic (1 to 2 slices) through ClusterQueue tpu (quota for one slice): Kueue
    admits it as an elastic job at one slice, which the operator places. The autoscaler
    asks for a second slice; Kueue cannot admit that workload slice, so the new pods keep
    Kueue's elastic-job gate and the operator claims nothing for them though a pool is
    free. Once the quota is raised Kueue admits the scale-up and ungates them, and the
    second slice gets its pool."""
    cluster = kueue_operator
    kubectl(cluster, "delete", "tsc", "-n", QUEUED, "g", "--ignore-not-found", "--wait=true")
    kube.wait_for(
        lambda: held_by(cluster, QUEUED, "g") == {},
        timeout_s=90,
        what="g's pools given back",
    )
    body = tsc("x", kueue={"queueName": "tpu"}, elastic={"minSlices": 1, "maxSlices": 2})
    apply(cluster, QUEUED, body)
    wait_condition(cluster, QUEUED, "x", "KueueAdmitted", "True", "Admitted", timeout_s=120)
    wait_condition(cluster, QUEUED, "x", "Ready", "True", timeout_s=180)
    assert len(held_by(cluster, QUEUED, "x")) == 1
    rc = _raycluster(cluster, QUEUED, "x")
    assert rc is not None and rc["metadata"]["annotations"]["kueue.x-k8s.io/elastic-job"] == "true"

    autoscaler.scale(cluster.api, QUEUED, "x", None, 2)

    def gated_pods() -> list[str] | None:
        pods = [
            p.metadata.name
            for p in slice_pods(cluster, QUEUED, "x")
            if "kueue.x-k8s.io/elastic-job" in [g.name for g in p.spec.scheduling_gates or []]
        ]
        return pods if len(pods) >= 4 else None

    kube.wait_for(
        gated_pods,
        timeout_s=60,
        what="the scale-up's 4 pods, gated by Kueue",
        describe=lambda: describe(cluster, QUEUED, "x"),
    )
    end = time.monotonic() + 5
    while time.monotonic() < end:  # the free pool is not claimed for the gated slice
        assert len(held_by(cluster, QUEUED, "x")) == 1, describe(cluster, QUEUED, "x")
        time.sleep(1)
    waiting = [s for s in get_tsc(cluster, QUEUED, "x")["status"]["slices"] if s["index"] == 1]
    assert waiting and "Kueue has not admitted the scale-up" in waiting[0]["message"], waiting

    mark = time.monotonic()
    cluster.custom.patch_cluster_custom_object(
        "kueue.x-k8s.io",
        "v1beta2",
        "clusterqueues",
        "tpu",
        {
            "spec": {
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "google.com/tpu"],
                        "flavors": [
                            {
                                "name": "tpu",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": 1000},
                                    {"name": "memory", "nominalQuota": "4Ti"},
                                    {"name": "google.com/tpu", "nominalQuota": 2 * ONE_SLICE_CHIPS},
                                ],
                            }
                        ],
                    }
                ]
            }
        },
    )
    kube.wait_for(
        lambda: len(held_by(cluster, QUEUED, "x")) == 2,
        timeout_s=120,
        what="x's second slice holds a pool once Kueue admits the scale-up",
        describe=lambda: describe(cluster, QUEUED, "x"),
    )
    kube.wait_for(
        lambda: (
            [s["state"] for s in get_tsc(cluster, QUEUED, "x")["status"]["slices"]]
            == ["Ready", "Ready"]
        ),
        timeout_s=180,
        what="both of x's slices Ready",
        describe=lambda: describe(cluster, QUEUED, "x"),
    )
    assert cluster.run_dir is not None
    (cluster.run_dir / "kueue-elastic.json").write_text(
        json.dumps({"scale_up_ready_after_quota_s": round(time.monotonic() - mark, 2)}) + "\n"
    )


def _kueue_placement(cluster: E2ECluster, name: str, count: int = 4) -> dict[str, list[str]] | None:
    """replica -> the pools Kueue's nodeSelector names on its worker pods, once Kueue's
    TopologyUngater has lifted its gate from all ``count``; None before."""
    workers = [
        p
        for p in slice_pods(cluster, QUEUED, name)
        if (p.metadata.labels or {}).get("ray.io/node-type") == "worker"
        and not p.metadata.deletion_timestamp
    ]
    if len(workers) != count:
        return None
    placed: dict[str, list[str]] = {}
    for pod in workers:
        if "kueue.x-k8s.io/topology" in [g.name for g in pod.spec.scheduling_gates or []]:
            return None
        replica = pod.metadata.labels["ray.io/worker-group-replica-name"]
        placed.setdefault(replica, []).append((pod.spec.node_selector or {}).get(NODEPOOL, ""))
    assert all(all(pools) for pools in placed.values()), f"pods Kueue never placed: {placed}"
    return {r: sorted(pools) for r, pools in placed.items()}


def _assigned_pools(assignment: dict[str, Any]) -> set[str]:
    """The domain values of a Workload's ``topologyAssignment`` (kubernetes-sigs/kueue
    v0.17.0 apis/kueue/v1beta2 workload_types.go: per slice, each level's values either
    ``universal`` or ``individual`` as ``prefix`` + root + ``suffix``)."""
    out: set[str] = set()
    for part in assignment.get("slices") or []:
        for level in part.get("valuesPerLevel") or []:
            if level.get("universal"):
                out.add(level["universal"])
            each = level.get("individual") or {}
            prefix, suffix = each.get("prefix", ""), each.get("suffix", "")
            out |= {f"{prefix}{root}{suffix}" for root in each.get("roots") or []}
    return out


def test_kueue_topology_at_the_node_pool_level_chooses_the_pools(
    kueue_operator: E2ECluster,
) -> None:
    """t (two v5p 2x2x2 slices, two hosts each, PerSlice) through the LocalQueue tas, whose
    TPU chips are in a topology-aware flavor over a Topology ending at the node pool,
    asks Kueue for each slice in one node pool. Kueue admits it and its TopologyUngater
    lifts its gate, pinning every worker pod to a pool. The operator holds exactly the
    pool a slice's pods name and the slice runs there; a slice whose pods Kueue put in
    two pools (Kueue v0.17 lifts the gates of a RayCluster's pods in list order, not by
    KubeRay replica) gets no pool and says Kueue and the operator disagree. Beside it u,
    one slice with ``podset-required-topology`` at the node-pool level, always lands
    whole in one pool, and holds that one."""
    cluster = kueue_operator
    slice_level = {
        "kueue.x-k8s.io/podset-slice-required-topology": NODEPOOL,
        "kueue.x-k8s.io/podset-slice-size": "2",
    }
    body = tsc(
        "t",
        type_="v5p",
        topology="2x2x2",
        slices=2,
        kueue={"queueName": "tas"},
        reservation={"gang": "PerSlice"},
        worker={
            "resources": {"cpu": "4", "memory": "16Gi"},
            "template": {"metadata": {"annotations": slice_level}},
        },
    )
    one = tsc(
        "u",
        type_="v5p",
        topology="2x2x2",
        kueue={"queueName": "tas"},
        worker={
            "resources": {"cpu": "4", "memory": "16Gi"},
            "template": {
                "metadata": {"annotations": {"kueue.x-k8s.io/podset-required-topology": NODEPOOL}}
            },
        },
    )
    mark = time.monotonic()
    apply(cluster, QUEUED, body)
    apply(cluster, QUEUED, one)
    wait_condition(cluster, QUEUED, "t", "KueueAdmitted", "True", "Admitted", timeout_s=120)
    placed = kube.wait_for(
        lambda: _kueue_placement(cluster, "t"),
        timeout_s=60,
        what="Kueue's ungater placed t's four worker pods",
        describe=lambda: describe(cluster, QUEUED, "t"),
    )
    record: dict[str, Any] = {"kueue_placement": placed}
    agreed = {r: pools[0] for r, pools in placed.items() if len(set(pools)) == 1}
    split = sorted(r for r in placed if r not in agreed)

    def held_as_kueue_placed() -> tuple[dict[str, str]] | None:
        held = held_by(cluster, QUEUED, "t")
        # never a pool other than the one the slice's pods name, at any moment
        assert all(agreed.get(r) == pool for r, pool in held.items()), (held, placed)
        return (held,) if held == agreed else None

    kube.wait_for(  # before Kueue's waitForPodsReady (45 s from admission) would evict
        held_as_kueue_placed,
        timeout_s=30,
        what=f"t holds exactly the pools Kueue placed its slices on ({placed})",
        describe=lambda: describe(cluster, QUEUED, "t"),
    )

    def disagreeing() -> list[str]:
        slices = get_tsc(cluster, QUEUED, "t")["status"]["slices"]
        return sorted(
            str(s.get("replica"))
            for s in slices
            if s["state"] == "WaitingForCapacity"
            and "Kueue and the operator disagree" in s.get("message", "")
        )

    if split:
        kube.wait_for(
            lambda: disagreeing() == split,
            timeout_s=30,
            what="t's split slices say Kueue and the operator disagree",
            describe=lambda: describe(cluster, QUEUED, "t"),
        )
    if not split:
        wait_condition(cluster, QUEUED, "t", "Ready", "True", timeout_s=180)
        record["ready_s"] = round(time.monotonic() - mark, 2)
        listed = cluster.core.list_node().items
        nodes = {n.metadata.name: n.metadata.labels[NODEPOOL] for n in listed}
        for pod in slice_pods(cluster, QUEUED, "t"):
            replica = (pod.metadata.labels or {}).get("ray.io/worker-group-replica-name")
            if replica:
                assert nodes[pod.spec.node_name] == agreed[replica], (pod.metadata.name, agreed)
    (workload,) = [
        w
        for w in cluster.custom.list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", QUEUED, "workloads"
        )["items"]
        if any(o.get("name") == "t" for o in w["metadata"].get("ownerReferences") or [])
    ]
    assigned = {
        pool
        for assignment in workload["status"]["admission"]["podSetAssignments"]
        for pool in _assigned_pools(assignment.get("topologyAssignment") or {})
    }
    assert {pool for pools in placed.values() for pool in pools} <= assigned, assigned
    record["split"] = split

    wait_condition(cluster, QUEUED, "u", "Ready", "True", timeout_s=180)
    (u_pools,) = kube.wait_for(
        lambda: _kueue_placement(cluster, "u", count=2),
        timeout_s=30,
        what="u's two worker pods placed by Kueue",
    ).values()
    assert len(set(u_pools)) == 1, u_pools
    assert list(held_by(cluster, QUEUED, "u").values()) == u_pools[:1]
    record["u_pool"] = u_pools[0]
    kubectl(cluster, "delete", "tsc", "-n", QUEUED, "u", "--wait=true", "--timeout=90s")

    kubectl(cluster, "delete", "tsc", "-n", QUEUED, "t", "--wait=true", "--timeout=90s")
    assert cluster.run_dir is not None
    (cluster.run_dir / "kueue-tas.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
