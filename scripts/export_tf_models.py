"""Convert small TensorFlow (Keras) transformers to ONNX with tf2onnx, as Keras users do.

TensorFlow is not one of onnxopt's dependencies; run this in its own environment:

    python -m venv /tmp/tfenv
    /tmp/tfenv/bin/pip install tensorflow-cpu==2.17.1 tf-keras==2.17.0 tf2onnx==1.17.0 \\
        onnx==1.16.2 transformers==4.46.3 huggingface_hub==0.26.5 tokenizers==0.20.3 'keras==3.15.*'
    /tmp/tfenv/bin/pip install --no-deps keras-hub==0.21.1 && /tmp/tfenv/bin/pip install regex kagglehub
    /tmp/tfenv/bin/python scripts/export_tf_models.py OUT [name ...] [--opset 17] [--width 16] \\
        [--layers 2] [--heads 4]

Every model is built from a config with seeded random weights, then every variable is redrawn
(biases and LayerNorm shifts nonzero, LayerNorm scales around 1, as in a trained checkpoint; the
seed is the model's name), and converted with ``tf2onnx.convert.from_function`` with dynamic
batch and sequence dims, as tf2onnx names them (``unk__301``...). Besides transformers' TF classes
there is Keras' own transformer block (``layers.MultiHeadAttention``), converted from tf-keras
(``keras-encoder``, ``keras-causal``) and written by Keras 3's ``model.export(format="onnx")``
(``keras3-encoder``), and KerasHub's ``BertBackbone`` and ``GPT2Backbone`` (``kerashub-bert``,
``kerashub-gpt2``; named only, not in the default list). ``tests/data/tf2onnx/`` holds some of the default exports (width 16, 2
layers, 4 heads, FFN 2x, opset 17); the README's timings use ``--width 768 --layers 4 --heads 12``
(FFN 4x from width 256). Reruns give the same weights and graph; tf2onnx's generated names differ.
"""

from __future__ import annotations

import argparse
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _text(model: Any, with_types: bool = False) -> tuple[list[Any], Callable[..., Any]]:
    import tensorflow as tf

    names = ["input_ids", "attention_mask", *(["token_type_ids"] if with_types else [])]
    signature = [tf.TensorSpec([None, None], tf.int32, name=n) for n in names]
    return signature, lambda *args: model(**dict(zip(names, args, strict=True))).last_hidden_state


def _models(
    width: int, layers: int, heads: int
) -> dict[str, Callable[[], tuple[Any, list[Any], Callable[..., Any]]]]:
    import tensorflow as tf
    import transformers as tr

    # Timing sizes from width 256 (BERT's 512 positions, Whisper's 80 x 3000 features, ViT's 224²
    # images); tiny ones for the test data.
    full = width >= 256
    ffn = 4 * width if full else 2 * width
    positions = 512 if full else 32
    mels, frames = (80, 3000) if full else (16, 64)
    image, patch = (224, 16) if full else (32, 8)
    text = {
        "vocab_size": 64,
        "hidden_size": width,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": ffn,
        "max_position_embeddings": positions,
    }

    def bert() -> tuple[Any, list[Any], Callable[..., Any]]:
        model = tr.TFBertModel(tr.BertConfig(**text))
        return (model, *_text(model, with_types=True))

    def distilbert() -> tuple[Any, list[Any], Callable[..., Any]]:
        config = tr.DistilBertConfig(
            vocab_size=64, dim=width, n_layers=layers, n_heads=heads, hidden_dim=ffn,
            max_position_embeddings=positions,
        )  # fmt: skip
        model = tr.TFDistilBertModel(config)
        return (model, *_text(model))

    def roberta() -> tuple[Any, list[Any], Callable[..., Any]]:
        # RoBERTa's positions start after the padding index
        config = tr.RobertaConfig(**{**text, "max_position_embeddings": positions + 2})
        model = tr.TFRobertaModel(config)
        return (model, *_text(model))

    def bart_encoder() -> tuple[Any, list[Any], Callable[..., Any]]:
        config = tr.BartConfig(
            vocab_size=64, d_model=width, encoder_layers=layers, decoder_layers=1,
            encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
            decoder_ffn_dim=ffn, max_position_embeddings=positions,
        )  # fmt: skip
        model = tr.TFBartModel(config).get_encoder()
        return (model, *_text(model))

    def whisper_encoder() -> tuple[Any, list[Any], Callable[..., Any]]:
        config = tr.WhisperConfig(
            vocab_size=64, d_model=width, encoder_layers=layers, decoder_layers=1,
            encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
            decoder_ffn_dim=ffn, num_mel_bins=mels, max_source_positions=frames // 2,
        )  # fmt: skip
        model = tr.TFWhisperModel(config).get_encoder()
        signature = [tf.TensorSpec([None, mels, frames], tf.float32, name="input_features")]
        return model, signature, lambda x: model(x).last_hidden_state

    def vit() -> tuple[Any, list[Any], Callable[..., Any]]:
        config = tr.ViTConfig(
            hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=ffn, image_size=image, patch_size=patch,
        )  # fmt: skip
        model = tr.TFViTModel(config)
        signature = [tf.TensorSpec([None, 3, image, image], tf.float32, name="pixel_values")]
        return model, signature, lambda x: model(pixel_values=x).last_hidden_state

    def t5_encoder() -> tuple[Any, list[Any], Callable[..., Any]]:
        # TF T5 computes its attention with tf.einsum, as Keras' MultiHeadAttention does
        config = tr.T5Config(
            vocab_size=64, d_model=width, d_kv=width // heads, d_ff=ffn, num_layers=layers,
            num_heads=heads,
        )  # fmt: skip
        model = tr.TFT5EncoderModel(config)
        return (model, *_text(model))

    def keras_encoder(causal: bool) -> tuple[Any, list[Any], Callable[..., Any]]:
        # The Keras tutorials' transformer block: layers.MultiHeadAttention (EinsumDense
        # projections, an einsum for the scores), residual LayerNorms, a Dense FFN.
        from tensorflow.keras import Sequential, layers

        embed, positions_table = layers.Embedding(64, width), layers.Embedding(positions, width)
        blocks = []
        for _ in range(layers_count):
            attention = layers.MultiHeadAttention(num_heads=heads, key_dim=width // heads)
            ffn = Sequential([layers.Dense(ffn_width, activation="gelu"), layers.Dense(width)])
            norms = layers.LayerNormalization(epsilon=1e-6), layers.LayerNormalization(epsilon=1e-6)
            blocks.append((attention, ffn, norms))

        def call(ids: Any, mask: Any) -> Any:
            x = embed(ids) + positions_table(tf.range(tf.shape(ids)[1]))[None]
            keep = tf.cast(mask[:, None, :], tf.bool)
            for attention, ffn, (first, second) in blocks:
                if causal:
                    attended = attention(x, x, attention_mask=keep, use_causal_mask=True)
                else:
                    attended = attention(x, x, attention_mask=keep)
                x = first(x + attended)
                x = second(x + ffn(x))
            return x

        signature = [
            tf.TensorSpec([None, None], tf.int32, name=n) for n in ("input_ids", "attention_mask")
        ]
        holder = tf.Module()
        holder.parts = [embed, positions_table, *[p for block in blocks for p in block]]
        return holder, signature, call

    layers_count, ffn_width = layers, ffn
    return {
        "bert": bert,
        "distilbert": distilbert,
        "roberta": roberta,
        "bart-encoder": bart_encoder,
        "whisper-encoder": whisper_encoder,
        "vit": vit,
        "t5-encoder": t5_encoder,
        "keras-encoder": lambda: keras_encoder(causal=False),
        "keras-causal": lambda: keras_encoder(causal=True),
    }


def _export_keras3(path: Path, width: int, layers_count: int, heads: int, opset: int) -> None:
    """The same encoder in Keras 3, written by Keras' own ``model.export(format="onnx")``
    (which calls tf2onnx), as a Keras 3 user exports it. Its masks are ``tf.where`` selects."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32", name="input_ids")
    mask = keras.Input((None,), dtype="int32", name="attention_mask")
    x = keras.layers.Embedding(64, width)(ids)
    keep = keras.layers.Lambda(lambda m: keras.ops.cast(m[:, None, :], "bool"))(mask)
    ffn = 4 * width if width >= 256 else 2 * width
    for _ in range(layers_count):
        attended = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=width // heads)(
            x, x, attention_mask=keep
        )
        x = keras.layers.LayerNormalization(epsilon=1e-6)(x + attended)
        hidden = keras.layers.Dense(ffn, activation="gelu")(x)
        x = keras.layers.LayerNormalization(epsilon=1e-6)(x + keras.layers.Dense(width)(hidden))
    model = keras.Model([ids, mask], x)
    model([np.ones((2, 3), "int32"), np.ones((2, 3), "int32")])
    rng = np.random.default_rng(0)
    for weight in model.weights:
        values = rng.normal(0.0, 0.05 if len(weight.shape) > 1 else 0.1, size=tuple(weight.shape))
        weight.assign((1.0 + values if weight.path.endswith("gamma") else values).astype("float32"))
    model.export(str(path), format="onnx", opset_version=opset)


def _export_kerashub(
    path: Path, kind: str, width: int, layers_count: int, heads: int, opset: int
) -> None:
    """KerasHub's ``BertBackbone`` or ``GPT2Backbone`` (keras-hub 0.21, Keras 3) from a config,
    every weight redrawn, written by ``model.export(format="onnx")``. They compute attention
    themselves and mask the scores with ``where(mask, scores, -1e9)``."""
    import keras
    import keras_hub
    import numpy as np

    keras.utils.set_random_seed(0)
    full = width >= 256
    config = {
        "vocabulary_size": 64,
        "num_layers": layers_count,
        "num_heads": heads,
        "hidden_dim": width,
        "intermediate_dim": 4 * width if full else 2 * width,
        "max_sequence_length": 512 if full else 32,
    }
    backbone = (
        keras_hub.models.BertBackbone(**config, num_segments=2)
        if kind == "bert"
        else keras_hub.models.GPT2Backbone(**config)
    )
    dummy = {"token_ids": np.ones((2, 3), "int32"), "padding_mask": np.ones((2, 3), "int32")}
    if kind == "bert":
        dummy["segment_ids"] = np.zeros((2, 3), "int32")
    backbone(dummy)  # export wants a model that has been called
    rng = np.random.default_rng(zlib.crc32(f"kerashub-{kind}".encode()))
    for weight in backbone.weights:
        values = rng.normal(0.0, 0.05 if len(weight.shape) > 1 else 0.1, size=tuple(weight.shape))
        weight.assign((1.0 + values if weight.path.endswith("gamma") else values).astype("float32"))
    backbone.export(str(path), format="onnx", opset_version=opset)


def _redraw(model: Any, seed: int) -> None:
    """Draw every variable anew: nonzero biases and LayerNorm shifts, scales around 1 (Keras
    names them ``gamma``), the rest small."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for variable in model.variables:
        shape = tuple(variable.shape)
        values = rng.normal(0.0, 0.05 if len(shape) > 1 else 0.1, size=shape)
        name = variable.name.split("/")[-1]
        # LayerNorm scales (Keras' gamma; T5's RMS norms' weight) around 1
        if name.startswith("gamma") or (
            "layer_norm" in variable.name and name.startswith("weight")
        ):
            values = 1.0 + values
        variable.assign(values.astype(variable.dtype.as_numpy_dtype))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("names", nargs="*", help="models to convert (default: all)")
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    args = parser.parse_intermixed_args()

    import tensorflow as tf
    import tf2onnx

    tf.random.set_seed(0)
    args.out.mkdir(parents=True, exist_ok=True)
    models = _models(args.width, args.layers, args.heads)
    for name in args.names or [*models, "keras3-encoder"]:
        path = args.out / f"{name}.onnx"
        if name == "keras3-encoder":
            _export_keras3(path, args.width, args.layers, args.heads, args.opset)
            print(f"wrote {path}")
            continue
        if name in ("kerashub-bert", "kerashub-gpt2"):
            kind = name.removeprefix("kerashub-")
            _export_kerashub(path, kind, args.width, args.layers, args.heads, args.opset)
            print(f"wrote {path}")
            continue
        model, signature, call = models[name]()
        function = tf.function(call, input_signature=signature)
        function(*[tf.ones([2 if d is None else d for d in s.shape], s.dtype) for s in signature])
        _redraw(model, seed=zlib.crc32(name.encode()))  # the call above made the variables
        tf2onnx.convert.from_function(
            function, input_signature=signature, opset=args.opset, output_path=str(path)
        )
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
