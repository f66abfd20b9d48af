#!/bin/sh
# A/B of fuse-rotary-embedding on a whole model: -O2 without the pass vs -O2 with it, ORT CPU,
# 2 threads, ENABLE_ALL, process CPU time. Usage: sh benchmarks/rotary_ab.sh MODEL.onnx [BUDGET_S]
# (export one first: onnxopt export llama --exporter torchscript -o llama.onnx)
set -eu
model=$1
budget=${2:-200}
dir=$(mktemp -d)
onnxopt optimize "$model" -o "$dir/base.onnx" --disable fuse-rotary-embedding --no-validate >/dev/null
onnxopt optimize "$model" -o "$dir/rotary.onnx" --no-validate >/dev/null
onnxopt bench "$dir/base.onnx" --optimized "$dir/rotary.onnx" --ort-level all --threads 2 \
    --clock cpu --no-memory --budget "$budget"
rm -r "$dir"
