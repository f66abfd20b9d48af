"""Run original and optimized models on older ONNX Runtime releases: does the output load, run and agree?

`--target ort` output uses com.microsoft contrib ops whose inputs and attributes grew over ORT's
releases. This probe optimizes each model with onnxopt (extra optimize options after ``--``), then,
for every ORT version asked for, runs the original and the optimized file in a child process under
that release (each pip-installed once, without dependencies, into ``--cache``) at ORT_ENABLE_ALL on
the same inputs (the model's ``.ref.npz`` inputs when it has one, else random ones sized like
validation's), and compares the two with validation's tolerances. A crash (a signal), a load or run
error, or a mismatch on a release where the original runs is a failure.

    python scripts/ort_versions_probe.py MODEL.onnx ... --versions 1.20.1,1.26.0 [-- --ort-version 1.20]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import onnxopt.io as io
from onnxopt.reference import reference_path_for
from onnxopt.validate import compare_arrays, input_specs, make_inputs

DEFAULT_VERSIONS = "1.20.1,1.22.1,1.24.4,1.26.0,1.28.0,1.30.0,1.31.1"

# Runs in the child, under the ORT release on its PYTHONPATH: model, feeds .npz, outputs .npz.
CHILD = """
import sys, numpy as np, onnxruntime as ort
model, feeds_path, out = sys.argv[1:4]
options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
options.intra_op_num_threads = 1
try:
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
except Exception as exc:
    print("load error: " + " ".join(str(exc).split())[-300:]); sys.exit(3)
with np.load(feeds_path) as data:
    feeds = {i.name: data[i.name] for i in session.get_inputs()}
try:
    outputs = session.run(None, feeds)
except Exception as exc:
    print("run error: " + " ".join(str(exc).split())[-300:]); sys.exit(4)
np.savez(out, *[np.asarray(o) for o in outputs])
"""


def install(version: str, cache: Path) -> Path:
    target = cache / version
    if not (target / "onnxruntime").is_dir():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(target),
                f"onnxruntime=={version}",
            ],
            check=True,
        )
    return target


def feeds_for(model: Path, work: Path) -> Path:
    reference = reference_path_for(model)
    feeds: dict[str, np.ndarray] = {}
    if reference.is_file():
        with np.load(reference) as data:
            feeds = {k[len("input/") :]: data[k] for k in data.files if k.startswith("input/")}
    else:
        loaded = io.load_model(model)
        made = make_inputs(
            input_specs(loaded.model),
            lambda dim: dim if isinstance(dim, int) else 3,
            np.random.default_rng(0),
        )
        if made is None:
            raise SystemExit(f"{model}: inputs too large to generate")
        feeds = {name: np.asarray(value) for name, value in made.items()}
    path = work / f"{model.stem}.feeds.npz"
    np.savez(path, **feeds)  # type: ignore[arg-type]
    return path


def run(model: Path, feeds: Path, out: Path, site: Path) -> tuple[str, Path | None]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(model), str(feeds), str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        return "timeout", None
    if done.returncode < 0:
        return f"crash ({signal.Signals(-done.returncode).name})", None
    if done.returncode != 0:
        lines = (done.stdout or done.stderr).strip().splitlines()
        return lines[-1] if lines else f"exit {done.returncode}", None
    return "ok", out


def compare(expected: Path, actual: Path) -> str:
    with np.load(expected) as a, np.load(actual) as b:
        for key in a.files:
            x, y = a[key], b[key]
            if x.dtype != y.dtype:
                return f"output {key}: {y.dtype} instead of {x.dtype}"
            if x.dtype.kind not in "fciub":
                continue
            result = compare_arrays(key, x, y)
            if not result.passed:
                return (
                    f"mismatch on {key}: {result.mismatches} of {result.elements} elements, "
                    f"max abs {result.max_abs:.2e}"
                )
    return "ok"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--versions", default=DEFAULT_VERSIONS)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "onnxopt-ort")
    parser.add_argument("--work", type=Path, default=None, help="keep the optimized files here")
    args, optimize_args = parser.parse_known_args()
    optimize_args = [a for a in optimize_args if a != "--"]
    versions = [v for v in args.versions.split(",") if v]
    sites = {v: install(v, args.cache) for v in versions}
    work = args.work or Path(tempfile.mkdtemp(prefix="ort-versions-"))
    work.mkdir(parents=True, exist_ok=True)
    failures = 0
    for model in args.models:
        optimized = work / f"{model.stem}.opt.onnx"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "onnxopt",
                "optimize",
                str(model),
                "-o",
                str(optimized),
                "--no-validate",
                *optimize_args,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        feeds = feeds_for(model, work)
        for version in versions:
            before, expected = run(
                model, feeds, work / f"{model.stem}.{version}.a.npz", sites[version]
            )
            after, actual = run(
                optimized, feeds, work / f"{model.stem}.{version}.b.npz", sites[version]
            )
            if expected is None:
                verdict = f"original does not run ({before}); optimized: {after}"
            elif actual is None:
                verdict = f"FAIL {after}"
            else:
                verdict = compare(expected, actual)
                if verdict != "ok":
                    # A model that draws random numbers (VITS) differs from its own rerun.
                    _, again = run(
                        model, feeds, work / f"{model.stem}.{version}.c.npz", sites[version]
                    )
                    same = again is not None and compare(expected, again) == "ok"
                    verdict = (
                        f"FAIL {verdict}"
                        if same
                        else "the original differs from its own rerun: not compared"
                    )
            failures += verdict.startswith("FAIL")
            print(f"{model.name}  ORT {version}: {verdict}", flush=True)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
