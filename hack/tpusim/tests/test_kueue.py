"""Kueue in the local cluster, pure parts: the manager's configuration, the webhook and
CRD-conversion client configs aimed at loopback, the queues over the fake TPU pools,
and the serving certificate. The running manager is exercised by
tests/e2e/test_kueue_harness.py.
"""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from tpusim import ClusterSettings, CPUPool, LocalCluster, ToolPaths, TPUPool
from tpusim.certs import make_pki
from tpusim.kueue import (
    CONVERTED_CRDS,
    METRICS_CERT_DIR,
    QUEUE_LABEL,
    KueueConfig,
    cluster_queue,
    conversion_patched_crd,
    load_documents,
    local_queue,
    manager_configuration,
    pool_tpu_chips,
    private_etc_argv,
    probe_raycluster,
    resource_flavor,
    tas_cluster_queue,
    topology,
    webhook_configurations,
    write_serving_cert,
)

REPO = Path(__file__).resolve().parents[3]
BASE = "https://127.0.0.1:9443"


def _hook(name: str, path: str, group: str, resource: str) -> dict[str, Any]:
    """One webhook in the layout of Kueue's config/components/webhook/manifests.yaml."""
    return {
        "admissionReviewVersions": ["v1"],
        "clientConfig": {
            "service": {"name": "webhook-service", "namespace": "system", "path": path}
        },
        "failurePolicy": "Fail",
        "name": name,
        "rules": [
            {
                "apiGroups": [group],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": [resource],
            }
        ],
        "sideEffects": "None",
    }


SHIPPED = [
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [
            _hook("mpod.kb.io", "/mutate--v1-pod", "", "pods"),
            _hook("mraycluster.kb.io", "/mutate-ray-io-v1-raycluster", "ray.io", "rayclusters"),
            _hook("mrayjob.kb.io", "/mutate-ray-io-v1-rayjob", "ray.io", "rayjobs"),
            _hook("mrayservice.kb.io", "/mutate-ray-io-v1-rayservice", "ray.io", "rayservices"),
            _hook(
                "mworkload.kb.io",
                "/mutate-kueue-x-k8s-io-v1beta2-workload",
                "kueue.x-k8s.io",
                "workloads",
            ),
        ],
    },
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "validating-webhook-configuration"},
        "webhooks": [
            _hook("vjob.kb.io", "/validate-batch-v1-job", "batch", "jobs"),
            _hook("vraycluster.kb.io", "/validate-ray-io-v1-raycluster", "ray.io", "rayclusters"),
        ],
    },
]


# ---------------------------------------------------------------- configuration
def test_manager_configuration_listens_on_loopback_without_leases_or_own_certs() -> None:
    cfg = manager_configuration(
        KueueConfig(pods_ready_timeout_s=45),
        webhook_port=9443,
        health_port=8081,
        metrics_port=8443,
        cert_dir=Path("/run/kueue/certs"),
    )
    assert cfg["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert cfg["webhook"] == {"port": 9443, "host": "127.0.0.1", "certDir": "/run/kueue/certs"}
    assert cfg["health"] == {"healthProbeBindAddress": "127.0.0.1:8081"}
    assert cfg["metrics"] == {"bindAddress": "127.0.0.1:8443"}
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert cfg["internalCertManagement"] == {"enable": False}
    assert cfg["integrations"] == {"frameworks": ["ray.io/raycluster", "ray.io/rayjob"]}
    assert cfg["waitForPodsReady"] == {"timeout": "45s", "blockAdmission": False}


def test_wait_for_pods_ready_can_be_left_off() -> None:
    cfg = manager_configuration(
        KueueConfig(pods_ready_timeout_s=None),
        webhook_port=1,
        health_port=2,
        metrics_port=3,
        cert_dir=Path("/c"),
    )
    assert "waitForPodsReady" not in cfg


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"integrations": ()}, "integrations"),
        ({"integrations": ("pod",)}, "integrations: pod"),
        ({"pods_ready_timeout_s": 0}, "pods_ready_timeout_s: 0"),
        ({"pods_ready_timeout_s": 86400}, "pods_ready_timeout_s: 86400"),
    ],
)
def test_bad_kueue_config_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"KueueConfig.{field}"):
        KueueConfig(**kwargs)


def test_visibility_server_is_off_unless_asked() -> None:
    assert KueueConfig().gates == {"VisibilityOnDemand": False}
    gates = KueueConfig(feature_gates={"VisibilityOnDemand": True, "X": True}).gates
    assert gates == {"VisibilityOnDemand": True, "X": True}


def test_manager_configuration_rejects_a_bad_port() -> None:
    with pytest.raises(ValueError, match="webhook_port: 70000"):
        manager_configuration(
            KueueConfig(), webhook_port=70000, health_port=1, metrics_port=2, cert_dir=Path("/c")
        )


# ---------------------------------------------------------------- webhooks and CRDs
def test_webhooks_keep_kueue_and_ray_kinds_and_point_at_loopback() -> None:
    mutating, validating = webhook_configurations(SHIPPED, KueueConfig(), BASE + "/", "Q0E=")
    assert mutating["metadata"] == {"name": "kueue-mutating-webhook-configuration"}
    assert [h["name"] for h in mutating["webhooks"]] == [
        "mraycluster.kb.io",
        "mrayjob.kb.io",
        "mworkload.kb.io",
    ]
    assert mutating["webhooks"][0]["clientConfig"] == {
        "url": f"{BASE}/mutate-ray-io-v1-raycluster",
        "caBundle": "Q0E=",
    }
    assert [h["name"] for h in validating["webhooks"]] == ["vraycluster.kb.io"]
    assert SHIPPED[0]["webhooks"][0]["clientConfig"]["service"], "input must not be mutated"


def test_webhooks_follow_the_enabled_integrations() -> None:
    config = KueueConfig(integrations=("ray.io/rayjob",))
    mutating, validating = webhook_configurations(
        [
            *SHIPPED[:1],
            {**SHIPPED[1], "webhooks": [*SHIPPED[1]["webhooks"], SHIPPED[0]["webhooks"][4]]},
        ],
        config,
        BASE,
        "Q0E=",
    )
    assert [h["name"] for h in mutating["webhooks"]] == ["mrayjob.kb.io", "mworkload.kb.io"]
    assert [h["name"] for h in validating["webhooks"]] == ["mworkload.kb.io"]


def test_webhooks_refuse_plain_http_and_a_missing_kind() -> None:
    with pytest.raises(ValueError, match="base_url"):
        webhook_configurations(SHIPPED, KueueConfig(), "http://127.0.0.1:1", "Q0E=")
    with pytest.raises(ValueError, match="expected one of each kind"):
        webhook_configurations(SHIPPED[:1], KueueConfig(), BASE, "Q0E=")


def test_conversion_goes_to_loopback_only_for_kueues_converted_crds() -> None:
    crd = {"metadata": {"name": "workloads.kueue.x-k8s.io"}, "spec": {"group": "kueue.x-k8s.io"}}
    patched = conversion_patched_crd(crd, BASE, "Q0E=")
    assert patched["spec"]["conversion"] == {
        "strategy": "Webhook",
        "webhook": {
            "clientConfig": {"url": f"{BASE}/convert", "caBundle": "Q0E="},
            "conversionReviewVersions": ["v1"],
        },
    }
    assert "conversion" not in crd["spec"]
    flavors = {"metadata": {"name": "resourceflavors.kueue.x-k8s.io"}, "spec": {}}
    assert conversion_patched_crd(flavors, BASE, "Q0E=") == flavors
    assert "resourceflavors.kueue.x-k8s.io" not in CONVERTED_CRDS


def test_the_built_manifests_render() -> None:
    """Against the files `make tools` copied from the Kueue module (the harness tier
    runs after `make tools`)."""
    tools = ToolPaths.for_repo(REPO)
    assert not tools.kueue_missing(), f"run `make tools`: {tools.kueue_missing()}"
    mutating, validating = webhook_configurations(
        load_documents(tools.kueue_webhooks), KueueConfig(), BASE, "Q0E="
    )
    urls = {h["clientConfig"]["url"] for d in (mutating, validating) for h in d["webhooks"]}
    assert f"{BASE}/mutate-ray-io-v1-raycluster" in urls
    assert f"{BASE}/validate-ray-io-v1-raycluster" in urls
    assert not any("pod" in u.rsplit("-", 1)[-1] for u in urls), urls
    names = {
        doc["metadata"]["name"]
        for path in tools.kueue_crds.glob("*.yaml")
        for doc in load_documents(path)
    }
    assert names >= CONVERTED_CRDS


# ---------------------------------------------------------------- queues
def test_queues_over_the_tpu_pools_chips() -> None:
    pools = [
        TPUPool("v6e-4x4", "v6e", "4x4", nodes=4),
        TPUPool("v5e-2x4", "v5e", "2x4", nodes=2),
        CPUPool("cpu", nodes=3),
    ]
    assert pool_tpu_chips(pools) == 24
    cq = cluster_queue("tpu", "tpu", tpu_chips=24)
    (group,) = cq["spec"]["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "memory", "google.com/tpu"]
    (flavor,) = group["flavors"]
    assert flavor["name"] == "tpu"
    assert {"name": "google.com/tpu", "nominalQuota": 24} in flavor["resources"]
    assert cq["spec"]["namespaceSelector"] == {}
    assert local_queue("ns", "tpu", "tpu")["spec"] == {"clusterQueue": "tpu"}
    assert resource_flavor("tpu")["spec"] == {}
    assert resource_flavor("tpu", {"a": "b"})["spec"] == {"nodeLabels": {"a": "b"}}
    with pytest.raises(ValueError, match=r"google\.com/tpu: -1"):
        cluster_queue("tpu", "tpu", tpu_chips=-1)


def test_topology_aware_queues_keep_the_chips_in_the_topology_flavor() -> None:
    levels = ["cloud.google.com/gce-topology-block", "cloud.google.com/gke-nodepool"]
    assert topology("tas", levels)["spec"]["levels"] == [{"nodeLabel": x} for x in levels]
    with pytest.raises(ValueError, match="only be the last"):
        topology("tas", ["kubernetes.io/hostname", "cloud.google.com/gke-nodepool"])
    with pytest.raises(ValueError, match="distinct"):
        topology("tas", [])
    labels = {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"}
    assert resource_flavor("tas", labels, topology_name="tas")["spec"] == {
        "nodeLabels": labels,
        "topologyName": "tas",
    }
    with pytest.raises(ValueError, match="needs node_labels"):
        resource_flavor("tas", topology_name="tas")
    cq = tas_cluster_queue("tas", plain_flavor="tas-plain", tas_flavor="tas", tpu_chips=32)
    plain, tas = cq["spec"]["resourceGroups"][0]["flavors"]
    assert plain["name"] == "tas-plain"
    assert {"name": "google.com/tpu", "nominalQuota": 0} in plain["resources"]
    assert tas["name"] == "tas"
    assert {"name": "google.com/tpu", "nominalQuota": 32} in tas["resources"]


def test_the_webhook_probe_names_a_queue() -> None:
    probe = probe_raycluster("default", "probe")
    assert probe["metadata"]["labels"] == {QUEUE_LABEL: "probe"}


# ---------------------------------------------------------------- certificate, settings
def test_serving_cert_is_for_loopback_and_signed_by_the_cluster_ca(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    bundle = write_serving_cert(pki, tmp_path / "certs")
    assert base64.b64decode(bundle) == pki.ca_cert.read_bytes()
    cert = x509.load_pem_x509_certificate((tmp_path / "certs" / "tls.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    assert (tmp_path / "certs" / "tls.key").stat().st_mode & 0o777 == 0o600


def test_kueue_is_off_by_default_and_its_tools_are_checked_only_when_on(tmp_path: Path) -> None:
    tools = ToolPaths(root=tmp_path / "tools", versions={"KUEUE_VERSION": "v0.17.0"})
    assert ClusterSettings(tools=tools, run_dir=tmp_path).kueue is False
    assert tools.kueue_root == tmp_path / "tools" / "kueue-v0.17.0"
    assert str(tools.kueue_binary) in tools.kueue_missing()
    with pytest.raises(ValueError, match="KUEUE_VERSION"):
        _ = ToolPaths(root=tmp_path, versions={}).kueue_root
    cluster = LocalCluster(ClusterSettings(tools=tools, run_dir=tmp_path / "run", kueue=True))
    with pytest.raises(Exception, match="Kueue CRDs"):
        cluster.start()


def test_kueue_runs_with_a_private_overlay_over_etc() -> None:
    argv = private_etc_argv(Path("/r/up"), Path("/r/wk"), ["/bin/kueue", "--config=c"], root=True)
    assert argv[:4] == ["unshare", "--mount", "--propagation", "private"]
    assert argv[4:6] == ["sh", "-c"]
    assert "lowerdir=/etc,upperdir=/r/up,workdir=/r/wk /etc" in argv[6]
    assert argv[6].endswith('exec "$0" "$@"') and argv[7:] == ["/bin/kueue", "--config=c"]
    assert "--map-root-user" in private_etc_argv(Path("/u"), Path("/w"), ["k"], root=False)
    with pytest.raises(ValueError, match="empty command"):
        private_etc_argv(Path("/u"), Path("/w"), [], root=True)


def test_the_overlay_shows_the_metrics_cert_to_the_child_only(tmp_path: Path) -> None:
    """The real unshare + overlayfs, exactly as the harness runs Kueue."""
    upper, work = tmp_path / "up", tmp_path / "wk"
    certs = upper / METRICS_CERT_DIR.relative_to("/etc")
    certs.mkdir(parents=True)
    work.mkdir()
    (certs / "tls.crt").write_text("cert\n")
    argv = private_etc_argv(
        upper, work, ["cat", str(METRICS_CERT_DIR / "tls.crt")], root=os.geteuid() == 0
    )
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "cert\n"
    assert not (METRICS_CERT_DIR / "tls.crt").exists(), "the host's /etc must stay untouched"
