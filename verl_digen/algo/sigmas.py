"""Noise schedules for rectified-flow samplers."""

from __future__ import annotations

import torch


def flow_sigmas(num_steps: int, shift: float = 1.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``num_steps + 1`` sigmas from 1 down to 0, time-shifted as SD3/FLUX do
    (sigma' = shift * s / (1 + (shift - 1) s)); shift 1 is the plain linear schedule."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    s = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    s = shift * s / (1 + (shift - 1) * s)
    return s.to(dtype)
