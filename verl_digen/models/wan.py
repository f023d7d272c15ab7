"""Wan2.1 text-to-video (WanTransformer3DModel): 5-D latents (B, C, F, H, W), real CFG."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from verl_digen import archs
from verl_digen.models.adapter import DiffusersAdapter
from verl_digen.models.spec import (
    TINY_LATENT_CHANNELS,
    TINY_TEXT_DIM,
    TinySpec,
    tiny_wan_family_vae,
)


class WanModel(DiffusersAdapter):
    """Timestep convention: the Wan pipeline passes the scheduler's ``t = sigma * 1000``.
    Wan has no text mask; the pipeline zero-pads the T5 embeddings (our encoders do too)."""

    facts = archs.WAN
    tiny = TinySpec(
        dict(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=16,
            in_channels=TINY_LATENT_CHANNELS,
            out_channels=TINY_LATENT_CHANNELS,
            text_dim=TINY_TEXT_DIM,
            freq_dim=32,
            ffn_dim=64,
            num_layers=2,
            rope_max_seq_len=64,
        ),
        lambda: tiny_wan_family_vae("AutoencoderKLWan"),
    )
    text_dim_key = "text_dim"
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")

    @classmethod
    def vae_factors(cls, vae: nn.Module | None) -> tuple[int, int]:
        if vae is None:
            return cls.facts.vae_factors
        spatial, temporal = cls.facts.vae_factors
        return vae.config.scale_factor_spatial or spatial, vae.config.scale_factor_temporal or temporal

    @classmethod
    def encode_with_pipeline(
        cls, pipeline: Any, prompts: list[str], *, device: Any, dtype: Any, max_sequence_length: int
    ) -> dict[str, torch.Tensor]:
        pe, _ = pipeline.encode_prompt(
            prompt=prompts,
            negative_prompt=None,
            do_classifier_free_guidance=False,
            max_sequence_length=max_sequence_length,
            device=device,
            dtype=dtype,
        )
        return {"prompt_embeds": pe}

    def _forward(
        self, latents: torch.Tensor, sigmas: torch.Tensor, tensors: dict[str, torch.Tensor], guidance_scale: float
    ) -> torch.Tensor:
        return self.transformer(
            hidden_states=latents,
            timestep=sigmas * 1000,
            encoder_hidden_states=tensors["prompt_embeds"],
            return_dict=False,
        )[0]

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        mean = torch.tensor(cfg.latents_mean, dtype=latents.dtype, device=latents.device).view(1, -1, 1, 1, 1)
        std = torch.tensor(cfg.latents_std, dtype=latents.dtype, device=latents.device).view(1, -1, 1, 1, 1)
        return self.vae.decode(latents * std + mean, return_dict=False)[0]
