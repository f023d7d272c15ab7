"""verl-digen's RL pipelines for vLLM-Omni 0.30.0, one per architecture, installed by the engine through
``custom_pipeline_args={"pipeline_class": ...}`` (``request.DIGEN_PIPELINES``).

Imports vllm-omni: this module is imported only inside the engine's processes. Each class subclasses the
stock pipeline of its architecture, keeps its loading, text encoders, VAE and post-processing, and replaces
``forward``: encode the batch's prompts with the stock encoder, step every sample with ``stepper.step_batch``
(verl-digen's sigmas verbatim, its per-sample noise streams, ``algo.sde``), decode the final latents with the
VAE, and split the batch into one ``DiffusionOutput`` per request itself (the stock splitter drops the
``trajectory_*`` fields). The decoded output stays the stock tensor, so the stock post-processor turns it
into images as usual; the trajectory reaches ``OmniRequestOutput`` through its ``trajectory_*`` fields.
HunyuanVideo (1.0) has no stock vllm-omni pipeline: its class wraps diffusers' pipeline through vllm-omni's
``DiffusersAdapterPipeline``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from vllm_omni.diffusion.data import DiffusionOutput
from vllm_omni.diffusion.models.diffusers_adapter.pipeline_diffusers_adapter import DiffusersAdapterPipeline
from vllm_omni.diffusion.models.flux.pipeline_flux import FluxPipeline
from vllm_omni.diffusion.models.qwen_image.pipeline_qwen_image import QwenImagePipeline
from vllm_omni.diffusion.models.sd3.pipeline_sd3 import StableDiffusion3Pipeline
from vllm_omni.diffusion.models.wan2_2.pipeline_wan2_2 import Wan22Pipeline
from vllm_omni.diffusion.worker.request_batch import DiffusionRequestBatch

from verl_digen.models.arch import MODEL_REGISTRY
from verl_digen.models.base import Conditioning
from verl_digen.models.conditioning.text import pad_tokens
from verl_digen.rollout.omni.policy import compute_dtype, engine_policy
from verl_digen.rollout.omni.request import DIGEN_KEY, RowRequest, StepSettings
from verl_digen.rollout.omni.stepper import step_batch


class DigenRLPipeline:
    """The RL forward shared by every architecture (a mixin placed before the stock pipeline class)."""

    supports_request_batch = True
    digen_arch: ClassVar[str]

    # -- per architecture ----------------------------------------------------------------------------
    def _digen_encode(self, prompts: list[str], max_sequence_length: int) -> dict[str, torch.Tensor]:
        """Conditioning tensors under verl-digen's adapter keys, from the stock text encoders."""
        raise NotImplementedError

    def _digen_modules(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        """(transformer, vae) of the served pipeline."""
        return self.transformer, self.vae  # type: ignore[attr-defined]

    def digen_load_transformer_weights(self, state: dict[str, torch.Tensor]) -> None:
        """A full fine-tune's weights (diffusers names) through the stock ``load_weights`` mapping."""
        self.load_weights((f"transformer.{k}", v) for k, v in state.items())  # type: ignore[attr-defined]

    # -- shared ----------------------------------------------------------------------------------------
    def _digen_cond(self, prompts: list[str], negatives: list[str], cfg: bool) -> Conditioning:
        msl = MODEL_REGISTRY[self.digen_arch].pretrained.max_sequence_length
        pos = self._digen_encode(prompts, msl)
        neg = self._digen_encode(negatives, msl) if cfg else None
        return Conditioning(pos, neg)

    def forward(self, req: Any) -> list[DiffusionOutput]:
        batch = req if isinstance(req, DiffusionRequestBatch) else DiffusionRequestBatch(requests=[req])
        prompts = batch.prompts
        has_rows = [isinstance(p, dict) and DIGEN_KEY in (p.get("additional_information") or {}) for p in prompts]
        if not any(has_rows) and batch.is_dummy_run():  # the engine's warm-up request
            return [DiffusionOutput(output=None) for _ in range(batch.num_reqs)]
        rows = [RowRequest.from_prompt(p) for p in prompts]
        settings = StepSettings.from_extra_args(batch.sampling_params_list[0].extra_args)
        transformer, vae = self._digen_modules()
        distilled = getattr(transformer, "guidance_embeds", None)
        policy = engine_policy(self.digen_arch, transformer, settings.latent_shape, vae=vae,
                               guidance_distilled=distilled)
        cfg = settings.guidance_scale > 1.0 and not policy.guidance_distilled
        cond = self._digen_cond([p["prompt"] for p in prompts], [p.get("negative_prompt") or "" for p in prompts],
                                cfg)
        device = next(transformer.parameters()).device
        result = step_batch(policy, cond, rows, settings, compute_dtype(policy.dtype), device)
        pixels = policy.decode(result.final) * 2 - 1  # the stock VAE output range, for the stock post-processor
        return [
            DiffusionOutput(
                output=pixels[i:i + 1],
                trajectory_latents=result.row_latents(i).unsqueeze(0).float().cpu(),
                trajectory_log_probs=result.log_probs[i:i + 1].float().cpu(),
                trajectory_timesteps=result.sigmas[i:i + 1].cpu(),
            )
            for i in range(batch.num_reqs)
        ]


class DigenSD3Pipeline(DigenRLPipeline, StableDiffusion3Pipeline):
    digen_arch = "sd3"

    def _digen_encode(self, prompts: list[str], max_sequence_length: int) -> dict[str, torch.Tensor]:
        pe, pooled = self.encode_prompt(prompt=prompts, prompt_2=None, prompt_3=None,
                                        max_sequence_length=max_sequence_length)
        return {"prompt_embeds": pe, "pooled_prompt_embeds": pooled}


class DigenFluxPipeline(DigenRLPipeline, FluxPipeline):
    """Packed latents: verl-digen's FLUX adapter packs x into 2x2 tokens around each transformer call and
    unpacks the velocity, so the SDE runs on unpacked latents as the trainer's does."""

    digen_arch = "flux"

    def _digen_encode(self, prompts: list[str], max_sequence_length: int) -> dict[str, torch.Tensor]:
        pe, pooled, _ = self.encode_prompt(prompt=prompts, prompt_2=None, max_sequence_length=max_sequence_length)
        return {"prompt_embeds": pe, "pooled_prompt_embeds": pooled}


class DigenQwenImagePipeline(DigenRLPipeline, QwenImagePipeline):
    """Packed latents as FLUX; the text mask padded to a fixed length as the adapter's encoder pads it."""

    digen_arch = "qwen_image"

    def _digen_encode(self, prompts: list[str], max_sequence_length: int) -> dict[str, torch.Tensor]:
        pe, mask = self.encode_prompt(prompt=prompts, max_sequence_length=max_sequence_length)
        if mask is None:
            mask = torch.ones(pe.shape[:2], dtype=torch.long, device=pe.device)
        return {"prompt_embeds": pad_tokens(pe, max_sequence_length),
                "prompt_mask": pad_tokens(mask.long(), max_sequence_length)}


class DigenWanPipeline(DigenRLPipeline, Wan22Pipeline):
    """Wan2.1 and Wan2.2 TI2V-5B (one transformer; the two-expert A14B is refused by verl-digen)."""

    digen_arch = "wan"

    def _digen_encode(self, prompts: list[str], max_sequence_length: int) -> dict[str, torch.Tensor]:
        pe, _ = self.encode_prompt(prompt=prompts, negative_prompt=None, do_classifier_free_guidance=False,
                                   max_sequence_length=max_sequence_length)
        return {"prompt_embeds": pe}


class DigenHunyuanVideoPipeline(DigenRLPipeline, DiffusersAdapterPipeline):
    """HunyuanVideo 1.0 through diffusers' ``HunyuanVideoPipeline`` (vllm-omni 0.30.0 serves only 1.5)."""

    digen_arch = "hunyuan_video"

    def _digen_modules(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        return self._pipeline.transformer, self._pipeline.vae

    def _digen_encode(self, prompts: list[str], max_sequence_length: int) -> dict[str, torch.Tensor]:
        adapter = MODEL_REGISTRY[self.digen_arch]
        transformer, _ = self._digen_modules()
        p = next(transformer.parameters())
        return adapter.encode_with_pipeline(self._pipeline, prompts, device=p.device, dtype=p.dtype,
                                            max_sequence_length=max_sequence_length)

    def digen_load_transformer_weights(self, state: dict[str, torch.Tensor]) -> None:
        self._pipeline.transformer.load_state_dict(state, strict=True)
