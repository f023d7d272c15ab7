"""What a run leaves behind, in one place: the loggers (verl's ``Tracking`` with our console), the per-step
metrics file, the step reports, and the trace, timeline, curves and measured profile written at the end
(or, partial, when the run stops). The runtime hands it numbers and timelines; nothing here runs a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_digen.config import RunConfig
from verl_digen.config.schema import log_format
from verl_digen.driver import native_memory, validation
from verl_digen.reporting import run_log
from verl_digen.reporting.metrics import measured_profile
from verl_digen.reporting.step_reports import StepReport, StepReports
from verl_digen.schedule.export import chrome_trace
from verl_digen.schedule.profile_io import dump_profile
from verl_digen.schedule.timeline import Timeline


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


class RunOutputs:
    """The run's loggers and files (see the module docstring); ``log`` is the run's plain line writer."""

    def __init__(self, cfg: RunConfig, log, run_id: str) -> None:
        self.cfg, self.log, self.run_id = cfg, log, run_id
        self.tracking = None
        self.console = run_log.ConsoleLogger(log, total=cfg.trainer.total_steps, fmt=log_format(cfg))
        self.history: run_log.MetricsLog | None = None

    def tracker(self):
        """verl's ``Tracking`` of the run, started on first use with our console backend."""
        if self.tracking is None:
            from omegaconf import OmegaConf
            from verl.utils.tracking import Tracking

            t = self.cfg.trainer
            self.tracking = Tracking(t.project_name, t.experiment_name, default_backend=list(t.logger),
                                     config=OmegaConf.to_container(OmegaConf.structured(self.cfg)))
            run_log.install_console(self.tracking, self.console)  # rounded, grouped, clear of the bar
        return self.tracking

    def start(self, start_step: int) -> None:
        """Before the first timed step: start the loggers (wandb / tensorboard start-up would otherwise
        land in a step's time), save the resolved config and open the per-step metrics file."""
        self.tracker()
        trace_dir = self.cfg.trainer.trace_dir
        if trace_dir:
            run_log.save_resolved_config(self.cfg, trace_dir)
            self.history = run_log.MetricsLog(run_log.metrics_path(trace_dir, self.cfg.trainer.mode),
                                              keep_through=start_step, run_id=self.run_id)

    def report(self, result: RunResult, step: int, metrics: dict[str, float]) -> None:
        """Record global step ``step``'s report and log it (Tracking, the metrics file)."""
        result.reports.append(StepReport(step, metrics))
        self.tracker().log(data=metrics, step=step)
        if self.history is not None:
            self.history.append(step, metrics)
        native_memory.trim(step)

    def finish(self, exit_code: int) -> None:
        """Flush the loggers now (tensorboard's last events, wandb's run state: failed when
        ``exit_code`` != 0) rather than whenever the garbage collector gets to verl's ``Tracking``
        (the verl commit that verl-omni pins has no ``finish``: there it is left to the collector)."""
        finish = getattr(self.tracking, "finish", None)
        if finish is not None:
            finish(exit_code=exit_code)
        self.tracking = None

    def write(self, result: RunResult, checkpoint: str | None, violation: str | None = None,
              probes: list[dict[str, Any]] | None = None, stopped: str | None = None,
              signalled: bool = False) -> None:
        """Trace, timeline (with the run id; each file written atomically), violation or profile.
        ``signalled``: a signal stopped the run (no curves: seconds of the grace; a resume redraws them)."""
        trace_dir = self.cfg.trainer.trace_dir
        if not trace_dir or result.timeline is None:
            return
        mode = self.cfg.trainer.mode
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
        result.trace_path = str(Path(trace_dir) / f"{mode}_trace.json")
        trace = chrome_trace(result.timeline, title=f"verl-digen {mode}")
        about = {"run_id": self.run_id, "complete": stopped is None and violation is None,
                 "stopped": stopped, "checkpoint": checkpoint}
        trace["otherData"] = {**trace.get("otherData", {}), **about}  # JSON values: true, null, not "True"
        run_log.write_json_atomic(result.trace_path, trace)
        run_log.write_json_atomic(Path(trace_dir, f"{mode}_timeline.json"),
                                  {"mode": mode, **about, "staleness": result.timeline.staleness,
                                   "workers": list(result.timeline.workers), "records": result.timeline.to_dicts()})
        if stopped is None or not signalled:
            self._write_curves(trace_dir, mode)
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
        if self.history is None or not path.exists():
            return
        try:
            from verl_digen.reporting.plots import save_curves_png

            rows = run_log.read_run_metrics(trace_dir, mode)
            if rows:
                save_curves_png(rows, Path(trace_dir, f"{mode}_curves.png"), title=f"verl-digen {mode}")
        except Exception as err:  # noqa: BLE001 - the curves are a convenience
            self.log(f"warning: could not draw {mode}_curves.png: {type(err).__name__}: {err}")
