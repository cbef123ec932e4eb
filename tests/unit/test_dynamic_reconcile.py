"""A TPUSliceCluster with spec.reservation.policy DynamicSlice through the one pass:
partitions claimed, a GKE Slice created over them, pods pinned to it, torn down."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.builders import holder, partition_nodes, reservation, slice_pods, tpuslice
from tests.support.fake_kube import FakeKube
from tpuslice.controller.handlers import tear_down
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model import constants as c
from tpuslice.model.records import NodeInfo, ReservationInfo, Snapshot

KEY = ("TPUSliceCluster", "ml", "llm")
HOSTS = 32


def body() -> dict[str, Any]:
    return tpuslice(
        uid="uid-llm",
        generation=1,
        tpu={"type": "tpu7x", "topology": "4x4x8"},
        reservation={"policy": "DynamicSlice"},
    )


def nodes() -> list[NodeInfo]:
    return [n for pid in ("p1", "p2", "p3") for n in partition_nodes(pid)]


def run(kube: FakeKube, reservations: list[ReservationInfo]) -> None:
    snap = Snapshot(body(), slice_pods(hosts=HOSTS), nodes(), reservations, None)
    asyncio.run(Reconciler(kube, lambda _: snap).kick(KEY))


def held() -> list[ReservationInfo]:
    return [reservation("sb-p1", holder()), reservation("sb-p2", holder())]


def test_partitions_are_claimed_then_a_slice_formed_then_pods_pinned_to_it() -> None:
    kube = FakeKube()
    run(kube, [])
    assert sorted(kube.claimed) == ["sb-p1", "sb-p2"]
    assert not kube.gke_slices and not kube.selectors

    kube = FakeKube()
    run(kube, held())
    (name,) = kube.gke_slices
    created = kube.gke_slices[name]
    assert created["spec"] == {"type": "tpu7x", "topology": "4x4x8", "partitionIds": ["p1", "p2"]}
    notes = created["metadata"]["annotations"]
    assert notes[c.ANNOTATION_SLICE_OWNER_NAME] == "llm"
    assert notes[c.ANNOTATION_SLICE_OWNER_NAMESPACE] == "ml"
    assert not kube.selectors  # not ACTIVE yet

    created["status"] = {"conditions": [{"type": "Ready", "status": "True", "reason": "ACTIVE"}]}
    run(kube, held())
    assert len(kube.selectors) == HOSTS
    assert all(sel == {c.NODE_LABEL_TPU_SLICE: name} for sel in kube.selectors.values())
    assert len(kube.gke_slices) == 1  # no second Slice


class _Watches:
    async def pods_gone(self, key: Any, wait: float) -> list[Any]:
        return []

    def ray_object(self, key: Any) -> None:
        return None


def test_tear_down_deletes_the_slice_first_and_frees_partitions_once_it_is_gone() -> None:
    kube = FakeKube()
    run(kube, held())
    (name,) = kube.gke_slices
    index = {"uid-llm": held()}
    left = asyncio.run(tear_down(kube, _Watches(), index, "ml", "llm", "uid-llm"))  # type: ignore[arg-type]
    assert left == [f"GKE Slice {name}"]
    assert ("delete-slice", name) in kube.calls
    assert not any(call[0] == "free" for call in kube.calls)
    left = asyncio.run(tear_down(kube, _Watches(), index, "ml", "llm", "uid-llm"))  # type: ignore[arg-type]
    assert left == []
    assert sorted(call[1] for call in kube.calls if call[0] == "free") == ["sb-p1", "sb-p2"]
