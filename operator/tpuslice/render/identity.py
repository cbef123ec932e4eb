"""TPU identity of a worker pod, computed from the pod alone: a pure function.

JAX and libtpu on a multi-host slice need each host to know its worker id and
its peers' names before the container starts, and Ray needs the slice name to
advertise a slice. GKE users get these from ``kuberay-tpu-webhook``, which
counts pods in an informer cache (duplicate ids under load) and replaces pod
affinity. We compute the same values from what KubeRay and our renderer put on
the pod itself:

- KubeRay labels: ``ray.io/cluster`` (RayCluster name), ``ray.io/group``,
  ``ray.io/worker-group-replica-index`` (the slice) and, for multi-host groups,
  ``ray.io/replica-host-index`` (the host within the slice). The last two exist
  only with KubeRay's ``RayMultiHostIndexing`` feature gate.
- Our worker-template label ``tpuslice.dev/topology`` and annotations
  ``tpuslice.dev/tpu-type``, ``tpuslice.dev/chips-per-host``, ``tpuslice.dev/slices``.

No informer and no counting, so the same pod always gets the same identity, a
recreated pod gets its predecessor's, and applying the mutation to an already
mutated pod changes nothing (admission reinvocation is safe).

Values follow GKE's webhook (github.com/ai-on-gke/kuberay-tpu-webhook, main.go)
so workloads written for GKE run unchanged, with two deliberate differences:
the subdomain is KubeRay's real headless Service name (GKE's webhook truncates
names longer than 50 characters, which KubeRay does not), and affinity is never
touched. ``docs/tpu-identity.md`` has the full contract table.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tpuslice.model import constants as c
from tpuslice.model.topology import (
    SliceShape,
    TopologyError,
    dynamic_slice_shape,
    slice_shape,
)

__all__ = [
    "EnvSetting",
    "IdentityError",
    "MutationResult",
    "Note",
    "PeerLists",
    "PodIdentity",
    "desired_env",
    "mutate_pod",
    "peer_lists",
    "read_identity",
    "requests_tpu",
]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_LABEL_MAX = 63


class IdentityError(ValueError):
    """A pod we are asked to admit but cannot give a correct TPU identity.

    The webhook rejects such a pod with this message (``failurePolicy: Fail``),
    because a TPU worker started without its identity hangs in JAX
    initialisation instead of failing visibly.
    """


@dataclass(frozen=True)
class EnvSetting:
    """One env var as Kubernetes stores it: a literal value or a downward-API field."""

    name: str
    value: str | None = None
    field_path: str | None = None

    def to_k8s(self) -> dict[str, Any]:
        if self.field_path is not None:
            # apiVersion is what the API server defaults fieldRef to; writing it
            # ourselves keeps a reinvoked mutation equal to the stored pod.
            return {
                "name": self.name,
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": self.field_path}},
            }
        return {"name": self.name, "value": self.value or ""}


@dataclass(frozen=True)
class Note:
    """A field the pod already had with another value: an env var of a container, or
    ``spec.hostname`` / ``spec.subdomain`` (container "")."""

    container: str
    name: str


@dataclass(frozen=True)
class PodIdentity:
    """Where one worker pod sits: which RayCluster, which slice, which host."""

    cluster: str  # RayCluster name (ray.io/cluster)
    group: str  # worker group name (ray.io/group)
    replica_index: int  # slice index within the group, 0..slices-1
    host_index: int  # host index within the slice, 0..hosts-1
    shape: SliceShape
    slices: int
    #: A worker of an elastic slice set: ``slices`` is its maximum, not a live count,
    #: so no MEGASCALE_* is written unless the user sets MEGASCALE_NUM_SLICES
    #: (docs/tpu-identity.md, "Elastic slice sets").
    elastic: bool = False
    #: False for a group of independent slices (``tpuslice.dev/multislice: "false"``): no
    #: MEGASCALE_* is written, even where the user set MEGASCALE_NUM_SLICES.
    multislice: bool = True

    @property
    def multi_host(self) -> bool:
        return self.shape.multi_host

    @property
    def tpu7x(self) -> bool:
        """TPU7x (Ironwood) gets per-container worker ids and process addresses."""
        return self.shape.generation.name == "tpu7x"

    @property
    def subdomain(self) -> str:
        """KubeRay's headless Service for multi-host workers: peers resolve through it."""
        return f"{self.cluster}{c.KUBERAY_HEADLESS_SUFFIX}"

    @property
    def tpu_name(self) -> str:
        """The slice name Ray advertises as a resource and ``ray.io/tpu-slice-name``."""
        return f"{self.group}-{self.replica_index}"

    def host_name(self, host: int, replica: int | None = None) -> str:
        index = self.replica_index if replica is None else replica
        return f"{self.group}-{index}-{host}"

    @property
    def hostname(self) -> str:
        return self.host_name(self.host_index)

    def host_address(self, host: int, replica: int | None = None) -> str:
        """``<group>-<replica>-<host>.<cluster>-headless``: resolvable in the pod's namespace."""
        return f"{self.host_name(host, replica)}.{self.subdomain}"

    @property
    def worker_hostnames(self) -> str:
        return ",".join(self.host_address(h) for h in range(self.shape.hosts))

    def process_addresses(self, tpu_containers: int) -> str:
        """TPU7x: every TPU container of every host of the slice, ``host:8471+c``."""
        return ",".join(
            f"{self.host_address(h)}:{c.TPU_PROCESS_PORT_BASE + k}"
            for h in range(self.shape.hosts)
            for k in range(tpu_containers)
        )

    @property
    def coordinator_address(self) -> str:
        """Multislice coordinator: host 0 of slice 0 (with its port on TPU7x, as GKE does)."""
        address = self.host_address(0, replica=0)
        return f"{address}:{c.MEGASCALE_PORT_BASE}" if self.tpu7x else address


@dataclass(frozen=True)
class PeerLists:
    """The addresses every TPU container of a pod is told, the same for all of them.

    They grow with the slice (hosts, and on TPU7x hosts x containers), so a pod
    computes them once and shares the strings between its containers; building
    them per container made a many-container pod cost hosts x containers^2.
    """

    worker_hostnames: str  # "" on a single-host slice
    process_addresses: str  # "" unless a multi-host TPU7x slice
    coordinator_address: str


def peer_lists(identity: PodIdentity, tpu_containers: int) -> PeerLists:
    """The pod's peer lists, computed once: hosts (x containers on TPU7x) addresses."""
    multi_host = identity.multi_host
    return PeerLists(
        worker_hostnames=identity.worker_hostnames if multi_host else "",
        process_addresses=(
            identity.process_addresses(tpu_containers) if multi_host and identity.tpu7x else ""
        ),
        coordinator_address=identity.coordinator_address,
    )


@dataclass(frozen=True)
class MutationResult:
    """The mutated pod and what the handler should warn about.

    ``kept``: env vars the pod already set to another value; left as they are
    (an explicit user choice wins). ``replaced``: fields or env vars whose
    existing value was a placeholder (``TPU_WORKER_HOSTNAMES=localhost``, a
    default ``TPU_WORKER_ID``, an empty value) or a hostname/subdomain that
    would not match the peers' list, and which we overwrote.
    """

    pod: dict[str, Any]
    identity: PodIdentity | None
    kept: tuple[Note, ...] = ()
    replaced: tuple[Note, ...] = ()


def _quantity_nonzero(value: object) -> bool:
    text = str(value).strip() if value is not None else ""
    return text not in ("", "0")


def requests_tpu(container: Mapping[str, Any]) -> bool:
    """True when a container requests or limits ``google.com/tpu`` (GKE's rule too)."""
    resources = container.get("resources") or {}
    return any(
        _quantity_nonzero((resources.get(kind) or {}).get(c.TPU_RESOURCE))
        for kind in ("limits", "requests")
    )


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    name = meta.get("name") or (f"{meta['generateName']}*" if meta.get("generateName") else "")
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if namespace else str(name or "<unnamed>")


def _gate_error(pod: Mapping[str, Any], label: str) -> IdentityError:
    return IdentityError(
        f"pod {_pod_name(pod)} has no label {label}: KubeRay's {c.KUBERAY_MULTI_HOST_GATE} "
        f"feature gate is off, so the TPU identity (worker id, slice) cannot be computed. "
        f"Enable it: start the KubeRay operator with "
        f"--feature-gates={c.KUBERAY_MULTI_HOST_GATE}=true (KubeRay 1.5; on by default from "
        f"1.6), e.g. Helm value featureGates: [{{name: {c.KUBERAY_MULTI_HOST_GATE}, "
        f"enabled: true}}]. KubeRay retries the pod afterwards."
    )


def _index_label(pod: Mapping[str, Any], labels: Mapping[str, str], label: str) -> int:
    raw = labels.get(label)
    if raw is None:
        raise _gate_error(pod, label)
    try:
        value = int(str(raw))
    except ValueError:
        raise IdentityError(
            f"pod {_pod_name(pod)}: label {label}={raw!r} is not an integer"
        ) from None
    if value < 0:
        raise IdentityError(f"pod {_pod_name(pod)}: label {label}={raw!r} is negative")
    return value


def _required(pod: Mapping[str, Any], where: Mapping[str, str], key: str, kind: str) -> str:
    value = where.get(key)
    if not value:
        raise IdentityError(
            f"pod {_pod_name(pod)} has no {kind} {key}, which tpuslice-operator puts on every "
            f"worker template it renders; was this RayCluster changed by hand?"
        )
    return str(value)


def _positive_int(pod: Mapping[str, Any], key: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise IdentityError(
            f"pod {_pod_name(pod)}: annotation {key}={raw!r} must be an integer >= 1"
        )
    return value


def _check_dns_label(pod: Mapping[str, Any], what: str, value: str) -> None:
    if len(value) > _DNS_LABEL_MAX or not _DNS_LABEL.match(value):
        raise IdentityError(
            f"pod {_pod_name(pod)}: {what} {value!r} is not a DNS label (at most "
            f"{_DNS_LABEL_MAX} lowercase letters, digits and '-'); RayCluster names are limited "
            f"to {c.MAX_NAME_LENGTH} characters so that '<name>{c.KUBERAY_HEADLESS_SUFFIX}' fits"
        )


def _check_tpu_containers(pod: Mapping[str, Any], shape: SliceShape, count: int) -> None:
    """At most one TPU container per chip of the host: each requests at least one chip,
    and a pod runs on one host, so more could never be scheduled. Checked before any
    peer list is built, because those grow with the container count (on TPU7x each
    container's list names every container of every host)."""
    if count > shape.chips_per_host:
        raise IdentityError(
            f"pod {_pod_name(pod)} has {count} containers requesting {c.TPU_RESOURCE}, but a "
            f"host of a {shape.generation.name} {shape.topology} slice has "
            f"{shape.chips_per_host} chips and each TPU container needs at least one: give the "
            f"pod at most {shape.chips_per_host} TPU containers (usually one container "
            f"requesting all {shape.chips_per_host} chips) and move the other containers' "
            f"{c.TPU_RESOURCE} requests into them"
        )


def read_identity(pod: Mapping[str, Any]) -> PodIdentity | None:
    """The pod's place in its slices, or None when it is not a TPU worker pod.

    A pod that requests no TPU, or a head pod, needs no identity: it is admitted
    unchanged. A TPU worker whose labels or annotations are missing raises
    IdentityError with a message that says what to fix.
    """
    meta = pod.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    containers: Sequence[Mapping[str, Any]] = (pod.get("spec") or {}).get("containers") or []
    if not any(requests_tpu(ctr) for ctr in containers):
        return None
    if labels.get(c.KUBERAY_LABEL_NODE_TYPE, c.KUBERAY_NODE_TYPE_WORKER) != (
        c.KUBERAY_NODE_TYPE_WORKER
    ):
        return None
    cluster = labels.get(c.KUBERAY_LABEL_CLUSTER)
    group = labels.get(c.KUBERAY_LABEL_GROUP)
    if not cluster or not group:
        raise IdentityError(
            f"pod {_pod_name(pod)} carries {c.LABEL_CLUSTER} but not KubeRay's "
            f"{c.KUBERAY_LABEL_CLUSTER} and {c.KUBERAY_LABEL_GROUP} labels; TPU worker pods "
            f"must be created by KubeRay from the RayCluster tpuslice-operator renders"
        )
    # a dynamic slice (a GKE Slice over tpu7x partitions) gets the identity of a tpu7x
    # multi-host slice of its topology: GKE's slice controller makes it one ICI domain,
    # and its hosts are the pods pinned to it, as on a pool
    resolve = (
        dynamic_slice_shape
        if annotations.get(c.ANNOTATION_DYNAMIC_SLICE) == "true"
        else slice_shape
    )
    try:
        shape = resolve(
            _required(pod, annotations, c.ANNOTATION_TPU_TYPE, "annotation"),
            _required(pod, labels, c.LABEL_TOPOLOGY, "label"),
            _positive_int(
                pod,
                c.ANNOTATION_CHIPS_PER_HOST,
                _required(pod, annotations, c.ANNOTATION_CHIPS_PER_HOST, "annotation"),
            ),
        )
    except TopologyError as err:
        raise IdentityError(f"pod {_pod_name(pod)}: {err.message}") from None
    _check_tpu_containers(pod, shape, sum(1 for ctr in containers if requests_tpu(ctr)))
    slices = _positive_int(
        pod, c.ANNOTATION_SLICES, _required(pod, annotations, c.ANNOTATION_SLICES, "annotation")
    )
    replica = _index_label(pod, labels, c.KUBERAY_LABEL_REPLICA_INDEX)
    if shape.multi_host or c.KUBERAY_LABEL_HOST_INDEX in labels:
        host = _index_label(pod, labels, c.KUBERAY_LABEL_HOST_INDEX)
    else:
        host = 0  # KubeRay sets the host index only when numOfHosts > 1
    elastic = annotations.get(c.ANNOTATION_ELASTIC) == "true"
    # an elastic set's replica indices follow KubeRay's scale-ups and -downs, and no
    # MEGASCALE_SLICE_ID of ours depends on them: only a fixed set's are checked
    if replica >= slices and not elastic:
        raise IdentityError(
            f"pod {_pod_name(pod)}: replica index {replica} is not below the slice count "
            f"{slices} ({c.ANNOTATION_SLICES}); its MEGASCALE_SLICE_ID would be out of range"
        )
    if host >= shape.hosts:
        raise IdentityError(
            f"pod {_pod_name(pod)}: host index {host} is not below the {shape.hosts} hosts of a "
            f"{shape.generation.name} {shape.topology} slice with {shape.chips_per_host} chips "
            f"per host; numOfHosts of the worker group does not match the topology"
        )
    identity = PodIdentity(
        cluster=cluster,
        group=group,
        replica_index=replica,
        host_index=host,
        shape=shape,
        slices=slices,
        elastic=elastic,
        multislice=annotations.get(c.ANNOTATION_MULTISLICE) != "false",
    )
    if shape.multi_host:
        _check_dns_label(pod, "hostname", identity.hostname)
        _check_dns_label(pod, "headless Service name", identity.subdomain)
    return identity


def desired_env(
    identity: PodIdentity,
    tpu_index: int,
    tpu_containers: int,
    *,
    megascale: bool,
    peers: PeerLists | None = None,
) -> tuple[EnvSetting, ...]:
    """Env for the ``tpu_index``-th TPU container of a pod, in the order they are appended.

    ``megascale`` adds the multislice settings (GKE adds them only when the user
    set ``MEGASCALE_NUM_SLICES``; we also add them, with the count, whenever the
    cluster has more than one slice). ``TPU_DEVICE_PLUGIN_HOST_IP`` precedes
    ``TPU_DEVICE_PLUGIN_ADDR`` because Kubernetes expands ``$(VAR)`` only from
    variables defined earlier in the list. ``peers``: the pod's ``peer_lists``, passed
    by a caller that builds the env of several containers (computed here if absent).
    """
    if peers is None:
        peers = peer_lists(identity, tpu_containers)
    worker_id = identity.host_index
    if identity.tpu7x:
        worker_id = identity.host_index * tpu_containers + tpu_index
    env = [
        EnvSetting(c.ENV_TPU_WORKER_ID, str(worker_id)),
        EnvSetting(c.ENV_TPU_NAME, identity.tpu_name),
    ]
    if identity.multi_host:
        env.append(EnvSetting(c.ENV_TPU_WORKER_HOSTNAMES, peers.worker_hostnames))
        if identity.tpu7x:
            env += [
                EnvSetting(c.ENV_TPU_PROCESS_ADDRESSES, peers.process_addresses),
                EnvSetting(c.ENV_TPU_PROCESS_PORT, str(c.TPU_PROCESS_PORT_BASE + tpu_index)),
            ]
    if megascale:
        if identity.slices > 1 and not identity.elastic:
            env.append(EnvSetting(c.ENV_MEGASCALE_NUM_SLICES, str(identity.slices)))
        megascale_port = c.MEGASCALE_PORT_BASE + (tpu_index if identity.tpu7x else 0)
        env += [
            EnvSetting(c.ENV_MEGASCALE_SLICE_ID, str(identity.replica_index)),
            EnvSetting(c.ENV_MEGASCALE_COORDINATOR_ADDRESS, peers.coordinator_address),
            EnvSetting(c.ENV_MEGASCALE_PORT, str(megascale_port)),
        ]
    env += [
        EnvSetting(c.ENV_TPU_DEVICE_PLUGIN_HOST_IP, field_path="status.hostIP"),
        EnvSetting(
            c.ENV_TPU_DEVICE_PLUGIN_ADDR,
            f"$({c.ENV_TPU_DEVICE_PLUGIN_HOST_IP}):{c.TPU_DEVICE_PLUGIN_PORT}",
        ),
    ]
    return tuple(env)


def _is_set(entry: Mapping[str, Any]) -> bool:
    return bool(entry.get("value")) or entry.get("valueFrom") is not None


def _is_placeholder(name: str, entry: Mapping[str, Any], tpu_index: int) -> bool:
    """Values GKE's webhook also overwrites: unset, ``localhost`` defaults, a default worker id.

    A template-wide ``TPU_WORKER_ID`` equal to the container's position is what
    single-host manifests carry; kept on a multi-host slice it would give every
    host the same id, so it is replaced like GKE does.
    """
    if not _is_set(entry):
        return True
    if entry.get("valueFrom") is not None:
        return False
    value = str(entry.get("value"))
    if name == c.ENV_TPU_WORKER_HOSTNAMES:
        return value == "localhost"
    if name == c.ENV_TPU_PROCESS_ADDRESSES:
        return "localhost" in value
    if name == c.ENV_TPU_WORKER_ID:
        return value == str(tpu_index)
    return False


def _merge_env(
    container: dict[str, Any],
    desired: Sequence[EnvSetting],
    tpu_index: int,
    kept: list[Note],
    replaced: list[Note],
) -> None:
    """Set each desired var by name: add if absent, replace placeholders, keep user values."""
    env: list[dict[str, Any]] = list(container.get("env") or [])
    cname = str(container.get("name", ""))
    for setting in desired:
        wanted = setting.to_k8s()
        positions = [i for i, entry in enumerate(env) if entry.get("name") == setting.name]
        if not positions:
            env.append(wanted)
            continue
        effective = env[positions[-1]]  # Kubernetes: the last entry of a name wins
        if effective == wanted:
            continue
        if _is_placeholder(setting.name, effective, tpu_index):
            if _is_set(effective):
                replaced.append(Note(cname, setting.name))
            env[positions[0]] = wanted
            for i in reversed(positions[1:]):
                del env[i]
        else:
            kept.append(Note(cname, setting.name))
    container["env"] = env


def mutate_pod(pod: Mapping[str, Any]) -> MutationResult:
    """The pod as GKE's TPU webhook would leave it, minus affinity: a new dict.

    Raises IdentityError for a TPU worker pod whose identity cannot be computed.
    Idempotent: ``mutate_pod(mutate_pod(p).pod).pod == mutate_pod(p).pod``.
    """
    new: dict[str, Any] = copy.deepcopy(dict(pod))
    identity = read_identity(new)
    if identity is None:
        return MutationResult(pod=new, identity=None)
    spec: dict[str, Any] = new.setdefault("spec", {})
    kept: list[Note] = []
    replaced: list[Note] = []
    if identity.multi_host:
        # Single-host pods get neither, as on GKE: they have no peers to resolve.
        for field, value in (("hostname", identity.hostname), ("subdomain", identity.subdomain)):
            if spec.get(field) not in (None, "", value):
                replaced.append(Note("", f"spec.{field}"))
            spec[field] = value
    containers: list[dict[str, Any]] = spec.get("containers") or []
    tpu_containers = [ctr for ctr in containers if requests_tpu(ctr)]
    peers = peer_lists(identity, len(tpu_containers))
    for tpu_index, container in enumerate(tpu_containers):
        user_megascale = any(
            entry.get("name") == c.ENV_MEGASCALE_NUM_SLICES and _is_set(entry)
            for entry in container.get("env") or []
        )
        desired = desired_env(
            identity,
            tpu_index,
            len(tpu_containers),
            megascale=identity.multislice
            and ((identity.slices > 1 and not identity.elastic) or user_megascale),
            peers=peers,
        )
        _merge_env(container, desired, tpu_index, kept, replaced)
    return MutationResult(pod=new, identity=identity, kept=tuple(kept), replaced=tuple(replaced))
