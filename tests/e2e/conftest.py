"""Session cluster, per-test namespaces and failure reports for the e2e tier.

By default the session starts the local simulated GKE cluster (`make tools`
must have built the binaries; `make test-e2e` does that first). Set
``TPUSLICE_E2E_KUBECONFIG=/path/to/kubeconfig`` to run the same tests against
an existing cluster that has KubeRay (with RayMultiHostIndexing) and KWOK
(watching ``kwok.x-k8s.io/node=fake``) installed; the session then only adds
and later removes its fake node pools.

If the cluster cannot start, every test errors (never skips), so CI fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Generator, Iterator
from datetime import datetime
from pathlib import Path

import pluggy
import pytest
from kubernetes.client import ApiException

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import operator  # noqa: F401  (a real `tpuslice run`)
from tpusim import ClusterSettings, LocalCluster, ToolPaths, default_pools, kube
from tpusim.nodepools import pool_names
from tpusim.processes import exit_on_signals, tail

REPO = Path(__file__).resolve().parents[2]

RUN_DIR_KEY = pytest.StashKey[Path]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/e2e is the e2e tier, marked or not.

    `make test-e2e` runs the tier as two pytest-xdist workers (``-n 2 --dist
    loadfile``): each worker is a pytest session with a local cluster and an operator
    of its own, and each file runs whole on one worker, in this order.
    test_kueue_harness.py and test_kueue.py go first: each brings up a cluster of its
    own (with Kueue) and stops it before its worker's session cluster starts.
    test_fidelity.py goes next, usually before its worker's operator starts; its checks
    hold either way (a replace of an object the operator also writes is retried on a
    conflict). test_chart.py goes last: it needs its worker's session `operator` (which
    it stops and restarts around its own).
    """
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.e2e)

    def order(item: pytest.Item) -> tuple[bool, bool, bool]:
        name = Path(str(item.fspath)).name
        return (
            name == "test_chart.py",
            name not in ("test_kueue_harness.py", "test_kueue.py"),
            name != "test_fidelity.py",
        )

    items.sort(key=order)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[E2ECluster]:
    existing = os.environ.get("TPUSLICE_E2E_KUBECONFIG")
    if existing:
        yield from _existing_cluster(Path(existing))
        return
    run_dir = REPO / ".e2e-runs" / datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    request.config.stash[RUN_DIR_KEY] = run_dir
    exit_on_signals()
    local = LocalCluster(ClusterSettings(tools=ToolPaths.for_repo(REPO), run_dir=run_dir))
    began = time.monotonic()
    try:
        local.start()
        local.add_pools(default_pools())
    except BaseException:
        local.stop()
        raise
    startup = {**local.report.steps, "total_with_pools": round(time.monotonic() - began, 2)}
    (run_dir / "startup.json").write_text(json.dumps(startup, indent=2) + "\n")
    try:
        yield E2ECluster(kubeconfig=local.kubeconfig, api=local.api, run_dir=run_dir)
    finally:
        local.stop()


def _existing_cluster(kubeconfig: Path) -> Iterator[E2ECluster]:
    api = kube.api_client(kubeconfig)
    ext = kube.apiextensions_v1(api)
    for crd in ("rayclusters.ray.io",):
        try:
            ext.read_custom_resource_definition(crd)
        except ApiException as exc:
            raise RuntimeError(f"{kubeconfig}: CRD {crd} missing; install KubeRay first") from exc
    pools = default_pools()
    for name in pool_names(pools):
        kube.delete_pool(api, name)  # leftovers of an interrupted run
    names: list[str] = []
    for pool in pools:
        names += kube.create_pool(api, pool)
    kube.wait_nodes_ready(api, names)
    try:
        yield E2ECluster(kubeconfig=kubeconfig, api=api, run_dir=None)
    finally:
        for name in pool_names(pools):
            kube.delete_pool(api, name)


@pytest.fixture
def namespace(cluster: E2ECluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace; deleted afterwards, waiting until its pods are gone.

    Waiting matters: the TPU nodes are shared, and the next test needs them free.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"e2e-{slug}-{uuid.uuid4().hex[:5]}"
    core = cluster.core
    core.create_namespace({"metadata": {"name": name, "labels": {"tpuslice.dev/e2e": "true"}}})

    def has_default_sa() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    kube.wait_for(has_default_sa, timeout_s=60, what=f"service account {name}/default")
    yield name
    core.delete_namespace(name)
    kube.wait_for(
        lambda: not core.list_namespaced_pod(name).items,
        timeout_s=120,
        what=f"pods of namespace {name} deleted",
        describe=lambda: [p.metadata.name for p in core.list_namespaced_pod(name).items],
    )


@pytest.fixture(scope="session")
def tpuslice_crds(cluster: E2ECluster) -> None:
    """Install the project's CRDs from crds/ as a user would: kubectl server-side apply.

    The API server's strict decoding is part of the test: a CRD it refuses fails here.
    """
    tools = ToolPaths.for_repo(REPO)
    kubectl = str(tools.binary("kubectl")) if not tools.missing() else "kubectl"
    argv = [kubectl, f"--kubeconfig={cluster.kubeconfig}"]
    crds = sorted(str(p) for p in (REPO / "crds").glob("*.yaml"))
    assert crds, "no CRDs in crds/"
    files = [arg for path in crds for arg in ("-f", path)]
    for cmd in (
        ["apply", "--server-side", "--force-conflicts", *files],
        ["wait", "--for=condition=Established", "--timeout=60s", *files],
    ):
        done = subprocess.run([*argv, *cmd], capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, f"kubectl {cmd[0]} crds/ failed:\n{done.stdout}{done.stderr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    """On failure, show where the component logs are and their last lines."""
    outcome = yield
    report = outcome.get_result()
    run_dir = item.config.stash.get(RUN_DIR_KEY, None)
    if not report.failed or run_dir is None:
        return
    logs = sorted((run_dir / "logs").glob("*.log"))
    parts = [f"component logs: {run_dir / 'logs'}"]
    for log in logs:
        lines = [line[:300] for line in tail(log, 8).splitlines()]
        parts.append(f"--- {log.name} (last lines) ---\n" + "\n".join(lines))
    report.sections.append(("local cluster", "\n".join(parts)))
