"""``digen plan``: search the generator/trainer split, TAG policy and staleness for a GPU budget."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .config import DIGEN, ScheduleConfig
from .costs import CostModel
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
) -> list[PlanRow]:
    """Every split G + R = total (R >= min_trainers), each TAG policy and staleness; best first."""
    if total < 2:
        raise ValueError(f"a disaggregated run needs at least 2 GPUs, got {total}")
    if stalenesses is None:
        stalenesses = tuple(sorted({0.0, workload.staleness}))
    rows: list[PlanRow] = []
    n = workload.group_size
    for g in range(1, total - min_trainers + 1):
        m = model.with_workers(g, total - g)
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
