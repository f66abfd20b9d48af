"""KeepLayerNormUnfusedPass: the Add ORT would fuse into SkipLayerNormalization becomes Sum."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from onnxopt.passes.keep_layer_norm_unfused import KeepLayerNormUnfusedPass
from onnxopt.passes.options import PassOptions
from tests._pass_check import assert_refuses, assert_rewrites, load

RULE = "Add->Sum before LayerNormalization"


def _model(shape: str = "B, 4, 8", extra_use: bool = False, residual: str = "") -> str:
    also = "z = Relu(s)" if extra_use else "z = Relu(y)"
    return f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[{shape}] x, float[{residual or shape}] r) => (float[{shape}] z) <
            float[8] gamma = {{1.0, 0.5, 2.0, 1.5, 1.0, 0.25, 1.0, 3.0}},
            float[8] beta = {{0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7}}
        > {{
            s = Add(x, r)
            y = LayerNormalization <axis = -1> (s, gamma, beta)
            {also}
        }}
    """


def _ort_fused_ops(model_proto: onnx.ModelProto, tmp_path) -> list[str]:  # type: ignore[no-untyped-def]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "ort.onnx")
    ort.InferenceSession(
        model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return [n.op_type for n in onnx.load(str(tmp_path / "ort.onnx")).graph.node]


# a symbolic sequence too: ORT 1.32 fuses equal dim names (NomicBERT's residual after its fused
# attention ran 24 SkipLayerNormalizations, 2.6 ms per run more than the pairs)
@pytest.mark.parametrize("shape", ["B, 4, 8", "B, S, 8"])
def test_the_add_becomes_sum_and_ort_no_longer_fuses_it(shape: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    text = _model(shape)
    rewritten = assert_rewrites(
        KeepLayerNormUnfusedPass, text, {RULE: 1}, ["Sum", "LayerNormalization", "Relu"], 2
    )
    # the reason for the pass: ORT's ENABLE_ALL fuses the original pair, not the rewritten one
    assert "SkipLayerNormalization" in _ort_fused_ops(
        ir.serde.serialize_model(load(text)), tmp_path
    )
    assert "SkipLayerNormalization" not in _ort_fused_ops(
        ir.serde.serialize_model(rewritten), tmp_path
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (_model(residual="B, 1, 8"), "dims differ"),
        (_model(residual="1, 4, 8"), "dims differ"),
        (_model(extra_use=True), "feeds more than one node"),
        (_model(shape="B, 8"), "not known to be 3-D"),
    ],
)
def test_leaves_adds_ort_would_not_fuse(text: str, reason: str) -> None:
    assert_refuses(KeepLayerNormUnfusedPass, text, reason)


def test_target_onnx_keeps_the_add() -> None:
    model = load(_model())
    assert not KeepLayerNormUnfusedPass(PassOptions(target="onnx"))(model).modified
