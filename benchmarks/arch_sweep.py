"""Architecture sweep: onnxopt on tiny transformers / vision families that are not in the zoo.

Each family is built from a transformers config object (2 layers, small hidden size, seeded random
weights, nothing downloaded), its constant parameters perturbed like a checkpoint's
(``perturb_constant_parameters``), exported with both PyTorch exporters (dynamic batch and
sequence axes where the model has them), then optimized at -O2 with validation (ORT, optimizations
off, several sizes of the dynamic dims) and the eager PyTorch comparison. The optimized file is
optimized again: a fixed point leaves the bytes unchanged. One markdown row per export:

    PYTHONPATH=. python benchmarks/arch_sweep.py [--families roberta,t5 ...] [--exporters dynamo]
        [--attention eager|sdpa] [--target ort|onnx] [--opset 23] [--export-opset 14]
        [--enable PASSES] [--out DIR]
        [--explain]

A family whose export fails is recorded as ``export failed: <first line>`` (the exporter's limit,
not onnxopt's). A factory can be exported on its own, from the repo root: ``onnxopt export
benchmarks.arch_sweep:roberta -o roberta.onnx``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's onnxopt

from onnxopt.zoo._common import seeded

# Fused ops counted in the table, with a short label.
FUSED = {
    "Attention": "attn",
    "MultiHeadAttention": "mha",
    "GroupQueryAttention": "gqa",
    "RotaryEmbedding": "rotary",
    "LayerNormalization": "ln",
    "SkipLayerNormalization": "skipln",
    "SimplifiedLayerNormalization": "rms",
    "Gelu": "gelu",
    "BiasGelu": "biasgelu",
    "FastGelu": "fastgelu",
    "FusedConv": "fusedconv",
    "FusedMatMul": "fusedmm",
}

ATTENTION = {"implementation": "eager"}  # set by --attention before the factories run
TOKENS = {0: "batch", 1: "sequence"}
BATCH = {0: "batch"}
SMALL = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
# Routed experts of the DeepSeek-MoE kind, every layer dense (first_k_dense_replace=2 of 2).
TINY_ROUTED_MOE = {
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 2,
}
# Multi-head latent attention (DeepSeek-V2/V3, MiniCPM3, GLM-4.7-Flash): low-rank Q and KV, a
# rotary part of each head (v_head_dim set per family).
TINY_MLA = {
    "num_key_value_heads": 4,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8,
}
Factory = tuple[Any, dict[str, Any], dict[str, dict[int, str]]]


def _finish(module: Any, inputs: dict[str, Any], dynamic: dict[str, dict[int, str]]) -> Factory:
    from onnxopt.zoo._common import perturb_constant_parameters

    return perturb_constant_parameters(module).eval(), inputs, dynamic


def _attn(**config: Any) -> dict[str, Any]:
    return {"attn_implementation": ATTENTION["implementation"], **config}


def _text(model_cls: Any, cfg: Any, outputs: tuple[str, ...] = ("last_hidden_state",)) -> Factory:
    from onnxopt.zoo.transformers_models import _Outputs, _tokens

    inputs = _tokens(min(int(cfg.vocab_size), 1000))
    return _finish(
        _Outputs(model_cls(cfg), tuple(inputs), outputs), inputs, dict.fromkeys(inputs, TOKENS)
    )


def _pixels(
    model_cls: Any,
    cfg: Any,
    size: int,
    outputs: tuple[str, ...] = ("last_hidden_state",),
    channels: int = 3,
) -> Factory:
    import torch

    from onnxopt.zoo.transformers_models import _Outputs

    inputs = {"pixel_values": torch.randn(2, channels, size, size)}
    return _finish(
        _Outputs(model_cls(cfg), ("pixel_values",), outputs), inputs, {"pixel_values": BATCH}
    )


def _seq2seq(model_cls: Any, cfg: Any) -> Factory:
    """Full encoder-decoder forward, no cache: decoder_input_ids has its own sequence axis."""
    import torch

    from onnxopt.zoo.transformers_models import _Outputs, _tokens

    inputs = _tokens(min(int(cfg.vocab_size), 1000))
    inputs["decoder_input_ids"] = torch.randint(0, min(int(cfg.vocab_size), 1000), (2, 8))
    dynamic = dict.fromkeys(("input_ids", "attention_mask"), TOKENS)
    dynamic["decoder_input_ids"] = {0: "batch", 1: "decoder_sequence"}
    wrapped = _Outputs(
        model_cls(cfg), tuple(inputs), ("last_hidden_state", "encoder_last_hidden_state")
    )
    return _finish(wrapped, inputs, dynamic)


# ---------------------------------------------------------------------------- encoders (text)


@seeded
def roberta() -> Factory:
    from transformers import RobertaConfig, RobertaModel

    return _text(
        RobertaModel, RobertaConfig(**_attn(**SMALL, intermediate_size=128, vocab_size=1000))
    )


@seeded
def roberta_medium() -> Factory:
    """RoBERTa at a size worth timing: 4 layers, hidden 768, 12 heads of 64; not in the sweep's
    families. ``onnxopt export benchmarks.arch_sweep:roberta_medium -o rm.onnx --opset 14``."""
    from transformers import RobertaConfig, RobertaModel

    cfg = RobertaConfig(
        **_attn(
            vocab_size=1000,
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=4,
            num_attention_heads=12,
        )
    )
    return _text(RobertaModel, cfg)


@seeded
def clip_text_medium() -> Factory:
    """CLIP's text tower at a size worth timing: 6 layers, hidden 512, 8 heads of 64; not in the
    sweep's families (``onnxopt export benchmarks.arch_sweep:clip_text_medium ... --opset 11``)."""
    from transformers import CLIPTextConfig, CLIPTextModel

    cfg = CLIPTextConfig(
        **_attn(
            vocab_size=1000,
            hidden_size=512,
            intermediate_size=2048,
            num_hidden_layers=6,
            num_attention_heads=8,
            max_position_embeddings=256,
        )
    )
    return _text(CLIPTextModel, cfg, ("last_hidden_state", "pooler_output"))


@seeded
def xlm_roberta() -> Factory:
    from transformers import XLMRobertaConfig, XLMRobertaModel

    cfg = XLMRobertaConfig(**_attn(**SMALL, intermediate_size=128, vocab_size=1000))
    return _text(XLMRobertaModel, cfg)


@seeded
def albert() -> Factory:
    from transformers import AlbertConfig, AlbertModel

    cfg = AlbertConfig(**_attn(**SMALL, intermediate_size=128, embedding_size=32, vocab_size=1000))
    return _text(AlbertModel, cfg, ("last_hidden_state", "pooler_output"))


@seeded
def electra() -> Factory:
    from transformers import ElectraConfig, ElectraModel

    cfg = ElectraConfig(**_attn(**SMALL, intermediate_size=128, embedding_size=32, vocab_size=1000))
    return _text(ElectraModel, cfg)


@seeded
def deberta_v2() -> Factory:
    from transformers import DebertaV2Config, DebertaV2Model

    cfg = DebertaV2Config(**_attn(**SMALL, intermediate_size=128, vocab_size=1000))
    return _text(DebertaV2Model, cfg)


@seeded
def deberta_v3() -> Factory:
    """DeBERTa-v3's disentangled attention: content-to-position and position-to-content terms
    added to the [B*H, S, T] scores (relative positions in log buckets, shared key projection)."""
    from transformers import DebertaV2Config, DebertaV2Model

    cfg = DebertaV2Config(
        **_attn(
            **SMALL,
            intermediate_size=128,
            vocab_size=1000,
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            position_buckets=16,
            max_relative_positions=-1,
            max_position_embeddings=64,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            position_biased_input=False,
        )
    )
    return _text(DebertaV2Model, cfg)


@seeded
def mpnet() -> Factory:
    from transformers import MPNetConfig, MPNetModel

    cfg = MPNetConfig(**_attn(**SMALL, intermediate_size=128, vocab_size=1000))
    return _text(MPNetModel, cfg)


@seeded
def mobilebert() -> Factory:
    from transformers import MobileBertConfig, MobileBertModel

    cfg = MobileBertConfig(
        **_attn(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            intermediate_size=64,
            embedding_size=32,
            intra_bottleneck_size=32,
            true_hidden_size=32,
            vocab_size=1000,
        )
    )
    return _text(MobileBertModel, cfg)


@seeded
def clip_text() -> Factory:
    from transformers import CLIPTextConfig, CLIPTextModel

    cfg = CLIPTextConfig(
        **_attn(**SMALL, intermediate_size=128, vocab_size=1000, max_position_embeddings=64)
    )
    return _text(CLIPTextModel, cfg, ("last_hidden_state", "pooler_output"))


# ---------------------------------------------------------------------------- seq2seq


def _bart_config(config_cls: Any = None) -> Any:
    """A tiny BART-shaped config (also Pegasus, mBART, M2M100, Blenderbot: the same fields)."""
    from transformers import BartConfig

    return (config_cls or BartConfig)(
        **_attn(
            vocab_size=1000,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_position_embeddings=128,
            use_cache=False,
        )
    )


@seeded
def bart_encoder() -> Factory:
    from transformers.models.bart.modeling_bart import BartEncoder

    return _text(BartEncoder, _bart_config())


@seeded
def bart() -> Factory:
    from transformers import BartModel

    return _seq2seq(BartModel, _bart_config())


def _t5_config() -> Any:
    from transformers import T5Config

    return T5Config(
        **_attn(
            vocab_size=1000,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            use_cache=False,
        )
    )


@seeded
def t5_encoder() -> Factory:
    from transformers import T5EncoderModel

    return _text(T5EncoderModel, _t5_config())


@seeded
def t5() -> Factory:
    from transformers import T5Model

    return _seq2seq(T5Model, _t5_config())


# ---------------------------------------------------------------------------- decoders


def _decoder(model_cls: Any, cfg: Any) -> Factory:
    return _text(model_cls, cfg)


@seeded
def gpt_neo() -> Factory:
    from transformers import GPTNeoConfig, GPTNeoModel

    cfg = GPTNeoConfig(
        **_attn(
            vocab_size=1000,
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            attention_types=[[["global", "local"], 1]],
            window_size=8,
            max_position_embeddings=128,
            use_cache=False,
        )
    )
    return _decoder(GPTNeoModel, cfg)


@seeded
def opt() -> Factory:
    from transformers import OPTConfig, OPTModel

    cfg = OPTConfig(
        **_attn(
            vocab_size=1000,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=128,
            word_embed_proj_dim=64,
            max_position_embeddings=128,
            use_cache=False,
        )
    )
    return _decoder(OPTModel, cfg)


def _llama_like(**extra: Any) -> dict[str, Any]:
    config = {
        "vocab_size": 1000,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "use_cache": False,
    }
    return _attn(**{**config, **extra})


@seeded
def mistral() -> Factory:
    from transformers import MistralConfig, MistralModel

    return _decoder(MistralModel, MistralConfig(**_llama_like(sliding_window=None)))


@seeded
def qwen2() -> Factory:
    from transformers import Qwen2Config, Qwen2Model

    return _decoder(Qwen2Model, Qwen2Config(**_llama_like()))


@seeded
def qwen2_medium() -> Factory:
    """Qwen2 at a size worth timing: 4 layers, hidden 768, 12 query and 4 K/V heads of 64; not
    in the sweep's families (``onnxopt export benchmarks.arch_sweep:qwen2_medium ... --opset 11``)."""
    from transformers import Qwen2Config, Qwen2Model

    cfg = Qwen2Config(
        **_attn(
            vocab_size=1000,
            hidden_size=768,
            intermediate_size=2048,
            num_hidden_layers=4,
            num_attention_heads=12,
            num_key_value_heads=4,
            max_position_embeddings=2048,
            use_cache=False,
        )
    )
    return _decoder(Qwen2Model, cfg)


@seeded
def gemma() -> Factory:
    from transformers import GemmaConfig, GemmaModel

    return _decoder(GemmaModel, GemmaConfig(**_llama_like(head_dim=16)))


@seeded
def phi() -> Factory:
    from transformers import PhiConfig, PhiModel

    return _decoder(PhiModel, PhiConfig(**_llama_like()))  # rotates half of each head


@seeded
def phi_medium() -> Factory:
    """Phi-2's attention shape at a size worth timing (4 layers, hidden 640, 8 heads of 80, as many
    K/V heads, 32 of each head's dims rotate); not in the sweep's families.
    ``onnxopt export benchmarks.arch_sweep:phi_medium -o pm.onnx``."""
    from transformers import PhiConfig, PhiModel

    cfg = PhiConfig(
        **_attn(
            vocab_size=1000,
            hidden_size=640,
            intermediate_size=2560,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=8,
            partial_rotary_factor=0.4,
            max_position_embeddings=2048,
            use_cache=False,
        )
    )
    return _decoder(PhiModel, cfg)


@seeded
def stablelm() -> Factory:
    from transformers import StableLmConfig, StableLmModel

    # partial_rotary_factor 0.25 (the default): 4 of each head's 16 dims rotate
    return _decoder(StableLmModel, StableLmConfig(**_llama_like()))


@seeded
def gpt_neox() -> Factory:
    from transformers import GPTNeoXConfig, GPTNeoXModel

    cfg = GPTNeoXConfig(
        **_attn(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=256,
            use_cache=False,
        )
    )  # rotary_pct 0.25 (the default); Q, K, V chunks of one packed projection
    return _decoder(GPTNeoXModel, cfg)


@seeded
def qwen3() -> Factory:
    from transformers import Qwen3Config, Qwen3Model

    # RMSNorm of each head's Q and K before the rotary
    return _decoder(Qwen3Model, Qwen3Config(**_llama_like(head_dim=16)))


@seeded
def phi3() -> Factory:
    from transformers import Phi3Config, Phi3Model

    # one packed qkv_proj and one gate_up_proj, split in the graph
    return _decoder(Phi3Model, Phi3Config(**_llama_like(pad_token_id=0)))


@seeded
def gemma2() -> Factory:
    from transformers import Gemma2Config, Gemma2Model

    # logit soft-capping (tanh) in attention, sliding-window layers, norms after attention and MLP
    cfg = Gemma2Config(**_llama_like(head_dim=16, sliding_window=8, query_pre_attn_scalar=16))
    return _decoder(Gemma2Model, cfg)


@seeded
def gemma2_window4() -> Factory:
    """Gemma2 with a sliding window of 4, shorter than the sequences validated (padded_masks.py
    runs 9 and 16): the window masks keys there. Not a sweep family;
    ``onnxopt export benchmarks.arch_sweep:gemma2_window4 -o g.onnx``."""
    from transformers import Gemma2Config, Gemma2Model

    cfg = Gemma2Config(**_llama_like(head_dim=16, sliding_window=4, query_pre_attn_scalar=16))
    return _decoder(Gemma2Model, cfg)


@seeded
def gemma2_medium() -> Factory:
    """Gemma2's attention at a size worth timing (4 layers, hidden 640, 8 query / 4 K/V heads of
    80, sliding window 64, soft cap 50); not a sweep family.
    ``onnxopt export benchmarks.arch_sweep:gemma2_medium -o g.onnx``."""
    from transformers import Gemma2Config, Gemma2Model

    cfg = Gemma2Config(
        **_attn(
            vocab_size=1000,
            hidden_size=640,
            intermediate_size=2560,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=80,
            sliding_window=64,
            query_pre_attn_scalar=80,
            max_position_embeddings=2048,
            use_cache=False,
        )
    )
    return _decoder(Gemma2Model, cfg)


@seeded
def gemma3() -> Factory:
    from transformers import Gemma3TextConfig, Gemma3TextModel

    cfg = Gemma3TextConfig(**_llama_like(head_dim=16, sliding_window=8, query_pre_attn_scalar=16))
    return _decoder(Gemma3TextModel, cfg)


@seeded
def olmo2() -> Factory:
    from transformers import Olmo2Config, Olmo2Model

    # RMSNorm over all heads' Q and K, norms after attention and MLP
    return _decoder(Olmo2Model, Olmo2Config(**_llama_like(pad_token_id=0)))


@seeded
def cohere() -> Factory:
    from transformers import CohereConfig, CohereModel

    # interleaved rotary, parallel attention and MLP off one LayerNorm without bias
    return _decoder(CohereModel, CohereConfig(**_llama_like(pad_token_id=0)))


@seeded
def gptj() -> Factory:
    from transformers import GPTJConfig, GPTJModel

    cfg = GPTJConfig(
        **_attn(
            vocab_size=1000,
            n_embd=64,
            n_layer=2,
            n_head=4,
            rotary_dim=8,  # interleaved rotary on 8 of each head's 16 dims
            n_positions=256,
            use_cache=False,
        )
    )
    return _decoder(GPTJModel, cfg)


@seeded
def gpt2_deep() -> Factory:
    """GPT-2 with 12 layers at a tiny width: enough layers that a merged decoder's branches make
    up dozens of dim names (a test of their naming); not in the sweep's families."""
    from onnxopt.zoo.transformers_models import _gpt2

    return _gpt2(n_layer=12, n_embd=64, n_head=4, vocab_size=1000, n_positions=256)


@seeded
def gptj_medium() -> Factory:
    """GPT-J-6B's head shape at a size worth timing (4 layers, hidden 512, 2 heads of 256, 64 of
    each head's dims rotate pairwise); not in the sweep's families.
    ``onnxopt export benchmarks.arch_sweep:gptj_medium -o gm.onnx``."""
    from transformers import GPTJConfig, GPTJModel

    cfg = GPTJConfig(
        **_attn(
            vocab_size=1000,
            n_embd=512,
            n_layer=4,
            n_head=2,
            rotary_dim=64,
            n_positions=2048,
            use_cache=False,
        )
    )
    return _decoder(GPTJModel, cfg)


@seeded
def gpt_neox_medium() -> Factory:
    """GPT-NeoX (Pythia) at a size worth timing: 4 layers, hidden 768, 12 heads of 64, a quarter
    of each head rotating, K/V reaching attention as [B, H, T, d]; not in the sweep's families.
    ``onnxopt export benchmarks.arch_sweep:gpt_neox_medium -o nm.onnx``."""
    from transformers import GPTNeoXConfig, GPTNeoXModel

    cfg = GPTNeoXConfig(
        **_attn(
            vocab_size=1000,
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=4,
            num_attention_heads=12,
            max_position_embeddings=2048,
            use_cache=False,
        )
    )
    return _decoder(GPTNeoXModel, cfg)


def _codegen(
    heads: int, rotary_dim: int, width: int = 64, layers: int = 2, positions: int = 256
) -> Factory:
    from transformers import CodeGenConfig, CodeGenModel

    cfg = CodeGenConfig(
        **_attn(
            vocab_size=1000,
            n_embd=width,
            n_layer=layers,
            n_head=heads,
            rotary_dim=rotary_dim,
            n_positions=positions,
            n_ctx=positions,
            use_cache=False,
        )
    )
    return _decoder(CodeGenModel, cfg)


@seeded
def codegen() -> Factory:
    """GPT-J's interleaved rotary (8 of 16 dims), heads split out of one packed Q/K/V viewed as
    [B, S, mp_num=4, 3*local]: one head per model-parallel group."""
    return _codegen(heads=4, rotary_dim=8)


@seeded
def codegen_grouped() -> Factory:
    """CodeGen with 2 heads per model-parallel group (8 heads, ``mp_num`` 4), as the real models
    have 4 or more: each chunk of the packed Q/K/V is [B, S, 4, 2*d], viewed as [B, S, 8, d].
    Not in the sweep's families. ``onnxopt export benchmarks.arch_sweep:codegen_grouped -o c.onnx``."""
    return _codegen(heads=8, rotary_dim=4)


@seeded
def codegen_medium() -> Factory:
    """CodeGen-350M's head shape at a size worth timing (4 layers, hidden 1024, 16 heads of 64,
    4 per model-parallel group, 32 of each head's dims rotate pairwise); not in the sweep's
    families. ``onnxopt export benchmarks.arch_sweep:codegen_medium -o cm.onnx``."""
    return _codegen(heads=16, rotary_dim=32, width=1024, layers=4, positions=2048)


@seeded
def modernbert() -> Factory:
    from transformers import ModernBertConfig, ModernBertModel

    cfg = ModernBertConfig(
        **_attn(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            global_attn_every_n_layers=3,
            local_attention=8,
            max_position_embeddings=256,
            pad_token_id=0,
        )
    )  # rotary encoder, GeGLU, local attention windows on 2 of 3 layers
    return _text(ModernBertModel, cfg)


def _falcon(vocab: int, hidden: int, layers: int, heads: int) -> Factory:
    from transformers import FalconConfig, FalconModel

    cfg = FalconConfig(
        **_attn(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            use_cache=False,
        )
    )
    return _decoder(FalconModel, cfg)


@seeded
def falcon() -> Factory:
    return _falcon(vocab=1000, hidden=64, layers=2, heads=4)


@seeded
def falcon_medium() -> Factory:
    """Falcon at a size worth timing (4 layers, hidden 512, 8 query heads, one K/V head); not in
    the sweep's families. ``onnxopt export benchmarks.arch_sweep:falcon_medium -o fm.onnx``."""
    return _falcon(vocab=32000, hidden=512, layers=4, heads=8)


@seeded
def bloom() -> Factory:
    from transformers import BloomConfig, BloomModel

    cfg = BloomConfig(
        **_attn(vocab_size=1000, hidden_size=64, n_layer=2, n_head=4, use_cache=False)
    )
    return _decoder(BloomModel, cfg)


# ---------------------------------------------------------------------------- vision


@seeded
def clip_vision() -> Factory:
    from transformers import CLIPVisionConfig, CLIPVisionModel

    cfg = CLIPVisionConfig(**_attn(**SMALL, intermediate_size=128, image_size=32, patch_size=8))
    return _pixels(CLIPVisionModel, cfg, 32, ("last_hidden_state", "pooler_output"))


@seeded
def deit() -> Factory:
    from transformers import DeiTConfig, DeiTModel

    cfg = DeiTConfig(**_attn(**SMALL, intermediate_size=128, image_size=32, patch_size=8))
    return _pixels(DeiTModel, cfg, 32)


@seeded
def beit() -> Factory:
    from transformers import BeitConfig, BeitModel

    cfg = BeitConfig(
        **_attn(
            **SMALL,
            intermediate_size=128,
            image_size=32,
            patch_size=8,
            use_relative_position_bias=True,
        )
    )
    return _pixels(BeitModel, cfg, 32)


@seeded
def swin() -> Factory:
    from transformers import SwinConfig, SwinModel

    cfg = SwinConfig(
        **_attn(
            image_size=32,
            patch_size=2,
            embed_dim=16,
            depths=[1, 1],
            num_heads=[2, 4],
            window_size=4,
        )
    )
    return _pixels(SwinModel, cfg, 32)


@seeded
def segformer() -> Factory:
    from transformers import SegformerConfig, SegformerModel

    cfg = SegformerConfig(
        **_attn(
            num_encoder_blocks=2,
            depths=[1, 1],
            sr_ratios=[2, 1],
            hidden_sizes=[16, 32],
            num_attention_heads=[1, 2],
            patch_sizes=[7, 3],
            strides=[4, 2],
            mlp_ratios=[2, 2],
        )
    )
    return _pixels(SegformerModel, cfg, 32)


@seeded
def mobilevit() -> Factory:
    from transformers import MobileViTConfig, MobileViTModel

    cfg = MobileViTConfig(
        image_size=32,
        hidden_sizes=[16, 24, 32],
        neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
        num_attention_heads=2,
    )
    return _pixels(MobileViTModel, cfg, 32)


@seeded
def convnext_v2() -> Factory:
    from transformers import ConvNextV2Config, ConvNextV2Model

    cfg = ConvNextV2Config(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, image_size=32)
    return _pixels(ConvNextV2Model, cfg, 32)


@seeded
def hf_resnet() -> Factory:
    from transformers import ResNetConfig, ResNetModel

    cfg = ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck"
    )
    return _pixels(ResNetModel, cfg, 32)


@seeded
def efficientnet() -> Factory:
    from transformers import EfficientNetConfig, EfficientNetModel

    cfg = EfficientNetConfig(
        image_size=32,
        width_coefficient=0.25,
        depth_coefficient=0.25,
        hidden_dim=320,  # the top conv: round_filters(1280) at width 0.25
    )
    return _pixels(EfficientNetModel, cfg, 32)


@seeded
def regnet() -> Factory:
    from transformers import RegNetConfig, RegNetModel

    cfg = RegNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8)
    return _pixels(RegNetModel, cfg, 32)


# ---------------------------------------------------------------------------- audio


def _audio(model_cls: Any, cfg: Any) -> Factory:
    import torch

    from onnxopt.zoo.transformers_models import _Outputs

    inputs = {"input_values": torch.randn(2, 1600)}
    wrapped = _Outputs(model_cls(cfg), ("input_values",), ("last_hidden_state",))
    return _finish(wrapped, inputs, {"input_values": {0: "batch", 1: "samples"}})


def _wav2vec2_like(cfg_cls: Any, **extra: Any) -> Any:
    return cfg_cls(
        **_attn(
            **SMALL,
            intermediate_size=128,
            conv_dim=(32, 32),
            conv_stride=(5, 2),
            conv_kernel=(10, 3),
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4,
            do_stable_layer_norm=False,
            **extra,
        )
    )


@seeded
def wav2vec2() -> Factory:
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    return _audio(Wav2Vec2Model, _wav2vec2_like(Wav2Vec2Config))


@seeded
def hubert() -> Factory:
    from transformers import HubertConfig, HubertModel

    return _audio(HubertModel, _wav2vec2_like(HubertConfig))


# ---------------------------------------------------------------------------- more families
# Mixture-of-experts routing, multi-query / ALiBi / latent attention, state-space models and
# encoders whose attention is not the BERT form.

# transformers' default MoE kernel on CPU ("grouped_mm") counts tokens per expert with histc,
# which neither exporter converts; "batched_mm" gathers each token's expert weights instead.
EXPERTS = "batched_mm"


@seeded
def mixtral() -> Factory:
    from transformers import MixtralConfig, MixtralModel

    # top-2 of 4 experts: the routing reads token indices at run time
    cfg = MixtralConfig(
        **_llama_like(num_local_experts=4, num_experts_per_tok=2, experts_implementation=EXPERTS)
    )
    return _decoder(MixtralModel, cfg)


@seeded
def qwen2_moe() -> Factory:
    from transformers import Qwen2MoeConfig, Qwen2MoeModel

    cfg = Qwen2MoeConfig(
        **_llama_like(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=64,
            experts_implementation=EXPERTS,
        )
    )
    return _decoder(Qwen2MoeModel, cfg)


@seeded
def gpt_bigcode() -> Factory:
    return _gpt_bigcode(width=64, layers=2, heads=4, positions=256)


@seeded
def gpt_bigcode_medium() -> Factory:
    """GPT-BigCode (SantaCoder / StarCoder's multi-query layout) at a size worth timing: 4 layers,
    hidden 768, 12 query heads sharing one K/V head of 64; not in the sweep's families.
    ``onnxopt export benchmarks.arch_sweep:gpt_bigcode_medium -o bm.onnx``."""
    return _gpt_bigcode(width=768, layers=4, heads=12, positions=2048)


def _gpt_bigcode(width: int, layers: int, heads: int, positions: int) -> Factory:
    from transformers import GPTBigCodeConfig, GPTBigCodeModel

    cfg = GPTBigCodeConfig(
        **_attn(
            vocab_size=1000,
            n_embd=width,
            n_layer=layers,
            n_head=heads,
            n_positions=positions,
            multi_query=True,
            use_cache=False,
        )
    )
    return _decoder(GPTBigCodeModel, cfg)


@seeded
def mpt() -> Factory:
    from transformers import MptConfig, MptModel

    cfg = MptConfig(
        d_model=64, n_heads=4, n_layers=2, expansion_ratio=2, vocab_size=1000, use_cache=False
    )  # ALiBi
    return _decoder(MptModel, cfg)


@seeded
def mamba() -> Factory:
    from transformers import MambaConfig, MambaModel

    cfg = MambaConfig(
        vocab_size=1000, hidden_size=64, state_size=8, num_hidden_layers=2, use_cache=False
    )  # selective scan over the sequence (the slow path: no CUDA kernels)
    return _decoder(MambaModel, cfg)


@seeded
def granite() -> Factory:
    from transformers import GraniteConfig, GraniteModel

    cfg = GraniteConfig(**_llama_like(attention_multiplier=0.2, residual_multiplier=0.5))
    return _decoder(GraniteModel, cfg)


@seeded
def starcoder2() -> Factory:
    from transformers import Starcoder2Config, Starcoder2Model

    cfg = Starcoder2Config(**_llama_like(sliding_window=None))  # biases, LayerNorm, gelu MLP
    return _decoder(Starcoder2Model, cfg)


@seeded
def nemotron() -> Factory:
    from transformers import NemotronConfig, NemotronModel

    cfg = NemotronConfig(**_llama_like(head_dim=16))  # LayerNorm1P, squared ReLU, partial rotary
    return _decoder(NemotronModel, cfg)


@seeded
def persimmon() -> Factory:
    from transformers import PersimmonConfig, PersimmonModel

    cfg = PersimmonConfig(**_llama_like(num_key_value_heads=4, qk_layernorm=True))
    return _decoder(PersimmonModel, cfg)


@seeded
def persimmon_medium() -> Factory:
    """Persimmon (Fuyu's language model) at a size worth timing: 4 layers, hidden 768, 12 heads of
    64 normalized per head, half of each rotating; not in the sweep's families."""
    from transformers import PersimmonConfig, PersimmonModel

    cfg = PersimmonConfig(
        **_llama_like(
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=4,
            num_attention_heads=12,
            num_key_value_heads=12,
            max_position_embeddings=2048,
            qk_layernorm=True,
        )
    )
    return _decoder(PersimmonModel, cfg)


@seeded
def deepseek_v3() -> Factory:
    from transformers import DeepseekV3Config, DeepseekV3Model

    # multi-head latent attention (low-rank Q/KV, a rotary part of each head, V's heads narrower
    # than Q/K's as in DeepSeek-V2/V3: 128 vs 192), dense layers only
    cfg = DeepseekV3Config(**_llama_like(**TINY_MLA, v_head_dim=12, **TINY_ROUTED_MOE))
    return _decoder(DeepseekV3Model, cfg)


def _tiny_gpt_oss(sliding_window: int) -> Factory:
    from transformers import GptOssConfig, GptOssModel

    # attention sinks, sliding/full layers, MoE with clamped SwiGLU
    cfg = GptOssConfig(
        **_llama_like(
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=sliding_window,
            layer_types=["sliding_attention", "full_attention"],
            experts_implementation=EXPERTS,
        )
    )
    return _decoder(GptOssModel, cfg)


@seeded
def gpt_oss() -> Factory:
    return _tiny_gpt_oss(sliding_window=8)


def _learned_sinks(factory: Factory, std: float = 1.0) -> Factory:
    """The factory's GPT-OSS with each layer's sinks drawn at the scale a trained model has (the
    initialisation's std 0.02 leaves them near 0, where a sink barely changes a row); seeded by
    the caller's ``@seeded``."""
    import torch

    module = factory[0]
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(getattr(sub, "sinks", None), torch.nn.Parameter):
                sub.sinks.normal_(0.0, std)
    return factory


@seeded
def gpt_oss_window4() -> Factory:
    """GPT-OSS with a sliding window of 4, shorter than the sequences the tests validate, and
    sinks of std 1; not a sweep family. ``onnxopt export benchmarks.arch_sweep:gpt_oss_window4
    -o g.onnx``."""
    return _learned_sinks(_tiny_gpt_oss(sliding_window=4))


@seeded
def gpt_oss_medium() -> Factory:
    """GPT-OSS's attention at a size worth timing (4 layers, hidden 512, 8 query / 2 K/V heads of
    64 as in gpt-oss-20b, sliding window 128 on every other layer, sinks of std 1); not a sweep
    family. The experts are small (4 of width 64, top 2): the exportable batched_mm kernel gathers
    each token's expert weights, which at width 512 took most of the run and hid attention.
    ``onnxopt export benchmarks.arch_sweep:gpt_oss_medium -o g.onnx``."""
    from transformers import GptOssConfig, GptOssModel

    cfg = GptOssConfig(
        **_attn(
            vocab_size=1000,
            hidden_size=512,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=64,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=128,
            layer_types=["sliding_attention", "full_attention"] * 2,
            max_position_embeddings=4096,
            use_cache=False,
            experts_implementation=EXPERTS,
        )
    )
    return _learned_sinks(_decoder(GptOssModel, cfg))


@seeded
def xglm() -> Factory:
    from transformers import XGLMConfig, XGLMModel

    cfg = XGLMConfig(
        vocab_size=1000,
        d_model=64,
        ffn_dim=128,
        num_layers=2,
        attention_heads=4,
        max_position_embeddings=256,
        use_cache=False,
    )  # sinusoidal positions computed from the ids
    return _decoder(XGLMModel, cfg)


@seeded
def biogpt() -> Factory:
    from transformers import BioGptConfig, BioGptModel

    cfg = BioGptConfig(**_attn(**SMALL, vocab_size=1000, intermediate_size=128, use_cache=False))
    return _decoder(BioGptModel, cfg)


@seeded
def xlnet() -> Factory:
    from transformers import XLNetConfig, XLNetModel

    cfg = XLNetConfig(vocab_size=1000, d_model=64, n_layer=2, n_head=4, d_inner=128)
    return _text(
        XLNetModel, cfg
    )  # relative positions with the two-stream attention's content stream


@seeded
def squeezebert() -> Factory:
    from transformers import SqueezeBertConfig, SqueezeBertModel

    cfg = SqueezeBertConfig(
        vocab_size=1000,
        hidden_size=64,
        embedding_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        q_groups=2,
        k_groups=2,
        v_groups=2,
        post_attention_groups=2,
        intermediate_groups=2,
        output_groups=2,
    )  # grouped 1x1 Conv1d projections on [B, C, S]
    return _text(SqueezeBertModel, cfg)


@seeded
def funnel() -> Factory:
    from transformers import FunnelConfig, FunnelModel

    cfg = FunnelConfig(
        vocab_size=1000, block_sizes=[1, 1], d_model=64, n_head=4, d_head=16, d_inner=128
    )  # pooled queries, relative attention
    return _text(FunnelModel, cfg)


@seeded
def roformer() -> Factory:
    from transformers import RoFormerConfig, RoFormerModel

    cfg = RoFormerConfig(**_attn(**SMALL, vocab_size=1000, intermediate_size=128))
    return _text(RoFormerModel, cfg)  # interleaved rotary in an encoder


@seeded
def convbert() -> Factory:
    from transformers import ConvBertConfig, ConvBertModel

    cfg = ConvBertConfig(
        **_attn(**SMALL, vocab_size=1000, intermediate_size=128, embedding_size=64)
    )  # span-based dynamic convolution heads beside the attention
    return _text(ConvBertModel, cfg)


@seeded
def esm() -> Factory:
    from transformers import EsmConfig, EsmModel

    cfg = EsmConfig(
        **_attn(
            **SMALL,
            vocab_size=33,
            intermediate_size=128,
            position_embedding_type="rotary",
            pad_token_id=1,
            mask_token_id=32,
        )
    )
    return _text(EsmModel, cfg)


@seeded
def marian() -> Factory:
    from transformers import MarianConfig, MarianModel

    cfg = MarianConfig(
        vocab_size=1000,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=256,
        pad_token_id=0,
        decoder_start_token_id=0,
        use_cache=False,
    )
    return _seq2seq(MarianModel, cfg)


@seeded
def whisper() -> Factory:
    """The whole Whisper forward (encoder and decoder, no cache), not only the zoo's encoder."""
    import torch
    from transformers import WhisperConfig, WhisperModel

    from onnxopt.zoo.transformers_models import _Outputs

    cfg = WhisperConfig(
        vocab_size=1000,
        num_mel_bins=16,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=32,
        max_target_positions=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        use_cache=False,
    )
    inputs = {
        "input_features": torch.randn(2, 16, 64),
        "decoder_input_ids": torch.randint(0, 1000, (2, 8)),
    }
    wrapped = _Outputs(
        WhisperModel(cfg), tuple(inputs), ("last_hidden_state", "encoder_last_hidden_state")
    )
    dynamic = {"input_features": BATCH, "decoder_input_ids": {0: "batch", 1: "decoder_sequence"}}
    return _finish(wrapped, inputs, dynamic)


@seeded
def dinov2() -> Factory:
    from transformers import Dinov2Config, Dinov2Model

    cfg = Dinov2Config(**_attn(**SMALL, mlp_ratio=2, image_size=32, patch_size=8))
    return _pixels(Dinov2Model, cfg, 32)  # layer scale, interpolated position embeddings


@seeded
def swinv2() -> Factory:
    from transformers import Swinv2Config, Swinv2Model

    cfg = Swinv2Config(
        image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4
    )  # cosine attention with a learned log-scale, continuous position bias MLP
    return _pixels(Swinv2Model, cfg, 32)


@seeded
def pvt_v2() -> Factory:
    from transformers import PvtV2Config, PvtV2Model

    cfg = PvtV2Config(
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        num_attention_heads=[1, 2],
        patch_sizes=[7, 3],
        strides=[4, 2],
        mlp_ratios=[2, 2],
    )
    return _pixels(PvtV2Model, cfg, 32)


@seeded
def data2vec_audio() -> Factory:
    from transformers import Data2VecAudioConfig, Data2VecAudioModel

    return _audio(Data2VecAudioModel, _wav2vec2_like(Data2VecAudioConfig))


@seeded
def sew() -> Factory:
    from transformers import SEWConfig, SEWModel

    cfg = SEWConfig(
        **_attn(
            **SMALL,
            intermediate_size=128,
            conv_dim=(32, 32),
            conv_stride=(5, 2),
            conv_kernel=(10, 3),
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4,
            squeeze_factor=2,
        )
    )  # the sequence squeezed by a pooling before the encoder and upsampled after
    return _audio(SEWModel, cfg)


# ---------------------------------------------------------------------------- more families
# Text encoders, decoders, seq2seq, vision and audio families added at the 15th stop.

ENC = dict(**SMALL, intermediate_size=128, vocab_size=1000)


def _hf_family(
    name: str, prefix: str, config: Callable[[Any], Any], build: Callable[[Any, Any], Factory]
) -> Callable[[], Factory]:
    """The family ``name`` of transformers' ``<prefix>Model`` with ``config(<prefix>Config)``,
    exported as ``build(model class, config)`` (``_text``, ``_decoder``, ...); FAMILIES and
    export() find it by ``name``."""

    def factory() -> Factory:
        import transformers

        cfg = config(getattr(transformers, f"{prefix}Config"))
        return build(getattr(transformers, f"{prefix}Model"), cfg)

    factory.__name__ = factory.__qualname__ = name
    return seeded(factory)


def _encoder_family(name: str, prefix: str, **extra: Any) -> Callable[[], Factory]:
    """A BERT-shaped encoder at ENC's size."""
    return _hf_family(name, prefix, lambda cls: cls(**_attn(**ENC, **extra)), _text)


def _decoder_family(name: str, prefix: str, **extra: Any) -> Callable[[], Factory]:
    """A LLaMA-shaped decoder (``_llama_like(**extra)``)."""
    return _hf_family(name, prefix, lambda cls: cls(**_llama_like(**extra)), _decoder)


def _seq2seq_family(name: str, prefix: str) -> Callable[[], Factory]:
    """A BART-shaped encoder-decoder, full forward."""
    return _hf_family(name, prefix, _bart_config, _seq2seq)


def _vision_family(
    name: str,
    prefix: str,
    *,
    attention: bool = False,
    outputs: tuple[str, ...] = ("last_hidden_state",),
    **fields: Any,
) -> Callable[[], Factory]:
    """A vision model on 64 x 64 pixels; ``attention``: its config takes the attention setting."""
    return _hf_family(
        name,
        prefix,
        lambda cls: cls(**_attn(**fields)) if attention else cls(**fields),
        lambda model, cfg: _pixels(model, cfg, 64, outputs),
    )


def _audio_family(name: str, prefix: str, **extra: Any) -> Callable[[], Factory]:
    """A wav2vec2-shaped audio encoder (``_wav2vec2_like(**extra)``)."""
    return _hf_family(name, prefix, lambda cls: _wav2vec2_like(cls, **extra), _audio)


megatron_bert = _encoder_family("megatron_bert", "MegatronBert")
ibert = _encoder_family("ibert", "IBert")  # quant_mode off: float LayerNorm, GELU, softmax
ernie = _encoder_family("ernie", "Ernie")
xlm_roberta_xl = _encoder_family("xlm_roberta_xl", "XLMRobertaXL")  # pre-norm layers
rembert = _encoder_family("rembert", "RemBert", input_embedding_size=32, output_embedding_size=32)
luke = _encoder_family("luke", "Luke", entity_vocab_size=100, entity_emb_size=32)
deberta = _encoder_family(  # DeBERTa v1: disentangled attention without buckets
    "deberta",
    "Deberta",
    relative_attention=True,
    pos_att_type=["c2p", "p2c"],
    max_relative_positions=32,
)
big_bird = _encoder_family("big_bird", "BigBird", attention_type="original_full")
olmo = _decoder_family("olmo", "Olmo")  # LayerNorm without parameters
# Interleaved rotary of the first half of rotate_half's Cos/Sin tables (partial in GLM)
glm = _decoder_family("glm", "Glm", head_dim=16, pad_token_id=0)
glm4 = _decoder_family("glm4", "Glm4", head_dim=16, pad_token_id=0)
helium = _decoder_family("helium", "Helium", head_dim=16)
ernie4_5 = _decoder_family("ernie4_5", "Ernie4_5", head_dim=16)
smollm3 = _decoder_family("smollm3", "SmolLM3", pad_token_id=0)  # NoPE on some layers
apertus = _decoder_family("apertus", "Apertus")  # xIELU activation, QK norm
seed_oss = _decoder_family("seed_oss", "SeedOss", head_dim=16)
diffllama = _decoder_family("diffllama", "DiffLlama")  # differential attention: two softmaxes
exaone4 = _decoder_family(
    "exaone4", "Exaone4", head_dim=16, sliding_window=None, layer_types=["full_attention"] * 2
)
cohere2 = _decoder_family("cohere2", "Cohere2", sliding_window=4)  # interleaved rotary, windows
lfm2 = _decoder_family("lfm2", "Lfm2", layer_types=["conv", "full_attention"])  # a conv layer
pegasus = _seq2seq_family("pegasus", "Pegasus")  # sinusoidal positions
mbart = _seq2seq_family("mbart", "MBart")
m2m100 = _seq2seq_family("m2m100", "M2M100")
blenderbot = _seq2seq_family("blenderbot", "Blenderbot")


@seeded
def flaubert() -> Factory:
    from transformers import FlaubertConfig, FlaubertModel

    cfg = FlaubertConfig(**_attn(vocab_size=1000, emb_dim=64, n_layers=2, n_heads=4))
    return _text(FlaubertModel, cfg)


@seeded
def xlm() -> Factory:
    from transformers import XLMConfig, XLMModel

    cfg = XLMConfig(**_attn(vocab_size=1000, emb_dim=64, n_layers=2, n_heads=4))
    return _text(XLMModel, cfg)


@seeded
def openai_gpt() -> Factory:
    from transformers import OpenAIGPTConfig, OpenAIGPTModel

    cfg = OpenAIGPTConfig(**_attn(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128))
    return _decoder(OpenAIGPTModel, cfg)


@seeded
def ctrl() -> Factory:
    from transformers import CTRLConfig, CTRLModel

    cfg = CTRLConfig(
        **_attn(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, dff=128, n_positions=128)
    )
    return _decoder(CTRLModel, cfg)


@seeded
def umt5() -> Factory:
    from transformers import UMT5Config, UMT5Model

    cfg = UMT5Config(
        **_attn(
            vocab_size=1000,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_heads=4,
            use_cache=False,
        )
    )
    return _seq2seq(UMT5Model, cfg)


levit = _vision_family(  # V's head size differs from K's
    "levit",
    "Levit",
    image_size=64,
    hidden_sizes=[32, 48, 64],
    num_attention_heads=[2, 2, 2],
    depths=[1, 1, 1],
    key_dim=[8, 8, 8],
)
poolformer = _vision_family(
    "poolformer", "PoolFormer", hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1]
)
mobilenet_v2_hf = _vision_family(
    "mobilenet_v2_hf", "MobileNetV2", image_size=64, depth_multiplier=0.35
)
mobilevit_v2 = _vision_family("mobilevit_v2", "MobileViTV2", image_size=64, width_multiplier=0.5)
yolos = _vision_family(
    "yolos",
    "Yolos",
    attention=True,
    **SMALL,
    intermediate_size=128,
    image_size=[64, 64],
    patch_size=16,
    num_detection_tokens=5,
)
dpt = _vision_family(
    "dpt",
    "DPT",
    attention=True,
    num_hidden_layers=4,
    hidden_size=64,
    num_attention_heads=4,
    intermediate_size=128,
    image_size=64,
    patch_size=16,
    backbone_out_indices=[0, 1, 2, 3],
    neck_hidden_sizes=[16, 32, 64, 64],
    fusion_hidden_size=32,
)
dinov2_registers = _vision_family(
    "dinov2_registers",
    "Dinov2WithRegisters",
    attention=True,
    **SMALL,
    image_size=64,
    patch_size=16,
    num_register_tokens=4,
)
hiera = _vision_family(  # attention within mask units, on 5-D heads
    "hiera",
    "Hiera",
    embed_dim=16,
    image_size=[64, 64],
    patch_size=[7, 7],
    patch_stride=[4, 4],
    depths=[1, 1, 1, 1],
    num_heads=[1, 2, 4, 8],
    query_stride=[2, 2],
    masked_unit_size=[8, 8],
)
focalnet = _vision_family("focalnet", "FocalNet", image_size=64, embed_dim=16, depths=[1, 1, 1, 1])
siglip_vision = _vision_family(  # a pooling head: probe.repeat(B, 1, 1) and nn.MultiheadAttention
    "siglip_vision",
    "SiglipVision",
    attention=True,
    outputs=("last_hidden_state", "pooler_output"),
    **SMALL,
    intermediate_size=128,
    image_size=64,
    patch_size=16,
)
convnext = _vision_family(
    "convnext", "ConvNext", hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1]
)
ijepa = _vision_family(
    "ijepa", "IJepa", attention=True, **SMALL, intermediate_size=128, image_size=64, patch_size=16
)
wavlm = _audio_family("wavlm", "WavLM", num_buckets=32, max_bucket_distance=64)  # gated rel. bias
unispeech = _audio_family("unispeech", "UniSpeech")
w2v2_conformer = _audio_family(
    "w2v2_conformer",
    "Wav2Vec2Conformer",
    position_embeddings_type="rotary",
    conv_depthwise_kernel_size=7,
)
w2v2_conformer_rel = _audio_family(
    "w2v2_conformer_rel",
    "Wav2Vec2Conformer",
    position_embeddings_type="relative",
    conv_depthwise_kernel_size=7,
)


@seeded
def siglip_text() -> Factory:
    from transformers import SiglipTextConfig, SiglipTextModel

    cfg = SiglipTextConfig(**_attn(**ENC, max_position_embeddings=64))
    return _text(SiglipTextModel, cfg, ("last_hidden_state", "pooler_output"))


@seeded
def ast() -> Factory:
    import torch
    from transformers import ASTConfig, ASTModel

    from onnxopt.zoo.transformers_models import _Outputs

    cfg = ASTConfig(
        **_attn(
            **SMALL,
            intermediate_size=128,
            max_length=64,
            num_mel_bins=32,
            patch_size=16,
            frequency_stride=10,
            time_stride=10,
        )
    )
    inputs = {"input_values": torch.randn(2, 64, 32)}
    return _finish(
        _Outputs(ASTModel(cfg), ("input_values",), ("last_hidden_state",)),
        inputs,
        {"input_values": {0: "batch"}},
    )


# ---------------------------------------------------------------------------- more families
# Detection, depth and promptable-segmentation vision models, a layout-aware encoder, MoE and
# state-space decoders, recent decoder LLMs and an encoder-decoder speech model.


@seeded
def detr() -> Factory:
    import torch
    from transformers import DetrConfig, DetrModel, ResNetConfig

    from onnxopt.zoo.transformers_models import _Outputs

    backbone = ResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32, 64],
        depths=[1, 1, 1],
        layer_type="basic",
        out_features=["stage3"],  # stride 16: 4 x 4 features, the padded quarter masked
    )
    cfg = DetrConfig(
        **_attn(
            use_timm_backbone=False,
            use_pretrained_backbone=False,
            backbone_config=backbone,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            num_queries=10,
        )
    )  # frozen-BN ResNet, sine positions from the pixel mask's cumsum, object queries
    pixel_mask = torch.ones(2, 64, 64, dtype=torch.int64)
    pixel_mask[1, :, 48:] = 0  # one padded image, so the mask matters
    inputs = {"pixel_values": torch.randn(2, 3, 64, 64), "pixel_mask": pixel_mask}
    wrapped = _Outputs(DetrModel(cfg), tuple(inputs), ("last_hidden_state",))
    return _finish(wrapped, inputs, dict.fromkeys(inputs, BATCH))


@seeded
def rt_detr() -> Factory:
    import torch
    from transformers import RTDetrConfig, RTDetrModel, RTDetrResNetConfig

    backbone = RTDetrResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32, 48, 64],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage2", "stage3", "stage4"],
    )
    cfg = RTDetrConfig(
        **_attn(
            backbone_config=backbone,
            use_pretrained_backbone=False,
            encoder_in_channels=[32, 48, 64],
            encoder_hidden_dim=32,
            encoder_ffn_dim=64,
            encoder_attention_heads=4,
            d_model=32,
            decoder_in_channels=[32, 32, 32],
            decoder_ffn_dim=64,
            decoder_layers=2,
            decoder_attention_heads=4,
            num_queries=10,
            initializer_range=0.1,
        )
    )  # hybrid encoder, top-k query selection, multi-scale deformable attention (grid_sample)
    model = RTDetrModel(cfg)
    for module in model.modules():  # transformers draws BatchNorm scales ~ N(0, 0.1): the
        if isinstance(module, torch.nn.BatchNorm2d):  # encoder's output ignored the image
            module.reset_parameters()
    return _pixels(lambda _: model, cfg, 64)


@seeded
def depth_anything() -> Factory:
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config

    backbone = Dinov2Config(
        num_hidden_layers=4,
        hidden_size=32,
        num_attention_heads=4,
        mlp_ratio=2,
        image_size=56,
        patch_size=14,
        out_indices=[1, 2, 3, 4],
        reshape_hidden_states=False,
    )
    cfg = DepthAnythingConfig(
        # only the backbone has attention (the head has no SDPA path)
        attn_implementation={"backbone_config": ATTENTION["implementation"]},
        backbone_config=backbone,
        patch_size=14,
        reassemble_hidden_size=32,
        neck_hidden_sizes=[16, 32, 64, 64],
        fusion_hidden_size=32,
        head_hidden_size=16,
        initializer_range=0.05,  # at 0.02 the depth map hardly depends on the image
    )  # DINOv2 features reassembled at four scales, a DPT-style fusion neck and depth head
    return _pixels(DepthAnythingForDepthEstimation, cfg, 56, ("predicted_depth",))


sam_vision = _vision_family(  # windowed and global attention with decomposed rel-pos, conv neck
    "sam_vision",
    "SamVision",
    attention=True,
    hidden_size=32,
    output_channels=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    mlp_dim=64,
    image_size=64,
    patch_size=8,
    window_size=4,
    global_attn_indexes=[1],
    initializer_range=0.02,  # the default, 1e-10, leaves the output at the neck's biases
)


def _sam2_vision_config() -> Any:
    from transformers import Sam2HieraDetConfig, Sam2VisionConfig

    backbone = Sam2HieraDetConfig(
        hidden_size=16,
        blocks_per_stage=[1, 2, 3, 1],
        embed_dim_per_stage=[16, 32, 64, 128],
        num_attention_heads_per_stage=[1, 2, 4, 8],
        window_size_per_stage=[4, 4, 4, 4],
        global_attention_blocks=[4],
        image_size=[128, 128],
        window_positional_embedding_background_size=[4, 4],
    )  # Hiera: one head first, windows unbound from a packed Q/K/V, Q pooled at stage changes
    return Sam2VisionConfig(
        backbone_config=backbone,
        fpn_hidden_size=32,
        backbone_channel_list=[128, 64, 32, 16],
        backbone_feature_sizes=[[32, 32], [16, 16], [8, 8]],
    )


@seeded
def sam2_vision() -> Factory:
    from transformers import Sam2VisionModel

    return _pixels(Sam2VisionModel, _sam2_vision_config(), 128)


@seeded
def sam2() -> Factory:
    """The whole Sam2Model on one image and one point prompt, at fixed shapes (as SAM2 is
    usually exported): Hiera encoder, prompt encoder, two-way mask decoder."""
    import torch
    from transformers import Sam2Config, Sam2Model

    from onnxopt.zoo.transformers_models import _Outputs

    cfg = Sam2Config(
        vision_config=_sam2_vision_config(),
        prompt_encoder_config={"hidden_size": 32, "image_size": 128, "patch_size": 16},
        mask_decoder_config={
            "hidden_size": 32,
            "num_attention_heads": 2,
            "mlp_dim": 64,
            "iou_head_hidden_dim": 32,
        },
    )
    inputs = {
        "pixel_values": torch.randn(1, 3, 128, 128),
        "input_points": torch.tensor([[[[40.0, 60.0]]]]),
        "input_labels": torch.tensor([[[1]]]),
    }
    wrapped = _Outputs(Sam2Model(cfg), tuple(inputs), ("pred_masks", "iou_scores"))
    return _finish(wrapped, inputs, {})


@seeded
def layoutlm() -> Factory:
    import torch
    from transformers import LayoutLMConfig, LayoutLMModel

    from onnxopt.zoo.transformers_models import _Outputs, _tokens

    cfg = LayoutLMConfig(**_attn(**ENC))
    inputs = _tokens(1000)
    corners = torch.randint(0, 1001, (2, 16, 2, 2)).sort(dim=2).values  # x0 <= x1, y0 <= y1
    inputs["bbox"] = corners.reshape(2, 16, 4)  # (x0, y0, x1, y1)
    wrapped = _Outputs(LayoutLMModel(cfg), tuple(inputs), ("last_hidden_state",))
    return _finish(wrapped, inputs, dict.fromkeys(inputs, TOKENS))  # 2-D position embeddings


@seeded
def qwen3_moe() -> Factory:
    from transformers import Qwen3MoeConfig, Qwen3MoeModel

    cfg = Qwen3MoeConfig(
        **_llama_like(
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            experts_implementation=EXPERTS,
        )
    )  # Qwen3's per-head Q/K RMSNorm, top-2 of 4 experts without a shared expert
    return _decoder(Qwen3MoeModel, cfg)


@seeded
def olmoe() -> Factory:
    from transformers import OlmoeConfig, OlmoeModel

    cfg = OlmoeConfig(
        **_llama_like(
            intermediate_size=64,
            num_experts=4,
            num_experts_per_tok=2,
            pad_token_id=0,
            experts_implementation=EXPERTS,
        )
    )  # RMSNorm over all heads' Q and K, top-2 of 4 experts
    return _decoder(OlmoeModel, cfg)


@seeded
def mamba2() -> Factory:
    from transformers import Mamba2Config, Mamba2Model

    cfg = Mamba2Config(
        vocab_size=1000,
        hidden_size=64,
        num_heads=8,
        head_dim=16,
        state_size=8,
        n_groups=1,
        chunk_size=8,
        num_hidden_layers=2,
        pad_token_id=0,
        use_cache=False,
    )  # chunked SSD scan in torch (no CUDA kernels), gated RMSNorm
    return _decoder(Mamba2Model, cfg)


@seeded
def llama4_text() -> Factory:
    from transformers import Llama4TextConfig, Llama4TextModel

    cfg = Llama4TextConfig(
        **_llama_like(
            head_dim=16,
            intermediate_size=64,
            intermediate_size_mlp=128,
            num_local_experts=4,
            num_experts_per_tok=1,
            interleave_moe_layer_step=2,
            no_rope_layer_interval=2,
            attention_chunk_size=8,
        )
    )  # chunked attention with complex rotary, then a NoPE layer with temperature tuning; MoE
    return _decoder(Llama4TextModel, cfg)


vitdet = _vision_family(  # window attention with decomposed relative positions on one layer
    "vitdet",
    "VitDet",
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    mlp_ratio=2,
    image_size=64,
    pretrain_image_size=64,
    patch_size=8,
    window_block_indices=[0],
    use_relative_position_embeddings=True,
    window_size=4,
)
cvt = _vision_family(  # convolutional Q/K/V projections (depthwise conv + BN), strided K/V
    "cvt",
    "Cvt",
    embed_dim=[16, 32, 64],
    num_heads=[1, 2, 4],
    depth=[1, 2, 3],  # CvtStage indexes its layers' drop-path rates by stage: depth[i] > i
    mlp_ratio=[2.0, 2.0, 2.0],
    drop_path_rate=[0.0, 0.0, 0.0],
)
data2vec_vision = _vision_family(  # BEiT's relative position bias, layer scale, mean pooling
    "data2vec_vision",
    "Data2VecVision",
    attention=True,
    **SMALL,
    intermediate_size=128,
    image_size=64,
    patch_size=16,
    use_relative_position_bias=True,
)
swin2sr = _vision_family(  # Swin V2 attention on every pixel (patch 1), windows of 4
    "swin2sr",
    "Swin2SR",
    image_size=64,
    patch_size=1,
    embed_dim=16,
    depths=[1, 1],
    num_heads=[2, 2],
    window_size=4,
)


@seeded
def moonshine() -> Factory:
    """The whole Moonshine forward: a conv front end on raw audio, a rotary encoder and decoder."""
    import torch
    from transformers import MoonshineConfig, MoonshineModel

    from onnxopt.zoo.transformers_models import _Outputs

    cfg = MoonshineConfig(
        **_attn(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=128,
            encoder_num_hidden_layers=2,
            decoder_num_hidden_layers=2,
            encoder_num_attention_heads=4,
            decoder_num_attention_heads=4,
            max_position_embeddings=256,
            pad_token_id=0,
            use_cache=False,
        )
    )
    inputs = {
        "input_values": torch.randn(2, 4000),
        "decoder_input_ids": torch.randint(0, 1000, (2, 8)),
    }
    wrapped = _Outputs(
        MoonshineModel(cfg), tuple(inputs), ("last_hidden_state", "encoder_last_hidden_state")
    )
    dynamic = {
        "input_values": {0: "batch", 1: "samples"},
        "decoder_input_ids": {0: "batch", 1: "decoder_sequence"},
    }
    return _finish(wrapped, inputs, dynamic)


olmo3 = _decoder_family(  # Olmo2's norms, a sliding-window layer then a full one
    "olmo3",
    "Olmo3",
    pad_token_id=0,
    sliding_window=8,
    layer_types=["sliding_attention", "full_attention"],
)
vaultgemma = _decoder_family(  # Gemma2's soft-capping and sliding windows, no post-norms
    "vaultgemma", "VaultGemma", head_dim=16, query_pre_attn_scalar=16, sliding_window=8
)
bitnet = _decoder_family("bitnet", "BitNet")  # sub-norms before o_proj and down_proj, relu2
doge = _decoder_family("doge", "Doge")  # a dynamic mask from the values added to the scores
# A ViT at 64 x 64 pixels in 16 x 16 patches, as the vision towers below share it.
TINY_VIT = {
    "image_size": 64,
    "patch_size": 16,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}
# Vision encoders new in transformers 5 (2026), fused as they came
metaclip_2_vision = _vision_family(
    "metaclip_2_vision", "MetaClip2Vision", attention=True, **TINY_VIT
)
tipsv2_vision = _vision_family("tipsv2_vision", "Tipsv2Vision", attention=True, **TINY_VIT)
pixio = _vision_family("pixio", "Pixio", attention=True, **TINY_VIT)
sapiens2 = _vision_family("sapiens2", "Sapiens2", attention=True, **TINY_VIT)  # 2-D RoPE
radio = _vision_family("radio", "Radio", attention=True, **TINY_VIT)


@seeded
def siglip2_vision() -> Factory:
    """SigLIP2's NaFlex encoder: patches [B, N, C*p*p] with their mask and grid shapes."""
    import torch
    from transformers import Siglip2VisionConfig, Siglip2VisionModel

    # NaFlex: no image size, each image brings its patch grid (a 4 x 4 position table here)
    fields = {k: v for k, v in TINY_VIT.items() if k != "image_size"}
    cfg = Siglip2VisionConfig(**_attn(**fields, num_patches=16))

    class _Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = Siglip2VisionModel(cfg)

        def forward(self, pixel_values: Any, pixel_attention_mask: Any, spatial_shapes: Any) -> Any:
            return self.model(
                pixel_values=pixel_values,
                pixel_attention_mask=pixel_attention_mask,
                spatial_shapes=spatial_shapes,
            ).last_hidden_state

    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 12:] = 0  # the second image's last patches are padding
    inputs = {
        "pixel_values": torch.randn(2, 16, 3 * 16 * 16),
        "pixel_attention_mask": mask,
        "spatial_shapes": torch.tensor([[4, 4], [4, 4]]),
    }
    return _finish(_Encoder(), inputs, dict.fromkeys(inputs, BATCH))


dinov3 = _vision_family(  # 2-D RoPE on the patch tokens (not the class and register tokens)
    "dinov3", "DINOv3ViT", attention=True, **TINY_VIT, num_register_tokens=2
)
blip_vision = _vision_family(  # qkv.reshape(B, S, 3, H, d).permute(2, 0, 3, 1, 4), S static
    "blip_vision", "BlipVision", attention=True, **TINY_VIT
)
pixtral_vision = _vision_family(  # 2-D RoPE, RMSNorm, gated FFN
    "pixtral_vision", "PixtralVision", attention=True, **TINY_VIT, head_dim=8
)
aimv2_vision = _vision_family("aimv2_vision", "Aimv2Vision", attention=True, **TINY_VIT)
arcee = _decoder_family("arcee", "Arcee")  # ReLU^2 FFN without a gate
hunyuan_dense = _decoder_family("hunyuan_dense", "HunYuanDenseV1", head_dim=16)  # QK norm
glm4_moe = _decoder_family(  # partial rotary, shared experts
    "glm4_moe", "Glm4Moe", head_dim=16, **TINY_ROUTED_MOE
)
dots1 = _decoder_family("dots1", "Dots1", head_dim=16, **TINY_ROUTED_MOE)
jetmoe = _decoder_family(  # mixture of attention heads
    "jetmoe",
    "JetMoe",
    num_local_experts=4,
    num_experts_per_tok=2,
    kv_channels=16,
    num_key_value_heads=4,
)


@seeded
def videomae() -> Factory:
    import torch
    from transformers import VideoMAEConfig, VideoMAEModel

    from onnxopt.zoo.transformers_models import _Outputs

    # tubelets of 2 frames x 16 x 16 pixels: a Conv3d patch embedding, then a plain ViT
    cfg = VideoMAEConfig(**_attn(**{**TINY_VIT, "image_size": 32}, num_frames=4, tubelet_size=2))
    inputs = {"pixel_values": torch.randn(2, 4, 3, 32, 32)}
    module = _Outputs(VideoMAEModel(cfg), ("pixel_values",), ("last_hidden_state",))
    return _finish(module, inputs, {"pixel_values": BATCH})


# Rotary encoders (embedding models): BERT-shaped, RoPE instead of learned positions.
nomic_bert = _encoder_family("nomic_bert", "NomicBert")  # SwiGLU FFN, no biases
gte = _encoder_family("gte", "Gte")  # gte-multilingual: NTK RoPE, post-norm
jina_embeddings_v3 = _encoder_family("jina_embeddings_v3", "JinaEmbeddingsV3")  # XLM-R + RoPE
eurobert = _encoder_family(  # bidirectional LLaMA: RMSNorm, GQA, no causal mask
    "eurobert",
    "EuroBert",
    num_key_value_heads=2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    mask_token_id=3,
)
minicpm3 = _decoder_family(  # multi-head latent attention, as DeepSeek-V2
    "minicpm3", "MiniCPM3", **TINY_MLA, v_head_dim=16
)
ministral3 = _decoder_family(  # YaRN rotary; the query scaled by log(1 + floor(pos / 4)) after it
    "ministral3",
    "Ministral3",
    head_dim=16,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 4,  # 16384 as released: the scale then is 1 here
        "llama_4_scaling_beta": 0.1,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
)
nanochat = _decoder_family("nanochat", "NanoChat", num_key_value_heads=4)  # QK norm, relu^2
cwm = _decoder_family(  # Llama-3 RoPE, sliding-window and full layers
    "cwm", "Cwm", head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"]
)
modernbert_decoder = _hf_family(  # ModernBERT's layers, causal, local then global attention
    "modernbert_decoder",
    "ModernBertDecoder",
    lambda cls: cls(
        **_attn(
            **ENC,
            local_attention=8,
            layer_types=["sliding_attention", "full_attention"],
            pad_token_id=0,
            use_cache=False,
        )
    ),
    _decoder,
)
mlcd_vision = _vision_family(  # 2-D (axial) RoPE on patches and class token
    "mlcd_vision", "MLCDVision", attention=True, **TINY_VIT
)


def _video(model_cls: Any, cfg: Any, frames: int) -> Factory:
    import torch

    from onnxopt.zoo.transformers_models import _Outputs

    inputs = {"pixel_values": torch.randn(2, frames, 3, 32, 32)}
    module = _Outputs(model_cls(cfg), ("pixel_values",), ("last_hidden_state",))
    return _finish(module, inputs, {"pixel_values": BATCH})


timesformer = _hf_family(  # divided space-time attention: heads over frames, then over patches
    "timesformer",
    "Timesformer",
    lambda cls: cls(**_attn(**{**TINY_VIT, "image_size": 32}, num_frames=4)),
    lambda model, cfg: _video(model, cfg, 4),
)
vivit = _hf_family(  # tubelet embedding (Conv3d), then a plain ViT over space-time tokens
    "vivit",
    "Vivit",
    lambda cls: cls(
        **_attn(**{**TINY_VIT, "image_size": 32}, num_frames=4, tubelet_size=[2, 16, 16])
    ),
    lambda model, cfg: _video(model, cfg, 4),
)


@seeded
def parakeet_encoder() -> Factory:
    """FastConformer: conv subsampling, relative-position attention, depthwise conv modules."""
    import torch
    from transformers import ParakeetEncoder, ParakeetEncoderConfig

    from onnxopt.zoo.transformers_models import _Outputs

    cfg = ParakeetEncoderConfig(
        **_attn(
            **SMALL,
            intermediate_size=128,
            conv_kernel_size=9,
            subsampling_conv_channels=32,
            num_mel_bins=32,
        )
    )
    inputs = {"input_features": torch.randn(2, 64, 32)}
    module = _Outputs(ParakeetEncoder(cfg), ("input_features",), ("last_hidden_state",))
    return _finish(module, inputs, {"input_features": {0: "batch", 1: "frames"}})


# Mixture-of-experts decoders (routing beside the attention) and a video encoder with 3-D RoPE.
# (experts_implementation=EXPERTS: transformers' default kernel does not export, see mixtral)
TINY_MOE = {"num_experts_per_tok": 2, "experts_implementation": EXPERTS}
phimoe = _decoder_family("phimoe", "Phimoe", num_local_experts=4, **TINY_MOE)
granitemoe = _decoder_family("granitemoe", "GraniteMoe", num_local_experts=4, **TINY_MOE)
flex_olmo = _decoder_family(  # OLMo2's norms with experts
    "flex_olmo", "FlexOlmo", num_experts=4, pad_token_id=0, **TINY_MOE
)
hunyuan_moe = _decoder_family(  # QK norm, experts every layer
    "hunyuan_moe",
    "HunYuanMoEV1",
    head_dim=16,
    num_experts=4,
    moe_topk=2,
    experts_implementation=EXPERTS,
)
ernie4_5_moe = _decoder_family(  # shared experts, MoE from layer 1
    "ernie4_5_moe",
    "Ernie4_5_Moe",
    moe_num_experts=4,
    moe_k=2,
    moe_intermediate_size=32,
    moe_num_shared_experts=1,
    moe_layer_start_index=1,
    experts_implementation=EXPERTS,
)
exaone_moe = _decoder_family(  # sliding and full layers, the first dense
    "exaone_moe",
    "ExaoneMoe",
    head_dim=16,
    num_experts=4,
    num_shared_experts=1,
    moe_intermediate_size=32,
    first_k_dense_replace=1,
    sliding_window=8,
    layer_types=["sliding_attention", "full_attention"],
    **TINY_MOE,
)
glm4_moe_lite = _decoder_family(  # GLM with DeepSeek's latent attention
    "glm4_moe_lite",
    "Glm4MoeLite",
    **TINY_MLA,
    v_head_dim=16,
    n_routed_experts=4,
    n_shared_experts=1,
    moe_intermediate_size=32,
    **TINY_MOE,
)


@seeded
def vjepa2() -> Factory:
    """V-JEPA 2's encoder: tubelets through a Conv3d, 3-D RoPE (time, height, width) on each head."""
    import torch
    from transformers import VJEPA2Config, VJEPA2Model

    cfg = VJEPA2Config(
        **_attn(
            crop_size=32,
            frames_per_clip=4,
            patch_size=16,
            tubelet_size=2,
            hidden_size=48,
            num_attention_heads=4,
            num_hidden_layers=2,
            mlp_ratio=2.0,
            pred_hidden_size=24,
            pred_num_attention_heads=2,
            pred_num_hidden_layers=1,
        )
    )
    inputs = {"pixel_values_videos": torch.randn(2, 4, 3, 32, 32)}

    class _Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = VJEPA2Model(cfg)

        def forward(self, pixel_values_videos: Any) -> Any:
            out = self.model(pixel_values_videos=pixel_values_videos, skip_predictor=True)
            return out.last_hidden_state

    return _finish(_Encoder(), inputs, {"pixel_values_videos": BATCH})


# GPT-NeoX-Japanese: Q@K^T as baddbmm(zeros, q, k) on the flattened heads, P@V on [B, H, S, T]
gpt_neox_japanese = _decoder_family("gpt_neox_japanese", "GPTNeoXJapanese")
granite_swa = _decoder_family(  # sinks as P@V * sigmoid(lse - sinks); a window of 8 in layer 0
    "granite_swa",
    "GraniteSWA",
    sliding_window=8,
    layer_types=["sliding_attention", "full_attention"],
    attention_multiplier=0.3,
)
# Families new in transformers 5 (2026), each fused as it came (tiny MoE: 4 experts, top 2)
gemma4_text = _decoder_family(  # per-layer input embeddings, sliding and full layers
    "gemma4_text",
    "Gemma4Text",
    vocab_size_per_layer_input=1000,
    hidden_size_per_layer_input=16,
    head_dim=16,
    per_layer_config={},
    sliding_window=8,
)
embedding_gemma2_text = _decoder_family("embedding_gemma2_text", "EmbeddingGemma2Text")
jais2 = _decoder_family("jais2", "Jais2")
MOE_4 = {"moe_intermediate_size": 32, "head_dim": 16, **TINY_MOE}
minicpm5_moe = _decoder_family("minicpm5_moe", "MiniCPM5Moe", n_routed_experts=4, **MOE_4)
solar_open = _decoder_family("solar_open", "SolarOpen", n_routed_experts=4, **MOE_4)
hy_v3 = _decoder_family("hy_v3", "HYV3", num_experts=4, **MOE_4)
mellum = _decoder_family("mellum", "Mellum", num_local_experts=4, **MOE_4)
afmoe = _decoder_family(
    "afmoe",
    "Afmoe",
    num_experts=4,
    sliding_window=8,
    layer_types=["sliding_attention", "full_attention"],
    **MOE_4,
)
cohere2_moe = _decoder_family("cohere2_moe", "Cohere2Moe", num_experts=4, **MOE_4)
minimax_m2 = _decoder_family("minimax_m2", "MiniMaxM2", num_local_experts=4, **MOE_4)
granitemoe_swa = _decoder_family(  # Granite-SWA's sinks with experts
    "granitemoe_swa", "GraniteMoeSWA", num_local_experts=4, **TINY_MOE
)
laguna = _decoder_family(  # a gate of the merged heads, a partial rotary in its sliding layer
    "laguna",
    "Laguna",
    num_experts=4,
    shared_expert_intermediate_size=32,
    layer_types=["full_attention", "sliding_attention"],
    sliding_window=8,
    **MOE_4,
)
# Sizes worth timing the new forms at (not in the sweep's families), e.g.
# ``onnxopt export benchmarks.arch_sweep:lfm2_medium -o lm.onnx --exporter torchscript``.
lfm2_medium = _decoder_family(  # LFM2-350M's widths, 6 of its 16 layers (4 short-conv, 2 attention)
    "lfm2_medium",
    "Lfm2",
    hidden_size=1024,
    intermediate_size=4608,
    num_attention_heads=16,
    num_key_value_heads=8,
    num_hidden_layers=6,
    layer_types=["conv", "conv", "full_attention", "conv", "conv", "full_attention"],
    max_position_embeddings=2048,
    pad_token_id=0,
)
gpt_neox_japanese_medium = _decoder_family(  # 4 layers of 768, 12 heads of 64
    "gpt_neox_japanese_medium",
    "GPTNeoXJapanese",
    hidden_size=768,
    intermediate_multiple_size=4,
    num_attention_heads=12,
    num_hidden_layers=4,
    max_position_embeddings=2048,
)
granite_swa_medium = _decoder_family(  # 4 x 768, 12/4 heads of 64, a 64-token window in 0 and 2
    "granite_swa_medium",
    "GraniteSWA",
    hidden_size=768,
    intermediate_size=2048,
    num_attention_heads=12,
    num_key_value_heads=4,
    num_hidden_layers=4,
    layer_types=["sliding_attention", "full_attention"] * 2,
    sliding_window=64,
    attention_multiplier=0.125,
    max_position_embeddings=2048,
)
lfm3 = _decoder_family(  # a short-conv layer, then sliding and full attention, heads gated
    "lfm3",
    "Lfm3",
    pad_token_id=0,
    head_dim=16,
    num_hidden_layers=3,
    layer_types=["conv", "sliding_attention", "full_attention"],
    sliding_window=8,
)
hrm_text = _decoder_family(  # two stacks cycled (H, L), every element of the heads gated
    "hrm_text", "HrmText", num_layers_per_stack=1, H_cycles=1, L_cycles=1, L_bp_cycles=[1]
)
mimo_v2_flash = _decoder_family(  # K heads of 24, V heads of 16; layer 1: sinks and a window
    "mimo_v2_flash",
    "MiMoV2Flash",
    n_routed_experts=4,
    moe_intermediate_size=32,
    head_dim=24,
    v_head_dim=16,
    sliding_window=8,
    **TINY_MOE,
)

# ------------------------------------------------------------------ speech synthesis, codecs,
# Fourier mixing, hashing attention, time series: graphs unlike an encoder's (random draws,
# transposed and strided 1-D convolutions, DFTs, sorting by hash buckets).


def _named(
    model: Any, inputs: dict[str, Any], outputs: tuple[str, ...], dynamic: dict[str, dict[int, str]]
) -> Factory:
    from onnxopt.zoo.transformers_models import _Outputs

    return _finish(_Outputs(model, tuple(inputs), outputs), inputs, dynamic)


@seeded
def vits() -> Factory:
    """MMS-TTS / Piper's graph: RandomNormalLike noise in the duration predictor and the prior
    (validated on the original's draws), a HiFi-GAN decoder."""
    from transformers import VitsConfig, VitsModel

    from onnxopt.zoo.transformers_models import _tokens

    cfg = VitsConfig(
        vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, ffn_dim=64,
        flow_size=16, spectrogram_bins=33, upsample_initial_channel=32, upsample_rates=[4, 4],
        upsample_kernel_sizes=[8, 8], resblock_kernel_sizes=[3, 5],
        resblock_dilation_sizes=[[1, 3], [1, 3]], prior_encoder_num_flows=2,
        prior_encoder_num_wavenet_layers=2, duration_predictor_num_flows=2,
        duration_predictor_filter_channels=32, posterior_encoder_num_wavenet_layers=2,
        window_size=4,
    )  # fmt: skip
    inputs = _tokens(40)
    inputs["attention_mask"][:] = 1  # a padded row would synthesize its padding
    return _named(VitsModel(cfg), inputs, ("waveform",), dict.fromkeys(inputs, TOKENS))


@seeded
def fastspeech2_conformer() -> Factory:
    from transformers import FastSpeech2ConformerConfig, FastSpeech2ConformerModel

    from onnxopt.zoo.transformers_models import _tokens

    cfg = FastSpeech2ConformerConfig(
        hidden_size=32, vocab_size=30, num_mel_bins=20, encoder_layers=2, decoder_layers=2,
        encoder_num_attention_heads=2, decoder_num_attention_heads=2, encoder_linear_units=64,
        decoder_linear_units=64, speech_decoder_postnet_layers=2,
        speech_decoder_postnet_units=32, duration_predictor_channels=32,
        pitch_predictor_channels=32, energy_predictor_channels=32,
    )  # fmt: skip
    inputs = {"input_ids": _tokens(30)["input_ids"][:1]}
    return _named(
        FastSpeech2ConformerModel(cfg), inputs, ("spectrogram",), {"input_ids": {1: "sequence"}}
    )


@seeded
def speecht5_hifigan() -> Factory:
    import torch
    from transformers import SpeechT5HifiGan, SpeechT5HifiGanConfig

    cfg = SpeechT5HifiGanConfig(
        model_in_dim=16, upsample_initial_channel=32, upsample_rates=[4, 4],
        upsample_kernel_sizes=[8, 8], resblock_kernel_sizes=[3, 7],
        resblock_dilation_sizes=[[1, 3], [1, 3]],
    )  # fmt: skip

    class Vocoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = SpeechT5HifiGan(cfg)

        def forward(self, spectrogram: torch.Tensor) -> torch.Tensor:
            return self.model(spectrogram)

    inputs = {"spectrogram": torch.randn(2, 20, 16)}
    return _finish(Vocoder(), inputs, {"spectrogram": {0: "batch", 1: "frames"}})


@seeded
def dac() -> Factory:
    """Descript's audio codec: Snake activations, strided 1-D Convs, residual vector quantizers."""
    import torch
    from transformers import DacConfig, DacModel

    cfg = DacConfig(
        encoder_hidden_size=8, downsampling_ratios=[2, 4], decoder_hidden_size=32, n_codebooks=2,
        codebook_size=32, codebook_dim=4, hidden_size=16, sampling_rate=8000,
    )  # fmt: skip
    inputs = {"input_values": torch.randn(2, 1, 800)}
    return _named(
        DacModel(cfg), inputs, ("audio_values",), {"input_values": {0: "batch", 2: "samples"}}
    )


@seeded
def fnet() -> Factory:
    """Token mixing by a 2-D Fourier transform (torch.fft.fftn) instead of attention."""
    from transformers import FNetConfig, FNetModel

    from onnxopt.zoo.transformers_models import _tokens

    cfg = FNetConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        use_tpu_fourier_optimizations=False,
    )  # fmt: skip
    inputs = {"input_ids": _tokens(1000)["input_ids"]}
    return _named(FNetModel(cfg), inputs, ("last_hidden_state",), {"input_ids": TOKENS})


@seeded
def patchtst() -> Factory:
    import torch
    from transformers import PatchTSTConfig, PatchTSTModel

    cfg = PatchTSTConfig(
        num_input_channels=3, context_length=32, patch_length=8, patch_stride=8, d_model=32,
        num_attention_heads=2, num_hidden_layers=2, ffn_dim=64,
    )  # fmt: skip
    inputs = {"past_values": torch.randn(2, 32, 3)}
    return _named(PatchTSTModel(cfg), inputs, ("last_hidden_state",), {"past_values": {0: "batch"}})


# ---------------------------------------------------------------------------- 2026-12-07 additions


@seeded
def longformer() -> Factory:
    from transformers import LongformerConfig, LongformerModel

    cfg = LongformerConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        attention_window=[8, 8],
        max_position_embeddings=130,
    )
    return _text(LongformerModel, cfg)


@seeded
def perceiver() -> Factory:
    import torch
    from transformers import PerceiverConfig, PerceiverModel

    cfg = PerceiverConfig(
        num_latents=8,
        d_latents=32,
        d_model=16,
        num_blocks=1,
        num_self_attends_per_block=2,
        num_self_attention_heads=2,
        num_cross_attention_heads=2,
        qk_channels=None,
        v_channels=None,
    )
    inputs = {"inputs": torch.randn(2, 12, 16)}
    return _named(PerceiverModel(cfg), inputs, ("last_hidden_state",), {"inputs": TOKENS})


@seeded
def canine() -> Factory:
    from transformers import CanineConfig, CanineModel

    cfg = CanineConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_hash_buckets=64,
        local_transformer_stride=4,
        downsampling_rate=4,
    )
    return _text(CanineModel, cfg)


@seeded
def tapas() -> Factory:
    import torch
    from transformers import TapasConfig, TapasModel

    from onnxopt.zoo.transformers_models import _tokens

    cfg = TapasConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
    )
    inputs = _tokens(1000)
    inputs["token_type_ids"] = torch.zeros(2, 16, 7, dtype=torch.int64)
    inputs["token_type_ids"][:, :, 1] = torch.arange(16) % 3
    return _named(TapasModel(cfg), inputs, ("last_hidden_state",), dict.fromkeys(inputs, TOKENS))


@seeded
def lilt() -> Factory:
    import torch
    from transformers import LiltConfig, LiltModel

    from onnxopt.zoo.transformers_models import _tokens

    cfg = LiltConfig(
        vocab_size=1000,
        hidden_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        channel_shrink_ratio=2,
    )
    inputs = _tokens(1000)
    b = torch.randint(0, 500, (2, 16, 4))
    b[..., 2:] += 400
    inputs["bbox"] = b
    return _named(LiltModel(cfg), inputs, ("last_hidden_state",), dict.fromkeys(inputs, TOKENS))


@seeded
def bros() -> Factory:
    import torch
    from transformers import BrosConfig, BrosModel

    from onnxopt.zoo.transformers_models import _tokens

    cfg = BrosConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
    )
    inputs = _tokens(1000)
    inputs["bbox"] = torch.rand(2, 16, 8)
    return _named(BrosModel(cfg), inputs, ("last_hidden_state",), dict.fromkeys(inputs, TOKENS))


@seeded
def encodec() -> Factory:
    import torch
    from transformers import EncodecConfig, EncodecModel

    cfg = EncodecConfig(
        hidden_size=16,
        num_filters=4,
        upsampling_ratios=[4, 2],
        codebook_size=32,
        num_lstm_layers=2,
        target_bandwidths=[10.0],
        sampling_rate=8000,
    )
    inputs = {"input_values": torch.randn(2, 1, 800)}
    return _named(
        EncodecModel(cfg), inputs, ("audio_values",), {"input_values": {0: "batch", 2: "samples"}}
    )


@seeded
def speech2text() -> Factory:
    import torch
    from transformers import Speech2TextConfig, Speech2TextModel

    cfg = Speech2TextConfig(
        vocab_size=100,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        input_feat_per_channel=16,
        conv_channels=32,
        max_source_positions=200,
    )
    inputs = {
        "input_features": torch.randn(2, 40, 16),
        "decoder_input_ids": torch.randint(0, 100, (2, 6)),
    }
    return _named(
        Speech2TextModel(cfg),
        inputs,
        ("last_hidden_state",),
        {
            "input_features": {0: "batch", 1: "frames"},
            "decoder_input_ids": {0: "batch", 1: "decoder_sequence"},
        },
    )


@seeded
def autoformer() -> Factory:
    import torch
    from transformers import AutoformerConfig, AutoformerModel

    cfg = AutoformerConfig(
        prediction_length=4,
        context_length=8,
        lags_sequence=[1, 2],
        num_time_features=1,
        d_model=16,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        label_length=4,
    )
    L = 8 + 2
    inputs = {
        "past_values": torch.randn(2, L),
        "past_time_features": torch.randn(2, L, 1),
        "past_observed_mask": torch.ones(2, L),
        "future_values": torch.randn(2, 4),
        "future_time_features": torch.randn(2, 4, 1),
    }
    return _named(
        AutoformerModel(cfg), inputs, ("last_hidden_state",), {k: {0: "batch"} for k in inputs}
    )


@seeded
def rwkv() -> Factory:
    from transformers import RwkvConfig, RwkvModel

    cfg = RwkvConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        attention_hidden_size=64,
        intermediate_size=128,
        context_length=64,
        use_cache=False,
    )
    return _decoder(RwkvModel, cfg)


@seeded
def xlstm() -> Factory:
    from transformers import xLSTMConfig, xLSTMModel

    cfg = xLSTMConfig(
        vocab_size=1000,
        hidden_size=64,
        embedding_dim=64,
        num_hidden_layers=2,
        num_heads=4,
        use_cache=False,
        mode="train",
        chunkwise_kernel="chunkwise--native_autograd",
        sequence_kernel="native_sequence__native",
        step_kernel="native",
        chunk_size=8,
    )
    return _decoder(xLSTMModel, cfg)


@seeded
def recurrent_gemma() -> Factory:
    from transformers import RecurrentGemmaConfig, RecurrentGemmaModel

    cfg = RecurrentGemmaConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        intermediate_size=128,
        lru_width=64,
        attention_window_size=16,
        head_dim=16,
        use_cache=False,
    )
    return _decoder(RecurrentGemmaModel, cfg)


@seeded
def zamba2() -> Factory:
    from transformers import Zamba2Config, Zamba2Model

    cfg = Zamba2Config(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=128,
        mamba_d_state=8,
        mamba_headdim=16,
        mamba_ngroups=1,
        n_mamba_heads=8,
        layers_block_type=["mamba", "hybrid"],
        hybrid_layer_ids=[1],
        use_cache=False,
        use_mem_rope=True,
    )
    return _decoder(Zamba2Model, cfg)


@seeded
def falcon_mamba() -> Factory:
    from transformers import FalconMambaConfig, FalconMambaModel

    cfg = FalconMambaConfig(
        vocab_size=1000,
        hidden_size=64,
        state_size=8,
        num_hidden_layers=2,
        use_cache=False,
        use_falcon_mambapy=False,
    )
    return _decoder(FalconMambaModel, cfg)


@seeded
def bamba() -> Factory:
    from transformers import BambaConfig, BambaModel

    cfg = BambaConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        attn_layer_indices=[1],
        mamba_d_state=8,
        mamba_d_head=16,
        mamba_n_heads=8,
        mamba_n_groups=1,
        mamba_chunk_size=8,
        use_cache=False,
    )
    return _decoder(BambaModel, cfg)


@seeded
def falcon_h1() -> Factory:
    from transformers import FalconH1Config, FalconH1Model

    cfg = FalconH1Config(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        mamba_d_state=8,
        mamba_d_head=16,
        mamba_n_heads=8,
        mamba_n_groups=1,
        mamba_chunk_size=8,
        mamba_d_ssm=128,
        use_cache=False,
    )
    return _decoder(FalconH1Model, cfg)


@seeded
def glpn() -> Factory:
    from transformers import GLPNConfig, GLPNForDepthEstimation

    cfg = GLPNConfig(
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
        decoder_hidden_size=16,
    )
    return _pixels(GLPNForDepthEstimation, cfg, 64, ("predicted_depth",))


@seeded
def mgp_str() -> Factory:
    from transformers import MgpstrConfig, MgpstrForSceneTextRecognition

    cfg = MgpstrConfig(
        image_size=[32, 64],
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_token_length=10,
        num_character_labels=20,
        num_bpe_labels=30,
        num_wordpiece_labels=30,
    )
    import torch

    from onnxopt.zoo.transformers_models import _Outputs

    inputs = {"pixel_values": torch.randn(2, 3, 32, 64)}
    return _finish(
        _Outputs(MgpstrForSceneTextRecognition(cfg), ("pixel_values",), ("logits",)),
        inputs,
        {"pixel_values": BATCH},
    )


@seeded
def vit_mae() -> Factory:
    from transformers import ViTMAEConfig, ViTMAEModel

    cfg = ViTMAEConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=32,
        patch_size=8,
        mask_ratio=0.75,
    )
    return _pixels(ViTMAEModel, cfg, 32)


@seeded
def swiftformer() -> Factory:
    from transformers import SwiftFormerConfig, SwiftFormerModel

    cfg = SwiftFormerConfig(depths=[1, 1, 1, 1], embed_dims=[16, 24, 32, 48])
    return _pixels(SwiftFormerModel, cfg, 64)


@seeded
def bit() -> Factory:
    from transformers import BitConfig, BitModel

    cfg = BitConfig(
        embedding_size=32,
        hidden_sizes=[32, 64, 96, 128],
        num_groups=8,
        depths=[1, 1, 1, 1],
        layer_type="preactivation",
        global_padding="SAME",
    )
    return _pixels(BitModel, cfg, 64)


@seeded
def mobilenet_v1() -> Factory:
    from transformers import MobileNetV1Config, MobileNetV1Model

    cfg = MobileNetV1Config(depth_multiplier=0.25, image_size=64)
    return _pixels(MobileNetV1Model, cfg, 64)


@seeded
def upernet() -> Factory:
    from transformers import ConvNextConfig, UperNetConfig, UperNetForSemanticSegmentation

    bb = ConvNextConfig(
        hidden_sizes=[16, 32, 48, 64],
        depths=[1, 1, 1, 1],
        out_features=["stage1", "stage2", "stage3", "stage4"],
    )
    cfg = UperNetConfig(
        backbone_config=bb,
        hidden_size=32,
        auxiliary_channels=16,
        num_labels=5,
        use_auxiliary_head=False,
    )
    return _pixels(UperNetForSemanticSegmentation, cfg, 64, ("logits",))


@seeded
def groupvit() -> Factory:
    from transformers import GroupViTVisionConfig, GroupViTVisionModel

    cfg = GroupViTVisionConfig(
        hidden_size=64,
        intermediate_size=128,
        depths=[2, 2],
        num_group_tokens=[8, 0],
        num_output_groups=[8, 8],
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
    )
    return _pixels(GroupViTVisionModel, cfg, 32, ("last_hidden_state",))


@seeded
def owlvit_vision() -> Factory:
    from transformers import OwlViTVisionConfig, OwlViTVisionModel

    cfg = OwlViTVisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
    )
    return _pixels(OwlViTVisionModel, cfg, 32)


@seeded
def vitpose() -> Factory:
    import torch
    from transformers import VitPoseBackboneConfig, VitPoseConfig, VitPoseForPoseEstimation

    bb = VitPoseBackboneConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=[64, 48],
        patch_size=[8, 8],
        out_indices=[2],
    )
    cfg = VitPoseConfig(backbone_config=bb, num_labels=5)
    from onnxopt.zoo.transformers_models import _Outputs

    inputs = {"pixel_values": torch.randn(2, 3, 64, 48)}
    return _finish(
        _Outputs(VitPoseForPoseEstimation(cfg), ("pixel_values",), ("heatmaps",)),
        inputs,
        {"pixel_values": BATCH},
    )


@seeded
def textnet() -> Factory:
    from transformers import TextNetConfig, TextNetModel

    cfg = TextNetConfig()
    return _pixels(TextNetModel, cfg, 64)


@seeded
def pix2struct_vision() -> Factory:
    import torch
    from transformers import Pix2StructVisionConfig, Pix2StructVisionModel

    cfg = Pix2StructVisionConfig(
        hidden_size=32,
        patch_embed_hidden_size=48,
        d_ff=64,
        d_kv=16,
        num_hidden_layers=2,
        num_attention_heads=2,
    )
    fp = torch.randn(2, 20, 2 + 48)
    fp[:, :, 0] = torch.arange(20) // 5 + 1
    fp[:, :, 1] = torch.arange(20) % 5 + 1
    inputs = {"flattened_patches": fp, "attention_mask": torch.ones(2, 20)}
    inputs["attention_mask"][1, 16:] = 0
    return _named(
        Pix2StructVisionModel(cfg), inputs, ("last_hidden_state",), dict.fromkeys(inputs, TOKENS)
    )


@seeded
def longt5() -> Factory:
    from transformers import LongT5Config, LongT5Model

    cfg = LongT5Config(
        vocab_size=1000,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        local_radius=4,
        encoder_attention_type="transient-global",
        global_block_size=4,
    )
    return _seq2seq(LongT5Model, cfg)


@seeded
def switch_transformers() -> Factory:
    from transformers import SwitchTransformersConfig, SwitchTransformersModel

    cfg = SwitchTransformersConfig(
        vocab_size=1000,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        num_experts=4,
        encoder_sparse_step=2,
        decoder_sparse_step=2,
        expert_capacity=8,
    )
    return _seq2seq(SwitchTransformersModel, cfg)


@seeded
def prophetnet() -> Factory:
    from transformers import ProphetNetConfig, ProphetNetModel

    cfg = ProphetNetConfig(
        vocab_size=1000,
        hidden_size=64,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        num_encoder_layers=2,
        num_decoder_layers=2,
        num_encoder_attention_heads=4,
        num_decoder_attention_heads=4,
        ngram=2,
        num_buckets=8,
        relative_max_distance=16,
    )
    return _seq2seq(ProphetNetModel, cfg)


@seeded
def led() -> Factory:
    from transformers import LEDConfig, LEDModel

    cfg = LEDConfig(
        vocab_size=1000,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        attention_window=[8, 8],
        max_encoder_position_embeddings=128,
        max_decoder_position_embeddings=128,
    )
    return _seq2seq(LEDModel, cfg)


@seeded
def fsmt() -> Factory:
    from transformers import FSMTConfig, FSMTModel

    cfg = FSMTConfig(
        langs=["en", "de"],
        src_vocab_size=1000,
        tgt_vocab_size=1000,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
    )
    return _seq2seq(FSMTModel, cfg)


@seeded
def hgnet_v2() -> Factory:
    from transformers import HGNetV2Backbone, HGNetV2Config

    cfg = HGNetV2Config(
        stem_channels=[3, 8, 16],
        stage_in_channels=[16, 16, 32, 48],
        stage_mid_channels=[8, 16, 24, 32],
        stage_out_channels=[16, 32, 48, 64],
        stage_num_blocks=[1, 1, 1, 1],
        stage_numb_of_layers=[2, 2, 2, 2],
        out_features=["stage4"],
    )
    return _pixels(HGNetV2Backbone, cfg, 64, ("feature_maps",))


@seeded
def imagegpt() -> Factory:
    from transformers import ImageGPTConfig, ImageGPTModel

    cfg = ImageGPTConfig(vocab_size=513, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    return _decoder(ImageGPTModel, cfg)


@seeded
def decision_transformer() -> Factory:
    import torch
    from transformers import DecisionTransformerConfig, DecisionTransformerModel

    cfg = DecisionTransformerConfig(
        state_dim=5, act_dim=3, hidden_size=32, n_layer=2, n_head=2, max_ep_len=100
    )
    T = 6
    inputs = {
        "states": torch.randn(2, T, 5),
        "actions": torch.randn(2, T, 3),
        "rewards": torch.randn(2, T, 1),
        "returns_to_go": torch.randn(2, T, 1),
        "timesteps": torch.randint(0, 100, (2, T)),
        "attention_mask": torch.ones(2, T, dtype=torch.int64),
    }
    return _named(
        DecisionTransformerModel(cfg),
        inputs,
        ("last_hidden_state",),
        {k: {0: "batch", 1: "steps"} for k in inputs},
    )


@seeded
def wav2vec2_bert() -> Factory:
    import torch
    from transformers import Wav2Vec2BertConfig, Wav2Vec2BertModel

    cfg = Wav2Vec2BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        feature_projection_input_dim=16,
        conv_depthwise_kernel_size=5,
        output_hidden_size=32,
        add_adapter=False,
    )
    inputs = {
        "input_features": torch.randn(2, 20, 16),
        "attention_mask": torch.ones(2, 20, dtype=torch.int64),
    }
    inputs["attention_mask"][1, 16:] = 0
    return _named(
        Wav2Vec2BertModel(cfg), inputs, ("last_hidden_state",), dict.fromkeys(inputs, TOKENS)
    )


@seeded
def sew_d() -> Factory:
    import torch
    from transformers import SEWDConfig, SEWDModel

    cfg = SEWDConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16, 16),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        squeeze_factor=2,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        position_buckets=16,
        max_position_embeddings=64,
    )
    inputs = {"input_values": torch.randn(2, 800)}
    return _named(
        SEWDModel(cfg), inputs, ("last_hidden_state",), {"input_values": {0: "batch", 1: "samples"}}
    )


@seeded
def t5gemma() -> Factory:
    from transformers import T5GemmaConfig, T5GemmaModel, T5GemmaModuleConfig

    mc = dict(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
    )
    cfg = T5GemmaConfig(
        encoder=T5GemmaModuleConfig(**mc),
        decoder=T5GemmaModuleConfig(**mc),
        vocab_size=1000,
        use_cache=False,
    )
    cfg._attn_implementation = "eager"
    return _seq2seq(T5GemmaModel, cfg)


@seeded
def gemma3n_text() -> Factory:
    from transformers import Gemma3nTextConfig, Gemma3nTextModel

    cfg = Gemma3nTextConfig(
        vocab_size=1000,
        vocab_size_per_layer_input=1000,
        hidden_size=64,
        hidden_size_per_layer_input=16,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        laurel_rank=8,
        altup_num_inputs=2,
        num_kv_shared_layers=2,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 2,
        activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0],
        use_cache=False,
    )
    return _decoder(Gemma3nTextModel, cfg)


@seeded
def musicgen_decoder() -> Factory:
    import torch
    from transformers import MusicgenDecoderConfig, MusicgenForCausalLM

    cfg = MusicgenDecoderConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        ffn_dim=64,
        num_codebooks=2,
        use_cache=False,
    )
    inputs = {"input_ids": torch.randint(0, 64, (4, 8))}
    return _named(MusicgenForCausalLM(cfg), inputs, ("logits",), {"input_ids": {1: "sequence"}})


# Families added at the 39th stop: more of transformers' encoders, decoders, seq2seq, vision and
# audio models (all validate; DINOv3-ConvNeXt's dynamo export views its pooled channels-last map
# through an as_strided Gather).
camembert = _encoder_family("camembert", "Camembert")
data2vec_text = _encoder_family("data2vec_text", "Data2VecText")
roc_bert = _encoder_family("roc_bert", "RoCBert", pronunciation_vocab_size=50, shape_vocab_size=50)
splinter = _encoder_family("splinter", "Splinter")
nystromformer = _encoder_family(  # Nystrom-approximated attention: landmarks, a pseudo-inverse
    "nystromformer", "Nystromformer", num_landmarks=8, segment_means_seq_len=8
)
mra = _encoder_family("mra", "Mra")  # multi-resolution attention
yoso = _encoder_family("yoso", "Yoso")  # LSH-sampled attention
roberta_prelayernorm = _encoder_family("roberta_prelayernorm", "RobertaPreLayerNorm")
markuplm = _encoder_family("markuplm", "MarkupLM")  # 2 x 50 XPath-depth embeddings
hyperclovax = _decoder_family("hyperclovax", "HyperCLOVAX")
plbart = _seq2seq_family("plbart", "PLBart")
mvp = _seq2seq_family("mvp", "Mvp")
blenderbot_small = _seq2seq_family("blenderbot_small", "BlenderbotSmall")
vit_msn = _vision_family(
    "vit_msn",
    "ViTMSN",
    attention=True,
    **SMALL,
    intermediate_size=128,
    image_size=64,
    patch_size=16,
)
dinov3_convnext = _vision_family(
    "dinov3_convnext", "DINOv3ConvNext", hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]
)
unispeech_sat = _audio_family("unispeech_sat", "UniSpeechSat")

FAMILIES: dict[str, Callable[[], Factory]] = {
    f.__name__.replace("_", "-"): f
    for f in (
        roberta,
        xlm_roberta,
        albert,
        electra,
        deberta_v2,
        deberta_v3,
        mpnet,
        mobilebert,
        clip_text,
        bart_encoder,
        bart,
        t5_encoder,
        t5,
        gpt_neo,
        opt,
        mistral,
        qwen2,
        gemma,
        phi,
        stablelm,
        gpt_neox,
        qwen3,
        phi3,
        gemma2,
        gemma3,
        olmo2,
        cohere,
        gptj,
        codegen,
        modernbert,
        falcon,
        bloom,
        clip_vision,
        deit,
        beit,
        swin,
        segformer,
        mobilevit,
        convnext_v2,
        hf_resnet,
        efficientnet,
        regnet,
        wav2vec2,
        hubert,
        mixtral,
        qwen2_moe,
        gpt_bigcode,
        mpt,
        mamba,
        granite,
        starcoder2,
        nemotron,
        persimmon,
        deepseek_v3,
        gpt_oss,
        xglm,
        biogpt,
        xlnet,
        squeezebert,
        funnel,
        roformer,
        convbert,
        esm,
        marian,
        whisper,
        dinov2,
        swinv2,
        pvt_v2,
        data2vec_audio,
        sew,
        megatron_bert,
        rembert,
        ibert,
        flaubert,
        xlm,
        luke,
        ernie,
        deberta,
        xlm_roberta_xl,
        big_bird,
        olmo,
        glm,
        glm4,
        helium,
        exaone4,
        smollm3,
        cohere2,
        openai_gpt,
        ctrl,
        apertus,
        lfm2,
        seed_oss,
        ernie4_5,
        diffllama,
        pegasus,
        mbart,
        m2m100,
        blenderbot,
        umt5,
        levit,
        poolformer,
        mobilenet_v2_hf,
        mobilevit_v2,
        yolos,
        dpt,
        dinov2_registers,
        hiera,
        focalnet,
        siglip_vision,
        siglip_text,
        convnext,
        ijepa,
        wavlm,
        unispeech,
        w2v2_conformer,
        w2v2_conformer_rel,
        ast,
        detr,
        rt_detr,
        depth_anything,
        sam_vision,
        sam2_vision,
        sam2,
        layoutlm,
        qwen3_moe,
        olmoe,
        mamba2,
        llama4_text,
        vitdet,
        cvt,
        data2vec_vision,
        swin2sr,
        moonshine,
        olmo3,
        vaultgemma,
        bitnet,
        doge,
        dinov3,
        blip_vision,
        pixtral_vision,
        aimv2_vision,
        videomae,
        arcee,
        hunyuan_dense,
        glm4_moe,
        dots1,
        jetmoe,
        nomic_bert,
        gte,
        jina_embeddings_v3,
        eurobert,
        minicpm3,
        ministral3,
        nanochat,
        cwm,
        modernbert_decoder,
        mlcd_vision,
        timesformer,
        vivit,
        parakeet_encoder,
        phimoe,
        granitemoe,
        flex_olmo,
        hunyuan_moe,
        ernie4_5_moe,
        exaone_moe,
        glm4_moe_lite,
        vjepa2,
        gpt_neox_japanese,
        granite_swa,
        mimo_v2_flash,
        lfm3,
        hrm_text,
        gemma4_text,
        embedding_gemma2_text,
        jais2,
        minicpm5_moe,
        solar_open,
        hy_v3,
        mellum,
        afmoe,
        laguna,
        cohere2_moe,
        minimax_m2,
        granitemoe_swa,
        metaclip_2_vision,
        tipsv2_vision,
        pixio,
        sapiens2,
        radio,
        siglip2_vision,
        vits,
        fastspeech2_conformer,
        speecht5_hifigan,
        dac,
        fnet,
        patchtst,
        longformer,
        perceiver,
        canine,
        tapas,
        lilt,
        bros,
        encodec,
        speech2text,
        autoformer,
        rwkv,
        xlstm,
        recurrent_gemma,
        zamba2,
        falcon_mamba,
        bamba,
        falcon_h1,
        glpn,
        mgp_str,
        vit_mae,
        swiftformer,
        bit,
        mobilenet_v1,
        upernet,
        groupvit,
        owlvit_vision,
        vitpose,
        textnet,
        pix2struct_vision,
        longt5,
        switch_transformers,
        prophetnet,
        led,
        fsmt,
        hgnet_v2,
        imagegpt,
        decision_transformer,
        wav2vec2_bert,
        sew_d,
        t5gemma,
        gemma3n_text,
        musicgen_decoder,
        camembert,
        data2vec_text,
        roc_bert,
        splinter,
        nystromformer,
        mra,
        yoso,
        roberta_prelayernorm,
        markuplm,
        hyperclovax,
        plbart,
        mvp,
        blenderbot_small,
        vit_msn,
        dinov3_convnext,
        unispeech_sat,
    )
}


@dataclass
class Row:
    family: str
    exporter: str
    status: str = ""
    nodes_before: int | None = None
    nodes_after: int | None = None
    fused: str = ""
    validated: str = ""
    eager_diff: str = ""
    fixed_point: str = ""
    seconds: float = 0.0
    notes: list[str] | None = None

    def markdown(self) -> str:
        nodes = f"{self.nodes_before} → {self.nodes_after}" if self.nodes_before is not None else ""
        return (
            f"| {self.family} | {self.exporter} | {self.status} | {nodes} | {self.fused} "
            f"| {self.validated} | {self.eager_diff} | {self.fixed_point} | {self.seconds:.0f} |"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:160] if text else ''}"


def sweep_one(
    family: str,
    exporter: str,
    out: Path,
    explain: bool,
    target: str = "ort",
    opset: int | None = None,
    *,
    export_to: Callable[[Path], None] | None = None,
    inputs_for: Callable[[Any], list[dict[str, Any]]] | None = None,
    stem: str | None = None,
    enable: tuple[str, ...] = (),
    export_opset: int | None = None,
) -> Row:
    """Export (at ``export_opset``, default the exporter's), optimize with validation,
    re-optimize; ``export_to(path)`` replaces the family's factory export, ``inputs_for(original
    ir.Model)`` the validation inputs (kv_sweep's cached decoder steps need consistent past/mask
    sizes)."""
    from onnxopt import api, io
    from onnxopt.export import export

    row = Row(family, exporter)
    start = time.perf_counter()
    path = out / f"{stem or family}.{exporter}.{ATTENTION['implementation']}.onnx"
    try:
        if export_to is not None:
            export_to(path)
        else:
            export(
                f"benchmarks.arch_sweep:{family.replace('-', '_')}",
                path,
                exporter=exporter,  # type: ignore[arg-type]
                opset=export_opset,
            )
    except Exception as exc:
        row.status = f"export failed: {_first_line(exc.__cause__ or exc)}"
        row.seconds = time.perf_counter() - start
        return row
    try:
        inputs = None if inputs_for is None else inputs_for(io.load_model(path).model)
        result = api.optimize(
            path,
            find_reference=True,
            explain=explain,
            target=target,  # type: ignore[arg-type]
            opset=opset,
            inputs=inputs,
            enable=enable,
        )
    except Exception as exc:
        row.status = f"optimize crashed: {_first_line(exc)}"
        row.notes = [traceback.format_exc()]
        row.seconds = time.perf_counter() - start
        return row
    report = result.report
    row.status = "ok"
    row.nodes_before, row.nodes_after = report.before.nodes, report.after.nodes
    graphs = (result.model.graph, *result.model.graph.subgraphs())  # a merged decoder's If branches
    counts = Counter(node.op_type for graph in graphs for node in graph)
    row.fused = " ".join(f"{label} {counts[op]}" for op, label in FUSED.items() if counts[op])
    validation = report.validation
    if validation is None:
        row.validated = "not run"
    elif validation.passed:
        row.validated = "yes"
    else:
        failing = validation.failing_outputs()
        row.validated = "FAILED " + "; ".join(validation.errors or ()) + " ".join(failing)
    ref = report.reference
    if ref is None and any("draws random numbers" in w for w in report.warnings):
        row.eager_diff = "- (random draws)"
    elif ref is None:
        row.eager_diff = "-"
    elif ref.errors:
        row.eager_diff = "ERROR " + "; ".join(ref.errors)[:120]
    else:
        worst = max((c.max_abs for c in ref.optimized), default=0.0)
        export_worst = max((c.max_abs for c in ref.export), default=0.0)
        mark = "" if ref.optimized_passed else " FAIL"
        if ref.optimized_passed and not ref.export_passed:
            mark = " (export also off)"
        row.eager_diff = f"{worst:.1e}{mark}" + (
            f" (export {export_worst:.1e})" if not ref.optimized_passed else ""
        )
    first = out / f"{path.stem}.opt.onnx"
    first_bytes = io.save_model(result.model, first).read_bytes()
    try:
        again = api.optimize(first, check=False, target=target, opset=opset, enable=enable)  # type: ignore[arg-type]
        again_bytes = io.save_model(again.model, out / f"{path.stem}.opt2.onnx").read_bytes()
        changed = [
            r.name
            for r in again.report.records
            if r.modified and r.name not in ("infer-shapes", "drop-shape-annotations")
        ]
        if again_bytes == first_bytes and not changed:
            row.fixed_point = "yes"
        else:
            row.fixed_point = (
                f"NO ({again.report.after.nodes} nodes; changed: "
                f"{', '.join(dict.fromkeys(changed)) or 'bytes'})"
            )
    except Exception as exc:
        row.fixed_point = f"re-optimize crashed: {_first_line(exc)}"
    if explain:
        row.notes = report.explain_notes(fusions=True)
    row.seconds = time.perf_counter() - start
    return row


def print_notes(rows: list[Row]) -> None:
    """Each row's --explain notes (or a crash's traceback) on stderr, after the table."""
    for row in rows:
        if row.notes:
            print(f"\n### {row.family} / {row.exporter}", file=sys.stderr)
            for note in row.notes:
                print(note, file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--families",
        default="",
        help="comma-separated subset (default: all): " + ", ".join(FAMILIES),
    )
    parser.add_argument("--exporters", default="dynamo,torchscript")
    parser.add_argument("--attention", default="eager", choices=("eager", "sdpa"))
    parser.add_argument(
        "--opset", type=int, default=None, help="raise the opset first (23: ONNX Attention)"
    )
    parser.add_argument(
        "--export-opset",
        type=int,
        default=None,
        help="export at this opset (Optimum's 4.x-era exports: 11-14; default: the exporter's)",
    )
    parser.add_argument("--out", type=Path, default=None, help="keep the exports here")
    parser.add_argument("--explain", action="store_true", help="print fusion --explain notes")
    parser.add_argument(
        "--target", default="ort", choices=("ort", "onnx"), help="optimize --target"
    )
    parser.add_argument(
        "--enable", default="", help="comma-separated opt-in passes (fuse-softcap-attention)"
    )
    args = parser.parse_args()
    ATTENTION["implementation"] = args.attention
    # export() imports the factories by name: let it find this module (and the setting above),
    # not a second copy of the file imported afresh with the default attention.
    sys.modules.setdefault("benchmarks.arch_sweep", sys.modules[__name__])
    families = [f.strip() for f in args.families.split(",") if f.strip()] or list(FAMILIES)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown families: {', '.join(unknown)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="arch_sweep_"))
    out.mkdir(parents=True, exist_ok=True)
    enable = tuple(name.strip() for name in args.enable.split(",") if name.strip())
    opset = f"; opset {args.opset}" if args.opset else ""
    opset += f"; --enable {','.join(enable)}" if enable else ""
    opset += f"; exported at opset {args.export_opset}" if args.export_opset else ""
    print(f"attention: {args.attention}; target: {args.target}{opset}; exports in {out}\n")
    print(
        "| family | exporter | status | nodes | fused (after) | validated | vs eager max abs "
        "| fixed point | s |"
    )
    print("|---|---|---|---:|---|---|---|---|---:|")
    rows = []
    for family in families:
        for exporter in args.exporters.split(","):
            row = sweep_one(
                family,
                exporter,
                out,
                args.explain,
                args.target,
                args.opset,
                enable=enable,
                export_opset=args.export_opset,
            )
            rows.append(row)
            print(row.markdown(), flush=True)
    print_notes(rows)


if __name__ == "__main__":
    main()
