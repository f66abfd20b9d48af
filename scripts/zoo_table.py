"""The README's zoo table: for every export in zoo/, nodes before/after `onnxopt optimize` and error vs eager.

Reads zoo/status.json (written by scripts/export_zoo.py), runs `onnxopt optimize MODEL --json` on each
successful export (its .ref.npz is picked up, so the report compares with eager PyTorch) in its own
process (reports are cached in zoo/NAME.EXPORTER.report.json until the model or onnxopt changes), writes
zoo/table.json and prints a Markdown table on stdout.

    .venv/bin/python scripts/zoo_table.py            # after `make models`
    .venv/bin/python scripts/zoo_table.py --out zoo-tiny
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from onnxopt.zoo import ZOO  # noqa: E402

EXPORTERS = ("dynamo", "torchscript")


def onnxopt_digest() -> str:
    """Changes whenever onnxopt's code does (a new pass must not be hidden by a cached report)."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "onnxopt").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def optimize_report(model: Path, timeout: float, digest: str) -> dict[str, Any]:
    """The JSON report of `onnxopt optimize MODEL`, cached in MODEL.report.json (same model, same onnxopt)."""
    cache = model.with_suffix(".report.json")
    if cache.is_file() and cache.stat().st_mtime > model.stat().st_mtime:
        cached: dict[str, Any] = json.loads(cache.read_text())
        if cached.get("onnxopt_digest") == digest:
            return cached
    command = [sys.executable, "-m", "onnxopt", "optimize", str(model), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit {done.returncode}"}
    report: dict[str, Any] = json.loads(done.stdout)
    report["onnxopt_digest"] = digest
    cache.write_text(json.dumps(report) + "\n")
    return report


def _max(comparisons: list[dict[str, Any]], key: str) -> float | None:
    values = [c[key] for c in comparisons]
    return max(values) if values else None


def summarize(
    name: str, exporter: str, status: dict[str, Any], report: dict[str, Any] | None
) -> dict[str, Any]:
    row: dict[str, Any] = {"model": name, "exporter": exporter, "exported": bool(status.get("ok"))}
    row["export_seconds"] = status.get("seconds")
    if not status.get("ok"):
        row["error"] = status.get("error", "not exported")
        return row
    if report is None or "error" in report:
        row["error"] = (report or {}).get("error", "not optimized")
        return row
    reference = report.get("reference") or {}
    validation = report.get("validation") or {}
    row.update(
        nodes_before=report["before"]["nodes"],
        nodes_after=report["after"]["nodes"],
        export_max_abs=_max(reference.get("export", []), "max_abs"),
        optimized_max_abs=_max(reference.get("optimized", []), "max_abs"),
        optimization_max_abs=_max(validation.get("outputs", []), "max_abs"),
        export_within_tolerance=reference.get("export_passed"),
        validated=validation.get("passed"),
    )
    return row


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return "0" if value == 0 else f"{value:.1e}"


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | exporter | export | nodes before | nodes after | max abs error vs eager: exported | optimized | optimized vs exported | validated |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "error" in r:
            what = "fails" if not r["exported"] else "ok"
            lines.append(f"| {r['model']} | {r['exporter']} | {what}: {r['error']} | | | | | | |")
            continue
        tol = "" if r["export_within_tolerance"] else " (over tol)"
        lines.append(
            f"| {r['model']} | {r['exporter']} | ok | {r['nodes_before']} | {r['nodes_after']} "
            f"| {_num(r['export_max_abs'])}{tol} | {_num(r['optimized_max_abs'])} | {_num(r['optimization_max_abs'])} "
            f"| {'yes' if r['validated'] else 'NO'} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "zoo",
        help="the folder export_zoo.py wrote (default: zoo/)",
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per optimize")
    args = parser.parse_args()
    status_file = args.out / "status.json"
    if not status_file.is_file():
        parser.error(f"{status_file} not found: run scripts/export_zoo.py (make models) first")
    status: dict[str, dict[str, Any]] = json.loads(status_file.read_text())
    rows = []
    digest = onnxopt_digest()
    order = list(ZOO)
    for key, entry in sorted(
        status.items(),
        key=lambda kv: (order.index(kv[1]["model"]), EXPORTERS.index(kv[1]["exporter"])),
    ):
        model = args.out / key
        report = (
            optimize_report(model, args.timeout, digest)
            if entry.get("ok") and model.is_file()
            else None
        )
        row = summarize(entry["model"], entry["exporter"], entry, report)
        print(f"{key}: {row.get('error') or 'ok'}", file=sys.stderr)
        rows.append(row)
    (args.out / "table.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(markdown(rows))
    return 0 if all("error" not in r and r["validated"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
