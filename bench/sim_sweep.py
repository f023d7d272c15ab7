"""Simulated sweep over B x update/generation ratio x trainer ranks: fraction of ideal of digen + BTS,
its speedup over colocated, separate, never-TAG, static TAG and adaptive TAG, and TCSS vs synchronous
(same synthetic cluster as bench/bts.py, with 1 or 4 trainer GPUs).

Row fields: B, ratio, trainer_ranks, mode, step_time, fraction_of_ideal, speedup_vs_<mode> and
trainer_idle_never (the trainer pool's idle fraction of the step under ``never``).
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

TRAINER_RANKS = (1, 4)
MODES = (
    ("colocated", dict(mode="colocated", partition="batch")),
    ("separate", dict(mode="separate", partition="batch")),
    ("never", dict(policy="never")),
    ("static", None),  # static:K with K = B/8 TAG micro-batches per step
    ("adaptive", dict(policy="adaptive:0.3")),
    ("bts", dict(policy="bts")),
    ("bts+tcss", dict(policy="bts", staleness=0.25)),
)
REFS = ("colocated", "separate", "never", "static", "adaptive", "bts")


def sweep(B: int, ratio: float, steps: int, ranks: int = 1) -> list[dict]:
    model = cluster(ratio, ranks)
    times, rows, idle_never = {}, [], None
    for mode, kw in MODES:
        if kw is None:
            kw = dict(policy=f"static:{max(1, B // 8)}")
        cfg = ScheduleConfig(prompts=B, group_size=1, mb_size=1, steps=steps, **kw)
        res = simulate(cfg, model, label=mode)
        times[mode] = res.step_time
        if mode == "never":
            idle_never = 1.0 - res.busy["trainer"]
        rows.append({"B": B, "ratio": ratio, "trainer_ranks": ranks, "mode": mode, "step_time": res.step_time,
                     "fraction_of_ideal": res.fraction_of_ideal})
    for row in rows:
        t = row["step_time"]
        row["trainer_idle_never"] = idle_never
        for ref in REFS:
            row[f"speedup_vs_{ref}"] = times[ref] / t
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    rows = [r for ranks in TRAINER_RANKS for B in B_VALUES for ratio in RATIOS
            for r in sweep(B, ratio, args.steps, ranks)]
    print(f"{'R':>2s} {'B':>4s} {'ratio':>5s} {'mode':>9s} {'step':>8s} {'of ideal':>8s} {'vs colo':>7s} "
          f"{'vs sep':>7s} {'vs never':>8s} {'vs adapt':>8s} {'idle@never':>10s}")
    for r in rows:
        if r["mode"] not in ("bts", "bts+tcss"):
            continue
        print(f"{r['trainer_ranks']:2d} {r['B']:4d} {r['ratio']:5.2f} {r['mode']:>9s} {r['step_time']:8.2f} "
              f"{r['fraction_of_ideal']:8.3f} {r['speedup_vs_colocated']:7.2f} {r['speedup_vs_separate']:7.2f} "
              f"{r['speedup_vs_never']:8.2f} {r['speedup_vs_adaptive']:8.2f} {r['trainer_idle_never']:10.2f}")
    for ranks in TRAINER_RANKS:
        sub = [r for r in rows if r["trainer_ranks"] == ranks]
        for mode in ("bts", "bts+tcss", "adaptive", "never"):
            f = [r["fraction_of_ideal"] for r in sub if r["mode"] == mode]
            print(f"R={ranks} median fraction of ideal, {mode}: {statistics.median(f):.3f} (min {min(f):.3f})")
        idle = [r["speedup_vs_never"] for r in sub if r["mode"] == "bts" and r["trainer_idle_never"] >= 0.5]
        if idle:
            print(f"R={ranks} bts vs never where the trainer idles >= half the step under never: "
                  f"median {statistics.median(idle):.2f}x over {len(idle)} cells")
        tcss = [r["speedup_vs_bts"] for r in sub if r["mode"] == "bts+tcss"]
        print(f"R={ranks} TCSS vs synchronous (bts): min {min(tcss):.3f}x, median {statistics.median(tcss):.3f}x")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
