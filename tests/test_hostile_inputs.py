"""Hostile inputs and CLI misuse found by the second round of scripts/hostile_probe.py.

Same standard as test_bad_input.py: a bad input is exit 2 and one ``onnxopt: error:`` line naming
it, nothing written and nothing left behind; an odd but valid one gives a correct result.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

from tests.test_bad_input import (
    REPO,
    assert_clean_error,
    cli,
    external_model,
    optimize_bad,
    parse,
    relu_model,
    save,
)

T = onnx.TensorProto


def _graph_model(nodes: list[onnx.NodeProto], inputs, outputs, inits=()) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    graph = oh.make_graph(nodes, "g", inputs, outputs, list(inits))
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def _vi(name: str, dtype: int, shape: list[int | str]) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, dtype, shape)


# ---------------------------------------------------------------------------------------------
# Model contents


@pytest.mark.parametrize("folded", [False, True])
def test_cast_to_an_unknown_data_type(tmp_path: Path, folded: bool) -> None:
    """Cast's 'to' of 999 made fold-shape-values raise ValueError (an internal error)."""
    source = "c" if folded else "x"
    nodes = [oh.make_node("Cast", [source], ["y"], to=999)]
    if folded:
        nodes.insert(0, oh.make_node("Constant", [], ["c"], value_ints=[1, 2]))
    proto = _graph_model(nodes, [_vi("x", T.INT64, [2])], [_vi("y", T.INT64, [2])])
    optimize_bad(
        tmp_path,
        save(proto, tmp_path / "m.onnx"),
        "(Cast)",
        "attribute 'to' is 999, which is no ONNX data type",
        extra=("--no-validate",),
    )


@pytest.mark.parametrize(
    ("op", "a", "b"),
    [("Mul", 2**62, 4), ("Add", 2**63 - 1, 1), ("Div", -(2**63), -1), ("Sub", -(2**63), 1)],
)
def test_int64_overflow_in_folded_shape_arithmetic(tmp_path: Path, op: str, a: int, b: int) -> None:
    """fold-shape-values computed with Python ints and raised OverflowError making the array."""
    proto = parse(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (int64[1] x) => (int64[1] y) {{
            a = Constant<value = int64[1] {{{a}}}>()
            b = Constant<value = int64[1] {{{b}}}>()
            c = {op}(a, b)
            y = Add(x, c)
        }}
        """
    )
    out = tmp_path / "out.onnx"
    outcome = cli("optimize", save(proto, tmp_path / "m.onnx"), "-o", out, "--no-validate")
    assert outcome.exit_code == 0, outcome
    onnx.checker.check_model(onnx.load(out))


def test_int64_overflow_folded_like_onnx_runtime(tmp_path: Path) -> None:
    """Where the product wraps around, the optimized model computes what ORT computes."""
    proto = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (int64[1] x) => (int64[1] y) {
            a = Constant<value = int64[1] {4611686018427387904}>()
            b = Constant<value = int64[1] {4}>()
            c = Mul(a, b)
            y = Add(x, c)
        }
        """
    )
    outcome = cli("optimize", save(proto, tmp_path / "m.onnx"), "-o", tmp_path / "out.onnx")
    assert outcome.exit_code == 0, outcome


def test_concat_of_50k_constants_folds_in_linear_time(tmp_path: Path) -> None:
    """Removing the folded Concat detached its inputs one by one, each rebuilding the input
    tuple (onnx-ir's replace_input_with): 10k inputs took 100 s, 50k would take most of an hour."""
    n = 50_000
    inits = [onh.from_array(np.array([i], np.float32), f"c{i}") for i in range(n)]
    proto = _graph_model(
        [oh.make_node("Concat", [f"c{i}" for i in range(n)], ["cat"], axis=0)],
        [],
        [_vi("cat", T.FLOAT, [n])],
        inits,
    )
    import onnx_ir as ir

    from onnxopt.passes.fold_constants import FoldConstantsPass

    model = ir.serde.deserialize_model(proto)
    start = time.process_time()
    result = FoldConstantsPass()(model)
    seconds = time.process_time() - start
    assert result.modified
    assert [node.op_type for node in model.graph] == []
    assert seconds < 30, f"{seconds:.0f} s of CPU"


def test_onnx_api_call_is_linear_in_initializers() -> None:
    """onnx-ir's call_onnx_api tested each initializer against the input list: 12 s a call for
    20k initializers, and shape inference makes four."""
    import onnx_ir as ir

    from onnxopt import io

    n = 40_000
    inits = [onh.from_array(np.full(300, i, np.float32), f"c{i}") for i in range(n)]
    proto = _graph_model(
        [oh.make_node("Concat", [f"c{i}" for i in range(n)], ["cat"], axis=0)],
        [],
        [_vi("cat", T.FLOAT, [300 * n])],
        inits,
    )
    model = ir.serde.deserialize_model(proto)
    start = time.process_time()
    seen = io.call_onnx_api(lambda p: (len(p.graph.input), len(p.graph.initializer)), model)
    assert time.process_time() - start < 20
    assert seen == (n, 0)  # 1.2 kB each: typed inputs without data
    assert len(model.graph.inputs) == 0
    assert len(model.graph.initializers) == n
    assert model.graph.initializers["c7"].const_value.numpy()[0] == 7  # type: ignore[union-attr]


def test_external_data_key_given_twice(tmp_path: Path) -> None:
    """The check read the last 'location', a reader might take the first."""
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    model = external_model(tmp_path / "m", "weights.bin")
    (tmp_path / "m" / "weights.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    proto = onnx.load(model, load_external_data=False)
    entry = proto.graph.initializer[0].external_data.add()
    entry.key, entry.value = "location", "../secret.bin"
    save(proto, model)
    optimize_bad(tmp_path, model, "initializer 'w'", "'location' twice")


# ---------------------------------------------------------------------------------------------
# Files written


def test_output_over_a_fifo_is_refused(tmp_path: Path) -> None:
    """The temp file was renamed over whatever -o named: as root, -o /dev/null replaced the
    device with a regular file."""
    model = save(relu_model(), tmp_path / "m.onnx")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    line = assert_clean_error(cli("optimize", model, "-o", fifo), "not a regular file")
    assert str(fifo) in line
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_save_model_never_replaces_a_device_or_fifo(tmp_path: Path) -> None:
    from onnxopt.errors import ModelSaveError
    from onnxopt.io import load_model, save_model

    model = load_model(save(relu_model(), tmp_path / "m.onnx")).model
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ModelSaveError, match="not a regular file"):
        save_model(model, tmp_path / "fifo")
    assert stat.S_ISFIFO((tmp_path / "fifo").lstat().st_mode)
    assert not list(tmp_path.glob(".fifo.*"))


@pytest.mark.parametrize("which", ["--inputs", "--reference", "own reference"])
def test_output_never_overwrites_an_npz_it_reads(tmp_path: Path, which: str) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    x = np.ones((2, 4), np.float32)
    if which == "--inputs":
        npz, extra = tmp_path / "in.npz", ("--inputs", str(tmp_path / "in.npz"))
        np.savez(npz, x=x)
    else:
        npz = tmp_path / ("m.ref.npz" if which == "own reference" else "ref.npz")
        np.savez(npz, **{"input/x": x, "output/y": x})
        extra = () if which == "own reference" else ("--reference", str(npz))
    before = npz.read_bytes()
    outcome = cli("optimize", model, "-o", tmp_path / "." / npz.name, *extra)
    assert_clean_error(outcome, "refusing to overwrite", npz.name)
    assert npz.read_bytes() == before


def test_empty_output_name(tmp_path: Path) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    assert_clean_error(cli("optimize", model, "-o", ""), "is a folder")


@pytest.mark.parametrize("option", ["--memory-plan", "--junit", "--markdown"])
def test_two_outputs_on_one_file(tmp_path: Path, option: str) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    outcome = cli("optimize", model, "-o", out, option, tmp_path / "." / "out.onnx")
    assert_clean_error(outcome, option, "is also the file of -o", output=out)


def test_side_file_in_an_unwritable_folder_is_refused_before_the_model_is_written(
    tmp_path: Path,
) -> None:
    """--memory-plan into /proc failed after the optimized model was written: exit 2 with a file."""
    model = save(relu_model(), tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    outcome = cli("optimize", model, "-o", out, "--memory-plan", "/proc/plan.json")
    assert_clean_error(
        outcome, "--memory-plan /proc/plan.json", "cannot write in '/proc'", output=out
    )


def test_write_error_is_named_as_such(tmp_path: Path) -> None:
    """A full disk while copying weights read 'MODEL: external data ended early'."""
    import errno
    from unittest import mock

    from onnxopt import io

    w = onh.from_array(np.arange(100_000, dtype=np.float32), "w")
    proto = _graph_model(
        [oh.make_node("Add", ["x", "w"], ["y"])],
        [_vi("x", T.FLOAT, [100_000])],
        [_vi("y", T.FLOAT, [100_000])],
        [w],
    )
    model = io.load_model(save(proto, tmp_path / "m.onnx")).model
    full = OSError(errno.ENOSPC, "No space left on device")
    with (
        mock.patch.object(os, "copy_file_range", side_effect=full, create=True),
        pytest.raises(io.ModelSaveError, match="No space left") as caught,
    ):
        io.save_model(model, tmp_path / "out.onnx", external_data=False)
    assert "ended early" not in str(caught.value)
    assert not list(tmp_path.glob(".out.onnx.*"))


def _weights_and_many_small_ones(start: int) -> onnx.ModelProto:
    """y = x + w (20 kB: external data) and z = Concat of 200 inline 1 kB weights (200 kB)."""
    w = onh.from_array(np.arange(start, start + 5000, dtype=np.float32), "w")
    small = [onh.from_array(np.full(256, start + i, np.float32), f"s{i}") for i in range(200)]
    return _graph_model(
        [
            oh.make_node("Add", ["x", "w"], ["y"]),
            oh.make_node("Concat", [t.name for t in small], ["z"], axis=0),
        ],
        [_vi("x", T.FLOAT, [5000])],
        [_vi("y", T.FLOAT, [5000]), _vi("z", T.FLOAT, [256 * 200])],
        [w, *small],
    )


def test_disk_full_while_writing_the_model_keeps_the_earlier_output_pair(tmp_path: Path) -> None:
    """A size limit the .data (20 kB) fits and the .onnx (200 kB) does not, as a disk that fills
    up between the two: the .data was already renamed over the earlier output's, which its
    .onnx then read. A real process under ``ulimit -f`` (SIGXFSZ ignored: the write fails)."""
    out = tmp_path / "out"
    out.mkdir()
    first, second = tmp_path / "a.onnx", tmp_path / "b.onnx"
    save(_weights_and_many_small_ones(0), first)
    save(_weights_and_many_small_ones(7), second)
    command = [sys.executable, "-m", "onnxopt", "optimize", "-O0", "--no-validate"]
    command += ["--external-data", "-o", str(out / "m.onnx")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([*command, str(first)], env=env, capture_output=True, check=False)
    assert run.returncode == 0, run.stderr
    earlier = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(earlier) == ["m.onnx", "m.onnx.data"]

    limited = f"trap '' XFSZ; ulimit -f 100; exec {' '.join(command)} {second}"
    run = subprocess.run(["bash", "-c", limited], env=env, capture_output=True, check=False)

    assert run.returncode == 2, run.stderr
    assert b"cannot write" in run.stderr and b"File too large" in run.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == earlier
    weights = onnx.load(str(out / "m.onnx")).graph.initializer
    assert onh.to_array(next(t for t in weights if t.name == "s1"))[0] == 1


# ---------------------------------------------------------------------------------------------
# Options


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--run-timeout", "nan"),
        ("--run-timeout", "inf"),
        ("--max-abs-error", "nan"),
        ("--max-rel-error", "-1"),
        ("--max-latency-ratio", "nan"),
    ],
)
def test_number_options_must_be_finite(tmp_path: Path, option: str, value: str) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    assert_clean_error(cli("optimize", model, "-o", out, option, value), option, output=out)


@pytest.mark.parametrize(
    "args",
    [("--dim", "N=3,N=4"), ("--input-shape", "x:2x4", "--input-shape", "x:3x4")],
)
def test_a_name_given_twice_is_an_error(tmp_path: Path, args: tuple[str, ...]) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    assert_clean_error(cli("optimize", model, "-o", out, *args), "given twice", output=out)


def test_dim_no_input_names_is_a_warning(tmp_path: Path) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    outcome = cli("optimize", model, "-o", tmp_path / "out.onnx", "--dim", "bacth=3", "--json")
    assert outcome.exit_code == 0, outcome
    warning = "--dim bacth: no dim of the model is named so (it has N)"
    assert warning in json.loads(outcome.stdout)["warnings"]


def test_dim_named_inside_a_dim_expression_is_known(tmp_path: Path) -> None:
    proto = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[past] a, float[seq] b) => (float["past + seq"] y) {
            y = Concat<axis = 0>(a, b)
        }
        """
    )
    model = save(proto, tmp_path / "m.onnx")
    outcome = cli("optimize", model, "-o", tmp_path / "o.onnx", "--dim", "seq=2", "--json")
    assert outcome.exit_code == 0, outcome
    assert json.loads(outcome.stdout)["warnings"] == []


def test_config_file_given_by_path_is_read_at_its_top_level(tmp_path: Path) -> None:
    """--config my.toml looked for [tool.onnxopt] in it, so each setting was silently ignored."""
    model = save(relu_model(), tmp_path / "m.onnx")
    config = tmp_path / "my.toml"
    config.write_text('level = "fast"\n')
    outcome = cli("--config", config, "optimize", model, "-o", tmp_path / "out.onnx")
    assert_clean_error(outcome, "'fast'", output=tmp_path / "out.onnx")
    config.write_text("levle = 1\n")
    outcome = cli("--config", config, "optimize", model, "-o", tmp_path / "out.onnx")
    assert_clean_error(outcome, "unknown onnxopt setting(s): levle")


def test_config_is_a_folder(tmp_path: Path) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    outcome = cli("--config", tmp_path, "optimize", model, "-o", tmp_path / "out.onnx")
    assert_clean_error(outcome, "is not a file")


def test_bench_shape_errors_name_bench_option(tmp_path: Path) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    assert_clean_error(cli("bench", model, "--budget", "1", "--shape", "x:axb"), "--shape 'x:axb'")
