"""Models that read a KV cache through ONNX Runtime's GroupQueryAttention, as onnxruntime-genai's
model builder writes them (Phi-3, Llama, Qwen, Gemma ``*-onnx`` releases): validation and bench
size them by that op's rules (onnxopt/kv_cache_inputs.py).

The models are built here the way the builder lays them out: packed Q/K/V into
GroupQueryAttention with its rotary inside, each past straight from a graph input whose last dim
is the symbolic ``kv_cache_dim``, the mask's row sums as ``seqlens_k`` and its length as the
total. Heads of 48: a size none of validation's fallback sizes guesses.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest

from onnxopt import api
from onnxopt.cli import EXIT_OK
from onnxopt.io import model_from_proto
from onnxopt.kv_cache_inputs import kv_cache_facts
from onnxopt.validate import input_specs, validate
from tests.test_cli import cli

HIDDEN, HEADS, KV_HEADS, HEAD = 64, 4, 2, 48
QKV = (HEADS + 2 * KV_HEADS) * HEAD
VOCAB, POSITIONS = 64, 256

_LAYER = """
    qkv{i} = {product}{split}
    a{i}, present_key{i}, present_value{i} = com.microsoft.GroupQueryAttention
        <num_heads = 4, kv_num_heads = 2, do_rotary = {rotary}{window}>
        ({query}, past_key{i}, past_value{i}, seqlens, total, cos, sin)
    o{i} = MatMul(a{i}, wo{i})
    g{i} = Sigmoid(o{i})
    h{i} = Mul(o{i}, g{i})
"""

# Qwen3's per-head RMS norms of the query and key, with Q, K and V apart.
_HEAD_NORMS = """
    q{i}, k{i}, v{i} = Split<axis = -1>(qkv{i}, qkv_sizes)
    qh{i} = Reshape(q{i}, heads)
    qn{i} = SimplifiedLayerNormalization<axis = -1, epsilon = 0.000001>(qh{i}, qnorm)
    qr{i} = Reshape(qn{i}, q_width)
    kh{i} = Reshape(k{i}, heads)
    kn{i} = SimplifiedLayerNormalization<axis = -1, epsilon = 0.000001>(kh{i}, knorm)
    kr{i} = Reshape(kn{i}, kv_width)
"""

# The rotary outside the attention, on Q and K projected apart (the builder's DirectML form).
_ROTARY_APART = """
    q{i}, k{i}, v{i} = Split<axis = -1>(qkv{i}, qkv_sizes)
    qq{i} = MatMul(q{i}, wq_{i})
    qr{i} = com.microsoft.RotaryEmbedding<num_heads = 4>(qq{i}, position_ids, cos, sin)
    kr{i} = com.microsoft.RotaryEmbedding<num_heads = 2>(k{i}, position_ids, cos, sin)
"""


def _decoder(ring: int = 0, nbits: bool = False, apart: str = "") -> ir.Model:
    """One global layer (past ``past_sequence_length``), and with ``ring`` a second one over a
    sliding window of that many rows kept as a ring buffer (past ``past_sliding_length``).
    ``apart``: Q, K and V given apart, Q and K normalized per head (``"norms"``, as the builder
    writes Qwen3) or rotated before the attention (``"rotary"``, with a position_ids input)."""
    layers = [("past_sequence_length", "")]
    if ring:
        window = f", local_window_size = {ring}, sliding_window_cache = 1"
        layers.append(("past_sliding_length", window))
    inputs, outputs, body = [], [], []
    for i, (past, window) in enumerate(layers):
        for kind in ("key", "value"):
            inputs.append(f"float[batch_size, 2, {past}, kv_cache_dim] past_{kind}{i}")
            length = "total_sequence_length" if not window else past
            outputs.append(f"float[batch_size, 2, {length}, kv_cache_dim] present_{kind}{i}")
        source = "x" if i == 0 else f"h{i - 1}"
        product = (
            f"com.microsoft.MatMulNBits<K = {HIDDEN}, N = {QKV}, bits = 4, block_size = 32>"
            f"({source}, wq{i}, sq{i})"
            if nbits
            else f"MatMul({source}, wqkv{i})"
        )
        split = {"norms": _HEAD_NORMS, "rotary": _ROTARY_APART, "": ""}[apart].format(i=i)
        query = f"qr{i}, kr{i}, v{i}" if apart else f'qkv{i}, "", ""'
        rotary = 0 if apart == "rotary" else 1
        body.append(
            _LAYER.format(
                i=i, product=product, window=window, split=split, query=query, rotary=rotary
            )
        )
    if apart == "rotary":
        inputs.insert(0, "int64[batch_size, sequence_length] position_ids")
    last = len(layers) - 1
    text = f"""
        <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
        g (int64[batch_size, sequence_length] input_ids,
           int64[batch_size, total_sequence_length] attention_mask, {", ".join(inputs)})
          => (float[batch_size, sequence_length, {VOCAB}] logits, {", ".join(outputs)}) {{
            x = Gather(embed, input_ids)
            sums = ReduceSum<keepdims = 0>(attention_mask, axis1)
            lens = Sub(sums, one)
            seqlens = Cast<to = 6>(lens)
            mask_shape = Shape(attention_mask)
            length = Gather(mask_shape, index1)
            total = Cast<to = 6>(length)
            {"".join(body)}
            logits = MatMul(h{last}, lm_head)
        }}
    """
    proto = onnx.parser.parse_model(text)
    rng = np.random.default_rng(0)
    angles = np.outer(np.arange(POSITIONS), 1.0 / 10000 ** (np.arange(HEAD // 2) / (HEAD // 2)))
    weights: dict[str, np.ndarray] = {
        "embed": rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32),
        "lm_head": rng.standard_normal((HIDDEN, VOCAB)).astype(np.float32) * 0.1,
        "axis1": np.array([1], np.int64),
        "one": np.array(1, np.int64),
        "index1": np.array(1, np.int64),
        "cos": np.cos(angles).astype(np.float32),
        "sin": np.sin(angles).astype(np.float32),
    }
    if apart:
        weights["qkv_sizes"] = np.array([HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], np.int64)
        weights["heads"] = np.array([0, -1, HEAD], np.int64)
        weights["q_width"] = np.array([0, -1, HEADS * HEAD], np.int64)
        weights["kv_width"] = np.array([0, -1, KV_HEADS * HEAD], np.int64)
        weights["qnorm"] = rng.uniform(0.5, 1.5, HEAD).astype(np.float32)
        weights["knorm"] = rng.uniform(0.5, 1.5, HEAD).astype(np.float32)
    for i in range(len(layers)):
        if apart == "rotary":
            weights[f"wq_{i}"] = rng.standard_normal((HEADS * HEAD,) * 2).astype(np.float32) * 0.1
        weights[f"wo{i}"] = rng.standard_normal((HEADS * HEAD, HIDDEN)).astype(np.float32) * 0.1
        if nbits:
            blocks = HIDDEN // 32
            weights[f"wq{i}"] = rng.integers(0, 256, (QKV, blocks, 16), dtype=np.uint8)
            weights[f"sq{i}"] = rng.uniform(0.01, 0.05, QKV * blocks).astype(np.float32)
        else:
            weights[f"wqkv{i}"] = rng.standard_normal((HIDDEN, QKV)).astype(np.float32) * 0.1
    for name, array in weights.items():
        proto.graph.initializer.append(onnx.numpy_helper.from_array(array, name))
    return model_from_proto(proto)


def _shapes(report_inputs: list[dict[str, list[int]]], name: str) -> list[tuple[int, ...]]:
    return [tuple(feeds[name]) for feeds in report_inputs]


@pytest.mark.parametrize("nbits", [False, True], ids=["float", "matmulnbits"])
def test_facts_fix_the_past_dims_and_read_the_total_from_the_mask(nbits: bool) -> None:
    facts = kv_cache_facts(_decoder(nbits=nbits))
    assert facts is not None
    assert facts.fixed == {
        ("past_key0", 1): KV_HEADS,
        ("past_key0", 3): HEAD,
        ("past_value0", 1): KV_HEADS,
        ("past_value0", 3): HEAD,
    }
    assert (facts.past, facts.total) == ("past_sequence_length", "total_sequence_length")
    specs = {s.name: s for s in input_specs(_decoder(nbits=nbits))}
    assert specs["past_key0"].dims == ("batch_size", 2, "past_sequence_length", HEAD)
    assert specs["attention_mask"].dims == (
        "batch_size",
        "past_sequence_length + sequence_length",
    )
    assert (specs["past_key0"].kv_role, specs["attention_mask"].kv_role) == ("past", "mask")
    assert specs["input_ids"].kv_role is None


def test_a_cache_that_is_not_an_input_gives_no_facts() -> None:
    model = _decoder()
    graph = model.graph
    gqa = next(n for n in graph if n.op_type == "GroupQueryAttention")
    for index in (3, 4):
        gqa.replace_input_with(index, None)
    assert kv_cache_facts(model) is None


def test_validation_runs_a_decode_step_and_a_prompt(tmp_path) -> None:
    path = tmp_path / "decoder.onnx"
    ir.save(_decoder(), path)
    code, stdout, stderr = cli("optimize", path, "-o", tmp_path / "out.onnx", "--json")
    assert code == EXIT_OK, stderr
    validation = json.loads(stdout)["validation"]
    assert validation["passed"]
    inputs = validation["trials"]
    assert _shapes(inputs, "past_key0") == [(2, 2, 7, HEAD), (2, 2, 0, HEAD)]
    assert _shapes(inputs, "attention_mask") == [(2, 8), (2, 5)]
    assert _shapes(inputs, "input_ids") == [(2, 1), (2, 5)]
    assert any("KV-cache steps" in note for note in validation["notes"])


def test_validation_compares_what_the_past_gives() -> None:
    """A past key read as the value is caught: the decode step attends to the past (a prompt,
    new tokens == total, ignores it, and was all that ran before)."""
    original = _decoder()
    broken = original.clone()
    gqa = next(n for n in broken.graph if n.op_type == "GroupQueryAttention")
    key, value = gqa.inputs[3], gqa.inputs[4]
    gqa.replace_input_with(3, value)
    gqa.replace_input_with(4, key)
    report = validate(original, broken, specs=input_specs(original))
    assert not report.passed
    logits = next(o for o in report.outputs if o.name == "logits")
    assert not logits.passed


def test_a_ring_buffer_is_sized_to_its_window(tmp_path) -> None:
    """Gemma 2's local layers keep a window-long ring buffer (``sliding_window_cache``): its
    length is fixed, and both steps fill it (ORT leaves rows past the tokens written unset)."""
    model = _decoder(ring=8)
    specs = {s.name: s for s in input_specs(model)}
    assert specs["past_key1"].dims == ("batch_size", 2, 8, HEAD)
    result = api.optimize(model)
    validation = result.report.validation
    assert validation is not None and validation.passed
    assert [shape["past_key0"] for shape in validation.trials] == [(2, 2, 8, HEAD), (2, 2, 0, HEAD)]
    assert [shape["input_ids"] for shape in validation.trials] == [(2, 1), (2, 8)]


def test_bench_times_a_step_at_its_default_sizes(tmp_path) -> None:
    path = tmp_path / "decoder.onnx"
    ir.save(_decoder(), path)
    code, stdout, stderr = cli(
        "bench", path, "--budget", "0.5", "--no-memory", "--ort-level", "all", "--json"
    )
    assert code == EXIT_OK, stderr
    shapes = json.loads(stdout)["points"][0]["shapes"]
    assert shapes["past_key0"] == [1, 2, 128, HEAD]
    assert shapes["attention_mask"] == [1, 256]


@pytest.mark.parametrize("apart", ["", "norms", "rotary"], ids=["packed", "head-norms", "rotary"])
def test_the_output_is_a_fixed_point_that_validates_again(apart: str) -> None:
    """onnxopt drops the shape annotations it leaves behind: the head size is then read off the
    Reshape, Split or weight product that makes the query, through a rotary, and optimizing the
    output changes nothing."""
    first = api.optimize(_decoder(apart=apart))
    assert first.report.validation is not None and first.report.validation.passed
    inner = [v for n in first.model.graph for v in n.outputs if not v.is_graph_output()]
    assert inner and all(v.shape is None for v in inner)
    again = api.optimize(first.model)
    validation = again.report.validation
    assert validation is not None and validation.passed
    assert [shape["past_key0"] for shape in validation.trials] == [(2, 2, 7, HEAD), (2, 2, 0, HEAD)]
    before = ir.to_proto(first.model).SerializeToString()
    assert ir.to_proto(again.model).SerializeToString() == before


def test_a_genai_config_left_behind_is_named(tmp_path) -> None:
    """onnxruntime-genai finds a model only through the genai_config.json beside it."""
    source = tmp_path / "build"
    source.mkdir()
    ir.save(_decoder(), source / "model.onnx")
    config = {"model": {"decoder": {"filename": "model.onnx"}}}
    (source / "genai_config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    out.mkdir()

    def warnings(target: str) -> list[str]:
        code, stdout, stderr = cli("optimize", source / "model.onnx", "-o", out / target, "--json")
        assert code == EXIT_OK, stderr
        return [w for w in json.loads(stdout)["warnings"] if "genai_config.json" in w]

    (left,) = warnings("model.onnx")
    assert "copy that config and the tokenizer files" in left and "names the model" not in left
    (renamed,) = warnings("fast.onnx")
    assert renamed.endswith("(the config names the model 'model.onnx')")
    (out / "genai_config.json").write_text(json.dumps(config))
    assert warnings("model.onnx") == []
    assert warnings("fast.onnx") == [
        f"{out / 'genai_config.json'} names the model 'model.onnx', not fast.onnx"
    ]
