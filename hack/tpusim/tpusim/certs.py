"""Certificates, keys and kubeconfigs for the local control plane.

Made with the ``cryptography`` package (not kopf's certbuilder/oscrypto, which
fails on OpenSSL 3). ECDSA P-256 everywhere: generation is instant, and every
component (apiserver, service-account signing ES256, client certs) accepts it.

The small CA below is tpusim's own, not the operator's certificate code: the
harness never imports the operator it tests, so a bug in the operator's
certificates cannot hide behind a control plane that was built with the same bug.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["PKI", "issue_client_cert", "make_pki", "write_client_kubeconfig", "write_kubeconfig"]

_VALIDITY = datetime.timedelta(days=30)

#: A certificate and its private key.
Issued = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _public_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _san(host: str) -> x509.GeneralName:
    """An IP-address SAN for an address, a DNS SAN otherwise: Go's TLS matches an IP
    only against IP SANs."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:  # O= is the group a client certificate's user is in
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
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
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    # Valid from a few minutes ago: a component whose clock reads a little behind
    # this process's would otherwise refuse a certificate made a moment earlier.
    start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + _VALIDITY)
    )


def new_ca(common_name: str) -> Issued:
    """A self-signed CA that signs leaf certificates only (path length 0)."""
    key = _new_key()
    name = _name(common_name)
    cert = (
        _builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
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
) -> Issued:
    """A leaf certificate signed by ``ca``: server (``hosts`` as its SANs) or client."""
    ca_cert, ca_key = ca
    key = _new_key()
    builder = (
        _builder(_name(common_name, organization), ca_cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False
        )
    return builder.sign(ca_key, hashes.SHA256()), key


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


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


def serving_hosts(service_ip: str) -> list[str]:
    """SANs of the apiserver cert: loopback plus the in-cluster service names."""
    return [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "127.0.0.1",
        service_ip,
    ]


def make_pki(directory: Path, service_ip: str = "10.96.0.1") -> PKI:
    """Write a fresh CA, apiserver serving cert, admin client cert and SA keypair."""
    directory.mkdir(parents=True, exist_ok=True)
    files = PKI(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        apiserver_cert=directory / "apiserver.crt",
        apiserver_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
    )
    ca = new_ca("tpuslice-devcluster-ca")
    serving = issue(
        ca, "kube-apiserver", ExtendedKeyUsageOID.SERVER_AUTH, hosts=serving_hosts(service_ip)
    )
    # O=system:masters: the admin identity every local component and test uses.
    admin = issue(
        ca, "kubernetes-admin", ExtendedKeyUsageOID.CLIENT_AUTH, organization="system:masters"
    )
    for (cert, key), cert_path, key_path in (
        (ca, files.ca_cert, files.ca_key),
        (serving, files.apiserver_cert, files.apiserver_key),
        (admin, files.admin_cert, files.admin_key),
    ):
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        _write(key_path, _key_pem(key), private=True)
    sa_key = _new_key()
    _write(files.sa_key, _key_pem(sa_key), private=True)
    _write(files.sa_pub, _public_key_pem(sa_key))
    return files


def issue_client_cert(
    files: PKI, directory: Path, stem: str, common_name: str, organization: str | None = None
) -> tuple[Path, Path]:
    """Sign a client certificate with the cluster CA; return (cert, key) paths.

    For identities that authenticate by certificate alone, without TLS
    bootstrap or CSR approval: the real node's kubelet (``system:node:<name>``
    in ``system:nodes``, which the Node authorizer recognises) and kube-proxy
    (``system:kube-proxy``, bound to ``system:node-proxier`` by default RBAC).
    """
    ca_cert = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{files.ca_key} is not an ECDSA key")
    cert, key = issue(
        (ca_cert, ca_key), common_name, ExtendedKeyUsageOID.CLIENT_AUTH, organization=organization
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    _write(key_path, _key_pem(key), private=True)
    return cert_path, key_path


def write_kubeconfig(path: Path, server: str, pki: PKI, name: str = "tpusim") -> Path:
    """Write a kubeconfig for the admin identity with the certs embedded by path."""
    return write_client_kubeconfig(
        path, server, pki.ca_cert, pki.admin_cert, pki.admin_key, name=name, user=f"{name}-admin"
    )


def write_client_kubeconfig(
    path: Path, server: str, ca: Path, cert: Path, key: Path, *, name: str, user: str
) -> Path:
    """Write a kubeconfig for one client certificate (referenced by path, mode 0600)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {"server": server, "certificate-authority": str(ca)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate": str(cert), "client-key": str(key)},
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
