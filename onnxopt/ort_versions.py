"""Which ONNX Runtime releases run the contrib-op forms that ``--target ort`` writes.

The com.microsoft ops gained inputs and attributes over ORT's releases, and an older release
refuses (or worse, crashes on, or silently miscomputes) a form it predates. Measured with
``scripts/ort_versions_probe.py`` (original and optimized model run under each release, outputs
compared):

- GroupQueryAttention: ``attention_bias`` (input 10) from 1.22 (1.20 and 1.21: "input size 11 not
  in range [min=7, max=9]"); ``head_sink`` (11) from 1.23; without its ``present_key`` /
  ``present_value`` outputs from 1.29 ("output size 1 not in range [min=3, max=4]" before); the
  ``causal`` attribute from 1.30 ("Unrecognized attribute: causal" before), where it defaults to
  1: every release before 1.30 is causal, so causal=1 is written by leaving the attribute out.
- MultiHeadAttention / Attention with an ``attention_bias`` broadcast over batch or heads: wrong
  results up to 1.21.0, right from 1.21.1; every form onnxopt writes runs from 1.22.
- Attention without its bias input: a crash (SIGSEGV) before 1.32; onnxopt always gives one.

A model is optimized for the oldest release it must run on (``--ort-version``, by default the
installed onnxruntime); the forms that release lacks are not written.

And for the execution providers it must run on (``--ort-providers cpu,cuda``, by default cpu, and
cuda where the installed onnxruntime is the CUDA build). Read from ORT's CUDA kernel registrations
(contrib_ops/cuda): GroupQueryAttention has float16 / bfloat16 kernels only (a float32 one is left
to the CPU provider, with copies both ways every layer); FusedConv's CUDA kernel maps the
``activation`` attribute to cuDNN's and takes Relu alone (recent releases add Tanh): any other, or
none, fails when the session is made ("unsupported conv activation mode"). Every other contrib op
onnxopt writes has a float32 CUDA kernel.
"""

from __future__ import annotations

import functools
import re
from importlib import metadata

import onnx_ir as ir

from onnxopt.errors import UsageError

Version = tuple[int, int]

# The oldest release ``--target ort`` writes for: every form below it was checked on.
OLDEST: Version = (1, 22)
# GroupQueryAttention's head_sink input (attention sinks).
GQA_HEAD_SINK: Version = (1, 23)
# GroupQueryAttention without its present_key / present_value outputs (required before).
GQA_WITHOUT_PRESENT: Version = (1, 29)
# GroupQueryAttention's causal attribute (causal=0: no release before it has a non-causal kernel).
GQA_CAUSAL_ATTRIBUTE: Version = (1, 30)
# Attention (com.microsoft) without its bias input: older releases dereference it unchecked.
ATTENTION_WITHOUT_BIAS: Version = (1, 32)

# The execution providers --ort-providers knows.
PROVIDERS = ("cpu", "cuda")
# FusedConv activations ORT's CUDA kernel takes in every supported release.
CUDA_FUSED_CONV_ACTIVATIONS = frozenset({"Relu"})

_MS_DOMAIN = "com.microsoft"
_NCHWC_DOMAIN = "com.microsoft.nchwc"
_GQA_HEAD_SINK_INPUT = 11
_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml")


def format_version(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


def _major_minor(text: str) -> Version | None:
    found = re.match(r"(\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found is not None else None


def parse_version(text: str, *, supported: bool = True) -> Version:
    """``"1.24"`` or ``"1.24.3"`` -> (1, 24); a UsageError for anything else or, where the output
    is for target ort (``supported``), for a release older than OLDEST."""
    found = re.fullmatch(r"\s*(\d+)\.(\d+)(?:\.\d+)?\s*", text)
    if found is None:
        raise UsageError(f"--ort-version {text!r}: expected a release such as 1.24 or 1.24.3")
    version = (int(found.group(1)), int(found.group(2)))
    if supported and version < OLDEST:
        raise UsageError(
            f"--ort-version {text}: --target ort writes for ONNX Runtime {format_version(OLDEST)} "
            "or newer (older releases miscompute or refuse its contrib ops); --target onnx keeps "
            "to standard ops"
        )
    return version


@functools.cache
def installed_version() -> Version:
    """The installed onnxruntime's release (its package metadata: importing ORT costs 0.2 s)."""
    for name in _DISTRIBUTIONS:
        try:
            version = _major_minor(metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
        if version is not None:
            return version
    import onnxruntime

    version = _major_minor(onnxruntime.__version__)
    assert version is not None
    return version


def requested_version(text: str | None, target: str = "ort") -> Version:
    """``--ort-version``: the release named (checked), else the installed one, never older than
    what target ort supports. Target onnx writes no contrib op: any release is fine there."""
    if text is not None:
        return max(parse_version(text, supported=target == "ort"), OLDEST)
    return max(installed_version(), OLDEST)


@functools.cache
def installed_providers() -> tuple[str, ...]:
    """cpu, and cuda where the installed onnxruntime is the CUDA build (package metadata)."""
    try:
        metadata.version("onnxruntime-gpu")
    except metadata.PackageNotFoundError:
        return ("cpu",)
    return PROVIDERS


def requested_providers(text: str | None) -> tuple[str, ...]:
    """``--ort-providers``: the providers named (``cpu``, ``cuda`` or ``cpu,cuda``), else the
    installed onnxruntime's."""
    if text is None:
        return installed_providers()
    names = {part.strip().lower() for part in text.split(",") if part.strip()}
    if not names or names - set(PROVIDERS):
        raise UsageError(f"--ort-providers {text!r}: expected cpu, cuda or cpu,cuda")
    return tuple(name for name in PROVIDERS if name in names)


def provider_problem(node: ir.Node, providers: tuple[str, ...]) -> str | None:
    """Why ``node`` as written would not run on CUDA (a session that fails to load, or a node
    left to the CPU provider), where ``providers`` has it; else None."""
    if "cuda" not in providers:
        return None
    if node.domain == _NCHWC_DOMAIN:  # a file ORT's CPU optimizer saved at ENABLE_ALL
        return "ORT's CPU-only NCHWc ops (com.microsoft.nchwc), which CUDA lacks"
    if node.domain != _MS_DOMAIN:
        return None
    if node.op_type == "FusedGemm":
        return "FusedGemm, which CUDA lacks (ORT runs it on the CPU)"
    if node.op_type == "GroupQueryAttention":
        query = node.inputs[0] if node.inputs else None
        if query is not None and query.dtype == ir.DataType.FLOAT:
            return "float32 GroupQueryAttention, which CUDA lacks (ORT runs it on the CPU)"
    if node.op_type == "FusedConv":
        activation = node.attributes.get_string("activation", "")
        if activation not in CUDA_FUSED_CONV_ACTIVATIONS:
            return (
                f"FusedConv with activation {activation or '(none)'}, which CUDA's FusedConv "
                "refuses when the session is made"
            )
    return None


def model_provider_problem(model: ir.Model, providers: tuple[str, ...]) -> str | None:
    """The first node's provider_problem (subgraphs included), or None."""
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        found = provider_problem(node, providers)
        if found is not None:
            return found
    return None


def node_requirement(node: ir.Node) -> tuple[Version, str] | None:
    """The oldest release that runs ``node`` as written, and why, where that is newer than OLDEST."""
    if node.domain != _MS_DOMAIN:
        return None
    if node.op_type == "GroupQueryAttention":
        return _gqa_requirement(node)
    if node.op_type == "Attention" and (len(node.inputs) < 3 or node.inputs[2] is None):
        return ATTENTION_WITHOUT_BIAS, "Attention without its bias input"
    return None


def _gqa_requirement(node: ir.Node) -> tuple[Version, str] | None:
    if "causal" in node.attributes:
        return GQA_CAUSAL_ATTRIBUTE, "GroupQueryAttention with the causal attribute"
    if len(node.outputs) < 3:
        return GQA_WITHOUT_PRESENT, "GroupQueryAttention without present_key / present_value"
    if has_head_sink(node):
        return GQA_HEAD_SINK, "GroupQueryAttention with head_sink"
    return None


def has_head_sink(node: ir.Node) -> bool:
    """Whether a GroupQueryAttention has its head_sink input (attention sinks)."""
    return len(node.inputs) > _GQA_HEAD_SINK_INPUT and node.inputs[_GQA_HEAD_SINK_INPUT] is not None


def model_requirement(model: ir.Model) -> tuple[Version, str] | None:
    """The newest of the nodes' requirements (subgraphs included), with its reason; None if none
    is newer than OLDEST."""
    newest: tuple[Version, str] | None = None
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        found = node_requirement(node)
        if found is not None and (newest is None or found[0] > newest[0]):
            newest = found
    return newest
