"""Elastic slice sets (spec.elastic): how a moving slice count is planned and queued.

The Ray autoscaler moves an elastic set's count between its minimum and maximum; every
slice still takes a whole capacity unit. The minimum is what the object cannot run
without, so it is planned like a fixed set: a gang when the spec says so, ranked in its
shape's queue by priority and age. The slices above it are extras the autoscaler asked
for: each is reserved on its own as its pods appear, and in the queue they rank after
every other object's minimum of the same priority, so an elastic set at its maximum
never starves a newcomer's minimum. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuslice.model.records import GangMode

__all__ = ["PlanTerms", "plan_terms"]


@dataclass(frozen=True)
class PlanTerms:
    """What the planner and the queue plan for now: the gang rule, the slices it applies
    to and whether only extras above an elastic minimum are missing."""

    gang: GangMode
    desired: int
    extra: bool = False


def plan_terms(gang: GangMode, desired: int, held: int, minimum: int | None) -> PlanTerms:
    """The terms for an object holding ``held`` live slices that wants ``desired``.

    ``minimum`` None (a fixed set): the spec's gang over every slice. Otherwise, while
    the minimum is not held, the minimum alone (as a gang if ``gang`` says so; the
    extras wait for the next pass); once it is, every wanted slice one by one, ranked as
    extras. A target at or below the minimum is the minimum's terms."""
    if minimum is None:
        return PlanTerms(gang, desired)
    if held < minimum or desired <= minimum:
        return PlanTerms(gang, min(desired, minimum))
    return PlanTerms(GangMode.PER_SLICE, desired, extra=True)
