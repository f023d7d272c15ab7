"""Soak: does the driver's per-step time and the memory of every process stay flat over a long run?

Two runs of the default tiny config, and Ray alone at the real run's pace (docs/benchmarks.md, "Soak"):

- ``sim``: the scheduler on the simulator's virtual clock (no Ray), with the runtime's per-step driver
  work on every optimizer step: the recent-records window, the step's metrics and BTS figures, and the
  timeline streamed to a .jsonl file and then dropped from memory. ``driver_ms`` is the wall time of
  each step's loop (all of it is driver work here).
- ``real``: the tiny Ray run (``trainer.total_steps=N``, progress off). ``driver_ms`` is the driver's
  busy time per step: its wall time outside ``ray.wait`` (launching actions, collecting results,
  metrics, logging, the streamed timeline). ``rss_mb`` is sampled every step for the driver and each
  worker (psutil on the workers' pids).
- ``ray``: no verl-digen, the same number of actor calls per step as the real run made, at its step
  time, as many of them leaving a result in the object store (owned by the driver, passed on to a second
  call, never fetched) as the run's generations and publishes do (``ray_store_results_per_step``): the
  driver's growth that is Ray's own. The real row's ``driver_kb_per_step_over_ray`` is the real driver's
  growth minus this one (verl-digen's share).

One JSON row per run: ``steps``, ``driver_ms_per_step`` (mean), ``rss_mb`` (last sample per process),
and the growth ratios last-10% / first-10% of the steps (medians of each tenth, so one cold first step
does not flatter the ratio): ``driver_ms_growth`` and ``rss_growth`` (the largest over the processes;
``rss_growth_by_process`` has each), and ``rss_kb_per_step``: each process's growth per step in KB
(last tenth's median minus the first's, over the steps between them).
``rss_kb_per_step_second_half`` is the least-squares slope over the second half of the steps alone.
With ``--warmup N`` (and N + 10 steps or more), each row also has the growth after the first N steps,
as the tenths' difference (``*_after_warmup``) and as the least-squares slope over every later sample
(``*_fit_after_warmup``: native memory grows in jumps, and the tenths' medians move with where the last
one fell), for the driver's RSS and its split: private (``RssAnon``), shared (``RssShmem``: pages of Ray's
object store it has mapped) and the C heap's bytes in use (glibc's ``mallinfo2``). Each fit has its
standard error beside it (``*_se``: a lower bound, memory grows in steps). The real row carries the
Ray-alone row's fits beside its own (``*_ray_alone``) and issue 45's verdict (``target``: the driver's RSS
fit after the warm-up, its error, the steps it covers, ``met``).

Targets: every growth <= 1.2; the driver's growth per step after the warm-up (the fit) <= 1 KB over at
least 300 real steps (issue 45; the ``ray`` row shows how much of it is Ray's).

    python bench/soak.py --json                     # 5,000 simulated + 1,000 real steps (the real run is slow)
    python bench/soak.py --json --steps 350 --sim-steps 500 --warmup 50   # issue 45's rows (~4 min)
    python bench/soak.py --json --skip-real
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import functools
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from array import array
from pathlib import Path

os.environ.setdefault("VERL_PLATFORM", "cpu")

import psutil  # noqa: E402

from verl_digen.config import compose  # noqa: E402
from verl_digen.driver.outputs import RunOutputs  # noqa: E402
from verl_digen.driver.runtime import DigenRuntime  # noqa: E402
from verl_digen.reporting.metrics import schedule_metrics, window_metrics  # noqa: E402
from verl_digen.reporting.progress import Recent, forget_read  # noqa: E402
from verl_digen.reporting.trace_stream import RecordStream  # noqa: E402
from verl_digen.schedule.actions import GENERATE, PUBLISH, TAG_GENERATE  # noqa: E402
from verl_digen.schedule.costs import StageCosts  # noqa: E402
from verl_digen.schedule.executor import SimBackend, run  # noqa: E402
from verl_digen.schedule.scheduler import StepScheduler  # noqa: E402
from verl_digen.schedule.timeline import TRAINER  # noqa: E402

MB = 1024 * 1024
#: issue 45's target: the driver's resident growth after the warm-up (the least-squares fit) over at least
#: TARGET_STEPS real steps
TARGET_KB_PER_STEP, TARGET_STEPS = 1.0, 300
SPLIT = ("private", "shared", "heap_in_use")  # the driver's figures beside its RSS (``_row``)
#: the results of the Ray-alone row that stand for the run's trajectories and published weights: over Ray's
#: inline limit (100 KiB; the tiny run's trajectories are 106 KB, its weights 336 KB), so each lands in the
#: object store owned by the driver, as the run's do
STORE_RESULT_BYTES = 128 * 1024
#: the actions whose result the run keeps in the object store: a generation's trajectories, rank 0's
#: published weights (object-store sync)
STORE_KINDS = frozenset({GENERATE, TAG_GENERATE, PUBLISH})
#: seconds per action, of the order the tiny CPU run measures (the default config has no profile, and
#: all-zero prior costs would put every record at t = 0, which no real run does)
SIM_COSTS = StageCosts(generate=0.20, tag_generate=0.25, score=0.02, update=0.30, switch_to_gen=0.05,
                       switch_to_train=0.05, optimizer_step=0.02, weight_sync=0.01, publish=0.02)


def _samples() -> array:
    """A per-step sample series: 8 bytes a value, so the bench adds little of its own to the driver's growth."""
    return array("d")


def _status_kb(pid: int | str = "self") -> tuple[float, float]:
    """The process's private (``RssAnon``) and shared-memory (``RssShmem``: for the driver, the pages of Ray's
    object store it has touched, bounded by the store's size) resident bytes; (nan, nan) off Linux."""
    try:
        with open(f"/proc/{pid}/status") as f:
            st = dict(line.split(":", 1) for line in f if line.startswith("Rss"))
        return float(st["RssAnon"].split()[0]) * 1024, float(st["RssShmem"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return float("nan"), float("nan")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                       "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.cache
def _mallinfo2():
    """glibc's ``mallinfo2`` (2.33+), or None (another C library, an older glibc)."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c")).mallinfo2
    except (OSError, TypeError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


def _heap_in_use() -> float:
    """Bytes the C allocator has handed out and not had back (``uordblks + hblkhd``: every arena's chunks in
    use, and the mmapped ones), nan without glibc. Resident memory growing while this stays flat is memory
    the allocator keeps (fragmentation); this growing is memory something holds."""
    fn = _mallinfo2()
    if fn is None:
        return float("nan")
    info = fn()
    return float(info.uordblks + info.hblkhd)


def _kb_per_step(values, skip: int = 0) -> float:
    """Growth in KB per step: last tenth's median minus the first's over the steps between them, counted
    from step ``skip`` on (the warm-up left out)."""
    values = values[skip:]
    steps = len(values)
    first, last = _tenths(values)
    return (last - first) / max(1, steps - max(1, steps // 10)) / 1024


def _tenths(values: list[float]) -> tuple[float, float]:
    """Medians of the first and the last tenth (at least one value each)."""
    k = max(1, len(values) // 10)
    return statistics.median(values[:k]), statistics.median(values[-k:])


def _late_slope_kb(values: list[float]) -> float:
    """Least-squares slope in KB per step over the second half of the samples: the growth once the run is
    warm (allocator arenas, Ray's and torch's caches fill during the first steps)."""
    return _slope_kb(values, len(values) // 2)


def _slope_kb(values, skip: int = 0) -> float:
    """Least-squares slope in KB per step over the samples from step ``skip`` on. Native memory grows in
    steps (a page, a heap extension of 128 KB), so a difference of two ends moves with where the last jumps
    fell; the fit weighs every sample."""
    return _fit_kb(values, skip)[0]


def _fit_kb(values, skip: int = 0) -> tuple[float, float]:
    """The least-squares slope (KB per step) from step ``skip`` on and its standard error. The residuals
    of a memory trace are steps, not independent noise, so the error is a lower bound: it says whether a run
    resolves a slope of the target's size at all, not how two runs differ."""
    tail = values[skip:]
    n = len(tail)
    if n < 3:
        return 0.0, float("nan")
    xs = range(n)
    mx, my = statistics.fmean(xs), statistics.fmean(tail)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, tail)) / var
    resid = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, tail))
    return slope / 1024, (resid / (n - 2) / var) ** 0.5 / 1024


def _row(run: str, steps: int, driver_ms: list[float], rss: dict[str, list[float]], wall_s: float,
         warmup: int = 0, split: tuple[list[float], ...] | None = None) -> dict:
    """One run's figures; ``split``: the driver's private and shared resident bytes per step, and (where
    sampled) the C heap's bytes in use."""
    first, last = _tenths(driver_ms)
    growth = {name: (lambda f, la: la / f)(*_tenths(v)) for name, v in rss.items()}
    kb = {name: _kb_per_step(v) for name, v in rss.items()}
    after = {}
    if warmup and len(driver_ms) - warmup >= 10:
        fits = {name: _fit_kb(v, warmup) for name, v in rss.items()}  # (slope, its standard error)
        after = {"warmup_steps": warmup, "steps_after_warmup": len(driver_ms) - warmup,
                 "rss_kb_per_step_after_warmup": {name: _kb_per_step(v, warmup) for name, v in rss.items()},
                 "rss_kb_per_step_fit_after_warmup": {name: fit for name, (fit, _) in fits.items()},
                 "rss_kb_per_step_fit_after_warmup_se": {name: se for name, (_, se) in fits.items()}}
    if split is not None:
        for label, values in zip(SPLIT, split):
            after[f"driver_{label}_kb_per_step"] = _kb_per_step(values)
            if "warmup_steps" in after:
                after[f"driver_{label}_kb_per_step_after_warmup"] = _kb_per_step(values, warmup)
                fit, se = _fit_kb(values, warmup)
                after[f"driver_{label}_kb_per_step_fit_after_warmup"] = fit
                after[f"driver_{label}_kb_per_step_fit_after_warmup_se"] = se
    return {
        "run": run, "steps": steps, "driver_ms_per_step": statistics.fmean(driver_ms),
        "driver_ms_first10": first, "driver_ms_last10": last, "driver_ms_growth": last / first,
        "rss_mb": {name: v[-1] / MB for name, v in rss.items()},
        "rss_growth": max(growth.values()), "rss_growth_by_process": growth, "rss_kb_per_step": kb,
        "rss_kb_per_step_second_half": {name: _late_slope_kb(v) for name, v in rss.items()},
        "wall_s": wall_s, **after,
    }


def target(row: dict) -> dict | None:
    """Issue 45's verdict on a real row: the driver's RSS fit after the warm-up against the target, with the
    fit's standard error and its private / shared / heap parts (None without a warm-up split)."""
    if "rss_kb_per_step_fit_after_warmup" not in row:
        return None
    fit = row["rss_kb_per_step_fit_after_warmup"]["driver"]
    return {"kb_per_step": fit, "se": row["rss_kb_per_step_fit_after_warmup_se"]["driver"],
            "limit_kb_per_step": TARGET_KB_PER_STEP, "steps": row["steps_after_warmup"],
            "met": fit <= TARGET_KB_PER_STEP and row["steps_after_warmup"] >= TARGET_STEPS}


def soak_sim(steps: int, out_dir: str, warmup: int = 0) -> dict:
    """The scheduler + simulator with the runtime's per-step driver work (see the module docstring)."""
    cfg = compose(["trainer.progress=false", "trainer.logger=[]"])
    costs = SIM_COSTS
    sched = StepScheduler(cfg.schedule_config(steps=steps), costs, gen_workers=cfg.resources.generator.workers,
                          trainer_ranks=cfg.resources.trainer.workers)
    gen_names, trn_names = list(sched.gens), [TRAINER, *sched.slots]
    window, decisions = Recent(sched.timeline.records), Recent(sched.decisions)
    stream = RecordStream(Path(out_dir, "sim_timeline.jsonl"), sched.timeline.records, {"mode": "sim"})
    proc = psutil.Process()
    driver_ms, rss = _samples(), _samples()
    state = {"last_end": 0.0, "prev_start": 0.0, "t": time.perf_counter()}

    def on_complete(c) -> None:
        a, end = c.action, c.end
        if not a.ends_step:
            return
        recent = window.since(lambda r: r.end >= state["prev_start"] - 1e-9)
        step_dec = decisions.since(lambda d: d.step >= a.step - 1)
        window_metrics(recent, state["last_end"], end, gen_names, trn_names)
        schedule_metrics(sched, a.step, state["last_end"], end - state["last_end"], recent, step_dec)
        stream.flush()
        forget_read(sched.timeline.records, window, stream)
        forget_read(sched.decisions, decisions)
        state["prev_start"], state["last_end"] = state["last_end"], end
        now = time.perf_counter()
        driver_ms.append(1e3 * (now - state["t"]))
        rss.append(float(proc.memory_info().rss))
        state["t"] = now

    t0 = time.perf_counter()
    run(sched, SimBackend(costs, noise=0.1, seed=0), on_complete, check=False)
    stream.close()
    return _row("sim", steps, driver_ms, {"driver": rss}, time.perf_counter() - t0, warmup)


def soak_real(steps: int, out_dir: str, warmup: int = 0) -> dict:
    """The tiny Ray run; driver busy time = wall time outside ``ray.wait``, per step."""
    import ray

    cfg = compose([f"trainer.total_steps={steps}", "trainer.progress=false", "trainer.logger=[]",
                   f"trainer.trace_dir={out_dir}/trace", f"trainer.default_local_dir={out_dir}/ckpt"])
    blocked = [0.0]
    real_wait = ray.wait

    def timed_wait(*args, **kwargs):
        t = time.perf_counter()
        try:
            return real_wait(*args, **kwargs)
        finally:
            blocked[0] += time.perf_counter() - t

    trainer = DigenRuntime(cfg, log=lambda _: None)
    driver_ms, private, shared, in_use = _samples(), _samples(), _samples(), _samples()
    rss: dict[str, array] = {}
    procs: dict[str, psutil.Process] = {"driver": psutil.Process()}
    report = RunOutputs.report
    mark = {"t": 0.0, "blocked": 0.0}

    def sampled_report(self, result, step, metrics):
        report(self, result, step, metrics)
        now = time.perf_counter()
        driver_ms.append(1e3 * ((now - mark["t"]) - (blocked[0] - mark["blocked"])))
        mark["t"], mark["blocked"] = now, blocked[0]
        for name, p in procs.items():
            if name not in rss:
                rss[name] = _samples()
            rss[name].append(float(p.memory_info().rss))
        a, sh = _status_kb()
        private.append(a)
        shared.append(sh)
        in_use.append(_heap_in_use())

    RunOutputs.report = sampled_report  # where each completed step's report is recorded (and the heap trimmed)
    ray.wait = timed_wait
    try:
        trainer.init_workers()
        for name, wg in (("gen", trainer.gen_wg), ("trainer", trainer.trn_wg)):
            for i, w in enumerate(wg.workers if wg is not None else []):
                procs[f"{name}{i}"] = psutil.Process(ray.get(w.runtime_info.remote())["pid"])
        t0 = mark["t"] = time.perf_counter()
        result = trainer.fit()
        wall = time.perf_counter() - t0
    finally:
        ray.wait = real_wait
        RunOutputs.report = report
        trainer.shutdown()
    row = _row("real", steps, driver_ms, rss, wall, warmup, (private, shared, in_use))
    row["ray_calls_per_step"] = len(result.timeline.records) / steps  # one call per worker an action ran on
    row["ray_store_results_per_step"] = store_results_per_step(result.timeline.records, steps)
    return row


def store_results_per_step(records, steps: int) -> float:
    """The results per step the run keeps in the object store, owned by the driver (one per generation and
    per publish: ``STORE_KINDS``), which the Ray-alone row puts there as often."""
    return sum(r.kind in STORE_KINDS for r in records) / steps


def soak_ray(steps: int, calls_per_step: int, step_s: float, warmup: int = 0, store_per_step: int = 0) -> dict:
    """Ray alone, at the real run's pace: ``calls_per_step`` calls on two actors per step, waited one by one,
    each step ``step_s`` long. ``store_per_step`` of them return a result over Ray's inline limit, which
    lands in the object store owned by the driver, and as many pass it on to the other actor as an argument
    (as a generation's trajectories go to its scoring and published weights to a pickup; the driver never
    fetches them); the rest are no-ops. The driver's growth here is Ray's own (its core worker's
    bookkeeping), the floor under the real run's; the difference is verl-digen's share. The actors are
    made as the run's are (no task events: ``driver/run_pools.py``), and the heap is trimmed after each
    step as the run's driver trims it (``driver/native_memory.py``), so both rows count the same memory."""
    import ray

    from verl_digen.driver import native_memory
    from verl_digen.driver.pools import ensure_ray, stop_own_ray

    ensure_ray(compose(["trainer.progress=false", "trainer.logger=[]"]))

    @ray.remote(num_cpus=0, enable_task_events=False)  # as the run's actors (driver/run_pools.py)
    class Echo:
        def call(self, x: int) -> int:
            return x

        def blob(self) -> bytes:
            return bytes(STORE_RESULT_BYTES)

        def take(self, blob: bytes) -> int:
            return len(blob)

    actors = [Echo.remote(), Echo.remote()]
    ray.get([a.call.remote(0) for a in actors])
    proc = psutil.Process()
    driver_ms, rss, private, shared, in_use = _samples(), _samples(), _samples(), _samples(), _samples()
    t0 = time.perf_counter()
    try:
        for step in range(1, steps + 1):
            start = time.perf_counter()
            blobs = [actors[i % 2].blob.remote() for i in range(store_per_step)]
            pending = [*blobs, *(actors[(i + 1) % 2].take.remote(b) for i, b in enumerate(blobs)),
                       *(actors[i % 2].call.remote(i) for i in range(max(0, calls_per_step - 2 * store_per_step)))]
            stored = set(blobs)
            del blobs
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                if done[0] not in stored:  # the run fetches receipts, never what it keeps in the store
                    ray.get(done)
            native_memory.trim(step)  # as the run's driver after each step (RunOutputs.report)
            driver_ms.append(1e3 * (time.perf_counter() - start))
            rss.append(float(proc.memory_info().rss))
            a, sh = _status_kb()
            private.append(a)
            shared.append(sh)
            in_use.append(_heap_in_use())
            time.sleep(max(0.0, step_s - (time.perf_counter() - start)))
        wall = time.perf_counter() - t0
    finally:
        stop_own_ray()
    return _row("ray", steps, driver_ms, {"driver": rss}, wall, warmup, (private, shared, in_use))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the rows as one JSON list on the last line")
    ap.add_argument("--steps", type=int, default=1000, help="steps of the real (Ray) run")
    ap.add_argument("--sim-steps", type=int, default=5000, help="steps of the simulated run")
    ap.add_argument("--skip-real", action="store_true", help="only the simulated run (no Ray)")
    ap.add_argument("--warmup", type=int, default=100,
                    help="steps left out of the *_after_warmup figures (Ray's and the allocator's first fill); "
                    "a run needs 10 more for them")
    args = ap.parse_args()
    if args.warmup < 0:
        sys.exit(f"--warmup must be >= 0, got {args.warmup}")  # a run shorter than warmup + 10 has no *_after_warmup
    if args.steps < 10 or args.sim_steps < 10:
        sys.exit(f"--steps and --sim-steps must be >= 10 (a tenth of the run is compared), got "
                 f"{args.steps} and {args.sim_steps}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="digen-soak-") as out:
        rows.append(soak_sim(args.sim_steps, out, args.warmup))
        if not args.skip_real:
            real = soak_real(args.steps, out, args.warmup)
            rows.append(real)
            with multiprocessing.get_context("spawn").Pool(1) as fresh:  # a process of its own, as the real run's
                ray_only = fresh.apply(soak_ray, (args.steps, round(real["ray_calls_per_step"]),
                                                  real["wall_s"] / args.steps, args.warmup,
                                                  round(real["ray_store_results_per_step"])))
            rows.append(ray_only)
            real["driver_kb_per_step_over_ray"] = (real["rss_kb_per_step"]["driver"]
                                                   - ray_only["rss_kb_per_step"]["driver"])
            if "warmup_steps" in real:
                real["target"] = target(real)
                for label in SPLIT:
                    key = f"driver_{label}_kb_per_step_fit_after_warmup"
                    real[f"{key}_ray_alone"] = ray_only[key]
    for r in rows:
        rss = ", ".join(f"{k} {v:.0f}" for k, v in r["rss_mb"].items())
        print(f"{r['run']:>4s} {r['steps']:5d} steps: driver {r['driver_ms_per_step']:.2f} ms/step "
              f"(first tenth {r['driver_ms_first10']:.2f}, last {r['driver_ms_last10']:.2f}, growth "
              f"{r['driver_ms_growth']:.2f}); RSS MB {rss}; RSS growth {r['rss_growth']:.3f}; driver "
              f"{r['rss_kb_per_step']['driver']:+.2f} KB/step ({r['rss_kb_per_step_second_half']['driver']:+.2f} over "
              f"the second half); {r['wall_s']:.0f} s")
        if "rss_kb_per_step_after_warmup" in r:
            for how, suffix in (("tenths", ""), ("fit", "_fit")):
                split = "".join(f", {label} {r[f'driver_{label}_kb_per_step{suffix}_after_warmup']:+.2f}"
                                for label in SPLIT
                                if f"driver_{label}_kb_per_step{suffix}_after_warmup" in r)
                print(f"     after the first {r['warmup_steps']} steps ({r['steps_after_warmup']} steps, {how}): "
                      f"driver {r[f'rss_kb_per_step{suffix}_after_warmup']['driver']:+.2f} KB/step{split}")
        if r.get("target"):
            t = r["target"]
            print(f"     target (issue 45): driver {t['kb_per_step']:+.2f} +- {t['se']:.2f} KB/step after the warm-up "
                  f"over {t['steps']} steps, limit {t['limit_kb_per_step']:g} over >= {TARGET_STEPS}: "
                  f"{'met' if t['met'] else 'NOT met'}")
        if "driver_kb_per_step_over_ray" in r:
            print(f"     driver growth over Ray's own: {r['driver_kb_per_step_over_ray']:+.2f} KB/step")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
