"""The design-notes test recipe for rewrite passes, shared by the per-pass test files."""

from __future__ import annotations

from collections.abc import Mapping

import onnx.parser
import onnx_ir as ir

from onnxopt.io import model_from_proto
from onnxopt.passes.base import Pass
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate


def load(text: str) -> ir.Model:
    """An ONNX text model with every value's type and shape inferred (as the pipeline does first)."""
    model = model_from_proto(onnx.parser.parse_model(text))
    InferShapesPass()(model)
    return model


def op_types(model: ir.Model) -> list[str]:
    return [node.op_type for node in model.graph]


def assert_rewrites(
    pass_type: type[Pass], text: str, stats: Mapping[str, int], ops: list[str], trials: int = 1
) -> ir.Model:
    """Positive case: exact stats and ops after, equal outputs on ORT (``trials`` input sizes), idempotent."""
    original = load(text)
    result = pass_type()(original.clone())
    assert dict(result.stats) == dict(stats)
    assert op_types(result.model) == ops
    report = validate(original, result.model)
    assert report.passed, report
    assert len(report.trials) == trials
    again = pass_type()(result.model)
    assert not again.modified, again.stats
    return result.model


def assert_refuses(pass_type: type[Pass], text: str, reason: str) -> None:
    """Negative case: nothing changes and some rule explains why with ``reason``."""
    model = load(text)
    before = op_types(model)
    result = pass_type(PassOptions(explain=True))(model)
    assert not result.modified, result.stats
    assert op_types(result.model) == before
    assert any(reason in note for note in result.notes), result.notes
