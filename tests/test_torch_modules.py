"""Models written from torch's own modules (nn.MultiheadAttention, nn.TransformerEncoder), exported
as a user exports them and optimized end to end (scripts/torch_modules_probe.py probes more)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest

import onnxopt

pytestmark = pytest.mark.torch


def _padded(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    pad = np.zeros((batch, seq), dtype=bool)
    if batch > 1:
        pad[1, seq // 2 :] = True  # right padding of the second sequence
    if batch > 2:
        pad[2, : seq // 3] = True  # left padding of the third
    return {"x": rng.standard_normal((batch, seq, 16)).astype(np.float32), "pad": pad}


def _ops(model: ir.Model) -> Counter[str]:
    return Counter(node.op_type for node in model.graph)


@pytest.mark.slow
@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_torchscript_export_fuses(batch_first: bool, tmp_path: Path) -> None:
    # nn.MultiheadAttention merges its heads sequence-first ([S, B, H, d] viewed as [S*B, D]).
    # TorchScript bakes the key's length into a view, so the export runs at the traced length only.
    torch = pytest.importorskip("torch")
    module = _multihead_module(batch_first, need_weights=False, return_weights=False)
    path = tmp_path / "mha.onnx"
    args = (torch.randn(2, 7, 16), torch.zeros(2, 7, dtype=torch.bool))
    axes = {"x": {0: "batch"}, "pad": {0: "batch"}, "y": {0: "batch"}}
    torch.onnx.export(module, args, str(path), input_names=["x", "pad"],
                      output_names=["y"], dynamic_axes=axes, dynamo=False)  # fmt: skip
    inputs = [_padded(3, 7, 0), _padded(1, 7, 1), _padded(4, 7, 2)]
    result = onnxopt.optimize(path, inputs=inputs)
    assert result.report.validation is not None and result.report.validation.passed
    ops = _ops(result.model)
    assert ops["Attention"] == 1 and ops["Softmax"] == 0, ops


def _multihead_module(batch_first: bool, need_weights: bool, return_weights: bool) -> Any:
    """nn.MultiheadAttention self-attention with a key padding mask, then a Linear. With
    ``need_weights`` (torch's default, whether or not the weights are returned) torch takes its
    bmm path (heads flattened into the batch, sequence-first), else its SDPA path."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=batch_first)
            self.proj = torch.nn.Linear(16, 16)

        def forward(self, x, pad):  # type: ignore[no-untyped-def]
            q = x if batch_first else x.transpose(0, 1)
            y, w = self.attn(q, q, q, key_padding_mask=pad, need_weights=need_weights)
            y = self.proj(y if batch_first else y.transpose(0, 1))
            return (y, w) if return_weights else y

    return Model().eval()


def _multihead_weights_export(batch_first: bool, return_weights: bool, path: Path) -> None:
    """``y, w = attn(q, k, v, key_padding_mask=pad)`` (need_weights on), dynamo, dynamic dims."""
    torch = pytest.importorskip("torch")
    module = _multihead_module(batch_first, need_weights=True, return_weights=return_weights)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    shapes = ({0: batch, 1: seq}, {0: batch, 1: seq})
    args = (torch.randn(2, 7, 16), torch.zeros(2, 7, dtype=torch.bool))
    with torch.no_grad():
        torch.onnx.export(module, args, str(path), input_names=["x", "pad"],
                          dynamic_shapes=shapes, dynamo=True)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_bmm_path_fuses(batch_first: bool, tmp_path: Path) -> None:
    path = tmp_path / "mha.onnx"
    _multihead_weights_export(batch_first, False, path)
    inputs = [_padded(3, 5, 0), _padded(1, 1, 1), _padded(4, 9, 2)]
    result = onnxopt.optimize(path, inputs=inputs)
    assert result.report.validation is not None and result.report.validation.passed
    ops = _ops(result.model)
    # torch's packed in-projection runs on the batch-first input again, so the layer packs into
    # one Attention; the fused output's move to [S, B, D] and back around the output projection
    # cancel (and so does the user's pair of transposes in the sequence-first model).
    assert ops["Attention"] == 1 and ops["Softmax"] == 0, ops
    assert ops["Transpose"] == 0, ops
    again = onnxopt.optimize(result.model, check=False)
    assert _ops(again.model) == ops


@pytest.mark.slow
def test_multihead_attention_bmm_path_left_exactly_when_weights_are_returned(
    tmp_path: Path,
) -> None:
    # The weights are an output: nothing fuses, and the respelled operands are taken back.
    path = tmp_path / "mha.onnx"
    _multihead_weights_export(True, True, path)
    fused = onnxopt.optimize(path, check=False)
    unfused = onnxopt.optimize(path, check=False, disable=["fuse-attention"])
    assert _ops(fused.model)["Softmax"] == 1
    assert ir.to_proto(fused.model).SerializeToString() == (
        ir.to_proto(unfused.model).SerializeToString()
    )


@pytest.mark.slow
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_dynamo_export_fuses_with_a_padding_mask(
    norm_first: bool, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layer = torch.nn.TransformerEncoderLayer(
                16, 2, 32, 0.0, "gelu", batch_first=True, norm_first=norm_first
            )
            self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

        def forward(self, x, pad):  # type: ignore[no-untyped-def]
            return self.encoder(x, src_key_padding_mask=pad)

    path = tmp_path / "encoder.onnx"
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    shapes = ({0: batch, 1: seq}, {0: batch, 1: seq})
    args = (torch.randn(2, 7, 16), torch.zeros(2, 7, dtype=torch.bool))
    with torch.no_grad():
        torch.onnx.export(Model().eval(), args, str(path), input_names=["x", "pad"],
                          dynamic_shapes=shapes, dynamo=True)  # fmt: skip
    inputs = [_padded(3, 5, 0), _padded(1, 1, 1), _padded(4, 9, 2)]
    for target in ("ort", "onnx"):
        opset = 23 if target == "onnx" else None
        result = onnxopt.optimize(path, inputs=inputs, target=target, opset=opset)
        assert result.report.validation is not None and result.report.validation.passed, target
        if target == "ort":
            ops = _ops(result.model)
            assert ops["Attention"] == 2 and ops["Softmax"] == 0, ops


@pytest.mark.slow
@pytest.mark.parametrize("einsum", [False, True])
def test_hand_written_attention_packs_into_one_attention(einsum: bool, tmp_path: Path) -> None:
    # qkv.view(B, S, 3, H, d).permute(2, 0, 3, 1, 4), q @ k^T (or einsum), masked_fill(-inf)
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)
            self.out = torch.nn.Linear(16, 16)

        def forward(self, x, pad):  # type: ignore[no-untyped-def]
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 2, 8).permute(2, 0, 3, 1, 4)
            if einsum:
                scores = torch.einsum("bhsd,bhtd->bhst", q, k) / 8**0.5
            else:
                scores = q @ k.transpose(-2, -1) / 8**0.5
            p = scores.masked_fill(pad[:, None, None, :], float("-inf")).softmax(-1)
            y = torch.einsum("bhst,bhtd->bhsd", p, v) if einsum else p @ v
            return self.out(y.transpose(1, 2).reshape(b, s, 16))

    path = tmp_path / "attention.onnx"
    args = (torch.randn(2, 7, 16), torch.zeros(2, 7, dtype=torch.bool))
    axes = {"x": {0: "batch", 1: "seq"}, "pad": {0: "batch", 1: "seq"}}
    torch.onnx.export(Model().eval(), args, str(path), input_names=["x", "pad"],
                      dynamic_axes=axes, dynamo=False)  # fmt: skip
    inputs = [_padded(3, 5, 0), _padded(1, 1, 1), _padded(4, 9, 2)]
    result = onnxopt.optimize(path, inputs=inputs)
    assert result.report.validation is not None and result.report.validation.passed
    ops = _ops(result.model)
    assert ops["Attention"] == 1 and ops["Softmax"] == 0 and ops["Einsum"] == 0


def test_annotated_transformer_fill_fuses_and_keeps_fully_padded_sequences(
    tmp_path: Path,
) -> None:
    """The hand-written form (the Annotated Transformer's): separate projections and
    ``scores.masked_fill(mask == 0, -1e9)``. It fuses, and a sequence padded entirely (every row
    masked) still averages V as in eager PyTorch, with scores in the hundreds (where s - 1e9 is
    not -1e9 in float32)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.o = (torch.nn.Linear(16, 16) for _ in range(4))

        def forward(self, x, mask):  # type: ignore[no-untyped-def]
            b = x.shape[0]
            q, k, v = (f(x).view(b, -1, 2, 8).transpose(1, 2) for f in (self.q, self.k, self.v))
            scores = torch.matmul(q, k.transpose(-2, -1)) / 8**0.5
            p = scores.masked_fill(mask.unsqueeze(1).unsqueeze(2) == 0, -1e9).softmax(dim=-1)
            return self.o(torch.matmul(p, v).transpose(1, 2).contiguous().view(b, -1, 16))

    ops = _optimized_matches_eager(Model().eval(), tmp_path)
    assert ops["Attention"] == 1 and ops["Softmax"] == 0, ops


@pytest.mark.parametrize("fill", ["lowest", "-1e9"])
def test_two_masked_fills_fuse_and_keep_fully_masked_rows(fill: str, tmp_path: Path) -> None:
    """A hand-written decoder masking twice, ``s.masked_fill(causal, f).masked_fill(~pad, f)``:
    an entry both mask holds f (float32's lowest twice would be -inf), so left-padded rows and a
    sequence padded entirely still average V as eager PyTorch does."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.o = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

        def forward(self, x, mask):  # type: ignore[no-untyped-def]
            b, s, _ = x.shape
            q, k, v = (t.view(b, s, 2, 8).transpose(1, 2) for t in self.qkv(x).split(16, -1))
            scores = q @ k.transpose(-1, -2) / 8**0.5
            value = torch.finfo(scores.dtype).min if fill == "lowest" else float(fill)
            causal = torch.ones(s, s, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(causal, value).masked_fill(
                mask[:, None, None, :] == 0, value
            )
            return self.o((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, 16))

    ops = _optimized_matches_eager(Model().eval(), tmp_path, left=True)
    assert ops["Softmax"] == 0, ops


def _masked_feeds(batch: int, seq: int, seed: int, left: bool = False) -> dict[str, np.ndarray]:
    """x spread so that the scores reach the hundreds; the second sequence half padded (on the
    left: its first queries see no key), the third padded entirely."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[1:2, slice(None, seq // 2) if left else slice(seq // 2, None)] = 0
    mask[2:3] = 0
    x = rng.standard_normal((batch, seq, 16)) * 6
    return {"x": x.astype(np.float32), "mask": mask}


def _optimized_matches_eager(module: Any, tmp_path: Path, left: bool = False) -> Counter[str]:
    """Export ``module`` (x [B, S, 16], an int64 mask [B, S]) with TorchScript and dynamic dims,
    optimize it validating on padded masks, check it against eager PyTorch: its op counts."""
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    path = tmp_path / "model.onnx"
    args = (torch.randn(2, 7, 16), torch.ones(2, 7, dtype=torch.int64))
    axes = {"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}}
    torch.onnx.export(module, args, str(path), input_names=["x", "mask"],
                      dynamic_axes=axes, dynamo=False)  # fmt: skip
    inputs = [_masked_feeds(b, s, i, left) for i, (b, s) in enumerate(((3, 5), (1, 1), (4, 9)))]
    result = onnxopt.optimize(path, inputs=inputs)
    assert result.report.validation is not None and result.report.validation.passed
    out = tmp_path / "model.opt.onnx"
    ir.save(result.model, out)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for feed in inputs:
        with torch.no_grad():
            eager = module(torch.from_numpy(feed["x"]), torch.from_numpy(feed["mask"])).numpy()
        np.testing.assert_allclose(session.run(None, feed)[0], eager, rtol=1e-4, atol=1e-4)
    return _ops(result.model)


@pytest.mark.parametrize(("unbiased", "norms"), [(False, 1), (True, 0)])
def test_hand_written_layer_norm_with_var_fuses_only_when_biased(
    unbiased: bool, norms: int, tmp_path: Path
) -> None:
    # The dynamo exporter writes x.var(-1, keepdim=True) as a keepdims=0 mean viewed back to
    # [b, s, 1]; with unbiased=True the variance is scaled by n / (n - 1): no LayerNormalization.
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Norm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(16) + 0.5)
            self.bias = torch.nn.Parameter(torch.rand(16) - 0.5)

        def forward(self, x):  # type: ignore[no-untyped-def]
            mean = x.mean(-1, keepdim=True)
            var = x.var(-1, keepdim=True, unbiased=unbiased)
            return (x - mean) / torch.sqrt(var + 1e-5) * self.weight + self.bias

    path = tmp_path / "norm.onnx"
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    program = torch.onnx.export(Norm().eval(), (torch.randn(2, 5, 16),), dynamo=True,
                                input_names=["x"], dynamic_shapes=({0: batch, 1: seq},))  # fmt: skip
    assert program is not None
    program.save(str(path))
    result = onnxopt.optimize(path)
    assert result.report.validation is not None and result.report.validation.passed
    assert _ops(result.model)["LayerNormalization"] == norms, _ops(result.model)
