"""FuseAttentionPass on Q/K/V taken out of a packed projection as [B, T, H, d] rows.

SAM2's windowed attention (transformers' Sam2MultiScaleAttention):

Each window of h x w tokens arrives as [B, h, w, C]; ``qkv(x).reshape(B, h*w, 3, H, d)`` is
unbound along dim 2, the heads moved first, and the output viewed back as [B, h, w, H*d]:

- TorchScript writes the unbind as Split + Squeeze and K^T as ``Transpose(k, [0, 2, 3, 1])`` of
  the [B, T, H, d] rows themselves (no Reshape of a [B, T, H*d] key to read);
- with one head (SAM2's first stage), the dynamo export has no [B, 1, T, d] key at all: the
  Squeeze and the head Transpose over a dim of 1 fold into SDPA's flattening Reshape, and P@V
  [B, 1, S, d] is viewed as [B, h, w, d] with no Transpose.

LeViT views its projection as [B, T, H, 2*dk + dv] and splits the last axis: V's heads are wider
than K's, which MultiHeadAttention takes only as [B, T, H*d] K and V.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxopt.passes.fuse_attention import FuseAttentionPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests.fusion_util import op_types, parse

SIDE, C = 2, 8  # 2 x 2 tokens per window, 8 channels
T = SIDE * SIDE


def _feeds(channels: int) -> list[dict[str, np.ndarray]]:
    return [
        {
            "x": np.random.default_rng(b)
            .standard_normal((b, SIDE, SIDE, channels))
            .astype(np.float32)
        }
        for b in (1, 3)
    ]


# The constants _rows_block reads (with a ``merged`` view target of the caller's own).
ROWS_CONSTANTS = f"""
            int64[5] parts = {{0, {T}, 3, 2, -1}},
            int64[3] thirds = {{1, 1, 1}},
            int64[1] two1 = {{2}},
            float root = {{0.7071067811865476}},"""


def _rows_block(x: str, y: str, i: str = "") -> str:
    """One block of two heads of 4 in TorchScript's spelling, x -> y (viewed by ``merged``);
    ``i`` suffixes its values' names."""
    return f"""
            qkv{i} = MatMul({x}, w{i})
            qkv5{i} = Reshape(qkv{i}, parts)
            qs{i}, ks{i}, vs{i} = Split<axis=2>(qkv5{i}, thirds)
            q{i} = Squeeze(qs{i}, two1)
            k{i} = Squeeze(ks{i}, two1)
            v{i} = Squeeze(vs{i}, two1)
            q4{i} = Transpose<perm=[0, 2, 1, 3]>(q{i})
            kt{i} = Transpose<perm=[0, 2, 3, 1]>(k{i})
            v4{i} = Transpose<perm=[0, 2, 1, 3]>(v{i})
            qscaled{i} = Mul(q4{i}, root)
            kscaled{i} = Mul(kt{i}, root)
            scores{i} = MatMul(qscaled{i}, kscaled{i})
            probs{i} = Softmax<axis=-1>(scores{i})
            pv{i} = MatMul(probs{i}, v4{i})
            pt{i} = Transpose<perm=[0, 2, 1, 3]>(pv{i})
            {y} = Reshape(pt{i}, merged)"""


def _rows_model(*, merge: str = f"0, {SIDE}, {SIDE}, -1", opset: int = 18) -> ir.Model:
    """Two heads of 4, TorchScript's spelling; ``merge``: the output view's target."""
    rng = np.random.default_rng(0)
    text = f"""
        <ir_version: 9, opset_import: ["" : {opset}]>
        agraph (float[B, {SIDE}, {SIDE}, {C}] x) => (float[B, {SIDE}, {SIDE}, {C}] y) <{ROWS_CONSTANTS}
            int64[4] merged = {{{merge}}}
        > {{{_rows_block("x", "y")}
        }}
    """
    return parse(text, w=(rng.standard_normal((C, 3 * C)) * 0.5).astype(np.float32))


def _one_head_model(*, merge: str = f"0, {SIDE}, {SIDE}, -1") -> ir.Model:
    """One head of 4, the dynamo spelling."""
    rng = np.random.default_rng(1)
    text = f"""
        <ir_version: 9, opset_import: ["" : 18]>
        agraph (float[B, {SIDE}, {SIDE}, 4] x) => (float[B, {SIDE}, {SIDE}, 4] y) <
            int64[5] parts = {{0, {T}, 3, 1, -1}},
            int64[1] zero1 = {{0}},
            int64[1] one1 = {{1}},
            int64[1] two1 = {{2}},
            int64[1] three1 = {{3}},
            int64[3] flat = {{-1, {T}, 4}},
            int64[4] back = {{-1, 1, 4, {T}}},
            int64[4] merged = {{{merge}}},
            float root = {{0.7071067811865476}}
        > {{
            qkv = MatMul(x, w)
            qkv5 = Reshape(qkv, parts)
            qs = Slice(qkv5, zero1, one1, two1)
            ks = Slice(qkv5, one1, two1, two1)
            vs = Slice(qkv5, two1, three1, two1)
            q = Squeeze(qs, two1)
            v = Squeeze(vs, two1)
            q4 = Transpose<perm=[0, 2, 1, 3]>(q)
            v4 = Transpose<perm=[0, 2, 1, 3]>(v)
            kflat = Reshape(ks, flat)
            kt = Transpose<perm=[0, 2, 1]>(kflat)
            kt4 = Reshape(kt, back)
            qscaled = Mul(q4, root)
            kscaled = Mul(kt4, root)
            scores = MatMul(qscaled, kscaled)
            probs = Softmax<axis=-1>(scores)
            pv = MatMul(probs, v4)
            y = Reshape(pv, merged)
        }}
    """
    return parse(text, w=(rng.standard_normal((4, 12)) * 0.5).astype(np.float32))


def _levit_model(*, opset: int = 18) -> ir.Model:
    """Two heads, K and Q of 4, V of 8, and a learned [H, S, T] position bias (LeViT's)."""
    rng = np.random.default_rng(2)
    bias = ", ".join(f"{v:.4f}" for v in rng.standard_normal(2 * T * T))
    text = f"""
        <ir_version: 9, opset_import: ["" : {opset}]>
        agraph (float[B, {T}, {C}] x) => (float[B, {T}, 16] y) <
            int64[4] parts = {{0, 0, 2, 16}},
            int64[3] sizes = {{4, 4, 8}},
            int64[3] merged = {{0, 0, 16}},
            float[2, {T}, {T}] position = {{{bias}}},
            float root = {{0.5}}
        > {{
            qkv = MatMul(x, w)
            rows = Reshape(qkv, parts)
            q, k, v = Split<axis=3>(rows, sizes)
            q4 = Transpose<perm=[0, 2, 1, 3]>(q)
            k4 = Transpose<perm=[0, 2, 1, 3]>(k)
            v4 = Transpose<perm=[0, 2, 1, 3]>(v)
            kt = Transpose<perm=[0, 1, 3, 2]>(k4)
            scores = MatMul(q4, kt)
            scaled = Mul(scores, root)
            biased = Add(scaled, position)
            probs = Softmax<axis=-1>(biased)
            pv = MatMul(probs, v4)
            pt = Transpose<perm=[0, 2, 1, 3]>(pv)
            y = Reshape(pt, merged)
        }}
    """
    return parse(text, w=(rng.standard_normal((C, 32)) * 0.7).astype(np.float32))


def _fuses(model: ir.Model, channels: int, options: PassOptions | None = None) -> ir.Model:
    fused = model.clone()
    result = FuseAttentionPass(options or PassOptions(explain=True))(fused)
    assert sum(result.stats.values()) == 1, result.notes
    assert "Softmax" not in op_types(fused)
    report = validate(model, fused, inputs=_feeds(channels))
    assert report.passed, report
    assert not FuseAttentionPass(options or PassOptions())(fused).modified
    return fused


def _levit_feeds() -> list[dict[str, np.ndarray]]:
    return [
        {"x": np.random.default_rng(b).standard_normal((b, T, C)).astype(np.float32)}
        for b in (1, 3)
    ]


def test_a_key_known_only_as_its_rows_fuses() -> None:
    fused = _fuses(_rows_model(), C)
    (attention,) = (node for node in fused.graph if node.op_type == "MultiHeadAttention")
    # Q, K and V go in as [B, T, H*d] views of their rows: no head is moved
    assert [value.producer().op_type for value in attention.inputs] == ["Reshape"] * 3


def test_a_key_known_only_as_its_rows_fuses_for_onnx_attention() -> None:
    fused = _fuses(_rows_model(opset=23), C, PassOptions(target="onnx", explain=True))
    assert op_types(fused).count("Attention") == 1


def test_one_head_without_a_key_tensor_or_a_merge_transpose_fuses() -> None:
    fused = _fuses(_one_head_model(), 4)
    assert op_types(fused).count("com.microsoft::MultiHeadAttention") == 1


@pytest.mark.parametrize(
    ("build", "merge"),
    [
        # dim 2 of the [B, S, H, d] heads is H, of the fused [B, S, H*d] output nothing
        (_rows_model, f"0, {T}, 0, -1"),
        # dim 1 of the one-head P@V is 1, of the fused [B, S, d] output S
        (_one_head_model, f"0, 0, {T}, -1"),
    ],
)
def test_a_merge_that_copies_a_dim_the_fused_output_lacks_is_not_fused(build, merge) -> None:
    model = build(merge=merge)
    before = ir.serde.serialize_model(model).SerializeToString()
    result = FuseAttentionPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert any("not merged back" in note for note in result.notes), result.notes
    assert ir.serde.serialize_model(model).SerializeToString() == before


def test_values_wider_than_keys_fuse_as_three_d_key_and_value() -> None:
    model = _levit_model()
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(explain=True))(fused)
    assert result.stats == {"attention->mha": 1}, result.notes
    (attention,) = (node for node in fused.graph if node.op_type == "MultiHeadAttention")
    assert [value.producer().op_type for value in attention.inputs[1:3]] == ["Reshape"] * 2
    assert validate(model, fused, inputs=_levit_feeds()).passed
    assert not FuseAttentionPass()(fused).modified


def test_values_wider_than_keys_fuse_for_onnx_attention() -> None:
    model = _levit_model(opset=23)
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(target="onnx", explain=True))(fused)
    assert result.stats == {"attention->onnx-attention": 1}, result.notes
    assert validate(model, fused, inputs=_levit_feeds()).passed


def test_values_wider_than_keys_in_four_d_only_are_moved_back_to_rows() -> None:
    """K and V of two head sizes known only as [B, H, T, d] (DeepSeek's latent attention: K a
    Concat of two parts, V a Split): MultiHeadAttention takes them only as [B, T, H*d], so each
    is moved back by one Transpose. Level with the unfused graph at 128 tokens, 4% faster at 512
    (DeepSeek-V2-Lite's attention at half width)."""
    text = f"""
        <ir_version: 9, opset_import: ["" : 18]>
        agraph (float[B, 2, {T}, 4] q4, float[B, 2, {T}, 4] k4, float[B, 2, {T}, 8] v4)
            => (float[B, {T}, 16] y) <int64[3] merged = {{0, 0, 16}}> {{
            kt = Transpose<perm=[0, 1, 3, 2]>(k4)
            scores = MatMul(q4, kt)
            probs = Softmax<axis=-1>(scores)
            pv = MatMul(probs, v4)
            pt = Transpose<perm=[0, 2, 1, 3]>(pv)
            y = Reshape(pt, merged)
        }}
    """
    model = parse(text)
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(explain=True))(fused)
    assert result.stats == {"attention->mha": 1}, result.notes
    (attention,) = (node for node in fused.graph if node.op_type == "MultiHeadAttention")
    for value, name in zip(attention.inputs[1:3], ("k4", "v4"), strict=True):
        reshape = value.producer()
        moved = reshape.inputs[0].producer()
        assert reshape.op_type == "Reshape" and moved.op_type == "Transpose"
        assert list(moved.attributes["perm"].as_ints()) == [0, 2, 1, 3]
        assert moved.inputs[0].name == name
    assert validate(model, fused).passed
    assert not FuseAttentionPass()(fused).modified


def test_three_projections_with_wider_values_become_one_attention() -> None:
    """Separate Q/K/V projections, V twice as wide, over 6 tokens (packed Attention is the
    faster op there): the whole pipeline packs them into one com.microsoft.Attention with
    ``qkv_hidden_sizes`` (validated by optimize itself)."""
    from onnxopt.api import optimize

    rng = np.random.default_rng(3)
    text = f"""
        <ir_version: 9, opset_import: ["" : 18]>
        agraph (float[B, 6, {C}] x) => (float[B, 6, 16] y) <
            int64[4] heads4 = {{0, 0, 2, 4}},
            int64[4] heads8 = {{0, 0, 2, 8}},
            int64[3] merged = {{0, 0, 16}},
            float root = {{0.5}}
        > {{
            q = MatMul(x, wq)
            k = MatMul(x, wk)
            v = MatMul(x, wv)
            qh = Reshape(q, heads4)
            kh = Reshape(k, heads4)
            vh = Reshape(v, heads8)
            q4 = Transpose<perm=[0, 2, 1, 3]>(qh)
            k4 = Transpose<perm=[0, 2, 1, 3]>(kh)
            v4 = Transpose<perm=[0, 2, 1, 3]>(vh)
            kt = Transpose<perm=[0, 1, 3, 2]>(k4)
            qk = MatMul(q4, kt)
            scores = Mul(qk, root)
            probs = Softmax<axis=-1>(scores)
            pv = MatMul(probs, v4)
            pt = Transpose<perm=[0, 2, 1, 3]>(pv)
            y = Reshape(pt, merged)
        }}
    """
    weights = {
        name: (rng.standard_normal((C, width)) * 0.7).astype(np.float32)
        for name, width in (("wq", 8), ("wk", 8), ("wv", 16))
    }
    result = optimize(parse(text, **weights))
    assert result.report.validation is not None and result.report.validation.passed
    (attention,) = (node for node in result.model.graph if node.op_type == "Attention")
    assert list(attention.attributes["qkv_hidden_sizes"].value) == [8, 8, 16]


def test_two_window_blocks_optimize_to_a_fixed_point() -> None:
    """Static shapes: each fused block's output view back to windows meets the next view after
    the fusion, and the merged Reshapes get equal static targets. They are shared in the same run
    (else a second optimize run shared them and the output was not a fixed point; SAM2's full
    model exported at fixed shapes)."""
    from onnxopt.api import optimize

    rng = np.random.default_rng(4)
    blocks = [
        _rows_block(f"x{i}", f"win{i}", str(i))
        + f"\n            x{i + 1} = Reshape(win{i}, tokens)"
        for i in (1, 2)
    ]
    text = f"""
        <ir_version: 9, opset_import: ["" : 18]>
        agraph (float[3, {T}, {C}] x1) => (float[3, {T}, {C}] x3) <{ROWS_CONSTANTS}
            int64[4] merged = {{0, {SIDE}, {SIDE}, -1}},
            int64[3] tokens = {{0, {T}, {C}}}
        > {{{"".join(blocks)}
        }}
    """
    weights = {f"w{i}": (rng.standard_normal((C, 3 * C)) * 0.5).astype(np.float32) for i in (1, 2)}
    first = optimize(parse(text, **weights))
    assert first.report.validation is not None and first.report.validation.passed
    assert op_types(first.model).count("com.microsoft::MultiHeadAttention") == 2
    again = optimize(first.model, check=False)
    assert (
        ir.to_proto(again.model).SerializeToString() == ir.to_proto(first.model).SerializeToString()
    )
