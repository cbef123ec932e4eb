"""A reservation delete names the uid of the reservation it means: the pool's new
reservation (another claim made since) is never deleted, neither by the API server
(``Kube`` sends the uid precondition) nor by the fake the other unit tests run on."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.support.fake_kube import FakeKube
from tpuslice.model.records import Holder, ReservationInfo
from tpuslice.runtime.kube import ApiError, Kube

HOLDER = Holder("ml", "train", "uid-train", "tpu-aaaaa", 0)


def test_the_fake_refuses_a_delete_with_a_stale_uid_and_keeps_the_reservation() -> None:
    current = ReservationInfo("pool-a", HOLDER, "Reserved", uid="uid-new")
    kube = FakeKube(taken={"pool-a": current})
    assert asyncio.run(kube.delete_reservation("pool-a", "uid-old")) is False
    assert kube.taken["pool-a"] == current
    assert kube.conflicts == [("free", "pool-a")]
    assert asyncio.run(kube.delete_reservation("pool-a", "uid-new")) is True
    assert "pool-a" not in kube.taken


def _kube(answer: Any) -> tuple[Kube, list[dict[str, Any]]]:
    kube = Kube(api=None, executor=ThreadPoolExecutor(1))
    sent: list[dict[str, Any]] = []

    def fake_request(method: str, path: str, query: Any, body: Any, *_: Any) -> Any:
        sent.append({"method": method, "path": path, "body": body})
        if isinstance(answer, Exception):
            raise answer
        return answer

    kube.request = fake_request  # type: ignore[method-assign]
    return kube, sent


def test_kube_sends_the_uid_precondition_and_reads_409_as_not_deleted() -> None:
    kube, sent = _kube(ApiError(409, "Conflict", "Precondition failed: UID in precondition"))
    assert asyncio.run(kube.delete_reservation("pool-a", "uid-old")) is False
    assert sent[0]["method"] == "DELETE"
    assert sent[0]["body"]["preconditions"] == {"uid": "uid-old"}


def test_kube_logs_one_debug_line_per_write(caplog: pytest.LogCaptureFixture) -> None:
    kube, _ = _kube({"metadata": {"name": "pool-a"}})
    with caplog.at_level(logging.DEBUG, logger="tpuslice.runtime.kube"):
        asyncio.run(kube.delete_reservation("pool-a", "uid-a"))
        asyncio.run(kube.get_reservation("pool-a"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["DELETE slicereservations pool-a: ok"]
