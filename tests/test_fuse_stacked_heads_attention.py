"""FuseAttentionPass on heads flattened into the batch out of one stacked Q/K/V tensor.

SAM's and ViTDet's image encoders (transformers' SamVisionAttention, VitDetAttention; Meta's
segment-anything) view each window of h x w tokens' projection as [B, T, 3, H, d], permute it to
[3, B, H, T, d], view that as [3, B*H, T, d] and unbind it; the scores get decomposed relative
positions computed from q, and P@V [B*H, T, d] goes back onto the grid as [B, H, h, w, d], moved
by [0, 2, 3, 1, 4] and viewed as [B, h, w, H*d]:

- TorchScript unbinds with Split + Squeeze, dynamo with Squeeze(Slice);
- ViTDet adds its terms to a [B*H, h, w, h, w] view of the scores and views them back; SAM adds
  the terms' sum, viewed as [B*H, S, T], to the flat scores.

The models' output is the attention output itself, so a wrong head order or bias layout shows.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxopt.passes.fuse_attention import FuseAttentionPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests.fusion_util import op_types, parse

SIDE, HEADS, D = 2, 2, 4  # windows of 2 x 2 tokens, 2 heads of 4
T, C = SIDE * SIDE, HEADS * D

# Q/K/V parts of the stacked [3, B*H, T, d] view, one spelling per exporter.
SPLIT_PARTS = """
            qs, ks, vs = Split<axis=0>(flat, ones3)
            q = Squeeze(qs, zero1)
            k = Squeeze(ks, zero1)
            v = Squeeze(vs, zero1)"""
SLICE_PARTS = """
            qs = Slice(flat, zero1, one1, zero1)
            ks = Slice(flat, one1, two1, zero1)
            vs = Slice(flat, two1, three1, zero1)
            q = Squeeze(qs, zero1)
            k = Squeeze(ks, zero1)
            v = Squeeze(vs, zero1)"""
# The decomposed relative positions computed from q: rh5 [N, h, w, h, 1] and rw5 [N, h, w, 1, w].
RELATIVE = """
            rq = Reshape(q, grid)
            rh = Einsum<equation="bhwc,hkc->bhwk">(rq, relh)
            rw = Einsum<equation="bhwc,wkc->bhwk">(rq, relw)"""
# The scores with those terms: ViTDet's rank-5 view and back ...
VIEW_TERMS = """
            s5 = Reshape(scores, five)
            a1 = Add(s5, rh5)
            a2 = Add(a1, rw5)
            biased = Reshape(a2, back)"""
# ... or SAM's sum of the terms viewed flat.
FLAT_TERMS = """
            rel = Add(rh5, rw5)
            rel3 = Reshape(rel, back)
            biased = Add(scores, rel3)"""


def _model(
    parts: str = SPLIT_PARTS,
    terms: str = VIEW_TERMS,
    *,
    perm: str = "0, 2, 3, 1, 4",
    stacked: str = f"3, -1, {T}, {D}",
    rows: str = "",
) -> ir.Model:
    """One windowed attention block x [B, h, w, C] -> y [B, h, w, C] (see the module docstring);
    ``perm``: P@V's move on the grid; ``stacked``: the target of the [3, B*H, T, d] view;
    ``rows``: a suffix of the relative-position terms' names, whose "1" versions are their mean
    over the rows (one row each)."""
    text = f"""
        <ir_version: 9, opset_import: ["" : 18]>
        agraph (float[B, {SIDE}, {SIDE}, {C}] x) => (float[B, {SIDE}, {SIDE}, {C}] y) <
            int64[5] parts5 = {{0, {T}, 3, {HEADS}, -1}},
            int64[4] stacked = {{{stacked}}},
            int64[3] ones3 = {{1, 1, 1}},
            int64[1] zero1 = {{0}},
            int64[1] one1 = {{1}},
            int64[1] two1 = {{2}},
            int64[1] three1 = {{3}},
            int64[1] four1 = {{4}},
            int64[4] grid = {{-1, {SIDE}, {SIDE}, {D}}},
            int64[5] five = {{-1, {SIDE}, {SIDE}, {SIDE}, {SIDE}}},
            int64[3] back = {{-1, {T}, {T}}},
            int64[5] grid5 = {{-1, {HEADS}, {SIDE}, {SIDE}, {D}}},
            int64[4] merged = {{0, {SIDE}, {SIDE}, -1}},
            float half = {{0.5}}
        > {{
            qkv = MatMul(x, w)
            qkv5 = Reshape(qkv, parts5)
            p = Transpose<perm=[2, 0, 3, 1, 4]>(qkv5)
            flat = Reshape(p, stacked){parts}
            qscaled = Mul(q, half)
            kt = Transpose<perm=[0, 2, 1]>(k)
            scores = MatMul(qscaled, kt){RELATIVE}
            rh1 = ReduceMean<keepdims=1>(rh, zero1)
            rw1 = ReduceMean<keepdims=1>(rw, zero1)
            rh5 = Unsqueeze(rh{rows}, four1)
            rw5 = Unsqueeze(rw{rows}, three1){terms}
            probs = Softmax<axis=-1>(biased)
            pv = MatMul(probs, v)
            pv5 = Reshape(pv, grid5)
            pt = Transpose<perm=[{perm}]>(pv5)
            y = Reshape(pt, merged)
        }}
    """
    return _parse(text, seed=0)


def _parse(text: str, seed: int) -> ir.Model:
    """The model with seeded weights: the packed projection and the relative-position tables."""
    rng = np.random.default_rng(seed)
    weights = {
        "w": rng.standard_normal((C, 3 * C)) * 0.6,
        "relh": rng.standard_normal((SIDE, SIDE, D)),
        "relw": rng.standard_normal((SIDE, SIDE, D)),
    }
    return parse(text, **{name: array.astype(np.float32) for name, array in weights.items()})


def _feeds() -> list[dict[str, np.ndarray]]:
    return [
        {"x": np.random.default_rng(b).standard_normal((b, SIDE, SIDE, C)).astype(np.float32)}
        for b in (1, 3)
    ]


@pytest.mark.parametrize("parts", [SPLIT_PARTS, SLICE_PARTS], ids=["split", "slice"])
@pytest.mark.parametrize("terms", [VIEW_TERMS, FLAT_TERMS], ids=["view-terms", "flat-terms"])
def test_stacked_heads_with_relative_positions_fuse(parts: str, terms: str) -> None:
    model = _model(parts, terms)
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(explain=True))(fused)
    assert result.stats == {"attention->mha": 1}, result.notes
    types = op_types(fused)
    # the stacked Transpose and the unbind go; the query's heads stay for the relative positions
    assert "Softmax" not in types and "Split" not in types and "Squeeze" not in types
    assert types.count("Transpose") == 3  # q (for the terms), K and V as [B, H, T, d]
    assert [t for t in types if t == "Slice"] == []
    report = validate(model, fused, inputs=_feeds())
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


def _unchanged(model: ir.Model, reason: str) -> None:
    before = ir.to_proto(model).SerializeToString()
    result = FuseAttentionPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert any(reason in note for note in result.notes), result.notes
    assert ir.to_proto(model).SerializeToString() == before  # the respelling taken back


def test_a_grid_merge_that_swaps_the_grid_axes_is_not_fused() -> None:
    """[B, H, h, w, d] moved by [0, 3, 2, 1, 4]: the windows' tokens come out transposed, not in
    the fused output's order."""
    _unchanged(_model(perm="0, 3, 2, 1, 4"), "viewed on an image grid, but not provably")


def test_terms_that_do_not_span_the_rows_are_not_fused() -> None:
    """Terms of one row each ([1, h, w, h, 1] and [1, h, w, 1, w]) broadcast over the scores'
    rows in the rank-5 view: their sum is not the [B*H, S, T] term the view back would make of
    it."""
    _unchanged(_model(rows="1"), "do not provably span its dim 0")


def test_single_row_terms_added_flat_fuse() -> None:
    """The same terms summed and viewed flat (SAM's spelling) are a [1, S, T] term: it broadcasts
    over the rows in the fused op's bias as it did in the scores."""
    model = _model(terms=FLAT_TERMS, rows="1")
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(explain=True))(fused)
    assert result.stats == {"attention->mha": 1}, result.notes
    assert validate(model, fused, inputs=_feeds()).passed


def _sdpa_model() -> ir.Model:
    """SAM's SDPA path as TorchScript writes it: the stacked view's B*H is ``Mul(B, H)`` read at
    run time beside a -1, each part viewed as [B, H, T, -1] for the attention, the terms' sum
    viewed as a [B, H, S, T] mask, and P@V [B, H, S, d] put back on the grid."""
    text = f"""
        <ir_version: 9, opset_import: ["" : 18]>
        agraph (float[B, {SIDE}, {SIDE}, {C}] x) => (float[B, {SIDE}, {SIDE}, {C}] y) <
            int64[5] parts5 = {{0, {T}, 3, {HEADS}, -1}},
            int64 zero = {{0}},
            int64 heads = {{{HEADS}}},
            int64[1] zero1 = {{0}},
            int64[1] three1 = {{3}},
            int64[1] four1 = {{4}},
            int64[1] heads1 = {{{HEADS}}},
            int64[1] tokens1 = {{{T}}},
            int64[1] minus1 = {{-1}},
            int64[3] ones3 = {{1, 1, 1}},
            int64[4] grid = {{-1, {SIDE}, {SIDE}, {D}}},
            int64[4] mask4 = {{-1, {HEADS}, {T}, {T}}},
            int64[5] grid5 = {{0, {HEADS}, {SIDE}, {SIDE}, -1}},
            int64[4] merged = {{0, {SIDE}, {SIDE}, -1}},
            float half = {{0.5}}
        > {{
            shape = Shape(x)
            b0 = Gather(shape, zero)
            bh0 = Mul(b0, heads)
            b = Unsqueeze(b0, zero1)
            bh = Unsqueeze(bh0, zero1)
            stacked = Concat<axis=0>(three1, bh, tokens1, minus1)
            view4 = Concat<axis=0>(b, heads1, tokens1, minus1)
            qkv = MatMul(x, w)
            qkv5 = Reshape(qkv, parts5)
            p = Transpose<perm=[2, 0, 3, 1, 4]>(qkv5)
            flat = Reshape(p, stacked){SPLIT_PARTS}
            q4 = Reshape(q, view4)
            k4 = Reshape(k, view4)
            v4 = Reshape(v, view4)
            qscaled = Mul(q4, half)
            kt = Transpose<perm=[0, 1, 3, 2]>(k4)
            scores = MatMul(qscaled, kt){RELATIVE}
            rh5 = Unsqueeze(rh, four1)
            rw5 = Unsqueeze(rw, three1)
            rel = Add(rh5, rw5)
            rel4 = Reshape(rel, mask4)
            biased = Add(scores, rel4)
            probs = Softmax<axis=-1>(biased)
            pv = MatMul(probs, v4)
            pv5 = Reshape(pv, grid5)
            pt = Transpose<perm=[0, 2, 3, 1, 4]>(pv5)
            y = Reshape(pt, merged)
        }}
    """
    return _parse(text, seed=1)


def test_a_minus_one_beside_batch_times_heads_is_inferred() -> None:
    """``reshape(3, B*H, T, -1)`` with B*H = Mul(B, H) read at run time: the product cancels
    against the input's B and H, so the -1 is d, and ``view(B, H, T, -1)`` of a part is d again
    (the exporter's SDPA scale, 1/sqrt of that dim, then folds to a constant)."""
    model = _sdpa_model()
    values = {v.name: v for node in model.graph for v in node.outputs}
    assert values["q"].shape is not None and values["q"].shape[2] == D
    shape = values["q4"].shape
    assert shape is not None and list(shape)[1:] == [HEADS, T, D]
    assert getattr(shape[0], "value", None) == "B"


def test_the_sdpa_spelling_fuses() -> None:
    model = _sdpa_model()
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(explain=True))(fused)
    assert result.stats == {"attention->mha": 1}, result.notes
    types = op_types(fused)
    assert "Softmax" not in types and "Split" not in types
    report = validate(model, fused, inputs=_feeds())
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified
