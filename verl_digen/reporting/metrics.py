"""Per-step metrics of a real run, derived from its timeline and the workers' results."""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from verl_digen.config.schema import RunConfig
from verl_digen.reporting import metric_names as names
from verl_digen.reporting.metric_names import TIME_KEYS
from verl_digen.schedule.actions import GENERATE, SCORE, TAG_GENERATE, UPDATE, WEIGHT_SYNC
from verl_digen.schedule.bounds import busy_fractions, window_bounds
from verl_digen.schedule.config import COLOCATED
from verl_digen.schedule.costs import (
    ALL_GATHER,
    PAIRED,
    PASS,
    SHARDED_CALLS,
    SHARDED_WORK,
    STEP,
    SWITCH,
    CostModel,
    Hardware,
    Pool,
    Sharded,
)
from verl_digen.schedule.profile_io import Workload, fit_points, fit_samples
from verl_digen.schedule.timeline import TRAINER, Record, Timeline


def window_metrics(records: list[Record], start: float, end: float, gen_workers: list[str],
                   trainer_workers: list[str], colocated: bool = False) -> dict[str, float]:
    """Busy/bubble fraction of each pool within [start, end] and summed stage times.

    Trainer pool busy = GPU-seconds busy / GPU-seconds held: a ``trainer`` (unit) record holds every
    rank, a TAG slot record one. Stage times sum each action once (a colocated phase is recorded on
    every worker: counted on the first); a generator's weight pickup is its own action."""
    times: dict[str, float] = defaultdict(float)
    for r in records:
        counted_once = not colocated or r.worker == trainer_workers[0]
        if r.kind in TIME_KEYS and counted_once and start - 1e-9 <= r.start < end:
            times[TIME_KEYS[r.kind]] += r.duration
    busy = busy_fractions(records, start, end, gen_workers, trainer_workers)
    gen_busy, trn_busy = busy["generator"], busy["trainer"]
    out = {
        names.GENERATOR_BUSY: gen_busy,
        names.GENERATOR_BUBBLE: 1.0 - gen_busy if gen_workers else 0.0,
        names.TRAINER_BUSY: trn_busy,
        names.TRAINER_BUBBLE: 1.0 - trn_busy,
    }
    for key in dict.fromkeys(TIME_KEYS.values()):  # TIME_KEYS' order, the same in every process
        out[key] = times.get(key, 0.0)
    return out


def schedule_metrics(sched: Any, step: int, step_start: float, step_s: float, records: list[Record],
                     decisions: list) -> dict[str, float]:
    """Fraction of ideal, staleness and BTS prediction of local step ``step`` of a ``StepScheduler``
    (from ``records`` and ``decisions``: a suffix of the run's that holds all of this step's)."""
    recs = [r for r in records if r.step == step]
    gens = [r for r in recs if r.kind in (GENERATE, TAG_GENERATE)]
    stale = sum(1 for r in gens if r.stale)
    # the ideal of the work this step's window held, at this step's measured costs (<= the step)
    bounds = window_bounds(records, step, step_start, sched.costs, sched.M, sched.G,
                           unit_size=sched.unit_size, update_size=sched.update_size, trainer_ranks=sched.R,
                           mini_batches=sched.config.mini_batches)
    out = {
        names.FRACTION_OF_IDEAL: bounds.ideal / step_s if step_s > 0 else 0.0,
        names.IDEAL_STEP_S: bounds.ideal,
        names.STALE_FRACTION: stale / max(sched.M, 1),
        names.TAG_MICRO_BATCHES: float(sum(1 for r in gens if r.kind == TAG_GENERATE)),
    }
    predicted = [d.predicted_end for d in decisions if d.step == step and d.predicted_end is not None]
    if predicted:  # BTS's first plan of the step vs what the step really took
        out[names.BTS_PREDICTED_STEP_S] = predicted[0] - step_start
    return out


def same_hardware(cfg: RunConfig) -> bool:
    """Whether both pools run on one hardware type (the same ``node_resource``, or none named)."""
    res = cfg.resources
    return res.generator.node_resource == res.trainer.node_resource


def pool_samples(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Generation and scoring samples of either pool, as samples of both.

    For pools of one hardware type: sampling and scoring run the same code on the same hardware
    whichever pool runs them, so a generator's measurements price TAG on a trainer rank (which a
    ``never`` run never does) and both pools' sizes pin down one per-call + per-sample cost."""
    out = list(samples)
    for s in samples:
        if s.get("kind") == TAG_GENERATE:
            out.append({"pool": "generator", "kind": GENERATE, "size": s["size"], "seconds": s["seconds"]})
        elif s.get("kind") in (GENERATE, SCORE) and s.get("pool", "generator") == "generator":
            out.append({**s, "pool": "trainer"})
    return out


def busy_others(records: list[Record], trainer_ranks: int) -> list[float]:
    """Per record, the mean number of processes busy over its span besides one of its own (a ``trainer`` record
    keeps every trainer rank busy, whose ranks share the host too; any other record one process), by one sweep
    over the records' starts and ends: the ``N - 1`` of the simulator's shared host (``executor.SimBackend``)."""
    events = sorted((t, d * (trainer_ranks if r.worker == TRAINER else 1))
                    for r in records for t, d in ((r.start, 1), (r.end, -1)))
    times, area = [], []  # the integral of (busy processes) dt up to each event time
    busy, total, last = 0, 0.0, None
    for t, d in events:
        if last is not None:
            total += busy * (t - last)
        if times and times[-1] == t:
            area[-1] = total
        else:
            times.append(t)
            area.append(total)
        busy, last = busy + d, t

    def integral(t: float) -> float:
        return area[bisect.bisect_left(times, t)]

    out = []
    for r in records:
        span = r.end - r.start
        out.append(max(0.0, (integral(r.end) - integral(r.start)) / span - 1) if span > 0 else 0.0)
    return out


#: the least an action must share its span with other processes to count as contended, and the most to count
#: as alone, when the run's contention is measured
CONTENDED, ALONE = 0.5, 0.2

#: the compute kinds whose contention a run measures (the others keep the run's own level, contention and all)
CONTENDING = (GENERATE, TAG_GENERATE, SCORE, UPDATE)


def host_contention(records: list[Record], others: list[float],
                    alone: Callable[[str, int], float] | None = None) -> dict[str, float]:
    """Per compute kind, how much each other busy process slows an action of that kind on a shared host
    (``CostModel.host_contention``): the median over its contended records (another process busy over most of
    the span) of ``(seconds / seconds alone - 1) / others``. Alone: ``alone(kind, samples)`` (the probe's, one
    action at a time), else the median of the run's own records of that kind and size with no other process
    busy (two at least). A kind with fewer than two such records gets none."""
    alone_runs: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r, o in zip(records, others, strict=True):
        if r.kind in CONTENDING and o <= ALONE and r.duration > 0:
            alone_runs[(r.kind, r.samples)].append(r.duration)
    out = {}
    for kind in CONTENDING:
        ratios = []
        for r, o in zip(records, others, strict=True):
            if r.kind != kind or o < CONTENDED or r.duration <= 0:
                continue
            ref = alone(kind, r.samples) if alone is not None else 0.0
            if not ref and len(alone_runs[(kind, r.samples)]) >= 2:
                ref = statistics.median(alone_runs[(kind, r.samples)])
            if ref:
                ratios.append((r.duration / ref - 1) / o)
        if len(ratios) >= 2:
            out[kind] = max(0.0, statistics.median(ratios))
    return out


def _alone(model: CostModel, degree: int) -> Callable[[str, int], float]:
    """Seconds of one action alone at ``samples``, by the probe's costs (``model``; 0 where it has none)."""
    def alone(kind: str, samples: int) -> float:
        if kind == UPDATE:
            return model.train_time(samples, degree, model.trainer.workers, model.trainer.hardware)
        hw = model.trainer.hardware if kind == TAG_GENERATE else model.generator.hardware
        return (hw.score if kind == SCORE else hw.generate)(samples)
    return alone


#: the kinds that run the same code on one hardware type whichever pool runs them (``pool_samples``)
GENERATION = (GENERATE, TAG_GENERATE)


def paired_contention(paired: list[dict[str, Any]], alone: Callable[[str, int], float],
                      same_hw: bool) -> dict[tuple[str, str], float]:
    """Per (kind, kind beside), how much one other process running the second slows an action of the first
    (``CostModel.host_contention_beside``), from the probe's actions run two at once (``costs.PAIRED``): the median
    over its samples of ``seconds / alone - 1`` (one other process), ``alone`` the same action's seconds run alone
    just before (the sample's ``alone``; a load that drifts over seconds moves both alike), else ``alone(kind,
    size)``: the probe's own calls one at a time. The run's overlaps measure an action beside whatever the other
    pool ran (a generation beside an update, in a ``never`` run); a colocated phase runs the same kind on both
    processes, and TAG generates beside a generator. With one hardware type the generation kinds share one figure
    (the same code on the same hardware), for every pair of them."""
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    for p in paired:
        ref = float(p.get("alone") or alone(p["action"], int(p["size"])))
        if ref > 0:
            ratios[(p["action"], p["beside"])].append(float(p["seconds"]) / ref - 1)
    if same_hw:
        gen = [x for (k, o), xs in ratios.items() if k in GENERATION and o in GENERATION for x in xs]
        if gen:
            ratios.update({(k, o): gen for k in GENERATION for o in GENERATION})
    return {pair: max(0.0, statistics.median(xs)) for pair, xs in ratios.items() if xs}


def sharding_adds(work: list[dict[str, Any]], update_contention: float = 0.0) -> tuple[dict[str, float], float]:
    """Per work (``costs.PASS``, ``SWITCH``, ``STEP``), the seconds sharding it over two of the run's processes
    added, from the probe's timings (``collective_probe.time_sharded``), each in the terms the simulator prices
    it in. A training pass: the sharded pass (both processes busy, as a colocated update runs) less the time alone,
    in time-alone units: the simulator slows an update's time alone, sharded term included, by the host's
    contention (``update_contention``: one other busy process), so the priced pass is the probe's sharded one;
    fitted per pass + per row over the sizes (the second value returned: per row). The switch and the optimizer
    step: sharded - unsharded, both busy (switches and steps are priced as measured, not slowed); the switch is the
    runtime's (``collective_probe.switch_out``): the training state stashed, shard by shard on a sharded rank,
    then the gather, where an unsharded rank only stashes its tensors (the profile's own ``switch_to_gen``)."""
    by = defaultdict(list)
    for w in work:
        by[w["work"]].append(w)
    out, per_row = {}, 0.0
    if by[PASS]:
        fit = fit_points([(float(w["size"]), max(0.0, w["sharded"] / (1 + update_contention) - w["alone"]))
                          for w in by[PASS]])
        out[PASS], per_row = fit.fixed, fit.per_unit
    if by[SWITCH]:
        out[SWITCH] = statistics.median(max(0.0, w["sharded"] - w["plain"]) for w in by[SWITCH])
    if by[STEP]:
        out[STEP] = statistics.median(max(0.0, w["sharded"] - w["plain"]) for w in by[STEP])
    return out, per_row


def measured_profile(cfg: RunConfig, timeline: Timeline,
                     probes: list[dict[str, Any]] | None = None) -> tuple[CostModel, Workload]:
    """The run's stage costs as a simulator profile, fitted from its measured records, so
    ``digen simulate --profile`` can replay (and re-plan) the same cluster.

    A colocated run measures every worker doing every stage: its phases become samples of both pools'
    hardware (generation of batch / N samples per worker, training passes of batch / N x degree rows).
    ``probes``: samples of the runtime's probe (``DigenRuntime(probe=True)``), taken one action at a
    time after the run. They fit the shape of each cost (per call vs per sample or row, at two sizes)
    and the costs the run never measured (a ``never`` run's switches); the run's own samples then set
    each cost's level, as measured under the run's concurrency (a run repeats one size, and one size
    scales the probe's shape). With both pools on one hardware type, generation and scoring are fitted
    from both pools' samples. A profile of one unsharded trainer rank also gets the probe's all-gather
    (latency + per byte), the trainer's collective counts and the probe's pass, switch and optimizer step run
    sharded over two of the run's processes (``sharding_adds``, ``costs.Sharded.from_probe``): what a sharded
    trainer (colocated, or more trainer ranks) adds per pass, switch and optimizer step, which this run never
    ran, priced per collective it issues. On a CPU host, the probe's actions two at once (``costs.PAIRED``) set
    the contention of those pairs of kinds (``paired_contention``), the run's overlaps that of every other."""
    mb = cfg.rollout.micro_batch_size
    k = cfg.trained_steps()
    degree = cfg.digen.tsp.degree or k
    res = cfg.resources
    base = CostModel(Pool(Hardware(res.generator.node_resource or "generator"), res.generator.workers),
                     Pool(Hardware(res.trainer.node_resource or "trainer"), res.trainer.workers),
                     steps_trained=k, sequence_parallel=cfg.actor.ulysses_sequence_parallel_size)
    gathers, counts, work, paired = [], None, [], []
    if probes:
        gathers = [(float(p["size"]), float(p["seconds"])) for p in probes if p.get("kind") == ALL_GATHER]
        counts = next((p for p in probes if p.get("kind") == SHARDED_CALLS), None)
        work = [p for p in probes if p.get("kind") == SHARDED_WORK]
        paired = [p for p in probes if p.get("kind") == PAIRED]
        probes = [p for p in probes if p.get("kind") not in (ALL_GATHER, SHARDED_CALLS, SHARDED_WORK, PAIRED)]
        base = fit_samples(base, pool_samples(probes) if same_hardware(cfg) else probes)
    samples = []
    contention: dict[str, float] = {}
    beside: dict[tuple[str, str], float] = {}
    records = timeline.records
    steps = {r.step for r in records}
    if len(steps) > 1:  # the first step is warm-up (allocator, caches, first BTS solves): not a cost
        records = [r for r in records if r.step != min(steps)]
    if timeline.mode == COLOCATED:
        n = cfg.total_workers
        per_worker = cfg.batch // n
        passes = -(-k // degree)
        for r in records:
            if r.worker != timeline.workers[0]:
                continue
            if r.kind in (GENERATE, SCORE):
                for pool in ("generator", "trainer"):
                    samples.append({"pool": pool, "kind": r.kind, "size": per_worker, "seconds": r.duration})
            elif r.kind == UPDATE:
                samples.append({"pool": "trainer", "kind": "train_pass", "size": per_worker * degree,
                                "seconds": r.duration / passes})
            else:
                samples.append({"kind": r.kind, "seconds": r.duration})
    else:
        # CPU pools share the host's cores: each action's time alone, and how much each other busy process
        # adds to it (a colocated run is always fully contended, so it cannot tell: its levels hold it)
        others = busy_others(records, res.trainer.workers)
        if cfg.trainer.device == "cpu":
            contention = host_contention(records, others, _alone(base, degree) if probes else None)
            if same_hardware(cfg):  # generation on a trainer rank (TAG) runs the same code as on a generator
                for a, b in ((GENERATE, TAG_GENERATE), (TAG_GENERATE, GENERATE)):
                    if a in contention and b not in contention:
                        contention[b] = contention[a]
            if paired:  # a kind the run never overlapped (a colocated phase's score): the probe's pair two at once
                # (the run's figure, over all its overlaps, is the steadier one where it has one: the probe's pairs
                # took 1-2 s, and a generation beside a generation measured there 0.07-0.08 on a quiet host and
                # 0.85 on a busy one against the run's 0.09-1.05 beside an update, docs/benchmarks.md)
                beside = {pair: c for pair, c in paired_contention(paired, _alone(base, degree),
                                                                   same_hardware(cfg)).items()
                          if pair[0] not in contention}
        # a kind whose contention was measured against the probe's calls alone keeps the probe's costs (the time
        # alone): the run's, divided by a median slowdown, only add its noise
        alone_by_probe = set(contention) if probes else set()
        for r, o in zip(records, others, strict=True):  # an action's own sample count (two sizes fit per call
            if r.kind in alone_by_probe:  # vs per row from the run alone)
                continue
            secs = r.duration / (1 + contention.get(r.kind, 0.0) * o)
            if r.kind in (GENERATE, SCORE):
                samples.append({"pool": "generator", "kind": r.kind, "size": r.samples or mb, "seconds": secs})
            elif r.kind == TAG_GENERATE:
                samples.append({"kind": r.kind, "size": r.samples or mb, "seconds": secs})
            elif r.kind == UPDATE:
                samples.append({"kind": r.kind, "size": r.samples or mb * r.count, "tsp_degree": degree,
                                "seconds": secs})
            elif r.kind == WEIGHT_SYNC or r.worker == TRAINER:  # pickups; switches, optimizer step, publish
                samples.append({"kind": r.kind, "seconds": secs})
        if same_hardware(cfg):
            samples = pool_samples(samples)
    d = cfg.digen
    workload = Workload(prompts=cfg.data.train_batch_size, group_size=cfg.rollout.n, mb_size=mb,
                        tsp_degree=degree, staleness=d.tcss.staleness, steps=cfg.trainer.total_steps,
                        policy=d.tag.policy, mini_batches=cfg.mini_batches())
    sharded = Sharded()
    # a sharded run's own costs hold its collectives: the term is for a profile of one unsharded rank
    if gathers and counts and res.trainer.workers == 1 and COLOCATED not in (timeline.mode, cfg.trainer.mode):
        added, per_row = sharding_adds(work, contention.get(UPDATE, 0.0))
        sharded = Sharded.from_probe(fit_points(gathers), {c: int(v) for c, v in counts.items() if c != "kind"},
                                     added, per_row)
    return replace(fit_samples(base, samples), sharded=sharded, host_contention=tuple(sorted(contention.items())),
                   host_contention_beside=tuple(sorted((k, o, c) for (k, o), c in beside.items()))), workload
