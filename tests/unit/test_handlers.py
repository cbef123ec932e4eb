"""The handlers' own logic, without kopf: the snapshot reader, the finalizer's tear-down,
the orphan sweep, and the wiring ``register`` makes."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kopf

from tests.support import builders
from tests.support.builders import pod
from tests.support.fake_kube import FakeKube
from tests.unit.test_reconcile import cluster_body
from tpuslice.controller.handlers import (
    make_reader,
    objects_changed,
    register,
    reservations_changed,
    resync_forever,
    resync_slot,
    sweep_forever,
    sweep_once,
    tear_down,
)
from tpuslice.model.convert import gke_slice_body, raycluster_info, reservation_body
from tpuslice.model.records import Holder, ReservationInfo, held_by
from tpuslice.runtime.config import OperatorConfig
from tpuslice.runtime.informers import Change, Watches, apply, reservation_record
from tpuslice.runtime.metrics import Metrics

UID = "uid-llm"
OURS = Holder("ml", "llm", UID, "tpu-aaaaa", 0)


def indices(
    clusters: dict[tuple[str, str], Any] | None = None,
    reservations: list[ReservationInfo] | None = None,
) -> dict[str, Any]:
    """kopf's indexes as the handlers see them: key -> a store of values."""
    by_holder: dict[str, list[ReservationInfo]] = {}
    by_shape: dict[tuple[str, str], list[ReservationInfo]] = {}
    for r in reservations or []:
        by_holder.setdefault(r.holder.uid, []).append(r)
        by_shape.setdefault(("tpu-v6e-slice", "4x4"), []).append(r)
    return {
        "tsc_index": {k: [v] for k, v in (clusters or {}).items()},
        "tsc_shape_index": {("tpu-v6e-slice", "4x4"): list((clusters or {}).values())},
        "reservation_holder_index": by_holder,
        "reservation_shape_index": by_shape,
    }


def ours_raycluster(uid: str = UID) -> dict[str, Any]:
    return raycluster_info(
        {
            "metadata": {
                "name": "llm",
                "namespace": "ml",
                "uid": "rc-uid",
                "ownerReferences": [{"kind": "TPUSliceCluster", "uid": uid, "controller": True}],
            }
        }
    )


# ------------------------------------------------------------ the snapshot reader
def test_the_reader_gives_the_clusters_pods_nodes_raycluster_and_both_kinds_of_reservation() -> (
    None
):
    watches = Watches()
    apply(
        watches.pods, "ADDED", {("ml", "w0"): pod("w0"), ("ml", "x0"): pod("x0", cluster="other")}
    )
    node = builders.node("n0", "pool-a")
    other_shape = builders.node("n1", "pool-z", accelerator="tpu-v5p-slice", topology="2x2x2")
    apply(watches.nodes, "ADDED", {("", "n0"): node, ("", "n1"): other_shape})
    apply(watches.rayclusters, "ADDED", {("ml", "llm"): ours_raycluster()})
    same_shape = ReservationInfo("pool-b", Holder("ml", "other", "uid-other", "r", 0))
    # a pool the cluster holds of a shape it no longer has (its spec changed)
    old_shape = ReservationInfo("pool-old", OURS)
    idx = indices({("ml", "llm"): cluster_body()}, [same_shape])
    idx["reservation_holder_index"][UID] = [old_shape]
    snap = make_reader(idx, watches)(("TPUSliceCluster", "ml", "llm"))
    assert snap.cluster is not None and snap.cluster["metadata"]["uid"] == UID
    assert [p.name for p in snap.pods] == ["w0"]
    assert [n.name for n in snap.nodes] == ["n0"]
    assert sorted(r.pool for r in snap.reservations) == ["pool-b", "pool-old"]
    # its own from the index by holder, pool-b (another's) not among them
    assert [r.pool for r in held_by(snap.reservations, UID)] == ["pool-old"]
    assert snap.raycluster is not None and snap.raycluster["uid"] == "rc-uid"
    assert list(snap.shape_members) == []  # the only cluster of its shape


def test_the_reader_gives_the_other_clusters_of_the_shape_with_their_pods() -> None:
    watches = Watches()
    apply(watches.pods, "ADDED", {("ml", "x0"): pod("x0", cluster="other")})
    other = cluster_body()
    other["metadata"] = {**other["metadata"], "name": "other", "uid": "uid-other"}
    idx = indices({("ml", "llm"): cluster_body(), ("ml", "other"): other})
    snap = make_reader(idx, watches)(("TPUSliceCluster", "ml", "llm"))
    assert [
        (m.cluster["metadata"]["name"], [p.name for p in m.pods]) for m in snap.shape_members
    ] == [("other", ["x0"])]


def test_the_reader_of_a_deleted_cluster_has_no_cluster_and_no_nodes() -> None:
    snap = make_reader(indices(), Watches())(("TPUSliceCluster", "ml", "gone"))
    assert snap.cluster is None and list(snap.nodes) == [] and list(snap.reservations) == []


# ------------------------------------------------------------ tear-down
def test_tear_down_deletes_our_raycluster_then_frees_the_pools_once_pods_are_gone() -> None:
    kube = FakeKube()
    watches = Watches()
    apply(watches.rayclusters, "ADDED", {("ml", "llm"): ours_raycluster()})
    idx = indices(reservations=[ReservationInfo("pool-a", OURS)])
    left = asyncio.run(
        tear_down(kube, watches, idx["reservation_holder_index"], "ml", "llm", UID, 0.01)
    )
    assert left == []
    assert kube.calls == [("delete-raycluster", "llm", "rc-uid"), ("free", "pool-a")]


def test_tear_down_keeps_the_pools_while_worker_pods_remain() -> None:
    kube = FakeKube()
    watches = Watches()
    apply(watches.pods, "ADDED", {("ml", "w0"): pod("w0")})
    idx = indices(reservations=[ReservationInfo("pool-a", OURS)])
    left = asyncio.run(
        tear_down(kube, watches, idx["reservation_holder_index"], "ml", "llm", UID, 0.01)
    )
    assert left == ["w0"]
    assert ("free", "pool-a") not in kube.calls


def test_tear_down_never_deletes_a_raycluster_it_does_not_control() -> None:
    kube = FakeKube()
    # not in our store (unlabelled), found by name, controlled by someone else
    kube.rayclusters[("ml", "llm")] = {
        "metadata": {
            "name": "llm",
            "uid": "theirs",
            "ownerReferences": [{"kind": "RayJob", "uid": "job", "controller": True}],
        }
    }
    asyncio.run(tear_down(kube, Watches(), {}, "ml", "llm", UID, 0.01))
    assert kube.raycluster_reads == [("ml", "llm")]
    assert not [c for c in kube.calls if c[0] == "delete-raycluster"]


# ------------------------------------------------------------ the sweep
def test_the_sweep_frees_only_reservations_whose_holder_is_gone_and_has_no_pods() -> None:
    kube = FakeKube()
    watches = Watches()
    live = ReservationInfo("pool-live", OURS, uid="r1")
    replaced = ReservationInfo("pool-replaced", Holder("ml", "llm", "old-uid", "r", 0), uid="r2")
    gone = ReservationInfo("pool-gone", Holder("ml", "gone", "g-uid", "r", 0), uid="r3")
    draining = ReservationInfo("pool-draining", Holder("ml", "dr", "d-uid", "tpu-d", 0), uid="r4")
    apply(watches.pods, "ADDED", {("ml", "d0"): pod("d0", cluster="dr", replica="tpu-d")})
    idx = indices({("ml", "llm"): cluster_body()}, [live, replaced, gone, draining])
    freed = asyncio.run(sweep_once(kube, idx, watches, ()))
    assert freed == ["pool-gone", "pool-replaced"]
    assert [c for c in kube.calls if c[0] == "free"] == [
        ("free", "pool-gone"),
        ("free", "pool-replaced"),
    ]


def test_the_sweep_deletes_a_gone_holders_gke_slices_before_freeing_its_partitions() -> None:
    kube = FakeKube()
    gone = Holder("ml", "gone", "g-uid", "tpu-g", 0)
    kube.gke_slices["s"] = gke_slice_body("s", gone, topology="4x4x8", partition_ids=["p1"])
    kube.gke_slices["s"]["metadata"]["uid"] = "s-uid"
    kube.gke_slices["theirs"] = {"metadata": {"name": "theirs"}, "spec": {"partitionIds": ["p9"]}}
    idx = indices({}, [ReservationInfo("sb-p1", gone, uid="r1")])
    assert asyncio.run(sweep_once(kube, idx, Watches(), ())) == []
    assert ("delete-slice", "s") in kube.calls and "theirs" in kube.gke_slices
    assert asyncio.run(sweep_once(kube, idx, Watches(), ())) == ["sb-p1"]


def test_a_namespace_scoped_sweep_never_judges_holders_in_other_namespaces() -> None:
    kube = FakeKube()
    elsewhere = ReservationInfo("pool-x", Holder("team-b", "x", "x-uid", "r", 0), uid="r1")
    mine = ReservationInfo("pool-y", Holder("ml", "y", "y-uid", "r", 0), uid="r2")
    freed = asyncio.run(sweep_once(kube, indices({}, [elsewhere, mine]), Watches(), ("ml",)))
    assert freed == ["pool-y"]


def test_the_sweep_task_waits_for_every_store_to_be_listed_before_its_first_round() -> None:
    kube = FakeKube()
    gone = ReservationInfo("pool-gone", Holder("ml", "gone", "g-uid", "r", 0), uid="r3")
    config = OperatorConfig(sweep_seconds=30)
    pauses: list[float] = []

    async def scenario() -> None:
        second_pause = asyncio.Event()

        async def sleep(seconds: float) -> None:
            """The first pause ends at once (one interval passed); the second, after the
            first round, never does: the test ends there."""
            pauses.append(seconds)
            if len(pauses) > 1:
                second_pause.set()
                await asyncio.Event().wait()

        indexed = asyncio.Event()
        task = asyncio.create_task(
            sweep_forever(kube, indices({}, [gone]), Watches(), indexed, config, sleep=sleep)
        )
        await asyncio.sleep(0)  # the task runs up to its wait for the indexes
        assert kube.calls == []  # the indexes might be half filled: no judgement yet
        assert pauses == []
        indexed.set()
        await asyncio.wait_for(second_pause.wait(), timeout=5)
        task.cancel()

    asyncio.run(scenario())
    assert ("free", "pool-gone") in kube.calls
    assert pauses == [30, 30]  # one interval before each round


# ------------------------------------------------------------ wiring
def test_register_wires_no_timer_or_finalizer_on_reservations() -> None:
    """kopf adds its finalizer to every object a timer, daemon or deletion handler
    follows: our kinds have their deletion handler; reservations have none (the sweep
    task and our watch follow them), and no kind has a kopf timer (``resync_forever``
    is one task for every object)."""
    registry = kopf.OperatorRegistry()
    register(registry)
    needing_finalizer = [
        (h.id, h.selector.any_name if h.selector else None)
        for h in registry._spawning.get_all_handlers() + registry._changing.get_all_handlers()
        if h.requires_finalizer
    ]
    assert sorted(needing_finalizer) == [
        ("tear_down", "tpusliceclusters"),
        ("tear_down", "tpuslicejobs"),
        ("tear_down", "tpusliceservices"),
    ]
    assert registry._spawning.get_all_handlers() == []


def test_the_resync_gives_every_object_one_pass_per_interval_spread_over_it() -> None:
    """After every store is listed (each object's listing gave it a pass), one step of
    the interval at a time: after a whole interval every object was kicked once, in the
    step its key hashes to, and no step kicked more than a few of 200 objects."""
    config = OperatorConfig(resync_seconds=20)
    keys = {("TPUSliceCluster", "ml", f"c{i}") for i in range(150)}
    keys |= {("TPUSliceJob", "ml", f"j{i}") for i in range(50)}
    kicked: list[set[tuple[str, str, str]]] = []

    class Reconciler:
        def kick_soon(self, keys: set[tuple[str, str, str]], releasing: bool = False) -> None:
            kicked.append(set(keys))

    watches = Watches()
    for kind, ns, name in keys:
        watches.objects(kind).put((ns, name), {"metadata": {"name": name}})
    memo = kopf.Memo()
    memo.watches = watches
    memo.reconcilers = {"TPUSliceCluster": Reconciler(), "TPUSliceJob": Reconciler()}
    memo.indexed = asyncio.Event()
    pauses: list[float] = []

    async def scenario() -> None:
        interval_done = asyncio.Event()

        async def sleep(seconds: float) -> None:
            pauses.append(seconds)
            if len(pauses) > 20:  # a whole interval of steps ran: the test ends here
                interval_done.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(resync_forever(memo, config, sleep=sleep))
        await asyncio.sleep(0)
        assert pauses == []  # waits for the listing
        memo.indexed.set()
        await asyncio.wait_for(interval_done.wait(), timeout=5)
        task.cancel()

    asyncio.run(scenario())
    assert pauses == [1.0] * 21  # 20 steps of a second, the first one step after start
    every = [key for step in kicked for key in step]
    assert sorted(every) == sorted(keys)  # each object once
    assert max(len(step) for step in kicked) <= 25
    assert resync_slot(("TPUSliceJob", "ml", "j1"), 20) == resync_slot(
        ("TPUSliceJob", "ml", "j1"), 20
    )


def test_a_reservation_taken_or_given_back_kicks_its_holder_and_the_shapes_waiting() -> None:
    """A pool taken or freed moves the shape's queue; a change of a reservation that stays
    (its phase) concerns its holder alone; a deletion is also what our record of
    unconfirmed writes waits for."""
    kicked: list[set[tuple[str, str, str]]] = []
    gone: list[tuple[str, str]] = []

    class Pending:
        def reservation_gone(self, pool: str, uid: str) -> None:
            gone.append((pool, uid))

    class Reconciler:
        pending = Pending()

        def kick_soon(self, keys: set[tuple[str, str, str]], releasing: bool = False) -> None:
            kicked.append(set(keys))

        def waiting_for(self, shape: object) -> set[tuple[str, str, str]]:
            return {("TPUSliceCluster", "ml", "waiting")}

    memo = kopf.Memo()
    memo.reconciler = Reconciler()
    memo.reconcilers = {"TPUSliceCluster": memo.reconciler}
    memo.metrics = Metrics()
    body = reservation_body(
        "pool-a",
        Holder("ml", "llm", UID, "tpu-aaaaa", 0),
        gke_accelerator="tpu-v6e-slice",
        accelerator_type="v6e-16",
        topology="4x4",
        hosts=4,
    )
    body["metadata"]["uid"] = "r1"
    record = reservation_record(body)
    llm, waiting = ("TPUSliceCluster", "ml", "llm"), ("TPUSliceCluster", "ml", "waiting")
    reservations_changed(memo, [Change(("", "pool-a"), None, record)])
    assert kicked == [{llm, waiting}] and gone == []
    kicked.clear()
    reservations_changed(memo, [Change(("", "pool-a"), record, record)])
    assert kicked == [{llm}]
    kicked.clear()
    reservations_changed(memo, [Change(("", "pool-a"), record, None)])
    assert kicked == [{llm, waiting}] and gone == [("pool-a", "r1")]


def test_kopf_keeps_no_essence_so_it_writes_nothing_for_a_create_or_an_update() -> None:
    """The operator has no create, update or resume handler: kopf's "last handled" essence
    would cost a PATCH per new object and per label change, and an annotation that
    carries the spec could outgrow the 256 KiB every annotation of an object may hold
    together (then kopf could not even patch the finalizer). So every essence is empty:
    an existing essence (not None, which kopf reads as a create) equal to the new one
    (no diff, so no update), and storing it patches nothing."""
    from tpuslice.controller.handlers import _configure_kopf

    settings = kopf.OperatorSettings()
    _configure_kopf(settings, OperatorConfig())
    storage = settings.persistence.diffbase_storage
    big = cluster_body()
    big["spec"]["job"] = {"runtimeEnvYAML": "a: '" + "x" * 256 * 1024 + "'"}
    big["metadata"]["labels"] = {"team": "a"}
    body = kopf.Body(big)
    new = storage.build(body=body)
    old = storage.fetch(body=body)
    assert old is not None and old == new == {}
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=new)
    assert not patch


def test_hosts_per_slice_of_a_pod_group_come_from_the_spec() -> None:
    """What ``informers.release_kicks`` needs of the spec: hosts per slice of the pod's
    worker group; None for an ungated spec, an invalid one or another group."""
    from tests.support.builders import HOSTS, tpuslice
    from tpuslice.controller.handlers import hosts_per_slice
    from tpuslice.model import constants as c
    from tpuslice.spec.slices import parse_slice_parts

    spec = parse_slice_parts(tpuslice())
    assert hosts_per_slice(spec, c.WORKER_GROUP) == HOSTS
    assert hosts_per_slice(spec, "cpu") is None
    assert hosts_per_slice(None, c.WORKER_GROUP) is None
    ungated = parse_slice_parts(tpuslice(reservation={"policy": "None"}))
    assert hosts_per_slice(ungated, c.WORKER_GROUP) is None


def test_an_objects_own_status_and_annotation_patches_kick_no_pass() -> None:
    """Our status patch and kopf's finalizer patch are changes of the object's record that
    change nothing a pass reads; a new generation, a label or the deletion does. Added or
    deleted, the object also moves its shape's queue; deleted, it is forgotten."""
    from tpuslice.controller.reconciler import Reconciler as RealReconciler

    kicked: list[tuple[str, str, str]] = []
    forgotten: list[tuple[tuple[str, str, str], str]] = []
    key = ("TPUSliceCluster", "ml", "llm")
    waiting = ("TPUSliceCluster", "ml", "waiting")

    class Reconciler:
        inputs_changed = RealReconciler.inputs_changed

        def __init__(self) -> None:
            self._inputs: dict[object, object] = {}

        def kick_soon(self, keys: set[tuple[str, str, str]], releasing: bool = False) -> None:
            kicked.extend(sorted(keys))

        def waiting_for(self, shape: object) -> set[tuple[str, str, str]]:
            return {waiting, key}

        def forget(self, key: tuple[str, str, str], uid: str = "") -> None:
            forgotten.append((key, uid))

    memo = kopf.Memo()
    memo.reconcilers = {"TPUSliceCluster": Reconciler()}
    before: dict[str, Any] | None = None

    def change(body: dict[str, Any] | None) -> list[tuple[str, str, str]]:
        nonlocal before
        kicked.clear()
        record = None if body is None else copy.deepcopy(body)
        objects_changed(memo, [Change(("ml", "llm"), before, record)], "TPUSliceCluster")
        before = record
        return list(kicked)

    body = cluster_body()
    body["metadata"].update(uid=UID, generation=1)
    assert change(body) == [key, waiting]  # the listing, or a create
    body["status"] = {"conditions": [{"type": "Ready", "status": "False"}]}
    assert change(body) == []  # our status patch
    body["metadata"]["finalizers"] = ["tpuslice.dev/finalizer"]
    assert change(body) == []  # kopf's
    body["metadata"]["generation"] = 2
    assert change(body) == [key]  # the spec
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}
    assert change(body) == [key]
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert change(body) == [key]
    assert change(None) == [waiting] and forgotten == [(key, UID)]
