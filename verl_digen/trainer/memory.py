"""The memory plan of a run: per pool, per GPU, what the weights, gradients, optimizer state,
activations, KL reference, TAG's generation copy and the reward model take, against the GPU memory
the config declares (``resources.<pool>.gpu_memory_gb``). Printed by the dry run; a run that cannot
fit is refused by ``validate`` before Ray starts, naming the knobs that would make it fit.

Pure arithmetic from parameter counts: the model's size comes from the simulator preset
``digen.profile`` names (``schedule/presets.py``: parameters, blocks, width, tokens, reward model), or
for the tiny random-weight models from counting their parameters. It mirrors what the trainer builds
(``workers/actor_memory.py``): master-dtype shards, compute-dtype gathers, a sharded reference.

Activations (per trained row, per block): ``ACT_VALUES_PER_TOKEN`` values of the compute dtype per
token and hidden unit (the transformer-layer count of Korthikanti et al., 34 bytes of 16-bit values
without the attention-score term, which fused attention does not keep). With activation
checkpointing a block keeps its input only (1 value), plus one block's full set during its recompute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from verl_digen.schedule.config import COLOCATED, DIGEN
from verl_digen.trainer.config import ConfigError, RunConfig
from verl_digen.workers.config import PRECISIONS

ACT_VALUES_PER_TOKEN = 17  # per hidden unit per block, without checkpointing
GATHERED_BLOCKS = 2  # FSDP2 holds the current block's gathered params and prefetches the next
GIB = 2**30
BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
LORA_PROJECTIONS = 8  # attention projections of an MM-DiT block LoRA targets (models.adapter)


@dataclass(frozen=True)
class ModelSize:
    """What the estimate needs of the policy and the scorer."""

    params: float
    blocks: int
    hidden: int
    tokens: int  # per sample, image + text
    reward_params: float = 0.0  # a neural scorer's parameters (0: a closed-form reward)
    source: str = ""


def model_size(cfg: RunConfig) -> ModelSize | None:
    """From the simulator preset ``digen.profile`` names, or by counting a tiny model's parameters;
    ``None`` for a pretrained model without a preset (no size known before the weights load)."""
    from verl_digen.schedule import presets

    if cfg.digen.profile in presets.SPECS:
        spec = presets.SPECS[cfg.digen.profile]
        m, s = spec.model, spec.setting
        return ModelSize(m.params_b * 1e9, m.blocks, m.hidden, presets.tokens(m, s), s.reward_params_b * 1e9,
                         f"preset {spec.name}")
    if cfg.model.path is not None:
        return None
    from verl_digen.models import build_model
    from verl_digen.models.tiny import TINY_TEXT_LEN

    model = build_model(cfg.model.arch, latent_size=cfg.model.latent_size, num_frames=cfg.model.num_frames,
                        seed=cfg.model.seed)
    t = model.transformer
    names = set(getattr(t, "_no_split_modules", None) or ())
    blocks = sum(1 for mod in t.modules() if type(mod).__name__ in names) or 1
    c = getattr(t, "config", {})
    hidden = int(c.get("num_attention_heads", 0) * c.get("attention_head_dim", 0)) or 1
    shape = model.latent_shape
    frames = shape[1] if len(shape) == 4 else 1
    tokens = frames * (shape[-2] // 2) * (shape[-1] // 2) + TINY_TEXT_LEN
    return ModelSize(float(sum(p.numel() for p in t.parameters())), blocks, hidden, tokens, 0.0,
                     f"tiny {cfg.model.arch}")


@dataclass
class PoolMemory:
    """Estimated bytes on one GPU of a pool, by kind; ``host`` is what offload moved to host memory."""

    pool: str
    gpus: int
    parts: dict[str, float] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)
    capacity_gb: float | None = None

    #: parts resident only while generating (TAG / colocated): the training state is switched out then
    GEN_ONLY = ("generation copy", "generation activations")
    TRAIN_ONLY = ("gathered blocks", "grads", "optimizer", "activations")

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
    def fits(self) -> bool:
        return self.capacity_gb is None or self.total <= self.capacity_gb * GIB

    def render(self) -> str:
        cap = "not checked (set resources.<pool>.gpu_memory_gb)" if self.capacity_gb is None else \
            f"of {self.capacity_gb:g} GB: {'fits' if self.fits else 'DOES NOT FIT'}"
        parts = ", ".join(f"{k} {_gb(v)}" for k, v in self.parts.items() if v)
        line = f"  {self.pool:<10} per GPU ({self.gpus} GPU(s)): {_gb(self.total)} {cap}\n             {parts}"
        if any(k in self.parts for k in self.GEN_ONLY):
            line += (f"\n             peak = max(training {_gb(self.train_total)}, "
                     f"generating {_gb(self.gen_total)}: grads and optimizer switched out)")
        if any(self.host.values()):
            line += "\n             host per GPU: " + ", ".join(f"{k} {_gb(v)}" for k, v in self.host.items() if v)
        return line


def _gb(b: float) -> str:
    return f"{b / GIB:.3g} GB" if b >= GIB / 100 else f"{b / 2**20:.3g} MB"


@dataclass
class MemoryPlan:
    size: ModelSize
    pools: list[PoolMemory]

    def render(self) -> str:
        s = self.size
        return "\n".join([f"memory plan ({s.source}: {s.params / 1e9:.3g}B parameters, {s.blocks} blocks, "
                          f"{s.tokens} tokens per sample; estimate, see docs/config.md):"]
                         + [p.render() for p in self.pools])


def _trainer_rows(cfg: RunConfig) -> int:
    """Rows one trainer rank pushes through the transformer in one pass (samples x trained steps
    per pass x CFG branches)."""
    sched = cfg.schedule_config()
    ranks = cfg.total_workers if cfg.trainer.mode == COLOCATED else cfg.resources.trainer.workers
    if cfg.trainer.mode == COLOCATED:
        samples = cfg.batch
    else:
        samples = sched.mb_size * sched.update_size(sched.make_partition(cfg.resources.generator.workers).unit_size)
    from verl_digen.models.arch import MODEL_REGISTRY, canonical_arch

    distilled = MODEL_REGISTRY[canonical_arch(cfg.model.arch)].pretrained.guidance_distilled
    cfg_branches = 2 if cfg.rollout.guidance_scale > 1 and not distilled else 1
    return max(1, math.ceil(samples / ranks)) * sched.tsp_degree * cfg_branches


def memory_plan(cfg: RunConfig, size: ModelSize | None = None) -> MemoryPlan | None:
    """Per pool and per GPU estimated memory of a validated config (``None``: no size known)."""
    size = size or model_size(cfg)
    if size is None:
        return None
    a, m = cfg.actor, cfg.model
    model_b = BYTES[m.dtype]
    compute_b = BYTES[a.param_dtype or m.dtype]
    master_b = BYTES[a.master_dtype or m.dtype]
    n, lb, h, t = size.params, size.blocks, size.hidden, size.tokens
    colocated = cfg.trainer.mode == COLOCATED
    ranks = cfg.total_workers if colocated else cfg.resources.trainer.workers
    lora = m.lora_rank > 0
    trainable = (2 * m.lora_rank * h * LORA_PROJECTIONS * lb) if lora else n
    gpu, host = {}, {}
    weights = n * master_b / ranks
    (host if a.param_offload else gpu)["weights"] = weights
    gpu["gathered blocks"] = min(GATHERED_BLOCKS, lb) * n / lb * compute_b if ranks > 1 or a.param_offload else 0.0
    (host if a.param_offload else gpu)["grads"] = trainable * master_b / (1 if lora else ranks)
    (host if a.param_offload or a.optimizer_offload else gpu)["optimizer"] = \
        2 * trainable * master_b / (1 if lora else ranks)
    per_block = ACT_VALUES_PER_TOKEN * t * h * compute_b
    rows = _trainer_rows(cfg)
    gpu["activations"] = rows * ((lb * t * h * compute_b + per_block) if a.activation_checkpointing
                                 else lb * per_block)
    if a.kl_coef > 0 and not lora:
        (host if a.param_offload else gpu)["reference"] = n * compute_b / ranks
    if colocated or (cfg.trainer.mode == DIGEN and cfg.digen.tag.policy != "never"):
        gpu["generation copy"] = n * model_b if ranks > 1 or a.param_offload or _mixed(cfg) else 0.0
        gen_rows = cfg.rollout.micro_batch_size * (2 if cfg.rollout.guidance_scale > 1 else 1)
        gpu["generation activations"] = gen_rows * GATHERED_BLOCKS * per_block
    if colocated:
        gpu["reward model"] = size.reward_params * 2
    trainer = PoolMemory("colocated" if colocated else "trainer", ranks, gpu, host,
                         (cfg.resources.trainer.gpu_memory_gb))
    pools = [trainer]
    if not colocated:
        gen_rows = cfg.rollout.micro_batch_size * (2 if cfg.rollout.guidance_scale > 1 else 1)
        pools.insert(0, PoolMemory("generator", cfg.resources.generator.workers, {
            "weights": n * model_b, "activations": gen_rows * GATHERED_BLOCKS * per_block,
            "reward model": size.reward_params * 2}, {}, cfg.resources.generator.gpu_memory_gb))
    return MemoryPlan(size, pools)


def _mixed(cfg: RunConfig) -> bool:
    a, d = cfg.actor, cfg.model.dtype
    master, compute = a.master_dtype or d, a.param_dtype or d
    return master != compute or (a.reduce_dtype or master) != master


#: knobs tried, in order, when a pool does not fit: (description, overrides of a copy of the config)
KNOBS = (
    ("actor.activation_checkpointing=true", lambda c: _set(c, "actor", activation_checkpointing=True)),
    ("digen.tsp.degree=1", lambda c: _set(c, "digen.tsp", degree=1)),
    ("actor.optimizer_offload=true", lambda c: _set(c, "actor", optimizer_offload=True)),
    ("actor.param_offload=true", lambda c: _set(c, "actor", param_offload=True)),
    ("model.lora_rank=64", lambda c: _set(c, "model", lora_rank=64)),
)


def _set(cfg: RunConfig, where: str, **kw) -> RunConfig:
    cfg = replace(cfg, actor=replace(cfg.actor), model=replace(cfg.model),
                  digen=replace(cfg.digen, tsp=replace(cfg.digen.tsp)))
    obj = cfg
    for part in where.split("."):
        obj = getattr(obj, part)
    for k, v in kw.items():
        setattr(obj, k, v)
    return cfg


def check_fits(cfg: RunConfig) -> MemoryPlan | None:
    """Refuse (``ConfigError``) a config whose estimated per-GPU memory exceeds a declared
    ``resources.<pool>.gpu_memory_gb``, naming the single knobs that would make it fit."""
    if cfg.resources.trainer.gpu_memory_gb is None and cfg.resources.generator.gpu_memory_gb is None:
        return None
    size = model_size(cfg)
    plan = memory_plan(cfg, size)
    if plan is None:
        return None
    for pool in plan.pools:
        if pool.fits:
            continue
        key = "resources.generator.gpu_memory_gb" if pool.pool == "generator" else "resources.trainer.gpu_memory_gb"
        fixes = []
        if pool.pool != "generator":
            for name, apply in KNOBS:
                alt = memory_plan(apply(cfg), size).pools[-1]
                if alt.fits:
                    fixes.append(f"{name} ({_gb(alt.total)})")
            fixes.append("more trainer GPUs (resources.trainer.workers: the shards shrink)")
        else:
            fixes.append("a smaller rollout.micro_batch_size, or GPUs with more memory")
        raise ConfigError(key, pool.capacity_gb,
                          f"GPUs that hold the {pool.pool} pool's estimated {_gb(pool.total)} per GPU "
                          f"({', '.join(f'{k} {_gb(v)}' for k, v in pool.parts.items() if v)}); to fit, try "
                          + "; ".join(fixes))
    return plan


def check_keys(cfg: RunConfig) -> None:
    """The memory and precision keys: known dtypes, a master dtype at least as wide as the compute
    dtype, a positive GPU memory."""
    a, d = cfg.actor, cfg.model.dtype
    for key in ("param_dtype", "reduce_dtype", "master_dtype"):
        v = getattr(a, key)
        if v is not None and v not in PRECISIONS:
            raise ConfigError(f"actor.{key}", v, f"null or one of {', '.join(PRECISIONS)}")
    master, compute = a.master_dtype or d, a.param_dtype or d
    if BYTES[master] < BYTES[compute]:
        raise ConfigError("actor.master_dtype", master, f"a dtype at least as wide as the compute dtype {compute} "
                          "(actor.param_dtype, else model.dtype): master weights hold what the updates add")
    for pool in ("trainer", "generator"):
        gb = getattr(cfg.resources, pool).gpu_memory_gb
        if gb is not None and not (isinstance(gb, (int, float)) and math.isfinite(gb) and gb > 0):
            raise ConfigError(f"resources.{pool}.gpu_memory_gb", gb, "null or a number of GB > 0")
