"""TPU identity tables: every generation, single and multi-host, one and several slices.

Pods are built the way they reach the webhook: the worker template our renderer
produces, plus the labels KubeRay adds (``ray.io/replica-host-index`` and
``ray.io/worker-group-replica-name`` only for multi-host groups, as KubeRay 1.5
does). Expected values are spelled out here from GKE's kuberay-tpu-webhook
behaviour, not derived from identity.py's helpers.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tpuslice.model import constants as c
from tpuslice.model.topology import slice_shape
from tpuslice.render.identity import IdentityError, Note, mutate_pod, read_identity
from tpuslice.render.kuberay import render_cluster

HOST_IP_ENV = {
    "name": "TPU_DEVICE_PLUGIN_HOST_IP",
    "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.hostIP"}},
}
ADDR_ENV = {"name": "TPU_DEVICE_PLUGIN_ADDR", "value": "$(TPU_DEVICE_PLUGIN_HOST_IP):2112"}


def render_worker_template(
    tpu_type: str,
    topology: str,
    *,
    slices: int = 1,
    chips_per_host: int | None = None,
    name: str = "llm",
    worker: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], int]:
    tpu: dict[str, Any] = {"type": tpu_type, "topology": topology, "slices": slices}
    if chips_per_host is not None:
        tpu["chipsPerHost"] = chips_per_host
    spec: dict[str, Any] = {"tpu": tpu, "ray": {"version": "2.54.0"}}
    if worker is not None:
        spec["worker"] = worker
    rc = render_cluster(
        {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND_CLUSTER,
            "metadata": {"name": name, "namespace": "ml"},
            "spec": spec,
        }
    )
    group = rc["spec"]["workerGroupSpecs"][0]
    return group["template"], int(group.get("numOfHosts", 1))


def kuberay_pod(
    template: dict[str, Any],
    num_hosts: int,
    replica: int,
    host: int,
    *,
    cluster: str = "llm",
) -> dict[str, Any]:
    """What KubeRay 1.5 (RayMultiHostIndexing on) sends to admission for one worker."""
    meta = copy.deepcopy(template.get("metadata") or {})
    labels = meta.setdefault("labels", {})
    labels.update(
        {
            c.KUBERAY_LABEL_CLUSTER: cluster,
            c.KUBERAY_LABEL_GROUP: c.WORKER_GROUP,
            c.KUBERAY_LABEL_NODE_TYPE: "worker",
            "app.kubernetes.io/name": "kuberay",
            c.KUBERAY_LABEL_REPLICA_INDEX: str(replica),
        }
    )
    if num_hosts > 1:
        labels[c.KUBERAY_LABEL_REPLICA_NAME] = f"tpu-abcd{replica}"
        labels[c.KUBERAY_LABEL_HOST_INDEX] = str(host)
    meta.update({"generateName": f"{cluster}-tpu-worker-", "namespace": "ml"})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": copy.deepcopy(template["spec"]),
    }


def env_of(pod: dict[str, Any], index: int = 0) -> dict[str, Any]:
    env = pod["spec"]["containers"][index].get("env") or []
    names = [e["name"] for e in env]
    assert len(names) == len(set(names)), f"duplicate env names: {names}"
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in env}


# (type, topology, chipsPerHost or None): single-host and multi-host of every generation.
SHAPES = [
    ("v4", "2x2x1", None),
    ("v4", "2x2x2", None),
    ("v4", "4x4x4", None),
    ("v5e", "1x1", None),
    ("v5e", "2x4", None),
    ("v5e", "2x4", 4),
    ("v5e", "4x4", None),
    ("v5p", "2x2x1", None),
    ("v5p", "2x2x4", None),
    ("v6e", "2x2", None),
    ("v6e", "4x4", None),
    ("v6e", "16x16", None),
    ("tpu7x", "1x1x1", None),
    ("tpu7x", "2x2x1", None),
    ("tpu7x", "2x2x2", None),
    ("tpu7x", "4x4x4", None),
]


@pytest.mark.parametrize("slices", [1, 3])
@pytest.mark.parametrize(("tpu_type", "topology", "cph"), SHAPES)
def test_identity_table(tpu_type: str, topology: str, cph: int | None, slices: int) -> None:
    shape = slice_shape(tpu_type, topology, cph)
    template, num_hosts = render_worker_template(
        tpu_type, topology, slices=slices, chips_per_host=cph
    )
    assert num_hosts == shape.hosts
    tpu7x = tpu_type == "tpu7x"
    for replica in range(slices):
        peers = [f"tpu-{replica}-{h}.llm-headless" for h in range(shape.hosts)]
        worker_ids = set()
        for host in range(shape.hosts):
            pod = kuberay_pod(template, num_hosts, replica, host)
            original = copy.deepcopy(pod)
            result = mutate_pod(pod)
            assert pod == original, "mutate_pod must not change its input"
            assert result.kept == () and result.replaced == ()
            mutated = result.pod
            env = env_of(mutated)
            worker_ids.add(env["TPU_WORKER_ID"])

            assert env["TPU_WORKER_ID"] == str(host)
            assert env["TPU_NAME"] == f"tpu-{replica}"
            assert env["TPU_DEVICE_PLUGIN_HOST_IP"] == HOST_IP_ENV["valueFrom"]
            assert env["TPU_DEVICE_PLUGIN_ADDR"] == "$(TPU_DEVICE_PLUGIN_HOST_IP):2112"
            if shape.multi_host:
                assert mutated["spec"]["hostname"] == f"tpu-{replica}-{host}"
                assert mutated["spec"]["subdomain"] == "llm-headless"
                assert env["TPU_WORKER_HOSTNAMES"].split(",") == peers
                assert peers[host].startswith(mutated["spec"]["hostname"] + ".")
            else:
                assert "hostname" not in mutated["spec"]
                assert "subdomain" not in mutated["spec"]
                assert "TPU_WORKER_HOSTNAMES" not in env
            if tpu7x and shape.multi_host:
                assert env["TPU_PROCESS_ADDRESSES"].split(",") == [f"{p}:8471" for p in peers]
                assert env["TPU_PROCESS_PORT"] == "8471"
            else:
                assert "TPU_PROCESS_ADDRESSES" not in env
                assert "TPU_PROCESS_PORT" not in env
            if slices > 1:
                assert env["MEGASCALE_NUM_SLICES"] == str(slices)
                assert env["MEGASCALE_SLICE_ID"] == str(replica)
                coordinator = "tpu-0-0.llm-headless" + (":8081" if tpu7x else "")
                assert env["MEGASCALE_COORDINATOR_ADDRESS"] == coordinator
                assert env["MEGASCALE_PORT"] == "8081"
            else:
                assert not any(name.startswith("MEGASCALE_") for name in env)
            # Never touches affinity, nothing but hostname/subdomain/env changes.
            assert mutated["spec"].get("affinity") == original["spec"].get("affinity")
            assert mutated["metadata"] == original["metadata"]
            # Reinvocation: applying again changes nothing and reports nothing.
            again = mutate_pod(mutated)
            assert again.pod == mutated
            assert again.kept == () and again.replaced == ()
        assert worker_ids == {str(h) for h in range(shape.hosts)}


def test_exact_env_of_one_multislice_host() -> None:
    """One pod spelled out in full: order matters ($(VAR) expands only from earlier vars)."""
    template, hosts = render_worker_template("v6e", "4x4", slices=2)
    result = mutate_pod(kuberay_pod(template, hosts, replica=1, host=2))
    assert result.pod["spec"]["hostname"] == "tpu-1-2"
    assert result.pod["spec"]["subdomain"] == "llm-headless"
    assert result.pod["spec"]["containers"][0]["env"] == [
        {"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": "25"},  # spec.disruption
        {"name": "TPU_WORKER_ID", "value": "2"},
        {"name": "TPU_NAME", "value": "tpu-1"},
        {
            "name": "TPU_WORKER_HOSTNAMES",
            "value": "tpu-1-0.llm-headless,tpu-1-1.llm-headless,"
            "tpu-1-2.llm-headless,tpu-1-3.llm-headless",
        },
        {"name": "MEGASCALE_NUM_SLICES", "value": "2"},
        {"name": "MEGASCALE_SLICE_ID", "value": "1"},
        {"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": "tpu-0-0.llm-headless"},
        {"name": "MEGASCALE_PORT", "value": "8081"},
        HOST_IP_ENV,
        ADDR_ENV,
    ]


def _with_containers(pod: dict[str, Any], extra: list[dict[str, Any]]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"]["containers"] = pod["spec"]["containers"] + extra
    return pod


def test_tpu7x_numa_containers_get_per_container_ids_and_ports() -> None:
    """GKE's webhook: worker id = host * tpu_containers + container, ports 8471+c / 8081+c."""
    template, hosts = render_worker_template("tpu7x", "2x2x2", slices=2)
    second = copy.deepcopy(template["spec"]["containers"][0])
    second["name"] = "ray-worker-numa1"
    sidecar = {"name": "logs", "image": "busybox"}
    pod = _with_containers(kuberay_pod(template, hosts, replica=1, host=1), [sidecar, second])
    mutated = mutate_pod(pod).pod
    first_env, second_env = env_of(mutated, 0), env_of(mutated, 2)
    assert "env" not in mutated["spec"]["containers"][1], "non-TPU containers are left alone"
    assert (first_env["TPU_WORKER_ID"], second_env["TPU_WORKER_ID"]) == ("2", "3")
    assert (first_env["TPU_PROCESS_PORT"], second_env["TPU_PROCESS_PORT"]) == ("8471", "8472")
    assert (first_env["MEGASCALE_PORT"], second_env["MEGASCALE_PORT"]) == ("8081", "8082")
    expected = [f"tpu-1-{h}.llm-headless:{port}" for h in range(2) for port in (8471, 8472)]
    assert first_env["TPU_PROCESS_ADDRESSES"].split(",") == expected
    assert second_env["TPU_PROCESS_ADDRESSES"] == first_env["TPU_PROCESS_ADDRESSES"]
    assert first_env["MEGASCALE_COORDINATOR_ADDRESS"] == "tpu-0-0.llm-headless:8081"
    assert mutate_pod(mutated).pod == mutated


def test_other_generations_share_the_worker_id_across_tpu_containers() -> None:
    template, hosts = render_worker_template("v6e", "4x4")
    second = copy.deepcopy(template["spec"]["containers"][0])
    second["name"] = "second"
    mutated = mutate_pod(_with_containers(kuberay_pod(template, hosts, 0, 3), [second])).pod
    assert env_of(mutated, 0)["TPU_WORKER_ID"] == env_of(mutated, 1)["TPU_WORKER_ID"] == "3"


def test_names_at_the_53_character_limit() -> None:
    name = "a" * (c.MAX_NAME_LENGTH - 1) + "z"
    template, hosts = render_worker_template("v6e", "16x16", slices=2, name=name)
    result = mutate_pod(kuberay_pod(template, hosts, replica=1, host=63, cluster=name))
    subdomain = result.pod["spec"]["subdomain"]
    # KubeRay's real Service name (GKE's webhook would truncate this one to 50 characters).
    assert subdomain == f"{name}-headless" and len(subdomain) == 62
    assert result.pod["spec"]["hostname"] == "tpu-1-63"
    hostnames = env_of(result.pod)["TPU_WORKER_HOSTNAMES"].split(",")
    assert len(hostnames) == 64
    assert all(len(label) <= 63 for fqdn in hostnames for label in fqdn.split("."))


def test_name_whose_headless_service_is_no_dns_label_is_refused() -> None:
    """Our CRD stops names at 53; a hand-made RayCluster of 55 makes a 64-character subdomain."""
    template, hosts = render_worker_template("v6e", "4x4")
    mutate_pod(kuberay_pod(template, hosts, 0, 0, cluster="b" * 54))  # 63: still a DNS label
    with pytest.raises(IdentityError, match=r"at most 63.*limited to 53"):
        mutate_pod(kuberay_pod(template, hosts, 0, 0, cluster="b" * 55))


def _template_with_env(env: list[dict[str, Any]], **kw: Any) -> tuple[dict[str, Any], int]:
    template, hosts = render_worker_template("v6e", "4x4", **kw)
    template["spec"]["containers"][0]["env"] = env
    return template, hosts


def test_user_values_are_kept_and_reported() -> None:
    user_env = [
        {"name": "MY_VAR", "value": "x"},
        {"name": "TPU_NAME", "value": "custom"},
        {"name": "MEGASCALE_PORT", "value": "9999"},
        {
            "name": "TPU_DEVICE_PLUGIN_ADDR",
            "valueFrom": {"configMapKeyRef": {"name": "a", "key": "b"}},
        },
    ]
    template, hosts = _template_with_env(user_env, slices=2)
    result = mutate_pod(kuberay_pod(template, hosts, 1, 1))
    env = env_of(result.pod)
    assert env["TPU_NAME"] == "custom"
    assert env["MEGASCALE_PORT"] == "9999"
    assert env["TPU_DEVICE_PLUGIN_ADDR"] == {"configMapKeyRef": {"name": "a", "key": "b"}}
    assert env["MY_VAR"] == "x"
    assert env["TPU_WORKER_ID"] == "1"
    assert set(result.kept) == {
        Note("ray-worker", "TPU_NAME"),
        Note("ray-worker", "MEGASCALE_PORT"),
        Note("ray-worker", "TPU_DEVICE_PLUGIN_ADDR"),
    }
    assert result.pod["spec"]["containers"][0]["env"][:4] == user_env, "user entries stay first"
    again = mutate_pod(result.pod)
    assert again.pod == result.pod
    assert set(again.kept) == set(result.kept)


def test_placeholders_are_replaced_like_gke_does() -> None:
    """localhost hostnames and a template-wide default worker id would break a multi-host slice."""
    template, hosts = _template_with_env(
        [
            {"name": "TPU_WORKER_HOSTNAMES", "value": "localhost"},
            {"name": "TPU_WORKER_ID", "value": "0"},
            {"name": "TPU_NAME", "value": ""},
            {"name": "TPU_WORKER_HOSTNAMES", "value": "localhost"},
        ]
    )
    result = mutate_pod(kuberay_pod(template, hosts, 0, 2))
    env = env_of(result.pod)  # also asserts no duplicates are left
    assert env["TPU_WORKER_ID"] == "2"
    assert env["TPU_NAME"] == "tpu-0"
    assert env["TPU_WORKER_HOSTNAMES"].startswith("tpu-0-0.llm-headless,")
    # An empty value is "unset", not a user choice: replaced without a report.
    assert set(result.replaced) == {
        Note("ray-worker", "TPU_WORKER_HOSTNAMES"),
        Note("ray-worker", "TPU_WORKER_ID"),
    }
    assert result.kept == ()
    assert mutate_pod(result.pod).pod == result.pod


def test_default_worker_id_on_host_zero_is_not_a_change() -> None:
    template, hosts = _template_with_env([{"name": "TPU_WORKER_ID", "value": "0"}])
    result = mutate_pod(kuberay_pod(template, hosts, 0, 0))
    assert result.replaced == () and result.kept == ()


def test_user_megascale_on_one_slice_gets_gke_multislice_env() -> None:
    """GKE adds the multislice settings when the user set MEGASCALE_NUM_SLICES: so do we."""
    template, hosts = _template_with_env([{"name": "MEGASCALE_NUM_SLICES", "value": "1"}])
    result = mutate_pod(kuberay_pod(template, hosts, 0, 3))
    env = env_of(result.pod)
    assert env["MEGASCALE_NUM_SLICES"] == "1"
    assert env["MEGASCALE_SLICE_ID"] == "0"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "tpu-0-0.llm-headless"
    assert env["MEGASCALE_PORT"] == "8081"
    assert result.kept == ()


def test_existing_affinity_and_other_fields_untouched() -> None:
    affinity = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"x": "y"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    template, hosts = render_worker_template("v5p", "2x2x4", slices=2)
    pod = kuberay_pod(template, hosts, 1, 3)
    pod["spec"]["affinity"] = copy.deepcopy(affinity)
    pod["spec"]["nodeSelector"]["extra"] = "1"
    mutated = mutate_pod(pod).pod
    assert mutated["spec"]["affinity"] == affinity
    untouched = {k: v for k, v in pod["spec"].items() if k != "containers"}
    assert {
        k: v for k, v in mutated["spec"].items() if k not in ("containers", "hostname", "subdomain")
    } == untouched


def test_preset_hostname_is_replaced_and_reported() -> None:
    template, hosts = render_worker_template("v4", "2x2x2")
    template["spec"]["hostname"] = "mine"
    result = mutate_pod(kuberay_pod(template, hosts, 0, 1))
    assert result.pod["spec"]["hostname"] == "tpu-0-1"
    assert Note("", "spec.hostname") in result.replaced


@pytest.mark.parametrize("missing", [c.KUBERAY_LABEL_REPLICA_INDEX, c.KUBERAY_LABEL_HOST_INDEX])
def test_missing_kuberay_index_labels_name_the_feature_gate(missing: str) -> None:
    template, hosts = render_worker_template("v6e", "4x4")
    pod = kuberay_pod(template, hosts, 0, 1)
    del pod["metadata"]["labels"][missing]
    with pytest.raises(IdentityError) as err:
        mutate_pod(pod)
    message = str(err.value)
    assert missing in message
    assert "RayMultiHostIndexing" in message
    assert "--feature-gates=RayMultiHostIndexing=true" in message
    assert "1.6" in message


def test_single_host_needs_only_the_replica_index() -> None:
    template, hosts = render_worker_template("v6e", "2x2", slices=2)
    pod = kuberay_pod(template, hosts, 1, 0)
    assert c.KUBERAY_LABEL_HOST_INDEX not in pod["metadata"]["labels"]
    assert env_of(mutate_pod(pod).pod)["TPU_WORKER_ID"] == "0"
    del pod["metadata"]["labels"][c.KUBERAY_LABEL_REPLICA_INDEX]
    with pytest.raises(IdentityError, match="RayMultiHostIndexing"):
        mutate_pod(pod)


@pytest.mark.parametrize(
    ("where", "key"),
    [
        ("annotations", c.ANNOTATION_TPU_TYPE),
        ("annotations", c.ANNOTATION_CHIPS_PER_HOST),
        ("annotations", c.ANNOTATION_SLICES),
        ("labels", c.LABEL_TOPOLOGY),
        ("labels", c.KUBERAY_LABEL_CLUSTER),
        ("labels", c.KUBERAY_LABEL_GROUP),
    ],
)
def test_missing_metadata_is_refused_with_its_name(where: str, key: str) -> None:
    template, hosts = render_worker_template("v6e", "4x4")
    pod = kuberay_pod(template, hosts, 0, 0)
    del pod["metadata"][where][key]
    with pytest.raises(IdentityError, match=key.replace(".", r"\.")):
        mutate_pod(pod)


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        ({c.KUBERAY_LABEL_HOST_INDEX: "4"}, "host index 4"),
        ({c.KUBERAY_LABEL_REPLICA_INDEX: "2"}, "replica index 2"),
        ({c.KUBERAY_LABEL_REPLICA_INDEX: "x"}, "not an integer"),
    ],
)
def test_inconsistent_indexes_are_refused(labels: dict[str, str], match: str) -> None:
    template, hosts = render_worker_template("v6e", "4x4", slices=2)
    pod = kuberay_pod(template, hosts, 0, 0)
    pod["metadata"]["labels"].update(labels)
    with pytest.raises(IdentityError, match=match):
        mutate_pod(pod)


def test_head_and_non_tpu_pods_pass_unchanged() -> None:
    template, hosts = render_worker_template("v6e", "4x4")
    head = kuberay_pod(template, hosts, 0, 0)
    head["metadata"]["labels"][c.KUBERAY_LABEL_NODE_TYPE] = "head"
    no_tpu = kuberay_pod(template, hosts, 0, 0)
    for kind in ("requests", "limits"):
        del no_tpu["spec"]["containers"][0]["resources"][kind][c.TPU_RESOURCE]
    for pod in (head, no_tpu):
        result = mutate_pod(pod)
        assert result.identity is None and result.pod == pod
        assert read_identity(pod) is None


def _gke_stand_in(pod: dict[str, Any], svc: str, slices_env: bool) -> dict[str, Any]:
    """What GKE's kuberay-tpu-webhook leaves on a multi-host worker (main.go, KubeRay labels on).

    ``svc`` is its headless Service name: KubeRay's CheckName, which keeps the last
    50 characters of ``<name>-headless``.
    """
    pod = copy.deepcopy(pod)
    labels = pod["metadata"]["labels"]
    r, h = labels[c.KUBERAY_LABEL_REPLICA_INDEX], labels[c.KUBERAY_LABEL_HOST_INDEX]
    pod["spec"].update({"hostname": f"tpu-{r}-{h}", "subdomain": svc})
    pod["spec"]["affinity"] = {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}
    }
    env = [
        {"name": "TPU_WORKER_HOSTNAMES", "value": ",".join(f"tpu-{r}-{j}.{svc}" for j in range(4))},
        {"name": "TPU_WORKER_ID", "value": h},
        {"name": "TPU_NAME", "value": f"tpu-{r}"},
        HOST_IP_ENV,
        ADDR_ENV,
    ]
    if slices_env:
        env[:0] = [
            {"name": "MEGASCALE_NUM_SLICES", "value": "2"},
            {"name": "MEGASCALE_SLICE_ID", "value": r},
            {"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": f"tpu-0-0.{svc}"},
            {"name": "MEGASCALE_PORT", "value": "8081"},
        ]
    container = pod["spec"]["containers"][0]
    container["env"] = [*(container.get("env") or []), *env]  # it appends to the pod's env
    return pod


@pytest.mark.parametrize("slices_env", [False, True])
def test_after_gke_webhook_stand_in(slices_env: bool) -> None:
    """Both webhooks installed, GKE's first: same values for short names, its affinity stays."""
    template, hosts = render_worker_template("v6e", "4x4", slices=2)
    pod = kuberay_pod(template, hosts, 1, 2)
    after_gke = _gke_stand_in(pod, "llm-headless", slices_env)
    result = mutate_pod(after_gke)
    assert result.kept == () and result.replaced == ()
    assert result.pod["spec"]["affinity"] == after_gke["spec"]["affinity"]
    assert env_of(result.pod) == env_of(mutate_pod(pod).pod)

    # A 45-character name: GKE's truncated Service does not exist; we fix the
    # subdomain but keep its env (it looks user-set) and say so.
    name = "n" * 45
    template, hosts = render_worker_template("v6e", "4x4", slices=2, name=name)
    pod = kuberay_pod(template, hosts, 1, 2, cluster=name)
    truncated = f"{name}-headless"[-50:]
    result = mutate_pod(_gke_stand_in(pod, truncated, slices_env))
    assert result.pod["spec"]["subdomain"] == f"{name}-headless"
    assert Note("", "spec.subdomain") in result.replaced
    assert Note("ray-worker", "TPU_WORKER_HOSTNAMES") in result.kept
    assert truncated in env_of(result.pod)["TPU_WORKER_HOSTNAMES"]


def test_a_jobs_cluster_pods_use_kuberays_cluster_name_for_peers_and_coordinator() -> None:
    """A TPUSliceJob's RayCluster is ``<job>-<random>`` (KubeRay names it per attempt):
    hostnames, peers and the MEGASCALE coordinator go through that cluster's headless
    Service, never one named after the TPUSliceJob."""
    from tpuslice.render.kuberay import render_job

    job = render_job(
        {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND_JOB,
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {
                "tpu": {"type": "v6e", "topology": "4x4", "slices": 2},
                "ray": {"version": "2.54.0"},
                "job": {"entrypoint": "python train.py"},
            },
        }
    )
    group = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    pod = kuberay_pod(group["template"], int(group["numOfHosts"]), 1, 0, cluster="train-x7k2p")
    assert pod["metadata"]["labels"][c.LABEL_OWNER_KIND] == c.KIND_JOB
    result = mutate_pod(pod)
    assert result.pod["spec"]["subdomain"] == "train-x7k2p-headless"
    env = env_of(result.pod)
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "tpu-0-0.train-x7k2p-headless"
    assert env["TPU_WORKER_HOSTNAMES"].split(",")[0] == "tpu-1-0.train-x7k2p-headless"


def _tpu_containers(template: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """``count`` TPU containers of one chip each, as a NUMA-split worker has them."""
    containers = []
    for index in range(count):
        container = copy.deepcopy(template["spec"]["containers"][0])
        container["name"] = f"tpu-{index}"
        container["resources"] = {
            "limits": {c.TPU_RESOURCE: "1"},
            "requests": {c.TPU_RESOURCE: "1"},
        }
        containers.append(container)
    return containers


@pytest.mark.parametrize(("tpu_type", "topology", "chips"), [("v6e", "4x4", 4), ("v6e", "2x4", 8)])
def test_as_many_tpu_containers_as_the_host_has_chips_and_no_more(
    tpu_type: str, topology: str, chips: int
) -> None:
    template, hosts = render_worker_template(tpu_type, topology)
    pod = kuberay_pod(template, hosts, 0, 0)
    pod["spec"]["containers"] = _tpu_containers(template, chips)
    assert read_identity(pod) is not None
    sidecar = {"name": "logs", "image": "busybox"}  # containers without TPU do not count
    pod["spec"]["containers"] = [*_tpu_containers(template, chips + 1), sidecar]
    with pytest.raises(IdentityError) as refused:
        mutate_pod(pod)
    message = str(refused.value)
    assert f"pod ml/llm-tpu-worker-* has {chips + 1} containers requesting google.com/tpu" in (
        message
    )
    assert f"has {chips} chips" in message and f"at most {chips} TPU containers" in message


def test_a_dynamic_slice_gets_the_identity_of_a_tpu7x_slice_of_its_topology() -> None:
    """4x4x12 is a GKE Slice of three partitions, never a node pool: the worker template
    says the slice is dynamic, and the webhook judges the topology by the Slice's rules."""
    rc = render_cluster(
        {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND_CLUSTER,
            "metadata": {"name": "llm", "namespace": "ml"},
            "spec": {
                "tpu": {"type": "tpu7x", "topology": "4x4x12", "slices": 2},
                "ray": {"version": "2.54.0"},
                "reservation": {"policy": "DynamicSlice"},
            },
        }
    )
    group = rc["spec"]["workerGroupSpecs"][0]
    template, hosts = group["template"], int(group["numOfHosts"])
    assert hosts == 48
    assert template["metadata"]["annotations"][c.ANNOTATION_DYNAMIC_SLICE] == "true"
    env = env_of(mutate_pod(kuberay_pod(template, hosts, replica=1, host=47)).pod)
    assert env["TPU_WORKER_ID"] == "47" and env["TPU_NAME"] == "tpu-1"
    assert len(env["TPU_WORKER_HOSTNAMES"].split(",")) == 48
    assert env["MEGASCALE_NUM_SLICES"] == "2" and env["MEGASCALE_SLICE_ID"] == "1"
    assert len(env["TPU_PROCESS_ADDRESSES"].split(",")) == 48
    # without the annotation the same topology is no pool GKE offers
    del template["metadata"]["annotations"][c.ANNOTATION_DYNAMIC_SLICE]
    with pytest.raises(IdentityError, match="tpu7x has no 4x4x12 slice"):
        mutate_pod(kuberay_pod(template, hosts, replica=0, host=0))
