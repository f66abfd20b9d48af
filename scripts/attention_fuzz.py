"""Attention fuzz: random hand-written attention blocks, exported and optimized, checked on ORT.

The attention rewrites are where a wrong output would hide: each block here is drawn from the
ways people write attention in PyTorch (seeded, so a seed is a reproducer):

- projections: three Linears, one merged Linear split or chunked, with or without biases;
- heads: ``view + transpose``, ``reshape + permute``, or einsum; grouped-query (fewer K/V heads,
  ``repeat_interleave`` or ``expand + reshape``); rotate-half rotary on Q and K;
- scale: on Q, on K, on the scores (``/ sqrt(d)`` or ``* d**-0.5``), or SDPA's own (with or
  without ``scale=``);
- mask: none, causal (``masked_fill`` with -inf or the dtype's min, a bool ``tril``, SDPA's
  ``is_causal``), a padding mask input (additive ``(1 - m) * min``, or bool), or both;
- softmax: over -1 or 3, optionally in float32 with the casts around it;
- output: ``transpose + reshape`` or ``permute + contiguous + view``, an output Linear, pre- or
  post-norm residual, an optional MLP with Gelu.

Each block is exported with a dynamic batch and sequence (TorchScript or dynamo, drawn), optimized
with the Python API at the default level, validated against the export at several sizes (and on
given inputs with a left-padded row and, where the mask allows it, a row of padding alone), and
compared with eager PyTorch at a size other than the export's. A row per seed: ``ok`` (with the
fused ops), ``FAIL`` (validation or eager comparison; the seed's text says which), ``ERROR`` (an
exception inside onnxopt), ``skip`` (the exporter failed, not onnxopt's bug).

    nice python scripts/attention_fuzz.py [--seeds 0:200] [--exporter torchscript|dynamo]
        [--keep DIR] [--show SEED]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import math
import random
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FUSED = (
    "Attention",
    "MultiHeadAttention",
    "GroupQueryAttention",
    "RotaryEmbedding",
    "LayerNormalization",
    "SkipLayerNormalization",
    "Gelu",
    "BiasGelu",
)


@dataclass(frozen=True)
class Config:
    seed: int
    exporter: str
    hidden: int
    heads: int
    kv_heads: int
    projection: str  # "three", "merged-split", "merged-chunk"
    bias: bool
    split_heads: str  # "view-transpose", "reshape-permute", "einsum"
    repeat_kv: str  # "interleave", "expand"
    rotary: bool
    scale: str  # "q", "k", "div", "mul", "sdpa", "sdpa-scale"
    mask: str  # "none", "causal-inf", "causal-min", "causal-bool", "is-causal", "pad-add", "pad-bool", "both"
    softmax_dim: int  # -1 or 3
    softmax_fp32: bool
    merge_heads: str  # "transpose-reshape", "permute-view"
    norm: str  # "none", "pre", "post"
    mlp: bool

    @property
    def sdpa(self) -> bool:
        return self.scale.startswith("sdpa") or self.mask == "is-causal"

    @property
    def padded(self) -> bool:
        return self.mask in ("pad-add", "pad-bool", "both")


def draw(seed: int, exporter: str | None = None) -> Config:
    rng = random.Random(seed)
    heads = rng.choice([1, 2, 4])
    head_dim = rng.choice([4, 8, 16])
    kv_heads = rng.choice([h for h in (1, 2, heads) if heads % h == 0])
    scale = rng.choice(["q", "k", "div", "mul", "sdpa", "sdpa-scale"])
    masks = ["none", "causal-inf", "causal-min", "causal-bool", "pad-add", "pad-bool", "both"]
    if scale.startswith("sdpa"):
        masks.append("is-causal")
    return Config(
        seed=seed,
        exporter=exporter or rng.choice(["torchscript", "dynamo"]),
        hidden=heads * head_dim,
        heads=heads,
        kv_heads=kv_heads,
        projection=rng.choice(["three", "three", "merged-split", "merged-chunk"]),
        bias=rng.random() < 0.7,
        split_heads=rng.choice(["view-transpose", "view-transpose", "reshape-permute", "einsum"]),
        repeat_kv=rng.choice(["interleave", "expand"]),
        rotary=rng.random() < 0.3,
        scale=scale,
        mask=rng.choice(masks),
        softmax_dim=rng.choice([-1, 3]),
        softmax_fp32=rng.random() < 0.2,
        merge_heads=rng.choice(["transpose-reshape", "permute-view"]),
        norm=rng.choice(["none", "pre", "post"]),
        mlp=rng.random() < 0.3,
    )


def build(config: Config) -> tuple[Any, dict[str, Any], dict[str, dict[int, str]]]:
    """The module, its example inputs (by name) and their dynamic axes."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(config.seed)
    c = config
    d = c.hidden // c.heads
    kv_width = c.kv_heads * d

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            if c.projection == "three":
                self.q = nn.Linear(c.hidden, c.hidden, bias=c.bias)
                self.k = nn.Linear(c.hidden, kv_width, bias=c.bias)
                self.v = nn.Linear(c.hidden, kv_width, bias=c.bias)
            else:
                self.qkv = nn.Linear(c.hidden, c.hidden + 2 * kv_width, bias=c.bias)
            self.o = nn.Linear(c.hidden, c.hidden, bias=c.bias)
            self.norm = nn.LayerNorm(c.hidden)
            with torch.no_grad():  # not the identity a fresh LayerNorm is
                self.norm.weight.uniform_(0.5, 1.5)
                self.norm.bias.uniform_(-0.5, 0.5)
            self.up = nn.Linear(c.hidden, 2 * c.hidden)
            self.down = nn.Linear(2 * c.hidden, c.hidden)
            inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
            self.register_buffer("inv_freq", inv, persistent=False)

        def heads(self, t: Any, n: int) -> Any:
            b, s = t.shape[0], t.shape[1]
            if c.split_heads == "view-transpose":
                return t.view(b, s, n, d).transpose(1, 2)
            if c.split_heads == "reshape-permute":
                return t.reshape(b, s, n, d).permute(0, 2, 1, 3)
            return torch.einsum("bshd->bhsd", t.reshape(b, s, n, d))

        def rotate(self, t: Any) -> Any:
            s = t.shape[2]
            pos = torch.arange(s, dtype=torch.float32, device=t.device)
            freqs = torch.outer(pos, self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            half = t.shape[-1] // 2
            rotated = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
            return t * emb.cos() + rotated * emb.sin()

        def repeat(self, t: Any) -> Any:
            groups = c.heads // c.kv_heads
            if groups == 1:
                return t
            if c.repeat_kv == "interleave":
                return t.repeat_interleave(groups, dim=1)
            b, h, s, hd = t.shape
            return t[:, :, None].expand(b, h, groups, s, hd).reshape(b, h * groups, s, hd)

        def attention(self, x: Any, mask: Any | None) -> Any:
            b, s = x.shape[0], x.shape[1]
            if c.projection == "three":
                q, k, v = self.q(x), self.k(x), self.v(x)
            elif c.projection == "merged-split":
                q, k, v = self.qkv(x).split([c.hidden, kv_width, kv_width], dim=-1)
            else:
                q, k, v = (
                    self.qkv(x).chunk(3, dim=-1)
                    if kv_width == c.hidden
                    else self.qkv(x).split([c.hidden, kv_width, kv_width], dim=-1)
                )
            q, k, v = self.heads(q, c.heads), self.heads(k, c.kv_heads), self.heads(v, c.kv_heads)
            if c.rotary:
                q, k = self.rotate(q), self.rotate(k)
            k, v = self.repeat(k), self.repeat(v)
            bias = None
            neg = torch.finfo(x.dtype).min
            if c.mask in ("pad-add", "both"):
                bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * neg
            if c.mask == "pad-bool":
                bias = mask[:, None, None, :].bool()
            if c.mask in ("causal-inf", "causal-min", "causal-bool", "both"):
                upper = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
                if c.mask == "causal-bool":
                    causal = ~upper
                else:
                    fill = float("-inf") if c.mask == "causal-inf" else neg
                    causal = torch.zeros(s, s, dtype=x.dtype).masked_fill(upper, fill)
                bias = causal if bias is None else bias + causal
            if c.sdpa:
                extra = {"scale": 1.0 / math.sqrt(d)} if c.scale == "sdpa-scale" else {}
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=bias, is_causal=c.mask == "is-causal", **extra
                )
            else:
                if c.scale == "q":
                    q = q * d**-0.5
                if c.scale == "k":
                    k = k / math.sqrt(d)
                scores = q @ k.transpose(-2, -1)
                if c.scale == "div":
                    scores = scores / math.sqrt(d)
                if c.scale == "mul":
                    scores = scores * d**-0.5
                if bias is not None and bias.dtype == torch.bool:
                    scores = scores.masked_fill(~bias, float("-inf"))
                elif bias is not None:
                    scores = scores + bias
                if c.softmax_fp32:
                    probs = F.softmax(scores.float(), dim=c.softmax_dim).to(q.dtype)
                else:
                    probs = F.softmax(scores, dim=c.softmax_dim)
                out = probs @ v
            if c.merge_heads == "transpose-reshape":
                out = out.transpose(1, 2).reshape(b, s, c.hidden)
            else:
                out = out.permute(0, 2, 1, 3).contiguous().view(b, s, c.hidden)
            return self.o(out)

        def forward(self, x: Any, mask: Any | None = None) -> Any:
            if c.norm == "pre":
                x = x + self.attention(self.norm(x), mask)
            elif c.norm == "post":
                x = self.norm(x + self.attention(x, mask))
            else:
                x = self.attention(x, mask)
            if c.mlp:
                x = x + self.down(F.gelu(self.up(x)))
            return x

    x = torch.randn(2, 7, c.hidden)
    inputs: dict[str, Any] = {"x": x}
    axes: dict[str, dict[int, str]] = {"x": {0: "batch", 1: "seq"}}
    if c.padded:
        mask = torch.ones(2, 7, dtype=torch.int64)
        mask[1, :2] = 0  # left padding
        inputs["attention_mask"] = mask
        axes["attention_mask"] = {0: "batch", 1: "seq"}
    return Block().eval(), inputs, axes


def export(config: Config, module: Any, inputs: dict[str, Any], axes: dict, path: Path) -> None:
    """With ``onnxopt export``'s own exporter calls (TorchScript at opset 17, dynamo at its default)."""
    from onnxopt.export import Exportable, _export_dynamo, _export_torchscript

    model = Exportable(f"attention seed {config.seed}", module, inputs, axes)
    run, opset = (
        (_export_torchscript, 17) if config.exporter == "torchscript" else (_export_dynamo, None)
    )
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        run(model, path, ["y"], opset, True, False)


def given_inputs(config: Config, hidden: int) -> list[dict[str, np.ndarray]]:
    """Inputs the generated ones would not hold: a left-padded and a right-padded row, and a row
    of padding alone (where the mask is additive with a finite minimum, whose result is defined)."""
    rng = np.random.default_rng(config.seed)
    if not config.padded:
        return [{"x": rng.standard_normal((3, 9, hidden)).astype(np.float32)}]
    mask = np.ones((3, 9), dtype=np.int64)
    mask[0, :4] = 0
    mask[1, 6:] = 0
    if config.mask == "pad-add":
        mask[2, :] = 0
    return [{"x": rng.standard_normal((3, 9, hidden)).astype(np.float32), "attention_mask": mask}]


def check(config: Config, folder: Path) -> tuple[str, str]:
    """(status, detail) for one seed."""
    import torch

    import onnxopt
    from onnxopt.io import save_model

    try:
        module, inputs, axes = build(config)
        path = folder / f"attn{config.seed}.onnx"
        export(config, module, inputs, axes, path)
    except Exception as exc:
        return "skip", f"export: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    given = given_inputs(config, config.hidden)
    try:
        result = onnxopt.optimize(path, inputs=given)
    except onnxopt.validate.CannotValidate as exc:
        return "skip", f"cannot validate: {exc}"
    except Exception:
        return "ERROR", traceback.format_exc(limit=-3).strip().splitlines()[-1][:300]
    validation = result.report.validation
    assert validation is not None
    ops = result.report.after.op_counts
    fused = " ".join(
        f"{op.split('::')[-1]}×{n}" for op, n in sorted(ops.items()) if op.split("::")[-1] in FUSED
    )
    if not validation.passed:
        return "FAIL", f"validation: {validation.failing_outputs()} {validation.errors} [{fused}]"
    # against eager PyTorch on the given inputs (not the export's size)
    import onnxruntime as ort

    feeds = given[0]
    with torch.no_grad():
        want = module(*(torch.from_numpy(feeds[name]) for name in inputs)).numpy()
    optimized = folder / f"opt{config.seed}.onnx"
    save_model(result.model, optimized)
    session = ort.InferenceSession(str(optimized), providers=["CPUExecutionProvider"])
    got = session.run(None, feeds)[0]
    finite = np.isfinite(want)
    if not np.array_equal(finite, np.isfinite(got)):
        return "FAIL", f"eager: NaN/inf at other places [{fused}]"
    error = float(np.max(np.abs(got[finite] - want[finite]), initial=0.0))
    if error > 1e-3:
        return "FAIL", f"eager: max abs {error:.2e} [{fused}]"
    nodes = f"{result.report.before.nodes}->{result.report.after.nodes}"
    attention = any(op.endswith("Attention") for op in ops)
    return "ok", f"{nodes} [{fused}]{'' if attention else ' attention not fused'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0:100", help="FIRST:END, end excluded")
    parser.add_argument("--exporter", choices=["torchscript", "dynamo"])
    parser.add_argument("--keep", type=Path, help="keep the exported and optimized models here")
    parser.add_argument("--show", type=int, help="print one seed's configuration and exit")
    args = parser.parse_args()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    if args.show is not None:
        print(draw(args.show, args.exporter))
        return 0
    first, end = (int(part) for part in args.seeds.split(":"))
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for seed in range(first, end):
            config = draw(seed, args.exporter)
            started = time.perf_counter()
            status, detail = check(config, folder)
            counts[status] = counts.get(status, 0) + 1
            took = time.perf_counter() - started
            print(f"{seed:6d} {status:5s} {config.exporter:11s} {took:5.1f}s {detail}", flush=True)
            if status in ("FAIL", "ERROR"):
                print(f"       {config}", flush=True)
    print(" ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return 1 if counts.get("FAIL") or counts.get("ERROR") else 0


if __name__ == "__main__":
    sys.exit(main())
