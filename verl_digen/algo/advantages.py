"""GRPO group advantages.

A sample's advantage is its reward relative to the other samples of its prompt group:
(r - mean_group) / (std + eps), where std is the group's or the whole batch's, then clipped. A group
must be complete before any of its samples can be trained; GAP exists to complete groups early.

The std is the population one (divide by n, as flow_grpo's ``np.std``) or the unbiased one (n - 1, as
verl-omni's ``torch.std``): at a group of 8 the second gives advantages 1.07x smaller, at 4 1.15x.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verl_digen.defaults import STD_ESTIMATORS, STD_SCOPES

MULTI_REWARD_MODES = ("sum_then_normalize", "normalize_then_sum")


@dataclass(frozen=True)
class AdvantageConfig:
    """Normalization scope, eps, clip bound, and group filtering options."""

    std_scope: str = "group"
    std_estimator: str = "population"  # or "unbiased" (n - 1)
    eps: float = 1e-4
    clip: float | None = 5.0
    drop_zero_groups: bool = False  # drop groups whose rewards are all equal (no learning signal)
    keep_extremes: int | None = None  # DanceGRPO best-of-N: keep top k/2 and bottom k/2 of each group


def _check(rewards: torch.Tensor, group_ids: torch.Tensor, cfg: AdvantageConfig) -> None:
    if cfg.std_scope not in STD_SCOPES:
        raise ValueError(f"unknown advantage std scope {cfg.std_scope!r}; expected one of {STD_SCOPES}")
    if cfg.std_estimator not in STD_ESTIMATORS:
        raise ValueError(f"unknown std estimator {cfg.std_estimator!r}; expected one of {STD_ESTIMATORS}")
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group ids must be 1-D of one length, got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if cfg.eps < 0 or (cfg.clip is not None and cfg.clip <= 0):
        raise ValueError(f"advantage eps must be >= 0 and clip > 0, got eps={cfg.eps}, clip={cfg.clip}")
    if cfg.keep_extremes is not None and (cfg.keep_extremes < 2 or cfg.keep_extremes % 2):
        raise ValueError(f"keep_extremes must be an even number >= 2, got {cfg.keep_extremes}")


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, cfg: AdvantageConfig = AdvantageConfig()
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages (B,) and a keep mask (B,) for rewards (B,) grouped by ``group_ids`` (B,).

    Dropped samples (zero-signal groups, non-extreme samples) get advantage 0 and keep=False.
    """
    _check(rewards, group_ids, cfg)
    rewards = rewards.to(torch.float64)
    adv = torch.zeros_like(rewards)
    keep = torch.ones_like(rewards, dtype=torch.bool)
    unbiased = cfg.std_estimator == "unbiased"
    batch_std = rewards.std(unbiased=unbiased) if rewards.numel() > 1 else rewards.new_tensor(0.0)
    for g in group_ids.unique():
        idx = (group_ids == g).nonzero().flatten()
        r = rewards[idx]
        if r.numel() < 2:
            raise ValueError(f"group {int(g)} has {r.numel()} sample; GRPO needs groups of size >= 2")
        std = r.std(unbiased=unbiased) if cfg.std_scope == "group" else batch_std
        denom = std + cfg.eps
        # a constant group has r - mean = 0: its advantage is 0, also with eps = 0 (not 0 / 0)
        # (a NaN reward still gives NaN, which the trainer's guard reports; it is not silently zeroed)
        adv[idx] = torch.zeros_like(r) if float(denom) == 0.0 else (r - r.mean()) / denom
        if cfg.drop_zero_groups and bool((r == r[0]).all()):
            keep[idx] = False
        if cfg.keep_extremes is not None and r.numel() > cfg.keep_extremes:
            order = r.argsort()
            half = cfg.keep_extremes // 2
            middle = order[half : r.numel() - half]
            keep[idx[middle]] = False
    if cfg.clip is not None:
        adv = adv.clamp(-cfg.clip, cfg.clip)
    return torch.where(keep, adv, torch.zeros_like(adv)), keep


def multi_reward_advantages(
    components: dict[str, torch.Tensor],
    weights: dict[str, float],
    group_ids: torch.Tensor,
    mode: str = "sum_then_normalize",
    cfg: AdvantageConfig = AdvantageConfig(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Several rewards: weighted sum then one normalization, or per-reward advantages then weighted sum."""
    if mode not in MULTI_REWARD_MODES:
        raise ValueError(f"unknown multi-reward mode {mode!r}; expected one of {MULTI_REWARD_MODES}")
    missing = set(weights) - set(components)
    if missing:
        raise ValueError(f"weights name rewards that were not computed: {sorted(missing)}")
    if mode == "sum_then_normalize":
        total = sum(w * components[name].to(torch.float64) for name, w in weights.items())
        return group_advantages(total, group_ids, cfg)
    adv_sum = None
    keep_all = None
    for name, w in weights.items():
        adv, keep = group_advantages(components[name], group_ids, cfg)
        adv_sum = w * adv if adv_sum is None else adv_sum + w * adv
        keep_all = keep if keep_all is None else keep_all & keep
    return torch.where(keep_all, adv_sum, torch.zeros_like(adv_sum)), keep_all
