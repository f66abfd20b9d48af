"""Fuse interleaved (GPT-J style) rotary position embeddings, partial or full, into RotaryEmbedding.

GPT-J, CodeGen and Cohere rotate adjacent pairs of each head's first ``r`` dims:

    y = x * cos + rotate_every_two(x) * sin,
    rotate_every_two(x) = Reshape(Concat(Unsqueeze(-x[..., 1::2], -1), Unsqueeze(x[..., ::2], -1)))
    cos = repeat_interleave(c, 2, -1)        (Reshape(Expand|Tile(Unsqueeze(c, [.., -1]), [.., 2])))

so y[2i] = x[2i] c[i] - x[2i+1] s[i] and y[2i+1] = x[2i+1] c[i] + x[2i] s[i]: what ONNX Runtime's
com.microsoft.RotaryEmbedding computes with ``interleaved=1`` from half-width caches [max_pos, r/2]
(scripts/interleaved_rotary_check.py: it agrees with the unfused arithmetic to 1 ulp, ORT 1.32 CPU).
Partial rotary (GPT-J's ``rotary_dim``): ``Concat(rope(x[..., :r]), x[..., r:])`` is one op with
``rotary_embedding_dim = r`` and ``num_heads``.

The half tables ``c``/``s`` come from

- a gathered constant table (GPT-J, CodeGen): ``Split(Gather(T, positions), 2, -1)`` with
  ``T`` [max_pos, r] constant and positions provably ``Range(0, S, 1)`` over the rotated tensor's
  own sequence length S; the caches are then ``T``'s columns the Split hands each product
  (which half is cos is read off the graph, not assumed), read with position offset 0;
- or ``Cos``/``Sin`` of the in-graph angles ``f = positions * inv_freq`` [1, S, r/2] (Cohere), the
  trig before or after the repeat (elementwise, so the same values); the caches are built from
  ``f`` once per model, as fuse-rotary-embedding does. GLM, Helium and ERNIE 4.5 repeat the first
  half of rotate_half's tables, ``Cos(Concat(f, f))[..., : r/2]`` with the heads axis added
  before: that half is ``Cos(f)``.

Layouts: [B, S, H, d] (GPT-J rotates right after the head split ``Reshape(x3, [0, 0, H, d])``) is
the 3-D [B, S, H*d] the contrib op takes with ``num_heads``: the op reads ``x3`` and a Reshape puts
the heads back, so attention then sees a plain head split of a rank-3 tensor (it runs after this
pass). A [B, S, H, d] tensor split some other way (CodeGen's packed Q/K/V) is merged to
[B, S, H*d] for the op and split back. [B, H, S, d] (Cohere, after the Transpose) is the contrib
op's 4-D input as is. Which of the two a rank-4 tensor is, the tables say: they broadcast over the
heads axis and multiply the positions' axis, proven to be the rotated tensor's S.

Target ``onnx`` (opset 23+): RotaryEmbedding with ``interleaved=1`` and the same ``num_heads`` /
``rotary_embedding_dim``, without position_ids, so the caches are the [B, S, r/2] rows the graph
multiplied by: a constant table's first S rows (Slice), or Cos/Sin(f), expanded over the batch.
Anything not provably the same computation is refused with a reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, const_array, is_op
from onnxopt.passes._shape_facts import cast_target, const_ints, int_param, slice_params
from onnxopt.passes.base import RulePass
from onnxopt.passes.fuse_rotary_embedding import (
    ROTARY_FLOATS,
    ROTARY_OPSET,
    RotaryTable,
    dim_of_scalar,
    last_axis_window,
    positions_of,
    range_end,
    rotary_cache,
    rotation_products,
    rows_of,
    same_dim,
    same_shape_as,
)
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import ensure_opset, new_constant, other_input, producer_op

_BSNH, _BNSH = "BSNH", "BNSH"
_NOT_RANGE = object()


@dataclass(frozen=True)
class _Repeat:
    """``value = repeat_interleave(source, 2, -1)`` with the unit axes ``extra`` also inserted."""

    source: ir.Value
    extra: tuple[int, ...]  # unit axes the Unsqueeze added besides the pair axis (output ranks)
    nodes: tuple[ir.Node, ...]


def _reshape_target_ok(target: tuple[int, ...], want: Sequence[object], allowzero: int) -> bool:
    """True when Reshape(t, ``target``) of a tensor whose dims are ``want`` (merged last two)
    gives exactly ``want``: each entry is 0 (copy, allowzero=0), -1 (at most one) or the known dim."""
    if len(target) != len(want) or sum(1 for t in target if t == -1) > 1:
        return False
    last = len(target) - 1
    for axis, (t, dim) in enumerate(zip(target, want, strict=True)):
        copies = t == 0 and not allowzero and axis < last  # the merged axis is no copy
        if t == -1 or copies or (isinstance(dim, int) and t == dim):
            continue
        return False
    return True


def _repeat_pairs(value: ir.Value | None) -> _Repeat | Mismatch:
    """``Reshape(Expand|Tile(Unsqueeze(c, axes), [1, .., 1, 2]), t)``: each value of ``c`` twice."""
    reshape = producer_op(value, "Reshape")
    if reshape is None or len(reshape.inputs) < 2:
        return Mismatch(
            "the cos/sin table is not a Reshape of a repeated table (repeat_interleave)"
        )
    grow = reshape.inputs[0].producer() if reshape.inputs[0] is not None else None
    if grow is None or not (is_op(grow, "Expand") or is_op(grow, "Tile")) or len(grow.inputs) < 2:
        return Mismatch("the cos/sin table is not Expand or Tile of pairs (repeat_interleave)")
    unsqueeze = producer_op(grow.inputs[0], "Unsqueeze")
    source = None if unsqueeze is None else unsqueeze.inputs[0]
    if unsqueeze is None or source is None or source.shape is None:
        return Mismatch("the repeated cos/sin table is not an Unsqueeze of a table of known rank")
    rank = len(source.shape)
    axes = int_param(unsqueeze, "axes", 1)
    if isinstance(axes, Mismatch) or axes is None:
        return Mismatch("the cos/sin table's Unsqueeze axes are not constant")
    out_rank = rank + len(axes)
    normalized = sorted(a + out_rank if a < 0 else a for a in axes)
    if not normalized or normalized[-1] != out_rank - 1:
        return Mismatch("the cos/sin table's Unsqueeze does not add the pair axis last")
    repeats = const_ints(grow.inputs[1])
    if repeats != (1,) * (out_rank - 1) + (2,):
        return Mismatch(f"the cos/sin table is repeated {repeats}, not twice along a new last axis")
    half = source.shape[-1]
    if not isinstance(half, int):
        return Mismatch("the cos/sin table's width is not static")
    dims: list[object] = []
    source_dims = iter(source.shape)
    for axis in range(out_rank - 1):
        dims.append(1 if axis in normalized else next(source_dims))
    dims[-1] = 2 * half
    target = const_ints(reshape.inputs[1])
    if target is None or not _reshape_target_ok(
        target, dims, reshape.attributes.get_int("allowzero", 0)
    ):
        return Mismatch(
            f"the repeated cos/sin table is reshaped to {target}, not pairs merged into width {2 * half}"
        )
    return _Repeat(source, tuple(normalized[:-1]), (unsqueeze, grow, reshape))


def _positions_from_range(indices: ir.Value | None, axes: tuple[int, ...]) -> object:
    """The S of ``Unsqueeze(Range(0, S, 1), axes)`` (the dim S is read from, when it is one),
    or ``_NOT_RANGE`` when the indices are not that."""
    end = range_end(indices, axes)
    if end is None:
        return _NOT_RANGE
    limit = const_array(end)
    if limit is not None and limit.size == 1:
        return int(limit.reshape(()))
    return dim_of_scalar(end)


def _gathered(value: ir.Value, positions: object) -> RotaryTable | Mismatch:
    """``Split(Gather(T, Range(0, S)), 2, -1)[k]`` -> T's k-th column half as a constant cache."""
    split = value.producer()
    if not is_op(split, "Split") or split is None or split.inputs[0] is None:
        return Mismatch("the cos/sin table is neither Cos/Sin nor a Split of a gathered table")
    window = last_axis_window(value)
    if window is None:
        return Mismatch("the gathered cos/sin table is not split along its last axis")
    gather = split.inputs[0].producer()
    table = None
    found: object = None
    if is_op(gather, "Gather") and gather is not None:
        if gather.attributes.get_int("axis", 0) != 0:
            return Mismatch("the cos/sin table is gathered along an axis other than the positions")
        table = const_array(gather.inputs[0])
        found = _positions_from_range(gather.inputs[1], (0,))
    elif is_op(gather, "GatherND") and gather is not None:
        if gather.attributes.get_int("batch_dims", 0) != 0:
            return Mismatch("the cos/sin table's GatherND has batch_dims")
        table = const_array(gather.inputs[0])
        found = _positions_from_range(gather.inputs[1], (0, 2))
    elif is_op(gather, "GatherElements") and gather is not None:
        # GPT-J before transformers 5: torch.gather(table.repeat(B, 1, 1), 1, ids) with the
        # position ids (one row, from Range) repeated along the width: table[0] at 0..S-1.
        array = const_array(gather.inputs[0])
        tile = producer_op(gather.inputs[1], "Tile")
        repeats = const_array(tile.inputs[1]) if tile is not None else None
        if (
            gather.attributes.get_int("axis", 0) != 1
            or array is None
            or array.ndim != 3
            or array.shape[0] != 1
            or tile is None
            or repeats is None
            or repeats.tolist() != [1, 1, array.shape[2]]
        ):
            return Mismatch(
                "the cos/sin table's GatherElements does not read one row of a constant table "
                "at positions repeated along its width"
            )
        table = array[0]
        found = _positions_from_range(tile.inputs[0], (0, 2))
    else:
        return Mismatch(
            "the split cos/sin table is not gathered (Gather/GatherND/GatherElements) from a table"
        )
    assert gather is not None
    if table is None or table.ndim != 2:
        return Mismatch("the gathered cos/sin table is not a constant [max_positions, width]")
    if found is _NOT_RANGE:
        return Mismatch("the cos/sin table's gather positions are not Unsqueeze(Range(0, S, 1))")
    if not (found == positions and isinstance(found, int)) and not same_dim(found, positions):
        return Mismatch(
            "cannot prove the cos/sin table's gather positions are 0..S-1 of the rotated tensor"
        )
    cache = np.ascontiguousarray(table[:, window.start : window.end])
    return RotaryTable(None, "", constant=cache, nodes=(gather, split))


def _table(value: ir.Value | None, layout: str, positions: object) -> RotaryTable | Mismatch:
    """The cos/sin operand, broadcast as [1, S, 1, r] (BSNH) or [1, 1, S, r] (BNSH), traced back to
    its half-width cache. ``trig`` is "" for a constant table."""
    nodes: list[ir.Node] = []
    heads_axis = None
    unsqueeze = producer_op(value, "Unsqueeze")
    if unsqueeze is not None:
        axes = int_param(unsqueeze, "axes", 1)
        if axes not in ((1,), (2,), (-3,), (-2,)):
            return Mismatch(f"the cos/sin Unsqueeze axes are {axes}, not one heads axis")
        assert isinstance(axes, tuple)
        heads_axis = axes[0] % 4
        nodes.insert(0, unsqueeze)
        value = unsqueeze.inputs[0]
    trig = ""
    casts: list[ir.DataType] = []
    repeat: _Repeat | None = None
    halved = False  # GLM / Helium: cos[..., : r // 2] of Cos(Concat(f, f)) is Cos(f)
    while value is not None:
        node = value.producer()
        if is_op(node, "Unsqueeze") and node is not None and repeat is not None:
            # The heads axis added before the repeat ([1, S, r] -> [1, 1, S, r]), not after it.
            axes = int_param(node, "axes", 1)
            if heads_axis is not None or repeat.extra or axes not in ((1,), (2,), (-3,), (-2,)):
                return Mismatch(
                    f"the cos/sin table's Unsqueeze axes are {axes}, not one heads axis"
                )
            assert isinstance(axes, tuple)
            heads_axis = axes[0] % 4
        elif is_op(node, "Slice") and node is not None and repeat is not None and not halved:
            window = last_axis_window(value)
            width = window.source.shape[-1] if window is not None and window.source.shape else None
            if window is None or window.start != 0 or width != 2 * window.end:
                return Mismatch("the repeated cos/sin table is a slice other than its first half")
            halved = True
        elif is_op(node, "Concat") and node is not None and halved and trig:
            # The halved table was Cos/Sin(Concat(f, f)) along the last axis: its half is f's.
            parts = node.inputs
            rank = len(value.shape) if value.shape is not None else 0
            if len(parts) != 2 or parts[0] is not parts[1] or rank == 0:
                return Mismatch("the halved cos/sin angles are not Concat(f, f)")
            if node.attributes.get_int("axis", 0) % rank != rank - 1:
                return Mismatch("the halved cos/sin angles are not concatenated on the last axis")
            halved = False
        elif is_op(node, "Cast") and node is not None:
            if trig:
                return Mismatch("the rotary angles are cast before Cos/Sin (not fused)")
            to = cast_target(node)
            if to is None:
                return Mismatch("the cos/sin Cast has no readable target type")
            casts.insert(0, to)
        elif (is_op(node, "Cos") or is_op(node, "Sin")) and node is not None and not trig:
            trig = node.op_type
        elif is_op(node, "Reshape") and repeat is None and node is not None:
            found = _repeat_pairs(value)
            if isinstance(found, Mismatch):
                return found
            repeat = found
            nodes[:0] = found.nodes
            value = found.source
            continue
        else:
            break
        nodes.insert(0, node)
        value = node.inputs[0]
    if repeat is None or value is None:
        return Mismatch("the cos/sin table is not repeat_interleave'd (not interleaved RoPE)")
    if halved:
        return Mismatch("the halved cos/sin table is not Cos/Sin of Concat(f, f)")
    if heads_axis is None:
        if len(repeat.extra) != 1:
            return Mismatch("the repeated cos/sin table does not broadcast over one heads axis")
        heads_axis = repeat.extra[0]
    elif repeat.extra:
        return Mismatch("the cos/sin table has more unit axes than the heads axis")
    if heads_axis != (2 if layout == _BSNH else 1):
        return Mismatch(
            f"the cos/sin table broadcasts over axis {heads_axis}, not {layout}'s heads"
        )
    if not trig:
        if casts:
            return Mismatch("the gathered cos/sin table is cast on the way (not fused)")
        table = _gathered(value, positions)
        if isinstance(table, Mismatch):
            return table
        return RotaryTable(None, "", constant=table.constant, nodes=(*table.nodes, *nodes))
    if value.shape is None or len(value.shape) != 3 or value.shape[0] != 1:
        return Mismatch("the rotary angles are not [1, S, r/2] (per-batch position_ids?)")
    if not same_dim(rows_of(value), positions):
        return Mismatch("cannot prove the cos/sin table has one row per input position")
    return RotaryTable(value, trig, tuple(casts), nodes=tuple(nodes))


def _step2_slice(node: ir.Node, x: ir.Value, width: int, first: int) -> bool:
    """``node`` reads x[..., first::2] of x's ``width`` dims, directly or off what x was sliced from."""
    offset = 0
    sliced = node.inputs[0]
    if sliced is not x:
        window = last_axis_window(x)
        if window is None or sliced is not window.source:
            return False
        offset = window.start
    if sliced is None or sliced.shape is None or not isinstance(sliced.shape[-1], int):
        return False
    length = sliced.shape[-1]
    params = slice_params(node)
    if isinstance(params, Mismatch) or len(params.starts) != 1 or params.steps[0] != 2:
        return False
    if params.axes[0] % len(sliced.shape) != len(sliced.shape) - 1:
        return False
    start, end = params.starts[0], params.ends[0]
    start = start + length if start < 0 else start
    end = min(end + length if end < 0 else end, length)
    # range(start, end, 2) must be first, first + 2, ..., first + width - 2 (offset by the window).
    want = offset + first
    return start == want and want + width - 2 < end <= want + width


def _rotate_every_two(value: ir.Value | None, x: ir.Value, width: int) -> list[ir.Node] | Mismatch:
    """The nodes of ``Reshape(Concat(Unsqueeze(-x[..., 1::2], -1), Unsqueeze(x[..., ::2], -1)))``."""
    reshape = producer_op(value, "Reshape")
    concat = None if reshape is None else producer_op(reshape.inputs[0], "Concat")
    if reshape is None or concat is None or len(concat.inputs) != 2:
        return Mismatch("no rotate_every_two (Reshape of a Concat of pairs)", candidate=False)
    if concat.attributes.get_int("axis", 0) not in (-1, 4):
        return Mismatch("rotate_every_two's Concat is not on a new last axis")
    pairs = [producer_op(v, "Unsqueeze") for v in concat.inputs]
    if pairs[0] is None or pairs[1] is None:
        return Mismatch("rotate_every_two's Concat operands are not Unsqueezed")
    if any(int_param(p, "axes", 1) not in ((-1,), (4,)) for p in (pairs[0], pairs[1])):
        return Mismatch("rotate_every_two's Unsqueeze does not add a last axis")
    neg = producer_op(pairs[0].inputs[0], "Neg")
    odd = None if neg is None else producer_op(neg.inputs[0], "Slice")
    even = producer_op(pairs[1].inputs[0], "Slice")
    if neg is None or odd is None or even is None:
        return Mismatch("rotate_every_two is not (-x[..., 1::2], x[..., ::2]) (Neg not first)")
    if not _step2_slice(odd, x, width, 1) or not _step2_slice(even, x, width, 0):
        return Mismatch(
            "rotate_every_two's step-2 slices are not x[..., 1::2] negated, then x[..., ::2]"
        )
    assert x.shape is not None
    target = const_ints(reshape.inputs[1]) if len(reshape.inputs) > 1 else None
    want = [*x.shape[:3], width]
    if target is None or not _reshape_target_ok(
        target, want, reshape.attributes.get_int("allowzero", 0)
    ):
        return Mismatch(f"rotate_every_two's pairs are reshaped to {target}, not back to x's shape")
    return [odd, neg, pairs[0], even, pairs[1], concat, reshape]


def _every_two_source(rotated: ir.Value | None) -> ir.Value | None:
    """``x`` of rotate_every_two(x) = ``Reshape(Concat(Unsqueeze(-x[..., 1::2]),
    Unsqueeze(x[..., ::2])))`` (read off the even Slice)."""
    reshape = producer_op(rotated, "Reshape")
    concat = None if reshape is None else producer_op(reshape.inputs[0], "Concat")
    if concat is None or len(concat.inputs) != 2:
        return None
    pair = producer_op(concat.inputs[1], "Unsqueeze")
    even = None if pair is None else producer_op(pair.inputs[0], "Slice")
    return None if even is None else even.inputs[0]


@dataclass(frozen=True)
class _Heads:
    """Where the heads were split: ``full = Reshape(x3, [0, 0, H, d])`` (BSNH) or a [B, H, S, d] tensor."""

    layout: str
    full: ir.Value  # the 4-D tensor whose first r dims per head rotate
    x3: ir.Value | None  # BSNH: the rank-3 tensor the head split read
    heads: int | None
    head_size: int


def _heads(x: ir.Value) -> list[_Heads] | Mismatch:
    """The layouts x may have. A head split ``Reshape(x3, [0, 0, H, d])`` is [B, S, H, d]; other
    rank-4 tensors may be [B, H, S, d] or [B, S, H, d] (CodeGen splits its heads out of a packed
    Q/K/V): which one, the cos/sin table's broadcast tells (it multiplies the positions' axis)."""
    window = last_axis_window(x)
    full = x
    if window is not None:
        if window.start != 0:
            return Mismatch("the rotated dims are not the first of each head")
        full = window.source
    if full.shape is None or len(full.shape) != 4 or not isinstance(full.shape[-1], int):
        return Mismatch("the rotary input is not rank 4 with a static head size")
    head_size = full.shape[-1]
    reshape = producer_op(full, "Reshape")
    source = None if reshape is None else reshape.inputs[0]
    if (
        reshape is not None
        and source is not None
        and source.shape is not None
        and len(source.shape) == 3
    ):
        target = const_ints(reshape.inputs[1]) if len(reshape.inputs) > 1 else None
        if reshape.attributes.get_int("allowzero", 0) or target is None or len(target) != 4:
            return Mismatch("the head split is not Reshape(x, [0, 0, H, d]) with a constant shape")
        if target[:2] != (0, 0) or target[3] != head_size:
            return Mismatch(
                f"the head split reshapes to {list(target)}, not [0, 0, H, {head_size}]"
            )
        declared = target[2] if target[2] > 0 else full.shape[2]
        hidden = source.shape[2]
        count: int | None = None
        if isinstance(declared, int) and declared > 0:
            count = declared
        elif isinstance(hidden, int) and hidden % head_size == 0:
            count = hidden // head_size
        return [_Heads(_BSNH, full, source, count, head_size)]
    heads_first, heads_second = full.shape[1], full.shape[2]
    return [
        _Heads(_BNSH, full, None, heads_first if isinstance(heads_first, int) else None, head_size),
        _Heads(
            _BSNH, full, None, heads_second if isinstance(heads_second, int) else None, head_size
        ),
    ]


def _sequence_of(x: ir.Value, heads: _Heads) -> object:
    if heads.layout == _BNSH:
        return positions_of(x)
    dim = None if heads.full.shape is None else heads.full.shape[1]
    if isinstance(dim, int) or heads.x3 is None or heads.x3.shape is None:
        return dim
    return heads.x3.shape[1]


def _tables(
    x: ir.Value,
    rotated: ir.Value,
    cos_mul: ir.Node,
    sin_mul: ir.Node,
    heads: _Heads,
    width: int,
) -> dict[str, RotaryTable] | Mismatch:
    """The cos and sin tables, proven to broadcast as ``heads.layout`` wants, one row per position."""
    positions = _sequence_of(x, heads)
    tables = {}
    for name, mul, operand in (("cos", cos_mul, x), ("sin", sin_mul, rotated)):
        table = _table(other_input(mul, operand), heads.layout, positions)
        if isinstance(table, Mismatch):
            return table
        if table.trig and table.trig != name.capitalize():
            return Mismatch(f"the {name} product's table comes from {table.trig}")
        if table.constant is not None:
            if table.constant.shape[1] != width // 2:
                return Mismatch(f"the {name} table is not half the rotated width {width}")
            if x.dtype is None or table.constant.dtype != x.dtype.numpy():
                return Mismatch(f"the {name} table's type differs from the rotated tensor's")
        tables[name] = table
    return tables


def _match_core(add: ir.Node, context: RewriteContext, partial: bool) -> Match | Mismatch:
    found = rotation_products(add, _every_two_source, "rotate_every_two")
    if isinstance(found, Mismatch):
        return found
    cos_mul, sin_mul, x, rotated = found
    if x.shape is None or len(x.shape) != 4 or not isinstance(x.shape[3], int) or x.shape[3] % 2:
        return Mismatch("the rotary input is not rank 4 with a static even number of rotated dims")
    width = x.shape[3]
    layouts = _heads(x)
    if isinstance(layouts, Mismatch):
        return layouts
    window = last_axis_window(x)
    if window is not None and window.end - window.start != width:
        return Mismatch("the rotated slice's width differs from its inferred shape")
    if not partial and width != layouts[0].head_size:
        return Mismatch(
            "partial rotary: fused at the Concat with the pass-through dims", candidate=False
        )
    rotation = _rotate_every_two(rotated, x, width)
    if isinstance(rotation, Mismatch):
        return rotation
    misses: list[Mismatch] = []
    for heads in layouts:
        found_tables = _tables(x, rotated, cos_mul, sin_mul, heads, width)
        if not isinstance(found_tables, Mismatch):
            break
        misses.append(found_tables)
    else:
        # The reason from the layout the tables do broadcast for, when there is one.
        return next((m for m in misses if "broadcasts over axis" not in m.reason), misses[0])
    tables = found_tables
    if x.dtype not in ROTARY_FLOATS:
        return Mismatch("the rotary input is not float or float16")
    if context.options.target == "onnx" and context.opset() < ROTARY_OPSET:
        return Mismatch(
            f"RotaryEmbedding needs opset {ROTARY_OPSET}, the model imports {context.opset()}"
        )
    if heads.heads is None and (heads.layout == _BSNH or width != heads.head_size):
        return Mismatch("the head count is not static (RotaryEmbedding needs num_heads)")
    core = [cos_mul, *rotation, sin_mul, add]
    for inner in core[:-1]:
        if inner.outputs[0].is_graph_output() or any(
            use.node not in core for use in inner.outputs[0].uses()
        ):
            return Mismatch(
                f"intermediate {inner.op_type} result is used outside the rotary pattern"
            )
    shared = list(dict.fromkeys([*tables["cos"].nodes, *tables["sin"].nodes]))
    split = heads.full.producer() if heads.x3 is not None else None
    # Producers first: the driver drops matched nodes left without users, last to first. The
    # head split goes first (the partial rule moves it ahead of its slices).
    return Match(
        [*([split] if split is not None else []), *shared, *core],
        {"heads": heads, "width": width, "cos": tables["cos"], "sin": tables["sin"], "x": x},
    )


def _match_full(add: ir.Node, context: RewriteContext) -> Match | Mismatch:
    return _match_core(add, context, partial=False)


def _match_partial(concat: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Concat(rope(x[..., :r]), x[..., r:])``: the rotary of the first r dims of each head."""
    if len(concat.inputs) != 2 or concat.attributes.get_int("axis", 0) not in (-1, 3):
        return Mismatch("not a two-part Concat of the head dim", candidate=False)
    add = producer_op(concat.inputs[0], "Add")
    if add is None:
        return Mismatch("the Concat's first part is not a rotary (Add)", candidate=False)
    match = _match_core(add, context, partial=True)
    if isinstance(match, Mismatch):
        return match
    heads: _Heads = match.bindings["heads"]
    width: int = match.bindings["width"]
    kept = last_axis_window(concat.inputs[1])
    if (
        kept is None
        or kept.source is not heads.full
        or (kept.start, kept.end)
        != (
            width,
            heads.head_size,
        )
    ):
        return Mismatch("the part concatenated after the rotary is not x[..., r:] unchanged")
    add_out = add.outputs[0]
    if add_out.is_graph_output() or any(use.node is not concat for use in add_out.uses()):
        return Mismatch("the rotated part is also used outside the Concat")
    x: ir.Value = match.bindings["x"]
    slices = [v.producer() for v in (x, concat.inputs[1]) if v is not None]
    extra = [
        n
        for n in dict.fromkeys(slices)
        if n is not None and (is_op(n, "Slice") or is_op(n, "Split"))
    ]
    split = heads.full.producer() if heads.x3 is not None else None
    head_split = [split] if split is not None else []
    rest = [n for n in match.nodes if n is not split]
    return Match([*head_split, *extra, *rest, concat], match.bindings)


def _batch_caches(
    tables: tuple[RotaryTable, RotaryTable],
    width: int,
    source: ir.Value,
    layout: str,
    nodes: list[ir.Node],
    constants: list[ir.Value],
) -> list[ir.Value]:
    """[B, S, r/2] caches for RotaryEmbedding-23 without position_ids: the [1, S, r/2] rows the
    graph multiplied by (a constant table's first S rows), broadcast over the batch."""
    sequence_axis = 1 if layout == _BSNH else 2
    batch = ir.node("Shape", [source], {"start": 0, "end": 1})
    ones = new_constant(np.array([1, 1], dtype=np.int64), "rotary_cache_tail")
    constants.append(ones)
    target = ir.node("Concat", [batch.outputs[0], ones], {"axis": 0})
    nodes.extend([batch, target])
    caches = []
    for table in tables:
        cache = rotary_cache(table, width, False, nodes, constants)
        if table.constant is not None:
            # The constant holds max_positions rows; position s reads row s.
            length = ir.node("Shape", [source], {"start": sequence_axis, "end": sequence_axis + 1})
            zero, one = (new_constant(np.array([v], dtype=np.int64), "rotary_rows") for v in (0, 1))
            constants.extend([zero, one])
            rows = ir.node("Slice", [cache, zero, length.outputs[0], one])
            nodes.extend([length, rows])
            cache = rows.outputs[0]
        expand = ir.node("Expand", [cache, target.outputs[0]])
        nodes.append(expand)
        caches.append(expand.outputs[0])
    return caches


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    b = match.bindings
    heads: _Heads = b["heads"]
    width: int = b["width"]
    nodes: list[ir.Node] = []
    constants: list[ir.Value] = []
    source = heads.x3 if heads.layout == _BSNH else heads.full
    if source is None:
        # [B, S, H, d] not split from a rank-3 tensor here: merge the heads for the op and back.
        merged = new_constant(np.array([0, 0, -1], dtype=np.int64), "rotary_merge_heads")
        constants.append(merged)
        flat = ir.node("Reshape", [heads.full, merged])
        nodes.append(flat)
        source = flat.outputs[0]
        source.type = heads.full.type
        assert heads.full.shape is not None and heads.heads is not None
        source.shape = ir.Shape([*heads.full.shape[:2], heads.heads * heads.head_size])
    attributes: dict[str, int] = {"interleaved": 1}
    if heads.heads is not None:
        attributes["num_heads"] = heads.heads
    if width != heads.head_size:
        attributes["rotary_embedding_dim"] = width
    if context.options.target == "ort":
        cos = rotary_cache(b["cos"], width, True, nodes, constants)
        sin = rotary_cache(b["sin"], width, True, nodes, constants)
        offset = new_constant(np.array([0], dtype=np.int64), "rotary_position_offset")
        constants.append(offset)
        new = ir.node("RotaryEmbedding", [source, offset, cos, sin], attributes, domain=MS_DOMAIN)
        ensure_opset(context.model, MS_DOMAIN, 1)
    else:
        cos, sin = _batch_caches(
            (b["cos"], b["sin"]), width, source, heads.layout, nodes, constants
        )
        new = ir.node("RotaryEmbedding", [source, cos, sin], attributes)
    same_shape_as(new.outputs[0], source)
    nodes.append(new)
    result = new.outputs[0]
    if heads.layout == _BSNH:
        split = heads.full.producer()
        if heads.x3 is not None and split is not None:
            shape = split.inputs[1]
        else:
            assert heads.heads is not None
            shape = new_constant(
                np.array([0, 0, heads.heads, heads.head_size], dtype=np.int64), "rotary_heads"
            )
            constants.append(shape)
        back = ir.node("Reshape", [result, shape])
        same_shape_as(back.outputs[0], heads.full)
        nodes.append(back)
        result = back.outputs[0]
    return Replacement(nodes, [(match.root.outputs[0], result)], constants=constants)


RULES = (
    Rule("interleaved-rotary->RotaryEmbedding", "Add", _match_full, _rewrite),
    Rule("partial-interleaved-rotary->RotaryEmbedding", "Concat", _match_partial, _rewrite),
)


class FuseInterleavedRotaryPass(RulePass):
    """x*cos + rotate_every_two(x)*sin (GPT-J, CodeGen, Cohere), partial or full ->
    com.microsoft.RotaryEmbedding(interleaved=1); runs before attention, which then sees a plain
    head split."""

    name = "fuse-interleaved-rotary"
    summary = "fuse interleaved (GPT-J style) rotary embeddings, partial or full (ort)"
    rules = RULES
