"""Generator rollout through vLLM-Omni (``WorkerConfig.rollout_backend = "vllm"``; ``pip install
verl-digen[vllm]``, which pins vllm 0.30.x and vllm-omni 0.30.0), for GPU generator pools. **It has never
run, and as written it cannot work on any architecture verl-digen supports** (see below).

The vllm-omni 0.30.0 APIs it calls, checked against that wheel's source (paths in the vllm-omni package):

- ``Omni`` (``vllm_omni/entrypoints/omni.py:29``) and its ``generate`` overloads (``:59``, ``:69``,
  ``:78``), with one sampling-params entry per pipeline stage;
- ``OmniDiffusionSamplingParams`` (``vllm_omni/inputs/data.py:204``): ``seed`` (:225), ``latents``
  (:245), ``num_frames`` (:254), ``height`` / ``width`` (:258-259), ``num_inference_steps`` (:277),
  ``guidance_scale`` (:278), ``eta`` (:286), ``sigmas`` (:287), ``return_trajectory_latents`` (:313),
  ``extra_args`` (:319), ``lora_request`` (:326);
- ``LoRARequest``: ``vllm_omni/lora/request.py:6`` re-exports vllm's;
- ``OmniRequestOutput`` (``vllm_omni/outputs/__init__.py:115``): ``images`` is a list of PIL images
  (:169); ``trajectory_latents``, ``trajectory_timesteps`` and ``trajectory_log_probs`` (:171-173);
- a custom pipeline class goes in through ``custom_pipeline_args`` (``vllm_omni/config/omni_config.py:888``,
  ``vllm_omni/diffusion/worker/diffusion_worker.py:1114``), which this module never passes.

Why it cannot work as written (issue 26 of the tracker; the fix is verl-digen's own RL pipelines):
- Of the stock pipelines only BAGEL's reads ``return_trajectory_latents``
  (``vllm_omni/diffusion/models/bagel/pipeline_bagel.py:1071``) and none records SDE log-probs, so
  ``generate`` raises "no trajectory latents/log-probs" unless an RL pipeline is installed.
- The sigmas sent here are already shifted (``sampler.sigmas``); SD3's pipeline hands them to
  ``scheduler.set_timesteps`` (``vllm_omni/diffusion/models/sd3/pipeline_sd3.py:125``), which shifts again.
- ``eta`` is read only by the Sana-video pipelines; the SDE type and noise level an RL pipeline reads go
  in ``extra_args``; no window, height, width or frame count is sent; one request per row gives up request
  batching; FLUX and Qwen-Image latents are passed unpacked.
- Only x_T is placement-invariant (the per-step noise is the engine's), so a vLLM trajectory is not the
  diffusers one for the same sample.
- LoRA adapters are written to a temporary directory per version (never cleaned) under a new adapter id;
  full fine-tune updates are refused (verl-omni uses its own worker extension).

What verl-digen's RL pipeline for it has to do (read from vllm-omni 0.30.0 and verl-omni's SD3 Flow-GRPO
pipeline; not written yet):
- Install: ``custom_pipeline_args={"pipeline_class": "<module>.<Class>"}``; the class is built as
  ``cls(od_config=...)`` (``vllm_omni/diffusion/model_loader/diffusers_loader.py:1202-1204``) and needs
  ``supports_request_batch = True`` to batch (``vllm_omni/diffusion/diffusion_engine.py:143-174``).
- ``forward(req: DiffusionRequestBatch) -> list[DiffusionOutput]``, one per request
  (``vllm_omni/diffusion/models/sd3/pipeline_sd3.py:631``); batch-wide settings come from the first
  request's sampling params (``:634-655``), and the request scheduler does not key batches on
  ``extra_args`` (``vllm_omni/diffusion/sched/request_scheduler.py:43-56``): per-row data (ids, seeds,
  step) must travel in each request's prompt dict, which the synchronous ``Omni.generate`` also needs
  (it shares one sampling-params object between prompts, ``vllm_omni/entrypoints/omni.py:132,154``).
- Split the batch's output per request itself: the stock splitter drops the ``trajectory_*`` fields
  (``vllm_omni/diffusion/worker/request_batch.py:30-80``); extra tensors go in an output envelope's
  ``metadata`` groups (``vllm_omni/diffusion/output_formatter.py:37-61,256-268``).
- Replace SD3's post-process function before the engine starts (it is chosen by model class name and
  would run on the envelope: ``vllm_omni/diffusion/registry.py:849-857``); the pipeline module must be
  imported in the driver-side process first.
- Weights: LoRA from in-memory tensors through the pipeline hook ``_load_diffusion_lora_adapter``
  (``vllm_omni/diffusion/lora/manager.py:291-329``; remove the adapter id before re-adding, ``:808-834``);
  full fine-tune through a worker extension calling ``pipeline.load_weights`` with ``transformer.``-prefixed
  names (``vllm_omni/diffusion/models/sd3/pipeline_sd3.py:772-774``).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_digen.algo.seeding import sample_seed
from verl_digen.algo.trajectory import Trajectories
from verl_digen.models.base import DiffusionModel
from verl_digen.rollout.sampler import initial_noise
from verl_digen.workers.config import WorkerConfig

INSTALL_HINT = "pip install verl-digen[vllm]"


def require_vllm_omni() -> tuple[Any, Any, Any]:
    """(Omni, OmniDiffusionSamplingParams, LoRARequest), or an ImportError naming the extra."""
    try:
        import vllm  # noqa: F401
        from vllm_omni.entrypoints.omni import Omni
        from vllm_omni.inputs.data import OmniDiffusionSamplingParams
        from vllm_omni.lora.request import LoRARequest
    except ImportError as err:
        raise ImportError(
            f"rollout_backend='vllm' needs vllm and vllm-omni ({err}); install them with `{INSTALL_HINT}` "
            "or use rollout_backend='diffusers'"
        ) from err
    return Omni, OmniDiffusionSamplingParams, LoRARequest


def _first(value: Any) -> Any:
    """Strip a leading batch dimension of one (outputs are per request)."""
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == 1:
        return value[0]
    return value


class VllmOmniRollout:
    """One vLLM-Omni engine per generator worker; ``generate`` returns our ``Trajectories``."""

    def __init__(self, cfg: WorkerConfig, model: DiffusionModel, **engine_kwargs: Any) -> None:
        omni_cls, self._params_cls, self._lora_cls = require_vllm_omni()
        if not cfg.policy.pretrained:
            raise ValueError("rollout_backend='vllm' serves a real checkpoint: set policy.pretrained")
        self.cfg, self.model = cfg, model
        self.engine = omni_cls(model=cfg.policy.pretrained, **engine_kwargs)
        self.lora_request = None
        self._lora_dir = Path(tempfile.mkdtemp(prefix="digen_lora_"))

    def load_weights(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Serve new adapters (PEFT layout on local disk, one ``LoRARequest`` id per version)."""
        if not self.cfg.policy.lora:
            raise NotImplementedError(
                "full fine-tune weight updates into a running vLLM-Omni engine are not a public vllm-omni "
                "API (verl-omni uses its own worker extension); use LoRA or rollout_backend='diffusers'"
            )
        from safetensors.torch import save_file

        out = self._lora_dir / f"v{version}"
        out.mkdir(parents=True, exist_ok=True)
        peft_cfg = self.model.transformer.peft_config["default"].to_dict()
        peft_cfg = {k: (sorted(v) if isinstance(v, set) else v) for k, v in peft_cfg.items()}
        (out / "adapter_config.json").write_text(json.dumps(peft_cfg, default=str))
        save_file({f"base_model.model.{k}": v.contiguous() for k, v in state.items()},
                  str(out / "adapter_model.safetensors"))
        self.lora_request = self._lora_cls(f"digen_v{version}", version + 1, str(out))

    def _params(self, x_t: torch.Tensor, seed: int) -> Any:
        s = self.cfg.sampler
        return self._params_cls(
            num_inference_steps=s.num_steps, guidance_scale=s.guidance_scale, seed=seed,
            latents=x_t.unsqueeze(0), sigmas=s.sigmas(torch.float64)[:-1].tolist(), eta=s.eta,
            return_trajectory_latents=True, lora_request=self.lora_request,
            extra_args={"logprobs": True, "sde_type": s.sde},
        )

    def generate(self, step: int, version: int, prompt_ids: list[int], sample_ids: list[int],
                 prompts: list[str]) -> Trajectories:
        """One request per row (per-sample seeds); trained steps selected like the diffusers sampler."""
        s, model = self.cfg.sampler, self.model
        dtype = model.dtype
        x_t = initial_noise(tuple(model.latent_shape), prompt_ids, sample_ids, self.cfg.seed, step, dtype,
                            s.shared_group_noise)
        sigmas = s.sigmas(dtype)
        selected = s.selection.select(s.num_steps, self.cfg.seed, step, prompt_ids, sample_ids)
        states, nexts, log_probs, finals, images = [], [], [], [], []
        for i, (p, j, text) in enumerate(zip(prompt_ids, sample_ids, prompts, strict=True)):
            seed = sample_seed(self.cfg.seed, step, p, j, "sde") & 0x7FFFFFFF
            outs = self.engine.generate([text], [self._params(x_t[i], seed)])
            req = _first(getattr(outs[0], "request_output", None) or outs[0])
            lat = _first(getattr(req, "trajectory_latents", None))
            lp = _first(getattr(req, "trajectory_log_probs", None))
            if lat is None or lp is None:
                raise RuntimeError(
                    "vLLM-Omni returned no trajectory latents/log-probs: serve the model with an RL pipeline "
                    "that records them (e.g. verl-omni's Flow-GRPO pipelines)"
                )
            lat, lp = torch.as_tensor(lat, dtype=dtype).cpu(), torch.as_tensor(lp, dtype=dtype).cpu().reshape(-1)
            if tuple(lat.shape[1:]) != tuple(model.latent_shape) or lat.shape[0] != s.num_steps + 1:
                raise RuntimeError(f"vLLM-Omni trajectory latents have shape {tuple(lat.shape)}; expected "
                                   f"({s.num_steps + 1}, {', '.join(map(str, model.latent_shape))}) unpacked")
            idx = selected[i]
            states.append(lat[idx])
            nexts.append(lat[idx + 1])
            log_probs.append(lp[idx])
            finals.append(lat[-1])
            img = _first(getattr(req, "images", None))
            if img is not None:
                images.append(torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1))
        cond = model.encode_prompts(list(prompts)).to(device="cpu")
        return Trajectories(
            prompts=list(prompts), prompt_ids=torch.as_tensor(prompt_ids), sample_ids=torch.as_tensor(sample_ids),
            cond=cond, step_indices=selected, sigmas=sigmas[selected], sigmas_next=sigmas[selected + 1],
            states=torch.stack(states), next_states=torch.stack(nexts), log_probs=torch.stack(log_probs),
            final_latents=torch.stack(finals), versions=torch.full((len(prompt_ids),), version),
            global_step=step, images=torch.stack(images) if len(images) == len(prompt_ids) else None,
        )


def build_rollout_backend(cfg: WorkerConfig, model: DiffusionModel) -> VllmOmniRollout:
    """The rollout engine named by ``cfg.rollout_backend`` (only 'vllm' lives here)."""
    if cfg.rollout_backend != "vllm":
        raise ValueError(f"unknown rollout_backend {cfg.rollout_backend!r}; expected 'diffusers' or 'vllm'")
    return VllmOmniRollout(cfg, model)
