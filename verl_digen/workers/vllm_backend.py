"""Generator rollout through vLLM-Omni (``rollout.backend=vllm``; ``pip install verl-digen[vllm]``, which pins
vllm 0.30.x and vllm-omni 0.30.0), for GPU generator pools. **It has never run on a GPU**: the CPU tests hold
its pieces to the diffusers sampler (tests/workers/test_vllm_rollout.py) and the opt-in tier
(``scripts/vllm_tier.sh``) starts the real engine on CPU.

How a micro-batch goes: ``rollout.omni.request.build_requests`` makes one prompt dict per sample (its ids
and trained steps) and one set of sampling params; one ``Omni.generate`` call runs them as one request
batch through verl-digen's RL pipeline for the architecture (``rollout.omni.pipelines``, installed through
``custom_pipeline_args``), which steps with ``rollout.denoise`` on verl-digen's sigmas and noise streams;
``rollout.omni.output.parse_output`` reads each request's trajectory back. A pipeline named by
``rollout.vllm_pipeline`` outside verl-digen (verl-omni's) is read in its own layout, one request per sample
(its noise comes from the request's seed, which ``Omni.generate`` shares between the prompts of one call).

The engine holds the only copy of the policy on the generator GPU; the generator keeps the checkpoint's
text encoders for ``Trajectories.cond`` (``rollout.omni.served``). Weights: LoRA through one adapter
directory and id (``rollout.omni.lora``; HunyuanVideo, whose diffusers layers vllm-omni's LoRA manager cannot
wrap, through the worker extension into its pipeline), a full fine-tune through the worker extension
(``rollout.omni.extension``) calling the pipeline's ``load_weights``.

The vllm-omni 0.30.0 APIs relied on, checked against that wheel's source (paths in the vllm-omni package):

- ``Omni(model=..., **engine_kwargs)`` (``vllm_omni/entrypoints/omni.py:29``, ``omni_base.py:170``) and
  ``Omni.generate(prompts, sampling_params_list)`` (``omni.py:78``; it closes the engine on any error and
  hands every prompt the same sampling-params list, ``omni.py:132,154``);
- engine kwargs ``custom_pipeline_args={"pipeline_class": qualname}`` and ``worker_extension_cls``
  (``vllm_omni/diffusion/data.py:997,1000``; resolved in ``vllm_omni/diffusion/diffusion_engine.py:143-158``,
  built as ``cls(od_config=...)`` in ``vllm_omni/diffusion/model_loader/diffusers_loader.py:1202-1204``,
  ``re_init_pipeline`` in ``vllm_omni/diffusion/worker/diffusion_worker.py:1114``), ``max_num_seqs``
  (``data.py:1106``, default 1: one request per batch) and ``request_batch_max_wait_ms`` (``data.py:1120``);
  a pipeline batches only with ``supports_request_batch = True`` (``diffusion_engine.py:161-174``);
- ``OmniDiffusionSamplingParams`` (``vllm_omni/inputs/data.py:204``): ``num_inference_steps``,
  ``guidance_scale`` / ``guidance_scale_provided``, ``height`` / ``width``, ``num_frames``, ``sigmas``,
  ``seed``, ``return_trajectory_latents``, ``extra_args``, ``lora_request``; prompts as ``OmniTextPrompt``
  dicts with ``negative_prompt`` and ``additional_information`` (``inputs/data.py:20-40``), which reach the
  pipeline untouched as ``DiffusionRequestBatch.prompts`` (``vllm_omni/diffusion/worker/request_batch.py:121``);
  batch-wide fields only key a batch (``vllm_omni/diffusion/sched/interface.py:98-123``,
  ``sched/request_scheduler.py:43-57``);
- the pipeline side: ``forward(req: DiffusionRequestBatch) -> list[DiffusionOutput]``, one per request
  (``vllm_omni/diffusion/models/sd3/pipeline_sd3.py:631``), ``DiffusionOutput.trajectory_*``
  (``vllm_omni/diffusion/data.py:1779-1791``), copied onto ``OmniRequestOutput`` when the post-processed
  payload has none (``vllm_omni/diffusion/output_formatter.py:390-420``); the stock image post-processor runs on
  ``DiffusionOutput.output`` (``vllm_omni/diffusion/registry.py:849-857``), which the RL pipelines leave in the
  stock form (the VAE's output); the stock pipelines' ``encode_prompt`` (SD3 ``pipeline_sd3.py:434``, FLUX
  ``flux/pipeline_flux.py:300``, Qwen-Image ``qwen_image/pipeline_qwen_image.py:510``, Wan
  ``wan2_2/pipeline_wan2_2.py:1064``), ``DiffusersAdapterPipeline._pipeline`` for HunyuanVideo 1.0
  (``diffusers_adapter/pipeline_diffusers_adapter.py:82,142``), ``load_weights`` with ``transformer.`` names
  (``pipeline_sd3.py:772-774``), ``DiffusionRequestBatch.is_dummy_run`` (``request_batch.py:142``);
- ``OmniRequestOutput`` (``vllm_omni/outputs/__init__.py:115``): ``images`` (``:169``; PIL from the stock
  post-processors), ``trajectory_latents`` / ``trajectory_timesteps`` / ``trajectory_log_probs``
  (``:171-173``), ``error`` (``:184``);
- LoRA: ``LoRARequest`` (``vllm_omni/lora/request.py:6``), adapters loaded from a PEFT directory on first use
  and skipped while their id is registered (``vllm_omni/diffusion/lora/manager.py:291-329,808-834``), removed
  with ``collective_rpc("remove_lora", args=(id,))`` (``vllm_omni/engine/omni_engine_base.py:1073``,
  ``vllm_omni/diffusion/worker/diffusion_worker.py:780``); worker-extension methods are reached the same way
  (``diffusion_worker.py:1846-1875``).
"""

from __future__ import annotations

from typing import Any

import torch

from verl_digen.algo.seeding import sample_seed
from verl_digen.algo.trajectory import Trajectories
from verl_digen.models import parse_dtype
from verl_digen.models.arch import MODEL_REGISTRY, canonical_arch
from verl_digen.models.base import Conditioning
from verl_digen.models.lora import default_lora_targets
from verl_digen.rollout.omni import lora as L
from verl_digen.rollout.omni.extension import EXTENSION_CLASS, LOAD_LORA, LOAD_WEIGHTS
from verl_digen.rollout.omni.output import DIGEN, VERL_OMNI, parse_output
from verl_digen.rollout.omni.request import EngineRequests, build_requests, is_digen_pipeline, pipeline_class
from verl_digen.rollout.omni.served import ServedShape, TextConditioner, read_served_shape
from verl_digen.workers.config import WorkerConfig

INSTALL_HINT = "pip install verl-digen[vllm]"
#: how long the engine waits for the rest of a micro-batch's requests before it runs a batch
BATCH_WAIT_MS = 200.0


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


def engine_kwargs(cfg: WorkerConfig, pipeline: str) -> dict[str, Any]:
    """The ``Omni`` keyword arguments of a generator's engine: the RL pipeline, the weight-update extension,
    request batches of a micro-batch, the policy dtype."""
    return {"custom_pipeline_args": {"pipeline_class": pipeline}, "worker_extension_cls": EXTENSION_CLASS,
            "max_num_seqs": cfg.vllm_max_batch, "request_batch_max_wait_ms": BATCH_WAIT_MS,
            "dtype": cfg.policy.dtype}


class VllmOmniRollout:
    """One vLLM-Omni engine per generator worker; ``generate`` returns verl-digen ``Trajectories``.

    ``engine``, ``params_cls``, ``lora_cls``, ``shape`` and ``conditioner`` can be handed in (tests pass a fake
    engine, the tiny model's shape and its ``encode_prompts``); by default they come from vllm-omni and the
    checkpoint."""

    def __init__(self, cfg: WorkerConfig, device: torch.device | str = "cpu", *, engine: Any = None,
                 params_cls: Any = None, lora_cls: Any = None, shape: ServedShape | None = None,
                 conditioner: Any = None) -> None:
        self.cfg = cfg
        self.arch = canonical_arch(cfg.policy.arch)
        self.pipeline = pipeline_class(self.arch, cfg.vllm_pipeline)
        self.layout = DIGEN if is_digen_pipeline(self.pipeline) else VERL_OMNI
        if engine is None:
            omni_cls, params_cls, lora_cls = require_vllm_omni()
            if not cfg.policy.pretrained:
                raise ValueError("rollout_backend='vllm' serves a real checkpoint: set model.path")
        p = cfg.policy
        self.shape = shape or read_served_shape(self.arch, p.pretrained, latent_size=p.latent_size,
                                                latent_width=p.latent_width, num_frames=p.num_frames)
        self.conditioner = conditioner or TextConditioner.from_checkpoint(
            self.arch, p.pretrained, parse_dtype(p.dtype), device, self.shape.guidance_distilled)
        if engine is None:
            engine = omni_cls(model=p.pretrained, **engine_kwargs(cfg, self.pipeline))
        self.engine = engine
        self.params_cls, self.lora_cls = params_cls, lora_cls
        self.lora_request = None
        self.slot: L.LoraSlot | None = None
        self.lora_config: dict[str, Any] | None = None  # adapters installed through the worker extension
        if p.lora:
            targets = p.lora_target_modules or default_lora_targets(MODEL_REGISTRY[self.arch])
            config = L.peft_config(p.lora_rank, p.lora_alpha, targets)
            if self.layout == DIGEN and self.arch in L.EXTENSION_LORA_ARCHS:
                self.lora_config = config
            else:
                self.slot = L.LoraSlot(config, lora_cls, L.ENGINE_MODULE_RENAMES.get(self.arch))
        self._weights: dict[str, torch.Tensor] = {}

    # -- weights --------------------------------------------------------------------------------------
    def load_weights(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Serve ``state`` from now on: LoRA adapters under the one adapter id, or a full fine-tune's
        transformer through the worker extension."""
        if self.slot is not None:
            self.lora_request = self.slot.write(version, state)
            self._rpc("remove_lora", (L.ADAPTER_ID,))  # the next request re-reads the directory
        elif self.lora_config is not None:
            self._rpc(LOAD_LORA, ({k: v.detach().to("cpu") for k, v in state.items()}, self.lora_config))
        else:
            self._rpc(LOAD_WEIGHTS, ({k: v.detach().to("cpu") for k, v in state.items()},))
        self._weights = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    def weights(self) -> dict[str, torch.Tensor]:
        """What was installed last (CPU copies; empty before the first update)."""
        return dict(self._weights)

    def _rpc(self, method: str, args: tuple) -> list[Any]:
        return self.engine.engine.collective_rpc(method, args=args)

    def close(self) -> None:
        if self.slot is not None:
            self.slot.close()

    # -- rollout --------------------------------------------------------------------------------------
    def requests(self, step: int, prompt_ids: list[int], sample_ids: list[int], prompts: list[str]) -> EngineRequests:
        s = self.shape
        return build_requests(self.cfg.sampler, self.cfg.seed, step, prompt_ids, sample_ids, prompts,
                              latent_shape=s.latent_shape, pixels=s.pixels, lora_request=self.lora_request)

    def _run(self, reqs: EngineRequests) -> list[Any]:
        if self.layout == DIGEN:  # one request batch for the micro-batch
            return list(self.engine.generate(reqs.prompts, [self.params_cls(**reqs.params)]))
        outs = []  # a foreign pipeline draws noise from the request's seed: one call per sample
        for prompt, row in zip(reqs.prompts, reqs.rows):
            seed = sample_seed(row.seed, row.step, row.prompt_id, row.sample_id, "sde") & 0x7FFFFFFF
            outs += list(self.engine.generate([prompt], [self.params_cls(**reqs.params, seed=seed)]))
        return outs

    def generate(self, step: int, version: int, prompt_ids: list[int], sample_ids: list[int],
                 prompts: list[str]) -> Trajectories:
        """The micro-batch's trajectories (CPU tensors, the policy's dtype)."""
        reqs = self.requests(step, prompt_ids, sample_ids, prompts)
        outs = self._run(reqs)
        if len(outs) != len(prompts):
            raise RuntimeError(f"vLLM-Omni returned {len(outs)} outputs for {len(prompts)} requests")
        dtype = parse_dtype(self.cfg.policy.dtype)
        schedule = self.cfg.sampler.sigmas(torch.float64)
        rows = [parse_output(o, self.layout, schedule, torch.tensor(r.train_steps), self.shape.latent_shape,
                             packed=self.shape.packed) for o, r in zip(self._in_order(outs, reqs), reqs.rows)]
        steps = torch.stack([r.steps for r in rows])
        sigmas = self.cfg.sampler.sigmas(dtype)
        images = [r.image for r in rows]
        cond: Conditioning = self.conditioner(list(prompts))
        return Trajectories(
            prompts=list(prompts), prompt_ids=torch.as_tensor(prompt_ids, dtype=torch.long),
            sample_ids=torch.as_tensor(sample_ids, dtype=torch.long), cond=cond, step_indices=steps,
            sigmas=sigmas[steps], sigmas_next=sigmas[steps + 1],
            states=torch.stack([r.states for r in rows]).to(dtype),
            next_states=torch.stack([r.next_states for r in rows]).to(dtype),
            log_probs=torch.stack([r.log_probs for r in rows]).to(dtype),
            final_latents=torch.stack([r.final for r in rows]).to(dtype),
            versions=torch.full((len(prompt_ids),), version, dtype=torch.long), global_step=step,
            images=torch.stack(images) if all(i is not None for i in images) else None,
        )

    @staticmethod
    def _in_order(outs: list[Any], reqs: EngineRequests) -> list[Any]:
        """Outputs in request order: ``Omni.generate`` yields them as they finish, with request ids
        ``"{index}_{uuid}"`` (``vllm_omni/entrypoints/omni.py:127``)."""
        def index(o: Any) -> int:
            rid = str(getattr(o, "request_id", "") or "")
            head = rid.split("_", 1)[0]
            return int(head) if head.isdigit() else -1

        keys = [index(o) for o in outs]
        if sorted(keys) == list(range(len(outs))):
            return [o for _, o in sorted(zip(keys, outs), key=lambda kv: kv[0])]
        return outs


def build_rollout_backend(cfg: WorkerConfig, device: torch.device | str = "cpu") -> VllmOmniRollout:
    """The rollout engine named by ``cfg.rollout_backend`` (only 'vllm' lives here)."""
    if cfg.rollout_backend != "vllm":
        raise ValueError(f"unknown rollout_backend {cfg.rollout_backend!r}; expected 'diffusers' or 'vllm'")
    return VllmOmniRollout(cfg, device)
