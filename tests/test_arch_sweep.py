"""Families outside the zoo whose attention fuses since the architecture sweep (slow: real exports).

benchmarks/arch_sweep.py builds each from a transformers config (2 layers, seeded, no downloads),
exports it, optimizes it with validation and the eager comparison, and optimizes the result again.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from benchmarks import arch_sweep  # imports torch only when a factory runs

CASES = [
    # (family, exporter, attention, a fused op the row must show)
    ("t5-encoder", "dynamo", "eager", "attn 2"),  # position bias + mask: two bias terms
    ("mpnet", "torchscript", "eager", "attn 2"),
    ("wav2vec2", "dynamo", "eager", "attn 2"),  # targets built from a computed length
    ("wav2vec2", "dynamo", "sdpa", "attn 2"),
    ("deit", "dynamo", "sdpa", "attn 2"),  # the key reshaped back to [-1, H, d, T]
    ("mistral", "dynamo", "sdpa", "gqa 2"),  # a Slice of the repeat_kv target
    ("qwen2", "torchscript", "eager", "gqa 2"),  # Add(bias, x @ W)
    ("beit", "torchscript", "eager", "attn 2"),  # a fused mask Expand proved a no-op
    ("hubert", "torchscript", "eager", "mha 2"),  # placeholders inferred alike
    ("falcon", "dynamo", "eager", "gqa 2"),  # one K/V head broadcast (multi-query), GatherND
    ("falcon", "dynamo", "sdpa", "gqa 2"),  # a K^T target reads the 1 head off another layer
    ("falcon", "torchscript", "eager", "gqa 2"),  # P@V's view reads S off the mask; GQA, 1 K/V head
    ("phi", "dynamo", "eager", "gqa 2 rotary 4"),  # partial rotary (half of each head)
    ("phi", "torchscript", "sdpa", "gqa 2 rotary 4"),
    ("stablelm", "torchscript", "eager", "gqa 2 rotary 4"),  # a quarter of each head rotates
    # rotary of chunks of one packed Q/K/V; causal, all heads: GroupQueryAttention
    ("gpt-neox", "dynamo", "eager", "gqa 2 rotary 4"),
    # causal masked_fill Where(keep, scores, lowest): causal with all heads, GroupQueryAttention
    # ("Causal attention with all its heads" in README; these cases still said packed Attention)
    ("gpt-neo", "dynamo", "eager", "gqa 2"),
    ("gpt-neo", "torchscript", "eager", "gqa 2"),  # S read as Gather(Shape(q_proj), 1)
    # heads flattened into the batch (bmm), ALiBi; Q/K/V interleaved per head: packed Attention
    ("bloom", "dynamo", "eager", "attn 2"),
    ("bloom", "torchscript", "eager", "attn 2"),  # B*H as Gather(Shape)*H, lengths -1, B = B*H / H
    # bmm form, Where(~mask, lowest, scores), heads split by [0, 0, H, -1]: packed Attention
    ("deberta-v2", "dynamo", "eager", "attn 2"),
    ("deberta-v2", "torchscript", "eager", "attn 2"),  # T read off K, S and T off Shape(P)
    ("deberta-v3", "dynamo", "eager", "mha 2"),  # content<->position terms of the bmm scores
    ("deberta-v3", "torchscript", "eager", "mha 2"),  # those terms' rows 1 or B*H: expanded
    ("qwen3", "dynamo", "eager", "gqa 2"),  # Q and K normalized per head before the rotary
    ("olmo2", "torchscript", "eager", "gqa 2"),  # Q and K normalized over all heads
    ("gemma3", "dynamo", "sdpa", "gqa 2"),
    # shape reads shared only after the fusions; K/V split from the packed qkv_proj keep B and S,
    # so GroupQueryAttention takes the rotary in (do_rotary): 670 -> 92 nodes
    ("phi3", "torchscript", "eager", "gqa 2"),
    # Interleaved rotary on 8 of 16 dims between the head split and the Transpose: GatherND +
    # Expand tables (dynamo), Gather + Tile (TorchScript).
    ("gptj", "dynamo", "eager", "gqa 2 rotary 4"),
    ("gptj", "torchscript", "eager", "gqa 2 rotary 4"),
    ("cohere", "dynamo", "eager", "gqa 2"),  # interleaved rotary, folded into GQA's do_rotary
    (
        "codegen",
        "torchscript",
        "eager",
        "gqa 2 rotary 4",
    ),  # GPT-J's rotary on heads of a packed Q/K/V
    ("codegen", "dynamo", "eager", "gqa 2 rotary 4"),  # K split from rank 3, V a moved Q/K/V chunk
    # fairseq-style bmm: mask added to a [B, H, S, T] view, clamped at float32's lowest, the
    # Softmax on the [B*H, S, T] view again, P viewed as [B, H, S, T] and back
    ("xglm", "dynamo", "eager", "attn 2"),
    ("xglm", "torchscript", "eager", "attn 2"),
    ("mixtral", "dynamo", "eager", "gqa 2"),  # MoE routing (batched_mm experts) beside the GQA
    # attention sinks as head_sink, sliding/full layers, the rotary of the halves folded in:
    # TorchScript 874 -> 145 nodes, dynamo 264 -> 132 (left unfused before)
    ("gpt-oss", "dynamo", "eager", "gqa 2"),
    ("gpt-oss", "torchscript", "eager", "gqa 2"),
    # masked_fill(mask.expand_as(scores)): the Expand to Shape(scores) dropped (84 -> 49 nodes)
    ("xlm", "torchscript", "eager", "attn 2"),
    # GLM / Helium / ERNIE 4.5: interleaved rotary of the first half of rotate_half's tables
    ("glm", "dynamo", "eager", "gqa 2"),
    ("helium", "dynamo", "eager", "gqa 2"),
    # Conv1D + Gelu: the bias Gelu fused in the first run (it took a second one before)
    ("openai-gpt", "dynamo", "eager", "fastgelu 2"),
    ("siglip-vision", "dynamo", "eager", "attn 2"),  # probe.repeat(B, 1, 1) keeps B's name
    # SAM2's Hiera: K^T of the unbound [B, T, H, d] rows, windows viewed back with [0, h, w, -1]
    ("sam2-vision", "torchscript", "eager", "mha 7"),
    ("sam2-vision", "dynamo", "eager", "mha 7"),  # one head: no key tensor, no merge Transpose
    # the whole model at fixed shapes: equal static view targets shared in the same run
    ("sam2", "torchscript", "eager", "mha 14"),
    ("levit", "dynamo", "eager", "mha 3"),  # V's heads wider than K's: [B, T, H*d] K and V
    # a folded node inside an If branch reads a folded value of the main graph; heads flattened
    # into the batch out of the stacked [3, B*H, T, d] view, relative positions added to a
    # [B*H, h, w, h, w] view of the scores, P@V back on the grid as [B, H, h, w, d]
    ("vitdet", "torchscript", "eager", "mha 2"),
    ("vitdet", "dynamo", "eager", "mha 2"),
    ("sam-vision", "torchscript", "eager", "mha 2"),  # SAM adds the terms' sum flat
    # SDPA: [3, B*H, T, -1] with B*H = Mul(B, H) read at run time, then views [B, H, T, -1]; the
    # -1s are d once the product cancels, and the exporter's 1/sqrt(d) scale folds
    ("sam-vision", "torchscript", "sdpa", "mha 2"),
    # DeepSeek's latent attention: the key written into a fresh tensor by two ScatterNDs (dynamo:
    # rows of its transpose; TorchScript: a grid over the last axis's columns) becomes a Concat;
    # V's heads narrower than K's, both moved back to [B, T, H*d]
    ("deepseek-v3", "dynamo", "eager", "mha 2"),
    ("deepseek-v3", "torchscript", "sdpa", "mha 2"),
    # an If on a constant condition inlined: the branch not taken no longer keeps the RoPE
    # initializers it read alive until a second run (which was then not a fixed point); its
    # RoPE of the patch tokens, each rotate_half slice merged with theirs, fuses
    ("dinov3", "torchscript", "eager", "mha 2 rotary 4"),
    # [-1, S, 3, H, d] at a static S: the -1 is B, the packed projection goes into Attention
    ("blip-vision", "dynamo", "eager", "attn 2"),
    # rotate_half as cat(x2, -x1): the rotary with sin negated (no rotary, MHA before)
    ("nanochat", "dynamo", "eager", "gqa 2 rotary 4"),
    # the rotated query scaled per position (Llama-4 scaling, a scale other than 1 here)
    ("ministral3", "torchscript", "eager", "gqa 2"),
    # RoPE of [B, S, N, d] by cos/sin [1, S, 1, d]: the [B, S, N*d] view rotated
    ("mlcd-vision", "dynamo", "eager", "mha 2 rotary 4"),
    # even/odd dims rotated as halves (transformers 5's interleaved RoPE), the key's inside the
    # Concat with its un-rotated part
    ("glm4-moe-lite", "torchscript", "eager", "mha 2 rotary 4"),
    ("deepseek-v3", "dynamo", "sdpa", "mha 2 rotary 4"),
    # relative-position scores lose S's name before P@V; the merge reads S off the subsampling
    # Conv, whose symbol the query carries (1 of 2 blocks fused before)
    ("parakeet-encoder", "torchscript", "eager", "mha 2"),
    # baddbmm(zeros, q, k) on the flattened heads, viewed back for the mask, P@V on [B, H, S, T]
    # (no attention fused before); the zeros dropped, the causal mask proved: GroupQueryAttention
    # (TorchScript's zeros, a ConstantOfShape viewed, since the 23rd stop)
    ("gpt-neox-japanese", "dynamo", "eager", "gqa 2"),
    ("gpt-neox-japanese", "torchscript", "eager", "gqa 2"),
    # sinks written as P@V * sigmoid(logsumexp(scores) - sinks): GroupQueryAttention's head_sink
    # (no attention fused before), one sliding-window layer
    ("granite-swa", "dynamo", "eager", "gqa 2"),
    ("granite-swa", "torchscript", "eager", "gqa 2"),
    # softmax(s - rowmax(s)): the stabilizer dropped, the full-attention layer fuses (K and V
    # heads of two sizes: MultiHeadAttention); the sink layer's GroupQueryAttention takes one size
    ("mimo-v2-flash", "dynamo", "eager", "mha 1"),
    # the heads gated between their move back and the merge (no attention fused before)
    ("lfm3", "dynamo", "eager", "gqa 2"),  # per head, [B, S, H, 1]
    # mask[:, -S:] and conv(x)[..., :S] keep S's name: the rotary and GroupQueryAttention proved
    ("lfm3", "torchscript", "eager", "gqa 2"),
    ("lfm2", "torchscript", "eager", "gqa 1"),  # MultiHeadAttention, no rotary before
    # Gemma 4: per-layer input embeddings, sliding and full layers; the rotated Q reaches its
    # GroupQueryAttention through a head split merged back, and the rotaries fold into it
    ("gemma4-text", "dynamo", "eager", "gqa 2"),
    ("hrm-text", "torchscript", "eager", "gqa 2"),  # per element, [B, S, H, d]
]


@pytest.mark.slow
@pytest.mark.parametrize(("family", "exporter", "attention", "fused"), CASES)
def test_family_fuses_validates_and_is_a_fixed_point(
    family: str,
    exporter: str,
    attention: str,
    fused: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.setitem(arch_sweep.ATTENTION, "implementation", attention)
    row = arch_sweep.sweep_one(family, exporter, tmp_path, explain=False)
    assert row.status == "ok", row
    assert fused in row.fused, row
    assert row.validated == "yes", row
    assert "FAIL" not in row.eager_diff and "ERROR" not in row.eager_diff, row
    assert row.fixed_point == "yes", row


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_gpt_neox_rotates_parts_of_its_packed_heads_in_three_d(
    exporter: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPT-NeoX cuts Q, K and V out of heads already moved ahead of the sequence (dynamo: a
    Split, TorchScript: three Slices): the cut moves before the Transpose, so every rotary reads
    a [B, S, N*d] view and no Transpose is left around it."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.setitem(arch_sweep.ATTENTION, "implementation", "eager")
    row = arch_sweep.sweep_one("gpt-neox", exporter, tmp_path, explain=False)
    assert row.status == "ok" and row.validated == "yes" and row.fixed_point == "yes", row
    optimized = onnx.load(
        tmp_path / f"gpt-neox.{exporter}.eager.opt.onnx", load_external_data=False
    )
    producers = {out: node for node in optimized.graph.node for out in node.output}
    rotaries = [node for node in optimized.graph.node if node.op_type == "RotaryEmbedding"]
    assert len(rotaries) == 4
    for rotary in rotaries:
        assert any(a.name == "num_heads" for a in rotary.attribute)  # read as [B, S, N*d]
        assert producers[rotary.input[0]].op_type == "Reshape"
        readers = [n.op_type for n in optimized.graph.node if rotary.output[0] in n.input]
        assert "Transpose" not in readers


def _sweep_both_exporters(
    family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, arch_sweep.Row]:
    """The family's sweep row for each exporter (eager attention), each checked to have
    exported, validated and reached a fixed point."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.setitem(arch_sweep.ATTENTION, "implementation", "eager")
    rows = {
        exporter: arch_sweep.sweep_one(family, exporter, tmp_path, explain=False)
        for exporter in ("dynamo", "torchscript")
    }
    for row in rows.values():
        assert row.status == "ok" and row.validated == "yes" and row.fixed_point == "yes", row
    return rows


@pytest.mark.slow
def test_dinov3_convnext_pooled_token_is_a_reshape_in_the_dynamo_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pooled [CLS] token (AdaptiveAvgPool2d(1) of a permuted channels-last map, flattened)
    is an as_strided Gather in the dynamo export: it becomes a Reshape, and the dynamo export
    optimizes to the TorchScript export's node count."""
    rows = _sweep_both_exporters("dinov3-convnext", tmp_path, monkeypatch)
    exported = onnx.load(tmp_path / "dinov3-convnext.dynamo.eager.onnx", load_external_data=False)
    assert "Gather" in {node.op_type for node in exported.graph.node}
    optimized = onnx.load(
        tmp_path / "dinov3-convnext.dynamo.eager.opt.onnx", load_external_data=False
    )
    assert not {"Gather", "Range"} & {node.op_type for node in optimized.graph.node}
    assert rows["torchscript"].nodes_after <= rows["dynamo"].nodes_after


@pytest.mark.slow
def test_roberta_padding_mask_is_one_unsqueeze_with_either_exporter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers 5's bidirectional mask, ``(q_idx >= 0) & mask[b, kv_idx]``: TorchScript
    gathers the flattened mask at ``b * S + kv`` (S read at run time), both exporters keep the
    always-true ``q_idx >= 0``. Both go, and the TorchScript export optimizes to no more nodes
    than the dynamo one (2 fewer: the dynamo export counts the position ids in int64 and casts
    them back, ``Cast(CumSum(Cast(ne, int64)), int32)``, where TorchScript counts in int32)."""
    rows = _sweep_both_exporters("roberta", tmp_path, monkeypatch)
    for exporter, row in rows.items():
        assert "attn 2" in row.fused, row
        optimized = onnx.load(
            tmp_path / f"roberta.{exporter}.eager.opt.onnx", load_external_data=False
        )
        ops = {node.op_type for node in optimized.graph.node}
        assert not {"Range", "GreaterOrEqual", "And", "Flatten"} & ops, (exporter, ops)
    assert rows["torchscript"].nodes_after <= rows["dynamo"].nodes_after


# Exported at the opsets Optimum used (11-14): LayerNorm decomposed, no Shape start/end, no
# LessOrEqual before 12, no data propagation through Unsqueeze/Gather before 13.
EXPORT_OPSET_CASES = [
    # the parallel residual's two norms of one input share their core: one norm per tail
    ("gpt-neox", 14, "gqa 2 rotary 4 ln 5"),
    # and the causal comparison is Not(Greater(k, q)): GroupQueryAttention(causal=1)
    ("gpt-neox", 11, "gqa 2 rotary 4 ln 5"),
    ("opt", 11, "gqa 2"),
    # the backbone's final norm over a hidden state the next layer normalizes too
    ("depth-anything", 14, "ln 12"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("family", "export_opset", "fused"), EXPORT_OPSET_CASES)
def test_family_exported_at_an_older_opset(
    family: str, export_opset: int, fused: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.setitem(arch_sweep.ATTENTION, "implementation", "eager")
    row = arch_sweep.sweep_one(
        family, "torchscript", tmp_path, explain=False, export_opset=export_opset
    )
    assert row.status == "ok", row
    assert fused in row.fused, row
    assert row.validated == "yes", row
    assert "FAIL" not in row.eager_diff and "ERROR" not in row.eager_diff, row
    assert row.fixed_point == "yes", row
