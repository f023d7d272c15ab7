"""What a worker needs to know to build its policy, sample, score and train.

The driver resolves the user's (Hydra) configuration into one ``WorkerConfig`` and hands the same
object to every worker of every pool, so the generator, the trainer and the TAG path build
bit-identical policies from the same seed and sample with the same settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl_digen import dtypes
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
    latent_width: int | None = None  # None: square (latent_size)
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
    ema_decay: float | None = None  # an EMA of the trained parameters, updated after every optimizer step


#: the dtypes the trainer can store or compute in (``models.parse_dtype`` takes each)
PRECISIONS = dtypes.PRECISIONS


@dataclass(frozen=True)
class ActorMemoryConfig:
    """Memory and precision of the trainer's policy (verl's FSDP ``mixed_precision`` / offload knobs).

    ``model.dtype`` stays the dtype every forward of the run computes in (generators, TAG, reference).
    The trainer *stores* its parameters, gradients and AdamW state in ``master_dtype`` and *computes*
    in ``param_dtype`` (FSDP2 casts the gathered parameters); gradients are reduced in
    ``reduce_dtype``. ``None`` keeps today's behaviour: one dtype for all (``model.dtype``)."""

    param_dtype: str | None = None  # trainer compute dtype; None = model.dtype
    reduce_dtype: str | None = None  # gradient reduce-scatter dtype; None = the master dtype
    master_dtype: str | None = None  # stored params / grads / optimizer state; None = model.dtype
    activation_checkpointing: bool = False  # recompute each transformer block's forward in the backward
    param_offload: bool = False  # FSDP2 CPUOffloadPolicy: sharded params, grads and optimizer step on the host
    optimizer_offload: bool = False  # AdamW state in host memory except during the optimizer step

    def compute(self, model_dtype: str) -> str:
        return self.param_dtype or model_dtype

    def master(self, model_dtype: str) -> str:
        return self.master_dtype or model_dtype

    def reduce(self, model_dtype: str) -> str:
        return self.reduce_dtype or self.master(model_dtype)

    def mixed(self, model_dtype: str) -> bool:
        """Whether FSDP2 casts: the trainer computes or reduces in another dtype than it stores."""
        m = self.master(model_dtype)
        return self.compute(model_dtype) != m or self.reduce(model_dtype) != m

    def needs_fsdp(self, model_dtype: str) -> bool:
        """Mixed precision and parameter offload are FSDP2 policies: a one-rank trainer pool then runs
        FSDP2 over a one-rank process group instead of a plain module."""
        return self.mixed(model_dtype) or self.param_offload


@dataclass(frozen=True)
class WorkerConfig:
    """Everything every worker builds from; picklable, identical on every worker."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    memory: ActorMemoryConfig = field(default_factory=ActorMemoryConfig)  # trainer precision / offload / recompute
    reward: Any = DEFAULT_LEARNABLE_REWARD  # a registry name, {name: weight}, or {"name": .., **kwargs}
    tsp_degree: int | None = None  # trained steps per pass; None = all K in one pass
    rows_per_pass: int | None = None  # rows per rank per pass (``schedule.rows``); None = what tsp_degree gives
    sequence_parallel: int = 1  # trainer ranks per Ulysses group (actor.ulysses_sequence_parallel_size)
    seed: int = 0  # sampling seed (placement-invariant streams)
    device: str = "cpu"  # "cuda" on GPU pools
    sync_backend: str = "object_store"  # or "collective"
    sync_bucket_mb: int = 2048  # collective sync: bucket size (digen.sync.bucket_mb; workers/buckets.py)
    sync_verify_payload: bool = False  # collective sync: SHA-256 over the payload on both ends (opt-in)
    # TAG: keep the generation copy on the trainer GPU between switches (the memory plan has room for it
    # beside the training state), instead of freeing it at the switch back and allocating it again
    keep_generation_copy: bool = True
    rollout_backend: str = "diffusers"  # generator rollout: "diffusers" (any device) or "vllm" (vLLM-Omni, GPU)
    vllm_pipeline: str | None = None  # rollout_backend="vllm": the RL pipeline class; None = verl-digen's own
    vllm_max_batch: int = 1  # rollout_backend="vllm": requests per engine batch (the micro-batch size)
    vllm_compile: bool = False  # rollout_backend="vllm": compile the engine's transformer (else eager)
    vllm_memory_fraction: float = 0.9  # rollout_backend="vllm": the engine's gpu_memory_utilization
