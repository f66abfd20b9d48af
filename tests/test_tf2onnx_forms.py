"""TensorFlow transformers converted by tf2onnx, as Keras users export them.

The models in tests/data/tf2onnx are real tf2onnx 1.17 conversions of transformers' TF classes
(TensorFlow 2.17, width 16, 2 layers, 4 heads, every weight redrawn so that biases and LayerNorm
shifts are nonzero), made by ``scripts/export_tf_models.py``. tf2onnx writes what no PyTorch
exporter does: Keras' LayerNormalization as ``x * m + (beta - mean * m)`` with its means as
GlobalAveragePools, every Dense as a Tensordot (a [-1, K] view, a 2-D MatMul, a view back), shape
arithmetic in int32 cast back to int64, the query scaled before its heads move (DistilBERT), and
TensorFlow's 1e-9 added to the scores before the Softmax (BART).

T5's encoder computes its attention with tf.einsum. Three are Keras' own transformer block (layers.MultiHeadAttention, LayerNormalization, a Dense
FFN): converted from tf-keras with a padding mask (keras-encoder) or a padding and a causal mask
(keras-causal), and written by Keras 3's ``model.export(format="onnx")`` (keras3-encoder).
tf2onnx lowers their einsums to unsqueezed, transposed 5-D views around 3-D MatMuls, computes
the scores transposed (``K @ Q^T``, Softmax over axis 2), and writes Keras 3's ``where`` masks as
``Cast(c) * s + Cast(!c) * k``. Two are KerasHub's ``BertBackbone`` and ``GPT2Backbone``
(keras-hub 0.21), which compute their attention themselves. Whisper's encoder keeps its
residual stream channels-first after its convolutions (tf2onnx's transpose optimizer), each
LayerNorm computed over axis 1 and transposed.

flax-vit is transformers' Flax ViT converted the way JAX models reach ONNX, jax2tf then tf2onnx
(``scripts/export_flax_models.py``, JAX 0.4.30): its softmax spelled out with keepdims=0
statistics viewed back, its P @ V computed as (V^T @ P^T) moved to [B, S, H, d], its biases
broadcast to [1, 1, N]. Its LayerNorms compute max(0, E[x²] - E[x]²) and stay unfused.
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
    # Keras' own MultiHeadAttention (tf-keras, and Keras 3's model.export): every einsum lowered
    # to 5-D views around 3-D MatMuls, the scores transposed, Keras 3's masks as selects
    # T5's einsums too, its RMS norms as x * (rsqrt(mean(x²) + eps) * w); its relative position
    # bias is computed on [1, S, S, H] and transposed to the heads' layout
    "t5-encoder": {"Attention": 2, "SimplifiedLayerNormalization": 5, "MatMul": 6, "Transpose": 2},
    "keras-encoder": {"Attention": 2, "LayerNormalization": 4, "MatMul": 4, "Reshape": 0},
    "keras-causal": {"Attention": 2, "LayerNormalization": 4, "MatMul": 4, "Reshape": 1},
    "keras3-encoder": {"Attention": 2, "LayerNormalization": 4, "MatMul": 4, "Reshape": 0},
    # KerasHub's backbones (Keras 3's export): their own attention, scores transposed as
    # (K @ Q^T)^T, masked with where(c, s, -1e9) (fused with the fill raised to -1e30) and
    # zeroed where a row keeps no key; their output projections flattened for a Gemm, then
    # viewed back with the residual's shape (BERT's one Gemm left is its pooler's)
    "kerashub-bert": {"Attention": 2, "LayerNormalization": 5, "FusedMatMul": 2, "Gemm": 1},
    "kerashub-gpt2": {"Attention": 2, "LayerNormalization": 5, "FusedMatMul": 2},
    # Whisper's encoder: tf2onnx keeps the residual stream channels-first ([B, D, T]) after the
    # convolutions, so each norm's statistics are over axis 1 and its terms transposed; one
    # Transpose is left at the stream's start, the conv biases fold into the Convs
    "whisper-encoder": {"Attention": 2, "LayerNormalization": 5, "MatMul": 6, "Transpose": 1},
    # Flax ViT through jax2tf: packed attention and BiasGelu once the softmax is one op, P @ V is
    # read back and the biases are vectors; its five E[x²] - E[x]² norms keep their Sqrt and
    # Reciprocal, and the patch embedding its Transpose to [B, N, D]
    "flax-vit": {
        "Attention": 2,
        "BiasGelu": 2,
        "MatMul": 6,
        "Transpose": 1,
        "Sqrt": 5,
        "Reciprocal": 5,
    },
}
GONE = (
    "GlobalAveragePool", "ReduceMean", "Softmax", "Transpose", "Sqrt", "Reciprocal", "ReduceProd",
    "Gemm",
)  # fmt: skip


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
    assert not any(ops[op] for op in GONE if op not in EXPECTED[name]), ops
    assert not any(
        node.op_type == "Cast"
        and node.outputs[0].dtype is not None
        and node.outputs[0].dtype.name == "INT64"
        for node in result.model.graph
    ), ops
    first = io.save_model(result.model, tmp_path / "once.onnx").read_bytes()
    again = api.optimize(tmp_path / "once.onnx", check=False)
    assert io.save_model(again.model, tmp_path / "twice.onnx").read_bytes() == first
