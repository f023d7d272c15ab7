"""A real (tiny) run's outputs: metrics file and curves, readable console lines, the resolved config next
to the trace and in each checkpoint, a line per save, logger start-up outside the timed steps, loggers
closed at the end."""

import time

import verl.utils.tracking
from omegaconf import OmegaConf
from runtime_helpers import compose_run

from verl_digen.driver import steps
from verl_digen.driver.runtime import DigenRuntime
from verl_digen.reporting import run_log
from verl_digen.workers import checkpoint as ckpt

#: a logger start-up this slow (wandb's can take seconds) would dwarf a tiny step if it were timed
SLOW_INIT_S = 3.0


def test_run_leaves_curves_config_and_readable_lines_and_times_no_logger_start_up(ray_session, tmp_path,
                                                                                    monkeypatch):
    seen: dict[str, float] = {}

    class SlowTracking(verl.utils.tracking.Tracking):
        def __init__(self, *args, **kwargs):
            time.sleep(SLOW_INIT_S)
            super().__init__(*args, **kwargs)
            seen["tracking_ready"] = time.perf_counter()

        def finish(self, exit_code: int = 0):
            if not getattr(self, "_finished", False):
                seen["finished_with"] = exit_code
            super().finish(exit_code)

    real_events = steps.events

    def timed_events(*args, **kwargs):
        seen["steps_start"] = time.perf_counter()
        return real_events(*args, **kwargs)

    monkeypatch.setattr(verl.utils.tracking, "Tracking", SlowTracking)
    monkeypatch.setattr(steps, "events", timed_events)
    lines: list[str] = []
    cfg = compose_run("trainer.total_steps=2", "trainer.save_freq=1", "trainer.logger=[console]",
                      "trainer.log_format=block", "digen.tag.policy=never", tmp_path=tmp_path)
    trainer = DigenRuntime(cfg, log=lines.append)
    try:
        result = trainer.fit()
    finally:
        trainer.shutdown()

    # the loggers were flushed and closed when fit returned (not left to the garbage collector)
    assert seen["finished_with"] == 0 and trainer.tracking is None
    # the loggers started before the executor loop, so no step's time holds their start-up
    assert seen["tracking_ready"] <= seen["steps_start"]
    assert all(r.metrics["timing/step_s"] < SLOW_INIT_S for r in result.reports), [
        r.metrics["timing/step_s"] for r in result.reports]

    # console: one rounded block per step, grouped by prefix; one line per checkpoint save
    text = "\n".join(lines)
    blocks = [b for b in lines if b.startswith("step ") and "\n" in b]
    assert [b.splitlines()[0] for b in blocks] == ["step 1/2", "step 2/2"]
    groups = [ln.split()[0] for ln in blocks[0].splitlines()[1:] if not ln.startswith("   ")]  # not wrapped
    assert groups[:3] == ["reward", "actor", "timing"] and len(groups) == len(set(groups))
    mean = result.reports[0].metrics["reward/mean"]
    assert f"mean={mean:.4g}" in blocks[0] and repr(mean) not in text
    for step in (1, 2):
        assert f"step {step}: saved checkpoint {tmp_path / 'ckpt' / f'global_step_{step}'}" in text

    # files the run leaves
    trace = tmp_path / "trace"
    rows = run_log.read_metrics(trace / "digen_metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and {r["run_id"] for r in rows} == {trainer.run_id}
    assert rows[1]["reward/mean"] == result.reports[1].metrics["reward/mean"]  # full precision on disk
    assert (trace / "digen_curves.png").read_bytes()[:4] == b"\x89PNG"
    resolved = OmegaConf.structured(cfg)
    assert OmegaConf.load(trace / "config.yaml") == resolved
    for step in (1, 2):
        assert OmegaConf.load(tmp_path / "ckpt" / f"global_step_{step}" / ckpt.CONFIG_FILE) == resolved
