"""Fuse rotary position embeddings (RoPE, rotate-half form) as transformers' LLaMA exports them.

    y = x * cos + rotate_half(x) * sin,    rotate_half(x) = Concat(-x[..., H/2:], x[..., :H/2])

with ``x`` [B, N, S, H] (heads already split) and ``cos``/``sin`` [1, 1, S, H] broadcast over batch and
heads. Exporters compute them once per model as ``Unsqueeze(Cos(Concat(f, f)), 1)`` with
``f = positions * inv_freq`` [1, S, H/2], so both halves of ``cos`` are equal and ``Cos(f)`` is the
half-width cache the fused ops read. The caches are built from that same ``f`` (once per model,
shared by every layer): the sequence length stays dynamic. A constant ``cos``/``sin`` (static
exports fold them) gives constant caches.

Target ``ort``: com.microsoft.RotaryEmbedding(x, position_ids=[0], cos_cache [S, H/2], sin_cache)
with ``interleaved=0``; a one-element position_ids is ONNX Runtime's "offset" form: token ``s`` reads
cache row ``s``, which is the row the original graph multiplied it by.
With a KV cache the new tokens sit at positions P..P+S-1 (P the past length): exporters build
``f`` from ``Add(Range(0, S, 1), P)`` or ``Range(P, P + S, 1)``. The table then still has one row
per input position (row s holds position P+s, the one token s is multiplied by), so the same
offset-0 rotary is exact; only the row count has to be proven, and a one-element offset adds none.
A ``position_ids [B, S]`` input (Optimum's decoders: each row its own positions, e.g. left padding)
makes ``f`` [B, S, H/2]. Target ``ort`` then gets caches of f's B*S rows, ``Reshape(f, [-1, H/2])``,
and position_ids ``Reshape(Range(0, B*S, 1), [B, S])``: token (b, s) reads row b*S + s, which is
f[b, s]; the batch dim of f must provably be x's (B = 1 would broadcast). Target ``onnx`` takes the
[B, S, H/2] caches as they are (no position_ids).
Target ``onnx``: RotaryEmbedding (opset 23) without position_ids, caches expanded to [B, S, H/2] as
the standard op requires; older opsets are left alone (``--opset 23`` upgrades first).

GPT-OSS rotates the two halves of each head itself (``_apply_rotary_emb``)::

    x1, x2 = x[..., :H/2], x[..., H/2:]                  (Split, or two Slices)
    y = Concat(x1 * cos - x2 * sin, x2 * cos + x1 * sin)  (cos/sin [1, 1, S, H/2])

which is the rotate-half form above term by term (its first half is x1*cos - x2*sin, its second
x2*cos + x1*sin), with the half-width tables themselves as the caches (rule
``rotary-halves->RotaryEmbedding``, rooted at the Concat). YaRN and LongRoPE scale the tables:
``cos = Cos(f) * attention_scaling`` (1.3466 for GPT-OSS's factor 32). A scalar constant
multiplying Cos/Sin (before any Cast) is taken with the table, in both forms, and the caches get
the same product of the same Cos/Sin, shared by the layers.

Partial rotary (Phi's ``partial_rotary_factor``, GPT-NeoX's ``rotary_pct``, StableLM): only the
first ``r`` of the ``D`` dims of each head rotate,

    y = Concat(rope(x[..., :r]), x[..., r:])

with ``f`` [1, S, r/2]. The rotary of ``x[..., :r]`` fuses as above with H = r (its rotate_half may
slice ``x`` itself once merge-consecutive-ops has folded the two Slices); a second rule,
``partial-rotary->RotaryEmbedding``, then folds the Concat with the untouched ``x[..., r:]`` into
one RotaryEmbedding of ``x`` with ``rotary_embedding_dim = r`` (both ops define it that way: the
dims past r pass through). The caches stay [S, r/2] (contrib op) / [B, S, r/2] (opset 23), which is
what both specs require for partial rotation. The contrib op needs ``num_heads`` with
``rotary_embedding_dim`` (its kernel refuses the attribute alone), so the head count must be static.
Checked on ONNX Runtime 1.32 CPU: both ops rotate the first r dims and copy the rest bit for bit
(tests/test_fuse_rotary_embedding.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, const_array, is_op, static_shape
from onnxopt.passes._attention_shapes import dims_read
from onnxopt.passes._refine_shapes import _is_unknown, _unit_step_axes
from onnxopt.passes._shape_facts import (
    cast_target,
    const_ints,
    int_param,
    optional_input,
    slice_params,
)
from onnxopt.passes.base import RulePass
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import (
    ensure_opset,
    new_constant,
    other_input,
    producer_op,
    rank_of,
)

ROTARY_OPSET = 23
ROTARY_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16)


@dataclass(frozen=True)
class RotaryTable:
    """Where a cos/sin table comes from: ``f`` and the trig op (then Casts), or a constant cache."""

    freqs: ir.Value | None  # f [1, S, H/2]; None for a constant table
    trig: str  # "Cos" or "Sin"
    casts: tuple[ir.DataType, ...] = ()
    constant: np.ndarray | None = None  # [S, H/2] half-width cache
    # Concat, Cos/Sin, Casts, Unsqueeze: shared by every layer, removed with the last user.
    nodes: tuple[ir.Node, ...] = ()
    # The scalar constant Cos/Sin is multiplied by before any Cast (YaRN's and LongRoPE's
    # ``attention_scaling``: ``emb.cos() * attention_scaling``); None: no factor.
    factor: np.ndarray | None = None
    # The cache is the table negated: the sin of a rotate_half written Concat(x2, -x1).
    negate: bool = False
    # A constant table of P >= S rows read at positions 0..S-1 (older transformers' cos_cached
    # indexed by Range position ids): the number S those positions count.
    gathered_rows: object = None

    @property
    def batch(self) -> object:
        if self.freqs is None or self.freqs.shape is None:
            return None
        return self.freqs.shape[0] if len(self.freqs.shape) == 3 else 1  # [S, H/2]: no batch

    @property
    def per_row(self) -> bool:
        """Angles [B, S, H/2], one set per batch row (from a position_ids input), not [1, S, H/2]."""
        return self.freqs is not None and self.batch != 1


@dataclass(frozen=True)
class _Window:
    """``value = source[..., start:end]``: a unit-step Slice or a Split output along the last axis."""

    source: ir.Value
    start: int
    end: int


def last_axis_window(value: ir.Value | None) -> _Window | None:
    """Where ``value`` sits in the last axis of the tensor it was sliced or split from (static width)."""
    node = None if value is None else value.producer()
    if node is None or not node.inputs or node.inputs[0] is None:
        return None
    source = node.inputs[0]
    if source.shape is None or not isinstance(source.shape[-1], int):
        return None
    rank, width = len(source.shape), source.shape[-1]
    if is_op(node, "Slice"):
        params = slice_params(node)
        if isinstance(params, Mismatch) or len(params.starts) != 1 or params.steps[0] != 1:
            return None
        if params.axes[0] % rank != rank - 1:
            return None
        start, end = (
            min(max(i + width if i < 0 else i, 0), width)
            for i in (params.starts[0], params.ends[0])
        )
        return _Window(source, start, end) if start < end else None
    if is_op(node, "Split"):
        if node.attributes.get_int("axis", 0) % rank != rank - 1:
            return None
        sizes = int_param(node, "split", 1)
        if isinstance(sizes, Mismatch):
            return None
        if sizes is None:
            parts = len(node.outputs)
            if width % parts:
                return None
            sizes = (width // parts,) * parts
        if sum(sizes) != width or len(sizes) != len(node.outputs):
            return None
        index = next(i for i, out in enumerate(node.outputs) if out is value)
        start = sum(sizes[:index])
        return _Window(source, start, start + sizes[index])
    return None


def _dim_name(dim: object) -> object:
    return dim.value if isinstance(dim, ir.SymbolicDim) else dim


def same_dim(a: object, b: object) -> bool:
    """Equal ints, or the same named symbolic dim (inference placeholders "unk__N" prove nothing)."""
    if _is_unknown(a) or _is_unknown(b):
        return False
    a, b = _dim_name(a), _dim_name(b)
    return a is not None and a == b


def dim_of_scalar(value: ir.Value | None) -> object:
    """The dim a scalar stands for: ``Gather(Shape(v), k)`` or ``Squeeze(Shape(v, k, k+1))`` -> v.shape[k]."""
    node = None if value is None else value.producer()
    if node is None or not node.inputs or node.inputs[0] is None:
        return None
    if is_op(node, "Cast"):
        return dim_of_scalar(node.inputs[0])
    shape = node.inputs[0].producer()
    if not is_op(shape, "Shape") or shape is None or shape.inputs[0] is None:
        return None
    source = shape.inputs[0]
    start = shape.attributes.get_int("start", 0)
    if is_op(node, "Gather") and len(node.inputs) > 1:
        index = const_ints(node.inputs[1])
        if index is None or len(index) != 1 or node.attributes.get_int("axis", 0) != 0:
            return None
        offset = index[0]
    elif is_op(node, "Squeeze"):
        end = shape.attributes.get_int("end", None)
        if end is None or end - start != 1:
            return None
        offset = 0
    else:
        return None
    if source.shape is None or start < 0 or offset < 0 or start + offset >= len(source.shape):
        return None
    return source.shape[start + offset]


def _is_scalar(value: ir.Value | None) -> bool:
    """A one-element value ([] or [1]): added to a Range it shifts the positions, never adds rows."""
    return value is not None and value.shape is not None and static_shape(value) in ((), (1,))


def _range_length(node: ir.Node) -> object:
    """The dim ``Range(a, b, 1)`` counts when provably a dim: ``Range(0, n, 1)`` or, a KV cache's
    positions P..P+S-1, ``Range(p, Add(p, n), 1)``; n read off a Shape."""
    if len(node.inputs) != 3:
        return None
    step = const_array(node.inputs[2])
    if step is None or step.size != 1 or float(step.reshape(())) != 1:
        return None
    start_value, end_value = node.inputs[0], node.inputs[1]
    start = const_array(start_value)
    if start is not None and start.size == 1 and float(start.reshape(())) == 0:
        return dim_of_scalar(end_value)
    add = producer_op(end_value, "Add")
    if add is None or start_value is None or start_value not in add.inputs:
        return None
    if not _is_scalar(start_value) or not _is_scalar(end_value):
        return None
    return dim_of_scalar(other_input(add, start_value))


def rows_of(freqs: ir.Value) -> object:
    """The number of rows (positions) of ``f`` [1, S, H/2]: its inferred dim, or the length n of the
    Range its positions count: ``Range(0, n, 1)``, shifted by a one-element offset (a KV cache's
    past length P: positions P..P+S-1, ``Add(Range(0, n, 1), P)``) or ``Range(P, P + n, 1)``.
    Which positions they are does not matter: row s of the table is the one token s reads."""
    assert freqs.shape is not None
    rows = freqs.shape[-2]
    mul = producer_op(freqs, "Mul")
    if mul is None:
        return rows
    for operand in mul.inputs[:2]:
        node = None if operand is None else operand.producer()
        while node is not None and (
            is_op(node, "Cast")
            or is_op(node, "Unsqueeze")
            or (is_op(node, "Add") and any(_is_scalar(v) for v in node.inputs[:2]))
        ):
            if is_op(node, "Add"):  # the position offset: the other operand counts the rows
                scalar = next(v for v in node.inputs[:2] if _is_scalar(v))
                ranged = other_input(node, scalar) if node.inputs[0] is not node.inputs[1] else None
                node = None if ranged is None else ranged.producer()
                continue
            node = node.inputs[0].producer() if node.inputs[0] is not None else None
        if is_op(node, "Range") and node is not None:
            found = _range_length(node)
            if found is not None:
                return found
    return rows


def _dim_through_head_split(x: ir.Value, axis: int, source_axis: int) -> object:
    """x's dim ``axis``, looking through the head split ``Transpose(Reshape(v, [0, 0, N, H]),
    [0, 2, 1, 3])`` when it is not a static int (shape inference loses it at opset 21+): a 0 in the
    Reshape target copies v's dim ``source_axis``. A slice of the head dim (partial rotary) has the
    dims of the tensor it was sliced from."""
    assert x.shape is not None
    dim = x.shape[axis]
    window = last_axis_window(x)
    if window is not None and _is_unknown(dim):
        return _dim_through_head_split(window.source, axis, source_axis)
    transpose = producer_op(x, "Transpose")
    if isinstance(dim, int) or transpose is None:
        return dim
    if tuple(transpose.attributes.get_ints("perm", ())) != (0, 2, 1, 3):
        return dim
    reshape = producer_op(transpose.inputs[0], "Reshape")
    if reshape is None or reshape.attributes.get_int("allowzero", 0) != 0:
        return dim
    target = const_ints(reshape.inputs[1]) if len(reshape.inputs) > 1 else None
    source = reshape.inputs[0]
    if target is None or len(target) != 4 or target[source_axis] != 0 or source is None:
        return dim
    if source.shape is None or len(source.shape) <= source_axis:
        return dim
    return source.shape[source_axis]


def positions_of(x: ir.Value) -> object:
    """x's sequence dim (axis 2; v's dim 1 through the head split)."""
    return _dim_through_head_split(x, 2, 1)


def _batch_of(x: ir.Value) -> object:
    """x's batch dim (axis 0; v's dim 0 through the head split)."""
    return _dim_through_head_split(x, 0, 0)


def _table(
    value: ir.Value | None, head: int, half_width: bool = False, heads_last: bool = False
) -> RotaryTable | Mismatch:
    """The cos/sin operand [1, 1, S, H] traced back to its half-width source; with ``half_width``
    the operand is itself [1, 1, S, H/2] (GPT-OSS multiplies each half of x by it); with
    ``heads_last`` it is [1, S, 1, H], for x [B, S, N, H]."""
    width = head // 2 if half_width else head
    array = const_array(value)
    if array is not None:
        if heads_last:
            if array.ndim != 4 or (array.shape[0], array.shape[2], array.shape[3]) != (1, 1, width):
                return Mismatch(
                    f"constant cos/sin has shape {list(array.shape)}, not [1, S, 1, {width}]"
                )
            array = array.reshape(1, 1, array.shape[1], width)
        if array.ndim < 2 or any(d != 1 for d in array.shape[:-2]) or array.shape[-1] != width:
            return Mismatch(
                f"constant cos/sin has shape {list(array.shape)}, not [1, 1, S, {width}] "
                f"(or [1, S, 1, {width}] for heads after the sequence)"
            )
        rows = array.reshape(array.shape[-2], width)
        if not half_width and not np.array_equal(rows[:, : head // 2], rows[:, head // 2 :]):
            return Mismatch("constant cos/sin halves differ (not rotate-half RoPE)")
        return RotaryTable(None, "", constant=np.ascontiguousarray(rows[:, : head // 2]))
    if not half_width and not heads_last:
        gathered = _gathered_table(value, head)
        if gathered is not None:
            return gathered
    trig = None if value is None else value.producer()
    if not half_width and trig is not None and (is_op(trig, "Cos") or is_op(trig, "Sin")):
        constant_angles = _constant_angles(trig, head)
        if constant_angles is not None:
            return constant_angles
        tiled = _tiled_angles(trig, head)
        if tiled is not None:
            return tiled
    unsqueeze = producer_op(value, "Unsqueeze")
    if unsqueeze is None:
        return Mismatch("cos/sin is neither a constant nor Unsqueeze(Cos/Sin(...), 1)")
    axes = int_param(unsqueeze, "axes", 1)
    if axes not in (((2,), (-2,)) if heads_last else ((1,), (-3,))):
        where = 2 if heads_last else 1
        return Mismatch(f"cos/sin Unsqueeze axes are {axes}, not [{where}] (the heads axis)")
    inner = unsqueeze.inputs[0]
    casts: list[ir.DataType] = []
    chain = [unsqueeze]
    node = None if inner is None else inner.producer()
    # DeepSeek / GLM's interleaved rotary reads the first half of the full table,
    # Cos(Concat(f, f))[..., :H/2], which is Cos(f): the full table is traced as usual.
    full_table = False
    if half_width and is_op(node, "Slice") and node is not None:
        window = last_axis_window(inner)
        if window is None or (window.start, window.end) != (0, width):
            return Mismatch("cos/sin is a slice of a table other than its first half")
        if window.source.shape is None or window.source.shape[-1] != head:
            return Mismatch("cos/sin is the first half of a table that is not rotary width wide")
        chain.insert(0, node)
        node = window.source.producer()
        full_table = True
    while is_op(node, "Cast") and node is not None:
        to = cast_target(node)
        if to is None:
            return Mismatch("cos/sin Cast has no readable target type")
        casts.insert(0, to)
        chain.insert(0, node)
        node = node.inputs[0].producer() if node.inputs[0] is not None else None
    factor = None
    if is_op(node, "Mul") and node is not None:
        scaled = _scaled_trig(node)
        if scaled is None:
            return Mismatch("cos/sin is a product, not Cos/Sin(...) times a scalar constant")
        trig_value, factor = scaled
        chain.insert(0, node)
        node = trig_value.producer()
    if node is None or not (is_op(node, "Cos") or is_op(node, "Sin")):
        return Mismatch("cos/sin is not computed by Cos/Sin")
    trig = node
    freqs = node.inputs[0]
    nodes: tuple[ir.Node, ...] = (node, *chain)
    if not half_width or full_table:
        concat = producer_op(node.inputs[0], "Concat")
        if concat is None or len(concat.inputs) != 2 or concat.inputs[0] is not concat.inputs[1]:
            return Mismatch(
                f"{node.op_type} input is not Concat(f, f) (both halves the same angles)"
            )
        if concat.attributes.get_int("axis", 0) not in (-1, 2):
            return Mismatch("rotary angles are not concatenated on the last axis")
        freqs = concat.inputs[0]
        nodes = (concat, *nodes)
    assert freqs is not None
    if freqs.shape is None or len(freqs.shape) != 3:
        return Mismatch("rotary angles are not rank 3 [1, S, H/2]")
    if freqs.shape[2] != head // 2:
        return Mismatch(
            f"rotary angles have {freqs.shape[2]} columns, not rotary width / 2 = {head // 2}"
        )
    return RotaryTable(freqs, trig.op_type, tuple(casts), nodes=nodes, factor=factor)


def range_end(indices: ir.Value | None, axes: tuple[int, ...]) -> ir.Value | None:
    """The n of position indices ``Unsqueeze(Range(0, n, 1), axes)``, else None."""
    unsqueeze = producer_op(indices, "Unsqueeze")
    if unsqueeze is None or int_param(unsqueeze, "axes", 1) != axes:
        return None
    node = producer_op(unsqueeze.inputs[0], "Range")
    if node is None or len(node.inputs) != 3 or not _counts_from_zero(node):
        return None
    return node.inputs[1]


def _gathered_rows(ids: ir.Value | None, axes: tuple[int, ...]) -> object:
    """The dim n is read off, for gather indices ``Unsqueeze(Range(0, n, 1), axes)``; else None."""
    end = range_end(ids, axes)
    return None if end is None else dim_of_scalar(end)


def _gathered_table(value: ir.Value | None, head: int) -> RotaryTable | Mismatch | None:
    """``Unsqueeze(Gather(T[0:X], ids), 1)`` (or GatherND of the ids with a last axis) with T a
    constant [P, H] table whose halves are equal and the ids ``Range(0, S)`` positions:
    transformers before 4.38 (and Mixtral, PhiMoE up to 4.46) index a precomputed ``cos_cached``
    by the position ids. Rows 0..S-1 of T: the cache is T's first half, read from position 0
    (S <= P, else the export's own gather fails). None where ``value`` is not such a gather."""
    unsqueeze = producer_op(value, "Unsqueeze")
    if unsqueeze is None or int_param(unsqueeze, "axes", 1) not in ((1,), (-3,)):
        return None
    gather = unsqueeze.inputs[0].producer() if unsqueeze.inputs[0] is not None else None
    if is_op(gather, "Gather") and gather is not None:
        if gather.attributes.get_int("axis", 0) != 0:
            return None
        rows = _gathered_rows(gather.inputs[1], (0,))
    elif is_op(gather, "GatherND") and gather is not None:
        if gather.attributes.get_int("batch_dims", 0) != 0:
            return None
        # [1, S, 1] indices: dynamo unsqueezes the Range at axes 0 and 2 at once
        rows = _gathered_rows(gather.inputs[1], (0, 2))
        last = producer_op(gather.inputs[1], "Unsqueeze")
        if rows is None and last is not None and int_param(last, "axes", 1) in ((-1,), (2,)):
            rows = _gathered_rows(last.inputs[0], (0,))
    else:
        return None
    nodes = [gather, unsqueeze]
    source = gather.inputs[0]
    prefix = producer_op(source, "Slice")
    if prefix is not None:  # cos_cached[:seq_len]: rows from 0, step 1
        starts = const_ints(optional_input(prefix, 1))
        if starts != (0,) or _unit_step_axes(prefix, 2, 1) != (0,):
            return None
        nodes.insert(0, prefix)
        source = prefix.inputs[0]
    table = const_array(source)
    if table is None or table.ndim != 2 or table.shape[1] != head:
        return None
    if not np.array_equal(table[:, : head // 2], table[:, head // 2 :]):
        return Mismatch("the gathered cos/sin table's halves differ (not rotate-half RoPE)")
    if rows is None:
        return Mismatch(
            "the cos/sin table is gathered at position ids that are not Range(0, S): a past "
            "offset or a position_ids input"
        )
    cache = np.ascontiguousarray(table[:, : head // 2])
    return RotaryTable(None, "", constant=cache, nodes=tuple(nodes), gathered_rows=rows)


def _tiled_angles(trig: ir.Node, head: int) -> RotaryTable | None:
    """Cos/Sin of ``Tile(a, [1, 2])``, a [S, H/2] computed at run time: DINOv3's TorchScript
    export builds its patch grid's angles from two constants (the growth policy keeps them
    unfolded), and tiling them is ``Concat(a, a)`` on the last axis. a is the half-width angles."""
    tile = producer_op(trig.inputs[0], "Tile")
    if tile is None or len(tile.inputs) < 2:
        return None
    angles, repeats = tile.inputs[0], const_ints(tile.inputs[1])
    if angles is None or angles.shape is None or len(angles.shape) != 2 or repeats != (1, 2):
        return None
    if angles.shape[1] != head // 2 or angles.dtype not in ROTARY_FLOATS:
        return None
    return RotaryTable(angles, trig.op_type, nodes=(tile, trig))


def _constant_angles(trig: ir.Node, head: int) -> RotaryTable | Mismatch | None:
    """Cos/Sin of a constant angle table [S, H] (leading 1s allowed) whose halves are equal:
    DINOv3's 2-D RoPE, angles of the patch grid tiled twice and folded by the exporter. The table
    is the angles' first half, [1, S, H/2], as a new constant; None when the angles are not a
    constant."""
    angles = const_array(trig.inputs[0])
    if angles is None:
        return None
    if angles.ndim < 2 or any(d != 1 for d in angles.shape[:-2]) or angles.shape[-1] != head:
        return Mismatch(f"constant rotary angles have shape {list(angles.shape)}, not [S, {head}]")
    rows = angles.reshape(angles.shape[-2], head)
    if angles.dtype.kind != "f" or not np.array_equal(rows[:, : head // 2], rows[:, head // 2 :]):
        return Mismatch("constant rotary angles' halves differ (not rotate-half RoPE)")
    freqs = new_constant(rows[None, :, : head // 2], "rotary_angles")  # shaped [1, S, H/2]
    return RotaryTable(freqs, trig.op_type, nodes=(trig,))


def _scaled_trig(mul: ir.Node) -> tuple[ir.Value, np.ndarray] | None:
    """(Cos/Sin output, the factor) of ``Mul(Cos/Sin(f), a)``, a a one-element float constant."""
    for trig, other in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
        factor = const_array(other)
        if (
            trig is not None
            and (producer_op(trig, "Cos") is not None or producer_op(trig, "Sin") is not None)
            and factor is not None
            and factor.size == 1
            and factor.dtype.kind == "f"
        ):
            return trig, factor.reshape(())
    return None


def _outer_slice(x: ir.Value | None) -> tuple[ir.Value, dict[int, tuple[int, int]]] | None:
    """(v, {axis: (start, end)}) when ``x = v[..., a:b, ...]`` slices only axes before the last,
    by unit steps (DINOv3 ropes its patch tokens, ``q[:, :, p:]``, not its prefix tokens)."""
    node = None if x is None else x.producer()
    if not is_op(node, "Slice") or node is None or node.inputs[0] is None:
        return None
    rank = None if x is None or x.shape is None else len(x.shape)
    params = slice_params(node)
    if rank is None or isinstance(params, Mismatch) or any(step != 1 for step in params.steps):
        return None
    axes = [axis % rank for axis in params.axes]
    if rank - 1 in axes:
        return None
    return node.inputs[0], {
        axis: (start, end)
        for axis, start, end in zip(axes, params.starts, params.ends, strict=True)
    }


def _last_axis_part(half: ir.Node, x: ir.Value) -> tuple[int, int] | None:
    """(start, end) on the last axis when ``half`` is ``x[..., start:end]`` written as one Slice of
    the tensor x was sliced from on other axes: merge-consecutive-ops merges
    ``v[:, :, p:][..., :H/2]`` into ``v[:, :, p:, :H/2]``."""
    outer = _outer_slice(x)
    params = slice_params(half)
    if outer is None or half.inputs[0] is not outer[0] or isinstance(params, Mismatch):
        return None
    assert x.shape is not None  # _outer_slice knows x's rank
    rank = len(x.shape)
    bounds = {
        axis % rank: (start, end, step)
        for axis, start, end, step in zip(
            params.axes, params.starts, params.ends, params.steps, strict=True
        )
    }
    last = bounds.pop(rank - 1, None)
    if last is None or last[2] != 1 or bounds != {a: (*b, 1) for a, b in outer[1].items()}:
        return None
    return last[0], last[1]


def _rotate_half(
    value: ir.Value | None, x: ir.Value, head: int
) -> tuple[list[ir.Node], bool] | Mismatch:
    """([Slice, Slice, Neg, Concat], False) when ``value = Concat(-x[..., H/2:], x[..., :H/2])``;
    (..., True) when ``value = Concat(x[..., H/2:], -x[..., :H/2])`` (NanoChat), the same rotation
    by -angle: since x1 cos + x2 sin = x1 cos - x2 (-sin), it is the rotary with the sin table
    negated.

    When ``x = v[..., a:a+H]`` the halves may be sliced out of ``v`` directly (``v[..., a+H/2:a+H]``,
    ``v[..., a:a+H/2]``: merge-consecutive-ops folds Slice-of-Slice so), and likewise when x
    slices other axes of v (``_last_axis_part``)."""
    concat = producer_op(value, "Concat")
    if concat is None or len(concat.inputs) != 2:
        return Mismatch("no rotate_half (Concat of two halves) in the sin product", candidate=False)
    if concat.attributes.get_int("axis", 0) not in (-1, 3):
        return Mismatch("rotate_half Concat is not on the last axis")
    first, second = concat.inputs
    negated = producer_op(first, "Neg") is None  # Concat(x2, -x1)
    neg = producer_op(second if negated else first, "Neg")
    neg_input = None if neg is None else neg.inputs[0]
    high = producer_op(first if negated else neg_input, "Slice")
    low = producer_op(neg_input if negated else second, "Slice")
    if neg is None or high is None or low is None:
        return Mismatch(
            "rotate_half is not Concat(Neg(Slice(x)), Slice(x)) or Concat(Slice(x), Neg(Slice(x))) "
            "(interleaved RoPE?)"
        )
    half = head // 2
    x_window = last_axis_window(x)
    for node, want in ((low, (0, half)), (high, (half, head))):
        offset, limit = 0, head
        part = _last_axis_part(node, x)
        if part is not None:
            if part[0] < 0 or (part[0], min(part[1], head)) != want:
                return Mismatch(
                    f"rotate_half slices [{part[0]}:{part[1]}], expected the halves of {head}"
                )
            continue
        if node.inputs[0] is not x:
            if x_window is None or node.inputs[0] is not x_window.source:
                return Mismatch("rotate_half slices a different tensor than the cos product")
            offset, limit = x_window.start, x_window.end
        params = slice_params(node)
        if isinstance(params, Mismatch):
            return params
        if len(params.starts) != 1 or params.axes[0] not in (-1, 3) or params.steps[0] != 1:
            return Mismatch("rotate_half Slice is not a unit-step slice of the last axis")
        start, end = params.starts[0], params.ends[0]
        if start < 0 or (start - offset, min(end, limit) - offset) != want:
            return Mismatch(
                f"rotate_half slices [{start - offset}:{end - offset}], expected the halves of {head}"
            )
    return [low, high, neg, concat], negated


def rotation_products(
    add: ir.Node, sliced_by: Callable[[ir.Value | None], ir.Value | None], rotation: str
) -> tuple[ir.Node, ir.Node, ir.Value, ir.Value] | Mismatch:
    """(cos Mul, sin Mul, x, rotate(x)) of ``Add(x * cos, rotate(x) * sin)``, in either operand
    order. ``sliced_by(r)`` is the tensor the rotation ``r`` slices its halves or pairs from (None:
    ``r`` is not that rotation); x must be it, or a last-axis window of it (partial rotary)."""
    muls = [producer_op(v, "Mul") for v in add.inputs[:2]]
    if muls[0] is None or muls[1] is None:
        return Mismatch("Add is not of two products", candidate=False)
    for cos_mul, sin_mul in ((muls[0], muls[1]), (muls[1], muls[0])):
        for rotated in sin_mul.inputs[:2]:
            sliced = sliced_by(rotated)
            if rotated is None or sliced is None:
                continue
            for x in cos_mul.inputs[:2]:
                window = last_axis_window(x)
                outer = _outer_slice(x)
                if x is not None and (
                    x is sliced
                    or (window is not None and window.source is sliced)
                    or (outer is not None and outer[0] is sliced)
                ):
                    return cos_mul, sin_mul, x, rotated
    return Mismatch(f"no product with a {rotation}", candidate=False)


def _rotate_half_source(rotated: ir.Value | None) -> ir.Value | None:
    """``x`` of ``Concat(-x[..., H/2:], x[..., :H/2])`` (read off the second half's Slice), or of
    ``Concat(x[..., H/2:], -x[..., :H/2])``."""
    concat = producer_op(rotated, "Concat")
    if concat is None or len(concat.inputs) != 2:
        return None
    second = concat.inputs[1]
    neg = producer_op(second, "Neg")
    low = producer_op(second if neg is None else neg.inputs[0], "Slice")
    return None if low is None else low.inputs[0]


def _match(add: ir.Node, context: RewriteContext) -> Match | Mismatch:
    found = rotation_products(add, _rotate_half_source, "rotate_half Concat")
    if isinstance(found, Mismatch):
        return found
    cos_mul, sin_mul, x, rotated = found
    shape = x.shape
    if shape is None or len(shape) != 4:
        return Mismatch("rotary input is not rank 4 [batch, heads, sequence, head_size]")
    head = shape[3]
    if not isinstance(head, int) or head % 2:
        return Mismatch(f"rotary width {head} (the rotated dims) is not a static even number")
    rotation = _rotate_half(rotated, x, head)
    if isinstance(rotation, Mismatch):
        return rotation
    rotate_nodes, negated = rotation
    cos_value = other_input(cos_mul, x)
    heads_last = _heads_last(cos_value)
    if heads_last and not isinstance(shape[2], int):
        return Mismatch("x is [B, S, N, H] with N not static: no [B, S, N*H] view to rotate")
    cos = _table(cos_value, head, heads_last=heads_last)
    sin = _table(other_input(sin_mul, rotated), head, heads_last=heads_last)
    if negated and not isinstance(sin, Mismatch):
        sin = replace(sin, negate=True)
    core = [cos_mul, *rotate_nodes, sin_mul, add]
    return _rotary_match(context, x, cos, sin, core, heads_last=heads_last)


def _heads_last(table: ir.Value | None) -> bool:
    """The cos/sin operand is [1, S, 1, H] (a constant of that shape, or unsqueezed at axis 2): x
    is [B, S, N, H], rotated before its heads move ahead of the sequence (MLCD, Qwen2-VL's vision
    tower)."""
    array = const_array(table)
    if array is not None:
        return array.ndim == 4 and array.shape[2] == 1 and array.shape[1] != 1
    unsqueeze = producer_op(table, "Unsqueeze")
    return unsqueeze is not None and int_param(unsqueeze, "axes", 1) in ((2,), (-2,))


def _rotary_match(
    context: RewriteContext,
    x: ir.Value,
    cos: RotaryTable | Mismatch,
    sin: RotaryTable | Mismatch,
    core: list[ir.Node],
    inputs: Sequence[ir.Node] = (),
    heads_last: bool = False,
) -> Match | Mismatch:
    """The Match of a rotary of ``x`` [B, N, S, H] ([B, S, N, H] with ``heads_last``) by the
    ``cos``/``sin`` tables that ``core`` computes (its last node the root), once the tables are
    proven to fit x; ``inputs`` (the slices of x) go with it where nothing else reads them."""
    assert x.shape is not None
    head = x.shape[3]
    positions = x.shape[1] if heads_last else positions_of(x)
    for name, table in (("cos", cos), ("sin", sin)):
        if isinstance(table, Mismatch):
            return table
        if table.trig and table.trig != name.capitalize():
            return Mismatch(f"the {name} product's table comes from {table.trig}")
        if table.freqs is not None and not same_dim(rows_of(table.freqs), positions):
            return Mismatch(f"cannot prove the {name} table has one row per input position")
        if table.per_row and not same_dim(table.batch, _batch_of(x)):
            return Mismatch(
                f"the {name} angles differ per batch row (a position_ids input): cannot prove "
                "they have the input's batch size"
            )
        if table.gathered_rows is not None:
            if not same_dim(table.gathered_rows, positions):
                return Mismatch(
                    f"cannot prove the {name} table is gathered at the input's positions 0..S-1"
                )
            if context.options.target == "onnx":
                return Mismatch(
                    f"the {name} table has more rows than positions: ONNX's RotaryEmbedding "
                    "without position_ids wants exactly S"
                )
        elif table.constant is not None and table.constant.shape[0] != positions:
            return Mismatch(
                f"constant {name} has {table.constant.shape[0]} rows, input has {positions} positions"
            )
    assert not isinstance(cos, Mismatch) and not isinstance(sin, Mismatch)
    if cos.per_row != sin.per_row:
        return Mismatch("one of cos and sin differs per batch row, the other does not")
    if x.dtype not in ROTARY_FLOATS:
        return Mismatch("rotary input is not float or float16")
    for inner in core[:-1]:
        if inner.outputs[0].is_graph_output() or any(
            use.node not in core for use in inner.outputs[0].uses()
        ):
            return Mismatch(
                f"intermediate {inner.op_type} result is used outside the rotary pattern"
            )
    if context.options.target == "onnx" and context.opset() < ROTARY_OPSET:
        return Mismatch(
            f"RotaryEmbedding needs opset {ROTARY_OPSET}, the model imports {context.opset()}"
        )
    # Producers first: the driver removes matched nodes last-to-first once they have no users.
    shared = list(dict.fromkeys([*cos.nodes, *sin.nodes, *inputs]))
    bindings = {"x": x, "cos": cos, "sin": sin, "head": head, "heads_last": heads_last}
    return Match([*shared, *core], bindings)


def _half_of(value: ir.Value | None) -> tuple[ir.Value, int] | None:
    """(x, 0) or (x, 1): ``value`` is the first or the second half of x's last axis."""
    window = last_axis_window(value)
    if window is None:
        return _even_or_odd(value)
    assert window.source.shape is not None
    width = window.source.shape[-1]
    assert isinstance(width, int)  # last_axis_window reads only static widths
    if width % 2:
        return None
    halves = {(0, width // 2): 0, (width // 2, width): 1}
    half = halves.get((window.start, window.end))
    return None if half is None else (window.source, half)


def _even_or_odd(value: ir.Value | None) -> tuple[ir.Value, int] | None:
    """(x, 0) for ``x[..., 0::2]``, (x, 1) for ``x[..., 1::2]``: DeepSeek's and GLM's interleaved
    pairs, rotated as the halves of ``Concat(x[..., 0::2], x[..., 1::2])``."""
    node = None if value is None else value.producer()
    if not is_op(node, "Slice") or node is None or node.inputs[0] is None:
        return None
    source = node.inputs[0]
    if source.shape is None or not isinstance(source.shape[-1], int) or source.shape[-1] % 2:
        return None
    params = slice_params(node)
    if isinstance(params, Mismatch) or len(params.starts) != 1 or params.steps[0] != 2:
        return None
    rank, width = len(source.shape), source.shape[-1]
    start, end = params.starts[0], params.ends[0]
    if params.axes[0] % rank != rank - 1 or start not in (0, 1):
        return None
    end = min(max(end + width if end < 0 else end, 0), width)
    if (end - start + 1) // 2 != width // 2:
        return None  # stops short of the last pair
    return source, start


def _interleaved(value: ir.Value | None) -> bool:
    return last_axis_window(value) is None and _even_or_odd(value) is not None


def _half_product(value: ir.Value | None) -> tuple[ir.Node, ir.Value, int, ir.Value] | None:
    """(Mul, x, which half, the other factor) of ``value = Mul(half of x, t)``, either order."""
    mul = producer_op(value, "Mul")
    if mul is None:
        return None
    for half, other in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
        found = _half_of(half)
        if found is not None and other is not None:
            return mul, found[0], found[1], other
    return None


def _match_halves(concat: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """GPT-OSS's rotary, ``Concat(x1 * cos - x2 * sin, x2 * cos + x1 * sin)`` on the last axis with
    ``x1, x2`` the halves of x and cos/sin [1, 1, S, H/2]: the rotate-half RoPE with the
    half-width tables as its caches (its first half is x1*cos - x2*sin, its second x2*cos + x1*sin).
    The pair may sit among other inputs of the Concat (DeepSeek's key, ``cat(k_nope, rope(k_pe))``,
    once merge-consecutive-ops has flattened the two Concats): the rest is concatenated around the
    rotary again."""
    rank = rank_of(concat.outputs[0])
    inputs = list(concat.inputs)
    at = next(
        (
            i
            for i in range(len(inputs) - 1)
            if producer_op(inputs[i], "Sub") is not None
            and producer_op(inputs[i + 1], "Add") is not None
        ),
        None,
    )
    if at is None:
        return Mismatch("not a Concat of a difference and a sum", candidate=False)
    sub, add = producer_op(inputs[at], "Sub"), producer_op(inputs[at + 1], "Add")
    assert sub is not None and add is not None
    if concat.attributes.get_int("axis", 0) not in (-1, 3) or rank not in (None, 4):
        return Mismatch("the Concat is not on the last axis of a rank-4 tensor", candidate=False)
    terms = [_half_product(v) for v in (*sub.inputs[:2], *add.inputs[:2])]
    if any(term is None for term in terms):
        return Mismatch("the difference and the sum are not of products of halves", False)
    x1_cos, x2_sin, *sums = (term for term in terms if term is not None)
    x2_cos, x1_sin = sums if sums[0][2] == 1 else sums[::-1]
    x = x1_cos[1]
    wanted = ((x1_cos, 0), (x2_sin, 1), (x2_cos, 1), (x1_sin, 0))
    if any(term[1] is not x or term[2] != half for term, half in wanted):
        return Mismatch(
            "the halves are not rotated as Concat(x1 * cos - x2 * sin, x2 * cos + x1 * sin) "
            "of one x"
        )
    cos_value, sin_value = x1_cos[3], x2_sin[3]
    if x2_cos[3] is not cos_value or x1_sin[3] is not sin_value:
        return Mismatch("the two halves are not multiplied by the same cos and sin tables")
    if x.shape is None or len(x.shape) != 4:
        return Mismatch("rotary input is not rank 4 [batch, heads, sequence, head_size]")
    head = x.shape[3]
    assert isinstance(head, int)  # _half_of read the halves of a static width
    cos = _table(cos_value, head, half_width=True)
    sin = _table(sin_value, head, half_width=True)
    muls = [term[0] for term, _ in wanted]
    core = [muls[0], muls[1], sub, muls[2], muls[3], add, concat]
    halves = [v for term, _ in wanted for v in term[0].inputs if _half_of(v) is not None]
    kinds = {_interleaved(v) for v in halves}
    if len(kinds) != 1:
        return Mismatch("the halves are sliced partly contiguous, partly as even/odd pairs")
    slices = [node for v in halves if v is not None and (node := v.producer()) is not None]
    found = _rotary_match(context, x, cos, sin, core, list(dict.fromkeys(slices)))
    if isinstance(found, Match) and len(inputs) > 2:
        found.bindings["around"] = (inputs[:at], inputs[at + 2 :])
    if isinstance(found, Match) and kinds == {True}:
        # x's even and odd dims rotated as the two halves: the rotary of their Concat
        evens = next(v for v in halves if _half_of(v) == (x, 0))
        odds = next(v for v in halves if _half_of(v) == (x, 1))
        found.bindings["deinterleave"] = (evens, odds)
    return found


def _existing(
    value: ir.Value, op_type: str, test: Callable[[ir.Node], bool] | None = None
) -> ir.Value | None:
    """The output of a node already computing ``op_type(value, ...)``, so that layers share caches."""
    for use in value.uses():
        node = use.node
        if use.idx == 0 and is_op(node, op_type) and (test is None or test(node)):
            return node.outputs[0]
    return None


def _casts_to(to: ir.DataType, node: ir.Node) -> bool:
    return cast_target(node) == to


def rotary_cache(
    table: RotaryTable, head: int, flat: bool, nodes: list[ir.Node], constants: list[ir.Value]
) -> ir.Value:
    """The half-width cache: [S, H/2] when ``flat`` (contrib op), else [1, S, H/2]; reuses earlier ones."""
    if table.constant is not None:
        array = -table.constant if table.negate else table.constant
        array = array if flat else array[None]
        value = new_constant(array, f"rotary_{table.trig.lower() or 'cos_sin'}rotary_cache")
        constants.append(value)
        return value
    assert table.freqs is not None
    angles = table.freqs
    made = angles.const_value is not None and angles.producer() is None
    if made and not angles.is_initializer():
        # constant angles made by the match (_constant_angles): shaped here, not by a Reshape
        # that only the next run would fold
        if flat:
            rows = angles.const_value.numpy().reshape(-1, head // 2)  # type: ignore[union-attr]
            angles = new_constant(rows, "rotary_angles")
        constants.append(angles)
    elif flat:
        shape = np.array([-1, head // 2], dtype=np.int64)
        angles = _shared_op(angles, "Reshape", shape, "rotary_cache_shape", nodes, constants)
    result = _existing(angles, table.trig)
    if result is None:
        node = ir.node(table.trig, [angles])
        nodes.append(node)
        result = node.outputs[0]
    if table.factor is not None:
        result = _shared_op(result, "Mul", table.factor, "rotary_scaling", nodes, constants)
    if table.negate:
        negated = _existing(result, "Neg")
        if negated is None:
            nodes.append(ir.node("Neg", [result]))
            negated = nodes[-1].outputs[0]
        result = negated
    for to in table.casts:
        cast = _existing(result, "Cast", partial(_casts_to, to))
        if cast is None:
            node = ir.node("Cast", [result], {"to": to.value})
            nodes.append(node)
            cast = node.outputs[0]
        result = cast
    return result


def _shared_op(
    value: ir.Value,
    op_type: str,
    array: np.ndarray,
    hint: str,
    nodes: list[ir.Node],
    constants: list[ir.Value],
) -> ir.Value:
    """``op_type(value, array)``: the node an earlier layer's rewrite made for it, else a new one."""

    def same(node: ir.Node) -> bool:
        other = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
        return (
            other is not None
            and other.dtype == array.dtype
            and np.array_equal(other.reshape(-1), array.reshape(-1))
        )

    found = _existing(value, op_type, same)
    if found is not None:
        return found
    constant = new_constant(array, hint)
    constants.append(constant)
    node = ir.node(op_type, [value, constant])
    nodes.append(node)
    return node.outputs[0]


def _row_ids(
    freqs: ir.Value | None, nodes: list[ir.Node], constants: list[ir.Value], opset: int
) -> ir.Value:
    """Position ids [B, S] = b * S + s: token (b, s) reads row b * S + s of the [B * S, H/2] caches
    (the angles reshaped), which holds f[b, s], the angles it was multiplied by. Built once per
    model, from f's shape: ``Reshape(Range(0, B * S, 1), Shape(f)[:2])``."""
    assert freqs is not None
    dims = _existing(freqs, "Shape", _first_two_dims) if opset >= 15 else None
    if dims is None:
        tape = ir.tape.Tape()
        dims = dims_read(tape, freqs, 0, 2, opset)
        nodes.extend(tape.nodes)
    count = _existing(dims, "ReduceProd", lambda n: n.attributes.get_int("keepdims", 1) == 0)
    if count is None:
        nodes.append(ir.node("ReduceProd", [dims], {"keepdims": 0}))
        count = nodes[-1].outputs[0]
    ids = next(
        (
            use.node.outputs[0]
            for use in count.uses()
            if is_op(use.node, "Range") and use.idx == 1 and _counts_from_zero(use.node)
        ),
        None,
    )
    if ids is None:
        bounds = [new_constant(np.array(v, dtype=np.int64), "rotary_row_ids") for v in (0, 1)]
        constants.extend(bounds)
        nodes.append(ir.node("Range", [bounds[0], count, bounds[1]]))
        ids = nodes[-1].outputs[0]
    grid = _existing(ids, "Reshape", lambda n: len(n.inputs) > 1 and n.inputs[1] is dims)
    if grid is None:
        nodes.append(ir.node("Reshape", [ids, dims]))
        grid = nodes[-1].outputs[0]
    return grid


def _first_two_dims(node: ir.Node) -> bool:
    return node.attributes.get_int("start", 0) == 0 and node.attributes.get_int("end", -1) == 2


def _counts_from_zero(node: ir.Node) -> bool:
    start, step = const_array(node.inputs[0]), const_array(node.inputs[2])
    return (
        start is not None
        and step is not None
        and start.size == step.size == 1
        and int(start.reshape(())) == 0
        and int(step.reshape(())) == 1
    )


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    b = match.bindings
    x: ir.Value = b["x"]
    nodes: list[ir.Node] = []
    constants: list[ir.Value] = []
    heads: int | None = None
    if "deinterleave" in b:  # Concat(x[..., 0::2], x[..., 1::2]) is what the halves rotate
        nodes.append(ir.node("Concat", list(b["deinterleave"]), {"axis": -1}))
        x = nodes[-1].outputs[0]
        same_shape_as(x, b["x"])
    if b["heads_last"]:  # [B, S, N, H]: both ops rotate the [B, S, N*H] view given num_heads
        assert x.shape is not None and isinstance(x.shape[2], int)  # _match proved N static
        heads = x.shape[2]
        x = _view(x, [0, 0, heads * b["head"]], nodes, constants)
        x.shape = ir.Shape([*b["x"].shape[:2], heads * b["head"]])
    if context.options.target == "ort":
        cos = rotary_cache(b["cos"], b["head"], True, nodes, constants)
        sin = rotary_cache(b["sin"], b["head"], True, nodes, constants)
        if b["cos"].per_row:
            positions = _row_ids(b["cos"].freqs, nodes, constants, context.opset())
        else:
            positions = new_constant(np.array([0], dtype=np.int64), "rotary_position_offset")
            constants.append(positions)
        new = ir.node(
            "RotaryEmbedding", [x, positions, cos, sin], {"interleaved": 0}, domain=MS_DOMAIN
        )
        ensure_opset(context.model, MS_DOMAIN, 1)
    elif b["cos"].per_row:  # the caches are the angles' own [B, S, H/2] rows, as the op wants
        cos = rotary_cache(b["cos"], b["head"], False, nodes, constants)
        sin = rotary_cache(b["sin"], b["head"], False, nodes, constants)
        new = ir.node("RotaryEmbedding", [x, cos, sin], {"interleaved": 0})
    else:
        cos = rotary_cache(b["cos"], b["head"], False, nodes, constants)
        sin = rotary_cache(b["sin"], b["head"], False, nodes, constants)
        # RotaryEmbedding-23 without position_ids wants [B, S, H/2] caches: broadcast over batch.
        # B read off what a partial rotary's x was sliced from: the rotary of that then reads no
        # dim of the slice, which partial-rotary->RotaryEmbedding drops.
        window = last_axis_window(x)
        batch = ir.node("Shape", [x if window is None else window.source], {"start": 0, "end": 1})
        ones = new_constant(np.array([1, 1], dtype=np.int64), "rotary_cache_tail")
        constants.append(ones)
        target = ir.node("Concat", [batch.outputs[0], ones], {"axis": 0})
        cos_b = ir.node("Expand", [cos, target.outputs[0]])
        sin_b = ir.node("Expand", [sin, target.outputs[0]])
        nodes.extend([batch, target, cos_b, sin_b])
        new = ir.node(
            "RotaryEmbedding", [x, cos_b.outputs[0], sin_b.outputs[0]], {"interleaved": 0}
        )
    same_shape_as(new.outputs[0], x)
    nodes.append(new)
    result = new.outputs[0]
    if heads is not None:
        new.attributes["num_heads"] = ir.AttrInt64("num_heads", heads)
        result = _view(result, [0, 0, heads, b["head"]], nodes, constants)
        same_shape_as(result, b["x"])
    if "around" in b:  # the other parts of the Concat the rotary was flattened into
        before, after = b["around"]
        nodes.append(ir.node("Concat", [*before, result, *after], {"axis": -1}))
        result = nodes[-1].outputs[0]
        same_shape_as(result, match.root.outputs[0])
    return Replacement(nodes, [(match.root.outputs[0], result)], constants=constants)


def _view(
    x: ir.Value, target: list[int], nodes: list[ir.Node], constants: list[ir.Value]
) -> ir.Value:
    """``Reshape(x, target)`` (0 copies x's dim), with x's element type."""
    shape = new_constant(np.array(target, dtype=np.int64), "rotary_view")
    constants.append(shape)
    nodes.append(ir.node("Reshape", [x, shape]))
    view = nodes[-1].outputs[0]
    view.type = x.type
    return view


def same_shape_as(output: ir.Value, x: ir.Value) -> None:
    """The rotary's output has its input's shape: recorded from the input, whose dims are known at
    least as well as those the replaced Add carried (else a later run infers better names and the
    output is not a fixed point)."""
    output.type = x.type
    output.shape = None if x.shape is None else ir.Shape(x.shape)


def _match_partial(concat: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Concat(RotaryEmbedding(v[..., a:a+r]), v[..., a+r:b])`` on the last axis: a rotary of the
    first r dims of ``x = v[..., a:b]``, the rest passed through."""
    rotary = concat.inputs[0].producer() if len(concat.inputs) == 2 and concat.inputs[0] else None
    if rotary is None or not (
        is_op(rotary, "RotaryEmbedding", MS_DOMAIN) or is_op(rotary, "RotaryEmbedding")
    ):
        return Mismatch("not a Concat after a RotaryEmbedding", candidate=False)
    rotated = rotary.inputs[0]
    if rotated is None or rotated.shape is None or len(rotated.shape) != 4:
        return Mismatch("the rotary input is not rank 4 [batch, heads, sequence, rotary dims]")
    if concat.attributes.get_int("axis", 0) not in (-1, 3):
        return Mismatch("the Concat after the rotary is not on the last axis", candidate=False)
    if rotary.attributes.get_int("rotary_embedding_dim", 0):
        return Mismatch("the RotaryEmbedding already rotates part of its input")
    rotated_part = last_axis_window(rotated)
    if rotated_part is None:
        return Mismatch("the rotary input is not a Slice or Split of the head dim")
    kept = last_axis_window(concat.inputs[1])
    if kept is None or kept.source is not rotated_part.source or kept.start != rotated_part.end:
        return Mismatch(
            "the part concatenated after the rotary is not the rest of the head it was sliced "
            "from (x[..., r:] unchanged)"
        )
    heads = rotated.shape[1]
    if rotary.domain == MS_DOMAIN and not isinstance(heads, int):
        return Mismatch(
            "the head count is not static (com.microsoft.RotaryEmbedding needs num_heads with "
            "rotary_embedding_dim)"
        )
    output = rotary.outputs[0]
    if output.is_graph_output() or any(use.node is not concat for use in output.uses()):
        return Mismatch("the rotated part is also used outside the Concat")
    # Producers first: the driver drops the matched nodes left without users, last to first.
    slices = [v.producer() for v in (rotated, concat.inputs[1]) if v is not None]
    nodes = [n for n in dict.fromkeys(slices) if n is not None]
    return Match(
        [*nodes, rotary, concat],
        {
            "rotary": rotary,
            "source": rotated_part.source,
            "start": rotated_part.start,
            "end": kept.end,
            "width": rotated_part.end - rotated_part.start,
            "heads": heads,
        },
    )


def _rewrite_partial(match: Match, context: RewriteContext) -> Replacement:
    b = match.bindings
    rotary: ir.Node = b["rotary"]
    source: ir.Value = b["source"]
    nodes: list[ir.Node] = []
    constants: list[ir.Value] = []
    x = source
    assert source.shape is not None
    if (b["start"], b["end"]) != (0, source.shape[-1]):
        # x is one part of a packed projection (GPT-NeoX's Q/K/V): slice just it out.
        params = [np.array([v], dtype=np.int64) for v in (b["start"], b["end"], -1)]
        bounds = [new_constant(a, "rotary_head_slice") for a in params]
        constants.extend(bounds)
        cut = ir.node("Slice", [source, *bounds])
        nodes.append(cut)
        x = cut.outputs[0]
        x.type = source.type
        x.shape = ir.Shape([*source.shape[:-1], b["end"] - b["start"]])
    attributes: dict[str, int | float] = {
        name: attr.value for name, attr in rotary.attributes.items()
    }
    attributes["rotary_embedding_dim"] = b["width"]
    if rotary.domain == MS_DOMAIN:
        attributes["num_heads"] = b["heads"]
    new = ir.node("RotaryEmbedding", [x, *rotary.inputs[1:]], attributes, domain=rotary.domain)
    same_shape_as(new.outputs[0], x)
    nodes.append(new)
    return Replacement(nodes, [(match.root.outputs[0], new.outputs[0])], constants=constants)


RULES = (
    Rule("rotary->RotaryEmbedding", "Add", _match, _rewrite),
    Rule("rotary-halves->RotaryEmbedding", "Concat", _match_halves, _rewrite),
    # After it in each round: the rotary of x[..., :r] is fused before the Concat that follows it.
    Rule("partial-rotary->RotaryEmbedding", "Concat", _match_partial, _rewrite_partial),
)


class FuseRotaryEmbeddingPass(RulePass):
    """x*cos + rotate_half(x)*sin -> com.microsoft.RotaryEmbedding (ort) / RotaryEmbedding (onnx, opset 23+);
    Concat(rotary(x[..., :r]), x[..., r:]) -> one RotaryEmbedding with rotary_embedding_dim = r."""

    name = "fuse-rotary-embedding"
    summary = (
        "fuse rotary position embeddings, full or partial (ort: com.microsoft RotaryEmbedding; "
        "onnx: opset 23+)"
    )
    rules = RULES
