"""Node counts of the zoo exports before and after ``onnxopt optimize`` (default level and target).

Each model runs in its own interpreter that imports onnxopt from ``--root`` (default: this
checkout), so two source trees can be compared on the same files, e.g. a change against its base:

    git worktree add /tmp/base HEAD~2
    python benchmarks/zoo_node_counts.py --root /tmp/base zoo/*gelu-models*.onnx > before.md
    python benchmarks/zoo_node_counts.py --validate zoo/bert.*.onnx zoo/convnext-tiny.*.onnx

Prints one markdown row per model: nodes in the export, nodes after, the ops whose counts changed,
and (``--validate``) whether ONNX Runtime agreed with the original (and the eager reference when a
``.ref.npz`` sits beside the model).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from onnxopt import api

path, validate = sys.argv[2], sys.argv[3] == "1"
result = api.optimize(path, check=validate, find_reference=validate)
before, after = result.report.before.op_counts, result.report.after.op_counts
print(json.dumps({
    "before": sum(before.values()), "after": sum(after.values()),
    "changed": {k: [before.get(k, 0), after.get(k, 0)] for k in sorted({*before, *after})
                if before.get(k, 0) != after.get(k, 0)},
    "validated": result.validated if validate else None,
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--root", type=Path, default=ROOT, help="the onnxopt source tree to import")
    parser.add_argument("--validate", action="store_true", help="validate on ORT (slower)")
    args = parser.parse_args()
    print("| model | export | onnxopt | changed ops (export -> onnxopt) | validated |")
    print("|---|---:|---:|---|---|")
    for path in args.models:
        run = subprocess.run(
            [
                sys.executable,
                "-c",
                _CHILD,
                str(args.root),
                str(path),
                "1" if args.validate else "0",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if run.returncode != 0:
            print(f"| {path.name} | error: {run.stderr.strip().splitlines()[-1:]} | | | |")
            continue
        row = json.loads(run.stdout.strip().splitlines()[-1])
        changed = ", ".join(f"{op} {a}->{b}" for op, (a, b) in row["changed"].items())
        validated = "" if row["validated"] is None else str(row["validated"])
        print(
            f"| {path.name.removesuffix('.onnx')} | {row['before']} | {row['after']} | {changed} "
            f"| {validated} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
