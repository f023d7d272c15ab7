"""The memory plan of a run: per pool, per GPU, what the weights, gradients, optimizer state,
activations, KL reference, TAG's generation copy, the text encoders, the VAE and the reward model take,
against the pool's GPU memory: ``resources.<pool>.gpu_memory_gb`` when declared, else the memory of
the hardware of the simulator preset ``digen.profile`` names (``schedule/presets.py``). Printed by the
dry run; a run that cannot fit is refused by ``validate`` before Ray starts, naming the knobs that
would make it fit, each with the figure it would give. Figures are GiB (2**30 bytes); a declared
``gpu_memory_gb`` (and a preset's "80 GB") is read as GiB, the way the datasheet figure counts HBM.

Pure arithmetic from parameter counts: the transformer's size comes from the simulator preset
(parameters, blocks, width, tokens) for a pretrained model, or from counting a tiny random-weight
model's parameters; the text encoders and VAE from public parameter counts per architecture
(``ArchFacts.companions`` in ``verl_digen/archs.py``); the reward model from the reward the config scores
with (``REWARD_MODELS``: none for closed-form rewards and ``ocr``, whose RapidOCR engine runs on the CPU).
It mirrors what the trainer builds (``workers/actor_memory.py``): master-dtype shards (fp32 for a full fine-tune unless
``actor.master_dtype`` says otherwise, see :func:`master_dtype`), compute-dtype gathers, a sharded
reference.

Activations (per trained row, per block): ``ACT_VALUES_PER_TOKEN`` values of the compute dtype per
token and hidden unit (the transformer-layer count of Korthikanti et al., 34 bytes of 16-bit values
without the attention-score term, which fused attention does not keep), for the tokens a rank holds:
1/size of them with Ulysses (``actor.ulysses_sequence_parallel_size``; its all-to-all buffers hold one
block's q, k, v of those tokens, within the same count). With activation
checkpointing a block keeps its input only (1 value), plus one block's full set during its recompute.
Generating (no autograd) keeps nothing between blocks: the peak is one block's live tensors,
``GEN_VALUES_PER_TOKEN`` values per token and hidden unit per generated row (the MLP: the residual,
its norm, the 4x-wide projection and its activation).

For the planner: :func:`memory_need` (per-pool GiB and whether it fits, with the knobs the planner
varies: rows per rank per pass, activation checkpointing, TAG, pool sizes) and
:func:`max_rows_per_rank` (the most rows per rank per pass that fit).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

from verl_digen.archs import Companions, arch_facts  # noqa: F401  (Companions: re-exported)
from verl_digen.config.errors import ConfigError
from verl_digen.config.schema import RunConfig, behaviour_forward, get_key, master_dtype
from verl_digen.dtypes import BYTES, PRECISIONS
from verl_digen.schedule.config import COLOCATED, DIGEN

ACT_VALUES_PER_TOKEN = 17  # per hidden unit per block, without checkpointing
GEN_VALUES_PER_TOKEN = 10  # live while generating: residual, its norm, the MLP's 4h input and 4h activation
GATHERED_BLOCKS = 2  # FSDP2 holds the current block's gathered params and prefetches the next
GIB = 2**30
LORA_PROJECTIONS = 8  # attention projections of an MM-DiT block LoRA targets (models.adapter)
HALF_ULP = {"bfloat16": "1/256", "float16": "1/2048"}  # relative rounding of a 16-bit weight (8 / 11 bits)


def parameters(n: float) -> str:
    """A parameter count as people say it: 12B, 350M, 78.5k."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


@dataclass(frozen=True)
class RewardModel:
    params: float
    bytes_per_param: int
    what: str


#: reward name (rewards/registry.py) -> the model it loads on the GPU (the rewards load fp32 weights)
REWARD_MODELS: dict[str, RewardModel] = {
    "pickscore": RewardModel(0.986e9, 4, "PickScore_v1 (CLIP ViT-H-14) fp32"),
    "hpsv2": RewardModel(0.986e9, 4, "HPS v2.1 (OpenCLIP ViT-H-14) fp32"),
    "imagereward": RewardModel(0.447e9, 4, "ImageReward (BLIP) fp32"),
}
#: rewards that load no GPU model (closed-form scores; OCR runs RapidOCR's ONNX models on the CPU)
NO_GPU_MODEL = frozenset({"jpeg_compressibility", "jpeg_incompressibility", "brightness", "colorfulness",
                          "latent_mean", "latent_target", "random_cnn", "ocr"})


@dataclass(frozen=True)
class ModelSize:
    """What the estimate needs of the policy and its pipeline."""

    params: float
    blocks: int
    hidden: int
    tokens: int  # per sample, image + text
    reward_params: float = 0.0  # the preset's scorer (its simulated scoring time); memory counts the configured reward
    source: str = ""
    text_encoder_params: float = 0.0
    vae_params: float = 0.0
    companions: str = ""  # what the text encoders are


def model_size(cfg: RunConfig) -> ModelSize | None:
    """By counting a tiny model's parameters (``model.path`` null), else from the simulator preset
    ``digen.profile`` names; ``None`` for a pretrained model without a preset (no size known before
    the weights load)."""
    from verl_digen.schedule import presets

    if cfg.model.path is None:
        return _tiny_size(cfg)
    if cfg.digen.profile in presets.SPECS:
        spec = presets.SPECS[cfg.digen.profile]
        m, s = spec.model, spec.setting
        comp = arch_facts(cfg.model.arch).companions
        return ModelSize(m.params_b * 1e9, m.blocks, m.hidden, presets.tokens(m, s), s.reward_params_b * 1e9,
                         f"preset {spec.name}", comp.text_encoders, comp.vae, comp.what)
    return None


def _tiny_size(cfg: RunConfig) -> ModelSize:
    from verl_digen.models import build_model

    model = build_model(cfg.model.arch, latent_size=cfg.model.latent_size, latent_width=cfg.model.latent_width,
                        num_frames=cfg.model.num_frames, seed=cfg.model.seed)
    return measured_size(model, f"tiny {cfg.model.arch}")


def measured_size(model, source: str) -> ModelSize:
    """The size of a built model (a ``DiffusionModel`` with hashed prompt embeddings: the tiny models and
    bench/gpu_check.py's full-width blocks), counted from its modules."""
    t = model.transformer
    names = set(getattr(t, "_no_split_modules", None) or ())
    blocks = sum(1 for mod in t.modules() if type(mod).__name__ in names) or 1
    c = getattr(t, "config", {})
    hidden = int(c.get("num_attention_heads", 0) * c.get("attention_head_dim", 0)) or 1
    shape = model.latent_shape
    frames = shape[1] if len(shape) == 4 else 1
    encoder = getattr(model, "prompt_encoder", None)
    tokens = frames * (shape[-2] // 2) * (shape[-1] // 2) + int(getattr(encoder, "seq_len", 0))
    vae = getattr(model, "vae", None)
    enc = float(sum(p.numel() for p in encoder.parameters())) if hasattr(encoder, "parameters") else 0.0
    return ModelSize(float(sum(p.numel() for p in t.parameters())), blocks, hidden, tokens, 0.0, source, enc,
                     float(sum(p.numel() for p in vae.parameters())) if vae else 0.0, "hashed prompt embeddings")


def reward_memory(cfg: RunConfig) -> tuple[float, list[str]]:
    """Bytes of the reward model(s) the configured reward loads on a GPU, and notes on what is not counted."""
    from verl_digen.rewards.names import CUSTOM

    names = list(cfg.reward.weights) if cfg.reward.weights else [cfg.reward.name]
    if cfg.custom_reward_function.path is not None or cfg.reward.functions:
        names.append(CUSTOM)
    total, notes = 0.0, []
    for name in dict.fromkeys(names):
        if name in REWARD_MODELS:
            r = REWARD_MODELS[name]
            dtype = (cfg.reward.kwargs or {}).get("dtype") if not cfg.reward.weights else None
            total += r.params * BYTES.get(str(dtype).replace("torch.", ""), r.bytes_per_param)
        elif name not in NO_GPU_MODEL:
            notes.append(f"reward '{name}': its model's size is not known here, not counted")
    return total, notes


def served_judge_bytes(cfg: RunConfig, gib: float | None, notes: list[str]) -> float:
    """What a served judge (``reward.served``) holds on each GPU it shares with generation: vLLM takes its
    ``gpu_memory_utilization`` share of the GPU (``gib``); nothing there when it has a pool of its own. Unknown
    GPU memory: a note instead."""
    from verl_digen.config import judge

    place = judge.placement(cfg)
    if place is None or place.own_pool:
        return 0.0
    share = float(cfg.reward.served.gpu_memory_utilization)
    if gib is None:
        notes.append(f"the served judge: reward.served.gpu_memory_utilization={share:g} of each generating GPU, not "
                     "counted (GPU memory not known)")
        return 0.0
    return share * gib * GIB


def gpu_memory(cfg: RunConfig) -> dict[str, tuple[float | None, str]]:
    """Pool -> (GiB of one GPU, where the figure comes from): ``resources.<pool>.gpu_memory_gb`` when
    declared, else the preset's hardware (``digen.profile``); ``(None, "")`` when neither. The
    colocated pool spans both pools' GPUs: the smaller of the two."""
    from verl_digen.schedule import presets

    spec = presets.SPECS.get(cfg.digen.profile) if cfg.digen.profile else None
    out: dict[str, tuple[float | None, str]] = {}
    for pool, testbed in (("generator", spec.gen if spec else None), ("trainer", spec.train if spec else None)):
        declared = getattr(cfg.resources, pool).gpu_memory_gb
        if declared is not None:
            out[pool] = (float(declared), f"resources.{pool}.gpu_memory_gb")
        elif testbed is not None and testbed.gpu.memory_gb is not None:
            out[pool] = (float(testbed.gpu.memory_gb), f"preset {spec.name}")
        else:
            out[pool] = (None, "")
    if cfg.trainer.mode == COLOCATED:
        known = [v for v in out.values() if v[0] is not None]
        out["colocated"] = min(known) if known else (None, "")
    return out


@dataclass
class PoolMemory:
    """Estimated bytes on one GPU of a pool, by kind; ``host`` is what offload moved to host memory."""

    pool: str
    gpus: int
    parts: dict[str, float] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)
    capacity_gb: float | None = None  # GiB of one GPU
    capacity_source: str = ""
    engine_fraction: float | None = None  # rollout.backend=vllm: the share of the GPU its engine may take

    #: rollout.backend=vllm: what the generator's engine holds (the worker keeps the rest: reward, sync staging)
    ENGINE = ("engine weights", "text encoders", "VAE", "engine requests in flight", "engine runtime")

    #: parts resident only while generating (TAG / colocated): the training state is switched out then
    GEN_ONLY = ("generation copy", "generation activations")
    TRAIN_ONLY = ("gathered blocks", "grads", "optimizer", "step weights", "activations")

    @property
    def train_total(self) -> float:
        return sum(v for k, v in self.parts.items() if k not in self.GEN_ONLY)

    @property
    def gen_total(self) -> float:
        return sum(v for k, v in self.parts.items() if k not in self.TRAIN_ONLY)

    @property
    def total(self) -> float:
        """The peak: training, or generating with the training state switched out."""
        return max(self.train_total, self.gen_total)

    @property
    def engine_total(self) -> float:
        return sum(v for k, v in self.parts.items() if k in self.ENGINE) if self.engine_fraction is not None else 0.0

    @property
    def engine_fits(self) -> bool:
        """The engine's terms within its share of the GPU (``rollout.vllm_memory_fraction``)."""
        return (self.capacity_gb is None or self.engine_fraction is None
                or self.engine_total <= self.engine_fraction * self.capacity_gb * GIB)

    @property
    def fits(self) -> bool:
        return (self.capacity_gb is None or self.total <= self.capacity_gb * GIB) and self.engine_fits

    #: what the parts are, for naming the dominant term: kind -> parts
    KINDS = {"activations": ("activations", "generation activations"),
             "model state": ("weights", "gathered blocks", "grads", "optimizer", "EMA", "step weights", "reference",
                             "engine weights"),
             "engine": ("engine requests in flight", "engine runtime"),
             "generation pipeline": ("generation copy", "text encoders", "VAE"),
             "reward model": ("reward model",),
             "weight sync": ("sync staging",)}

    @property
    def dominant(self) -> str:
        """The kind (``KINDS``) that takes the most of the peak (training or generating, whichever is it)."""
        skip = self.GEN_ONLY if self.train_total >= self.gen_total else self.TRAIN_ONLY
        by_kind = {kind: sum(self.parts.get(k, 0.0) for k in names if k not in skip)
                   for kind, names in self.KINDS.items()}
        return max(by_kind, key=by_kind.get)

    def render(self) -> str:
        cap = "" if self.capacity_gb is None else \
            f" of {self.capacity_gb:g} GiB ({self.capacity_source}): {'fits' if self.fits else 'DOES NOT FIT'}"
        parts = ", ".join(f"{k} {_gb(v)}" for k, v in self.parts.items() if v)
        line = f"  {self.pool:<10} per GPU ({self.gpus} GPU(s)): {_gb(self.total)}{cap}\n             {parts}"
        if any(k in self.parts for k in self.GEN_ONLY):
            line += (f"\n             peak = max(training {_gb(self.train_total)}, "
                     f"generating {_gb(self.gen_total)}: grads and optimizer switched out)")
        if any(self.host.values()):
            line += "\n             host per GPU: " + ", ".join(f"{k} {_gb(v)}" for k, v in self.host.items() if v)
        if self.engine_fraction is not None:
            share = "" if self.capacity_gb is None else \
                f" of its {self.engine_fraction:g} x {self.capacity_gb:g} GiB = " \
                f"{self.engine_fraction * self.capacity_gb:.3g} GiB (rollout.vllm_memory_fraction): " \
                f"{'fits' if self.engine_fits else 'DOES NOT FIT'}"
            line += (f"\n             vLLM-Omni engine: {_gb(self.engine_total)}{share}; "
                     + ", ".join(f"{k} {_gb(self.parts[k])}" for k in self.ENGINE if self.parts.get(k)))
        return line


def _gb(b: float) -> str:
    return f"{b / GIB:.3g} GiB" if b >= GIB / 100 else f"{b / 2**20:.3g} MiB"


NOT_CHECKED = ("memory not checked: no GPU memory known for {pools} (set resources.<pool>.gpu_memory_gb, or "
               "digen.profile to a preset)")


@dataclass
class MemoryPlan:
    size: ModelSize
    pools: list[PoolMemory]
    notes: list[str] = field(default_factory=list)
    master_dtype: str = ""
    engine_startup: list[str] = field(default_factory=list)  # rollout.backend=vllm: its start-up price

    def render(self) -> str:
        s = self.size
        lines = [f"memory plan ({s.source}: {parameters(s.params)} parameters, {s.blocks} blocks, "
                 f"{s.tokens} tokens per sample; text encoders: {s.companions or 'none'}; master weights "
                 f"{self.master_dtype}; an estimate, see docs/config.md):"] + [p.render() for p in self.pools]
        unchecked = [p.pool for p in self.pools if p.capacity_gb is None]
        if unchecked:
            lines.append("  " + NOT_CHECKED.format(pools=", ".join(unchecked)))
        lines += [f"  {n}" for n in self.engine_startup]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _cfg_branches(cfg: RunConfig) -> int:
    distilled = arch_facts(cfg.model.arch).pretrained.guidance_distilled
    return 2 if cfg.rollout.guidance_scale > 1 and not distilled else 1


def rows_per_rank(cfg: RunConfig) -> int:
    """(sample x trained step) rows one trainer rank pushes through the transformer in one pass:
    ``digen.tsp.rows_per_pass`` when set (row packing), else an update's samples over the ranks' Ulysses
    groups x the TSP degree (colocated: the whole batch); with Ulysses a rank holds 1/size of each row's tokens."""
    packed = getattr(cfg.digen.tsp, "rows_per_pass", None)
    if packed is not None:
        return int(packed)
    sched = cfg.schedule_config()
    if cfg.trainer.mode == COLOCATED:
        samples, ranks = cfg.batch, cfg.total_workers
    else:
        ranks = cfg.resources.trainer.workers
        samples = sched.mb_size * sched.update_size(sched.make_partition(cfg.resources.generator.workers).unit_size)
    groups = max(1, ranks // cfg.actor.ulysses_sequence_parallel_size)
    return max(1, math.ceil(samples / groups)) * sched.tsp_degree


def _trainer_rows(cfg: RunConfig) -> int:
    """Rows one trainer rank pushes through the transformer in one pass (samples x trained steps
    per pass x CFG branches)."""
    return rows_per_rank(cfg) * _cfg_branches(cfg)


def activation_bytes(rows: int, blocks: int, tokens: int, hidden: int, compute_bytes: int,
                     checkpointing: bool) -> float:
    """Activations one training pass of ``rows`` (sample x step) rows keeps for its backward (see the module
    doc): every block's full set, or with checkpointing each block's input plus one block's full set."""
    per_block = ACT_VALUES_PER_TOKEN * tokens * hidden * compute_bytes
    if checkpointing:
        return rows * (blocks * tokens * hidden * compute_bytes + per_block)
    return rows * blocks * per_block


def trainable_params(cfg: RunConfig, size: ModelSize) -> float:
    """The trained parameters: the whole transformer, or LoRA's adapters on ``LORA_PROJECTIONS`` per block."""
    r = cfg.model.lora_rank
    return 2 * r * size.hidden * LORA_PROJECTIONS * size.blocks if r > 0 else size.params


def memory_plan(cfg: RunConfig, size: ModelSize | None = None, *, rows: int | None = None,
                tag: bool | None = None) -> MemoryPlan | None:
    """Per pool and per GPU estimated memory of a validated config (``None``: no size known).
    ``rows``: (sample x trained step) rows per trainer rank per pass instead of the config's;
    ``tag``: whether the trainer holds TAG's generation copy instead of what ``digen.tag.policy`` says."""
    size = size or model_size(cfg)
    if size is None:
        return None
    a, m = cfg.actor, cfg.model
    model_b = BYTES[m.dtype]
    compute_b = BYTES[a.param_dtype or m.dtype]
    master = master_dtype(cfg)
    master_b = BYTES[master]
    n, lb, h, t = size.params, size.blocks, size.hidden, size.tokens
    colocated = cfg.trainer.mode == COLOCATED
    ranks = cfg.total_workers if colocated else cfg.resources.trainer.workers
    lora = m.lora_rank > 0
    trainable = trainable_params(cfg, size)
    gpu, host = {}, {}
    weights = n * master_b / ranks
    (host if a.param_offload else gpu)["weights"] = weights
    gpu["gathered blocks"] = min(GATHERED_BLOCKS, lb) * n / lb * compute_b if ranks > 1 or a.param_offload else 0.0
    (host if a.param_offload else gpu)["grads"] = trainable * master_b / (1 if lora else ranks)
    (host if a.param_offload or a.optimizer_offload else gpu)["optimizer"] = \
        2 * trainable * master_b / (1 if lora else ranks)
    if a.ema_decay is not None:  # the EMA of the trained tensors, sharded like them, kept through TAG switches
        (host if a.param_offload else gpu)["EMA"] = trainable * master_b / (1 if lora else ranks)
    if cfg.algorithm.name == "diffusion_nft":  # DiffusionNFT's old copy of the trained tensors, sharded like them
        (host if a.param_offload else gpu)["old policy"] = trainable * master_b / (1 if lora else ranks)
    if cfg.mini_batches() > 1 and behaviour_forward(cfg):  # the step's weights: later mini-batches' ratios / old means
        (host if a.param_offload else gpu)["step weights"] = trainable * master_b / (1 if lora else ranks)
    gen_block = GEN_VALUES_PER_TOKEN * t * h * model_b
    trows = (rows_per_rank(cfg) if rows is None else rows) * _cfg_branches(cfg)
    local_tokens = math.ceil(t / a.ulysses_sequence_parallel_size)  # Ulysses: this rank's share of each row's
    gpu["activations"] = activation_bytes(trows, lb, local_tokens, h, compute_b, a.activation_checkpointing)
    if a.kl_coef > 0 and not lora:
        (host if a.param_offload else gpu)["reference"] = n * compute_b / ranks
    encoders, vae = size.text_encoder_params * model_b, size.vae_params * model_b
    gen_rows = cfg.rollout.micro_batch_size * _cfg_branches(cfg)  # CFG runs both branches as one forward
    if tag is None:
        tag = cfg.trainer.mode == DIGEN and cfg.digen.tag.policy != "never"
    if colocated or tag:
        # the generation pipeline: a full bf16 transformer (unless the rank's own weights serve), its text
        # encoders and VAE (they stay on the GPU: only the transformer moves out at the switch to training)
        gpu["generation copy"] = n * model_b if ranks > 1 or a.param_offload or _mixed(cfg) else 0.0
        gpu["text encoders"] = encoders
        gpu["VAE"] = vae
        gpu["generation activations"] = gen_rows * gen_block
    reward, notes = reward_memory(cfg)
    caps = gpu_memory(cfg)
    reward += served_judge_bytes(cfg, caps["colocated" if colocated else "generator"][0], notes)
    if colocated:
        gpu["reward model"] = reward
    trainer_pool = "colocated" if colocated else "trainer"
    trainer = PoolMemory(trainer_pool, ranks, gpu, host, *caps[trainer_pool])
    pools = [trainer]
    startup: list[str] = []
    if not colocated and cfg.rollout.backend == "vllm":
        pools.insert(0, engine_pool(cfg, n * model_b, encoders, vae, gen_rows * gen_block, reward, caps["generator"]))
        startup = engine_startup_lines(cfg, n * model_b + encoders + vae)
    elif not colocated:
        pools.insert(0, PoolMemory("generator", cfg.resources.generator.workers, {
            "weights": n * model_b, "text encoders": encoders, "VAE": vae,
            "activations": gen_rows * gen_block, "reward model": reward}, {},
            *caps["generator"]))
    if not colocated and cfg.digen.sync.backend == "collective":
        # collective sync (workers/sync.py): a trainer rank keeps its 1/R share of the published version's
        # buckets until the next publish; a generator receives large tensors in place and stages two packed
        # buckets of the small ones (whatever R), or the whole payload until it verifies
        # (digen.sync.verify_payload); a relaying generator packs two as well
        from verl_digen.workers.sync_spec import SYNC_PACK_MB  # no torch, no ray

        moved = trainable * model_b if lora else n * model_b
        packed = min(cfg.digen.sync.bucket_mb, SYNC_PACK_MB) * 2 ** 20
        trainer.parts["sync staging"] = moved / ranks
        pools[0].parts["sync staging"] = moved if cfg.digen.sync.verify_payload else min(moved, 2 * packed)
    if size.companions.startswith("unknown"):
        notes.append(f"text encoders and VAE of model.arch={m.arch}: sizes not known here, not counted")
    return MemoryPlan(size, pools, notes, master, startup)


#: rollout.backend=vllm: what an engine holds besides its weights, text encoders, VAE and requests: the device
#: context, the attention and GEMM workspaces, the allocator's slack. An assumption, not measured on a GPU
ENGINE_RUNTIME_GIB = 2.0


def engine_pool(cfg: RunConfig, weights: float, encoders: float, vae: float, requests: float, reward: float,
                cap: tuple[float | None, str]) -> PoolMemory:
    """A generator GPU with ``rollout.backend=vllm``: the engine's resident transformer, its text encoders and
    VAE (once: the generator encodes prompts with the engine's, workers/vllm_backend.py), the requests in flight
    (a micro-batch, ``rollout.vllm_max_batch``, with its CFG rows; compiled graphs keep a second set of their
    static buffers), its runtime; beside it the worker's reward model (and, with the collective sync, staging)."""
    compiled = 2 if cfg.rollout.vllm_compile else 1
    parts = {"engine weights": weights, "text encoders": encoders, "VAE": vae,
             "engine requests in flight": requests * compiled, "engine runtime": ENGINE_RUNTIME_GIB * GIB,
             "reward model": reward}
    return PoolMemory("generator", cfg.resources.generator.workers, parts, {}, *cap,
                      engine_fraction=float(cfg.rollout.vllm_memory_fraction))


def engine_startup_lines(cfg: RunConfig, loaded: float) -> list[str]:
    """The dry run's engine start-up price (``schedule.presets.engine_startup``)."""
    from verl_digen.schedule import presets

    spec = presets.SPECS.get(cfg.digen.profile) if cfg.digen.profile else None
    host = spec.gen.gpu.host_gbs if spec else presets.Gpu("default", 1.0).host_gbs
    s = presets.engine_startup(loaded, host, cfg.rollout.vllm_compile)
    g = cfg.resources.generator.workers
    how = "compiled" if cfg.rollout.vllm_compile else "eager"
    return [f"engine start-up (rollout.backend=vllm, {how}; assumed, schedule/presets.py): {s.seconds:.0f} s per "
            f"generator (fixed {s.fixed_s:.0f} s + {_gb(loaded)} read from disk {s.read_s:.0f} s + copied to the "
            f"GPU {s.copy_s:.0f} s + compile {s.compile_s:.0f} s); paid once per generator at start ({g} generators: "
            f"{s.price(g):.0f} GPU-s) and again per generator restart ({s.seconds:.0f} GPU-s each)"]


def _mixed(cfg: RunConfig) -> bool:
    a, d = cfg.actor, cfg.model.dtype
    master, compute = master_dtype(cfg), a.param_dtype or d
    return master != compute or (a.reduce_dtype or master) != master


def _set(cfg: RunConfig, where: str, **kw) -> RunConfig:
    """A copy of ``cfg`` with the fields ``kw`` of its part ``where`` ("actor", "digen.tsp", ...) replaced."""
    cfg = copy.deepcopy(cfg)
    obj = get_key(cfg, where)
    for k, v in kw.items():
        setattr(obj, k, v)
    return cfg


# -- for the planner ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class PoolNeed:
    """One pool's estimated peak per GPU against its GPU memory (``capacity_gib`` None: unknown)."""

    pool: str
    gib: float
    capacity_gib: float | None

    @property
    def fits(self) -> bool:
        return self.capacity_gib is None or self.gib <= self.capacity_gib


def _variant(cfg: RunConfig, activation_checkpointing: bool | None, generator_workers: int | None,
             trainer_workers: int | None) -> RunConfig:
    if activation_checkpointing is not None and activation_checkpointing != cfg.actor.activation_checkpointing:
        cfg = _set(cfg, "actor", activation_checkpointing=activation_checkpointing)
    if generator_workers is not None and generator_workers != cfg.resources.generator.workers:
        cfg = _set(cfg, "resources.generator", workers=generator_workers)
    if trainer_workers is not None and trainer_workers != cfg.resources.trainer.workers:
        cfg = _set(cfg, "resources.trainer", workers=trainer_workers)
    return cfg


def memory_need(cfg: RunConfig, *, rows_per_rank: int | None = None, activation_checkpointing: bool | None = None,
                tag: bool | None = None, generator_workers: int | None = None, trainer_workers: int | None = None,
                size: ModelSize | None = None) -> dict[str, PoolNeed] | None:
    """Per pool ("generator", "trainer" or "colocated"): the estimated peak GiB per GPU of ``cfg``
    with the given knobs in place of the config's (``None`` keeps the config's), against the pool's
    GPU memory (declared, else the preset's hardware). ``rows_per_rank``: (sample x trained step)
    rows per trainer rank per pass, before CFG doubles them. ``None`` when the model size is unknown.
    Pass ``size`` (``model_size(cfg)``) when calling many times."""
    cfg = _variant(cfg, activation_checkpointing, generator_workers, trainer_workers)
    plan = memory_plan(cfg, size, rows=rows_per_rank, tag=tag)
    if plan is None:
        return None
    return {p.pool: PoolNeed(p.pool, p.total / GIB, p.capacity_gb) for p in plan.pools}


def max_rows_per_rank(cfg: RunConfig, *, activation_checkpointing: bool | None = None, tag: bool | None = None,
                      trainer_workers: int | None = None, size: ModelSize | None = None,
                      usable: float = 1.0) -> int | None:
    """The most (sample x trained step) rows per trainer rank per pass whose peak fits ``usable`` (a
    fraction) of the trainer (or colocated) pool's GPU memory: 0 when not even one does, ``None`` when the
    memory or the model size is unknown. Activations are linear in the rows, so it is solved, not searched."""
    if not 0 < usable <= 1:
        raise ValueError(f"usable must be a fraction in (0, 1], got {usable}")
    cfg = _variant(cfg, activation_checkpointing, None, trainer_workers)
    size = size or model_size(cfg)
    if size is None:
        return None
    zero, one = (memory_plan(cfg, size, rows=r, tag=tag).pools[-1] for r in (0, 1))
    if zero.capacity_gb is None:
        return None
    cap = zero.capacity_gb * GIB * usable
    if zero.gen_total > cap:
        return 0
    per_row = one.parts["activations"] - zero.parts["activations"]
    return max(0, math.floor((cap - zero.train_total) / per_row + 1e-9)) if per_row > 0 else 10**9


# -- refusal with suggestions -------------------------------------------------------------------------

ACTIVATION_PARTS = ("activations", "generation activations")


def _fig(pool: PoolMemory) -> str:
    return f"{_gb(pool.total)}" + ("" if pool.fits else ", still over")


def suggestions(cfg: RunConfig, pool: PoolMemory, size: ModelSize) -> list[str]:
    """What would make ``pool`` fit, led by what addresses its dominant term (``PoolMemory.dominant``),
    each with the figure the plan gives for it ("still over" where it is not enough alone)."""
    if pool.pool == "generator":
        return _generator_suggestions(cfg, pool, size)

    def trainer_pool(c: RunConfig, **kw) -> PoolMemory:
        return memory_plan(c, size, **kw).pools[-1]

    activations = _activation_suggestions(cfg, size, trainer_pool)
    state = _state_suggestions(cfg, pool, trainer_pool)
    generation = []
    if cfg.trainer.mode == DIGEN and pool.parts.get("text encoders", 0.0) + pool.parts.get("generation copy", 0.0):
        generation.append(f"digen.tag.policy=never: no generation pipeline on the trainer "
                          f"({_fig(trainer_pool(cfg, tag=False))})")
    order = {"activations": (activations, state, generation), "model state": (state, generation, activations),
             "generation pipeline": (generation, state, activations)}
    order = order.get(pool.dominant, (state, generation, activations))
    out = [s for group in order for s in group]
    return out or [f"GPUs with at least {pool.total / GIB:.3g} GiB"]


def _generator_suggestions(cfg: RunConfig, pool: PoolMemory, size: ModelSize) -> list[str]:
    """A generator holds no training state: fewer samples per forward when activations dominate, else more memory."""
    out: list[str] = []
    mb = cfg.rollout.micro_batch_size
    if pool.dominant == "activations" and mb > 1:
        for smaller in range(mb - 1, 0, -1):
            alt = memory_plan(_set(cfg, "rollout", micro_batch_size=smaller), size).pools[0]
            if alt.fits or smaller == 1:
                out.append(f"rollout.micro_batch_size={smaller} ({_fig(alt)})")
                break
    out.append(f"generator GPUs with at least {pool.total / GIB:.3g} GiB (resources.generator.gpu_memory_gb)")
    return out


def _activation_suggestions(cfg: RunConfig, size: ModelSize, trainer_pool) -> list[str]:
    """What shrinks a trainer rank's activations: recompute them, fewer rows per pass, or a Ulysses cut of each row."""
    a = cfg.actor
    out = []
    if not a.activation_checkpointing:
        out.append("actor.activation_checkpointing=true "
                   f"({_fig(trainer_pool(_set(cfg, 'actor', activation_checkpointing=True)))})")
    rows, cap = rows_per_rank(cfg), max_rows_per_rank(cfg, size=size)
    if cap is not None and 1 <= cap < rows:
        out.append(f"fewer rows per pass: at most {cap} (sample x step) rows per trainer rank per pass fit, "
                   f"now {rows} ({_fig(trainer_pool(cfg, rows=cap))}; digen.tsp.rows_per_pass or "
                   "digen.tsp.degree)")
    if cap == 0 and a.ulysses_sequence_parallel_size == 1:
        out += _ulysses_suggestion(cfg, trainer_pool)
    return out


def _state_suggestions(cfg: RunConfig, pool: PoolMemory, trainer_pool) -> list[str]:
    """What shrinks the model state per trainer GPU: offload it, shard it over more GPUs, or train a LoRA only."""
    out = []
    if pool.parts.get("optimizer"):
        out.append(f"actor.optimizer_offload=true ({_fig(trainer_pool(_set(cfg, 'actor', optimizer_offload=True)))})")
    if "weights" in pool.parts:
        out.append(f"actor.param_offload=true ({_fig(trainer_pool(_set(cfg, 'actor', param_offload=True)))})")
    if cfg.trainer.mode != COLOCATED:
        r = cfg.resources.trainer.workers
        for more in range(r + 1, 8 * r + 1):
            alt = trainer_pool(_set(cfg, "resources.trainer", workers=more))
            if alt.fits or more == 8 * r:
                out.append(f"more trainer GPUs: resources.trainer.workers={more} ({_fig(alt)})")
                break
    if cfg.model.lora_rank == 0:
        out.append(f"model.lora_rank=64 ({_fig(trainer_pool(_set(cfg, 'model', lora_rank=64)))})")
    return out


def _ulysses_suggestion(cfg: RunConfig, trainer_pool) -> list[str]:
    """When not even one (sample x step) row fits a trainer GPU: the smallest Ulysses size this run can be cut
    into with which one row per pass fits (else the largest it can be cut into), as a suggestion."""
    from verl_digen.config.checks import sequence_parallel_problem

    sizes = [p for p in (2, 4, 8) if sequence_parallel_problem(cfg, p) is None]
    for size in sizes:
        alt = trainer_pool(_set(cfg, "actor", ulysses_sequence_parallel_size=size), rows=1)
        if alt.fits or size == sizes[-1]:
            return [f"actor.ulysses_sequence_parallel_size={size} with digen.tsp.rows_per_pass=1: not even one row "
                    f"fits a GPU; each of {size} GPUs would hold 1/{size} of its tokens ({_fig(alt)})"]
    return []


def generation_copy_resident(cfg: RunConfig, plan: MemoryPlan | None = None) -> bool:
    """Whether a TAG trainer rank keeps its generation copy on its GPU between switches: when the memory
    plan has room for it beside the whole training state (the copy is then allocated once and only
    re-gathered). Otherwise the switch back to training frees it and the next switch allocates and gathers
    it again; it is never parked in host memory, since every byte of it is overwritten at the next switch.
    A CPU run keeps it (its "device" is the host: freeing saves nothing); so does a GPU run of unknown size
    or capacity only when the plan says so, i.e. never."""
    if cfg.trainer.device != "cuda":
        return True
    plan = plan if plan is not None else memory_plan(cfg)
    if plan is None:
        return False
    pool = plan.pools[-1]  # the trainer (or colocated) pool
    copy = pool.parts.get("generation copy", 0.0)
    return pool.capacity_gb is not None and pool.train_total + copy <= pool.capacity_gb * GIB


def check_fits(cfg: RunConfig) -> MemoryPlan | None:
    """Refuse (``ConfigError``) a config whose estimated per-GPU memory exceeds its pool's GPU memory
    (declared ``resources.<pool>.gpu_memory_gb``, else the preset's hardware), naming what would make
    it fit, led by what addresses the dominant term, each with its figure."""
    size = model_size(cfg)
    plan = memory_plan(cfg, size)
    if plan is None:
        return None
    for pool in plan.pools:
        if pool.fits:
            continue
        if not pool.engine_fits:
            terms = {k: pool.parts[k] for k in pool.ENGINE if pool.parts.get(k)}
            largest = max(terms, key=terms.get)
            raise ConfigError("rollout.vllm_memory_fraction", pool.engine_fraction,
                              f"a share of the generator GPU that holds the vLLM-Omni engine's estimated "
                              f"{_gb(pool.engine_total)} ({', '.join(f'{k} {_gb(v)}' for k, v in terms.items())}; "
                              f"largest: {largest} {_gb(terms[largest])}), or more generator GPU memory than "
                              f"{pool.capacity_gb:g} GiB ({pool.capacity_source})")
        key = "resources.generator.gpu_memory_gb" if pool.pool == "generator" else "resources.trainer.gpu_memory_gb"
        raise ConfigError(key, pool.capacity_gb,
                          f"GPUs that hold the {pool.pool} pool's estimated {_gb(pool.total)} per GPU "
                          f"({', '.join(f'{k} {_gb(v)}' for k, v in pool.parts.items() if v)}; largest: "
                          f"{pool.dominant}; {pool.capacity_gb:g} GiB from {pool.capacity_source}); to fit, try "
                          + "; ".join(suggestions(cfg, pool, size)))
    return plan


def check_keys(cfg: RunConfig) -> list[str]:
    """The memory and precision keys: known dtypes, a master dtype at least as wide as the compute
    dtype, a positive GPU memory. Returns warnings: 16-bit master weights of a full fine-tune, asked for."""
    a, d = cfg.actor, cfg.model.dtype
    for key in ("param_dtype", "reduce_dtype", "master_dtype"):
        v = getattr(a, key)
        if v is not None and v not in PRECISIONS:
            raise ConfigError(f"actor.{key}", v, f"null or one of {', '.join(PRECISIONS)}")
    master, compute = master_dtype(cfg), a.param_dtype or d
    if BYTES[master] < BYTES[compute]:
        raise ConfigError("actor.master_dtype", master, f"a dtype at least as wide as the compute dtype {compute} "
                          "(actor.param_dtype, else model.dtype): master weights hold what the updates add")
    for pool in ("trainer", "generator"):
        gb = getattr(cfg.resources, pool).gpu_memory_gb
        if gb is not None and not (isinstance(gb, (int, float)) and math.isfinite(gb) and gb > 0):
            raise ConfigError(f"resources.{pool}.gpu_memory_gb", gb, "null or a number of GB > 0")
    if a.master_dtype is not None and BYTES[a.master_dtype] < 4 and cfg.model.lora_rank == 0:
        return [f"actor.master_dtype={a.master_dtype}: a full fine-tune keeps its weights and AdamW state in "
                f"{a.master_dtype}, which rounds away any update smaller than about {HALF_ULP[a.master_dtype]} of "
                f"a weight (AdamW moves a weight by ~actor.lr = {a.lr:g} per step): small updates vanish and "
                "training can stall silently. Leave it null for fp32 masters with 16-bit compute (the default; "
                "twice the weight, gradient and optimizer memory)"]
    return []
