"""The identity webhook's CA and serving certificate, shared by every replica through one
Secret: what to do with what the Secret holds. Pure (no API calls, no files).

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tpuslice.webhook.admission import CertBundle, build_certificates, issue_serving

__all__ = [
    "CA_VALID_DAYS",
    "RENEW_BEFORE",
    "SERVING_VALID_DAYS",
    "Action",
    "Plan",
    "plan",
    "secret_with",
    "stored_bundle",
]

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
