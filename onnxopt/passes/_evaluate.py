"""Evaluating nodes on constant inputs: output types from ONNX inference, numpy for the trivial shape
ops, ONNX Runtime (one session for many nodes) for everything else.

The numpy kernels are restricted to what is exact in numpy: data movement (any dtype) and integer
arithmetic. Floating-point arithmetic always goes to ONNX Runtime so folded values are bit-identical to
what the runtime would compute.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxopt.guard import doing
from onnxopt.ops import constant_of_shape_fill

logger = logging.getLogger(__name__)

# dtypes numpy holds natively and ONNX Runtime accepts as numpy feeds; others are never folded.
SUPPORTED_DTYPES = frozenset(
    {
        ir.DataType.FLOAT,
        ir.DataType.DOUBLE,
        ir.DataType.FLOAT16,
        ir.DataType.INT8,
        ir.DataType.INT16,
        ir.DataType.INT32,
        ir.DataType.INT64,
        ir.DataType.UINT8,
        ir.DataType.UINT16,
        ir.DataType.UINT32,
        ir.DataType.UINT64,
        ir.DataType.BOOL,
    }
)
# Inputs up to this many elements are handed to ONNX shape inference as data (shape-like tensors).
INFERENCE_DATA_ELEMENTS = 1024


@dataclass(frozen=True)
class TensorType:
    """A tensor's dtype and fully static shape."""

    dtype: ir.DataType
    shape: tuple[int, ...]

    @property
    def elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def nbytes(self) -> int:
        return int(self.elements * self.dtype.itemsize)


def tensor_type_of(array: np.ndarray) -> TensorType:
    return TensorType(ir.DataType.from_numpy(array.dtype), tuple(int(d) for d in array.shape))


# --------------------------------------------------------------------------- output types


def infer_output_types(
    node: ir.Node,
    inputs: Sequence[TensorType | None],
    data: Mapping[int, np.ndarray],
    opsets: Mapping[str, int],
) -> list[TensorType | None] | None:
    """Each output's static type per ONNX shape inference given the inputs' exact types and the
    values of the small ones (``data``: input index -> array); None when inference cannot tell."""
    import onnx

    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    version = opsets.get(domain) or (opsets.get("ai.onnx") if domain == "" else None) or 1
    try:
        schema = onnx.defs.get_schema(node.op_type, version, domain)
    except Exception:
        return None
    proto = ir.serde.serialize_node(node)
    del proto.input[:]
    names = []
    for index, _ in enumerate(node.inputs):
        names.append(f"i{index}" if inputs[index] is not None else "")
    proto.input.extend(names)
    del proto.output[:]
    proto.output.extend(f"o{i}" for i in range(len(node.outputs)))
    types = {}
    input_data = {}
    for index, info in enumerate(inputs):
        if info is None:
            continue
        type_proto = onnx.TypeProto()
        type_proto.tensor_type.elem_type = int(info.dtype)
        shape = type_proto.tensor_type.shape
        shape.SetInParent()
        for dim in info.shape:
            shape.dim.add().dim_value = dim
        types[f"i{index}"] = type_proto
        if index in data:
            input_data[f"i{index}"] = ir.serde.serialize_tensor(
                ir.Tensor(data[index], name=f"i{index}")
            )
    opset_protos = []
    for key, ver in opsets.items():
        opset = onnx.OperatorSetIdProto()
        opset.domain = key
        opset.version = ver
        opset_protos.append(opset)
    try:
        result = onnx.shape_inference.infer_node_outputs(
            schema, proto, types, input_data, opset_imports=opset_protos
        )
    except Exception:
        return None
    out: list[TensorType | None] = []
    for index in range(len(node.outputs)):
        found = result.get(f"o{index}")
        if found is None or not found.HasField("tensor_type"):
            out.append(None)
            continue
        tensor_type = found.tensor_type
        if not tensor_type.elem_type or not tensor_type.HasField("shape"):
            out.append(None)
            continue
        dims = []
        for dim in tensor_type.shape.dim:
            if not dim.HasField("dim_value"):
                break
            dims.append(int(dim.dim_value))
        else:
            out.append(TensorType(ir.DataType(tensor_type.elem_type), tuple(dims)))
            continue
        out.append(None)
    return out


# --------------------------------------------------------------------------- numpy kernels

Kernel = Callable[[ir.Node, list[np.ndarray | None]], list[np.ndarray] | None]
_KERNELS: dict[str, Kernel] = {}


def _kernel(*op_types: str) -> Callable[[Kernel], Kernel]:
    def register(fn: Kernel) -> Kernel:
        for op_type in op_types:
            _KERNELS[op_type] = fn
        return fn

    return register


def _is_int(*arrays: np.ndarray | None) -> bool:
    return all(
        a is not None and (np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_)
        for a in arrays
    )


def _ints(node: ir.Node, name: str) -> list[int] | None:
    attr = node.attributes.get(name)
    return None if attr is None else list(attr.as_ints())


def _axes(node: ir.Node, inputs: list[np.ndarray | None], index: int) -> list[int] | None:
    attr = _ints(node, "axes")
    if attr is not None:
        return attr
    if len(inputs) > index and inputs[index] is not None:
        return [int(a) for a in np.asarray(inputs[index]).reshape(-1)]
    return None


@_kernel("Identity")
def _identity(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    return [x[0]] if x[0] is not None else None


@_kernel("Shape")
def _shape(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    assert x[0] is not None
    dims = list(x[0].shape)
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", len(dims))
    return [np.array(dims[slice(start, end)], dtype=np.int64)]


@_kernel("Size")
def _size(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    assert x[0] is not None
    return [np.array(x[0].size, dtype=np.int64)]


@_kernel("Gather")
def _gather(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    data, indices = x[0], x[1]
    if data is None or indices is None or not _is_int(indices):
        return None
    axis = node.attributes.get_int("axis", 0)
    if data.ndim == 0:
        return None
    size = data.shape[axis]
    if indices.size and (indices.min() < -size or indices.max() >= size):
        return None  # out of range: let the runtime report it
    return [np.take(data, indices.astype(np.int64), axis=axis)]


@_kernel("Slice")
def _slice(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    data = x[0]
    if data is None:
        return None
    if "starts" in node.attributes:  # opset < 10
        starts = _ints(node, "starts") or []
        ends = _ints(node, "ends") or []
        axes = _ints(node, "axes")
        steps = [1] * len(starts)
    else:
        if x[1] is None or x[2] is None:
            return None
        starts = [int(v) for v in x[1].reshape(-1)]
        ends = [int(v) for v in x[2].reshape(-1)]
        axes = [int(v) for v in x[3].reshape(-1)] if len(x) > 3 and x[3] is not None else None
        steps = (
            [int(v) for v in x[4].reshape(-1)]
            if len(x) > 4 and x[4] is not None
            else [1] * len(starts)
        )
    if axes is None:
        axes = list(range(len(starts)))
    index: list[slice] = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=False):
        if step == 0:
            return None
        axis = axis + data.ndim if axis < 0 else axis
        dim = data.shape[axis]
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start = min(max(start, 0), dim)
            end = min(max(end, 0), dim)
            index[axis] = slice(start, end, step)
        else:
            start = min(max(start, 0), dim - 1)
            end = min(max(end, -1), dim - 1)
            index[axis] = slice(start, end if end >= 0 else None, step)
    return [np.ascontiguousarray(data[tuple(index)])]


@_kernel("Concat")
def _concat(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    parts = [a for a in x if a is not None]
    if len(parts) != len(x) or not parts or len({a.dtype for a in parts}) != 1:
        return None
    return [np.concatenate(parts, axis=node.attributes.get_int("axis", 0))]


@_kernel("Unsqueeze")
def _unsqueeze(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    data, axes = x[0], _axes(node, x, 1)
    if data is None or axes is None:
        return None
    rank = data.ndim + len(axes)
    normalized = sorted(a + rank if a < 0 else a for a in axes)
    shape = list(data.shape)
    for axis in normalized:
        shape.insert(axis, 1)
    return [data.reshape(shape)]


@_kernel("Squeeze")
def _squeeze(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    data, axes = x[0], _axes(node, x, 1)
    if data is None:
        return None
    if axes is None:
        return [data.reshape([d for d in data.shape if d != 1])]
    normalized = {a + data.ndim if a < 0 else a for a in axes}
    if any(data.shape[a] != 1 for a in normalized):
        return None
    return [data.reshape([d for i, d in enumerate(data.shape) if i not in normalized])]


@_kernel("Cast")
def _cast(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    data = x[0]
    to = ir.DataType(node.attributes.get_int("to", 0))
    if data is None or to not in SUPPORTED_DTYPES:
        return None
    # Float -> int conversions have runtime-specific rounding of out-of-range values: leave to ORT.
    if np.issubdtype(data.dtype, np.floating) and not to.is_floating_point():
        return None
    return [data.astype(to.numpy())]


@_kernel("Reshape")
def _reshape(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    data, shape = x[0], x[1]
    if data is None or shape is None:
        return None
    allowzero = node.attributes.get_int("allowzero", 0)
    target = [int(d) for d in shape.reshape(-1)]
    if not allowzero:
        target = [data.shape[i] if d == 0 else d for i, d in enumerate(target)]
    try:
        return [data.reshape(target)]
    except ValueError:
        return None


@_kernel("Flatten")
def _flatten(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    data = x[0]
    if data is None:
        return None
    axis = node.attributes.get_int("axis", 1)
    axis = axis + data.ndim if axis < 0 else axis
    outer = int(np.prod(data.shape[:axis], dtype=np.int64))
    return [
        data.reshape(outer, -1)
        if data.size
        else data.reshape(outer, int(np.prod(data.shape[axis:])))
    ]


@_kernel("Transpose")
def _transpose(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    data = x[0]
    if data is None:
        return None
    perm = _ints(node, "perm")
    return [np.ascontiguousarray(np.transpose(data, perm))]


@_kernel("Expand")
def _expand(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    data, shape = x[0], x[1]
    if data is None or shape is None:
        return None
    try:
        target = np.broadcast_shapes(data.shape, tuple(int(d) for d in shape.reshape(-1)))
    except ValueError:
        return None
    return [np.ascontiguousarray(np.broadcast_to(data, target))]


@_kernel("Tile")
def _tile(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    data, repeats = x[0], x[1]
    if data is None or repeats is None or repeats.size != data.ndim:
        return None
    return [np.tile(data, [int(r) for r in repeats.reshape(-1)])]


@_kernel("ConstantOfShape")
def _constant_of_shape(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    shape = x[0]
    if shape is None:
        return None
    fill = constant_of_shape_fill(node)
    if fill.size != 1:
        return None
    return [np.full([int(d) for d in shape.reshape(-1)], fill[0], dtype=fill.dtype)]


@_kernel("Range")
def _range(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    start, limit, delta = x[0], x[1], x[2]
    if start is None or limit is None or delta is None or not _is_int(start, limit, delta):
        return None
    if int(delta) == 0:
        return None
    return [np.arange(int(start), int(limit), int(delta), dtype=start.dtype)]


@_kernel("Where")
def _where(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    cond, a, b = x[0], x[1], x[2]
    if cond is None or a is None or b is None or a.dtype != b.dtype:
        return None
    return [np.where(cond, a, b).astype(a.dtype)]


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    if np.any(b == 0):
        return None
    quotient = a // b
    # ONNX integer division truncates toward zero; numpy floors.
    adjust = (a % b != 0) & ((a < 0) != (b < 0))
    return np.where(adjust, quotient + 1, quotient).astype(a.dtype)


def _int_mod(node: ir.Node, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    if np.any(b == 0):
        return None
    return np.fmod(a, b) if node.attributes.get_int("fmod", 0) else np.mod(a, b)


_INT_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Equal": np.equal,
    "Less": np.less,
    "LessOrEqual": np.less_equal,
    "Greater": np.greater,
    "GreaterOrEqual": np.greater_equal,
    "And": np.logical_and,
    "Or": np.logical_or,
    "Xor": np.logical_xor,
}


@_kernel(*_INT_BINARY, "Div", "Mod")
def _int_binary(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    a, b = x[0], x[1]
    if a is None or b is None or not _is_int(a, b) or a.dtype != b.dtype:
        return None
    with np.errstate(all="ignore"):
        if node.op_type == "Div":
            result = _int_div(a, b)
        elif node.op_type == "Mod":
            result = _int_mod(node, a, b)
        else:
            result = np.asarray(_INT_BINARY[node.op_type](a, b))
            if result.dtype != np.bool_:
                result = result.astype(a.dtype)
    return None if result is None else [result]


@_kernel("Min", "Max", "Sum")
def _int_variadic(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    if not x or not _is_int(*x) or len({a.dtype for a in x if a is not None}) != 1:
        return None
    arrays = [a for a in x if a is not None]
    fn = {"Min": np.minimum, "Max": np.maximum, "Sum": np.add}[node.op_type]
    result = arrays[0]
    with np.errstate(all="ignore"):
        for other in arrays[1:]:
            result = fn(result, other)
    return [np.asarray(result).astype(arrays[0].dtype)]


@_kernel("Neg", "Abs", "Not")
def _int_unary(node: ir.Node, x: list[np.ndarray | None]) -> list[np.ndarray] | None:
    a = x[0]
    if a is None or not _is_int(a):
        return None
    fn = {"Neg": np.negative, "Abs": np.abs, "Not": np.logical_not}[node.op_type]
    with np.errstate(all="ignore"):
        return [np.asarray(fn(a)).astype(a.dtype)]


NUMPY_OPS = frozenset(_KERNELS)


def evaluate_numpy(node: ir.Node, inputs: list[np.ndarray | None]) -> list[np.ndarray] | None:
    """The node's outputs computed with numpy, or None when this node is not one numpy does exactly."""
    kernel = _KERNELS.get(node.op_type)
    if kernel is None or node.domain not in ("", "ai.onnx"):
        return None
    try:
        outputs = kernel(node, inputs)
    except (ValueError, IndexError, TypeError):
        return None
    if outputs is None or len(outputs) != len(node.outputs):
        return None
    return [np.asarray(o) for o in outputs]


# --------------------------------------------------------------------------- ONNX Runtime


class RuntimeEvaluationError(Exception):
    """ONNX Runtime could not build or run the session evaluating a batch of nodes."""


def evaluate_on_runtime(
    nodes: Sequence[ir.Node],
    feeds: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    opsets: Mapping[str, int],
    ir_version: int,
) -> dict[str, np.ndarray]:
    """Run ``nodes`` (in order, all outputs named) as one ORT session fed with ``feeds``.

    The nodes are copied into a throwaway model: the caller's graph is untouched. Constant inputs are
    fed, not embedded, so big weights are never serialized.
    """
    import onnxruntime as ort

    from onnxopt import io

    values: dict[str, ir.Value] = {}
    graph_inputs = []
    for name, array in feeds.items():
        fed = ir.Value(
            name=name,
            type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
            shape=ir.Shape(array.shape),
        )
        values[name] = fed
        graph_inputs.append(fed)
    copies = []
    for node in nodes:
        inputs: list[ir.Value | None] = []
        for value in node.inputs:
            if value is None:
                inputs.append(None)
                continue
            if value.name not in values:
                raise RuntimeEvaluationError(f"input '{value.name}' is neither fed nor computed")
            inputs.append(values[str(value.name)])
        copy = ir.Node(
            node.domain,
            node.op_type,
            inputs,
            attributes=list(node.attributes.values()),
            num_outputs=len(node.outputs),
            version=node.version,
            name=node.name,
        )
        for original, new in zip(node.outputs, copy.outputs, strict=True):
            new.name = original.name
            if original.name:
                values[original.name] = new
        copies.append(copy)
    graph = ir.Graph(
        graph_inputs,
        [values[name] for name in outputs],
        nodes=copies,
        opset_imports=dict(opsets),
        name="fold",
    )
    model = ir.Model(graph, ir_version=ir_version)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 2
    options.log_severity_level = 4
    named = ", ".join(f"{n.op_type} '{n.name}'" if n.name else n.op_type for n in nodes[:3])
    named += f" and {len(nodes) - 3} more nodes" if len(nodes) > 3 else ""
    try:
        with doing(
            f"ONNX Runtime evaluated {named} to fold them (--disable fold-constants skips it)"
        ):
            with io.ort_model_source(model) as source:
                session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
            results = session.run(list(outputs), dict(feeds))
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        raise RuntimeEvaluationError(lines[-1] if lines else type(exc).__name__) from exc
    return {name: np.asarray(array) for name, array in zip(outputs, results, strict=True)}
