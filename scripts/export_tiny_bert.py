"""Export a tiny randomly initialised BERT (2 layers, hidden 32) with both PyTorch exporters.

Writes OUT/bert_ts.onnx (TorchScript exporter, opset 17) and OUT/bert_dynamo.onnx (dynamo
exporter), both with dynamic batch and sequence dims; used to measure the cleanup passes on
transformer exports:

    .venv/bin/python scripts/export_tiny_bert.py /tmp/bert
    PYTHONPATH=. .venv/bin/python scripts/check_cleanup_passes.py /tmp/bert/bert_ts.onnx /tmp/bert/bert_dynamo.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import transformers


class Bert(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        config = transformers.BertConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
        self.bert = transformers.BertModel(config).eval()

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state, out.pooler_output


def main(out: Path) -> None:
    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    model = Bert().eval()
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    names = {
        "input_names": ["input_ids", "attention_mask"],
        "output_names": ["last_hidden_state", "pooler"],
    }
    dims = {0: "batch", 1: "seq"}
    torch.onnx.export(
        model,
        (ids, mask),
        str(out / "bert_ts.onnx"),
        dynamic_axes={"input_ids": dims, "attention_mask": dims},
        opset_version=17,
        dynamo=False,
        **names,  # type: ignore[arg-type]
    )
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=64)
    shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    torch.onnx.export(
        model,
        (ids, mask),
        str(out / "bert_dynamo.onnx"),
        dynamic_shapes=shapes,
        dynamo=True,
        **names,  # type: ignore[arg-type]
    )


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "out/bert"))
