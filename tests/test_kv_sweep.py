"""KV-cache decoder steps (use_cache=True) fuse and validate like the no-cache exports.

benchmarks/kv_sweep.py exports each family's cached step (input_ids [B, S], attention_mask
[B, P+S], past key/value [B, kv, P, d] -> hidden state, present key/value [B, kv, P+S, d]),
optimizes it at -O2 and validates it on ORT against the original at (B, P, S) = (2, 5, 3),
(1, 0, 4), (2, 7, 1), (1, 3, 1) with all-ones, left-padded and right-padded masks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import kv_sweep  # imports torch only when a factory runs

CASES = [
    # (family, exporter, attention, fused ops the row must show)
    ("llama", "dynamo", "eager", "mha 2 rotary 4"),
    ("llama", "torchscript", "sdpa", "mha 2 rotary 4"),
    ("gpt2", "torchscript", "eager", "mha 2"),
    ("gpt2", "dynamo", "sdpa", "mha 2"),
    ("mistral", "torchscript", "eager", "mha 2 rotary 4"),
    ("qwen2", "dynamo", "eager", "mha 2 rotary 4"),
    ("phi", "torchscript", "eager", "mha 2 rotary 4"),  # partial rotary
    ("gpt-neox", "torchscript", "eager", "mha 2 rotary 4"),
    ("falcon", "dynamo", "eager", "mha 2 rotary 4"),
    ("opt", "dynamo", "eager", "mha 2"),
    ("qwen3", "torchscript", "eager", "mha 2 rotary 4"),  # Q/K normalized per head
    ("gemma3", "dynamo", "eager", "mha 2 rotary 4"),  # sliding-window layers
    # the cache holds the compressed latents; the key is scattered together after it
    ("deepseek-v3", "dynamo", "eager", "mha 2"),
]


def _check(
    family: str,
    exporter: str,
    attention: str,
    fused: str,
    tmp_path: Path,
    positions: bool = False,
    target: str = "ort",
    merged: bool = False,
) -> kv_sweep.Row:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    opset = 23 if target == "onnx" else None
    row = kv_sweep.sweep_one(
        family, exporter, tmp_path, attention, False, positions, target, opset, merged
    )
    assert row.status == "ok", row
    assert fused in row.fused, row
    assert row.validated == "yes", row
    assert row.eager_diff not in ("", "-"), row  # the eager reference was compared
    assert "FAIL" not in row.eager_diff and "ERROR" not in row.eager_diff, row
    assert row.fixed_point == "yes", row
    return row


@pytest.mark.torch
def test_llama_torchscript_cache_step(tmp_path: Path) -> None:
    """The rotary positions start at the past length P: still fused (4 rotaries, 2 attentions)."""
    _check("llama", "torchscript", "eager", "mha 2 rotary 4", tmp_path)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize(("family", "exporter", "attention", "fused"), CASES)
def test_cache_step_fuses_and_validates(
    family: str, exporter: str, attention: str, fused: str, tmp_path: Path
) -> None:
    _check(family, exporter, attention, fused, tmp_path)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "exporter"), [("llama", "dynamo"), ("phi", "torchscript"), ("qwen2", "torchscript")]
)
def test_cache_step_with_position_ids(family: str, exporter: str, tmp_path: Path) -> None:
    """position_ids [B, S] as an input (each row its own positions): the rotaries still fuse."""
    _check(family, exporter, "eager", "mha 2 rotary 4", tmp_path, positions=True)


@pytest.mark.torch
@pytest.mark.slow
def test_cache_step_standard_ops_at_opset_23(tmp_path: Path) -> None:
    """--target onnx --opset 23: ONNX Attention and RotaryEmbedding (per-row [B, S, H/2] caches)."""
    _check("llama", "dynamo", "eager", "attn 2 rotary 4", tmp_path, positions=True, target="onnx")


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "exporter", "target"),
    [("llama", "torchscript", "ort"), ("gpt2", "dynamo", "ort"), ("llama", "torchscript", "onnx")],
)
def test_merged_decoder_fuses_in_both_branches(
    family: str, exporter: str, target: str, tmp_path: Path
) -> None:
    """Optimum's decoder_model_merged form: If(use_cache_branch) over two copies of the step that
    share names and carry no value_info. Each branch fuses like the plain step (before: no
    attention or rotary fused, and not a fixed point), validated with the flag both ways."""
    attention = "mha" if target == "ort" else "attn"
    plain = _check(family, exporter, "eager", f"{attention} 2", tmp_path, target=target)
    merged = _check(
        family, exporter, "eager", f"{attention} 4", tmp_path, target=target, merged=True
    )
    assert merged.nodes_before == 2 * plain.nodes_before + 1
    # Per branch at most a few shape reads more than the plain step (dynamo names some dims
    # in value_info that the merged form drops).
    assert merged.nodes_after <= 2 * (plain.nodes_after + 5) + 1, (plain, merged)


@pytest.mark.torch
@pytest.mark.slow
def test_merged_decoder_branch_dim_names_never_collide(tmp_path: Path) -> None:
    """A 12-layer merged GPT-2: each infer-shapes run inferred the branches afresh and named the
    dims it made up unk__if0_N again, for other dims than an earlier run's unk__if0_N; two dims
    then shared a name and a Reshape was folded to a batch of 4 ("cannot reshape {1,768} to
    {4,-1,768}"). Each run's made-up names are now new to the whole model."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from onnxopt import api

    step = tmp_path / "step.onnx"
    kv_sweep.export_kv("benchmarks.arch_sweep:gpt2_deep", "torchscript", step)
    merged = kv_sweep.save_merged(step, tmp_path / "merged.onnx")
    plain = api.optimize(step)
    result = api.optimize(merged)
    assert plain.validated and result.validated
    assert result.report.after.nodes == 2 * plain.report.after.nodes + 1
