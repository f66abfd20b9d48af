"""Diffusion probe: diffusers' UNets, VAEs and diffusion transformers, through onnxopt.

Stable Diffusion's components are among the models users most often export to ONNX. Each model
here is built from a small config with seeded random weights (nothing is downloaded), exported
with both exporters with dynamic batch, latent height/width and text length, and run through
torch_modules_probe's checks (optimize + validate, determinism, fixed point, ``--target onnx``,
``--explain``, bench), printing the fused contrib ops and the first ``--explain`` reasons.

Needs diffusers, which is not a dependency of onnxopt: ``.venv/bin/pip install diffusers`` (or
install it elsewhere with ``pip install --target DIR diffusers`` and put DIR on PYTHONPATH).

    nice python scripts/diffusion_probe.py [--only SUBSTRING] [--no-bench] [--keep DIR]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_modules_probe import Case, case, run

CASES: list[Case] = []
# latent [B, C, H, W] and text [B, T, D]: H and W stay multiples of 2^(levels - 1) in validation
IMAGE = {0: "batch", 2: "height", 3: "width"}
TEXT = {0: "batch", 1: "text"}


def _diffusers() -> Any:
    import diffusers
    import torch

    torch.manual_seed(0)
    return diffusers


def _first_output(model: Any, method: str = "forward") -> Any:
    """``model`` wrapped so that calling it runs ``method`` and returns the one tensor it makes."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            result = getattr(self.model, method)(*args, return_dict=False)
            return result[0] if isinstance(result, tuple) else result

    return Wrapped().eval()


# timed at the example inputs' sizes: bench's default 128 x 128 latent does not fit in memory
_add = functools.partial(case, cases=CASES, bench_examples=True)
_UNET = ("sample", "timestep", "encoder_hidden_states")
_UNET_DIMS = {"sample": IMAGE, "timestep": {0: "batch"}, "encoder_hidden_states": TEXT}


@_add("unet SD-1.x (cross-attention, 4 levels)", _UNET, _UNET_DIMS, True)
def _unet_sd() -> tuple[Any, tuple[Any, ...]]:
    d = _diffusers()
    import torch

    unet = d.UNet2DConditionModel(
        sample_size=32,
        block_out_channels=(64, 128, 256, 256),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        cross_attention_dim=128,
        layers_per_block=1,
        attention_head_dim=8,
        norm_num_groups=32,
    )
    args = (torch.randn(2, 4, 32, 32), torch.tensor([10, 500]), torch.randn(2, 77, 128))
    return _first_output(unet.eval()), args


@_add("unet SD-2.x (linear projections, head dims per level)", _UNET, _UNET_DIMS, False)
def _unet_sd2() -> tuple[Any, tuple[Any, ...]]:
    d = _diffusers()
    import torch

    unet = d.UNet2DConditionModel(
        sample_size=16,
        block_out_channels=(32, 64, 64),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=64,
        layers_per_block=1,
        attention_head_dim=(2, 4, 4),
        use_linear_projection=True,
        upcast_attention=True,
        norm_num_groups=16,
    )
    args = (torch.randn(2, 4, 16, 16), torch.tensor([1, 999]), torch.randn(2, 9, 64))
    return _first_output(unet.eval()), args


_SDXL = ("sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids")
_SDXL_DIMS = {**_UNET_DIMS, "text_embeds": {0: "batch"}, "time_ids": {0: "batch"}}


@_add("unet SDXL (text_time conditioning, 2 transformer layers)", _SDXL, _SDXL_DIMS, False)
def _unet_sdxl() -> tuple[Any, tuple[Any, ...]]:
    d = _diffusers()
    import torch

    unet = d.UNet2DConditionModel(
        sample_size=16,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=64,
        transformer_layers_per_block=(1, 2),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=80,  # text_embeds 32 + 6 time ids x 8
        layers_per_block=1,
        norm_num_groups=16,
    ).eval()
    import torch.nn as nn

    class SDXL(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unet = unet

        def forward(self, sample: Any, timestep: Any, text: Any, pooled: Any, ids: Any) -> Any:
            cond = {"text_embeds": pooled, "time_ids": ids}
            return self.unet(sample, timestep, text, added_cond_kwargs=cond, return_dict=False)[0]

    ids = torch.tensor([[64.0, 64, 0, 0, 64, 64]]).repeat(2, 1)
    args = (torch.randn(2, 4, 16, 16), torch.tensor([3, 700]), torch.randn(2, 9, 64))
    return SDXL().eval(), (*args, torch.randn(2, 32), ids)


@_add(
    "unet2d DDPM (self-attention only)",
    ("sample", "timestep"),
    {"sample": IMAGE, "timestep": {0: "batch"}},
    True,
)
def _unet2d() -> tuple[Any, tuple[Any, ...]]:
    d = _diffusers()
    import torch

    unet = d.UNet2DModel(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 64, 64),
        down_block_types=("DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
        layers_per_block=1,
        attention_head_dim=16,
        norm_num_groups=16,
    )
    return _first_output(unet.eval()), (torch.randn(2, 3, 32, 32), torch.tensor([5, 900]))


def _vae() -> Any:
    d = _diffusers()
    return d.AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(32, 64, 64),
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=16,
        sample_size=64,
    ).eval()


@_add("vae decoder (single-head attention over H*W)", ("latent",), {"latent": IMAGE}, True)
def _vae_decoder() -> tuple[Any, tuple[Any, ...]]:
    import torch

    vae = _vae()  # batch 2 examples: dynamo specializes a dim that is 1 in the example
    return _first_output(vae, "decode"), (torch.randn(2, 4, 16, 16),)


@_add("vae encoder (latent mean)", ("image",), {"image": IMAGE}, False)
def _vae_encoder() -> tuple[Any, tuple[Any, ...]]:
    import torch
    import torch.nn as nn

    vae = _vae()

    class Encode(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vae = vae

        def forward(self, image: Any) -> Any:
            return self.vae.encode(image).latent_dist.mean

    return Encode().eval(), (torch.randn(2, 3, 64, 64),)


@_add(
    "DiT (patch embedding, adaLN-zero, class labels)",
    ("latent", "timestep", "labels"),
    {"latent": IMAGE, "timestep": {0: "batch"}, "labels": {0: "batch"}},
    True,
)
def _dit() -> tuple[Any, tuple[Any, ...]]:
    d = _diffusers()
    import torch

    dit = d.DiTTransformer2DModel(
        num_attention_heads=4,
        attention_head_dim=16,
        in_channels=4,
        num_layers=4,
        sample_size=16,
        patch_size=2,
        num_embeds_ada_norm=10,
        norm_num_groups=16,
    )
    args = (torch.randn(2, 4, 16, 16), torch.tensor([10, 500]), torch.tensor([1, 7]))
    return _first_output(dit.eval()), args


@_add(
    "SD3 MMDiT (joint attention, pooled projection)",
    ("latent", "text", "pooled", "timestep"),
    {"latent": IMAGE, "text": TEXT, "pooled": {0: "batch"}, "timestep": {0: "batch"}},
    True,
)
def _sd3() -> tuple[Any, tuple[Any, ...]]:
    d = _diffusers()
    import torch
    import torch.nn as nn

    sd3 = d.SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=4,
        num_layers=3,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=48,
        caption_projection_dim=64,
        pooled_projection_dim=32,
        out_channels=4,
        pos_embed_max_size=32,
    ).eval()

    class SD3(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = sd3

        def forward(self, latent: Any, text: Any, pooled: Any, timestep: Any) -> Any:
            return self.model(
                hidden_states=latent,
                encoder_hidden_states=text,
                pooled_projections=pooled,
                timestep=timestep,
                return_dict=False,
            )[0]

    args = (torch.randn(2, 4, 16, 16), torch.randn(2, 9, 48), torch.randn(2, 32))
    return SD3().eval(), (*args, torch.tensor([10.0, 500.0]))


def main() -> int:
    return run(CASES, __doc__.splitlines()[0], "diffusion_probe_")


if __name__ == "__main__":
    sys.exit(main())
