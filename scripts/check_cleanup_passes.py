"""Measure eliminate-noops + merge-consecutive-ops on real models and check they stay correct.

For every model (the onnx wheel's backend test data by default, or the paths given): node count
before, after the default level without these two passes, and after the default level; the
result is validated on ORT against the original (generated inputs) and, where the folder has
``test_data_set_0``, against the expected outputs for the shipped inputs.

    PYTHONPATH=. .venv/bin/python scripts/check_cleanup_passes.py [--json out.json] [MODEL ...]
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper

import onnxopt
from onnxopt.validate import CannotValidate, _session, compare_arrays

OURS = ["eliminate-noops", "merge-consecutive-ops"]
DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"


def default_models() -> list[Path]:
    models: list[Path] = []
    for folder in ("light", "pytorch-converted", "pytorch-operator", "simple"):
        models += sorted(Path(p) for p in glob.glob(str(DATA / folder / "*.onnx")))
        models += sorted(Path(p) for p in glob.glob(str(DATA / folder / "*" / "model.onnx")))
    return models


def read_dataset(model_path: Path) -> tuple[dict[str, np.ndarray], list[np.ndarray]] | None:
    folder = model_path.parent / "test_data_set_0"
    if model_path.name != "model.onnx" or not folder.is_dir():
        return None
    proto = onnx.load(str(model_path), load_external_data=False)
    initializers = {t.name for t in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in initializers]
    feeds = {}
    for index, name in enumerate(names):
        tensor = onnx.TensorProto()
        tensor.ParseFromString((folder / f"input_{index}.pb").read_bytes())
        feeds[name] = onnx.numpy_helper.to_array(tensor)
    expected = []
    for index in range(len(proto.graph.output)):
        tensor = onnx.TensorProto()
        tensor.ParseFromString((folder / f"output_{index}.pb").read_bytes())
        expected.append(onnx.numpy_helper.to_array(tensor))
    return feeds, expected


def matches_expected(
    model: object, feeds: dict[str, np.ndarray], expected: list[np.ndarray]
) -> bool:
    session = _session(model)  # type: ignore[arg-type]
    outputs = session.run(None, feeds)
    return all(
        compare_arrays("out", e, np.asarray(a)).passed
        for e, a in zip(expected, outputs, strict=True)
    )


def expected_status(model: object, dataset: tuple[dict[str, np.ndarray], list[np.ndarray]]) -> str:
    try:
        return "ok" if matches_expected(model, *dataset) else "FAILED"
    except Exception as exc:
        return f"FAILED ({str(exc).splitlines()[-1][:60]})"


def check(path: Path) -> dict[str, object]:
    row: dict[str, object] = {
        "model": f"{path.parent.name}/{path.name}" if path.name == "model.onnx" else path.name
    }
    baseline = onnxopt.optimize(path, disable=OURS, check=False)
    row["before"] = baseline.report.before.nodes
    row["without"] = baseline.report.after.nodes
    dataset = read_dataset(path)
    try:
        result = onnxopt.optimize(path, inputs=[dataset[0]] if dataset else None)
    except CannotValidate as exc:
        result = onnxopt.optimize(path, check=False)
        row["validated"] = f"n/a: {str(exc)[:60]}"
    else:
        assert result.report.validation is not None
        row["validated"] = "ok" if result.report.validation.passed else "FAILED"
    if row["validated"] == "FAILED":
        without = onnxopt.optimize(path, disable=OURS, inputs=[dataset[0]] if dataset else None)
        assert without.report.validation is not None
        if not without.report.validation.passed:
            row["validated"] = "fails without these passes too"
    row["after"] = result.report.after.nodes
    row["stats"] = {
        k: v for name, s in _totals(result).items() if name in OURS for k, v in s.items()
    }
    if dataset is not None:
        try:
            reference_ok = matches_expected(path, *dataset)
        except Exception:
            reference_ok = False
        if reference_ok:
            row["expected"] = expected_status(result.model, dataset)
            if row["expected"] != "ok" and expected_status(baseline.model, dataset) != "ok":
                row["expected"] = "fails without these passes too"
        else:
            row["expected"] = "n/a (ORT differs before optimizing)"
    return row


def _totals(result: onnxopt.OptimizeResult) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for record in result.report.records:
        stats = out.setdefault(record.name, {})
        for key, value in record.stats.items():
            stats[key] = stats.get(key, 0) + value
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [check(p) for p in (args.models or default_models())]
    print(
        "| model | nodes before | default level without these passes | default level | validation | expected outputs | rewrites |"
    )
    print("|---|---:|---:|---:|---|---|---|")
    for r in rows:
        stats = ", ".join(f"{k}: {v}" for k, v in sorted(r["stats"].items()))  # type: ignore[attr-defined]
        print(
            f"| {r['model']} | {r['before']} | {r['without']} | {r['after']} | {r['validated']} | {r.get('expected', '-')} | {stats} |"
        )
    failed = [
        r["model"]
        for r in rows
        if r["validated"] == "FAILED" or str(r.get("expected")).startswith("FAILED")
    ]
    totals = [sum(int(r[k]) for r in rows) for k in ("before", "without", "after")]  # type: ignore[call-overload]
    print(
        f"\n{len(rows)} models; nodes {totals[0]} -> {totals[1]} (without) -> {totals[2]} (with); failures: {failed or 'none'}"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
