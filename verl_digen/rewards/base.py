"""The reward interface shared by offline rewards, neural reward models and the combiner.

A reward maps decoded pixels (and optionally the final latents) of a batch to one float per sample.
Keeping one calling convention lets the generator pool score any reward, or a weighted mix, without
knowing which kind it is.
"""

from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch
from PIL import Image

#: Every reward returns this dtype: scores feed group normalisation, where float64 costs nothing and
#: keeps hand-computed advantages exact in tests.
REWARD_DTYPE = torch.float64


@dataclass(frozen=True)
class Rows:
    """Which dataset rows a batch's samples come from: the ``split`` (``"train"``: data.train_files, ``"val"``:
    data.val_files) and each sample's row index there (its prompt id). A reward reading per-row columns
    (verl-omni's ``ground_truth``) looks them up by row, never by prompt text, which two rows may share."""

    split: str
    ids: tuple[int, ...]


class MissingRewardDependencyError(ImportError):
    """An optional package a reward needs is not installed (the message names the pip package)."""


class MissingRewardWeightsError(FileNotFoundError):
    """Reward-model weights are not on this machine (the message names the path or hub id)."""


def require(module: str, pip_name: str, reward: str) -> ModuleType:
    """Import an optional dependency, or raise a clear error telling how to install it.

    Real reward models pull heavy packages; importing them lazily keeps the offline rewards usable
    on machines that only have torch.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingRewardDependencyError(
            f"reward '{reward}' needs the Python package '{pip_name}' (import name '{module}'), which is "
            f"not installed. Install it with `pip install {pip_name}` or `pip install verl-digen[rewards]`."
        ) from err


def check_inputs(images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None = None) -> int:
    """Validate the reward inputs and return the batch size.

    Shapes are checked here once so that every reward fails the same way on a mis-shaped batch
    instead of silently broadcasting.
    """
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a torch.Tensor, got {type(images).__name__}")
    if images.ndim not in (4, 5) or images.shape[1] != 3:
        raise ValueError(
            f"images must have shape (B, 3, H, W) for images or (B, 3, F, H, W) for video, got {tuple(images.shape)}"
        )
    if not images.is_floating_point():
        raise TypeError(f"images must be a floating tensor with values in [0, 1], got {images.dtype}")
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings, one per sample, not a single string")
    batch = images.shape[0]
    if len(prompts) != batch:
        raise ValueError(f"got {len(prompts)} prompts for a batch of {batch} images")
    if latents is not None and (latents.ndim < 1 or latents.shape[0] != batch):
        raise ValueError(f"latents must have batch size {batch} first, got shape {tuple(latents.shape)}")
    return batch


def to_uint8_hwc(images: torch.Tensor) -> np.ndarray:
    """(N, 3, H, W) floats in [0, 1] -> (N, H, W, 3) uint8, the form encoders and OCR expect."""
    pixels = (images.detach().to(torch.float32).clamp(0, 1) * 255).round().to(torch.uint8)
    return pixels.permute(0, 2, 3, 1).cpu().numpy()


def to_pil(images: torch.Tensor) -> list[Image.Image]:
    """(N, 3, H, W) floats in [0, 1] -> RGB PIL images, for reward models with PIL preprocessing."""
    return [Image.fromarray(frame) for frame in to_uint8_hwc(images)]


class Reward(abc.ABC):
    """Base class: validate, unroll video into frames, score, average frames, return (B,) float64.

    Subclasses implement :meth:`score` on a 4-D batch of frames. Video (B, 3, F, H, W) is scored per
    frame (every ``frame_stride``-th frame) and the frame scores are averaged per sample, so that a
    reward written for images works on video unchanged. Rewards that look at the whole sample at once
    (latent statistics) set ``frame_wise = False`` and receive the raw tensors.
    The output is float64 on the device of ``images``; rewards are not differentiable (no_grad).
    """

    #: registry name, also the key under which :class:`MultiReward` reports this component
    name: str = "reward"
    #: score video frame by frame (True) or hand the 5-D tensor to :meth:`score` (False)
    frame_wise: bool = True
    #: score every k-th video frame (1 = all frames)
    frame_stride: int = 1
    #: :meth:`score` takes ``rows=`` (a :class:`Rows` or None): the reward reads its samples' dataset rows
    uses_rows: bool = False

    @abc.abstractmethod
    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None) -> torch.Tensor:
        """Score a batch: images (N, 3, H, W) in [0, 1] (or raw input if not frame_wise) -> (N,)."""

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None = None,
                 rows: Rows | None = None) -> torch.Tensor:
        """Score a batch of decoded images or videos; returns float64 of shape (B,). ``rows``: where each
        sample's prompt row is (passed on to a reward that ``uses_rows``)."""
        batch = check_inputs(images, prompts, latents)
        if rows is not None and len(rows.ids) != batch:
            raise ValueError(f"got {len(rows.ids)} row ids for a batch of {batch} samples")
        images = images.clamp(0, 1)
        if self.uses_rows:  # whole samples: a row belongs to a sample, not to a frame
            return self._as_output(self.score(images, list(prompts), latents, rows=rows), batch, images.device)
        if images.ndim == 5 and self.frame_wise:
            frames = images[:, :, :: self.frame_stride].transpose(1, 2)  # (B, F', 3, H, W)
            n_frames = frames.shape[1]
            flat = frames.reshape(batch * n_frames, *frames.shape[2:])
            flat_prompts = [p for p in prompts for _ in range(n_frames)]
            scores = self._as_output(self.score(flat, flat_prompts, None), batch * n_frames, images.device)
            return scores.view(batch, n_frames).mean(dim=1)
        return self._as_output(self.score(images, list(prompts), latents), batch, images.device)

    def _as_output(self, scores: torch.Tensor, n: int, device: torch.device) -> torch.Tensor:
        scores = torch.as_tensor(scores).to(device=device, dtype=REWARD_DTYPE).reshape(-1)
        if scores.shape[0] != n:
            raise RuntimeError(f"reward '{self.name}' returned {scores.shape[0]} scores for {n} inputs")
        return scores

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
