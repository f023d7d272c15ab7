"""DigenRuntime: the Ray runtime that executes the scheduling core on real verl worker groups.

The scheduler decides; the one executor loop (``verl_digen.schedule.executor.run``) drives it on the
Ray backend (``driver/ray_backend.py``), exactly as the simulator drives it on a virtual clock. The
same trainer runs the baselines on the same code: ``separate`` is the scheduler's full-batch-barrier
mode, and ``colocated`` is ``ColocatedScheduler`` (every worker generates, then every worker trains
data-parallel) over one hybrid worker group.

Data path: a generator returns a ``Trajectories`` object reference, a generator scores it (reward
models live on the generator pool) and only ids + rewards reach the driver as the score action's
typed result; a ``StepAccumulator`` (``driver/accumulator.py``) folds every completion, hands an
update the advantages of its complete GRPO groups, and yields the step's results when its optimizer
step completes. The trainer ranks fetch the scored trajectories themselves and accumulate gradients
on their shard of the rows; the optimizer steps once per global step and the new version is published
once for the generators to pick up. The timeline is checked against the
scheduling invariants at the end of every run; a violation is written next to the trace and fails it.
"""

from __future__ import annotations

import signal
import time
import uuid
from contextlib import closing

from verl_digen.config import RunConfig, validate
from verl_digen.driver import validation
from verl_digen.driver.faults import note_dead_workers, plain_log
from verl_digen.driver.outputs import RunOutputs, RunResult
from verl_digen.driver.pools import ensure_ray
from verl_digen.driver.probe import probe_costs
from verl_digen.driver.ray_backend import Stalled
from verl_digen.driver.run_pools import RunPools
from verl_digen.driver.steps import Drained, Prompts, StepDone, Steps
from verl_digen.driver.stopping import (
    STOP_EXIT_S,
    AbandonStep,
    NonFiniteGuard,
    RunStopped,
    StepClock,
    StopSignals,
    abandon_cause,
    exit_code_of,
    grace_decision,
)
from verl_digen.reporting.progress import Progress
from verl_digen.schedule.config import COLOCATED
from verl_digen.schedule.timeline import TimelineError, check_timeline

__all__ = ["DigenRuntime", "RunResult", "RunStopped", "new_run_id"]


def new_run_id() -> str:
    """A run id: start time and a random suffix (written into every checkpoint and trace)."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:8]


class DigenRuntime:
    """Runs ``trainer.total_steps`` global steps on the run's pools, as verl's ``fit`` reads: start the
    pools; for each step (``driver/steps.py``): report, guard, save, progress; validate.

    ``probe``: after the run (disaggregated modes, when a profile is written), measure what the run's
    own actions never sized, so its profile can predict other modes and TAG policies: generation,
    scoring and a training pass at a second size (up to 4 micro-batches; a run repeats one size, and
    one size cannot split a cost into per-call and per-sample parts), and a TAG cycle on the trainer
    (context switches and a micro-batch generated on a trainer rank, which a ``never`` run does not do)."""

    def __init__(self, cfg: RunConfig, log=print, probe: bool = False) -> None:
        from verl_digen.config.planning import resolve_auto

        cfg = resolve_auto(cfg, log)  # digen.plan=auto (the command line resolves it before the dry run)
        self.warnings = validate(cfg)
        self.cfg = cfg
        self.log = log = plain_log(log)  # a worker's error text carries Ray's colour codes: never in our lines
        self.probe = probe
        for w in self.warnings:
            log(f"warning: {w}")
        self.run_id = new_run_id()
        self.pools = RunPools(cfg, log, self.run_id, hybrid=probe)
        self.prompts = Prompts(cfg)
        self.outputs = RunOutputs(cfg, log, self.run_id)
        self.k = cfg.trained_steps()
        self.validator: validation.Validator | None = None
        self.steps: Steps | None = None
        self._signals: StopSignals | None = None
        self._clock = StepClock()  # the step in progress, for the SIGTERM grace decision
        self._guard = NonFiniteGuard(cfg.trainer.on_nonfinite, cfg.trainer.max_nonfinite_steps, log)
        self._partial: RunResult | None = None

    # the pools' state, under the names callers read
    gen_wg = property(lambda self: self.pools.gen_wg)
    trn_wg = property(lambda self: self.pools.trn_wg)
    sync = property(lambda self: self.pools.sync)
    start_step = property(lambda self: self.pools.start_step)
    last_checkpoint = property(lambda self: self.pools.last_checkpoint)
    resume_path = property(lambda self: self.pools.resume_path)
    tracking = property(lambda self: self.outputs.tracking)

    def init_workers(self) -> None:
        """Claim the checkpoint directory, create the worker groups (the expensive part), wire weight sync
        and resume (``RunPools.start``)."""
        self.pools.start()
        self.prompts.offset = self.pools.data_offset

    def shutdown(self) -> None:
        """Release the pools and the Ray head the run started for itself (``RunPools.shutdown``)."""
        self.pools.shutdown()

    def fit(self) -> RunResult:
        """Run ``trainer.total_steps`` global steps (from the resume point) and return the reports.

        Stops early with ``RunStopped`` on a signal (SIGINT: after the current step, checkpointed when
        ``trainer.save_freq`` > 0, a second abandons it; SIGTERM: the same when the step fits
        ``trainer.stop_grace_s``, else at once; SIGUSR1: after the step, for a requeue), on a stall
        (``trainer.stall_timeout_s``) and on non-finite values (see ``trainer.on_nonfinite``); on any stop or
        failure the trace of the steps so far is written before the error propagates. The handlers are in
        place before Ray starts: a signal while it starts stops the run with its line too."""
        with StopSignals(self.log, decide=self._grace_decision, deadline=self._grace_deadline) as sig:
            self._signals = sig
            exit_code = 1
            try:
                ensure_ray(self.cfg)
                result = self._fit()
                exit_code = 0
                return result
            except TimelineError:
                raise
            except (AbandonStep, Exception) as err:
                stop = self._stopped(err)
                if stop is err:
                    raise
                raise stop from None
            finally:
                self._signals = None
                self.outputs.finish(exit_code)

    def _stopped(self, err: BaseException) -> BaseException:
        """What a stop or failure raises, once the partial trace of the steps so far is written."""
        ab = err if isinstance(err, AbandonStep) else abandon_cause(err) if not isinstance(err, RunStopped) else None
        if ab is not None:
            name = signal.Signals(ab.signum).name
            self._write_partial(f"{name}: step abandoned ({ab.why})")
            return RunStopped(f"stopped by {name} (the step in progress was abandoned: {ab.why})",
                              exit_code_of(ab.signum), self.last_checkpoint)
        if isinstance(err, Stalled):
            err = RunStopped(str(err), 4, self.last_checkpoint)
        if isinstance(err, RunStopped):
            self._write_partial(err.reason)
            return err
        note_dead_workers(err, self.pools.workers())  # the call that noticed is often not the one that died
        self._write_partial(f"failed: {type(err).__name__}")
        return err

    def _grace_decision(self) -> tuple[bool, str]:
        """On SIGTERM: finish the step in progress, or abandon it (``stopping.grace_decision``)."""
        return grace_decision(self._clock.remaining(), self.cfg.trainer.stop_grace_s)

    def _grace_deadline(self) -> float | None:
        """Seconds after a SIGTERM by which the step being finished and its save must end (None: no grace)."""
        grace = self.cfg.trainer.stop_grace_s
        return None if grace is None else grace - STOP_EXIT_S

    def _fit(self) -> RunResult:
        if self.pools.trn_wg is None:
            self.init_workers()
        steps = self.cfg.trainer.total_steps - self.start_step
        if steps <= 0:
            self.log(f"nothing to do: checkpoint is at step {self.start_step} >= total_steps")
            return RunResult(final_step=self.start_step, run_id=self.run_id, checkpoint=self.last_checkpoint)
        self._check_signal()
        self.outputs.start(self.start_step)
        if self.cfg.data.val_files and self.cfg.trainer.test_freq > 0:
            self.validator = validation.Validator(self.cfg, keep_through=self.start_step, run_id=self.run_id)
        result = self._partial = RunResult(run_id=self.run_id, final_step=self.start_step + steps)
        self.steps = Steps(self.cfg, self.pools, self.prompts, self.run_id, self.log)
        self._run(result, steps)
        result.timeline = self.steps.timeline()
        try:
            for _, part in self.steps.segments:  # each segment was scheduled (and is judged) on its own
                check_timeline(part)
        except TimelineError as e:
            self.outputs.write(result, self.last_checkpoint, violation=str(e))
            raise TimelineError(f"the run broke a scheduling invariant: {e} (timeline written to "
                                f"{self.cfg.trainer.trace_dir or 'nowhere: trainer.trace_dir is unset'})") from e
        probing = self.probe and bool(self.cfg.trainer.trace_dir) and self.cfg.trainer.mode != COLOCATED
        probes = probe_costs(self.cfg, self.pools, self.prompts.rows, result.final_step) if probing else []
        self.outputs.write(result, self.last_checkpoint, probes=probes)
        return result

    def _run(self, result: RunResult, steps: int) -> None:
        """The run's steps as they complete: report, guard, save, progress; validate after each segment that
        ends at a validation step."""
        total = self.start_step + steps
        progress = Progress(steps, self.cfg.trainer.progress, self.log)
        self.outputs.console.write = progress.write  # metric and checkpoint lines above the bar
        self._clock.begin()
        every = self.cfg.trainer.test_freq if self.validator is not None else 0  # segments end at validations
        try:
            with closing(self.steps.run(steps, every)) as done:
                for event in done:
                    if isinstance(event, Drained):
                        self._validate(result, event.step)
                    else:
                        self._step(result, event, total, progress)
                    self._clock.begin()
        finally:
            progress.close()
            self.outputs.console.write = self.log

    def _step(self, result: RunResult, done: StepDone, total: int, progress: Progress) -> None:
        """One completed global step: report, guard, save, progress (and stop here when a signal asked)."""
        self._clock.finished()
        self.outputs.report(result, done.step, done.metrics)
        self._guard.check(done.step, done.results, self.last_checkpoint)
        stopping = self._signals is not None and self._signals.requested is not None
        if self.pools.should_save(done.step, last=done.step == total) or (stopping and self.cfg.trainer.save_freq > 0):
            self._clock.save_s = self.pools.save(done.step, self.outputs.console.write)
        result.checkpoint = self.last_checkpoint
        progress.update(done.step, done.metrics)
        if stopping and done.step < total:
            self._check_signal(after=done.step)

    def _validate(self, result: RunResult, step: int) -> None:
        """The validation pass after global step ``step`` (the pipeline has drained)."""
        res = validation.run_pass(self.validator, self.pools, step, self.outputs.tracker())
        result.validations.append(res)
        self.outputs.console.write(validation.summary(step, res))

    def _check_signal(self, after: int | None = None) -> None:
        """Raise ``RunStopped`` when a signal asked the run to stop."""
        sig = self._signals.requested if self._signals is not None else None
        if sig is None:
            return
        name = signal.Signals(sig).name
        at = f"after step {after}" if after is not None else f"before step {self.start_step + 1}"
        requeue = " (the scheduler's advance warning: requeue the job)" if sig == signal.SIGUSR1 else ""
        raise RunStopped(f"stopped by {name} {at}{requeue}", exit_code_of(sig), self.last_checkpoint)

    def _write_partial(self, stopped: str) -> None:
        """The trace and timeline of the steps so far (no profile: the run is incomplete)."""
        if self._partial is None or self.steps is None or not self.steps.segments:
            return
        self._partial.timeline = self.steps.timeline()
        signalled = self._signals is not None and self._signals.requested is not None
        try:
            self.outputs.write(self._partial, self.last_checkpoint, stopped=stopped, signalled=signalled)
        except Exception as err:  # never hide the reason the run stopped behind a trace error
            self.log(f"warning: could not write the partial trace: {err}")
