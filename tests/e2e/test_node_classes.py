"""TPU nodes the operator never takes, each named with why in status: a TPU7x
dynamic-slicing sub-block (PROVISION_ONLY, no Slice formed yet) and the nodes of a GKE
Slice someone else formed, on the local cluster with GKE's labels (hack/tpusim)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.helpers import E2ECluster
from tests.e2e.operator_support import apply, get_tsc, kubectl, reservations, tsc
from tpusim import kube
from tpusim.nodepools import TPUPool
from tpusim.operator_process import OperatorProcess

BLOCK = "tpu7x-block"
THEIRS = "tpu7x-theirs"
TIMEOUT_S = 180


@pytest.fixture
def tpu7x_pools(cluster: E2ECluster, namespace: str, operator: OperatorProcess) -> Iterator[None]:
    pools = (
        TPUPool(BLOCK, "tpu7x", "4x4x4", nodes=16, dynamic_slicing=True),
        TPUPool(THEIRS, "tpu7x", "4x4x4", nodes=16, dynamic_slicing=True, slice_name="team-b"),
    )
    for pool in pools:
        kube.wait_nodes_ready(cluster.api, kube.create_pool(cluster.api, pool))
    yield
    kubectl(
        cluster, "delete", "tsc", "--all", "-n", namespace, "--wait=true", "--timeout=120s",
        check=False,
    )  # fmt: skip
    for pool in pools:
        kube.delete_pool(cluster.api, pool.name)


def test_a_sub_block_and_another_owners_slice_are_never_claimed_and_say_why(
    cluster: E2ECluster, namespace: str, tpu7x_pools: None
) -> None:
    apply(cluster, namespace, tsc("ironwood", type_="tpu7x", topology="4x4x4"))

    def explained() -> str | None:
        slices = (get_tsc(cluster, namespace, "ironwood").get("status") or {}).get("slices")
        message = str((slices or [{}])[0].get("message", ""))
        if "dynamic-slicing sub-block" in message and "GKE Slice team-b" in message:
            return message
        return None

    message = kube.wait_for(
        explained,
        timeout_s=TIMEOUT_S,
        what="the wait naming the sub-block and the other owner's Slice",
        describe=lambda: get_tsc(cluster, namespace, "ironwood").get("status"),
    )
    assert BLOCK in message and THEIRS in message, message
    status = get_tsc(cluster, namespace, "ironwood")["status"]
    assert status["slices"][0]["state"] == "WaitingForCapacity"
    held = [r for r in reservations(cluster) if r["spec"]["holder"]["namespace"] == namespace]
    assert held == []
