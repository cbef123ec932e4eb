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
import json
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from tpuslice import constants as c
from tpuslice.metrics import Metrics

__all__ = ["ApiError", "Kube", "load_api_client"]

log = logging.getLogger(__name__)

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


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


def _path(group: str, version: str, plural: str, name: str = "", namespace: str = "") -> str:
    base = "/api/v1" if group == "" else f"/apis/{group}/{version}"
    if namespace:
        base += f"/namespaces/{quote(namespace)}"
    base += f"/{plural}"
    return base + (f"/{quote(name)}" if name else "")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Kube:
    """Async wrapper over one ApiClient; ``metrics`` counts requests by (verb, resource)
    and failed ones."""

    api: Any
    executor: ThreadPoolExecutor
    metrics: Metrics = field(default_factory=Metrics)

    @classmethod
    def connect(
        cls, kubeconfig: str | None = None, threads: int = 32, metrics: Metrics | None = None
    ) -> Kube:
        return cls(
            api=load_api_client(kubeconfig, pool_size=threads),
            executor=ThreadPoolExecutor(threads, thread_name_prefix="kube"),
            metrics=metrics or Metrics(),
        )

    # ------------------------------------------------------------ transport
    def _call_sync(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str | None,
    ) -> Any:
        url = self.api.configuration.host + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        auth: dict[str, str] = {}
        self.api.update_params_for_auth(auth, None, ["BearerToken"], path, method, body)
        headers.update(auth)
        response = self.api.rest_client.request(
            method,
            url,
            headers=headers,
            body=body,
            _request_timeout=30,
        )
        data = response.read()
        if response.status >= 400:
            try:
                payload = json.loads(data)
            except (ValueError, TypeError):
                payload = {}
            raise ApiError(
                response.status,
                str(payload.get("reason") or response.reason),
                str(payload.get("message") or data[:500]),
            )
        return json.loads(data) if data else None

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
        self.metrics.api_request(method, resource)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self.executor, self._call_sync, method, path, query, body, content_type
            )
        except Exception:
            self.metrics.api_error()
            raise

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

    async def delete_raycluster(self, namespace: str, name: str) -> None:
        try:
            await self.call(
                "DELETE",
                _path(c.RAY_GROUP, c.RAY_VERSION, c.RAY_PLURAL_CLUSTER, name, namespace),
                resource="rayclusters",
                body={"propagationPolicy": "Background"},
            )
        except ApiError as exc:
            if not exc.not_found:
                raise

    async def crd_exists(self, name: str) -> bool:
        try:
            await self.call(
                "GET",
                _path("apiextensions.k8s.io", "v1", "customresourcedefinitions", name),
                resource="customresourcedefinitions",
            )
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
    async def apply_webhook_configuration(self, body: Mapping[str, Any]) -> None:
        await self.call(
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
