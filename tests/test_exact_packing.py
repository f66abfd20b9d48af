"""The exact branch-and-bound packer: optimal on small instances, proofs, partitions, determinism."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from onnxopt.analysis.exact_packing import _partitions, _sections, solve
from onnxopt.analysis.memory_plan import (
    MemoryPlan,
    PlannedBuffer,
    _repair,
    conflicts,
    lower_bound,
    pack,
    verify_plan,
)

Interval = tuple[int, int, int]


def check(buffers: Sequence[Interval], offsets: Sequence[int], capacity: int) -> None:
    """The placement fits ``capacity`` and passes the planner's own verifier."""
    plan = MemoryPlan(
        order=(),
        buffers=tuple(
            PlannedBuffer((f"t{i}",), offset, size, start, end)
            for i, (offset, (size, start, end)) in enumerate(zip(offsets, buffers, strict=True))
        ),
        arena_bytes=capacity,
        lower_bound_bytes=lower_bound(buffers),
        naive_bytes=sum(b[0] for b in buffers),
        alignment=1,
        strategy="test",
        inplace=(),
        unknown=(),
        graph_input_bytes=0,
        initializer_bytes=0,
        graph_output_bytes=0,
    )
    assert verify_plan(plan) == []


def optimum(buffers: Sequence[Interval]) -> int:
    """Brute force: every order, each buffer on top of the highest earlier one it overlaps.

    Every placement can be pushed down until each buffer rests on 0 or on an earlier one (listing
    buffers by offset), so the best of these is the optimum.
    """
    neighbours = conflicts(buffers)
    best = None
    for perm in itertools.permutations(range(len(buffers))):
        offsets: dict[int, int] = {}
        for b in perm:
            offsets[b] = max(
                (offsets[c] + buffers[c][0] for c in neighbours[b] if c in offsets), default=0
            )
        arena = max(offsets[b] + buffers[b][0] for b in offsets)
        best = arena if best is None else min(best, arena)
    assert best is not None
    return best


def test_exact_search_matches_brute_force_on_small_instances():
    rng = random.Random(0)
    for _ in range(120):
        n = rng.randint(2, 6)
        buffers = []
        for _ in range(n):
            start = rng.randint(0, 6)
            buffers.append((rng.choice((64, 128, 192, 320)), start, rng.randint(start, start + 3)))
        best = optimum(buffers)
        found = solve(buffers, best)
        assert found.status == "feasible" and found.offsets is not None
        check(buffers, found.offsets, best)
        assert solve(buffers, best - 64).status == "infeasible"


def test_exact_search_reaches_the_bound_where_greedy_fragments():
    # Greedy by size with best fit needs 576 bytes here; the optimum is the lower bound, 512.
    buffers = [
        (256, 5, 7),
        (64, 3, 3),
        (192, 2, 5),
        (192, 3, 4),
        (128, 0, 2),
        (64, 4, 7),
        (256, 1, 1),
    ]
    found = solve(buffers, 512)
    assert found.status == "feasible" and found.offsets is not None
    check(buffers, found.offsets, 512)
    assert solve(buffers, 448).status == "infeasible"


def test_optimum_above_the_lower_bound_is_proven():
    # At most 5 units live at any step, but no placement fits in 5. Steps 0 and 4 push the 2-unit
    # buffers a and b to an end of the arena, so at step 1 the units u, v1, v2 fill the 3 slots at
    # the other end from a, and at step 3 v1, v2, w the 3 slots away from b. Same 3 slots: u and w
    # share one, but they meet at step 2. Opposite ends: they overlap in one slot, too few for v1, v2.
    x, a, u, m, v, w, b, y = (
        (3, 0, 0),
        (2, 0, 1),
        (1, 1, 2),
        (1, 2, 2),
        (1, 1, 3),
        (1, 2, 3),
        (2, 3, 4),
        (3, 4, 4),
    )
    units = [x, a, u, m, v, v, w, b, y]
    assert lower_bound(units) == 5
    assert solve(units, 5).status == "infeasible"
    found = solve(units, 6)
    assert found.status == "feasible" and found.offsets is not None
    check(units, found.offsets, 6)
    buffers = [(64 * size, start, end) for size, start, end in units]
    packing = pack(buffers)
    assert packing.lower_bound == 320
    assert packing.arena == packing.proven_minimum == 384  # optimal, and proven so
    check(buffers, packing.offsets, packing.arena)


def test_independent_sections_are_solved_separately():
    # Two groups of buffers with no buffer crossing from steps 0-2 to steps 3-5.
    buffers = [(128, 0, 1), (64, 1, 2), (192, 0, 0), (256, 3, 4), (64, 4, 5), (0, 2, 3)]
    points, spans = _sections(buffers)
    groups = _partitions(len(points) - 1, spans, [b[0] for b in buffers])
    assert [sorted(g) for _, _, g in groups] == [[0, 1, 2], [3, 4]]
    found = solve(buffers, lower_bound(buffers))
    assert found.status == "feasible" and found.offsets is not None
    check(buffers, found.offsets, lower_bound(buffers))


def test_search_is_bounded_by_nodes_and_deterministic():
    rng = random.Random(1)
    buffers = []
    for _ in range(300):
        start = rng.randint(0, 400)
        buffers.append((64 * rng.randint(1, 40), start, start + rng.randint(0, 30)))
    bound = lower_bound(buffers)
    tight = solve(buffers, bound, node_limit=50)
    assert tight.status in ("unknown", "infeasible") or tight.nodes <= 50
    first, second = pack(buffers), pack(buffers)
    assert first == second
    assert first.lower_bound == bound <= first.proven_minimum <= first.arena
    check(buffers, first.offsets, first.arena)


def test_fixed_buffers_are_walls_the_others_go_around():
    # Buffer 0 is kept at offset 64; 1 and 2 overlap it in time and must avoid [64, 192).
    buffers = [(128, 0, 3), (64, 0, 1), (128, 2, 3), (64, 4, 5)]
    found = solve(buffers, 320, fixed={0: 64})
    assert found.status == "feasible" and found.offsets is not None
    assert found.offsets[0] == 64
    assert found.offsets[1] == 0 and found.offsets[2] == 192
    check(buffers, found.offsets, 320)
    # Nothing fits below 64 for a 128-byte buffer, and 192 + 128 > 256.
    assert solve(buffers, 256, fixed={0: 64}).status == "infeasible"


def test_window_search_brings_a_greedy_plan_down_to_the_bound():
    rng = random.Random(0)
    buffers = [
        (64 * rng.choice((1, 4, 16)), t, t + rng.randint(0, 12))
        for t in range(120)
        for _ in range(2)
    ]
    greedy = pack(buffers, search_work=0)
    assert greedy.arena > greedy.lower_bound  # 8960 > 8832
    # Windows only, no search over the whole timeline.
    offsets, arena = _repair(
        buffers, conflicts(buffers), greedy.offsets, greedy.lower_bound, greedy.arena, 64, 20_000
    )
    assert offsets is not None and arena == greedy.lower_bound == 8832
    check(buffers, offsets, arena)
    packing = pack(buffers)
    assert packing.arena == 8832
    check(buffers, packing.offsets, packing.arena)
