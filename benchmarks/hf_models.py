"""Transformer models built from transformers configs (seeded random weights, no downloads), as bench factories.

Each factory returns ``(module, example_inputs)`` as ``onnxopt bench --torch`` expects: the module
takes input_ids, attention_mask (and token_type_ids) positionally, as the exported graph does. ``export`` writes the ONNX file (TorchScript exporter, dynamic
batch and sequence axes) that the benchmark scripts time.

    .venv/bin/python benchmarks/hf_models.py bert_base out/bert_base.onnx
    onnxopt bench out/bert_base.onnx --torch benchmarks/hf_models.py:bert_base
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

SEQUENCE = 128


def _encoder_inputs(vocab: int, batch: int = 1, sequence: int = SEQUENCE) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(0, vocab, (batch, sequence), generator=generator),
        "attention_mask": torch.ones(batch, sequence, dtype=torch.int64),
    }


def _bert(layers: int, hidden: int, heads: int) -> tuple[Any, dict[str, Any]]:
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        attn_implementation="eager",
    )
    inputs = _encoder_inputs(config.vocab_size)
    inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
    model = _keywords(
        BertModel(config).eval(), tuple(inputs), ("last_hidden_state", "pooler_output")
    )
    return model, tuple(inputs.values())


def bert_base() -> tuple[Any, dict[str, Any]]:
    """BERT-base: 12 layers, hidden 768, 12 heads (110 M parameters)."""
    return _bert(12, 768, 12)


def bert_tiny() -> tuple[Any, dict[str, Any]]:
    return _bert(2, 128, 2)


def distilbert() -> tuple[Any, dict[str, Any]]:
    """DistilBERT-base: 6 layers, hidden 768."""
    import torch
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(0)
    config = DistilBertConfig(attn_implementation="eager")
    inputs = _encoder_inputs(config.vocab_size)
    return _keywords(DistilBertModel(config).eval(), tuple(inputs), ("last_hidden_state",)), tuple(
        inputs.values()
    )


def _keywords(model: Any, names: tuple[str, ...], outputs: tuple[str, ...], **fixed: Any) -> Any:
    """Wrap a transformers model: positional tensor inputs in, a tuple of named outputs out (export-friendly)."""
    import torch

    class Keywords(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: Any) -> Any:
            result = self.model(**dict(zip(names, tensors, strict=True)), **fixed)
            values = tuple(getattr(result, o) for o in outputs)
            return values[0] if len(values) == 1 else values

    return Keywords().eval()


def gpt2() -> tuple[Any, dict[str, Any]]:
    """GPT-2 small: 12 layers, hidden 768, no KV cache."""
    import torch
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(attn_implementation="eager")
    inputs = _encoder_inputs(config.vocab_size)
    model = _keywords(
        GPT2Model(config).eval(), tuple(inputs), ("last_hidden_state",), use_cache=False
    )
    return model, tuple(inputs.values())


FACTORIES = {"bert_base": bert_base, "bert_tiny": bert_tiny, "distilbert": distilbert, "gpt2": gpt2}


def export(name: str, path: Path) -> Path:
    """Export factory ``name`` to ``path`` (TorchScript exporter, opset 17, dynamic batch and sequence)."""
    import torch

    module, inputs = FACTORIES[name]()
    names = ["input_ids", "attention_mask", "token_type_ids"][: len(inputs)]
    with torch.no_grad():
        probe = module(*inputs)
    outputs = (
        ["last_hidden_state"]
        if isinstance(probe, torch.Tensor)
        else ["last_hidden_state", "pooler_output"]
    )
    dynamic = {n: {0: "batch", 1: "sequence"} for n in [*names, "last_hidden_state"]}
    dynamic["pooler_output"] = {0: "batch"}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        module,
        inputs,
        str(path),
        input_names=names,
        output_names=outputs,
        dynamic_axes={k: v for k, v in dynamic.items() if k in names or k in outputs},
        opset_version=17,
        dynamo=False,
    )
    return path


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in FACTORIES:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(FACTORIES)}}} OUT.onnx")
    print(export(sys.argv[1], Path(sys.argv[2])))
