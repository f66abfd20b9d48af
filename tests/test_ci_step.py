"""The CI pipeline step: thresholds, JUnit/markdown reports, config files, batches and bisection."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import onnx
import onnx.parser
import onnx_ir as ir
import pytest
from click.testing import CliRunner

from onnxopt import batch, cli
from onnxopt.passes import levels
from onnxopt.passes.base import Pass, PassResult

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "models" / "default.onnx"


def _run(args: list[str], cwd: Path | None = None) -> tuple[int, str, str]:
    runner = CliRunner()
    if cwd is None:
        result = runner.invoke(cli.main, args)
    else:
        with runner.isolated_filesystem(temp_dir=cwd):
            result = runner.invoke(cli.main, args)
    return result.exit_code, result.stdout, result.stderr


def _small_model(path: Path) -> Path:
    proto = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y) { a = Relu(x) b = Relu(x) c = Identity(a) y = Add(c, b) }
        """
    )
    path.write_bytes(proto.SerializeToString())
    return path


def test_thresholds_pass_and_fail_with_one_line_each(tmp_path: Path) -> None:
    model = _small_model(tmp_path / "m.onnx")
    code, out, err = _run(["check", str(model), "--max-abs-error", "1e-6", "--json"])
    assert code == 0
    checks = json.loads(out)["checks"]
    assert [c["name"] for c in checks] == ["max-abs-error"] and checks[0]["passed"]

    code, out, err = _run(
        ["check", str(model), "--min-node-reduction", "90%", "-o", str(tmp_path / "o.onnx")]
    )
    assert code == 1
    assert "min-node-reduction:" in err and "is under the minimum 90.0%" in err
    assert "Traceback" not in err
    assert not (tmp_path / "o.onnx").exists()


def test_latency_threshold_without_a_benchmark_is_reported_as_unmeasured(tmp_path: Path) -> None:
    from onnxopt.api import optimize
    from onnxopt.checks import Thresholds, evaluate

    report = optimize(_small_model(tmp_path / "m.onnx")).report
    (result,) = evaluate(report, Thresholds(max_latency_ratio=1.0))
    assert not result.passed and "not measured" in result.message


def test_junit_and_markdown_reports(tmp_path: Path) -> None:
    model = _small_model(tmp_path / "m.onnx")
    junit = tmp_path / "report.xml"
    md = tmp_path / "summary.md"
    code, _, _ = _run(
        [
            "check",
            str(model),
            "--max-abs-error",
            "1e-6",
            "--junit",
            str(junit),
            "--markdown",
            str(md),
        ]
    )
    assert code == 0
    suite = ET.parse(junit).getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "0"
    assert [c.get("name") for c in suite.iter("testcase")] == ["validation", "max-abs-error"]
    text = md.read_text()
    assert "all models passed" in text and "| `" in text


def test_batch_continues_after_a_bad_model_and_exit_code_says_so(tmp_path: Path) -> None:
    good = _small_model(tmp_path / "good.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    out_dir = tmp_path / "out"
    code, out, err = _run(["optimize", str(good), str(bad), "--out-dir", str(out_dir), "--json"])
    assert code == 2
    data = json.loads(out)
    assert [m["status"] for m in data["models"]] == ["ok", "error"]
    assert (out_dir / "good.onnx").exists() and not (out_dir / "bad.onnx").exists()
    assert "1 of 2 model(s) could not be optimized" in err


def test_batch_with_workers(tmp_path: Path) -> None:
    models = [_small_model(tmp_path / f"m{i}.onnx") for i in range(3)]
    code, out, _ = _run(
        ["optimize", *map(str, models), "--out-dir", str(tmp_path / "o"), "-j", "2", "--json"]
    )
    assert code == 0
    assert [Path(m["model"]).name for m in json.loads(out)["models"]] == [
        "m0.onnx",
        "m1.onnx",
        "m2.onnx",
    ]


def test_same_file_names_in_a_batch_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = _small_model(tmp_path / "a" / "m.onnx")
    two = _small_model(tmp_path / "b" / "m.onnx")
    code, _, err = _run(["optimize", str(one), str(two), "--out-dir", str(tmp_path / "o")])
    assert code == 2 and "same file name" in err


def test_config_file_sets_defaults_and_rejects_typos(tmp_path: Path) -> None:
    model = _small_model(tmp_path / "m.onnx")
    config = tmp_path / "onnxopt.toml"
    config.write_text('min-node-reduction = "99%"\ndisable = ["eliminate-common-subexpressions"]\n')
    code, _, err = _run(["--config", str(config), "check", str(model)])
    assert code == 1 and "min-node-reduction" in err
    config.write_text("levl = 2\n")
    code, _, err = _run(["--config", str(config), "check", str(model)])
    assert code == 2 and "unknown onnxopt setting(s): levl" in err


def test_pyproject_table_is_found_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _small_model(tmp_path / "m.onnx")
    (tmp_path / "pyproject.toml").write_text('[tool.onnxopt]\nmin-node-reduction = "99%"\n')
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(["check", str(model)])
    assert code == 1 and "min-node-reduction" in err


class _BreakRelu(Pass):
    """Deliberately wrong: turns Relu into Abs (a sabotage pass to prove bisection finds it)."""

    name = "break-relu"
    summary = "test only"

    def call(self, model: ir.Model) -> PassResult:
        count = 0
        for node in model.graph:
            if node.op_type == "Relu":
                node.op_type = "Abs"
                count += 1
        return PassResult(model, modified=bool(count), stats=Counter({"broken": count}))


def test_bisect_names_the_pass_that_broke_validation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(levels, "ALL_PASSES", [*levels.ALL_PASSES, _BreakRelu])
    model = _small_model(tmp_path / "m.onnx")
    passes = "eliminate-dead-code,eliminate-common-subexpressions,break-relu,sort-topologically"
    code, _, err = _run(
        ["optimize", str(model), "--passes", passes, "--bisect", "-o", str(tmp_path / "o.onnx")]
    )
    assert code == 1
    assert "pass #3 'break-relu' introduced the mismatch" in err
    assert not (tmp_path / "o.onnx").exists()


def test_a_mismatch_is_put_beside_what_orts_own_optimizations_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For scale: ORT's ENABLE_ALL leaves this model's output exactly as it was, so the mismatch
    is the optimizer's, not a model that amplifies rounding."""
    monkeypatch.setattr(levels, "ALL_PASSES", [*levels.ALL_PASSES, _BreakRelu])
    model = _small_model(tmp_path / "m.onnx")
    code, stdout, _ = _run(["check", str(model), "--passes", "break-relu", "--json"])
    assert code == 1
    notes = json.loads(stdout)["validation"]["notes"]
    assert any(
        "ORT_ENABLE_ALL) move the original's output 'y' by up to 0 on" in note for note in notes
    ), notes


def test_bisection_validates_at_the_sizes_given_with_dim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnxopt.bisect import bisect_run

    monkeypatch.setattr(levels, "ALL_PASSES", [*levels.ALL_PASSES, _BreakRelu])
    model = _small_model(tmp_path / "m.onnx")
    options = {"fold_limit_bytes": 1 << 20, "fold_may_grow": False, "target": "ort",
               "input_shapes": None, "inputs": None, "opset": None, "dims": {"N": 7}}  # fmt: skip
    result = bisect_run(model, ["eliminate-common-subexpressions", "break-relu"], options)
    assert result.culprit == "break-relu"
    assert result.report is not None and result.report.trials[0]["x"] == (7, 4)


class _BreakReluAgain(_BreakRelu):
    """A second saboteur: once break-relu is dropped, this one breaks the model the same way."""

    name = "break-relu-again"


def test_fallback_drops_each_pass_that_breaks_validation_and_writes_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(levels, "ALL_PASSES", [*levels.ALL_PASSES, _BreakRelu, _BreakReluAgain])
    model = _small_model(tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    passes = "eliminate-common-subexpressions,break-relu,eliminate-noops,break-relu-again"
    code, stdout, err = _run(
        ["optimize", str(model), "--passes", passes, "--fallback", "--json", "-o", str(out)]
    )
    assert code == 0, err
    assert "pass #2 'break-relu' introduced the mismatch" in err
    assert "pass #3 'break-relu-again' introduced the mismatch" in err
    assert "fallback: optimizing again without break-relu-again" in err
    assert "--fallback drops it" in err and "rerun with --disable" not in err
    report = json.loads(stdout)  # one JSON document: the failed attempts print no report
    assert report["dropped_passes"] == ["break-relu", "break-relu-again"]
    assert report["passes_run"] == ["eliminate-common-subexpressions", "eliminate-noops"]
    assert report["validation"]["passed"]
    assert any("--fallback dropped pass 'break-relu'" in w for w in report["warnings"])
    written = onnx.load(out)
    assert [n.op_type for n in written.graph.node] == ["Relu", "Add"]  # the rest still applied


def test_fallback_gives_up_after_its_limit_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(levels, "ALL_PASSES", [*levels.ALL_PASSES, _BreakRelu, _BreakReluAgain])
    monkeypatch.setattr(batch, "FALLBACK_LIMIT", 1)
    model = _small_model(tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    code, _, err = _run(
        [
            "optimize",
            str(model),
            "--passes",
            "break-relu,break-relu-again",
            "--fallback",
            "-o",
            str(out),
        ]
    )
    assert code == 1
    assert "without break-relu" in err and "still failing after dropping 1 passes" in err
    assert "hint" not in err and "Traceback" not in err
    assert not out.exists()


def test_fallback_help_states_its_limit() -> None:
    """The help says how many passes --fallback drops at most: the limit batch.py enforces (the
    CLI does not import batch.py to read it, so this keeps the two together)."""
    for command in ("optimize", "check"):
        code, stdout, _ = _run([command, "--help"])
        assert code == 0
        assert f"(up to {batch.FALLBACK_LIMIT} passes;" in " ".join(stdout.split()), command


def test_fallback_in_a_batch_records_the_dropped_pass_in_the_models_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--out-dir runs the batch path (one model runs in-process, so the sabotage pass exists):
    the bisection is quiet, the model's report says what was dropped."""
    monkeypatch.setattr(levels, "ALL_PASSES", [*levels.ALL_PASSES, _BreakRelu])
    model = _small_model(tmp_path / "m.onnx")
    out = tmp_path / "out"
    passes = "eliminate-common-subexpressions,break-relu"
    code, stdout, err = _run(
        ["check", str(model), "--passes", passes, "--fallback", "--out-dir", str(out), "--json"]
    )
    assert code == 0, err
    (entry,) = json.loads(stdout)["models"]
    assert entry["status"] == "ok" and entry["report"]["dropped_passes"] == ["break-relu"]
    assert (out / "m.onnx").exists() and "bisect" not in err


def test_a_batch_model_that_still_fails_lists_each_line_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(levels, "ALL_PASSES", [*levels.ALL_PASSES, _BreakRelu, _BreakReluAgain])
    monkeypatch.setattr(batch, "FALLBACK_LIMIT", 1)
    model = _small_model(tmp_path / "m.onnx")
    code, stdout, _ = _run(
        [
            "check",
            str(model),
            "--passes",
            "break-relu,break-relu-again",
            "--fallback",
            "--out-dir",
            str(tmp_path / "out"),
            "--json",
        ]
    )
    assert code == 1
    (entry,) = json.loads(stdout)["models"]
    failures = entry["failures"]
    assert len(failures) == len(set(failures)), failures
    assert failures[-2:] == [
        "fallback: optimizing again without break-relu",
        "fallback: still failing after dropping 1 passes; giving up",
    ], failures


def test_latency_and_memory_thresholds_run_a_benchmark(tmp_path: Path) -> None:
    model = _small_model(tmp_path / "m.onnx")
    code, out, err = _run(
        ["check", str(model), "--max-latency-ratio", "100", "--max-peak-memory", "64GiB", "--json"]
    )
    assert code == 0, err
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["max-latency-ratio"]["passed"] and checks["max-latency-ratio"]["measured"] > 0
    assert checks["max-peak-memory"]["passed"] and checks["max-peak-memory"]["measured"] > 0
    code, _, err = _run(["check", str(model), "--max-peak-memory", "1KiB"])
    assert code == 1 and "max-peak-memory:" in err and "is over the limit 1.0 KiB" in err
