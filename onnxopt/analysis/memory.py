"""Activation memory: tensor sizes, liveness over an execution order, and in-place / view reuse.

Model of execution: nodes run one at a time in the graph's order (or a given order). An
*intermediate* (a value produced by a node of the graph that is not a graph output) occupies memory
from the step of its producer to the step of its last consumer, both included; a value nobody reads
lives only during its producer's step. Values read inside an If/Loop/Scan body count as read by the
node that owns the body, so they live until that node finishes; the body's own tensors are a
*workspace* of that node (the body's planned arena, outputs included), live during its step only.
Graph inputs, initializers and graph outputs are owned by the caller and accounted separately.

Sizes are rounded up to ``alignment`` bytes everywhere, so the lower bound and the planned arena
compare like with like. Tensors whose size stays unknown after binding symbolic dims count as 0
bytes and are *listed* in ``unknown``; figures are then lower estimates.

Reuse (``inplace=True``):

- views (Reshape, Squeeze, Unsqueeze, Flatten, Identity) share their input's buffer; the shared
  buffer lives until the last reader of any of its views;
- an element-wise op (Relu, Add, BatchNormalization, ...) may write its output over an input of
  the same shape and dtype when that input's buffer dies at this node (no later reader); the
  buffers are merged. Row-wise ops over contiguous rows (Softmax and LogSoftmax on the last axis,
  LayerNormalization) may too: they read a row before writing it. Buffers aliasing graph inputs or initializers are never written in place.
"""

from __future__ import annotations

import functools
import gc
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import onnx_ir as ir

from onnxopt.ops import nested_graphs, node_subgraphs

DEFAULT_ALIGNMENT = 64
# Symbolic dims nobody bound are given this size when a pass needs concrete sizes.
DEFAULT_SYMBOLIC_DIM = 64

VIEW_OPS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")
# Element-wise ops: output element i depends only on input element i (and broadcast operands),
# so the output may overwrite an input of the same shape. Value: the input indices it may reuse.
ELEMENTWISE_INPLACE: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(
        (
            "Relu",
            "LeakyRelu",
            "Elu",
            "Selu",
            "Celu",
            "Sigmoid",
            "HardSigmoid",
            "HardSwish",
            "Tanh",
            "Softplus",
            "Softsign",
            "Exp",
            "Log",
            "Sqrt",
            "Reciprocal",
            "Neg",
            "Abs",
            "Ceil",
            "Floor",
            "Round",
            "Sign",
            "Erf",
            "Sin",
            "Cos",
            "Gelu",
            "Mish",
            "ThresholdedRelu",
            "Not",
            "Clip",
            "PRelu",
            "BatchNormalization",
            "Dropout",
        ),
        (0,),
    ),
    **dict.fromkeys(
        ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor"),
        (0, 1, 2, 3, 4, 5, 6, 7),
    ),
    "Where": (1, 2),
}


F = TypeVar("F", bound=Callable[..., Any])


def without_gc(func: F) -> F:
    """Run ``func`` with the cyclic garbage collector paused.

    These analyses allocate millions of small lists and tuples; each allocation burst makes the
    collector walk the whole (large) onnx-ir object graph, which made 100k-node graphs quadratic.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not gc.isenabled():
            return func(*args, **kwargs)
        gc.disable()
        try:
            return func(*args, **kwargs)
        finally:
            gc.enable()

    return wrapper  # type: ignore[return-value]


# Row-wise ops read a whole row of their input (to find its max / mean) before writing that row,
# element by element, so the output may also overwrite the input when rows are contiguous.
ROWWISE_INPLACE = ("Softmax", "LogSoftmax", "LayerNormalization")


def _rows_are_contiguous(node: ir.Node, graph: ir.Graph) -> bool:
    """Softmax before opset 13 and LayerNormalization flatten [axis:] into rows; Softmax 13+ needs the last axis."""
    if node.op_type == "LayerNormalization":
        return True
    version = graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 13))
    if version < 13:
        return True
    axis = node.attributes.get_int("axis", -1)
    rank = (
        len(node.inputs[0].shape)
        if node.inputs and node.inputs[0] is not None and node.inputs[0].shape is not None
        else None
    )
    return axis == -1 or (rank is not None and axis == rank - 1)


def align(size: int, alignment: int) -> int:
    return -(-size // alignment) * alignment if alignment > 1 else size


# ----------------------------------------------------------------------------------------------
# Sizes


@dataclass(frozen=True)
class TensorSizes:
    """Byte size and concrete shape of every value whose size is known, keyed by value name."""

    nbytes: Mapping[str, int]
    shapes: Mapping[str, tuple[int, ...]]
    dims: Mapping[str, int] = field(default_factory=dict)
    # symbolic dims nobody bound that were given ``default_dim``
    assumed: tuple[str, ...] = ()

    def get(self, value: ir.Value) -> int | None:
        return self.nbytes.get(value.name or "")


def _bound_shape(value: ir.Value, dims: Mapping[str, int]) -> tuple[int, ...] | None:
    if value.shape is None:
        return None
    out = []
    for dim in value.shape:
        if isinstance(dim, int):
            out.append(dim)
            continue
        name = getattr(dim, "value", None)
        if name is None or name not in dims:
            return None
        out.append(dims[name])
    return tuple(out)


def _value_bytes(value: ir.Value, shape: tuple[int, ...] | None) -> int | None:
    if shape is None or value.dtype is None:
        return None
    try:
        itemsize = value.dtype.itemsize
    except Exception:  # strings and other types without a fixed size
        return None
    return math.ceil(math.prod(shape) * itemsize)


def _needs_inference(model: ir.Model) -> bool:
    return any(v.shape is None or v.dtype is None for n in model.graph for v in n.outputs)


def has_symbolic_inputs(model: ir.Model) -> bool:
    """Whether an input of the main graph has a dim that is not a number."""
    return any(
        v.shape is not None and any(not isinstance(d, int) for d in v.shape)
        for v in model.graph.inputs
    )


def tensor_sizes(
    model: ir.Model,
    dims: Mapping[str, int] | None = None,
    *,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    infer: bool | None = None,
    default_dim: int | None = None,
) -> TensorSizes:
    """Sizes of every value (all graphs) from shapes and dtypes, symbolic dims bound by ``dims``.

    When inputs are pinned (``dims`` / ``input_shapes``) or shapes are missing (``infer=None``),
    ONNX shape inference runs on a clone first, so intermediate dims become concrete; the model
    itself is never changed. ``default_dim`` binds every symbolic dim nobody named (passes use it).
    """
    dims = dict(dims or {})
    bind: Mapping[str, int] = _DefaultDims(dims, default_dim) if default_dim is not None else dims
    symbolic_inputs = has_symbolic_inputs(model)
    source = model
    wanted = (
        dims
        or input_shapes
        or _needs_inference(model)
        or (default_dim is not None and symbolic_inputs)
    )
    if infer or (infer is None and wanted):
        source = _inferred_clone(model, bind, dict(input_shapes or {}))
    return sizes_from_shapes(source.graph, bind)


def sizes_from_shapes(graph: ir.Graph, dims: Mapping[str, int] | None = None) -> TensorSizes:
    """Sizes from the shapes already on ``graph``'s values (no inference), dims bound by ``dims``."""
    bind: Mapping[str, int] = dims if dims is not None else {}
    nbytes: dict[str, int] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for sub in (graph, *nested_graphs(graph)):
        values = [*sub.inputs, *sub.initializers.values()]
        values.extend(v for node in sub for v in node.outputs)
        for value in values:
            if not value.name or value.name in nbytes:
                continue
            shape = _bound_shape(value, bind)
            size = _value_bytes(value, shape)
            if size is not None and shape is not None:
                nbytes[value.name] = size
                shapes[value.name] = shape
    assumed = tuple(sorted(bind.missing)) if isinstance(bind, _DefaultDims) else ()
    plain = (
        dict(bind) if not isinstance(bind, _DefaultDims) else {k: bind[k] for k in dict.keys(bind)}
    )
    return TensorSizes(nbytes, shapes, plain, assumed)


class _DefaultDims(dict[str, int]):
    """A dims mapping in which every name is bound (unnamed ones to ``default``)."""

    def __init__(self, dims: Mapping[str, int], default: int) -> None:
        super().__init__(dims)
        self.default = default
        self.missing: set[str] = set()

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> int:
        self.missing.add(key)
        return self.default


def _inferred_clone(
    model: ir.Model, dims: Mapping[str, int], input_shapes: dict[str, tuple[int, ...]]
) -> ir.Model:
    from onnxopt.passes.infer_shapes import InferShapesPass
    from onnxopt.passes.options import PassOptions

    clone = model.clone()
    pinned = dict(input_shapes)
    for value in clone.graph.inputs:
        if value.name in pinned or value.shape is None or value.is_initializer():
            continue
        shape = _bound_shape(value, dims)
        if shape is not None and any(not isinstance(d, int) for d in value.shape):
            pinned[str(value.name)] = shape
    InferShapesPass(PassOptions(input_shapes=pinned))(clone)
    return clone


# ----------------------------------------------------------------------------------------------
# Dataflow: the order-independent facts liveness, planning and scheduling work on


@dataclass
class Dataflow:
    """Integer-indexed view of one graph: nodes, arena tensors, alias groups and in-place pairs.

    Tensor ids index ``names``/``sizes``; ``group`` maps a tensor to its view group (a root
    tensor and the views of it, which share its buffer); ``external`` marks views of graph
    inputs/initializers/outputs (no arena bytes). Built once, read by every order's analysis.
    """

    nodes: list[ir.Node]
    preds: list[list[int]]
    names: list[str]
    sizes: list[int]  # aligned bytes (0 when unknown)
    shapes: list[tuple[int, ...] | None]
    producer: list[int]
    consumers: list[list[int]]
    group: list[int]  # view-group root tensor id, -1 for external views
    node_outputs: list[list[int]]  # arena tensors produced (roots and views)
    node_groups_in: list[list[int]]  # distinct view groups a node reads
    inplace: list[list[tuple[int, int]]]  # per node: (output root tensor, input tensor)
    workspace: list[int]
    unknown: list[str]
    naive_bytes: int
    graph_input_bytes: int
    initializer_bytes: int
    graph_output_bytes: int
    # per view group root: member tensors and nodes reading any member (sorted)
    group_members: dict[int, list[int]] = field(default_factory=dict)
    group_readers: dict[int, list[int]] = field(default_factory=dict)
    # per view group root: nodes whose position bounds its lifetime (member producers, readers)
    group_span: dict[int, list[int]] = field(default_factory=dict)


def _owner_map(graph: ir.Graph, nodes: Sequence[ir.Node]) -> dict[int, int]:
    """id(node inside a subgraph) -> index of the top-level node that owns the subgraph."""
    owners: dict[int, int] = {}
    for index, node in enumerate(nodes):
        for attr in node.attributes.values():
            subgraphs: list[ir.Graph] = []
            if attr.type == ir.AttributeType.GRAPH:
                subgraphs = [attr.as_graph()]
            elif attr.type == ir.AttributeType.GRAPHS:
                subgraphs = list(attr.as_graphs())
            for sub in subgraphs:
                for inner in ir.traversal.RecursiveGraphIterator(sub):
                    owners[id(inner)] = index
    return owners


@without_gc
def build_dataflow(
    graph: ir.Graph,
    sizes: TensorSizes,
    *,
    order: Sequence[ir.Node] | None = None,
    alignment: int = DEFAULT_ALIGNMENT,
    inplace: bool = True,
    outputs_in_arena: bool = False,
) -> Dataflow:
    """Index ``graph`` for memory analyses. ``order`` only fixes node numbering (default: graph order)."""
    nodes = list(order if order is not None else graph)
    index_of = {id(n): i for i, n in enumerate(nodes)}
    owners = _owner_map(graph, nodes)
    tensor_of: dict[int, int] = {}
    names: list[str] = []
    tsizes: list[int] = []
    shapes: list[tuple[int, ...] | None] = []
    producer: list[int] = []
    node_outputs: list[list[int]] = [[] for _ in nodes]
    unknown: list[str] = []
    naive = 0
    output_bytes = 0
    for i, node in enumerate(nodes):
        for value in node.outputs:
            size = sizes.get(value)
            if value.is_graph_output() and not outputs_in_arena:
                output_bytes += align(size or 0, alignment)
                if size is None:
                    unknown.append(value.name or f"{node.name}:output")
                continue
            tid = len(names)
            tensor_of[id(value)] = tid
            names.append(value.name or f"{node.name}:{len(names)}")
            if size is None:
                unknown.append(names[-1])
            tsizes.append(align(size or 0, alignment))
            shapes.append(sizes.shapes.get(value.name or ""))
            naive += tsizes[-1]
            producer.append(i)
            node_outputs[i].append(tid)

    consumers: list[list[int]] = [[] for _ in names]
    preds: list[list[int]] = [[] for _ in nodes]
    external_ids: set[int] = set()

    def reader(use_node: ir.Node) -> int | None:
        index = index_of.get(id(use_node))
        return index if index is not None else owners.get(id(use_node))

    for i, node in enumerate(nodes):
        seen: set[int] = set()
        for value in node.outputs:
            for use in value.uses():
                j = reader(use.node)
                if j is None or j == i:
                    continue
                if j not in seen:
                    seen.add(j)
                    preds[j].append(i)
                used = tensor_of.get(id(value))
                if used is not None:
                    consumers[used].append(j)
    for tid in range(len(names)):
        consumers[tid] = sorted(set(consumers[tid]))
    for p in preds:
        p.sort()

    # View groups.
    group = list(range(len(names)))

    def find(t: int) -> int:
        while group[t] != t:
            group[t] = group[group[t]]
            t = group[t]
        return t

    in_place_pairs: list[list[tuple[int, int]]] = [[] for _ in nodes]
    if inplace:
        for i, node in enumerate(nodes):
            if not node.outputs or id(node.outputs[0]) not in tensor_of:
                continue
            out = tensor_of[id(node.outputs[0])]
            onnx_domain = node.domain in ("", "ai.onnx")
            if (
                onnx_domain
                and node.op_type in VIEW_OPS
                and node.inputs
                and node.inputs[0] is not None
            ):
                src = tensor_of.get(id(node.inputs[0]))
                if src is None:
                    external_ids.add(out)  # a view of caller-owned memory
                else:
                    group[out] = find(src)
                continue
            allowed = ELEMENTWISE_INPLACE.get(node.op_type) if onnx_domain else None
            if (
                onnx_domain
                and node.op_type in ROWWISE_INPLACE
                and _rows_are_contiguous(node, graph)
            ):
                allowed = (0,)
            if not allowed or tsizes[out] == 0 or shapes[out] is None:
                continue
            if node.op_type == "Dropout" and len(node.inputs) > 2 and node.inputs[2] is not None:
                continue  # training mode may be on
            for k, operand in enumerate(node.inputs):
                if k not in allowed or operand is None:
                    continue
                src = tensor_of.get(id(operand))
                if src is not None and shapes[src] == shapes[out] and tsizes[src] == tsizes[out]:
                    in_place_pairs[i].append((out, src))
    for t in external_ids:
        group[t] = -1
    roots = [find(t) if group[t] >= 0 else -1 for t in range(len(names))]
    # External views: a view of an external view is external too.
    for t in range(len(names)):
        if roots[t] >= 0 and roots[t] in external_ids:
            roots[t] = -1
    members: dict[int, list[int]] = {}
    for t, r in enumerate(roots):
        if r >= 0:
            members.setdefault(r, []).append(t)
    readers: dict[int, list[int]] = {}
    for r, ms in members.items():
        if len(ms) == 1:
            readers[r] = consumers[ms[0]]
        else:
            readers[r] = sorted({j for m in ms for j in consumers[m]})
            tsizes[r] = max(tsizes[m] for m in ms)
    span: dict[int, list[int]] = {}
    for r, ms in members.items():
        nodes_of = {producer[m] for m in ms}
        nodes_of.update(readers[r])
        span[r] = sorted(nodes_of)
    node_groups_in: list[list[int]] = [[] for _ in nodes]
    for r, rs in readers.items():
        for j in rs:
            node_groups_in[j].append(r)
    for i in range(len(nodes)):
        node_groups_in[i].sort()
        in_place_pairs[i] = [
            (out, src)
            for out, src in sorted(in_place_pairs[i], key=lambda p: -tsizes[p[0]])
            if roots[out] == out and roots[src] >= 0
        ]

    workspace = [0] * len(nodes)
    for i, node in enumerate(nodes):
        for sub in node_subgraphs(node):
            workspace[i] = max(workspace[i], _subgraph_arena(sub, sizes, alignment, inplace))

    input_bytes = sum(
        align(sizes.get(v) or 0, alignment) for v in graph.inputs if not v.is_initializer()
    )
    init_bytes = sum(align(sizes.get(v) or 0, alignment) for v in graph.initializers.values())
    return Dataflow(
        nodes=nodes,
        preds=preds,
        names=names,
        sizes=tsizes,
        shapes=shapes,
        producer=producer,
        consumers=consumers,
        group=roots,
        node_outputs=node_outputs,
        node_groups_in=node_groups_in,
        inplace=in_place_pairs,
        workspace=workspace,
        unknown=unknown,
        naive_bytes=naive,
        graph_input_bytes=input_bytes,
        initializer_bytes=init_bytes,
        graph_output_bytes=output_bytes,
        group_members=members,
        group_readers=readers,
        group_span=span,
    )


def _subgraph_arena(graph: ir.Graph, sizes: TensorSizes, alignment: int, inplace: bool) -> int:
    from onnxopt.analysis.memory_plan import pack

    flow = build_dataflow(graph, sizes, alignment=alignment, inplace=inplace, outputs_in_arena=True)
    liveness = simulate(flow, list(range(len(flow.nodes))), inplace=inplace)
    if not liveness.buffers:
        return max(flow.workspace, default=0)
    # Body outputs must survive to the end of the body.
    last = len(flow.nodes) - 1
    outputs = {id(v) for v in graph.outputs}
    buffers = []
    for b in liveness.buffers:
        end = (
            last
            if any(id(flow.nodes[flow.producer[m]].outputs[0]) in outputs for m in b.members)
            else b.end
        )
        buffers.append((b.size, b.start, max(b.end, end)))
    return pack(buffers, alignment).arena


# ----------------------------------------------------------------------------------------------
# Liveness of one order


@dataclass(frozen=True)
class Buffer:
    """One arena allocation: tensors sharing it (views, in-place chains), size, steps [start, end]."""

    members: tuple[int, ...]
    size: int
    start: int
    end: int


@dataclass(frozen=True)
class SimResult:
    buffers: tuple[Buffer, ...]
    step_bytes: tuple[int, ...]
    peak: int
    peak_step: int
    inplace: tuple[tuple[int, int], ...]  # (output tensor, input tensor) written in place


@without_gc
def simulate(
    flow: Dataflow, order: Sequence[int], *, inplace: bool = True, with_buffers: bool = True
) -> SimResult:
    """Buffers, live bytes per step and the peak when ``flow``'s nodes run in ``order`` (node ids)."""
    n = len(order)
    pos = [0] * len(flow.nodes)
    for p, i in enumerate(order):
        pos[i] = p
    at = pos.__getitem__
    start: dict[int, int] = {r: pos[flow.producer[r]] for r in flow.group_members}
    end: dict[int, int] = {r: max(map(at, nodes)) for r, nodes in flow.group_span.items()}
    parent: dict[int, int] = {}
    merged: list[tuple[int, int]] = []
    if inplace:
        host_of: dict[int, int] = {}  # union-find with path compression over in-place merges

        def top(r: int) -> int:
            root = r
            while root in host_of:
                root = host_of[root]
            while r in host_of and host_of[r] != root:
                host_of[r], r = root, host_of[r]
            return root

        for p, i in enumerate(order):
            claimed: set[int] = set()  # a dying buffer takes at most one output per step
            for out, src in flow.inplace[i]:
                host = top(flow.group[src])
                if end[host] != p or host in claimed or out in parent or start[out] != p:
                    continue
                claimed.add(host)
                parent[out] = host
                host_of[out] = host
                end[host] = max(end[host], end[out])
                merged.append((out, src))
    delta = [0] * (n + 1)
    buffers: list[Buffer] = []
    children: dict[int, list[int]] = {}
    for out, host in parent.items():
        children.setdefault(host, []).append(out)
    for r in flow.group_members:
        if r in parent:
            continue
        if not with_buffers:
            delta[start[r]] += flow.sizes[r]
            delta[end[r] + 1] -= flow.sizes[r]
            continue
        ms = list(flow.group_members[r])
        stack = list(children.get(r, ()))
        while stack:
            c = stack.pop()
            ms.extend(flow.group_members[c])
            stack.extend(children.get(c, ()))
        size = flow.sizes[r]
        buffers.append(Buffer(tuple(sorted(ms)), size, start[r], end[r]))
        delta[start[r]] += size
        delta[end[r] + 1] -= size
    buffers.sort(key=lambda b: (b.start, b.members[0]))
    steps = []
    running = 0
    peak, peak_step = 0, 0
    for p in range(n):
        running += delta[p]
        live = running + flow.workspace[order[p]]
        steps.append(live)
        if live > peak:
            peak, peak_step = live, p
    return SimResult(tuple(buffers), tuple(steps), peak, peak_step, tuple(merged))


# ----------------------------------------------------------------------------------------------
# The public liveness result


@dataclass(frozen=True)
class LiveRange:
    name: str
    size: int
    producer: str
    start: int
    end: int
    buffer: int  # index into Liveness.buffers, -1 for views of caller-owned memory


@dataclass(frozen=True)
class Liveness:
    """Lifetimes over one execution order (steps are positions in ``order``)."""

    order: tuple[str, ...]
    tensors: tuple[LiveRange, ...]
    buffers: tuple[Buffer, ...]
    step_bytes: tuple[int, ...]
    naive_bytes: int
    lower_bound_bytes: int
    peak_step: int
    unknown: tuple[str, ...]
    inplace: tuple[
        tuple[str, str], ...
    ]  # (output, input) pairs sharing a buffer by in-place writes
    graph_input_bytes: int
    initializer_bytes: int
    graph_output_bytes: int
    workspace_bytes: int  # largest If/Loop/Scan body workspace
    alignment: int


def node_label(node: ir.Node, index: int) -> str:
    return node.name or f"{node.op_type}#{index}"


def liveness_of(
    flow: Dataflow,
    order: Sequence[int] | None = None,
    *,
    inplace: bool = True,
    alignment: int = DEFAULT_ALIGNMENT,
) -> Liveness:
    order = list(range(len(flow.nodes))) if order is None else list(order)
    sim = simulate(flow, order, inplace=inplace)
    pos = [0] * len(flow.nodes)
    for p, i in enumerate(order):
        pos[i] = p
    buffer_of: dict[int, int] = {}
    for b_index, b in enumerate(sim.buffers):
        for m in b.members:
            buffer_of[m] = b_index
    ranges = []
    for t, name in enumerate(flow.names):
        s = pos[flow.producer[t]]
        e = max([s, *(pos[j] for j in flow.consumers[t])])
        ranges.append(
            LiveRange(
                name,
                flow.sizes[t] if flow.group[t] == t else 0,
                node_label(flow.nodes[flow.producer[t]], flow.producer[t]),
                s,
                e,
                buffer_of.get(t, -1),
            )
        )
    return Liveness(
        order=tuple(node_label(flow.nodes[i], i) for i in order),
        tensors=tuple(ranges),
        buffers=sim.buffers,
        step_bytes=sim.step_bytes,
        naive_bytes=flow.naive_bytes,
        lower_bound_bytes=sim.peak,
        peak_step=sim.peak_step,
        unknown=tuple(flow.unknown),
        inplace=tuple((flow.names[o], flow.names[s]) for o, s in sim.inplace),
        graph_input_bytes=flow.graph_input_bytes,
        initializer_bytes=flow.initializer_bytes,
        graph_output_bytes=flow.graph_output_bytes,
        workspace_bytes=max(flow.workspace, default=0),
        alignment=alignment,
    )


def live_ranges(
    graph: ir.Graph,
    sizes: TensorSizes | None = None,
    *,
    order: Sequence[ir.Node] | None = None,
    inplace: bool = False,
    alignment: int = DEFAULT_ALIGNMENT,
) -> Liveness:
    """Each intermediate's lifetime over ``order`` (default: the graph's node order).

    Without ``inplace`` every tensor is its own buffer: ``lower_bound_bytes`` is then the
    classic bound, the largest total of tensors live at one step. ``sizes`` default to the shapes
    already on the graph (run infer-shapes first, or pass :func:`tensor_sizes`).
    """
    sizes = sizes if sizes is not None else sizes_from_shapes(graph)
    flow = build_dataflow(graph, sizes, order=order, alignment=alignment, inplace=inplace)
    return liveness_of(flow, inplace=inplace, alignment=alignment)


# ----------------------------------------------------------------------------------------------
# The least memory a run can take, before one is tried


@dataclass(frozen=True)
class RunFloor:
    """A lower bound on the host memory one run of a model needs at given input shapes.

    ``activation_bytes``: the intermediates live together at the model's worst step, in its node
    order, each in its own buffer, or its outputs if they take more (a runtime that writes some
    outputs over their inputs needs somewhat less; one that fuses, much less). ``weight_bytes``:
    its initializers. ``largest``: the biggest intermediate (name, shape, bytes), which usually
    says why. ``unknown``: intermediates that could not be sized, counted as empty.
    """

    activation_bytes: int
    weight_bytes: int
    largest: tuple[str, tuple[int, ...], int] | None
    unknown: int


def run_floor(model: ir.Model, input_shapes: Mapping[str, tuple[int, ...]]) -> RunFloor | None:
    """:class:`RunFloor` of ``model`` (not changed: shapes are inferred on a copy) on inputs of
    ``input_shapes``; None where shape inference fails.

    Where ONNX shape inference cannot size what follows a Reshape whose target is computed from
    ``Shape`` values (as exporters write them), ``unknown`` says so: fold the shape values first.
    """
    try:
        sizes = tensor_sizes(model, input_shapes=input_shapes, infer=True)
    except Exception:  # an estimate only: a model that cannot be sized is not refused for it
        return None
    live = live_ranges(model.graph, sizes)
    largest = max(
        ((t.name, sizes.shapes[t.name], t.size) for t in live.tensors if t.name in sizes.shapes),
        key=lambda item: item[2],
        default=None,
    )
    # Outputs are not arena tensors; all of them are held when the run returns.
    activations = max(live.lower_bound_bytes, live.graph_output_bytes)
    return RunFloor(activations, live.initializer_bytes, largest, len(live.unknown))


def available_memory() -> int | None:
    """Bytes of host memory available to a new allocation now (Linux ``MemAvailable``), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
