"""verl-digen's RL pipelines for vLLM-Omni 0.30.0, one per architecture, installed by the engine through
``custom_pipeline_args={"pipeline_class": ...}`` (``ArchFacts.rl_pipeline``).

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
    #: the engine's names of trainer tensors its ``load_weights`` renames (whole names, then name parts)
    digen_read_renames: ClassVar[dict[str, str]] = {}
    digen_read_subs: ClassVar[tuple[tuple[str, str], ...]] = ()

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

    def digen_read_transformer_weights(self, layout: list[tuple[str, tuple[int, ...]]]) -> dict[str, torch.Tensor]:
        """The served transformer's weights under the trainer's (diffusers) names and shapes ``layout``: the
        inverse of ``load_weights``, reading a fused projection's shards back out of it (tensor parallel 1: the
        shards lie along dim 0 in q, k, v order) and undoing the engine's module renames. Clones on the engine's
        device, one tensor at a time (``GeneratorWorker.weights_checksum``, the tier's bit-identity check)."""
        from verl_digen.rollout.omni.lora import engine_name, engine_renames

        transformer = self.transformer  # type: ignore[attr-defined]
        own = dict(transformer.named_parameters())
        own.update(dict(transformer.named_buffers()))
        mapping = list(getattr(transformer, "stacked_params_mapping", None) or [])
        shapes = dict(layout)
        renames = engine_renames(self.digen_arch)
        out: dict[str, torch.Tensor] = {}
        for name, shape in layout:
            seen = [name, engine_name(name, renames), self.digen_read_renames.get(name, name)]
            seen += [name.replace(a, b) for a, b in self.digen_read_subs if a in name]
            out[name] = _read_one(name, tuple(shape), own, mapping, shapes, seen)
        return out

    @torch.no_grad()
    def digen_encode(self, prompts: list[str], negatives: list[str], cfg: bool) -> Conditioning:
        """``_digen_cond`` as the generator hands it to the trainer: CPU tensors."""
        return self._digen_cond(prompts, negatives, cfg).to(device="cpu")

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
        # a diffusers model's config (HunyuanVideo; its attribute access is deprecated), else the module's own
        distilled = getattr(getattr(transformer, "config", None), "guidance_embeds", None)
        if distilled is None:
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


_SHARD_ORDER = {"q": 0, "k": 1, "v": 2}


def _read_one(name: str, shape: tuple[int, ...], own: dict[str, torch.Tensor], mapping: list[tuple[str, str, Any]],
              shapes: dict[str, tuple[int, ...]], candidates: list[str]) -> torch.Tensor:
    """One trainer tensor out of the engine's (``digen_read_transformer_weights``)."""
    for fused, sub, _ in mapping:
        if sub not in name:
            continue
        fused_name = name.replace(sub, fused)
        if fused_name not in own:
            break
        shards = sorted(((s, sid) for f, s, sid in mapping if f == fused),
                        key=lambda e: _SHARD_ORDER.get(e[1], e[1]) if not isinstance(e[1], int) else e[1])
        start = 0
        for s, _ in shards:
            if s == sub:
                return own[fused_name].detach().narrow(0, start, shape[0]).clone()
            start += shapes[name.replace(sub, s)][0]
    for candidate in candidates:
        t = own.get(candidate)
        if t is not None and tuple(t.shape) == shape:
            return t.detach().clone()
    raise KeyError(f"the served transformer holds no tensor for the trainer's {name!r} {shape} (nor a fused "
                   "projection it is a shard of)")


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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # vllm-omni's LoRA manager maps an adapter's to_q / to_k / to_v onto the fused to_qkv layers through the
        # modules' ``stacked_params_mapping`` attribute (vllm_omni/diffusion/lora/manager.py:153-204), which
        # 0.30.0's FLUX transformer keeps local to ``load_weights`` (flux/flux_transformer.py:716); without it
        # every FLUX LoRA update fails ("expected target modules in {...'to_qkv'...}"). Expose the transformer's
        # own ``packed_modules_mapping`` (flux_transformer.py:531) in that form, as SD3's transformer does.
        transformer = self.transformer
        packed = getattr(type(transformer), "packed_modules_mapping", None) or {}
        if packed and getattr(transformer, "stacked_params_mapping", None) is None:
            transformer.stacked_params_mapping = [
                (f".{fused}", f".{sub}", shard) for fused, subs in packed.items()
                for sub, shard in zip(subs, ("q", "k", "v"))
            ]

    def _digen_encode(self, prompts: list[str], max_sequence_length: int) -> dict[str, torch.Tensor]:
        pe, pooled, _ = self.encode_prompt(prompt=prompts, prompt_2=None, max_sequence_length=max_sequence_length)
        return {"prompt_embeds": pe, "pooled_prompt_embeds": pooled}


class _WithTextLengths(torch.nn.Module):
    """vllm-omni 0.30.0's Qwen-Image transformer sizes its text RoPE table from a ``txt_seq_lens`` argument
    (``qwen_image/qwen_image_transformer.py:1152,1197,475``: without it, "'NoneType' object is not iterable"; its
    own pipeline passes the padded embedding width, ``pipeline_qwen_image.py:765`` and ``rope_utils.py:9-24``).
    Diffusers' transformer, which verl-digen's adapter calls, takes the width from ``encoder_hidden_states`` and
    has no such argument. This view of the engine's transformer adds it; everything else is the transformer's."""

    def __init__(self, transformer: torch.nn.Module) -> None:
        super().__init__()
        self.inner = transformer

    def forward(self, *args: Any, encoder_hidden_states: torch.Tensor, **kwargs: Any) -> Any:
        b, width = encoder_hidden_states.shape[:2]
        return self.inner(*args, encoder_hidden_states=encoder_hidden_states, txt_seq_lens=[width] * b, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)


class DigenQwenImagePipeline(DigenRLPipeline, QwenImagePipeline):
    """Packed latents as FLUX; the text mask padded to a fixed length as the adapter's encoder pads it."""

    digen_arch = "qwen_image"

    def _digen_modules(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        return _WithTextLengths(self.transformer), self.vae

    def _digen_encode(self, prompts: list[str], max_sequence_length: int) -> dict[str, torch.Tensor]:
        pe, mask = self.encode_prompt(prompt=prompts, max_sequence_length=max_sequence_length)
        if mask is None:
            mask = torch.ones(pe.shape[:2], dtype=torch.long, device=pe.device)
        return {"prompt_embeds": pad_tokens(pe, max_sequence_length),
                "prompt_mask": pad_tokens(mask.long(), max_sequence_length)}


class DigenWanPipeline(DigenRLPipeline, Wan22Pipeline):
    """Wan2.1 and Wan2.2 TI2V-5B (one transformer; the two-expert A14B is refused by verl-digen)."""

    digen_arch = "wan"
    # vllm-omni 0.30.0's Wan ``load_weights`` renames (wan2_2/wan2_2_transformer.py:1224-1291)
    digen_read_renames: ClassVar[dict[str, str]] = {
        "scale_shift_table": "output_scale_shift_prepare.scale_shift_table"}
    digen_read_subs = ((".ffn.net.0.", ".ffn.net_0."), (".ffn.net.2.", ".ffn.net_2."), (".to_out.0.", ".to_out."))

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

    def load_weights(self, weights: Any = None) -> None:
        """vllm-omni's loader calls ``model.load_weights(weights)`` on every pipeline it builds, a custom one too
        (``vllm_omni/diffusion/model_loader/diffusers_loader.py:1093``), with the weights of the pipeline's
        ``weights_sources`` (none here: an empty iterator, ``:411-419,475-481``); ``DiffusersAdapterPipeline``'s
        takes no argument and loads the whole diffusers pipeline itself
        (``diffusers_adapter/pipeline_diffusers_adapter.py:120``), so as inherited it fails with "takes 1
        positional argument but 2 were given"."""
        for _ in weights or ():  # drain the (empty) iterator
            pass
        DiffusersAdapterPipeline.load_weights(self)
        # the adapter picks the first flash backend that imports (pipeline_diffusers_adapter.py:173,329-420), and
        # diffusers' flash backends refuse the attention mask HunyuanVideo's text tokens need ("`attn_mask` is not
        # supported for native flash attention"): attend as the trainer does, with PyTorch SDPA
        self._pipeline.transformer.set_attention_backend("native")

    def digen_load_transformer_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Some of the transformer's tensors (an update arrives bucket by bucket); a name it lacks is an error."""
        own = self._pipeline.transformer.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise KeyError(f"the served transformer has no tensors {unknown[:5]}")
        with torch.no_grad():
            for k, v in state.items():
                own[k].copy_(v)

    def digen_read_transformer_weights(self, layout: list[tuple[str, tuple[int, ...]]]) -> dict[str, torch.Tensor]:
        own = self._pipeline.transformer.state_dict()
        return {k: own[k].detach().clone() for k, _ in layout}

    def digen_read_lora(self) -> dict[str, torch.Tensor]:
        """The adapters installed by ``digen_load_lora`` (PEFT names), cloned on the engine's device."""
        from peft import get_peft_model_state_dict

        from verl_digen.models.lora import ADAPTER_NAME

        state = get_peft_model_state_dict(self._pipeline.transformer, adapter_name=ADAPTER_NAME)
        return {k: v.detach().clone() for k, v in state.items()}

    def digen_load_lora(self, state: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
        """LoRA adapters, installed as the trainer holds them (diffusers' ``add_adapter`` under verl-digen's
        adapter name, then peft's state-dict loader). vllm-omni's LoRA manager wraps only vLLM's linear layers
        (``vllm_omni/diffusion/lora/manager.py:129-140``); this pipeline's are torch's, so a ``LoRARequest``
        fails with "No supported LoRA modules found in the diffusion pipeline" (``manager.py:295-296``)."""
        from peft import LoraConfig, set_peft_model_state_dict

        from verl_digen.models.lora import ADAPTER_NAME

        transformer = self._pipeline.transformer
        if not getattr(transformer, "_hf_peft_config_loaded", False):
            keys = ("r", "lora_alpha", "target_modules", "lora_dropout", "bias")
            transformer.add_adapter(LoraConfig(**{k: config[k] for k in keys}), adapter_name=ADAPTER_NAME)
        p = next(transformer.parameters())
        set_peft_model_state_dict(transformer, {k: v.to(device=p.device, dtype=p.dtype) for k, v in state.items()},
                                  adapter_name=ADAPTER_NAME)
