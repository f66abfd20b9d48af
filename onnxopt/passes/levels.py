"""The default pipelines, as plain lists; a tuple is a group repeated until it reaches a fixed point."""

from __future__ import annotations

from collections.abc import Sequence

from onnxopt.errors import UsageError
from onnxopt.passes.base import FixedPoint, Pass, Step
from onnxopt.passes.decompose_batch_norm import DecomposeBatchNormPass
from onnxopt.passes.deduplicate_initializers import DeduplicateInitializersPass
from onnxopt.passes.drop_shape_annotations import DropShapeAnnotationsPass
from onnxopt.passes.eliminate_common_subexpressions import EliminateCommonSubexpressionsPass
from onnxopt.passes.eliminate_dead_code import EliminateDeadCodePass
from onnxopt.passes.eliminate_noops import EliminateNoopsPass
from onnxopt.passes.fold_constants import FoldConstantsPass
from onnxopt.passes.fold_shape_values import FoldShapeValuesPass
from onnxopt.passes.fuse_affine_conv import FuseAffineConvPass, FuseAffineMatMulPass
from onnxopt.passes.fuse_attention import FuseAttentionPass
from onnxopt.passes.fuse_channel_affine import FuseChannelAffinePass
from onnxopt.passes.fuse_channel_first_attention import FuseChannelFirstAttentionPass
from onnxopt.passes.fuse_conv_activation import FuseConvActivationPass
from onnxopt.passes.fuse_conv_bn import FuseConvBnPass
from onnxopt.passes.fuse_gelu import FuseBiasGeluPass, FuseGeluPass
from onnxopt.passes.fuse_gqa_rotary import FuseGqaRotaryPass
from onnxopt.passes.fuse_group_query_attention import FuseGroupQueryAttentionPass
from onnxopt.passes.fuse_hard_swish import FuseHardSwishPass
from onnxopt.passes.fuse_interleaved_rotary import FuseInterleavedRotaryPass
from onnxopt.passes.fuse_layer_norm import FuseLayerNormPass, FuseSkipLayerNormPass
from onnxopt.passes.fuse_matmul import FuseMatMulPass
from onnxopt.passes.fuse_packed_attention import FusePackedAttentionPass
from onnxopt.passes.fuse_pad import FusePadPass
from onnxopt.passes.fuse_parallel_convs import FuseParallelConvsPass
from onnxopt.passes.fuse_parallel_matmuls import FuseParallelMatMulsPass
from onnxopt.passes.fuse_rms_norm import FuseRmsNormPass
from onnxopt.passes.fuse_rotary_embedding import FuseRotaryEmbeddingPass
from onnxopt.passes.fuse_rotary_transposes import FuseRotaryTransposesPass
from onnxopt.passes.fuse_silu import FuseSiluPass
from onnxopt.passes.fuse_softcap_attention import FuseSoftcapAttentionPass
from onnxopt.passes.infer_shapes import InferShapesPass
from onnxopt.passes.inline_functions import InlineFunctionsPass
from onnxopt.passes.keep_layer_norm_unfused import KeepLayerNormUnfusedPass
from onnxopt.passes.lift_constants import LiftConstantsPass
from onnxopt.passes.localize_initializers import LocalizeInitializersPass
from onnxopt.passes.lower_einsum import LowerEinsumPass
from onnxopt.passes.merge_consecutive_ops import MergeConsecutiveOpsPass
from onnxopt.passes.merge_qkv_projections import MergeQkvProjectionsPass
from onnxopt.passes.options import PassOptions
from onnxopt.passes.promote_conv1d import PromoteConv1dPass
from onnxopt.passes.remove_initializer_inputs import RemoveInitializerInputsPass
from onnxopt.passes.reorder_for_memory import ReorderForMemoryPass
from onnxopt.passes.simplify_index_grids import SimplifyIndexGridsPass
from onnxopt.passes.sort_topologically import SortTopologicallyPass

PassClass = type[Pass]
LevelSpec = Sequence[PassClass | tuple[PassClass, ...]]

# Fusions, in the order they feed each other (Pad and BN fold before Conv+Relu becomes FusedConv).
# Contrib-op rewrites check options.target themselves, so one list serves both targets: the
# default (level 2, target ort) is what runs fastest on ONNX Runtime; --target onnx stays portable.
FUSIONS: list[PassClass] = [
    FusePadPass,
    # Before fuse-conv-bn (it folds each branch's own BatchNormalization itself, so that one
    # after the sum still meets a single Conv), promote-conv1d (which would hide a 1-D branch
    # behind an Unsqueeze) and fuse-conv-activation.
    FuseParallelConvsPass,
    FuseConvBnPass,
    # Before promote-conv1d, whose Squeeze then moves past a Conv's fused Gelu in the same run
    # (tf2onnx's Conv1D and TorchScript's erf Gelu: a fixed point in one run).
    FuseGeluPass,
    # ort: wide 1-D Convs as 2-D ones (ORT's NCHWc kernels); before fuse-conv-activation, which
    # then fuses the 2-D Conv with the activation the Squeeze was moved past.
    PromoteConv1dPass,
    # Before fuse-conv-activation: a hard-sigmoid after a Conv (MobileNetV3's squeeze-excite gate)
    # then becomes FusedConv's HardSigmoid activation.
    FuseHardSwishPass,
    # After fuse-conv-bn, which folds an affine right after a Conv into that Conv (the same rule
    # on every run): this folds one that a Conv reads into the reading Conv. After the activation
    # fusions, whose last op can be a constant Mul or Div (hard-swish's / 6, a Gelu's * 0.5), and
    # before fuse-conv-activation, which would make the reading Conv a FusedConv; before
    # fuse-channel-affine, which makes the affines left (a shift before a padded Conv) depthwise
    # Convs.
    FuseAffineConvPass,
    FuseConvActivationPass,
    # After fuse-conv-bn, which folds an affine right after a Conv into its weights: this one
    # makes the affines between convolutions depthwise Convs (ort), which ORT runs in NCHWc.
    FuseChannelAffinePass,
    FuseLayerNormPass,
    FuseRmsNormPass,
    # After the norm fusions, which own the scale and shift that end a decomposed LayerNorm or
    # RMSNorm; before fuse-matmul, which makes a 2-D MatMul and its bias Add one Gemm.
    FuseAffineMatMulPass,
    # After attention (which runs before FUSIONS): attention patterns see the rotary as they were
    # exported, and the fused RotaryEmbedding keeps its output value, which attention consumes.
    FuseRotaryEmbeddingPass,
    # After rotary: it proves Q and K come from one sequence through the fused RotaryEmbedding.
    # Measured faster (benchmarks/gqa_micro.py: 1.6x per layer at S=128; LLaMA -O2 kernel time
    # with vs without it, benchmarks/profile_kernels.py --pairs: 1.04-1.06x).
    FuseGroupQueryAttentionPass,
    # After both attention fusions, which read the rotated Q/K back as [B, S, N*d].
    FuseRotaryTransposesPass,
    # After the transposes fold: GroupQueryAttention then reads the rotaries' outputs directly.
    # Bit-identical on ORT 1.32 CPU (scripts/gqa_rotary_check.py); two nodes fewer per layer.
    FuseGqaRotaryPass,
    # Bit-identical on ORT 1.32 CPU; the same op ORT makes of the pair at ENABLE_EXTENDED+.
    FuseSiluPass,
    FuseMatMulPass,  # attention patterns need to see their Transpose + MatMul unfused
    # After fuse-matmul: reads the transposed products as the FusedMatMuls it makes of them.
    FuseChannelFirstAttentionPass,
    # After fuse-matmul, which turns a 2-D MatMul + bias into one Gemm (the Add is gone either way).
    # BiasGelu: one node fewer per pair, the same kernel at ORT_ENABLE_ALL (ORT fuses Add + Gelu
    # into BiasGelu itself at load; 4-12% slower than Add + Gelu at DISABLE_ALL on ORT 1.32 CPU,
    # benchmarks/fusion_kernels.py --only BiasGelu).
    FuseBiasGeluPass,
]
# Correct but measured slower on ONNX Runtime's CPU kernels (README, "Fusions"): --enable only.
# merge-qkv-projections (in ALL_PASSES right after fuse-attention, so --enable puts it there): one
# [K, 3N] GEMM + Split ran slower than three [K, N] GEMMs in ORT's CPU profiler, whole models
# measured level (benchmarks/transformer_speed.py; README, "Speed against the other tools"), and
# the merged weights are new tensors the optimizer must hold.
OPT_IN_FUSIONS: list[PassClass] = [
    FuseSkipLayerNormPass,
    DecomposeBatchNormPass,
]
# Soft-capped attention (Gemma2): exact, but ORT 1.32's CPU softcap measured 5-15% slower than the
# unfused graph (fuse_softcap_attention.py). In ALL_PASSES right after
# fuse-group-query-attention, so that --enable runs it after the rotary fusion it proves Q and K
# through and before fuse-gqa-rotary folds the rotaries into its GroupQueryAttention.
_AFTER_GQA = FUSIONS.index(FuseGroupQueryAttentionPass) + 1
# Attention and what folds into it, first among the fusions: fuse-attention needs the Transpose +
# MatMul that fuse-matmul would absorb; fuse-packed-attention (ort) turns its MultiHeadAttention
# and the Q/K/V projections into one Attention where benchmarks/attention_layouts_micro.py measured
# that faster (a mask, or a short static sequence; README, "Fusions").
# Dead code in between: a layer's fused-away K/V reshapes can stay alive through another layer's
# shared shape reads until that layer fuses too, and would count as other consumers of its
# projections.
# fuse-interleaved-rotary first: GPT-J rotates between the head split and the Transpose, which
# hides the head split from fuse-attention until the rotary is one op on the rank-3 tensor.
# Shape values folded again after fuse-attention: below opset 15 the dims it reads off the fused
# op's query are whole-Shape reads of the Q/K projections, which would count as other consumers
# until folded into the earlier reads of the same dims (BERT at opset 12 packed only on a second
# run: no fixed point).
# Shapes inferred again before fuse-packed-attention: the fused MultiHeadAttention gives its output
# the query's [B, S] where the exported scores lost them (a TorchScript mask broadcast), and the
# causal proof that decides between packed Attention and GroupQueryAttention compares each
# layer's sequence with the mask's positions by those names.
# Repeated until nothing changes: a layer's block (or its interleaved rotary) can be proved only
# once the layer before it is fused and shapes are inferred again (transformers 4.x exports:
# CodeGen's TorchScript second-layer rotary, whose sequence inference names only then; CTRL's
# TorchScript second layer, whose mask is sliced with dims read off its own scores): else only a
# second optimize run fused them, and the output was not a fixed point.
ATTENTION: list[PassClass | tuple[PassClass, ...]] = [
    (
        FuseInterleavedRotaryPass,
        FuseAttentionPass,
        FoldShapeValuesPass,
        EliminateDeadCodePass,
        InferShapesPass,
    ),
    FusePackedAttentionPass,
]

# Every pass, in the order a custom --passes list is best run in.
ALL_PASSES: list[PassClass] = [
    InlineFunctionsPass,
    SortTopologicallyPass,
    RemoveInitializerInputsPass,
    InferShapesPass,
    LiftConstantsPass,
    FoldShapeValuesPass,
    FoldConstantsPass,
    EliminateNoopsPass,
    MergeConsecutiveOpsPass,
    SimplifyIndexGridsPass,
    LowerEinsumPass,
    EliminateDeadCodePass,
    DeduplicateInitializersPass,
    EliminateCommonSubexpressionsPass,
    FuseParallelMatMulsPass,
    FuseInterleavedRotaryPass,
    FuseAttentionPass,
    MergeQkvProjectionsPass,  # between the two, so that --enable puts it there
    FusePackedAttentionPass,
    *FUSIONS[:_AFTER_GQA],
    FuseSoftcapAttentionPass,
    *FUSIONS[_AFTER_GQA:],
    *OPT_IN_FUSIONS,
    KeepLayerNormUnfusedPass,
    LocalizeInitializersPass,
    ReorderForMemoryPass,
    DropShapeAnnotationsPass,
]

# Folding exposes shapes (re-inferred at the end of each round), which expose more folding.
# Folding also creates equal constants: deduplicating them in the loop lets CSE merge their users
# (else a second optimize run still finds work, and the output is not a fixed point).
CLEANUP: tuple[PassClass, ...] = (
    FoldShapeValuesPass,
    FoldConstantsPass,
    EliminateNoopsPass,
    MergeConsecutiveOpsPass,
    SimplifyIndexGridsPass,
    # Its MatMuls are what the attention fusions read; its Transposes merge in the next round.
    LowerEinsumPass,
    EliminateDeadCodePass,
    DeduplicateInitializersPass,
    EliminateCommonSubexpressionsPass,
    InferShapesPass,
)

LEVELS: dict[int, LevelSpec] = {
    0: [],
    1: [
        InlineFunctionsPass,  # the rewrites see the main graph only
        SortTopologicallyPass,
        RemoveInitializerInputsPass,
        InferShapesPass,
        LiftConstantsPass,
        FoldShapeValuesPass,
        FoldConstantsPass,
        EliminateNoopsPass,
        EliminateDeadCodePass,
        DeduplicateInitializersPass,
    ],
    2: [
        InlineFunctionsPass,
        SortTopologicallyPass,
        RemoveInitializerInputsPass,
        InferShapesPass,
        LiftConstantsPass,
        DeduplicateInitializersPass,
        CLEANUP,
        # Before the attention fusions: an adapted projection (LoRA's x @ W + x @ A @ B) is
        # then the plain MatMul + bias they read.
        FuseParallelMatMulsPass,
        *ATTENTION,
        *FUSIONS,
        # Fusions may add Constant nodes (axes, shapes): lift and share them as the cleanup did.
        # Fused attention reads the sequence length off each layer's Q and K: shared once shapes
        # are inferred again, and the per-layer mask Expands they feed merge.
        LiftConstantsPass,
        DeduplicateInitializersPass,
        # A fusion's Expand or Reshape built on dims it could not prove (a mask spelled out to
        # [B, H, S, T] with S read at run time) can be a no-op once shapes are inferred again:
        # else a second optimize run removes it and the output is not a fixed point (BEiT).
        # Repeated until nothing changes: merging two shape reads can make two more equal
        # (Phi-3 TorchScript: else a second optimize run shares one more Shape). A fusion's last
        # Reshape can meet the graph's next one (GroupQueryAttention's fully-masked-row fix-up
        # before TorchScript GPT-2's 2-D output projection): merged here, not by a second run.
        # Merged Reshapes get static targets as new initializers, often equal (SAM2's window
        # views after its fused attention): shared here, else a second run renames them.
        (
            InferShapesPass,
            FoldShapeValuesPass,
            EliminateNoopsPass,
            MergeConsecutiveOpsPass,
            DeduplicateInitializersPass,
            EliminateCommonSubexpressionsPass,
            EliminateDeadCodePass,
        ),
        KeepLayerNormUnfusedPass,
        LocalizeInitializersPass,
        ReorderForMemoryPass,
        DropShapeAnnotationsPass,
    ],
    # O3: as O2, then the cleanup fixed point once more over the fused graph (slower to run).
    3: [
        InlineFunctionsPass,
        SortTopologicallyPass,
        RemoveInitializerInputsPass,
        InferShapesPass,
        LiftConstantsPass,
        DeduplicateInitializersPass,
        CLEANUP,
        # Before the attention fusions: an adapted projection (LoRA's x @ W + x @ A @ B) is
        # then the plain MatMul + bias they read.
        FuseParallelMatMulsPass,
        *ATTENTION,
        *FUSIONS,
        LiftConstantsPass,
        CLEANUP,
        EliminateDeadCodePass,
        KeepLayerNormUnfusedPass,
        LocalizeInitializersPass,
        ReorderForMemoryPass,
        DropShapeAnnotationsPass,
    ],
}
DEFAULT_LEVEL = 2


def pass_by_name(name: str) -> PassClass:
    for cls in ALL_PASSES:
        if cls.name == name:
            return cls
    known = ", ".join(cls.name for cls in ALL_PASSES)
    raise UsageError(f"unknown pass '{name}' (known: {known})")


def build_steps(
    level: int = DEFAULT_LEVEL,
    *,
    passes: Sequence[str] | None = None,
    disable: Sequence[str] = (),
    enable: Sequence[str] = (),
    options: PassOptions | None = None,
) -> list[Step]:
    """The steps for ``level`` plus ``enable`` (each where ALL_PASSES orders it, unless the level
    already runs it), or exactly ``passes``; minus ``disable``."""
    options = options or PassOptions()
    for name in (*disable, *enable):
        pass_by_name(name)  # unknown names are an error, not silently ignored
    dropped = set(disable)
    if passes is not None:
        chosen: list[Step] = [pass_by_name(n)(options) for n in passes if n not in dropped]
        _defer_causal_attention(chosen)
        return chosen
    if level not in LEVELS:
        raise UsageError(f"unknown level {level} (levels: {', '.join(map(str, LEVELS))})")
    steps: list[Step] = []
    for entry in LEVELS[level]:
        if isinstance(entry, tuple):
            group = [cls(options) for cls in entry if cls.name not in dropped]
            if group:
                steps.append(FixedPoint(group))
        elif entry.name not in dropped:
            steps.append(entry(options))
    rank = {cls: index for index, cls in enumerate(ALL_PASSES)}
    for name in enable:
        if name in dropped:
            continue
        cls = pass_by_name(name)
        if any(type(step) is cls for step in steps):
            continue  # already in the level (e.g. fuse-bias-gelu, opt-in before it became default)
        # Where ALL_PASSES puts it: before the level's first single pass that comes later there
        # (merge-qkv-projections right after fuse-attention, opt-in fusions before the reorder).
        at = next(
            (
                i
                for i, step in enumerate(steps)
                if isinstance(step, Pass) and rank.get(type(step), -1) > rank[cls]
            ),
            len(steps),
        )
        steps.insert(at, cls(options))
    _defer_causal_attention(steps)
    return steps


def _defer_causal_attention(steps: Sequence[Step]) -> None:
    """fuse-packed-attention leaves causal blocks to a later fuse-group-query-attention."""
    flat = [p for s in steps for p in (s.passes if isinstance(s, FixedPoint) else [s])]
    for index, step in enumerate(flat):
        if isinstance(step, FusePackedAttentionPass):
            step.defer_causal = any(
                isinstance(later, FuseGroupQueryAttentionPass) for later in flat[index + 1 :]
            )
