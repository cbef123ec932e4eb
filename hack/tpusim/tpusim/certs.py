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
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from tpuslice import pki

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
