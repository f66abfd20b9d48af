"""Graph invariants every pass must preserve (checked by ``--verify-each`` and the tests)."""

from __future__ import annotations

import onnx_ir as ir


def verify_graph(graph: ir.Graph, outer: frozenset[int] = frozenset()) -> list[str]:
    """Return problems found: uses before definition, dangling values, duplicate names."""
    problems: list[str] = []
    defined: set[int] = set(outer)
    names: dict[str, str] = {}

    def define(value: ir.Value, what: str) -> None:
        defined.add(id(value))
        if value.name:
            if value.name in names:
                problems.append(f"name '{value.name}' is used by {names[value.name]} and {what}")
            names[value.name] = what

    for value in graph.inputs:
        define(value, "a graph input")
    for value in graph.initializers.values():
        if not value.is_graph_input():
            define(value, "an initializer")
    for node in graph:
        label = f"{node.op_type} '{node.name}'"
        for index, used in enumerate(node.inputs):
            if used is not None and id(used) not in defined:
                problems.append(f"{label} input {index} '{used.name}' is used before it is defined")
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                problems.extend(verify_graph(attr.as_graph(), frozenset(defined)))
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.as_graphs():
                    problems.extend(verify_graph(sub, frozenset(defined)))
        for value in node.outputs:
            define(value, label)
    for value in graph.outputs:
        if id(value) not in defined:
            problems.append(f"graph output '{value.name}' is not defined")
    return problems
