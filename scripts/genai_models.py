"""Build decoder models as onnxruntime-genai's model builder writes them, from seeded tiny configs.

Microsoft's published ONNX LLMs (Phi-3/Phi-4, Llama, Qwen, Gemma ``*-onnx`` repositories) and
``onnxruntime_genai.models.builder``'s own output are already fused for ONNX Runtime: packed
Q/K/V into ``com.microsoft.GroupQueryAttention`` with its rotary inside and a KV cache per layer,
``SkipSimplifiedLayerNormalization``, 4-bit ``MatMulNBits`` at int4. Their inputs are sized by
that op's rules: a past key is ``[batch, kv_heads, past_sequence_length, head_size]`` (the
current builder names the last dim ``kv_cache_dim``), the attention mask covers
``past_sequence_length + sequence_length`` positions, and a step with a past and more than one
new token runs at batch 1 only.

onnxruntime-genai is not a dependency of onnxopt (nor of its tests); install it beside them:

    .venv/bin/pip install --no-deps --target /tmp/genai onnxruntime-genai==0.18.0
    PYTHONPATH=/tmp/genai .venv/bin/python scripts/genai_models.py --out /tmp/genai_models \\
        [--families llama,phi3] [--precisions fp32,int4] [--medium] [--check]

Each family is a transformers ``*ForCausalLM`` built from a config (2 layers, hidden 192, 4 query
heads of 48 and 2 K/V heads: a head size none of validation's fallback sizes guesses), every
parameter perturbed with a seed, saved with a word-level tokenizer (the builder writes tokenizer
files too), then converted with ``-e cpu -p PRECISION``. Writes ``OUT/FAMILY-PRECISION/model.onnx``
(weights in ``model.onnx.data``). With ``--check`` each build is also optimized by onnxopt
into ``OUT/optimized/FAMILY-PRECISION`` (beside copies of its config and tokenizer files) and both
folders generate 12 tokens greedily in onnxruntime-genai's own runtime: the tokens must agree.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

FAMILIES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "phi3",
    "phi",
    "gemma",
    "gemma2",
    "granite",
    "olmo",
    "smollm3",
)
PRECISIONS = ("fp32", "int4")


# --medium: a size worth timing (4 layers, hidden 768, 12 query and 4 K/V heads of 64).
MEDIUM = {
    "vocab_size": 8000,
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 4,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
}


def _config(family: str, medium: bool = False) -> Any:
    import transformers as tr

    shared: dict[str, Any] = {
        "vocab_size": 512,
        "hidden_size": 192,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        **(MEDIUM if medium else {}),
    }
    head = shared["hidden_size"] // shared["num_attention_heads"]
    if family == "phi3":
        # The builder picks Phi-3's short-context form when the two lengths agree.
        positions = shared["max_position_embeddings"]
        return tr.Phi3Config(**shared, original_max_position_embeddings=positions)
    if family == "phi":
        # ORT's rotary wants the rotated half of a head to be a multiple of 16: heads of 64.
        width = shared["hidden_size"] if medium else 256
        return tr.PhiConfig(**{**shared, "hidden_size": width}, partial_rotary_factor=0.5)
    if family == "gemma":
        return tr.GemmaConfig(**shared, head_dim=head)
    if family == "gemma2":
        # A window within max_position_embeddings (the builder keeps a window-long ring buffer).
        return tr.Gemma2Config(**shared, head_dim=head, sliding_window=16)
    classes = {
        "llama": tr.LlamaConfig,
        "mistral": tr.MistralConfig,
        "qwen2": tr.Qwen2Config,
        "qwen3": tr.Qwen3Config,
        "granite": tr.GraniteConfig,
        "olmo": tr.OlmoConfig,
        "smollm3": tr.SmolLM3Config,
    }
    extra: dict[str, Any] = {"head_dim": head} if family == "qwen3" else {}
    return classes[family](**shared, **extra)


def _checkpoint(family: str, folder: Path, medium: bool) -> None:
    """A seeded checkpoint and tokenizer in ``folder``, as ``save_pretrained`` writes them."""
    import torch
    import transformers as tr
    from tokenizers import Tokenizer, models, pre_tokenizers

    config = _config(family, medium)
    torch.manual_seed(0)
    model = tr.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)
    model.save_pretrained(folder)
    vocab = {f"w{i}": i for i in range(config.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tr.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="w0", bos_token="w1", eos_token="w2"
    ).save_pretrained(folder)


PROMPT = (5, 17, 42, 99, 3)


def _greedy(folder: Path, steps: int = 12) -> tuple[list[int], Any]:
    """Tokens onnxruntime-genai's own runtime generates greedily from :data:`PROMPT`, and the
    last step's logits."""
    import numpy as np
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(PROMPT) + steps)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(PROMPT, dtype=np.int32))
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens, np.asarray(generator.get_output("logits"))


def _check(build: Path, optimized: Path) -> str:
    """Optimize ``build`` with onnxopt (validated) into ``optimized`` beside the build's config
    and tokenizer files, then compare greedy generation in onnxruntime-genai."""
    import numpy as np

    optimized.mkdir(parents=True, exist_ok=True)
    for extra in build.iterdir():
        if extra.suffix == ".json":
            shutil.copy(extra, optimized / extra.name)
    command = [sys.executable, "-m", "onnxopt", "optimize", str(build / "model.onnx")]
    done = subprocess.run(
        [*command, "-o", str(optimized / "model.onnx")], capture_output=True, text=True
    )
    if done.returncode != 0:
        return f"onnxopt exit {done.returncode}: {done.stderr.strip().splitlines()[-1]}"
    expected, logits = _greedy(build)
    got, got_logits = _greedy(optimized)
    difference = float(np.abs(logits - got_logits).max())
    verdict = "same tokens" if got == expected else f"OTHER TOKENS {got} vs {expected}"
    return f"{verdict}, last logits within {difference:.1e}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--medium", action="store_true", help="4 layers, hidden 768 (to time)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="optimize each build into OUT/optimized and compare generation in onnxruntime-genai",
    )
    args = parser.parse_args()
    failed = []
    with tempfile.TemporaryDirectory() as scratch:
        for family in args.families.split(","):
            checkpoint = Path(scratch) / family
            _checkpoint(family, checkpoint, args.medium)
            for precision in args.precisions.split(","):
                out = args.out / f"{family}-{precision}"
                command = [
                    sys.executable,
                    "-m",
                    "onnxruntime_genai.models.builder",
                    "-i",
                    str(checkpoint),
                    "-o",
                    str(out),
                    "-p",
                    precision,
                    "-e",
                    "cpu",
                    "-c",
                    str(Path(scratch) / "cache"),
                ]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0 or not (out / "model.onnx").exists():
                    last = (done.stderr.strip().splitlines() or ["?"])[-1]
                    failed.append(f"{family}-{precision}: {last}")
                    print(f"{family}-{precision}: FAILED ({last})")
                elif args.check:
                    verdict = _check(out, args.out / "optimized" / out.name)
                    print(f"{family}-{precision}: {verdict}")
                    if not verdict.startswith("same tokens"):
                        failed.append(f"{family}-{precision}: {verdict}")
                else:
                    print(f"{family}-{precision}: {out / 'model.onnx'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
