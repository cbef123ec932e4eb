"""The Helm chart, rendered by the real `helm template` (`make test-unit` builds helm first).

What is pinned here: the chart's cert-manager MutatingWebhookConfiguration is
the one the operator builds (webhook_config.webhook_configuration) apart from caBundle;
the ClusterRole covers every call in kube.py and nothing beyond the reviewed
list; the Deployment meets Pod Security "restricted"; manifests/ has not
drifted. The e2e tier (tests/e2e/test_chart.py) installs the chart and runs the
operator with its ServiceAccount.
"""

from __future__ import annotations

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


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


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
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-manage-webhook-configuration" in args
    assert "--webhook-cert-dir=/etc/tpuslice/webhook-certs" in args


def test_default_install_lets_the_operator_manage_its_configuration() -> None:
    docs = render()
    assert not [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--webhook-service=rel-tpuslice-operator-webhook" in args
    assert "--webhook-namespace=ops" in args
    assert "--no-manage-webhook-configuration" not in args
    rules = one(docs, "ClusterRole")["rules"]
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

    args = one(render(*values), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    settings = _webhook_settings(build_parser().parse_args(["run", *args]))
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
    ("", "events"): {"create"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): {"create", "patch"},
}


def granted(
    docs: list[dict[str, Any]], kind: str = "ClusterRole"
) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in one(docs, kind)["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_role_names_one_lease_and_one_secret_in_the_release_namespace() -> None:
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
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["rel-tpuslice-operator-webhook-certs"],
            "verbs": ["get", "update"],
        },
    ]
    binding = one(docs, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rel-tpuslice-operator", "namespace": "ops"}
    ]
    # the flags name the same objects
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-elect-lease-name=rel-tpuslice-operator" in args
    assert "--leader-elect-namespace=ops" in args and "--leader-elect" in args
    assert "--webhook-secret=rel-tpuslice-operator-webhook-certs" in args
    # the Secret is rendered empty (the first replica fills it; uninstall deletes it)
    secret = one(docs, "Secret")
    assert secret["metadata"]["name"] == "rel-tpuslice-operator-webhook-certs"
    assert "data" not in secret and "stringData" not in secret
    # cert-manager: no Secret of ours, no Secret access; the Lease stays
    with_cm = render("--set", "webhook.certManager.enabled=true")
    assert not [d for d in with_cm if d["kind"] == "Secret"]
    assert granted(with_cm, "Role") == {
        ("coordination.k8s.io", "leases"): {"get", "update", "patch", "create"}
    }
    # without leader election (one replica): --no-leader-elect, no Lease access
    alone = render("--set", "leaderElection.enabled=false", "--set", "replicaCount=1")
    args = one(alone, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-leader-elect" in args and "--leader-elect" not in args
    assert granted(alone, "Role") == {("", "secrets"): {"get", "update"}}
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
    assert not any(resource == "secrets" for _, resource in granted(docs))  # cluster-wide
    # with cert-manager the operator never touches webhook configurations
    with_cm = granted(render("--set", "webhook.certManager.enabled=true"))
    assert ("admissionregistration.k8s.io", "mutatingwebhookconfigurations") not in with_cm


VERB = {
    "POST": {"create"},
    "PATCH": {"patch"},
    "PUT": {"update"},
    "DELETE": {"delete"},
    "GET": {"get", "list"},
}


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
    calls = [
        (method, name)
        for method, resource in found
        for name in expand.get(resource, [resource.strip('"')])
    ]
    assert len(calls) >= 15, calls
    assert ("PUT", "leases") in calls and ("PUT", "secrets") in calls
    docs = render()
    rules = {**granted(docs), **granted(docs, "Role")}
    by_resource = {resource: verbs for (_, resource), verbs in rules.items()}
    for method, resource in calls:
        assert resource in by_resource, f"{method} {resource} not in the ClusterRole"
        assert VERB[method] & by_resource[resource], f"{method} {resource}: {by_resource[resource]}"
    # and the kinds follow.py lists and watches itself (not through self.call)
    for kind in followed_kinds([""]):
        verbs = by_resource.get(kind.plural, set())
        assert {"list", "watch"} <= verbs, f"list+watch {kind.plural}: {verbs}"


def test_deployment_is_restricted_two_replicas_rolling_without_unavailability() -> None:
    docs = render()
    deployment = one(docs, "Deployment")
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
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    single = render("--set", "replicaCount=1", "--set", "spreadAcrossNodes=false")
    assert not [d for d in single if d["kind"] == "PodDisruptionBudget"]
    assert "topologySpreadConstraints" not in one(single, "Deployment")["spec"]["template"]["spec"]
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
    # the cert dir (/tmp/tpuslice-webhook, the CLI default) is on a writable emptyDir
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert "--webhook-cert-dir=/tmp/tpuslice-webhook" in container["args"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "webhook": 9443, "metrics": 8000}
    assert "--metrics-port=8000" in container["args"]


def test_every_flag_the_chart_passes_exists_in_the_cli() -> None:
    from tpuslice.main.cli import build_parser

    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    known = {opt for action in run._actions for opt in action.option_strings}
    for variant in (
        (),
        ("--set", "webhook.certManager.enabled=true"),
        ("--set", "metrics.enabled=false"),
        ("--set", "leaderElection.enabled=false"),
    ):
        args = one(render(*variant), "Deployment")["spec"]["template"]["spec"]["containers"][0][
            "args"
        ]
        for arg in args:
            assert arg.split("=", 1)[0] in known, arg


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
    ):
        done = subprocess.run(
            [str(HELM), "template", "rel", str(CHART), "--set", bad],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode != 0, bad


def test_lint_is_clean() -> None:
    for variant in ((), ("--set", "webhook.certManager.enabled=true")):
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
