"""Service names for the real node's pods: the cluster's Services as a dnsmasq hosts file.

A real Ray worker finds its head by KubeRay's Service name
(``<cluster>-head-svc.<namespace>.svc.cluster.local``: the worker's
``wait-gcs-ready`` init container and ``ray start --address``), and multi-host TPU
workers find their peers by ``<hostname>.<headless service>...`` names. No CoreDNS
runs here, so the real node's dnsmasq (tpusim.realnode) reads a hosts file that this
module keeps in step with the API: every Service with a cluster IP answers with it,
a headless Service with the addresses of its ready endpoints, and an endpoint with a
hostname also as ``<hostname>.<service>.<namespace>.svc.<domain>``, as the
Kubernetes page "DNS for Services and Pods" describes
(https://kubernetes.io/docs/concepts/services-networking/dns-pod-service/).
dnsmasq rereads a changed file of its ``--hostsdir`` by itself (inotify; dnsmasq(8)).

Only A records: no SRV records, no pod-IP names (``a-b-c-d.<ns>.pod``), no search of
ExternalName Services. Polled, not watched: a name answers within about a second of
its Service or endpoint.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kubernetes import client

from .kube import core_v1

__all__ = ["ServiceDNS", "hosts_text"]

#: Upper bound of lines written, so a runaway test cannot grow the file without end.
MAX_LINES = 20_000


def hosts_text(services: Iterable[Any], endpoint_slices: Iterable[Any], domain: str) -> str:
    """The hosts file for ``services`` (V1Service) and ``endpoint_slices`` (V1EndpointSlice):
    one ``<address> <name>`` line per A record, sorted, so equal inputs give equal text."""
    lines: set[str] = set()
    headless: set[tuple[str, str]] = set()
    for svc in services:
        ns, name = svc.metadata.namespace, svc.metadata.name
        fqdn = f"{name}.{ns}.svc.{domain}"
        for ip in svc.spec.cluster_ips or ([svc.spec.cluster_ip] if svc.spec.cluster_ip else []):
            if ip and ip != "None":
                lines.add(f"{ip} {fqdn}")
        if svc.spec.cluster_ip in (None, "None"):
            headless.add((ns, name))
    for eps in endpoint_slices:
        labels = eps.metadata.labels or {}
        service = labels.get("kubernetes.io/service-name")
        ns = eps.metadata.namespace
        if service is None or (ns, service) not in headless:
            continue
        fqdn = f"{service}.{ns}.svc.{domain}"
        for endpoint in eps.endpoints or []:
            conditions = endpoint.conditions
            if conditions is not None and conditions.ready is False:
                continue
            for address in endpoint.addresses or []:
                lines.add(f"{address} {fqdn}")
                if endpoint.hostname:
                    lines.add(f"{address} {endpoint.hostname}.{fqdn}")
    ordered = sorted(lines)[:MAX_LINES]
    return "".join(line + "\n" for line in ordered)


class ServiceDNS:
    """Keeps ``path`` (a file in dnsmasq's ``--hostsdir``) equal to ``hosts_text`` of the
    cluster, polling every ``interval_s`` in a daemon thread until ``stop()``."""

    def __init__(
        self, api: Any, path: Path, domain: str = "cluster.local", interval_s: float = 1.0
    ) -> None:
        self.api = api
        self.path = path
        self.domain = domain
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last = ""
        #: The last error of a pass (kept, not raised: the node keeps its last file).
        self.last_error: str | None = None

    def publish_once(self) -> bool:
        """One pass; True when the file changed."""
        core = core_v1(self.api)
        services = core.list_service_for_all_namespaces(_request_timeout=10).items
        slices = client.DiscoveryV1Api(self.api).list_endpoint_slice_for_all_namespaces(
            _request_timeout=10
        )
        text = hosts_text(services, slices.items, self.domain)
        if text == self._last and self.path.exists():
            return False
        # written beside the directory, not in it: dnsmasq reads every file there
        tmp = self.path.parent.parent / (self.path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)
        self._last = text
        return True

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="service-dns", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.publish_once()
                self.last_error = None
            except Exception as exc:  # the API may be stopping; try again next pass
                self.last_error = repr(exc)
            self._stop.wait(self.interval_s)
