"""Export the model zoo with both exporters into zoo/ (what `make models` runs).

Each export runs `onnxopt export` in its own process (a crash or an out-of-memory kill costs one
model, not the run) and is skipped when its .onnx and .ref.npz exist and were made from the same
zoo sources (a digest of onnxopt/zoo/*.py and onnxopt/export.py, kept in zoo/status.json with each
result and each failure's one-line reason).

    .venv/bin/python scripts/export_zoo.py              # full-size models (CPU heavy: minutes each)
    .venv/bin/python scripts/export_zoo.py --tiny       # the tiny variants
    .venv/bin/python scripts/export_zoo.py bert vit --exporter dynamo
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from onnxopt.reference import reference_path_for  # noqa: E402
from onnxopt.zoo import FULL_SIZE, TINY, ZOO  # noqa: E402

EXPORTERS = ("dynamo", "torchscript")
SOURCES = [*sorted((ROOT / "onnxopt" / "zoo").glob("*.py")), ROOT / "onnxopt" / "export.py"]


def sources_digest() -> str:
    digest = hashlib.sha256()
    for path in SOURCES:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def up_to_date(model: Path, entry: dict[str, object], digest: str) -> bool:
    done = bool(entry.get("ok")) and entry.get("sources") == digest
    return done and model.is_file() and reference_path_for(model).is_file()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", nargs="*", help="zoo names (default: every full-size model)")
    parser.add_argument("--tiny", action="store_true", help="export the tiny variants instead")
    parser.add_argument(
        "--exporter", choices=EXPORTERS, action="append", help="only this exporter (repeatable)"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "zoo", help="output folder (default: zoo/)"
    )
    parser.add_argument(
        "--force", action="store_true", help="export even when the outputs are up to date"
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per export")
    args = parser.parse_args()

    names = args.models or list(TINY if args.tiny else FULL_SIZE)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")
    exporters = args.exporter or list(EXPORTERS)
    args.out.mkdir(parents=True, exist_ok=True)
    status_file = args.out / "status.json"
    status: dict[str, dict[str, object]] = (
        json.loads(status_file.read_text()) if status_file.is_file() else {}
    )

    digest = sources_digest()
    jobs = [(name, exporter) for name in names for exporter in exporters]
    failures = 0
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, transient=False) as progress:
        task = progress.add_task("exporting", total=len(jobs))
        for name, exporter in jobs:
            target = args.out / f"{name}.{exporter}.onnx"
            key = target.name
            progress.update(task, description=f"{name} ({exporter})")
            if not args.force and up_to_date(target, status.get(key, {}), digest):
                progress.advance(task)
                continue
            start = time.perf_counter()
            command = [
                sys.executable,
                "-m",
                "onnxopt",
                "export",
                name,
                "-o",
                str(target),
                "--exporter",
                exporter,
                "--json",
            ]
            try:
                done = subprocess.run(
                    command, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT
                )
                ok = done.returncode == 0
                lines = [line for line in done.stderr.splitlines() if line.strip()]
                errors = [
                    line.removeprefix("onnxopt: error: ")
                    for line in lines
                    if line.startswith("onnxopt: error:")
                ]
                reason = "" if ok else (errors or lines or [f"exit {done.returncode}"])[-1]
            except subprocess.TimeoutExpired:
                ok, reason = False, f"timed out after {args.timeout:.0f} s"
            seconds = time.perf_counter() - start
            status[key] = {
                "model": name,
                "exporter": exporter,
                "ok": ok,
                "seconds": round(seconds, 1),
                "error": reason,
                "sources": digest,
            }
            status_file.write_text(json.dumps(status, indent=2, sort_keys=True) + "\n")
            if not ok:
                failures += 1
                progress.console.print(
                    f"[red]failed[/red] {name} ({exporter}): {reason}", highlight=False
                )
            progress.advance(task)
    print(
        f"{len(jobs) - failures}/{len(jobs)} exports ok; status in {status_file}", file=sys.stderr
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
