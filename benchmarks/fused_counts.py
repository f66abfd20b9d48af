"""Nodes before/after -O2 and the fused attention / rotary ops, for ONNX files, by the onnxopt found on
PYTHONPATH: run it once per source tree to compare two trees on the same exports (no validation).

    PYTHONPATH=/path/to/main python benchmarks/fused_counts.py DIR/*.onnx [--target onnx --opset 23]
    PYTHONPATH=. python benchmarks/fused_counts.py DIR/*.onnx [--target onnx --opset 23]

(arch_sweep.py --out DIR leaves its exports in DIR.)
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

FUSED = {
    "Attention": "attn",
    "MultiHeadAttention": "mha",
    "GroupQueryAttention": "gqa",
    "RotaryEmbedding": "rotary",
}


def main() -> None:
    from onnxopt import api

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--target", default="ort", choices=("ort", "onnx"))
    parser.add_argument("--opset", type=int, default=None)
    args = parser.parse_args()
    print("| model | nodes | fused |")
    print("|---|---:|---|")
    for path in args.models:
        result = api.optimize(path, check=False, target=args.target, opset=args.opset)
        counts = Counter(node.op_type for node in result.model.graph)
        fused = " ".join(f"{label} {counts[op]}" for op, label in FUSED.items() if counts[op])
        before, after = result.report.before.nodes, result.report.after.nodes
        print(f"| {path.name} | {before} → {after} | {fused or '-'} |", flush=True)


if __name__ == "__main__":
    main()
