"""Is ``onnxopt bench``'s speed-up stable? Run it twice back to back and check that the intervals overlap.

    .venv/bin/python benchmarks/hf_models.py bert_base out/bert_base.onnx
    .venv/bin/python benchmarks/stability.py out/bert_base.onnx -- --threads 1 --budget 150 --clock cpu

Arguments after ``--`` go to ``onnxopt bench``. Prints a markdown table of both runs' speed-ups
(median of paired ratios and 95% interval) per variant, and exits 1 when some pair does not overlap.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run(model: str, extra: list[str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "onnxopt", "bench", model, "--no-memory", "--json", *extra]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode != 0:
        sys.exit(f"onnxopt bench failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def speedups(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {}
    for group in report["points"][0]["groups"]:
        for variant in group["variants"]:
            if variant["speedup"] is not None:
                label = f"{variant['name']} ({variant['ort_level'] or variant['provider']}) vs {variant['speedup_baseline']}"
                found[label] = {
                    **variant["speedup"],
                    "rounds": group["rounds"],
                    "median_s": variant["latency"]["median"],
                }
    return found


def main() -> None:
    args = sys.argv[1:]
    extra = args[args.index("--") + 1 :] if "--" in args else []
    model = args[0]
    first, second = speedups(run(model, extra)), speedups(run(model, extra))
    print(f"`onnxopt bench {model} {' '.join(extra)}`, twice:\n")
    print("| variant | run 1 speed-up [95% CI] | run 2 speed-up [95% CI] | rounds | overlap |")
    print("|---|---:|---:|---:|:---:|")
    stable = True
    for label, a in first.items():
        b = second[label]
        overlap = (
            a["low"] is not None
            and b["low"] is not None
            and a["low"] <= b["high"]
            and b["low"] <= a["high"]
        )
        stable &= overlap
        print(
            f"| {label} | {a['median']:.3f} [{a['low']:.3f}, {a['high']:.3f}] | "
            f"{b['median']:.3f} [{b['low']:.3f}, {b['high']:.3f}] | {a['rounds']}, {b['rounds']} | "
            f"{'yes' if overlap else 'NO'} |"
        )
    sys.exit(0 if stable else 1)


if __name__ == "__main__":
    main()
