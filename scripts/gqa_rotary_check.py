"""Does com.microsoft.GroupQueryAttention with do_rotary=1 equal two RotaryEmbedding nodes + GQA?

ORT CPU, optimizations off. Caches [S, d/2] from LLaMA angles, RotaryEmbedding position_ids the
one-element [0] offset form, seqlens_k = S-1 for every row, attention_bias with or without left
padding, causal 0 and 1, interleaved 0 and 1, with and without a head_sink (input 11, GPT-OSS's
attention sinks), and a partial rotary (the first 16 dims of heads of 32, caches [S, 8]). Prints
the max abs difference of the output and of present_key (the rotated keys, every token of every
row) per case (must be 0.0 to fold).

    PYTHONPATH=. /work/main/.venv/bin/python scripts/gqa_rotary_check.py
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

HEADS, KV_HEADS, HEAD = 4, 2, 16
F = TensorProto.FLOAT


def build(
    fused: bool,
    causal: int,
    interleaved: int = 0,
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
    head: int = HEAD,
    sinks: bool = False,
    rotary: int | None = None,
) -> onnx.ModelProto:
    half = (rotary or head) // 2
    inputs = [
        helper.make_tensor_value_info("q", F, ["B", "S", heads * head]),
        helper.make_tensor_value_info("k", F, ["B", "S", kv_heads * head]),
        helper.make_tensor_value_info("v", F, ["B", "S", kv_heads * head]),
        helper.make_tensor_value_info("cos", F, ["S", half]),
        helper.make_tensor_value_info("sin", F, ["S", half]),
        helper.make_tensor_value_info("bias", F, ["B", 1, "S", "S"]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    if sinks:
        inputs.append(helper.make_tensor_value_info("sinks", F, [heads]))
    nodes = []
    inits = [helper.make_tensor("pos", TensorProto.INT64, [1], [0])]
    attrs = dict(num_heads=heads, kv_num_heads=kv_heads, causal=causal, scale=head**-0.5)
    if fused:
        gqa_in = ["q", "k", "v", "", "", "seqlens_k", "total", "cos", "sin", "", "bias"]
        attrs.update(do_rotary=1, rotary_interleaved=interleaved)
    else:
        for name, n in (("q", heads), ("k", kv_heads)):
            nodes.append(
                helper.make_node(
                    "RotaryEmbedding",
                    [name, "pos", "cos", "sin"],
                    [name + "r"],
                    domain="com.microsoft",
                    num_heads=n,
                    interleaved=interleaved,
                    **({"rotary_embedding_dim": rotary} if rotary else {}),
                )
            )
        gqa_in = ["qr", "kr", "v", "", "", "seqlens_k", "total", "", "", "", "bias"]
    if sinks:
        gqa_in.append("sinks")
    nodes.append(
        helper.make_node(
            "GroupQueryAttention", gqa_in, ["y", "pk", "pv"], domain="com.microsoft", **attrs
        )
    )
    out = [helper.make_tensor_value_info(n, F, None) for n in ("y", "pk")]
    graph = helper.make_graph(nodes, "g", inputs, out, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def feeds(
    batch: int,
    seq: int,
    pad: bool,
    rng: np.random.Generator,
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
    head: int = HEAD,
    rotary: int | None = None,
) -> dict[str, np.ndarray]:
    width = rotary or head
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, width, 2, dtype=np.float32) / width))
    angles = np.arange(seq, dtype=np.float32)[:, None] * inv_freq[None, :]
    mask = np.tril(np.ones((seq, seq), dtype=bool))[None].repeat(batch, 0)
    if pad:  # left padding: row b's first b keys masked (every query row sees them masked)
        for b in range(batch):
            mask[b, :, : min(b + 1, seq - 1) if seq > 1 else 0] = False
    bias = np.where(mask, 0.0, np.finfo(np.float32).min).astype(np.float32)[:, None]
    return {
        "q": rng.standard_normal((batch, seq, heads * head), dtype=np.float32),
        "k": rng.standard_normal((batch, seq, kv_heads * head), dtype=np.float32),
        "v": rng.standard_normal((batch, seq, kv_heads * head), dtype=np.float32),
        "cos": np.cos(angles).astype(np.float32),
        "sin": np.sin(angles).astype(np.float32),
        "bias": bias,
        "seqlens_k": np.full((batch,), seq - 1, dtype=np.int32),
        "total": np.array(seq, dtype=np.int32),
        "sinks": rng.standard_normal(heads, dtype=np.float32),
    }


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


# (label, build/feeds keywords): whole heads with and without sinks, and a partial rotary (2
# heads of 32, 1 K/V head, their first 16 dims rotated from [S, 8] caches)
SHAPES: list[tuple[str, dict[str, int | bool]]] = [
    ("sinks=False", {}),
    ("sinks=True ", {"sinks": True}),
    ("partial 16/32", {"heads": 2, "kv_heads": 1, "head": 32, "rotary": 16}),
]


def main() -> None:
    rng = np.random.default_rng(0)
    worst = 0.0
    for (label, shape), causal, interleaved in itertools.product(SHAPES, (0, 1), (0, 1)):
        ref = session(build(False, causal, interleaved, **shape))  # type: ignore[arg-type]
        new = session(build(True, causal, interleaved, **shape))  # type: ignore[arg-type]
        sizes = {k: v for k, v in shape.items() if k != "sinks"}
        for batch, seq, pad in itertools.product((1, 3), (1, 5, 16), (False, True)):
            f = feeds(batch, seq, pad, rng, **sizes)  # type: ignore[arg-type]
            if not shape.get("sinks"):
                del f["sinks"]
            a, a_key = ref.run(["y", "pk"], f)
            b, b_key = new.run(["y", "pk"], f)
            # present_key holds the rotated keys of every row, padded tokens included: equal
            # caches mean GQA rotated token s of every row at position s.
            diff = max(float(np.max(np.abs(a - b))), float(np.max(np.abs(a_key - b_key))))
            worst = max(worst, diff)
            print(
                f"{label} causal={causal} interleaved={interleaved} B={batch} S={seq:2d} "
                f"pad={pad!s:5}: max |diff| = {diff:.3g}"
            )
    print("EXACT" if worst == 0.0 else f"DIFFERS (worst {worst:.3g})")


if __name__ == "__main__":
    main()
