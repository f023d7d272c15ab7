"""End-to-end CPU benchmark: the same 2-worker budget under every mode, interleaved.

Colocated uses both workers as colocated workers (FSDP over 2 ranks); the disaggregated modes use 1 generator
+ 1 trainer. Modes: colocated (per-timestep training, as upstream runs today), colocated with TSP (so the gain
of disaggregation alone is visible), separate, digen without TAG, digen + BTS, digen + BTS + TCSS(0.5). Rounds
(5 by default) interleave the modes (A B C ... A B C ...) so machine noise hits all alike, and the medians
over rounds drop a round that noise hit alone. For each mode it prints the steady-state step time (the first
step of each run is warm-up), samples per worker-second, the ratio to colocated, the fraction of ideal, the
simulator's prediction of the step time from the profile that same run measured (``prediction_error``), and
its prediction from the profile the ``digen`` (TAG never) run of the same round measured
(``cross_prediction_error``): one measured mode has to predict the others, or the simulator cannot tell a user
which mode to run. ``transfer_error`` (``x/own``) sets that cross prediction against the
mode's own profile's prediction: what carrying a profile across modes loses, apart from the host's load
moving one run's steps and not another's.

    python bench/e2e_cpu.py            # table
    python bench/e2e_cpu.py --json     # table, then one JSON list on the last line
    python bench/e2e_cpu.py --out DIR  # keep every round's traces, timelines, profiles and probe samples
    python bench/e2e_cpu.py --refit DIR [--json]   # no run: the same table from what DIR kept, every profile
                                                   # fitted again by this code (a model change judged on the
                                                   # same measurements, apart from the host's noise)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ["VERL_PLATFORM"] = "cpu"

import ray  # noqa: E402

from verl_digen.config import RunConfig, compose  # noqa: E402
from verl_digen.driver.runtime import DigenRuntime  # noqa: E402
from verl_digen.reporting.metrics import measured_profile  # noqa: E402
from verl_digen.reporting.run_log import metrics_path, read_metrics  # noqa: E402
from verl_digen.schedule.actions import ends_step  # noqa: E402
from verl_digen.schedule.export import timeline_from_file  # noqa: E402
from verl_digen.schedule.profile_io import dump_profile, load  # noqa: E402
from verl_digen.schedule.simulator import simulate  # noqa: E402

#: the workload: 4 prompts x 4 samples (one GRPO group per micro-batch), 8 sampling steps of which 6
#: are trained, 16x16 latents
WORKLOAD = [
    "model.latent_size=16", "data.train_batch_size=4", "rollout.n=4", "rollout.micro_batch_size=4",
    "rollout.num_steps=8", "rollout.train_steps=6", "trainer.progress=false", "trainer.logger=[]",
]

MODES = {
    "colocated": ["trainer=colocated"],
    "colocated+tsp": ["trainer=colocated", "digen.tsp.degree=null"],
    "separate": ["trainer=separate", "digen.tsp.degree=null"],
    "digen": ["trainer=digen", "digen.tag.policy=never"],
    "digen+bts": ["trainer=digen", "digen.tag.policy=bts"],
    "digen+bts+tcss": ["trainer=digen", "digen.tag.policy=bts", "digen.tcss.staleness=0.5"],
}


#: the run whose profile predicts every mode (``cross_predicted_step_s``)
CROSS_SOURCE = "digen"


def predicted_step(cfg: RunConfig, profile_path: str) -> float:
    """The simulator's steady-state step time (median over steps 2..N, as measured) for ``cfg``'s
    schedule, from the profile at ``profile_path`` (this run's own, or another mode's run's)."""
    model, _ = load(profile_path)
    sched_cfg = cfg.schedule_config(steps=cfg.trainer.total_steps)
    sim = simulate(sched_cfg, model)
    ends = sorted({r.end for r in sim.timeline.records if ends_step(r.kind, r.mini_batch)})
    return statistics.median(b - a for a, b in zip(ends, ends[1:], strict=False))


def mode_config(name: str, steps: int, out_dir: str, overrides: list[str]) -> RunConfig:
    """The run config of one mode (the same config predicts it from another mode's profile)."""
    return compose([*WORKLOAD, *overrides, *MODES[name], f"trainer.total_steps={steps}",
                    f"trainer.trace_dir={out_dir}/{name}", f"trainer.default_local_dir={out_dir}/ckpt"])


def run_mode(name: str, steps: int, out_dir: str, overrides: list[str]) -> dict:
    cfg = mode_config(name, steps, out_dir, overrides)
    # the cross source's profile must also price what its own schedule never runs: the runtime probes it
    trainer = DigenRuntime(cfg, log=lambda _: None, probe=name == CROSS_SOURCE)
    try:
        result = trainer.fit()
    finally:
        trainer.shutdown()
    steady = [r.metrics for r in result.reports[1:]]
    return {
        "step_s": statistics.median(m["timing/step_s"] for m in steady),
        # colocated has no pipeline bound (a fixed sequence of phases): None
        "fraction_of_ideal": (statistics.median(m["perf/fraction_of_ideal"] for m in steady)
                              if "perf/fraction_of_ideal" in steady[0] else None),
        "predicted_step_s": predicted_step(cfg, result.profile_path),
        "batch": cfg.batch,
        "workers": cfg.total_workers,
        "cfg": cfg,
        "profile_path": result.profile_path,
    }


def refit_mode(name: str, steps: int, round_dir: str, overrides: list[str], tmp: str) -> dict:
    """``run_mode``'s row from what a kept run measured (``--out``): the step times from its metrics file,
    the profile fitted again by this code from its timeline and, where kept, its probe samples."""
    cfg = mode_config(name, steps, round_dir, overrides)
    trace_dir, mode = Path(cfg.trainer.trace_dir), cfg.trainer.mode
    steady = read_metrics(metrics_path(trace_dir, mode))[1:]
    probes_file = trace_dir / f"{mode}_probes.json"
    probes = json.loads(probes_file.read_text())["samples"] if probes_file.exists() else None
    model, workload = measured_profile(cfg, timeline_from_file(trace_dir / f"{mode}_timeline.json"), probes)
    path = str(Path(tmp, f"{Path(round_dir).name}_{name}_profile.json"))
    dump_profile(model, path, name=f"refit {name}", workload=workload)
    return {
        "step_s": statistics.median(m["timing/step_s"] for m in steady),
        "fraction_of_ideal": (statistics.median(m["perf/fraction_of_ideal"] for m in steady)
                              if "perf/fraction_of_ideal" in steady[0] else None),
        "predicted_step_s": predicted_step(cfg, path),
        "batch": cfg.batch,
        "workers": cfg.total_workers,
        "cfg": cfg,
        "profile_path": path,
    }


def _opt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # five: a whole run here can be ~1.25x slower or faster than the rest of its round (every action kind: the
    # host's speed), and one round's cross error ranged -28 % .. +38 %; in a 7-round run every set of 5 rounds
    # had every mode within 15 %, and 8 of its 35 sets of 3 did not (docs/benchmarks.md)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds over all modes")
    # 13: one step to the next moves about +-20 % here, and the median of 4 steady steps is the mean of two;
    # 12 steady steps cost ~3 s more a run (a run takes ~10 s, mostly starting its workers)
    ap.add_argument("--steps", type=int, default=13, help="global steps per run (the first is warm-up)")
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, help="keep traces and profiles here (default: a temporary folder)")
    ap.add_argument("--refit", default=None, metavar="DIR",
                    help="run nothing: the table from the runs kept in DIR (--out), profiles fitted again")
    ap.add_argument("overrides", nargs="*", help="extra config overrides for every mode (key=value)")
    args = ap.parse_args()
    if args.steps < 2:
        raise SystemExit("--steps must be >= 2 (the first step of each run is warm-up)")
    if args.refit is None:
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"VERL_PLATFORM": "cpu", "OMP_NUM_THREADS": "1"}})
    runs: dict[str, list[dict]] = {m: [] for m in args.modes}
    with tempfile.TemporaryDirectory() as tmp:
        out = args.refit or args.out or tmp
        rounds = (sum(1 for d in Path(out).iterdir() if d.name.startswith("round")) if args.refit
                  else args.rounds)
        for r in range(rounds):
            for mode in args.modes:
                if args.refit:
                    runs[mode].append(refit_mode(mode, args.steps, f"{out}/round{r + 1}", args.overrides, tmp))
                    continue
                row = run_mode(mode, args.steps, f"{out}/round{r + 1}", args.overrides)
                runs[mode].append(row)
                # the host's 1-minute load: other jobs on a shared machine slow one run and not the next
                print(f"  round {r + 1}/{args.rounds} {mode:<16} step {row['step_s']:.3f}s "
                      f"(predicted {row['predicted_step_s']:.3f}s) load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr, flush=True)
            if CROSS_SOURCE in runs:  # every mode of this round from this round's digen profile
                source = runs[CROSS_SOURCE][r]["profile_path"]
                for mode in args.modes:
                    runs[mode][r]["cross_predicted_step_s"] = predicted_step(runs[mode][r]["cfg"], source)
    rows = []
    for mode, rs in runs.items():
        step = statistics.median(x["step_s"] for x in rs)
        pred = statistics.median(x["predicted_step_s"] for x in rs)
        cross = (statistics.median(x["cross_predicted_step_s"] for x in rs)
                 if "cross_predicted_step_s" in rs[0] else None)
        rows.append({
            "mode": mode,
            "step_s": step,
            "samples_per_worker_s": rs[0]["batch"] / (step * rs[0]["workers"]),
            "fraction_of_ideal": (None if rs[0]["fraction_of_ideal"] is None
                                  else statistics.median(x["fraction_of_ideal"] for x in rs)),
            "predicted_step_s": pred,
            "prediction_error": pred / step - 1,
            "cross_predicted_step_s": cross,
            "cross_prediction_error": None if cross is None else cross / step - 1,
            # the cross prediction against the mode's own profile's: what the transfer loses, apart from how
            # far the host's load moved the measured steps (both profiles are fitted from per-size medians)
            "transfer_error": None if cross is None else cross / pred - 1,
        })
    base = next((r for r in rows if r["mode"] == "colocated"), None)
    for r in rows:
        r["vs_colocated"] = base["step_s"] / r["step_s"] if base else float("nan")
    print(f"{'mode':<16}{'step s':>9}{'samp/wkr-s':>12}{'vs coloc':>10}{'frac ideal':>12}{'pred s':>9}{'err':>8}"
          f"{'xpred s':>9}{'xerr':>8}{'x/own':>8}")
    for r in rows:
        xerr, terr = r["cross_prediction_error"], r["transfer_error"]
        print(f"{r['mode']:<16}{r['step_s']:>9.3f}{r['samples_per_worker_s']:>12.3f}{r['vs_colocated']:>9.2f}x"
              f"{_opt(r['fraction_of_ideal']):>12}{r['predicted_step_s']:>9.3f}{100 * r['prediction_error']:>7.1f}%"
              f"{_opt(r['cross_predicted_step_s'], 3):>9}{'-' if xerr is None else f'{100 * xerr:.1f}%':>8}"
              f"{'-' if terr is None else f'{100 * terr:.1f}%':>8}")
    if args.json:
        print(json.dumps(rows))
    if args.refit is None:
        ray.shutdown()


if __name__ == "__main__":
    main()
