"""Simulated sweep over B x update/generation ratio: fraction of ideal of digen + BTS, and its speedup
over colocated, separate, static TAG and adaptive TAG (same synthetic cluster as bench/bts.py).

Usage: python bench/sim_sweep.py [--json] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bts import B_VALUES, RATIOS, cluster  # noqa: E402  (the same synthetic grid)

from verl_digen.schedule.config import ScheduleConfig  # noqa: E402
from verl_digen.schedule.simulator import simulate  # noqa: E402

MODES = (
    ("colocated", dict(mode="colocated", partition="batch")),
    ("separate", dict(mode="separate", partition="batch")),
    ("never", dict(policy="never")),
    ("static", None),  # static:K with K = B/8 TAG micro-batches per step
    ("adaptive", dict(policy="adaptive:0.3")),
    ("bts", dict(policy="bts")),
    ("bts+tcss", dict(policy="bts", staleness=0.25)),
)


def sweep(B: int, ratio: float, steps: int) -> list[dict]:
    model = cluster(ratio)
    times, rows = {}, []
    for mode, kw in MODES:
        if kw is None:
            kw = dict(policy=f"static:{max(1, B // 8)}")
        cfg = ScheduleConfig(prompts=B, group_size=1, mb_size=1, steps=steps, **kw)
        res = simulate(cfg, model, label=mode)
        times[mode] = res.step_time
        rows.append({"B": B, "ratio": ratio, "mode": mode, "step_time": res.step_time,
                     "fraction_of_ideal": res.fraction_of_ideal})
    for row in rows:
        t = row["step_time"]
        for ref in ("colocated", "separate", "static", "adaptive"):
            row[f"speedup_vs_{ref}"] = times[ref] / t
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    rows = [r for B in B_VALUES for ratio in RATIOS for r in sweep(B, ratio, args.steps)]
    print(f"{'B':>4s} {'ratio':>5s} {'mode':>9s} {'step':>8s} {'of ideal':>8s} {'vs colo':>7s} {'vs sep':>7s} "
          f"{'vs static':>9s} {'vs adapt':>8s}")
    for r in rows:
        if r["mode"] not in ("bts", "bts+tcss"):
            continue
        print(f"{r['B']:4d} {r['ratio']:5.2f} {r['mode']:>9s} {r['step_time']:8.2f} {r['fraction_of_ideal']:8.3f} "
              f"{r['speedup_vs_colocated']:7.2f} {r['speedup_vs_separate']:7.2f} {r['speedup_vs_static']:9.2f} "
              f"{r['speedup_vs_adaptive']:8.2f}")
    for mode in ("bts", "bts+tcss", "adaptive", "never"):
        f = [r["fraction_of_ideal"] for r in rows if r["mode"] == mode]
        print(f"median fraction of ideal, {mode}: {statistics.median(f):.3f} (min {min(f):.3f})")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
