"""One request batch of a verl-digen RL pipeline, after prompt encoding and before decoding: draw each
sample's x_T and noise from its own placement-invariant streams, step every sample with ``rollout.denoise``
on the request's sigmas verbatim, and keep what the trainer needs of each sample's trained steps.

The pipeline classes (``pipelines``) only adapt vllm-omni's request batch and output types around this;
tests run it with verl-digen's tiny diffusers models and hold it to ``sample_trajectories`` bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verl_digen.algo.seeding import sample_generator
from verl_digen.models.base import Conditioning, DiffusionModel
from verl_digen.rollout.denoise import denoise
from verl_digen.rollout.omni.request import RowRequest, StepSettings
from verl_digen.rollout.sampler import initial_noise


@dataclass
class StepBatch:
    """A request batch's rollout: per row its K trained steps, and its final latents."""

    states: torch.Tensor  # (B, K, *latent)
    next_states: torch.Tensor  # (B, K, *latent)
    log_probs: torch.Tensor  # (B, K)
    sigmas: torch.Tensor  # (B, K) sigma of each trained step, float64 (the request's values)
    final: torch.Tensor  # (B, *latent)

    def row_latents(self, i: int) -> torch.Tensor:
        """verl-digen's trajectory layout for row ``i`` (``output.DIGEN``): (2K + 1, *latent), the trained
        steps' (state, next state) pairs interleaved, then the final latents."""
        pairs = torch.stack([self.states[i], self.next_states[i]], dim=1).flatten(0, 1)
        return torch.cat([pairs, self.final[i].unsqueeze(0)])


def _uniform(rows: list[RowRequest], field: str) -> int:
    values = {getattr(r, field) for r in rows}
    if len(values) != 1:
        raise ValueError(f"one request batch holds one global step's rows; got {field}s {sorted(values)}")
    return values.pop()


@torch.no_grad()
def step_batch(
    policy: DiffusionModel, cond: Conditioning, rows: list[RowRequest], settings: StepSettings,
    dtype: torch.dtype, device: torch.device | str,
) -> StepBatch:
    """Roll out ``rows`` with ``policy``'s velocity (``cond``: one row per request) in ``dtype``."""
    if len(cond) != len(rows):
        raise ValueError(f"conditioning has {len(cond)} rows for {len(rows)} requests")
    if len({len(r.train_steps) for r in rows}) != 1:
        raise ValueError("every row of a request batch must train the same number of steps")
    seed, step = _uniform(rows, "seed"), _uniform(rows, "step")
    shape = tuple(settings.latent_shape)
    x = initial_noise(shape, [r.prompt_id for r in rows], [r.init_sample for r in rows], seed, step, dtype)
    gens = [sample_generator(seed, step, r.prompt_id, r.sample_id, "sde") for r in rows]
    sigmas = settings.sigma_tensor(dtype, device)
    mask = torch.tensor(settings.sde_mask, dtype=torch.bool)
    out = denoise(lambda z, s: policy.velocity(z, s, cond, settings.guidance_scale), x.to(device), sigmas, gens,
                  settings.sde, settings.eta, mask, settings.log_prob)
    steps = torch.tensor([list(r.train_steps) for r in rows], dtype=torch.long)
    states, nexts, lps = out.select(steps)
    exact = torch.tensor(settings.sigmas, dtype=torch.float64)
    return StepBatch(states, nexts, lps, exact[steps], out.final)
