#!/bin/sh
# Whole-model A/B of fuse-packed-attention: -O2 without it (A) and with it (B, the default), timed
# interleaved against the original export on ORT CPU (ENABLE_ALL, 2 threads, process CPU time).
#   sh benchmarks/packed_attention_ab.sh ZOO/bert.torchscript.onnx [BUDGET] [--shape ...]
set -e
model=$1; budget=${2:-30}; shift; shift || true
out=${TMPDIR:-/tmp}/packed_ab; mkdir -p "$out"
name=$(basename "$model" .onnx)
PY=${PYTHON:-python}
$PY -m onnxopt optimize "$model" -o "$out/$name.without.onnx" --disable fuse-packed-attention --no-validate --overwrite >/dev/null
$PY -m onnxopt optimize "$model" -o "$out/$name.with.onnx" --no-validate --overwrite >/dev/null
$PY -m onnxopt bench "$model" --optimized "$out/$name.without.onnx" --compare "packed=$out/$name.with.onnx" \
    --budget "$budget" --threads 2 --clock cpu --ort-level all --no-memory "$@"
rm -f "$out/$name.without.onnx" "$out/$name.with.onnx" "$out/$name.without.onnx.data" "$out/$name.with.onnx.data"
