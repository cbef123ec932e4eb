"""The Helm chart, rendered by the real `helm template` (`make test-unit` builds helm first).

What is pinned here: the chart's cert-manager MutatingWebhookConfiguration is
the one the operator builds (webhook.webhook_configuration) apart from caBundle;
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
from tpuslice import webhook
from tpuslice.watches import followed_kinds

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
    built = webhook.webhook_configuration(
        ca_bundle=b"x", service=webhook.ServiceRef(service, "ops")
    )
    assert chart["metadata"].pop("annotations") == {
        "cert-manager.io/inject-ca-from": "ops/rel-tpuslice-operator-webhook"
    }
    del built["webhooks"][0]["clientConfig"]["caBundle"]
    assert chart == built
    # the certificate names every host the operator's own certificate would
    cert = one(docs, "Certificate")
    assert cert["spec"]["dnsNames"] == webhook.service_hosts(service, "ops")
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
                webhook.webhook_configuration(ca_bundle=b"", url="https://x")["metadata"]["name"]
            ],
            "verbs": ["create", "patch"],
        }
    ]


EXPECTED_RULES = {
    ("tpuslice.dev", "tpusliceclusters"): {"list", "watch", "patch"},
    ("tpuslice.dev", "tpusliceclusters/status"): {"patch"},
    ("tpuslice.dev", "slicereservations"): {"get", "list", "watch", "create", "patch", "delete"},
    ("tpuslice.dev", "slicereservations/status"): {"patch"},
    ("ray.io", "rayclusters"): {"list", "watch", "create", "patch", "delete"},
    ("", "pods"): {"list", "watch", "patch"},
    ("", "nodes"): {"list", "watch"},
    ("", "events"): {"create"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): {"create", "patch"},
}


def granted(docs: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in one(docs, "ClusterRole")["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_cluster_role_is_the_reviewed_least_privilege() -> None:
    docs = render()
    rules = one(docs, "ClusterRole")["rules"]
    assert all("*" not in r["verbs"] + r["resources"] + r["apiGroups"] for r in rules)
    assert granted(docs) == EXPECTED_RULES
    assert not any(resource == "secrets" for _, resource in granted(docs))
    # with cert-manager the operator never touches webhook configurations
    with_cm = granted(render("--set", "webhook.certManager.enabled=true"))
    assert ("admissionregistration.k8s.io", "mutatingwebhookconfigurations") not in with_cm


VERB = {"POST": {"create"}, "PATCH": {"patch"}, "DELETE": {"delete"}, "GET": {"get", "list"}}


def test_cluster_role_covers_every_call_in_kube_py() -> None:
    """kube.py is the one module that talks to the API server: each of its calls
    (method and resource) must be granted, or the operator fails in a real cluster."""
    source = (ROOT / "operator" / "tpuslice" / "kube.py").read_text()
    calls = re.findall(r'self\.call\(\s*"(\w+)",.*?resource="([^"]+)"', source, flags=re.DOTALL)
    assert len(calls) >= 10, calls
    rules = granted(render())
    by_resource = {resource: verbs for (_, resource), verbs in rules.items()}
    for method, resource in calls:
        assert resource in by_resource, f"{method} {resource} not in the ClusterRole"
        assert VERB[method] & by_resource[resource], f"{method} {resource}: {by_resource[resource]}"
    # and the kinds watches.py lists and watches itself (not through self.call)
    for kind in followed_kinds([""]):
        verbs = by_resource.get(kind.plural, set())
        assert {"list", "watch"} <= verbs, f"list+watch {kind.plural}: {verbs}"


def test_deployment_is_restricted_single_replica_recreate() -> None:
    deployment = one(render(), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
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
    from tpuslice.cli import build_parser

    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    known = {opt for action in run._actions for opt in action.option_strings}
    for variant in (
        (),
        ("--set", "webhook.certManager.enabled=true"),
        ("--set", "metrics.enabled=false"),
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
    for bad in ("operator.logLevel=LOUD", "webhok.enabled=true", "webhook.port=443"):
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
