"""A small certificate authority with the ``cryptography`` package.

Used by the identity webhook's self-managed serving certificate and by the
local control plane. Not kopf's generator (certbuilder/oscrypto fails on
OpenSSL 3). ECDSA P-256 keys: instant to generate on a small machine, and
accepted by Go's TLS stack (the API server) and by service-account signing.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["Issued", "issue", "key_pem", "new_ca", "new_key", "public_key_pem", "san"]

Issued = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def public_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def san(host: str) -> x509.GeneralName:
    """An IP-address SAN for an address, a DNS SAN otherwise (Go checks the kind)."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    valid: datetime.timedelta,
    now: datetime.datetime | None,
) -> x509.CertificateBuilder:
    start = (now or datetime.datetime.now(datetime.UTC)) - datetime.timedelta(minutes=5)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + valid)
    )


def new_ca(
    common_name: str, *, valid: datetime.timedelta, now: datetime.datetime | None = None
) -> Issued:
    """A self-signed CA that may sign leaf certificates only (path length 0)."""
    key = new_key()
    name = _name(common_name)
    cert = (
        _builder(name, name, key, valid, now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue(
    ca: Issued,
    common_name: str,
    usage: x509.ObjectIdentifier,
    *,
    hosts: Sequence[str] = (),
    organization: str | None = None,
    valid: datetime.timedelta,
    now: datetime.datetime | None = None,
) -> Issued:
    """A leaf certificate signed by ``ca``: server (with ``hosts`` as SANs) or client."""
    ca_cert, ca_key = ca
    key = new_key()
    builder = (
        _builder(_name(common_name, organization), ca_cert.subject, key, valid, now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([san(h) for h in hosts]), critical=False
        )
    return builder.sign(ca_key, hashes.SHA256()), key
