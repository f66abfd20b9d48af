"""Merge summed products of one input by constant matrices into one MatMul (LoRA adapters, twin heads).

A model fine-tuned with low-rank adapters and exported without merging them computes every
adapted projection twice: ``x @ W + b + ((x @ A) @ B) * s`` (PEFT's LoRA in eval mode, dropout
gone). That is ``x @ W' + b`` with ``W' = W + s * (A @ B)``: one product of x where the export has
three, and the Mul and Add after them go. Classifier heads averaged over two linear layers of one
input (RepViT's, LeViT's and EfficientFormer's distillation heads,
``(head(x) + head_dist(x)) / 2``, each behind its own BatchNormalization) merge the same way.

Each summand is read down from the Add as a chain of linear ops, each with one computed operand:
MatMul by a constant 2-D matrix, Gemm (transA = 0, a constant B and C), a Mul or Div by a constant
and an Add or Sub of one (one number per feature of the last axis, or one in all) and a 2-D
inference-mode BatchNormalization; the chain ends at the first value that is read elsewhere or
made by anything else, its input. The two summands merge when they have the same input, each
holds at least one product (a summand that is only a scaling of x would put a diagonal into the
product), and the merged product costs no more multiply-adds per row than the two chains did
(two low-rank chains summed, ``x @ A1 @ B1 + x @ A2 @ B2``, are cheaper than one dense product
and stay). A Sub negates its second summand.

It runs before the attention fusions, which then see an adapted Q, K or V projection as the plain
MatMul + bias they look for; what comes after the sum (a Whisper query's scaling, the heads'
``/ 2``) stays for the passes that fold it (fuse-conv-bn folds a per-column scale or shift after a
projection into its weights).

Arithmetic runs in float64 and the merged weight and bias are rounded once to the weights' dtype;
a result that is not finite is refused. The output differs from the unmerged graph by the rounding
of the merged weights (the branches' own rounding is gone): reassociation, as in any fusion.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxopt.ops import is_constant, is_op
from onnxopt.passes._attention_shapes import (
    flattens_rows,
    restores_rows,
    target_entries,
    value_rank,
)
from onnxopt.passes.base import RulePass
from onnxopt.passes.fuse_conv_bn import bn_affine, narrowed, per_channel, weight_to_fold
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import new_constant, only_user, rank_of

_ELEMENTWISE = ("Add", "Sub", "Mul", "Div")
# BatchNormalization's scale, bias, mean and variance.
_BN_CONSTANTS = slice(1, 5)


@dataclass(frozen=True)
class _Chain:
    """One summand: ``nodes`` from the summand down, each reading the next one's output; ``source``
    is what the last one reads."""

    nodes: tuple[ir.Node, ...]
    source: ir.Value


@dataclass(frozen=True)
class _Linear:
    """A summand as ``source @ weight + bias`` (float64), and the multiply-adds per row its own
    products take."""

    weight: np.ndarray
    bias: np.ndarray | None
    cost: int
    dtype: np.dtype
    largest: ir.Node  # the product with the largest matrix (the merged weight takes its name)


def _computed_operand(node: ir.Node) -> ir.Value | None:
    """The one computed input of a linear op with constant parameters, else None."""
    inputs = list(node.inputs)
    if is_op(node, "MatMul") and len(inputs) == 2:
        return inputs[0] if not is_constant(inputs[0]) and is_constant(inputs[1]) else None
    if is_op(node, "Gemm") and len(inputs) >= 2:
        if node.attributes.get_int("transA", 0) != 0 or not is_constant(inputs[1]):
            return None
        if len(inputs) > 2 and inputs[2] is not None and not is_constant(inputs[2]):
            return None
        return inputs[0] if not is_constant(inputs[0]) else None
    if is_op(node, "BatchNormalization") and len(inputs) == 5:
        if not all(is_constant(v) for v in inputs[_BN_CONSTANTS]) or rank_of(inputs[0]) != 2:
            return None
        return inputs[0]
    if any(is_op(node, op) for op in _ELEMENTWISE) and len(inputs) == 2:
        a, b = inputs
        if not is_constant(a) and is_constant(b):
            return a
        if is_constant(a) and not is_constant(b) and node.op_type in ("Add", "Mul"):
            return b
    return None


def _viewed_gemm(reshape: ir.Node) -> tuple[ir.Node, ir.Node, ir.Value] | None:
    """``Reshape(Gemm(Reshape(x, [-1, K])), [*x.shape[:-1], N])``, a linear layer written as
    addmm between views (GPT-2's Conv1D through TorchScript): the Gemm, the flattening Reshape
    and x. The views only group x's rows; the Gemm is a product of x row for row."""
    gemm = reshape.inputs[0].producer() if reshape.inputs[0] is not None else None
    if gemm is None or not is_op(gemm, "Gemm") or _computed_operand(gemm) is None:
        return None
    flatten = gemm.inputs[0].producer() if gemm.inputs[0] is not None else None
    if flatten is None or not is_op(flatten, "Reshape") or flatten.inputs[0] is None:
        return None
    source = flatten.inputs[0]
    rank = value_rank(source)
    weight = gemm.inputs[1]
    if (
        rank is None
        or rank < 3
        or weight is None
        or weight.shape is None
        or weight.shape.rank() != 2
    ):
        return None
    width = weight.shape[0 if gemm.attributes.get_int("transB", 0) else 1]
    if not isinstance(width, int):
        return None
    if not all(only_user(v) for v in (gemm.outputs[0], flatten.outputs[0])):
        return None
    if not flattens_rows(flatten, source, rank):
        return None
    if not restores_rows(target_entries(reshape.inputs[1]), source, rank, width):
        return None
    return gemm, flatten, source


def _chain(summand: ir.Value | None) -> _Chain | None:
    """The linear ops computing ``summand``, down to the first value read elsewhere."""
    nodes: list[ir.Node] = []
    value = summand
    while value is not None and only_user(value):
        node = value.producer()
        viewed = _viewed_gemm(node) if is_op(node, "Reshape") and node is not None else None
        if viewed is not None:
            assert node is not None
            nodes.extend((node, viewed[0], viewed[1]))
            value = viewed[2]
            continue
        operand = None if node is None else _computed_operand(node)
        if node is None or operand is None:
            break
        nodes.append(node)
        value = operand
    if not nodes or value is None:
        return None
    return _Chain(tuple(nodes), value)


def _products(chain: _Chain) -> list[ir.Node]:
    return [n for n in chain.nodes if is_op(n, "MatMul") or is_op(n, "Gemm")]


def _matrix(node: ir.Node, context: RewriteContext) -> tuple[np.ndarray, np.dtype] | Mismatch:
    """The product's matrix as ``x @ M`` in float64 (Gemm's alpha and transB applied) and the
    weight's own dtype."""
    weight = weight_to_fold(node, 1, context.options.fold_may_grow)
    if isinstance(weight, Mismatch):
        return weight
    if weight.ndim != 2:
        return Mismatch(f"a {node.op_type} weight has rank {weight.ndim}, not 2")
    matrix = weight.astype(np.float64)  # a copy: the merge sums into it in place
    if is_op(node, "Gemm"):
        if node.attributes.get_int("transB", 0):
            matrix = matrix.T
        alpha = node.attributes.get_float("alpha", 1.0)
        if alpha != 1.0:
            matrix *= alpha
    return matrix, weight.dtype


def _gemm_bias(node: ir.Node, width: int) -> np.ndarray | Mismatch | None:
    """Gemm's ``beta * C`` as one number per output column (None without a C)."""
    if len(node.inputs) < 3 or node.inputs[2] is None:
        return None
    found = per_channel(node.inputs[2], 2, width, 1)
    if isinstance(found, Mismatch):
        return Mismatch(f"a Gemm's C: {found.reason}")
    return found * node.attributes.get_float("beta", 1.0)


def _elementwise(
    node: ir.Node, operand: ir.Value, width: int
) -> tuple[np.ndarray, np.ndarray] | Mismatch:
    """The op as ``operand * scale + shift``, one number per feature of the last axis."""
    if is_op(node, "BatchNormalization"):
        affine = bn_affine(node)
        if isinstance(affine, Mismatch):
            return affine
        if affine[0].shape != (width,):
            return Mismatch("a BatchNormalization has another feature count than its product")
        return affine
    rank = rank_of(operand)
    if rank is None or rank == 0:
        return Mismatch("a summand's rank is unknown")
    constant = node.inputs[1] if node.inputs[0] is operand else node.inputs[0]
    c = per_channel(constant, rank, width, rank - 1)
    if isinstance(c, Mismatch):
        return Mismatch(f"a {node.op_type} by a constant: {c.reason}")
    ones, zeros = np.ones(width), np.zeros(width)
    if node.op_type == "Mul":
        return c, zeros
    if node.op_type == "Div":
        if not np.all(c != 0):
            return Mismatch("a Div by a constant holding 0")
        return 1.0 / c, zeros
    return ones, (c if node.op_type == "Add" else -c)


def _linear(chain: _Chain, context: RewriteContext) -> _Linear | Mismatch:
    """``chain`` composed into one product, read from its input up."""
    products: dict[int, tuple[np.ndarray, np.dtype]] = {}
    for index, node in enumerate(chain.nodes):
        if is_op(node, "MatMul") or is_op(node, "Gemm"):
            found = _matrix(node, context)
            if isinstance(found, Mismatch):
                return found
            products[index] = found
    if len({dtype for _, dtype in products.values()}) != 1:
        return Mismatch("a summand's weights differ in dtype")
    lowest = max(products)
    width = int(products[lowest][0].shape[0])
    # Below the first product: an affine of the input (its scale folds into the matrix's rows,
    # its shift into a bias).
    scale, shift = np.ones(width), np.zeros(width)
    weight: np.ndarray | None = None
    bias: np.ndarray | None = None
    operand = chain.source
    for index in range(len(chain.nodes) - 1, -1, -1):
        node = chain.nodes[index]
        if is_op(node, "Reshape"):  # a view around a Gemm (_viewed_gemm): rows regrouped
            pass
        elif index in products:
            matrix = products[index][0]
            if int(matrix.shape[0]) != width:
                return Mismatch("a product's rows differ from its input's features")
            if weight is None:
                weight = matrix if np.all(scale == 1) else scale[:, None] * matrix
                bias = shift @ matrix if shift.any() else None
            else:
                weight = weight @ matrix
                bias = None if bias is None else bias @ matrix
            width = int(matrix.shape[1])
            if is_op(node, "Gemm"):
                extra = _gemm_bias(node, width)
                if isinstance(extra, Mismatch):
                    return extra
                if extra is not None:
                    bias = extra if bias is None else bias + extra
        else:
            affine = _elementwise(node, operand, width)
            if isinstance(affine, Mismatch):
                return affine
            s, t = affine
            if weight is None:
                scale, shift = scale * s, shift * s + t
            else:
                if not np.all(s == 1):
                    weight = weight * s[None, :]
                if bias is not None or t.any():
                    bias = t if bias is None else bias * s + t
        operand = node.outputs[0]
    assert weight is not None
    cost = sum(int(matrix.size) for matrix, _ in products.values())
    largest = max(products, key=lambda i: (products[i][0].size, i))
    dtype = products[lowest][1]
    return _Linear(weight, bias, cost, dtype, chain.nodes[largest])


def _match(add: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if len(add.inputs) != 2 or add.inputs[0] is add.inputs[1]:
        return Mismatch(f"not a binary {add.op_type} of two values", candidate=False)
    chains = [_chain(value) for value in add.inputs]
    if any(c is None or not _products(c) for c in chains):
        return Mismatch("a summand is not a product by a constant matrix", candidate=False)
    first, second = (c for c in chains if c is not None)
    if first.source is not second.source:
        return Mismatch("the summands are products of different inputs", candidate=False)
    rank = rank_of(first.source)
    if rank is None or rank == 0:
        return Mismatch("the shared input's rank is unknown")
    linears = []
    for chain in (first, second):
        found = _linear(chain, context)
        if isinstance(found, Mismatch):
            return found
        linears.append(found)
    one, two = linears
    if one.weight.shape != two.weight.shape:
        return Mismatch(
            f"the summands' products differ in shape ({list(one.weight.shape)} and "
            f"{list(two.weight.shape)})"
        )
    if one.dtype != two.dtype:
        return Mismatch("the summands' weights differ in dtype")
    merged_cost = int(one.weight.shape[0]) * int(one.weight.shape[1])
    if merged_cost > one.cost + two.cost:
        return Mismatch(
            f"one product would cost {merged_cost} multiply-adds per row, the summands "
            f"{one.cost + two.cost}"
        )
    sign = -1.0 if is_op(add, "Sub") else 1.0
    weight = one.weight  # a float64 array of its own (astype copies): summed in place
    if sign > 0:
        weight += two.weight
    else:
        weight -= two.weight
    biases = [b for b in (one.bias, None if two.bias is None else sign * two.bias) if b is not None]
    # A bias of zeros (transformers' initialisation) is no bias: x + 0 is x.
    bias = np.sum(biases, axis=0) if biases and np.any(biases) else None
    if not np.isfinite(weight).all() or (bias is not None and not np.isfinite(bias).all()):
        return Mismatch("the merged weights are not finite")
    narrow = narrowed((weight, np.zeros(1) if bias is None else bias), one.dtype)
    if isinstance(narrow, Mismatch):
        return narrow
    nodes = [*reversed(first.nodes), *reversed(second.nodes), add]
    return Match(
        nodes,
        {
            "x": first.source,
            "weight": narrow[0],
            "bias": None if bias is None else narrow[1],
            "base": max((one, two), key=lambda line: line.cost).largest,
        },
    )


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    add, base = match.root, match.bindings["base"]
    weight = new_constant(match.bindings["weight"], base.inputs[1].name if base.inputs[1] else None)
    product = ir.node("MatMul", [match.bindings["x"], weight], name=base.name)
    nodes, constants = [product], [weight]
    if match.bindings["bias"] is not None:
        bias = new_constant(match.bindings["bias"], f"{base.name or 'MatMul'}_bias")
        nodes.append(ir.node("Add", [product.outputs[0], bias]))
        constants.append(bias)
    for node in nodes:  # the product already has the sum's shape: a later merge reads its rank
        out = node.outputs[0]
        out.type = add.outputs[0].type
        out.shape = None if add.outputs[0].shape is None else ir.Shape(add.outputs[0].shape)
    return Replacement(nodes, [(add.outputs[0], out)], constants=constants)


RULES = (
    Rule("matmul+matmul->matmul", "Add", _match, _rewrite),
    Rule("matmul+matmul->matmul", "Sub", _match, _rewrite),
)


class FuseParallelMatMulsPass(RulePass):
    """Summed products of one input by constant matrices (LoRA, twin heads) -> one MatMul."""

    name = "fuse-parallel-matmuls"
    summary = (
        "merge summed products of one input by constant matrices (unmerged LoRA adapters, "
        "averaged twin heads) into one MatMul"
    )
    rules = RULES
