"""The model zoo: tiny variants exported with both exporters, optimized, and checked against eager PyTorch.

The default run exports three small models (one per family and exporter mix); every other
tiny model x exporter pair runs under ``-m slow``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from onnxopt.reference import Reference, load_reference, reference_path_for, save_reference
from onnxopt.zoo import FULL_SIZE, TINY, ZOO

ROOT = Path(__file__).resolve().parent.parent
EXPORTERS = ("dynamo", "torchscript")
FAST = {("bert-tiny", "dynamo"), ("llama-tiny", "torchscript"), ("small-cnn-tiny", "dynamo")}
CASES = [
    pytest.param(
        name,
        exporter,
        marks=() if (name, exporter) in FAST else pytest.mark.slow,
        id=f"{name}-{exporter}",
    )
    for name in TINY
    for exporter in EXPORTERS
]


def test_every_model_has_a_tiny_variant_and_a_factory_path() -> None:
    assert len(FULL_SIZE) == 11
    for name in FULL_SIZE:
        assert f"{name}-tiny" in ZOO
        assert ZOO[f"{name}-tiny"].factory == ZOO[name].factory + "_tiny"
        module, _, attr = ZOO[name].factory.partition(":")
        assert module.startswith("onnxopt.zoo.") and attr


def test_reference_file_round_trips_without_pickles(tmp_path: Path) -> None:
    assert reference_path_for(tmp_path / "x.onnx") == tmp_path / "x.ref.npz"
    assert reference_path_for(tmp_path / "a.b.onnx") == tmp_path / "a.b.ref.npz"
    reference = Reference(
        {"input_ids": np.arange(6, dtype=np.int64).reshape(2, 3)},
        {"logits": np.ones((2, 4), np.float32)},
        {"torch_version": "2.13.0", "exporter": "dynamo"},
    )
    path = save_reference(tmp_path / "x.ref.npz", reference)
    with np.load(path, allow_pickle=False) as data:
        assert sorted(data.files) == [
            "input/input_ids",
            "meta/exporter",
            "meta/torch_version",
            "output/logits",
        ]
        assert data["meta/torch_version"].shape == ()
    loaded = load_reference(path)
    assert loaded.metadata == reference.metadata
    np.testing.assert_array_equal(loaded.inputs["input_ids"], reference.inputs["input_ids"])
    np.testing.assert_array_equal(loaded.outputs["logits"], reference.outputs["logits"])


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_tiny_model_exports_optimizes_and_matches_eager(
    name: str, exporter: str, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from onnxopt import api
    from onnxopt.export import export

    target = tmp_path / f"{name}.onnx"
    result = export(name, target, exporter=exporter)  # type: ignore[arg-type]
    assert Path(result.output) == target and Path(result.reference) == tmp_path / f"{name}.ref.npz"
    reference = load_reference(result.reference)
    assert reference.metadata["exporter"] == exporter
    assert reference.metadata["torch_version"].startswith("2.")
    assert list(reference.outputs) == list(result.outputs)

    optimized = api.optimize(target, reference=result.reference)
    validation = optimized.report.validation
    assert validation is not None and validation.passed, validation
    # The reference inputs are among those validated, besides the generated ones.
    reference_shapes = {k: v.shape for k, v in reference.inputs.items() if k in result.inputs}
    assert reference_shapes in [dict(t) for t in validation.trials]
    assert len(validation.trials) >= 2
    eager = optimized.report.reference
    assert eager is not None and not eager.errors
    assert [c.name for c in eager.export] == list(reference.outputs)
    assert eager.export_passed, eager.export
    assert eager.optimized_passed, eager.optimized


def test_export_dynamic_axes_accept_other_sizes(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import onnxruntime as ort

    from onnxopt.export import export

    result = export("mlp-tiny", tmp_path / "mlp.onnx", exporter="torchscript")
    session = ort.InferenceSession(result.output, providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == ["batch", 16]
    (out,) = session.run(None, {"features": np.zeros((7, 16), np.float32)})
    assert out.shape == (7, 4)
    static = export("mlp-tiny", tmp_path / "static.onnx", exporter="torchscript", dynamic=False)
    assert ort.InferenceSession(static.output).get_inputs()[0].shape == [4, 16]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_export_past_the_protobuf_limit_writes_one_data_file_and_no_scratch(
    exporter: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exporters write a big model's weights as files of their own naming (TorchScript: one per
    tensor) beside it; export goes through a private folder and leaves OUT + OUT.data only."""
    pytest.importorskip("torch")
    import onnxruntime as ort

    import onnxopt.export as export_module

    monkeypatch.setattr(export_module, "_EXTERNAL_DATA_BYTES", 0)  # every model counts as big
    (tmp_path / "mlp.onnx").write_bytes(b"an earlier output")
    result = export_module.export("mlp-tiny", tmp_path / "mlp.onnx", exporter=exporter)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "mlp.onnx",
        "mlp.onnx.data",
        "mlp.ref.npz",
    ]
    session = ort.InferenceSession(result.output, providers=["CPUExecutionProvider"])
    reference = load_reference(tmp_path / "mlp.ref.npz")
    (out,) = session.run(None, reference.inputs)
    np.testing.assert_allclose(out, next(iter(reference.outputs.values())), rtol=1e-5, atol=1e-6)

    def broken_export(*args: object) -> None:
        Path(str(args[1]) + ".data").write_bytes(b"half of the weights")
        raise RuntimeError("the exporter ran out of memory")

    monkeypatch.setattr(export_module, "_export_torchscript", broken_export)
    monkeypatch.setattr(export_module, "_export_dynamo", broken_export)
    with pytest.raises(export_module.ExportFailed, match="ran out of memory"):
        export_module.export("mlp-tiny", tmp_path / "other.onnx", exporter=exporter)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "mlp.onnx",
        "mlp.onnx.data",
        "mlp.ref.npz",
    ]


USER_FACTORIES = """
import torch


class Doubler(torch.nn.Module):
    def forward(self, x, y):
        return {"sum": x + y, "scaled": 2 * x}


def doubler():
    torch.manual_seed(0)
    return Doubler().eval(), (torch.randn(3, 5), torch.randn(3, 5))


def not_a_module():
    return "hello", ()
"""


def _cli(*args: str) -> tuple[int, str, str]:
    from onnxopt.cli import main

    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_cli_exports_a_user_factory_and_optimize_picks_up_its_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    (tmp_path / "my_factories.py").write_text(textwrap.dedent(USER_FACTORIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    target = tmp_path / "doubler.onnx"
    code, out, err = _cli(
        "export", "my_factories:doubler", "-o", str(target), "--exporter", "torchscript", "--json"
    )
    assert code == 0, err
    summary = json.loads(out)
    assert summary["inputs"] == ["x", "y"]  # named after forward's parameters
    assert summary["outputs"] == ["sum", "scaled"]  # and the returned dict's keys
    assert (tmp_path / "doubler.ref.npz").is_file()

    code, out, err = _cli("optimize", str(target), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["reference"]["export_passed"] and report["reference"]["optimized_passed"]
    assert [c["name"] for c in report["reference"]["export"]] == ["sum", "scaled"]
    code, out, _ = _cli("optimize", str(target), "--json", "--no-reference")
    assert code == 0 and json.loads(out)["reference"] is None


@pytest.mark.parametrize("spec", ["user_factories_cwd:doubler", "user_factories_cwd.py:doubler"])
def test_a_factory_next_to_where_the_command_runs_is_found(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A user runs `onnxopt export mine:factory` in their own folder: no install, no PYTHONPATH
    # (the console script, unlike `python -m`, does not put the current folder on sys.path).
    pytest.importorskip("torch")
    (tmp_path / "user_factories_cwd.py").write_text(textwrap.dedent(USER_FACTORIES))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "user_factories_cwd", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    code, _, err = _cli("export", spec, "-o", "d.onnx", "--exporter", "torchscript")
    assert code == 0, err
    assert (tmp_path / "d.onnx").is_file()
    assert str(tmp_path) not in sys.path  # the folder was on the path for the import only


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no-such-model", "unknown model 'no-such-model'"),
        ("no_such_module_xyz:factory", "cannot import module 'no_such_module_xyz'"),
        ("my_factories:missing", "has no callable 'missing'"),
        ("my_factories:not_a_module", "not a torch.nn.Module"),
    ],
)
def test_cli_export_bad_model_is_a_one_line_usage_error(
    spec: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    (tmp_path / "my_factories.py").write_text(textwrap.dedent(USER_FACTORIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = _cli("export", spec, "-o", str(tmp_path / "m.onnx"))
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnxopt: error:") and message in lines[0], err
    assert not (tmp_path / "m.onnx").exists()


def test_cli_export_without_torch_says_how_to_install(tmp_path: Path) -> None:
    # A real interpreter in which `import torch` fails, as it does when the extra is not installed.
    code = "import sys; sys.modules['torch'] = None; from onnxopt.cli import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", code, "export", "mlp-tiny", "-o", str(tmp_path / "m.onnx")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 2
    assert "pip install 'onnxopt[torch]'" in done.stderr and "torch==2.13.0" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_optimize_rejects_a_malformed_reference(tmp_path: Path) -> None:
    model = ROOT / "models" / "default.onnx"
    bad = tmp_path / "bad.ref.npz"
    bad.write_bytes(b"not a zip")
    code, _, err = _cli("optimize", str(model), "--reference", str(bad))
    assert code == 2 and "not a readable .npz file" in err


def test_cli_export_list_names_every_model() -> None:
    code, out, _ = _cli("export", "--list", "--json")
    assert code == 0
    names = [row["name"] for row in json.loads(out)]
    assert names == list(ZOO)
    assert "llama-tiny" in names and "whisper-encoder" in names


def test_a_reference_that_does_not_fit_pinned_shapes_is_skipped_or_refused(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    shutil.copyfile(ROOT / "models" / "default.onnx", model)
    reference = Reference(
        {"image": np.zeros((2, 3, 32, 32), np.float32)},
        {"logits": np.zeros((2, 10), np.float32)},
        {"exporter": "dynamo"},
    )
    save_reference(tmp_path / "m.ref.npz", reference)
    pinned = ("--input-shape", "image:1x3x32x32")
    # found next to the model: the eager comparison is skipped with a warning, the model is written
    code, out, err = _cli("optimize", str(model), "-o", str(tmp_path / "a.onnx"), *pinned)
    assert code == 0, err
    assert "do not fit the pinned --input-shape" in " ".join((out + err).split())
    assert (tmp_path / "a.onnx").is_file()
    # given explicitly: a usage error, one line, nothing written
    code, _, err = _cli(
        "optimize", str(model), "-o", str(tmp_path / "b.onnx"), *pinned,
        "--reference", str(tmp_path / "m.ref.npz"),
    )  # fmt: skip
    assert code == 2 and "image 2x3x32x32" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b.onnx").exists()
