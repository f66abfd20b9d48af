"""Where does ORT's CPU time go? Kernel time by op type, GEMMs vs everything else, per model.

    nice python benchmarks/profile_kernels.py MODEL.onnx [MODEL.onnx ...] --threads 2 --runs 10

Each model runs under ORT's profiler (``SessionOptions.enable_profiling``) at the chosen level
(default ENABLE_ALL), batch 1 x sequence 128 (``--sequence``), ``--warmup`` runs discarded. Kernel
time is the sum of the profiler's ``*_kernel_time`` events per op type, divided by the number of
timed runs. "GEMM" is the dense projection/FFN work: MatMul, Gemm, FusedMatMul, FusedGemm whose
second operand is a 2-D weight, and the Q/K/V projection inside a packed com.microsoft.Attention
(its FLOPs, 2 * B * S * D * 3 * D_out for equal Q/K/V widths, at the run's own GEMM FLOP rate). Attention's Q@K^T and P@V products are not GEMMs here: inside a
fused attention kernel they count with it, and unfused they are listed as "MatMul (activations)". The *limit* is the speed-up the model would get if every non-GEMM kernel vanished:
total / GEMM. With ``--json`` the table is also written as JSON. With ``--pairs`` the models are
ORIGINAL OPTIMIZED pairs, compared GEMM-normalized (see ``render_pairs``): on a shared machine the
absolute kernel times move with the load, their non-GEMM/GEMM ratio much less.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's onnxopt

# com.microsoft.Attention runs the Q/K/V projection inside its kernel: that share of its time is
# estimated at the rate (FLOP per microsecond) of the same run's other dense GEMMs and counted as GEMM.
PACKED_QKV = "Attention (QKV projection)"
GEMM_OPS = ("MatMul", "Gemm", "FusedMatMul", "FusedGemm", PACKED_QKV)


@dataclass(frozen=True)
class Profile:
    model: str
    runs: int
    by_op: dict[str, float]  # microseconds per run, by op type
    nodes: int  # kernels per run

    @property
    def total(self) -> float:
        return sum(self.by_op.values())

    @property
    def gemm(self) -> float:
        return sum(t for op, t in self.by_op.items() if op in GEMM_OPS)

    @property
    def limit(self) -> float:
        return self.total / self.gemm if self.gemm else float("nan")


def _feeds(path: Path, batch: int, sequence: int) -> dict[str, np.ndarray]:
    from onnxopt.bench.run import _feeds as generated
    from onnxopt.bench.run import resolve_shapes
    from onnxopt.io import load_model
    from onnxopt.validate import input_specs

    specs = input_specs(load_model(path).model)
    shapes = resolve_shapes(specs, {}, {"batch": batch, "sequence": sequence}, {})
    return generated(specs, shapes, seed=0)


def _dense(input_shapes: list[dict[str, list[int]]]) -> bool:
    """A projection/FFN product, not attention's [B, H, S, d] x [B, H, d, T].

    ORT lists the inputs a kernel still reads: a prepacked weight is gone from the list, an
    unpacked one is 2-D; attention's products have two operands of rank >= 3.
    """
    ranks = [len(next(iter(shape.values()), [])) for shape in input_shapes[:2]]
    return not (len(ranks) == 2 and min(ranks) >= 3)


def _gemm_flops(inputs: list[dict[str, list[int]]], outputs: list[dict[str, list[int]]]) -> float:
    """2 * (output elements) * K for a product whose first operand is [..., K]: 0 when unknown."""
    if not inputs or not outputs:
        return 0.0
    first = next(iter(inputs[0].values()), [])
    out = next(iter(outputs[0].values()), [])
    if not first or not out:
        return 0.0
    return 2.0 * float(np.prod(out)) * first[-1]


def profile(
    path: Path, *, level: str, threads: int, runs: int, warmup: int, batch: int, sequence: int
) -> Profile:
    import onnxruntime as ort

    from onnxopt.bench.providers import session_options

    feeds = _feeds(path, batch, sequence)
    options = session_options(level, threads)
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        options.profile_file_prefix = os.path.join(tmp, "profile")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for _ in range(warmup + runs):
            session.run(None, feeds)
        trace = Path(session.end_profiling())
        events = json.loads(trace.read_text())
    model_runs = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
        key=lambda e: e["ts"],
    )[warmup:]
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in model_runs]
    by_op: Counter[str] = Counter()
    kernels = 0
    gemm_flops = gemm_time = 0.0
    packed: list[tuple[float, float]] = []  # (kernel time, Q/K/V projection FLOPs) per Attention
    for event in events:
        if event.get("cat") != "Node" or not str(event.get("name", "")).endswith("_kernel_time"):
            continue
        ts = event["ts"]
        if not any(lo <= ts <= hi for lo, hi in windows):
            continue
        op = event["args"]["op_name"]
        shapes = event["args"].get("input_type_shape", [])
        outputs = event["args"].get("output_type_shape", [])
        if op in GEMM_OPS and not _dense(shapes):
            op = f"{op} (activations)"  # attention's Q@K^T and P@V when not fused: not a GEMM here
        elif op in GEMM_OPS and (flops := _gemm_flops(shapes, outputs)):
            gemm_flops += flops
            gemm_time += event["dur"]
        if op == "Attention" and (flops := _gemm_flops(shapes[:1], outputs)):
            packed.append((event["dur"], 3 * flops))
            kernels += 1
            continue
        by_op[op] += event["dur"]
        kernels += 1
    rate = gemm_flops / gemm_time if gemm_time else 0.0
    for duration, flops in packed:
        projection = min(duration, flops / rate) if rate else 0.0
        by_op[PACKED_QKV] += projection
        by_op["Attention"] += duration - projection
    count = max(len(windows), 1)
    return Profile(
        path.name, count, {op: t / count for op, t in by_op.most_common()}, kernels // count
    )


def render(profiles: list[Profile], top: int) -> str:
    lines = [
        "| model | kernels/run | kernel ms/run | GEMM ms | GEMM share | limit | largest non-GEMM (ms/run) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for p in profiles:
        others = [(op, t) for op, t in p.by_op.items() if op not in GEMM_OPS][:top]
        listed = ", ".join(f"{op} {t / 1000:.2f}" for op, t in others)
        lines.append(
            f"| {p.model} | {p.nodes} | {p.total / 1000:.1f} | {p.gemm / 1000:.1f} "
            f"| {p.gemm / p.total:.1%} | {p.limit:.3f}× | {listed} |"
        )
    return "\n".join(lines)


def render_pairs(profiles: list[Profile]) -> str:
    """Original/optimized pairs, compared through their non-GEMM time per GEMM time (load-robust).

    With the same GEMMs in both files, t = GEMM * (1 + r), r = non-GEMM / GEMM, so the speed-up is
    about (1 + r_original) / (1 + r_optimized) however busy the machine was during each profile;
    the limit is 1 + r_original (every non-GEMM kernel gone), and the headroom taken is
    (r_original - r_optimized) / r_original.
    """
    lines = [
        "| model | non-GEMM/GEMM original | optimized | est. speed-up | limit | headroom taken |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for original, optimized in zip(profiles[::2], profiles[1::2], strict=True):
        r0 = original.total / original.gemm - 1
        r1 = optimized.total / optimized.gemm - 1
        lines.append(
            f"| {optimized.model} | {r0:.3f} | {r1:.3f} | {(1 + r0) / (1 + r1):.3f}× "
            f"| {1 + r0:.3f}× | {(r0 - r1) / r0:.0%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--level", default="all", help="ORT level: disable, basic, extended, all")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--top", type=int, default=5, help="non-GEMM op types listed per model")
    parser.add_argument("--json", type=Path, help="also write the profiles here")
    parser.add_argument(
        "--pairs",
        action="store_true",
        help="MODELS are ORIGINAL OPTIMIZED pairs: also print the GEMM-normalized comparison",
    )
    args = parser.parse_args()
    profiles = []
    for path in args.models:
        p = profile(
            path,
            level=args.level,
            threads=args.threads,
            runs=args.runs,
            warmup=args.warmup,
            batch=args.batch,
            sequence=args.sequence,
        )
        profiles.append(p)
        print(render([p], args.top).splitlines()[-1], file=sys.stderr, flush=True)
    print(render(profiles, args.top))
    if args.pairs:
        print()
        print(render_pairs(profiles))
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {"model": p.model, "runs": p.runs, "kernels": p.nodes, "by_op_us": p.by_op}
                    for p in profiles
                ],
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
