"""The ablation ladder per preset and per recipe: naive (separate) -> +GAP -> +TSP -> +TAG -> +TCSS,
with the four colocated baselines for reference, simulated under each one's cost model
(docs/simulator.md).

Rows: source (preset | recipe), preset (its name), rung, step_s, speedup_vs_naive, speedup_vs_colocated
(against colocated:verl-omni), speedup_vs_colocated_{ideal,native,verl_omni}.
The summary lines give, per preset and recipe, the TCSS rung against the synchronous +TAG rung, and each
recipe as shipped (its planned configuration) against colocated:verl-omni and the ceiling (the step's
work over every GPU: colocated:ideal with its best TSP degree; ``ceiling_s``, ``of_ceiling``; null on
mixed GPUs, where colocated:ideal bounds nothing).
Usage: python bench/ladder.py [--json] [--steps N]
"""

from __future__ import annotations

import argparse
import json

from hydra import compose, initialize_config_dir

from verl_digen import recipes
from verl_digen.config import load
from verl_digen.config.plan import cluster_costs, resource_plan
from verl_digen.schedule import presets
from verl_digen.schedule.config import ScheduleConfig
from verl_digen.schedule.costs import BASELINES, VERL_OMNI, CostModel
from verl_digen.schedule.simulator import ablation_configs, simulate


def ladder(source: str, name: str, base: ScheduleConfig, model: CostModel) -> list[dict]:
    staleness = base.staleness or 0.25
    rungs = ablation_configs(base, base.mb_size, base.tsp_degree, "bts", staleness, model.generator.workers)
    times = {r.label: simulate(r.config, model, label=r.label, baseline=r.baseline).step_time for r in rungs}
    naive = times["naive (separate)"]
    colo = {b: times[f"colocated:{b}"] for b in BASELINES}
    return [{"source": source, "preset": name, "rung": label, "step_s": t, "speedup_vs_naive": naive / t,
             "speedup_vs_colocated": colo[VERL_OMNI] / t,
             **{f"speedup_vs_colocated_{b.replace('-', '_')}": c / t for b, c in colo.items()}}
            for label, t in times.items()]


def preset_rows(steps: int) -> list[dict]:
    rows = []
    for name in presets.names():
        p = presets.get(name)
        w = p.workload
        base = ScheduleConfig(prompts=w.prompts, group_size=w.group_size, mb_size=w.mb_size, steps=steps,
                              tsp_degree=w.tsp_degree, staleness=w.staleness)
        rows += ladder("preset", name, base, p.model)
    return rows


def recipe_rows(steps: int) -> list[dict]:
    """Each recipe's ladder, then the recipe as shipped (the planner's configuration: its split, row
    packing and update size), priced against the same colocated baselines."""
    rows = []
    for name in recipes.names():
        if name.endswith("-colocated"):
            continue
        with initialize_config_dir(str(recipes.RECIPES_DIR), version_base=None):
            cfg = load(compose(name))
        model = cluster_costs(cfg)
        sched = cfg.schedule_config(steps=steps)
        part = ladder("recipe", name, sched, model)
        t = simulate(sched, model).step_time
        colo = {b: next(r["step_s"] for r in part if r["rung"] == f"colocated:{b}") for b in BASELINES}
        naive = next(r["step_s"] for r in part if r["rung"] == "naive (separate)")
        plan = resource_plan(cfg)
        top = None if plan.heterogeneous else plan.ceiling_s  # mixed GPUs: colocated:ideal bounds nothing
        part.append({"source": "recipe", "preset": name, "rung": "as shipped", "step_s": t,
                     "speedup_vs_naive": naive / t, "speedup_vs_colocated": colo[VERL_OMNI] / t,
                     **{f"speedup_vs_colocated_{b.replace('-', '_')}": c / t for b, c in colo.items()},
                     "ceiling_s": top, "of_ceiling": None if top is None else top / t})
        rows += part
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    rows = preset_rows(args.steps) + recipe_rows(args.steps)
    print(f"{'source':>6s} {'preset':<28s} {'rung':<20s} {'step s':>9s} {'vs naive':>8s} {'vs vo':>6s} "
          f"{'vs nat':>6s}")
    for r in rows:
        print(f"{r['source']:>6s} {r['preset']:<28s} {r['rung']:<20s} {r['step_s']:9.1f} "
              f"{r['speedup_vs_naive']:8.2f} {r['speedup_vs_colocated']:6.2f} {r['speedup_vs_colocated_native']:6.2f}")
    by = {}
    for r in rows:
        by.setdefault((r["source"], r["preset"]), {})[r["rung"].split(" (")[0]] = r["step_s"]
    ratios = {k: v["+TAG"] / v["+TCSS"] for k, v in by.items()}
    for (source, name), ratio in ratios.items():
        print(f"TCSS vs synchronous, {source} {name}: {ratio:.3f}x")
    print(f"TCSS vs synchronous: min {min(ratios.values()):.3f}x over {len(ratios)} presets and recipes")
    for r in rows:  # the targets of issue 22: the recipes as shipped against verl-omni and the ceiling
        if r["rung"] == "as shipped":
            top = ("no ceiling (mixed GPUs)" if r["ceiling_s"] is None
                   else f"{r['of_ceiling']:.0%} of the ceiling ({r['ceiling_s']:.1f} s/step)")
            print(f"recipe {r['preset']} as shipped: {r['step_s']:.1f} s/step, {r['speedup_vs_colocated']:.2f}x "
                  f"colocated:verl-omni, {top}")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
