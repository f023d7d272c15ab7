"""The tiny building blocks an adapter class declares with (``TinySpec``, the tiny VAEs).

Every per-architecture fact lives in one place: the torch-free ``archs.ArchFacts`` the adapter class points to
(released pipeline, latent channels, sizes, engine and converter names; ``PretrainedSpec`` and ``SequencePlan``
are declared there and re-exported here) and, for what needs the nn.Module, the adapter class itself (``flux.py``,
``wan.py``, ...: the tiny random-weight config, packing, the text widths, the loaded VAE's compression and the
call to the pipeline's own ``encode_prompt``). ``loading.py``, ``tiny.py`` and ``conditioning/text.py`` read
those and never switch on an architecture name (see docs/architecture.md, "Adding a model"). This module
imports no adapter, so adapter files can import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import diffusers
from torch import nn

# declared with the facts (torch-free: the config's checks read TINY_LATENT_CHANNELS), re-exported
from verl_digen.archs import TINY_LATENT_CHANNELS, PretrainedSpec, SequencePlan  # noqa: F401


@dataclass(frozen=True)
class TinySpec:
    """A tiny random-weight model: keyword arguments of the real transformer class
    (``PretrainedSpec.transformer_class``) and a factory for a tiny VAE of the architecture's family."""

    transformer_kwargs: dict[str, Any]
    vae: Callable[[], nn.Module]


TINY_TEXT_LEN = 8  # tokens per prompt for hashed embeddings
TINY_TEXT_DIM = 32
TINY_POOLED_DIM = 32
#: per-channel latent statistics of the tiny Wan-family VAEs (non-trivial, so decoding tests see them)
TINY_LATENTS_MEAN = [0.1, -0.1, 0.0, 0.2]
TINY_LATENTS_STD = [1.0, 0.8, 1.2, 1.1]


def tiny_image_vae(scaling: float, shift: float) -> nn.Module:
    """A 2x ``AutoencoderKL`` (FLUX / SD3 family) with the released model's scaling and shift."""
    return diffusers.AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=TINY_LATENT_CHANNELS,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        norm_num_groups=4,
        sample_size=64,
        scaling_factor=scaling,
        shift_factor=shift,
    )


def tiny_wan_family_vae(cls_name: str) -> nn.Module:
    """A 2x spatial, no temporal compression Wan2.1-style VAE (``AutoencoderKLWan`` / ``...QwenImage``)."""
    cls = getattr(diffusers, cls_name)
    return cls(
        base_dim=8,
        z_dim=TINY_LATENT_CHANNELS,
        dim_mult=[1, 2],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[False],
        latents_mean=TINY_LATENTS_MEAN,
        latents_std=TINY_LATENTS_STD,
    )
