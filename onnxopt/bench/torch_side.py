"""Eager PyTorch and torch.compile as benchmark variants. torch is imported only here, lazily.

A *factory* is a callable with no arguments that returns ``(module, example_inputs)``: the module in
eval mode and its example inputs, either a tuple of tensors (matched to the ONNX graph inputs by
position) or a dict of tensors (matched by name, passed as keyword arguments). An object with
``module`` and ``inputs`` (or ``example_inputs``) attributes is accepted too.

``--torch`` takes ``package.module:factory`` (or ``path/to/file.py:factory``), resolved here with
importlib, or a zoo name, resolved by ``onnxopt.zoo`` when that package exists: it is asked through
``get_factory(name)`` or, failing that, a ``FACTORIES`` mapping.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxopt.bench.timing import Runner
from onnxopt.errors import UsageError
from onnxopt.user_modules import import_user_module

INSTALL_HINT = "install the torch extra: pip install 'onnxopt[torch]' (torch==2.13.0)"


@dataclass(frozen=True)
class TorchModel:
    """A module and its example inputs, normalised: ``inputs`` by position or ``named`` by keyword."""

    module: Any
    inputs: tuple[Any, ...]
    named: dict[str, Any] | None

    def example_shapes(self, input_names: Sequence[str]) -> dict[str, tuple[int, ...]]:
        """Shapes of the example inputs, keyed by the ONNX input they feed."""
        if self.named is not None:
            return {
                k: tuple(v.shape)
                for k, v in self.named.items()
                if k in input_names and hasattr(v, "shape")
            }
        return {
            n: tuple(t.shape)
            for n, t in zip(input_names, self.inputs, strict=False)
            if hasattr(t, "shape")
        }


def import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise UsageError(f"--torch needs PyTorch; {INSTALL_HINT}") from None
    return torch


def _load_attribute(spec: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    try:
        module = import_user_module(module_name)
    except FileNotFoundError as exc:
        raise UsageError(f"--torch {spec}: {exc}") from None
    except ImportError as exc:
        raise UsageError(f"--torch {spec}: cannot import {module_name} ({exc})") from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise UsageError(f"--torch {spec}: {module_name} has no attribute {attribute}")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(f"--torch {spec}: {attribute} is not callable")
    return target


def _zoo_factory(name: str) -> Callable[[], Any]:
    """The hook into the model zoo: ``onnxopt.zoo.get_factory(name)`` or ``onnxopt.zoo.FACTORIES[name]``."""
    try:
        zoo = importlib.import_module("onnxopt.zoo")
    except ModuleNotFoundError as exc:
        if exc.name not in ("onnxopt.zoo", "torch", "transformers"):
            raise
        raise UsageError(
            f"--torch {name}: no model zoo is available here ({exc.name} missing); "
            "give package.module:factory for your own module"
        ) from None
    getter = getattr(zoo, "get_factory", None)
    if callable(getter):
        try:
            factory = getter(name)
        except (KeyError, LookupError, ValueError) as exc:
            raise UsageError(f"--torch {name}: not a zoo model ({exc})") from None
        return factory
    factories = getattr(zoo, "FACTORIES", None)
    if isinstance(factories, Mapping):
        if name not in factories:
            raise UsageError(
                f"--torch {name}: not a zoo model (known: {', '.join(sorted(factories))})"
            )
        return factories[name]
    raise UsageError(f"--torch {name}: onnxopt.zoo offers neither get_factory() nor FACTORIES")


def resolve_factory(spec: str) -> Callable[[], Any]:
    if ":" in spec:
        return _load_attribute(spec)
    return _zoo_factory(spec)


def build(spec: str) -> TorchModel:
    """Resolve ``spec``, call the factory and normalise what it returns."""
    import_torch()
    return normalize(spec, resolve_factory(spec)())


def normalize(spec: str, produced: Any) -> TorchModel:
    """A factory's result as a TorchModel (module in eval mode)."""
    torch = import_torch()
    if isinstance(produced, tuple) and len(produced) == 2:
        module, inputs = produced
    elif hasattr(produced, "module"):
        module = produced.module
        inputs = getattr(produced, "inputs", None)
        if inputs is None:
            inputs = getattr(produced, "example_inputs", ())
    else:
        raise UsageError(f"--torch {spec}: the factory must return (module, example_inputs)")
    if not isinstance(module, torch.nn.Module) and not callable(module):
        raise UsageError(f"--torch {spec}: the factory returned no torch module")
    if hasattr(module, "eval"):
        module.eval()
    if isinstance(inputs, torch.Tensor):
        return TorchModel(module, (inputs,), None)
    if isinstance(inputs, Mapping):
        return TorchModel(module, (), dict(inputs))
    return TorchModel(module, tuple(inputs), None)


def flatten_outputs(value: Any) -> list[np.ndarray]:
    """Tensors of a module's result in order: a tensor, nested tuples/lists, dicts and ModelOutputs."""
    torch = import_torch()
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [value.detach().cpu().numpy()]
    if hasattr(value, "to_tuple"):
        value = value.to_tuple()
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return [array for item in value for array in flatten_outputs(item)]
    return [np.asarray(value)]


def create_runner(
    model: TorchModel,
    feeds: Mapping[str, np.ndarray],
    input_names: Sequence[str],
    *,
    compiled: bool,
    threads: int,
    device: str = "cpu",
) -> Runner:
    """A runner calling the module on ``feeds`` (the ONNX benchmark inputs, as tensors on ``device``)."""
    torch = import_torch()
    if threads > 0:
        torch.set_num_threads(threads)
    start = time.perf_counter()
    module = model.module.to(device) if hasattr(model.module, "to") else model.module
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    if model.named is not None:
        kwargs = {
            k: torch.from_numpy(np.ascontiguousarray(feeds[k])).to(device)
            for k in model.named
            if k in feeds
        }
    else:
        args = tuple(
            torch.from_numpy(np.ascontiguousarray(feeds[n])).to(device)
            for n in input_names
            if n in feeds
        )
    callable_module = torch.compile(module) if compiled else module
    create_seconds = time.perf_counter() - start
    synchronize = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def run() -> object:
        with torch.inference_mode():
            result = callable_module(*args, **kwargs)
        synchronize()
        return result

    def outputs() -> list[np.ndarray]:
        return flatten_outputs(run())

    return Runner(
        "torch-compile" if compiled else "torch-eager", device, create_seconds, run, outputs
    )
