"""Wan2.1 text-to-video (WanTransformer3DModel): 5-D latents (B, C, F, H, W), real CFG."""

from __future__ import annotations

import torch

from verl_digen.models.adapter import DiffusersAdapter


class WanModel(DiffusersAdapter):
    """Timestep convention: the Wan pipeline passes the scheduler's ``t = sigma * 1000``.
    Wan has no text mask; the pipeline zero-pads the T5 embeddings (our encoders do too)."""

    arch = "wan"
    latent_ndim = 5
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")

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
