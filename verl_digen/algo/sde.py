"""One reverse-time transition of a rectified-flow sampler, with the log-probability of the sample.

Everything here is a pure function of *per-row* sigma vectors, so one batch may hold rows at different
timesteps. That is all timestep-parallel training (TSP) needs: the trainer stacks (sample, step) rows and
calls the same functions the rollout used.

Conventions: x_sigma = (1 - sigma) x0 + sigma * noise, velocity v = noise - x0, ``sigma_next < sigma``
and ``dt = sigma_next - sigma < 0``.

Kinds:
- ``flow_grpo``: std_t = eta * sqrt(sigma / (1 - sigma)) (at sigma == 1 the denominator uses the
  schedule's second sigma ``sigma_max``), mean = x + [v + std_t^2 / (2 sigma) (x + (1 - sigma) v)] dt,
  sample std = std_t * sqrt(-dt).
- ``dance_grpo``: the same drift with a constant std_t = eta.
- ``cps`` (coefficients-preserving sampling): x_prev = (1 - s') x0_hat + sqrt(s'^2 - std^2) eps_hat + std z
  with std = s' sin(eta pi / 2), s' = sigma_next.
- ``ode``: the deterministic Euler step x + v dt.

The log-probability is the Gaussian log-density *averaged* over the non-batch dimensions. For the
``flow_grpo`` kind this is exactly flow_grpo's and verl-omni's convention, so their PPO clip ranges carry
over unchanged. For ``cps`` both upstreams instead use ``-(x_prev - mean)^2`` averaged (no 1 / (2 std^2)
scale, no normalizer), which makes the log-ratio 2 std^2 times the Gaussian one; ``log_prob="squared_error"``
reproduces that convention (see docs/migrating-from-verl-omni.md), the default ``"gaussian"`` keeps a true
density ratio whose clip range means the same at every timestep. With ``eta == 0`` (or ``ode``) a step is
deterministic: its sample equals the mean and its log-prob is reported as 0; such steps cannot be trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from verl_digen.algo.sampling import check_sde

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class SDEStep:
    """Result of one transition: the sample, its log-prob (B,), and the Gaussian's mean and std."""

    prev: torch.Tensor
    log_prob: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor  # per-row standard deviation of the transition, broadcastable to ``mean``


def _rows(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-row scalars (B,) reshaped to broadcast against ``like`` (B, ...)."""
    t = torch.as_tensor(t, dtype=like.dtype, device=like.device)
    if t.dim() == 0:
        t = t.expand(like.shape[0])
    if t.shape != (like.shape[0],):
        raise ValueError(f"per-row sigmas must have shape ({like.shape[0]},), got {tuple(t.shape)}")
    return t.reshape(-1, *([1] * (like.dim() - 1)))


def transition(
    kind: str,
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    eta: float,
    sigma_max: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and per-row std of the Gaussian p(x_prev | x) for each row."""
    check_sde(kind, eta)
    if x.shape != v.shape:
        raise ValueError(f"latents {tuple(x.shape)} and velocity {tuple(v.shape)} must have one shape")
    s = _rows(sigma, x)
    s_next = _rows(sigma_next, x)
    if bool((s_next > s).any()):
        raise ValueError("a reverse step needs sigma_next <= sigma on every row (descending sigmas); got "
                         f"sigma {s.flatten().tolist()} -> sigma_next {s_next.flatten().tolist()}")
    dt = s_next - s
    if kind == "ode" or eta == 0.0:
        return x + v * dt, torch.zeros_like(s)
    if kind == "cps":
        std = s_next * math.sin(eta * math.pi / 2)
        x0_hat = x - s * v
        eps_hat = x + (1 - s) * v
        mean = x0_hat * (1 - s_next) + eps_hat * torch.sqrt((s_next**2 - std**2).clamp_min(0))
        return mean, std
    if kind == "flow_grpo":
        s_den = s
        if sigma_max is not None:
            s_den = torch.where(s >= 1, _rows(sigma_max, x), s)
        if bool((s_den >= 1).any()):
            raise ValueError("flow_grpo SDE at sigma == 1 needs sigma_max (the schedule's second sigma)")
        std_t = eta * torch.sqrt(s / (1 - s_den))
    else:  # dance_grpo
        std_t = torch.full_like(s, eta)
    mean = x + (v + std_t**2 / (2 * s) * (x + (1 - s) * v)) * dt
    return mean, std_t * torch.sqrt(-dt)


def gaussian_log_prob(sample: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Gaussian log-density per element, averaged over non-batch dims; 0 for deterministic rows."""
    safe = torch.where(std > 0, std, torch.ones_like(std))
    lp = -((sample - mean) ** 2) / (2 * safe**2) - torch.log(safe) - _LOG_SQRT_2PI
    lp = lp.mean(dim=tuple(range(1, sample.dim())))
    return torch.where(std.reshape(-1) > 0, lp, torch.zeros_like(lp))


def squared_error_log_prob(sample: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """flow_grpo / verl-omni's CPS log-prob: -(sample - mean)^2 averaged; 0 for deterministic rows."""
    lp = (-((sample - mean) ** 2)).mean(dim=tuple(range(1, sample.dim())))
    return torch.where(std.reshape(-1) > 0, lp, torch.zeros_like(lp))


def sde_step(
    kind: str,
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    eta: float,
    noise: torch.Tensor | None = None,
    prev: torch.Tensor | None = None,
    sigma_max: float | torch.Tensor | None = None,
    log_prob: str = "gaussian",
) -> SDEStep:
    """Sample x_prev (from ``noise``, a standard normal draw) or score a given ``prev``.

    Exactly one of ``noise`` and ``prev`` is given: the rollout passes noise, the trainer passes the
    stored next state to recompute its log-prob under the current policy. ``log_prob`` picks the form
    (``LOG_PROB_KINDS``); rollout and trainer must use the same one.
    """
    if (noise is None) == (prev is None):
        raise ValueError("pass exactly one of noise= (to sample) or prev= (to score a stored sample)")
    check_sde(kind, eta, log_prob)
    mean, std = transition(kind, x, v, sigma, sigma_next, eta, sigma_max)
    if prev is None:
        if noise.shape != x.shape:
            raise ValueError(f"noise {tuple(noise.shape)} must match latents {tuple(x.shape)}")
        prev = mean + std * noise
    elif prev.shape != x.shape:
        raise ValueError(f"prev {tuple(prev.shape)} must match latents {tuple(x.shape)}")
    # The sample is data, not a function of the parameters: gradients flow through the mean only.
    score = squared_error_log_prob if log_prob == "squared_error" else gaussian_log_prob
    return SDEStep(prev=prev, log_prob=score(prev.detach(), mean, std), mean=mean, std=std)


def kl_to_reference(
    mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor
) -> torch.Tensor:
    """KL(pi || pi_ref) per row for two Gaussians of equal std: |mu - mu_ref|^2 / (2 std^2), averaged.

    A deterministic row (std 0: the last CPS step, where sigma_next = 0) has no density and no PPO term,
    so it contributes no KL either (0, with no gradient).
    """
    stochastic = std > 0
    safe = torch.where(stochastic, std, torch.ones_like(std))
    kl = torch.where(stochastic, (mean - ref_mean) ** 2 / (2 * safe**2), torch.zeros_like(mean))
    return kl.mean(dim=tuple(range(1, mean.dim())))
