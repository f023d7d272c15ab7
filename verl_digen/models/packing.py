"""2x2 latent packing shared by FLUX and Qwen-Image (same layout as their diffusers pipelines)."""

from __future__ import annotations

import torch


def pack_2x2(latents: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H/2 * W/2, 4C) tokens."""
    b, c, h, w = latents.shape
    if h % 2 or w % 2:
        raise ValueError(f"packed models need even latent height/width, got {h}x{w}")
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_2x2(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Inverse of ``pack_2x2``: (B, H/2 * W/2, 4C) -> (B, C, H, W)."""
    b, _, d = tokens.shape
    x = tokens.view(b, height // 2, width // 2, d // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, d // 4, height, width)


def image_ids(height: int, width: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """FLUX positional ids of the packed grid: (H/2 * W/2, 3) with (0, row, col)."""
    ids = torch.zeros(height // 2, width // 2, 3)
    ids[..., 1] += torch.arange(height // 2)[:, None]
    ids[..., 2] += torch.arange(width // 2)[None, :]
    return ids.reshape(-1, 3).to(device=device, dtype=dtype)
