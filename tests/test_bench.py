"""onnxopt bench: statistics, input shapes, and the CLI end to end on real ORT sessions (no timings asserted)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from onnxopt import io
from onnxopt.bench import memory
from onnxopt.bench.run import parse_sweep, resolve_shapes
from onnxopt.bench.stats import median_interval, median_rank, paired_speedup
from onnxopt.cli import main
from onnxopt.errors import UsageError
from onnxopt.validate import input_specs

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "models" / "default.onnx"
CUDA_PRESENT = "CUDAExecutionProvider" in ort.get_available_providers()

TWO_INPUTS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, seq, 8] x, int64[batch, seq] ids) => (float[batch, seq, 8] y) {
    y = Relu(x)
}
"""


def bench(*args: str) -> dict:
    result = CliRunner().invoke(main, ["bench", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def variants(report: dict, provider: str = "cpu", point: int = 0) -> dict[str, dict]:
    group = next(g for g in report["points"][point]["groups"] if g["provider"] == provider)
    return {
        (v["name"] + (f" ({v['ort_level']})" if v["ort_level"] else "")): v
        for v in group["variants"]
    }


def test_bench_times_other_files_in_the_same_rounds(tmp_path):
    # The same model at -O1 stands in for another tool's output: timed and checked like the rest.
    other = tmp_path / "other.onnx"
    args = ["optimize", str(DEFAULT_MODEL), "-o", str(other), "-O", "1", "--no-reference"]
    assert CliRunner().invoke(main, args).exit_code == 0
    report = bench(
        str(DEFAULT_MODEL),
        *("--compare", f"o1={other}", "--compare", str(other), "--ort-level", "all"),
        *("--budget", "0.2", "--threads", "1", "--no-memory", "--clock", "cpu"),
    )
    found = variants(report)
    assert list(found) == ["original (all)", "optimized (all)", "o1 (all)", "other (all)"]
    for label in ("o1 (all)", "other (all)"):
        assert found[label]["speedup_baseline"] == "original (all)"
        assert found[label]["speedup"]["median"] > 0
        assert found[label]["vs_original"]["passed"]


def test_median_rank_is_the_exact_binomial_order_statistic():
    assert median_rank(5) is None  # [min, max] covers only 1 - 2/32 = 93.75%
    rank, coverage = median_rank(6)
    assert rank == 1 and coverage == pytest.approx(1 - 2 / 64)
    rank, coverage = median_rank(100)
    assert rank == 40 and coverage >= 0.95  # the textbook value for n = 100


def test_paired_speedup_is_the_median_of_ratios_with_an_interval_around_it():
    rng = np.random.default_rng(0)
    noise = rng.uniform(1.0, 3.0, size=200)  # machine noise common to both members of a pair
    baseline = 2.0 * noise
    candidate = 1.0 * noise * rng.uniform(0.99, 1.01, size=200)
    interval = paired_speedup(baseline, candidate)
    assert interval.low <= interval.median <= interval.high
    assert interval.median == pytest.approx(2.0, rel=0.01)
    assert interval.relative_half_width < 0.01
    assert median_interval([1.0, 2.0, 3.0]).low is None


def test_block_bootstrap_widens_the_interval_by_the_spread_between_sessions():
    rng = np.random.default_rng(1)
    shifts = [
        0.96,
        1.0,
        1.04,
        0.98,
        1.02,
        1.0,
    ]  # each session generation runs a bit faster or slower
    values = np.concatenate([shift * rng.uniform(0.995, 1.005, size=50) for shift in shifts])
    blocks = np.repeat(np.arange(len(shifts)), 50)
    naive = median_interval(values)
    blocked = paired_speedup(values, np.ones_like(values), blocks=blocks.tolist())
    assert blocked.blocks == 6 and blocked.median == pytest.approx(naive.median)
    assert blocked.high - blocked.low > 2 * (naive.high - naive.low)
    assert paired_speedup(values, np.ones_like(values), blocks=[0] * values.size) == naive


def test_shapes_come_from_pins_then_sweeps_then_examples_then_defaults():
    model = io.model_from_proto(onnx.parser.parse_model(TWO_INPUTS))
    specs = input_specs(model)
    assert resolve_shapes(specs, {}, {}, {}) == {"x": (1, 128, 8), "ids": (1, 128)}
    assert resolve_shapes(specs, {}, {"batch": 4, "sequence": 16}, {}) == {
        "x": (4, 16, 8),
        "ids": (4, 16),
    }
    assert resolve_shapes(specs, {}, {"seq": 5}, {"x": (2, 7, 8)}) == {
        "x": (2, 5, 8),
        "ids": (2, 5),
    }
    # A pinned input fixes its symbols for the other inputs.
    assert resolve_shapes(specs, {"x": (3, 9, 8)}, {}, {}) == {"x": (3, 9, 8), "ids": (3, 9)}
    with pytest.raises(UsageError, match="does not fit"):
        resolve_shapes(specs, {"x": (3, 9)}, {}, {})
    with pytest.raises(UsageError, match="no input 'z'"):
        resolve_shapes(specs, {"z": (1,)}, {}, {})
    with pytest.raises(UsageError, match="not a dynamic dim"):
        resolve_shapes(specs, {}, {"height": 3}, {})
    assert parse_sweep("batch=1,4,16") == ("batch", (1, 4, 16))
    with pytest.raises(UsageError):
        parse_sweep("batch=0")


def test_bench_cpu_reports_every_variant_and_skips_cuda_with_a_reason(tmp_path):
    plot = tmp_path / "latency.png"
    report = bench(
        *(str(DEFAULT_MODEL), "--budget", "0.3", "--threads", "1", "--provider", "cpu,cuda"),
        *("--plot", str(plot), "--no-memory"),
    )
    assert report["schema_version"] == 1
    assert report["optimized"]["nodes_after"] <= report["optimized"]["nodes_before"]
    point = report["points"][0]
    assert point["shapes"] == {"image": [1, 3, 32, 32]}
    found = variants(report)
    assert list(found) == [
        "original (all)",
        "optimized (all)",
        "original (disable)",
        "optimized (disable)",
    ]
    for name, variant in found.items():
        latency = variant["latency"]
        assert latency["runs"] >= 3
        assert 0 < latency["minimum"] <= latency["median"] <= latency["p90"] <= latency["p99"]
        assert variant["create_seconds"] > 0 and variant["first_run_seconds"] > 0
        if name.startswith("optimized"):
            speedup = variant["speedup"]
            assert speedup["blocks"] >= 1  # generations of sessions the interval spans
            assert speedup["median"] > 0 and speedup["low"] <= speedup["median"] <= speedup["high"]
            assert variant["speedup_baseline"] == name.replace("optimized", "original")
        if name != "original (disable)":
            assert variant["vs_original"]["passed"], variant["vs_original"]
    cuda = next(g for g in point["groups"] if g["provider"] == "cuda")
    if CUDA_PRESENT:
        assert cuda["skipped"] is None
    else:
        assert "CUDAExecutionProvider" in cuda["skipped"] and cuda["variants"] == []
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_memory_is_measured_in_a_child_process():
    feeds = {"image": np.zeros((1, 3, 32, 32), np.float32)}
    job = {
        "kind": "ort",
        "model": str(DEFAULT_MODEL),
        "provider": "cpu",
        "level": "all",
        "threads": 1,
    }
    result = memory.measure(job, feeds)
    assert result.error is None
    assert result.load_bytes is not None and result.load_bytes > 0
    assert result.peak_bytes is not None and result.peak_bytes >= result.load_bytes


def test_bench_uses_a_given_optimized_file_and_sweeps_batch(tmp_path):
    optimized = tmp_path / "default.opt.onnx"
    assert (
        CliRunner().invoke(main, ["optimize", str(DEFAULT_MODEL), "-o", str(optimized)]).exit_code
        == 0
    )
    report = bench(
        str(DEFAULT_MODEL),
        *("--optimized", str(optimized), "--sweep", "batch=1,3", "--ort-level", "disable"),
        *("--budget", "0.2", "--threads", "1", "--no-memory", "--clock", "cpu"),
    )
    assert report["optimized"]["source"] == str(optimized)
    assert report["environment"]["clock"] == "cpu"
    assert [p["shapes"]["image"][0] for p in report["points"]] == [1, 3]
    for index in range(2):
        found = variants(report, point=index)
        assert list(found) == ["original (disable)", "optimized (disable)"]
        assert found["optimized (disable)"]["vs_original"]["passed"]
        assert found["original (disable)"]["memory"] is None


def test_bench_times_eager_pytorch_on_the_same_inputs(tmp_path):
    torch = pytest.importorskip("torch")
    from tests.bench_factories import tiny_mlp

    module, example = tiny_mlp()
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(
        module, example, str(path), input_names=["x"], output_names=["y"],
        dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, dynamo=False,
    )  # fmt: skip
    factory = "tests.bench_factories:tiny_mlp"
    report = bench(
        str(path), "--torch", factory, "--ort-level", "all", "--budget", "0.3", "--no-memory"
    )
    assert report["points"][0]["shapes"] == {"x": [2, 16]}  # from the factory's example inputs
    found = variants(report)
    assert list(found) == ["original (all)", "optimized (all)", "torch-eager"]
    eager = found["torch-eager"]
    assert eager["speedup_baseline"] == "original (all)" and eager["speedup"]["median"] > 0
    assert eager["vs_original"]["passed"] and found["optimized (all)"]["vs_eager"]["passed"]


def test_bench_skips_a_compared_file_that_ort_cannot_load(tmp_path):
    # Other tools sometimes write files ORT refuses (onnxscript on GPT-2 dynamo did): say so, time the rest.
    model = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17, "custom.domain" : 1]>
        g (float[N, 3, 32, 32] image) => (float[N, 10] y) {
            y = custom.domain.NoSuchKernel(image)
        }
        """
    )
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    report = bench(
        str(DEFAULT_MODEL),
        *("--compare", f"broken={bad}", "--ort-level", "all"),
        *("--budget", "0.2", "--threads", "1", "--no-memory", "--clock", "cpu"),
    )
    assert list(variants(report)) == ["original (all)", "optimized (all)"]
    assert any(
        n.startswith("broken was not timed: ONNX Runtime cannot load it") for n in report["notes"]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--torch-compile"], "--torch-compile needs --torch"),
        (["--sweep", "height=1,2"], "not a dynamic dim"),
        (["--provider", "tpu"], "choose from cpu, cuda"),
        (["--ort-level", "max"], "choose from disable"),
        (["--torch", "tests.bench_factories:missing"], "has no attribute missing"),
        (["--torch", "resnet_that_no_zoo_has"], "--torch resnet_that_no_zoo_has"),
        (
            ["--compare", "optimized=models/default.onnx"],
            "--compare 'optimized=models/default.onnx'",
        ),
        (["--compare", "a=models/default.onnx", "--compare", "a=x.onnx"], "unique NAME"),
        (["--compare", "b=missing.onnx"], "missing.onnx"),
    ],
)
def test_bench_usage_errors_exit_2(args, message):
    result = CliRunner().invoke(
        main, ["bench", str(DEFAULT_MODEL), "--budget", "0.1", "--no-memory", *args]
    )
    assert result.exit_code == 2
    assert message in result.stderr


@pytest.mark.slow
def test_bench_torch_compile(tmp_path):
    pytest.importorskip("torch")
    import torch

    from tests.bench_factories import tiny_mlp

    module, example = tiny_mlp()
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(
        module, example, str(path), input_names=["x"], output_names=["y"], dynamo=False
    )
    report = bench(
        str(path), "--torch", "tests.bench_factories:tiny_mlp", "--torch-compile", "--ort-level", "all",
        "--budget", "0.5", "--threads", "1",
    )  # fmt: skip
    found = variants(report)
    assert found["torch-compile"]["vs_eager"]["passed"]
    eager = found["torch-eager"]
    assert (
        eager["memory"]["error"] is None and eager["memory"]["peak_bytes"] > 0
    )  # in a child process
    assert math.isfinite(found["torch-compile"]["speedup"]["median"])


# x is flattened through a Reshape whose target is computed from Shape(x), as exporters write
# them: ONNX shape inference alone cannot size what follows, so the floor folds the shape first.
OUTER_PRODUCT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[b, s] x) => (float y) {
    shape = Shape(x)
    n = ReduceProd <keepdims = 1> (shape)
    flat = Reshape(x, n)
    zero = Constant <value = int64[1] {0}> ()
    one = Constant <value = int64[1] {1}> ()
    column = Unsqueeze(flat, one)
    row = Unsqueeze(flat, zero)
    outer = MatMul(column, row)
    y = ReduceSum <keepdims = 0> (outer)
}
"""


def test_run_floor_sizes_intermediates_behind_computed_reshapes():
    from onnxopt.analysis.memory import run_floor
    from onnxopt.bench.run import _run_floor

    model = io.model_from_proto(onnx.parser.parse_model(OUTER_PRODUCT))
    inferred = run_floor(model, {"x": (4, 8)})
    assert inferred is not None and inferred.unknown > 0  # ONNX inference alone stops at flat
    floor = _run_floor(model, {"x": (4, 8)})
    assert floor is not None and floor.unknown == 0
    assert floor.largest == ("outer", (32, 32), 32 * 32 * 4)
    # flat and its two views are one buffer; outer is live with it at the MatMul
    assert floor.activation_bytes == 32 * 32 * 4 + 32 * 4 + 64 + 64  # shape and n, aligned to 64
    assert floor.weight_bytes == 2 * 64  # the axes constants, lifted to initializers by folding
    assert [str(v.shape) for v in model.graph.inputs] == ["[b,s]"]  # left untouched


def test_bench_refuses_input_sizes_beyond_available_memory_before_running(tmp_path):
    # At x 1024 x 1024 the outer product is 2^20 x 2^20 floats, 4 TiB: running it would only end
    # with the process killed. bench says so in one line before any session is made.
    path = tmp_path / "outer.onnx"
    onnx.save(onnx.parser.parse_model(OUTER_PRODUCT), path)
    result = CliRunner().invoke(
        main, ["bench", str(path), "--shape", "x:1024x1024", "--budget", "0.2", "--no-memory"]
    )
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnxopt: error: at inputs x 1024x1024")
    assert "need at least 16384.0 GiB" in lines[0]  # 2 models x 2 ORT levels x 4 TiB
    assert "'outer' [1048576, 1048576] alone takes 4096.0 GiB" in lines[0]
    # the same model at a size that fits is timed as usual
    report = bench(str(path), "--shape", "x:4x8", "--budget", "0.2", "--no-memory")
    assert variants(report)["optimized (all)"]["latency"]["runs"] > 0


# silero-vad's state [2, ?, 128] shares its unnamed middle dim with the audio's unnamed batch;
# bench's defaults size unnamed dims apart (batch 1, the rest 128), so the original fails there.
UNNAMED_BUT_EQUAL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[?, 8] x, float[2, ?, 8] h) => (float[?, 16] y) <int64 zero = {0}> {
    first = Gather<axis = 0>(h, zero)
    y = Concat<axis = 1>(x, first)
}
"""


def test_bench_finds_sizes_the_original_runs_at_when_its_defaults_do_not(tmp_path):
    path = tmp_path / "state.onnx"
    onnx.save(onnx.parser.parse_model(UNNAMED_BUT_EQUAL), path)
    report = bench(str(path), "--budget", "0.2", "--no-memory", "--clock", "cpu")
    assert report["points"][0]["shapes"] == {"x": [128, 8], "h": [2, 128, 8]}
    assert any(n.startswith("timed at x 128x8, h 2x128x8: the original") for n in report["notes"])
    assert variants(report)["optimized (all)"]["latency"]["runs"] > 0
    # Sizes the user chose are kept, and the failure is reported as before.
    result = CliRunner().invoke(
        main, ["bench", str(path), "--shape", "x:1x8", "--shape", "h:2x3x8", "--budget", "0.2"]
    )
    assert result.exit_code == 2, result.output
    assert (
        "the original model fails on ONNX Runtime (cpu) with the generated inputs" in result.stderr
    )


def test_bench_times_a_waveform_model_at_a_signal_length_it_runs_at(tmp_path):
    """wav2vec2's front end needs >= 400 samples; bench's defaults (<= 256) do not run it."""
    from tests.test_input_sizes import _waveform_model

    path = tmp_path / "wave.onnx"
    onnx.save(_waveform_model(), path)
    report = bench(str(path), "--budget", "0.2", "--no-memory", "--clock", "cpu")
    assert report["points"][0]["shapes"] == {"x": [1, 1000]}
    assert variants(report)["optimized (all)"]["latency"]["runs"] > 0


def test_bench_times_a_spectral_front_end_at_a_second_of_audio(tmp_path):
    from tests.test_input_sizes import _spectrum_model

    path = tmp_path / "spectrum.onnx"
    onnx.save(_spectrum_model(), path)
    report = bench(str(path), "--budget", "0.2", "--no-memory", "--clock", "cpu")
    assert report["points"][0]["shapes"] == {"x": [1, 16000]}
    assert any("computes a spectrum" in note for note in report["notes"])
