"""Proving an additive attention mask causal from how its values are computed.

transformers 4.38 to 4.47 build LLaMA-style decoders' masks (Mistral, Qwen2, Phi-3, GPT-NeoX, ...)
as numbers, not as a comparison of positions::

    c = triu(full((S, T), min), diagonal=1) * (arange(T) > cache_position.reshape(-1, 1))
    c = c[None, None].expand(B, 1, -1, -1)
    mask = c.masked_fill((c[..., :L] + attention_mask[:, None, None, :]) == 0, min)

(TorchScript writes the padding as a ScatterND of ``c[..., :L]``, which simplify-index-grids reads
as the update itself when it covers all of c; dynamo as the Where directly.) With the cache
positions 0..S-1 (no past), every key after its query holds ``min`` there whatever the padding.
4.36's ``_make_causal_mask`` (OPT, BART, BioGPT, XGLM, Whisper's decoder up to 4.47) fills by a
comparison instead, ``full(min).masked_fill(arange(T) < arange(S)[:, None] + 1, 0)``, and OPT
clamps the result at ``min`` (a Max fuse-attention moves onto the mask).

:func:`after_query` proves that: the constant every element ``[..., i, j]`` with j > i holds,
followed through the ops above. ``triu`` (Trilu, upper, k <= 1) of a tensor filled with c is c
there; a comparison of key positions j + a with query positions i + b (``Range(a, n, 1)`` along
the last axis, ``Range(b, m, 1)`` along the one before, constants added) is decided for every
j > i by a and b alone, so a Mul by such a comparison true there multiplies by 1 and a Where on
one picks one branch there; a Where between two values that are both c there is c there, and so
is a Max of c with a constant below it; views keep it when they keep the last two axes (leading
Unsqueezes, Expands that broadcast only other axes, Reshapes that keep the last two dims, Slices
of the last two axes from 0). No operand it follows may be broadcast along the keys (one key's
value would stand for its whole row); along the queries it may (j > i >= 0 puts j after row 0).
:func:`value_set` then bounds what the whole mask can hold (a few numbers, exactly, in float32),
so that the caller can check every value is c or an allowed finite number above it: a row is
then fully masked exactly when its maximum is c.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxopt.ops import const_array, const_tensor, constant_of_shape_fill, is_op
from onnxopt.passes._attention_shapes import (
    peel_torch_expand_shape,
    producer_of,
    same_dim,
    same_symbol,
    scalar_dim_read,
    static_dim,
    target_entries,
    value_rank,
)
from onnxopt.passes._shape_facts import axes_param

_DEPTH = 16
_MOST_VALUES = 8  # a value set larger than this is not tracked
_MOST_ELEMENTS = 1 << 16  # a constant larger than this is not read


def zero_start(value: ir.Value | None) -> bool:
    """A Slice's one start that is provably 0: the constant, or ``Sub(n, n)`` of one dim read
    twice (TorchScript's ``bias[key_length - query_length : key_length]`` without a past)."""
    array = const_array(value)
    if array is not None:
        return array.size == 1 and int(array.reshape(-1)[0]) == 0
    node = value.producer() if value is not None else None
    if (is_op(node, "Unsqueeze") or is_op(node, "Reshape")) and node is not None:
        node = node.inputs[0].producer() if node.inputs[0] is not None else None
    if not is_op(node, "Sub") or node is None or len(node.inputs) != 2:
        return False
    first, second = node.inputs
    if first is second:
        return first is not None
    a, b = scalar_dim_read(first), scalar_dim_read(second)
    return a is not None and b is not None and same_symbol(a[0], a[1], b[0], b[1])


def leading_axes_peeled(value: ir.Value) -> ir.Value:
    """``value`` without the Unsqueezes that only add axes before its last two (which keep the
    query and key axes last): a [B, S, T] mask given its head axis."""
    for _ in range(4):
        node = producer_of(value, "Unsqueeze")
        source = _keeps_last_two(node) if node is not None else None
        if source is None:
            return value
        value = source
    return value


def _small_constant(value: ir.Value | None) -> np.ndarray | None:
    """A constant's values, when it has at most _MOST_ELEMENTS (a weight is never a mask)."""
    tensor = const_tensor(value) if value is not None else None
    if tensor is not None and tensor.size > _MOST_ELEMENTS:
        return None
    return const_array(value)


def _uniform(value: ir.Value | None) -> float | None:
    """The one number a tensor filled with it holds: a constant, ``ConstantOfShape`` or the
    Expand of a constant."""
    array = _small_constant(value)
    node = value.producer() if value is not None else None
    if array is None and is_op(node, "ConstantOfShape") and node is not None:
        array = constant_of_shape_fill(node)
    elif array is None and is_op(node, "Expand") and node is not None:
        array = _small_constant(node.inputs[0])
    if array is None or array.size == 0 or not np.issubdtype(array.dtype, np.floating):
        return None
    first = array.reshape(-1)[0]
    return float(first) if bool(np.all(array == first)) else None


def _keeps_last_two(node: ir.Node) -> ir.Value | None:
    """The input of a view of it that keeps its last two axes as they are (the same dims in the
    same order, each [..., i, j] block whole); None for any other node."""
    source = node.inputs[0] if node.inputs else None
    out = node.outputs[0]
    rank, source_rank = value_rank(out), value_rank(source)
    if source is None or rank is None or source_rank is None or source_rank < 2 or rank < 2:
        return None
    if is_op(node, "Unsqueeze") or is_op(node, "Squeeze"):
        axes = axes_param(node, rank if node.op_type == "Unsqueeze" else source_rank)
        edge = (rank if node.op_type == "Unsqueeze" else source_rank) - 2
        if axes is None or not isinstance(axes, tuple) or any(a >= edge for a in axes):
            return None
        return source
    if is_op(node, "Expand"):
        entries = (
            target_entries(peel_torch_expand_shape(node.inputs[1])) if node.inputs[1] else None
        )
        if entries is None or len(entries) < 2:
            return None
        for offset in (1, 2):
            entry = entries[-offset]  # -1: TorchScript's "keep the dim", peeled to 1
            if entry not in (1, -1) and not same_dim(entry, source, source_rank - offset):
                return None
        return source
    if is_op(node, "Reshape"):
        for offset in (1, 2):
            size = static_dim(source, source_rank - offset)
            same = same_symbol(out, rank - offset, source, source_rank - offset)
            if not same and (size is None or static_dim(out, rank - offset) != size):
                return None
        return source
    if is_op(node, "Slice"):
        return source if _slices_from_zero(node, source_rank) else None
    if is_op(node, "Identity"):
        return source
    return None


def _slices_from_zero(node: ir.Node, rank: int) -> bool:
    """A Slice whose cuts of the last two axes start at 0 with step 1 (other axes anyhow)."""
    if len(node.inputs) < 3 or "starts" in node.attributes:
        return False
    starts = node.inputs[1]
    axes_value = node.inputs[3] if len(node.inputs) > 3 else None
    steps_value = node.inputs[4] if len(node.inputs) > 4 else None
    count = static_dim(starts, 0)
    axes = const_array(axes_value) if axes_value is not None else np.arange(count or 0)
    steps = const_array(steps_value) if steps_value is not None else None
    if axes is None or count is None or axes.size != count:
        return False
    for position, axis in enumerate(int(a) % rank for a in axes.reshape(-1)):
        if axis < rank - 2:
            continue
        if steps is not None and int(steps.reshape(-1)[position]) != 1:
            return False
        start = const_array(starts)
        if start is not None:
            if int(start.reshape(-1)[position]) != 0:
                return False
        elif count != 1 or not zero_start(starts):
            return False
    return True


def _integer(value: ir.Value | None) -> int | None:
    array = const_array(value)
    if array is None or array.size != 1 or not np.issubdtype(array.dtype, np.integer):
        return None
    return int(array.reshape(-1)[0])


def _positions(value: ir.Value | None, axis: int) -> int | None:
    """k when ``value`` is the positions k, k + 1, ... along ``axis`` (-1: the last, -2: the one
    before): ``Range(k, n, 1)`` (along its last axis), plus integer constants, its Reshape to
    [-1, 1] or Unsqueeze on axis 1 (along the one before), given leading axes by Unsqueezes."""
    offset = 0
    for _ in range(8):
        node = value.producer() if value is not None else None
        if node is None:
            return None
        if is_op(node, "Range"):
            start, delta = _integer(node.inputs[0]), _integer(node.inputs[2])
            ok = axis == -1 and start is not None and delta == 1
            return offset + start if ok and start is not None else None
        source = node.inputs[0] if node.inputs else None
        if is_op(node, "Identity"):
            value = source
            continue
        if is_op(node, "Add") and len(node.inputs) == 2:  # positions + 1 (``arange(S) + 1``)
            added = [_integer(x) for x in node.inputs]
            if added[1] is not None and value_rank(node.inputs[1]) == 0:
                offset, value = offset + added[1], node.inputs[0]
                continue
            if added[0] is not None and value_rank(node.inputs[0]) == 0:
                offset, value = offset + added[0], node.inputs[1]
                continue
            return None
        rank, inner = value_rank(node.outputs[0]), value_rank(source)
        if rank is None or inner is None:
            return None
        column = (is_op(node, "Reshape") and _target_is(node, [-1, 1])) or (
            is_op(node, "Unsqueeze") and axes_param(node, rank) == (1,)
        )
        if axis == -2 and inner == 1 and rank == 2 and column:
            axis = -1  # below it, the positions run along the source's own (last) axis
        elif is_op(node, "Unsqueeze"):
            axes = axes_param(node, rank)
            if not isinstance(axes, tuple) or any(a >= rank + axis for a in axes):
                return None  # an axis inserted at or after the one the positions run along
        else:
            return None
        value = source
    return None


def _target_is(reshape: ir.Node, wanted: list[int]) -> bool:
    target = const_array(reshape.inputs[1]) if len(reshape.inputs) > 1 else None
    return target is not None and target.reshape(-1).tolist() == wanted


# Comparisons of key positions j + a with query positions i + b: for every j > i (j >= i + 1),
# what the comparison is, given how a and b compare (None: either).
_COMPARED = {
    # key on the left: j + a OP i + b; after the query j + a >= i + 1 + a
    "Greater": lambda a, b: True if a + 1 > b else None,
    "GreaterOrEqual": lambda a, b: True if a + 1 >= b else None,
    "Less": lambda a, b: False if a + 1 >= b else None,
    "LessOrEqual": lambda a, b: False if a + 1 > b else None,
}
_MIRRORED = {"Greater": "Less", "Less": "Greater", "GreaterOrEqual": "LessOrEqual"}
_MIRRORED["LessOrEqual"] = "GreaterOrEqual"


def _truth_after_query(value: ir.Value | None, depth: int = 0) -> bool | None:
    """What a condition provably is at every key after its query (True, False), or None: a
    comparison of key and query positions (not broadcast along the keys), through Not, And,
    Or, views that keep the last two axes and Casts to bool."""
    node = value.producer() if value is not None else None
    if node is None or node.domain not in ("", "ai.onnx") or depth > _DEPTH:
        return None
    out = node.outputs[0]
    if node.op_type in _COMPARED and len(node.inputs) == 2:
        left, right = node.inputs
        for op, key, query in ((node.op_type, left, right), (_MIRRORED[node.op_type], right, left)):
            a, b = _positions(key, -1), _positions(query, -2)
            if a is not None and b is not None and key is not None and _keys_kept(key, out):
                return _COMPARED[op](a, b)
        return None
    if node.op_type == "Not":
        inner = _truth_after_query(node.inputs[0], depth + 1)
        return None if inner is None else not inner
    if node.op_type in ("And", "Or") and len(node.inputs) == 2:
        found = [
            _truth_after_query(x, depth + 1) if x is not None and _keys_kept(x, out) else None
            for x in node.inputs
        ]
        decisive = node.op_type == "Or"  # True decides an Or, False an And
        if decisive in found:
            return decisive
        return (not decisive) if found == [not decisive, not decisive] else None
    if node.op_type == "Cast" and ir.DataType(node.attributes.get_int("to", 0)) == ir.DataType.BOOL:
        source = node.inputs[0]
        return (
            _truth_after_query(source, depth + 1)
            if source is not None and source.dtype == ir.DataType.BOOL
            else None
        )
    source = _keeps_last_two(node)
    return _truth_after_query(source, depth + 1) if source is not None else None


def _one_after_query(value: ir.Value | None) -> bool:
    """``value`` is 1 wherever the key comes after the query: a condition true there (see
    _truth_after_query) cast to a number."""
    cast = producer_of(value, "Cast")
    return cast is not None and _truth_after_query(cast.inputs[0]) is True


def after_query(value: ir.Value) -> float | None:
    """The number ``value`` provably holds at every ``[..., i, j]`` with j > i (the module
    docstring), or None."""
    return _after_query(value, 0, {})


_Memo = dict[int, object]


def _after_query(value: ir.Value, depth: int, memo: _Memo) -> float | None:
    if id(value) not in memo:  # a value reached twice (a mask both sliced and filled) once
        memo[id(value)] = _after_query_of(value, depth, memo)
    found = memo[id(value)]
    return found if isinstance(found, float) else None


def _after_query_of(value: ir.Value, depth: int, memo: _Memo) -> float | None:
    uniform = _uniform(value)
    if uniform is not None:
        return uniform
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx") or depth > _DEPTH:
        return None
    source = _keeps_last_two(node)
    if source is not None:
        return _after_query(source, depth + 1, memo)
    if node.op_type == "Trilu" and node.attributes.get_int("upper", 1) == 1:
        k = const_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] else None
        if (k is None and len(node.inputs) > 1 and node.inputs[1]) or (
            k is not None and int(k.reshape(-1)[0]) > 1
        ):
            return None  # the band above the diagonal that triu keeps must start by j = i + 1
        return _uniform(node.inputs[0])
    out = node.outputs[0]
    if node.op_type == "Mul" and len(node.inputs) == 2:
        for kept, factor in (node.inputs, node.inputs[::-1]):
            if kept is None or not _keys_kept(kept, out):
                continue
            scale = _uniform(factor)
            if factor is not None and _one_after_query(factor) and _keys_kept(factor, out):
                scale = 1.0
            if scale is not None and scale > 0 and np.isfinite(scale):
                # (a scale too: CodeGen's scores divided after the fill, fuse-attention's
                # term factor on the mask)
                inner = _after_query(kept, depth + 1, memo)
                return None if inner is None else float(np.float32(inner) * np.float32(scale))
        return None
    if node.op_type == "Where" and len(node.inputs) == 3:
        cond = node.inputs[0]
        truth = _truth_after_query(cond) if cond is not None and _keys_kept(cond, out) else None
        if truth is not None:  # the branch picked at every key after its query
            return _branch_after_query(node.inputs[1 if truth else 2], out, depth, memo)
        found = [_branch_after_query(branch, out, depth, memo) for branch in node.inputs[1:]]
        return found[0] if found[0] is not None and found[0] == found[1] else None
    if node.op_type == "Max" and len(node.inputs) == 2:  # OPT's clamp at float32's lowest
        for kept, floor in (node.inputs, node.inputs[::-1]):
            bound = _uniform(floor)
            if kept is not None and bound is not None and _keys_kept(kept, out):
                inner = _after_query(kept, depth + 1, memo)
                return None if inner is None else max(inner, bound)
        return None
    return None


def _branch_after_query(
    branch: ir.Value | None, out: ir.Value, depth: int, memo: _Memo
) -> float | None:
    """What a Where's branch holds after each query: a fill anyhow broadcast, else a tensor not
    broadcast along the keys."""
    if branch is None:
        return None
    uniform = _uniform(branch)
    if uniform is not None:
        return uniform
    return _after_query(branch, depth + 1, memo) if _keys_kept(branch, out) else None


def _keys_kept(operand: ir.Value, out: ir.Value) -> bool:
    """``operand`` of an element-wise op is not broadcast along the key axis (its last dim is the
    output's): else one key's value would stand for every key of its row. (Broadcast along the
    query axis it keeps what it holds after the query: j > i >= 0 puts j after row 0 too.)"""
    rank, out_rank = value_rank(operand), value_rank(out)
    if not rank or not out_rank:
        return False
    size = static_dim(operand, rank - 1)
    return same_symbol(operand, rank - 1, out, out_rank - 1) or (
        size is not None and size == static_dim(out, out_rank - 1)
    )


def value_set(value: ir.Value | None) -> frozenset[float] | None:
    """Every number ``value`` can hold (float32 arithmetic, so -0.0 and overflow show), when it
    is one of a few: constants, fills, bools cast to float, and what views, Trilu, Where and Mul
    make of them; None when unknown or more than a few."""
    return _value_set(value, 0, {})


def _value_set(value: ir.Value | None, depth: int, memo: _Memo) -> frozenset[float] | None:
    if value is None or depth > _DEPTH:
        return None
    if id(value) not in memo:
        memo[id(value)] = _value_set_of(value, depth, memo)
    found = memo[id(value)]
    return found if isinstance(found, frozenset) else None


def _value_set_of(value: ir.Value, depth: int, memo: _Memo) -> frozenset[float] | None:
    array = _small_constant(value)
    if array is not None:
        if not np.issubdtype(array.dtype, np.floating):
            return None
        found = frozenset(float(x) for x in np.unique(array.astype(np.float32)))
        return found if len(found) <= _MOST_VALUES else None
    uniform = _uniform(value)
    if uniform is not None:
        return frozenset({uniform})
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    source = node.inputs[0] if node.inputs else None
    if node.op_type in ("Expand", "Unsqueeze", "Squeeze", "Reshape", "Slice", "Identity"):
        return _value_set(source, depth + 1, memo)
    if node.op_type == "Cast":
        if source is not None and source.dtype == ir.DataType.BOOL:
            return frozenset({0.0, 1.0})
        if source is not None and source.dtype == ir.DataType.FLOAT == value.dtype:
            return _value_set(source, depth + 1, memo)
        return None
    if node.op_type == "Trilu":
        inner = _value_set(source, depth + 1, memo)
        return None if inner is None else inner | {0.0}
    if node.op_type == "Where" and len(node.inputs) == 3:
        a, b = (_value_set(branch, depth + 1, memo) for branch in node.inputs[1:])
        return None if a is None or b is None else a | b
    if node.op_type in ("Mul", "Max") and len(node.inputs) == 2:
        a, b = (_value_set(side, depth + 1, memo) for side in node.inputs)
        if a is None or b is None or len(a) * len(b) > 4 * _MOST_VALUES:
            return None
        combine = np.multiply if node.op_type == "Mul" else np.maximum
        with np.errstate(over="ignore", invalid="ignore"):
            results = {float(combine(np.float32(x), np.float32(y))) for x in a for y in b}
        return frozenset(results) if len(results) <= _MOST_VALUES else None
    return None
