"""Weighted multi-reward: one scalar for GRPO, plus the per-reward parts for per-reward advantages.

FlowGRPO-style multi-reward training either sums rewards before normalising or normalises each reward
within its group and sums the advantages; exposing ``components`` and ``weighted_sum`` supports both
without the algorithm layer knowing which rewards are inside.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from .base import REWARD_DTYPE, Reward, check_inputs


class MultiReward(Reward):
    """sum_k weight_k * reward_k(images, prompts, latents).

    ``weights`` maps a component name to a weight, or to ``{"weight": w, "name": registry_name,
    **kwargs}`` to configure it (``name`` defaults to the key, so one reward can appear twice under
    different keys). ``rewards`` may supply ready instances by key instead of building them.
    """

    name = "multi"
    frame_wise = False

    def __init__(
        self, weights: Mapping[str, float | Mapping[str, Any]], rewards: Mapping[str, Reward] | None = None
    ) -> None:
        from .registry import build_reward  # the registry builds MultiReward too

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
                self.rewards[key] = build_reward(options.pop("name", key), **options)
        if rewards:
            raise ValueError(f"instances given for rewards without a weight: {sorted(rewards)}")

    @torch.no_grad()
    def components(
        self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Each component's unweighted (B,) float64 scores, keyed like ``weights``."""
        check_inputs(images, prompts, latents)
        return {key: reward(images, prompts, latents) for key, reward in self.rewards.items()}

    def weighted_sum(self, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """sum_k weight_k * values[k]: combine components, or per-reward advantages, the same way."""
        missing = set(self.weights) - set(values)
        if missing:
            raise KeyError(f"missing reward components: {sorted(missing)}")
        return sum(self.weights[key] * values[key].to(REWARD_DTYPE) for key in self.weights)

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None) -> torch.Tensor:
        return self.weighted_sum(self.components(images, prompts, latents))

    def __repr__(self) -> str:
        return f"MultiReward({self.weights})"
