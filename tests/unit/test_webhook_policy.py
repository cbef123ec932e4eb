"""The TPUSlicePolicy webhook: the admission decision (AdmissionReview of a TPUSlice
object in, allowed or refused naming policy, field and limit out), its
ValidatingWebhookConfiguration, and its path on the identity webhook's server over TLS.
The reader of policies and namespace labels is tests/unit/test_webhook_policy_cache.py."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.builders import tpu, tpuslice
from tpuslice.model import constants as c
from tpuslice.policy.records import Policy, parse_policy
from tpuslice.runtime.policy_cache import PolicyView
from tpuslice.webhook import admission as identity
from tpuslice.webhook import certificates as webhookcerts
from tpuslice.webhook import configuration as webhook_config
from tpuslice.webhook import policy_admission as pa
from tpuslice.webhook import server as webhook_server

TEAM = {"team": "research"}
PRIVILEGED = {"containers": [{"name": "ray-worker", "securityContext": {"privileged": True}}]}
PRIVILEGED_FIELD = "spec.worker.template.spec.containers[0].securityContext.privileged"


def policy(name: str = "research", **spec: Any) -> Policy:
    return parse_policy(
        {"metadata": {"name": name}, "spec": {"namespaceSelector": {"matchLabels": TEAM}, **spec}}
    )


BASELINE = policy(podTemplate={"podSecurity": "baseline"})


def privileged(kind: str = c.KIND_CLUSTER, **spec: Any) -> dict[str, Any]:
    return tpuslice(kind, worker={"template": {"spec": PRIVILEGED}}, **spec)


def review(
    obj: dict[str, Any] | None,
    *,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    plural: str = c.PLURAL_CLUSTER,
    group: str = c.GROUP,
    sub_resource: str | None = None,
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": "u1",
        "kind": {"group": group, "version": c.VERSION, "kind": "x"},
        "resource": {"group": group, "version": c.VERSION, "resource": plural},
        "namespace": "ml",
        "name": "llm",
        "operation": operation,
        "object": obj,
        "oldObject": old,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


class Reader:
    """``read(namespace)`` as the cache answers it; counts the calls."""

    def __init__(self, view: PolicyView | None) -> None:
        self.view = view
        self.asked: list[str] = []

    def __call__(self, namespace: str) -> PolicyView | None:
        self.asked.append(namespace)
        return self.view


def governed(*policies: Policy, labels: dict[str, str] | None = None) -> Reader:
    return Reader(PolicyView(policies, TEAM if labels is None else labels))


def response(answer: dict[str, Any]) -> dict[str, Any]:
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "u1"
    return answer["response"]  # type: ignore[no-any-return]


# ------------------------------------------------------------------------ decision


def test_no_policy_in_the_cluster_allows_everything() -> None:
    read = governed(labels={})
    out = response(pa.policy_admission_response(review(privileged()), read))
    assert out == {"uid": "u1", "allowed": True}
    assert read.asked == ["ml"]


@pytest.mark.parametrize(
    ("kind", "plural"),
    [
        (c.KIND_CLUSTER, c.PLURAL_CLUSTER),
        (c.KIND_JOB, c.PLURAL_JOB),
        (c.KIND_SERVICE, c.PLURAL_SERVICE),
    ],
)
def test_a_privileged_worker_is_refused_naming_policy_field_and_limit(
    kind: str, plural: str
) -> None:
    extra: dict[str, Any] = {}
    if kind == c.KIND_JOB:
        extra["job"] = {"entrypoint": "python train.py"}
    if kind == c.KIND_SERVICE:
        extra["serve"] = {"serveConfigV2": "applications: []"}
    obj = privileged(kind, **extra)
    out = response(pa.policy_admission_response(review(obj, plural=plural), governed(BASELINE)))
    assert out["allowed"] is False
    assert out["status"]["code"] == 403 and out["status"]["reason"] == "Forbidden"
    message = out["status"]["message"]
    assert message.startswith(f"{kind} ml/llm: PolicyViolation: {PRIVILEGED_FIELD}")
    assert "TPUSlicePolicy research" in message and "podSecurity baseline" in message


def test_a_compliant_object_is_allowed() -> None:
    out = response(pa.policy_admission_response(review(tpuslice()), governed(BASELINE)))
    assert out == {"uid": "u1", "allowed": True}


def test_a_namespace_no_policy_selects_is_denied_naming_the_policies() -> None:
    read = governed(BASELINE, labels={"team": "other"})
    out = response(pa.policy_admission_response(review(tpuslice()), read))
    assert out["allowed"] is False
    message = out["status"]["message"]
    assert "PolicyDenied" in message and "metadata.namespace" in message
    assert "research" in message


def test_slices_per_object_is_refused_but_namespace_usage_is_left_to_the_pass() -> None:
    capped = policy(limits={"slicesPerObject": 2, "slicesPerNamespace": 1})
    obj = tpuslice(tpu=tpu(slices=3))
    out = response(pa.policy_admission_response(review(obj), governed(capped)))
    assert out["allowed"] is False
    assert "spec.tpu.slices: asks for 3 slices; at most 2 per object" in out["status"]["message"]
    assert "slicesPerNamespace" not in out["status"]["message"]
    # two slices: within slicesPerObject; over slicesPerNamespace, which is the pass's to judge
    within = tpuslice(tpu=tpu(slices=2))
    assert response(pa.policy_admission_response(review(within), governed(capped)))["allowed"]


def test_the_refusal_lists_three_and_counts_the_rest() -> None:
    strict = policy(
        podTemplate={"podSecurity": "baseline", "serviceAccountNames": ["ray"]},
        limits={"slicesPerObject": 1},
    )
    obj = privileged(tpu=tpu(slices=2))
    message = response(pa.policy_admission_response(review(obj), governed(strict)))["status"][
        "message"
    ]
    assert message.count("(TPUSlicePolicy research:") == pa.MAX_REFUSALS_SHOWN
    assert message.endswith("more")
    assert len(message) <= pa.MAX_MESSAGE_CHARS


def test_an_update_that_leaves_the_spec_as_it_was_is_always_allowed() -> None:
    """A finalizer removed, a label or annotation written, by the user or the operator:
    never refused, even by a policy added after the object (here it would refuse the spec),
    and the policies are not even read."""
    old = privileged()
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = []
    new["metadata"]["annotations"] = {"x": "y"}
    read = governed(BASELINE)
    out = response(pa.policy_admission_response(review(new, operation="UPDATE", old=old), read))
    assert out == {"uid": "u1", "allowed": True}
    assert read.asked == []


def test_an_update_that_changes_the_spec_is_judged() -> None:
    old = tpuslice()
    new = privileged()
    out = response(
        pa.policy_admission_response(review(new, operation="UPDATE", old=old), governed(BASELINE))
    )
    assert out["allowed"] is False and PRIVILEGED_FIELD in out["status"]["message"]


@pytest.mark.parametrize(
    "what",
    ["delete", "status", "other group", "other resource", "connect", "no spec", "bad spec"],
)
def test_what_admission_leaves_alone_is_allowed_without_reading_policies(what: str) -> None:
    obj = privileged()
    cases: dict[str, dict[str, Any]] = {
        "delete": review(None, operation="DELETE", old=obj),
        "status": review(obj, operation="UPDATE", old=tpuslice(), sub_resource="status"),
        "other group": review(obj, group="ray.io"),
        "other resource": review(obj, plural="slicereservations"),
        "connect": review(obj, operation="CONNECT"),
        "no spec": review({"metadata": {"name": "llm"}}),
        # left to the CRD's schema and the pass, whose status names every wrong field
        "bad spec": review(tpuslice(tpu=tpu(topology="3x3"))),
    }
    read = governed(BASELINE)
    out = response(pa.policy_admission_response(cases[what], read))
    assert out == {"uid": "u1", "allowed": True}
    assert read.asked == []


def test_policies_that_cannot_be_read_allow_with_a_warning() -> None:
    out = response(pa.policy_admission_response(review(privileged()), Reader(None)))
    assert out["allowed"] is True
    (warning,) = out["warnings"]
    assert "could not be read" in warning and "TPUSliceCluster" in warning


def test_a_clamped_priority_is_admitted_with_a_warning() -> None:
    ranged = policy(priority={"min": 10, "max": 100})
    obj = tpuslice(reservation={"priority": 500})
    out = response(pa.policy_admission_response(review(obj), governed(ranged)))
    assert out["allowed"] is True
    (warning,) = out["warnings"]
    assert "spec.reservation.priority 500 clamped to 100" in warning
    assert "TPUSlicePolicy research" in warning


def test_a_policy_that_failed_to_parse_refuses_its_namespaces() -> None:
    broken = Policy(name="typo", namespace_selector=BASELINE.namespace_selector, invalid="bad")
    out = response(pa.policy_admission_response(review(tpuslice()), governed(broken)))
    assert out["allowed"] is False
    assert "TPUSlicePolicy typo" in out["status"]["message"]


def test_a_body_that_is_no_admission_review_is_a_bad_review() -> None:
    with pytest.raises(identity.BadReview):
        pa.policy_admission_response({"kind": "Pod"}, Reader(None))


# ------------------------------------------------------------------- configuration


def test_configuration_is_a_validating_webhook_for_the_three_kinds() -> None:
    cfg = webhook_config.policy_webhook_configuration(
        ca_bundle=b"ca-pem", url="https://127.0.0.1:9443/", timeout_seconds=7
    )
    assert cfg["kind"] == "ValidatingWebhookConfiguration"
    assert cfg["metadata"]["name"] == pa.POLICY_WEBHOOK == "tpuslice-policy"
    (hook,) = cfg["webhooks"]
    assert hook["name"] == "policy.tpuslice.dev"
    assert hook["clientConfig"] == {
        "caBundle": base64.b64encode(b"ca-pem").decode(),
        "url": "https://127.0.0.1:9443/tpuslice-policy",
    }
    assert hook["rules"] == [
        {
            "apiGroups": ["tpuslice.dev"],
            "apiVersions": ["v1alpha1"],
            "resources": ["tpusliceclusters", "tpuslicejobs", "tpusliceservices"],
            "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced",
        }
    ]
    # the pass enforces policies anyway: a webhook that cannot answer blocks nobody
    assert hook["failurePolicy"] == "Ignore"
    assert hook["timeoutSeconds"] == 7 and hook["sideEffects"] == "None"
    assert "namespaceSelector" not in hook and "objectSelector" not in hook


def test_configuration_by_service_shares_the_identity_webhooks_service() -> None:
    service = webhook_config.ServiceRef("svc", "ops")
    policy_cfg = webhook_config.policy_webhook_configuration(ca_bundle=b"x", service=service)
    identity_cfg = webhook_config.webhook_configuration(ca_bundle=b"x", service=service)
    policy_client = policy_cfg["webhooks"][0]["clientConfig"]
    identity_client = identity_cfg["webhooks"][0]["clientConfig"]
    assert policy_client["service"] == {**identity_client["service"], "path": "/tpuslice-policy"}
    assert identity_client["service"]["path"] == "/tpuslice-identity"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"url": "https://x", "timeout_seconds": 31}, "timeoutSeconds"),
        ({"url": "http://x"}, "HTTPS"),
        ({}, "exactly one"),
    ],
)
def test_configuration_refuses_bad_settings(args: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        webhook_config.policy_webhook_configuration(ca_bundle=b"x", **args)


# ------------------------------------------------------------------ the server


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[webhook_server.IdentityWebhookServer, ssl.SSLContext]]:
    files = webhookcerts.write_certificates(
        webhookcerts.build_certificates(["localhost", "127.0.0.1"]), tmp_path
    )
    server = webhook_server.serve_identity_webhook(
        files,
        port=0,
        addr="127.0.0.1",
        policy_answer=lambda r: pa.policy_admission_response(r, governed(BASELINE)),
    )
    try:
        yield server, ssl.create_default_context(cadata=files.ca_bundle().decode())
    finally:
        server.stop()


def _post(server: webhook_server.IdentityWebhookServer, context: ssl.SSLContext, path: str) -> Any:
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    try:
        body = json.dumps(review(privileged())).encode()
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def test_the_server_answers_the_policy_path_and_still_the_identity_path(
    served: tuple[webhook_server.IdentityWebhookServer, ssl.SSLContext],
) -> None:
    server, context = served
    status, raw = _post(server, context, f"/{pa.POLICY_HANDLER_ID}?timeout=5s")
    assert status == 200
    refused = json.loads(raw)["response"]
    assert refused["allowed"] is False and PRIVILEGED_FIELD in refused["status"]["message"]
    # the identity path answers as before: this review is no pod CREATE, so it is allowed
    status, raw = _post(server, context, f"/{identity.HANDLER_ID}")
    assert status == 200 and json.loads(raw)["response"] == {"uid": "u1", "allowed": True}


def test_without_a_policy_decision_the_policy_path_is_not_found(tmp_path: Path) -> None:
    files = webhookcerts.write_certificates(
        webhookcerts.build_certificates(["127.0.0.1"]), tmp_path
    )
    server = webhook_server.serve_identity_webhook(files, port=0, addr="127.0.0.1")
    try:
        context = ssl.create_default_context(cadata=files.ca_bundle().decode())
        status, _ = _post(server, context, f"/{pa.POLICY_HANDLER_ID}")
        assert status == 404
    finally:
        server.stop()
