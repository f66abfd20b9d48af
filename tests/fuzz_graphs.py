"""A seeded generator of random valid ONNX graphs for differential testing of the optimizer.

Each graph has a dynamic batch dim ``N`` and mixes the patterns exporters emit: element-wise chains,
MatMul/Gemm/Conv with constant weights, Reshape/Transpose/Slice/Concat/Squeeze/Unsqueeze, Cast
chains, reductions, Softmax, the LayerNorm decomposition, Shape->Gather->Concat->Reshape arithmetic,
constant subexpressions, duplicated nodes, Dropout/Identity, If on a constant condition and a Loop,
and unseeded random ops (RandomNormalLike, RandomUniformLike, Bernoulli, training-mode Dropout).
Shapes are tracked during generation so every graph is valid by construction.

Run many: ``python tests/fuzz_graphs.py --count 2000 --out fuzz-failures`` (failures are minimized
and saved as reproducers: ``<seed>.onnx`` plus the error text).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Dim = int | str  # "N" is the dynamic batch dim
OPSET = 17


@dataclass
class _Builder:
    rng: random.Random
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    pool: list[tuple[str, list[Dim]]] = field(default_factory=list)
    counter: int = 0

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def const(self, array: np.ndarray) -> str:
        name = self.name("c")
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def node(self, op: str, inputs: list[str], shape: list[Dim], **attrs: object) -> str:
        out = self.name(op.lower() + "_")
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.name("n"), **attrs))
        self.pool.append((out, shape))
        return out

    def weights(self, *shape: int) -> np.ndarray:
        seed = self.rng.randrange(2**31)
        return (np.random.default_rng(seed).standard_normal(shape) * 0.3).astype(np.float32)

    def pick(self, rank: int | None = None) -> tuple[str, list[Dim]] | None:
        options = [p for p in self.pool if rank is None or len(p[1]) == rank]
        if not options:
            return None
        # Prefer recent values so chains grow deep rather than wide.
        return options[-1] if self.rng.random() < 0.6 else self.rng.choice(options)


def _unary(b: _Builder) -> None:
    value = b.pick()
    assert value is not None
    op = b.rng.choice(["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Identity", "Softsign"])
    b.node(op, [value[0]], value[1])


def _binary(b: _Builder) -> None:
    value = b.pick()
    assert value is not None
    name, shape = value
    op = b.rng.choice(["Add", "Sub", "Mul", "Add", "Mul"])
    same = [p for p in b.pool if p[1] == shape and p[0] != name]
    if same and b.rng.random() < 0.5:
        other = b.rng.choice(same)[0]
    else:
        last = shape[-1]
        assert isinstance(last, int)
        kind = b.rng.choice(["row", "scalar", "identity"])
        if kind == "row":
            other = b.const(b.weights(last))
        elif kind == "scalar":
            other = b.const(np.array(b.rng.choice([0.5, 2.0, -1.0]), dtype=np.float32))
        else:  # x + 0 / x * 1: no-ops the optimizer may remove
            other = b.const(np.array(0.0 if op in ("Add", "Sub") else 1.0, dtype=np.float32))
    b.node(op, [name, other], shape)


def _matmul(b: _Builder) -> None:
    value = b.pick()
    assert value is not None
    name, shape = value
    last = shape[-1]
    assert isinstance(last, int)
    width = b.rng.choice([4, 8, 12])
    if len(shape) == 2 and b.rng.random() < 0.5:
        out = b.node(
            "Gemm",
            [name, b.const(b.weights(width, last)), b.const(b.weights(width))],
            [shape[0], width],
            transB=1,
        )
    else:
        out = b.node("MatMul", [name, b.const(b.weights(last, width))], [*shape[:-1], width])
        if b.rng.random() < 0.5:
            b.node("Add", [out, b.const(b.weights(width))], [*shape[:-1], width])


def _conv(b: _Builder) -> None:
    value = b.pick(rank=4)
    if value is None:
        return _unary(b)
    name, shape = value
    channels = shape[1]
    assert isinstance(channels, int)
    out_ch = b.rng.choice([2, 4])
    out = b.node(
        "Conv",
        [name, b.const(b.weights(out_ch, channels, 3, 3)), b.const(b.weights(out_ch))],
        [shape[0], out_ch, *shape[2:]],
        pads=[1, 1, 1, 1],
    )
    if b.rng.random() < 0.5:
        scale, bias, mean = b.weights(out_ch), b.weights(out_ch), b.weights(out_ch)
        var = np.abs(b.weights(out_ch)) + 0.5
        inputs = [out, *(b.const(a) for a in (scale, bias, mean, var))]
        out = b.node("BatchNormalization", inputs, [shape[0], out_ch, *shape[2:]], epsilon=1e-5)
    b.node("Relu", [out], [shape[0], out_ch, *shape[2:]])
    return None


def _layout(b: _Builder) -> None:
    value = b.pick()
    assert value is not None
    name, shape = value
    choice = b.rng.choice(["transpose", "reshape", "unsqueeze", "slice", "concat", "flatten"])
    rank = len(shape)
    if choice == "transpose" and rank >= 2:
        perm = [0, *b.rng.sample(range(1, rank), rank - 1)]
        out = b.node("Transpose", [name], [shape[i] for i in perm], perm=perm)
        if b.rng.random() < 0.5:  # and back: a pair the optimizer can cancel
            inverse = [perm.index(i) for i in range(rank)]
            b.node("Transpose", [out], shape, perm=inverse)
    elif choice == "reshape" and rank >= 2:
        rest = int(np.prod([d for d in shape[1:] if isinstance(d, int)]))
        target = b.const(np.array([0, -1], dtype=np.int64))
        out = b.node("Reshape", [name, target], [shape[0], rest])
        if b.rng.random() < 0.5 and rank >= 3:
            back = b.const(np.array([0, *shape[1:]], dtype=np.int64))
            b.node("Reshape", [out, back], shape)
    elif choice == "unsqueeze":
        axes = b.const(np.array([1], dtype=np.int64))
        out = b.node("Unsqueeze", [name, axes], [shape[0], 1, *shape[1:]])
        b.node("Squeeze", [out, axes], shape)
    elif choice == "slice" and isinstance(shape[-1], int) and shape[-1] >= 2:
        end = b.rng.randrange(1, shape[-1] + 1)
        inputs = [
            name,
            b.const(np.array([0], np.int64)),
            b.const(np.array([end], np.int64)),
            b.const(np.array([rank - 1], np.int64)),
        ]
        b.node("Slice", inputs, [*shape[:-1], end])
    elif choice == "concat" and rank >= 2 and isinstance(shape[-1], int):
        same = [p[0] for p in b.pool if p[1] == shape]
        parts = [name, b.rng.choice(same)]
        b.node("Concat", parts, [*shape[:-1], 2 * shape[-1]], axis=-1)
    elif rank >= 2:
        rest = int(np.prod([d for d in shape[1:] if isinstance(d, int)]))
        b.node("Flatten", [name], [shape[0], rest], axis=1)


def _norm(b: _Builder) -> None:
    value = b.pick()
    assert value is not None
    name, shape = value
    last = shape[-1]
    assert isinstance(last, int)
    choice = b.rng.choice(["layernorm", "softmax", "reduce"])
    if choice == "softmax":
        b.node("Softmax", [name], shape, axis=-1)
    elif choice == "reduce":
        op = b.rng.choice(["ReduceMean", "ReduceSum", "ReduceMax"])
        if (
            op == "ReduceSum"
        ):  # axes became an input for ReduceSum in opset 13, for the others in 18
            b.node(op, [name, b.const(np.array([-1], np.int64))], [*shape[:-1], 1], keepdims=1)
        else:
            b.node(op, [name], [*shape[:-1], 1], axes=[-1], keepdims=1)
    else:
        mean = b.node("ReduceMean", [name], [*shape[:-1], 1], axes=[-1])
        centered = b.node("Sub", [name, mean], shape)
        square = b.node("Pow", [centered, b.const(np.array(2.0, np.float32))], shape)
        var = b.node("ReduceMean", [square], [*shape[:-1], 1], axes=[-1])
        std = b.node(
            "Sqrt",
            [b.node("Add", [var, b.const(np.array(1e-5, np.float32))], [*shape[:-1], 1])],
            [*shape[:-1], 1],
        )
        normed = b.node("Div", [centered, std], shape)
        scaled = b.node("Mul", [normed, b.const(b.weights(last) + 1)], shape)
        b.node("Add", [scaled, b.const(b.weights(last))], shape)


def _shape_arith(b: _Builder) -> None:
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as TorchScript exports emit."""
    value = b.pick()
    assert value is not None
    name, shape = value
    if len(shape) < 2:
        return _unary(b)
    shp = b.node("Shape", [name], [len(shape)])
    batch = b.node("Gather", [shp, b.const(np.array(0, np.int64))], [], axis=0)
    batch1 = b.node("Unsqueeze", [batch, b.const(np.array([0], np.int64))], [1])
    rest = int(np.prod([d for d in shape[1:] if isinstance(d, int)]))
    target = b.node("Concat", [batch1, b.const(np.array([rest], np.int64))], [2], axis=0)
    b.pool = [
        p for p in b.pool if p[0] not in (shp, batch, batch1, target)
    ]  # int values stay out of the float pool
    b.node("Reshape", [name, target], [shape[0], rest])
    return None


def _cast_and_noops(b: _Builder) -> None:
    value = b.pick()
    assert value is not None
    name, shape = value
    choice = b.rng.choice(["cast-exact", "cast-lossy", "dropout", "duplicate", "constant-expr"])
    if choice == "cast-exact":
        wide = b.node("Cast", [name], shape, to=TensorProto.DOUBLE)
        b.pool.pop()
        b.node("Cast", [wide], shape, to=TensorProto.FLOAT)
    elif choice == "cast-lossy":  # float -> half -> float must stay
        half = b.node("Cast", [name], shape, to=TensorProto.FLOAT16)
        b.pool.pop()
        b.node("Cast", [half], shape, to=TensorProto.FLOAT)
    elif choice == "dropout":
        b.node("Dropout", [name], shape)
    elif choice == "duplicate":
        b.node("Relu", [name], shape)
        b.node("Relu", [name], shape)
    else:
        last = shape[-1]
        assert isinstance(last, int)
        folded = b.node(
            "Mul", [b.const(b.weights(last)), b.const(np.array(3.0, np.float32))], [last]
        )
        b.pool.pop()
        b.node("Add", [name, folded], shape)


def _control_flow(b: _Builder) -> None:
    value = b.pick()
    assert value is not None
    name, shape = value
    if b.rng.random() < 0.5:
        out_then, out_else = b.name("t"), b.name("e")
        then_graph = helper.make_graph(
            [helper.make_node("Relu", [name], [out_then])],
            "then",
            [],
            [helper.make_tensor_value_info(out_then, TensorProto.FLOAT, shape)],
        )
        else_graph = helper.make_graph(
            [helper.make_node("Neg", [name], [out_else])],
            "else",
            [],
            [helper.make_tensor_value_info(out_else, TensorProto.FLOAT, shape)],
        )
        cond = b.const(np.array(b.rng.random() < 0.5))
        b.node("If", [cond], shape, then_branch=then_graph, else_branch=else_graph)
    else:
        i, c_in, acc_in = b.name("i"), b.name("cond"), b.name("acc")
        c_out, acc_out = b.name("cond_out"), b.name("acc_out")
        body = helper.make_graph(
            [
                helper.make_node("Identity", [c_in], [c_out]),
                helper.make_node("Add", [acc_in, name], [acc_out]),
            ],
            "body",
            [
                helper.make_tensor_value_info(i, TensorProto.INT64, []),
                helper.make_tensor_value_info(c_in, TensorProto.BOOL, []),
                helper.make_tensor_value_info(acc_in, TensorProto.FLOAT, shape),
            ],
            [
                helper.make_tensor_value_info(c_out, TensorProto.BOOL, []),
                helper.make_tensor_value_info(acc_out, TensorProto.FLOAT, shape),
            ],
        )
        trips = b.const(np.array(b.rng.randrange(1, 4), np.int64))
        keep = b.const(np.array(True))
        b.node("Loop", [trips, keep, name], shape, body=body)


def _draws(b: _Builder) -> None:
    """Unseeded random ops, validated on the original's draws (onnxopt.random_draws)."""
    value = b.pick()
    assert value is not None
    name, shape = value
    choice = b.rng.choice(["normal-like", "uniform-like", "bernoulli", "dropout-train"])
    if choice == "normal-like":
        noise = b.node("RandomNormalLike", [name], shape, dtype=TensorProto.FLOAT, scale=0.1)
        b.node("Add", [name, noise], shape)
    elif choice == "uniform-like":
        noise = b.node("RandomUniformLike", [name], shape, dtype=TensorProto.FLOAT, low=0.5)
        b.node("Mul", [noise, name], shape)
    elif choice == "bernoulli":
        chance = b.node("Sigmoid", [name], shape)
        b.pool.pop()
        keep = b.node("Bernoulli", [chance], shape, dtype=TensorProto.FLOAT)
        b.node("Mul", [name, keep], shape)
    else:
        ratio = b.const(np.array(0.3, np.float32))
        train = b.const(np.array(True))
        b.node("Dropout", [name, ratio, train], shape)


GENERATORS: list[tuple[Callable[[_Builder], None], int]] = [
    (_unary, 3),
    (_binary, 4),
    (_matmul, 2),
    (_conv, 2),
    (_layout, 3),
    (_norm, 2),
    (_shape_arith, 1),
    (_cast_and_noops, 2),
    (_control_flow, 1),
    (_draws, 1),
]


def random_model(seed: int, max_nodes: int = 24) -> onnx.ModelProto:
    rng = random.Random(seed)
    b = _Builder(rng)
    inputs = []
    if rng.random() < 0.5:
        shape: list[Dim] = ["N", rng.choice([2, 3]), rng.choice([4, 5]), rng.choice([4, 6])]
    else:
        shape = ["N", rng.choice([3, 5]), rng.choice([4, 8])]
    inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, shape))
    b.pool.append(("x", shape))
    functions, weights = zip(*GENERATORS)
    while len(b.nodes) < max_nodes:
        rng.choices(functions, weights)[0](b)
    candidates = [p for p in b.pool if p[0] != "x"]
    chosen = [candidates[-1]] + ([rng.choice(candidates)] if rng.random() < 0.5 else [])
    outputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
        for name, shape in dict(chosen).items()
    ]
    graph = helper.make_graph(b.nodes, f"fuzz{seed}", inputs, outputs, b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)


def check_model(proto: onnx.ModelProto) -> str | None:
    """None when onnxopt's output matches the original on ORT; else a one-line description."""
    from onnxopt import api
    from onnxopt.errors import OnnxoptError
    from onnxopt.io import model_from_proto
    from onnxopt.validate import CannotValidate

    model = model_from_proto(proto, "<fuzz>")
    try:
        result = api.optimize(model)
    except CannotValidate as exc:
        if "draws random numbers" in str(exc):  # the generator's draws must be pinned
            return f"optimize raised: {exc}"
        return None  # the generator made something ORT itself rejects: not an optimizer bug
    except OnnxoptError as exc:
        return f"optimize raised: {exc}"
    validation = result.report.validation
    assert validation is not None
    if validation.passed:
        return None
    return f"mismatch: {validation.errors or validation.failing_outputs()}"


def minimize(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Shortest prefix of the graph (its last value as the output) that still fails."""
    best = proto
    nodes = list(proto.graph.node)
    for end in range(1, len(nodes) + 1):
        candidate = onnx.ModelProto()
        candidate.CopyFrom(proto)
        del candidate.graph.node[end:]
        del candidate.graph.output[:]
        candidate.graph.output.append(
            helper.make_tensor_value_info(nodes[end - 1].output[0], TensorProto.FLOAT, None)
        )
        try:
            if check_model(candidate) is not None:
                return candidate
        except Exception:
            continue
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("fuzz-failures"))
    args = parser.parse_args(argv)
    failures = 0
    for seed in range(args.start, args.start + args.count):
        problem = check_model(random_model(seed))
        if problem is None:
            continue
        failures += 1
        args.out.mkdir(parents=True, exist_ok=True)
        small = minimize(random_model(seed))
        (args.out / f"{seed}.onnx").write_bytes(small.SerializeToString())
        (args.out / f"{seed}.txt").write_text(problem + "\n")
        print(f"seed {seed}: {problem} (reproducer: {args.out / f'{seed}.onnx'})", file=sys.stderr)
    print(f"{args.count - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
