"""Fuse decomposed layer normalization into LayerNormalization, and Add+LayerNorm into SkipLayerNormalization.

Exporters spell ``y = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta`` (over the last axis) as
ReduceMean, Sub, Pow (or Mul by itself), ReduceMean, Add, Sqrt, Div (or Mul by Reciprocal), Mul, Add.
Keras computes it as TensorFlow's batch_normalization, ``x * m + (beta - mean * m)`` with
``m = gamma / sqrt(var + eps)``, and tf2onnx writes a mean over the last axis of a rank-3 tensor
as a GlobalAveragePool; both spellings fuse. Where tf2onnx kept a residual stream as [B, D, T] (TF
Whisper's encoder), the statistics are over axis 1 of the stream and the terms transposed to
[B, T, D]: that is ``LayerNormalization(Transpose(r))``.
For target ``ort``, ``LayerNormalization(a + b [+ bias])`` becomes com.microsoft
SkipLayerNormalization; when the sum is also used elsewhere it is taken from the fused node's
fourth output. A float32 island around a float16 input, ``Cast(norm(Cast(x, float)), float16)``,
becomes one float16 LayerNormalization (``stash_type=1``: it computes in float32 inside).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, const_array, is_op, single_consumer
from onnxopt.passes._shape_facts import const_ints, dims_of
from onnxopt.passes.base import Pass, PassResult, RulePass
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule, apply_rules
from onnxopt.rewrite.patterns import (
    const_scalar,
    const_scalar_within,
    ensure_opset,
    new_constant,
    operand_op,
    other_input,
    producer_op,
    users,
)

LAYER_NORM_OPSET = 17


def reduce_axes(node: ir.Node) -> list[int] | None:
    """The axes a Reduce* node reduces over (attribute before opset 18, input after), when constant."""
    attr = node.attributes.get("axes")
    if attr is not None:
        return list(attr.as_ints())
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = const_array(node.inputs[1])
        return None if axes is None else [int(a) for a in axes.reshape(-1)]
    return None


def mean_of(value: ir.Value | None) -> ir.Node | None:
    """The ReduceMean that computes ``value``, or a GlobalAveragePool: tf2onnx writes a mean over
    the last axis of a rank-3 tensor as one (it averages every axis after the second, kept)."""
    return producer_op(value, "ReduceMean") or producer_op(value, "GlobalAveragePool")


def squared_value(value: ir.Value | None) -> ir.Value | None:
    """v when ``value`` is ``v * v`` or ``Pow(v, 2)``."""
    node = None if value is None else value.producer()
    if node is None or len(node.inputs) != 2:
        return None
    if is_op(node, "Mul") and node.inputs[0] is node.inputs[1]:
        return node.inputs[0]
    if is_op(node, "Pow") and const_scalar(node.inputs[1]) == 2.0:
        return node.inputs[0]
    return None


def last_axis_problem(node: ir.Node, data: ir.Value | None, what: str) -> str | None:
    """Why ``node`` (a ReduceMean or GlobalAveragePool) is not a keepdims mean over exactly the
    last axis of ``data``."""
    rank = None if data is None or data.shape is None else len(data.shape)
    if node.op_type == "GlobalAveragePool":
        if rank != 3:
            return f"{what} GlobalAveragePool of a rank-{rank if rank is not None else '?'} tensor (a last-axis mean needs rank 3)"
        return None
    axes = reduce_axes(node)
    if axes is None:
        return f"{what} ReduceMean axes are not constant"
    if node.attributes.get_int("keepdims", 1) != 1:
        return f"{what} ReduceMean has keepdims=0"
    if axes == [-1] or (rank is not None and axes == [rank - 1]):
        return None
    return f"{what} ReduceMean axes {axes} are not the last axis (rank {rank if rank is not None else '?'})"


def per_channel_vector(
    value: ir.Value | None,
    data: ir.Value | ir.Shape | None,
    perm: tuple[int, ...] | None = None,
) -> np.ndarray | None:
    """A constant of shape [..., 1, H] (leading dims 1), flattened to [H], that broadcasts against
    ``data`` (a value or its shape) along its last axis without raising its rank (H may be 1 when
    the last dim is static). With ``perm`` the constant broadcasts against the tensor that
    ``Transpose(·, perm)`` turns into ``data``: it is transposed the same way first."""
    array = const_array(value)
    if array is None or array.ndim == 0:
        return None
    if perm is not None:
        if array.ndim > len(perm):
            return None
        array = array.reshape((1,) * (len(perm) - array.ndim) + array.shape).transpose(perm)
    if any(d != 1 for d in array.shape[:-1]):
        return None
    shape = data.shape if isinstance(data, ir.Value) else data
    rank = None if shape is None else len(shape)
    if array.ndim > (rank if rank is not None else 1):
        return None
    vector = array.reshape(-1)
    last = None if shape is None or rank == 0 else shape[-1]
    if isinstance(last, int) and vector.shape[0] != last:
        if vector.shape[0] != 1:
            return None
        vector = np.repeat(vector, last)
    elif vector.shape[0] == 1 and not isinstance(last, int):
        return None  # a broadcast scalar over an unknown hidden size
    return vector


def widening_cast(value: ir.Value, core: list[ir.Node]) -> ir.Node | None:
    """The Cast that widened ``value`` from float16 to float32 for ``core`` alone, if one did: the
    float32 island exporters put around a norm of a half-precision tensor."""
    cast = producer_op(value, "Cast")
    source = None if cast is None else cast.inputs[0]
    if cast is None or source is None or source.dtype != ir.DataType.FLOAT16:
        return None
    if value.dtype != ir.DataType.FLOAT or value.is_graph_output():
        return None
    return cast if all(use.node in core for use in value.uses()) else None


def _exclusive(value: ir.Value, allowed: list[ir.Node]) -> bool:
    return not value.is_graph_output() and all(use.node in allowed for use in value.uses())


def _variance(
    sqrt: ir.Node, centered: ir.Value | None
) -> tuple[ir.Node, ir.Node, ir.Node, float] | Mismatch:
    """``sqrt`` = Sqrt(mean(centered^2) + eps): the Add, the mean, the square and eps."""
    add_eps = producer_op(sqrt.inputs[0], "Add")
    if add_eps is None:
        return Mismatch("Sqrt input is not variance + epsilon")
    var_mean = eps = None
    for operand in add_eps.inputs[:2]:
        if mean_of(operand) is not None:
            var_mean = mean_of(operand)
            rank = None if operand is None or operand.shape is None else len(operand.shape)
            eps = const_scalar_within(other_input(add_eps, operand), rank)
    if var_mean is None:
        return Mismatch("Sqrt input is not ReduceMean(...) + epsilon")
    if eps is None:
        return Mismatch("epsilon is not a constant scalar")
    square = var_mean.inputs[0].producer() if var_mean.inputs[0] is not None else None
    if square is None or centered is None or squared_value(var_mean.inputs[0]) is not centered:
        return Mismatch("variance is not ReduceMean((x - mean)^2)")
    return add_eps, var_mean, square, eps


def _match_layer_norm(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """Rooted at the normalizing Div (or Mul by Reciprocal); extends forward over Mul gamma, Add beta."""
    reciprocal = None
    if is_op(node, "Div"):
        centered, std = node.inputs[0], node.inputs[1]
    else:
        reciprocal = operand_op(node, "Reciprocal")
        if reciprocal is None:
            return Mismatch("no operand is a Reciprocal", candidate=False)
        std = reciprocal.inputs[0]
        centered = other_input(node, reciprocal.outputs[0])
    sqrt = producer_op(std, "Sqrt")
    sub = producer_op(centered, "Sub")
    if sqrt is None or sub is None:
        return Mismatch("not (x - mean) / sqrt(...)", candidate=False)
    variance = _variance(sqrt, centered)
    if isinstance(variance, Mismatch):
        return variance
    add_eps, var_mean, square, eps = variance
    x, mean = sub.inputs[0], sub.inputs[1]
    mean_node = mean_of(mean)
    if mean_node is None or mean_node.inputs[0] is not x:
        return Mismatch("Sub does not subtract ReduceMean(x) from x")
    for reduce, what in ((mean_node, "mean"), (var_mean, "variance")):
        problem = last_axis_problem(reduce, x, what)
        if problem is not None:
            return Mismatch(problem)
    core = (
        [mean_node, sub, square, var_mean, add_eps, sqrt]
        + ([reciprocal] if reciprocal else [])
        + [node]
    )
    for inner in core[:-1]:
        if not _exclusive(inner.outputs[0], core):
            return Mismatch(f"intermediate {inner.op_type} result is used outside the pattern")
    if (
        x is None
        or x.dtype is None
        or x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE)
    ):
        return Mismatch("input is not float, float16 or double")
    nodes = list(core)
    gamma = beta = None
    tail = node.outputs[0]
    mul = single_consumer(tail)
    dtype = x.dtype.numpy()
    widening = widening_cast(x, core)
    if (
        widening is not None
        and widening.inputs[0] is not None
        and is_op(mul, "Cast")
        and mul is not None
        and mul.attributes.get_int("to", 0) == ir.DataType.FLOAT16.value
    ):
        # Cast(norm(Cast(x, float)), float16): one float16 op that computes in float32 inside.
        nodes = [widening, *nodes, mul]
        x, tail, dtype = widening.inputs[0], mul.outputs[0], np.dtype(np.float16)
        mul = single_consumer(tail)
    if is_op(mul, "Mul") and mul is not None:
        gamma = per_channel_vector(other_input(mul, tail), x)
        if gamma is not None:
            nodes.append(mul)
            tail = mul.outputs[0]
            after = _bias_after(tail, x, gamma)
            if after is not None:
                nodes.append(after[0])
                beta = after[1]
    return _norm_match(nodes, x, eps, gamma, beta, dtype, context)


def _norm_match(
    nodes: list[ir.Node],
    x: ir.Value,
    eps: float,
    gamma: np.ndarray | None,
    beta: np.ndarray | None,
    dtype: np.dtype,
    context: RewriteContext,
) -> Match | Mismatch:
    hidden = gamma.shape[0] if gamma is not None else None
    if hidden is None and x.shape is not None and isinstance(x.shape[-1], int):
        hidden = x.shape[-1]
    if hidden is None:
        return Mismatch("hidden size unknown (no constant gamma and the last dim is not static)")
    if context.options.target == "onnx" and context.opset() < LAYER_NORM_OPSET:
        return Mismatch(
            f"LayerNormalization needs opset {LAYER_NORM_OPSET}, the model imports {context.opset()}"
        )
    if gamma is None:
        gamma = np.ones(hidden, dtype=dtype)
    return Match(
        nodes,
        {
            "x": x,
            "eps": eps,
            "gamma": gamma.astype(dtype),
            "beta": None if beta is None else beta.astype(dtype),
        },
    )


def _inverse_std(value: ir.Value | None) -> tuple[list[ir.Node], ir.Node] | None:
    """``value`` = 1 / Sqrt(v): Reciprocal(Sqrt(v)) (tf2onnx's Rsqrt) or Div(1, Sqrt(v))."""
    node = producer_op(value, "Reciprocal") or producer_op(value, "Div")
    if node is None or (node.op_type == "Div" and const_scalar(node.inputs[0]) != 1.0):
        return None
    sqrt = producer_op(node.inputs[-1], "Sqrt")
    return None if sqrt is None else ([sqrt, node], sqrt)


def _scaled_inverse_std(
    m: ir.Value | None, x: ir.Value | ir.Shape | None, perm: tuple[int, ...] | None = None
) -> tuple[list[ir.Node], ir.Node, np.ndarray | None] | None:
    """``m`` = inv_std * gamma (gamma a constant per-channel vector of ``x``, transposed by
    ``perm`` first when given) or inv_std alone: the nodes, the Sqrt, gamma."""
    found = _inverse_std(m)
    if found is not None:
        return found[0], found[1], None
    mul = producer_op(m, "Mul")
    if mul is None:
        return None
    for operand in mul.inputs[:2]:
        found = _inverse_std(operand)
        gamma = per_channel_vector(other_input(mul, operand), x, perm) if found else None
        if found is not None and gamma is not None:
            return [*found[0], mul], found[1], gamma
    return None


def _shift(
    c: ir.Value | None, mean: ir.Value, m: ir.Value, x: ir.Value | ir.Shape | None
) -> tuple[list[ir.Node], np.ndarray | None] | None:
    """``c`` = beta - mean*m, -(mean*m) or (-mean)*m [+ beta]: the nodes, beta (None without)."""

    def product(value: ir.Value | None) -> list[ir.Node] | None:
        mul = producer_op(value, "Mul")
        if mul is None:
            return None
        operands = list(mul.inputs[:2])
        if operands in ([mean, m], [m, mean]):
            return [mul]
        neg = next((producer_op(v, "Neg") for v in operands if producer_op(v, "Neg")), None)
        if neg is not None and neg.inputs[0] is mean and m in operands:
            return [neg, mul]  # (-mean) * m
        return None

    def negated(value: ir.Value | None) -> list[ir.Node] | None:
        neg = producer_op(value, "Neg")
        inner = product(neg.inputs[0]) if neg is not None else None
        if neg is not None and inner is not None and inner[0].op_type == "Mul":
            return [*inner, neg]
        found = product(value)
        return found if found is not None and found[0].op_type == "Neg" else None

    sub = producer_op(c, "Sub")
    if sub is not None:
        beta = per_channel_vector(sub.inputs[0], x)
        inner = product(sub.inputs[1])
        if beta is not None and inner is not None and inner[0].op_type == "Mul":
            return [*inner, sub], beta
        return None
    found = negated(c)
    if found is not None:
        return found, None
    add = producer_op(c, "Add")
    if add is None:
        return None
    for operand in add.inputs[:2]:
        beta = per_channel_vector(other_input(add, operand), x)
        found = negated(operand)
        if beta is not None and found is not None:
            return [*found, add], beta
    return None


def _centered_under(sqrt: ir.Node) -> ir.Node | None:
    """The Sub whose square the variance under ``sqrt`` averages: Sqrt(mean(d * d) + eps)."""
    add_eps = producer_op(sqrt.inputs[0], "Add")
    operands = add_eps.inputs[:2] if add_eps is not None else ()
    var_mean = next((mean_of(v) for v in operands if mean_of(v) is not None), None)
    square = (
        producer_op(var_mean.inputs[0], "Mul") or producer_op(var_mean.inputs[0], "Pow")
        if var_mean
        else None
    )
    return producer_op(square.inputs[0], "Sub") if square is not None else None


def _affine_problem(
    nodes: list[ir.Node], x: ir.Value, gamma: np.ndarray | None, beta: np.ndarray | None
) -> Mismatch | None:
    """Why the batch_normalization form in ``nodes`` (root last) may not be fused."""
    for inner in nodes[:-1]:
        if not _exclusive(inner.outputs[0], nodes):
            return Mismatch(f"intermediate {inner.op_type} result is used outside the pattern")
    if x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE):
        return Mismatch("input is not float, float16 or double")
    if gamma is not None and beta is not None and gamma.shape != beta.shape:
        return Mismatch("gamma and beta differ in size")
    return None


def _match_affine_norm(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``x*m + (beta - mean*m)`` with ``m = gamma / sqrt(var + eps)``: TensorFlow's
    batch_normalization over the last axis, as Keras' LayerNormalization computes it (TF BERT,
    GPT-2, ViT... through tf2onnx; the means may be GlobalAveragePools of rank-3 tensors).
    ``(x - mean) * m + beta`` is the same value up to rounding (the fused op is the more accurate:
    it does not subtract two large products)."""
    for term in node.inputs[:2]:
        scale = producer_op(term, "Mul")
        if scale is None:
            continue
        for x, m in (tuple(scale.inputs[:2]), tuple(reversed(scale.inputs[:2]))):
            found = _scaled_inverse_std(m, x)
            if found is None or x is None or m is None:
                continue
            inverse, sqrt, gamma = found
            sub = _centered_under(sqrt)
            if sub is None or sub.inputs[0] is not x:
                continue
            mean = sub.inputs[1]
            mean_node = mean_of(mean)
            if mean is None or mean_node is None or mean_node.inputs[0] is not x:
                continue
            variance = _variance(sqrt, sub.outputs[0])
            if isinstance(variance, Mismatch):
                return variance
            add_eps, var_mean, square, eps = variance
            shift = _shift(other_input(node, term), mean, m, x)
            if shift is None:
                return Mismatch("the shift is not beta - mean * m")
            for reduce, what in ((mean_node, "mean"), (var_mean, "variance")):
                problem = last_axis_problem(reduce, x, what)
                if problem is not None:
                    return Mismatch(problem)
            nodes = [mean_node, sub, square, var_mean, add_eps, *inverse, scale, *shift[0], node]
            refused = _affine_problem(nodes, x, gamma, shift[1])
            if refused is not None:
                return refused
            assert x.dtype is not None
            return _norm_match(nodes, x, eps, gamma, shift[1], x.dtype.numpy(), context)
    return Mismatch("not x * (gamma / sqrt(var + eps)) + shift", candidate=False)


@dataclass(frozen=True)
class _TransposedTerm:
    """``x * m`` of a norm whose statistics are computed on ``r`` and transposed by ``perm``."""

    r: ir.Value
    m: ir.Value  # before the Transpose
    perm: tuple[int, ...]
    nodes: tuple[ir.Node, ...]  # the product, and the Transpose after it
    x: ir.Value | None  # Transpose(r, perm) where the graph has it


def _transposed_terms(term: ir.Value | None) -> list[_TransposedTerm]:
    """``term`` = ``Transpose(r, P) * Transpose(m, P)`` or ``Transpose(r * m, P)``, either
    operand as r."""
    found: list[_TransposedTerm] = []
    mul = producer_op(term, "Mul")
    if mul is not None:
        a, b = (producer_op(v, "Transpose") for v in mul.inputs[:2])
        perm = _perm(a)
        if a is not None and b is not None and perm is not None and _perm(b) == perm:
            for r, m in ((a, b), (b, a)):
                if r.inputs[0] is not None and m.inputs[0] is not None:
                    found.append(
                        _TransposedTerm(r.inputs[0], m.inputs[0], perm, (mul,), r.outputs[0])
                    )
    transpose = producer_op(term, "Transpose")
    inner = producer_op(transpose.inputs[0], "Mul") if transpose is not None else None
    perm = _perm(transpose)
    if transpose is not None and inner is not None and perm is not None:
        u, v = inner.inputs[0], inner.inputs[1]
        for data, scale in ((u, v), (v, u)):
            if data is not None and scale is not None:
                found.append(_TransposedTerm(data, scale, perm, (inner, transpose), None))
    return found


def _perm(transpose: ir.Node | None) -> tuple[int, ...] | None:
    perm = transpose.attributes.get_ints("perm", None) if transpose is not None else None
    return tuple(perm) if perm else None


def _transposed_view(value: ir.Value, source: ir.Value, perm: tuple[int, ...]) -> ir.Node | None:
    """The node that makes ``value`` = ``Transpose(source, perm)``: that Transpose, or a Reshape
    to the transposed shape that moves only axes of size 1 (the same elements in the same order:
    tf2onnx writes the transpose of a kept-dims mean so)."""
    node = value.producer()
    if node is None or node.inputs[0] is not source:
        return None
    if is_op(node, "Transpose"):
        return node if tuple(node.attributes.get_ints("perm", ())) == perm else None
    target = const_ints(node.inputs[1]) if is_op(node, "Reshape") and len(node.inputs) > 1 else None
    dims = dims_of(source)
    if target is None or dims is None or not len(target) == len(dims) == len(perm):
        return None
    kept = [axis for axis in perm if dims[axis] != 1]
    if kept != sorted(kept) or target.count(-1) > 1 or node.attributes.get_int("allowzero", False):
        return None
    for axis, entry in enumerate(target):
        if entry == 0 and perm[axis] == axis:
            continue  # copies the source's dim, which the Transpose keeps there
        want = dims[axis] if entry == 0 else entry
        if want != -1 and (want is None or want != dims[perm[axis]]):
            return None
    return node


def _match_transposed_norm(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """TensorFlow's batch_normalization over axis k of r, transposed to put k last:
    ``Transpose(r, P) * Transpose(m, P) + (beta - Transpose(mean, P) * Transpose(m, P))`` with
    ``m = gamma / sqrt(var + eps)`` and the statistics reduced over r's axis ``k = P[-1]`` (or
    ``Transpose(r * m, P)`` for the first term). tf2onnx writes Keras' LayerNormalization so where
    its transpose optimizer kept a residual stream as [B, D, T] (TF Whisper's encoder after its
    convolutions): the norm is ``LayerNormalization(Transpose(r, P))`` over the last axis."""
    for term in node.inputs[:2]:
        if term is None:
            continue
        for t in _transposed_terms(term):
            found = _transposed_match(node, term, t, context)
            if found is not None:
                return found
    return Mismatch(
        "not Transpose(x) * Transpose(gamma / sqrt(var + eps)) + shift", candidate=False
    )


def _transposed_match(
    node: ir.Node, term: ir.Value, t: _TransposedTerm, context: RewriteContext
) -> Match | Mismatch | None:
    """The norm ``node`` roots with ``t`` as its scaled term (None: ``t`` is not that term)."""
    r, rank, axis = t.r, len(t.perm), t.perm[-1]
    if r.shape is None or len(r.shape) != rank or sorted(t.perm) != list(range(rank)):
        return None
    x_shape = ir.Shape([r.shape[a] for a in t.perm])
    found = _scaled_inverse_std(t.m, x_shape, t.perm)
    sub = _centered_under(found[1]) if found is not None else None
    if found is None or sub is None or sub.inputs[0] is not r or sub.inputs[1] is None:
        return None
    inverse, sqrt, gamma = found
    mean = sub.inputs[1]
    mean_node = producer_op(mean, "ReduceMean")
    if mean_node is None or mean_node.inputs[0] is not r:
        return None
    variance = _variance(sqrt, sub.outputs[0])
    if isinstance(variance, Mismatch):
        return variance
    add_eps, var_mean, square, eps = variance
    for reduce in (mean_node, var_mean):
        axes = reduce_axes(reduce)
        if axes is None or [a % rank for a in axes] != [axis]:
            return Mismatch(
                f"the statistics are not over axis {axis}, which the Transpose puts last"
            )
        if reduce.attributes.get_int("keepdims", 1) != 1:
            return Mismatch("a ReduceMean of the statistics has keepdims=0")
    m_views = [u.node for u in t.m.uses() if _transposed_view(u.node.outputs[0], t.m, t.perm)]
    mean_views = [u.node for u in mean.uses() if _transposed_view(u.node.outputs[0], mean, t.perm)]
    for m_view in m_views:
        for mean_view in mean_views:
            shift = _shift(
                other_input(node, term), mean_view.outputs[0], m_view.outputs[0], x_shape
            )
            if shift is None:
                continue
            nodes = [
                mean_node, sub, square, var_mean, add_eps, *inverse, mean_view, m_view,
                *shift[0], *t.nodes, node,
            ]  # fmt: skip
            problem = _affine_problem(nodes, r, gamma, shift[1])
            if problem is not None:
                return problem
            assert r.dtype is not None
            beta = shift[1]
            hidden = r.shape[axis]
            if gamma is None and isinstance(hidden, int):
                gamma = np.ones(hidden, dtype=r.dtype.numpy())
            if gamma is None:
                return Mismatch(
                    "hidden size unknown (no constant gamma, the normalized dim is not static)"
                )
            match = _norm_match(nodes, r, eps, gamma, beta, r.dtype.numpy(), context)
            if isinstance(match, Match):
                match.bindings.update(x=t.x, transpose=(r, t.perm))
            return match
    return Mismatch("the shift is not beta - Transpose(mean) * Transpose(m)")


def _bias_after(
    tail: ir.Value, x: ir.Value, gamma: np.ndarray
) -> tuple[ir.Node, np.ndarray] | None:
    """The Add of a per-channel beta (gamma's shape) that alone reads ``tail``, and that beta."""
    add = single_consumer(tail)
    if not is_op(add, "Add") or add is None:
        return None
    beta = per_channel_vector(other_input(add, tail), x)
    return None if beta is None or beta.shape != gamma.shape else (add, beta)


def _rewrite_layer_norm(match: Match, context: RewriteContext) -> Replacement:
    b = match.bindings
    gamma = new_constant(b["gamma"], "layer_norm_scale")
    nodes = []
    x = b["x"]
    if x is None:  # the statistics' input transposed to put their axis last
        source, perm = b["transpose"]
        nodes.append(ir.node("Transpose", [source], {"perm": list(perm)}))
        x = nodes[0].outputs[0]
    inputs = [x, gamma]
    initializers = [gamma]
    if b["beta"] is not None:
        beta = new_constant(b["beta"], "layer_norm_bias")
        inputs.append(beta)
        initializers.append(beta)
    attributes = {"axis": -1, "epsilon": b["eps"]}
    if b.get("stash_type", 1) != 1:
        attributes["stash_type"] = b["stash_type"]
    new = ir.node("LayerNormalization", inputs, attributes)
    return Replacement(
        [*nodes, new], [(match.root.outputs[0], new.outputs[0])], constants=initializers
    )


def _match_scaled_norm(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """``LayerNormalization(x, 1) * gamma [+ beta]``: what the decomposed fusion leaves when one
    normalization feeds several scale/bias tails (two norms of one input share their core after
    common-subexpression elimination: GPT-NeoX's parallel residual, a backbone's final norm applied
    to a hidden state the next layer normalizes too). Each tail becomes its own
    ``LayerNormalization(x, gamma, beta)``; n * 1 * gamma is n * gamma exactly."""
    norm = operand_op(node, "LayerNormalization")
    if norm is None:
        return Mismatch("no operand is a LayerNormalization", candidate=False)
    normed = norm.outputs[0]
    x = norm.inputs[0]
    scale = const_array(norm.inputs[1] if len(norm.inputs) > 1 else None)
    bias = norm.inputs[2] if len(norm.inputs) > 2 else None
    if scale is None or not np.all(scale == 1):
        return Mismatch("the LayerNormalization already scales", candidate=False)
    if bias is not None:
        return Mismatch("the LayerNormalization already has a bias", candidate=False)
    rank = None if x is None or x.shape is None else len(x.shape)
    axis = norm.attributes.get_int("axis", -1)
    if axis != -1 and (rank is None or axis != rank - 1):
        return Mismatch(f"LayerNormalization axis {axis} is not the last axis")
    if any(out.uses() or out.is_graph_output() for out in norm.outputs[1:]):
        return Mismatch("LayerNormalization's mean / inv_std_dev outputs are used")
    if x is None or x.dtype is None or normed.dtype != x.dtype:
        return Mismatch("the normalized input's dtype is unknown")
    gamma = per_channel_vector(other_input(node, normed), x)
    if gamma is None or gamma.shape != scale.reshape(-1).shape:
        return Mismatch("the scale is not a constant per-channel vector of the hidden size")
    nodes = [norm, node]
    beta = None
    after = _bias_after(node.outputs[0], x, gamma)
    if after is not None:
        nodes.append(after[0])
        beta = after[1]
    dtype = x.dtype.numpy()
    return Match(
        nodes,
        {
            "x": x,
            "eps": norm.attributes.get_float("epsilon", 1e-5),
            "stash_type": norm.attributes.get_int("stash_type", 1),
            "gamma": gamma.astype(dtype),
            "beta": None if beta is None else beta.astype(dtype),
        },
    )


def _match_skip(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if context.options.target != "ort":
        return Mismatch(
            "SkipLayerNormalization is an ONNX Runtime op (target ort)", candidate=False
        )
    add = producer_op(node.inputs[0], "Add")
    if add is None:
        return Mismatch("input is not an Add", candidate=False)
    if any(out.uses() or out.is_graph_output() for out in node.outputs[1:]):
        return Mismatch("LayerNormalization's mean / inv_std_dev outputs are used")
    x = node.inputs[0]
    simplified = node.op_type == "SimplifiedLayerNormalization"
    if node.attributes.get_int("stash_type", 1) != 1:
        return Mismatch("LayerNormalization stash_type is not float32")
    gamma = const_array(node.inputs[1])
    beta = (
        const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
    )
    if gamma is None or gamma.ndim != 1:
        return Mismatch("scale is not a constant 1-D tensor")
    if len(node.inputs) > 2 and node.inputs[2] is not None and (beta is None or beta.ndim != 1):
        return Mismatch("bias is not a constant 1-D tensor")
    rank = None if x is None or x.shape is None else len(x.shape)
    axis = node.attributes.get_int("axis", -1)
    if axis != -1 and (rank is None or axis != rank - 1):
        return Mismatch(f"LayerNormalization axis {axis} is not the last axis")
    a, skip = add.inputs[0], add.inputs[1]
    if a is None or skip is None or const_array(a) is not None or const_array(skip) is not None:
        return Mismatch("one Add operand is a constant (a bias, not a skip connection)")
    if a.shape is None or skip.shape is None or len(a.shape) not in (2, 3) or a.shape != skip.shape:
        return Mismatch(
            f"Add operands' shapes {a.shape} and {skip.shape} are not the same known 2-D/3-D shape"
        )
    if a.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        return Mismatch("input is not float or float16")
    nodes = [add, node]
    bias = None
    for operand in (a, skip):
        inner = producer_op(operand, "Add")
        if inner is None or users(operand) != 1:
            continue
        for term in inner.inputs[:2]:
            vector = const_array(term)
            if (
                vector is not None
                and vector.ndim == 1
                and vector.shape == gamma.shape
                and term is not None
            ):
                bias = term
                rest = other_input(inner, term)
                a, skip = (rest, skip) if operand is a else (a, rest)
                nodes.insert(0, inner)
                break
        if bias is not None:
            break
    sum_used_elsewhere = users(add.outputs[0]) > 1
    return Match(
        nodes,
        {
            "inputs": [a, skip, node.inputs[1], bias]
            if simplified
            else [a, skip, node.inputs[1], node.inputs[2] if beta is not None else None, bias],
            "op": "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization",
            "eps": node.attributes.get_float("epsilon", 1e-5),
            "add": add,
            "keep_sum": sum_used_elsewhere,
        },
    )


def _rewrite_skip(match: Match, context: RewriteContext) -> Replacement:
    b = match.bindings
    inputs = list(b["inputs"])
    while inputs and inputs[-1] is None:
        inputs.pop()
    new = ir.node(
        b["op"],
        inputs,
        {"epsilon": b["eps"]},
        domain=MS_DOMAIN,
        num_outputs=4 if b["keep_sum"] else 1,
    )
    values = [(match.root.outputs[0], new.outputs[0])]
    if b["keep_sum"]:
        values.append((b["add"].outputs[0], new.outputs[3]))
    return Replacement([new], values)


def _moment_of(value: ir.Value | None) -> ir.Value | None:
    """v when ``value`` is a mean of v: ReduceMean(v), or ReduceSum(v) times or over a scalar
    constant (jax's ``mean``: the sum times 1/N)."""
    node = None if value is None else value.producer()
    if node is not None and is_op(node, "ReduceMean"):
        return node.inputs[0]
    if node is None or node.op_type not in ("Mul", "Div") or node.domain not in ("", "ai.onnx"):
        return None
    for index in (0, 1) if node.op_type == "Mul" else (0,):
        total = node.inputs[index]
        summed = None if total is None else total.producer()
        other = node.inputs[1 - index]
        if summed is not None and is_op(summed, "ReduceSum") and const_array(other) is not None:
            return summed.inputs[0]
    return None


def _match_moment_variance(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """Never a match: says why a norm whose variance is ``E[x²] − E[x]²`` (Flax's LayerNorm, jax
    through jax2tf) stays as it is. LayerNormalization computes ``E[(x − E[x])²]``; the two
    differ where that subtraction cancels, beyond tolerance once |E[x]| is large against the
    spread (ORT's CPU kernel against this formula in float32, rows of 256: 2e-5 apart at
    mean/std = 10, 2e-3 at 100), so fusing would change what the model computes."""
    if len(node.inputs) != 2:
        return Mismatch("not a binary Sub", candidate=False)
    squares = _moment_of(node.inputs[0])
    x = squared_value(squares)
    mean = squared_value(node.inputs[1])
    if x is None or mean is None or _moment_of(mean) is not x:
        return Mismatch("not E[x²] − E[x]²", candidate=False)
    return Mismatch(
        "the variance is E[x²] − E[x]² (Flax's LayerNorm): LayerNormalization computes "
        "E[(x − E[x])²], which differs beyond tolerance where the mean is large against the "
        "spread; left as it is"
    )


def _never(match: Match, context: RewriteContext) -> Replacement:
    raise AssertionError("the E[x²] − E[x]² rule only explains")


RULES = (
    Rule("decomposed->LayerNormalization", "Div", _match_layer_norm, _rewrite_layer_norm),
    Rule(
        "decomposed(reciprocal)->LayerNormalization", "Mul", _match_layer_norm, _rewrite_layer_norm
    ),
    Rule("x*m+(beta-mean*m)->LayerNormalization", "Add", _match_affine_norm, _rewrite_layer_norm),
    Rule(
        "transposed x*m+(beta-mean*m)->LayerNormalization",
        "Add",
        _match_transposed_norm,
        _rewrite_layer_norm,
    ),
    Rule(
        "LayerNormalization*gamma+beta->LayerNormalization",
        "Mul",
        _match_scaled_norm,
        _rewrite_layer_norm,
    ),
    Rule("E[x²]-E[x]² norm->LayerNormalization", "Sub", _match_moment_variance, _never),
)
SKIP_RULES = (
    Rule(
        "add+LayerNormalization->SkipLayerNormalization",
        "LayerNormalization",
        _match_skip,
        _rewrite_skip,
    ),
    Rule(
        "add+SimplifiedLayerNormalization->SkipSimplifiedLayerNormalization",
        "SimplifiedLayerNormalization",
        _match_skip,
        _rewrite_skip,
    ),
)


class FuseLayerNormPass(RulePass):
    """Decomposed layer norm (last axis) -> LayerNormalization (opset 17+; any opset for target ort)."""

    name = "fuse-layer-norm"
    summary = "fuse decomposed layer normalization into LayerNormalization"
    rules = RULES


class FuseSkipLayerNormPass(Pass):
    """``LayerNormalization(a + b [+ bias])`` -> com.microsoft SkipLayerNormalization and
    ``SimplifiedLayerNormalization(a + b)`` -> SkipSimplifiedLayerNormalization (target ort only).

    Not in the default levels: on ORT 1.32 CPU the SkipLayerNormalization kernel measured 3-5x
    slower than Add + LayerNormalization ([1, 128, 768]) and SkipSimplifiedLayerNormalization
    between 0.9x and 1.8x the time of Add + SimplifiedLayerNormalization
    (benchmarks/fusion_kernels.py). They may pay on GPU execution providers.
    """

    name = "fuse-skip-layer-norm"
    summary = "fuse residual Add + LayerNormalization into SkipLayerNormalization (ort; opt-in, slower on CPU)"

    def call(self, model: ir.Model) -> PassResult:
        if self.options.target != "ort":
            return PassResult(model, modified=False)
        stats, notes = apply_rules(model, SKIP_RULES, self.options)
        if stats:
            ensure_opset(model, MS_DOMAIN, 1)
        return PassResult(model, modified=bool(stats), stats=Counter(stats), notes=notes)
