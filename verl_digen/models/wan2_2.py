"""Wan2.2 TI2V-5B, text-to-video (``WanPipeline`` with ``expand_timesteps``): Wan2.1's transformer class and
text path, with the Wan2.2 VAE (residual blocks, 2x2 pixel patchify, 16x spatial / 4x temporal, 48
latent channels) and a 704 x 1280 default size.

The two-expert Wan2.2 A14B (``transformer`` for high noise, ``transformer_2`` for low noise, switched at
``boundary_ratio``) is refused when loaded (``loading.load_pretrained``): training it means two policies.
"""

from __future__ import annotations

import diffusers
from torch import nn

from verl_digen import archs
from verl_digen.models.spec import TINY_LATENT_CHANNELS, TINY_LATENTS_MEAN, TINY_LATENTS_STD, TinySpec
from verl_digen.models.wan import WanModel


def tiny_vae() -> nn.Module:
    """The Wan2.2 VAE family: residual blocks and a 2x2 pixel patchify (12 = 3 x 4 image channels),
    here 8x spatial (2 down blocks x patch 2) and no temporal compression (F latent frames -> F frames)."""
    return diffusers.AutoencoderKLWan(
        base_dim=8,
        z_dim=TINY_LATENT_CHANNELS,
        dim_mult=[1, 2, 2],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[False, False],
        is_residual=True,
        patch_size=2,
        in_channels=12,
        out_channels=12,
        scale_factor_spatial=8,
        scale_factor_temporal=1,
        latents_mean=TINY_LATENTS_MEAN,
        latents_std=TINY_LATENTS_STD,
    )


class Wan22Model(WanModel):
    """Timestep convention: as Wan2.1 (``t = sigma * 1000``). The TI2V pipeline passes that timestep
    once per latent token (``expand_timesteps``) so that an image-conditioned first frame can sit at
    t = 0; in text-to-video every token of a row has the row's t, which the transformer computes
    identically from one timestep per row (tests/models/test_models.py checks the two agree), so the adapter
    passes one per row and skips computing a time embedding per token."""

    facts = archs.WAN2_2
    tiny = TinySpec(dict(WanModel.tiny.transformer_kwargs), tiny_vae)
