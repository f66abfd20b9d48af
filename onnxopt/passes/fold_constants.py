"""Constant folding: evaluate every node whose inputs are all constant and store its result.

How a node is folded:

1. **Plan** (graph order, main graph then subgraphs): a node is a candidate when each input is an
   initializer (not overridable: not also a graph input), a Constant's output or a value planned in
   this pass. Its output types come from ONNX shape inference fed with the inputs' exact shapes and the
   values of the small (shape-like) inputs, so the size of every result is known *before* computing it.
2. **Limits**: a result over ``--fold-limit`` is refused, never computed. A result that would grow the
   file is refused (see *Growth policy*).
3. **Evaluate**: the trivial shape ops (Shape, Gather, Slice, Concat, Reshape, Unsqueeze, Cast, Range,
   integer arithmetic, ...) run in numpy while planning; everything else runs in ONE ONNX Runtime session
   per round that computes all the needed results at once (per connected group only if that fails).
4. **Materialize**: each folded value that something outside the folded nodes still reads (or that is a
   graph output) becomes an initializer with the value's own name; the folded nodes are removed.

Never folded: random ops (RandomNormal*, RandomUniform*, Multinomial, Bernoulli, Dropout in training
mode), QuantizeLinear/DequantizeLinear (folding a DequantizeLinear of constant weights would destroy the
quantization), ops of other domains than ONNX's, ops with subgraphs, sequence/optional ops, and types
numpy cannot hold (bfloat16, float8, int4, strings).

Growth policy (folding never grows the file): a folded result is written as an initializer only when
what folding removes pays for it. Walking the results in graph order, a result costs its bytes plus its
initializer's encoding, and is paid from its own input cone: constants that only folded nodes read (they
disappear) and the folded nodes' encodings; each removed byte pays once. Results of at most 64 bytes
(shape vectors, scalars) are always kept. A result whose elements are all equal (ConstantOfShape and
what only moves its elements: Reshape, Unsqueeze, Expand, Tile, Transpose, Slice, Gather, Concat, Cast)
is written as one ConstantOfShape node instead, which costs a few bytes. A refused result leaves its
producer in place and its inputs are reconsidered. So a Transpose or Cast of a weight used once folds,
but a Tile/Expand of a small constant into a big tensor stays as it is. ``fold_may_grow`` lifts the
policy (every result within ``--fold-limit`` is written in full, as onnxsim does).

``If`` with a constant condition is replaced by the chosen branch's nodes (names kept unique, outer-scope
references preserved). Inside subgraphs, an outer-scope value counts as constant only when it is one.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxopt import io
from onnxopt.ops import (
    NONDETERMINISTIC_OPS,
    ONNX_DOMAINS,
    const_tensor,
    constant_of_shape_fill,
    nested_graphs,
    remove_nodes,
    static_shape,
)
from onnxopt.passes._evaluate import (
    INFERENCE_DATA_ELEMENTS,
    NUMPY_OPS,
    SUPPORTED_DTYPES,
    RuntimeEvaluationError,
    TensorType,
    evaluate_numpy,
    evaluate_on_runtime,
    infer_output_types,
    tensor_type_of,
)
from onnxopt.passes._shape_facts import ELEMENT_MOVES
from onnxopt.passes.base import Pass, PassResult

logger = logging.getLogger(__name__)

TINY_RESULT_BYTES = 64
NUMPY_MAX_BYTES = 1 << 20
MAX_ROUNDS = 8

QUANTIZATION_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
NON_TENSOR_OPS = frozenset(
    {
        "SequenceConstruct",
        "SequenceEmpty",
        "SequenceAt",
        "SequenceInsert",
        "SequenceErase",
        "SequenceLength",
        "SequenceMap",
        "SplitToSequence",
        "ConcatFromSequence",
        "Optional",
        "OptionalGetElement",
        "OptionalHasElement",
    }
)

STAT_FOLDED = "nodes folded"
STAT_INLINED = "If inlined"
STAT_UNIFORM = "uniform results as ConstantOfShape"
STAT_OVER_LIMIT = "refused: over fold limit"
STAT_GROW = "refused: would grow file"
STAT_RUNTIME = "refused: runtime error"


def format_size(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} {unit}" if size == int(size) else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} B"  # pragma: no cover


def _label(node: ir.Node) -> str:
    name = node.name or (node.outputs[0].name if node.outputs else "") or ""
    return f"{node.op_type} '{name}'"


@dataclass
class _Const:
    """A constant value known to the planner: its exact type, and its contents once known."""

    type: TensorType
    array: np.ndarray | None = None
    leaf: ir.TensorProtocol | None = None  # an initializer or Constant's tensor, read lazily
    fill: np.ndarray | None = None  # every element equals this 0-d array (kept compact)

    @property
    def pending(self) -> bool:
        return self.array is None and self.leaf is None and self.fill is None

    def read(self) -> np.ndarray | None:
        if self.array is None and self.fill is not None:
            self.array = np.full(self.type.shape, self.fill, dtype=self.fill.dtype)
        if self.array is None and self.leaf is not None:
            try:
                self.array = np.asarray(self.leaf.numpy())
            except Exception:  # unreadable tensor: treat as not constant
                return None
        return self.array


@dataclass
class _Plan:
    folded: list[ir.Node] = field(default_factory=list)
    known: dict[ir.Value, _Const] = field(default_factory=dict)
    inlines: list[tuple[ir.Node, bool]] = field(default_factory=list)
    deferred: int = 0
    # Folded nodes left in place: a uniform result already in its most compact form.
    kept: set[ir.Node] = field(default_factory=set)


def _graphs(model: ir.Model) -> Iterator[ir.Graph]:
    """The main graph then every subgraph, parents before children (functions are not folded)."""
    yield model.graph
    yield from nested_graphs(model.graph)


def _has_subgraph(node: ir.Node) -> bool:
    return any(
        attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for attr in node.attributes.values()
    )


class _Folder:
    def __init__(self, model: ir.Model, fold_limit: int, explain: bool) -> None:
        self.model = model
        self.fold_limit = fold_limit
        self.explain = explain
        self.opsets = dict(model.opset_imports)
        # Before IR 4 every initializer had to be listed as a graph input: those are constants.
        self.legacy_inputs = model.ir_version < 4
        self.compact_fill = (self.opsets.get("", self.opsets.get("ai.onnx", 0)) or 0) >= 9
        self.blocked: set[ir.Node] = set()
        self.stats: Counter[str] = Counter()
        self.notes: dict[ir.Node, str] = {}
        self.leaves: dict[ir.Value, _Const | None] = {}
        self.numpy_results: dict[ir.Node, list[np.ndarray]] = {}
        self.encoded_sizes: dict[ir.Node, int] = {}
        self.pool = ConstantPool(model)
        self.may_grow = False

    # ------------------------------------------------------------------ facts

    def refuse(self, node: ir.Node, stat: str, note: str) -> None:
        if node not in self.blocked:
            self.blocked.add(node)
            self.stats[stat] += 1
            if self.explain:
                self.notes[node] = f"fold-constants: {_label(node)}: {note}"

    def leaf(self, value: ir.Value) -> _Const | None:
        if value in self.leaves:
            return self.leaves[value]
        result = None
        producer = value.producer()
        is_constant_node = (
            producer is not None
            and producer.op_type == "Constant"
            and producer.domain in ONNX_DOMAINS
        )
        overridable = value.is_graph_input() and not (self.legacy_inputs and value.is_initializer())
        if not overridable and (producer is None or is_constant_node):
            try:
                tensor = const_tensor(value)
            except ValueError:
                tensor = None
            if tensor is not None and tensor.dtype in SUPPORTED_DTYPES:
                dims = tuple(int(d) for d in tensor.shape.numpy())
                result = _Const(TensorType(tensor.dtype, dims), leaf=tensor)
                if tensor.size == 1:
                    array = result.read()
                    result.fill = array.reshape(()) if array is not None else None
        self.leaves[value] = result
        return result

    # ------------------------------------------------------------------ planning

    def plan(self) -> _Plan:
        plan = _Plan()
        for graph in _graphs(self.model):
            for node in graph:
                if node not in self.blocked:
                    self._plan_node(node, plan)
        return plan

    def _plan_node(self, node: ir.Node, plan: _Plan) -> None:
        if not node.inputs:
            return  # Constant nodes are leaves; random generators are never folded
        inputs: list[_Const | None] = []
        for value in node.inputs:
            if value is None:
                inputs.append(None)
                continue
            const = plan.known.get(value) or self.leaf(value)
            if const is None:
                return
            inputs.append(const)
        if node.domain not in ONNX_DOMAINS:
            return  # custom ops are kept as they are
        if node.op_type == "If":
            cond = inputs[0]
            array = cond.read() if cond is not None else None
            if array is not None and array.size == 1:
                plan.inlines.append((node, bool(array.reshape(-1)[0])))
            return
        if _has_subgraph(node) or node.op_type in NON_TENSOR_OPS or node.op_type == "Constant":
            return
        if node.op_type in NONDETERMINISTIC_OPS or self._dropout_in_training(node, inputs):
            return
        if node.op_type in QUANTIZATION_OPS:
            return
        types = self._output_types(node, inputs)
        if types is None:
            if any(c is not None and c.pending for c in inputs):
                plan.deferred += 1  # its size will be known once its inputs are computed
            else:
                self.refuse(
                    node, "refused: size unknown", "the size of its result cannot be determined"
                )
            return
        for out, out_type in zip(node.outputs, types, strict=True):
            if out_type.dtype not in SUPPORTED_DTYPES:
                return
            if out_type.nbytes > self.fold_limit:
                self.refuse(
                    node,
                    STAT_OVER_LIMIT,
                    f"result '{out.name}' {format_size(out_type.nbytes)} is over --fold-limit {format_size(self.fold_limit)}",
                )
                return
        fill = _uniform_fill(node, inputs, types) if self.compact_fill else None
        arrays = None if fill is not None else self._numpy(node, inputs, types)
        for index, (out, out_type) in enumerate(zip(node.outputs, types, strict=True)):
            array = arrays[index] if arrays is not None else None
            plan.known[out] = _Const(out_type, array, fill=fill)
        plan.folded.append(node)

    def _dropout_in_training(self, node: ir.Node, inputs: list[_Const | None]) -> bool:
        if node.op_type != "Dropout" or len(inputs) < 3 or inputs[2] is None:
            return False
        training = inputs[2].read()
        return training is None or bool(np.any(training))

    def _output_types(self, node: ir.Node, inputs: list[_Const | None]) -> list[TensorType] | None:
        data = {}
        for index, const in enumerate(inputs):
            if (
                const is not None
                and not const.pending
                and const.type.elements <= INFERENCE_DATA_ELEMENTS
            ):
                array = const.read()
                if array is not None:
                    data[index] = array
        inferred = infer_output_types(
            node, [c.type if c is not None else None for c in inputs], data, self.opsets
        )
        types: list[TensorType] = []
        for index, out in enumerate(node.outputs):
            found = inferred[index] if inferred is not None else None
            if (
                found is None
                and out.dtype is not None
                and not any(c is not None and c.pending for c in inputs)
            ):
                # Inference could not tell (unknown schema, ...): fall back on the value's annotation.
                shape = static_shape(out)
                if shape is not None:
                    found = TensorType(out.dtype, shape)
            if found is None:
                return None
            types.append(found)
        return types

    def _numpy(
        self, node: ir.Node, inputs: list[_Const | None], types: list[TensorType]
    ) -> list[np.ndarray] | None:
        if node in self.numpy_results:
            return self.numpy_results[node]
        if node.op_type not in NUMPY_OPS or any(t.nbytes > NUMPY_MAX_BYTES for t in types):
            return None
        arrays: list[np.ndarray | None] = []
        for const in inputs:
            if const is None:
                arrays.append(None)
                continue
            if const.pending or const.type.nbytes > NUMPY_MAX_BYTES:
                return None
            array = const.read()
            if array is None:
                return None
            arrays.append(array)
        result = evaluate_numpy(node, arrays)
        if result is None or [tensor_type_of(a) for a in result] != types:
            return None  # unsupported case or disagreement with inference: let the runtime decide
        self.numpy_results[node] = result
        return result

    # ------------------------------------------------------------------ growth policy

    def frontier(self, plan: _Plan) -> list[ir.Value]:
        folded = set(plan.folded)
        out = []
        for node in plan.folded:
            for value in node.outputs:
                if value.is_graph_output() or any(use.node not in folded for use in value.uses()):
                    out.append(value)
        return out

    def node_bytes(self, node: ir.Node) -> int:
        if node not in self.encoded_sizes:
            self.encoded_sizes[node] = ir.serde.serialize_node(node).ByteSize()
        return self.encoded_sizes[node]

    def enforce_growth_policy(self, plan: _Plan) -> bool:
        """Refuse folds whose results would grow the file; True when something was refused.

        Each result costs its bytes plus its initializer's encoding; it is paid from what folding
        removes within its input cone: constants read only by folded nodes, and the folded nodes'
        own encodings. Every removed byte pays once. Results of at most 64 bytes are always kept.
        """
        folded = set(plan.folded)
        budget: dict[ir.Value | ir.Node, int] = {}
        cones: dict[ir.Value, list[ir.Value | ir.Node]] = {}

        def cone(value: ir.Value) -> list[ir.Value | ir.Node]:
            if value in cones:
                return cones[value]
            cones[value] = []
            producer = value.producer()
            members: dict[ir.Value | ir.Node, None] = {}
            if producer is not None and producer in folded:
                members[producer] = None
                for source in producer.inputs:
                    if source is None:
                        continue
                    if source.producer() not in folded:
                        members[source] = None
                    else:
                        members.update(dict.fromkeys(cone(source)))
            cones[value] = list(members)
            return cones[value]

        for node in plan.folded:
            budget[node] = self.node_bytes(node)
            for source in node.inputs:
                if source is None or source in budget:
                    continue
                producer = source.producer()
                if producer is not None and producer in folded:
                    continue
                const = plan.known.get(source) or self.leaf(source)
                freed = (
                    not source.is_graph_output()
                    and not source.is_graph_input()
                    and all(use.node in folded for use in source.uses())
                )
                budget[source] = const.type.nbytes if (const is not None and freed) else 0
        refused = False
        for value in self.frontier(plan):
            const = plan.known[value]
            size = const.type.nbytes
            if size <= TINY_RESULT_BYTES:
                continue
            producer = value.producer()
            assert producer is not None
            if _alias_of(value, folded) is not None:
                continue  # uses move to the Identity's constant input: nothing new is written
            if self.may_grow:
                continue
            if const.fill is not None:
                # Written as ConstantOfShape: a few bytes. Already that compact when one node makes it.
                if all(s is None or s.producer() not in folded for s in producer.inputs):
                    plan.kept.add(producer)
                continue
            cost = size + len(value.name or "") + 8 + 2 * len(const.type.shape)
            members = cone(value)
            available = sum(budget.get(m, 0) for m in members)
            if available < cost:
                self.refuse(
                    producer,
                    STAT_GROW,
                    f"result '{value.name}' {format_size(size)} would grow the file "
                    f"(folding removes only {format_size(available)} of constants and nodes)",
                )
                refused = True
                continue
            for member in members:
                spent = min(budget.get(member, 0), cost)
                budget[member] = budget.get(member, 0) - spent
                cost -= spent
        return refused

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, plan: _Plan, frontier: list[ir.Value]) -> bool:
        """Compute pending frontier values on ONNX Runtime; False when a failure blocked nodes."""
        wanted = [v for v in frontier if plan.known[v].pending]
        if not wanted:
            return True
        folded = set(plan.folded)
        needed: list[ir.Node] = []
        seen: set[ir.Node] = set()
        stack = [v.producer() for v in wanted]
        while stack:
            node = stack.pop()
            if node is None or node in seen or node not in folded:
                continue
            seen.add(node)
            for value in node.inputs:
                const = plan.known.get(value) if value is not None else None
                if value is not None and const is not None and const.pending:
                    stack.append(value.producer())
        needed = [n for n in plan.folded if n in seen]
        groups = [needed]
        try:
            self._run(plan, needed, wanted)
            return True
        except RuntimeEvaluationError as exc:
            logger.debug("batched folding failed (%s); retrying per connected group", exc)
            groups = _connected_groups(needed, plan)
        ok = True
        for group in groups:
            members = set(group)
            group_wanted = [v for v in wanted if v.producer() in members]
            try:
                self._run(plan, group, group_wanted)
            except RuntimeEvaluationError as exc:
                ok = False
                for node in group:
                    self.refuse(node, STAT_RUNTIME, f"ONNX Runtime cannot evaluate it: {exc}")
        return ok

    def _run(self, plan: _Plan, nodes: list[ir.Node], wanted: list[ir.Value]) -> None:
        produced = {out for node in nodes for out in node.outputs}
        feeds: dict[str, np.ndarray] = {}
        for node in nodes:
            for value in node.inputs:
                if value is None or value in produced or str(value.name) in feeds:
                    continue
                array = plan.known[value].read() if value in plan.known else None
                if array is None:
                    leaf = self.leaf(value)
                    array = leaf.read() if leaf is not None else None
                if array is None:
                    raise RuntimeEvaluationError(f"no value for input '{value.name}'")
                feeds[str(value.name)] = array
        names = [str(v.name) for v in wanted]
        if any(not v.name for v in wanted) or len(set(names)) != len(names):
            raise RuntimeEvaluationError("results without unique names")
        results = evaluate_on_runtime(nodes, feeds, names, self.opsets, self.model.ir_version)
        logger.debug("evaluated %d nodes in one ONNX Runtime session", len(nodes))
        for value in wanted:
            array = results[str(value.name)]
            if tensor_type_of(array) != plan.known[value].type:
                raise RuntimeEvaluationError(
                    f"'{value.name}' came out as {array.dtype}{list(array.shape)}"
                )
            plan.known[value].array = array

    # ------------------------------------------------------------------ rewriting

    def materialize(self, plan: _Plan, frontier: list[ir.Value]) -> None:
        for value in frontier:
            if value.producer() in plan.kept:
                continue
            alias = _alias_of(value, set(plan.folded))
            if alias is not None:
                value.replace_all_uses_with(alias)
                continue
            const = plan.known[value]
            if (
                const.fill is not None
                and const.type.nbytes > TINY_RESULT_BYTES
                and not self.may_grow
            ):
                _replace_with_constant_of_shape(value, const.type.shape, const.fill, self.pool)
                self.stats[STAT_UNIFORM] += 1
                continue
            array = const.read()
            assert array is not None
            replace_with_initializer(value, array, self.pool)
        by_graph: dict[ir.Graph, list[ir.Node]] = {}
        removed = [node for node in plan.folded if node not in plan.kept]
        for node in removed:
            assert node.graph is not None
            by_graph.setdefault(node.graph, []).append(node)
        # Subgraphs before the graphs that hold them: a folded node of an If branch may read a
        # folded value of the outer graph (VitDet's TorchScript rel-pos length), and a producer
        # goes only once no node reads it.
        order = {graph: index for index, graph in enumerate(_graphs(self.model))}
        for graph, nodes in sorted(by_graph.items(), key=lambda item: -order.get(item[0], 0)):
            remove_nodes(graph, nodes)
        self.stats[STAT_FOLDED] += len(removed)

    def inline(self, node: ir.Node, condition: bool) -> None:
        graph = node.graph
        assert graph is not None
        branch_attr = node.attributes.get("then_branch" if condition else "else_branch")
        if branch_attr is None:
            return
        branch = branch_attr.as_graph()
        taken = _used_names(self.model, exclude=branch)
        outputs = list(branch.outputs)
        branch.outputs.clear()  # first: a graph output cannot leave its graph
        for name, init in list(branch.initializers.items()):
            del branch.initializers[name]
            init.name = io.free_name(name, taken)
            graph.register_initializer(init)
        moved = list(branch)
        branch.remove(moved)
        for inner in moved:
            if inner.name:
                inner.name = io.free_name(inner.name, taken)
            for out in inner.outputs:
                if out.name:
                    out.name = io.free_name(out.name, taken)
        graph.insert_before(node, moved)
        identities = []
        for old, new in zip(node.outputs, outputs, strict=False):
            if new.type is None:
                new.type = old.type
            if new.shape is None and old.shape is not None:
                new.shape = old.shape
            if not old.is_graph_output():
                old.replace_all_uses_with(new)
                identities.extend(_scalars_for_range(new, node.name or "If", taken))
                continue
            output_name = old.name
            renameable = (
                new.producer() in moved or (new.is_initializer() and new.graph is graph)
            ) and not (new.is_graph_output() or new.is_graph_input())
            if renameable:
                old.replace_all_uses_with(new, replace_graph_outputs=True)
                old.name = None
                new.name = output_name
            else:
                identity = ir.Node("", "Identity", [new], name=f"{node.name or 'If'}_output")
                identities.append(identity)
                old.replace_all_uses_with(identity.outputs[0], replace_graph_outputs=True)
                old.name = None
                identity.outputs[0].name = output_name
                identity.outputs[0].type = old.type
                identity.outputs[0].shape = old.shape
        if identities:
            graph.insert_before(node, identities)
        # The branch not taken goes with the If, but its nodes still read outer values: left
        # attached, they would keep those values (and the initializers among them) alive until
        # the model was saved and loaded again, so a second optimize run removed them.
        dropped = node.attributes.get("else_branch" if condition else "then_branch")
        if dropped is not None:
            for inner in ir.traversal.RecursiveGraphIterator(dropped.as_graph()):
                inner.resize_inputs(0)
        remove_nodes(graph, node)
        self.stats[STAT_INLINED] += 1


def _alias_of(value: ir.Value, folded: set[ir.Node]) -> ir.Value | None:
    """The existing constant an Identity of a constant forwards, when its users can read it directly."""
    producer = value.producer()
    if producer is None or producer.op_type != "Identity" or value.is_graph_output():
        return None
    source = producer.inputs[0]
    if source is None or source.producer() in folded:
        return None
    return source


def _uniform_fill(
    node: ir.Node, inputs: list[_Const | None], types: list[TensorType]
) -> np.ndarray | None:
    """The single value every element of the node's one output has, when that follows from its inputs."""
    if len(types) != 1:
        return None
    fill: np.ndarray | None = None
    first = inputs[0] if inputs else None
    if node.op_type == "ConstantOfShape":
        fill = constant_of_shape_fill(node)[0:1].reshape(())
    elif node.op_type in ELEMENT_MOVES and first is not None:
        fill = first.fill
    elif (
        node.op_type == "Concat"
        and inputs
        and all(c is not None and c.fill is not None for c in inputs)
    ):
        fills = [c.fill for c in inputs if c is not None and c.fill is not None]
        if all(f.dtype == fills[0].dtype and f == fills[0] for f in fills):
            fill = fills[0]
    elif node.op_type == "Cast" and first is not None and first.fill is not None:
        to = types[0].dtype
        if not (np.issubdtype(first.fill.dtype, np.floating) and not to.is_floating_point()):
            fill = first.fill.astype(to.numpy())
    if fill is None or ir.DataType.from_numpy(fill.dtype) != types[0].dtype:
        return None
    return fill


def _replace_with_constant_of_shape(
    value: ir.Value, shape: tuple[int, ...], fill: np.ndarray, pool: ConstantPool
) -> None:
    """Replace ``value`` by ``ConstantOfShape(shape)`` filled with ``fill``: a few bytes in the file."""
    producer = value.producer()
    assert producer is not None and producer.graph is not None
    graph = producer.graph
    name = value.name or f"{producer.name or producer.op_type}_out{value.index()}"
    shape_value = pool.add_initializer(graph, f"{name}_shape", np.array(shape, dtype=np.int64))
    node = ir.Node(
        "",
        "ConstantOfShape",
        [shape_value],
        attributes=[ir.AttrTensor("value", ir.Tensor(fill.reshape(1)))],
        name=f"{name}_fill",
    )
    graph.insert_before(producer, node)
    value.name = None
    out = node.outputs[0]
    out.type = ir.TensorType(ir.DataType.from_numpy(fill.dtype))
    out.shape = ir.Shape(shape)
    value.replace_all_uses_with(out, replace_graph_outputs=True)
    out.name = name


POOL_MAX_BYTES = 1024


class ConstantPool:
    """Small initializers by content, so folding reuses an equal one instead of writing a duplicate
    (which deduplication would otherwise merge on the next run: optimizing twice must change nothing)."""

    def __init__(self, model: ir.Model) -> None:
        self._by_key: dict[tuple[ir.Graph, str, tuple[int, ...], bytes], ir.Value] = {}
        for graph in _graphs(model):
            for value in graph.initializers.values():
                tensor = value.const_value
                if tensor is None or value.is_graph_input() or value.is_graph_output():
                    continue
                if tensor.nbytes <= POOL_MAX_BYTES and tensor.dtype in SUPPORTED_DTYPES:
                    self._by_key.setdefault(self._key(graph, tensor.numpy()), value)

    @staticmethod
    def _key(graph: ir.Graph, array: np.ndarray) -> tuple[ir.Graph, str, tuple[int, ...], bytes]:
        return graph, array.dtype.str, tuple(array.shape), np.ascontiguousarray(array).tobytes()

    def add_initializer(self, graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
        """An initializer of ``graph`` holding ``array``: an equal small one, or a new one named
        ``name`` (made unique)."""
        small = array.nbytes <= POOL_MAX_BYTES
        if small:
            found = self._by_key.get(self._key(graph, array))
            if found is not None and found.graph is graph and found.is_initializer():
                return found
        constant = _new_initializer(graph, name, array)
        if small:
            self._by_key[self._key(graph, array)] = constant
        return constant


def _new_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    unique = name
    suffix = 1
    while unique in graph.initializers:
        unique = f"{name}_{suffix}"
        suffix += 1
    constant = ir.Value(
        name=unique,
        type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
        shape=ir.Shape(array.shape),
        const_value=ir.Tensor(array, name=unique),
    )
    graph.register_initializer(constant)
    return constant


def replace_with_initializer(
    value: ir.Value, array: np.ndarray, pool: ConstantPool | None = None
) -> ir.Value:
    """Move every use of ``value`` (graph outputs included) to an initializer holding ``array`` in the
    graph producing it: an equal small one from ``pool``, else a new one under ``value``'s name. The
    producer is left for the caller to remove."""
    producer = value.producer()
    assert producer is not None and producer.graph is not None
    graph = producer.graph
    name = value.name or f"{producer.name or producer.op_type}_out{value.index()}"
    if pool is not None and not value.is_graph_output():
        constant = pool.add_initializer(graph, name, array)
        value.replace_all_uses_with(constant)
        return constant
    value.name = None
    constant = _new_initializer(graph, name, array)
    value.replace_all_uses_with(constant, replace_graph_outputs=True)
    return constant


def _connected_groups(nodes: list[ir.Node], plan: _Plan) -> list[list[ir.Node]]:
    parent: dict[ir.Node, ir.Node] = {n: n for n in nodes}

    def find(n: ir.Node) -> ir.Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for node in nodes:
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is not None and producer in parent:
                parent[find(producer)] = find(node)
    groups: dict[ir.Node, list[ir.Node]] = {}
    for node in nodes:
        groups.setdefault(find(node), []).append(node)
    return list(groups.values())


def _scalars_for_range(value: ir.Value, prefix: str, taken: set[str]) -> list[ir.Node]:
    """Reshape ``value`` to a scalar for the Range nodes reading it, when it is known to hold one
    element but is not a scalar.

    An If output's shape is unknown to its readers, so a branch may hand Range (whose inputs must be
    scalars) a [1] tensor and ONNX Runtime still loads the model; its kernel reads the one element.
    Once the branch is inlined, ORT's shape check sees the [1] and refuses the model. The Reshape
    keeps the value and satisfies the check."""
    shape = static_shape(value)
    if shape is None or len(shape) == 0 or int(np.prod(shape)) != 1:
        return []
    uses = [
        use
        for use in value.uses()
        if use.node.op_type == "Range" and use.node.domain in ONNX_DOMAINS
    ]
    if not uses:
        return []
    no_dims = ir.tensor(np.zeros(0, dtype=np.int64))
    shape_node = ir.Node("", "Constant", [], attributes=[ir.AttrTensor("value", no_dims)])
    shape_node.outputs[0].name = io.free_name(f"{prefix}_scalar_shape", taken)
    reshape = ir.Node(
        "", "Reshape", [value, shape_node.outputs[0]], name=io.free_name(f"{prefix}_scalar", taken)
    )
    reshape.outputs[0].name = io.free_name(f"{value.name or prefix}_scalar", taken)
    reshape.outputs[0].type = value.type
    reshape.outputs[0].shape = ir.Shape([])
    for use in uses:
        use.node.replace_input_with(use.idx, reshape.outputs[0])
    return [shape_node, reshape]


def _used_names(model: ir.Model, exclude: ir.Graph) -> set[str]:
    names: set[str] = set()
    for graph in _graphs(model):
        if graph is exclude:
            continue
        for value in (*graph.inputs, *graph.initializers.values()):
            if value.name:
                names.add(value.name)
        for node in graph:
            if node.name:
                names.add(node.name)
            names.update(out.name for out in node.outputs if out.name)
    return names


class FoldConstantsPass(Pass):
    """Evaluate nodes whose inputs are all constant (numpy for shape ops, one ORT session for the rest),
    within ``--fold-limit`` and without growing the file; inline If with a constant condition."""

    name = "fold-constants"
    summary = "evaluate nodes with constant inputs (numpy / batched ORT), inline constant If; size-bounded"

    def call(self, model: ir.Model) -> PassResult:
        folder = _Folder(model, self.options.fold_limit_bytes, self.options.explain)
        folder.may_grow = self.options.fold_may_grow
        modified = False
        for _ in range(MAX_ROUNDS):
            changed = self._round(folder)
            modified |= changed
            if not changed:
                break
        notes = list(folder.notes.values())
        return PassResult(model, modified=modified, stats=folder.stats, notes=notes)

    def _round(self, folder: _Folder) -> bool:
        folder.leaves.clear()
        folder.numpy_results.clear()
        while True:
            plan = folder.plan()
            if folder.enforce_growth_policy(plan):
                continue
            frontier = folder.frontier(plan)
            if folder.evaluate(plan, frontier):
                break
        changed = False
        if len(plan.folded) > len(plan.kept):
            folder.materialize(plan, frontier)
            changed = True
        for node, condition in plan.inlines:
            if node.graph is not None:
                folder.inline(node, condition)
                changed = True
        return changed
