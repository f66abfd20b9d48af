"""Convert transformers' Flax models to ONNX through jax2tf and tf2onnx, as JAX users do.

JAX has no ONNX exporter of its own; Google's magika (shipped on PyPI) went jax2tf -> TensorFlow ->
tf2onnx, and so can any Flax model. Neither JAX nor TensorFlow is a dependency of onnxopt: run this
in the environment of ``scripts/export_tf_models.py`` with JAX added (JAX's pip resolve lifts
numpy and ml-dtypes past what TensorFlow 2.17 runs with, hence the last line):

    /tmp/tfenv/bin/pip install "jax[cpu]==0.4.30" "jaxlib==0.4.30" "flax==0.8.5"
    /tmp/tfenv/bin/pip install "numpy==1.26.4" "ml-dtypes==0.4.1"
    /tmp/tfenv/bin/python scripts/export_flax_models.py OUT [bert] [vit] [--width 768 --layers 4 \\
        --heads 12] [--image 224 --patch 16]

Each model is built from a config (FFN 4x), every parameter redrawn with a seed from its name
(biases and LayerNorm shifts nonzero, scales around 1, as in a trained checkpoint), converted by
``jax2tf.convert`` with graph serialization and ``enable_xla=False`` (the only form tf2onnx can
read: no XlaDot/XlaGather ops) and polymorphic batch (and sequence) dims, then by
``tf2onnx.convert.from_function`` at opset 17. Flax GPT-2 does not convert: its causal mask
slices a [512, 512] buffer to the symbolic sequence, which jax2tf's shape polymorphism refuses.
"""

from __future__ import annotations

import argparse
import os
import zlib
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _redraw(params: Any, seed: int) -> Any:
    """Every leaf drawn anew: ``bias`` ~ N(0, 0.1), a LayerNorm ``scale`` ~ 1 + N(0, 0.1), the
    rest (kernels, embeddings) ~ N(0, 0.05)."""
    import jax
    import numpy as np

    rng = np.random.default_rng(seed)

    def draw(path: tuple[Any, ...], leaf: Any) -> Any:
        name = str(getattr(path[-1], "key", path[-1]))
        values = rng.normal(0.0, 0.1 if name in ("bias", "scale") else 0.05, size=leaf.shape)
        return (1.0 + values if name == "scale" else values).astype(leaf.dtype)

    return jax.tree_util.tree_map_with_path(draw, params)


def _build(name: str, width: int, layers: int, heads: int, image: int, patch: int) -> Any:
    import transformers as tr

    if name == "bert":
        config = tr.BertConfig(
            vocab_size=1000,
            hidden_size=width,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=4 * width,
            max_position_embeddings=512,
        )
        return tr.FlaxBertModel(config, seed=0)
    if name == "vit":
        config = tr.ViTConfig(
            hidden_size=width,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=4 * width,
            image_size=image,
            patch_size=patch,
        )
        return tr.FlaxViTModel(config, seed=0)
    raise SystemExit(f"unknown model {name!r}: bert, vit")


def export(
    name: str, out: Path, width: int, layers: int, heads: int, image: int, patch: int
) -> Path:
    import tensorflow as tf
    import tf2onnx
    from jax.experimental import jax2tf

    model = _build(name, width, layers, heads, image, patch)
    params = _redraw(model.params, zlib.crc32(f"flax-{name}".encode()))
    if name == "vit":
        signature = [tf.TensorSpec([None, 3, image, image], tf.float32, name="pixel_values")]
        shapes = [f"(b, 3, {image}, {image})"]

        def call(*inputs: Any) -> Any:
            return model(inputs[0], params=params, train=False).last_hidden_state

    else:
        signature = [
            tf.TensorSpec([None, None], tf.int32, name=n) for n in ("input_ids", "attention_mask")
        ]
        shapes = ["(b, s)", "(b, s)"]

        def call(*inputs: Any) -> Any:
            ids, mask = inputs
            return model(ids, attention_mask=mask, params=params, train=False).last_hidden_state

    converted = jax2tf.convert(
        call, polymorphic_shapes=shapes, native_serialization=False, enable_xla=False
    )
    function = tf.function(converted, autograph=False, input_signature=signature)
    path = out / f"flax-{name}.onnx"
    tf2onnx.convert.from_function(
        function, input_signature=signature, opset=17, output_path=str(path)
    )
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("names", nargs="*", default=["bert", "vit"])
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--patch", type=int, default=8)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        path = export(name, args.out, args.width, args.layers, args.heads, args.image, args.patch)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
