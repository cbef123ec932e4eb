"""Work on the local cluster that every run shares: namespaces, node pools, bounded
waits, deleting everything of a kind, and the webhook configuration a stopped operator
leaves behind."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench import operator_api as c
from bench.scenario import REPO
from tpusim import LocalCluster, ToolPaths, kube


def wait_count(
    what: str, current: Callable[[], int], target: int, timeout_s: float
) -> tuple[bool, float]:
    """Poll until ``current() >= target`` (or, for a target of 0, until it is 0: things
    left to go); (reached, seconds waited). Prints progress."""
    began = time.monotonic()
    last_print = 0.0
    while True:
        n = current()
        now = time.monotonic()
        if (n <= 0) if target == 0 else (n >= target):
            return True, now - began
        shown = f"{n} left" if target == 0 else f"{n}/{target}"
        if now - began > timeout_s:
            print(f"  ! {what}: {shown} after {timeout_s:.0f}s, going on", flush=True)
            return False, now - began
        if now - last_print > 30:
            print(f"  {what}: {shown} ({now - began:.0f}s)", flush=True)
            last_print = now
        time.sleep(0.5)


def body(response: Any) -> Any:
    """JSON of a ``_preload_content=False`` answer (a RESTResponse or a urllib3 response)."""
    data = response.read() if hasattr(response, "response") else response.data
    return json.loads(data)


def make_namespace(core: Any, name: str) -> None:
    core.create_namespace({"metadata": {"name": name}})
    kube.wait_for(
        lambda: bool(core.list_namespaced_service_account(name).items),
        timeout_s=60,
        what=f"service account in {name}",
    )


def count_pods(core: Any, namespace: str) -> int:
    r = core.list_namespaced_pod(namespace, _preload_content=False, limit=10000)
    return len(body(r)["items"])


def delete_and_wait(core: Any, custom: Any, namespace: str, plural: str, timeout_s: float) -> bool:
    """Delete every object one by one from a thread pool (a single deletecollection of
    1,000 objects outlived the API server's request timeout) and wait for their pods."""
    group, version = (c.GROUP, c.VERSION) if plural == "tpusliceclusters" else ("ray.io", "v1")
    listed = custom.list_namespaced_custom_object(group, version, namespace, plural)
    names = [item["metadata"]["name"] for item in listed.get("items") or []]

    def one(name: str) -> None:
        with contextlib.suppress(Exception):  # already gone, or retried by the wait below
            custom.delete_namespaced_custom_object(
                group, version, namespace, plural, name, _preload_content=False
            )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))
    ok, _ = wait_count(
        f"pods of {namespace} gone",
        lambda: count_pods(core, namespace),
        0,
        timeout_s,
    )
    return ok


def custom_api(api: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api)


#: Taints a node carries until the node lifecycle controller has seen it Ready.
NODE_LIFECYCLE_TAINTS = frozenset(
    {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.cloudprovider.kubernetes.io/uninitialized",
    }
)


def add_pools(cluster: LocalCluster, wanted: list[Any]) -> int:
    with ThreadPoolExecutor(8) as pool:
        created = [
            n
            for chunk in pool.map(lambda p: kube.create_pool(cluster.api, p), wanted)
            for n in chunk
        ]
    core = kube.core_v1(cluster.api)

    def ready() -> int:
        r = core.list_node(_preload_content=False)
        return sum(
            1
            for n in body(r)["items"]
            if any(
                x["type"] == "Ready" and x["status"] == "True"
                for x in n.get("status", {}).get("conditions") or []
            )
            and not any(
                t.get("key") in NODE_LIFECYCLE_TAINTS for t in n.get("spec", {}).get("taints") or []
            )
        )

    # Ready is not yet schedulable: the node lifecycle controller takes the not-ready
    # taint off on its next round (--node-monitor-period, 5 s). Measured from Ready
    # alone, the operator run (the first) had every head pod unschedulable for its
    # first ~5 s ("103 node(s) had untolerated taint") and the direct run did not.
    wait_count("nodes Ready and untainted", ready, len(created), 600)
    return len(created)


def delete_webhook_configuration(cluster: LocalCluster) -> None:
    """The webhook refuses our pods while its configuration points at a stopped operator."""
    subprocess.run(
        [
            str(ToolPaths.for_repo(REPO).binary("kubectl")),
            f"--kubeconfig={cluster.kubeconfig}",
            "delete",
            "mutatingwebhookconfiguration",
            c.WEBHOOK_CONFIG,
            "--ignore-not-found",
        ],
        capture_output=True,
        timeout=60,
    )
