"""Validation holds one model's ORT session at a time: the original's is released before the
optimized model's is made, so that peak memory is one copy of the weights, not two."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh

from onnxopt import api, validate
from onnxopt.io import load_model


def _write_model(path: Path) -> None:
    weight = onh.from_array(np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096, "w")
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "w"], ["m"]), oh.make_node("Relu", ["m"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 64])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 64])],
        [weight],
    )
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), path)


def test_the_original_session_is_released_before_the_optimized_one_is_made(
    tmp_path: Path, monkeypatch
) -> None:
    path = tmp_path / "m.onnx"
    _write_model(path)
    optimized = api.optimize(path, check=False).model
    alive: list[list[object]] = []
    made = validate._new_session

    def recording(model: object, threads: int) -> object:
        cache = validate._SESSIONS.get()
        alive.append([key[0] for key in cache] if cache is not None else [])
        return made(model, threads)

    monkeypatch.setattr(validate, "_new_session", recording)
    with validate.shared_sessions():
        report = validate.validate(path, optimized)
        assert report.passed and len(report.trials) == 2
        cache = validate._SESSIONS.get()
        assert cache is not None and [key[0] for key in cache] == [id(optimized)]
    # The original was made first, with nothing cached; the optimized model after it was dropped.
    assert alive == [[], []]


def test_optimize_with_a_reference_still_compares_both_models(tmp_path: Path) -> None:
    """The eager comparison of the original now runs before validation; both results stay."""
    path = tmp_path / "m.onnx"
    _write_model(path)
    x = np.linspace(-1, 1, 3 * 64, dtype=np.float32).reshape(3, 64)
    y = np.maximum(x @ (np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096), 0)
    np.savez(tmp_path / "m.ref.npz", **{"input/x": x, "output/y": y})
    result = api.optimize(load_model(path).model, reference=tmp_path / "m.ref.npz")
    reference = result.report.reference
    assert result.validated and reference is not None
    assert reference.export_passed and reference.optimized_passed
    assert [c.name for c in reference.export] == [c.name for c in reference.optimized] == ["y"]
