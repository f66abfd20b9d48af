"""TensorFlow transformers converted by tf2onnx, as Keras users export them.

The models in tests/data/tf2onnx are real tf2onnx 1.17 conversions of transformers' TF classes
(TensorFlow 2.17, width 16, 2 layers, 4 heads, every weight redrawn so that biases and LayerNorm
shifts are nonzero), made by ``scripts/export_tf_models.py``. tf2onnx writes what no PyTorch
exporter does: Keras' LayerNormalization as ``x * m + (beta - mean * m)`` with its means as
GlobalAveragePools, every Dense as a Tensordot (a [-1, K] view, a 2-D MatMul, a view back), shape
arithmetic in int32 cast back to int64, the query scaled before its heads move (DistilBERT), and
TensorFlow's 1e-9 added to the scores before the Softmax (BART).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from onnxopt import api, io

DATA = Path(__file__).resolve().parent / "data" / "tf2onnx"

# name -> op counts the optimized model must have (packed attention per layer, a LayerNorm per
# norm, no flattening views or int32 round trips left)
EXPECTED = {
    "bert": {"Attention": 2, "LayerNormalization": 5, "MatMul": 6, "Reshape": 1},
    "distilbert": {"Attention": 2, "LayerNormalization": 5, "MatMul": 6, "Reshape": 1},
    "bart-encoder": {"Attention": 2, "LayerNormalization": 5, "MatMul": 6, "Reshape": 0},
}
GONE = ("GlobalAveragePool", "ReduceMean", "Softmax", "Transpose", "Sqrt", "Reciprocal")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tf2onnx_transformer_fuses_and_validates(name: str, tmp_path: Path) -> None:
    source = DATA / f"{name}.onnx"
    result = api.optimize(source)
    assert result.validated, result.report.validation
    # tf2onnx names every input dim apart (unk__301...): sizes per axis make B and S agree
    # at a size other than 1 and 2
    trials = result.report.validation.trials  # type: ignore[union-attr]
    assert any(min(shape) >= 3 for trial in trials for shape in trial.values()), trials
    ops = Counter(node.op_type for node in result.model.graph)
    for op, count in EXPECTED[name].items():
        assert ops[op] == count, (op, ops)
    assert not any(ops[op] for op in GONE), ops
    assert not any(
        node.op_type == "Cast"
        and node.outputs[0].dtype is not None
        and node.outputs[0].dtype.name == "INT64"
        for node in result.model.graph
    ), ops
    first = io.save_model(result.model, tmp_path / "once.onnx").read_bytes()
    again = api.optimize(tmp_path / "once.onnx", check=False)
    assert io.save_model(again.model, tmp_path / "twice.onnx").read_bytes() == first
