"""A real Kueue manager next to the local cluster: its configuration, webhooks and queues.

Kueue normally runs in-cluster behind a Service, with its own certificate
manager rewriting the webhook configurations. Here it is a host process on
loopback, like the operator's webhook (tpusim.operator_process): the harness
issues its serving certificate from the cluster CA, turns Kueue's shipped
webhook and CRD-conversion client configs from ``service`` into ``url`` on
127.0.0.1, and switches Kueue's internal certificate management off.

Sources (sigs.k8s.io/kueue at the version in hack/versions-kueue.env, read from
the module the Go proxy serves): the Configuration fields are
``apis/config/v1beta2/configuration_types.go``; the webhook paths and rules are
``config/components/webhook/manifests.yaml``; the CRDs whose conversion goes
through ``/convert`` are the ones ``config/components/crd/kustomization.yaml``
patches (``patches/webhook_in_*.yaml``).

The pure functions render objects (unit-tested); ``KueueManager`` is the thin
shell that writes files, runs the process and applies what was rendered.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from kubernetes import client
from kubernetes.client import ApiException

from .certs import PKI, issue
from .nodepools import NodePool, TPUPool

__all__ = [
    "CONVERTED_CRDS",
    "INTEGRATION_RESOURCES",
    "KUEUE_GROUP",
    "KUEUE_NAMESPACE",
    "QUEUE_LABEL",
    "KueueConfig",
    "cluster_queue",
    "conversion_patched_crd",
    "create_tas_queues",
    "local_queue",
    "manager_configuration",
    "pool_tpu_chips",
    "resource_flavor",
    "tas_cluster_queue",
    "topology",
    "webhook_configurations",
    "write_serving_cert",
]

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_API = f"{KUEUE_GROUP}/v1beta2"
#: The label a job names its LocalQueue with (Kueue's ``constants.QueueLabel``).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: The node labels of the node-pool level and the hostname level of a Topology.
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: Kueue's own namespace (its default when not run in a pod); events and leases go there.
KUEUE_NAMESPACE = "kueue-system"
#: The extended resource GKE's TPU device plugin advertises (the fake pools' nodes too).
TPU_RESOURCE = "google.com/tpu"
#: Integrations the harness can wire: the (API group, resource) of each one's webhooks.
#: Kueue's names are its ``integrations.frameworks`` values.
INTEGRATION_RESOURCES: Mapping[str, tuple[str, str]] = {
    "ray.io/raycluster": ("ray.io", "rayclusters"),
    "ray.io/rayjob": ("ray.io", "rayjobs"),
}
#: CRDs that Kueue's shipped kustomization sends through its conversion webhook.
CONVERTED_CRDS = frozenset(
    f"{plural}.{KUEUE_GROUP}"
    for plural in ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
)
#: Bounds on what a test may ask for, so a typo does not render a nonsense config.
MAX_PODS_READY_TIMEOUT_S = 3600
MAX_QUOTA = 1_000_000


@dataclass(frozen=True)
class KueueConfig:
    """What the harness chooses for one Kueue manager (the rest is Kueue's default).

    ``pods_ready_timeout_s``: WaitForPodsReady's timeout; an admitted workload whose
    pods are not all ready by then is evicted and requeued. Short by default so a
    test can watch an eviction; None leaves WaitForPodsReady off (v0.17's default
    when the section is absent).
    """

    integrations: tuple[str, ...] = ("ray.io/raycluster", "ray.io/rayjob")
    pods_ready_timeout_s: int | None = 120
    feature_gates: Mapping[str, bool] | None = None

    def __post_init__(self) -> None:
        if not self.integrations:
            raise ValueError("KueueConfig.integrations: name at least one integration")
        unknown = [i for i in self.integrations if i not in INTEGRATION_RESOURCES]
        if unknown:
            raise ValueError(
                f"KueueConfig.integrations: {', '.join(unknown)} not wired by the harness "
                f"(one of {', '.join(INTEGRATION_RESOURCES)})"
            )
        timeout = self.pods_ready_timeout_s
        if timeout is not None and not 1 <= timeout <= MAX_PODS_READY_TIMEOUT_S:
            raise ValueError(
                f"KueueConfig.pods_ready_timeout_s: {timeout} is outside "
                f"1..{MAX_PODS_READY_TIMEOUT_S} (None turns WaitForPodsReady off)"
            )

    @property
    def gates(self) -> dict[str, bool]:
        """Feature gates: the visibility API server is off (it would need an
        APIService and its own serving port); the caller's gates win."""
        return {"VisibilityOnDemand": False, **(self.feature_gates or {})}


def manager_configuration(
    config: KueueConfig,
    *,
    webhook_port: int,
    health_port: int,
    metrics_port: int,
    cert_dir: Path,
) -> dict[str, Any]:
    """Kueue's ``config.kueue.x-k8s.io/v1beta2`` Configuration for a loopback process.

    Leader election off (one manager), internal certificate management off (the
    harness issues the certificate and writes the webhook configurations), every
    listener on 127.0.0.1.
    """
    for name, port in (("webhook", webhook_port), ("health", health_port)):
        if not 0 < port < 65536:
            raise ValueError(f"{name}_port: {port} is not a TCP port")
    out: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": list(config.integrations)},
    }
    if config.pods_ready_timeout_s is not None:
        out["waitForPodsReady"] = {
            "timeout": f"{config.pods_ready_timeout_s}s",
            "blockAdmission": False,
        }
    return out


def _served_by_harness(webhook: Mapping[str, Any], integrations: Iterable[str]) -> bool:
    """Kueue's own kinds, and the enabled integrations' kinds; never pods, deployments or
    the other frameworks, whose webhooks would fail closed on objects Kueue does not serve."""
    wanted = {INTEGRATION_RESOURCES[i] for i in integrations}
    for rule in webhook.get("rules") or ():
        for group in rule.get("apiGroups") or ():
            if group == KUEUE_GROUP:
                return True
            if any((group, r) in wanted for r in rule.get("resources") or ()):
                return True
    return False


def webhook_configurations(
    shipped: Sequence[Mapping[str, Any]],
    config: KueueConfig,
    base_url: str,
    ca_bundle: str,
) -> list[dict[str, Any]]:
    """Kueue's shipped Mutating/ValidatingWebhookConfigurations, aimed at ``base_url``.

    ``shipped``: the documents of ``config/components/webhook/manifests.yaml``.
    Each kept webhook's ``clientConfig.service`` becomes ``url: <base_url><path>``
    with ``caBundle`` (base64 PEM); the configurations are renamed ``kueue-…`` so
    they cannot collide with anything else's ``mutating-webhook-configuration``.
    """
    if not base_url.startswith("https://"):
        raise ValueError(f"base_url: {base_url!r} must be https:// (the API server requires it)")
    out = []
    for doc in shipped:
        kind = doc.get("kind")
        if kind not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        rendered = copy.deepcopy(dict(doc))
        rendered["metadata"] = {"name": f"kueue-{doc['metadata']['name']}"}
        hooks = []
        for hook in rendered.get("webhooks") or ():
            if not _served_by_harness(hook, config.integrations):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": base_url.rstrip("/") + path, "caBundle": ca_bundle}
            hooks.append(hook)
        if not hooks:
            raise ValueError(f"{kind}: no Kueue webhook left for {config.integrations}")
        rendered["webhooks"] = hooks
        out.append(rendered)
    kinds = sorted(str(d["kind"]) for d in out)
    if kinds != ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]:
        raise ValueError(f"shipped webhook manifests: expected one of each kind, found {kinds}")
    return out


def conversion_patched_crd(crd: Mapping[str, Any], base_url: str, ca_bundle: str) -> dict[str, Any]:
    """``crd`` with Kueue's conversion webhook at ``<base_url>/convert`` when Kueue's
    kustomization gives it one (``CONVERTED_CRDS``); other CRDs come back unchanged."""
    out = copy.deepcopy(dict(crd))
    if out["metadata"]["name"] in CONVERTED_CRDS:
        out["spec"]["conversion"] = {
            "strategy": "Webhook",
            "webhook": {
                "clientConfig": {"url": base_url.rstrip("/") + "/convert", "caBundle": ca_bundle},
                "conversionReviewVersions": ["v1"],
            },
        }
    return out


def pool_tpu_chips(pools: Iterable[NodePool]) -> int:
    """TPU chips over ``pools``' nodes: what a ClusterQueue over them can admit."""
    return sum(p.nodes * p.chips_per_node for p in pools if isinstance(p, TPUPool))


def resource_flavor(
    name: str, node_labels: Mapping[str, str] | None = None, topology_name: str = ""
) -> dict[str, Any]:
    """A ResourceFlavor. Without ``node_labels`` Kueue adds no node selector at
    admission, so placement stays the scheduler's (and the operator's) choice. With
    ``topology_name`` it is a topology-aware-scheduling flavor over the nodes carrying
    ``node_labels`` (Kueue requires at least one then: apis/kueue/v1beta2
    resourceflavor_types.go)."""
    if topology_name and not node_labels:
        raise ValueError(f"resource flavor {name}: a topology flavor needs node_labels")
    spec: dict[str, Any] = {}
    if node_labels:
        spec["nodeLabels"] = dict(node_labels)
    if topology_name:
        spec["topologyName"] = topology_name
    return {
        "apiVersion": KUEUE_API,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": spec,
    }


def _quota(name: str, value: int | str) -> dict[str, Any]:
    if isinstance(value, int) and not 0 <= value <= MAX_QUOTA:
        raise ValueError(f"cluster queue quota {name}: {value} is outside 0..{MAX_QUOTA}")
    return {"name": name, "nominalQuota": value}


def cluster_queue(
    name: str,
    flavor: str,
    *,
    tpu_chips: int,
    cpu: int = 1000,
    memory: str = "4Ti",
) -> dict[str, Any]:
    """A ClusterQueue with one flavor covering cpu, memory and TPU chips.

    Kueue refuses a workload asking for a resource its queue does not cover, and
    Ray heads and workers ask for cpu and memory too: those get generous quotas so
    only ``tpu_chips`` decides admission. Every namespace may use it.
    """
    return {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", TPU_RESOURCE],
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                _quota("cpu", cpu),
                                _quota("memory", memory),
                                _quota(TPU_RESOURCE, tpu_chips),
                            ],
                        }
                    ],
                }
            ],
        },
    }


def topology(name: str, levels: Sequence[str]) -> dict[str, Any]:
    """A Topology: node labels from the widest level to the narrowest (apis/kueue/v1beta2
    topology_types.go). ``kubernetes.io/hostname`` is optional and only ever the last;
    without it Kueue's assignment stops at the last level given, and its TopologyUngater
    adds every assigned level's label to the pod's nodeSelector
    (pkg/controller/tas/topology_ungater.go)."""
    if not levels or len(set(levels)) != len(levels):
        raise ValueError(f"topology {name}: levels must be distinct and at least one")
    if HOSTNAME_LABEL in levels[:-1]:
        raise ValueError(f"topology {name}: {HOSTNAME_LABEL} can only be the last level")
    return {
        "apiVersion": KUEUE_API,
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": label} for label in levels]},
    }


def tas_cluster_queue(
    name: str,
    *,
    plain_flavor: str,
    tas_flavor: str,
    tpu_chips: int,
    cpu: int = 1000,
    memory: str = "4Ti",
) -> dict[str, Any]:
    """A ClusterQueue whose TPU chips are only in ``tas_flavor`` (topology-aware): the
    Ray head, asking for cpu and memory only, fits ``plain_flavor`` first and is placed
    by the scheduler as usual; a TPU worker pod set, asking for chips, can only have the
    topology flavor (Kueue tries a resource group's flavors in order)."""
    queue = cluster_queue(name, plain_flavor, tpu_chips=0, cpu=cpu, memory=memory)
    (group,) = queue["spec"]["resourceGroups"]
    group["flavors"].append(
        {
            "name": tas_flavor,
            "resources": [
                _quota("cpu", cpu),
                _quota("memory", memory),
                _quota(TPU_RESOURCE, tpu_chips),
            ],
        }
    )
    return queue


def local_queue(namespace: str, name: str, cluster_queue_name: str) -> dict[str, Any]:
    """A LocalQueue in ``namespace`` feeding ``cluster_queue_name``."""
    return {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


#: Where Kueue reads its metrics-server certificate whenever its internal certificate
#: management is off: a fixed path, no flag or field moves it (cmd/kueue/main.go,
#: ``metricsCertPath``). In a pod it is a mounted Secret.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")


def private_etc_argv(upper: Path, work: Path, argv: Sequence[str], *, root: bool) -> list[str]:
    """``argv`` run in a mount namespace of its own whose /etc is the host's with
    ``upper`` laid over it (overlayfs), so Kueue finds ``METRICS_CERT_DIR`` while the
    host's /etc is never written and two clusters' Kueues never share the files.

    ``unshare`` (util-linux) execs in place: the pid, and so the harness's stop and
    parent-death signal, stay those of the process started. Without root it maps the
    user to root in a user namespace (overlayfs is allowed there on Linux 5.11+).
    """
    if not argv:
        raise ValueError("private_etc_argv: an empty command")
    script = (
        f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc"
        ' && exec "$0" "$@"'
    )
    prefix = ["unshare", "--mount", "--propagation", "private"]
    if not root:
        prefix.append("--map-root-user")
    return [*prefix, "sh", "-c", script, *argv]


def write_serving_cert(pki: PKI, cert_dir: Path) -> str:
    """Issue Kueue's loopback serving certificate from the cluster CA into ``cert_dir``
    (``tls.crt``/``tls.key``, the names controller-runtime's webhook server reads);
    return the CA as the base64 ``caBundle`` the webhook configurations carry."""
    ca_pem = pki.ca_cert.read_bytes()
    ca_cert = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{pki.ca_key} is not an ECDSA key")
    cert, key = issue(
        (ca_cert, ca_key),
        "kueue-webhook",
        ExtendedKeyUsageOID.SERVER_AUTH,
        hosts=["127.0.0.1", "localhost"],
    )
    cert_dir.mkdir(parents=True, exist_ok=True)
    (cert_dir / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path = cert_dir / "tls.key"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return base64.b64encode(ca_pem).decode()


def load_documents(path: Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of ``path``."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def probe_raycluster(namespace: str, queue: str) -> dict[str, Any]:
    """The smallest RayCluster Kueue's webhook will look at: one head, a queue label."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": "kueue-webhook-probe",
            "namespace": namespace,
            "labels": {QUEUE_LABEL: queue},
        },
        "spec": {
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "ray-head", "image": "ray"}]}},
            }
        },
    }


# ---------------------------------------------------------------- shell
def webhook_answers(api: Any, namespace: str = "default") -> bool:
    """True once the API server sends RayCluster creates through Kueue's webhook.

    A server-side dry run (no object is stored) of a queue-labelled RayCluster
    comes back with ``spec.suspend: true`` only when Kueue's mutating webhook
    ran: the API server picks up new webhook configurations asynchronously, so
    the start-up waits for this before anyone creates a RayCluster.
    """
    objects: Any = client.CustomObjectsApi(api)
    body = probe_raycluster(namespace, "probe")
    try:
        created: dict[str, Any] = objects.create_namespaced_custom_object(
            "ray.io", "v1", namespace, "rayclusters", body, dry_run="All"
        )
    except ApiException as exc:
        # 500 "failed calling webhook" while Kueue's listener or the API server's view
        # of the new configuration is not there yet; anything else is a real answer.
        if exc.status == 500:
            return False
        raise
    return bool(created.get("spec", {}).get("suspend"))


def create_queues(
    api: Any,
    *,
    namespaces: Iterable[str],
    tpu_chips: int,
    name: str = "tpu",
    node_labels: Mapping[str, str] | None = None,
) -> None:
    """A ResourceFlavor and ClusterQueue ``name`` with ``tpu_chips`` of quota, and a
    LocalQueue ``name`` in each of ``namespaces``; existing ones are left as they are."""
    objects: Any = client.CustomObjectsApi(api)
    cluster_scoped = [
        ("resourceflavors", resource_flavor(name, node_labels)),
        ("clusterqueues", cluster_queue(name, name, tpu_chips=tpu_chips)),
    ]
    _create_absent(objects, cluster_scoped, namespaces, name)


def create_tas_queues(
    api: Any,
    *,
    namespaces: Iterable[str],
    tpu_chips: int,
    node_labels: Mapping[str, str],
    name: str = "tas",
    levels: Sequence[str] = (NODEPOOL_LABEL,),
) -> None:
    """Kueue's topology-aware scheduling over the nodes carrying ``node_labels``: a
    Topology ``name`` of ``levels`` (the node pool by default), a topology flavor
    ``name`` over those nodes, a plain flavor ``<name>-plain`` for what asks for no
    chips, a ClusterQueue ``name`` over both (``tas_cluster_queue``) and a LocalQueue
    ``name`` in each of ``namespaces``; opt-in beside ``create_queues``, existing ones
    are left as they are."""
    objects: Any = client.CustomObjectsApi(api)
    cluster_scoped = [
        ("topologies", topology(name, levels)),
        ("resourceflavors", resource_flavor(name, node_labels, topology_name=name)),
        ("resourceflavors", resource_flavor(f"{name}-plain")),
        (
            "clusterqueues",
            tas_cluster_queue(
                name, plain_flavor=f"{name}-plain", tas_flavor=name, tpu_chips=tpu_chips
            ),
        ),
    ]
    _create_absent(objects, cluster_scoped, namespaces, name)


def _create_absent(
    objects: Any,
    cluster_scoped: Sequence[tuple[str, Mapping[str, Any]]],
    namespaces: Iterable[str],
    queue: str,
) -> None:
    """Create the cluster-scoped Kueue objects, then a LocalQueue ``queue`` over the
    ClusterQueue of that name in each of ``namespaces``; ones that exist stay as they are."""
    for plural, body in cluster_scoped:
        try:
            objects.create_cluster_custom_object(KUEUE_GROUP, "v1beta2", plural, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
    for namespace in namespaces:
        try:
            objects.create_namespaced_custom_object(
                KUEUE_GROUP,
                "v1beta2",
                namespace,
                "localqueues",
                local_queue(namespace, queue, queue),
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
