"""A first pass that creates the KubeRay object ends there; its follow-up plans the
slices and writes status (``reconciler.created_only``, ``KickQueue.follow_up``)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from tests.support.builders import nodes_of, slice_pods, tpu, tpuslice
from tests.support.fake_kube import FakeKube
from tpuslice.controller.pinning import PinFence
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model.records import ObjectKey, Snapshot
from tpuslice.runtime.kube import ApiError

KEY: ObjectKey = ("TPUSliceCluster", "ml", "llm")


def _body() -> dict[str, Any]:
    return tpuslice(uid="uid-llm", generation=1, tpu=tpu(slices=1))


def _passes(kube: FakeKube, snap: Snapshot, **fields: Any) -> list[list[tuple[Any, ...]]]:
    """Each pass's API calls, in order, for one kick of ``KEY``."""
    starts: list[int] = []

    def read(key: ObjectKey) -> Snapshot:
        starts.append(len(kube.calls))
        return snap

    asyncio.run(Reconciler(kube, read, **fields).kick(KEY))
    bounds = [*starts, len(kube.calls)]
    return [kube.calls[a:b] for a, b in itertools.pairwise(bounds)]


def test_a_first_pass_that_creates_the_raycluster_leaves_planning_and_status_to_its_follow_up() -> (
    None
):
    kube = FakeKube()
    passes = _passes(kube, Snapshot(_body(), [], nodes_of("pool-a"), [], None))
    # the apply alone, then the follow-up in the same kick: no second apply (the digest
    # of the first is remembered until the watch shows the RayCluster), one status write
    assert passes == [[("apply", "llm")], [("status",)]]
    assert kube.status is not None and kube.status["slices"]


def test_pods_already_there_make_the_first_pass_a_whole_one() -> None:
    kube = FakeKube()
    snap = Snapshot(_body(), slice_pods(name="w{host}"), nodes_of("pool-a"), [], None)
    passes = _passes(kube, snap)
    assert len(passes) == 1 and ("apply", "llm") in passes[0]
    assert ("claim", "pool-a") in passes[0] and ("status",) in passes[0]


def test_a_refused_apply_is_reported_by_the_same_pass() -> None:
    kube = FakeKube(apply_error=ApiError(404, "NotFound", "the server could not find"))
    passes = _passes(kube, Snapshot(_body(), [], nodes_of("pool-a"), [], None))
    assert len(passes) == 1 and passes[0][:2] == [("apply", "llm"), ("status",)]


def test_with_pin_at_admission_the_first_pass_plans_right_after_the_apply() -> None:
    """Pinned slices' units are claimed and marked by the plan before the apply (so the
    webhook pins KubeRay's first pods): that pass is not put off."""
    kube = FakeKube()
    fence = PinFence(kube, enabled=True)
    passes = _passes(kube, Snapshot(_body(), [], nodes_of("pool-a"), [], None), fence=fence)
    assert len(passes) == 1
    calls = [c[0] for c in passes[0]]
    assert calls.index("claim") < calls.index("annotate") < calls.index("apply")
    assert ("status",) in passes[0]
    # the name checked once: the read before the claims is the apply's, not a second GET
    assert kube.raycluster_reads == [("ml", "llm")]


def test_with_pin_at_admission_a_name_taken_claims_nothing_and_stalls() -> None:
    kube = FakeKube()
    kube.rayclusters[("ml", "llm")] = {
        "metadata": {"name": "llm", "namespace": "ml", "ownerReferences": [{"uid": "another"}]}
    }
    fence = PinFence(kube, enabled=True)
    passes = _passes(kube, Snapshot(_body(), [], nodes_of("pool-a"), [], None), fence=fence)
    calls = [c[0] for c in passes[0]]
    assert "claim" not in calls and "apply" not in calls
    assert kube.status is not None
    stalled = [c for c in kube.status["conditions"] if c["type"] == "Stalled"]
    assert stalled and stalled[0]["reason"] == "RayClusterNameTaken"


def test_the_follow_up_is_one_pass_whatever_kicks_come_meanwhile() -> None:
    """A kick of the object during its first pass folds into the follow-up."""

    class Answering(FakeKube):  # the apply's answer takes a turn of the loop
        async def apply_ray(self, body: Any) -> Any:
            await asyncio.sleep(0)
            return await super().apply_ray(body)

    kube = Answering()
    runs: list[int] = []
    snap = Snapshot(_body(), [], nodes_of("pool-a"), [], None)
    reconciler: Reconciler

    def read(key: ObjectKey) -> Snapshot:
        runs.append(len(kube.calls))
        if len(runs) == 1:
            reconciler.kick_soon([KEY])  # the object's own event, during its first pass
        return snap

    async def scenario() -> None:
        await reconciler.kick(KEY)
        await reconciler.queue.drain()

    reconciler = Reconciler(kube, read)
    asyncio.run(scenario())
    assert [c for c in kube.calls if c[0] in ("apply", "status")] == [("apply", "llm"), ("status",)]
    assert len(runs) == 2
