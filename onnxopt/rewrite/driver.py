"""The driver: walk every graph (subgraphs included) in order, try rules, apply replacements."""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Iterator, Sequence

import onnx_ir as ir

from onnxopt.ops import is_op, is_unread, nested_graphs, remove_nodes
from onnxopt.passes.options import PassOptions
from onnxopt.rewrite.rule import Match, Mismatch, Replacement, RewriteContext, Rule

logger = logging.getLogger(__name__)


def iter_graphs(model: ir.Model) -> Iterator[ir.Graph | ir.Function]:
    """The main graph, every nested subgraph (deterministic order) and every model-local function."""
    yield model.graph
    yield from nested_graphs(model.graph)
    for function in model.functions.values():
        yield function
        yield from nested_graphs(function)


def describe(node: ir.Node) -> str:
    return f"{node.op_type} '{node.name}'" if node.name else node.op_type


def body(graph: ir.Graph | ir.Function) -> ir.Graph:
    """The ir.Graph that nodes of ``graph`` point to (a Function keeps its nodes in one)."""
    return graph.graph if isinstance(graph, ir.Function) else graph


def _can_replace(
    old: ir.Value, new: ir.Value, graph: ir.Graph | ir.Function, new_nodes: Sequence[ir.Node] = ()
) -> Mismatch | None:
    if not old.is_graph_output():
        return None
    # The graph output keeps its name; the new value must be free to take it.
    if new.is_graph_input() or new.is_graph_output() or new.is_initializer():
        return Mismatch(
            "its result is a graph output and the replacement is a graph input, output or initializer"
        )
    producer = new.producer()
    # A new node is not in the graph yet, but will be.
    if producer is None or (
        producer.graph is not body(graph) and not any(producer is n for n in new_nodes)
    ):
        return Mismatch("its result is a graph output and the replacement comes from another scope")
    return None


class FreshNames:
    """Hands out value names not used anywhere in the model (the set is built on first need)."""

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self._taken: set[str] | None = None

    def _collect(self) -> set[str]:
        taken: set[str] = set()
        for graph in iter_graphs(self.model):
            values = list(graph.inputs)
            if isinstance(graph, ir.Graph):
                values.extend(graph.initializers.values())
            for node in graph:
                values.extend(node.outputs)
            taken.update(v.name for v in values if v.name)
        return taken

    def fresh(self, hint: str) -> str:
        if self._taken is None:
            self._taken = self._collect()
        name, k = hint, 0
        while name in self._taken:
            k += 1
            name = f"{hint}_{k}"
        self._taken.add(name)
        return name


def _materialize_constants(
    graph: ir.Graph | ir.Function, root: ir.Node, constants: Sequence[ir.Value], names: FreshNames
) -> list[ir.Node]:
    """Name the new constants; initializers where allowed, else Constant nodes (returned)."""
    # IR < 4 requires every initializer to be a graph input too; functions have no initializers.
    as_initializers = isinstance(graph, ir.Graph) and names.model.ir_version >= 4
    hint = root.name or root.op_type
    constant_nodes = []
    for value in constants:
        if value.const_value is None:
            raise ValueError("a replacement constant has no const_value")
        value.name = names.fresh(f"{hint}_const")
        if as_initializers:
            assert isinstance(graph, ir.Graph)
            graph.register_initializer(value)
        else:
            attr = ir.AttrTensor("value", value.const_value)
            constant_nodes.append(ir.Node("", "Constant", [], [attr], outputs=[value]))
    return constant_nodes


def apply_replacement(
    graph: ir.Graph | ir.Function,
    match: Match,
    replacement: Replacement,
    names: FreshNames | None = None,
) -> Mismatch | None:
    """Insert the new nodes before the root, move users, drop matched nodes left unused.

    ``names`` is needed only when the replacement brings new constants.
    """
    for old, new in replacement.values:
        problem = _can_replace(old, new, graph, replacement.nodes)
        if problem is not None:
            # A new node uses its inputs from birth: leave no phantom uses behind.
            for node in replacement.nodes:
                node.resize_inputs(0)
            return problem
    root = match.root
    new_nodes = list(replacement.nodes)
    if replacement.constants:
        if names is None:
            raise ValueError("apply_replacement needs FreshNames to add constants")
        new_nodes = _materialize_constants(graph, root, replacement.constants, names) + new_nodes
    if new_nodes:
        graph.insert_before(match.anchor or root, new_nodes)
    for old, new in replacement.values:
        was_output = old.is_graph_output()
        name = old.name
        if new.type is None:
            new.type = old.type
        if new.shape is None and old.shape is not None:
            new.shape = old.shape
        ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
        if was_output:
            old.name = None
            new.name = name
    read = [v for node in match.nodes for v in node.inputs if v is not None]
    for node in reversed(list(match.nodes)):
        if node.graph is body(graph) and is_unread(node):
            remove_nodes(graph, node)
    _release_unread_weights(read)
    return None


def _release_unread_weights(values: Sequence[ir.Value]) -> None:
    """Weights that the removed nodes read and nothing reads any more: a tensor that can let go
    of its data (a weight mapped from the file) does, so that a fusion writing new weights (a
    merge) does not keep the old ones resident too. It is read again if anything asks."""
    for value in values:
        tensor = value.const_value
        if tensor is None or value.is_graph_output() or value.uses():
            continue
        release = getattr(tensor, "release", None)
        if callable(release):
            # onnx-ir closes an external file's map, which fails while an array still views it:
            # then the map stays (the tensor reloads when read).
            with contextlib.suppress(BufferError):
                release()


def apply_rules(
    model: ir.Model,
    rules: Sequence[Rule],
    options: PassOptions,
    *,
    max_rounds: int = 16,
) -> tuple[Counter[str], list[str]]:
    """Apply ``rules`` everywhere until none matches; return (counts per rule, mismatch notes)."""
    stats: Counter[str] = Counter()
    notes: list[str] = []
    names = FreshNames(model)
    by_op: dict[str, list[Rule]] = {}
    for rule in rules:
        by_op.setdefault(rule.op_type, []).append(rule)
    for graph in list(iter_graphs(model)):
        context = RewriteContext(model, graph, options)
        for _ in range(max_rounds):
            changed = False
            final_round_notes: list[str] = []
            for node in list(graph):
                if node.graph is not body(graph):
                    continue  # removed by an earlier rewrite this round
                for rule in by_op.get(node.op_type, ()):
                    if not is_op(node, rule.op_type, rule.domain):
                        continue
                    outcome = rule.match(node, context)
                    if isinstance(outcome, Mismatch):
                        if options.explain and outcome.candidate:
                            final_round_notes.append(
                                f"{rule.name}: {describe(node)}: {outcome.reason}"
                            )
                        continue
                    replacement = rule.rewrite(outcome, context)
                    if isinstance(replacement, Mismatch):
                        if options.explain and replacement.candidate:
                            final_round_notes.append(
                                f"{rule.name}: {describe(node)}: {replacement.reason}"
                            )
                        continue
                    problem = apply_replacement(graph, outcome, replacement, names)
                    if problem is not None:
                        if options.explain:
                            final_round_notes.append(
                                f"{rule.name}: {describe(node)}: {problem.reason}"
                            )
                        continue
                    stats[rule.name] += 1
                    changed = True
                    break  # the node may be gone; move on to the next one
            if not changed:
                notes.extend(final_round_notes)
                break
    return stats, notes
