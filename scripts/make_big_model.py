"""Write a single-file ONNX model past protobuf's 2 GiB limit, cheaply (a sparse file of zeros).

    python scripts/make_big_model.py OUT.onnx [--rows 140000000] [--vector]

Default: ``y = Relu(Gather(table[rows, 4], ids[3]))``, a 2.24 GB table and tiny inputs (validation
can run). ``--vector``: ``y = Add(x, w)`` with ``x, w`` of [rows * 4] floats (1-D; inputs too large
to generate). Used to check that loading maps the weights and that optimize stays bounded:

    /usr/bin/time -f "%M KB" onnxopt optimize OUT.onnx -o opt.onnx
"""

from __future__ import annotations

import argparse

import onnx
import onnx.helper as oh


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def write_big_model(path: str, rows: int, vector: bool) -> None:
    f32 = onnx.TensorProto.FLOAT
    if vector:
        n = rows * 4
        weight = onnx.TensorProto(name="w", data_type=f32, dims=[n])
        nodes = [oh.make_node("Add", ["x", "w"], ["y"])]
        inputs = [oh.make_tensor_value_info("x", f32, [n])]
        outputs = [oh.make_tensor_value_info("y", f32, [n])]
    else:
        weight = onnx.TensorProto(name="table", data_type=f32, dims=[rows, 4])
        nodes = [
            oh.make_node("Gather", ["table", "ids"], ["g"]),
            oh.make_node("Relu", ["g"], ["y"]),
        ]
        inputs = [oh.make_tensor_value_info("ids", onnx.TensorProto.INT64, [3])]
        outputs = [oh.make_tensor_value_info("y", f32, [3, 4])]
    model = oh.make_model(
        oh.make_graph(nodes, "big", inputs, outputs),
        opset_imports=[oh.make_opsetid("", 17)],
        ir_version=8,
    )
    header = weight.SerializeToString()
    raw_bytes = rows * 16
    raw_tag = _tag(9, 2) + _varint(raw_bytes)  # TensorProto.raw_data
    initializer = len(header) + len(raw_tag) + raw_bytes
    graph = model.graph.SerializeToString()
    graph_bytes = len(graph) + len(_tag(5, 2)) + len(_varint(initializer)) + initializer
    model.ClearField("graph")
    with open(path, "wb") as out:
        out.write(model.SerializeToString() + _tag(7, 2) + _varint(graph_bytes) + graph)
        out.write(_tag(5, 2) + _varint(initializer) + header + raw_tag)
        out.seek(raw_bytes - 1, 1)  # zeros, without writing them
        out.write(b"\0")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, default=140_000_000)
    parser.add_argument("--vector", action="store_true")
    args = parser.parse_args()
    write_big_model(args.out, args.rows, args.vector)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
