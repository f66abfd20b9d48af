"""Run original and optimized models on older ONNX Runtime releases: does the output load, run and agree?

`--target ort` output uses com.microsoft contrib ops whose inputs and attributes grew over ORT's
releases. This probe optimizes each model with onnxopt (extra optimize options after ``--``), then,
for every ORT version asked for, runs the original and the optimized file in a child process under
that release (each pip-installed once, without dependencies, into ``--cache``) at ORT_ENABLE_ALL on
the same inputs, and compares the two with validation's tolerances. The inputs: the model's
``.ref.npz`` ones when it has them, else random ones sized like validation's; ``--sizes 2,5`` adds
generated ones with every dynamic dim at 2, then at 5 (token ids in range, masks with holes). A
crash (a signal), a load or run error, or a mismatch on a release where the original runs is a
failure.

    python scripts/ort_versions_probe.py MODEL.onnx ... --versions 1.22.0,1.26.0 [--sizes 2,5] [-- --ort-version 1.22]
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


def feeds_for(model: Path, work: Path, sizes: list[int]) -> list[Path]:
    """The model's ``.ref.npz`` inputs, if it has them, and generated ones with every dynamic dim
    at each of ``sizes`` (validation's generator: token ids in range, masks with holes); with no
    sizes and no reference inputs, generated ones at 3."""
    reference = reference_path_for(model)
    sets: list[tuple[str, dict[str, np.ndarray]]] = []
    if reference.is_file():
        with np.load(reference) as data:
            given = {k[len("input/") :]: data[k] for k in data.files if k.startswith("input/")}
        sets.append(("given", given))
    if not sizes and not sets:
        sizes = [3]
    specs = input_specs(io.load_model(model).model) if sizes else []
    for size in sizes:
        made = make_inputs(
            specs,
            lambda dim, size=size: dim if isinstance(dim, int) else size,  # type: ignore[misc]
            np.random.default_rng(size),
        )
        if made is None:
            raise SystemExit(f"{model}: inputs too large to generate")
        sets.append((f"size{size}", {name: np.asarray(value) for name, value in made.items()}))
    paths = []
    for label, feeds in sets:
        path = work / f"{model.stem}.{label}.feeds.npz"
        np.savez(path, **feeds)  # type: ignore[arg-type]
        paths.append(path)
    return paths


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


def probe(model: Path, optimized: Path, feeds: Path, work: Path, site: Path) -> str:
    """Original and optimized under the release at ``site`` on one input set: "ok", "FAIL ..."
    or why they were not compared."""
    stem = f"{feeds.stem}.{site.name}"
    before, expected = run(model, feeds, work / f"{stem}.a.npz", site)
    after, actual = run(optimized, feeds, work / f"{stem}.b.npz", site)
    if expected is None:
        return f"original does not run ({before}); optimized: {after}"
    if actual is None:
        return f"FAIL {after}"
    verdict = compare(expected, actual)
    if verdict == "ok":
        return verdict
    # A model that draws random numbers (VITS) differs from its own rerun.
    _, again = run(model, feeds, work / f"{stem}.c.npz", site)
    if again is not None and compare(expected, again) == "ok":
        return f"FAIL {verdict} ({feeds.stem})"
    return "the original differs from its own rerun: not compared"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--versions", default=DEFAULT_VERSIONS)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "onnxopt-ort")
    parser.add_argument("--work", type=Path, default=None, help="keep the optimized files here")
    parser.add_argument(
        "--sizes",
        default="",
        help="also run generated inputs with every dynamic dim at each of these (e.g. 2,5)",
    )
    args, optimize_args = parser.parse_known_args()
    optimize_args = [a for a in optimize_args if a != "--"]
    versions = [v for v in args.versions.split(",") if v]
    sizes = [int(n) for n in args.sizes.split(",") if n]
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
        feed_sets = feeds_for(model, work, sizes)
        for version in versions:
            verdicts = [probe(model, optimized, feeds, work, sites[version]) for feeds in feed_sets]
            verdict = next((v for v in verdicts if v.startswith("FAIL")), verdicts[0])
            if verdict == "ok" and len(verdicts) > 1:
                verdict = f"ok ({len(verdicts)} input sets)"
            failures += verdict.startswith("FAIL")
            print(f"{model.name}  ORT {version}: {verdict}", flush=True)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
