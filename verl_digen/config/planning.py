"""Plan a run config: the joint search (``schedule.split_search``) for this job on its cluster, with the
config's own memory plan bounding the rows per pass, and the Hydra overrides that launch the winner.

``digen plan --recipe <name> [overrides]`` prints the plan; ``digen.plan=auto`` applies it at start.
Every configuration returned here passes ``validate()`` (memory check included): the search only
prices micro-batch sizes the generators hold and rows per pass the trainer ranks hold.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

from verl_digen.config import memory
from verl_digen.config.colocated_memory import (
    MEMORY_USABLE,
    BaselineMemory,
    as_colocated,
    baseline_memory,
    baseline_rows,
    colocated_split,
    unfit,
)
from verl_digen.config.plan import cluster
from verl_digen.config.schema import (
    MODE_DEFAULTS,
    ConfigError,
    RunConfig,
    behaviour_forward,
    defaults,
    get_key,
    row_forwards,
)
from verl_digen.schedule.config import COLOCATED, DIGEN
from verl_digen.schedule.costs import CostModel
from verl_digen.schedule.profile_io import Workload
from verl_digen.schedule.simulator import SimResult
from verl_digen.schedule.split_search import (
    DEFAULT_POLICIES,
    STRONGEST,
    Plan,
    PlanRow,
    RowCap,
    against_baseline,
    ceiling,
    colocated_baselines,
    on_budget,
    search,
)

PLAN_STEPS = 3  # global steps each configuration is simulated for (the dry run's prediction uses 3 too)
AUTO = "auto"


@dataclass
class ConfigPlan:
    """The search's result for one run config, with the colocated baselines on the same GPUs."""

    config: RunConfig
    plan: Plan
    colocated: dict[str, SimResult]
    model: CostModel
    fixed_split: bool
    memory_checked: bool
    ceiling: float  # s/step: the step's work over every GPU (``split_search.ceiling``)
    baseline_memory: dict[str, BaselineMemory] = field(default_factory=dict)  # colocated baselines' memory

    @property
    def unfit(self) -> frozenset[str]:
        """The colocated baselines that do not fit the cluster's GPUs by the memory plan."""
        return unfit(self.baseline_memory)

    @property
    def best(self) -> PlanRow:
        return self.plan.best


def workload(cfg: RunConfig) -> Workload:
    """The run's batch shape and schedule knobs as the planner's workload."""
    return Workload(prompts=cfg.data.train_batch_size, group_size=cfg.rollout.n,
                    mb_size=cfg.rollout.micro_batch_size, tsp_degree=cfg.digen.tsp.degree or cfg.trained_steps(),
                    staleness=cfg.digen.tcss.staleness, steps=PLAN_STEPS, policy=cfg.digen.tag.policy,
                    mini_batches=cfg.mini_batches(), recompute=behaviour_forward(cfg), row_forwards=row_forwards(cfg))


def with_pools(cfg: RunConfig, generators: int, trainers: int, mb_size: int | None = None) -> RunConfig:
    """A copy of ``cfg`` as a digen run on ``generators`` + ``trainers`` GPUs (micro-batches of ``mb_size``)."""
    out = copy.deepcopy(cfg)
    if cfg.trainer.mode != DIGEN:  # a colocated recipe planned disaggregated: digen's values for the mode's keys
        base = defaults(DIGEN)
        for dotted in MODE_DEFAULTS[cfg.trainer.mode]:
            parent, _, leaf = dotted.rpartition(".")
            setattr(get_key(out, parent), leaf, getattr(get_key(base, parent), leaf))
    out.trainer.mode = DIGEN
    out.resources.generator.workers, out.resources.trainer.workers = generators, trainers
    if mb_size is not None:
        out.rollout.micro_batch_size = mb_size
    out.actor.activation_checkpointing = True  # the cost model prices the recomputed forward
    out.digen.tsp.rows_per_pass = None
    out.digen.update_units = 1
    return out


def row_cap(cfg: RunConfig, total: int) -> RowCap | None:
    """The memory plan as the search's row cap on ``total`` GPUs (None: the model size or the GPUs'
    memory is unknown, so nothing bounds the rows)."""
    size = memory.model_size(cfg)
    if size is None or memory.gpu_memory(cfg)["trainer"][0] is None:
        return None

    def cap(trainers: int, mb_size: int, tag: bool) -> int | None:
        variant = with_pools(cfg, total - trainers, trainers, mb_size)
        need = memory.memory_need(variant, rows_per_rank=1, tag=tag, size=size)
        if need is None:
            return None
        gen = need["generator"]
        if gen.capacity_gib is not None and gen.gib > MEMORY_USABLE * gen.capacity_gib:
            return 0
        return memory.max_rows_per_rank(variant, tag=tag, size=size, usable=MEMORY_USABLE)

    return cap


def colocated_cap(cfg: RunConfig, total: int) -> int | None:
    """The most rows per rank per pass a colocated run of ``cfg``'s job on ``total`` GPUs holds by the memory
    plan (within ``MEMORY_USABLE``): 0 when not even one row does, None when the size or memory is unknown."""
    size = memory.model_size(cfg)
    if size is None or memory.gpu_memory(cfg)["trainer"][0] is None:
        return None
    variant = as_colocated(cfg, total)
    return memory.max_rows_per_rank(variant, size=size, usable=MEMORY_USABLE)


def plan_config(cfg: RunConfig, *, gpus: int | None = None, policies: tuple[str, ...] = DEFAULT_POLICIES,
                stalenesses: tuple[float, ...] | None = None, min_trainers: int = 1, keep: int = 10,
                progress: Callable[[str], object] | None = None, colocated: bool = True) -> ConfigPlan:
    """The best configurations of ``cfg``'s job on its cluster (``gpus`` in all, default the config's), the
    colocated layout among them unless ``colocated`` is False."""
    found = cluster(cfg)
    if found is None:
        raise ConfigError("digen.profile", None, "a profile file or a preset name: the planner prices "
                          "configurations with its costs")
    model, fixed = found
    total = gpus or cfg.total_workers
    if not fixed:
        model = on_budget(model, total)
    cap = row_cap(cfg, total)
    wl = workload(cfg)
    plan = search(model, wl, total, policies=policies, stalenesses=stalenesses,
                  min_trainers=min_trainers, fixed_split=fixed, progress=progress, row_cap=cap, keep=keep,
                  colocated=colocated, colocated_cap=colocated_cap(cfg, total) if colocated else None)
    if cap is None:
        plan.notes.append("memory not checked (model size or GPU memory unknown): rows per pass are unbounded")
    fits = baseline_memory(cfg, total)
    plan.notes += [m.describe() for m in fits.values() if m.fits is False]
    return ConfigPlan(cfg, plan, colocated_baselines(model, wl, baseline_rows(fits)), model, fixed, cap is not None,
                      ceiling(model, wl), fits)


def overrides(row: PlanRow, cfg: RunConfig | None = None) -> list[str]:
    """The Hydra overrides that launch ``row`` (on top of ``cfg``, the config it was planned for: a colocated row
    keeps its pool sizes when they add up, else splits the GPUs in half)."""
    rpp = "null" if row.rows_per_pass is None else str(row.rows_per_pass)
    if row.mode == COLOCATED:
        total = row.generators + row.trainers
        gen, trn = colocated_split(cfg, total) if cfg is not None else (max(1, total // 2), total - max(1, total // 2))
        return [
            "trainer=colocated",
            f"resources.generator.workers={gen}",
            f"resources.trainer.workers={trn}",
            f"digen.tsp.degree={row.tsp_degree}",
            f"digen.tsp.rows_per_pass={rpp}",
            "digen.update_units=1",
            "digen.tcss.staleness=0",
            "actor.activation_checkpointing=true",
        ]
    return [
        "trainer=digen",
        f"resources.generator.workers={row.generators}",
        f"resources.trainer.workers={row.trainers}",
        f"rollout.micro_batch_size={row.mb_size}",
        f"digen.tsp.degree={row.tsp_degree}",
        f"digen.tsp.rows_per_pass={rpp}",
        f"digen.update_units={row.update_units}",
        f"digen.tag.policy={row.policy}",
        f"digen.tcss.staleness={row.staleness:g}",
        "actor.activation_checkpointing=true",
    ]


def apply(cfg: RunConfig, row: PlanRow) -> RunConfig:
    """``cfg`` with ``row``'s configuration in place (what ``overrides(row, cfg)`` gives on the command line)."""
    if row.mode == COLOCATED:
        out = as_colocated(cfg, row.generators + row.trainers, row.tsp_degree, row.rows_per_pass)
        out.digen.plan = None
        return out
    out = with_pools(cfg, row.generators, row.trainers, row.mb_size)
    d = out.digen
    d.tsp.degree, d.tsp.rows_per_pass, d.update_units = row.tsp_degree, row.rows_per_pass, row.update_units
    d.tag.policy, d.tcss.staleness = row.policy, row.staleness
    d.plan = None
    return out


def resolve_auto(cfg: RunConfig, log: Callable[[str], object] = print) -> RunConfig:
    """``digen.plan=auto``: plan ``cfg``'s job, say what was chosen and how to launch it without the
    planner, and return the config to run. Any other value returns ``cfg`` unchanged."""
    if cfg.digen.plan is None:
        return cfg
    if cfg.digen.plan != AUTO:
        raise ConfigError("digen.plan", cfg.digen.plan, f"null or {AUTO!r}")
    if not cfg.digen.profile:
        raise ConfigError("digen.plan", cfg.digen.plan, "null unless digen.profile names the costs to plan with "
                          "(a profile file or a preset)")
    if cfg.trainer.mode not in (DIGEN, COLOCATED):
        raise ConfigError("digen.plan", cfg.digen.plan, f"null with trainer={cfg.trainer.mode} (the planner "
                          "chooses between trainer=digen and trainer=colocated; separate is a baseline)")
    log(f"digen.plan=auto: planning {cfg.batch} samples per step on {cfg.total_workers} GPUs "
        f"(costs: {cfg.digen.profile})")
    planned = plan_config(cfg, keep=1, progress=lambda m: log(f"  {m}"))
    row = planned.best
    log(describe(row, planned))
    log("  launch it without the planner: " + " ".join(overrides(row, cfg)))
    return apply(cfg, row)


def describe(row: PlanRow, planned: ConfigPlan) -> str:
    """One line: the chosen configuration and its predicted step against the baselines and the ceiling."""
    subsets, separate = None, None
    if planned.fixed_split:  # mixed pools: the single-type runs a user would make instead, verl-omni's separate mode
        from verl_digen.config.plan import resource_plan

        rp = resource_plan(planned.config)
        subsets, separate = rp.best_subset, rp.separate_s
    label, base = against_baseline(planned.colocated, STRONGEST, subsets, separate, planned.unfit)
    t = row.result.step_time
    rpp = "" if row.rows_per_pass is None else f", {row.rows_per_pass} rows/rank/pass"
    where = ("mixed GPUs: no ceiling" if planned.fixed_split else
             f"{planned.ceiling / t:.0%} of the {planned.ceiling:.2f} s/step ceiling")
    if row.mode == COLOCATED:
        return (f"planned: trainer=colocated on all {row.trainers} GPUs, TSP {row.tsp_degree}{rpp}: {t:.2f} s/step "
                f"predicted ({base / t:.2f}x {label}, {where}); no disaggregated split is faster")
    return (f"planned: {row.generators} generate + {row.trainers} train, micro-batch {row.mb_size}, TSP "
            f"{row.tsp_degree}{rpp}, {row.update_units} unit(s)/update, {row.policy}, staleness {row.staleness:g}: "
            f"{t:.2f} s/step predicted ({base / t:.2f}x {label}, {where})")
