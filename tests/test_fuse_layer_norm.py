from __future__ import annotations

import numpy as np
import pytest

from onnxopt.passes.fuse_layer_norm import FuseLayerNormPass, FuseSkipLayerNormPass
from onnxopt.passes.options import PassOptions
from tests.fusion_util import op_types, parse, rng_array, run_checked

LN_17 = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, S, 8] x) => (float[B, S, 8] y) {{
    mean = ReduceMean <axes = [{axis}]> (x)
    d = Sub (x, mean)
    two = Constant <value = float {{2.0}}> ()
    sq = Pow (d, two)
    var = ReduceMean <axes = [{axis}]> (sq)
    eps = Constant <value = float {{1e-5}}> ()
    ve = Add (var, eps)
    std = Sqrt (ve)
    n = Div (d, std)
    scaled = Mul (n, gamma)
    y = Add (scaled, beta)
}}
"""

LN_18_RECIPROCAL = """
<ir_version: 8, opset_import: ["" : 18]>
g (float[B, S, 8] x) => (float[B, S, 8] y) {
    axes = Constant <value = int64[1] {-1}> ()
    mean = ReduceMean (x, axes)
    d = Sub (x, mean)
    sq = Mul (d, d)
    var = ReduceMean (sq, axes)
    eps = Constant <value = float {1e-6}> ()
    ve = Add (eps, var)
    std = Sqrt (ve)
    r = Reciprocal (std)
    n = Mul (d, r)
    y = Mul (gamma, n)
}
"""


def _ln_model(text: str = LN_17, axis: int = -1):  # type: ignore[no-untyped-def]
    return parse(text.format(axis=axis), gamma=rng_array(8, seed=1), beta=rng_array(8, seed=2))


@pytest.mark.parametrize("target", ["onnx", "ort"])
def test_layer_norm_fused(target: str) -> None:
    result = run_checked(FuseLayerNormPass(PassOptions(target=target)), _ln_model())  # type: ignore[arg-type]
    assert result.stats == {"decomposed->LayerNormalization": 1}
    assert op_types(result.model) == ["Constant", "Constant", "LayerNormalization"]


def test_layer_norm_reciprocal_form_without_beta() -> None:
    result = run_checked(
        FuseLayerNormPass(), parse(LN_18_RECIPROCAL, gamma=rng_array(1, 1, 8, seed=3))
    )
    assert result.stats == {"decomposed(reciprocal)->LayerNormalization": 1}
    assert [t for t in op_types(result.model) if t != "Constant"] == ["LayerNormalization"]


def test_layer_norm_wrong_axis_is_explained() -> None:
    result = FuseLayerNormPass(PassOptions(explain=True))(_ln_model(axis=1))
    assert not result.modified
    assert result.notes == [
        "decomposed->LayerNormalization: Div: mean ReduceMean axes [1] are not the last axis (rank 3)"
    ]


def test_layer_norm_non_constant_epsilon() -> None:
    text = LN_17.format(axis=-1).replace("float[B, S, 8] x)", "float[B, S, 8] x, float eps_in)")
    text = text.replace("ve = Add (var, eps)", "ve = Add (var, eps_in)")
    model = parse(text, gamma=rng_array(8), beta=rng_array(8))
    result = FuseLayerNormPass(PassOptions(explain=True))(model)
    assert result.notes == ["decomposed->LayerNormalization: Div: epsilon is not a constant scalar"]


def test_layer_norm_needs_opset_17_for_target_onnx() -> None:
    text = LN_17.format(axis=-1).replace('"" : 17', '"" : 13')
    model = parse(text, gamma=rng_array(8), beta=rng_array(8))
    result = FuseLayerNormPass(PassOptions(target="onnx", explain=True))(model)
    assert result.notes == [
        "decomposed->LayerNormalization: Div: LayerNormalization needs opset 17, the model imports 13"
    ]
    # ONNX Runtime registers LayerNormalization for older opsets too.
    ort_result = run_checked(FuseLayerNormPass(PassOptions(target="ort")), model)
    assert ort_result.stats == {"decomposed->LayerNormalization": 1}


# Two norms of one input after common-subexpression elimination: one core, two scale/bias tails
# (GPT-NeoX's parallel residual exported at opset 14); ``{third}`` adds another reader of the core.
SHARED_CORE = (
    LN_17.format(axis=-1)
    .replace('"" : 17', '"" : 14')
    .replace("=> (float[B, S, 8] y)", "=> (float[B, S, 8] y1, float[B, S, 8] y2{third_out})")
    .replace(
        "scaled = Mul (n, gamma)\n    y = Add (scaled, beta)",
        "s1 = Mul (n, gamma1)\n    y1 = Add (s1, beta1)\n"
        "    s2 = Mul (gamma2, n)\n    y2 = Add (beta2, s2)\n    {third}",
    )
)


@pytest.mark.parametrize(
    "third, third_out, left",
    [
        ("", "", []),
        # the core read as it is keeps a LayerNormalization of scale 1 for that reader
        ("y3 = Relu (n)", ", float[B, S, 8] y3", ["Relu"]),
        # a tail without a bias, whose product is also a graph output
        ("y3 = Mul (n, gamma1)", ", float[B, S, 8] y3", []),
    ],
)
def test_shared_layer_norm_core_gets_one_norm_per_tail(
    third: str, third_out: str, left: list[str]
) -> None:
    model = parse(
        SHARED_CORE.replace("{third}", third).replace("{third_out}", third_out),
        gamma1=rng_array(8, seed=1),
        beta1=rng_array(8, seed=2),
        gamma2=rng_array(1, 1, 8, seed=3),
        beta2=rng_array(8, seed=4),
    )
    result = run_checked(FuseLayerNormPass(), model)
    tails = 3 if third.startswith("y3 = Mul") else 2
    assert result.stats == {
        "decomposed->LayerNormalization": 1,
        "LayerNormalization*gamma+beta->LayerNormalization": tails,
    }
    ops = [t for t in op_types(result.model) if t != "Constant"]
    norms = tails + (1 if left else 0)
    assert sorted(ops) == sorted(["LayerNormalization"] * norms + left)
    for node in result.model.graph:
        if node.op_type == "LayerNormalization" and node.outputs[0].is_graph_output():
            assert node.inputs[1] is not None and node.inputs[1].const_value is not None


def test_scaled_norm_near_misses_stay() -> None:
    """A scale that is not per channel, or a norm that already scales, is left alone."""
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[B, S, 8] x, float[B, S, 8] w) => (float[B, S, 8] y1, float[B, S, 8] y2) {
        n = LayerNormalization <epsilon = 1e-5> (x, ones)
        y1 = Mul (n, w)
        m = LayerNormalization <epsilon = 1e-5> (x, gamma)
        y2 = Mul (m, gamma)
    }
    """
    model = parse(text, ones=np.ones(8, np.float32), gamma=rng_array(8, seed=5))
    result = FuseLayerNormPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert result.notes == [
        "LayerNormalization*gamma+beta->LayerNormalization: Mul: the scale is not a constant "
        "per-channel vector of the hidden size"
    ]


SKIP_LN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, S, 8] x, float[B, S, 8] r) => (float[B, S, 8] y{extra_out}) {{
    h = Add (x, bias)
    s = Add (h, r)
    y = LayerNormalization <epsilon = 1e-5> (s, gamma, beta)
    {extra}
}}
"""


@pytest.mark.parametrize("keep_sum", [False, True])
def test_skip_layer_norm(keep_sum: bool) -> None:
    text = SKIP_LN.format(
        extra_out=", float[B, S, 8] z" if keep_sum else "", extra="z = Relu (s)" if keep_sum else ""
    )
    model = parse(
        text, bias=rng_array(8, seed=1), gamma=rng_array(8, seed=2), beta=rng_array(8, seed=3)
    )
    from onnxopt.passes.infer_shapes import InferShapesPass

    InferShapesPass()(model)
    result = run_checked(FuseSkipLayerNormPass(), model)
    assert result.stats == {"add+LayerNormalization->SkipLayerNormalization": 1}
    expected = ["com.microsoft::SkipLayerNormalization"] + (["Relu"] if keep_sum else [])
    assert op_types(result.model) == expected
    node = next(iter(result.model.graph))
    assert len(node.inputs) == 5  # input, skip, gamma, beta, bias


def test_skip_layer_norm_only_for_ort_and_known_shapes() -> None:
    model = parse(
        SKIP_LN.format(extra_out="", extra=""),
        bias=rng_array(8),
        gamma=rng_array(8),
        beta=rng_array(8),
    )
    assert not FuseSkipLayerNormPass(PassOptions(target="onnx"))(model.clone()).modified
    model.graph.inputs[1].shape = None
    result = FuseSkipLayerNormPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert len(result.notes) == 1 and "not the same known 2-D/3-D shape" in result.notes[0]


def test_skip_simplified_layer_norm_keeps_residual_sum() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[B, S, 8] x, float[B, S, 8] r) => (float[B, S, 8] y, float[B, S, 8] s) {
        s = Add (x, r)
        y = SimplifiedLayerNormalization <epsilon = 1e-6, axis = -1> (s, gamma)
    }
    """
    model = parse(text, gamma=rng_array(8, seed=2))
    result = run_checked(FuseSkipLayerNormPass(), model)
    assert result.stats == {"add+SimplifiedLayerNormalization->SkipSimplifiedLayerNormalization": 1}
    assert op_types(result.model) == ["com.microsoft::SkipSimplifiedLayerNormalization"]


# Keras' LayerNormalization through tf2onnx: TensorFlow's batch_normalization over the last axis,
# y = x * m + (beta - mean * m) with m = gamma / sqrt(var + eps); the means are GlobalAveragePools
# of the rank-3 tensor (a mean over its last axis) or ReduceMeans. ``{mean}`` and ``{shift}`` vary
# the spelling.
KERAS_LN = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[B, S, 8] x) => (float[B, S, 8] y) {{
    mean = {mean}
    d = Sub (x, mean)
    sq = Mul (d, d)
    var = {var}
    eps = Constant <value = float {{1e-3}}> ()
    ve = Add (var, eps)
    std = Sqrt (ve)
    inv = Reciprocal (std)
    m = Mul (inv, gamma)
    xm = Mul (x, m)
    {shift}
    y = Add (xm, c)
}}
"""
GAP = ("GlobalAveragePool (x)", "GlobalAveragePool (sq)")
REDUCE = ("ReduceMean <axes = [-1]> (x)", "ReduceMean <axes = [2]> (sq)")
TF_SHIFT = "mm = Mul (mean, m)\n    c = Sub (beta, mm)"  # tf.nn.batch_normalization
KERAS3_SHIFT = (
    "nm = Neg (mean)\n    nmm = Mul (nm, m)\n    c = Add (nmm, beta)"  # -mean * inv + beta
)
NO_BETA_SHIFT = "mm = Mul (mean, m)\n    c = Neg (mm)"  # center=False


def _keras_ln(means: tuple[str, str], shift: str, data: str = "float[B, S, 8] x"):  # type: ignore[no-untyped-def]
    text = KERAS_LN.format(mean=means[0], var=means[1], shift=shift).replace(
        "float[B, S, 8] x", data
    )
    return parse(text, gamma=rng_array(8, seed=4) + 1, beta=rng_array(8, seed=5))


@pytest.mark.parametrize(
    ("means", "shift", "beta"),
    [
        (GAP, TF_SHIFT, True),
        (REDUCE, TF_SHIFT, True),
        (GAP, KERAS3_SHIFT, True),
        (GAP, NO_BETA_SHIFT, False),
    ],
    ids=["tf2onnx-global-pool", "reduce-mean", "keras3-negated-mean", "no-beta"],
)
def test_keras_layer_norm_fused(means: tuple[str, str], shift: str, beta: bool) -> None:
    result = run_checked(FuseLayerNormPass(), _keras_ln(means, shift))
    assert result.stats == {"x*m+(beta-mean*m)->LayerNormalization": 1}
    assert [t for t in op_types(result.model) if t != "Constant"] == ["LayerNormalization"]
    (norm,) = [n for n in result.model.graph if n.op_type == "LayerNormalization"]
    assert (len(norm.inputs) == 3) == beta
    assert norm.attributes.get_float("epsilon") == pytest.approx(1e-3)


def test_keras_layer_norm_near_misses_stay() -> None:
    # GlobalAveragePool of a rank-4 tensor averages two axes: not a last-axis norm
    rank4 = _keras_ln(GAP, TF_SHIFT, data="float[B, S, 2, 8] x").clone()
    result = FuseLayerNormPass(PassOptions(explain=True))(rank4)
    assert not result.modified
    assert any("GlobalAveragePool of a rank-4 tensor" in note for note in result.notes)
    # the shift subtracts the mean times something other than m
    other = _keras_ln(GAP, TF_SHIFT.replace("Mul (mean, m)", "Mul (mean, inv)"))
    result = FuseLayerNormPass(PassOptions(explain=True))(other)
    assert not result.modified
    assert any("the shift is not beta - mean * m" in note for note in result.notes)


# tf2onnx's Keras LayerNormalization of a [B, D, T] residual stream r (TF Whisper's encoder, whose
# transpose optimizer keeps the stream channels-first): the statistics over r's axis 1, the norm
# transposed to [B, T, D]; the mean's transpose written as a Reshape of its size-1 axis.
TRANSPOSED_LN = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[B, 8, 6] r) => (float[B, 6, 8] y, float[B, 8, 6] out) {{
    mean = ReduceMean <axes = [{axis}]> (r)
    meant = {mean_view}
    d = Sub (r, mean)
    sq = Mul (d, d)
    var = ReduceMean <axes = [{axis}]> (sq)
    eps = Constant <value = float[1, 1, 1] {{1e-5}}> ()
    ve = Add (var, eps)
    std = Sqrt (ve)
    inv = Reciprocal (std)
    m = Mul (inv, gamma)
    mt = Transpose <perm = [0, 2, 1]> (m)
    mm = Mul (meant, mt)
    c = Sub (beta, mm)
    {term}
    y = Add (xm, c)
    out = Relu (r)
}}
"""
RESHAPED_MEAN = "Reshape (mean, to_b_t_1)"
TRANSPOSED_MEAN = "Transpose <perm = [0, 2, 1]> (mean)"
TWO_TRANSPOSES = "rt = Transpose <perm = [0, 2, 1]> (r)\n    xm = Mul (rt, mt)"
TRANSPOSED_PRODUCT = "rm = Mul (r, m)\n    xm = Transpose <perm = [0, 2, 1]> (rm)"


def _transposed_ln(mean_view: str, term: str, axis: int = 1, gamma=None):  # type: ignore[no-untyped-def]
    text = TRANSPOSED_LN.format(mean_view=mean_view, term=term, axis=axis)
    return parse(
        text,
        gamma=rng_array(1, 8, 1, seed=4) + 1 if gamma is None else gamma,
        beta=rng_array(8, seed=5),
        to_b_t_1=np.array([-1, 6, 1], dtype=np.int64),
    )


@pytest.mark.parametrize(
    "mean_view", [RESHAPED_MEAN, TRANSPOSED_MEAN], ids=["reshape", "transpose"]
)
@pytest.mark.parametrize(
    "term", [TWO_TRANSPOSES, TRANSPOSED_PRODUCT], ids=["two-transposes", "transposed-product"]
)
def test_transposed_keras_layer_norm_fused(mean_view: str, term: str) -> None:
    result = run_checked(FuseLayerNormPass(), _transposed_ln(mean_view, term))
    assert result.stats == {"transposed x*m+(beta-mean*m)->LayerNormalization": 1}
    ops = [t for t in op_types(result.model) if t != "Constant"]
    assert ops == ["Transpose", "LayerNormalization", "Relu"]
    (norm,) = [n for n in result.model.graph if n.op_type == "LayerNormalization"]
    assert norm.attributes.get_float("epsilon") == pytest.approx(1e-5)
    np.testing.assert_allclose(
        norm.inputs[1].const_value.numpy(), (rng_array(1, 8, 1, seed=4) + 1).reshape(-1)
    )


def test_transposed_keras_layer_norm_near_misses_stay() -> None:
    # statistics over the time axis, which the Transpose does not put last
    wrong_axis = _transposed_ln(TRANSPOSED_MEAN, TWO_TRANSPOSES, axis=2)
    result = FuseLayerNormPass(PassOptions(explain=True))(wrong_axis)
    assert not result.modified
    assert any("the statistics are not over axis 1" in note for note in result.notes)
    # a scale per time step, not per channel
    per_step = _transposed_ln(RESHAPED_MEAN, TWO_TRANSPOSES, gamma=rng_array(1, 1, 6, seed=4))
    assert not FuseLayerNormPass()(per_step).modified


# Flax's LayerNorm through jax2tf: the variance as max(0, E[x²] - E[x]²), the means as sums
# times 1/N reduced with keepdims=0 and viewed back.
FLAX_LN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, S, 8] x) => (float[B, S, 8] y) {
    axis = Constant <value = int64[1] {2}> ()
    back = Constant <value = int64[3] {0, 0, 1}> ()
    inv = Constant <value = float {0.125}> ()
    zero = Constant <value = float {0.0}> ()
    eps = Constant <value = float {1e-6}> ()
    s1 = ReduceSum <keepdims = 0> (x, axis)
    m1 = Mul (s1, inv)
    xx = Mul (x, x)
    s2 = ReduceSum <keepdims = 0> (xx, axis)
    m2 = Mul (s2, inv)
    mm = Mul (m1, m1)
    var = Sub (m2, mm)
    clamped = Max (zero, var)
    vv = Reshape (clamped, back)
    ve = Add (vv, eps)
    std = Sqrt (ve)
    r = Reciprocal (std)
    mv = Reshape (m1, back)
    d = Sub (x, mv)
    y = Mul (d, r)
}
"""


def test_moment_variance_norm_is_explained_not_fused() -> None:
    """E[x²] - E[x]² cancels where the mean is large against the spread, which
    LayerNormalization's E[(x - E[x])²] does not: fusing would change the results there."""
    result = FuseLayerNormPass(PassOptions(explain=True))(parse(FLAX_LN))
    assert not result.modified
    assert (
        "E[x²]-E[x]² norm->LayerNormalization: Sub: the variance is E[x²] − E[x]² (Flax's "
        "LayerNorm): LayerNormalization computes E[(x − E[x])²], which differs beyond tolerance "
        "where the mean is large against the spread; left as it is"
    ) in result.notes


def test_a_difference_of_other_moments_says_nothing() -> None:
    text = FLAX_LN.replace("mm = Mul (m1, m1)", "mm = Mul (m1, m2)")
    result = FuseLayerNormPass(PassOptions(explain=True))(parse(text))
    assert not result.modified
    assert not any(note.startswith("E[x²]-E[x]²") for note in result.notes), result.notes
