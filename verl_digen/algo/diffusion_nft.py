"""DiffusionNFT (verl-omni's ``diffusion_loss.loss_mode=diffusion_nft``, ``algorithm.name=diffusion_nft``).

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

How a run trains it (docs/architecture.md, "DiffusionNFT"): the rollout samples with a plain ODE and keeps
only the clean sample x0 (``rollout.sampler``, ``clean_only``); its K trained steps (a per-sample random
subset of the schedule, verl-omni's ``timestep_fraction``) give the rows' t = sigma_i. The trainer builds the
K rows of a sample itself (``noised_rows``: eps from the sample's own placement-invariant stream, so a row is
the same on every rank and in every mode), and TSP stacks them like any (sample, step) rows. v_old is a
trainer-side copy of the trained parameters moved after every ``old_policy_update_interval``-th global step
as old <- d old + (1 - d) theta, d from ``old_policy_decay_schedule`` (verl-omni's table, step counted
from 1) or a fixed ``old_policy_decay``.

Where verl-omni differs from the paper: verl-omni multiplies the policy term by ``adv_clip_max`` (a loss scale
the paper does not have: with c = 5 its gradient is 5x the paper's). Kept, so a converted run's learning
rate means what it meant under verl-omni; the test holds the formula to verl-omni's own to 1e-10.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verl_digen.algo.algorithms import ADV_MODES, OLD_POLICY_SCHEDULES
from verl_digen.algo.loss import LossTerms
from verl_digen.algo.seeding import sample_generator
from verl_digen.algo.trajectory import Trajectories


@dataclass(frozen=True)
class NFTConfig:
    """DiffusionNFT's loss and old-policy settings (verl-omni's names)."""

    mix_beta: float = 0.5
    adv_clip_max: float = 5.0
    adaptive_weight_min: float = 1e-5
    adv_mode: str = "continuous"
    old_policy_decay_schedule: str = "copy"
    old_policy_decay: float | None = None  # a fixed d; None: the schedule's
    old_policy_update_interval: int = 1

    def __post_init__(self) -> None:
        if not self.mix_beta > 0:
            raise ValueError(f"mix_beta must be > 0, got {self.mix_beta}")
        if not self.adv_clip_max > 0:
            raise ValueError(f"adv_clip_max must be > 0, got {self.adv_clip_max}")
        if self.adv_mode not in ADV_MODES:
            raise ValueError(f"adv_mode must be one of {', '.join(ADV_MODES)}, got {self.adv_mode!r}")
        if self.old_policy_decay_schedule not in OLD_POLICY_SCHEDULES:
            raise ValueError(f"old_policy_decay_schedule must be one of {', '.join(OLD_POLICY_SCHEDULES)}")
        if self.old_policy_decay is not None and not 0 <= self.old_policy_decay <= 1:
            raise ValueError(f"old_policy_decay must lie in [0, 1], got {self.old_policy_decay}")
        if self.old_policy_update_interval < 1:
            raise ValueError(f"old_policy_update_interval must be >= 1, got {self.old_policy_update_interval}")

    def old_decay(self, global_step: int) -> float | None:
        """d for the old copy after global step ``global_step`` (counted from 1, as verl-omni does); None when
        the step does not move the old copy."""
        if global_step % self.old_policy_update_interval:
            return None
        if self.old_policy_decay is not None:
            return self.old_policy_decay
        warmup, rate, cap = OLD_POLICY_SCHEDULES[self.old_policy_decay_schedule]
        return 0.0 if global_step < warmup else min((global_step - warmup) * rate, cap)


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


def noised_rows(traj: Trajectories, seed: int) -> Trajectories:
    """The K forward-process rows of each clean sample: states x_t = (1 - t) x0 + t eps with t its trained
    step's sigma, next_states x0 (the loss's target), log-probs 0 (none exist). eps comes from the sample's
    own stream (seed, step, prompt, sample, "nft"), K draws in the order of its trained steps, so a row is
    the same whichever rank, batch or mode builds it."""
    b, k = traj.step_indices.shape
    x0 = traj.final_latents
    latent = tuple(x0.shape[1:])
    eps = torch.stack([
        torch.randn((k, *latent), generator=sample_generator(seed, traj.global_step, int(p), int(s), "nft"),
                    dtype=x0.dtype)
        for p, s in zip(traj.prompt_ids.tolist(), traj.sample_ids.tolist(), strict=True)
    ]) if b else x0.new_zeros((0, k, *latent))
    eps = eps.to(x0.device)
    t = traj.sigmas.to(x0.dtype).reshape(b, k, *([1] * len(latent)))
    clean = x0.unsqueeze(1).expand(b, k, *latent)
    out = traj.index(torch.arange(b))
    out.states = (1 - t) * clean + t * eps
    out.next_states = clean
    out.log_probs = torch.zeros(b, k, dtype=traj.sigmas.dtype, device=traj.sigmas.device)
    return out


def nft_loss(
    velocity: torch.Tensor, old_velocity: torch.Tensor, ref_velocity: torch.Tensor | None, x0: torch.Tensor,
    xt: torch.Tensor, t: torch.Tensor, advantages: torch.Tensor, cfg: NFTConfig, ref_kl_coef: float, scale: float,
) -> LossTerms:
    """``nft_rows`` summed over rows and times ``scale``, as ``loss.LossTerms`` (no ratio: its fields are
    ones and zeros; ``kl`` is the per-row reference MSE when there is a reference)."""
    shape = (-1,) + (1,) * (x0.dim() - 1)
    prob = reward_prob(advantages, cfg.adv_clip_max, cfg.adv_mode)
    ref = velocity.detach() if ref_velocity is None else ref_velocity
    rows = nft_rows(velocity, old_velocity, ref, x0, xt, t.reshape(shape).to(x0.dtype), prob.to(x0.dtype),
                    cfg.mix_beta, cfg.adv_clip_max, cfg.adaptive_weight_min,
                    ref_kl_coef if ref_velocity is not None else 0.0)
    kl = None
    if ref_velocity is not None:
        with torch.no_grad():
            kl = _row_mean((velocity - ref_velocity) ** 2)
    ones = torch.ones_like(rows.detach())
    return LossTerms(loss=rows.sum() * scale, ratio=ones, clipped=torch.zeros_like(ones),
                     approx_kl=torch.zeros_like(ones), kl=kl)
