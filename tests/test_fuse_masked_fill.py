"""FuseAttentionPass on masked_fill attention: ``Softmax(Where(keep, scores, fill) [+ mask]) @ V``.

GPT-Neo (and any ``scores.masked_fill(~keep, torch.finfo(torch.float32).min)``) writes its causal
mask as a Where on the scores instead of an additive bias; for fill <= -1e30 it is the bias
``Where(keep, 0, fill)`` exactly (the argument is on ``_MaskedFill``). The graphs here feed the
condition as an input, so that the checks can mask whole rows.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest

from onnxopt import api
from onnxopt.ops import const_array
from onnxopt.passes.fuse_attention import FuseAttentionPass
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate

D, H, HEAD = 8, 2, 4
LOWEST = "-3.4028234663852886e38"


def _weights(seed: int = 0) -> str:
    rng = np.random.default_rng(seed)

    def mat(name: str, shape: tuple[int, ...]) -> str:
        values = ", ".join(f"{v:.4f}" for v in rng.standard_normal(int(np.prod(shape))) * 0.5)
        return f"float[{', '.join(map(str, shape))}] {name} = {{{values}}}"

    return ",\n".join(mat(name, (D, D)) for name in ("wq", "wk", "wv"))


def _model(
    *,
    fill: str = LOWEST,
    scores_first: bool = True,
    padding: bool = True,
    condition: str = "input",
    fill_from: str = "constant",
    opset: int = 17,
    zeroed: str = "",
    keep_heads: int = 1,
    scale_after: str = "",
    second_fill: str = "",
) -> ir.Model:
    """x [B, S, 8], keep [B, 1, S, S] (bool) and a [B, S] padding mask -> one attention block of
    2 heads of 4 whose scores go through ``Where(keep, scores, fill)`` (``scores_first``) or
    ``Where(Not(keep), fill, scores)`` (masked_fill's own spelling), then get the padding mask's
    ``Where(mask, 0, lowest)`` added (``padding``), as GPT-Neo's export does.
    ``condition="scores"`` picks by ``scores > 0`` instead; ``fill_from="input"`` fills with an
    input instead of a constant. ``zeroed`` (DeBERTa's XSoftmax before transformers 5): the
    probabilities zeroed again where the fill masked (``"same"``), or where ``keep`` is false
    while the fill read ``scores > 0`` (``"other"``); ``keep_heads``: keep's dim 1.
    ``scale_after`` (CodeGen before transformers 5): the scores are scaled only after their
    terms, by that constant (``Div``), and not before. ``second_fill``: a second masked_fill
    after the first, with that value where ``mask`` pads (hand-written decoders mask twice)."""
    cond = "keep" if condition == "input" else "positive"
    if zeroed:
        zero_cond = "keep" if zeroed == "other" else cond
        if scores_first:
            zeroing = f"probs = Where({zero_cond}, p0, zero)"
        else:
            zeroing = f"probs = Where({'drop' if zeroed == 'same' else 'Not_keep'}, zero, p0)"
            if zeroed == "other":
                zeroing = "Not_keep = Not(keep)\n            " + zeroing
    if scores_first:
        filled = f"filled = Where({cond}, scores, {'fill_in' if fill_from == 'input' else 'fill'})"
    else:
        filled = f"drop = Not({cond})\n            filled = Where(drop, fill, scores)"
    extra = ", float fill_in" if fill_from == "input" else ""
    last = "refilled" if second_fill else "filled"
    text = f"""
        <ir_version: 9, opset_import: ["" : {opset}]>
        agraph (float[B, S, 8] x, bool[B, {keep_heads}, S, S] keep, int64[B, S] mask{extra})
            => (float[B, S, 8] y) <
            {_weights()},
            int64[4] heads = {{0, 0, 2, 4}},
            int64[3] merged = {{0, 0, 8}},
            int64[2] mask_axes = {{1, 2}},
            float sq = {{0.70710678}},
            float after = {{{scale_after or "1.0"}}},
            float unit = {{1.0}},
            float zero = {{0.0}},
            float fill = {{{fill}}},
            float lowest = {{{LOWEST}}},
            float second = {{{second_fill or "0.0"}}}
        > {{
            q = MatMul(x, wq)
            k = MatMul(x, wk)
            v = MatMul(x, wv)
            qr = Reshape(q, heads)
            q4 = Transpose<perm=[0,2,1,3]>(qr)
            kr = Reshape(k, heads)
            kt = Transpose<perm=[0,2,3,1]>(kr)
            vr = Reshape(v, heads)
            v4 = Transpose<perm=[0,2,1,3]>(vr)
            raw = MatMul(q4, kt)
            scores = Mul(raw, {"unit" if scale_after else "sq"})
            {"positive = Greater(scores, zero)" if condition == "scores" else ""}
            {filled}
            mbool = Cast<to=9>(mask)
            mb = Unsqueeze(mbool, mask_axes)
            pad = Where(mb, zero, lowest)
            {"refilled = Where(mb, filled, second)" if second_fill else ""}
            {f"masked = Add({last}, pad)" if padding else ""}
            {f"divided = Div({'masked' if padding else last}, after)" if scale_after else ""}
            {"p0" if zeroed else "probs"} = Softmax<axis=-1>({"divided" if scale_after else "masked" if padding else last})
            {zeroing if zeroed else ""}
            pv = MatMul(probs, v4)
            pt = Transpose<perm=[0,2,1,3]>(pv)
            y = Reshape(pt, merged)
        }}
    """
    proto = onnx.parser.parse_model(text)
    onnx.checker.check_model(proto)
    model = ir.serde.deserialize_model(proto)
    InferShapesPass()(model)
    return model


def _feeds(batch: int, seq: int, seed: int, spread: float = 1.0) -> dict[str, np.ndarray]:
    """Causal ``keep``; row 1 fully padded, row 2 right-padded, and in row 3 every key of query 0
    dropped by ``keep`` (a row the fill alone masks fully). ``spread`` scales x (scores grow
    with its square)."""
    rng = np.random.default_rng(seed)
    keep = np.broadcast_to(np.tril(np.ones((seq, seq), dtype=bool)), (batch, 1, seq, seq)).copy()
    mask = np.ones((batch, seq), dtype=np.int64)
    if batch > 1:
        mask[1, :] = 0
    if batch > 2:
        mask[2, (seq + 1) // 2 :] = 0
    if batch > 3:
        keep[3, 0, 0, :] = False
    feeds = {"x": (rng.standard_normal((batch, seq, D)) * spread).astype(np.float32), "keep": keep}
    return {**feeds, "mask": mask}


SIZES = ((4, 5), (1, 1), (4, 9), (2, 3))


def _fused_and_checked(
    model: ir.Model, options: PassOptions | None = None, spread: float = 1.0
) -> ir.Model:
    fused = model.clone()
    result = FuseAttentionPass(options or PassOptions(explain=True))(fused)
    expected = "attention->onnx-attention" if options and options.target == "onnx" else None
    assert result.stats == {expected or "attention->mha": 1}, result.notes
    feeds = [_feeds(b, s, i, spread) for i, (b, s) in enumerate(SIZES)]
    report = validate(model, fused, inputs=feeds)
    assert report.passed, report
    assert not FuseAttentionPass(options or PassOptions())(fused).modified
    return fused


@pytest.mark.parametrize("fill", [LOWEST, "-1e30", "-inf"])
@pytest.mark.parametrize("scores_first", [True, False])
def test_masked_fill_and_padding_fuse_into_one_attention_bias(
    fill: str, scores_first: bool
) -> None:
    fused = _fused_and_checked(_model(fill=fill, scores_first=scores_first))
    types = [node.op_type for node in fused.graph]
    assert "Softmax" not in types and types.count("MultiHeadAttention") == 1
    mha = next(n for n in fused.graph if n.op_type == "MultiHeadAttention")
    assert mha.attributes.get_float("scale") == pytest.approx(0.70710678, rel=1e-6)
    # the padding mask plus Where(keep, 0, fill) (or Where(drop, fill, 0))
    bias_sum = mha.inputs[5].producer()  # type: ignore[union-attr]
    assert bias_sum is not None and bias_sum.op_type == "Add"
    fill_bias = bias_sum.inputs[1].producer()  # type: ignore[union-attr]
    assert fill_bias is not None and fill_bias.op_type == "Where"
    zero_at = 1 if scores_first else 2
    assert const_array(fill_bias.inputs[zero_at]) == 0.0


def test_a_masked_fill_alone_is_the_attention_bias() -> None:
    fused = _fused_and_checked(_model(padding=False))
    mha = next(n for n in fused.graph if n.op_type == "MultiHeadAttention")
    assert mha.inputs[5].producer().op_type == "Where"  # type: ignore[union-attr]


@pytest.mark.parametrize("fill", ["-1e9", "-1e8"])
@pytest.mark.parametrize("scores_first", [True, False])
def test_a_hand_written_fill_alone_is_raised_to_the_mask_floor(
    fill: str, scores_first: bool
) -> None:
    """``masked_fill(mask == 0, -1e9)``: s - 1e9 is not -1e9 once |s| reaches 32 (float32's step
    there is 64), so the fused bias fills with -1e30, which every score leaves as it is: a fully
    masked row (query 0 of the fourth sequence) is uniform in both. x is spread so that the
    scores reach the hundreds."""
    fused = _fused_and_checked(
        _model(fill=fill, padding=False, scores_first=scores_first), spread=8.0
    )
    mha = next(n for n in fused.graph if n.op_type == "MultiHeadAttention")
    bias = mha.inputs[5].producer()
    assert bias is not None and bias.op_type == "Where"
    assert const_array(bias.inputs[2 if scores_first else 1]) == np.float32(-1e30)


@pytest.mark.parametrize("fill", [LOWEST, "-1e30", "-1e9"])
def test_target_onnx_fuses_a_single_masked_fill_with_the_mask_floor(fill: str) -> None:
    # ORT's Attention-23 zeroes a row of float32's lowest; raised to -1e30 the row stays uniform,
    # as the export's row of fills is.
    fused = _fused_and_checked(
        _model(fill=fill, padding=False, opset=23), PassOptions(target="onnx"), spread=8.0
    )
    types = [node.op_type for node in fused.graph]
    assert types.count("Attention") == 1 and "Max" in types


def test_target_onnx_refuses_a_masked_fill_plus_padding() -> None:
    model = _model(opset=23)
    result = FuseAttentionPass(PassOptions(target="onnx", explain=True))(model.clone())
    assert not result.modified
    assert any("several additive terms" in note for note in result.notes), result.notes


@pytest.mark.parametrize("fill", [LOWEST, "-inf"])
def test_packed_attention_keeps_fully_masked_rows(fill: str) -> None:
    # -O2 packs the three projections of x into com.microsoft.Attention: its kernel gives the
    # export's uniform rows where the fill masks a whole row, and NaN where it is all -inf.
    model = _model(fill=fill)
    result = api.optimize(model.clone(), check=False)
    types = [node.op_type for node in result.model.graph]
    assert types.count("Attention") == 1 and "Softmax" not in types, types
    report = validate(
        model, result.model, inputs=[_feeds(b, s, i) for i, (b, s) in enumerate(SIZES)]
    )
    assert report.passed, report


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        (
            {"fill": "-1e4"},
            "masked_fill with -10000 is not an exact additive mask: a kept score near -10000 "
            "would share the masked keys' weight (fills <= -1e+08 are fused)",
        ),
        (
            {"fill": "-1e9"},
            "a masked_fill of -1e+09 (above -1e+30) is fused only with other masked_fills, not "
            "beside other terms, clamped or beside sinks",
        ),
        (
            {"condition": "scores"},
            "the masked_fill condition is computed from the scores themselves, so it is not a mask",
        ),
        (
            {"fill_from": "input"},
            "the masked_fill Where's other branch is not a float scalar constant",
        ),
    ],
)
def test_masked_fills_that_are_not_additive_masks_are_refused(
    kwargs: dict[str, str], reason: str
) -> None:
    model = _model(**kwargs)  # type: ignore[arg-type]
    result = FuseAttentionPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert result.notes == [f"attention->mha: Softmax 'probs': {reason}"] or any(
        note.endswith(reason) for note in result.notes
    ), result.notes


@pytest.mark.parametrize("scores_first", [True, False])
def test_probabilities_zeroed_where_masked_fuse_with_their_rows_kept_or_zeroed(
    scores_first: bool,
) -> None:
    """DeBERTa's XSoftmax (transformers before 5): ``Where(~keep, 0, Softmax(Where(~keep, fill,
    s)))``. A row that keeps no key is 0 in the export (uniform after the Softmax, then zeroed):
    the fused output's row is multiplied by whether it keeps a key; the other zeroed entries are
    exactly 0 already. The feeds mask one query's every key."""
    model = _model(scores_first=scores_first, padding=False, zeroed="same")
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(explain=True))(fused)
    assert result.stats == {"attention->mha": 1}, result.notes
    types = [node.op_type for node in fused.graph]
    assert "Softmax" not in types and "ReduceMax" in types
    feeds = [_feeds(b, s, i) for i, (b, s) in enumerate(SIZES)]
    report = validate(model, fused, inputs=feeds)
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified
    portable = model.clone()
    result = FuseAttentionPass(PassOptions(target="onnx", explain=True))(portable)
    assert not result.stats  # opset 17: no Attention-23 (refused for that reason)
    at_23 = _model(scores_first=scores_first, padding=False, zeroed="same", opset=23)
    result = FuseAttentionPass(PassOptions(target="onnx", explain=True))(portable := at_23.clone())
    assert result.stats == {"attention->onnx-attention": 1}, result.notes
    report = validate(at_23, portable, inputs=feeds)
    assert report.passed, report


def test_probabilities_zeroed_otherwise_or_per_head_are_not_fused() -> None:
    other = _model(condition="scores", padding=False, zeroed="other")
    before = [n.op_type for n in other.graph]
    assert not FuseAttentionPass()(other).modified
    assert [n.op_type for n in other.graph] == before
    per_head = _model(padding=False, zeroed="same", keep_heads=2)
    result = FuseAttentionPass(PassOptions(explain=True))(per_head)
    assert not result.stats
    assert any("not provably one for all heads" in note for note in result.notes), result.notes


@pytest.mark.parametrize("padding", [True, False])
def test_scores_scaled_after_their_terms_fuse_with_the_terms_scaled(padding: bool) -> None:
    """CodeGen before transformers 5: ``Softmax((Q@K^T + mask) / c)``. (s + m) / c = s / c + m / c:
    the fused op scales Q@K^T by 1/c and gets the summed terms divided by c (the fill stays far
    below -1e30, an exact mask)."""
    model = _model(padding=padding, scale_after="1.41421356")
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(explain=True))(fused)
    assert result.stats == {"attention->mha": 1}, result.notes
    mha = next(n for n in fused.graph if n.op_type == "MultiHeadAttention")
    assert mha.attributes.get_float("scale") == pytest.approx(1 / 1.41421356)
    report = validate(model, fused, inputs=[_feeds(b, s, i) for i, (b, s) in enumerate(SIZES)])
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


@pytest.mark.parametrize(("fill", "after"), [("-1e31", "100.0"), ("-1e9", "8.0")])
def test_a_fill_scaled_above_the_mask_floor_is_raised(fill: str, after: str) -> None:
    """``masked_fill(...) / c`` with the fill alone: -1e31 / 100 and -1e9 / 8 are above -1e30,
    so the fused bias fills with -1e30 * c, which the terms' 1/c makes -1e30. Scores in the
    hundreds and a fully masked row."""
    model = _model(padding=False, fill=fill, scale_after=after)
    fused = _fused_and_checked(model, spread=8.0)
    mha = next(n for n in fused.graph if n.op_type == "MultiHeadAttention")
    assert mha.attributes.get_float("scale") == pytest.approx(1 / float(after))


def test_a_fill_scaled_above_the_raised_limit_is_not_fused() -> None:
    """-1e9 / 100 is -1e7: a kept score near it is a number a model can compute."""
    model = _model(padding=False, fill="-1e9", scale_after="100.0")
    result = FuseAttentionPass(PassOptions(explain=True))(model)
    assert not result.stats
    assert any("no longer an exact additive mask" in note for note in result.notes), result.notes


def test_a_fill_is_raised_only_where_its_type_holds_the_raised_value() -> None:
    """-1e30 divided by the scale after the fill must be finite in the fill's type: float16 holds
    no such value, and a scale of 1e-10 overflows float32."""
    from onnxopt.passes.fuse_attention import _MaskedFill, _raisable

    def fill(dtype: type, filled: float = -1e9) -> _MaskedFill:
        value = ir.Value(name="fill", const_value=ir.tensor(np.array(filled, dtype)))
        value.dtype = ir.DataType.from_numpy(np.dtype(dtype))
        return _MaskedFill(ir.Value(name="keep"), value, scores_first=True, raised=True)

    assert _raisable(fill(np.float32), 0.125)
    assert not _raisable(fill(np.float32), 1e-10)
    assert not _raisable(fill(np.float16, -65504.0), 1e-5)


@pytest.mark.parametrize(
    ("inner", "outer"), [(LOWEST, LOWEST), ("-1e9", "-1e9"), ("-1e30", LOWEST), ("-inf", "-inf")]
)
def test_two_masked_fills_nest_in_the_bias(inner: str, outer: str) -> None:
    """``s.masked_fill(~causal, f).masked_fill(~pad, f)``: an entry both fills mask holds the
    outer fill, not the sum of the two (float32's lowest twice is -inf): the bias is the outer
    fill's Where around the inner one's. Rows 1 (fully padded) and 3 (query 0 masked by the
    causal fill alone) mask every key."""
    fused = _fused_and_checked(_model(fill=inner, padding=False, second_fill=outer), spread=8.0)
    mha = next(n for n in fused.graph if n.op_type == "MultiHeadAttention")
    outer_where = mha.inputs[5].producer()
    assert outer_where is not None and outer_where.op_type == "Where"
    assert outer_where.inputs[1].producer().op_type == "Where"  # type: ignore[union-attr]


def test_two_masked_fills_beside_a_term_or_raised_apart_are_left() -> None:
    result = FuseAttentionPass(PassOptions(explain=True))(_model(second_fill=LOWEST))
    assert not result.stats
    assert any("several masked_fills beside other terms" in n for n in result.notes), result.notes
    result = FuseAttentionPass(PassOptions(explain=True))(
        _model(fill="-1e9", padding=False, second_fill="-2e9")
    )
    assert not result.stats
    assert any("raised, they would no longer differ" in n for n in result.notes), result.notes
