"""Fuse scaled-dot-product attention blocks into one attention op.

The matched block, rooted at its Softmax, is what PyTorch's exporters emit for
``softmax(Q @ K^T * scale + bias) @ V`` followed by the merge of the heads::

    Q4 = Transpose(Reshape(q, [B, S, H, d]), [0,2,1,3])   (or any [B, H, S, d] tensor, e.g. after rotary)
    KT = K4 transposed to [B, H, d, T]                     (three exporter spellings, see _key_transposed)
    P  = Softmax(MatMul(Q4 * a, KT * b) * c + bias)        (scalar factors optional, in any of the spots)
                                                           (a masked_fill Where(keep, scores, fill)
                                                            with fill <= -1e30 is a bias term too;
                                                            alone, a fill <= -1e8: _MaskedFill)
    P  = Where(IsNaN(P), 0, P)                             (optional: SDPA's "fully masked row -> 0")
    Y  = Reshape(Transpose(MatMul(P, V4), [0,2,1,3]), [B, S, H*dv])
                                                           (nn.MultiheadAttention: Transpose [2,0,1,3]
                                                            to [S, B, H, dv], viewed as [S*B, H*dv])

For ``--target ort`` the block becomes ``com.microsoft.MultiHeadAttention(q, k, v, attention_bias=bias)``
with ``scale = a*b*c``. Q/K/V are passed as the [B, S, H*d] tensors before the head split when the
graph has them (the head-split Transposes disappear), else K/V as [B, H, T, d] (a layout the op
accepts) and Q transposed back to [B, S, H*d]. The additive mask keeps its exact values: ORT wants
dims 2 and 3 of ``attention_bias`` spelled out, so a mask that may broadcast there is Expanded to
[b, h, S, T] with S and T read from the tensors at run time (no dynamic dim becomes a constant).
SDPA's NaN guard is kept exactly: a fully masked row makes ORT's softmax NaN, which the guard, moved
after the op, turns into the zeros the original produces.

BLOOM's (and DeBERTa's) bmm form, heads flattened into the batch, is the same block: Q/K/V viewed as
[B*H, S, d], the scores as [B*H, S, T] plus a term of their own (ALiBi [B*H, 1, T], viewed as
[B, H, 1, T] into the bias; DeBERTa-v3's relative-position terms, expanded to B*H rows first when
their rows may be 1), viewed back as [B, H, S, T] for the mask; the views are proved. torch's
``multi_head_attention_forward`` (nn.MultiheadAttention with its weights on) flattens its heads
sequence-first and adds its mask to the flat scores: _seq_first_heads.py respells its operands
in BLOOM's form while the rule runs, and P@V [B*H, S, d] merged by ``Transpose [1, 0, 2]`` and a
view is the fused output moved sequence-first and viewed the same way. Where Q, K and V are the
parts of torch's packed in-projection, the rewrite computes it on the batch-first input and splits
it ([Q | K | V]), which fuse-packed-attention folds into one Attention. SAM's and ViTDet's image
encoders unbind Q, K and V from one stacked [3, B*H, T, d] view: _stacked_heads.py respells each
part the same way. Their decomposed relative positions are added to a [B*H, h, w, h, w] view of
the flat scores (a term of their own once viewed back, _ViewTerms), and P@V goes back onto the
image grid as [B, H, h, w, d] moved by [0, 2, 3, 1, 4]: the fused output viewed by the same
target (_spatial_merge). GPT-NeoX-Japanese computes only Q@K^T on the flattened heads
(``baddbmm``) and multiplies the [B, H, S, T] probabilities by the [B, H, T, d] V. GPT-BigCode
before transformers 5 folds its query heads into the rows of one multi-query product ([B, S*H, d]
against the one [B, d, T] key): _query_rows.py respells the whole block on [B, H, S, d] heads.

A gate of the heads between their move back and the merge, ``Reshape(Mul(Transpose(P@V), g),
target)`` (LFM3's per-head sigmoid, HRM's elementwise one), stays the export's: the fused
[B, S, H*dv] output viewed as [B, S, H, dv] is the moved P@V, multiplied by g and merged by the
same target.

Multi-query attention (Falcon: K/V with one head, which the two MatMuls broadcast against the H
query heads) is fused with K/V repeated H times in repeat_kv's spelling; fuse-group-query-attention
turns that into GroupQueryAttention(kv_num_heads=1) where it can. A dim of an intermediate tensor
read by a node that outlives the block (GPT-2's TorchScript SDPA export reads B off P@V for its
output projection) is read off the fused op's query instead: B and S are the query's, H a constant.

For ``--target onnx`` the block becomes ONNX ``Attention`` (opset 23) on the [B, H, S, d] tensors,
when the model's opset allows it; the mask is passed as ``attn_mask`` (the op broadcasts it).
ONNX Runtime's Attention-23 kernel returns zeros for a row whose every mask value is
float32's lowest (the exported graph averages V there, as the spec does), while it treats -1e30
as the finite number it is. So a mask is fused only when its values are provable (a ``Where``
between constants, through views and float casts): a finite mask passes through
``Max(mask, -1e30)`` (exp() of either is 0, so partly masked rows do not change); a -inf mask only
behind SDPA's NaN guard, which zeroes those rows in the export too.

Gemma2 soft-caps the scaled scores before the mask: ``P = Softmax(tanh(Q@K^T * scale / c) * c + mask)``
(``Mul(Tanh(Div(s, c)), c)`` from both exporters; ``Mul(s, 1/c)`` inside is read as the division
too). For ``--target onnx`` that is Attention-23's ``softcap = c``: ORT 1.32 applies it to the
scaled scores before adding the mask (scripts/softcap_kernel_check.py; the spec's errata,
onnx/onnx#7867, fixed the order to this one). MultiHeadAttention and the packed Attention have no
softcap; for ``--target ort`` GroupQueryAttention does (fuse_group_query_attention.py). Both fused
forms are exact but measured slower than the unfused graph on ORT 1.32 CPU (its softcap loop;
README, "Soft-capped attention"), so this pass leaves soft-capped blocks alone and the opt-in
fuse-softcap-attention (``--enable``) fuses them, with this module's matcher
(:func:`match_attention_block`). A cap after the mask, a Tanh without the division, or a cap that
is not one positive constant is not fused, and ``--explain`` says which.

GPT-OSS adds attention sinks: one learned logit per head joins each row of the scores and its
column is dropped after the softmax::

    C = Concat(scores + mask, Expand(sinks [1, H, 1, 1], [B, H, S, 1]), axis=-1)
    P = Softmax(C - ReduceMax(C, [-1], keepdims=1))[..., :-1]

The subtraction is the stabilizer softmax applies itself (any per-row constant cancels), so it is
matched only in exactly that form, and may be absent. Granite-SWA writes the same softmax without
the column, as a scale of P@V (``e^s / (Σe^s + e^sink) = softmax(s) * sigmoid(lse(s) - sink)``)::

    O = (Softmax(scores) @ V) * Unsqueeze(Sigmoid(ReduceLogSumExp(scores, [-1]) - sinks), -1)

with ``sinks`` [1, H, 1]; the block is matched with its logits
(``AttentionBlock.sinks``), a constant of one value per head (or one for all), the column one wide.
MultiHeadAttention and ONNX Attention-23 have no sinks: this pass leaves the block and says so;
fuse-group-query-attention fuses it into GroupQueryAttention with ``head_sink`` (--target ort).

float32 and float16 blocks are fused (ORT 1.32 runs MultiHeadAttention and Attention-23 in both on
CPU; CUDA, where half-precision models run, has float16 kernels). A float16 mask cannot hold the
-1e30 floor, and Attention-23 zeroes rows masked with float16's lowest, so ``--target onnx``
refuses finite float16 masks (``--explain`` says so).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from onnxopt.ops import (
    MS_DOMAIN,
    ONNX_DOMAINS,
    const_array,
    constant_of_shape_fill,
    is_op,
    single_consumer,
)
from onnxopt.passes import _query_rows as query_rows
from onnxopt.passes import _seq_first_heads as seq_first_heads
from onnxopt.passes import _stacked_heads as stacked_heads
from onnxopt.passes._attention_shapes import (
    ATTENTION_DTYPES,
    MASK_FLOOR,
    RAISED_FILL_LIMIT,
    Entry,
    annotate,
    gathered_dim,
    int64_const,
    keeps_leading_dims,
    last_dim,
    peel_scale,
    peel_torch_expand_shape,
    producer_of,
    reshape_to_heads,
    same_dim,
    same_symbol,
    scalar_factor,
    scaled_dim_reads,
    seq_len,
    shape_slice,
    softmax_axis,
    split_last_axis,
    static_dim,
    target_entries,
    transpose_perm,
    value_rank,
    view_entries,
    with_axes,
)
from onnxopt.passes._shape_facts import axes_param, slice_params
from onnxopt.passes.base import Pass, PassResult
from onnxopt.passes.sort_topologically import sort_model
from onnxopt.rewrite import Match, Mismatch, Replacement, RewriteContext, Rule, apply_rules

logger = logging.getLogger(__name__)

ONNX_ATTENTION_OPSET = 23
# Ops whose output holds only values of their data input (input 0), rearranged or converted.
_VALUE_PRESERVING = frozenset(
    {
        "Identity",
        "Reshape",
        "Expand",
        "Unsqueeze",
        "Squeeze",
        "Transpose",
        "Flatten",
        "Cast",
        "Slice",
    }
)


# --- reading Reshape targets -------------------------------------------------------------------
# A target is read as a list of entries: an int constant, or ("dim", source, index) for a dim read
# off some tensor's Shape at run time. Only what the exporters emit is understood.


@dataclass(frozen=True)
class _Heads:
    """A [B, H, S, d] operand: the [B, S, H*d] tensor it was split from (if any) and its head count/size.

    ``rows``: the [B, S, H, d] tensor the heads were moved first from, where the graph has the key
    only as that (SAM2's TorchScript K^T is ``Transpose(unbind(qkv5)[1], [0, 2, 3, 1])``); its
    view ``Reshape(rows, [0, 0, -1])`` is the [B, S, H*d] tensor.
    """

    four_d: ir.Value | None
    three_d: ir.Value | None
    heads: int | None
    head_size: int | None
    nodes: tuple[ir.Node, ...]
    rows: ir.Value | None = None


def _split_heads(value4: ir.Value) -> _Heads:
    """Recognise ``Transpose(Reshape(x, [B, S, H, d]), [0, 2, 1, 3])``; else an opaque [B, H, S, d] tensor."""
    opaque = _Heads(value4, None, static_dim(value4, 1), static_dim(value4, 3), ())
    transpose = value4.producer()
    if transpose_perm(transpose) != [0, 2, 1, 3]:
        return opaque
    assert transpose is not None
    reshaped = transpose.inputs[0]
    split = reshape_to_heads(reshaped)
    if split is None:
        return opaque
    three_d, heads, head_size, reshape = split
    return _Heads(value4, three_d, heads, head_size, (reshape, transpose))


def _split_scaled_heads(value4: ir.Value) -> tuple[_Heads, float] | None:
    """``Transpose(Reshape(x, [B, S, H, d]) * c, [0, 2, 1, 3])``: query heads scaled before they
    are moved (TensorFlow's DistilBERT, whose ``q * rsqrt(d)`` tf2onnx moves the Transpose past):
    (Q * c) @ K^T is (Q @ K^T) * c, so c joins the op's scale."""
    transpose = value4.producer()
    if transpose is None or transpose_perm(transpose) != [0, 2, 1, 3]:
        return None
    inner, factor, muls = peel_scale(transpose.inputs[0]) if transpose.inputs[0] else (None, 1, [])
    split = reshape_to_heads(inner) if inner is not None and muls else None
    if split is None:
        return None
    three_d, heads, head_size, reshape = split
    nodes = (reshape, *reversed(muls), transpose)
    return _Heads(value4, three_d, heads, head_size, nodes), factor


def _key_transposed(value: ir.Value) -> tuple[_Heads, float, list[ir.Node]] | Mismatch:
    """Resolve K^T ([B, H, d, T]) to K, as one of the exporters' spellings.

    1. ``Transpose(Reshape(k, [B, T, H, d]), [0, 2, 3, 1])``        (TorchScript; or of any
       [B, T, H, d] tensor: the key is then known as those rows)
    2. ``Transpose(K4, [0, 1, 3, 2])``
    3. ``Reshape(Transpose(Reshape(K4, [-1, T, d]), [0, 2, 1]), [B, H, d, T])``  (dynamo), the dims read
       from ``Shape(K4)`` at run time.
    """
    base, factor, nodes = peel_scale(value)
    producer = base.producer()
    perm = transpose_perm(producer)
    if perm == [0, 2, 3, 1]:
        assert producer is not None
        split = reshape_to_heads(producer.inputs[0])
        if split is None:
            rows = producer.inputs[0]
            heads, head_size = static_dim(rows, 2), static_dim(rows, 3)
            if value_rank(rows) != 4 or heads is None or head_size is None:
                return Mismatch(
                    "the transposed key is not the [B, T, H, d] heads (a 4-D tensor of known H "
                    "and d)"
                )
            return _Heads(None, None, heads, head_size, (), rows), factor, [producer, *nodes]
        three_d, heads, head_size, reshape = split
        return _Heads(None, three_d, heads, head_size, (reshape,)), factor, [producer, *nodes]
    if perm == [0, 1, 3, 2]:
        assert producer is not None and producer.inputs[0] is not None
        key4, more, inner = peel_scale(producer.inputs[0])
        key_heads = _split_heads(key4)
        return key_heads, factor * more, [*key_heads.nodes, *inner, producer, *nodes]
    reshape_back = producer_of(base, "Reshape")
    if reshape_back is not None:
        transpose = (
            reshape_back.inputs[0].producer() if reshape_back.inputs[0] is not None else None
        )
        reshape_flat = (
            producer_of(transpose.inputs[0], "Reshape") if transpose is not None else None
        )
        if (
            transpose_perm(transpose) == [0, 2, 1]
            and reshape_flat is not None
            and reshape_flat.inputs[0] is not None
        ):
            assert transpose is not None
            key4 = reshape_flat.inputs[0]
            flat = target_entries(reshape_flat.inputs[1])
            back = target_entries(reshape_back.inputs[1])
            if flat is None or back is None:
                return Mismatch("the key transpose reshapes to shapes that cannot be read")
            if not _is_flat_key(flat, key4) or not _is_unflat_key(back, key4):
                single = _single_head_key(reshape_flat.outputs[0], back)
                if single is not None:
                    return single, factor, [transpose, reshape_back, *nodes]
                return Mismatch(
                    "the key transpose's reshapes are not [-1, T, d] and [B, H, d, T] of the key"
                )
            key_base, more, inner = peel_scale(key4)
            key_heads = _split_heads(key_base)
            return (
                key_heads,
                factor * more,
                [*key_heads.nodes, *inner, reshape_flat, transpose, reshape_back, *nodes],
            )
    return Mismatch("the second MatMul operand is not a transposed key")


def _is_flat_key(entries: Sequence[Entry], key4: ir.Value) -> bool:
    return (
        len(entries) == 3
        and entries[0] == -1
        and same_dim(entries[1], key4, 2)
        and same_dim(entries[2], key4, 3)
    )


def _single_head_key(flat: ir.Value, back: Sequence[Entry]) -> _Heads | None:
    """One head: K^T as ``Reshape(Transpose(flat, [0, 2, 1]), [B, 1, d, T])`` where ``flat`` is
    [B, T, d] but was not reshaped from a [B, 1, T, d] key (SAM2's one-head stage: the exporter's
    Squeeze and the head Transpose over a dim of 1 fold into the flattening Reshape). With one head
    the flat key is the [B, T, H*d] key itself; the element count fixes B."""
    head_size = static_dim(flat, 2)
    if (
        len(back) != 4
        or back[1] != 1
        or value_rank(flat) != 3
        or head_size is None
        or not same_dim(back[2], flat, 2)
        or not same_dim(back[3], flat, 1)
    ):
        return None
    return _Heads(None, flat, 1, head_size, ())


def _is_unflat_key(entries: Sequence[Entry], key4: ir.Value) -> bool:
    """[B, H, d, T] of the key; one entry may be -1 (fold-shape-values writes [-1, 4, 16, 18] once
    H, d and T are static): the reshaped tensor holds the key's elements, so it is that dim."""
    if len(entries) != 4 or sum(1 for entry in entries if entry == -1) > 1:
        return False
    return all(
        entry == -1 or same_dim(entry, key4, axis)
        for entry, axis in zip(entries, (0, 1, 3, 2), strict=True)
    )


def _main_user(value: ir.Value) -> ir.Node | None:
    """The one consumer of ``value`` that is not a Shape read (checked later by _dies_with)."""
    if value.is_graph_output():
        return None
    users = [u.node for u in value.uses() if not is_op(u.node, "Shape")]
    return (
        users[0]
        if len(users) == 1 and sum(1 for u in value.uses() if u.node is users[0]) == 1
        else None
    )


def _is_noop_reshape(reshape: ir.Node, by_axis: Sequence[Sequence[ir.Value]]) -> bool:
    """A Reshape of [B, H, S, dv] to [dim 0, -1, dim 2, dim 3] read off tensors known to share those
    dims (or off dims with the same symbol)."""
    entries = target_entries(reshape.inputs[1])
    source = reshape.inputs[0]
    if entries is None and source is not None:
        # A target computed elsewhere (wav2vec2's SDPA export): the shapes prove the same dims.
        output = reshape.outputs[0]
        return value_rank(source) == 4 and all(
            same_symbol(output, axis, source, axis) for axis in range(4)
        )
    if entries is None or len(entries) != 4:
        return False
    # One entry may be unproven, as one may be -1: the element count fixes it (Falcon's
    # TorchScript export reads S off the mask, where the shapes lost the query's S).
    unproven = sum(1 for e in entries if e == -1)
    for axis, entry in enumerate(entries):
        if entry == -1 or (
            isinstance(entry, int) and entry > 0 and entry == static_dim(by_axis[axis][0], axis)
        ):
            continue
        # the dim read off one of those tensors, or a dim carrying the same symbol (once
        # fold-shape-values shares equal shape reads, the read may come from another tensor)
        if not isinstance(entry, tuple) or not any(same_dim(entry, v, axis) for v in by_axis[axis]):
            if isinstance(entry, int) and entry <= 0:
                return False  # 0 copies a dim; a count of its own cannot be fixed by the others
            unproven += 1
    return unproven <= 1


@dataclass(frozen=True)
class _Merge:
    """How P@V [B, H, S, dv] is merged back: ``output``, the nodes that do it, a Reshape target to
    re-apply to the fused output (or None), and whether the merge is sequence-first."""

    output: ir.Value
    nodes: list[ir.Node]
    target: ir.Value | None
    seq_first: bool
    # a gate multiplying the [B, S, H, dv] heads before the merge (LFM3, HRM): the fused output
    # viewed as those heads is multiplied by it and merged by the export's own ``target``
    gate: ir.Value | None = None


def _merged_heads(value: ir.Value, by_axis: Sequence[Sequence[ir.Value]]) -> _Merge | None:
    """P@V's Transpose [0,2,1,3] and Reshape to [B, S, H*dv].

    A Reshape to a constant shape (GPT-2 dynamo: [-1, D]) is re-applied to the fused [B, S, H*dv]
    output: both hold the same elements in the same order (a copy marker 0 only at dims 0 and 1,
    which the two share).
    nn.MultiheadAttention works sequence-first: ``permute(2, 0, 1, 3)`` to [S, B, H, dv], then a
    view to [S*B, H*dv]. That merge is the fused output transposed to [S, B, H*dv], then the
    same Reshape (the same elements in the same order again).
    """
    nodes: list[ir.Node] = []
    transpose = _main_user(value)
    if (
        is_op(transpose, "Reshape")
        and transpose is not None
        and _is_noop_reshape(transpose, by_axis)
    ):
        nodes.append(transpose)  # TorchScript's SDPA reshapes P@V to its own shape first
        transpose = _main_user(transpose.outputs[0])
    if is_op(transpose, "Reshape") and transpose is not None:
        return _single_head_merge(transpose, nodes)
    perm = transpose_perm(transpose)
    if perm not in ([0, 2, 1, 3], [2, 0, 1, 3]):
        return None
    assert transpose is not None
    seq_first = perm == [2, 0, 1, 3]
    nodes.append(transpose)
    moved = transpose.outputs[0]
    reshape = _main_user(moved)
    if is_op(reshape, "Mul") and reshape is not None and not seq_first:
        gate = _head_gate(reshape, moved)
        view = _main_user(reshape.outputs[0])
        if gate is None or not is_op(view, "Reshape") or view is None:
            return None
        # The fused [B, S, H*dv] output viewed as [B, S, H, dv] is the moved P@V itself: the same
        # Mul and the same Reshape after it compute what the export does, broadcasts and all.
        return _Merge(view.outputs[0], [*nodes, reshape, view], view.inputs[1], False, gate)
    if (
        not is_op(reshape, "Reshape")
        or reshape is None
        or reshape.inputs[0] is not transpose.outputs[0]
    ):
        return None
    merge = _Merge(reshape.outputs[0], [*nodes, reshape], None, seq_first)
    entries = target_entries(reshape.inputs[1])
    if entries is None and not seq_first and _merge_fixed_by_count(reshape, transpose.outputs[0]):
        return merge
    if entries is None:
        # A target computed from elsewhere (wav2vec2: the sequence length from the audio length):
        # the shapes prove the merge, [B, S, H, d] -> [B, S, H*d].
        merged, heads = reshape.outputs[0], transpose.outputs[0]
        width = [static_dim(heads, 2), static_dim(heads, 3), static_dim(merged, 2)]
        if (
            value_rank(merged) == 3
            and None not in width
            and width[0] * width[1] == width[2]  # type: ignore[operator]
            and same_symbol(merged, 0, heads, 0)
            and same_symbol(merged, 1, heads, 1)
        ):
            return merge
        return None
    allowzero = bool(reshape.attributes.get_int("allowzero", 0))
    # the merged heads' dims 0 and 1 are P@V's perm[0] and perm[1]: the block's values known to
    # share those dims (the query's B and S) pin a target read off another tensor with their
    # symbol (Parakeet: its relative-position scores lose S's name before P@V)
    equal = [[(v, perm[k]) for v in by_axis[perm[k]]] for k in (0, 1)]
    if len(entries) != 3 or not keeps_leading_dims(entries, allowzero, transpose.outputs[0], equal):
        # dims 0 and 1 are the same in the [B, S, H, dv] heads and the fused [B, S, H*dv] output
        # (SAM2 views its windows back as [B, h, w, C]: [0, h, w, -1])
        if _reapplicable(reshape, entries, shared=2):
            return replace(merge, target=reshape.inputs[1])
        return None
    last = entries[2]
    if isinstance(last, tuple) and isinstance(last[1], ir.Value):
        # a static dim read off another tensor (below opset 15 a whole ``Shape(embeddings)``
        # [B, S, D] is the target: Qwen2 and wav2vec2 exported at opset 11)
        last = static_dim(last[1], last[2]) or last
    if entries[1] == -1 and not (isinstance(last, int) and last > 0):
        return None
    if not (isinstance(last, int) and (last == -1 or last > 0)):
        return None
    return merge


def _head_gate(mul: ir.Node, heads: ir.Value) -> ir.Value | None:
    """The other operand of ``mul`` when it multiplies the [B, S, H, dv] ``heads`` (P@V moved to
    the sequence) by a tensor of rank 4 or less: LFM3 gates each head ([B, S, H, 1]), HRM each
    element ([B, S, H, dv])."""
    if len(mul.inputs) != 2:
        return None
    first, second = mul.inputs
    gate = second if first is heads else first if second is heads else None
    rank = value_rank(gate)
    if gate is None or gate is heads or rank is None or rank > 4:
        return None
    return gate


def _single_head_merge(reshape: ir.Node, nodes: list[ir.Node]) -> _Merge | None:
    """One head: P@V [B, 1, S, dv] viewed by a constant target with no Transpose (the move of a dim
    of 1 is a view, which the cleanup folded into the Reshape). Row-major, [B, 1, S, dv] holds the
    fused [B, S, dv] output's elements in order, so the target is re-applied to it; it may copy
    (0) dim 0 alone, the only dim the two share by position."""
    source = reshape.inputs[0]
    entries = target_entries(reshape.inputs[1]) if len(reshape.inputs) > 1 else None
    if (
        source is None
        or static_dim(source, 1) != 1
        or value_rank(source) != 4
        or entries is None
        or not _reapplicable(reshape, entries, shared=1)
    ):
        return None
    return _Merge(reshape.outputs[0], [*nodes, reshape], reshape.inputs[1], seq_first=False)


def _reapplicable(reshape: ir.Node, entries: Sequence[Entry], shared: int) -> bool:
    """The Reshape's target can be re-applied to the fused output: a constant with at most one -1
    whose copy markers (0) fall only on its first ``shared`` dims, the ones P@V's layout and the
    fused output share (none with allowzero, where a 0 is a size)."""
    if const_array(reshape.inputs[1]) is None or entries.count(-1) > 1:
        return False
    copies = [axis for axis, entry in enumerate(entries) if entry == 0]
    allowzero = reshape.attributes.get_int("allowzero", 0)
    return not copies or (not allowzero and max(copies) < shared)


def _spatial_merge(view: ir.Node, query4: ir.Value, value4: ir.Value) -> _Merge | None:
    """P@V [B*H, S, dv] (or [B, H, S, dv], SAM's SDPA path) merged back onto an image grid
    (SAM's and ViTDet's attention)::

        Reshape(Transpose(Reshape(P@V, [B, H, h, w, dv]), [0, 2, 3, 1, 4]), [B, h, w, H*dv])

    With h*w = S (static) and H the query's head count, row-major, the first view is P@V as
    [B, H, S, dv] with S split in two, and the Transpose moves the heads next to dv as [0, 2, 1, 3]
    would: the last view holds the fused [B, S, H*dv] output's elements in order. So the fused
    output is viewed by the same target, which may copy (0) dim 0 alone, the one both share. B or
    dv must be proved (the element count then fixes the other)."""
    out = view.outputs[0]
    entries = view_entries(out)
    heads, length = static_dim(query4, 1), static_dim(query4, 2)
    if value_rank(out) != 5 or entries is None or len(entries) != 5 or not heads or not length:
        return None

    def size(axis: int) -> int | None:
        entry = entries[axis]
        return entry if isinstance(entry, int) and entry > 0 else static_dim(out, axis)

    height, width = size(2), size(3)
    if size(1) != heads or height is None or width is None or height * width != length:
        return None
    batch = entries[0]
    batch_proved = (isinstance(batch, tuple) and same_dim(batch, query4, 0)) or same_symbol(
        out, 0, query4, 0
    )
    if not batch_proved and not (size(4) is not None and size(4) == static_dim(value4, 3)):
        return None
    transpose = _main_user(out)
    if transpose_perm(transpose) != [0, 2, 3, 1, 4] or transpose is None:
        return None
    merge = _main_user(transpose.outputs[0])
    if not is_op(merge, "Reshape") or merge is None or merge.inputs[0] is not transpose.outputs[0]:
        return None
    target = target_entries(merge.inputs[1])
    if target is None or not _reapplicable(merge, target, shared=1):
        return None
    return _Merge(merge.outputs[0], [view, transpose, merge], merge.inputs[1], seq_first=False)


def _merge_fixed_by_count(reshape: ir.Node, heads4: ir.Value) -> bool:
    """``Reshape(heads4 [B, S, H, d], [x, S, H*d])`` with S and H*d proved and x unreadable
    (TorchScript's BLOOM computes B as Shape(P@V)[0] / H): the element count fixes x = B."""
    entries = view_entries(reshape.outputs[0])
    heads, size = static_dim(heads4, 2), static_dim(heads4, 3)
    if entries is None or len(entries) != 3 or heads is None or size is None:
        return False
    seq, width = entries[1], entries[2]
    allowzero = bool(reshape.attributes.get_int("allowzero", 0))
    seq_proved = (seq == 0 and not allowzero) or (seq is not None and same_dim(seq, heads4, 1))
    return seq_proved and width == heads * size and heads * size > 0


def _flat_seq_first_merge(transpose: ir.Node | None) -> _Merge | None:
    """P@V [B*H, S, dv] merged as torch's multi_head_attention_forward does:
    ``Reshape(Transpose(P@V, [1, 0, 2]), target)``, [S, B*H, dv] viewed as [S*B, H*dv] (or
    [S, B, H*dv]). Row-major, that view holds the fused [S, B, H*dv] output's elements in order,
    so the fused output is transposed sequence-first and viewed by the same target. The target may
    not copy (0) any dim but S: the two tensors share only that one."""
    if transpose_perm(transpose) != [1, 0, 2]:
        return None
    assert transpose is not None
    reshape = _main_user(transpose.outputs[0])
    if not is_op(reshape, "Reshape") or reshape is None or len(reshape.inputs) < 2:
        return None
    if reshape.inputs[0] is not transpose.outputs[0]:
        return None
    entries = view_entries(reshape.outputs[0])
    copies = not reshape.attributes.get_int("allowzero", 0)
    if entries is None or any(entry is None or (copies and entry == 0) for entry in entries[1:]):
        return None
    return _Merge(reshape.outputs[0], [transpose, reshape], reshape.inputs[1], seq_first=True)


_SHAPE_OPS = (
    "Shape",
    "Gather",
    "Unsqueeze",
    "Squeeze",
    "Concat",
    "Slice",
    "Cast",
    "Reshape",
    "Identity",
)


def _dim_arithmetic(node: ir.Node) -> bool:
    """Integer Mul/Div on dim reads (TorchScript's BLOOM reads B*H off P@V and divides by H)."""
    return (is_op(node, "Mul") or is_op(node, "Div")) and all(
        out.dtype == ir.DataType.INT64 for out in node.outputs
    )


def _dies_with(
    dying: set[ir.Node],
    heavy: Sequence[ir.Node],
    anywhere: Sequence[ir.Node],
    repointable: Callable[[ir.Node], bool] = lambda node: False,
) -> tuple[list[ir.Node], list[ir.Node]] | None:
    """Shape-reading nodes that only feed ``dying``, so they go when the block goes.

    TorchScript reads the dims of intermediate attention tensors (``Shape(P@V)``) to build the final
    Reshape's target. Those readers die with the block; the ``heavy`` nodes must die entirely (else
    the fusion would compute attention twice), the others (Q/K/V transposes) may stay alive.
    A dim read that outlives the block (GPT-2's batch size, read off P@V, also shapes the output
    projection) is ``repointable`` when the fused op's inputs provably have that dim: the rewrite
    reads it from them instead.
    Returns (readers, re-pointed dim reads), or None when a heavy node's result escapes.
    """
    memo: dict[int, bool] = {}
    readers: list[ir.Node] = []
    repointed: list[ir.Node] = []

    def dies(node: ir.Node, depth: int = 0) -> bool:
        if node in dying:
            return True
        key = id(node)
        if key in memo:
            return memo[key]
        memo[key] = False
        if depth > 8 or not (any(is_op(node, op) for op in _SHAPE_OPS) or _dim_arithmetic(node)):
            return False
        for out in node.outputs:
            if out.is_graph_output() or not all(dies(u.node, depth + 1) for u in out.uses()):
                if repointable(node):
                    memo[key] = True
                    repointed.append(node)
                    return True
                return False
        memo[key] = True
        readers.append(node)
        return True

    def consumers_die(node: ir.Node) -> bool:
        return all(
            not out.is_graph_output() and all(dies(u.node) for u in out.uses())
            for out in node.outputs
        )

    for node in heavy:
        if not consumers_die(node):
            return None
    for node in anywhere:
        consumers_die(node)
    # found consumer-first; removal wants producers before consumers
    return readers[::-1], repointed[::-1]


def _dim_meanings(
    heavy: Sequence[ir.Node], out_nodes: Sequence[ir.Node]
) -> dict[ir.Value, dict[int, str]]:
    """What the dims of the block's intermediate tensors are: the scores, probabilities and P@V
    are [B, H, S, *] (dims 0 and 2 are the query's, 1 the head count); P@V with its heads moved
    next to the sequence is [B, S, H, dv]."""
    meanings: dict[ir.Value, dict[int, str]] = {}
    for node in heavy:
        for out in node.outputs:
            if value_rank(out) == 4 and transpose_perm(node) is None:
                meanings[out] = {0: "batch", 1: "heads", 2: "seq"}
    for node in out_nodes[:-1]:
        perm = transpose_perm(node)
        if value_rank(node.outputs[0]) == 4 and perm == [0, 2, 1, 3]:
            meanings[node.outputs[0]] = {0: "batch", 1: "seq", 2: "heads"}
        elif value_rank(node.outputs[0]) == 4 and perm == [2, 0, 1, 3]:
            meanings[node.outputs[0]] = {0: "seq", 1: "batch", 2: "heads"}
    return meanings


def _dim_read(node: ir.Node) -> tuple[ir.Value, int] | None:
    """``Gather(Shape(x), i)``, ``Gather(Shape(x), [i])`` or ``Shape(x, start=i, end=i+1)`` (the
    one-dim read fold-shape-values writes) as (x, i), i non-negative."""
    if is_op(node, "Shape"):
        read = shape_slice(node.outputs[0])
        rank = value_rank(read[0]) if read is not None else None
        if read is None or rank is None:
            return None
        source, start, end = read
        start = start + rank if start < 0 else start
        end = rank if end is None else end + rank if end < 0 else end
        return (source, start) if 0 <= start < rank and end == start + 1 else None
    entry = gathered_dim(node, scalar=True) or gathered_dim(node, scalar=False)
    if not isinstance(entry, tuple) or node.attributes.get_int("axis", 0) not in (0, -1):
        return None
    _, source, index = entry
    return (source, index) if isinstance(source, ir.Value) and isinstance(index, int) else None


def _repointed_reads(
    tape: ir.tape.Tape,
    reads: Sequence[tuple[ir.Node, str]],
    query: ir.Value,
    axes: dict[str, int],
    heads: int,
    opset: int,
) -> list[tuple[ir.Value, ir.Value]]:
    """Each dim read of a fused-away tensor, read off the fused op's query instead (its batch and
    sequence dims are the block's), or the head count as a constant. The read is one dim wide
    (``Shape(q, start, end)``), so that fuse-packed-attention can move it off the projection."""
    pairs: list[tuple[ir.Value, ir.Value]] = []
    for gather, meaning in reads:
        # a Shape read is one wide, as Gather(Shape(x), [i]) is
        index = np.zeros(1) if is_op(gather, "Shape") else const_array(gather.inputs[1])
        assert index is not None
        if meaning == "heads":
            constant = np.array(heads, dtype=np.int64).reshape(index.shape)
            new = tape.op("Constant", [], {"value": ir.tensor(constant)})
        else:
            new = seq_len(tape, query, axes[meaning], opset)
            if index.ndim == 0:
                new = tape.op("Squeeze", [new])
        pairs.append((gather.outputs[0], new))
    return pairs


@dataclass(frozen=True)
class AttentionBlock:
    query: _Heads
    key: _Heads
    value: _Heads
    scale: float
    bias: ir.Value | None
    nan_guard: bool
    output: ir.Value
    output_target: ir.Value | None
    # The output is merged sequence-first, [S, B, H*dv] (nn.MultiheadAttention), not [B, S, H*dv].
    seq_first: bool = False
    # Dim reads of fused-away tensors that outlive the block, with the dim each reads
    # ("batch", "seq" or "heads"): the rewrite reads them off the fused op's query.
    dim_reads: tuple[tuple[ir.Node, str], ...] = ()
    # > 1: K and V have one head, broadcast against this many query heads (multi-query attention).
    kv_repeat: int = 1
    # Further additive terms of the scores (the first is ``bias``), summed into one mask.
    more_bias: tuple[ir.Value, ...] = ()
    # masked_fill Wheres on the scores, each one more additive term once written as a bias.
    fills: tuple[_MaskedFill, ...] = ()
    # Terms added to the scores while they were [B*H, S, T] (BLOOM's ALiBi), rank <= 3.
    flat_terms: tuple[ir.Value, ...] = ()
    # Those of rank 3 whose dim 0 is not proved B*H (DeBERTa-v3's relative-position terms, built
    # with GatherElements): 1 or B*H, as the Add requires; the rewrite expands them to B*H rows.
    unproven_rows: tuple[ir.Value, ...] = ()
    # c > 0: the scaled scores are soft-capped, tanh(s / c) * c, before any term is added (Gemma2).
    softcap: float = 0.0
    # The scores plus their terms clamped from below, ``Max(x, floor)`` (floor <= MASK_FLOOR):
    # the fused op gets the terms' sum clamped instead (see _score_floor).
    floor: float | None = None
    # Terms added to the scores while they were viewed as [B, W, H, S, T] (Swin's shifted-window
    # mask, one row of windows per image), each as [1, W|1, H|1, S|1, T|1].
    window_terms: tuple[_WindowTerm, ...] = ()
    # Terms added to the flat [B*H, S, T] scores while viewed at rank 5 (ViTDet's relative
    # positions), each summed and viewed back as a [B*H, S, T] term.
    view_terms: tuple[_ViewTerms, ...] = ()
    # A constant per-head factor of the scores ([H, 1, 1]), applied to the [B, H, S, d] query.
    query_factor: ir.Value | None = None
    # [H]: attention sinks (GPT-OSS), one logit per head that joins each softmax row, its
    # column dropped after; only GroupQueryAttention computes them (``head_sink``).
    sinks: np.ndarray | None = None
    # A gate of the [B, S, H, dv] heads before their merge (_Merge.gate)
    gate: ir.Value | None = None
    # P zeroed again where the scores' masked_fill masked (DeBERTa's XSoftmax): rows with no
    # kept key are 0 (see _masked_zeroing)
    kept_rows: _KeptRows | None = None
    # The scores scaled after their terms were added (CodeGen before transformers 5):
    # (s + m) * f = s * f + m * f, so the summed terms are scaled too (f > 0).
    term_factor: float = 1.0


# T5: position bias + mask; one more for a model that adds, say, ALiBi besides.
MAX_BIAS_TERMS = 3


@dataclass(frozen=True)
class _SoftCap:
    """``Mul(Tanh(Div(scores, c)), c)``: Gemma2's ``tanh(s / c) * c`` (also ``Mul(s, 1/c)`` inside)."""

    scores: ir.Value  # the (scaled) Q@K^T being capped
    cap: float
    nodes: tuple[ir.Node, ...]  # the Div (or Mul), Tanh and Mul, in that order


def _tanh_of(value: ir.Value | None) -> tuple[ir.Node, ir.Node | None, ir.Value | None] | None:
    """``value`` = Tanh(x) * y or y * Tanh(x) (or Tanh(x) itself): (the Tanh, the Mul, y)."""
    node = value.producer() if value is not None else None
    if is_op(node, "Tanh") and node is not None:
        return node, None, None
    if not is_op(node, "Mul") or node is None or len(node.inputs) != 2:
        return None
    for i in (0, 1):
        operand = node.inputs[i]
        tanh = operand.producer() if operand is not None else None
        if is_op(tanh, "Tanh") and tanh is not None:
            return tanh, node, node.inputs[1 - i]
    return None


def _capped_input(value: ir.Value | None) -> ir.Value | None:
    """What a Tanh on the way to the Softmax reads, through a Div or Mul (for walking up only)."""
    found = _tanh_of(value)
    if found is None or found[0].inputs[0] is None:
        return None
    inner = found[0].inputs[0]
    divide = inner.producer()
    if (is_op(divide, "Div") or is_op(divide, "Mul")) and divide is not None:
        return divide.inputs[0]  # constant or not: _soft_cap says what is wrong with it
    return inner


def _head_factor(value: ir.Value) -> tuple[ir.Value, ir.Value, ir.Node] | None:
    """``Mul(x, f)`` of rank-4 scores [B, H, S, T] by a constant per-head factor f ([H, 1, 1] or
    [1, H, 1, 1]: Swin-V2's ``logit_scale.exp()``): (x, f, the Mul). It broadcasts over a
    [B, H, S, d] query the same way, so (Q @ K^T) * f = (Q * f) @ K^T."""
    node = value.producer()
    if not is_op(node, "Mul") or node is None or len(node.inputs) != 2 or value_rank(value) != 4:
        return None
    for scores, factor in (node.inputs, node.inputs[::-1]):
        array = const_array(factor)
        if scores is None or factor is None or array is None or array.ndim > 4:
            continue
        dims = [*([1] * (4 - array.ndim)), *array.shape]
        if (
            np.issubdtype(array.dtype, np.floating)
            and dims[0] == dims[2] == dims[3] == 1
            and dims[1] == static_dim(scores, 1)
            and value_rank(scores) == 4
            and np.all(np.isfinite(array))
        ):
            return scores, factor, node
    return None


def _scores_product(value: ir.Value) -> tuple[ir.Value, float, ir.Value | None, list[ir.Node]]:
    """``value`` = base * factor (* a per-head factor, :func:`_head_factor`): (base, the scalar
    factor, the per-head factor or None, the nodes peeled)."""
    base, factor, nodes = peel_scale(value)
    per_head = _head_factor(base)
    if per_head is None:
        return base, factor, None, nodes
    inner, more, inner_nodes = peel_scale(per_head[0])
    return inner, factor * more, per_head[1], [*nodes, per_head[2], *inner_nodes]


def _soft_cap(value: ir.Value) -> _SoftCap | Mismatch | None:
    """``value`` as a soft cap of the scores; None when it involves no Tanh at all."""
    found = _tanh_of(value)
    if found is None:
        return None
    tanh, mul, factor_value = found
    factor = scalar_factor(factor_value)
    if mul is None or factor is None:
        return Mismatch(
            "the scores go through a Tanh that is not multiplied by a scalar constant c "
            "(a soft cap is tanh(s / c) * c)"
        )
    inner = tanh.inputs[0]
    divide = inner.producer() if inner is not None else None
    divisor: float | None = None
    if is_op(divide, "Div") and divide is not None:
        divisor = scalar_factor(divide.inputs[1])
        if divisor is None:
            return Mismatch(
                f"tanh(s / d) * {factor:g} with a divisor d that is not a scalar constant is "
                "not a soft cap"
            )
    elif is_op(divide, "Mul") and divide is not None:
        inverse = scalar_factor(divide.inputs[1])
        # Mul(s, 1/c): float32 holds 1/c rounded (relative error 2**-24); the kernels divide
        # by c, which differs from s * fl(1/c) by that rounding only. Any other factor is a
        # scale of the scores, not the cap's division.
        if inverse is not None and np.isclose(1.0 / inverse, factor, rtol=2**-22, atol=0.0):
            divisor = factor
    if divide is None or divisor is None or divide.inputs[0] is None:
        return Mismatch(
            f"tanh(s) * {factor:g} without the division of s by {factor:g} is not a soft cap"
        )
    if not (factor > 0 and np.float32(divisor) == np.float32(factor)):
        return Mismatch(
            f"tanh(s / {divisor:g}) * {factor:g} is not a soft cap tanh(s / c) * c with one "
            "positive constant c"
        )
    scores = divide.inputs[0]
    if _bias_step(scores) is not None:
        return Mismatch(
            f"the soft cap tanh(s / {factor:g}) * {factor:g} is applied after a term was added "
            "to the scores; the fused kernels cap the scaled Q@K^T before the mask"
        )
    return _SoftCap(scores, factor, (divide, tanh, mul))


def has_soft_cap(softmax: ir.Node) -> bool:
    """Cheap pre-check: a Tanh cap (``Tanh(x) * y``) among the Softmax input's additive terms."""
    stack: list[tuple[ir.Value | None, int]] = [(softmax.inputs[0], 0)]
    while stack:
        value, depth = stack.pop()
        if value is None or depth > MAX_BIAS_TERMS + 1:
            continue
        if _tanh_of(value) is not None:
            return True
        node = value.producer()
        if node is not None and (
            is_op(node, "Add") or is_op(node, "Where") or _unflattening(value)
        ):
            stack.extend((operand, depth + 1) for operand in node.inputs)
    return False


@dataclass(frozen=True)
class _Sinks:
    """GPT-OSS's attention sinks: one learned logit per head joins each row of the scores,
    ``Softmax(C - ReduceMax(C, [-1], keepdims=1))[..., :-1]`` with ``C = Concat(scores, column)``
    (the subtraction optional: softmax ignores a per-row constant), ``column`` [B, H, S, 1] the
    per-head constant broadcast to the rows."""

    scores: ir.Value  # the [B, H, S, T] scores, their terms added
    logits: np.ndarray  # [H], or [1]: one logit for every head
    nodes: tuple[ir.Node, ...]  # Concat, then ReduceMax and Sub: they die with the block
    column: ir.Node | None  # the Expand of the constant, removed with the block if unread
    # Granite-SWA's form: P@V times sigmoid(logsumexp(scores) - sinks), this Mul (the nodes are
    # then ReduceLogSumExp, Sub, Sigmoid and Unsqueeze)
    scale: ir.Node | None = None


def _sink_logits(value: ir.Value | None) -> _Sinks | Mismatch | None:
    """The Softmax input as scores joined by a sink column; None when it is no Concat at all."""
    node = value.producer() if value is not None else None
    nodes: list[ir.Node] = []
    joined = value
    if is_op(node, "Sub") and node is not None and producer_of(node.inputs[0], "Concat"):
        joined, peak = node.inputs[0], node.inputs[1]
        reduce = producer_of(peak, "ReduceMax")
        if reduce is None or reduce.inputs[0] is not joined or not _row_max(reduce, joined):
            return Mismatch(
                "the scores joined by a column have something other than their row max "
                "(ReduceMax over the last axis, keepdims=1) subtracted; softmax ignores only "
                "a constant per row"
            )
        nodes = [reduce, node]
    concat = producer_of(joined, "Concat")
    if concat is None:
        return None
    rank = value_rank(joined) or value_rank(concat.inputs[0])
    axis = concat.attributes.get_int("axis", 0)
    if rank != 4 or axis not in (-1, 3):
        return Mismatch(
            "the Softmax input is a Concat, but not of [B, H, S, T] scores along their last axis"
        )
    if len(concat.inputs) != 2 or concat.inputs[0] is None or concat.inputs[1] is None:
        return Mismatch("the scores are joined by more than one column (attention sinks are one)")
    logits = _sink_column(concat.inputs[1])
    if isinstance(logits, Mismatch):
        return logits
    expand = producer_of(concat.inputs[1], "Expand")
    return _Sinks(concat.inputs[0], logits, (concat, *nodes), expand)


def _row_max(reduce: ir.Node, joined: ir.Value | None) -> bool:
    """``reduce`` is ReduceMax over the last axis of the rank-4 ``joined``, keeping it."""
    if reduce.attributes.get_int("keepdims", 1) != 1:
        return False
    return axes_param(reduce, 4) == (3,) and value_rank(joined) == 4  # axes: input from 18


def _sink_column(value: ir.Value) -> np.ndarray | Mismatch:
    """The logits of a sink column [B, H, S, 1]: a constant of one value per head (its other
    dims 1, or equal along them), broadcast by an Expand whose last target entry keeps 1."""
    expand = producer_of(value, "Expand")
    source = expand.inputs[0] if expand is not None else value
    array = const_array(source)
    if array is None:
        return Mismatch(
            "the column joined to the scores is not a constant (attention sinks are one "
            "learned logit per head)"
        )
    if expand is not None and static_dim(value, 3) != 1:
        target = expand.inputs[1]
        entries = target_entries(peel_torch_expand_shape(target)) if target is not None else None
        if not entries or entries[-1] not in (1, -1) or (array.ndim and array.shape[-1] != 1):
            return Mismatch("the column joined to the scores is not provably one column wide")
    if array.dtype.kind != "f" or not 0 < array.ndim <= 4 or array.shape[-1] != 1:
        return Mismatch(
            f"the constant joined to the scores has shape {list(array.shape)}, not one float "
            "logit per head [1, H, 1, 1]"
        )
    four = array.reshape((1,) * (4 - array.ndim) + array.shape)
    per_head = four[:1, :, :1, :]
    if not np.array_equal(np.broadcast_to(per_head, four.shape), four):
        return Mismatch(
            "the constant joined to the scores differs along the batch or sequence, not one "
            "logit per head"
        )
    return np.ascontiguousarray(per_head.reshape(-1))


def _scaling_sinks(softmax: ir.Node) -> _Sinks | Mismatch | None:
    """Sinks written as a scale of P@V (Granite-SWA):
    ``(Softmax(s) @ V) * Unsqueeze(Sigmoid(ReduceLogSumExp(s, [-1], keepdims=0) - sinks), -1)``,
    the softmax with one more logit per row, ``sinks`` [1, H, 1] (or [H, 1]). None when the
    scores are not also reduced by ReduceLogSumExp."""
    scores = softmax.inputs[0] if softmax.inputs else None
    if scores is None:
        return None
    lse = next((u.node for u in scores.uses() if is_op(u.node, "ReduceLogSumExp")), None)
    if lse is None:
        return None
    refusal = Mismatch(
        "the scores' logsumexp does not scale P@V as sigmoid(logsumexp - sinks), one learned "
        "logit per head"
    )
    # axes an input from opset 18, an attribute before
    if (
        axes_param(lse, 4) != (3,)
        or lse.attributes.get_int("keepdims", 1) != 0
        or value_rank(scores) != 4
    ):
        return refusal
    sub = single_consumer(lse.outputs[0])
    sigmoid = single_consumer(sub.outputs[0]) if is_op(sub, "Sub") and sub is not None else None
    unsqueeze = (
        single_consumer(sigmoid.outputs[0])
        if is_op(sigmoid, "Sigmoid") and sigmoid is not None
        else None
    )
    scale = (
        single_consumer(unsqueeze.outputs[0])
        if is_op(unsqueeze, "Unsqueeze") and unsqueeze is not None
        else None
    )
    if sub is None or sub.inputs[0] is not lse.outputs[0] or unsqueeze is None:
        return refusal
    logits = const_array(sub.inputs[1])
    if (
        logits is None
        or logits.dtype.kind != "f"
        or logits.ndim > 3
        or axes_param(unsqueeze, 4) != (3,)  # [B, H, S] -> [B, H, S, 1]
        or not is_op(scale, "Mul")
    ):
        return refusal
    shape = (1,) * (3 - logits.ndim) + tuple(logits.shape)
    if shape[0] != 1 or shape[2] != 1:
        return Mismatch(
            f"the logits subtracted from the scores' logsumexp have shape {list(logits.shape)}, "
            "not one per head [1, H, 1]"
        )
    assert scale is not None and sigmoid is not None
    per_head = np.ascontiguousarray(logits.reshape(-1))
    return _Sinks(scores, per_head, (lse, sub, sigmoid, unsqueeze), None, scale)


def has_sinks(softmax: ir.Node) -> bool:
    """Cheap pre-check: the Softmax input is a Concat, or a Concat minus something, or also
    reduced by ReduceLogSumExp (sinks scaling P@V)."""
    scores = softmax.inputs[0] if softmax.inputs else None
    node = scores.producer() if scores is not None else None
    if is_op(node, "Sub") and node is not None:
        node = node.inputs[0].producer() if node.inputs[0] is not None else None
    return is_op(node, "Concat") or (
        scores is not None and any(is_op(u.node, "ReduceLogSumExp") for u in scores.uses())
    )


def _drops_sink(slice_node: ir.Node | None, probs: ir.Value) -> bool:
    """``slice_node`` is ``probs[..., :-1]``: the sink's (last) column dropped, nothing else."""
    if not is_op(slice_node, "Slice") or slice_node is None or slice_node.inputs[0] is not probs:
        return False
    params = slice_params(slice_node)
    return not isinstance(params, Mismatch) and (
        list(params.starts),
        list(params.ends),
        [a % 4 for a in params.axes],
        list(params.steps),
    ) == ([0], [-1], [3], [1])


def _is_scores_product(value: ir.Value) -> bool:
    """(Scaled) Q@K^T, or a soft cap of it."""
    capped = _capped_input(value)
    if capped is not None:
        value = capped
    return is_op(_scores_product(value)[0].producer(), "MatMul")


def _leads_to_scores(value: ir.Value | None, depth: int = 0) -> bool:
    """Whether ``value`` is (scaled) Q@K^T, or an Add or masked_fill Where one of whose operands is."""
    if value is None or depth > MAX_BIAS_TERMS:
        return False
    node = value.producer()
    if is_op(node, "Add") and node is not None:
        return any(_leads_to_scores(v, depth + 1) for v in node.inputs)
    if is_op(node, "Where") and node is not None and len(node.inputs) == 3:
        return any(_leads_to_scores(v, depth + 1) for v in node.inputs[1:])
    trip = _flat_round_trip(value)
    if trip is not None:  # no term of its own: not counted
        return _leads_to_scores(trip[1], depth)
    if _unflattening(value) is not None:
        assert node is not None
        return _leads_to_scores(node.inputs[0], depth + 1)
    rank_change = _rank_change(value)
    if rank_change is not None:  # Swin's windowed view of the scores, either way
        return _leads_to_scores(rank_change.inputs[0], depth + 1)
    capped = _capped_input(value)
    if capped is not None and capped is not value:
        return _leads_to_scores(capped, depth + 1)
    return is_op(_scores_product(value)[0].producer(), "MatMul")


# --- heads flattened into the batch ---------------------------------------------------------------
# BLOOM computes attention with bmm on [B*H, S, d] tensors: Q3 = Reshape(Q4, [B*H, S, d]),
# K^T = Transpose(Reshape(K4, [B*H, T, d]), [0, 2, 1]), scores viewed back as [B, H, S, T] before
# the mask, P viewed as [B*H, S, T] for P@V3, and P@V viewed as [B, H, S, d] before the merge.
# Row-major views: [B*H, ...] index b*H + h is [B, H, ...] index (b, h) both ways, so the block
# is the [B, H, ...] one. The views are proved dim by dim, by the recorded shapes or by the
# Reshape target's entries; all dims but one must be proved (the element count fixes the last
# one, B*H where the shapes do not record it). TorchScript's exports record too few shapes
# (BLOOM's [B*H, ...] dims are unknown), so only the dynamo ones are proved today.


def _view_of_rank(value: ir.Value | None, rank: int, source_rank: int) -> ir.Node | None:
    """The Reshape making ``value``, of ``rank``, out of a tensor of ``source_rank``, if it is one."""
    reshape = producer_of(value, "Reshape")
    if reshape is None or value_rank(value) != rank or value_rank(reshape.inputs[0]) != source_rank:
        return None
    return reshape


def _unflattening(value: ir.Value | None) -> ir.Node | None:
    """The Reshape making ``value`` [B, H, S, T] out of rank-3 scores, if it is one."""
    return _view_of_rank(value, 4, 3)


def _flat_round_trip(value: ir.Value | None) -> tuple[list[ir.Node], ir.Value] | None:
    """``value`` = ``Reshape(Reshape(y, [B*H, S, T]), [B, H, S, T])`` proved to be y's own shape
    (all dims but one; the element count fixes that one): y, and the two views (consumer first).

    CLIP's eager attention before transformers 5 adds its causal and its padding mask each on a
    [B, H, S, T] view of the flat bmm scores and flattens them again in between; the round trip
    between the two masks is the identity.
    """
    outer = _view_of_rank(value, 4, 3)
    inner = _view_of_rank(outer.inputs[0], 3, 4) if outer is not None else None
    if value is None or outer is None or inner is None or inner.inputs[0] is None:
        return None
    scores = inner.inputs[0]
    if not _view_proved(value, [[(scores, axis)] for axis in range(4)]):
        return None
    return [outer, inner], scores


def _dim_is(view: ir.Value, axis: int, entry: Entry | None, source: ir.Value, index: int) -> bool:
    """Dim ``axis`` of ``view`` is dim ``index`` of ``source``: the same symbol or size, or the
    target entry reads it."""
    if same_symbol(view, axis, source, index):
        return True
    return entry is not None and same_dim(entry, source, index)


def _view_proved(
    view: ir.Value,
    dims: Sequence[Sequence[tuple[ir.Value, int]]],
    flat_of: ir.Value | None = None,
) -> bool:
    """``view`` (a Reshape's output) has, at each axis, one of the dims listed for it, at all axes
    but at most one. With ``flat_of`` ([B, H, ...]), dim 0 may also be proved B*H of it."""
    if value_rank(view) != len(dims):
        return False
    entries = view_entries(view)
    if entries is not None and len(entries) != len(dims):
        entries = None
    unproven = 0
    for axis, choices in enumerate(dims):
        entry = entries[axis] if entries is not None else None
        if axis == 0 and flat_of is not None and _batch_times_heads(view, entry, flat_of):
            continue
        if not any(_dim_is(view, axis, entry, source, index) for source, index in choices):
            unproven += 1
    return unproven <= 1


def _first_entry(view: ir.Value) -> Entry | None:
    entries = view_entries(view) if producer_of(view, "Reshape") is not None else None
    return entries[0] if entries else None


def _batch_times_heads(
    view: ir.Value, entry: Entry | None, source: ir.Value, *, any_batch: bool = False
) -> bool:
    """Dim 0 of ``view`` (a Reshape's output) is B*H of the [B, H, ...] ``source``: the target's
    entry is that static product, or (TorchScript's BLOOM) a one-element ``Mul(b, H)`` of a read b
    of a dim carrying source's B and the constant H, whatever tensor b was read off.

    ``any_batch``: b may be a read of any dim, for a term added to [B*H, S, T] scores: b*H with
    H >= 2 is not 1, and a dim that is not 1 broadcasts only against an equal one, B*H."""
    heads = static_dim(source, 1)
    if heads is None or heads <= 0 or (any_batch and heads < 2):
        return False
    if isinstance(entry, int):
        batch = static_dim(source, 0)
        return batch is not None and entry > 0 and entry == batch * heads
    reshape = producer_of(view, "Reshape")
    concat = producer_of(reshape.inputs[1], "Concat") if reshape is not None else None
    if concat is None or not concat.inputs:
        return False
    return any(
        factor == heads and (any_batch or same_dim(read, source, 0))
        for read, factor in scaled_dim_reads(concat.inputs[0])
    )


def _flattened_from(value3: ir.Value | None) -> tuple[ir.Value, ir.Node] | None:
    """``value3`` = Reshape(x4, [B*H, S, d]) of a [B, H, S, d] x4: (x4, the Reshape), when the
    view is proved."""
    reshape = producer_of(value3, "Reshape")
    if reshape is None or value3 is None:
        return None
    source = reshape.inputs[0]
    if source is None or value_rank(source) != 4:
        return None
    if _view_proved(value3, [[], [(source, 2)], [(source, 3)]], flat_of=source):
        return source, reshape
    return None


def _flat_key(value: ir.Value) -> tuple[_Heads, float, list[ir.Node]] | Mismatch:
    """K^T as ``Transpose(Reshape(K4, [B*H, T, d]), [0, 2, 1])`` (scalar factors on either side)."""
    base, factor, nodes = peel_scale(value)
    transpose = base.producer()
    if transpose_perm(transpose) != [0, 2, 1]:
        return Mismatch("the flattened key is not transposed by [0, 2, 1]")
    assert transpose is not None and transpose.inputs[0] is not None
    key3, more, inner = peel_scale(transpose.inputs[0])
    flat = _flattened_from(key3)
    if flat is None:
        return Mismatch("the flattened key is not provably [B, H, T, d] viewed as [B*H, T, d]")
    key4, reshape = flat
    heads = _split_heads(key4)
    return heads, factor * more, [*heads.nodes, reshape, *inner, transpose, *nodes]


def _flat_bias(
    tape: ir.tape.Tape, term: ir.Value, block: AttentionBlock, heads: int, opset: int
) -> ir.Value:
    """A term of the [B*H, S, T] scores as a term of the [B, H, S, T] ones: [B*H, a, b] viewed as
    [B, H, a, b]; a term without that leading dim (rank < 3, or a leading 1) broadcasts the same
    over [B, H]. A term whose dim 0 may be 1 or B*H is first expanded to B*H rows (B read off
    the query), which keeps it whichever it is."""
    rank = value_rank(term)
    assert rank is not None and term.shape is not None
    dims = list(term.shape)
    if term in block.unproven_rows:
        query = block.query.four_d or block.query.three_d
        assert query is not None
        rows = tape.op("Mul", [seq_len(tape, query, 0, opset), int64_const(tape, [heads])])
        target = tape.op("Concat", [rows, int64_const(tape, [1, 1])], {"axis": 0})
        expanded = tape.op("Expand", [term, target])
        expanded.shape = ir.Shape([None, *dims[1:]])
        if term.dtype is not None:
            expanded.dtype = term.dtype
        term = expanded
    if rank == 3 and static_dim(term, 0) != 1:
        tail = [seq_len(tape, term, axis, opset) for axis in (1, 2)]
        target = tape.op("Concat", [int64_const(tape, [-1, heads]), *tail], {"axis": 0})
        result = tape.op("Reshape", [term, target])
        result.shape = ir.Shape([None, heads, *dims[1:]])
    else:
        result = _rank4(tape, term, rank)
        result.shape = ir.Shape([*([1] * (4 - rank)), *dims])
    if term.dtype is not None:
        result.dtype = term.dtype
    return result


def _scores_side(add: ir.Node) -> int | None:
    """Which operand of an Add on the way up from the Softmax leads to Q@K^T: a (scaled) MatMul,
    else another Add or a masked_fill Where (further bias terms) over it."""
    for leads in (_is_scores_product, _leads_to_scores):
        for i in (0, 1):
            candidate = add.inputs[i]
            if candidate is not None and leads(candidate):
                return i
    return None


def _score_floor(value: ir.Value | None) -> tuple[ir.Node, ir.Value, float] | Mismatch | None:
    """``value`` = ``Max(x, c)`` with c a float scalar constant (fairseq-style decoders clamp the
    masked scores at float32's lowest: ``torch.max(scores + mask, finfo.min)``): (the Max, x, c).

    Softmax(Max(s + m, c)) is fused as Softmax(s + Max(m, c)), the clamp moved onto the summed
    terms m. For c <= MASK_FLOOR (-1e30) the two agree entry by entry: where m >= c both are s + m
    (s + m < c would need s below -1e30 + m's spacing); where m < c (-inf) both are c, as s + c ==
    c for every |s| below half an ulp of c (1.0e31 at float32's lowest), the bound _MaskedFill
    rests on. A higher floor (-1e4) would also clamp kept scores below it: not fused."""
    node = value.producer() if value is not None else None
    if not is_op(node, "Max") or node is None or len(node.inputs) != 2:
        return None
    for i in (0, 1):
        array = const_array(node.inputs[1 - i])
        operand = node.inputs[i]
        if array is None or operand is None or array.size != 1:
            continue
        if not np.issubdtype(array.dtype, np.floating):
            return None
        floor = float(array.reshape(-1)[0])
        if not floor <= MASK_FLOOR:  # NaN too
            return Mismatch(
                f"the scores are clamped from below at {floor:g}: only a floor <= {MASK_FLOOR:g} "
                "leaves every kept score unchanged"
            )
        return node, operand, floor
    return None


@dataclass(frozen=True)
class _MaskedFill:
    """``Where(condition, scores, fill)`` (``scores_first``) or ``Where(condition, fill, scores)``.

    It is the additive bias ``Where(condition, 0, fill)`` (or ``Where(condition, fill, 0)``)
    exactly, for fill <= MASK_FLOOR (-1e30): a kept score s is s + 0 = s; a masked one is fill in
    the export and s + fill in the fused op, and s + fill == fill in float32 for every |s| below
    half an ulp of fill (3.8e22 at -1e30, 1.0e31 at float32's lowest, any finite s at -inf),
    many orders above any score a softmax is given. The terms the scores get besides (GPT-Neo's
    padding mask, added after) are summed with it: a masked entry is fill + m in both (s is
    absorbed). So partly masked rows give the masked keys exp(fill + m - max) = 0 weight either
    way, and a row without a kept key holds the same values in both: uniform weights over its
    least masked keys (GPT-Neo's fully padded rows), or NaN where every entry is -inf (a -inf
    fill, or fill + m overflowing), which MultiHeadAttention and packed Attention give as well
    (tests/test_fuse_masked_fill.py).

    A fill in (MASK_FLOOR, RAISED_FILL_LIMIT] (``masked_fill(mask, -1e9)``, the common hand-written
    form, and KerasHub's ``where(c, s, -1e9)``) is not absorbed (s - 1e9 keeps s's differences
    in steps of 64), so it is ``raised``: the fused op's bias fills with MASK_FLOOR instead, and
    only where the fill is the scores' one term. A row with no kept key is then uniform in both
    (the export's every entry is the fill, the fused op's every s + MASK_FLOOR is MASK_FLOOR); a
    row that keeps a key gives the masked ones weight 0 in the fused op, and exp(fill - max) in
    the export, which is 0 too wherever the row's best kept score is above fill + 104 (expf
    underflows below -103.98): above -99 999 896 at the limit, where float32 scores are 8 apart
    and hold no softmax at all. A higher fill (-1e4: a kept score of -9 896 is a number a model
    can compute) is not fused."""

    condition: ir.Value
    fill: ir.Value
    scores_first: bool
    # the fill, scaled as the Softmax sees it, is above MASK_FLOOR: the bias fills with MASK_FLOOR
    raised: bool = False


@dataclass(frozen=True)
class _WindowTerm:
    """Swin's shifted-window mask: ``Reshape(Reshape(scores, [B, W, H, S, T]) + term, [B*W, H, S, T])``.

    The scores of B images' W windows each, [B*W, H, S, T], are viewed with the windows split off,
    the term (the mask of each window, [1, W, 1, S, T]) added there, and viewed back. Row-major
    views: row b*W + w of the scores is (b, w) both ways, so this is the [B*W, H, S, T] bias
    ``Reshape(Expand(term, [B, W, 1, 1, 1]), [-1, h, s, t])`` added to the scores."""

    term: ir.Value
    windows: int
    dims: tuple[int, int, int]  # the term's dims h, s, t (each 1 or the scores' H, S, T)


def _window_view(value: ir.Value | None) -> tuple[ir.Node, ir.Node] | None:
    """(the Add, the Reshape back) when ``value`` is a rank-5 Add viewed back to rank 4."""
    back = producer_of(value, "Reshape")
    if back is None or value_rank(value) != 4:
        return None
    add = producer_of(back.inputs[0], "Add")
    if add is None or value_rank(add.outputs[0]) != 5 or len(add.inputs) != 2:
        return None
    return add, back


def _rank_change(value: ir.Value | None) -> ir.Node | None:
    """The Reshape making ``value`` out of a tensor of rank 4 or 5, the other one of the two; or
    between ranks 3 and 5 (ViTDet's [B*H, h, w, h, w] view of its flat scores)."""
    reshape = producer_of(value, "Reshape")
    ranks = {value_rank(value), value_rank(reshape.inputs[0]) if reshape is not None else None}
    return reshape if ranks in ({4, 5}, {3, 5}) else None


def _window_term(term: ir.Value, five: Sequence[int | None]) -> _WindowTerm | Mismatch:
    shape = term.shape
    dims = [*([1] * (5 - len(shape))), *shape] if shape is not None and len(shape) <= 5 else []
    if (
        not dims
        or not all(isinstance(d, int) for d in dims)
        or dims[0] != 1
        or any(d not in (1, full) for d, full in zip(dims[1:], five, strict=True))
    ):
        return Mismatch(
            "the term added to the scores' rank-5 view is not [1, W|1, H|1, S|1, T|1] with "
            "static dims"
        )
    windows = five[0]
    assert windows is not None
    return _WindowTerm(term, windows, (int(dims[2]), int(dims[3]), int(dims[4])))


def _rank5_terms(
    add: ir.Node, source_rank: int
) -> tuple[list[ir.Value], list[ir.Node], ir.Node] | Mismatch:
    """Down a chain of rank-5 Adds from ``add`` to the rank-5 view of the scores (a Reshape from
    rank ``source_rank``): (the terms added, the Adds, the view's Reshape)."""
    nodes: list[ir.Node] = []
    terms: list[ir.Value] = []
    while True:
        nodes.append(add)
        sides = [
            (v, t) for v, t in (add.inputs, add.inputs[::-1]) if v is not None and t is not None
        ]
        split = next(
            (
                (reshape, t)
                for v, t in sides
                if (reshape := _view_of_rank(v, 5, source_rank)) is not None and _leads_to_scores(v)
            ),
            None,
        )
        if split is not None:
            terms.append(split[1])
            return terms, nodes, split[0]
        inner = next(
            (
                (producer_of(v, "Add"), t)
                for v, t in sides
                if value_rank(v) == 5 and _leads_to_scores(v) and len(terms) < MAX_BIAS_TERMS
            ),
            None,
        )
        if inner is None or inner[0] is None:
            return Mismatch("the Softmax input is a rank-5 Add without a view of Q@K^T")
        terms.append(inner[1])
        add = inner[0]


def _window_step(
    value: ir.Value | None,
) -> tuple[list[_WindowTerm], list[ir.Node], ir.Value] | Mismatch | None:
    """One step up from the Softmax through Swin's windowed mask: (terms, nodes, the scores).
    The terms are the operands of the rank-5 Adds between the two views (Hugging Face's Swin-V2
    adds its mask twice)."""
    found = _window_view(value)
    if found is None:
        return None
    add, back = found
    walked = _rank5_terms(add, 4)
    if isinstance(walked, Mismatch):
        return walked
    terms, adds, reshape = walked
    view = reshape.outputs[0]
    assert reshape.inputs[0] is not None
    scores = reshape.inputs[0]
    inner_dims = [static_dim(scores, axis) for axis in (1, 2, 3)]
    five = [static_dim(view, axis) for axis in (1, 2, 3, 4)]
    again = [static_dim(value, axis) for axis in (1, 2, 3)]
    if None in inner_dims or five[1:] != inner_dims or again != inner_dims or five[0] is None:
        return Mismatch(
            "the scores are viewed as rank 5 for a term (Swin's windowed mask), but the views "
            "are not provably [B, W, H, S, T] and back (static W, H, S and T needed)"
        )
    windows: list[_WindowTerm] = []
    for term in terms:
        window = _window_term(term, five)
        if isinstance(window, Mismatch):
            return window
        windows.append(window)
    return windows, [back, *adds, reshape], scores


@dataclass(frozen=True)
class _ViewTerms:
    """Terms added to the flat [N, S, T] scores while they are viewed at rank 5 (ViTDet's and
    segment-anything's decomposed relative positions: ``(attn.view(N, h, w, h, w) + rel_h[..., None]
    + rel_w[..., None, :]).view(N, S, T)``).

    The view back gives the scores their own shape, so, row-major, the sum is the scores plus the
    terms' sum viewed the same way: ``Reshape(Expand(t1 + t2, full), back)``, once the terms' sum
    has the view's full shape (``expand``: the Expand's target, 1 where the terms already have the
    dim; None where they have every one)."""

    terms: tuple[ir.Value, ...]
    back: ir.Value  # the target of the Reshape back to [N, S, T]
    expand: tuple[int, ...] | None
    shape: ir.Shape | None  # the scores'


@dataclass(frozen=True)
class _ViewStep:
    terms: _ViewTerms
    nodes: list[ir.Node]
    scores: ir.Value


def _view_step(value: ir.Value | None) -> _ViewStep | Mismatch | None:
    """One step up from the Softmax through a rank-5 view of the flat scores (see _ViewTerms)."""
    back = _view_of_rank(value, 3, 5)
    add = producer_of(back.inputs[0], "Add") if back is not None else None
    if back is None or add is None or value is None or len(back.inputs) < 2:
        return None
    walked = _rank5_terms(add, 3)
    if isinstance(walked, Mismatch):
        return walked
    terms, adds, reshape = walked
    view, scores = reshape.outputs[0], reshape.inputs[0]
    assert scores is not None and back.inputs[1] is not None
    if not _view_proved(value, [[(scores, 0)], [(scores, 1)], [(scores, 2)]]):
        return Mismatch(
            "the flat scores are viewed at rank 5 for a term and back, but the view back is not "
            "provably their own shape [N, S, T]"
        )
    entries = view_entries(view)
    target: list[int] = []
    for axis in range(5):
        if any(_covers(term, axis, view) for term in terms):
            target.append(1)
            continue
        entry = entries[axis] if entries is not None and len(entries) == 5 else None
        size = entry if isinstance(entry, int) and entry > 0 else static_dim(view, axis)
        if axis == 0 or size is None:
            return Mismatch(
                "the terms added to the rank-5 view of the flat scores do not provably span "
                f"its dim {axis}"
            )
        target.append(size)
    expand = tuple(target) if any(size != 1 for size in target) else None
    view_terms = _ViewTerms(tuple(terms), back.inputs[1], expand, scores.shape)
    return _ViewStep(view_terms, [back, *adds, reshape], scores)


def _outer_scale(value: ir.Value | None) -> tuple[ir.Node, ir.Value, float] | None:
    """``value`` = ``x / c`` or ``x * c`` (c a positive scalar constant) with x a term added to
    the scores or a masked_fill of them: (that node, x, the factor)."""
    if value is None:
        return None
    other, factor, peeled = peel_scale(value)
    step = _bias_step(other) if len(peeled) == 1 and factor > 0 else None
    if step is None or isinstance(step, Mismatch):
        return None
    return peeled[0], other, factor


def _covers(term: ir.Value, axis: int, view: ir.Value) -> bool:
    """Dim ``axis`` of the rank-5 ``view`` is the term's own (right-aligned): the same symbol or
    static size, or a read of it."""
    rank = value_rank(term)
    if rank is None or rank + axis < 5:
        return False
    index = axis - (5 - rank)
    if same_symbol(term, index, view, axis):
        return True
    size = static_dim(term, index)
    return size is not None and size == static_dim(view, axis) and size > 0


def _scores_step(
    value: ir.Value | None,
) -> _BiasStep | tuple[list[_WindowTerm], list[ir.Node], ir.Value] | _ViewStep | Mismatch | None:
    """One step up from the Softmax: a bias term or masked_fill (:func:`_bias_step`), else terms
    added to the windowed view of the scores (:func:`_window_step`) or to a rank-5 view of the
    flat ones (:func:`_view_step`)."""
    step = _bias_step(value)
    if step is None:
        return _window_step(value) or _view_step(value)
    return step


def _window_bias(
    tape: ir.tape.Tape, window: _WindowTerm, block: AttentionBlock, opset: int
) -> ir.Value:
    """The windowed term as a [B*W, h, s, t] bias, B = (the query's B*W) / W read at run time."""
    query = block.query.four_d or block.query.three_d
    assert query is not None
    images = tape.op("Div", [seq_len(tape, query, 0, opset), int64_const(tape, [window.windows])])
    target = tape.op("Concat", [images, int64_const(tape, [window.windows, 1, 1, 1])], {"axis": 0})
    expanded = tape.op("Expand", [window.term, target])
    result = tape.op("Reshape", [expanded, int64_const(tape, [-1, *window.dims])])
    result.shape = ir.Shape([None, *window.dims])
    if window.term.dtype is not None:
        result.dtype = window.term.dtype
    return result


@dataclass(frozen=True)
class _KeptRows:
    """``condition`` marks the kept keys where it is ``kept_where_true``, else the masked ones."""

    condition: ir.Value
    kept_where_true: bool
    dtype: ir.DataType


def _masked_zeroing(
    probs: ir.Value, fills: Sequence[_MaskedFill]
) -> tuple[ir.Node, _KeptRows] | Mismatch | None:
    """P's one reader ``Where(c, 0, P)`` (or ``Where(c, P, 0)``) zeroing what the scores' one
    masked_fill masked (the same condition, the same side): DeBERTa's XSoftmax before
    transformers 5, Keras' masked softmax. A masked key's probability is exactly 0 already
    wherever a key of the row is kept (the fused fill is <= MASK_FLOOR: exp underflows); a row
    with no kept key is uniform after the Softmax and 0 after the Where, so the fused output is
    multiplied by whether the row keeps a key. The condition must be one for all heads (its dim
    for H is 1)."""
    where = _main_user(probs)
    if len(fills) != 1 or where is None or not is_op(where, "Where") or len(where.inputs) != 3:
        return None
    if probs.is_graph_output() or len(list(probs.uses())) != 1:
        return None
    fill = fills[0]
    condition, chosen, other = where.inputs
    if condition is not fill.condition:
        return None
    zeroed = other if fill.scores_first else chosen
    kept = chosen if fill.scores_first else other
    if kept is not probs or not _is_zero(zeroed):
        return None
    rank = value_rank(condition)
    if rank is None or (rank >= 3 and static_dim(condition, rank - 3) != 1):
        return Mismatch(
            "the probabilities are zeroed where masked by a mask not provably one for all heads"
        )
    array = const_array(fill.fill)
    assert array is not None and condition is not None  # _bias_step read it
    dtype = ir.DataType.from_numpy(array.dtype)
    return where, _KeptRows(condition, fill.scores_first, dtype)


def _kept_rows(tape: ir.tape.Tape, kept: _KeptRows, opset: int) -> ir.Value:
    """1 where a row of the scores keeps a key, else 0: [B|1, S|1, 1] (the heads' dim dropped),
    in the attention's element type."""
    keep = kept.condition if kept.kept_where_true else tape.op("Not", [kept.condition])
    as_float = tape.op("Cast", [keep], {"to": ir.DataType.FLOAT})
    any_kept = with_axes(tape, "ReduceMax", as_float, [-1], opset, {"keepdims": 1})
    rank = value_rank(kept.condition) or 0
    if rank >= 3:  # [.., H=1, S, 1] -> [.., S, 1]
        any_kept = with_axes(tape, "Squeeze", any_kept, [rank - 3], opset)
    if kept.dtype != ir.DataType.FLOAT:
        any_kept = tape.op("Cast", [any_kept], {"to": kept.dtype})
    return any_kept


@dataclass(frozen=True)
class _BiasStep:
    node: ir.Node  # the Add or Where
    term: ir.Value | _MaskedFill
    scores: ir.Value  # its operand leading to Q@K^T


def _bias_step(value: ir.Value | None) -> _BiasStep | Mismatch | None:
    """One step up from the Softmax towards Q@K^T: an Add of a bias term, or a masked_fill Where."""
    node = value.producer() if value is not None else None
    if is_op(node, "Add"):
        assert node is not None
        scores_at = _scores_side(node)
        if scores_at is None:
            return Mismatch("the Softmax input is an Add without a Q@K^T MatMul operand")
        term, scores = node.inputs[1 - scores_at], node.inputs[scores_at]
        assert term is not None and scores is not None
        return _BiasStep(node, term, scores)
    if not is_op(node, "Where"):
        return None
    assert node is not None
    condition, then, other = node.inputs if len(node.inputs) == 3 else (None, None, None)
    if condition is None or then is None or other is None:
        return Mismatch("the Softmax input is a Where with a missing input")
    leads = [_leads_to_scores(then), _leads_to_scores(other)]
    if leads.count(True) != 1:
        return Mismatch(
            "the Softmax input is a Where that does not pick between the scores and a fill"
        )
    scores, fill = (then, other) if leads[0] else (other, then)
    array = const_array(fill)
    if array is None or array.size != 1 or not np.issubdtype(array.dtype, np.floating):
        return Mismatch("the masked_fill Where's other branch is not a float scalar constant")
    value_filled = float(array.reshape(-1)[0])
    if not value_filled <= RAISED_FILL_LIMIT:  # NaN too
        return Mismatch(
            f"masked_fill with {value_filled:g} is not an exact additive mask: a kept score "
            f"near {value_filled:g} would share the masked keys' weight (fills <= "
            f"{RAISED_FILL_LIMIT:g} are fused)"
        )
    return _BiasStep(node, _MaskedFill(condition, fill, scores_first=leads[0]), scores)


def _raisable(fill: _MaskedFill, factor: float) -> bool:
    """The raised fill, MASK_FLOOR / factor, is finite in the fill's element type (a float16
    fill holds neither; a tiny factor would overflow float32)."""
    dtype = fill.fill.dtype.numpy() if fill.fill.dtype is not None else None
    with np.errstate(over="ignore"):
        return dtype is not None and bool(np.isfinite(np.asarray(MASK_FLOOR / factor, dtype)))


def _fill_value(fill: _MaskedFill) -> float:
    array = const_array(fill.fill)
    assert array is not None  # _bias_step read it
    return float(array.reshape(-1)[0])


def _broadcast_shape(values: Sequence[ir.Value]) -> ir.Shape | None:
    """The shape numpy broadcasting gives ``values`` (all of known rank); a dim is kept where the
    operands agree or the others are 1, else left unknown."""
    shapes = [v.shape for v in values]
    if any(shape is None for shape in shapes):
        return None
    rank = max(len(shape) for shape in shapes if shape is not None)
    dims: list[int | ir.SymbolicDim | None] = []
    for axis in range(rank):
        seen = []
        for shape in shapes:
            assert shape is not None
            offset = axis - (rank - len(shape))
            if offset >= 0:
                seen.append(shape[offset])
        wide = [d for d in seen if not (isinstance(d, int) and d == 1)]
        if not wide:
            dims.append(1)
        elif all(d == wide[0] for d in wide) and (
            isinstance(wide[0], int) or wide[0].value is not None
        ):
            dims.append(wide[0])
        else:
            dims.append(None)
    return ir.Shape(dims)


def _summed_bias(
    tape: ir.tape.Tape, block: AttentionBlock, heads: int, opset: int
) -> ir.Value | None:
    """``block.bias`` plus its further terms and masked_fill biases, one Add each; the sum's shape
    is recorded (the mask's dims decide whether it must be spelled out)."""
    terms = [
        *([block.bias] if block.bias is not None else []),
        *block.more_bias,
        *([_fills_bias(tape, block.fills, block.term_factor)] if block.fills else []),
        *(_flat_bias(tape, term, block, heads, opset) for term in block.flat_terms),
        *(_window_bias(tape, window, block, opset) for window in block.window_terms),
        *(
            _flat_bias(tape, _view_bias(tape, view), block, heads, opset)
            for view in block.view_terms
        ),
    ]
    if not terms:
        return None  # a floor of the bare scores clamps nothing (s >= -1e30 > floor)
    bias = terms[0]
    for term in terms[1:]:
        bias = tape.op("Add", [bias, term])
    dtype = terms[0].dtype.numpy() if terms[0].dtype is not None else np.dtype(np.float32)
    if block.floor is not None:
        floor = tape.op("Constant", [], {"value": ir.tensor(np.array(block.floor, dtype))})
        bias = tape.op("Max", [bias, floor])
    if block.term_factor != 1.0:
        factor = tape.op("Constant", [], {"value": ir.tensor(np.array(block.term_factor, dtype))})
        bias = tape.op("Mul", [bias, factor])
    if bias is not terms[0]:
        if terms[0].dtype is not None:
            bias.dtype = terms[0].dtype
        bias.shape = _broadcast_shape(terms)
    return bias


def _view_bias(tape: ir.tape.Tape, view: _ViewTerms) -> ir.Value:
    """The terms of the rank-5 view as one [B*H, S, T] term (see _ViewTerms)."""
    total = view.terms[0]
    for term in view.terms[1:]:
        total = tape.op("Add", [total, term])
    if view.expand is not None:
        total = tape.op("Expand", [total, int64_const(tape, list(view.expand))])
    result = tape.op("Reshape", [total, view.back])
    result.shape = view.shape
    if view.terms[0].dtype is not None:
        result.dtype = view.terms[0].dtype
    return result


def _fills_bias(tape: ir.tape.Tape, fills: Sequence[_MaskedFill], factor: float) -> ir.Value:
    """The masked_fills as one additive bias: ``Where(condition, 0, fill)`` (branches as found),
    and for several, each outer one's Where around the inner ones' bias (``fills`` run from the
    Softmax up): an entry two fills mask holds the outer fill, as in the export, not their sum.
    For a raised fill, the value that the terms' ``factor`` makes MASK_FLOOR."""
    bias: ir.Value | None = None
    for fill in reversed(fills):
        assert fill.fill.dtype is not None
        dtype = fill.fill.dtype.numpy()
        inner = bias
        if inner is None:
            inner = tape.op("Constant", [], {"value": ir.tensor(np.zeros((), dtype))})
        filled = fill.fill
        if fill.raised:
            array = const_array(fill.fill)
            assert array is not None  # _bias_step read it
            floor = np.full(array.shape, MASK_FLOOR / factor, dtype)
            filled = tape.op("Constant", [], {"value": ir.tensor(floor)})
        branches = [inner, filled] if fill.scores_first else [filled, inner]
        outer = tape.op("Where", [fill.condition, *branches])
        outer.dtype = fill.fill.dtype
        outer.shape = _broadcast_shape(
            (fill.condition, fill.fill, *([bias] if bias is not None else []))
        )
        bias = outer
    assert bias is not None
    return bias


def _computed_from(value: ir.Value, nodes: set[int], budget: int = 2000) -> bool:
    """Whether ``value`` is computed from the outputs of ``nodes`` (ids): a walk up its producers,
    at most ``budget`` nodes (beyond it the answer is no: a result read elsewhere keeps the block
    from fusing anyway)."""
    seen: set[int] = set()
    stack = [value.producer()]
    while stack and len(seen) < budget:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        if id(node) in nodes:
            return True
        seen.add(id(node))
        stack.extend(v.producer() for v in node.inputs if v is not None)
    return False


SINKS_LEFT = (
    "attention sinks (a learned logit per head joins each softmax row, its column dropped after)"
)


def _match_attention(softmax: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if query_rows.respelled(softmax):
        return Mismatch("a block on query rows: its respelling on heads is the candidate", False)
    found = match_attention_block(softmax, context)
    if isinstance(found, Match) and found.bindings["block"].sinks is not None:
        if context.options.target == "onnx":
            return Mismatch(
                f"{SINKS_LEFT}: ONNX Attention-23 has no sinks, so --target onnx leaves them "
                "unfused"
            )
        return Mismatch(
            f"{SINKS_LEFT}: MultiHeadAttention has none; fuse-group-query-attention fuses them "
            "into GroupQueryAttention with head_sink"
        )
    if isinstance(found, Match):
        cap = found.bindings["block"].softcap
        if cap:
            op = "GroupQueryAttention" if context.options.target == "ort" else "Attention-23"
            # A true reason either way: with --enable, fuse-softcap-attention's stats show the
            # blocks it fused after this pass.
            return Mismatch(
                f"soft-capped scores (tanh(s / {cap:g}) * {cap:g}): left to the opt-in "
                f"fuse-softcap-attention (--enable), which fuses them into {op} with softcap "
                "(MultiHeadAttention has none); ONNX Runtime 1.32's CPU softcap measured slower "
                "than the unfused graph"
            )
    return found


def _match_softcap_onnx(softmax: ir.Node, context: RewriteContext) -> Match | Mismatch:
    if context.options.target != "onnx":
        return Mismatch("--target ort: GroupQueryAttention's softcap rules apply", False)
    found = match_attention_block(softmax, context)
    if isinstance(found, Mismatch):  # fuse-attention's rule says why
        return Mismatch(found.reason, candidate=False)
    if not found.bindings["block"].softcap:
        return Mismatch("the scores are not soft-capped (fuse-attention's case)", False)
    if found.bindings["block"].sinks is not None:
        return Mismatch(f"{SINKS_LEFT}: ONNX Attention-23 has no sinks")
    return found


def match_attention_block(softmax: ir.Node, context: RewriteContext) -> Match | Mismatch:
    """The attention block rooted at ``softmax``: Match(nodes, {"block": AttentionBlock, "heads": H}).

    Also for fuse-group-query-attention, which fuses soft-capped blocks (no MultiHeadAttention
    form) into GroupQueryAttention itself."""
    axis = softmax_axis(softmax, context.opset())
    scores = softmax.inputs[0]
    if scores is None:
        return Mismatch("Softmax has no input")
    rank = value_rank(scores)
    if axis != -1 and not (rank is not None and axis == rank - 1):
        return Mismatch(f"Softmax is over axis {axis}, not the last one")
    nodes: list[ir.Node] = []
    # Walk up: [Add bias]* <- [scalar scale] <- MatMul(Q, K^T). T5 and MPNet add a position bias,
    # then the mask: each Add's other operand is one term of the additive bias.
    # GPT-Neo and anything written ``masked_fill`` put a Where(mask, scores, fill) among them.
    terms: list[ir.Value] = []
    fills: list[_MaskedFill] = []
    windows: list[_WindowTerm] = []
    views: list[_ViewTerms] = []
    base: ir.Value | None = scores
    # GPT-OSS: Softmax(Concat(scores, sinks) - row max), the sinks' column dropped after.
    sinks = _sink_logits(base)
    if sinks is None:
        sinks = _scaling_sinks(softmax)
    if isinstance(sinks, Mismatch):
        return sinks
    if sinks is not None and sinks.scale is None:
        nodes.extend(sinks.nodes)
        base = sinks.scores
    # XGLM and fairseq-style decoders: Softmax(Reshape(Max(scores4 + mask, lowest), [B*H, S, T])).
    softmax_view = _view_of_rank(base, 3, 4)
    if softmax_view is not None:
        nodes.append(softmax_view)
        base = softmax_view.inputs[0]
    base_scores4 = base  # the [B, H, S, T] scores a flat Softmax's rows are (clamped or not)
    # CodeGen before transformers 5 scales after its mask: (Q@K^T + mask) / c.
    outer = _outer_scale(base) if softmax_view is None else None
    outer_factor = 1.0
    if outer is not None:
        nodes.append(outer[0])
        base, outer_factor = outer[1], outer[2]
    clamp = _score_floor(base)
    if isinstance(clamp, Mismatch):
        return clamp
    if clamp is not None:
        if outer is not None:
            return Mismatch("the scores are clamped under a scale applied after their terms")
        nodes.append(clamp[0])
        base = clamp[1]
    while True:
        trip = _flat_round_trip(base)
        if trip is not None:
            nodes.extend(trip[0])
            base = trip[1]
            continue
        step = _scores_step(base)
        if step is None:
            break
        if isinstance(step, Mismatch):
            return step
        if len(terms) + len(fills) + len(windows) + len(views) == MAX_BIAS_TERMS:
            return Mismatch(f"the scores get more than {MAX_BIAS_TERMS} additive terms")
        if isinstance(step, _ViewStep):
            views.append(step.terms)
            nodes.extend(step.nodes)
            base = step.scores
            continue
        if isinstance(step, tuple):
            if len(terms) + len(fills) + len(windows) + len(views) + len(step[0]) > MAX_BIAS_TERMS:
                return Mismatch(f"the scores get more than {MAX_BIAS_TERMS} additive terms")
            windows.extend(step[0])
            nodes.extend(step[1])
            base = step[2]
            continue
        if isinstance(step.term, _MaskedFill):
            fills.append(step.term)
        else:
            terms.append(step.term)
        nodes.append(step.node)
        base = step.scores
    assert base is not None
    # BLOOM: the scores come as [B*H, S, T] (bmm), with a term of their own (ALiBi) added there.
    flat_terms: list[ir.Value] = []
    unproven_rows: list[ir.Value] = []
    flat_scores: ir.Value | None = None
    unflatten = _unflattening(base)
    if softmax_view is not None and unflatten is None:
        return Mismatch(
            "the scores are viewed as [B*H, S, T] for the Softmax but Q@K^T is not computed on "
            "heads flattened into the batch"
        )
    if unflatten is not None:
        nodes.append(unflatten)
        scores4 = base
        base = flat_scores = unflatten.inputs[0]
        while (step := _bias_step(base)) is not None:
            if isinstance(step, Mismatch):
                return step
            if isinstance(step.term, _MaskedFill):
                return Mismatch("a masked_fill of the [B*H, S, T] scores is not fused")
            if len(terms) + len(fills) + len(flat_terms) == MAX_BIAS_TERMS:
                return Mismatch(f"the scores get more than {MAX_BIAS_TERMS} additive terms")
            flat_terms.append(step.term)
            nodes.append(step.node)
            base = step.scores
        assert base is not None
    # The fills as the Softmax sees them, scaled with the scores by a scale after their terms
    # (CodeGen's, or ``masked_fill(...) / sqrt(d)``): raised where they are above the floor.
    seen = [_fill_value(fill) * outer_factor for fill in fills]
    for value in seen:
        if not value <= RAISED_FILL_LIMIT:
            return Mismatch(
                f"a masked_fill's fill, scaled with the scores after it, is {value:g}: no longer "
                f"an exact additive mask (fills <= {RAISED_FILL_LIMIT:g} are fused)"
            )
    fills = [replace(fill, raised=not value <= MASK_FLOOR) for fill, value in zip(fills, seen)]
    raised = [value for fill, value in zip(fills, seen) if fill.raised]
    if len(fills) > 1 and (terms or flat_terms or windows or views or clamp is not None):
        # the fills nest (an entry two of them mask holds the outer one), the terms add: in
        # which order the export mixes them decides fully masked rows
        return Mismatch("the scores get several masked_fills beside other terms")
    if raised and (
        terms or flat_terms or windows or views or clamp is not None or sinks is not None
    ):
        return Mismatch(
            f"a masked_fill of {raised[0]:g} (above {MASK_FLOOR:g}) is fused only with other "
            "masked_fills, not beside other terms, clamped or beside sinks"
        )
    if raised and len(set(seen)) > 1:
        # the export's fully masked rows weigh only the keys of the highest fill; raised to one
        # value, fills that differ would weigh them all
        return Mismatch(
            f"the scores' masked_fills differ ({', '.join(f'{v:g}' for v in seen)}) and one is "
            f"above {MASK_FLOOR:g}: raised, they would no longer differ"
        )
    if raised and not all(_raisable(fill, outer_factor) for fill in fills):
        return Mismatch(
            f"the masked_fill cannot be raised to {MASK_FLOOR:g} / {outer_factor:g} (the scale "
            "after it) in its element type"
        )
    capped = _soft_cap(base)
    if isinstance(capped, Mismatch):
        return capped
    if outer is not None and capped is not None:
        return Mismatch("the scores are soft-capped under a scale applied after their terms")
    cap_nodes: list[ir.Node] = []
    if capped is not None:
        if unflatten is not None:
            return Mismatch("a soft cap of the [B*H, S, T] scores is not fused")
        base, cap_nodes = capped.scores, list(capped.nodes)
    scores_mm, post_scale, head_factor, scale_nodes = _scores_product(base)
    matmul = producer_of(scores_mm, "MatMul")
    if matmul is None:
        return Mismatch("the Softmax input is not (scaled) Q@K^T")
    if matmul.inputs[0] is None or matmul.inputs[1] is None:
        return Mismatch("Q@K^T has a missing input")
    query_base, query_scale, query_nodes = peel_scale(matmul.inputs[0])
    query4 = matmul.inputs[0]
    # Whisper's and BART's encoders as older transformers wrote them, and torch's
    # multi_head_attention_forward (baddbmm with its [B*H, 1|S, T] mask): the whole block on
    # [B*H, ...] heads, Softmax(Q3 @ K3^T + terms) @ V3, the terms those of the flat scores.
    all_flat = (
        unflatten is None
        and capped is None
        and not fills
        and not windows
        and value_rank(scores_mm) == 3
        and value_rank(query_base) == 3
    )
    if all_flat:
        flat_terms, terms = terms, []
    elif views:
        return Mismatch(
            "terms are added to a rank-5 view of scores that are not the flat [B*H, S, T] ones"
        )
    flat_heads = unflatten is not None or all_flat
    if flat_heads:
        flat_query = _flattened_from(query_base)
        if flat_query is None:
            return Mismatch(
                "the flattened query is not provably [B, H, S, d] viewed as [B*H, S, d]"
            )
        query4, query_reshape = flat_query
        query_base, more, inner = peel_scale(query4)
        query_scale *= more
        query_nodes = [*inner, query_reshape, *query_nodes]
        flat_key = _flat_key(matmul.inputs[1])
        # T is the key's length (DeBERTa-v2's TorchScript export reads it for the view)
        key_length = (
            [(flat_key[0].four_d, 2)]
            if not isinstance(flat_key, Mismatch) and flat_key[0].four_d is not None
            else []
        )
    if unflatten is not None:
        # S and T may be read off the [B*H, S, T] scores with their terms added (DeBERTa-v3): a
        # term could only make them larger where S (or T) is 1, and the fused op then rejects
        # the larger bias.
        assert flat_scores is not None  # _unflattening read its rank
        scores_dims = [
            [(query_base, 0)],
            [(query_base, 1)],
            [(query_base, 2), (flat_scores, 1)],
            [*key_length, (flat_scores, 2)],
        ]
        if not _view_proved(scores4, scores_dims):
            return Mismatch("the [B*H, S, T] scores are not provably viewed as [B, H, S, T]")
    for term in flat_terms:
        rank = value_rank(term)
        if rank is None or rank > 3:
            return Mismatch("a term of the [B*H, S, T] scores is not of rank 3 or less")
        if (
            rank == 3
            and static_dim(term, 0) != 1
            and not same_symbol(term, 0, base, 0)
            and not _batch_times_heads(term, _first_entry(term), query_base, any_batch=True)
        ):
            unproven_rows.append(term)
    key = flat_key if flat_heads else _key_transposed(matmul.inputs[1])
    if isinstance(key, Mismatch):
        return key
    key_heads, key_scale, key_nodes = key
    query_heads = _split_heads(query_base)
    scaled_heads = _split_scaled_heads(query_base) if query_heads.three_d is None else None
    if scaled_heads is not None:
        query_heads, more = scaled_heads
        query_scale *= more
    # Walk down: [IsNaN/Where guard] -> MatMul(P, V) -> Transpose -> Reshape
    probs = softmax.outputs[0]
    sink_nodes: list[ir.Node] = []
    if sinks is not None and sinks.scale is not None:
        sink_nodes.extend(sinks.nodes)  # they read the scores, beside the Softmax
    elif sinks is not None:
        drop = _main_user(probs)
        if drop is None or not _drops_sink(drop, probs):
            return Mismatch(
                "the scores are joined by a column of sinks, but the probabilities do not drop "
                "that last column ([..., :-1]) alone"
            )
        sink_nodes.append(drop)
        probs = drop.outputs[0]
    nan_guard = False
    # Shape reads of P (DeBERTa-v2's TorchScript views) are checked with the others (_dies_with)
    uses = [u.node for u in probs.uses() if not is_op(u.node, "Shape")]
    guard_nodes: list[ir.Node] = []
    if len(uses) == 2 and not probs.is_graph_output():
        isnan = next((n for n in uses if is_op(n, "IsNaN")), None)
        where = next((n for n in uses if is_op(n, "Where")), None)
        if (
            isnan is None
            or where is None
            or where.inputs[0] is not isnan.outputs[0]
            or where.inputs[2] is not probs
            or not _is_zero(where.inputs[1])
            or single_consumer(isnan.outputs[0]) is not where
        ):
            return Mismatch("the attention probabilities have other consumers")
        nan_guard = True
        guard_nodes = [isnan, where]
        probs = where.outputs[0]
    zeroing = None if nan_guard else _masked_zeroing(probs, fills)
    if isinstance(zeroing, Mismatch):
        return zeroing
    if zeroing is not None:
        guard_nodes = [zeroing[0]]
        probs = zeroing[0].outputs[0]
    pv_nodes: list[ir.Node] = []
    # GPT-NeoX-Japanese: Q@K^T on the flattened heads (baddbmm), viewed back to [B, H, S, T] for
    # the mask and the Softmax, then P@V on the [B, H, ...] heads: nothing left flat after them.
    four_d_pv = (
        unflatten is not None
        and softmax_view is None
        and is_op(pv := _main_user(probs), "MatMul")
        and pv is not None
        and pv.inputs[0] is probs
    )
    flat_pv = flat_heads and not four_d_pv
    if unflatten is not None and not four_d_pv:
        probs4: ir.Value
        if softmax_view is not None:
            assert base_scores4 is not None  # the Reshape's input: _view_of_rank read its rank
            # The Softmax ran on the [B*H, S, T] view: its rows are those of the 4-D scores.
            # XGLM views P as [B, H, S, T] and back before P@V: row-major views of views keep
            # the element order, so only the last one's shape matters.
            probs4, flat_view = base_scores4, softmax_view.outputs[0]
            while is_op(view := _main_user(probs), "Reshape") and view is not None:
                pv_nodes.append(view)
                probs = view.outputs[0]
            if pv_nodes and not _view_proved(
                probs, _flat_dims(probs4, query_base, key_heads), flat_of=query_base
            ):
                return Mismatch("the probabilities' view is not provably [B*H, S, T]")
        else:
            probs4 = probs
            flatten = _main_user(probs4)
            if not is_op(flatten, "Reshape") or flatten is None:
                return Mismatch("the [B, H, S, T] probabilities are not viewed as [B*H, S, T]")
            probs = flat_view = flatten.outputs[0]
            pv_nodes.append(flatten)
        if not _view_proved(
            flat_view, _flat_dims(probs4, query_base, key_heads), flat_of=query_base
        ):
            return Mismatch("the probabilities' view is not provably [B*H, S, T]")
    pv = _main_user(probs)
    if not is_op(pv, "MatMul") or pv is None or pv.inputs[0] is not probs or pv.inputs[1] is None:
        return Mismatch("the attention probabilities are not multiplied by V")
    pv_nodes.append(pv)
    value4 = pv.inputs[1]
    pv_out = pv.outputs[0]
    if sinks is not None and sinks.scale is not None:
        if flat_pv or _main_user(pv_out) is not sinks.scale:
            return Mismatch(
                "the sinks' scale sigmoid(logsumexp - sinks) multiplies something other than "
                "the [B, H, S, d] P@V"
            )
        pv_nodes.append(sinks.scale)
        pv_out = sinks.scale.outputs[0]
    merged: _Merge | None = None
    if flat_pv:
        flat_value = _flattened_from(value4)
        if flat_value is None:
            return Mismatch(
                "the flattened value is not provably [B, H, T, d] viewed as [B*H, T, d]"
            )
        value4, value_reshape = flat_value
        unflatten_pv = _main_user(pv_out)
        # torch's multi_head_attention_forward merges P@V [B*H, S, d] sequence-first
        merged = _flat_seq_first_merge(unflatten_pv)
        if merged is None:
            if not is_op(unflatten_pv, "Reshape") or unflatten_pv is None:
                return Mismatch("P@V as [B*H, S, d] is not viewed back as [B, H, S, d]")
            merged = _spatial_merge(unflatten_pv, query_base, value4)
            if merged is None and value_rank(unflatten_pv.outputs[0]) == 5:
                return Mismatch(
                    "P@V is viewed on an image grid, but not provably as [B, H, h, w, d] with "
                    "h*w = S, moved by [0, 2, 3, 1, 4] and viewed back as [B, h, w, H*d]"
                )
        if merged is None:
            assert unflatten_pv is not None
            pv_out = unflatten_pv.outputs[0]
            pv_dims = [
                [(query_base, 0)],
                [(query_base, 1)],
                [(query_base, 2), *([(probs4, 2)] if unflatten is not None else [])],
                [(value4, 3)],
            ]
            if not _view_proved(pv_out, pv_dims):
                return Mismatch("the view of P@V is not provably [B, H, S, d]")
            pv_nodes.append(unflatten_pv)
    block_values = [pv_out, query4, query_base, value4]
    by_axis = (
        block_values,
        block_values,
        [pv_out, query4, query_base],
        [pv_out, value4],
    )
    grid = _main_user(pv_out)
    if merged is None and is_op(grid, "Reshape") and value_rank(pv_out) == 4 and grid is not None:
        merged = _spatial_merge(grid, query_base, value4)
    merged = merged or _merged_heads(pv_out, by_axis)
    if merged is None:
        return Mismatch(
            "the attention output is not merged back to [B, S, H*d] (or nn.MultiheadAttention's "
            "[S, B, H*d]) by Transpose+Reshape"
        )
    output, out_nodes, output_target = merged.output, merged.nodes, merged.target
    value_heads = _split_heads(value4)
    value_nodes = list(value_heads.nodes)
    if flat_pv:
        value_nodes.append(value_reshape)

    heads = query_heads.heads or key_heads.heads or value_heads.heads
    value_size = value_heads.head_size or static_dim(pv_out, 3)
    width = last_dim(output)
    if width is None:
        out_entries = target_entries(out_nodes[-1].inputs[1])
        width = (
            out_entries[-1]
            if out_entries and isinstance(out_entries[-1], int) and out_entries[-1] > 0
            else None
        )
    if width is None:  # the output projection's weight is [H*dv, D]
        for use in output.uses():
            weight = use.node.inputs[1] if len(use.node.inputs) > 1 else None
            if (
                (is_op(use.node, "MatMul") or is_op(use.node, "Gemm"))
                and use.idx == 0
                and value_rank(weight) == 2
            ):
                width = (
                    static_dim(weight, 0)
                    if not use.node.attributes.get_int("transB", 0)
                    else static_dim(weight, 1)
                )
    if heads is None and value_size and width and width % value_size == 0:
        heads = width // value_size  # [B, S, H*dv] merged from heads of size dv
    if heads is None:
        return Mismatch("cannot tell the number of heads (shapes unknown)")
    # Multi-query attention (Falcon): one K/V head that Q@K^T and P@V broadcast against the H
    # query heads. The rewrite repeats it H times, as repeat_kv does for grouped K/V.
    kv_repeat = (
        heads
        if heads > 1 and query_heads.heads == heads and key_heads.heads == value_heads.heads == 1
        else 1
    )
    for side in (query_heads, key_heads, value_heads):
        if side.heads is not None and side.heads != heads and kv_repeat == 1:
            return Mismatch(
                f"Q, K and V have different head counts ({side.heads} vs {heads}); grouped K/V not repeated"
            )
    if (
        query_heads.head_size is not None
        and key_heads.head_size is not None
        and query_heads.head_size != key_heads.head_size
    ):
        return Mismatch("Q and K have different head sizes")
    target = context.options.target
    if key_heads.head_size is None or value_heads.head_size is None:
        return Mismatch(
            f"K and V head sizes are not provably known ({key_heads.head_size} vs "
            f"{value_heads.head_size})"
        )
    if key_heads.head_size != value_heads.head_size and not (
        target == "onnx" or (kv_repeat == 1 and _flat_kv(key_heads) and _flat_kv(value_heads))
    ):
        # LeViT: V's heads are wider than K's (DeepSeek's latent attention: narrower). Attention-23
        # takes that; MultiHeadAttention only with K and V as [B, T, H*d] (it refuses
        # [B, H, T, d] K/V of two sizes): their rows where the graph has them, else their heads
        # moved back (one Transpose each: level with the unfused graph at 128 tokens, faster
        # at 512, benchmarks/attention_speed.py's deepseek).
        return Mismatch(
            f"K and V head sizes differ ({key_heads.head_size} vs {value_heads.head_size}) and "
            "they are not both available as [B, T, H*d], the only layout MultiHeadAttention "
            "takes them in"
        )
    if scores.dtype is not None and scores.dtype not in ATTENTION_DTYPES:
        return Mismatch(
            f"attention in {scores.dtype.name}: only float32 and float16 blocks are fused "
            "(the fused kernels' CPU coverage)"
        )
    if sinks is not None and sinks.logits.size not in (1, heads):
        return Mismatch(f"the sink column holds {sinks.logits.size} logits for {heads} heads")
    for term in [*terms, *(fill.condition for fill in fills)]:
        problem = _check_bias(term, heads)
        if problem is not None:
            return problem
    chain = {id(node) for node in [matmul, *scale_nodes, *cap_nodes, *nodes]}
    for fill in fills:
        if _computed_from(fill.condition, chain):
            return Mismatch(
                "the masked_fill condition is computed from the scores themselves, so it is "
                "not a mask"
            )
    # An all-pass mask (ViT's dynamo export), or baddbmm's zeros (GPT-NeoX's TorchScript export
    # under transformers 4.x, on the flat scores): adding 0 changes no score.
    terms = [term for term in terms if not _all_equal_to(term, 0.0)]
    flat_terms = [term for term in flat_terms if not _all_equal_to(term, 0.0)]
    bias = terms[0] if terms else None
    block = AttentionBlock(
        query=query_heads,
        key=key_heads,
        value=value_heads,
        scale=query_scale * key_scale * post_scale * outer_factor,
        term_factor=outer_factor,
        bias=bias,
        nan_guard=nan_guard,
        output=output,
        more_bias=tuple(terms[1:]),
        fills=tuple(fills),
        flat_terms=tuple(flat_terms),
        unproven_rows=tuple(unproven_rows),
        output_target=output_target,
        seq_first=merged.seq_first,
        kv_repeat=kv_repeat,
        softcap=capped.cap if capped is not None else 0.0,
        floor=clamp[2] if clamp is not None else None,
        window_terms=tuple(windows),
        view_terms=tuple(views),
        query_factor=head_factor,
        sinks=None if sinks is None else np.broadcast_to(sinks.logits, (heads,)).copy(),
        gate=merged.gate,
        kept_rows=zeroing[1] if zeroing is not None else None,
    )
    if target == "onnx" and context.opset() < ONNX_ATTENTION_OPSET:
        return Mismatch(
            f"--target onnx: ONNX Attention needs opset {ONNX_ATTENTION_OPSET}, the model has {context.opset()}"
        )
    ordered = [
        *reversed(value_nodes),
        *reversed(key_nodes),
        *reversed(query_heads.nodes),
        *reversed(query_nodes),
        matmul,
        *reversed(scale_nodes),
        *cap_nodes,
        *nodes,
        *([sinks.column] if sinks is not None and sinks.column is not None else []),
        softmax,
        *sink_nodes,
        *guard_nodes,
        *pv_nodes,
        *out_nodes,
    ]
    heavy = [
        matmul,
        *scale_nodes,
        *cap_nodes,
        *nodes,
        softmax,
        *sink_nodes,
        *guard_nodes,
        *pv_nodes,
        *out_nodes[:-1],
    ]
    if output_target is not None and _computed_from(output_target, {id(n) for n in heavy}):
        # re-applied to the fused output, the target may not read the tensors that go
        return Mismatch("the output's view reads its shape off the attention tensors")
    if merged.gate is not None and _computed_from(merged.gate, {id(n) for n in heavy}):
        return Mismatch("the gate of the heads is computed from the attention tensors")
    if any(_computed_from(view.back, {id(n) for n in heavy}) for view in views):
        return Mismatch("the view of the scores back from rank 5 reads its shape off them")
    meanings = _dim_meanings(heavy, out_nodes)

    def meaning(node: ir.Node) -> str | None:
        read = _dim_read(node)
        return None if read is None else meanings.get(read[0], {}).get(read[1])

    found = _dies_with(set(ordered), heavy, ordered, lambda node: meaning(node) is not None)
    if found is None:
        return Mismatch(
            "an intermediate attention tensor (scores, probabilities or P@V) has other consumers"
        )
    readers, repointed = found
    if repointed:
        dim_reads = tuple((node, meaning(node) or "") for node in repointed)
        block = replace(block, dim_reads=dim_reads)
    # Graph order, so that the driver can drop consumers before their producers (root last).
    position = {id(node): i for i, node in enumerate(context.graph)}
    ordered = sorted(
        {id(n): n for n in [*ordered, *readers, *repointed]}.values(),
        key=lambda n: position.get(id(n), -1),
    )
    # The re-pointed dim reads' users may come before the root: the new nodes go before the
    # first read. What the fused op reads (V, the mask) may come later still: the pass sorts.
    anchor = min(repointed, key=lambda n: position.get(id(n), -1)) if repointed else None
    return Match(ordered, {"block": block, "heads": heads, "softmax": softmax}, anchor=anchor)


def _flat_dims(probs4: ir.Value, query4: ir.Value, key: _Heads) -> list[list[tuple[ir.Value, int]]]:
    """The dims a [B*H, S, T] view of the [B, H, S, T] ``probs4`` has (dim 0 is proved B*H of
    the query)."""
    dims: list[list[tuple[ir.Value, int]]] = [[], [(probs4, 2), (query4, 2)], [(probs4, 3)]]
    if key.four_d is not None:
        dims[2].append((key.four_d, 2))
    return dims


def _is_zero(value: ir.Value | None) -> bool:
    array = const_array(value)
    return array is not None and array.size == 1 and float(array.reshape(-1)[0]) == 0.0


def _all_equal_to(value: ir.Value | None, wanted: float | bool, depth: int = 0) -> bool:
    """Every element of ``value`` provably equals ``wanted``: a constant or ConstantOfShape
    (TorchScript's zeros of baddbmm's ``beta * input``), or a view of one, or a Where whose
    condition is provably all true (or all false) picking one."""
    if value is None or depth > 6:
        return False
    array = const_array(value)
    if array is not None:
        return array.size > 0 and bool(np.all(array == wanted))
    node = value.producer()
    if is_op(node, "ConstantOfShape") and node is not None:
        return bool(np.all(constant_of_shape_fill(node) == wanted))
    if node is None or len(node.inputs) == 0:
        return False
    if node.op_type in ("Expand", "Identity", "Reshape", "Unsqueeze", "Squeeze") and is_op(
        node, node.op_type
    ):
        return _all_equal_to(node.inputs[0], wanted, depth + 1)
    if is_op(node, "Where") and len(node.inputs) == 3:
        if _all_equal_to(node.inputs[0], True, depth + 1):
            return _all_equal_to(node.inputs[1], wanted, depth + 1)
        if _all_equal_to(node.inputs[0], False, depth + 1):
            return _all_equal_to(node.inputs[2], wanted, depth + 1)
    return False


def _check_bias(bias: ir.Value, heads: int) -> Mismatch | None:
    rank = value_rank(bias)
    if rank is None:
        return Mismatch("the mask's rank is unknown, so it may not broadcast to [B, H, S, T]")
    if rank > 4:
        return Mismatch(f"the mask has rank {rank}; it is not broadcastable to [B, H, S, T]")
    if rank == 4:
        head_dim = static_dim(bias, 1)
        if head_dim is not None and head_dim not in (1, heads):
            return Mismatch(
                f"the mask's dim 1 is {head_dim}; it is not broadcastable to [B, {heads}, S, T]"
            )
    return None


# --- rewrite -----------------------------------------------------------------------------------


def _rewrite_attention(match: Match, context: RewriteContext) -> Replacement | Mismatch:
    block: AttentionBlock = match.bindings["block"]
    heads: int = match.bindings["heads"]
    if context.options.target == "onnx":
        return _rewrite_onnx(block, context.opset(), heads)
    tape = ir.tape.Tape()
    opset = context.opset()
    scale = block.scale
    key: ir.Value | None
    value: ir.Value | None
    packed = None
    if block.kv_repeat > 1:
        assert block.key.head_size is not None
        key, value = (
            _repeat_heads(
                tape, _heads_first(tape, side), block.kv_repeat, block.key.head_size, opset
            )
            for side in (block.key, block.value)
        )
        kv_axis = 2
    elif block.key.three_d is not None and block.value.three_d is not None:
        # A scalar factor on the [B, S, H*d] projection (fairseq-style ``q_proj(x) * scaling``)
        # moves into the op's scale: one elementwise pass less, and the projection is bare for
        # fuse-packed-attention. The scores are the same product of the same factors.
        key, factor = _unscaled(block.key.three_d)
        scale *= factor
        value, kv_axis = block.value.three_d, 1
    elif (packed := _torch_packed(block)) is not None:
        query, key, value = _batch_first_split(tape, packed, opset)
        kv_axis = 1
    else:
        key, value, kv_axis = _kv_one_layout(tape, block.key, block.value)
    if packed is None:
        query, factor = attention_query(tape, block)
        scale *= factor
    assert key is not None and value is not None
    bias = attention_bias(tape, block, heads, opset, query, key, kv_axis)
    inputs: list[ir.Value | None] = [query, key, value]
    if bias is not None:
        inputs += [None, None, bias]
    attention = tape.op(
        "MultiHeadAttention",
        inputs,
        {"num_heads": heads, "scale": float(scale)},
        domain=MS_DOMAIN,
    )
    return finish_attention(tape, block, heads, opset, attention, query)


def _torch_packed(block: AttentionBlock) -> seq_first_heads.PackedProjection | None:
    """torch's packed self-attention in-projection, when Q, K and V are its three parts."""
    sides = (block.query, block.key, block.value)
    if block.query_factor is not None or any(side.four_d is None for side in sides):
        return None
    sources = [seq_first_heads.source_of(side.four_d) for side in sides if side.four_d is not None]
    if any(source is None for source in sources):
        return None
    return seq_first_heads.packed_projection([s for s in sources if s is not None])


def _batch_first_split(
    tape: ir.tape.Tape, packed: seq_first_heads.PackedProjection, opset: int
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """Q, K and V as [B, S, D]: torch's packed projection computed on the batch-first input (the
    Transpose it was moved sequence-first by, undone) and split along its columns, [Q | K | V].
    The moved rows are the same rows, so each part holds the same values; fuse-packed-attention
    then folds the projection into one Attention."""
    inputs = packed.inputs
    before = inputs.producer()
    if transpose_perm(before) == [1, 0, 2] and before is not None and before.inputs[0] is not None:
        batch_first = before.inputs[0]
    else:
        batch_first = tape.op("Transpose", [inputs], {"perm": [1, 0, 2]})
    product = tape.op("MatMul", [batch_first, packed.weight])
    if packed.bias is not None:
        product = tape.op("Add", [product, packed.bias])
    width = packed.width
    parts = split_last_axis(tape, product, [width] * 3, opset)
    dims = list(inputs.shape) if inputs.shape is not None else [None, None, None]
    annotate(product, inputs, [dims[1], dims[0], 3 * width])
    for part in parts:
        annotate(part, inputs, [dims[1], dims[0], width])
    return parts[0], parts[1], parts[2]


def attention_query(tape: ir.tape.Tape, block: AttentionBlock) -> tuple[ir.Value, float]:
    """The block's query as [B, S, H*d], and a scalar factor taken off it (for the op's scale)."""
    if block.query_factor is not None:
        scaled = tape.op("Mul", [_heads_first(tape, block.query), block.query_factor])
        moved = tape.op("Transpose", [scaled], {"perm": [0, 2, 1, 3]})
        return tape.op("Reshape", [moved, int64_const(tape, [0, 0, -1])]), 1.0
    if block.query.three_d is not None:
        return _unscaled(block.query.three_d)
    assert block.query.four_d is not None
    seq_first = seq_first_heads.source_of(block.query.four_d)
    if seq_first is not None:
        return tape.op("Transpose", [seq_first], {"perm": [1, 0, 2]}), 1.0
    # [B, S, H, d] back from [B, H, S, d]: the tensor the query was moved from, if it was
    # (BLOOM's head split is a Gather out of a [B, S, H, 3, d] view, not a Reshape)
    moved = _moved_heads(block.query.four_d) or tape.op(
        "Transpose", [block.query.four_d], {"perm": [0, 2, 1, 3]}
    )
    return tape.op("Reshape", [moved, int64_const(tape, [0, 0, -1])]), 1.0


def attention_bias(
    tape: ir.tape.Tape,
    block: AttentionBlock,
    heads: int,
    opset: int,
    query: ir.Value,
    key: ir.Value,
    kv_axis: int,
) -> ir.Value | None:
    """The block's additive terms as one rank-4 mask [., ., S, T] (S read off the [B, S, H*d]
    query, T off ``key``'s dim ``kv_axis`` where shapes do not prove it)."""
    return _full_bias(tape, _summed_bias(tape, block, heads, opset), query, 1, key, kv_axis, opset)


def finish_attention(
    tape: ir.tape.Tape,
    block: AttentionBlock,
    heads: int,
    opset: int,
    attention: ir.Value,
    query: ir.Value,
    more: Sequence[tuple[ir.Value, ir.Value]] = (),
) -> Replacement:
    """The replacement of ``block`` by the fused op's [B, S, H*dv] output ``attention``: SDPA's
    NaN guard and the output's own Reshape re-applied, dim reads re-pointed to ``query``."""
    _annotate_output(attention, block, heads)
    result = attention
    if block.nan_guard:
        result = _nan_guard(tape, attention, block.output)
    if block.kept_rows is not None:  # [B, S, H*dv] times [B|1, S|1, 1]
        kept = tape.op("Mul", [result, _kept_rows(tape, block.kept_rows, opset)])
        # the flags broadcast into the fused op's bias, so their dims are 1 or B and S: the
        # product is the output's shape (the output projection's fusions read its dims)
        kept.shape = result.shape
        if result.dtype is not None:
            kept.dtype = result.dtype
        result = kept
    if block.gate is not None:  # then output_target is the merge's own target
        split = tape.op("Reshape", [result, int64_const(tape, [0, 0, heads, -1])])
        result = tape.op("Mul", [split, block.gate])
    if block.seq_first:
        result = tape.op("Transpose", [result], {"perm": [1, 0, 2]})
    if block.output_target is not None:
        result = tape.op("Reshape", [result, block.output_target])
    reads = _repointed_reads(tape, block.dim_reads, query, {"batch": 0, "seq": 1}, heads, opset)
    return Replacement(tape.nodes, [(block.output, result), *reads, *more])


def _annotate_output(attention: ir.Value, block: AttentionBlock, heads: int) -> None:
    """Record the fused op's [B, S, H*dv] output shape, B and S as the query's (ONNX shape
    inference does not know the contrib op; the output projection's fusions read the width)."""
    query = block.query
    four = query.four_d.shape if query.four_d is not None else None
    three = query.three_d.shape if query.three_d is not None else None
    if four is not None and len(four) == 4:
        batch, length = four[0], four[2]
    elif three is not None and len(three) == 3:
        batch, length = three[0], three[1]
    else:
        return
    size = block.value.head_size
    if attention.shape is None and size is not None:
        annotate(attention, block.output, [batch, length, heads * size])


def _moved_heads(four_d: ir.Value) -> ir.Value | None:
    """x when ``four_d`` is ``Transpose(x, [0, 2, 1, 3])``: x is [B, S, H, d], and its view
    ``Reshape(x, [0, 0, -1])`` holds head h at columns h*d..(h+1)*d, whatever x was viewed from."""
    before = four_d.producer()
    if transpose_perm(before) != [0, 2, 1, 3]:
        return None
    assert before is not None
    return before.inputs[0]


def _kv_one_layout(
    tape: ir.tape.Tape, key: _Heads, value: _Heads
) -> tuple[ir.Value, ir.Value, int]:
    """K and V in one layout MultiHeadAttention takes: (k, v, T's axis), both [B, H, T, d] or both
    [B, T, H*d] (the op wants them alike).

    V is always known as the [B, H, T, d] tensor P@V reads; K may be known only as the [B, T, H*d]
    tensor its heads were split from (TorchScript's ``Transpose(Reshape(k, [B, T, H, d]),
    [0, 2, 3, 1])``: CodeGen's K after the interleaved rotary, while its V is a chunk of the
    packed Q/K/V moved by a Transpose), or as its [B, T, H, d] rows (SAM2's unbind of a packed
    [B, T, 3, H, d] projection, viewed as [B, T, H*d]). When V was moved from a [B, T, H, d] x, V is passed as
    ``Reshape(x, [0, 0, -1])``: x's own head order, head h at columns h*d..(h+1)*d. Else K is split
    to [B, H, T, d] as the graph splits it. Either way head h of K meets head h of V, as in the
    two MatMuls: the heads are dim 1 of the operands they read, never a column range guessed
    from the projection.
    """
    if key.head_size != value.head_size:  # as the matcher proved possible (_flat_kv)
        return _kv_rows(tape, key), _kv_rows(tape, value), 1
    if key.four_d is not None and value.four_d is not None:
        # torch's sequence-first heads (_seq_first_heads): [T, B, H*d] moved batch-first, one
        # Transpose each (the same copy as the [B, H, T, d] split, one node less)
        sources = [seq_first_heads.source_of(side) for side in (key.four_d, value.four_d)]
        if sources[0] is not None and sources[1] is not None:
            key3, value3 = (tape.op("Transpose", [x], {"perm": [1, 0, 2]}) for x in sources)
            return key3, value3, 1
        return key.four_d, value.four_d, 2
    assert value.four_d is not None
    moved = _moved_heads(value.four_d)
    if moved is None:
        return _heads_first(tape, key), value.four_d, 2
    if key.three_d is not None:
        return key.three_d, _merged_rows(tape, moved), 1
    assert key.rows is not None
    return _merged_rows(tape, key.rows), _merged_rows(tape, moved), 1


def _flat_kv(side: _Heads) -> bool:
    """K or V can be had as [B, T, H*d]: split from it, moved first from [B, T, H, d] rows, or
    its [B, H, T, d] heads moved back (one Transpose)."""
    return side.three_d is not None or side.rows is not None or side.four_d is not None


def _kv_rows(tape: ir.tape.Tape, side: _Heads) -> ir.Value:
    """K or V as [B, T, H*d] (see _flat_kv)."""
    if side.three_d is not None:
        return side.three_d
    rows = side.rows
    if rows is None and side.four_d is not None:
        rows = _moved_heads(side.four_d) or tape.op(
            "Transpose", [side.four_d], {"perm": [0, 2, 1, 3]}
        )
    assert rows is not None
    return _merged_rows(tape, rows)


def _merged_rows(tape: ir.tape.Tape, rows: ir.Value) -> ir.Value:
    """[B, T, H, d] heads viewed as [B, T, H*d] (its shape recorded where known)."""
    merged = tape.op("Reshape", [rows, int64_const(tape, [0, 0, -1])])
    shape = rows.shape
    if shape is not None and len(shape) == 4:
        heads, size = shape[2], shape[3]
        width = heads * size if isinstance(heads, int) and isinstance(size, int) else None
        annotate(merged, rows, [shape[0], shape[1], width])
    return merged


def _heads_first(tape: ir.tape.Tape, side: _Heads) -> ir.Value:
    """The operand as [B, N, T, d]: the tensor itself, or its [B, T, N*d] source split (its
    shape recorded: fuse-group-query-attention reads N and d off it)."""
    if side.four_d is not None:
        return side.four_d
    if side.rows is not None:
        return tape.op("Transpose", [side.rows], {"perm": [0, 2, 1, 3]})
    assert side.three_d is not None and side.head_size is not None
    split = tape.op("Reshape", [side.three_d, int64_const(tape, [0, 0, -1, side.head_size])])
    moved = tape.op("Transpose", [split], {"perm": [0, 2, 1, 3]})
    shape = side.three_d.shape
    if shape is not None and len(shape) == 3 and side.heads is not None:
        annotate(moved, side.three_d, [shape[0], side.heads, shape[1], side.head_size])
    return moved


def _repeat_heads(
    tape: ir.tape.Tape, single: ir.Value, repeat: int, head_size: int, opset: int
) -> ir.Value:
    """[B, 1, T, d] -> [B, H, T, d], spelled as repeat_kv (Unsqueeze, Expand, Reshape), which
    fuse-group-query-attention turns into GroupQueryAttention's kv_num_heads=1 where it can
    prove the key as long as the query."""
    unsqueezed = with_axes(tape, "Unsqueeze", single, [2], opset)
    expanded = tape.op("Expand", [unsqueezed, int64_const(tape, [1, 1, repeat, 1, 1])])
    repeated = tape.op("Reshape", [expanded, int64_const(tape, [0, repeat, -1, head_size])])
    shape = single.shape
    if shape is not None and len(shape) == 4:
        batch, length = shape[0], shape[2]
        annotate(unsqueezed, single, [batch, 1, 1, length, head_size])
        annotate(expanded, single, [batch, 1, repeat, length, head_size])
        annotate(repeated, single, [batch, repeat, length, head_size])
    return repeated


def _unscaled(projection: ir.Value) -> tuple[ir.Value, float]:
    """``projection`` = base * factor for scalar-constant factors, when base is still [B, S, H*d]."""
    base, factor, _ = peel_scale(projection)
    return (base, factor) if value_rank(base) == 3 else (projection, 1.0)


def _full_bias(
    tape: ir.tape.Tape,
    bias: ir.Value | None,
    query: ir.Value,
    q_axis: int,
    key: ir.Value,
    kv_axis: int,
    opset: int,
) -> ir.Value | None:
    """The additive mask as rank 4 with dims 2 and 3 spelled out (ORT's kernels do not broadcast them).

    Unless shapes prove the mask is already [., ., S, T], it is Expanded to [1, 1, S, T] (which keeps
    its own dims 0 and 1), S and T read from the query and key at run time.
    """
    if bias is None:
        return None
    rank = value_rank(bias)
    assert rank is not None
    full = (
        rank >= 2
        and same_symbol(bias, rank - 2, query, q_axis)
        and same_symbol(bias, rank - 1, key, kv_axis)
    )
    if rank < 4:
        bias = _rank4(tape, bias, rank)
    if full:
        return bias
    target = tape.op(
        "Concat",
        [
            int64_const(tape, [1, 1]),
            seq_len(tape, query, q_axis, opset),
            seq_len(tape, key, kv_axis, opset),
        ],
        {"axis": 0},
    )
    return tape.op("Expand", [bias, target])


def _rank4(tape: ir.tape.Tape, value: ir.Value, rank: int) -> ir.Value:
    """``value`` (of rank < 4) with leading dims of 1 up to rank 4: a constant of that shape when
    it is one (LeViT's learned [H, S, T] position bias), so that no Unsqueeze is left for a
    second run to fold; else an Unsqueeze."""
    constant = value.const_value
    if constant is not None:
        array = constant.numpy()
        return tape.op(
            "Constant", [], {"value": ir.tensor(array.reshape((1,) * (4 - rank) + array.shape))}
        )
    return tape.op("Unsqueeze", [value, int64_const(tape, list(range(4 - rank)))])


def _nan_guard(tape: ir.tape.Tape, value: ir.Value, like: ir.Value) -> ir.Value:
    dtype = like.dtype.numpy() if like.dtype is not None else np.dtype(np.float32)
    zero = tape.op("Constant", [], {"value": ir.tensor(np.zeros((), dtype=dtype))})
    isnan = tape.op("IsNaN", [value])
    return tape.op("Where", [isnan, zero, value])


@dataclass(frozen=True)
class _MaskValues:
    lowest_finite: float  # the smallest finite value the mask can hold (+inf: none)
    neg_inf: bool  # whether it can hold -inf


def _mask_values(value: ir.Value | None, depth: int = 0) -> _MaskValues | None:
    """What an additive mask can hold, when provable: finite numbers and maybe -inf, never NaN or
    +inf. Known for constants, a Where choosing between such values, views or float casts, and
    arithmetic on an integer or boolean mask that provably stays finite (``(1 - m) * -10000``)."""
    if value is None or depth > 16:
        return None
    bounds = _finite_bounds(value)
    if bounds is not None:
        return _MaskValues(bounds[0], False)
    array = const_array(value)
    if array is not None:
        if not np.issubdtype(array.dtype, np.floating) or np.isnan(array).any():
            return None
        if np.isposinf(array).any():
            return None
        finite = array[np.isfinite(array)]
        lowest = float(finite.min()) if finite.size else float("inf")
        return _MaskValues(lowest, bool(np.isneginf(array).any()))
    node = value.producer()
    if node is None or node.domain not in ONNX_DOMAINS:
        return None
    if node.op_type == "Where":
        a, b = _mask_values(node.inputs[1], depth + 1), _mask_values(node.inputs[2], depth + 1)
        if a is None or b is None:
            return None
        return _MaskValues(min(a.lowest_finite, b.lowest_finite), a.neg_inf or b.neg_inf)
    if node.op_type in _VALUE_PRESERVING:
        source = node.inputs[0]
        values = _mask_values(source, depth + 1)
        if node.op_type != "Cast" or values is None:
            return values
        # An integer cast to float could be anything; a narrowing cast turns big finite values
        # (float32's lowest in float16) into -inf.
        if source is None or source.dtype is None or not source.dtype.is_floating_point():
            return None
        target = ir.DataType(node.attributes.get_int("to", 0))
        if target not in _WIDE_FLOATS or values.lowest_finite < np.finfo(target.numpy()).min:
            return None
        return values
    return None


# Elementwise arithmetic whose bounds follow from its operands' bounds.
_BOUNDED_ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "Neg"})


def _finite_bounds(value: ir.Value | None, depth: int = 0) -> tuple[float, float] | None:
    """An interval [lo, hi] holding every value of a float ``value`` computed by arithmetic from an
    integer or boolean tensor (cast to float) and finite constants, with every step provably finite
    in its own dtype (half its largest value: no rounding reaches infinity). None when not
    provable, or when no arithmetic is involved (plain constants and views are read as they are).
    transformers 4.x and LayoutLM-style models build their mask as ``(1 - m.float()) * -10000``:
    finite whatever integers m holds."""
    node = value.producer() if value is not None else None
    if node is None or node.domain not in ONNX_DOMAINS or depth > 16:
        return None
    if node.op_type in _BOUNDED_ARITHMETIC:
        return _arithmetic_bounds(node, depth)
    if node.op_type in _VALUE_PRESERVING and node.op_type != "Cast":
        return _finite_bounds(node.inputs[0], depth + 1)
    return None


def _operand_bounds(value: ir.Value | None, depth: int) -> tuple[float, float] | None:
    """Bounds of an arithmetic operand: a finite constant, an integer or boolean tensor cast to
    float (its dtype's range), or further arithmetic."""
    if value is None or depth > 16:
        return None
    array = const_array(value)
    if array is not None:
        if array.size == 0 or not np.issubdtype(array.dtype, np.number):
            return None
        wide = array.astype(np.float64)
        return (float(wide.min()), float(wide.max())) if np.isfinite(wide).all() else None
    node = value.producer()
    if node is not None and node.domain in ONNX_DOMAINS and node.op_type in _VALUE_PRESERVING:
        source = node.inputs[0]
        if node.op_type == "Cast" and source is not None and source.dtype is not None:
            if source.dtype == ir.DataType.BOOL:
                return (0.0, 1.0)
            if source.dtype.is_integer():
                info = np.iinfo(source.dtype.numpy())
                return (float(info.min), float(info.max))
        if node.op_type != "Cast":
            return _operand_bounds(source, depth + 1)
    return _finite_bounds(value, depth + 1)


def _arithmetic_bounds(node: ir.Node, depth: int) -> tuple[float, float] | None:
    operands = [_operand_bounds(v, depth + 1) for v in node.inputs]
    if not operands or any(b is None for b in operands):
        return None
    a = operands[0]
    assert a is not None
    if node.op_type == "Neg":
        lo, hi = -a[1], -a[0]
    else:
        if len(operands) != 2:
            return None
        b = operands[1]
        assert b is not None
        if node.op_type == "Add":
            lo, hi = a[0] + b[0], a[1] + b[1]
        elif node.op_type == "Sub":
            lo, hi = a[0] - b[1], a[1] - b[0]
        elif node.op_type == "Mul":
            products = [x * y for x in a for y in b]
            lo, hi = min(products), max(products)
        else:  # Div: only by a divisor that keeps one sign away from 0
            if b[0] <= 0 <= b[1]:
                return None
            quotients = [x / y for x in a for y in b]
            lo, hi = min(quotients), max(quotients)
    dtype = node.outputs[0].dtype
    if dtype is None or not dtype.is_floating_point():
        return None
    limit = float(np.finfo(dtype.numpy()).max) / 2
    return (lo, hi) if -limit <= lo and hi <= limit else None


# Float types that hold float32's range, so MASK_FLOOR and float32's lowest stay finite there.
_WIDE_FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE})


def _rewrite_onnx(block: AttentionBlock, opset: int, heads: int) -> Replacement | Mismatch:
    # Fully masked rows: the export averages V (finite mask) or gives NaN, zeroed by SDPA's guard
    # (-inf); ORT's Attention-23 gives zeros for both -inf and float32's lowest. Fuse only where
    # the two agree: a finite mask raised to MASK_FLOOR, or a -inf mask behind the NaN guard.
    if block.more_bias or len(block.fills) + len(block.flat_terms) + (block.bias is not None) > 1:
        return Mismatch(
            "--target onnx: the scores get several additive terms, and only a single provable "
            "mask keeps ONNX Runtime's Attention-23 from zeroing fully masked rows"
        )
    mask = block.fills[0].fill if block.fills else block.bias
    if block.flat_terms:
        return Mismatch("--target onnx: a term added to the [B*H, S, T] scores is not fused")
    if block.window_terms:
        return Mismatch(
            "--target onnx: a term added to the windowed [B, W, H, S, T] scores is not fused"
        )
    if block.view_terms:
        return Mismatch(
            "--target onnx: a term added to the [B*H, h, w, h, w] view of the scores is not fused"
        )
    values = _mask_values(mask) if mask is not None else None
    if values is not None and block.fills:  # the fill's bias holds 0 besides the fill
        values = replace(values, lowest_finite=min(values.lowest_finite, 0.0))
    if values is not None and block.floor is not None:
        # Max(m, floor) holds no -inf, and floor <= MASK_FLOOR: the Max(bias, MASK_FLOOR) below
        # gives Max(Max(m, floor), MASK_FLOOR) = Max(m, MASK_FLOOR), so the floor's own Max goes.
        least = -np.inf if values.neg_inf else values.lowest_finite
        values = _MaskValues(max(least, block.floor), False)
        block = replace(block, floor=None)
    if mask is not None:
        if values is None:
            return Mismatch(
                "mask values are not provably finite or -inf, and ONNX Runtime's Attention-23 "
                "zeroes fully masked rows"
            )
        if not values.neg_inf and mask.dtype not in _WIDE_FLOATS:
            return Mismatch(
                f"mask is {mask.dtype}: it cannot hold the {MASK_FLOOR:g} floor that keeps "
                "ONNX Runtime's Attention-23 from zeroing fully masked rows"
            )
        if values.neg_inf and not (block.nan_guard and values.lowest_finite > MASK_FLOOR):
            return Mismatch(
                "mask holds -inf without SDPA's NaN guard: the export gives NaN on fully masked "
                "rows, ONNX Runtime's Attention-23 zeros"
            )
    tape = ir.tape.Tape()
    sides = []
    for side in (block.query, block.key, block.value):
        four_d = _heads_first(tape, side)
        if side is block.query and block.query_factor is not None:
            four_d = tape.op("Mul", [four_d, block.query_factor])
        if block.kv_repeat > 1 and side is not block.query:
            assert side.head_size is not None
            four_d = _repeat_heads(tape, four_d, block.kv_repeat, side.head_size, opset)
        sides.append(four_d)
    inputs: list[ir.Value | None] = list(sides)
    bias = _full_bias(
        tape, _summed_bias(tape, block, heads, opset), sides[0], 2, sides[1], 2, opset
    )
    if bias is not None and values is not None and not values.neg_inf:
        assert mask is not None and mask.dtype is not None
        floor_value = np.array(MASK_FLOOR, dtype=mask.dtype.numpy())
        floor = tape.op("Constant", [], {"value": ir.tensor(floor_value)})
        bias = tape.op("Max", [bias, floor])
    if bias is not None:
        inputs.append(bias)
    attributes: dict[str, float] = {"scale": float(block.scale)}
    if block.softcap:
        # ORT 1.32's Attention-23 caps the scaled scores before adding the mask, as Gemma2 does
        # (scripts/softcap_kernel_check.py; the ONNX spec's errata, onnx/onnx#7867).
        attributes["softcap"] = float(block.softcap)
    attention = tape.op("Attention", inputs, attributes)
    result = attention
    if block.nan_guard:
        result = _nan_guard(tape, attention, block.output)
    moved = tape.op(
        "Transpose", [result], {"perm": [2, 0, 1, 3] if block.seq_first else [0, 2, 1, 3]}
    )
    if block.gate is not None:
        moved = tape.op("Mul", [moved, block.gate])
    if block.kept_rows is not None:  # [B, S, H, dv] times [B|1, S|1, 1, 1]
        rows = _kept_rows(tape, block.kept_rows, opset)
        moved = tape.op("Mul", [moved, tape.op("Unsqueeze", [rows, int64_const(tape, [-1])])])
    merged = tape.op("Reshape", [moved, block.output_target or int64_const(tape, [0, 0, -1])])
    reads = _repointed_reads(tape, block.dim_reads, sides[0], {"batch": 0, "seq": 2}, heads, opset)
    return Replacement(tape.nodes, [(block.output, merged), *reads])


def _unfold_key_squeezes(model: ir.Model) -> list[tuple[ir.Node, ir.Node | None, ir.Node]]:
    """Give the dynamo K^T spelling its [B, H, T, d] key back where merge-consecutive-ops folded it.

    timm's ``qkv.reshape(B, N, 3, H, d).permute(2, 0, 3, 1, 4).unbind(0)`` exports each part as
    ``Squeeze(Slice(qkv5, [i, i+1], axis 0), [0])``; the key's only reader, the flattening
    ``Reshape(k, [-1, T, d])`` of SDPA's K^T, absorbs the Squeeze (a Reshape ignores its input's
    shape) and reads the [1, B, H, T, d] slice. A Squeeze is put back in front of every such Reshape
    (rank-5 data with a static leading 1, a rank-3 result read by a Transpose [0, 2, 1]), so
    _key_transposed finds the key; (Squeeze, its axes Constant, the Reshape) for
    _drop_unused_squeezes, which takes back the ones no fusion used."""
    inserted = []
    opset = model.opset_imports.get("", 0)
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        data = node.inputs[0] if is_op(node, "Reshape") and node.inputs else None
        if data is None or data.shape is None or len(data.shape) != 5 or data.shape[0] != 1:
            continue
        if value_rank(node.outputs[0]) != 3 or not any(
            transpose_perm(use.node) == [0, 2, 1] for use in node.outputs[0].uses()
        ):
            continue
        graph = node.graph
        assert graph is not None
        axes: ir.Node | None = None
        if opset >= 13:
            axes = ir.node("Constant", [], {"value": ir.tensor(np.array([0], np.int64))})
            squeeze = ir.node("Squeeze", [data, axes.outputs[0]])
        else:
            squeeze = ir.node("Squeeze", [data], {"axes": [0]})
        key = squeeze.outputs[0]
        key.shape = ir.Shape(list(data.shape)[1:])
        if data.dtype is not None:
            key.dtype = data.dtype
        graph.insert_before(node, [squeeze] if axes is None else [axes, squeeze])
        node.replace_input_with(0, key)
        inserted.append((squeeze, axes, node))
    return inserted


def _drop_unused_squeezes(inserted: Sequence[tuple[ir.Node, ir.Node | None, ir.Node]]) -> None:
    """Undo :func:`_unfold_key_squeezes` where the key was not fused: the graph is as it came."""
    for squeeze, axes, reshape in inserted:
        key, data = squeeze.outputs[0], squeeze.inputs[0]
        if reshape.graph is not None and reshape.inputs[0] is key:
            reshape.replace_input_with(0, data)
        if not key.uses():
            graph = squeeze.graph
            assert graph is not None
            graph.remove(squeeze, safe=True)
            if axes is not None and not axes.outputs[0].uses():
                graph.remove(axes, safe=True)


ATTENTION_RULE = Rule("attention->mha", "Softmax", _match_attention, _rewrite_attention)
# For the opt-in fuse-softcap-attention, --target onnx: Attention-23 with softcap.
SOFTCAP_ONNX_RULE = Rule(
    "softcap-attention->onnx-attention", "Softmax", _match_softcap_onnx, _rewrite_attention
)


class FuseAttentionPass(Pass):
    """Fuse Softmax(Q@K^T*scale + mask)@V blocks into MultiHeadAttention (ort) or Attention (onnx, opset 23)."""

    name = "fuse-attention"
    summary = "fuse multi-head attention blocks (MultiHeadAttention for ort, Attention-23 for onnx)"

    def call(self, model: ir.Model) -> PassResult:
        squeezes = _unfold_key_squeezes(model)
        seq_first = seq_first_heads.unfold(model)
        stacked = stacked_heads.unfold(model)
        rows = query_rows.unfold(model)
        stats, notes = apply_rules(model, [ATTENTION_RULE], self.options)
        query_rows.restore(rows)
        stacked_heads.restore(stacked)
        seq_first_heads.restore(seq_first)
        _drop_unused_squeezes(squeezes)
        if stats:
            # A block whose dim reads were re-pointed got its new nodes at the first read, which
            # may come before V or the mask: a stable sort (the identity on a sorted graph)
            # restores the order.
            sort_model(model)
            if self.options.target == "ort":
                model.opset_imports.setdefault(MS_DOMAIN, 1)
            else:
                stats = Counter({"attention->onnx-attention": stats["attention->mha"]})
        return PassResult(model, modified=bool(stats), stats=stats, notes=notes)
