"""A colocated run's memory, for the planner and the plans alike: the share of a GPU any layout may fill
(``MEMORY_USABLE``), the config a colocated run of a job is (``as_colocated``), and each colocated baseline's
memory by that same plan (``baseline_memory``): the rule that refuses this project's own colocated layout
refuses a baseline holding the same state."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from verl_digen.config import memory
from verl_digen.config.schema import MODE_DEFAULTS, RunConfig, get_key
from verl_digen.schedule.config import COLOCATED
from verl_digen.schedule.costs import BASELINES, NATIVE

MEMORY_USABLE = 0.9  # the planner fills at most this share of a GPU by the memory plan: the estimate leaves
# out the CUDA context and the allocator's fragmentation


def colocated_split(cfg: RunConfig, total: int) -> tuple[int, int]:
    """The two pools' sizes a colocated run on ``total`` GPUs keeps (the runtime uses their sum): the config's
    own split when it has ``total`` GPUs (its node placement stays), else half and half."""
    if cfg.total_workers == total:
        return cfg.resources.generator.workers, cfg.resources.trainer.workers
    return max(1, total // 2), total - max(1, total // 2)


def as_colocated(cfg: RunConfig, total: int, tsp_degree: int | None = None,
                 rows_per_pass: int | None = None) -> RunConfig:
    """A copy of ``cfg`` as ``trainer=colocated`` on ``total`` GPUs: the mode's defaults (``MODE_DEFAULTS``),
    on-policy, one release unit per update, activation checkpointing on (the cost model prices it)."""
    out = copy.deepcopy(cfg)
    out.trainer.mode = COLOCATED
    for dotted, value in MODE_DEFAULTS[COLOCATED].items():
        parent, _, leaf = dotted.rpartition(".")
        setattr(get_key(out, parent), leaf, value)
    out.resources.generator.workers, out.resources.trainer.workers = colocated_split(cfg, total)
    out.digen.tsp.degree, out.digen.tsp.rows_per_pass = tsp_degree or 1, rows_per_pass
    out.digen.update_units, out.digen.tcss.staleness = 1, 0.0
    out.actor.activation_checkpointing = True
    return out


@dataclass(frozen=True)
class BaselineMemory:
    """A colocated baseline's peak per GPU by the memory plan on every GPU of the cluster, against the share of
    a GPU the planner lets any layout fill (``MEMORY_USABLE``): the rule that refuses this project's own
    colocated layout refuses a baseline holding the same state."""

    baseline: str
    gib: float  # at the fewest rows per pass it can train with (one row per rank)
    capacity_gib: float | None  # one GPU's memory (None: unknown, nothing ruled out)
    rows_per_pass: int | None  # the most rows per rank per pass it holds (None: not bounded; 0: none fits)
    holds: str  # what it keeps on a GPU, in words

    @property
    def usable_gib(self) -> float | None:
        return None if self.capacity_gib is None else MEMORY_USABLE * self.capacity_gib

    @property
    def fits(self) -> bool | None:
        return None if self.capacity_gib is None else self.gib <= self.usable_gib + 1e-9

    def describe(self) -> str:
        if self.capacity_gib is None:
            return f"colocated:{self.baseline}: memory not checked ({self.gib:.1f} GiB per GPU, GPU memory unknown)"
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return (f"colocated:{self.baseline} {verdict}: {self.gib:.1f} GiB per GPU at one row per pass ({self.holds}) "
                f"against {self.usable_gib:.1f} GiB, {MEMORY_USABLE:.0%} of its {self.capacity_gib:g} GiB (the "
                "planner's headroom for every layout)")

    def as_dict(self) -> dict:
        return {"gib": self.gib, "capacity_gib": self.capacity_gib, "usable_gib": self.usable_gib,
                "fits": self.fits, "rows_per_pass": self.rows_per_pass}


#: what each colocated baseline keeps on a GPU (``baseline_memory``)
ENGINE_HOLDS = "a full generation copy + text encoders + VAE while generating, the sharded training state after"
NATIVE_HOLDS = "the sharded training state throughout, sampling through its gathered blocks: no generation copy"


def baseline_memory(cfg: RunConfig, total: int | None = None) -> dict[str, BaselineMemory]:
    """Per colocated baseline (``costs.BASELINES``), its memory on ``total`` GPUs (default the config's) by the
    same plan as ``trainer=colocated`` (``config.memory``): colocated:ideal is that mode; verl-omni (with or
    without bypass) holds the same on each GPU, its rollout engine's transformer, text encoders and VAE while
    generating and the sharded training state (switched out while generating) when training (its engine's own
    runtime buffers, ``memory.ENGINE_RUNTIME_GIB``, are not charged: in its favour); the native loop
    (flow_grpo / DanceGRPO scripts) keeps the training state resident and samples one sample at a time through
    the FSDP shards, so no generation copy. Empty when the model size is unknown; where the GPUs' memory is
    unknown each entry's ``fits`` is None and nothing is ruled out."""
    size = memory.model_size(cfg)
    if size is None:
        return {}
    total = total or cfg.total_workers
    variant = as_colocated(cfg, total)
    pool = memory.memory_plan(variant, size, rows=1).pools[-1]
    cap = pool.capacity_gb
    rows = memory.max_rows_per_rank(variant, size=size, usable=MEMORY_USABLE) if cap is not None else None
    out = {b: BaselineMemory(b, pool.total / memory.GIB, cap, rows, ENGINE_HOLDS) for b in BASELINES if b != NATIVE}
    parts = pool.parts
    per_sample = parts.get("generation activations", 0.0) / max(1, cfg.rollout.micro_batch_size)
    resident = sum(v for k, v in parts.items() if k not in ("generation copy", "generation activations", "activations"))
    peak = max(resident + parts.get("activations", 0.0), resident - parts.get("grads", 0.0) + per_sample)
    out[NATIVE] = BaselineMemory(NATIVE, peak / memory.GIB, cap, None, NATIVE_HOLDS)
    return {b: out[b] for b in BASELINES}


def unfit(fits: dict[str, BaselineMemory]) -> frozenset[str]:
    """The baselines the memory plan rules out (``baseline_memory``)."""
    return frozenset(b for b, m in fits.items() if m.fits is False)


def baseline_rows(fits: dict[str, BaselineMemory]) -> dict[str, int | None]:
    """Per baseline, the rows per rank per pass its memory holds, for pricing (``colocated_baselines``)."""
    return {b: m.rows_per_pass for b, m in fits.items()}
