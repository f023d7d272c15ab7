"""Weighted multi-reward: one scalar for GRPO, plus the per-reward parts for per-reward advantages.

FlowGRPO-style multi-reward training either sums rewards before normalising or normalises each reward
within its group and sums the advantages; exposing ``components`` and ``weighted_sum`` supports both
without the algorithm layer knowing which rewards are inside.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Real
from typing import Any

import torch

from .base import REWARD_DTYPE, Reward, Rows, check_inputs
from .registry import build_named


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
        if not all(isinstance(v, (Real, Mapping)) and not isinstance(v, bool) for v in spec.values()):
            raise ValueError(f"a reward spec needs a 'name' key or must map reward names to weights: {spec}")
        return MultiReward(spec, **kwargs)
    if not isinstance(name_or_spec, str):
        raise TypeError(f"reward must be a name, a mapping or a Reward, got {type(name_or_spec).__name__}")
    return build_named(name_or_spec, **kwargs)


class MultiReward(Reward):
    """sum_k weight_k * reward_k(images, prompts, latents).

    ``weights`` maps a component name to a weight, or to ``{"weight": w, "name": registry_name,
    **kwargs}`` to configure it (``name`` defaults to the key, so one reward can appear twice under
    different keys). ``rewards`` may supply ready instances by key instead of building them.
    """

    name = "multi"
    frame_wise = False
    uses_rows = True  # passed on to the components that read rows

    def __init__(
        self, weights: Mapping[str, float | Mapping[str, Any]], rewards: Mapping[str, Reward] | None = None
    ) -> None:
        if not weights:
            raise ValueError("MultiReward needs at least one component reward")
        rewards = dict(rewards or {})
        self.weights: dict[str, float] = {}
        self.rewards: dict[str, Reward] = {}
        for key, spec in weights.items():
            options = dict(spec) if isinstance(spec, Mapping) else {"weight": spec}
            weight = float(options.pop("weight", 1.0))
            if not math.isfinite(weight):
                raise ValueError(f"weight of reward '{key}' must be finite, got {weight}")
            self.weights[key] = weight
            if key in rewards:
                if options:
                    raise ValueError(f"reward '{key}' was given as an instance and with options {options}")
                self.rewards[key] = rewards.pop(key)
            else:
                self.rewards[key] = build_named(options.pop("name", key), **options)
        if rewards:
            raise ValueError(f"instances given for rewards without a weight: {sorted(rewards)}")

    @torch.no_grad()
    def components(
        self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None = None, rows: Rows | None = None
    ) -> dict[str, torch.Tensor]:
        """Each component's unweighted (B,) float64 scores, keyed like ``weights``."""
        check_inputs(images, prompts, latents)
        return {key: reward(images, prompts, latents, rows=rows) for key, reward in self.rewards.items()}

    def weighted_sum(self, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """sum_k weight_k * values[k]: combine components, or per-reward advantages, the same way."""
        missing = set(self.weights) - set(values)
        if missing:
            raise KeyError(f"missing reward components: {sorted(missing)}")
        return sum(self.weights[key] * values[key].to(REWARD_DTYPE) for key in self.weights)

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None,
              rows: Rows | None = None) -> torch.Tensor:
        return self.weighted_sum(self.components(images, prompts, latents, rows=rows))

    def __repr__(self) -> str:
        return f"MultiReward({self.weights})"
