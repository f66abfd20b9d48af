"""Attention sinks (GPT-OSS): a learned logit per head joins each softmax row and its column is
dropped after. fuse-attention matches the block and leaves it (MultiHeadAttention and ONNX
Attention-23 have no sinks); fuse-group-query-attention fuses it into GroupQueryAttention with
the logits as ``head_sink`` (input 11), for --target ort only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from onnxopt.passes.fuse_attention import FuseAttentionPass
from onnxopt.passes.fuse_group_query_attention import FuseGroupQueryAttentionPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests.fusion_util import gqa_layer, key_from_another_sequence, op_types
from tests.test_fuse_attention import _text_feeds

SINKS = np.array([1.5, -2.0, 0.5, 3.0], np.float32)  # large enough to move every row
HEAD_SINK = 11  # GroupQueryAttention's input

# transformers' GptOss eager_attention_forward as both exporters write it after cleanup: the
# sinks parameter folded to [1, H, 1, 1], expanded to [B, H, S, 1] with B and S read off x.
SINK_BLOCK = {
    "column": "col = Expand (sinks, colshape)",
    "join": "cat = Concat <axis = -1> (biased, col)",
    "peak": "peak = ReduceMax <keepdims = 1> (cat, last)",
    "stable": "st = Sub (cat, peak)",
    "drop": "p = Slice (sm, zero1, minus1, three, one1)",
}


def _model(mask: str = "causal", opset: int = 18, **block: str) -> ir.Model:
    """tests/fusion_util.py's GQA layer (``mask``: causal and padding, as the exporters build it,
    or ``padding`` alone) whose scores plus mask are joined by the sink column, stabilized,
    softmaxed and the sink dropped; ``block`` replaces lines of SINK_BLOCK (the near misses)."""
    lines = {**SINK_BLOCK, **block}
    probs = f"""
        biased = Add(scaled, mask)
        bq = Shape<start=0, end=1>(x)
        colshape = Concat<axis=0>(bq, one1, sq, one1)
        {lines["column"]}
        {lines["join"]}
        {lines["peak"]}
        {lines["stable"]}
        sm = Softmax<axis=-1>(st)
        {lines["drop"]}
    """
    return gqa_layer(
        probs,
        opset=opset,
        inputs=", float[1, 4, 1, 1] runtime",
        allowed="allowed = And(causal, pad)" if mask == "causal" else "allowed = Identity(pad)",
        sinks=SINKS.reshape(1, 4, 1, 1),
        one_sink=np.array([[[[0.75]]]], np.float32),
        two_columns=np.stack([SINKS, SINKS], -1).reshape(1, 4, 1, 2),
        last=np.array([-1], np.int64),
        one1=np.array([1], np.int64),
        four1=np.array([4], np.int64),
        zero1=np.array([0], np.int64),
        minus1=np.array([-1], np.int64),
        three=np.array([3], np.int64),
        big=np.array([2**62], np.int64),
        ax2=np.array([2], np.int64),
    )


def _feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    keep = np.ones((batch, seq), bool)
    keep[-1, : seq // 2] = False  # left padding: its first rows see no key at all
    if batch > 2:
        keep[0, (seq + 1) // 2 :] = False  # right padding
    x = (3 * rng.standard_normal((batch, seq, 8))).astype(np.float32)
    return {"x": x, "keep": keep, "runtime": SINKS.reshape(1, 4, 1, 1)}


FEEDS = [_feeds(3, 5, 0), _feeds(1, 1, 1), _feeds(2, 9, 2)]


def _fused(model: ir.Model, rule: str = "sink-attention->gqa-causal") -> ir.Model:
    fused = model.clone()
    assert not FuseAttentionPass()(fused).modified
    result = FuseGroupQueryAttentionPass()(fused)
    assert result.stats == {rule: 1}
    report = validate(model, fused, inputs=FEEDS)
    assert report.passed, report
    assert max(o.max_abs for o in report.outputs) < 1e-5
    assert not FuseAttentionPass()(fused).modified
    assert not FuseGroupQueryAttentionPass()(fused).modified  # idempotent
    return fused


def _gqa(model: ir.Model) -> ir.Node:
    (gqa,) = (n for n in model.graph if n.op_type == "GroupQueryAttention")
    return gqa


def _head_sink(gqa: ir.Node) -> np.ndarray | None:
    sink = gqa.inputs[HEAD_SINK] if len(gqa.inputs) > HEAD_SINK else None
    if sink is None:
        return None
    if sink.const_value is not None:
        return sink.const_value.numpy()
    producer = sink.producer()
    assert producer is not None and producer.op_type == "Constant"
    return producer.attributes["value"].as_tensor().numpy()


def test_sinks_become_group_query_attention_head_sink() -> None:
    model = _model()
    fused = _fused(model)
    types = op_types(fused)
    for gone in ("Softmax", "ReduceMax", "Slice", "com.microsoft::MultiHeadAttention"):
        assert gone not in types, gone
    # The sink column went with the block (its target (B, 1, S, 1) is left to DCE).
    assert not any(n.inputs and n.inputs[0].name == "sinks" for n in fused.graph)
    gqa = _gqa(fused)
    assert gqa.attributes.get_int("causal") == 1  # the causal mask proved; no fix-up needed
    assert "Where" not in types[types.index("com.microsoft::GroupQueryAttention") :]
    assert gqa.attributes.get_int("kv_num_heads") == 2
    assert gqa.attributes.get_float("scale") == pytest.approx(0.7)
    np.testing.assert_array_equal(_head_sink(gqa), SINKS)


def test_sinks_bite_in_these_tests() -> None:
    """Without head_sink the fused op computes another thing: the sinks are no no-op here."""
    model = _model()
    fused = _fused(model)
    gqa = _gqa(fused)
    gqa.replace_input_with(HEAD_SINK, None)
    assert not validate(model, fused, inputs=FEEDS).passed


def test_sinks_with_a_padding_mask_run_causal_0() -> None:
    model = _model(mask="padding")
    fused = _fused(model, "sink-attention->gqa")
    assert _gqa(fused).attributes.get_int("causal") == 0
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True))(model)
    assert result.notes == [
        "sink-attention->gqa-causal: Softmax: the mask is not provably causal (And with "
        "LessOrEqual of key and query positions 0..S-1); GroupQueryAttention runs with causal=0"
    ]


def test_sinks_need_1_23() -> None:
    """head_sink came in ORT 1.23; 1.23 to 1.29 read the causal form without its attribute."""
    model = _model()
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True, ort_version=(1, 22)))(model)
    assert not result.modified
    assert any(
        "head_sink needs ONNX Runtime 1.23; the model is for 1.22" in n for n in result.notes
    )
    fused = model.clone()
    result = FuseGroupQueryAttentionPass(PassOptions(ort_version=(1, 23)))(fused)
    assert result.stats == {"sink-attention->gqa-causal": 1}
    gqa = _gqa(fused)
    assert "causal" not in gqa.attributes and len(gqa.outputs) == 3
    np.testing.assert_array_equal(_head_sink(gqa), SINKS)
    report = validate(model, fused, inputs=FEEDS)
    assert report.passed, report
    # the default (1.30+) form, optimized again for 1.22: head_sink has no older form, it stays
    newer = _fused(model)
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True, ort_version=(1, 22)))(newer)
    assert not result.modified
    assert any("head_sink needs ONNX Runtime 1.23" in n for n in result.notes), result.notes


def test_one_sink_for_every_head_and_no_stabilizer() -> None:
    """A [1, 1, 1, 1] logit broadcast to every head, and Softmax(Concat) without the max
    subtraction (softmax subtracts it itself) are the same block."""
    model = _model(
        column="colshape4 = Concat<axis=0>(bq, four1, sq, one1)\n col = Expand (one_sink, colshape4)",
        join="st = Concat <axis = -1> (biased, col)",
        peak="",
        stable="",
    )
    np.testing.assert_array_equal(_head_sink(_gqa(_fused(model))), [0.75] * 4)


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_fuse_attention_says_why_sinks_stay(target: str) -> None:
    model = _model(opset=23)
    options = PassOptions(target=target, explain=True)
    result = FuseAttentionPass(options)(model)
    assert not result.modified
    why = (
        "MultiHeadAttention has none; fuse-group-query-attention fuses them into "
        "GroupQueryAttention with head_sink"
        if target == "ort"
        else "ONNX Attention-23 has no sinks, so --target onnx leaves them unfused"
    )
    assert result.notes == [
        "attention->mha: Softmax: attention sinks (a learned logit per head joins each softmax "
        f"row, its column dropped after): {why}"
    ]
    fused = FuseGroupQueryAttentionPass(PassOptions(target=target))(model)
    assert fused.modified == (target == "ort")


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        ({"column": "col = Expand (runtime, colshape)"},
         "the column joined to the scores is not a constant (attention sinks are one learned "
         "logit per head)"),
        ({"column": "col = Expand (two_columns, colshape)"},
         "the column joined to the scores is not provably one column wide"),
        ({"column": "rowshape = Concat<axis=0>(bq, one1, one1, sq)\n col = Expand (sinks, rowshape)",
          "join": "cat = Concat <axis = 2> (biased, col)",
          "drop": "p = Slice (sm, zero1, minus1, ax2, one1)"},
         "the Softmax input is a Concat, but not of [B, H, S, T] scores along their last axis"),
        ({"peak": "peak = ReduceMean <keepdims = 1> (cat, last)"},
         "something other than their row max (ReduceMax over the last axis, keepdims=1) "
         "subtracted"),
        ({"peak": "peak = ReduceMax <keepdims = 1> (cat, ax2)"},
         "something other than their row max"),
        ({"drop": "p = Slice (sm, one1, big, three, one1)"},
         "the probabilities do not drop that last column ([..., :-1]) alone"),
    ],
)  # fmt: skip
def test_near_misses_are_not_fused(block: dict[str, str], reason: str) -> None:
    for target in ("ort", "onnx"):
        model = _model(**block)
        before = op_types(model)
        options = PassOptions(target=target, explain=True)
        result = FuseAttentionPass(options)(model)
        assert not result.modified
        assert any(reason in note for note in result.notes), result.notes
        assert not FuseGroupQueryAttentionPass(options)(model).modified
        assert op_types(model) == before


def test_group_query_attention_refusal_is_explained() -> None:
    """The key from another sequence: GroupQueryAttention cannot be proved, and the GQA pass
    says so under its sink rule."""
    model = _model()
    key_from_another_sequence(model)
    result = FuseGroupQueryAttentionPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert any(
        note.startswith("sink-attention->gqa: Softmax")
        and "attention sinks: only GroupQueryAttention has them (head_sink), and cannot prove "
        "the query, key and value come from one sequence"
        in note
        for note in result.notes
    ), result.notes


# Granite-SWA's eager attention: P@V scaled by sigmoid(logsumexp(scores) - sinks), the softmax
# with the sink's logit in each row written without the column.
LSE_BLOCK = {
    "lse": "lse = ReduceLogSumExp <keepdims = 0> (biased, last)",
    "sub": "ls = Sub (lse, sinks3)",
    "gate": "gate = Unsqueeze (sg, last)",
    "pv": "pv0 = MatMul(p, vh)\n pv = Mul(pv0, gate)",
}


def _lse_model(mask: str = "causal", opset: int = 18, **block: str) -> ir.Model:
    """The GQA layer with Granite-SWA's sinks; ``block`` replaces lines of LSE_BLOCK."""
    lines = {**LSE_BLOCK, **block}
    probs = f"""
        biased = Add(scaled, mask)
        p = Softmax<axis=-1>(biased)
        {lines["lse"]}
        {lines["sub"]}
        sg = Sigmoid(ls)
        {lines["gate"]}
    """
    return gqa_layer(
        probs,
        opset=opset,
        inputs=", float[1, 4, 1, 1] runtime",  # FEEDS feed it
        allowed="allowed = And(causal, pad)" if mask == "causal" else "allowed = Identity(pad)",
        pv=lines["pv"],
        sinks3=SINKS.reshape(1, 4, 1),
        per_row=np.tile(SINKS.reshape(1, 4, 1), (1, 1, 2)),
        last=np.array([-1], np.int64),
        ax2=np.array([2], np.int64),
    )


@pytest.mark.parametrize("mask", ["causal", "padding"])
def test_sinks_scaling_p_at_v_become_head_sink(mask: str) -> None:
    model = _lse_model(mask)
    fused = _fused(model, "sink-attention->gqa" + ("-causal" if mask == "causal" else ""))
    types = op_types(fused)
    for gone in ("Softmax", "ReduceLogSumExp", "Sigmoid", "Mul"):
        assert gone not in types, gone
    np.testing.assert_array_equal(_head_sink(_gqa(fused)), SINKS)


def test_sinks_scaling_p_at_v_below_opset_18() -> None:
    """ReduceLogSumExp takes its axes as an attribute before opset 18 (Granite-SWA exported at
    opset 14 fused no attention; the template needs 15 for its Shape reads)."""
    lse = "lse = ReduceLogSumExp <keepdims = 0, axes = [-1]> (biased)"
    model = _lse_model(opset=17, lse=lse)
    fused = _fused(model, "sink-attention->gqa-causal")
    np.testing.assert_array_equal(_head_sink(_gqa(fused)), SINKS)


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        ({"lse": "lse = ReduceLogSumExp <keepdims = 0> (biased, ax2)"},
         "the scores' logsumexp does not scale P@V as sigmoid(logsumexp - sinks)"),
        ({"sub": "ls = Sub (sinks3, lse)"},
         "the scores' logsumexp does not scale P@V as sigmoid(logsumexp - sinks)"),
        ({"sub": "ls = Sub (lse, per_row)"},
         "not one per head [1, H, 1]"),
        ({"pv": "pv1 = MatMul(p, vh)\n pv0 = Relu(pv1)\n pv = Mul(pv0, gate)"},
         "multiplies something other than the [B, H, S, d] P@V"),
    ],
)  # fmt: skip
def test_near_misses_of_sinks_scaling_p_at_v(block: dict[str, str], reason: str) -> None:
    model = _lse_model(**block)
    before = op_types(model)
    result = FuseAttentionPass(PassOptions(explain=True))(model)
    assert not result.modified
    assert any(reason in note for note in result.notes), result.notes
    assert not FuseGroupQueryAttentionPass()(model).modified
    assert op_types(model) == before


# --- tiny real GPT-OSS exports (benchmarks/arch_sweep.py's gpt_oss_window4) -------------------


def _export(exporter: str, tmp_path: Path) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from benchmarks import arch_sweep  # noqa: F401  (the factories' module)
    from onnxopt.export import export

    path = tmp_path / f"gpt-oss.{exporter}.onnx"
    export("benchmarks.arch_sweep:gpt_oss_window4", path, exporter=exporter)  # type: ignore[arg-type]
    return path


def _padded(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    """Row 0 full, row 1 right-padded, row 2 left-padded (benchmarks/padded_masks.py's rows)."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[1, (seq + 1) // 2 :] = 0
    mask[2, : seq // 2] = 0
    return {"input_ids": rng.integers(0, 1000, (batch, seq)), "attention_mask": mask}


@pytest.mark.torch
@pytest.mark.parametrize(
    "exporter", ["torchscript", pytest.param("dynamo", marks=pytest.mark.slow)]
)
def test_gpt_oss_export_fuses_into_group_query_attention(exporter: str, tmp_path: Path) -> None:
    from benchmarks.arch_sweep import gpt_oss_window4
    from onnxopt import api, io

    path = _export(exporter, tmp_path)
    # Right- and left-padded rows at two lengths past the sliding window (4), and a 1-token row.
    feeds = [_padded(3, 9, 0), _padded(3, 16, 1), _text_feeds(1, 1, 2)]
    result = api.optimize(path, find_reference=True, inputs=feeds, explain=True)
    assert result.validated, result.report.validation
    assert max(o.max_abs for o in result.report.validation.outputs) < 1e-5  # type: ignore[union-attr]
    reference = result.report.reference
    assert reference is not None and reference.optimized_passed, reference
    nodes = [n for n in result.model.graph if n.op_type == "GroupQueryAttention"]
    assert len(nodes) == 2  # the sliding-window layer and the full one
    # The logits are the model's own sinks, layer by layer.
    module = gpt_oss_window4()[0]
    sinks = [m.sinks.detach().numpy() for m in module.modules() if hasattr(m, "sinks")]
    for node, expected in zip(nodes, sinks, strict=True):
        np.testing.assert_array_equal(_head_sink(node), expected)
        assert node.attributes.get_int("causal") == 1
        assert node.attributes.get_int("do_rotary") == 1  # GPT-OSS's rotary folded in too
    softmaxes = [n for n in result.model.graph if n.op_type == "Softmax"]
    assert len(softmaxes) == 2  # the MoE routers'
    # The window decides the sliding layer's output at these lengths: given the full layer's
    # mask instead (a fusion that lost the window), validation fails.
    lost = result.model.clone()
    first, second = (n for n in lost.graph if n.op_type == "GroupQueryAttention")
    bias = 10  # attention_bias
    first.replace_input_with(bias, second.inputs[bias])
    assert not validate(io.load_model(path).model, lost, inputs=feeds).passed
    saved = io.save_model(result.model, tmp_path / "opt.onnx")
    again = api.optimize(saved, check=False)
    assert io.save_model(again.model, tmp_path / "opt2.onnx").read_bytes() == saved.read_bytes()


@pytest.mark.torch
def test_gpt_oss_export_onnx_target_leaves_sinks_unfused(tmp_path: Path) -> None:
    from onnxopt import api

    path = _export("torchscript", tmp_path)
    result = api.optimize(path, find_reference=True, target="onnx", opset=23, explain=True)
    assert result.validated, result.report.validation
    types = [n.op_type for n in result.model.graph]
    assert "Attention" not in types and "GroupQueryAttention" not in types
    assert types.count("RotaryEmbedding") == 4  # ONNX RotaryEmbedding-23 still fuses
    notes = result.report.explain_notes(fusions=True)
    assert sum("ONNX Attention-23 has no sinks" in note for note in notes) == 2, notes
