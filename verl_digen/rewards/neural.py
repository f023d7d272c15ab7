"""A seeded, frozen random CNN: a stand-in for a neural reward model.

It exercises the same path a real reward model takes (batched tensor forward on a device, resize to a
fixed input size, scalar head) without weights to download. The weights come from a private
``torch.Generator`` seeded by ``seed``, so the same seed gives the same reward function in every
process, and building the reward never touches the global RNG (placement-invariant sampling relies on
nobody else consuming it).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .base import Reward


class RandomCNN(Reward):
    """Two stride-2 3x3 convs with SiLU, global mean+std pooling, linear head -> one score per image.

    Images are resized to ``input_size`` x ``input_size`` first (as real reward models resize to their
    resolution) and mapped to [-1, 1]. Computed in ``dtype`` (float64 by default: exact batch invariance
    and determinism on CPU; the net is tiny). Video is scored per frame and averaged.
    """

    name = "random_cnn"

    def __init__(self, seed: int = 0, width: int = 8, input_size: int = 32, dtype: torch.dtype = torch.float64):
        if width < 1 or input_size < 4:
            raise ValueError(f"width must be >= 1 and input_size >= 4, got {width} and {input_size}")
        self.seed = int(seed)
        self.input_size = input_size
        self.dtype = dtype
        gen = torch.Generator().manual_seed(self.seed)

        def he(*shape: int) -> torch.Tensor:
            fan_in = math.prod(shape[1:])
            return torch.randn(*shape, generator=gen, dtype=torch.float64) * math.sqrt(2.0 / fan_in)

        self.params: dict[str, torch.Tensor] = {
            "conv1_w": he(width, 3, 3, 3),
            "conv1_b": 0.1 * torch.randn(width, generator=gen, dtype=torch.float64),
            "conv2_w": he(2 * width, width, 3, 3),
            "conv2_b": 0.1 * torch.randn(2 * width, generator=gen, dtype=torch.float64),
            "head_w": he(1, 4 * width),
            "head_b": torch.zeros(1, dtype=torch.float64),
        }
        self._cache: dict[tuple[torch.device, torch.dtype], dict[str, torch.Tensor]] = {}

    def _weights(self, device: torch.device) -> dict[str, torch.Tensor]:
        key = (device, self.dtype)
        if key not in self._cache:
            self._cache[key] = {k: v.to(device=device, dtype=self.dtype) for k, v in self.params.items()}
        return self._cache[key]

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None) -> torch.Tensor:
        w = self._weights(images.device)
        x = images.to(self.dtype) * 2.0 - 1.0
        if x.shape[-2:] != (self.input_size, self.input_size):
            x = F.interpolate(x, size=(self.input_size, self.input_size), mode="bilinear", align_corners=False)
        x = F.silu(F.conv2d(x, w["conv1_w"], w["conv1_b"], stride=2, padding=1))
        x = F.silu(F.conv2d(x, w["conv2_w"], w["conv2_b"], stride=2, padding=1))
        pooled = torch.cat([x.mean(dim=(2, 3)), x.std(dim=(2, 3), unbiased=False)], dim=1)
        return F.linear(pooled, w["head_w"], w["head_b"]).squeeze(1)
