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
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from tpuslice import constants as c
from tpuslice.health import Health
from tpuslice.metrics import Metrics
from tpuslice.store import ObjectKey

__all__ = ["ApiError", "Deliver", "Followed", "Kube", "iter_lines", "load_api_client", "object_key"]

log = logging.getLogger(__name__)

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


#: A watch request ends after this long and is reopened from the last resourceVersion.
WATCH_SECONDS = 290
LIST_PAGE_SIZE = 500
#: How often to look again for a kind whose CRD is missing (KubeRay installed later).
MISSING_KIND_RETRY_SECONDS = 30.0

#: (None, every record) for a listing, (ADDED|MODIFIED|DELETED, {key: record}) for an event.
Deliver = Callable[[str | None, dict[ObjectKey, Any]], None]


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


def _path(group: str, version: str, plural: str, name: str = "", namespace: str = "") -> str:
    base = "/api/v1" if group == "" else f"/apis/{group}/{version}"
    if namespace:
        base += f"/namespaces/{quote(namespace)}"
    base += f"/{plural}"
    return base + (f"/{quote(name)}" if name else "")


@dataclass(frozen=True)
class Followed:
    """A kind the operator lists and watches itself, and how to shrink its objects."""

    group: str
    version: str
    plural: str
    convert: Callable[[Mapping[str, Any]], Any]
    label_selector: str = ""
    namespace: str = ""  # "" for all namespaces (and for cluster-scoped kinds)

    def path(self) -> str:
        return _path(self.group, self.version, self.plural, namespace=self.namespace)

    def query(self) -> dict[str, str]:
        return {"labelSelector": self.label_selector} if self.label_selector else {}


def object_key(obj: Mapping[str, Any]) -> ObjectKey:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def iter_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Whole lines out of a stream of chunks (a watch sends one JSON event per line)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from (line for line in lines if line.strip())
    if pending.strip():
        yield pending


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
    ) -> Kube:
        return cls(
            api=load_api_client(kubeconfig, pool_size=threads),
            executor=ThreadPoolExecutor(threads, thread_name_prefix="kube"),
            metrics=metrics or Metrics(),
            health=health or Health(),
        )

    # ------------------------------------------------------------ transport
    def _send(
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

    def _call_sync(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str | None,
        timeout: float = 30,
    ) -> Any:
        data = self._send(method, path, query, body, content_type, timeout).read()
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
            return self._call_sync(method, path, query, body, content_type, timeout)
        except Exception:
            self.metrics.api_error()
            raise

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

    # ------------------------------------------------------------ RayCluster
    async def apply_raycluster(self, body: Mapping[str, Any]) -> Any:
        """Server-side apply under our field manager: we own only the fields we send."""
        meta = body["metadata"]
        return await self.call(
            "PATCH",
            _path(
                c.RAY_GROUP, c.RAY_VERSION, c.RAY_PLURAL_CLUSTER, meta["name"], meta["namespace"]
            ),
            resource="rayclusters",
            query={"fieldManager": c.FIELD_MANAGER, "force": "true"},
            body=body,
            content_type=APPLY,
        )

    async def get_raycluster(self, namespace: str, name: str) -> Any:
        """The RayCluster of that name, or None (also when KubeRay's CRD is missing)."""
        try:
            return await self.call(
                "GET",
                _path(c.RAY_GROUP, c.RAY_VERSION, c.RAY_PLURAL_CLUSTER, name, namespace),
                resource="rayclusters",
            )
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    async def delete_raycluster(self, namespace: str, name: str, uid: str) -> None:
        """Delete exactly the RayCluster with ``uid`` (ours), never another of that name."""
        try:
            await self.call(
                "DELETE",
                _path(c.RAY_GROUP, c.RAY_VERSION, c.RAY_PLURAL_CLUSTER, name, namespace),
                resource="rayclusters",
                body={"propagationPolicy": "Background", "preconditions": {"uid": uid}},
            )
        except ApiError as exc:
            if not (exc.not_found or exc.conflict):
                raise

    async def get_crd(self, name: str) -> Any:
        """A CustomResourceDefinition (KubeRay's, for its pod-template schema)."""
        return await self.call(
            "GET",
            _path("apiextensions.k8s.io", "v1", "customresourcedefinitions", name),
            resource="customresourcedefinitions",
        )

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
            _path(c.GROUP, c.VERSION, c.PLURAL_RESERVATION),
            resource="slicereservations",
            body=body,
        )

    async def get_reservation(self, name: str) -> Any:
        return await self.call(
            "GET",
            _path(c.GROUP, c.VERSION, c.PLURAL_RESERVATION, name),
            resource="slicereservations",
        )

    async def delete_reservation(self, name: str, uid: str | None = None) -> bool:
        """Delete (only the reservation with ``uid`` when given); False if already gone."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.call(
                "DELETE",
                _path(c.GROUP, c.VERSION, c.PLURAL_RESERVATION, name),
                resource="slicereservations",
                body=body,
            )
        except ApiError as exc:
            if exc.not_found or exc.conflict:
                return False
            raise
        return True

    async def set_reservation_phase(self, name: str, phase: str, message: str) -> None:
        await self.call(
            "PATCH",
            _path(c.GROUP, c.VERSION, c.PLURAL_RESERVATION, name) + "/status",
            resource="slicereservations/status",
            body={"status": {"phase": phase, "message": message}},
            content_type=MERGE,
        )

    # ------------------------------------------------------------ pods
    async def release_pod(self, namespace: str, name: str, pool: str) -> None:
        """ONE patch: pin to the pool and remove our gate (other gates stay)."""
        await self.call(
            "PATCH",
            _path("", "v1", "pods", name, namespace),
            resource="pods",
            body={
                "spec": {
                    "nodeSelector": {c.NODE_LABEL_NODEPOOL: pool},
                    "schedulingGates": [{"$patch": "delete", "name": c.SCHEDULING_GATE}],
                }
            },
            content_type=STRATEGIC,
        )

    async def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        result = await self.call(
            "GET",
            _path("", "v1", "pods", namespace=namespace),
            resource="pods",
            query={"labelSelector": label_selector},
        )
        return list(result.get("items") or [])

    # ------------------------------------------------------------ admission
    def apply_webhook_configuration(self, body: Mapping[str, Any]) -> None:
        """Server-side apply; every replica applies the same body (the same shared CA),
        so a second apply changes nothing."""
        self.call_sync(
            "PATCH",
            _path(
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

    # ------------------------------------------------------------ leader election
    def get_lease(self, namespace: str, name: str, timeout: float = 10) -> Any:
        """The Lease, or None when there is none."""
        try:
            return self.call_sync(
                "GET",
                _path("coordination.k8s.io", "v1", "leases", name, namespace),
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
            _path("coordination.k8s.io", "v1", "leases", meta["name"], meta["namespace"]),
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
            _path("coordination.k8s.io", "v1", "leases", meta["name"], meta["namespace"]),
            resource="leases",
            query={"fieldManager": c.FIELD_MANAGER},
            body=body,
            timeout=timeout,
        )

    # ------------------------------------------------------------ the webhook's certificates
    def get_secret(self, namespace: str, name: str) -> Any:
        return self.call_sync(
            "GET", _path("", "v1", "secrets", name, namespace), resource="secrets"
        )

    def update_secret(self, body: Mapping[str, Any]) -> Any:
        """Replace the Secret under ``metadata.resourceVersion``: 409 if anyone wrote since."""
        meta = body["metadata"]
        return self.call_sync(
            "PUT",
            _path("", "v1", "secrets", meta["name"], meta["namespace"]),
            resource="secrets",
            query={"fieldManager": c.FIELD_MANAGER},
            body=body,
        )

    # ------------------------------------------------------------ our status and events
    async def patch_cluster_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        await self.call(
            "PATCH",
            _path(c.GROUP, c.VERSION, c.PLURAL_CLUSTER, name, namespace) + "/status",
            resource="tpusliceclusters/status",
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
                "kind": c.KIND_CLUSTER,
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
                _path("", "v1", "events", namespace=meta["namespace"]),
                resource="events",
                body=event,
            )
        except ApiError as exc:
            self.metrics.error("event")
            log.warning(
                "could not post event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], exc
            )

    # ------------------------------------------------------------ watches
    async def follow(self, kind: Followed, deliver: Deliver) -> threading.Event:
        """List ``kind``, then watch it forever on a thread of its own; return once the first
        listing was delivered. Returns the event that stops the thread.

        ``deliver`` runs on the calling event loop with ``(None, records)`` for a full
        listing (the first one and every relist after the watch fell too far behind) and
        ``(event type, {key: record})`` for each watch event. Converting objects into
        records happens on the watch thread, so whole objects never reach the loop."""
        loop = asyncio.get_running_loop()
        listed: asyncio.Future[None] = loop.create_future()
        stop = threading.Event()

        def on_loop(event: str | None, records: dict[ObjectKey, Any]) -> None:
            deliver(event, records)
            if event is None and not listed.done():
                listed.set_result(None)

        def emit(event: str | None, records: dict[ObjectKey, Any]) -> None:
            loop.call_soon_threadsafe(on_loop, event, records)

        threading.Thread(
            target=self._follow_forever,
            args=(kind, emit, stop),
            name=f"watch-{kind.plural}",
            daemon=True,
        ).start()
        await listed
        return stop

    def _follow_forever(
        self,
        kind: Followed,
        emit: Deliver,
        stop: threading.Event,
    ) -> None:
        version: str | None = None
        backoff = 1.0
        while not stop.is_set():
            try:
                if version is None:
                    records, version = self._list_all(kind)
                    self.health.watch_ok(kind.plural)
                    emit(None, records)
                version = self._watch_once(kind, version, emit, stop)
                backoff = 1.0
            except Exception as exc:  # also connection resets, read timeouts, bad JSON
                api_error = exc if isinstance(exc, ApiError) else None
                if api_error is not None and api_error.status == 410:
                    version = None  # our resourceVersion is too old (normal): list again
                    continue
                self.metrics.api_error()
                if api_error is not None and api_error.not_found:
                    self.health.watch_ok(kind.plural)  # the API server answered
                    version = None  # the CRD is not installed (KubeRay): nothing to follow yet
                    emit(None, {})
                    stop.wait(MISSING_KIND_RETRY_SECONDS)
                    continue
                self.health.watch_failed(kind.plural, f"{type(exc).__name__}: {exc}")
                log.warning("watching %s failed: %s; retrying in %.0fs", kind.plural, exc, backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _list_all(self, kind: Followed) -> tuple[dict[ObjectKey, Any], str]:
        """Every object (in pages), converted; and the resourceVersion to watch from."""
        records: dict[ObjectKey, Any] = {}
        token = ""
        while True:
            query = dict(kind.query(), limit=str(LIST_PAGE_SIZE))
            if token:
                query["continue"] = token
            self.metrics.api_request("LIST", kind.plural)
            page = self._call_sync("GET", kind.path(), query, None, None) or {}
            for obj in page.get("items") or []:
                records[object_key(obj)] = kind.convert(obj)
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                return records, str(meta.get("resourceVersion") or "")

    def _watch_once(
        self,
        kind: Followed,
        version: str,
        emit: Deliver,
        stop: threading.Event,
    ) -> str:
        """One watch request from ``version`` until the server ends it; the newest version."""
        query = dict(
            kind.query(),
            watch="1",
            resourceVersion=version,
            allowWatchBookmarks="true",
            timeoutSeconds=str(WATCH_SECONDS),
        )
        self.metrics.api_request("WATCH", kind.plural)
        response = self._send("GET", kind.path(), query, None, None, (10, WATCH_SECONDS + 30))
        self.health.watch_ok(kind.plural)
        try:
            for line in iter_lines(response.response.stream(64 * 1024)):
                if stop.is_set():
                    break
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise ApiError(
                        int(obj.get("code") or 500),
                        str(obj.get("reason") or "WatchError"),
                        str(obj.get("message") or obj),
                    )
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                self.health.watch_ok(kind.plural)
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    emit(event["type"], {object_key(obj): kind.convert(obj)})
        finally:
            response.response.release_conn()
        return version
