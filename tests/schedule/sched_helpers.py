"""Random instances shared by the scheduling tests (fixed seeds; no hypothesis needed)."""

from __future__ import annotations

import random

from verl_digen.schedule.config import ScheduleConfig
from verl_digen.schedule.costs import StageCosts


def random_costs(rng: random.Random, ties: bool = False, sync: bool = True) -> StageCosts:
    """Random stage costs; ``ties`` draws from a coarse grid so simultaneous events are common."""
    if ties:
        pick = lambda lo, hi: rng.choice([x / 4 for x in range(int(lo * 4), int(hi * 4) + 1)])  # noqa: E731
    else:
        pick = rng.uniform
    return StageCosts(
        generate=pick(0.25, 2.0),
        tag_generate=pick(0.25, 3.0),
        score=pick(0.0, 0.5),
        update=pick(0.25, 2.0) if ties else rng.choice([pick(0.02, 0.3), pick(0.1, 2.0)]),
        switch_to_gen=rng.choice([0.0, pick(0.0, 0.5)]),
        switch_to_train=rng.choice([0.0, pick(0.0, 0.5)]),
        optimizer_step=pick(0.0, 0.5),
        weight_sync=pick(0.0, 0.5) if sync else 0.0,
    )


def random_config(rng: random.Random, max_mb: int = 10, steps: int = 1, policy: str = "never",
                  staleness: float = 0.0) -> ScheduleConfig:
    """A GAP config with at most ``max_mb`` micro-batches per step."""
    while True:
        n = rng.choice([1, 2, 3, 4])
        prompts = rng.randint(1, max(1, max_mb // n))
        m = rng.choice([d for d in range(1, n + 1) if n % d == 0])
        if prompts * n // m <= max_mb:
            return ScheduleConfig(prompts=prompts, group_size=n, mb_size=m, steps=steps, policy=policy,
                                  staleness=staleness, update=rng.choice(["unit", "micro_batch"]))
