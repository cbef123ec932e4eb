"""The identity webhook's certificates in one place: the CA and serving certificate
(made with ``cryptography`` through ``pki.py``; kopf's own generator needs
certbuilder/oscrypto, which fail on OpenSSL 3), their files, and what to do with what
the Secret every replica shares holds (``plan``: pure, no API calls).

Why one Secret: every replica applies the MutatingWebhookConfiguration, whose
``caBundle`` must trust whichever replica the Service picks. When each replica
made its own CA at start, two replicas overwrote each other's ``caBundle`` and
about half of all admissions failed TLS. Now the first replica to find the
Secret empty makes a CA and a serving certificate and writes them (an update
under the resourceVersion it read, so of two racing replicas one wins and the
other reads the winner's); every replica, and every restart, serves what is
stored and applies its CA. The Secret is rendered empty by the chart, so
``helm uninstall`` removes it, and the chart's RBAC names it and nothing else.

Rotation keeps the CA: a serving certificate close to expiry (or not naming
the hosts the API server calls) is re-issued under the stored CA, so the
``caBundle`` stays the same and no replica is ever untrusted. Only a CA close
to its own expiry (ten years) or an unreadable Secret makes a new CA.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import enum
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from tpuslice.model import constants as c
from tpuslice.webhook import pki

__all__ = [
    "CA_VALID_DAYS",
    "RENEW_BEFORE",
    "SERVING_VALID_DAYS",
    "Action",
    "CertBundle",
    "CertFiles",
    "Plan",
    "build_certificates",
    "certificates_for",
    "issue_serving",
    "plan",
    "secret_with",
    "service_hosts",
    "stored_bundle",
    "write_certificates",
]

# -------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class CertBundle:
    """PEM bytes of a CA, and of a serving certificate and key signed by it; the CA's
    key too when we made the CA (kept in the shared Secret, to issue the next serving
    certificate under the same CA: the configuration's caBundle then never changes)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    ca_key_pem: bytes = b""


@dataclass(frozen=True)
class CertFiles:
    """Where ``write_certificates`` put a bundle: what ``IdentityWebhookServer`` serves with."""

    ca: Path
    cert: Path
    key: Path

    def ca_bundle(self) -> bytes:
        return self.ca.read_bytes()

    def contents(self) -> tuple[bytes, bytes, bytes]:
        """What is being served (CA, certificate, key): compared to notice a rotation."""
        return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()


def service_hosts(service: str, namespace: str) -> list[str]:
    """The names the API server uses to reach ``service`` in ``namespace``."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def build_certificates(
    hosts: Sequence[str],
    *,
    valid_days: int = 365,
    ca_valid_days: int | None = None,
    now: datetime.datetime | None = None,
) -> CertBundle:
    """A fresh CA (valid ``ca_valid_days``, default ``valid_days``) and a serving
    certificate for ``hosts`` (DNS names or IP addresses); the first host is the
    subject's common name, all of them are SANs (what Go checks)."""
    valid = datetime.timedelta(days=ca_valid_days or valid_days)
    ca = pki.new_ca(f"{c.IDENTITY_WEBHOOK}-ca", valid=valid, now=now)
    return issue_serving(ca, hosts, valid_days=valid_days, now=now)


def issue_serving(
    ca: pki.Issued,
    hosts: Sequence[str],
    *,
    valid_days: int = 365,
    now: datetime.datetime | None = None,
) -> CertBundle:
    """A serving certificate for ``hosts`` signed by ``ca``, bundled with that CA."""
    if not hosts:
        raise ValueError("a serving certificate needs at least one host name or IP address")
    valid = datetime.timedelta(days=valid_days)
    cert, key = pki.issue(
        ca, hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, hosts=hosts, valid=valid, now=now
    )
    return CertBundle(
        ca_pem=ca[0].public_bytes(serialization.Encoding.PEM),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=pki.key_pem(key),
        ca_key_pem=pki.key_pem(ca[1]),
    )


def write_certificates(bundle: CertBundle, directory: Path) -> CertFiles:
    """Write ``ca.crt``, ``tls.crt`` and ``tls.key`` (mode 0600) into ``directory``.

    The CA's key is never written: only the shared Secret keeps it."""
    directory.mkdir(parents=True, exist_ok=True)
    files = CertFiles(
        ca=directory / "ca.crt", cert=directory / "tls.crt", key=directory / "tls.key"
    )
    files.ca.write_bytes(bundle.ca_pem)
    files.cert.write_bytes(bundle.cert_pem)
    fd = os.open(files.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(bundle.key_pem)
    return files


def certificates_for(directory: Path, hosts: Sequence[str]) -> CertFiles:
    """Certificates mounted by cert-manager (tls.crt, tls.key, ca.crt) if present in
    ``directory``, else a fresh self-signed set for ``hosts`` written there."""
    mounted = CertFiles(
        ca=directory / "ca.crt", cert=directory / "tls.crt", key=directory / "tls.key"
    )
    if all(p.exists() for p in (mounted.ca, mounted.cert, mounted.key)):
        return mounted
    return write_certificates(build_certificates(hosts), directory)


#: Secret keys (cert-manager's names for the three it also writes, plus the CA's key).
CA, CA_KEY, CERT, KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
CA_VALID_DAYS = 3650
SERVING_VALID_DAYS = 365
#: Re-issue this long before expiry: replicas read the Secret every minute or so.
RENEW_BEFORE = datetime.timedelta(days=30)


def stored_bundle(secret: Mapping[str, Any]) -> CertBundle | None:
    """The bundle a Secret holds, or None when it is empty or any of the four keys is
    missing, empty or not base64."""
    data = secret.get("data") or {}
    try:
        parts = {
            key: base64.b64decode(data.get(key) or "", validate=True)
            for key in (CA, CA_KEY, CERT, KEY)
        }
    except (binascii.Error, ValueError):
        return None
    if not all(parts.values()):
        return None
    return CertBundle(
        ca_pem=parts[CA], cert_pem=parts[CERT], key_pem=parts[KEY], ca_key_pem=parts[CA_KEY]
    )


def secret_with(secret: Mapping[str, Any], bundle: CertBundle) -> dict[str, Any]:
    """The Secret as read, with ``bundle`` as its data: an update keeps its labels and
    annotations (Helm's among them) and its resourceVersion (the precondition)."""
    meta = {k: v for k, v in (secret.get("metadata") or {}).items() if k != "managedFields"}

    def encode(raw: bytes) -> str:
        return base64.b64encode(raw).decode("ascii")

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": secret.get("type") or "Opaque",
        "data": {
            CA: encode(bundle.ca_pem),
            CA_KEY: encode(bundle.ca_key_pem),
            CERT: encode(bundle.cert_pem),
            KEY: encode(bundle.key_pem),
        },
    }


class Action(enum.Enum):
    USE = "use"  # serve what is stored
    NEW_SERVING = "new-serving"  # re-issue the serving certificate under the stored CA
    NEW_CA = "new-ca"  # nothing usable is stored: a new CA and serving certificate


@dataclass(frozen=True)
class Plan:
    action: Action
    bundle: CertBundle  # what to serve (and, unless USE, to write first)
    reason: str = ""


def _key_matches(cert: x509.Certificate, key: Any) -> bool:
    return bool(
        isinstance(key, ec.EllipticCurvePrivateKey)
        and cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        == key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _names(cert: x509.Certificate) -> set[str]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n.value) for n in sans}


def plan(stored: CertBundle | None, hosts: Sequence[str], now: datetime.datetime) -> Plan:
    """What to serve given what the Secret holds (``stored_bundle``) and the host names
    the API server calls (the Service's names, or the URL's host)."""

    def new_ca(reason: str) -> Plan:
        bundle = build_certificates(
            hosts, valid_days=SERVING_VALID_DAYS, ca_valid_days=CA_VALID_DAYS, now=now
        )
        return Plan(Action.NEW_CA, bundle, reason)

    if stored is None:
        return new_ca("the Secret holds no certificates yet")
    try:
        ca_cert = x509.load_pem_x509_certificate(stored.ca_pem)
        ca_key = serialization.load_pem_private_key(stored.ca_key_pem, password=None)
        cert = x509.load_pem_x509_certificate(stored.cert_pem)
        key = serialization.load_pem_private_key(stored.key_pem, password=None)
    except ValueError as exc:
        return new_ca(f"the stored certificates are unreadable ({exc})")
    if not _key_matches(ca_cert, ca_key):
        return new_ca("the stored CA key does not belong to the stored CA")
    if ca_cert.not_valid_after_utc - now < RENEW_BEFORE:
        return new_ca(f"the CA expires at {ca_cert.not_valid_after_utc:%Y-%m-%d}")
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)  # _key_matches checked it

    def new_serving(reason: str) -> Plan:
        bundle = issue_serving((ca_cert, ca_key), hosts, valid_days=SERVING_VALID_DAYS, now=now)
        return Plan(Action.NEW_SERVING, bundle, reason)

    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return new_serving("the serving certificate is not signed by the stored CA")
    if not _key_matches(cert, key):
        return new_serving("the serving key does not belong to the serving certificate")
    missing = sorted(set(hosts) - _names(cert))
    if missing:
        return new_serving(f"the serving certificate does not name {', '.join(missing)}")
    if cert.not_valid_after_utc - now < RENEW_BEFORE:
        return new_serving(
            f"the serving certificate expires at {cert.not_valid_after_utc:%Y-%m-%d}"
        )
    return Plan(Action.USE, stored)
