"""Differential check of the folding passes on ONNX's backend node test cases.

For every case that ONNX Runtime runs, apply infer-shapes, lift-constants, fold-shape-values and
fold-constants; when they change the model, run both on ORT with the case's inputs and compare.

    .venv/bin/python scripts/check_fold_conformance.py [--filter SUBSTRING]
"""

from __future__ import annotations

import argparse
import sys
import warnings

import numpy as np
import onnx
from onnx.backend.test.case.node import collect_testcases

sys.path.insert(0, ".")

from onnxopt import io
from onnxopt.passes.fold_constants import FoldConstantsPass
from onnxopt.passes.fold_shape_values import FoldShapeValuesPass
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.passes.lift_constants import LiftConstantsPass


def _run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    session = ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--filter", default="")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    changed = failed = skipped = 0
    for case in collect_testcases():
        if args.filter not in case.name or case.model is None:
            continue
        proto = case.model
        try:
            model = io.model_from_proto(proto, case.name)
        except Exception:
            skipped += 1
            continue
        modified = False
        try:
            for pass_ in (
                InferShapesPass(),
                LiftConstantsPass(),
                FoldShapeValuesPass(),
                FoldConstantsPass(),
            ):
                modified |= pass_(model).modified
        except Exception as exc:
            failed += 1
            print(f"CRASH {case.name}: {type(exc).__name__}: {exc}")
            continue
        if not modified:
            continue
        changed += 1
        optimized = io.to_proto(model)
        for inputs, _ in case.data_sets or []:
            names = [
                i.name
                for i in proto.graph.input
                if i.name not in {t.name for t in proto.graph.initializer}
            ]
            feeds = dict(zip(names, inputs, strict=False))
            try:
                expected = _run(proto, feeds)
            except Exception:
                skipped += 1
                break
            try:
                actual = _run(optimized, feeds)
            except Exception as exc:
                failed += 1
                print(
                    f"FAIL {case.name}: optimized model does not run: {str(exc).splitlines()[-1][:200]}"
                )
                break
            for e, a in zip(expected, actual, strict=True):
                if not isinstance(e, np.ndarray):
                    continue  # sequences / optionals: not compared here
                same = e.shape == a.shape and (
                    np.array_equal(e, a, equal_nan=e.dtype.kind == "f")
                    if e.dtype.kind in "fc"
                    else np.array_equal(e, a)
                )
                if not same and e.dtype.kind == "f" and e.shape == a.shape:
                    # validate.py's tolerances: fp16 results may differ by an ulp or so.
                    tol = 1e-2 if e.dtype == np.float16 else 1e-5
                    same = np.allclose(e, a, rtol=tol, atol=tol, equal_nan=True)
                if not same:
                    failed += 1
                    print(f"FAIL {case.name}: outputs differ")
                    break
    print(
        f"{changed} cases changed by folding, {failed} failures, {skipped} skipped (ORT cannot run them)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
