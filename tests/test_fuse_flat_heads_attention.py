"""FuseAttentionPass on attention computed with heads flattened into the batch (BLOOM's bmm form).

``Q3 = Reshape(Q4, [B*H, S, d])``, ``scores = Q3 @ K3^T * c + alibi`` ([B*H, S, T], ALiBi [B*H, 1, T]),
viewed as [B, H, S, T] for the mask, the probabilities viewed back as [B*H, S, T] for ``@ V3``, and
P@V viewed as [B, H, S, d] before the heads merge. The dynamo exporter records the views' shapes
(``4*batch``); the graphs here declare them the same way.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxopt.passes.fuse_attention import FuseAttentionPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests.fusion_util import parse

D, H, HEAD = 8, 2, 4
LOWEST = "-3.4028234663852886e38"


def _weights(seed: int = 0) -> str:
    rng = np.random.default_rng(seed)

    def mat(name: str) -> str:
        values = ", ".join(f"{v:.4f}" for v in rng.standard_normal(D * D) * 0.5)
        return f"float[{D}, {D}] {name} = {{{values}}}"

    return ",\n".join(mat(name) for name in ("wq", "wk", "wv"))


def _model(
    *,
    alibi_rows: str = "BH",
    query_view: str = "S",
    recorded: bool = True,
    flat_pv: bool = True,
    round_trip: str = "",
) -> ir.Model:
    """x [B, S, 8], alibi [``alibi_rows``, 1, S], a [B, S] padding mask -> one block of 2 heads
    of 4 in BLOOM's form; ``query_view`` names the flattened query's dim 1 (not S: its target
    says -1 there, and neither proves it). ``recorded=False`` leaves the Q/K/V views' shapes
    unrecorded: their targets prove them. ``flat_pv=False``: P@V on the [B, H, S, T]
    probabilities and [B, H, T, d] V (GPT-NeoX-Japanese: only Q@K^T is a bmm). ``round_trip``
    (CLIP's eager attention before transformers 5): a causal term [1, 1, S, S] is added to the
    [B, H, S, T] view first, the sum flattened again and viewed back to the target given (its
    dims named in the text) before the padding mask."""
    trip = ""
    if round_trip:
        trip = "wrong = Concat<axis=0>(b, two1, minus1, four1)\n" if round_trip == "wrong" else ""
        trip += f"""causal4 = Add(scores4, causal)
            c3 = Reshape(causal4, flat_again)
            c4 = Reshape(c3, {round_trip})"""
    if flat_pv:
        pv = """flat_p = Concat<axis=0>(bh, s, minus1)
            p3 = Reshape(probs, flat_p)
            pv3 = MatMul(p3, v3)
            heads4 = Concat<axis=0>(b, two1, s, four1)
            pv4 = Reshape(pv3, heads4)"""
    else:
        pv = "pv4 = MatMul(probs, v4)"
    views = (
        f"float[BH, {query_view}, 4] q3, float[BH, S, 4] k3, float[BH, S, 4] v3,"
        if recorded
        else ""
    )
    text = f"""
        <ir_version: 9, opset_import: ["" : 17]>
        agraph (float[B, S, 8] x, float[{alibi_rows}, 1, S] alibi, int64[B, S] mask
                {", float[1, 1, S, S] causal" if round_trip else ""})
            => (float[B, S, 8] y) <
            {views}
            float[BH, 4, S] kt3, float[BH, S, S] raw, float[BH, S, S] scaled,
            float[BH, S, S] biased, float[B, 2, S, S] scores4, float[BH, S, S] p3,
            {"float[B, 2, S, S] causal4, float[BH, S, S] c3, float[?, ?, ?, ?] c4," if round_trip else ""}
            float[BH, S, 4] pv3, float[B, 2, S, 4] pv4,
            {_weights()},
            int64[4] heads = {{0, 0, 2, 4}},
            int64[3] merged = {{0, 0, 8}},
            int64[2] mask_axes = {{1, 2}},
            int64[1] two1 = {{2}},
            int64[1] four1 = {{4}},
            int64[1] minus1 = {{-1}},
            float half = {{0.5}},
            float zero = {{0.0}},
            float lowest = {{{LOWEST}}}
        > {{
            q = MatMul(x, wq)
            k = MatMul(x, wk)
            v = MatMul(x, wv)
            qr = Reshape(q, heads)
            q4 = Transpose<perm=[0,2,1,3]>(qr)
            kr = Reshape(k, heads)
            k4 = Transpose<perm=[0,2,1,3]>(kr)
            vr = Reshape(v, heads)
            v4 = Transpose<perm=[0,2,1,3]>(vr)
            b = Shape<start=0, end=1>(x)
            s = Shape<start=1, end=2>(x)
            bh = Mul(b, two1)
            flat = Concat<axis=0>(bh, s, four1)
            flat_q = Concat<axis=0>(bh, {"s" if query_view == "S" else "minus1"}, four1)
            q3 = Reshape(q4, flat_q)
            k3 = Reshape(k4, flat)
            v3 = Reshape(v4, flat)
            kt3 = Transpose<perm=[0,2,1]>(k3)
            raw = MatMul(q3, kt3)
            scaled = Mul(raw, half)
            biased = Add(scaled, alibi)
            view = Concat<axis=0>(b, two1, s, minus1)
            scores4 = Reshape(biased, view)
            mbool = Cast<to=9>(mask)
            mb = Unsqueeze(mbool, mask_axes)
            pad = Where(mb, zero, lowest)
            flat_again = Concat<axis=0>(bh, s, minus1)
            view_back = Concat<axis=0>(b, two1, s, s)
            {trip}
            masked = Add({"c4" if round_trip else "scores4"}, pad)
            probs = Softmax<axis=-1>(masked)
            {pv}
            pt = Transpose<perm=[0,2,1,3]>(pv4)
            y = Reshape(pt, merged)
        }}
    """
    return parse(text)


def _feeds(batch: int, seq: int, seed: int, shared: bool = False) -> dict[str, np.ndarray]:
    """ALiBi-like slopes times key positions (``shared``: one row for all), row 1 fully padded,
    row 2 right-padded."""
    rng = np.random.default_rng(seed)
    slopes = np.array([0.25, 0.0625], dtype=np.float32)
    alibi = np.tile(slopes[:, None, None] * np.arange(seq, dtype=np.float32), (batch, 1, 1))
    mask = np.ones((batch, seq), dtype=np.int64)
    if batch > 1:
        mask[1, :] = 0
    if batch > 2:
        mask[2, (seq + 1) // 2 :] = 0
    x = rng.standard_normal((batch, seq, D)).astype(np.float32)
    alibi = alibi.reshape(batch * H, 1, seq)[:1] if shared else alibi.reshape(batch * H, 1, seq)
    return {"x": x, "alibi": alibi, "mask": mask}


def _fused_once(model: ir.Model) -> ir.Model:
    """A copy of ``model`` with its one block fused into MultiHeadAttention (scale 0.5): the
    three projections are the only MatMuls left."""
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(explain=True))(fused)
    assert result.stats == {"attention->mha": 1}, result.notes
    types = [node.op_type for node in fused.graph]
    assert "Softmax" not in types and types.count("MultiHeadAttention") == 1
    assert types.count("MatMul") == 3
    mha = next(n for n in fused.graph if n.op_type == "MultiHeadAttention")
    assert mha.attributes.get_float("scale") == pytest.approx(0.5)
    return fused


@pytest.mark.parametrize(
    ("alibi_rows", "recorded"), [("BH", True), ("1", True), ("BH", False), ("N", True)]
)
def test_flattened_heads_and_alibi_fuse_into_multi_head_attention(
    alibi_rows: str, recorded: bool
) -> None:
    model = _model(alibi_rows=alibi_rows, recorded=recorded)
    fused = _fused_once(model)
    sizes = ((3, 5), (1, 1), (4, 7))
    shared = alibi_rows == "1"
    # N rows: 1 or B*H (both fed), so the term is expanded to B*H rows first
    feeds = [
        _feeds(b, s, i, shared or (alibi_rows == "N" and i % 2 == 1))
        for i, (b, s) in enumerate(sizes)
    ]
    report = validate(model, fused, inputs=feeds)
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


def test_only_the_scores_on_flattened_heads_fuse() -> None:
    model = _model(flat_pv=False)
    fused = _fused_once(model)
    feeds = [_feeds(b, s, i) for i, (b, s) in enumerate(((3, 5), (1, 1), (2, 7)))]
    report = validate(model, fused, inputs=feeds)
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        (
            {"query_view": "L"},
            "the flattened query is not provably [B, H, S, d] viewed as [B*H, S, d]",
        ),
    ],
)
def test_unproven_flattened_views_are_refused(kwargs: dict[str, str], reason: str) -> None:
    result = FuseAttentionPass(PassOptions(explain=True))(_model(**kwargs))  # type: ignore[arg-type]
    assert not result.modified
    assert any(note.endswith(reason) for note in result.notes), result.notes


def test_target_onnx_refuses_a_term_of_the_flattened_scores() -> None:
    model = _model()
    model.opset_imports[""] = 23
    result = FuseAttentionPass(PassOptions(target="onnx", explain=True))(model)
    assert not result.modified
    assert any("several additive terms" in note for note in result.notes), result.notes


# The view targets' pieces: Q/K/V flattened, the scores viewed back, P flattened, P@V viewed back.
_VIEW_TARGETS = {
    "bloom": {
        "flat": "xbh1, minus1, four1",
        "scores": "mb1, two1, s1, minus1",
        "probs": "xbh1, s1, minus1",
        "pv": "pvb1, two1, s1, four1",
    },
    "deberta": {
        "flat": "minus1, s1, four1",
        "scores": "minus1, two1, s1, t1",
        "probs": "minus1, ps2, ps3",
        "pv": "minus1, two1, ps2, four1",
    },
    # DeBERTa-v3: the scores view reads S and T off the scores with their (relative) terms added
    "deberta-v3": {
        "flat": "minus1, s1, four1",
        "scores": "minus1, two1, bs2, bs3",
        "probs": "minus1, ps2, ps3",
        "pv": "minus1, two1, ps2, four1",
    },
}


def _torchscript_model(*, alibi_factor: int = H, views: str = "bloom") -> ir.Model:
    """The block as TorchScript writes BLOOM: no view shapes recorded; B*H as
    ``Unsqueeze(Gather(Shape(t), 0) * H)`` (off x for Q/K/V and P, off the ALiBi source ``slopes``
    [N, 2, S] for its [B*H, 1, T] view: a batch only the Add's broadcast ties to B); the flattened
    Q/K/V and P with -1 for a length; P@V's B as ``Shape(P@V)[0] / H`` for the views back.
    ``alibi_factor`` multiplies N in the ALiBi view (H: N*H rows).

    ``views="deberta"``: as DeBERTa-v2's TorchScript export, -1 for every B*H; the scores viewed
    with T read off the key projection, P viewed with S and T read off ``Shape(P)``."""
    targets = _VIEW_TARGETS[views]
    text = f"""
        <ir_version: 9, opset_import: ["" : 17]>
        agraph (float[B, S, 8] x, float[N, 2, S] slopes, int64[B, S] mask) => (float[B, S, 8] y) <
            {_weights()},
            int64[4] heads = {{0, 0, 2, 4}},
            int64 zero = {{0}},
            int64 one = {{1}},
            int64 two = {{2}},
            int64 factor = {{{alibi_factor}}},
            int64[1] axis0 = {{0}},
            int64[1] one1 = {{1}},
            int64[1] two1 = {{2}},
            int64[1] three1 = {{3}},
            int64[1] four1 = {{4}},
            int64[1] eight1 = {{8}},
            int64[1] minus1 = {{-1}},
            int64[2] mask_axes = {{1, 2}},
            float half = {{0.5}},
            float fzero = {{0.0}},
            float lowest = {{{LOWEST}}}
        > {{
            q = MatMul(x, wq)
            k = MatMul(x, wk)
            v = MatMul(x, wv)
            qr = Reshape(q, heads)
            q4 = Transpose<perm=[0,2,1,3]>(qr)
            kr = Reshape(k, heads)
            k4 = Transpose<perm=[0,2,1,3]>(kr)
            vr = Reshape(v, heads)
            v4 = Transpose<perm=[0,2,1,3]>(vr)
            xs = Shape(x)
            xb = Gather(xs, zero)
            xbh = Mul(xb, two)
            xbh1 = Unsqueeze(xbh, axis0)
            ms = Shape(mask)
            mb = Gather(ms, zero)
            mb1 = Unsqueeze(mb, axis0)
            msl = Gather(ms, one)
            s1 = Unsqueeze(msl, axis0)
            ss = Shape(slopes)
            sn = Gather(ss, zero)
            snh = Mul(sn, factor)
            snh1 = Unsqueeze(snh, axis0)
            ks = Shape(k)
            kt = Gather(ks, one)
            t1 = Unsqueeze(kt, axis0)
            flat = Concat<axis=0>({targets["flat"]})
            q3 = Reshape(q4, flat)
            k3 = Reshape(k4, flat)
            v3 = Reshape(v4, flat)
            kt3 = Transpose<perm=[0,2,1]>(k3)
            raw = MatMul(q3, kt3)
            scaled = Mul(raw, half)
            alibi_target = Concat<axis=0>(snh1, one1, s1)
            alibi = Reshape(slopes, alibi_target)
            biased = Add(scaled, alibi)
            bs = Shape(biased)
            bs2 = Slice(bs, one1, two1)
            bs3 = Slice(bs, two1, three1)
            view = Concat<axis=0>({targets["scores"]})
            scores4 = Reshape(biased, view)
            mbool = Cast<to=9>(mask)
            mk = Unsqueeze(mbool, mask_axes)
            pad = Where(mk, fzero, lowest)
            masked = Add(scores4, pad)
            probs = Softmax<axis=-1>(masked)
            ps = Shape(probs)
            ps2 = Slice(ps, two1, three1)
            ps3 = Slice(ps, three1, four1)
            flat_p = Concat<axis=0>({targets["probs"]})
            p3 = Reshape(probs, flat_p)
            pv3 = MatMul(p3, v3)
            pvs = Shape(pv3)
            pvbh = Gather(pvs, zero)
            pvb = Div(pvbh, two)
            pvb1 = Unsqueeze(pvb, axis0)
            heads4 = Concat<axis=0>({targets["pv"]})
            pv4 = Reshape(pv3, heads4)
            pt = Transpose<perm=[0,2,1,3]>(pv4)
            merge = Concat<axis=0>(pvb1, s1, eight1)
            y = Reshape(pt, merge)
        }}
    """
    return parse(text)


def _torchscript_feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    feeds = _feeds(batch, seq, seed)
    feeds["slopes"] = feeds.pop("alibi").reshape(batch, H, seq)
    return feeds


@pytest.mark.parametrize("views", ["bloom", "deberta", "deberta-v3"])
def test_torchscript_flattened_heads_fuse_with_dims_computed_at_run_time(views: str) -> None:
    """B*H read as a product, a length left -1 (fixed by the element count), P@V's B divided
    back out of its flat batch (the dim arithmetic dies with the block), the ALiBi view's B*H
    read off its own source; or DeBERTa-v2's -1 batch with T read off K and S, T off P."""
    model = _torchscript_model(views=views)
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(explain=True))(fused)
    assert result.stats == {"attention->mha": 1}, result.notes
    types = [node.op_type for node in fused.graph]
    assert "Softmax" not in types and "Div" not in types and types.count("MultiHeadAttention") == 1
    feeds = [_torchscript_feeds(b, s, i) for i, (b, s) in enumerate(((3, 5), (1, 1), (4, 7)))]
    report = validate(model, fused, inputs=feeds)
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


def test_torchscript_alibi_view_that_may_have_one_row_is_expanded_first() -> None:
    """ALiBi viewed as [N*1, 1, T]: N may be 1 and broadcast over every head and batch row, so
    the term is expanded to B*H rows (B read off the query) before it is viewed as [B, H, 1, T]
    (``_model(alibi_rows="N")`` runs that path on both row counts)."""
    model = _torchscript_model(alibi_factor=1)
    result = FuseAttentionPass(PassOptions(explain=True))(model)
    assert result.stats == {"attention->mha": 1}, result.notes
    expand = next(n for n in model.graph if n.op_type == "Expand" and n.inputs[0].name == "alibi")
    assert "Reshape" in [use.node.op_type for use in expand.outputs[0].uses()]


def _seq_first_model(*, weights_out: bool = False) -> ir.Model:
    """torch's multi_head_attention_forward on need_weights' bmm path: x [S, B, 8] sequence-first,
    heads flattened as ``Transpose(Reshape(q, [S, B*H, d]), [1, 0, 2])`` (K^T: [1, 2, 0]), the
    key padding mask [B*H, 1, S] added to the [B*H, S, S] scores, P@V merged as
    ``Reshape(Transpose(P@V, [1, 0, 2]), [-1, 8])``. ``weights_out``: the probabilities are an
    output too, so nothing may fuse."""
    extra = ", float[BH, S, S] probs" if weights_out else ""
    text = f"""
        <ir_version: 9, opset_import: ["" : 17]>
        agraph (float[S, B, 8] x, float[BH, 1, S] pad) => (float[M, 8] y{extra}) <
            {_weights(1)},
            int64[3] split = {{0, -1, 4}},
            int64[2] merged = {{-1, 8}},
            float quarter = {{0.5}}
        > {{
            q = MatMul(x, wq)
            k = MatMul(x, wk)
            v = MatMul(x, wv)
            qs = Reshape(q, split)
            q3 = Transpose<perm=[1,0,2]>(qs)
            scaled = Mul(q3, quarter)
            ks = Reshape(k, split)
            kt3 = Transpose<perm=[1,2,0]>(ks)
            vs = Reshape(v, split)
            v3 = Transpose<perm=[1,0,2]>(vs)
            raw = MatMul(scaled, kt3)
            masked = Add(pad, raw)
            probs = Softmax<axis=-1>(masked)
            pv3 = MatMul(probs, v3)
            pt = Transpose<perm=[1,0,2]>(pv3)
            y = Reshape(pt, merged)
        }}
    """
    return parse(text)


def _seq_first_feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    """Row 1 padded after its first key (torch's -inf mask, expanded over the heads)."""
    rng = np.random.default_rng(seed)
    pad = np.zeros((batch, 1, seq), dtype=np.float32)
    if batch > 1:
        pad[1, 0, 1:] = -np.inf
    pad = np.repeat(pad, H, axis=0)
    return {"x": rng.standard_normal((seq, batch, D)).astype(np.float32), "pad": pad}


def test_torch_sequence_first_bmm_attention_fuses() -> None:
    model = _seq_first_model()
    fused = _fused_once(model)
    feeds = [_seq_first_feeds(b, s, i) for i, (b, s) in enumerate(((3, 5), (1, 1), (2, 7)))]
    report = validate(model, fused, inputs=feeds)
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


def test_torch_sequence_first_bmm_attention_left_exactly_when_not_fused() -> None:
    model = _seq_first_model(weights_out=True)
    before = ir.to_proto(model).SerializeToString()
    result = FuseAttentionPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert any("not multiplied by V" in note for note in result.notes), result.notes
    assert ir.to_proto(model).SerializeToString() == before  # the stand-ins were taken back


@pytest.mark.parametrize("back", ["view", "view_back"])
def test_scores_flattened_and_viewed_back_between_two_terms_fuse(back: str) -> None:
    """CLIP's eager attention before transformers 5 adds its causal mask on the [B, H, S, T]
    view of the flat scores, flattens the sum and views it back before adding the padding mask:
    the round trip is the identity (its view back proved dim by dim), both terms fuse."""
    model = _model(round_trip=back)
    fused = _fused_once(model)
    assert "Reshape" in [n.op_type for n in model.graph]

    def feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
        causal = np.triu(np.full((seq, seq), -1e9, dtype=np.float32), 1)[None, None]
        return {**_feeds(batch, seq, seed), "causal": causal}

    report = validate(
        model, fused, inputs=[feeds(b, s, i) for i, (b, s) in enumerate(((3, 5), (1, 1), (2, 7)))]
    )
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


def test_a_view_back_not_proved_the_scores_shape_is_not_a_round_trip() -> None:
    """Viewed back as [B, H, T, S] (the sizes agree only where S == T) nothing proves dims 2
    and 3: the block is left as it is."""
    model = _model(round_trip="wrong")
    text_free = [n.op_type for n in model.graph]
    result = FuseAttentionPass(PassOptions(explain=True))(model)
    assert not result.stats, result.notes
    assert [n.op_type for n in model.graph] == text_free
