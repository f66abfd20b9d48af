"""Memory-aware scheduling: a topological order of a graph's nodes with a low peak of live bytes.

The memory model is the one of :mod:`onnxopt.analysis.memory` (view groups share a buffer,
element-wise ops may write over an input that dies there). Running node ``v`` with ``cur`` bytes
live costs, during its step, ``cur + alloc(v) + workspace(v) - in_place(v)`` and leaves
``cur + alloc(v) - freed(v)`` live, where ``freed`` are the buffers whose last reader is ``v``.

1. List scheduling (two greedy rules: least net growth; and finish the most recent chain first,
   a depth-first rule that completes one branch before starting the next), O(E log V) each.
2. Exact refinement: around the steps at the peak, a window of consecutive nodes is reordered
   optimally by dynamic programming over its downsets (sets of window nodes closed under
   dependencies), minimising the window's largest step. Windows are independent: what is live
   across a window's borders does not depend on the order inside it. Bounded in states and time.
3. Just in time: each candidate again with the nodes that read no arena buffer (weights made at
   run time) moved to just before their first reader, which lowers or keeps every step's bytes.
4. The candidate with the lowest peak wins; the input order wins ties, so it is never worse.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

from onnxopt.analysis.memory import Dataflow, simulate, without_gc

WINDOW_SIZES = (10, 16, 24)
MAX_STATES = 4_000
# Exact refinement is bounded by work (DP transitions), not by the clock, so results are reproducible.
REFINE_WORK = 300_000
REFINE_CUTOFF = 2.0  # list orders this many times above the best refined peak are not refined


@dataclass(frozen=True)
class Schedule:
    order: tuple[int, ...]
    peak: int  # lower bound (largest live total) of ``order``
    original_peak: int
    strategy: str
    # planned arena of ``order``: greedy placements only where no candidate could gain, the lower
    # bound when plans were not scored
    arena: int = 0
    original_arena: int = 0


class _Model:
    """Static, order-independent per-node facts at view-group level."""

    def __init__(self, flow: Dataflow) -> None:
        n = len(flow.nodes)
        self.flow = flow
        self.n = n
        self.alloc = [0] * n
        self.own_groups: list[list[int]] = [[] for _ in range(n)]
        for r in flow.group_members:
            p = flow.producer[r]
            self.alloc[p] += flow.sizes[r]
            self.own_groups[p].append(r)
        self.readers = flow.group_readers
        self.size = flow.sizes
        self.ws = flow.workspace
        self.groups_in = flow.node_groups_in
        # in-place pairs at group level: (output size, input group)
        self.inplace = [
            [(flow.sizes[o], flow.group[s]) for o, s in flow.inplace[i]] for i in range(n)
        ]
        self.succs: list[list[int]] = [[] for _ in range(n)]
        for j, ps in enumerate(flow.preds):
            for i in ps:
                self.succs[i].append(j)


def _greedy(model: _Model, rule: str) -> list[int]:
    """List scheduling; ``rule`` is "net" (least growth) or "chain" (depth-first on recent chains)."""
    n = model.n
    flow = model.flow
    indeg = [len(p) for p in flow.preds]
    remaining = {g: len(rs) for g, rs in model.readers.items()}
    scheduled = [False] * n
    pos = [-1] * n
    version = [0] * n
    heap: list[tuple[tuple[int, ...], int, int]] = []

    def freed(v: int) -> int:
        total = 0
        for g in model.groups_in[v]:
            if remaining[g] == 1:
                total += model.size[g]
        for g in model.own_groups[v]:
            if not model.readers[g]:
                total += model.size[g]
        return total

    def key(v: int) -> tuple[int, ...]:
        net = model.alloc[v] - freed(v)
        if rule == "net":
            return (net, v)
        latest = max((pos[u] for u in flow.preds[v]), default=-1)
        return (0 if net <= 0 else 1, net if net <= 0 else -latest, v)

    def push(v: int) -> None:
        version[v] += 1
        heapq.heappush(heap, (key(v), version[v], v))

    for v in range(n):
        if indeg[v] == 0:
            push(v)
    order: list[int] = []
    while heap:
        _, ver, v = heapq.heappop(heap)
        if scheduled[v] or ver != version[v]:
            continue
        scheduled[v] = True
        pos[v] = len(order)
        order.append(v)
        for g in model.groups_in[v]:
            remaining[g] -= 1
            if remaining[g] == 1:
                for w in model.readers[g]:
                    if not scheduled[w]:
                        if indeg[w] == 0:
                            push(w)
                        break
        for w in model.succs[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                push(w)
    if len(order) != n:  # a cycle: leave the order alone
        return list(range(n))
    return order


def _resting_before(model: _Model, order: Sequence[int]) -> list[int]:
    """Bytes live between steps: resting[p] = live just before step p runs."""
    n = len(order)
    pos = [0] * model.n
    for p, v in enumerate(order):
        pos[v] = p
    delta = [0] * (n + 2)
    at = pos.__getitem__
    for g, span in model.flow.group_span.items():
        s = pos[model.flow.producer[g]]
        e = max(map(at, span))
        # live after step s up to (and including) step e: contributes to resting[s+1 .. e]
        delta[s + 1] += model.size[g]
        delta[e + 1] -= model.size[g]
    out = []
    running = 0
    for p in range(n):
        running += delta[p]
        out.append(running)
    return out


def _window_dp(
    model: _Model,
    order: Sequence[int],
    a: int,
    b: int,
    base: int,
    pos: Sequence[int],
    work: list[int],
    target: int,
) -> tuple[int, list[int], list[int], list[int]] | None:
    """Best order of ``order[a:b]`` if its peak is below ``target``: (its peak, the order, step
    bytes, resting bytes before each step); ``(target, [], [], [])`` when no order is.

    A partial order whose peak already reaches ``target`` is not extended (the peak only grows
    along an order), so a window with no better order costs only the states that could still be.
    None when the window has more downsets than the state cap or the work budget ran out.
    """
    nodes = list(order[a:b])
    k = len(nodes)
    local = {v: i for i, v in enumerate(nodes)}
    pred_mask = [0] * k
    for i, v in enumerate(nodes):
        for u in model.flow.preds[v]:
            j = local.get(u)
            if j is not None:
                pred_mask[i] |= 1 << j
    # Groups touched: window-reader masks and whether someone after the window still reads them.
    reader_mask: dict[int, int] = {}
    later: set[int] = set()
    for v in nodes:
        for g in model.groups_in[v]:
            if g in reader_mask:
                continue
            mask = 0
            for r in model.readers[g]:
                j = local.get(r)
                if j is not None:
                    mask |= 1 << j
                elif pos[r] >= b:
                    later.add(g)
            # a view of g produced after the window keeps it alive too
            for m in model.flow.group_members[g]:
                if pos[model.flow.producer[m]] >= b:
                    later.add(g)
            reader_mask[g] = mask
    alloc = [model.alloc[v] for v in nodes]
    ws = [model.ws[v] for v in nodes]
    dead_own = [
        sum(model.size[g] for g in model.own_groups[v] if not model.readers[g]) for v in nodes
    ]

    def step(state: int, i: int, mem: int) -> tuple[int, int]:
        v = nodes[i]
        after = state | (1 << i)
        dying: list[int] = []
        freed = dead_own[i]
        for g in model.groups_in[v]:
            if g not in later and reader_mask[g] & ~after == 0:
                dying.append(g)
                freed += model.size[g]
        saving = 0
        if dying:
            claimed: set[int] = set()
            for size, g in model.inplace[v]:
                if g in dying and g not in claimed:
                    claimed.add(g)
                    saving += size
        return mem + alloc[i] + ws[i] - saving, mem + alloc[i] - freed

    full = (1 << k) - 1
    # level-by-level: state -> (peak so far, resting mem, parent state, last node)
    level: dict[int, tuple[int, int]] = {0: (0, base)}
    parents: list[dict[int, tuple[int, int]]] = []
    count = 0
    for _ in range(k):
        nxt: dict[int, tuple[int, int]] = {}
        back: dict[int, tuple[int, int]] = {}
        for state, (peak, mem) in level.items():
            work[0] -= k
            for i in range(k):
                bit = 1 << i
                if state & bit or pred_mask[i] & ~state:
                    continue
                during, rest = step(state, i, mem)
                new_peak = max(peak, during)
                if new_peak >= target:
                    continue
                new = state | bit
                old = nxt.get(new)
                if old is None or new_peak < old[0]:
                    nxt[new] = (new_peak, rest)
                    back[new] = (state, i)
        count += len(nxt)
        if count > MAX_STATES or work[0] <= 0:
            return None
        parents.append(back)
        level = nxt
    if full not in level:
        return target, [], [], []
    best_peak = level[full][0]
    local_order: list[int] = []
    state = full
    for back in reversed(parents):
        prev, i = back[state]
        local_order.append(i)
        state = prev
    local_order.reverse()
    steps = []
    rests = []
    mem = base
    state = 0
    for i in local_order:
        rests.append(mem)
        during, mem = step(state, i, mem)
        state |= 1 << i
        steps.append(during)
    return best_peak, [nodes[i] for i in local_order], steps, rests


def _refine(model: _Model, order: list[int], work: int, deadline: float) -> list[int]:
    """Lower the peak with exact window reorderings around the peak steps, until none helps."""
    order = list(order)
    n = len(order)
    if n < 2:
        return order
    steps = list(simulate(model.flow, order, with_buffers=False).step_bytes)
    resting = _resting_before(model, order)
    pos = [0] * model.n
    for q, v in enumerate(order):
        pos[v] = q
    tried: set[tuple[int, int]] = set()
    budget = [work]
    while budget[0] > 0 and time.perf_counter() < deadline:
        peak = max(steps)
        improved = False
        candidates = [p for p in range(n) if steps[p] == peak][:8]
        for p in candidates:
            for width in WINDOW_SIZES:
                for a in sorted({max(0, p - width // 2), max(0, p - width + 2), max(0, p - 1)}):
                    b = min(n, a + width)
                    if (a, b) in tried or b - a < 2:
                        continue
                    tried.add((a, b))
                    target = max(steps[a:b])
                    result = _window_dp(model, order, a, b, resting[a], pos, budget, target)
                    if result is None:
                        break
                    best, new_nodes, new_steps, new_rests = result
                    if best < target:
                        # Only the window changes: what is live across its borders stays the same.
                        order[a:b] = new_nodes
                        steps[a:b] = new_steps
                        resting[a:b] = new_rests
                        for q in range(a, b):
                            pos[order[q]] = q
                        tried.clear()
                        improved = True
                        break
                    if budget[0] <= 0 or time.perf_counter() > deadline:
                        return order
                if improved:
                    break
            if improved:
                break
        if not improved:
            break
    return order


def _sinkable(model: _Model) -> list[bool]:
    """Nodes that can run just before their first successor without raising any step's bytes.

    They read no arena buffer (a ConstantOfShape making a weight, a Constant, a Shape of a graph
    input), so running later extends no other buffer's life; every output they make in the arena
    is read (an unread one would be live at their new step only), and they have no workspace.
    """
    return [
        bool(model.succs[v])
        and not model.groups_in[v]
        and not model.ws[v]
        and model.alloc[v] > 0
        and all(model.readers[g] for g in model.own_groups[v])
        for v in range(model.n)
    ]


def _sink(model: _Model, order: Sequence[int], sinkable: Sequence[bool]) -> list[int]:
    """``order`` with each ``sinkable`` node moved to just before its first successor.

    Only the moved nodes' outputs change lifetime: they start later and end where they did. So
    every step holds at most what it held before, the moved node's own step too (the resting
    bytes before its successor, less its outputs, plus its outputs). Linear but for a sort by
    rank, a tuple: a node that stays has ``(position, 1)``; a moved one takes its earliest
    successor's rank with the last item replaced by ``(0, position, 1)``, which sorts just
    before that successor and after every node that sorts before it (nodes moved to the same
    place keep their relative order). Successors only ever sort later, so the order stays
    topological under ``model``'s dependencies.
    """
    pos = [0] * model.n
    for p, v in enumerate(order):
        pos[v] = p
    rank: list[tuple[int, ...]] = [()] * model.n
    depth = [0] * model.n  # how many moved nodes deep a moved node's rank is
    for v in reversed(order):
        rank[v] = (pos[v], 1)
        if sinkable[v]:
            first = min(model.succs[v], key=rank.__getitem__)
            # Chains of moved nodes (one node's many producers, chained by the ORT walk's
            # constraints) lengthen the ranks; past a depth the node stays (still topological:
            # its successors all sort after its own position).
            if depth[first] < _SINK_DEPTH:
                rank[v] = (*rank[first][:-1], 0, pos[v], 1)
                depth[v] = depth[first] + 1
    return sorted(order, key=rank.__getitem__)


_SINK_DEPTH = 64


# Up to this many nodes, candidate orders are judged by the arena the planner actually builds
# (tight schedules can be hard to pack); beyond it, by the lower bound alone (planning is O(n log n)
# but costs seconds per candidate at 100k nodes).
PLAN_SCORING_NODES = 20_000
PLAN_SCORING_CANDIDATES = 3
PLAN_SCORING_WORK = 300_000
# Up to this many nodes the forced-live bound (:func:`forced_peak`) is computed first: bitsets of
# ancestors and descendants, and one pass over the nodes per buffer, in numpy.
FORCED_BOUND_NODES = 8_000


def forced_peak(flow: Dataflow) -> int | None:
    """A lower bound of the peak (``simulate``) of every topological order of ``flow``'s nodes.

    While node v runs, every order holds each view group made at or before v (by v or one of its
    ancestors) that something at or after v (v or one of its descendants) still reads or views:
    it was made before and is read later, whatever the order. A group made before v whose other
    readers may run before or after v (neither ancestors nor descendants of v) holds its bytes at
    v too, unless all of them ran first, and then what they made that is read at or after v is
    live instead: the smaller of the two counts (each node standing in for one group only, the
    first it reads; outputs it may write over an input are not counted). The bound is the largest
    total at any node, plus its workspace, less the outputs it may write over a dying input (the
    one step where a buffer and the group written into it are both counted). A group that may be
    written into another buffer counts at that buffer's size if smaller (through a chain of such
    writes). None when the node order is not topological, the graph has more than
    ``FORCED_BOUND_NODES`` nodes or its sizes add up past 2**62 bytes.

    On the zoo's optimized transformers and ResNet-50 it equals the input order's peak, so no
    order can be better and the search is not needed. (The second rule is a gated MLP's: its
    input is read by the gate and the up projection, and while the gate's activation runs either
    that input or the up projection's output is live.)
    """
    import numpy as np

    n = len(flow.nodes)
    if n > FORCED_BOUND_NODES:
        return None
    if sum(flow.sizes) + max(flow.workspace, default=0) >= 1 << 62:
        return None  # (totals past int64; sizes of tensors no run could hold)
    before = [0] * n  # bit u set: u runs before v in every order (v's ancestors and v)
    for v, preds in enumerate(flow.preds):
        mask = 1 << v
        for u in preds:
            if u >= v:
                return None  # not in topological order
            mask |= before[u]
        before[v] = mask
    succs: list[list[int]] = [[] for _ in range(n)]
    for v, preds in enumerate(flow.preds):
        for u in preds:
            succs[u].append(v)
    after = [0] * n  # bit w set: w runs after v in every order (v's descendants and v)
    for v in reversed(range(n)):
        mask = 1 << v
        for w in succs[v]:
            mask |= after[w]
        after[v] = mask
    nbytes = (n + 7) // 8

    def nodes_of(mask: int) -> np.ndarray:
        return np.unpackbits(
            np.frombuffer(mask.to_bytes(nbytes, "little"), dtype=np.uint8),
            count=n,
            bitorder="little",
        ).astype(np.int64)

    # The size a group is counted at: its own, or that of a buffer it may be written into.
    hosted: dict[int, int] = {}
    counted: dict[int, int] = {}
    for v in range(n):
        for out, src in flow.inplace[v]:
            host = flow.group[src]
            if host not in flow.group_members:
                continue  # (no arena buffer to write into)
            hosted[out] = min(hosted.get(out, flow.sizes[out]), counted.get(host, flow.sizes[host]))
        for out in flow.node_outputs[v]:
            if out in flow.group_members:
                counted[out] = hosted.get(out, flow.sizes[out])
    # Per group: the nodes at or before one of its span's (read or viewed at or after them).
    read_after = {}
    for g in flow.group_members:
        mask = 0
        for node in flow.group_span[g]:
            mask |= before[node]
        read_after[g] = mask
    # Per node u: what u's own buffers (none it may write in place) hold at each v when u ran
    # before v: those read at or after v.
    held: dict[int, np.ndarray] = {}

    def held_by(u: int) -> np.ndarray:
        if u not in held:
            in_place = {out for out, _ in flow.inplace[u]}
            vector = np.zeros(n, dtype=np.int64)
            for out in flow.node_outputs[u]:
                if out in flow.group_members and out not in in_place and flow.sizes[out]:
                    vector += nodes_of(read_after[out]) * flow.sizes[out]
            held[u] = vector
        return held[u]

    standing_for = {}  # node -> the one group it may stand in for
    for u in range(n):
        for g in flow.node_groups_in[u]:
            if g in flow.group_members:
                standing_for[u] = g
                break
    live = np.zeros(n, dtype=np.int64)
    for g in flow.group_members:
        size = counted.get(g, flow.sizes[g])
        if not size:
            continue
        made = after[flow.producer[g]]
        forced = made & read_after[g]
        if forced:
            live += nodes_of(forced) * size
        unread_after = made & ~read_after[g]
        if not unread_after:
            continue
        instead = np.zeros(n, dtype=np.int64)
        for node in flow.group_span[g]:
            either_side = unread_after & ~after[node]  # node neither before nor after v
            if either_side and standing_for.get(node) == g:
                instead += nodes_of(either_side) * held_by(node)
        live += np.minimum(instead, size)
    for v in range(n):
        outs = {out for out, _ in flow.inplace[v]}
        live[v] += flow.workspace[v] - sum(counted.get(out, flow.sizes[out]) for out in outs)
    return int(live.max()) if n else 0


@without_gc
def schedule_for_memory(
    flow: Dataflow,
    *,
    work: int = REFINE_WORK,
    seconds: float = 30.0,
    refine: bool = True,
    plan_scoring: bool | None = None,
    ort_guard: bool = True,
    min_gain: float = 0.0,
) -> Schedule:
    """A topological order of ``flow``'s nodes with the lowest memory we can find.

    Candidates: the input order, two list schedules, and each refined by exact window search,
    each also with the nodes that read no arena buffer made just in time (:func:`_sink`).
    They are compared by (planned arena, lower bound) when ``plan_scoring`` (default: graphs up to
    ``PLAN_SCORING_NODES`` nodes), else by the lower bound. The input order wins ties, and a
    candidate must not raise the lower bound either, so the result is never worse than the input.
    ``work`` bounds the exact refinement (DP transitions per candidate); ``seconds`` is a safety cap.
    Orders that cannot plan ``min_gain`` (a fraction) below the input order's arena are not
    planned, and the input order is kept unless another is better.
    With ``ort_guard``, a candidate is also rejected when ONNX Runtime's default execution order
    (see :func:`ort_default_order`) of the reordered file would have a higher peak than that of
    the input file: ORT ignores the file's order by default, and new node indices change its ties.
    """
    from onnxopt.analysis.memory_plan import plan_flow

    model = _Model(flow)
    if plan_scoring is None:
        plan_scoring = model.n <= PLAN_SCORING_NODES
    identity = list(range(model.n))
    simulated: dict[tuple[int, ...], int] = {}

    def peak_of(order: Sequence[int]) -> int:
        """An order's lower bound, simulated once (the refinement and the shortlist both ask)."""
        key = tuple(order)
        if key not in simulated:
            simulated[key] = simulate(flow, order, with_buffers=False).peak
        return simulated[key]

    # Greedy placements alone bound the input order's searched plan from above.
    greedy = (
        plan_flow(flow, identity, search_work=0, exact_nodes=0).arena_bytes if plan_scoring else 0
    )
    original_peak = peak_of(identity)
    bound = forced_peak(flow)
    if bound is not None:
        # No order's peak is below the bound: where it already leaves nothing to gain, the
        # answer is the one the search would reach (the input order), without the search.
        arena = greedy if plan_scoring else original_peak
        if _cannot_gain(bound, arena, min_gain) if plan_scoring else bound >= original_peak:
            return Schedule(
                tuple(identity), original_peak, original_peak, "input order", arena, arena
            )
    candidates: list[tuple[str, list[int]]] = [("input order", identity)]
    for rule in ("net", "chain"):
        candidates.append((f"greedy-{rule}", _greedy(model, rule)))
    if ort_guard:
        # Orders that keep ONNX Runtime's default walk exactly as it is for the input file.
        kept = _Model(dataclasses.replace(flow, preds=ort_walk_constraints(flow, identity)))
        for rule in ("net", "chain"):
            candidates.append((f"greedy-{rule}, ORT walk kept", _greedy(kept, rule)))
    deadline = time.perf_counter() + seconds
    if refine:
        # Best first; a list order that starts REFINE_CUTOFF times above the best refined one is
        # left as it is: window search lowers a peak by a few tens of percent at most, and on
        # graphs of many parallel branches it spends its whole budget on such orders (an
        # IsolationForest: 0.5 s of its 0.55 s refining orders that stay 2.8x worse).
        base = list(candidates)
        peaks = [peak_of(order) for _, order in base]
        refined: dict[int, list[int]] = {}
        best_refined: int | None = None
        for index in sorted(range(len(base)), key=lambda i: (peaks[i], i)):
            if best_refined is not None and peaks[index] >= REFINE_CUTOFF * best_refined:
                break
            name, order = base[index]
            refiner = kept if name.endswith("ORT walk kept") else model
            refined[index] = _refine(refiner, order, work, deadline)
            found = peak_of(refined[index])
            best_refined = found if best_refined is None else min(best_refined, found)
        for index, (name, _) in enumerate(base):
            if index in refined:
                candidates.append((f"{name}+exact windows", refined[index]))
    if ort_guard:
        # Orders ORT's default depth-first walk produces from these files: good for us and,
        # written to the file, often good for ORT's own walk too.
        for name, order in list(candidates):
            walked = ort_default_order(flow, order)
            candidates.append((f"{name}, ORT walk", walked))
            candidates.append((f"{name}, ORT walk twice", ort_default_order(flow, walked)))

    sinkable = _sinkable(model)
    if any(sinkable):
        # Every candidate with the nodes that read no arena buffer (weights made at run time by
        # ConstantOfShape) made just in time, within the constraints it was built under. List
        # schedules make such nodes early (each grows memory least), and the exact windows only
        # look near the peak: left early, these small buffers live long, out of step with each
        # other, and fragment the arena (ResNet-50 as shipped: planned 20% above its bound).
        for name, order in list(candidates):
            if name == "input order" and ort_guard:
                candidates.append(
                    (f"{name}, just in time, ORT walk kept", _sink(kept, order, sinkable))
                )
            constrained = kept if "ORT walk kept" in name else model
            candidates.append((f"{name}, just in time", _sink(constrained, order, sinkable)))

    def arena_of(order: list[int], peak: int) -> int:
        return (
            # Greedy placements and local search only: the exact searches would cost seconds
            # per candidate; the chosen order's final plan gets them.
            plan_flow(flow, order, search_work=PLAN_SCORING_WORK, exact_nodes=0).arena_bytes
            if plan_scoring
            else peak
        )

    ort_original = peak_of(ort_default_order(flow, identity)) if ort_guard else 0
    # Cheap filter first (lower bound, ORT's walk), then plan only the few most promising.
    shortlist: list[tuple[int, int, str, list[int]]] = []
    seen: set[tuple[int, ...]] = {tuple(identity)}
    for index, (name, order) in enumerate(candidates[1:]):
        key = tuple(order)
        if key in seen:
            continue
        seen.add(key)
        peak = peak_of(order)
        if peak > original_peak:
            continue
        if ort_guard and peak_of(ort_default_order(flow, order)) > ort_original:
            continue
        shortlist.append((peak, index, name, order))
    shortlist.sort()
    shortlist = shortlist[:PLAN_SCORING_CANDIDATES]
    # Where the greedy plan leaves the shortlist nothing to gain, the search (most of the time
    # here) is not needed: YOLO's shortlists hold the input order's own peak, 64 bytes under its
    # arena.
    if plan_scoring and (not shortlist or _cannot_gain(shortlist[0][0], greedy, min_gain)):
        return Schedule(
            tuple(identity), original_peak, original_peak, "input order", greedy, greedy
        )
    original = (arena_of(identity, original_peak), original_peak)
    best_name, best_order, best = "input order", identity, original
    for peak, _, name, order in shortlist:
        if plan_scoring and (
            _cannot_gain(peak, best[0], 0.0) or _cannot_gain(peak, original[0], min_gain)
        ):
            break  # (and so does the rest of the shortlist: it is sorted by peak)
        score = (arena_of(order, peak), peak)
        if score < best:
            best_name, best_order, best = name, order, score
    return Schedule(tuple(best_order), best[1], original[1], best_name, best[0], original[0])


def _cannot_gain(peak: int, arena: int, min_gain: float) -> bool:
    """Whether an order whose lower bound is ``peak`` cannot plan ``min_gain`` (a fraction) below
    ``arena``: a plan holds at least what is live at the peak."""
    return peak >= arena or peak > (1 - min_gain) * arena


def ort_walk_constraints(flow: Dataflow, file_order: Sequence[int]) -> list[list[int]]:
    """``flow.preds`` plus the orderings that make ONNX Runtime's default walk of a file the same.

    ORT's walk (:func:`ort_default_order`) only looks at the relative file order of the
    producers of each node and of the nodes nobody reads. A file that keeps those relative
    orders as ``file_order`` has them is walked exactly like it, so the extra edges chain each
    such set in ``file_order``'s order. They never close a cycle: ``file_order`` satisfies them.
    """
    index = [0] * len(flow.nodes)
    for position, v in enumerate(file_order):
        index[v] = position
    preds = [set(ps) for ps in flow.preds]
    has_reader = [False] * len(flow.nodes)
    for ps in flow.preds:
        siblings = sorted(set(ps), key=index.__getitem__)
        for earlier, later in itertools.pairwise(siblings):
            preds[later].add(earlier)
        for u in ps:
            has_reader[u] = True
    sinks = sorted((v for v in range(len(flow.nodes)) if not has_reader[v]), key=index.__getitem__)
    for earlier, later in itertools.pairwise(sinks):
        preds[later].add(earlier)
    return [sorted(ps) for ps in preds]


def ort_default_order(flow: Dataflow, file_order: Sequence[int]) -> list[int]:
    """The order ONNX Runtime's default ``ExecutionOrder`` runs ``file_order`` in (graph optimizations off).

    ORT numbers nodes as the file lists them, then runs a depth-first post-order from the nodes
    whose outputs no node reads (pushed by index), exploring a node's producers highest index
    first (``GraphViewer`` / ``Graph::ReverseDFSFrom``). So it finishes one input branch before the
    next, whatever the file order, and the file order only breaks ties through the indices.
    """
    index = [0] * len(flow.nodes)
    for position, v in enumerate(file_order):
        index[v] = position
    has_reader = [False] * len(flow.nodes)
    for ps in flow.preds:
        for u in ps:
            has_reader[u] = True
    stack: list[tuple[int, bool]] = [(v, False) for v in file_order if not has_reader[v]]
    visited = [False] * len(flow.nodes)
    order: list[int] = []
    while stack:
        v, leave = stack.pop()
        if leave:
            order.append(v)
            continue
        if visited[v]:
            continue
        visited[v] = True
        stack.append((v, True))
        for u in sorted(flow.preds[v], key=index.__getitem__):
            if not visited[u]:
                stack.append((u, False))
    return order


def is_topological(flow: Dataflow, order: Sequence[int]) -> bool:
    pos = {v: p for p, v in enumerate(order)}
    if len(pos) != len(flow.nodes) or set(pos) != set(range(len(flow.nodes))):
        return False
    return all(pos[u] < pos[v] for v, ps in enumerate(flow.preds) for u in ps)
