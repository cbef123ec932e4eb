"""The Helm chart, rendered by the real `helm template` (`make test-unit` builds helm first).

What is pinned here: the chart's cert-manager MutatingWebhookConfiguration is
the one the operator builds (webhook_config.webhook_configuration) apart from caBundle;
the ClusterRole covers every call in kube.py and nothing beyond the reviewed
list; the Deployment meets Pod Security "restricted"; manifests/ has not
drifted; what a shared cluster needs (the NetworkPolicy, metrics on loopback,
probes on their own port, ephemeral storage, the image digest, the aggregated
user roles, the policy that keeps SliceReservations the operator's, its CEL run
here as the API server runs it). The e2e tier (tests/e2e/test_chart.py)
installs the chart and runs the operator with its ServiceAccount.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpusim import ToolPaths
from tpuslice.runtime.informers import followed_kinds
from tpuslice.webhook import certificates as webhookcerts
from tpuslice.webhook import configuration as webhook_config

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "tpuslice-operator"
HELM = ToolPaths.for_repo(ROOT).binary("helm")


@pytest.fixture(autouse=True, scope="module")
def helm_is_built() -> None:
    """Fail, never skip: a chart test that does not run is not a pass."""
    assert HELM.exists(), f"{HELM} is missing: run `make tools` (make test-unit does)"


def render(*args: str, namespace: str = "ops") -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(HELM), "template", "rel", str(CHART), "-n", namespace, *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


#: The operator's own ClusterRole, Deployment, Role... (the chart also renders the
#: aggregated user roles, and the webhook Deployment's own objects).
OPERATOR_ROLE = "rel-tpuslice-operator"
#: The webhook Deployment's objects (`tpuslice webhook`): Deployment, ServiceAccount,
#: ClusterRole, Role, PodDisruptionBudget, NetworkPolicy, and its Service.
WEBHOOK = "rel-tpuslice-operator-webhook"
#: Kinds both the operator and the webhook have one of: unnamed, the operator's.
SPLIT_KINDS = (
    "ClusterRole",
    "ClusterRoleBinding",
    "Deployment",
    "Role",
    "RoleBinding",
    "PodDisruptionBudget",
    "NetworkPolicy",
    "ServiceAccount",
)


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    if name is None and kind in SPLIT_KINDS:
        name = OPERATOR_ROLE
    (found,) = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return found


def args_of(docs: list[dict[str, Any]], name: str = OPERATOR_ROLE) -> list[str]:
    """The first container's args of the operator's (or the webhook's) Deployment."""
    return list(one(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]["args"])


def test_cert_manager_webhook_configuration_is_the_operators() -> None:
    docs = render("--set", "webhook.certManager.enabled=true")
    chart = one(docs, "MutatingWebhookConfiguration")
    service = "rel-tpuslice-operator-webhook"
    assert service in {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    built = webhook_config.webhook_configuration(
        ca_bundle=b"x", service=webhook_config.ServiceRef(service, "ops")
    )
    assert chart["metadata"].pop("annotations") == {
        "cert-manager.io/inject-ca-from": "ops/rel-tpuslice-operator-webhook"
    }
    del built["webhooks"][0]["clientConfig"]["caBundle"]
    assert chart == built
    # the certificate names every host the operator's own certificate would
    cert = one(docs, "Certificate")
    assert cert["spec"]["dnsNames"] == webhookcerts.service_hosts(service, "ops")
    assert cert["spec"]["secretName"] == "rel-tpuslice-operator-webhook"
    args = args_of(docs, WEBHOOK)
    assert "--no-manage-webhook-configuration" in args
    assert "--webhook-cert-dir=/etc/tpuslice/webhook-certs" in args
    # the certificate is mounted into the webhook pods, not the operator's
    volumes = one(docs, "Deployment", WEBHOOK)["spec"]["template"]["spec"]["volumes"]
    assert {"name": "webhook-certs", "secret": {"secretName": "rel-tpuslice-operator-webhook"}} in (
        volumes
    )
    assert "webhook-certs" not in {
        v["name"] for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    }


def test_cert_manager_policy_webhook_configuration_is_the_operators() -> None:
    """The ValidatingWebhookConfiguration the chart renders with cert-manager is the one
    the operator applies otherwise, for both the default and a set timeout."""
    service = webhook_config.ServiceRef("rel-tpuslice-operator-webhook", "ops")
    for values, timeout in (([], 5), (["--set", "webhook.timeoutSeconds=12"], 12)):
        docs = render("--set", "webhook.certManager.enabled=true", *values)
        chart = one(docs, "ValidatingWebhookConfiguration")
        assert chart["metadata"].pop("annotations") == {
            "cert-manager.io/inject-ca-from": "ops/rel-tpuslice-operator-webhook"
        }
        built = webhook_config.policy_webhook_configuration(
            ca_bundle=b"x", service=service, timeout_seconds=timeout
        )
        del built["webhooks"][0]["clientConfig"]["caBundle"]
        assert chart == built
        assert chart["webhooks"][0]["failurePolicy"] == "Ignore"
    # webhook.failurePolicy is the identity webhook's alone: Fail there, Ignore here
    docs = render(
        "--set", "webhook.certManager.enabled=true", "--set", "webhook.failurePolicy=Fail"
    )
    assert one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Fail"
    assert one(docs, "ValidatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Ignore"


def test_default_install_lets_the_operator_manage_its_configuration() -> None:
    docs = render()
    assert not [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert not [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    args = args_of(docs, WEBHOOK)
    assert "--webhook-service=rel-tpuslice-operator-webhook" in args
    assert "--webhook-namespace=ops" in args
    assert "--no-manage-webhook-configuration" not in args
    rules = one(docs, "ClusterRole", WEBHOOK)["rules"]
    hook = [r for r in rules if "mutatingwebhookconfigurations" in r["resources"]]
    assert hook == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations"],
            "resourceNames": [
                webhook_config.webhook_configuration(ca_bundle=b"", url="https://x")["metadata"][
                    "name"
                ]
            ],
            "verbs": ["create", "patch"],
        }
    ]
    (policy_hook,) = [r for r in rules if "validatingwebhookconfigurations" in r["resources"]]
    assert policy_hook["resourceNames"] == [
        webhook_config.policy_webhook_configuration(ca_bundle=b"", url="https://x")["metadata"][
            "name"
        ]
    ]
    assert policy_hook["verbs"] == ["create", "patch"]


WEBHOOK_VALUES = [
    "--set",
    "webhook.timeoutSeconds=12",
    "--set",
    "webhook.failurePolicy=Ignore",
    "--set-json",
    'webhook.namespaceSelector={"matchLabels":{"tpu":"yes"},"matchExpressions":[]}',
]


@pytest.mark.parametrize("values", [[], WEBHOOK_VALUES], ids=["defaults", "set"])
def test_webhook_values_give_the_operator_and_cert_manager_one_configuration(
    values: list[str],
) -> None:
    """The operator's flags (from the values) build the configuration the cert-manager
    variant renders from the same values: whichever applies it, it is the same body."""
    from tpuslice.main.cli import _webhook_settings, build_parser

    args = args_of(render(*values), WEBHOOK)
    settings = _webhook_settings(build_parser().parse_args(["webhook", *args]))
    service = webhook_config.ServiceRef("rel-tpuslice-operator-webhook", "ops")
    built = webhook_config.webhook_configuration(
        ca_bundle=b"x",
        service=service,
        timeout_seconds=settings["webhook_timeout_seconds"],
        failure_policy=settings["webhook_failure_policy"],
        namespace_selector=settings["webhook_namespace_selector"],
    )
    del built["webhooks"][0]["clientConfig"]["caBundle"]
    chart = one(
        render("--set", "webhook.certManager.enabled=true", *values), "MutatingWebhookConfiguration"
    )
    del chart["metadata"]["annotations"]
    assert chart == built
    (hook,) = built["webhooks"]
    if values:
        assert (hook["timeoutSeconds"], hook["failurePolicy"]) == (12, "Ignore")
        assert hook["namespaceSelector"] == {"matchLabels": {"tpu": "yes"}, "matchExpressions": []}
    else:
        assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system"]


@pytest.mark.parametrize(
    "bad",
    [
        "webhook.timeoutSeconds=0",
        "webhook.timeoutSeconds=31",
        "webhook.failurePolicy=Maybe",
        "webhook.namespaceSelector.matchExpressions[0].operator=Is",
        "webhook.namespaceSelector.other=x",
    ],
)
def test_schema_rejects_bad_webhook_values(bad: str) -> None:
    done = subprocess.run(
        [str(HELM), "template", "rel", str(CHART), "--set", bad],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and "webhook" in done.stderr, done.stderr


EXPECTED_RULES = {
    ("tpuslice.dev", "tpusliceclusters"): {"list", "watch", "patch"},
    ("tpuslice.dev", "tpusliceclusters/status"): {"patch"},
    ("tpuslice.dev", "tpuslicejobs"): {"list", "watch", "patch"},
    ("tpuslice.dev", "tpuslicejobs/status"): {"patch"},
    ("tpuslice.dev", "tpusliceservices"): {"list", "watch", "patch"},
    ("tpuslice.dev", "tpusliceservices/status"): {"patch"},
    ("tpuslice.dev", "slicereservations"): {"get", "list", "watch", "create", "patch", "delete"},
    ("tpuslice.dev", "slicereservations/status"): {"patch"},
    ("ray.io", "rayclusters"): {"get", "list", "watch", "create", "patch", "delete"},
    ("ray.io", "rayjobs"): {"get", "list", "watch", "create", "patch", "delete"},
    ("ray.io", "rayservices"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "pods"): {"list", "watch", "patch", "delete"},
    ("autoscaling.x-k8s.io", "provisioningrequests"): {
        "list",
        "watch",
        "create",
        "patch",
        "delete",
    },
    ("", "podtemplates"): {"list", "watch", "create", "patch", "delete"},
    ("", "nodes"): {"list", "watch"},
    ("accelerator.gke.io", "slices"): {"list", "create", "delete"},
    **{
        ("kueue.x-k8s.io", kind): {"get", "list"}
        for kind in (
            "workloads",
            "localqueues",
            "clusterqueues",
            "admissionchecks",
            "provisioningrequestconfigs",
        )
    },
    ("tpuslice.dev", "tpuslicepolicies"): {"list", "watch"},
    ("", "namespaces"): {"list", "watch"},
    ("", "events"): {"create"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
}

#: The webhook pods' ClusterRole: the policy cache's reads and the configurations.
EXPECTED_WEBHOOK_RULES = {
    ("tpuslice.dev", "tpuslicepolicies"): {"list"},
    ("", "namespaces"): {"get"},
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): {"create", "patch"},
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): {"create", "patch"},
}


def granted(
    docs: list[dict[str, Any]], kind: str = "ClusterRole", name: str | None = None
) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in one(docs, kind, name)["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_roles_name_one_lease_and_one_secret_in_the_release_namespace() -> None:
    """The operator's Role: its Lease. The webhook's: the certificates' Secret."""
    docs = render()
    role = one(docs, "Role")
    assert role["metadata"]["namespace"] == "ops"
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["rel-tpuslice-operator"],
            "verbs": ["get", "update", "patch", "create"],
        },
    ]
    hook_role = one(docs, "Role", WEBHOOK)
    assert hook_role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["rel-tpuslice-operator-webhook-certs"],
            "verbs": ["get", "update"],
        },
    ]
    for name, account in ((OPERATOR_ROLE, OPERATOR_ROLE), (WEBHOOK, WEBHOOK)):
        binding = one(docs, "RoleBinding", name)
        assert binding["roleRef"]["name"] == name
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": "ops"}
        ]
        pod = one(docs, "Deployment", name)["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == account
        cluster_binding = one(docs, "ClusterRoleBinding", name)
        assert cluster_binding["roleRef"]["name"] == name
        assert cluster_binding["subjects"] == binding["subjects"]
    # the flags name the same objects
    args = args_of(docs)
    assert "--leader-elect-lease-name=rel-tpuslice-operator" in args
    assert "--leader-elect-namespace=ops" in args and "--leader-elect" in args
    assert "--webhook-port=0" in args  # the webhook pods serve the webhooks
    assert not [a for a in args if a.startswith("--webhook-secret")]
    assert "--webhook-secret=rel-tpuslice-operator-webhook-certs" in args_of(docs, WEBHOOK)
    # the Secret is rendered empty (the first replica fills it; uninstall deletes it)
    secret = one(docs, "Secret")
    assert secret["metadata"]["name"] == "rel-tpuslice-operator-webhook-certs"
    assert "data" not in secret and "stringData" not in secret
    # cert-manager: no Secret of ours, no Secret access; the Lease stays
    with_cm = render("--set", "webhook.certManager.enabled=true")
    assert not [d for d in with_cm if d["kind"] == "Secret"]
    assert [d["metadata"]["name"] for d in with_cm if d["kind"] == "Role"] == [OPERATOR_ROLE]
    # without leader election (one replica): --no-leader-elect, no Lease access
    alone = render("--set", "leaderElection.enabled=false", "--set", "replicaCount=1")
    args = args_of(alone)
    assert "--no-leader-elect" in args and "--leader-elect" not in args
    assert [d["metadata"]["name"] for d in alone if d["kind"] == "Role"] == [WEBHOOK]
    assert not [
        d
        for d in render(
            "--set", "leaderElection.enabled=false", "--set", "webhook.certManager.enabled=true"
        )
        if d["kind"] == "Role"
    ]


def test_cluster_role_is_the_reviewed_least_privilege() -> None:
    docs = render()
    rules = one(docs, "ClusterRole")["rules"]
    assert all("*" not in r["verbs"] + r["resources"] + r["apiGroups"] for r in rules)
    assert granted(docs) == EXPECTED_RULES
    assert granted(docs, "ClusterRole", WEBHOOK) == EXPECTED_WEBHOOK_RULES
    for name in (OPERATOR_ROLE, WEBHOOK):  # never cluster-wide
        assert not any(r == "secrets" for _, r in granted(docs, "ClusterRole", name))
    # with cert-manager the webhook never touches webhook configurations
    with_cm = granted(render("--set", "webhook.certManager.enabled=true"), "ClusterRole", WEBHOOK)
    assert with_cm == {
        ("tpuslice.dev", "tpuslicepolicies"): {"list"},
        ("", "namespaces"): {"get"},
    }
    # no webhook, no webhook ServiceAccount, roles or pods
    off = render("--set", "webhook.enabled=false")
    assert not [d for d in off if WEBHOOK in d["metadata"]["name"]]


VERB = {
    "POST": {"create"},
    "PATCH": {"patch"},
    "PUT": {"update"},
    "DELETE": {"delete"},
    "GET": {"get", "list"},
}


def test_pin_at_admission_lets_the_webhook_watch_and_read_reservations_only() -> None:
    """The pin lookup lists and watches the SliceReservations and reads one live."""
    docs = render("--set", "webhook.pinAtAdmission=true")
    rules = granted(docs, "ClusterRole", WEBHOOK)
    assert rules.pop(("tpuslice.dev", "slicereservations")) == {"get", "list", "watch"}
    assert rules == EXPECTED_WEBHOOK_RULES


def test_cluster_role_covers_every_call_in_kube_py() -> None:
    """kube.py is the one module that talks to the API server: each of its calls
    (method and resource) must be granted, or the operator fails in a real cluster."""
    source = (ROOT / "operator" / "tpuslice" / "runtime" / "kube.py").read_text()
    found = re.findall(
        r'self\.call(?:_sync)?\(\s*"(\w+)",(?:(?!self\.call).)*?resource=(f?"[^"]+"|\w+)',
        source,
        flags=re.DOTALL,
    )
    # A call whose resource is the variable ``plural`` is made for each of KubeRay's
    # kinds (apply_ray, get_ray, delete_ray) or, with "/status", each of ours.
    expand = {
        "plural": ["rayclusters", "rayjobs", "rayservices"],
        'f"{plural}/status"': [
            f"{p}/status" for p in ("tpusliceclusters", "tpuslicejobs", "tpusliceservices")
        ],
    }
    # ``read_kueue`` reads Kueue's objects (controller/kueue.py), only these
    expand["kueue_plural"] = [
        "workloads",
        "localqueues",
        "clusterqueues",
        "admissionchecks",
        "provisioningrequestconfigs",
    ]
    # ``_delete(path, resource, ...)`` is the one DELETE: its own call names the variable
    # ``resource``, and each caller names the resource it deletes.
    expand["resource"] = []
    deletes = re.findall(r'self\._delete\(\s*(?:[^,()]|\([^()]*\))+,\s*("[^"]+"|\w+)', source)
    found += [("DELETE", resource) for resource in deletes]
    calls = [
        (method, name)
        for method, resource in found
        for name in expand.get(resource, [resource.strip('"')])
    ]
    assert len(calls) >= 15, calls
    assert ("PUT", "leases") in calls and ("PUT", "secrets") in calls
    docs = render()
    by_resource: dict[str, set[str]] = {}
    for kind, name in (
        ("ClusterRole", OPERATOR_ROLE),
        ("Role", OPERATOR_ROLE),
        ("ClusterRole", WEBHOOK),
        ("Role", WEBHOOK),
    ):
        for (_, resource), verbs in granted(docs, kind, name).items():
            by_resource.setdefault(resource, set()).update(verbs)
    for method, resource in calls:
        assert resource in by_resource, f"{method} {resource} not in the ClusterRole"
        assert VERB[method] & by_resource[resource], f"{method} {resource}: {by_resource[resource]}"
    # and the kinds follow.py lists and watches itself (not through self.call)
    for kind in followed_kinds([""]):
        verbs = by_resource.get(kind.plural, set())
        assert {"list", "watch"} <= verbs, f"list+watch {kind.plural}: {verbs}"


@pytest.mark.parametrize("name", [OPERATOR_ROLE, WEBHOOK], ids=["operator", "webhook"])
def test_deployment_is_restricted_two_replicas_rolling_without_unavailability(name: str) -> None:
    docs = render()
    deployment = one(docs, "Deployment", name)
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    pod = spec["template"]["spec"]
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    pdb = one(docs, "PodDisruptionBudget", name)
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    replicas = "replicaCount" if name == OPERATOR_ROLE else "webhook.replicaCount"
    single = render("--set", f"{replicas}=1", "--set", "spreadAcrossNodes=false")
    assert [d["metadata"]["name"] for d in single if d["kind"] == "PodDisruptionBudget"] == [
        OPERATOR_ROLE if name == WEBHOOK else WEBHOOK  # each Deployment's replicas its own
    ]
    assert (
        "topologySpreadConstraints"
        not in one(single, "Deployment", name)["spec"]["template"]["spec"]
    )
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # kopf's identity comes from the pod name, never from the user name (uid 65532 has none)
    env = {
        e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        for e in container["env"]
    }
    assert env["POD_NAME"] == "metadata.name"
    assert container["resources"]["limits"]["memory"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert "--metrics-port=8000" in container["args"]
    if name == OPERATOR_ROLE:
        assert "command" not in container  # the image's entry point, `tpuslice run`
        assert ports == {"health": 8080, "metrics": 8000}
        return
    assert container["command"] == ["tpuslice", "webhook"]
    # the cert dir (/tmp/tpuslice-webhook, the CLI default) is on a writable emptyDir
    assert "--webhook-cert-dir=/tmp/tpuslice-webhook" in container["args"]
    assert ports == {"health": 8080, "webhook": 9443, "metrics": 8000}
    # a memory limit of its own: a flood OOM-kills a webhook pod, never the leader
    assert container["resources"] != container_of(docs)["resources"]
    # the pods of each Deployment are selected by the other's selector never
    operator_pods = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    webhook_pods = spec["template"]["metadata"]["labels"]
    operator_selector = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert not operator_selector.items() <= webhook_pods.items()
    assert not spec["selector"]["matchLabels"].items() <= operator_pods.items()
    service = one(docs, "Service", WEBHOOK)
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]


def test_every_flag_the_chart_passes_exists_in_the_cli() -> None:
    from tpuslice.main.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    known = {
        name: {opt for action in commands[command]._actions for opt in action.option_strings}
        for name, command in ((OPERATOR_ROLE, "run"), (WEBHOOK, "webhook"))
    }
    for variant in (
        (),
        ("--set", "webhook.certManager.enabled=true"),
        ("--set", "metrics.enabled=false"),
        ("--set", "leaderElection.enabled=false"),
        ("--set", "metrics.bindAddress=127.0.0.1"),
    ):
        docs = render(*variant)
        for name, flags in known.items():
            for arg in args_of(docs, name):
                assert arg.split("=", 1)[0] in flags, arg


def test_service_monitor_is_optional() -> None:
    assert not [d for d in render() if d["kind"] == "ServiceMonitor"]
    monitor = one(render("--set", "metrics.serviceMonitor.enabled=true"), "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_schema_rejects_unknown_and_bad_values() -> None:
    for bad in (
        "operator.logLevel=LOUD",
        "webhok.enabled=true",
        "webhook.port=443",
        "replicaCount=0",
        "leaderElection.lease=x",
        "limits.maxSlicesPerObject=0",
        "limits.maxHostsPerObject=70000",
        "operator.statusBatchSeconds=301",
        "operator.statusBatchSeconds=0.5",
    ):
        done = subprocess.run(
            [str(HELM), "template", "rel", str(CHART), "--set", bad],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode != 0, bad


def test_lint_is_clean() -> None:
    for variant in (
        (),
        ("--set", "webhook.certManager.enabled=true"),
        ("--set", "networkPolicy.enabled=true"),
    ):
        done = subprocess.run(
            [str(HELM), "lint", "--strict", str(CHART), *variant],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout


def test_manifests_are_the_chart_rendered() -> None:
    import os
    import sys

    done = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "render_manifests.py"), "--check"],
        capture_output=True,
        text=True,
        env={**os.environ, "HELM": str(HELM)},
        check=False,
    )
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- a shared cluster
def container_of(docs: list[dict[str, Any]], name: str = OPERATOR_ROLE) -> dict[str, Any]:
    (container,) = one(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"]
    return container


def helm_fails(*args: str) -> str:
    """stderr of a `helm template` that must fail."""
    done = subprocess.run(
        [str(HELM), "template", "rel", str(CHART), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0, args
    return done.stderr


def test_network_policy_is_off_by_default() -> None:
    assert not [d for d in render() if d["kind"] == "NetworkPolicy"]


def test_network_policy_admits_the_control_plane_to_the_webhook_and_monitoring_to_metrics() -> None:
    docs = render(
        "--set",
        "networkPolicy.enabled=true",
        "--set-json",
        'networkPolicy.webhookFrom=[{"ipBlock":{"cidr":"172.16.0.0/28"}}]',
        "--set-json",
        'networkPolicy.apiServerTo=[{"ipBlock":{"cidr":"10.0.0.2/32"}}]',
    )
    policy = one(docs, "NetworkPolicy", WEBHOOK)
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == "ops"
    assert spec["podSelector"] == one(docs, "Deployment", WEBHOOK)["spec"]["selector"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    ports = {p["name"]: p["containerPort"] for p in container_of(docs, WEBHOOK)["ports"]}
    webhook, metrics = spec["ingress"]
    assert webhook == {
        "ports": [{"port": ports["webhook"], "protocol": "TCP"}],
        "from": [{"ipBlock": {"cidr": "172.16.0.0/28"}}],
    }
    # by name: the operator's own port, or a proxy sidecar's of that name
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert metrics["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    # no rule names the probe port: the kubelet probes from the pod's own node
    opened = {p["port"] for rule in spec["ingress"] for p in rule["ports"]}
    assert ports["health"] not in opened and "health" not in opened
    api, dns = spec["egress"]
    assert api == {
        "ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}],
        "to": [{"ipBlock": {"cidr": "10.0.0.2/32"}}],
    }
    assert dns == {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    # the operator pods: only metrics in, the same egress
    operator = one(docs, "NetworkPolicy")["spec"]
    assert operator["podSelector"] == one(docs, "Deployment")["spec"]["selector"]
    assert operator["ingress"] == [metrics] and operator["egress"] == spec["egress"]
    # without peers the webhook and API-server rules name only ports
    bare = one(render("--set", "networkPolicy.enabled=true"), "NetworkPolicy", WEBHOOK)["spec"]
    assert "from" not in bare["ingress"][0] and "to" not in bare["egress"][0]
    # no webhook, no metrics: no ingress rule at all (nothing may connect)
    closed = one(
        render(
            "--set",
            "networkPolicy.enabled=true",
            "--set",
            "webhook.enabled=false",
            "--set",
            "metrics.enabled=false",
        ),
        "NetworkPolicy",
    )["spec"]
    assert not closed["ingress"]


def test_network_policy_peers_are_validated() -> None:
    for bad in (
        'networkPolicy.webhookFrom=[{"ipBlock":{}}]',
        'networkPolicy.webhookFrom=[{"cidr":"172.16.0.0/28"}]',
        "networkPolicy.apiServerPorts=[]",
    ):
        assert "/networkPolicy/" in helm_fails(
            "--set", "networkPolicy.enabled=true", "--set-json", bad
        )


def test_metrics_served_on_the_pod_ip_or_on_loopback_for_a_proxy() -> None:
    container = container_of(render())
    assert "--metrics-addr=0.0.0.0" in container["args"]
    assert {"name": "metrics", "containerPort": 8000, "protocol": "TCP"} in container["ports"]
    proxy = {
        "name": "metrics-proxy",
        "image": "quay.io/brancz/kube-rbac-proxy:v0.19.1",
        "ports": [{"name": "metrics", "containerPort": 8443}],
    }
    docs = render(
        "--set",
        "metrics.bindAddress=127.0.0.1",
        "--set-json",
        f"extraContainers=[{json.dumps(proxy)}]",
    )
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    operator, sidecar = pod["containers"]
    assert "--metrics-addr=127.0.0.1" in operator["args"]
    # no pod-IP metrics port of the operator's: the Service reaches the proxy's port by name
    assert "metrics" not in {p["name"] for p in operator["ports"]}
    assert sidecar == proxy
    service = one(docs, "Service", "rel-tpuslice-operator-metrics")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert "--metrics-addr=::1" in container_of(render("--set", "metrics.bindAddress=::1"))["args"]
    assert "/metrics/bindAddress" in helm_fails("--set", "metrics.bindAddress=10.0.0.1")
    # metrics off: neither flag value nor port
    off = container_of(render("--set", "metrics.enabled=false"))
    assert "--metrics-port=0" in off["args"]
    assert not [a for a in off["args"] if a.startswith("--metrics-addr")]


def test_probes_have_a_port_of_their_own() -> None:
    container = container_of(render(), WEBHOOK)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["livenessProbe"]["httpGet"]["port"] == "health"
    assert container["readinessProbe"]["httpGet"]["port"] == "health"
    assert len(set(ports.values())) == len(ports) == 3
    assert "--liveness-port=8080" in container["args"]
    assert "operator.healthPort and webhook.port" in helm_fails("--set", "operator.healthPort=9443")
    assert "operator.healthPort and metrics.port" in helm_fails("--set", "metrics.port=8080")
    assert "webhook.port and metrics.port" in helm_fails("--set", "metrics.port=9443")


def mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(quantity[:-2]) * units[quantity[-2:]]


def test_resources_bound_ephemeral_storage_by_default() -> None:
    docs = render()
    resources = container_of(docs)["resources"]
    request = mebibytes(resources["requests"]["ephemeral-storage"])
    limit = mebibytes(resources["limits"]["ephemeral-storage"])
    assert 0 < request <= limit
    # room for the kubelet's default log rotation (5 files of 10 MiB) and the /tmp emptyDir
    (tmp,) = [
        v
        for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "tmp"
    ]
    assert limit >= 5 * 10 + mebibytes(tmp["emptyDir"]["sizeLimit"])


DIGEST = "sha256:" + "0123456789abcdef" * 4


def test_image_digest_replaces_the_tag() -> None:
    assert container_of(render())["image"] == "tpuslice-operator:0.1.0"
    assert container_of(render("--set", "image.tag=v2"))["image"] == "tpuslice-operator:v2"
    pinned = render("--set", f"image.digest={DIGEST}", "--set", "image.tag=v2")
    assert container_of(pinned)["image"] == f"tpuslice-operator@{DIGEST}"
    for bad in (
        "sha256:abc",
        DIGEST.upper().replace("SHA256", "sha256"),
        "latest",
        "md5:" + "0" * 64,
    ):
        assert "image/digest" in helm_fails("--set", f"image.digest={bad}")


NAMESPACED_KINDS = ("tpusliceclusters", "tpuslicejobs", "tpusliceservices")


def test_aggregated_roles_let_namespace_users_view_and_edit_the_three_kinds() -> None:
    docs = render()
    view = one(docs, "ClusterRole", "tpuslice-view")
    edit = one(docs, "ClusterRole", "tpuslice-edit")
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert view["metadata"]["labels"][aggregate + "view"] == "true"
    assert edit["metadata"]["labels"][aggregate + "edit"] == "true"
    assert edit["metadata"]["labels"][aggregate + "admin"] == "true"
    assert aggregate + "edit" not in view["metadata"]["labels"]  # view reaches edit through `view`
    read = {"get", "list", "watch"}
    assert granted(docs, "ClusterRole", "tpuslice-view") == {
        **{("tpuslice.dev", k): read for k in NAMESPACED_KINDS},
        **{("tpuslice.dev", f"{k}/status"): read for k in NAMESPACED_KINDS},
    }
    write = {"create", "update", "patch", "delete", "deletecollection"}
    assert granted(docs, "ClusterRole", "tpuslice-edit") == {
        ("tpuslice.dev", k): read | write for k in NAMESPACED_KINDS
    }
    # status is the operator's; reservations are in neither role
    for role in ("tpuslice-view", "tpuslice-edit"):
        resources = {r for _, r in granted(docs, "ClusterRole", role)}
        assert not any(r.startswith("slicereservations") for r in resources)
    assert not [
        d
        for variant in ("rbac.aggregatedRoles=false", "rbac.create=false")
        for d in render("--set", variant)
        if d["kind"] == "ClusterRole" and d["metadata"]["name"].startswith("tpuslice-")
    ]


def admitted(policy: dict[str, Any], username: str) -> bool:
    """The policy's validations for a request by ``username`` (CEL, as the API server runs them)."""
    import celpy

    env = celpy.Environment()
    request = celpy.json_to_cel({"userInfo": {"username": username}, "operation": "DELETE"})
    return all(
        bool(env.program(env.compile(v["expression"])).evaluate({"request": request}))
        for v in policy["spec"]["validations"]
    )


def test_reservations_are_written_only_by_the_operator() -> None:
    docs = render()
    policy = one(docs, "ValidatingAdmissionPolicy")
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["tpuslice.dev"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    assert set(rule["resources"]) == {"slicereservations", "slicereservations/status"}
    # the operator's ServiceAccount, as the Deployment runs it, may; so may the
    # garbage collector and the namespace controller; an admin or a tenant may not
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    operator = f"system:serviceaccount:ops:{pod['serviceAccountName']}"
    for user in (
        operator,
        "system:serviceaccount:kube-system:generic-garbage-collector",
        "system:serviceaccount:kube-system:namespace-controller",
    ):
        assert admitted(policy, user), user
    for user in ("kubernetes-admin", "system:serviceaccount:ml:default", operator + "x"):
        assert not admitted(policy, user), user
    (validation,) = policy["spec"]["validations"]
    assert validation["reason"] == "Forbidden"
    assert operator in validation["message"] and "\n" not in validation["message"]
    # a ServiceAccount of the user's own, and extra writers
    own = one(
        render(
            "--set",
            "serviceAccount.create=false",
            "--set",
            "serviceAccount.name=ops-sa",
            "--set",
            "serviceAccount.webhookName=ops-hook-sa",
            "--set-json",
            'reservationGuard.extraWriters=["alice@example.com"]',
        ),
        "ValidatingAdmissionPolicy",
    )
    assert admitted(own, "system:serviceaccount:ops:ops-sa")
    assert not admitted(own, "system:serviceaccount:ops:ops-hook-sa")  # the webhook's
    assert admitted(own, "alice@example.com")
    assert not admitted(own, operator)
    assert "alice@example.com" in own["spec"]["validations"][0]["message"]
    off = render("--set", "reservationGuard.enabled=false")
    assert not [d for d in off if d["kind"].startswith("ValidatingAdmissionPolicy")]
    # a writer cannot break out of the CEL list; the list is bounded
    injected = 'reservationGuard.extraWriters=["a\\"] || true || [\\"b"]'
    assert "/reservationGuard/extraWriters/0" in helm_fails("--set-json", injected)
    many = f"reservationGuard.extraWriters={json.dumps([str(i) for i in range(17)])}"
    assert "/reservationGuard/extraWriters" in helm_fails("--set-json", many)
