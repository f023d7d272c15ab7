"""Shared machinery of the diffusers adapters: argument checks, classifier-free guidance, prompt
encoding and VAE decoding. Each architecture writes ``_forward`` (one transformer call with its own
timestep convention and packing), ``_decode_latents`` and ``encode_with_pipeline``, and declares the
class attributes below (specs, packing, text widths, VAE compression): everything the loader, the
tiny builder and the registry need, in one file per architecture (docs/architecture.md, "Adding a
model")."""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import torch
from torch import nn

from verl_digen.archs import ArchFacts, PretrainedSpec, SequencePlan
from verl_digen.models.base import Conditioning, DiffusionModel
from verl_digen.models.conditioning.text import PromptEncoder
from verl_digen.models.precision import promote_fp32_layers
from verl_digen.models.spec import TinySpec

#: attention projections of the joint (MM-DiT) blocks; the usual FlowGRPO LoRA targets
MMDIT_LORA_TARGETS: tuple[str, ...] = (
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_add_out",
)


def cfg_combine(v_pos: torch.Tensor, v_neg: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance: v_neg + s * (v_pos - v_neg)."""
    return v_neg + scale * (v_pos - v_neg)


class DiffusersAdapter(DiffusionModel):
    """A diffusers transformer + VAE + prompt encoder behind the ``DiffusionModel`` contract."""

    # -- what each architecture declares (``arch.register`` checks they are all there) ----------------
    #: the architecture's torch-free facts (``verl_digen/archs.py``): its one home. ``arch``, ``aliases``,
    #: ``pretrained``, ``latent_ndim`` and ``sequence_plan`` below are read from it, never declared here
    facts: ClassVar[ArchFacts]
    #: canonical name used in configs (``model.arch``) = ``facts.name``
    arch: ClassVar[str]
    #: other spellings accepted for ``model.arch`` = ``facts.aliases``
    aliases: ClassVar[tuple[str, ...]] = ()
    #: the released diffusers pipeline: classes, text encoders, default size = ``facts.pretrained``
    pretrained: ClassVar[PretrainedSpec]
    #: the tiny random-weight config (tests, CPU default run, benchmarks)
    tiny: ClassVar[TinySpec]
    #: 2x2 token packing (FLUX, Qwen-Image): in_channels = 4 x latent channels, even latent sides
    packed: ClassVar[bool] = False
    #: transformer config field holding the width of the prompt token embeddings
    text_dim_key: ClassVar[str] = "joint_attention_dim"
    #: transformer config field of the pooled text vector's width; None when the model takes none
    pooled_dim_key: ClassVar[str | None] = None
    #: extra constructor arguments when built from released weights (to match the released pipeline)
    pretrained_init: ClassVar[dict[str, Any]] = {}
    #: module-name suffixes LoRA targets by default (see ``lora.apply_lora``)
    default_lora_targets: tuple[str, ...] = MMDIT_LORA_TARGETS
    #: 4 for images (B, C, H, W), 5 for video (B, C, F, H, W) = ``facts.latent_ndim``
    latent_ndim: int = 4
    #: how Ulysses sequence parallelism cuts the transformer = ``facts.sequence_plan``; None: it cannot
    sequence_plan: ClassVar[SequencePlan | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A class that declares ``facts`` takes its name, aliases, pipeline, latent rank and sequence plan
        from them (one home: nothing about the architecture is written twice)."""
        super().__init_subclass__(**kwargs)
        facts = cls.__dict__.get("facts")
        if isinstance(facts, ArchFacts):
            cls.arch, cls.aliases, cls.pretrained = facts.name, facts.aliases, facts.pretrained
            cls.latent_ndim, cls.sequence_plan = facts.latent_ndim, facts.sequence_plan

    def __init__(
        self,
        transformer: nn.Module,
        vae: nn.Module | None,
        prompt_encoder: PromptEncoder,
        latent_shape: tuple[int, ...],
        *,
        negative_prompt: str = "",
        scheduler_config: dict[str, Any] | None = None,
    ) -> None:
        if len(latent_shape) != self.latent_ndim - 1:
            raise ValueError(f"{self.arch} latent_shape must have {self.latent_ndim - 1} dims, got {latent_shape}")
        self.transformer = transformer
        if next(transformer.parameters()).dtype == torch.float64:
            promote_fp32_layers(transformer)  # exact float64 gradients (see precision.py)
        self.vae = vae
        self.prompt_encoder = prompt_encoder
        self.latent_shape = tuple(int(s) for s in latent_shape)
        # a guidance embedding in the transformer (FLUX.1-dev, HunyuanVideo) replaces the CFG branch
        self.guidance_distilled = bool(getattr(getattr(transformer, "config", None), "guidance_embeds", False))
        self.negative_prompt = negative_prompt
        #: the pipeline's scheduler config when loaded from weights (shift, dynamic shifting), else None
        self.scheduler_config = scheduler_config

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype: diffusers' notion, which skips ``_keep_in_fp32_modules`` (Wan in bf16)."""
        return getattr(self.transformer, "dtype", None) or super().dtype

    # -- the contract ------------------------------------------------------------------------------
    def uses_cfg(self, guidance_scale: float, cond: Conditioning) -> bool:
        """Whether ``velocity`` runs a second (negative) branch for this scale and conditioning."""
        return guidance_scale > 1.0 and not self.guidance_distilled and cond.negative is not None

    def velocity(
        self,
        latents: torch.Tensor,
        sigmas: torch.Tensor,
        cond: Conditioning,
        guidance_scale: float = 1.0,
    ) -> torch.Tensor:
        """Velocity per row at its own sigma; CFG runs both branches as one batched forward of 2B rows."""
        sigmas = self._check_inputs(latents, sigmas, cond)
        x = latents.to(self.dtype)
        pos = self._cast(cond.tensors)
        if not self.uses_cfg(guidance_scale, cond):
            v = self._forward(x, sigmas, pos, guidance_scale)
        else:
            neg = self._cast(cond.negative)
            both = {k: torch.cat([neg[k], pos[k]]) for k in pos}
            v_both = self._forward(torch.cat([x, x]), torch.cat([sigmas, sigmas]), both, guidance_scale)
            v_neg, v_pos = v_both.chunk(2)
            v = self._combine_cfg(v_pos, v_neg, guidance_scale)
        return v.to(latents.dtype)

    def encode_prompts(self, prompts: list[str]) -> Conditioning:
        """Positive conditioning per prompt, plus the negative prompt's (rows repeated) when the model
        can use classifier-free guidance (not for guidance-distilled models)."""
        if isinstance(prompts, str) or len(prompts) == 0:
            raise ValueError("encode_prompts takes a non-empty list of prompts")
        pos = self.prompt_encoder(list(prompts), device=self.device, dtype=self.dtype)
        neg = None
        if not self.guidance_distilled:
            one = self.prompt_encoder([self.negative_prompt], device=self.device, dtype=self.dtype)
            neg = {k: v.expand(len(prompts), *v.shape[1:]).clone() for k, v in one.items()}
        return Conditioning(pos, neg)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Pixels in [0, 1] through the VAE (no gradients)."""
        if self.vae is None:
            raise RuntimeError(f"{self.arch} model was built without a VAE; cannot decode")
        if latents.dim() != self.latent_ndim:
            raise ValueError(f"{self.arch} decode expects {self.latent_ndim}-D latents, got {tuple(latents.shape)}")
        vae_dtype = next(self.vae.parameters()).dtype
        with torch.no_grad():
            pixels = self._decode_latents(latents.to(vae_dtype))
        return (pixels.float() / 2 + 0.5).clamp(0, 1)

    # -- per-architecture knowledge used before an instance exists (loading, tiny builds) -------------
    @classmethod
    def vae_factors(cls, vae: nn.Module | None) -> tuple[int, int]:
        """(spatial, temporal) compression of ``vae``, read from its config as the pipeline reads it;
        with no VAE, the released model's (``facts.vae_factors``). Default: an ``AutoencoderKL`` image VAE."""
        if vae is None:
            return cls.facts.vae_factors
        return 2 ** (len(vae.config.block_out_channels) - 1), 1

    @classmethod
    def prompt_dims(cls, config: Any) -> tuple[int, int | None]:
        """(token width, pooled width or None) of the prompt embeddings a transformer with ``config``
        (its diffusers config, or the tiny kwargs as a dict) takes."""

        def get(key: str) -> Any:
            return config[key] if isinstance(config, dict) else getattr(config, key)

        return int(get(cls.text_dim_key)), (int(get(cls.pooled_dim_key)) if cls.pooled_dim_key else None)

    @classmethod
    def encode_with_pipeline(
        cls,
        pipeline: Any,
        prompts: list[str],
        *,
        device: torch.device | str | None,
        dtype: torch.dtype | None,
        max_sequence_length: int,
    ) -> dict[str, torch.Tensor]:
        """Conditioning tensors for ``prompts`` from a loaded pipeline's own ``encode_prompt``, renamed
        to the adapter keys (``prompt_embeds``, optionally ``pooled_prompt_embeds``, ``prompt_mask``)."""
        raise NotImplementedError(f"{cls.__name__} has no text-encoder path")

    # -- per-architecture hooks ----------------------------------------------------------------------
    @abc.abstractmethod
    def _forward(
        self, latents: torch.Tensor, sigmas: torch.Tensor, tensors: dict[str, torch.Tensor], guidance_scale: float
    ) -> torch.Tensor:
        """One transformer call on unpacked latents; returns the velocity with the latents' shape."""

    @abc.abstractmethod
    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """VAE decode to pixels in [-1, 1] (scaling/shift as the pipeline does it)."""

    def _combine_cfg(self, v_pos: torch.Tensor, v_neg: torch.Tensor, scale: float) -> torch.Tensor:
        return cfg_combine(v_pos, v_neg, scale)

    # -- helpers -------------------------------------------------------------------------------------
    def _cast(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        dev, dt = self.device, self.dtype
        return {k: v.to(device=dev, dtype=dt if v.is_floating_point() else None) for k, v in tensors.items()}

    def _check_inputs(self, latents: torch.Tensor, sigmas: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        if latents.dim() != self.latent_ndim:
            raise ValueError(
                f"{self.arch} expects {self.latent_ndim}-D unpacked latents, got shape {tuple(latents.shape)}"
            )
        if latents.shape[1] != self.latent_shape[0]:
            raise ValueError(f"{self.arch} expects {self.latent_shape[0]} latent channels, got {latents.shape[1]}")
        b = latents.shape[0]
        sigmas = torch.as_tensor(sigmas, device=latents.device)
        if sigmas.dim() == 0:
            sigmas = sigmas.expand(b)
        if sigmas.shape != (b,):
            raise ValueError(f"sigmas must have shape ({b},) (one per row), got {tuple(sigmas.shape)}")
        if len(cond) != b:
            raise ValueError(f"conditioning has {len(cond)} rows but latents have {b}")
        return sigmas.to(device=self.device, dtype=self.dtype)
