"""Facts about shapes, axes and constant parameters that no-op and merge rules prove things with.

Symbolic dims are never assumed equal to anything (two unknown dims may differ at run time), so
every helper treats a non-integer dim as "unknown" and proofs that need it fail with a reason.
Ops that moved a parameter from an attribute to an input across opsets (Squeeze/Unsqueeze axes
at 13, Slice at 10, Pad at 11, Split at 13) are read in whichever form the node uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxopt.ops import const_array, is_op
from onnxopt.rewrite import Mismatch

Dims = tuple[int | None, ...]  # None: a dim that is not a known integer

# Slice ends at or past this mean "to the end" whatever the dim (INT_MAX / INT64_MAX in exports).
SLICE_TO_END = 2**31 - 1
INT64_MAX = 2**63 - 1


# Ops whose result elements are all copies of their first input's elements (so a tensor of one
# repeated value stays that value through them).
ELEMENT_MOVES = frozenset(
    {"Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Tile", "Transpose",
     "Slice", "Gather"}
)  # fmt: skip


# Ops whose inputs broadcast against one another (multidirectionally) into the result's shape.
MULTIDIRECTIONAL = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Mod", "And", "Or", "Xor", "Equal", "Less",
        "LessOrEqual", "Greater", "GreaterOrEqual", "Where", "Max", "Min", "Sum", "Mean",
    }
)  # fmt: skip


def dims_of(value: ir.Value | None) -> Dims | None:
    """The value's dims (None for symbolic/unknown ones), or None when even the rank is unknown."""
    if value is None or value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else None for d in value.shape)


def const_ints(value: ir.Value | None) -> tuple[int, ...] | None:
    """A constant integer tensor (scalar or 1-D) as a tuple, or None when not constant."""
    array = const_array(value)
    if array is None or array.ndim > 1 or not np.issubdtype(array.dtype, np.integer):
        return None
    return tuple(int(v) for v in array.reshape(-1))


def optional_input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if len(node.inputs) > index else None


def producer_op(node: ir.Node, op_type: str) -> ir.Node | Mismatch:
    """The node producing ``node``'s first input, when it is an ``op_type`` with a data input."""
    value = node.inputs[0] if node.inputs else None
    producer = value.producer() if value is not None else None
    if producer is None or not is_op(producer, op_type):
        return Mismatch(f"its input does not come from a {op_type}")
    if not producer.inputs or producer.inputs[0] is None:
        return Mismatch(f"the inner {op_type} has no data input")
    return producer


def int_param(node: ir.Node, attr: str, index: int) -> tuple[int, ...] | Mismatch | None:
    """An int list given as attribute ``attr`` (older opsets) or as input ``index`` (newer ones).

    None means the parameter is absent; a Mismatch that it is given but not constant.
    """
    if attr in node.attributes:
        return tuple(node.attributes.get_ints(attr, ()))
    value = optional_input(node, index)
    if value is None:
        return None
    ints = const_ints(value)
    if ints is None:
        return Mismatch(f"{node.op_type} {attr} input '{value.name}' is not a constant")
    return ints


def axes_param(node: ir.Node, rank: int | None) -> tuple[int, ...] | Mismatch | None:
    """A node's ``axes`` (attribute or input), made non-negative with ``rank``; None when absent."""
    axes = int_param(node, "axes", 1)
    if axes is None or isinstance(axes, Mismatch):
        return axes
    normalized = normalize_axes(axes, rank)
    if normalized is None:
        return Mismatch(f"{node.op_type} axes {list(axes)} are negative and the rank is unknown")
    return normalized


def cast_target(node: ir.Node) -> ir.DataType | None:
    """A Cast's target type: an int attribute, or a type name in Cast-1."""
    attr = node.attributes.get("to")
    if attr is None:
        return None
    try:
        if attr.type == ir.AttributeType.STRING:
            return ir.DataType[attr.as_string().upper()]
        return ir.DataType(attr.as_int())
    except (KeyError, ValueError):
        return None


def normalize_axes(axes: Sequence[int], rank: int | None) -> tuple[int, ...] | None:
    """Axes made non-negative; None when a negative axis meets an unknown rank or one is out of range."""
    out = []
    for axis in axes:
        if axis < 0:
            if rank is None:
                return None
            axis += rank
        if axis < 0 or (rank is not None and axis >= rank):
            return None
        out.append(axis)
    return tuple(out)


def broadcast_keeps(dims: Dims, other: Sequence[int | None], what: str) -> Mismatch | None:
    """Prove that broadcasting ``dims`` with ``other`` gives ``dims`` back (None: unknown dim)."""
    if len(other) > len(dims):
        return Mismatch(f"{what} has rank {len(other)} > {len(dims)}: broadcasting would add dims")
    for offset, size in enumerate(reversed(other)):
        dim = dims[len(dims) - 1 - offset]
        if size == 1:
            continue
        if size is None or dim is None:
            return Mismatch(
                f"{what} meets a symbolic dim: cannot prove broadcasting keeps the shape"
            )
        if size != dim:
            return Mismatch(f"{what} has dim {size} against {dim}: broadcasting changes the shape")
    return None


def same_known_dims(a: Dims | None, b: Dims | None) -> bool:
    """True when both shapes are fully known integers and equal."""
    return a is not None and b is not None and None not in a and a == b


def same_dims(a: ir.Shape | None, b: ir.Shape | None) -> bool:
    """Provably the same shape: equal ranks, equal ints, symbolic dims with the same name (ONNX
    gives one dim one name wherever it propagates it)."""
    if a is None or b is None or len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, int) or isinstance(y, int):
            if x != y:
                return False
        elif x.value is None or x.value != y.value:
            return False
    return True


def is_whole_shape_of(shape: ir.Value | None, data: ir.Value | None) -> bool:
    """True when ``shape`` is ``Shape(data)`` over all of data's dims."""
    producer = shape.producer() if shape is not None else None
    if producer is None or not is_op(producer, "Shape") or producer.inputs[0] is not data:
        return False
    start = producer.attributes.get_int("start", 0)
    end = producer.attributes.get_int("end", None)
    if start == 0 and end is None:
        return True
    dims = dims_of(data)
    return dims is not None and start in (0, -len(dims)) and (end is None or end >= len(dims))


def _same_symbol(a: ir.Value | None, b: ir.Value | None, axis: int) -> bool:
    """Both values' dim ``axis`` is the same named symbolic dim (ONNX gives one dim one name
    wherever it propagates it)."""
    x, y = (
        v.shape[axis] if v is not None and v.shape is not None and axis < len(v.shape) else None
        for v in (a, b)
    )
    return (
        isinstance(x, ir.SymbolicDim)
        and isinstance(y, ir.SymbolicDim)
        and x.value is not None
        and x.value == y.value
    )


def reshape_identity_problem(node: ir.Node, data: ir.Value | None) -> str | None:
    """Why Reshape ``node`` may not return ``data`` unchanged (None: it provably does). ``data`` is
    the Reshape's own input, or a tensor its input is a view of: views keep the element order, so
    a view of ``data`` reshaped back to ``data``'s shape is ``data``."""
    source = node.inputs[0]
    data_dims = dims_of(data)
    if same_known_dims(data_dims, dims_of(node.outputs[0])):
        return None
    shape = optional_input(node, 1)
    if is_whole_shape_of(shape, data):
        return None
    target = (
        tuple(node.attributes.get_ints("shape", ()))
        if "shape" in node.attributes
        else const_ints(shape)
    )
    if target is None:
        return "the target shape is not a constant and the shapes are not both known"
    if data_dims is None:
        return "the input rank is unknown"
    if len(target) != len(data_dims):
        return f"it changes the rank from {len(data_dims)} to {len(target)}"
    source_dims = dims_of(source)
    allow_zero = node.attributes.get_int("allowzero", 0)
    inferred = 0
    for axis, (want, dim) in enumerate(zip(target, data_dims, strict=True)):
        if want == 0 and not allow_zero:
            if source is data:
                continue  # copies the input dim
            # copies the view's dim, which must be data's: the same int, or the same named dim
            copied = (
                source_dims[axis] if source_dims is not None and axis < len(source_dims) else None
            )
            if copied is None:
                if _same_symbol(source, data, axis):
                    continue
                return f"target dim {axis} copies a dim of the view that is not known"
            want = copied
        if want == -1:
            inferred += 1  # equals the input dim once every other dim is proven equal
            continue
        if dim is None:
            return f"target dim {axis} is {want} but the input dim is symbolic"
        if want != dim:
            return f"target dim {axis} is {want} but the input has {dim}"
    if inferred > 1:
        return "the target has several -1 dims"
    return None


@dataclass(frozen=True)
class SliceParams:
    """Constant Slice parameters; ``axes`` as written (possibly negative), one entry per sliced axis."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    axes: tuple[int, ...]
    steps: tuple[int, ...]
    attribute_form: bool  # Slice-1 (opset < 10) keeps starts/ends/axes in attributes, no steps


def slice_params(node: ir.Node) -> SliceParams | Mismatch:
    """Read a Slice's parameters in either form; Mismatch when one is not constant."""
    if "starts" in node.attributes:
        first = tuple(node.attributes.get_ints("starts", ()))
        last = tuple(node.attributes.get_ints("ends", ()))
        written = tuple(node.attributes.get_ints("axes", range(len(first))))
        return SliceParams(first, last, written, (1,) * len(first), attribute_form=True)
    found: dict[str, tuple[int, ...] | None] = {}
    for index, what in enumerate(("starts", "ends", "axes", "steps"), start=1):
        value = optional_input(node, index)
        ints = const_ints(value)
        if value is not None and ints is None:
            return Mismatch(f"Slice {what} input '{value.name}' is not a constant")
        found[what] = ints
    starts, ends, given_axes, given_steps = (
        found["starts"],
        found["ends"],
        found["axes"],
        found["steps"],
    )
    if starts is None or ends is None:
        return Mismatch("Slice has no starts/ends")
    axes = given_axes if given_axes is not None else tuple(range(len(starts)))
    steps = given_steps if given_steps is not None else (1,) * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        return Mismatch("Slice parameters have different lengths")
    return SliceParams(starts, ends, axes, steps, attribute_form=False)
