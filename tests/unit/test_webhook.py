"""The identity webhook: configuration builder, certificates, the admission decision
(AdmissionReview in, AdmissionReview with a JSON patch out) and its HTTPS server.

The last tests run the real server over TLS with our certificate on a loopback
port, as the API server would call it (keep-alive, ``?timeout=5s``), without an
API server.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import http.client
import json
import socket
import ssl
import stat
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from tests.unit.test_identity import (
    _gke_stand_in,
    _template_with_env,
    _with_containers,
    kuberay_pod,
    render_worker_template,
)
from tpuslice.model import constants as c
from tpuslice.render.identity import mutate_pod
from tpuslice.runtime.metrics import Metrics
from tpuslice.webhook import admission as webhook
from tpuslice.webhook import certificates as webhookcerts
from tpuslice.webhook import configuration as webhook_config
from tpuslice.webhook import server as webhook_server

CA = base64.b64encode(b"ca-pem").decode()


def test_configuration_by_url() -> None:
    cfg = webhook_config.webhook_configuration(ca_bundle=b"ca-pem", url="https://127.0.0.1:9443/")
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
        "matchExpressions": [
            {"key": "tpuslice.dev/cluster", "operator": "Exists"},
            {"key": "ray.io/node-type", "operator": "In", "values": ["worker"]},
        ]
    }
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
        ]
    }, "our pods may live in any namespace but kube-system"
    assert hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "None"
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["timeoutSeconds"] == 5
    assert hook["admissionReviewVersions"] == ["v1"]


def test_configuration_by_service() -> None:
    cfg = webhook_config.webhook_configuration(
        ca_bundle=b"ca-pem",
        service=webhook_config.ServiceRef("tpuslice-operator", "tpuslice-system", 8443),
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
        {"url": "https://x", "service": webhook_config.ServiceRef("a", "b")},
        {"url": "http://127.0.0.1:9443"},
        {"url": "https://x", "timeout_seconds": 31},
        {"url": "https://x", "timeout_seconds": 0},
    ],
)
def test_configuration_rejects_bad_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        webhook_config.webhook_configuration(ca_bundle=b"x", **kwargs)


def test_certificates_chain_and_names(tmp_path: Path) -> None:
    hosts = [*webhookcerts.service_hosts("op", "ns"), "127.0.0.1"]
    bundle = webhookcerts.build_certificates(hosts, valid_days=30)
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

    files = webhookcerts.write_certificates(bundle, tmp_path / "certs")
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    assert files.ca_bundle() == bundle.ca_pem
    # This machine's OpenSSL 3 loads them (kopf's own generator fails here).
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(files.cert, files.key)
    client = ssl.create_default_context(cafile=str(files.ca))
    assert client.verify_mode == ssl.CERT_REQUIRED


def test_certificates_need_a_host() -> None:
    with pytest.raises(ValueError):
        webhookcerts.build_certificates([])


# ------------------------------------------------------------ the admission decision


def _review(
    pod: dict[str, Any] | None,
    uid: str = "u1",
    *,
    operation: str = "CREATE",
    resource: str = "pods",
    sub_resource: str | None = None,
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": resource},
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:ray-system:kuberay-operator"},
        "object": pod,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def _ops(answer: dict[str, Any]) -> list[dict[str, Any]]:
    response = answer["response"]
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def _patched(pod: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    return dict(jsonpatch.apply_patch(pod, _ops(answer)))


def _worker(**kw: Any) -> dict[str, Any]:
    template, hosts = render_worker_template("v6e", "4x4", slices=2, **kw)
    return kuberay_pod(template, hosts, replica=1, host=2)


def test_mutated_pod_gets_a_minimal_json_patch() -> None:
    pod = _worker()
    original = copy.deepcopy(pod)
    answer = webhook.admission_response(_review(pod, "uid-7"))
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "uid-7" and response["allowed"] is True
    assert "warnings" not in response and "status" not in response
    assert pod == original, "the request object is not modified"
    assert _patched(pod, answer) == mutate_pod(pod).pod
    # Only what we set, not a rewrite of the spec: the audit log shows exactly this.
    # the worker container has an env already (Ray's drain deadline, spec.disruption)
    assert sorted((op["op"], op["path"]) for op in _ops(answer)) == [
        ("add", "/spec/hostname"),
        ("add", "/spec/subdomain"),
        ("replace", "/spec/containers/0/env"),
    ]
    assert webhook.admission_outcome(answer) == "mutated"


def _tpu7x_two_containers() -> dict[str, Any]:
    template, hosts = render_worker_template("tpu7x", "2x2x2", slices=2)
    second = copy.deepcopy(template["spec"]["containers"][0])
    second["name"] = "ray-worker-numa1"
    sidecar = {"name": "logs", "image": "busybox"}
    return _with_containers(kuberay_pod(template, hosts, 1, 1), [sidecar, second])


def _placeholders() -> dict[str, Any]:
    template, hosts = _template_with_env(
        [
            {"name": "TPU_WORKER_HOSTNAMES", "value": "localhost"},
            {"name": "MY_VAR", "value": "x"},
            {"name": "TPU_WORKER_ID", "value": "0"},
            {"name": "TPU_NAME", "value": ""},
            {"name": "TPU_WORKER_HOSTNAMES", "value": "localhost"},
        ]
    )
    return kuberay_pod(template, hosts, 0, 2)


def _after_gke_long_name() -> dict[str, Any]:
    name = "n" * 45
    template, hosts = render_worker_template("v6e", "4x4", slices=2, name=name)
    pod = kuberay_pod(template, hosts, 1, 2, cluster=name)
    return _gke_stand_in(pod, f"{name}-headless"[-50:], slices_env=False)


@pytest.mark.parametrize(
    "make",
    [_tpu7x_two_containers, _placeholders, _after_gke_long_name],
    ids=["tpu7x-numa", "placeholders-and-duplicates", "after-gke-truncated-service"],
)
def test_patch_reproduces_the_mutation_exactly(make: Any) -> None:
    """Replaced, removed and kept env entries: the list diff applies to exactly mutate_pod's pod."""
    pod = make()
    answer = webhook.admission_response(_review(pod))
    assert _patched(pod, answer) == mutate_pod(pod).pod
    assert {op["op"] for op in _ops(answer)} <= {"add", "remove", "replace", "move", "copy"}


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"a": 1}, {"a": 1}),
        ({"a": 1, "b": 2}, {"a": 1}),
        ({"a": 1}, {"a": 1, "b": {"c": [1]}}),
        ({"a": [1, 2]}, {"a": [1, 3]}),
        ({"a": [1, 2]}, {"a": [1, 2, 3]}),
        ({"a": [{"x": 1}, {"y": 2}]}, {"a": [{"x": 1}, {"y": 3, "z": None}]}),
        ({"a/b": 1, "c~d": {"e": 1}}, {"a/b": 2, "c~d": {}}),
        ({"a": {"b": 1}}, {"a": [1]}),
        ({"a": None}, {"a": {"b": ""}}),
    ],
)
def test_json_patch_turns_the_old_document_into_the_new(old: Any, new: Any) -> None:
    ops = webhook.json_patch(old, new)
    assert jsonpatch.apply_patch(copy.deepcopy(old), ops) == new
    assert (ops == []) == (old == new)


def test_already_mutated_pod_gets_no_patch() -> None:
    """Reinvocation: the API server sends the pod as we left it; nothing to patch."""
    mutated = mutate_pod(_worker()).pod
    answer = webhook.admission_response(_review(mutated, "u4"))
    assert answer["response"] == {"uid": "u4", "allowed": True}
    assert webhook.admission_outcome(answer) == "unchanged"


def test_user_values_are_kept_and_warned_about() -> None:
    template, hosts = render_worker_template("v6e", "4x4", slices=2)
    template["spec"]["containers"][0]["env"] = [{"name": "TPU_NAME", "value": "mine"}]
    pod = kuberay_pod(template, hosts, replica=0, host=0)
    answer = webhook.admission_response(_review(pod, "u2"))
    response = answer["response"]
    assert response["allowed"] is True
    assert response["warnings"] == [
        "tpuslice-identity: kept TPU_NAME as set in container 'ray-worker'; "
        "it differs from the value computed for this pod"
    ]
    assert _patched(pod, answer) == mutate_pod(pod).pod
    assert not any(op["path"].endswith("/env/0") for op in _ops(answer)), "TPU_NAME stays"


def test_identity_error_is_a_403_refusal_naming_the_problem() -> None:
    pod = _worker()
    del pod["metadata"]["labels"][c.KUBERAY_LABEL_HOST_INDEX]
    answer = webhook.admission_response(_review(pod, "u3"))
    response = answer["response"]
    assert response["uid"] == "u3"
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "RayMultiHostIndexing" in response["status"]["message"]
    assert "patch" not in response
    assert webhook.admission_outcome(answer) == "refused"


def test_head_pod_and_pods_without_our_label_pass_unchanged() -> None:
    template, hosts = render_worker_template("v6e", "4x4", slices=2)
    head = kuberay_pod(template, hosts, 0, 0)
    head["metadata"]["labels"][c.KUBERAY_LABEL_NODE_TYPE] = "head"
    for kind in ("requests", "limits"):
        del head["spec"]["containers"][0]["resources"][kind][c.TPU_RESOURCE]
    unlabelled = _worker()
    del unlabelled["metadata"]["labels"][c.LABEL_CLUSTER]
    for pod in (head, unlabelled):
        assert webhook.admission_response(_review(pod))["response"] == {
            "uid": "u1",
            "allowed": True,
        }


@pytest.mark.parametrize(
    "kw",
    [
        {"operation": "UPDATE"},
        {"operation": "DELETE"},
        {"resource": "services"},
        {"sub_resource": "binding"},
    ],
)
def test_anything_but_a_pod_create_is_allowed_unchanged(kw: dict[str, Any]) -> None:
    bad = _worker()
    del bad["metadata"]["labels"][c.KUBERAY_LABEL_HOST_INDEX]  # would be refused on CREATE
    answer = webhook.admission_response(_review(bad, "u9", **kw))
    assert answer["response"] == {"uid": "u9", "allowed": True}


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}},
        {"apiVersion": "admission.k8s.io/v1", "kind": "Pod"},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 1}},
        _review(None),
    ],
)
def test_not_an_admission_review_is_a_bad_review(body: Any) -> None:
    with pytest.raises(webhook.BadReview):
        webhook.admission_response(body)


# ------------------------------------------------------------ the HTTPS server


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[webhook_server.IdentityWebhookServer, ssl.SSLContext]]:
    """The server on a loopback port, as handlers.py starts it, and a client TLS context
    that trusts the CA our configuration would give the API server."""
    files = webhookcerts.write_certificates(
        webhookcerts.build_certificates(["localhost", "127.0.0.1"]), tmp_path
    )
    server = webhook_server.serve_identity_webhook(
        files, port=0, addr="127.0.0.1", metrics=Metrics()
    )
    config = webhook_config.webhook_configuration(
        ca_bundle=files.ca_bundle(), url="https://127.0.0.1"
    )
    ca = base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"]).decode()
    try:
        yield server, ssl.create_default_context(cadata=ca)
    finally:
        server.stop()


def _post(
    conn: http.client.HTTPSConnection, path: str, body: bytes
) -> tuple[int, bytes, http.client.HTTPResponse]:
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read(), response


def _metric(server: webhook_server.IdentityWebhookServer, result: str) -> float:
    assert server.metrics is not None
    name = "tpuslice_webhook_admission_duration_seconds_count"
    return server.metrics.registry.get_sample_value(name, {"result": result}) or 0.0


def test_round_trip_over_tls_with_keep_alive(
    served: tuple[webhook_server.IdentityWebhookServer, ssl.SSLContext],
) -> None:
    server, context = served
    assert server.port > 0
    assert any(t.name == "identity-webhook" and t.daemon for t in threading.enumerate())
    pod = _worker()
    no_gate = _worker()
    del no_gate["metadata"]["labels"][c.KUBERAY_LABEL_HOST_INDEX]
    path = f"/{webhook.HANDLER_ID}?timeout=5s"  # as the API server calls it

    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    try:
        status, raw, response = _post(conn, path, json.dumps(_review(pod)).encode())
        assert status == 200
        assert response.getheader("Content-Type") == "application/json"
        assert int(response.getheader("Content-Length") or -1) == len(raw)
        sock = conn.sock
        first = json.loads(raw)
        assert first["response"]["uid"] == "u1" and first["response"]["allowed"] is True
        assert _patched(pod, first) == mutate_pod(pod).pod

        # Same connection (HTTP/1.1 keep-alive): a refusal is a 200 with allowed false.
        status, raw, _ = _post(conn, path, json.dumps(_review(no_gate, "u2")).encode())
        assert conn.sock is sock, "the connection was kept open"
        refused = json.loads(raw)
        assert status == 200 and refused["response"]["allowed"] is False
        assert refused["response"]["status"]["code"] == 403

        status, raw, _ = _post(conn, "/other", b"{}")
        assert status == 404 and conn.sock is sock

        status, _, _ = _post(conn, path, b'{"kind": "Pod"}')
        assert status == 400
        status, _, _ = _post(conn, path, b"not json")
        assert status == 400

        conn.request("GET", "/healthz")
        health = conn.getresponse()
        assert (health.status, health.read()) == (200, b"ok\n")
        assert conn.sock is sock
    finally:
        conn.close()
    assert _metric(server, "mutated") == 1
    assert _metric(server, "refused") == 1
    assert _metric(server, "error") == 0


def test_connections_are_served_in_parallel(
    served: tuple[webhook_server.IdentityWebhookServer, ssl.SSLContext],
) -> None:
    server, context = served
    pods = [_worker() for _ in range(16)]

    def admit(i: int) -> dict[str, Any]:
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
        try:
            status, raw, _ = _post(
                conn, f"/{webhook.HANDLER_ID}", json.dumps(_review(pods[i], f"u{i}")).encode()
            )
        finally:
            conn.close()
        assert status == 200
        return dict(json.loads(raw))

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(admit, range(16)))
    assert [a["response"]["uid"] for a in answers] == [f"u{i}" for i in range(16)]
    assert all(_patched(p, a) == mutate_pod(p).pod for p, a in zip(pods, answers, strict=True))
    assert _metric(server, "mutated") == 16


def test_answers_while_the_event_loop_is_busy(
    served: tuple[webhook_server.IdentityWebhookServer, ssl.SSLContext],
) -> None:
    """The point of the server's own threads: an event loop stuck in a long pass
    (here 3 s of pure Python that never awaits) does not hold up admission."""
    server, context = served
    pod = _worker()
    answered: list[float] = []

    def admit() -> None:
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
        try:
            status, _, _ = _post(conn, f"/{webhook.HANDLER_ID}", json.dumps(_review(pod)).encode())
        finally:
            conn.close()
        assert status == 200
        answered.append(time.monotonic())

    async def busy_loop() -> float:
        client = threading.Thread(target=admit)
        client.start()
        end = time.monotonic() + 3.0
        while time.monotonic() < end:  # a reconcile hogging the loop
            pass
        busy_until = time.monotonic()
        await asyncio.to_thread(client.join, 10)
        return busy_until

    busy_until = asyncio.run(busy_loop())
    assert answered and answered[0] < busy_until


def test_oversized_body_is_refused_before_it_is_read(
    served: tuple[webhook_server.IdentityWebhookServer, ssl.SSLContext],
) -> None:
    server, context = served
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    try:
        conn.putrequest("POST", f"/{webhook.HANDLER_ID}")
        conn.putheader("Content-Length", str(webhook.MAX_BODY_BYTES + 1))
        conn.endheaders()
        response = conn.getresponse()
        assert response.status == 413
        assert response.getheader("Connection") == "close"
        response.read()
    finally:
        conn.close()


def test_handler_failure_is_a_500_and_an_error_metric(
    served: tuple[webhook_server.IdentityWebhookServer, ssl.SSLContext],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, context = served

    def crash(pod: Any) -> Any:
        raise KeyError("spec")

    monkeypatch.setattr(webhook, "mutate_pod", crash)
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    try:
        status, raw, _ = _post(
            conn, f"/{webhook.HANDLER_ID}", json.dumps(_review(_worker())).encode()
        )
    finally:
        conn.close()
    assert status == 500 and b"KeyError" in raw
    assert _metric(server, "error") == 1


def test_a_failed_handshake_does_not_stop_the_server(
    served: tuple[webhook_server.IdentityWebhookServer, ssl.SSLContext],
) -> None:
    server, context = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as plain:
        plain.sendall(b"POST / HTTP/1.1\r\n\r\n")  # not TLS
        plain.recv(100)  # the server closes it
    untrusting = ssl.create_default_context()  # does not trust our CA
    with (
        pytest.raises(ssl.SSLCertVerificationError),
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
    ):
        untrusting.wrap_socket(raw, server_hostname="127.0.0.1")
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    try:
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def test_stop_closes_the_port(tmp_path: Path) -> None:
    files = webhookcerts.write_certificates(
        webhookcerts.build_certificates(["127.0.0.1"]), tmp_path
    )
    server = webhook_server.IdentityWebhookServer(files, port=0, addr="127.0.0.1")
    port = server.start()
    with pytest.raises(RuntimeError):
        server.start()
    server.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_draining_answers_then_closes_each_connection(
    served: tuple[webhook_server.IdentityWebhookServer, ssl.SSLContext],
) -> None:
    """After SIGTERM the API server's next call must open a new connection, which the
    Service sends to a replica that is not stopping."""
    server, context = served
    path = f"/{webhook.HANDLER_ID}"
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    try:
        status, _, response = _post(conn, path, json.dumps(_review(_worker())).encode())
        assert status == 200 and response.getheader("Connection") is None
        server.drain()
        status, raw, response = _post(conn, path, json.dumps(_review(_worker(), "u2")).encode())
        assert status == 200 and json.loads(raw)["response"]["allowed"] is True
        assert response.getheader("Connection") == "close"
        assert response.will_close
    finally:
        conn.close()


def test_reload_serves_the_new_certificate_to_new_connections(tmp_path: Path) -> None:
    first = webhookcerts.write_certificates(
        webhookcerts.build_certificates(["127.0.0.1"]), tmp_path / "a"
    )
    server = webhook_server.serve_identity_webhook(first, port=0, addr="127.0.0.1")
    try:

        def served_with(ca: bytes) -> bool:
            context = ssl.create_default_context(cadata=ca.decode())
            conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context)
            try:
                conn.request("GET", "/healthz")
                return conn.getresponse().status == 200
            except ssl.SSLError:
                return False
            finally:
                conn.close()

        second = webhookcerts.write_certificates(
            webhookcerts.build_certificates(["127.0.0.1"]), tmp_path / "b"
        )
        assert served_with(first.ca_bundle()) and not served_with(second.ca_bundle())
        server.reload(second)
        assert served_with(second.ca_bundle()) and not served_with(first.ca_bundle())
    finally:
        server.stop()


def test_a_bundle_keeps_its_cas_key_and_a_serving_certificate_can_be_reissued() -> None:
    bundle = webhookcerts.build_certificates(["svc.ns.svc"], valid_days=30, ca_valid_days=3650)
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    ca = x509.load_pem_x509_certificate(bundle.ca_pem)
    ca_key = serialization.load_pem_private_key(bundle.ca_key_pem, password=None)
    assert (ca.not_valid_after_utc - ca.not_valid_before_utc).days == 3650
    again = webhookcerts.issue_serving((ca, ca_key), ["svc.ns.svc"])  # type: ignore[arg-type]
    assert again.ca_pem == bundle.ca_pem and again.cert_pem != bundle.cert_pem
    x509.load_pem_x509_certificate(again.cert_pem).verify_directly_issued_by(ca)
