"""Stable Diffusion 3 / 3.5 (SD3Transformer2DModel): unpacked latents, patchified inside, real CFG."""

from __future__ import annotations

import torch

from verl_digen.models.adapter import DiffusersAdapter


class SD3Model(DiffusersAdapter):
    """Timestep convention: the SD3 pipeline passes the scheduler's ``t = sigma * 1000`` unchanged."""

    arch = "sd3"

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
