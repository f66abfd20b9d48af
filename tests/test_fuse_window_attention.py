"""Swin's window attention forms.

torchvision's and Hugging Face's Swin (and Swin-V2's) shifted blocks compute
``(q @ k^T + rel).view(B, W, H, N, N) + mask[None, :, None]`` and view it back to [B*W, H, N, N]
before the softmax. fuse-attention reads the windowed term as one more [B*W, 1, N, N] bias.
Swin-V2's cosine attention scales the scores per head, ``(q̂ @ k̂^T) * logit_scale.exp()`` with
a [H, 1, 1] factor: that factor moves onto the query.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxopt.api import optimize

WINDOWS, TOKENS, DIM, HEADS = 4, 9, 16, 2


def _window_attention(  # type: ignore[no-untyped-def]
    tmp_path,
    dynamo: bool,
    shifted: bool = True,
    heads_mask: bool = False,
    cosine: bool = False,
    twice: bool = False,
):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class WindowAttention(torch.nn.Module):
        """torchvision's shifted_window_attention, its windows already partitioned:
        x [B, W, N, C] -> [B*W, N, C]."""

        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(DIM, 3 * DIM)
            self.proj = torch.nn.Linear(DIM, DIM)
            self.rel = torch.nn.Parameter(torch.randn(1, HEADS, TOKENS, TOKENS))
            # any finite values, not only Swin's 0/-100: a wrong row pairing would show
            mask = torch.randn(WINDOWS, HEADS if heads_mask else 1, TOKENS, TOKENS) * 3
            self.register_buffer("mask", mask)
            self.logit_scale = torch.nn.Parameter(torch.tensor([[[0.5]], [[2.0]]]))  # per head

        def forward(self, x):  # type: ignore[no-untyped-def]
            b, w, n, c = x.shape
            x = x.reshape(b * w, n, c)
            qkv = self.qkv(x).reshape(b * w, n, 3, HEADS, c // HEADS).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            if cosine:  # Swin-V2
                q = torch.nn.functional.normalize(q, dim=-1)
                k = torch.nn.functional.normalize(k, dim=-1)
                attn = q.matmul(k.transpose(-2, -1)) * self.logit_scale.exp() + self.rel
            else:
                q = q * (c // HEADS) ** -0.5
                attn = q.matmul(k.transpose(-2, -1)) + self.rel
            if shifted:
                attn = attn.view(b, w, HEADS, n, n) + self.mask.unsqueeze(0)
                if twice:  # Hugging Face's Swin-V2 adds its mask twice
                    attn = attn + self.mask.unsqueeze(0)
                attn = attn.view(-1, HEADS, n, n)
            attn = attn.softmax(dim=-1)
            out = attn.matmul(v).transpose(1, 2).reshape(b * w, n, c)
            return self.proj(out).reshape(b, w, n, c)

    module = WindowAttention().eval()
    example = (torch.randn(2, WINDOWS, TOKENS, DIM),)
    path = tmp_path / "window.onnx"
    if dynamo:
        shapes = ({0: torch.export.Dim.AUTO},)
        torch.onnx.export(module, example, str(path), input_names=["x"], dynamic_shapes=shapes,
                          dynamo=True, external_data=False)  # fmt: skip
    else:
        torch.onnx.export(module, example, str(path), input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}}, dynamo=False)  # fmt: skip
    return ir.load(str(path))


def _feeds(batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, WINDOWS, TOKENS, DIM)).astype(np.float32)}


def _count(model: ir.Model, op: str) -> int:
    return sum(1 for node in model.graph if node.op_type == op)


def _fused(model: ir.Model) -> int:
    """Fused blocks: MultiHeadAttention, or packed Attention where the packed Q/K/V projection
    went in too (its [B*W, N, 3, H, d] view proved, as in the sweep's Swin)."""
    return _count(model, "MultiHeadAttention") + _count(model, "Attention")


@pytest.mark.parametrize("heads_mask", [False, True])
@pytest.mark.parametrize("dynamo", [False, True])
def test_shifted_window_mask_becomes_one_more_bias_term(tmp_path, dynamo, heads_mask) -> None:  # type: ignore[no-untyped-def]
    model = _window_attention(tmp_path, dynamo, heads_mask=heads_mask)
    result = optimize(model, inputs=[_feeds(1, 0), _feeds(3, 1)])
    assert result.validated, result.report.validation
    assert _fused(result.model) == 1
    assert _count(result.model, "Softmax") == 0
    again = optimize(result.model, check=False)
    assert _fused(again.model) == 1
    assert len(again.model.graph) == len(result.model.graph)


@pytest.mark.parametrize("dynamo", [False, True])
def test_a_per_head_scale_of_the_scores_moves_onto_the_query(tmp_path, dynamo) -> None:  # type: ignore[no-untyped-def]
    model = _window_attention(tmp_path, dynamo, cosine=True)
    result = optimize(model, inputs=[_feeds(1, 0), _feeds(3, 1)])
    assert result.validated, result.report.validation
    assert _count(result.model, "MultiHeadAttention") == 1 and _count(result.model, "Softmax") == 0
    onnx_target = optimize(model, target="onnx", opset=23, inputs=[_feeds(2, 0)])
    assert onnx_target.validated


def test_a_mask_added_twice_to_the_windowed_scores_is_two_terms(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = _window_attention(tmp_path, dynamo=False, cosine=True, twice=True)
    result = optimize(model, inputs=[_feeds(1, 0), _feeds(3, 1)])
    assert result.validated, result.report.validation
    assert _count(result.model, "MultiHeadAttention") == 1 and _count(result.model, "Softmax") == 0


def test_unshifted_windows_still_fuse(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = _window_attention(tmp_path, dynamo=False, shifted=False)
    result = optimize(model, inputs=[_feeds(1, 0), _feeds(2, 1)])
    assert result.validated and _fused(result.model) == 1


def test_target_onnx_keeps_the_windowed_block(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = _window_attention(tmp_path, dynamo=False)
    result = optimize(model, target="onnx", opset=23, inputs=[_feeds(2, 0)], explain=True)
    assert result.validated
    assert _count(result.model, "Softmax") == 1 and _count(result.model, "Attention") == 0
    assert any("windowed [B, W, H, S, T] scores" in n for n in result.report.explain_notes())
