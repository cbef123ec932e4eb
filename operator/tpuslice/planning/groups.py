"""A gang across the TPU groups of one object: the order its shapes are claimed in. Pure.

Each TPU group's slices wait in the queue of their own shape (``planning.queue``), and
with ``spec.reservation.gang`` AllSlices (the default for more than one slice) the
object holds every group's slices or none. A gang over several shapes takes pools in
several queues, and two such gangs that take their shapes in different orders can each
hold the shape the other waits for, for ever (a circular wait; no slice is preempted).

The rule that prevents it is the one that prevents it for locks: every gang claims its
shapes in one global order (``claim_order``: sorted by (accelerator, topology)), and
within a shape claims every pool it misses there at once or none. A gang then waits
only on a shape later than every shape it holds, so no cycle of waits can form; the
gang that waits on the latest shape of all is served, ends, and frees pools
(tests/unit/test_groups_order.py checks it, and that another order can deadlock).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tpuslice.model.records import Shape

__all__ = ["GroupHold", "claim_order", "claims_wait_on", "gang_whole", "next_claim"]


@dataclass(frozen=True)
class GroupHold:
    """One TPU group of a gang across groups, as a pass counts it from the object's
    SliceReservations: the slices it wants now and the pools it holds."""

    group: str
    shape: Shape
    desired: int
    held: int

    @property
    def whole(self) -> bool:
        return self.held >= self.desired


def claim_order(shapes: Iterable[Shape]) -> tuple[Shape, ...]:
    """The shapes of a multi-shape gang in the one order every gang claims them in."""
    return tuple(sorted(set(shapes)))


def next_claim(needs: Mapping[Shape, int], held: Mapping[Shape, int]) -> Shape | None:
    """The shape whose pools a gang claims next: the first in ``claim_order`` where it
    holds fewer than it needs, or None when it holds every group's slices. A gang never
    claims a later shape before an earlier one is whole."""
    for shape in claim_order(needs):
        if held.get(shape, 0) < needs[shape]:
            return shape
    return None


def claims_wait_on(groups: Sequence[GroupHold], group: str) -> GroupHold | None:
    """The earlier group of the gang that ``group`` waits for before it may claim: the
    first group in ``claim_order`` that is not whole, when it comes before ``group``'s
    shape; None when ``group`` may claim now (it is the first not whole, or later ones
    wait for it). The gang holds at most one group per shape (``spec.limits`` refuses
    two Joined groups of one shape), so each shape is one step of ``next_claim``."""
    by_name = {g.group: g for g in groups}
    own = by_name[group]
    first = next_claim(
        {g.shape: g.desired for g in groups}, {g.shape: min(g.held, g.desired) for g in groups}
    )
    if first is None or not first < own.shape:
        return None
    return next(g for g in groups if g.shape == first)


def gang_whole(groups: Sequence[GroupHold]) -> bool:
    """Whether every group of the gang holds all its slices: only then is any group's
    pod released (the object holds every group's slices or none)."""
    return all(g.whole for g in groups)
