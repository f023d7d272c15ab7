"""Does a recipe's TAG policy hold when the workload moves? Each setting's disaggregated recipe (its default
or its ``-digen`` variant) simulated with its shipped policy and with the others at 0.5x-4x its batch
(``data.train_batch_size``) and at 0.5x-4x its GPUs (both pools scaled), everything else as shipped.

Rows: recipe, policy (shipped), scale ("batch" | "gpus"), factor, step_s per policy (``step_<policy>``), and
``shipped_vs_best``: the shipped policy's step over the best policy's (1.0: it is the best; the issue's bar is
that no shipped default is ``adaptive`` where ``bts`` is more than 5 % faster). Mixed pools scale only the batch
(their pools are fixed by the hardware). Memory is not checked here: a policy the memory plan refuses (TAG on
hunyuanvideo-13b-16's 48 GB trainer GPUs, which is why it ships ``never``) still shows its time.
Usage: python bench/tag_policy_scaling.py [--json] [--steps N]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from hydra import compose, initialize_config_dir

from verl_digen import recipes
from verl_digen.config import load
from verl_digen.config.plan import cluster_spec
from verl_digen.schedule.config import ScheduleConfig, ScheduleConfigError
from verl_digen.schedule.simulator import simulate

POLICIES = ("never", "adaptive", "bts")
FACTORS = (0.5, 1, 2, 4)


def _compose(name: str):
    with initialize_config_dir(str(recipes.RECIPES_DIR), version_base=None):
        return load(compose(name))


def _fit(config: ScheduleConfig, gen_workers: int) -> ScheduleConfig:
    """``config`` with the largest update size not above the shipped one that divides the scaled step."""
    for units in range(config.update_units, 0, -1):
        try:
            replace(config, update_units=units).check_update_units(gen_workers)
            return replace(config, update_units=units)
        except ScheduleConfigError:
            continue
    raise ScheduleConfigError(f"no update size fits {config}")


def rows(steps: int) -> list[dict]:
    out = []
    for setting in recipes.settings():
        cfg = _compose(setting)
        name = setting if cfg.trainer.mode == "digen" else recipes.variant(setting)
        cfg = cfg if name == setting else _compose(name)
        model, fixed, _ = cluster_spec(cfg)
        shipped = cfg.digen.tag.policy
        sched = cfg.schedule_config(steps=steps)
        for scale in ("batch", "gpus"):
            if scale == "gpus" and fixed:
                continue
            for f in FACTORS:
                if scale == "batch":
                    prompts = max(1, round(sched.prompts * f))
                    config, m = replace(sched, prompts=prompts), model
                else:
                    g = max(1, round(model.generator.workers * f))
                    t = max(1, round(model.trainer.workers * f))
                    config, m = sched, model.with_workers(g, t)
                config = _fit(config, m.generator.workers)
                times = {p: simulate(replace(config, policy=p), m).step_time for p in POLICIES}
                best = min(times.values())
                out.append({"recipe": name, "policy": shipped, "scale": scale, "factor": f,
                            "update_units": config.update_units,
                            **{f"step_{p}": t for p, t in times.items()},
                            "shipped_vs_best": times[shipped.split(":")[0]] / best})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    table = rows(args.steps)
    print(f"{'recipe':<28s} {'policy':>9s} {'scale':>5s} {'x':>4s} " +
          " ".join(f"{p:>10s}" for p in POLICIES) + f" {'shipped/best':>12s}")
    for r in table:
        print(f"{r['recipe']:<28s} {r['policy']:>9s} {r['scale']:>5s} {r['factor']:>4g} " +
              " ".join(f"{r[f'step_{p}']:10.1f}" for p in POLICIES) + f" {r['shipped_vs_best']:12.3f}")
    worst = {}
    for r in table:
        worst[r["recipe"]] = max(worst.get(r["recipe"], 0.0), r["shipped_vs_best"])
    for name, w in worst.items():
        print(f"{name}: shipped policy at most {w:.3f}x the best policy over 0.5-4x batch and GPUs")
    if args.json:
        print(json.dumps(table))


if __name__ == "__main__":
    main()
