"""One CA and serving certificate for every replica: the decisions (webhookcerts.py) and
the Secret shell (serving.py) against an in-memory Secret with resourceVersion checks."""

from __future__ import annotations

import base64
import copy
import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from cryptography import x509

from tpuslice.runtime.kube import ApiError
from tpuslice.webhook import certificates as webhookcerts
from tpuslice.webhook.certificates import Action, plan, secret_with, stored_bundle
from tpuslice.webhook.serving import IdentityWebhook, SharedSecret

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
HOSTS = webhookcerts.service_hosts("rel-tpuslice-operator-webhook", "ops")


def cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def fresh() -> webhookcerts.CertBundle:
    return plan(None, HOSTS, NOW).bundle


def test_an_empty_secret_gets_a_ten_year_ca_and_a_one_year_serving_certificate() -> None:
    decision = plan(None, HOSTS, NOW)
    assert decision.action is Action.NEW_CA and "no certificates yet" in decision.reason
    ca, leaf = cert(decision.bundle.ca_pem), cert(decision.bundle.cert_pem)
    assert ca.not_valid_after_utc.year == 2035 and leaf.not_valid_after_utc.year == 2026
    leaf.verify_directly_issued_by(ca)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(n.value) for n in sans] == HOSTS
    assert decision.bundle.ca_key_pem


def test_a_good_stored_bundle_is_used_as_is() -> None:
    bundle = fresh()
    decision = plan(bundle, HOSTS, NOW + datetime.timedelta(days=300))
    assert decision.action is Action.USE and decision.bundle == bundle


def test_a_serving_certificate_near_expiry_is_reissued_under_the_same_ca() -> None:
    bundle = fresh()
    decision = plan(bundle, HOSTS, NOW + datetime.timedelta(days=340))  # 25 days left
    assert decision.action is Action.NEW_SERVING and "expires" in decision.reason
    assert decision.bundle.ca_pem == bundle.ca_pem  # the caBundle does not change
    assert decision.bundle.ca_key_pem == bundle.ca_key_pem
    cert(decision.bundle.cert_pem).verify_directly_issued_by(cert(bundle.ca_pem))
    assert plan(decision.bundle, HOSTS, NOW + datetime.timedelta(days=340)).action is Action.USE


def test_other_hosts_get_a_serving_certificate_naming_them() -> None:
    bundle = fresh()
    hosts = webhookcerts.service_hosts("renamed-webhook", "ops")
    decision = plan(bundle, hosts, NOW)
    assert decision.action is Action.NEW_SERVING and "renamed-webhook" in decision.reason
    assert decision.bundle.ca_pem == bundle.ca_pem


def test_a_ca_near_its_own_expiry_or_unusable_means_a_new_ca() -> None:
    bundle = fresh()
    assert plan(bundle, HOSTS, NOW + datetime.timedelta(days=3640)).action is Action.NEW_CA
    other = fresh()
    mixed_key = webhookcerts.CertBundle(
        bundle.ca_pem, bundle.cert_pem, bundle.key_pem, other.ca_key_pem
    )
    assert "does not belong" in plan(mixed_key, HOSTS, NOW).reason
    garbage = webhookcerts.CertBundle(b"x", b"y", b"z", b"w")
    assert plan(garbage, HOSTS, NOW).action is Action.NEW_CA


def test_a_serving_certificate_of_another_ca_or_with_another_key_is_reissued() -> None:
    bundle, other = fresh(), fresh()
    foreign = webhookcerts.CertBundle(
        bundle.ca_pem, other.cert_pem, other.key_pem, bundle.ca_key_pem
    )
    decision = plan(foreign, HOSTS, NOW)
    assert decision.action is Action.NEW_SERVING and "not signed" in decision.reason
    wrong_key = webhookcerts.CertBundle(
        bundle.ca_pem, bundle.cert_pem, other.key_pem, bundle.ca_key_pem
    )
    assert "serving key" in plan(wrong_key, HOSTS, NOW).reason


def test_secret_round_trip_keeps_metadata_and_drops_managed_fields() -> None:
    bundle = fresh()
    secret = {
        "metadata": {
            "name": "certs",
            "namespace": "ops",
            "resourceVersion": "41",
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {"meta.helm.sh/release-name": "rel"},
            "managedFields": [{"manager": "helm"}],
        },
        "type": "Opaque",
    }
    assert stored_bundle(secret) is None
    body = secret_with(secret, bundle)
    assert body["metadata"]["resourceVersion"] == "41"
    assert body["metadata"]["annotations"] == {"meta.helm.sh/release-name": "rel"}
    assert "managedFields" not in body["metadata"] and body["type"] == "Opaque"
    assert set(body["data"]) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert stored_bundle(body) == bundle
    partial = copy.deepcopy(body)
    del partial["data"]["ca.key"]
    assert stored_bundle(partial) is None
    partial["data"]["ca.key"] = "not base64!"
    assert stored_bundle(partial) is None


class FakeSecrets:
    """One Secret with resourceVersion preconditions, as the API server keeps it."""

    def __init__(self, exists: bool = True) -> None:
        self.secret: dict[str, Any] | None = (
            {"metadata": {"name": "certs", "namespace": "ops", "resourceVersion": "1"}}
            if exists
            else None
        )
        self.writes = 0
        self.after_get: Callable[[], Any] | None = None

    def get_secret(self, namespace: str, name: str) -> Any:
        if self.secret is None:
            raise ApiError(404, "NotFound", "secrets not found")
        snapshot = copy.deepcopy(self.secret)
        hook, self.after_get = self.after_get, None
        if hook is not None:
            hook()
        return snapshot

    def update_secret(self, body: dict[str, Any]) -> Any:
        assert self.secret is not None
        if body["metadata"]["resourceVersion"] != self.secret["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        self.writes += 1
        self.secret = copy.deepcopy(body)
        self.secret["metadata"]["resourceVersion"] = str(
            int(body["metadata"]["resourceVersion"]) + 1
        )
        return copy.deepcopy(self.secret)


def replica(secrets: FakeSecrets, directory: Path, hosts: list[str] | None = None) -> SharedSecret:
    return SharedSecret(
        cast(Any, secrets), "ops", "certs", hosts or HOSTS, directory, now=lambda: NOW
    )


def test_two_replicas_racing_on_an_empty_secret_serve_one_ca(tmp_path: Path) -> None:
    secrets = FakeSecrets()
    a, b = replica(secrets, tmp_path / "a"), replica(secrets, tmp_path / "b")
    served_by_a: list[webhookcerts.CertFiles] = []
    secrets.after_get = lambda: served_by_a.append(
        a.current()
    )  # a writes between b's read and write
    served_by_b = b.current()
    assert secrets.writes == 1
    assert served_by_b.contents() == served_by_a[0].contents()
    # a restart (or a third replica) reads what is stored and writes nothing
    again = replica(secrets, tmp_path / "c").current()
    assert again.contents() == served_by_b.contents() and secrets.writes == 1
    assert not (tmp_path / "c" / "ca.key").exists()  # the CA's key stays in the Secret


def test_a_missing_secret_is_an_error_saying_how_to_make_it(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="kubectl create secret generic certs -n ops"):
        replica(FakeSecrets(exists=False), tmp_path).current()


class FakeServer:
    def __init__(self) -> None:
        self.reloads: list[webhookcerts.CertFiles] = []

    def reload(self, files: webhookcerts.CertFiles) -> None:
        self.reloads.append(files)


def test_refresh_reloads_a_rotated_certificate_and_applies_only_a_changed_ca(
    tmp_path: Path,
) -> None:
    secrets = FakeSecrets()
    source = replica(secrets, tmp_path / "a")
    files = source.current()
    server, applied = FakeServer(), []
    hook = IdentityWebhook(
        cast(Any, server), source, applied.append, serving=files, check_seconds=60
    )
    hook.refresh()
    assert server.reloads == [] and applied == [files.ca_bundle()]
    hook.refresh()
    assert server.reloads == [] and len(applied) == 1  # nothing changed: no writes
    # someone else renews the serving certificate (same CA): reload, no new apply
    assert secrets.secret is not None
    stored = stored_bundle(secrets.secret)
    assert stored is not None
    renewed = plan(stored, ["renamed.ops.svc"], NOW).bundle
    secrets.secret = secret_with(secrets.secret, renewed)
    source.hosts = ["renamed.ops.svc"]
    hook.refresh()
    assert len(server.reloads) == 1 and len(applied) == 1
    assert server.reloads[0].cert.read_bytes() == renewed.cert_pem
    # the Secret emptied by hand: a new CA, served and applied
    secrets.secret = {"metadata": dict(secrets.secret["metadata"])}
    hook.refresh()
    assert len(server.reloads) == 2 and len(applied) == 2 and applied[1] != applied[0]
    assert base64.b64decode(cast(Any, secrets.secret)["data"]["ca.crt"]) == applied[1]
