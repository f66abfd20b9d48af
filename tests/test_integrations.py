"""The GitHub Action and the pre-commit hook run the real CLI exactly as those systems would."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import onnx.parser
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _model(path: Path, op: str = "Relu") -> Path:
    proto = onnx.parser.parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y) {{ a = {op}(x) b = Identity(a) y = Add(b, a) }}
        """
    )
    path.write_bytes(proto.SerializeToString())
    return path


@pytest.fixture()
def onnxopt_on_path(tmp_path: Path) -> dict[str, str]:
    """An `onnxopt` command on PATH that runs this checkout's code."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "onnxopt"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m onnxopt "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(ROOT)
    return env


def _action_check_step() -> dict[str, object]:
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    (step,) = [s for s in action["runs"]["steps"] if s.get("name") == "onnxopt check"]
    return step


@pytest.mark.parametrize(
    "args, expected_status", [("--max-abs-error 1e-5", 0), ("--min-node-reduction 99%", 1)]
)
def test_github_action_step_writes_reports_and_keeps_the_exit_code(
    tmp_path: Path, onnxopt_on_path: dict[str, str], args: str, expected_status: int
) -> None:
    step = _action_check_step()
    _model(tmp_path / "a.onnx")
    _model(tmp_path / "b.onnx", "Sigmoid")
    summary = tmp_path / "summary.md"
    env = dict(onnxopt_on_path)
    env.update(
        ONNXOPT_MODELS="*.onnx",
        ONNXOPT_ARGS=args,
        ONNXOPT_OUT_DIR="optimized",
        ONNXOPT_JUNIT="junit.xml",
        GITHUB_STEP_SUMMARY=str(summary),
    )
    script = tmp_path / "step.sh"
    script.write_text(str(step["run"]))
    # GitHub runs `shell: bash` steps as `bash --noprofile --norc -eo pipefail {0}`.
    proc = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == expected_status, proc.stderr
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert suite.get("failures") == ("0" if expected_status == 0 else "2")
    assert "onnxopt" in summary.read_text()
    assert (tmp_path / "optimized" / "a.onnx").exists() == (expected_status == 0)


def test_pre_commit_hook_runs_on_staged_models(
    tmp_path: Path, onnxopt_on_path: dict[str, str]
) -> None:
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "onnxopt-check" and hook["language"] == "python"
    models = [_model(tmp_path / "x.onnx"), _model(tmp_path / "y.onnx")]
    import re

    assert all(re.search(hook["files"], m.name) for m in models)
    assert not re.search(hook["files"], "notes.txt")
    # pre-commit appends the matching file names to `entry` + `args`.
    command = [*shlex.split(hook["entry"]), *hook.get("args", []), *map(str, models)]
    proc = subprocess.run(command, env=onnxopt_on_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\x08\x07garbage")
    proc = subprocess.run(
        [*command, str(broken)], env=onnxopt_on_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "broken.onnx" in proc.stderr
