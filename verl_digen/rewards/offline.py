"""Offline rewards: no weights, no downloads, usable on any machine and in CI.

JPEG (in)compressibility and colorfulness are the classic DDPO / FlowGRPO sanity rewards; brightness
and the latent mean are chosen because a tiny random-weight diffusion model can move them within a
few GRPO steps, which makes them the learnability probes of the RL math.
"""

from __future__ import annotations

import io

import torch
from PIL import Image

from .base import Reward, to_uint8_hwc

#: ITU-R BT.601 luma weights, the usual perceptual brightness of an RGB pixel
LUMA_WEIGHTS = (0.299, 0.587, 0.114)


def jpeg_size_kb(images: torch.Tensor, quality: int = 95) -> torch.Tensor:
    """JPEG-encoded size in kB (1 kB = 1000 bytes) of each (3, H, W) image, encoded with PIL."""
    sizes = []
    for frame in to_uint8_hwc(images):
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000.0)
    return torch.tensor(sizes, dtype=torch.float64)


class JpegCompressibility(Reward):
    """reward = -JPEG size in kB (DDPO convention): smaller files, i.e. simpler images, score higher."""

    name = "jpeg_compressibility"

    def __init__(self, quality: int = 95) -> None:
        if not 1 <= quality <= 100:
            raise ValueError(f"JPEG quality must be in [1, 100], got {quality}")
        self.quality = quality

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None) -> torch.Tensor:
        return -jpeg_size_kb(images, self.quality)


class JpegIncompressibility(JpegCompressibility):
    """reward = +JPEG size in kB: detailed, high-frequency images score higher."""

    name = "jpeg_incompressibility"

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None) -> torch.Tensor:
        return jpeg_size_kb(images, self.quality)


class Brightness(Reward):
    """Mean BT.601 luma of the image in [0, 1] (a constant gray image of value c scores c).

    Learnable by a tiny model through its VAE decoder, but less directly than ``latent_mean``.
    """

    name = "brightness"

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None) -> torch.Tensor:
        weights = torch.tensor(LUMA_WEIGHTS, dtype=torch.float64, device=images.device)
        luma = torch.einsum("nchw,c->nhw", images.to(torch.float64), weights)
        return luma.mean(dim=(1, 2))


class Colorfulness(Reward):
    """Hasler & Suesstrunk (2003) colorfulness on the 0-255 scale, so the paper's thresholds apply.

    rg = R - G, yb = (R + G) / 2 - B; C = sqrt(std_rg^2 + std_yb^2) + 0.3 * sqrt(mean_rg^2 + mean_yb^2),
    with population standard deviations over pixels. Any gray image scores exactly 0.
    """

    name = "colorfulness"

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None) -> torch.Tensor:
        pixels = images.to(torch.float64) * 255.0
        red, green, blue = pixels[:, 0], pixels[:, 1], pixels[:, 2]
        rg = (red - green).flatten(1)
        yb = (0.5 * (red + green) - blue).flatten(1)
        spread = torch.sqrt(rg.var(dim=1, unbiased=False) + yb.var(dim=1, unbiased=False))
        offset = torch.sqrt(rg.mean(dim=1) ** 2 + yb.mean(dim=1) ** 2)
        return spread + 0.3 * offset


class LatentMean(Reward):
    """Statistic of the final latents: their mean, or -|mean - target| when a target is given.

    This is the default *learnable* reward (see ``DEFAULT_LEARNABLE_REWARD``): the policy's velocity
    output moves the final latent mean directly (no decoder in between), the SDE noise spreads it
    within a group so GRPO gets a signal, and the plain mean is monotone, so a few steps of a tiny
    random-weight model raise it clearly. Works for any latent layout (image, video, packed tokens):
    the mean runs over all non-batch dims. Needs ``latents``; the images are ignored.
    """

    name = "latent_mean"
    frame_wise = False

    def __init__(self, target: float | None = None) -> None:
        self.target = target

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None) -> torch.Tensor:
        if latents is None:
            raise ValueError(f"reward '{self.name}' scores the final latents; call it with latents=...")
        mean = latents.detach().to(torch.float64).reshape(latents.shape[0], -1).mean(dim=1)
        if self.target is None:
            return mean
        return -(mean - self.target).abs()


class LatentTarget(LatentMean):
    """-|mean(latents) - target| (default target 1.0): a bounded latent reward peaking at the target."""

    name = "latent_target"

    def __init__(self, target: float = 1.0) -> None:
        super().__init__(target=target)
