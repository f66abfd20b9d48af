"""FuseGroupQueryAttentionPass: MultiHeadAttention over repeat_kv K/V -> GroupQueryAttention."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxopt.ort_versions import model_requirement
from onnxopt.passes.base import Pipeline
from onnxopt.passes.fuse_group_query_attention import FuseGroupQueryAttentionPass
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.passes.levels import build_steps
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests.fusion_util import op_types, parse, rng_array
from tests.test_fuse_attention import _text_feeds

LOWEST = float(np.finfo(np.float32).min)
GQA = "com.microsoft::GroupQueryAttention"


# Positions 0..S-1 of x's and keep's sequences, as the exporters number them for the mask.
_RANGES = """
            sq = Shape<start=1, end=2>(x)
            sk = Shape<start=1, end=2>(keep)
            zero = Constant<value = int64 {0}>()
            one = Constant<value = int64 {1}>()
            two = Constant<value = int64 {2}>()
            sqs = Squeeze(sq)
            sks = Squeeze(sk)
            qi = Range(zero, sqs, one)
            ki = Range(zero, sks, one)
"""


_BOOL_MASK = """
            pad = Unsqueeze(keep, ax12)
            allowed = And(causal, pad)
            mask = Where(allowed, zero_f, masked)"""

# transformers 4.38-4.47's mask as numbers (LLaMA-style decoders):
#   c = triu(full((S, T), min), 1) * (arange(T) > cache_position.reshape(-1, 1))
#   mask = c[None, None].masked_fill((c + keep[:, None, None, :]) == 0, min)
# "values": as exported (cache positions 0..S-1); the others each break one step of the proof.
_VALUES = """
            shape2 = Concat<axis=0>(sq, {keys})
            full = ConstantOfShape<value = float[1] {{{fill}}}>(shape2)
            upper = Trilu<upper=1>(full, {diagonal})
            {cache}
            qcol = Reshape(ci, column)
            later = Greater(ki, qcol)
            later_f = Cast<to=1>(later)
            c = Mul(upper, later_f)
            c4 = Unsqueeze(c, ax01)
            keep_f = Cast<to=1>(keep)
            keep4 = Unsqueeze(keep_f, ax12)
            summed = Add(c4, keep4)
            padded = Equal(summed, zero_f)
            mask = Where(padded, masked, c4)"""
# transformers' _make_causal_mask of 4.36 and after (OPT, BART, BioGPT, XGLM, Whisper's decoder):
#   c = full((S, S), min).masked_fill(arange(S) < (arange(S) + 1).view(S, 1), 0)
#   mask = max(c[None, None].masked_fill((1 - keep)[:, None, None, :].bool(), min), min)
# (OPT's clamp of the scores at min, moved onto the mask by fuse-attention). ``{reach}``: the
# query positions' offset, 1 as exported.
_FILLED = """
            shape2 = Concat<axis=0>(sq, sk)
            full = ConstantOfShape<value = float[1] {{{fill}}}>(shape2)
            reach = Constant<value = int64 {{{reach}}}>()
            ahead = Add(qi, reach)
            qcol = Reshape(ahead, column)
            before = Less(ki, qcol)
            c = Where(before, zero_f, full)
            c4 = Unsqueeze(c, ax01)
            keep_f = Cast<to=1>(keep)
            dropped = Sub(one_f, keep_f)
            dropped4 = Unsqueeze(dropped, ax12)
            padding = Cast<to=9>(dropped4)
            filled = Where(padding, masked, c4)
            mask = Max(filled, masked)"""
_VALUES_MASKS = {
    "values-filled": _FILLED.format(fill=LOWEST, reach=1),
    # j < i + 2: the key right after each query is kept
    "values-filled-reach-2": _FILLED.format(fill=LOWEST, reach=2),
    "values": _VALUES.format(fill=LOWEST, diagonal="one", cache="ci = Identity(qi)", keys="sk"),
    # the mask scaled after the fill (CodeGen divides its filled scores by a constant)
    "values-scaled": _VALUES.format(
        fill=LOWEST, diagonal="one", cache="ci = Identity(qi)", keys="sk"
    ).replace(
        "mask = Where(padded, masked, c4)",
        "unscaled = Where(padded, masked, c4)\n            mask = Mul(unscaled, eighth)",
    ),
    # the query's own key masked too (triu's diagonal 0): still no key after it kept
    "values-diagonal": _VALUES.format(
        fill=LOWEST, diagonal="zero", cache="ci = Identity(qi)", keys="sk"
    ),
    # triu from the second diagonal: the key right after each query is kept
    "values-band": _VALUES.format(
        fill=LOWEST, diagonal="two", cache="ci = Identity(qi)", keys="sk"
    ),
    # cache positions 1..S (a past of one token): a key after the query may be kept
    "values-past": _VALUES.format(
        fill=LOWEST,
        diagonal="one",
        cache="send = Add(sqs, one)\n            ci = Range(one, send, one)",
        keys="sk",
    ),
    # two masked constants: a fully masked row is not uniform, its max is not the fill
    "values-two-fills": _VALUES.format(
        fill=-1e30, diagonal="one", cache="ci = Identity(qi)", keys="sk"
    ),
    # the fill [S, 1], broadcast along the keys by the Mul: triu of one column masks nothing
    "values-one-column": _VALUES.format(
        fill=LOWEST, diagonal="one", cache="ci = Identity(qi)", keys="one1"
    ),
}


def _model(
    *,
    cross: bool = False,
    unsqueeze_axis: int = 2,
    masked: float = LOWEST,
    head_size: int = 8,
    causal_form: str = "exported",
    bias_first: bool = False,
    norm_axis: int | None = None,
    merge_form: str = "constant",
    kv_split: bool = False,
    qkv_split: bool = False,
    q_scale: str = "",
    causal_form_wrong: bool = False,
) -> ir.Model:
    """x[B,S,8] -> 4 query heads and 2 K/V heads of ``head_size``, K/V repeated as the exporters do, MHA with a
    causal + padding mask built from keep[B,S] as the exporters do (positions unsqueezed to rank 4;
    ``causal_form="flat"``: [S, 1] against [T], not recognised); ``cross``: K/V from y[B,T,8];
    ``bias_first``: projections with a bias written as TorchScript writes Linear, Add(b, x @ W);
    ``norm_axis``: Q normalized per token and K per head (OLMo2, Qwen3) over that axis.
    ``merge_form="query-shape"``: the repeated K/V reshaped to the query's [B, 4, S, d] read off
    it, as SDPA's enable_gqa is exported by dynamo. ``kv_split``: K and V the halves of one
    projection (``kv(x).chunk(2, -1)``); ``qkv_split``: Q, K and V the three parts of one.
    ``q_scale``: the query times a factor qf of that shape (``"S, 1"``: one per position, as
    Ministral 3 scales it after RoPE). ``causal_form="not-greater"|"not-less"``: ``k <= q``
    written as below opset 12, ``Not(Greater(k, q))`` or ``Not(Less(q, k))``
    (``causal_form_wrong``: the operands swapped)."""
    if causal_form == "exported":
        positions = """
            kpos = Unsqueeze(ki, ax012)
            qpos = Unsqueeze(qi, ax013)
            causal = LessOrEqual(kpos, qpos)
        """
    elif causal_form in ("not-greater", "not-less"):  # below opset 12: no LessOrEqual
        operands = ["kpos", "qpos"] if causal_form == "not-greater" else ["qpos", "kpos"]
        if causal_form_wrong:  # swapped: keeps the keys at and after the query
            operands.reverse()
        compare = f"{'Greater' if causal_form == 'not-greater' else 'Less'}({', '.join(operands)})"
        positions = f"""
            kpos = Unsqueeze(ki, ax012)
            qpos = Unsqueeze(qi, ax013)
            later = {compare}
            causal = Not(later)
        """
    elif causal_form.startswith("values"):
        positions = _VALUES_MASKS[causal_form]
    else:
        positions = """
            qcol = Unsqueeze(qi, ax1)
            causal = LessOrEqual(ki, qcol)
        """
    kv_input = "y" if cross else "x"
    q_norm = k_norm = ""
    if norm_axis is not None:
        q_norm = f"qn = SimplifiedLayerNormalization<axis={norm_axis}>(qp, qscale)"
        k_norm = f"kn = SimplifiedLayerNormalization<axis={norm_axis}>(kr, kscale)"
    text = f"""
        <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
        g (float[B, S, 8] x, float[B, T, 8] y, bool[B, {"T" if cross else "S"}] keep{f", float[{q_scale}] qf" if q_scale else ""}) => (float[B, S, {4 * head_size}] out) {{
            {"qkvp = MatMul(x, wqkv)" if qkv_split else ""}
            {"q, k, v = Split<axis=2>(qkvp, qkv_sizes)" if qkv_split else ""}
            {"" if qkv_split else ("q0" if bias_first else ("qp" if norm_axis is not None else "q")) + " = MatMul(x, wq)"}
            {"kvp = MatMul(" + kv_input + ", wkv)" if kv_split else ""}
            {"k, v = Split<axis=2>(kvp)" if kv_split else "" if qkv_split else ("k0" if bias_first else "k") + " = MatMul(" + kv_input + ", wk)"}
            {"" if kv_split or qkv_split else ("v0" if bias_first else "v") + " = MatMul(" + kv_input + ", wv)"}
            {"q = Add(bq, q0)" if bias_first else ""}
            {"k = Add(bk, k0)" if bias_first else ""}
            {"v = Add(bv, v0)" if bias_first else ""}
            {q_norm}
            {"qr = Reshape(q, qsplit)" if merge_form == "query-shape" else ""}
            kr = Reshape(k, split)
            {k_norm}
            k4 = Transpose<perm=[0, 2, 1, 3]>({"kn" if norm_axis is not None else "kr"})
            vr = Reshape(v, split)
            v4 = Transpose<perm=[0, 2, 1, 3]>(vr)
            ku = Unsqueeze(k4, axis)
            ke = Expand(ku, rep)
            {"q4 = Transpose<perm=[0, 2, 1, 3]>(qr)" if merge_form == "query-shape" else ""}
            {"qs = Shape(q4)" if merge_form == "query-shape" else ""}
            kh = Reshape(ke, {"qs" if merge_form == "query-shape" else "merge"})
            vu = Unsqueeze(v4, axis)
            ve = Expand(vu, rep)
            vh = Reshape(ve, {"qs" if merge_form == "query-shape" else "merge"})
            {_RANGES}
            {positions}
            {"" if causal_form.startswith("values") else _BOOL_MASK}
            {"qs1 = Mul(q, qf)" if q_scale else ""}
            out = com.microsoft.MultiHeadAttention<num_heads=4, scale=0.7>({"qn" if norm_axis is not None else "qs1" if q_scale else "q"}, kh, vh, , , mask)
        }}
    """
    return parse(
        text,
        wq=rng_array(8, 4 * head_size, seed=1),
        wk=rng_array(8, 2 * head_size, seed=2),
        wv=rng_array(8, 2 * head_size, seed=3),
        wkv=rng_array(8, 4 * head_size, seed=9),
        wqkv=rng_array(8, 8 * head_size, seed=10),
        qkv_sizes=np.array([4 * head_size, 2 * head_size, 2 * head_size], np.int64),
        bq=rng_array(4 * head_size, seed=4),
        bk=rng_array(2 * head_size, seed=5),
        bv=rng_array(2 * head_size, seed=6),
        qscale=rng_array(4 * head_size, seed=7),
        kscale=rng_array(head_size, seed=8),
        split=np.array([0, 0, 2, head_size], np.int64),
        qsplit=np.array([0, 0, 4, head_size], np.int64),
        merge=np.array([0, 4, -1, head_size], np.int64),
        rep=np.array([1, 1, 2, 1, 1], np.int64),
        axis=np.array([unsqueeze_axis], np.int64),
        ax1=np.array([1], np.int64),
        ax01=np.array([0, 1], np.int64),
        one1=np.array([1], np.int64),
        column=np.array([-1, 1], np.int64),
        ax012=np.array([0, 1, 2], np.int64),
        ax013=np.array([0, 1, 3], np.int64),
        ax12=np.array([1, 2], np.int64),
        zero_f=np.array(0.0, np.float32),
        one_f=np.array(1.0, np.float32),
        eighth=np.array(0.125, np.float32),
        masked=np.array(masked, np.float32),
    )


def _assert_sorted(model: ir.Model) -> None:
    seen = {id(v) for v in model.graph.inputs} | {id(v) for v in model.graph.initializers.values()}
    for node in model.graph:
        for value in node.inputs:
            assert value is None or id(value) in seen, (
                f"{node.name} reads {value.name} before it is made"
            )
        seen.update(id(out) for out in node.outputs)


def _feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    keep = np.ones((batch, seq), bool)
    keep[-1, : seq // 2] = False  # left padding: its first rows are fully masked
    if batch > 2:
        keep[0, :] = False  # all padding
    x = rng.standard_normal((batch, seq, 8)).astype(np.float32)
    return {"x": x, "y": x, "keep": keep}


def _validated_fixed_point(model: ir.Model, fused: ir.Model, inputs: list) -> None:  # type: ignore[type-arg]
    """ORT agrees on the (padded) inputs, closely, and the pass finds nothing more."""
    report = validate(model, fused, inputs=inputs)
    assert report.passed, report
    assert max(o.max_abs for o in report.outputs) < 1e-5
    assert not FuseGroupQueryAttentionPass()(fused).modified


def test_causal_mask_runs_causal_and_fully_masked_rows_still_average() -> None:
    model = _model()
    fused = model.clone()
    result = FuseGroupQueryAttentionPass()(fused)
    assert result.stats == {"mha->gqa-causal": 1}
    types = op_types(fused)
    assert "com.microsoft::GroupQueryAttention" in types
    assert "com.microsoft::MultiHeadAttention" not in types
    # seqlens_k's and the row of 1/T that averages V (that mean is gathered for the 4 query
    # heads); the two K/V repeats are gone
    assert types.count("Expand") == 2
    assert types.count("Gather") == 1
    assert "ReduceMean" not in types  # V's mean is a MatMul (ORT's ReduceMean over axis 1 is slow)
    assert types.count("Where") == 2  # the mask's and the fully-masked-row fix-up
    _assert_sorted(fused)
    gqa = next(n for n in fused.graph if n.op_type == "GroupQueryAttention")
    assert gqa.attributes.get_int("causal") == 1
    _validated_fixed_point(model, fused, [_feeds(3, 5, 0), _feeds(1, 1, 1), _feeds(2, 9, 2)])


def test_projection_biases_added_first_still_prove_one_sequence() -> None:
    # Qwen2's TorchScript export: Add(bias, x @ W) on Q, K and V. The walk back to the one input x
    # took the bias as the tensor and stopped there, so three different origins: no rewrite.
    model = _model(bias_first=True)
    fused = model.clone()
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa-causal": 1}
    _validated_fixed_point(model, fused, [_feeds(3, 5, 0), _feeds(1, 1, 1), _feeds(2, 9, 2)])


def test_q_and_k_normalized_over_their_last_axis_still_prove_one_sequence() -> None:
    # OLMo2 normalizes Q over all heads, Qwen3 / Gemma3 each head of K: the norms keep B and S.
    model = _model(norm_axis=-1)
    fused = model.clone()
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa-causal": 1}
    _validated_fixed_point(model, fused, [_feeds(3, 5, 0), _feeds(1, 1, 1), _feeds(2, 9, 2)])


def test_a_query_scaled_per_position_still_proves_one_sequence() -> None:
    model = _model(q_scale="S, 1")
    fused = model.clone()
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa-causal": 1}
    rng = np.random.default_rng(5)
    inputs = [_feeds(3, 5, 0), _feeds(1, 1, 1), _feeds(2, 9, 2)]
    for feeds in inputs:
        seq = feeds["x"].shape[1]
        feeds["qf"] = (1 + rng.random((seq, 1))).astype(np.float32)
    _validated_fixed_point(model, fused, inputs)


@pytest.mark.parametrize(
    ("shape", "reason"), [("T, 1", "one sequence"), ("B, S, 1, 1", "query is not [B, S, H*d]")]
)
def test_a_query_factor_that_may_grow_it_is_not_followed(shape: str, reason: str) -> None:
    # [T, 1]: T is not proven to be S (broadcasting could repeat a one-token query); rank 4: the
    # product is no longer [B, S, H*d]
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True))(_model(q_scale=shape))
    assert not result.modified
    assert any(reason in note for note in result.notes), result.notes


def test_a_norm_that_mixes_the_sequence_is_not_followed() -> None:
    model = _model(norm_axis=1)  # over [S, H*d] and [S, H, d]: positions mix
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert any("one sequence" in note for note in result.notes), result.notes


def test_mask_not_provably_causal_runs_with_causal_0() -> None:
    model = _model(causal_form="flat")
    fused = model.clone()
    result = FuseGroupQueryAttentionPass()(fused)
    assert result.stats == {"mha->gqa": 1}
    types = op_types(fused)
    assert "com.microsoft::MultiHeadAttention" not in types
    assert types.count("Expand") == 1  # seqlens_k's; the two K/V repeats are gone
    _assert_sorted(fused)
    gqa = next(n for n in fused.graph if n.op_type == "GroupQueryAttention")
    assert gqa.attributes.get_int("causal") == 0
    assert gqa.attributes.get_int("kv_num_heads") == 2
    assert gqa.attributes.get_int("num_heads") == 4
    assert gqa.attributes.get_float("scale") == pytest.approx(0.7)
    _validated_fixed_point(model, fused, [_feeds(3, 5, 0), _feeds(1, 1, 1), _feeds(2, 9, 2)])


@pytest.mark.parametrize("form", ["not-greater", "not-less"])
def test_a_strict_comparison_negated_the_wrong_way_is_not_causal(form: str) -> None:
    """``Not(Greater(q, k))`` keeps the keys at and after the query."""
    wrong = _model(causal_form=form, causal_form_wrong=True)
    assert "mha->gqa-causal" not in FuseGroupQueryAttentionPass()(wrong.clone()).stats


@pytest.mark.parametrize(
    "form",
    ["values", "values-diagonal", "values-filled", "values-scaled", "not-greater", "not-less"],
)
def test_a_mask_of_numbers_masking_every_later_key_runs_causal(form: str) -> None:
    """transformers 4.38-4.47's LLaMA-style mask: triu of a fill times the later-key flags, its
    padding filled in with the same constant (_causal_values.py); and ``k <= q`` as exported
    below opset 12, ``Not(Greater(k, q))`` or ``Not(Less(q, k))``."""
    model = _model(causal_form=form)
    fused = model.clone()
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa-causal": 1}
    gqa = next(n for n in fused.graph if n.op_type == "GroupQueryAttention")
    assert gqa.attributes.get_int("causal") == 1
    _validated_fixed_point(model, fused, [_feeds(3, 5, 0), _feeds(1, 1, 1), _feeds(2, 9, 2)])


@pytest.mark.parametrize(
    ("form", "why"),
    [
        ("values-band", "triu from the second diagonal keeps the key after each query"),
        ("values-past", "cache positions from 1 keep a key after the query"),
        ("values-two-fills", "two masked constants: a fully masked row is not uniform"),
        ("values-one-column", "one column of fill broadcast along the keys"),
        ("values-filled-reach-2", "keys up to i + 1 kept"),
    ],
)
def test_a_mask_of_numbers_that_may_keep_a_later_key_runs_with_causal_0(
    form: str, why: str
) -> None:
    model = _model(causal_form=form)
    fused = model.clone()
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa": 1}, why
    report = validate(model, fused, inputs=[_feeds(3, 5, 0), _feeds(1, 1, 1), _feeds(2, 9, 2)])
    assert report.passed, report


@pytest.mark.parametrize("kv_split", [False, True])
def test_kv_repeated_to_the_query_shape_read_off_it_is_grouped(kv_split: bool) -> None:
    # SDPA(enable_gqa=True), dynamo: Reshape(Expand(Unsqueeze(k4)), Shape(q4)), whose H and d
    # reads are the query's static 4 and 8, and whose B and S are the query's (one sequence);
    # K and V may be the two halves of one projection, Split along its last axis.
    model = _model(merge_form="query-shape", kv_split=kv_split)
    fused = model.clone()
    result = FuseGroupQueryAttentionPass()(fused)
    assert result.stats == {"mha->gqa-causal": 1}
    assert "com.microsoft::MultiHeadAttention" not in op_types(fused)
    _validated_fixed_point(model, fused, [_feeds(3, 5, 0), _feeds(1, 1, 1), _feeds(2, 9, 2)])


def test_grouped_kv_split_from_one_projection_with_the_query_is_read_packed() -> None:
    # Q, K and V the parts [32 | 16 | 16] of one projection, K/V split into 2 heads and moved
    # ahead of the sequence: GroupQueryAttention reads the projection whole (each K/V head's
    # values in the projection's order), the Split and the Transposes go.
    model = _model(qkv_split=True)
    fused = model.clone()
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa-causal": 1}
    gqa = next(n for n in fused.graph if n.op_type == "GroupQueryAttention")
    assert gqa.inputs[0] is not None and gqa.inputs[0].name == "qkvp"
    assert gqa.attributes.get_int("kv_num_heads") == 2
    types = op_types(fused)
    assert "Split" not in types and "Transpose" not in types[: types.index(GQA)]
    _assert_sorted(fused)
    _validated_fixed_point(model, fused, [_feeds(3, 5, 0), _feeds(1, 1, 1), _feeds(2, 9, 2)])


def test_why_the_mask_is_not_causal_is_explained() -> None:
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True))(_model(causal_form="flat"))
    assert result.stats == {"mha->gqa": 1}
    assert any(
        note.startswith("mha->gqa-causal: MultiHeadAttention") and "not provably causal" in note
        for note in result.notes
    ), result.notes


def test_infinite_mask_gives_the_same_fully_masked_rows() -> None:
    model = _model(masked=float("-inf"))
    fused = model.clone()
    # -inf: fully masked rows are NaN in MultiHeadAttention; causal=0 keeps them so.
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa": 1}
    report = validate(model, fused, inputs=[_feeds(3, 6, 0), _feeds(2, 4, 1)])
    assert report.passed, report


def test_key_from_another_sequence_is_not_rewritten() -> None:
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True))(_model(cross=True))
    assert not result.modified
    assert any("come from one sequence" in note for note in result.notes), result.notes


def test_expansion_on_another_axis_is_not_a_repeat() -> None:
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True))(_model(unsqueeze_axis=1))
    assert not result.modified
    assert any("does not insert its axis at position 2" in n for n in result.notes), result.notes


def test_head_size_not_a_multiple_of_8_is_not_rewritten() -> None:
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True))(_model(head_size=4))
    assert not result.modified
    assert any("needs a multiple of 8" in n for n in result.notes), result.notes


def test_onnx_target_keeps_multi_head_attention() -> None:
    result = FuseGroupQueryAttentionPass(PassOptions(target="onnx"))(_model())
    assert not result.modified


@pytest.mark.parametrize(("release", "outputs"), [((1, 29), 1), ((1, 22), 3)])
def test_an_older_release_gets_the_causal_form_it_reads(
    release: tuple[int, int], outputs: int
) -> None:
    """Before 1.30 GroupQueryAttention has no causal attribute (it is always causal: 1.30's
    default), and before 1.29 its present_key / present_value outputs are required."""
    model = _model()
    fused = model.clone()
    result = FuseGroupQueryAttentionPass(PassOptions(ort_version=release))(fused)
    assert result.stats == {"mha->gqa-causal": 1}
    gqa = next(n for n in fused.graph if n.op_type == "GroupQueryAttention")
    assert "causal" not in gqa.attributes
    assert len(gqa.outputs) == outputs
    assert all(not output.uses() for output in gqa.outputs[1:])
    assert model_requirement(fused) is None or model_requirement(fused)[0] <= release  # type: ignore[index]
    _validated_fixed_point(model, fused, [_feeds(3, 5, 0), _feeds(1, 1, 1), _feeds(2, 9, 2)])
    assert not FuseGroupQueryAttentionPass(PassOptions(ort_version=release))(fused).modified


def test_for_cuda_float32_attention_stays_multi_head_attention() -> None:
    """CUDA's GroupQueryAttention has float16 / bfloat16 kernels only: for a model that must also
    run on CUDA, float32 attention is not rewritten (ORT would run it on the CPU)."""
    cuda = PassOptions(explain=True, ort_providers=("cpu", "cuda"))
    result = FuseGroupQueryAttentionPass(cuda)(_model())
    assert not result.modified
    assert any("no float32 CUDA kernel" in n for n in result.notes), result.notes


def test_causal_0_needs_1_30() -> None:
    """A mask not proved causal has no GroupQueryAttention before 1.30: MultiHeadAttention stays."""
    options = PassOptions(explain=True, ort_version=(1, 29))
    result = FuseGroupQueryAttentionPass(options)(_model(causal_form="flat"))
    assert not result.modified
    assert any(
        "GroupQueryAttention with causal=0 needs ONNX Runtime 1.30; the model is for 1.29" in n
        for n in result.notes
    ), result.notes


def test_a_model_optimized_for_a_newer_release_is_rewritten_for_an_older_one() -> None:
    model = _model()
    fused = model.clone()
    assert FuseGroupQueryAttentionPass()(fused).modified  # for the installed release (1.30+)
    gqa = next(n for n in fused.graph if n.op_type == "GroupQueryAttention")
    assert gqa.attributes.get_int("causal") == 1 and len(gqa.outputs) == 1
    older = PassOptions(ort_version=(1, 26))
    result = FuseGroupQueryAttentionPass(older)(fused)
    assert result.stats == {"gqa->gqa-for-older-release": 1}
    (gqa,) = (n for n in fused.graph if n.op_type == "GroupQueryAttention")
    assert "causal" not in gqa.attributes and len(gqa.outputs) == 3
    assert model_requirement(fused) is None
    _validated_fixed_point(model, fused, [_feeds(3, 5, 0), _feeds(1, 1, 1), _feeds(2, 9, 2)])
    assert not FuseGroupQueryAttentionPass(older)(fused).modified
    # causal=0 has no older form: it stays, and says why
    flat = _model(causal_form="flat")
    assert FuseGroupQueryAttentionPass()(flat).stats == {"mha->gqa": 1}
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True, ort_version=(1, 26)))(flat)
    assert not result.modified
    assert any("causal=0 needs ONNX Runtime 1.30" in n for n in result.notes), result.notes


def _export_llama_tiny(exporter: str, tmp_path) -> ir.Model:  # type: ignore[no-untyped-def]
    """The zoo's llama-tiny: 2 layers, 4 query / 2 K/V heads of 16, dynamic batch and sequence."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from onnxopt.export import export

    result = export("llama-tiny", tmp_path / "llama.onnx", exporter=exporter)  # type: ignore[arg-type]
    model = ir.load(result.output)
    InferShapesPass()(model)
    return model


@pytest.mark.parametrize(
    "exporter", ["torchscript", pytest.param("dynamo", marks=pytest.mark.slow)]
)
def test_llama_tiny_exports_with_padding(exporter: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = _export_llama_tiny(exporter, tmp_path)
    # What -O2 runs before this pass: cleanup, fuse-attention, rotary and the other fusions.
    steps = build_steps(2)
    here = next(i for i, s in enumerate(steps) if isinstance(s, FuseGroupQueryAttentionPass))
    Pipeline(steps[:here])(model)
    assert "com.microsoft::RotaryEmbedding" in op_types(model)
    fused = model.clone()
    result = FuseGroupQueryAttentionPass()(fused)
    assert result.stats == {"mha->gqa-causal": 2}
    types = op_types(fused)
    assert types.count("com.microsoft::GroupQueryAttention") == 2
    assert types.count("ReduceMax") == 1  # both layers read one set of fully-masked-row flags
    assert "com.microsoft::MultiHeadAttention" not in types
    repeats = [  # float Expands of an Unsqueeze: repeat_kv (the mask's are int64 or bool)
        n
        for n in fused.graph
        if n.op_type == "Expand"
        and n.outputs[0].dtype == ir.DataType.FLOAT
        and n.inputs[0].producer().op_type == "Unsqueeze"
    ]
    assert not repeats  # the K/V repeat_kv Expands are gone
    _assert_sorted(fused)
    report = validate(
        model, fused, inputs=[_text_feeds(3, 6, 0), _text_feeds(1, 1, 1), _text_feeds(2, 9, 2)]
    )
    assert report.passed, report
    assert not FuseGroupQueryAttentionPass()(fused).modified


def _optimized_tiny(name: str, tmp_path, **options: str):  # type: ignore[no-untyped-def]
    """The zoo's tiny ``name`` (TorchScript) optimized with ``options``, validated against ORT
    and eager PyTorch."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from onnxopt import api
    from onnxopt.export import export

    path = export(name, tmp_path / f"{name}.onnx", exporter="torchscript").output
    result = api.optimize(path, find_reference=True, **options)  # type: ignore[arg-type]
    assert result.validated
    assert result.report.reference is not None and result.report.reference.optimized_passed
    return result


@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny"])
def test_tiny_decoders_for_an_older_runtime_validate_with_group_query_attention(
    name: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """--ort-version 1.22: the causal blocks are GroupQueryAttention as ORT 1.22 reads it (no
    causal attribute, the present outputs declared) and validate against ORT and eager PyTorch."""
    result = _optimized_tiny(name, tmp_path, ort_version="1.22")
    attentions = [n for n in result.model.graph if n.op_type.endswith("Attention")]
    assert [n.op_type for n in attentions] == ["GroupQueryAttention"] * 2
    assert all("causal" not in n.attributes and len(n.outputs) == 3 for n in attentions)
    assert model_requirement(result.model) is None
    assert result.model.metadata_props["onnxopt.ort_version"] == "1.22"


@pytest.mark.parametrize(
    ("name", "fused"), [("llama-tiny", "MultiHeadAttention"), ("gpt2-tiny", "Attention")]
)
def test_tiny_decoders_for_cuda_validate_without_group_query_attention(
    name: str, fused: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """--ort-providers cpu,cuda: causal blocks stay MultiHeadAttention (LLaMA: repeat_kv) or go
    to packed Attention (GPT-2), both with float32 CUDA kernels, and validate."""
    result = _optimized_tiny(name, tmp_path, ort_providers="cpu,cuda")
    types = op_types(result.model)
    assert "com.microsoft::GroupQueryAttention" not in types
    assert types.count(f"com.microsoft::{fused}") == 2, types
    assert result.model.metadata_props["onnxopt.ort_providers"] == "cpu,cuda"
    assert not result.report.warnings


def test_plain_multi_head_attention_is_no_candidate() -> None:
    # K/V with all their heads (BERT, a UNet's cross-attention): not grouped-query attention, so
    # --explain gives no line (and the fusions table no candidate) per such block.
    model = parse(
        """
        <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
        g (float[B, S, 32] q, float[B, T, 32] k, float[B, T, 32] v) => (float[B, S, 32] out) {
            out = com.microsoft.MultiHeadAttention<num_heads: int = 4>(q, k, v)
        }
        """
    )
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True))(model)
    assert result.notes == [] and not result.stats
    assert [n.op_type for n in model.graph] == ["MultiHeadAttention"]


def _bool_mask(causal: bool, second_mask: float | None) -> str:
    """The causal (or not) + padding mask of _plain_model as a Where on a bool condition."""
    return f"""
            kpos = Unsqueeze(ki, ax012)
            qpos = Unsqueeze(qi, ax013)
            causal = LessOrEqual(kpos, qpos)
            pad = Unsqueeze(keep, ax12)
            allowed = {"And(causal, pad)" if causal else "Identity(pad)"}
            {"mask" if second_mask is None else "first"} = Where(allowed, zero_f, masked)"""


def _plain_model(
    *,
    packed: bool = True,
    causal: bool = True,
    head_size: int = 8,
    kv_heads_first: bool = False,
    heads_packed: bool = False,
    flat_gemm: bool = False,
    second_mask: float | None = None,
    buffer: np.ndarray | None = None,
    mask_form: str = "",
) -> ir.Model:
    """GPT-2's self-attention on x[B,S,8]: 4 heads of ``head_size``, Q/K/V from one projection and
    a Split (``packed``) or three, MHA with all its K/V heads and a causal + padding mask from
    keep[B,S] as the exporters build it (``causal=False``: the padding alone).
    ``kv_heads_first``: K and V reach the MHA as [B, 4, S, d] (GPT-NeoX, after its rotary).
    ``heads_packed``: Persimmon's ``view(B, S, 4, 3, d)[..., i, :]`` picks Q, K and V out of one
    projection, K and V moved ahead of the sequence. ``flat_gemm``: the packed projection is a Gemm
    of x flattened to 2-D, viewed back as [B, S, 3*W] (GPT-2's dynamo export). ``second_mask``: a
    second mask added, ``Where(buffer[:, :, :S, :S], 0, second_mask)`` with ``buffer`` a lower
    triangle of 16 x 16 unless given (GPT-Neo's causal buffer's masked_fill, then its causal +
    padding mask). ``mask_form``: one of _VALUES_MASKS instead (OPT's and BART's masks of
    numbers)."""
    width = 4 * head_size
    kv = "k, v"
    if heads_packed:
        kv = "k4, v4"
        projections_kv = """
            qkv0 = MatMul(x, wqkv)
            qkv5 = Reshape(qkv0, five)
            qh = Gather<axis=3>(qkv5, i0)
            kh = Gather<axis=3>(qkv5, i1)
            vh = Gather<axis=3>(qkv5, i2)
            q = Reshape(qh, merged)
            k4 = Transpose<perm=[0, 2, 1, 3]>(kh)
            v4 = Transpose<perm=[0, 2, 1, 3]>(vh)
        """
    elif kv_heads_first:
        kv = "k4, v4"
        projections_kv = """
            kr = Reshape(k, heads_split)
            k4 = Transpose<perm=[0, 2, 1, 3]>(kr)
            vr = Reshape(v, heads_split)
            v4 = Transpose<perm=[0, 2, 1, 3]>(vr)
        """
    else:
        projections_kv = ""
    if heads_packed:
        projections = ""
    elif packed and flat_gemm:
        projections = """
            x2 = Reshape(x, flat)
            qkv2 = Gemm(x2, wqkv, bqkv)
            bs = Shape<start=0, end=2>(x)
            qkv_shape = Concat<axis=0>(bs, qkv_width)
            qkv = Reshape(qkv2, qkv_shape)
            q, k, v = Split<axis=2, num_outputs=3>(qkv)
        """
    elif packed:
        projections = """
            qkv0 = MatMul(x, wqkv)
            qkv = Add(qkv0, bqkv)
            q, k, v = Split<axis=2, num_outputs=3>(qkv)
        """
    else:
        projections = """
            q = MatMul(x, wq)
            k = MatMul(x, wk)
            v = MatMul(x, wv)
        """
    text = f"""
        <ir_version: 8, opset_import: ["" : 18, "com.microsoft" : 1]>
        g (float[B, S, 8] x, bool[B, S] keep) => (float[B, S, {width}] out) {{
            {projections}
            {projections_kv}
            {_RANGES}
            {_VALUES_MASKS[mask_form] if mask_form else _bool_mask(causal, second_mask)}
            {"" if second_mask is None else "sqsq = Concat<axis=0>(sq, sq)"}
            {"" if second_mask is None else "band = Slice(buffer, zeros2, sqsq, ax23)"}
            {"" if second_mask is None else "second = Where(band, zero_f, masked2)"}
            {"" if second_mask is None else "mask = Add(first, second)"}
            out = com.microsoft.MultiHeadAttention<num_heads=4, scale=0.35>(q, {kv}, , , mask)
        }}
    """
    return parse(
        text,
        masked2=np.array(second_mask or 0.0, np.float32),
        buffer=buffer if buffer is not None else np.tril(np.ones((1, 1, 16, 16), bool)),
        zeros2=np.zeros(2, np.int64),
        ax23=np.array([2, 3], np.int64),
        wqkv=rng_array(8, 3 * width, seed=1),
        bqkv=rng_array(3 * width, seed=2),
        wq=rng_array(8, width, seed=3),
        wk=rng_array(8, width, seed=4),
        wv=rng_array(8, width, seed=5),
        ax012=np.array([0, 1, 2], np.int64),
        ax013=np.array([0, 1, 3], np.int64),
        ax12=np.array([1, 2], np.int64),
        zero_f=np.array(0.0, np.float32),
        one_f=np.array(1.0, np.float32),
        ax01=np.array([0, 1], np.int64),
        one1=np.array([1], np.int64),
        column=np.array([-1, 1], np.int64),
        masked=np.array(LOWEST, np.float32),
        heads_split=np.array([0, 0, 4, head_size], np.int64),
        five=np.array([0, 0, 4, 3, head_size], np.int64),
        flat=np.array([-1, 8], np.int64),
        qkv_width=np.array([3 * width], np.int64),
        merged=np.array([0, 0, width], np.int64),
        i0=np.array(0, np.int64),
        i1=np.array(1, np.int64),
        i2=np.array(2, np.int64),
    )


def _plain_feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    feeds = _feeds(batch, seq, seed)
    return {"x": feeds["x"], "keep": feeds["keep"]}


_PLAIN_INPUTS = [_plain_feeds(3, 5, 0), _plain_feeds(1, 1, 1), _plain_feeds(2, 9, 2)]


@pytest.mark.parametrize("flat_gemm", [False, True])
def test_causal_attention_with_all_its_heads_reads_the_packed_projection(flat_gemm: bool) -> None:
    # GPT-2: GroupQueryAttention(causal=1) with kv_num_heads = num_heads skips the keys after each
    # query (and the denormal probabilities the masked ones give ORT's softmax); it reads the
    # projection whole, so the Split goes, and the fully-masked-row fix-up needs no head split.
    # The [B, S, 3*W] tensor is read as it is, also when it is a view of a 2-D Gemm (dynamo).
    model = _plain_model(flat_gemm=flat_gemm)
    fused = model.clone()
    result = FuseGroupQueryAttentionPass()(fused)
    assert result.stats == {"mha->gqa-causal": 1}
    gqa = next(n for n in fused.graph if n.op_type == "GroupQueryAttention")
    assert gqa.attributes.get_int("causal") == 1
    assert gqa.attributes.get_int("num_heads") == gqa.attributes.get_int("kv_num_heads") == 4
    assert gqa.inputs[0] is not None and gqa.inputs[0].name == "qkv"
    assert gqa.inputs[1] is None and gqa.inputs[2] is None
    types = op_types(fused)
    assert "Split" not in types and "ReduceMean" not in types
    # total_sequence_length as a scalar; no head split (and the Gemm's flatten and view back)
    assert types.count("Reshape") == 1 + 2 * flat_gemm
    assert types.count("Where") == 2  # the mask's and the fix-up
    _assert_sorted(fused)
    _validated_fixed_point(model, fused, _PLAIN_INPUTS)


def test_causal_attention_with_three_projections_reads_them() -> None:
    model = _plain_model(packed=False)
    fused = model.clone()
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa-causal": 1}
    gqa = next(n for n in fused.graph if n.op_type == "GroupQueryAttention")
    assert [v.name if v is not None else None for v in gqa.inputs[:3]] == ["q", "k", "v"]
    _validated_fixed_point(model, fused, _PLAIN_INPUTS)


@pytest.mark.parametrize(("form", "causal"), [("values-filled", True), ("values-band", False)])
def test_attention_with_all_its_heads_under_a_mask_of_numbers(form: str, causal: bool) -> None:
    """OPT's and BART's decoders (transformers 4.x): GroupQueryAttention(causal=1) where the mask
    of numbers is proved causal; otherwise no candidate (MultiHeadAttention stays)."""
    model = _plain_model(packed=False, mask_form=form)
    fused = model.clone()
    result = FuseGroupQueryAttentionPass()(fused)
    assert result.stats == ({"mha->gqa-causal": 1} if causal else {})
    if causal:
        _validated_fixed_point(model, fused, _PLAIN_INPUTS)


def test_causal_attention_with_heads_first_k_and_v_reads_them_as_three_d() -> None:
    model = _plain_model(packed=False, kv_heads_first=True)
    fused = model.clone()
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa-causal": 1}
    gqa = next(n for n in fused.graph if n.op_type == "GroupQueryAttention")
    # the [B, 4, S, d] K/V are read back as the [B, S, 4*d] they were split from
    assert [v.name if v is not None else None for v in gqa.inputs[:3]] == ["q", "k", "v"]
    _validated_fixed_point(model, fused, _PLAIN_INPUTS)


def test_q_k_v_picked_out_of_one_head_packed_projection_prove_one_sequence() -> None:
    # The [B, S, 96] -> [B, S, 4, 3, 8] view keeps B and S (the shapes say so), and each Gather of
    # one index on axis 3 drops an axis after them.
    model = _plain_model(heads_packed=True)
    fused = model.clone()
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa-causal": 1}
    _validated_fixed_point(model, fused, _PLAIN_INPUTS)


def test_two_masks_whose_sum_overflows_run_causal_without_the_fix_up() -> None:
    # GPT-Neo: every key after the query is LOWEST + LOWEST = -inf in the export, so a fully
    # padded row averages only the keys up to the query there, as causal=1 does: no fix-up.
    model = _plain_model(second_mask=LOWEST)
    fused = model.clone()
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa-causal": 1}
    types = op_types(fused)
    assert "ReduceMax" not in types and types.count("Where") == 2  # the two masks'
    _validated_fixed_point(model, fused, _PLAIN_INPUTS)


def test_two_masks_whose_sum_stays_finite_are_not_run_causal() -> None:
    # -1e30 + LOWEST is finite: keys after the query tie with the masked ones before it in a fully
    # padded row, which causal=1 would not average
    model = _plain_model(second_mask=-1e30)
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True))(model.clone())
    assert "mha->gqa-causal" not in result.stats
    assert any("do not add to -inf" in note for note in result.notes), result.notes


def test_a_second_mask_that_may_mask_a_querys_own_key_is_not_run_causal() -> None:
    # a row could then be -inf throughout: NaN in the export, something else under causal=1
    buffer = np.tril(np.ones((1, 1, 16, 16), bool))
    buffer[..., 3, 3] = False
    model = _plain_model(second_mask=LOWEST, buffer=buffer)
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True))(model.clone())
    assert "mha->gqa-causal" not in result.stats
    assert any("its own key" in note for note in result.notes), result.notes


def test_attention_with_all_its_heads_and_no_causal_mask_is_left_alone() -> None:
    # BERT's padding mask: GroupQueryAttention(causal=0) is no faster than MultiHeadAttention or
    # packed Attention (benchmarks/attention_layouts_micro.py), so no rule takes it.
    model = _plain_model(causal=False)
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True))(model)
    assert not result.modified and result.notes == []


def test_head_size_not_a_multiple_of_8_keeps_all_heads_attention() -> None:
    model = _plain_model(head_size=4)
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert any("head size 4" in note for note in result.notes), result.notes


@pytest.mark.parametrize("disabled", [(), ("fuse-group-query-attention",)])
def test_pipeline_leaves_causal_attention_to_gqa_unless_it_is_disabled(
    disabled: tuple[str, ...],
) -> None:
    from onnxopt.api import optimize

    model = _plain_model()
    result = optimize(model.clone(), disable=list(disabled), check=False)
    types = op_types(result.model)
    if disabled:  # fuse-packed-attention fuses it as before
        assert "com.microsoft::Attention" in types
        assert "com.microsoft::GroupQueryAttention" not in types
    else:
        assert "com.microsoft::GroupQueryAttention" in types
        assert "com.microsoft::Attention" not in types
    report = validate(model, result.model, inputs=_PLAIN_INPUTS)
    assert report.passed, report


def test_packed_attention_defers_causal_blocks_only_to_a_later_gqa_pass() -> None:
    from onnxopt.passes.fuse_packed_attention import FusePackedAttentionPass

    def packed(steps: list) -> FusePackedAttentionPass:  # type: ignore[type-arg]
        return next(s for s in steps if isinstance(s, FusePackedAttentionPass))

    assert packed(build_steps(2)).defer_causal
    custom = ["fuse-attention", "fuse-packed-attention", "fuse-group-query-attention"]
    assert packed(build_steps(passes=custom)).defer_causal
    assert not packed(build_steps(passes=custom[:2])).defer_causal
    assert not packed(build_steps(2, disable=["fuse-group-query-attention"])).defer_causal


def _multi_query_model() -> ir.Model:
    """GPT-BigCode's multi-query self-attention on x[B,S,8]: one projection to 4 query heads and
    one K/V head of 8, ``c_attn(x).unsqueeze(1).split((32, 8, 8), dim=3)``, the query viewed
    back to [B, S, 32], K/V repeated to the 4 heads; a causal + padding mask from keep[B,S]."""
    text = f"""
        <ir_version: 8, opset_import: ["" : 18, "com.microsoft" : 1]>
        g (float[B, S, 8] x, bool[B, S] keep) => (float[B, S, 32] out) {{
            qkv0 = MatMul(x, wqkv)
            qkv = Add(qkv0, bqkv)
            qkv4 = Unsqueeze(qkv, ax1)
            q1, k1, v1 = Split<axis=3>(qkv4, sizes)
            bs = Shape<start=0, end=2>(x)
            qtarget = Concat<axis=0>(bs, width)
            q = Reshape(q1, qtarget)
            ku = Unsqueeze(k1, ax2)
            ke = Expand(ku, rep)
            kh = Reshape(ke, merge)
            vu = Unsqueeze(v1, ax2)
            ve = Expand(vu, rep)
            vh = Reshape(ve, merge)
            {_RANGES}
            kpos = Unsqueeze(ki, ax012)
            qpos = Unsqueeze(qi, ax013)
            causal = LessOrEqual(kpos, qpos)
            pad = Unsqueeze(keep, ax12)
            allowed = And(causal, pad)
            mask = Where(allowed, zero_f, masked)
            out = com.microsoft.MultiHeadAttention<num_heads=4, scale=0.35>(q, kh, vh, , , mask)
        }}
    """
    return parse(
        text,
        wqkv=rng_array(8, 48, seed=1),
        bqkv=rng_array(48, seed=2),
        sizes=np.array([32, 8, 8], np.int64),
        width=np.array([32], np.int64),
        merge=np.array([0, 4, -1, 8], np.int64),
        rep=np.array([1, 1, 4, 1, 1], np.int64),
        ax1=np.array([1], np.int64),
        ax01=np.array([0, 1], np.int64),
        one1=np.array([1], np.int64),
        column=np.array([-1, 1], np.int64),
        ax2=np.array([2], np.int64),
        ax012=np.array([0, 1, 2], np.int64),
        ax013=np.array([0, 1, 3], np.int64),
        ax12=np.array([1, 2], np.int64),
        zero_f=np.array(0.0, np.float32),
        masked=np.array(LOWEST, np.float32),
    )


def test_multi_query_attention_reads_its_packed_projection() -> None:
    # The query's view [B, 1, S, 32] -> [B, S, 32] and the Unsqueeze before the Split keep B and
    # S (one sequence); the one K/V head and the query are parts of one projection, which
    # GroupQueryAttention(kv_num_heads=1) reads whole; V's mean is gathered for the 4 query heads.
    model = _multi_query_model()
    fused = model.clone()
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa-causal": 1}
    gqa = next(n for n in fused.graph if n.op_type == "GroupQueryAttention")
    assert gqa.attributes.get_int("kv_num_heads") == 1
    assert gqa.inputs[0] is not None and gqa.inputs[0].name == "qkv"
    assert gqa.inputs[1] is None and gqa.inputs[2] is None
    types = op_types(fused)
    assert "Split" not in types and "Gather" in types
    _assert_sorted(fused)
    _validated_fixed_point(model, fused, _PLAIN_INPUTS)


@pytest.mark.parametrize("opset", [11, 12, 17])
def test_fully_masked_row_flags_at_every_opset(opset: int) -> None:
    """The fix-up's flags (row max <= MASK_FLOOR) are LessOrEqual from opset 12 and Less than the
    next float32 before it (GPT-BigCode exported at opset 11 was refused by ORT): the same flags
    at the floor, just above it, at -inf and for NaN."""
    import onnxruntime as ort

    from onnxopt.passes._attention_shapes import MASK_FLOOR
    from onnxopt.passes.fuse_group_query_attention import _row_flags

    mask = ir.Value(
        name="mask", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 2, 5, 3])
    )
    tape = ir.tape.Tape()
    flags = _row_flags(tape, mask, opset)
    flags.name = "flags"
    graph = ir.Graph([mask], [flags], nodes=tape.nodes, opset_imports={"": opset})
    model = ir.Model(graph, ir_version=7)
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    floor = np.float32(MASK_FLOOR)
    rows = [
        floor,
        np.nextafter(floor, np.float32(0)),
        np.float32(-np.inf),
        np.float32(np.nan),
        np.float32(0),
        np.nextafter(floor, np.float32(-np.inf)),
        np.float32(-3e38),
        floor,
        floor,
        np.float32(1),
    ]
    values = np.full((1, 2, 5, 3), -np.inf, np.float32)
    values[..., 0] = np.array(rows, np.float32).reshape(1, 2, 5)
    (got,) = session.run(None, {"mask": values})
    expected = np.transpose(values.max(axis=3) <= floor, (0, 2, 1))[..., None]
    np.testing.assert_array_equal(got, expected)
    assert got.any() and not got.all()
    ops = [node.op_type for node in tape.nodes]
    assert ("LessOrEqual" in ops) == (opset >= 12)
