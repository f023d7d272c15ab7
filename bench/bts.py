"""BTS solve time per re-solve over B x update/generation ratio (the paper's Figure 10 grid).

Each configuration simulates one step of ``digen`` + BTS; every bubble triggers a *cold* re-solve (fresh
memo, as after a profiler update), and we report the median and max wall time of those solves.
Usage: python bench/bts.py [--json] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _grid import B_VALUES, GEN_WORKERS, RATIOS, cluster  # noqa: E402

from verl_digen.schedule.bts import BtsPolicy  # noqa: E402
from verl_digen.schedule.config import ScheduleConfig  # noqa: E402
from verl_digen.schedule.scheduler import StepScheduler  # noqa: E402
from verl_digen.schedule.simulator import execute  # noqa: E402


def run(B: int, ratio: float, steps: int) -> dict:
    model = cluster(ratio)
    costs = model.stage_costs(1)
    cfg = ScheduleConfig(prompts=B, group_size=1, mb_size=1, steps=steps)
    policy = BtsPolicy(reuse=False)
    sched = StepScheduler(cfg, costs, GEN_WORKERS, policy)
    execute(sched, costs)
    ms = [s * 1e3 for s in policy.solve_seconds]
    return {
        "B": B,
        "ratio": ratio,
        "solves": len(ms),
        "median_ms": statistics.median(ms) if ms else 0.0,
        "max_ms": max(ms) if ms else 0.0,
        "capped": bool(policy.last_stats and policy.last_stats.capped),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=1)
    args = ap.parse_args()
    rows = [run(B, r, args.steps) for B in B_VALUES for r in RATIOS]
    print(f"{'B':>4s} {'ratio':>6s} {'solves':>6s} {'median ms':>10s} {'max ms':>8s}")
    for row in rows:
        print(f"{row['B']:4d} {row['ratio']:6.2f} {row['solves']:6d} {row['median_ms']:10.2f} {row['max_ms']:8.2f}")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
