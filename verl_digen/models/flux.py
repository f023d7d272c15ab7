"""FLUX.1 (FluxTransformer2DModel): packed 2x2 tokens, rotary ids, pooled CLIP vector, and for
FLUX.1-dev a distilled guidance embedding instead of a CFG branch."""

from __future__ import annotations

from typing import Any

import torch

from verl_digen import archs
from verl_digen.models.adapter import DiffusersAdapter
from verl_digen.models.packing import image_ids, pack_2x2, unpack_2x2
from verl_digen.models.spec import (
    TINY_LATENT_CHANNELS,
    TINY_POOLED_DIM,
    TINY_TEXT_DIM,
    TinySpec,
    tiny_image_vae,
)


class FluxModel(DiffusersAdapter):
    """Timestep convention: diffusers FLUX takes ``timestep = sigma`` and ``guidance = scale`` and
    multiplies both by 1000 inside; the pipeline passes ``t / 1000`` for exactly that reason."""

    facts = archs.FLUX
    tiny = TinySpec(
        dict(
            patch_size=1,
            in_channels=4 * TINY_LATENT_CHANNELS,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=TINY_TEXT_DIM,
            pooled_projection_dim=TINY_POOLED_DIM,
            guidance_embeds=True,
            axes_dims_rope=(4, 6, 6),
        ),
        lambda: tiny_image_vae(0.3611, 0.1159),
    )
    packed = True
    pooled_dim_key = "pooled_projection_dim"

    @classmethod
    def encode_with_pipeline(
        cls, pipeline: Any, prompts: list[str], *, device: Any, dtype: Any, max_sequence_length: int
    ) -> dict[str, torch.Tensor]:
        pe, pooled, _ = pipeline.encode_prompt(
            prompt=prompts, prompt_2=None, device=device, max_sequence_length=max_sequence_length
        )
        return {"prompt_embeds": pe, "pooled_prompt_embeds": pooled}

    def _forward(
        self, latents: torch.Tensor, sigmas: torch.Tensor, tensors: dict[str, torch.Tensor], guidance_scale: float
    ) -> torch.Tensor:
        b, _, h, w = latents.shape
        text = tensors["prompt_embeds"]
        guidance = None
        if self.guidance_distilled:
            guidance = torch.full((b,), float(guidance_scale), device=latents.device, dtype=latents.dtype)
        out = self.transformer(
            hidden_states=pack_2x2(latents),
            encoder_hidden_states=text,
            pooled_projections=tensors["pooled_prompt_embeds"],
            timestep=sigmas,
            img_ids=image_ids(h, w, latents.device, latents.dtype),
            txt_ids=torch.zeros(text.shape[1], 3, device=latents.device, dtype=latents.dtype),
            guidance=guidance,
            return_dict=False,
        )[0]
        return unpack_2x2(out, h, w)

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        z = latents / cfg.scaling_factor + (cfg.shift_factor or 0.0)
        return self.vae.decode(z, return_dict=False)[0]
