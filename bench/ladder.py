"""The ablation ladder per preset and per recipe: naive (separate) -> +GAP -> +TSP -> +TAG -> +TCSS,
with the four colocated baselines for reference, simulated under each one's cost model
(docs/simulator.md).

Rows: source (preset | recipe), preset (its name), rung, step_s, speedup_vs_naive, speedup_vs_colocated
(against colocated:verl-omni), speedup_vs_colocated_{ideal,native,verl_omni,verl_omni_bypass}. A recipe's ladder
runs its disaggregated recipe (the setting's default or its ``-digen`` variant).
The summary lines give, per preset and recipe, the TCSS rung against the synchronous +TAG rung, and each
recipe as shipped (its planned configuration) against colocated:verl-omni and the ceiling (the step's
work over every GPU: colocated:ideal with its best TSP degree; ``ceiling_s``, ``of_ceiling``; null on
mixed GPUs, where colocated:ideal bounds nothing). The "as shipped" rows (the setting's default, ``mode``
colocated or digen) lead with ``vs_strongest`` against ``strongest_baseline``, the fastest run a user has
without verl-digen (config/plan.py ``ResourcePlan.strongest``), and also carry ``vs_verl_omni``,
``vs_verl_omni_bypass`` (verl-omni as its examples ship it, no old-log-prob recompute), ``vs_colocated_ideal``
(this project's ``trainer=colocated`` on the same GPUs), ``bound_s`` (a disaggregated layout's own lower bound,
``bounds.step_bounds``: no schedule of that layout is faster; null for a colocated one) with
``vs_strongest_bound`` (the strongest baseline over it: the most that layout could reach) and, for mixed pools,
``vs_best_subset`` (colocated:verl-omni on the fastest single-type pool alone that fits its memory;
``vs_best_subset_bypass`` and ``vs_best_subset_ideal`` the other two runs there, ``best_subset_pool`` which pool;
null where no pool fits) and ``vs_separate_verl_omni_bypass`` (verl-omni's synchronous separate mode on the
same pools, without its recompute).
A baseline that does not fit every GPU by the memory plan (config/colocated_memory.py ``baseline_memory``: the same plan
and the same 90 % headroom that refuse this project's own colocated layout) has a null ratio, is listed in
``unfit_baselines`` and is never the strongest; ``baseline_memory`` gives each baseline's GiB per GPU against its
GPU and ``baseline_step_s`` its priced step (as if it fit). The baselines are priced with as many rows per pass as
that plan holds.
The ``DiffusionNFT`` rows (one per image recipe, ``rung`` "DiffusionNFT"): the recipe's disaggregated run and
colocated:verl-omni on the same GPUs running ``algorithm.name=diffusion_nft`` instead, priced from the work NFT
does (T ODE forwards per sample; K rows per sample, each a forward and backward plus the old copy's and the
reference's no-grad forwards): ``step_s`` (digen), ``colocated_verl_omni_s``, ``vs_verl_omni``.
Usage: python bench/ladder.py [--json] [--steps N]
"""

from __future__ import annotations

import argparse
import copy
import json

from hydra import compose, initialize_config_dir

from verl_digen import recipes
from verl_digen.config import load
from verl_digen.config.plan import cluster_costs, resource_plan
from verl_digen.schedule import presets
from verl_digen.schedule.config import ScheduleConfig
from verl_digen.schedule.costs import BASELINES, IDEAL, VERL_OMNI, VERL_OMNI_BYPASS, CostModel
from verl_digen.schedule.simulator import ablation_configs, simulate


def ladder(source: str, name: str, base: ScheduleConfig, model: CostModel,
           colocated: dict[str, float] | None = None) -> list[dict]:
    """The rungs; ``colocated`` (baseline -> s/step) replaces the colocated rungs' own pricing: a recipe's
    baselines as its dry run prices them, with the rows per pass their memory holds."""
    staleness = base.staleness or 0.25
    rungs = ablation_configs(base, base.mb_size, base.tsp_degree, "bts", staleness, model.generator.workers)
    given = {f"colocated:{b}": t for b, t in (colocated or {}).items()}
    times = {r.label: given.get(r.label) or simulate(r.config, model, label=r.label, baseline=r.baseline).step_time
             for r in rungs}
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


def _compose(name: str):
    with initialize_config_dir(str(recipes.RECIPES_DIR), version_base=None):
        return load(compose(name))


def recipe_rows(steps: int) -> list[dict]:
    """Each setting's ladder (from its disaggregated recipe: the default or its ``-digen`` variant), then the
    setting as shipped (its default, the planner's choice: colocated or disaggregated), priced against the same
    colocated baselines and the strongest of them."""
    rows = []
    for name in recipes.settings():
        cfg = _compose(name)
        digen = cfg if cfg.trainer.mode == "digen" else _compose(recipes.variant(name))
        model = cluster_costs(digen)
        plan = resource_plan(cfg)
        part = ladder("recipe", name, digen.schedule_config(steps=steps), model, plan.predicted_colocated)
        for r in part:  # whether a colocated rung fits the recipe's GPUs by the memory plan
            if r["rung"].startswith("colocated:"):
                r["fits"] = r["rung"].split(":", 1)[1] not in plan.unfit
        shipped = simulate(cfg.schedule_config(steps=steps), cluster_costs(cfg))
        t = shipped.step_time
        # no schedule of the shipped layout beats its own bound (bounds.step_bounds): what it could reach at best
        bound = None if shipped.bounds is None else shipped.bounds.ideal
        naive = next(r["step_s"] for r in part if r["rung"] == "naive (separate)")
        # the baselines as the dry run prices them: every GPU, as many rows per pass as their memory holds; one
        # that does not fit by the memory plan is no ratio (null) and no candidate for the strongest
        colo, unfit = plan.predicted_colocated, plan.unfit
        vs = {b: None if b in unfit else colo[b] / t for b in BASELINES}.get
        label, strong = plan.strongest
        top = None if plan.heterogeneous else plan.ceiling_s  # mixed GPUs: colocated:ideal bounds nothing
        part.append({"source": "recipe", "preset": name, "rung": "as shipped", "mode": cfg.trainer.mode,
                     "step_s": t, "strongest_baseline": label, "vs_strongest": strong / t,
                     "speedup_vs_naive": naive / t, "speedup_vs_colocated": vs(VERL_OMNI),
                     **{f"speedup_vs_colocated_{b.replace('-', '_')}": vs(b) for b in BASELINES},
                     "ceiling_s": top, "of_ceiling": None if top is None else top / t,
                     "bound_s": bound, "vs_strongest_bound": None if bound is None else strong / bound,
                     "vs_verl_omni": vs(VERL_OMNI), "vs_verl_omni_bypass": vs(VERL_OMNI_BYPASS),
                     "vs_colocated_ideal": vs(IDEAL),
                     "baseline_step_s": dict(colo), "unfit_baselines": sorted(unfit),
                     "baseline_memory": {b: m.as_dict() for b, m in plan.baseline_memory.items()},
                     **({**subset_fields(plan.best_subset, t), "vs_separate_verl_omni_bypass": plan.separate_s / t}
                        if plan.heterogeneous else {})})
        rows += part
    return rows


IMAGE_ARCHS = ("flux", "sd3", "qwen_image")  # the recipes DiffusionNFT's rows are priced for


def as_nft(cfg):
    """``cfg`` running DiffusionNFT: its SDE and ratio keys back at their defaults (an ODE rollout, no ratio) and
    verl-omni's recipe's reference term (ref_kl_coef > 0: the reference forward is priced)."""
    from verl_digen.config.schema import ActorConfig, RolloutConfig

    out = copy.deepcopy(cfg)
    out.algorithm.name = "diffusion_nft"
    for key in ("sde_type", "noise_level", "selection"):
        setattr(out.rollout, key, getattr(RolloutConfig(), key))
    out.actor.clip_ratio, out.actor.kl_dt_weighted = ActorConfig().clip_ratio, False
    out.actor.recompute_log_prob = "false"
    out.actor.kl_coef = out.actor.kl_coef or 1e-4
    return out


def nft_rows(steps: int) -> list[dict]:
    """Per image recipe: its disaggregated recipe and colocated:verl-omni running DiffusionNFT."""
    rows = []
    for name in recipes.settings():
        cfg = _compose(name)
        if cfg.model.arch not in IMAGE_ARCHS:
            continue
        digen = as_nft(cfg if cfg.trainer.mode == "digen" else _compose(recipes.variant(name)))
        model = cluster_costs(digen)
        sched = digen.schedule_config(steps=steps)
        t = simulate(sched, model).step_time
        base = ScheduleConfig(prompts=sched.prompts, group_size=sched.group_size, mb_size=sched.group_size,
                              steps=steps, mode="colocated", partition="batch", mini_batches=sched.mini_batches,
                              row_forwards=sched.row_forwards)
        colo = simulate(base, model, label=f"colocated:{VERL_OMNI}", baseline=VERL_OMNI).step_time
        rows.append({"source": "recipe", "preset": name, "rung": "DiffusionNFT", "algorithm": "diffusion_nft",
                     "mode": digen.trainer.mode, "step_s": t, "colocated_verl_omni_s": colo, "vs_verl_omni": colo / t,
                     "trained_rows_per_sample": digen.trained_steps(), "row_forwards": sched.row_forwards})
    return rows


def subset_fields(subsets: dict, t: float) -> dict:
    """A mixed cluster's "as shipped" ratios against its best single-type subset (null where no pool fits)."""
    def ratio(b: str) -> float | None:
        return subsets[b].result.step_time / t if b in subsets else None

    head = subsets.get(VERL_OMNI)
    return {"vs_best_subset": ratio(VERL_OMNI), "vs_best_subset_bypass": ratio(VERL_OMNI_BYPASS),
            "vs_best_subset_ideal": ratio(IDEAL), "best_subset_pool": None if head is None else head.pool}


def _ratio(x: float | None, unit: str = "") -> str:
    """A ratio, or "no fit" where the baseline does not fit its GPUs' memory (a null ratio)."""
    return "no fit" if x is None else f"{x:.2f}{unit}"


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
              f"{r['speedup_vs_naive']:8.2f} {_ratio(r['speedup_vs_colocated']):>6s} "
              f"{_ratio(r['speedup_vs_colocated_native']):>6s}")
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
            subset = ("" if r.get("vs_best_subset") is None else
                      f", {r['vs_best_subset']:.2f}x best-subset (verl-omni on the {r['best_subset_pool']} pool alone)")
            bound = ("" if r["bound_s"] is None else
                     f"; its layout's bound {r['bound_s']:.1f} s/step, at most {r['vs_strongest_bound']:.2f}x")
            print(f"recipe {r['preset']} as shipped ({r['mode']}): {r['step_s']:.1f} s/step, {r['vs_strongest']:.2f}x "
                  f"the strongest baseline ({r['strongest_baseline']}), {_ratio(r['vs_verl_omni'], 'x')} "
                  f"colocated:verl-omni, {_ratio(r['vs_verl_omni_bypass'], 'x')} colocated:verl-omni-bypass, "
                  f"{_ratio(r['vs_colocated_ideal'], 'x')} colocated:ideal{subset}, {top}{bound}")
            for b in r["unfit_baselines"]:
                m = r["baseline_memory"][b]
                print(f"  colocated:{b} does not fit: {m['gib']:.1f} GiB per GPU against {m['usable_gib']:.1f} GiB "
                      f"(90% of {m['capacity_gib']:g} GiB, the planner's headroom for every layout); "
                      f"{r['baseline_step_s'][b]:.1f} s/step if it did")
    nft = nft_rows(args.steps)
    for r in nft:
        print(f"recipe {r['preset']} DiffusionNFT ({r['mode']}): {r['step_s']:.1f} s/step, {r['vs_verl_omni']:.2f}x "
              f"colocated:verl-omni running DiffusionNFT ({r['colocated_verl_omni_s']:.1f} s/step)")
    if args.json:
        print(json.dumps(rows + nft))


if __name__ == "__main__":
    main()
