"""Remove nodes that provably return their input unchanged (same values, dtype and shape).

Each rule proves the no-op from constants, dtypes and shapes; symbolic dims are never assumed to
have any particular size, so a proof that needs one fails with a reason (see ``--explain``).

Floating-point note: ``x + 0`` and ``x - (-0)`` turn ``-0.0`` into ``+0.0``; removing them keeps
``-0.0``. The two compare equal, so we remove them as ONNX Runtime's own optimizer does. ``x * 1``,
``x / 1`` and ``x - 0`` are exact for every value, NaN and infinities included. The one rule that
is not bit-exact drops a tiny constant added to every score before a Softmax (TensorFlow's
1e-9): softmax ignores the shift, and the scores differ by x + c's rounding alone.

One rule removes a node whose result is larger than its kept input: ``And(t, m)`` with t proven
all true (an ordering decided by bounds: ``Range(0, S) >= 0``, transformers' bidirectional mask
term) is m broadcast to t's shape too. Where every path from it runs through element-wise ops to
an op that broadcasts it against a tensor with the dims t added, m gives every result the same
values and shapes, so the And goes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from onnxopt.ops import const_array, constant_of_shape_fill, is_onnx_domain, is_op
from onnxopt.passes._attention_shapes import (
    Entry,
    peel_torch_expand_shape,
    same_dim,
    static_dim,
    target_entries,
)
from onnxopt.passes._shape_facts import (
    ELEMENT_MOVES,
    MULTIDIRECTIONAL,
    SLICE_TO_END,
    broadcast_keeps,
    cast_target,
    const_ints,
    dims_of,
    int_param,
    is_whole_shape_of,
    normalize_axes,
    optional_input,
    producer_op,
    reshape_identity_problem,
    same_dims,
    same_known_dims,
    slice_params,
)
from onnxopt.passes.base import RulePass
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule


def _keep(node: ir.Node, source: ir.Value | None, *inner: ir.Node) -> Match | Mismatch:
    """The node's first output is ``source``; ``inner`` nodes go too when nothing else uses them."""
    if source is None:
        return Mismatch("its data input is missing")
    result = node.outputs[0]
    if source.dtype is not None and result.dtype is not None and source.dtype != result.dtype:
        return Mismatch(f"the result is {result.dtype} but the input is {source.dtype}")
    return Match([*inner, node], {"source": source})


def _forward(match: Match, context: RewriteContext) -> Replacement:
    return Replacement((), ((match.root.outputs[0], match.bindings["source"]),))


def _identity(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    return _keep(node, node.inputs[0])


def _dropout(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
        return Mismatch("its mask output is used")
    if context.opset() < 7 and not node.attributes.get_int("is_test", 0):
        return Mismatch("is_test=0: Dropout before opset 7 is in training mode")
    training = optional_input(node, 2)
    if training is not None:
        flag = const_array(training)
        if flag is None:
            return Mismatch("training_mode is not a constant")
        if flag.size != 1 or bool(flag.reshape(-1)[0]):
            return Mismatch("training_mode is true")
    return _keep(node, node.inputs[0])


def _cast(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    source = node.inputs[0]
    if source is None or source.dtype is None:
        return Mismatch("the input dtype is unknown")
    target = cast_target(node)
    if target != source.dtype:
        return Mismatch(f"casts {source.dtype} to {target}")
    return _keep(node, source)


def _cast_like(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    source, like = node.inputs[0], optional_input(node, 1)
    if source is None or like is None or source.dtype is None or like.dtype is None:
        return Mismatch("an input dtype is unknown")
    if source.dtype != like.dtype:
        return Mismatch(f"casts {source.dtype} to {like.dtype}")
    return _keep(node, source)


def _reshape(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    problem = reshape_identity_problem(node, node.inputs[0])
    return Mismatch(problem) if problem is not None else _keep(node, node.inputs[0])


def _transpose(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    perm = node.attributes.get_ints("perm", None)
    if perm is None:
        dims = dims_of(node.inputs[0])
        if dims is None:
            return Mismatch("no perm and the rank is unknown")
        perm = tuple(reversed(range(len(dims))))
    if tuple(perm) != tuple(range(len(perm))):
        return Mismatch(f"perm {list(perm)} is not the identity")
    return _keep(node, node.inputs[0])


def _readers_broadcast_against(
    node: ir.Node, context: RewriteContext, takes: Callable[[ir.Value], bool], target: str
) -> Mismatch | None:
    """None when every reader of the Expand's result is a broadcasting op that also takes a tensor
    ``takes`` accepts (one of the expanded shape): it then broadcasts the unexpanded data into the
    same shape and values. ``target`` names the expanded shape in the reasons."""
    if context.opset() < 9:
        return Mismatch("before opset 9 not every op broadcasts its inputs")
    result = node.outputs[0]
    if result.is_graph_output() or not result.uses():
        return Mismatch("the expanded tensor is a graph output or unused")
    for use in result.uses():
        user = use.node
        if user.domain != "" or user.op_type not in MULTIDIRECTIONAL:
            return Mismatch(f"it is expanded to {target} and read by {user.op_type}")
        if not any(v is not None and takes(v) for i, v in enumerate(user.inputs) if i != use.idx):
            return Mismatch(f"it is expanded to {target}, which {user.op_type} does not also take")
    return None


def _expand_to_partner(node: ir.Node, context: RewriteContext) -> Mismatch | None:
    """``Expand(c, Shape(x))`` read only by broadcasting ops that also take x (TorchScript's
    ``expand_as``, e.g. a mask expanded to the scores it fills), or a tensor of x's shape (once
    fold-shape-values shares equal shape reads, Swin-V2's normalized key reads the query's): each
    op broadcasts c against it into the same shape and values without the Expand. None when that
    holds."""
    shape = optional_input(node, 1)
    producer = shape.producer() if shape is not None else None
    partner = producer.inputs[0] if producer is not None and is_op(producer, "Shape") else None
    if partner is None or not is_whole_shape_of(shape, partner):
        return Mismatch("the target shape is not a constant")
    return _readers_broadcast_against(
        node,
        context,
        lambda v: v is partner or same_dims(v.shape, partner.shape),
        f"Shape({partner.name})",
    )


def _expands_to_own_dims(data: ir.Value | None, shape: ir.Value | None) -> bool:
    """The target is a constant-and-shape-read list (``Concat(Shape(a)[0:1], Shape(b)[1:2], [1])``,
    torch's dynamo ``broadcast_in_dim`` after a reduction) whose every entry is 1 or data's own
    dim at that place (read off it, the same symbol, or its static size): broadcasting data to it
    gives data's shape back. No longer than data's rank (a longer one would add dims)."""
    rank = len(data.shape) if data is not None and data.shape is not None else None
    entries = target_entries(shape)
    if data is None or rank is None or entries is None or len(entries) > rank:
        return False
    offset = rank - len(entries)
    return all(entry == 1 or same_dim(entry, data, offset + i) for i, entry in enumerate(entries))


def _expands_to_partner_dims(node: ir.Node, context: RewriteContext) -> bool:
    """The target is a constant-and-shape-read list whose entries are, place by place, the dims of
    a tensor that every reader (a broadcasting op) also takes: dynamo writes ``F.normalize``'s
    denominator as ``Expand(clamp(norm), Concat(Shape(input)[0:1], [256], [16]))`` divided into
    the [batch, 256, 16] numerator."""
    entries = target_entries(optional_input(node, 1))
    if entries is None:
        return False

    def has_the_dims(v: ir.Value) -> bool:
        return (
            v.shape is not None
            and len(v.shape) == len(entries)
            and all(same_dim(entry, v, i) for i, entry in enumerate(entries))
        )

    return _readers_broadcast_against(node, context, has_the_dims, "dims read elsewhere") is None


def _expand(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    data, shape = node.inputs[0], optional_input(node, 1)
    data_dims = dims_of(data)
    if is_whole_shape_of(shape, data) or same_known_dims(data_dims, dims_of(node.outputs[0])):
        return _keep(node, data)
    target = const_ints(shape)
    if target is None:
        problem = _expand_to_partner(node, context)
        if problem is not None and (
            _expands_to_own_dims(data, shape) or _expands_to_partner_dims(node, context)
        ):
            problem = None
        return problem if problem is not None else _keep(node, data)
    if data_dims is None:
        return Mismatch("the input rank is unknown")
    problem = broadcast_keeps(data_dims, target, f"the target shape {list(target)}")
    return problem if problem is not None else _keep(node, data)


def _pad(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if "paddings" in node.attributes:  # Pad-1
        pads: tuple[int, ...] | Mismatch | None = tuple(node.attributes.get_ints("paddings", ()))
    else:
        pads = int_param(node, "pads", 1)
    if isinstance(pads, Mismatch):
        return pads
    if pads is None:
        return Mismatch("no pads")
    if any(pads):
        return Mismatch(f"pads {list(pads)} are not all zero")
    return _keep(node, node.inputs[0])


def _slice(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    params = slice_params(node)
    if isinstance(params, Mismatch):
        return params
    data = node.inputs[0]
    dims = dims_of(data)
    axes = normalize_axes(params.axes, len(dims) if dims is not None else None)
    if axes is None:
        return Mismatch("its axes cannot be resolved (negative axis with unknown rank?)")
    for axis, start, end, step in zip(axes, params.starts, params.ends, params.steps, strict=True):
        dim = dims[axis] if dims is not None else None
        if step != 1:
            return Mismatch(f"step {step} on axis {axis}")
        if start != 0 and not (start < 0 and dim is not None and start + dim <= 0):
            return Mismatch(f"axis {axis} starts at {start}")
        if end < SLICE_TO_END and not (dim is not None and end >= dim):
            return Mismatch(
                f"axis {axis} ends at {end}, and the dim is {dim if dim is not None else 'symbolic'}"
            )
    return _keep(node, data)


def _concat(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """One input, or one input beside inputs empty along the axis (Phi-3's ``cat([q_rot, q_pass])``
    with a rotary over the whole head leaves ``q_pass = q[..., 16:]`` of 16 dims: 0 wide)."""
    if len(node.inputs) == 1:
        return _keep(node, node.inputs[0])
    rank = len(node.outputs[0].shape) if node.outputs[0].shape is not None else None
    axis = node.attributes.get_int("axis", 0)
    if rank is None or not -rank <= axis < rank:
        return Mismatch(f"it has {len(node.inputs)} inputs")
    axis %= rank

    def empty(value: ir.Value | None) -> bool:
        shape = None if value is None else value.shape
        return shape is not None and len(shape) == rank and shape[axis] == 0

    kept = [v for v in node.inputs if not empty(v)]
    if len(kept) != 1 or kept[0] is None:
        return Mismatch(f"it has {len(node.inputs)} inputs, {len(kept)} of them not provably empty")
    return _keep(node, kept[0])


def _single_input(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """Variadic Sum/Mean/Max/Min of one tensor is that tensor."""
    if len(node.inputs) != 1:
        return Mismatch(f"it has {len(node.inputs)} inputs")
    return _keep(node, node.inputs[0])


def _tile(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    repeats = const_ints(optional_input(node, 1))
    if repeats is None:
        return Mismatch("the repeats are not a constant")
    if any(r != 1 for r in repeats):
        return Mismatch(f"repeats {list(repeats)} are not all 1")
    return _keep(node, node.inputs[0])


def _reduce(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """A reduction over no axes (noop_with_empty_axes) or only over size-1 dims it keeps."""
    axes = int_param(node, "axes", 1)
    if isinstance(axes, Mismatch):
        return axes
    noop_when_empty = node.attributes.get_int("noop_with_empty_axes", 0)
    if not axes and noop_when_empty:
        return _keep(node, node.inputs[0])
    if node.attributes.get_int("keepdims", 1) == 0:
        return Mismatch("keepdims=0 drops the reduced dims")
    dims = dims_of(node.inputs[0])
    if dims is None:
        return Mismatch("the input rank is unknown")
    reduced = normalize_axes(axes, len(dims)) if axes else tuple(range(len(dims)))
    if reduced is None:
        return Mismatch(f"axes {list(axes or ())} are out of range")
    if any(dims[axis] != 1 for axis in reduced):
        return Mismatch("it reduces a dim that is not known to be 1")
    return _keep(node, node.inputs[0])


def _softmax_stabilizer(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``x - ReduceMax(x, [a], keepdims=1)`` read only by (Log)Softmax over axis a: they subtract
    the row max themselves, and the max of the shifted row is exactly 0, so they compute the same
    bits from x (MiMo-V2-Flash's eager attention, dynamo export)."""
    if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
        return Mismatch("it does not have two inputs")
    peak = node.inputs[1].producer()
    if not is_op(peak, "ReduceMax") or peak is None or peak.inputs[0] is not node.inputs[0]:
        return Mismatch("it does not subtract a ReduceMax of its own first operand")
    if context.opset() < 13:
        return Mismatch("before opset 13 Softmax normalizes a flattened 2-D view")
    axes = int_param(peak, "axes", 1)
    dims = dims_of(node.inputs[0])
    rank = len(dims) if dims is not None else None
    reduced = normalize_axes(axes, rank) if not isinstance(axes, Mismatch) and axes else None
    if reduced is None or len(reduced) != 1 or peak.attributes.get_int("keepdims", 1) != 1:
        return Mismatch("the ReduceMax is not over one axis with keepdims=1")
    result = node.outputs[0]
    uses = result.uses()
    if result.is_graph_output() or not uses:
        return Mismatch("the difference is a graph output or unused")
    for use in uses:
        user = use.node
        axis = normalize_axes([user.attributes.get_int("axis", -1)], rank)
        if user.domain != "" or user.op_type not in ("Softmax", "LogSoftmax") or axis != reduced:
            return Mismatch(
                f"the difference is read by {user.op_type}, not only by a Softmax over the "
                "reduced axis"
            )
    return _keep(node, node.inputs[0], peak)


# The largest shift dropped before a Softmax: TensorFlow's stable_softmax adds 1e-9 (a workaround
# for an XLA bug) to every score; Keras and tf2onnx keep it in the graph.
_SOFTMAX_SHIFT = 1e-6


def _softmax_shift(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``Softmax(x + c)`` for a scalar constant c with |c| <= 1e-6 (read only by Softmax or
    LogSoftmax): softmax is invariant under adding one constant to every entry, so what differs
    is the rounding of x + c. In float32 x + c is x itself wherever |c| is under half a unit in the
    last place of x (|x| of 2**-5 or more for TensorFlow's 1e-9), and within |c| of x elsewhere.
    The attention fusions then see the scores' own sum."""
    for index in (0, 1):
        shift = const_array(node.inputs[index])
        other = node.inputs[1 - index]
        if shift is not None and shift.size == 1 and other is not None:
            break
    else:
        return Mismatch("no operand is a constant scalar", candidate=False)
    if shift.dtype.kind != "f" or not abs(float(shift.reshape(-1)[0])) <= _SOFTMAX_SHIFT:
        return Mismatch(f"the shift is not a float of magnitude {_SOFTMAX_SHIFT} or less")
    result = node.outputs[0]
    uses = result.uses()
    if result.is_graph_output() or not uses:
        return Mismatch("the sum is a graph output or unused")
    if any(
        use.node.domain != "" or use.node.op_type not in ("Softmax", "LogSoftmax") for use in uses
    ):
        return Mismatch("the sum is read by something other than a Softmax")
    dims, other_dims = dims_of(result), dims_of(other)
    if (
        dims is None
        or other_dims is None
        or len(dims) != len(other_dims)
        or other.dtype != result.dtype
    ):
        return Mismatch("the shift could change the scores' rank or type")
    return _keep(node, other)


def _split(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if len(node.outputs) != 1:
        return Mismatch(f"it has {len(node.outputs)} outputs")
    sizes = int_param(node, "split", 1)
    if isinstance(sizes, Mismatch):
        return sizes
    if sizes is not None:
        dims = dims_of(node.inputs[0])
        axes = normalize_axes([node.attributes.get_int("axis", 0)], len(dims) if dims else None)
        if (
            dims is None
            or axes is None
            or dims[axes[0]] is None
            or tuple(sizes) != (dims[axes[0]],)
        ):
            return Mismatch(f"split sizes {list(sizes)} cannot be proven to cover the whole axis")
    return _keep(node, node.inputs[0])


def _flatten(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    dims = dims_of(node.inputs[0])
    if dims is None or len(dims) != 2:
        return Mismatch("the input is not known to be 2-D")
    axis = node.attributes.get_int("axis", 1)
    axis = axis + 2 if axis < 0 else axis
    if axis == 1 or (axis == 0 and dims[0] == 1) or (axis == 2 and dims[1] == 1):
        return _keep(node, node.inputs[0])
    return Mismatch(f"axis {axis} reshapes a 2-D input of shape {list(dims)}")


def _axes_pair(outer: ir.Node, inner: ir.Node, rank: int | None) -> Mismatch | None:
    """Prove that ``outer`` and ``inner`` (Squeeze/Unsqueeze) name the same axes at rank ``rank``."""
    outer_axes, inner_axes = int_param(outer, "axes", 1), int_param(inner, "axes", 1)
    for axes in (outer_axes, inner_axes):
        if isinstance(axes, Mismatch):
            return axes
    if inner_axes is None and is_op(inner, "Squeeze"):
        dims = dims_of(inner.inputs[0])  # Squeeze without axes drops every dim of size 1
        if dims is None or None in dims:
            return Mismatch("the Squeeze has no axes and the input shape is not fully known")
        inner_axes = tuple(i for i, d in enumerate(dims) if d == 1)
        rank = len(dims)
    assert not isinstance(outer_axes, Mismatch) and not isinstance(inner_axes, Mismatch)
    if outer_axes is None or inner_axes is None:
        return Mismatch("the Squeeze has no axes")
    if sorted(outer_axes) == sorted(inner_axes):
        return None  # both are normalized against the same rank, so equal lists mean equal axes
    a, b = normalize_axes(outer_axes, rank), normalize_axes(inner_axes, rank)
    if a is None or b is None:
        return Mismatch("the axes differ in sign and the rank is unknown")
    if sorted(a) != sorted(b):
        return Mismatch(f"axes {list(inner_axes)} and {list(outer_axes)} differ")
    return None


def _undo_pair(inner_type: str) -> Callable[[ir.Node, RewriteContext], Match | Mismatch]:
    """Squeeze(Unsqueeze(x, a), a) or Unsqueeze(Squeeze(x, a), a): both give x back."""

    def match(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
        inner = producer_op(node, inner_type)
        if isinstance(inner, Mismatch):
            return inner
        # Both ops' axes count in the rank of the tensor that has the extra dims.
        unsqueezed = node.inputs[0] if inner_type == "Unsqueeze" else inner.inputs[0]
        dims = dims_of(unsqueezed)
        problem = _axes_pair(node, inner, len(dims) if dims is not None else None)
        return problem if problem is not None else _keep(node, inner.inputs[0], inner)

    return match


def _filled(value: ir.Value | None) -> np.ndarray | None:
    """The constant a run-time-shaped tensor is filled with: ``Expand(c, shape)`` or
    ``ConstantOfShape(shape)`` (baddbmm(torch.zeros(...), q, k) exported); None otherwise."""
    node = value.producer() if value is not None else None
    if node is None:
        return None
    if is_op(node, "Expand"):
        return const_array(node.inputs[0])
    if is_op(node, "ConstantOfShape"):
        return constant_of_shape_fill(node)
    return None


def _neutral_operand(
    element: float, commutative: bool
) -> Callable[[ir.Node, RewriteContext], Match | Mismatch]:
    """``x op c`` (or ``c op x``) where every element of the constant ``c`` is ``element``."""

    def match(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
        if len(node.inputs) != 2:
            return Mismatch("it does not have two inputs")
        orders = [(0, 1), (1, 0)] if commutative else [(0, 1)]
        problem = Mismatch(f"no operand is a constant {element:g}")
        for kept_index, const_index in orders:
            kept, constant = node.inputs[kept_index], node.inputs[const_index]
            array, expanded = const_array(constant), False
            if array is None:
                array, expanded = _filled(constant), True
            if array is None or array.size == 0 or not bool(np.all(array == element)):
                continue
            if kept is None or kept.dtype is None:
                return Mismatch("the other operand's dtype is unknown")
            if kept.dtype.numpy() != array.dtype:
                return Mismatch(f"the operands' dtypes differ ({kept.dtype} and {array.dtype})")
            dims = dims_of(kept)
            if dims is None:
                return Mismatch("the other operand's rank is unknown")
            if expanded:
                if same_dims(kept.shape, node.outputs[0].shape):
                    return _keep(node, kept)
                problem = Mismatch(
                    f"the constant {element:g} is expanded to a shape not provably the other "
                    "operand's"
                )
                continue
            shape_problem = broadcast_keeps(dims, array.shape, f"the constant {element:g}")
            if shape_problem is not None:
                problem = shape_problem
                continue
            return _keep(node, kept)
        return problem

    return match


def _where(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    condition = const_array(node.inputs[0])
    if condition is None or condition.size == 0:
        return Mismatch("the condition is not a constant")
    if bool(np.all(condition)):
        kept, other = node.inputs[1], node.inputs[2]
    elif not bool(np.any(condition)):
        kept, other = node.inputs[2], node.inputs[1]
    else:
        return Mismatch("the condition mixes true and false")
    dims, other_dims = dims_of(kept), dims_of(other)
    if dims is None or other_dims is None:
        return Mismatch("a branch's rank is unknown")
    problem = broadcast_keeps(dims, condition.shape, "the condition") or broadcast_keeps(
        dims, other_dims, "the unused branch"
    )
    return problem if problem is not None else _keep(node, kept)


def _unsqueeze_nothing(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """An Unsqueeze of an empty axes list (jax2tf's expand of no dims) inserts nothing."""
    axes = int_param(node, "axes", 1)
    if axes is None or isinstance(axes, Mismatch) or len(axes) != 0:
        return Mismatch("it inserts axes", candidate=False)
    return _keep(node, node.inputs[0])


def _matmul_by_ones(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``MatMul(c, x)`` with c all ones of shape [..., 1, 1] and x's rows one long ([..., 1, N]),
    or ``MatMul(x, c)`` with x [..., M, 1]: each result element is one product, x·1, so the
    result is x wherever c's batch dims broadcast into x's without growing them (jax2tf's einsum
    of Flax's head mask of ones, ``'...hqk,h->...hqk'``)."""
    if len(node.inputs) != 2:
        return Mismatch("not a binary MatMul", candidate=False)
    for index in (0, 1):
        ones, x = const_array(node.inputs[index]), node.inputs[1 - index]
        if ones is None or ones.ndim < 2 or ones.shape[-2:] != (1, 1):
            continue
        if not np.all(ones == 1):
            return Mismatch("the [..., 1, 1] constant is not all ones")
        dims = dims_of(x)
        if x is None or dims is None or len(dims) < 2:
            return Mismatch("the other operand's rank is unknown or below 2")
        if (dims[-2] if index == 0 else dims[-1]) != 1:
            return Mismatch("the product sums over more than one element")
        problem = broadcast_keeps(dims[:-2], ones.shape[:-2], "the ones' batch dims")
        return problem if problem is not None else _keep(node, x)
    return Mismatch("no operand is a constant of ones [..., 1, 1]", candidate=False)


# And of a comparison that is always true ------------------------------------------------------

# Ops that map each element on its own: a shape they are given is the shape they return.
_UNARY_ELEMENTWISE = frozenset(
    {"Not", "Cast", "Neg", "Abs", "Identity", "Sigmoid", "Tanh", "Relu", "Exp", "Log", "Sqrt",
     "Reciprocal", "Floor", "Ceil", "Sign", "Erf", "IsNaN", "IsInf"}
)  # fmt: skip
_ORDERINGS = frozenset({"Greater", "GreaterOrEqual", "Less", "LessOrEqual"})
_MAX_DEPTH = 16


def _int_bounds(value: ir.Value | None, depth: int = 0) -> tuple[float, float] | None:
    """[lo, hi] holding every element of an integer tensor: a constant's extremes, a Range
    counting up (or down) from a constant start, unbounded the other way, and copies of their
    elements (views, Expand, Gather). None when nothing is known."""
    if value is None or depth > _MAX_DEPTH:
        return None
    array = const_array(value)
    if array is not None:
        if array.size == 0 or not np.issubdtype(array.dtype, np.integer):
            return None
        return float(array.min()), float(array.max())
    node = value.producer()
    if node is None or not is_onnx_domain(node.domain) or not node.inputs:
        return None
    if node.op_type == "Range" and len(node.inputs) == 3:
        start, delta = const_ints(node.inputs[0]), const_ints(node.inputs[2])
        if start is None or delta is None or len(start) != 1 or len(delta) != 1 or not delta[0]:
            return None
        return (start[0], np.inf) if delta[0] > 0 else (-np.inf, start[0])
    if node.op_type in ELEMENT_MOVES:
        return _int_bounds(node.inputs[0], depth + 1)
    return None


def _always_true(value: ir.Value | None, depth: int = 0) -> bool:
    """Every element is provably true: an ordering of two tensors whose bounds decide it
    (transformers' bidirectional mask term ``q_idx >= 0`` over ``Range(0, S)``), an And of such,
    or copies of their elements."""
    node = value.producer() if value is not None else None
    if node is None or not is_onnx_domain(node.domain) or depth > _MAX_DEPTH or not node.inputs:
        return False
    if node.op_type in ELEMENT_MOVES:
        return _always_true(node.inputs[0], depth + 1)
    if node.op_type == "Cast" and cast_target(node) == ir.DataType.BOOL:
        # any nonzero value casts to true: a mask of ones made at run time (a decoder given no
        # attention mask: ``torch.ones(B, T)``, a ConstantOfShape of 1.0)
        filler = node.inputs[0].producer() if node.inputs[0] is not None else None
        return _always_true(node.inputs[0], depth + 1) or (
            is_op(filler, "ConstantOfShape") and _nonzero_fill(filler)
        )
    if node.op_type == "ConstantOfShape":
        return node.outputs[0].dtype == ir.DataType.BOOL and _nonzero_fill(node)
    if node.op_type == "And":
        return all(_always_true(v, depth + 1) or _all_true_constant(v) for v in node.inputs)
    if node.op_type not in _ORDERINGS or len(node.inputs) != 2:
        return False
    big, small = (_int_bounds(v) for v in node.inputs)
    if node.op_type.startswith("Less"):
        big, small = small, big
    if big is None or small is None:
        return False
    return big[0] > small[1] if node.op_type in ("Greater", "Less") else big[0] >= small[1]


def _nonzero_fill(node: ir.Node | None) -> bool:
    """A ConstantOfShape filled with a nonzero value (true once cast to bool)."""
    if node is None:
        return False
    fill = constant_of_shape_fill(node)
    return fill.size > 0 and bool(np.all(fill != 0))


def _all_true_constant(value: ir.Value | None) -> bool:
    array = const_array(value)
    return array is not None and array.dtype == np.bool_ and array.size > 0 and bool(array.all())


Need = tuple[int, int]  # (an axis counted from the right, the all-true operand's axis there)


def _restores(partner: ir.Value, true: ir.Value, need: Need) -> bool:
    """``partner`` has the axis (and, where the all-true operand's dim there is not 1, the
    same dim), so broadcasting against it gives the axis back."""
    rank = len(partner.shape) if partner.shape is not None else 0
    return _expands_back([("dim", partner, i) for i in range(rank)], true, need)


def _broadcast_back(
    value: ir.Value, true: ir.Value, needs: list[Need], depth: int = 0
) -> Mismatch | None:
    """None when every path from ``value`` runs through element-wise ops to an op that
    broadcasts it against a tensor with each needed axis: dropping those axes earlier (an And
    with an all-true tensor that only broadcast the other operand) leaves every result alone."""
    if depth > _MAX_DEPTH:
        return Mismatch("its result runs through too many ops")
    if value.is_graph_output() or not value.uses():
        return Mismatch("its result is a graph output or unused")
    for use in value.uses():
        user = use.node
        if not is_onnx_domain(user.domain):
            return Mismatch(f"its result is read by {user.op_type}")
        if user.op_type == "Expand" and use.idx == 0 and len(user.inputs) > 1:
            shape = user.inputs[1]
            entries = target_entries(peel_torch_expand_shape(shape)) if shape is not None else None
            if entries is None or not all(_expands_back(entries, true, n) for n in needs):
                return Mismatch("its result is expanded to a shape without the dims it drops")
            continue
        if user.op_type in MULTIDIRECTIONAL:
            others = [v for i, v in enumerate(user.inputs) if i != use.idx and v is not None]
            left = [n for n in needs if not any(_restores(v, true, n) for v in others)]
        elif user.op_type in _UNARY_ELEMENTWISE:
            left = needs
        else:
            return Mismatch(f"its result reaches {user.op_type}, which does not broadcast it")
        if left:
            problem = _broadcast_back(user.outputs[0], true, left, depth + 1)
            if problem is not None:
                return problem
    return None


def _expands_back(entries: list[Entry], true: ir.Value, need: Need) -> bool:
    """A shape given as ``entries`` has the axis (and the all-true operand's dim there, unless
    that is 1): broadcasting into it gives the axis back."""
    from_right, axis = need
    if len(entries) < from_right:
        return False
    return static_dim(true, axis) == 1 or same_dim(entries[-from_right], true, axis)


def _and_always_true(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``And(t, m)`` with t provably all true is m broadcast to t's shape too: m itself where
    that changes no shape, or where every reader broadcasts it back (the mask meets the
    [B, H, S, S] scores, or TorchScript's expand to them)."""
    if len(node.inputs) != 2:
        return Mismatch("it does not have two inputs", candidate=False)
    for index in (0, 1):
        true, kept = node.inputs[index], node.inputs[1 - index]
        if true is None or kept is None or not _always_true(true):
            continue
        if same_dims(kept.shape, node.outputs[0].shape):
            return _keep(node, kept)
        if true.shape is None or kept.shape is None:
            return Mismatch("an operand's rank is unknown")
        if context.opset() < 9:
            return Mismatch("before opset 9 not every op broadcasts its inputs")
        # the axes where the true operand, not the kept one, makes the And's shape
        rank = len(true.shape)
        needs = [(rank - axis, axis) for axis in range(rank)]
        needs = [need for need in needs if not _restores(kept, true, need)]
        problem = _broadcast_back(node.outputs[0], true, needs) if needs else None
        return problem if problem is not None else _keep(node, kept)
    return Mismatch("no operand is an ordering proven always true", candidate=False)


def _rule(
    name: str, op_type: str, match: Callable[[ir.Node, RewriteContext], Match | Mismatch]
) -> Rule:
    return Rule(name, op_type, match, _forward)


RULES: tuple[Rule, ...] = (
    _rule("Identity removed", "Identity", _identity),
    _rule("Dropout removed", "Dropout", _dropout),
    _rule("Cast removed", "Cast", _cast),
    _rule("CastLike removed", "CastLike", _cast_like),
    _rule("Reshape removed", "Reshape", _reshape),
    _rule("Transpose removed", "Transpose", _transpose),
    _rule("Expand removed", "Expand", _expand),
    _rule("Pad removed", "Pad", _pad),
    _rule("Slice removed", "Slice", _slice),
    _rule("Concat removed", "Concat", _concat),
    _rule("Sum removed", "Sum", _single_input),
    _rule("Mean removed", "Mean", _single_input),
    _rule("Max removed", "Max", _single_input),
    _rule("Min removed", "Min", _single_input),
    _rule("Tile removed", "Tile", _tile),
    *(
        _rule(f"{op} removed", op, _reduce)
        for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd")
    ),
    _rule("Split removed", "Split", _split),
    _rule("Flatten removed", "Flatten", _flatten),
    _rule("Unsqueeze of no axes removed", "Unsqueeze", _unsqueeze_nothing),
    _rule("MatMul by ones removed", "MatMul", _matmul_by_ones),
    _rule("Unsqueeze+Squeeze removed", "Squeeze", _undo_pair("Unsqueeze")),
    _rule("Squeeze+Unsqueeze removed", "Unsqueeze", _undo_pair("Squeeze")),
    _rule("Add 0 removed", "Add", _neutral_operand(0, commutative=True)),
    _rule("Sub 0 removed", "Sub", _neutral_operand(0, commutative=False)),
    _rule("Mul 1 removed", "Mul", _neutral_operand(1, commutative=True)),
    _rule("Div 1 removed", "Div", _neutral_operand(1, commutative=False)),
    _rule("And true removed", "And", _neutral_operand(True, commutative=True)),
    _rule("And always-true removed", "And", _and_always_true),
    _rule("Or false removed", "Or", _neutral_operand(False, commutative=True)),
    _rule("Where removed", "Where", _where),
    _rule("Softmax stabilizer removed", "Sub", _softmax_stabilizer),
    _rule("Softmax shift removed", "Add", _softmax_shift),
)


class EliminateNoopsPass(RulePass):
    """Remove ops proven to return their input: Identity, inference Dropout, same-dtype Cast,
    shape-preserving Reshape/Expand/Flatten, Expand to the shape of the tensor it is combined with,
    identity Transpose, zero Pad, whole-axis Slice,
    one-input Concat/Sum/Mean/Max/Min, one-output Split, Tile by ones, Unsqueeze/Squeeze pairs,
    Unsqueeze of no axes, a MatMul by ones that sums one product per element,
    ReduceSum/Mean/Max/Min/Prod over nothing or over kept size-1 dims,
    x+0, x-0, x*1, x/1, x and true, x or false, Where with a constant condition, the row max
    subtracted before a Softmax, a shift of at most 1e-6 added before one; x and an ordering
    proven always true, where x's readers broadcast it back to the And's shape.
    """

    name = "eliminate-noops"
    summary = "remove ops that provably return their input (Identity, Dropout, x*1, identity Transpose, ...)"
    rules = RULES
