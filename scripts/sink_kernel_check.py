"""What ONNX Runtime's GroupQueryAttention computes with ``head_sink`` (input 11), on CPU.

Compares the kernel with a numpy reference of GPT-OSS's eager attention (transformers'
``eager_attention_forward`` for GptOss):

    logits = concat([Q @ K^T * scale + mask, sink[h]], -1)    (one extra column per head)
    logits = logits - logits.max(-1, keepdims=True)            (the stabilizer; softmax ignores it)
    probs  = softmax(logits)[..., :-1]                         (the sink's column dropped)
    out    = probs @ V

on random Q/K/V (4 query heads, 2 K/V heads) with masks of float32's lowest: causal, causal with
a right-padded row, causal with a left-padded row whose first queries see no key at all (there the
export gives zeros: the sink takes the whole row), and a sliding window of 3 keys with and without
the padding. Each with ``causal=0`` and ``causal=1`` (the mask passed as ``attention_bias`` both
times), and ``causal=1`` with ``local_window_size`` around the window. Also the kernel without
``head_sink`` against the same reference, to show the sink is what makes the difference.

    PYTHONPATH=. python scripts/sink_kernel_check.py
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from scripts.softcap_kernel_check import session  # ORT CPU, graph optimizations off

B, S, H, NKV, D = 2, 7, 4, 2, 16
WINDOW = 3
LOWEST = float(np.finfo(np.float32).min)


def reference(q, k, v, mask, sinks, scale):
    """GPT-OSS's eager attention in float32: q [B, H, S, d], k/v [B, Nkv, T, d], mask [b, 1, S, T]."""
    k, v = np.repeat(k, H // NKV, 1), np.repeat(v, H // NKV, 1)
    scores = (q @ k.transpose(0, 1, 3, 2)) * np.float32(scale) + mask
    column = np.broadcast_to(sinks.reshape(1, H, 1, 1), (*scores.shape[:3], 1))
    logits = np.concatenate([scores, column], -1)
    logits = logits - logits.max(-1, keepdims=True)
    e = np.exp(logits)
    return (e / e.sum(-1, keepdims=True))[..., :-1] @ v


def gqa(q, k, v, mask, sinks, scale, causal, window=-1):
    """GroupQueryAttention without a past: q [B, S, H*d], k/v [B, S, Nkv*d], mask as
    attention_bias (input 10), ``sinks`` as head_sink (input 11) unless None."""
    inputs = ["q", "k", "v", "", "", "seqlens_k", "total", "", "", "", "bias"]
    f = TensorProto.FLOAT
    graph_inputs = [helper.make_tensor_value_info(n, f, None) for n in ("q", "k", "v")]
    graph_inputs += [
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, None),
        helper.make_tensor_value_info("total", TensorProto.INT32, None),
        helper.make_tensor_value_info("bias", f, None),
    ]
    if sinks is not None:
        inputs.append("sinks")
        graph_inputs.append(helper.make_tensor_value_info("sinks", f, None))
    node = helper.make_node(
        "GroupQueryAttention",
        inputs,
        ["y"],
        domain="com.microsoft",
        num_heads=H,
        kv_num_heads=NKV,
        scale=scale,
        causal=causal,
        local_window_size=window,
    )
    graph = helper.make_graph(
        [node], "g", graph_inputs, [helper.make_tensor_value_info("y", f, None)]
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    feeds = {
        "q": q.transpose(0, 2, 1, 3).reshape(B, S, H * D),
        "k": k.transpose(0, 2, 1, 3).reshape(B, S, NKV * D),
        "v": v.transpose(0, 2, 1, 3).reshape(B, S, NKV * D),
        "seqlens_k": np.full([B], S - 1, np.int32),
        "total": np.array(S, np.int32),
        "bias": np.broadcast_to(mask, (B, 1, S, S)).copy(),
    }
    if sinks is not None:
        feeds["sinks"] = sinks
    (y,) = session(graph, opsets).run(None, feeds)
    return y.reshape(B, S, H, D).transpose(0, 2, 1, 3)


def masks() -> dict[str, np.ndarray]:
    query, key = np.arange(S)[:, None], np.arange(S)[None, :]
    causal = (key > query)[None, None]
    window = (key <= query - WINDOW)[None, None]  # keeps keys i-2..i
    left = np.zeros((B, 1, S, S), bool)
    left[1, :, :, :2] = True  # row 1: two padded keys
    left[1, :, :2, :] = True  # and its two padded queries see no key
    right = np.zeros((B, 1, S, S), bool)
    right[1, :, :, 5:] = True
    cases = {
        "causal": causal,
        "causal, right padding": causal | right,
        "causal, left padding": causal | left,
        f"window {WINDOW}": causal | window,
        f"window {WINDOW}, left padding": causal | window | left,
    }
    return {name: np.where(m, LOWEST, 0.0).astype(np.float32) for name, m in cases.items()}


def main() -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, H, S, D)).astype(np.float32)
    k = rng.standard_normal((B, NKV, S, D)).astype(np.float32)
    v = rng.standard_normal((B, NKV, S, D)).astype(np.float32)
    sinks = (2 * rng.standard_normal(H)).astype(np.float32)
    scale = D**-0.5
    print("| mask | GQA call | max abs vs GPT-OSS eager | rows without keys: max abs output |")
    print("|---|---|---:|---:|")
    for name, mask in masks().items():
        expected = reference(q, k, v, mask, sinks, scale)
        calls = {"causal=0": (0, -1), "causal=1": (1, -1)}
        calls.update({f"causal=1, local_window_size={w}": (1, w) for w in (2, 3, 4)})
        for call, (causal, window) in calls.items():
            got = gqa(q, k, v, mask, sinks, scale, causal, window)
            empty = f"{np.abs(got[1, :, :2]).max():.2g}" if "left" in name else "-"
            print(f"| {name} | {call} | {np.abs(got - expected).max():.2g} | {empty} |")
        got = gqa(q, k, v, mask, None, scale, 0)
        print(f"| {name} | causal=0, no head_sink | {np.abs(got - expected).max():.2g} | - |")


if __name__ == "__main__":
    main()
