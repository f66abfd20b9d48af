"""Options shared by every pass (one frozen object, so a pipeline is configured in one place)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from onnxopt.ort_versions import Version, installed_providers, installed_version

Target = Literal["onnx", "ort"]

DEFAULT_FOLD_LIMIT_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class PassOptions:
    # Largest tensor constant folding may materialize, in bytes.
    fold_limit_bytes: int = DEFAULT_FOLD_LIMIT_BYTES
    # Let constant folding write results bigger than what it removes (onnxsim's behaviour).
    fold_may_grow: bool = False
    # Which runtime fusions may target: standard ONNX only, or ONNX Runtime's contrib ops too.
    target: Target = "ort"
    # The oldest ONNX Runtime release the output must run on (target ort): forms it lacks are
    # not written (onnxopt/ort_versions.py).
    ort_version: Version = field(default_factory=installed_version)
    # The ONNX Runtime execution providers the output must run on (target ort): "cpu", "cuda".
    ort_providers: tuple[str, ...] = field(default_factory=installed_providers)
    # Dims pinned by the user: input name -> full shape.
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Sizes of symbolic dims (e.g. batch=8, seq=512) for memory analyses and reordering.
    dims: dict[str, int] = field(default_factory=dict)
    # Explain why rewrites did not apply (collects Mismatch reasons; slightly slower).
    explain: bool = False
