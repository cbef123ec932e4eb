"""``reservation.policy: None`` pins its own pools, but never onto capacity that a
SliceReservation holds for someone else's slice."""

from __future__ import annotations

from typing import Any

from tests.support.builders import holder, nodes_of
from tests.support.fake_kube import FakeKube
from tests.unit.test_reconcile import cluster_body, conditions_of, kinds, make, run
from tpuslice.model.records import ReservationInfo, Snapshot

HELD = ReservationInfo("pool-a", holder("tpu-zzzzz", name="other", uid="uid-other"))


def ungated(selector: dict[str, str]) -> dict[str, Any]:
    return cluster_body(
        reservation={"policy": "None"},
        worker={"template": {"spec": {"nodeSelector": selector}}},
    )


def test_pinning_onto_a_held_pool_is_refused_naming_the_field_and_the_holder() -> None:
    kube = FakeKube()
    snap = Snapshot(
        ungated({"cloud.google.com/gke-nodepool": "pool-a"}), [], nodes_of("pool-a"), [HELD], None
    )
    run(make(kube, snap))
    assert "apply" not in kinds(kube)
    status, reason, message = conditions_of(kube.status)["Stalled"]
    assert (status, reason) == ("True", "PinnedToHeldCapacity")
    assert "spec.worker.template.spec.nodeSelector" in message and "ml/other" in message


def test_pinning_onto_a_free_pool_is_applied() -> None:
    kube = FakeKube()
    snap = Snapshot(
        ungated({"cloud.google.com/gke-nodepool": "pool-b"}), [], nodes_of("pool-b"), [HELD], None
    )
    run(make(kube, snap))
    assert "apply" in kinds(kube)
