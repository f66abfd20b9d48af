"""fuse-softcap-attention (opt-in): Gemma2's soft-capped attention, tanh(s / c) * c, becomes
GroupQueryAttention(softcap) for --target ort, Attention-23(softcap) for --target onnx;
MultiHeadAttention has no softcap, and fuse-attention leaves such blocks alone."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxopt.passes.fuse_attention import FuseAttentionPass
from onnxopt.passes.fuse_softcap_attention import FuseSoftcapAttentionPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests.fusion_util import gqa_layer, key_from_another_sequence, op_types
from tests.test_fuse_attention import _text_feeds

LOWEST = float(np.finfo(np.float32).min)
CAP = 2.0  # small enough that the cap bites on these random projections

# How the exporters write the cap, and the near misses.
FORMS = {
    "div": "sd = Div(scaled, cap)\n t = Tanh(sd)\n capped = Mul(t, cap)",
    "reciprocal": "sd = Mul(scaled, inverse)\n t = Tanh(sd)\n capped = Mul(cap, t)",
    "runtime-cap": "sd = Div(scaled, c_in)\n t = Tanh(sd)\n capped = Mul(t, cap)",
    "runtime-factor": "sd = Div(scaled, cap)\n t = Tanh(sd)\n capped = Mul(t, c_in)",
    "no-div": "t = Tanh(scaled)\n capped = Mul(t, cap)",
    "other-cap": "sd = Div(scaled, three)\n t = Tanh(sd)\n capped = Mul(t, cap)",
}


def _model(form: str = "div", *, after_mask: bool = False, opset: int = 17) -> ir.Model:
    """x[B,S,8] -> 4 query heads and 2 K/V heads of 8, K/V repeated as repeat_kv; the scaled
    scores soft-capped (``form``), plus a causal + padding mask built from keep[B,S] as the
    exporters build it; ``after_mask``: the cap applied to scores + mask instead."""
    if after_mask:
        cap_and_mask = """
            biased = Add(scaled, mask)
            sd = Div(biased, cap)
            t = Tanh(sd)
            logits = Mul(t, cap)
        """
    else:
        cap_and_mask = f"""
            {FORMS[form]}
            logits = Add(capped, mask)
        """
    return gqa_layer(
        f"{cap_and_mask}\n        p = Softmax<axis=-1>(logits)",
        opset=opset,
        inputs=", float c_in",
        cap=np.array(CAP, np.float32),
        inverse=np.array(1 / CAP, np.float32),
        three=np.array(3.0, np.float32),
    )


def _feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    keep = np.ones((batch, seq), bool)
    keep[-1, : seq // 2] = False  # left padding: its first rows are fully masked
    if batch > 2:
        keep[0, :] = False  # all padding
    x = (3 * rng.standard_normal((batch, seq, 8))).astype(np.float32)
    return {"x": x, "keep": keep, "c_in": np.array(CAP, np.float32)}


FEEDS = [_feeds(3, 5, 0), _feeds(1, 1, 1), _feeds(2, 9, 2)]


def _assert_exact(original: ir.Model, fused: ir.Model) -> None:
    report = validate(original, fused, inputs=FEEDS)
    assert report.passed, report
    assert max(o.max_abs for o in report.outputs) < 1e-5


def test_cap_bites_in_these_tests() -> None:
    # Without the cap the block computes something else: the cap is not a no-op here.
    capped, plain = _model(), _model()
    tanh = next(n for n in plain.graph if n.op_type == "Tanh")
    times_cap = next(u.node for u in tanh.outputs[0].uses())
    scaled = next(n for n in plain.graph if n.op_type == "Div").inputs[0]
    assert scaled is not None
    ir.convenience.replace_all_uses_with(times_cap.outputs[0], scaled)
    assert not validate(capped, plain, inputs=FEEDS).passed


@pytest.mark.parametrize("form", ["div", "reciprocal"])
def test_soft_capped_block_becomes_group_query_attention(form: str) -> None:
    model = _model(form)
    fused = model.clone()
    result = FuseSoftcapAttentionPass()(fused)
    assert result.stats == {"softcap-attention->gqa-causal": 1}
    types = op_types(fused)
    assert types.count("com.microsoft::GroupQueryAttention") == 1
    for gone in ("Tanh", "Softmax", "MatMul", "com.microsoft::MultiHeadAttention"):
        # the three projections stay, and one MatMul averages V for the fully-masked-row fix-up
        assert types.count(gone) == (4 if gone == "MatMul" else 0), gone
    gqa = next(n for n in fused.graph if n.op_type == "GroupQueryAttention")
    assert gqa.attributes.get_float("softcap") == CAP
    assert gqa.attributes.get_int("causal") == 1
    assert gqa.attributes.get_int("kv_num_heads") == 2
    assert gqa.attributes.get_float("scale") == pytest.approx(0.7)
    _assert_exact(model, fused)
    assert not FuseSoftcapAttentionPass()(fused).modified


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_fuse_attention_leaves_a_soft_capped_block_to_the_opt_in_pass(target: str) -> None:
    model = _model(opset=23)
    result = FuseAttentionPass(PassOptions(target=target, explain=True))(model)
    assert not result.modified
    op = "GroupQueryAttention" if target == "ort" else "Attention-23"
    assert result.notes == [
        "attention->mha: Softmax: soft-capped scores (tanh(s / 2) * 2): left to the opt-in "
        f"fuse-softcap-attention (--enable), which fuses them into {op} with softcap "
        "(MultiHeadAttention has none); ONNX Runtime 1.32's CPU softcap measured slower than "
        "the unfused graph"
    ]


def test_onnx_target_uses_attention_23_softcap() -> None:
    model = _model(opset=23)
    fused = model.clone()
    onnx_target = PassOptions(target="onnx")
    result = FuseSoftcapAttentionPass(onnx_target)(fused)
    assert result.stats == {"softcap-attention->onnx-attention": 1}
    attention = next(n for n in fused.graph if n.op_type == "Attention")
    assert attention.attributes.get_float("softcap") == CAP
    types = op_types(fused)
    assert "Tanh" not in types and not any(t.startswith("com.microsoft") for t in types)
    _assert_exact(model, fused)
    assert not FuseSoftcapAttentionPass(onnx_target)(fused).modified


@pytest.mark.parametrize(
    ("form", "after_mask", "reason"),
    [
        ("runtime-cap", False, "tanh(s / d) * 2 with a divisor d that is not a scalar constant"),
        ("runtime-factor", False, "the scores go through a Tanh that is not multiplied by a "
         "scalar constant c (a soft cap is tanh(s / c) * c)"),
        ("other-cap", False, "tanh(s / 3) * 2 is not a soft cap tanh(s / c) * c with one "
         "positive constant c"),
        ("no-div", False, "tanh(s) * 2 without the division of s by 2 is not a soft cap"),
        ("div", True, "the soft cap tanh(s / 2) * 2 is applied after a term was added to the "
         "scores; the fused kernels cap the scaled Q@K^T before the mask"),
    ],
)  # fmt: skip
def test_not_a_soft_cap_of_the_scores_is_not_fused(
    form: str, after_mask: bool, reason: str
) -> None:
    for target in ("ort", "onnx"):
        model = _model(form, after_mask=after_mask, opset=23)
        result = FuseAttentionPass(PassOptions(target=target, explain=True))(model)
        assert not result.modified
        assert any(reason in note for note in result.notes), result.notes
        assert not FuseSoftcapAttentionPass(PassOptions(target=target))(model).modified


def test_group_query_attention_refusal_is_explained() -> None:
    # head size 8 is fine; make the key come from another sequence: GQA cannot be proved
    model = _model()
    key_from_another_sequence(model)
    result = FuseSoftcapAttentionPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert any(
        note.startswith("softcap-attention->gqa: Softmax")
        and "soft-capped scores (tanh(s / 2) * 2): only GroupQueryAttention has softcap, and "
        "cannot prove the query, key and value come from one sequence"
        in note
        for note in result.notes
    ), result.notes


# --- tiny real Gemma2 exports (benchmarks/arch_sweep.py's factories) ------------------------------


def _export(family: str, exporter: str, tmp_path) -> str:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from benchmarks import arch_sweep  # noqa: F401  (the factories' module)
    from onnxopt.export import export

    path = tmp_path / f"{family}.{exporter}.onnx"
    export(f"benchmarks.arch_sweep:{family}", path, exporter=exporter)  # type: ignore[arg-type]
    return str(path)


@pytest.mark.parametrize(
    ("family", "exporter", "target"),
    [
        ("gemma2_window4", "torchscript", "ort"),
        pytest.param("gemma2_window4", "dynamo", "ort", marks=pytest.mark.slow),
        pytest.param("gemma2", "torchscript", "onnx", marks=pytest.mark.slow),
        pytest.param("gemma2", "dynamo", "ort", marks=pytest.mark.slow),
    ],
)
def test_gemma2_export_fuses_validates_and_matches_eager(  # type: ignore[no-untyped-def]
    family: str, exporter: str, target: str, tmp_path
) -> None:
    from onnxopt import api, io

    path = _export(family, exporter, tmp_path)
    # Sequences longer than the window (4) and padded rows, besides the generated inputs.
    feeds = [_text_feeds(3, 9, 0), _text_feeds(1, 1, 1), _text_feeds(2, 16, 2)]
    opset = 23 if target == "onnx" else None
    if exporter == "torchscript" and target == "ort":
        # -O2 without the opt-in pass: unfused, and --explain says why
        default = api.optimize(path, check=False, explain=True)
        assert "GroupQueryAttention" not in [n.op_type for n in default.model.graph]
        notes = default.report.explain_notes(fusions=True)
        assert sum("left to the opt-in fuse-softcap-attention" in n for n in notes) == 2, notes
    softcap = ["fuse-softcap-attention"]
    result = api.optimize(
        path,
        find_reference=True,
        target=target,  # type: ignore[arg-type]
        opset=opset,
        inputs=feeds,
        enable=softcap,
    )
    assert result.validated, result.report.validation
    reference = result.report.reference
    assert reference is not None and reference.optimized_passed, reference
    fused = "GroupQueryAttention" if target == "ort" else "Attention"
    nodes = [n for n in result.model.graph if n.op_type == fused]
    assert len(nodes) == 2  # the sliding-window layer and the full one
    assert all(n.attributes.get_float("softcap") == 50.0 for n in nodes)
    assert not any(n.op_type == "Tanh" for n in result.model.graph)
    if family == "gemma2_window4" and target == "ort":
        # The window decides the sliding layer's output at these lengths: with the full layer's
        # mask instead (a fusion that lost the window), validation fails.
        lost = result.model.clone()
        first, second = (n for n in lost.graph if n.op_type == fused)
        first.replace_input_with(len(first.inputs) - 1, second.inputs[-1])
        assert not validate(io.load_model(path).model, lost, inputs=feeds).passed
    if target == "ort":  # the rotaries folded in: the pass runs before fuse-gqa-rotary
        assert all(n.attributes.get_int("do_rotary") == 1 for n in nodes)
    saved = io.save_model(result.model, tmp_path / "opt.onnx")
    again = api.optimize(saved, check=False, target=target, opset=opset, enable=softcap)  # type: ignore[arg-type]
    assert io.save_model(again.model, tmp_path / "opt2.onnx").read_bytes() == saved.read_bytes()
