"""The GRPO policy loss: a PPO clipped surrogate per (sample, trained step), plus optional KL.

The loss of a global step is a *sum* of per-row terms scaled by one constant (1 / total rows of the
step), all under one frozen policy snapshot. Gradients can therefore be accumulated over micro-batches
and over timestep chunks in any order and grouping: the property GAP, TSP and TAG rely on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from verl_digen.defaults import CLIP_RANGE

#: the per-row surrogate (verl-omni's ``diffusion_loss.loss_mode`` names): the PPO clip (``flow_grpo``, also
#: DanceGRPO's and CPS's), GRPO-Guard's normalized-ratio clip (algo/grpo_guard.py), Flow-DPPO's KL mask
#: (algo/flow_dppo.py). The last two also read the old policy's transition mean (``needs_old_mean``).
#: ``diffusion_nft``: DiffusionNFT's forward-process loss (algo/diffusion_nft.py; its settings in ``nft``).
LOSS_MODES = ("flow_grpo", "grpo_guard", "flow_dppo", "diffusion_nft")


@dataclass(frozen=True)
class LossConfig:
    """Clip range of the importance ratio and KL coefficient (Flow-GRPO: 1e-4 and 0.04)."""

    clip_range: float = CLIP_RANGE
    kl_coef: float = 0.0
    #: each row's KL times its own |dt| = |sigma - sigma_next|: verl-omni's Flow-GRPO KL, which divides the
    #: squared mean gap by 2 std_t^2 where the step's real variance is std_t^2 |dt| (off: the Gaussian KL)
    kl_dt_weighted: bool = False
    #: the ratio's old log-prob is the trainer's own (its weights at the start of the step), not the rollout's.
    #: Until the step's first optimizer step that is the loss pass's log-prob, detached: the same number a
    #: separate no-grad pass would give, without the pass; after a mini-batch's optimizer step it is the
    #: no-grad pass's of the step's weights (``policy_loss``'s ``recomputed``). The rollout's log-prob is then
    #: only compared (``LossTerms.rollout_diff``).
    recompute_old_log_prob: bool = False
    mode: str = "flow_grpo"  # one of LOSS_MODES
    #: flow_dppo: a row whose per-element KL(new || old) of the transition reaches this is masked when its
    #: update moves further from the old policy (verl-omni's ``kl_mask_threshold``)
    kl_mask_threshold: float = 1e-5
    #: flow_dppo: the KL divides the squared mean gap by 2 std^2 (the Gaussian KL); off: by 2 (verl-omni's
    #: ``add_kl_coefficient``)
    add_kl_coefficient: bool = True
    #: diffusion_nft: mix_beta, adv_clip_max, adv_mode and the old copy's schedule (``kl_coef`` is its
    #: ``ref_kl_coef``: the weight of the per-row velocity MSE to the reference policy)
    nft: Any = None  # diffusion_nft.NFTConfig (typed loosely: that module imports this one)

    @property
    def needs_old_mean(self) -> bool:
        """Whether the loss reads the old policy's transition mean (the step's starting weights')."""
        return self.mode in ("grpo_guard", "flow_dppo")

    def __post_init__(self) -> None:
        if self.mode not in LOSS_MODES:
            raise ValueError(f"loss mode must be one of {', '.join(LOSS_MODES)}, got {self.mode!r}")
        if not self.kl_mask_threshold >= 0:
            raise ValueError(f"kl_mask_threshold must be >= 0, got {self.kl_mask_threshold}")
        if not self.clip_range > 0:
            raise ValueError(f"clip_range must be > 0, got {self.clip_range}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if (self.mode == "diffusion_nft") != (self.nft is not None):
            raise ValueError("the diffusion_nft loss mode takes its settings in nft (and only it does)")


@dataclass
class LossTerms:
    """Summed loss of some rows (already scaled) and per-row diagnostics for metrics."""

    loss: torch.Tensor
    ratio: torch.Tensor
    clipped: torch.Tensor
    approx_kl: torch.Tensor
    kl: torch.Tensor | None
    rollout_diff: torch.Tensor | None = None  # |rollout log-prob - recomputed| per row (recompute only)


def ratio_reference(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, cfg: LossConfig, recomputed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The old log-prob the ratio is taken against, and |rollout - recomputed| when it is the trainer's own."""
    if not cfg.recompute_old_log_prob:
        return old_log_prob, None
    recomputed = log_prob.detach() if recomputed is None else recomputed
    return recomputed, (old_log_prob - recomputed).abs()


def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    cfg: LossConfig,
    scale: float,
    kl: torch.Tensor | None = None,
    recomputed: torch.Tensor | None = None,
) -> LossTerms:
    """Sum over rows of max(-A r, -A clip(r)) (+ kl_coef * KL), times ``scale``.

    ``scale`` is 1 / (number of rows in the whole global step) so that accumulated micro-batch
    gradients equal the full-batch mean gradient. ``old_log_prob`` is the rollout's; with
    ``cfg.recompute_old_log_prob`` the ratio is taken against the trainer's own and the rollout's is only
    compared with it: ``recomputed`` when given (the step's weights, once an optimizer step has moved the
    trained ones), else ``log_prob`` detached.
    """
    if not (log_prob.shape == old_log_prob.shape == advantages.shape):
        raise ValueError(
            "log_prob, old_log_prob and advantages must have one shape, got "
            f"{tuple(log_prob.shape)}, {tuple(old_log_prob.shape)}, {tuple(advantages.shape)}"
        )
    old_log_prob, rollout_diff = ratio_reference(log_prob, old_log_prob, cfg, recomputed)
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cfg.clip_range, 1.0 + cfg.clip_range)
    per_row = torch.maximum(unclipped, clipped)
    if kl is not None and cfg.kl_coef > 0:
        per_row = per_row + cfg.kl_coef * kl
    with torch.no_grad():
        was_clipped = (clipped > unclipped).to(log_prob.dtype)
        # k3 estimator of KL(old || new), as verl reports it
        approx_kl = torch.exp(-log_ratio) - 1 + log_ratio
    return LossTerms(
        loss=per_row.sum() * scale,
        ratio=ratio.detach(),
        clipped=was_clipped,
        approx_kl=approx_kl.detach(),
        kl=None if kl is None else kl.detach(),
        rollout_diff=rollout_diff,
    )
