"""Simulation: a :class:`StepScheduler` (or the colocated baseline) run by the one executor loop
(:func:`.executor.run`) on the virtual-clock backend under a cost model.

Durations come from the *true* cost model, optionally with multiplicative log-normal noise; the
scheduler only sees them through its profiler, exactly as it would at run time. Every simulated
timeline is checked against the scheduling invariants (the planner skips the check while it searches and
checks the rows it returns).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

from .bounds import Bounds, pool_busy, step_bounds, throughput
from .bts import SolveLog
from .colocated import ColocatedScheduler, colocated_costs
from .config import COLOCATED, DIGEN, PER_SAMPLE, SEPARATE, ScheduleConfig
from .costs import BASELINES, IDEAL, CostModel, StageCosts
from .executor import SimBackend, run
from .gap import spread_mb_size
from .policies import parse_policy
from .profiler import Profiler
from .scheduler import Decision, StepScheduler
from .timeline import TRAINER, Timeline, gen_worker


@dataclass
class SimResult:
    label: str
    config: ScheduleConfig
    timeline: Timeline
    makespan: float
    step_time: float
    throughput: float
    total_gpus: int
    bounds: Bounds | None
    busy: dict[str, float]
    stage_costs: StageCosts | None = None
    decisions: list[Decision] = field(default_factory=list)
    bts_solves: SolveLog | None = None  # BTS runs: its solves (count, slowest, the last ones)
    baseline: str | None = None  # colocated rows: which baseline (costs.BASELINES)

    @property
    def fraction_of_ideal(self) -> float | None:
        return None if self.bounds is None else self.bounds.ideal / self.step_time

    @property
    def bts_predicted(self) -> list[float]:
        """Per step, the optimizer-step end BTS predicted at the step's first solve (absolute time)."""
        out: dict[int, float] = {}
        for d in self.decisions:
            if d.predicted_end is not None and d.step not in out:
                out[d.step] = d.predicted_end
        return [out[s] for s in sorted(out)]

    def row(self) -> dict:
        return {
            "label": self.label,
            "mode": self.config.mode,
            "policy": self.config.policy if self.config.mode == DIGEN else None,
            "baseline": self.baseline,
            "step_time": self.step_time,
            "throughput": self.throughput,
            "fraction_of_ideal": self.fraction_of_ideal,
            "ideal": None if self.bounds is None else self.bounds.ideal,
            "generator_busy": self.busy["generator"],
            "trainer_busy": self.busy["trainer"],
        }


def execute(sched: StepScheduler, true_costs: StageCosts, noise: float = 0.0, seed: int = 0,
            check: bool = True, contention: dict[str, float] | None = None,
            beside: dict[tuple[str, str], float] | None = None) -> Timeline:
    """Run ``sched`` to completion on a virtual clock; returns its (checked) timeline. ``contention``, ``beside``:
    the cost model's host contention (all processes on one host, ``CostModel.shared_host``)."""
    return run(sched, SimBackend(true_costs, noise, seed, contention=contention, beside=beside,
                                 processes=_processes(sched.timeline.trainer_ranks)), check=check)


def _processes(trainer_ranks: int):
    """Processes an action keeps busy: the trainer unit is every trainer rank, any other worker one."""
    return lambda a: sum(trainer_ranks if w == TRAINER else 1 for w in a.workers)


def simulate(
    config: ScheduleConfig,
    model: CostModel,
    label: str | None = None,
    noise: float = 0.0,
    seed: int = 0,
    warmup: int = 1,
    policy=None,
    baseline: str = IDEAL,
    check: bool = True,
) -> SimResult:
    """Simulate ``config`` on the cluster ``model`` (any mode; ``baseline`` picks the colocated one).
    ``check=False`` skips ``check_timeline`` (half a large run's cost): for the planner, which checks the
    rows it returns."""
    if config.mode == COLOCATED:
        return simulate_colocated(config, model, label, baseline, check)
    G = model.generator.workers
    costs = config.stage_costs(model, G)
    pol = parse_policy(policy if policy is not None else config.policy)
    R = model.trainer.workers
    sched = StepScheduler(config, costs, G, pol, Profiler(costs, warmup=warmup), trainer_ranks=R)
    tl = execute(sched, costs, noise, seed, check, **model.shared_host())
    span = tl.makespan
    bounds = step_bounds(costs, sched.M, G, config.steps, sched.unit_size, sched.update_size, R,
                         synchronous=sched.stale_budget == 0, mini_batches=config.mini_batches)
    return SimResult(
        label=label or describe(config),
        config=config,
        timeline=tl,
        makespan=span,
        step_time=span / config.steps,
        throughput=throughput(config.batch * config.steps, span, model.total_workers),
        total_gpus=model.total_workers,
        bounds=bounds,
        busy=pool_busy(tl),
        stage_costs=costs,
        decisions=list(sched.decisions),
        bts_solves=getattr(pol, "solves", None),
    )


def simulate_colocated(config: ScheduleConfig, model: CostModel, label: str | None = None,
                       baseline: str = IDEAL, check: bool = True) -> SimResult:
    """Every GPU of both pools generates its share, scores it, then all train data-parallel."""
    costs = config.with_behaviour_forward(
        colocated_costs(model, config.batch, config.tsp_degree, baseline, config.mini_batches,
                        config.rows_per_pass), model)
    workers = [gen_worker(i) for i in range(model.generator.workers)] + [TRAINER]
    tl = run(ColocatedScheduler(config, workers),
             SimBackend(costs, **model.shared_host(), processes=_processes(model.trainer.workers)),
             check=check)
    span = tl.makespan
    return SimResult(
        label=label or f"colocated:{baseline}",
        config=config,
        timeline=tl,
        makespan=span,
        step_time=span / config.steps,
        throughput=throughput(config.batch * config.steps, span, model.total_workers),
        total_gpus=model.total_workers,
        bounds=None,
        busy=pool_busy(tl),
        stage_costs=costs,
        baseline=baseline,
    )


def describe(config: ScheduleConfig) -> str:
    if config.mode != DIGEN:
        return config.mode
    parts = [f"digen {config.partition} m={config.mb_size}"]
    if config.tsp_degree > 1:
        parts.append(f"tsp={config.tsp_degree}")
    parts.append(str(parse_policy(config.policy)))
    if config.staleness:
        parts.append(f"tcss={config.staleness:g}")
    return " ".join(parts)


class Rung(NamedTuple):
    """One row of the ablation ladder: a configuration (and, for colocated rows, which baseline)."""

    label: str
    config: ScheduleConfig
    baseline: str = IDEAL


def ablation_configs(base: ScheduleConfig, gap_mb: int, tsp_degree: int, policy: str = "bts",
                     staleness: float = 0.25, generators: int | None = None) -> list[Rung]:
    """The paper's ladder: the colocated baselines, naive disaggregation, +GAP, +TSP, +TAG, +TCSS.

    Naive disaggregation spreads the batch over the ``generators`` (whole prompts per generator when
    not given) and trains it after the last sample is scored, as one update, with the upstream
    scripts' training loop (one sample per pass); +GAP pipelines that; +TSP is verl-digen's trainer
    (an update's samples and ``tsp_degree`` timesteps share each pass).
    """
    common = dict(prompts=base.prompts, group_size=base.group_size, steps=base.steps)
    colo = ScheduleConfig(mb_size=base.group_size, mode=COLOCATED, partition="batch", **common)
    if generators is None:
        naive = ScheduleConfig(mb_size=base.group_size, mode=SEPARATE, partition="batch", train_loop=PER_SAMPLE,
                               **common)
    else:
        spread = spread_mb_size(base.prompts, base.group_size, generators)
        naive = ScheduleConfig(mb_size=spread, mode=SEPARATE, partition="gap", train_loop=PER_SAMPLE, **common)
    gap = ScheduleConfig(mb_size=gap_mb, mode=DIGEN, partition="gap", train_loop=PER_SAMPLE, **common)
    tsp = replace(gap, tsp_degree=tsp_degree, train_loop=base.train_loop)
    tag = replace(tsp, policy=policy)
    tcss = replace(tag, staleness=staleness)
    rows = [Rung(f"colocated:{b}", colo, b) for b in BASELINES]
    rows += [Rung("naive (separate)", naive), Rung("+GAP", gap), Rung("+TSP", tsp), Rung(f"+TAG ({policy})", tag)]
    if staleness > 0:
        rows.append(Rung(f"+TCSS ({staleness:g})", tcss))
    return rows


def run_ablation(base: ScheduleConfig, model: CostModel, gap_mb: int, tsp_degree: int,
                 policy: str = "bts", staleness: float = 0.25) -> list[SimResult]:
    rungs = ablation_configs(base, gap_mb, tsp_degree, policy, staleness, model.generator.workers)
    return [simulate(r.config, model, label=r.label, baseline=r.baseline) for r in rungs]
