"""Flow-DPPO's loss (``algorithm.name=flow_dppo``; verl-omni's ``diffusion_loss.loss_mode=flow_dppo``).

Flow-DPPO (Ping et al., "Divergence Proximal Policy Optimization for Flow Matching Models", arXiv
2606.11025) replaces the PPO ratio clip, a noisy one-sample proxy for the policy divergence, by the exact
divergence: each SDE step is a Gaussian N(mu, s^2) of a fixed std, so KL(new || old) is |mu - mu_old|^2 /
(2 s^2). A row's update is dropped only when that divergence is past the threshold *and* the update moves
further away (the ratio grows on a positive advantage or shrinks on a negative one). Per (sample,
trained step) row, with the log-prob averaged over the latent's D elements (``sde``'s convention):

    r    = exp(log p_theta(x_next) - log p_old(x_next))
    kl   = |mu - mu_old|^2 / (2 D s^2)        (``add_kl_coefficient=false``: |mu - mu_old|^2 / (2 D))
    drop = kl >= delta and ((r > 1 and A > 0) or (r < 1 and A < 0))
    loss = 0 if drop else -A r

summed over rows and scaled by 1 / (rows of the step), as ``loss.policy_loss`` is. delta is
``actor.kl_mask_threshold`` (verl-omni's ``kl_mask_threshold``, 1e-5), the KL's form
``actor.add_kl_coefficient`` (verl-omni's ``add_kl_coefficient``); s is the step's std (verl-omni's
``std_dev_t * sqrt_dt``). There is no ratio clip: ``actor.clip_ratio`` is not read. Rows without noise
(s = 0: the last CPS step) have no density and contribute 0. mu_old is the step's starting weights' mean,
as for GRPO-Guard (algo/grpo_guard.py); with one optimizer step per global step kl is 0 and nothing is
dropped, as in verl-omni.

Where verl-omni differs from the paper: the paper's KL is over the whole latent (a sum over its D
elements); verl-omni averages over them, which makes the threshold independent of the latent's size.
verl-digen keeps verl-omni's mean, so its default threshold and a converted run's mean the same thing.
verl-omni does not clamp the advantages in this loss; verl-digen's ``algorithm.adv_clip`` clamps them when
they are computed (set it to null for verl-omni's unclamped advantages).
"""

from __future__ import annotations

import torch

from verl_digen.algo.grpo_guard import mean_gap_sq, per_row_std
from verl_digen.algo.loss import LossConfig, LossTerms, ratio_reference


def flow_dppo_rows(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mean: torch.Tensor,
    old_mean: torch.Tensor,
    std: torch.Tensor,
    kl_mask_threshold: float,
    add_kl_coefficient: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row Flow-DPPO loss, ratio, whether the row was dropped (1.0 / 0.0) and its KL(new || old), each (R,)."""
    std = per_row_std(std, log_prob.shape[0])
    noisy = std > 0
    ratio = torch.exp(log_prob - old_log_prob)
    gap = mean_gap_sq(mean, old_mean).detach()
    kl = gap / (2 * torch.where(noisy, std, torch.ones_like(std)) ** 2) if add_kl_coefficient else gap / 2
    away = ((ratio > 1) & (advantages > 0)) | ((ratio < 1) & (advantages < 0))
    drop = (kl >= kl_mask_threshold) & away & noisy
    per_row = torch.where(drop | ~noisy, torch.zeros_like(ratio), -advantages * ratio)
    return per_row, ratio, drop.to(log_prob.dtype), kl


def flow_dppo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mean: torch.Tensor,
    old_mean: torch.Tensor,
    std: torch.Tensor,
    cfg: LossConfig,
    scale: float,
    kl: torch.Tensor | None = None,
    recomputed: torch.Tensor | None = None,
) -> LossTerms:
    """Sum over rows of the Flow-DPPO loss (+ kl_coef * KL to the reference), times ``scale``;
    ``old_log_prob`` / ``recomputed`` as in ``loss.policy_loss``. ``LossTerms.clipped`` holds the dropped rows."""
    old_log_prob, rollout_diff = ratio_reference(log_prob, old_log_prob, cfg, recomputed)
    per_row, ratio, dropped, _ = flow_dppo_rows(log_prob, old_log_prob, advantages, mean, old_mean, std,
                                                cfg.kl_mask_threshold, cfg.add_kl_coefficient)
    if kl is not None and cfg.kl_coef > 0:
        per_row = per_row + cfg.kl_coef * kl
    with torch.no_grad():
        log_ratio = log_prob - old_log_prob
        approx_kl = torch.exp(-log_ratio) - 1 + log_ratio
    return LossTerms(loss=per_row.sum() * scale, ratio=ratio.detach(), clipped=dropped,
                     approx_kl=approx_kl.detach(), kl=None if kl is None else kl.detach(), rollout_diff=rollout_diff)
