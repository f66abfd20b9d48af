"""Shared helpers for the fusion tests: build models from ONNX text, run a pass, compare on ORT."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir

from onnxopt.io import model_from_proto
from onnxopt.passes.base import Pass, PassResult
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.validate import validate


def parse(text: str, **initializers: np.ndarray) -> ir.Model:
    """A model from ONNX text, shapes inferred; keyword arrays become initializers of the same name."""
    proto = onnx.parser.parse_model(text)
    for name, array in initializers.items():
        proto.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(array), name))
    model = model_from_proto(proto)
    InferShapesPass()(model)
    return model


def op_types(model: ir.Model) -> list[str]:
    return [
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
        for n in model.graph
    ]


def run_checked(pass_: Pass, model: ir.Model) -> PassResult:
    """Run ``pass_`` on a clone; assert ORT agrees with the original and a second run changes nothing."""
    result = pass_(model.clone())
    report = validate(model, result.model)
    assert report.passed, report
    again = type(pass_)(pass_.options)(result.model.clone())
    assert not again.modified, again.stats
    return result


def rng_array(*shape: int, seed: int = 0, positive: bool = False) -> np.ndarray:
    array = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return np.abs(array) + 0.5 if positive else array
