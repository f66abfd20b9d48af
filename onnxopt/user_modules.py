"""Importing the user's own factory modules (``export MODULE:factory``, ``bench --torch MODULE:factory``).

``package.module`` is imported with the current directory first on ``sys.path``, as ``python -m``
would, so a factory next to where the command runs is found without installing it; a name ending
in ``.py`` is loaded from that file. Import errors propagate to the caller, which words them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType


def import_user_module(name: str) -> ModuleType:
    """The module ``name`` (dotted, or a path to a ``.py`` file). Raises FileNotFoundError for a
    missing file and ImportError (ModuleNotFoundError) for a missing module."""
    if name.endswith(".py"):
        path = Path(name)
        if not path.is_file():
            raise FileNotFoundError(f"no such file {path}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)
