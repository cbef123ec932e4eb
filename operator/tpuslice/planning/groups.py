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

from collections.abc import Iterable, Mapping

from tpuslice.model.records import Shape

__all__ = ["claim_order", "next_claim"]


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
