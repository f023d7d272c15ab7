"""The trajectory batch passed from rollout to reward to trainer.

Only the trained steps are stored: for each sample, K (input state, sampled next state, old log-prob,
sigma pair) tuples, which is exactly the row set a TSP pass stacks. Every row carries the policy version
that sampled it, so the runtime can check that a trajectory never mixes versions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from verl_digen.models.base import Conditioning


@dataclass
class Trajectories:
    """A batch of B sampled trajectories (B rows; K trained steps each)."""

    prompts: list[str]
    prompt_ids: torch.Tensor  # (B,) global prompt index (the GRPO group)
    sample_ids: torch.Tensor  # (B,) index within the group
    cond: Conditioning
    step_indices: torch.Tensor  # (B, K) trained step i = transition sigma_i -> sigma_{i+1}
    sigmas: torch.Tensor  # (B, K)
    sigmas_next: torch.Tensor  # (B, K)
    states: torch.Tensor  # (B, K, *latent) input state of each trained step
    next_states: torch.Tensor  # (B, K, *latent) sampled output state of each trained step
    log_probs: torch.Tensor  # (B, K) log-prob of each trained transition under the sampling policy
    final_latents: torch.Tensor  # (B, *latent)
    versions: torch.Tensor  # (B,) policy version that produced each trajectory
    global_step: int
    images: torch.Tensor | None = None  # decoded pixels in [0, 1]
    rewards: torch.Tensor | None = None  # (B,) combined reward
    reward_components: dict[str, torch.Tensor] = field(default_factory=dict)
    advantages: torch.Tensor | None = None  # (B,)

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def num_trained_steps(self) -> int:
        return self.step_indices.shape[1]

    def index(self, rows: list[int] | torch.Tensor) -> Trajectories:
        """The sub-batch of the given rows (order kept)."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        out = {}
        for f in fields(self):
            val = getattr(self, f.name)
            if f.name == "prompts":
                out[f.name] = [val[i] for i in idx.tolist()]
            elif f.name == "cond":
                out[f.name] = val.index(idx)
            elif f.name == "reward_components":
                out[f.name] = {k: v[idx] for k, v in val.items()}
            elif isinstance(val, torch.Tensor):
                out[f.name] = val[idx]
            else:
                out[f.name] = val
        return Trajectories(**out)

    @staticmethod
    def cat(parts: list[Trajectories]) -> Trajectories:
        """Concatenate batches of one global step (rows in the given order)."""
        if not parts:
            raise ValueError("Trajectories.cat needs at least one batch")
        steps = {p.global_step for p in parts}
        if len(steps) != 1:
            raise ValueError(f"cannot concatenate trajectories of different global steps {sorted(steps)}")
        out = {}
        for f in fields(parts[0]):
            vals = [getattr(p, f.name) for p in parts]
            if f.name == "prompts":
                out[f.name] = [s for v in vals for s in v]
            elif f.name == "cond":
                out[f.name] = Conditioning.cat(vals)
            elif f.name == "reward_components":
                out[f.name] = {k: torch.cat([v[k] for v in vals]) for k in vals[0]}
            elif f.name == "global_step":
                out[f.name] = vals[0]
            elif any(v is None for v in vals):
                out[f.name] = None
            else:
                out[f.name] = torch.cat(vals)
        return Trajectories(**out)
