"""Exact placement of buffers with fixed lifetimes in an arena of a given capacity (branch and bound).

The search follows MiniMalloc (Moffitt, ASPLOS 2023). Any feasible placement can be pushed down
until every buffer rests at offset 0 or on the top of a buffer it overlaps in time; listing the
buffers of such a *canonical* placement by offset, each one sits exactly at the highest top of the
buffers listed before it that overlap it (its *floor*). So the search places buffers one at a time
at their floor, in non-decreasing offset order (ties broken by a fixed preorder), and prunes:

- dominance: a buffer is not placed at or above the top another unplaced buffer would have if it
  were placed at its own floor (that one could go underneath first: an equivalent placement);
- section inference: the timeline is cut into *sections* (maximal runs of steps with the same live
  buffers); in every section, the floor (at least the current offset, since offsets only grow)
  plus the sizes of its unplaced buffers must fit the capacity.

Sections no buffer crosses between split the problem into independent partitions, each solved on
its own. The search is bounded by a count of search nodes, never by the clock, so it is
deterministic: it answers a placement, "infeasible" (the capacity is proven too small: the whole
tree was searched), or "unknown" (the node budget ran out).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Interval = tuple[int, int, int]  # (size, first step, last step)

# Orders in which the search tries buffers at equal offsets (MiniMalloc's preorderings): by the
# largest section total the buffer lives in ("T"), by how many sections it spans ("W"), by area ("A").
PREORDERS = ("WAT", "TAW", "TWA")


@dataclass(frozen=True)
class ExactResult:
    status: str  # "feasible", "infeasible" or "unknown"
    offsets: tuple[int, ...] | None
    nodes: int  # search nodes spent


def _sections(buffers: Sequence[Interval]) -> tuple[list[int], list[tuple[int, int]]]:
    """Section boundaries and each buffer's section range [lo, hi) (zero-size buffers: (0, 0))."""
    points = sorted({p for size, s, e in buffers if size > 0 for p in (s, e + 1)})
    index = {p: k for k, p in enumerate(points)}
    spans = [(index[s], index[e + 1]) if size > 0 else (0, 0) for size, s, e in buffers]
    return points, spans


def _partitions(
    n_sections: int, spans: Sequence[tuple[int, int]], sizes: Sequence[int]
) -> list[tuple[int, int, list[int]]]:
    """Independent groups: (first section, end section, buffers), cut where no buffer crosses."""
    crossing = [0] * (n_sections + 1)
    for b, (lo, hi) in enumerate(spans):
        if sizes[b] > 0 and hi - lo > 1:
            crossing[lo + 1] += 1
            crossing[hi] -= 1
    starts = []
    running = 0
    for k in range(n_sections):
        running += crossing[k]
        if running == 0:
            starts.append(k)
    groups: dict[int, list[int]] = {k: [] for k in starts}
    owner = [0] * max(n_sections, 1)
    current = 0
    start_set = set(starts)
    for k in range(n_sections):
        if k in start_set:
            current = k
        owner[k] = current
    for b, (lo, _) in enumerate(spans):
        if sizes[b] > 0:
            groups[owner[lo]].append(b)
    ends = [*starts[1:], n_sections]
    return [(k, end, groups[k]) for k, end in zip(starts, ends, strict=True) if groups[k]]


def fit(base: int, size: int, walls: Sequence[tuple[int, int]]) -> int:
    """Lowest offset at or above ``base`` where ``size`` bytes miss every wall (sorted [lo, hi))."""
    at = base
    for lo, hi in walls:
        if hi <= at:
            continue
        if lo >= at + size:
            break
        at = hi
    return at


def solve(
    buffers: Sequence[Interval],
    capacity: int,
    *,
    node_limit: int = 100_000,
    neighbours: Sequence[Sequence[int]] | None = None,
    fixed: Mapping[int, int] | None = None,
) -> ExactResult:
    """Offsets placing ``buffers`` (no two live at once overlapping) within ``capacity`` bytes.

    Sizes must already be multiples of the alignment (offsets are sums of sizes). ``node_limit``
    bounds the search nodes over all preorders; ``neighbours`` (buffers overlapping in time, as
    :func:`onnxopt.analysis.memory_plan.conflicts` gives) is computed when not given. ``fixed``
    maps buffers to offsets they keep: the search places the others around them (and then
    "infeasible" only means "not around these").
    """
    if neighbours is None:
        from onnxopt.analysis.memory_plan import conflicts

        neighbours = conflicts(buffers)
    fixed = fixed or {}
    # Buffers kept in place take no part in the search except as walls around the others.
    sizes = [0 if b in fixed else size for b, (size, _, _) in enumerate(buffers)]
    if any(size > capacity for size in sizes):
        return ExactResult("infeasible", None, 0)
    walls = [
        sorted((fixed[c], fixed[c] + buffers[c][0]) for c in neighbours[b] if c in fixed)
        if fixed and sizes[b]
        else []
        for b in range(len(buffers))
    ]
    free = [(size, s, e) for size, (_, s, e) in zip(sizes, buffers, strict=True)]
    points, spans = _sections(free)
    n_sections = max(len(points) - 1, 0)
    offsets = [fixed.get(b, 0) for b in range(len(buffers))]
    nodes_used = 0
    for first, end, group in _partitions(n_sections, spans, sizes):
        budget = node_limit - nodes_used
        status, placed, spent = _solve_partition(
            group, first, end, free, spans, neighbours, walls, capacity, budget
        )
        nodes_used += spent
        if status != "feasible":
            return ExactResult(status, None, nodes_used)
        for b, offset in placed.items():
            offsets[b] = offset
    return ExactResult("feasible", tuple(offsets), nodes_used)


def _solve_partition(
    group: list[int],
    first: int,
    end: int,
    buffers: Sequence[Interval],
    spans: Sequence[tuple[int, int]],
    neighbours: Sequence[Sequence[int]],
    walls: Sequence[list[tuple[int, int]]],
    capacity: int,
    budget: int,
) -> tuple[str, dict[int, int], int]:
    """Round robin over the preorders with a doubling node limit, like MiniMalloc."""
    totals = [0] * (end - first)
    for b in group:
        lo, hi = spans[b]
        for k in range(lo - first, hi - first):
            totals[k] += buffers[b][0]
    if max(totals) > capacity:
        return "infeasible", {}, 1
    keys = {}
    for b in group:
        size, s, e = buffers[b]
        lo, hi = spans[b]
        facts = {"T": max(totals[lo - first : hi - first]), "W": hi - lo, "A": size * (e - s + 1)}
        keys[b] = facts
    spent = 0
    limit = max(len(group), 16)
    while True:
        limit *= 2
        exhausted = False
        for name in PREORDERS:
            ordered = sorted(group, key=lambda b: (*(-keys[b][c] for c in name), b))
            this_limit = min(limit, budget - spent)
            if this_limit <= 0:
                return "unknown", {}, spent
            status, placed, used = _search(
                ordered, first, end, buffers, spans, neighbours, walls, capacity, this_limit
            )
            spent += used
            if status == "feasible":
                return status, placed, spent
            if status == "infeasible":
                return status, {}, spent
            exhausted = spent >= budget
        if exhausted:
            return "unknown", {}, spent


def _search(
    ordered: list[int],
    first: int,
    end: int,
    buffers: Sequence[Interval],
    spans: Sequence[tuple[int, int]],
    neighbours: Sequence[Sequence[int]],
    walls_of: Sequence[list[tuple[int, int]]],
    capacity: int,
    node_limit: int,
) -> tuple[str, dict[int, int], int]:
    """Depth-first search of canonical placements (iterative: partitions can hold many buffers)."""
    n = len(ordered)
    rank = {b: r for r, b in enumerate(ordered)}
    size = [buffers[b][0] for b in ordered]
    lo = [spans[b][0] - first for b in ordered]
    hi = [spans[b][1] - first for b in ordered]
    nbrs = [[rank[c] for c in neighbours[b] if c in rank] for b in ordered]
    walls = [walls_of[b] for b in ordered]
    n_sec = end - first
    floor = [0] * n_sec
    total = [0] * n_sec
    for r in range(n):
        for k in range(lo[r], hi[r]):
            total[k] += size[r]
    near_lo = [min([lo[c] for c in nbrs[r]], default=lo[r]) for r in range(n)]
    near_hi = [max([hi[c] for c in nbrs[r]], default=hi[r]) for r in range(n)]
    base = [0] * n  # highest top of the placed neighbours
    min_off = [fit(0, size[r], walls[r]) for r in range(n)]  # lowest offset from there
    offset = [-1] * n
    unplaced = set(range(n))
    open_nbrs = [len(nb) for nb in nbrs]  # unplaced neighbours
    nodes = 0

    def candidates(last_off: int, last_rank: int) -> list[int]:
        min_height = min(min_off[r] + size[r] for r in unplaced)
        found = [
            r
            for r in unplaced
            if min_off[r] < min_height
            and (min_off[r] > last_off or (min_off[r] == last_off and r > last_rank))
        ]
        found.sort(key=lambda r: (min_off[r], r))
        return found

    Undo = tuple[list[tuple[int, int, int]], list[tuple[int, int, int]], list[int]]

    def put(r: int, at: int, sec_log: list[tuple[int, int, int]]) -> None:
        offset[r] = at
        unplaced.discard(r)
        top = at + size[r]
        for k in range(lo[r], hi[r]):
            sec_log.append((k, floor[k], size[r]))
            floor[k] = top
            total[k] -= size[r]

    def place(r: int) -> Undo | None:
        """Put ``r`` at its floor; returns undo logs, or None (with nothing changed) if pruned."""
        off = min_off[r]
        top = off + size[r]
        for k in range(lo[r], hi[r]):
            if top + total[k] - size[r] > capacity:
                return None
        # Section inference around r (the sections of its neighbours): offsets only grow from
        # here, so a section's unplaced buffers go above max(floor, off). Checking every
        # section would be stronger but costs O(sections) per node.
        for k in range(near_lo[r], near_hi[r]):
            t = total[k]
            if t and max(floor[k], off) + t > capacity:
                return None
        sec_log: list[tuple[int, int, int]] = []
        put(r, off, sec_log)
        off_log = []
        placed = [r]
        isolated = []
        for c in nbrs[r]:
            open_nbrs[c] -= 1
            if offset[c] < 0:
                if base[c] < top:
                    off_log.append((c, base[c], min_off[c]))
                    base[c] = top
                    min_off[c] = fit(top, size[c], walls[c]) if walls[c] else top
                if open_nbrs[c] == 0:
                    isolated.append(c)
        logs = (sec_log, off_log, placed)
        # A buffer whose neighbours are all placed constrains nobody: it goes at its floor now.
        for c in isolated:
            placed.append(c)
            put(c, min_off[c], sec_log)
            if min_off[c] + size[c] > capacity:
                unplace(logs)
                return None
        return logs

    def unplace(logs: Undo) -> None:
        sec_log, off_log, placed = logs
        for c, old_base, old_min in reversed(off_log):
            base[c] = old_base
            min_off[c] = old_min
        for k, value, s in reversed(sec_log):
            floor[k] = value
            total[k] += s
        for c in placed:
            offset[c] = -1
            unplaced.add(c)
        for c in nbrs[placed[0]]:
            open_nbrs[c] += 1

    for r in range(n):
        if not nbrs[r]:
            if min_off[r] + size[r] > capacity:
                return "infeasible", {}, 0
            put(r, min_off[r], [])
    if not unplaced:
        return "feasible", {ordered[q]: offset[q] for q in range(n)}, 0
    # Stack frames: [candidate list, next index, placed rank or -1, undo logs]
    stack: list[list] = [[candidates(-1, -1), 0, -1, None]]
    while stack:
        frame = stack[-1]
        if frame[2] >= 0:
            unplace(frame[3])
            frame[2] = -1
        cands, i = frame[0], frame[1]
        if i >= len(cands):
            stack.pop()
            continue
        r = cands[i]
        frame[1] = i + 1
        nodes += 1
        if nodes > node_limit:
            return "unknown", {}, nodes
        logs = place(r)
        if logs is None:
            continue
        frame[2], frame[3] = r, logs
        if not unplaced:
            return "feasible", {ordered[q]: offset[q] for q in range(n)}, nodes
        stack.append([candidates(offset[r], r), 0, -1, None])
    return "infeasible", {}, nodes
