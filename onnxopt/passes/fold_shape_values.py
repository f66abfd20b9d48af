"""Shape-value propagation: fold Shape -> Gather/Slice/Concat/... chains once the dims they read are static.

Every small integer vector computed from shapes is tracked element by element: an element is a known
``int``, a reference to "dim *i* of value *v*" (a symbolic dim, kept symbolic), or unknown. Tracked ops:
Shape (with start/end), Size, Gather, Slice, Concat, Unsqueeze/Squeeze, Reshape to 1-D, Cast to an
integer type, Identity, integer Add/Sub/Mul/Div/Mod, and Equal / Where (TorchScript's ``expand(-1)``
test; a dim never equals a negative int). A vector whose elements are all known ints is
replaced by an initializer, even when other dims of the same tensor are symbolic: ``Shape(x)[1]`` folds
when dim 1 is a known int.

Vectors that are equal element by element are computed once: a later value whose elements are the
same known ints and the same symbolic dims (the same value's dim, or a dim carrying the same named
symbol) as an earlier value in the same graph is replaced by that earlier value. An export that
reads ``Shape(x)[0]`` before each of its 48 Reshapes, one ``x`` per layer, keeps one read per
symbol; common-subexpression elimination then merges the Unsqueeze/Concat/Expand built on them.

A read of a dim off a view (tf2onnx reads an einsum operand's batch off its unsqueezed,
transposed copy) is read off the tensor the view is of (``_Tracker.locate``), so the views lose a
user and merge away; no further, where it could keep a Conv and its Relu, or a decomposed
LayerNorm, from fusing. Two dims are equal when they trace back to one earliest tensor's dim
(``_Tracker.upstream``: through views, shape-keeping ops and broadcasts whose operands agree on
it); the elementwise Max of a broadcast dim and one of its operands' (tf2onnx's broadcast einsum
batch) is the broadcast dim, as a broadcast of positive dims is at least each operand's.

Reshape targets that are only partly known are rewritten when provably equivalent: an element that is
dim *i* of the reshaped tensor itself (the same value's dim, or a dim with the same symbol) at position
*i* becomes 0, "copy the dim" (``allowzero=1`` becomes 0 when the target holds no literal 0); a single
remaining unknown element, with every other element a known positive int, becomes -1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxopt.ops import (
    all_graphs,
    const_tensor,
    is_onnx_domain,
    is_op,
    is_unread,
    opset_version,
    remove_nodes,
)
from onnxopt.passes._evaluate import evaluate_numpy
from onnxopt.passes.base import Pass, PassResult
from onnxopt.passes.fold_constants import ConstantPool, replace_with_initializer

MAX_ELEMENTS = 64
INT_TYPES = (ir.DataType.INT64, ir.DataType.INT32)


@dataclass(frozen=True)
class DimOf:
    """Dim ``index`` of ``value`` (a symbolic dim at the time it was read)."""

    value: ir.Value
    index: int


Elem = int | DimOf | None


@dataclass(frozen=True)
class ShapeVector:
    elements: tuple[Elem, ...]
    scalar: bool
    dtype: ir.DataType

    @property
    def ints(self) -> list[int] | None:
        if all(isinstance(e, int) for e in self.elements):
            return [int(e) for e in self.elements]  # type: ignore[arg-type]
        return None

    def array(self) -> np.ndarray:
        ints = self.ints
        assert ints is not None
        array = np.array(ints, dtype=self.dtype.numpy())
        return array.reshape(()) if self.scalar else array


def _from_constant(value: ir.Value) -> ShapeVector | None:
    if value.is_graph_input():
        return None
    try:
        tensor = const_tensor(value)
    except ValueError:
        return None
    if (
        tensor is None
        or tensor.dtype not in INT_TYPES
        or len(tensor.shape) > 1
        or tensor.size > MAX_ELEMENTS
    ):
        return None
    array = tensor.numpy()
    return ShapeVector(tuple(int(v) for v in array.reshape(-1)), array.ndim == 0, tensor.dtype)


def _ints_of(vector: ShapeVector | None) -> list[int] | None:
    return None if vector is None else vector.ints


class _Tracker:
    def __init__(self) -> None:
        self.vectors: dict[ir.Value, ShapeVector] = {}
        self.order: dict[ir.Node, int] = {}  # the visited nodes' positions
        self._upstream: dict[DimOf, DimOf] = {}
        self._nesting = 0  # broadcasts being compared, one inside the other

    def get(self, value: ir.Value | None) -> ShapeVector | None:
        if value is None:
            return None
        if value not in self.vectors:
            found = _from_constant(value)
            if found is None:
                return None
            self.vectors[value] = found
        return self.vectors[value]

    def visit(self, node: ir.Node) -> None:
        self.order.setdefault(node, len(self.order))
        if not is_onnx_domain(node.domain) or len(node.outputs) != 1:
            return
        handler = getattr(self, f"_op_{node.op_type}", None)
        if handler is None:
            return
        result = handler(node)
        if result is not None and len(result.elements) <= MAX_ELEMENTS:
            self.vectors[node.outputs[0]] = result

    def _op_Shape(self, node: ir.Node) -> ShapeVector | None:
        source = node.inputs[0]
        if source is None or source.shape is None:
            return None
        rank = len(source.shape)
        start = node.attributes.get_int("start", 0)
        end = node.attributes.get_int("end", rank)
        start = min(max(start + rank if start < 0 else start, 0), rank)
        end = min(max(end + rank if end < 0 else end, 0), rank)
        elements: list[Elem] = []
        for index in range(start, end):
            dim = source.shape[index]
            elements.append(int(dim) if isinstance(dim, int) else self.locate(source, index))
        return ShapeVector(tuple(elements), False, ir.DataType.INT64)

    def upstream(self, value: ir.Value, index: int) -> DimOf:
        """Dim ``index`` of ``value`` as the earliest value it is provably a dim of (``_step``
        after ``_step``): two dims with one upstream dim are equal."""
        start = dim = DimOf(value, index)
        if start in self._upstream:
            return self._upstream[start]
        for _ in range(_MAX_HOPS):
            after = self._step(dim)
            if after is None:
                break
            dim = after
        self._upstream[start] = dim
        return dim

    def locate(self, value: ir.Value, index: int) -> DimOf:
        """Where to read dim ``index`` of ``value``: off the tensor ``value`` is a view of (up its
        ``_step`` path through views, and through ops that scale it by a single constant).

        tf2onnx reads an einsum operand's batch off its unsqueezed, transposed copy; read off
        the tensor that copy comes from, the views lose a user and merge away. A read goes no
        further, past an op that computes: it would land on that op's input, a Conv's output
        before its Relu or a decomposed LayerNorm's mean, and keep those from fusing."""
        dim = DimOf(value, index)
        for _ in range(_MAX_HOPS):
            producer = dim.value.producer()
            if producer is None or not _viewing(producer):
                break
            after = self._step(dim)
            if after is None or not _named(after):
                break  # an unnamed dim there would lose what shape inference knows here
            dim = after
        return dim

    def _step(self, dim: DimOf) -> DimOf | None:
        """The same dim one op up: through Identity, Transposes, Unsqueezes, Squeezes and
        shape-keeping ops, a Reshape whose target entry reads it off a dim (that dim) or copies
        it with 0, and a broadcasting op (MatMul's batch axes too) whose operands that reach the
        axis with a dim other than 1 all have that one dim (the earliest of them)."""
        value, index = dim.value, dim.index
        node = value.producer()
        if node is None or not is_onnx_domain(node.domain) or not node.inputs:
            return None
        source = node.inputs[0]
        if source is None or source.shape is None or value.shape is None:
            return None
        rank, inner = len(value.shape), len(source.shape)
        moved: int | None = None
        if node.op_type in _SAME_SHAPE and inner == rank:
            moved = index
        elif node.op_type == "Transpose":
            perm = node.attributes.get_ints("perm", list(range(rank))[::-1])
            moved = int(perm[index]) if len(perm) == rank else None
        elif node.op_type in ("Unsqueeze", "Squeeze"):
            moved = _through_axes(node, index, rank, inner)
        elif node.op_type == "Reshape" and "shape" not in node.attributes:
            target = self.get(node.inputs[1]) if len(node.inputs) > 1 else None
            element = (
                target.elements[index]
                if target is not None and index < len(target.elements)
                else None
            )
            if isinstance(element, DimOf):
                return element
            copies = element == 0 and not node.attributes.get_int("allowzero", 0)
            moved = index if copies and index < inner else None
        elif node.op_type in _BROADCASTING or (node.op_type == "MatMul" and index < rank - 2):
            return self._broadcast_dim(node, index, rank)
        return None if moved is None else DimOf(source, moved)

    def equal_dims(self, first: DimOf, second: DimOf) -> bool:
        """One dim: with one upstream dim, or two dims under one name (see ``_same_dim``)."""
        if first == second or _same_dim(first, second.value, second.index):
            return True
        up_first = self.upstream(first.value, first.index)
        up_second = self.upstream(second.value, second.index)
        return up_first == up_second or _same_dim(up_first, up_second.value, up_second.index)

    def _broadcast_dim(self, node: ir.Node, index: int, rank: int) -> DimOf | None:
        """The operand dim every operand reaching axis ``index`` with a size other than 1 has
        (the earliest such operand's), if one."""
        if self._nesting >= _MAX_NESTING:
            return None
        self._nesting += 1
        try:
            return self._common_operand_dim(node, index, rank)
        finally:
            self._nesting -= 1

    def _common_operand_dim(self, node: ir.Node, index: int, rank: int) -> DimOf | None:
        found: DimOf | None = None
        for operand in node.inputs:  # Where's condition broadcasts into the result too
            if operand is None or operand.shape is None:
                return None
            axis = index + len(operand.shape) - rank
            if axis < 0 or (node.op_type == "MatMul" and len(operand.shape) < 3):
                continue
            dim = operand.shape[axis]
            if dim == 1:
                continue
            if isinstance(dim, int):
                return None
            here = DimOf(operand, axis)
            if found is not None and not self.equal_dims(here, found):
                return None
            if found is None or self._position(here) < self._position(found):
                found = here
        return found

    def _position(self, dim: DimOf) -> int:
        producer = dim.value.producer()
        return -1 if producer is None else self.order.get(producer, len(self.order))

    def _op_Max(self, node: ir.Node) -> ShapeVector | None:
        """Elementwise max of shape vectors: of equal elements, that element; of a broadcast
        result's dim and one of its operands' (tf2onnx's einsum batch), the result's, as any
        broadcast of positive dims that ran is at least as large as each of its operands."""
        pick = max if node.op_type == "Max" else min

        def extreme(x: Elem, y: Elem) -> Elem:
            if isinstance(x, int) and isinstance(y, int):
                return pick(x, y)
            if not isinstance(x, DimOf) or not isinstance(y, DimOf):
                return None
            if self.equal_dims(x, y):
                return x
            return (self._covering(x, y) or self._covering(y, x)) if pick is max else None

        return self._elementwise(node, extreme)

    _op_Min = _op_Max

    def _covering(self, result: DimOf, other: DimOf) -> DimOf | None:
        """``result`` when it is a broadcast dim one of whose operands' dims is ``other``."""
        broadcast = self.upstream(result.value, result.index)
        node = broadcast.value.producer()
        if node is None or not is_onnx_domain(node.domain) or broadcast.value.shape is None:
            return None
        rank = len(broadcast.value.shape)
        if node.op_type not in _BROADCASTING and not (
            node.op_type == "MatMul" and broadcast.index < rank - 2
        ):
            return None
        for operand in node.inputs:
            if operand is None or operand.shape is None:
                continue
            axis = broadcast.index + len(operand.shape) - rank
            if axis >= 0 and self.equal_dims(self.upstream(operand, axis), other):
                return result
        return None

    def _op_Size(self, node: ir.Node) -> ShapeVector | None:
        source = node.inputs[0]
        if (
            source is None
            or source.shape is None
            or not all(isinstance(d, int) for d in source.shape)
        ):
            return None
        return ShapeVector(
            (int(np.prod(source.shape.numpy(), dtype=np.int64)),), True, ir.DataType.INT64
        )

    def _op_Identity(self, node: ir.Node) -> ShapeVector | None:
        return self.get(node.inputs[0])

    def _op_Cast(self, node: ir.Node) -> ShapeVector | None:
        source = self.get(node.inputs[0])
        to = next((t for t in INT_TYPES if t.value == node.attributes.get_int("to", 0)), None)
        if source is None or to is None:
            return None
        if any(isinstance(e, int) and not _fits(e, to) for e in source.elements):
            return None
        return ShapeVector(source.elements, source.scalar, to)

    def _op_Gather(self, node: ir.Node) -> ShapeVector | None:
        data = self.get(node.inputs[0])
        indices = self.get(node.inputs[1]) if len(node.inputs) > 1 else None
        positions = _ints_of(indices)
        if data is None or data.scalar or indices is None or positions is None:
            return None
        if node.attributes.get_int("axis", 0) not in (0, -1):
            return None
        size = len(data.elements)
        if any(not -size <= p < size for p in positions):
            return None
        picked = tuple(data.elements[p] for p in positions)
        return ShapeVector(picked, indices.scalar, data.dtype)

    def _op_Slice(self, node: ir.Node) -> ShapeVector | None:
        data = self.get(node.inputs[0])
        if data is None or data.scalar:
            return None
        arrays: list[np.ndarray | None] = [np.arange(len(data.elements), dtype=np.int64)]
        for value in node.inputs[1:]:
            if value is None:
                arrays.append(None)
                continue
            ints = _ints_of(self.get(value))
            if ints is None:
                return None
            arrays.append(np.array(ints, dtype=np.int64))
        result = evaluate_numpy(node, arrays)
        if result is None:
            return None
        return ShapeVector(tuple(data.elements[int(i)] for i in result[0]), False, data.dtype)

    def _op_Concat(self, node: ir.Node) -> ShapeVector | None:
        if node.attributes.get_int("axis", 0) not in (0, -1):
            return None
        parts = [self.get(v) for v in node.inputs]
        elements: list[Elem] = []
        dtypes = set()
        for part in parts:
            if part is None or part.scalar:
                return None
            elements.extend(part.elements)
            dtypes.add(part.dtype)
        if len(dtypes) != 1:
            return None
        return ShapeVector(tuple(elements), False, dtypes.pop())

    def _axes(self, node: ir.Node) -> list[int] | None:
        attr = node.attributes.get("axes")
        if attr is not None:
            return list(attr.as_ints())
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            return _ints_of(self.get(node.inputs[1]))
        return None

    def _op_Unsqueeze(self, node: ir.Node) -> ShapeVector | None:
        source = self.get(node.inputs[0])
        if source is None or not source.scalar or self._axes(node) not in ([0], [-1]):
            return None
        return ShapeVector(source.elements, False, source.dtype)

    def _op_Squeeze(self, node: ir.Node) -> ShapeVector | None:
        source = self.get(node.inputs[0])
        axes = self._axes(node)
        if source is None or source.scalar or len(source.elements) != 1:
            return None
        if axes is not None and axes not in ([0], [-1]):
            return None
        return ShapeVector(source.elements, True, source.dtype)

    def _op_Reshape(self, node: ir.Node) -> ShapeVector | None:
        source = self.get(node.inputs[0])
        target = _ints_of(self.get(node.inputs[1])) if len(node.inputs) > 1 else None
        if source is None or target is None:
            return None
        count = len(source.elements)
        if target == []:
            return ShapeVector(source.elements, True, source.dtype) if count == 1 else None
        if len(target) == 1 and target[0] in (-1, count):
            return ShapeVector(source.elements, False, source.dtype)
        return None

    def _elementwise(
        self,
        node: ir.Node,
        combine: Callable[[Elem, Elem], Elem],
        dtype: ir.DataType | None = None,
    ) -> ShapeVector | None:
        """A binary op on two tracked vectors of one dtype, element by element."""
        if len(node.inputs) != 2:
            return None
        a, b = self.get(node.inputs[0]), self.get(node.inputs[1])
        operands = self._broadcast(node.inputs[0], node.inputs[1])
        if a is None or b is None or a.dtype != b.dtype or operands is None:
            return None
        out = tuple(combine(x, y) for x, y in zip(*operands, strict=True))
        return ShapeVector(out, a.scalar and b.scalar, dtype or a.dtype)

    def _binary(self, node: ir.Node) -> ShapeVector | None:
        first = self.get(node.inputs[0]) if node.inputs else None
        dtype = first.dtype if first is not None else None

        def arithmetic(x: Elem, y: Elem) -> Elem:
            result = _combine(node.op_type, x, y)
            # A result past the dtype's range is whatever the runtime's wrap-around makes it.
            fits = not isinstance(result, int) or dtype is None or _fits(result, dtype)
            return result if fits else None

        return self._elementwise(node, arithmetic)

    _op_Add = _op_Sub = _op_Mul = _op_Mod = _binary

    def _op_Div(self, node: ir.Node) -> ShapeVector | None:
        """Integer division; and a merged dim divided by one of the dims merged into it:
        TorchScript's DeBERTa repeats a [B*H, S, d] tensor's ``size(0) // H`` times, B."""
        found = self._binary(node)
        if found is None or None not in found.elements:
            return found
        # both operands are tracked vectors of one dtype, or _binary would have found nothing
        operands = self._broadcast(node.inputs[0], node.inputs[1])
        assert operands is not None
        elements = tuple(
            self._merged_quotient(x, y)
            if z is None and isinstance(x, DimOf) and isinstance(y, int)
            else z
            for x, y, z in zip(*operands, found.elements, strict=True)
        )
        return ShapeVector(elements, found.scalar, found.dtype)

    def _merged_quotient(self, dim: DimOf, divisor: int) -> Elem:
        """``dim`` / ``divisor`` where ``dim`` is the -1 of a Reshape of X: every other dim of the
        result equals a distinct dim of X, so the -1 is the product of X's dims left over; when
        those are ``divisor`` times one dim, the quotient is that dim (or a number, all static)."""
        node = dim.value.producer()
        if node is None or not is_op(node, "Reshape") or len(node.inputs) < 2 or divisor <= 0:
            return None
        source, target = node.inputs[0], self.get(node.inputs[1])
        shape = dim.value.shape
        if source is None or source.shape is None or shape is None or target is None:
            return None
        if len(target.elements) != len(shape) or target.elements[dim.index] != -1:
            return None
        left = list(range(len(source.shape)))
        for axis in range(len(shape)):
            if axis == dim.index:
                continue
            match = next((i for i in left if self._same_size(source, i, dim.value, axis)), None)
            if match is None:
                return None
            left.remove(match)
        static = int(np.prod([d for i in left if isinstance(d := source.shape[i], int)]))
        symbolic = [i for i in left if not isinstance(source.shape[i], int)]
        if static % divisor:
            return None
        static //= divisor
        if not symbolic:
            return static
        if len(symbolic) == 1 and static == 1:
            return self.locate(source, symbolic[0])
        return None

    def _same_size(self, first: ir.Value, i: int, second: ir.Value, j: int) -> bool:
        """Dim ``i`` of ``first`` and dim ``j`` of ``second`` are provably one size."""
        assert first.shape is not None and second.shape is not None
        a, b = first.shape[i], second.shape[j]
        if isinstance(a, int) or isinstance(b, int):
            return a == b
        if a.value is None or b.value is None:
            return False
        return self.equal_dims(DimOf(first, i), DimOf(second, j))

    def _broadcast(self, *values: ir.Value | None) -> list[tuple[Elem, ...]] | None:
        """The operands' elements, one-element vectors repeated to the common length."""
        vectors = [self.get(v) for v in values]
        if any(v is None for v in vectors):
            return None
        lengths = {len(v.elements) for v in vectors if v is not None} - {1}
        if len(lengths) > 1:
            return None
        size = lengths.pop() if lengths else 1
        return [
            v.elements * size if len(v.elements) == 1 else v.elements
            for v in vectors
            if v is not None
        ]

    def _op_Equal(self, node: ir.Node) -> ShapeVector | None:
        """TorchScript's ``expand(-1)`` handling compares the target with -1: a dim never is."""

        def equal(x: Elem, y: Elem) -> Elem:
            if isinstance(x, int) and isinstance(y, int):
                return int(x == y)
            if isinstance(x, DimOf) and isinstance(y, DimOf) and x == y:
                return 1
            if (isinstance(x, DimOf) and isinstance(y, int) and y < 0) or (
                isinstance(y, DimOf) and isinstance(x, int) and x < 0
            ):
                return 0
            return None

        return self._elementwise(node, equal, ir.DataType.BOOL)

    def _op_Where(self, node: ir.Node) -> ShapeVector | None:
        cond, x, y = (self.get(v) for v in node.inputs[:3])
        operands = self._broadcast(*node.inputs[:3])
        if cond is None or x is None or y is None or operands is None:
            return None
        if cond.dtype != ir.DataType.BOOL or x.dtype != y.dtype:
            return None
        out: list[Elem] = []
        for c, a, b in zip(*operands, strict=True):
            if isinstance(c, int):
                out.append(a if c else b)
            else:
                out.append(a if a == b and a is not None else None)
        return ShapeVector(tuple(out), cond.scalar and x.scalar and y.scalar, x.dtype)


# Ops whose result has their first input's shape.
_SAME_SHAPE = frozenset(
    {"Identity", "Cast", "Softmax", "LogSoftmax", "Relu", "Neg", "Abs", "Sqrt", "Exp", "Log",
     "Erf", "Tanh", "Sigmoid", "Reciprocal", "Not", "Sin", "Cos", "Gelu", "LeakyRelu", "Elu",
     "HardSigmoid", "Softplus", "Floor", "Ceil", "Round", "Sign", "IsNaN", "IsInf"}
)  # fmt: skip
_BROADCASTING = frozenset(
    {"Add", "Sub", "Mul", "Div", "Pow", "Where", "And", "Or", "Equal", "Max", "Min"}
)
_MAX_HOPS = 64
_VIEWS = frozenset({"Identity", "Transpose", "Unsqueeze", "Squeeze", "Reshape"})
_MAX_NESTING = 16


def _named(dim: DimOf) -> bool:
    shape = dim.value.shape
    found = shape[dim.index] if shape is not None and dim.index < len(shape) else None
    return isinstance(found, ir.SymbolicDim) and found.value is not None


def _viewing(node: ir.Node) -> bool:
    """A view of its first input, or its first input scaled or shifted by one constant."""
    if node.op_type in _VIEWS:
        return True
    if node.op_type not in ("Mul", "Div", "Add", "Sub") or len(node.inputs) != 2:
        return False
    other = node.inputs[1]
    return other is not None and other.const_value is not None and other.const_value.size == 1


def _through_axes(node: ir.Node, index: int, rank: int, inner: int) -> int | None:
    """The input axis an Unsqueeze's or Squeeze's output axis ``index`` comes from."""
    attr = node.attributes.get("axes")
    if attr is not None:
        axes: tuple[int, ...] | None = tuple(attr.as_ints())
    else:
        array = _from_constant(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] else None
        axes = tuple(array.ints) if array is not None and array.ints is not None else None
    if axes is None:
        return None
    wide = rank if node.op_type == "Unsqueeze" else inner
    taken = {a + wide if a < 0 else a for a in axes}
    if node.op_type == "Unsqueeze":
        return None if index in taken else index - sum(a < index for a in taken)
    kept = [axis for axis in range(inner) if axis not in taken]
    return kept[index] if index < len(kept) else None


def _fits(value: int, dtype: ir.DataType) -> bool:
    bits = 8 * dtype.itemsize
    return -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)


def _combine(op: str, x: Elem, y: Elem) -> Elem:
    if isinstance(x, int) and isinstance(y, int):
        if op == "Add":
            return x + y
        if op == "Sub":
            return x - y
        if op == "Mul":
            return x * y
        if y == 0:
            return None
        if op == "Div":
            quotient = abs(x) // abs(y)
            return quotient if (x >= 0) == (y > 0) else -quotient
        return x % y  # Mod with fmod=0 on ints follows the divisor's sign, like Python
    if op == "Sub" and isinstance(x, DimOf) and x == y:
        return 0  # key_length - query_length of one sequence (GPT-Neo's causal buffer slice)
    if op in ("Mul", "Div") and y == 1:
        return x
    if op == "Mul" and x == 1:
        return y
    if op in ("Add", "Sub") and y == 0:
        return x
    if op == "Add" and x == 0:
        return y
    return None


class FoldShapeValuesPass(Pass):
    """Fold shape computations whose dims are statically known; symbolic dims stay symbolic."""

    name = "fold-shape-values"
    summary = "fold Shape->Gather/Slice/Concat chains on static dims; 0/-1 in partly known Reshape targets"

    def call(self, model: ir.Model) -> PassResult:
        stats: Counter[str] = Counter()
        tracker = _Tracker()
        pool = ConstantPool(model)
        graphs = all_graphs(model)
        for graph in graphs:
            for node in graph:
                tracker.visit(node)
        opset = opset_version(model.graph) or 0
        for graph in graphs:
            stats["shape values computed in int64 again"] += _rebuild_round_trips(
                graph, tracker, pool, opset
            ) + _widen_round_trips(graph, tracker, pool)
            stats["dims read off the tensor they come from"] += _rebuild_moved_reads(
                graph, tracker, pool, opset
            )
        # Fold fully known vectors that something still reads, nearest the consumers.
        for graph in graphs:
            for node in list(graph):
                value = node.outputs[0] if len(node.outputs) == 1 else None
                vector = tracker.vectors.get(value) if value is not None else None
                if (
                    value is None
                    or vector is None
                    or vector.ints is None
                    or node.op_type == "Constant"
                ):
                    continue
                if (
                    all(_is_folded(use.node, tracker) for use in value.uses())
                    and not value.is_graph_output()
                ):
                    continue  # an intermediate: its consumer gets folded instead
                if not value.uses() and not value.is_graph_output():
                    continue
                replace_with_initializer(value, vector.array(), pool)
                stats["shape values folded"] += 1
            for node in list(graph):
                if (
                    is_onnx_domain(node.domain)
                    and node.op_type == "Reshape"
                    and _rewrite_reshape(node, tracker, pool)
                ):
                    stats["Reshape targets made constant"] += 1
                elif is_op(node, "Expand") and _rewrite_expand(node, tracker, pool, opset):
                    stats["Expand target dims the input has made 1"] += 1
            stats["shape values shared"] += _share_equal_vectors(graph, tracker)
        stats = +stats  # drop zero counts
        if stats:
            _remove_dead_producers(graphs)
        return PassResult(model, modified=bool(stats), stats=stats)


def _rebuild_round_trips(graph: ir.Graph, tracker: _Tracker, pool: ConstantPool, opset: int) -> int:
    """Compute an int64 vector that was cast back from another integer type again in int64, from
    the dims it reads, when every element is known: tf2onnx computes shapes in int32, as
    TensorFlow does, ``Cast(Concat(Slice(Cast(Shape(x), int32), [0], [1]), [4, 64]), int64)``,
    which becomes ``Concat(Shape(x, 0, 1), [4, 64])``. The readers of Reshape targets (the
    attention fusions, the rules that drop views) know that form. Exact for dims below 2**31, as
    the tracker already reads a Cast of a dim to int32 as that dim."""
    rebuilt = 0
    for node in list(graph):
        if not is_onnx_domain(node.domain) or node.op_type != "Cast":
            continue
        source = node.inputs[0]
        vector = _dims_vector(tracker, node.outputs[0])
        if vector is None or source is None or source.dtype in (None, ir.DataType.INT64):
            continue
        _rebuild(node, vector, tracker, pool, opset)
        rebuilt += 1
    return rebuilt


def _rebuild(
    node: ir.Node, vector: ShapeVector, tracker: _Tracker, pool: ConstantPool, opset: int
) -> None:
    """Replace ``node``'s output by the int64 vector ``vector`` read from the dims it names."""
    node.outputs[0].replace_all_uses_with(_build_vector(node, vector, tracker, pool, opset))


def _build_vector(
    node: ir.Node, vector: ShapeVector, tracker: _Tracker, pool: ConstantPool, opset: int
) -> ir.Value:
    """The int64 vector ``vector`` read from the dims it names, computed just before ``node``."""
    graph = node.graph
    assert graph is not None
    nodes: list[ir.Node] = []
    pieces = [_piece_value(run, graph, pool, opset, nodes) for run in _runs(vector.elements)]
    if len(pieces) > 1:
        nodes.append(ir.node("Concat", pieces, {"axis": 0}))
        pieces = [nodes[-1].outputs[0]]
    if vector.scalar:
        if opset >= 13:
            axes = pool.add_initializer(graph, "shape_part", np.array([0], dtype=np.int64))
            nodes.append(ir.node("Squeeze", [pieces[0], axes]))
        else:
            nodes.append(ir.node("Squeeze", [pieces[0]], {"axes": [0]}))
        pieces = [nodes[-1].outputs[0]]
    graph.insert_before(node, nodes)
    for made in nodes:
        made.outputs[0].dtype = ir.DataType.INT64
        tracker.visit(made)
    return pieces[0]


def _rebuild_moved_reads(graph: ir.Graph, tracker: _Tracker, pool: ConstantPool, opset: int) -> int:
    """Read dims off the tensor they come from (``_Tracker.locate``): ``Gather(Shape(v), [0, 1])``
    of a ``v = Transpose(Unsqueeze(x))`` becomes ``Shape(x, 0, 1)``-style reads of x, so that
    the views between x and v have no other user than the op they feed. So does a
    ``Shape(v, start, end)`` that reads one run of x's dims, and a Max of shape vectors the
    tracker resolved."""
    rebuilt = 0
    for node in list(graph):
        if not is_onnx_domain(node.domain) or node.op_type not in _REREAD:
            continue
        vector = _dims_vector(tracker, node.outputs[0], scalar=node.op_type == "Div")
        if vector is None:
            continue
        if node.op_type in ("Max", "Min", "Div", "Where"):
            pass  # resolved: its dims (a Div: the part of a merged dim), read directly
        elif node.op_type == "Shape":
            runs = _runs(vector.elements)
            first = runs[0][0] if len(runs) == 1 else None
            if not isinstance(first, DimOf) or first.value is node.inputs[0]:
                continue
            whole = first.index == 0 and len(runs[0]) == len(first.value.shape or ())
            if opset < 15 and not whole:
                continue  # one read for another, never a Slice more
        else:
            read = node.inputs[0].producer() if node.inputs[0] is not None else None
            if read is None or not is_op(read, "Shape"):
                continue
            if all(not isinstance(e, DimOf) or e.value is read.inputs[0] for e in vector.elements):
                continue
        _rebuild(node, vector, tracker, pool, opset)
        rebuilt += 1
    return rebuilt


_REREAD = frozenset({"Gather", "Slice", "Shape", "Max", "Min", "Div", "Where"})


def _dims_vector(tracker: _Tracker, value: ir.Value, scalar: bool = False) -> ShapeVector | None:
    """The tracked int64 vector of ``value`` when it can be rebuilt from the dims it reads: a
    scalar only where ``scalar`` is set, not all constant, every element known, and ``value``
    not a graph output."""
    vector = tracker.vectors.get(value)
    if (
        vector is None
        or (vector.scalar and not scalar)
        or vector.ints is not None
        or vector.dtype != ir.DataType.INT64
        or value.is_graph_output()
        or any(e is None for e in vector.elements)
    ):
        return None
    return vector


# Ops an int32 shape computation may go through to be redone in int64, and which of their inputs
# carry the data (the others, axes and bounds, take either integer type).
_WIDENED_DATA_INPUTS: dict[str, tuple[int, ...] | None] = {
    "Slice": (0,),
    "Gather": (0,),
    "Squeeze": (0,),
    "Unsqueeze": (0,),
    "Reshape": (0,),
    "Identity": (0,),
    "Concat": None,  # every input
    "Add": None,
    "Sub": None,
    "Mul": None,
    "Div": None,
    "Max": None,
    "Min": None,
}
_MAX_WIDENED = 32


def _widen_round_trips(graph: ir.Graph, tracker: _Tracker, pool: ConstantPool) -> int:
    """Redo in int64 an int32 shape computation that is cast back to int64, when it starts from
    dims cast to int32 and int32 constants: ``Cast(Concat(Unsqueeze(Squeeze(Slice(Cast(Shape(x),
    int32))) * 4), [-1, 64]), int64)`` (tf2onnx's [B*H, -1, d] target, fairseq-style attention)
    becomes the same ops on ``Shape(x)`` and int64 constants, which the attention fusions read.
    The int32 ops stay for other readers (a Range). Exact while every value fits in int32, as it
    must for the original to compute the shape it meant."""
    widened: dict[ir.Value, ir.Value] = {}
    count = 0
    for node in list(graph):
        if not is_onnx_domain(node.domain) or node.op_type != "Cast":
            continue
        value, source = node.outputs[0], node.inputs[0]
        if (
            value.dtype != ir.DataType.INT64
            or source is None
            or source.dtype != ir.DataType.INT32
            or value.is_graph_output()
            or not value.uses()
        ):
            continue
        cone = _int32_cone(source, tracker, graph)
        if cone is None:
            continue
        made = _widen(source, cone, graph, pool, widened)
        value.replace_all_uses_with(made)
        count += 1
    return count


def _int32_cone(value: ir.Value, tracker: _Tracker, graph: ir.Graph) -> list[ir.Node] | None:
    """The int32 ops computing ``value`` from dims cast to int32 and constants (producers first),
    or None when something else feeds it, the cone is large or reaches outside ``graph`` (a
    subgraph's Cast of an outer scope's shape arithmetic: the int64 twins would have to go there)."""
    order: list[ir.Node] = []
    seen: set[ir.Value] = set()
    stack = [value]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if _from_constant(current) is not None:
            continue
        node = current.producer()
        if node is None or not is_onnx_domain(node.domain) or len(node.outputs) != 1:
            return None
        if node.graph is not graph:
            return None
        inner = node.inputs[0] if node.inputs else None
        if (
            node.op_type == "Cast"
            and inner is not None
            and inner.dtype == ir.DataType.INT64
            and tracker.get(inner) is not None
            and all(e is not None for e in tracker.vectors[inner].elements)
        ):
            order.append(node)  # a dim (or dims) cast to int32: read in int64 as it was
            continue
        if node.op_type not in _WIDENED_DATA_INPUTS or current.dtype != ir.DataType.INT32:
            return None
        data = _WIDENED_DATA_INPUTS[node.op_type]
        indices = range(len(node.inputs)) if data is None else data
        stack.extend(v for i, v in enumerate(node.inputs) if i in indices and v is not None)
        order.append(node)
        if len(order) > _MAX_WIDENED:
            return None
    return order


def _widen(
    value: ir.Value,
    cone: list[ir.Node],
    graph: ir.Graph,
    pool: ConstantPool,
    widened: dict[ir.Value, ir.Value],
) -> ir.Value:
    """The int64 twin of ``value`` (an output of ``cone``), made once per value."""
    if value in widened:
        return widened[value]
    constant = _from_constant(value)
    if constant is not None:
        made = pool.add_initializer(graph, "shape_part", constant.array().astype(np.int64))
    else:
        node = value.producer()
        assert node is not None and node in cone
        if node.op_type == "Cast":
            inner = node.inputs[0]
            assert inner is not None
            made = inner
        else:
            data = _WIDENED_DATA_INPUTS[node.op_type]
            inputs = [
                _widen(v, cone, graph, pool, widened)
                if v is not None and (data is None or i in data)
                else v
                for i, v in enumerate(node.inputs)
            ]
            twin = ir.Node(node.domain, node.op_type, inputs, list(node.attributes.values()))
            twin.outputs[0].dtype = ir.DataType.INT64
            graph.insert_after(node, twin)
            made = twin.outputs[0]
    widened[value] = made
    return made


def _runs(elements: tuple[Elem, ...]) -> list[list[Elem]]:
    """The elements in runs: known ints together, and consecutive dims of one value."""
    runs: list[list[Elem]] = []
    for element in elements:
        last = runs[-1][-1] if runs else None
        both_ints = isinstance(element, int) and isinstance(last, int)
        next_dim = (
            isinstance(element, DimOf)
            and isinstance(last, DimOf)
            and last.value is element.value
            and last.index + 1 == element.index
        )
        if both_ints or next_dim:
            runs[-1].append(element)
        else:
            runs.append([element])
    return runs


def _piece_value(
    run: list[Elem], graph: ir.Graph, pool: ConstantPool, opset: int, nodes: list[ir.Node]
) -> ir.Value:
    """A 1-D int64 value of one run: a constant, or the dims [start, end) of one value read as
    ``Shape(v, start, end)`` (opset 15+) or a Slice of its whole Shape."""
    first = run[0]
    if not isinstance(first, DimOf):
        array = np.array([int(e) for e in run if isinstance(e, int)], dtype=np.int64)
        return pool.add_initializer(graph, "shape_part", array)
    start, end = first.index, first.index + len(run)
    rank = len(first.value.shape) if first.value.shape is not None else None
    if opset >= 15:
        attributes = {} if start == 0 and end == rank else {"start": start, "end": end}
        nodes.append(ir.node("Shape", [first.value], attributes))
        return nodes[-1].outputs[0]
    nodes.append(ir.node("Shape", [first.value]))
    if start == 0 and end == rank:
        return nodes[-1].outputs[0]
    whole = nodes[-1].outputs[0]
    if opset < 10:
        nodes.append(ir.node("Slice", [whole], {"starts": [start], "ends": [end], "axes": [0]}))
    else:
        bounds = [
            pool.add_initializer(graph, "shape_part", np.array([v], dtype=np.int64))
            for v in (start, end, 0)
        ]
        nodes.append(ir.node("Slice", [whole, *bounds]))
    return nodes[-1].outputs[0]


def _is_folded(node: ir.Node, tracker: _Tracker) -> bool:
    if len(node.outputs) != 1 or node.op_type == "Constant":
        return False
    vector = tracker.vectors.get(node.outputs[0])
    return vector is not None and vector.ints is not None


def _same_dim(element: DimOf, data: ir.Value, index: int) -> bool:
    """Whether ``element`` is provably dim ``index`` of ``data``: the same value's same dim, or a dim
    carrying the same symbol (ONNX shape inference gives one symbol to dims it proves equal, and a
    model's inputs declare equal dims with one name)."""
    if element.value is data:
        return element.index == index
    if data.shape is None or index >= len(data.shape) or element.value.shape is None:
        return False
    mine = data.shape[index]
    theirs = element.value.shape[element.index]
    return (
        isinstance(mine, ir.SymbolicDim)
        and isinstance(theirs, ir.SymbolicDim)
        and mine.value is not None
        and mine.value == theirs.value
    )


def _rewrite_reshape(node: ir.Node, tracker: _Tracker, pool: ConstantPool) -> bool:
    data = node.inputs[0]
    target_value = node.inputs[1] if len(node.inputs) > 1 else None
    if data is None or target_value is None:
        return False
    allowzero = node.attributes.get_int("allowzero", 0) != 0
    target = tracker.get(target_value)
    if (
        target is None
        or target.scalar
        or target.ints is not None
        or target_value.const_value is not None
    ):
        return False
    if allowzero and any(isinstance(e, int) and e == 0 for e in target.elements):
        return False  # a literal 0 means "zero" here and "copy" without allowzero
    elements: list[int | None] = []
    for index, element in enumerate(target.elements):
        if isinstance(element, int):
            elements.append(element)
        elif isinstance(element, DimOf) and _same_dim(element, data, index):
            elements.append(0)
        else:
            elements.append(None)
    unknown = [i for i, e in enumerate(elements) if e is None]
    if len(unknown) > 1:
        return False
    if unknown:
        others = [e for i, e in enumerate(elements) if i != unknown[0]]
        if any(e is None or e <= 0 for e in others):
            return False  # -1 is exact only when every other dim is a known positive size
        elements[unknown[0]] = -1
    array = np.array(elements, dtype=np.int64)
    graph = node.graph
    assert graph is not None
    constant = pool.add_initializer(graph, f"{target_value.name or 'shape'}_static", array)
    node.replace_input_with(1, constant)
    if allowzero and 0 in elements:
        # Copy dims need allowzero=0. Equivalent: no literal 0 was in the target, and a copied dim
        # that is 0 at run time was a literal 0 before, which allowzero=1 kept as 0 too.
        node.attributes["allowzero"] = ir.AttrInt64("allowzero", 0)
    return True


def _rewrite_expand(node: ir.Node, tracker: _Tracker, pool: ConstantPool, opset: int) -> bool:
    """An Expand target entry that reads the dim the input already has there becomes 1, which
    broadcasting turns into that dim: TorchScript's padding mask ``mask[:, None, None, :]
    .expand(B, 1, S, S)`` reads B off the hidden states, and once it is 1 that read dies.

    Only where a read dies: a Concat piece of the target that a Shape reads for this target
    alone, every entry of it the input's own dim. Elsewhere the entry stays, as the dims a target
    names are what the matchers after (index grids, masks) read the expanded shape from."""
    data, target_value = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    graph = node.graph
    if data is None or data.shape is None or target_value is None or graph is None:
        return False
    target = _dims_vector(tracker, target_value)
    concat = target_value.producer()
    if (
        target is None
        or concat is None
        or not is_op(concat, "Concat")
        or len(target_value.uses()) != 1
    ):
        return False
    offset = len(target.elements) - len(data.shape)
    elements = list(target.elements)
    start = 0
    for piece in concat.inputs:
        part = tracker.get(piece)
        if piece is None or part is None:
            return False
        span = range(start, start + len(part.elements))
        start = span.stop
        read = piece.producer()
        if read is None or not is_op(read, "Shape") or len(piece.uses()) != 1:
            continue
        if all(_own_dim(tracker, elements[index], data, index - offset) for index in span):
            elements[span.start : span.stop] = [1] * len(span)
    if elements == list(target.elements) or start != len(elements):
        return False
    vector = ShapeVector(tuple(elements), False, target.dtype)
    if vector.ints is not None:
        made = pool.add_initializer(graph, f"{target_value.name or 'shape'}_static", vector.array())
    else:
        made = _build_vector(node, vector, tracker, pool, opset)
    node.replace_input_with(1, made)
    return True


def _own_dim(tracker: _Tracker, element: Elem, data: ir.Value, axis: int) -> bool:
    """``element`` is dim ``axis`` of ``data``, a symbolic dim."""
    return (
        isinstance(element, DimOf)
        and data.shape is not None
        and 0 <= axis < len(data.shape)
        and not isinstance(data.shape[axis], int)
        and tracker.equal_dims(element, DimOf(data, axis))
    )


Key = tuple[int | str | tuple[int, int], ...]


def _vector_key(vector: ShapeVector, ids: dict[ir.Value, int]) -> tuple[Key, bool, int] | None:
    """What the vector computes, independent of which tensor it read: known ints and named symbols
    as themselves, an unnamed symbolic dim as (that value, that dim). None when an element is
    unknown."""
    key: list[int | str | tuple[int, int]] = []
    for element in vector.elements:
        if isinstance(element, int):
            key.append(element)
        elif isinstance(element, DimOf):
            shape = element.value.shape
            dim = shape[element.index] if shape is not None else None
            if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
                key.append(dim.value)
            else:
                key.append((ids.setdefault(element.value, len(ids)), element.index))
        else:
            return None
    return tuple(key), vector.scalar, int(vector.dtype)


def _share_equal_vectors(graph: ir.Graph, tracker: _Tracker) -> int:
    """Replace each computed shape vector by the first one in ``graph`` that computes the same
    elements (nodes are in topological order, so the first is defined before every later use)."""
    first: dict[tuple[Key, bool, int], ir.Value] = {}
    ids: dict[ir.Value, int] = {}
    shared = 0
    for node in list(graph):
        if len(node.outputs) != 1 or node.op_type == "Constant":
            continue
        value = node.outputs[0]
        vector = tracker.vectors.get(value)
        if vector is None or vector.ints is not None:
            continue  # fully known vectors are folded to initializers instead
        key = _vector_key(vector, ids)
        if key is None:
            continue
        earlier = first.setdefault(key, value)
        if earlier is value or value.is_graph_output() or not value.uses():
            continue
        value.replace_all_uses_with(earlier)
        shared += 1
    return shared


def _remove_dead_producers(graphs: list[ir.Graph]) -> None:
    """Remove nodes left without users by folding (pure ops only: the ones this pass tracks)."""
    for graph in reversed(graphs):
        for node in reversed(list(graph)):
            if not is_onnx_domain(node.domain) or not hasattr(_Tracker, f"_op_{node.op_type}"):
                continue
            if is_unread(node):
                remove_nodes(graph, node)
