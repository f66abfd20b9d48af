"""Exceptions raised by the library; the CLI maps each family to an exit code (see ``cli.exit_code_for``)."""

from __future__ import annotations


class OnnxoptError(Exception):
    """Base class of every error onnxopt raises on purpose."""


class UsageError(OnnxoptError):
    """The caller asked for something that cannot be done (bad option, unknown pass, ...)."""


class ModelLoadError(OnnxoptError):
    """The model file is missing, malformed, hostile or unsupported."""


class UnsafeModelError(ModelLoadError):
    """The model refers to something outside its folder (external data escaping, devices, ...)."""


class ModelSaveError(OnnxoptError):
    """The optimized model could not be written."""


class CheckFailed(OnnxoptError):
    """A numerical check or a threshold failed: the result exists but must not be trusted."""


class ValidationError(CheckFailed):
    """Optimized and original models disagree beyond tolerance on ONNX Runtime."""


def describe(exc: BaseException) -> str:
    """One line saying what went wrong: the library's own message, or the kind of internal error."""
    if isinstance(exc, OnnxoptError):
        message = str(exc)
    elif isinstance(exc, MemoryError):
        message = "out of memory"
    elif isinstance(exc, RecursionError):
        message = "the model is nested too deeply to process"
    else:
        first = str(exc).splitlines()[0] if str(exc) else ""
        message = f"internal error: {type(exc).__name__}: {first}"
    # One line, always: a multi-line message (e.g. from a runtime) would break "one error line".
    return " ".join(message.split())
