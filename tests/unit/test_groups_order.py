"""The claim order of gangs over several shapes: property tests in a small world.

Node pools of a few shapes; gangs that each need some pools of some shapes (never more
of a shape than exist). A gang's step claims, in the shape ``next_claim`` names, every
pool it misses there at once or none; a gang that holds all it needs runs and then
frees its pools (running slices are never preempted, so nothing else frees them). The
steps come in any order. Claimed in the global order, every gang ends; claimed in
another order, some schedules leave gangs waiting on each other for ever.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from hypothesis import find, given, settings
from hypothesis import strategies as st

from tpuslice.model.records import Shape
from tpuslice.planning.groups import (
    GroupHold,
    claim_order,
    claims_wait_on,
    gang_whole,
    next_claim,
)

SHAPES: tuple[Shape, ...] = (
    ("tpu-v5-lite-podslice", "2x4"),
    ("tpu-v6e-slice", "4x4"),
    ("tpu-v6e-slice", "8x8"),
)

NextClaim = Callable[[Mapping[Shape, int], Mapping[Shape, int]], Shape | None]


def reverse_claim(needs: Mapping[Shape, int], held: Mapping[Shape, int]) -> Shape | None:
    """The wrong rule: the global order backwards."""
    for shape in reversed(claim_order(needs)):
        if held.get(shape, 0) < needs[shape]:
            return shape
    return None


def run(
    capacity: Mapping[Shape, int],
    gangs: Sequence[Mapping[Shape, int]],
    schedule: Sequence[int],
    rule: Callable[[int], NextClaim],
) -> list[bool]:
    """Which gangs ended: ``schedule`` steps first, then round robin until nothing moves."""
    free = dict(capacity)
    held: list[dict[Shape, int]] = [{} for _ in gangs]
    done = [False] * len(gangs)

    def step(g: int) -> bool:
        if done[g]:
            return False
        shape = rule(g)(gangs[g], held[g])
        if shape is None:  # whole: it runs, ends and frees its pools
            for s, n in held[g].items():
                free[s] += n
            done[g] = True
            return True
        missing = gangs[g][shape] - held[g].get(shape, 0)
        if free[shape] < missing:
            return False  # waits, holding what it has
        free[shape] -= missing
        held[g][shape] = gangs[g][shape]
        return True

    for g in schedule:
        step(g % len(gangs))
    while any(step(g) for g in range(len(gangs))):
        pass
    return done


@st.composite
def worlds(draw: st.DrawFn) -> tuple[dict[Shape, int], list[dict[Shape, int]], list[int]]:
    capacity = {s: draw(st.integers(1, 3)) for s in SHAPES}
    gangs = [
        {
            s: draw(st.integers(1, capacity[s]))
            for s in draw(st.sets(st.sampled_from(SHAPES), min_size=1))
        }
        for _ in range(draw(st.integers(2, 4)))
    ]
    schedule = draw(st.lists(st.integers(0, 3), max_size=40))
    return capacity, gangs, schedule


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_gangs_claiming_in_the_global_order_all_end(
    world: tuple[dict[Shape, int], list[dict[Shape, int]], list[int]],
) -> None:
    capacity, gangs, schedule = world
    assert all(run(capacity, gangs, schedule, lambda g: next_claim))


def test_the_world_finds_a_deadlock_when_gangs_claim_in_different_orders() -> None:
    """The same world, half the gangs claiming backwards: some schedule deadlocks, so the
    property above is one that can fail."""

    def mixed(g: int) -> NextClaim:
        return next_claim if g % 2 == 0 else reverse_claim

    capacity, gangs, schedule = find(
        worlds(),
        lambda w: not all(run(w[0], w[1], w[2], mixed)),
        settings=settings(max_examples=2000, database=None),
    )
    assert not all(run(capacity, gangs, schedule, mixed))


def test_another_order_can_deadlock() -> None:
    """Two gangs over the same two shapes, one pool each: each takes one shape, then
    waits for the other's. The test's world can fail, so the property above means something."""
    capacity = {SHAPES[0]: 1, SHAPES[1]: 1}
    gangs = [{SHAPES[0]: 1, SHAPES[1]: 1}, {SHAPES[0]: 1, SHAPES[1]: 1}]

    def mixed(g: int) -> NextClaim:
        return next_claim if g == 0 else reverse_claim

    # gang 0 claims in order, gang 1 backwards: each takes its first shape
    free = dict(capacity)
    held: list[dict[Shape, int]] = [{}, {}]
    for g in (0, 1):
        shape = mixed(g)(gangs[g], held[g])
        assert shape is not None
        free[shape] -= 1
        held[g][shape] = 1
    assert [mixed(g)(gangs[g], held[g]) for g in (0, 1)] == [SHAPES[1], SHAPES[0]]
    assert free == {SHAPES[0]: 0, SHAPES[1]: 0}  # each waits on what the other holds
    # in the global order the same first steps cannot split the shapes between them
    assert run(capacity, gangs, [0, 1], lambda g: next_claim) == [True, True]


def test_claim_order_is_one_order_whatever_the_groups_order() -> None:
    assert claim_order(reversed(SHAPES)) == claim_order(SHAPES) == SHAPES
    assert claim_order([SHAPES[1], SHAPES[1]]) == (SHAPES[1],)


def test_next_claim_finishes_a_shape_before_the_next() -> None:
    needs = {SHAPES[2]: 1, SHAPES[0]: 2}
    assert next_claim(needs, {}) == SHAPES[0]
    assert next_claim(needs, {SHAPES[0]: 1}) == SHAPES[0]
    assert next_claim(needs, {SHAPES[0]: 2}) == SHAPES[2]
    assert next_claim(needs, {SHAPES[0]: 2, SHAPES[2]: 1}) is None


@st.composite
def gang_holds(draw: st.DrawFn) -> list[GroupHold]:
    shapes = draw(st.lists(st.sampled_from(SHAPES), min_size=1, unique=True))
    out = []
    for i, shape in enumerate(shapes):
        desired = draw(st.integers(0, 3))
        out.append(GroupHold(f"g{i}", shape, desired, draw(st.integers(0, 3))))
    return out


@settings(max_examples=300, deadline=None)
@given(gang_holds())
def test_a_group_may_claim_only_when_every_earlier_shape_is_whole(holds: list[GroupHold]) -> None:
    """What the pass asks per group agrees with ``next_claim``: a group may claim exactly
    when every group of an earlier shape holds all its slices; the group it waits for
    is the first short one; the gang is whole exactly when no group waits and none is short."""
    for group in holds:
        earlier = [g for g in holds if g.shape < group.shape]
        waits = claims_wait_on(holds, group.group)
        assert (waits is None) == all(g.whole for g in earlier)
        if waits is not None:
            assert waits == min((g for g in earlier if not g.whole), key=lambda g: g.shape)
    assert gang_whole(holds) == (
        next_claim({g.shape: g.desired for g in holds}, {g.shape: g.held for g in holds}) is None
    )
