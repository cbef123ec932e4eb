"""The identity webhook: configuration builder, certificates, and kopf's admission path.

The last tests run kopf's real admission machinery (its WebhookServer over TLS
with our certificate, its request routing and JSON-patch diffing) in-process,
without an API server; they use two kopf internals (``serve_admission_request``
and the Insights/memories it needs), pinned by ``kopf<2`` in pyproject.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import functools
import json
import socket
import ssl
import stat
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonpatch
import kopf
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from kopf._cogs.structs import references
from kopf._core.engines import admission, indexing
from kopf._core.reactor import inventory

from tests.unit.test_identity import kuberay_pod, render_worker_template
from tpuslice import constants as c
from tpuslice import webhook
from tpuslice.identity import mutate_pod

CA = base64.b64encode(b"ca-pem").decode()


def test_configuration_by_url() -> None:
    cfg = webhook.webhook_configuration(ca_bundle=b"ca-pem", url="https://127.0.0.1:9443/")
    assert cfg["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert cfg["kind"] == "MutatingWebhookConfiguration"
    assert cfg["metadata"]["name"] == "tpuslice-identity"
    (hook,) = cfg["webhooks"]
    assert hook["name"] == "identity.tpuslice.dev"
    assert hook["clientConfig"] == {
        "caBundle": CA,
        "url": "https://127.0.0.1:9443/tpuslice-identity",
    }
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "operations": ["CREATE"],
            "scope": "Namespaced",
        }
    ]
    assert hook["objectSelector"] == {
        "matchExpressions": [{"key": "tpuslice.dev/cluster", "operator": "Exists"}]
    }
    assert "namespaceSelector" not in hook, "our pods may live in any namespace"
    assert hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "None"
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["timeoutSeconds"] == 5
    assert hook["admissionReviewVersions"] == ["v1"]


def test_configuration_by_service() -> None:
    cfg = webhook.webhook_configuration(
        ca_bundle=b"ca-pem",
        service=webhook.ServiceRef("tpuslice-operator", "tpuslice-system", 8443),
        timeout_seconds=3,
        name="other",
    )
    (hook,) = cfg["webhooks"]
    assert cfg["metadata"]["name"] == "other"
    assert hook["timeoutSeconds"] == 3
    assert hook["clientConfig"] == {
        "caBundle": CA,
        "service": {
            "name": "tpuslice-operator",
            "namespace": "tpuslice-system",
            "port": 8443,
            "path": "/tpuslice-identity",
        },
    }


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"url": "https://x", "service": webhook.ServiceRef("a", "b")},
        {"url": "http://127.0.0.1:9443"},
        {"url": "https://x", "timeout_seconds": 31},
        {"url": "https://x", "timeout_seconds": 0},
    ],
)
def test_configuration_rejects_bad_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        webhook.webhook_configuration(ca_bundle=b"x", **kwargs)


def test_certificates_chain_and_names(tmp_path: Path) -> None:
    hosts = [*webhook.service_hosts("op", "ns"), "127.0.0.1"]
    bundle = webhook.build_certificates(hosts, valid_days=30)
    ca = x509.load_pem_x509_certificate(bundle.ca_pem)
    cert = x509.load_pem_x509_certificate(bundle.cert_pem)
    key = serialization.load_pem_private_key(bundle.key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)

    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [
        "op",
        "op.ns",
        "op.ns.svc",
        "op.ns.svc.cluster.local",
    ]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.public_key() == key.public_key()
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert datetime.timedelta(days=30) <= lifetime < datetime.timedelta(days=31)

    files = webhook.write_certificates(bundle, tmp_path / "certs")
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    assert files.ca_bundle() == bundle.ca_pem
    # This machine's OpenSSL 3 loads them (kopf's own generator fails here).
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(files.cert, files.key)
    client = ssl.create_default_context(cafile=str(files.ca))
    assert client.verify_mode == ssl.CERT_REQUIRED


def test_certificates_need_a_host() -> None:
    with pytest.raises(ValueError):
        webhook.build_certificates([])


def test_register_filters_our_pods_on_create() -> None:
    registry = kopf.OperatorRegistry()
    webhook.register_identity_webhook(registry)
    (handler,) = registry._webhooks.get_all_handlers()
    pods = references.Resource(group="", version="v1", plural="pods", namespaced=True)
    assert handler.selector is not None and handler.selector.check(pods)
    assert handler.id == webhook.HANDLER_ID
    assert handler.operations == ["CREATE"]
    assert handler.labels == {c.LABEL_CLUSTER: kopf.PRESENT}


# ------------------------------------------------------------ kopf admission over TLS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _review(pod: dict[str, Any], uid: str = "u1") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:ray-system:kuberay-operator"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "object": pod,
        },
    }


def _admit_over_tls(tmp_path: Path, reviews: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Serve our registered handler with kopf's WebhookServer and post the reviews to it."""
    registry = kopf.OperatorRegistry()
    webhook.register_identity_webhook(registry)
    insights = references.Insights()
    insights.webhook_resources.add(
        references.Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
    )
    serve: Callable[..., Any] = functools.partial(
        admission.serve_admission_request,
        settings=kopf.OperatorSettings(),
        registry=registry,
        insights=insights,
        memories=inventory.ResourceMemories(),
        memobase=kopf.Memo(),
        indices=indexing.OperatorIndexers().indices,
    )
    files = webhook.write_certificates(
        webhook.build_certificates(["localhost", "127.0.0.1"]), tmp_path
    )
    server = webhook.webhook_server(files, port=_free_port(), addr="127.0.0.1", host="127.0.0.1")
    config = webhook.webhook_configuration(ca_bundle=files.ca_bundle(), url="https://127.0.0.1")

    async def run() -> list[dict[str, Any]]:
        async for client_config in server(serve):
            # The URL our configuration would give the API server, with the real port.
            url = config["webhooks"][0]["clientConfig"]["url"].replace(
                "https://127.0.0.1", client_config["url"]
            )
            ca = base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"]).decode()
            context = ssl.create_default_context(cadata=ca)

            def post(
                review: dict[str, Any], url: str = url, context: ssl.SSLContext = context
            ) -> dict[str, Any]:
                request = urllib.request.Request(
                    url, json.dumps(review).encode(), {"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(request, context=context, timeout=10) as response:
                    return dict(json.load(response))

            return [await asyncio.to_thread(post, review) for review in reviews]
        raise AssertionError("the webhook server did not start")

    return asyncio.run(asyncio.wait_for(run(), timeout=30))


def _patched(pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    if "patch" not in response["response"]:
        return pod
    assert response["response"]["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["response"]["patch"]))
    return dict(jsonpatch.apply_patch(pod, ops))


def test_kopf_admission_patch_reinvocation_and_refusal(tmp_path: Path) -> None:
    template, hosts = render_worker_template("v6e", "4x4", slices=2)
    pod = kuberay_pod(template, hosts, replica=1, host=2)
    template["spec"]["containers"][0]["env"] = [{"name": "TPU_NAME", "value": "mine"}]
    user_pod = kuberay_pod(template, hosts, replica=0, host=0)
    no_gate = kuberay_pod(template, hosts, replica=0, host=1)
    del no_gate["metadata"]["labels"][c.KUBERAY_LABEL_HOST_INDEX]
    expected = mutate_pod(pod).pod

    first, user, refused = _admit_over_tls(
        tmp_path, [_review(pod), _review(user_pod, "u2"), _review(no_gate, "u3")]
    )
    assert first["response"]["uid"] == "u1" and first["response"]["allowed"] is True
    assert _patched(pod, first) == expected

    assert user["response"]["allowed"] is True
    assert any("kept TPU_NAME" in w for w in user["response"]["warnings"])
    assert _patched(user_pod, user) == mutate_pod(user_pod).pod

    assert refused["response"]["allowed"] is False
    assert refused["response"]["status"]["code"] == 403
    assert "RayMultiHostIndexing" in refused["response"]["status"]["message"]

    # Reinvocation: the API server sends the already mutated pod; nothing to patch.
    (again,) = _admit_over_tls(tmp_path / "again", [_review(expected, "u4")])
    assert again["response"]["allowed"] is True
    assert "patch" not in again["response"]
