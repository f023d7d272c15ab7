"""TCSS learning study: does stale sampling learn like on-policy?

Runs the tiny disaggregated (``trainer=digen``) run for several seeds x TCSS staleness bounds
(``digen.tcss.staleness``) on two learnable rewards, all in one Ray session (one ``DigenRuntime`` after
another; each run's workers are killed before the next starts). Runs interleave (seed, reward,
staleness) so machine noise hits every staleness alike and a cut-short study still has balanced seeds.

Per run it records the per-step mean reward, the measured share of stale micro-batches
(``digen/stale_fraction``) and the step time; the summary rows are:

- ``final_reward``: mean reward over the last quarter of the steps;
- ``steps_to_half``: first step at which the reward (3-step trailing mean) reaches the first-step reward
  plus half of the same seed's sync (staleness 0) run's final gain; ``None`` if never;
- ``time_to_sync_final_s``: wall time (sum of step times, warm-up step included) at which the 3-step
  trailing mean first reaches the same seed's sync ``final_reward``; ``None`` if never;
- ``stale_fraction``: mean of the per-step ``digen/stale_fraction`` (steps 2..N: step 1 has no previous
  policy to be stale against);
- ``step_s``: median step time, steps 2..N.

    python bench/tcss_learning.py --json                       # study, table, JSON list on the last line
    python bench/tcss_learning.py --curves runs.jsonl --json   # also append each run's curve as it ends
    python bench/tcss_learning.py --from runs.jsonl --plot docs/img/tcss_learning.png   # no new runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("VERL_PLATFORM", "cpu")

#: 4 prompts x 4 samples, micro-batches of 2 samples (8 per step: staleness 0.25 / 0.5 / 1.0 allow
#: 2 / 4 / 8 stale ones), 16x16 latents; sampling and trained steps are set by --sampling-steps and
#: --train-steps. TAG off (``never``): the generator pool alone generates, so TCSS is what fills its
#: drain at the end of a step (with BTS the trainer's TAG generations would take part of that gap).
WORKLOAD = [
    "model.latent_size=16", "data.train_batch_size=4", "rollout.n=4", "rollout.micro_batch_size=2",
    "trainer=digen", "digen.tag.policy=never", "trainer.progress=false", "trainer.logger=[]",
    "trainer.trace_dir=null",
]
STALENESS = (0.0, 0.25, 0.5, 1.0)
#: the default latent reward with a target (``latent_target``: -|mean - 1|), so that it plateaus (the
#: plain ``latent_mean`` is unbounded and never does), and an image-space reward through the VAE decoder
REWARDS = ("latent_target", "brightness")
#: per-reward overrides (brightness learns slower through the decoder: a larger learning rate)
REWARD_OVERRIDES: dict[str, list[str]] = {"brightness": ["actor.lr=1e-2"]}
SMOOTH = 3  # trailing-mean window of the threshold crossings


def run_one(reward: str, staleness: float, seed: int, steps: int, sampling_steps: int, train_steps: int,
            extra: list[str], out_dir: str) -> dict:
    """One training run; returns its per-step curves."""
    from verl_digen.config import compose
    from verl_digen.driver.runtime import DigenRuntime

    cfg = compose([*WORKLOAD, f"reward.name={reward}", f"digen.tcss.staleness={staleness}",
                   f"trainer.seed={seed}", f"model.seed={seed}", f"trainer.total_steps={steps}",
                   f"rollout.num_steps={sampling_steps}", f"rollout.train_steps={train_steps}",
                   f"trainer.default_local_dir={out_dir}/ckpt", *REWARD_OVERRIDES.get(reward, []), *extra])
    trainer = DigenRuntime(cfg, log=lambda _: None)
    t0 = time.perf_counter()
    try:
        result = trainer.fit()
    finally:
        trainer.shutdown()
    ms = [r.metrics for r in result.reports]
    return {
        "reward": reward, "staleness": staleness, "seed": seed, "steps": steps,
        "curve": [m["reward/mean"] for m in ms],
        "step_times": [m["timing/step_s"] for m in ms],
        "stale": [m.get("digen/stale_fraction", 0.0) for m in ms],
        **{k: [m.get(f"actor/{k}") for m in ms]
           for k in ("ratio_mean_stale", "ratio_mean_fresh", "clip_frac_stale", "clip_frac_fresh")},
        "run_s": time.perf_counter() - t0,
    }


def _smooth(xs: list[float], w: int = SMOOTH) -> list[float]:
    return [statistics.fmean(xs[max(0, i - w + 1):i + 1]) for i in range(len(xs))]


def _first(xs: list[float], threshold: float, up: bool) -> int | None:
    for i, x in enumerate(xs):
        if (x >= threshold) if up else (x <= threshold):
            return i
    return None


def final(curve: list[float]) -> float:
    """Mean of the last quarter of the steps."""
    return statistics.fmean(curve[-max(1, len(curve) // 4):])


def summarize(runs: list[dict]) -> list[dict]:
    """One row per run, measured against the same reward and seed's sync run."""
    sync = {(r["reward"], r["seed"]): r for r in runs if r["staleness"] == 0}
    rows = []
    for r in runs:
        base = sync.get((r["reward"], r["seed"]))
        row = {"reward": r["reward"], "staleness": r["staleness"], "seed": r["seed"], "steps": r["steps"],
               "final_reward": final(r["curve"]),
               "stale_fraction": statistics.fmean(r["stale"][1:]) if len(r["stale"]) > 1 else 0.0,
               "step_s": statistics.median(r["step_times"][1:]) if len(r["step_times"]) > 1 else r["step_times"][0],
               "steps_to_half": None, "time_to_sync_final_s": None}
        if base is not None:
            start, goal = base["curve"][0], final(base["curve"])
            up = goal >= start
            sm = _smooth(r["curve"])
            i = _first(sm, start + 0.5 * (goal - start), up)
            row["steps_to_half"] = None if i is None else i + 1
            j = _first(sm, goal, up)
            row["time_to_sync_final_s"] = None if j is None else sum(r["step_times"][:j + 1])
        rows.append(row)
    return rows


def _ms(xs: list) -> tuple[float, float] | None:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def table(rows: list[dict]) -> list[dict]:
    """Mean and std over seeds per (reward, staleness); ``reached`` counts seeds with a finite value."""
    out = []
    for reward in dict.fromkeys(r["reward"] for r in rows):
        sync_final = _ms([r["final_reward"] for r in rows if r["reward"] == reward and r["staleness"] == 0])
        for s in sorted({r["staleness"] for r in rows if r["reward"] == reward}):
            rs = [r for r in rows if r["reward"] == reward and r["staleness"] == s]
            entry = {"reward": reward, "staleness": s, "seeds": len(rs)}
            for k in ("final_reward", "steps_to_half", "time_to_sync_final_s", "stale_fraction", "step_s"):
                m = _ms([r[k] for r in rs])
                entry[k] = None if m is None else {"mean": m[0], "std": m[1],
                                                   "reached": sum(r[k] is not None for r in rs)}
            if sync_final is not None and entry["final_reward"] is not None:
                entry["within_sync_std"] = abs(entry["final_reward"]["mean"] - sync_final[0]) <= sync_final[1]
            out.append(entry)
    return out


def _cell(e: dict, k: str, digits: int) -> str:
    """``mean ± std``, with ``(reached/seeds)`` when some seeds never reached the threshold."""
    v = e[k]
    if v is None:
        return "-"
    txt = f"{v['mean']:.{digits}f} ± {v['std']:.{digits}f}"
    return txt + (f" ({v['reached']}/{e['seeds']})" if v["reached"] < e["seeds"] else "")


def print_table(entries: list[dict]) -> None:
    print(f"{'reward':<14}{'stale':>6}{'final_reward':>22}{'steps_to_half':>20}{'t_to_sync_final s':>22}"
          f"{'stale_frac':>16}{'step_s':>18}{'  within 1 sd':>14}")
    for e in entries:
        print(f"{e['reward']:<14}{e['staleness']:>6.2f}{_cell(e, 'final_reward', 4):>22}"
              f"{_cell(e, 'steps_to_half', 1):>20}{_cell(e, 'time_to_sync_final_s', 1):>22}"
              f"{_cell(e, 'stale_fraction', 2):>16}{_cell(e, 'step_s', 3):>18}"
              f"{str(e.get('within_sync_std', '-')):>14}")


def plot(runs: list[dict], path: str) -> None:
    """Mean and ±1 std seed band per staleness: reward vs step (top) and vs wall time (bottom). Each
    curve is the gain over its run's first-step reward (the same for every staleness of one seed: step 1
    has nothing stale), so the band shows the spread of learning, not of the random initial models."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rewards = list(dict.fromkeys(r["reward"] for r in runs))
    fig, axes = plt.subplots(2, len(rewards), figsize=(6 * len(rewards), 8), squeeze=False)
    colors = {0.0: "black", 0.25: "tab:blue", 0.5: "tab:green", 1.0: "tab:red"}
    for c, reward in enumerate(rewards):
        for s in sorted({r["staleness"] for r in runs if r["reward"] == reward}):
            rs = [r for r in runs if r["reward"] == reward and r["staleness"] == s]
            n = min(len(r["curve"]) for r in rs)
            ys = np.array([np.array(_smooth(r["curve"][:n])) - r["curve"][0] for r in rs])
            ts = np.array([np.cumsum(r["step_times"][:n]) for r in rs])
            steps = np.arange(1, n + 1)
            col = colors.get(s)
            label = f"staleness {s:g} ({len(rs)} seeds)"
            ax = axes[0][c]
            ax.plot(steps, ys.mean(0), color=col, label=label)
            ax.fill_between(steps, ys.mean(0) - ys.std(0), ys.mean(0) + ys.std(0), color=col, alpha=0.15)
            # against wall time: each seed's curve on a common time grid (up to the shortest run)
            grid = np.linspace(0, ts[:, -1].min(), 100)
            yt = np.array([np.interp(grid, t, y) for t, y in zip(ts, ys, strict=True)])
            ax = axes[1][c]
            ax.plot(grid, yt.mean(0), color=col, label=label)
            ax.fill_between(grid, yt.mean(0) - yt.std(0), yt.mean(0) + yt.std(0), color=col, alpha=0.15)
        axes[0][c].set(title=f"{reward}: reward vs step", xlabel="global step",
                       ylabel=f"reward gain over step 1 ({SMOOTH}-step trailing mean)")
        axes[1][c].set(title=f"{reward}: reward vs wall time", xlabel="seconds (sum of step times)",
                       ylabel=f"reward gain over step 1 ({SMOOTH}-step trailing mean)")
        for ax in axes[:, c]:
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
    fig.suptitle("TCSS learning study (tiny CPU run): mean and ±1 std band over seeds")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--staleness", type=float, nargs="*", default=list(STALENESS))
    ap.add_argument("--rewards", nargs="*", default=list(REWARDS))
    ap.add_argument("--steps", type=int, default=40, help="global steps per run")
    ap.add_argument("--sampling-steps", type=int, default=4, help="rollout.num_steps")
    ap.add_argument("--train-steps", type=int, default=4, help="rollout.train_steps")
    ap.add_argument("--json", action="store_true", help="print the table's entries as JSON, then the per-run "
                    "rows as one JSON list on the last line")
    ap.add_argument("--plot", default=None, help="write the figure here (e.g. docs/img/tcss_learning.png)")
    ap.add_argument("--curves", default=None, help="append each finished run's curves to this JSON-lines file")
    ap.add_argument("--from", dest="source", default=None, help="read runs from a --curves file; run nothing")
    ap.add_argument("overrides", nargs="*", help="extra config overrides for every run (key=value)")
    args = ap.parse_args()
    if args.steps < 4:
        raise SystemExit(f"--steps must be >= 4 (a last quarter of at least one step), got {args.steps}")
    if args.seeds < 1:
        raise SystemExit(f"--seeds must be >= 1, got {args.seeds}")
    bad = [s for s in args.staleness if not 0 <= s <= 1]
    if bad:
        raise SystemExit(f"--staleness values must lie in [0, 1], got {bad}")
    if args.source:
        with open(args.source) as f:
            runs = [json.loads(line) for line in f if line.strip()]
    else:
        import ray
        import torch

        torch.set_num_threads(1)
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"VERL_PLATFORM": "cpu", "OMP_NUM_THREADS": "1"}})
        runs = []
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            for seed in range(args.seeds):
                for reward in args.rewards:
                    for s in args.staleness:
                        run = run_one(reward, s, seed, args.steps, args.sampling_steps, args.train_steps,
                                      args.overrides, tmp)
                        runs.append(run)
                        if args.curves:
                            with open(args.curves, "a") as f:
                                f.write(json.dumps(run) + "\n")
                        print(f"  seed {seed} {reward:<12} staleness {s:<4g} final {final(run['curve']):.4f} "
                              f"step {statistics.median(run['step_times'][1:]):.3f}s run {run['run_s']:.1f}s "
                              f"total {time.perf_counter() - t0:.0f}s load {os.getloadavg()[0]:.1f}",
                              file=sys.stderr, flush=True)
        ray.shutdown()
    rows = summarize(runs)
    entries = table(rows)
    print_table(entries)
    if args.plot:
        plot(runs, args.plot)
    if args.json:
        print(json.dumps(entries))
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
