"""What a worker needs to know to build its policy, sample, score and train.

The driver resolves the user's (Hydra) configuration into one ``WorkerConfig`` and hands the same
object to every worker of every pool, so the generator, the trainer and the TAG path build
bit-identical policies from the same seed and sample with the same settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl_digen.algo.loss import LossConfig
from verl_digen.rewards import DEFAULT_LEARNABLE_REWARD
from verl_digen.rollout.sampler import SamplerConfig


@dataclass(frozen=True)
class PolicyConfig:
    """The policy model: architecture, weights (``None`` = tiny random weights), dtype, LoRA."""

    arch: str = "flux"
    pretrained: str | None = None
    dtype: str = "float32"
    latent_size: int | None = None
    num_frames: int | None = None
    seed: int = 0  # initial weights of tiny models
    lora_rank: int = 0  # 0 = full fine-tuning
    lora_alpha: float | None = None
    lora_target_modules: tuple[str, ...] | None = None

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0


@dataclass(frozen=True)
class OptimConfig:
    """AdamW settings and gradient clipping of the trainer."""

    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    grad_clip: float = 1.0


@dataclass(frozen=True)
class WorkerConfig:
    """Everything every worker builds from; picklable, identical on every worker."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    reward: Any = DEFAULT_LEARNABLE_REWARD  # a registry name, {name: weight}, or {"name": .., **kwargs}
    tsp_degree: int | None = None  # trained steps per pass; None = all K in one pass
    seed: int = 0  # sampling seed (placement-invariant streams)
    device: str = "cpu"  # "cuda" on GPU pools
    sync_backend: str = "object_store"  # or "collective"
    rollout_backend: str = "diffusers"  # generator rollout: "diffusers" (any device) or "vllm" (vLLM-Omni, GPU)
