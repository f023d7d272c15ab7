"""The resource plan of a run: which pool gets which workers, how the batch is cut, and the step time
the simulator predicts. Printed by the dry run (``trainer.dry_run=true``) before anything starts."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace

from verl_digen.config.schema import ConfigError, RunConfig, recompute_log_prob
from verl_digen.schedule import presets
from verl_digen.schedule.config import COLOCATED
from verl_digen.schedule.costs import BASELINES, IDEAL, CostModel, StageCosts, with_judge
from verl_digen.schedule.profile_io import Workload
from verl_digen.schedule.simulator import simulate
from verl_digen.schedule.split_search import (
    SEPARATE_BASELINE,
    VERL_OMNI,
    VERL_OMNI_BYPASS,
    Subset,
    SubsetFits,
    baseline_caps,
    best_subsets,
    ceiling,
    separate_baseline,
    strongest_baseline,
)


def cluster(cfg: RunConfig) -> tuple[CostModel, bool] | None:
    """(the run's cost model resized to its pools, whether its pools are fixed by their hardware), when
    ``digen.profile`` names one; a preset is re-derived for the run's sampling steps, trained steps and Ulysses size."""
    found = cluster_spec(cfg)
    return None if found is None else found[:2]


def cluster_spec(cfg: RunConfig) -> tuple[CostModel, bool, presets.PresetSpec | None] | None:
    """``cluster`` and the preset spec the model was derived from (None for a measured profile): what
    re-derives the cluster on one pool's hardware alone (``split_search.pool_alone``)."""
    if not cfg.digen.profile:
        return None
    try:
        _, model, _, spec = presets.resolve(cfg.digen.profile)
    except ValueError as err:
        raise ConfigError("digen.profile", cfg.digen.profile, "a profile file or a preset name") from err
    if spec is not None:
        built = spec.build(sampling_steps=cfg.rollout.num_steps, trained_k=cfg.trained_steps(),
                           sequence_parallel=cfg.actor.ulysses_sequence_parallel_size)
        model, spec = built.model, built.spec
    model = model.with_workers(cfg.resources.generator.workers, cfg.resources.trainer.workers)
    from verl_digen.config import judge

    priced = judge.cost(cfg)  # the served judge's time per image, on both sides of every comparison
    if priced is not None:
        model = with_judge(model, priced)
    return model, bool(spec is not None and spec.heterogeneous), spec


def subset_fits(cfg: RunConfig) -> SubsetFits:
    """Whether a colocated run of ``cfg``'s job on one pool's GPUs alone fits their memory, by the memory plan
    (``config.memory``): ``trainer=colocated`` on that pool's GPU count, every GPU of that pool's memory, one
    (sample x step) row per rank per pass (the least a colocated run can train with, so a False is certain;
    the baseline is priced with its own passes, not capped), within the share of a GPU the planner lets any
    layout fill (``colocated_memory.MEMORY_USABLE``, the rule every layout and baseline is held to). None when the model
    size or the memory is unknown."""
    from verl_digen.config import memory
    from verl_digen.config.colocated_memory import MEMORY_USABLE

    caps = memory.gpu_memory(cfg)

    def fits(pool: str) -> bool | None:
        gib = caps[pool][0]
        n = getattr(cfg.resources, pool).workers
        if gib is None or n < 2:
            return None
        variant = copy.deepcopy(cfg)
        variant.trainer.mode = COLOCATED
        variant.resources.generator.workers, variant.resources.trainer.workers = n // 2, n - n // 2
        variant.resources.generator.gpu_memory_gb = variant.resources.trainer.gpu_memory_gb = gib
        variant.digen.tag.policy, variant.digen.tcss.staleness = "never", 0.0
        need = memory.memory_need(variant, rows_per_rank=1)
        return None if need is None else need[COLOCATED].gib <= MEMORY_USABLE * gib + 1e-9

    return fits


def cluster_costs(cfg: RunConfig) -> CostModel | None:
    """The run's cost model (``cluster``), or None without ``digen.profile``."""
    found = cluster(cfg)
    return None if found is None else found[0]


def prior_stage_costs(cfg: RunConfig) -> StageCosts:
    """The scheduler's starting cost estimates (the online profiler refines them from step 1)."""
    model = cluster_costs(cfg)
    if model is None:
        return StageCosts(generate=0.0, tag_generate=0.0, score=0.0, update=0.0)
    return cfg.schedule_config().stage_costs(model, cfg.resources.generator.workers)


#: the resource plan's name for the served judge's own pool (``resources.reward``)
JUDGE_POOL = "judge"


@dataclass
class ResourcePlan:
    pools: list[tuple[str, int, str]]  # (pool, workers, placement)
    batch: int
    micro_batches: int
    release_unit: int
    trained_steps: int
    tsp_passes: int
    predicted_step_s: float | None
    predicted_colocated: dict[str, float] = field(default_factory=dict)  # baseline -> s/step (costs.BASELINES)
    heterogeneous: bool = False  # pools of two hardware types (then there is no ceiling)
    ceiling_s: float | None = None  # the step's work over every GPU (schedule.split_search.ceiling)
    old_log_probs: str = ""  # whose log-probs the ratio is taken against, and why (actor.recompute_log_prob)
    mini_batches: int = 1  # optimizer steps per step (actor.ppo_mini_batch_size)
    # mixed pools: per baseline, its fastest colocated run on one pool's GPUs alone (split_search.best_subsets)
    best_subset: dict[str, Subset] = field(default_factory=dict)
    subset_notes: list[str] = field(default_factory=list)
    separate_s: float | None = None  # mixed pools: verl-omni's synchronous separate mode (separate_baseline)
    judge: str | None = None  # the served judge's placement and price (config/judge.py), both sides
    # per colocated baseline on every GPU: its memory by the same plan (colocated_memory.baseline_memory); {}: unknown
    baseline_memory: dict = field(default_factory=dict)

    @property
    def unfit(self) -> frozenset[str]:
        """The colocated baselines that do not fit every GPU's memory: reported so, never as a ratio."""
        return frozenset(b for b, m in self.baseline_memory.items() if m.fits is False)

    @property
    def predicted_colocated_step_s(self) -> float | None:
        """The colocated run this runtime's ``trainer=colocated`` is: the idealized one, step by step."""
        return self.predicted_colocated.get(IDEAL)

    @property
    def total_workers(self) -> int:
        """The workers that generate and train (a judge's own pool is counted apart: ``judge_gpus``)."""
        return sum(n for name, n, _ in self.pools if name != JUDGE_POOL)

    @property
    def judge_gpus(self) -> int:
        return sum(n for name, n, _ in self.pools if name == JUDGE_POOL)

    def render(self) -> str:
        lines = self._layout_lines()
        if self.predicted_step_s is None:
            lines.append("  predicted  (set digen.profile to a profile file or preset for a prediction)")
        else:
            lines += self._prediction_lines()
        return "\n".join(lines)

    def _layout_lines(self) -> list[str]:
        """What the run is made of: its pools, its batch and how it is trained, whatever the profile says."""
        lines = ["resource plan:"]
        for name, n, where in self.pools:
            lines.append(f"  {name:<10} {n:>4} worker(s)  on {where}")
        lines += [
            f"  batch      {self.batch} samples = {self.micro_batches} micro-batch(es); "
            f"release unit {self.release_unit} micro-batch(es)",
            f"  training   {self.trained_steps} trained step(s) per sample in {self.tsp_passes} TSP pass(es)"
            + (f"; {self.mini_batches} mini-batches, an optimizer step each (TAG before the first only)"
               if self.mini_batches > 1 else ""),
        ]
        if self.old_log_probs:
            lines.append(f"  log-probs  old: {self.old_log_probs}")
        if self.judge:
            lines.append(f"  judge      {self.judge}")
        return lines

    def _prediction_lines(self) -> list[str]:
        """The simulator's step time set against every baseline a user could run instead, and the ceiling."""
        lines = [f"  predicted  {self.predicted_step_s:.2f} s/step (simulator)"]
        label, t = self.strongest
        lines.append(f"  vs best    {t / self.predicted_step_s:.2f}x the strongest baseline, {label} "
                     f"({t:.2f} s/step): the fastest run a user has without verl-digen")
        lines += self._colocated_lines()
        if self.heterogeneous:
            lines += self._subset_lines()
            if self.separate_s is not None:
                lines.append(f"             {self.separate_s:.2f} s/step {SEPARATE_BASELINE} on the same pools "
                             "(verl-omni's synchronous separate mode, priced without its recompute) "
                             f"(this run: {self.separate_s / self.predicted_step_s:.2f}x its throughput)")
            lines.append("  ceiling    none from colocated:ideal on mixed hardware (it waits for the slower GPUs "
                         "in every phase)")
        elif self.ceiling_s is not None:
            lines.append(f"  ceiling    {self.ceiling_s:.2f} s/step: the step's work over all {self.total_workers} "
                         f"workers (colocated:ideal, best TSP degree); this run reaches "
                         f"{self.ceiling_s / self.predicted_step_s:.0%} of it")
        real = {b: t for b, t in self.predicted_colocated.items() if b != IDEAL and b not in self.unfit}
        if real and min(real.values()) < self.predicted_step_s:
            best = min(real, key=real.get)
            lines.append(f"  note       colocated:{best} would be faster on this cluster; "
                         "`digen plan` says why and searches other splits")
        return lines

    def _colocated_lines(self) -> list[str]:
        """Each colocated baseline on the same workers, as a ratio, or as not fitting (then it is no baseline)."""
        judged = f" (+ the judge's {self.judge_gpus} GPU(s))" if self.judge_gpus else ""
        lines = []
        for b, colo in self.predicted_colocated.items():
            if b in self.unfit:
                m = self.baseline_memory[b]
                lines.append(f"             {colo:.2f} s/step colocated:{b} on the same {self.total_workers} "
                             f"workers{judged} if it fit: it DOES NOT FIT ({m.gib:.1f} GiB per GPU against "
                             f"{m.usable_gib:.1f} GiB, the planner's headroom on {m.capacity_gib:g} GiB), so it is "
                             "no baseline here")
                continue
            lines.append(f"             {colo:.2f} s/step colocated:{b} on the same {self.total_workers} workers"
                         f"{judged} (this run: {colo / self.predicted_step_s:.2f}x its throughput)")
        return lines

    def _subset_lines(self) -> list[str]:
        """The mixed cluster's single-type alternative: ``<s> s/step best-subset`` (colocated:verl-omni on its
        fastest pool alone), then the bypass and ideal runs there."""
        lines = []
        head = self.best_subset.get(VERL_OMNI)
        if head is not None:
            t = head.result.step_time
            pred = self.predicted_step_s
            others = ", ".join(f"colocated:{b} {s.result.step_time:.2f} s/step ({s.result.step_time / pred:.2f}x)"
                               for b, s in self.best_subset.items() if b != VERL_OMNI)
            lines.append(f"             {t:.2f} s/step best-subset: colocated:{VERL_OMNI} on {head.describe()} "
                         f"(this run: {t / self.predicted_step_s:.2f}x its throughput)")
            if others:
                lines.append(f"             best-subset also: {others}")
        else:
            lines.append("             best-subset: no single-type pool can run colocated on its own")
        lines += [f"  note       {n}" for n in self.subset_notes]
        return lines

    @property
    def strongest(self) -> tuple[str, float]:
        """(label, s/step) of the strongest baseline (``split_search.strongest_baseline``); needs a prediction."""
        if not self.heterogeneous:
            return strongest_baseline(self.predicted_colocated, unfit=self.unfit)
        return strongest_baseline(self.predicted_colocated, self.best_subset, self.separate_s, self.unfit)

    @property
    def strongest_subset(self) -> float | None:
        """s/step of the fastest single-type run a user would make (verl-omni or its bypass), None if none."""
        runs = [s.result.step_time for b, s in self.best_subset.items() if b in (VERL_OMNI, VERL_OMNI_BYPASS)]
        return min(runs) if runs else None


def resource_plan(cfg: RunConfig) -> ResourcePlan:
    """Pools, batch layout and predicted step time of a validated config."""
    from verl_digen.config import judge

    res, dev = cfg.resources, cfg.trainer.device

    def where(node_resource: str | None) -> str:
        return f"nodes with resource '{node_resource}'" if node_resource else f"any {dev} node"

    sp = cfg.actor.ulysses_sequence_parallel_size
    groups = f", training in Ulysses groups of {sp} (actor.ulysses_sequence_parallel_size)" if sp > 1 else ""
    if cfg.trainer.mode == COLOCATED:
        pools = [("colocated", cfg.total_workers, where(res.trainer.node_resource) + groups)]
    else:
        pools = [("generator", res.generator.workers, where(res.generator.node_resource)),
                 ("trainer", res.trainer.workers, where(res.trainer.node_resource) + groups)]
    if res.reward.workers and cfg.reward.served.model_path:
        pools.append((JUDGE_POOL, res.reward.workers, where(res.reward.node_resource)))
    sched = cfg.schedule_config(steps=3)
    part = sched.make_partition(res.generator.workers)
    k = cfg.trained_steps()
    predicted, colocated, hetero, top, subsets, notes, separate, fits = None, {}, False, None, {}, [], None, {}
    found = cluster_spec(cfg)
    if found is not None:
        from verl_digen.config.colocated_memory import baseline_memory, baseline_rows

        model, hetero, spec = found
        predicted = simulate(sched, model).step_time
        # what users run colocated, whatever this run's mode: per-timestep training (TSP is verl-digen's), as many
        # rows per pass as the same memory plan holds
        colo = replace(sched, mode=COLOCATED, partition="batch", mb_size=cfg.rollout.n, staleness=0.0,
                       policy="never", tsp_degree=1, update_units=1, rows_per_pass=None)
        fits = baseline_memory(cfg)
        caps = baseline_caps(model, colo.batch, baseline_rows(fits))
        colocated = {b: simulate(replace(colo, rows_per_pass=caps.get(b)), model, baseline=b).step_time
                     for b in BASELINES}
        if hetero:
            subsets, notes = best_subsets(model, colo, spec, subset_fits(cfg))
            separate = separate_baseline(model, Workload(prompts=cfg.data.train_batch_size, group_size=cfg.rollout.n,
                                                         steps=sched.steps, mini_batches=sched.mini_batches)).step_time
        shape = Workload(prompts=cfg.data.train_batch_size, group_size=cfg.rollout.n, steps=sched.steps,
                         tsp_degree=sched.tsp_degree, mini_batches=sched.mini_batches)
        top = ceiling(model, shape)
    return ResourcePlan(
        pools=pools, batch=cfg.batch, micro_batches=part.count, release_unit=part.unit_size, trained_steps=k,
        tsp_passes=math.ceil(k / sched.tsp_degree), predicted_step_s=predicted, predicted_colocated=colocated,
        heterogeneous=hetero, ceiling_s=top, old_log_probs=_old_log_probs(cfg), mini_batches=cfg.mini_batches(),
        best_subset=subsets, subset_notes=notes, separate_s=separate, judge=judge.plan_line(cfg),
        baseline_memory=fits,
    )


def _old_log_probs(cfg: RunConfig) -> str:
    on, why = recompute_log_prob(cfg)
    if not on:
        return f"the rollout's ({why})"
    # until the step's first optimizer step the loss pass runs on the weights the recompute would, so its
    # own log-prob is the recomputed one; later mini-batches take a forward of the kept weights (priced)
    mini = cfg.mini_batches()
    if mini == 1:
        return f"recomputed by the trainer in its loss pass, no extra forward ({why})"
    return (f"recomputed by the trainer: in its loss pass for the first of {mini} mini-batches, by a forward of "
            f"the step's weights (kept on the trainer ranks) for the others ({why})")
