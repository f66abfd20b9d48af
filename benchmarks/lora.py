"""fuse-parallel-matmuls on transformers fine-tuned with LoRA adapters and exported unmerged.

    PYTHONPATH=. .venv/bin/python benchmarks/lora.py --out lora [--models bert,gpt2,llama,llama_dora] [--budget 40]

Takes the zoo's BERT-base, GPT-2 and LLaMA-style (SmolLM-135M size) models and puts a rank-8 LoRA
adapter (alpha 16) on each target projection, in PEFT's eval form ``base(x) + B(A(x)) * alpha / r``
(BERT: query and value, PEFT's default for it; GPT-2 and LLaMA: every projection of attention and
MLP; GPT-2's Conv1D layers, which TorchScript exports as a Gemm between two Reshapes, too),
the adapters' weights seeded random as after training (B is not 0); ``llama_dora`` puts DoRA
adapters there instead (PEFT's form, the magnitudes within 10% of the adapted rows' norms).
Exports each with both exporters (``onnxopt export``, dynamic batch and sequence) unmerged and merged in PyTorch
(``W + B @ A * alpha / r``: what PEFT's ``merge_and_unload`` writes, the deploy form), optimizes
the unmerged export at -O2 with validation, again with ``--disable fuse-parallel-matmuls``, and
the merged export, then times the unmerged export against the three with ``onnxopt bench`` (ORT
CPU, ENABLE_ALL, interleaved, CPU clock, 2 threads, 2 x 128 tokens).

The factories (``benchmarks.lora:bert_lora`` etc.) also work with ``onnxopt export``; peft itself
is not needed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's onnxopt

BERT_TARGETS = ("query", "value")
GPT2_TARGETS = ("c_attn", "c_proj", "c_fc")
# transformers 5 names the projections of ViT and Whisper alike
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "out_proj", "fc1", "fc2")
DISTILBERT_TARGETS = ("q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2")
LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def with_lora(
    module: Any, targets: Sequence[str], rank: int = 8, alpha: int = 16, dora: bool = False
) -> Any:
    """``module`` with every Linear whose name ends with one of ``targets`` wrapped in a LoRA
    adapter (PEFT's eval forward, dropout gone); seeded, trained-like adapter weights. With
    ``dora``, a DoRA adapter: PEFT's ``base(x) + (m / |W'| - 1) * (x @ W^T) + m / |W'| * B(A(x)) * s``,
    W' = W + s * B @ A and its row norms taken in the graph, m the learned magnitudes."""
    import torch

    nn = torch.nn
    functional = torch.nn.functional

    class LoraLinear(nn.Module):
        def __init__(self, base: Any) -> None:
            super().__init__()
            self.base_layer = base
            # nn.Linear's weight is [out, in]; transformers' Conv1D (GPT-2) keeps [in, out]
            out_features, in_features = _oriented(base).shape
            self.lora_A = nn.Linear(in_features, rank, bias=False)
            self.lora_B = nn.Linear(rank, out_features, bias=False)
            self.lora_dropout = nn.Dropout(0.05)
            self.scaling = alpha / rank
            nn.init.normal_(self.lora_B.weight, std=0.02)
            self.magnitude = None
            if dora:
                with torch.no_grad():
                    norm = self._adapted_weight().norm(dim=1)
                    self.magnitude = nn.Parameter(norm * torch.empty_like(norm).uniform_(0.9, 1.1))

        def _adapted_weight(self) -> Any:
            """W + s * B @ A, [out, in]."""
            return _oriented(self.base_layer) + self.scaling * (
                self.lora_B.weight @ self.lora_A.weight
            )

        def forward(self, x: Any) -> Any:
            adapter = self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling
            if self.magnitude is None:
                return self.base_layer(x) + adapter
            scale = self.magnitude / self._adapted_weight().norm(dim=1).detach()
            plain = functional.linear(x, _oriented(self.base_layer))
            return self.base_layer(x) + (scale - 1) * plain + scale * adapter

    torch.manual_seed(2)
    chosen = [
        name
        for name, layer in module.named_modules()
        if _is_linear(layer) and name.split(".")[-1] in targets
    ]
    for name in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, child, LoraLinear(getattr(parent, child)))
    return module.eval()


def _is_linear(layer: Any) -> bool:
    import torch

    return isinstance(layer, torch.nn.Linear) or type(layer).__name__ == "Conv1D"


def _oriented(layer: Any) -> Any:
    """The layer's weight as [out, in] (a view of it)."""
    return layer.weight.T if type(layer).__name__ == "Conv1D" else layer.weight


def merged(module: Any) -> Any:
    """``module`` with every adapter merged into its base weight (PEFT's merge_and_unload)."""
    import torch

    with torch.no_grad():
        for name, layer in list(module.named_modules()):
            if not hasattr(layer, "lora_A"):
                continue
            base = layer.base_layer
            adapted = layer._adapted_weight()
            if layer.magnitude is not None:  # DoRA: rows rescaled to the learned magnitudes
                adapted = adapted * (layer.magnitude / adapted.norm(dim=1))[:, None]
            _oriented(base).copy_(adapted)
            parent_name, _, child = name.rpartition(".")
            setattr(module.get_submodule(parent_name) if parent_name else module, child, base)
    return module.eval()


def _factory(
    zoo_name: str, targets: Sequence[str], merge: bool, dora: bool = False
) -> Callable[[], Any]:
    """A factory for ``onnxopt export``: the zoo model ``zoo_name`` with adapters on ``targets``
    (DoRA ones with ``dora``), merged into the weights when ``merge``."""

    def build() -> Any:
        from onnxopt.zoo import transformers_models

        module, inputs, axes = getattr(transformers_models, zoo_name)()
        module = with_lora(module, targets, dora=dora)
        return (merged(module) if merge else module), inputs, axes

    return build


bert_lora = _factory("bert", BERT_TARGETS, merge=False)
bert_merged = _factory("bert", BERT_TARGETS, merge=True)
gpt2_lora = _factory("gpt2", GPT2_TARGETS, merge=False)
gpt2_merged = _factory("gpt2", GPT2_TARGETS, merge=True)
llama_lora = _factory("llama", LLAMA_TARGETS, merge=False)
llama_merged = _factory("llama", LLAMA_TARGETS, merge=True)
bert_lora_tiny = _factory("bert_tiny", BERT_TARGETS, merge=False)
gpt2_lora_tiny = _factory("gpt2_tiny", GPT2_TARGETS, merge=False)
llama_lora_tiny = _factory("llama_tiny", LLAMA_TARGETS, merge=False)
llama_dora = _factory("llama", LLAMA_TARGETS, merge=False, dora=True)
llama_dora_merged = _factory("llama", LLAMA_TARGETS, merge=True, dora=True)
llama_dora_tiny = _factory("llama_tiny", LLAMA_TARGETS, merge=False, dora=True)
distilbert_lora_tiny = _factory("distilbert_tiny", DISTILBERT_TARGETS, merge=False)
vit_lora_tiny = _factory("vit_tiny", PROJECTIONS, merge=False)
whisper_encoder_lora_tiny = _factory("whisper_encoder_tiny", PROJECTIONS, merge=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="bert,gpt2,llama")
    parser.add_argument("--exporters", default="torchscript,dynamo")
    parser.add_argument("--budget", type=float, default=40.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    onnxopt = [sys.executable, "-m", "onnxopt"]
    for name in args.models.split(","):
        for exporter in args.exporters.split(","):
            stem = args.out / f"{name}.{exporter}"
            paths = {kind: Path(f"{stem}.{kind}.onnx") for kind in ("lora", "merged")}
            # llama_dora: the DoRA model and llama_dora_merged; bert: bert_lora and bert_merged
            factories = {"lora": name if name.endswith("_dora") else f"{name}_lora",
                         "merged": f"{name}_merged"}  # fmt: skip
            for kind, path in paths.items():
                subprocess.run([*onnxopt, "export", f"benchmarks.lora:{factories[kind]}", "-o",
                                str(path), "--exporter", exporter], check=True)  # fmt: skip
            optimized = Path(f"{stem}.lora.opt.onnx")
            unmerged = Path(f"{stem}.lora.nomerge.onnx")
            deploy = Path(f"{stem}.merged.opt.onnx")
            subprocess.run([*onnxopt, "optimize", str(paths["lora"]), "-o", str(optimized)],
                           check=True)  # fmt: skip
            subprocess.run([*onnxopt, "optimize", str(paths["lora"]), "-o", str(unmerged),
                            "--disable", "fuse-parallel-matmuls", "--no-validate"], check=True)  # fmt: skip
            subprocess.run([*onnxopt, "optimize", str(paths["merged"]), "-o", str(deploy)],
                           check=True)  # fmt: skip
            print(f"\n## {name}, {exporter}\n", flush=True)
            subprocess.run([*onnxopt, "bench", str(paths["lora"]), "--optimized", str(optimized),
                            "--compare", f"no-merge={unmerged}", "--compare",
                            f"merged-in-torch={deploy}", "--shape", "input_ids:2x128",
                            "--shape", "attention_mask:2x128", "--budget", str(args.budget),
                            "--clock", "cpu", "--threads", "2", "--no-memory", "--ort-level", "all"],
                           check=True)  # fmt: skip


if __name__ == "__main__":
    main()
