"""Helpers shared by the tests: build small models from ONNX text and compare them on ORT."""

from __future__ import annotations

import onnx
import onnx.parser
import onnx_ir as ir

from onnxopt.io import model_from_proto
from onnxopt.rewrite import iter_graphs
from onnxopt.validate import validate


def parse_model(text: str) -> ir.Model:
    """An ir.Model from ONNX textual syntax, checked like a loaded file."""
    proto = onnx.parser.parse_model(text)
    return model_from_proto(proto, "<test model>")


def op_types(model: ir.Model) -> list[str]:
    return [node.op_type for graph in iter_graphs(model) for node in graph]


def assert_numerically_equal(original: ir.Model, optimized: ir.Model) -> None:
    report = validate(original, optimized)
    assert report.passed, (report.errors, [o for o in report.outputs if not o.passed])
