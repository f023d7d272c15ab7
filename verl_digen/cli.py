"""The ``digen`` command: ``digen simulate`` (ablation table for a preset or profile) and ``digen plan``
(best generator/trainer split for a GPU budget). Also ``python -m verl_digen.cli``.

Subcommands are argparse subparsers registered in ``build_parser``; add new ones there.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace

from verl_digen.schedule import presets as preset_lib
from verl_digen.schedule.config import COLOCATED, DIGEN, SEPARATE, ScheduleConfig
from verl_digen.schedule.costs import CostModel
from verl_digen.schedule.profile_io import Workload, dump_profile, load
from verl_digen.schedule.simulator import SimResult, ablation_configs, simulate


def _load_source(args: argparse.Namespace) -> tuple[str, CostModel, Workload]:
    if args.profile:
        model, wl = load(args.profile)
        name = args.profile
    else:
        p = preset_lib.get(args.preset)
        model, wl, name = p.model, p.workload, p.name
    wl = wl or Workload()
    over = {k: getattr(args, k) for k in ("prompts", "group_size", "mb_size", "tsp_degree", "staleness", "steps",
                                          "policy") if getattr(args, k, None) is not None}
    wl = replace(wl, **over)
    if args.generators or args.trainers:
        model = model.with_workers(args.generators or model.generator.workers,
                                   args.trainers or model.trainer.workers)
    return name, model, wl


def _add_source_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--policy", help="TAG policy: never, static:K, adaptive[:R], bts")
    p.add_argument("--json", action="store_true", help="print the rows as JSON on the last line")


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _table(results: list[SimResult]) -> str:
    colo = next((r.step_time for r in results if r.config.mode == COLOCATED), None)
    naive = next((r.step_time for r in results if r.config.mode == SEPARATE), None)
    head = (f"{'configuration':28s} {'step (s)':>9s} {'samples/GPU/s':>13s} {'vs colo':>8s} {'vs naive':>8s} "
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


def cmd_simulate(args: argparse.Namespace) -> int:
    name, model, wl = _load_source(args)
    if args.dump_profile:
        dump_profile(model, args.dump_profile, name=name, workload=wl)
    base = ScheduleConfig(prompts=wl.prompts, group_size=wl.group_size, mb_size=wl.mb_size, steps=wl.steps)
    if args.only:
        cfg = ScheduleConfig(prompts=wl.prompts, group_size=wl.group_size, mb_size=wl.mb_size, steps=wl.steps,
                             mode=args.only, partition="gap" if args.only == DIGEN else "batch",
                             tsp_degree=wl.tsp_degree if args.only == DIGEN else 1,
                             policy=wl.policy if args.only == DIGEN else "never",
                             staleness=wl.staleness if args.only == DIGEN else 0.0)
        if args.only != DIGEN:
            cfg = replace(cfg, mb_size=wl.group_size)
        runs = [(args.only, cfg)]
    else:
        runs = ablation_configs(base, wl.mb_size, wl.tsp_degree, wl.policy, wl.staleness)
    results = [simulate(cfg, model, label=label, noise=args.noise, seed=args.seed) for label, cfg in runs]
    g, r = model.generator, model.trainer
    print(f"{name}: {g.workers} x {g.hardware.name} generate, {r.workers} x {r.hardware.name} train; "
          f"batch {wl.prompts} x {wl.group_size}, micro-batch {wl.mb_size}, TSP {wl.tsp_degree}, "
          f"{wl.steps} steps")
    print(_table(results))
    last = results[-1]
    if last.bts_predicted:
        print(f"BTS predicted optimizer-step end of step 0: {last.bts_predicted[0]:.2f} s; "
              f"{len(last.bts_solve_seconds)} solves, max {max(last.bts_solve_seconds) * 1e3:.1f} ms")
    if args.trace:
        from verl_digen.schedule.export import save_chrome_trace

        save_chrome_trace(last.timeline, args.trace, title=f"{name} {last.label}")
        print(f"trace ({last.label}) -> {args.trace}  (open in https://ui.perfetto.dev)")
    if args.png:
        from verl_digen.schedule.export import save_gantt_png

        save_gantt_png(last.timeline, args.png, title=f"{name}: {last.label}", max_steps=args.png_steps)
        print(f"gantt ({last.label}) -> {args.png}")
    if args.json:
        colo = next((r.step_time for r in results if r.config.mode == COLOCATED), None)
        naive = next((r.step_time for r in results if r.config.mode == SEPARATE), None)
        print(json.dumps([{**r.row(), "preset": name, "rung": r.label, "step_s": r.step_time,
                           "speedup_vs_naive": naive / r.step_time if naive else None,
                           "speedup_vs_colocated": colo / r.step_time if colo else None} for r in results]))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from verl_digen.schedule.plan import search

    name, model, wl = _load_source(args)
    total = args.gpus or model.total_workers
    policies = tuple(args.policies.split(","))
    stal = tuple(float(x) for x in args.stalenesses.split(",")) if args.stalenesses else None
    rows = search(model, wl, total, policies=policies, stalenesses=stal, min_trainers=args.min_trainers)
    colo = simulate(ScheduleConfig(prompts=wl.prompts, group_size=wl.group_size, mb_size=wl.group_size,
                                   steps=wl.steps, mode=COLOCATED, partition="batch"), model.with_workers(
                        max(1, total // 2), total - max(1, total // 2)))
    print(f"{name}: {total} GPUs, batch {wl.prompts} x {wl.group_size}; colocated step {colo.step_time:.2f} s")
    head = (f"{'gen':>4s} {'train':>5s} {'mb':>3s} {'policy':>12s} {'stale':>5s} {'step (s)':>9s} {'vs colo':>8s} "
            f"{'of ideal':>8s}")
    print(head)
    print("-" * len(head))
    for row in rows[: args.top]:
        r = row.result
        print(f"{row.generators:4d} {row.trainers:5d} {row.mb_size:3d} {row.policy:>12s} {row.staleness:5.2f} "
              f"{r.step_time:9.2f} {colo.step_time / r.step_time:8.2f} {_fmt(r.fraction_of_ideal, '8.2f')}")
    if args.json:
        print(json.dumps([row.as_dict() for row in rows[: args.top]]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="digen", description="verl-digen tools")
    sub = parser.add_subparsers(dest="command", required=True)

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

    plan = sub.add_parser("plan", help="best generator/trainer split, TAG policy and staleness for a budget")
    _add_source_args(plan)
    plan.add_argument("--gpus", type=int, help="total GPU budget (default: the preset's)")
    plan.add_argument("--generators", type=int, help=argparse.SUPPRESS)
    plan.add_argument("--trainers", type=int, help=argparse.SUPPRESS)
    plan.add_argument("--policies", default="never,adaptive,bts")
    plan.add_argument("--stalenesses", help="comma list (default: 0 and the workload's)")
    plan.add_argument("--min-trainers", dest="min_trainers", type=int, default=1)
    plan.add_argument("--top", type=int, default=10)
    plan.set_defaults(func=cmd_plan)
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
