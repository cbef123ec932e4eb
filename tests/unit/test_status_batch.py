"""``--status-batch-seconds``: fewer status writes per object on its way to Ready, at the
cost of progress shown later; a condition flip is never held.

The timeline is a large burst's (docs/performance.md): the first pass at 0 s, the slice
claimed when KubeRay's pods come at 146 s, scheduled at 148 s, its pods Ready at 170 s,
KubeRay's RayCluster ready at 365 s. The writer runs on a clock the test moves, so no
test sleeps.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.fake_kube import FakeKube
from tests.unit.test_reconcile import kinds
from tests.unit.test_status import observed
from tpuslice.controller.recorder import Recorder
from tpuslice.controller.statuswriter import (
    FOLD_MAX_SECONDS,
    FOLD_QUIET_SECONDS,
    StatusWriter,
    fold_windows,
)
from tpuslice.main.cli import main
from tpuslice.model import constants as c
from tpuslice.model.records import SliceState
from tpuslice.status.conditions import Observed, compute_status

KEY = (c.KIND_CLUSTER, "ml", "llm")
BODY: dict[str, Any] = {
    "metadata": {"namespace": "ml", "name": "llm", "uid": "u-1", "generation": 3}
}

#: (seconds after the create, what the pass observes), in order
LARGE_BURST: list[tuple[float, Observed]] = [
    (0.0, observed(SliceState.PENDING)),
    (146.0, observed(SliceState.RESERVED)),
    (148.0, observed(SliceState.SCHEDULED)),
    (170.0, observed(SliceState.READY, ray_cluster_ready=False)),
    (365.0, observed(SliceState.READY)),
]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def writer_for(batch_seconds: float) -> tuple[StatusWriter, FakeKube, Clock, list[float]]:
    kube, clock, asked = FakeKube(), Clock(), []
    quiet, at_most = fold_windows(batch_seconds)
    writer = StatusWriter(
        kube,
        Recorder(kube),
        lambda key, seconds: asked.append(clock.now + seconds),
        fold_quiet_seconds=quiet,
        fold_max_seconds=at_most,
        clock=clock,
    )
    return writer, kube, clock, asked


async def one_pass(writer: StatusWriter, seen: Observed) -> None:
    """A pass: the status computed from what the writer last wrote, and handed to it."""
    previous = writer.previous(KEY, BODY)
    status = compute_status(seen, previous, "2026-12-06T00:00:00Z")
    await writer.write_status(BODY, previous, status, seen.slices)


def run_burst(batch_seconds: float) -> tuple[list[float], FakeKube]:
    """Every observed step of ``LARGE_BURST`` in turn, and the passes the writer asked
    for in between (a held write is sent by the pass asked for at its due time); the
    times at which status was written."""
    writer, kube, clock, asked = writer_for(batch_seconds)
    written: list[float] = []

    async def pass_at(at: float, seen: Observed) -> None:
        clock.now = at
        before = kinds(kube).count("status")
        await one_pass(writer, seen)
        written.extend([at] * (kinds(kube).count("status") - before))

    async def scenario() -> None:
        seen = LARGE_BURST[0][1]
        for at, observation in LARGE_BURST:
            for due in sorted(t for t in asked if clock.now < t <= at):
                await pass_at(due, seen)
            seen = observation
            await pass_at(at, seen)

    asyncio.run(scenario())
    return written, kube


def test_the_default_fold_writes_each_step_of_a_slow_burst() -> None:
    written, kube = run_burst(0)
    # each step half a second after it came: five writes, the last one Ready
    assert written == [0.0, 146.5, 148.5, 170.5, 365.0]
    assert kube.status is not None and kube.status["readySlices"] == 1


def test_a_batch_of_a_minute_writes_three_times_on_the_way_to_ready() -> None:
    written, kube = run_burst(60)
    # the first status at once; claim, scheduling and the pods' readiness in one write
    # a minute after the claim; Ready at once
    assert written == [0.0, 206.0, 365.0]
    assert kube.status is not None
    assert {x["type"]: x["status"] for x in kube.status["conditions"]}["Ready"] == "True"
    # the write of 206 s carried the slice's last state, not the first one held
    assert [call for call in kube.calls if call[0] == "event"].count(("event", "SliceReady")) == 1


def test_a_condition_flip_is_written_at_once_with_what_the_batch_held() -> None:
    writer, kube, clock, asked = writer_for(60)

    async def scenario() -> None:
        await one_pass(writer, observed(SliceState.PENDING))
        clock.now = 146.0
        await one_pass(writer, observed(SliceState.SCHEDULED))
        assert kinds(kube).count("status") == 1 and asked == [206.0]  # held, a pass asked for then
        clock.now = 150.0
        await one_pass(writer, observed(SliceState.READY))  # Ready flips: not held
        assert kinds(kube).count("status") == 2
        assert kube.status is not None and kube.status["slices"][0]["state"] == "Ready"
        clock.now = 206.0
        await one_pass(writer, observed(SliceState.READY))  # nothing left to write
        assert kinds(kube).count("status") == 2

    asyncio.run(scenario())


def test_a_lost_unit_is_never_held() -> None:
    writer, kube, clock, _ = writer_for(60)

    async def scenario() -> None:
        await one_pass(writer, observed(SliceState.PENDING))
        clock.now = 100.0
        await one_pass(writer, observed(SliceState.READY, ray_cluster_ready=False))
        clock.now = 161.0
        await one_pass(writer, observed(SliceState.READY, ray_cluster_ready=False))
        assert kinds(kube).count("status") == 2
        clock.now = 170.0
        await one_pass(writer, observed(SliceState.PENDING))  # SlicesReserved turns False
        assert kinds(kube).count("status") == 3

    asyncio.run(scenario())


def test_fold_windows() -> None:
    assert fold_windows(0) == (FOLD_QUIET_SECONDS, FOLD_MAX_SECONDS)
    assert fold_windows(60) == (60.0, 60.0)


def test_the_flag_reaches_the_config_and_is_bounded(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tpuslice.main.app

    seen: list[Any] = []
    monkeypatch.setattr(tpuslice.main.app, "run_operator", seen.append)
    assert main(["run"]) == 0 and seen[0].status_batch_seconds == 0
    assert main(["run", "--status-batch-seconds=60"]) == 0 and seen[1].status_batch_seconds == 60
    for bad in ("301", "-1", "0.5"):
        with pytest.raises(SystemExit):
            main(["run", f"--status-batch-seconds={bad}"])
    assert "--status-batch-seconds" in capsys.readouterr().err


def test_the_reconciler_takes_the_setting() -> None:
    from tpuslice.controller.reconciler import Reconciler

    def read(key: Any) -> Any:
        raise AssertionError("no pass in this test")

    assert Reconciler(FakeKube(), read, status_batch_seconds=60).status.fold_max_seconds == 60.0
    assert Reconciler(FakeKube(), read).status.fold_quiet_seconds == FOLD_QUIET_SECONDS
