"""Replace a GatherND that reads every element of its data in order by an Unsqueeze of the data.

transformers builds attention masks with index functions (``mask[batch_idx, kv_idx]``), and
torch.export lowers the advanced indexing to a grid of Range indices::

    b = Unsqueeze(Range(0, B, 1), [1, 2, 3])          # [B, 1, 1, 1]
    t = Unsqueeze(Range(0, T, 1), [0, 1, 2])          # [1, 1, 1, T]
    shape = Shape(Max(b, t))                          # the broadcast shape [B, 1, 1, T]
    grid = Concat(Unsqueeze(Expand(b, shape), -1), Unsqueeze(Expand(t, shape), -1), axis=-1)
    out = GatherND(mask, grid)                        # mask [B, T] -> [B, 1, 1, T]

Element ``p`` of ``out`` is ``mask[p[a_0], p[a_1], ...]`` where ``a_j`` is the axis along which the
j-th index runs. When each index is ``Range(0, n_j, 1)`` with ``n_j`` provably dim j of the data, the
axes increase with j, and every other axis of the grid is 1, that is the data itself with unit axes
inserted: ``Unsqueeze(mask, [1, 2])``. The dozen nodes that build the grid go with it (BERT's dynamo
export: 12 nodes).

The other axes are proved to be 1 from how the broadcast shape is built: ``Shape`` of an
element-wise op over index tensors of the grid (each is 1 off its own axis, so their broadcast is 1
off the grid axes, and each grid axis gets exactly its ``n_j``), or a constant. The ``n_j`` proofs
accept a read of that very dim of the data, a dim with the same symbol (the exporter's declared
dynamic axis: ``input_ids`` and ``attention_mask`` share "batch" and "sequence"), or an equal static
size.

A chain of ScatterNDs that writes disjoint blocks covering the whole tensor is the Concat of its
updates: a slice assignment into a fresh tensor (DeepSeek's key, ``k = new_empty(...);
k[..., :a] = u; k[..., a:] = v``). Blocks are rows (constant ``[n, 1]`` indices, torch.export) or
runs of the last axis's columns through an index grid whose other indices count every other axis
in order, proved as above (TorchScript).

A Gather whose indices are all one constant (the token types an export defaults) is that row where
it is added to a tensor of its shape.

torch.export writes a view that no reshape expresses (``as_strided``; a pooled channels-last map
flattened) as a Gather from the flattened tensor at ``Unsqueeze(Range(0, B) * stride)`` plus folded
constant offsets. When the positions count every element in row-major order (offset 0, each
axis's stride the product of the sizes after it, a dynamic count only on the outermost axis longer
than 1 and proved the data's own dim, as many positions as elements), the Gather is a Reshape.
TorchScript writes ``mask[batch_idx, kv_idx]`` the same way with strides read at run time: the
mask flattened to rows by ``Flatten(axis=2)``, gathered at ``Unsqueeze(Range(0, B)) * S +
Unsqueeze(Range(0, S))``. A stride is a constant times dims read at run time; where each is the
product of the sizes after it and the grid's long axes are, in order, the data's dims, the Gather
is an Unsqueeze of the data (two dynamic dims fit no constant shape).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnx_ir as ir

from onnxopt.ops import const_array, const_tensor, is_op
from onnxopt.passes._attention_shapes import (
    Entry,
    gathered_dim,
    piece_entries,
    same_dim,
    same_symbol,
    static_dim,
    value_rank,
)
from onnxopt.passes._evaluate import evaluate_numpy
from onnxopt.passes._shape_facts import ELEMENT_MOVES, MULTIDIRECTIONAL, axes_param, const_ints
from onnxopt.passes.base import RulePass
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import new_constant, squeeze_op

# A constant index left unfolded (folding it would grow the file: TorchScript's ``Slice(Range(0, 96,
# 1), 0, 64)``) is computed here, up to this many elements, by the exact integer kernels.
_SMALL_INDEX = 1 << 12


def _small_index(value: ir.Value | None, depth: int = 0) -> np.ndarray | None:
    """``value`` as an integer array when it is a constant, or computed from constants by a few
    index ops, and holds at most ``_SMALL_INDEX`` elements."""
    tensor = const_tensor(value) if value is not None else None
    if tensor is not None and tensor.size > _SMALL_INDEX:
        return None  # not read at all
    array = const_array(value)
    if array is not None or value is None or depth > 4:
        return array if array is not None and array.size <= _SMALL_INDEX else None
    node = value.producer()
    if node is None or node.op_type not in _INDEX_OPS or not is_op(node, node.op_type):
        return None
    inputs = [None if v is None else _small_index(v, depth + 1) for v in node.inputs]
    if any(a is None for v, a in zip(node.inputs, inputs, strict=True) if v is not None):
        return None
    if any(a is not None and not np.issubdtype(a.dtype, np.integer) for a in inputs):
        return None
    if node.op_type == "Range" and not _short_range(*inputs):
        return None  # counted before it is computed: Range(0, 2**40, 1) is not made
    results = evaluate_numpy(node, inputs)
    if not results or results[0].size > _SMALL_INDEX:
        return None
    return results[0]


def _short_range(*bounds: np.ndarray | None) -> bool:
    if len(bounds) != 3 or any(b is None or b.size != 1 for b in bounds):
        return False
    start, limit, delta = (int(b.reshape(-1)[0]) for b in bounds)  # type: ignore[union-attr]
    return delta != 0 and max(0, -(-(limit - start) // delta)) <= _SMALL_INDEX


_INDEX_OPS = frozenset({"Range", "Slice", "Reshape", "Unsqueeze", "Squeeze", "Concat", "Cast"})


def _scalar_int(value: ir.Value | None) -> int | None:
    ints = const_ints(value)
    return ints[0] if ints is not None and len(ints) == 1 else None


def _dim_read(value: ir.Value | None) -> Entry | None:
    """A scalar that is a constant, or a dim of some tensor read at run time (``Squeeze`` of a
    one-element shape read, ``Gather(Shape(x), i)``), through Casts."""
    constant = _scalar_int(value)
    if constant is not None or value is None:
        return constant
    node = value.producer()
    if is_op(node, "Cast"):
        assert node is not None
        return _dim_read(node.inputs[0])
    if is_op(node, "Squeeze") or is_op(node, "Reshape"):
        assert node is not None
        entries = piece_entries(node.inputs[0])
        return entries[0] if entries is not None and len(entries) == 1 else None
    return gathered_dim(node, scalar=True)


def _index_axis(grid_index: ir.Value, rank: int, data: ir.Value, j: int) -> int | Mismatch:
    """The axis (of a rank-``rank`` grid) along which index ``j`` counts 0, 1, ..., n - 1, with n
    provably dim j of ``data``: ``Range(0, n, 1)`` given its other axes by an Unsqueeze (dynamo) or
    a Reshape to ones and one free size (TorchScript), or a constant of that form (folded)."""
    array = _small_index(grid_index)
    if array is not None:
        long = [axis for axis, size in enumerate(array.shape) if size != 1]
        if len(long) > 1 or array.ndim > rank or not np.issubdtype(array.dtype, np.integer):
            return Mismatch(f"index {j} is a constant that does not run along one axis")
        if array.size != static_dim(data, j) or not np.array_equal(
            array.reshape(-1), np.arange(array.size)
        ):
            return Mismatch(f"index {j} is a constant that does not count the data's dim {j}")
        along = long[0] if long else array.ndim - 1
        return along + rank - array.ndim  # Expand aligns the index to the grid's trailing axes
    counting = _counting_view(grid_index, f"index {j}")
    if isinstance(counting, Mismatch):
        return counting
    own_rank, along, read, stride = counting
    if stride != 1:
        return Mismatch(f"index {j} counts in steps of {stride}")
    if own_rank > rank:
        return Mismatch(f"index {j} has more axes than the grid")
    if not same_dim(read, data, j):
        return Mismatch(f"index {j}'s Range length is not provably dim {j} of the data")
    return along + rank - own_rank  # Expand aligns the index to the grid's trailing axes


def _counting_view(index: ir.Value, what: str) -> tuple[int, int, Entry, int] | Mismatch:
    """``index`` = ``Range(0, n, 1)``, times a constant stride or not, given other axes of size 1
    by an Unsqueeze (dynamo) or a Reshape to ones and one free size (TorchScript): its rank, the
    axis it runs along, n (a constant or a dim read at run time) and the stride."""
    view = index.producer()
    source = view.inputs[0] if view is not None and view.inputs else None
    range_node = source.producer() if source is not None else None
    stride = 1
    if is_op(range_node, "Mul") and range_node is not None:  # Range(0, n, 1) * stride (dynamo)
        scaled = _scaled(range_node)
        if scaled is not None:
            stride, source = scaled
            range_node = source.producer()
    if not (is_op(view, "Unsqueeze") or is_op(view, "Reshape")) or not is_op(range_node, "Range"):
        return Mismatch(f"{what} is not an Unsqueeze or a Reshape of a Range")
    assert view is not None and range_node is not None
    if is_op(view, "Unsqueeze"):
        inserted = axes_param(view, value_rank(view.outputs[0]))
        if inserted is None:
            return Mismatch("Unsqueeze has no axes")
        if isinstance(inserted, Mismatch):
            return inserted
        own_rank = len(inserted) + 1
        (along,) = (a for a in range(own_rank) if a not in inserted)
    else:
        target = const_ints(view.inputs[1])
        free = [a for a, size in enumerate(target or ()) if size != 1]
        if target is None or len(free) != 1:
            return Mismatch(f"{what}'s Reshape is not to ones and one free size")
        own_rank, along = len(target), free[0]
    start, limit, delta = range_node.inputs[0], range_node.inputs[1], range_node.inputs[2]
    if _scalar_int(start) != 0 or _scalar_int(delta) != 1:
        return Mismatch(f"{what}'s Range does not count 0, 1, 2, ...")
    read = _dim_read(limit)
    if read is None:
        return Mismatch(f"{what}'s Range length is neither a constant nor a dim")
    return own_rank, along, read, stride


def _scaled(mul: ir.Node) -> tuple[int, ir.Value] | None:
    """A Mul of a value by one constant integer: (the integer, the value)."""
    for i in (0, 1):
        factor = _scalar_int(mul.inputs[i])
        other = mul.inputs[1 - i]
        if factor is not None and other is not None and const_array(other) is None:
            return factor, other
    return None


def _grid_indices(shape: ir.Value | None, rank: int) -> list[ir.Value] | Mismatch | None:
    """The index tensors whose broadcast ``shape`` is (Shape of an element-wise op over them), or
    None when ``shape`` is a constant (checked by the caller)."""
    if shape is None:
        return Mismatch("the Expand has no shape")
    if const_array(shape) is not None:
        return None
    node = shape.producer()
    if not is_op(node, "Shape") or node is None or node.inputs[0] is None:
        return Mismatch("the grid's shape is neither a constant nor the Shape of its indices")
    if node.attributes.get_int("start", 0) != 0 or node.attributes.get("end") is not None:
        return Mismatch("the grid's shape is a slice of a Shape")
    leaves: list[ir.Value] = []
    pending = [node.inputs[0]]
    while pending:
        value = pending.pop()
        producer = value.producer()
        if producer is not None and producer.op_type in MULTIDIRECTIONAL and producer.domain == "":
            if len(leaves) + len(pending) > 16:
                return Mismatch("the grid's shape is built from too many tensors")
            pending.extend(v for v in producer.inputs if v is not None)
        else:
            leaves.append(value)
    return leaves


def _grid_parts(concat: ir.Node, rank: int) -> tuple[list[ir.Value], ir.Value | None] | Mismatch:
    """The index tensors of a rank-``rank`` grid ``Concat(Unsqueeze(Expand(index_j, shape), -1)
    ..., axis=-1)``, and the one ``shape`` they are all expanded to."""
    if concat.attributes.get_int("axis", 0) not in (-1, rank):
        return Mismatch("the index parts are not concatenated on the last axis")
    expand_shape: ir.Value | None = None
    grid: list[ir.Value] = []
    for j, part in enumerate(concat.inputs):
        unsqueeze = part.producer() if part is not None else None
        if not is_op(unsqueeze, "Unsqueeze") or unsqueeze is None:
            return Mismatch(f"index part {j} is not an Unsqueeze")
        last = axes_param(unsqueeze, rank + 1)
        if last is None:
            return Mismatch("Unsqueeze has no axes")
        if isinstance(last, Mismatch):
            return last
        if last != (rank,):
            return Mismatch(f"index part {j} does not add the last axis")
        expand = unsqueeze.inputs[0].producer() if unsqueeze.inputs[0] is not None else None
        if not is_op(expand, "Expand") or expand is None or expand.inputs[0] is None:
            return Mismatch(f"index part {j} is not an Expand to the grid's shape")
        if expand_shape is None:
            expand_shape = expand.inputs[1]
        elif expand.inputs[1] is not expand_shape:
            return Mismatch("the index parts are expanded to different shapes")
        grid.append(expand.inputs[0])
    return grid, expand_shape


def _match(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if node.attributes.get_int("batch_dims", 0) != 0:
        return Mismatch("batch_dims is not 0")
    data, indices = node.inputs[0], node.inputs[1]
    if data is None or indices is None or data.shape is None:
        return Mismatch("the data's rank is unknown")
    k = len(data.shape)
    concat = indices.producer()
    if not is_op(concat, "Concat") or concat is None:
        return Mismatch("the indices are not a Concat of index tensors")
    if len(concat.inputs) != k:
        return Mismatch(f"the indices have {len(concat.inputs)} parts for data of rank {k}")
    rank = value_rank(node.outputs[0])
    if rank is None:
        return Mismatch("the output's rank is unknown")
    parts = _grid_parts(concat, rank)
    if isinstance(parts, Mismatch):
        return parts
    grid, expand_shape = parts
    axes: list[int] = []
    for j, index in enumerate(grid):
        axis = _index_axis(index, rank, data, j)
        if isinstance(axis, Mismatch):
            return axis
        axes.append(axis)
    if any(b <= a for a, b in itertools.pairwise(axes)):
        return Mismatch(f"the indices run along axes {axes}, not in the data's order")
    leaves = _grid_indices(expand_shape, rank)
    if isinstance(leaves, Mismatch):
        return leaves
    if leaves is None:
        target = const_array(expand_shape)
        assert target is not None
        values = [int(v) for v in target.reshape(-1)]
        if len(values) > rank or any(
            v != 1 for i, v in enumerate(values) if i + rank - len(values) not in axes
        ):
            return Mismatch("the grid's constant shape is not 1 off the index axes")
        for j, axis in enumerate(axes):
            i = axis - (rank - len(values))
            if i >= 0 and values[i] != 1 and data.shape[j] != values[i]:
                return Mismatch(f"the grid's constant shape may stretch index {j}")
    elif any(leaf not in grid for leaf in leaves):
        return Mismatch("the grid's shape is read off tensors other than its indices")
    others = [a for a in range(rank) if a not in axes]
    return Match([node], {"data": data, "axes": others})


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    data: ir.Value = match.bindings["data"]
    axes: list[int] = match.bindings["axes"]
    gather = match.root
    if not axes:
        return Replacement((), ((gather.outputs[0], data),))
    node, constants = squeeze_op("Unsqueeze", data, axes, context.opset())
    return Replacement([node], [(gather.outputs[0], node.outputs[0])], constants)


# A chain of ScatterNDs that overwrites every element -> Concat ---------------------------------


def _same_axis(a: ir.Value | None, i: int, b: ir.Value | None, j: int) -> bool:
    size = static_dim(a, i)
    return (size is not None and size == static_dim(b, j)) or same_symbol(a, i, b, j)


def _run(values: np.ndarray, size: int) -> tuple[int, int] | None:
    """``[start, stop)`` when ``values`` (negative ones counted from the end of ``size``) are
    consecutive, increasing and within ``size``."""
    if values.size == 0 or not np.issubdtype(values.dtype, np.integer):
        return None
    written = [int(v) + size if v < 0 else int(v) for v in values.reshape(-1)]
    start, stop = written[0], written[0] + len(written)
    if start < 0 or stop > size or written != list(range(start, stop)):
        return None
    return start, stop


def _zero_on_unit_axis(index: ir.Value, update: ir.Value, data: ir.Value, j: int) -> bool:
    """Index ``j`` is a constant 0 where the data and the update have one element along axis j
    (TorchScript's ``mask[:, :, :, :n] = u`` on a [B, 1, S, T] mask folds the head index to 0):
    every grid position's index j is its own."""
    array = _small_index(index)
    return (
        array is not None
        and array.size == 1
        and int(array.reshape(-1)[0]) == 0
        and static_dim(data, j) == 1
        and static_dim(update, j) == 1
    )


def _cut_from_zero(node: ir.Node) -> bool:
    """A Slice of a vector from 0, step 1 (its end read by the caller)."""
    if len(node.inputs) < 3 or "starts" in node.attributes:
        return False
    axes = _small_index(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else None
    steps = _small_index(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] else None
    return (
        _scalar_int(node.inputs[1]) == 0
        and (axes is None or axes.reshape(-1).tolist() in ([0], [-1]))
        and (steps is None or steps.reshape(-1).tolist() == [1])
    )


def _all_columns(index: ir.Value, data: ir.Value, update: ir.Value, shape: ir.Value | None) -> bool:
    """The grid's last index is ``Range(0, n, 1)``, or its Slice from 0 to m, n and m provably the
    data's last dim T (``x[..., :x.size(-1)] = u``, TorchScript's padding of a causal mask): every
    column 0..T-1 once, and the grid is T columns wide, read off the update or, where the grid's
    shape is the broadcast of its indices, because every other index is one column wide."""
    rank = value_rank(data)
    if rank is None or value_rank(index) != 1:
        return False
    counted = index.producer()
    if is_op(counted, "Slice") and counted is not None and counted.inputs[0] is not None:
        ends = piece_entries(counted.inputs[2]) if len(counted.inputs) > 2 else None
        if not _cut_from_zero(counted) or ends is None or len(ends) != 1:
            return False
        if not same_dim(ends[0], data, rank - 1):
            return False
        counted = counted.inputs[0].producer()
    if not is_op(counted, "Range") or counted is None:
        return False
    start, limit, delta = counted.inputs
    read = _dim_read(limit)
    if _scalar_int(start) != 0 or _scalar_int(delta) != 1 or read is None:
        return False
    if not same_dim(read, data, rank - 1):
        return False
    if _same_axis(update, rank - 1, data, rank - 1):
        return True
    leaves = _grid_indices(shape, rank)
    if not isinstance(leaves, list) or index not in leaves:
        return False
    ranks = [value_rank(leaf) for leaf in leaves]
    return all(
        leaf is index or rank == 0 or (rank is not None and static_dim(leaf, rank - 1) == 1)
        for leaf, rank in zip(leaves, ranks, strict=True)
    )


def _scattered_block(scatter: ir.Node) -> tuple[int, int, int | None] | Mismatch:
    """``(axis, start, stop)`` when ``scatter`` writes exactly the elements of its data whose index
    along ``axis`` lies in ``[start, stop)`` (``stop`` None: to the end): rows (constant ``[n, 1]``
    indices, axis 0), or the last axis's columns through an index grid that counts every other
    axis in order (TorchScript's ``x[..., a:b] = u``)."""
    if scatter.attributes.get_string("reduction", "none") != "none" or len(scatter.inputs) != 3:
        return Mismatch("a ScatterND combines (reduction) rather than overwrites")
    data, indices, update = scatter.inputs
    rank = value_rank(data)
    if data is None or update is None or indices is None or not rank:
        return Mismatch("the scattered tensor's rank is unknown")
    rows = _small_index(indices)
    if rows is not None and rows.ndim == 2 and rows.shape[1] == 1:
        size = static_dim(data, 0)
        run = _run(rows, size) if size else None
        if run is None:
            return Mismatch("its indices are not a constant run of consecutive whole rows")
        return (0, *run)
    concat = indices.producer()
    if not is_op(concat, "Concat") or concat is None or len(concat.inputs) != rank:
        return Mismatch("its indices are neither constant rows nor a grid over every axis")
    parts = _grid_parts(concat, rank)
    if isinstance(parts, Mismatch):
        return parts
    grid, shape = parts
    for j, index in enumerate(grid[:-1]):
        if _zero_on_unit_axis(index, update, data, j):
            continue
        axis = _index_axis(index, rank, data, j)
        if isinstance(axis, Mismatch):
            return axis
        if axis != j or not _same_axis(update, j, data, j):
            return Mismatch(f"the grid's index {j} does not count the update's dim {j} in order")
    if _all_columns(grid[-1], data, update, shape):
        return (rank - 1, 0, None)
    last, size = _small_index(grid[-1]), static_dim(data, rank - 1)
    if last is None or size is None or any(n != 1 for n in last.shape[:-1]):
        return Mismatch("the grid's last index is not a constant row of columns")
    run = _run(last, size)
    if run is None or static_dim(update, rank - 1) != run[1] - run[0]:
        return Mismatch("the grid's last index is not a run of consecutive columns")
    return (rank - 1, *run)


def _reads_shape_only(node: ir.Node, depth: int = 0) -> bool:
    """``node`` is a Shape, or a Slice whose result only Shapes read (TorchScript reads the shape
    of the slice a ``copy_`` writes to): its readers see the same whatever its input holds."""
    if is_op(node, "Shape"):
        return True
    return (
        is_op(node, "Slice")
        and depth < 2
        and all(not out.is_graph_output() for out in node.outputs)
        and all(
            _reads_shape_only(use.node, depth + 1) for out in node.outputs for use in out.uses()
        )
    )


def _match_scatters(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """A chain of ScatterNDs writing disjoint blocks along one axis that together cover the whole
    tensor: what ``x = empty(...); x[..., :a] = u; x[..., a:] = v`` exports to. The result is the
    Concat of the updates along that axis (the update itself where one write covers it all:
    ``x[..., :x.size(-1)] = u``); the first data is never read."""
    blocks: list[tuple[int, int, ir.Value]] = []
    chain: list[ir.Node] = []
    scatter, axis = node, None
    while True:
        block = _scattered_block(scatter)
        if isinstance(block, Mismatch):
            return block
        if axis is not None and block[0] != axis:
            return Mismatch("the ScatterNDs of the chain write along different axes")
        axis, start, stop = block
        if stop is None:  # every element of the data
            if blocks:
                return Mismatch("a ScatterND before the last one of the chain writes every element")
            update = scatter.inputs[2]
            assert update is not None
            return Match([scatter], {"updates": [update], "axis": axis})
        if any(start < end and begin < stop for begin, end, _ in blocks):
            return Mismatch("two ScatterNDs of the chain write the same elements")
        update = scatter.inputs[2]
        assert update is not None
        chain.append(scatter)
        blocks.append((start, stop, update))
        if sum(end - begin for begin, end, _ in blocks) == static_dim(node.inputs[0], axis):
            break
        data = scatter.inputs[0]
        producer = data.producer() if data is not None else None
        if producer is None or not is_op(producer, "ScatterND") or producer.graph is not node.graph:
            return Mismatch("the scattered blocks do not cover the whole tensor")
        assert data is not None
        if data.is_graph_output() or any(
            use.node is not scatter and not _reads_shape_only(use.node) for use in data.uses()
        ):
            return Mismatch("a partly written tensor of the chain is read other than for its shape")
        scatter = producer
    updates = [update for _, _, update in sorted(blocks, key=lambda block: block[0])]
    return Match([*reversed(chain)], {"updates": updates, "axis": axis})


def _rewrite_scatters(match: Match, context: RewriteContext) -> Replacement:
    """The Concat stands for the result; the first data, whose shape every partly written tensor
    has, stands for them where their shape is read."""
    result = match.root.outputs[0]
    if len(match.bindings["updates"]) == 1:  # one write of every element: the update itself
        return Replacement([], [(result, match.bindings["updates"][0])])
    axis = ir.AttrInt64("axis", match.bindings["axis"])
    concat = ir.Node("", "Concat", match.bindings["updates"], [axis])
    if result.dtype is not None:
        concat.outputs[0].dtype = result.dtype
    concat.outputs[0].shape = result.shape
    first = match.nodes[0].inputs[0]
    assert first is not None
    partial = [(scatter.outputs[0], first) for scatter in match.nodes[:-1]]
    return Replacement([concat], [(result, concat.outputs[0]), *partial])


# Element moves, and the gathers that select from their first input: a tensor of one repeated
# value stays that value through them.
_SELECTING = ELEMENT_MOVES | {"GatherElements", "GatherND"}


_INTEGERS = frozenset(
    {ir.DataType.INT8, ir.DataType.INT16, ir.DataType.INT32, ir.DataType.INT64,
     ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64}
)  # fmt: skip


def _uniform_int(value: ir.Value | None, depth: int = 0) -> int | None:
    """The integer every element of ``value`` provably equals (a constant of one value, moved or
    selected from), or None. Constants over 2**20 elements are not read (a buffer of token types
    has one element per position)."""
    if value is None or value.dtype not in _INTEGERS:
        return None
    tensor = const_tensor(value)
    if tensor is not None and tensor.size > 1 << 20:
        return None
    array = const_array(value)
    if array is not None:
        if array.size == 0 or not np.issubdtype(array.dtype, np.integer):
            return None
        first = array.reshape(-1)[0]
        return int(first) if bool(np.all(array == first)) else None
    node = value.producer()
    if (
        node is None
        or depth > 16
        or not is_op(node, node.op_type)
        or node.op_type not in _SELECTING
    ):
        return None
    return _uniform_int(node.inputs[0], depth + 1)


def _covers(partner: ir.Value | None, gathered: ir.Value) -> bool:
    """``partner`` has every dim of ``gathered`` (right-aligned), so broadcasting against it gives
    the same shape whether or not ``gathered`` takes part."""
    rank, other = value_rank(gathered), value_rank(partner)
    if rank is None or other is None or other < rank:
        return False
    offset = other - rank
    return all(
        static_dim(gathered, i) == 1 or same_symbol(partner, i + offset, gathered, i)
        for i in range(rank)
    )


def _match_uniform_gather(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    # The indices first: the table (a word embedding can be gigabytes) is read only for a
    # Gather at one index, and only the row is kept.
    index = _uniform_int(node.inputs[1] if len(node.inputs) > 1 else None)
    if index is None:
        return Mismatch("the indices are not all one constant", candidate=False)
    table = const_array(node.inputs[0])
    if table is None or table.ndim == 0:
        return Mismatch("the gathered table is not a constant", candidate=False)
    if node.attributes.get_int("axis", 0) % table.ndim != 0:
        return Mismatch("gathered along another axis than the first")
    if not -table.shape[0] <= index < table.shape[0]:
        return Mismatch(f"the index {index} is out of the table's {table.shape[0]} rows")
    result = node.outputs[0]
    if result.is_graph_output() or not result.uses():
        return Mismatch("the gathered rows are a graph output or unused")
    for use in result.uses():
        user = use.node
        if not is_op(user, user.op_type) or user.op_type not in MULTIDIRECTIONAL:
            return Mismatch(f"the gathered rows are read by {user.op_type}")
        if not any(_covers(v, result) for i, v in enumerate(user.inputs) if i != use.idx):
            return Mismatch(
                f"cannot prove {user.op_type}'s other operand has the gathered rows' shape"
            )
    return Match([node], {"row": np.array(table[index])})


def _rewrite_uniform_gather(match: Match, context: RewriteContext) -> Replacement:
    gather = match.root
    row = new_constant(match.bindings["row"], gather.inputs[0].name)  # type: ignore[union-attr]
    return Replacement((), [(gather.outputs[0], row)], constants=[row])


# A Gather of a flattened tensor at its own row-major positions -> Reshape ---------------------

# Constant parts of a linear index are read up to this many elements (32 MiB of int64).
_LINEAR_INDEX_LIMIT = 1 << 22
_MAX_ADDENDS = 16


def _index_constant(value: ir.Value) -> np.ndarray | None:
    tensor = const_tensor(value)
    if tensor is not None:
        if tensor.size > _LINEAR_INDEX_LIMIT:
            return None
        array = const_array(value)
        return array if array is not None and np.issubdtype(array.dtype, np.integer) else None
    return _small_index(value)


def _addends(value: ir.Value) -> list[ir.Value] | None:
    """The values an Add tree sums into ``value``."""
    found: list[ir.Value] = []
    pending = [value]
    while pending:
        current = pending.pop()
        node = current.producer()
        if is_op(node, "Add") and node is not None and _index_constant(current) is None:
            if len(found) + len(pending) >= _MAX_ADDENDS or None in node.inputs:
                return None
            pending.extend(v for v in node.inputs if v is not None)
        else:
            found.append(current)
    return found


def _constant_axes(array: np.ndarray, rank: int) -> tuple[int, list[int]] | None:
    """``array`` (right-aligned in ``rank`` axes) as ``offset + sum_a i_a * stride_a``: the offset
    and each axis's stride, or None when it is not such a sum."""
    if array.ndim > rank:
        return None
    grid = array.reshape((1,) * (rank - array.ndim) + array.shape).astype(np.int64)
    if grid.size == 0:
        return None
    offset = int(grid.reshape(-1)[0])
    strides: list[int] = []
    rebuilt = np.full(grid.shape, offset, np.int64)
    for axis in range(rank):
        size = int(grid.shape[axis])
        if size == 1:
            strides.append(0)
            continue
        first = [0] * rank
        first[axis] = 1
        stride = int(grid[tuple(first)]) - offset
        strides.append(stride)
        steps = np.arange(size, dtype=np.int64) * stride
        rebuilt = rebuilt + steps.reshape([size if a == axis else 1 for a in range(rank)])
    return (offset, strides) if np.array_equal(rebuilt, grid) else None


# A stride: a constant times a product of dims read at run time (TorchScript scales a batch count
# by the sequence length it reads off a shape).
Stride = tuple[int, tuple[Entry, ...]]


def _dim_factor(mul: ir.Node) -> tuple[Entry, ir.Value] | None:
    """A Mul of a value by one dim read at run time (a scalar, or a one-element vector, which
    broadcasting leaves the value's shape alone): (the dim, the value)."""
    for i in (0, 1):
        factor, other = mul.inputs[i], mul.inputs[1 - i]
        if factor is None or other is None or const_array(other) is not None:
            continue
        if value_rank(factor) == 0:
            read = _dim_read(factor)
        else:
            entries = piece_entries(factor) if static_dim(factor, 0) == 1 else None
            read = entries[0] if entries is not None and len(entries) == 1 else None
        if isinstance(read, tuple):
            return read, other
    return None


def _linear_axes(indices: ir.Value, rank: int) -> tuple[list[Entry], list[Stride], int] | Mismatch:
    """The indices as a grid counting along each axis with a stride from an offset: each axis's
    size (an int or a dim read at run time) and stride, and the offset. Sums of constants
    (folded) and strided Range counts (``Unsqueeze(Range(0, n, 1) * stride)``: a dim the export
    left dynamic; the stride a constant or, TorchScript's, a dim read at run time)."""
    addends = _addends(indices)
    if addends is None:
        return Mismatch("the indices sum too many parts")
    total: np.ndarray | None = None
    counts: dict[int, tuple[Entry, Stride]] = {}
    for part in addends:
        array = _index_constant(part)
        if array is not None:
            if array.ndim > rank:
                return Mismatch("a constant part of the indices has more axes than they have")
            if total is not None:
                try:
                    shape = np.broadcast_shapes(total.shape, array.shape)
                except ValueError:
                    return Mismatch("the constant parts of the indices do not broadcast")
                if math.prod(shape) > _LINEAR_INDEX_LIMIT:
                    return Mismatch("the constant parts of the indices broadcast too large")
            total = array if total is None else np.add(total, array)
            continue
        factor: Stride = (1, ())
        inner = part
        node = part.producer()
        if is_op(node, "Mul") and node is not None:
            scaled = _scaled(node)
            by_dim = _dim_factor(node) if scaled is None else None
            if scaled is not None:
                factor, inner = (scaled[0], ()), scaled[1]
            elif by_dim is not None:
                factor, inner = (1, (by_dim[0],)), by_dim[1]
            else:
                return Mismatch("the indices are multiplied by something other than a constant")
        counting = _counting_view(inner, "a part of the indices")
        if isinstance(counting, Mismatch):
            return counting
        own_rank, along, size, stride = counting
        axis = along + rank - own_rank
        if own_rank > rank or axis in counts:
            return Mismatch("two counts run along one axis of the indices")
        counts[axis] = (size, (stride * factor[0], factor[1]))
    offset = 0
    strides: list[Stride] = [(0, ())] * rank
    sizes: list[Entry] = [1] * rank
    if total is not None:
        found = _constant_axes(total, rank)
        if found is None:
            return Mismatch("the constant part of the indices is not a strided grid")
        offset, strides = found[0], [(stride, ()) for stride in found[1]]
        shape = (1,) * (rank - total.ndim) + total.shape
        sizes = [int(n) for n in shape]
    for axis, (size, step) in counts.items():
        if sizes[axis] != 1:
            return Mismatch("two counts run along one axis of the indices")
        sizes[axis], strides[axis] = size, step
    return sizes, strides, offset


def _same_entry(a: Entry, b: Entry) -> bool:
    """Two sizes provably equal: equal ints, reads of one dim, or dims with one symbol."""
    if isinstance(b, tuple):
        return same_dim(a, b[1], b[2])
    if isinstance(a, tuple):
        return same_dim(b, a[1], a[2])
    return a == b


def _same_stride(a: Stride, b: Stride) -> bool:
    """Equal constants times the same dims (in any order)."""
    if a[0] != b[0] or len(a[1]) != len(b[1]):
        return False
    left = list(b[1])
    for dim in a[1]:
        twin = next((i for i, other in enumerate(left) if _same_entry(dim, other)), None)
        if twin is None:
            return False
        left.pop(twin)
    return True


def _row_major(sizes: list[Entry], strides: list[Stride]) -> bool:
    """The strides count a tensor of these sizes in row-major order (any stride along an axis
    of size 1): each stride is the product of the sizes after it."""
    expected: Stride = (1, ())
    for size, stride in zip(reversed(sizes), reversed(strides), strict=True):
        if size == 1:
            continue
        if not _same_stride(stride, expected):
            return False
        if isinstance(size, int):
            expected = (expected[0] * size, expected[1])
        else:
            expected = (expected[0], (*expected[1], size))
    return True


def _counts_all(sizes: list[Entry], dims: list[int | ir.SymbolicDim], source: ir.Value) -> bool:
    """The sizes' product is provably the product of ``dims`` (``source``'s first dims), with at
    most one of the sizes read at run time."""
    static = [d for d in dims if isinstance(d, int)]
    free = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    product = int(np.prod(static, dtype=np.int64))
    fixed = [s for s in sizes if isinstance(s, int)]
    read = [s for s in sizes if not isinstance(s, int)]
    if len(read) != len(free) or len(read) > 1:
        return False
    if read and not same_dim(read[0], source, free[0]):
        return False
    return product == int(np.prod(fixed, dtype=np.int64))


def _axis_by_axis(sizes: list[Entry], source: ir.Value, counted: int) -> list[int] | None:
    """The grid's axes longer than 1 are, in order, ``source``'s first ``counted`` dims, each
    provably equal (a read of it, its symbol, its size): the gathered rows are the source with
    unit axes inserted. The grid's unit axes, or None."""
    long = [axis for axis, size in enumerate(sizes) if size != 1]
    if len(long) != counted:
        return None
    if not all(same_dim(sizes[axis], source, j) for j, axis in enumerate(long)):
        return None
    return [axis for axis, size in enumerate(sizes) if size == 1]


def _flattened(data: ir.Value) -> tuple[ir.Value, int] | None:
    """``data`` as a flattening of a tensor: (the tensor, how many of its leading dims the data's
    first axis counts). A 1-D Reshape counts them all; ``Flatten(x, axis=k)`` ([prod(x[:k]),
    prod(x[k:])], TorchScript's advanced indexing) the first k; a 1-D tensor is its own."""
    node = data.producer()
    source = node.inputs[0] if node is not None and node.inputs else None
    source_rank = value_rank(source)
    if value_rank(data) == 1:
        if is_op(node, "Reshape") and source is not None and source_rank is not None:
            return source, source_rank
        return data, 1
    if is_op(node, "Flatten") and node is not None and source is not None and source_rank:
        axis = node.attributes.get_int("axis", 1)
        axis = axis + source_rank if axis < 0 else axis
        if value_rank(data) == 2 and 0 <= axis <= source_rank:
            return source, axis
    return None


def _match_linear_gather(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    data, indices = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    flattened = _flattened(data) if data is not None else None
    if data is None or indices is None or flattened is None:
        return Mismatch("not a Gather from a flattened tensor", candidate=False)
    if node.attributes.get_int("axis", 0) not in (0, -(value_rank(data) or 1)):
        return Mismatch("it does not gather along the first axis", candidate=False)
    rank = value_rank(indices)
    if rank is None or rank == 0:
        return Mismatch("the indices' rank is unknown or 0", candidate=False)
    if indices.producer() is None and const_tensor(indices) is None:
        return Mismatch("the indices are an input", candidate=False)
    found = _linear_axes(indices, rank)
    if isinstance(found, Mismatch):
        return Mismatch(found.reason, candidate=False)
    sizes, strides, offset = found
    # A view of several axes (an exported as_strided) is worth a note; a 1-D pick is not.
    view = rank >= 2
    if offset != 0:
        return Mismatch(f"the indices start at {offset}, not 0", candidate=view)
    if not _row_major(sizes, strides):
        return Mismatch("the indices do not visit the data in row-major order", candidate=view)
    if any(isinstance(size, int) and size == 0 for size in sizes):
        return Mismatch("the indices are empty", candidate=view)
    source, counted = flattened
    dims = list(source.shape) if source.shape is not None else None
    if dims is None:
        return Mismatch("the flattened tensor's shape is unknown", candidate=view)
    trailing = [d for d in dims[counted:] if isinstance(d, int)]
    if _counts_all(sizes, dims[:counted], source) and len(trailing) == len(dims) - counted:
        # The result's shape as a constant: the grid's (one dim left to -1) and the rows'.
        rows = [math.prod(trailing)] if value_rank(data) == 2 else []
        target = [size if isinstance(size, int) else -1 for size in sizes] + rows
        return Match([node], {"data": data, "target": target})
    unit = _axis_by_axis(sizes, source, counted)
    if unit is None:
        return Mismatch("cannot prove the indices count every element of the data", candidate=view)
    if len(dims) - counted > 1:
        return Mismatch("the rows merge several dims of the flattened tensor", candidate=view)
    # The source itself with the grid's unit axes inserted (and the rows' 1 when Flatten's
    # second axis is empty): several dims read at run time, none written as a constant.
    if value_rank(data) == 2 and counted == len(dims):
        unit.append(rank)
    return Match([node], {"data": source, "axes": unit})


def _rewrite_linear_gather(match: Match, context: RewriteContext) -> Replacement:
    data = match.bindings["data"]
    if "axes" in match.bindings:
        view, constants = squeeze_op("Unsqueeze", data, match.bindings["axes"], context.opset())
    else:
        shape = new_constant(np.array(match.bindings["target"], np.int64), "gathered_shape")
        view, constants = ir.node("Reshape", [data, shape]), (shape,)
    return Replacement([view], [(match.root.outputs[0], view.outputs[0])], constants)


RULES = (
    Rule("GatherND(index grid)->Unsqueeze", "GatherND", _match, _rewrite),
    Rule("Gather(table, one index)->row", "Gather", _match_uniform_gather, _rewrite_uniform_gather),
    Rule(
        "Gather(flat, row-major index)->Reshape",
        "Gather",
        _match_linear_gather,
        _rewrite_linear_gather,
    ),
    Rule("ScatterND blocks->Concat", "ScatterND", _match_scatters, _rewrite_scatters),
)


class SimplifyIndexGridsPass(RulePass):
    """GatherND over a grid of Range indices that visits the data in order -> Unsqueeze(data);
    a Gather at one constant index -> that row; ScatterNDs that overwrite every block -> Concat;
    a Gather of flattened data at its own row-major positions -> Reshape (or Unsqueeze, strides
    read at run time)."""

    name = "simplify-index-grids"
    summary = (
        "replace a GatherND over an in-order Range index grid (exported masks) by an Unsqueeze;"
        " ScatterNDs that overwrite a whole tensor block by block by a Concat; a Gather of a"
        " flattened tensor at its own row-major positions (an exported as_strided, TorchScript's"
        " mask[batch_idx, kv_idx]) by a Reshape or an Unsqueeze"
    )
    rules = RULES
