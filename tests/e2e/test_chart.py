"""The Helm chart on the real API server, and its RBAC proven by running the operator with it.

One install serves the whole module (CI budget): the chart's objects exist, its
rendered output (default and cert-manager variants) and manifests/ pass a
server-side dry run, the operator then runs out of cluster with the chart
ServiceAccount's own token through a two-slice scenario to Ready (plus the
WaitingForCapacity and Stalled states, whose real status objects feed the
GitOps health checks), a call outside the ClusterRole is forbidden, and
`helm upgrade` / `helm uninstall` behave as the chart README says.

The session's `operator` is stopped while ours runs (two operators would race)
and restarted afterwards, which re-applies its own webhook configuration: the
cluster-scoped `tpuslice-identity` never points at a dead endpoint after this
module.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client import ApiException

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import (
    OperatorProcess,
    apply,
    condition,
    get_tsc,
    held_by,
    helm,
    kubectl,
    tsc,
    wait_condition,
)
from tests.support.gitops import argocd_health, kstatus
from tpusim import ToolPaths, kube
from tpusim.nodepools import TPUPool

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tpuslice-operator"
RELEASE = "e2e-chart"
FULLNAME = f"{RELEASE}-tpuslice-operator"
WEBHOOK = f"{FULLNAME}-webhook"


def test_manifests_match_the_chart() -> None:
    """manifests/ is what the chart renders with default values (`make manifests`)."""
    done = subprocess.run(
        [sys.executable, str(REPO / "hack" / "render_manifests.py"), "--check"],
        capture_output=True,
        text=True,
        env={**os.environ, "HELM": str(ToolPaths.for_repo(REPO).binary("helm"))},
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def release(cluster: E2ECluster, tpuslice_crds: None) -> Iterator[str]:
    """`helm install` into a fresh namespace; uninstalled (if still there) afterwards."""
    ns = f"tpuslice-chart-{uuid.uuid4().hex[:5]}"
    # The session operator (the admin certificate's user) writes reservations while the
    # release is installed: it is one of the guard's extra writers, as a second operator
    # instance would be; and the manifests/ dry run below is a second install, which owns
    # the cluster-wide aggregated roles (chart README: off for a second release).
    helm(
        cluster,
        "install",
        RELEASE,
        str(CHART),
        "-n",
        ns,
        "--create-namespace",
        "--set",
        "reservationGuard.extraWriters={kubernetes-admin}",
        "--set",
        "rbac.aggregatedRoles=false",
    )
    try:
        yield ns
    finally:
        helm(cluster, "uninstall", RELEASE, "-n", ns, "--ignore-not-found", check=False)
        for name in (ns, "tpuslice-system"):  # the latter: manifests/ dry run
            kubectl(
                cluster,
                "delete",
                "namespace",
                name,
                "--ignore-not-found",
                "--wait=false",
                check=False,
            )


def dry_run(cluster: E2ECluster, namespace: str, text: str) -> None:
    kubectl(
        cluster,
        "apply",
        "--server-side",
        "--dry-run=server",
        "--force-conflicts",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=text,
    )


def sa_kubeconfig(cluster: E2ECluster, namespace: str, path: Path, account: str = FULLNAME) -> Path:
    """A kubeconfig that authenticates only as one of the chart's ServiceAccounts
    (TokenRequest): the operator's, or the webhook pods' (``WEBHOOK``)."""
    token = cluster.core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    context = next(c for c in config["clusters"])["cluster"]
    server = context["server"]
    ca = (
        context.get("certificate-authority-data")
        or base64.b64encode(Path(context["certificate-authority"]).read_bytes()).decode()
    )
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": server, "certificate-authority-data": ca}}
                ],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "sa"}}],
                "current-context": "c",
            }
        )
    )
    return path


def first_status(
    cluster: E2ECluster, namespace: str, name: str, want: Any, what: str
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = get_tsc(cluster, namespace, name)
        return obj if want(obj) else None

    return kube.wait_for(check, timeout_s=60, what=what, interval_s=0.1)


def test_chart_install_rbac_upgrade_uninstall(
    cluster: E2ECluster,
    release: str,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    ns = release
    # -- objects of `helm install` (the client's models type every field optional: the
    # objects read here are read whole, as Any)
    apps = cluster.api
    deployment: Any = client.AppsV1Api(apps).read_namespaced_deployment(FULLNAME, ns)
    assert deployment.spec.replicas == 2
    assert deployment.spec.strategy.type == "RollingUpdate"
    assert deployment.spec.strategy.rolling_update.max_unavailable == 0
    pdb: Any = client.PolicyV1Api(apps).read_namespaced_pod_disruption_budget(FULLNAME, ns)
    assert pdb.spec.min_available == 1
    pod = deployment.spec.template.spec
    assert pod.security_context.run_as_non_root is True
    assert pod.containers[0].security_context.read_only_root_filesystem is True
    assert "--webhook-port=0" in pod.containers[0].args  # served by the webhook pods
    # the webhook Deployment of its own: its replicas, budget, Service and account
    hook: Any = client.AppsV1Api(apps).read_namespaced_deployment(WEBHOOK, ns)
    assert hook.spec.replicas == 2
    assert hook.spec.template.spec.containers[0].command == ["tpuslice", "webhook"]
    assert f"--webhook-service={WEBHOOK}" in hook.spec.template.spec.containers[0].args
    assert hook.spec.template.spec.service_account_name == WEBHOOK
    client.PolicyV1Api(apps).read_namespaced_pod_disruption_budget(WEBHOOK, ns)
    service = cluster.core.read_namespaced_service(WEBHOOK, ns)
    assert [(p.port, p.target_port) for p in service.spec.ports] == [(443, "webhook")]
    assert service.spec.selector == hook.spec.selector.match_labels
    rbac = client.RbacAuthorizationV1Api(apps)
    for account in (FULLNAME, WEBHOOK):
        cluster.core.read_namespaced_service_account(account, ns)
        role: Any = rbac.read_cluster_role(account)
        assert role.rules and all("*" not in (r.verbs + r.resources) for r in role.rules)
        rbac.read_cluster_role_binding(account)
        assert rbac.read_namespaced_role(account, ns).rules
    # -- the reservation guard: a user who may write everything (system:masters) but is
    # not the operator is refused by the API server itself, naming who may write them
    reservation: dict[str, Any] = {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "SliceReservation",
        "metadata": {"name": "v6e-4x4-a"},
        "spec": {
            "nodePool": "v6e-4x4-a",
            "holder": {"namespace": ns, "name": "squatter", "uid": "u", "replicaName": "r"},
        },
    }

    def tenant_refused() -> str | None:
        # the API server compiles a new policy in the background: refused within seconds
        done = kubectl(
            cluster,
            "create",
            "--dry-run=server",
            "--as=tenant-a",
            "--as-group=system:masters",
            "-f",
            "-",
            stdin=yaml.safe_dump(reservation),
            check=False,
        )
        return done.stderr if done.returncode != 0 else None

    refusal = kube.wait_for(tenant_refused, timeout_s=60, what="the reservation guard refusing")
    assert "SliceReservations are written only by the tpuslice operator" in refusal

    # ... and may neither delete nor change another team's claim. The probe is made by the
    # operator's own identity (an extra writer); the session operator sweeps it soon (its
    # holder does not exist), so it is made again until the tenant's writes were judged.
    probe = {
        **reservation,
        "metadata": {"name": "guard-probe-held"},
        "spec": {**reservation["spec"], "nodePool": "guard-probe-held"},
    }

    def tenant_write_refused(*verb: str) -> str | None:
        made = kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(probe), check=False)
        assert made.returncode == 0 or "NotFound" in made.stderr, made.stderr
        done = kubectl(
            cluster,
            *verb,
            "--dry-run=server",
            "--as=tenant-a",
            "--as-group=system:masters",
            check=False,
        )
        if done.returncode == 0:
            raise AssertionError(f"a tenant's {verb[0]} of a reservation was admitted")
        return None if "NotFound" in done.stderr else done.stderr

    for write in (
        ("delete", "slicereservation", "guard-probe-held"),
        ("label", "slicereservation", "guard-probe-held", "stolen=yes"),
    ):
        refusal = kube.wait_for(
            functools.partial(tenant_write_refused, *write),
            timeout_s=60,
            what=f"the reservation guard refusing a tenant's {write[0]}",
        )
        assert "SliceReservations are written only by the tpuslice operator" in refusal
    kubectl(cluster, "delete", "slicereservation", "guard-probe-held", "--ignore-not-found")
    secret_name = f"{FULLNAME}-webhook-certs"
    assert not cluster.core.read_namespaced_secret(secret_name, ns).data  # rendered empty
    ext = kube.apiextensions_v1(apps)
    for crd in ("tpusliceclusters.tpuslice.dev", "slicereservations.tpuslice.dev"):
        ext.read_custom_resource_definition(crd)

    # -- rendered output passes the API server's own validation
    dry_run(cluster, ns, helm(cluster, "template", RELEASE, str(CHART), "-n", ns).stdout)
    with_cm = helm(
        cluster,
        "template",
        RELEASE,
        str(CHART),
        "-n",
        ns,
        "--set",
        "webhook.certManager.enabled=true",
    ).stdout
    docs = [d for d in yaml.safe_load_all(with_cm) if d]
    assert {d["kind"] for d in docs} >= {
        "Certificate",
        "Issuer",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    # cert-manager's own kinds need its CRDs; everything else must be accepted. The
    # configurations are checked under other names: the live tpuslice-identity and
    # tpuslice-policy belong to the session operator (switching modes means deleting
    # them first; chart README).
    docs = [d for d in docs if not d["apiVersion"].startswith("cert-manager.io")]
    for doc in docs:
        if doc["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            doc["metadata"]["name"] = f"{RELEASE}-dry-run"
    dry_run(cluster, ns, yaml.safe_dump_all(docs))
    kubectl(cluster, "create", "namespace", "tpuslice-system", check=False)
    kubectl(cluster, "apply", "-k", str(REPO / "manifests"), "--server-side", "--dry-run=server")

    # -- the operator with the chart's ServiceAccount and nothing else
    config = sa_kubeconfig(cluster, ns, tmp_path / "sa.kubeconfig")
    denied = kubectl(cluster, f"--kubeconfig={config}", "get", "secrets", "-n", ns, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr
    for verb, resource in (("create", "pods"), ("delete", "nodes"), ("get", "secrets")):
        can = kubectl(
            cluster, f"--kubeconfig={config}", "auth", "can-i", verb, resource, "-A", check=False
        )
        assert can.stdout.strip() == "no", f"{verb} {resource}: {can.stdout}"
    # the webhook pods' account: the certificates' Secret by name, nothing the operator does
    hook_config = sa_kubeconfig(cluster, ns, tmp_path / "webhook.kubeconfig", WEBHOOK)
    for verb, resource in (
        ("patch", "pods"),
        ("create", "slicereservations.tpuslice.dev"),
        ("patch", "rayclusters.ray.io"),
        ("get", "secrets"),
        ("update", "leases.coordination.k8s.io"),
    ):
        can = kubectl(
            cluster,
            f"--kubeconfig={hook_config}",
            "auth",
            "can-i",
            verb,
            resource,
            "-A",
            check=False,
        )
        assert can.stdout.strip() == "no", f"webhook {verb} {resource}: {can.stdout}"

    operator.stop()
    # leader election and the shared webhook Secret as the chart runs them: the Lease
    # is created (server-side apply) and the Secret filled with the Role's grants only
    ours = OperatorProcess(
        config,
        tmp_path / "sa-operator" / "operator.log",
        identity="e2e-sa-operator",
        extra_args=(
            f"--leader-elect-namespace={ns}",
            f"--leader-elect-lease-name={FULLNAME}",
        ),
        webhook_kubeconfig=hook_config,
        webhook_args=(f"--webhook-secret={secret_name}", f"--webhook-namespace={ns}"),
    )
    captured: dict[str, dict[str, Any]] = {}
    try:
        ours.start()
        apply(cluster, namespace, tsc("llm", slices=2))
        captured["reconciling"] = first_status(
            cluster,
            namespace,
            "llm",
            lambda o: condition(o, "Reconciling").get("status") == "True",
            "llm Reconciling=True",
        )
        captured["ready"] = wait_condition(cluster, namespace, "llm", "Ready", "True")
        assert len(held_by(cluster, namespace, "llm")) == 2
        # a third v6e 4x4 pool exists but is cordoned: the gang of three waits for it
        third = TPUPool("v6e-4x4-chart", "v6e", "4x4", nodes=4)
        extra_nodes = kube.create_pool(cluster.api, third)
        kube.wait_nodes_ready(cluster.api, extra_nodes)
        for node in extra_nodes:
            kube.cordon(cluster.api, node)
        apply(cluster, namespace, tsc("llm", slices=3))
        captured["waiting-for-capacity"] = wait_condition(
            cluster, namespace, "llm", "Ready", "False", "WaitingForCapacity"
        )
        assert len(held_by(cluster, namespace, "llm")) == 2  # running slices keep theirs
        bad = tsc("bad", type_="v4", topology="2x2x2")
        bad["spec"]["worker"]["template"] = {
            "spec": {"nodeSelector": {"cloud.google.com/gke-tpu-topology": "2x2x4"}}
        }
        apply(cluster, namespace, bad)
        captured["stalled"] = wait_condition(cluster, namespace, "bad", "Stalled", "True")
        # tear-down through the finalizer: RayCluster deleted, pools released
        kubectl(cluster, "delete", "-n", namespace, "tsc", "llm", "bad", "--wait=false")
        kube.wait_for(
            lambda: (
                not held_by(cluster, namespace, "llm")
                and not cluster.custom.list_namespaced_custom_object(
                    "tpuslice.dev", "v1alpha1", namespace, "tpusliceclusters"
                )["items"]
            ),
            timeout_s=120,
            what="TPUSliceClusters deleted and their node pools released",
            describe=lambda: (held_by(cluster, namespace, "llm"), ours.tail(10)),
        )
        log = ours.log_path.read_text(errors="replace")
        assert "forbidden" not in log.lower() and " 403" not in log, ours.tail(60)
        hook_log = ours.webhook_log_path.read_text(errors="replace")
        assert "forbidden" not in hook_log.lower() and " 403" not in hook_log, hook_log[-3000:]
        assert ours.admissions() > 0  # the TPU pods went through our webhook process
        assert "became leader: the Lease" in log and ours.leading()
    finally:
        ours.stop()
        kube.delete_pool(cluster.api, "v6e-4x4-chart")
        operator.start()  # re-applies the session operator's webhook configuration
    lease: Any = client.CoordinationV1Api(apps).read_namespaced_lease(FULLNAME, ns)
    assert lease.spec.holder_identity == ""  # released on SIGTERM
    filled = cluster.core.read_namespaced_secret(secret_name, ns).data
    assert set(filled) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}

    # -- GitOps health of real objects (also kept as unit-test fixtures)
    expected = {
        "reconciling": ("Progressing", "InProgress"),
        "ready": ("Healthy", "Current"),
        "waiting-for-capacity": ("Progressing", "InProgress"),
        "stalled": ("Degraded", "Failed"),
    }
    out = (cluster.run_dir or tmp_path) / "gitops-status"
    out.mkdir(parents=True, exist_ok=True)
    for key, obj in captured.items():
        obj["metadata"].pop("managedFields", None)
        # refresh tests/unit/fixtures/gitops/ from these when the status format changes
        (out / f"{key}.json").write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        got = (argocd_health(obj)["status"], kstatus(obj))
        assert got == expected[key], f"{key}: {got}, status {obj.get('status')}"

    # -- helm upgrade changes the Deployment, keeps the CRDs and the release's objects
    helm(
        cluster,
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        ns,
        "--reuse-values",
        "--set",
        "operator.logLevel=DEBUG",
    )
    deployment = client.AppsV1Api(apps).read_namespaced_deployment(FULLNAME, ns)
    assert "--log-level=DEBUG" in deployment.spec.template.spec.containers[0].args
    status = json.loads(helm(cluster, "status", RELEASE, "-n", ns, "-o", "json").stdout)
    assert status["version"] == 2 and status["info"]["status"] == "deployed"
    # the operator's certificates survive the upgrade (in neither manifest)
    assert cluster.core.read_namespaced_secret(secret_name, ns).data == filled

    # -- helm uninstall removes the release and keeps the CRDs
    helm(cluster, "uninstall", RELEASE, "-n", ns, "--wait")
    with pytest.raises(ApiException) as gone:
        rbac.read_cluster_role(FULLNAME)
    assert gone.value.status == 404
    with pytest.raises(ApiException):
        client.AppsV1Api(apps).read_namespaced_deployment(FULLNAME, ns)
    with pytest.raises(ApiException):
        cluster.core.read_namespaced_secret(secret_name, ns)
    for crd in ("tpusliceclusters.tpuslice.dev", "slicereservations.tpuslice.dev"):
        ext.read_custom_resource_definition(crd)
