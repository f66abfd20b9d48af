"""Attention fusion speed on ORT CPU: original export vs onnxopt, timed interleaved in one process.

    nice python benchmarks/attention_speed.py --models bert,gpt2,llama --exporters ts,dynamo

Each model is built from a transformers config with seeded random weights, exported with dynamic
batch and sequence, optimized with ``onnxopt.optimize`` (default level), then both sessions
(ORT_ENABLE_ALL, 2 intra-op threads) run batch 1 x seq 128 alternately; we report the median of
the paired time ratios (original / optimized, > 1 means faster). ``--ort-transformers`` adds
onnxruntime.transformers.optimizer's output (model_type bert/gpt2) to the same interleaved loop.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent)
)  # this checkout's onnxopt, not an installed one

CONFIGS = {
    # BERT-base and GPT-2 small at full size; the LLaMA-style model is a small-ish GQA config
    # (hidden 1024, 16 heads, 4 KV heads, 8 layers) so that both exports fit the shared machine.
    "bert": ("BertModel", "BertConfig", {}),
    "distilbert": ("DistilBertModel", "DistilBertConfig", {}),
    "gpt2": ("GPT2Model", "GPT2Config", {"use_cache": False}),
    "llama": (
        "LlamaModel",
        "LlamaConfig",
        {
            "hidden_size": 1024,
            "intermediate_size": 2816,
            "num_hidden_layers": 8,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "vocab_size": 32000,
            "use_cache": False,
        },
    ),
    # DeepSeek-V2-Lite's latent attention at half width (low-rank Q and KV, a rotary part of each
    # head, V heads narrower than Q/K's), dense FFNs only.
    "deepseek": (
        "DeepseekV3Model",
        "DeepseekV3Config",
        {
            "hidden_size": 1024,
            "intermediate_size": 2816,
            "num_hidden_layers": 4,
            "first_k_dense_replace": 4,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "q_lora_rank": 384,
            "kv_lora_rank": 256,
            "qk_nope_head_dim": 64,
            "qk_rope_head_dim": 32,
            "v_head_dim": 64,
            "vocab_size": 32000,
            "use_cache": False,
        },
    ),
}


def export(kind: str, exporter: str, folder: Path) -> Path:
    path = folder / f"{kind}_{exporter}.onnx"
    if path.exists():
        return path
    import torch
    import transformers

    model_name, config_name, kwargs = CONFIGS[kind]
    torch.manual_seed(0)
    module = getattr(transformers, model_name)(getattr(transformers, config_name)(**kwargs)).eval()

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, input_ids, attention_mask):  # type: ignore[no-untyped-def]
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    args = (torch.randint(0, 1000, (2, 16)), torch.ones(2, 16, dtype=torch.long))
    names = ["input_ids", "attention_mask"]
    with torch.no_grad():
        if exporter == "dynamo":
            from torch.export import Dim

            shapes = ({0: Dim.AUTO, 1: Dim.AUTO}, {0: Dim.AUTO, 1: Dim.AUTO})
            program = torch.onnx.export(
                Wrapper(), args, input_names=names, dynamic_shapes=shapes, dynamo=True
            )
            assert program is not None
            program.save(str(path), external_data=True)
        else:
            axes = {n: {0: "batch", 1: "seq"} for n in names}
            torch.onnx.export(
                Wrapper(),
                args,
                str(path),
                input_names=names,
                dynamic_axes=axes,
                opset_version=17,
                dynamo=False,
            )
    return path


def session(path: Path, threads: int):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def time_interleaved(
    sessions: dict[str, object], feeds: dict[str, np.ndarray], repeats: int
) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(3):
        for s in sessions.values():
            s.run(None, feeds)  # type: ignore[attr-defined]
    for _ in range(repeats):
        for name, s in sessions.items():
            start = time.perf_counter()
            s.run(None, feeds)  # type: ignore[attr-defined]
            times[name].append(time.perf_counter() - start)
    return times


def ort_transformers(path: Path, kind: str, out: Path) -> Path | None:
    try:
        from onnxruntime.transformers import optimizer
    except ImportError:
        return None
    model_type = {"gpt2": "gpt2", "llama": "gpt2"}.get(kind, "bert")
    try:
        optimized = optimizer.optimize_model(
            str(path), model_type=model_type, num_heads=0, hidden_size=0, opt_level=0
        )
    except Exception as exc:  # the tool crashes on some current exports; report it and go on
        print(
            f"  onnxruntime.transformers.optimizer failed on {path.name}: {type(exc).__name__}: {exc}"
        )
        return None
    optimized.save_model_to_file(str(out), use_external_data_format=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="bert,gpt2,llama")
    parser.add_argument("--exporters", default="ts,dynamo")
    parser.add_argument("--folder", default="/tmp/onnxopt-attention-bench")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--ort-transformers", action="store_true")
    args = parser.parse_args()

    import onnxopt
    from onnxopt import io

    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    ratios: list[float] = []
    print(f"{'model':<18} {'orig ms':>8} {'onnxopt ms':>10} {'speed-up':>9}  fused", flush=True)
    for kind in args.models.split(","):
        for exporter in args.exporters.split(","):
            source = export(kind, exporter, folder)
            result = onnxopt.optimize(source, check=False)
            optimized = folder / f"{kind}_{exporter}.onnxopt.onnx"
            io.save_model(result.model, optimized)
            totals = result.report.records
            fused = sum(r.stats.get("attention->mha", 0) for r in totals)
            paths = {"orig": source, "onnxopt": optimized}
            if args.ort_transformers:
                other = ort_transformers(source, kind, folder / f"{kind}_{exporter}.ortopt.onnx")
                if other is not None:
                    paths["ort-transformers"] = other
            sessions = {name: session(p, args.threads) for name, p in paths.items()}
            rng = np.random.default_rng(0)
            feeds = {
                "input_ids": rng.integers(0, 1000, (1, args.seq)).astype(np.int64),
                "attention_mask": np.ones((1, args.seq), dtype=np.int64),
            }
            times = time_interleaved(sessions, feeds, args.repeats)
            paired = [a / b for a, b in zip(times["orig"], times["onnxopt"], strict=True)]
            ratio = statistics.median(paired)
            ratios.append(ratio)
            line = (
                f"{kind + '/' + exporter:<18} {statistics.median(times['orig']) * 1e3:8.1f} "
                f"{statistics.median(times['onnxopt']) * 1e3:10.1f} {ratio:8.3f}x  {fused}"
            )
            if "ort-transformers" in times:
                other_ratio = statistics.median(
                    [a / b for a, b in zip(times["orig"], times["ort-transformers"], strict=True)]
                )
                line += f"   ort-transformers {other_ratio:.3f}x"
            print(line, flush=True)
    if ratios:
        geomean = float(np.exp(np.mean(np.log(ratios))))
        print(f"geometric mean speed-up: {geomean:.3f}x over {len(ratios)} exports")
    return 0


if __name__ == "__main__":
    sys.exit(main())
