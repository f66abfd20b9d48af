"""fuse-channel-first-attention: attention on [B, h, d, N] heads (YOLO12's area attention) into
MultiHeadAttention, checked on real PyTorch exports of a module written as Ultralytics' ``AAttn``
against ORT and eager PyTorch."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest

import onnxopt

pytestmark = pytest.mark.torch


def _area_attention(area: int, key_ratio: float = 1.0) -> Any:
    """Ultralytics' AAttn: a 1x1 Conv makes Q, K and V, the image is cut into ``area`` strips,
    each attended within (heads channels-first), plus a depthwise positional Conv of V.
    ``key_ratio`` < 1 narrows Q and K (as YOLO11's C2PSA does)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    channels, heads = 32, 2
    head = channels // heads
    key = int(head * key_ratio)

    class AreaAttention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Conv2d(channels, heads * (2 * key + head), 1)
            self.proj = torch.nn.Conv2d(channels, channels, 1)
            self.pe = torch.nn.Conv2d(channels, channels, 5, padding=2, groups=channels)

        def forward(self, x):  # type: ignore[no-untyped-def]
            b, c, h, w = x.shape
            n = h * w
            qkv = self.qkv(x).flatten(2).transpose(1, 2)
            if area > 1:
                qkv = qkv.reshape(b * area, n // area, qkv.shape[-1])
                b, n, _ = qkv.shape
            q, k, v = (
                qkv.view(b, n, heads, 2 * key + head)
                .permute(0, 2, 3, 1)
                .split([key, key, head], dim=2)
            )
            attn = (q.transpose(-2, -1) @ k) * (key**-0.5)
            attn = attn.softmax(dim=-1)
            y = (v @ attn.transpose(-2, -1)).permute(0, 3, 1, 2)
            v = v.permute(0, 3, 1, 2)
            if area > 1:
                y = y.reshape(b // area, n * area, c)
                v = v.reshape(b // area, n * area, c)
                b, n, _ = y.shape
            y = y.reshape(b, h, w, c).permute(0, 3, 1, 2)
            v = v.reshape(b, h, w, c).permute(0, 3, 1, 2)
            return self.proj(y + self.pe(v))

    return AreaAttention().eval()


def _export(module: Any, path: Path, dynamo: bool) -> np.ndarray:
    torch = pytest.importorskip("torch")
    example = torch.randn(1, 32, 8, 8)
    if dynamo:
        torch.onnx.export(module, (example,), str(path), input_names=["x"], dynamo=True)
    else:
        torch.onnx.export(module, (example,), str(path), input_names=["x"], dynamo=False)
    with torch.no_grad():
        return module(example).numpy()


def _ops(model: ir.Model) -> Counter[str]:
    return Counter(node.op_type for node in model.graph)


@pytest.mark.parametrize("area", [1, 4])
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_area_attention_becomes_multi_head_attention(area: int, dynamo: bool, tmp_path) -> None:
    path = tmp_path / "attn.onnx"
    eager = _export(_area_attention(area), path, dynamo)
    result = onnxopt.optimize(path)
    validation = result.report.validation
    assert validation is not None and validation.passed
    ops = _ops(result.model)
    assert ops["MultiHeadAttention"] == 1 and ops["Softmax"] == 0, ops
    assert ops["Split"] == 1, ops  # the positional Conv reads the new V: one Split left
    stats = next(r.stats for r in result.report.records if r.name == "fuse-channel-first-attention")
    assert stats == {"channel-first-attention->mha": 1}
    import onnxruntime as ort

    out = tmp_path / "out.onnx"
    ir.save(result.model, out)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, 32, 8, 8)).astype(np.float32)
    torch = pytest.importorskip("torch")
    with torch.no_grad():
        expected = _area_attention(area)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, atol=2e-5, rtol=1e-4)
    assert eager.shape == expected.shape
    again = onnxopt.optimize(result.model, check=False)
    assert (
        ir.to_proto(again.model).SerializeToString()
        == ir.to_proto(result.model).SerializeToString()
    )


def test_narrower_keys_are_left_and_explained(tmp_path) -> None:
    path = tmp_path / "attn.onnx"
    _export(_area_attention(1, key_ratio=0.5), path, dynamo=False)
    result = onnxopt.optimize(path, explain=True)
    assert _ops(result.model)["MultiHeadAttention"] == 0
    notes = [n for r in result.report.records for n in r.notes if "channel-first" in n]
    assert any("are 8, 8 and 16 wide, not equal" in n for n in notes), notes


def test_target_onnx_keeps_the_block(tmp_path) -> None:
    path = tmp_path / "attn.onnx"
    _export(_area_attention(4), path, dynamo=False)
    result = onnxopt.optimize(path, target="onnx")
    validation = result.report.validation
    assert validation is not None and validation.passed
    assert not any(node.domain == "com.microsoft" for node in result.model.graph)


_OPSET_12 = """
    <ir_version: 7, opset_import: ["" : 12]>
    g (float[2, 8, 2, 48] r) => (float[2, 8, 2, 16] y) {{
        t = Transpose<perm = [0, 2, 3, 1]>(r)
        q, k, v = Split<axis = 2, split = [16, 16, 16]>(t)
        qt = Transpose<perm = [0, 1, 3, 2]>(q)
        s = MatMul(qt, k)
        p = Softmax{axis}(s)
        pt = Transpose<perm = [0, 1, 3, 2]>(p)
        o = MatMul(v, pt)
        y = Transpose<perm = [0, 3, 1, 2]>(o)
    }}
"""


@pytest.mark.parametrize(("axis", "fused"), [("", 0), ("<axis = -1>", 1)], ids=["default", "last"])
def test_softmax_axis_defaults_to_1_below_opset_13(axis: str, fused: int) -> None:
    """Softmax-1/11 without an axis normalizes from axis 1 on, not over the keys."""
    import onnx.parser

    from onnxopt.io import model_from_proto

    model = model_from_proto(onnx.parser.parse_model(_OPSET_12.format(axis=axis)))
    result = onnxopt.optimize(model)
    validation = result.report.validation
    assert validation is not None and validation.passed
    assert _ops(result.model)["MultiHeadAttention"] == fused
