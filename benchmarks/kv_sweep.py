"""KV-cache decoder exports (``use_cache=True``): the decoder step onnxruntime-genai-style deployments run.

One export per family, exporter and attention implementation: inputs ``input_ids [B, S]``,
``attention_mask [B, P+S]`` and each layer's past key and value ``[B, kv_heads, P, d]``; outputs the
last hidden state and each layer's present key and value ``[B, kv_heads, P+S, d]``. The models are
the sweep's own tiny configs (``arch_sweep``'s factories, the zoo's ``gpt2_tiny``/``llama_tiny``:
seeded, perturbed weights, nothing downloaded), wrapped so that a ``DynamicCache`` is built from the
past tensors. Each export is optimized at -O2 and validated on ONNX Runtime (optimizations off)
against the original at several sizes: (B, P, S) in (2, 5, 3), (1, 0, 4) (prompt), (2, 7, 1)
(decode), (1, 3, 1), with all-ones, left-padded and right-padded masks, and against the eager
PyTorch outputs of the example (one row left-padded); optimized again, it must not change (fixed
point). One markdown row each:

    PYTHONPATH=. python benchmarks/kv_sweep.py [--families gpt2,llama,...] [--exporters dynamo]
        [--attention eager|sdpa] [--position-ids] [--merged] [--target onnx --opset 23]
        [--enable PASSES] [--export-opset 14] [--out DIR] [--explain]

``--merged`` wraps each step as an Optimum merged decoder (``merge_decoders``: ``If(use_cache_branch)``
over two copies of the step, which share names; the feeds set the flag to P > 0, and validation
also runs it flipped).
``--position-ids`` adds a ``position_ids [B, S]`` input (as Optimum / onnxruntime-genai exports
take it: ``cumsum(mask) - 1``, so a left-padded row's tokens count from its first real token).
Families: the zoo's GPT-2 and LLaMA and arch_sweep's decoders (``BASES``); ``kv_factory(spec)``
returns (module, example inputs, dynamic dim names).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's onnxopt

from benchmarks import arch_sweep
from benchmarks.arch_sweep import Row

# The sweep's decoder factories (use_cache=False configs; switched on here) and the zoo's two.
BASES: dict[str, str] = {
    "gpt2": "onnxopt.zoo.transformers_models:gpt2_tiny",
    "llama": "onnxopt.zoo.transformers_models:llama_tiny",
    "mistral": "benchmarks.arch_sweep:mistral",
    "qwen2": "benchmarks.arch_sweep:qwen2",
    "phi": "benchmarks.arch_sweep:phi",
    "opt": "benchmarks.arch_sweep:opt",
    "gpt-neox": "benchmarks.arch_sweep:gpt_neox",
    "falcon": "benchmarks.arch_sweep:falcon",
    "qwen3": "benchmarks.arch_sweep:qwen3",
    "phi3": "benchmarks.arch_sweep:phi3",
    "gemma2": "benchmarks.arch_sweep:gemma2",
    "gemma3": "benchmarks.arch_sweep:gemma3",
    "olmo2": "benchmarks.arch_sweep:olmo2",
    "cohere": "benchmarks.arch_sweep:cohere",
    "gptj": "benchmarks.arch_sweep:gptj",
    "glm": "benchmarks.arch_sweep:glm",
    "helium": "benchmarks.arch_sweep:helium",
    "ernie4-5": "benchmarks.arch_sweep:ernie4_5",
    "smollm3": "benchmarks.arch_sweep:smollm3",
    "exaone4": "benchmarks.arch_sweep:exaone4",
    "olmo": "benchmarks.arch_sweep:olmo",
    "seed-oss": "benchmarks.arch_sweep:seed_oss",
    "deepseek-v3": "benchmarks.arch_sweep:deepseek_v3",
}
EXAMPLE = (2, 5, 3)  # B, P, S of the export's example inputs
# Validation sizes (B, P, S): the example, a prompt (no past), two decode steps.
SIZES = ((2, 5, 3), (1, 0, 4), (2, 7, 1), (1, 3, 1))
MASKS = ("ones", "left", "right")


def _step_module(model: Any, layers: int, positions: bool) -> Any:
    """``forward(input_ids, attention_mask, [position_ids,] *past)`` -> (last_hidden_state, k_0, v_0, k_1, ...)."""
    import torch
    from transformers import DynamicCache

    class _CacheStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.output_names = (
                "last_hidden_state",
                *(f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")),
            )

        def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            input_ids, attention_mask = args[0], args[1]
            position_ids = args[2] if positions else None
            past = args[3:] if positions else args[2:]
            pairs = [(past[2 * i], past[2 * i + 1]) for i in range(layers)]
            cache = DynamicCache(pairs, config=self.model.config)
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                return_dict=True,
            )
            present = out.past_key_values
            result = [out.last_hidden_state]
            for i in range(layers):
                result += [present.layers[i].keys, present.layers[i].values]
            return tuple(result)

    return _CacheStep().eval()


def kv_factory(
    spec: str, attention: str = "eager", positions: bool = False
) -> tuple[Any, dict[str, Any], Any]:
    """(module, example inputs, dynamic shape names) of the cached decoder step of the model a
    no-cache factory ``spec`` builds (a ``BASES`` value, or e.g. the zoo's full-size ``llama``)."""
    import torch

    from onnxopt.export import _import_factory

    previous = arch_sweep.ATTENTION["implementation"]
    arch_sweep.ATTENTION["implementation"] = attention
    try:
        wrapped, _, _ = _import_factory(spec)()
    finally:
        arch_sweep.ATTENTION["implementation"] = previous
    model = wrapped.model
    model.set_attn_implementation(attention)
    model.config.use_cache = True
    batch, past_len, seq = EXAMPLE
    vocab = min(int(model.config.vocab_size), 1000)
    torch.manual_seed(0)
    with torch.no_grad():  # a real past: the model's own cache of P earlier tokens
        prompt = torch.randint(0, vocab, (batch, past_len))
        cache = model(input_ids=prompt, use_cache=True, return_dict=True).past_key_values
    layers = len(cache.layers)
    inputs: dict[str, Any] = {
        "input_ids": torch.randint(0, vocab, (batch, seq)),
        "attention_mask": torch.ones(batch, past_len + seq, dtype=torch.int64),
    }
    # One left-padded row, so that the eager reference checks the mask.
    inputs["attention_mask"][1, :2] = 0
    dynamic: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total"},
    }
    if positions:
        inputs["position_ids"] = torch.from_numpy(_positions(inputs["attention_mask"].numpy(), seq))
        dynamic["position_ids"] = {0: "batch", 1: "sequence"}
    for i in range(layers):
        for kind, tensor in (("key", cache.layers[i].keys), ("value", cache.layers[i].values)):
            inputs[f"past.{i}.{kind}"] = tensor.clone()
            dynamic[f"past.{i}.{kind}"] = {0: "batch", 2: "past"}
    return _step_module(model, layers, positions), inputs, dynamic


def export_kv(
    spec: str,
    exporter: str,
    path: Path,
    attention: str = "eager",
    positions: bool = False,
    opset: int | None = None,
) -> None:
    """Export the cached step; dynamo derives ``total = past + sequence`` itself (Dim.AUTO).
    TorchScript exports at ``opset`` (default 17; Optimum's decoders: 13-14)."""
    import torch

    from onnxopt.reference import Reference, reference_path_for, save_reference

    module, inputs, dynamic = kv_factory(spec, attention, positions)
    names = list(inputs)
    with torch.no_grad():
        eager = module(*inputs.values())
    if exporter == "dynamo":
        auto = torch.export.Dim.AUTO
        shapes = tuple({axis: auto for axis in dynamic[name]} for name in names)
        program = torch.onnx.export(
            module,
            tuple(inputs.values()),
            dynamo=True,
            input_names=names,
            output_names=list(module.output_names),
            dynamic_shapes=(shapes,),
            verbose=False,
        )
        assert program is not None
        program.save(str(path), external_data=False)
    else:
        outputs = {"last_hidden_state": {0: "batch", 1: "sequence"}}
        outputs.update({name: {0: "batch", 2: "total"} for name in module.output_names[1:]})
        torch.onnx.export(
            module,
            tuple(inputs.values()),
            str(path),
            dynamo=False,
            input_names=names,
            output_names=list(module.output_names),
            dynamic_axes={**dynamic, **outputs},
            opset_version=opset or 17,
        )
    reference = Reference(
        {name: value.numpy() for name, value in inputs.items()},
        {name: value.numpy() for name, value in zip(module.output_names, eager, strict=True)},
        {"model": f"{spec} (KV cache)", "exporter": exporter},
    )
    save_reference(reference_path_for(path), reference)


def merge_decoders(decoder: Any, decoder_with_past: Any) -> Any:
    """An Optimum-style merged decoder (``decoder_model_merged.onnx``) of two ``onnx.ModelProto``.

    One ``If(use_cache_branch)`` node: the with-past graph is the then-branch, the other the
    else-branch, each keeping its nodes, its declared outputs and its node and value names (two
    exports of one model repeat each other's), with no value_info; every initializer is moved to
    the main graph, shared by name (the same name must hold the same tensor). The main graph takes
    the union of both graphs' inputs and a ``use_cache_branch`` bool of shape [1].
    """
    import onnx
    import onnx.helper as oh

    initializers: dict[str, Any] = {}
    inputs: dict[str, Any] = {}
    for model in (decoder, decoder_with_past):
        for tensor in model.graph.initializer:
            known = initializers.setdefault(tensor.name, tensor)
            if known.SerializeToString() != tensor.SerializeToString():
                raise ValueError(f"initializer {tensor.name} differs between the two decoders")
        for value in model.graph.input:
            if value.name not in initializers:
                inputs.setdefault(value.name, value)

    def branch(model: Any, name: str) -> Any:
        return oh.make_graph(list(model.graph.node), name, [], list(model.graph.output))

    outputs = [o.name for o in decoder.graph.output]
    if outputs != [o.name for o in decoder_with_past.graph.output]:
        raise ValueError("the two decoders have different outputs")
    flag = oh.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL, [1])
    node = oh.make_node(
        "If",
        ["use_cache_branch"],
        outputs,
        name="merged_if",
        then_branch=branch(decoder_with_past, "with_past"),
        else_branch=branch(decoder, "no_past"),
    )
    graph = oh.make_graph(
        [node],
        "merged",
        [*inputs.values(), flag],
        list(decoder.graph.output),
        list(initializers.values()),
    )
    return oh.make_model(graph, opset_imports=decoder.opset_import, ir_version=decoder.ir_version)


def save_merged(step: Path, target: Path) -> Path:
    """Write the cached step ``step`` as an Optimum merged decoder of itself (both branches, as
    two exports of one model would give) to ``target``; a past of length 0 runs the prompt."""
    import onnx

    proto = onnx.load(str(step))
    onnx.save(merge_decoders(proto, proto), str(target))
    return target


def _mask(batch: int, total: int, seq: int, pattern: str) -> np.ndarray:
    """All ones, or row 0 padded: on the left (its first tokens) or on the right of the past
    (its last past tokens, the new ones kept), leaving every query at least one key."""
    mask = np.ones((batch, total), dtype=np.int64)
    past = total - seq
    pad = max(1, past // 2) if past else min(seq - 1, 2)
    if pattern == "left" and pad:
        mask[0, :pad] = 0
    elif pattern == "right" and past:
        mask[0, past - pad : past] = 0
    return mask


def _positions(mask: np.ndarray, seq: int) -> np.ndarray:
    """transformers' generate(): ``cumsum(mask) - 1`` (pads at 1), the last ``seq`` columns."""
    positions = np.cumsum(mask, axis=1) - 1
    positions[mask == 0] = 1
    return np.ascontiguousarray(positions[:, mask.shape[1] - seq :]).astype(np.int64)


def kv_inputs(
    model: Any,
    sizes: tuple[tuple[int, int, int], ...] = SIZES,
    masks: tuple[str, ...] = MASKS,
) -> list[dict[str, Any]]:
    """Consistent feeds for a cached step (``ir.Model``): each (B, P, S) with each mask pattern."""
    rng = np.random.default_rng(0)
    feeds = []
    for batch, past, seq in sizes:
        for pattern in masks:
            if pattern != "ones" and batch == 1 and past == 0 and seq == 1:
                continue
            feed: dict[str, Any] = {}
            for value in model.graph.inputs:
                name = value.name
                if name == "input_ids":
                    feed[name] = rng.integers(0, 1000, (batch, seq)).astype(np.int64)
                elif name == "attention_mask":
                    feed[name] = _mask(batch, past + seq, seq, pattern)
                elif name == "position_ids":
                    feed[name] = _positions(_mask(batch, past + seq, seq, pattern), seq)
                elif name == "use_cache_branch":  # a merged decoder: the cached branch with a past
                    feed[name] = np.array([past > 0])
                else:
                    heads, size = value.shape[1], value.shape[3]
                    feed[name] = rng.standard_normal((batch, heads, past, size)).astype(np.float32)
            feeds.append(feed)
    return feeds


def sweep_one(
    family: str,
    exporter: str,
    out: Path,
    attention: str,
    explain: bool,
    positions: bool = False,
    target: str = "ort",
    opset: int | None = None,
    merged: bool = False,
    enable: tuple[str, ...] = (),
    export_opset: int | None = None,
) -> Row:
    """arch_sweep's row (nodes, fused ops, validated, fixed point) for the cached step (with
    ``merged``, wrapped as an Optimum merged decoder)."""
    return arch_sweep.sweep_one(
        family,
        exporter,
        out,
        explain,
        target,
        opset,
        export_to=partial(
            _export_to, family, exporter, attention, positions, merged=merged, opset=export_opset
        ),
        inputs_for=kv_inputs,
        stem=f"{family}_kv{'_pos' if positions else ''}{'_merged' if merged else ''}",
        enable=enable,
    )


def _export_to(
    family: str,
    exporter: str,
    attention: str,
    positions: bool,
    path: Path,
    merged: bool = False,
    opset: int | None = None,
) -> None:
    export_kv(BASES[family], exporter, path, attention, positions, opset)
    if merged:
        from onnxopt.reference import Reference, load_reference, reference_path_for, save_reference

        save_merged(path, path)
        eager = load_reference(reference_path_for(path))
        # The example has a past: the cached branch.
        inputs = {**eager.inputs, "use_cache_branch": np.array([True])}
        save_reference(reference_path_for(path), Reference(inputs, eager.outputs, eager.metadata))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--families", default="", help="comma-separated: " + ", ".join(BASES))
    parser.add_argument("--exporters", default="torchscript,dynamo")
    parser.add_argument("--attention", default="eager", choices=("eager", "sdpa"))
    parser.add_argument("--out", type=Path, default=None, help="keep the exports here")
    parser.add_argument("--explain", action="store_true", help="print fusion --explain notes")
    parser.add_argument("--position-ids", action="store_true", help="a position_ids [B, S] input")
    parser.add_argument("--target", default="ort", choices=("ort", "onnx"))
    parser.add_argument("--opset", type=int, default=None, help="raise the opset first (23)")
    parser.add_argument(
        "--merged", action="store_true", help="wrap each step as an Optimum merged decoder"
    )
    parser.add_argument("--enable", default="", help="comma-separated opt-in passes")
    parser.add_argument(
        "--export-opset", type=int, default=None, help="TorchScript export opset (default 17)"
    )
    args = parser.parse_args(argv)
    enable = tuple(name.strip() for name in args.enable.split(",") if name.strip())
    sys.modules.setdefault("benchmarks.kv_sweep", sys.modules[__name__])
    families = [f.strip() for f in args.families.split(",") if f.strip()] or list(BASES)
    unknown = [f for f in families if f not in BASES]
    if unknown:
        parser.error(f"unknown families: {', '.join(unknown)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="kv_sweep_"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"KV cache; attention: {args.attention}; exports in {out}\n")
    print(
        "| family | exporter | status | nodes | fused (after) | validated | vs eager max abs "
        "| fixed point | s |"
    )
    print("|---|---|---|---:|---|---|---|---|---:|")
    rows: list[Row] = []
    for family in families:
        for exporter in args.exporters.split(","):
            row = sweep_one(
                family,
                exporter,
                out,
                args.attention,
                args.explain,
                args.position_ids,
                args.target,
                args.opset,
                args.merged,
                enable,
                args.export_opset,
            )
            rows.append(row)
            print(row.markdown(), flush=True)
    arch_sweep.print_notes(rows)


if __name__ == "__main__":
    main()
