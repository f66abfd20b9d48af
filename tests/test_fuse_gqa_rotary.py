"""FuseGqaRotaryPass: the Q/K RotaryEmbedding nodes before a GroupQueryAttention fold into it."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxopt.passes.fuse_gqa_rotary import FuseGqaRotaryPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests.fusion_util import op_types, parse

RULE = "rotary->GroupQueryAttention"
SHAPE_RULE = "shape-of-rotary->shape-of-input"
MS = "com.microsoft::"
HEAD = 16


def _rotary(name: str, heads: int, attrs: str = "", caches: str = "cos, sin") -> str:
    return (
        f"{name}r = com.microsoft.RotaryEmbedding <interleaved = 0, num_heads = {heads}{attrs}> "
        f"({name}, pos, {caches})"
    )


def _model(
    positions: np.ndarray | None = None,
    query_attrs: str = "",
    key_attrs: str = "",
    half_width: int = HEAD // 2,
    extra: str = "",
    extra_output: str = "",
    seq_read: str = "q",
    heads: tuple[int, int] = (4, 2),
    sinks: bool = False,
    key_caches: str = "cos, sin",
    views: bool = False,
) -> ir.Model:
    """q [B, S, 4*16], k and v [B, S, 2*16]; both rotated as fuse-rotary-transposes leaves them,
    and GroupQueryAttention as fuse-group-query-attention writes it (seqlens_k = S - 1 per row,
    S read off ``seq_read``)."""
    pos_input = ", int64[B, S] pos" if positions is None else ""
    # Gemma 4's dynamo export: the rotated query split into heads and merged back before the
    # attention, and a dead head split of the rotated key left by the attention fusion
    view_lines = (
        "qs = Constant <value = int64[4] {0, 0, 4, 16}> ()\n qh = Reshape (qr, qs)\n"
        " qm = Constant <value = int64[3] {0, 0, -1}> ()\n qv = Reshape (qh, qm)\n"
        " ks = Constant <value = int64[4] {0, 0, 2, 16}> ()\n kh = Reshape (kr, ks)\n"
        " kt = Transpose <perm = [0, 2, 1, 3]> (kh)"
        if views
        else ""
    )
    text = f"""
        <ir_version: 10, opset_import: ["" : 20, "com.microsoft" : 1]>
        g (float[B, S, 64] q, float[B, S, 32] k, float[B, S, 32] v,
           float[B, 1, S, S] bias{pos_input}) => (float[B, S, 64] y{extra_output}) {{
            {_rotary("q", heads[0], query_attrs)}
            {_rotary("k", heads[1], key_attrs, key_caches)}
            s64 = Shape <start = 1, end = 2> ({seq_read})
            s32 = Cast <to = 6> (s64)
            one = Constant <value = int32[1] {{1}}> ()
            last = Sub (s32, one)
            b = Shape <start = 0, end = 1> (q)
            seqlens = Expand (last, b)
            scalar = Constant <value = int64[0] {{}}> ()
            total = Reshape (s32, scalar)
            {view_lines}
            y = com.microsoft.GroupQueryAttention <num_heads = {heads[0]}, kv_num_heads = {heads[1]}, causal = 1,
                scale = 0.25> ({"qv" if views else "qr"}, kr, v, , , seqlens, total, , , , bias{", sinks" if sinks else ""})
            {extra}
        }}
    """
    head = 64 // heads[0]
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, 2 * half_width, 2, dtype=np.float32) / head))
    angles = np.arange(32, dtype=np.float32)[:, None] * inv_freq[None, :]
    caches = {"cos": np.cos(angles), "sin": np.sin(angles)}
    if key_caches != "cos, sin":  # the key's own copies (each rotary of a constant table has one)
        caches["cos2"], caches["sin2"] = np.cos(angles), np.sin(angles)
        caches["sin3"] = -np.sin(angles)
    if positions is not None:
        caches["pos"] = positions
    if sinks:  # GPT-OSS's attention sinks, head_sink (input 11)
        caches["sinks"] = np.array([1.5, -2.0, 0.5, 3.0], np.float32)
    return parse(text, **caches)


def _feeds(batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random Q/K/V; a causal bias with left padding (row b's first b keys masked)."""
    mask = np.tril(np.ones((seq, seq), dtype=bool))[None].repeat(batch, 0)
    for row in range(batch):
        mask[row, :, : min(row, seq - 1)] = False
    bias = np.where(mask, 0.0, np.finfo(np.float32).min).astype(np.float32)[:, None]
    return {
        "q": rng.standard_normal((batch, seq, 64), dtype=np.float32),
        "k": rng.standard_normal((batch, seq, 32), dtype=np.float32),
        "v": rng.standard_normal((batch, seq, 32), dtype=np.float32),
        "bias": bias,
    }


def _run(model: ir.Model, target: str = "ort") -> tuple[ir.Model, dict[str, int], list[str]]:
    result = FuseGqaRotaryPass(PassOptions(explain=True, target=target))(model.clone())  # type: ignore[arg-type]
    return result.model, dict(result.stats), result.notes


OFFSET = np.zeros(1, dtype=np.int64)


@pytest.mark.parametrize("seq_read", ["q", "qr"], ids=["shape-of-input", "shape-of-rotary"])
def test_rotaries_fold_into_group_query_attention(seq_read: str) -> None:
    original = _model(OFFSET, seq_read=seq_read)
    fused, stats, _ = _run(original)
    expected = {RULE: 1, SHAPE_RULE: 1} if seq_read == "qr" else {RULE: 1}
    assert stats == expected
    assert f"{MS}RotaryEmbedding" not in op_types(fused)
    (gqa,) = [n for n in fused.graph if n.op_type == "GroupQueryAttention"]
    assert gqa.attributes.get_int("do_rotary") == 1
    assert gqa.attributes.get_int("rotary_interleaved") == 0
    assert gqa.inputs[0] is fused.graph.inputs[0] and gqa.inputs[1] is fused.graph.inputs[1]
    assert gqa.inputs[7] is not None and gqa.inputs[7].name == "cos"
    rng = np.random.default_rng(0)
    sizes = [(1, 1), (3, 5), (2, 16), (3, 16)]
    report = validate(original, fused, inputs=[_feeds(b, s, rng) for b, s in sizes])
    assert report.passed, report
    assert [o.max_abs for o in report.outputs] == [
        0.0
    ]  # bit-identical (scripts/gqa_rotary_check.py)
    _, stats, _ = _run(fused)
    assert stats == {}


def test_rotaries_fold_through_heads_merged_back_and_dead_views() -> None:
    original = _model(OFFSET, views=True)
    fused, stats, _ = _run(original)
    assert stats == {RULE: 1}
    (gqa,) = [n for n in fused.graph if n.op_type == "GroupQueryAttention"]
    assert gqa.attributes.get_int("do_rotary") == 1
    assert gqa.inputs[0] is fused.graph.inputs[0] and gqa.inputs[1] is fused.graph.inputs[1]
    rng = np.random.default_rng(0)
    report = validate(original, fused, inputs=[_feeds(b, s, rng) for b, s in [(1, 1), (3, 16)]])
    assert report.passed, report
    assert [o.max_abs for o in report.outputs] == [0.0]


def test_rotaries_fold_into_group_query_attention_with_head_sinks() -> None:
    original = _model(OFFSET, sinks=True)
    fused, stats, _ = _run(original)
    assert stats == {RULE: 1}
    (gqa,) = [n for n in fused.graph if n.op_type == "GroupQueryAttention"]
    assert gqa.attributes.get_int("do_rotary") == 1
    sink = gqa.inputs[11]
    assert len(gqa.inputs) == 12 and sink is not None and sink.name == "sinks"
    rng = np.random.default_rng(0)
    report = validate(original, fused, inputs=[_feeds(b, s, rng) for b, s in [(1, 1), (3, 16)]])
    assert report.passed, report
    assert [o.max_abs for o in report.outputs] == [0.0]  # scripts/gqa_rotary_check.py


def test_a_partial_rotary_of_16_dims_folds_too() -> None:
    """Two heads of 32, their first 16 dims rotated (GPT-NeoX's, StableLM's partial rotary at
    their real widths): ORT takes the [S, 8] caches and rotates just those dims, bit-identically."""
    attrs = ", rotary_embedding_dim = 16"
    original = _model(OFFSET, attrs, attrs, 8, heads=(2, 1))
    fused, stats, _ = _run(original)
    assert stats == {RULE: 1}
    assert f"{MS}RotaryEmbedding" not in op_types(fused)
    rng = np.random.default_rng(1)
    sizes = [(1, 1), (3, 5), (2, 16)]
    report = validate(original, fused, inputs=[_feeds(b, s, rng) for b, s in sizes])
    assert report.passed, report
    assert [o.max_abs for o in report.outputs] == [0.0]


@pytest.mark.parametrize(
    ("original", "reason"),
    [
        (_model(None), "position_ids are not the one-element [0] offset form"),
        (
            _model(OFFSET, ", rotary_embedding_dim = 8", ", rotary_embedding_dim = 8", 4),
            "rotates a part only in multiples of 16",
        ),
        (
            _model(OFFSET, ", rotary_embedding_dim = 16", "", 8, heads=(2, 1)),
            "rotate different parts of each head",
        ),
        (
            _model(OFFSET, extra="z = Neg (qr)", extra_output=", float[B, S, 64] z"),
            "the rotated query is also read by Neg",
        ),
        (_model(OFFSET, key_attrs=", scale = 2.0"), "scales its position ids"),
        (
            _model(OFFSET, views=True, extra="z = Neg (qv)", extra_output=", float[B, S, 64] z"),
            "the query's view back to [B, S, N*d] is read elsewhere",
        ),
        # ORT's kernel refuses do_rotary below head size 16 ("a multiple of 16"): 8 heads of 8
        (_model(OFFSET, heads=(8, 4), half_width=4), "a multiple of 16"),
    ],
    ids=[
        "per-row-positions",
        "partial-rotary-of-8",
        "partial-query-whole-key",
        "rotary-read-elsewhere",
        "scaled",
        "view-back-read-elsewhere",
        "head-size-8",
    ],
)
def test_refusals(original: ir.Model, reason: str) -> None:
    after, stats, notes = _run(original)
    assert RULE not in stats
    assert f"{MS}RotaryEmbedding" in op_types(after)
    assert any(reason in note for note in notes), notes


def test_seqlens_not_total_minus_one() -> None:
    original = _model(OFFSET)
    sub = next(n for n in original.graph if n.op_type == "Sub")
    sub.replace_input_with(1, ir.Value(name="two", const_value=ir.tensor(np.array([2], np.int32))))
    original.graph.register_initializer(sub.inputs[1])  # type: ignore[arg-type]
    _, stats, notes = _run(original)
    assert RULE not in stats
    assert any("seqlens_k is not total_sequence_length - 1" in note for note in notes), notes


def test_target_onnx_leaves_the_rotaries() -> None:
    _, stats, _ = _run(_model(OFFSET), target="onnx")
    assert stats == {}


def test_equal_copies_of_the_caches_count_as_one() -> None:
    """fuse-rotary-embedding gives each rotary of a precomputed table its own constant cache;
    deduplicate-initializers merges them only later, so equal copies are one cache here."""
    original = _model(OFFSET, key_caches="cos2, sin2")
    fused, stats, _ = _run(original)
    assert stats.get(RULE) == 1
    rng = np.random.default_rng(0)
    report = validate(original, fused, inputs=[_feeds(2, 5, rng), _feeds(1, 1, rng)])
    assert report.passed, report
    _, stats, notes = _run(_model(OFFSET, key_caches="cos2, sin3"))
    assert RULE not in stats
    assert any("different cos/sin caches" in note for note in notes), notes
