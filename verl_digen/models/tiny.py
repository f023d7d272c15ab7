"""Tiny random-weight versions of every architecture (tests, CPU default run, benchmarks).

Each is the real diffusers transformer class at a small config (~40-90k parameters) with a tiny VAE
of the architecture's own family, so every adapter code path (packing, masks, RoPE ids, guidance
embeddings, VAE scaling) runs for real. Weights depend only on ``seed``: they are drawn in float32
under a forked RNG (the caller's global RNG is untouched) and then cast, so the float32 and float64
tiny models of one seed hold the same values.

Video VAEs: Wan uses a tiny ``AutoencoderKLWan`` without temporal compression (F latent frames ->
F frames); HunyuanVideo uses a tiny ``AutoencoderKLHunyuanVideo``, whose causal 3-D VAE only supports
4x temporal compression (F latent frames -> 4(F-1)+1 frames).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import diffusers
import torch
from torch import nn

from verl_digen.models.adapter import DiffusersAdapter
from verl_digen.models.conditioning.hashed import HashedPromptEncoder
from verl_digen.models.flux import FluxModel
from verl_digen.models.hunyuan_video import HunyuanVideoModel
from verl_digen.models.qwen_image import QwenImageModel
from verl_digen.models.sd3 import SD3Model
from verl_digen.models.wan import WanModel

TINY_TEXT_LEN = 8  # tokens per prompt for hashed embeddings
TINY_TEXT_DIM = 32
TINY_POOLED_DIM = 32
TINY_LATENT_CHANNELS = 4


def _image_vae(scaling: float, shift: float) -> nn.Module:
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


def _wan_family_vae(cls_name: str) -> nn.Module:
    cls = getattr(diffusers, cls_name)
    return cls(
        base_dim=8,
        z_dim=TINY_LATENT_CHANNELS,
        dim_mult=[1, 2],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[False],
        latents_mean=[0.1, -0.1, 0.0, 0.2],
        latents_std=[1.0, 0.8, 1.2, 1.1],
    )


def _hunyuan_vae() -> nn.Module:
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


def cast_module(module: nn.Module, dtype: torch.dtype, device: torch.device | str = "cpu") -> nn.Module:
    """Cast like ``from_pretrained(torch_dtype=...)`` does: everything to ``dtype``, except that in
    half precision a diffusers model's ``_keep_in_fp32_modules`` (Wan's norms/time embedder) stay float32.
    Bypasses ``ModelMixin.to``, which warns on every such cast."""
    nn.Module.to(module, device=device, dtype=dtype)
    keep = getattr(module, "_keep_in_fp32_modules", None) or []
    if dtype in (torch.float16, torch.bfloat16) and keep:
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if t.is_floating_point() and any(k in name.split(".") for k in keep):
                t.data = t.data.to(torch.float32)
    return module


@dataclass(frozen=True)
class TinySpec:
    """How to build one tiny architecture."""

    adapter: type[DiffusersAdapter]
    transformer_class: str
    transformer_kwargs: dict[str, Any]
    vae_factory: Any
    pooled: bool
    video: bool = False


TINY_SPECS: dict[str, TinySpec] = {
    "flux": TinySpec(
        FluxModel,
        "FluxTransformer2DModel",
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
        lambda: _image_vae(0.3611, 0.1159),
        pooled=True,
    ),
    "sd3": TinySpec(
        SD3Model,
        "SD3Transformer2DModel",
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
        lambda: _image_vae(1.5305, 0.0609),
        pooled=True,
    ),
    "qwen_image": TinySpec(
        QwenImageModel,
        "QwenImageTransformer2DModel",
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
        lambda: _wan_family_vae("AutoencoderKLQwenImage"),
        pooled=False,
    ),
    "wan": TinySpec(
        WanModel,
        "WanTransformer3DModel",
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
        lambda: _wan_family_vae("AutoencoderKLWan"),
        pooled=False,
        video=True,
    ),
    "hunyuan_video": TinySpec(
        HunyuanVideoModel,
        "HunyuanVideoTransformer3DModel",
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
        _hunyuan_vae,
        pooled=True,
        video=True,
    ),
}


def tiny_prompt_encoder(arch: str) -> HashedPromptEncoder:
    """The hashed prompt encoder matching the tiny config of ``arch``."""
    spec = TINY_SPECS[arch]
    return HashedPromptEncoder(
        TINY_TEXT_LEN, TINY_TEXT_DIM, TINY_POOLED_DIM if spec.pooled else None, salt=f"tiny-{arch}"
    )


def tiny_components(arch: str, seed: int = 0, guidance_embeds: bool | None = None) -> tuple[nn.Module, nn.Module]:
    """(transformer, vae) of the tiny ``arch`` in float32, seeded, without touching the global RNG."""
    if arch not in TINY_SPECS:
        raise ValueError(f"unknown arch {arch!r}; known: {sorted(TINY_SPECS)}")
    spec = TINY_SPECS[arch]
    kwargs = dict(spec.transformer_kwargs)
    if guidance_embeds is not None:
        if "guidance_embeds" not in kwargs:
            raise ValueError(f"{arch} has no guidance embedding switch")
        kwargs["guidance_embeds"] = guidance_embeds
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = getattr(diffusers, spec.transformer_class)(**kwargs)
        vae = spec.vae_factory()
    return transformer.eval(), vae.eval().requires_grad_(False)


def build_tiny(
    arch: str,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    latent_size: int | None = None,
    num_frames: int = 3,
    guidance_embeds: bool | None = None,
) -> DiffusersAdapter:
    """A tiny random-weight model of ``arch``; ``latent_size`` is H = W of the latent (default 32 for
    images, 16 for video), ``num_frames`` the latent frame count for video. ``guidance_embeds``
    overrides the distilled-guidance switch where the class has one (FLUX defaults to True like
    FLUX.1-dev; False gives an undistilled FLUX that uses real CFG)."""
    if latent_size is None:
        latent_size = 16 if TINY_SPECS[arch].video else 32
    if latent_size <= 0 or latent_size % 2:
        raise ValueError(f"latent_size must be a positive even number, got {latent_size}")
    transformer, vae = tiny_components(arch, seed, guidance_embeds)
    spec = TINY_SPECS[arch]
    transformer = cast_module(transformer, dtype, device)
    vae = cast_module(vae, dtype, device)
    shape = (
        (TINY_LATENT_CHANNELS, num_frames, latent_size, latent_size)
        if spec.video
        else (TINY_LATENT_CHANNELS, latent_size, latent_size)
    )
    return spec.adapter(transformer, vae, tiny_prompt_encoder(arch), shape)
