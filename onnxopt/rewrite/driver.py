"""The driver: walk every graph (subgraphs included) in order, try rules, apply replacements."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence

import onnx_ir as ir

from onnxopt.ops import is_op
from onnxopt.passes.options import PassOptions
from onnxopt.rewrite.rule import Match, Mismatch, Replacement, RewriteContext, Rule

logger = logging.getLogger(__name__)


def iter_graphs(model: ir.Model) -> Iterator[ir.Graph | ir.Function]:
    """The main graph, every nested subgraph (deterministic order) and every model-local function."""
    yield model.graph
    yield from model.graph.subgraphs()
    for function in model.functions.values():
        yield function
        yield from function.subgraphs()


def describe(node: ir.Node) -> str:
    return f"{node.op_type} '{node.name}'" if node.name else node.op_type


def _can_replace(
    old: ir.Value, new: ir.Value, graph: ir.Graph | ir.Function, new_nodes: Sequence[ir.Node] = ()
) -> Mismatch | None:
    if not old.is_graph_output():
        return None
    # The graph output keeps its name; the new value must be free to take it.
    if new.is_graph_input() or new.is_graph_output() or new.is_initializer():
        return Mismatch("its result is a graph output and the replacement is a graph input, output or initializer")
    producer = new.producer()
    if producer is None or (producer.graph is not graph and not any(producer is n for n in new_nodes)):
        return Mismatch("its result is a graph output and the replacement comes from another scope")
    return None


def apply_replacement(graph: ir.Graph | ir.Function, match: Match, replacement: Replacement) -> Mismatch | None:
    """Insert the new nodes before the root, move users, drop matched nodes left unused."""
    for old, new in replacement.values:
        problem = _can_replace(old, new, graph, replacement.nodes)
        if problem is not None:
            return problem
    root = match.root
    if replacement.nodes:
        graph.insert_before(match.anchor or root, replacement.nodes)
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
    for node in reversed(list(match.nodes)):
        if node.graph is graph and all(not out.uses() and not out.is_graph_output() for out in node.outputs):
            graph.remove(node, safe=True)
    return None


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
    by_op: dict[str, list[Rule]] = {}
    for rule in rules:
        by_op.setdefault(rule.op_type, []).append(rule)
    for graph in list(iter_graphs(model)):
        context = RewriteContext(model, graph, options)
        for _ in range(max_rounds):
            changed = False
            final_round_notes: list[str] = []
            for node in list(graph):
                if node.graph is not graph:
                    continue  # removed by an earlier rewrite this round
                for rule in by_op.get(node.op_type, ()):
                    if not is_op(node, rule.op_type, rule.domain):
                        continue
                    outcome = rule.match(node, context)
                    if isinstance(outcome, Mismatch):
                        if options.explain:
                            final_round_notes.append(f"{rule.name}: {describe(node)}: {outcome.reason}")
                        continue
                    replacement = rule.rewrite(outcome, context)
                    if isinstance(replacement, Mismatch):
                        if options.explain:
                            final_round_notes.append(f"{rule.name}: {describe(node)}: {replacement.reason}")
                        continue
                    problem = apply_replacement(graph, outcome, replacement)
                    if problem is not None:
                        if options.explain:
                            final_round_notes.append(f"{rule.name}: {describe(node)}: {problem.reason}")
                        continue
                    stats[rule.name] += 1
                    changed = True
                    break  # the node may be gone; move on to the next one
            if not changed:
                notes.extend(final_round_notes)
                break
    return stats, notes
