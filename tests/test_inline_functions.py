"""inline-functions: model-local functions (exported modules) are inlined so rewrites see them."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper as onh
import onnx.parser

from onnxopt import api
from onnxopt.io import model_from_proto
from onnxopt.passes.inline_functions import InlineFunctionsPass
from onnxopt.validate import validate

MODEL = """
<ir_version: 8, opset_import: ["" : 17, "my.mod" : 1]>
g (float[1, 3, 8, 8] x) => (float[1, 3, 8, 8] y) {
    a = my.mod.ConvBn(x, w1, gamma1, beta1, mean1, var1)
    y = my.mod.ConvBn(a, w2, gamma2, beta2, mean2, var2)
}
<domain: "my.mod", opset_import: ["" : FUNCTION_OPSET]>
ConvBn (x, w, gamma, beta, mean, var) => (y) {
    c = Conv <pads = [1, 1, 1, 1]> (x, w)
    b = BatchNormalization (c, gamma, beta, mean, var)
    y = Relu (b)
}
"""


def _model(function_domain: str = "my.mod", function_opset: int = 17) -> onnx.ModelProto:
    text = MODEL.replace("FUNCTION_OPSET", str(function_opset)).replace("my.mod", function_domain)
    proto = onnx.parser.parse_model(text)
    rng = np.random.default_rng(0)
    for call in (1, 2):
        weights = {
            "w": rng.standard_normal((3, 3, 3, 3)).astype(np.float32) * 0.3,
            "gamma": rng.uniform(0.5, 1.5, 3).astype(np.float32),
            "beta": rng.standard_normal(3).astype(np.float32),
            "mean": rng.standard_normal(3).astype(np.float32),
            "var": rng.uniform(0.5, 2.0, 3).astype(np.float32),
        }
        proto.graph.initializer.extend(onh.from_array(v, f"{k}{call}") for k, v in weights.items())
    return proto


def test_functions_are_inlined_and_their_bodies_fused() -> None:
    model = model_from_proto(_model())

    result = InlineFunctionsPass()(model.clone())

    assert dict(result.stats) == {"functions inlined": 1}
    assert [n.op_type for n in result.model.graph] == ["Conv", "BatchNormalization", "Relu"] * 2
    assert not result.model.functions
    assert validate(model, result.model).passed
    assert not InlineFunctionsPass()(result.model).modified

    optimized = api.optimize(model)
    assert optimized.validated
    assert [n.op_type for n in optimized.model.graph] == ["FusedConv", "FusedConv"]


def test_function_in_a_runtime_domain_is_kept() -> None:
    """A local com.microsoft function may stand for ORT's kernel of that name: leave the call."""
    model = model_from_proto(_model(function_domain="com.microsoft"))

    result = InlineFunctionsPass()(model)

    assert not result.modified
    assert dict(result.stats) == {"function calls kept: standard or contrib domain": 2}
    assert [n.op_type for n in model.graph] == ["ConvBn", "ConvBn"]


def test_function_importing_another_opset_is_kept() -> None:
    model = model_from_proto(_model(function_opset=13))

    result = InlineFunctionsPass()(model)

    assert not result.modified
    assert dict(result.stats) == {"function calls kept: opset differs from the model's": 2}
    assert len(model.functions) == 1


def test_a_function_body_reading_an_undefined_value_is_refused_at_load() -> None:
    # Inlining such a body crashed in onnx-ir (an internal error); it is a malformed model.
    import onnx.parser
    import pytest

    from onnxopt.errors import ModelLoadError
    from onnxopt.io import model_from_proto

    proto = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
        g (float[N, 4] x) => (float[N, 4] y) {
            y = local.bad(x)
        }
        <domain: "local", opset_import: ["" : 17]>
        bad (x) => (y) {
            y = Add(x, ghost)
        }
        """
    )
    with pytest.raises(ModelLoadError, match=r"local function 'local\.bad': .* uses 'ghost'"):
        model_from_proto(proto)
