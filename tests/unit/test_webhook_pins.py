"""The identity webhook's pin lookup: the marked reservations kept by a watch, a live GET
before each pin, and the pod left gated before the first listing and on any error."""

from __future__ import annotations

import base64
import copy
import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import jsonpatch

from tests.unit.test_follow import FakeApi, FakeResponse
from tests.unit.test_pinning import _worker, marked
from tests.unit.test_webhook import _review
from tpuslice.model import constants as c
from tpuslice.model.records import ReservationInfo
from tpuslice.runtime.kube import Kube
from tpuslice.webhook import admission as webhook
from tpuslice.webhook.pinning import FIRST_LISTING_WAIT_SECONDS, Marked, PinLookup, marked_record


def _reservation_object(info: ReservationInfo, rv: str = "1") -> dict[str, Any]:
    h = info.holder
    return {
        "metadata": {
            "name": info.pool,
            "uid": info.uid,
            "resourceVersion": rv,
            "annotations": {c.ANNOTATION_PIN: "true"} if info.pinned else {},
        },
        "spec": {
            "nodePool": info.pool,
            "holder": {
                "namespace": h.namespace,
                "name": h.name,
                "uid": h.uid,
                "replicaName": h.replica_name,
                "replicaIndex": h.replica_index,
            },
        },
    }


def _mine(pool: str = "pool-a") -> ReservationInfo:
    """A reservation marked for slice 1 of the object ``_worker`` belongs to."""
    name = _worker()["metadata"]["labels"][c.LABEL_CLUSTER]
    info = marked(pool, "tpu-old", 1)
    return replace(info, holder=replace(info.holder, name=name))


def _records(*infos: ReservationInfo) -> dict[tuple[str, str], Marked | None]:
    return {("", i.pool): marked_record(_reservation_object(i)) for i in infos}


def _lookup(get: Callable[[str], Any], *infos: ReservationInfo) -> PinLookup:
    lookup = PinLookup(get, clock=lambda: 0.0)
    lookup.deliver(None, _records(*infos))
    return lookup


def test_admission_pins_a_worker_of_a_marked_slice_after_a_live_read() -> None:
    info = _mine()
    reads: list[str] = []

    def get(name: str) -> Any:
        reads.append(name)
        return _reservation_object(info)

    lookup = _lookup(get, info)
    pod = _worker()
    answer = webhook.admission_response(_review(copy.deepcopy(pod)), pin=lookup.pool_for)
    out = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(answer["response"]["patch"])))
    assert out["spec"]["nodeSelector"][c.NODE_LABEL_NODEPOOL] == "pool-a"
    assert c.SCHEDULING_GATE not in {g["name"] for g in out["spec"].get("schedulingGates") or []}
    assert out["metadata"]["annotations"][c.ANNOTATION_PINNED] == "pool-a"
    assert reads == ["pool-a"]  # the one marked reservation, read live; nothing listed


def test_a_mark_the_watch_shows_is_seen_by_the_next_pod_and_its_removal_too() -> None:
    info = _mine()
    lookup = _lookup(lambda n: _reservation_object(info))
    pod = _worker()
    assert lookup.pool_for(pod) is None  # nothing marked yet
    lookup.deliver("ADDED", _records(replace(info, pinned=False)))
    assert lookup.pool_for(pod) is None and lookup.marked() == 0  # held, not marked
    lookup.deliver("MODIFIED", _records(info))
    assert lookup.pool_for(pod) == "pool-a"
    lookup.deliver("MODIFIED", _records(replace(info, pinned=False)))  # the mark removed
    assert lookup.pool_for(pod) is None and lookup.marked() == 0
    lookup.deliver("MODIFIED", _records(info))
    lookup.deliver("DELETED", _records(info))
    assert lookup.pool_for(pod) is None and lookup.marked() == 0


def test_a_listing_replaces_what_was_kept() -> None:
    """After a 410 Gone the watch lists again: a mark removed meanwhile is gone."""
    info, other = _mine(), _mine("pool-b")
    lookup = _lookup(lambda n: _reservation_object(info), info)
    lookup.deliver(None, _records(replace(other, holder=replace(other.holder, replica_index=0))))
    assert lookup.pool_for(_worker()) is None and lookup.marked() == 1


def test_two_marked_reservations_of_one_slice_pin_nothing() -> None:
    info = _mine()
    lookup = _lookup(lambda n: _reservation_object(info), info, _mine("pool-b"))
    assert lookup.pool_for(_worker()) is None


def test_before_the_first_listing_a_pod_waits_for_it_a_moment_then_stays_gated() -> None:
    reads: list[str] = []
    info = _mine()
    lookup = PinLookup(lambda n: reads.append(n), clock=lambda: 0.0)
    lookup.deliver("ADDED", _records(info))  # an event cannot come first; still none
    began = time.monotonic()
    assert lookup.pool_for(_worker()) is None and reads == []
    assert time.monotonic() - began >= FIRST_LISTING_WAIT_SECONDS * 0.9


def test_a_pod_admitted_as_the_webhook_starts_is_pinned_once_the_listing_comes() -> None:
    info = _mine()
    lookup = PinLookup(lambda n: _reservation_object(info), clock=lambda: 0.0)
    timer = threading.Timer(0.1, lookup.deliver, (None, _records(info)))
    timer.start()
    try:
        assert lookup.pool_for(_worker()) == "pool-a"
    finally:
        timer.join()


def test_admission_keeps_the_gate_when_the_live_read_fails_or_shows_no_mark() -> None:
    info = _mine()

    def failing(n: str) -> Any:
        raise OSError("connection refused")

    pod = _worker()
    for get in (failing, lambda n: _reservation_object(replace(info, pinned=False))):
        lookup = _lookup(get, info)
        answer = webhook.admission_response(_review(copy.deepcopy(pod)), pin=lookup.pool_for)
        out = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(answer["response"]["patch"])))
        assert c.SCHEDULING_GATE in {g["name"] for g in out["spec"]["schedulingGates"]}
        assert c.NODE_LABEL_NODEPOOL not in (out["spec"].get("nodeSelector") or {})


def _wait(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_follow_lists_watches_from_the_listed_version_and_relists_after_410() -> None:
    info, other = _mine(), _mine("pool-b")
    other = replace(other, holder=replace(other.holder, replica_index=0))

    def page(items: list[object], rv: str) -> FakeResponse:
        return FakeResponse(
            200, json.dumps({"items": items, "metadata": {"resourceVersion": rv}}).encode()
        )

    def event(kind: str, obj: object) -> bytes:
        return json.dumps({"type": kind, "object": obj}).encode()

    api = FakeApi(
        [
            page([_reservation_object(info, "3")], "5"),
            FakeResponse(
                200,
                b"",
                [
                    event("ADDED", _reservation_object(other, "6")),
                    event("BOOKMARK", {"metadata": {"resourceVersion": "7"}}),
                    event("ERROR", {"code": 410, "reason": "Expired", "message": "too old"}),
                ],
            ),
            page([_reservation_object(other, "8")], "8"),  # info's mark went meanwhile
        ]
    )
    kube = Kube(api=api, executor=None)  # type: ignore[arg-type]
    lookup = PinLookup(lambda n: _reservation_object(info))
    stop = lookup.follow(kube)
    try:
        _wait(lambda: len(api.urls) >= 3, "the relist after 410")
        _wait(lambda: lookup.marked() == 1 and lookup.pool_for(_worker()) is None, "relisted")
    finally:
        stop.set()
    assert "watch=1" in api.urls[1] and "resourceVersion=5" in api.urls[1]
    assert "watch" not in api.urls[2]
    # the watch tells the webhook's probes nothing: a failing one only leaves pods gated
    assert "slicereservations" not in kube.health.watch_ages()


def test_follow_stops_when_asked() -> None:
    api = FakeApi([])  # every request fails: the watch retries with backoff
    kube = Kube(api=api, executor=None)  # type: ignore[arg-type]
    lookup = PinLookup(lambda n: None)
    stop = lookup.follow(kube)
    _wait(lambda: len(api.urls) >= 1, "a first list")
    stop.set()
    watchers = [t for t in threading.enumerate() if t.name == "watch-pin-marks"]
    for t in watchers:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in watchers)
    assert lookup.pool_for(_worker()) is None
