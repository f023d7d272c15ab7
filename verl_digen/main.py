"""``python -m verl_digen.main [overrides]``: the main training job (Hydra).

``trainer=digen`` (default) runs the disaggregated scheduler, ``trainer=colocated`` and
``trainer=separate`` the baselines on the same code. With no overrides it trains the embedded default:
a tiny random-weight FLUX-architecture model on a learnable offline reward, 1 generator + 1 trainer
worker on CPU, 10 steps, ending with a summary table.
"""

from __future__ import annotations

import gc
import re
import sys

import hydra
from omegaconf import DictConfig

from verl_digen.config import ConfigError, RunConfig, checks, load, validate
from verl_digen.config.planning import resolve_auto


def _mean(rows: list[dict], key: str) -> float | None:
    """The mean of ``key`` over the rows that report it; None where none does (e.g. a colocated run's pools)."""
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else None


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _steps_run(reports) -> str:
    """How many steps this process ran, and which, when a resume started it past step 1."""
    first, last = reports[0].step, reports[-1].step
    return str(len(reports)) if first <= 1 else f"{len(reports)} (steps {first}-{last}, resumed after {first - 1})"


def summary_table(reports, cfg: RunConfig) -> str:
    """Throughput, bubbles and reward at start vs end of a run ("n/a" where the mode measures nothing)."""
    if not reports:
        return "no steps were run"
    m = [r.metrics for r in reports]
    quarter = max(1, len(m) // 4)
    steady = m[1:] or m  # the first step pays warm-up (allocations, first BTS solve)

    def pair(pool: str) -> str:
        if pool == "generator" and cfg.trainer.mode == "colocated":  # every worker is in the one (trainer) pool
            return "n/a"
        busy, bubble = (_mean(steady, f"pool/{pool}_{k}") for k in ("busy", "bubble"))
        return f"{_fmt(busy, '.2f')} / {_fmt(bubble, '.2f')}"

    workers = (f"{cfg.total_workers} colocated" if cfg.trainer.mode == "colocated" else
               f"{cfg.resources.generator.workers} + {cfg.resources.trainer.workers}")
    rows = [
        ("mode", cfg.trainer.mode),
        ("workers (generator + trainer)", workers),
        ("steps", _steps_run(reports)),
        ("step time (s, after step 1)", _fmt(_mean(steady, "timing/step_s"), ".3f")),
        ("samples_per_worker_s", _fmt(_mean(steady, "perf/samples_per_worker_s"), ".3f")),
        ("generator busy / bubble", pair("generator")),
        ("trainer busy / bubble", pair("trainer")),
        ("fraction of ideal", _fmt(_mean(steady, "perf/fraction_of_ideal"), ".2f")),
        ("reward (first quarter)", _fmt(_mean(m[:quarter], "reward/mean"), "+.4f")),
        ("reward (last quarter)", _fmt(_mean(m[-quarter:], "reward/mean"), "+.4f")),
    ]
    width = max(len(k) for k, _ in rows) + 2
    return "\n".join(f"{k:<{width}}{v:>16}" for k, v in rows)


def run(cfg: RunConfig, log=print):
    """Validate, train, and print the summary; returns the run result."""
    from verl_digen.driver.runtime import DigenRuntime

    runtime = DigenRuntime(cfg, log=log)
    try:
        result = runtime.fit()
    finally:
        runtime.shutdown()  # workers and placement groups released, checkpoint lock dropped
    log("")
    log(summary_table(result.reports, cfg))
    if result.trace_path:
        log(f"\ntrace: {result.trace_path} (open in ui.perfetto.dev)")
    return result


def resume_command(checkpoint: str, argv: list[str] | None = None) -> str:
    """This command line with ``trainer.resume_from`` pointing at ``checkpoint``."""
    args = [a for a in (sys.argv[1:] if argv is None else argv) if not a.lstrip("+").startswith("trainer.resume_from=")]
    return " ".join(["python -m verl_digen.main", *args, f"trainer.resume_from={checkpoint}"])


def _stopped_line(reason: str, checkpoint: str | None) -> str:
    if checkpoint:
        return f"{reason}; resume with: {resume_command(checkpoint)}"
    return f"{reason}; no checkpoint to resume from (trainer.save_freq > 0 writes them)"


@hydra.main(config_path="config", config_name="digen", version_base=None)
def _hydra_main(raw: DictConfig) -> None:
    try:
        cfg = resolve_auto(load(raw))  # digen.plan=auto: the planner's configuration for this job
        warnings = validate(cfg)
    except ConfigError as err:
        print(f"invalid configuration: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if cfg.trainer.dry_run:
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
        print(dry_run(cfg))
        return
    done = checks.finished(cfg)
    if done is not None:  # before Ray and the workers start (about 90 s on a cluster)
        print(done)
        return
    from verl_digen.driver.runtime import RunStopped  # torch, Ray and verl: a dry run needs none of them

    try:
        run(cfg)
    except ConfigError as err:  # e.g. pools that the Ray cluster cannot place
        print(f"invalid configuration: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except RunStopped as stop:  # a signal, or non-finite values: one line, the exact resume command
        print(_stopped_line(stop.reason, stop.checkpoint), file=sys.stderr)
        raise SystemExit(stop.exit_code) from None
    except KeyboardInterrupt:  # Ctrl-C outside the step loop (start-up)
        print("interrupted before training started; nothing to resume", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception as err:  # a dead worker, a failed call: what happened, then what to do next
        import ray

        if not isinstance(err, ray.exceptions.RayActorError):  # a dead worker: its traceback says nothing more
            import traceback

            from verl_digen.driver.faults import plain

            print(plain(traceback.format_exc()), file=sys.stderr, end="")
        print(failure_line(err, cfg), file=sys.stderr)
        raise SystemExit(1) from None


def failure_line(err: BaseException, cfg: RunConfig, argv: list[str] | None = None) -> str:
    """The last line of a failed run (a dead trainer rank, a generator out of restarts, a failed call):
    what happened, and the exact command to resume from the latest complete checkpoint."""
    import ray

    from verl_digen.driver.faults import dead_note, plain
    from verl_digen.workers.checkpoint import latest

    dead = dead_note(err)  # who died, as the driver found out (the error names the call that noticed)
    if isinstance(err, ray.exceptions.RayActorError):
        who = f"{dead} died" if dead else "a worker died"
        what = f"{who} ({type(err).__name__}: {plain(str(err)).strip().splitlines()[0][:200]})"
    elif dead:
        what = f"{dead} died (noticed as {type(err).__name__}: {plain(str(err)).strip().splitlines()[0][:200]})"
    elif isinstance(err, ray.exceptions.RayTaskError) and isinstance(err.cause, BaseException):
        # the worker's own error first, then the call and its process (Ray's first line: ray::Class.method() (pid=..))
        cause = plain(str(err.cause)).strip()
        head = plain(str(err).strip().split("\n", 1)[0])  # Ray colours its first line
        call = re.match(r"\s*(ray::\S+?\(\)).*?pid=(\d+)", head)
        where = f"{call[1]} on pid {call[2]}" if call else (head[:120] or "a worker call")
        what = f"{type(err.cause).__name__}" + (f": {cause.splitlines()[0][:300]}" if cause else "") + f" (in {where})"
    else:  # the message's first line: a failed call carries the worker and its error there
        first = plain(str(err)).strip().splitlines()[0][:300] if str(err).strip() else ""
        what = f"{type(err).__name__}: {first}" if first else type(err).__name__
    found = latest(cfg.trainer.default_local_dir) if cfg.trainer.save_freq > 0 else None
    reason = f"the run failed: {what}"
    if found:
        return f"{reason}; resume with: {resume_command(str(found), argv)}"
    return _stopped_line(reason, None)


def dry_run(cfg: RunConfig) -> str:
    """The resolved config and the resource plan, without starting Ray."""
    from omegaconf import OmegaConf

    from verl_digen.config.memory import memory_plan
    from verl_digen.config.plan import resource_plan
    from verl_digen.config.stop_plan import stop_plan
    from verl_digen.rewards.names import CUSTOM

    mem = memory_plan(cfg)
    plan = resource_plan(cfg)
    shown = OmegaConf.structured(cfg)
    if cfg.custom_reward_function.path and not cfg.reward.weights and not cfg.reward.functions:
        shown.reward.name = CUSTOM  # the default name is replaced by the custom function: print what runs
    text = OmegaConf.to_yaml(shown)
    if cfg.reward.functions:
        text += f"# the reward is reward.functions ({', '.join(cfg.reward.functions)}); reward.name is not used\n"
    text += "\n" + plan.render() + "\n"
    text += (mem.render() if mem is not None else
             "memory plan: model size unknown (set digen.profile to a preset for an estimate)")
    return text + "\n" + stop_plan(cfg, plan.predicted_step_s).render()


def verl_name_error(argv: list[str]) -> str | None:
    """Hydra refuses an override of a key the config lacks with advice to add ``+``, which then fails again
    without naming ours: for verl's names of our keys (``VERL_NAMES``) say which key to use, before Hydra."""
    from verl_digen.config.schema import VERL_NAMES

    for arg in argv:
        key, eq, value = arg.lstrip("+~").partition("=")
        if eq and key in VERL_NAMES:
            return (f"invalid configuration: {key}={value} is verl's name; verl-digen reads "
                    f"{VERL_NAMES[key]}={value}")
    return None


def main() -> None:
    refused = verl_name_error(sys.argv[1:])
    if refused:
        print(refused, file=sys.stderr)
        raise SystemExit(2)
    try:
        _hydra_main()
    finally:
        # the interpreter's last collection walks every object the run created and imported (torch, diffusers,
        # Ray): seconds on a busy machine, counted against a scheduler's grace; nothing is left to collect
        gc.freeze()


if __name__ == "__main__":
    main()
