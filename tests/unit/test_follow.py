"""Our own watches: the record store, folding deliveries into it, what each change kicks,
and splitting a watch stream into events."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import Any

from tests.support.builders import node, pod
from tpuslice.controller.reconciler import Reconciler
from tpuslice.model.convert import node_info
from tpuslice.model.records import NodeInfo, PodInfo, Snapshot
from tpuslice.runtime.informers import (
    Followed,
    RecordStore,
    apply,
    follow_forever,
    iter_lines,
    node_kicks,
    object_key,
    pod_kicks,
    release_kicks,
)


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
    apply(
        store,
        None,
        {("a", "p1"): pod("p1", namespace="a", cluster="x", replica="tpu-a")},
        namespace="a",
    )
    apply(
        store,
        None,
        {("b", "p2"): pod("p2", namespace="b", cluster="y", replica="tpu-a")},
        namespace="b",
    )
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
        holders_of=lambda s, units: {("ml", "holder")} if "a" in units else set(),
    )
    assert shapes == {shape}
    assert keys == {("ml", "waiter"), ("ml", "holder")}


def test_a_node_change_kicks_the_holder_of_the_node_itself() -> None:
    """A single-host slice holds a node, not its pool: a taint on that node kicks its
    holder at once (no wait for a resync)."""
    store = nodes_store()
    apply(store, None, {("", "n1"): node("n1", "a")})
    changes = apply(store, "MODIFIED", {("", "n1"): node("n1", "a", ready=False)})
    _, keys = node_kicks(
        changes,
        waiting_for=lambda s: set(),
        holders_of=lambda s, units: {("ml", "single")} if "n1" in units else set(),
    )
    assert keys == {("ml", "single")}


def test_pod_changes_kick_their_cluster() -> None:
    store: RecordStore[PodInfo] = RecordStore(lambda p: (p.namespace, p.cluster))
    changes = apply(store, "ADDED", {("ml", "w0"): pod("w0", replica="tpu-a")})
    changes += apply(store, "DELETED", {("ml", "w0"): pod("w0", replica="tpu-a")})
    assert pod_kicks(changes) == {("TPUSliceCluster", "ml", "llm")}
    job_pod = replace(pod("w1", replica="tpu-a"), owner_kind="TPUSliceJob")
    assert pod_kicks(apply(store, "ADDED", {("ml", "w1"): job_pod})) == {
        ("TPUSliceJob", "ml", "llm")
    }


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
    reads: list[tuple[str, str, str]] = []

    def read(key: tuple[str, str, str]) -> Snapshot:
        reads.append(key)
        return Snapshot(cluster=None, pods=[], nodes=[], reservations=[], raycluster=None)

    async def scenario() -> None:
        reconciler = Reconciler(None, read)  # type: ignore[arg-type]
        reconciler.hold_until_indexed()
        await reconciler.kick(("TPUSliceCluster", "ml", "llm"))
        await reconciler.kick(("TPUSliceCluster", "ml", "llm"))
        assert reads == []
        reconciler.indexed()
        await reconciler.queue.drain()
        assert reads == [("TPUSliceCluster", "ml", "llm")]
        reconciler.indexed()  # idempotent
        await reconciler.kick(("TPUSliceCluster", "ml", "other"))
        assert reads == [("TPUSliceCluster", "ml", "llm"), ("TPUSliceCluster", "ml", "other")]

    asyncio.run(scenario())


class FakeResponse:
    def __init__(self, status: int, payload: bytes, lines: list[bytes] | None = None) -> None:
        self.status = status
        self.reason = "OK" if status < 400 else "Error"
        self._payload = payload
        self.response = self
        self._lines = lines or []

    def read(self) -> bytes:
        return self._payload

    def stream(self, _: int) -> list[bytes]:
        return [line + b"\n" for line in self._lines]

    def release_conn(self) -> None:
        pass


class FakeApi:
    """Answers list and watch requests from a script, one answer per request.
    ``over``: set when a request comes after the script's last answer, so a follow that
    runs on the calling thread returns (its test fails on what it saw) instead of
    retrying forever, as it would after a failure the test did not expect."""

    def __init__(
        self, answers: list[FakeResponse | Exception], over: threading.Event | None = None
    ) -> None:
        self.answers = answers
        self.over = over
        self.urls: list[str] = []
        self.configuration = type("C", (), {"host": "https://api"})()
        self.rest_client = self

    def update_params_for_auth(self, *_: object) -> None:
        pass

    def request(self, method: str, url: str, **_: object) -> FakeResponse:
        self.urls.append(url)
        if not self.answers:
            if self.over is not None:
                self.over.set()
            raise ConnectionError("script over")
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _node_obj(name: str, rv: str, ready: bool = True) -> dict[str, object]:
    return {
        "metadata": {
            "name": name,
            "resourceVersion": rv,
            "labels": {
                "cloud.google.com/gke-nodepool": "a",
                "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                "cloud.google.com/gke-tpu-topology": "4x4",
            },
        },
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_follow_lists_in_pages_watches_and_relists_after_410() -> None:
    import json

    from tpuslice.runtime.kube import Kube

    def page(items: list[object], rv: str, token: str = "") -> FakeResponse:
        meta = {"resourceVersion": rv, **({"continue": token} if token else {})}
        return FakeResponse(200, json.dumps({"items": items, "metadata": meta}).encode())

    def event(kind: str, obj: object) -> bytes:
        return json.dumps({"type": kind, "object": obj}).encode()

    stop = threading.Event()
    api = FakeApi(
        [
            page([_node_obj("n1", "1")], "5", token="more"),
            page([_node_obj("n2", "2")], "5"),
            FakeResponse(
                200,
                b"",
                [
                    event("MODIFIED", _node_obj("n1", "6", ready=False)),
                    event("BOOKMARK", {"metadata": {"resourceVersion": "7"}}),
                    event("ERROR", {"code": 410, "reason": "Expired", "message": "too old"}),
                ],
            ),
            page([_node_obj("n1", "8", ready=False)], "8"),  # n2 went while we were away
        ],
        over=stop,
    )
    kube = Kube(api=api, executor=None)  # type: ignore[arg-type]
    seen: list[tuple[str | None, list[str]]] = []

    def emit(event_type: str | None, records: dict[tuple[str, str], NodeInfo]) -> None:
        seen.append((event_type, sorted(k[1] for k in records)))
        if len(seen) == 3:
            stop.set()

    follow_forever(kube, Followed("", "v1", "nodes", node_info, "x"), emit, stop)
    assert seen == [(None, ["n1", "n2"]), ("MODIFIED", ["n1"]), (None, ["n1"])]
    assert "continue=more" in api.urls[1]
    assert "watch=1" in api.urls[2] and "resourceVersion=5" in api.urls[2]


def test_follow_of_a_kind_whose_crd_is_missing_reports_an_empty_listing() -> None:
    from tpuslice.runtime.kube import Kube

    stop = threading.Event()
    api = FakeApi([FakeResponse(404, b'{"reason":"NotFound","message":"no such kind"}')], stop)
    kube = Kube(api=api, executor=None)  # type: ignore[arg-type]
    seen: list[object] = []

    def emit(event_type: str | None, records: dict[tuple[str, str], object]) -> None:
        seen.append((event_type, records))
        stop.set()

    follow_forever(kube, Followed("ray.io", "v1", "rayclusters", dict), emit, stop)
    assert seen == [(None, {})]


def test_follow_tells_readiness_when_the_api_server_fails_and_when_it_answers_again() -> None:
    import json

    from tpuslice.runtime.health import Health
    from tpuslice.runtime.kube import Kube

    class Recording(Health):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, str]] = []

        def watch_ok(self, kind: str) -> None:
            self.calls.append(("ok", kind))
            super().watch_ok(kind)

        def watch_failed(self, kind: str, error: str) -> None:
            self.calls.append(("failed", error))
            super().watch_failed(kind, error)

    listing = json.dumps({"items": [], "metadata": {"resourceVersion": "3"}}).encode()
    stop = threading.Event()
    refused = ConnectionRefusedError(111, "Connection refused")
    api = FakeApi([refused, FakeResponse(200, listing)], stop)
    health = Recording()
    kube = Kube(api=api, executor=None, health=health)  # type: ignore[arg-type]

    def emit(event_type: str | None, records: dict[tuple[str, str], object]) -> None:
        stop.set()

    follow_forever(kube, Followed("", "v1", "nodes", node_info, "x"), emit, stop)
    # (the watch after the listing then fails too: the script is over)
    assert health.calls[:2] == [
        ("failed", "ConnectionRefusedError: [Errno 111] Connection refused"),
        ("ok", "nodes"),
    ]


def test_pods_gone_waits_on_the_store_and_reports_what_is_left() -> None:
    from tpuslice.runtime.informers import Watches

    async def scenario() -> None:
        w = Watches()
        apply(
            w.pods,
            "ADDED",
            {("ml", "w0"): pod("w0", replica="tpu-a")},
        )
        # No time left: what is still in the store, at once.
        assert [
            p.name for p in await w.pods_gone(("TPUSliceCluster", "ml", "llm"), 0.0, poll=0.01)
        ] == ["w0"]

        async def delete_later() -> None:  # runs while pods_gone waits between two looks
            apply(
                w.pods,
                "DELETED",
                {("ml", "w0"): pod("w0", replica="tpu-a")},
            )

        task = asyncio.create_task(delete_later())
        assert await w.pods_gone(("TPUSliceCluster", "ml", "llm"), 5.0, poll=0.01) == []
        await task

    asyncio.run(scenario())


def _pods_store() -> RecordStore[PodInfo]:
    return RecordStore(lambda p: p.owner)


def test_the_change_that_completes_a_gated_slice_is_a_release_kick() -> None:
    """Only the change after which every host of the slice exists, all gated and none
    deleting, kicks for a release; the owner's other slices do not count."""
    store = _pods_store()
    owner = ("TPUSliceCluster", "ml", "llm")
    hosts = {("TPUSliceCluster", "ml", "llm", "tpu"): 2}

    def hosts_of(key: tuple[str, str, str], group: str) -> int | None:
        return hosts.get((*key, group))

    def add(p: PodInfo) -> set[tuple[str, str, str]]:
        changes = apply(store, "ADDED", {(p.namespace, p.name): p})
        return release_kicks(changes, store.group, hosts_of)

    def host(name: str, replica: str, i: int, **fields: Any) -> PodInfo:
        return pod(name, replica=replica, host=i, group="tpu", **fields)

    assert add(host("a0", "tpu-a", 0)) == set()  # one of two
    assert add(host("b0", "tpu-b", 0)) == set()  # another slice's first
    assert add(host("a1", "tpu-a", 1)) == {owner}  # slice a is whole
    # a released pod in the slice (the release went out): no more release kicks
    released = host("a1", "tpu-a", 1, gated=False, pool="p")
    assert (
        release_kicks(apply(store, "MODIFIED", {("ml", "a1"): released}), store.group, hosts_of)
        == set()
    )
    assert add(host("b1", "tpu-b", 1, deleting=True)) == set()  # one host going
    assert add(host("c0", "tpu-c", 0, kueue_gated=True)) == set()  # Kueue holds it
    hosts.clear()  # the spec is unknown (invalid, ungated, or a CPU group)
    assert add(host("d0", "tpu-d", 0)) == set()


def test_a_single_host_slice_is_whole_with_its_one_pod() -> None:
    store = _pods_store()
    solo = replace(pod("s0", replica=None, index=3, host=None), group="tpu")
    changes = apply(store, "ADDED", {("ml", "s0"): solo})
    assert release_kicks(changes, store.group, lambda key, group: 1) == {
        ("TPUSliceCluster", "ml", "llm")
    }
    gone = apply(store, "DELETED", {("ml", "s0"): solo})
    assert release_kicks(gone, store.group, lambda key, group: 1) == set()


def test_pod_status_changes_no_plan_reads_kick_no_pass() -> None:
    """A pod's record keeps only what a plan reads (gates, nodeName, Running and Ready,
    deletion, its slice's labels, Unschedulable): the status updates in between (IP,
    container states, PodScheduled True, Running not yet Ready) are no change at all."""
    from tpuslice.model.convert import pod_info

    def raw(**status: Any) -> dict[str, Any]:
        return {
            "metadata": {
                "name": "w0",
                "namespace": "ml",
                "labels": {"tpuslice.dev/cluster": "llm", "ray.io/group": "tpu"},
            },
            "spec": {"nodeName": "n1"},
            "status": status,
        }

    store: RecordStore[PodInfo] = RecordStore(lambda p: p.owner)
    key = ("ml", "w0")
    assert apply(store, "ADDED", {key: pod_info(raw(phase="Pending"))})
    scheduled = raw(
        phase="Pending",
        podIP="10.0.0.1",
        conditions=[{"type": "PodScheduled", "status": "True"}],
    )
    assert apply(store, "MODIFIED", {key: pod_info(scheduled)}) == []
    running = raw(phase="Running", conditions=[{"type": "Ready", "status": "False"}])
    assert apply(store, "MODIFIED", {key: pod_info(running)}) == []
    ready = raw(phase="Running", conditions=[{"type": "Ready", "status": "True"}])
    assert len(apply(store, "MODIFIED", {key: pod_info(ready)})) == 1


def test_a_store_of_several_groups_per_record_asks_for_them_once_per_put() -> None:
    """For our kinds ``groups_of`` parses the spec: taking a record out (replaced or
    deleted) uses the groups it was put in, without asking again."""
    asked: list[str] = []

    def shapes(record: dict[str, Any]) -> list[str]:
        asked.append(record["name"])
        return record["shapes"]

    store: RecordStore[dict[str, Any]] = RecordStore(lambda _: None, shapes)
    store.put(("ml", "a"), {"name": "a1", "shapes": ["x", "y", "x"]})
    assert [r["name"] for r in store.group("x")] == ["a1"] == [r["name"] for r in store.group("y")]
    store.put(("ml", "a"), {"name": "a2", "shapes": ["y"]})
    assert store.group("x") == [] and [r["name"] for r in store.group("y")] == ["a2"]
    store.remove(("ml", "a"))
    assert store.group("y") == [] and store.group_keys() == []
    assert asked == ["a1", "a2"]
