"""Stable Diffusion 3 / 3.5 (SD3Transformer2DModel): unpacked latents, patchified inside, real CFG."""

from __future__ import annotations

from typing import Any

import torch

from verl_digen import archs
from verl_digen.models.adapter import DiffusersAdapter
from verl_digen.models.spec import (
    TINY_LATENT_CHANNELS,
    TINY_POOLED_DIM,
    TINY_TEXT_DIM,
    TinySpec,
    tiny_image_vae,
)


class SD3Model(DiffusersAdapter):
    """Timestep convention: the SD3 pipeline passes the scheduler's ``t = sigma * 1000`` unchanged."""

    facts = archs.SD3
    tiny = TinySpec(
        dict(
            sample_size=32,
            patch_size=2,
            in_channels=TINY_LATENT_CHANNELS,
            num_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=TINY_TEXT_DIM,
            caption_projection_dim=32,
            pooled_projection_dim=TINY_POOLED_DIM,
            out_channels=TINY_LATENT_CHANNELS,
            pos_embed_max_size=64,
        ),
        lambda: tiny_image_vae(1.5305, 0.0609),
    )
    pooled_dim_key = "pooled_projection_dim"

    @classmethod
    def encode_with_pipeline(
        cls, pipeline: Any, prompts: list[str], *, device: Any, dtype: Any, max_sequence_length: int
    ) -> dict[str, torch.Tensor]:
        pe, _, pooled, _ = pipeline.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            device=device,
            do_classifier_free_guidance=False,
            max_sequence_length=max_sequence_length,
        )
        return {"prompt_embeds": pe, "pooled_prompt_embeds": pooled}

    def _forward(
        self, latents: torch.Tensor, sigmas: torch.Tensor, tensors: dict[str, torch.Tensor], guidance_scale: float
    ) -> torch.Tensor:
        return self.transformer(
            hidden_states=latents,
            encoder_hidden_states=tensors["prompt_embeds"],
            pooled_projections=tensors["pooled_prompt_embeds"],
            timestep=sigmas * 1000,
            return_dict=False,
        )[0]

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        z = latents / cfg.scaling_factor + (cfg.shift_factor or 0.0)
        return self.vae.decode(z, return_dict=False)[0]
