"""One 1-D Conv against the same Conv as a 2-D one of height 1 (what promote-conv1d writes), on ORT.

    nice .venv/bin/python benchmarks/conv1d_micro.py --seconds 3

For each shape (input channels, output channels, kernel, stride, pad, dilation, group, length)
both forms run in one process, interleaved, at ORT_ENABLE_ALL with 2 intra-op threads; the ratio
is the median 1-D time over the median 2-D time (> 1: the 2-D form is faster). The weights are the
same in both, so the largest relative difference of the outputs is printed too. These figures
set promote-conv1d's thresholds (>= 256 channels each way in one group with a kernel >= 2, or a
kernel >= 16).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnxruntime as ort
from onnx import TensorProto

# (in, out, kernel, stride, pad, dilation, group, length)
SHAPES = [
    *[
        (c, c, k, s, k // 2, 1, 1, 1000)
        for c in (48, 64, 100, 128, 256, 512)
        for k, s in ((3, 1), (3, 2), (5, 1), (1, 1))
    ],
    (80, 384, 3, 1, 1, 1, 1, 3000),  # Whisper's first conv
    (384, 384, 3, 2, 1, 1, 1, 3000),  # and its second
    (1, 512, 10, 5, 0, 1, 1, 16000),  # wav2vec2's first, on the waveform
    (512, 512, 3, 2, 0, 1, 1, 3199),  # and the next ones
    (512, 512, 2, 2, 0, 1, 1, 200),
    (768, 768, 128, 1, 64, 1, 16, 49),  # wav2vec2's positional conv, 1 s of audio
    (768, 768, 128, 1, 64, 1, 16, 200),
    (512, 512, 31, 1, 15, 1, 512, 200),  # Conformer depthwise
    (512, 512, 31, 1, 15, 1, 16, 200),
    (256, 256, 3, 1, 1, 1, 4, 500),
    (256, 256, 3, 1, 1, 1, 256, 500),
    (512, 512, 3, 1, 2, 2, 1, 500),  # dilated (TCN)
    (256, 256, 3, 1, 4, 4, 1, 500),
    (8, 64, 3, 1, 1, 1, 1, 1000),
]


def _model(weight: np.ndarray, bias: np.ndarray, shape: tuple[int, ...], two_d: bool) -> bytes:
    cin, _, taps, stride, pad, dilation, group, _ = shape
    inits = [onh.from_array(bias, "b")]
    if two_d:
        inits += [
            onh.from_array(weight[:, :, None, :], "w"),
            onh.from_array(np.array([2], np.int64), "axis"),
        ]
        nodes = [
            oh.make_node("Unsqueeze", ["x", "axis"], ["x4"]),
            oh.make_node(
                "Conv",
                ["x4", "w", "b"],
                ["c"],
                kernel_shape=[1, taps],
                strides=[1, stride],
                pads=[0, pad, 0, pad],
                dilations=[1, dilation],
                group=group,
            ),
            oh.make_node("Squeeze", ["c", "axis"], ["y"]),
        ]
    else:
        inits += [onh.from_array(weight, "w")]
        nodes = [
            oh.make_node(
                "Conv",
                ["x", "w", "b"],
                ["y"],
                kernel_shape=[taps],
                strides=[stride],
                pads=[pad, pad],
                dilations=[dilation],
                group=group,
            )
        ]
    graph = oh.make_graph(
        nodes,
        "conv",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["N", cin, "L"])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)]).SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="timing per shape")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    rng = np.random.default_rng(0)
    print(f"ORT {ort.__version__} CPU, {args.threads} threads, ORT_ENABLE_ALL, wall clock")
    print(
        "| in | out | kernel | stride | dilation | group | length | 1-D µs | 2-D µs | 1-D / 2-D | rel. diff |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for shape in SHAPES:
        cin, cout, taps, stride, _, dilation, group, length = shape
        weight = rng.standard_normal((cout, cin // group, taps)).astype(np.float32)
        weight /= np.sqrt(cin // group * taps)
        bias = rng.standard_normal(cout).astype(np.float32)
        sessions = [
            ort.InferenceSession(
                _model(weight, bias, shape, two_d), options, providers=["CPUExecutionProvider"]
            )
            for two_d in (False, True)
        ]
        x = rng.standard_normal((1, cin, length)).astype(np.float32)
        outputs = [s.run(None, {"x": x})[0] for s in sessions]
        times: list[list[float]] = [[], []]
        end = time.perf_counter() + args.seconds
        while time.perf_counter() < end:
            for i, session in enumerate(sessions):
                start = time.perf_counter()
                session.run(None, {"x": x})
                times[i].append(time.perf_counter() - start)
        one, two = (float(np.median(t)) * 1e6 for t in times)
        diff = np.abs(outputs[0] - outputs[1]).max() / max(np.abs(outputs[0]).max(), 1e-30)
        print(
            f"| {cin} | {cout} | {taps} | {stride} | {dilation} | {group} | {length} "
            f"| {one:.0f} | {two:.0f} | {one / two:.2f} | {diff:.1e} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
