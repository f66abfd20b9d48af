"""Static memory plan: one arena, an offset per buffer, no overlap among buffers live at once.

Packing buffers with fixed lifetimes into the smallest arena is dynamic storage allocation
(NP-hard). The lower bound is the largest total of buffers live at one step. We run several
greedy placements (by size with best fit, the usual baseline; first fit; by area; by duration; by
breadth; in time order) and keep the smallest arena; when that is still above the bound, a short
seeded local search perturbs the best placement order. Every plan is re-checked by
:func:`verify_plan`.
"""

from __future__ import annotations

import bisect
import heapq
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx_ir as ir

from onnxopt.analysis.memory import (
    DEFAULT_ALIGNMENT,
    Dataflow,
    TensorSizes,
    build_dataflow,
    node_label,
    simulate,
    without_gc,
)

Interval = tuple[int, int, int]  # (size, first step, last step)


@dataclass(frozen=True)
class Packing:
    offsets: tuple[int, ...]
    arena: int
    lower_bound: int
    strategy: str
    # The smallest arena any placement can have, as far as we proved: ``lower_bound``, or more
    # when the exact search exhausted a smaller capacity.
    proven_minimum: int = 0


def lower_bound(buffers: Sequence[Interval]) -> int:
    """Largest total size of buffers live at one step (the max-weight clique of intervals)."""
    events: dict[int, int] = {}
    for size, start, end in buffers:
        events[start] = events.get(start, 0) + size
        events[end + 1] = events.get(end + 1, 0) - size
    best = running = 0
    for step in sorted(events):
        running += events[step]
        best = max(best, running)
    return best


def conflicts(buffers: Sequence[Interval]) -> list[list[int]]:
    """For each buffer, the buffers whose lifetimes overlap it (sweep, O(n log n + pairs))."""
    out: list[list[int]] = [[] for _ in buffers]
    by_start = sorted(range(len(buffers)), key=lambda i: (buffers[i][1], i))
    active: list[tuple[int, int]] = []  # heap of (end, id)
    live: set[int] = set()
    for i in by_start:
        start = buffers[i][1]
        while active and active[0][0] < start:
            live.discard(heapq.heappop(active)[1])
        if buffers[i][0] > 0:
            for j in live:
                out[i].append(j)
                out[j].append(i)
            live.add(i)
            heapq.heappush(active, (buffers[i][2], i))
    return out


def _place(
    order: Sequence[int], sizes: Sequence[int], neighbours: Sequence[Sequence[int]], best_fit: bool
) -> tuple[list[int], int]:
    offsets = [-1] * len(sizes)
    ends = [0] * len(sizes)  # offset + size of each placed buffer
    arena = 0
    for b in order:
        size = sizes[b]
        if size == 0:
            offsets[b] = 0
            continue
        # (the hot loop of every plan: a list sorted in place with the ends kept took about a
        # fifth less time than a generator sorted into a new list, the sums made again)
        taken = [(offsets[c], ends[c]) for c in neighbours[b] if offsets[c] >= 0]
        if not taken:
            offsets[b], ends[b] = 0, size
            arena = max(arena, size)
            continue
        taken.sort()
        cursor = 0
        chosen = -1
        chosen_gap = -1
        for lo, hi in taken:
            gap = lo - cursor
            if gap >= size:
                if not best_fit:
                    chosen = cursor
                    break
                if chosen < 0 or gap < chosen_gap:
                    chosen, chosen_gap = cursor, gap
            if hi > cursor:
                cursor = hi
        if chosen < 0:
            chosen = cursor
        offsets[b], ends[b] = chosen, chosen + size
        arena = max(arena, chosen + size)
    return offsets, arena


def _breadth_order(buffers: Sequence[Interval]) -> list[int]:
    """TFLite's greedy-by-breadth: the fullest steps first, their buffers largest first."""
    steps = max((e for _, _, e in buffers), default=-1) + 1
    live: list[list[int]] = [[] for _ in range(steps)]
    total = [0] * steps
    for i, (size, s, e) in enumerate(buffers):
        if e - s > 64:  # long-lived buffers: only their ends (keeps this linear)
            for p in (s, e):
                live[p].append(i)
        else:
            for p in range(s, e + 1):
                live[p].append(i)
        for p in (s, e):
            total[p] += size
    seen: set[int] = set()
    order: list[int] = []
    for p in sorted(range(steps), key=lambda p: (-total[p], p)):
        for i in sorted(live[p], key=lambda i: (-buffers[i][0], i)):
            if i not in seen:
                seen.add(i)
                order.append(i)
    order.extend(i for i in range(len(buffers)) if i not in seen)
    return order


def _orders(buffers: Sequence[Interval]) -> Iterator[tuple[str, list[int], bool]]:
    """Placement orders to try, cheapest and usually best first (made lazily: we stop at the bound)."""
    ids = range(len(buffers))

    def by(key: Callable[[int], Any]) -> list[int]:
        return sorted(ids, key=key)

    size = [b[0] for b in buffers]
    dur = [b[2] - b[1] + 1 for b in buffers]
    start = [b[1] for b in buffers]
    yield "size/best-fit", by(lambda i: (-size[i], start[i], i)), True
    # Long-lived buffers (e.g. weights made at the start) stacked by when they die, latest at the
    # bottom, so those still alive are always contiguous; the rest by size above and between them.
    steps = max((b[2] for b in buffers), default=0) + 1
    long_lived = [d > steps / 8 for d in dur]
    yield (
        "long-lived stack/best-fit",
        by(
            lambda i: (
                (0, -buffers[i][2], start[i], i) if long_lived[i] else (1, -size[i], start[i], i)
            )
        ),
        True,
    )
    yield "area/best-fit", by(lambda i: (-size[i] * dur[i], i)), True
    yield "size,duration/best-fit", by(lambda i: (-size[i], -dur[i], i)), True
    yield "size/first-fit", by(lambda i: (-size[i], start[i], i)), False
    yield "duration/best-fit", by(lambda i: (-dur[i], -size[i], i)), True
    yield "breadth/best-fit", _breadth_order(buffers), True
    yield "time/best-fit", by(lambda i: (start[i], -size[i], i)), True


@without_gc
def pack(
    buffers: Sequence[Interval],
    alignment: int = DEFAULT_ALIGNMENT,
    *,
    search_seconds: float = 30.0,
    search_work: int = 4_000_000,
    seed: int = 0,
    exact_nodes: int | None = None,
) -> Packing:
    """Offsets for ``buffers`` (sizes already multiples of ``alignment``) in the smallest arena found.

    Greedy placements first. Above the lower bound: the exact branch and bound of
    :mod:`onnxopt.analysis.exact_packing` at capacities up to 1% above it (``exact_nodes`` search
    nodes, default ``search_work // 200`` capped by the problem size, since a node costs time
    linear in it); then the same search window by window around what sticks out of the greedy
    plan (``search_work // 200`` nodes); then the seeded local search. ``exact_nodes=0`` turns
    both exact searches off. All bounded by work counters, so results are reproducible.
    """
    if exact_nodes is None:
        exact_nodes = min(search_work // 200, 20_000_000 // max(len(buffers), 1))
    window_nodes = search_work // 200 if exact_nodes else 0
    bound = lower_bound(buffers)
    neighbours = conflicts(buffers)
    sizes = [b[0] for b in buffers]
    best: tuple[int, list[int], str, list[int], bool] | None = None
    for name, order, best_fit in _orders(buffers):
        offsets, arena = _place(order, sizes, neighbours, best_fit)
        if best is None or arena < best[0]:
            best = (arena, offsets, name, order, best_fit)
        if arena <= bound:
            break
    assert best is not None
    arena, offsets, name, order, best_fit = best
    proven = bound
    if arena > bound and exact_nodes > 0 and len(buffers) <= EXACT_MAX_BUFFERS:
        exact, exact_arena, proven = _exact(
            buffers, neighbours, bound, arena, alignment, exact_nodes
        )
        if exact is not None:
            offsets, arena, name = exact, exact_arena, "exact"
    # Windows only to reach the 1% target: past it, what they could still gain costs too much.
    if arena > int(bound * (1 + EXACT_SLACKS[-1])) and window_nodes > 0:
        repaired, repaired_arena = _repair(
            buffers, neighbours, offsets, bound, arena, alignment, window_nodes
        )
        if repaired is not None:
            offsets, arena, name = repaired, repaired_arena, f"{name}+exact windows"
    if arena > bound and search_seconds > 0 and buffers:
        # Deterministic: a fixed number of seeded tries (scaled to the problem); the clock is only a safety cap.
        work = len(buffers) + sum(map(len, neighbours))
        tries = max(0, min(5000, search_work // max(work, 1)))
        arena, offsets, improved = _local_search(
            order, offsets, best_fit, sizes, neighbours, arena, bound, tries, search_seconds, seed
        )
        if improved:
            name += "+search"
    return Packing(tuple(offsets), arena, bound, name, proven)


def _capacities(bound: int, step: int) -> list[int]:
    """The capacities the exact searches try: EXACT_SLACKS above ``bound``, aligned down."""
    return sorted({int(bound * (1 + slack)) // step * step for slack in EXACT_SLACKS})


def _arena(offsets: Sequence[int], buffers: Sequence[Interval]) -> int:
    """The arena a placement uses: the highest end of a buffer."""
    return max((o + b[0] for o, b in zip(offsets, buffers, strict=True)), default=0)


def _repair(
    buffers: Sequence[Interval],
    neighbours: Sequence[Sequence[int]],
    offsets: Sequence[int],
    bound: int,
    arena: int,
    alignment: int,
    nodes: int,
) -> tuple[list[int] | None, int]:
    """Bring a placement under a capacity just above ``bound`` one time window at a time.

    Where buffers stick out above the capacity, the buffers live in a window of steps around them
    are placed again by the exact search, around the others (kept where they are); the window
    doubles while the search fails, within the node budget. Returns the first capacity's plan
    that fits everywhere (or None) and its arena.
    """
    from onnxopt.analysis.exact_packing import solve

    step = max(alignment, 1)
    capacities = _capacities(bound, step)
    by_start = sorted(range(len(buffers)), key=lambda i: buffers[i][1])
    starts = [buffers[i][1] for i in by_start]
    last = max((e for _, _, e in buffers), default=0)
    for capacity in capacities:
        if capacity >= arena:
            break
        budget = nodes // len(EXACT_SLACKS)
        current = list(offsets)
        while budget > 0:
            over = [i for i, (size, _, _) in enumerate(buffers) if current[i] + size > capacity]
            if not over:
                return current, _arena(current, buffers)
            hot = min(over, key=lambda i: (buffers[i][1], i))
            lo, hi = buffers[hot][1], buffers[hot][2]
            margin = max(hi - lo, 4)
            while budget > 0:
                a, b = lo - margin, hi + margin
                # The window's buffers: those starting by b that end at a or later.
                free = {i for i in by_start[: bisect.bisect_right(starts, b)] if buffers[i][2] >= a}
                fixed = {i: current[i] for i in range(len(buffers)) if i not in free}
                result = solve(
                    buffers,
                    capacity,
                    node_limit=min(budget, WINDOW_NODES),
                    neighbours=neighbours,
                    fixed=fixed,
                )
                budget -= max(result.nodes, 1)
                if result.status == "feasible" and result.offsets is not None:
                    current = list(result.offsets)
                    break
                if a <= 0 and b >= last:  # the whole timeline: no larger window to try
                    budget = 0
                margin *= 2
    return None, arena


# Node budget of one window's exact search.
WINDOW_NODES = 2_000

# Capacities the exact search tries, as fractions above the lower bound (the target is 1%).
EXACT_SLACKS = (0.0, 0.005, 0.0099)
# Beyond this many buffers a search node costs too much in Python; greedy and local search only.
EXACT_MAX_BUFFERS = 4_000


def _exact(
    buffers: Sequence[Interval],
    neighbours: Sequence[Sequence[int]],
    bound: int,
    arena: int,
    alignment: int,
    nodes: int,
) -> tuple[list[int] | None, int, int]:
    """Branch and bound at capacities just above ``bound`` (below ``arena``), smallest first.

    Returns the offsets and arena of the first capacity that fits (or None), and the proven
    minimum arena (capacities the search exhausted are too small).
    """
    from onnxopt.analysis.exact_packing import solve

    step = max(alignment, 1)
    capacities = _capacities(bound, step)
    capacities = [c for c in capacities if bound <= c < arena]
    proven = bound
    per_try = max(nodes // len(EXACT_SLACKS), 1)
    for capacity in capacities:
        result = solve(buffers, capacity, node_limit=per_try, neighbours=neighbours)
        if result.status == "infeasible":  # arenas are multiples of the alignment
            proven = max(proven, capacity + step)
        elif result.status == "feasible" and result.offsets is not None:
            offsets = list(result.offsets)
            return offsets, _arena(offsets, buffers), proven
    return None, arena, proven


def _local_search(
    order: list[int],
    offsets: list[int],
    best_fit: bool,
    sizes: Sequence[int],
    neighbours: Sequence[Sequence[int]],
    arena: int,
    bound: int,
    tries: int,
    seconds: float,
    seed: int,
) -> tuple[int, list[int], bool]:
    """Seeded search over placement orders; returns the best (arena, offsets) and whether it improved.

    Each try either restarts from the size order with sizes jittered by up to 30% (a multistart
    that breaks the ties and near-ties greedy-by-size gets wrong), or moves a buffer that touches
    the arena's top earlier in the best order so far. Improvements (and equal arenas, to drift
    across plateaus) are kept.
    """
    rng = random.Random(seed)
    deadline = time.perf_counter() + seconds
    best_order, best_offsets, best_arena, best_mode = list(order), list(offsets), arena, best_fit
    improved = False
    ids = range(len(sizes))
    for _ in range(tries):
        if best_arena <= bound or time.perf_counter() > deadline:
            break
        if rng.random() < 0.5:
            noise = [rng.uniform(0.7, 1.3) for _ in ids]
            candidate = sorted(ids, key=lambda i: (-sizes[i] * noise[i], i))
            mode = rng.random() < 0.5
        else:
            candidate = list(best_order)
            mode = best_mode
            top = [b for b in candidate if best_offsets[b] + sizes[b] == best_arena]
            b = rng.choice(top) if top and rng.random() < 0.7 else rng.randrange(len(candidate))
            i = candidate.index(b)
            candidate.insert(rng.randrange(0, i + 1), candidate.pop(i))
        new_offsets, new_arena = _place(candidate, sizes, neighbours, mode)
        if new_arena <= best_arena:
            improved |= new_arena < best_arena
            best_order, best_offsets, best_arena, best_mode = (
                candidate,
                new_offsets,
                new_arena,
                mode,
            )
    return best_arena, best_offsets, improved


# ----------------------------------------------------------------------------------------------
# Plans of graphs


@dataclass(frozen=True)
class PlannedBuffer:
    tensors: tuple[str, ...]
    offset: int
    size: int
    start: int
    end: int


@dataclass(frozen=True)
class MemoryPlan:
    """Arena offsets and lifetimes (steps index ``order``) for one graph's intermediates."""

    order: tuple[str, ...]
    buffers: tuple[PlannedBuffer, ...]
    arena_bytes: int
    lower_bound_bytes: int
    naive_bytes: int
    alignment: int
    strategy: str
    inplace: tuple[tuple[str, str], ...]
    unknown: tuple[str, ...]
    graph_input_bytes: int
    initializer_bytes: int
    graph_output_bytes: int
    # Smallest arena any placement of these buffers can have, as far as the planner proved
    # (the lower bound, or more when the exact search exhausted smaller capacities).
    proven_minimum_bytes: int = 0

    @property
    def gap(self) -> float:
        """planned / lower bound - 1."""
        return self.arena_bytes / self.lower_bound_bytes - 1 if self.lower_bound_bytes else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "arena_bytes": self.arena_bytes,
            "lower_bound_bytes": self.lower_bound_bytes,
            "naive_bytes": self.naive_bytes,
            "gap": round(self.gap, 6),
            "proven_minimum_bytes": self.proven_minimum_bytes,
            "alignment": self.alignment,
            "strategy": self.strategy,
            "graph_input_bytes": self.graph_input_bytes,
            "initializer_bytes": self.initializer_bytes,
            "graph_output_bytes": self.graph_output_bytes,
            "unknown_size": list(self.unknown),
            "order": list(self.order),
            "buffers": [
                {
                    "offset": b.offset,
                    "size": b.size,
                    "first_step": b.start,
                    "last_step": b.end,
                    "tensors": list(b.tensors),
                }
                for b in self.buffers
            ],
            "in_place": [{"output": o, "input": i} for o, i in self.inplace],
        }


@without_gc
def plan_flow(
    flow: Dataflow,
    order: Sequence[int] | None = None,
    *,
    inplace: bool = True,
    alignment: int = DEFAULT_ALIGNMENT,
    search_seconds: float = 30.0,
    search_work: int = 4_000_000,
    exact_nodes: int | None = None,
) -> MemoryPlan:
    order = list(range(len(flow.nodes))) if order is None else list(order)
    sim = simulate(flow, order, inplace=inplace)
    intervals: list[Interval] = [(b.size, b.start, b.end) for b in sim.buffers]
    labels: list[tuple[str, ...]] = [tuple(flow.names[m] for m in b.members) for b in sim.buffers]
    for p, i in enumerate(order):
        if flow.workspace[i]:
            intervals.append((flow.workspace[i], p, p))
            labels.append((f"<subgraphs of {node_label(flow.nodes[i], i)}>",))
    packing = pack(
        intervals,
        alignment,
        search_seconds=search_seconds,
        search_work=search_work,
        exact_nodes=exact_nodes,
    )
    buffers = tuple(
        PlannedBuffer(label, offset, size, start, end)
        for label, offset, (size, start, end) in zip(
            labels, packing.offsets, intervals, strict=True
        )
    )
    return MemoryPlan(
        order=tuple(node_label(flow.nodes[i], i) for i in order),
        buffers=buffers,
        arena_bytes=packing.arena,
        lower_bound_bytes=packing.lower_bound,
        naive_bytes=flow.naive_bytes,
        alignment=alignment,
        strategy=packing.strategy,
        inplace=tuple((flow.names[o], flow.names[s]) for o, s in sim.inplace),
        unknown=tuple(flow.unknown),
        graph_input_bytes=flow.graph_input_bytes,
        initializer_bytes=flow.initializer_bytes,
        graph_output_bytes=flow.graph_output_bytes,
        proven_minimum_bytes=packing.proven_minimum,
    )


def plan_memory(
    graph: ir.Graph,
    sizes: TensorSizes | None = None,
    *,
    order: Sequence[ir.Node] | None = None,
    inplace: bool = True,
    alignment: int = DEFAULT_ALIGNMENT,
    search_seconds: float = 30.0,
) -> MemoryPlan:
    """Plan ``graph``'s intermediates in one arena for ``order`` (default: the graph's order).

    ``sizes`` default to the shapes already on the graph (see :func:`live_ranges`).
    """
    if sizes is None:
        from onnxopt.analysis.memory import sizes_from_shapes

        sizes = sizes_from_shapes(graph)
    flow = build_dataflow(graph, sizes, order=order, alignment=alignment, inplace=inplace)
    return plan_flow(flow, inplace=inplace, alignment=alignment, search_seconds=search_seconds)


def verify_plan(plan: MemoryPlan) -> list[str]:
    """Problems with ``plan``: misaligned or out-of-arena buffers, overlaps of buffers live at once."""
    problems: list[str] = []
    for b in plan.buffers:
        where = ", ".join(b.tensors[:2])
        if b.offset < 0 or b.offset + b.size > plan.arena_bytes:
            problems.append(
                f"buffer of {where} [{b.offset}, {b.offset + b.size}) does not fit the {plan.arena_bytes}-byte arena"
            )
        if plan.alignment > 1 and b.offset % plan.alignment:
            problems.append(
                f"buffer of {where} at offset {b.offset} is not {plan.alignment}-byte aligned"
            )
        if b.start > b.end:
            problems.append(
                f"buffer of {where} ends (step {b.end}) before it starts (step {b.start})"
            )
    by_start = sorted(range(len(plan.buffers)), key=lambda i: plan.buffers[i].start)
    active: list[int] = []
    for i in by_start:
        b = plan.buffers[i]
        if b.size == 0:
            continue
        active = [j for j in active if plan.buffers[j].end >= b.start]
        for j in active:
            c = plan.buffers[j]
            if b.offset < c.offset + c.size and c.offset < b.offset + b.size:
                problems.append(
                    f"buffers of {', '.join(b.tensors[:2])} and {', '.join(c.tensors[:2])} overlap in memory "
                    f"while both live (steps {max(b.start, c.start)}..{min(b.end, c.end)})"
                )
        active.append(i)
    return problems


# ----------------------------------------------------------------------------------------------
# The optimize report's memory section


@dataclass(frozen=True)
class MemoryFigures:
    label: str
    naive_bytes: int
    lower_bound_bytes: int
    planned_bytes: int
    gap: float  # planned / lower bound - 1


@dataclass(frozen=True)
class MemoryReport:
    """Activation memory of the input and optimized models (main graph, sizes aligned)."""

    rows: tuple[MemoryFigures, ...]
    reduction: float  # 1 - optimized lower bound / input order's lower bound without reuse
    unknown: tuple[str, ...]
    assumed_dims: tuple[str, ...]
    default_dim: int


def _figures(label: str, plan: MemoryPlan) -> MemoryFigures:
    return MemoryFigures(
        label, plan.naive_bytes, plan.lower_bound_bytes, plan.arena_bytes, plan.gap
    )


def memory_report(
    before: ir.Model,
    after: ir.Model,
    *,
    dims: Mapping[str, int] | None = None,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> tuple[MemoryReport, MemoryPlan]:
    """Figures before (input order, without and with reuse) and after optimization, and the final plan."""
    from onnxopt.analysis.memory import DEFAULT_SYMBOLIC_DIM, tensor_sizes

    before_sizes = tensor_sizes(
        before, dims, input_shapes=input_shapes, default_dim=DEFAULT_SYMBOLIC_DIM
    )
    after_sizes = tensor_sizes(
        after, dims, input_shapes=input_shapes, default_dim=DEFAULT_SYMBOLIC_DIM
    )
    plain = plan_memory(before.graph, before_sizes, inplace=False)
    reused = plan_memory(before.graph, before_sizes, inplace=True)
    final = plan_memory(after.graph, after_sizes, inplace=True)
    for plan in (plain, reused, final):
        problems = verify_plan(plan)
        if problems:  # a planner bug: never hand out a plan that fails its own check
            from onnxopt.errors import OnnxoptError

            raise OnnxoptError(f"internal error: memory plan failed verification: {problems[0]}")
    rows = (
        _figures("input order, no reuse", plain),
        _figures("input order, reuse", reused),
        _figures("optimized order, reuse", final),
    )
    reduction = (
        1 - final.lower_bound_bytes / plain.lower_bound_bytes if plain.lower_bound_bytes else 0.0
    )
    assumed = tuple(sorted(set(before_sizes.assumed) | set(after_sizes.assumed)))
    report = MemoryReport(rows, reduction, final.unknown, assumed, DEFAULT_SYMBOLIC_DIM)
    return report, final
