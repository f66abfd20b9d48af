"""Node counts and validation of the zoo's transformer exports with and without fuse-packed-attention.

    nice python benchmarks/packed_attention_zoo.py ZOO_DIR [--models bert,vit] [--no-validate]

For each ``ZOO_DIR/{model}.{torchscript,dynamo}.onnx``: `onnxopt optimize` at -O2 (target ort) as
the default now runs it, and with ``--disable fuse-packed-attention``; prints nodes before/after,
the attention ops left, and (unless --no-validate) whether the default's output validated on ORT,
eager reference included when ``*.ref.npz`` is there. One model at a time (they are large).
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

MODELS = "bert,distilbert,vit,whisper-encoder,gpt2"


def _attention_ops(counts: dict[str, int]) -> str:
    keys = ("com.microsoft::Attention", "com.microsoft::MultiHeadAttention")
    return " ".join(f"{k.split('::')[1]}={counts[k]}" for k in keys if counts.get(k))


def main() -> None:
    from onnxopt.api import optimize

    parser = argparse.ArgumentParser()
    parser.add_argument("zoo", type=Path)
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--no-validate", action="store_true")
    args = parser.parse_args()
    print(
        "| model | exporter | nodes before | after without | after with | attention ops with | validated | optimize s |"
    )
    print("|---|---|---:|---:|---:|---|---|---:|")
    for name in args.models.split(","):
        for exporter in ("torchscript", "dynamo"):
            path = args.zoo / f"{name}.{exporter}.onnx"
            if not path.exists():
                continue
            without = optimize(path, disable=["fuse-packed-attention"], check=False)
            nodes_without = without.report.after.nodes
            del without
            gc.collect()
            start = time.perf_counter()
            result = optimize(path, check=not args.no_validate, find_reference=True)
            seconds = time.perf_counter() - start
            report = result.report
            validated = "-" if args.no_validate else ("yes" if result.validated else "NO")
            print(
                f"| {name} | {exporter} | {report.before.nodes} | {nodes_without} | "
                f"{report.after.nodes} | {_attention_ops(report.after.op_counts)} | {validated} | "
                f"{seconds:.1f} |",
                flush=True,
            )
            del result, report
            gc.collect()


if __name__ == "__main__":
    main()
