"""The ``digen`` command: ``digen simulate`` (ablation table for a preset or profile), ``digen plan``
(best generator/trainer split for a GPU budget) and ``digen plot`` (Gantt and curves of a run's trace
dir). Also ``python -m verl_digen.cli``.

Subcommands are argparse subparsers registered in ``build_parser``; add new ones there.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from verl_digen.schedule import presets as preset_lib
from verl_digen.schedule.config import COLOCATED, DIGEN, SEPARATE, ScheduleConfig
from verl_digen.schedule.costs import BASELINES, VERL_OMNI, CostModel
from verl_digen.schedule.fabric import SHARDINGS
from verl_digen.schedule.gap import spread_mb_size
from verl_digen.schedule.profile_io import Workload, dump_profile
from verl_digen.schedule.simulator import Rung, SimResult, ablation_configs, simulate
from verl_digen.schedule.split_search import STRONGEST
from verl_digen.schedule.tag_policy import tag_policy_usage

FABRIC_ARGS = {"gpus_per_node": int, "nics_per_node": int, "nic_gbs": float, "intra_gbs": float, "sharding": str}
SETTING_ARGS = {"sampling_steps": int, "timestep_fraction": float, "keep_fraction": float}


def _load_source(args: argparse.Namespace) -> tuple[str, CostModel, Workload, bool]:
    """(name, cost model, workload, fixed split) of ``--preset`` / ``--profile`` with the overrides."""
    name, model, wl, spec = preset_lib.resolve(args.profile or args.preset)
    fabric = {k: getattr(args, k) for k in FABRIC_ARGS if getattr(args, k, None) is not None}
    setting = {k: getattr(args, k) for k in SETTING_ARGS if getattr(args, k, None) is not None}
    if fabric or setting:
        if spec is None:
            flags = ", ".join("--" + k.replace("_", "-") for k in (*fabric, *setting))
            raise ValueError(f"{flags} change how a preset is derived; a measured profile already holds its "
                             "communication and workload in its measured costs (edit the profile instead)")
        p = spec.build(fabric=fabric, **setting)
        model, wl = p.model, replace(p.workload, **{k: getattr(wl, k) for k in ("prompts", "group_size")})
    wl = wl or Workload()
    over = {k: getattr(args, k) for k in ("prompts", "group_size", "mb_size", "tsp_degree", "staleness", "steps",
                                          "policy") if getattr(args, k, None) is not None}
    wl = replace(wl, **over)
    if getattr(args, "generators", None) or getattr(args, "trainers", None):
        model = model.with_workers(args.generators or model.generator.workers,
                                   args.trainers or model.trainer.workers)
    return name, model, wl, bool(spec and spec.heterogeneous)


def _add_source_args(p: argparse.ArgumentParser, strongest: bool = False) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", default="hunyuanvideo-13b-16",
                     help=f"one of: {', '.join(preset_lib.names())} (default %(default)s)")
    src.add_argument("--profile", help="a profile/config YAML or JSON (see docs/simulator.md)")
    p.add_argument("--prompts", type=int)
    p.add_argument("--group-size", dest="group_size", type=int)
    p.add_argument("--mb-size", dest="mb_size", type=int, help="GAP micro-batch size (samples)")
    p.add_argument("--tsp-degree", dest="tsp_degree", type=int)
    p.add_argument("--staleness", type=float, help="TCSS bound in [0, 1]")
    p.add_argument("--steps", type=int, help="global steps to simulate (step time = mean)")
    p.add_argument("--policy", help=f"TAG policy: {tag_policy_usage()}")
    if strongest:  # a plan is stated against the fastest run a user has without verl-digen
        p.add_argument("--baseline", choices=(STRONGEST, *BASELINES), default=STRONGEST,
                       help="the run to compare against: the strongest baseline (the fastest of native, verl-omni "
                       "and verl-omni-bypass, on mixed pools also on their best single-type subset) or one "
                       "colocated run (default %(default)s; docs/simulator.md)")
    else:
        p.add_argument("--baseline", choices=BASELINES, default=VERL_OMNI,
                       help="the colocated run to compare against (default %(default)s; docs/simulator.md)")
    topo = p.add_argument_group("cluster (presets only; docs/calibration.md)")
    topo.add_argument("--gpus-per-node", dest="gpus_per_node", type=int)
    topo.add_argument("--nics-per-node", dest="nics_per_node", type=int)
    topo.add_argument("--nic-gbs", dest="nic_gbs", type=float, help="one NIC, GB/s (400 Gb/s = 50)")
    topo.add_argument("--intra-gbs", dest="intra_gbs", type=float, help="per-GPU bandwidth inside a node, GB/s")
    topo.add_argument("--sharding", choices=SHARDINGS, help="FSDP: full or hybrid (shard in a node)")
    work = p.add_argument_group("workload (presets only)")
    work.add_argument("--sampling-steps", dest="sampling_steps", type=int)
    work.add_argument("--timestep-fraction", dest="timestep_fraction", type=float)
    work.add_argument("--keep-fraction", dest="keep_fraction", type=float, help="best-of-N: share trained")
    p.add_argument("--json", action="store_true", help="print the rows as JSON on the last line")


def _fmt(v, spec: str) -> str:
    """``v`` formatted by ``spec``; a missing value is a "-" of the same width, so columns stay aligned."""
    width = re.match(r"\d*", spec).group()
    return format("-", f">{width}") if v is None else format(v, spec)


def _colocated(results: list[SimResult], baseline: str) -> float | None:
    return next((r.step_time for r in results if r.baseline == baseline), None)


def _table(results: list[SimResult], baseline: str) -> str:
    colo = _colocated(results, baseline)
    naive = next((r.step_time for r in results if r.config.mode == SEPARATE), None)
    head = (f"{'configuration':28s} {'step (s)':>9s} {'samples/GPU/s':>13s} {'vs colo*':>8s} {'vs naive':>8s} "
            f"{'of ideal':>8s} {'gen bubble':>10s} {'trn bubble':>10s}")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.label[:28]:28s} {r.step_time:9.2f} {r.throughput:13.4f} "
            f"{_fmt(colo / r.step_time if colo else None, '8.2f')} "
            f"{_fmt(naive / r.step_time if naive else None, '8.2f')} "
            f"{_fmt(r.fraction_of_ideal, '8.2f')} {max(0.0, 1 - r.busy['generator']):10.2f} "
            f"{max(0.0, 1 - r.busy['trainer']):10.2f}"
        )
    return "\n".join(lines)


def _single(mode: str, wl: Workload, generators: int) -> ScheduleConfig:
    """The ``--only`` configuration of one mode (any micro-batch size works for the baselines)."""
    common = dict(prompts=wl.prompts, group_size=wl.group_size, steps=wl.steps)
    if mode == COLOCATED:
        return ScheduleConfig(mb_size=wl.group_size, mode=COLOCATED, partition="batch", **common)
    if mode == SEPARATE:
        return ScheduleConfig(mb_size=spread_mb_size(wl.prompts, wl.group_size, generators), mode=SEPARATE,
                              partition="gap", **common)
    return ScheduleConfig(mb_size=wl.mb_size, mode=DIGEN, partition="gap", tsp_degree=wl.tsp_degree,
                          policy=wl.policy, staleness=wl.staleness, **common)


def cmd_simulate(args: argparse.Namespace) -> int:
    name, model, wl, _ = _load_source(args)
    if args.dump_profile:
        dump_profile(model, args.dump_profile, name=name, workload=wl)
    base = ScheduleConfig(prompts=wl.prompts, group_size=wl.group_size, mb_size=wl.mb_size, steps=wl.steps)
    G = model.generator.workers
    if args.only:
        runs = [Rung(f"colocated:{args.baseline}" if args.only == COLOCATED else args.only,
                     _single(args.only, wl, G), args.baseline)]
    else:
        runs = ablation_configs(base, wl.mb_size, wl.tsp_degree, wl.policy, wl.staleness, G)
    results = [simulate(r.config, model, label=r.label, noise=args.noise, seed=args.seed, baseline=r.baseline)
               for r in runs]
    g, r = model.generator, model.trainer
    print(f"{name}: {g.workers} x {g.hardware.name} generate, {r.workers} x {r.hardware.name} train; "
          f"batch {wl.prompts} x {wl.group_size}, micro-batch {wl.mb_size}, TSP {wl.tsp_degree}, "
          f"{wl.steps} steps")
    print(_table(results, args.baseline))
    print(f"* vs colocated:{args.baseline} (--baseline picks another)")
    last = results[-1]
    if last.bts_predicted and last.bts_solves is not None:
        print(f"BTS predicted optimizer-step end of step 0: {last.bts_predicted[0]:.2f} s; "
              f"{last.bts_solves.count} solves, max {last.bts_solves.max_seconds * 1e3:.1f} ms")
    if args.trace:
        from verl_digen.schedule.export import save_chrome_trace

        save_chrome_trace(last.timeline, args.trace, title=f"{name} {last.label}")
        print(f"trace ({last.label}) -> {args.trace}  (open in https://ui.perfetto.dev)")
    if args.png:
        from verl_digen.schedule.export import save_gantt_png

        save_gantt_png(last.timeline, args.png, title=f"{name}: {last.label}", max_steps=args.png_steps)
        print(f"gantt ({last.label}) -> {args.png}")
    if args.json:
        colos = {b: _colocated(results, b) for b in BASELINES}
        naive = next((r.step_time for r in results if r.config.mode == SEPARATE), None)
        print(json.dumps([{**r.row(), "preset": name, "rung": r.label, "step_s": r.step_time,
                           "speedup_vs_naive": naive / r.step_time if naive else None,
                           "speedup_vs_colocated": colos[args.baseline] / r.step_time if colos[args.baseline] else None,
                           **{f"speedup_vs_colocated_{b.replace('-', '_')}": c / r.step_time if c else None
                              for b, c in colos.items()}} for r in results]))
    return 0


def _prices(spec: str | None) -> dict[str, float]:
    """``--gpu-price A=1.2,C=2.0``: price per GPU-hour by hardware class (the name before its colon)."""
    out: dict[str, float] = {}
    for item in filter(None, (spec or "").split(",")):
        name, eq, value = item.partition("=")
        try:
            price = float(value) if eq else -1.0
        except ValueError:
            price = -1.0
        if not name.strip() or price < 0:
            raise ValueError(f"--gpu-price {item!r}: expected <hardware>=<price per GPU-hour>, e.g. A=1.2,C=2.0")
        out[name.strip()] = price
    return out


def _price_of(prices: dict[str, float], hardware: str) -> float:
    for key in (hardware, hardware.split(":")[0].strip()):
        if key in prices:
            return prices[key]
    raise ValueError(f"--gpu-price names no price for GPU {hardware!r} (known: {', '.join(prices)}); "
                     f"add {hardware.split(':')[0].strip()}=<price per GPU-hour>")


def _check_prices(prices: dict[str, float], model: CostModel) -> None:
    """Every pool's GPU has a price (before any search runs)."""
    if prices:
        for hw in (model.generator.hardware.name, model.trainer.hardware.name):
            _price_of(prices, hw)


class StatusLine:
    """Progress of a long search on a stream: one line rewritten in place on a terminal (a log file would
    keep every version of it), plain lines elsewhere; the line is ended when the block exits."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.tty, self.pending = stream, stream.isatty(), False

    def __call__(self, message: str) -> None:
        if self.tty:
            self.stream.write(f"\r\033[K  {message}")
            self.pending = True
        else:
            self.stream.write(f"  {message}\n")
        self.stream.flush()

    def __enter__(self) -> StatusLine:
        return self

    def __exit__(self, *exc) -> None:
        if self.pending:
            self.stream.write("\n")
            self.stream.flush()
            self.pending = False


def _plan_source(args: argparse.Namespace, prices: dict[str, float], progress: StatusLine):
    """(title, cost model, workload, fixed split, the search, the colocated baselines, the ceiling, the run
    config or None, a mixed cluster's (best single-type subsets, verl-omni separate s/step) or None)."""
    from verl_digen.schedule.split_search import (
        baseline_config,
        best_subsets,
        ceiling,
        colocated_baselines,
        on_budget,
        search,
        separate_baseline,
    )

    policies = tuple(args.policies.split(","))
    stal = tuple(float(x) for x in args.stalenesses.split(",")) if args.stalenesses else None
    if args.recipe or args.overrides:
        from verl_digen.config import compose, planning
        from verl_digen.config.plan import cluster

        cfg = compose(args.overrides, config_name=args.recipe or "digen",
                      config_dir=_recipes_dir() if args.recipe else None)
        found = cluster(cfg)
        if found is not None:
            _check_prices(prices, found[0])
        cp = planning.plan_config(cfg, gpus=args.gpus, policies=policies, stalenesses=stal,
                                  min_trainers=args.min_trainers, keep=args.top, progress=progress,
                                  colocated=args.colocated)
        mixed = None
        if cp.fixed_split:  # mixed pools: the single-type runs (memory-checked) and verl-omni's separate mode
            from verl_digen.config.plan import resource_plan

            rp = resource_plan(cfg)
            mixed = (rp.best_subset, rp.separate_s)
        return (args.recipe or "config", cp.model, planning.workload(cfg), cp.fixed_split, cp.plan, cp.colocated,
                cp.ceiling, cfg, mixed, cp.unfit)
    name, model, wl, fixed = _load_source(args)
    _check_prices(prices, model)
    total = args.gpus or model.total_workers
    plan = search(model, wl, total, policies=policies, stalenesses=stal, min_trainers=args.min_trainers,
                  fixed_split=fixed, progress=progress, keep=args.top, colocated=args.colocated)
    plan.notes.append("memory not checked: a preset or profile has no run config (plan one with --recipe <name> "
                      "or Hydra overrides to bound the rows per pass by its memory plan)")
    cluster = on_budget(model, total)
    mixed = (best_subsets(cluster, baseline_config(wl))[0], separate_baseline(cluster, wl).step_time) if fixed else None
    return name, cluster, wl, fixed, plan, colocated_baselines(cluster, wl), ceiling(cluster, wl), None, mixed, ()


def _recipes_dir() -> str:
    from verl_digen import recipes

    return str(recipes.RECIPES_DIR)


def cmd_plan(args: argparse.Namespace) -> int:
    from verl_digen.schedule.split_search import against_baseline, ceiling_line, verdict

    prices = _prices(args.gpu_price)
    with StatusLine(sys.stderr) as progress:  # the search's progress, ended before the table
        name, cluster, wl, fixed, plan, colos, ceiling_s, cfg, mixed, unfit = _plan_source(args, prices, progress)
    total = cluster.total_workers
    subsets, separate = mixed or (None, None)
    label, base_t = against_baseline(colos, args.baseline, subsets, separate, unfit)
    print(f"{name}: {total} GPUs, batch {wl.prompts} x {wl.group_size}" +
          (" (pools fixed by the hardware)" if fixed else ""))
    if cfg is not None:  # a served judge: its GPUs and price, the same in every row and every baseline
        from verl_digen.config import judge

        line = judge.plan_line(cfg)
        if line:
            print(f"judge: {line}")
    strong, strong_t = against_baseline(colos, STRONGEST, subsets, separate, unfit)
    print(f"strongest baseline: {strong}, {strong_t:.2f} s/step (the fastest run a user has without verl-digen)")
    print("colocated, all GPUs: " + ", ".join(f"{b} {c.step_time:.2f} s" + (" (does not fit)" if b in unfit else "")
                                              for b, c in colos.items()))
    print(f"searched {plan.candidates} configurations, simulated {plan.simulated} (the others' lower bounds "
          f"cannot beat the best {args.top})")
    for note in plan.notes:
        print(f"note: {note}")
    best = plan.best
    per_hour = None
    if prices:
        g_hw, t_hw = cluster.generator.hardware.name, cluster.trainer.hardware.name
        per_hour = lambda row: row.generators * _price_of(prices, g_hw) + row.trainers * _price_of(prices, t_hw)  # noqa: E731
    head = (f"{'gen':>4s} {'train':>5s} {'mb':>3s} {'tsp':>3s} {'rows':>4s} {'units':>5s} {'policy':>12s} "
            f"{'stale':>5s} {'step (s)':>9s} {'vs base*':>8s} {'of ideal':>8s}" + (f" {'samples/$':>10s}" if prices
                                                                                  else ""))
    print(head)
    print("-" * len(head))
    for row in plan.rows:
        r = row.result
        line = (f"{row.generators:4d} {row.trainers:5d} {row.mb_size:3d} {row.tsp_degree:3d} "
                f"{_fmt(row.rows_per_pass, '4d')} {row.update_units:5d} "
                f"{'colocated' if row.mode == COLOCATED else row.policy:>12s} {row.staleness:5.2f} "
                f"{r.step_time:9.2f} {base_t / r.step_time:8.2f} {_fmt(r.fraction_of_ideal, '8.2f')}")
        if per_hour:
            line += f" {wl.prompts * wl.group_size / (r.step_time / 3600 * per_hour(row)):10.1f}"
        print(line)
    print(f"* vs {label} ({base_t:.2f} s/step; --baseline picks another); rows: (sample x step) rows per trainer "
          "rank per pass (- : what the "
          "TSP degree gives); units: release units per update; colocated: trainer=colocated on every GPU")
    print(ceiling_line(best.result.step_time, ceiling_s, colos, total, heterogeneous=fixed))
    if per_hour:
        price = per_hour(best)
        if len({round(per_hour(row), 9) for row in plan.rows}) == 1:
            print(f"note: every layout here costs {price:g}/hour (all {total} GPUs, the same pools), so the cheapest "
                  "per sample is the fastest; compare --gpus budgets to trade speed for cost")
        else:
            cheapest = max(plan.rows, key=lambda row: 1 / (row.result.step_time * per_hour(row)))
            if cheapest is not best:
                print(f"cheapest per sample: {cheapest.generators} generate + {cheapest.trainers} train "
                      f"({cheapest.result.step_time:.2f} s/step at {per_hour(cheapest):g}/hour)")
        # the baseline's own GPUs: all of them, or a mixed cluster's single-type subset
        sub = next((x for x in (subsets or {}).values() if label.startswith("best-subset")
                    and x.result.step_time == base_t), None)
        base_price = price if sub is None else sub.gpus * _price_of(prices, sub.hardware)
        where = "on the same GPUs" if sub is None else f"on its {sub.gpus} GPUs at {base_price:g}/hour"
        print(f"cost: {best.result.step_time / 3600 * price:.3f} per step at {price:g}/hour for these "
              f"{total} GPUs, {label} {base_t / 3600 * base_price:.3f} {where}")
    for line in verdict(best, colos, cluster, args.baseline, subsets, separate, unfit):
        print(line)
    if cfg is not None:
        from verl_digen.config import planning

        launch = (f"recipes/launch/{args.recipe}.sh" if args.recipe else "python -m verl_digen.main")
        print("launch: " + " ".join([launch, *args.overrides, *planning.overrides(best, cfg)]))
    if args.json:
        print(json.dumps([{**row.as_dict(), "strongest_baseline": strong,
                           "vs_strongest": strong_t / row.result.step_time,
                           **{f"speedup_vs_colocated_{b.replace('-', '_')}":  # null: it does not fit
                              None if b in unfit else c.step_time / row.result.step_time for b, c in colos.items()},
                           **({"samples_per_cost": wl.prompts * wl.group_size /
                               (row.result.step_time / 3600 * per_hour(row))} if per_hour else {})}
                          for row in plan.rows]))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """Gantt and curves of the runs a trace dir holds (drawn from the files a run leaves)."""
    from verl_digen.reporting.plots import plot_trace_dir

    if args.gantt_steps < 0:
        raise ValueError(f"--gantt-steps must be >= 0 (0 draws every step), got {args.gantt_steps}")
    written = plot_trace_dir(args.trace_dir, out_dir=args.out, mode=args.mode, gantt_steps=args.gantt_steps)
    for path in written:
        print(f"wrote {path}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``digen export <checkpoint> <dir>``: a diffusers transformer (full fine-tune) or a PEFT adapter (LoRA)."""
    from verl_digen.workers.checkpoint import CheckpointError
    from verl_digen.workers.export import export_checkpoint

    try:
        info = export_checkpoint(args.checkpoint, args.out, ema=args.ema)
    except CheckpointError as err:
        raise ValueError(str(err)) from None
    if not info["verified"]:
        print(f"{args.checkpoint}: unverified, it has no checksums (saved by a verl-digen from before they were "
              "written)")
    where = Path(args.out) / (info.get("adapter") or info.get("transformer"))
    what = "the EMA of step" if args.ema else "step"
    print(f"exported {what} {info['step']} of {args.checkpoint} ({info['kind']}, {info['transformer_class']}) -> "
          f"{where}")
    return 0


def _add_simulate_parser(sub: argparse._SubParsersAction) -> None:
    """`digen simulate`: the ablation ladder of one workload, or one mode of it."""
    sim = sub.add_parser("simulate", help="predict step time of every mode (the ablation ladder)")
    _add_source_args(sim)
    sim.add_argument("--generators", type=int, help="override the generator pool size")
    sim.add_argument("--trainers", type=int, help="override the trainer pool size")
    sim.add_argument("--only", choices=[COLOCATED, SEPARATE, DIGEN], help="simulate one mode instead of the ladder")
    sim.add_argument("--noise", type=float, default=0.0, help="log-normal sigma on every duration")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--trace", help="write a Chrome/Perfetto trace JSON of the last row")
    sim.add_argument("--png", help="write a Gantt PNG of the last row")
    sim.add_argument("--png-steps", type=int, default=2, help="steps shown in the PNG (default 2)")
    sim.add_argument("--dump-profile", help="write the cost model (and workload) as a profile YAML/JSON")
    sim.set_defaults(func=cmd_simulate)


def _add_plan_parser(sub: argparse._SubParsersAction) -> None:
    """`digen plan`: the search over splits and policies, for a preset or a recipe's own job."""
    plan = sub.add_parser("plan", help="best split, micro-batch, rows per pass, update size, TAG policy and staleness")
    _add_source_args(plan, strongest=True)
    plan.add_argument("--recipe", help="plan a recipe's job (its batch, model, pools, memory); "
                      "see python -m verl_digen.recipes")
    plan.add_argument("overrides", nargs="*", help="Hydra overrides of the recipe (or of the packaged config): "
                      "plan that run config")
    plan.add_argument("--gpu-price", dest="gpu_price",
                      help="price per GPU-hour by hardware class, e.g. A=1.2,C=2.0: adds samples per unit of cost")
    plan.add_argument("--gpus", type=int, help="total GPU budget (default: the preset's)")
    plan.add_argument("--generators", type=int, help=argparse.SUPPRESS)
    plan.add_argument("--trainers", type=int, help=argparse.SUPPRESS)
    plan.add_argument("--policies", default="never,adaptive,bts")
    plan.add_argument("--stalenesses", help="comma list (default: 0 and the workload's)")
    plan.add_argument("--min-trainers", dest="min_trainers", type=int, default=1)
    plan.add_argument("--top", type=int, default=10)
    plan.add_argument("--no-colocated", dest="colocated", action="store_false",
                      help="search disaggregated splits only (by default trainer=colocated on every GPU is a "
                      "candidate too)")
    plan.set_defaults(func=cmd_plan)


def _add_export_parser(sub: argparse._SubParsersAction) -> None:
    """`digen export`: a checkpoint as something a diffusers user can load."""
    exp = sub.add_parser("export", help="a deployable export of a checkpoint: diffusers transformer or PEFT adapter")
    exp.add_argument("checkpoint", help="a complete checkpoint directory (.../global_step_<N>)")
    exp.add_argument("out", help="output directory")
    exp.add_argument("--ema", action="store_true", help="export the EMA of the trained weights (actor.ema_decay)")
    exp.set_defaults(func=cmd_export)


def _add_plot_parser(sub: argparse._SubParsersAction) -> None:
    """`digen plot`: a finished run's pictures, redrawn from its trace dir."""
    plot = sub.add_parser("plot", help="draw the Gantt chart and the curves of a run from its trace dir")
    plot.add_argument("trace_dir", help="a run's trainer.trace_dir (<mode>_timeline.json, <mode>_metrics.jsonl)")
    plot.add_argument("--mode", help="only this run's files (default: every mode found)")
    plot.add_argument("--out", help="write the PNGs here (default: the trace dir)")
    plot.add_argument("--gantt-steps", dest="gantt_steps", type=int, default=3,
                      help="steps shown in the Gantt, from the first (default %(default)s; 0: all)")
    plot.set_defaults(func=cmd_plot)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="digen", description="verl-digen tools")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_simulate_parser(sub)
    _add_plan_parser(sub)
    _add_export_parser(sub)
    _add_plot_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"digen: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
