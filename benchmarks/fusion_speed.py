"""Time original vs onnxopt-optimized models on ONNX Runtime CPU (2 threads), interleaved in one process.

For each model and each ORT graph-optimization level (ENABLE_ALL, DISABLE_ALL) both sessions run
alternately (order flipped every round); the figure reported is the median of the paired ratios
original_time / optimized_time (> 1 means onnxopt's output is faster), which cancels most of the
drift caused by other processes sharing the machine.

    nice python benchmarks/fusion_speed.py                        # all models, both exporters
    nice python benchmarks/fusion_speed.py --models bert-base --exporters torchscript --rounds 30

Models are exported once into --cache (default out/bench-models) with random weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# ---------------------------------------------------------------- models (torch imported lazily)


def _resnet50() -> tuple[Any, tuple[Any, ...], list[str], dict[str, dict[int, str]]]:
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout),
            )  # fmt: skip
            self.down = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x):  # type: ignore[no-untyped-def]
            return torch.relu(self.body(x) + self.down(x))

    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
    ]  # fmt: skip
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    model = nn.Sequential(*layers).eval()
    return model, (torch.randn(1, 3, 224, 224),), ["pixels"], {"pixels": {0: "batch"}}


def _bert_base() -> tuple[Any, tuple[Any, ...], list[str], dict[str, dict[int, str]]]:
    import torch
    from transformers import BertConfig, BertModel

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = BertModel(BertConfig())

        def forward(self, input_ids, attention_mask):  # type: ignore[no-untyped-def]
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    args = (torch.randint(0, 30000, (1, 128)), torch.ones(1, 128, dtype=torch.int64))
    dynamic = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    return Wrapper().eval(), args, ["input_ids", "attention_mask"], dynamic


def _llama_small() -> tuple[Any, tuple[Any, ...], list[str], dict[str, dict[int, str]]]:
    import torch
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=512,
    )  # fmt: skip

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = LlamaModel(config)

        def forward(self, input_ids):  # type: ignore[no-untyped-def]
            return self.inner(input_ids=input_ids, use_cache=False).last_hidden_state

    return (
        Wrapper().eval(),
        (torch.randint(0, 32000, (1, 128)),),
        ["input_ids"],
        {"input_ids": {0: "batch", 1: "seq"}},
    )


MODELS: dict[
    str, Callable[[], tuple[Any, tuple[Any, ...], list[str], dict[str, dict[int, str]]]]
] = {
    "resnet50": _resnet50,
    "bert-base": _bert_base,
    "llama-small": _llama_small,
}


def export(name: str, exporter: str, cache: Path) -> tuple[Path, dict[str, np.ndarray]]:
    import torch

    path = cache / f"{name}.{exporter}.onnx"
    module, args, names, dynamic = MODELS[name]()
    feeds = {n: a.numpy() for n, a in zip(names, args, strict=True)}
    if path.exists():
        return path, feeds
    torch.manual_seed(0)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            shapes = tuple(
                {axis: torch.export.Dim.AUTO for axis in dynamic.get(n, {})} for n in names
            )
            program = torch.onnx.export(
                module, args, input_names=names, dynamic_shapes=shapes, dynamo=True
            )
            assert program is not None
            program.save(str(path))
        else:
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=names,
                dynamic_axes=dynamic,
                opset_version=17,
                dynamo=False,
            )
    return path, feeds


# ---------------------------------------------------------------- timing


def _session(path: Path, level: str, threads: int):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    # No spin-waiting: CPU time then measures work done, a steadier figure on a shared machine.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_final_ops(path: Path, level: str, scratch: Path) -> dict[str, int]:
    """Op histogram of the graph ORT actually runs after its own optimizations at ``level``.

    Equal histograms for original and optimized mean equal kernels: any timing difference is noise.
    """
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.optimized_model_filepath = str(scratch)
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    graph = onnx.load(str(scratch), load_external_data=False).graph
    counts: dict[str, int] = {}
    for node in graph.node:
        key = f"{node.domain}:{node.op_type}" if node.domain else node.op_type
        counts[key] = counts.get(key, 0) + 1
    scratch.unlink()
    for extra in scratch.parent.glob(scratch.name + "*"):
        extra.unlink()
    return dict(sorted(counts.items()))


def paired_timing(
    a: Path, b: Path, feeds: dict[str, np.ndarray], level: str, rounds: int, threads: int
) -> dict[str, float]:
    sessions = [_session(a, level, threads), _session(b, level, threads)]
    for session in sessions:
        for _ in range(3):
            session.run(None, feeds)
    times: list[list[float]] = [[], []]
    cpu: list[list[float]] = [[], []]
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for i in order:
            start, start_cpu = time.perf_counter(), time.process_time()
            sessions[i].run(None, feeds)
            times[i].append(time.perf_counter() - start)
            cpu[i].append(time.process_time() - start_cpu)
    ratios = [x / y for x, y in zip(times[0], times[1], strict=True)]
    cpu_ratios = [x / y for x, y in zip(cpu[0], cpu[1], strict=True)]
    return {
        "original_ms": statistics.median(times[0]) * 1000,
        "optimized_ms": statistics.median(times[1]) * 1000,
        "speedup": statistics.median(ratios),
        # spread of the paired ratios: a speed-up inside [p25, p75] of noise is no speed-up
        "speedup_p25": float(np.percentile(ratios, 25)),
        "speedup_p75": float(np.percentile(ratios, 75)),
        "cpu_speedup": statistics.median(cpu_ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--exporters", default="torchscript,dynamo")
    parser.add_argument("--levels", default="ORT_ENABLE_ALL,ORT_DISABLE_ALL")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--target", default="ort", choices=["ort", "onnx"])
    parser.add_argument("--cache", type=Path, default=ROOT / "out" / "bench-models")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()

    from onnxopt import io
    from onnxopt.api import optimize

    args.cache.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        for exporter in args.exporters.split(","):
            try:
                path, feeds = export(name, exporter, args.cache)
            except Exception as exc:  # e.g. TorchScript cannot export aten::diff (LLaMA masks)
                print(
                    f"skip {name} ({exporter}): export failed: {str(exc).splitlines()[0]}",
                    file=sys.stderr,
                )
                continue
            result = optimize(path, target=args.target, check=False)
            out = args.cache / f"{name}.{exporter}.{args.target}.opt.onnx"
            io.save_model(result.model, out)
            fusions = {rule: fused for rule, _, fused in result.report.fusion_counts() if fused}
            row: dict[str, Any] = {
                "model": name,
                "exporter": exporter,
                "nodes_before": result.report.before.nodes,
                "nodes_after": result.report.after.nodes,
                "fusions": fusions,
            }
            scratch = args.cache / "ort-final.onnx"
            before_ops = ort_final_ops(path, "ORT_ENABLE_ALL", scratch)
            after_ops = ort_final_ops(out, "ORT_ENABLE_ALL", scratch)
            row["ort_all_nodes"] = [sum(before_ops.values()), sum(after_ops.values())]
            row["ort_all_same_graph"] = before_ops == after_ops
            row["ort_all_ops_after"] = after_ops
            for level in args.levels.split(","):
                row[level] = paired_timing(path, out, feeds, level, args.rounds, args.threads)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)

    levels = args.levels.split(",")
    header = "| model | exporter | nodes | ORT_ENABLE_ALL kernels (same?) | " + " | ".join(
        f"{lv} orig ms | opt ms | speed-up [p25, p75] | CPU-time speed-up" for lv in levels
    )
    print(header + " |")
    print("|" + "---|" * (4 + 4 * len(levels)))
    for row in rows:
        kernels = row["ort_all_nodes"]
        same = "same graph" if row["ort_all_same_graph"] else "differs"
        cells = [
            row["model"],
            row["exporter"],
            f"{row['nodes_before']} -> {row['nodes_after']}",
            f"{kernels[0]} -> {kernels[1]} ({same})",
        ]
        for level in levels:
            t = row[level]
            cells += [
                f"{t['original_ms']:.1f}",
                f"{t['optimized_ms']:.1f}",
                f"{t['speedup']:.3f}x [{t['speedup_p25']:.2f}, {t['speedup_p75']:.2f}]",
                f"{t['cpu_speedup']:.3f}x",
            ]
        print("| " + " | ".join(cells) + " |")
    for level in levels:
        for key in ("speedup", "cpu_speedup"):
            speedups = [row[level][key] for row in rows]
            geo = float(np.exp(np.mean(np.log(speedups)))) if speedups else float("nan")
            print(f"geometric mean {key} at {level}: {geo:.3f}x")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
