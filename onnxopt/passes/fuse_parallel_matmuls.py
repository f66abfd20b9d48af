"""Merge summed products of one input by constant matrices into one MatMul (LoRA adapters, twin heads).

A model fine-tuned with low-rank adapters and exported without merging them computes every
adapted projection twice: ``x @ W + b + ((x @ A) @ B) * s`` (PEFT's LoRA in eval mode, dropout
gone). That is ``x @ W' + b`` with ``W' = W + s * (A @ B)``: one product of x where the export has
three, and the Mul and Add after them go. Classifier heads averaged over two linear layers of one
input (RepViT's, LeViT's and EfficientFormer's distillation heads,
``(head(x) + head_dist(x)) / 2``, each behind its own BatchNormalization) merge the same way.

From an Add or Sub of two computed values, the pass reads down through linear ops with constant
parameters: MatMul by a constant 2-D matrix, Gemm (transA = 0, a constant B and C; also GPT-2's
Conv1D as TorchScript writes it, a Gemm between a ``[-1, K]`` view and a view back), a Mul or Div
by a constant and an Add or Sub of one (one number per feature of the last axis, or one in all),
a 2-D inference-mode BatchNormalization, and Adds and Subs of two such values. The region is what
nothing outside it reads (a value it computes may be read twice inside it: PEFT's DoRA adds
``(m - 1) * (x @ W)`` to the base output ``x @ W``); it must read exactly one input x. Composed
in execution order, every value is ``x @ W + b``, and the sum is one MatMul when every summand
holds a product (a summand that is only a scaling of x would put a diagonal into the product)
and the merged product costs no more multiply-adds per row than the region's products did (two
low-rank chains summed, ``x @ A1 @ B1 + x @ A2 @ B2``, are cheaper than one dense product and
stay).

It runs before the attention fusions, which then see an adapted Q, K or V projection as the plain
MatMul + bias they look for; what comes after the sum (a Whisper query's scaling, the heads'
``/ 2``) stays for the passes that fold it (fuse-conv-bn folds a per-column scale or shift after a
projection into its weights).

Arithmetic runs in float64 and the merged weight and bias are rounded once to the weights' dtype;
a result that is not finite is refused. The output differs from the unmerged graph by the rounding
of the merged weights (the branches' own rounding is gone): reassociation, as in any fusion.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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


_MAX_REGION = 256  # nodes: a linear region is a few ops per projection, never a whole network


@dataclass(frozen=True)
class _Map:
    """A value as a linear function of the region's input x: ``x @ weight + bias`` once a product
    was met (``weight`` [K, N] in float64), before that ``x * scale + shift`` (``weight`` None;
    x itself without a scale and shift)."""

    weight: np.ndarray | None
    bias: np.ndarray | None
    scale: np.ndarray | None = None
    shift: np.ndarray | None = None


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


def _is_sum(node: ir.Node) -> bool:
    """An Add or Sub of two computed values (a sum inside the region)."""
    return (
        (is_op(node, "Add") or is_op(node, "Sub"))
        and len(node.inputs) == 2
        and all(v is not None and not is_constant(v) for v in node.inputs)
    )


def _is_linear(node: ir.Node) -> bool:
    return _is_sum(node) or _computed_operand(node) is not None or is_op(node, "Reshape")


def _operands(node: ir.Node) -> list[ir.Value]:
    """What a region node reads that the region computes (or its input)."""
    if _is_sum(node):
        return [v for v in node.inputs if v is not None]
    operand = _computed_operand(node)
    return [] if operand is None else [operand]


def _collect(root: ir.Node, excluded: set[int]) -> tuple[dict[int, ir.Node], list[ir.Value]]:
    """The linear ops ``root`` reads through (not ``excluded``), and the values where it stops."""
    members: dict[int, ir.Node] = {id(root): root}
    leaves: list[ir.Value] = []
    stack = list(_operands(root))
    while stack and len(members) <= _MAX_REGION:
        value = stack.pop()
        node = value.producer()
        # A value a non-linear op or the graph also reads can only be an input of the region.
        readers = [use.node for use in value.uses()]
        if (
            node is None
            or id(node) in excluded
            or value.is_graph_output()
            or not all(_is_linear(r) for r in readers)
        ):
            leaves.append(value)
            continue
        if id(node) in members:
            continue
        viewed = _viewed_gemm(node) if is_op(node, "Reshape") else None
        if viewed is not None:
            gemm, flatten, source = viewed
            members.update({id(node): node, id(gemm): gemm, id(flatten): flatten})
            stack.append(source)
        elif _is_linear(node) and not is_op(node, "Reshape"):
            members[id(node)] = node
            stack.extend(_operands(node))
        else:
            leaves.append(value)
    return members, leaves


def _region(root: ir.Node) -> tuple[list[ir.Node], ir.Value] | Mismatch:
    """The linear ops computing ``root``'s output whose values nothing else reads, in execution
    order, and their one input; a Mismatch when they read more than one."""
    excluded: set[int] = set()
    while True:
        members, leaves = _collect(root, excluded)
        if len(members) > _MAX_REGION:
            return Mismatch(f"more than {_MAX_REGION} linear ops feed the sum", candidate=False)
        escaping = {
            key
            for key, node in members.items()
            if node is not root
            and (
                node.outputs[0].is_graph_output()
                or any(id(use.node) not in members for use in node.outputs[0].uses())
            )
        }
        if not escaping:
            break
        excluded |= escaping
    sources: list[ir.Value] = []
    for leaf in leaves:
        if not any(leaf is seen for seen in sources):
            sources.append(leaf)
    if len(sources) != 1:
        return Mismatch("the summands are products of different inputs", candidate=False)
    return _ordered(root, members), sources[0]


def _ordered(root: ir.Node, members: dict[int, ir.Node]) -> list[ir.Node]:
    """``members`` in an order where each comes after the members it reads (post-order)."""
    order: list[ir.Node] = []
    done: set[int] = set()
    stack: list[tuple[ir.Node, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in done:
            continue
        if expanded:
            done.add(id(node))
            order.append(node)
            continue
        stack.append((node, True))
        for value in node.inputs:
            producer = None if value is None else value.producer()
            if producer is not None and id(producer) in members and id(producer) not in done:
                stack.append((producer, False))
    return order


def _matrix(node: ir.Node, context: RewriteContext) -> tuple[np.ndarray, np.dtype] | Mismatch:
    """The product's matrix as ``x @ M`` in float64 (Gemm's alpha and transB applied) and the
    weight's own dtype."""
    weight = weight_to_fold(node, 1, context.options.fold_may_grow)
    if isinstance(weight, Mismatch):
        return weight
    if weight.ndim != 2:
        return Mismatch(f"a {node.op_type} weight has rank {weight.ndim}, not 2")
    matrix = weight.astype(np.float64)  # a copy of its own: alpha scales it in place
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


def _product(node: ir.Node, before: _Map, matrix: np.ndarray) -> _Map | Mismatch:
    """``before`` multiplied by ``matrix`` (and a Gemm's bias added)."""
    if before.weight is None and before.scale is None:  # x itself
        weight, bias = matrix, None
    elif before.weight is None:
        assert before.scale is not None and before.shift is not None
        if before.scale.shape[0] != matrix.shape[0]:
            return Mismatch("a product's rows differ from its input's features")
        weight = matrix if np.all(before.scale == 1) else before.scale[:, None] * matrix
        bias = before.shift @ matrix if before.shift.any() else None
    else:
        if before.weight.shape[1] != matrix.shape[0]:
            return Mismatch("a product's rows differ from its input's features")
        weight = before.weight @ matrix
        bias = None if before.bias is None else before.bias @ matrix
    if is_op(node, "Gemm"):
        extra = _gemm_bias(node, int(matrix.shape[1]))
        if isinstance(extra, Mismatch):
            return extra
        if extra is not None:
            bias = extra if bias is None else bias + extra
    return _Map(weight, bias)


def _affine(before: _Map, s: np.ndarray, t: np.ndarray) -> _Map:
    """``before * s + t``, s and t one number per feature."""
    if before.weight is None:
        scale = np.ones_like(s) if before.scale is None else before.scale
        shift = np.zeros_like(t) if before.shift is None else before.shift
        return replace(before, scale=scale * s, shift=shift * s + t)
    weight = before.weight if np.all(s == 1) else before.weight * s[None, :]
    bias = before.bias
    if bias is not None or t.any():
        bias = t if bias is None else bias * s + t
    return _Map(weight, bias)


def _sum(node: ir.Node, one: _Map, two: _Map) -> _Map | Mismatch:
    """``one + two`` (``one - two`` for a Sub), both products of x."""
    if one.weight is None or two.weight is None:
        return Mismatch("a summand is the input itself or a scaling of it, not a product")
    if one.weight.shape != two.weight.shape:
        return Mismatch(
            f"the summands' products differ in shape ({list(one.weight.shape)} and "
            f"{list(two.weight.shape)})"
        )
    combine = np.subtract if is_op(node, "Sub") else np.add
    weight = combine(one.weight, two.weight)
    if one.bias is None and two.bias is None:
        return _Map(weight, None)
    zeros = np.zeros(weight.shape[1])
    bias = combine(zeros if one.bias is None else one.bias, zeros if two.bias is None else two.bias)
    return _Map(weight, bias)


def _evaluate(
    nodes: list[ir.Node], x: ir.Value, context: RewriteContext
) -> tuple[_Map, int, np.dtype, ir.Node] | Mismatch:
    """The root's output (``nodes[-1]``) as a map of x, the multiply-adds per row the region's
    products take, their weights' dtype and the product with the largest matrix."""
    width = None if x.shape is None or len(x.shape) == 0 else x.shape[-1]
    maps: dict[int, _Map] = {id(x): _Map(None, None)}  # x itself: no scale or shift yet
    cost, dtypes, largest = 0, set(), (0, nodes[-1])
    for node in nodes:
        # A Reshape is one of the two views around a Gemm (_viewed_gemm): rows regrouped.
        operands = [node.inputs[0]] if is_op(node, "Reshape") else _operands(node)
        before = [maps.get(id(v)) for v in operands if v is not None]
        if not before or len(before) != len(operands) or None in before:
            return Mismatch("the region reads a value it does not compute")
        current = before[0]
        assert current is not None and operands[0] is not None
        result: _Map | Mismatch
        if is_op(node, "Reshape"):
            result = current
        elif _is_sum(node):
            assert before[1] is not None
            result = _sum(node, current, before[1])
        elif is_op(node, "MatMul") or is_op(node, "Gemm"):
            matrix = _matrix(node, context)
            if isinstance(matrix, Mismatch):
                return matrix
            cost += int(matrix[0].size)
            dtypes.add(matrix[1])
            largest = max(largest, (int(matrix[0].size), node), key=lambda item: item[0])
            result = _product(node, current, matrix[0])
        else:
            features = width if current.weight is None else int(current.weight.shape[1])
            if not isinstance(features, int):
                return Mismatch(
                    "the input's last dim, which an op before the products scales, is unknown"
                )
            affine = _elementwise(node, operands[0], features)
            result = affine if isinstance(affine, Mismatch) else _affine(current, *affine)
        if isinstance(result, Mismatch):
            return result
        maps[id(node.outputs[0])] = result
    if len(dtypes) != 1:
        return Mismatch("the products' weights differ in dtype")
    return maps[id(nodes[-1].outputs[0])], cost, dtypes.pop(), largest[1]


def _match(add: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if not _is_sum(add):
        return Mismatch(f"not a {add.op_type} of two computed values", candidate=False)
    region = _region(add)
    if isinstance(region, Mismatch):
        return region
    nodes, x = region
    if sum(1 for n in nodes if is_op(n, "MatMul") or is_op(n, "Gemm")) < 2:
        return Mismatch("fewer than two products by a constant matrix", candidate=False)
    if rank_of(x) == 0:
        return Mismatch("the shared input is a scalar")
    found = _evaluate(nodes, x, context)
    if isinstance(found, Mismatch):
        return found
    merged, cost, dtype, largest = found
    if merged.weight is None:
        return Mismatch("the sum is no product of its input", candidate=False)
    merged_cost = int(merged.weight.size)
    if merged_cost > cost:
        return Mismatch(
            f"one product would cost {merged_cost} multiply-adds per row, the summands {cost}"
        )
    weight, bias = merged.weight, merged.bias
    if bias is not None and not bias.any():
        bias = None  # a bias of zeros (transformers' initialisation) is no bias: x + 0 is x
    if not np.isfinite(weight).all() or (bias is not None and not np.isfinite(bias).all()):
        return Mismatch("the merged weights are not finite")
    narrow = narrowed((weight, np.zeros(1) if bias is None else bias), dtype)
    if isinstance(narrow, Mismatch):
        return narrow
    return Match(
        nodes,
        {"x": x, "weight": narrow[0], "bias": None if bias is None else narrow[1], "base": largest},
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
