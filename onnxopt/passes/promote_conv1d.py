"""Target ort: run a wide or long-kernel 1-D Conv as a 2-D Conv of height 1.

``Conv1d(x)[n, m, l] = Conv2d(x[:, :, None, :])[n, m, 0, l]`` with the weight ``W[:, :, None, :]``,
kernel ``[1, k]``, strides ``[1, s]``, dilations ``[1, d]`` and pads ``[0, b, 0, e]``: the same sums
over the same products (outputs agree to float rounding, ~3e-7 relative). ONNX Runtime's CPU
provider runs the two through different kernels, and at ORT_ENABLE_ALL only 2-D convolutions get
its blocked NCHWc layout. Measured on ORT 1.32 CPU, 2 threads, AVX-512 (one Conv, 1-D vs 2-D;
``benchmarks/conv1d_micro.py``, two runs): 512 -> 512 channels, kernel 3, stride 2, 1.38-1.51x;
256 -> 256 channels, kernels 3 and 5, 1.03-1.22x; grouped or depthwise kernels of 31 and 128
taps (Conformer, wav2vec2's positional convolution) 1.2-2.5x. At 128 channels the runs disagreed
(0.71-1.31x), and below that, with grouped short kernels or on a 1-channel waveform the 2-D form
was mostly slower (0.35-0.95x). So only a Conv with at least 256 input and output channels, in
one group with a kernel of 2 taps or more or in any groups with a kernel of 16 taps or more, is
promoted (a 1-channel STFT-like Conv with a long kernel stays 1-D); float32 only.

The Unsqueeze before and the Squeeze after each promoted Conv are what keeps its neighbours 1-D.
A Squeeze is moved past the element-wise op that reads it (``Gelu(Squeeze(y)) =
Squeeze(Gelu(y))``), so that a chain Conv -> Gelu -> Conv (wav2vec2's and HuBERT's feature
encoder) stays 2-D inside and eliminate-noops drops each Squeeze -> Unsqueeze pair between, and
so that fuse-conv-activation still sees Conv -> Relu.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, const_array, is_op
from onnxopt.passes._shape_facts import axes_param
from onnxopt.passes.base import RulePass
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import new_constant, only_user, squeeze_op

# Below these the 2-D kernels measured slower (see the module docstring).
MIN_CHANNELS = 256
MIN_KERNEL = 2
LONG_KERNEL = 16
# Element-wise ops with one tensor input, which give the same result at any rank.
_UNARY = frozenset(
    {
        "Abs",
        "Cast",
        "Celu",
        "Clip",
        "Elu",
        "Erf",
        "Exp",
        "Gelu",
        "HardSigmoid",
        "HardSwish",
        "Identity",
        "LeakyRelu",
        "Log",
        "Mish",
        "Neg",
        "Reciprocal",
        "Relu",
        "Selu",
        "Sigmoid",
        "Softplus",
        "Softsign",
        "Sqrt",
        "Tanh",
    }
)
_UNARY_MS = frozenset({"Gelu", "QuickGelu"})


def _unsqueezed(shape: ir.Shape | None) -> ir.Shape | None:
    """[N, C, L] -> [N, C, 1, L]."""
    if shape is None or len(shape) != 3:
        return None
    return ir.Shape([shape[0], shape[1], 1, shape[2]])


def _match_conv(conv: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if context.options.target != "ort":
        return Mismatch("the 2-D form pays on ONNX Runtime's CPU kernels (target ort)", False)
    weight = const_array(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if weight is None or weight.ndim != 3:
        return Mismatch("not a 1-D Conv with a constant weight", candidate=False)
    if weight.dtype != np.float32:
        return Mismatch(f"the weight is {weight.dtype}; the 2-D form was measured in float32")
    group = conv.attributes.get_int("group", 1)
    channels_out, per_group, taps = (int(d) for d in weight.shape)
    channels_in = per_group * group
    wide = min(channels_in, channels_out) >= MIN_CHANNELS
    if not (wide and (taps >= LONG_KERNEL or (group == 1 and taps >= MIN_KERNEL))):
        return Mismatch(
            f"{channels_in} -> {channels_out} channels in {group} group(s), kernel {taps}: "
            f"ORT's 2-D kernels measured slower unless >= {MIN_CHANNELS} channels each way, "
            f"in one group with a kernel >= {MIN_KERNEL} or with a kernel >= {LONG_KERNEL}"
        )
    return Match([conv], {"weight": weight})


def _rewrite_conv(match: Match, context: RewriteContext) -> Replacement:
    (conv,) = match.nodes
    x = conv.inputs[0]
    assert x is not None
    weight = match.bindings["weight"]
    weight_4d = new_constant(weight[:, :, None, :], conv.inputs[1].name if conv.inputs[1] else None)
    unsqueeze, unsqueeze_axes = squeeze_op("Unsqueeze", x, [2], context.opset())
    unsqueeze.outputs[0].shape = _unsqueezed(x.shape)
    unsqueeze.outputs[0].type = x.type
    attributes: list[ir.Attr] = []
    for name, attr in conv.attributes.items():
        if name == "pads":
            begin, end = attr.as_ints()
            attributes.append(ir.AttrInt64s(name, [0, begin, 0, end]))
        elif name in ("kernel_shape", "strides", "dilations"):
            attributes.append(ir.AttrInt64s(name, [1, *attr.as_ints()]))
        else:
            attributes.append(attr)
    new_conv = ir.Node(
        "", "Conv", [unsqueeze.outputs[0], weight_4d, *conv.inputs[2:]], attributes, name=conv.name
    )
    new_conv.outputs[0].shape = _unsqueezed(conv.outputs[0].shape)
    new_conv.outputs[0].type = conv.outputs[0].type
    squeeze, squeeze_axes = squeeze_op("Squeeze", new_conv.outputs[0], [2], context.opset())
    return Replacement(
        [unsqueeze, new_conv, squeeze],
        [(conv.outputs[0], squeeze.outputs[0])],
        constants=[weight_4d, *unsqueeze_axes, *squeeze_axes],
    )


def _promoted_squeeze(value: ir.Value | None) -> ir.Node | None:
    """The Squeeze of axis 2 after a Conv (or FusedConv) whose weight has height 1."""
    squeeze = None if value is None else value.producer()
    if not is_op(squeeze, "Squeeze") or squeeze is None or squeeze.inputs[0] is None:
        return None
    if axes_param(squeeze, 4) != (2,):
        return None
    conv = squeeze.inputs[0].producer()
    if conv is None or not (is_op(conv, "Conv") or is_op(conv, "FusedConv", MS_DOMAIN)):
        return None
    weight = conv.inputs[1].shape if len(conv.inputs) > 1 and conv.inputs[1] else None
    if weight is None or len(weight) != 4 or weight[2] != 1:
        return None
    return squeeze


def _match_sink(op: ir.Node, context: RewriteContext) -> Match | Mismatch:
    unary = _UNARY_MS if op.domain == MS_DOMAIN else _UNARY
    extra = [v for v in op.inputs[1:] if v is not None]
    if op.op_type not in unary or (extra and op.op_type != "Clip"):
        return Mismatch("not a one-input element-wise op", candidate=False)
    for bound in extra:  # Clip's min and max: scalars, whatever the rank
        array = const_array(bound)
        if array is None or array.size != 1:
            return Mismatch("Clip bounds are not constant scalars", candidate=False)
    squeeze = _promoted_squeeze(op.inputs[0])
    if squeeze is None:
        return Mismatch("input is not the Squeeze after a promoted 1-D Conv", candidate=False)
    if not only_user(squeeze.outputs[0]):
        return Mismatch("the squeezed Conv output has other users")
    return Match([squeeze, op])


def _rewrite_sink(match: Match, context: RewriteContext) -> Replacement:
    squeeze, op = match.nodes
    wide = squeeze.inputs[0]
    assert wide is not None
    moved = ir.Node(
        op.domain, op.op_type, [wide, *op.inputs[1:]], op.attributes.values(), name=op.name
    )
    moved.outputs[0].type = op.outputs[0].type
    moved.outputs[0].shape = _unsqueezed(op.outputs[0].shape)
    new_squeeze, axes = squeeze_op("Squeeze", moved.outputs[0], [2], context.opset())
    return Replacement(
        [moved, new_squeeze], [(op.outputs[0], new_squeeze.outputs[0])], constants=axes
    )


def _sink_rules() -> tuple[Rule, ...]:
    rules = [Rule(f"squeeze-past-{op}", op, _match_sink, _rewrite_sink) for op in sorted(_UNARY)]
    rules += [
        Rule(f"squeeze-past-{op}", op, _match_sink, _rewrite_sink, domain=MS_DOMAIN)
        for op in sorted(_UNARY_MS)
    ]
    return tuple(rules)


RULES = (Rule("conv1d->conv2d", "Conv", _match_conv, _rewrite_conv), *_sink_rules())


class PromoteConv1dPass(RulePass):
    """1-D Conv -> Unsqueeze, 2-D Conv of height 1, Squeeze, where ORT's CPU kernels run the 2-D
    form faster (>= 256 channels each way; one group, or a kernel >= 16 taps); the Squeeze then moves past
    the element-wise ops after it, so chains of convolutions stay 2-D inside."""

    name = "promote-conv1d"
    summary = (
        "target ort: run wide or long-kernel 1-D Convs as 2-D Convs of height 1 "
        "(ORT's NCHWc kernels; wav2vec2 1.08x)"
    )
    rules = RULES
