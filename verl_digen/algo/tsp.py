"""Timestep-parallel training (TSP): one batched forward/backward over (sample x trained step) rows.

Flow-GRPO trains a micro-batch with K sequential passes, one per trained step. Because the SDE log-prob
is a pure function of per-row sigmas, the K steps can instead be stacked as rows (each with its own
timestep) and trained in ceil(K / degree) passes of B * degree rows. The loss is a sum of per-row terms,
so the accumulated gradient is the same; only the kernel shapes change (bigger, better-utilized GEMMs).

``sequential_backward`` is the per-step reference path the equivalence tests hold TSP against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from verl_digen.algo.diffusion_nft import nft_loss
from verl_digen.algo.flow_dppo import flow_dppo_loss
from verl_digen.algo.grpo_guard import grpo_guard_loss
from verl_digen.algo.loss import LossConfig, LossTerms, policy_loss
from verl_digen.algo.sde import kl_to_reference, sde_step, transition
from verl_digen.algo.trajectory import Trajectories
from verl_digen.models.base import Conditioning, DiffusionModel
from verl_digen.schedule.rows import row_plan

#: reference-policy velocity for KL: (latents, sigmas, cond) -> velocity (no grad needed)
ReferenceFn = Callable[[torch.Tensor, torch.Tensor, Conditioning], torch.Tensor]


@dataclass(frozen=True)
class TrainStepConfig:
    """What the trainer needs to recompute log-probs: the sampler's SDE settings plus the loss."""

    sde: str
    eta: float
    sigma_max: float  # the schedule's second sigma (flow_grpo's substitute at sigma == 1)
    guidance_scale: float = 1.0
    loss: LossConfig = LossConfig()
    log_prob: str = "gaussian"  # the sampler's log-prob form (``sde.LOG_PROB_KINDS``)


@dataclass
class TrainMetrics:
    """Running sums over trained rows, reduced to means by ``summary``."""

    rows: int = 0
    loss: float = 0.0
    ratio_sum: float = 0.0
    ratio_max: float = float("-inf")
    ratio_min: float = float("inf")
    clipped: float = 0.0
    approx_kl: float = 0.0
    kl: float = 0.0
    # the same sums split by TCSS staleness (rows sampled by an older policy version than the one
    # trained), so a drift of the importance ratio on stale rows is visible; rows of unknown version
    # (``add`` without ``stale``) count in neither
    stale_rows: int = 0
    stale_ratio_sum: float = 0.0
    stale_clipped: float = 0.0
    fresh_rows: int = 0
    fresh_ratio_sum: float = 0.0
    fresh_clipped: float = 0.0
    # |rollout log-prob - recomputed| over the rows trained with the old log-prob recomputed
    rollout_diff_rows: int = 0
    rollout_diff_sum: float = 0.0
    rollout_diff_max: float = 0.0

    def add(self, terms: LossTerms, stale: torch.Tensor | None = None) -> None:
        """Add a set of rows; ``stale`` (bool per row) splits them into stale and fresh rows."""
        n = terms.ratio.numel()
        self.rows += n
        self.loss += float(terms.loss.detach())
        self.ratio_sum += float(terms.ratio.sum())
        self.ratio_max = max(self.ratio_max, float(terms.ratio.max()))
        self.ratio_min = min(self.ratio_min, float(terms.ratio.min()))
        self.clipped += float(terms.clipped.sum())
        self.approx_kl += float(terms.approx_kl.sum())
        if terms.kl is not None:
            self.kl += float(terms.kl.sum())
        if terms.rollout_diff is not None:
            self.rollout_diff_rows += n
            self.rollout_diff_sum += float(terms.rollout_diff.sum())
            self.rollout_diff_max = max(self.rollout_diff_max, float(terms.rollout_diff.max()))
        if stale is not None:
            if stale.shape != terms.ratio.shape:
                raise ValueError(f"stale mask {tuple(stale.shape)} must match the rows {tuple(terms.ratio.shape)}")
            stale = stale.to(device=terms.ratio.device, dtype=torch.bool)
            fresh = ~stale
            self.stale_rows += int(stale.sum())
            self.stale_ratio_sum += float(terms.ratio[stale].sum())
            self.stale_clipped += float(terms.clipped[stale].sum())
            self.fresh_rows += int(fresh.sum())
            self.fresh_ratio_sum += float(terms.ratio[fresh].sum())
            self.fresh_clipped += float(terms.clipped[fresh].sum())

    def merge(self, other: TrainMetrics) -> TrainMetrics:
        """Fold another micro-batch's sums into these (returns self)."""
        for name in ("rows", "loss", "ratio_sum", "clipped", "approx_kl", "kl", "stale_rows", "stale_ratio_sum",
                     "stale_clipped", "fresh_rows", "fresh_ratio_sum", "fresh_clipped", "rollout_diff_rows",
                     "rollout_diff_sum"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.rollout_diff_max = max(self.rollout_diff_max, other.rollout_diff_max)
        self.ratio_max = max(self.ratio_max, other.ratio_max)
        self.ratio_min = min(self.ratio_min, other.ratio_min)
        return self

    def summary(self) -> dict[str, float]:
        n = max(self.rows, 1)
        return {
            "loss": self.loss,
            "ratio_mean": self.ratio_sum / n,
            "ratio_max": self.ratio_max,
            "ratio_min": self.ratio_min,
            "clip_frac": self.clipped / n,
            "approx_kl": self.approx_kl / n,
            "kl": self.kl / n,
            "rows": float(self.rows),
            # only for the kinds of rows the step had (a sync step has no stale rows)
            **{f"{k}_{p}": v for p in ("stale", "fresh") if getattr(self, f"{p}_rows")
               for k, v in (("ratio_mean", getattr(self, f"{p}_ratio_sum") / getattr(self, f"{p}_rows")),
                            ("clip_frac", getattr(self, f"{p}_clipped") / getattr(self, f"{p}_rows")))},
            # only when the old log-probs were recomputed (actor.recompute_log_prob)
            **({"rollout_logprob_diff_mean": self.rollout_diff_sum / self.rollout_diff_rows,
                "rollout_logprob_diff_max": self.rollout_diff_max} if self.rollout_diff_rows else {}),
        }


def _rows_loss(
    model: DiffusionModel,
    x: torch.Tensor,
    x_next: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    cond: Conditioning,
    cfg: TrainStepConfig,
    scale: float,
    reference: ReferenceFn | None,
    behaviour: ReferenceFn | None = None,
) -> LossTerms:
    """Loss of a flat set of rows, each at its own timestep (``cfg.loss.mode``'s surrogate). ``behaviour``: the
    velocity of the weights the step started with, when an optimizer step has moved the trained ones since
    (the recomputed old log-prob, and GRPO-Guard's / Flow-DPPO's old mean, are taken with it). DiffusionNFT's rows
    (``diffusion_nft.noised_rows``: x = x_t, x_next = x0, sigma = t) take ``behaviour`` as its old policy's
    velocity (None: the trained weights', detached)."""
    if cfg.loss.mode == "diffusion_nft":
        return _nft_rows_loss(model, x, x_next, sigma, advantages, cond, cfg, scale, reference, behaviour)
    old = None
    if behaviour is not None:
        with torch.no_grad():
            old = sde_step(cfg.sde, x, behaviour(x, sigma, cond), sigma, sigma_next, cfg.eta, prev=x_next,
                           sigma_max=cfg.sigma_max, log_prob=cfg.log_prob)
    recomputed = None if old is None else old.log_prob
    v = model.velocity(x, sigma, cond, cfg.guidance_scale)
    step = sde_step(cfg.sde, x, v, sigma, sigma_next, cfg.eta, prev=x_next, sigma_max=cfg.sigma_max,
                    log_prob=cfg.log_prob)
    kl = None
    if reference is not None and cfg.loss.kl_coef > 0:
        with torch.no_grad():
            ref_v = reference(x, sigma, cond)
            ref_mean, _ = transition(cfg.sde, x, ref_v, sigma, sigma_next, cfg.eta, cfg.sigma_max)
        kl = kl_to_reference(step.mean, ref_mean, step.std)
        if cfg.loss.kl_dt_weighted:
            kl = kl * (sigma - sigma_next).abs()
    if not cfg.loss.needs_old_mean:
        return policy_loss(step.log_prob, old_log_prob, advantages, cfg.loss, scale, kl, recomputed)
    # the old policy's mean: the step's starting weights' (the pass's own, detached, until an optimizer step)
    old_mean = step.mean.detach() if old is None else old.mean
    if cfg.loss.mode == "grpo_guard":
        return grpo_guard_loss(step.log_prob, old_log_prob, advantages, step.mean, old_mean, step.std,
                               sigma - sigma_next, cfg.loss, scale, kl, recomputed)
    return flow_dppo_loss(step.log_prob, old_log_prob, advantages, step.mean, old_mean, step.std, cfg.loss, scale,
                          kl, recomputed)


def _nft_rows_loss(
    model: DiffusionModel, xt: torch.Tensor, x0: torch.Tensor, t: torch.Tensor, advantages: torch.Tensor,
    cond: Conditioning, cfg: TrainStepConfig, scale: float, reference: ReferenceFn | None, old: ReferenceFn | None,
) -> LossTerms:
    """DiffusionNFT's loss of a flat set of rows: the trained velocity's forward, the old copy's and the
    reference's no-grad forwards (the last only with ``ref_kl_coef`` > 0). The old copy's forward goes first:
    it puts the old values into the trained parameters for the call, which must not happen between the
    trained forward and its backward."""
    with torch.no_grad():
        v_old = None if old is None else old(xt, t, cond)
        v_ref = reference(xt, t, cond) if reference is not None and cfg.loss.kl_coef > 0 else None
    v = model.velocity(xt, t, cond, cfg.guidance_scale)
    if v_old is None:
        v_old = v.detach()
    return nft_loss(v, v_old, v_ref, x0, xt, t, advantages, cfg.loss.nft, cfg.loss.kl_coef, scale)


def _check_batch(traj: Trajectories, degree: int | None = None) -> None:
    if traj.advantages is None:
        raise ValueError("trajectories have no advantages yet: compute group advantages before training")
    if degree is not None and degree < 1:
        raise ValueError(f"TSP degree must be >= 1 (steps per pass), got {degree}")


def tsp_backward(
    model: DiffusionModel,
    traj: Trajectories,
    cfg: TrainStepConfig,
    scale: float,
    degree: int | None = None,
    reference: ReferenceFn | None = None,
    version: int | None = None,
    rank: int = 0,
    world: int = 1,
    cap: int | None = None,
    device: torch.device | str | None = None,
    behaviour: ReferenceFn | None = None,
) -> TrainMetrics:
    """Accumulate the gradient of ``traj``'s loss with TSP; returns its metrics.

    ``degree`` is the number of trained steps per pass (rows per pass = B * degree); ``None`` means all
    K steps in one pass. ``scale`` is 1 / (rows of the whole global step). ``version``: the policy
    version being trained; given, the metrics split rows into stale (sampled by an older version:
    TCSS) and fresh ones. ``rank`` / ``world``: train only this rank's share of the (sample x step)
    rows, in passes of at most ``cap`` rows (``schedule.rows``: every rank runs the same number of
    passes, padding with zero-weight ones, so FSDP's collectives stay in step). ``device``: where each
    pass's rows are moved to (the rank's compute device; default: where ``traj`` is). ``behaviour``: the
    step's starting weights' velocity, for the old log-probs once a mini-batch's optimizer step has moved
    the trained weights (``actor.recompute_log_prob`` with ``actor.ppo_mini_batch_size``).
    """
    _check_batch(traj, degree)
    b, k = traj.step_indices.shape
    plan = row_plan(b, k, world, degree, cap)
    order = torch.tensor(plan.order(), dtype=torch.long).reshape(-1, 2)
    stale = None if version is None else traj.versions.reshape(-1) < version
    advantages = traj.advantages.to(traj.log_probs.dtype)
    device = traj.states.device if device is None else device
    per_row = (traj.states, traj.next_states, traj.sigmas, traj.sigmas_next, traj.log_probs,
               advantages[:, None].expand(b, k))  # (B, K, ...) each, indexed by (sample, step)
    metrics = TrainMetrics()
    for span in plan.rank_passes(rank):
        padding = not len(span)  # nothing left for this rank: one row at weight 0 keeps the collectives in step
        span, weight = (range(1), 0.0) if padding else (span, scale)
        s, j = order[span.start:span.stop].unbind(1)
        # only the pass's rows go to the model's device (the update stays where it arrived)
        x, x_next, sigma, sigma_next, old_lp, adv = (t[s, j].to(device) for t in per_row)
        terms = _rows_loss(model, x, x_next, sigma, sigma_next, old_lp, adv, traj.cond.index(s).to(device=device),
                           cfg, weight, reference, behaviour)
        terms.loss.backward()
        if not padding:
            metrics.add(terms, None if stale is None else stale[s])
    return metrics


def sequential_backward(
    model: DiffusionModel,
    traj: Trajectories,
    cfg: TrainStepConfig,
    scale: float,
    reference: ReferenceFn | None = None,
) -> TrainMetrics:
    """The Flow-GRPO reference loop: one forward/backward per trained step over the B samples."""
    _check_batch(traj)
    metrics = TrainMetrics()
    advantages = traj.advantages.to(traj.log_probs.dtype)
    for j in range(traj.num_trained_steps):
        terms = _rows_loss(
            model,
            traj.states[:, j],
            traj.next_states[:, j],
            traj.sigmas[:, j],
            traj.sigmas_next[:, j],
            traj.log_probs[:, j],
            advantages,
            traj.cond,
            cfg,
            scale,
            reference,
        )
        terms.loss.backward()
        metrics.add(terms)
    return metrics


@torch.no_grad()
def recompute_log_probs(model: DiffusionModel, traj: Trajectories, cfg: TrainStepConfig) -> torch.Tensor:
    """(B, K) log-probs of the stored transitions under ``model`` (one batched pass)."""
    b, k = traj.step_indices.shape
    latent = traj.states.shape[2:]
    x = traj.states.reshape(b * k, *latent)
    sigma = traj.sigmas.reshape(-1)
    v = model.velocity(x, sigma, traj.cond.repeat_interleave(k), cfg.guidance_scale)
    step = sde_step(
        cfg.sde, x, v, sigma, traj.sigmas_next.reshape(-1), cfg.eta,
        prev=traj.next_states.reshape(b * k, *latent), sigma_max=cfg.sigma_max, log_prob=cfg.log_prob,
    )
    return step.log_prob.reshape(b, k)
