"""GRPO-Guard's loss (``algorithm.name=grpo_guard``; verl-omni's ``diffusion_loss.loss_mode=grpo_guard``).

GRPO-Guard (Wang et al., "Mitigating Implicit Over-Optimization in Flow Matching via Regulated Clipping",
arXiv 2510.22319) observes that FlowGRPO's importance ratio is biased low and has a step-dependent spread,
so the PPO clip misses over-confident positive updates. It keeps the PPO clip but on a normalized ratio
("RatioNorm") and reweights each step's gradient by 1 / dt. Per (sample, trained step) row, with the
transition N(mu, s^2) of the SDE (s = std_t sqrt(dt), the step's std: ``sde.transition``), mu_old the old
policy's mean, and the log-prob averaged over the latent's D elements (``sde``'s convention):

    log r   = log p_theta(x_next) - log p_old(x_next)     (E_old[log r] = -|mu - mu_old|^2 / (2 D s^2))
    bias    = |mu - mu_old|^2 / (2 D s^2)                 (the shift that brings the log-ratio's mean to 0)
    r_guard = exp((log r + bias) * s)                     (times s: the same spread at every step)
    loss    = max(-A r_guard, -A clip(r_guard, 1 - eps, 1 + eps)) / dt,   dt = sigma - sigma_next

summed over rows and scaled by 1 / (rows of the step), as ``loss.policy_loss`` is. ``eps`` is
``actor.clip_ratio`` (verl-omni's ``clip_ratio``). verl-omni's ``adv_clip_max`` clamp of A is verl-digen's
``algorithm.adv_clip``, applied once when the advantages are computed. Rows without noise (s = 0: the last
CPS step) have no density and contribute 0.

mu_old is the step's starting weights' mean (as verl-omni recomputes its ``old_prev_sample_mean`` with the
actor before the update): the loss pass's own mean, detached, until a mini-batch's optimizer step moves the
weights, then the kept starting weights' (``algo/tsp.py``). So with one optimizer step per global step the
bias is 0 and its gradient is too, exactly as in verl-omni.

Where verl-omni differs from the paper's per-step formula: verl-omni takes s and sqrt(dt) as the *batch
means* of ``std_dev_t`` and ``sqrt_dt`` of a micro-batch, which holds one timestep there, so they are that
step's values. verl-digen keeps them per row: TSP trains rows of several timesteps in one pass (docs/
architecture.md), and the per-row form equals verl-omni's on any batch of one timestep (the tests hold it
to 1e-10 in float64) while staying a sum of per-row terms, which GAP, TSP and TAG need.
"""

from __future__ import annotations

import torch

from verl_digen.algo.loss import LossConfig, LossTerms, ratio_reference


def mean_gap_sq(mean: torch.Tensor, old_mean: torch.Tensor) -> torch.Tensor:
    """|mu - mu_old|^2 / D per row: the squared mean gap averaged over the latent's elements."""
    return (mean - old_mean).pow(2).reshape(mean.shape[0], -1).mean(dim=1)


def per_row_std(std: torch.Tensor, rows: int) -> torch.Tensor:
    """The transition's std as one value per row ((R,) or (R, 1, ...) in; (R,) out)."""
    if std.numel() != rows:
        raise ValueError(f"the transition std must hold one value per row ({rows}), got shape {tuple(std.shape)}")
    return std.reshape(rows)


def grpo_guard_rows(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mean: torch.Tensor,
    old_mean: torch.Tensor,
    std: torch.Tensor,
    dt: torch.Tensor,
    clip_range: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row GRPO-Guard loss, its normalized ratio, and whether the clip bit (1.0 / 0.0), each (R,)."""
    rows = log_prob.shape[0]
    std = per_row_std(std, rows)
    noisy = std > 0
    s = torch.where(noisy, std, torch.ones_like(std))
    bias = mean_gap_sq(mean, old_mean) / (2 * s**2)
    ratio = torch.exp((log_prob - old_log_prob + bias) * s)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    per_row = torch.maximum(unclipped, clipped) / dt
    per_row = torch.where(noisy, per_row, torch.zeros_like(per_row))
    was_clipped = ((clipped > unclipped) & noisy).to(log_prob.dtype)
    return per_row, torch.where(noisy, ratio, torch.ones_like(ratio)), was_clipped


def grpo_guard_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mean: torch.Tensor,
    old_mean: torch.Tensor,
    std: torch.Tensor,
    dt: torch.Tensor,
    cfg: LossConfig,
    scale: float,
    kl: torch.Tensor | None = None,
    recomputed: torch.Tensor | None = None,
) -> LossTerms:
    """Sum over rows of the GRPO-Guard loss (+ kl_coef * KL to the reference), times ``scale``;
    ``old_log_prob`` / ``recomputed`` as in ``loss.policy_loss``."""
    old_log_prob, rollout_diff = ratio_reference(log_prob, old_log_prob, cfg, recomputed)
    per_row, ratio, was_clipped = grpo_guard_rows(log_prob, old_log_prob, advantages, mean, old_mean, std, dt,
                                                  cfg.clip_range)
    if kl is not None and cfg.kl_coef > 0:
        per_row = per_row + cfg.kl_coef * kl
    with torch.no_grad():
        log_ratio = log_prob - old_log_prob
        approx_kl = torch.exp(-log_ratio) - 1 + log_ratio
    return LossTerms(loss=per_row.sum() * scale, ratio=ratio.detach(), clipped=was_clipped,
                     approx_kl=approx_kl.detach(), kl=None if kl is None else kl.detach(), rollout_diff=rollout_diff)
