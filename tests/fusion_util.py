"""Shared helpers for the fusion tests: build models from ONNX text, run a pass, compare on ORT."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir

from onnxopt.io import model_from_proto
from onnxopt.passes.base import Pass, PassResult
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.validate import validate


def parse(text: str, **initializers: np.ndarray) -> ir.Model:
    """A model from ONNX text, shapes inferred; keyword arrays become initializers of the same name."""
    proto = onnx.parser.parse_model(text)
    for name, array in initializers.items():
        proto.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(array), name))
    model = model_from_proto(proto)
    InferShapesPass()(model)
    return model


def op_types(model: ir.Model) -> list[str]:
    return [
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
        for n in model.graph
    ]


def run_checked(pass_: Pass, model: ir.Model) -> PassResult:
    """Run ``pass_`` on a clone; assert ORT agrees with the original and a second run changes nothing."""
    result = pass_(model.clone())
    report = validate(model, result.model)
    assert report.passed, report
    again = type(pass_)(pass_.options)(result.model.clone())
    assert not again.modified, again.stats
    return result


def rng_array(*shape: int, seed: int = 0, positive: bool = False) -> np.ndarray:
    array = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return np.abs(array) + 0.5 if positive else array


# One LLaMA-style attention layer on x [B, S, 8]: 4 query heads and 2 K/V heads of 8 (K/V
# repeated as repeat_kv), the scores ``scaled`` by 0.7 and a ``mask`` from keep [B, S] built as
# the exporters build it (``{allowed}``: causal and padding, or what a test puts there);
# ``{probs}`` turns them into the probabilities ``p``.
GQA_LAYER = """
    <ir_version: 8, opset_import: ["" : {opset}]>
    g (float[B, S, 8] x, bool[B, S] keep{inputs}) => (float[B, S, 32] out) {{
        q = MatMul(x, wq)
        k = MatMul(x, wk)
        v = MatMul(x, wv)
        qr = Reshape(q, qsplit)
        q4 = Transpose<perm=[0, 2, 1, 3]>(qr)
        kr = Reshape(k, split)
        k4 = Transpose<perm=[0, 2, 1, 3]>(kr)
        vr = Reshape(v, split)
        v4 = Transpose<perm=[0, 2, 1, 3]>(vr)
        ku = Unsqueeze(k4, axis)
        ke = Expand(ku, rep)
        kh = Reshape(ke, merge)
        vu = Unsqueeze(v4, axis)
        ve = Expand(vu, rep)
        vh = Reshape(ve, merge)
        kt = Transpose<perm=[0, 1, 3, 2]>(kh)
        scores = MatMul(q4, kt)
        scaled = Mul(scores, scale)
        sq = Shape<start=1, end=2>(x)
        zero = Constant<value = int64 {{0}}>()
        one = Constant<value = int64 {{1}}>()
        sqs = Squeeze(sq)
        qi = Range(zero, sqs, one)
        kpos = Unsqueeze(qi, ax012)
        qpos = Unsqueeze(qi, ax013)
        causal = LessOrEqual(kpos, qpos)
        pad = Unsqueeze(keep, ax12)
        {allowed}
        mask = Where(allowed, zero_f, masked)
        {probs}
        {pv}
        {merge}
    }}
"""


def gqa_layer(
    probs: str,
    *,
    opset: int = 17,
    inputs: str = "",
    allowed: str = "allowed = And(causal, pad)",
    pv: str = "pv = MatMul(p, vh)",
    merge: str = "pt = Transpose<perm=[0, 2, 1, 3]>(pv)\n out = Reshape(pt, outshape)",
    **initializers: np.ndarray,
) -> ir.Model:
    """GQA_LAYER with its weights and constants (and ``initializers`` for ``probs``); ``pv``
    computes the [B, H, S, d] ``pv`` from the probabilities ``p``, ``merge`` the [B, S, 32]
    ``out`` from ``pv``."""
    text = GQA_LAYER.format(
        opset=opset, inputs=inputs, allowed=allowed, probs=probs, pv=pv, merge=merge
    )
    return parse(
        text,
        wq=rng_array(8, 32, seed=1),
        wk=rng_array(8, 16, seed=2),
        wv=rng_array(8, 16, seed=3),
        qsplit=np.array([0, 0, 4, 8], np.int64),
        split=np.array([0, 0, 2, 8], np.int64),
        merge=np.array([0, 4, -1, 8], np.int64),
        rep=np.array([1, 1, 2, 1, 1], np.int64),
        axis=np.array([2], np.int64),
        outshape=np.array([0, 0, 32], np.int64),
        ax012=np.array([0, 1, 2], np.int64),
        ax013=np.array([0, 1, 3], np.int64),
        ax12=np.array([1, 2], np.int64),
        scale=np.array(0.7, np.float32),
        zero_f=np.array(0.0, np.float32),
        masked=np.array(np.finfo(np.float32).min, np.float32),
        **initializers,
    )


def key_from_another_sequence(model: ir.Model) -> None:
    """Re-point GQA_LAYER's key projection at a new input y [B, T, 8]: GroupQueryAttention (no
    past cache) can no longer prove the key as long as the query."""
    projection = next(n for n in model.graph if n.op_type == "MatMul" and n.outputs[0].name == "k")
    y = ir.Value(name="y", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["B", "T", 8]))
    model.graph.inputs.append(y)
    projection.replace_input_with(0, y)
