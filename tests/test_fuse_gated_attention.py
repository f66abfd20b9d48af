"""Gated attention: the heads multiplied by a gate between their move back to the sequence and
their merge (LFM3's per-head sigmoid [B, S, H, 1], HRM's elementwise [B, S, H, d]). The block
fuses; the fused [B, S, H*d] output is viewed as heads, gated and merged by the export's own
Reshape, which computes exactly what the export does."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxopt.passes.fuse_attention import FuseAttentionPass
from onnxopt.passes.fuse_group_query_attention import FuseGroupQueryAttentionPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate
from tests.fusion_util import gqa_layer, op_types, rng_array
from tests.test_fuse_attention_sinks import FEEDS

# the gate's producer, then the merge with it
GATES = {
    "per-head": "gl = MatMul(x, wg)\n gs = Sigmoid(gl)\n g = Unsqueeze(gs, last)",
    "elementwise": "gl = MatMul(x, wq)\n gr = Reshape(gl, qsplit)\n g = Sigmoid(gr)",
    "rank-5": "gl = MatMul(x, wg)\n gs = Sigmoid(gl)\n g = Unsqueeze(gs, last2)",
}


def _model(gate: str) -> ir.Model:
    merge = f"""{GATES[gate]}
        pt = Transpose<perm=[0, 2, 1, 3]>(pv)
        gated = Mul(pt, g)
        out = Reshape(gated, outshape)"""
    return gqa_layer(
        "biased = Add(scaled, mask)\n p = Softmax<axis=-1>(biased)",
        inputs=", float[1, 4, 1, 1] runtime",  # FEEDS feed it
        merge=merge,
        wg=rng_array(8, 4, seed=7),
        last=np.array([-1], np.int64),
        last2=np.array([-1, -2], np.int64),
    )


@pytest.mark.parametrize("gate", ["per-head", "elementwise"])
def test_gated_heads_fuse_and_keep_their_gate(gate: str) -> None:
    model = _model(gate)
    fused = model.clone()
    assert FuseAttentionPass()(fused).stats == {"attention->mha": 1}
    assert FuseGroupQueryAttentionPass()(fused).stats == {"mha->gqa-causal": 1}
    types = op_types(fused)
    assert "Softmax" not in types and "com.microsoft::GroupQueryAttention" in types
    # GroupQueryAttention -> [B, S, H, d] view -> the gate -> the export's merge
    after = types[types.index("com.microsoft::GroupQueryAttention") + 1 :]
    assert after[-3:] == ["Reshape", "Mul", "Reshape"], after
    report = validate(model, fused, inputs=FEEDS)
    assert report.passed, report
    assert max(o.max_abs for o in report.outputs) < 1e-5
    assert not FuseAttentionPass()(fused).modified


def test_gate_bites_in_these_tests() -> None:
    """Without the gate the fused layer computes another thing."""
    model = _model("per-head")
    fused = model.clone()
    FuseAttentionPass()(fused)
    mul = next(n for n in fused.graph if n.op_type == "Mul" and n.inputs[1].name == "g")
    ones = ir.Value(name="ones", const_value=ir.tensor(np.ones((1, 1, 1, 1), np.float32)))
    fused.graph.initializers["ones"] = ones
    mul.replace_input_with(1, ones)
    assert not validate(model, fused, inputs=FEEDS).passed


def test_a_multiplier_of_higher_rank_is_no_gate() -> None:
    result = FuseAttentionPass(PassOptions(explain=True))(_model("rank-5"))
    assert not result.modified
    assert any("is not merged back" in note for note in result.notes), result.notes
