"""HunyuanVideo (HunyuanVideoTransformer3DModel): 5-D latents, Llama token embeddings with a mask,
a pooled CLIP vector, and a distilled guidance embedding."""

from __future__ import annotations

import torch

from verl_digen.models.adapter import DiffusersAdapter


class HunyuanVideoModel(DiffusersAdapter):
    """Timestep convention: ``timestep = sigma * 1000`` and, unlike FLUX, ``guidance = scale * 1000``
    is passed already scaled (the transformer does not multiply; see the diffusers pipeline)."""

    arch = "hunyuan_video"
    latent_ndim = 5

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
