"""Peak memory of one variant, measured in a fresh child process so that variants cannot share or hide memory.

What is measured (Linux): the child imports its runtime, reads its inputs, records its resident set
size (RSS) as the baseline, resets the kernel's peak-RSS mark (``/proc/self/clear_refs``), then loads
the model (an ORT session, or the PyTorch module) and runs it a few times. It reports

- ``load_bytes``: RSS growth once the model is loaded (weights, session state, ORT's arena so far);
- ``peak_bytes``: the peak RSS growth (``VmHWM``) over loading and running, activations included.

Host memory only: ORT's arena statistics are not exposed by its Python API, and device (CUDA)
memory is not measured. Where the peak mark cannot be reset, ``peak_bytes`` is None.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

RUNS = 3
TIMEOUT_SECONDS = 600


@dataclass(frozen=True)
class MemoryResult:
    load_bytes: int | None
    peak_bytes: int | None
    error: str | None = None


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def _providers_module() -> Any:
    if __package__:
        from onnxopt.bench import providers
    else:  # run as a script (see measure): the sibling module, without the seconds of importing onnxopt
        import providers  # type: ignore[no-redef]
    return providers


def _measure(job: Mapping[str, Any]) -> dict[str, int | None]:
    """Runs in the child: load the variant named by ``job`` and return its RSS growth."""
    with np.load(job["inputs"], allow_pickle=False) as data:
        feeds = {k: data[k] for k in data.files}
    if job["kind"] == "ort":
        providers = _providers_module()
        providers.session_options("all", 1)  # import onnxruntime before the baseline

        def load() -> Any:
            return providers.create_runner(
                job["model"], job["provider"], job["level"], job["threads"], feeds
            )
    else:
        from onnxopt.bench import torch_side

        torch_side.import_torch()
        factory = torch_side.resolve_factory(job["torch"])

        def load() -> Any:  # building the module (its weights) counts, importing its code does not
            torch_model = torch_side.normalize(job["torch"], factory())
            return torch_side.create_runner(
                torch_model, feeds, job["input_names"], compiled=False, threads=job["threads"]
            )

    baseline = _status_bytes("VmRSS")
    resettable = _reset_peak()
    runner = load()
    loaded = _status_bytes("VmRSS")
    for _ in range(RUNS):
        runner.run()
    peak = _status_bytes("VmHWM") if resettable else None
    return {
        "load_bytes": None if baseline is None or loaded is None else loaded - baseline,
        "peak_bytes": None if baseline is None or peak is None else peak - baseline,
    }


def measure(job: Mapping[str, Any], feeds: Mapping[str, np.ndarray]) -> MemoryResult:
    """Measure one variant in a child process (``job``: kind, model/torch, provider, level, threads)."""
    from onnxopt.guard import temp_folder  # here: the measuring child, this file, imports no more

    with temp_folder("onnxopt-mem-") as tmp:
        inputs = Path(tmp) / "inputs.npz"
        np.savez(inputs, **dict(feeds))  # type: ignore[arg-type]
        payload = json.dumps({**job, "inputs": str(inputs)})
        env = dict(os.environ)
        path = [p for p in sys.path if p and Path(p).is_dir()]
        env["PYTHONPATH"] = os.pathsep.join([*path, env.get("PYTHONPATH", "")])
        try:
            done = subprocess.run(
                [sys.executable, __file__],
                input=payload,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_SECONDS,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return MemoryResult(None, None, f"timed out after {TIMEOUT_SECONDS} s")
    if done.returncode != 0:
        lines = (done.stderr or "").strip().splitlines()
        return MemoryResult(None, None, lines[-1] if lines else f"exit status {done.returncode}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return MemoryResult(result["load_bytes"], result["peak_bytes"])


if __name__ == "__main__":
    print(json.dumps(_measure(json.loads(sys.stdin.read()))))
