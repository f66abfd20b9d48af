"""Activation memory figures per model: naive / lower bound / planned / gap, before and after reuse and reordering.

    PYTHONPATH=. python benchmarks/memory_plan.py light            # onnx's light_* models
    PYTHONPATH=. python benchmarks/memory_plan.py transformers     # exports from transformers configs
    PYTHONPATH=. python benchmarks/memory_plan.py scale            # synthetic 10k/50k/100k-node graphs

Columns (MiB): "baseline" is the input order with one buffer per tensor (the classic figure);
"reuse" adds view and in-place sharing; "pass" is reorder-for-memory's order (it must not raise
the peak of ONNX Runtime's default walk either); "file-order" is the best order for runtimes that
follow the file or a static plan (ORT with ExecutionOrder.PRIORITY_BASED). "LB" is the lower bound
(largest live total), "planned" the arena our planner builds, "gap" = planned / LB - 1;
"vs baseline" compares planned arenas with the baseline lower bound.
The light_* models build their weights with ConstantOfShape nodes; "as shipped" counts those
weights as intermediates (as the graph says), "weights as inputs" turns them into caller-owned
inputs so only activations are counted.
"""

from __future__ import annotations

import glob
import random
import sys
import time
from pathlib import Path

import onnx
import onnx_ir as ir

from onnxopt import io
from onnxopt.analysis.memory import build_dataflow, tensor_sizes
from onnxopt.analysis.memory_plan import plan_flow, verify_plan
from onnxopt.analysis.schedule import is_topological, schedule_for_memory
from onnxopt.ops import is_op

LIGHT = Path(onnx.__file__).parent / "backend/test/data/light"
MIB = 2**20


def weights_as_inputs(model: ir.Model, sizes) -> ir.Model:
    """Replace ConstantOfShape nodes with constant shapes by graph inputs of the same type."""
    for node in list(model.graph):
        if (
            is_op(node, "ConstantOfShape")
            and ir.convenience.get_const_tensor(node.inputs[0]) is not None
        ):
            old = node.outputs[0]
            dtype = old.dtype or ir.DataType.FLOAT
            new = ir.Value(
                name=f"{old.name}_weight",
                shape=ir.Shape(sizes.shapes[old.name]),
                type=ir.TensorType(dtype),
            )
            model.graph.inputs.append(new)
            ir.convenience.replace_all_uses_with(old, new)
            model.graph.remove(node, safe=True)
    return model


def figures(model: ir.Model, dims=None) -> dict:
    sizes = tensor_sizes(model, dims)
    start = time.perf_counter()
    plain_flow = build_dataflow(model.graph, sizes, inplace=False)
    plain = plan_flow(plain_flow, inplace=False)
    flow = build_dataflow(model.graph, sizes, inplace=True)
    reuse = plan_flow(flow)
    schedule = schedule_for_memory(flow)  # what reorder-for-memory does (ORT-safe)
    free = schedule_for_memory(
        flow, ort_guard=False
    )  # for runtimes that follow the file/plan order
    assert is_topological(flow, schedule.order) and is_topological(flow, free.order)
    reordered = plan_flow(flow, schedule.order)
    free_plan = plan_flow(flow, free.order)
    seconds = time.perf_counter() - start
    for plan in (plain, reuse, reordered, free_plan):
        assert verify_plan(plan) == [], verify_plan(plan)[:2]
    return {
        "nodes": len(flow.nodes),
        "naive": plain.naive_bytes,
        "baseline": plain.lower_bound_bytes,
        "baseline_planned": plain.arena_bytes,
        "reuse": reuse.lower_bound_bytes,
        "reuse_planned": reuse.arena_bytes,
        "reordered": reordered.lower_bound_bytes,
        "reordered_planned": reordered.arena_bytes,
        "free": free_plan.lower_bound_bytes,
        "free_planned": free_plan.arena_bytes,
        "gaps": (plain.gap, reuse.gap, reordered.gap, free_plan.gap),
        "unknown": len(reordered.unknown),
        "seconds": seconds,
    }


def row(name: str, f: dict) -> str:
    def change(key: str) -> str:
        return f"{-(1 - f[key] / f['baseline']) * 100:+.1f}%" if f["baseline"] else "-"

    gaps = " / ".join(f"{g * 100:.2f}" for g in f["gaps"])
    return (
        f"| {name} | {f['nodes']} | {f['naive'] / MIB:.1f} | {f['baseline'] / MIB:.2f} | {f['baseline_planned'] / MIB:.2f} "
        f"| {f['reuse'] / MIB:.2f} | {f['reordered'] / MIB:.2f} | {f['reordered_planned'] / MIB:.2f} | {change('reordered_planned')} "
        f"| {f['free'] / MIB:.2f} | {f['free_planned'] / MIB:.2f} | {change('free_planned')} "
        f"| {gaps} | {f['unknown']} | {f['seconds']:.1f} |"
    )


HEADER = (
    "| model | nodes | naive | baseline LB | baseline planned | reuse LB | pass LB | pass planned | vs baseline "
    "| file-order LB | file-order planned | vs baseline | gaps % (baseline / reuse / pass / file-order) | unknown | s |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def light() -> None:
    print(HEADER)
    for path in sorted(glob.glob(str(LIGHT / "*.onnx"))):
        name = Path(path).stem.removeprefix("light_")
        model = io.load_model(path).model
        print(row(f"{name} (as shipped)", figures(model)), flush=True)
        model = io.load_model(path).model
        model = weights_as_inputs(model, tensor_sizes(model))
        print(row(f"{name} (weights as inputs)", figures(model)), flush=True)


TRANSFORMERS = {
    # name: (config factory, batch, sequence)
    "bert-base (2 layers)": ("BertConfig", {"num_hidden_layers": 2}, 8, 128),
    "bert-base (2 layers), seq 512": ("BertConfig", {"num_hidden_layers": 2}, 1, 512),
    "gpt2 (2 layers)": ("GPT2Config", {"n_layer": 2, "use_cache": False}, 8, 128),
    "distilbert (2 layers)": ("DistilBertConfig", {"n_layers": 2}, 8, 128),
    "vit-base (2 layers)": ("ViTConfig", {"num_hidden_layers": 2}, 8, None),
    "llama, SmolLM-135M shape (2 layers)": (
        "LlamaConfig",
        {
            "vocab_size": 49152,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 2,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "use_cache": False,
        },
        8,
        128,
    ),
    # the encoder alone, on 80 mel bins x 3000 frames (30 s of audio)
    "whisper-tiny encoder": (
        "WhisperConfig",
        {
            "d_model": 384,
            "encoder_layers": 4,
            "encoder_attention_heads": 6,
            "encoder_ffn_dim": 1536,
        },
        1,
        "mel",
    ),
}


def export_transformer(name: str, folder: Path) -> Path:
    import torch
    import transformers

    config_name, overrides, batch, seq = TRANSFORMERS[name]
    config = getattr(transformers, config_name)(**overrides)
    model = transformers.AutoModel.from_config(config).eval()
    torch.manual_seed(0)
    if seq == "mel":
        model = model.encoder
        args = (torch.randn(batch, config.num_mel_bins, 3000),)
        names = ["input_features"]
    elif seq is None:
        args = (torch.randn(batch, 3, config.image_size, config.image_size),)
        names = ["pixel_values"]
    else:
        args = (torch.randint(0, 1000, (batch, seq)),)
        names = ["input_ids"]
    path = folder / (
        name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "") + ".onnx"
    )
    if not path.exists():
        torch.onnx.export(
            model, args, str(path), input_names=names, dynamo=True, external_data=True
        )
    return path


def transformers_table(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    print(HEADER)
    for name in TRANSFORMERS:
        path = export_transformer(name, folder)
        print(row(name, figures(io.load_model(path).model)), flush=True)


def synthetic(nodes: int, seed: int = 0, window: int = 24) -> ir.Model:
    """A random DAG of element-wise ops and concats reading recent values (residual-network-like)."""
    rng = random.Random(seed)
    x = ir.Value(name="x", shape=ir.Shape([1, 256]), type=ir.TensorType(ir.DataType.FLOAT))
    values = [x]
    graph_nodes = []
    for i in range(nodes):
        recent = values[-window:]
        kind = rng.random()
        width = rng.choice((64, 256, 1024))
        if kind < 0.4:
            op, inputs = "Relu", [rng.choice(recent[-4:])]
        elif kind < 0.8:
            op, inputs = "Add", [rng.choice(recent[-3:]), rng.choice(recent)]
        else:
            op, inputs = "Concat", [rng.choice(recent[-3:]), rng.choice(recent)]
        node = ir.Node(
            "",
            op,
            inputs,
            attributes=[ir.AttrInt64("axis", 1)] if op == "Concat" else [],
            name=f"n{i}",
        )
        out = node.outputs[0]
        out.name = f"v{i}"
        out.type = ir.TensorType(ir.DataType.FLOAT)
        out.shape = ir.Shape([1, width])  # sizes only matter here, shapes need not type-check
        graph_nodes.append(node)
        values.append(out)
    graph = ir.Graph([x], [values[-1]], nodes=graph_nodes, opset_imports={"": 17}, name="synthetic")
    return ir.Model(graph, ir_version=8)


def scale() -> None:
    # CPU seconds of this process (the shared machine's load would inflate wall-clock times).
    print(
        "| nodes | dataflow s | liveness+plan s | schedule s | plan of new order s | total s | peak before | peak after | gap before | gap after |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in (10_000, 50_000, 100_000):
        model = synthetic(n)
        t0 = time.process_time()
        sizes = tensor_sizes(model, infer=False)
        flow = build_dataflow(model.graph, sizes)
        t1 = time.process_time()
        plan = plan_flow(flow)
        t2 = time.process_time()
        schedule = schedule_for_memory(flow)
        t3 = time.process_time()
        replanned = plan_flow(flow, schedule.order)
        t4 = time.process_time()
        assert verify_plan(plan) == [] and verify_plan(replanned) == []
        print(
            f"| {n} | {t1 - t0:.2f} | {t2 - t1:.2f} | {t3 - t2:.2f} | {t4 - t3:.2f} | {t4 - t0:.2f} "
            f"| {schedule.original_peak / 1024:.0f} KiB | {schedule.peak / 1024:.0f} KiB "
            f"| {plan.gap * 100:.2f}% | {replanned.gap * 100:.2f}% |",
            flush=True,
        )


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "light"
    if what == "light":
        light()
    elif what == "transformers":
        transformers_table(Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/onnxopt-memory-models"))
    elif what == "scale":
        scale()
    else:
        raise SystemExit(f"unknown benchmark {what!r} (light, transformers, scale)")
