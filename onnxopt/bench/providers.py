"""ONNX Runtime sessions for benchmarking, on the CPU or on CUDA (IO binding, inputs resident on the device).

Sessions run with the requested graph optimization level, a fixed number of intra-op threads and
thread spinning off: with several sessions timed in turn in one process, a session whose pool keeps
spinning after its run would steal the cores of the next one and bias the comparison.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxopt.bench.timing import Runner

ORT_LEVELS = ("disable", "basic", "extended", "all")
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def ort_level(name: str) -> Any:
    import onnxruntime as ort

    return {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[name]


@functools.cache
def provider_unavailable(provider: str) -> str | None:
    """Why ``provider`` ('cpu' or 'cuda') cannot run here, or None when it can."""
    import onnxruntime as ort

    name = PROVIDERS[provider]
    available = ort.get_available_providers()
    if name not in available:
        if provider == "cuda":
            return (
                f"onnxruntime {ort.__version__} has no CUDAExecutionProvider "
                f"(available: {', '.join(available)}); install onnxruntime-gpu on a machine with an NVIDIA GPU"
            )
        return f"onnxruntime has no {name}"
    return None


def session_options(level: str, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort_level(level)
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


def create_runner(
    model_path: str, provider: str, level: str, threads: int, feeds: Mapping[str, np.ndarray]
) -> Runner:
    """Create a session (timed) and the callable that runs it on ``feeds``.

    On CUDA the inputs are copied to the device once and bound; each run binds fresh device outputs,
    runs and waits for the device, so the time is what a device-resident pipeline would see.
    """
    import onnxruntime as ort

    options = session_options(level, threads)
    run_options = ort.RunOptions()
    run_options.log_severity_level = 4  # a stopped run is reported by its exception
    start = time.perf_counter()
    if provider == "cuda":
        session = ort.InferenceSession(
            model_path, options, providers=[PROVIDERS["cuda"], PROVIDERS["cpu"]]
        )
    else:
        session = ort.InferenceSession(model_path, options, providers=[PROVIDERS["cpu"]])
    create_seconds = time.perf_counter() - start
    output_names = [o.name for o in session.get_outputs()]
    input_names = [i.name for i in session.get_inputs()]
    used = {name: feeds[name] for name in input_names if name in feeds}
    if provider != "cuda":

        def run_cpu() -> object:
            return session.run(output_names, used, run_options)

        def outputs_cpu() -> list[np.ndarray]:
            return [np.asarray(x) for x in session.run(output_names, used, run_options)]

        return Runner(
            "onnxruntime",
            provider,
            create_seconds,
            run_cpu,
            outputs_cpu,
            keepalive=session,
            run_options=run_options,
        )

    binding = session.io_binding()
    device_inputs = {
        name: ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0) for name, array in used.items()
    }
    for name, value in device_inputs.items():
        binding.bind_ortvalue_input(name, value)
    binding.synchronize_inputs()

    def run_cuda() -> object:
        for name in output_names:
            binding.bind_output(name, "cuda", 0)
        session.run_with_iobinding(binding, run_options)
        binding.synchronize_outputs()
        return None

    def outputs_cuda() -> list[np.ndarray]:
        run_cuda()
        return [np.asarray(x) for x in binding.copy_outputs_to_cpu()]

    return Runner(
        "onnxruntime",
        provider,
        create_seconds,
        run_cuda,
        outputs_cuda,
        keepalive=(session, device_inputs),
        run_options=run_options,
    )
