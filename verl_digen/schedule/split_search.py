"""``digen plan``: search the generator/trainer split, TAG policy and staleness for a GPU budget."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .config import COLOCATED, DIGEN, ScheduleConfig
from .costs import BASELINES, IDEAL, VERL_OMNI, CostModel
from .gap import default_gap_mb_size
from .profile_io import Workload
from .simulator import SimResult, simulate


@dataclass
class PlanRow:
    generators: int
    trainers: int
    mb_size: int
    policy: str
    staleness: float
    result: SimResult

    def as_dict(self) -> dict:
        r = self.result
        return {
            "generators": self.generators,
            "trainers": self.trainers,
            "mb_size": self.mb_size,
            "policy": self.policy,
            "staleness": self.staleness,
            "step_time": r.step_time,
            "throughput": r.throughput,
            "fraction_of_ideal": r.fraction_of_ideal,
        }


def search(
    model: CostModel,
    workload: Workload,
    total: int,
    policies: tuple[str, ...] = ("never", "adaptive", "bts"),
    stalenesses: tuple[float, ...] | None = None,
    min_trainers: int = 1,
    fixed_split: bool = False,
    progress: Callable[[str], object] | None = None,
) -> list[PlanRow]:
    """Every split G + R = total (R >= min_trainers), each TAG policy and staleness; best first.

    ``fixed_split``: the pools are given by the hardware (a heterogeneous cluster: moving a GPU from
    one pool to the other would be another cluster), so only the schedule is searched.
    """
    if total < 2:
        raise ValueError(f"a disaggregated run needs at least 2 GPUs, got {total}")
    if fixed_split and total != model.total_workers:
        raise ValueError(f"the pools of this cluster are fixed by its hardware ({model.generator.workers} + "
                         f"{model.trainer.workers} GPUs); --gpus {total} would be another cluster")
    if stalenesses is None:
        stalenesses = tuple(sorted({0.0, workload.staleness}))
    rows: list[PlanRow] = []
    n = workload.group_size
    splits = [model.generator.workers] if fixed_split else range(1, total - min_trainers + 1)
    for g in splits:
        if progress is not None:
            progress(f"split {g} generate + {total - g} train")
        m = model if fixed_split else model.with_workers(g, total - g)
        mbs = sorted({workload.mb_size, default_gap_mb_size(n, g)})
        for mb in mbs:
            base = ScheduleConfig(prompts=workload.prompts, group_size=n, mb_size=mb, steps=workload.steps,
                                  mode=DIGEN, tsp_degree=workload.tsp_degree)
            for pol in policies:
                for st in stalenesses:
                    cfg = replace(base, policy=pol, staleness=st)
                    rows.append(PlanRow(g, total - g, mb, pol, st, simulate(cfg, m)))
    rows.sort(key=lambda r: r.result.step_time)
    return rows


def colocated_baselines(model: CostModel, workload: Workload) -> dict[str, SimResult]:
    """Every colocated baseline (costs.BASELINES) on all the cluster's GPUs, per-timestep training."""
    cfg = ScheduleConfig(prompts=workload.prompts, group_size=workload.group_size, mb_size=workload.group_size,
                         steps=workload.steps, mode=COLOCATED, partition="batch")
    return {b: simulate(cfg, model, label=f"colocated:{b}", baseline=b) for b in BASELINES}


def verdict(best: PlanRow, colocated: dict[str, SimResult], model: CostModel, against: str = VERL_OMNI) -> list[str]:
    """Plain-language recommendation: digen's best split or colocated, and the reason in numbers."""
    r = best.result
    base = colocated[against]
    lines = []
    if r.step_time < base.step_time:
        lines.append(f"recommendation: digen, {best.generators} generate + {best.trainers} train, "
                     f"{best.policy}, staleness {best.staleness:g}: {base.step_time / r.step_time:.2f}x "
                     f"colocated:{against}")
    else:
        lines.append(f"recommendation: stay colocated: colocated:{against} is {r.step_time / base.step_time:.2f}x "
                     "faster than digen's best split")
    ideal = colocated[IDEAL].step_time
    if base.step_time > r.step_time > ideal:
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
    if (row.generators, row.trainers) == (model.generator.workers, model.trainer.workers):
        return model
    return model.with_workers(row.generators, row.trainers)
