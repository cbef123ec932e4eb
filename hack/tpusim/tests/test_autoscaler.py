"""The harness autoscaler writes Ray's patches; whether they equal Ray's own is pinned
against the real provider in tests/contract/test_ray_kuberay_autoscaler.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tpusim import autoscaler
from tpusim.autoscaler import (
    JSON_PATCH,
    MAX_SLICES,
    AutoscaleError,
    delete_patch,
    group_of_pods,
    live_workers,
    scale_patch,
    worker_group,
)

HOSTS = 4
REPLICAS = "/spec/workerGroupSpecs/1/replicas"
SCALE_STRATEGY = "/spec/workerGroupSpecs/1/scaleStrategy"


def raycluster(
    replicas: int = 1,
    min_replicas: int = 0,
    max_replicas: int | None = 3,
    deletes: list[str] | None = None,
) -> dict[str, Any]:
    """Two groups, the TPU one second, so a wrong index shows in the patch path."""
    tpu: dict[str, Any] = {
        "groupName": "tpu",
        "replicas": replicas,
        "minReplicas": min_replicas,
        "numOfHosts": HOSTS,
        "scaleStrategy": {"workersToDelete": deletes} if deletes is not None else {},
    }
    if max_replicas is not None:
        tpu["maxReplicas"] = max_replicas
    cpu = {"groupName": "cpu", "replicas": 2, "minReplicas": 0, "maxReplicas": 5}
    return {"metadata": {"name": "c"}, "spec": {"workerGroupSpecs": [cpu, tpu]}}


def slice_pods(replica: int) -> list[str]:
    return [f"c-tpu-r{replica}-h{h}" for h in range(HOSTS)]


def pods(slices: int) -> list[str]:
    return [name for r in range(slices) for name in slice_pods(r)]


def pod(name: str, group: str = "tpu", kind: str = "worker", **meta: Any) -> dict[str, Any]:
    labels = {"ray.io/cluster": "c", "ray.io/group": group, "ray.io/node-type": kind}
    return {"metadata": {"name": name, "labels": labels, **meta}}


# ------------------------------------------------------------------ reading the group


def test_worker_group_reads_the_fields_ray_reads() -> None:
    group = worker_group(raycluster(replicas=2, min_replicas=1, deletes=["x"]), "tpu")
    assert group == autoscaler.WorkerGroup(
        index=1,
        name="tpu",
        replicas=2,
        min_replicas=1,
        max_replicas=3,
        hosts=HOSTS,
        workers_to_delete=("x",),
    )


def test_worker_group_applies_rays_defaults() -> None:
    cluster = {"metadata": {"name": "c"}, "spec": {"workerGroupSpecs": [{"groupName": "g"}]}}
    group = worker_group(cluster)
    assert (group.replicas, group.min_replicas, group.max_replicas, group.hosts) == (1, 0, None, 1)


@pytest.mark.parametrize(
    ("name", "message"),
    [(None, "name one with --group"), ("gpu", "no worker group 'gpu'")],
)
def test_worker_group_names_what_is_missing(name: str | None, message: str) -> None:
    with pytest.raises(AutoscaleError, match=message):
        worker_group(raycluster(), name)


@pytest.mark.parametrize(
    ("key", "value"), [("numOfHosts", 0), ("replicas", -1), ("maxReplicas", "3")]
)
def test_worker_group_refuses_bad_counts_naming_the_field(key: str, value: object) -> None:
    cluster = raycluster()
    cluster["spec"]["workerGroupSpecs"][1][key] = value
    with pytest.raises(AutoscaleError, match=rf"workerGroupSpecs\[1\]\.{key}"):
        worker_group(cluster, "tpu")


def test_live_workers_are_the_groups_workers_not_being_deleted() -> None:
    listed = [
        pod("head", group="headgroup", kind="head"),
        pod("a"),
        pod("b", deletionTimestamp="2026-01-01T00:00:00Z"),
        pod("cpu-0", group="cpu"),
    ]
    assert live_workers(listed, "tpu") == ["a"]


def test_group_of_pods_is_the_one_group_they_share() -> None:
    listed = [pod("a"), pod("b"), pod("cpu-0", group="cpu"), pod("head", kind="head")]
    assert group_of_pods(listed, ["a", "b"]) == "tpu"
    with pytest.raises(AutoscaleError, match="groups"):
        group_of_pods(listed, ["a", "cpu-0"])
    with pytest.raises(AutoscaleError, match="not Ray worker pods"):
        group_of_pods(listed, ["head"])


# ------------------------------------------------------------------ scale up


@pytest.mark.parametrize(
    ("replicas", "slices", "expected"),
    [(0, 1, 1), (1, 3, 3), (1, 2, 2), (0, 7, 3), (2, MAX_SLICES, 3)],
)
def test_scale_writes_replicas_capped_at_max_replicas(
    replicas: int, slices: int, expected: int
) -> None:
    group = worker_group(raycluster(replicas=replicas), "tpu")
    assert scale_patch(group, slices, pods(replicas)) == [
        {"op": "replace", "path": REPLICAS, "value": expected}
    ]


def test_scale_without_a_cap_writes_the_count() -> None:
    group = worker_group(raycluster(max_replicas=None), "tpu")
    assert scale_patch(group, 9, pods(1)) == [{"op": "replace", "path": REPLICAS, "value": 9}]


@pytest.mark.parametrize(("replicas", "slices"), [(1, 1), (3, 3), (3, 5)])
def test_scale_to_the_current_count_sends_nothing(replicas: int, slices: int) -> None:
    group = worker_group(raycluster(replicas=replicas), "tpu")
    assert scale_patch(group, slices, pods(replicas)) == []


def test_scale_down_is_refused_as_ray_names_pods_instead() -> None:
    group = worker_group(raycluster(replicas=2), "tpu")
    with pytest.raises(AutoscaleError, match="--delete-pod"):
        scale_patch(group, 1, pods(2))


def test_scale_counts_live_pods_above_replicas_and_min_replicas() -> None:
    """Ray's floor is max(replicas, minReplicas) x hosts or the live workers if more."""
    assert scale_patch(worker_group(raycluster(replicas=0, min_replicas=2), "tpu"), 2, []) == [
        {"op": "replace", "path": REPLICAS, "value": 2}
    ]
    with pytest.raises(AutoscaleError, match="has 2 slices"):
        scale_patch(worker_group(raycluster(replicas=1), "tpu"), 1, pods(2))


@pytest.mark.parametrize("slices", [-1, MAX_SLICES + 1])
def test_scale_refuses_counts_out_of_bounds(slices: int) -> None:
    with pytest.raises(AutoscaleError, match="--slices"):
        scale_patch(worker_group(raycluster(), "tpu"), slices, pods(1))


def test_scale_waits_while_a_named_pod_exists() -> None:
    group = worker_group(raycluster(replicas=1, deletes=slice_pods(1)), "tpu")
    with pytest.raises(AutoscaleError, match="still deletes"):
        scale_patch(group, 2, pods(2))


def test_scale_clears_workers_to_delete_once_they_are_gone() -> None:
    group = worker_group(raycluster(replicas=1, deletes=slice_pods(1)), "tpu")
    assert scale_patch(group, 2, pods(1)) == [
        {"op": "replace", "path": REPLICAS, "value": 2},
        {"op": "replace", "path": SCALE_STRATEGY, "value": {"workersToDelete": []}},
    ]
    assert scale_patch(group, 1, pods(1)) == [
        {"op": "replace", "path": SCALE_STRATEGY, "value": {"workersToDelete": []}}
    ]


# ------------------------------------------------------------------ scale down


@pytest.mark.parametrize(
    ("victims", "replicas_after"),
    [
        (slice_pods(1)[2:3], 1),  # (8 - 1) // 4: one host gives up its slice's replica
        (slice_pods(0), 1),
        (slice_pods(0)[:1] + slice_pods(1)[:1], 1),  # two slices hit, Ray lowers by one
        (pods(2), 0),
    ],
)
def test_delete_names_the_pods_and_lowers_replicas_by_floor_division(
    victims: list[str], replicas_after: int
) -> None:
    group = worker_group(raycluster(replicas=2), "tpu")
    assert delete_patch(group, victims, pods(2)) == [
        {"op": "replace", "path": REPLICAS, "value": replicas_after},
        {"op": "replace", "path": SCALE_STRATEGY, "value": {"workersToDelete": victims}},
    ]


def test_delete_keeps_replicas_when_the_floor_is_unchanged() -> None:
    """Live pods above replicas x hosts (a slice KubeRay has not removed yet) keep the count."""
    group = worker_group(raycluster(replicas=1), "tpu")
    victim = slice_pods(1)[:1]
    assert delete_patch(group, victim, pods(2)) == [
        {"op": "replace", "path": SCALE_STRATEGY, "value": {"workersToDelete": victim}}
    ]


@pytest.mark.parametrize(
    ("victims", "message"),
    [
        ([], "names 0 pods"),
        (["c-tpu-r0-h0", "c-tpu-r0-h0"], "twice"),
        (["c-tpu-r5-h0"], "not live worker pods"),
    ],
)
def test_delete_refuses_bad_names(victims: list[str], message: str) -> None:
    with pytest.raises(AutoscaleError, match=message):
        delete_patch(worker_group(raycluster(replicas=2), "tpu"), victims, pods(2))


def test_delete_waits_while_an_earlier_delete_is_pending() -> None:
    group = worker_group(raycluster(replicas=1, deletes=slice_pods(1)[:1]), "tpu")
    with pytest.raises(AutoscaleError, match="still deletes"):
        delete_patch(group, slice_pods(0)[:1], pods(2))


# ------------------------------------------------------------------ the shell


class FakeCustomObjects:
    def __init__(self, cluster: dict[str, Any], sent: list[dict[str, Any]]) -> None:
        self.cluster, self.sent = cluster, sent

    def get_namespaced_custom_object(self, *args: str) -> dict[str, Any]:
        assert args == ("ray.io", "v1", "ns", "rayclusters", "c")
        return self.cluster

    def patch_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> None:
        self.sent.append({"args": args, **kwargs})


class FakeCore:
    def __init__(self, listed: list[dict[str, Any]]) -> None:
        self.listed = listed

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> dict[str, Any]:
        assert (namespace, label_selector) == ("ns", "ray.io/cluster=c")
        return {"items": self.listed}


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []
    cluster = raycluster(replicas=1)
    listed = [pod(name) for name in pods(1)]
    fake_client = SimpleNamespace(
        CustomObjectsApi=lambda api: FakeCustomObjects(cluster, sent),
        CoreV1Api=lambda api: FakeCore(listed),
    )
    monkeypatch.setattr(autoscaler, "client", fake_client)
    api = SimpleNamespace(sanitize_for_serialization=lambda obj: obj)
    return api, sent


def test_scale_sends_one_json_patch_to_the_raycluster(
    fake_api: tuple[Any, list[dict[str, Any]]],
) -> None:
    api, sent = fake_api
    patch = autoscaler.scale(api, "ns", "c", "tpu", 2)
    assert patch == [{"op": "replace", "path": REPLICAS, "value": 2}]
    assert sent == [
        {"args": ("ray.io", "v1", "ns", "rayclusters", "c", patch), "_content_type": JSON_PATCH}
    ]
    assert JSON_PATCH == "application/json-patch+json"


def test_delete_pods_finds_the_group_from_the_pod_labels(
    fake_api: tuple[Any, list[dict[str, Any]]],
) -> None:
    api, sent = fake_api
    patch = autoscaler.delete_pods(api, "ns", "c", ["c-tpu-r0-h1"])
    assert patch[-1]["value"] == {"workersToDelete": ["c-tpu-r0-h1"]}
    assert len(sent) == 1


def test_no_change_sends_nothing(fake_api: tuple[Any, list[dict[str, Any]]]) -> None:
    api, sent = fake_api
    assert autoscaler.scale(api, "ns", "c", "tpu", 1) == []
    assert sent == []
