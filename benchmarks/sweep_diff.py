"""Compare two arch_sweep.py tables (e.g. main's and a branch's): rows whose result changed.

    python benchmarks/sweep_diff.py main.md branch.md

Prints each row whose status, node counts, fused ops, validation, eager difference or fixed point
differs (the seconds column is ignored), rows only one side has, and the rows of the second table
that are not ok / validated / within the eager tolerance / a fixed point.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def rows(path: Path) -> dict[tuple[str, str], list[str]]:
    """(family, exporter) -> the row's cells, seconds dropped."""
    table = {}
    for line in path.read_text().splitlines():
        if line.startswith("| ") and not line.startswith("| family"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            table[(cells[0], cells[1])] = cells[:8]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    before, after = rows(args.before), rows(args.after)
    print(f"{len(before)} rows before, {len(after)} after")
    for key, cells in after.items():
        if key not in before:
            print("new    ", " | ".join(cells))
        elif before[key] != cells:
            print("before ", " | ".join(before[key]))
            print("after  ", " | ".join(cells))
    for key in before:
        if key not in after:
            print("gone   ", " | ".join(before[key]))
    failing = [
        " / ".join(key)
        for key, c in after.items()
        if c[2] != "ok" or c[5] != "yes" or "FAIL" in c[6] or "ERROR" in c[6] or c[7] != "yes"
    ]
    print("not ok, validated, within tolerance and a fixed point:", ", ".join(failing) or "none")


if __name__ == "__main__":
    main()
