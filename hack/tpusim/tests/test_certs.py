"""tpusim's certificates for the local control plane: what the API server, the
controller-manager and the real node's kubelet need of them, checked without
starting any of them."""

from __future__ import annotations

import ipaddress
import ssl
import stat
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tpusim.certs import issue_client_cert, make_pki, write_kubeconfig


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_the_ca_signs_a_serving_cert_for_every_name_of_the_api_server(tmp_path: Path) -> None:
    files = make_pki(tmp_path, service_ip="10.96.0.1")
    ca, serving = _cert(files.ca_cert), _cert(files.apiserver_cert)
    serving.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not serving.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usage = serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # an address is an IP SAN, not a DNS name: Go's TLS matches an IP only against those
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("10.96.0.1"),
    ]
    assert "kubernetes.default.svc.cluster.local" in sans.get_values_for_type(x509.DNSName)
    assert isinstance(serving.public_key(), ec.EllipticCurvePublicKey)


def test_the_admin_is_in_system_masters_and_keys_are_private(tmp_path: Path) -> None:
    files = make_pki(tmp_path)
    admin = _cert(files.admin_cert)
    admin.verify_directly_issued_by(_cert(files.ca_cert))
    assert admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == (
        "system:masters"
    )
    for key in (files.ca_key, files.apiserver_key, files.admin_key, files.sa_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    # Python's TLS stack (the kubernetes client's) takes the pair as written
    ssl.create_default_context(cafile=str(files.ca_cert)).load_cert_chain(
        str(files.admin_cert), str(files.admin_key)
    )


def test_a_client_cert_signed_later_by_the_same_ca(tmp_path: Path) -> None:
    files = make_pki(tmp_path / "pki")
    cert, key = issue_client_cert(
        files, tmp_path / "node", "kubelet", "system:node:n1", "system:nodes"
    )
    kubelet = _cert(cert)
    kubelet.verify_directly_issued_by(_cert(files.ca_cert))
    assert kubelet.subject.rfc4514_string() == "O=system:nodes,CN=system:node:n1"
    usage = kubelet.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_the_kubeconfig_names_the_admin_pair(tmp_path: Path) -> None:
    files = make_pki(tmp_path / "pki")
    path = write_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:6443", files)
    config = yaml.safe_load(path.read_text())
    assert config["users"][0]["user"] == {
        "client-certificate": str(files.admin_cert),
        "client-key": str(files.admin_key),
    }
    assert config["clusters"][0]["cluster"]["certificate-authority"] == str(files.ca_cert)
