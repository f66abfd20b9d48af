"""fuse-gqa-rotary on whole models: node counts with and without it, validation, fixed point.

For each model: optimize at -O2 --target ort with fuse-gqa-rotary disabled and enabled (the
default), print node counts, GroupQueryAttention / RotaryEmbedding counts and whether the
optimized model validates on ORT; then optimize the serialized output again and check the bytes
are the same (a fixed point). The outputs go to a temporary folder in /dev/shm (memory; the
full-size models are ~540 MB each) and are removed afterwards.

    PYTHONPATH=. /work/main/.venv/bin/python scripts/gqa_rotary_models.py MODEL.onnx [...]
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

from onnxopt import api, io


def main(paths: list[str]) -> int:
    failed = 0
    print(
        "| model | nodes without | nodes with | GQA | RotaryEmbedding | validates | fixed point |"
    )
    print("|---|---|---|---|---|---|---|")
    for path in paths:
        without = api.optimize(path, disable=["fuse-gqa-rotary"], check=False)
        before = len(list(without.model.graph))
        del without
        result = api.optimize(path)
        counts = Counter(node.op_type for node in result.model.graph)
        validation = result.report.validation
        passed = validation is not None and validation.passed
        with tempfile.TemporaryDirectory(dir="/dev/shm") as folder:
            first, second = Path(folder, "first.onnx"), Path(folder, "second.onnx")
            io.save_model(result.model, first)
            del result
            again = api.optimize(first, check=False)
            io.save_model(again.model, second)
            del again
            fixed = first.read_bytes() == second.read_bytes()
        failed += not (passed and fixed)
        print(
            f"| {path} | {before} | {sum(counts.values())} | {counts['GroupQueryAttention']} "
            f"| {counts['RotaryEmbedding']} | {passed} | {fixed} |",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
