"""FuseAttentionPass on the fairseq-style bmm attention (XGLM, FSMT, LED, TrOCR, SpeechT5 today;
BART, Marian, OPT and Whisper as exported by older transformers releases).

The scores are computed on [B*H, S, d] heads, viewed as [B, H, S, T] for the mask, clamped from
below at float32's lowest (``torch.max(scores + mask, finfo.min)``), viewed back as [B*H, S, T]
for the Softmax, and (XGLM) the probabilities viewed as [B, H, S, T] and back before ``@ V3``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest
from test_fuse_flat_heads_attention import LOWEST, D, _weights

from onnxopt.passes.fuse_attention import FuseAttentionPass
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.passes.options import PassOptions
from onnxopt.validate import validate


def _model(
    *, floor: str | None = LOWEST, round_trip: bool = True, masked: bool = True, opset: int = 17
) -> ir.Model:
    """x [B, S, 8] and a [B, S] padding mask -> one block of 2 heads of 4 in XGLM's form.
    ``floor``: the clamp's constant (None: no clamp); ``round_trip``: P viewed as [B, H, S, T]
    and back before P@V; ``masked=False``: no mask, no views, Softmax(Q3 @ K3^T) @ V3 (the
    older Whisper encoder; the mask input stays, unread)."""
    clamp = "clamped = Max(masked, floor)" if floor is not None else "clamped = Identity(masked)"
    probs = (
        "p4 = Reshape(p3, view)\n            pf = Reshape(p4, flat_p)"
        if round_trip
        else "pf = Identity(p3)"
    )
    # the mask added to the [B, H, S, T] view, clamped, viewed back as [B*H, S, T]
    masking = """view = Concat<axis=0>(b, two1, s, minus1)
            scores4 = Reshape(raw, view)
            mbool = Cast<to=9>(mask)
            mb = Unsqueeze(mbool, mask_axes)
            pad = Where(mb, zero, lowest)
            masked = Add(scores4, pad)
            {clamp}
            flat_p = Concat<axis=0>(bh, s, minus1)
            flat_scores = Reshape(clamped, flat_p)"""
    scores_view = masking.replace("{clamp}", clamp) if masked else ""
    text = f"""
        <ir_version: 9, opset_import: ["" : {opset}]>
        agraph (float[B, S, 8] x, int64[B, S] mask) => (float[B, S, 8] y) <
            float[BH, S, 4] q3, float[BH, S, 4] k3, float[BH, S, 4] v3,
            float[BH, 4, S] kt3, float[BH, S, S] raw, float[B, 2, S, S] scores4,
            float[B, 2, S, S] masked, float[B, 2, S, S] clamped, float[BH, S, S] flat_scores,
            float[BH, S, S] p3, float[BH, S, S] pf, float[BH, S, 4] pv3, float[B, 2, S, 4] pv4,
            {_weights()},
            int64[4] heads = {{0, 0, 2, 4}},
            int64[3] merged = {{0, 0, 8}},
            int64[2] mask_axes = {{1, 2}},
            int64[1] two1 = {{2}},
            int64[1] four1 = {{4}},
            int64[1] minus1 = {{-1}},
            float half = {{0.5}},
            float zero = {{0.0}},
            float lowest = {{{LOWEST}}},
            float floor = {{{floor if floor is not None else 0.0}}}
        > {{
            q = MatMul(x, wq)
            qs = Mul(q, half)
            k = MatMul(x, wk)
            v = MatMul(x, wv)
            qr = Reshape(qs, heads)
            q4 = Transpose<perm=[0,2,1,3]>(qr)
            kr = Reshape(k, heads)
            k4 = Transpose<perm=[0,2,1,3]>(kr)
            vr = Reshape(v, heads)
            v4 = Transpose<perm=[0,2,1,3]>(vr)
            b = Shape<start=0, end=1>(x)
            s = Shape<start=1, end=2>(x)
            bh = Mul(b, two1)
            flat = Concat<axis=0>(bh, s, four1)
            q3 = Reshape(q4, flat)
            k3 = Reshape(k4, flat)
            v3 = Reshape(v4, flat)
            kt3 = Transpose<perm=[0,2,1]>(k3)
            raw = MatMul(q3, kt3)
            {scores_view}
            p3 = Softmax<axis=-1>({"flat_scores" if masked else "raw"})
            {probs}
            pv3 = MatMul(pf, v3)
            heads4 = Concat<axis=0>(b, two1, s, four1)
            pv4 = Reshape(pv3, heads4)
            pt = Transpose<perm=[0,2,1,3]>(pv4)
            y = Reshape(pt, merged)
        }}
    """
    proto = onnx.parser.parse_model(text)
    onnx.checker.check_model(proto)
    model = ir.serde.deserialize_model(proto)
    # The Identity placeholders stand for "no such node": bypass them as the cleanup passes would.
    for node in list(model.graph):
        if node.op_type == "Identity":
            source, result = node.inputs[0], node.outputs[0]
            assert source is not None
            result.replace_all_uses_with(source)
            model.graph.remove(node, safe=True)
    InferShapesPass()(model)
    return model


def _feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    """Row 1 fully padded (every key masked: the clamp's uniform row), row 2 right-padded."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), dtype=np.int64)
    if batch > 1:
        mask[1, :] = 0
    if batch > 2:
        mask[2, (seq + 1) // 2 :] = 0
    return {"x": rng.standard_normal((batch, seq, D)).astype(np.float32), "mask": mask}


FEEDS = [_feeds(b, s, i) for i, (b, s) in enumerate(((3, 5), (1, 1), (4, 7)))]


@pytest.mark.parametrize(("floor", "round_trip"), [(LOWEST, True), (LOWEST, False), (None, True)])
def test_fairseq_block_fuses_into_multi_head_attention(floor: str | None, round_trip: bool) -> None:
    model = _model(floor=floor, round_trip=round_trip)
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(explain=True))(fused)
    assert result.stats == {"attention->mha": 1}, result.notes
    types = [node.op_type for node in fused.graph]
    assert "Softmax" not in types and types.count("MultiHeadAttention") == 1
    assert types.count("MatMul") == 3  # the projections only
    # the clamp moved onto the mask: one Max, of the [B, 1, 1, T] mask, not of the scores
    assert types.count("Max") == (floor is not None)
    report = validate(model, fused, inputs=FEEDS)
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


def test_a_block_wholly_on_flattened_heads_fuses() -> None:
    model = _model(masked=False, round_trip=False)
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(explain=True))(fused)
    assert result.stats == {"attention->mha": 1}, result.notes
    types = [node.op_type for node in fused.graph]
    assert "Softmax" not in types and types.count("MatMul") == 3
    assert not any(
        node.op_type == "MultiHeadAttention" and len(node.inputs) > 3 for node in fused.graph
    )
    report = validate(model, fused, inputs=FEEDS)
    assert report.passed, report
    assert not FuseAttentionPass()(fused).modified


def test_fairseq_block_fuses_into_onnx_attention() -> None:
    model = _model(opset=23)
    fused = model.clone()
    result = FuseAttentionPass(PassOptions(target="onnx", explain=True))(fused)
    assert result.stats == {"attention->onnx-attention": 1}, result.notes
    types = [node.op_type for node in fused.graph]
    assert types.count("Attention") == 1
    assert types.count("Max") == 1  # the mask floor alone: the clamp's Max is implied by it
    report = validate(model, fused, inputs=FEEDS)
    assert report.passed, report


def test_a_clamp_above_the_mask_floor_is_refused() -> None:
    # Max(x, -1e4) also raises kept scores below -1e4: not the mask's clamp.
    result = FuseAttentionPass(PassOptions(explain=True))(_model(floor="-10000.0"))
    assert not result.modified
    assert any("clamped from below at -10000" in note for note in result.notes), result.notes


# ------------------------------------------------------------------ a real export of the form


def _fairseq_attention_model(masked: bool, clamp: bool):  # type: ignore[no-untyped-def]
    """Two post-LN layers of transformers' old BartAttention / WhisperAttention, written out."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Layer(nn.Module):
        def __init__(self, width: int = 32, heads: int = 4) -> None:
            super().__init__()
            self.heads, self.size = heads, width // heads
            self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
            self.norm = nn.LayerNorm(width)

        def _heads(self, t, b):  # type: ignore[no-untyped-def]
            # [B, S, D] -> [B, H, S, d] -> [B*H, S, d]
            t = t.view(b, -1, self.heads, self.size).transpose(1, 2).contiguous()
            return t.view(b * self.heads, -1, self.size)

        def forward(self, x, mask):  # type: ignore[no-untyped-def]
            b, s, _ = x.shape
            q = self._heads(self.q(x) * self.size**-0.5, b)
            k, v = self._heads(self.k(x), b), self._heads(self.v(x), b)
            t = k.size(1)
            w = torch.bmm(q, k.transpose(1, 2))
            if masked:
                lowest = torch.finfo(x.dtype).min
                w = w.view(b, self.heads, s, t) + (1.0 - mask[:, None, None, :].float()) * lowest
                if clamp:
                    w = torch.max(w, torch.tensor(lowest))
                w = w.view(b * self.heads, s, t)
            out = torch.bmm(nn.functional.softmax(w, dim=-1), v)
            out = out.view(b, self.heads, s, self.size).transpose(1, 2).reshape(b, s, -1)
            return self.norm(x + self.o(out))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(2))

        def forward(self, x, mask):  # type: ignore[no-untyped-def]
            for layer in self.layers:
                x = layer(x, mask)
            return x

    torch.manual_seed(0)
    return Model().eval()


@pytest.mark.torch
@pytest.mark.parametrize(
    ("masked", "clamp", "dynamo"),
    [
        (True, True, False),
        (False, False, False),
        pytest.param(True, True, True, marks=pytest.mark.slow),
        pytest.param(True, False, True, marks=pytest.mark.slow),
    ],
)
def test_exported_fairseq_attention_fuses(
    tmp_path: Path, masked: bool, clamp: bool, dynamo: bool
) -> None:
    torch = pytest.importorskip("torch")
    from onnxopt.api import optimize

    model = _fairseq_attention_model(masked, clamp)
    path = tmp_path / "fairseq.onnx"
    args = (torch.randn(2, 7, 32), torch.ones(2, 7, dtype=torch.int64))
    names = {"input_names": ["x", "mask"], "output_names": ["y"]}
    if dynamo:
        dims = {0: "batch", 1: "seq"}
        torch.onnx.export(model, args, str(path), dynamo=True, dynamic_shapes=(dims, dims), **names)
    else:
        axes = {"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}}
        torch.onnx.export(model, args, str(path), dynamo=False, dynamic_axes=axes, **names)
    taken = {i.name for i in onnx.load(path).graph.input}  # TorchScript drops an unread mask
    padded = []
    for i, (batch, seq) in enumerate(((1, 1), (3, 5), (4, 9))):
        feeds = _feeds(batch, seq, i)
        feeds["x"] = np.tile(feeds["x"], (1, 1, 4))  # width 32
        padded.append({name: array for name, array in feeds.items() if name in taken})
    result = optimize(path, inputs=padded)
    assert result.validated, result.report.validation
    ops = result.report.after.op_counts
    assert "Softmax" not in ops
    fused = ops.get("com.microsoft::Attention", 0) + ops.get("com.microsoft::MultiHeadAttention", 0)
    assert fused == 2, ops
