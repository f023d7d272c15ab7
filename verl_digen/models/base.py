"""The one interface every diffusion model adapter implements.

Conventions (shared by the whole algorithm layer):
- Rectified flow: x_sigma = (1 - sigma) * x0 + sigma * noise, sigma in [0, 1]; the model predicts the
  velocity v = noise - x0, and a denoising step moves sigma down (dt = sigma_next - sigma < 0).
- Latents are *unpacked*: (B, C, H, W) for images, (B, C, F, H, W) for video. Adapters pack/unpack
  internally when the transformer wants tokens (FLUX, Qwen-Image).
- ``sigmas`` is a per-row vector of shape (B,): rows of one batch may sit at different timesteps. That
  is what timestep-parallel training (TSP) relies on.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class Conditioning:
    """Per-row prompt conditioning. Every tensor has the batch on dim 0; ``negative`` (same keys,
    same rows) is the unconditional branch used by classifier-free guidance, when the model has one."""

    tensors: dict[str, torch.Tensor]
    negative: dict[str, torch.Tensor] | None = None
    extras: dict[str, object] = field(default_factory=dict)  # non-batched info (e.g. shapes)

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0]

    def _map(self, fn) -> Conditioning:
        neg = None if self.negative is None else {k: fn(v) for k, v in self.negative.items()}
        return Conditioning({k: fn(v) for k, v in self.tensors.items()}, neg, dict(self.extras))

    def index(self, idx: torch.Tensor | list[int] | slice) -> Conditioning:
        """Rows ``idx`` (a slice, a list or a 1-D index tensor)."""
        if isinstance(idx, list):
            idx = torch.as_tensor(idx, dtype=torch.long)
        return self._map(lambda t: t[idx])

    def repeat_interleave(self, n: int) -> Conditioning:
        """Each row repeated ``n`` times in place (row i -> rows i*n .. i*n+n-1)."""
        return self._map(lambda t: t.repeat_interleave(n, dim=0))

    def to(self, device=None, dtype=None) -> Conditioning:
        """Floating tensors follow ``dtype``; integer/bool tensors (masks, ids) keep theirs."""

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype if t.is_floating_point() else None)

        return self._map(move)

    @staticmethod
    def cat(parts: list[Conditioning]) -> Conditioning:
        if not parts:
            raise ValueError("Conditioning.cat needs at least one part")
        keys = parts[0].tensors.keys()
        tensors = {k: torch.cat([p.tensors[k] for p in parts]) for k in keys}
        negative = None
        if parts[0].negative is not None:
            negative = {k: torch.cat([p.negative[k] for p in parts]) for k in parts[0].negative}
        return Conditioning(tensors, negative, dict(parts[0].extras))


class DiffusionModel(abc.ABC):
    """A diffusers transformer (the trained policy) plus what is needed to sample from it."""

    #: architecture name as used in configs (``model.arch``; the registry in arch.py lists them)
    arch: str
    #: the trained module (LoRA adapters are injected here)
    transformer: nn.Module
    #: per-sample unpacked latent shape, (C, H, W) or (C, F, H, W)
    latent_shape: tuple[int, ...]
    #: True when guidance is a distilled embedding (FLUX.1-dev): no second CFG branch
    guidance_distilled: bool = False

    @abc.abstractmethod
    def velocity(
        self,
        latents: torch.Tensor,
        sigmas: torch.Tensor,
        cond: Conditioning,
        guidance_scale: float = 1.0,
    ) -> torch.Tensor:
        """Velocity for each row at its own sigma. With ``guidance_scale > 1`` and a non-distilled
        model, classifier-free guidance uses ``cond.negative``. Output has the shape of ``latents``."""

    @abc.abstractmethod
    def encode_prompts(self, prompts: list[str]) -> Conditioning:
        """Text conditioning for each prompt (real text encoders or deterministic tiny embeddings)."""

    @abc.abstractmethod
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Pixels in [0, 1]: (B, 3, H, W) for images, (B, 3, F, H, W) for video."""

    @property
    def dtype(self) -> torch.dtype:
        return next(self.transformer.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device
