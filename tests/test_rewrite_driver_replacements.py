"""Driver behaviour the cleanup passes rely on: refused replacements leave no trace, constants."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxopt.passes.options import PassOptions
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule, apply_rules
from tests._pass_check import load, op_types


def _match_any(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    return Match([node])


def _relu_of_input_standing_for_input(match: Match, context: RewriteContext) -> Replacement:
    source = match.root.inputs[0]
    assert source is not None
    relu = ir.Node("", "Relu", [source])
    return Replacement((relu,), ((match.root.outputs[0], source),))


def test_refused_replacement_leaves_no_phantom_uses() -> None:
    model = load(
        '<ir_version: 8, opset_import: ["" : 13]>\ng (float[2] x) => (float[2] y) { y = Identity(x) }'
    )
    rule = Rule("test", "Identity", _match_any, _relu_of_input_standing_for_input)
    stats, notes = apply_rules(model, [rule], PassOptions(explain=True))
    assert not stats
    assert any("graph input" in note for note in notes)
    x = model.graph.inputs[0]
    assert [use.node.op_type for use in x.uses()] == ["Identity"]


def _add_one(match: Match, context: RewriteContext) -> Replacement:
    one = ir.Value(name=None, const_value=ir.tensor(np.ones(2, dtype=np.float32)))
    add = ir.Node("", "Add", [match.root.inputs[0], one])
    return Replacement((add,), ((match.root.outputs[0], add.outputs[0]),), (one,))


def test_replacement_constants_become_named_initializers() -> None:
    text = '<ir_version: 8, opset_import: ["" : 13]>\ng (float[2] x) => (float[2] y) <float[2] Neg_const = {0.0, 0.0}> { y = Neg(x) }'
    model = load(text)
    stats, _ = apply_rules(model, [Rule("neg->add", "Neg", _match_any, _add_one)], PassOptions())
    assert dict(stats) == {"neg->add": 1}
    assert op_types(model) == ["Add"]
    # The hint "Neg_const" is taken, so the new initializer gets a fresh name.
    assert sorted(model.graph.initializers) == ["Neg_const", "Neg_const_1"]
    assert [v.name for v in model.graph.outputs] == ["y"]
