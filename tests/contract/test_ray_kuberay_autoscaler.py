"""Contract with Ray's autoscaler v2 on KubeRay: the patches it writes to a TPU RayCluster.

Elastic slices rest on what Ray's autoscaler does to a multi-host TPU group, so
these tests drive Ray's real code (the installed ``ray`` 2.60.0) and pin it:

- ``KubeRayProvider`` in
  ``ray/autoscaler/v2/instance_manager/cloud_providers/kuberay/cloud_provider.py``
  (``_initialize_scale_request`` and ``_submit_scale_request``): a launch of k
  hosts writes ``replace /spec/workerGroupSpecs/<i>/replicas`` with
  ``(max(replicas, minReplicas) x numOfHosts, or the live pods if more, + k) //
  numOfHosts``, capped at ``maxReplicas``; ``terminate(ids)`` writes ``replace
  .../scaleStrategy`` with ``{"workersToDelete": ids}``, lowering ``replicas``
  by the same floor division.
- The HTTP client under it, ``KubernetesHttpApiClient`` in
  ``ray/autoscaler/_private/kuberay/node_provider.py``: one PATCH of the
  RayCluster with content type ``application/json-patch+json``.
- ``_derive_autoscaling_config_from_ray_cr`` in
  ``ray/autoscaler/_private/kuberay/autoscaling_config.py``: ``min_workers`` and
  ``max_workers`` are replicas x ``numOfHosts``; the ``TPU-<pod-type>-head``
  resource exists only with both GKE TPU nodeSelectors.

Nothing reaches a cluster: ``requests.get``/``requests.patch`` and the
service-account credentials are replaced by ``FakeApiServer``, which serves one
RayCluster and its pods and applies each JSON patch the way the API server does
(RFC 6902), so a sequence of calls sees its own writes. The harness autoscaler
(``tpusim.autoscaler``) must write the same patches for the same inputs; the
last tests compare the two.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import jsonpatch
import pytest
import requests
from ray.autoscaler._private.kuberay import node_provider
from ray.autoscaler._private.kuberay.autoscaling_config import (
    _derive_autoscaling_config_from_ray_cr,
)
from ray.autoscaler.v2.instance_manager.cloud_providers.kuberay.cloud_provider import (
    KubeRayProvider,
)
from ray.autoscaler.v2.instance_manager.node_provider import LaunchNodeError

from tpusim import autoscaler as harness

pytestmark = pytest.mark.contract

NAMESPACE = "ns"
CLUSTER = "elastic"
GROUP = "tpu"
HOSTS = 4  # v6e 4x4: 16 chips, 4 per host
MAX_SLICES = 3
CLUSTER_PATH = f"/apis/ray.io/v1/namespaces/{NAMESPACE}/rayclusters/{CLUSTER}"
REPLICAS = "/spec/workerGroupSpecs/0/replicas"
SCALE_STRATEGY = "/spec/workerGroupSpecs/0/scaleStrategy"
TOPOLOGY_SELECTOR = "cloud.google.com/gke-tpu-topology"
ACCELERATOR_SELECTOR = "cloud.google.com/gke-tpu-accelerator"


def tpu_raycluster(
    replicas: int = 0, min_replicas: int = 0, max_replicas: int = MAX_SLICES
) -> dict[str, Any]:
    """A RayCluster with one multi-host v6e group, as KubeRay stores it."""
    container = {
        "name": "ray-worker",
        "image": "rayproject/ray:2.60.0",
        "resources": {
            "limits": {"cpu": "8", "memory": "32Gi", "google.com/tpu": "4"},
            "requests": {"cpu": "8", "memory": "32Gi", "google.com/tpu": "4"},
        },
    }
    head = {
        "name": "ray-head",
        "image": "rayproject/ray:2.60.0",
        "resources": {"limits": {"cpu": "2", "memory": "8Gi"}},
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE, "resourceVersion": "1"},
        "spec": {
            "enableInTreeAutoscaling": True,
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [head]}}},
            "workerGroupSpecs": [
                {
                    "groupName": GROUP,
                    "replicas": replicas,
                    "minReplicas": min_replicas,
                    "maxReplicas": max_replicas,
                    "numOfHosts": HOSTS,
                    # JSON patch `replace` needs the member to exist (RFC 6902 §4.3).
                    "scaleStrategy": {},
                    "rayStartParams": {},
                    "template": {
                        "spec": {
                            "containers": [container],
                            "nodeSelector": {
                                ACCELERATOR_SELECTOR: "tpu-v6e-slice",
                                TOPOLOGY_SELECTOR: "4x4",
                            },
                        }
                    },
                }
            ],
        },
    }


def pod(name: str, kind: str = "worker", group: str = GROUP) -> dict[str, Any]:
    """A running Ray pod as KubeRay labels it (the labels the provider reads)."""
    return {
        "metadata": {
            "name": name,
            "labels": {
                "ray.io/cluster": CLUSTER,
                "ray.io/node-type": kind,
                "ray.io/group": group,
            },
        },
        "status": {"containerStatuses": [{"state": {"running": {}}}]},
    }


def slice_pods(replica: int) -> list[str]:
    """The pod names of one replica (one slice) of the TPU group."""
    return [f"{CLUSTER}-{GROUP}-worker-r{replica}-h{host}" for host in range(HOSTS)]


@dataclass
class Patch:
    """One PATCH the provider sent: where, with which content type, what body."""

    path: str
    content_type: str
    body: Any


def api_path(url: str) -> tuple[str, str]:
    """The API path and query of a URL the client built.

    Only the part from ``/api`` on is compared: with no in-cluster env, Ray's
    default host (``build_address("https://kubernetes.default", "443")``) is
    not a URL ``urlsplit`` accepts, and the host is not part of the contract.
    """
    rest = url[url.index("/api") :]
    path, _, query = rest.partition("?")
    return path, query


@dataclass
class FakeResponse:
    payload: Any
    status_code: int = 200

    def json(self) -> Any:
        return copy.deepcopy(self.payload)

    def raise_for_status(self) -> None:
        raise AssertionError(f"unexpected status {self.status_code}")


@dataclass
class FakeApiServer:
    """One namespace holding one RayCluster and its pods, behind ``requests``."""

    raycluster: dict[str, Any]
    pods: list[dict[str, Any]] = field(default_factory=list)
    patches: list[Patch] = field(default_factory=list)

    def get(self, url: str, **_: Any) -> FakeResponse:
        path, query = api_path(url)
        if path == CLUSTER_PATH:
            return FakeResponse(self.raycluster)
        assert path == f"/api/v1/namespaces/{NAMESPACE}/pods", url
        assert unquote(query) == f"labelSelector=ray.io/cluster={CLUSTER}", url
        return FakeResponse({"metadata": {"resourceVersion": "7"}, "items": self.pods})

    def patch(self, url: str, data: str, headers: dict[str, str], **_: Any) -> FakeResponse:
        assert api_path(url) == (CLUSTER_PATH, ""), url
        body = json.loads(data)
        self.patches.append(Patch(CLUSTER_PATH, headers["Content-type"], body))
        assert headers["Content-type"] == "application/json-patch+json"
        self.raycluster = jsonpatch.apply_patch(self.raycluster, body)
        return FakeResponse(self.raycluster)

    def delete(self, url: str, **_: Any) -> FakeResponse:
        raise AssertionError(f"the provider deleted {url}")


class NoGcs:
    """The provider's GCS client; scaling a group must not need the GCS."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the provider called GCS {name}")


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApiServer]:
    server = FakeApiServer(tpu_raycluster())
    monkeypatch.setattr(requests, "get", server.get)
    monkeypatch.setattr(requests, "patch", server.patch)
    monkeypatch.setattr(requests, "delete", server.delete)
    monkeypatch.setattr(
        node_provider, "load_k8s_secrets", lambda: ({"Authorization": "Bearer t"}, False, None)
    )
    yield server


def provider() -> KubeRayProvider:
    """Ray's provider with its real HTTP client (the one the sidecar builds)."""
    return KubeRayProvider(CLUSTER, {"namespace": NAMESPACE}, NoGcs())  # type: ignore[arg-type]


def with_slices(api: FakeApiServer, replicas: int, live_slices: int | None = None) -> None:
    """The group at ``replicas`` with ``live_slices`` (default: all) slices' pods running."""
    api.raycluster["spec"]["workerGroupSpecs"][0]["replicas"] = replicas
    live = replicas if live_slices is None else live_slices
    api.pods = [pod(f"{CLUSTER}-head", kind="head", group="headgroup")] + [
        pod(name) for r in range(live) for name in slice_pods(r)
    ]


def one_patch(api: FakeApiServer) -> list[dict[str, Any]]:
    assert len(api.patches) == 1, api.patches
    body: list[dict[str, Any]] = api.patches[0].body
    return body


# ------------------------------------------------------------------ (a) floor division


@pytest.mark.parametrize(
    ("replicas", "hosts_requested", "expected"),
    [
        (0, 4, 1),  # one slice's worth of hosts: one replica
        (0, 7, 1),  # floor: the 3 extra hosts add nothing
        (0, 8, 2),
        (1, 4, 2),  # the live pods count: 4 + 4
        (1, 8, 3),
    ],
)
def test_launch_writes_replicas_as_hosts_floor_divided_by_num_of_hosts(
    api: FakeApiServer, replicas: int, hosts_requested: int, expected: int
) -> None:
    with_slices(api, replicas)
    provider().launch({GROUP: hosts_requested}, request_id="r1")
    assert one_patch(api) == [{"op": "replace", "path": REPLICAS, "value": expected}]
    assert api.patches[0].content_type == "application/json-patch+json"
    assert api.raycluster["spec"]["workerGroupSpecs"][0]["replicas"] == expected


@pytest.mark.parametrize(("replicas", "hosts_requested"), [(0, 1), (0, 3), (1, 3), (2, 2)])
def test_a_demand_below_num_of_hosts_adds_no_replica(
    api: FakeApiServer, replicas: int, hosts_requested: int
) -> None:
    """(replicas x 4 + k) // 4 == replicas for k < 4: no PATCH at all, and no error."""
    with_slices(api, replicas)
    p = provider()
    p.launch({GROUP: hosts_requested}, request_id="r1")
    assert api.patches == []
    assert p.poll_errors() == []


def test_min_replicas_counts_even_when_replicas_is_below_it(api: FakeApiServer) -> None:
    """The floor is max(replicas, minReplicas): a raised minimum is honoured by the next launch."""
    api.raycluster["spec"]["workerGroupSpecs"][0]["minReplicas"] = 2
    with_slices(api, replicas=0, live_slices=0)
    provider().launch({GROUP: HOSTS}, request_id="r1")
    assert one_patch(api) == [{"op": "replace", "path": REPLICAS, "value": 3}]


# ------------------------------------------------------------------ (b) maxReplicas cap


@pytest.mark.parametrize(
    ("replicas", "hosts_requested", "rejected_hosts"),
    # rejected hosts = (uncapped target - maxReplicas) x numOfHosts, at most the request
    [(0, 16, 4), (1, 12, 4), (2, 20, 16)],
)
def test_launch_is_capped_at_max_replicas_and_reports_the_rest(
    api: FakeApiServer, replicas: int, hosts_requested: int, rejected_hosts: int
) -> None:
    with_slices(api, replicas)
    p = provider()
    p.launch({GROUP: hosts_requested}, request_id="r1")
    assert one_patch(api) == [{"op": "replace", "path": REPLICAS, "value": MAX_SLICES}]
    errors = p.poll_errors()
    assert len(errors) == 1
    assert isinstance(errors[0], LaunchNodeError)
    assert (errors[0].node_type, errors[0].count) == (GROUP, rejected_hosts)
    assert str(errors[0]).endswith("Launch capped by maxReplicas limit.")


def test_a_group_at_max_replicas_gets_no_patch(api: FakeApiServer) -> None:
    with_slices(api, MAX_SLICES)
    provider().launch({GROUP: HOSTS}, request_id="r1")
    assert api.patches == []


# ------------------------------------------------------------------ (c) workersToDelete


def test_terminate_one_host_names_it_and_lowers_replicas_by_floor_division(
    api: FakeApiServer,
) -> None:
    """(2 x 4 - 1) // 4 = 1: naming one host of a slice gives up the whole slice's replica."""
    with_slices(api, 2)
    victim = slice_pods(1)[2]
    provider().terminate([victim], request_id="t1")
    assert one_patch(api) == [
        {"op": "replace", "path": REPLICAS, "value": 1},
        {"op": "replace", "path": SCALE_STRATEGY, "value": {"workersToDelete": [victim]}},
    ]
    assert api.patches[0].content_type == "application/json-patch+json"


def test_terminate_a_whole_slice_names_every_host(api: FakeApiServer) -> None:
    with_slices(api, 3)
    victims = slice_pods(0)
    provider().terminate(victims, request_id="t1")
    assert one_patch(api) == [
        {"op": "replace", "path": REPLICAS, "value": 2},
        {"op": "replace", "path": SCALE_STRATEGY, "value": {"workersToDelete": victims}},
    ]


def test_a_pending_delete_blocks_launch_and_terminate_until_its_pods_are_gone(
    api: FakeApiServer,
) -> None:
    """While a named pod still exists the provider writes nothing; once gone it clears the list."""
    with_slices(api, 2)
    p = provider()
    p.terminate(slice_pods(1), request_id="t1")
    assert len(api.patches) == 1

    p.launch({GROUP: HOSTS}, request_id="l1")
    p.terminate(slice_pods(0), request_id="t2")
    assert len(api.patches) == 1
    assert len(p.poll_errors()) == 1 + HOSTS  # one launch error, one per named pod

    with_slices(api, 1)  # KubeRay deleted the slice; replicas was lowered to 1
    p.launch({GROUP: HOSTS}, request_id="l2")
    assert api.patches[1].body == [
        {"op": "replace", "path": REPLICAS, "value": 2},
        {"op": "replace", "path": SCALE_STRATEGY, "value": {"workersToDelete": []}},
    ]


# ------------------------------------------------------------------ (d) autoscaling config


@pytest.mark.parametrize(("min_replicas", "max_replicas"), [(0, 3), (1, 3), (2, 8)])
def test_autoscaling_config_counts_workers_as_replicas_times_hosts(
    min_replicas: int, max_replicas: int
) -> None:
    config = _derive_autoscaling_config_from_ray_cr(
        tpu_raycluster(min_replicas=min_replicas, max_replicas=max_replicas)
    )
    node_type = config["available_node_types"][GROUP]
    assert node_type["min_workers"] == min_replicas * HOSTS
    assert node_type["max_workers"] == max_replicas * HOSTS
    assert config["max_workers"] == max_replicas * HOSTS  # the head group adds none


def test_tpu_head_resource_comes_from_both_gke_selectors() -> None:
    resources = _derive_autoscaling_config_from_ray_cr(tpu_raycluster())["available_node_types"][
        GROUP
    ]["resources"]
    assert resources["TPU"] == 4
    assert resources["TPU-v6e-16-head"] == 1


@pytest.mark.parametrize("missing", [TOPOLOGY_SELECTOR, ACCELERATOR_SELECTOR])
def test_no_tpu_head_resource_without_both_gke_selectors(missing: str) -> None:
    cluster = tpu_raycluster()
    del cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"][missing]
    resources = _derive_autoscaling_config_from_ray_cr(cluster)["available_node_types"][GROUP][
        "resources"
    ]
    assert resources["TPU"] == 4
    assert not [name for name in resources if name.endswith("-head")], resources


# ------------------------------------------------------------------ the harness writes the same


def cluster_state(
    api: FakeApiServer,
    replicas: int,
    live_slices: int,
    deletes: list[str] | None,
    min_replicas: int,
) -> tuple[harness.WorkerGroup, list[str]]:
    """Put the cluster in this state; return what the harness reads from it."""
    with_slices(api, replicas, live_slices)
    group = api.raycluster["spec"]["workerGroupSpecs"][0]
    group["minReplicas"] = min_replicas
    if deletes is not None:
        group["scaleStrategy"] = {"workersToDelete": deletes}
    return harness.worker_group(api.raycluster, GROUP), harness.live_workers(api.pods, GROUP)


def sent(api: FakeApiServer) -> list[dict[str, Any]]:
    """The one JSON patch the provider sent ([] for none), in the harness's content type."""
    assert len(api.patches) <= 1, api.patches
    assert all(p.content_type == harness.JSON_PATCH for p in api.patches)
    return api.patches[0].body if api.patches else []


# (replicas, live slices, workersToDelete, minReplicas, slices wanted)
SCALE_CASES = [
    (0, 0, None, 0, 1),
    (0, 0, None, 0, 3),
    (0, 0, None, 0, 5),  # capped at maxReplicas
    (1, 1, None, 0, 2),
    (1, 1, None, 0, 1),  # no change: no patch
    (0, 0, None, 2, 3),  # minReplicas above replicas
    (1, 2, None, 0, 3),  # more live pods than replicas x hosts
    (1, 1, slice_pods(1), 0, 2),  # finished deletes: the list is cleared
    (1, 1, slice_pods(1), 0, 1),  # ... even with no new replica
]


@pytest.mark.parametrize(("replicas", "live", "deletes", "min_replicas", "slices"), SCALE_CASES)
def test_harness_scale_writes_the_providers_launch_patch(
    api: FakeApiServer,
    replicas: int,
    live: int,
    deletes: list[str] | None,
    min_replicas: int,
    slices: int,
) -> None:
    """Scaling to N slices is Ray's launch of the hosts N slices add."""
    group, live_pods = cluster_state(api, replicas, live, deletes, min_replicas)
    expected = harness.scale_patch(group, slices, live_pods)
    workers = max(max(replicas, min_replicas) * HOSTS, len(live_pods))
    provider().launch({GROUP: slices * HOSTS - workers}, request_id="r1")
    assert sent(api) == expected


@pytest.mark.parametrize(
    ("replicas", "live", "deletes", "victims"),
    [
        (2, 2, None, slice_pods(1)[2:3]),
        (3, 3, None, slice_pods(0)),
        (2, 2, None, slice_pods(0)[:1] + slice_pods(1)[:1]),
        (1, 2, None, slice_pods(1)[:1]),  # live pods above replicas x hosts
        (2, 2, ["gone"], slice_pods(0)[:1]),  # a finished delete is replaced, not cleared
        (3, 3, None, slice_pods(0) + slice_pods(1) + slice_pods(2)),
    ],
)
def test_harness_delete_writes_the_providers_terminate_patch(
    api: FakeApiServer, replicas: int, live: int, deletes: list[str] | None, victims: list[str]
) -> None:
    group, live_pods = cluster_state(api, replicas, live, deletes, 0)
    expected = harness.delete_patch(group, victims, live_pods)
    provider().terminate(victims, request_id="t1")
    assert sent(api) == expected


def test_harness_and_provider_both_wait_while_a_named_pod_exists(api: FakeApiServer) -> None:
    group, live_pods = cluster_state(api, 1, 2, slice_pods(1), 0)
    p = provider()
    p.launch({GROUP: HOSTS}, request_id="r1")
    p.terminate(slice_pods(0)[:1], request_id="t1")
    assert api.patches == []
    assert len(p.poll_errors()) == 2
    with pytest.raises(harness.AutoscaleError, match="still deletes"):
        harness.scale_patch(group, 3, live_pods)
    with pytest.raises(harness.AutoscaleError, match="still deletes"):
        harness.delete_patch(group, slice_pods(0)[:1], live_pods)
