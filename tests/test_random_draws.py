"""Validation of models that draw random numbers: the optimized model runs on the original's draws."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxopt import api, io
from onnxopt.validate import CannotValidate, validate
from tests.graphs import parse_model

# VITS's shape: noise drawn like an intermediate, scaled and added to a mean computed before it.
NOISY = """
<ir_version: 8, opset_import: ["" : 18]>
g (float[N, 4] x) => (float[N, 4] y) {
    two = Constant <value = float {2.0}> ()
    half = Constant <value = float {0.5}> ()
    shape = Shape(x)
    flat = Reshape(x, shape)
    mean = Mul(flat, two)
    noise = RandomNormalLike <dtype = 1> (mean)
    scaled = Mul(noise, half)
    y = Add(mean, scaled)
}
"""


def _mutated(text: str, old: str, new: str) -> onnx.ModelProto:
    assert old in text
    return onnx.parser.parse_model(text.replace(old, new))


def test_an_optimized_random_model_validates_on_the_originals_draws() -> None:
    original = parse_model(NOISY)
    result = api.optimize(original)
    report = result.report.validation
    assert report is not None and report.passed, report
    assert [n.op_type for n in result.model.graph].count("RandomNormalLike") == 1
    assert len(result.model.graph) < len(original.graph)  # the Reshape to its own shape went
    assert any("the optimized model ran on the original's draws" in n for n in report.notes)
    compared = [o.name for o in report.outputs]
    assert compared == ["y", "RandomNormalLike input 0"], compared


def test_a_wrong_use_of_the_draw_fails() -> None:
    wrong = io.model_from_proto(
        _mutated(NOISY, "scaled = Mul(noise, half)", "scaled = Mul(noise, two)")
    )
    report = validate(parse_model(NOISY), wrong)
    assert not report.passed
    assert report.failing_outputs() == ["y"]


def test_a_wrong_input_to_the_random_op_fails() -> None:
    """The draw is fed from the original, so what decides it is compared on its own."""
    wrong = io.model_from_proto(
        _mutated(NOISY, "RandomNormalLike <dtype = 1> (mean)", "RandomNormalLike <dtype = 1> (x)")
    )
    report = validate(parse_model(NOISY), wrong)
    assert report.failing_outputs() == ["RandomNormalLike input 0"]


def test_bernoulli_probabilities_are_compared() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[N, 3] p) => (float[N, 3] y) {
        s = Sigmoid(p)
        keep = Bernoulli <dtype = 1> (s)
        y = Mul(keep, p)
    }
    """
    assert validate(parse_model(text), parse_model(text)).passed
    wrong = parse_model(text.replace("s = Sigmoid(p)", "s = Tanh(p)"))
    report = validate(parse_model(text), wrong)
    assert "Bernoulli input 0" in report.failing_outputs()


def test_a_draw_that_is_a_graph_output_is_fed_through() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[N, 4] x) => (float[N, 4] noise, float[N, 4] y) {
        noise = RandomUniformLike <dtype = 1> (x)
        y = Add(x, noise)
    }
    """
    report = validate(parse_model(text), parse_model(text))
    assert report.passed and [o.name for o in report.outputs][:2] == ["noise", "y"]


def test_a_draw_inside_a_subgraph_is_not_pinned() -> None:
    """A Loop body's draw cannot be fed from outside: validation says why it cannot compare."""
    text = """
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[4] x, bool c) => (float[4] y) {
        y = If (c) <then_branch = t () => (float[4] a) {
            a = RandomNormalLike <dtype = 1> (x)
        }, else_branch = e () => (float[4] b) {
            b = Neg(x)
        }>
    }
    """
    model = parse_model(text)
    with pytest.raises(CannotValidate, match="draws inside a subgraph"):
        validate(model, model.clone(), inputs=[{"x": np.ones(4, np.float32), "c": np.array(True)}])


def test_a_random_model_file_is_optimized_from_the_cli(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from onnxopt.cli import main

    source = tmp_path / "noisy.onnx"
    onnx.save(onnx.parser.parse_model(NOISY), source)
    out = tmp_path / "noisy.opt.onnx"
    result = CliRunner().invoke(main, ["optimize", str(source), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "original's draws" in result.output
    assert [n.op_type for n in onnx.load(out).graph.node].count("RandomNormalLike") == 1


@pytest.mark.parametrize(
    "text",
    [
        # a draw of a fixed shape, no input; the name the pin would take is already a value's
        """
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[2, 3] x) => (float[2, 3] y) {
            n = RandomNormal <shape = [2, 3], dtype = 1> ()
            taken = Identity(x)
            y = Add(taken, n)
        }
        """,
        # sampled class indices (int32 by default) gathered back into the logits
        """
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[N, 5] logits) => (float[N, 2] y) {
            picked = Multinomial <sample_size = 2> (logits)
            y = GatherElements <axis = 1> (logits, picked)
        }
        """,
    ],
    ids=["random-normal", "multinomial"],
)
def test_other_random_ops_are_pinned(text: str) -> None:
    model = parse_model(text)
    for node in model.graph:
        if node.outputs[0].name == "taken":
            node.outputs[0].name = "onnxopt.draw0"
    report = validate(model, model.clone())
    assert report.passed and any("original's draws" in n for n in report.notes), report


def test_a_vits_text_to_speech_export_validates(tmp_path: Path) -> None:
    """transformers' VITS (MMS-TTS; Piper's voices have the same graph): the stochastic duration
    predictor and the prior each draw RandomNormalLike noise. Exported with its eager reference,
    which is not compared (PyTorch drew other noise) but whose inputs are validated on."""
    pytest.importorskip("transformers")
    from onnxopt.export import export

    path = tmp_path / "vits.onnx"
    export("benchmarks.arch_sweep:vits", path, exporter="torchscript")
    result = api.optimize(path, find_reference=True)
    report = result.report.validation
    assert report is not None and report.passed, report
    assert len(report.trials) == 3 and any("original's draws" in n for n in report.notes)
    assert result.report.reference is None
    assert [n.op_type for n in result.model.graph].count("RandomNormalLike") == 2
    assert result.report.after.nodes < result.report.before.nodes / 2


def test_bench_times_the_variants_on_the_same_draws(tmp_path: Path) -> None:
    """Each random op is seeded alike in every timed copy, so the variants' first runs drew the
    same noise and their outputs agree (unseeded, two sessions differ by the noise)."""
    from onnxopt.bench.run import BenchOptions, run_bench

    source = tmp_path / "noisy.onnx"
    onnx.save(onnx.parser.parse_model(NOISY), source)
    options = BenchOptions(
        ort_levels=("disable",), budget_seconds=0.2, sessions=1, memory=False, min_rounds=3,
        warmup_runs=1, shapes={"x": (2, 4)},
    )  # fmt: skip
    report = run_bench(source, options)
    [note] = [n for n in report.notes if "draws random numbers" in n]
    assert "RandomNormalLike" in note and "same seed" in note
    [optimized] = [
        v for p in report.points for g in p.groups for v in g.variants if v.name == "optimized"
    ]
    agreement = optimized.vs_original
    assert agreement is not None and agreement.outputs == 1
    assert agreement.max_abs == 0.0 and agreement.mismatches == 0
    assert "seed" not in [a for n in onnx.load(source).graph.node for a in n.attribute]


def test_a_dropout_in_training_mode_is_pinned_with_its_mask() -> None:
    """torch.onnx.export(..., training=TrainingMode.TRAINING) keeps Dropout drawing: its output
    and its mask are fed from the original; its constant ratio and flag are not compared."""
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 8] x) => (float[N, 8] y, bool[N, 8] kept) {
        r = Constant <value = float {0.5}> ()
        t = Constant <value = bool {1}> ()
        h = Relu(x)
        d, kept = Dropout(h, r, t)
        y = Add(d, x)
    }
    """
    report = validate(parse_model(text), parse_model(text))
    assert report.passed, report
    assert [o.name for o in report.outputs] == ["y", "kept", "Dropout input 0"]
    wrong = parse_model(text.replace("y = Add(d, x)", "y = Sub(d, x)"))
    assert validate(parse_model(text), wrong).failing_outputs() == ["y"]


def test_a_torch_export_in_training_mode_validates(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 4)
    )
    path = tmp_path / "train.onnx"
    torch.onnx.export(
        net, (torch.randn(2, 16),), str(path), dynamo=False, opset_version=17,
        training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
        input_names=["x"], dynamic_axes={"x": {0: "batch"}},
    )  # fmt: skip
    assert "Dropout" in [n.op_type for n in onnx.load(path).graph.node]
    result = api.optimize(path)
    report = result.report.validation
    assert report is not None and report.passed, report
    assert any("(Dropout" in n for n in report.notes), report.notes
    assert [n.op_type for n in result.model.graph].count("Dropout") == 1


def test_a_random_model_is_not_compared_with_eager_pytorch() -> None:
    """PyTorch drew other numbers: the reference's outputs say nothing of the export, so they are
    not compared (a warning says why); its inputs are still validation inputs."""
    from onnxopt.reference import Reference

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    reference = Reference({"x": x}, {"y": np.zeros((3, 4), np.float32)}, {})
    result = api.optimize(parse_model(NOISY), reference=reference)
    assert result.report.reference is None
    assert any("not compared with eager PyTorch" in w for w in result.report.warnings)
    report = result.report.validation
    assert report is not None and report.passed and report.trials[0] == {"x": (3, 4)}


def test_a_draw_read_inside_a_branch_is_fed_there_too() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[4] x, bool c) => (float[4] y) {
        noise = RandomNormalLike <dtype = 1> (x)
        y = If (c) <then_branch = t () => (float[4] a) {
            a = Add(x, noise)
        }, else_branch = e () => (float[4] b) {
            b = Sub(x, noise)
        }>
    }
    """
    both = [{"x": np.ones(4, np.float32), "c": np.array(flag)} for flag in (True, False)]
    assert validate(parse_model(text), parse_model(text), inputs=both).passed
    wrong = parse_model(text.replace("b = Sub(x, noise)", "b = Sub(noise, x)"))
    assert validate(parse_model(text), wrong, inputs=both).failing_outputs() == ["y"]


def test_two_unnamed_draws_are_both_pinned() -> None:
    """The feeds' Identity nodes are unnamed: named after the ops, two unnamed ops gave two nodes
    of one name, which ONNX Runtime refuses to load. The Dropout's flag is an input here."""
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x, bool train) => (float[N, 4] y) {
        p = Sigmoid(x)
        keep = Bernoulli <dtype = 1> (p)
        r = Constant <value = float {0.25}> ()
        d = Dropout(x, r, train)
        k = Mul(keep, d)
        y = Relu(k)
    }
    """
    report = validate(parse_model(text), parse_model(text))
    assert report.passed, report
    assert [o.name for o in report.outputs] == [
        "y", "Bernoulli input 0", "Dropout input 0", "Dropout input 2"
    ]  # fmt: skip


def test_a_draw_whose_output_a_pass_renamed_is_found_by_its_node_name() -> None:
    """eliminate-noops drops ``y = Identity(noise)`` and gives the draw the graph output's name;
    the twin is then the original's op of the same node name (found by the fuzzer)."""
    import onnx.helper as oh

    graph = oh.make_graph(
        [
            oh.make_node("RandomNormalLike", ["x"], ["noise"], name="draw", dtype=1),
            oh.make_node("Identity", ["noise"], ["y"], name="copy"),
        ],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4])],
    )
    model = io.model_from_proto(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))
    result = api.optimize(model)
    [draw] = [n for n in result.model.graph if n.op_type == "RandomNormalLike"]
    assert draw.outputs[0].name == "y"
    report = result.report.validation
    assert report is not None and report.passed, report


def test_bench_says_eager_pytorch_draws_its_own(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from onnxopt.bench.run import BenchOptions, run_bench
    from tests.bench_factories import noisy

    module, example = noisy()
    path = tmp_path / "noisy.onnx"
    torch.onnx.export(
        module, example, str(path), input_names=["x"], dynamic_axes={"x": {0: "batch"}},
        dynamo=False,
    )  # fmt: skip
    assert "RandomNormalLike" in [n.op_type for n in onnx.load(path).graph.node]
    options = BenchOptions(
        ort_levels=("all",), budget_seconds=0.2, sessions=1, memory=False, min_rounds=3,
        warmup_runs=1, torch="tests.bench_factories:noisy",
    )  # fmt: skip
    report = run_bench(path, options)
    [note] = [n for n in report.notes if "draws random numbers" in n]
    assert "PyTorch draws its own numbers" in note
