"""The command line and its reports: optimize, passes, inspect, levels, options, exit codes, determinism."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest
from click.testing import CliRunner

from onnxopt import io
from onnxopt.cli import EXIT_CHECK_FAILED, EXIT_ERROR, EXIT_OK, exit_code_for, main
from onnxopt.errors import (
    CheckFailed,
    ModelLoadError,
    ModelSaveError,
    OnnxoptError,
    UnsafeModelError,
    UsageError,
    ValidationError,
)
from onnxopt.passes import levels
from onnxopt.passes.base import Pass, PassResult
from onnxopt.passes.levels import ALL_PASSES, LEVELS
from onnxopt.validate import validate

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "models" / "default.onnx"
LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def cli(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnxopt: error: "), stderr
    return lines[0]


@pytest.fixture(scope="module")
def default_json(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("json") / "out.onnx"
    code, stdout, _ = cli("optimize", DEFAULT_MODEL, "-o", out, "--json")
    assert code == EXIT_OK
    return json.loads(stdout)


# ---------------------------------------------------------------------------------------------
# optimize


def test_optimize_writes_the_model_and_prints_a_report(tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    code, stdout, stderr = cli("optimize", DEFAULT_MODEL, "-o", out)
    assert code == EXIT_OK, stderr
    optimized = onnx.load(str(out))
    onnx.checker.check_model(optimized)
    before = len(onnx.load(str(DEFAULT_MODEL)).graph.node)
    after = len(optimized.graph.node)
    assert re.search(rf"nodes\s*│\s*{before}\s*│\s*{after}\s*│", stdout), stdout
    assert "validation on ONNX Runtime" in stdout and "logits" in stdout
    assert f"wrote {out}" in stderr and "wrote" not in stdout


def test_optimize_without_output_writes_nothing(tmp_path: Path) -> None:
    code, stdout, stderr = cli("optimize", DEFAULT_MODEL)
    assert code == EXIT_OK
    assert "no output written" in stderr
    assert "nodes" in stdout


def test_json_report_schema(default_json: dict) -> None:
    data = default_json
    assert data["schema_version"] == 1
    assert data["before"]["nodes"] == len(onnx.load(str(DEFAULT_MODEL)).graph.node)
    assert data["after"]["nodes"] <= data["before"]["nodes"]
    assert data["after"]["file_bytes"] > 0
    names = [p["name"] for p in data["passes"]]
    assert names and len(names) == len(set(names))
    assert set(names) <= {cls.name for cls in ALL_PASSES}
    for entry in data["passes"]:
        assert set(entry) == {"name", "runs", "seconds", "changes"}
    assert data["validation"]["passed"] is True
    assert [o["name"] for o in data["validation"]["outputs"]] == ["logits"]


def test_logs_go_to_stderr_json_to_stdout(tmp_path: Path) -> None:
    """A real process: logging is configured by the CLI, which pytest's own capture would mask."""
    proc = subprocess.run(
        [sys.executable, "-m", "onnxopt", "optimize", str(DEFAULT_MODEL), "--json", "-vv"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert proc.returncode == EXIT_OK, proc.stderr
    json.loads(proc.stdout)  # nothing but the JSON report on stdout
    assert "DEBUG onnxopt.passes.base: pass " in proc.stderr


def test_passes_lists_every_pass() -> None:
    code, stdout, _ = cli("passes")
    assert code == EXIT_OK
    for cls in ALL_PASSES:
        assert cls.name in stdout
    code, stdout, _ = cli("passes", "--json")
    rows = json.loads(stdout)
    assert [r["name"] for r in rows] == [cls.name for cls in ALL_PASSES]
    assert all(r["summary"] for r in rows)


def test_inspect_text_and_json() -> None:
    code, stdout, _ = cli("inspect", DEFAULT_MODEL)
    assert code == EXIT_OK
    proto = onnx.load(str(DEFAULT_MODEL))
    opset = {o.domain: o.version for o in proto.opset_import}[""]
    assert f"ai.onnx={opset}" in stdout
    assert "image" in stdout and "logits" in stdout and "batch" in stdout
    assert "Conv" in stdout and "parameters:" in stdout
    code, stdout, _ = cli("inspect", DEFAULT_MODEL, "--json")
    data = json.loads(stdout)
    assert data["nodes"] == len(proto.graph.node)
    assert data["opsets"][""] == opset
    assert data["inputs"][0]["name"] == "image" and data["inputs"][0]["shape"] == [
        "batch",
        3,
        32,
        32,
    ]
    assert sum(data["op_counts"].values()) == data["nodes"]
    weights = sum(onnx.numpy_helper.to_array(t).nbytes for t in proto.graph.initializer)
    assert data["parameter_bytes"] == weights


def test_inspect_bad_file(tmp_path: Path) -> None:
    code, _, stderr = cli("inspect", tmp_path / "missing.onnx")
    assert code == EXIT_ERROR
    assert "no such file" in one_error_line(stderr)


# ---------------------------------------------------------------------------------------------
# choosing passes


def _passes_run(*args: str) -> list[str]:
    code, stdout, stderr = cli("optimize", DEFAULT_MODEL, "--json", "--no-validate", *args)
    assert code == EXIT_OK, stderr
    return json.loads(stdout)["passes_run"]


def test_passes_option_runs_exactly_those() -> None:
    names = [cls.name for cls in ALL_PASSES][:2]
    assert _passes_run("--passes", ",".join(reversed(names))) == list(reversed(names))


def test_skipped_runs_are_counted_and_said() -> None:
    # The default model's cleanup rounds end and the attention group starts with shape inference
    # on a model nothing changed since: those runs are left out, counted, and the table says so.
    code, stdout, stderr = cli("optimize", DEFAULT_MODEL, "--json", "--no-validate")
    assert code == EXIT_OK, stderr
    data = json.loads(stdout)
    skipped = data["passes_skipped"]
    assert skipped > 0
    assert len(data["records"]) == len(data["passes_run"])
    code, stdout, stderr = cli("optimize", DEFAULT_MODEL, "--no-validate")
    assert code == EXIT_OK, stderr
    assert f"{skipped} run(s) skipped" in " ".join(stdout.split())


def test_disable_drops_a_pass() -> None:
    assert "eliminate-dead-code" in _passes_run()
    assert "eliminate-dead-code" not in _passes_run("--disable", "eliminate-dead-code")


@pytest.mark.parametrize("option", ["--passes", "--disable"])
def test_unknown_pass_is_a_usage_error(option: str) -> None:
    code, _, stderr = cli("optimize", DEFAULT_MODEL, option, "no-such-pass")
    assert code == EXIT_ERROR
    line = one_error_line(stderr)
    assert "unknown pass 'no-such-pass'" in line and "eliminate-dead-code" in line


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_levels(level: int, tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    code, stdout, stderr = cli("optimize", DEFAULT_MODEL, "-o", out, f"-O{level}", "--json")
    assert code == EXIT_OK, stderr
    data = json.loads(stdout)
    assert data["level"] == level
    assert data["validation"]["passed"]
    if level == 0:
        assert data["passes_run"] == [] and data["after"]["nodes"] == data["before"]["nodes"]
    else:
        assert data["passes_run"]


def test_level_out_of_range() -> None:
    code, _, stderr = cli("optimize", DEFAULT_MODEL, "-O9")
    assert code == EXIT_ERROR
    assert stderr.splitlines() == [
        "onnxopt: error: Invalid value for '-O' / '--level': 9 is not in the range 0<=x<=3. "
        "(see 'main optimize --help')"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("optimize", "--opset", "-3"),
            "Invalid value for '--opset': -3 is not in the range x>=1.",
        ),
        (("optimize", "--bogus"), "No such option '--bogus'"),
        (("nosuch",), "No such command 'nosuch'."),
        (("--bogus",), "No such option '--bogus'"),
    ],
)
def test_click_usage_errors_are_one_line(args: tuple[str, ...], message: str) -> None:
    code, stdout, stderr = cli(*args)
    assert code == EXIT_ERROR and not stdout
    (line,) = stderr.splitlines()
    assert line.startswith("onnxopt: error: ") and message in line


# ---------------------------------------------------------------------------------------------
# inputs for validation


def test_input_shape_pins_dims(tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    code, stdout, stderr = cli(
        "optimize", DEFAULT_MODEL, "-o", out, "--input-shape", "image:2x3x32x32", "--json"
    )
    assert code == EXIT_OK, stderr
    dims = [d.dim_value for d in onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim]
    assert dims == [2, 3, 32, 32]
    assert json.loads(stdout)["validation"]["trials"] == [{"image": [2, 3, 32, 32]}]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope:1x3x32x32", "not a graph input"),
        ("image:1x3", "rank"),
        ("image:1xAx3", "integers"),
        ("image", "NAME:"),
    ],
)
def test_input_shape_errors(spec: str, message: str) -> None:
    code, _, stderr = cli("optimize", DEFAULT_MODEL, "--input-shape", spec)
    assert code == EXIT_ERROR
    assert message in one_error_line(stderr)


def test_inputs_npz(tmp_path: Path) -> None:
    feeds = tmp_path / "feeds.npz"
    np.savez(
        feeds, image=np.random.default_rng(0).standard_normal((5, 3, 32, 32)).astype(np.float32)
    )
    code, stdout, stderr = cli("optimize", DEFAULT_MODEL, "--inputs", feeds, "--json")
    assert code == EXIT_OK, stderr
    assert json.loads(stdout)["validation"]["trials"] == [{"image": [5, 3, 32, 32]}]


def test_inputs_npz_missing_or_bad(tmp_path: Path) -> None:
    code, _, stderr = cli("optimize", DEFAULT_MODEL, "--inputs", tmp_path / "none.npz")
    assert code == EXIT_ERROR and "none.npz" in one_error_line(stderr)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    code, _, stderr = cli("optimize", DEFAULT_MODEL, "--inputs", bad)
    assert code == EXIT_ERROR and "bad.npz" in one_error_line(stderr)


def test_inputs_npz_with_wrong_shape(tmp_path: Path) -> None:
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, image=np.zeros((1, 4, 32, 32), np.float32))
    code, _, stderr = cli("optimize", DEFAULT_MODEL, "--inputs", feeds)
    assert code == EXIT_ERROR
    line = one_error_line(stderr)
    assert "default.onnx" in line and "fails on the given inputs" in line


# ---------------------------------------------------------------------------------------------
# validation failures: exit 1, nothing written


class SwapReluForAbsPass(Pass):
    """A deliberately wrong rewrite (Relu -> Abs), standing in for a buggy pass."""

    name = "swap-relu-for-abs"
    summary = "wrong on purpose (tests only)"

    def call(self, model: ir.Model) -> PassResult:
        stats: Counter[str] = Counter()
        for node in model.graph:
            if node.op_type == "Relu":
                node.op_type = "Abs"
                stats["relu->abs"] += 1
        return PassResult(model, modified=bool(stats), stats=stats)


RELU = """
<ir_version: 8, opset_import: ["" : 17]>
relu (float[N, 4] x) => (float[N, 4] y) {
    y = Relu(x)
}
"""


def test_validation_mismatch_exits_1_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(levels, "ALL_PASSES", [*levels.ALL_PASSES, SwapReluForAbsPass])
    model = tmp_path / "relu.onnx"
    model.write_bytes(onnx.parser.parse_model(RELU).SerializeToString())
    out = tmp_path / "out.onnx"
    code, stdout, stderr = cli("optimize", model, "-o", out, "--passes", "swap-relu-for-abs")
    assert code == EXIT_CHECK_FAILED
    assert not out.exists()
    assert not list(tmp_path.glob(".out.onnx.*"))
    *hints, last = stderr.strip().splitlines()
    assert all(line.startswith("onnxopt: hint: ") for line in hints), stderr
    assert last.startswith("onnxopt: error: validation failed") and "nothing was written" in last
    assert last.split("validation failed", 1)[1].count("y") == 1  # names the failing output
    assert "MISMATCH" in stdout
    code, stdout, _ = cli("optimize", model, "-o", out, "--passes", "swap-relu-for-abs", "--json")
    assert code == EXIT_CHECK_FAILED and not out.exists()
    data = json.loads(stdout)
    assert data["validation"]["passed"] is False
    assert data["passes"][0]["changes"] == {"relu->abs": 1}


def test_validate_reports_a_mismatch_per_output() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[3] x) => (float[3] y, float[3] z) {{
        y = {op}(x)
        z = Neg(x)
    }}
    """
    relu = io.model_from_proto(onnx.parser.parse_model(text.format(op="Relu")))
    abs_ = io.model_from_proto(onnx.parser.parse_model(text.format(op="Abs")))
    report = validate(relu, abs_, inputs=[{"x": np.array([-2.0, 0.5, 3.0], np.float32)}])
    assert not report.passed
    assert report.failing_outputs() == ["y"]
    y = next(o for o in report.outputs if o.name == "y")
    assert y.mismatches == 1 and y.max_abs == 2.0
    assert validate(relu, relu.clone(), inputs=[{"x": np.ones(3, np.float32)}]).passed


# ---------------------------------------------------------------------------------------------
# exit codes live in one place


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ValidationError("x"), EXIT_CHECK_FAILED),
        (CheckFailed("x"), EXIT_CHECK_FAILED),
        (UsageError("x"), EXIT_ERROR),
        (ModelLoadError("x"), EXIT_ERROR),
        (UnsafeModelError("x"), EXIT_ERROR),
        (ModelSaveError("x"), EXIT_ERROR),
        (OnnxoptError("x"), EXIT_ERROR),
        (RuntimeError("x"), EXIT_ERROR),
        (MemoryError(), EXIT_ERROR),
    ],
)
def test_exit_code_for(exc: BaseException, code: int) -> None:
    assert exit_code_for(exc) == code


def test_no_exit_codes_outside_exit_code_for() -> None:
    """Every ``sys.exit``/``ctx.exit`` in the package takes its code from ``exit_code_for``,
    except the guard's, which passes its child's on (and uses the same code for a crash)."""
    from onnxopt import guard
    from onnxopt.cli import EXIT_ERROR

    assert guard.EXIT_ERROR == EXIT_ERROR
    offenders = []
    for path in sorted((REPO / "onnxopt").rglob("*.py")):
        if path.name == "guard.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != "exit" or not node.args:
                continue
            arg = node.args[0]
            from_mapping = (
                isinstance(arg, ast.Call) and getattr(arg.func, "id", "") == "exit_code_for"
            )
            if not from_mapping:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []


# ---------------------------------------------------------------------------------------------
# determinism and idempotence at file level


def _optimize_file(source: Path, out: Path, *extra: str) -> bytes:
    code, _, stderr = cli("optimize", source, "-o", out, *extra)
    assert code == EXIT_OK, stderr
    return out.read_bytes()


def test_default_model_is_deterministic_and_idempotent(tmp_path: Path) -> None:
    first = _optimize_file(DEFAULT_MODEL, tmp_path / "a.onnx")
    second = _optimize_file(DEFAULT_MODEL, tmp_path / "b.onnx")
    assert first == second
    again = _optimize_file(tmp_path / "a.onnx", tmp_path / "c.onnx")
    assert again == first


# The two slowest to optimize run under -m slow only (default.onnx covers the same passes quickly).
SLOW_LIGHT = {"light_densenet121", "light_inception_v2"}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(p.stem, marks=[pytest.mark.slow] if p.stem in SLOW_LIGHT else [])
        for p in sorted(LIGHT_DIR.glob("light_*.onnx"))
    ],
)
def test_light_models_are_deterministic_and_idempotent(name: str, tmp_path: Path) -> None:
    source = LIGHT_DIR / f"{name}.onnx"
    first = _optimize_file(source, tmp_path / "a.onnx", "--no-validate")
    second = _optimize_file(source, tmp_path / "b.onnx", "--no-validate")
    assert first == second
    again = _optimize_file(tmp_path / "a.onnx", tmp_path / "c.onnx", "--no-validate")
    assert again == first
