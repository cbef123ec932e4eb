"""The one module that talks to the API server.

Every write the operator makes is a method here, so RBAC (charts/) can be read
off this file, API calls can be counted in one place, and the rest of the code
stays pure. Calls go through the official client's transport (auth, TLS,
kubeconfig or in-cluster config) but skip its model classes: the operator works
on plain dicts, and deserialising every pod into models costs memory and time.
Blocking calls run on a dedicated thread pool so kopf's event loop never waits.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import quote, urlencode

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from tpuslice.model import constants as c
from tpuslice.runtime.health import Health
from tpuslice.runtime.metrics import Metrics

__all__ = ["ApiError", "ClusterApi", "Kube", "api_path", "credentials", "load_api_client"]

log = logging.getLogger(__name__)

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


#: (None, every record) for a listing, (ADDED|MODIFIED|DELETED, {key: record}) for an event.


class ApiError(Exception):
    """A non-2xx answer; ``status`` and the server's ``reason`` say what happened."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def conflict(self) -> bool:
        return self.status == 409


class ClusterApi(Protocol):
    """The calls the reconcile parts, the finalizer and the sweep make: ``Kube`` in the
    operator, the fake in tests/support/fake_kube.py in unit tests (mypy checks that the
    fake matches, so a changed signature here breaks the fake, not a test at run time)."""

    async def apply_ray(self, body: Mapping[str, Any]) -> Any: ...

    async def get_ray(self, plural: str, namespace: str, name: str) -> Any: ...

    async def delete_ray(self, plural: str, namespace: str, name: str, uid: str) -> None: ...

    async def get_crd(self, name: str) -> Any: ...

    async def read_kueue(
        self, plural: str, *, namespace: str = "", name: str = "", label_selector: str = ""
    ) -> Any: ...

    async def create_reservation(self, body: Mapping[str, Any]) -> Any: ...

    async def get_reservation(self, name: str) -> Any: ...

    async def delete_reservation(self, name: str, uid: str) -> bool: ...

    async def set_reservation_phase(self, name: str, phase: str, message: str) -> None: ...

    async def annotate_reservation(
        self, name: str, uid: str, annotations: Mapping[str, str | None]
    ) -> Any: ...

    async def list_pods(self, namespace: str, label_selector: str) -> list[Any]: ...

    async def release_pod(
        self,
        namespace: str,
        name: str,
        node_selector: Mapping[str, str],
        annotations: Mapping[str, str] | None = None,
    ) -> None: ...

    async def delete_pod(
        self, namespace: str, name: str, grace_seconds: int | None = None
    ) -> bool: ...

    async def create_podtemplate(self, body: Mapping[str, Any]) -> Any: ...

    async def patch_podtemplate(
        self, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> Any: ...

    async def delete_podtemplate(self, namespace: str, name: str) -> bool: ...

    async def create_provisioning_request(self, body: Mapping[str, Any]) -> Any: ...

    async def annotate_provisioning_request(
        self, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> bool: ...

    async def delete_provisioning_request(
        self, namespace: str, name: str, uid: str | None = None
    ) -> bool: ...

    async def hand_over_reservation(
        self, name: str, holder: Mapping[str, Any], resource_version: str
    ) -> Any: ...

    async def list_gke_slices(self) -> list[Any]: ...

    async def create_gke_slice(self, body: Mapping[str, Any]) -> Any: ...

    async def delete_gke_slice(self, name: str, uid: str) -> bool: ...

    async def patch_status(
        self, plural: str, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None: ...

    async def post_event(
        self, involved: Mapping[str, Any], kind: str, reason: str, message: str
    ) -> None: ...


def load_api_client(kubeconfig: str | None = None, pool_size: int = 32) -> Any:
    """In-cluster config when running in a pod, else the kubeconfig (or $KUBECONFIG)."""
    configuration = k8s_client.Configuration()
    if kubeconfig is None:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(client_configuration=configuration)
    else:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    return k8s_client.ApiClient(configuration)


@dataclass(frozen=True)
class Credentials:
    """Where the API server is and how to log in, as the kubernetes client resolved it
    (kopf's ``ConnectionInfo`` is built from this, so kopf and ``Kube`` log in alike)."""

    server: str
    ca_path: str | None
    insecure: bool
    scheme: str | None
    token: str | None
    certificate_path: str | None
    private_key_path: str | None


def credentials(kubeconfig: str | None = None) -> Credentials:
    """The same resolution as :func:`load_api_client`: in a pod the service account and
    ``KUBERNETES_SERVICE_HOST`` (an IP: no cluster DNS needed), else the kubeconfig.

    Read afresh on every call, so a re-login after a 401 picks up a rotated token."""
    configuration = load_api_client(kubeconfig, pool_size=1).configuration
    header = configuration.get_api_key_with_prefix(
        "BearerToken"
    ) or configuration.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0] if parts else None)
    return Credentials(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert or None,
        insecure=not configuration.verify_ssl,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file or None,
        private_key_path=configuration.key_file or None,
    )


def api_path(group: str, version: str, plural: str, name: str = "", namespace: str = "") -> str:
    base = "/api/v1" if group == "" else f"/apis/{group}/{version}"
    if namespace:
        base += f"/namespaces/{quote(namespace)}"
    base += f"/{plural}"
    return base + (f"/{quote(name)}" if name else "")


def _raise_for(status: int, reason: str, data: bytes) -> None:
    try:
        payload = json.loads(data)
    except (ValueError, TypeError):
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    raise ApiError(
        status,
        str(payload.get("reason") or reason),
        str(payload.get("message") or data[:500]),
    )


def _target(path: str, body: Any) -> str:
    """The name a write is about: the object's, from the path or (a create) the body."""
    meta = body.get("metadata") if isinstance(body, Mapping) else None
    name = meta.get("name") or meta.get("generateName") if isinstance(meta, Mapping) else None
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    if not name or path.rsplit("/", 1)[-1] == "status":
        parts = path.split("/")
        if parts[-1] == "status":
            parts = parts[:-1]
        name = parts[-1]
        namespace = parts[parts.index("namespaces") + 1] if "namespaces" in parts[:-1] else None
    return f"{namespace}/{name}" if namespace else str(name)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Kube:
    """Async wrapper over one ApiClient; ``metrics`` counts requests by (verb, resource)
    and failed ones."""

    api: Any
    executor: ThreadPoolExecutor
    metrics: Metrics = field(default_factory=Metrics)
    #: Told whether each followed kind's list and watch get answers (readiness).
    health: Health = field(default_factory=Health)

    @classmethod
    def connect(
        cls,
        kubeconfig: str | None = None,
        threads: int = 32,
        metrics: Metrics | None = None,
        health: Health | None = None,
        held_open: int = 0,
    ) -> Kube:
        """``held_open``: connections held by long requests besides the ``threads``' (the
        informers' watches, each on a thread of its own). The pool keeps a connection for
        each of both: a smaller pool closes a connection whenever more are in use at once
        ("Connection pool is full, discarding connection") and the next request pays a new
        TCP and TLS handshake, on the client's CPU and the API server's."""
        return cls(
            api=load_api_client(kubeconfig, pool_size=threads + held_open),
            executor=ThreadPoolExecutor(threads, thread_name_prefix="kube"),
            metrics=metrics or Metrics(),
            health=health or Health(),
        )

    # ------------------------------------------------------------ transport
    def send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str | None,
        timeout: float | tuple[float, float] = 30,
    ) -> Any:
        """One request; the response is not read yet (a watch streams it)."""
        url = self.api.configuration.host + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        auth: dict[str, str] = {}
        self.api.update_params_for_auth(auth, None, ["BearerToken"], path, method, body)
        headers.update(auth)
        response = self.api.rest_client.request(
            method, url, headers=headers, body=body, _request_timeout=timeout
        )
        if response.status >= 400:
            _raise_for(response.status, response.reason, response.read())
        return response

    def request(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str | None,
        timeout: float = 30,
    ) -> Any:
        data = self.send(method, path, query, body, content_type, timeout).read()
        return json.loads(data) if data else None

    def call_sync(
        self,
        method: str,
        path: str,
        *,
        resource: str,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float = 30,
    ) -> Any:
        """One counted request on the calling thread: for the shell's own threads (leader
        election, the webhook's certificates), which must not queue behind reconciles
        in ``executor``."""
        self.metrics.api_request(method, resource)
        try:
            result = self.request(method, path, query, body, content_type, timeout)
        except ApiError as exc:
            self.metrics.api_error()
            if method != "GET":
                log.debug(
                    "%s %s %s: %s %s",
                    method,
                    resource,
                    _target(path, body),
                    exc.status,
                    exc.reason,
                )
            raise
        except Exception as exc:
            self.metrics.api_error()
            if method != "GET":
                log.debug("%s %s %s: %s", method, resource, _target(path, body), exc)
            raise
        if method != "GET":
            log.debug("%s %s %s: ok", method, resource, _target(path, body))
        return result

    async def call(
        self,
        method: str,
        path: str,
        *,
        resource: str,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
    ) -> Any:
        """``call_sync`` on ``executor``, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(
            self.executor,
            functools.partial(
                self.call_sync,
                method,
                path,
                resource=resource,
                query=query,
                body=body,
                content_type=content_type,
            ),
        )

    # ------------------------------------------------------------ KubeRay's objects
    async def apply_ray(self, body: Mapping[str, Any]) -> Any:
        """Server-side apply of a RayCluster, RayJob or RayService under our field manager:
        we own only the fields we send."""
        meta = body["metadata"]
        plural = c.RAY_PLURALS[body["kind"]]
        return await self.call(
            "PATCH",
            api_path(c.RAY_GROUP, c.RAY_VERSION, plural, meta["name"], meta["namespace"]),
            resource=plural,
            query={"fieldManager": c.FIELD_MANAGER, "force": "true"},
            body=body,
            content_type=APPLY,
        )

    async def get_ray(self, plural: str, namespace: str, name: str) -> Any:
        """The KubeRay object of that name, or None (also when KubeRay's CRD is missing)."""
        try:
            return await self.call(
                "GET",
                api_path(c.RAY_GROUP, c.RAY_VERSION, plural, name, namespace),
                resource=plural,
            )
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    async def _delete(
        self, path: str, resource: str, uid: str | None = None, grace_seconds: int | None = None
    ) -> bool:
        """Delete in the background; with ``uid``, only the object of that uid (409 when
        the name now belongs to another object, which is never deleted). False when it
        was gone already or is another object now."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.call("DELETE", path, resource=resource, body=body)
        except ApiError as exc:
            if exc.not_found or (uid and exc.conflict):
                return False
            raise
        return True

    async def delete_ray(self, plural: str, namespace: str, name: str, uid: str) -> None:
        """Delete exactly the KubeRay object with ``uid`` (ours), never another of that name."""
        await self._delete(
            api_path(c.RAY_GROUP, c.RAY_VERSION, plural, name, namespace), plural, uid
        )

    async def get_crd(self, name: str) -> Any:
        """A CustomResourceDefinition (KubeRay's, for its pod-template schema)."""
        return await self.call(
            "GET",
            api_path("apiextensions.k8s.io", "v1", "customresourcedefinitions", name),
            resource="customresourcedefinitions",
        )

    # ------------------------------------------------------------ Kueue's objects (read only)
    async def read_kueue(
        self, plural: str, *, namespace: str = "", name: str = "", label_selector: str = ""
    ) -> Any:
        """One of Kueue's objects (``name``) or the items of a LIST (none named), read at
        the first of Kueue's API versions this cluster serves (v1beta2 from Kueue 0.15,
        v1beta1 before); None, or [] for a LIST, when Kueue or the object is not there."""
        kueue_plural = plural
        for version in c.KUEUE_VERSIONS:
            path = api_path(c.KUEUE_GROUP, version, kueue_plural, name, namespace)
            query = {"labelSelector": label_selector} if label_selector and not name else None
            try:
                found = await self.call("GET", path, resource=kueue_plural, query=query)
            except ApiError as exc:
                if exc.not_found:
                    continue
                raise
            return found if name else list((found or {}).get("items") or [])
        return None if name else []

    async def crd_exists(self, name: str) -> bool:
        try:
            await self.get_crd(name)
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True

    # ------------------------------------------------------------ reservations
    async def create_reservation(self, body: Mapping[str, Any]) -> Any:
        """The claim. Raises ApiError(already_exists) when someone holds the pool."""
        return await self.call(
            "POST",
            api_path(c.GROUP, c.VERSION, c.PLURAL_RESERVATION),
            resource="slicereservations",
            body=body,
        )

    async def get_reservation(self, name: str) -> Any:
        return await self.call(
            "GET",
            api_path(c.GROUP, c.VERSION, c.PLURAL_RESERVATION, name),
            resource="slicereservations",
        )

    async def delete_reservation(self, name: str, uid: str) -> bool:
        """Delete exactly the reservation with ``uid``; False if it is gone or the pool's
        reservation is another one now (409: a new claim of the pool is never deleted)."""
        path = api_path(c.GROUP, c.VERSION, c.PLURAL_RESERVATION, name)
        return await self._delete(path, "slicereservations", uid)

    async def hand_over_reservation(
        self, name: str, holder: Mapping[str, Any], resource_version: str
    ) -> Any:
        """Give a held pool to another slice of the same holder (a TPUSliceJob's retry):
        a merge patch of ``spec.holder`` conditional on ``resource_version`` (409 when the
        reservation changed since it was read). The CRD allows only the replica to change."""
        return await self.call(
            "PATCH",
            api_path(c.GROUP, c.VERSION, c.PLURAL_RESERVATION, name),
            resource="slicereservations",
            body={"metadata": {"resourceVersion": resource_version}, "spec": {"holder": holder}},
            content_type=MERGE,
        )

    async def annotate_reservation(
        self, name: str, uid: str, annotations: Mapping[str, str | None]
    ) -> Any:
        """Set (a value) or remove (None) annotations of exactly the reservation with
        ``uid`` (a merge patch carrying the uid: 409 when the pool's reservation is
        another one now)."""
        return await self.call(
            "PATCH",
            api_path(c.GROUP, c.VERSION, c.PLURAL_RESERVATION, name),
            resource="slicereservations",
            body={"metadata": {"uid": uid, "annotations": dict(annotations)}},
            content_type=MERGE,
        )

    def get_reservation_sync(self, name: str, timeout: float = 2) -> Any:
        """One SliceReservation, read live (the identity webhook, on its threads)."""
        return self.call_sync(
            "GET",
            api_path(c.GROUP, c.VERSION, c.PLURAL_RESERVATION, name),
            resource="slicereservations",
            timeout=timeout,
        )

    async def list_pods(self, namespace: str, label_selector: str) -> list[Any]:
        """The pods of ``namespace`` with ``label_selector``, read live (a quorum LIST)."""
        found = await self.call(
            "GET",
            api_path("", "v1", "pods", namespace=namespace),
            resource="pods",
            query={"labelSelector": label_selector},
        )
        return list((found or {}).get("items") or [])

    async def set_reservation_phase(self, name: str, phase: str, message: str) -> None:
        await self.call(
            "PATCH",
            api_path(c.GROUP, c.VERSION, c.PLURAL_RESERVATION, name) + "/status",
            resource="slicereservations/status",
            body={"status": {"phase": phase, "message": message}},
            content_type=MERGE,
        )

    # ------------------------------------------------------------ pods
    async def release_pod(
        self,
        namespace: str,
        name: str,
        node_selector: Mapping[str, str],
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """ONE patch: pin to the slice's unit (``CapacityUnit.pin``: its node pool, or its
        node) and remove our gate (other gates stay); with ``annotations`` (a
        ProvisioningRequest's consume annotations) in the same patch."""
        body: dict[str, Any] = {
            "spec": {
                "nodeSelector": dict(node_selector),
                "schedulingGates": [{"$patch": "delete", "name": c.SCHEDULING_GATE}],
            }
        }
        if annotations:
            body["metadata"] = {"annotations": dict(annotations)}
        await self.call(
            "PATCH",
            api_path("", "v1", "pods", name, namespace),
            resource="pods",
            body=body,
            content_type=STRATEGIC,
        )

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> bool:
        """Delete a worker pod (a slice whose capacity was revoked or whose unit is
        disrupted: KubeRay replaces the whole replica); False if already gone. With
        ``grace_seconds``, DeleteOptions.gracePeriodSeconds: the kubelet sends SIGTERM
        and kills after that long (Kubernetes "Pod Lifecycle", termination of Pods)."""
        return await self._delete(
            api_path("", "v1", "pods", name, namespace), "pods", grace_seconds=grace_seconds
        )

    # ------------------------------------------------------------ capacity on demand
    async def create_podtemplate(self, body: Mapping[str, Any]) -> Any:
        """The PodTemplate a ProvisioningRequest points at (created before the request)."""
        meta = body["metadata"]
        return await self.call(
            "POST",
            api_path("", "v1", c.PODTEMPLATE_PLURAL, namespace=meta["namespace"]),
            resource="podtemplates",
            body=body,
        )

    async def patch_podtemplate(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Any:
        """Merge-patch a PodTemplate of ours (its request as controller owner, a refreshed
        template)."""
        return await self.call(
            "PATCH",
            api_path("", "v1", c.PODTEMPLATE_PLURAL, name, namespace),
            resource="podtemplates",
            body=patch,
            content_type=MERGE,
        )

    async def delete_podtemplate(self, namespace: str, name: str) -> bool:
        path = api_path("", "v1", c.PODTEMPLATE_PLURAL, name, namespace)
        return await self._delete(path, "podtemplates")

    async def create_provisioning_request(self, body: Mapping[str, Any]) -> Any:
        """Raises ApiError(not_found) when the ProvisioningRequest CRD is not installed."""
        meta = body["metadata"]
        return await self.call(
            "POST",
            api_path(
                c.PROVREQ_GROUP, c.PROVREQ_VERSION, c.PROVREQ_PLURAL, namespace=meta["namespace"]
            ),
            resource="provisioningrequests",
            body=body,
        )

    async def annotate_provisioning_request(
        self, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> bool:
        """Merge-patch annotations onto a request of ours (its spec is immutable, its
        metadata is not); False if it is gone."""
        try:
            await self.call(
                "PATCH",
                api_path(c.PROVREQ_GROUP, c.PROVREQ_VERSION, c.PROVREQ_PLURAL, name, namespace),
                resource="provisioningrequests",
                body={"metadata": {"annotations": dict(annotations)}},
                content_type=MERGE,
            )
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True

    async def delete_provisioning_request(
        self, namespace: str, name: str, uid: str | None = None
    ) -> bool:
        """Delete (only the request with ``uid`` when given); False if already gone. Its
        PodTemplate goes with it (the request is its controller owner)."""
        path = api_path(c.PROVREQ_GROUP, c.PROVREQ_VERSION, c.PROVREQ_PLURAL, name, namespace)
        return await self._delete(path, "provisioningrequests", uid)

    # ------------------------------------------------------------ GKE Slices (TPU7x)
    async def list_gke_slices(self) -> list[Any]:
        """Every GKE Slice (cluster-scoped, few: one per formed TPU7x slice); [] when the
        Slice CRD is not installed (GKE's slice controller is not enabled)."""
        try:
            found = await self.call(
                "GET", api_path(c.SLICE_GROUP, c.SLICE_VERSION, c.SLICE_PLURAL), resource="slices"
            )
        except ApiError as exc:
            if exc.not_found:
                return []
            raise
        return list((found or {}).get("items") or [])

    async def create_gke_slice(self, body: Mapping[str, Any]) -> Any:
        """Ask GKE's slice controller to link the body's partitions into one slice."""
        return await self.call(
            "POST",
            api_path(c.SLICE_GROUP, c.SLICE_VERSION, c.SLICE_PLURAL),
            resource="slices",
            body=body,
        )

    async def delete_gke_slice(self, name: str, uid: str) -> bool:
        """Delete exactly the Slice with ``uid`` (ours); GKE's finalizer keeps it until its
        controller has unlinked the partitions. False if it is gone already."""
        path = api_path(c.SLICE_GROUP, c.SLICE_VERSION, c.SLICE_PLURAL, name)
        return await self._delete(path, "slices", uid)

    # ------------------------------------------------------------ admission
    def apply_webhook_configuration(self, body: Mapping[str, Any]) -> None:
        """Server-side apply; every replica applies the same body (the same shared CA),
        so a second apply changes nothing."""
        self.call_sync(
            "PATCH",
            api_path(
                "admissionregistration.k8s.io",
                "v1",
                "mutatingwebhookconfigurations",
                body["metadata"]["name"],
            ),
            resource="mutatingwebhookconfigurations",
            query={"fieldManager": c.FIELD_MANAGER, "force": "true"},
            body=body,
            content_type=APPLY,
        )

    def apply_validating_webhook_configuration(self, body: Mapping[str, Any]) -> None:
        """Server-side apply of the policy webhook's configuration, as the mutating one."""
        self.call_sync(
            "PATCH",
            api_path(
                "admissionregistration.k8s.io",
                "v1",
                "validatingwebhookconfigurations",
                body["metadata"]["name"],
            ),
            resource="validatingwebhookconfigurations",
            query={"fieldManager": c.FIELD_MANAGER, "force": "true"},
            body=body,
            content_type=APPLY,
        )

    def list_policies(self, limit: int, timeout: float = 2) -> Any:
        """One page of TPUSlicePolicies (the policy webhook's reader, on its threads)."""
        return self.call_sync(
            "GET",
            api_path(c.GROUP, c.VERSION, c.PLURAL_POLICY),
            resource="tpuslicepolicies",
            query={"limit": str(limit)},
            timeout=timeout,
        )

    def get_namespace(self, name: str, timeout: float = 2) -> Any:
        """The Namespace, or None when there is none (the policy webhook's reader)."""
        try:
            return self.call_sync(
                "GET",
                api_path("", "v1", "namespaces", name),
                resource="namespaces",
                timeout=timeout,
            )
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    # ------------------------------------------------------------ leader election
    def get_lease(self, namespace: str, name: str, timeout: float = 10) -> Any:
        """The Lease, or None when there is none."""
        try:
            return self.call_sync(
                "GET",
                api_path("coordination.k8s.io", "v1", "leases", name, namespace),
                resource="leases",
                timeout=timeout,
            )
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    def create_lease(self, body: Mapping[str, Any], timeout: float = 10) -> Any:
        """Create the Lease by server-side apply under this instance's own field manager,
        without force: authorized as ``create`` of that one name (so RBAC can name it,
        which a POST cannot), and a racing second creator's apply conflicts (409) on
        holderIdentity, which the first one owns."""
        meta = body["metadata"]
        return self.call_sync(
            "PATCH",
            api_path("coordination.k8s.io", "v1", "leases", meta["name"], meta["namespace"]),
            resource="leases",
            query={"fieldManager": f"{c.FIELD_MANAGER}-{body['spec']['holderIdentity']}"[:128]},
            body=body,
            content_type=APPLY,
            timeout=timeout,
        )

    def update_lease(self, body: Mapping[str, Any], timeout: float = 10) -> Any:
        """Replace the Lease under ``metadata.resourceVersion``: 409 if anyone wrote since."""
        meta = body["metadata"]
        return self.call_sync(
            "PUT",
            api_path("coordination.k8s.io", "v1", "leases", meta["name"], meta["namespace"]),
            resource="leases",
            query={"fieldManager": c.FIELD_MANAGER},
            body=body,
            timeout=timeout,
        )

    # ------------------------------------------------------------ the webhook's certificates
    def get_secret(self, namespace: str, name: str) -> Any:
        return self.call_sync(
            "GET", api_path("", "v1", "secrets", name, namespace), resource="secrets"
        )

    def update_secret(self, body: Mapping[str, Any]) -> Any:
        """Replace the Secret under ``metadata.resourceVersion``: 409 if anyone wrote since."""
        meta = body["metadata"]
        return self.call_sync(
            "PUT",
            api_path("", "v1", "secrets", meta["name"], meta["namespace"]),
            resource="secrets",
            query={"fieldManager": c.FIELD_MANAGER},
            body=body,
        )

    # ------------------------------------------------------------ our status and events
    async def patch_status(
        self, plural: str, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        """Merge-patch the status of one of our objects (``plural``: tpusliceclusters,
        tpuslicejobs or tpusliceservices)."""
        await self.call(
            "PATCH",
            api_path(c.GROUP, c.VERSION, plural, name, namespace) + "/status",
            resource=f"{plural}/status",
            body={"status": status},
            content_type=MERGE,
        )

    async def post_event(
        self, involved: Mapping[str, Any], kind: str, reason: str, message: str
    ) -> None:
        """A core/v1 Event on ``involved`` (a TPUSliceCluster); failures are only logged."""
        meta = involved["metadata"]
        now = _now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": c.API_VERSION,
                "kind": involved.get("kind") or c.KIND_CLUSTER,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": c.FIELD_MANAGER},
            "reportingComponent": c.FIELD_MANAGER,
            "reportingInstance": c.FIELD_MANAGER,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.call(
                "POST",
                api_path("", "v1", "events", namespace=meta["namespace"]),
                resource="events",
                body=event,
            )
        except ApiError as exc:
            self.metrics.error("event")
            log.warning(
                "could not post event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], exc
            )
