"""Several worker groups under reservation.policy NodePool: one pass against the fake API.

Each TPU group's slices wait in their own shape's queue with reservations naming the
group; the Joined groups are one gang across groups that claims its shapes in
``planning.groups.claim_order`` (here v5e 2x4 before v6e 4x4) and releases no pod until
every group holds all its slices; CPU groups are never waited for."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from typing import Any

from tests.support.builders import holder, nodes_of, reservation, slice_pods, tpuslice
from tests.support.crd import validate
from tests.support.fake_kube import FakeKube
from tpuslice.controller.handlers import store_indexes
from tpuslice.controller.job import JobKind
from tpuslice.controller.reconciler import Reconciler, spec_shapes
from tpuslice.controller.service import ServiceKind
from tpuslice.model import constants as c
from tpuslice.model.convert import cluster_record, ray_owner_info
from tpuslice.model.records import NodeInfo, PodInfo, ReservationInfo, ShapeMember, Snapshot
from tpuslice.runtime.informers import Watches

V6E = ("tpu-v6e-slice", "4x4")
V5E = ("tpu-v5-lite-podslice", "2x4")
TRAINER = {"name": "trainer", "tpu": {"type": "v6e", "topology": "4x4", "slices": 2}}
ROLLOUT = {"name": "rollout", "tpu": {"type": "v5e", "topology": "2x4", "chipsPerHost": 4}}
DATA = {"name": "data", "cpu": {"replicas": 2}}
OTHER = holder("tpu-zzzzz", 0, name="other", uid="uid-other")


def grouped(
    *groups: dict[str, Any], name: str = "rl", uid: str = "uid-rl", **spec: Any
) -> dict[str, Any]:
    obj = tpuslice(name=name, uid=uid, **spec)
    del obj["spec"]["tpu"]
    obj["spec"]["workerGroups"] = [copy.deepcopy(g) for g in groups or (TRAINER, ROLLOUT, DATA)]
    obj["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    return obj


def group_pods(cluster: str = "rl", trainer: int = 2, rollout: int = 1) -> list[PodInfo]:
    """Gated pods of every slice: 4 hosts per trainer slice, 2 per rollout slice, and two
    CPU pods (never gated, never waited for)."""
    pods = [
        pod
        for i in range(trainer)
        for pod in slice_pods(f"trainer-{'abc'[i]}xxxx", i, cluster=cluster, group="trainer")
    ]
    pods += [
        pod
        for i in range(rollout)
        for pod in slice_pods(
            f"rollout-{'abc'[i]}xxxx", i, hosts=2, cluster=cluster, group="rollout"
        )
    ]
    pods += slice_pods("data-xxxxx", 0, hosts=2, cluster=cluster, group="data", gated=False)
    return pods


def v6e(*pools: str) -> list[NodeInfo]:
    return nodes_of(*pools)


def v5e(*pools: str) -> list[NodeInfo]:
    return nodes_of(*pools, hosts=2, accelerator=V5E[0], topology=V5E[1])


def run(
    body: dict[str, Any],
    pods: list[PodInfo],
    nodes: list[NodeInfo],
    reservations: list[ReservationInfo] = (),  # type: ignore[assignment]
    kube: FakeKube | None = None,
    **snap: Any,
) -> FakeKube:
    kube = kube or FakeKube()
    for r in reservations:
        kube.taken[r.pool] = r
    meta = body["metadata"]
    snapshot = Snapshot(body, pods, nodes, list(reservations), None, **snap)
    kind = body.get("kind") or c.KIND_CLUSTER
    key = (kind, meta["namespace"], meta["name"])
    reconciler = Reconciler(kube, lambda _: snapshot)
    if kind == c.KIND_JOB:
        reconciler = Reconciler(kube, lambda _: snapshot, adapter=JobKind())
    if kind == c.KIND_SERVICE:
        reconciler = Reconciler(kube, lambda _: snapshot, adapter=ServiceKind())
    asyncio.run(reconciler.kick(key))
    return kube


def claims(kube: FakeKube) -> list[str]:
    return [call[1] for call in kube.calls if call[0] == "claim"]


def released(kube: FakeKube) -> list[str]:
    return [call[1] for call in kube.calls if call[0] == "release"]


def group_status(kube: FakeKube, name: str) -> dict[str, Any]:
    assert kube.status is not None
    return next(g for g in kube.status["groups"] if g["name"] == name)


def test_with_every_pool_free_each_group_claims_its_own_shape_and_all_release_together() -> None:
    kube = run(grouped(), group_pods(), v6e("v6e-a", "v6e-b") + v5e("v5e-a"))
    # the claim order: v5e 2x4 first, then both v6e 4x4 pools at once
    assert claims(kube)[0] == "v5e-a" and sorted(claims(kube)[1:]) == ["v6e-a", "v6e-b"]
    holders = {name: body["spec"]["holder"] for name, body in kube.claimed.items()}
    assert {name: h["group"] for name, h in holders.items()} == {
        "v5e-a": "rollout",
        "v6e-a": "trainer",
        "v6e-b": "trainer",
    }
    assert holders["v5e-a"]["replicaName"] == "rollout-axxxx"
    assert len(released(kube)) == 4 + 4 + 2  # every TPU pod; the CPU pods need nothing
    assert not any("data" in name for name in released(kube))


def test_a_group_that_cannot_complete_holds_every_other_groups_pods_back() -> None:
    # one free v6e pool for a trainer of two slices: the rollout group (first in the
    # order) claims its pool, and nothing is released
    held = [reservation("v6e-b", OTHER)]
    kube = run(grouped(), group_pods(), v6e("v6e-a", "v6e-b") + v5e("v5e-a"), held)
    assert claims(kube) == ["v5e-a"]
    assert released(kube) == []
    (rollout,) = group_status(kube, "rollout")["slices"]
    assert rollout["state"] == "Reserved"
    assert "released when every group of the gang holds all its slices" in rollout["message"]
    assert "trainer holds 0 of 2" in rollout["message"]
    trainer = group_status(kube, "trainer")["slices"]
    assert {s["state"] for s in trainer} == {"WaitingForCapacity"}


def test_a_later_shape_is_not_claimed_while_an_earlier_one_is_short() -> None:
    # the v5e pool is someone else's: the trainer (v6e, later in the order) claims none
    # of its two free pools, and says which group it waits for
    held = [reservation("v5e-a", OTHER)]
    kube = run(grouped(), group_pods(), v6e("v6e-a", "v6e-b") + v5e("v5e-a"), held)
    assert claims(kube) == []
    trainer = group_status(kube, "trainer")["slices"]
    assert {s["state"] for s in trainer} == {"WaitingForCapacity"}
    assert all(
        "waiting for group rollout (v5e 2x4) to hold all 1 of its slices (holds 0)" in s["message"]
        for s in trainer
    ), trainer


def test_a_gang_that_never_ran_gives_a_later_shape_back_while_an_earlier_one_is_short() -> None:
    # the trainer holds its two pools (claimed while the rollout held its own, which a
    # disruption took before anything was released): it gives them back, so it never
    # holds v6e while it waits for v5e, which another gang may hold while it waits for v6e
    trainer = [
        reservation("v6e-a", holder("trainer-axxxx", 0, name="rl", uid="uid-rl", group="trainer")),
        reservation("v6e-b", holder("trainer-bxxxx", 1, name="rl", uid="uid-rl", group="trainer")),
    ]
    held = [*trainer, reservation("v5e-a", OTHER)]
    kube = run(grouped(), group_pods(), v6e("v6e-a", "v6e-b") + v5e("v5e-a"), held)
    assert sorted(call[1] for call in kube.calls if call[0] == "free") == ["v6e-a", "v6e-b"]
    assert claims(kube) == [] and released(kube) == []


def test_a_running_gang_keeps_its_pools_when_one_group_replaces_a_slice() -> None:
    # every pod released once: nothing is given back (running slices are never taken)
    pods = [
        p if p.group != "trainer" else _released(p, "v6e-a" if p.replica_index == 0 else "v6e-b")
        for p in group_pods(rollout=1)
    ]
    trainer = [
        reservation("v6e-a", holder("trainer-axxxx", 0, name="rl", uid="uid-rl", group="trainer")),
        reservation("v6e-b", holder("trainer-bxxxx", 1, name="rl", uid="uid-rl", group="trainer")),
    ]
    held = [*trainer, reservation("v5e-a", OTHER)]
    kube = run(grouped(), pods, v6e("v6e-a", "v6e-b") + v5e("v5e-a"), held)
    assert not any(call[0] == "free" for call in kube.calls)


def _released(pod: PodInfo, pool: str) -> PodInfo:
    return replace(pod, gated=False, pinned_pool=pool)


def test_an_independent_group_claims_and_starts_on_its_own() -> None:
    rollout = {**ROLLOUT, "tpu": {**ROLLOUT["tpu"], "gang": "Independent"}}
    held = [reservation("v6e-b", OTHER)]
    kube = run(
        grouped(TRAINER, rollout, DATA), group_pods(), v6e("v6e-a", "v6e-b") + v5e("v5e-a"), held
    )
    assert claims(kube) == ["v5e-a"]
    assert sorted(released(kube)) == ["rl-rollout-axxxx-0", "rl-rollout-axxxx-1"]


def test_a_group_removed_from_the_spec_gives_its_pools_back_once_its_pods_are_gone() -> None:
    gone = reservation("v6e-z", holder("old-axxxx", 0, name="rl", uid="uid-rl", group="old"))
    kube = run(grouped(), group_pods(), v6e("v6e-a", "v6e-b", "v6e-z") + v5e("v5e-a"), [gone])
    assert [call for call in kube.calls if call[0] == "free"] == [("free", "v6e-z")]
    assert ("event", "SliceReleased") in kube.calls


def test_the_pods_of_a_removed_group_are_deleted_and_its_pool_kept_until_they_are_gone() -> None:
    """KubeRay leaves a removed worker group's pods running: the operator deletes them,
    and gives the unit back only once they are gone (the next pass)."""
    gone = reservation("v6e-z", holder("old-axxxx", 0, name="rl", uid="uid-rl", group="old"))
    old_pods = slice_pods("old-axxxx", 0, cluster="rl", group="old", gated=False)
    kube = run(
        grouped(), group_pods() + old_pods, v6e("v6e-a", "v6e-b", "v6e-z") + v5e("v5e-a"), [gone]
    )
    deleted = sorted(call[1] for call in kube.calls if call[0] == "delete-pod")
    assert deleted == sorted(p.name for p in old_pods)
    assert ("free", "v6e-z") not in kube.calls
    # the trainer's and rollout's own pods are never touched
    assert not any(call[0] == "delete-pod" and "old" not in call[1] for call in kube.calls)


def test_another_gangs_group_that_waits_on_an_earlier_shape_sets_no_pool_aside() -> None:
    # rl (older) needs two v6e pools for its trainer but waits for v5e, held by another:
    # a one-slice v6e cluster created later is not kept from one of the two free pools
    late = tpuslice(name="late", uid="uid-late")
    late["metadata"]["creationTimestamp"] = "2026-01-02T00:00:00Z"
    members = [ShapeMember(grouped(), group_pods())]
    pods = slice_pods("tpu-lxxxx", 0, cluster="late")
    kube = run(
        late,
        pods,
        v6e("v6e-a", "v6e-b") + v5e("v5e-a"),
        [reservation("v5e-a", OTHER)],
        shape_members=members,
    )
    assert len(claims(kube)) == 1


def test_a_group_at_its_turn_keeps_its_place_in_its_shapes_queue() -> None:
    # the same, with the v5e pool free: rl's trainer is at its turn once rl holds v5e;
    # before that it waits on v5e, so the later cluster may still claim now
    late = tpuslice(name="late", uid="uid-late")
    late["metadata"]["creationTimestamp"] = "2026-01-02T00:00:00Z"
    rl_rollout = reservation(
        "v5e-a", holder("rollout-axxxx", 0, name="rl", uid="uid-rl", group="rollout")
    )
    members = [ShapeMember(grouped(), group_pods())]
    kube = run(
        late,
        slice_pods("tpu-lxxxx", 0, cluster="late"),
        v6e("v6e-a", "v6e-b") + v5e("v5e-a"),
        [rl_rollout],
        shape_members=members,
    )
    assert claims(kube) == []  # both free v6e pools are set aside for rl's trainer
    assert kube.status is not None
    (slice_,) = kube.status["slices"]
    assert "1 request ahead in the queue" in slice_["message"], slice_["message"]


def test_a_grouped_object_is_a_member_of_each_of_its_shapes_queues() -> None:
    watches = Watches(object_shapes=spec_shapes)
    store = watches.objects(c.KIND_CLUSTER)
    store.put(("ml", "rl"), cluster_record(grouped()))
    store.put(("ml", "llm"), cluster_record(tpuslice()))
    by_shape = store_indexes(watches)["tsc_shape_index"]
    assert set(by_shape) == {V6E, V5E}
    assert {m["metadata"]["name"] for m in by_shape[V6E]} == {"rl", "llm"}
    assert [m["metadata"]["name"] for m in by_shape[V5E]] == ["rl"]
    store.remove(("ml", "rl"))  # gone from every queue it was in
    assert set(by_shape) == {V6E} and len(by_shape[V6E]) == 1


def test_a_group_that_can_never_fit_keeps_the_whole_gang_from_claiming() -> None:
    # three v6e slices, two v6e pools: NotEnoughPools for the trainer, and the rollout
    # (first in the order) neither claims nor keeps the node it held
    trainer = {**TRAINER, "tpu": {**TRAINER["tpu"], "slices": 3}}
    rollout_held = reservation(
        "v5e-a", holder("rollout-axxxx", 0, name="rl", uid="uid-rl", group="rollout")
    )
    kube = run(
        grouped(trainer, ROLLOUT, DATA),
        group_pods(trainer=3),
        v6e("v6e-a", "v6e-b") + v5e("v5e-a", "v5e-b"),
        [rollout_held],
    )
    assert claims(kube) == [] and released(kube) == []
    assert [call[1] for call in kube.calls if call[0] == "free"] == ["v5e-a"]
    assert kube.status is not None
    stalled = next(cond for cond in kube.status["conditions"] if cond["type"] == "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "NotEnoughPools", stalled
    (rollout,) = group_status(kube, "rollout")["slices"]
    assert "group trainer needs 3 node pools of v6e 4x4 at once" in rollout["message"]


def test_another_gang_that_can_never_fit_sets_no_pool_aside_in_any_queue() -> None:
    # rl is older and its rollout is at its turn (its shape is first): it has the one
    # v5e pool set aside, until rl's last pass found its trainer can never fit
    late = tpuslice(
        name="late", uid="uid-late", tpu={"type": "v5e", "topology": "2x4", "chipsPerHost": 4}
    )
    late["metadata"]["creationTimestamp"] = "2026-01-02T00:00:00Z"
    pods = slice_pods("tpu-lxxxx", 0, cluster="late", hosts=2)
    rl = grouped()
    waiting = run(late, pods, v5e("v5e-a"), shape_members=[ShapeMember(rl, group_pods())])
    assert claims(waiting) == []
    rl["status"] = {
        "conditions": [{"type": "Stalled", "status": "True", "reason": "NotEnoughPools"}]
    }
    kube = run(late, pods, v5e("v5e-a"), shape_members=[ShapeMember(rl, group_pods())])
    assert claims(kube) == ["v5e-a"]


def ray_owner(uid: str, status: dict[str, Any]) -> dict[str, Any]:
    """A RayJob or RayService of the object ``uid``, as the watch shows it."""
    return ray_owner_info(
        {
            "metadata": {
                "name": "rl",
                "namespace": "ml",
                "uid": "ray-uid",
                "ownerReferences": [{"uid": uid, "controller": True}],
            },
            "status": status,
        }
    )


def running_rayjob(uid: str) -> dict[str, Any]:
    return ray_owner(uid, {"jobDeploymentStatus": "Running", "rayClusterName": "rl-abcde"})


def test_a_grouped_job_reserves_per_group_and_lists_its_groups() -> None:
    job = grouped(kind=c.KIND_JOB, job={"entrypoint": "python train.py"})
    pods = [replace(p, owner_kind=c.KIND_JOB, ray_cluster="rl-abcde") for p in group_pods()]
    kube = run(job, pods, v6e("v6e-a", "v6e-b") + v5e("v5e-a"), owned=running_rayjob("uid-rl"))
    assert claims(kube)[0] == "v5e-a" and sorted(claims(kube)[1:]) == ["v6e-a", "v6e-b"]
    assert {body["spec"]["holder"]["group"] for body in kube.claimed.values()} == {
        "trainer",
        "rollout",
    }
    assert len(released(kube)) == 4 + 4 + 2
    assert kube.status is not None
    groups = {g["name"]: g for g in kube.status["groups"]}
    assert (groups["trainer"]["desiredSlices"], groups["rollout"]["desiredSlices"]) == (2, 1)
    assert groups["data"] == {"name": "data", "desiredReplicas": 2}
    assert kube.status["desiredSlices"] == 3 and "slices" not in kube.status
    assert validate("tpuslice.dev_tpuslicejobs.yaml", {**job, "status": kube.status}) == []


def test_a_grouped_job_that_ended_gives_every_groups_pools_back() -> None:
    job = grouped(kind=c.KIND_JOB, job={"entrypoint": "python train.py"})
    done = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
    ended = {**running_rayjob("uid-rl"), "status": done}
    rollout = reservation(
        "v5e-a",
        holder("rollout-axxxx", 0, name="rl", uid="uid-rl", group="rollout", kind=c.KIND_JOB),
    )
    kube = run(job, [], v6e("v6e-a") + v5e("v5e-a"), [rollout], owned=ended)
    assert ("free", "v5e-a") in kube.calls
    assert kube.status is not None
    assert [g.get("desiredSlices") for g in kube.status["groups"]] == [0, 0, None]


def test_a_grouped_service_holds_each_rayclusters_groups_as_one_gang() -> None:
    # the serving cluster holds all its groups; an upgrade's pending cluster is a gang of
    # its own: with one more v6e pool only, its rollout claims and nothing is released
    svc = grouped(kind=c.KIND_SERVICE, serve={"serveConfigV2": "applications: []"})

    def of(cluster: str) -> list[PodInfo]:
        return [
            replace(p, owner_kind=c.KIND_SERVICE, ray_cluster=cluster, name=f"{cluster}-{p.name}")
            for p in group_pods()
        ]

    serving = [
        replace(p, gated=False, pinned_pool="x")
        for p in of("rl-a")
        if p.group in ("trainer", "rollout")
    ]
    serving_held = [
        reservation(
            pool,
            holder(
                replica,
                index,
                name="rl",
                uid="uid-rl",
                kind=c.KIND_SERVICE,
                ray_cluster="rl-a",
                group=group,
            ),
            phase="Bound",
        )
        for pool, replica, index, group in (
            ("v6e-a", "trainer-axxxx", 0, "trainer"),
            ("v6e-b", "trainer-bxxxx", 1, "trainer"),
            ("v5e-a", "rollout-axxxx", 0, "rollout"),
        )
    ]
    status = {
        "activeServiceStatus": {"rayClusterName": "rl-a"},
        "pendingServiceStatus": {"rayClusterName": "rl-b"},
    }
    kube = run(
        svc,
        serving + of("rl-b"),
        v6e("v6e-a", "v6e-b", "v6e-c") + v5e("v5e-a", "v5e-b"),
        serving_held,
        owned=ray_owner("uid-rl", status),
        rayclusters={"rl-a": {"state": "ready"}, "rl-b": {"state": None}},
    )
    assert claims(kube) == ["v5e-b"]  # the pending cluster's rollout; its trainer lacks one
    assert released(kube) == []
    assert kube.status is not None
    pending = kube.status["pendingCluster"]
    assert [g["name"] for g in pending["groups"]] == ["trainer", "rollout", "data"]
    assert "slices" not in pending and pending["desiredSlices"] == 3
    assert [g["name"] for g in kube.status["activeCluster"]["groups"]][:2] == [
        "trainer",
        "rollout",
    ]
    validated = {**svc, "status": kube.status}
    assert validate("tpuslice.dev_tpusliceservices.yaml", validated) == []
