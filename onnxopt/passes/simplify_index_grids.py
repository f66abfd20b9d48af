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
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx_ir as ir

from onnxopt.ops import const_array, is_op
from onnxopt.passes._attention_shapes import gathered_dim, same_symbol, shape_slice
from onnxopt.passes._shape_facts import int_param, normalize_axes
from onnxopt.passes.base import Pass, PassResult
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule, apply_rules

# Element-wise ops whose output shape is the broadcast of their inputs' shapes.
_BROADCASTING = frozenset({"Max", "Min", "Add", "Sub", "Mul", "And", "Or", "Equal", "Less"})


def _rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def _scalar_int(value: ir.Value | None) -> int | None:
    array = const_array(value)
    if array is None or array.size != 1 or not np.issubdtype(array.dtype, np.integer):
        return None
    return int(array.reshape(-1)[0])


def _dim_read(value: ir.Value | None) -> int | tuple[ir.Value, int] | None:
    """A scalar that is a constant, or dim i of some tensor read at run time: (tensor, i)."""
    constant = _scalar_int(value)
    if constant is not None or value is None:
        return constant
    node = value.producer()
    if node is not None and node.op_type in ("Squeeze", "Reshape", "Cast") and node.domain == "":
        return _dim_read(node.inputs[0]) if node.op_type == "Cast" else _one_dim(node.inputs[0])
    return _one_dim(value)


def _one_dim(value: ir.Value | None) -> int | tuple[ir.Value, int] | None:
    """A one-element read of a shape: ``Shape(x)[i:i+1]``, ``Gather(Shape(x), i or [i])``."""
    if value is None:
        return None
    constant = _scalar_int(value)
    if constant is not None:
        return constant
    sliced = shape_slice(value) if value.producer() is not None else None
    if sliced is not None:
        source, start, end = sliced
        rank = _rank(source)
        if start < 0 and rank is not None:
            start += rank
        one = end == start + 1 or (end is None and rank == start + 1)
        return (source, start) if start >= 0 and one else None
    for scalar in (True, False):
        entry = gathered_dim(value.producer(), scalar=scalar)
        if isinstance(entry, tuple):
            return entry[1], entry[2]
    return None


def _is_dim_of(read: int | tuple[ir.Value, int] | None, data: ir.Value, index: int) -> bool:
    if read is None or data.shape is None:
        return False
    if isinstance(read, int):
        return read > 0 and data.shape[index] == read
    source, i = read
    return (source is data and i == index) or same_symbol(source, i, data, index)


def _axes(node: ir.Node, rank: int | None) -> tuple[int, ...] | Mismatch:
    axes = int_param(node, "axes", 1)
    if axes is None:
        return Mismatch(f"{node.op_type} has no axes")
    if isinstance(axes, Mismatch):
        return axes
    normalized = normalize_axes(axes, rank)
    if normalized is None:
        return Mismatch(f"{node.op_type} axes {list(axes)} are negative and the rank is unknown")
    return normalized


def _index_axis(grid_index: ir.Value, rank: int, data: ir.Value, j: int) -> int | Mismatch:
    """The axis (of a rank-``rank`` grid) along which ``Unsqueeze(Range(0, n_j, 1))`` runs."""
    unsqueeze = grid_index.producer()
    source = unsqueeze.inputs[0] if unsqueeze is not None and unsqueeze.inputs else None
    range_node = source.producer() if source is not None else None
    if not is_op(unsqueeze, "Unsqueeze") or not is_op(range_node, "Range"):
        return Mismatch(f"index {j} is not an Unsqueeze of a Range")
    assert unsqueeze is not None and range_node is not None
    inserted = _axes(unsqueeze, _rank(unsqueeze.outputs[0]))
    if isinstance(inserted, Mismatch):
        return inserted
    own_rank = len(inserted) + 1
    if own_rank > rank:
        return Mismatch(f"index {j} has more axes than the grid")
    start, limit, delta = range_node.inputs[0], range_node.inputs[1], range_node.inputs[2]
    if _scalar_int(start) != 0 or _scalar_int(delta) != 1:
        return Mismatch(f"index {j}'s Range does not count 0, 1, 2, ...")
    if not _is_dim_of(_dim_read(limit), data, j):
        return Mismatch(f"index {j}'s Range length is not provably dim {j} of the data")
    (axis,) = (a for a in range(own_rank) if a not in inserted)
    return axis + rank - own_rank  # Expand aligns the index to the grid's trailing axes


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
        if producer is not None and producer.op_type in _BROADCASTING and producer.domain == "":
            if len(leaves) + len(pending) > 16:
                return Mismatch("the grid's shape is built from too many tensors")
            pending.extend(v for v in producer.inputs if v is not None)
        else:
            leaves.append(value)
    return leaves


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
    rank = _rank(node.outputs[0])
    if rank is None:
        return Mismatch("the output's rank is unknown")
    if concat.attributes.get_int("axis", 0) not in (-1, rank):
        return Mismatch("the index parts are not concatenated on the last axis")
    axes: list[int] = []
    expand_shape: ir.Value | None = None
    grid: list[ir.Value] = []
    for j, part in enumerate(concat.inputs):
        unsqueeze = part.producer() if part is not None else None
        if not is_op(unsqueeze, "Unsqueeze") or unsqueeze is None:
            return Mismatch(f"index part {j} is not an Unsqueeze")
        last = _axes(unsqueeze, rank + 1)
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
        axis = _index_axis(expand.inputs[0], rank, data, j)
        if isinstance(axis, Mismatch):
            return axis
        axes.append(axis)
        grid.append(expand.inputs[0])
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
    if context.opset() < 13:
        node = ir.node("Unsqueeze", [data], {"axes": axes})
        constants: tuple[ir.Value, ...] = ()
    else:
        constant = ir.Value(
            shape=ir.Shape([len(axes)]),
            type=ir.TensorType(ir.DataType.INT64),
            const_value=ir.tensor(np.array(axes, dtype=np.int64)),
        )
        node = ir.node("Unsqueeze", [data, constant])
        constants = (constant,)
    return Replacement([node], [(gather.outputs[0], node.outputs[0])], constants)


RULES = (Rule("GatherND(index grid)->Unsqueeze", "GatherND", _match, _rewrite),)


class SimplifyIndexGridsPass(Pass):
    """GatherND over a grid of Range indices that visits the data in order -> Unsqueeze(data)."""

    name = "simplify-index-grids"
    summary = (
        "replace a GatherND over an in-order Range index grid (exported masks) by an Unsqueeze"
    )

    def call(self, model: ir.Model) -> PassResult:
        stats, notes = apply_rules(model, RULES, self.options)
        return PassResult(model, modified=bool(stats), stats=stats, notes=notes)
