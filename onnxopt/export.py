"""Export a PyTorch model (a zoo name or a user's ``package.module:factory``) to ONNX with its eager reference.

``export(spec, output)`` builds the module, runs it eagerly on the example inputs, exports it with the
dynamo exporter (``torch.onnx.export(dynamo=True)``, dynamic axes as ``torch.export.Dim``) or the
TorchScript one (``dynamo=False``, ``dynamic_axes``), and writes ``output`` plus the reference file
``reference_path_for(output)`` (see :mod:`onnxopt.reference`). torch is imported here, lazily.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from onnxopt import __version__
from onnxopt.errors import OnnxoptError, UsageError
from onnxopt.guard import leave_no_trace
from onnxopt.reference import Reference, reference_path_for, save_reference
from onnxopt.user_modules import import_user_module
from onnxopt.zoo import ZOO

logger = logging.getLogger(__name__)

Exporter = Literal["dynamo", "torchscript"]
EXPORTERS: tuple[Exporter, ...] = ("dynamo", "torchscript")
TORCH_PIN = "torch==2.13.0"
INSTALL_HINT = f"pip install 'onnxopt[torch]' (or: pip install '{TORCH_PIN}' 'transformers>=4.45')"
_EXTERNAL_DATA_BYTES = 1_800_000_000  # protobuf's 2 GiB limit, with room for the graph


class MissingDependency(UsageError):
    """torch (or transformers) is not installed."""


class ExportFailed(OnnxoptError):
    """The exporter raised; the message names the exporter and its first error line."""


@dataclass(frozen=True)
class Exportable:
    """A built model ready to export: module, named example inputs and the axes that may vary."""

    name: str
    module: Any
    inputs: dict[str, Any]
    dynamic_axes: dict[str, dict[int, str]]


@dataclass(frozen=True)
class ExportResult:
    model: str
    exporter: Exporter
    output: str
    reference: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    opset: int | None
    export_seconds: float
    file_bytes: int


def require_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise MissingDependency(
            f"export needs PyTorch, which is not installed: {INSTALL_HINT}"
        ) from exc
    return torch


def _import_factory(spec: str) -> Callable[[], Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(
            f"unknown model '{spec}': give a zoo name (`onnxopt export --list`), package.module:factory or file.py:factory"
        )
    try:
        module = import_user_module(module_name)
    except FileNotFoundError as exc:
        raise UsageError(f"model '{spec}': {exc}") from None
    except ModuleNotFoundError as exc:
        if exc.name in ("torch", "transformers") or (exc.name or "").startswith(
            ("torch.", "transformers.")
        ):
            raise MissingDependency(
                f"model '{spec}' needs {exc.name}, which is not installed: {INSTALL_HINT}"
            ) from exc
        raise UsageError(f"model '{spec}': cannot import module '{module_name}' ({exc})") from None
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise UsageError(
            f"model '{spec}': importing '{module_name}' failed: {type(exc).__name__}: {first}"
        ) from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UsageError(f"model '{spec}': module '{module_name}' has no callable '{attr}'")
    return factory


def _positional_names(module: Any, count: int) -> list[str]:
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(names) >= count:
        return names[:count]
    return ["input" if count == 1 else f"input_{i}" for i in range(count)]


def build(spec: str) -> Exportable:
    """Build the model ``spec`` names: a zoo entry or ``package.module:factory``.

    A factory returns ``(module, inputs)`` or ``(module, inputs, dynamic_axes)``; ``inputs`` is a dict
    in ``forward``'s order, a tuple, or one tensor. Without ``dynamic_axes``, axis 0 of every input
    is the batch axis.
    """
    torch = require_torch()
    entry = ZOO.get(spec)
    factory = _import_factory(entry.factory if entry else spec)
    try:
        built = factory()
    except ImportError as exc:
        raise MissingDependency(
            f"model '{spec}' needs a missing package ({exc}): {INSTALL_HINT}"
        ) from exc
    if not isinstance(built, tuple) or len(built) not in (2, 3):
        raise UsageError(
            f"model '{spec}': the factory must return (module, example_inputs[, dynamic_axes])"
        )
    module, raw_inputs = built[0], built[1]
    if not isinstance(module, torch.nn.Module):
        raise UsageError(
            f"model '{spec}': the factory returned {type(module).__name__}, not a torch.nn.Module"
        )
    if isinstance(raw_inputs, torch.Tensor):
        raw_inputs = (raw_inputs,)
    if isinstance(raw_inputs, Mapping):
        inputs = dict(raw_inputs)
    elif isinstance(raw_inputs, (tuple, list)):
        inputs = dict(zip(_positional_names(module, len(raw_inputs)), raw_inputs, strict=True))
    else:
        raise UsageError(
            f"model '{spec}': example inputs must be a tensor, a tuple or a dict of tensors"
        )
    if not all(isinstance(v, torch.Tensor) for v in inputs.values()):
        raise UsageError(f"model '{spec}': every example input must be a torch.Tensor")
    if len(built) == 3 and built[2] is not None:
        dynamic = {
            name: {int(axis): str(dim) for axis, dim in axes.items()}
            for name, axes in built[2].items()
        }
    else:
        dynamic = {name: {0: "batch"} for name, value in inputs.items() if value.dim() > 0}
    unknown = sorted(set(dynamic) - set(inputs))
    if unknown:
        raise UsageError(f"model '{spec}': dynamic axes name unknown inputs: {', '.join(unknown)}")
    return Exportable(spec, module.eval(), inputs, dynamic)


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    import torch

    if isinstance(value, torch.Tensor):
        out[prefix] = value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if item is not None:
                _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            _flatten(item, f"{prefix}.{i}" if prefix else f"output_{i}", out)
    elif value is not None:
        raise UsageError(
            f"the model returned a {type(value).__name__}; outputs must be tensors (or tuples/dicts of them)"
        )


def eager_outputs(model: Exportable) -> dict[str, np.ndarray]:
    """Run the module on its example inputs; outputs named as the ONNX graph outputs will be."""
    torch = require_torch()
    with torch.no_grad():
        result = model.module(*model.inputs.values())
    flat: dict[str, Any] = {}
    _flatten(result, "", flat)
    if not flat:
        flat = {}
    names = list(getattr(model.module, "output_names", ()) or ())
    if len(names) != len(flat):
        names = ["output"] if len(flat) == 1 and "" in flat else list(flat)
    return {
        name: tensor.detach().cpu().numpy()
        for name, tensor in zip(names, flat.values(), strict=True)
    }


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Exporters print progress on stdout; keep stdout for results (``--json``)."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def _export_dynamo(
    model: Exportable,
    path: Path,
    output_names: list[str],
    opset: int | None,
    dynamic: bool,
    big: bool,
) -> None:
    import torch

    dynamic_shapes = None
    if dynamic:
        dims: dict[str, Any] = {}
        shapes = []
        for name, value in model.inputs.items():
            axes = model.dynamic_axes.get(name, {})
            shapes.append(
                {
                    axis: dims.setdefault(dim, torch.export.Dim(dim))
                    for axis, dim in axes.items()
                    if axis < value.dim()
                }
                or None
            )
        dynamic_shapes = (tuple(shapes),) if _takes_varargs(model.module) else tuple(shapes)
    program = torch.onnx.export(
        model.module,
        tuple(model.inputs.values()),
        dynamo=True,
        input_names=list(model.inputs),
        output_names=output_names,
        opset_version=opset,
        dynamic_shapes=dynamic_shapes,
        verbose=False,
    )
    assert program is not None
    program.save(str(path), external_data=big)


def _takes_varargs(module: Any) -> bool:
    """``forward(*args)``: torch.export wants the dynamic shapes of all args nested in one tuple."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0].kind == inspect.Parameter.VAR_POSITIONAL


def _error_summary(exc: BaseException) -> str:
    """The line of an exporter error that says what went wrong (torch.export wraps it in advice)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "## Exception summary" in lines:
        after = lines[lines.index("## Exception summary") + 1 :]
        if after:
            return after[0]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _export_torchscript(
    model: Exportable,
    path: Path,
    output_names: list[str],
    opset: int | None,
    dynamic: bool,
    big: bool,
) -> None:
    import torch

    torch.onnx.export(
        model.module,
        tuple(model.inputs.values()),
        str(path),
        dynamo=False,
        input_names=list(model.inputs),
        output_names=output_names,
        opset_version=opset,
        dynamic_axes=dict(model.dynamic_axes) if dynamic else None,
    )


def export(
    spec: str,
    output: str | os.PathLike[str],
    *,
    exporter: Exporter = "dynamo",
    opset: int | None = None,
    dynamic: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ExportResult:
    """Export ``spec`` to ``output`` and write its eager reference next to it (``x.onnx`` -> ``x.ref.npz``)."""
    if exporter not in EXPORTERS:
        raise UsageError(f"--exporter {exporter}: choose one of {', '.join(EXPORTERS)}")
    torch = require_torch()
    target = Path(output)
    if target.suffix != ".onnx":
        raise UsageError(f"-o {target}: the output must end in .onnx")
    if not target.parent.is_dir():
        raise UsageError(f"-o {target}: folder {target.parent} does not exist")
    step = progress or (lambda _: None)
    step(f"building {spec}")
    model = build(spec)
    step("running eager PyTorch")
    outputs = eager_outputs(model)
    step(f"exporting with {exporter}")
    start = time.perf_counter()
    big = (
        sum(p.numel() * p.element_size() for p in model.module.parameters()) > _EXTERNAL_DATA_BYTES
    )
    # Exporters write weights past protobuf's limit as files of their own names beside the model
    # (TorchScript: one per tensor), so a big export goes into a private folder first and is then
    # saved as the usual OUTPUT + OUTPUT.data pair, atomically; a small one to a temp name.
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.stem}.export-", dir=target.parent))
    leave_no_trace(scratch)
    partial = scratch / target.name
    run = _export_dynamo if exporter == "dynamo" else _export_torchscript
    try:
        try:
            with _stdout_to_stderr(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                run(model, partial, list(outputs), opset, dynamic, big)
            for warning in caught:
                logger.debug("%s export: %s", exporter, warning.message)
        except Exception as exc:
            raise ExportFailed(
                f"{exporter} export of '{spec}' failed: {_error_summary(exc)}"
            ) from exc
        if big:
            from onnxopt.io import load_model, save_model

            save_model(load_model(partial).model, target, external_data=True)
        else:
            os.replace(partial, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.perf_counter() - start

    import onnx

    proto = onnx.load(str(target), load_external_data=False)
    opsets = {o.domain: o.version for o in proto.opset_import}
    actual_opset = opsets.get("", opsets.get("ai.onnx"))
    graph_inputs = [i.name for i in proto.graph.input]
    graph_outputs = [o.name for o in proto.graph.output]
    if graph_outputs != list(outputs):
        logger.warning(
            "graph outputs %s differ from eager outputs %s; matching by position",
            graph_outputs,
            list(outputs),
        )
        outputs = dict(zip(graph_outputs, outputs.values(), strict=False))
    metadata = {
        "model": spec,
        "exporter": exporter,
        "exporter_version": _exporter_version(exporter, torch.__version__),
        "torch_version": torch.__version__,
        "onnxopt_version": __version__,
        "opset": str(actual_opset),
        "dynamic": str(dynamic).lower(),
    }
    transformers = sys.modules.get("transformers")
    if transformers is not None:
        metadata["transformers_version"] = str(getattr(transformers, "__version__", "?"))
    inputs = {name: value.detach().cpu().numpy() for name, value in model.inputs.items()}
    reference = save_reference(reference_path_for(target), Reference(inputs, outputs, metadata))
    return ExportResult(
        model=spec,
        exporter=exporter,
        output=str(target),
        reference=str(reference),
        inputs=tuple(graph_inputs),
        outputs=tuple(graph_outputs),
        opset=actual_opset,
        export_seconds=seconds,
        file_bytes=target.stat().st_size,
    )


def _exporter_version(exporter: Exporter, torch_version: str) -> str:
    if exporter == "torchscript":
        return f"torch.onnx (TorchScript) {torch_version}"
    try:
        from importlib.metadata import version

        return f"torch.onnx (dynamo) {torch_version}, onnxscript {version('onnxscript')}"
    except Exception:
        return f"torch.onnx (dynamo) {torch_version}"
