"""DiffusionNFT's loss maths (verl-omni's ``diffusion_loss.loss_mode=diffusion_nft``); not yet wired to a run.

DiffusionNFT (Zheng et al., "DiffusionNFT: Online Diffusion Reinforcement with Forward Process", arXiv
2509.16117) trains on the forward process: a clean sample x0 of the rollout is noised at a timestep t,
x_t = (1 - t) x0 + t eps, and the velocity v_theta(x_t, t) is pulled toward an implicit positive policy and
pushed from an implicit negative one, both mixtures of the trained velocity and a slowly moving "old"
copy v_old (its adapter is updated on a decay schedule; no log-probs, no SDE). Per (sample, t) row, with
every mean over the latent's D elements:

    r      = clamp(clamp(A, -c, c) / (2 c) + 1/2, 0, 1)      (the optimality probability; c = adv_clip_max)
    v+     = beta v_theta + (1 - beta) v_old                  v- = (1 + beta) v_old - beta v_theta
    x0+-   = x_t - t v+-                                      (the x0 each implicit policy predicts)
    w+-    = max(mean |x0+- - x0|, w_min)                     (adaptive weight, no gradient)
    loss   = c (r mean((x0+ - x0)^2) / w+ + (1 - r) mean((x0- - x0)^2) / w-) / beta
             + ref_kl_coef mean((v_theta - v_ref)^2)

summed over rows and scaled by 1 / (rows of the step) as the other losses are. Option names are
verl-omni's: ``mix_beta`` (beta), ``adaptive_weight_min`` (w_min), ``adv_clip_max`` (c), ``ref_kl_coef``,
``adv_mode`` (``continuous``, or ``positive_only`` / ``negative_only`` / ``one_only`` / ``binary``, which
reshape A before the map to r). A are the group advantages (``advantages.py``).

Where verl-omni differs from the paper: verl-omni multiplies the policy term by ``adv_clip_max`` (a loss scale
the paper does not have: with c = 5 its gradient is 5x the paper's). Kept, so a converted run's learning
rate means what it meant under verl-omni; the test holds the formula to verl-omni's own to 1e-10.
"""

from __future__ import annotations

import torch

ADV_MODES = ("continuous", "positive_only", "negative_only", "one_only", "binary")


def reward_prob(advantages: torch.Tensor, adv_clip_max: float, adv_mode: str = "continuous") -> torch.Tensor:
    """The optimality probability r in [0, 1] of each sample from its advantage."""
    if adv_mode not in ADV_MODES:
        raise ValueError(f"adv_mode must be one of {', '.join(ADV_MODES)}, got {adv_mode!r}")
    a = advantages.clamp(-adv_clip_max, adv_clip_max)
    if adv_mode == "positive_only":
        a = a.clamp(min=0)
    elif adv_mode == "negative_only":
        a = a.clamp(max=0)
    elif adv_mode == "one_only":
        a = (a > 0).to(a.dtype)
    elif adv_mode == "binary":
        a = a.sign()
    return (a / (2 * adv_clip_max) + 0.5).clamp(0.0, 1.0)


def _row_mean(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1).mean(dim=1)


def nft_rows(
    velocity: torch.Tensor,
    old_velocity: torch.Tensor,
    ref_velocity: torch.Tensor,
    x0: torch.Tensor,
    xt: torch.Tensor,
    t: torch.Tensor,
    prob: torch.Tensor,
    beta: float,
    adv_clip_max: float,
    adaptive_weight_min: float = 1e-5,
    ref_kl_coef: float = 0.0,
) -> torch.Tensor:
    """Per-row DiffusionNFT loss (R,). ``t``: each row's timestep, broadcastable to ``x0`` ((R, 1, ...));
    ``prob``: each row's ``reward_prob``; the old and reference velocities carry no gradient."""
    if not beta > 0:
        raise ValueError(f"mix_beta must be > 0, got {beta}")
    old_velocity, ref_velocity = old_velocity.detach(), ref_velocity.detach()
    x0_pos = xt - t * (beta * velocity + (1 - beta) * old_velocity)
    x0_neg = xt - t * ((1 + beta) * old_velocity - beta * velocity)
    with torch.no_grad():
        w_pos = _row_mean((x0_pos - x0).abs()).clamp(min=adaptive_weight_min)
        w_neg = _row_mean((x0_neg - x0).abs()).clamp(min=adaptive_weight_min)
    pos = _row_mean((x0_pos - x0) ** 2) / w_pos
    neg = _row_mean((x0_neg - x0) ** 2) / w_neg
    loss = adv_clip_max * (prob * pos + (1 - prob) * neg) / beta
    if ref_kl_coef:
        loss = loss + ref_kl_coef * _row_mean((velocity - ref_velocity) ** 2)
    return loss
