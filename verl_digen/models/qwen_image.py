"""Qwen-Image (QwenImageTransformer2DModel): packed 2x2 tokens, ``img_shapes`` for its 3-D RoPE, a
text padding mask, and true CFG (optionally with the pipeline's norm rescaling)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from verl_digen import archs
from verl_digen.models.adapter import DiffusersAdapter
from verl_digen.models.conditioning.text import pad_tokens
from verl_digen.models.packing import pack_2x2, unpack_2x2
from verl_digen.models.spec import TINY_LATENT_CHANNELS, TINY_TEXT_DIM, TinySpec, tiny_wan_family_vae


class QwenImageModel(DiffusersAdapter):
    """Timestep convention: the transformer takes ``timestep = sigma`` (its projection scales by 1000;
    the pipeline passes ``t / 1000``).

    ``cfg_renorm``: the diffusers pipeline rescales the guided prediction so that each token keeps the
    norm of the conditional one. Off by default (plain ``v_neg + s (v_pos - v_neg)``, the contract);
    ``load_pretrained`` turns it on to match the released pipeline.
    """

    facts = archs.QWEN_IMAGE
    tiny = TinySpec(
        dict(
            patch_size=2,
            in_channels=4 * TINY_LATENT_CHANNELS,
            out_channels=TINY_LATENT_CHANNELS,
            num_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=TINY_TEXT_DIM,
            axes_dims_rope=(4, 6, 6),
        ),
        lambda: tiny_wan_family_vae("AutoencoderKLQwenImage"),
    )
    packed = True
    pretrained_init = {"cfg_renorm": True}

    def __init__(self, *args: Any, cfg_renorm: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cfg_renorm = cfg_renorm

    @classmethod
    def vae_factors(cls, vae: nn.Module | None) -> tuple[int, int]:
        if vae is None:
            return cls.facts.vae_factors
        return 2 ** len(vae.config.temperal_downsample), 1

    @classmethod
    def encode_with_pipeline(
        cls, pipeline: Any, prompts: list[str], *, device: Any, dtype: Any, max_sequence_length: int
    ) -> dict[str, torch.Tensor]:
        """Qwen-Image returns variable-length embeddings; padded to a fixed length so that micro-batches
        concatenate."""
        pe, mask = pipeline.encode_prompt(prompt=prompts, device=device, max_sequence_length=max_sequence_length)
        if mask is None:
            mask = torch.ones(pe.shape[:2], dtype=torch.long, device=pe.device)
        msl = max_sequence_length
        return {"prompt_embeds": pad_tokens(pe, msl), "prompt_mask": pad_tokens(mask.long(), msl)}

    def _forward(
        self, latents: torch.Tensor, sigmas: torch.Tensor, tensors: dict[str, torch.Tensor], guidance_scale: float
    ) -> torch.Tensor:
        b, _, h, w = latents.shape
        mask = tensors.get("prompt_mask")
        out = self.transformer(
            hidden_states=pack_2x2(latents),
            encoder_hidden_states=tensors["prompt_embeds"],
            encoder_hidden_states_mask=mask,
            timestep=sigmas,
            img_shapes=[[(1, h // 2, w // 2)]] * b,
            return_dict=False,
        )[0]
        return unpack_2x2(out, h, w)

    def _combine_cfg(self, v_pos: torch.Tensor, v_neg: torch.Tensor, scale: float) -> torch.Tensor:
        comb = super()._combine_cfg(v_pos, v_neg, scale)
        if not self.cfg_renorm:
            return comb
        h, w = comb.shape[-2:]
        pos_t, comb_t = pack_2x2(v_pos), pack_2x2(comb)
        ratio = pos_t.norm(dim=-1, keepdim=True) / comb_t.norm(dim=-1, keepdim=True)
        return unpack_2x2(comb_t * ratio, h, w)

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        z = latents.unsqueeze(2)  # the Qwen-Image VAE is a (single-frame) video VAE
        mean = torch.tensor(cfg.latents_mean, dtype=z.dtype, device=z.device).view(1, -1, 1, 1, 1)
        std = torch.tensor(cfg.latents_std, dtype=z.dtype, device=z.device).view(1, -1, 1, 1, 1)
        return self.vae.decode(z * std + mean, return_dict=False)[0][:, :, 0]
