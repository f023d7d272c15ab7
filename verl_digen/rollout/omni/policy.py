"""The velocity of an engine's transformer, computed exactly as the trainer computes it.

A vLLM-Omni pipeline holds its own transformer module (vllm-omni's re-implementation, with diffusers'
keyword signature). Wrapping it in verl-digen's adapter class for the architecture reuses that class's
``_forward`` (timestep convention, 2x2 packing, RoPE ids, guidance embedding) and its classifier-free
guidance (one batched forward of the negative and positive rows): one home for each of those facts, so the
engine cannot step on a velocity the trainer would not recompute.
"""

from __future__ import annotations

import torch
from torch import nn

from verl_digen.models.adapter import DiffusersAdapter
from verl_digen.models.arch import MODEL_REGISTRY, canonical_arch


def engine_policy(
    arch: str, transformer: nn.Module, latent_shape: tuple[int, ...], *, vae: nn.Module | None = None,
    pretrained: bool = True, guidance_distilled: bool | None = None,
) -> DiffusersAdapter:
    """The adapter of ``arch`` around ``transformer`` and the pipeline's ``vae`` (no prompt encoder: the
    pipeline encodes with its own text encoders).
    ``pretrained`` applies the class's released-pipeline settings (Qwen-Image's CFG renormalisation), as
    ``models.load_pretrained`` does; ``guidance_distilled`` overrides the transformer-config probe for a
    module that has no diffusers ``config`` (vllm-omni's FLUX)."""
    cls = MODEL_REGISTRY[canonical_arch(arch)]
    init = cls.pretrained_init if pretrained else {}
    model = cls(transformer, vae, None, tuple(int(d) for d in latent_shape), **init)  # type: ignore[arg-type]
    if guidance_distilled is not None:
        model.guidance_distilled = bool(guidance_distilled)
    return model


def compute_dtype(model_dtype: torch.dtype) -> torch.dtype:
    """The dtype the SDE runs in inside an engine: at least float32 (bf16 latents would lose the noise)."""
    return torch.promote_types(model_dtype, torch.float32)
