"""Fuse the exporters' GELU decompositions, then a preceding bias Add.

erf form:  ``0.5 * x * (1 + erf(x / sqrt(2)))``
tanh form: ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))``

Both targets use ONNX Gelu (opset 20+, ``approximate="tanh"`` for the tanh form); target ``ort``
falls back to com.microsoft Gelu / FastGelu for older opsets. The fuse-bias-gelu pass (target ort)
folds ``Gelu(x + bias)`` into BiasGelu(x, bias), or FastGelu(x, bias) for the tanh form.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, const_array, is_op, single_consumer
from onnxopt.passes.base import PassResult, RulePass
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import (
    const_scalar,
    const_scalar_within,
    ensure_opset,
    other_input,
    producer_op,
    users,
)
from onnxopt.rewrite.rule import MatchFn, RewriteFn

GELU_OPSET = 20
_RTOL = 1e-3


def _close(value: float | None, expected: float) -> bool:
    return value is not None and math.isclose(value, expected, rel_tol=_RTOL)


def _scaled_by(value: ir.Value | None, factor: float) -> tuple[ir.Node, ir.Value] | None:
    """(node, x) when ``value = x * factor`` (Mul, either order) or ``x / (1/factor)`` (Div)."""
    node = None if value is None else value.producer()
    if is_op(node, "Mul") and node is not None:
        for operand in node.inputs[:2]:
            if _close(const_scalar(operand), factor):
                rest = other_input(node, operand)
                if rest is not None:
                    return node, rest
    if (
        is_op(node, "Div")
        and node is not None
        and _close(const_scalar(node.inputs[1]), 1.0 / factor)
    ):
        x = node.inputs[0]
        if x is not None:
            return node, x
    return None


def _erf_argument(activation: ir.Node) -> tuple[list[ir.Node], ir.Value] | Mismatch:
    found = _scaled_by(activation.inputs[0], 1.0 / math.sqrt(2.0))
    if found is None:
        return Mismatch("Erf input is not x / sqrt(2)", candidate=False)
    return [found[0]], found[1]


def _monomial(
    value: ir.Value | None, x: ir.Value, depth: int = 4
) -> tuple[list[ir.Node], int, float] | None:
    """(nodes, power, coefficient) when ``value = coefficient * x^power``, a tree of Mul (and Div
    by a scalar constant) over x, ``Pow(x, 2 | 3)`` and scalar constants, in whatever order the
    exporter multiplied them (``0.044715 * x^3``, ``x * (x * (0.044715 * x))`` as jax writes it)."""
    if value is x:
        return [], 1, 1.0
    node = None if value is None or depth == 0 else value.producer()
    if node is None:
        return None
    exponent = const_scalar(node.inputs[1]) if len(node.inputs) == 2 else None
    if is_op(node, "Pow") and node.inputs[0] is x and exponent in (2.0, 3.0):
        return [node], int(exponent or 0), 1.0
    if is_op(node, "Div") and exponent:
        inner = _monomial(node.inputs[0], x, depth - 1)
        return None if inner is None else ([*inner[0], node], inner[1], inner[2] / exponent)
    if not is_op(node, "Mul") or len(node.inputs) != 2:
        return None
    nodes: list[ir.Node] = []
    power, coefficient = 0, 1.0
    for operand in node.inputs:
        factor = const_scalar(operand)
        if factor is not None and operand is not x:
            coefficient *= factor
            continue
        inner = _monomial(operand, x, depth - 1)
        if inner is None:
            return None
        nodes += inner[0]
        power += inner[1]
        coefficient *= inner[2]
    return [*nodes, node], power, coefficient


def _tanh_argument(activation: ir.Node) -> tuple[list[ir.Node], ir.Value] | Mismatch:
    outer = _scaled_by(activation.inputs[0], math.sqrt(2.0 / math.pi))
    if outer is None:
        return Mismatch("Tanh input is not sqrt(2/pi) * (...)", candidate=False)
    inner_add = producer_op(outer[1], "Add")
    if inner_add is None:
        return Mismatch("Tanh argument is not sqrt(2/pi) * (x + 0.044715 * x^3)")
    for operand in inner_add.inputs[:2]:
        x = other_input(inner_add, operand) if operand is not None else None
        cubic = None if x is None else _monomial(operand, x)
        if x is not None and cubic is not None and cubic[1] == 3 and _close(cubic[2], 0.044715):
            return [*cubic[0], inner_add, outer[0]], x
    return Mismatch("Tanh argument is not sqrt(2/pi) * (x + 0.044715 * x^3)")


def _match_gelu(tanh_form: bool) -> MatchFn:
    def match(activation: ir.Node, context: RewriteContext) -> Match | Mismatch:
        argument = _tanh_argument(activation) if tanh_form else _erf_argument(activation)
        if isinstance(argument, Mismatch):
            return argument
        front, x = argument
        one_plus = single_consumer(activation.outputs[0])
        if not is_op(one_plus, "Add") or one_plus is None:
            return Mismatch(f"{activation.op_type} result is not only used by + 1")
        erf = activation.outputs[0]
        rank = len(erf.shape) if erf.shape is not None else None
        if not _close(const_scalar_within(other_input(one_plus, erf), rank), 1.0):
            return Mismatch(f"{activation.op_type} result is not increased by 1")
        p = one_plus.outputs[0]
        product = single_consumer(p)
        if not is_op(product, "Mul") or product is None:
            return Mismatch("1 + erf/tanh is used by more than one Mul (or is a graph output)")
        other = other_input(product, p)
        nodes = [*front, activation, one_plus, product]
        if _close(const_scalar(other), 0.5):  # x * (p * 0.5)
            outer = single_consumer(product.outputs[0])
            if (
                not is_op(outer, "Mul")
                or outer is None
                or other_input(outer, product.outputs[0]) is not x
            ):
                return Mismatch("0.5 * (1 + ...) is not multiplied by x")
            nodes.append(outer)
        elif other is x:  # (x * p) * 0.5
            half = single_consumer(product.outputs[0])
            if (
                not is_op(half, "Mul")
                or half is None
                or not _close(const_scalar(other_input(half, product.outputs[0])), 0.5)
            ):
                return Mismatch("x * (1 + ...) is not multiplied by 0.5")
            nodes.append(half)
        else:  # (x * 0.5) * p
            halved = _scaled_by(other, 0.5)
            if halved is None or halved[1] is not x or users(halved[0].outputs[0]) != 1:
                return Mismatch("1 + erf/tanh is not multiplied by 0.5 * x")
            nodes.insert(0, halved[0])
        for node in nodes[:-1]:
            if (
                any(use.node not in nodes for use in node.outputs[0].uses())
                or node.outputs[0].is_graph_output()
            ):
                return Mismatch(
                    f"intermediate {node.op_type} result is used outside the GELU pattern"
                )
        if context.options.target == "onnx" and context.opset() < GELU_OPSET:
            return Mismatch(f"Gelu needs opset {GELU_OPSET}, the model imports {context.opset()}")
        if context.options.target == "ort" and x.dtype not in (
            ir.DataType.FLOAT,
            ir.DataType.FLOAT16,
        ):
            return Mismatch("com.microsoft Gelu runs on float and float16 only")
        return Match(nodes, {"x": x})

    return match


def _rewrite_gelu(tanh_form: bool) -> RewriteFn:
    def rewrite(match: Match, context: RewriteContext) -> Replacement:
        x = match.bindings["x"]
        if context.options.target == "ort" and context.opset() < GELU_OPSET:
            new = ir.node("FastGelu" if tanh_form else "Gelu", [x], domain=MS_DOMAIN)
            ensure_opset(context.model, MS_DOMAIN, 1)
        else:
            new = ir.node("Gelu", [x], {"approximate": "tanh"} if tanh_form else {})
        return Replacement([new], [(match.root.outputs[0], new.outputs[0])])

    return rewrite


def _match_bias(gelu: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if len(gelu.inputs) > 1:
        return Mismatch("already has a bias", candidate=False)
    add = producer_op(gelu.inputs[0], "Add")
    if add is None:
        return Mismatch("input is not an Add", candidate=False)
    for operand in add.inputs[:2]:
        vector = const_array(operand)
        x = other_input(add, operand) if operand is not None else None
        if vector is None or x is None or const_array(x) is not None:
            continue
        if vector.ndim != 1:
            return Mismatch(f"bias has shape {list(vector.shape)}, not 1-D")
        if x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
            return Mismatch(f"BiasGelu/FastGelu run on float and float16, not {x.dtype}")
        last = None if x.shape is None or len(x.shape) == 0 else x.shape[-1]
        if last != vector.shape[0]:
            return Mismatch(f"bias length {vector.shape[0]} is not the input's last dim ({last})")
        if users(add.outputs[0]) != 1:
            return Mismatch("the biased value is used elsewhere")
        return Match([add, gelu], {"x": x, "bias": operand})
    return Mismatch("Add has no constant operand", candidate=False)


def _rewrite_bias(match: Match, context: RewriteContext) -> Replacement:
    gelu = match.root
    tanh = gelu.op_type == "FastGelu" or gelu.attributes.get_string("approximate", "none") == "tanh"
    op = "FastGelu" if tanh else "BiasGelu"
    new = ir.node(op, [match.bindings["x"], match.bindings["bias"]], domain=MS_DOMAIN)
    return Replacement([new], [(gelu.outputs[0], new.outputs[0])])


RULES = (
    Rule("gelu(erf)->Gelu", "Erf", _match_gelu(False), _rewrite_gelu(False)),
    Rule("gelu(tanh)->Gelu", "Tanh", _match_gelu(True), _rewrite_gelu(True)),
)
BIAS_RULES = (
    Rule("add+Gelu->BiasGelu", "Gelu", _match_bias, _rewrite_bias, domain=MS_DOMAIN),
    Rule("add+FastGelu->FastGelu(bias)", "FastGelu", _match_bias, _rewrite_bias, domain=MS_DOMAIN),
    Rule("add+Gelu(onnx)->BiasGelu/FastGelu", "Gelu", _match_bias, _rewrite_bias),
)


class FuseGeluPass(RulePass):
    """GELU (erf or tanh form) -> ONNX Gelu (opset 20+), else com.microsoft Gelu/FastGelu for target ort.

    ONNX Runtime's ONNX Gelu kernel measured 4-17% faster than com.microsoft Gelu (ORT 1.32 CPU,
    [1, 128, 3072]), so the contrib op is only used where the model's opset has no Gelu.
    """

    name = "fuse-gelu"
    summary = (
        "fuse erf/tanh GELU decompositions into Gelu (ort, opset < 20: com.microsoft Gelu/FastGelu)"
    )
    rules = RULES


class FuseBiasGeluPass(RulePass):
    """``Gelu(x + b)`` with a constant 1-D ``b`` along x's last axis -> com.microsoft BiasGelu(x, b),
    or FastGelu(x, b) for the tanh form (target ort; ``--target onnx`` leaves the model unchanged).

    One node per pair fewer, and speed-neutral at ORT_ENABLE_ALL, where ORT fuses Add + Gelu into
    the same BiasGelu when it loads the model (ORT 1.32 CPU, benchmarks/fusion_kernels.py,
    [1, 128, 3072], 2 threads: 0.97-1.01x). At ORT_DISABLE_ALL BiasGelu measured 1.04-1.12x the
    time of Add + ONNX Gelu; ``--disable fuse-bias-gelu`` keeps the Add.
    """

    name = "fuse-bias-gelu"
    summary = "fold a constant bias Add into Gelu: com.microsoft BiasGelu/FastGelu (ort)"

    rules = BIAS_RULES

    def call(self, model: ir.Model) -> PassResult:
        if self.options.target != "ort":
            return PassResult(model, modified=False)
        result = super().call(model)
        if result.modified:
            ensure_opset(model, MS_DOMAIN, 1)
        return result
