"""fuse-attention on CodeGen's layout: K known as the [B, T, H*d] tensor it was split from (after the
interleaved rotary), V only as a [B, H, T, d] chunk of the packed Q/K/V moved by a Transpose.

CodeGen's ``qkv_proj`` output is viewed as [B, S, mp=2 here, 3*local] and split into query, value,
key chunks [B, S, mp, local], each viewed as [B, S, H, d] (H/mp heads per group). Q and K are
flattened to [B, S, H*d] for the rotary (here a per-column gain stands for it), V goes straight to
Transpose [0, 2, 1, 3]. The rule must hand MultiHeadAttention K and V in one layout with head h of
K meeting head h of V.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from onnxopt.passes.fuse_attention import FuseAttentionPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests.fusion_util import op_types, parse, rng_array

D, H, HEAD, MP = 8, 4, 2, 2
LOCAL = D // MP

# value_form:
#   "grouped": V = Transpose(Reshape(v_chunk, [0, 0, H, d]), [0, 2, 1, 3])  (CodeGen)
#   "strided": V = Transpose(Reshape(v3, [0, 0, d, H]), [0, 3, 1, 2]): head h at columns h, h+H
#              of v3, a head order unlike K's (h at columns h*d..(h+1)*d)
#   "shared":  V = one head [B, 1, T, d] that P@V broadcasts against K's H heads
_VALUE = {
    "grouped": """
            vh = Reshape(v, heads)
            v4 = Transpose<perm=[0,2,1,3]>(vh)
    """,
    "strided": """
            v3 = Reshape(v, flat)
            vh = Reshape(v3, heads_last)
            v4 = Transpose<perm=[0,3,1,2]>(vh)
    """,
    "shared": """
            v3 = Reshape(v, flat)
            vs = Slice(v3, zero1, two1, two1)
            vh = Reshape(vs, one_head)
            v4 = Transpose<perm=[0,2,1,3]>(vh)
    """,
}

# key_form:
#   "flat": K^T = Transpose(Reshape(k3, [0, 0, H, d]), [0, 2, 3, 1]) of the rotated rank-3 k3
#   "heads": K4 = Transpose(Reshape(k_chunk, [0, 0, H, d]), [0, 2, 1, 3]), K^T its [0, 1, 3, 2]
#            transpose, with V split off a rank-3 tensor (the mirror image)
_KEY = {
    "flat": """
            k3 = Reshape(k, flat)
            k3r = Mul(k3, kgain)
            kh = Reshape(k3r, heads)
            kt = Transpose<perm=[0,2,3,1]>(kh)
    """,
    "heads": """
            kh = Reshape(k, heads)
            k4 = Transpose<perm=[0,2,1,3]>(kh)
            kt = Transpose<perm=[0,1,3,2]>(k4)
    """,
}
_FLAT_VALUE = """
            v3 = Reshape(v, flat)
            v3r = Mul(v3, vgain)
            vh = Reshape(v3r, heads)
            v4 = Transpose<perm=[0,2,1,3]>(vh)
"""


def _codegen(value_form: str = "grouped", key_form: str = "flat") -> ir.Model:
    value = _FLAT_VALUE if key_form == "heads" else _VALUE[value_form]
    text = f"""
        <ir_version: 8, opset_import: ["" : 18]>
        agraph (float[B, S, {D}] x, int64[B, S] mask) => (float[B, S, {D}] y) <
            int64[4] mp_view = {{0, 0, {MP}, {3 * LOCAL}}},
            int64[3] flat = {{0, 0, {D}}},
            int64[4] heads = {{0, 0, {H}, {HEAD}}},
            int64[4] heads_last = {{0, 0, {HEAD}, {H}}},
            int64[4] one_head = {{0, 0, 1, {HEAD}}},
            int64[1] zero1 = {{0}},
            int64[1] two1 = {{2}},
            int64[2] mask_axes = {{1, 2}},
            float scale = {{0.70710678}},
            float zero = {{0.0}},
            float lowest = {{-3.4028234663852886e38}}
        > {{
            qkv = MatMul(x, w)
            view = Reshape(qkv, mp_view)
            q, v, k = Split<axis=3, num_outputs=3>(view)
            q3 = Reshape(q, flat)
            q3r = Mul(q3, qgain)
            qh = Reshape(q3r, heads)
            q4 = Transpose<perm=[0,2,1,3]>(qh)
            {_KEY[key_form]}
            {value}
            scores = MatMul(q4, kt)
            scaled = Mul(scores, scale)
            keep = Cast<to=9>(mask)
            keep4 = Unsqueeze(keep, mask_axes)
            bias = Where(keep4, zero, lowest)
            masked = Add(scaled, bias)
            probs = Softmax<axis=-1>(masked)
            pv = MatMul(probs, v4)
            pt = Transpose<perm=[0,2,1,3]>(pv)
            y = Reshape(pt, flat)
        }}
    """
    gains = {name: rng_array(D, seed=i, positive=True) for i, name in enumerate("qkv")}
    return parse(
        text,
        w=rng_array(D, 3 * D, seed=7),
        qgain=gains["q"],
        kgain=gains["k"],
        vgain=gains["v"],
    )


def _feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    """benchmarks/padded_masks.py's masks: row 0 full, 1 right-, 2 left-padded, 3 all padding."""
    from benchmarks.padded_masks import padded_feeds

    mask = padded_feeds(batch, seq, seed)["attention_mask"]
    x = np.random.default_rng(seed).standard_normal((batch, seq, D)).astype(np.float32)
    return {"x": x, "mask": mask}


FEEDS = [_feeds(1, 1, 0), _feeds(2, 5, 1), _feeds(4, 9, 2), _feeds(3, 16, 3)]


def _fused(model: ir.Model) -> tuple[ir.Model, ir.Node]:
    fused = model.clone()
    result = FuseAttentionPass()(fused)
    assert result.stats == {"attention->mha": 1}
    types = op_types(fused)
    assert "Softmax" not in types and types.count("com.microsoft::MultiHeadAttention") == 1
    report = validate(model, fused, inputs=FEEDS)
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified
    mha = next(node for node in fused.graph if node.op_type == "MultiHeadAttention")
    return fused, mha


def _made_by(value: ir.Value | None) -> str:
    producer = value.producer() if value is not None else None
    return producer.op_type if producer is not None else "input"


def test_codegen_key_split_from_rank_3_and_value_moved_from_its_chunk() -> None:
    """K stays the rotated [B, T, H*d]; V's [B, T, H, d] view is merged to [B, T, H*d] (its own
    head order), replacing V's Transpose."""
    _, mha = _fused(_codegen())
    assert mha.inputs[1] is not None and mha.inputs[1].name == "k3r"
    assert _made_by(mha.inputs[2]) == "Reshape"
    merged_from = mha.inputs[2].producer().inputs[0]  # type: ignore[union-attr]
    assert merged_from is not None and merged_from.name == "vh"


def test_mirror_image_passes_both_as_heads_first() -> None:
    """K a moved chunk, V split from a rank-3 tensor: both are [B, H, T, d] tensors of the graph."""
    _, mha = _fused(_codegen(key_form="heads"))
    assert [v.name if v is not None else None for v in mha.inputs[1:3]] == ["k4", "v4"]


def test_value_heads_in_another_column_order_are_passed_as_they_are() -> None:
    """V's head h sits at columns h, h+H of v3 (not h*d..(h+1)*d as K's): merging V's tensor to
    [B, T, H*d] would pair K's heads with the wrong V columns. The rule passes V as the
    [B, H, T, d] tensor P@V reads and splits K the way the graph does: exact on every size."""
    _, mha = _fused(_codegen("strided"))
    assert mha.inputs[2] is not None and mha.inputs[2].name == "v4"
    assert _made_by(mha.inputs[1]) == "Transpose"  # K's [B, T, H*d] split to [B, H, T, d]


def test_one_value_head_shared_by_the_key_heads_is_refused() -> None:
    """A single V head broadcast against K's H heads is not multi-head attention (and not
    multi-query either: K has H heads), so K and V cannot be handed over alike."""
    model = _codegen("shared")
    result = FuseAttentionPass(PassOptions(explain=True))(model.clone())
    assert not result.modified
    reasons = " ".join(result.notes)
    assert "Q, K and V have different head counts (1 vs 4)" in reasons, reasons


# --- real CodeGen exports -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "exporter"),
    [
        ("codegen-grouped", "torchscript"),
        pytest.param("codegen-grouped", "dynamo", marks=pytest.mark.slow),
        pytest.param("codegen", "torchscript", marks=pytest.mark.slow),
        pytest.param("codegen", "dynamo", marks=pytest.mark.slow),
    ],
)
def test_real_codegen_fuses_validates_on_padded_masks_and_is_a_fixed_point(
    family: str, exporter: str, tmp_path: Path
) -> None:
    """The sweep's row (optimize -O2 with validation, eager comparison, fixed point), then the
    padded masks of benchmarks/padded_masks.py at several sizes."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from benchmarks import arch_sweep
    from benchmarks.padded_masks import SIZES, padded_feeds
    from onnxopt import io

    row = arch_sweep.sweep_one(family, exporter, tmp_path, explain=False)
    assert row.status == "ok", row
    # causal: GroupQueryAttention (fuse-group-query-attention), with all its heads or, in the
    # grouped variant, its K/V heads read once (their views proved to keep B and S)
    assert "gqa 2 rotary 4" in row.fused, row
    assert row.validated == "yes", row
    assert "FAIL" not in row.eager_diff and "ERROR" not in row.eager_diff, row
    assert row.fixed_point == "yes", row
    stem = f"{family}.{exporter}.eager"
    original = io.load_model(tmp_path / f"{stem}.onnx").model
    optimized = io.load_model(tmp_path / f"{stem}.opt.onnx").model
    feeds = [padded_feeds(b, s, seed) for seed, (b, s) in enumerate(SIZES)]
    report = validate(original, optimized, inputs=feeds)
    assert report.passed, report
