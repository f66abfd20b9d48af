"""One LLaMA layer's attention: GroupQueryAttention with its own rotary (``do_rotary=1``, what
fuse-gqa-rotary emits) against two RotaryEmbedding nodes + GroupQueryAttention, interleaved.

    python benchmarks/gqa_rotary_micro.py [--sequence 128] [--rounds 400]

ORT_ENABLE_ALL, 2 intra-op threads, wall time per run; prints the median time of each form
and the median of per-round ratios separate/fused (> 1: the fused form is faster). The graphs are
the ones scripts/gqa_rotary_check.py proves bit-identical (LLaMA-style shapes here: 9 query heads,
3 K/V heads of 64, a causal mask as attention_bias).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts.gqa_rotary_check import build, feeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args()
    shape = {"heads": 9, "kv_heads": 3, "head": 64}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    sessions = {
        name: ort.InferenceSession(
            build(fused, causal=1, **shape).SerializeToString(),
            options,
            providers=["CPUExecutionProvider"],
        )
        for name, fused in (("separate", False), ("fused", True))
    }
    data = feeds(args.batch, args.sequence, False, np.random.default_rng(0), **shape)
    times: dict[str, list[int]] = {name: [] for name in sessions}
    for sess in sessions.values():  # warm up
        sess.run(["y"], data)
    for _ in range(args.rounds):
        for name, sess in sessions.items():
            start = time.perf_counter_ns()
            sess.run(["y"], data)
            times[name].append(time.perf_counter_ns() - start)
    ratios = np.array(times["separate"]) / np.array(times["fused"])
    for name, values in times.items():
        print(f"{name:9} median {np.median(values) / 1e3:8.1f} us")
    print(f"separate / fused: {np.median(ratios):.3f} (median of {args.rounds} paired rounds)")


if __name__ == "__main__":
    main()
