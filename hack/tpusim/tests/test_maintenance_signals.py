"""GKE's maintenance, termination, Spot and partition signals as fake-node patches."""

from __future__ import annotations

import pytest

from tpusim import maintenance as m
from tpusim.__main__ import main
from tpusim.nodepools import PARTITION_STATE_LABEL, SPOT_LABEL, TPU_TAINT

NOW = 1_800_000_000.0


def test_schedule_sets_epoch_labels_and_drops_a_stale_latest() -> None:
    patch = m.schedule_maintenance(NOW, 3600, 7200)
    assert patch["metadata"]["labels"] == {
        "cloud.google.com/scheduled-maintenance-time": "1800003600",
        "cloud.google.com/scheduled-maintenance-time-latest": "1800007200",
    }
    labels = m.schedule_maintenance(NOW, 60)["metadata"]["labels"]
    assert labels["cloud.google.com/scheduled-maintenance-time-latest"] is None


@pytest.mark.parametrize(
    ("in_s", "latest", "message"),
    [(-1, None, "--in must be"), (m.MAX_NOTICE_S + 1, None, "--in must be"), (600, 60, "before")],
)
def test_schedule_rejects_bad_times(in_s: float, latest: float | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        m.schedule_maintenance(NOW, in_s, latest)


def test_start_keeps_other_taints_and_marks_ongoing() -> None:
    patch = m.start_maintenance([TPU_TAINT])
    assert patch["metadata"]["labels"]["cloud.google.com/active-node-maintenance"] == "ONGOING"
    assert patch["metadata"]["labels"]["cloud.google.com/scheduled-maintenance-time"] is None
    assert patch["spec"]["taints"] == [
        TPU_TAINT,
        {
            "key": "cloud.google.com/maintenance-window-started",
            "value": "true",
            "effect": "NoSchedule",
        },
    ]


def test_start_twice_adds_one_taint_and_clear_removes_it() -> None:
    once = m.start_maintenance([TPU_TAINT])["spec"]["taints"]
    twice = m.start_maintenance(once)["spec"]["taints"]
    assert twice == once
    cleared = m.clear_maintenance(twice)
    assert cleared["spec"]["taints"] == [TPU_TAINT]
    assert set(cleared["metadata"]["labels"].values()) == {None}


def test_terminate_and_clear() -> None:
    tainted = m.terminate([TPU_TAINT])["spec"]["taints"]
    assert tainted[-1] == {
        "key": "cloud.google.com/impending-node-termination",
        "value": "true",
        "effect": "NoSchedule",
    }
    assert m.clear_termination(tainted)["spec"]["taints"] == [TPU_TAINT]


def test_spot_notice_only_on_spot_nodes() -> None:
    assert m.spot_notice({SPOT_LABEL: "true"}, [])["spec"]["taints"][0]["key"] == (
        m.IMPENDING_TERMINATION_TAINT
    )
    with pytest.raises(ValueError, match="needs a Spot node"):
        m.spot_notice({}, [])


def test_partition_state_checks_value_and_node() -> None:
    labels = {PARTITION_STATE_LABEL: "HEALTHY"}
    assert m.partition_state(labels, "UNHEALTHY") == {
        "metadata": {"labels": {PARTITION_STATE_LABEL: "UNHEALTHY"}}
    }
    with pytest.raises(ValueError, match="must be one of"):
        m.partition_state(labels, "BROKEN")
    with pytest.raises(ValueError, match="dynamic-slicing"):
        m.partition_state({}, "UNHEALTHY")


def test_patch_for_names_every_cli_action() -> None:
    from tpusim.__main__ import DISRUPT_HELP

    spot = {SPOT_LABEL: "true", PARTITION_STATE_LABEL: "HEALTHY"}
    for action in DISRUPT_HELP:
        patch = m.patch_for(action, spot, [], now_s=NOW, in_s=60, state="DEGRADED")
        assert patch, action
    with pytest.raises(ValueError, match="unknown action"):
        m.patch_for("reboot", {}, [], now_s=NOW)


def test_cli_parses_every_signal_command() -> None:
    for action in ("schedule-maintenance", "start-maintenance", "terminate", "spot-notice"):
        with pytest.raises(SystemExit) as exc:
            main([action, "--help"])
        assert exc.value.code == 0
    with pytest.raises(SystemExit) as exc:
        main(["partition-state", "n"])  # --state missing
    assert exc.value.code == 2


def test_out_of_service_adds_kubernetes_taint_and_in_service_takes_it_away() -> None:
    tainted = m.patch_for("out-of-service", {}, [TPU_TAINT], now_s=NOW)["spec"]["taints"]
    assert tainted == [
        TPU_TAINT,
        {
            "key": "node.kubernetes.io/out-of-service",
            "value": "nodeshutdown",
            "effect": "NoExecute",
        },
    ]
    assert m.patch_for("in-service", {}, tainted, now_s=NOW)["spec"]["taints"] == [TPU_TAINT]
