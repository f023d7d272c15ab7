"""One entry point to get a model by name: tiny random weights (tests, CPU default) or real weights."""

from __future__ import annotations

from typing import Any

import torch

from verl_digen import dtypes
from verl_digen.models.adapter import DiffusersAdapter
from verl_digen.models.arch import MODEL_REGISTRY, canonical_arch
from verl_digen.models.loading import load_pretrained
from verl_digen.models.tiny import build_tiny


def known_archs() -> list[str]:
    """Canonical architecture names."""
    return sorted(MODEL_REGISTRY)


def build_tiny_model(
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
    """Tiny random-weight ``arch`` (same seed, same weights). See ``tiny.build_tiny``."""
    return build_tiny(
        canonical_arch(arch),
        seed=seed,
        dtype=dtype,
        device=device,
        latent_size=latent_size,
        num_frames=num_frames,
        guidance_embeds=guidance_embeds,
        latent_width=latent_width,
    )


def build_model(
    arch: str,
    *,
    pretrained: str | None = None,
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    latent_size: int | None = None,
    num_frames: int | None = None,
    latent_width: int | None = None,
    **kwargs: Any,
) -> DiffusersAdapter:
    """``pretrained=None`` (or "tiny") builds the tiny model; otherwise loads ``pretrained`` (local path
    or cached hub id) with ``load_pretrained`` (``kwargs``: height, width, text_encoders, ...).
    ``latent_size`` / ``latent_width`` are the latent height / width in both cases (width None: square;
    pixels = the VAE's spatial compression x latent for real weights, e.g. 8 for FLUX, 16 for Wan2.2);
    ``num_frames`` counts latent frames for tiny models and pixel frames (4k + 1) for real weights.
    ``dtype`` may be a torch dtype or a config string ("float32", "bf16", ...)."""
    arch = canonical_arch(arch)
    dtype = parse_dtype(dtype)
    if pretrained is None or pretrained == "tiny":
        return build_tiny_model(
            arch,
            seed=seed,
            dtype=dtype,
            device=device,
            latent_size=latent_size,
            latent_width=latent_width,
            num_frames=num_frames or 3,
            **kwargs,
        )
    return load_pretrained(arch, pretrained, dtype, device, num_frames=num_frames, latent_size=latent_size,
                           latent_width=latent_width, **kwargs)


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from a dtype or any accepted spelling (``verl_digen.dtypes``)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    return getattr(torch, dtypes.canonical(dtype))
