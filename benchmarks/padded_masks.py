"""Validate optimized text models on padded attention masks (ORT, graph optimizations off).

``onnxopt optimize`` validates on generated inputs; an attention fusion's riskiest rows are the
padded ones: right padding, left padding, and a sequence whose every position is padding (a fully
masked row, where SDPA's guard, GroupQueryAttention's causal fix-up or the mask floor decide the
result). For each model given, this optimizes it (-O2, --target ort unless --target says
otherwise), then compares original and optimized on token ids with such masks, at several batch
sizes and sequence lengths, and prints one markdown row per model:

    PYTHONPATH=. python benchmarks/padded_masks.py MODEL.onnx [...] [--target onnx --opset 23]

The models take ``input_ids`` and ``attention_mask`` [batch, sequence], and maybe token_type_ids
(the sweep's text exports: ``benchmarks/arch_sweep.py --out DIR`` leaves them in DIR; tf2onnx's
conversions, ``scripts/export_tf_models.py``).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's onnxopt

SIZES = ((1, 1), (2, 5), (3, 16), (4, 9))
FUSED = ("MultiHeadAttention", "GroupQueryAttention", "Attention")


def padded_feeds(
    batch: int,
    seq: int,
    seed: int,
    types: dict[str, np.dtype] | None = None,
    vocab: int = 1000,
) -> dict[str, np.ndarray]:
    """Row 0 full, row 1 right-padded, row 2 left-padded, row 3 all padding; each input in the
    model's own integer type (``types``; int64 when not given, tf2onnx's are int32),
    token_type_ids (when taken) all 0, token ids below ``vocab``."""
    rng = np.random.default_rng(seed)
    types = types or {n: np.dtype(np.int64) for n in ("input_ids", "attention_mask")}
    mask = np.ones((batch, seq), dtype=types["attention_mask"])
    if batch > 1:
        mask[1, (seq + 1) // 2 :] = 0
    if batch > 2:
        mask[2, : seq // 2] = 0
    if batch > 3:
        mask[3, :] = 0
    feeds = {
        "input_ids": rng.integers(0, vocab, (batch, seq)).astype(types["input_ids"]),
        "attention_mask": mask,
    }
    if "token_type_ids" in types:
        feeds["token_type_ids"] = np.zeros((batch, seq), dtype=types["token_type_ids"])
    return feeds


def _input_types(model: object) -> tuple[dict[str, np.dtype], int]:
    """Each input's dtype, and how many token ids the model's embedding table holds."""
    from onnxopt.validate import input_specs

    specs = input_specs(model)  # type: ignore[arg-type]
    vocab = next((s.int_high for s in specs if s.name == "input_ids" and s.int_high), 1000)
    return {s.name: s.dtype for s in specs}, vocab


def main() -> None:
    from onnxopt import api
    from onnxopt.validate import validate

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--target", default="ort", choices=("ort", "onnx"))
    parser.add_argument(
        "--opset", type=int, default=None, help="raise the opset first (23: ONNX Attention)"
    )
    args = parser.parse_args()
    print("| model | fused | sizes (batch x seq) | max abs | passed |")
    print("|---|---|---|---:|---|")
    for path in args.models:
        result = api.optimize(path, check=False, target=args.target, opset=args.opset)
        counts = Counter(node.op_type for node in result.model.graph)
        fused = ", ".join(f"{op} {counts[op]}" for op in FUSED if counts[op]) or "-"
        types, vocab = _input_types(result.model)
        feeds = [padded_feeds(b, s, seed, types, vocab) for seed, (b, s) in enumerate(SIZES)]
        report = validate(path, result.model, inputs=feeds)
        worst = max((o.max_abs for o in report.outputs), default=0.0)
        sizes = ", ".join(f"{b}x{s}" for b, s in SIZES)
        print(f"| {path.name} | {fused} | {sizes} | {worst:.1e} | {report.passed} |", flush=True)


if __name__ == "__main__":
    main()
