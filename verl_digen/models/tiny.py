"""Tiny random-weight versions of every architecture (tests, CPU default run, benchmarks).

Each is the real diffusers transformer class (the adapter's ``pretrained.transformer_class``) at the
adapter's ``tiny`` config (~40-90k parameters) with a tiny VAE of the architecture's own family, so
every adapter code path (packing, masks, RoPE ids, guidance embeddings, VAE scaling) runs for real.
Weights depend only on ``seed``: they are drawn in float32 under a forked RNG (the caller's global RNG
is untouched) and then cast, so the float32 and float64 tiny models of one seed hold the same values.

Each adapter's ``tiny.vae`` says how its tiny VAE compresses (Wan: F latent frames -> F frames;
HunyuanVideo's causal 3-D VAE only supports 4x temporal compression: F -> 4(F-1)+1 frames).
"""

from __future__ import annotations

import diffusers
import torch
from torch import nn

from verl_digen.models.adapter import DiffusersAdapter
from verl_digen.models.arch import MODEL_REGISTRY, canonical_arch
from verl_digen.models.conditioning.hashed import HashedPromptEncoder
from verl_digen.models.spec import (  # noqa: F401  (re-exported: config/memory.py reads TINY_TEXT_LEN)
    TINY_LATENT_CHANNELS,
    TINY_POOLED_DIM,
    TINY_TEXT_DIM,
    TINY_TEXT_LEN,
)


def cast_module(module: nn.Module, dtype: torch.dtype, device: torch.device | str = "cpu") -> nn.Module:
    """Cast like ``from_pretrained(torch_dtype=...)`` does: everything to ``dtype``, except that in
    half precision a diffusers model's ``_keep_in_fp32_modules`` (Wan's norms/time embedder) stay float32.
    The kept tensors keep their float32 values, never rounded through ``dtype`` on the way (as a checkpoint
    loaded into them would): the trainer's float32 master hands them over unrounded (weight sync, TAG's
    generation copy), so a generator built here must hold the same values.
    Bypasses ``ModelMixin.to``, which warns on every such cast."""
    keep = getattr(module, "_keep_in_fp32_modules", None) or []
    kept: dict[str, torch.Tensor] = {}
    if dtype in (torch.float16, torch.bfloat16) and keep:
        kept = {name: t.data for name, t in [*module.named_parameters(), *module.named_buffers()]
                if t.is_floating_point() and any(k in name.split(".") for k in keep)}
    nn.Module.to(module, device=device, dtype=dtype)
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if name in kept:
            t.data = kept[name].to(device=device, dtype=torch.float32)
    return module


def tiny_prompt_encoder(arch: str) -> HashedPromptEncoder:
    """The hashed prompt encoder matching the tiny config of ``arch``."""
    cls = MODEL_REGISTRY[canonical_arch(arch)]
    text_dim, pooled_dim = cls.prompt_dims(cls.tiny.transformer_kwargs)
    return HashedPromptEncoder(TINY_TEXT_LEN, text_dim, pooled_dim, salt=f"tiny-{cls.arch}")


def tiny_components(arch: str, seed: int = 0, guidance_embeds: bool | None = None) -> tuple[nn.Module, nn.Module]:
    """(transformer, vae) of the tiny ``arch`` in float32, seeded, without touching the global RNG."""
    cls = MODEL_REGISTRY[canonical_arch(arch)]
    kwargs = dict(cls.tiny.transformer_kwargs)
    if guidance_embeds is not None:
        if "guidance_embeds" not in kwargs:
            raise ValueError(f"{cls.arch} has no guidance embedding switch")
        kwargs["guidance_embeds"] = guidance_embeds
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = getattr(diffusers, cls.pretrained.transformer_class)(**kwargs)
        vae = cls.tiny.vae()
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
    latent_width: int | None = None,
) -> DiffusersAdapter:
    """A tiny random-weight model of ``arch``; ``latent_size`` is the latent height (default 32 for
    images, 16 for video), ``latent_width`` its width (default: ``latent_size``, a square),
    ``num_frames`` the latent frame count for video. ``guidance_embeds``
    overrides the distilled-guidance switch where the class has one (FLUX defaults to True like
    FLUX.1-dev; False gives an undistilled FLUX that uses real CFG)."""
    cls = MODEL_REGISTRY[canonical_arch(arch)]
    video = cls.latent_ndim == 5
    if latent_size is None:
        latent_size = 16 if video else 32
    latent_width = latent_size if latent_width is None else latent_width
    for name, side in (("latent_size", latent_size), ("latent_width", latent_width)):
        if side <= 0 or side % 2:
            raise ValueError(f"{name} must be a positive even number, got {side}")
    transformer, vae = tiny_components(cls.arch, seed, guidance_embeds)
    transformer = cast_module(transformer, dtype, device)
    vae = cast_module(vae, dtype, device)
    side = (latent_size, latent_width)
    shape = (TINY_LATENT_CHANNELS, num_frames, *side) if video else (TINY_LATENT_CHANNELS, *side)
    return cls(transformer, vae, tiny_prompt_encoder(cls.arch), shape)
