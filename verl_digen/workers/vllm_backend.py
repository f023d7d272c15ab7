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

The engine holds the only copy of the policy and of the text encoders on the generator GPU (the rows'
conditioning comes from the engine's encoders, ``EngineConditioner``), and starts on a rendezvous port of its own
(``start_engine``). Weights: LoRA through one adapter directory and id (``rollout.omni.lora``; HunyuanVideo, whose
diffusers layers vllm-omni's LoRA manager cannot wrap, through the worker extension into its pipeline), a full
fine-tune through the worker extension (``rollout.omni.extension``) calling the pipeline's ``load_weights``, bucket
by bucket on the engine's device; a collective pickup lands through ``EngineSink``. Nothing is kept beside the
engine: ``weights`` reads its tensors back (docs/architecture.md, "The vLLM-Omni rollout").

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

import os
import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from verl_digen.algo.seeding import sample_seed
from verl_digen.algo.trajectory import Trajectories
from verl_digen.models import parse_dtype
from verl_digen.models.arch import MODEL_REGISTRY, arch_facts, canonical_arch
from verl_digen.models.base import Conditioning
from verl_digen.models.lora import default_lora_targets
from verl_digen.rollout.omni import lora as L
from verl_digen.rollout.omni.extension import (
    ENCODE,
    EXTENSION_CLASS,
    LOAD_LORA,
    LOAD_WEIGHTS,
    READ_LORA,
    READ_WEIGHTS,
)
from verl_digen.rollout.omni.output import DIGEN, VERL_OMNI, parse_output
from verl_digen.rollout.omni.request import EngineRequests, build_requests, is_digen_pipeline, pipeline_class
from verl_digen.rollout.omni.served import ServedShape, TextConditioner, read_served_shape
from verl_digen.schedule import ledger
from verl_digen.workers.buckets import BucketPlan, Layout, layout_of, plan_for
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


def engine_kwargs(cfg: WorkerConfig, pipeline: str, master_port: int) -> dict[str, Any]:
    """The ``Omni`` keyword arguments of a generator's engine: the RL pipeline, the weight-update extension,
    request batches of a micro-batch, the policy dtype, the engine's own rendezvous port, compiled or eager
    (``rollout.vllm_compile``), its share of the GPU (``rollout.vllm_memory_fraction``)."""
    kwargs = {"custom_pipeline_args": {"pipeline_class": pipeline}, "worker_extension_cls": EXTENSION_CLASS,
              "max_num_seqs": cfg.vllm_max_batch, "request_batch_max_wait_ms": BATCH_WAIT_MS,
              "dtype": cfg.policy.dtype, "master_port": master_port, "gpu_memory_utilization": cfg.vllm_memory_fraction}
    if not arch_facts(cfg.policy.arch).engine_diffusers_adapter:
        kwargs["enforce_eager"] = not cfg.vllm_compile
    return kwargs


#: an architecture served through vllm-omni's diffusers adapter (``ArchFacts.engine_diffusers_adapter``) refuses
#: ``enforce_eager=True`` (``diffusers_adapter/pipeline_diffusers_adapter.py:269-273``): ``rollout.vllm_compile``
#: leaves it at its own default there (compile where the platform supports inductor)


#: the rendezvous variables vllm-omni's diffusion worker reads and overwrites in the generator's process
#: (``vllm_omni/diffusion/worker/diffusion_worker.py:324-328``)
RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS hands out as free now (bound to 0 and released): each engine's own rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextmanager
def own_rendezvous() -> Iterator[None]:
    """Start an engine outside the worker group's torch.distributed world. verl sets ``MASTER_ADDR`` /
    ``MASTER_PORT`` per worker group, the same port for every generator of a node, and vllm-omni takes the
    environment's port before its ``master_port`` argument (``vllm_omni/diffusion/data.py:1138-1155``): so a
    second engine on the node bound the first one's port (``EADDRINUSE``). Inside this block the variables are
    unset; afterwards the worker's own are put back (the engine's worker overwrites them while it starts)."""
    saved = {k: os.environ.get(k) for k in RENDEZVOUS_ENV}
    for k in RENDEZVOUS_ENV:
        os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start_engine(omni_cls: Any, model: str, kwargs: dict[str, Any]) -> Any:
    """``omni_cls(model=..., **kwargs)`` on a rendezvous of its own (``kwargs['master_port']``)."""
    with own_rendezvous():
        return omni_cls(model=model, **kwargs)


class VllmOmniRollout:
    """One vLLM-Omni engine per generator worker; ``generate`` returns verl-digen ``Trajectories``.

    ``engine`` (or ``omni_cls``, the class that starts one), ``params_cls``, ``lora_cls``, ``shape`` and
    ``conditioner`` can be handed in (tests pass a fake engine, the tiny model's shape and its
    ``encode_prompts``); by default they come from vllm-omni and the checkpoint. Each engine starts on a
    rendezvous port of its own (``start_engine``), never the worker group's."""

    def __init__(self, cfg: WorkerConfig, device: torch.device | str = "cpu", *, engine: Any = None,
                 params_cls: Any = None, lora_cls: Any = None, shape: ServedShape | None = None,
                 conditioner: Any = None, omni_cls: Any = None) -> None:
        self.cfg = cfg
        self.arch = canonical_arch(cfg.policy.arch)
        self.pipeline = pipeline_class(self.arch, cfg.vllm_pipeline)
        self.layout = DIGEN if is_digen_pipeline(self.pipeline) else VERL_OMNI
        if engine is None and omni_cls is None:
            omni_cls, params_cls, lora_cls = require_vllm_omni()
        if engine is None:
            if not cfg.policy.pretrained:
                raise ValueError("rollout_backend='vllm' serves a real checkpoint: set model.path")
        p = cfg.policy
        self.shape = shape or read_served_shape(self.arch, p.pretrained, latent_size=p.latent_size,
                                                latent_width=p.latent_width, num_frames=p.num_frames)
        if engine is None:
            self.master_port = free_port()
            engine = start_engine(omni_cls, p.pretrained, engine_kwargs(cfg, self.pipeline, self.master_port))
        self.engine = engine
        if conditioner is None and self.layout == DIGEN:  # the engine's text encoders: one copy per generator
            conditioner = EngineConditioner(self._rpc, self.shape.guidance_distilled)
        # a foreign pipeline encodes nothing for us: the generator loads the text encoders a second time
        self.conditioner = conditioner or TextConditioner.from_checkpoint(
            self.arch, p.pretrained, parse_dtype(p.dtype), device, self.shape.guidance_distilled)
        self.params_cls, self.lora_cls = params_cls, lora_cls
        self.lora_request = None
        self.slot: L.LoraSlot | None = None
        self.lora_config: dict[str, Any] | None = None  # adapters installed through the worker extension
        if p.lora:
            targets = p.lora_target_modules or default_lora_targets(MODEL_REGISTRY[self.arch])
            config = L.peft_config(p.lora_rank, p.lora_alpha, targets)
            if self.layout == DIGEN and L.lora_through_extension(self.arch):
                self.lora_config = config
            else:
                self.slot = L.LoraSlot(config, lora_cls, L.engine_renames(self.arch))
        self.device = torch.device(device)
        self.bucket_bytes = max(1, cfg.sync_bucket_mb) << 20
        self._template: Layout | None = None

    # -- weights --------------------------------------------------------------------------------------
    def load_weights(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Serve ``state`` from now on: LoRA adapters under the one adapter id, or a full fine-tune's
        transformer through the worker extension, bucket by bucket on the engine's device. Nothing is kept:
        the engine's weights are the generator's only copy (``weights`` reads them back)."""
        if self.slot is not None:
            self.lora_request = self.slot.write(version, state)
            self._rpc("remove_lora", (L.ADAPTER_ID,))  # the next request re-reads the directory
        elif self.lora_config is not None:
            self._rpc(LOAD_LORA, ({k: v.detach().to(self.device) for k, v in state.items()}, self.lora_config))
        else:
            for chunk in buckets_of(state, self.bucket_bytes):
                self.load_chunk(chunk)

    def load_chunk(self, chunk: dict[str, torch.Tensor]) -> None:
        """Some of a full fine-tune's transformer tensors into the engine (on its device; a tensor already there
        is handed over as is)."""
        self._rpc(LOAD_WEIGHTS, ({k: v.detach().to(self.device) for k, v in chunk.items()},))

    def template(self) -> Layout:
        """What weight sync moves to this generator (names, dtypes, shapes): the template of a collective
        receive, built from the checkpoint's config on the meta device, so no weights are made for it."""
        if self._template is None:
            self._template = sync_layout(self.cfg)
        return self._template

    def weights(self) -> dict[str, torch.Tensor]:
        """What weight sync moves, read back from the engine (clones on its device, made on demand, not kept):
        the transformer under the trainer's names, or the adapters (from the adapter directory the engine reads,
        or from the pipeline that installed them). Empty before the first LoRA update."""
        if self.slot is not None:
            return self.slot.read() if self.slot.version is not None else {}
        if self.lora_config is not None:
            return dict(_first(self._rpc(READ_LORA, ())))
        return dict(_first(self._rpc(READ_WEIGHTS, ([(n, shape) for n, _, shape in self.template()],))))

    def receive(self, group: Any, version: int, sources: list[int], verify_payload: bool = False) -> dict[str, int]:
        """A collective pickup (``sync.SyncGroup.receive``) into the engine: the template is the layout the trainer
        sends (``template``: no weights); each tensor exists on the group's device only from its first bucket to
        its last, then goes into the engine's parameters (LoRA adapters, small, whole at the end). Returns the
        byte ledger."""
        plan = plan_for(self.template(), self.bucket_bytes, len(sources))
        sink = self.sink(plan, group.device)
        moved = group.receive(version, plan, sink, sources, verify_payload, on_landed=sink.landed)
        sink.check_complete()
        if sink.done:
            self.load_weights(version, sink.done)
        ledger.add(moved, ledger.STAGING_PEAK, sink.peak_bytes)
        return moved

    def sink(self, plan: BucketPlan, device: torch.device | str) -> EngineSink:
        """Where a collective pickup lands: tensors made as their buckets arrive and handed to the engine when
        complete (``EngineSink``)."""
        if self.slot is not None or self.lora_config is not None:
            return EngineSink(plan, device, _keep)  # adapters: small, kept whole, then ``load_weights``
        return EngineSink(plan, device, self.load_chunk)

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


class EngineConditioner:
    """Prompt conditioning (``Trajectories.cond``) from the engine's own text encoders, through the worker
    extension (``extension.ENCODE``): positive rows, and the negative prompt's rows when the model uses
    classifier-free guidance, as ``served.TextConditioner`` builds them, without a second copy of the encoders."""

    def __init__(self, rpc: Any, guidance_distilled: bool, negative_prompt: str = "") -> None:
        self.rpc, self.guidance_distilled, self.negative_prompt = rpc, guidance_distilled, negative_prompt

    def __call__(self, prompts: list[str]) -> Conditioning:
        pos, neg = _first(self.rpc(ENCODE, (list(prompts), [self.negative_prompt] * len(prompts),
                                            not self.guidance_distilled)))
        return Conditioning(dict(pos), dict(neg) if neg is not None else None)


def _first(replies: list[Any]) -> Any:
    """The first worker's answer of a ``collective_rpc`` (a list per stage of a list per worker)."""
    reply = replies[0]
    while isinstance(reply, list):
        reply = reply[0]
    return reply


def buckets_of(state: dict[str, torch.Tensor], bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    """``state`` in chunks of at most ``bucket_bytes`` (a larger tensor alone), in name order."""
    chunk: dict[str, torch.Tensor] = {}
    size = 0
    for name in sorted(state):
        t = state[name]
        n = t.numel() * t.element_size()
        if chunk and size + n > bucket_bytes:
            yield chunk
            chunk, size = {}, 0
        chunk[name] = t
        size += n
    if chunk:
        yield chunk


def sync_layout(cfg: WorkerConfig) -> Layout:
    """The layout the trainer sends (``layout_of`` its transformer state, or of its LoRA adapters), from the
    checkpoint's transformer config on the meta device with the policy's dtype and LoRA settings."""
    import diffusers

    p = cfg.policy
    spec = MODEL_REGISTRY[canonical_arch(p.arch)].pretrained
    cls = getattr(diffusers, spec.transformer_class)
    config = cls.load_config(p.pretrained, subfolder="transformer", local_files_only=True)
    dtype = parse_dtype(p.dtype)
    with torch.device("meta"):
        transformer = cls.from_config(config).to(dtype)
    if not p.lora:
        return layout_of(transformer.state_dict())
    from peft import LoraConfig, get_peft_model_state_dict

    from verl_digen.models.lora import ADAPTER_NAME

    targets = p.lora_target_modules or default_lora_targets(MODEL_REGISTRY[canonical_arch(p.arch)])
    transformer.add_adapter(LoraConfig(r=p.lora_rank, lora_alpha=float(p.lora_alpha or p.lora_rank),
                                       target_modules=list(targets)), adapter_name=ADAPTER_NAME)
    state = get_peft_model_state_dict(transformer, adapter_name=ADAPTER_NAME)
    return tuple((n, dtype, tuple(state[n].shape)) for n in sorted(state))  # adapters follow the base dtype


class EngineSink(Mapping[str, torch.Tensor]):
    """The ``into`` of a collective receive (``SyncGroup.receive``) for an engine: a tensor is made on the
    receiving device when its first bucket arrives, and once every piece of it has landed it goes to ``load``
    (with the others completed by the same bucket) and is dropped. What exists at once is the tensors in flight,
    never the whole model; ``done`` holds the completed ones when ``load`` keeps nothing (LoRA adapters)."""

    def __init__(self, plan: BucketPlan, device: torch.device | str, load: Any) -> None:
        self.plan, self.device, self.load = plan, torch.device(device), load
        self.spec = {name: (dtype, shape) for name, dtype, shape in plan.layout}
        self.left = {name: 0 for name in self.spec}
        for pieces in plan.pieces:
            for piece in pieces:
                self.left[piece.name] += 1
        self.live: dict[str, torch.Tensor] = {}
        self.done: dict[str, torch.Tensor] = {}
        self.peak_bytes = 0
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()  # one load into the engine at a time

    def __getitem__(self, name: str) -> torch.Tensor:
        with self._lock:
            t = self.live.get(name)
            if t is None:
                dtype, shape = self.spec[name]
                t = self.live[name] = torch.empty(shape, dtype=dtype, device=self.device)
                self.peak_bytes = max(self.peak_bytes, sum(v.numel() * v.element_size() for v in self.live.values()))
            return t

    def __iter__(self) -> Iterator[str]:
        return iter(self.spec)

    def __len__(self) -> int:
        return len(self.spec)

    def landed(self, k: int) -> None:
        """Bucket ``k`` is written: hand the tensors it completed to the engine."""
        complete: dict[str, torch.Tensor] = {}
        with self._lock:
            for piece in self.plan.pieces[k]:
                self.left[piece.name] -= 1
                if self.left[piece.name] == 0:
                    complete[piece.name] = self.live.pop(piece.name)
        if complete:
            with self._load_lock:
                self.load(complete)
            self.done.update(complete if self.load is _keep else {})

    def check_complete(self) -> None:
        missing = [n for n, left in self.left.items() if left]
        if missing:
            raise RuntimeError(f"weight pickup ended with {len(missing)} tensor(s) incomplete, e.g. {missing[:3]}")


def _keep(chunk: dict[str, torch.Tensor]) -> None:
    """``EngineSink``'s load for adapters: nothing now, they are installed whole by ``load_weights``."""


def build_rollout_backend(cfg: WorkerConfig, device: torch.device | str = "cpu") -> VllmOmniRollout:
    """The rollout engine named by ``cfg.rollout_backend`` (only 'vllm' lives here)."""
    if cfg.rollout_backend != "vllm":
        raise ValueError(f"unknown rollout_backend {cfg.rollout_backend!r}; expected 'diffusers' or 'vllm'")
    return VllmOmniRollout(cfg, device)
