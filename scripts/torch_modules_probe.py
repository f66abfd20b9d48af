"""Torch-modules probe: models a user writes from torch's own modules and ops, through onnxopt.

Each model (nn.LSTM/GRU/RNN behind an Embedding, nn.Transformer* and nn.MultiheadAttention in
their flag combinations, F.scaled_dot_product_attention, hand-written attention, a TCN, a small
Conformer block, index/sort ops, norms and activations) is exported with both exporters
(``torch.onnx.export(dynamo=False)`` and ``dynamo=True``) with dynamic batch and sequence axes,
with seeded random weights; nothing is downloaded. Each export is one row of realworld_probe's
checks (optimize + validate, determinism, fixed point, ``--target onnx``, ``--explain``, bench for
the transformer ones), plus the fused contrib ops and the first ``--explain`` reasons.

    nice python scripts/torch_modules_probe.py [--only SUBSTRING] [--no-bench] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import math
import re
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # benchmarks.hand_written
import realworld_probe
from realworld_probe import COLUMNS, Form, _cli, _ops, probe

VOCAB = 50


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], tuple[Any, tuple[Any, ...]]]  # -> (module, example inputs)
    inputs: tuple[str, ...]
    dynamic: dict[str, dict[int, str]]  # input name -> {axis: dim name}
    bench: bool = False
    # bench at the example inputs' sizes (realworld_probe.BENCH_INPUTS) instead of bench's defaults
    bench_examples: bool = False


CASES: list[Case] = []
BS = {0: "batch", 1: "seq"}
SB = {0: "seq", 1: "batch"}


def case(
    name: str,
    inputs: tuple[str, ...],
    dynamic: dict[str, dict[int, str]],
    bench: bool = False,
    cases: list[Case] = CASES,
    bench_examples: bool = False,
) -> Callable[[Callable[[], tuple[Any, tuple[Any, ...]]]], None]:
    def register(make: Callable[[], tuple[Any, tuple[Any, ...]]]) -> None:
        cases.append(Case(name, make, inputs, dynamic, bench, bench_examples))

    return register


def _torch() -> Any:
    import torch

    torch.manual_seed(0)
    return torch


def _ids(torch: Any, batch: int = 2, seq: int = 7) -> Any:
    return torch.randint(0, VOCAB, (batch, seq))


def _padding(torch: Any, batch: int = 2, seq: int = 7) -> Any:
    pad = torch.zeros(batch, seq, dtype=torch.bool)
    pad[1, seq - 2 :] = True
    return pad


# ---------------------------------------------------------------- recurrent


def _recurrent(kind: str, layers: int, bidirectional: bool, batch_first: bool, state: bool) -> Any:
    torch = _torch()
    nn = torch.nn

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 16)
            extra = {"nonlinearity": "relu"} if kind == "RNN" else {}
            self.rnn = getattr(nn, kind)(
                16,
                24,
                num_layers=layers,
                bidirectional=bidirectional,
                batch_first=batch_first,
                **extra,
            )
            self.head = nn.Linear(24 * (2 if bidirectional else 1), 5)

        def forward(self, ids: Any, *h: Any) -> Any:
            x = self.embed(ids if batch_first else ids.transpose(0, 1))
            hidden = (h[0], h[1]) if kind == "LSTM" and h else (h[0] if h else None)
            y, _ = self.rnn(x, hidden)
            return self.head(y)

    ids = _ids(torch)
    args: tuple[Any, ...] = (ids,)
    if state:
        shape = (layers * (2 if bidirectional else 1), 2, 24)
        args += (torch.randn(shape),) * (2 if kind == "LSTM" else 1)
    return Model().eval(), args


for _kind, _layers, _bi, _bf, _state in (
    ("LSTM", 2, True, True, False),
    ("LSTM", 1, False, False, True),
    ("LSTM", 2, True, False, True),
    ("GRU", 2, True, True, True),
    ("GRU", 1, False, False, False),
    ("RNN", 1, True, True, False),
    ("RNN", 2, False, False, True),
):
    _state_names = (("h0", "c0") if _kind == "LSTM" else ("h0",)) if _state else ()
    case(
        f"{_kind.lower()} L{_layers}{' bi' if _bi else ''}"
        f" {'batch_first' if _bf else 'seq_first'}{' h0' if _state else ''}",
        ("ids", *_state_names),
        {"ids": dict(BS), **{n: {1: "batch"} for n in _state_names}},
    )(lambda k=_kind, n=_layers, b=_bi, f=_bf, s=_state: _recurrent(k, n, b, f, s))


# ---------------------------------------------------------------- transformer modules


def _encoder(norm_first: bool, activation: str, causal: bool, padded: bool, batch_first: bool):
    torch = _torch()
    nn = torch.nn

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 32)
            layer = nn.TransformerEncoderLayer(
                32, 4, 64, 0.0, activation, batch_first=batch_first, norm_first=norm_first
            )
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

        def forward(self, ids: Any, *pad: Any) -> Any:
            x = self.embed(ids if batch_first else ids.transpose(0, 1))
            seq = ids.shape[1]
            mask = nn.Transformer.generate_square_subsequent_mask(seq) if causal else None
            return self.encoder(
                x, mask=mask, src_key_padding_mask=pad[0] if pad else None, is_causal=causal
            )

    ids = _ids(torch)
    return Model().eval(), ((ids, _padding(torch)) if padded else (ids,))


for _nf, _act, _causal, _pad, _bf in (
    (False, "relu", False, True, True),
    (True, "gelu", False, True, True),
    (False, "gelu", True, False, True),
    (True, "relu", True, False, False),
    (False, "relu", False, True, False),
    (True, "gelu", False, False, True),
):
    case(
        f"encoder {'pre' if _nf else 'post'}-norm {_act}{' causal' if _causal else ''}"
        f"{' padmask' if _pad else ''} {'batch_first' if _bf else 'seq_first'}",
        ("ids", "pad") if _pad else ("ids",),
        {"ids": dict(BS), "pad": dict(BS)},
        bench=True,
    )(lambda a=_nf, b=_act, c=_causal, d=_pad, e=_bf: _encoder(a, b, c, d, e))


@case(
    "decoder causal + memory padmask",
    ("tgt", "memory", "pad"),
    {"tgt": BS, "memory": BS, "pad": BS},
    bench=True,
)
def _decoder() -> tuple[Any, tuple[Any, ...]]:
    torch = _torch()
    nn = torch.nn

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layer = nn.TransformerDecoderLayer(32, 4, 64, 0.0, "gelu", batch_first=True)
            self.decoder = nn.TransformerDecoder(layer, 2)

        def forward(self, tgt: Any, memory: Any, pad: Any) -> Any:
            mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
            return self.decoder(
                tgt, memory, tgt_mask=mask, memory_key_padding_mask=pad, tgt_is_causal=True
            )

    return Model().eval(), (torch.randn(2, 7, 32), torch.randn(2, 7, 32), _padding(torch))


@case(
    "nn.Transformer seq2seq",
    ("src", "tgt", "pad"),
    {"src": BS, "tgt": {0: "batch", 1: "tgt"}, "pad": BS},
    bench=True,
)
def _transformer() -> tuple[Any, tuple[Any, ...]]:
    torch = _torch()
    nn = torch.nn

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = nn.Transformer(32, 4, 1, 1, 64, 0.0, batch_first=True, norm_first=True)

        def forward(self, src: Any, tgt: Any, pad: Any) -> Any:
            mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
            return self.model(
                src, tgt, tgt_mask=mask, src_key_padding_mask=pad, memory_key_padding_mask=pad
            )

    return Model().eval(), (torch.randn(2, 7, 32), torch.randn(2, 5, 32), _padding(torch))


# ---------------------------------------------------------------- nn.MultiheadAttention


def _mha(batch_first: bool, mask: str, need_weights: bool, cross: bool, used: bool = True) -> Any:
    """``used=False``: the weights are computed (need_weights, the default) but not returned,
    ``y, _ = attn(q, k, v)``: torch then takes its bmm path, heads flattened into the batch."""
    torch = _torch()
    nn = torch.nn

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            kv = {"kdim": 24, "vdim": 20} if cross else {}
            self.attn = nn.MultiheadAttention(32, 4, batch_first=batch_first, **kv)

        def forward(self, x: Any, *extra: Any) -> Any:
            q = x if batch_first else x.transpose(0, 1)
            k, v = (extra[0], extra[1]) if cross else (q, q)
            if cross:
                extra = extra[2:]
                k, v = (k, v) if batch_first else (k.transpose(0, 1), v.transpose(0, 1))
            kwargs: dict[str, Any] = {"need_weights": need_weights}
            if mask == "padmask":
                kwargs["key_padding_mask"] = extra[0]
            elif mask == "float":
                kwargs["attn_mask"] = extra[0]
            elif mask == "bool":
                seq = x.shape[1]
                kwargs["attn_mask"] = torch.ones(seq, seq, dtype=torch.bool).triu(1)
            y, w = self.attn(q, k, v, **kwargs)
            return (y, w) if need_weights and used else y

    x = torch.randn(2, 7, 32)
    args: tuple[Any, ...] = (x,)
    if cross:
        args += (torch.randn(2, 7, 24), torch.randn(2, 7, 20))
    if mask == "padmask":
        args += (_padding(torch),)
    elif mask == "float":
        args += (torch.randn(7, 7),)
    return Model().eval(), args


for _bf, _mask, _nw, _cross, _used in (
    (True, "padmask", False, False, True),
    (False, "padmask", True, False, True),
    (True, "float", False, False, True),
    (True, "bool", False, False, True),
    (False, "none", False, True, True),
    (True, "padmask", True, True, True),
    (True, "padmask", True, False, False),
    (False, "float", True, False, False),
    (False, "none", True, True, False),
):
    _names = (
        "x",
        *(("k", "v") if _cross else ()),
        *(("m",) if _mask in ("padmask", "float") else ()),
    )
    case(
        f"mha {'batch_first' if _bf else 'seq_first'} {_mask}"
        f"{(' weights' if _used else ' weights unused') if _nw else ''}"
        f"{' kdim/vdim' if _cross else ''}",
        _names,
        {
            "x": dict(BS),
            "k": dict(BS),
            "v": dict(BS),
            "m": dict(BS) if _mask == "padmask" else {0: "seq", 1: "seq"},
        },
        bench=True,
    )(lambda a=_bf, b=_mask, c=_nw, d=_cross, e=_used: _mha(a, b, c, d, e))


# ---------------------------------------------------------------- SDPA and hand-written attention


def _sdpa(mode: str) -> Any:
    torch = _torch()
    nn = torch.nn
    F = torch.nn.functional

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            kv_heads = 2 if mode == "gqa" else 4
            self.q = nn.Linear(32, 32)
            self.kv = nn.Linear(32, 2 * 8 * kv_heads)
            self.o = nn.Linear(32, 32)
            self.kv_heads = kv_heads

        def forward(self, x: Any, *mask: Any) -> Any:
            b, s, _ = x.shape
            q = self.q(x).view(b, s, 4, 8).transpose(1, 2)
            if mode == "gqa":  # separate K and V projections of 2 heads each
                k, v = (t.view(b, s, 2, 8).transpose(1, 2) for t in self.kv(x).chunk(2, dim=-1))
            else:  # one K/V projection, its heads split in two
                k, v = self.kv(x).view(b, s, 2 * self.kv_heads, 8).transpose(1, 2).chunk(2, dim=1)
            if mode == "causal":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            elif mode == "gqa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            elif mode == "bool":
                keep = ~mask[0][:, None, None, :]
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
            else:
                bias = mask[0].float().masked_fill(mask[0], -1e4)[:, None, None, :]
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            return self.o(y.transpose(1, 2).reshape(b, s, 32))

    x = torch.randn(2, 7, 32)
    return Model().eval(), ((x,) if mode in ("causal", "gqa") else (x, _padding(torch)))


for _mode in ("causal", "gqa", "bool", "float"):
    case(
        f"sdpa {_mode}",
        ("x",) if _mode in ("causal", "gqa") else ("x", "pad"),
        {"x": dict(BS), "pad": dict(BS)},
        bench=True,
    )(lambda m=_mode: _sdpa(m))


def _hand_attention(einsum: bool, causal: bool, fill: float = float("-inf")) -> Any:
    torch = _torch()
    nn = torch.nn

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(32, 96)
            self.o = nn.Linear(32, 32)

        def forward(self, x: Any, pad: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)
            if einsum:
                scores = torch.einsum("bhsd,bhtd->bhst", q, k) / math.sqrt(8)
            else:
                scores = q @ k.transpose(-2, -1) / math.sqrt(8)
            masked = pad[:, None, None, :]
            if causal:
                masked = masked | torch.ones(s, s, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(masked, fill)
            p = scores.softmax(-1)
            y = torch.einsum("bhst,bhtd->bhsd", p, v) if einsum else p @ v
            return self.o(y.transpose(1, 2).reshape(b, s, 32))

    return Model().eval(), (torch.randn(2, 7, 32), _padding(torch))


for _einsum, _causal in ((False, False), (True, False), (False, True)):
    case(
        f"hand attention {'einsum' if _einsum else 'matmul'}{' causal' if _causal else ''}",
        ("x", "pad"),
        {"x": dict(BS), "pad": dict(BS)},
        bench=True,
    )(lambda e=_einsum, c=_causal: _hand_attention(e, c))
# the tutorials' masked_fill(mask, -1e9)
for _causal in (False, True):
    case(
        f"hand attention matmul{' causal' if _causal else ''} fill -1e9",
        ("x", "pad"),
        {"x": dict(BS), "pad": dict(BS)},
        bench=True,
    )(lambda c=_causal: _hand_attention(False, c, -1e9))


@case(
    "annotated transformer enc-dec fill -1e9",
    ("src", "tgt", "src_pad"),
    {"src": dict(BS), "tgt": {0: "batch", 1: "tgt_seq"}, "src_pad": dict(BS)},
    bench=True,
)
def _annotated_transformer() -> tuple[Any, tuple[Any, ...]]:
    """The Annotated Transformer as its tutorial writes it (benchmarks/hand_written.py)."""
    from benchmarks.hand_written import annotated_transformer_tiny

    module, inputs, _ = annotated_transformer_tiny()
    return module, tuple(inputs.values())


# ---------------------------------------------------------------- temporal convolutions


@case("tcn conv1d dilated causal", ("x",), {"x": {0: "batch", 2: "seq"}})
def _tcn() -> tuple[Any, tuple[Any, ...]]:
    torch = _torch()
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, channels: int, dilation: int) -> None:
            super().__init__()
            self.pad = (3 - 1) * dilation
            self.conv1 = nn.Conv1d(channels, channels, 3, dilation=dilation, padding=self.pad)
            self.conv2 = nn.Conv1d(channels, channels, 3, dilation=dilation, padding=self.pad)
            self.norm = nn.BatchNorm1d(channels)

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.norm(self.conv1(x)[..., : -self.pad]))
            y = torch.relu(self.conv2(y)[..., : -self.pad])
            return torch.relu(x + y)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Conv1d(4, 16, 1)
            self.blocks = nn.Sequential(*(Block(16, d) for d in (1, 2, 4)))
            self.out = nn.Conv1d(16, 3, 1)

        def forward(self, x: Any) -> Any:
            return self.out(self.blocks(self.inp(x)))

    model = Model().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
    return model, (torch.randn(2, 4, 20),)


@case("conformer block", ("x", "pad"), {"x": dict(BS), "pad": dict(BS)}, bench=True)
def _conformer() -> tuple[Any, tuple[Any, ...]]:
    torch = _torch()
    nn = torch.nn

    class FeedForward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.LayerNorm(32), nn.Linear(32, 64), nn.SiLU(), nn.Linear(64, 32)
            )

        def forward(self, x: Any) -> Any:
            return x + 0.5 * self.net(x)

    class ConvModule(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(32)
            self.pointwise1 = nn.Conv1d(32, 64, 1)
            self.depthwise = nn.Conv1d(32, 32, 7, padding=3, groups=32)
            self.bn = nn.BatchNorm1d(32)
            self.pointwise2 = nn.Conv1d(32, 32, 1)

        def forward(self, x: Any) -> Any:
            y = self.norm(x).transpose(1, 2)
            y = nn.functional.glu(self.pointwise1(y), dim=1)
            y = nn.functional.silu(self.bn(self.depthwise(y)))
            return x + self.pointwise2(y).transpose(1, 2)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ff1, self.ff2 = FeedForward(), FeedForward()
            self.norm_attn = nn.LayerNorm(32)
            self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
            self.conv = ConvModule()
            self.norm = nn.LayerNorm(32)

        def forward(self, x: Any, pad: Any) -> Any:
            x = self.ff1(x)
            y = self.norm_attn(x)
            x = x + self.attn(y, y, y, key_padding_mask=pad, need_weights=False)[0]
            x = self.conv(x)
            return self.norm(self.ff2(x))

    model = Model().eval()
    model.conv.bn.running_mean.uniform_(-1, 1)
    model.conv.bn.running_var.uniform_(0.5, 2)
    return model, (torch.randn(2, 7, 32), _padding(torch))


# ---------------------------------------------------------------- index, sort and scan ops


@case("ops cumsum/topk/argmax/sort/gather/scatter/index_select", ("x",), {"x": dict(BS)})
def _index_ops() -> tuple[Any, tuple[Any, ...]]:
    torch = _torch()
    nn = torch.nn

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(16, 16)
            self.register_buffer("pick", torch.tensor([0, 3, 5, 15]))

        def forward(self, x: Any) -> Any:
            h = self.proj(x)
            running = torch.cumsum(h, dim=1)
            values, where = torch.topk(h, 3, dim=-1)
            best = torch.argmax(h, dim=-1, keepdim=True)
            ordered, order = torch.sort(h, dim=-1, descending=True)
            gathered = torch.gather(h, -1, order[..., :2])
            scattered = torch.zeros_like(h).scatter(-1, where, values)
            picked = torch.index_select(h, -1, self.pick)
            return (
                running,
                values + gathered[..., :1],
                best,
                ordered[..., :4] * picked,
                scattered,
                torch.einsum("bsd,bte->bst", h, h),
            )

    return Model().eval(), (torch.randn(2, 7, 16),)


@case("ops nonzero/masked_select", ("x",), {"x": dict(BS)})
def _dynamic_ops() -> tuple[Any, tuple[Any, ...]]:
    torch = _torch()
    nn = torch.nn

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(16, 16)

        def forward(self, x: Any) -> Any:
            h = self.proj(x)
            positive = h > 0
            return torch.nonzero(positive), torch.masked_select(h, positive).sum(), h.relu()

    return Model().eval(), (torch.randn(2, 7, 16),)


# ---------------------------------------------------------------- norms and activations


@case("norms modules + by hand, activations", ("x",), {"x": dict(BS)})
def _norms() -> tuple[Any, tuple[Any, ...]]:
    torch = _torch()
    nn = torch.nn

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln = nn.LayerNorm(32)
            self.rms = nn.RMSNorm(32, eps=1e-6)
            self.w = nn.Parameter(torch.rand(32) + 0.5)
            self.b = nn.Parameter(torch.randn(32))
            self.lin = nn.ModuleList(nn.Linear(32, 32) for _ in range(6))

        def forward(self, x: Any) -> Any:
            x = self.lin[0](self.ln(x))
            x = nn.functional.gelu(x, approximate="tanh")
            x = self.lin[1](self.rms(x))
            x = nn.functional.silu(x)
            mean = x.mean(-1, keepdim=True)
            var = (x - mean).pow(2).mean(-1, keepdim=True)
            x = (x - mean) / torch.sqrt(var + 1e-5) * self.w + self.b
            x = nn.functional.mish(self.lin[2](x))
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
            x = nn.functional.hardswish(self.lin[3](x))
            x = nn.functional.gelu(self.lin[4](x))
            return self.lin[5](x)

    return Model().eval(), (torch.randn(2, 7, 32),)


# ---------------------------------------------------------------- export and run


def export(item: Case, dynamo: bool, target: Path) -> Path:
    import torch

    model, args = item.make()
    outputs = model(*args)
    if item.bench_examples:
        arrays = {name: arg.detach().numpy() for name, arg in zip(item.inputs, args, strict=True)}
        np.savez(target.with_suffix(realworld_probe.BENCH_INPUTS), **arrays)  # type: ignore[arg-type]
    count = len(outputs) if isinstance(outputs, tuple) else 1
    output_names = [f"out{i}" for i in range(count)]
    dynamic = {n: item.dynamic[n] for n in item.inputs if item.dynamic.get(n)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs: dict[str, Any] = {"dynamo": dynamo, "input_names": list(item.inputs)}
        kwargs["output_names"] = output_names
        if dynamo:
            dims: dict[str, Any] = {}
            shapes = [
                {a: dims.setdefault(d, torch.export.Dim(d)) for a, d in dynamic.get(n, {}).items()}
                for n in item.inputs
            ]
            kinds = [p.kind for p in inspect.signature(model.forward).parameters.values()]
            named = kinds.count(inspect.Parameter.POSITIONAL_OR_KEYWORD)
            # forward(x, *extra) called with extra inputs
            varargs = inspect.Parameter.VAR_POSITIONAL in kinds and len(shapes) > named
            kwargs["dynamic_shapes"] = (
                (*shapes[:named], tuple(shapes[named:])) if varargs else tuple(shapes)
            )
            kwargs["verbose"] = False
        else:
            kwargs["dynamic_axes"] = dynamic
        # TorchScript traces the module as called: under no_grad, nn.TransformerEncoderLayer takes
        # its fused fast path (aten::_transformer_encoder_layer_fwd), which it cannot export.
        with torch.no_grad() if dynamo else contextlib.nullcontext():
            try:
                torch.onnx.export(model, args, str(target), **kwargs)
            except Exception:
                if not dynamo:
                    raise
                # a named Dim torch.export cannot keep (it guards on a size): let it choose
                auto = torch.export.Dim.AUTO
                kwargs["dynamic_shapes"] = _map_dims(kwargs["dynamic_shapes"], auto)
                torch.onnx.export(model, args, str(target), **kwargs)
    return target


def _map_dims(shapes: Any, dim: Any) -> Any:
    if isinstance(shapes, dict):
        return dict.fromkeys(shapes, dim)
    return type(shapes)(_map_dims(s, dim) for s in shapes)


def _fused(work: Path) -> str:
    optimized = work / "out" / "a.onnx"
    if not optimized.exists():
        return ""
    ops = _ops(onnx.load(str(optimized), load_external_data=False))
    return ",".join(f"{op.split('::')[-1]}x{n}" for op, n in sorted(ops.items()) if "::" in op)


_EXPLAINED: list[str] = []


def _recording_cli(args: list[str], *rest: Any, **kwargs: Any) -> Any:
    """realworld_probe's CLI runner, keeping the output of the ``--explain`` run."""
    done = _cli(args, *rest, **kwargs)
    if "--explain" in args:
        _EXPLAINED[:] = (done.stderr or "").splitlines() + (done.stdout or "").splitlines()
    return done


realworld_probe._cli = _recording_cli


def _explained() -> list[str]:
    """The distinct reasons ``--explain`` gave for fusions not applied (node names elided)."""
    reasons = [
        re.sub(r"'[^']*'", "'…'", line.strip())
        for line in _EXPLAINED
        if re.match(r"\s+[\w,+-]+->[\w,+-]+: ", line)
    ]
    return list(dict.fromkeys(reasons))[:6]


def main() -> int:
    return run(CASES, __doc__.splitlines()[0], "tm_probe_")


def run(cases: list[Case], description: str, prefix: str) -> int:
    """Export each case with both exporters and probe it; one row per export (the CLI)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--only", default="", help="Run the models whose name contains this.")
    parser.add_argument("--exporter", choices=("both", "torchscript", "dynamo"), default="both")
    parser.add_argument("--no-bench", action="store_true", help="Skip `onnxopt bench`.")
    parser.add_argument("--keep", type=Path, help="Build in this folder and keep the files.")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix=prefix)) if args.keep is None else args.keep
    root.mkdir(parents=True, exist_ok=True)
    exporters = [e for e in ("torchscript", "dynamo") if args.exporter in ("both", e)]
    rows = []
    index = 0
    print(f"{'model':62} " + " ".join(f"{c:>9}" for c in COLUMNS), flush=True)
    for item in cases:
        if args.only.lower() not in item.name.lower():
            continue
        for exporter in exporters:
            work = root / f"case{index:02d}"
            index += 1
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()

            def build(_base: Path, folder: Path, it: Case = item, ex: str = exporter) -> Path:
                return export(it, ex == "dynamo", folder / "model.onnx")

            form = Form(f"{item.name} [{exporter}]", build, bench=item.bench)
            row = probe(form, root, work, bench=not args.no_bench)
            rows.append(row)
            cells = " ".join(f"{row.cells.get(c, '-'):>9}" for c in COLUMNS)
            print(
                f"{row.name[:62]:62} {cells} {row.seconds:5.0f}s  {'; '.join(row.problems) or 'ok'}",
                flush=True,
            )
            fused = _fused(work)
            model = work / "model.onnx"
            reasons = _explained() if model.exists() else []
            _EXPLAINED.clear()
            if fused or reasons:
                print(f"    fused: {fused or '-'}", flush=True)
            for reason in reasons:
                print(f"    not fused: {reason[:150]}", flush=True)
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{sum(r.ok for r in rows)}/{len(rows)} exports ok")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
