"""FuseAttentionPass: hand-built SDPA graphs (both exporter spellings) and tiny real exports."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest

from onnxopt.passes.fuse_attention import FuseAttentionPass, _all_equal_to, _mask_values
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate

B_DIM, D, H, HEAD = "B", 8, 2, 4


def _weights(seed: int = 0) -> str:
    rng = np.random.default_rng(seed)

    def mat(name: str, shape: tuple[int, ...]) -> str:
        values = ", ".join(f"{v:.4f}" for v in rng.standard_normal(int(np.prod(shape))) * 0.5)
        dims = ", ".join(map(str, shape))
        return f"float[{dims}] {name} = {{{values}}}"

    return ",\n".join(
        [
            mat("wq", (D, D)),
            mat("wk", (D, D)),
            mat("wv", (D, D)),
            mat("bq", (D,)),
            mat("bk", (D,)),
            mat("bv", (D,)),
        ]
    )


_MASK_FORMS = {
    "where": """mbool = Cast<to=9>(mask)
            mb = Unsqueeze(mbool, mask_axes)
            bias0 = Where(mb, zero, {masked_value})""",
    "arithmetic": """mfloat = Cast<to=1>(mask)
            mb = Unsqueeze(mfloat, mask_axes)
            dropped = Sub(one_f, mb)
            bias0 = Mul(dropped, {masked_value})""",
}


def _model(
    *,
    key_form: str = "torchscript",
    runtime_mask_shape: bool = False,
    softmax_axis: int = -1,
    masked_value: str = "ninf",
    nan_guard: bool = True,
    merge_target: str = "constant",
    scaled_projections: str = "",
    position_bias: bool = False,
    escaping_reads: str = "",
    mask_form: str = "where",
) -> ir.Model:
    seq = "5" if key_form == "dynamo-static" else "S"
    """x[B,S,8] and a [B,S] padding mask -> one SDPA block (2 heads of 4), as the exporters write it.

    ``merge_target="gathered"`` merges the heads back with a target read at run time as
    ``Concat(Gather(Shape(x), [0]), Gather(Shape(x), [1]), [8])`` (one-element index vectors, the
    form fold-shape-values leaves after sharing equal shape reads) instead of ``[0, 0, 8]``;
    ``"whole-shape"`` with ``Shape(x)``, whose static last dim is H*d (Qwen2 exported at opset 11
    merges by the embeddings' whole shape).
    ``scaled_projections`` names the [B, S, 8] projections ("q", "k") multiplied by a scalar before
    the head split, as fairseq-style models write ``q_proj(x) * scaling``. ``position_bias`` adds
    an input ``pos`` [1, 2, S, S] to the scores before the mask, as T5 and MPNet do.
    ``escaping_reads="pv"`` reads B, H and S off ``Shape(pv)`` for a Reshape after the block (as
    GPT-2's TorchScript SDPA export reads the batch size for its output projection); "scores"
    reads the key length T off the scores instead. ``mask_form="arithmetic"`` builds the bias as
    transformers 4.x and LayoutLM-style models do, ``(1 - mask.float()) * masked_value`` with
    ``masked_value`` a constant's name (``"minus_10000"``, ``"lowest"``)."""
    if key_form == "torchscript":  # K^T = Transpose(Reshape(k), [0,2,3,1])
        key_t = """
            kr = Reshape(kb, heads)
            kt = Transpose<perm=[0,2,3,1]>(kr)
        """
    elif key_form == "dynamo-static":  # as dynamo, once T is static: fold-shape-values' constants
        key_t = """
            kr = Reshape(kb, heads)
            k4 = Transpose<perm=[0,2,1,3]>(kr)
            kflat = Reshape(k4, flat_static)
            kflat_t = Transpose<perm=[0,2,1]>(kflat)
            kt = Reshape(kflat_t, back_static)
        """
    else:  # dynamo: K4 -> Reshape[-1,T,d] -> Transpose[0,2,1] -> Reshape[B,H,d,T] read off Shape(K4)
        key_t = """
            kr = Reshape(kb, heads)
            k4 = Transpose<perm=[0,2,1,3]>(kr)
            ks = Shape(k4)
            k_bh = Slice(ks, zero1, minus2)
            k_t = Slice(ks, minus2, minus1)
            k_d = Slice(ks, minus1, big)
            flat_shape = Concat<axis=0>(minus1, k_t, k_d)
            kflat = Reshape(k4, flat_shape)
            kflat_t = Transpose<perm=[0,2,1]>(kflat)
            back_shape = Concat<axis=0>(k_bh, k_d, k_t)
            kt = Reshape(kflat_t, back_shape)
        """
    # Both targets built from a length given elsewhere; "computed-view" also reshapes P@V to its
    # own [B, H, S, d] with such a target first, as the dynamo exporter writes SDPA.
    computed = merge_target in ("computed", "computed-view")
    view = merge_target == "computed-view"
    # P@V viewed as [B, H, S, d] with dims read off another input ``other`` [N, L] (Falcon's
    # TorchScript export reads S off the mask): "other-seq" reads S there (fixed by the element
    # count once B, H and d are proved), "other-batch-seq" B and S (nothing fixes them).
    other = merge_target in ("other-seq", "other-batch-seq")
    extra_input = ", float[N, L] other" if other else ""
    extra_input += ", int64[N] bias_shape" if runtime_mask_shape else ""
    extra_input += ", int64[1] length" if computed else ""
    split = "heads_c" if computed else "heads"
    key_t = key_t.replace("Reshape(kb, heads)", f"Reshape(kb, {split})")
    extra_input += ", float[1, 2, S, S] pos" if position_bias else ""
    expand = "bias = Expand(bias0, bias_shape)" if runtime_mask_shape else "bias = Identity(bias0)"
    merge = (
        "xs = Shape(x)\n            xb = Gather(xs, zero1)\n            xt = Gather(xs, one1)\n"
        "            merged_rt = Concat<axis=0>(xb, xt, eight)\n            y = Reshape(pt, merged_rt)"
        if merge_target == "gathered"
        else "xs = Shape(x)\n            y = Reshape(pt, xs)"
        if merge_target == "whole-shape"
        else "y = Reshape(pt, merged_computed)"
        if computed
        else "y = Reshape(pt, merged)"
    )
    # nn.MultiheadAttention merges the heads sequence-first: permute(2, 0, 1, 3), view(S*B, D)
    seq_first = merge_target in ("seq-first", "seq-first-flat")
    if seq_first:
        merge = f"y = Reshape(pt, {'flat8' if merge_target == 'seq-first-flat' else 'merged'})"
    out_type = (
        "float[N, 8]"
        if merge_target == "seq-first-flat"
        else f"float[{seq}, B, 8]"
        if seq_first
        else f"float[B, {seq}, 8]"
    )
    guard = "nan = IsNaN(probs)\n            clean = Where(nan, zero, probs)" if nan_guard else ""
    attended = "clean" if nan_guard else "probs"
    text = f"""
        <ir_version: 8, opset_import: ["" : 17]>
        agraph (float[B, {seq}, 8] x, int64[B, {seq}] mask{extra_input}) => ({out_type} y) <
            {"float[B, S, 2, 4] qr, float[B, S, 2, 4] kr, float[B, S, 2, 4] vr," if computed else ""}
            {"float[B, 2, S, 4] pvv," if view else ""}
            int64[1] two1 = {{2}},
            int64[1] four1 = {{4}},
            int64[3] flat_static = {{-1, 5, 4}},
            int64[4] back_static = {{-1, 2, 4, 5}},
            {_weights()},
            int64[4] heads = {{0, 0, 2, 4}},
            int64[3] merged = {{0, 0, 8}},
            int64[2] flat8 = {{-1, 8}},
            int64[1] zero1 = {{0}},
            int64[1] one1 = {{1}},
            int64 two = {{2}},
            int64[1] eight = {{8}},
            int64[2] mask_axes = {{1, 2}},
            int64[1] minus1 = {{-1}},
            int64[1] minus2 = {{-2}},
            int64[1] big = {{9223372036854775807}},
            float sq = {{0.70710678}},
            float eighth = {{0.125}},
            float three = {{3.0}},
            float zero = {{0.0}},
            float ninf = {{-inf}},
            float lowest = {{-3.4028234663852886e38}},
            float one_f = {{1.0}},
            float minus_10000 = {{-10000.0}}
        > {{
            {"batch = Shape<start=0, end=1>(x)" if computed or other else ""}
            {"heads_c = Concat<axis=0>(batch, length, two1, four1)" if computed else ""}
            {"merged_computed = Concat<axis=0>(batch, length, eight)" if computed else ""}
            q0 = MatMul(x, wq)
            {"qb0 = Add(q0, bq)" + chr(10) + "qb = Mul(qb0, eighth)" if "q" in scaled_projections else "qb = Add(q0, bq)"}
            k0 = MatMul(x, wk)
            {"kb0 = Add(k0, bk)" + chr(10) + "kb = Div(kb0, three)" if "k" in scaled_projections else "kb = Add(k0, bk)"}
            v0 = MatMul(x, wv)
            vb = Add(v0, bv)
            qr = Reshape(qb, {split})
            q4 = Transpose<perm=[0,2,1,3]>(qr)
            {key_t}
            vr = Reshape(vb, {split})
            v4 = Transpose<perm=[0,2,1,3]>(vr)
            qs = Mul(q4, sq)
            kts = Mul(kt, sq)
            scores = MatMul(qs, kts)
            {_MASK_FORMS[mask_form].format(masked_value=masked_value)}
            {expand}
            {"scored = Add(scores, pos)" if position_bias else ""}
            masked = Add({"scored" if position_bias else "scores"}, bias)
            probs = Softmax<axis={softmax_axis}>(masked)
            {guard}
            pv = MatMul({attended}, v4)
            {"pv_target = Concat<axis=0>(batch, two1, length, four1)" if view else ""}
            {"pvv = Reshape(pv, pv_target)" if view else ""}
            {_OTHER_VIEW.get(merge_target, "")}
            {_ESCAPING_READS.get(escaping_reads, "")}
            pt = Transpose<perm={[2, 0, 1, 3] if seq_first else [0, 2, 1, 3]}>({"pvv" if view or other else "pv"})
            {_ESCAPING_READS_OF_PT.get(escaping_reads, "")}
            {merge.replace("y = ", "ym = ") if escaping_reads else merge}
            {"y = Reshape(ym, out_target)" if escaping_reads else ""}
        }}
    """
    proto = onnx.parser.parse_model(text)
    onnx.checker.check_model(proto)
    model = ir.serde.deserialize_model(proto)
    InferShapesPass()(model)
    return model


_OTHER_VIEW = {
    "other-seq": """
            other_l = Shape<start=1, end=2>(other)
            pv_target = Concat<axis=0>(batch, two1, other_l, four1)
            pvv = Reshape(pv, pv_target)
    """,
    "other-batch-seq": """
            other_nl = Shape(other)
            other_n = Slice(other_nl, zero1, one1)
            other_l = Slice(other_nl, one1, two1)
            pv_target = Concat<axis=0>(other_n, two1, other_l, four1)
            pvv = Reshape(pv, pv_target)
    """,
}

_ESCAPING_READS = {
    # B read with a 1-D index, S with a scalar one, H (a constant once fused) times d
    "pv": """
            pvs = Shape(pv)
            pv_b = Gather(pvs, zero1)
            pv_s0 = Gather(pvs, two)
            pv_s = Unsqueeze(pv_s0, zero1)
            pv_h = Gather(pvs, one1)
            pv_w = Mul(pv_h, four1)
            out_target = Concat<axis=0>(pv_b, pv_s, pv_w)
    """,
    # B off the scores
    "scores-batch": """
            sc_shape = Shape(scores)
            sc_b = Gather(sc_shape, zero1)
            out_target = Concat<axis=0>(sc_b, minus1, eight)
    """,
    # T, the scores' last dim: not a dim of the fused op's query
    "scores": """
            sc_shape = Shape(scores)
            sc_t = Gather(sc_shape, minus1)
            out_target = Concat<axis=0>(minus1, sc_t, eight)
    """,
}

# GPT-2's TorchScript export under transformers 4.x reads B and S off the heads moved back
# ([B, S, H, d]) for its Conv1D's output view; fold-shape-values writes each as a one-dim Shape.
_ESCAPING_READS_OF_PT = {
    "pt": """
            pt_b = Shape<start=0, end=1>(pt)
            pt_s = Shape<start=-3, end=-2>(pt)
            out_target = Concat<axis=0>(pt_b, pt_s, eight)
    """,
}


def _feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = (rng.random((batch, seq)) > 0.3).astype(np.int64)
    mask[0, :] = 1
    if batch > 1:
        mask[1, :] = 0  # a fully padded sequence: SDPA's NaN guard turns its rows into zeros
    if batch > 2:
        mask[2, seq // 2 :] = 0  # right padding
    return {"x": rng.standard_normal((batch, seq, D)).astype(np.float32), "mask": mask}


def _op_types(model: ir.Model) -> list[str]:
    return [node.op_type for node in model.graph]


@pytest.mark.parametrize(
    ("key_form", "merge_target"),
    [
        ("torchscript", "constant"),
        ("dynamo", "constant"),
        ("dynamo-static", "constant"),
        ("torchscript", "gathered"),
        ("torchscript", "whole-shape"),
    ],
)
def test_fuses_sdpa_into_multi_head_attention(key_form: str, merge_target: str) -> None:
    model = _model(key_form=key_form, merge_target=merge_target)
    fused = model.clone()
    result = FuseAttentionPass()(fused)
    assert result.stats == {"attention->mha": 1}
    types = _op_types(fused)
    assert types.count("MultiHeadAttention") == 1
    assert "Softmax" not in types and "Transpose" not in types
    assert sum(t == "MatMul" for t in types) == 3  # the Q/K/V projections only
    mha = next(n for n in fused.graph if n.op_type == "MultiHeadAttention")
    assert mha.domain == "com.microsoft"
    assert mha.attributes.get_int("num_heads") == H
    assert mha.attributes.get_float("scale") == pytest.approx(0.5, rel=1e-6)
    assert fused.opset_imports["com.microsoft"] == 1
    sizes = ((3, 5), (1, 1), (4, 7)) if key_form != "dynamo-static" else ((3, 5), (1, 5), (4, 5))
    report = validate(model, fused, inputs=[_feeds(b, s, i) for i, (b, s) in enumerate(sizes)])
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


@pytest.mark.parametrize("merge_target", ["seq-first", "seq-first-flat"])
@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_a_sequence_first_merge_of_the_heads_is_fused(merge_target: str, target: str) -> None:
    # nn.MultiheadAttention: P@V permuted to [S, B, H, d] and viewed as [S*B, D] (or [S, B, D]);
    # the fused [B, S, D] output is transposed to [S, B, D] before the same view.
    model = _model(merge_target=merge_target)
    model.opset_imports[""] = 23
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(target=target))(fused)
    assert sum(result.stats.values()) == 1
    types = _op_types(fused)
    assert "Softmax" not in types
    assert ("MultiHeadAttention" if target == "ort" else "Attention") in types
    sizes = ((3, 5), (1, 1), (4, 7))
    report = validate(model, fused, inputs=[_feeds(b, s, i) for i, (b, s) in enumerate(sizes)])
    assert report.passed, report
    assert not FuseAttentionPass(PassOptions(target=target))(fused).modified


def test_a_position_bias_and_a_mask_are_summed_into_one_attention_bias() -> None:
    model = _model(position_bias=True)
    fused = model.clone()
    assert FuseAttentionPass()(fused).stats == {"attention->mha": 1}
    types = _op_types(fused)
    assert "Softmax" not in types and types.count("MultiHeadAttention") == 1
    mha = next(n for n in fused.graph if n.op_type == "MultiHeadAttention")
    bias_sum = mha.inputs[5].producer()  # type: ignore[union-attr]
    assert bias_sum is not None and bias_sum.op_type == "Add"
    assert mha.inputs[5].shape is not None  # type: ignore[union-attr]
    assert [str(d) for d in mha.inputs[5].shape] == ["B", "2", "S", "S"]  # type: ignore[union-attr]
    rng = np.random.default_rng(5)
    feeds = [
        {**_feeds(b, s, seed), "pos": rng.standard_normal((1, 2, s, s)).astype(np.float32)}
        for b, s, seed in ((3, 5, 0), (1, 1, 1), (2, 7, 2))
    ]
    report = validate(model, fused, inputs=feeds)
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


def test_several_bias_terms_are_not_fused_for_target_onnx() -> None:
    model = _model(position_bias=True)
    model.opset_imports[""] = 23
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(target="onnx", explain=True))(fused)
    assert not result.modified
    assert any("several additive terms" in note for note in result.notes), result.notes


@pytest.mark.parametrize("merge_target", ["computed", "computed-view"])
def test_targets_computed_elsewhere_are_proved_by_the_shapes(merge_target: str) -> None:
    # wav2vec2's dynamo export builds the head split and merge targets from a sequence length it
    # computes from the audio length; the recorded shapes say they are [B, S, H, d] and [B, S, D].
    model = _model(merge_target=merge_target)
    fused = model.clone()
    assert FuseAttentionPass()(fused).stats == {"attention->mha": 1}
    assert "Softmax" not in _op_types(fused)
    feeds = [
        {**_feeds(b, s, seed), "length": np.array([s], dtype=np.int64)}
        for b, s, seed in ((3, 5, 0), (1, 1, 1), (2, 7, 2))
    ]
    report = validate(model, fused, inputs=feeds)
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


def test_scalar_factors_on_the_projections_move_into_the_scale() -> None:
    model = _model(scaled_projections="qk")
    fused = model.clone()
    assert FuseAttentionPass()(fused).stats == {"attention->mha": 1}
    mha = next(n for n in fused.graph if n.op_type == "MultiHeadAttention")
    # the op reads the bare projections (the Mul/Div are left for dead-code elimination)
    assert [v.producer().op_type for v in mha.inputs[:2]] == ["Add", "Add"]  # type: ignore[union-attr]
    assert mha.attributes.get_float("scale") == pytest.approx(0.5 * 0.125 / 3.0, rel=1e-6)
    report = validate(model, fused, inputs=[_feeds(3, 5, 0), _feeds(2, 9, 1)])
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


def test_fully_masked_rows_stay_zero_and_padding_is_exact() -> None:
    model = _model()
    fused = model.clone()
    FuseAttentionPass()(fused)
    feeds = _feeds(3, 6, 3)
    report = validate(model, fused, inputs=[feeds])
    assert report.passed, report
    assert report.outputs[0].max_abs < 1e-5


def test_an_all_pass_mask_is_dropped() -> None:
    """ViT's dynamo export adds Where(Expand(all-true), 0, lowest): zero everywhere. The fused op
    gets no mask (no bias add, and MultiHeadAttention's mask-free kernel)."""
    model = _model(masked_value="lowest")
    for node in model.graph:
        if node.op_type == "Where" and node.outputs[0].name == "bias0":
            keep = ir.Value(name="keep_all")
            true_const = ir.Value(
                name="all_true",
                const_value=ir.tensor(np.ones((1, 1, 1, 1), dtype=np.bool_), name="all_true"),
            )
            model.graph.register_initializer(true_const)
            expand_shape = node.inputs[0]  # mb: [B, 1, 1, S] bool; reuse its shape
            shape = ir.node("Shape", [expand_shape], outputs=[ir.Value(name="mb_shape")])
            expand = ir.node("Expand", [true_const, shape.outputs[0]], outputs=[keep])
            model.graph.insert_before(node, [shape, expand])
            node.replace_input_with(0, keep)
    fused = model.clone()
    result = FuseAttentionPass()(fused)
    assert result.stats == {"attention->mha": 1}
    mha = next(n for n in fused.graph if n.op_type == "MultiHeadAttention")
    assert len(mha.inputs) == 3  # q, k, v: no attention_bias
    report = validate(model, fused, inputs=[_feeds(3, 5, 0), _feeds(2, 7, 1)])
    assert report.passed, report


def test_mask_of_unknown_rank_is_not_fused() -> None:
    model = _model(runtime_mask_shape=True)
    result = FuseAttentionPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert any("mask's rank is unknown" in note for note in result.notes), result.notes


def test_softmax_over_another_axis_is_not_fused() -> None:
    model = _model(softmax_axis=2)
    result = FuseAttentionPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert any("Softmax is over axis 2" in note for note in result.notes)


@pytest.mark.parametrize(("opset", "fused"), [(17, True), (12, False)])
def test_softmax_without_an_axis_takes_its_opsets_default(opset: int, fused: bool) -> None:
    # before opset 13 the default axis is 1: the scores' dims from 1 on, flattened together
    model = _model()
    softmax = next(n for n in model.graph if n.op_type == "Softmax")
    del softmax.attributes["axis"]
    model.opset_imports[""] = opset
    result = FuseAttentionPass(PassOptions(explain=True))(model)
    assert result.modified is fused
    if not fused:
        assert any("Softmax is over axis 1" in note for note in result.notes), result.notes


def test_onnx_target_needs_opset_23() -> None:
    model = _model()
    result = FuseAttentionPass(PassOptions(target="onnx", explain=True))(model)
    assert not result.modified
    assert any("needs opset 23, the model has 17" in note for note in result.notes)


# --- tiny real exports ---------------------------------------------------------------------------


def _export(kind: str, dynamo: bool, tmp_path) -> ir.Model:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(
            vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=32,
        )  # fmt: skip
        module = transformers.BertModel(config)
    elif kind == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=32, use_cache=False
        )
        module = transformers.GPT2Model(config)
    else:
        config = transformers.LlamaConfig(
            vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=32, max_position_embeddings=32, use_cache=False,
        )  # fmt: skip
        module = transformers.LlamaModel(config)
    module.eval()

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, input_ids, attention_mask):  # type: ignore[no-untyped-def]
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    args = (torch.randint(0, 64, (2, 7)), torch.ones(2, 7, dtype=torch.long))
    path = tmp_path / f"{kind}.onnx"
    if dynamo:
        from torch.export import Dim

        shapes = ({0: Dim.AUTO, 1: Dim.AUTO}, {0: Dim.AUTO, 1: Dim.AUTO})
        torch.onnx.export(Wrapper(), args, str(path), input_names=["input_ids", "attention_mask"],
                          dynamic_shapes=shapes, dynamo=True)  # fmt: skip
    else:
        axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
        torch.onnx.export(Wrapper(), args, str(path), input_names=["input_ids", "attention_mask"],
                          dynamic_axes=axes, opset_version=17, dynamo=False)  # fmt: skip
    model = ir.load(str(path))
    InferShapesPass()(model)
    return model


def _text_feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[-1, : seq // 2] = 0  # left padding on the last sequence
    if batch > 2:
        mask[0, :] = 0
    return {"input_ids": rng.integers(0, 64, (batch, seq)), "attention_mask": mask}


@pytest.mark.parametrize(
    ("kind", "dynamo"),
    [("bert", False), ("gpt2", False), ("llama", False), pytest.param("bert", True, marks=pytest.mark.slow),
     pytest.param("gpt2", True, marks=pytest.mark.slow), pytest.param("llama", True, marks=pytest.mark.slow)],
)  # fmt: skip
def test_fuses_real_exports(kind: str, dynamo: bool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = _export(kind, dynamo, tmp_path)
    fused = model.clone()
    result = FuseAttentionPass()(fused)
    assert result.stats == {"attention->mha": 1}
    types = _op_types(fused)
    assert "Softmax" not in types and types.count("MultiHeadAttention") == 1
    report = validate(
        model, fused, inputs=[_text_feeds(3, 6, 0), _text_feeds(1, 1, 1), _text_feeds(2, 9, 2)]
    )
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


@pytest.mark.parametrize("key_form", ["torchscript", "dynamo"])
def test_onnx_target_uses_standard_attention_at_opset_23(key_form: str) -> None:
    model = _model(key_form=key_form)
    model.opset_imports[""] = 23
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(target="onnx"))(fused)
    assert result.stats == {"attention->onnx-attention": 1}
    types = _op_types(fused)
    assert "Attention" in types and "Softmax" not in types
    assert all(n.domain in ("", "ai.onnx") for n in fused.graph)
    report = validate(model, fused, inputs=[_feeds(3, 5, 0), _feeds(1, 1, 1)])
    assert report.passed, report
    assert not FuseAttentionPass(PassOptions(target="onnx"))(fused).modified


def test_onnx_target_raises_a_finite_mask_so_fully_masked_rows_still_average() -> None:
    # float32's lowest makes ORT's Attention-23 zero a fully masked row; the export averages V there.
    model = _model(masked_value="lowest", nan_guard=False)
    model.opset_imports[""] = 23
    fused = model.clone()
    assert FuseAttentionPass(PassOptions(target="onnx"))(fused).stats == {
        "attention->onnx-attention": 1
    }
    assert "Max" in _op_types(fused)
    report = validate(model, fused, inputs=[_feeds(3, 5, 0), _feeds(2, 1, 1)])
    assert report.passed, report


@pytest.mark.parametrize("extra", [1, 5])
def test_onnx_target_proves_an_arithmetic_mask_finite(extra: int) -> None:
    """``(1 - m) * -10000`` is finite whatever integers m holds: fused, and the rows a 0 masks
    fully still get softmax(scores - 10000), as in the export; a mask holding other integers
    (``extra``) adds a positive bias, also as in the export."""
    model = _model(mask_form="arithmetic", masked_value="minus_10000", nan_guard=False)
    model.opset_imports[""] = 23
    fused = model.clone()
    assert FuseAttentionPass(PassOptions(target="onnx"))(fused).stats == {
        "attention->onnx-attention": 1
    }
    feeds = [_feeds(3, 5, 0), _feeds(2, 1, 1)]
    feeds[0]["mask"][2, 0] = extra
    report = validate(model, fused, inputs=feeds)
    assert report.passed, report


def test_onnx_target_refuses_an_arithmetic_mask_that_may_overflow() -> None:
    # (1 - m) * float32's lowest is +inf for m = 3: nothing proves the mask finite.
    model = _model(mask_form="arithmetic", masked_value="lowest", nan_guard=False)
    model.opset_imports[""] = 23
    result = FuseAttentionPass(PassOptions(target="onnx", explain=True))(model)
    assert not result.modified
    assert any("not provably finite" in note for note in result.notes), result.notes


def test_onnx_target_refuses_an_unguarded_infinite_mask() -> None:
    model = _model(nan_guard=False)
    model.opset_imports[""] = 23
    result = FuseAttentionPass(PassOptions(target="onnx", explain=True))(model)
    assert not result.modified
    assert any("mask holds -inf without SDPA's NaN guard" in note for note in result.notes)


@pytest.mark.parametrize(("to", "provable"), [(10, False), (11, True)])
def test_mask_through_a_cast_is_provable_only_when_its_values_stay_finite(
    to: int, provable: bool
) -> None:
    # float32's lowest becomes -inf in float16 (10); in double (11) it stays the finite number.
    proto = onnx.parser.parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (bool[B, T] keep) => (float[B, T] mask) <float zero = {{0.0}}, float lowest = {{-3.4028234663852886e38}}> {{
            m = Where(keep, zero, lowest)
            cast = Cast<to={to}>(m)
            mask = Cast<to=1>(cast)
        }}
        """
    )
    model = ir.serde.deserialize_model(proto)
    InferShapesPass()(model)
    cast = next(node for node in model.graph if node.op_type == "Cast")
    values = _mask_values(cast.outputs[0])
    assert (values is not None) == provable
    if provable:
        assert values is not None and not values.neg_inf


@pytest.mark.parametrize(
    ("fill", "zero"),
    [("", True), ("<value = float[1] {0.0}>", True), ("<value = float[1] {1.0}>", False)],
)
def test_zeros_of_a_shape_viewed_are_no_bias_term(fill: str, zero: bool) -> None:
    """baddbmm's ``beta * input`` as TorchScript writes it for GPT-NeoX (transformers 4.x):
    ConstantOfShape zeros (default or given), expanded and viewed like the scores."""
    proto = onnx.parser.parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[B, 4, S, S] scores) => (float[B, 4, S, S] y) <int64[3] flat = {{8, 5, 5}},
            int64[4] heads = {{-1, 4, 5, 5}}> {{
            zeros = ConstantOfShape{fill}(flat)
            wide = Expand(zeros, flat)
            term = Reshape(wide, heads)
            y = Add(scores, term)
        }}
        """
    )
    model = ir.serde.deserialize_model(proto)
    term = next(node for node in model.graph if node.op_type == "Reshape").outputs[0]
    assert _all_equal_to(term, 0.0) == zero


def _assert_topological(model: ir.Model) -> None:
    seen: set[int] = set()
    for node in model.graph:
        assert all(
            v is None or v.producer() is None or id(v.producer()) in seen for v in node.inputs
        ), node
        seen.add(id(node))


def test_dim_reads_of_the_block_that_outlive_it_are_read_off_the_query() -> None:
    """GPT-2's TorchScript SDPA export reads the batch size off P@V for its output projection's
    Reshape: the read outlives the block, so it is taken from the fused op's query instead (the
    head count becomes a constant), and the new reads come before their users."""
    model = _model(escaping_reads="pv")
    fused = model.clone()
    result = FuseAttentionPass()(fused)
    assert result.stats == {"attention->mha": 1}
    types = _op_types(fused)
    assert "Softmax" not in types and types.count("MultiHeadAttention") == 1
    mha = next(n for n in fused.graph if n.op_type == "MultiHeadAttention")
    query = mha.inputs[0]
    assert "Gather" not in types  # no read of P@V is left
    reads = {
        (n.inputs[0].name, n.attributes.get_int("start"), n.attributes.get_int("end"))
        for n in fused.graph
        if n.op_type == "Shape" and n.inputs[0] is query
    }
    assert {("qb", 0, 1), ("qb", 1, 2)} <= reads  # B and S (the mask's Expand reads S too)
    _assert_topological(fused)
    sizes = ((3, 5), (1, 1), (4, 7))
    report = validate(model, fused, inputs=[_feeds(b, s, i) for i, (b, s) in enumerate(sizes)])
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


def test_one_dim_shape_reads_of_the_moved_heads_are_read_off_the_query() -> None:
    """GPT-2's TorchScript export under transformers 4.x: its output view reads B and S off the
    heads moved back, each as a one-dim Shape (start/end, a negative start too)."""
    model = _model(escaping_reads="pt")
    fused = model.clone()
    assert FuseAttentionPass()(fused).stats == {"attention->mha": 1}
    types = _op_types(fused)
    assert "Softmax" not in types and "Transpose" not in types[types.index("MatMul") + 3 :]
    query = next(n for n in fused.graph if n.op_type == "MultiHeadAttention").inputs[0]
    reads = {
        (n.attributes.get_int("start"), n.attributes.get_int("end"))
        for n in fused.graph
        if n.op_type == "Shape" and n.inputs[0] is query
    }
    assert {(0, 1), (1, 2)} <= reads
    _assert_topological(fused)
    sizes = ((3, 5), (1, 1), (4, 7))
    report = validate(model, fused, inputs=[_feeds(b, s, i) for i, (b, s) in enumerate(sizes)])
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


def test_a_read_of_a_dim_the_query_lacks_keeps_the_block() -> None:
    model = _model(escaping_reads="scores")
    result = FuseAttentionPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert any("has other consumers" in note for note in result.notes), result.notes


def test_dim_reads_that_outlive_the_block_for_target_onnx() -> None:
    model = _model(escaping_reads="pv")
    model.opset_imports[""] = 23
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(target="onnx"))(fused)
    assert result.stats == {"attention->onnx-attention": 1}
    assert "Gather" not in _op_types(fused) and "Softmax" not in _op_types(fused)
    sizes = ((3, 5), (1, 1), (4, 7))
    report = validate(model, fused, inputs=[_feeds(b, s, i) for i, (b, s) in enumerate(sizes)])
    assert report.passed, report
    assert not FuseAttentionPass(PassOptions(target="onnx"))(fused).modified


@pytest.mark.slow
def test_gpt2_torchscript_sdpa_export_fuses_and_is_a_fixed_point(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The zoo's gpt2-tiny with transformers' SDPA attention, TorchScript exporter: the batch size
    read off P@V also shapes the output projection (benchmarks/trained_like.py --attention sdpa)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import sys

    from benchmarks import trained_like
    from onnxopt import api, io
    from onnxopt.export import export

    monkeypatch.setitem(trained_like.ATTENTION, "implementation", "sdpa")
    monkeypatch.setitem(sys.modules, "benchmarks.trained_like", trained_like)
    path = tmp_path / "gpt2.onnx"
    export("benchmarks.trained_like:gpt2_tiny", path, exporter="torchscript")
    result = api.optimize(path, find_reference=True)
    assert result.validated
    assert result.report.reference is not None and result.report.reference.optimized_passed
    types = [node.op_type for node in result.model.graph]
    assert types.count("Attention") == 2 and "Softmax" not in types, types
    first = io.save_model(result.model, tmp_path / "gpt2.opt.onnx")
    again = api.optimize(first, check=False)
    assert (
        io.save_model(again.model, tmp_path / "gpt2.opt2.onnx").read_bytes() == first.read_bytes()
    )


_SEPARATE_QKV = """
            q = MatMul(x, wq)
            qr = Reshape(q, qheads)
            q4 = Transpose<perm=[0,2,1,3]>(qr)
            k = MatMul(x, wk)
            kr = Reshape(k, kvhead)
            KEY_T
            v0 = MatMul(x, wv)
            v = Add(v0, bv)
            vr = Reshape(v, kvhead)
            v4 = Transpose<perm=[0,2,1,3]>(vr)
"""
# Falcon: one projection to [B, S, H+2, d]; Q sliced, K and V gathered out along the head axis.
_PACKED_Q = """
            qkv = Concat<axis=1>(wq, wk, wv)
            packed = MatMul(x, qkv)
            heads4 = Reshape(packed, all_heads)
            qr = Slice(heads4, zero1, two1, two1)
            q4 = Transpose<perm=[0,2,1,3]>(qr)
"""
_PACKED_QKV = (
    _PACKED_Q
    + """
            kr = Gather<axis=2>(heads4, two1)
            k4 = Transpose<perm=[0,2,1,3]>(kr)
            kt = Transpose<perm=[0,1,3,2]>(k4)
            vr = Gather<axis=2>(heads4, three1)
            v4 = Transpose<perm=[0,2,1,3]>(vr)
"""
)
# The same as the dynamo exporter writes it: heads moved first, K and V picked by GatherND.
_PACKED_ND_QKV = (
    _PACKED_Q
    + """
            heads_first = Transpose<perm=[2,0,1,3]>(heads4)
            kr = GatherND(heads_first, k_index)
            k4 = Transpose<perm=[1,0,2,3]>(kr)
            kt = Transpose<perm=[0,1,3,2]>(k4)
            vr = GatherND(heads_first, v_index)
            v4 = Transpose<perm=[1,0,2,3]>(vr)
"""
)


def _multi_query_model(head_size: int = 4, key_form: str = "torchscript") -> ir.Model:
    """x[B,S,D] -> 2 query heads and ONE key/value head, which Q@K^T and P@V broadcast against
    the query heads (Falcon's multi-query attention: K/V never repeated), padding mask, SDPA guard."""
    d, width = head_size, 2 * head_size
    rng = np.random.default_rng(7)

    def mat(name: str, shape: tuple[int, ...]) -> str:
        values = ", ".join(f"{v:.4f}" for v in rng.standard_normal(int(np.prod(shape))) * 0.5)
        return f"float[{', '.join(map(str, shape))}] {name} = {{{values}}}"

    key_t = (
        "kt = Transpose<perm=[0,2,3,1]>(kr)"
        if key_form == "torchscript"
        else "k4 = Transpose<perm=[0,2,1,3]>(kr)\n            kt = Transpose<perm=[0,1,3,2]>(k4)"
    )
    text = f"""
        <ir_version: 8, opset_import: ["" : 17]>
        agraph (float[B, S, {width}] x, int64[B, S] mask) => (float[B, S, {width}] y) <
            {mat("wq", (width, width))}, {mat("wk", (width, d))}, {mat("wv", (width, d))},
            {mat("bv", (d,))},
            int64[4] qheads = {{0, 0, 2, {d}}},
            int64[4] kvhead = {{0, 0, 1, {d}}},
            int64[4] all_heads = {{0, 0, 4, {d}}},
            int64[1] zero1 = {{0}},
            int64[1] two1 = {{2}},
            int64[1] three1 = {{3}},
            int64[1, 1] k_index = {{2}},
            int64[1, 1] v_index = {{3}},
            int64[3] merged = {{0, 0, {width}}},
            int64[2] mask_axes = {{1, 2}},
            float scale = {{{d**-0.5}}},
            float zero = {{0.0}},
            float ninf = {{-inf}}
        > {{
            {_PACKED_QKV if key_form == "packed" else _PACKED_ND_QKV if key_form == "packed-nd" else _SEPARATE_QKV.replace("KEY_T", key_t)}
            qk = MatMul(q4, kt)
            scores = Mul(qk, scale)
            mbool = Cast<to=9>(mask)
            mb = Unsqueeze(mbool, mask_axes)
            bias = Where(mb, zero, ninf)
            masked = Add(scores, bias)
            probs = Softmax<axis=-1>(masked)
            nan = IsNaN(probs)
            clean = Where(nan, zero, probs)
            pv = MatMul(clean, v4)
            pt = Transpose<perm=[0,2,1,3]>(pv)
            y = Reshape(pt, merged)
        }}
    """
    proto = onnx.parser.parse_model(text)
    onnx.checker.check_model(proto)
    model = ir.serde.deserialize_model(proto)
    InferShapesPass()(model)
    return model


def _head_repeats(model: ir.Model) -> list[ir.Node]:
    return [
        n
        for n in model.graph
        if n.op_type == "Expand" and n.inputs[0].producer().op_type == "Unsqueeze"  # type: ignore[union-attr]
    ]


def _mq_feeds(batch: int, seq: int, seed: int, width: int) -> dict[str, np.ndarray]:
    feeds = _feeds(batch, seq, seed)
    rng = np.random.default_rng(seed + 100)
    return {**feeds, "x": rng.standard_normal((batch, seq, width)).astype(np.float32)}


@pytest.mark.parametrize(("key_form", "target"), [("torchscript", "ort"), ("transposed", "ort"),
                                                  ("packed", "ort"), ("torchscript", "onnx")])  # fmt: skip
def test_multi_query_attention_repeats_the_single_key_value_head(
    key_form: str, target: str
) -> None:
    model = _multi_query_model(key_form=key_form)
    if target == "onnx":
        model.opset_imports[""] = 23
    fused = model.clone()
    options = PassOptions(target=target)  # type: ignore[arg-type]
    result = FuseAttentionPass(options)(fused)
    assert result.stats == (
        {"attention->mha": 1} if target == "ort" else {"attention->onnx-attention": 1}
    )
    types = _op_types(fused)
    assert "Softmax" not in types, types
    assert len(_head_repeats(fused)) == 2  # K and V, each repeated for the 2 query heads
    op = next(n for n in fused.graph if n.op_type in ("MultiHeadAttention", "Attention"))
    if target == "ort":
        assert op.attributes.get_int("num_heads") == 2
    sizes = ((3, 5), (1, 1), (4, 7))
    feeds = [_mq_feeds(b, s, i, 8) for i, (b, s) in enumerate(sizes)]
    report = validate(model, fused, inputs=feeds)
    assert report.passed, report
    assert not FuseAttentionPass(options)(fused).modified


@pytest.mark.parametrize("key_form", ["torchscript", "packed", "packed-nd"])
def test_multi_query_attention_becomes_group_query_attention_with_one_kv_head(
    key_form: str,
) -> None:
    from onnxopt.passes.fuse_group_query_attention import FuseGroupQueryAttentionPass

    model = _multi_query_model(head_size=8, key_form=key_form)
    fused = model.clone()
    assert FuseAttentionPass()(fused).stats == {"attention->mha": 1}
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa": 1}
    gqa = next(n for n in fused.graph if n.op_type == "GroupQueryAttention")
    assert gqa.attributes.get_int("num_heads") == 2
    assert gqa.attributes.get_int("kv_num_heads") == 1
    # the [B, T, d] key: the projection, or the head gathered out of the packed one
    assert gqa.inputs[1].producer().op_type == (
        "MatMul" if key_form == "torchscript" else "Reshape"
    )  # type: ignore[union-attr]
    assert not _head_repeats(fused)
    sizes = ((3, 5), (1, 1), (4, 7), (2, 9))
    feeds = [_mq_feeds(b, s, i, 16) for i, (b, s) in enumerate(sizes)]
    report = validate(model, fused, inputs=feeds)
    assert report.passed, report


def test_one_dim_of_the_view_of_p_at_v_is_fixed_by_the_element_count() -> None:
    model = _model(merge_target="other-seq")
    fused = model.clone()
    assert FuseAttentionPass()(fused).stats == {"attention->mha": 1}
    assert "Softmax" not in _op_types(fused)
    rng = np.random.default_rng(3)
    feeds = [
        {**_feeds(b, s, i), "other": rng.standard_normal((b, s)).astype(np.float32)}
        for i, (b, s) in enumerate(((3, 5), (1, 1), (4, 7)))
    ]
    report = validate(model, fused, inputs=feeds)
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


def test_two_unproven_dims_of_the_view_of_p_at_v_keep_the_block() -> None:
    model = _model(merge_target="other-batch-seq")
    result = FuseAttentionPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert any("not merged back" in note for note in result.notes), result.notes


@pytest.mark.parametrize("value_late", [False, True])
def test_a_dim_read_of_the_scores_moves_the_fused_op_up_to_it(value_late: bool) -> None:
    """The fused op goes where the first re-pointed read was, or later: the mask (and V) may be
    computed after that read."""
    model = _model(escaping_reads="scores-batch")
    graph = model.graph
    by_output = {node.outputs[0].name: node for node in graph}

    def move(names: tuple[str, ...], before: str) -> None:
        nodes = [by_output[name] for name in names]
        for node in nodes:
            graph.remove(node)
        graph.insert_before(by_output[before], nodes)

    move(("sc_shape", "sc_b"), "mbool")  # the read right after the scores, before the Softmax
    if value_late:  # V computed after that read, right before P@V
        move(("v0", "vb", "vr", "v4"), "pv")
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(explain=True))(fused)
    assert result.stats == {"attention->mha": 1}
    _assert_topological(fused)
    feeds = [_feeds(b, s, i) for i, (b, s) in enumerate(((3, 5), (1, 1)))]
    report = validate(model, fused, inputs=feeds)
    assert report.passed, report


def test_a_mask_behind_a_long_chain_of_views_is_not_followed_without_end() -> None:
    """(1 - m) * -10000 with 3000 Identities between m's Cast and the arithmetic (a hostile
    model): the proof stops at its depth bound instead of exhausting Python's recursion."""
    mask = ir.Value(name="m", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([2, 3]))
    view = ir.node("Cast", [mask], {"to": ir.DataType.FLOAT}).outputs[0]
    for _ in range(3000):
        view = ir.node("Identity", [view]).outputs[0]
    one = ir.Value(name="one", const_value=ir.tensor(np.array(1.0, np.float32)))
    scale = ir.Value(name="scale", const_value=ir.tensor(np.array(-10000.0, np.float32)))
    dropped = ir.node("Sub", [one, view]).outputs[0]
    bias = ir.node("Mul", [dropped, scale]).outputs[0]
    for value in (dropped, bias):
        value.dtype = ir.DataType.FLOAT
    assert _mask_values(bias) is None
