"""Every line a pass logs names its object; lines outside a pass are left as they are."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.support.builders import nodes_of
from tests.support.fake_kube import FakeKube
from tests.unit.test_reconcile import cluster_body, make, pods, run
from tpuslice.model.records import Snapshot
from tpuslice.runtime.logcontext import ObjectPrefix, current_object


def test_a_pass_names_its_object_in_every_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.handler.addFilter(ObjectPrefix())
    kube = FakeKube()
    reconciler = make(kube, Snapshot(cluster_body(), pods(), nodes_of("pool-a"), [], None))
    with caplog.at_level(logging.DEBUG, logger="tpuslice"):
        run(reconciler)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("tpuslice")]
    assert lines, "the pass logged nothing to check"
    assert all(line.startswith("[TPUSliceCluster/ml/llm] ") for line in lines), lines
    assert current_object.get() == ""  # reset after the pass


def test_a_line_outside_a_pass_is_unchanged() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    assert ObjectPrefix().filter(record) and record.getMessage() == "hello"

    async def inside() -> str:
        current_object.set("TPUSliceJob/ns/a")
        ObjectPrefix().filter(record)
        ObjectPrefix().filter(record)  # a second handler: prefixed once
        return record.getMessage()

    assert asyncio.run(inside()) == "[TPUSliceJob/ns/a] hello"
