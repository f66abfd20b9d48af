"""Half-precision models: fusions, folding and validation on float16 graphs (hand-built, converted)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxopt.io import model_from_proto
from onnxopt.passes.fold_constants import FoldConstantsPass
from onnxopt.passes.fuse_attention import FuseAttentionPass
from onnxopt.passes.fuse_conv_activation import FuseConvActivationPass
from onnxopt.passes.fuse_conv_bn import FuseConvBnPass
from onnxopt.passes.fuse_group_query_attention import FuseGroupQueryAttentionPass
from onnxopt.passes.fuse_layer_norm import FuseLayerNormPass
from onnxopt.passes.fuse_packed_attention import FusePackedAttentionPass
from onnxopt.passes.fuse_rms_norm import FuseRmsNormPass
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import TOLERANCES, compare_arrays, output_precisions, validate
from tests._pass_check import load
from tests.fusion_util import op_types, parse
from tests.test_fuse_attention import _model as sdpa_model
from tests.test_fuse_group_query_attention import _model as repeated_kv_model
from tests.test_fuse_packed_attention import _model as packed_model

F16 = ir.DataType.FLOAT16


def half(model: ir.Model, *, keep_io_types: bool = False) -> ir.Model:
    """``model`` converted to float16 by ONNX Runtime's converter (onnxconverter-common's algorithm)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    used = model.clone()
    for name, value in list(used.graph.initializers.items()):
        if not value.uses():  # the converter leaves unused ones float32 behind float16 types
            del used.graph.initializers[name]
    proto = convert_float_to_float16(ir.serde.serialize_model(used), keep_io_types=keep_io_types)
    converted = model_from_proto(proto)
    converted.graph.sort()  # the converter appends the Casts it inserts at the graph's end
    InferShapesPass()(converted)
    return converted


def _checked(pass_type: type, model: ir.Model, options: PassOptions | None = None) -> ir.Model:
    """Run the pass on a clone; ORT agrees with the original (float16 tolerance) and it is idempotent."""
    fused = model.clone()
    result = pass_type(options or PassOptions())(fused)
    assert result.modified
    report = validate(model, fused)
    assert report.passed, report
    assert not pass_type(options or PassOptions())(fused.clone()).modified
    return fused


def _node(model: ir.Model, op_type: str) -> ir.Node:
    return next(n for n in model.graph if n.op_type == op_type)


def test_float16_attention_block_fuses_into_multi_head_attention() -> None:
    model = half(sdpa_model())
    fused = model.clone()
    result = FuseAttentionPass()(fused)
    assert result.stats == {"attention->mha": 1}
    mha = _node(fused, "MultiHeadAttention")
    assert all(v.dtype == F16 for v in mha.inputs[:3] if v is not None)
    report = validate(model, fused)
    assert report.passed, report
    assert all(o.dtype == "float16" for o in report.outputs)
    assert not FuseAttentionPass()(fused).modified


def test_float16_mask_is_refused_for_onnx_attention_with_the_reason() -> None:
    from onnxopt import io

    model = io.convert_opset(half(sdpa_model(nan_guard=False, masked_value="lowest")), 23)
    result = FuseAttentionPass(PassOptions(target="onnx", explain=True))(model)
    assert not result.modified
    assert any("mask is FLOAT16: it cannot hold" in note for note in result.notes), result.notes


def test_float16_projections_pack_into_attention_with_a_float16_zero_bias() -> None:
    model = half(load(packed_model(separate=True, biases=(True, False, True))))
    fused = _checked(FusePackedAttentionPass, model)
    attention = _node(fused, "Attention")
    weight, bias = attention.inputs[1], attention.inputs[2]
    assert weight is not None and bias is not None
    assert weight.dtype == F16 and bias.dtype == F16
    assert bias.const_value is not None
    assert not bias.const_value.numpy()[8:16].any()  # K had no bias


def test_float16_repeated_kv_stays_multi_head_attention_with_the_reason() -> None:
    # GroupQueryAttention's CUDA kernel is always causal and takes no attention_bias.
    model = half(repeated_kv_model())
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert "com.microsoft::MultiHeadAttention" in op_types(model)
    assert any("FLOAT16: only float32 is rewritten" in n for n in result.notes), result.notes


_LAYER_NORM_ISLAND = """
<ir_version: 8, opset_import: ["" : 18]>
g (float16[B, S, 4] x) => (float16[B, S, 4] y) <float eps = {0.00001}, float two = {2.0}, int64[1] last = {-1}> {
    x32 = Cast<to=1>(x)
    mean = ReduceMean(x32, last)
    d = Sub(x32, mean)
    sq = Pow(d, two)
    var = ReduceMean(sq, last)
    ve = Add(var, eps)
    sd = Sqrt(ve)
    n32 = Div(d, sd)
    n = Cast<to=10>(n32)
    g = Mul(n, gamma)
    y = Add(g, beta)
}
"""


def _layer_norm_island(outputs: str = "") -> ir.Model:
    return parse(
        _LAYER_NORM_ISLAND.replace("float16[B, S, 4] y)", f"float16[B, S, 4] y{outputs})"),
        gamma=np.array([0.5, 1.5, -1.0, 2.0], np.float16),
        beta=np.array([0.1, 0.2, 0.3, -0.4], np.float16),
    )


def test_layer_norm_float32_island_becomes_one_float16_layer_norm() -> None:
    fused = _checked(FuseLayerNormPass, _layer_norm_island())
    assert op_types(fused) == ["LayerNormalization"]
    norm = _node(fused, "LayerNormalization")
    assert [v.dtype for v in norm.inputs if v is not None] == [F16, F16, F16]
    assert norm.attributes.get_int("stash_type", 1) == 1


def test_layer_norm_island_whose_widened_input_is_read_elsewhere_fuses_in_float32() -> None:
    fused = _checked(FuseLayerNormPass, _layer_norm_island(", float[B, S, 4] x32"))
    assert op_types(fused) == ["Cast", "LayerNormalization", "Cast", "Mul", "Add"]
    norm = _node(fused, "LayerNormalization")
    assert all(v is not None and v.dtype == ir.DataType.FLOAT for v in norm.inputs)


_RMS_NORM_ISLAND = """
<ir_version: 8, opset_import: ["" : 18]>
g (float16[B, S, 4] x) => (float16[B, S, 4] y) <float eps = {0.000001}, float two = {2.0}, int64[1] last = {-1}> {
    x32 = Cast<to=1>(x)
    sq = Pow(x32, two)
    var = ReduceMean(sq, last)
    ve = Add(var, eps)
    sd = Sqrt(ve)
    r = Reciprocal(sd)
    n32 = Mul(x32, r)
    n = Cast<to=10>(n32)
    y = Mul(w, n)
}
"""


@pytest.mark.parametrize(
    ("target", "op"), [("ort", "SimplifiedLayerNormalization"), ("onnx", "RMSNormalization")]
)
def test_llama_rms_norm_float32_island_becomes_one_float16_op(target: str, op: str) -> None:
    text = _RMS_NORM_ISLAND.replace('"" : 18', '"" : 23')
    model = parse(text, w=np.array([0.5, 1.5, -1.0, 2.0], np.float16))
    fused = _checked(FuseRmsNormPass, model, PassOptions(target=target))  # type: ignore[arg-type]
    assert op_types(fused) == [op]
    norm = _node(fused, op)
    assert [v.dtype for v in norm.inputs if v is not None] == [F16, F16]
    assert norm.attributes.get_int("stash_type", 1) == 1  # computes in float32 inside


def test_a_widened_input_read_outside_the_norm_keeps_its_island() -> None:
    text = _RMS_NORM_ISLAND.replace(
        "=> (float16[B, S, 4] y)", "=> (float16[B, S, 4] y, float[B, S, 4] x32)"
    )
    model = parse(text, w=np.array([0.5, 1.5, -1.0, 2.0], np.float16))
    fused = _checked(FuseRmsNormPass, model)
    assert op_types(fused) == ["Cast", "SimplifiedLayerNormalization", "Cast", "Mul"]


_FOLDED = """
<ir_version: 8, opset_import: ["" : 18]>
g (float16[4] x) => (float16[4] y) {
    s = Sqrt(a)
    t = Mul(s, c)
    y = Add(x, t)
}
"""


def test_folded_float16_constants_stay_float16() -> None:
    model = parse(_FOLDED, a=np.array([2, 3, 5, 7], np.float16), c=np.array(0.1, np.float16))
    folded = _checked(FoldConstantsPass, model)
    assert op_types(folded) == ["Add"]
    constant = _node(folded, "Add").inputs[1]
    assert constant is not None and constant.dtype == F16
    assert constant.const_value is not None and constant.const_value.dtype == F16


_CONV_BN = """
<ir_version: 8, opset_import: ["" : 18]>
g (float16[N, 2, 5, 5] x) => (float16[N, 3, 5, 5] y) {
    c = Conv<pads=[1, 1, 1, 1]>(x, w)
    y = BatchNormalization<epsilon=0.001>(c, gamma, beta, mean, var)
}
"""


def _conv_bn(var: np.ndarray) -> ir.Model:
    rng = np.random.default_rng(0)
    return parse(
        _CONV_BN,
        w=rng.standard_normal((3, 2, 3, 3)).astype(np.float16),
        gamma=np.array([0.7, 1.3, 0.9], np.float16),
        beta=np.array([0.1, -0.2, 0.05], np.float16),
        mean=np.array([0.3, -0.1, 0.2], np.float16),
        var=var,
    )


def test_conv_bn_folds_in_float64_and_rounds_once_to_float16() -> None:
    var = np.array([0.5, 1.7, 0.01], np.float16)
    model = _conv_bn(var)
    fused = _checked(FuseConvBnPass, model)
    assert op_types(fused) == ["Conv"]
    conv = _node(fused, "Conv")
    w, b = (v.const_value.numpy() for v in conv.inputs[1:] if v is not None and v.const_value)
    assert w.dtype == np.float16 and b.dtype == np.float16
    original = {
        k: v.const_value.numpy().astype(np.float64)
        for k, v in model.graph.initializers.items()
        if v.const_value
    }
    s = original["gamma"] / np.sqrt(original["var"] + np.float32(0.001))
    np.testing.assert_array_equal(w, (original["w"] * s[:, None, None, None]).astype(np.float16))
    np.testing.assert_array_equal(b, (original["beta"] - original["mean"] * s).astype(np.float16))


def test_conv_bn_whose_folded_weights_overflow_float16_is_refused() -> None:
    model = _conv_bn(np.array([0.5, 1.7, 0.0], np.float16))
    model.graph.node(1).attributes["epsilon"] = ir.AttrFloat32("epsilon", 1e-12)
    result = FuseConvBnPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert any("overflow float16" in note for note in result.notes), result.notes


def test_float16_conv_activation_is_not_fused_into_the_float32_only_fused_conv() -> None:
    model = parse(
        """
        <ir_version: 8, opset_import: ["" : 18]>
        g (float16[1, 2, 5, 5] x) => (float16[1, 3, 3, 3] y) {
            c = Conv(x, w)
            y = Relu(c)
        }
        """,
        w=np.ones((3, 2, 3, 3), np.float16),
    )
    result = FuseConvActivationPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert any("float32 kernels only" in note and "FLOAT16" in note for note in result.notes)


def test_outputs_computed_in_float16_behind_float32_io_get_float16_tolerance() -> None:
    model = half(sdpa_model(), keep_io_types=True)
    assert [str(v.dtype) for v in model.graph.outputs] == [str(ir.DataType.FLOAT)]
    assert output_precisions(model) == {"y": "float16"}
    assert output_precisions(sdpa_model()) == {"y": "float32"}  # pure float32: not loosened
    fused = _checked(FuseAttentionPass, model)
    report = validate(model, fused)
    assert report.outputs[0].dtype == "float32"
    assert (report.outputs[0].atol, report.outputs[0].rtol) == TOLERANCES["float16"]


def test_weights_stored_in_float16_do_not_loosen_a_float32_computation() -> None:
    # float16 weights and a float16 input, cast up: every computed value is float32
    model = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, 4] x, float16[B, 4] h) => (float[B, 4] y, float16[B, 4] z) {
            w32 = Cast <to = 1> (w)
            h32 = Cast <to = 1> (h)
            s = MatMul (x, w32)
            y = Add (s, h32)
            z = Cast <to = 10> (y)
        }
        """,
        w=np.eye(4, dtype=np.float16),
    )
    assert output_precisions(model) == {"y": "float32", "z": "float16"}


@pytest.mark.parametrize(
    ("precision", "passed"), [(None, False), ("float32", False), ("float16", True)]
)
def test_compare_arrays_takes_the_wider_of_dtype_and_precision(
    precision: str | None, passed: bool
) -> None:
    expected = np.array([1.0, 2.0], np.float32)
    actual = expected + np.float32(4e-3)
    assert compare_arrays("y", expected, actual, precision).passed is passed


def _fused_counts(model: ir.Model) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_half_precision_llama_tiny_fuses_and_validates(exporter: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from onnxopt.api import optimize
    from onnxopt.export import export

    path = tmp_path / "llama.onnx"
    export("benchmarks.fp16_sweep:llama_tiny", path, exporter=exporter)  # type: ignore[arg-type]
    result = optimize(path, level=3, find_reference=True)
    assert result.validated, result.report.validation
    reference = result.report.reference
    assert reference is not None and reference.optimized_passed
    counts = _fused_counts(result.model)
    assert counts.get("MultiHeadAttention") == 2  # not GroupQueryAttention: see its pass
    assert counts.get("SimplifiedLayerNormalization") == 5  # the float32 islands included
    assert counts.get("RotaryEmbedding") == 4
    assert "Softmax" not in counts and "ReduceMean" not in counts


@pytest.mark.slow
def test_converted_bert_tiny_with_float32_io_fuses_and_validates(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from onnxopt.api import optimize
    from onnxopt.export import export
    from scripts.convert_fp16 import convert

    single, converted = tmp_path / "bert.onnx", tmp_path / "bert.fp16.onnx"
    export("benchmarks.trained_like:bert_tiny", single, exporter="torchscript")
    convert(single, converted, keep_io_types=True)
    result = optimize(converted, level=3)
    assert result.validated, result.report.validation
    validation = result.report.validation
    assert validation is not None
    assert {(o.dtype, o.atol, o.rtol) for o in validation.outputs} == {
        ("float32", *TOLERANCES["float16"])
    }
    counts = _fused_counts(result.model)
    assert counts.get("Attention") == 2 and counts.get("LayerNormalization") == 5
