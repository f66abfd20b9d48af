"""Check com.microsoft.RotaryEmbedding(interleaved=1) on ONNX Runtime against a numpy reference.

    y[2i] = x[2i]*cos[i] - x[2i+1]*sin[i],   y[2i+1] = x[2i+1]*cos[i] + x[2i]*sin[i]

for i < r/2 (the first r dims of each head); dims past r pass through. Inputs: 3-D [B, S, H*d] with
num_heads, position_ids = [0] (offset form: token s reads cache row s), caches [max_pos, r/2].
The reference is the GPT-J graph's own arithmetic (x*cos + rotate_every_two(x)*sin in float32),
so a zero difference would mean the fused op gives exactly what the unfused graph gives.
Measured on ORT 1.32 CPU: not bit for bit, within 1-2 ulp of the operands' scale (the kernel rounds
x1*cos - x2*sin differently, e.g. fused multiply-add).

    PYTHONPATH=. python scripts/interleaved_rotary_check.py
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper


def reference(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, heads: int, rot: int) -> np.ndarray:
    batch, seq, hidden = x.shape
    v = x.reshape(batch, seq, heads, hidden // heads)
    part = v[..., :rot]
    c = np.repeat(cos[:seq], 2, axis=-1)[None, :, None, :]
    s = np.repeat(sin[:seq], 2, axis=-1)[None, :, None, :]
    rotated = np.stack((-part[..., 1::2], part[..., ::2]), -1).reshape(part.shape)
    out = np.concatenate([part * c + rotated * s, v[..., rot:]], -1)
    return out.reshape(x.shape)


def run(batch: int, seq: int, heads: int, head: int, rot: int, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    max_pos = 64
    angles = rng.uniform(-4, 4, (max_pos, rot // 2)).astype(np.float32)
    cos, sin = np.cos(angles), np.sin(angles)
    attrs: dict[str, int] = {"interleaved": 1, "num_heads": heads}
    if rot < head:
        attrs["rotary_embedding_dim"] = rot
    node = helper.make_node(
        "RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft", **attrs
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", heads * head])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", heads * head])],
        [
            helper.make_tensor("pos", TensorProto.INT64, [1], [0]),
            onnx.numpy_helper.from_array(cos, "cos"),
            onnx.numpy_helper.from_array(sin, "sin"),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    )
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    x = rng.standard_normal((batch, seq, heads * head)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    want = reference(x, cos, sin, heads, rot)
    # ulp of the operands' scale: a cancelling difference x1*cos - x2*sin is rounded from there.
    scale = np.maximum(np.maximum(np.abs(want), np.abs(x)), np.float32(1e-30))
    ulps = np.abs(y - want) / np.spacing(scale)
    return float(np.max(np.abs(y - want))), float(np.max(ulps))


def main() -> None:
    for batch, seq, heads, head, rot in [(1, 1, 4, 16, 8), (2, 7, 4, 16, 8), (3, 33, 2, 16, 16)]:
        diff, ulps = run(batch, seq, heads, head, rot, seed=seq)
        print(
            f"B={batch} S={seq} H={heads} d={head} r={rot}: "
            f"max |ort - numpy| = {diff:.3g} ({ulps:.0f} ulp)"
        )


if __name__ == "__main__":
    main()
