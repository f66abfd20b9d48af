"""Dims that ONNX shape inference leaves unknown although an op provably copies them from its input.

ONNX infers nothing but the rank of a Slice whose starts or ends are not constant, yet every axis
the Slice does not touch keeps its input dim. TorchScript exports slice buffers by the sequence
length (``position_ids[:, :seq]``), so the untouched dims (often a static 1) would otherwise stay
unknown and every Shape -> Gather chain reading them would stay unfolded. A copied dim is the same
value as the input's (a symbolic dim keeps its name); nothing is ever guessed.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxopt.ops import is_op
from onnxopt.passes._shape_facts import int_param, normalize_axes, optional_input
from onnxopt.rewrite import Mismatch


def refine_shapes(model: ir.Model) -> int:
    """Fill in provably copied dims (never replacing a known one); the number of values improved."""
    improved = 0
    for graph in model.graphs():
        for node in graph:
            if is_op(node, "Slice"):
                improved += _refine_slice(node)
    return improved


# ONNX inference names the dims it cannot tell "unk__0", "unk__1", ...: placeholders, not facts.
GENERATED_DIM_PREFIX = "unk__"


def _is_unknown(dim: object) -> bool:
    if dim is None or isinstance(dim, int):
        return dim is None
    name = getattr(dim, "value", None)
    return not name or str(name).startswith(GENERATED_DIM_PREFIX)


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


def _refine_slice(node: ir.Node) -> int:
    data, out = node.inputs[0] if node.inputs else None, node.outputs[0]
    if data is None or data.shape is None:
        return 0
    rank = len(data.shape)
    if out.shape is not None and len(out.shape) != rank:
        return 0
    sliced = _sliced_axes(node, rank)
    if sliced is None:
        return 0
    current = list(out.shape) if out.shape is not None else [None] * rank
    dims = list(current)
    for axis in range(rank):
        known = current[axis]
        if axis in sliced or isinstance(known, int):
            continue
        source = data.shape[axis]
        if _is_unknown(known) and not _is_unknown(source):
            dims[axis] = source
    if dims == current:
        return 0
    out.shape = ir.Shape(dims)
    return 1
