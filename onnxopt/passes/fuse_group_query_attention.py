"""Turn MultiHeadAttention over repeated K/V, or under a causal mask, into GroupQueryAttention (ort).

LLaMA-style models share each K/V head among ``rep = H / Nkv`` query heads; the exporters spell
PyTorch's ``repeat_kv`` as ::

    K = Reshape(Expand(Unsqueeze(K4, [2]), [B, Nkv, rep, T, d]), [B, Nkv*rep, T, d])

(the same for V), and fuse-attention fuses the rest into ``MultiHeadAttention(q, K, V, bias)``.
GroupQueryAttention reads the Nkv heads directly, so the Expands and their copies disappear:
``GroupQueryAttention(q, k3, v3, seqlens_k, total_sequence_length, attention_bias=bias)`` with
``k3``/``v3`` = K4/V4 as [B, T, Nkv*d], ``total_sequence_length = T`` and ``seqlens_k = T - 1``
for every batch row, both read from K's shape at run time (no dynamic dim becomes a constant).

Without a past cache the op needs the key as long as the query, so the rewrite is made only when
the query and the key provably come from one [B, S, D] tensor (followed back through
projections, head splits, views the shapes prove keep B and S, Unsqueezes, per-head norms, picks
of one index on a later axis and rotary embeddings); the op also needs a head size that is a
multiple of 8. Otherwise the MultiHeadAttention stays, and ``--explain`` says why.

Two forms, tried in this order:

- ``mha->gqa-causal`` (``causal=1``: the kernel skips the keys after each query). Made when the
  mask is provably causal: ``Where(cond, allowed, masked)`` through broadcasts, with ``cond`` an
  And containing ``LessOrEqual(key positions, query positions)``, positions
  ``Range(0, n, 1)`` with n read off a tensor whose dim is the sequence's symbol, or a cut from
  row and column 0 of a constant lower-triangular buffer (GPT-2's and GPT-BigCode's ``bias``
  before transformers 5, rows ``T - S`` on with no past), ``masked`` a finite constant <= -1e30
  and ``allowed`` constants above it; or a mask of numbers that provably holds ``masked`` at
  every key after its query and only that constant or finite numbers above the floor elsewhere
  (transformers 4.38-4.47's ``triu(full(min), 1) * (arange(T) > cache_position)`` with the
  padding filled in: _causal_values.py). Then a key after the query adds
  exp(masked - max) = 0 to its row in the export, so skipping it changes nothing, except in a row
  whose every key is masked (left padding): there each score is the masked constant, the export's
  softmax is uniform and gives the mean of all V rows, while causal=1 would average only the
  keys up to the query. Those rows get the mean of V back (Where on the mask's row max; the row
  flags are computed once from the mask all layers share). Two such masks added (GPT-Neo: its
  causal buffer's masked_fill, then the causal + padding mask) are causal too when the second's
  constant buffer allows each query its own key and the two masked constants add to -inf: every
  key after the query is then -inf in the export, whose fully masked rows average only the keys
  up to the query, as causal=1 does, so they need no fix-up.
- ``mha->gqa`` (``causal=0``): any other mask, used exactly as MultiHeadAttention uses it
  (bit-identical outputs in benchmarks/gqa_micro.py, padded and fully masked rows included).

Causal self-attention with all its K/V heads (GPT-2, OPT, GPT-NeoX, GPT-J: no repeat_kv) takes the
``mha->gqa-causal`` form too, with ``kv_num_heads = num_heads``, when its mask is proved causal as
above; any other mask leaves such a block to MultiHeadAttention or packed Attention (as fast: no
candidate, no --explain line). When Q, K and V are the parts [H*d | Nkv*d | Nkv*d] of one
[B, S, W] projection split along its last axis (GPT-2's c_attn + Split; GPT-BigCode's multi-query
c_attn, unsqueezed first; reached through views and, for several K/V heads, their head split's
Transpose) GroupQueryAttention reads that tensor whole (its packed-QKV form) and the Split goes;
with one mask head the fix-up needs no head split (V's mean is spread over the query heads). Why it pays, on ORT
1.32 CPU: the kernel softmaxes only the keys up to each query, where Attention and
MultiHeadAttention run the whole row and turn every masked score into a denormal probability
(exp of about -88 or less), which makes their softmax and P@V slow (with ORT's
``session.set_denormal_as_zero`` the masked and unmasked kernels run within 3%, and packed
Attention is the faster one). Twelve GPT-2 layers against packed Attention
(benchmarks/causal_attention_micro.py, process CPU time, 2 threads): 1.09x at S=128 without the
fix-up, 1.05x with it, 1.29x at S=512; whole GPT-2 over the export, ``onnxopt bench``: 1.03-1.04x
against packed Attention's 1.02-1.03x at 128 tokens, 1.12-1.15x against 1.03-1.06x at 512 (README,
"Fusions"). fuse-packed-attention leaves these blocks to this pass when both run
(levels.build_steps).

Soft-capped attention (Gemma2: ``tanh(s / c) * c`` on the scaled scores, before the mask) has no
MultiHeadAttention form, so fuse-attention leaves it unfused; ``SOFTCAP_GQA_RULES``
(``softcap-attention->gqa-causal`` / ``softcap-attention->gqa``, run by the opt-in
fuse-softcap-attention) match the same block at its Softmax (fuse-attention's matcher) and emit
``GroupQueryAttention(softcap=c)`` directly, with the same K/V, one-sequence and causal proofs as
above. ORT 1.32's kernel caps the scaled scores
before adding attention_bias, as Gemma2 does (scripts/softcap_kernel_check.py). Sliding-window
layers keep their window in the mask, which stays attention_bias, so every window is exact;
``local_window_size`` is not used (measured: local_window_size=w keeps keys i-w+1..i, the keys
Gemma2's ``kv > q - w`` keeps, but it would only skip work the mask already zeroes).

Attention sinks (GPT-OSS: a learned logit per head joins each softmax row, its column dropped
after; Granite-SWA: the same softmax written as P@V scaled by sigmoid(logsumexp - sinks); see
fuse_attention.py) have no MultiHeadAttention form either. ``SINK_GQA_RULES``
(``sink-attention->gqa-causal`` / ``sink-attention->gqa``, run by this pass) match the block at
its Softmax and emit ``GroupQueryAttention(..., attention_bias=mask, head_sink=logits)`` with the
same K/V, one-sequence and causal proofs. ORT 1.32 CPU's kernel computes exactly GPT-OSS's eager
attention there (2.4e-7, scripts/sink_kernel_check.py), the mask passed whole as attention_bias,
so sliding windows stay exact; a row whose every key is masked gives zeros in the export (the sink
takes the whole row) and in the kernel, so causal=1 needs no fix-up with sinks.

ORT 1.32 CPU, one LLaMA layer (9 query / 3 KV heads of 64, B=1, 2 threads, process CPU time,
benchmarks/gqa_micro.py), speed-up over Expands + MultiHeadAttention: causal=0 1.19x (S=128),
1.08x (S=512); causal=1 with the fix-up 1.61x (S=128), 1.29x (S=512). The fix-up averages V
with a MatMul by a row of 1/T: ORT's ReduceMean over axis 1 cost as much as the kernel saved.

Older releases (``--ort-version``, ort_versions.py): every release before 1.30 runs the causal
kernel and has no ``causal`` attribute (1.30 added it with default 1), so for them causal=1 is
written by leaving it out, and the causal=0 rules do not apply (the block stays
MultiHeadAttention, or becomes packed Attention); before 1.29 the op also needs its
present_key / present_value outputs, which are declared and left unread; head_sink needs 1.23.
``gqa->gqa-for-older-release`` rewrites a causal GroupQueryAttention already in the model (an
output for a newer release, optimized again) the same way. Checked with
scripts/ort_versions_probe.py on ORT 1.22-1.29 (README, "ONNX Runtime releases").

float32 only: ORT's CPU kernel also runs float16, but its CUDA kernel (float16 and bfloat16, where
half-precision models are deployed) is always causal and rejects ``attention_bias``, so a float16
rewrite would fail or change results there; float16 attention stays MultiHeadAttention.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN, ONNX_DOMAINS, const_array, is_op, is_scalar_constant
from onnxopt.ort_versions import (
    GQA_CAUSAL_ATTRIBUTE,
    GQA_HEAD_SINK,
    GQA_WITHOUT_PRESENT,
    Version,
    format_version,
    has_head_sink,
)
from onnxopt.passes._attention_shapes import (
    MASK_FLOOR,
    Entry,
    int64_const,
    last_dim,
    merges_heads,
    peel_torch_expand_shape,
    producer_of,
    reshape_to_heads,
    reshaped_axis,
    same_symbol,
    scalar_dim_read,
    seq_len,
    static_dim,
    target_entries,
    transpose_perm,
    value_rank,
    with_axes,
)
from onnxopt.passes._causal_values import (
    after_query,
    leading_axes_peeled,
    value_set,
    zero_start,
)
from onnxopt.passes._shape_facts import axes_param
from onnxopt.passes.base import Pass, PassResult
from onnxopt.passes.fuse_attention import (
    AttentionBlock,
    attention_bias,
    attention_query,
    finish_attention,
    has_sinks,
    has_soft_cap,
    match_attention_block,
)
from onnxopt.passes.sort_topologically import sort_model
from onnxopt.rewrite import (
    Match,
    Mismatch,
    Replacement,
    RewriteContext,
    Rule,
    apply_rules,
    iter_graphs,
)
from onnxopt.rewrite.driver import describe
from onnxopt.rewrite.patterns import producer_op

logger = logging.getLogger(__name__)

# MultiHeadAttention inputs: query, key, value, bias, key_padding_mask, attention_bias, past_key, ...
_ATTENTION_BIAS = 5


@dataclass(frozen=True)
class _Grouped:
    """A [B, H, T, d] operand that repeats each head of ``source`` ([B, Nkv, T, d]) ``rep`` times."""

    source: ir.Value
    kv_heads: int
    head_size: int
    nodes: tuple[ir.Node, ...]  # Unsqueeze, Expand, Reshape
    # Shape reads of the repeated tensor that skip its head dim (fuse-attention's mask Expand reads
    # T there): they read ``source`` instead, so that the repeat itself can go.
    shape_reads: tuple[ir.Node, ...] = ()


def _shape_reads(
    repeated: ir.Value, attention: ir.Node, fused: frozenset[int] = frozenset()
) -> tuple[ir.Node, ...] | Mismatch:
    """The Shape reads of ``repeated`` besides ``attention`` (and the ``fused`` nodes, by id)."""
    reads = []
    for use in repeated.uses():
        node = use.node
        if node is attention or id(node) in fused:
            continue
        start = node.attributes.get_int("start", 0) if is_op(node, "Shape") else None
        end = node.attributes.get_int("end", 4) if is_op(node, "Shape") else None
        if start is None or end is None:
            return Mismatch(f"the repeated K/V is also read by {node.op_type}")
        start, end = start % 4 if start < 0 else start, end % 4 if end < 0 else min(end, 4)
        if start <= 1 < end:
            return Mismatch("the repeated K/V's head count is read by a Shape")
        reads.append(node)
    return tuple(reads)


def _keeps_dim(
    entry: Entry, out: ir.Value, out_axis: int, source: ir.Value, axis: int, copy_ok: bool
) -> bool:
    """Entry ``out_axis`` of a target gives ``source``'s dim ``axis`` (a read of it, or equal symbols)."""
    if isinstance(entry, tuple):
        _, read, index = entry
        return (read is source and index == axis) or same_symbol(read, index, source, axis)
    if entry == 0 and copy_ok:
        return True
    return same_symbol(out, out_axis, source, axis)


def _repeated_kv(value: ir.Value | None, heads: int) -> _Grouped | Mismatch:
    """Recognise ``Reshape(Expand(Unsqueeze(x, [2]), [B, Nkv, rep, T, d]), [B, H, T, d])``."""
    reshape = value.producer() if value is not None else None
    if not is_op(reshape, "Reshape"):
        return Mismatch("K/V are not a repeat_kv expansion (no Reshape to [B, H, T, d])")
    assert reshape is not None and reshape.inputs[0] is not None
    expand = reshape.inputs[0].producer()
    if not is_op(expand, "Expand"):
        return Mismatch("K/V are not a repeat_kv expansion (no Expand before the Reshape)")
    assert expand is not None and expand.inputs[0] is not None
    unsqueeze = expand.inputs[0].producer()
    if not is_op(unsqueeze, "Unsqueeze"):
        return Mismatch("K/V are not a repeat_kv expansion (no Unsqueeze before the Expand)")
    assert unsqueeze is not None
    source = unsqueeze.inputs[0]
    axes_array = const_array(unsqueeze.inputs[1]) if len(unsqueeze.inputs) > 1 else None
    axes = unsqueeze.attributes.get_ints("axes", None)  # opset < 13: axes as an attribute
    if axes_array is not None:
        axes = [int(a) for a in axes_array.reshape(-1)]
    if source is None or axes is None or list(axes) not in ([2], [-3]):
        return Mismatch("the K/V repeat does not insert its axis at position 2")
    kv_heads, head_size = static_dim(source, 1), static_dim(source, 3)
    if value_rank(source) != 4 or kv_heads is None or head_size is None:
        return Mismatch("the repeated K/V is not [B, Nkv, T, d] with static Nkv and d")
    if head_size % 8:
        return Mismatch(
            f"head size {head_size}: ONNX Runtime's GroupQueryAttention needs a multiple of 8"
        )
    if heads % kv_heads:
        return Mismatch(f"{heads} query heads are not a multiple of {kv_heads} K/V heads")
    rep = heads // kv_heads
    unsqueezed = expand.inputs[0]
    expanded = expand.outputs[0]
    target = target_entries(peel_torch_expand_shape(expand.inputs[1]))  # type: ignore[arg-type]
    shape = expanded.shape
    # Expand broadcasts [B, Nkv, 1, T, d] against the target: output [B, Nkv, rep, T, d] exactly.
    if target is not None and len(target) == 5:
        fixed = [(1, kv_heads), (2, rep), (4, head_size)]
        if any(target[i] not in (1, -1, n) if i != 2 else target[i] != n for i, n in fixed):
            return Mismatch(f"the K/V Expand is not to [B, {kv_heads}, {rep}, T, {head_size}]")
        for axis, source_axis in ((0, 0), (3, 2)):
            entry = target[axis]
            if entry not in (1, -1) and not (
                _keeps_dim(entry, expanded, axis, source, source_axis, False)
                or _keeps_dim(entry, expanded, axis, unsqueezed, axis, False)
            ):
                return Mismatch("the K/V Expand may broadcast the batch or sequence dim")
    elif not (
        shape is not None
        and len(shape) == 5
        and [shape[1], shape[2], shape[4]] == [kv_heads, rep, head_size]
        and same_symbol(expanded, 0, source, 0)
        and same_symbol(expanded, 3, source, 2)
    ):
        return Mismatch("the K/V Expand's target is not provably [B, Nkv, rep, T, d]")
    # The Reshape merges (Nkv, rep) into H: dims 1 and 3 are H and d, and 0 / 2 keep B / T.
    entries = target_entries(reshape.inputs[1])
    out = reshape.outputs[0]
    allowzero = bool(reshape.attributes.get_int("allowzero", 0))
    if entries is None or len(entries) != 4:
        return Mismatch("the K/V Reshape's target is not readable as 4 entries")
    # SDPA's enable_gqa (dynamo) reshapes to the query's [B, H, S, d], read off it: its H and d
    # reads are the static sizes they read.
    entries = [
        static_dim(e[1], e[2]) or e if isinstance(e, tuple) and axis in (1, 3) else e
        for axis, e in enumerate(entries)
    ]
    if entries[1] not in (heads, -1) or entries[3] not in (head_size, -1):
        return Mismatch(f"the K/V Reshape is not to [B, {heads}, T, {head_size}]")
    kept = [
        _keeps_dim(entries[0], out, 0, source, 0, not allowzero)
        or _keeps_dim(entries[0], out, 0, expanded, 0, not allowzero),
        _keeps_dim(entries[2], out, 2, source, 2, False)
        or _keeps_dim(entries[2], out, 2, expanded, 3, False),
    ]
    pinned_heads = [entries[i] in (heads, head_size) for i in (1, 3)]
    # Element count fixes the one entry that is not pinned (at most one -1).
    if sum(1 for e in entries if e == -1) > 1 or sum(kept) + sum(pinned_heads) < 3:
        return Mismatch("the K/V Reshape may not keep the batch and sequence dims")
    return _Grouped(source, kv_heads, head_size, (unsqueeze, expand, reshape))


_NORMS = ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization")


def _normalized_from(node: ir.Node, output: ir.Value) -> int | None:
    """For a LayerNorm / RMSNorm of its first input, the first axis it normalizes over (it
    normalizes from there to the last axis; the axes before it stay apart)."""
    if node.op_type not in _NORMS or output is not node.outputs[0]:
        return None
    rank = value_rank(output)
    if rank is None:
        return None
    axis = node.attributes.get_int("axis", -1)
    return axis + rank if -rank <= axis < 0 else axis if 0 <= axis < rank else None


def _origin(value: ir.Value, batch: int, seq: int) -> tuple[ir.Value, int, int]:
    """Follow ``value`` back through ops that keep its batch and sequence dims (at ``batch``,
    ``seq``): rotary embeddings, Transposes, head split/merge Reshapes, projections by a 2-D weight
    and 1-D biases, norms over the last axis. Two tensors with one origin and the same axes have equal B and S."""
    for _ in range(64):
        node = value.producer()
        if node is None:
            break
        source = node.inputs[0] if node.inputs else None
        if source is None:
            break
        if node.op_type == "RotaryEmbedding" and node.domain in (MS_DOMAIN, *ONNX_DOMAINS):
            value = source  # output shape = input shape
            continue
        if node.domain not in ONNX_DOMAINS:
            break
        first_normalized = _normalized_from(node, value)
        if first_normalized is not None and max(batch, seq) < first_normalized:
            value = source  # Qwen3 / Gemma3 / OLMo2: Q and K normalized per head or per token
            continue
        perm = transpose_perm(node)
        if perm is not None:
            batch, seq = perm[batch], perm[seq]
            value = source
            continue
        if _selects_elsewhere(node, batch, seq):
            value = source  # Falcon: Q, K and V sliced / gathered out of one [B, S, H+2, d]
            continue
        if node.op_type == "Reshape":
            if (batch, seq) == (0, 1) and (
                reshape_to_heads(value) is not None or merges_heads(node)
            ):
                value = source
                continue
            # any other view that provably keeps both dims (GPT-BigCode's multi-query
            # [B, 1, S, D] -> [B, S, H, d])
            kept_batch = reshaped_axis(value, source, batch)
            kept_seq = reshaped_axis(value, source, seq)
            if kept_batch is None or kept_seq is None:
                break
            batch, seq, value = kept_batch, kept_seq, source
            continue
        unsqueezed = _unsqueezed_axes(node)
        if unsqueezed is not None and not {batch, seq} & unsqueezed:
            # an inserted axis before B or S shifts it (GPT-BigCode: c_attn(x).unsqueeze(1))
            batch -= sum(1 for a in unsqueezed if a < batch)
            seq -= sum(1 for a in unsqueezed if a < seq)
            value = source
            continue
        scaled = _scaled_in_place(node)
        if scaled is not None:
            value = scaled  # Ministral 3 / Llama 4: the query scaled per position after RoPE
            continue
        if node.op_type in ("MatMul", "Add") and len(node.inputs) == 2:
            other = node.inputs[1]
            if node.op_type == "Add" and const_array(source) is not None and other is not None:
                source, other = other, source  # TorchScript's Linear writes Add(bias, x @ W)
            rank = value_rank(value)
            limit = 2 if node.op_type == "MatMul" else 1
            if (
                other is not None
                and const_array(other) is not None
                and value_rank(other) is not None
                and (value_rank(other) or 0) <= limit
                and rank is not None
                and max(batch, seq) < rank - 1
            ):
                value = source
                continue
        break
    return value, batch, seq


def _scaled_in_place(node: ir.Node) -> ir.Value | None:
    """``x`` of ``Mul(x, f)`` / ``Mul(f, x)`` / ``Div(x, f)`` when the factor broadcasts into x
    without growing it (each of its dims, aligned from the right, is 1 or provably x's own): the
    product has x's shape, so x's batch and sequence dims."""
    if node.op_type not in ("Mul", "Div") or len(node.inputs) != 2:
        return None
    orders = [(0, 1)] if node.op_type == "Div" else [(0, 1), (1, 0)]
    for kept, factor in orders:
        x, f = node.inputs[kept], node.inputs[factor]
        if x is None or f is None or x.shape is None or f.shape is None:
            continue
        if len(f.shape) > len(x.shape):
            continue
        offset = len(x.shape) - len(f.shape)
        if all(d == 1 or same_symbol(f, i, x, offset + i) for i, d in enumerate(f.shape)):
            return x
    return None


def _unsqueezed_axes(node: ir.Node) -> set[int] | None:
    """The output axes an Unsqueeze with constant axes inserts."""
    if node.op_type != "Unsqueeze":
        return None
    axes = axes_param(node, value_rank(node.outputs[0]))
    return None if axes is None or isinstance(axes, Mismatch) else set(axes)


def _selects_elsewhere(node: ir.Node, batch: int, seq: int) -> bool:
    """A Slice, Split, Gather or GatherND (constant indices, rank kept) along axes other than
    ``batch`` and ``seq``: the output keeps those dims, at the same positions."""
    rank = value_rank(node.inputs[0])
    if rank is None:
        return False
    if node.op_type == "Gather":
        index = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
        axis = node.attributes.get_int("axis", 0) % rank
        if index is not None and index.ndim == 0:  # the axis goes: only after B and S
            return axis > max(batch, seq)  # (Persimmon: q, k, v = view [B, S, H, 3, d][..., i, :])
        return index is not None and index.ndim == 1 and axis not in (batch, seq)
    if node.op_type == "GatherND" and len(node.inputs) > 1:
        # indices [n, 1]: n slices along axis 0 (dynamo's Falcon, heads moved first)
        index = const_array(node.inputs[1])
        return (
            index is not None
            and index.ndim == 2
            and index.shape[1] == 1
            and node.attributes.get_int("batch_dims", 0) == 0
            and 0 not in (batch, seq)
        )
    if node.op_type == "Slice" and len(node.inputs) >= 4:
        axes = const_array(node.inputs[3])
        return axes is not None and not {int(a) % rank for a in axes.reshape(-1)} & {batch, seq}
    if node.op_type == "Split":  # K and V as the halves of one projection (kv(x).chunk(2, -1))
        return node.attributes.get_int("axis", 0) % rank not in (batch, seq)
    return False


def _out_rank(value: ir.Value) -> int | None:
    """The rank of ``value``: from its shape, or the length of the Reshape target it comes from
    (or of the Expand target: fuse-attention's mask is Expanded to rank 4)."""
    rank = value_rank(value)
    reshape = value.producer()
    if rank is None and (is_op(reshape, "Reshape") or is_op(reshape, "Expand")):
        assert reshape is not None
        entries = target_entries(reshape.inputs[1])
        rank = None if entries is None else len(entries)
    return rank


@dataclass(frozen=True)
class _CausalMask:
    """The attention bias is ``Where(cond, allowed, masked)`` (through broadcasts) with ``cond``
    false wherever the key comes after the query, ``masked`` a constant at or below MASK_FLOOR and
    ``allowed`` constants above it."""

    masked: float
    # The Where itself when it is of rank 4: every layer's mask is the same Where, so the fix-up's
    # row flags read it (not the per-layer broadcast) and later layers reuse the first one's.
    source: ir.Value | None
    # Whether rows whose every key is masked need their mean of V back (see _emit_gqa): not when
    # every key after the query is -inf in the export (two masks whose sum overflows), where the
    # export's softmax of such a row already averages only the keys up to the query.
    fixup: bool = True


def _peel_broadcasts(value: ir.Value) -> ir.Value:
    while True:
        node = value.producer()
        if (is_op(node, "Expand") or is_op(node, "Identity")) and node is not None:
            if node.inputs[0] is None:
                return value
            value = node.inputs[0]
            continue
        return value


def _positions(
    value: ir.Value | None, axis: int, length_of: tuple[ir.Value, int]
) -> ir.Node | None:
    """``value`` = Unsqueeze(Range(0, n, 1)) of rank 4 with the range on ``axis``, where n is
    provably ``length_of``'s dim (the sequence): positions 0..n-1. Returns the Range."""
    unsqueeze = value.producer() if value is not None else None
    if not is_op(unsqueeze, "Unsqueeze") or unsqueeze is None:
        return None
    axes_array = const_array(unsqueeze.inputs[1]) if len(unsqueeze.inputs) > 1 else None
    axes = unsqueeze.attributes.get_ints("axes", None)
    if axes_array is not None:
        axes = [int(a) for a in axes_array.reshape(-1)]
    if axes is None or len(axes) != 3:
        return None
    kept = sorted(set(range(4)) - {a % 4 for a in axes})
    range_node = unsqueeze.inputs[0].producer() if unsqueeze.inputs[0] is not None else None
    if kept != [axis] or not is_op(range_node, "Range") or range_node is None:
        return None
    start, delta = const_array(range_node.inputs[0]), const_array(range_node.inputs[2])
    if start is None or delta is None or start.size != 1 or delta.size != 1:
        return None
    if float(start.reshape(-1)[0]) != 0 or float(delta.reshape(-1)[0]) != 1:
        return None
    read = scalar_dim_read(range_node.inputs[1])
    if read is None or not same_symbol(read[0], read[1], length_of[0], length_of[1]):
        return None
    return range_node


def _compares_positions(bias: ir.Value | None) -> bool:
    """A cheap look before the proof: the mask is a Where (or a sum of two) whose condition holds a
    LessOrEqual or GreaterOrEqual (the causal comparison of positions, if anything is) or a cut of
    a lower-triangular buffer, or a mask of numbers that holds one constant after each query."""
    if bias is not None and _compares_in_where(bias):
        return True
    return bias is not None and after_query(bias) is not None


def _compares_in_where(bias: ir.Value) -> bool:
    where = _peel_broadcasts(bias).producer()
    wheres = [where]
    if is_op(where, "Add") and where is not None:  # two masks added (GPT-Neo)
        wheres = [_peel_broadcasts(v).producer() for v in where.inputs if v is not None]
    pending = [w.inputs[0] for w in wheres if is_op(w, "Where") and w is not None]
    for _ in range(16):
        if not pending:
            return False
        cond = pending.pop()
        if cond is not None:
            cond = leading_axes_peeled(_peel_broadcasts(cond))
        node = cond.producer() if cond is not None else None
        if _non_strict_comparison(node) is not None:
            return True
        if cond is not None and _lower_triangular_cut(cond):
            return True
        if is_op(node, "And") and node is not None:
            pending.extend(v for v in node.inputs if v is not None)
    return False


def _lower_triangular_cut(cond: ir.Value) -> bool:
    """``cond`` is a constant lower-triangular buffer (true only at j <= i on its last two axes:
    GPT-2's and GPT-BigCode's ``bias`` of transformers 4.x) cut from row and column 0, through
    Slices on those two axes and leading Unsqueezes, so it is true only where the key is not after
    the query too."""
    value = leading_axes_peeled(cond)
    for _ in range(6):
        node = value.producer()
        rank = value_rank(value)
        if node is None or rank is None or rank < 2:
            break
        if not is_op(node, "Slice") or len(node.inputs) < 4 or node.inputs[0] is None:
            return False
        starts, axes = node.inputs[1], const_array(node.inputs[3])
        steps = const_array(node.inputs[4]) if len(node.inputs) > 4 else None
        if axes is None or axes.size != 1 or int(axes.reshape(-1)[0]) % rank < rank - 2:
            return False
        if (steps is not None and (steps != 1).any()) or not zero_start(starts):
            return False
        value = node.inputs[0]
    array = const_array(value)
    if array is None or array.ndim < 2 or array.dtype not in (np.bool_, np.uint8):
        return False
    after = np.triu(np.ones(array.shape[-2:], dtype=bool), 1)  # key j after query i
    return not bool(array[..., after].any())


def _non_strict_comparison(
    node: ir.Node | None,
) -> tuple[str, ir.Value | None, ir.Value | None] | None:
    """``LessOrEqual(a, b)`` or ``GreaterOrEqual(a, b)`` as (op, a, b); below opset 12, where
    neither exists, the exporter writes ``Not(Greater(a, b))`` and ``Not(Less(a, b))``, the same
    on the integer positions the caller proves a and b are."""
    if node is None:
        return None
    if is_op(node, "LessOrEqual") or is_op(node, "GreaterOrEqual"):
        return node.op_type, node.inputs[0], node.inputs[1]
    inner = producer_op(node.inputs[0], "Greater") or producer_op(node.inputs[0], "Less")
    if not is_op(node, "Not") or inner is None:
        return None
    op = "LessOrEqual" if inner.op_type == "Greater" else "GreaterOrEqual"
    return op, inner.inputs[0], inner.inputs[1]


def _is_causal(cond: ir.Value, sequence: tuple[ir.Value, int], depth: int = 0) -> bool:
    """``cond[.., i, j]`` implies ``j <= i``: an And with LessOrEqual(key_pos, query_pos), or a
    cut of a constant lower-triangular buffer."""
    cond = leading_axes_peeled(_peel_broadcasts(cond))
    node = cond.producer()
    if node is None or depth > 8:
        return False
    if _lower_triangular_cut(cond):
        return True
    if is_op(node, "And"):
        return any(v is not None and _is_causal(v, sequence, depth + 1) for v in node.inputs)
    comparison = _non_strict_comparison(node)
    if comparison is None:
        return False
    op, a, b = comparison
    key_pos, query_pos = (a, b) if op == "LessOrEqual" else (b, a)
    return (
        _positions(key_pos, 3, sequence) is not None
        and _positions(query_pos, 2, sequence) is not None
    )


def _causal_mask(bias: ir.Value | None, sequence: tuple[ir.Value, int]) -> _CausalMask | Mismatch:
    if bias is None:
        return Mismatch("there is no mask to prove causal")
    if _out_rank(bias) != 4:
        return Mismatch("the mask is not of rank 4")
    total = _peel_broadcasts(bias).producer()
    if is_op(total, "Add") and total is not None:
        return _summed_causal_masks(total, sequence)
    return _causal_where(bias, sequence)


def _summed_causal_masks(add: ir.Node, sequence: tuple[ir.Value, int]) -> _CausalMask | Mismatch:
    """Two masks added (GPT-Neo: its causal buffer's masked_fill, then the causal + padding mask):
    one provably causal, the other any ``Where(cond, allowed, masked)`` between constants whose
    masked value added to the first one's overflows to -inf. Every key after the query is then
    -inf in the export, so a row whose every key is masked averages only the keys up to the query
    there too, as causal=1 does: no fix-up."""
    first, second = (_peel_broadcasts(v) if v is not None else None for v in add.inputs)
    if first is None or second is None:
        return Mismatch("the mask is an Add without two inputs")
    problem = Mismatch("neither of the mask's two terms is provably causal")
    for causal_term, other in ((first, second), (second, first)):
        proof = _causal_where(causal_term, sequence)
        if isinstance(proof, Mismatch):
            continue
        found = _constant_where(other, "the mask's second term")
        if isinstance(found, Mismatch):
            problem = found
            continue
        cond, masked = found
        if not _keeps_diagonal(cond):
            # else a row could be -inf throughout (NaN in the export)
            problem = Mismatch(
                "the mask's second term is not provably allowing each query its own key (a Slice "
                "from 0 of a constant whose diagonal is all true)"
            )
            continue
        with np.errstate(over="ignore"):
            summed = np.float32(proof.masked) + np.float32(masked)
        if summed != -np.inf:
            problem = Mismatch(
                "the mask's two terms do not add to -inf where both mask: a fully masked row "
                "would average other keys than causal=1 does"
            )
            continue
        return _CausalMask(proof.masked, None, fixup=False)
    return problem


def _keeps_diagonal(cond: ir.Value | None) -> bool:
    """``cond[..., i, i]`` holds for every i: Slices from 0, step 1, on the last two axes of a
    constant whose diagonal is all true (GPT-Neo's causal or local-window buffer,
    ``bias[:, :, 0:S, 0:T]``)."""
    value = _peel_broadcasts(cond) if cond is not None else None
    for _ in range(4):
        node = value.producer() if value is not None else None
        if node is None:
            break
        rank = value_rank(node.inputs[0])
        if not is_op(node, "Slice") or rank is None or len(node.inputs) < 4:
            return False
        starts, axes = const_array(node.inputs[1]), const_array(node.inputs[3])
        steps = const_array(node.inputs[4]) if len(node.inputs) > 4 else None
        if starts is None or axes is None or (starts != 0).any():
            return False
        if steps is not None and (steps != 1).any():
            return False
        if not {int(a) % rank for a in axes.reshape(-1)} <= {rank - 2, rank - 1}:
            return False
        value = node.inputs[0]
    array = const_array(value) if value is not None else None
    if array is None or array.dtype != np.bool_ or array.ndim < 2:
        return False
    return bool(np.diagonal(array, axis1=-2, axis2=-1).all())


def _constant_where(value: ir.Value, what: str) -> tuple[ir.Value, float] | Mismatch:
    """``value`` = ``Where(cond, allowed, masked)`` through broadcasts, ``masked`` one constant and
    ``allowed`` constants that are finite and above MASK_FLOOR: (cond, masked)."""
    where = _peel_broadcasts(value).producer()
    if not is_op(where, "Where") or where is None:
        return Mismatch(f"{what} is not a Where between constants")
    cond, allowed, masked = where.inputs
    allowed_array, masked_array = const_array(allowed), const_array(masked)
    if cond is None or allowed_array is None or masked_array is None or masked_array.size != 1:
        return Mismatch(f"{what} is not a Where between constants")
    if not (np.isfinite(allowed_array).all() and (allowed_array > MASK_FLOOR).all()):
        return Mismatch(f"{what}'s allowed values are not finite and above the masked value")
    return cond, float(masked_array.reshape(-1)[0])


def _causal_values(bias: ir.Value, sequence: tuple[ir.Value, int]) -> _CausalMask | None:
    """The mask proved causal by its values (_causal_values.py: transformers 4.38-4.47's
    ``triu(full(min), 1) * (arange(T) > cache_position)`` with its padding filled in): every key
    after its query holds one constant <= MASK_FLOOR, every other value is that constant or a
    finite number above the floor, and the mask is the key sequence long (not broadcast along
    it)."""
    masked = after_query(bias)
    if masked is None or not (np.isfinite(masked) and masked <= MASK_FLOOR):
        return None
    values = value_set(bias)
    if values is None or any(not np.isfinite(v) or MASK_FLOOR >= v != masked for v in values):
        return None
    rank = value_rank(bias)
    if not rank or not same_symbol(bias, rank - 1, sequence[0], sequence[1]):
        return None
    mask = _peel_broadcasts(bias)
    return _CausalMask(masked, mask if value_rank(mask) == 4 else None)


def _causal_where(bias: ir.Value, sequence: tuple[ir.Value, int]) -> _CausalMask | Mismatch:
    found = _constant_where(bias, "the mask")
    if isinstance(found, Mismatch):
        return _causal_values(bias, sequence) or Mismatch(
            f"{found.reason}, nor a mask of numbers proved to hold one constant <= "
            f"{MASK_FLOOR:g} at every key after its query (_causal_values.py)"
        )
    cond, masked_value = found
    if not (np.isfinite(masked_value) and masked_value <= MASK_FLOOR):
        return Mismatch(
            f"the mask's masked value {masked_value:g} is not finite and <= {MASK_FLOOR:g}"
        )
    if not _is_causal(cond, sequence):
        return Mismatch(
            "the mask is not provably causal (And with LessOrEqual of key and query positions "
            "0..S-1); GroupQueryAttention runs with causal=0"
        )
    mask = _peel_broadcasts(bias)
    return _CausalMask(masked_value, mask if value_rank(mask) == 4 else None)


def _element_type(*values: ir.Value) -> ir.DataType | None:
    """The element type of the attention's inputs, read through the ops fused before this pass
    (RotaryEmbedding's output has no type until shapes are inferred again)."""
    for value in values:
        current: ir.Value | None = value
        for _ in range(8):
            if current is None:
                break
            if current.dtype is not None:
                return current.dtype
            producer = current.producer()
            current = producer.inputs[0] if producer is not None and producer.inputs else None
    return None


def _on_cuda(context: RewriteContext) -> Mismatch | None:
    """The float32 GroupQueryAttention this pass writes has no CUDA kernel."""
    if "cuda" not in context.options.ort_providers:
        return None
    return Mismatch(
        "GroupQueryAttention has no float32 CUDA kernel (ORT would run it on the CPU); the model "
        "is also for cuda (--ort-providers)"
    )


def _too_old(context: RewriteContext, causal: bool, sinks: bool = False) -> Mismatch | None:
    """Why the release the model is for cannot run the GroupQueryAttention this rule writes: every
    release before 1.30 is causal (no causal=0), and head_sink came in 1.23."""
    release = context.options.ort_version
    needed: tuple[Version, str] | None = None
    if not causal and release < GQA_CAUSAL_ATTRIBUTE:
        needed = GQA_CAUSAL_ATTRIBUTE, "GroupQueryAttention with causal=0"
    elif sinks and release < GQA_HEAD_SINK:
        needed = GQA_HEAD_SINK, "GroupQueryAttention's head_sink"
    if needed is None:
        return None
    return Mismatch(
        f"{needed[1]} needs ONNX Runtime {format_version(needed[0])}; the model is for "
        f"{format_version(release)} (--ort-version)"
    )


def _match(node: ir.Node, context: RewriteContext, causal: bool) -> Match | Mismatch:
    if context.options.target != "ort":
        return Mismatch("GroupQueryAttention is an ONNX Runtime op (--target ort only)", False)
    too_old = _too_old(context, causal)
    if too_old is not None:
        return too_old
    allowed = {"num_heads", "scale"}
    if set(node.attributes) - allowed:
        extra = ", ".join(sorted(set(node.attributes) - allowed))
        return Mismatch(f"MultiHeadAttention has attributes GroupQueryAttention lacks ({extra})")
    inputs = list(node.inputs) + [None] * (8 - len(node.inputs))
    if any(v is not None for i, v in enumerate(inputs) if i not in (0, 1, 2, _ATTENTION_BIAS)):
        return Mismatch("MultiHeadAttention has a bias, key padding mask or past state")
    query, key, value = inputs[0], inputs[1], inputs[2]
    heads = node.attributes.get_int("num_heads", 0)
    if query is None or key is None or value is None or heads <= 0:
        return Mismatch("MultiHeadAttention without query, key or value")
    dtype = _element_type(query, key, value)
    if dtype is not None and dtype != ir.DataType.FLOAT:
        # ORT CPU runs it in float16 too, but the CUDA kernel (float16/bfloat16 only) is always
        # causal and refuses attention_bias: the rewrite would break where such models run.
        return Mismatch(
            f"attention in {dtype.name}: only float32 is rewritten (GroupQueryAttention's "
            "CUDA kernel, where half-precision models run, is always causal and takes no "
            "attention_bias)"
        )
    repeated = _is_repeat(key) or _is_repeat(value)
    if not repeated and (not causal or not _compares_positions(inputs[_ATTENTION_BIAS])):
        # plain K/V heads (BERT, a UNet's cross-attention) without a causal-looking mask:
        # MultiHeadAttention or packed Attention is as fast, and not worth an --explain line
        # per block
        return Mismatch("K/V are not a repeat_kv expansion", candidate=False)
    on_cuda = _on_cuda(context)
    if on_cuda is not None:
        return on_cuda
    pair = _grouped_kv(node, key, value, heads) if repeated else _plain_kv(query, key, value, heads)
    if isinstance(pair, Mismatch):
        return pair
    grouped_k, grouped_v = pair
    if (grouped_k.kv_heads, grouped_k.head_size) != (grouped_v.kv_heads, grouped_v.head_size):
        return Mismatch("K and V have different head counts or sizes")
    if _out_rank(query) != 3:
        return Mismatch("the query is not [B, S, H*d]")
    origins = [
        _origin(query, 0, 1),
        _origin(grouped_k.source, 0, 2 if value_rank(grouped_k.source) == 4 else 1),
        _origin(grouped_v.source, 0, 2 if value_rank(grouped_v.source) == 4 else 1),
    ]
    if any(o[0] is not origins[0][0] or o[1:] != origins[0][1:] for o in origins[1:]):
        return Mismatch(
            "cannot prove the query, key and value come from one sequence (GroupQueryAttention "
            "without a past cache needs the key as long as the query)"
        )
    packed = _packed_qkv(node, query, grouped_k, grouped_v, heads)
    # the driver drops those left without users, last to first: producers before their users
    nodes = [] if packed is None else [packed.split, *packed.views, *packed.shape_reads]
    nodes += [*grouped_k.nodes, *grouped_k.shape_reads, *grouped_v.nodes, *grouped_v.shape_reads]
    bindings = {
        "key": grouped_k,
        "value": grouped_v,
        "heads": heads,
        "causal": None,
        "packed": packed,
    }
    if causal:
        # The sequence's dims are the origin's axis 1 (query and key proved to share it).
        proof = _causal_mask(inputs[_ATTENTION_BIAS], (origins[0][0], origins[0][2]))
        if isinstance(proof, Mismatch):
            return proof
        bindings["causal"] = proof
    # Each chain is in graph order, so the driver drops consumers before their producers.
    return Match([*nodes, node], bindings)


def _grouped_kv(
    attention: ir.Node, key: ir.Value, value: ir.Value, heads: int
) -> tuple[_Grouped, _Grouped] | Mismatch:
    """K and V as repeat_kv expansions of their Nkv heads, with their other Shape reads."""
    grouped_k = _repeated_kv(key, heads)
    if isinstance(grouped_k, Mismatch):
        return grouped_k
    grouped_v = _repeated_kv(value, heads)
    if isinstance(grouped_v, Mismatch):
        return grouped_v
    reads_k, reads_v = _shape_reads(key, attention), _shape_reads(value, attention)
    if isinstance(reads_k, Mismatch):
        return reads_k
    if isinstance(reads_v, Mismatch):
        return reads_v
    return (
        dataclasses.replace(grouped_k, shape_reads=reads_k),
        dataclasses.replace(grouped_v, shape_reads=reads_v),
    )


def _plain_kv(
    query: ir.Value, key: ir.Value, value: ir.Value, heads: int
) -> tuple[_Grouped, _Grouped] | Mismatch:
    """K and V with all H heads, as MultiHeadAttention takes them ([B, T, H*d], or [B, H, T, d]
    after a rotary in that layout, GPT-NeoX), as GroupQueryAttention operands with kv_num_heads =
    num_heads; the query [B, S, H*d]."""
    width = static_dim(query, 2) if value_rank(query) == 3 else None
    if width is None or width % heads:
        return Mismatch("the query is not [B, S, H*d] with a static width")
    head_size = width // heads
    for side in (key, value):
        rank = value_rank(side)
        fits = (rank == 3 and static_dim(side, 2) == width) or (
            rank == 4 and static_dim(side, 1) == heads and static_dim(side, 3) == head_size
        )
        if not fits:
            return Mismatch(f"K/V are neither [B, T, {width}] nor [B, {heads}, T, {head_size}]")
    if head_size % 8:
        return Mismatch(
            f"head size {head_size}: ONNX Runtime's GroupQueryAttention needs a multiple of 8"
        )
    return _Grouped(key, heads, head_size, ()), _Grouped(value, heads, head_size, ())


@dataclass(frozen=True)
class _PackedQkv:
    """Q, K and V as the three parts of one [B, S, (H + 2*Nkv)*d] tensor (GPT-2's c_attn + Split,
    GPT-BigCode's multi-query c_attn): GroupQueryAttention reads that tensor whole (its packed-QKV
    form), so the Split goes."""

    source: ir.Value
    split: ir.Node
    views: tuple[ir.Node, ...]  # from the parts to Q and the K/V sources, producers first
    shape_reads: tuple[ir.Node, ...]  # Shape reads of B / S of the parts, moved to the source


_VIEWS = ("Reshape", "Unsqueeze", "Squeeze")


def _view_chain(value: ir.Value) -> tuple[ir.Value, list[ir.Node]]:
    """``value`` followed back through views (Reshape, Unsqueeze, Squeeze: the same elements in
    the same order): where it starts, and the views, producers first."""
    chain: list[ir.Node] = []
    for _ in range(8):
        node = value.producer()
        if node is None or node.op_type not in _VIEWS or node.domain not in ONNX_DOMAINS:
            break
        if node.inputs[0] is None:
            break
        chain.insert(0, node)
        value = node.inputs[0]
    return value, chain


def _token_major(side: _Grouped) -> tuple[ir.Value, list[ir.Node]]:
    """What holds ``side``'s Nkv heads in the packed tensor's element order, [.., T, Nkv*d], and
    the ops from it to ``side.source``: views, and the Transpose of a [B, T, Nkv, d] head split
    when the source is [B, Nkv, T, d] with several heads (one head needs no Transpose)."""
    source = side.source
    moved: list[ir.Node] = []
    if value_rank(source) == 4 and side.kv_heads > 1:
        transpose = source.producer()
        if transpose is None or transpose_perm(transpose) != [0, 2, 1, 3]:
            return source, []
        assert transpose.inputs[0] is not None
        source, moved = transpose.inputs[0], [transpose]
    start, views = _view_chain(source)
    return start, [*views, *moved]


def _packed_qkv(
    attention: ir.Node, query: ir.Value, key: _Grouped, value: _Grouped, heads: int
) -> _PackedQkv | None:
    """Q, K and V read, through views, out of one Split of a [B, S, (H + 2*Nkv)*d] tensor along
    its last axis (the one-sequence proof has shown they share B and S)."""
    part, views = _view_chain(query)
    split = part.producer()
    if not is_op(split, "Split") or split is None or split.inputs[0] is None:
        return None
    parts = list(split.outputs)
    if len(parts) != 3 or parts[0] is not part:
        return None
    for side, expected_part in ((key, parts[1]), (value, parts[2])):
        origin, ops = _token_major(side)
        if origin is not expected_part:
            return None
        views += ops
    rank = value_rank(split.inputs[0])
    if rank is None or split.attributes.get_int("axis", 0) % rank != rank - 1:
        return None
    # the packed operand: the split tensor itself when it is [B, S, W], else the [B, S, W] it
    # is a view of (GPT-BigCode splits c_attn(x).unsqueeze(1))
    source = split.inputs[0]
    if value_rank(source) != 3:
        source, _ = _view_chain(source)
    d, kv_heads = key.head_size, key.kv_heads
    total = last_dim(split.inputs[0])
    if value_rank(source) != 3 or total is None or last_dim(source) != total:
        return None
    expected = [heads * d, kv_heads * d, kv_heads * d]
    sizes = _int_list(split, "split", 1)
    if sizes is None and split.attributes.get_int("num_outputs", 3) == 3 and kv_heads == heads:
        sizes = [total // 3] * 3
    if sizes != expected:
        return None
    reads: list[ir.Node] = []
    for part in parts:
        if part.is_graph_output():
            return None
        for use in part.uses():
            user = use.node
            if user is attention or (user.op_type in (*_VIEWS, "Transpose") and part is not query):
                continue  # the views to the attention (dropped when it goes)
            start = user.attributes.get_int("start", 0) if is_op(user, "Shape") else -1
            end = user.attributes.get_int("end", 3) if is_op(user, "Shape") else 3
            if value_rank(part) != 3 or not 0 <= start < end <= 2:
                return None  # only B and S: the same in the packed tensor
            reads.append(user)
    return _PackedQkv(source, split, tuple(views), tuple(reads))


def _as_three_d(tape: ir.tape.Tape, value: ir.Value) -> ir.Value:
    """[B, N, T, d] as [B, T, N*d]: the tensor it was split from when there is one."""
    transpose = value.producer()
    perm = transpose_perm(transpose)
    if perm == [0, 2, 1, 3]:
        assert transpose is not None
        split = reshape_to_heads(transpose.inputs[0])
        if split is not None:
            return split[0]
    moved = value
    if perm is not None and len(perm) == 4 and transpose is not None:
        # Transpose(Transpose(x, p), [0,2,1,3]) is one Transpose of x (none if it cancels): a
        # later run's merge-consecutive-ops would fold the pair, so the output is a fixed point.
        composed = [perm[i] for i in (0, 2, 1, 3)]
        source = transpose.inputs[0]
        assert source is not None
        moved = source
        if composed != [0, 1, 2, 3]:
            moved = tape.op("Transpose", [source], {"perm": composed})
    else:
        moved = tape.op("Transpose", [value], {"perm": [0, 2, 1, 3]})
    return tape.op("Reshape", [moved, int64_const(tape, [0, 0, -1])])


def _rewrite(match: Match, context: RewriteContext) -> Replacement:
    attention = match.root
    key: _Grouped = match.bindings["key"]
    value: _Grouped = match.bindings["value"]
    tape = ir.tape.Tape()
    packed: _PackedQkv | None = match.bindings["packed"]
    query: ir.Value | None = attention.inputs[0]
    key3: ir.Value | None = None
    value3: ir.Value | None = None
    moved: list[tuple[ir.Value, ir.Value]] = []
    if packed is not None:
        query = packed.source
        moved = _reread(tape, packed.shape_reads, packed.source)
    else:
        key3 = _kv_three_d(tape, key)
        value3 = _kv_three_d(tape, value)
    bias = attention.inputs[_ATTENTION_BIAS] if len(attention.inputs) > _ATTENTION_BIAS else None
    if "scale" in attention.attributes:
        scale = attention.attributes.get_float("scale", 0.0)
    else:  # MultiHeadAttention's default, written out: GroupQueryAttention's is the same today
        scale = float(key.head_size**-0.5)
    assert query is not None
    result = _emit_gqa(
        tape,
        context,
        attention,
        (query, key3, value3, bias),
        match.bindings,
        scale,
    )
    moved = [(attention.outputs[0], result), *_moved_shape_reads(tape, key, value), *moved]
    return Replacement(tape.nodes, moved)


def _moved_shape_reads(
    tape: ir.tape.Tape, key: _Grouped, value: _Grouped
) -> list[tuple[ir.Value, ir.Value]]:
    # B, T and d are the same in the source
    return [
        *_reread(tape, key.shape_reads, key.source),
        *_reread(tape, value.shape_reads, value.source),
    ]


def _reread(
    tape: ir.tape.Tape, reads: tuple[ir.Node, ...], source: ir.Value
) -> list[tuple[ir.Value, ir.Value]]:
    """Each Shape read in ``reads``, the same dims read off ``source`` instead."""
    moved = []
    for read in reads:
        attrs = {k: a.value for k, a in read.attributes.items()}
        moved.append((read.outputs[0], tape.op("Shape", [source], attrs)))
    return moved


def _emit_gqa(
    tape: ir.tape.Tape,
    context: RewriteContext,
    anchor: ir.Node,
    operands: tuple[ir.Value, ir.Value | None, ir.Value | None, ir.Value | None],
    bindings: dict[str, Any],
    scale: float,
    softcap: float = 0.0,
    sinks: np.ndarray | None = None,
) -> ir.Value:
    """GroupQueryAttention(query [B, S, H*d], key3/value3 [B, T, Nkv*d], attention_bias=bias,
    head_sink=sinks) and, for causal=1 without sinks, the fix-up of fully masked rows; its
    [B, S, H*d] result. Without key3 and value3 the query is packed, [B, S, (H + 2*Nkv)*d]. With
    sinks a row whose every key is masked gives zeros in the export (the sink takes the whole row)
    and in the kernel, causal or not (scripts/sink_kernel_check.py)."""
    query, key3, value3, bias = operands
    key: _Grouped = bindings["key"]
    opset = context.opset()
    sequence = key3 if key3 is not None else query  # packed: the key is as long as the query
    total64 = seq_len(tape, sequence, 1, opset)
    total1 = tape.op("Cast", [total64], {"to": int(ir.DataType.INT32)})
    one = tape.op("Constant", [], {"value": ir.tensor([1], dtype=ir.DataType.INT32)})
    last = tape.op("Sub", [total1, one])
    batch = seq_len(tape, sequence, 0, opset)
    seqlens_k = tape.op("Expand", [last, batch])
    total = tape.op("Reshape", [total1, int64_const(tape, [])])
    inputs: list[ir.Value | None] = [query, key3, value3, None, None]
    inputs += [seqlens_k, total]
    if bias is not None or sinks is not None:
        inputs += [None, None, None, bias]
    if sinks is not None:
        inputs.append(tape.op("Constant", [], {"value": ir.tensor(sinks)}))
    causal: _CausalMask | None = bindings["causal"]
    heads: int = bindings["heads"]
    release = context.options.ort_version
    attributes: dict[str, int | float] = {"num_heads": heads, "kv_num_heads": key.kv_heads}
    if release >= GQA_CAUSAL_ATTRIBUTE:
        attributes["causal"] = int(causal is not None)
    else:  # every older release is causal and has no such attribute (_too_old)
        assert causal is not None
    attributes["scale"] = scale
    if softcap:
        attributes["softcap"] = softcap
    # Before 1.29 the present_key / present_value outputs are required (they go unread here).
    count = 1 if release >= GQA_WITHOUT_PRESENT else 3
    result = tape.op_multi_out(
        "GroupQueryAttention", inputs, attributes, num_outputs=count, domain=MS_DOMAIN
    )[0]
    if causal is not None and sinks is None and causal.fixup:
        assert bias is not None
        mask = causal.source or bias
        # One flag per (batch, query) when the mask has one head: the fix-up then works on
        # [B, S, H*d] as it is, with no head split (V's mean, [B, 1, Nkv*d], is spread over
        # the query heads instead).
        per_row = static_dim(mask, 1) == 1
        steps = 3 if per_row else 4
        flags = _existing_row_flags(causal.source, anchor, context, steps)
        if flags is None:
            flags = _row_flags(tape, mask, opset, steps)
        if value3 is None:  # packed: V's mean is the last part of the packed tensor's mean
            d = key.head_size
            mean = _mean_over_keys(tape, mask, query, opset)
            first = (heads + key.kv_heads) * d
            mean = _slice_last_axis(tape, mean, first, first + key.kv_heads * d, opset)
        else:
            mean = _mean_over_keys(tape, mask, value3, opset)
        if per_row:
            mean = _mean_per_query_head(tape, mean, key, heads)
            result = tape.op("Where", [flags, mean, result])
        else:
            result = _average_fully_masked_rows(tape, result, flags, mean, key, heads)
    return result


# The float32 just above MASK_FLOOR: ``x <= MASK_FLOOR`` is ``x < _FLOOR_LESS_THAN`` for float32 x.
_FLOOR_LESS_THAN = np.nextafter(np.float32(MASK_FLOOR), np.float32(np.inf))


def _row_flags(tape: ir.tape.Tape, mask: ir.Value, opset: int, steps: int = 4) -> ir.Value:
    """Whether every key of a query row is masked, from the rank-4 mask [b, h, S, T]: [b, S, h, 1]
    (``steps`` 4), or [b, S, h] (3; [b, S, 1] for a mask with one head)."""
    row_max = with_axes(tape, "ReduceMax", mask, [3], opset, {"keepdims": 0})  # [b, h, S]
    if opset >= 12:
        floor = tape.op("Constant", [], {"value": ir.tensor(np.array(MASK_FLOOR, np.float32))})
        masked = tape.op("LessOrEqual", [row_max, floor])
    else:  # no LessOrEqual before opset 12: x <= f is x < the next float32 after f (NaN: false)
        above = tape.op("Constant", [], {"value": ir.tensor(_FLOOR_LESS_THAN)})
        masked = tape.op("Less", [row_max, above])
    masked = tape.op("Transpose", [masked], {"perm": [0, 2, 1]})
    if steps == 3:
        return masked
    return with_axes(tape, "Unsqueeze", masked, [3], opset)


def _int_list(node: ir.Node, name: str, input_index: int) -> list[int] | None:
    """An int-list parameter given as attribute (older opsets) or constant input."""
    if len(node.inputs) > input_index and node.inputs[input_index] is not None:
        array = const_array(node.inputs[input_index])
        return None if array is None else [int(x) for x in array.reshape(-1)]
    attr = node.attributes.get_ints(name, None)
    return None if attr is None else list(attr)


def _is_row_flag_step(node: ir.Node, step: int) -> bool:
    """Whether ``node`` is step ``step`` of what :func:`_row_flags` builds (0: the ReduceMax)."""
    if step == 0:
        return (
            is_op(node, "ReduceMax")
            and node.attributes.get_int("keepdims", 1) == 0
            and _int_list(node, "axes", 1) == [3]
        )
    if step == 1:
        floor = float(np.float32(MASK_FLOOR))  # as _row_flags stores it
        return (is_op(node, "LessOrEqual") and is_scalar_constant(node.inputs[1], floor)) or (
            is_op(node, "Less") and is_scalar_constant(node.inputs[1], float(_FLOOR_LESS_THAN))
        )
    if step == 2:
        return transpose_perm(node) == [0, 2, 1]
    return is_op(node, "Unsqueeze") and _int_list(node, "axes", 1) == [3]


def _existing_row_flags(
    mask: ir.Value | None, attention: ir.Node, context: RewriteContext, steps: int = 4
) -> ir.Value | None:
    """The row flags an earlier layer's rewrite computed from the same mask, if any (before
    ``attention`` in the graph: rewrites run in graph order, each inserting before its root)."""
    if mask is None:
        return None
    position = {id(n): i for i, n in enumerate(context.graph)}
    for use in mask.uses():
        node: ir.Node | None = use.node
        assert node is not None
        if use.idx != 0 or position.get(id(node), 1 << 62) > position[id(attention)]:
            continue
        for step in range(steps):
            if node is None or not _is_row_flag_step(node, step):
                node = None
                break
            if step < steps - 1:
                users = [u.node for u in node.outputs[0].uses()]
                node = (
                    users[0] if len(users) == 1 and users[0].inputs[0] is node.outputs[0] else None
                )
        if node is not None:
            return node.outputs[0]
    return None


def _mean_per_query_head(
    tape: ir.tape.Tape, mean: ir.Value, kv: _Grouped, heads: int, split: bool = False
) -> ir.Value:
    """V's mean [B, 1, Nkv*d] laid out as the output's [B, 1, H*d] (``split``: [B, 1, H, d]):
    each K/V head's part repeated for its rep query heads (heads h*rep .. h*rep+rep-1 read K/V
    head h), one Gather along the last axis (a copy, exact)."""
    rep, d = heads // kv.kv_heads, kv.head_size
    if rep > 1:
        # query head q reads K/V head q // rep: output column q*d + j is input column (q//rep)*d + j
        columns = (np.arange(heads)[:, None] // rep * d + np.arange(d)[None, :]).reshape(-1)
        mean = tape.op("Gather", [mean, int64_const(tape, columns.tolist())], {"axis": 2})
    if split:
        return tape.op("Reshape", [mean, int64_const(tape, [0, 1, heads, d])])
    return mean


def _average_fully_masked_rows(
    tape: ir.tape.Tape,
    output: ir.Value,
    masked: ir.Value,
    mean: ir.Value,
    kv: _Grouped,
    heads: int,
) -> ir.Value:
    """Rows whose every key is masked: the export's softmax is uniform there (each score is the
    masked constant), so it gives the mean of V over all keys; causal=1 would average only the
    keys up to the query. Put the mean back: Where(rowmax(bias) <= floor, mean(V), output), with
    ``mean`` V's mean over the keys, [B, 1, Nkv*d], and ``masked`` the flags per head."""
    d = kv.head_size
    mean = _mean_per_query_head(tape, mean, kv, heads, split=True)  # [B, 1, H, d]
    split = tape.op("Reshape", [output, int64_const(tape, [0, 0, heads, d])])
    fixed = tape.op("Where", [masked, mean, split])
    return tape.op("Reshape", [fixed, int64_const(tape, [0, 0, heads * d])])


def _mean_over_keys(tape: ir.tape.Tape, mask: ir.Value, values: ir.Value, opset: int) -> ir.Value:
    """The mean of ``values`` [B, T, W] over its T keys, [B, 1, W], as MatMul([1/T] * T, values).

    The keys' count is the mask's last dim (its key positions, proved 0..T-1), so the [1, 1, T]
    row of 1/T is built from the mask every layer shares and common-subexpression elimination
    leaves one. ORT 1.32 CPU's ReduceMean over axis 1 cost about as much per layer (0.36 ms of
    CPU at [1, 128, 2304]) as GroupQueryAttention saves over packed Attention; the MatMul, 0.05.
    """
    count = seq_len(tape, mask, 3, opset)  # [1] int64
    inverse = tape.op("Reciprocal", [tape.op("Cast", [count], {"to": int(ir.DataType.FLOAT)})])
    row_shape = tape.op("Concat", [int64_const(tape, [1, 1]), count], {"axis": 0})
    row = tape.op("Expand", [inverse, row_shape])  # [1, 1, T]
    return tape.op("MatMul", [row, values])


def _slice_last_axis(
    tape: ir.tape.Tape, value: ir.Value, start: int, end: int, opset: int
) -> ir.Value:
    """``value[:, :, start:end]`` of a rank-3 tensor."""
    if opset >= 10:
        bounds = [int64_const(tape, [n]) for n in (start, end, 2)]
        return tape.op("Slice", [value, *bounds])
    return tape.op("Slice", [value], {"starts": [start], "ends": [end], "axes": [2]})


def causal_gqa_match(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """Whether ``mha->gqa-causal`` takes this MultiHeadAttention (fuse-packed-attention leaves
    such blocks to it when both run)."""
    return _match(node, context, causal=True)


def _match_any_mask(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    return _match(node, context, causal=False)


# --- soft-capped attention (Gemma2) ---------------------------------------------------------------
# fuse-attention leaves blocks whose scores are soft-capped, tanh(s / c) * c, unfused
# (MultiHeadAttention and the packed Attention have no softcap); GroupQueryAttention has one,
# applied where Gemma2 applies it: to the scaled Q@K^T, before attention_bias is added
# (scripts/softcap_kernel_check.py, ORT 1.32 CPU: 1e-6 of a float32 numpy reference with a
# finite random bias, 0.45 off the mask-first order). So such a block becomes GroupQueryAttention
# directly, here, where the fused RotaryEmbedding lets _origin prove Q and K one sequence.


def _is_repeat(value: ir.Value | None) -> bool:
    reshape = value.producer() if value is not None else None
    source = reshape.inputs[0] if is_op(reshape, "Reshape") and reshape is not None else None
    return source is not None and is_op(source.producer(), "Expand")


def _kv_of_block(side: Any, heads: int, fused: frozenset[int]) -> _Grouped | Mismatch:
    """K or V of a matched block (fuse-attention's _Heads) as GroupQueryAttention's K/V heads:
    the repeat_kv source, or the operand itself when it has all H heads."""
    if _is_repeat(side.four_d):
        grouped = _repeated_kv(side.four_d, heads)
        if isinstance(grouped, Mismatch):
            return grouped
        reads = _shape_reads(side.four_d, grouped.nodes[-1], fused)
        if isinstance(reads, Mismatch):
            return reads
        return dataclasses.replace(grouped, shape_reads=reads)
    source = side.four_d if side.four_d is not None else side.three_d
    if source is None:
        return Mismatch("K/V are known only as [B, T, H, d] rows, not as GroupQueryAttention's K/V")
    if side.head_size is None:
        return Mismatch("the K/V head size is unknown")
    if side.head_size % 8:
        return Mismatch(
            f"head size {side.head_size}: ONNX Runtime's GroupQueryAttention needs a multiple of 8"
        )
    if side.heads is not None and side.heads != heads:
        return Mismatch(f"K/V have {side.heads} heads, not repeated to the {heads} query heads")
    return _Grouped(source, heads, side.head_size, ())


def _kv_three_d(tape: ir.tape.Tape, grouped: _Grouped) -> ir.Value:
    if value_rank(grouped.source) == 3:
        return grouped.source
    one_head = producer_of(grouped.source, "Unsqueeze")
    if grouped.kv_heads == 1 and one_head is not None and one_head.inputs[0] is not None:
        # [B, 1, T, d] = Unsqueeze(x [B, T, d], 1): x is the [B, T, 1*d] operand itself
        axes = axes_param(one_head, 4)
        if value_rank(one_head.inputs[0]) == 3 and axes == (1,):
            return one_head.inputs[0]
    return _as_three_d(tape, grouped.source)


def _block_at(
    softmax: ir.Node, context: RewriteContext, present: Callable[[ir.Node], bool], absent: str
) -> Match | Mismatch:
    """fuse-attention's match of the block at ``softmax``, for the rules of one kind of block
    (``present``: its cheap pre-check; ``absent``: the reason when the Softmax is not of it)."""
    if context.options.target != "ort":
        return Mismatch("GroupQueryAttention is an ONNX Runtime op (--target ort only)", False)
    if not present(softmax):
        return Mismatch(absent, False)
    found = match_attention_block(softmax, context)
    if isinstance(found, Mismatch):  # fuse-attention's rule says why
        return Mismatch(found.reason, candidate=False)
    return found


_NOT_CAPPED = "the scores are not soft-capped (fuse-attention's case)"
_NO_SINKS = "no attention sinks (fuse-attention's case)"


def _match_softcap(softmax: ir.Node, context: RewriteContext, causal: bool) -> Match | Mismatch:
    found = _block_at(softmax, context, has_soft_cap, _NOT_CAPPED)
    if isinstance(found, Mismatch):
        return found
    block: AttentionBlock = found.bindings["block"]
    if not block.softcap:
        return Mismatch(_NOT_CAPPED, False)
    cap = f"{block.softcap:g}"
    problem = _grouped_block(block, found.bindings["heads"], found, context, causal)
    if isinstance(problem, Mismatch):
        return Mismatch(
            f"soft-capped scores (tanh(s / {cap}) * {cap}): only GroupQueryAttention has "
            f"softcap, and {problem.reason}"
        )
    return problem


def _match_sinks(softmax: ir.Node, context: RewriteContext, causal: bool) -> Match | Mismatch:
    found = _block_at(softmax, context, has_sinks, _NO_SINKS)
    if isinstance(found, Mismatch):
        return found
    block: AttentionBlock = found.bindings["block"]
    if block.sinks is None:
        return Mismatch(_NO_SINKS, False)
    if block.softcap:  # GroupQueryAttention(softcap) measured slower: opt-in, sinks and all
        return Mismatch("soft-capped scores: left to the opt-in fuse-softcap-attention", False)
    problem = _grouped_block(block, found.bindings["heads"], found, context, causal)
    if isinstance(problem, Mismatch) and not causal:  # the causal rule says why not causal=1
        return Mismatch(
            f"attention sinks: only GroupQueryAttention has them (head_sink), and {problem.reason}"
        )
    return problem


def _grouped_block(
    block: AttentionBlock, heads: int, found: Match, context: RewriteContext, causal: bool
) -> Match | Mismatch:
    """A block fuse-attention matched (``found``) as GroupQueryAttention's: K/V heads, Q/K/V of
    one sequence and, for ``causal``, a provably causal mask; else why not."""
    too_old = _too_old(context, causal, block.sinks is not None)
    if too_old is not None:
        return too_old
    sides = (block.key.four_d, block.key.three_d)
    dtype = _element_type(block.output, *(v for v in sides if v is not None))
    if dtype is not None and dtype != ir.DataType.FLOAT:
        return Mismatch(f"attention in {dtype.name}: only float32 is rewritten")
    on_cuda = _on_cuda(context)
    if on_cuda is not None:
        return on_cuda
    if block.kv_repeat > 1:
        return Mismatch("K/V of one head broadcast against the query heads are not handled")
    fused = frozenset(id(node) for node in found.nodes)
    key = _kv_of_block(block.key, heads, fused)
    if isinstance(key, Mismatch):
        return key
    value = _kv_of_block(block.value, heads, fused)
    if isinstance(value, Mismatch):
        return value
    if (key.kv_heads, key.head_size) != (value.kv_heads, value.head_size):
        return Mismatch("K and V have different head counts or sizes")
    query = block.query.three_d or block.query.four_d
    assert query is not None
    origins = [
        _origin(side, 0, 1 if value_rank(side) == 3 else 2)
        for side in (query, key.source, value.source)
    ]
    if any(o[0] is not origins[0][0] or o[1:] != origins[0][1:] for o in origins[1:]):
        return Mismatch(
            "cannot prove the query, key and value come from one sequence (GroupQueryAttention "
            "without a past cache needs the key as long as the query)"
        )
    proof: _CausalMask | Mismatch | None = None
    if causal:
        if (
            block.more_bias
            or block.fills
            or block.flat_terms
            or block.window_terms
            or block.view_terms
        ):
            return Mismatch("the scores get several additive terms; causal=1 is not proved")
        proof = _causal_mask(block.bias, (origins[0][0], origins[0][2]))
        if isinstance(proof, Mismatch):
            return proof
    group_nodes = [*key.nodes, *key.shape_reads, *value.nodes, *value.shape_reads]
    bindings = {
        "block": block,
        "heads": heads,
        "key": key,
        "value": value,
        "causal": proof,
        "softmax": found.bindings.get("softmax"),
    }
    return Match([*group_nodes, *found.nodes], bindings, anchor=found.anchor)


def _rewrite_block(match: Match, context: RewriteContext) -> Replacement:
    """GroupQueryAttention for a block fuse-attention matched, with its softcap and sinks."""
    block: AttentionBlock = match.bindings["block"]
    heads: int = match.bindings["heads"]
    key: _Grouped = match.bindings["key"]
    value: _Grouped = match.bindings["value"]
    tape = ir.tape.Tape()
    opset = context.opset()
    key3, value3 = _kv_three_d(tape, key), _kv_three_d(tape, value)
    query, factor = attention_query(tape, block)
    bias = attention_bias(tape, block, heads, opset, query, key3, 1)
    result = _emit_gqa(
        tape,
        context,
        match.bindings["softmax"],
        (query, key3, value3, bias),
        match.bindings,
        block.scale * factor,
        block.softcap,
        block.sinks,
    )
    moved = _moved_shape_reads(tape, key, value)
    return finish_attention(tape, block, heads, opset, result, query, moved)


def _match_newer_form(node: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """A GroupQueryAttention already in the model (written for a newer release) in a form the
    release the model is for refuses, where an equivalent older form exists."""
    release = context.options.ort_version
    if context.options.target != "ort" or release >= GQA_CAUSAL_ATTRIBUTE:
        return Mismatch("the release the model is for runs every form", False)
    too_old = _too_old(context, node.attributes.get_int("causal", 1) == 1, has_head_sink(node))
    if too_old is not None:  # causal=0, or head_sink before 1.23: no older form
        return too_old
    present = release >= GQA_WITHOUT_PRESENT or len(node.outputs) >= 3
    if "causal" not in node.attributes and present:
        return Mismatch("GroupQueryAttention already in its older form", False)
    return Match([node], {})


def _rewrite_newer_form(match: Match, context: RewriteContext) -> Replacement:
    """The same GroupQueryAttention without ``causal=1`` (every release before 1.30 is causal),
    and with present_key / present_value outputs, unread, where the release requires them."""
    node = match.root
    attributes = {k: a.value for k, a in node.attributes.items() if k != "causal"}
    count = len(node.outputs)
    if context.options.ort_version < GQA_WITHOUT_PRESENT:
        count = max(count, 3)
    tape = ir.tape.Tape()
    outputs = tape.op_multi_out(
        "GroupQueryAttention", list(node.inputs), attributes, num_outputs=count, domain=MS_DOMAIN
    )
    for old, fresh in zip(node.outputs, outputs, strict=False):
        fresh.type, fresh.shape = old.type, old.shape
    return Replacement(tape.nodes, list(zip(node.outputs, outputs, strict=False)))


# A model optimized before for ORT 1.30 or newer, optimized again for an older release
# (--ort-version): its causal GroupQueryAttention is written as that release reads it.
OLDER_FORM_RULE = Rule(
    "gqa->gqa-for-older-release",
    "GroupQueryAttention",
    _match_newer_form,
    _rewrite_newer_form,
    domain=MS_DOMAIN,
)


# Tried in order: causal=1 (with the fully-masked-row fix-up) where the mask is provably causal,
# else causal=0 (the mask alone decides, exactly as in MultiHeadAttention).
GQA_RULES = (
    Rule("mha->gqa-causal", "MultiHeadAttention", causal_gqa_match, _rewrite, domain=MS_DOMAIN),
    Rule("mha->gqa", "MultiHeadAttention", _match_any_mask, _rewrite, domain=MS_DOMAIN),
)


def _softmax_rules(kind: str, match: Callable[..., Match | Mismatch]) -> tuple[Rule, Rule]:
    """``{kind}-attention->gqa-causal`` then ``{kind}-attention->gqa``, rooted at the Softmax."""
    return (
        Rule(
            f"{kind}-attention->gqa-causal", "Softmax", partial(match, causal=True), _rewrite_block
        ),
        Rule(f"{kind}-attention->gqa", "Softmax", partial(match, causal=False), _rewrite_block),
    )


# Attention sinks (GPT-OSS): only GroupQueryAttention has them (head_sink); from the Softmax, as
# fuse-attention leaves them unfused. Tried in the same order.
SINK_GQA_RULES = _softmax_rules("sink", _match_sinks)
# For the opt-in fuse-softcap-attention, --target ort; tried in the same order.
SOFTCAP_GQA_RULES = _softmax_rules("softcap", _match_softcap)


class FuseGroupQueryAttentionPass(Pass):
    """MultiHeadAttention over repeat_kv-expanded K/V (no Expands), or under a provably causal mask
    -> GroupQueryAttention (ort)."""

    name = "fuse-group-query-attention"
    summary = "MultiHeadAttention over repeated K/V heads, or causal -> GroupQueryAttention (--target ort)"

    def call(self, model: ir.Model) -> PassResult:
        # The driver only reports rules that left a candidate unfused; why a block got causal=0
        # (the mask not provably causal) is said here, before the rewrite.
        why_not_causal = self._why_not_causal(model) if self.options.explain else []
        rules = [OLDER_FORM_RULE, *GQA_RULES, *SINK_GQA_RULES]
        stats, notes = apply_rules(model, rules, self.options)
        notes = [*why_not_causal, *notes]
        if stats:
            # The moved Shape reads are new nodes placed at the attention, after their consumer
            # (fuse-attention's mask Expand target): a stable sort puts them back in front of it.
            sort_model(model)
            model.opset_imports.setdefault(MS_DOMAIN, 1)  # the sink rules start from a Softmax
        return PassResult(model, modified=bool(stats), stats=stats, notes=notes)

    def _why_not_causal(self, model: ir.Model) -> list[str]:
        notes = []
        for graph in iter_graphs(model):
            context = RewriteContext(model, graph, self.options)
            for node in graph:
                if is_op(node, "MultiHeadAttention", MS_DOMAIN):
                    rules = GQA_RULES
                elif is_op(node, "Softmax") and has_sinks(node):
                    rules = SINK_GQA_RULES
                else:
                    continue
                causal = rules[0].match(node, context)
                if isinstance(causal, Mismatch) and isinstance(
                    rules[1].match(node, context), Match
                ):
                    notes.append(f"{rules[0].name}: {describe(node)}: {causal.reason}")
        return notes
