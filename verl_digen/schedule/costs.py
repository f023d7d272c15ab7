"""Cost model: what each stage costs, per pool and per micro-batch.

Two levels, because two consumers need different things:

- :class:`CostModel` is the *hardware-level* description of a cluster: per-GPU affine costs
  (``fixed + per_unit * units``) of sampling, scoring and one training pass for each pool's hardware
  type, the pool sizes, the workload's trained-step count ``K`` and kept-sample fraction, and the
  trainer's context-switch, optimizer-step and weight-sync times. It derives the per-action durations
  of any micro-batch size and TSP degree, and the phases of the colocated baseline.
- :class:`StageCosts` is the *scheduler-level* view: one float per action kind for the configured
  micro-batch size. The scheduler, BTS and the profiler work on it only.

The trainer pool trains as one data-parallel unit of ``R`` ranks: an update of a micro-batch splits its
rows (samples) over the ranks, so a micro-batch smaller than ``R`` leaves ranks idle, which is exactly
the inefficiency TSP (more rows per pass) removes. For TAG the pool is ``R`` independent generator
slots: after the switch (which materializes the full weights on every rank) each rank generates whole
micro-batches on its own, so ``tag_generate`` is one micro-batch on one trainer GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

from .actions import (
    GENERATE,
    KINDS,
    OPTIMIZER_STEP,
    PUBLISH,
    SCORE,
    SWITCH_TO_GEN,
    SWITCH_TO_TRAIN,
    UPDATE,
    WEIGHT_SYNC,
)
from .rows import row_plan

#: cluster-level costs that are one number (not per micro-batch)
SCALAR_COSTS = (SWITCH_TO_GEN, SWITCH_TO_TRAIN, OPTIMIZER_STEP, WEIGHT_SYNC, PUBLISH)

# The colocated baselines (docs/simulator.md, "Baselines"): what users run today on one pool.
IDEAL = "ideal"  # batched sampling through full weights, TSP as configured, no recompute, no engine
NATIVE = "native"  # flow_grpo / DanceGRPO scripts: sampling through the FSDP-sharded model one sample at a
# time, one backward per (sample, timestep), reward inline, no switching
VERL_OMNI = "verl-omni"  # rollout engine with request batching, sleep/wake + weight resharding every step,
# an old-log-prob recompute pass, per-timestep training
VERL_OMNI_BYPASS = "verl-omni-bypass"  # verl-omni as its own examples ship it
# (``algorithm.rollout_correction.bypass_mode=True``: the rollout's log-probs serve as the old ones, so no
# recompute pass); otherwise the same engine, switches and per-timestep training as VERL_OMNI
BASELINES = (IDEAL, NATIVE, VERL_OMNI, VERL_OMNI_BYPASS)


def trained_steps(sampling_steps: int, fraction: float) -> int:
    """K trained timesteps of ``sampling_steps`` at ``fraction`` (DanceGRPO's ``int(T * fraction)``),
    at least one; the one rule the recipes, the presets and the sampler share."""
    if not 0 < fraction <= 1:
        raise ValueError(f"timestep fraction must be in (0, 1], got {fraction}")
    return max(1, int(sampling_steps * fraction))


def _check_cost(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value):
        raise ValueError(f"cost {name!r} must be a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"cost {name!r} must be >= 0, got {value}")


@dataclass(frozen=True)
class Affine:
    """Duration ``max(fixed + per_unit * units, floor)`` (seconds); zero units cost nothing.

    ``floor`` is work that runs concurrently with the per-unit compute and bounds the call from below:
    a training pass's FSDP communication overlaps its compute, so a pass takes max(compute, comm).
    """

    fixed: float = 0.0
    per_unit: float = 0.0
    floor: float = 0.0

    def __post_init__(self) -> None:
        _check_cost("fixed", self.fixed)
        _check_cost("per_unit", self.per_unit)
        _check_cost("floor", self.floor)

    def __call__(self, units: float) -> float:
        if units <= 0:
            return 0.0
        return max(self.fixed + self.per_unit * units, self.floor)

    def scaled(self, factor: float) -> Affine:
        return Affine(self.fixed * factor, self.per_unit * factor, self.floor * factor)


@dataclass(frozen=True)
class Hardware:
    """Per-GPU costs of one hardware type running this workload.

    ``generate(s)``: one GPU samples ``s`` trajectories in one call (all denoising steps + decode).
    ``score(s)``: one GPU scores ``s`` samples with the reward model.
    ``train_pass(r)``: one forward+backward pass over ``r`` rows on one GPU (a row is one
    (sample, timestep) pair); ``fixed`` holds the per-pass overhead (FSDP all-gathers, launch) that
    TSP amortizes.
    """

    name: str = "gpu"
    generate: Affine = Affine()
    score: Affine = Affine()
    train_pass: Affine = Affine()


@dataclass(frozen=True)
class Pool:
    """``workers`` GPUs of one hardware type."""

    hardware: Hardware
    workers: int

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"pool {self.hardware.name!r} needs at least one worker, got {self.workers!r}")


@dataclass(frozen=True)
class StageCosts:
    """Seconds per action for one micro-batch size: what the scheduler and BTS plan with."""

    generate: float  # one micro-batch on one generator worker
    tag_generate: float  # one micro-batch on one trainer rank (a TAG slot)
    score: float  # one micro-batch on one generator worker
    update: float  # one micro-batch on the trainer unit (gradient accumulation, no optimizer step)
    switch_to_gen: float = 0.0  # trainer pool: training state out, full generation weights in
    switch_to_train: float = 0.0
    optimizer_step: float = 0.0
    weight_sync: float = 0.0  # one generator picks up a published version (at a trajectory boundary)
    publish: float = 0.0  # trainer: gather the new version once and publish it (after the optimizer step)

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_cost(f.name, getattr(self, f.name))

    def duration(self, kind: str) -> float:
        if kind not in KINDS:
            raise ValueError(f"unknown action kind {kind!r}")
        return getattr(self, kind)

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def passes(steps_trained: int, tsp_degree: int) -> list[int]:
    """Timesteps per training pass: ``K`` trained steps in passes of at most ``tsp_degree``."""
    if tsp_degree < 1:
        raise ValueError(f"TSP degree must be >= 1, got {tsp_degree}")
    d = min(tsp_degree, steps_trained)
    full, rest = divmod(steps_trained, d)
    return [d] * full + ([rest] if rest else [])


@dataclass(frozen=True)
class BaselineCosts:
    """What the colocated baselines users run pay beyond the idealized one (seconds; 0 = not known,
    as for a measured profile, which then shows the idealized costs for those terms)."""

    shard_gather: float = 0.0  # all-gather of the full weights over every GPU (one sampling forward
    # through FSDP shards pays it; it overlaps that forward's compute)
    sampling_forwards: int = 0  # transformer forwards per sample (sampling steps x CFG passes)
    rollout_wake: float = 0.0  # rollout engine: weights back on the GPU + resharded from FSDP, per step
    rollout_sleep: float = 0.0  # rollout engine: weights and cache off the GPU before training
    recompute_share: float = 0.25  # old-log-prob forward relative to one training pass's compute

    def __post_init__(self) -> None:
        for name in ("shard_gather", "rollout_wake", "rollout_sleep", "recompute_share"):
            _check_cost(name, getattr(self, name))


#: the after-run probe's samples for :class:`Sharded` (``driver/probe.py``): an all-gather between two of the run's
#: processes (size: bytes gathered), the trainer's own collective counts, and the trainer's own work timed sharded
#: over two of the run's processes against unsharded (``workers/collective_probe.time_sharded``: one sample per
#: item of ``SHARDED_WORK``, its ``alone`` / ``plain`` / ``sharded`` seconds)
ALL_GATHER = "all_gather"
SHARDED_CALLS = "sharded_calls"
SHARDED_WORK = "sharded_work"
#: the probe's actions run two at once (generation beside generation, one on each of two processes of the host):
#: ``{"kind": PAIRED, "action": kind, "beside": the other's kind, "size": samples, "seconds": ...}``, for
#: ``CostModel.host_contention_beside`` (``metrics.paired_contention``)
PAIRED = "paired"
#: what a sharded trainer does that an unsharded rank does not, each priced by its own collectives
PASS, SWITCH, STEP = "pass", "switch", "step"


@dataclass(frozen=True)
class Sharded:
    """The collectives a trainer sharded over more ranks (FSDP2) adds per call, for a profile measured on one
    unsharded rank, which never ran them (a measured profile's other costs stay per GPU as measured; presets
    price their collectives on the fabric and leave this empty). ``collective``: one all-gather between two
    ranks of the host, ``latency + per_unit * bytes gathered``; over W ranks a ring pays the latency W - 1
    times and moves 2 (W - 1) / W of those bytes. The counts are the trainer's own (``fsdp.sharded_calls``).

    ``*_latency``: one collective's latency as FSDP2 issues it in that work (a training pass, the switch's
    gather, the optimizer step: DTensor dispatch, copy-in/out, the ranks waiting on each other), measured by
    the probe running that work sharded (:meth:`from_probe`); 0 takes the bare all-gather's (``collective``)."""

    collective: Affine = Affine()
    pass_calls: int = 0  # one training pass: per FSDP unit an all-gather forward and backward, a reduce-scatter
    pass_bytes: int = 0  # the bytes those move (the unsharded parameters, three times)
    switch_calls: int = 0  # switch to generation: one all-gather per parameter tensor (the generation copy)
    switch_bytes: int = 0
    step_calls: int = 0  # optimizer step: the global gradient norm's reduction, the ranks' skip verdict
    pass_latency: float = 0.0
    switch_latency: float = 0.0
    step_latency: float = 0.0
    pass_per_row: float = 0.0  # what a sharded pass adds per row per extra rank beyond its collectives (the probe's
    # pass at two sizes: a sharded rank's compute waits on its peer's, which grows with the rows)

    def __post_init__(self) -> None:
        for name in ("pass_calls", "pass_bytes", "switch_calls", "switch_bytes", "step_calls"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"sharded.{name} must be a non-negative integer, got {v!r}")
        for work in (PASS, SWITCH, STEP):
            _check_cost(f"sharded.{work}_latency", getattr(self, f"{work}_latency"))
        _check_cost("sharded.pass_per_row", self.pass_per_row)

    def seconds(self, calls: int, nbytes: int, ranks: int, latency: float = 0.0) -> float:
        """Seconds of ``calls`` collectives moving ``nbytes`` (gathered) over ``ranks`` ranks; 0 unsharded.
        ``latency``: one collective's (0: the bare all-gather's)."""
        if ranks <= 1 or calls <= 0:
            return 0.0
        c = self.collective
        return calls * (latency or c.fixed) * (ranks - 1) + c.per_unit * nbytes * 2 * (ranks - 1) / ranks

    def _work(self, work: str, ranks: int) -> float:
        nbytes = 0 if work == STEP else getattr(self, f"{work}_bytes")
        return self.seconds(getattr(self, f"{work}_calls"), nbytes, ranks, getattr(self, f"{work}_latency"))

    def per_pass(self, ranks: int, rows: int = 0) -> float:
        """What sharding over ``ranks`` adds to a pass of ``rows`` rows per rank."""
        if ranks <= 1:
            return 0.0
        return self._work(PASS, ranks) + self.pass_per_row * rows * (ranks - 1)

    def switch(self, ranks: int) -> float:
        return self._work(SWITCH, ranks)

    def step(self, ranks: int) -> float:
        return self._work(STEP, ranks)

    @classmethod
    def from_probe(cls, collective: Affine, counts: dict[str, int], added: dict[str, float],
                   pass_per_row: float = 0.0) -> Sharded:
        """The term from the probe: ``added`` holds, per work (``PASS``, ``SWITCH``, ``STEP``), the seconds sharding
        it over two ranks added (a pass: per call, ``pass_per_row`` more per row); each collective of that work
        (``counts``) gets the latency that leaves, the bytes priced by the bare all-gather's ``per_unit`` (at least
        0; 0 falls back to the bare all-gather's latency). A work the probe did not time keeps the bare
        all-gather's latency."""
        base = cls(collective, **counts, pass_per_row=pass_per_row)
        latency = {}
        for work, seconds in added.items():
            calls = counts.get(f"{work}_calls", 0)
            if calls > 0:
                nbytes = 0 if work == STEP else counts.get(f"{work}_bytes", 0)
                latency[f"{work}_latency"] = max(0.0, seconds - collective.per_unit * nbytes) / calls  # W = 2
        return replace(base, **latency)


@dataclass(frozen=True)
class CostModel:
    """A cluster (generator pool + trainer pool) running one diffusion-RL workload.

    ``resize(g, r, fsdp_ranks)``, when set (presets), re-derives every cost for another split (the
    sharded state, the collectives over the new pool); without it (a measured profile) resizing keeps
    the per-GPU costs as measured.
    """

    generator: Pool
    trainer: Pool
    steps_trained: int = 1  # K: denoising steps trained per kept sample
    keep_fraction: float = 1.0  # fraction of generated samples that are trained (best-of-N keeps fewer)
    switch_to_gen: float = 0.0  # trainer: training state out, full generation weights on every rank
    switch_to_train: float = 0.0
    optimizer_step: float = 0.0
    weight_sync: float = 0.0  # one generator fetches and installs a published version
    publish: float = 0.0  # trainer: gather the new version and publish it once
    baselines: BaselineCosts = BaselineCosts()
    # trainer GPUs per Ulysses group: a group trains the same rows (its GPUs each hold 1/size of their tokens,
    # priced in ``Hardware.train_pass``), so rows are shared over ranks / size data-parallel groups
    sequence_parallel: int = 1
    sharded: Sharded = Sharded()  # collectives a sharded trainer adds (a profile measured on one rank)
    # every process on one host (a CPU testbed): per action kind, how much each other busy process slows an action
    # of that kind, as a fraction of its time alone ((kind, fraction) pairs; the simulator's processor sharing,
    # ``executor.SimBackend``); empty for pools of their own
    host_contention: tuple[tuple[str, float], ...] = ()
    # the same, for an action of one kind beside a process running a given other kind ((kind, other kind, fraction)
    # triples; a colocated phase's own ranks are beside their own kind), where the probe ran the two at once and the
    # run never overlapped that kind (``metrics.paired_contention``); any other pair takes ``host_contention``
    host_contention_beside: tuple[tuple[str, str, float], ...] = ()
    resize: Callable[[int, int, int | None], CostModel] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.steps_trained, int) or self.steps_trained < 1:
            raise ValueError(f"steps_trained must be a positive integer, got {self.steps_trained!r}")
        if not 0 < self.keep_fraction <= 1:
            raise ValueError(f"keep_fraction must be in (0, 1], got {self.keep_fraction}")
        if not isinstance(self.sequence_parallel, int) or self.sequence_parallel < 1:
            raise ValueError(f"sequence_parallel must be a positive integer, got {self.sequence_parallel!r}")
        for name in SCALAR_COSTS:
            _check_cost(name, getattr(self, name))
        for kind, c in self.host_contention:
            _check_cost(f"host_contention.{kind}", c)
        for kind, other, c in self.host_contention_beside:
            _check_cost(f"host_contention_beside.{kind}.{other}", c)

    def shared_host(self) -> dict[str, object]:
        """The simulator's shared-host arguments (``executor.SimBackend``'s ``contention`` and ``beside``)."""
        return {"contention": dict(self.host_contention),
                "beside": {(k, o): c for k, o, c in self.host_contention_beside}}

    @property
    def total_workers(self) -> int:
        return self.generator.workers + self.trainer.workers

    def with_workers(self, generator: int, trainer: int) -> CostModel:
        if self.resize is not None:
            return self.resize(generator, trainer, None)
        return replace(
            self,
            generator=Pool(self.generator.hardware, generator),
            trainer=Pool(self.trainer.hardware, trainer),
        )

    def train_time(self, samples: float, tsp_degree: int, ranks: int, hw: Hardware, per_sample: bool = False,
                   rows_per_pass: int | None = None) -> float:
        """Forward+backward of ``samples`` generated samples on ``ranks`` GPUs, data-parallel over their
        Ulysses groups (``per_sample``: each rank trains its samples one per pass, as the upstream loops do;
        ``rows_per_pass``: rows per rank per pass, ``rows.row_plan``'s ``cap``)."""
        sh = self.sharded
        if per_sample:
            each = math.ceil(samples * self.keep_fraction / self.data_parallel(ranks) - 1e-9)
            return each * sum(hw.train_pass(d) + sh.per_pass(ranks, d) for d in passes(self.steps_trained, tsp_degree))
        return sum(hw.train_pass(r) + sh.per_pass(ranks, r)
                   for r in self._pass_rows(samples, tsp_degree, ranks, rows_per_pass))

    def stage_costs(self, mb_size: int, tsp_degree: int = 1, update_samples: int | None = None,
                    per_sample: bool = False, rows_per_pass: int | None = None) -> StageCosts:
        """Per-action durations of the disaggregated scheduler for micro-batches of ``mb_size`` samples
        (an update action trains ``update_samples``, by default one micro-batch)."""
        if mb_size < 1:
            raise ValueError(f"micro-batch size must be >= 1, got {mb_size}")
        g_hw, t_hw, r = self.generator.hardware, self.trainer.hardware, self.trainer.workers
        return StageCosts(
            generate=g_hw.generate(mb_size),
            tag_generate=t_hw.generate(mb_size),
            score=g_hw.score(mb_size),
            update=self.train_time(update_samples or mb_size, tsp_degree, r, t_hw, per_sample, rows_per_pass),
            switch_to_gen=self.switch_to_gen + self.sharded.switch(r),
            switch_to_train=self.switch_to_train,
            optimizer_step=self.optimizer_step + self.sharded.step(r),
            weight_sync=self.weight_sync,
            publish=self.publish,
        )

    def colocated_model(self) -> CostModel:
        """This cluster with every GPU in one FSDP group (what colocated training shards over)."""
        if self.resize is None:
            return self
        return self.resize(self.generator.workers, self.trainer.workers, self.total_workers)

    def colocated_phases(self, batch: int, tsp_degree: int = 1, baseline: str = IDEAL,
                         rows_per_pass: int | None = None) -> dict[str, float]:
        """Phases of one colocated step: every GPU of both pools generates, scores, then trains.

        The batch is split evenly over all GPUs (data parallel); with two hardware types the slower
        one sets each phase's time (each phase ends with a collective). ``baseline`` picks what users
        actually run (:data:`BASELINES`; module constants document each). ``rows_per_pass`` caps the rows
        per rank per pass (what memory lets a rank hold): this runtime's colocated mode (``IDEAL``) packs up to
        that many, so a colocated run the planner proposes is priced with the passes it will run; verl-omni's
        per-timestep passes (one timestep of a rank's samples) are split into micro-batches of at most that
        many, the same memory rule (the native loop trains one row per pass already).
        """
        if baseline not in BASELINES:
            raise ValueError(f"unknown colocated baseline {baseline!r}; expected one of {BASELINES}")
        m = self.colocated_model()
        w = self.total_workers
        per_gpu = math.ceil(batch / w)
        hws = (m.generator.hardware, m.trainer.hardware)
        b = self.baselines
        to_gen = m.switch_to_gen + m.sharded.switch(w)  # every GPU in one FSDP group
        phases = {
            SWITCH_TO_GEN: to_gen,
            GENERATE: max(hw.generate(per_gpu) for hw in hws),
            SCORE: max(hw.score(per_gpu) for hw in hws),
            SWITCH_TO_TRAIN: m.switch_to_train,
            UPDATE: max(m.train_time(batch, tsp_degree, w, hw, rows_per_pass=rows_per_pass) for hw in hws),
            OPTIMIZER_STEP: m.optimizer_step + m.sharded.step(w),
        }
        if baseline == NATIVE:
            def one_sample(hw: Hardware) -> float:  # every forward waits for its all-gather (or hides it)
                g = hw.generate
                return g.fixed + max(g.per_unit, b.sampling_forwards * b.shard_gather)

            phases.update({
                SWITCH_TO_GEN: 0.0, SWITCH_TO_TRAIN: 0.0,
                GENERATE: per_gpu * max(one_sample(hw) for hw in hws),
                UPDATE: max(m.train_time(batch, 1, w, hw, per_sample=True) for hw in hws),
            })
        elif baseline in (VERL_OMNI, VERL_OMNI_BYPASS):
            cap = None  # one timestep of a rank's samples per pass, split where memory holds fewer rows
            if rows_per_pass is not None:
                cap = min(rows_per_pass, max(self._pass_rows(batch, 1, w), default=1))

            def recompute(hw: Hardware) -> float:  # forward only: a share of the compute, one all-gather
                if baseline == VERL_OMNI_BYPASS:  # bypass_mode: the rollout's log-probs are the old ones
                    return 0.0
                tp = hw.train_pass
                return sum(max(b.recompute_share * (tp.fixed + tp.per_unit * r), tp.floor / 3)
                           for r in self._pass_rows(batch, 1, w, cap))

            phases.update({
                SWITCH_TO_GEN: to_gen + b.rollout_wake,
                SWITCH_TO_TRAIN: m.switch_to_train + b.rollout_sleep,
                UPDATE: max(m.train_time(batch, 1, w, hw, rows_per_pass=cap) + recompute(hw) for hw in hws),
            })
        return phases

    def data_parallel(self, ranks: int) -> int:
        """The data-parallel width of ``ranks`` trainer GPUs: their Ulysses groups."""
        return max(1, ranks // self.sequence_parallel)

    def _pass_rows(self, samples: float, tsp_degree: int, ranks: int, rows_per_pass: int | None = None) -> list[int]:
        """Rows per pass on the most-loaded rank, exactly as the trainer runs them (``rows``)."""
        kept = math.ceil(samples * self.keep_fraction - 1e-9)
        if kept <= 0:
            return []
        return row_plan(kept, self.steps_trained, self.data_parallel(ranks), tsp_degree, rows_per_pass).pass_rows()


def uniform_stage_costs(generate: float, update: float, **kw: float) -> StageCosts:
    """StageCosts with TAG as fast as a generator worker and free extras unless given (tests, benches)."""
    kw.setdefault("tag_generate", generate)
    kw.setdefault("score", 0.0)
    return StageCosts(generate=generate, update=update, **kw)


@dataclass(frozen=True)
class JudgeCost:
    """A served judge (``reward.served``) priced per image: ``seconds_per_image`` is one replica's time for one
    image; ``tensor_parallel_size`` GPUs per replica; ``gpus``: the judge's own pool (None: it is served on the GPUs
    that generate, the generator pool here and every GPU in a colocated baseline, as verl-omni's judge shares the
    actor's GPUs). Both sides of every comparison get the same judge: its own pool's replicas serve the colocated
    baselines too (verl-omni's ``enable_resource_pool``), so the ratio is like for like."""

    seconds_per_image: float
    tensor_parallel_size: int = 1
    gpus: int | None = None

    def __post_init__(self) -> None:
        _check_cost("judge.seconds_per_image", self.seconds_per_image)
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise ValueError(f"judge tensor_parallel_size must be a positive integer, "
                             f"got {self.tensor_parallel_size!r}")
        if self.gpus is not None and (not isinstance(self.gpus, int) or self.gpus < self.tensor_parallel_size):
            raise ValueError(f"judge gpus must hold one replica of {self.tensor_parallel_size}, got {self.gpus!r}")

    def per_image(self, scorers: int) -> float:
        """Seconds an image adds to a scoring call when ``scorers`` GPUs score at once and share the replicas
        (each replica works through its share of their images): on the scorers' own GPUs the replicas are
        scorers / TP, so TP x the replica's time; on a pool of its own, scorers / replicas x it."""
        if self.gpus is None:
            return self.seconds_per_image * self.tensor_parallel_size
        return self.seconds_per_image * scorers / (self.gpus // self.tensor_parallel_size)


def with_judge(model: CostModel, judge: JudgeCost) -> CostModel:
    """``model`` with the judge's time per image added to scoring: a generator's score action pays it as one
    of the generator pool's scorers, a colocated phase as one of all the GPUs (the trainer hardware's score is
    what only the colocated phases read). Resizing (``with_workers``, the planner's splits) re-prices it for
    the new pool sizes."""
    base = model

    def resize(generators: int, trainers: int, fsdp_ranks: int | None) -> CostModel:
        if base.resize is not None:
            sized = base.resize(generators, trainers, fsdp_ranks)
        else:
            sized = replace(base, generator=Pool(base.generator.hardware, generators),
                            trainer=Pool(base.trainer.hardware, trainers))
        return with_judge(sized, judge)

    def plus(hw: Hardware, seconds: float) -> Hardware:
        s = hw.score
        return replace(hw, score=Affine(s.fixed, s.per_unit + seconds, s.floor))

    return replace(model, resize=resize,
                   generator=Pool(plus(model.generator.hardware, judge.per_image(model.generator.workers)),
                                  model.generator.workers),
                   trainer=Pool(plus(model.trainer.hardware, judge.per_image(model.total_workers)),
                                model.trainer.workers))
