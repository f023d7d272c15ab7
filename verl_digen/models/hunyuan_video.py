"""HunyuanVideo (HunyuanVideoTransformer3DModel): 5-D latents, Llama token embeddings with a mask,
a pooled CLIP vector, and a distilled guidance embedding."""

from __future__ import annotations

from typing import Any

import diffusers
import torch
from torch import nn

from verl_digen import archs
from verl_digen.models.adapter import DiffusersAdapter
from verl_digen.models.spec import (
    TINY_LATENT_CHANNELS,
    TINY_POOLED_DIM,
    TINY_TEXT_DIM,
    TinySpec,
)


def tiny_vae() -> nn.Module:
    """A tiny causal 3-D ``AutoencoderKLHunyuanVideo``: 4x spatial, 4x temporal (the only temporal
    compression it supports: F latent frames -> 4(F-1)+1 frames)."""
    return diffusers.AutoencoderKLHunyuanVideo(
        in_channels=3,
        out_channels=3,
        latent_channels=TINY_LATENT_CHANNELS,
        down_block_types=("HunyuanVideoDownBlock3D",) * 3,
        up_block_types=("HunyuanVideoUpBlock3D",) * 3,
        block_out_channels=(8, 8, 16),
        layers_per_block=1,
        norm_num_groups=4,
        temporal_compression_ratio=4,
        spatial_compression_ratio=4,
        mid_block_add_attention=False,
    )


class HunyuanVideoModel(DiffusersAdapter):
    """Timestep convention: ``timestep = sigma * 1000`` and, unlike FLUX, ``guidance = scale * 1000``
    is passed already scaled (the transformer does not multiply; see the diffusers pipeline)."""

    facts = archs.HUNYUAN_VIDEO
    tiny = TinySpec(
        dict(
            in_channels=TINY_LATENT_CHANNELS,
            out_channels=TINY_LATENT_CHANNELS,
            num_attention_heads=2,
            attention_head_dim=16,
            num_layers=1,
            num_single_layers=1,
            num_refiner_layers=1,
            mlp_ratio=2.0,
            patch_size=2,
            patch_size_t=1,
            guidance_embeds=True,
            text_embed_dim=TINY_TEXT_DIM,
            pooled_projection_dim=TINY_POOLED_DIM,
            rope_axes_dim=(4, 6, 6),
        ),
        tiny_vae,
    )
    text_dim_key = "text_embed_dim"
    pooled_dim_key = "pooled_projection_dim"

    @classmethod
    def vae_factors(cls, vae: nn.Module | None) -> tuple[int, int]:
        if vae is None:
            return cls.facts.vae_factors
        return vae.config.spatial_compression_ratio, vae.config.temporal_compression_ratio

    @classmethod
    def encode_with_pipeline(
        cls, pipeline: Any, prompts: list[str], *, device: Any, dtype: Any, max_sequence_length: int
    ) -> dict[str, torch.Tensor]:
        pe, pooled, mask = pipeline.encode_prompt(
            prompt=prompts, prompt_2=None, device=device, dtype=dtype, max_sequence_length=max_sequence_length
        )
        return {"prompt_embeds": pe, "pooled_prompt_embeds": pooled, "prompt_mask": mask.long()}

    def _forward(
        self, latents: torch.Tensor, sigmas: torch.Tensor, tensors: dict[str, torch.Tensor], guidance_scale: float
    ) -> torch.Tensor:
        b = latents.shape[0]
        text = tensors["prompt_embeds"]
        mask = tensors.get("prompt_mask")
        if mask is None:
            mask = torch.ones(text.shape[:2], dtype=torch.long, device=text.device)
        guidance = None
        if self.guidance_distilled:
            guidance = torch.full((b,), float(guidance_scale) * 1000.0, device=latents.device, dtype=latents.dtype)
        return self.transformer(
            hidden_states=latents,
            timestep=sigmas * 1000,
            encoder_hidden_states=text,
            encoder_attention_mask=mask,
            pooled_projections=tensors["pooled_prompt_embeds"],
            guidance=guidance,
            return_dict=False,
        )[0]

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latents / self.vae.config.scaling_factor, return_dict=False)[0]
