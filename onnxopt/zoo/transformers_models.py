"""Transformer models from Hugging Face ``transformers``, built from config objects (no downloads).

Weights are seeded random (``transformers``' own initialisation). Each model is wrapped so that it
takes its inputs positionally and returns a plain tuple of tensors, which both ONNX exporters map
to named graph outputs. Full-size configs follow the published checkpoints; ``*_tiny`` variants
have 2 layers and a small hidden size for the tests.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from onnxopt.zoo._common import Factory, seeded

TOKENS = {0: "batch", 1: "sequence"}
BATCH = {0: "batch"}


class _Outputs(nn.Module):
    """Call a transformers model with named inputs and return the chosen outputs as a tuple."""

    def __init__(
        self, model: nn.Module, input_names: tuple[str, ...], output_names: tuple[str, ...]
    ) -> None:
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.output_names = output_names

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        result = self.model(**dict(zip(self.input_names, args, strict=True)), return_dict=True)
        return tuple(result[name] for name in self.output_names)


def _tokens(vocab: int, batch: int = 2, sequence: int = 16) -> dict[str, torch.Tensor]:
    input_ids = torch.randint(0, vocab, (batch, sequence))
    attention_mask = torch.ones(batch, sequence, dtype=torch.int64)
    attention_mask[1, sequence - 4 :] = 0  # one padded sequence, so the mask matters
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def _text_model(model: nn.Module, vocab: int, outputs: tuple[str, ...]) -> Factory:
    inputs = _tokens(vocab)
    wrapped = _Outputs(model, tuple(inputs), outputs)
    return wrapped, inputs, dict.fromkeys(inputs, TOKENS)


def _common(**config: Any) -> dict[str, Any]:
    # Eager attention: the exported graph has the explicit MatMul/Softmax pattern that fusions target,
    # and both exporters handle it the same way.
    return {"attn_implementation": "eager", **config}


def _bert(**config: Any) -> Factory:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(**_common(**config))
    return _text_model(BertModel(cfg), cfg.vocab_size, ("last_hidden_state", "pooler_output"))


@seeded
def bert() -> Factory:
    """BERT-base: 12 layers, hidden 768, 12 heads."""
    return _bert()


@seeded
def bert_tiny() -> Factory:
    return _bert(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=1000,
    )


def _distilbert(**config: Any) -> Factory:
    from transformers import DistilBertConfig, DistilBertModel

    cfg = DistilBertConfig(**_common(**config))
    return _text_model(DistilBertModel(cfg), cfg.vocab_size, ("last_hidden_state",))


@seeded
def distilbert() -> Factory:
    """DistilBERT-base: 6 layers, hidden 768."""
    return _distilbert()


@seeded
def distilbert_tiny() -> Factory:
    return _distilbert(n_layers=2, dim=64, n_heads=4, hidden_dim=128, vocab_size=1000)


def _gpt2(**config: Any) -> Factory:
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(**_common(use_cache=False, **config))
    return _text_model(GPT2Model(cfg), cfg.vocab_size, ("last_hidden_state",))


@seeded
def gpt2() -> Factory:
    """GPT-2 small: 12 layers, hidden 768, no KV cache."""
    return _gpt2()


@seeded
def gpt2_tiny() -> Factory:
    return _gpt2(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128)


def _llama(**config: Any) -> Factory:
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(**_common(use_cache=False, **config))
    return _text_model(LlamaModel(cfg), cfg.vocab_size, ("last_hidden_state",))


@seeded
def llama() -> Factory:
    """A LLaMA-style decoder at SmolLM-135M size: 30 layers, hidden 576, 9 query / 3 KV heads (GQA).

    RoPE, RMSNorm and SwiGLU as in LLaMA; a 7B config would not fit the RAM a CPU export needs.
    """
    return _llama(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    )


@seeded
def llama_tiny() -> Factory:
    return _llama(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )


def _vit(**config: Any) -> Factory:
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(**_common(**config))
    model = _Outputs(ViTModel(cfg), ("pixel_values",), ("last_hidden_state", "pooler_output"))
    size = cfg.image_size if isinstance(cfg.image_size, int) else int(cfg.image_size[0])
    inputs = {"pixel_values": torch.randn(2, cfg.num_channels, size, size)}
    return model, inputs, {"pixel_values": BATCH}


@seeded
def vit() -> Factory:
    """ViT-B/16 at 224x224: 12 layers, hidden 768, 12 heads, patch 16."""
    return _vit()


@seeded
def vit_tiny() -> Factory:
    return _vit(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=32,
        patch_size=8,
    )


def _whisper_encoder(**config: Any) -> Factory:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = WhisperConfig(**_common(**config))
    model = _Outputs(WhisperEncoder(cfg), ("input_features",), ("last_hidden_state",))
    frames = 2 * cfg.max_source_positions  # the encoder accepts exactly this many mel frames
    inputs = {"input_features": torch.randn(2, cfg.num_mel_bins, frames)}
    return model, inputs, {"input_features": BATCH}


@seeded
def whisper_encoder() -> Factory:
    """The whisper-tiny encoder: 4 layers, d_model 384, 6 heads, 80 mel bins x 3000 frames."""
    return _whisper_encoder(
        d_model=384,
        encoder_layers=4,
        encoder_attention_heads=6,
        encoder_ffn_dim=1536,
        num_mel_bins=80,
        max_source_positions=1500,
    )


@seeded
def whisper_encoder_tiny() -> Factory:
    return _whisper_encoder(
        d_model=64,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=128,
        num_mel_bins=16,
        max_source_positions=32,
    )
