"""The command's guarding parent process: a native crash in the child is one error line, exit 2;
exit codes and outside signals pass through; no child outlives its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest

from onnxopt.guard import crash_message, doing

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO)}

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the guard needs POSIX processes")


def onnxopt(
    *args: object, timeout: float = 300, temp: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the command; ``temp``: the folder it makes its temp files in (TMPDIR)."""
    return subprocess.run(
        [sys.executable, "-m", "onnxopt", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV if temp is None else {**ENV, "TMPDIR": str(temp)},
        check=False,
    )


@pytest.fixture
def crashing_division(tmp_path: Path) -> tuple[Path, Path]:
    """An int32 Div and inputs that divide INT_MIN by -1: ONNX Runtime checks for a zero divisor
    but not for this overflow, which x86 traps with SIGFPE (no exception, the process is gone)."""
    graph = oh.make_graph(
        [oh.make_node("Div", ["a", "b"], ["y"])],
        "division",
        [oh.make_tensor_value_info(n, onnx.TensorProto.INT32, [3]) for n in ("a", "b")],
        [oh.make_tensor_value_info("y", onnx.TensorProto.INT32, [3])],
    )
    model = tmp_path / "div.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), str(model))
    inputs = tmp_path / "inputs.npz"
    np.savez(
        inputs,
        a=np.array([np.iinfo(np.int32).min, 6, 9], np.int32),
        b=np.array([-1, 2, 3], np.int32),
    )
    bare = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, numpy as np, onnxruntime as ort\n"
            "feeds = dict(np.load(sys.argv[2]))\n"
            "ort.InferenceSession(sys.argv[1]).run(None, feeds)\n",
            str(model),
            str(inputs),
        ],
        capture_output=True,
        check=False,
        timeout=120,
    )
    if bare.returncode != -signal.SIGFPE:
        pytest.skip(f"ONNX Runtime does not die of INT_MIN / -1 here (exit {bare.returncode})")
    return model, inputs


def test_a_runtime_crash_in_validation_is_one_line_naming_what_ran(
    crashing_division: tuple[Path, Path], tmp_path: Path
) -> None:
    model, inputs = crashing_division
    target = tmp_path / "out.onnx"

    done = onnxopt("optimize", model, "-o", target, "--inputs", inputs)

    assert done.returncode == 2
    assert done.stderr == (
        f"onnxopt: error: the process crashed (SIGFPE, an arithmetic fault) while optimizing "
        f"{model}: validating (--no-validate skips it): ONNX Runtime ran the original model on "
        "inputs a[3], b[3] (--inputs FILE.npz gives other inputs)\n"
    )
    assert not target.exists()


def test_a_runtime_crash_in_bench_is_one_line_naming_what_ran(
    crashing_division: tuple[Path, Path], tmp_path: Path
) -> None:
    """... and the optimized copy it was timing, in a temp folder, goes with the crashed process."""
    model, inputs = crashing_division
    temp = tmp_path / "temp"
    temp.mkdir()

    done = onnxopt("bench", model, "--inputs", inputs, "--budget", "1", temp=temp)

    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(
        f"onnxopt: error: the process crashed (SIGFPE, an arithmetic fault) while benchmarking "
        f"{model}: ONNX Runtime (cpu) ran the original model at "
    )
    assert left_in(temp) == []


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_model_that_crashes_its_worker_fails_alone_in_a_batch(
    crashing_division: tuple[Path, Path], tmp_path: Path, jobs: int
) -> None:
    """Each crash is found and named; the models beside it are optimized and written."""
    model, inputs = crashing_division
    sums = oh.make_graph(
        [oh.make_node("Add", ["a", "b"], ["y"])],
        "sums",
        [oh.make_tensor_value_info(n, onnx.TensorProto.INT32, [3]) for n in ("a", "b")],
        [oh.make_tensor_value_info("y", onnx.TensorProto.INT32, [3])],
    )
    batch = [model, tmp_path / "sum1.onnx", tmp_path / "div2.onnx", tmp_path / "sum2.onnx"]
    for path in (batch[1], batch[3]):
        onnx.save(oh.make_model(sums, opset_imports=[oh.make_opsetid("", 17)]), str(path))
    batch[2].write_bytes(model.read_bytes())
    out = tmp_path / "out"

    done = onnxopt("optimize", *batch, "--out-dir", out, "-j", jobs, "--inputs", inputs)

    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if "crashed" in line]
    assert lines == [
        f"onnxopt: its worker process crashed (a native fault, e.g. in ONNX Runtime) while "
        f"optimizing {path}: validating (--no-validate skips it): ONNX Runtime ran the original "
        "model on inputs a[3], b[3] (--inputs FILE.npz gives other inputs)"
        for path in (batch[0], batch[2])
    ]
    assert done.stderr.splitlines()[-1] == (
        "onnxopt: error: 2 of 4 model(s) could not be optimized, 0 failed checks"
    )
    assert sorted(p.name for p in out.iterdir()) == ["sum1.onnx", "sum2.onnx"]


def test_exit_codes_and_output_pass_through_the_guard(tmp_path: Path) -> None:
    missing = tmp_path / "missing.onnx"
    done = onnxopt("optimize", missing, "-o", tmp_path / "out.onnx")
    assert done.returncode == 2
    assert done.stderr.startswith("onnxopt: error: ") and done.stderr.count("\n") == 1
    # the usage line names the command as it was typed
    done = onnxopt("optimize", "--bogus")
    assert done.returncode == 2
    assert "(see 'python -m onnxopt optimize --help')" in done.stderr
    done = onnxopt("passes", "--json")
    assert done.returncode == 0 and done.stdout.startswith("[")


def left_in(temp: Path) -> list[str]:
    """What a command left in its temp folder, less ONNX Runtime's own session file (``.ses``,
    which every process that imports onnxruntime keeps there)."""
    return sorted(p.name for p in temp.iterdir() if p.name != ".ses")


def children_of(pid: int) -> list[int]:
    """Processes whose parent is ``pid``, from /proc (field 4 of stat, after the command's name)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_a_signal_from_outside_ends_parent_and_child_alike(tmp_path: Path) -> None:
    """SIGTERM to the parent (a CI job's timeout) reaches the child; the parent dies of it too,
    and the temp folder the child was timing its optimized copy from is gone."""
    model = REPO / "models" / "default.onnx"
    temp = tmp_path / "temp"
    temp.mkdir()
    parent = subprocess.Popen(
        [sys.executable, "-m", "onnxopt", "bench", str(model), "--budget", "120", "--no-memory"],
        env={**ENV, "TMPDIR": str(temp)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    children: list[int] = []
    deadline = time.monotonic() + 120
    while not list(temp.glob("onnxopt-bench-*/optimized.onnx")) and time.monotonic() < deadline:
        time.sleep(0.2)
    children = children_of(parent.pid)
    assert children, "the guard started no child"

    parent.send_signal(signal.SIGTERM)

    assert parent.wait(timeout=60) == -signal.SIGTERM
    for pid in children:
        for _ in range(50):  # reaped by init once it is gone
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the child {pid} outlived its parent")
    assert left_in(temp) == []


def test_notes_nest_and_unwind() -> None:
    assert crash_message(signal.SIGSEGV, "", "onnxopt inspect m.onnx") == (
        "onnxopt: error: the process crashed (SIGSEGV, a segmentation fault) while running "
        "'onnxopt inspect m.onnx'"
    )
    with doing("outer"), doing("inner"):
        pass  # no notes file in this process: nothing is written, nothing fails
