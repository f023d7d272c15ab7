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

import math
import os
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group
from verl.single_controller.ray.base import RayClassWithInitArgs, RayWorkerGroup

from verl_digen.config import RunConfig, checks, validate
from verl_digen.config.judge import placement as judge_placement
from verl_digen.config.memory import generation_copy_resident
from verl_digen.config.plan import prior_stage_costs
from verl_digen.config.schema import log_format
from verl_digen.config.stop_plan import SAVE_BEGAN_KEY
from verl_digen.data import PromptDataset
from verl_digen.driver import native_memory, validation
from verl_digen.driver.accumulator import StepAccumulator, StepResults
from verl_digen.driver.faults import fault_policy, note_dead_workers, plain_log
from verl_digen.driver.pools import (
    NODE_RESOURCE_PER_WORKER,
    PlacedResourcePool,
    check_cluster_fits,
    ensure_ray,
    stop_own_ray,
)
from verl_digen.driver.probe import probe_costs
from verl_digen.driver.ray_backend import WORKER_METHODS
from verl_digen.driver.stopping import (
    STOP_EXIT_S,
    AbandonStep,
    GuardedBackend,
    RunStopped,
    StepClock,
    StopSignals,
    abandon_cause,
    exit_code_of,
    grace_decision,
)
from verl_digen.reporting import metric_names as names
from verl_digen.reporting import run_log
from verl_digen.reporting.metrics import measured_profile, schedule_metrics, window_metrics
from verl_digen.reporting.progress import Progress, Recent, forget_read
from verl_digen.reporting.step_reports import StepReport, StepReports
from verl_digen.reporting.trace_stream import RecordStream, restore_segments
from verl_digen.rewards.custom import served_specs, with_pool
from verl_digen.schedule import ScheduleConfig, StepScheduler
from verl_digen.schedule.actions import SWITCH_TO_GEN, SWITCH_TO_TRAIN
from verl_digen.schedule.colocated import ColocatedScheduler
from verl_digen.schedule.config import COLOCATED
from verl_digen.schedule.executor import Completion, run
from verl_digen.schedule.export import chrome_trace
from verl_digen.schedule.profile_io import dump_profile
from verl_digen.schedule.timeline import (
    TRAINER,
    Record,
    Timeline,
    TimelineError,
    check_timeline,
    concat_timelines,
)
from verl_digen.workers import checkpoint as ckpt
from verl_digen.workers.actor import HybridWorker, TSPActorWorker
from verl_digen.workers.generator import GeneratorWorker
from verl_digen.workers.sync import WeightSync, sync_backend


@dataclass
class RunResult:
    reports: StepReports = field(default_factory=StepReports)
    timeline: Timeline | None = None
    final_step: int = 0
    profile_path: str | None = None
    trace_path: str | None = None
    run_id: str = ""
    checkpoint: str | None = None  # the last checkpoint this run wrote
    validations: list[validation.ValidationResult] = field(default_factory=list)


def new_run_id() -> str:
    """A run id: start time and a random suffix (written into every checkpoint and trace)."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:8]


class DigenRuntime:
    """Builds the pools and worker groups of a run and executes its global steps.

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
        self.resume_path = checks.resolve_resume(cfg)
        self.data_offset = 0  # data position - step x batch (non-zero after a resume that changed the batch)
        self.last_checkpoint: str | None = None
        self._lock_root: str | None = None
        self._bad_streak = 0
        self._signals: StopSignals | None = None
        self._clock = StepClock()  # the step in progress, for the SIGTERM grace decision
        self._partial: RunResult | None = None
        self._segments: list[tuple[int, Timeline]] = []  # (first step - start_step, timeline) per segment
        self.validator: validation.Validator | None = None
        self.worker_cfg = replace(cfg.worker_config(), keep_generation_copy=generation_copy_resident(cfg))
        self.k = cfg.trained_steps()
        self.dataset = (PromptDataset.from_file(cfg.data.train_files, cfg.data.prompt_key) if cfg.data.train_files
                        else PromptDataset.synthetic(cfg.data.synthetic_prompts))
        self.use_gpu = cfg.trainer.device == "cuda"
        self.start_step = 0
        self.gen_wg: RayWorkerGroup | None = None
        self.trn_wg: RayWorkerGroup | None = None
        self.sync: WeightSync | None = None
        self.tracking = None
        self._console = run_log.ConsoleLogger(log, total=cfg.trainer.total_steps, fmt=log_format(cfg))
        self._history: run_log.MetricsLog | None = None
        self._pools: list[PlacedResourcePool] = []
        self.judge = judge_placement(cfg)  # the served judge: apart (replicas the driver starts) or in-process
        self._judges: list[Any] = []
        if self.judge is not None and self.judge.pooled:
            self.worker_cfg = replace(self.worker_cfg, reward=with_pool(self.worker_cfg.reward,
                                                                        f"digen_judge_{self.run_id}_"))

    # ---------------------------------------------------------------------------------- setup
    def _group(self, cls, workers: int, prefix: str, node_resource: str | None,
               threads: int = 1, restarts: int = 0) -> RayWorkerGroup:
        prefix = f"{prefix}_{uuid.uuid4().hex[:6]}_"  # several runs may share one Ray session
        pool = PlacedResourcePool(workers, self.use_gpu, prefix, node_resource)
        self._pools.append(pool)
        actor_cls = RayClassWithInitArgs(cls=ray.remote(cls), cfg=self.worker_cfg)
        if threads > 1:  # a second thread serves weight pickups while the first trains
            actor_cls.update_options({"max_concurrency": threads})
        if restarts:  # Ray restarts a dead actor; the backend restores and retries it (driver/faults.py)
            actor_cls.update_options({"max_restarts": restarts})
        wg = RayWorkerGroup(pool, actor_cls, name_prefix=prefix, device_name="cuda" if self.use_gpu else "cpu")
        wg.init_model()
        return wg

    def _workers(self) -> list[tuple[str, int, Any]]:
        """(role, rank, actor) of every worker of the run's pools."""
        trainer = "colocated" if self.cfg.trainer.mode == COLOCATED else "trainer"
        return [(role, rank, actor) for role, wg in ((trainer, self.trn_wg), ("generator", self.gen_wg))
                if wg is not None for rank, actor in enumerate(wg.workers)]

    def init_workers(self) -> None:
        """Claim the checkpoint directory, create the worker groups (the expensive part) and wire
        weight sync."""
        t = self.cfg.trainer
        if t.save_freq > 0 and self._lock_root is None:
            try:
                ckpt.acquire_lock(t.default_local_dir, self.run_id)
            except ckpt.CheckpointError as err:
                from verl_digen.config import ConfigError

                raise ConfigError("trainer.default_local_dir", t.default_local_dir, str(err)) from None
            self._lock_root = t.default_local_dir
        ensure_ray(self.cfg)
        res = self.cfg.resources
        if self.cfg.trainer.mode == COLOCATED:
            need = {"resources": (self.cfg.total_workers, res.trainer.node_resource)}
        else:
            need = {"resources.generator.workers": (res.generator.workers, res.generator.node_resource),
                    "resources.trainer.workers": (res.trainer.workers, res.trainer.node_resource)}
        if self.judge is not None and self.judge.own_pool and (self.use_gpu or res.reward.node_resource):
            need["resources.reward.workers"] = (res.reward.workers, res.reward.node_resource)
        check_cluster_fits(need, self.use_gpu)
        warning = checks.model_source(self.cfg, single_node=len(ray.nodes()) == 1)
        if warning:
            self.log(f"warning: {warning}")
        if self.cfg.trainer.mode == COLOCATED:
            self.trn_wg = self._group(HybridWorker, self.cfg.total_workers, "colocated",
                                      res.trainer.node_resource)
        else:
            # the probe's TAG cycle needs the hybrid trainer even when the policy never switches
            tag = self.cfg.schedule_config().policy != "never" or self.probe
            backend = sync_backend(self.cfg.digen.sync.backend)  # collective: a second thread serves pickups/relays
            self.gen_wg = self._group(GeneratorWorker, res.generator.workers, "generator",
                                      res.generator.node_resource, backend.generator_threads,
                                      restarts=fault_policy(self.cfg).max_restarts)
            self.trn_wg = self._group(HybridWorker if tag else TSPActorWorker, res.trainer.workers, "trainer",
                                      res.trainer.node_resource, backend.trainer_threads)
            self.sync = WeightSync(self.cfg.digen.sync.backend)
            self.sync.setup(self.trn_wg, self.gen_wg, device=self.cfg.trainer.device)
        if self.judge is not None and self.judge.pooled:
            self._start_judge()
        if self.resume_path:
            self._resume(self.resume_path)
        elif self.cfg.trainer.resume_from == "auto":
            self.log(f"trainer.resume_from=auto: no complete checkpoint in {self.cfg.trainer.default_local_dir}, "
                     "starting from step 0")

    def _start_judge(self) -> None:
        """The served judge's replicas apart (rewards/served.py): on GPUs of their own (``resources.reward``), or on
        ``tensor_parallel_size`` consecutive generator ranks' GPUs each, in the first rank's placement bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from verl_digen.rewards import served

        spec = served.spec_from(next(iter(served_specs(self.worker_cfg.reward))))
        tp, res = spec.tensor_parallel_size, self.cfg.resources.reward
        if self.judge.own_pool:
            opts: dict[str, Any] = {"num_gpus": tp} if self.use_gpu else {}
            if res.node_resource:
                opts["resources"] = {res.node_resource: tp * NODE_RESOURCE_PER_WORKER}
            placements = [(opts, None)] * self.judge.replicas
        else:
            wg = self.gen_wg if self.gen_wg is not None else self.trn_wg
            visible = ray.get([w.get_cuda_visible_devices.remote() for w in wg.workers])
            pg = wg.resource_pool.get_placement_groups()[0]  # one placement group per pool: rank r is bundle r
            placements = [({"num_gpus": 0, "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, rank)}, devices)
                          for rank, devices in served.replica_devices(visible, tp)]
        self._judges = served.start_replicas(spec, placements)
        self.log(f"reward model served: {self.judge.describe()}")

    def _resume(self, path: str) -> None:
        extras = ray.get([w.load_checkpoint.remote(path) for w in self.trn_wg.workers])
        self.start_step = int(extras[0]["step"])
        self.last_checkpoint = path
        position = int(extras[0].get("data_position", self.start_step * self.cfg.data.train_batch_size))
        self.data_offset = position - self.start_step * self.cfg.data.train_batch_size
        self.parent_run = extras[0].get("run_id")
        if self.sync is not None:  # generators start from the restored weights
            self.sync.sync(self.start_step)
        self.log(f"resumed from {path} at step {self.start_step} (run {self.run_id}, continuing run "
                 f"{self.parent_run or '?'})")

    def shutdown(self) -> None:
        """Kill the workers and release their placement groups; stop the Ray head the run started for
        itself (a cluster it joined, or one started before the run, stays up)."""
        if self._judges:
            from verl_digen.rewards.served import stop_replicas

            stop_replicas(self._judges)
            self._judges = []
        for wg in (self.gen_wg, self.trn_wg):
            if wg is not None:
                for w in wg.workers:
                    ray.kill(w)
        for pool in self._pools:
            for pg in pool.pgs or []:
                remove_placement_group(pg)
        self._pools.clear()
        self.gen_wg = self.trn_wg = None
        if self._lock_root is not None:
            ckpt.release_lock(self._lock_root, self.run_id)
            self._lock_root = None
        stop_own_ray()

    # ---------------------------------------------------------------------------------- helpers
    def _prompts_of(self, step: int) -> tuple[list[int], list[str]]:
        p = self.cfg.data.train_batch_size
        return self.dataset.batch(self.data_offset + step * p, p)

    def _rows(self, step: int, samples) -> tuple[list[tuple[int, int]], list[str]]:
        """Scheduler (prompt-in-step, sample) pairs -> global (prompt id, sample) rows and their texts."""
        ids, texts = self._prompts_of(step)
        return [(ids[p], s) for p, s in samples], [texts[p] for p, _ in samples]

    def _scale(self) -> float:
        """Loss scale: 1 / rows of a mini-batch (the global step, with one), so accumulation gives the
        mini-batch's mean gradient, as verl's mini-batch loop takes it."""
        return 1.0 / (self.cfg.batch // self.cfg.mini_batches() * self.k)

    def _tracking(self):
        if self.tracking is None:
            from omegaconf import OmegaConf
            from verl.utils.tracking import Tracking

            t = self.cfg.trainer
            self.tracking = Tracking(t.project_name, t.experiment_name, default_backend=list(t.logger),
                                     config=OmegaConf.to_container(OmegaConf.structured(self.cfg)))
            run_log.install_console(self.tracking, self._console)  # rounded, grouped, clear of the bar
        return self.tracking

    def _start_outputs(self) -> None:
        """Before the first timed step: start the loggers (wandb / tensorboard start-up would otherwise
        land in a step's time), save the resolved config and open the per-step metrics file."""
        self._tracking()
        if self.cfg.data.val_files and self.cfg.trainer.test_freq > 0:
            self.validator = validation.Validator(self.cfg, keep_through=self.start_step, run_id=self.run_id)
        trace_dir = self.cfg.trainer.trace_dir
        if trace_dir:
            run_log.save_resolved_config(self.cfg, trace_dir)
            self._history = run_log.MetricsLog(run_log.metrics_path(trace_dir, self.cfg.trainer.mode),
                                               keep_through=self.start_step, run_id=self.run_id)

    def _save(self, step: int) -> str:
        """An atomic, owned checkpoint of ``step`` (see workers/checkpoint.py); old ones beyond
        ``trainer.max_checkpoints`` are removed."""
        t = self.cfg.trainer
        path = str(ckpt.step_dir(t.default_local_dir, step))
        extra = {"step": step, "data_position": self.data_offset + step * self.cfg.data.train_batch_size,
                 "run_id": self.run_id, "parent_run": getattr(self, "parent_run", None),
                 "config": checks.fingerprint(self.cfg),
                 ckpt.CONFIG_YAML_KEY: run_log.resolved_config_yaml(self.cfg),
                 SAVE_BEGAN_KEY: time.time()}  # the next dry run's measured save time (config/stop_plan.py)
        t0 = time.perf_counter()
        ray.get([w.save_checkpoint.remote(path, extra, t.max_checkpoints, t.export_on_save)
                 for w in self.trn_wg.workers])
        self._clock.save_s = time.perf_counter() - t0
        self.last_checkpoint = path
        exported = f", export in {path}/export" if t.export_on_save else ""
        self._console.write(f"step {step}: saved checkpoint {path} ({time.perf_counter() - t0:.2f} s{exported})")
        return path

    def _should_save(self, step: int, last: bool) -> bool:
        f = self.cfg.trainer.save_freq
        return f > 0 and (step % f == 0 or last)

    # ---------------------------------------------------------------------------------- run
    def fit(self) -> RunResult:
        """Run ``trainer.total_steps`` global steps (from the resume point) and return the reports.

        Stops early with ``RunStopped`` on a signal (SIGINT: after the current step, checkpointed when
        ``trainer.save_freq`` > 0, a second abandons it; SIGTERM: the same when the step fits
        ``trainer.stop_grace_s``, else at once; SIGUSR1: after the step, for a requeue) and on non-finite
        values (see ``trainer.on_nonfinite``); on any stop or failure the trace of the steps so far is
        written before the error propagates. The handlers are in place before Ray starts: a signal while
        it starts stops the run with its line too."""
        with StopSignals(self.log, decide=self._grace_decision, deadline=self._grace_deadline) as sig:
            self._signals = sig
            exit_code = 1
            try:
                ensure_ray(self.cfg)
                result = self._fit()
                exit_code = 0
                return result
            except AbandonStep as ab:
                raise self._abandoned(ab) from None
            except RunStopped as stop:
                self._write_partial(stop.reason)
                raise
            except TimelineError:
                raise
            except Exception as err:  # a dead worker, a failed call: keep what was measured
                ab = abandon_cause(err)
                if ab is not None:
                    raise self._abandoned(ab) from None
                note_dead_workers(err, self._workers())  # the call that noticed is often not the one that died
                self._write_partial(f"failed: {type(err).__name__}")
                raise
            finally:
                self._signals = None
                self._finish_tracking(exit_code)

    def _abandoned(self, ab: AbandonStep) -> RunStopped:
        name = signal.Signals(ab.signum).name
        self._write_partial(f"{name}: step abandoned ({ab.why})")
        return RunStopped(f"stopped by {name} (the step in progress was abandoned: {ab.why})",
                          exit_code_of(ab.signum), self.last_checkpoint)

    def _grace_decision(self) -> tuple[bool, str]:
        """On SIGTERM: finish the step in progress, or abandon it (``stopping.grace_decision``)."""
        return grace_decision(self._clock.remaining(), self.cfg.trainer.stop_grace_s)

    def _grace_deadline(self) -> float | None:
        """Seconds after a SIGTERM by which the step being finished and its save must end (None: no grace)."""
        grace = self.cfg.trainer.stop_grace_s
        return None if grace is None else grace - STOP_EXIT_S

    def _finish_tracking(self, exit_code: int) -> None:
        """Flush the loggers now (tensorboard's last events, wandb's run state: failed when
        ``exit_code`` != 0) rather than whenever the garbage collector gets to verl's ``Tracking``
        (the verl commit that verl-omni pins has no ``finish``: there it is left to the collector)."""
        finish = getattr(self.tracking, "finish", None)
        if finish is not None:
            finish(exit_code=exit_code)
        self.tracking = None

    def _fit(self) -> RunResult:
        if self.trn_wg is None:
            self.init_workers()
        steps = self.cfg.trainer.total_steps - self.start_step
        if steps <= 0:
            self.log(f"nothing to do: checkpoint is at step {self.start_step} >= total_steps")
            return RunResult(final_step=self.start_step, run_id=self.run_id, checkpoint=self.last_checkpoint)
        self._check_signal()
        self._start_outputs()
        result = self._run(steps)
        result.final_step = self.start_step + steps
        try:
            for _, part in self._segments:  # each segment was scheduled (and is judged) on its own
                check_timeline(part)
        except TimelineError as e:
            self._write_outputs(result, violation=str(e))
            raise TimelineError(f"the run broke a scheduling invariant: {e} (timeline written to "
                                f"{self.cfg.trainer.trace_dir or 'nowhere: trainer.trace_dir is unset'})") from e
        probes = (probe_costs(self.cfg, self.gen_wg, self.trn_wg, self._rows, result.final_step)
                  if self._probing() else [])
        self._write_outputs(result, probes=probes)
        return result

    def _probing(self) -> bool:
        return self.probe and bool(self.cfg.trainer.trace_dir) and self.cfg.trainer.mode != COLOCATED

    def _write_partial(self, stopped: str) -> None:
        """The trace and timeline of the steps so far (no profile: the run is incomplete)."""
        if self._partial is not None and self._segments:
            self._partial.timeline = concat_timelines(self._segments)
            try:
                self._write_outputs(self._partial, stopped=stopped)
            except Exception as err:  # never hide the reason the run stopped behind a trace error
                self.log(f"warning: could not write the partial trace: {err}")

    def _write_outputs(self, result: RunResult, violation: str | None = None,
                       probes: list[dict[str, Any]] | None = None, stopped: str | None = None) -> None:
        """Trace, timeline (with the run id; each file written atomically), violation or profile."""
        trace_dir = self.cfg.trainer.trace_dir
        if not trace_dir or result.timeline is None:
            return
        mode = self.cfg.trainer.mode
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
        result.trace_path = str(Path(trace_dir) / f"{mode}_trace.json")
        trace = chrome_trace(result.timeline, title=f"verl-digen {mode}")
        about = {"run_id": self.run_id, "complete": stopped is None and violation is None,
                 "stopped": stopped, "checkpoint": self.last_checkpoint}
        trace["otherData"] = {**trace.get("otherData", {}), **about}  # JSON values: true, null, not "True"
        run_log.write_json_atomic(result.trace_path, trace)
        run_log.write_json_atomic(Path(trace_dir, f"{mode}_timeline.json"),
                          {"mode": mode, **about, "staleness": result.timeline.staleness,
                           "workers": list(result.timeline.workers), "records": result.timeline.to_dicts()})
        if stopped is None or self._signals is None or self._signals.requested is None:
            self._write_curves(trace_dir, mode)  # not on a signal's stop (seconds of the grace); a resume redraws
        if stopped is not None:
            return
        if violation is not None:
            Path(trace_dir, f"{mode}_violation.txt").write_text(violation + "\n")
            return
        result.profile_path = str(Path(trace_dir) / f"{mode}_profile.json")
        if probes:  # kept beside the timeline: the profile can be fitted again from what was measured
            run_log.write_json_atomic(Path(trace_dir, f"{mode}_probes.json"), {"samples": probes})
        model, workload = measured_profile(self.cfg, result.timeline, probes)
        dump_profile(model, result.profile_path, name=f"measured {mode} run", workload=workload)

    def _write_curves(self, trace_dir: str, mode: str) -> None:
        """``<mode>_curves.png`` from the metrics file (a plotting failure never fails the run)."""
        path = run_log.metrics_path(trace_dir, mode)
        if self._history is None or not path.exists():
            return
        try:
            from verl_digen.reporting.plots import save_curves_png

            rows = run_log.read_run_metrics(trace_dir, mode)
            if rows:
                save_curves_png(rows, Path(trace_dir, f"{mode}_curves.png"), title=f"verl-digen {mode}")
        except Exception as err:  # noqa: BLE001 - the curves are a convenience
            self.log(f"warning: could not draw {mode}_curves.png: {type(err).__name__}: {err}")

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

    def _report(self, result: RunResult, step: int, metrics: dict[str, float]) -> None:
        """Record global step ``step``'s report and log it (Tracking, the metrics file)."""
        result.reports.append(StepReport(step, metrics))
        self._tracking().log(data=metrics, step=step)
        if self._history is not None:
            self._history.append(step, metrics)
        native_memory.trim(step)

    def _scheduler(self, steps: int):
        cfg = self.cfg
        sched_cfg: ScheduleConfig = cfg.schedule_config(steps=steps)
        if cfg.trainer.mode == COLOCATED:
            return ColocatedScheduler(sched_cfg, [f"col{i}" for i in range(len(self.trn_wg.workers))])
        return StepScheduler(sched_cfg, prior_stage_costs(cfg), gen_workers=cfg.resources.generator.workers,
                             trainer_ranks=len(self.trn_wg.workers))

    def _run(self, steps: int) -> RunResult:
        """The executor loop on the Ray backend, once per segment (validation cuts the run at its
        steps: driver/validation.py); per-step reports, checkpoints and progress as each optimizer
        step completes, and a validation pass after each segment that ends at a validation step."""
        first, total = self.start_step, self.start_step + steps
        freq = self.cfg.trainer.test_freq if self.validator is not None else 0  # every segment ends at a validation
        result = RunResult(run_id=self.run_id)
        self._partial = result
        self._segments = []
        progress = Progress(steps, self.cfg.trainer.progress, self.log)
        self._console.write = progress.write  # metric and checkpoint lines above the bar
        # the timeline streamed to disk as the run goes (a crash keeps it; a resume appends); without a
        # trace_dir to a scratch file: either way the driver holds only a window of it until the end
        t = self.cfg.trainer
        header = {"run_id": self.run_id, "mode": t.mode, "first_step": first}
        if t.trace_dir:
            stream = RecordStream(Path(t.trace_dir, f"{t.mode}_timeline.jsonl"), [], header, keep_through=first)
        else:
            fd, scratch = tempfile.mkstemp(prefix="digen-timeline-", suffix=".jsonl")
            os.close(fd)
            stream = RecordStream(scratch, [], header)
        t0, finished = None, False
        try:
            base = first
            for length in validation.segments(first, total, freq):
                t0 = self._run_segment(result, base, length, total, progress, stream, t0)
                base += length
                if freq > 0:
                    self._validate(result, base)
            finished = True
        finally:
            stream.close()
            progress.close()
            self._console.write = self.log
            try:
                restore_segments(stream.path, self._segments)
            except Exception as err:
                if finished:
                    raise
                # never hide why the run stopped behind this: the partial trace then holds the last window
                self.log(f"warning: could not read the timeline back from {stream.path}: {err}")
            finally:
                if not t.trace_dir:
                    stream.path.unlink(missing_ok=True)
        result.timeline = concat_timelines(self._segments)
        return result

    def _run_segment(self, result: RunResult, base: int, steps: int, total: int, progress: Progress,
                     stream: RecordStream, t0: float | None) -> float:
        """Global steps ``base + 1 .. base + steps`` through one scheduler; returns the time origin,
        which later segments share so the run's timeline stays one time axis."""
        sched = self._scheduler(steps)
        colocated = isinstance(sched, ColocatedScheduler)
        acc = StepAccumulator(self.cfg.rollout.n, self.cfg.advantage())
        backend = GuardedBackend(self.gen_wg, self.trn_wg, self.sync, self._rows, acc.advantages, self._scale(),
                                  base, stall_timeout_s=self.cfg.trainer.stall_timeout_s,
                                  base_step=base, checkpoint=lambda: self.last_checkpoint,
                                  faults=fault_policy(self.cfg, self.log),
                                  estimate=None if colocated else (lambda a: sched.costs.duration(a.kind)))
        if t0 is not None:
            backend.t0 = t0
        self._segments.append((base - self.start_step, sched.timeline))
        stream.follow(sched.timeline.records, base - self.start_step)
        last_end = prev_start = backend.now()  # a later segment's first step starts after the validation
        window = Recent(sched.timeline.records)
        decisions = Recent(getattr(sched, "decisions", []))
        self._clock.begin()

        def on_complete(c: Completion) -> None:
            nonlocal last_end, prev_start
            done = acc.add(c)
            if done is None:  # not an optimizer step: the step goes on
                return
            a, end = c.action, c.end
            g = base + a.step
            self._clock.finished()
            # this step's records end after the previous step's window began (a stale generation starts
            # once the version it uses exists): per-step work stays flat however long the run
            recent = window.since(lambda r: r.end >= prev_start - 1e-9)
            step_decisions = decisions.since(lambda d: d.step >= a.step - 1)
            self._report(result, g + 1, self._step_metrics(sched, a.step, done, last_end, end, recent, step_decisions))
            prev_start, last_end = last_end, end
            self._guard(g + 1, done)
            stopping = self._signals is not None and self._signals.requested is not None
            if self._should_save(g + 1, last=g + 1 == total) or (stopping and self.cfg.trainer.save_freq > 0):
                self._save(g + 1)
            result.checkpoint = self.last_checkpoint
            stream.flush()  # then forget what is on disk and behind this step's window
            forget_read(sched.timeline.records, window, stream)
            forget_read(decisions.items, decisions)
            progress.update(g + 1, result.reports[-1].metrics)
            if stopping and g + 1 < total:
                self._check_signal(after=g + 1)
            self._clock.begin()

        run(sched, backend, on_complete, check=False)
        return backend.t0

    def _validate(self, result: RunResult, step: int) -> None:
        """The validation pass after global step ``step`` (the pipeline has drained): the generators get
        that version first (colocated: the ranks switch to generation and back)."""
        colocated = self.gen_wg is None
        ema = self.cfg.trainer.val_with_ema  # the EMA stands in for the weights while they are validated
        if ema:
            ray.get(self.trn_wg.execute_all_async("use_ema", True))
        if colocated:
            ray.get(self.trn_wg.execute_all_async(WORKER_METHODS[SWITCH_TO_GEN]))
            workers = self.trn_wg.workers
        else:
            self.sync.sync(step)
            workers = self.gen_wg.workers
        try:
            res = self.validator.run(workers, step, step, self._tracking())
        finally:
            if colocated:
                ray.get(self.trn_wg.execute_all_async(WORKER_METHODS[SWITCH_TO_TRAIN]))
            if ema:
                ray.get(self.trn_wg.execute_all_async("use_ema", False))
                if not colocated:  # the generators go on from the trained weights of this version
                    self.sync.sync(step)
        result.validations.append(res)
        m = res.metrics
        self._console.write(f"step {step}: validation reward {m['val/reward_mean']:+.4f} "
                            f"(std {m['val/reward_std']:.4f}, {int(m['val/samples'])} prompts, "
                            f"{m['val/seconds']:.2f} s)" + (f", samples in {res.png}" if res.png else ""))

    def _check_signal(self, after: int | None = None) -> None:
        """Raise ``RunStopped`` when a signal asked the run to stop."""
        sig = self._signals.requested if self._signals is not None else None
        if sig is None:
            return
        name = signal.Signals(sig).name
        at = f"after step {after}" if after is not None else f"before step {self.start_step + 1}"
        requeue = " (the scheduler's advance warning: requeue the job)" if sig == signal.SIGUSR1 else ""
        raise RunStopped(f"stopped by {name} {at}{requeue}", exit_code_of(sig), self.last_checkpoint)

    def _guard(self, step: int, done: StepResults) -> None:
        """The NaN guard's driver half: the trainer skipped the optimizer step of a non-finite step
        (``TSPActorWorker.optimizer_step``); name the quantity, count consecutive bad steps, and stop
        with ``RunStopped`` per ``trainer.on_nonfinite`` / ``trainer.max_nonfinite_steps``."""
        opt, rewards = done.optimizer, done.rewards
        if not opt.skipped:
            self._bad_streak = 0
            return
        bad_rewards = [r for r in rewards if not math.isfinite(r)]
        norm = opt.grad_norm
        if bad_rewards:
            what = f"reward ({len(bad_rewards)} of {len(rewards)} samples, e.g. {bad_rewards[0]})"
        elif not math.isfinite(done.train.loss):
            what = f"loss (actor/loss = {done.train.loss})"
        elif opt.nonfinite == "grad_norm" or (norm is not None and not math.isfinite(norm)):
            what = f"gradient norm ({norm})"
        else:
            what = str(opt.nonfinite)
        self._bad_streak += 1
        t = self.cfg.trainer
        self.log(f"step {step}: non-finite {what}: optimizer step skipped, weights unchanged "
                 f"({self._bad_streak}/{t.max_nonfinite_steps} consecutive)")
        if t.on_nonfinite == "stop" or self._bad_streak >= t.max_nonfinite_steps:
            raise RunStopped(f"stopped at step {step}: non-finite {what} in {self._bad_streak} consecutive step(s) "
                             f"(trainer.on_nonfinite={t.on_nonfinite}, trainer.max_nonfinite_steps="
                             f"{t.max_nonfinite_steps})", 3, self.last_checkpoint)
