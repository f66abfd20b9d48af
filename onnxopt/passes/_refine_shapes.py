"""Dims that ONNX shape inference leaves unknown although an op provably copies them from its input.

Range(0, n, 1) is another: its length is n, and when n is one dim of a tensor's shape
(``Range(0, Gather(Shape(x), 1), 1)``, how both exporters number the positions of a sequence) its
output has that dim, which ONNX names afresh. Positions added to embeddings then hide the
sequence's name from everything downstream (GPT-2's Q/K/V, whose causal mask is proved against it).

Reshape's -1 is another: ONNX names it afresh ("unk__3") unless every input dim is a number,
yet ``[T, 1, 1024] -> [-1, 1024]`` is T whatever T is (the input's dims, cancelled against the
target's, leave T alone). Such a placeholder is then renamed to T wherever ONNX propagated it.

ONNX infers nothing but the rank of a Slice whose starts or ends are not constant, yet every axis
the Slice does not touch keeps its input dim. TorchScript exports slice buffers by the sequence
length (``position_ids[:, :seq]``), so the untouched dims (often a static 1) would otherwise stay
unknown and every Shape -> Gather chain reading them would stay unfolded. A copied dim is the same
value as the input's (a symbolic dim keeps its name); nothing is ever guessed.

Three slices read a sequence length off a shape and keep it: ``mask[:, -S:]`` and
``mask[:, :S]`` of an S-long mask are all of it, and ``conv(x)[..., :S]`` of a stride-1 conv padded by at least kernel - 1 over an
S-long x is S (LFM2's short convolution, TorchScript: the rotary and the attention downstream are
proved against the sequence's name).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import onnx_ir as ir

from onnxopt.ops import all_graphs, is_op, static_shape
from onnxopt.passes._attention_shapes import (
    peel_torch_expand_shape,
    piece_entries,
    scalar_dim_read,
    scaled_dim_reads,
    target_entries,
)
from onnxopt.passes._shape_facts import const_ints, int_param, normalize_axes, optional_input
from onnxopt.rewrite import Mismatch


def refine_shapes(model: ir.Model) -> int:
    """Fill in provably copied dims (never replacing a known one); the number of values improved."""
    improved = 0
    renamed: dict[str, int | ir.SymbolicDim] = {}  # placeholder -> the dim it provably is
    bounded: dict[str, ir.SymbolicDim] = {}  # placeholder -> the dim X it is min(X, L) of
    products: dict[str, _Product] = {}  # placeholder -> the product of dims it provably is
    for graph in all_graphs(model):
        for node in graph:
            if is_op(node, "Slice"):
                improved += _refine_slice(node, renamed)
                improved += _refine_causal_conv_slice(node, renamed)
                improved += _refine_suffix_slice(node, renamed)
                _record_prefix_slices(node, bounded)
            elif node.op_type in _BROADCASTING and is_op(node, node.op_type):
                improved += _refine_broadcast(node, bounded, renamed)
            elif is_op(node, "Reshape"):
                improved += _refine_reshape(node, renamed, products)
            elif is_op(node, "Range"):
                improved += _refine_range(node, renamed)
            elif is_op(node, "Expand"):
                improved += _refine_expand(node, bounded, renamed)
            elif is_op(node, "Tile"):
                improved += _refine_tile(node, renamed)
            elif is_op(node, "ConstantOfShape"):
                improved += _refine_constant_of_shape(node, renamed)
            elif node.op_type in _WINDOWED and is_op(node, node.op_type):
                improved += _refine_windowed(node, renamed)
    if renamed:
        improved += _rename_dims(model, renamed)
    return improved


def interface_names(model: ir.Model) -> frozenset[str]:
    """The dim names of the main graph's inputs and outputs: kept whatever inference finds."""
    return frozenset(dim_names((*model.graph.inputs, *model.graph.outputs)))


def dim_names(values: Sequence[ir.Value]) -> list[str]:
    """The names of the symbolic dims of ``values``, once per dim that carries one."""
    return [
        str(dim.value)
        for value in values
        if value.shape is not None
        for dim in value.shape
        if isinstance(dim, ir.SymbolicDim) and dim.value is not None
    ]


def _rename_dims(model: ir.Model, renamed: dict[str, int | ir.SymbolicDim]) -> int:
    # the model's inputs and outputs keep the names they were given (an expression too)
    interface = interface_names(model)
    renamed = {name: dim for name, dim in renamed.items() if name not in interface}
    changed = 0
    for graph in all_graphs(model):
        values = [*graph.inputs, *(o for node in graph for o in node.outputs)]
        for value in values:
            shape = value.shape
            if shape is None:
                continue
            dims = [_renamed(d, renamed) for d in shape]
            if dims != list(shape):
                value.shape = ir.Shape(dims)
                changed += 1
    return changed


def _renamed(dim: object, renamed: dict[str, int | ir.SymbolicDim]) -> int | ir.SymbolicDim | None:
    if isinstance(dim, int) or dim is None:
        return dim
    name = getattr(dim, "value", None)
    target = renamed.get(str(name)) if name else None
    return target if target is not None else dim  # type: ignore[return-value]


def _refine_reshape(
    node: ir.Node, renamed: dict[str, int | ir.SymbolicDim], products: dict[str, _Product]
) -> int:
    """The dim a Reshape's -1 stands for, where the input's dims cancel against the target's to
    one named dim (or a number); and the dims its 0s copy."""
    data, out = node.inputs[0] if node.inputs else None, node.outputs[0]
    target = const_ints(optional_input(node, 1))
    if target is None:
        return _refine_reshape_reads(node, renamed, products)
    if data is None or data.shape is None or target.count(-1) > 1:
        return 0
    # allowzero=1 (the dynamo exporter's form) reads a 0 as a 0 but changes nothing else.
    if (node.attributes.get_int("allowzero", 0) and 0 in target) or any(t < -1 for t in target):
        return 0
    source = [_renamed(d, renamed) for d in data.shape]
    # A placeholder name (ONNX's "unk__3") stands for one dim wherever ONNX propagated it, so it
    # cancels against itself; a dim without a name cannot.
    if any(d is None or not getattr(d, "value", 1) for d in source) or 0 in source:
        return 0
    dims: list[int | ir.SymbolicDim | None] = []
    for axis, wanted in enumerate(target):
        if wanted == 0:
            if axis >= len(source):
                return 0
            dims.append(source[axis])
        else:
            dims.append(wanted if wanted > 0 else None)
    if -1 in target:
        # no products here: a constant target's dims cancel the input's as they are named
        inferred = _cancelled(data, [-1 if d is None else d for d in dims], renamed, {})
        if inferred is None:
            return 0
        dims[target.index(-1)] = inferred
    return _merge_dims(out, dims, renamed)


def _merge_dims(
    out: ir.Value,
    found: list[int | ir.SymbolicDim | None],
    renamed: dict[str, int | ir.SymbolicDim],
) -> int:
    """Give ``out`` the ``found`` dims (None: not found) where its own are unknown; a placeholder
    replaced is recorded in ``renamed``. 1 if ``out`` improved, else 0."""
    current = list(out.shape) if out.shape is not None else [None] * len(found)
    if len(current) != len(found):
        return 0
    merged = list(current)
    for axis, (known, dim) in enumerate(zip(current, found, strict=True)):
        if dim is None or not _is_unknown(known):
            continue
        name = getattr(known, "value", None)
        if name and out.is_graph_output() and not str(name).startswith(GENERATED_DIM_PREFIX):
            continue  # the model's output keeps the name it was given
        merged[axis] = dim
        if name and _placeholder(str(name)):
            renamed.setdefault(str(name), dim)
    if merged == current:
        return 0
    out.shape = ir.Shape(merged)
    return 1


def _scalar_dim(value: ir.Value | None) -> int | ir.SymbolicDim | None:
    """The dim a scalar reads off a tensor's shape (``Gather(Shape(x), i)``, ``Squeeze`` of a
    one-dim slice); None when unknown or a placeholder."""
    read = scalar_dim_read(value)
    dims = read[0].shape if read is not None else None
    if read is None or dims is None or not 0 <= read[1] < len(dims):
        return None
    dim = dims[read[1]]
    return None if _is_unknown(dim) else dim


def _read_dim(
    entry: object, renamed: dict[str, int | ir.SymbolicDim]
) -> int | ir.SymbolicDim | None:
    """The dim a target entry reads off a tensor's shape (``(kind, tensor, axis)``), or None."""
    if not isinstance(entry, tuple):
        return None
    dims = entry[1].shape
    if dims is None or not -len(dims) <= entry[2] < len(dims):
        return None
    return _renamed(dims[entry[2]], renamed)


def _refine_range(node: ir.Node, renamed: dict[str, int | ir.SymbolicDim]) -> int:
    """``Range(0, n, 1)`` has n elements: n's dim when n is read off a shape."""
    start, delta = const_ints(optional_input(node, 0)), const_ints(optional_input(node, 2))
    if start != (0,) or delta != (1,):
        return 0
    return _merge_dims(node.outputs[0], [_scalar_dim(optional_input(node, 1))], renamed)


def _refine_reshape_reads(
    node: ir.Node, renamed: dict[str, int | ir.SymbolicDim], products: dict[str, _Product]
) -> int:
    """A Reshape whose target is assembled from shape reads (``Concat(Shape(x)[0:2], [768])``,
    how TorchScript rebuilds [B, S, D] after a 2-D Gemm): each entry read off a dim of x is
    that dim. ONNX propagates such targets only when they fold to constants.

    TorchScript's ``batch_size * num_heads`` (``Mul(Gather(Shape(x), 0), H)``) is a product of
    dims: it cancels against the input's dims as B and H do, so a -1 beside it is known
    (SAM's and ViTDet's ``reshape(3, B*H, T, -1)`` is d), and the output dim's placeholder is
    recorded as that product for the views of it after (``view(B, H, T, -1)``)."""
    entries = _product_entries(optional_input(node, 1), renamed)
    if entries is None:
        return 0
    found: list[int | ir.SymbolicDim | None] = []
    for entry in entries:
        # a 0 entry would copy the input's dim instead
        dim: int | ir.SymbolicDim | None = None
        if (isinstance(entry, int) and entry > 0) or isinstance(entry, ir.SymbolicDim):
            dim = entry
        found.append(None if _is_unknown(dim) else dim)
    if entries.count(-1) == 1 and 0 not in entries:
        inferred = _cancelled(node.inputs[0], entries, renamed, products)
        if inferred is not None:
            found[entries.index(-1)] = inferred
    out = node.outputs[0]
    for axis, entry in enumerate(entries):
        if isinstance(entry, _Product) and out.shape is not None and axis < len(out.shape):
            name = getattr(out.shape[axis], "value", None)
            if name and str(name).startswith(GENERATED_DIM_PREFIX):
                products.setdefault(str(name), entry)
    return _merge_dims(out, found, renamed)


@dataclass(frozen=True)
class _Product:
    """A dim that is a constant times named dims (``B * H``)."""

    factor: int
    names: tuple[str, ...]


def _product_entries(
    target: ir.Value | None, renamed: dict[str, int | ir.SymbolicDim]
) -> list[int | ir.SymbolicDim | _Product | None] | None:
    """The target's entries: constants, the dims read (None where unknown), and ``Mul(read, c)``
    pieces as products; a piece that is none of those (computed) gives None entries when its
    length is static, and the whole is None when that is not known either."""
    whole = target_entries(target)
    concat = target.producer() if target is not None else None
    pieces = (
        list(concat.inputs)
        if whole is None and is_op(concat, "Concat") and concat is not None
        else [target]
    )
    entries: list[int | ir.SymbolicDim | _Product | None] = []
    for piece in pieces:
        part = target_entries(piece)
        if part is not None:
            for entry in part:
                entries.append(entry if isinstance(entry, int) else _read_dim(entry, renamed))
            continue
        scaled = [
            (dim, factor)
            for read, factor in scaled_dim_reads(piece)
            if isinstance(dim := _read_dim(read, renamed), ir.SymbolicDim) and dim.value
        ]
        if scaled:
            dim, factor = scaled[0]
            entries.append(_Product(factor, (str(dim.value),)))
            continue
        # A piece computed otherwise (BLOOM's B as B*H / H): its entries are unknown, but its
        # length is static, so the output's rank and the other entries are still known.
        length = static_shape(piece)
        if length is None or len(length) != 1 or not 0 < length[0] <= 8:
            return None
        entries.extend([None] * length[0])  # (a None never cancels: no -1 is inferred)
    return entries


def _cancelled(
    data: ir.Value | None,
    entries: Sequence[int | ir.SymbolicDim | _Product | None],
    renamed: dict[str, int | ir.SymbolicDim],
    products: dict[str, _Product],
) -> int | ir.SymbolicDim | None:
    """The dim the -1 among ``entries`` stands for: the input's dims (recorded products expanded)
    cancelled against the other entries, when they leave a number or one named dim."""
    if data is None or data.shape is None:
        return None
    static, left = 1, list[str]()
    for dim in (_renamed(d, renamed) for d in data.shape):
        name = getattr(dim, "value", None)
        if isinstance(dim, int):
            static *= dim
        elif name and str(name) in products:
            static *= products[str(name)].factor
            left.extend(products[str(name)].names)
        elif name:
            left.append(str(name))
        else:
            return None
    for entry in entries:
        names: tuple[str, ...]
        if entry == -1:
            continue
        if isinstance(entry, int):
            factor, names = entry, ()
        elif isinstance(entry, _Product):
            factor, names = entry.factor, entry.names
        elif isinstance(entry, ir.SymbolicDim) and entry.value:
            factor, names = 1, (str(entry.value),)
        else:
            return None
        if factor <= 0 or static % factor or any(name not in left for name in names):
            return None
        static //= factor
        for name in names:
            left.remove(name)
    if not left:
        return static
    return ir.SymbolicDim(left[0]) if len(left) == 1 and static == 1 else None


_BROADCASTING = (
    "Add", "Sub", "Mul", "Div", "Where", "And", "Or", "Equal", "Greater", "Less",
    "GreaterOrEqual", "LessOrEqual", "Max", "Min",
)  # fmt: skip


def _right_aligned(dims: Sequence[object], rank: int) -> list[object]:
    """``dims`` as broadcasting lines them up against ``rank`` dims: 1s in front."""
    return [1] * (rank - len(dims)) + list(dims)


def _unit_step_axes(node: ir.Node, rank: int, count: int) -> tuple[int, ...] | None:
    """The normalized axes of a Slice with ``count`` starts whose axes and steps are constants
    (or absent) and every step 1; None otherwise (Slice-1's attribute form included)."""
    if "starts" in node.attributes:
        return None
    given = [optional_input(node, i) for i in (3, 4)]
    axes, steps = (const_ints(v) for v in given)
    if any(v is not None and c is None for v, c in zip(given, (axes, steps), strict=True)):
        return None  # axes or steps given but not constant
    if steps is not None and set(steps) != {1}:
        return None
    axes = normalize_axes(axes if axes is not None else range(count), rank)
    return axes if axes is not None and len(axes) == count else None


def _prefix_reads(node: ir.Node) -> list[tuple[int, ir.SymbolicDim]]:
    """``Slice(data, 0, n)`` with n read off a named dim X of some tensor (TorchScript's
    ``position_ids[:, :seq]``, ``conv(x)[..., :seq]``): (axis, X) for each axis sliced so."""
    data = node.inputs[0] if node.inputs else None
    starts = const_ints(optional_input(node, 1))
    ends = piece_entries(optional_input(node, 2))
    if data is None or data.shape is None or starts is None or ends is None:
        return []
    axes = _unit_step_axes(node, len(data.shape), len(starts))
    if axes is None or len(ends) != len(starts):
        return []
    reads = []
    for axis, start, end in zip(axes, starts, ends, strict=True):
        read = _read_dim(end, {}) if start == 0 else None
        if isinstance(read, ir.SymbolicDim) and not _is_unknown(read):
            reads.append((axis, read))
    return reads


def _record_prefix_slices(node: ir.Node, bounded: dict[str, ir.SymbolicDim]) -> None:
    """``Slice(data, 0, n)`` along an axis of static length L, n read off a named dim X
    (TorchScript's ``position_ids[:, :seq]``): the result's length there is min(X, L), which ONNX
    names afresh. Its placeholder is recorded: broadcast against X it gives X (when X <= L it is
    X; when X > L it is L, and the op fails unless L is 1, which broadcasts to X too)."""
    data, out = node.inputs[0] if node.inputs else None, node.outputs[0]
    if data is None or data.shape is None or out.shape is None:
        return
    if len(out.shape) != len(data.shape):
        return
    for axis, read in _prefix_reads(node):
        placeholder = out.shape[axis]
        if isinstance(data.shape[axis], int) and _is_unknown(placeholder):
            name = getattr(placeholder, "value", None)
            if name:
                bounded[str(name)] = read


def _refine_causal_conv_slice(node: ir.Node, renamed: dict[str, int | ir.SymbolicDim]) -> int:
    """``Slice(Conv(x), 0, n)`` along a spatial axis where x is X long and n reads X: a causal
    conv1d (LFM2's and Mamba's short convolution, ``conv(x)[..., :seq]``). With stride and
    dilation 1 and pads adding at least kernel - 1, the conv's output there is
    X + pads - kernel + 1 >= X long, so the slice's is exactly X (ONNX names it afresh)."""
    reads, starts = _prefix_reads(node), const_ints(optional_input(node, 1))
    conv = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
    if len(reads) != 1 or starts is None or len(starts) != 1:
        return 0
    if not is_op(conv, "Conv") or conv is None or len(conv.inputs) < 2:
        return 0
    ((axis, read),) = reads
    source, weight = conv.inputs[0], conv.inputs[1]
    rank = len(weight.shape) if weight is not None and weight.shape is not None else 0
    spatial = rank - 2
    if source is None or source.shape is None or len(source.shape) != rank or axis < 2:
        return 0
    assert weight is not None and weight.shape is not None
    kernel = weight.shape[axis]
    length = _renamed(source.shape[axis], renamed)
    if not isinstance(kernel, int) or getattr(length, "value", None) != read.value:
        return 0
    if conv.attributes.get_string("auto_pad", "NOTSET") != "NOTSET":
        return 0
    strides = conv.attributes.get_ints("strides", None) or [1] * spatial
    dilations = conv.attributes.get_ints("dilations", None) or [1] * spatial
    pads = conv.attributes.get_ints("pads", None) or [0] * (2 * spatial)
    i = axis - 2
    if strides[i] != 1 or dilations[i] != 1 or pads[i] + pads[i + spatial] < kernel - 1:
        return 0
    found: list[int | ir.SymbolicDim | None] = [None] * rank
    found[axis] = read
    return _merge_dims(node.outputs[0], found, renamed)


def _refine_suffix_slice(node: ir.Node, renamed: dict[str, int | ir.SymbolicDim]) -> int:
    """``Slice(data, [-n], [end], [axis])`` (step 1, end past the axis) with n a read of a named dim
    X and data X long there: the last X of X elements, all of them (LFM2's TorchScript export:
    ``attention_mask[:, -seq:]``); ONNX names the result's length afresh."""
    data = node.inputs[0] if node.inputs else None
    ends = const_ints(optional_input(node, 2))
    if data is None or data.shape is None or ends is None or len(ends) != 1:
        return 0
    rank = len(data.shape)
    axes = _unit_step_axes(node, rank, 1)
    if axes is None:
        return 0
    start = optional_input(node, 1)
    producer = start.producer() if start is not None else None
    if is_op(producer, "Unsqueeze") or is_op(producer, "Reshape"):
        assert producer is not None
        start = producer.inputs[0]
    negation = start.producer() if start is not None else None
    wanted = _scalar_dim(negation.inputs[0]) if is_op(negation, "Neg") and negation else None
    length = _renamed(data.shape[axes[0]], renamed)
    if wanted is None or _is_unknown(length) or ends[0] < 2**31 or wanted != length:
        return 0  # (two static sizes compare as numbers: the last 5 of 7 are 5)
    found: list[int | ir.SymbolicDim | None] = [None] * rank
    found[axes[0]] = length
    return _merge_dims(node.outputs[0], found, renamed)


def _bound_of(dim: object, bounded: dict[str, ir.SymbolicDim]) -> ir.SymbolicDim | None:
    """The dim X when ``dim`` is the placeholder of a prefix slice's min(X, L), else None."""
    name = getattr(dim, "value", None)
    return bounded.get(str(name)) if name else None


def _refine_broadcast(
    node: ir.Node, bounded: dict[str, ir.SymbolicDim], renamed: dict[str, int | ir.SymbolicDim]
) -> int:
    """An element-wise op broadcasting X against a prefix slice's min(X, L) (recorded by
    _record_prefix_slices) gives X: embeddings + position embeddings keep the sequence's name.
    X against a 1 that refinement found (ONNX saw a placeholder there) gives X too, and so does X
    against X where ONNX named the result afresh."""
    out = node.outputs[0]
    shapes = [v.shape if v is not None else None for v in node.inputs]
    if out.shape is None or len(shapes) < 2 or any(s is None for s in shapes):
        return 0
    rank = len(out.shape)
    padded = [_right_aligned([*s], rank) for s in shapes if s is not None]
    if any(len(p) != rank for p in padded):
        return 0
    found: list[int | ir.SymbolicDim | None] = []
    for dims in zip(*padded, strict=True):
        dims = tuple(_renamed(d, renamed) for d in dims)
        dim = None
        for i, named in enumerate(dims):
            if _is_unknown(named):
                continue
            if all(_broadcasts_to(other, named, bounded) for j, other in enumerate(dims) if j != i):
                dim = named
        found.append(dim)
    return _merge_dims(out, found, renamed)


def _broadcasts_to(
    dim: object, named: int | ir.SymbolicDim | None, bounded: dict[str, ir.SymbolicDim]
) -> bool:
    """``dim`` broadcast against ``named`` gives ``named``: a 1, the same dim, or a prefix slice's
    min(X, L) against X."""
    bound = _bound_of(dim, bounded)
    return dim in (1, named) or (bound is not None and bound.value == getattr(named, "value", None))


def _refine_expand(
    node: ir.Node, bounded: dict[str, ir.SymbolicDim], renamed: dict[str, int | ir.SymbolicDim]
) -> int:
    """Expand to a target assembled from shape reads (TorchScript's causal mask,
    ``expand(B, -1, S, T)``): each output dim is the broadcast of the input's dim with the
    target's, where that is provable: a 1 (TorchScript's -1) keeps the input's dim, a number > 1
    is itself, a dim read is itself over an input dim of 1, over the same dim, or over a prefix
    slice's min(X, L) of that dim X (BERT's buffered token_type_ids[:, :S] expanded to [B, S]).
    ONNX infers nothing but the rank when the target is not a constant."""
    data, target = node.inputs[0] if node.inputs else None, optional_input(node, 1)
    if data is None or data.shape is None or target is None:
        return 0
    peeled = peel_torch_expand_shape(target)
    entries = target_entries(peeled)
    if entries is None:
        return 0
    keep = (1, -1) if peeled is not target else (1,)  # -1: "keep the dim" in TorchScript's form
    rank = max(len(entries), len(data.shape))
    have_dims = _right_aligned([_renamed(d, renamed) for d in data.shape], rank)
    wanted = _right_aligned(entries, rank)
    found: list[int | ir.SymbolicDim | None] = []
    for have, entry in zip(have_dims, wanted, strict=True):
        dim: object = None
        if entry in keep:
            dim = have
        elif isinstance(entry, int):
            dim = entry if entry > 1 else None  # the input's dim is 1 or entry, or Expand fails
        elif isinstance(entry, tuple):
            read = _read_dim(entry, renamed)
            bound = _bound_of(have, bounded)
            if (
                have == 1
                or (not _is_unknown(have) and str(have) == str(read))
                or (bound is not None and str(bound) == str(read))
            ):
                dim = read
        found.append(None if _is_unknown(dim) or dim == 0 else dim)  # type: ignore[arg-type]
    return _merge_dims(node.outputs[0], found, renamed)


def _refine_constant_of_shape(node: ir.Node, renamed: dict[str, int | ir.SymbolicDim]) -> int:
    """``ConstantOfShape(Concat(reads...))`` has the dims its target reads (a causal mask built
    as ``full((S, S), min)``). ONNX names them only through its data propagation, which knows
    Gather and Unsqueeze from opset 13 on: exported at opset 11, every dim was unknown."""
    target = optional_input(node, 0)
    entries = target_entries(target) if target is not None else None
    if entries is None:
        return 0
    found: list[int | ir.SymbolicDim | None] = []
    for entry in entries:
        dim = entry if isinstance(entry, int) and entry >= 0 else _read_dim(entry, renamed)
        found.append(None if _is_unknown(dim) else dim)
    return _merge_dims(node.outputs[0], found, renamed)


def _refine_tile(node: ir.Node, renamed: dict[str, int | ir.SymbolicDim]) -> int:
    """Tile by repeats assembled from shape reads (the dynamo exporter's ``probe.repeat(B, 1, 1)``
    of a learned [1, 1, D] query): a repeat of 1 keeps the input's dim, and an input dim of 1
    repeated by a read dim is that dim. A repeat computed otherwise (TorchScript's B as B*H / H in
    DeBERTa's ``pos_key.repeat(B*H / H, 1, 1)``) leaves its own dim unknown, not the others."""
    data = node.inputs[0] if node.inputs else None
    entries = _product_entries(optional_input(node, 1), renamed)
    if data is None or data.shape is None or entries is None or len(entries) != len(data.shape):
        return 0
    found: list[int | ir.SymbolicDim | None] = []
    for have, entry in zip([_renamed(d, renamed) for d in data.shape], entries, strict=True):
        dim: object = None
        if entry == 1:
            dim = have
        elif have == 1 and isinstance(entry, int | ir.SymbolicDim) and entry != 0:
            dim = entry
        found.append(None if _is_unknown(dim) or dim == 0 else dim)  # type: ignore[arg-type]
    return _merge_dims(node.outputs[0], found, renamed)


_WINDOWED = ("Conv", "MaxPool", "AveragePool", "LpPool")


def _refine_windowed(node: ir.Node, renamed: dict[str, int | ir.SymbolicDim]) -> int:
    """A Conv or pool keeps its input's batch, and each spatial dim its window neither shrinks
    nor strides: stride 1 with the pads summing to dilation × (kernel − 1), or auto_pad SAME
    with stride 1. ONNX computes such dims only when they are numbers, so SqueezeBERT's kernel-1
    Conv1d projections and a CNN's padded 3×3 convs lose a dynamic length or height."""
    data, out = node.inputs[0] if node.inputs else None, node.outputs[0]
    if data is None or data.shape is None or len(data.shape) < 3:
        return 0
    spatial = len(data.shape) - 2
    kernel = node.attributes.get_ints("kernel_shape", None)
    if kernel is None and node.op_type == "Conv":
        weight = optional_input(node, 1)
        dims = weight.shape if weight is not None else None
        sizes = [d for d in dims[2:] if isinstance(d, int)] if dims is not None else []
        if dims is not None and len(sizes) == len(dims) - 2:
            kernel = sizes
    if kernel is None or len(kernel) != spatial:
        return 0
    strides = node.attributes.get_ints("strides", [1] * spatial)
    dilations = node.attributes.get_ints("dilations", [1] * spatial)
    pads = node.attributes.get_ints("pads", [0] * 2 * spatial)
    auto_pad = node.attributes.get_string("auto_pad", "NOTSET")
    if len(strides) != spatial or len(dilations) != spatial or len(pads) != 2 * spatial:
        return 0
    found: list[int | ir.SymbolicDim | None] = [_renamed(data.shape[0], renamed), None]
    for axis in range(spatial):
        reach = dilations[axis] * (kernel[axis] - 1)
        padded = pads[axis] + pads[axis + spatial]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            keeps = strides[axis] == 1
        elif auto_pad == "VALID":
            keeps = strides[axis] == 1 and reach == 0
        else:
            keeps = strides[axis] == 1 and padded == reach
        found.append(_renamed(data.shape[axis + 2], renamed) if keeps else None)
    return _merge_dims(out, [None if _is_unknown(d) else d for d in found], renamed)


# ONNX inference names the dims it cannot tell "unk__0", "unk__1", ...: placeholders, not facts.
GENERATED_DIM_PREFIX = "unk__"
# A dim name written as an expression: torch's symbolic sizes in a dynamo export's value_info
# ("Min(128, sequence)", "2*s0", "s1 + 1"), not a name a user gave an input.
EXPRESSION = re.compile(r"[()*/+ ,]")


def _placeholder(name: str) -> bool:
    """A name refinement may replace by a dim it proves: ONNX's, or an exporter's expression
    (every dim under one such name is the same dim)."""
    return name.startswith(GENERATED_DIM_PREFIX) or EXPRESSION.search(name) is not None


def _is_unknown(dim: object) -> bool:
    if dim is None or isinstance(dim, int):
        return dim is None
    name = getattr(dim, "value", None)
    return not name or _placeholder(str(name))


def _sliced_axes(node: ir.Node, rank: int) -> tuple[int, ...] | None:
    """The axes a Slice may change (normalized), or None when that cannot be told."""
    axes = int_param(node, "axes", 3)
    if isinstance(axes, Mismatch):
        return None
    if axes is None:
        starts = node.attributes.get_ints("starts", None)
        if starts is not None:
            return tuple(range(len(starts)))
        value = optional_input(node, 1)
        shape = value.shape if value is not None else None
        if shape is None or len(shape) != 1 or not isinstance(shape[0], int):
            return None
        return tuple(range(shape[0]))
    return normalize_axes(axes, rank)


def _refine_slice(node: ir.Node, renamed: dict[str, int | ir.SymbolicDim]) -> int:
    data, out = node.inputs[0] if node.inputs else None, node.outputs[0]
    if data is None or data.shape is None:
        return 0
    rank = len(data.shape)
    if out.shape is not None and len(out.shape) != rank:
        return 0
    sliced = _sliced_axes(node, rank)
    if sliced is None:
        return 0
    # Slice(data, 0, n) with n read off a dim named as data's there: min(X, X) is all of it
    # (TorchScript's ``mask[..., :mask_length]`` of a mask that long)
    whole = {axis for axis, read in _prefix_reads(node) if data.shape[axis] == read}
    found: list[int | ir.SymbolicDim | None] = []
    for axis in range(rank):
        source = data.shape[axis]
        cut = axis in sliced and axis not in whole
        found.append(None if cut or _is_unknown(source) else source)
    return _merge_dims(out, found, renamed)
