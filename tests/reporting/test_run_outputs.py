"""What a run leaves for people, without Ray: the metrics file, curves, ``digen plot``, the Gantt's colours
and legend, console lines, the resolved config (docs/user-guide.md, "Outputs")."""

import io
import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from verl_digen.cli import main
from verl_digen.config import compose
from verl_digen.reporting import run_log
from verl_digen.reporting.plots import PANELS, curve_panels, plot_trace_dir, save_curves_png
from verl_digen.reporting.progress import Progress
from verl_digen.schedule import presets
from verl_digen.schedule.actions import GENERATE, TAG_GENERATE, UPDATE, ActionKind
from verl_digen.schedule.config import ScheduleConfig
from verl_digen.schedule.export import (
    COLORS,
    STALE_LABEL,
    STEP_LABEL,
    gantt_figure,
    gantt_legend,
    gantt_rows,
    timeline_from_file,
)
from verl_digen.schedule.simulator import simulate
from verl_digen.schedule.timeline import Record, Timeline, record_dict
from verl_digen.workers import checkpoint as ckpt


def _row(step, mean, std, colocated=False):
    return {"reward/mean": mean, "reward/std": std, "timing/step_s": 0.5 + step, "perf/ideal_step_s": 0.25,
            "pool/generator_busy": 0.0 if colocated else 0.75, "pool/generator_bubble": 0.0 if colocated else 0.25,
            "pool/trainer_busy": 0.5, "actor/loss": 1.0 / 3.0}


def _stale_run():
    """A simulated digen run with TCSS (stale generations) and TAG."""
    cfg = ScheduleConfig(prompts=4, group_size=8, mb_size=1, steps=3, tsp_degree=4, policy="bts", staleness=0.25)
    return simulate(cfg, presets.get("wan2.1-14b-16").model).timeline


def _write_trace_dir(path, timeline, rows, mode="digen"):
    """The files a run leaves in its trace dir (same formats as DigenRuntime._write_outputs / _report)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{mode}_timeline.json").write_text(json.dumps(
        {"mode": mode, "workers": list(timeline.workers), "records": timeline.to_dicts()}))
    log = run_log.MetricsLog(run_log.metrics_path(path, mode), run_id="r")
    for step, row in enumerate(rows, 1):
        log.append(step, row)


# ------------------------------------------------------------------------------------------ metrics file
def test_metrics_file_appends_per_step_and_a_resume_keeps_only_the_steps_before_it(tmp_path):
    path = run_log.metrics_path(tmp_path, "digen")
    log = run_log.MetricsLog(path, run_id="a")
    for step in (1, 2, 3):
        log.append(step, {"reward/mean": step / 3.0, "note": "not a number", "flag": True})
    rows = run_log.read_metrics(path)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[0]["run_id"] == "a"
    assert rows[0]["reward/mean"] == 1.0 / 3.0  # full precision on disk
    assert "note" not in rows[0] and "flag" not in rows[0]
    with path.open("a") as f:  # a run killed mid-write leaves half a line
        f.write('{"step": 4, "reward/me')
    assert [r["step"] for r in run_log.read_metrics(path)] == [1, 2, 3]
    # resumed from the step-2 checkpoint: step 3 is redone, so its old line goes
    resumed = run_log.MetricsLog(path, keep_through=2, run_id="b")
    assert [r["step"] for r in run_log.read_metrics(path)] == [1, 2]
    resumed.append(3, {"reward/mean": 9.0})
    assert len(path.read_text().splitlines()) == 3  # no duplicate line, no half line left behind
    rows = run_log.read_metrics(path)
    assert [(r["step"], r["run_id"]) for r in rows] == [(1, "a"), (2, "a"), (3, "b")]
    run_log.MetricsLog(path, keep_through=0)  # a fresh run starts the file anew
    assert run_log.read_metrics(path) == []


def test_a_step_written_twice_reads_back_once_with_the_last_values(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "reward/mean": 1.0}\n\n{"step": 1, "reward/mean": 2.0}\n{"step": "x"}\n')
    assert run_log.read_metrics(path) == [{"step": 1, "reward/mean": 2.0}]


# ------------------------------------------------------------------------------------------ curves
def test_curve_panels_hold_reward_band_step_time_and_each_pools_busy_fraction():
    rows = [{"step": s, **_row(s, m, sd)} for s, m, sd in ((1, 0.5, 0.25), (2, 0.75, 0.125))]
    steps, panels = curve_panels(rows)
    assert steps == [1, 2] and tuple(p.title for p in panels) == PANELS
    reward, timing, busy = panels
    assert reward.lines["mean"] == [0.5, 0.75]
    assert reward.band == ([0.25, 0.625], [0.75, 0.875])  # mean -/+ std over the step's samples
    assert timing.lines == {"step": [1.5, 2.5], "ideal (own measured costs)": [0.25, 0.25]}
    assert busy.lines == {"generator pool": [0.75, 0.75], "trainer pool": [0.5, 0.5]}


def test_a_colocated_run_has_no_generator_pool_curve_and_missing_values_are_gaps():
    rows = [{"step": 1, **_row(1, 0.5, 0.0, colocated=True)}, {"step": 2, "reward/mean": 0.5, "val/reward/mean": 0.25}]
    _, (reward, timing, busy) = curve_panels(rows)
    assert list(busy.lines) == ["trainer pool"]
    assert math.isnan(busy.lines["trainer pool"][1]) and math.isnan(timing.lines["step"][1])
    assert math.isnan(reward.lines["val/reward/mean"][0]) and reward.lines["val/reward/mean"][1] == 0.25


def test_the_curves_read_the_validation_file_and_draw_its_reward_as_a_line(tmp_path):
    """Validation writes its metrics to <trace_dir>/val/<mode>_val.jsonl, not the metrics file: the run's rows
    for the curves (run_log.read_run_metrics, what the run and digen plot draw) carry them on their steps."""
    log = run_log.MetricsLog(run_log.metrics_path(tmp_path, "digen"))
    for s in (1, 2, 3):
        log.append(s, _row(s, 0.1 * s, 0.05))
    val = run_log.MetricsLog(tmp_path / "val" / "digen_val.jsonl")
    for s, r in ((0, 0.125), (2, 0.25)):  # before training (step 0) and after step 2
        val.append(s, {"val/reward_mean": r, "val/reward_std": 0.5})
    rows = run_log.read_run_metrics(tmp_path, "digen")
    steps, (reward, _, _) = curve_panels(rows)
    assert steps == [0, 1, 2, 3] and rows[2]["reward/mean"] == 0.2
    assert reward.lines["val/reward_mean"][0] == 0.125 and reward.lines["val/reward_mean"][2] == 0.25
    assert math.isnan(reward.lines["val/reward_mean"][1]) and math.isnan(reward.lines["mean"][0])
    assert run_log.read_run_metrics(tmp_path / "none", "digen") == []


def test_curves_png_is_written_and_an_empty_run_is_refused(tmp_path):
    rows = [{"step": s, **_row(s, 0.1 * s, 0.05)} for s in range(1, 5)]
    out = save_curves_png(rows, tmp_path / "digen_curves.png", title="t")
    assert out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="no per-step metrics"):
        save_curves_png([], tmp_path / "x.png")


# ------------------------------------------------------------------------------------------ Gantt
def test_every_action_kind_has_its_own_colour():
    kinds = list(ActionKind)
    assert set(kinds) <= set(COLORS)
    assert len({COLORS[k].lower() for k in kinds}) == len(kinds)


def test_gantt_legend_names_stale_work_and_step_ends_only_when_there_are_any():
    timeline = _stale_run()
    assert any(r.stale for r in timeline.records)
    labels = [label for label, _, _ in gantt_legend(timeline)]
    assert STALE_LABEL in labels and STEP_LABEL in labels
    fresh = Timeline(["gen0", "trainer"], 1, 1, records=[
        Record("gen0", GENERATE, 0, 0, 0, 0.0, 1.0), Record("trainer", UPDATE, 0, 0, 0, 1.0, 2.0)])
    assert [label for label, _, _ in gantt_legend(fresh)] == [GENERATE, UPDATE]  # no step ended


def test_gantt_shows_a_tag_slot_only_when_it_generated():
    recs = [Record("gen0", GENERATE, 0, 0, 0, 0.0, 1.0), Record("trainer", UPDATE, 0, 0, 0, 1.0, 2.0),
            Record("tag1", TAG_GENERATE, 0, 1, 0, 1.0, 2.0)]
    timeline = Timeline(["gen0", "trainer", "tag0", "tag1"], 1, 1, records=recs)
    assert gantt_rows(timeline, recs) == ["gen0", "trainer", "tag1"]
    fig = gantt_figure(timeline)
    try:
        (ax,) = fig.axes
        assert [t.get_text() for t in ax.get_yticklabels()] == ["tag1", "trainer (pool)", "gen0"]
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_gantt_legend_sits_outside_the_axes_and_clear_of_the_time_label():
    import matplotlib.pyplot as plt

    fig = gantt_figure(_stale_run(), title="t", max_steps=2)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        (ax,) = fig.axes
        legend, box = ax.get_legend(), ax.get_window_extent(renderer)
        lbox = legend.get_window_extent(renderer)
        assert lbox.x0 >= box.x1  # right of the plotting area
        assert not lbox.overlaps(ax.xaxis.label.get_window_extent(renderer))
        texts = [t.get_text() for t in legend.get_texts()]
        assert STALE_LABEL in texts and STEP_LABEL in texts
        # one dashed vertical line per shown step end
        assert len([ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]) == 2
    finally:
        plt.close(fig)


# ------------------------------------------------------------------------------------------ digen plot
def test_digen_plot_draws_gantt_and_curves_from_a_trace_dir(tmp_path, capsys):
    trace = tmp_path / "trace"
    timeline = _stale_run()
    _write_trace_dir(trace, timeline, [_row(s, 0.1 * s, 0.05) for s in (1, 2, 3)])
    assert timeline_from_file(trace / "digen_timeline.json").workers == list(timeline.workers)
    assert main(["plot", str(trace), "--out", str(tmp_path / "png")]) == 0
    out = capsys.readouterr().out
    for name in ("digen_gantt.png", "digen_curves.png"):
        assert (tmp_path / "png" / name).read_bytes()[:4] == b"\x89PNG" and name in out


def test_digen_plot_reads_a_streamed_timeline_when_the_run_was_killed(tmp_path):
    trace = tmp_path / "trace"
    trace.mkdir()
    recs = _stale_run().records
    lines = [json.dumps({"header": {"mode": "digen", "run_id": "r"}})] + [json.dumps(record_dict(r)) for r in recs]
    (trace / "digen_timeline.jsonl").write_text("\n".join(lines) + "\n" + '{"worker": "gen0", "ki')
    timeline = timeline_from_file(trace / "digen_timeline.jsonl")
    assert timeline.records == recs and timeline.workers[0] == "gen0"
    assert [p.name for p in plot_trace_dir(trace)] == ["digen_gantt.png"]


def test_digen_plot_draws_a_resumed_runs_whole_history(tmp_path, monkeypatch):
    """After a resume <mode>_timeline.json holds the last run only; the stream holds every run, which
    digen plot joins into one time axis (the second run's steps after the first's)."""
    import verl_digen.schedule.export as export

    trace = tmp_path / "trace"
    recs = _stale_run().records  # steps 0..2
    _write_trace_dir(trace, _stale_run(), [_row(s, 0.1 * s, 0.05) for s in (1, 2, 3)])  # the last run's .json
    lines = [json.dumps({"header": {"mode": "digen", "run_id": "a", "first_step": 0}})]
    lines += [json.dumps(record_dict(r)) for r in recs if r.step < 2]
    lines += [json.dumps({"header": {"mode": "digen", "run_id": "b", "first_step": 2}})]
    lines += [json.dumps(record_dict(r)) for r in recs if r.step == 0]  # its own step 0 is global step 2
    (trace / "digen_timeline.jsonl").write_text("\n".join(lines) + "\n")
    drawn = []
    monkeypatch.setattr(export, "save_gantt_png", lambda timeline, path, **kw: drawn.append(timeline))
    plot_trace_dir(trace, gantt_steps=None)
    (timeline,) = drawn
    assert sorted({r.step for r in timeline.records}) == [0, 1, 2]
    last_of_first = max(r.end for r in timeline.records if r.step < 2)
    assert min(r.start for r in timeline.records if r.step == 2) >= last_of_first


def test_digen_plot_names_what_is_missing(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["plot", str(tmp_path)]) == 2
    assert "no run outputs" in capsys.readouterr().err
    _write_trace_dir(tmp_path, _stale_run(), [_row(1, 0.1, 0.0)])
    assert main(["plot", str(tmp_path), "--mode", "colocated"]) == 2
    assert "found runs: digen" in capsys.readouterr().err
    assert main(["plot", str(tmp_path), "--gantt-steps", "-1"]) == 2


# ------------------------------------------------------------------------------------------ console
def test_console_block_is_rounded_to_4_significant_digits_and_grouped_by_prefix():
    metrics = {"timing/step_s": 0.4512345678, "actor/loss": -2.7755575615628914e-17, "reward/mean": 0.123456789,
               "pool/trainer_busy": 0.96270001, "actor/clip_frac": 0.0, "reward/std": 12345.678,
               "perf/driver_bytes": 884.0, "custom": 2.0, "zz/x": 1.5, "digen/stale_fraction": 0.25, "label": "x"}
    text = run_log.format_metrics(metrics, step=2, total=10)
    lines = text.splitlines()
    assert lines[0] == "step 2/10"
    assert [ln.split()[0] for ln in lines[1:]] == ["reward", "actor", "timing", "perf", "pool", "digen", "zz", "-"]
    assert lines[1].split()[1:] == ["mean=0.1235", "std=1.235e+04"]
    assert lines[2].split()[1:] == ["loss=-2.776e-17", "clip_frac=0"]
    assert "step_s=0.4512" in text and "driver_bytes=884" in text and "trainer_busy=0.9627" in text
    assert "label" not in text and "0.45123" not in text
    assert run_log.format_value(float("nan")) == "nan" and run_log.format_value(3) == "3"


def test_a_long_group_wraps_under_its_first_value():
    metrics = {f"actor/metric_{i:02d}": i + 0.5 for i in range(20)}
    lines = run_log.format_metrics(metrics, step=1, width=80).splitlines()
    assert len(lines) > 2 and all(len(ln) <= 80 for ln in lines)
    indent = lines[1].index("metric_00")
    assert all(ln[:indent].strip() == "" and ln[indent:].startswith("metric_") for ln in lines[2:])


def test_console_backend_is_replaced_and_the_other_backends_keep_full_precision():
    from verl.utils.tracking import Tracking

    class Recorder:
        def __init__(self):
            self.seen = []

        def log(self, data, step):
            self.seen.append((step, dict(data)))

    tracking = Tracking("p", "e", default_backend=["console"])
    other = Recorder()
    tracking.logger["wandb_like"] = other
    printed: list[str] = []
    console = run_log.ConsoleLogger(printed.append, total=5)
    assert run_log.install_console(tracking, console)
    data = {"reward/mean": 1.0 / 3.0}
    tracking.log(data=data, step=1)
    assert printed == ["step 1/5\n  reward  mean=0.3333"]
    assert other.seen == [(1, {"reward/mean": 1.0 / 3.0})]
    assert not run_log.install_console(Tracking("p", "e", default_backend=[]), console)  # no console: untouched


def test_one_line_log_per_step_for_cluster_logs(monkeypatch):
    """trainer.log_format=line: one line of the headline figures per step, label=value pairs; auto picks
    it when output is not a terminal."""
    from verl_digen.config.schema import log_format

    metrics = {"reward/mean": 0.43125, "reward/std": 0.1, "actor/loss": -0.00123, "timing/step_s": 4.0,
               "pool/generator_busy": 0.92, "pool/trainer_busy": 0.88, "digen/stale_fraction": 0.25,
               "fault/retries": 0.0, "fault/restarts": 1.0, "actor/ratio_mean": 1.0, "perf/samples_per_worker_s": 2.0}
    line = run_log.format_line(metrics, step=12, total=100)
    assert line == ("step 12/100  reward=0.4313+-0.1  loss=-0.00123  step_s=4  samples_per_worker_s=2  gen_busy=0.92  "
                    "trn_busy=0.88  stale=0.25  restarts=1")  # no zero retries; the rest stay in the block
    assert run_log.format_line({"val/reward_mean": 0.5}, step=3) == "step 3  val_reward=0.5"
    printed: list[str] = []
    run_log.ConsoleLogger(printed.append, total=100, fmt="line").log(metrics, 12)
    assert printed == [line]
    with pytest.raises(ValueError, match="log format"):
        run_log.ConsoleLogger(fmt="lines")

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    cfg = compose([])
    assert cfg.trainer.log_format == "auto"
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert log_format(cfg) == "line"
    monkeypatch.setattr("sys.stdout", Terminal())
    assert log_format(cfg) == "block"
    assert log_format(compose(["trainer.log_format=line"])) == "line"


# ------------------------------------------------------------------------------------------ config
def test_resolved_config_round_trips_and_is_stored_in_a_checkpoint(tmp_path):
    cfg = compose(["trainer.total_steps=7", "rollout.n=3"])
    path = run_log.save_resolved_config(cfg, tmp_path / "trace")
    back = OmegaConf.load(path)
    assert back == OmegaConf.structured(cfg) and back.trainer.total_steps == 7 and back.rollout.n == 3
    target = tmp_path / "ckpt" / "global_step_1"
    payload = {"params": {"w": torch.ones(2, dtype=torch.float64)}, "optim": {}, "version": 1, "lora": False}
    extra = {"step": 1, ckpt.CONFIG_YAML_KEY: run_log.resolved_config_yaml(cfg)}
    ckpt.save(target, 0, payload, extra, barrier=lambda: None)
    assert OmegaConf.load(target / ckpt.CONFIG_FILE) == back
    meta = ckpt.read_meta(target)
    assert ckpt.CONFIG_FILE in meta["files"] and ckpt.CONFIG_YAML_KEY not in meta["extra"]
    assert extra[ckpt.CONFIG_YAML_KEY]  # the caller's dict is left as it was
    assert ckpt.problem(target) is None


def test_stage_time_keys_come_in_one_order_in_every_process():
    """The console's ``time`` line follows the keys' order: built from a set of strings, it changed with
    Python's per-process hash seed."""
    from verl_digen.reporting.metrics import TIME_KEYS, window_metrics

    keys = [k for k in window_metrics([], 0.0, 1.0, ["gen0"], ["trainer0"]) if k.startswith("time/")]
    assert keys == list(dict.fromkeys(TIME_KEYS.values()))
    assert keys[:3] == ["time/gen_s", "time/tag_gen_s", "time/score_s"]


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_progress_bar_only_on_a_terminal(tty, capsys):
    """Redirected to a file, a bar's redraws would pile up: there the step blocks are plain lines."""
    stream, logged = _Stream(tty), []
    progress = Progress(3, True, logged.append, stream=stream)
    for step in range(3):
        progress.write(f"block {step}")
        progress.update(step + 1, {"reward/mean": 0.5, "timing/step_s": 1.0})
    progress.close()
    if tty:
        assert logged == [] and "3/3" in stream.getvalue()  # the bar on the terminal, blocks above it
        assert capsys.readouterr().out.splitlines() == ["block 0", "block 1", "block 2"]
    else:
        assert logged == ["block 0", "block 1", "block 2"] and stream.getvalue() == ""
    assert Progress(3, False, logged.append, stream=_Stream(True)).bar is None


def test_summary_says_n_a_where_a_mode_measures_nothing():
    """A colocated run has no generator pool and no bound: its summary says n/a, not 0.00."""
    from types import SimpleNamespace

    from verl_digen.config import compose
    from verl_digen.main import summary_table

    metrics = {"timing/step_s": 1.0, "perf/samples_per_worker_s": 2.0, "pool/generator_busy": 0.0,
               "pool/generator_bubble": 0.0, "pool/trainer_busy": 0.9, "pool/trainer_bubble": 0.1, "reward/mean": 0.5}
    reps = [SimpleNamespace(step=s, metrics=dict(metrics)) for s in (1, 2, 3)]
    text = summary_table(reps, compose(["trainer=colocated"]))
    assert text.count("n/a") == 2 and "0.90 / 0.10" in text and "2 colocated" in text
    row = next(line for line in text.splitlines() if line.startswith("generator busy / bubble"))
    assert row.endswith("n/a")
    digen = summary_table([SimpleNamespace(step=s, metrics={**metrics, "perf/fraction_of_ideal": 0.8})
                           for s in (1, 2, 3)], compose([]))
    assert "n/a" not in digen and "0.00 / 0.00" in digen and "0.80" in digen
    steps = next(line for line in digen.splitlines() if line.startswith("steps"))
    assert steps.split()[-1] == "3"
    resumed = summary_table([SimpleNamespace(step=s, metrics=dict(metrics)) for s in (3, 4)], compose([]))
    assert "2 (steps 3-4, resumed after 2)" in resumed  # a resumed run says which steps it ran
