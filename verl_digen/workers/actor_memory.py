"""Memory and precision of the trainer's policy: what ``TSPActorWorker.init_model`` builds.

- the trainable policy in the master dtype (``actor.master_dtype``), FSDP2-sharded with the
  mixed-precision and offload policies (``actor.param_dtype`` / ``reduce_dtype`` / ``param_offload``),
  blocks recomputed in the backward when ``actor.activation_checkpointing`` is on;
- the KL reference: the adapters-off base model with LoRA (no copy at all), else a frozen copy in the
  compute dtype that is FSDP2-sharded like the policy, so each rank holds 1/R of it, never a full one;
- the bytes a rank holds per kind (``memory_report``), which ``bench/memory_plan.py`` holds the
  estimate of ``config/memory.py`` against.

Why in one place: the dry run's memory plan (``config/memory.py``) models exactly these choices, so
the estimate and the trainer cannot drift apart silently (docs/architecture.md).
"""

from __future__ import annotations

from typing import Any

import torch

from verl_digen.models import parse_dtype
from verl_digen.models.base import DiffusionModel
from verl_digen.workers import fsdp
from verl_digen.workers import policy as P
from verl_digen.workers.config import WorkerConfig


def shard(model: DiffusionModel, cfg: WorkerConfig, world: int, device: torch.device, trainable: bool) -> None:
    """FSDP2 over ``model``'s transformer with the run's precision and offload policies (a frozen
    copy is already in the compute dtype: no cast)."""
    mem, dt = cfg.memory, cfg.policy.dtype
    mixed = trainable and mem.mixed(dt)
    fsdp.shard_transformer(model.transformer, world, device,
                           param_dtype=parse_dtype(mem.compute(dt)) if mixed else None,
                           reduce_dtype=parse_dtype(mem.reduce(dt)) if mixed else None,
                           offload=mem.param_offload)


def trainer_policy(cfg: WorkerConfig, device: torch.device, world: int, sharded: bool) -> DiffusionModel:
    """The trainable policy: master dtype, checkpointed blocks, sharded when ``sharded``."""
    mem = cfg.memory
    model = P.build_policy(cfg, device, dtype=mem.master(cfg.policy.dtype))
    if mem.activation_checkpointing:
        fsdp.enable_activation_checkpointing(model.transformer)
    if sharded:
        shard(model, cfg, world, device, trainable=True)
    model.transformer.train()
    return model


def reference_policy(cfg: WorkerConfig, device: torch.device, world: int, sharded: bool) -> DiffusionModel | None:
    """The frozen KL reference of a full fine-tune (``None`` without KL, or with LoRA, where the
    reference is the policy with its adapters disabled). Built in the compute dtype and sharded over
    the trainer pool like the policy: its forward is then collective, which the trainer's lock-step
    update (equal row shares on every rank) already guarantees."""
    if cfg.loss.kl_coef <= 0 or cfg.policy.lora:
        return None
    ref = P.freeze(P.build_policy(cfg, device, dtype=cfg.memory.compute(cfg.policy.dtype)))
    if sharded:
        shard(ref, cfg, world, device, trainable=False)
    return ref


def memory_report(model: DiffusionModel, optimizer: torch.optim.Optimizer, ref: DiffusionModel | None,
                  gen: DiffusionModel | None) -> dict[str, Any]:
    """Bytes this rank holds per kind: the policy's parameters, their gradients, the optimizer state,
    the reference copy and TAG's generation copy (local shards of sharded tensors)."""
    params = [p for p in model.transformer.parameters()]
    trainable = [p for p in params if p.requires_grad]
    state = [v for p in trainable for v in optimizer.state.get(p, {}).values() if torch.is_tensor(v) and v.dim()]
    return {
        "weights": fsdp.local_bytes(params),
        "grads": fsdp.local_bytes(p.grad for p in trainable),
        "optimizer": fsdp.local_bytes(state),
        "reference": fsdp.local_bytes(ref.transformer.parameters()) if ref is not None else 0,
        "generation": fsdp.local_bytes(gen.transformer.parameters()) if gen is not None else 0,
        "trainable_params": sum(p.numel() for p in trainable),
    }
