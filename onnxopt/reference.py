"""Eager PyTorch reference outputs stored next to an exported model (``x.onnx`` -> ``x.ref.npz``).

The file is a plain ``.npz`` (no pickles; ``np.load(allow_pickle=False)`` reads it): arrays named
``input/<name>`` (the example inputs), ``output/<name>`` (what the eager module returned for them,
named like the ONNX graph outputs) and ``meta/<key>`` (0-d string arrays: torch version, exporter,
model name, ...).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxopt.errors import UsageError

REFERENCE_SUFFIX = ".ref.npz"
_INPUT, _OUTPUT, _META = "input/", "output/", "meta/"


@dataclass(frozen=True)
class Reference:
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    metadata: dict[str, str]


def reference_path_for(model_path: str | os.PathLike[str]) -> Path:
    """Where the reference of ``model_path`` lives: ``dir/x.onnx`` -> ``dir/x.ref.npz``."""
    path = Path(model_path)
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    return path.with_name(stem + REFERENCE_SUFFIX)


def save_reference(path: str | os.PathLike[str], reference: Reference) -> Path:
    """Write ``reference`` to ``path`` (replaced atomically)."""
    target = Path(path)
    arrays: dict[str, np.ndarray] = {}
    for prefix, table in ((_INPUT, reference.inputs), (_OUTPUT, reference.outputs)):
        for name, array in table.items():
            arrays[prefix + name] = np.asarray(array)
    for key, text in reference.metadata.items():
        arrays[_META + key] = np.array(str(text))
    partial = target.with_name(target.name + ".partial")
    with open(partial, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    os.replace(partial, target)
    return target


# A compressed .npz of zeros is a zip bomb: a few MB on disk, any size in memory. Arrays are
# sized from their headers before anything is read.
MAX_NPZ_BYTES = 1024**3


def check_npz_size(path: Path, option: str, limit: int = MAX_NPZ_BYTES) -> None:
    """Refuse an .npz whose arrays would take more than ``limit`` bytes once loaded."""
    import zipfile

    total = 0
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                if not member.filename.endswith(".npy"):
                    continue
                with archive.open(member) as f:
                    version = np.lib.format.read_magic(f)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                    else:
                        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
                total += int(np.prod(shape, dtype=object)) * dtype.itemsize
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise UsageError(f"{option} {path}: not a readable .npz file ({exc})") from None
    if total > limit:
        raise UsageError(
            f"{option} {path}: its arrays take {total} bytes once loaded, over the {limit}-byte limit"
        )


def load_reference(path: str | os.PathLike[str]) -> Reference:
    """Read a reference file; a missing or malformed file is a :class:`UsageError`."""
    source = Path(path)
    if not source.is_file():
        raise UsageError(f"--reference {source}: no such file")
    inputs: dict[str, np.ndarray] = {}
    outputs: dict[str, np.ndarray] = {}
    metadata: dict[str, str] = {}
    check_npz_size(source, "--reference")
    try:
        with np.load(source, allow_pickle=False) as data:
            for key in data.files:
                if key.startswith(_INPUT):
                    inputs[key[len(_INPUT) :]] = data[key]
                elif key.startswith(_OUTPUT):
                    outputs[key[len(_OUTPUT) :]] = data[key]
                elif key.startswith(_META):
                    metadata[key[len(_META) :]] = str(data[key])
    except (ValueError, OSError, EOFError) as exc:
        raise UsageError(f"--reference {source}: not a readable .npz file ({exc})") from None
    if not inputs or not outputs:
        raise UsageError(
            f"--reference {source}: expected arrays named input/<name> and output/<name>"
        )
    return Reference(inputs, outputs, metadata)


def select_inputs(
    reference: Reference, input_names: Mapping[str, object] | list[str]
) -> dict[str, np.ndarray]:
    """The reference inputs the model takes (an exporter may drop inputs the graph does not use)."""
    return {name: array for name, array in reference.inputs.items() if name in input_names}
