"""Our own watches: the record store, folding deliveries into it, what each change kicks,
and splitting a watch stream into events."""

from __future__ import annotations

import asyncio

from tpuslice.kube import Followed, iter_lines, object_key
from tpuslice.reconcile import Reconciler, Snapshot
from tpuslice.reservation import NodeInfo, PodInfo
from tpuslice.snapshot import node_info
from tpuslice.store import RecordStore
from tpuslice.watches import apply, node_kicks, pod_kicks


def node(name: str, pool: str, ready: bool = True, topology: str = "4x4") -> NodeInfo:
    return NodeInfo(name, pool, "tpu-v6e-slice", topology, 4, ready, True)


def pod(ns: str, name: str, cluster: str) -> PodInfo:
    return PodInfo(ns, name, cluster, "tpu-a", 0, 0, True, None, None, False, False)


def nodes_store() -> RecordStore[NodeInfo]:
    return RecordStore(lambda n: (n.accelerator, n.topology))


def test_store_groups_records_and_moves_them_when_their_group_changes() -> None:
    store = nodes_store()
    store.put(("", "n1"), node("n1", "a"))
    store.put(("", "n2"), node("n2", "b", topology="2x2"))
    assert [n.name for n in store.group(("tpu-v6e-slice", "4x4"))] == ["n1"]
    change = store.put(("", "n2"), node("n2", "b"))  # relabelled to the other topology
    assert change.old is not None and change.old.topology == "2x2"
    assert store.group(("tpu-v6e-slice", "2x2")) == []
    assert {n.name for n in store.group(("tpu-v6e-slice", "4x4"))} == {"n1", "n2"}
    gone = store.remove(("", "n1"))
    assert gone is not None and gone.deleted and gone.record.name == "n1"
    assert store.remove(("", "n1")) is None
    assert len(store) == 1


def test_relist_reports_what_the_watch_missed_including_deletions() -> None:
    store = nodes_store()
    apply(store, None, {("", "n1"): node("n1", "a"), ("", "n2"): node("n2", "a")})
    changes = apply(
        store, None, {("", "n2"): node("n2", "a", ready=False), ("", "n3"): node("n3", "b")}
    )
    summary = {(ch.key[1], ch.deleted) for ch in changes}
    assert summary == {("n1", True), ("n2", False), ("n3", False)}
    assert (
        apply(store, None, {("", "n2"): node("n2", "a", ready=False), ("", "n3"): node("n3", "b")})
        == []
    )


def test_relist_of_one_namespace_keeps_the_others() -> None:
    store: RecordStore[PodInfo] = RecordStore(lambda p: (p.namespace, p.cluster))
    apply(store, None, {("a", "p1"): pod("a", "p1", "x")}, namespace="a")
    apply(store, None, {("b", "p2"): pod("b", "p2", "y")}, namespace="b")
    assert apply(store, None, {}, namespace="b")[0].key == ("b", "p2")
    assert [p.name for p in store.group(("a", "x"))] == ["p1"]


def test_a_heartbeat_that_changes_no_kept_field_is_no_change() -> None:
    store = nodes_store()
    apply(store, "ADDED", {("", "n1"): node("n1", "a")})
    assert apply(store, "MODIFIED", {("", "n1"): node("n1", "a")}) == []
    assert len(apply(store, "MODIFIED", {("", "n1"): node("n1", "a", ready=False)})) == 1
    assert apply(store, "DELETED", {("", "gone"): node("gone", "a")}) == []
    assert apply(store, "DELETED", {("", "n1"): node("n1", "a")})[0].deleted


def test_node_changes_mark_the_shape_stale_and_kick_waiters_and_the_pool_holder() -> None:
    store = nodes_store()
    apply(store, None, {("", "n1"): node("n1", "a")})
    changes = apply(store, "MODIFIED", {("", "n1"): node("n1", "a", ready=False)})
    shape = ("tpu-v6e-slice", "4x4")
    shapes, keys = node_kicks(
        changes,
        waiting_for=lambda s: {("ml", "waiter")} if s == shape else set(),
        holders_of=lambda s, p: {("ml", "holder")} if p == "a" else set(),
    )
    assert shapes == {shape}
    assert keys == {("ml", "waiter"), ("ml", "holder")}


def test_pod_changes_kick_their_cluster() -> None:
    store: RecordStore[PodInfo] = RecordStore(lambda p: (p.namespace, p.cluster))
    changes = apply(store, "ADDED", {("ml", "w0"): pod("ml", "w0", "llm")})
    changes += apply(store, "DELETED", {("ml", "w0"): pod("ml", "w0", "llm")})
    assert pod_kicks(changes) == {("ml", "llm")}


def test_watch_stream_lines_are_reassembled_across_chunks() -> None:
    chunks = [b'{"type":"ADDED",', b'"object":{}}\n{"type"', b':"BOOKMARK"}\n\n', b'{"x":1}']
    assert list(iter_lines(chunks)) == [
        b'{"type":"ADDED","object":{}}',
        b'{"type":"BOOKMARK"}',
        b'{"x":1}',
    ]


def test_followed_kind_paths_and_conversion() -> None:
    pods = Followed("", "v1", "pods", dict, "tpuslice.dev/cluster", "ml")
    assert pods.path() == "/api/v1/namespaces/ml/pods"
    assert pods.query() == {"labelSelector": "tpuslice.dev/cluster"}
    nodes = Followed("", "v1", "nodes", node_info)
    assert nodes.path() == "/api/v1/nodes" and nodes.query() == {}
    assert object_key({"metadata": {"name": "n1"}}) == ("", "n1")


def test_kicks_wait_until_kopf_has_filled_its_indexes() -> None:
    reads: list[tuple[str, str]] = []

    def read(key: tuple[str, str]) -> Snapshot:
        reads.append(key)
        return Snapshot(cluster=None, pods=[], nodes=[], reservations=[], raycluster=None)

    async def scenario() -> None:
        reconciler = Reconciler(None, read)  # type: ignore[arg-type]
        reconciler.hold_until_indexed()
        await reconciler.kick(("ml", "llm"))
        await reconciler.kick(("ml", "llm"))
        assert reads == []
        reconciler.indexed()
        await asyncio.sleep(0.01)
        assert reads == [("ml", "llm")]
        reconciler.indexed()  # idempotent
        await reconciler.kick(("ml", "other"))
        assert reads == [("ml", "llm"), ("ml", "other")]

    asyncio.run(scenario())
