"""Write a chain of N Add/Relu nodes (the 200,000-node robustness case) to measure optimize at scale.

.venv/bin/python scripts/make_chain_model.py 200000 /tmp/chain200k.onnx
/usr/bin/time -v .venv/bin/onnxopt optimize /tmp/chain200k.onnx -o /tmp/chain200k.opt.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh


def relu_chain(nodes: int) -> onnx.ModelProto:
    """x -> (Add 1, Relu) * nodes/2 -> Identity -> y: one long chain of cheap ops."""
    one = onnx.numpy_helper.from_array(np.ones(4, np.float32), "one")
    graph_nodes = []
    previous = "x"
    for index in range(nodes // 2):
        graph_nodes.append(oh.make_node("Add", [previous, "one"], [f"a{index}"]))
        graph_nodes.append(oh.make_node("Relu", [f"a{index}"], [f"r{index}"]))
        previous = f"r{index}"
    graph_nodes.append(oh.make_node("Identity", [previous], ["y"]))
    graph = oh.make_graph(
        graph_nodes,
        "chain",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
        [one],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def main() -> None:
    nodes, out = int(sys.argv[1]), Path(sys.argv[2])
    out.write_bytes(relu_chain(nodes).SerializeToString())


if __name__ == "__main__":
    main()
