"""Rewards by name, so configs can say ``reward: pickscore`` (a mapping of several: :mod:`.combine`).
``REWARDS`` is a :class:`verl_digen.registry.Registry`, as models, TAG policies and sync backends are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verl_digen.defaults import DEFAULT_LEARNABLE_REWARD  # noqa: F401 (re-exported: its home for callers)
from verl_digen.registry import Registry

from .base import Reward
from .custom import CustomReward
from .external import HPSv2, ImageRewardScore, PickScore
from .neural import RandomCNN
from .ocr import OcrReward
from .offline import Brightness, Colorfulness, JpegCompressibility, JpegIncompressibility, LatentMean, LatentTarget

#: name -> factory (a Reward subclass or any callable returning a Reward); extend with register_reward
REWARDS: Registry[Callable[..., Reward]] = Registry("reward")


def _vlm_judge(**kwargs: Any) -> Reward:
    """The VLM judge (transformers is imported only when it is used)."""
    from .vlm_judge import VLMJudge

    return VLMJudge(**kwargs)


def register_reward(name: str, factory: Callable[..., Reward] | None = None, overwrite: bool = False) -> Any:
    """Add a reward under ``name`` (a plugin's own reward model, say): ``register_reward("mine", Mine)``, or
    ``@register_reward("mine")`` on the class; a different reward under a taken name raises."""
    return REWARDS.register(name, factory, overwrite=overwrite)


for _name, _factory in {
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
    "vlm_judge": _vlm_judge,
}.items():
    register_reward(_name, _factory)


def build_named(name: str, **kwargs: Any) -> Reward:
    """The reward registered under ``name``, built with ``kwargs`` (:func:`.combine.build_reward`
    takes every other form of a reward spec)."""
    return REWARDS.lookup(name)(**kwargs)
