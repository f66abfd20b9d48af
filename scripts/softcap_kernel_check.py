"""Where ONNX Runtime applies ``softcap`` in GroupQueryAttention and ONNX Attention-23 (CPU).

Compares each kernel with numpy references of the two possible orders on random Q/K/V and a
mask with float32's lowest, finite, and (Attention) -inf entries:

    gemma2:     softmax(tanh(s * scale / c) * c + mask) @ V   (what Gemma2's eager code computes)
    spec-23:    softmax(tanh((s * scale + mask) / c) * c) @ V (ONNX Attention-23 as first published)

and GroupQueryAttention's ``local_window_size`` against a window reference (key j kept for query i
when i - window <= j <= i) to say how many past keys a window of w keeps.

    PYTHONPATH=. python scripts/softcap_kernel_check.py
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

CAP = 50.0
B, S, H, NKV, D = 2, 7, 4, 2, 16
LOWEST = float(np.finfo(np.float32).min)


def softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def reference(q, k, v, mask, scale, order):
    """q [B, H, S, d], k/v [B, H, T, d] (repeated), mask [B or 1, H or 1, S, T] (additive); in
    float32 as the export computes it (a score plus float32's lowest is float32's lowest)."""
    s = (q @ k.transpose(0, 1, 3, 2)) * np.float32(scale)
    if order == "gemma2":
        s = np.tanh(s / np.float32(CAP)) * np.float32(CAP) + mask
    else:
        s = np.tanh((s + mask) / np.float32(CAP)) * np.float32(CAP)
    return softmax(s) @ v


def session(graph: onnx.GraphProto, opsets) -> ort.InferenceSession:
    model = helper.make_model(graph, opset_imports=opsets)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def gqa(q, k, v, mask, scale, causal, window=-1):
    """GroupQueryAttention without past: q [B, S, H*d], k/v [B, S, Nkv*d]."""
    inputs = ["q", "k", "v", "", "", "seqlens_k", "total"]
    if mask is not None:
        inputs += ["", "", "", "bias"]
    node = helper.make_node(
        "GroupQueryAttention",
        inputs,
        ["y"],
        domain="com.microsoft",
        num_heads=H,
        kv_num_heads=NKV,
        scale=scale,
        softcap=CAP,
        causal=causal,
        local_window_size=window,
    )
    f = TensorProto.FLOAT
    graph_inputs = [
        helper.make_tensor_value_info("q", f, None),
        helper.make_tensor_value_info("k", f, None),
        helper.make_tensor_value_info("v", f, None),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, None),
        helper.make_tensor_value_info("total", TensorProto.INT32, None),
    ]
    if mask is not None:
        graph_inputs.append(helper.make_tensor_value_info("bias", f, None))
    graph = helper.make_graph(
        [node], "g", graph_inputs, [helper.make_tensor_value_info("y", f, None)]
    )
    sess = session(graph, [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    feeds = {
        "q": q.transpose(0, 2, 1, 3).reshape(B, S, H * D),
        "k": k.transpose(0, 2, 1, 3).reshape(B, S, NKV * D),
        "v": v.transpose(0, 2, 1, 3).reshape(B, S, NKV * D),
        "seqlens_k": np.full([B], S - 1, np.int32),
        "total": np.array(S, np.int32),
    }
    if mask is not None:
        feeds["bias"] = np.broadcast_to(mask, (mask.shape[0], mask.shape[1], S, S)).copy()
    (y,) = sess.run(None, feeds)
    return y.reshape(B, S, H, D).transpose(0, 2, 1, 3)


def attention23(q, k, v, mask, scale):
    f = TensorProto.FLOAT
    inputs = ["q", "k", "v"] + (["mask"] if mask is not None else [])
    node = helper.make_node("Attention", inputs, ["y"], scale=scale, softcap=CAP)
    graph_inputs = [helper.make_tensor_value_info(n, f, None) for n in inputs]
    graph = helper.make_graph(
        [node], "g", graph_inputs, [helper.make_tensor_value_info("y", f, None)]
    )
    sess = session(graph, [helper.make_opsetid("", 23)])
    feeds = {"q": q, "k": np.repeat(k, H // NKV, 1), "v": np.repeat(v, H // NKV, 1)}
    if mask is not None:
        feeds["mask"] = mask
    (y,) = sess.run(None, feeds)
    return y


def masks(rng: np.random.Generator) -> dict[str, np.ndarray]:
    causal = np.triu(np.ones((S, S), bool), 1)
    padded = np.zeros((B, 1, S, S), bool)
    padded[1, :, :, :2] = True  # left padding of two keys in row 1
    padded[1, :, :2, :] = True  # and its two padded queries fully masked (all keys)
    out = {
        "causal lowest": np.where(causal, LOWEST, 0.0)[None, None].astype(np.float32),
        "causal+pad lowest": np.where(causal | padded, LOWEST, 0.0).astype(np.float32),
        "finite bias": rng.normal(0, 3, (1, H, S, S)).astype(np.float32),
        "causal -inf": np.where(causal, -np.inf, 0.0)[None, None].astype(np.float32),
    }
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    # Large activations so that the cap bites (|scores * scale| well above 50).
    q = rng.normal(0, 6, (B, H, S, D)).astype(np.float32)
    k = rng.normal(0, 6, (B, NKV, S, D)).astype(np.float32)
    v = rng.normal(0, 1, (B, NKV, S, D)).astype(np.float32)
    scale = 0.25
    k_rep, v_rep = np.repeat(k, H // NKV, 1), np.repeat(v, H // NKV, 1)
    print(f"max |scores * scale| = {np.abs(q @ k_rep.transpose(0, 1, 3, 2) * scale).max():.1f}")
    for name, mask in masks(rng).items():
        refs = {o: reference(q, k_rep, v_rep, mask, scale, o) for o in ("gemma2", "spec-23")}
        runs = {"GQA causal=0": gqa(q, k, v, mask, scale, 0)}
        if "causal" in name:
            runs["GQA causal=1"] = gqa(q, k, v, mask, scale, 1)
        runs["Attention-23"] = attention23(q, k, v, mask, scale)
        for kernel, y in runs.items():
            diffs = ", ".join(f"{o} {np.nanmax(np.abs(y - r)):.2e}" for o, r in refs.items())
            nan = " (NaN rows)" if np.isnan(y).any() else ""
            print(f"{name:18s} {kernel:13s} max |diff| vs {diffs}{nan}")
    # local_window_size: which keys does a window of w keep?
    causal = np.triu(np.ones((S, S), bool), 1)
    for window in (2, 3):
        got = gqa(q, k, v, None, scale, 1, window)
        for keep in (window - 1, window, window + 1):
            i, j = np.indices((S, S))
            banned = causal | (i - j > keep)
            mask = np.where(banned, LOWEST, 0.0)[None, None].astype(np.float32)
            ref = reference(q, k_rep, v_rep, mask, scale, "gemma2")
            print(
                f"local_window_size={window}: vs keys i-{keep}..i kept: "
                f"{np.abs(got - ref).max():.2e}"
            )


if __name__ == "__main__":
    main()
