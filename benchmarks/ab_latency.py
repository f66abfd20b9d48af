"""A/B latency of two or more ONNX files on ORT CPU, robust to a busy machine: low percentiles.

    nice python benchmarks/ab_latency.py A.onnx B.onnx [C.onnx ...] --threads 2 --rounds 60

All files get the same inputs (generated from the first file's input specs, batch 1 x sequence 128
by default), sessions at ENABLE_ALL with spinning off, and run interleaved in a fresh random order
each round. On a machine shared with other jobs, interference only ever adds time, so besides the
median paired ratio we report each file's minimum and 20th percentile (process CPU time per run by
default, ``--clock wall`` for latency) and the ratio of those against the first file (> 1: faster
than the first file).

Caveat, measured: with one session per file, session placement outweighs small graph differences
(GPT-2: whichever file was loaded last ran 15-20% faster, in either order). Swap the order and rerun
before believing a difference under ~20%; ``onnxopt bench --sessions`` recreates sessions.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's onnxopt


def main() -> None:
    import onnxruntime as ort

    from onnxopt.bench.providers import session_options

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from profile_kernels import _feeds

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--level", default="all")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = parser.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    feeds = _feeds(args.models[0], args.batch, args.sequence)
    sessions = [
        ort.InferenceSession(
            str(p),
            session_options(args.level, args.threads),
            providers=["CPUExecutionProvider"],
        )
        for p in args.models
    ]
    outputs = [s.run(None, feeds) for s in sessions]
    for path, out in zip(args.models[1:], outputs[1:], strict=True):
        diff = max(float(np.abs(a - b).max()) for a, b in zip(outputs[0], out, strict=True))
        print(f"{path}: max |diff| vs {args.models[0]}: {diff:.2e}")
    for _ in range(args.warmup):
        for s in sessions:
            s.run(None, feeds)
    times: list[list[float]] = [[] for _ in sessions]
    order = list(range(len(sessions)))
    for _ in range(args.rounds):
        random.shuffle(order)
        for i in order:
            start = clock()
            sessions[i].run(None, feeds)
            times[i].append(clock() - start)
    base = times[0]
    print(f"{args.rounds} rounds, {args.threads} threads, {args.clock} clock")
    print("| model | min ms | p20 ms | median ms | first/this (min) | (p20) | median paired |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for path, t in zip(args.models, times, strict=True):
        p20 = float(np.percentile(t, 20))
        paired = statistics.median(a / b for a, b in zip(base, t, strict=True))
        print(
            f"| {path} | {min(t) * 1e3:.1f} | {p20 * 1e3:.1f} | {statistics.median(t) * 1e3:.1f} "
            f"| {min(base) / min(t):.3f} | {np.percentile(base, 20) / p20:.3f} | {paired:.3f} |"
        )


if __name__ == "__main__":
    main()
