"""The per-step denoising loop of a rollout, torch alone: no model class, no engine.

The diffusers sampler (``rollout.sampler``) and verl-digen's vLLM-Omni RL pipelines
(``rollout.omni.pipelines``) both step through this one function, so a sample's trajectory is the same
whichever engine ran its transformer (docs/architecture.md, "The vLLM-Omni rollout"). The caller hands in
the velocity as a callable and one noise generator per sample (``algo.seeding``'s placement-invariant
streams); every sample draws its noise at every step, deterministic steps included, so its stream never
depends on the schedule, the SDE window or the batch around it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from verl_digen.algo.sde import sde_step

#: velocity(x (B, *latent), sigma (B,)) -> v (B, *latent): one transformer call (CFG inside, if any)
Velocity = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Denoised:
    """Every step of a batch's rollout: (B, T, *latent) states and next states, (B, T) log-probs."""

    states: torch.Tensor
    next_states: torch.Tensor
    log_probs: torch.Tensor
    final: torch.Tensor  # (B, *latent): the last next state

    def select(self, steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(states, next_states, log_probs) of the (B, K) step indices ``steps`` (one row per sample)."""
        rows = torch.arange(self.states.shape[0], device=self.states.device).unsqueeze(1)
        idx = steps.to(self.states.device)
        return self.states[rows, idx], self.next_states[rows, idx], self.log_probs[rows, idx]


def draw_noise(generators: Sequence[torch.Generator], shape: tuple[int, ...], dtype: torch.dtype,
               device: torch.device | str) -> torch.Tensor:
    """One standard-normal draw of ``shape`` per sample from its own CPU generator, stacked on ``device``."""
    return torch.stack([torch.randn(shape, generator=g, dtype=dtype) for g in generators]).to(device)


@torch.no_grad()
def denoise(
    velocity: Velocity,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    noise_generators: Sequence[torch.Generator],
    sde: str,
    eta: float,
    sde_mask: torch.Tensor,
    log_prob: str = "gaussian",
) -> Denoised:
    """Roll ``x`` (x_T, (B, *latent)) through the T = len(sigmas) - 1 steps of ``sigmas`` (descending, used
    verbatim). Step i injects noise at level ``eta`` where ``sde_mask[i]`` and is deterministic elsewhere;
    flow_grpo's std at sigma = 1 uses the schedule's second sigma, as the trainer does."""
    b = x.shape[0]
    if len(noise_generators) != b:
        raise ValueError(f"one noise generator per sample: {len(noise_generators)} for {b} rows")
    steps = sigmas.shape[0] - 1
    if sde_mask.shape != (steps,):
        raise ValueError(f"sde_mask must have one entry per step ({steps}), got shape {tuple(sde_mask.shape)}")
    shape = tuple(x.shape[1:])
    sigma_max = sigmas[1]
    states, next_states, log_probs = [], [], []
    for i in range(steps):
        s = sigmas[i].expand(b)
        s_next = sigmas[i + 1].expand(b)
        v = velocity(x, s)
        noise = draw_noise(noise_generators, shape, x.dtype, x.device)
        out = sde_step(sde, x, v, s, s_next, eta if bool(sde_mask[i]) else 0.0, noise=noise, sigma_max=sigma_max,
                       log_prob=log_prob)
        states.append(x)
        next_states.append(out.prev)
        log_probs.append(out.log_prob)
        x = out.prev
    return Denoised(torch.stack(states, dim=1), torch.stack(next_states, dim=1), torch.stack(log_probs, dim=1), x)
