"""GroupQueryAttention's length inputs for the micro-benchmarks' hand-built graphs."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh


def gqa_lengths(source: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes making ``seqlens_k`` ([B] int32, T - 1 for every row: no padding) and ``total`` (a
    scalar T) from ``source`` [B, T, ...], and the constant they need."""
    nodes = [
        h.make_node("Shape", [source], ["batch"], start=0, end=1),
        h.make_node("Shape", [source], ["total64"], start=1, end=2),
        h.make_node("Cast", ["total64"], ["total1"], to=TP.INT32),
        h.make_node("Sub", ["total1", "one32"], ["last"]),
        h.make_node("Expand", ["last", "batch"], ["seqlens_k"]),
        h.make_node("Squeeze", ["total1"], ["total"]),
    ]
    return nodes, [nh.from_array(np.array([1], np.int32), "one32")]
