"""What the generator needs to know about a served checkpoint without loading its transformer: the
latent shape and pixel size of a request, packing, guidance distillation, and the prompt conditioning the
trainer recomputes on (``Trajectories.cond``) from the checkpoint's text encoders alone.

With ``rollout.backend=vllm`` the engine holds the only copy of the policy on the generator GPU, and the
generator reads the rest from the checkpoint's config files. ``TextConditioner`` loads the checkpoint's text
encoders for a pipeline that cannot encode for the generator (``rollout.vllm_pipeline`` outside verl-digen);
verl-digen's own pipelines answer through the engine's encoders (``workers.vllm_backend.EngineConditioner``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from verl_digen.models.arch import MODEL_REGISTRY, canonical_arch
from verl_digen.models.base import Conditioning
from verl_digen.models.conditioning.text import PipelinePromptEncoder
from verl_digen.models.loading import latent_shape_for, load_pipeline
from verl_digen.rollout.omni.request import pixel_size


class _Config(dict):
    """A diffusers config dict read with attribute access (missing keys are None, as ``vae_factors`` expects)."""

    def __getattr__(self, key: str) -> Any:
        return self.get(key)


class _Module:
    """Stands in for a module whose ``config`` is all a shape computation reads."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = _Config(config)


@dataclass(frozen=True)
class ServedShape:
    """A request's geometry and what the architecture's transformer does with guidance."""

    latent_shape: tuple[int, ...]
    pixels: tuple[int, int, int]  # height, width, frames (1 for images)
    spatial: int
    temporal: int
    packed: bool
    guidance_distilled: bool


def served_shape(
    arch: str, transformer_config: dict[str, Any], vae_config: dict[str, Any] | None, *,
    latent_size: int | None = None, latent_width: int | None = None, num_frames: int | None = None,
) -> ServedShape:
    """The request geometry of a checkpoint from its transformer and VAE configs (as ``load_pretrained``
    sizes a loaded model: ``latent_size`` / ``latent_width`` in latents, else the architecture's default)."""
    cls = MODEL_REGISTRY[canonical_arch(arch)]
    vae = _Module(vae_config) if vae_config is not None else None
    spatial, temporal = cls.vae_factors(vae)  # type: ignore[arg-type]
    height = width = None
    if latent_size is not None:
        height, width = latent_size * spatial, (latent_width or latent_size) * spatial
    shape = latent_shape_for(arch, _Module(transformer_config), vae, height, width, num_frames)  # type: ignore[arg-type]
    return ServedShape(shape, pixel_size(shape, spatial, temporal), spatial, temporal, cls.packed,
                       bool(transformer_config.get("guidance_embeds", False)))


def read_served_shape(arch: str, path: str, **sizes: Any) -> ServedShape:
    """``served_shape`` from a local diffusers checkpoint's ``transformer`` and ``vae`` config files."""
    import diffusers

    # load_config is ConfigMixin's: each component class has it (ModelMixin itself does not)
    spec = MODEL_REGISTRY[canonical_arch(arch)].pretrained
    tcfg = getattr(diffusers, spec.transformer_class).load_config(path, subfolder="transformer", local_files_only=True)
    try:
        vcfg = getattr(diffusers, spec.vae_class).load_config(path, subfolder="vae", local_files_only=True)
    except OSError:
        vcfg = None
    return served_shape(arch, dict(tcfg), dict(vcfg) if vcfg is not None else None, **sizes)


class TextConditioner:
    """Prompt conditioning as the policy adapter builds it (positive rows, and the negative prompt's rows when
    the model uses classifier-free guidance), from a pipeline loaded without transformer and VAE."""

    def __init__(self, encoder: Any, guidance_distilled: bool, negative_prompt: str = "",
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        self.encoder, self.guidance_distilled = encoder, guidance_distilled
        self.negative_prompt, self.device, self.dtype = negative_prompt, device, dtype

    @classmethod
    def from_checkpoint(cls, arch: str, path: str, dtype: torch.dtype, device: torch.device | str,
                        guidance_distilled: bool, negative_prompt: str = "") -> TextConditioner:
        pipe = load_pipeline(arch, path, dtype, transformer=None, vae=None).to(device)
        encoder = PipelinePromptEncoder(pipe, MODEL_REGISTRY[canonical_arch(arch)])
        return cls(encoder, guidance_distilled, negative_prompt, device, dtype)

    def __call__(self, prompts: list[str]) -> Conditioning:
        pos = self.encoder(list(prompts), device=self.device, dtype=self.dtype)
        neg = None
        if not self.guidance_distilled:
            one = self.encoder([self.negative_prompt], device=self.device, dtype=self.dtype)
            neg = {k: v.expand(len(prompts), *v.shape[1:]).clone() for k, v in one.items()}
        return Conditioning(pos, neg).to(device="cpu")
