"""Rewards by name, so configs can say ``reward: pickscore`` or ``reward: {jpeg_compressibility: 1.0}``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from numbers import Real
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


def build_reward(name_or_spec: str | Mapping[str, Any] | Reward, **kwargs: Any) -> Reward:
    """Build a reward from a name, a spec, or pass an instance through.

    Accepted forms: ``"brightness"``; ``{"name": "random_cnn", "seed": 3}`` (other keys are
    constructor arguments, as are ``kwargs``); ``{"pickscore": 1.0, "ocr": 0.5}`` or any mapping
    without a ``name`` key -> :class:`MultiReward` with those weights.
    """
    if isinstance(name_or_spec, Reward):
        if kwargs:
            raise ValueError(f"cannot apply options {sorted(kwargs)} to an already built reward")
        return name_or_spec
    if isinstance(name_or_spec, Mapping):
        spec = dict(name_or_spec)
        if "name" in spec:
            return build_reward(spec.pop("name"), **{**spec, **kwargs})
        from .combine import MultiReward

        if not all(isinstance(v, (Real, Mapping)) and not isinstance(v, bool) for v in spec.values()):
            raise ValueError(f"a reward spec needs a 'name' key or must map reward names to weights: {spec}")
        return MultiReward(spec, **kwargs)
    if not isinstance(name_or_spec, str):
        raise TypeError(f"reward must be a name, a mapping or a Reward, got {type(name_or_spec).__name__}")
    if name_or_spec not in REWARDS:
        raise ValueError(f"unknown reward '{name_or_spec}'; known rewards: {', '.join(sorted(REWARDS))}")
    return REWARDS[name_or_spec](**kwargs)
