"""Rewards by name, so configs can say ``reward: pickscore`` (a mapping of several: :mod:`.combine`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import Reward
from .custom import CustomReward
from .external import HPSv2, ImageRewardScore, PickScore
from .neural import RandomCNN
from .ocr import OcrReward
from .offline import Brightness, Colorfulness, JpegCompressibility, JpegIncompressibility, LatentMean, LatentTarget

#: The reward a tiny random-weight model learns within a few GRPO steps: the final-latent mean moves
#: directly with the policy output (no decoder in between) and is monotone, so it cannot saturate.
DEFAULT_LEARNABLE_REWARD = "latent_mean"

#: name -> factory (a Reward subclass or any callable returning a Reward); extend with register_reward
REWARDS: dict[str, Callable[..., Reward]] = {
    "jpeg_compressibility": JpegCompressibility,
    "jpeg_incompressibility": JpegIncompressibility,
    "brightness": Brightness,
    "colorfulness": Colorfulness,
    "latent_mean": LatentMean,
    "latent_target": LatentTarget,
    "random_cnn": RandomCNN,
    "pickscore": PickScore,
    "hpsv2": HPSv2,
    "imagereward": ImageRewardScore,
    "ocr": OcrReward,
    "custom": CustomReward,  # custom_reward_function.path / .name (rewards/custom.py)
    "vlm_judge": lambda **kw: _vlm_judge(**kw),  # transformers imported only when used
}


def _vlm_judge(**kwargs: Any) -> Reward:
    from .vlm_judge import VLMJudge

    return VLMJudge(**kwargs)


def register_reward(name: str, factory: Callable[..., Reward], overwrite: bool = False) -> None:
    """Add a reward under ``name`` (a plugin's own reward model, say); refuses to shadow silently."""
    if name in REWARDS and not overwrite:
        raise ValueError(f"reward '{name}' is already registered; pass overwrite=True to replace it")
    REWARDS[name] = factory


def build_named(name: str, **kwargs: Any) -> Reward:
    """The reward registered under ``name``, built with ``kwargs`` (:func:`.combine.build_reward`
    takes every other form of a reward spec)."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward '{name}'; known rewards: {', '.join(sorted(REWARDS))}")
    return REWARDS[name](**kwargs)
