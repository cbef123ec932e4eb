"""The Services' names for the real node's dnsmasq, from API objects, without a cluster."""

from __future__ import annotations

from kubernetes.client import (
    V1Endpoint as Endpoint,
)
from kubernetes.client import (
    V1EndpointConditions as Conditions,
)
from kubernetes.client import (
    V1EndpointSlice,
    V1ObjectMeta,
    V1Service,
    V1ServiceSpec,
)

from tpusim.servicedns import hosts_text


def _svc(name: str, ns: str, ip: str | None) -> V1Service:
    ips = [ip] if ip else None
    return V1Service(
        metadata=V1ObjectMeta(name=name, namespace=ns),
        spec=V1ServiceSpec(cluster_ip=ip, cluster_ips=ips),
    )


def _slice(service: str, ns: str, endpoints: list[Endpoint]) -> V1EndpointSlice:
    return V1EndpointSlice(
        address_type="IPv4",
        metadata=V1ObjectMeta(
            name=f"{service}-x", namespace=ns, labels={"kubernetes.io/service-name": service}
        ),
        endpoints=endpoints,
    )


def test_cluster_ip_services_answer_with_their_ip() -> None:
    text = hosts_text([_svc("rc-head-svc", "ns", "10.96.0.20")], [], "cluster.local")
    assert text == "10.96.0.20 rc-head-svc.ns.svc.cluster.local\n"


def test_headless_services_answer_with_ready_endpoints_and_their_hostnames() -> None:
    services = [_svc("rc-headless", "ns", "None"), _svc("other", "ns", "10.96.0.9")]
    slices = [
        _slice(
            "rc-headless",
            "ns",
            [
                Endpoint(addresses=["10.245.0.4"], hostname="tpu-0-0"),
                Endpoint(addresses=["10.245.0.5"], conditions=Conditions(ready=False)),
            ],
        ),
        # a cluster-IP Service's endpoints are never published: its IP is
        _slice("other", "ns", [Endpoint(addresses=["10.245.0.7"])]),
    ]
    lines = hosts_text(services, slices, "cluster.local").splitlines()
    assert lines == [
        "10.245.0.4 rc-headless.ns.svc.cluster.local",
        "10.245.0.4 tpu-0-0.rc-headless.ns.svc.cluster.local",
        "10.96.0.9 other.ns.svc.cluster.local",
    ]
