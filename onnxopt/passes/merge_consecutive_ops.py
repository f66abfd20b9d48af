"""Merge chains of the same op into one: Transpose, Reshape, Squeeze, Unsqueeze, Cast, Slice, Concat.

A Reshape also absorbs a Flatten, Squeeze or Unsqueeze before it (all keep the element order), and
a Transpose that only moves axes of size 1 past others (it keeps the element order too).

The outer op is rewritten to read the inner op's input directly; the inner op goes away when
nothing else uses it (when something does, it stays and the chain is still one op shorter).

A Transpose is also moved past an element-wise Add/Sub/Mul/Div whose two inputs are both
Transposes with the same perm: ``op(T(a), T(b)) == T(op(a, b))`` (equal ranks broadcast axis by axis,
so permuting both operands permutes the result). The move never adds a node (at least one input
Transpose must die with it) and never transposes more data than it removes (the output is no
larger than a dying input); it pays where the moved Transpose meets its inverse further down, as
ConvNeXt's residual stream does: ``Add(T(ln), T(mlp))`` per block, then ``T⁻¹`` before the next
stage's LayerNorm (both Transposes of that pair go).

The other way, a Transpose whose input is an element-wise op of its inverse moves above the op:
``T(op(x, T⁻¹(a))) == op(T(x), a)`` when only Transposes by that perm read the op, and the inverse
dies with it (a constant operand is transposed in place). tf2onnx leaves TF Whisper's residual
stream as [B, D, T] with each block's output transposed into it and each norm's input transposed
out; hoisted block by block, one Transpose is left at the stream's start.

A Reshape of a view back to the view's source shape is that source, even where the view has
other readers (tf2onnx's kept-dims mean of a [B, D, T] tensor, viewed as [B, T, 1] for one reader
and back for another).

The same move applies to a Concat whose inputs are all Transposes with one perm:
``Concat(T(a, p), T(b, p), axis=k) == T(Concat(a, b, axis=p[k]), p)``, when every one of those
Transposes dies with it.
Together with simplify-index-grids' ScatterND rule this takes torch.export's slice assignment into
a fresh tensor apart (DeepSeek-V3's key, ``k = new_empty(...); k[..., :a] = k_nope; k[..., a:] =
k_rot``): the sliced axis is moved first by Transposes, the rows are scattered (a Concat once
every row is written), and the Transposes then move past the Concat and cancel.

A MatMul between views, ``Reshape(MatMul(Reshape(x, [-1, K]), W), t)`` (TensorFlow's Tensordot,
how tf2onnx writes every Dense), multiplies x itself: ``Reshape(MatMul(x, W), t)``; so does a Gemm
that is a MatMul (B maybe transposed), with a bias vector added before the view or not.

The rules in ``_tf2onnx_forms`` take tf2onnx's einsum lowering (Keras' MultiHeadAttention and
EinsumDense, T5) and its select arithmetic back to the views the attention fusions read; the one
in ``_softmax_form`` merges a spelled-out stable softmax (jax's, ``exp(x - max) / sum``) into one
Softmax.

A dim read the TorchScript way, ``Unsqueeze(Gather(Shape(x), i), [0])``, is the one node
``Shape(x, start=i, end=i+1)`` from opset 15 on (what the dynamo exporter writes).

A Reshape whose target, read at run time, is a tensor's dims in order with ones between them (the
reshaped tensor's own, or those of a tensor it is a view of) is an Unsqueeze of that tensor, and
the shape reads go (TorchScript's gathered mask, reshaped back to its index grid's shape).

Cast chains are merged only where exact: ``Cast(Cast(x, B), C) == Cast(x, C)`` holds when every
value of x's type A is exactly representable in B (``EXACT_WIDENING``), since then the second cast
sees the very value the first one was given. When C == A too, both casts go.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, REDUCTIONS, const_array, is_onnx_domain, is_op
from onnxopt.passes._attention_shapes import (
    Entry,
    flattens_rows,
    piece_entries,
    same_dim,
    static_dim,
    target_entries,
)
from onnxopt.passes._shape_facts import (
    INT64_MAX,
    SliceParams,
    axes_param,
    cast_target,
    const_ints,
    dims_of,
    normalize_axes,
    producer_op,
    reshape_identity_problem,
    same_dims,
    slice_params,
)
from onnxopt.passes._softmax_form import SOFTMAX_RULE
from onnxopt.passes._tf2onnx_forms import TF2ONNX_RULES
from onnxopt.passes.base import RulePass
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import (
    int64_constant,
    new_constant,
    only_user,
    rank_of,
    squeeze_op,
)

T = ir.DataType
_FLOATS = (T.FLOAT16, T.BFLOAT16, T.FLOAT, T.DOUBLE)
_INTS = (T.INT8, T.INT16, T.INT32, T.INT64, T.UINT8, T.UINT16, T.UINT32, T.UINT64)

# A -> the types B holding every value of A exactly (integers up to 2**p in a p-bit significand:
# float16 11 bits, bfloat16 8, float 24, double 53). Identity casts are eliminate-noops' business.
EXACT_WIDENING: dict[ir.DataType, frozenset[ir.DataType]] = {
    T.BOOL: frozenset(_INTS + _FLOATS),
    T.INT8: frozenset((T.INT16, T.INT32, T.INT64, *_FLOATS)),
    T.UINT8: frozenset((T.INT16, T.INT32, T.INT64, T.UINT16, T.UINT32, T.UINT64, *_FLOATS)),
    T.INT16: frozenset((T.INT32, T.INT64, T.FLOAT, T.DOUBLE)),
    T.UINT16: frozenset((T.INT32, T.INT64, T.UINT32, T.UINT64, T.FLOAT, T.DOUBLE)),
    T.INT32: frozenset((T.INT64, T.DOUBLE)),
    T.UINT32: frozenset((T.INT64, T.UINT64, T.DOUBLE)),
    T.FLOAT16: frozenset((T.FLOAT, T.DOUBLE)),
    T.BFLOAT16: frozenset((T.FLOAT, T.DOUBLE)),
    T.FLOAT: frozenset((T.DOUBLE,)),
}
# Final types a merged Cast may produce: plain numbers and bool (not strings, whose text depends on
# the source type, nor float8/4-bit types, whose conversions ORT implements per source type).
_MERGEABLE_TARGETS = frozenset((T.BOOL, *_INTS, *_FLOATS))


def _replace_with(match: Match, node: ir.Node, constants: Sequence[ir.Value] = ()) -> Replacement:
    return Replacement((node,), ((match.root.outputs[0], node.outputs[0]),), tuple(constants))


def _bypass(match: Match, context: RewriteContext) -> Replacement:
    return Replacement((), ((match.root.outputs[0], match.bindings["source"]),))


def _same_op_on(
    outer: ir.Node,
    source: ir.Value,
    inputs: Sequence[ir.Value | None] = (),
    **changed: Sequence[int],
) -> ir.Node:
    """A copy of ``outer`` reading ``source`` (then ``inputs``), with int-list attributes ``changed``."""
    attributes = [attr for name, attr in outer.attributes.items() if name not in changed]
    attributes += [ir.AttrInt64s(name, list(value)) for name, value in changed.items()]
    return ir.Node(outer.domain, outer.op_type, [source, *inputs], attributes)


# Transpose∘Transpose ---------------------------------------------------------------------------


def _match_transposes(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    inner = producer_op(node, "Transpose")
    if isinstance(inner, Mismatch):
        return inner
    inner_perm = inner.attributes.get_ints("perm", None)
    outer_perm = node.attributes.get_ints("perm", None)
    if inner_perm is None and outer_perm is None:
        return Match([inner, node], {"perm": None})  # reversing twice
    rank = len(inner_perm if inner_perm is not None else outer_perm)  # type: ignore[arg-type]
    first = tuple(inner_perm) if inner_perm is not None else tuple(reversed(range(rank)))
    second = tuple(outer_perm) if outer_perm is not None else tuple(reversed(range(rank)))
    if len(first) != len(second):
        return Mismatch("the perms have different lengths")
    return Match([inner, node], {"perm": tuple(first[i] for i in second)})


def _rewrite_transposes(match: Match, context: RewriteContext) -> Replacement:
    inner, outer = match.nodes
    source = inner.inputs[0]
    assert source is not None
    perm = match.bindings["perm"]
    if perm is None or perm == tuple(range(len(perm))):
        return Replacement((), ((outer.outputs[0], source),))
    return _replace_with(match, _same_op_on(outer, source, perm=list(perm)))


# Transpose past an element-wise binary op -----------------------------------------------------

ELEMENTWISE_BINARY = ("Add", "Sub", "Mul", "Div")


def _input_transposes(node: ir.Node) -> list[ir.Node] | None:
    """The Transposes (with an input) producing every input of ``node``, or None."""
    transposes: list[ir.Node] = []
    for value in node.inputs:
        producer = value.producer() if value is not None else None
        if producer is None or not is_op(producer, "Transpose") or producer.inputs[0] is None:
            return None
        transposes.append(producer)
    return transposes


def _match_transpose_past(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if len(node.inputs) != 2 or any(value is None for value in node.inputs):
        return Mismatch("it does not have two inputs", candidate=False)
    transposes = _input_transposes(node)
    if transposes is None:
        return Mismatch("not both inputs come from a Transpose", candidate=False)
    first, second = transposes
    perm = first.attributes.get_ints("perm", None)
    other_perm = second.attributes.get_ints("perm", None)
    if (tuple(perm) if perm is not None else None) != (
        tuple(other_perm) if other_perm is not None else None
    ):
        return Mismatch("its input Transposes have different perms")
    if len(node.attributes) or context.opset() < 7:
        return Mismatch(f"{node.op_type} before opset 7 broadcasts along an axis attribute")
    if perm is None:  # reverse the axes: explicit from here on, which needs the rank
        ranks = {
            len(dims) if (dims := dims_of(t.inputs[0])) is not None else None for t in transposes
        }
        rank = ranks.pop() if len(ranks) == 1 else None
        if rank is None:
            return Mismatch("its input Transposes reverse axes of unknown or different ranks")
        perm = list(reversed(range(rank)))
    dying = [
        t
        for i, t in enumerate(transposes)
        if t not in transposes[:i]
        and not t.outputs[0].is_graph_output()
        and all(use.node is node for use in t.outputs[0].uses())
    ]
    if not dying:
        return Mismatch("both input Transposes have other users: moving would add a node")
    if not any(same_dims(t.outputs[0].shape, node.outputs[0].shape) for t in dying):
        return Mismatch(
            "the result may be larger than the Transposes it replaces (broadcast or unknown shape)"
        )
    return Match([*dying, node], {"perm": perm})


def _rewrite_transpose_past(match: Match, context: RewriteContext) -> Replacement:
    node = match.root
    inner = ir.Node(node.domain, node.op_type, _untransposed(node), [])
    return _then_transpose(inner, node.outputs[0], match.bindings["perm"])


def _untransposed(node: ir.Node) -> list[ir.Value | None]:
    """What the Transposes feeding ``node`` read."""
    sources: list[ir.Value | None] = []
    for value in node.inputs:
        producer = value.producer() if value is not None else None
        assert producer is not None
        sources.append(producer.inputs[0])
    return sources


def _then_transpose(inner: ir.Node, result: ir.Value, perm: Sequence[int]) -> Replacement:
    """``inner`` followed by a Transpose by ``perm`` stands for ``result``."""
    if result.dtype is not None:
        inner.outputs[0].dtype = result.dtype
    if result.shape is not None and len(result.shape) == len(perm):
        # T(y)[i] = y[perm[i]], so y's axis perm[i] is the result's axis i.
        dims: list[int | ir.SymbolicDim | None] = [None] * len(perm)
        for axis, source_axis in enumerate(perm):
            dims[source_axis] = result.shape[axis]
        inner.outputs[0].shape = ir.Shape(dims)
    transpose = ir.Node("", "Transpose", [inner.outputs[0]], [ir.AttrInt64s("perm", list(perm))])
    return Replacement((inner, transpose), ((result, transpose.outputs[0]),))


# Transpose hoisted above an element-wise op toward its inverse ---------------------------------


def _match_transpose_hoist(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``T(op(x, T⁻¹(a)), p) == op(T(x, p), a)``, where only Transposes by ``p`` read the op's
    result: the Transposes after the op and the ``T⁻¹`` before it cancel, and one Transpose moves
    up to the other operand (folded when it is a constant). tf2onnx keeps the residual stream of
    TF Whisper's encoder as [B, D, T] this way, with each block's output transposed into it and
    each norm's input transposed out; hoisted from the last block to the first, one Transpose is
    left. The move never adds a node, and transposes at most the op's result's size where it
    removes at least twice that (a reader and the inverse, which must die with the op)."""
    perm = node.attributes.get_ints("perm", None)
    op = node.inputs[0].producer() if node.inputs[0] is not None else None
    if perm is None or op is None or op.op_type not in ELEMENTWISE_BINARY or op.domain != "":
        return Mismatch("not a Transpose (explicit perm) of Add/Sub/Mul/Div", candidate=False)
    result = op.outputs[0]
    readers = [use.node for use in result.uses()]
    if result.is_graph_output() or any(
        not is_op(r, "Transpose")
        or r.attributes.get_ints("perm", None) != perm
        or r.graph is not op.graph  # a branch reading the op: its Transpose stays there
        for r in readers
    ):
        return Mismatch(
            "the op's result is read by more than Transposes by this perm", candidate=False
        )
    if len(op.attributes) or context.opset() < 7 or len(op.inputs) != 2:
        return Mismatch(f"{op.op_type} before opset 7 broadcasts along an axis attribute")
    inverse = tuple(sorted(range(len(perm)), key=lambda axis: perm[axis]))
    rank = len(perm)
    operands: list[ir.Value | np.ndarray | None] = []
    cancelled: list[ir.Node] = []
    for value in op.inputs:
        before = value.producer() if value is not None else None
        array = const_array(value)
        if (
            value is not None
            and before is not None
            and before.graph is op.graph
            and is_op(before, "Transpose")
            and tuple(before.attributes.get_ints("perm", ())) == inverse
            and not value.is_graph_output()
            and all(use.node is op for use in value.uses())
        ):
            cancelled.append(before)
            operands.append(before.inputs[0])
        elif array is not None and array.ndim <= rank:
            operands.append(array.reshape((1,) * (rank - array.ndim) + array.shape).transpose(perm))
        elif rank_of(value) == rank:
            operands.append(None)  # transposed by a new node
        else:
            return Mismatch(f"an operand of the {op.op_type} has another rank than its result")
    if not cancelled:
        return Mismatch("no operand is the inverse Transpose, read by the op alone")
    readers = list(dict.fromkeys(readers))
    return Match(
        [*cancelled, op, *(r for r in readers if r is not node), node],
        {"op": op, "operands": operands, "readers": readers},
        anchor=op,
    )


def _rewrite_transpose_hoist(match: Match, context: RewriteContext) -> Replacement:
    op, root = match.bindings["op"], match.root
    perm = list(root.attributes.get_ints("perm", ()))
    nodes: list[ir.Node] = []
    constants: list[ir.Value] = []
    inputs: list[ir.Value] = []
    for value, operand in zip(op.inputs, match.bindings["operands"], strict=True):
        if isinstance(operand, np.ndarray):
            constant = new_constant(np.ascontiguousarray(operand), "transposed")
            constants.append(constant)
            inputs.append(constant)
        elif operand is None:
            nodes.append(ir.Node("", "Transpose", [value], [ir.AttrInt64s("perm", perm)]))
            inputs.append(nodes[-1].outputs[0])
        else:
            inputs.append(operand)
    new = ir.Node("", op.op_type, inputs, [])
    if root.outputs[0].dtype is not None:
        new.outputs[0].dtype = root.outputs[0].dtype
    new.outputs[0].shape = root.outputs[0].shape
    values = [(reader.outputs[0], new.outputs[0]) for reader in match.bindings["readers"]]
    return Replacement((*nodes, new), values, constants)


# A Transpose and its inverse around row-wise ops ------------------------------------------------

# How many row-wise ops may stand between the two Transposes (a projection, its bias, a scale).
_MAX_ROW_OPS = 4


def _row_operand(node: ir.Node, rank: int) -> int | None:
    """The input through which ``node`` works row by row on a rank-``rank`` tensor, if it does:
    each output row (the last axis) is computed from the same row of that input alone, the same
    way for every row. MatMul (or ORT's FusedMatMul without batch transposes) by a 2-D matrix;
    Add/Sub/Mul/Div with a constant-per-column operand (rank <= 1, or leading dims all 1)."""
    if len(node.inputs) != 2 or any(value is None for value in node.inputs):
        return None
    first, second = node.inputs
    assert first is not None and second is not None
    if is_op(node, "MatMul") or (node.op_type == "FusedMatMul" and node.domain == MS_DOMAIN):
        attrs = node.attributes
        if any(attrs.get_int(name, 0) for name in ("transA", "transBatchA", "transBatchB")):
            return None
        return 0 if dims_of(second) is not None and len(dims_of(second) or ()) == 2 else None
    if node.op_type not in ELEMENTWISE_BINARY or node.domain not in ("", "ai.onnx"):
        return None
    # the other operand holds the same values for every row (broadcasts along the last axis
    # only); when both could, which one carries the rows is not known: none is taken
    per_column = [
        dims is not None and len(dims) <= rank and all(d == 1 for d in dims[:-1])
        for dims in (dims_of(first), dims_of(second))
    ]
    if per_column.count(True) != 1:
        return None
    return per_column.index(False)


def _match_transpose_round_trip(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Transpose(f(Transpose(x, p)), q)`` with q undoing p, p keeping the last axis, and f a chain
    of row-wise ops (:func:`_row_operand`): f works on rows, which p only reorders, so the result
    is f(x) and both Transposes go. (torch's sequence-first attention: the fused op's output is
    moved to [S, B, D] for the output projection and its bias, then back to [B, S, D].)"""
    outer_perm = node.attributes.get_ints("perm", None)
    if outer_perm is None:
        return Mismatch("the Transpose reverses all axes", candidate=False)
    rank = len(outer_perm)
    chain: list[tuple[ir.Node, int]] = []
    value = node.inputs[0]
    while value is not None and len(chain) <= _MAX_ROW_OPS:
        producer = value.producer()
        if producer is None or value.is_graph_output() or len(value.uses()) != 1:
            return Mismatch("no row-wise chain of single-use values leads to it", candidate=False)
        if is_op(producer, "Transpose"):
            break
        index = _row_operand(producer, rank)
        if index is None:
            return Mismatch("an op before it does not work row by row", candidate=False)
        chain.append((producer, index))
        value = producer.inputs[index]
    else:
        return Mismatch("no Transpose within reach of the row-wise chain", candidate=False)
    inner = value.producer() if value is not None else None
    if not chain or inner is None:
        return Mismatch("no row-wise op between two Transposes", candidate=False)
    inner_perm = inner.attributes.get_ints("perm", None)
    if inner_perm is None or len(inner_perm) != rank or inner_perm[-1] != rank - 1:
        return Mismatch("the first Transpose moves the last axis")
    if [inner_perm[i] for i in outer_perm] != list(range(rank)):
        return Mismatch("the second Transpose does not undo the first")
    return Match([inner, *[n for n, _ in reversed(chain)], node], {"chain": chain[::-1]})


def _rewrite_transpose_round_trip(match: Match, context: RewriteContext) -> Replacement:
    inner, outer = match.nodes[0], match.root
    perm = list(outer.attributes.get_ints("perm", ()))
    current = inner.inputs[0]
    assert current is not None
    nodes = []
    for node, index in match.bindings["chain"]:
        inputs = list(node.inputs)
        inputs[index] = current
        copy = ir.Node(node.domain, node.op_type, inputs, list(node.attributes.values()))
        result = node.outputs[0]
        copy.outputs[0].dtype = result.dtype
        if result.shape is not None and len(result.shape) == len(perm):
            # the rows as the outer Transpose lays them out: its axis i is this value's perm[i]
            copy.outputs[0].shape = ir.Shape([result.shape[axis] for axis in perm])
        nodes.append(copy)
        current = copy.outputs[0]
    return Replacement(tuple(nodes), ((outer.outputs[0], current),))


# Reshape∘Reshape (and Reshape after the other order-keeping shape ops) ---------------------------


def _reshape_of(inner_type: str) -> Callable[[ir.Node, RewriteContext], Match | Mismatch]:
    """Reshape(op(x), s) == Reshape(x, s) when op only reshapes and s does not copy op's dims."""

    def match(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
        return _match_reshape_of(node, inner_type)

    return match


def _match_reshape_of(node: ir.Node, inner_type: str) -> Match | Mismatch:
    inner = producer_op(node, inner_type)
    if isinstance(inner, Mismatch):
        return inner
    if inner_type == "Transpose":
        moved = _moves_data(inner)
        if moved is not None:
            return Mismatch(moved)
    if reshape_identity_problem(node, inner.inputs[0]) is None:
        # Reshaped back to what the inner op read (tf2onnx's mean of a [B, D, T] tensor viewed
        # as [B, T, 1] for one reader and back to [B, 1, T] for another; jax2tf's view to
        # [H, 1, -1] and back to Shape(x)): that tensor itself, whoever else reads the view.
        return Match([inner, node], {"identity": True})
    inner_out = inner.outputs[0]
    if inner_out.is_graph_output() or any(use.node is not node for use in inner_out.uses()):
        # The inner op stays for its other users, so merging removes nothing; it would only hide
        # the chain from patterns that read it (attention's head merge feeds a Shape and a Gemm).
        return Mismatch(
            f"the inner {inner_type} result has other users; merging would remove nothing"
        )
    if node.attributes.get_int("allowzero", 0):
        return Match([inner, node], {"target": None})  # 0 means 0: the target does not look back
    attribute_form = "shape" in node.attributes  # Reshape-1
    target = (
        tuple(node.attributes.get_ints("shape", ()))
        if attribute_form
        else const_ints(node.inputs[1])
    )
    kept = _axes_kept(inner, inner_type)
    if target is None:
        entries = target_entries(node.inputs[1]) if inner_type in ("Unsqueeze", "Squeeze") else None
        if entries is None or any(isinstance(e, int) and e < -1 for e in entries):
            return Mismatch("the outer target shape is not a constant (a 0 in it would copy a dim)")
        if any(e == 0 for e in entries[kept:]):
            return Mismatch("the outer target copies a dim the inner op moved")
        # Dims read at run time are 0 only for an empty tensor, whose view is empty either way.
        return Match([inner, node], {"target": None})
    if 0 not in target:
        return Match([inner, node], {"target": None})
    middle = dims_of(inner.outputs[0])
    perm = inner.attributes.get_ints("perm", None) if inner_type == "Transpose" else None
    resolved = []
    for axis, want in enumerate(target):
        if want == 0:
            dim = middle[axis] if middle is not None and axis < len(middle) else None
            if dim is None and perm is not None and axis < len(perm) and perm[axis] == axis:
                resolved.append(0)  # the Transpose keeps this axis: 0 copies the same dim
                continue
            if dim is None and axis < kept:
                resolved.append(0)  # before the first axis the inner op adds or removes
                continue
            if dim is None:
                return Mismatch(
                    f"the outer target copies dim {axis} of the inner result, which is not known"
                )
            want = dim
        resolved.append(want)
    return Match([inner, node], {"target": tuple(resolved), "attribute_form": attribute_form})


def _axes_kept(inner: ir.Node, inner_type: str) -> int:
    """How many leading axes an Unsqueeze or Squeeze leaves where they are (0 for other ops)."""
    if inner_type not in ("Unsqueeze", "Squeeze"):
        return 0
    rank = rank_of(inner.outputs[0] if inner_type == "Unsqueeze" else inner.inputs[0])
    axes = axes_param(inner, rank)
    if isinstance(axes, Mismatch) or not axes:
        return 0
    return min(axes)


def _moves_data(transpose: ir.Node) -> str | None:
    """Why the Transpose may move elements (None: it keeps their order, as a Reshape does).

    It keeps the order when the axes it moves past each other are all of size 1: the axes that
    are not provably 1 stay in increasing order in ``perm``. An LSTM's [T, directions, batch, H]
    output turned to [T, batch, directions, H] at batch 1 is such a one.
    """
    dims = dims_of(transpose.inputs[0])
    if dims is None:
        return "the Transpose's input rank is not known"
    perm = transpose.attributes.get_ints("perm", None)
    order = list(perm) if perm is not None else list(range(len(dims)))[::-1]
    if sorted(order) != list(range(len(dims))):
        return "the Transpose's perm is not a permutation of its input's axes"
    kept = [axis for axis in order if dims[axis] != 1]
    if kept != sorted(kept):
        return "the Transpose reorders axes that are not provably of size 1"
    return None


def _rewrite_reshapes(match: Match, context: RewriteContext) -> Replacement:
    inner, outer = match.nodes
    source = inner.inputs[0]
    assert source is not None
    if match.bindings.get("identity"):
        return Replacement((), ((outer.outputs[0], source),))
    target = match.bindings["target"]
    if target is None:
        return _replace_with(match, _same_op_on(outer, source, outer.inputs[1:]))
    if match.bindings["attribute_form"]:
        return _replace_with(match, _same_op_on(outer, source, shape=list(target)))
    shape = int64_constant(target)
    return _replace_with(match, _same_op_on(outer, source, [shape]), [shape])


# Reshape to a tensor's dims and ones -> Unsqueeze --------------------------------------------

# Views that keep the element order, looked through for the tensor a Reshape's target describes.
_ORDER_KEEPING_VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _provably_one(entry: Entry) -> bool:
    return entry == 1 or (isinstance(entry, tuple) and static_dim(entry[1], entry[2]) == 1)


def _inserted_axes(entries: Sequence[Entry], source: ir.Value) -> list[int] | None:
    """The target's entries are ``source``'s dims in order (each provably equal: a read of it,
    its symbol, its size) with entries provably 1 between them: the positions of those ones."""
    rank = len(source.shape) if source.shape is not None else None
    if rank is None:
        return None
    matched, ones = 0, []
    for position, entry in enumerate(entries):
        if matched < rank and same_dim(entry, source, matched):
            matched += 1
        elif _provably_one(entry):
            ones.append(position)
        else:
            return None
    return ones if matched == rank else None


def _match_unit_axes_reshape(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Reshape(view(x), t)`` whose target, read at run time, is x's dims with ones inserted
    (TorchScript's ``mask[batch_idx, kv_idx]``: the gathered mask flattened and reshaped to the
    index grid's shape [B, 1, 1, S]) is ``Unsqueeze(x, ones)``: the views keep the element order,
    and the shape reads go."""
    target = node.inputs[1] if len(node.inputs) > 1 else None
    if target is None or const_array(target) is not None:
        return Mismatch("the target is a constant", candidate=False)
    entries = target_entries(target)
    if entries is None:
        return Mismatch("the target's entries cannot be read", candidate=False)
    source = node.inputs[0]
    for _ in range(8):
        if source is None:
            break
        axes = _inserted_axes(entries, source)
        if axes is not None:
            return Match([node], {"source": source, "axes": axes})
        view = source.producer()
        if view is None or not any(is_op(view, op) for op in _ORDER_KEEPING_VIEWS):
            break
        source = view.inputs[0]
    return Mismatch("the target is not the reshaped tensor's dims with ones inserted")


def _rewrite_unit_axes_reshape(match: Match, context: RewriteContext) -> Replacement:
    source, axes = match.bindings["source"], match.bindings["axes"]
    if not axes:
        return Replacement((), ((match.root.outputs[0], source),))
    node, constants = squeeze_op("Unsqueeze", source, axes, context.opset())
    return _replace_with(match, node, constants)


# Reshape∘MatMul∘flatten -----------------------------------------------------------------------


def _match_matmul_between_views(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Reshape(MatMul(Reshape(x, [-1, K]), W), t)`` -> ``Reshape(MatMul(x, W), t)``.

    A linear layer written on rows (TensorFlow's Tensordot, as tf2onnx converts every Dense: x
    flattened to [B*S, K], one 2-D MatMul, the product viewed again): MatMul of x of rank >= 3 by
    a matrix is the same product row for row, in the same row-major order, so the final view of
    it is the same tensor. The attention fusions then see the 3-D projections they read. ``t``
    keeps x's leading dims (read off x, or -1) and then splits or keeps the product's last dim
    into positive constants: a 0 entry, "copy a dim", would copy a different dim of the unflattened
    product, so the target must not hold one.
    """
    product_of = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
    bias = _row_bias(product_of)
    if bias is not None:
        assert product_of is not None
        operand = product_of.inputs[1 - bias]
        matmul = operand.producer() if operand is not None else None
    else:
        matmul = product_of
    if matmul is None or not (is_op(matmul, "MatMul") or _plain_gemm(matmul)):
        return Mismatch("not a MatMul between views", candidate=False)
    flatten = producer_op(matmul, "Reshape")
    if isinstance(flatten, Mismatch):
        return Mismatch("not a MatMul between views", candidate=False)
    source, weight = flatten.inputs[0], matmul.inputs[1]
    rank = rank_of(source)
    if source is None or rank is None or rank < 3:
        return Mismatch("the MatMul's input is not a flattened tensor of known rank >= 3")
    if rank_of(weight) != 2:
        return Mismatch("the MatMul's second operand is not a matrix")
    chain = [matmul] if product_of is None or bias is None else [matmul, product_of]
    for inner, outer in zip(chain, [*chain[1:], node], strict=True):
        product = inner.outputs[0]
        if product.is_graph_output() or any(use.node is not outer for use in product.uses()):
            return Mismatch("the 2-D product has other users")
    if "shape" in flatten.attributes or "shape" in node.attributes:
        return Mismatch("a Reshape-1 (attribute shape)")
    if not flattens_rows(flatten, source, rank):
        return Mismatch("the first Reshape is not [-1, K] of its input's last dim K")
    entries = target_entries(node.inputs[1] if len(node.inputs) > 1 else None)
    if entries is None or len(entries) < rank:
        return Mismatch("the outer target does not keep the input's leading dims")
    lead, tail = entries[: rank - 1], entries[rank - 1 :]
    if not all(entry == -1 or same_dim(entry, source, i) for i, entry in enumerate(lead)):
        return Mismatch("the outer target does not keep the input's leading dims")
    if not all(
        (isinstance(entry, int) and entry > 0)
        or (isinstance(entry, tuple) and (static_dim(entry[1], entry[2]) or 0) > 0)
        for entry in tail
    ):
        return Mismatch("the outer target's last entries are not positive sizes")
    return Match([flatten, *chain, node], {"source": source})


def _plain_gemm(node: ir.Node) -> bool:
    """A Gemm that is a MatMul (its B maybe transposed): alpha 1, A as is, no C."""
    return (
        is_op(node, "Gemm")
        and node.attributes.get_float("alpha", 1.0) == 1.0
        and not node.attributes.get_int("transA", 0)
        and (len(node.inputs) < 3 or node.inputs[2] is None)
    )


def _row_bias(node: ir.Node | None) -> int | None:
    """The input index of a constant vector an Add adds to its other operand's rows, or None."""
    if node is None or not is_op(node, "Add") or len(node.inputs) != 2:
        return None
    for index in (0, 1):
        value = node.inputs[index]
        if value is not None and value.const_value is not None and rank_of(value) == 1:
            return index
    return None


def _rewrite_matmul_between_views(match: Match, context: RewriteContext) -> Replacement:
    _, matmul, *rest = match.nodes
    outer, bias = rest[-1], rest[0] if len(rest) == 2 else None
    nodes: list[ir.Node] = []
    weight = matmul.inputs[1]
    if is_op(matmul, "Gemm") and matmul.attributes.get_int("transB", 0) == 1:
        nodes.append(ir.node("Transpose", [weight], {"perm": [1, 0]}))
        weight = nodes[-1].outputs[0]
    nodes.append(ir.node("MatMul", [match.bindings["source"], weight], name=matmul.name))
    if bias is not None:
        index = _row_bias(bias)
        assert index is not None
        nodes.append(ir.node("Add", [nodes[-1].outputs[0], bias.inputs[index]], name=bias.name))
    view = _same_op_on(outer, nodes[-1].outputs[0], outer.inputs[1:])
    nodes.append(view)
    return Replacement(nodes, ((outer.outputs[0], view.outputs[0]),))


# Squeeze∘Squeeze and Unsqueeze∘Unsqueeze -------------------------------------------------------


def _nth_free(taken: Sequence[int], n: int) -> int:
    """The n-th (0-based) non-negative integer not in ``taken``."""
    position = -1
    for _ in range(n + 1):
        position += 1
        while position in taken:
            position += 1
    return position


def merge_unsqueeze_axes(first: Sequence[int], second: Sequence[int]) -> tuple[int, ...]:
    """Axes of one Unsqueeze equal to Unsqueeze(second) after Unsqueeze(first) (non-negative axes).

    The first result's dims, the new ones included, fill the final result's slots not in
    ``second``, in order.
    """
    return tuple(sorted({*second, *(_nth_free(second, axis) for axis in first)}))


def merge_squeeze_axes(first: Sequence[int], second: Sequence[int]) -> tuple[int, ...]:
    """Axes of one Squeeze equal to Squeeze(second) after Squeeze(first) (non-negative axes).

    Dim q of the first result is the source's q-th dim not in ``first``.
    """
    return tuple(sorted({*first, *(_nth_free(first, axis) for axis in second)}))


def _match_unsqueezes(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    inner = producer_op(node, "Unsqueeze")
    if isinstance(inner, Mismatch):
        return inner
    first = axes_param(inner, rank_of(inner.outputs[0]))
    second = axes_param(node, rank_of(node.outputs[0]))
    for axes in (first, second):
        if isinstance(axes, Mismatch):
            return axes
        if axes is None:
            return Mismatch("an Unsqueeze has no axes")
    assert isinstance(first, tuple) and isinstance(second, tuple)
    return Match([inner, node], {"axes": merge_unsqueeze_axes(first, second)})


def _match_squeezes(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    inner = producer_op(node, "Squeeze")
    if isinstance(inner, Mismatch):
        return inner
    first = axes_param(inner, rank_of(inner.inputs[0]))
    second = axes_param(node, rank_of(node.inputs[0]))
    for axes in (first, second):
        if isinstance(axes, Mismatch):
            return axes
    if second is None:
        # Squeezing every 1 after squeezing some (or all) of them squeezes every 1 of the source.
        return Match([inner, node], {"axes": None})
    if first is None:
        return Mismatch("the inner Squeeze has no axes, so the outer one cannot squeeze anything")
    assert isinstance(first, tuple) and isinstance(second, tuple)
    return Match([inner, node], {"axes": merge_squeeze_axes(first, second)})


def _rewrite_axes_merge(match: Match, context: RewriteContext) -> Replacement:
    inner, outer = match.nodes
    source = inner.inputs[0]
    assert source is not None
    axes = match.bindings["axes"]
    if axes is None:
        return _replace_with(match, _same_op_on(outer, source))
    if "axes" in outer.attributes or context.opset() < 13:
        return _replace_with(match, _same_op_on(outer, source, axes=list(axes)))
    constant = int64_constant(axes)
    return _replace_with(match, _same_op_on(outer, source, [constant]), [constant])


# Unsqueeze∘Gather∘Shape -------------------------------------------------------------------------


def _read_axes(gather: ir.Node, context: RewriteContext, rank: int) -> list[int] | Mismatch:
    """The axes of x that ``Gather(Shape(x), index)`` reads, ``index`` of ``rank`` 0 (one dim
    as a scalar) or 1 (a vector of dims), where Shape's start/end could read them instead."""
    shape = producer_op(gather, "Shape")
    index_value = gather.inputs[1] if len(gather.inputs) > 1 else None
    index = const_ints(index_value)
    if isinstance(shape, Mismatch) or index is None or index_value is None:
        return Mismatch("not a dim read", candidate=False)
    if (
        index_value.shape is None
        or len(index_value.shape) != rank
        or not index
        or gather.attributes.get_int("axis", 0) != 0
    ):
        kind = "one dim as a scalar" if rank == 0 else "a vector of dims"
        return Mismatch(f"the Gather does not read {kind}", candidate=False)
    if context.opset() < 15:
        return Mismatch("Shape's start/end need opset 15")
    if rank_of(shape.inputs[0]) is None:
        return Mismatch("the Shape's input has no known rank")
    dims = piece_entries(shape.outputs[0])  # ("dim", source, axis) for each dim the Shape reads
    if dims is None or not all(-len(dims) <= i < len(dims) for i in index):
        return Mismatch("the index is out of the Shape's range")
    picked = [dims[i] for i in index]
    axes = [entry[2] for entry in picked if isinstance(entry, tuple)]
    return axes if len(axes) == len(picked) else Mismatch("the Shape's entries are not dim reads")


def _sole_reader(shape: ir.Node, node: ir.Node) -> bool:
    """``node`` is all that reads ``shape``'s output."""
    out = shape.outputs[0]
    return not out.is_graph_output() and all(use.node is node for use in out.uses())


def _match_dim_read(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    gather = producer_op(node, "Gather")
    if isinstance(gather, Mismatch):
        return Mismatch("not a dim read", candidate=False)
    axes = _read_axes(gather, context, rank=0)
    if isinstance(axes, Mismatch):
        return axes
    if axes_param(node, 1) != (0,):
        return Mismatch("the Unsqueeze does not make the scalar a one-element vector")
    shape = gather.inputs[0].producer() if gather.inputs[0] is not None else None
    assert shape is not None
    gathered = gather.outputs[0]
    shared = any(use.node is not node for use in gathered.uses())
    if gathered.is_graph_output() or (shared and not _sole_reader(shape, gather)):
        return Mismatch("the scalar dim has other users; merging would remove nothing")
    bindings = {
        "source": shape.inputs[0],
        "start": axes[0],
        "end": axes[0] + 1,
        "scalar": gathered if shared else None,
    }
    # the scalar's other readers may come before the Unsqueeze: the new read goes at the Gather
    return Match([shape, gather, node], bindings, anchor=gather if shared else None)


def _shape_read(match: Match) -> ir.Node:
    bindings = match.bindings
    return ir.node(
        "Shape", [bindings["source"]], {"start": bindings["start"], "end": bindings["end"]}
    )


def _rewrite_dim_read(match: Match, context: RewriteContext) -> Replacement:
    """``Shape(x, i, i+1)``; where the scalar has other readers too (TorchScript reads the
    sequence length once for the positions' Range and the mask's shape), they read it as
    ``Squeeze(Shape(x, i, i+1))``, as the dynamo exporter writes it: one node fewer, as the
    whole Shape only fed the Gather."""
    read = _shape_read(match)
    scalar = match.bindings["scalar"]
    if scalar is None:
        return _replace_with(match, read)
    axes = ir.Value(const_value=ir.tensor(np.array([0], dtype=np.int64)))
    squeeze = ir.node("Squeeze", [read.outputs[0], axes])
    values = ((match.root.outputs[0], read.outputs[0]), (scalar, squeeze.outputs[0]))
    return Replacement((read, squeeze), values, (axes,))


def _match_dims_gather(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Gather(Shape(x), [i, i+1, ...])``, consecutive dims read as a vector, of a Shape read
    for this Gather alone: ``Shape(x, i, j)`` (TorchScript reads the mask's length so)."""
    axes = _read_axes(node, context, rank=1)
    if isinstance(axes, Mismatch):
        return axes
    shape = node.inputs[0].producer() if node.inputs[0] is not None else None
    assert shape is not None
    if not _sole_reader(shape, node):
        return Mismatch("the whole shape is read by others too; merging would remove nothing")
    if axes != list(range(axes[0], axes[0] + len(axes))):
        return Mismatch("the dims read are not consecutive, in order")
    bindings = {"source": shape.inputs[0], "start": axes[0], "end": axes[0] + len(axes)}
    return Match([shape, node], bindings)


def _rewrite_dims_gather(match: Match, context: RewriteContext) -> Replacement:
    return _replace_with(match, _shape_read(match))


# Cast∘Cast -------------------------------------------------------------------------------------


def _match_casts(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    inner = producer_op(node, "Cast")
    if isinstance(inner, Mismatch):
        return inner
    source = inner.inputs[0]
    assert source is not None
    if source.dtype is None:
        return Mismatch("the source dtype is unknown")
    middle, final = cast_target(inner), cast_target(node)
    if middle is None or final is None:
        return Mismatch("a Cast has no valid 'to'")
    if middle not in EXACT_WIDENING.get(source.dtype, frozenset()):
        return Mismatch(f"{source.dtype} -> {middle} is not exact, so the chain is not one cast")
    if final == source.dtype:
        return Match([inner, node], {"source": source})
    if final not in _MERGEABLE_TARGETS:
        return Mismatch(f"casting to {final} may depend on the source type")
    if source.dtype in _INTS and middle in _FLOATS and final in _INTS:
        # Out of range, float -> int is undefined while int -> int wraps: not the same cast.
        return Mismatch(
            f"{source.dtype} -> {middle} -> {final} differs from one cast when out of range"
        )
    return Match([inner, node], {"source": None})


def _rewrite_casts(match: Match, context: RewriteContext) -> Replacement:
    if match.bindings["source"] is not None:
        return _bypass(match, context)
    inner, outer = match.nodes
    source = inner.inputs[0]
    assert source is not None
    return _replace_with(match, _same_op_on(outer, source))


# Slice∘Slice -----------------------------------------------------------------------------------


def _non_negative(index: int, dim: int | None) -> int | None:
    """A start/end made non-negative as Slice does (add the dim), or None when that needs the dim."""
    if index >= 0:
        return index
    return None if dim is None else max(index + dim, 0)


def compose_slices(
    inner: tuple[int, int, int], outer: tuple[int, int, int], dim: int | None, middle: int | None
) -> tuple[int, int, int] | str:
    """(start, end, step) of one Slice equal to ``outer`` applied after ``inner`` on one axis.

    ``dim`` is the axis size (None: symbolic), ``middle`` its size after ``inner``. With
    non-negative indices the result holds for every dim: inner picks a + s1*k while that is
    below b; outer keeps k = c + s2*j while k < d. Returns why not when it cannot compose.
    """
    (a, b, inner_step), (c, d, outer_step) = inner, outer
    if inner_step <= 0 or outer_step <= 0:
        return "with a negative step"
    if middle is None and dim is not None:
        middle = len(range(*slice(a, b, inner_step).indices(dim)))
    first, last = _non_negative(a, dim), _non_negative(b, dim)
    skip, keep = _non_negative(c, middle), _non_negative(d, middle)
    if first is None or last is None or skip is None or keep is None:
        return "with negative indices on a symbolic dim"
    start = min(first + inner_step * skip, INT64_MAX)
    end = min(first + inner_step * keep, last, INT64_MAX)
    return start, end, inner_step * outer_step


def _match_slices(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    inner = producer_op(node, "Slice")
    if isinstance(inner, Mismatch):
        return inner
    first, second = slice_params(inner), slice_params(node)
    for params in (first, second):
        if isinstance(params, Mismatch):
            return params
    assert isinstance(first, SliceParams) and isinstance(second, SliceParams)
    source_dims, middle_dims = dims_of(inner.inputs[0]), dims_of(inner.outputs[0])
    rank = len(source_dims) if source_dims is not None else rank_of(inner.outputs[0])
    first_axes, second_axes = normalize_axes(first.axes, rank), normalize_axes(second.axes, rank)
    if first_axes is None or second_axes is None:
        return Mismatch("the slice axes are negative and the rank is unknown")
    merged: dict[int, tuple[int, int, int]] = {}
    for axis, start, end, step in zip(
        first_axes, first.starts, first.ends, first.steps, strict=True
    ):
        merged[axis] = (start, end, step)
    for axis, start, end, step in zip(
        second_axes, second.starts, second.ends, second.steps, strict=True
    ):
        if axis not in merged:
            merged[axis] = (start, end, step)
            continue
        dim = source_dims[axis] if source_dims is not None else None
        middle = middle_dims[axis] if middle_dims is not None else None
        composed = compose_slices(merged[axis], (start, end, step), dim, middle)
        if isinstance(composed, str):
            return Mismatch(f"axis {axis} is sliced twice {composed}")
        merged[axis] = composed
    return Match([inner, node], {"slices": merged, "attribute_form": first.attribute_form})


def _rewrite_slices(match: Match, context: RewriteContext) -> Replacement:
    inner, outer = match.nodes
    source = inner.inputs[0]
    assert source is not None
    merged: dict[int, tuple[int, int, int]] = match.bindings["slices"]
    axes = list(merged)
    starts = [merged[a][0] for a in axes]
    ends = [merged[a][1] for a in axes]
    steps = [merged[a][2] for a in axes]
    if match.bindings["attribute_form"] or context.opset() < 10:
        if any(s != 1 for s in steps):
            raise AssertionError("Slice-1 has no steps")
        return _replace_with(match, _same_op_on(outer, source, starts=starts, ends=ends, axes=axes))
    constants = [int64_constant(starts), int64_constant(ends), int64_constant(axes)]
    if any(s != 1 for s in steps):
        constants.append(int64_constant(steps))
    return _replace_with(match, _same_op_on(outer, source, constants), constants)


# Concat∘Concat ---------------------------------------------------------------------------------


def _concat_axis(node: ir.Node, context: RewriteContext) -> int | None:
    axis = node.attributes.get_int("axis", 1 if context.opset() < 4 else None)
    if axis is None or axis >= 0:
        return axis
    rank = rank_of(node.outputs[0])
    return None if rank is None else axis + rank


def _match_concats(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    axis = _concat_axis(node, context)
    if axis is None:
        return Mismatch("its axis is negative and the rank is unknown")
    inlined: list[ir.Node] = []
    reason = Mismatch("no input comes from a Concat")
    for value in node.inputs:
        producer = value.producer() if value is not None else None
        if producer is None or not is_op(producer, "Concat") or producer in inlined:
            continue
        assert value is not None
        if value.is_graph_output() or any(use.node is not node for use in value.uses()):
            reason = Mismatch("the inner Concat's result has other users")
            continue
        if producer.graph is not node.graph:
            reason = Mismatch("the inner Concat is in another scope")
            continue
        if _concat_axis(producer, context) != axis:
            reason = Mismatch("the inner Concat joins along another axis")
            continue
        inlined.append(producer)
    if not inlined:
        return reason
    return Match([*inlined, node])


def _rewrite_concats(match: Match, context: RewriteContext) -> Replacement:
    outer = match.root
    inlined = set(map(id, match.nodes[:-1]))
    inputs: list[ir.Value | None] = []
    for value in outer.inputs:
        producer = value.producer() if value is not None else None
        if producer is not None and id(producer) in inlined:
            inputs.extend(producer.inputs)
        else:
            inputs.append(value)
    merged = _same_op_on(outer, inputs[0], inputs[1:])  # type: ignore[arg-type]
    return _replace_with(match, merged)


# Concat of same-perm Transposes ----------------------------------------------------------------


def _match_concat_of_transposes(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Concat(T(a, p), T(b, p), axis=k) == T(Concat(a, b, axis=p[k]), p)``: axis k of T(a) is
    axis p[k] of a. Every input Transpose must die with the move (it then transposes the same
    elements once, and saves a node per input but one)."""
    transposes = _input_transposes(node)
    if transposes is None:
        return Mismatch("not every input comes from a Transpose", candidate=False)
    perms = {
        tuple(p) if (p := t.attributes.get_ints("perm", None)) is not None else None
        for t in transposes
    }
    if len(perms) != 1:
        return Mismatch("its input Transposes have different perms")
    perm = perms.pop()
    if perm is None:
        return Mismatch("the input Transposes reverse axes of an unknown rank")
    axis = node.attributes.get_int("axis", 1 if context.opset() < 4 else None)
    if axis is None or not -len(perm) <= axis < len(perm):
        return Mismatch("its axis is missing or out of range")
    axis %= len(perm)
    for value in node.inputs:
        assert value is not None
        if value.is_graph_output() or any(use.node is not node for use in value.uses()):
            return Mismatch("an input Transpose has other users: moving would add a node")
    unique = list(dict.fromkeys(transposes))
    if len(unique) < 2:
        return Mismatch("it joins fewer than two Transposes: moving would save no node")
    return Match([*unique, node], {"perm": perm, "axis": perm[axis]})


def _rewrite_concat_of_transposes(match: Match, context: RewriteContext) -> Replacement:
    node = match.root
    axis = ir.AttrInt64("axis", match.bindings["axis"])
    inner = ir.Node("", "Concat", _untransposed(node), [axis])
    return _then_transpose(inner, node.outputs[0], match.bindings["perm"])


# A reduction whose dropped axes a view puts back --------------------------------------------------


def _dropped_reduction(value: ir.Value | None) -> tuple[ir.Node, tuple[int, ...]] | Mismatch:
    """(Reduce node, its reduced axes) when ``value`` is a keepdims=0 reduction read only once."""
    node = None if value is None else value.producer()
    if node is None or not is_onnx_domain(node.domain) or node.op_type not in REDUCTIONS:
        return Mismatch("not a view of a reduction", candidate=False)
    if node.attributes.get_int("keepdims", 1) != 0:
        return Mismatch("the reduction keeps its dims", candidate=False)
    rank = rank_of(node.inputs[0])
    if rank is None:
        return Mismatch("the reduction's input rank is unknown")
    axes = axes_param(node, rank)
    if isinstance(axes, Mismatch):
        return axes
    if axes is None or not axes:
        if node.attributes.get_int("noop_with_empty_axes", 0):
            return Mismatch(
                "the reduction has no axes and noop_with_empty_axes: it reduces nothing"
            )
        axes = tuple(range(rank))
    assert value is not None
    if not only_user(value):
        return Mismatch("the reduction has other users: keeping its dims would add a node")
    return node, axes


def _puts_back(view: ir.Node, data: ir.Value, axes: Sequence[int]) -> str | None:
    """Why ``view`` (a Reshape of ``data``'s keepdims=0 reduction over ``axes``) may not give the
    shape keepdims=1 gives (None: it provably does). Views keep the element order, so that shape
    is all that matters."""
    dims = data.shape
    assert dims is not None
    kept = ir.Shape([1 if axis in axes else dim for axis, dim in enumerate(dims)])
    if same_dims(view.outputs[0].shape, kept):
        return None
    if "shape" in view.attributes or view.attributes.get_int("allowzero", 0) != 0:
        return "a Reshape-1 or allowzero view whose result shape is not known"
    target = const_ints(view.inputs[1] if len(view.inputs) > 1 else None)
    if target is None or len(target) != len(dims):
        return "the view's target is not a constant of the input's rank"
    if target.count(-1) > 1:
        return "the view's target has several -1 dims"
    for axis, want in enumerate(target):
        if want == -1:
            continue  # the one dim left: equal once every other dim is
        if axis in axes:
            if want != 1:
                return f"the view's target dim {axis} is {want}, not the reduced axis' 1"
        elif want == 0:
            if axis > min(axes):
                return f"the view's target dim {axis} copies a dim the reduction moved"
        elif not isinstance(dims[axis], int) or dims[axis] != want:
            return f"the view's target dim {axis} is {want}, not the input's dim"
    return None


def _match_view_of_reduction(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Reshape(ReduceX(x, axes, keepdims=0), t)`` where the view only puts the reduced axes back
    as 1s, or ``Unsqueeze`` of exactly those axes: ``ReduceX(x, axes, keepdims=1)`` (the dynamo
    exporter writes ``x.var(-1, keepdim=True)`` so, and the LayerNorm fusion reads keepdims=1)."""
    found = _dropped_reduction(node.inputs[0])
    if isinstance(found, Mismatch):
        return found
    reduce, axes = found
    data = reduce.inputs[0]
    assert data is not None and data.shape is not None
    if node.op_type == "Unsqueeze":
        added = axes_param(node, len(data.shape))
        if isinstance(added, Mismatch):
            return added
        if added is None or sorted(added) != sorted(axes):
            return Mismatch("the Unsqueeze adds other axes than the reduction dropped")
    else:
        problem = _puts_back(node, data, axes)
        if problem is not None:
            return Mismatch(problem)
    return Match([reduce, node])


def _rewrite_view_of_reduction(match: Match, context: RewriteContext) -> Replacement:
    reduce, view = match.nodes
    attributes = [a for a in reduce.attributes.values() if a.name != "keepdims"]
    kept = ir.Node(
        reduce.domain,
        reduce.op_type,
        list(reduce.inputs),
        [*attributes, ir.AttrInt64("keepdims", 1)],
    )
    return Replacement([kept], ((view.outputs[0], kept.outputs[0]),))


def _rule(
    name: str,
    op_type: str,
    match: Callable[[ir.Node, RewriteContext], Match | Mismatch],
    rewrite: Callable[[Match, RewriteContext], Replacement],
) -> Rule:
    return Rule(name, op_type, match, rewrite)


RULES: tuple[Rule, ...] = (
    _rule("Transpose∘Transpose", "Transpose", _match_transposes, _rewrite_transposes),
    _rule(
        "Transpose∘row-wise ops∘Transpose",
        "Transpose",
        _match_transpose_round_trip,
        _rewrite_transpose_round_trip,
    ),
    *(
        _rule(
            f"{op}(Transpose, Transpose)->Transpose({op})",
            op,
            _match_transpose_past,
            _rewrite_transpose_past,
        )
        for op in ELEMENTWISE_BINARY
    ),
    _rule(
        "Transpose(op(x, Transpose⁻¹))->op(Transpose(x))",
        "Transpose",
        _match_transpose_hoist,
        _rewrite_transpose_hoist,
    ),
    *(
        _rule(f"Reshape∘{inner}", "Reshape", _reshape_of(inner), _rewrite_reshapes)
        for inner in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose")
    ),
    _rule(
        "Reshape(dims and ones)->Unsqueeze",
        "Reshape",
        _match_unit_axes_reshape,
        _rewrite_unit_axes_reshape,
    ),
    _rule(
        "Reshape∘MatMul∘flatten",
        "Reshape",
        _match_matmul_between_views,
        _rewrite_matmul_between_views,
    ),
    *TF2ONNX_RULES,
    SOFTMAX_RULE,
    _rule("Unsqueeze∘Unsqueeze", "Unsqueeze", _match_unsqueezes, _rewrite_axes_merge),
    *(
        _rule(
            f"{view}∘Reduce(keepdims=0)->Reduce(keepdims=1)",
            view,
            _match_view_of_reduction,
            _rewrite_view_of_reduction,
        )
        for view in ("Reshape", "Unsqueeze")
    ),
    _rule("Unsqueeze∘Gather∘Shape->Shape", "Unsqueeze", _match_dim_read, _rewrite_dim_read),
    _rule("Gather∘Shape->Shape", "Gather", _match_dims_gather, _rewrite_dims_gather),
    _rule("Squeeze∘Squeeze", "Squeeze", _match_squeezes, _rewrite_axes_merge),
    _rule("Cast∘Cast", "Cast", _match_casts, _rewrite_casts),
    _rule("Slice∘Slice", "Slice", _match_slices, _rewrite_slices),
    _rule("Concat∘Concat", "Concat", _match_concats, _rewrite_concats),
    _rule(
        "Concat(Transposes)->Transpose(Concat)",
        "Concat",
        _match_concat_of_transposes,
        _rewrite_concat_of_transposes,
    ),
)


class MergeConsecutiveOpsPass(RulePass):
    """Merge Transpose∘Transpose (composed perm), Reshape∘(Reshape|Flatten|Squeeze|Unsqueeze), Squeeze∘Squeeze,
    Unsqueeze∘Unsqueeze (merged axes), exact Cast∘Cast, Slice∘Slice and Concat∘Concat into one op;
    a dim read Unsqueeze(Gather(Shape(x), i)) into Shape(x, start, end) (opset 15+); a Reshape
    to x's dims and ones read at run time into Unsqueeze(x); a MatMul
    (or plain Gemm) between a [-1, K] view and a view back reads the unflattened input; undo
    tf2onnx's einsum views and select arithmetic (``_tf2onnx_forms``); merge a spelled-out
    ``exp(x - max) / sum`` into Softmax (``_softmax_form``); move a
    Transpose past Add/Sub/Mul/Div of two same-perm Transposes, or past a Concat of same-perm
    Transposes (toward its inverse), or above Add/Sub/Mul/Div of its inverse.
    """

    name = "merge-consecutive-ops"
    summary = (
        "merge Transpose, Reshape, (Un)Squeeze, exact Cast, Slice and Concat chains into one op;"
        " move a Transpose past Add/Sub/Mul/Div or Concat of same-perm Transposes, or above"
        " Add/Sub/Mul/Div of its inverse"
    )
    rules = RULES
