"""Hostile, broken and unsupported models through the real CLI.

Every bad input must give exit code 2 and exactly one stderr line ``onnxopt: error: ...`` that says
what is wrong and where, with no traceback, no output file, and bounded time and memory. Inputs that
are odd but valid (custom ops, zero dims, 200,000 nodes) must give a correct result instead.

Most cases run in-process through click's ``CliRunner`` (fast); the ones that could hang, crash or
allocate without bound run as a real ``python -m onnxopt`` subprocess under a timeout and an
address-space limit.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import resource
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.parser
import pytest
from click.testing import CliRunner

from onnxopt.cli import main
from onnxopt.passes.levels import ALL_PASSES
from scripts.make_chain_model import relu_chain

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "models" / "default.onnx"
SUBPROCESS_MEMORY_LIMIT = 6 * 1024**3  # address space; a 40 GB allocation must never be tried
ERROR_SECONDS = (
    60  # refusing a bad input takes well under a second; generous for loaded CI machines
)


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    stdout: str
    stderr: str
    seconds: float
    cpu_seconds: float = (
        0.0  # of the child process (subprocess runs only): wall time lies on busy machines
    )


def cli(*args: str | os.PathLike[str]) -> Outcome:
    """Run the CLI in-process (click's CliRunner), stdout and stderr kept apart."""
    start = time.perf_counter()
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)
    seconds = time.perf_counter() - start
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # an exception escaped the CLI: that is the bug
    return Outcome(result.exit_code, result.stdout, result.stderr, seconds)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (SUBPROCESS_MEMORY_LIMIT, SUBPROCESS_MEMORY_LIMIT))


def cli_subprocess(*args: str | os.PathLike[str], timeout: float = 120) -> Outcome:
    """Run ``python -m onnxopt`` as a real process with a timeout and an address-space limit."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [sys.executable, "-m", "onnxopt", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        preexec_fn=_limit_memory,
        check=False,
    )
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Outcome(proc.returncode, proc.stdout, proc.stderr, seconds, cpu)


def assert_clean_error(outcome: Outcome, *fragments: str, output: Path | None = None) -> str:
    """Exit 2, one stderr line naming the problem, no traceback, nothing written."""
    assert outcome.exit_code == 2, outcome
    assert outcome.seconds < ERROR_SECONDS, f"took {outcome.seconds:.1f} s to refuse"
    lines = outcome.stderr.strip().splitlines()
    assert len(lines) == 1, outcome.stderr
    line = lines[0]
    assert line.startswith("onnxopt: error: "), line
    assert "Traceback" not in outcome.stderr and "internal error" not in line, line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    if output is not None:
        assert not output.exists(), f"{output} was written"
        assert not list(output.parent.glob(f".{output.name}.*")), "a temp file was left behind"
    return line


def save(proto: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(proto.SerializeToString())
    return path


def parse(text: str) -> onnx.ModelProto:
    return onnx.parser.parse_model(text)


RELU = """
<ir_version: 8, opset_import: ["" : 17]>
relu (float[N, 4] x) => (float[N, 4] y) {
    y = Relu(x)
}
"""


def relu_model() -> onnx.ModelProto:
    return parse(RELU)


def optimize_bad(tmp_path: Path, model: Path, *fragments: str, extra: tuple[str, ...] = ()) -> str:
    out = tmp_path / "out.onnx"
    return assert_clean_error(cli("optimize", model, "-o", out, *extra), *fragments, output=out)


# ---------------------------------------------------------------------------------------------
# Not a model at all


def test_missing_file(tmp_path: Path) -> None:
    optimize_bad(tmp_path, tmp_path / "nope.onnx", "nope.onnx", "no such file")


def test_missing_file_real_process(tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    outcome = cli_subprocess("optimize", tmp_path / "nope.onnx", "-o", out, timeout=60)
    assert_clean_error(outcome, "nope.onnx", "no such file", output=out)


def test_directory(tmp_path: Path) -> None:
    folder = tmp_path / "model.onnx"
    folder.mkdir()
    optimize_bad(tmp_path, folder, "model.onnx", "is a directory")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    optimize_bad(tmp_path, path, "empty.onnx", "empty")


def test_random_bytes(tmp_path: Path) -> None:
    path = tmp_path / "random.onnx"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    line = optimize_bad(tmp_path, path, "random.onnx")
    assert "not a valid ONNX protobuf" in line or "no graph" in line


def test_truncated_protobuf(tmp_path: Path) -> None:
    data = DEFAULT_MODEL.read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    optimize_bad(tmp_path, path, "truncated.onnx", "not a valid ONNX protobuf")


def test_zip_file(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", b"not really")
    optimize_bad(tmp_path, path, "model.pt", "zip archive", "not an ONNX model")


def test_pickle_is_never_loaded(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "model.pkl"
    path.write_bytes(pickle.dumps(Exploit(), protocol=4))
    optimize_bad(tmp_path, path, "model.pkl", "pickle")
    assert not marker.exists()


def test_json_text(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_text('{"graph": {"node": []}}\n')
    optimize_bad(tmp_path, path, "model.json", "text file")


# ---------------------------------------------------------------------------------------------
# Unsupported versions


def test_ir_version_too_new(tmp_path: Path) -> None:
    proto = relu_model()
    proto.ir_version = 99
    optimize_bad(tmp_path, save(proto, tmp_path / "m.onnx"), "m.onnx", "IR version 99")


def test_opset_too_new(tmp_path: Path) -> None:
    proto = relu_model()
    proto.opset_import[0].version = 999
    optimize_bad(tmp_path, save(proto, tmp_path / "m.onnx"), "m.onnx", "opset 999 is not supported")


def test_missing_default_opset(tmp_path: Path) -> None:
    proto = relu_model()
    del proto.opset_import[:]
    optimize_bad(tmp_path, save(proto, tmp_path / "m.onnx"), "m.onnx", "Relu", "imports no opset")


# ---------------------------------------------------------------------------------------------
# Broken graphs


def test_cycle(tmp_path: Path) -> None:
    proto = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        cyc (float[4] x) => (float[4] z) {
            a = Add(x, c)
            c = Relu(a)
            z = Identity(c)
        }
        """
    )
    proto.graph.node[0].name = "add_in_loop"
    line = optimize_bad(tmp_path, save(proto, tmp_path / "m.onnx"), "m.onnx", "cycle")
    assert "add_in_loop" in line or "Relu" in line


def test_undefined_tensor(tmp_path: Path) -> None:
    proto = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        undef (float[4] x) => (float[4] y) {
            y = Add(x, ghost)
        }
        """
    )
    optimize_bad(tmp_path, save(proto, tmp_path / "m.onnx"), "m.onnx", "'ghost'", "Add")


def test_two_nodes_produce_one_name(tmp_path: Path) -> None:
    proto = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        dup (float[4] x) => (float[4] y) {
            y = Relu(x)
            y = Neg(x)
        }
        """
    )
    optimize_bad(tmp_path, save(proto, tmp_path / "m.onnx"), "m.onnx", "'y'", "defined twice")


def test_initializer_clashes_with_node_output(tmp_path: Path) -> None:
    proto = relu_model()
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros(4, np.float32), "y"))
    optimize_bad(tmp_path, save(proto, tmp_path / "m.onnx"), "m.onnx", "'y'", "defined twice")


def test_duplicate_initializers(tmp_path: Path) -> None:
    proto = relu_model()
    for value in (0.0, 1.0):
        proto.graph.initializer.append(
            onnx.numpy_helper.from_array(np.full(4, value, np.float32), "w")
        )
    optimize_bad(tmp_path, save(proto, tmp_path / "m.onnx"), "m.onnx", "'w'", "defined twice")


def test_duplicate_graph_inputs(tmp_path: Path) -> None:
    proto = relu_model()
    proto.graph.input.append(proto.graph.input[0])
    optimize_bad(tmp_path, save(proto, tmp_path / "m.onnx"), "m.onnx", "'x'", "defined twice")


def test_input_with_initializer_is_a_default_not_a_clash(tmp_path: Path) -> None:
    """An initializer named like a graph input is a legal overridable default (IR >= 4)."""
    proto = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x, float[4] bias) => (float[4] y) <float[4] bias = {1.0, 2.0, 3.0, 4.0}> {
            y = Add(x, bias)
        }
        """
    )
    out = tmp_path / "out.onnx"
    outcome = cli("optimize", save(proto, tmp_path / "m.onnx"), "-o", out)
    assert outcome.exit_code == 0, outcome
    optimized = onnx.load(str(out))
    assert [i.name for i in optimized.graph.input] == ["x", "bias"]


# ---------------------------------------------------------------------------------------------
# Custom ops: kept, not an error


CUSTOM = """
<ir_version: 8, opset_import: ["" : 17, "com.example" : 1]>
custom (float[N, 4] x) => (float[N, 4] y) {
    a = Identity(x)
    b = com.example.Frobnicate(a)
    y = Relu(b)
}
"""


def test_custom_op_needs_no_validate(tmp_path: Path) -> None:
    model = save(parse(CUSTOM), tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    line = assert_clean_error(
        cli("optimize", model, "-o", out), "m.onnx", "--no-validate", output=out
    )
    assert "com.example" in line or "Frobnicate" in line


def test_custom_op_is_kept_with_no_validate(tmp_path: Path) -> None:
    model = save(parse(CUSTOM), tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    outcome = cli("optimize", model, "-o", out, "--no-validate")
    assert outcome.exit_code == 0, outcome
    optimized = onnx.load(str(out))
    custom = [n for n in optimized.graph.node if n.domain == "com.example"]
    assert [n.op_type for n in custom] == ["Frobnicate"]
    assert {o.domain: o.version for o in optimized.opset_import}["com.example"] == 1


# ---------------------------------------------------------------------------------------------
# External data


def external_model(folder: Path, location: str, *, offset: int = 0, length: int = 16) -> Path:
    """A model whose 4-float weight lives in external data at ``location``."""
    proto = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        ext (float[4] x) => (float[4] y) {
            y = Add(x, w)
        }
        """
    )
    weight = onnx.numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    weight.ClearField("raw_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    proto.graph.initializer.append(weight)
    folder.mkdir(parents=True, exist_ok=True)
    return save(proto, folder / "model.onnx")


def test_external_data_loads_when_it_is_fine(tmp_path: Path) -> None:
    model = external_model(tmp_path / "m", "weights.bin")
    (tmp_path / "m" / "weights.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    outcome = cli("optimize", model, "-o", tmp_path / "out.onnx")
    assert outcome.exit_code == 0, outcome


def test_external_data_absolute_path(tmp_path: Path) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 16)
    model = external_model(tmp_path / "m", str(secret))
    optimize_bad(tmp_path, model, "model.onnx", "initializer 'w'", "absolute")


def test_external_data_dotdot_escape(tmp_path: Path) -> None:
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    model = external_model(tmp_path / "m", "../secret.bin")
    optimize_bad(tmp_path, model, "model.onnx", "'../secret.bin'", "outside the model's folder")


def test_external_data_symlink_leading_out(tmp_path: Path) -> None:
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    model = external_model(tmp_path / "m", "weights.bin")
    (tmp_path / "m" / "weights.bin").symlink_to(tmp_path / "secret.bin")
    optimize_bad(tmp_path, model, "model.onnx", "'weights.bin'", "outside the model's folder")


def test_external_data_device(tmp_path: Path) -> None:
    model = external_model(tmp_path / "m", "/dev/zero")
    optimize_bad(tmp_path, model, "model.onnx", "'/dev/zero'", "absolute")


def test_external_data_symlink_to_device(tmp_path: Path) -> None:
    model = external_model(tmp_path / "m", "weights.bin")
    (tmp_path / "m" / "weights.bin").symlink_to("/dev/zero")
    optimize_bad(tmp_path, model, "model.onnx", "'weights.bin'", "outside the model's folder")


def test_external_data_fifo_does_not_hang(tmp_path: Path) -> None:
    model = external_model(tmp_path / "m", "weights.bin")
    os.mkfifo(tmp_path / "m" / "weights.bin")
    out = tmp_path / "out.onnx"
    outcome = cli_subprocess("optimize", model, "-o", out, timeout=60)
    assert_clean_error(outcome, "'weights.bin'", "not a regular file", output=out)


def test_external_data_beyond_end_of_file(tmp_path: Path) -> None:
    model = external_model(tmp_path / "m", "weights.bin", offset=8, length=16)
    (tmp_path / "m" / "weights.bin").write_bytes(b"\0" * 16)
    optimize_bad(tmp_path, model, "model.onnx", "initializer 'w'", "bytes 8..24", "only 16 bytes")


def test_external_data_missing_file(tmp_path: Path) -> None:
    model = external_model(tmp_path / "m", "weights.bin")
    optimize_bad(tmp_path, model, "model.onnx", "'weights.bin'", "does not exist")


# ---------------------------------------------------------------------------------------------
# Bombs: size, depth, count


def _pass_registered(name: str) -> bool:
    return any(cls.name == name for cls in ALL_PASSES)


# 100000 x 100000 float32 = 40 GB.
BOMB = """
<ir_version: 8, opset_import: ["" : 17]>
bomb (float[1] x) => (float[1] y) {
    shape = Constant<value = int64[2] {100000, 100000}>()
    big = ConstantOfShape<value = float[1] {1.0}>(shape)
    total = ReduceSum<keepdims = 0>(big)
    y = Add(x, total)
}
"""


@pytest.mark.skipif(
    not _pass_registered("fold-constants"),
    reason="needs the constant folding pass 'fold-constants', not registered on this branch yet",
)
def test_constant_folding_does_not_explode(tmp_path: Path) -> None:
    """ConstantOfShape [100000, 100000] (40 GB of float32) must stay unfolded, never be allocated."""
    model = save(parse(BOMB), tmp_path / "bomb.onnx")
    out = tmp_path / "out.onnx"
    outcome = cli_subprocess("optimize", model, "-o", out, "--no-validate", timeout=120)
    assert outcome.exit_code == 0, outcome
    assert out.stat().st_size < 100_000
    assert "ConstantOfShape" in {n.op_type for n in onnx.load(str(out)).graph.node}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    """A protobuf field of wire type 2 (a string or a nested message)."""
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _int_field(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def test_explosive_model_fails_validation_cleanly(tmp_path: Path) -> None:
    """Validation runs the original model: a 40 GB allocation there is an error line, not a crash."""
    model = save(parse(BOMB), tmp_path / "bomb.onnx")
    out = tmp_path / "out.onnx"
    outcome = cli_subprocess("optimize", model, "-o", out, timeout=300)
    assert_clean_error(outcome, "bomb.onnx", "ConstantOfShape", "--no-validate", output=out)


def nested_if(depth: int) -> onnx.ModelProto:
    """``depth`` If nodes, each in the then-branch of the one outside it."""
    leaf = oh.make_graph(
        [oh.make_node("Identity", ["x"], ["r0"])],
        "leaf",
        [],
        [oh.make_tensor_value_info("r0", onnx.TensorProto.FLOAT, [1])],
    )
    branch = leaf
    for level in range(1, depth + 1):
        out = f"r{level}"
        node = oh.make_node("If", ["cond"], [out], then_branch=branch, else_branch=leaf)
        branch = oh.make_graph(
            [node], f"g{level}", [], [oh.make_tensor_value_info(out, onnx.TensorProto.FLOAT, [1])]
        )
    graph = oh.make_graph(
        list(branch.node),
        "nested",
        [
            oh.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
            oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1]),
        ],
        list(branch.output),
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def nested_if_bytes(depth: int) -> bytes:
    """The bytes of ``nested_if(depth)``, built by hand: protobuf itself refuses to nest that deep."""
    leaf = nested_if(0).graph.node[0].SerializeToString()
    leaf_graph = _length_delimited(1, leaf) + _length_delimited(12, _length_delimited(1, b"r0"))
    graph = leaf_graph
    for level in range(1, depth + 1):
        attributes = b"".join(
            _length_delimited(
                5,
                _length_delimited(1, name)
                + _int_field(20, onnx.AttributeProto.GRAPH)
                + _length_delimited(6, g),
            )
            for name, g in ((b"then_branch", graph), (b"else_branch", leaf_graph))
        )
        out = f"r{level}".encode()
        node = (
            _length_delimited(1, b"cond")
            + _length_delimited(2, out)
            + _length_delimited(4, b"If")
            + attributes
        )
        graph = _length_delimited(1, node) + _length_delimited(12, _length_delimited(1, out))
    opset = _length_delimited(8, _int_field(2, 17))
    return _int_field(1, 8) + _length_delimited(7, graph) + opset


# Python's protobuf (upb) parses at most 100 nested messages; each If level costs 3
# (Graph.node -> Node.attribute -> Attribute.g) and typed outputs 5 more, so about 30 levels parse.
DEEP_IF_THAT_PARSES = 25


def test_deeply_nested_if_subgraphs(tmp_path: Path) -> None:
    path = tmp_path / "nested.onnx"
    path.write_bytes(nested_if_bytes(3000))
    out = tmp_path / "out.onnx"
    outcome = cli_subprocess("optimize", path, "-o", out, timeout=120)
    assert_clean_error(outcome, "nested.onnx", "nested", output=out)


def test_nesting_as_deep_as_protobuf_allows_works(tmp_path: Path) -> None:
    path = tmp_path / "nested.onnx"
    path.write_bytes(nested_if(DEEP_IF_THAT_PARSES).SerializeToString())
    out = tmp_path / "out.onnx"
    outcome = cli("optimize", path, "-o", out)
    assert outcome.exit_code == 0, outcome


def test_deeply_nested_protobuf_messages(tmp_path: Path) -> None:
    """Raw bytes: Graph.node -> Node.attribute -> Attribute.g -> Graph.node ... 20,000 levels."""
    payload = b""
    for _ in range(20_000):
        payload = _length_delimited(1, _length_delimited(5, _length_delimited(6, payload)))
    data = _length_delimited(7, payload) + _int_field(1, 8)  # graph, then ir_version = 8
    path = tmp_path / "deep.onnx"
    path.write_bytes(data)
    out = tmp_path / "out.onnx"
    outcome = cli_subprocess("optimize", path, "-o", out, timeout=120)
    assert_clean_error(outcome, "deep.onnx", output=out)


def test_chain_of_5k_nodes(tmp_path: Path) -> None:
    path = save(relu_chain(5_000), tmp_path / "chain.onnx")
    out = tmp_path / "out.onnx"
    outcome = cli("optimize", path, "-o", out)
    assert outcome.exit_code == 0, outcome


@pytest.mark.slow
def test_chain_of_200k_nodes(tmp_path: Path) -> None:
    path = save(relu_chain(200_000), tmp_path / "chain.onnx")
    out = tmp_path / "out.onnx"
    outcome = cli_subprocess("optimize", path, "-o", out, timeout=1800)
    assert outcome.exit_code == 0, outcome
    assert outcome.cpu_seconds < 300, f"{outcome.cpu_seconds:.0f} s of CPU"


def test_non_utf8_names(tmp_path: Path) -> None:
    proto = relu_model()
    proto.graph.node[0].name = "NAMEXXXX"
    data = proto.SerializeToString().replace(b"NAMEXXXX", b"\xff\xfe\xc3\x28NAME")
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    optimize_bad(tmp_path, path, "m.onnx")


@pytest.mark.parametrize("dim", [0, -3])
def test_zero_or_negative_dims(tmp_path: Path, dim: int) -> None:
    proto = relu_model()
    for value in (proto.graph.input[0], proto.graph.output[0]):
        value.type.tensor_type.shape.dim[1].dim_value = dim
    path = save(proto, tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    outcome = cli("optimize", path, "-o", out)
    if dim >= 0:
        assert outcome.exit_code == 0, outcome
    else:
        assert_clean_error(outcome, "m.onnx", "'x'", str(dim), output=out)


def test_minus_one_dim_reads_as_unknown(tmp_path: Path) -> None:
    """paddle2onnx writes a dynamic dim as -1 (RapidOCR's text classifier: x [-1, 3, ?, ?]); ONNX
    Runtime reads it as unknown. So does onnxopt: validated at more than one size, written as an
    unknown dim, and a warning says so. Other negative dims stay an error (above)."""
    proto = relu_model()
    for value in (proto.graph.input[0], proto.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_value = -1
    proto.graph.value_info.append(
        oh.make_tensor_value_info("y_seen", onnx.TensorProto.FLOAT, [-1, 4])
    )
    path = save(proto, tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    outcome = cli("optimize", path, "-o", out)
    assert outcome.exit_code == 0, outcome
    assert "3 values have dims written as -1" in outcome.stdout, outcome.stdout
    tried = next(line for line in outcome.stdout.splitlines() if line.startswith("inputs tried"))
    assert tried.count("x[") == 2 and len(set(tried.split(";"))) == 2, tried
    written = onnx.load(str(out)).graph
    for value in (written.input[0], written.output[0]):
        dim = value.type.tensor_type.shape.dim[0]
        assert not dim.HasField("dim_value"), value


def test_negative_dim_in_value_info(tmp_path: Path) -> None:
    proto = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y) <float[-2] a> {
            a = Relu(x)
            y = Neg(a)
        }
        """
    )
    optimize_bad(tmp_path, save(proto, tmp_path / "m.onnx"), "m.onnx", "value_info 'a'", "-2")


# ---------------------------------------------------------------------------------------------
# Files: tracebacks on request, never clobber the input


def test_traceback_flag_shows_the_traceback(tmp_path: Path) -> None:
    outcome = cli_subprocess("optimize", tmp_path / "nope.onnx", "--traceback", timeout=60)
    assert outcome.exit_code == 2
    assert "Traceback (most recent call last)" in outcome.stderr
    assert outcome.stderr.strip().splitlines()[-1].startswith("onnxopt: error: ")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_output_same_as_input_is_refused(tmp_path: Path) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    before = _digest(model)
    outcome = cli("optimize", model, "-o", model)
    assert_clean_error(outcome, "m.onnx", "overwrite")
    assert _digest(model) == before


def test_output_same_as_input_via_other_spelling_is_refused(tmp_path: Path) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    (tmp_path / "sub").mkdir()
    before = _digest(model)
    outcome = cli("optimize", model, "-o", tmp_path / "sub" / ".." / "m.onnx")
    assert_clean_error(outcome, "overwrite")
    assert _digest(model) == before


def test_overwrite_allows_it(tmp_path: Path) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    outcome = cli("optimize", model, "-o", model, "--overwrite")
    assert outcome.exit_code == 0, outcome
    onnx.checker.check_model(onnx.load(str(model)))


def test_output_file_gets_the_usual_mode(tmp_path: Path) -> None:
    """Written atomically via a private temp file, but the result is readable like any new file."""
    model = save(relu_model(), tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    assert cli("optimize", model, "-o", out).exit_code == 0
    mask = os.umask(0o022)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask


def test_input_is_never_modified(tmp_path: Path) -> None:
    model = tmp_path / "default.onnx"
    model.write_bytes(DEFAULT_MODEL.read_bytes())
    before = _digest(model)
    outcome = cli("optimize", model, "-o", tmp_path / "out.onnx")
    assert outcome.exit_code == 0, outcome
    assert _digest(model) == before


def test_output_into_missing_folder(tmp_path: Path) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    out = tmp_path / "missing" / "out.onnx"
    assert_clean_error(cli("optimize", model, "-o", out), "missing", "does not exist")
    assert not out.parent.exists()


# ---------------------------------------------------------------------------------------------
# Tensor data that disagrees with its dtype and dims (found by scripts/hostile_probe.py)


def _with_weight(weight: onnx.TensorProto, size: int = 4) -> onnx.ModelProto:
    proto = parse(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[{size}] x) => (float[{size}] y) {{
            y = Add(x, w)
        }}
        """
    )
    proto.graph.initializer.append(weight)
    return proto


def _weight(size: int = 4) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.arange(size, dtype=np.float32), "w")


def _float_data_longer_than_dims() -> onnx.TensorProto:
    weight = oh.make_tensor("w", onnx.TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    weight.float_data.append(4.0)
    return weight


def _raw_data(data: bytes) -> onnx.TensorProto:
    weight = _weight()
    weight.raw_data = data
    return weight


def _data_type(value: int) -> onnx.TensorProto:
    weight = _weight()
    weight.data_type = value
    return weight


def _dims(*dims: int) -> onnx.TensorProto:
    weight = _weight()
    del weight.dims[:]
    weight.dims.extend(dims)
    return weight


@pytest.mark.parametrize(
    ("weight", "fragments"),
    [
        (_float_data_longer_than_dims(), ("holds 4 values in float_data", "need 3")),
        (_raw_data(b"\0" * 10), ("10 bytes of raw_data", "need 16")),
        (_raw_data(b"\0" * 24), ("24 bytes of raw_data", "need 16")),
        (_data_type(0), ("no valid data type (0)",)),
        (_data_type(999), ("no valid data type (999)",)),
        (_dims(-4), ("negative dimension (-4)",)),
        (_dims(100_000, 100_000), ("40000000000",)),  # 40 GB of dims, 16 bytes of data
    ],
    ids=[
        "float-data",
        "raw-short",
        "raw-long",
        "dtype-0",
        "dtype-999",
        "negative-dim",
        "huge-dims",
    ],
)
def test_initializer_data_must_fit_its_dims(
    tmp_path: Path, weight: onnx.TensorProto, fragments: tuple[str, ...]
) -> None:
    model = save(_with_weight(weight), tmp_path / "m.onnx")
    optimize_bad(tmp_path, model, "m.onnx", "initializer 'w'", *fragments)


def test_large_inline_initializer_too_short(tmp_path: Path) -> None:
    """Large weights are mapped from the file, not parsed: their length is checked all the same."""
    weight = _weight(4096)
    weight.raw_data = weight.raw_data[:8000]
    model = save(_with_weight(weight, 4096), tmp_path / "m.onnx")
    optimize_bad(tmp_path, model, "initializer 'w'", "8000 bytes of raw_data", "need 16384")


def test_external_data_length_disagrees_with_dims(tmp_path: Path) -> None:
    model = external_model(tmp_path / "m", "weights.bin", length=8)
    (tmp_path / "m" / "weights.bin").write_bytes(b"\0" * 64)
    optimize_bad(tmp_path, model, "initializer 'w'", "8 bytes of external data", "need 16")


def test_external_data_without_length_past_end_of_file(tmp_path: Path) -> None:
    model = external_model(tmp_path / "m", "weights.bin")
    proto = onnx.load(str(model), load_external_data=False)
    entries = proto.graph.initializer[0].external_data
    del entries[[e.key for e in entries].index("length")]
    save(proto, model)
    (tmp_path / "m" / "weights.bin").write_bytes(b"\0" * 8)
    optimize_bad(tmp_path, model, "initializer 'w'", "bytes 0..16", "only 8 bytes")


def test_external_data_through_a_missing_folder(tmp_path: Path) -> None:
    """'missing/../w.bin' resolves inside the folder, but opening it as written fails."""
    model = external_model(tmp_path / "m", "missing/../weights.bin")
    (tmp_path / "m" / "weights.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    optimize_bad(tmp_path, model, "'missing/../weights.bin'", "does not exist")


def test_external_data_pointing_at_the_model_file(tmp_path: Path) -> None:
    model = external_model(tmp_path / "m", "model.onnx")
    optimize_bad(tmp_path, model, "initializer 'w'", "'model.onnx' is the model file itself")


def test_attribute_with_the_wrong_type(tmp_path: Path) -> None:
    proto = relu_model()
    proto.graph.node[0].op_type = "Transpose"
    proto.graph.node[0].attribute.append(oh.make_attribute("perm", [1.0, 0.0]))
    optimize_bad(
        tmp_path, save(proto, tmp_path / "m.onnx"), "Transpose", "'perm' is FLOATS", "takes INTS"
    )


def test_graph_without_outputs(tmp_path: Path) -> None:
    proto = relu_model()
    del proto.graph.output[:]
    optimize_bad(tmp_path, save(proto, tmp_path / "m.onnx"), "m.onnx", "no outputs")


def test_unsupported_type_names_the_reason(tmp_path: Path) -> None:
    map_type = oh.make_map_type_proto(onnx.TensorProto.INT64, oh.make_tensor_type_proto(1, []))
    graph = oh.make_graph(
        [oh.make_node("Identity", ["m"], ["y"])],
        "g",
        [oh.make_value_info("m", map_type)],
        [oh.make_value_info("y", map_type)],
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    optimize_bad(
        tmp_path, save(proto, tmp_path / "m.onnx"), "m.onnx", "input 'm' is a map", "not supported"
    )


def test_sparse_initializer_index_out_of_range(tmp_path: Path) -> None:
    values = onnx.numpy_helper.from_array(np.array([5.0], np.float32), "w")
    indices = onnx.numpy_helper.from_array(np.array([9], np.int64), "w_indices")
    proto = relu_model()
    proto.graph.node[0].op_type = "Add"
    proto.graph.node[0].input.append("w")
    proto.graph.sparse_initializer.append(oh.make_sparse_tensor(values, indices, [4]))
    optimize_bad(
        tmp_path, save(proto, tmp_path / "m.onnx"), "sparse initializer 'w'", "outside its dims"
    )


# ---------------------------------------------------------------------------------------------
# Files the command writes besides the model


@pytest.mark.parametrize("option", ["--memory-plan", "--junit", "--markdown"])
def test_report_file_never_overwrites_the_input(tmp_path: Path, option: str) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    before = _digest(model)
    out = tmp_path / "out.onnx"
    outcome = cli("optimize", model, "-o", out, option, tmp_path / "." / "m.onnx")
    assert_clean_error(outcome, option, "refusing to overwrite the input model", output=out)
    assert _digest(model) == before


@pytest.mark.parametrize("option", ["--memory-plan", "--junit", "--markdown"])
def test_report_file_in_a_missing_folder(tmp_path: Path, option: str) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    outcome = cli("optimize", model, "-o", out, option, tmp_path / "missing" / "r.txt")
    assert_clean_error(outcome, option, "missing' does not exist", output=out)


def test_output_is_a_folder(tmp_path: Path) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    (tmp_path / "out.onnx").mkdir()
    line = assert_clean_error(cli("optimize", model, "-o", tmp_path / "out.onnx"), "is a folder")
    assert ".tmp" not in line  # refused before any work, not when the rename failed


def test_out_dir_is_a_file(tmp_path: Path) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    (tmp_path / "f").write_text("x")
    assert_clean_error(cli("optimize", model, "--out-dir", tmp_path / "f"), "not a folder")


def test_out_dir_of_the_input_is_an_error_not_success(tmp_path: Path) -> None:
    """--out-dir with one model goes through the batch path; its error must still exit 2."""
    model = save(relu_model(), tmp_path / "m.onnx")
    before = _digest(model)
    outcome = cli("optimize", model, "--out-dir", tmp_path)
    assert outcome.exit_code == 2, outcome
    assert "refusing to overwrite" in outcome.stderr
    assert _digest(model) == before


def test_inputs_too_large_to_generate(tmp_path: Path) -> None:
    proto = relu_model()
    for value in (proto.graph.input[0], proto.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_value = 10**12
    optimize_bad(tmp_path, save(proto, tmp_path / "m.onnx"), "m.onnx", "too large to generate")


def test_bench_on_a_model_ort_cannot_load(tmp_path: Path) -> None:
    proto = parse(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x, int64[4] i) => (float[4] y) {
            y = Add(x, i)
        }
        """
    )
    model = save(proto, tmp_path / "m.onnx")
    outcome = cli("bench", model, "--budget", "1", "--no-memory")
    assert_clean_error(outcome, "m.onnx", "cannot load the original model")


@pytest.mark.parametrize("values", [{}, {"value_float": 1.0, "value_int": 2}])
def test_constant_without_exactly_one_value(tmp_path: Path, values: dict[str, object]) -> None:
    proto = relu_model()
    proto.graph.node[0].op_type = "Add"
    proto.graph.node[0].input.append("c")
    proto.graph.node.insert(0, oh.make_node("Constant", [], ["c"], **values))
    optimize_bad(
        tmp_path,
        save(proto, tmp_path / "m.onnx"),
        "Constant",
        f"exactly one value attribute; it has {len(values)}",
        extra=("--no-validate",),
    )


def _function_chain(depth: int, *, recursive: bool = False) -> onnx.ModelProto:
    """``local.f0`` calls ``f1`` ... calls ``f{depth-1}``, which negates (or calls ``f0`` again)."""
    opsets = [oh.make_opsetid("", 17), oh.make_opsetid("local", 1)]
    functions = []
    for i in range(depth):
        last = i == depth - 1
        callee = "f0" if last and recursive else f"f{i + 1}"
        body = (
            oh.make_node("Neg", ["a"], ["b"])
            if last and not recursive
            else oh.make_node(callee, ["a"], ["b"], domain="local")
        )
        functions.append(oh.make_function("local", f"f{i}", ["a"], ["b"], [body], opsets))
    proto = relu_model()
    proto.graph.node[0].CopyFrom(oh.make_node("f0", ["x"], ["y"], domain="local"))
    proto.opset_import.append(oh.make_opsetid("local", 1))
    proto.functions.extend(functions)
    return proto


def test_recursive_local_function(tmp_path: Path) -> None:
    """Written unchanged before (with --no-validate): a model no runtime can ever run."""
    model = save(_function_chain(3, recursive=True), tmp_path / "m.onnx")
    optimize_bad(tmp_path, model, "m.onnx", "'local.f0' calls itself", extra=("--no-validate",))


def test_local_functions_nested_too_deep(tmp_path: Path) -> None:
    """onnx-ir recursed without bound over 3000 nested calls; ONNX and ORT stop at 100."""
    model = save(_function_chain(3000), tmp_path / "m.onnx")
    optimize_bad(tmp_path, model, "m.onnx", "101 deep", "allow 100", extra=("--no-validate",))


def test_local_functions_nested_as_deep_as_allowed(tmp_path: Path) -> None:
    model = save(_function_chain(20), tmp_path / "m.onnx")
    outcome = cli("optimize", model, "-o", tmp_path / "out.onnx")
    assert outcome.exit_code == 0, outcome


@pytest.fixture(scope="module")
def npz_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An .npz claiming 300M float32 zeros (1.2 GB), deflated to ~1 MB on disk.

    Only the header is written for real; the zeros stream in pieces, never held in memory.
    """
    path = tmp_path_factory.mktemp("bomb") / "bomb.npz"
    header = {"descr": "<f4", "fortran_order": False, "shape": (300_000_000,)}
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive,
        archive.open("output/y.npy", "w", force_zip64=True) as member,
    ):
        np.lib.format.write_array_header_2_0(member, header)
        piece = bytes(64 * 1024 * 1024)
        remaining = 300_000_000 * 4
        while remaining:
            chunk = piece[: min(len(piece), remaining)]
            member.write(chunk)
            remaining -= len(chunk)
    assert path.stat().st_size < 8_000_000
    return path


def test_reference_npz_bomb_beside_the_model(tmp_path: Path, npz_bomb: Path) -> None:
    """MODEL.ref.npz is picked up automatically: its arrays are sized from their headers first."""
    model = save(relu_model(), tmp_path / "m.onnx")
    os.link(npz_bomb, tmp_path / "m.ref.npz")
    optimize_bad(tmp_path, model, "m.ref.npz", "over the 1073741824-byte limit")


def test_inputs_npz_bomb(tmp_path: Path, npz_bomb: Path) -> None:
    model = save(relu_model(), tmp_path / "m.onnx")
    optimize_bad(
        tmp_path,
        model,
        "--inputs",
        "over the 1073741824-byte limit",
        extra=("--inputs", str(npz_bomb)),
    )


def test_node_without_op_type(tmp_path: Path) -> None:
    proto = relu_model()
    proto.graph.node.append(oh.make_node("", ["x"], ["z"]))
    optimize_bad(
        tmp_path,
        save(proto, tmp_path / "m.onnx"),
        "node #1 has no op type",
        extra=("--no-validate",),
    )


def test_node_whose_required_first_input_is_empty(tmp_path: Path) -> None:
    """An empty input name means "absent": Neg reading "" used to crash promote-conv1d."""
    proto = relu_model()
    proto.graph.node.append(oh.make_node("Neg", [""], ["z"]))
    optimize_bad(
        tmp_path,
        save(proto, tmp_path / "m.onnx"),
        "node #1 (Neg): its first input ('X') is required and missing",
        extra=("--no-validate",),
    )


def test_millions_of_empty_nodes(tmp_path: Path) -> None:
    """A 4 MB file of 2.1M empty NodeProtos: onnx-ir alone would need ~1 GB and a minute."""
    graph = relu_model().graph.SerializeToString() + b"\x0a\x00" * 2_100_000  # node {}
    head = relu_model()
    head.ClearField("graph")
    path = tmp_path / "m.onnx"
    path.write_bytes(head.SerializeToString() + _length_delimited(7, graph))
    optimize_bad(tmp_path, path, "m.onnx", "over 2000000 nodes")


ENDLESS_LOOP = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] x) => (float[4] y) {
    n = Constant<value = int64 {1000000000000}>()
    t = Constant<value = bool {1}>()
    y = Loop(n, t, x) <
        body = b (int64 i, bool cin, float[4] a) => (bool cout, float[4] a2) {
            cout = Identity(cin)
            one = Constant<value = float {1.0}>()
            a2 = Add(a, one)
        }
    >
}
"""


def test_validation_run_is_stopped_at_the_time_limit(tmp_path: Path) -> None:
    """10**12 Loop iterations on ORT: validation used to wait for ever."""
    model = save(parse(ENDLESS_LOOP), tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    outcome = cli_subprocess("optimize", model, "-o", out, "--run-timeout", "1", timeout=120)
    assert_clean_error(outcome, "m.onnx", "ran longer than --run-timeout (1 s)", output=out)
    assert outcome.seconds < 60


def test_bench_stops_a_run_at_the_time_limit(tmp_path: Path) -> None:
    """bench's first run of each variant used to wait for ever on the endless Loop."""
    model = save(parse(ENDLESS_LOOP), tmp_path / "m.onnx")
    outcome = cli_subprocess(
        "bench", model, "--no-memory", "--budget", "1", "--run-timeout", "1", timeout=120
    )
    assert_clean_error(outcome, "m.onnx", "took over --run-timeout (1 s)")
    assert outcome.seconds < 60
