"""Reading the shape plumbing around attention blocks, shared by the attention fusions.

Exporters build Reshape targets from constants and run-time shape reads (``Shape``, ``Slice`` of
it, ``Gather`` of one dim, ``Concat`` of the pieces); the fusions need to know which dim of which
tensor each entry is, and whether two dims are provably equal (the same read, the same symbol, or
the same static size). The helpers here are pure: they read the graph and never change it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnxopt.ops import const_array, is_op

# Below any real score and far from float32's lowest, which ORT's Attention-23 reads as "masked out".
MASK_FLOOR = -1e30
# The highest masked_fill value fuse-attention fuses (as MASK_FLOOR): float32 scores near it are 8
# apart, so a kept score that low, the one case where the two fills differ, holds no softmax.
RAISED_FILL_LIMIT = -1e8
# Element types fuse-attention and fuse-packed-attention rewrite: ONNX Runtime (1.32) runs
# MultiHeadAttention, Attention and Attention-23 in both on CPU, and CUDA (where half-precision
# models are deployed) has float16 kernels for each, attention_bias included.
ATTENTION_DTYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})


def producer_of(value: ir.Value | None, op_type: str) -> ir.Node | None:
    if value is None:
        return None
    node = value.producer()
    return node if is_op(node, op_type) else None


def scalar_factor(value: ir.Value | None) -> float | None:
    array = const_array(value)
    if array is None or array.size != 1 or not np.issubdtype(array.dtype, np.floating):
        return None
    result = float(array.reshape(-1)[0])
    return result if np.isfinite(result) and result != 0.0 else None


def peel_scale(value: ir.Value) -> tuple[ir.Value, float, list[ir.Node]]:
    """Strip scalar-constant Mul/Div nodes off ``value``: value = base * factor."""
    factor = 1.0
    nodes: list[ir.Node] = []
    while True:
        node = value.producer()
        if is_op(node, "Mul"):
            assert node is not None
            left, right = node.inputs[0], node.inputs[1]
            if (s := scalar_factor(right)) is not None and left is not None:
                factor *= s
                nodes.append(node)
                value = left
                continue
            if (s := scalar_factor(left)) is not None and right is not None:
                factor *= s
                nodes.append(node)
                value = right
                continue
        if is_op(node, "Div"):
            assert node is not None
            s = scalar_factor(node.inputs[1])
            if s is not None and node.inputs[0] is not None:
                factor /= s
                nodes.append(node)
                value = node.inputs[0]
                continue
        return value, factor, nodes


def softmax_axis(softmax: ir.Node, opset: int) -> int:
    """The Softmax's axis attribute, or its default: 1 before opset 13 (where it normalizes the
    dims from that axis on, flattened), -1 from 13."""
    return softmax.attributes.get_int("axis", -1 if opset >= 13 else 1)


def transpose_perm(node: ir.Node | None) -> list[int] | None:
    if not is_op(node, "Transpose"):
        return None
    assert node is not None
    perm = node.attributes.get_ints("perm", None)
    return list(perm) if perm is not None else None


Entry = int | tuple[str, ir.Value, int]


def shape_slice(value: ir.Value) -> tuple[ir.Value, int, int | None] | None:
    """``value`` = Shape(src)[start:end] as (src, start, end), or None."""
    node = value.producer()
    if is_op(node, "Shape"):
        assert node is not None and node.inputs[0] is not None
        start = node.attributes.get_int("start", 0)
        end = node.attributes.get_int("end", None)
        return node.inputs[0], start, end
    if is_op(node, "Slice"):
        assert node is not None
        source = node.inputs[0]
        if source is None or not is_op(source.producer(), "Shape"):
            return None
        shape_node = source.producer()
        assert shape_node is not None
        if (
            shape_node.attributes.get_int("start", 0) != 0
            or shape_node.attributes.get("end") is not None
        ):
            return None
        starts = const_array(node.inputs[1])
        ends = const_array(node.inputs[2])
        axes = (
            const_array(node.inputs[3])
            if len(node.inputs) > 3 and node.inputs[3] is not None
            else None
        )
        steps = (
            const_array(node.inputs[4])
            if len(node.inputs) > 4 and node.inputs[4] is not None
            else None
        )
        if starts is None or ends is None or starts.size != 1 or ends.size != 1:
            return None
        if (axes is not None and int(axes.reshape(-1)[0]) != 0) or (
            steps is not None and int(steps.reshape(-1)[0]) != 1
        ):
            return None
        start = int(starts.reshape(-1)[0])
        end = int(ends.reshape(-1)[0])
        src = shape_node.inputs[0]
        assert src is not None
        return src, max(start, -(2**31)), None if end >= 2**31 else end
    return None


def target_entries(
    value: ir.Value | None, rank_of: dict[int, int] | None = None
) -> list[Entry] | None:
    """The entries of a Reshape target (a constant, or a Concat of constants and shape reads)."""
    if value is None:
        return None
    array = const_array(value)
    if array is not None:
        return [int(x) for x in array.reshape(-1)]
    node = value.producer()
    if is_op(node, "Concat"):
        assert node is not None
        entries: list[Entry] = []
        for piece in node.inputs:
            part = piece_entries(piece)
            if part is None:
                return None
            entries.extend(part)
        return entries
    return piece_entries(value)


def piece_entries(value: ir.Value | None) -> list[Entry] | None:
    if value is None:
        return None
    array = const_array(value)
    if array is not None:
        return [int(x) for x in array.reshape(-1)]
    sliced = shape_slice(value)
    if sliced is not None:
        source, start, end = sliced
        rank = value_rank(source)
        if rank is None:
            if start >= 0 and end is not None and end > start:
                return [("dim", source, i) for i in range(start, end)]
            return None
        lo = max(start + rank, 0) if start < 0 else start
        hi = rank if end is None else (end + rank if end < 0 else min(end, rank))
        return [("dim", source, i) for i in range(lo, hi)]
    node = value.producer()
    if is_op(node, "Slice"):
        assert node is not None
        return _sliced_entries(node)
    if is_op(node, "Concat"):  # a Concat of pieces that other targets also read
        return target_entries(value)
    # Unsqueeze(Gather(Shape(src), i)) / Reshape(Gather(...)): one dim as a 1-element tensor
    if is_op(node, "Unsqueeze") or is_op(node, "Reshape"):
        assert node is not None
        inner = node.inputs[0]
        dim = gathered_dim(inner.producer() if inner is not None else None, scalar=True)
        return None if dim is None else [dim]
    # Gather(Shape(src), [i]): the same, indexed by a one-element vector
    dim = gathered_dim(node, scalar=False)
    return None if dim is None else [dim]


def _sliced_entries(node: ir.Node) -> list[Entry] | None:
    """``Slice(v, [start], [end])`` (axis 0, step 1) of a vector whose entries are readable: the
    dynamo exporter slices [B, H] off the [B, H, S, d] target it built for repeat_kv."""
    data, starts, ends, *rest = [*node.inputs, None, None][:5]
    start, end = const_array(starts), const_array(ends)
    if start is None or end is None or start.size != 1 or end.size != 1:
        return None
    axes = const_array(rest[0]) if rest[0] is not None else np.array([0])
    steps = const_array(rest[1]) if rest[1] is not None else np.array([1])
    if axes is None or axes.size != 1 or int(axes.reshape(-1)[0]) not in (0, -1):
        return None
    if steps is None or steps.size != 1 or int(steps.reshape(-1)[0]) != 1:
        return None
    entries = target_entries(data)
    if entries is None:
        return None
    # Python's slice clamps out-of-range bounds as ONNX Slice does with step 1.
    return entries[int(start.reshape(-1)[0]) : int(end.reshape(-1)[0])]


def view_entries(view: ir.Value) -> list[Entry | None] | None:
    """The entries of the Reshape target ``view`` was made with; None for an entry that cannot be
    read (when the piece's length is known)."""
    reshape = producer_of(view, "Reshape")
    target = reshape.inputs[1] if reshape is not None and len(reshape.inputs) > 1 else None
    whole = target_entries(target)
    if whole is not None or target is None:
        return list(whole) if whole is not None else None
    concat = producer_of(target, "Concat")
    if concat is None:
        return None
    entries: list[Entry | None] = []
    for piece in concat.inputs:
        part = piece_entries(piece)
        length = static_dim(piece, 0) if value_rank(piece) == 1 else None
        if part is not None:
            entries.extend(part)
        elif length is not None:
            entries.extend([None] * length)
        else:
            return None
    return entries


def gathered_dim(gather: ir.Node | None, *, scalar: bool) -> Entry | None:
    """``Gather(Shape(src), i)`` (``scalar``) or ``Gather(Shape(src), [i])`` as dim i of src."""
    if not is_op(gather, "Gather"):
        return None
    assert gather is not None
    index = const_array(gather.inputs[1])
    shape_of = gather.inputs[0]
    shape_node = shape_of.producer() if shape_of is not None else None
    if (
        index is None
        or index.size != 1
        or index.ndim != (0 if scalar else 1)
        or not is_op(shape_node, "Shape")
    ):
        return None
    assert shape_node is not None and shape_node.inputs[0] is not None
    if (
        shape_node.attributes.get_int("start", 0) != 0
        or shape_node.attributes.get("end") is not None
    ):
        return None
    i = int(index.reshape(-1)[0])
    if i < 0:
        rank = value_rank(shape_node.inputs[0])
        if rank is None:
            return None
        i += rank
    return ("dim", shape_node.inputs[0], i)


def scaled_dim_reads(piece: ir.Value | None) -> list[tuple[Entry, int]]:
    """(dim read b, constant c) for a one-element target piece ``Mul(b, c)``, b a read of one dim
    (TorchScript's ``batch_size * num_heads``: ``Unsqueeze(Mul(Gather(Shape(x), 0), H))``, or b
    a Squeeze of a one-dim Slice of the Shape, as tf2onnx writes it); both
    operand orders, so at most two pairs, none when the piece is anything else."""
    if piece is None or value_rank(piece) != 1 or static_dim(piece, 0) != 1:
        return []
    product = piece.producer()
    if is_op(product, "Unsqueeze") or is_op(product, "Reshape"):
        assert product is not None
        inner = product.inputs[0]
        product = inner.producer() if inner is not None and value_rank(inner) == 0 else None
    if not is_op(product, "Mul") or product is None or len(product.inputs) != 2:
        return []
    found: list[tuple[Entry, int]] = []
    for read, factor in (product.inputs, product.inputs[::-1]):
        constant = const_array(factor)
        if read is None or constant is None or constant.size != 1:
            continue
        if not np.issubdtype(constant.dtype, np.integer):
            continue
        dim = gathered_dim(read.producer(), scalar=value_rank(read) == 0)
        if dim is None and value_rank(read) == 0:  # Squeeze(Shape(x)[i:i+1]) (tf2onnx)
            scalar = scalar_dim_read(read)
            dim = None if scalar is None else ("dim", scalar[0], scalar[1])
        if dim is not None:
            found.append((dim, int(constant.reshape(-1)[0])))
    return found


def scalar_dim_read(value: ir.Value | None) -> tuple[ir.Value, int] | None:
    """``value`` = one dim of a tensor's shape as a scalar: Gather(Shape(x), i) or
    Squeeze(Shape(x)[i:i+1]); returns (x, i)."""
    node = value.producer() if value is not None else None
    if is_op(node, "Squeeze") and node is not None and node.inputs[0] is not None:
        entries = target_entries(node.inputs[0])
    else:
        dim = gathered_dim(node, scalar=True)
        entries = None if dim is None else [dim]
    if entries is None or len(entries) != 1 or not isinstance(entries[0], tuple):
        return None
    return entries[0][1], entries[0][2]


def peel_torch_expand_shape(value: ir.Value) -> ir.Value:
    """TorchScript writes ``expand``'s target as ``Where(Equal(s, -1), ones, s)`` ("-1: keep the dim"),
    or, once fold-shape-values has folded the Equal, ``Where(flags, ones, s)``.

    With ``s`` read as entries, -1 then means 1 under Expand's broadcasting, which keeps the dim
    as well; so ``s`` can be read in its place (a -1 entry is treated as 1 by the caller).
    """
    where = value.producer()
    if not is_op(where, "Where"):
        return value
    assert where is not None
    cond, ones, shape = where.inputs[0], where.inputs[1], where.inputs[2]
    equal = cond.producer() if cond is not None else None
    ones_array = const_array(ones)
    if shape is None or ones_array is None or not (ones_array == 1).all():
        return value
    flags = const_array(cond)
    if flags is not None and flags.dtype == np.bool_:
        # the Equal folded (fold-shape-values: a dim read off a shape is never -1): true
        # exactly where ``s`` holds a literal -1
        entries = target_entries(shape)
        if entries is None or flags.ndim != 1 or flags.size != len(entries):
            return value
        if any(bool(f) != (e == -1) for f, e in zip(flags, entries, strict=True)):
            return value
        return shape
    if not is_op(equal, "Equal"):
        return value
    assert equal is not None
    minus_one = const_array(equal.inputs[1])
    if equal.inputs[0] is not shape or minus_one is None or not (minus_one == -1).all():
        return value
    return shape


def value_rank(value: ir.Value | None) -> int | None:
    if value is None:
        return None
    if value.shape is not None:
        return len(value.shape)
    perm = transpose_perm(
        value.producer()
    )  # a Transpose's rank is its perm's length, even without shapes
    return len(perm) if perm is not None else None


def last_dim(value: ir.Value | None) -> int | None:
    if value is None or value.shape is None or len(value.shape) == 0:
        return None
    dim = value.shape[-1]
    return dim if isinstance(dim, int) else None


def is_dim(entry: Entry, index: int) -> bool:
    return isinstance(entry, tuple) and entry[2] == index


def keeps_leading_dims(
    entries: Sequence[Entry],
    allowzero: bool,
    source: ir.Value | None,
    equal: Sequence[Sequence[tuple[ir.Value, int]]] = ((), ()),
) -> bool:
    """Entries 0 and 1 of a reshape keep the input's [B, S].

    Each is a copy marker (0), the dim read at run time, or a constant equal to the input's static
    dim; one of them may be -1 when the other is pinned (the trailing entries are checked by callers).
    ``equal[a]`` lists (value, axis) pairs whose dim is known to be the input's dim ``a``: a dim
    read elsewhere that carries one of their symbols is pinned too.
    """
    if sum(1 for e in entries if e == -1) > 1:
        return False

    def pinned(entry: Entry, axis: int) -> bool:
        if entry == 0:
            return not allowzero
        if isinstance(entry, int):
            return entry > 0 and entry == static_dim(source, axis)
        if any(same_symbol(entry[1], entry[2], value, at) for value, at in equal[axis]):
            return True
        return is_dim(entry, axis)

    first, second = entries[0], entries[1]
    if first == -1:
        return pinned(second, 1)
    return pinned(first, 0) and (second == -1 or pinned(second, 1))


def static_dim(value: ir.Value | None, index: int) -> int | None:
    if value is None or value.shape is None or len(value.shape) <= index:
        return None
    dim = value.shape[index]
    return dim if isinstance(dim, int) else None


def merges_heads(reshape: ir.Node) -> bool:
    """``Reshape(x[B, S, H, d], [0, 0, -1])`` (or B, S read off x, or x's static B, S): keeps x's
    dims 0 and 1."""
    source = reshape.inputs[0]
    entries = target_entries(reshape.inputs[1])
    if source is None or entries is None or len(entries) != 3 or value_rank(source) != 4:
        return False
    allowzero = bool(reshape.attributes.get_int("allowzero", 0))
    for i in (0, 1):
        entry = entries[i]
        if isinstance(entry, tuple):
            if entry[1] is not source or entry[2] != i:
                return False
        elif not ((entry == 0 and not allowzero) or (entry > 0 and entry == static_dim(source, i))):
            return False
    return True


def reshape_to_heads(value: ir.Value | None) -> tuple[ir.Value, int, int, ir.Node] | None:
    """``value = Reshape(x, [B, S, H, d])`` with x of rank 3: (x, H, d, reshape)."""
    reshape = producer_of(value, "Reshape")
    if reshape is None:
        return None
    source = reshape.inputs[0]
    if source is None or value_rank(source) not in (None, 3):
        return None
    entries = target_entries(reshape.inputs[1])
    if entries is None and value is not None:
        return _split_by_shapes(source, value, reshape)
    if entries is None or len(entries) != 4:
        return None
    allowzero = bool(reshape.attributes.get_int("allowzero", 0))
    heads, head_size = entries[2], entries[3]
    if head_size == -1 and isinstance(heads, int) and heads > 0:
        # [B, S, H, -1] (DeBERTa): the head size is the static width over H
        width = last_dim(source)
        if width is None or width % heads:
            return None
        head_size = width // heads
    if (
        not isinstance(head_size, int)
        or head_size <= 0
        or not keeps_leading_dims(entries, allowzero, source)
    ):
        return None
    if entries[1] == -1 and not (isinstance(heads, int) and heads > 0):
        return None
    if heads == -1:
        width = last_dim(source)
        if width is None or width % head_size:
            return None
        heads = width // head_size
    if not isinstance(heads, int) or heads <= 0:
        return None
    width = last_dim(source)
    if width is not None and width != heads * head_size:
        return None
    return source, heads, head_size, reshape


def _split_by_shapes(
    source: ir.Value, value: ir.Value, reshape: ir.Node
) -> tuple[ir.Value, int, int, ir.Node] | None:
    """A head split whose target cannot be read (wav2vec2's dynamo export computes the sequence
    length from the audio length), proved by the shapes instead: the output is [B, S, H, d] with
    B and S the input's own dims (same symbol or size) and H*d its last dim."""
    heads, head_size = static_dim(value, 2), static_dim(value, 3)
    if value_rank(value) != 4 or not heads or not head_size or heads <= 0 or head_size <= 0:
        return None
    if not (same_symbol(value, 0, source, 0) and same_symbol(value, 1, source, 1)):
        return None
    width = last_dim(source)
    if width is None or width != heads * head_size:
        return None
    return source, heads, head_size, reshape


def flattens_rows(flatten: ir.Node, source: ir.Value, rank: int) -> bool:
    """``flatten`` = Reshape(source, [-1, K]) with K source's last dim: row i of the result is
    the i-th row of source in row-major order."""
    entries = target_entries(flatten.inputs[1])
    if entries is None or len(entries) != 2:
        return False
    first, last = entries
    return first == -1 and same_dim(last, source, rank - 1)


def restores_rows(entries: list[Entry] | None, source: ir.Value, rank: int, width: int) -> bool:
    """A Reshape target [*source.shape[:-1], width]: each leading entry is source's dim (read off
    it, the same symbol, or its static size), the last is width (as a constant or read off a dim of
    that static size); at most one entry is -1, the rest pinned."""
    if entries is None or len(entries) != rank:
        return False
    last = entries[-1]
    pinned = [same_dim(entry, source, i) for i, entry in enumerate(entries[:-1])] + [
        last == width or (isinstance(last, tuple) and static_dim(last[1], last[2]) == width)
    ]
    free = [entry == -1 for entry in entries]
    return sum(free) <= 1 and all(p or f for p, f in zip(pinned, free, strict=True))


def same_dim(entry: Entry, source: ir.Value, index: int) -> bool:
    """The entry is dim ``index`` of ``source``: read off it, read off a dim with the same symbol
    (exporters, and fold-shape-values' sharing, read a length off whichever tensor carries it), or
    the same positive constant when that dim is static."""
    if isinstance(entry, int):
        return entry > 0 and entry == static_dim(source, index)
    if not isinstance(entry, tuple):
        return False
    # A read of a static dim is that size (Falcon's single K/V head: a 1 read off another layer's K)
    read_size = static_dim(entry[1], entry[2])
    return (
        (entry[1] is source and entry[2] == index)
        or same_symbol(entry[1], entry[2], source, index)
        or (read_size is not None and read_size == static_dim(source, index))
    )


def _dims_product(dims: Sequence[int | ir.SymbolicDim]) -> tuple[int, tuple[str, ...]] | None:
    """The product of ``dims`` as (static factor, sorted symbols); None if a dim is unnamed."""
    factor, symbols = 1, []
    for dim in dims:
        if isinstance(dim, int):
            factor *= dim
        elif dim.value is None:
            return None
        else:
            symbols.append(dim.value)
    return factor, tuple(sorted(symbols))


def reshaped_axis(output: ir.Value, source: ir.Value, axis: int) -> int | None:
    """The axis of ``source`` that ``output`` = Reshape(``source``) keeps as its ``axis``, by the
    shapes: the same dim, with equal products of the dims before it (row-major order then maps
    every index along one onto the same index along the other). [B, 1, S, D] -> [B, S, H, d] keeps
    S at axis 2 -> 1. None when the shapes do not prove it."""
    if output.shape is None or source.shape is None or not 0 <= axis < len(output.shape):
        return None
    before = _dims_product(list(output.shape)[:axis])
    if before is None:
        return None
    for index in range(len(source.shape)):
        if _dims_product(list(source.shape)[:index]) == before and (
            same_symbol(output, axis, source, index)
            or (static_dim(output, axis) == static_dim(source, index) is not None)
        ):
            return index
    return None


def int64_const(tape: ir.tape.Tape, values: Sequence[int]) -> ir.Value:
    return tape.op("Constant", [], {"value": ir.tensor(np.array(values, dtype=np.int64))})


def annotate(value: ir.Value, like: ir.Value, dims: Sequence[int | ir.SymbolicDim | None]) -> None:
    """Record a rewrite's new value's shape, with ``like``'s dtype."""
    if like.dtype is not None:
        value.dtype = like.dtype
    value.shape = ir.Shape(list(dims))


# The opset from which an op takes its axes as an input, not an attribute (the Reduce ops other
# than ReduceSum: 18).
_AXES_INPUT_SINCE = {"Squeeze": 13, "Unsqueeze": 13, "ReduceSum": 13}


def with_axes(
    tape: ir.tape.Tape,
    op_type: str,
    value: ir.Value,
    axes: Sequence[int],
    opset: int,
    attributes: dict[str, int] | None = None,
) -> ir.Value:
    """``op_type(value)`` over ``axes``: the axes as an input from the opset that made them one,
    else as an attribute."""
    if opset >= _AXES_INPUT_SINCE.get(op_type, 18):
        return tape.op(op_type, [value, int64_const(tape, axes)], attributes or {})
    return tape.op(op_type, [value], {"axes": list(axes), **(attributes or {})})


def split_last_axis(
    tape: ir.tape.Tape, value: ir.Value, widths: Sequence[int], opset: int
) -> Sequence[ir.Value]:
    """``Split(value, widths, axis=-1)``: the sizes as an input from opset 13, else an attribute."""
    if opset >= 13:
        inputs = [value, int64_const(tape, widths)]
        return tape.op_multi_out("Split", inputs, {"axis": -1}, num_outputs=len(widths))
    return tape.op_multi_out(
        "Split", [value], {"axis": -1, "split": list(widths)}, num_outputs=len(widths)
    )


def seq_len(tape: ir.tape.Tape, value: ir.Value, axis: int, opset: int) -> ir.Value:
    return dims_read(tape, value, axis, axis + 1, opset)


def dims_read(tape: ir.tape.Tape, value: ir.Value, start: int, end: int, opset: int) -> ir.Value:
    """Dims [start, end) of ``value``'s shape as a vector: ``Shape(value, start, end)`` from opset
    15, a Slice of the whole Shape before (Slice's bounds are attributes before opset 10)."""
    if opset >= 15:
        return tape.op("Shape", [value], {"start": start, "end": end})
    shape = tape.op("Shape", [value])
    if opset < 10:
        return tape.op("Slice", [shape], {"starts": [start], "ends": [end], "axes": [0]})
    return tape.op(
        "Slice",
        [shape, int64_const(tape, [start]), int64_const(tape, [end]), int64_const(tape, [0])],
    )


def same_symbol(a: ir.Value | None, i: int, b: ir.Value | None, j: int) -> bool:
    if (
        a is None
        or b is None
        or a.shape is None
        or b.shape is None
        or len(a.shape) <= i
        or len(b.shape) <= j
    ):
        return False
    x, y = a.shape[i], b.shape[j]
    if isinstance(x, int) or isinstance(y, int):
        return isinstance(x, int) and x == y and x > 1
    return x.value is not None and x.value == y.value
