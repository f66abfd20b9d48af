"""Models whose work sits in If branches (optimum's merged decoders: ``If(use_cache_branch)``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx_ir as ir
import onnxruntime as ort
from click.testing import CliRunner

from onnxopt import api
from onnxopt.cli import main
from onnxopt.io import load_model, model_from_proto, to_proto, unique_value_names
from onnxopt.passes.base import Pass, PassResult, Pipeline
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.validate import validate

FLOAT = onnx.TensorProto.FLOAT


def _rms_nodes(prefix: str, source: str, out: str) -> list[onnx.NodeProto]:
    """LlamaRMSNorm as exported: w * cast(h * 1/sqrt(mean(h^2) + eps)), h = cast(x) (the fused
    node's output is a new value, named by onnx-ir)."""
    p = prefix
    return [
        oh.make_node("Cast", [source], [f"{p}h"], to=FLOAT),
        oh.make_node("Pow", [f"{p}h", "two"], [f"{p}sq"]),
        oh.make_node("ReduceMean", [f"{p}sq", "axes"], [f"{p}ms"]),
        oh.make_node("Add", [f"{p}ms", "eps"], [f"{p}v"]),
        oh.make_node("Sqrt", [f"{p}v"], [f"{p}s"]),
        oh.make_node("Reciprocal", [f"{p}s"], [f"{p}r"]),
        oh.make_node("Mul", [f"{p}h", f"{p}r"], [f"{p}n"]),
        oh.make_node("Cast", [f"{p}n"], [f"{p}c"], to=FLOAT),
        oh.make_node("Mul", ["w", f"{p}c"], [out]),
    ]


def _merged_model(else_op: str = "Identity") -> onnx.ModelProto:
    """y = rms(rms(x)) if flag else else_op(rms(x)): fusions run in the main graph and in both
    branches, so the per-graph names onnx-ir gives the fused nodes' outputs repeat."""
    vector = ["B", "S", 8]
    then_branch = oh.make_graph(
        _rms_nodes("t_", "h", "t_y"), "then", [], [oh.make_tensor_value_info("t_y", FLOAT, vector)]
    )
    else_branch = oh.make_graph(
        [*_rms_nodes("e_", "h", "e_z"), oh.make_node(else_op, ["e_z"], ["e_y"])],
        "else",
        [],
        [oh.make_tensor_value_info("e_y", FLOAT, vector)],
    )
    rng = np.random.default_rng(0)
    graph = oh.make_graph(
        [
            *_rms_nodes("m_", "x", "h"),
            oh.make_node("If", ["flag"], ["y"], then_branch=then_branch, else_branch=else_branch),
        ],
        "merged",
        [
            oh.make_tensor_value_info("x", FLOAT, vector),
            oh.make_tensor_value_info("flag", onnx.TensorProto.BOOL, []),
        ],
        [oh.make_tensor_value_info("y", FLOAT, vector)],
        [
            onh.from_array(np.array(2.0, np.float32), "two"),
            onh.from_array(np.array([-1], np.int64), "axes"),
            onh.from_array(np.array(1e-6, np.float32), "eps"),
            onh.from_array(rng.standard_normal(8).astype(np.float32), "w"),
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_fusions_in_if_branches_give_a_model_ort_loads() -> None:
    """Each graph's RMSNorm fuses, the If's condition is run both ways, and ORT loads the result."""
    result = api.optimize(model_from_proto(_merged_model()))
    assert result.validated
    model = result.model
    ops = [[n.op_type for n in g] for g in (model.graph, *model.graph.subgraphs())]
    # ORT's SimplifiedLayerNormalization (it registers it in the default domain).
    assert ops == [
        ["SimplifiedLayerNormalization", "If"],
        ["SimplifiedLayerNormalization"],
        ["SimplifiedLayerNormalization"],  # the Identity is removed
    ]
    names = [
        str(v.name) for g in (model.graph, *model.graph.subgraphs()) for n in g for v in n.outputs
    ]
    assert len(names) == len(set(names))
    ort.InferenceSession(to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])


class _InsertIdentity(Pass):
    """Puts an Identity before every graph's first node output: onnx-ir names each new value
    in its own graph (val_0 in the main graph and in each branch), as fusions do."""

    name = "insert-identity"
    summary = "test pass"

    def call(self, model: ir.Model) -> PassResult:
        for graph in (model.graph, *model.graph.subgraphs()):
            first = next(iter(graph))
            source = first.inputs[0]
            assert source is not None
            copy = ir.node("Identity", [source])
            graph.insert_before(first, copy)
            first.replace_input_with(0, copy.outputs[0])
        return PassResult(model, modified=True)


def test_the_pipeline_leaves_no_subgraph_value_repeating_an_outer_name() -> None:
    model = model_from_proto(_merged_model())
    Pipeline([_InsertIdentity()])(model)
    names = [
        str(v.name) for g in (model.graph, *model.graph.subgraphs()) for n in g for v in n.outputs
    ]
    assert len(names) == len(set(names))
    assert sum(name.startswith("val_0") for name in names) == 3
    session = ort.InferenceSession(
        to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    session.run(None, {"x": x, "flag": np.array(True)})


def test_unique_value_names_renames_only_subgraph_values_that_repeat_a_name() -> None:
    model = model_from_proto(_merged_model())
    branch = next(iter(model.graph.subgraphs()))
    repeated = next(v for n in branch for v in n.outputs)
    repeated.name = "h"  # a main-graph value's name
    kept = [str(v.name) for n in model.graph for v in n.outputs]
    assert unique_value_names(model) == 1
    assert repeated.name == "h_1"
    assert [str(v.name) for n in model.graph for v in n.outputs] == kept
    assert unique_value_names(model) == 0
    # A branch initializer named like an outer value is renamed, and stays the branch's.
    constant = ir.Value(name="w", const_value=ir.tensor(np.ones(8, np.float32)))
    branch.register_initializer(constant)
    assert unique_value_names(model) == 1
    assert constant.name == "w_1" and branch.initializers["w_1"] is constant


def test_validation_runs_both_values_of_a_boolean_flag() -> None:
    """An optimized model that differs in one branch only must fail, whichever value the
    generated flag took."""
    original = model_from_proto(_merged_model("Identity"))
    changed = model_from_proto(_merged_model("Neg"))
    for seed in range(3):
        report = validate(original, changed, seed=seed)
        assert not report.passed, seed
        assert report.failing_outputs() == ["y"]


def _reshaping_branch(prefix: str) -> onnx.GraphProto:
    """Reshape(x, [Shape(x)[0], Shape(x)[1], 2, 4]): only data propagation tells its dims."""
    p = prefix
    return oh.make_graph(
        [
            oh.make_node("Shape", ["x"], [f"{p}shape"]),
            oh.make_node("Slice", [f"{p}shape", "zero", "two"], [f"{p}lead"]),
            oh.make_node("Concat", [f"{p}lead", "split"], [f"{p}target"], axis=0),
            oh.make_node("Reshape", ["x", f"{p}target"], [f"{p}y"]),
        ],
        p,
        [],
        [oh.make_tensor_value_info(f"{p}y", FLOAT, None)],
    )


def _reshaping_model(same_names: bool) -> onnx.ModelProto:
    graph = oh.make_graph(
        [
            oh.make_node(
                "If",
                ["flag"],
                ["y"],
                then_branch=_reshaping_branch("b_"),
                else_branch=_reshaping_branch("b_" if same_names else "c_"),
            )
        ],
        "g",
        [
            oh.make_tensor_value_info("x", FLOAT, ["B", "S", 8]),
            oh.make_tensor_value_info("flag", onnx.TensorProto.BOOL, [1]),
        ],
        [oh.make_tensor_value_info("y", FLOAT, None)],
        [
            onh.from_array(np.array([0], np.int64), "zero"),
            onh.from_array(np.array([2], np.int64), "two"),
            onh.from_array(np.array([2, 4], np.int64), "split"),
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_if_branches_get_data_propagated_shapes() -> None:
    """ONNX infers a branch without data propagation ([unk, unk, unk, unk] after the Reshape);
    inferred as a model of its own it gets [B, S, 2, 4], so rewrites in the branch can prove
    shapes (a merged decoder's attention)."""
    model = model_from_proto(_reshaping_model(same_names=False))
    InferShapesPass()(model)
    for branch in model.graph.subgraphs():
        reshaped = next(n for n in branch if n.op_type == "Reshape").outputs[0]
        assert reshaped.shape == ir.Shape(["B", "S", 2, 4]), reshaped


def test_sibling_branches_sharing_names_load_without_a_warning(tmp_path: Path) -> None:
    """Two branches from two exports of one model repeat each other's node and value names: legal
    ONNX (ORT loads it), made unique at load without the "repeated node names" repair."""
    path = tmp_path / "merged.onnx"
    onnx.save(_reshaping_model(same_names=True), path)
    loaded = load_model(path)
    assert loaded.renamed_nodes == 0 and not loaded.repairs
    graphs = [loaded.model.graph, *loaded.model.graph.subgraphs()]
    names = [str(v.name) for g in graphs for n in g for v in n.outputs]
    assert len(names) == len(set(names))
    result = api.optimize(path)
    assert result.validated


def _two_rate_model(width: int = 8) -> onnx.ModelProto:
    """silero-vad's shape: one branch per sample rate, each with weights of its own, a weight
    both branches read, and one the main graph reads; a Loop body with a weight of its own."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return onh.from_array(rng.standard_normal(shape).astype(np.float32), name)

    def branch(name: str, own: str) -> onnx.GraphProto:
        nodes = [
            oh.make_node("MatMul", ["x2", own], [f"{name}_h"]),
            oh.make_node("Add", [f"{name}_h", "shared"], [f"{name}_out"]),
        ]
        out = oh.make_tensor_value_info(f"{name}_out", FLOAT, None)
        return oh.make_graph(nodes, name, [], [out])

    body = oh.make_graph(
        [
            oh.make_node("Identity", ["cond_in"], ["cond_out"]),
            oh.make_node("Mul", ["acc_in", "step"], ["acc_out"]),
        ],
        "body",
        [
            oh.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
            oh.make_tensor_value_info("cond_in", onnx.TensorProto.BOOL, []),
            oh.make_tensor_value_info("acc_in", FLOAT, None),
        ],
        [
            oh.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []),
            oh.make_tensor_value_info("acc_out", FLOAT, None),
        ],
    )
    nodes = [
        oh.make_node("Mul", ["x", "scale"], ["x2"]),
        oh.make_node("Equal", ["sr", "rate16k"], ["is16k"]),
        oh.make_node(
            "If",
            ["is16k"],
            ["y"],
            then_branch=branch("then", "w16k"),
            else_branch=branch("else", "w8k"),
        ),
        oh.make_node("Loop", ["trips", "true", "y"], ["z"], body=body),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [
            oh.make_tensor_value_info("x", FLOAT, ["B", width]),
            oh.make_tensor_value_info("sr", onnx.TensorProto.INT64, []),
        ],
        [oh.make_tensor_value_info("z", FLOAT, ["B", 4])],
        [
            weight("scale", width),
            weight("w16k", width, 4),
            weight("w8k", width, 4),
            weight("shared", 4),
            weight("step", 4),
            onh.from_array(np.array(16000, np.int64), "rate16k"),
            onh.from_array(np.array(3, np.int64), "trips"),
            onh.from_array(np.array(True), "true"),
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def test_weights_only_one_body_reads_move_into_it() -> None:
    """ORT sets up every outer-scope value a body reads as an implicit input on each run (each
    Loop iteration); a weight of the body is a session constant. Each branch's own weight and the
    Loop's step move in; the one both branches read and the main graph's stay."""
    from onnxopt.passes.localize_initializers import LocalizeInitializersPass

    model = model_from_proto(_two_rate_model())
    original = model_from_proto(_two_rate_model())
    result = LocalizeInitializersPass()(model)
    assert result.stats == {"initializers moved into a body": 3}
    assert set(model.graph.initializers) == {"scale", "shared", "rate16k", "trips", "true"}
    bodies = {g.name: set(g.initializers) for g in model.graph.subgraphs()}
    assert bodies == {"then": {"w16k"}, "else": {"w8k"}, "body": {"step"}}
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    for rate in (16000, 8000):
        inputs = [{"x": x, "sr": np.array(rate, np.int64)}]
        assert validate(original, model, inputs=inputs).passed
    assert not LocalizeInitializersPass()(model).modified
    # In the default pipeline, and ONNX Runtime loads and runs the written file.
    optimized = api.optimize(model_from_proto(_two_rate_model())).model
    assert {g.name: set(g.initializers) for g in optimized.graph.subgraphs()}["then"] == {"w16k"}
    session = ort.InferenceSession(
        to_proto(optimized).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    assert session.run(None, {"x": x, "sr": np.array(8000, np.int64)})[0].shape == (3, 4)


def test_mapped_weights_moved_into_a_body_are_written_and_validated(tmp_path: Path) -> None:
    """Weights of 1 MiB are mapped from the model file, which ONNX Runtime is handed for the main
    graph only: moved into a branch, they are read into memory first, so validation's session and
    the written file hold them."""
    path = tmp_path / "m.onnx"
    onnx.save(_two_rate_model(width=65536), path)
    out = tmp_path / "out.onnx"
    result = CliRunner().invoke(main, ["optimize", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "initializers moved into a body: 3" in result.output
    x = np.random.default_rng(1).standard_normal((2, 65536)).astype(np.float32)
    feeds = {"x": x, "sr": np.array(16000, np.int64)}
    run = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (path, out)]
    np.testing.assert_allclose(*(s.run(None, feeds)[0] for s in run), rtol=1e-5, atol=1e-4)


def test_a_weight_one_branch_returns_as_it_is_is_read_by_that_branch() -> None:
    """The else branch returns the outer weight itself (no node reads it; onnx-ir holds the
    output as a value of its own, tied by name only): moving it into the then branch, its only
    node reader, would leave the else branch returning an unknown name. (ONNX Runtime and onnx's
    checker refuse this form, asking for an Identity; a model is not made worse than it came.)"""
    from onnxopt.passes.localize_initializers import LocalizeInitializersPass

    then = oh.make_graph(
        [oh.make_node("Neg", ["w"], ["t_out"])],
        "then",
        [],
        [oh.make_tensor_value_info("t_out", FLOAT, [4])],
    )
    other = oh.make_graph([], "else", [], [oh.make_tensor_value_info("w", FLOAT, [4])])
    graph = oh.make_graph(
        [oh.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        "g",
        [oh.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [oh.make_tensor_value_info("y", FLOAT, [4])],
        [onh.from_array(np.arange(4, dtype=np.float32), "w")],
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    model = model_from_proto(proto)
    assert not LocalizeInitializersPass()(model).modified
    assert set(model.graph.initializers) == {"w"}


def test_nested_graphs_are_onnx_irs_subgraphs_in_the_same_order() -> None:
    # If inside a Loop body inside an If branch, a Scan, and a custom-domain op holding a graph
    # (ORT's BeamSearch holds its decoder so): every one found, outer first, in node order.
    def body(name: str, nodes: list[onnx.NodeProto]) -> onnx.GraphProto:
        return oh.make_graph(nodes, name, [], [oh.make_tensor_value_info(f"{name}_y", FLOAT, [1])])

    leaf = [oh.make_node("Identity", ["x"], ["leaf_y"])]
    inner_if = oh.make_node(
        "If", ["flag"], ["inner_y"], then_branch=body("leaf", leaf), else_branch=body("leaf2", [])
    )
    loop = oh.make_node("Loop", ["", "flag"], ["loop_y"], body=body("loop_body", [inner_if]))
    outer = oh.make_node(
        "If", ["flag"], ["y"], then_branch=body("then", [loop]), else_branch=body("else", [])
    )
    custom = oh.make_node("Holder", ["x"], ["z"], domain="example.custom", graph=body("custom", []))
    model = ir.serde.deserialize_model(  # (the bodies compute nothing: no load checks)
        oh.make_model(
            oh.make_graph(
                [custom, oh.make_node("Relu", ["x"], ["r"]), outer],
                "m",
                [
                    oh.make_tensor_value_info("x", FLOAT, [1]),
                    oh.make_tensor_value_info("flag", onnx.TensorProto.BOOL, []),
                ],
                [oh.make_tensor_value_info("y", FLOAT, [1])],
            ),
            opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("example.custom", 1)],
        )
    )
    from onnxopt.ops import all_graphs, nested_graphs

    names = [g.name for g in nested_graphs(model.graph)]
    assert names == [g.name for g in model.graph.subgraphs()]
    # (onnx.helper writes attributes sorted by name: else_branch before then_branch)
    assert names == ["custom", "else", "then", "loop_body", "leaf2", "leaf"]
    assert [g.name for g in all_graphs(model)] == ["m", *names]
