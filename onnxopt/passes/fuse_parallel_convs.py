"""Merge Convs that read one input and are summed into one Conv (RepVGG / ACNet re-parameterization).

``Conv(x, W1, b1) + Conv(x, W2, b2)`` is ``Conv(x, W, b1 + b2)`` when both slide with the same
strides, dilations and groups: W is W1 + W2 after each is zero-padded into the common window, at
the offset its own padding puts it (a 3x1 or a 1x3 kernel lies on the middle column or row of the
3x3). An identity branch, x itself or an inference-mode BatchNormalization of x (``x * s + t``),
is a 1x1 kernel holding ``s`` on its own channel, so it joins a stride-1 Conv with as many output
as input channels. A branch under per-channel Muls (a layer scale) and BatchNormalizations has
them folded into its kernel and bias first, and a Sub negates its second branch (FastViT's
RepMixer, ``x + s * (mixer(x) - norm(x))``). The pass runs before fuse-conv-bn, which then folds
a BatchNormalization after the sum (RepViT's ``bn(conv(x) + conv1(x) + x)``) into the one Conv.
Models trained with such branches and exported without re-parameterizing (TextNet / FAST,
RepVGG, MobileOne, GhostNetV3, FastViT, ACNet, the RepVGG blocks of RT-DETR's encoder) run one
Conv instead of two to four per block, and the Adds between them go.

Conditions, each a stated mismatch: the same strides and groups, the same dilation on every axis
where more than one tap is dilated (a 1-wide kernel has none), and no ``auto_pad``;
for every spatial axis the branches' window starts differ by whole dilation steps, and the room
left after each window (its end padding less the window's end) is the same, so every branch has
the same output size for every input size; the merged window is one branch's own window, so the
merged Conv reads no input position that no branch read (a zero weight times an infinity would
be NaN). Each merged weight is a sum of two terms (one Add merges two branches), taken in
float32 for a float32 model (IEEE addition rounds the exact sum once; a float64 detour would cost
the time and memory of a wide copy of every weight and round no better), a scaled branch's
product taken in float64 and rounded with the sum, and in float64 then rounded once for other
dtypes; a sum that overflows the dtype is refused. The result differs from
the unmerged graph by the rounding of the one sum of the branch outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxopt.ops import const_array, is_op
from onnxopt.passes.base import RulePass
from onnxopt.passes.fuse_conv_bn import bn_affine, narrowed, per_channel, weight_to_fold
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule
from onnxopt.rewrite.patterns import new_constant, only_user, other_input, rank_of


@dataclass(frozen=True)
class _Branch:
    """One summand as a Conv of x: its weight [M, C/group, *k] (the Conv's own array, or float64
    once scaled), its bias in float64, where its window starts and the room after it on each
    spatial axis (``tail``: end pad - window end)."""

    weight: np.ndarray | None  # None: the identity branch, its kernel built once the shape is known
    bias: np.ndarray | None
    scale: np.ndarray | None  # the identity branch's per-channel scale (BatchNormalization, Mul)
    start: tuple[int, ...]
    tail: tuple[int, ...]
    nodes: tuple[ir.Node, ...]  # what computes it: the Conv or BN of x, then its Muls and BNs
    dtype: np.dtype | None
    cost: int = 0  # multiply-adds per output position its own Convs take


@dataclass(frozen=True)
class _Geometry:
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    group: int


def _geometry(conv: ir.Node, spatial: int) -> _Geometry | Mismatch:
    if conv.attributes.get_string("auto_pad", "NOTSET") != "NOTSET":
        return Mismatch("a Conv uses auto_pad")
    strides = tuple(conv.attributes.get_ints("strides", (1,) * spatial))
    dilations = tuple(conv.attributes.get_ints("dilations", (1,) * spatial))
    pads = conv.attributes.get_ints("pads", (0,) * (2 * spatial))
    if len(strides) != spatial or len(dilations) != spatial or len(pads) != 2 * spatial:
        return Mismatch("a Conv's strides, dilations or pads do not match its kernel's rank")
    return _Geometry(strides, dilations, conv.attributes.get_int("group", 1))


def _conv_branch(conv: ir.Node, context: RewriteContext) -> tuple[_Branch, _Geometry] | Mismatch:
    weight = weight_to_fold(conv, 1, context.options.fold_may_grow)
    if isinstance(weight, Mismatch):
        return weight
    if weight.ndim < 3:
        return Mismatch(f"a Conv weight has rank {weight.ndim}")
    spatial = weight.ndim - 2
    geometry = _geometry(conv, spatial)
    if isinstance(geometry, Mismatch):
        return geometry
    kernel = tuple(int(k) for k in weight.shape[2:])
    declared = conv.attributes.get_ints("kernel_shape", kernel)
    if tuple(declared) != kernel:
        return Mismatch("a Conv's kernel_shape differs from its weight's shape")
    # A 1-wide axis has no dilation to agree on: 0 stands for "any".
    dilations = tuple(0 if k == 1 else d for k, d in zip(kernel, geometry.dilations, strict=True))
    geometry = _Geometry(geometry.strides, dilations, geometry.group)
    pads = tuple(conv.attributes.get_ints("pads", (0,) * (2 * spatial)))
    bias = _conv_bias(conv, int(weight.shape[0]))
    if isinstance(bias, Mismatch):
        return bias
    start = tuple(-pads[i] for i in range(spatial))
    end = tuple(start[i] + geometry.dilations[i] * (kernel[i] - 1) for i in range(spatial))
    tail = tuple(pads[spatial + i] - end[i] for i in range(spatial))
    branch = _Branch(
        weight, bias.astype(np.float64), None, start, tail, (conv,), weight.dtype, weight.size
    )
    return branch, geometry


def _pointwise(conv: ir.Node) -> bool:
    """A 1x1 Conv that only mixes channels: stride 1, no padding, one group."""
    weight = conv.inputs[1] if len(conv.inputs) > 1 else None
    shape = None if weight is None or weight.shape is None else list(weight.shape)
    if shape is None or len(shape) < 3 or any(k != 1 for k in shape[2:]):
        return False
    spatial = len(shape) - 2
    attributes = conv.attributes
    return (
        attributes.get_int("group", 1) == 1
        and attributes.get_string("auto_pad", "NOTSET") == "NOTSET"
        and all(s == 1 for s in attributes.get_ints("strides", (1,) * spatial))
        and not any(attributes.get_ints("pads", (0,) * (2 * spatial)))
    )


def _composed_branch(
    outer: ir.Node, inner: ir.Node, context: RewriteContext
) -> tuple[_Branch, _Geometry] | Mismatch:
    """``outer(inner(x))`` with ``outer`` a 1x1 Conv of one group: one Conv of x with ``inner``'s
    window, whose kernel is ``B @ A`` at every tap (B outer's [O, R] matrix, A inner's [R, C, *k]
    kernel) and bias ``B @ a + b``: a LoRA adapter on a Conv (PEFT's lora_A, a k x k Conv down
    to R channels, then lora_B, a 1x1 Conv back up)."""
    found = _conv_branch(inner, context)
    if isinstance(found, Mismatch):
        return found
    branch, geometry = found
    if geometry.group != 1:
        return Mismatch("an adapter's first Conv has groups")
    outer_weight = weight_to_fold(outer, 1, context.options.fold_may_grow)
    if isinstance(outer_weight, Mismatch):
        return outer_weight
    assert branch.weight is not None and branch.bias is not None
    rank = int(branch.weight.shape[0])
    if outer_weight.shape[1:2] != (rank,) or outer_weight.dtype != branch.dtype:
        return Mismatch("an adapter's 1x1 Conv does not read its first Conv's channels")
    outer_bias = _conv_bias(outer, int(outer_weight.shape[0]))
    if isinstance(outer_bias, Mismatch):
        return outer_bias
    matrix = outer_weight.reshape(outer_weight.shape[0], rank).astype(np.float64)
    inner_weight = branch.weight.astype(np.float64).reshape(rank, -1)
    weight = (matrix @ inner_weight).reshape(matrix.shape[0], *branch.weight.shape[1:])
    composed = replace(
        branch,
        weight=weight,
        bias=matrix @ branch.bias + outer_bias,
        nodes=(inner, outer),
        cost=branch.cost + outer_weight.size,
    )
    return composed, geometry


def _conv_bias(conv: ir.Node, channels: int) -> np.ndarray | Mismatch:
    """The Conv's bias in float64 (zeros without one)."""
    value = conv.inputs[2] if len(conv.inputs) > 2 else None
    bias = np.zeros(channels) if value is None else const_array(value)
    if bias is None:
        return Mismatch("a Conv bias is not a constant")
    if bias.shape != (channels,):
        return Mismatch("a Conv bias does not have one entry per output channel")
    return bias.astype(np.float64)


def _branch(
    value: ir.Value | None, x: ir.Value, context: RewriteContext
) -> tuple[_Branch, _Geometry | None] | Mismatch:
    """``value`` (a summand) as a branch over ``x``; the geometry of a Conv branch."""
    if value is None:
        return Mismatch("the Add has a missing input", candidate=False)
    if value is x:
        return _Branch(None, None, None, (), (), (), None), None
    node = value.producer()
    if node is None or not only_user(value):
        return Mismatch("a summand has other users or is not computed here", candidate=False)
    if is_op(node, "Conv") and node.inputs[0] is x:
        return _conv_branch(node, context)
    inner = _adapter_input(node)
    if inner is not None and inner.inputs[0] is x:
        assert node is not None
        return _composed_branch(node, inner, context)
    if is_op(node, "BatchNormalization"):
        found = bn_affine(node)
        if isinstance(found, Mismatch):
            return found
        if node.inputs[0] is x:
            return _Branch(None, found[1], found[0], (), (), (node,), None), None
        return _normalized_branch(node, found, x, context)
    if is_op(node, "Mul"):
        return _scaled_branch(node, x, context)
    return Mismatch("a summand is not a Conv or BatchNormalization of the shared input", False)


def _adapter_input(node: ir.Node | None) -> ir.Node | None:
    """The Conv that a pointwise Conv ``node`` reads, when it reads nothing else."""
    if node is None or not is_op(node, "Conv") or not _pointwise(node) or node.inputs[0] is None:
        return None
    inner = node.inputs[0].producer()
    if inner is None or not is_op(inner, "Conv") or not only_user(node.inputs[0]):
        return None
    return inner


def _scaled_branch(
    mul: ir.Node, x: ir.Value, context: RewriteContext
) -> tuple[_Branch, _Geometry | None] | Mismatch:
    """``branch * c`` with c constant per channel (FastViT's layer scale on its RepMixer)."""
    operand = next((v for v in mul.inputs[:2] if v is not None and const_array(v) is None), None)
    factor = other_input(mul, operand) if operand is not None else None
    if operand is None or factor is None or const_array(factor) is None:
        return Mismatch("a summand is a Mul that is not by a constant", candidate=False)
    found = _branch(operand, x, context)
    if isinstance(found, Mismatch):
        return found
    branch, geometry = found
    rank = rank_of(operand)
    channels = _channels(branch, x)
    if rank is None or channels is None:
        return Mismatch("a scaled summand's rank or channel count is unknown")
    c = per_channel(factor, rank, channels, 1)
    if isinstance(c, Mismatch):
        return Mismatch(f"a summand's scale: {c.reason}", candidate=c.candidate)
    return replace(_times(branch, c), nodes=(*branch.nodes, mul)), geometry


def _normalized_branch(
    bn: ir.Node, affine: tuple[np.ndarray, np.ndarray], x: ir.Value, context: RewriteContext
) -> tuple[_Branch, _Geometry | None] | Mismatch:
    """``BatchNormalization(branch)``: a Conv's own BN, folded here rather than by fuse-conv-bn,
    so that a BN after the sum (RepViT's ``bn(conv(x) + conv1(x) + x)``) still meets one Conv."""
    found = _branch(bn.inputs[0], x, context)
    if isinstance(found, Mismatch):
        return found
    branch, geometry = found
    s, t = affine
    if s.shape != (_channels(branch, x),):
        return Mismatch("a branch's BatchNormalization has another channel count")
    return replace(_times(branch, s, t), nodes=(*branch.nodes, bn)), geometry


def _channels(branch: _Branch, x: ir.Value) -> int | None:
    if branch.weight is not None:
        return int(branch.weight.shape[0])
    if branch.scale is not None:
        return int(branch.scale.shape[0])
    dim = None if x.shape is None or len(x.shape) < 2 else x.shape[1]
    return dim if isinstance(dim, int) else None


def _times(branch: _Branch, c: np.ndarray, shift: np.ndarray | None = None) -> _Branch:
    """``branch`` with its output multiplied by ``c`` (one number per output channel, or one),
    then ``shift`` added."""
    c = np.asarray(c, dtype=np.float64).reshape(-1)
    weight = branch.weight
    if weight is not None:
        weight = weight.astype(np.float64) * c.reshape(-1, *(1,) * (weight.ndim - 1))
    scale = None
    if branch.weight is None:  # the identity's centre tap, 1 where no BatchNormalization set it
        scale = (np.ones(1) if branch.scale is None else branch.scale) * c
    bias = None if branch.bias is None else branch.bias * c
    if shift is not None:
        bias = shift if bias is None else bias + shift
    return replace(branch, weight=weight, bias=bias, scale=scale)


def _common_geometry(geometries: list[_Geometry]) -> _Geometry | Mismatch:
    """The strides, dilations and group all Conv branches share (a 0 dilation agrees with any)."""
    if len({(g.strides, g.group, len(g.dilations)) for g in geometries}) != 1:
        return Mismatch("the Convs differ in strides or groups")
    dilations = []
    for axis in range(len(geometries[0].dilations)):
        values = sorted({g.dilations[axis] for g in geometries} - {0})
        if len(values) > 1:
            return Mismatch("the Convs differ in dilations")
        dilations.append(values[0] if values else 1)
    return _Geometry(geometries[0].strides, tuple(dilations), geometries[0].group)


def _shared_inputs(add: ir.Node) -> list[ir.Value]:
    """What the summands may share, in order: the inputs of the Muls and BatchNormalizations
    under each summand, and of the Conv they lead to (a BN of x beside a Conv of x shares x; a
    BN of a Conv's output beside another Conv of that output shares the output)."""
    found: list[ir.Value] = []
    for value in add.inputs[:2]:
        node = None if value is None else value.producer()
        while node is not None and (is_op(node, "Mul") or is_op(node, "BatchNormalization")):
            operands = node.inputs[:1] if is_op(node, "BatchNormalization") else node.inputs[:2]
            computed = [v for v in operands if v is not None and const_array(v) is None]
            if len(computed) != 1:
                break
            found.append(computed[0])
            node = computed[0].producer()
        if is_op(node, "Conv") and node is not None and node.inputs and node.inputs[0] is not None:
            found.append(node.inputs[0])
            inner = _adapter_input(node)
            if inner is not None and inner.inputs[0] is not None:
                found.append(inner.inputs[0])
    unique: list[ir.Value] = []
    for value in found:
        if not any(value is seen for seen in unique):
            unique.append(value)
    return unique


def _layout(
    branches: list[_Branch], geometry: _Geometry, spatial: int, kernels: list[tuple[int, ...]]
) -> tuple[list[tuple[int, ...]], tuple[int, ...], tuple[int, ...]] | Mismatch:
    """Each branch's kernel offset in the merged window, the window and the merged pads."""
    starts = [b.start if b.weight is not None else (0,) * spatial for b in branches]
    tails = [b.tail if b.weight is not None else (0,) * spatial for b in branches]
    if len(set(tails)) != 1:
        return Mismatch("the branches' output sizes could differ (their end padding differs)")
    origin = tuple(min(s[i] for s in starts) for i in range(spatial))
    offsets = []
    for start in starts:
        steps = []
        for i in range(spatial):
            shift, rest = divmod(start[i] - origin[i], geometry.dilations[i])
            if rest:
                return Mismatch("the branches' windows are not aligned on the dilation")
            steps.append(shift)
        offsets.append(tuple(steps))
    window = tuple(
        max(o[i] + k[i] for o, k in zip(offsets, kernels, strict=True)) for i in range(spatial)
    )
    if not any(o == (0,) * spatial and k == window for o, k in zip(offsets, kernels, strict=True)):
        return Mismatch("no branch's window covers the others' (the merged Conv would read more)")
    end = tuple(origin[i] + geometry.dilations[i] * (window[i] - 1) for i in range(spatial))
    pads = tuple(-o for o in origin) + tuple(tails[0][i] + end[i] for i in range(spatial))
    return offsets, window, pads


def _summed(
    branches: list[_Branch],
    offsets: list[tuple[int, ...]],
    kernels: list[tuple[int, ...]],
    shape: tuple[int, ...],
    dtype: np.dtype,
) -> tuple[np.ndarray, np.ndarray] | Mismatch:
    """The merged weight of ``shape`` [M, C/group, *window] in ``dtype`` and the bias."""
    exact = dtype == np.float32
    merged = np.zeros(shape, dtype=np.float32 if exact else np.float64)
    bias = np.zeros(shape[0])
    channel = np.arange(shape[0])
    for branch, offset, kernel in zip(branches, offsets, kernels, strict=True):
        if branch.weight is not None:
            window = [slice(o, o + k) for o, k in zip(offset, kernel, strict=True)]
            at: tuple[Any, ...] = (slice(None), slice(None), *window)
            merged[at] += branch.weight
        else:  # x * scale on its own channel: the centre tap of the identity's 1x1 kernel
            scale = np.ones(shape[0]) if branch.scale is None else branch.scale
            tap: tuple[Any, ...] = (channel, channel % shape[1], *offset)
            merged[tap] = merged[tap].astype(np.float64) + np.broadcast_to(scale, shape[:1])
        if branch.bias is not None:
            bias += branch.bias
    finite = all(b.weight is None or np.isfinite(b.weight).all() for b in branches)
    if exact and finite and not np.isfinite(merged).all():  # narrowed cannot see this one
        return Mismatch(f"the merged weights overflow {dtype}")
    return narrowed((merged, bias), dtype)


def _match(add: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if len(add.inputs) != 2:
        return Mismatch(f"not a binary {add.op_type}", candidate=False)
    outcome = Mismatch("no summand is a Conv", candidate=False)
    for x in _shared_inputs(add):
        attempt = _match_over(add, x, context)
        if isinstance(attempt, Match):
            return attempt
        if attempt.candidate or not outcome.candidate:
            outcome = attempt
    return outcome


def _match_over(add: ir.Node, x: ir.Value, context: RewriteContext) -> Match | Mismatch:
    """The summands of ``add`` as branches over ``x``, merged."""
    found = [_branch(value, x, context) for value in add.inputs]
    for item in found:
        if isinstance(item, Mismatch):
            return item
    pairs = [item for item in found if not isinstance(item, Mismatch)]
    branches = [branch for branch, _ in pairs]
    if is_op(add, "Sub"):  # a - b: the second branch negated (FastViT's mixer(x) - norm(x))
        branches[1] = _times(branches[1], np.array([-1.0]))
    convs = [b for b in branches if b.weight is not None]
    if not convs:  # x beside a BatchNormalization or a scaling of x: nothing to merge into
        return Mismatch("no summand is a Conv", candidate=False)
    geometry = _common_geometry([g for _, g in pairs if g is not None])
    if isinstance(geometry, Mismatch):
        return geometry
    shapes = {b.weight.shape[:2] for b in convs if b.weight is not None}
    spatial = len(geometry.strides)
    if len(shapes) != 1 or len({b.weight.ndim for b in convs if b.weight is not None}) != 1:
        return Mismatch("the Convs differ in channels or spatial rank")
    if len({b.dtype for b in convs}) != 1:
        return Mismatch("the Conv weights differ in dtype")
    (channels,) = shapes
    out_channels, per_group = int(channels[0]), int(channels[1])
    identity = [b for b in branches if b.weight is None]
    if identity and out_channels != per_group * geometry.group:
        return Mismatch("an identity branch needs as many output as input channels")
    if any(b.scale is not None and b.scale.shape not in ((1,), (out_channels,)) for b in identity):
        return Mismatch("the BatchNormalization branch has another channel count")
    if identity and any(s != 1 for s in geometry.strides):
        return Mismatch("an identity branch needs stride 1")
    kernels = [
        tuple(int(k) for k in b.weight.shape[2:]) if b.weight is not None else (1,) * spatial
        for b in branches
    ]
    layout = _layout(branches, geometry, spatial, kernels)
    if isinstance(layout, Mismatch):
        return layout
    offsets, window, pads = layout
    merged_cost = out_channels * per_group * int(np.prod(window))
    if merged_cost > sum(b.cost for b in branches):
        return Mismatch(
            f"one Conv would cost {merged_cost} multiply-adds per position, the branches "
            f"{sum(b.cost for b in branches)}"
        )
    dtype = convs[0].dtype
    assert dtype is not None
    narrow = _summed(branches, offsets, kernels, (out_channels, per_group, *window), dtype)
    if isinstance(narrow, Mismatch):
        return narrow
    nodes = [node for b in branches for node in b.nodes]
    return Match(
        [*nodes, add],
        {"x": x, "weight": narrow[0], "bias": narrow[1], "pads": pads, "geometry": geometry},
    )


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    add = match.root
    first = next(node for node in match.nodes if is_op(node, "Conv"))
    geometry: _Geometry = match.bindings["geometry"]
    weight = new_constant(
        match.bindings["weight"], first.inputs[1].name if first.inputs[1] else None
    )
    bias = new_constant(match.bindings["bias"], f"{first.name or 'Conv'}_bias")
    attributes: dict[str, Any] = {
        "dilations": list(geometry.dilations),
        "group": geometry.group,
        "kernel_shape": list(match.bindings["weight"].shape[2:]),
        "pads": list(match.bindings["pads"]),
        "strides": list(geometry.strides),
    }
    conv = ir.node("Conv", [match.bindings["x"], weight, bias], attributes, name=first.name)
    conv.outputs[0].type, conv.outputs[0].shape = add.outputs[0].type, add.outputs[0].shape
    return Replacement([conv], [(add.outputs[0], conv.outputs[0])], constants=[weight, bias])


RULES = (
    Rule("conv+conv->conv", "Add", _match, _rewrite),
    Rule("conv+conv->conv", "Sub", _match, _rewrite),
)


class FuseParallelConvsPass(RulePass):
    """Summed Convs of one input (and an identity or BatchNormalization branch) -> one Conv."""

    name = "fuse-parallel-convs"
    summary = (
        "merge Convs of one input that are summed (RepVGG / ACNet branches, an identity or "
        "BatchNormalization branch among them) into one Conv"
    )
    rules = RULES
