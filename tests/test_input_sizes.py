"""Input sizes for models whose dims must fit together: a KV-cache decoder's total = past + seq.

Validation and bench generate inputs from the symbolic dims. Dims written as expressions
(``past + seq``) are computed; independent names that the model still relates are found by
running the model on candidate relations (real ORT sessions throughout).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import pytest
from click.testing import CliRunner

from onnxopt import api, io
from onnxopt.bench.run import resolve_shapes
from onnxopt.cli import main
from onnxopt.input_sizes import MAX_DIM, DimSymbols, SizePlan, parse_expression
from onnxopt.validate import InputSpec, input_specs, validate


def kv_like(total: str = "total") -> onnx.ModelProto:
    """Concat(past, x) joined with ``mask`` on the last axis: runs only when total = past + seq."""
    f, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    nodes = [
        oh.make_node("Concat", ["past", "x"], ["present"], axis=1),
        oh.make_node("Cast", ["mask"], ["maskf"], to=f),
        oh.make_node("Unsqueeze", ["maskf", "two"], ["mask3"]),
        oh.make_node("Concat", ["present", "mask3"], ["masked"], axis=2),
        oh.make_node("Identity", ["masked"], ["y"]),
    ]
    graph = oh.make_graph(
        nodes,
        "kv_like",
        [
            oh.make_tensor_value_info("x", f, ["batch", "seq", 4]),
            oh.make_tensor_value_info("past", f, ["batch", "past", 4]),
            oh.make_tensor_value_info("mask", i64, ["batch", total]),
        ],
        [
            oh.make_tensor_value_info("y", f, ["batch", None, 5]),
            oh.make_tensor_value_info("present", f, ["batch", None, 4]),
        ],
        [oh.make_tensor("two", i64, [1], [2])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def dims_spec(dims: tuple[str | int | None, ...]) -> InputSpec:
    return InputSpec("x", np.dtype(np.float32), dims)


def optimized(proto: onnx.ModelProto, **kwargs: object) -> api.OptimizeResult:
    return api.optimize(io.model_from_proto(proto, "<kv>"), **kwargs)  # type: ignore[arg-type]


def shapes_of(trial: dict[str, tuple[int, ...]]) -> tuple[int, int, int]:
    """(seq, past, total) of one validation trial."""
    return trial["x"][1], trial["past"][1], trial["mask"][1]


def test_independent_dims_are_related_by_running_the_model() -> None:
    result = optimized(kv_like())
    validation = result.report.validation
    assert validation is not None and validation.passed
    fitting = [t for t in validation.trials if shapes_of(t)[0] + shapes_of(t)[1] == shapes_of(t)[2]]
    assert len(fitting) >= 1 and len(validation.trials) >= 2
    assert any("total = seq + past" in note for note in validation.notes), validation.notes


def test_a_dim_written_as_an_expression_is_computed() -> None:
    result = optimized(kv_like("past + seq"))
    validation = result.report.validation
    assert validation is not None and validation.passed and not validation.notes
    assert len(validation.trials) >= 2
    assert all(shapes_of(t)[0] + shapes_of(t)[1] == shapes_of(t)[2] for t in validation.trials)


def test_given_sizes_are_tried_first_and_doubled() -> None:
    result = optimized(kv_like(), dims={"past": 4, "seq": 2, "total": 6})
    validation = result.report.validation
    assert validation is not None and validation.passed and not validation.notes
    assert [shapes_of(t) for t in validation.trials] == [(2, 4, 6), (4, 8, 12)]


def test_validate_says_how_to_size_dims_when_nothing_runs() -> None:
    # The mask must be as long as past + 2 * seq: no candidate relation fits, no plan runs at 1.
    proto = kv_like()
    proto.graph.node[0].input.append("x")
    model = io.model_from_proto(proto, "<kv>")
    from onnxopt.validate import CannotValidate

    with pytest.raises(CannotValidate, match="--dim NAME=SIZE"):
        validate(model, model.clone(), sizes={"batch": 2})


@pytest.mark.parametrize(
    "text",
    [
        "seq-len",  # a hyphenated name, not seq minus len
        "__import__('os').system('true')",
        "(" * 300 + "seq" + ")" * 300,
        "seq ** 2",
        "seq / 2",
        "seq if past else total",
        "x" * 500,
    ],
)
def test_dim_names_that_are_not_arithmetic_over_dims_stay_opaque(text: str) -> None:
    assert parse_expression(text, ["seq", "past", "total"]) is None
    symbols = DimSymbols.of([dims_spec((text, "seq"))])
    assert text in symbols.atoms and text not in symbols.expressions


def test_an_expression_too_large_makes_no_plan() -> None:
    spec = dims_spec(("seq", "seq * 1000"))
    symbols = DimSymbols.of([spec])
    assert "seq * 1000" in symbols.expressions
    assert symbols.shapes([spec], symbols.constant(1)) == [(1, 1000)]
    assert symbols.shapes([spec], symbols.constant(MAX_DIM // 10)) is None  # past MAX_DIM
    assert (
        DimSymbols.of([dims_spec(("seq * 99999999999",))]).shapes(
            [dims_spec(("seq * 99999999999",))], SizePlan({"seq": 1}, 1)
        )
        is None
    )


def test_bench_shapes_compute_expressions_and_apply_a_relation(tmp_path: Path) -> None:
    specs = input_specs(io.model_from_proto(kv_like("past + seq"), "<kv>"))
    shapes = resolve_shapes(specs, {}, {"seq": 1, "past": 64}, {})
    assert shapes["mask"] == (1, 65)
    plain = input_specs(io.model_from_proto(kv_like(), "<kv>"))
    relation = DimSymbols.of(plain).relations()[0]
    assert str(relation) == "seq = past + total"  # first candidate; not the one the model needs

    path = tmp_path / "kv.onnx"
    onnx.save(kv_like(), path)
    result = CliRunner().invoke(
        main,
        ["bench", str(path), "--budget", "0.2", "--no-memory", "--threads", "1", "--json"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert any("total = seq + past" in note for note in report["notes"]), report["notes"]
    (point,) = report["points"]
    assert point["shapes"]["mask"][1] == point["shapes"]["x"][1] + point["shapes"]["past"][1]


def test_a_torch_kv_cache_export_validates_without_given_inputs(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100)
    model = transformers.GPT2LMHeadModel(config).eval()

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: object, mask: object, key: object, value: object) -> tuple:
            cache = transformers.DynamicCache(config=config)
            cache.update(key, value, 0)
            out = self.model(input_ids=ids, attention_mask=mask, past_key_values=cache)
            layer = out.past_key_values.layers[0]
            return out.logits, layer.keys, layer.values

    ids = torch.randint(0, 100, (2, 3))
    past = torch.randn(2, 2, 4, 16)
    path = tmp_path / "step.onnx"
    torch.onnx.export(
        Step(),
        (ids, torch.ones(2, 7, dtype=torch.int64), past, past),
        path,
        input_names=["input_ids", "attention_mask", "past_key", "past_value"],
        output_names=["logits", "present_key", "present_value"],
        dynamic_axes={
            "input_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "total"},
            "past_key": {0: "batch", 2: "past"},
            "past_value": {0: "batch", 2: "past"},
        },
        dynamo=False,
    )
    out = tmp_path / "out.onnx"
    result = CliRunner().invoke(
        main, ["optimize", str(path), "-o", str(out), "--json"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    validation = json.loads(result.stdout)["validation"]
    assert validation["passed"] and len(validation["trials"]) >= 2
    for trial in validation["trials"]:
        assert trial["attention_mask"][1] == trial["input_ids"][1] + trial["past_key"][2]
    assert any("total = seq + past" in note for note in validation["notes"])


def test_rotary_position_ids_stay_below_the_cache_rows() -> None:
    f, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    rng = np.random.default_rng(0)
    cache = rng.standard_normal((40, 4)).astype(np.float32)
    graph = oh.make_graph(
        [
            oh.make_node(
                "RotaryEmbedding", ["x", "ids", "cos", "sin"], ["y"], domain="com.microsoft"
            )
        ],
        "rotary",
        [
            oh.make_tensor_value_info("x", f, ["batch", "seq", 8]),
            oh.make_tensor_value_info("ids", i64, ["batch", "seq"]),
        ],
        [oh.make_tensor_value_info("y", f, ["batch", "seq", 8])],
        [onnx.numpy_helper.from_array(cache, "cos"), onnx.numpy_helper.from_array(cache, "sin")],
    )
    proto = oh.make_model(
        graph,
        opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)],
        ir_version=8,
    )
    specs = {s.name: s for s in input_specs(io.model_from_proto(proto, "<rotary>"))}
    assert specs["ids"].int_high == 40


def test_fallback_sizes_keep_the_batch_at_one() -> None:
    """A model that runs only at S == 16 is validated at B = 1 (before: B = S = 16, and a ViT
    whose image must be 224² ran on 224 images, gigabytes of activations)."""
    weight = onnx.numpy_helper.from_array(np.ones((16, 4), np.float32), "w")
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["B", "S"])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["B", 4])],
        [weight],
    )
    model = io.model_from_proto(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    symbols = DimSymbols.of(input_specs(model))
    assert symbols.batch == frozenset({"B"})
    assert symbols.constant(16).sizes == {"B": 1, "S": 16}
    assert symbols.constant(2).sizes == {"B": 2, "S": 2}
    report = validate(model, model)
    assert report.passed and report.trials == ({"x": (1, 16)},)


def _waveform_model(taps: int = 400, stride: int = 320) -> onnx.ModelProto:
    """wav2vec2's first layer: a 1-D Conv over [batch, samples] that needs >= ``taps`` samples."""
    weight = onnx.numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((8, 1, taps)).astype(np.float32), "w"
    )
    graph = oh.make_graph(
        [
            oh.make_node("Unsqueeze", ["x", "one"], ["x3"]),
            oh.make_node("Conv", ["x3", "w"], ["y"], strides=[stride]),
        ],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "samples"])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [weight, oh.make_tensor("one", onnx.TensorProto.INT64, [1], [1])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_a_waveform_longer_than_the_fallback_sizes_is_tried_at_signal_lengths() -> None:
    """Before: 'the original model does not run on ONNX Runtime with generated inputs' unless
    the user gave --dim samples=16000; now the signal's length is tried at 1000 and 1600."""
    model = io.model_from_proto(_waveform_model())
    report = validate(model, model.clone())
    assert report.passed
    assert report.trials == ({"x": (1, 1000)}, {"x": (1, 1600)})
    assert any("samples from 1000, 1600, 4000, 16000" in note for note in report.notes)


def _spectrum_model() -> onnx.ModelProto:
    """A spectral front end: raw audio [batch, samples] -> DFT along the samples -> power. It runs
    at any length, but one like onnx-asr's wespeaker features kills ONNX Runtime 1.32 (SIGFPE)
    given fewer samples than its window."""
    graph = oh.make_graph(
        [
            oh.make_node("Unsqueeze", ["x", "last"], ["x3"]),
            oh.make_node("DFT", ["x3"], ["spectrum"], axis=1, onesided=1),
            oh.make_node("ReduceSumSquare", ["spectrum"], ["y"], axes=[-1], keepdims=0),
        ],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "samples"])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [oh.make_tensor("last", onnx.TensorProto.INT64, [1], [-1])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_a_spectral_front_end_is_tried_at_signal_lengths_first() -> None:
    model = io.model_from_proto(_spectrum_model())
    report = validate(model, model.clone())
    assert report.passed
    assert report.trials == ({"x": (1, 1000)}, {"x": (1, 1600)})
    assert any("computes a spectrum" in note for note in report.notes)
    # The same signal without the DFT starts at the usual sizes.
    plain = io.model_from_proto(_waveform_model(taps=1, stride=1))
    assert validate(plain, plain.clone()).trials[0] == {"x": (1, 1)}


def test_signal_lengths_are_not_tried_for_token_ids_or_images() -> None:
    ids = InputSpec("ids", np.dtype(np.int64), ("batch", "seq"))
    image = InputSpec("image", np.dtype(np.float32), ("batch", 3, "height", "width"))
    audio = InputSpec("audio", np.dtype(np.float32), ("batch", "samples"))
    from onnxopt.validate import _signal_dims

    symbols = DimSymbols.of([ids, image, audio])
    assert _signal_dims([ids, image, audio], symbols) == ["samples"]
    shared = InputSpec("mask", np.dtype(np.int64), ("batch", "samples"))
    assert _signal_dims([audio, shared], DimSymbols.of([audio, shared])) == []


def test_dims_named_apart_per_input_are_sized_per_axis() -> None:
    """tf2onnx names every input's dims apart (``unk__301``...) though input_ids and
    attention_mask must agree: after the per-name plans fail, one size per axis runs them at
    [3, 5], not only at the constant sizes 1 and 2."""
    i64 = onnx.TensorProto.INT64
    graph = oh.make_graph(
        [oh.make_node("Add", ["ids", "mask"], ["y"])],
        "named_apart",
        [
            oh.make_tensor_value_info("ids", i64, ["unk__1", "unk__2"]),
            oh.make_tensor_value_info("mask", i64, ["unk__3", "unk__4"]),
        ],
        [oh.make_tensor_value_info("y", i64, [None, None])],
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    validation = optimized(proto).report.validation
    assert validation is not None and validation.passed
    assert [tuple(t["ids"]) for t in validation.trials] == [(1, 1), (3, 5)]
    assert all(t["ids"] == t["mask"] for t in validation.trials)


def test_generated_attention_masks_keep_a_token_in_every_row() -> None:
    """A row of padding alone (an empty sequence) is ill-conditioned under a -10000 mask; an
    input named as a mask gets a real token in each row, other 0/1 inputs stay as drawn."""
    from onnxopt.validate import inputs_of_shapes

    specs = [
        InputSpec("attention_mask", np.dtype(np.int64), ("b", "s")),
        InputSpec("input_mask:0", np.dtype(np.int32), ("b", "s")),  # TF1 BERT's (tf2onnx)
        InputSpec("keep", np.dtype(np.bool_), ("b", "s")),
    ]
    feeds = inputs_of_shapes(specs, [(512, 3)] * 3, np.random.default_rng(0))
    assert feeds is not None
    keep = np.asarray(feeds["keep"])
    for name in ("attention_mask", "input_mask:0"):
        mask = np.asarray(feeds[name])
        assert mask.any(axis=-1).all() and set(np.unique(mask)) == {0, 1}
        assert not mask.all(axis=-1).all()  # still padded where drawn so
    assert not keep.any(axis=-1).all()  # about 64 of 512 rows drawn empty stay empty


def test_bench_looks_for_sizes_of_a_spectral_front_end_at_signal_lengths(tmp_path: Path) -> None:
    """When a benchmark's sizes fail, its search starts at the signal lengths for a spectrum's
    signal (128 samples first, as for other models, could crash ONNX Runtime)."""
    from onnxopt.validate import shared_sessions, sizes_that_run

    path = tmp_path / "spectrum.onnx"
    onnx.save(_spectrum_model(), path)
    specs = input_specs(io.model_from_proto(_spectrum_model()))
    with shared_sessions():
        assert sizes_that_run(path, specs, spectral=["samples"]) == {"x": (1, 1000)}
        assert sizes_that_run(path, specs) == {"x": (1, 128)}
