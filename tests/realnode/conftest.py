"""The real-node tier: the local cluster plus one real kubelet node, and the images built here.

The session builds (or reuses) the operator image from the unchanged Dockerfile
and the Ray image on the local stand-in base (tpusim.images), starts the local
cluster with its API server reachable from pods, the default fake TPU pools and
one real node (tpusim.realnode: containerd, kubelet, kube-proxy, dnsmasq for
``kubernetes.default.svc``), and loads the images into the node. Only pods that
tolerate ``tpusim.dev/real`` and select the node land there.

At the end everything is stopped and the host is checked for anything left
(processes, ports, the bridge, iptables chains, mounts, cgroups, sysctls): a
leftover fails the session. If anything cannot start, every test errors (never
skips), so CI fails. Needs root, like the node it runs.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import kubectl
from tpusim import (
    REAL_NODE_TOLERATION,
    ClusterSettings,
    HostLock,
    LocalCluster,
    RealNode,
    ToolPaths,
    default_pools,
    host_leftovers,
    primary_address,
)
from tpusim.images import build_images
from tpusim.processes import exit_on_signals

REPO = Path(__file__).resolve().parents[2]

#: What a pod needs to run on the real node (besides selecting it by hostname).
REAL_TOLERATION = dict(REAL_NODE_TOLERATION)


@dataclass(frozen=True)
class ImageRef:
    repository: str
    tag: str

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"


@dataclass(frozen=True)
class NodeCluster(E2ECluster):
    """An E2ECluster with one real node and the images loaded into it."""

    node_name: str = ""
    operator_image: ImageRef = ImageRef("", "")
    ray_image: ImageRef = ImageRef("", "")


def _image_ref(ref: str) -> ImageRef:
    repository, _, tag = ref.rpartition(":")
    return ImageRef(repository, tag)


@pytest.fixture(scope="session")
def node_cluster() -> Iterator[NodeCluster]:
    tools = ToolPaths.for_repo(REPO)
    run_dir = REPO / ".e2e-runs" / ("realnode-" + datetime.now().strftime("%Y%m%d-%H%M%S-%f"))
    run_dir.mkdir(parents=True)
    exit_on_signals()
    HostLock().check()  # one real node per machine: refuse before building anything
    timings: dict[str, float] = {}
    began = time.monotonic()
    images = build_images(REPO, tools.root, ray=True)
    timings["images"] = round(time.monotonic() - began, 1)
    assert images.ray is not None
    local = LocalCluster(ClusterSettings(tools=tools, run_dir=run_dir, node_ip=primary_address()))
    node = RealNode(local)
    try:
        step = time.monotonic()
        local.start()
        local.add_pools(default_pools())
        timings["cluster"] = round(time.monotonic() - step, 1)
        step = time.monotonic()
        node.start()
        timings["real_node"] = round(time.monotonic() - step, 1)
        step = time.monotonic()
        for archive in (images.operator, images.ray):
            node.load_image(archive.tar)
        timings["load_images"] = round(time.monotonic() - step, 1)
        (run_dir / "startup.json").write_text(
            json.dumps({**timings, "image_steps": images.steps}, indent=2) + "\n"
        )
        yield NodeCluster(
            kubeconfig=local.kubeconfig,
            api=local.api,
            run_dir=run_dir,
            node_name=node.name,
            operator_image=_image_ref(images.operator.ref),
            ray_image=_image_ref(images.ray.ref),
        )
    finally:
        node.stop()
        local.stop()
    report = node.cleanup_report
    assert report is None or not report.failed, f"real-node cleanup failed: {report}"
    left = host_leftovers()
    assert not left, f"the real-node tier left these on the host: {left}"


@pytest.fixture(scope="module")
def workload_ns(node_cluster: NodeCluster) -> Iterator[str]:
    """A namespace for TPUSliceClusters and RayClusters (Pod Security not enforced)."""
    name = f"rn-{uuid.uuid4().hex[:6]}"
    node_cluster.core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        kubectl(node_cluster, "delete", "namespace", name, "--wait=false", check=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """On failure, say where the run's logs are (components, kubelet, containerd)."""
    outcome: Any = yield
    report = outcome.get_result()
    if report.failed:
        runs = sorted((REPO / ".e2e-runs").glob("realnode-*"))
        if runs:
            report.sections.append(("real-node logs", f"{runs[-1] / 'logs'}"))
