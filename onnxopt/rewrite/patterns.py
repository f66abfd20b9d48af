"""Small pure helpers that fusion rules share: walking producers, reading constants, making constants."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnxopt.ops import const_array, is_op


def producer_op(value: ir.Value | None, op_type: str, domain: str = "") -> ir.Node | None:
    """The node producing ``value`` when it is ``op_type`` of ``domain``, else None."""
    if value is None:
        return None
    node = value.producer()
    return node if is_op(node, op_type, domain) else None


def operand_op(node: ir.Node, op_type: str, domain: str = "") -> ir.Node | None:
    """The producer of the first of a binary ``node``'s operands that ``op_type`` makes."""
    for operand in node.inputs[:2]:
        found = producer_op(operand, op_type, domain)
        if found is not None:
            return found
    return None


def const_scalar(value: ir.Value | None) -> float | None:
    """The value as a Python float when it is a constant scalar (rank 0 or shape [1]).

    Higher-rank single-element constants are refused: they broadcast the other operand's rank up,
    which a fused op would not reproduce.
    """
    return const_scalar_within(value, None)


def const_scalar_within(value: ir.Value | None, rank: int | None) -> float | None:
    """A single-element constant of rank up to ``rank`` (the rank of the tensor it is combined
    with; 1 when unknown) as a float: a [1, 1, 1] constant added to a rank-3 tensor broadcasts
    without raising its rank (tf2onnx writes such constants)."""
    array = const_array(value)
    if array is None or array.size != 1 or array.ndim > max(rank or 0, 1):
        return None
    return float(array.reshape(()))


def other_input(node: ir.Node, value: ir.Value | None) -> ir.Value | None:
    """For a binary op with ``value`` as one input, the other input (None when absent)."""
    a, b = ([*list(node.inputs), None, None])[:2]
    if a is value:
        return b
    if b is value:
        return a
    return None


def only_user(value: ir.Value) -> bool:
    """True when ``value`` feeds exactly one node input and is not a graph output."""
    return len(list(value.uses())) == 1 and not value.is_graph_output()


def users(value: ir.Value) -> int:
    return len(list(value.uses())) + (1 if value.is_graph_output() else 0)


def new_constant(array: np.ndarray, hint: str | None) -> ir.Value:
    """A named value holding ``array``; pass it in ``Replacement.initializers``."""
    name = f"{hint or 'onnxopt'}_fused"
    array = np.ascontiguousarray(array)
    tensor = ir.tensor(array, name=name)
    return ir.Value(
        name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor
    )


def int64_constant(values: Sequence[int]) -> ir.Value:
    """An unnamed int64 vector (axes, shapes, slice bounds) for ``Replacement.constants``."""
    tensor = ir.tensor(np.asarray(values, dtype=np.int64))
    return ir.Value(
        name=None,
        type=ir.TensorType(ir.DataType.INT64),
        shape=ir.Shape([len(values)]),
        const_value=tensor,
    )


def squeeze_op(
    op_type: str, data: ir.Value, axes: Sequence[int], opset: int
) -> tuple[ir.Node, tuple[ir.Value, ...]]:
    """An Unsqueeze or Squeeze of ``data`` on ``axes``: an attribute before opset 13, an input
    from it. Returns the node and the constants to pass in ``Replacement.constants``."""
    if opset < 13:
        return ir.node(op_type, [data], {"axes": list(axes)}), ()
    constant = int64_constant(axes)
    return ir.node(op_type, [data, constant]), (constant,)


def rank_of(value: ir.Value | None) -> int | None:
    if value is None or value.shape is None:
        return None
    return len(value.shape)


def dtype_of(value: ir.Value | None) -> ir.DataType | None:
    return None if value is None else value.dtype


def ensure_opset(model: ir.Model, domain: str, version: int) -> None:
    """Import ``domain`` in the model when a fusion introduced ops from it."""
    if domain not in model.opset_imports:
        model.opset_imports[domain] = version
