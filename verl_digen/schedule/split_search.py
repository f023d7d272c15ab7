"""``digen plan``: the joint search over how to run one workload on a GPU budget.

A configuration is a split (generator + trainer GPUs), a micro-batch size, a TSP degree, the rows per
trainer rank per pass (bounded by memory), the update granularity (release units per update), a TCSS
staleness and a TAG policy. Every candidate is priced first by its lower bounds (``bounds.step_bounds``
and ``bounds.tag_wave_area``, which no schedule of it can beat, any policy and staleness included); candidates
are simulated
cheapest bound first, and the search stops once the next bound is no better than the ``keep``-th best
simulated step, so the rows it returns are exactly the best ``keep`` of the whole space (beyond
``EXACT_SPLITS`` GPUs the splits are a refined grid, ``split_grid``, and no longer exhaustive).

Memory enters through ``row_cap``: the caller (``config.planning``, which has the run config and its
memory plan) says how many rows per rank per pass fit for a trainer pool size, micro-batch size and
TAG on or off. Without it (a bare preset or profile) rows per pass are unbounded.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace

from .bounds import step_bounds, tag_wave_area
from .config import COLOCATED, DIGEN, SEPARATE, ScheduleConfig, ScheduleConfigError, stale_budget
from .costs import BASELINES, IDEAL, NATIVE, VERL_OMNI, VERL_OMNI_BYPASS, CostModel, Pool
from .gap import default_gap_mb_size, spread_mb_size
from .presets import PresetSpec
from .profile_io import Workload
from .rows import row_plan
from .simulator import SimResult, simulate
from .timeline import check_timeline

DEFAULT_POLICIES = ("never", "adaptive", "bts")
MAX_UPDATE_UNITS = 8  # beyond this the first update of a step waits for most of the batch
# Splits on a large budget: every split up to EXACT_SPLITS GPUs (1,024 GPUs: 344,784 candidates priced in ~10 s,
# ~370 simulated); beyond, a grid (every split within FINE_EDGE GPUs of either end, geometric steps of SPLIT_RATIO
# between) refined around the best splits found, which is no longer exact (it found the exact plan at 1,024).
EXACT_SPLITS = 1024
FINE_EDGE = 8
SPLIT_RATIO = 1.25
REFINE_SPLITS = 3

#: (trainer GPUs, micro-batch size, TAG on) -> the most (sample x step) rows per trainer rank per pass that
#: fit in memory; 0: this trainer pool or micro-batch size does not fit at all; None: not known (no limit)
RowCap = Callable[[int, int, bool], "int | None"]


@dataclass
class PlanRow:
    generators: int
    trainers: int
    mb_size: int
    policy: str
    staleness: float
    result: SimResult
    tsp_degree: int = 1
    update_units: int = 1
    rows_per_pass: int | None = None  # None: what the TSP degree gives (no memory limit known or needed)
    mode: str = DIGEN  # COLOCATED: this runtime's ``trainer=colocated`` on every GPU (generators 0)

    def as_dict(self) -> dict:
        r = self.result
        return {
            "mode": self.mode,
            "generators": self.generators,
            "trainers": self.trainers,
            "mb_size": self.mb_size,
            "policy": self.policy,
            "staleness": self.staleness,
            "tsp_degree": self.tsp_degree,
            "update_units": self.update_units,
            "rows_per_pass": self.rows_per_pass,
            "step_time": r.step_time,
            "throughput": r.throughput,
            "fraction_of_ideal": r.fraction_of_ideal,
        }


@dataclass
class Plan:
    """The search's best rows (fastest first) and how much of the space it had to simulate."""

    rows: list[PlanRow]
    candidates: int = 0  # configurations priced by their bounds
    simulated: int = 0
    unfit: int = 0  # configurations the memory cap ruled out
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> PlanRow:
        if not self.rows:
            raise ValueError("no configuration fits: " + "; ".join(self.notes or ["the search space is empty"]))
        return self.rows[0]


def on_budget(model: CostModel, total: int) -> CostModel:
    """``model`` resized to ``total`` GPUs split evenly (the cluster the colocated baselines run on for a
    ``--gpus`` budget); ``model`` itself when it already has that many."""
    if total == model.total_workers:
        return model
    half = max(1, total // 2)
    return model.with_workers(half, total - half)


def mb_sizes_for(workload: Workload, generators: int) -> list[int]:
    """Micro-batch sizes worth trying: the workload's, GAP's default for ``generators``, the group size's
    divisors from 2 up and twice the group (1-sample micro-batches only when the group is that small)."""
    n, batch = workload.group_size, workload.prompts * workload.group_size
    sizes = {workload.mb_size, default_gap_mb_size(n, generators), 2 * n}
    sizes.update(d for d in range(2, n + 1) if n % d == 0)
    return sorted(s for s in sizes if s <= batch and batch % s == 0 and (n % s == 0 or s % n == 0))


def tsp_degrees_for(workload: Workload, trained_steps: int) -> list[int]:
    """TSP degrees worth trying: 1 (per-timestep passes), the workload's, 2, 4, K/2 and K."""
    k = trained_steps
    return sorted({d for d in (1, 2, 4, k // 2, k, min(workload.tsp_degree, k)) if 1 <= d <= k})


def update_units_for(config: ScheduleConfig, generators: int, limit: int = MAX_UPDATE_UNITS) -> list[int]:
    """Release units per update that divide a mini-batch's units (a step's, with one), up to ``limit``."""
    units = config.micro_batches // config.unit_size // config.mini_batches
    return [u for u in range(1, min(units, limit) + 1) if units % u == 0]


def _rows_per_pass(model: CostModel, config: ScheduleConfig, generators: int, cap: int) -> int:
    """The rows per rank per pass a memory ``cap`` leaves: what the TSP degree gives, at most ``cap``."""
    samples = config.mb_size * config.update_size(config.unit_size)
    kept = max(1, math.ceil(samples * model.keep_fraction - 1e-9))
    natural = row_plan(kept, model.steps_trained, model.data_parallel(model.trainer.workers), config.tsp_degree).cap
    return min(natural, cap)


def search(
    model: CostModel,
    workload: Workload,
    total: int,
    policies: tuple[str, ...] = DEFAULT_POLICIES,
    stalenesses: tuple[float, ...] | None = None,
    min_trainers: int = 1,
    fixed_split: bool = False,
    progress: Callable[[str], object] | None = None,
    *,
    mb_sizes: Iterable[int] | None = None,
    tsp_degrees: Iterable[int] | None = None,
    update_units: Iterable[int] | None = None,
    row_cap: RowCap | None = None,
    keep: int | None = 10,
    colocated: bool = True,
    colocated_cap: int | None = None,
) -> Plan:
    """The best ``keep`` configurations of ``workload`` on ``total`` GPUs (``None``: simulate them all).

    ``mb_sizes`` / ``tsp_degrees`` / ``update_units``: the values to try (default: ``mb_sizes_for``,
    ``tsp_degrees_for``, ``update_units_for``). ``fixed_split``: the pools are given by the hardware (a
    heterogeneous cluster: moving a GPU from one pool to the other would be another cluster), so only
    the schedule is searched. ``stalenesses`` default to 0 and the workload's.

    ``colocated``: also the colocated layout (zero dedicated generators: ``trainer=colocated`` on all ``total``
    GPUs, each TSP degree), priced as this runtime runs it (colocated:ideal, no engine, no recompute pass)
    with ``colocated_cap`` rows per rank per pass at most (0: it does not fit; None: not known). They are
    simulated first, so the disaggregated candidates must beat them to be simulated at all.
    """
    _check_search(model, total, fixed_split, keep)
    if stalenesses is None:
        stalenesses = tuple(sorted({0.0, workload.staleness}))
    say = progress or (lambda _msg: None)
    plan = Plan(rows=[])
    space = _Space(model, workload, total, policies, stalenesses, fixed_split, mb_sizes, tsp_degrees,
                   update_units, row_cap)
    coarse = not fixed_split and total > EXACT_SPLITS
    grid = [model.generator.workers] if fixed_split else split_grid(total, min_trainers, coarse)
    cands = space.price(grid, plan)
    say(f"{len(cands)} configurations priced by their lower bounds" + (f" on {len(grid)} of the "
        f"{total - min_trainers} splits" if coarse else "") + "; simulating from the cheapest")
    best: list[float] = []  # max-heap (negated) of the keep best step times
    if colocated:
        _add_colocated(on_budget(model, total) if not fixed_split else model, workload, total, colocated_cap,
                       plan, best, keep)
    _simulate_cheapest(cands, space, plan, best, keep, say)
    refined = _refine_near_best(space, grid, plan, best, keep, say) if coarse else 0
    _finish(plan, len(cands) + refined, keep, say)
    return plan


def _check_search(model: CostModel, total: int, fixed_split: bool, keep: int | None) -> None:
    """Refuse a search with nothing to split, a fixed cluster asked for another GPU count, or nothing to keep."""
    if total < 2:
        raise ValueError(f"a disaggregated run needs at least 2 GPUs, got {total}")
    if fixed_split and total != model.total_workers:
        raise ValueError(f"the pools of this cluster are fixed by its hardware ({model.generator.workers} + "
                         f"{model.trainer.workers} GPUs); --gpus {total} would be another cluster")
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be >= 1 (or None for every configuration), got {keep}")


def _add_colocated(model: CostModel, workload: Workload, total: int, cap: int | None, plan: Plan,
                   best: list[float], keep: int | None) -> None:
    """The colocated rows, simulated before any split, so that a split must beat them to be simulated at all."""
    colo = _colocated_rows(model, workload, total, cap, plan)
    for row in colo:
        _keep_best(best, row.result.step_time, keep)
    plan.rows += colo
    plan.simulated += len(colo)


def _refine_near_best(space: _Space, grid: list[int], plan: Plan, best: list[float], keep: int | None,
                      say: Callable[[str], object]) -> int:
    """After a coarse grid: every split between the grid points around each kept row's split, searched the
    same way; returns how many configurations it priced."""
    total = space.total
    near = sorted({g for top in _best_splits(plan.rows, keep) for g in _between(grid, top)} - set(grid))
    more = space.price(near, plan)
    say(f"refining {len(near)} splits near the best: {len(more)} more configurations")
    _simulate_cheapest(more, space, plan, best, keep, say)
    plan.notes.append(f"{total} GPUs: splits searched on a grid of {len(grid)} and refined over {len(near)} "
                      "splits around the best (every split up to "
                      f"{EXACT_SPLITS} GPUs)")
    return len(more)


def _finish(plan: Plan, priced: int, keep: int | None, say: Callable[[str], object]) -> None:
    """Count the candidates (``priced`` splits' and the colocated rows) and keep the best ``keep`` rows, ranked;
    the search simulates unchecked, so what it returns is checked here against every timeline invariant."""
    plan.candidates = priced + sum(r.mode == COLOCATED for r in plan.rows)
    if plan.unfit:
        plan.notes.append(f"{plan.unfit} configuration(s) do not fit the GPUs' memory")
    plan.rows.sort(key=_rank)
    if keep is not None:
        plan.rows = plan.rows[:keep]
    for row in plan.rows:
        check_timeline(row.result.timeline, row.staleness)
    say(f"simulated {plan.simulated} of {plan.candidates}; the rest cannot beat the best {keep or plan.candidates}")


def split_grid(total: int, min_trainers: int = 1, coarse: bool = False) -> list[int]:
    """Generator counts to search on ``total`` GPUs: every split, or (``coarse``) every split within
    ``FINE_EDGE`` GPUs of either end and geometric steps of ``SPLIT_RATIO`` in between (the step time varies
    slowly with the split there, and the search refines around the best, ``_between``)."""
    top = total - min_trainers
    if not coarse:
        return list(range(1, top + 1))
    out: set[int] = set()
    x = 1.0
    while x <= total:  # generators and trainers alike: fine near each end, coarse in the middle
        k = int(round(x))
        out.update((k, total - k))
        x = x + 1 if x < FINE_EDGE else x * SPLIT_RATIO
    return sorted(g for g in out if 1 <= g <= top)


def _between(grid: list[int], g: int) -> range:
    """The splits strictly between ``g``'s neighbours on ``grid`` (``g`` on it)."""
    i = grid.index(g) if g in grid else max(0, min(len(grid) - 1, sum(x < g for x in grid)))
    lo = grid[i - 1] if i > 0 else grid[0]
    hi = grid[i + 1] if i + 1 < len(grid) else grid[-1]
    return range(lo + 1, hi)


def _best_splits(rows: list[PlanRow], keep: int | None) -> list[int]:
    """The generator counts of the best rows so far: at least ``REFINE_SPLITS`` distinct ones (the step time
    over the split is not unimodal, so the best grid point need not neighbour the best split), and every
    split of the best ``keep`` rows."""
    out: list[int] = []
    for i, row in enumerate(sorted(rows, key=_rank)):
        if len(out) >= REFINE_SPLITS and (keep is None or i >= keep):
            break
        if row.generators not in out:
            out.append(row.generators)
    return out


def _simulate_cheapest(cands: list[tuple[float, int, int, ScheduleConfig]], space: _Space, plan: Plan,
                       best: list[float], keep: int | None, say: Callable[[str], object]) -> None:
    """Simulate ``cands`` cheapest bound first into ``plan.rows`` until no remaining bound can enter the best
    ``keep`` (``best``: the max-heap, negated, of the best step times so far, shared across calls)."""
    cands.sort()
    for bound, _, g, cfg in cands:
        if keep is not None and len(best) >= keep and bound >= -best[0] * (1 - 1e-12):
            break  # no remaining configuration can enter the best ``keep``
        res = simulate(cfg, space.models[g], check=False)
        plan.simulated += 1
        plan.rows.append(PlanRow(g, space.total - g, cfg.mb_size, cfg.policy, cfg.staleness, res, cfg.tsp_degree,
                                 cfg.update_units, cfg.rows_per_pass))
        _keep_best(best, res.step_time, keep)
        if plan.simulated % 50 == 0:
            say(f"simulated {plan.simulated} (best {-max(best):.2f} s/step, next bound {bound:.2f} s)")


def _keep_best(best: list[float], step_time: float, keep: int | None) -> None:
    heapq.heappush(best, -step_time)
    if keep is not None and len(best) > keep:
        heapq.heappop(best)


def _colocated_rows(model: CostModel, workload: Workload, total: int, cap: int | None, plan: Plan) -> list[PlanRow]:
    """The colocated layout on ``total`` GPUs, one row per TSP degree worth trying, as ``trainer=colocated`` runs
    it (what the runtime accepts: the batch split evenly over every GPU, whole Ulysses groups, a memory cap)."""
    batch, sp = workload.prompts * workload.group_size, model.sequence_parallel
    if cap == 0:
        plan.notes.append(f"colocated on all {total} GPUs does not fit their memory")
        return []
    if batch % total or total % sp:
        plan.notes.append(f"colocated not searched: the batch ({batch} samples) must split evenly over all {total} "
                          f"GPUs{f' in Ulysses groups of {sp}' if sp > 1 else ''}")
        return []
    rows, seen = [], set()
    K = model.steps_trained
    for d in sorted(tsp_degrees_for(workload, K), reverse=True):
        kept = max(1, math.ceil(batch * model.keep_fraction - 1e-9))
        natural = row_plan(kept, K, model.data_parallel(total), d).cap
        rpp = None if cap is None or cap >= natural else cap
        cfg = replace(baseline_config(workload), tsp_degree=d, rows_per_pass=rpp, recompute=workload.recompute,
                      row_forwards=workload.row_forwards)
        res = simulate(cfg, model, label="colocated", check=False)
        if round(res.step_time, 9) in seen:
            continue  # a degree that runs the same passes
        seen.add(round(res.step_time, 9))
        rows.append(PlanRow(0, total, cfg.mb_size, "never", 0.0, res, d, 1, rpp, mode=COLOCATED))
    return rows


@dataclass
class _Space:
    """The search space of one ``search`` call: prices a list of splits' configurations by their bounds."""

    model: CostModel
    workload: Workload
    total: int
    policies: tuple[str, ...]
    stalenesses: tuple[float, ...]
    fixed_split: bool
    mb_sizes: Iterable[int] | None
    tsp_degrees: Iterable[int] | None
    update_units: Iterable[int] | None
    row_cap: RowCap | None
    models: dict[int, CostModel] = field(default_factory=dict)
    _seq: int = 0

    def price(self, splits: Iterable[int], plan: Plan) -> list[tuple[float, int, int, ScheduleConfig]]:
        """(lower bound, tie-break, generators, configuration) of every configuration on ``splits``."""
        model, workload, total = self.model, self.workload, self.total
        tsps = sorted(set(self.tsp_degrees) if self.tsp_degrees is not None
                      else tsp_degrees_for(workload, model.steps_trained), reverse=True)
        tags = sorted({p != "never" for p in self.policies})
        cands: list[tuple[float, int, int, ScheduleConfig]] = []
        for g in splits:
            m = self.models[g] = model if self.fixed_split else model.with_workers(g, total - g)
            if m.trainer.workers % m.sequence_parallel:
                continue  # the trainer pool must split into whole Ulysses groups
            for mb in (sorted(set(self.mb_sizes)) if self.mb_sizes is not None else mb_sizes_for(workload, g)):
                shape = self._shape(g, mb)
                if shape is None:
                    continue
                units = update_units_for(shape, g)
                if self.update_units is not None:
                    units = [u for u in units if u in set(self.update_units)]
                for tag in tags:
                    cands += self._price_shape(m, g, shape, units, tsps, tag, plan)
        return cands

    def _shape(self, g: int, mb: int) -> ScheduleConfig | None:
        """The step cut into micro-batches of ``mb`` samples, None where this batch cannot have that layout
        or a mini-batch would not be whole release units on ``g`` generators."""
        w = self.workload
        try:
            shape = ScheduleConfig(prompts=w.prompts, group_size=w.group_size, mb_size=mb, steps=w.steps,
                                   mode=DIGEN, mini_batches=w.mini_batches, recompute=w.recompute,
                                   row_forwards=w.row_forwards)
            shape.check_update_units(g)  # a mini-batch of whole release units
        except ScheduleConfigError:
            return None
        return shape

    def _price_shape(self, m: CostModel, g: int, shape: ScheduleConfig, units: list[int], tsps: list[int],
                     tag: bool, plan: Plan) -> list[tuple[float, int, int, ScheduleConfig]]:
        """The lower bound of every update size, TSP degree, staleness and policy on one layout, with TAG or
        without; one that cannot fit a single row per pass is counted unfit and not priced."""
        K, r, unit = self.model.steps_trained, m.trainer.workers, shape.unit_size
        cap = self.row_cap(r, shape.mb_size, tag) if self.row_cap else None
        mine = [p for p in self.policies if (p != "never") == tag]
        if cap == 0:
            plan.unfit += len(units) * len(tsps) * len(self.stalenesses) * len(mine)
            return []
        cands: list[tuple[float, int, int, ScheduleConfig]] = []
        for u in units:
            seen: set[float] = set()  # TSP degrees that give the same rows per pass cost the same
            for tsp in tsps:
                cfg = replace(shape, tsp_degree=min(tsp, K), update_units=u)
                if cap is not None:
                    cfg = replace(cfg, rows_per_pass=_rows_per_pass(m, cfg, g, cap))
                costs = cfg.stage_costs(m, g)
                if costs.update in seen:
                    continue
                seen.add(costs.update)
                for st in self.stalenesses:
                    sync = stale_budget(st, cfg.micro_batches) == 0
                    bound = max(step_bounds(costs, cfg.micro_batches, g, cfg.steps, unit * u,
                                            cfg.update_size(unit), r, synchronous=sync,
                                            mini_batches=cfg.mini_batches).ideal,
                                tag_wave_area(costs, cfg.micro_batches, g, cfg.steps,
                                              cfg.update_size(unit), r, synchronous=sync,
                                              mini_batches=cfg.mini_batches, tag=tag))
                    for pol in mine:
                        self._seq += 1
                        cands.append((bound, self._seq, g, replace(cfg, staleness=st, policy=pol)))
        return cands


#: among equal steps, the policy preferred: no TAG, then BTS, whose placement follows the workload, then the
#: adaptive threshold, which ties BTS where it was planned and falls 1.9-2.1x behind it at 2-4x the batch or
#: half the GPUs (bench/tag_policy_scaling.py)
TIE_ORDER = ("never", "bts", "adaptive")


def _rank(row: PlanRow) -> tuple:
    """Fastest first; among equal steps the simpler run: on-policy, smaller updates, fewer rows per pass
    (less memory), then the policy by :data:`TIE_ORDER`."""
    order = {p: i for i, p in enumerate(TIE_ORDER)}
    return (round(row.result.step_time, 6), row.staleness, row.update_units, row.rows_per_pass or 0,
            order.get(row.policy, len(order)), -row.tsp_degree)


def baseline_config(workload: Workload) -> ScheduleConfig:
    """The colocated baselines' schedule for ``workload``: the whole batch, per-timestep training."""
    return ScheduleConfig(prompts=workload.prompts, group_size=workload.group_size, mb_size=workload.group_size,
                          steps=workload.steps, mode=COLOCATED, partition="batch",
                          mini_batches=workload.mini_batches, row_forwards=workload.row_forwards)


def colocated_baselines(model: CostModel, workload: Workload,
                        rows: dict[str, int | None] | None = None) -> dict[str, SimResult]:
    """Every colocated baseline (costs.BASELINES) on all the cluster's GPUs, per-timestep training; ``rows``:
    per baseline, the most rows per rank per pass its memory holds (the memory plan's; none or 0: not capped)."""
    cfg = baseline_config(workload)
    caps = baseline_caps(model, cfg.batch, rows)
    return {b: simulate(replace(cfg, rows_per_pass=caps.get(b)), model, label=f"colocated:{b}", baseline=b)
            for b in BASELINES}


def baseline_caps(model: CostModel, batch: int, rows: dict[str, int | None] | None) -> dict[str, int | None]:
    """The baselines' memory caps (baseline -> rows per rank per pass; None or 0: none) as ``rows_per_pass`` of
    their per-timestep runs: a cap splits a timestep's pass where memory holds fewer rows, never packs more."""
    per_step = max(model._pass_rows(batch, 1, model.total_workers), default=1)
    return {b: min(c, per_step) if c else None for b, c in (rows or {}).items()}


# -- verl-omni's synchronous separate mode ----------------------------------------------------------------

#: the label of :func:`separate_baseline`'s run
SEPARATE_BASELINE = "separate:verl-omni-bypass"


def separate_baseline(model: CostModel, workload: Workload) -> SimResult:
    """verl-omni's synchronous separate mode on the cluster's two pools: its rollout engine generates and scores
    the whole batch on the generator pool, the weights go over, then its trainer trains the batch on the
    trainer pool, one after the other every step. Priced in its favour: as ``bypass_mode`` (no old-log-prob
    recompute), each generator's share of the batch as one batched call where whole groups divide it (an
    engine's request batching), per-timestep training over the whole batch."""
    batch, g = workload.prompts * workload.group_size, model.generator.workers
    share = batch // g
    whole = batch % g == 0 and share % workload.group_size == 0
    mb = share if whole else spread_mb_size(workload.prompts, workload.group_size, g)
    cfg = ScheduleConfig(prompts=workload.prompts, group_size=workload.group_size, mb_size=mb, steps=workload.steps,
                         mode=SEPARATE, partition="gap", mini_batches=workload.mini_batches)
    return simulate(cfg, model, label=SEPARATE_BASELINE)


# -- the best single-type subset of a mixed cluster -------------------------------------------------------

#: the baselines priced on one pool alone: what a user of a mixed cluster would run instead of digen
SUBSET_BASELINES = (VERL_OMNI, VERL_OMNI_BYPASS, IDEAL)
POOLS = ("generator", "trainer")

#: pool ("generator" | "trainer") -> whether a colocated run on that pool's GPUs alone fits their memory
#: (None: not known, e.g. a bare preset without a run config)
SubsetFits = Callable[[str], "bool | None"]


@dataclass
class Subset:
    """A colocated baseline run on one pool's GPUs alone."""

    pool: str  # "generator" or "trainer"
    hardware: str
    gpus: int
    result: SimResult
    memory_checked: bool  # False: nothing said whether it fits (no run config), so it was not ruled out

    def describe(self) -> str:
        return f"the {self.pool} pool's {self.gpus} GPUs alone ({self.hardware})"


def pool_alone(model: CostModel, pool: str, spec: PresetSpec | None = None) -> CostModel | None:
    """The cluster cut down to ``pool``'s GPUs (both halves of the model on that hardware, so a colocated
    run shards and collects over those GPUs and their fabric only); None when the pool has one GPU (a
    cost model needs two pools). A preset (``spec``) is re-derived on that testbed; a measured profile keeps
    the pool's per-GPU costs as measured (they were measured on a pool of its own size)."""
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
    p: Pool = getattr(model, pool)
    n = p.workers
    if n < 2:
        return None
    half = n // 2
    if spec is not None:
        bed = spec.gen if pool == "generator" else spec.train
        return replace(spec, gen=bed, train=bed, gen_workers=half, train_workers=n - half).build().model
    return replace(model, generator=Pool(p.hardware, half), trainer=Pool(p.hardware, n - half), resize=None)


def best_subsets(model: CostModel, config: ScheduleConfig, spec: PresetSpec | None = None,
                 fits: SubsetFits | None = None) -> tuple[dict[str, Subset], list[str]]:
    """A mixed cluster's strongest colocated alternative: per baseline (:data:`SUBSET_BASELINES`), its
    fastest run on one pool's GPUs alone (nobody runs verl-omni on all GPUs at the slower card's pace), among
    the pools whose memory fits (``fits``; without it memory is not checked, and a note says so).
    ``config``: the colocated schedule the baselines run (``baseline_config``). Returns (baseline -> subset,
    notes on pools left out)."""
    best: dict[str, Subset] = {}
    notes: list[str] = []
    for pool in POOLS:
        alone = pool_alone(model, pool, spec)
        hw = getattr(model, pool).hardware.name
        if alone is None:
            notes.append(f"the {pool} pool ({hw}) has one GPU: no colocated run on it alone")
            continue
        ok = fits(pool) if fits is not None else None
        if ok is False:
            notes.append(f"best-subset: colocated on the {pool} pool's {getattr(model, pool).workers} GPUs alone "
                         f"({hw}) does not fit their memory")
            continue
        for b in SUBSET_BASELINES:
            res = simulate(config, alone, label=f"best-subset:{b}", baseline=b)
            if b not in best or res.step_time < best[b].result.step_time:
                best[b] = Subset(pool, hw, alone.total_workers, res, ok is not None)
    if fits is None:
        notes.append("best-subset: memory not checked (no run config)")
    return best, notes


#: ``against`` meaning "the fastest of :data:`USER_BASELINES` (and, on mixed pools, of their best subsets)"
STRONGEST = "strongest"
#: the colocated runs a user has without verl-digen (colocated:ideal is this project's own trainer=colocated: a
#: layout the planner searches, not a baseline)
USER_BASELINES = (NATIVE, VERL_OMNI, VERL_OMNI_BYPASS)


def strongest_baseline(colocated: dict[str, float], subsets: dict[str, Subset] | None = None,
                       separate: float | None = None, unfit: Collection[str] = ()) -> tuple[str, float]:
    """The fastest run a user would make instead of verl-digen, the one every ratio is stated against first:
    the upstream colocated runs on every GPU (``colocated``: baseline -> s/step) that fit their memory (``unfit``:
    the baselines the memory plan rules out on every GPU, by the rule the planner applies to its own layouts)
    and, on mixed pools, the same runs on the best single-type subset (``subsets``, :func:`best_subsets`,
    memory-checked) and verl-omni's synchronous separate mode on the two pools (``separate``, s/step of
    :func:`separate_baseline`). Returns (its label, s/step)."""
    runs = {f"colocated:{b}": colocated[b] for b in USER_BASELINES if b in colocated and b not in unfit}
    for b, s in (subsets or {}).items():
        if b in USER_BASELINES:
            runs[f"best-subset colocated:{b} on {s.describe()}"] = s.result.step_time
    if separate is not None:
        runs[SEPARATE_BASELINE] = separate
    if not runs:
        raise ValueError(f"no user baseline that fits among {sorted(colocated)} (unfit: {sorted(unfit)}): "
                         f"expected one of {USER_BASELINES}")
    label = min(runs, key=runs.get)
    return label, runs[label]


def ceiling(model: CostModel, workload: Workload) -> float:
    """The step's work spread over every GPU: colocated:ideal with the TSP degree that trains it in the
    fewest, largest passes (``tsp_degrees_for``). On one kind of GPU no schedule beats it."""
    shape = dict(prompts=workload.prompts, group_size=workload.group_size, mb_size=workload.group_size,
                 steps=workload.steps, mode=COLOCATED, partition="batch", mini_batches=workload.mini_batches)
    return min(simulate(ScheduleConfig(**shape, tsp_degree=d), model).step_time
               for d in tsp_degrees_for(workload, model.steps_trained))


def ceiling_line(step_time: float, ceiling_s: float, colocated: dict[str, SimResult], total: int,
                 heterogeneous: bool = False) -> str:
    """The physics: on one kind of GPU no schedule beats the step's total work spread over all of them
    (``ceiling``); how much of it ``step_time`` reaches, and verl-omni's. On mixed hardware a colocated
    run waits for the slower GPUs in every phase, so it bounds nothing."""
    omni = colocated[VERL_OMNI].step_time
    if heterogeneous:
        ideal = colocated[IDEAL].step_time
        return (f"ceiling: none from colocated:ideal ({ideal:.2f} s/step) on mixed hardware: a colocated run "
                f"waits for the slower GPUs in every phase, a disaggregated one gives each pool its own stage "
                f"(this plan: {ideal / step_time:.2f}x colocated:ideal)")
    return (f"ceiling: {ceiling_s:.2f} s/step (the step's work over all {total} GPUs: colocated:ideal with its "
            f"best TSP degree); this plan reaches {ceiling_s / step_time:.0%} of it, colocated:verl-omni "
            f"{ceiling_s / omni:.0%} (at most {omni / ceiling_s:.2f}x verl-omni is possible here)")


def against_baseline(colocated: dict[str, SimResult], against: str = STRONGEST,
                     subsets: dict[str, Subset] | None = None, separate: float | None = None,
                     unfit: Collection[str] = ()) -> tuple[str, float]:
    """(label, s/step) of the run a plan is compared with: ``against`` names a colocated baseline
    (costs.BASELINES; one in ``unfit`` is labelled so: it does not fit its GPUs' memory) or :data:`STRONGEST`,
    the fastest run a user has without verl-digen that fits."""
    if against == STRONGEST:
        return strongest_baseline({b: r.step_time for b, r in colocated.items()}, subsets, separate, unfit)
    note = " (does not fit its GPUs' memory)" if against in unfit else ""
    return f"colocated:{against}{note}", colocated[against].step_time


def verdict(best: PlanRow, colocated: dict[str, SimResult], model: CostModel, against: str = STRONGEST,
            subsets: dict[str, Subset] | None = None, separate: float | None = None,
            unfit: Collection[str] = ()) -> list[str]:
    """Plain-language recommendation: digen's best split or colocated, and the reason in numbers, against
    ``against`` (:func:`against_baseline`)."""
    r = best.result
    label, base_t = against_baseline(colocated, against, subsets, separate, unfit)
    lines = []
    if best.mode == COLOCATED:
        lines.append(f"recommendation: trainer=colocated on all {best.trainers} GPUs, TSP {best.tsp_degree}: "
                     f"{base_t / r.step_time:.2f}x {label}; no disaggregated split beats it here "
                     "(the step's work over every GPU, without a rollout engine or a recompute pass)")
        return lines
    if r.step_time < base_t:
        lines.append(f"recommendation: digen, {best.generators} generate + {best.trainers} train, "
                     f"{best.policy}, staleness {best.staleness:g}: {base_t / r.step_time:.2f}x {label}")
    else:
        lines.append(f"recommendation: stay colocated: {label} is {r.step_time / base_t:.2f}x faster than digen's "
                     "best split")
    ideal = colocated[IDEAL].step_time
    if IDEAL in unfit and base_t > r.step_time > ideal:
        lines.append(f"  (an idealized colocated run, {ideal:.1f} s/step, would beat digen if it fit, but it does not "
                     "fit these GPUs' memory, nor does any engine-based colocated run)")
    elif base_t > r.step_time > ideal:
        lines.append(f"  (an idealized colocated run, {ideal:.1f} s/step, would beat digen: the gain comes from "
                     "what colocated runs pay beyond the ideal, not from more compute)")
    # why: training communication over the whole cluster vs inside the trainer pool, and the bottleneck
    colo_hw = model.colocated_model().trainer.hardware.train_pass
    pool_hw = best_model(model, best).trainer.hardware.train_pass
    lines.append(f"  FSDP traffic per training pass: {colo_hw.floor:.2f} s over all {model.total_workers} GPUs "
                 f"vs {pool_hw.floor:.2f} s inside the {best.trainers}-GPU trainer pool "
                 f"(compute of a one-row pass: {colo_hw.fixed + colo_hw.per_unit:.2f} s)")
    busy_g, busy_t = r.busy["generator"], r.busy["trainer"]
    if min(busy_g, busy_t) >= 0.9:
        lines.append(f"  digen's pipeline is full (generators busy {busy_g:.0%}, trainer {busy_t:.0%}): the difference "
                     "is the work each pool does (per-pass communication, per-call overheads), not bubbles")
    elif busy_t >= 0.9 and busy_t >= busy_g:
        lines.append(f"  digen is trainer-bound (trainer busy {busy_t:.0%}, generators {busy_g:.0%}): "
                     "more trainer GPUs, a larger TSP degree or fewer trained steps help it")
    elif busy_g >= 0.9:
        lines.append(f"  digen is generator-bound (generators busy {busy_g:.0%}, trainer {busy_t:.0%}): "
                     "TAG lends the trainer's bubbles to generation")
    return lines


def best_model(model: CostModel, row: PlanRow) -> CostModel:
    if row.mode == COLOCATED:
        return model.colocated_model()
    if (row.generators, row.trainers) == (model.generator.workers, model.trainer.workers):
        return model
    return model.with_workers(row.generators, row.trainers)
