"""The run's global steps as an iterator: one :class:`StepDone` per optimizer step, as it completes.

For each segment (validation cuts the run at its steps: ``driver/validation.py``) :class:`Steps` builds a
scheduler, a Ray backend and a :class:`~.accumulator.StepAccumulator`, and drives them through the one
executor loop (:func:`verl_digen.schedule.executor.events`). Every action that needs data gets it attached
before its launch (:class:`~.ray_backend.Work`: its rows, their prompt texts, an update's advantages), so
the backend never calls back. The timeline streams to disk as the run goes (a crash keeps it; a resume
appends) and the driver holds only a window of it: this module alone reads and trims that window. The
caller owns the loop: it reports, guards, saves and validates between the steps it is handed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from verl_digen.config import RunConfig
from verl_digen.config.plan import prior_stage_costs
from verl_digen.data import PromptDataset
from verl_digen.driver import validation
from verl_digen.driver.accumulator import StepAccumulator, StepResults
from verl_digen.driver.faults import fault_policy
from verl_digen.driver.ray_backend import RayBackend, Work
from verl_digen.driver.run_pools import RunPools
from verl_digen.reporting import metric_names as names
from verl_digen.reporting.metrics import schedule_metrics, window_metrics
from verl_digen.reporting.progress import Recent, forget_read
from verl_digen.reporting.trace_stream import RecordStream, restore_segments
from verl_digen.schedule import StepScheduler
from verl_digen.schedule.actions import GENERATE, TAG_GENERATE, UPDATE, Action
from verl_digen.schedule.colocated import ColocatedScheduler
from verl_digen.schedule.config import COLOCATED
from verl_digen.schedule.executor import events
from verl_digen.schedule.timeline import TRAINER, Record, Timeline, concat_timelines


class Prompts:
    """The training prompts of each global step (``offset``: data position - step x batch, non-zero after
    a resume that changed the batch)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.dataset = (PromptDataset.from_file(cfg.data.train_files, cfg.data.prompt_key) if cfg.data.train_files
                        else PromptDataset.synthetic(cfg.data.synthetic_prompts))
        self.batch = cfg.data.train_batch_size
        self.offset = 0

    def of(self, step: int) -> tuple[list[int], list[str]]:
        """Prompt ids and texts of global step ``step`` (0-based)."""
        return self.dataset.batch(self.offset + step * self.batch, self.batch)

    def rows(self, step: int, samples) -> tuple[list[tuple[int, int]], list[str]]:
        """Scheduler (prompt-in-step, sample) pairs -> global (prompt id, sample) rows and their texts."""
        ids, texts = self.of(step)
        return [(ids[p], s) for p, s in samples], [texts[p] for p, _ in samples]


@dataclass(frozen=True)
class StepDone:
    """Global step ``step`` (1-based) completed its optimizer step: its report and what its completions said."""

    step: int
    metrics: dict[str, float]
    results: StepResults


@dataclass(frozen=True)
class Drained:
    """The segment ending after global step ``step`` has drained: the pipeline is empty (validate now)."""

    step: int


class _Segment:
    """Global steps ``base + 1 .. base + length`` through one scheduler, backend and accumulator; ``t0``: the
    run's time origin (later segments share it so the run's timeline stays one time axis)."""

    def __init__(self, steps: Steps, base: int, length: int, t0: float | None) -> None:
        cfg, pools = steps.cfg, steps.pools
        self.steps, self.base = steps, base
        sched_cfg = cfg.schedule_config(steps=length)
        if cfg.trainer.mode == COLOCATED:
            self.sched = ColocatedScheduler(sched_cfg, [f"col{i}" for i in range(len(pools.trn_wg.workers))])
        else:
            self.sched = StepScheduler(sched_cfg, prior_stage_costs(cfg), gen_workers=cfg.resources.generator.workers,
                                       trainer_ranks=len(pools.trn_wg.workers))
        colocated = isinstance(self.sched, ColocatedScheduler)
        self.acc = StepAccumulator(cfg.rollout.n, cfg.advantage())
        self.backend = RayBackend(pools.gen_wg, pools.trn_wg, pools.sync, steps.scale(), base,
                                  faults=fault_policy(cfg, steps.log),
                                  estimate=None if colocated else (lambda a: self.sched.costs.duration(a.kind)),
                                  stall_timeout_s=cfg.trainer.stall_timeout_s)
        if t0 is not None:
            self.backend.t0 = t0

    def prepare(self, a: Action) -> Work | None:
        """What ``a`` carries to the backend: rows and texts to generate, an update's rows' advantages."""
        if a.kind not in (GENERATE, TAG_GENERATE, UPDATE):
            return None
        rows, texts = self.steps.prompts.rows(self.base + a.step, a.samples)
        if a.kind != UPDATE:
            return Work(rows, texts)
        return Work(rows, texts, self.acc.advantages(a.step, sorted({pid for pid, _ in rows})))

    def run(self, stream: RecordStream) -> Iterator[StepDone]:
        """The segment's steps as they complete; the window of records behind each is forgotten after it."""
        sched, steps = self.sched, self.steps
        stream.follow(sched.timeline.records, self.base - steps.start_step)
        last_end = prev_start = self.backend.now()  # a later segment's first step starts after the validation
        window = Recent(sched.timeline.records)
        decisions = Recent(getattr(sched, "decisions", []))
        for c in events(sched, self.backend, self.prepare):
            done = self.acc.add(c)
            if done is None:  # not an optimizer step: the step goes on
                continue
            # this step's records end after the previous step's window began (a stale generation starts
            # once the version it uses exists): per-step work stays flat however long the run
            recent = window.since(lambda r, t=prev_start: r.end >= t - 1e-9)
            step_decisions = decisions.since(lambda d, s=c.action.step: d.step >= s - 1)
            metrics = steps._step_metrics(sched, c.action.step, done, last_end, c.end, recent, step_decisions)
            prev_start, last_end = last_end, c.end
            yield StepDone(self.base + c.action.step + 1, metrics, done)
            stream.flush()  # then forget what is on disk and behind this step's window
            forget_read(sched.timeline.records, window, stream)
            forget_read(decisions.items, decisions)


class Steps:
    """The global steps of a run on ``pools`` (see the module docstring); ``segments`` keeps each
    segment's (first step - start step, timeline) for the end of the run."""

    def __init__(self, cfg: RunConfig, pools: RunPools, prompts: Prompts, run_id: str,
                 log: Callable[[str], None]) -> None:
        self.cfg, self.pools, self.prompts, self.run_id, self.log = cfg, pools, prompts, run_id, log
        self.start_step = pools.start_step
        self.segments: list[tuple[int, Timeline]] = []

    def scale(self) -> float:
        """Loss scale: 1 / rows of a mini-batch (the global step, with one), so accumulation gives the
        mini-batch's mean gradient, as verl's mini-batch loop takes it."""
        return 1.0 / (self.cfg.batch // self.cfg.mini_batches() * self.cfg.trained_steps())

    def timeline(self) -> Timeline:
        return concat_timelines(self.segments)

    def run(self, steps: int, validate_every: int) -> Iterator[StepDone | Drained]:
        """Global steps ``start_step + 1 .. start_step + steps``; a :class:`Drained` after each segment that
        ends at a validation step (every ``validate_every`` steps; 0: none). The segments' timelines are read
        back from disk when the iterator ends (or is closed: a stopped run's partial trace)."""
        first, total = self.start_step, self.start_step + steps
        self.segments = []
        stream = self._stream(first)
        t0, finished = None, False
        try:
            base = first
            for length in validation.segments(first, total, validate_every):
                segment = _Segment(self, base, length, t0)
                self.segments.append((base - first, segment.sched.timeline))
                yield from segment.run(stream)
                t0 = segment.backend.t0
                base += length
                if validate_every > 0:
                    yield Drained(base)
            finished = True
        finally:
            self._close(stream, finished)

    def _stream(self, first: int) -> RecordStream:
        """The timeline's file: ``<mode>_timeline.jsonl`` in the trace dir, else a scratch file; either way
        the driver holds only a window of it until the end."""
        t = self.cfg.trainer
        header = {"run_id": self.run_id, "mode": t.mode, "first_step": first}
        if t.trace_dir:
            return RecordStream(Path(t.trace_dir, f"{t.mode}_timeline.jsonl"), [], header, keep_through=first)
        fd, scratch = tempfile.mkstemp(prefix="digen-timeline-", suffix=".jsonl")
        os.close(fd)
        return RecordStream(scratch, [], header)

    def _close(self, stream: RecordStream, finished: bool) -> None:
        stream.close()
        try:
            restore_segments(stream.path, self.segments)
        except Exception as err:
            if finished:
                raise
            # never hide why the run stopped behind this: the partial trace then holds the last window
            self.log(f"warning: could not read the timeline back from {stream.path}: {err}")
        finally:
            if not self.cfg.trainer.trace_dir:
                stream.path.unlink(missing_ok=True)

    def _step_metrics(self, sched, step: int, done: StepResults, start: float, end: float, records: list[Record],
                      decisions: list) -> dict[str, float]:
        """The report of local step ``step`` of ``sched``, which ran from ``start`` to ``end``: what its
        completions said (``done``), the pools' busy time, and (disaggregated) the schedule's view.
        ``records`` / ``decisions``: suffixes of the scheduler's that hold all of this step's."""
        colocated = isinstance(sched, ColocatedScheduler)
        gen_names = [] if colocated else list(sched.gens)
        trn_names = list(sched.workers) if colocated else [TRAINER, *sched.slots]
        step_s = end - start
        metrics = {names.STEP_S: step_s,
                   names.SAMPLES_PER_WORKER_S: self.cfg.batch / (step_s * self.cfg.total_workers),
                   **done.metrics(),
                   **window_metrics(records, start, end, gen_names, trn_names, colocated=colocated)}
        if not colocated:
            metrics.update(schedule_metrics(sched, step, start, step_s, records, decisions))
        return metrics
