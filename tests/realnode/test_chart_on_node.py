"""The chart as users install it, running the operator in a real pod on a real kubelet.

One module, run in order, one release at a time (CI budget and one webhook
configuration): `helm install` into a namespace that enforces Pod Security
`restricted`, the operator Ready in its pod with its ServiceAccount, the identity
webhook (pods of its own, `tpuslice webhook`) reached by the API server through
the Service with the webhook's own CA, a two-slice TPUSliceCluster Ready with
every worker's TPU identity, the metrics Service, liveness restarting a hung
operator, `helm upgrade` with a changed value, `helm uninstall` (what stays and
what goes, as the README says), then `manifests/` through `kubectl apply -k`
giving the same running operator.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiException

from tests.e2e.operator_support import (
    apply,
    delete_tsc,
    helm,
    kubectl,
    slice_pods,
    tsc,
    wait_condition,
)
from tests.realnode.conftest import REAL_TOLERATION, NodeCluster
from tpusim import PAUSE_IMAGE, kube
from tpusim.nodepools import TPU_RESOURCE

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tpuslice-operator"
MANIFESTS = REPO / "manifests"
RELEASE = "tpuslice-operator"
FULLNAME = RELEASE  # the release name already contains the chart name
WEBHOOK_CONFIG = "tpuslice-identity"
POD_CIDR = ipaddress.ip_network("10.245.0.0/24")  # the real node's bridge (tpusim.realnode)
IDENTITY_ENV = ("TPU_WORKER_ID", "TPU_NAME", "TPU_WORKER_HOSTNAMES", "MEGASCALE_NUM_SLICES")
#: The chart's default: one operator replica holds the Lease, the other stands by;
#: the webhook Deployment has as many, every one answering.
REPLICAS = 2
#: The webhook pods' name label (the chart's `tpuslice.webhookSelectorLabels`).
WEBHOOK_PODS = "app.kubernetes.io/name=tpuslice-operator-webhook"
PSA_RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}

pytestmark = pytest.mark.realnode


# ---------------------------------------------------------------- helpers
def operator_pods(
    cluster: NodeCluster,
    namespace: str,
    selector: str = "app.kubernetes.io/name=tpuslice-operator",
) -> list[Any]:
    """The operator's pods (or, with ``WEBHOOK_PODS``, the webhook's), not deleting."""
    pods: list[Any] = cluster.core.list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def wait_operator_ready(
    cluster: NodeCluster,
    namespace: str,
    timeout_s: float = 180,
    replicas: int = REPLICAS,
    selector: str = "app.kubernetes.io/name=tpuslice-operator",
) -> list[Any]:
    """The chart's operator pods (or webhook pods) of the namespace, all Running and Ready
    on the real node."""

    def check() -> list[Any] | None:
        pods = operator_pods(cluster, namespace, selector)
        if len(pods) == replicas and all(ready(p) for p in pods):
            return pods
        return None

    pods: list[Any] = kube.wait_for(
        check,
        timeout_s=timeout_s,
        what=f"{replicas} pods {selector} Ready in {namespace}",
        describe=lambda: describe_operator(cluster, namespace),
    )
    for pod in pods:
        assert pod.spec.node_name == cluster.node_name, "the operator must run on the real node"
        assert ipaddress.ip_address(pod.status.pod_ip) in POD_CIDR, pod.status.pod_ip
    return pods


def leader(cluster: NodeCluster, namespace: str, pods: list[Any]) -> Any:
    """The pod that holds the chart's Lease (its identity is the pod name)."""
    names = {p.metadata.name: p for p in pods}

    def holder() -> Any:
        leases = json.loads(kubectl(cluster, "get", "leases", "-n", namespace, "-o", "json").stdout)
        for lease in leases["items"]:
            name = (lease.get("spec") or {}).get("holderIdentity")
            if name in names:
                return names[name]
        return None

    return kube.wait_for(holder, timeout_s=60, what=f"a Lease in {namespace} held by {list(names)}")


def worker_creation_failures(cluster: NodeCluster, namespace: str) -> list[str]:
    """KubeRay's events for worker pods the API server refused (e.g. no webhook answered)."""
    events = cluster.core.list_namespaced_event(namespace).items
    return [e.message for e in events if e.reason == "FailedToCreateWorkerPod"]


def wait_webhook_routed(cluster: NodeCluster, namespace: str, timeout_s: float = 60) -> None:
    """Until the API server reaches the identity webhook through its Service.

    A Ready replica is not yet a routed one: the EndpointSlice controller and
    kube-proxy (one sync a second at most) follow readiness, and until they have,
    the Service's ClusterIP refuses the connection (kube-proxy's REJECT for a
    Service without a ready endpoint). Right after an install that is KubeRay's
    ``FailedToCreateWorkerPod ... connection refused``, retried (the README's
    troubleshooting row). The probe is a server-side dry run of a TPU pod that
    the webhook itself refuses (a worker of ours without KubeRay's labels), so an answer in our
    words proves the call went through the Service to a replica.
    """
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "webhook-routed",
            # a worker of ours (the webhook sees only KubeRay workers) without KubeRay's
            # cluster and group labels
            "labels": {"tpuslice.dev/cluster": "webhook-routed", "ray.io/node-type": "worker"},
        },
        "spec": {
            "containers": [
                {
                    "name": "probe",
                    "image": PAUSE_IMAGE,
                    "resources": {"limits": {TPU_RESOURCE: "4"}},
                }
            ]
        },
    }
    seen: list[str] = []

    def answered() -> bool:
        done = kubectl(
            cluster,
            "create",
            "--dry-run=server",
            "-n",
            namespace,
            "-f",
            "-",
            stdin=yaml.safe_dump(probe),
            check=False,
        )
        seen.append(done.stderr.strip())
        return done.returncode != 0 and "must be created by KubeRay" in done.stderr

    kube.wait_for(
        answered,
        timeout_s=timeout_s,
        what="the identity webhook answering through its Service",
        describe=lambda: seen[-1] if seen else "",
    )


def describe_operator(cluster: NodeCluster, namespace: str) -> str:
    out = kubectl(cluster, "describe", "pods", "-n", namespace, check=False).stdout
    logs = kubectl(
        cluster,
        "logs",
        "-n",
        namespace,
        "-l",
        "app.kubernetes.io/name in (tpuslice-operator, tpuslice-operator-webhook)",
        "--tail=40",
        check=False,
    )
    return f"{out[-4000:]}\n--- logs\n{logs.stdout}{logs.stderr}"


def restricted_namespace(cluster: NodeCluster, name: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": PSA_RESTRICTED},
    }
    kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(body))


def values_file(cluster: NodeCluster, path: Path, **extra: Any) -> Path:
    """Values a user on this node would set: the locally built image, pinned to the node."""
    values: dict[str, Any] = {
        "image": {
            "repository": cluster.operator_image.repository,
            "tag": cluster.operator_image.tag,
            "pullPolicy": "Never",
        },
        "nodeSelector": {"kubernetes.io/hostname": cluster.node_name},
        "tolerations": [REAL_TOLERATION],
        # Short probe timings, so the hung-operator restart fits CI's budget.
        "operator": {
            "probes": {
                "liveness": {
                    "initialDelaySeconds": 5,
                    "periodSeconds": 2,
                    "timeoutSeconds": 1,
                    "failureThreshold": 3,
                },
                "readiness": {"periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 2},
            }
        },
        "terminationGracePeriodSeconds": 5,
        **extra,
    }
    path.write_text(yaml.safe_dump(values))
    return path


def webhook_ca_and_service(cluster: NodeCluster) -> tuple[str, dict[str, Any]]:
    config = json.loads(
        kubectl(cluster, "get", "mutatingwebhookconfiguration", WEBHOOK_CONFIG, "-o", "json").stdout
    )
    (hook,) = config["webhooks"]
    client_config = hook["clientConfig"]
    assert "url" not in client_config, "in a pod the webhook is reached through its Service"
    return client_config["caBundle"], client_config["service"]


def two_slices_ready(
    cluster: NodeCluster, namespace: str, name: str, *, applied: bool = False
) -> None:
    """A two-slice v6e 4x4 TPUSliceCluster Ready, every worker with its TPU identity."""
    if not applied:
        apply(cluster, namespace, tsc(name, slices=2))
    wait_condition(cluster, namespace, name, "Ready", "True", timeout_s=180)
    workers = [
        p
        for p in slice_pods(cluster, namespace, name)
        if "ray.io/worker-group-replica-name" in (p.metadata.labels or {})
    ]
    assert len(workers) == 8, [p.metadata.name for p in workers]
    ids = set()
    for pod in workers:
        (container,) = [c for c in pod.spec.containers if c.name == "ray-worker"]
        env = {e.name: e.value for e in container.env or []}
        missing = [k for k in IDENTITY_ENV if k not in env]
        assert not missing, f"{pod.metadata.name} lacks {missing}"
        ids.add((env["TPU_NAME"], env["TPU_WORKER_ID"]))
    assert len(ids) == 8, ids  # no duplicate worker ids


def operator_host_pids(cluster: NodeCluster) -> list[int]:
    """Host pids of `tpuslice run` processes running as the image's user 65532."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            status = (entry / "status").read_text()
        except OSError:
            continue
        uid_line = next((line for line in status.splitlines() if line.startswith("Uid:")), "")
        if (
            b"run" in cmdline
            and any(part.endswith(b"tpuslice") for part in cmdline)
            and (uid_line.split()[1:2] == ["65532"])
        ):
            pids.append(int(entry.name))
    return pids


def metrics_through_service(cluster: NodeCluster, namespace: str) -> str:
    """/metrics through the API server's service proxy to the chart's metrics Service."""
    path = f"/api/v1/namespaces/{namespace}/services/http:{FULLNAME}-metrics:metrics/proxy/metrics"
    return kubectl(cluster, "get", "--raw", path).stdout


def mutated_admissions(cluster: NodeCluster, namespace: str, pod: Any) -> float:
    """Admissions one webhook replica answered with a patch, from its own /metrics."""
    path = f"/api/v1/namespaces/{namespace}/pods/{pod.metadata.name}:8000/proxy/metrics"
    text = kubectl(cluster, "get", "--raw", path).stdout
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tpuslice_webhook_admission_duration_seconds_count")
        and 'result="mutated"' in line
    )


# ---------------------------------------------------------------- the scenario
@pytest.fixture(scope="module")
def release_ns(node_cluster: NodeCluster) -> str:
    return "tpuslice-system"


def test_helm_install_runs_the_operator_in_a_real_pod(
    node_cluster: NodeCluster,
    release_ns: str,
    tmp_path_factory: pytest.TempPathFactory,
    workload_ns: str,
) -> None:
    cluster = node_cluster
    restricted_namespace(cluster, release_ns)
    values = values_file(cluster, tmp_path_factory.mktemp("values") / "values.yaml")
    helm(
        cluster,
        "install",
        RELEASE,
        str(CHART),
        "-n",
        release_ns,
        "-f",
        str(values),
        "--wait",
        "--timeout=3m",
    )
    pods = wait_operator_ready(cluster, release_ns)
    # Pod Security restricted admitted them as the image's numeric user.
    assert all(p.spec.security_context.run_as_user == 65532 for p in pods)
    # The kubelet serves their logs: the leader's start-up listed through the API server
    # with its token; the other one stands by.
    # (read until each says so: a replica logs its election outcome after its first
    # try, which may come after both pods are Ready)
    lead = leader(cluster, release_ns, pods)
    for pod in pods:
        name, expected = pod.metadata.name, "listed" if pod is lead else "standby"

        def says(name: str = name, expected: str = expected) -> str | None:
            text = str(kubectl(cluster, "logs", "-n", release_ns, name).stdout)
            return text if expected in text.lower() else None

        logs = kube.wait_for(says, timeout_s=60, what=f"{name}'s log saying {expected!r}")
        assert "Traceback" not in logs, logs[-3000:]
    hooks = wait_operator_ready(cluster, release_ns, selector=WEBHOOK_PODS)
    for pod in hooks:
        assert pod.spec.service_account_name == f"{FULLNAME}-webhook"
        assert pod.spec.containers[0].command == ["tpuslice", "webhook"]
        text = str(kubectl(cluster, "logs", "-n", release_ns, pod.metadata.name).stdout)
        assert "Traceback" not in text and "forbidden" not in text.lower(), text[-3000:]
    ca_bundle, service = webhook_ca_and_service(cluster)
    assert ca_bundle and service == {
        "name": f"{FULLNAME}-webhook",
        "namespace": release_ns,
        "path": service["path"],
        "port": 443,
    }
    wait_webhook_routed(cluster, workload_ns)
    two_slices_ready(cluster, workload_ns, "llm")
    # The metrics Service answers; the webhook replicas' own figures show the 8 workers
    # were mutated by them (the API server called them through the webhook Service, both
    # with the one CA of the shared Secret), and the operator's that it answered none.
    assert "tpuslice_leader" in metrics_through_service(cluster, release_ns)
    assert sum(mutated_admissions(cluster, release_ns, p) for p in hooks) >= 8
    assert sum(mutated_admissions(cluster, release_ns, p) for p in pods) == 0
    assert not worker_creation_failures(cluster, workload_ns)


def test_liveness_restarts_a_hung_operator(node_cluster: NodeCluster, release_ns: str) -> None:
    cluster = node_cluster
    before = wait_operator_ready(cluster, release_ns)
    restarts = sum(p.status.container_statuses[0].restart_count for p in before)
    pids = operator_host_pids(cluster)
    assert len(pids) == REPLICAS, pids
    os.kill(pids[0], signal.SIGSTOP)  # one replica hangs; the other keeps serving
    try:

        def restarted() -> bool:
            pods = operator_pods(cluster, release_ns)
            return bool(sum(p.status.container_statuses[0].restart_count for p in pods) > restarts)

        kube.wait_for(
            restarted,
            timeout_s=90,
            what="the kubelet restarting the stopped operator",
            describe=lambda: describe_operator(cluster, release_ns),
        )
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed by the kubelet: good
            os.kill(pids[0], signal.SIGCONT)
    wait_operator_ready(cluster, release_ns)


def test_helm_upgrade_with_a_changed_value(
    node_cluster: NodeCluster, release_ns: str, workload_ns: str
) -> None:
    """A rolling upgrade while KubeRay creates TPU worker pods: none is refused."""
    cluster = node_cluster
    old = {p.metadata.uid for p in wait_operator_ready(cluster, release_ns)}
    old_hooks = {
        p.metadata.uid for p in wait_operator_ready(cluster, release_ns, selector=WEBHOOK_PODS)
    }
    delete_tsc(cluster, workload_ns, "llm")  # frees the two v6e 4x4 pools
    apply(cluster, workload_ns, tsc("after-upgrade", slices=2))  # pods created mid-rollout
    helm(
        cluster,
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        release_ns,
        "--reuse-values",
        "--set",
        "operator.logLevel=DEBUG",
        "--wait",
        "--timeout=3m",
    )

    def replaced() -> list[Any] | None:
        pods = operator_pods(cluster, release_ns)
        fresh = [p for p in pods if p.metadata.uid not in old and ready(p)]
        return fresh if len(fresh) == len(pods) == REPLICAS else None

    new = kube.wait_for(replaced, timeout_s=180, what="both upgraded operator pods Ready")
    assert all("--log-level=DEBUG" in p.spec.containers[0].args for p in new)

    def hooks_replaced() -> list[Any] | None:
        pods = operator_pods(cluster, release_ns, WEBHOOK_PODS)
        fresh = [p for p in pods if p.metadata.uid not in old_hooks and ready(p)]
        return fresh if len(fresh) == len(pods) == REPLICAS else None

    hooks = kube.wait_for(hooks_replaced, timeout_s=180, what="both upgraded webhook pods Ready")
    assert all("--log-level=DEBUG" in p.spec.containers[0].args for p in hooks)
    # The new pods load the CA of the shared Secret; the webhook admitted every worker.
    two_slices_ready(cluster, workload_ns, "after-upgrade", applied=True)
    assert not worker_creation_failures(cluster, workload_ns)


def test_helm_uninstall_keeps_crds_and_the_webhook_configuration(
    node_cluster: NodeCluster, release_ns: str, workload_ns: str
) -> None:
    cluster = node_cluster
    delete_tsc(cluster, workload_ns, "after-upgrade")  # README: delete TPUSliceClusters first
    helm(cluster, "uninstall", RELEASE, "-n", release_ns, "--wait", "--timeout=2m")
    kube.wait_for(
        lambda: (
            not operator_pods(cluster, release_ns)
            and not operator_pods(cluster, release_ns, WEBHOOK_PODS)
        ),
        timeout_s=60,
        what="the operator and webhook pods gone after helm uninstall",
    )
    for kind, name in (
        ("deployment", FULLNAME),
        ("deployment", f"{FULLNAME}-webhook"),
        ("clusterrole", FULLNAME),
        ("clusterrole", f"{FULLNAME}-webhook"),
        ("service", f"{FULLNAME}-webhook"),
    ):
        done = kubectl(cluster, "get", kind, name, "-n", release_ns, check=False)
        assert done.returncode != 0 and "NotFound" in done.stderr, (kind, done.stdout)
    for crd in ("tpusliceclusters.tpuslice.dev", "slicereservations.tpuslice.dev"):
        kubectl(cluster, "get", "crd", crd)  # helm uninstall keeps CRDs
    # Applied by the operator itself: it stays, and the README says to delete it by hand.
    kubectl(cluster, "get", "mutatingwebhookconfiguration", WEBHOOK_CONFIG)
    kubectl(cluster, "delete", "mutatingwebhookconfiguration", WEBHOOK_CONFIG)
    kubectl(cluster, "delete", "namespace", release_ns, "--wait=true", "--timeout=120s")


def test_manifests_with_kubectl_apply_k_give_the_same_operator(
    node_cluster: NodeCluster, tmp_path: Path, workload_ns: str
) -> None:
    """A user's kustomization over manifests/: the image, and the pin to this node."""
    cluster = node_cluster
    shutil.copytree(MANIFESTS, tmp_path / "base")
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["base"],
        "images": [
            {
                "name": "tpuslice-operator",
                "newName": cluster.operator_image.repository,
                "newTag": cluster.operator_image.tag,
            }
        ],
        "patches": [
            {
                # both Deployments: the operator's and the webhook's
                "target": {"kind": "Deployment"},
                "patch": yaml.safe_dump(
                    [
                        {
                            "op": "add",
                            "path": "/spec/template/spec/nodeSelector",
                            "value": {"kubernetes.io/hostname": cluster.node_name},
                        },
                        {
                            "op": "add",
                            "path": "/spec/template/spec/tolerations",
                            "value": [REAL_TOLERATION],
                        },
                        {
                            "op": "replace",
                            "path": "/spec/template/spec/containers/0/imagePullPolicy",
                            "value": "Never",
                        },
                    ]
                ),
            }
        ],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    # The CRDs are still there from the Helm release, owned by the field manager "helm":
    # taking them over needs --force-conflicts, as the README says.
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-k", str(tmp_path))
    try:
        namespace = yaml.safe_load((MANIFESTS / "namespace.yaml").read_text())["metadata"]
        assert namespace["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
        wait_operator_ready(cluster, namespace["name"])
        wait_operator_ready(cluster, namespace["name"], selector=WEBHOOK_PODS)
        _, service = webhook_ca_and_service(cluster)
        assert service["namespace"] == namespace["name"]
        wait_webhook_routed(cluster, workload_ns)
        two_slices_ready(cluster, workload_ns, "from-manifests")
        assert not worker_creation_failures(cluster, workload_ns)
        delete_tsc(cluster, workload_ns, "from-manifests")
    finally:
        kubectl(
            cluster, "delete", "-k", str(tmp_path), "--wait=true", "--timeout=180s", check=False
        )
        kubectl(
            cluster,
            "delete",
            "mutatingwebhookconfiguration",
            WEBHOOK_CONFIG,
            "--ignore-not-found",
            check=False,
        )


def test_ray_head_runs_for_real_on_the_node(node_cluster: NodeCluster, workload_ns: str) -> None:
    """A RayCluster head from the local Ray image: Ready by KubeRay's own probes, and its
    dashboard reachable through the API server's proxy, the path KubeRay takes with
    ``--use-kubernetes-proxy`` (it runs on the host, outside cluster DNS)."""
    cluster = node_cluster
    name = "real-head"
    head_resources = {"cpu": "500m", "memory": "1Gi"}
    body = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": workload_ns},
        "spec": {
            "rayVersion": cluster.ray_image.tag,
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                "template": {
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": cluster.node_name},
                        "tolerations": [REAL_TOLERATION],
                        "containers": [
                            {
                                "name": "ray-head",
                                "image": cluster.ray_image.ref,
                                "imagePullPolicy": "Never",
                                "resources": {
                                    "requests": head_resources,
                                    "limits": dict(head_resources),
                                },
                            }
                        ],
                    }
                },
            },
        },
    }
    kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(body))

    def state() -> str | None:
        obj = cluster.custom.get_namespaced_custom_object(
            "ray.io", "v1", workload_ns, "rayclusters", name
        )
        return "ready" if (obj.get("status") or {}).get("state") == "ready" else None

    def head_pods() -> str:
        out = kubectl(
            cluster,
            "get",
            "pods",
            "-n",
            workload_ns,
            "-l",
            f"ray.io/cluster={name}",
            "-o",
            "wide",
            check=False,
        )
        return out.stdout + out.stderr

    kube.wait_for(state, timeout_s=240, what=f"RayCluster {name} ready", describe=head_pods)
    (head,) = cluster.core.list_namespaced_pod(
        workload_ns, label_selector=f"ray.io/cluster={name}"
    ).items
    assert head.spec.node_name == cluster.node_name and ready(head)
    assert ipaddress.ip_address(head.status.pod_ip) in POD_CIDR
    service = f"http:{name}-head-svc:dashboard"
    path = f"/api/v1/namespaces/{workload_ns}/services/{service}/proxy/api/version"
    version = json.loads(
        kube.wait_for(
            lambda: kubectl(cluster, "get", "--raw", path, check=False).stdout or None,
            timeout_s=60,
            what="the Ray dashboard through the API server proxy",
        )
    )
    assert version.get("ray_version", "").startswith(cluster.ray_image.tag.split("-")[0]), version
    kubectl(
        cluster, "delete", "raycluster", "-n", workload_ns, name, "--wait=true", "--timeout=120s"
    )

    def head_gone() -> bool:
        try:
            cluster.core.read_namespaced_pod(head.metadata.name, workload_ns)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    kube.wait_for(head_gone, timeout_s=120, what="the Ray head pod gone with its RayCluster")


def test_a_tpuslicejob_runs_its_entrypoint_on_a_real_ray_head(
    node_cluster: NodeCluster,
    workload_ns: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A TPUSliceJob from the chart's operator ends ``Complete``: KubeRay makes the job's
    RayCluster (its head from the local Ray image on the real node; its TPU workers on
    the fake pools, released onto the slice the operator reserved), submits the
    entrypoint through the dashboard (HTTPMode, through the API server's proxy: KubeRay
    runs on the host, outside the real node's DNS), Ray runs it on the head, and the job's
    pools are given back once the cluster is gone."""
    cluster = node_cluster
    namespace = "tpuslice-jobs"
    restricted_namespace(cluster, namespace)
    values = values_file(
        cluster,
        tmp_path_factory.mktemp("values-job") / "values.yaml",
        replicaCount=1,
        webhook={"replicaCount": 1},
    )
    helm(
        cluster,
        "install",
        RELEASE,
        str(CHART),
        "-n",
        namespace,
        "-f",
        str(values),
        "--wait",
        "--timeout=3m",
    )
    try:
        wait_operator_ready(cluster, namespace, replicas=1)
        wait_operator_ready(cluster, namespace, replicas=1, selector=WEBHOOK_PODS)
        head_resources = {"cpu": "500m", "memory": "1Gi"}
        body = tsc("hello", slices=1)
        body["kind"] = "TPUSliceJob"
        body["spec"]["ray"] = {
            "version": cluster.ray_image.tag.split("-")[0],
            "image": cluster.ray_image.ref,
        }
        body["spec"]["head"] = {
            "resources": head_resources,
            "rayStartParams": {"num-cpus": "1", "dashboard-host": "0.0.0.0"},
            "template": {
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": cluster.node_name},
                    "tolerations": [REAL_TOLERATION],
                    "containers": [{"name": "ray-head", "imagePullPolicy": "Never"}],
                }
            },
        }
        body["spec"]["job"] = {
            "entrypoint": "python -c \"import ray; ray.init(); print('tpuslice says hello')\"",
            "submissionMode": "HTTPMode",
            "backoffLimit": 0,
        }
        apply(cluster, workload_ns, body)

        def job() -> dict[str, Any]:
            obj: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
                "tpuslice.dev", "v1alpha1", workload_ns, "tpuslicejobs", "hello"
            )
            return obj

        def conditions() -> dict[str, str]:
            return {
                c["type"]: c["status"] for c in (job().get("status") or {}).get("conditions") or []
            }

        def held() -> list[str]:
            return [
                r["metadata"]["name"]
                for r in cluster.custom.list_cluster_custom_object(
                    "tpuslice.dev", "v1alpha1", "slicereservations"
                )["items"]
                if r["spec"]["holder"].get("kind") == "TPUSliceJob"
                and r["spec"]["holder"]["namespace"] == workload_ns
            ]

        seen_held: list[str] = []

        def complete() -> bool:
            seen_held.extend(p for p in held() if p not in seen_held)
            return conditions().get("Complete") == "True"

        kube.wait_for(
            complete,
            timeout_s=300,
            what="TPUSliceJob hello Complete",
            describe=lambda: {
                "status": job().get("status"),
                "pods": kubectl(
                    cluster, "get", "pods", "-n", workload_ns, "-o", "wide", check=False
                ).stdout,
            },
        )
        status = job()["status"]
        assert status["jobStatus"] == "SUCCEEDED" and status["jobDeploymentStatus"] == "Complete"
        assert conditions()["Failed"] == "False" and conditions()["Stalled"] == "False"
        assert seen_held, "the job's slice never held a node pool"
        # the job is over: KubeRay deletes its cluster, the operator gives the pool back
        kube.wait_for(lambda: not held(), timeout_s=180, what="the job's pool given back")
        kubectl(
            cluster, "delete", "tsj", "hello", "-n", workload_ns, "--wait=true", "--timeout=120s"
        )
        assert not cluster.custom.list_namespaced_custom_object(
            "ray.io", "v1", workload_ns, "rayjobs"
        )["items"]
    finally:
        helm(cluster, "uninstall", RELEASE, "-n", namespace, "--wait", "--timeout=2m", check=False)
        kubectl(
            cluster,
            "delete",
            "mutatingwebhookconfiguration",
            WEBHOOK_CONFIG,
            "--ignore-not-found",
            check=False,
        )
