"""BTS solve time per re-solve over B x update/generation ratio (the paper's Figure 10 grid).

Each configuration simulates one step of ``digen`` + BTS; every decision point (each event that leaves
the trainer in a bubble with a free TAG slot) triggers a *cold* re-solve (fresh memo, as after a profiler
update), and we report the median wall time of those solves (of the last ``SolveLog.WINDOW``), the
slowest, how many hit BTS's work cap (their plan is the best found, not proven best) and the simulated
step time.
Usage: python bench/bts.py [--json] [--steps N] [--ranks R] [--work-cap W|none] [--fan-out F|none]
"""

from __future__ import annotations

import argparse
import json
import statistics

from verl_digen.schedule.bts import DEFAULT_FAN_OUT, DEFAULT_WORK_CAP, BtsPolicy
from verl_digen.schedule.config import ScheduleConfig
from verl_digen.schedule.costs import Affine, CostModel, Hardware, Pool
from verl_digen.schedule.scheduler import StepScheduler
from verl_digen.schedule.simulator import execute

B_VALUES = (8, 16, 32, 64, 128)
RATIOS = (0.1, 0.25, 0.5, 1.0, 2.0)
GEN_WORKERS = 4


def cluster(ratio: float, trainer_ranks: int = 1) -> CostModel:
    """4 generator GPUs + ``trainer_ranks`` trainer GPUs; per sample: generate 1.0 s (also on a trainer
    GPU), score 0.05 s, train ``ratio`` s on one rank (one pass, no fixed cost; rows split over the
    ranks); context switch 0.05 s each way, optimizer 0.02 s, one generator's weight pickup 0.1 s.
    With one-sample micro-batches and groups of one, B is the number of micro-batches and ``ratio`` the
    update/generation time ratio of one micro-batch (the axes of the paper's Figure 10)."""
    hw = Hardware("synthetic", generate=Affine(0.0, 1.0), score=Affine(0.0, 0.05), train_pass=Affine(0.0, ratio))
    return CostModel(Pool(hw, GEN_WORKERS), Pool(hw, trainer_ranks), steps_trained=1, switch_to_gen=0.05,
                     switch_to_train=0.05, optimizer_step=0.02, weight_sync=0.1)


def run(B: int, ratio: float, steps: int, ranks: int = 1, work_cap: int | None = DEFAULT_WORK_CAP,
        fan_out: int | None = DEFAULT_FAN_OUT) -> dict:
    model = cluster(ratio, ranks)
    costs = model.stage_costs(1)
    cfg = ScheduleConfig(prompts=B, group_size=1, mb_size=1, steps=steps)
    policy = BtsPolicy(reuse=False, work_cap=work_cap, fan_out=fan_out,
                       node_cap=None if work_cap is None else BtsPolicy().node_cap)
    sched = StepScheduler(cfg, costs, GEN_WORKERS, policy, trainer_ranks=ranks)
    tl = execute(sched, costs)
    ms = [s * 1e3 for s in policy.solves.recent_seconds]  # the last SolveLog.WINDOW solves
    return {
        "B": B,
        "ratio": ratio,
        "solves": policy.solves.count,
        "median_ms": statistics.median(ms) if ms else 0.0,
        "max_ms": policy.solves.max_seconds * 1e3,
        "capped": policy.solves.capped,
        "step_s": max(r.end for r in tl.records),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--ranks", type=int, default=1, help="trainer ranks = TAG slots (default 1)")
    ap.add_argument("--work-cap", default=str(DEFAULT_WORK_CAP), help="BTS work cap per solve, or 'none'")
    ap.add_argument("--fan-out", default=str(DEFAULT_FAN_OUT), help="BTS decisions tried per bubble, or 'none'")
    args = ap.parse_args()
    cap = None if args.work_cap == "none" else int(args.work_cap)
    fan = None if args.fan_out == "none" else int(args.fan_out)
    rows = [run(B, r, args.steps, args.ranks, cap, fan) for B in B_VALUES for r in RATIOS]
    print(f"{'B':>4s} {'ratio':>6s} {'solves':>6s} {'median ms':>10s} {'max ms':>8s} {'capped':>6s} {'step s':>8s}")
    for row in rows:
        print(f"{row['B']:4d} {row['ratio']:6.2f} {row['solves']:6d} {row['median_ms']:10.2f} {row['max_ms']:8.2f}"
              f" {row['capped']:6d} {row['step_s']:8.3f}")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
