"""Fuse Conv + activation into com.microsoft FusedConv (target ort only).

ONNX Runtime's CPU FusedConv (float32) applies Relu, Tanh, Sigmoid, LeakyRelu, Clip or HardSigmoid
to the convolution's output inside the MLAS kernel, saving one pass over the activations.

Its CUDA kernel maps the activation to cuDNN's and takes Relu alone: a FusedConv with any other
activation fails when a CUDA session is made ("unsupported conv activation mode"). For a model
that must also run on CUDA (``--ort-providers``, ort_versions.py) only Conv + Relu is fused, and a
FusedConv already in the model with another activation (an output for the CPU, or a file ORT's
CPU optimizer saved) is put back as Conv and the activation (``fusedconv->conv+activation``).
Likewise ORT's FusedGemm, which only the CPU provider has (ORT's optimizer writes it; this pass
does not): Gemm and the activation, its ``activation_*`` attributes the activation's own
(``fusedgemm->gemm+activation``).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, const_array, is_op
from onnxopt.ort_versions import CUDA_FUSED_CONV_ACTIVATIONS
from onnxopt.passes.base import PassResult, RulePass
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import ensure_opset, users

_FLOAT_MAX = float(np.finfo(np.float32).max)


def clip_bounds(node: ir.Node) -> list[float] | Mismatch:
    """A Clip's [min, max] (attributes below opset 11, constant inputs from 11; a missing bound is
    float32's lowest or largest)."""
    if "min" in node.attributes or "max" in node.attributes:  # opset < 11
        return [
            node.attributes.get_float("min", -_FLOAT_MAX),
            node.attributes.get_float("max", _FLOAT_MAX),
        ]
    bounds = []
    for index, default in ((1, -_FLOAT_MAX), (2, _FLOAT_MAX)):
        value = node.inputs[index] if len(node.inputs) > index else None
        if value is None:
            bounds.append(default)
            continue
        array = const_array(value)
        if array is None or array.size != 1:
            return Mismatch("Clip bounds are not constant scalars")
        bounds.append(float(array.reshape(())))
    return bounds


def _activation_params(node: ir.Node) -> list[float] | Mismatch | None:
    op = node.op_type
    if op in ("Relu", "Tanh", "Sigmoid"):
        return None
    if op == "LeakyRelu":
        return [node.attributes.get_float("alpha", 0.01)]
    if op == "HardSigmoid":
        return [node.attributes.get_float("alpha", 0.2), node.attributes.get_float("beta", 0.5)]
    return clip_bounds(node)


def _match(activation: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if context.options.target != "ort":
        return Mismatch("FusedConv is an ONNX Runtime op (target ort)", candidate=False)
    value = activation.inputs[0]
    conv = None if value is None else value.producer()
    if not is_op(conv, "Conv") or conv is None or value is None:
        return Mismatch("input is not a Conv", candidate=False)
    if users(value) != 1:
        return Mismatch(f"Conv output has {users(value)} consumers")
    if value.dtype != ir.DataType.FLOAT:
        return Mismatch(
            "FusedConv has float32 kernels only (ORT's CUDA one too); this Conv is "
            f"{value.dtype.name if value.dtype is not None else 'of unknown type'}"
        )
    if (
        "cuda" in context.options.ort_providers
        and activation.op_type not in CUDA_FUSED_CONV_ACTIVATIONS
    ):
        return Mismatch(
            f"CUDA's FusedConv takes Relu only (a session with {activation.op_type} fails to "
            "load); the model is also for cuda (--ort-providers)"
        )
    params = _activation_params(activation)
    if isinstance(params, Mismatch):
        return params
    return Match([conv, activation], {"conv": conv, "params": params})


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    conv, activation = match.nodes
    attributes: dict[str, ir.Attr] = {a.name: a for a in conv.attributes.values()}
    attributes["activation"] = ir.AttrString("activation", activation.op_type)
    if match.bindings["params"] is not None:
        attributes["activation_params"] = ir.AttrFloat32s(
            "activation_params", match.bindings["params"]
        )
    new = ir.Node(MS_DOMAIN, "FusedConv", list(conv.inputs), attributes.values(), name=conv.name)
    ensure_opset(context.model, MS_DOMAIN, 1)
    return Replacement([new], [(activation.outputs[0], new.outputs[0])])


def _unsupported(activation: ir.Node, context: RewriteContext) -> Match | Mismatch:
    conv = None if activation.inputs[0] is None else activation.inputs[0].producer()
    if context.options.target == "ort" and is_op(conv, "Conv"):
        return Mismatch(f"ORT's FusedConv has no {activation.op_type} activation")
    return Mismatch("not after a Conv", candidate=False)


# FusedConv's activations and the attributes its activation_params are, in order ("": none,
# which the CPU kernel takes and CUDA's refuses; Clip's bounds are inputs from opset 11).
_CONV_ACTIVATIONS: dict[str, tuple[str, ...]] = {
    "": (),
    "Relu": (),
    "Tanh": (),
    "Sigmoid": (),
    "LeakyRelu": ("alpha",),
    "HardSigmoid": ("alpha", "beta"),
    "Clip": ("min", "max"),
}


def _match_unfuse(fused: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """A FusedConv already in the model whose activation CUDA's kernel refuses, in a model that
    must also run on CUDA."""
    if "cuda" not in context.options.ort_providers:
        return Mismatch("the model is not for cuda (--ort-providers)", candidate=False)
    activation = fused.attributes.get_string("activation", "")
    if activation in CUDA_FUSED_CONV_ACTIVATIONS:
        return Mismatch("CUDA's FusedConv takes this activation", candidate=False)
    params = list(fused.attributes.get_floats("activation_params", []))
    if activation not in _CONV_ACTIVATIONS or len(params) < len(_CONV_ACTIVATIONS[activation]):
        return Mismatch(
            f"FusedConv with activation {activation or '(none)'}: CUDA refuses it, and it has no "
            "standard form here"
        )
    return Match([fused], {"activation": activation, "params": params})


def _rewrite_unfuse(match: Match, context: RewriteContext) -> Replacement:
    """Conv (+ Add of FusedConv's Z) + the activation: what FusedConv computes, in standard ops."""
    fused = match.root
    activation: str = match.bindings["activation"]
    params: list[float] = match.bindings["params"]
    tape = ir.tape.Tape()
    conv_attrs = {
        k: a.value
        for k, a in fused.attributes.items()
        if k not in ("activation", "activation_params")
    }
    inputs = list(fused.inputs)
    result = tape.op("Conv", inputs[:3], conv_attrs)
    if len(inputs) > 3 and inputs[3] is not None:  # Z, added before the activation
        result = tape.op("Add", [result, inputs[3]])
    attrs = dict(zip(_CONV_ACTIVATIONS[activation], params, strict=False))
    extra: list[ir.Value] = []
    if activation == "Clip" and context.opset() >= 11:  # the bounds are inputs
        extra = [
            tape.op("Constant", [], {"value": ir.tensor(np.array(attrs.pop(name), np.float32))})
            for name in ("min", "max")
        ]
    out = tape.op(activation, [result, *extra], attrs) if activation else result
    return Replacement(tape.nodes, [(fused.outputs[0], out)])


# FusedGemm's activations that are standard ONNX ops, and the attributes each takes (FusedGemm's
# ``activation_<name>``; ORT's CPU kernel hands them to the activation under ``<name>``).
_GEMM_ACTIVATIONS: dict[str, tuple[str, ...]] = {
    "Relu": (),
    "Sigmoid": (),
    "Tanh": (),
    "Softsign": (),
    "Softplus": (),
    "LeakyRelu": ("alpha",),
    "Elu": ("alpha",),
    "ThresholdedRelu": ("alpha",),
    "HardSigmoid": ("alpha", "beta"),
    "Selu": ("alpha", "gamma"),
}
_GEMM_ATTRIBUTES = ("alpha", "beta", "transA", "transB")


def _match_unfuse_gemm(fused: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """A FusedGemm (CPU only) in a model that must also run on CUDA."""
    if "cuda" not in context.options.ort_providers:
        return Mismatch("the model is not for cuda (--ort-providers)", candidate=False)
    activation = fused.attributes.get_string("activation", "")
    known = set(_GEMM_ATTRIBUTES) | {"activation"}
    known |= {f"activation_{name}" for name in _GEMM_ACTIVATIONS.get(activation, ())}
    if activation not in _GEMM_ACTIVATIONS or set(fused.attributes) - known:
        return Mismatch(
            f"FusedGemm with activation {activation or '(none)'} and attributes "
            f"{', '.join(sorted(fused.attributes))}: CUDA lacks it, and it has no standard form here"
        )
    return Match([fused], {"activation": activation})


def _rewrite_unfuse_gemm(match: Match, context: RewriteContext) -> Replacement:
    """Gemm + the activation: what ORT's CPU FusedGemm computes, in standard ops."""
    fused = match.root
    activation: str = match.bindings["activation"]
    tape = ir.tape.Tape()
    gemm_attrs = {k: a.value for k, a in fused.attributes.items() if k in _GEMM_ATTRIBUTES}
    gemm = tape.op("Gemm", list(fused.inputs), gemm_attrs)
    attrs = {
        name: fused.attributes[f"activation_{name}"].value
        for name in _GEMM_ACTIVATIONS[activation]
        if f"activation_{name}" in fused.attributes
    }
    out = tape.op(activation, [gemm], attrs)
    return Replacement(tape.nodes, [(fused.outputs[0], out)])


RULES = (
    *(
        Rule(f"conv+{op.lower()}->FusedConv", op, _match, _rewrite)
        for op in ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid")
    ),
    Rule("conv+hardswish->FusedConv", "HardSwish", _unsupported, _rewrite),
    Rule("fusedconv->conv+activation", "FusedConv", _match_unfuse, _rewrite_unfuse, MS_DOMAIN),
    Rule(
        "fusedgemm->gemm+activation",
        "FusedGemm",
        _match_unfuse_gemm,
        _rewrite_unfuse_gemm,
        MS_DOMAIN,
    ),
)


class FuseConvActivationPass(RulePass):
    """Conv + Relu/Tanh/Sigmoid/LeakyRelu/Clip/HardSigmoid -> com.microsoft FusedConv (target ort, float32)."""

    name = "fuse-conv-activation"
    summary = "fuse Conv + activation into com.microsoft FusedConv (ort)"
    rules = RULES

    def call(self, model: ir.Model) -> PassResult:
        if self.options.target != "ort":
            return PassResult(model, modified=False)
        return super().call(model)
