"""Small predicates over onnx-ir nodes and values shared by passes and analyses."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

ONNX_DOMAINS = ("", "ai.onnx")
MS_DOMAIN = "com.microsoft"

# The standard ops with graph attributes (branches, loop and scan bodies, SequenceMap's body).
GRAPH_HOLDERS = frozenset({"If", "Loop", "Scan", "SequenceMap"})

# The standard reductions (axes as an attribute, or an input from opset 13/18; keepdims).
REDUCTIONS = frozenset(
    {
        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
        "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare",
    }
)  # fmt: skip

# Ops whose outputs are drawn at random: never folded, and without a seed each run differs.
NONDETERMINISTIC_OPS = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
    }
)


def is_onnx_domain(domain: str) -> bool:
    return domain in ONNX_DOMAINS


def is_op(node: ir.Node | None, op_type: str, domain: str = "") -> bool:
    """True when ``node`` is ``op_type`` of ``domain`` ("" and "ai.onnx" are the same domain)."""
    if node is None or node.op_type != op_type:
        return False
    if is_onnx_domain(domain):
        return is_onnx_domain(node.domain)
    return node.domain == domain


def may_hold_graphs(op_type: str, domain: str) -> bool:
    """Whether a node of this op can have graph attributes: of the standard ops only
    ``GRAPH_HOLDERS`` (ONNX's checker rejects a graph attribute on any other); an op of another
    domain may (ORT's BeamSearch holds its decoder)."""
    return op_type in GRAPH_HOLDERS or domain not in ONNX_DOMAINS


def node_subgraphs(node: ir.Node) -> list[ir.Graph]:
    """The graphs ``node`` holds as attributes (If branches, Loop/Scan bodies), in order; a
    reference attribute (in a function body) holds none."""
    out: list[ir.Graph] = []
    for attr in node.attributes.data.values():
        if attr.type is ir.AttributeType.GRAPH:
            inner = [attr.value]
        elif attr.type is ir.AttributeType.GRAPHS:
            inner = attr.value
        else:
            continue
        out.extend(graph for graph in inner if isinstance(graph, ir.Graph))
    return out


def nested_graphs(graph: ir.Graph | ir.Function) -> list[ir.Graph]:
    """Every graph nested in ``graph`` at any depth (If branches, Loop/Scan bodies), each once.

    The order of onnx-ir's ``Graph.subgraphs()`` (node order, a graph before the graphs inside
    it) in a sixth of its time: a pipeline asks some 150 times on a 300-node model, and its
    generic traversal was a fifth of YOLO11n's optimize time. Only the nodes that
    ``may_hold_graphs`` are looked into.
    """
    found: dict[ir.Graph, None] = {}

    def walk(outer: ir.Graph | ir.Function) -> None:
        for node in outer:
            if may_hold_graphs(node.op_type, node.domain):
                for inner in node_subgraphs(node):
                    found.setdefault(inner)
                    walk(inner)

    walk(graph)
    return list(found)


def all_graphs(model: ir.Model) -> list[ir.Graph]:
    """The main graph and every graph nested in it (``ir.Model.graphs()``, faster)."""
    return [model.graph, *nested_graphs(model.graph)]


def const_tensor(value: ir.Value) -> ir.TensorProtocol | None:
    """onnx-ir's ``get_const_tensor`` (an initializer's tensor, or a Constant node's), without its
    cost on a Constant's ``value`` attribute: ``Attr.as_tensor`` checks the tensor against a
    runtime-checkable Protocol, 70-90 us a call on Python 3.11 (GPT-2's TorchScript export reads
    its 1400 Constants in every shape-inference refinement). Raises as it does on a malformed
    Constant."""
    if value.const_value is None:
        node = value.producer()
        if (
            node is not None
            and node.op_type == "Constant"
            and node.domain == ""
            and len(node.outputs) == 1
            and len(node.attributes) == 1
        ):
            attr = node.attributes.get("value")
            if attr is not None and not attr.is_ref() and attr.type == ir.AttributeType.TENSOR:
                tensor = attr.value
                tensor.name = value.name  # (as get_const_tensor names it)
                return tensor
    return ir.convenience.get_const_tensor(value)


def _constant(value: ir.Value | None) -> ir.TensorProtocol | None:
    for _ in range(8):  # see through Identity chains (TorchScript shares tied weights that way)
        if value is None or value.is_graph_input():
            return None
        producer = value.producer()
        if producer is None or not is_op(producer, "Identity"):
            break
        value = producer.inputs[0]
    return None if value is None else const_tensor(value)


def is_constant(value: ir.Value | None) -> bool:
    """Whether ``const_array`` would find a constant, without reading its contents (a large
    weight's bytes are not converted to numpy for a structural check)."""
    return _constant(value) is not None


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The value's constant contents as numpy, or None when it is not a known constant.

    Graph inputs that also carry an initializer are *not* constant: the caller may feed them.
    Identity nodes are looked through.
    """
    tensor = _constant(value)
    if tensor is None:
        return None
    try:
        return tensor.numpy()
    except Exception:  # a tensor we cannot read (e.g. unsupported dtype) is simply not constant
        return None


def is_scalar_constant(value: ir.Value | None, expected: float) -> bool:
    """True when ``value`` is a constant whose every element equals ``expected``."""
    array = const_array(value)
    return array is not None and array.size > 0 and bool(np.all(array == expected))


def opset_version(graph: ir.Graph | ir.Function, domain: str = "") -> int | None:
    """The opset version the graph imports for ``domain``."""
    imports = graph.opset_imports
    if domain in imports:
        return imports[domain]
    if is_onnx_domain(domain):
        for alias in ONNX_DOMAINS:
            if alias in imports:
                return imports[alias]
    return None


def single_consumer(value: ir.Value) -> ir.Node | None:
    """The one node using ``value`` (once), or None when it has zero or several uses or is a graph output."""
    uses = list(value.uses())
    if len(uses) != 1 or value.is_graph_output():
        return None
    return uses[0].node


def is_unread(node: ir.Node, depth: int = 1) -> bool:
    """Nothing reads what ``node`` computes: no output is a graph output or has a use, or (with
    ``depth`` > 1) every user is itself unread through at most ``depth`` - 1 more nodes."""
    return depth > 0 and all(
        not out.is_graph_output() and all(is_unread(use.node, depth - 1) for use in out.uses())
        for out in node.outputs
    )


def constant_of_shape_fill(node: ir.Node) -> np.ndarray:
    """What a ConstantOfShape fills its output with, flattened: its ``value`` attribute, or the
    float32 0 the operator defaults to."""
    attr = node.attributes.get("value")
    if attr is None:
        return np.zeros(1, dtype=np.float32)
    # (as_tensor only for what it raises on: see const_tensor)
    tensor = attr.value if attr.type == ir.AttributeType.TENSOR else attr.as_tensor()
    return np.asarray(tensor.numpy()).reshape(-1)


def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """The value's shape when every dimension is a known integer."""
    if value is None or value.shape is None:
        return None
    dims = []
    for dim in value.shape:
        if not isinstance(dim, int):
            return None
        dims.append(dim)
    return tuple(dims)


def remove_nodes(graph: ir.Graph | ir.Function, nodes: ir.Node | list[ir.Node]) -> None:
    """``graph.remove(nodes, safe=True)`` in time linear in the nodes' inputs.

    onnx-ir detaches input *i* with ``replace_input_with``, which rebuilds the whole input tuple:
    removing a Concat of 50k constants once folded took tens of minutes. The inputs are detached
    here in one sweep instead; onnx-ir's own checks (no user left outside ``nodes``, no graph
    output) still run, before anything is changed.
    """
    group = [nodes] if isinstance(nodes, ir.Node) else list(nodes)
    members = set(group)
    outputs = set(graph.outputs)
    for node in group:
        for out in node.outputs:
            if out in outputs or any(use.node not in members for use in out.uses()):
                raise ValueError(f"node '{node.name}' ({node.op_type}) still has users")
    for node in group:
        inputs = node.inputs
        # onnx-ir's private bookkeeping: a release without it takes the slow public path.
        if len(inputs) > 64 and hasattr(ir.Value, "_remove_usage") and hasattr(node, "_inputs"):
            for index, value in enumerate(inputs):
                if value is not None:
                    value._remove_usage(node, index)
            node._inputs = ()
    graph.remove(group, safe=True)
