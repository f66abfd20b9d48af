"""FuseAttentionPass on timm's ViT attention as the dynamo exporter writes it.

``qkv.reshape(B, N, 3, H, d).permute(2, 0, 3, 1, 4).unbind(0)`` gives each part as
``Squeeze(Slice(qkv5, [i, i+1], axis 0), [0])``; SDPA's K^T is
``Reshape(Transpose(Reshape(k, [-1, T, d]), [0, 2, 1]), [B, H, d, T])``, and merge-consecutive-ops
folds the key's Squeeze into that first Reshape, which then reads the [1, B, H, T, d] slice.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
from test_fuse_flat_heads_attention import D

from onnxopt.passes.fuse_attention import FuseAttentionPass
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate

T = 5  # tokens (static, as in a ViT: patches + class token)


def _model(*, merged: bool = True) -> ir.Model:
    rng = np.random.default_rng(0)
    weight = ", ".join(f"{v:.4f}" for v in rng.standard_normal(D * 3 * D) * 0.5)
    key = "ks" if merged else "k4"
    text = f"""
        <ir_version: 9, opset_import: ["" : 18]>
        agraph (float[B, {T}, 8] x) => (float[B, {T}, 8] y) <
            float[1, B, 2, {T}, 4] ks, float[B, 2, {T}, 4] k4,
            float[{D}, {3 * D}] w = {{{weight}}},
            int64[5] parts = {{-1, {T}, 3, 2, 4}},
            int64[3] flat = {{-1, {T}, 4}},
            int64[4] back = {{-1, 2, 4, {T}}},
            int64[3] merged = {{0, 0, 8}},
            int64[1] zero1 = {{0}},
            int64[1] one1 = {{1}},
            int64[1] two1 = {{2}},
            int64[1] three1 = {{3}},
            float root = {{0.7071067811865476}}
        > {{
            qkv = MatMul(x, w)
            qkv5 = Reshape<allowzero=1>(qkv, parts)
            moved = Transpose<perm=[2, 0, 3, 1, 4]>(qkv5)
            qs = Slice(moved, zero1, one1, zero1)
            q4 = Squeeze(qs, zero1)
            ks = Slice(moved, one1, two1, zero1)
            k4 = Squeeze(ks, zero1)
            vs = Slice(moved, two1, three1, zero1)
            v4 = Squeeze(vs, zero1)
            qscaled = Mul(q4, root)
            kflat = Reshape({key}, flat)
            kt = Transpose<perm=[0, 2, 1]>(kflat)
            kt4 = Reshape(kt, back)
            ktscaled = Mul(kt4, root)
            scores = MatMul(qscaled, ktscaled)
            probs = Softmax<axis=-1>(scores)
            pv = MatMul(probs, v4)
            pt = Transpose<perm=[0, 2, 1, 3]>(pv)
            y = Reshape(pt, merged)
        }}
    """
    proto = onnx.parser.parse_model(text)
    onnx.checker.check_model(proto)
    model = ir.serde.deserialize_model(proto)
    InferShapesPass()(model)
    return model


FEEDS = [
    {"x": np.random.default_rng(i).standard_normal((b, T, D)).astype(np.float32)}
    for i, b in enumerate((1, 3))
]


def test_a_key_read_off_the_unbound_slice_fuses() -> None:
    model = _model()
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(explain=True))(fused)
    assert result.stats == {"attention->mha": 1}, result.notes
    types = [node.op_type for node in fused.graph]
    assert "Softmax" not in types and types.count("MultiHeadAttention") == 1
    report = validate(model, fused, inputs=FEEDS)
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


def test_the_squeeze_put_back_goes_again_when_nothing_fuses() -> None:
    model = _model()
    softmax = next(node for node in model.graph if node.op_type == "Softmax")
    softmax.attributes["axis"] = ir.AttrInt64("axis", 2)  # not over the keys: no fusion
    before = ir.serde.serialize_model(model).SerializeToString()
    result = FuseAttentionPass()(model)
    assert not result.modified
    assert ir.serde.serialize_model(model).SerializeToString() == before


def test_the_unmerged_spelling_still_fuses() -> None:
    model = _model(merged=False)
    result = FuseAttentionPass()(model)
    assert result.stats == {"attention->mha": 1}
