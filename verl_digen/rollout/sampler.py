"""Sampling trajectories from a diffusion policy (the generator's, and the TAG trainer's, rollout).

The noise of sample j of prompt i at global step s comes from its own generator seeded by
(seed, s, i, j) (see ``algo.seeding``), so a sample is the same whether it is generated alone, inside
any batch, on a generator worker, on a trainer worker (TAG) or in a colocated run.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from verl_digen.algo.loss import LossConfig
from verl_digen.algo.sampling import SamplerSpec
from verl_digen.algo.seeding import sample_generator
from verl_digen.algo.sigmas import flow_sigmas
from verl_digen.algo.trajectory import Trajectories
from verl_digen.algo.tsp import TrainStepConfig
from verl_digen.models.base import Conditioning, DiffusionModel
from verl_digen.rollout.denoise import denoise


@dataclass(frozen=True)
class SamplerConfig(SamplerSpec):
    """A :class:`SamplerSpec` (its fields and ``validate``) with the tensors a rollout and its trainer build
    from it: the sigma schedule, the trainer's step settings and the SDE mask."""

    @classmethod
    def of(cls, spec: SamplerSpec) -> SamplerConfig:
        """This spec's sampler (same fields)."""
        return cls(**{f.name: getattr(spec, f.name) for f in fields(SamplerSpec)})

    def sigmas(self, dtype: torch.dtype) -> torch.Tensor:
        return flow_sigmas(self.num_steps, self.shift, dtype)

    def train_config(self, loss: LossConfig) -> TrainStepConfig:
        """The settings the trainer needs to recompute this sampler's log-probs."""
        return TrainStepConfig(
            sde=self.sde, eta=self.eta, sigma_max=float(self.sigmas(torch.float64)[1]),
            guidance_scale=self.guidance_scale, loss=loss, log_prob=self.log_prob,
        )

    def sde_mask(self, seed: int, step: int) -> torch.Tensor:
        """(T,) bool: which steps inject noise (all, or only the window for ``window`` selection)."""
        mask = torch.ones(self.num_steps, dtype=torch.bool)
        if self.clean_only:
            mask[:] = False
        elif self.selection.kind == "window":
            start, end = self.selection.window(self.num_steps, seed, step)
            mask[:] = False
            mask[start:end] = True
        return mask


def initial_noise(
    shape: tuple[int, ...], prompt_ids: list[int], sample_ids: list[int], seed: int, step: int,
    dtype: torch.dtype, shared_group_noise: bool = False,
) -> torch.Tensor:
    """x_T for each sample from its own placement-invariant generator."""
    rows = []
    for p, s in zip(prompt_ids, sample_ids, strict=True):
        g = sample_generator(seed, step, p, 0 if shared_group_noise else s, "init")
        rows.append(torch.randn(shape, generator=g, dtype=dtype))
    return torch.stack(rows)


@torch.no_grad()
def sample_trajectories(
    model: DiffusionModel,
    cond: Conditioning,
    prompts: list[str],
    prompt_ids: list[int],
    sample_ids: list[int],
    cfg: SamplerConfig,
    seed: int,
    step: int,
    version: int,
) -> Trajectories:
    """Roll out one trajectory per (prompt_id, sample_id) row; ``cond`` has one row per sample."""
    cfg.validate()
    b = len(prompt_ids)
    if not (len(sample_ids) == len(prompts) == len(cond) == b):
        raise ValueError(
            f"one row per sample expected: {b} prompt ids, {len(sample_ids)} sample ids, "
            f"{len(prompts)} prompts, {len(cond)} conditioning rows"
        )
    dtype, device = model.dtype, model.device
    shape = tuple(model.latent_shape)
    sigmas = cfg.sigmas(dtype).to(device)
    sde_on = cfg.sde_mask(seed, step)
    selected = cfg.selection.select(cfg.num_steps, seed, step, prompt_ids, sample_ids)
    noise_gens = [sample_generator(seed, step, p, s, "sde") for p, s in zip(prompt_ids, sample_ids)]

    x = initial_noise(shape, prompt_ids, sample_ids, seed, step, dtype, cfg.shared_group_noise).to(device)
    cond = cond.to(device)
    out = denoise(lambda z, s: model.velocity(z, s, cond, cfg.guidance_scale), x, sigmas, noise_gens, cfg.sde,
                  cfg.eta, sde_on, cfg.log_prob)
    sel = selected.to(device)
    if cfg.clean_only:  # nothing per step leaves the rollout: the trainer builds the rows from final_latents
        states = next_states = out.final.new_zeros((b, 0, *shape))
        log_probs = out.final.new_zeros((b, 0))
    else:
        states, next_states, log_probs = out.select(sel)
    return Trajectories(
        prompts=list(prompts),
        prompt_ids=torch.as_tensor(prompt_ids, dtype=torch.long),
        sample_ids=torch.as_tensor(sample_ids, dtype=torch.long),
        cond=cond,
        step_indices=selected,
        sigmas=sigmas[sel],
        sigmas_next=sigmas[sel + 1],
        states=states,
        next_states=next_states,
        log_probs=log_probs,
        final_latents=out.final,
        versions=torch.full((b,), version, dtype=torch.long),
        global_step=step,
        images=model.decode(out.final) if cfg.decode else None,
    )
