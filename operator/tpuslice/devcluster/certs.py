"""Certificates, keys and kubeconfigs for the local control plane.

Made with the ``cryptography`` package (not kopf's certbuilder/oscrypto, which
fails on OpenSSL 3). ECDSA P-256 everywhere: generation is instant, and every
component (apiserver, service-account signing ES256, client certs) accepts it.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["PKI", "make_pki", "write_kubeconfig"]

_VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class PKI:
    """Paths of the files a control plane needs; all PEM."""

    ca_cert: Path
    ca_key: Path
    apiserver_cert: Path
    apiserver_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path  # private, signs service-account tokens
    sa_pub: Path  # public, verifies them


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def _leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName] | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    builder = (
        _builder(subject, ca_name, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def serving_sans(service_ip: str) -> list[x509.GeneralName]:
    """SANs of the apiserver cert: loopback plus the in-cluster service names."""
    dns = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    ips = ["127.0.0.1", service_ip]
    return [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]


def make_pki(directory: Path, service_ip: str = "10.96.0.1") -> PKI:
    """Write a fresh CA, apiserver serving cert, admin client cert and SA keypair."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = PKI(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        apiserver_cert=directory / "apiserver.crt",
        apiserver_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
    )
    ca_key = _key()
    ca_name = _name("tpuslice-devcluster-ca")
    ca = (
        _builder(ca_name, ca_name, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.ca_key, ca_key)

    serving, serving_key = _leaf(
        ca_key,
        ca_name,
        _name("kube-apiserver"),
        ExtendedKeyUsageOID.SERVER_AUTH,
        serving_sans(service_ip),
    )
    pki.apiserver_cert.write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.apiserver_key, serving_key)

    # O=system:masters: the admin identity every local component and test uses.
    admin, admin_key = _leaf(
        ca_key,
        ca_name,
        _name("kubernetes-admin", "system:masters"),
        ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    pki.admin_cert.write_bytes(admin.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.admin_key, admin_key)

    sa_key = _key()
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def write_kubeconfig(path: Path, server: str, pki: PKI, name: str = "tpusim") -> Path:
    """Write a kubeconfig for the admin identity with the certs embedded by path."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {"server": server, "certificate-authority": str(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": f"{name}-admin",
                "user": {
                    "client-certificate": str(pki.admin_cert),
                    "client-key": str(pki.admin_key),
                },
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-admin"}}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
