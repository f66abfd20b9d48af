"""Fuse soft-capped attention (Gemma2's ``softmax(tanh(Q@K^T * scale / c) * c + mask) @ V``), opt-in.

``--target ort``: ``com.microsoft.GroupQueryAttention(softcap=c)`` (fuse_group_query_attention.py,
``SOFTCAP_GQA_RULES``: repeat_kv K/V read as K/V heads, Q/K/V proved one sequence, causal=1 with
the fully-masked-row fix-up where the mask is provably causal, else causal=0). ``--target onnx``
(opset 23): ``Attention(softcap=c)`` (fuse_attention.py, ``SOFTCAP_ONNX_RULE``). Both kernels cap
the scaled scores before adding the mask, as Gemma2 does (scripts/softcap_kernel_check.py); the
mask, sliding windows included, is passed on whole, so the result is exact for every window.

Opt-in (``--enable fuse-softcap-attention``) because ONNX Runtime 1.32's CPU softcap is slower than
the unfused graph: a 4-layer Gemma2 (hidden 640, 8/4 heads of 80, benchmarks/arch_sweep.py
gemma2_medium, ORT_ENABLE_ALL, 2 threads) ran 5-9% slower with GroupQueryAttention(softcap) and
13-15% slower with Attention-23(softcap) at sequence 128-512 (benchmarks/ab_latency.py); the same
GroupQueryAttention without softcap was as fast as the unfused graph. Runs after
fuse-rotary-embedding (GroupQueryAttention's one-sequence proof walks through RotaryEmbedding) and
before fuse-gqa-rotary (which then folds the rotaries in).
"""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from onnxopt.ops import MS_DOMAIN
from onnxopt.passes.base import Pass, PassResult
from onnxopt.passes.fuse_attention import SOFTCAP_ONNX_RULE
from onnxopt.passes.fuse_group_query_attention import SOFTCAP_GQA_RULES
from onnxopt.passes.sort_topologically import sort_model
from onnxopt.rewrite import apply_rules


class FuseSoftcapAttentionPass(Pass):
    """Soft-capped attention -> GroupQueryAttention(softcap) (ort) or Attention-23(softcap) (onnx)."""

    name = "fuse-softcap-attention"
    summary = (
        "soft-capped attention (Gemma2) -> GroupQueryAttention / Attention-23 with softcap "
        "(opt-in: slower on ORT 1.32 CPU)"
    )

    def call(self, model: ir.Model) -> PassResult:
        ort = self.options.target == "ort"
        rules = list(SOFTCAP_GQA_RULES) if ort else [SOFTCAP_ONNX_RULE]
        stats, notes = apply_rules(model, rules, self.options)
        if stats:
            # New nodes go before each block's last node; what they read (the mask, V) may
            # come later in graph order: a stable sort restores the order.
            sort_model(model)
            if ort:
                model.opset_imports.setdefault(MS_DOMAIN, 1)
        return PassResult(model, modified=bool(stats), stats=Counter(stats), notes=notes)
