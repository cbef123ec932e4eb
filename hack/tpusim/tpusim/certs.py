"""Certificates, keys and kubeconfigs for the local control plane.

Made with the ``cryptography`` package (not kopf's certbuilder/oscrypto, which
fails on OpenSSL 3). ECDSA P-256 everywhere: generation is instant, and every
component (apiserver, service-account signing ES256, client certs) accepts it.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from tpuslice.webhook import pki

__all__ = ["PKI", "issue_client_cert", "make_pki", "write_client_kubeconfig", "write_kubeconfig"]

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
    ca = pki.new_ca("tpuslice-devcluster-ca", valid=_VALIDITY)
    serving = pki.issue(
        ca,
        "kube-apiserver",
        ExtendedKeyUsageOID.SERVER_AUTH,
        hosts=serving_hosts(service_ip),
        valid=_VALIDITY,
    )
    # O=system:masters: the admin identity every local component and test uses.
    admin = pki.issue(
        ca,
        "kubernetes-admin",
        ExtendedKeyUsageOID.CLIENT_AUTH,
        organization="system:masters",
        valid=_VALIDITY,
    )
    for (cert, key), cert_path, key_path in (
        (ca, files.ca_cert, files.ca_key),
        (serving, files.apiserver_cert, files.apiserver_key),
        (admin, files.admin_cert, files.admin_key),
    ):
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        _write(key_path, pki.key_pem(key), private=True)
    sa_key = pki.new_key()
    _write(files.sa_key, pki.key_pem(sa_key), private=True)
    _write(files.sa_pub, pki.public_key_pem(sa_key))
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
    cert, key = pki.issue(
        (ca_cert, ca_key),
        common_name,
        ExtendedKeyUsageOID.CLIENT_AUTH,
        organization=organization,
        valid=_VALIDITY,
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    _write(key_path, pki.key_pem(key), private=True)
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
