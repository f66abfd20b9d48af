"""Project configuration: ``[tool.onnxopt]`` in pyproject.toml or an ``onnxopt.toml``, as CLI defaults.

Keys are the long option names without dashes in front (``level``, ``disable``, ``max-abs-error``,
...); a list becomes the comma-separated form the option takes. Options given on the command line
win over the file. Unknown keys are an error, so a typo never silently disables a threshold.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from onnxopt.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIG_NAMES = ("onnxopt.toml", "pyproject.toml")


def find_config(start: Path | None = None) -> Path | None:
    """The nearest onnxopt.toml, or pyproject.toml with a [tool.onnxopt] table, from ``start`` upwards."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        for name in CONFIG_NAMES:
            candidate = folder / name
            if candidate.is_file() and (name == "onnxopt.toml" or _has_tool_table(candidate)):
                return candidate
        if (folder / ".git").exists():
            break
    return None


def _has_tool_table(path: Path) -> bool:
    try:
        return "onnxopt" in _read(path).get("tool", {})
    except UsageError:
        return False


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: cannot read configuration ({exc})") from None


def load_config(path: Path) -> dict[str, Any]:
    data = _read(path)
    # Any settings file but a pyproject.toml holds the settings at its top level (a --config
    # my.toml once read [tool.onnxopt] only, so every setting in it was silently ignored).
    table = data.get("tool", {}).get("onnxopt", {}) if path.name == "pyproject.toml" else data
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [tool.onnxopt] must be a table")
    return table


def default_map(
    config: Mapping[str, Any], commands: Mapping[str, Iterable[str]], source: Path
) -> dict[str, dict[str, Any]]:
    """click ``default_map`` for each command that has the option a config key names."""
    out: dict[str, dict[str, Any]] = {}
    known: set[str] = set()
    for command, params in commands.items():
        params = set(params)
        known |= params
        for key, value in config.items():
            param = key.replace("-", "_")
            if param in params:
                out.setdefault(command, {})[param] = (
                    ",".join(map(str, value)) if isinstance(value, list) else value
                )
    unknown = [k for k in config if k.replace("-", "_") not in known]
    if unknown:
        raise UsageError(f"{source}: unknown onnxopt setting(s): {', '.join(unknown)}")
    return out
