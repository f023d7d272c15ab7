"""The driver's memory stays a window of the run: step reports held as arrays, timeline records forgotten
once streamed and read back whole at the end (docs/benchmarks.md, "Soak")."""

import pickle
import sys

import pytest

from verl_digen.config import compose
from verl_digen.reporting.progress import Recent, forget_read
from verl_digen.reporting.step_reports import StepReport, StepReports
from verl_digen.reporting.trace_stream import RecordStream, restore_segments
from verl_digen.schedule import StepScheduler, check_timeline
from verl_digen.schedule.actions import OPTIMIZER_STEP
from verl_digen.schedule.costs import StageCosts
from verl_digen.schedule.executor import SimBackend, run

COSTS = StageCosts(generate=0.2, tag_generate=0.25, score=0.02, update=0.3, switch_to_gen=0.05,
                   switch_to_train=0.05, optimizer_step=0.02, weight_sync=0.01, publish=0.02)


def test_step_reports_give_back_every_report_and_cost_far_less_than_dicts():
    reports = StepReports()
    shown = [StepReport(s, {"reward/mean": 0.1 * s, "timing/step_s": float(s), "digen/tag_mbs": s % 2})
             for s in range(1, 301)]
    shown.append(StepReport(301, {"reward/mean": -1.0, "val/reward": 2.5}))  # a different name set
    for r in shown:
        reports.append(r)
    assert len(reports) == 301 and list(reports) == shown  # ints come back as equal floats
    assert reports[-1] == shown[-1] and reports[10:13] == shown[10:13] and reports[0].step == 1
    assert list(reports[-1].metrics) == ["reward/mean", "val/reward"]
    with pytest.raises(IndexError):
        reports[301]
    as_dicts = sum(sys.getsizeof(r.metrics) + sys.getsizeof(r) for r in shown)
    assert len(pickle.dumps(reports)) < as_dicts / 4
    with pytest.raises(TypeError, match="step 7: every metric must be a number"):
        reports.append(StepReport(7, {"note": "text"}))
    assert len(reports) == 301  # a refused report leaves the log as it was


def test_step_reports_hold_a_bounded_window_in_memory_and_read_old_reports_back_from_their_file():
    """A 100k-step run must not hold its reports' values: past ``spill_values`` they go to a temporary file,
    and every report, old or new, reads back as it was appended (pickled too)."""
    reports = StepReports(spill_values=50)
    shown = [StepReport(s, {f"m{k}": s + k / 8 for k in range(s % 5 + 3)}) for s in range(1, 401)]
    for r in shown:
        reports.append(r)
        assert len(reports._values) < 50  # the values held in memory: a window, not the run
    assert reports._spilled > 1000 and list(reports) == shown
    assert reports[0] == shown[0] and reports[-1] == shown[-1] and reports[123:127] == shown[123:127]
    copy = pickle.loads(pickle.dumps(reports))
    assert list(copy) == shown
    copy.append(StepReport(401, {"m0": 1.0}))
    assert copy[-1] == StepReport(401, {"m0": 1.0}) and list(copy)[:-1] == shown


def test_forget_read_drops_what_every_reader_passed():
    items = list(range(10))
    slow, fast = Recent(items), Recent(items)
    fast.since(lambda i: i >= 6)
    slow.since(lambda i: i >= 3)
    assert forget_read(items, slow, fast) == 3 and items == list(range(3, 10))
    assert (slow.pos, fast.pos) == (0, 3) and fast.since(lambda i: True) == [6, 7, 8, 9]
    assert forget_read(items, slow, fast) == 0


def _segment(steps: int, seed: int, stream: RecordStream | None, offset: int):
    """One scheduler run on the simulator; with a stream, the runtime's step loop: flush, then forget."""
    cfg = compose(["trainer.progress=false"]).schedule_config(steps=steps)
    sched = StepScheduler(cfg, COSTS, gen_workers=2, trainer_ranks=2)
    window, held = Recent(sched.timeline.records), []
    if stream is not None:
        stream.follow(sched.timeline.records, offset)

    def on_complete(c) -> None:
        if stream is not None and c.action.kind == OPTIMIZER_STEP:
            window.since(lambda r: r.step >= c.action.step)
            stream.flush()
            forget_read(sched.timeline.records, window, stream)
            held.append(len(sched.timeline.records))

    run(sched, SimBackend(COSTS, noise=0.1, seed=seed), on_complete, check=False)
    return sched.timeline, held


def test_a_run_that_forgets_streamed_records_reads_back_the_same_timeline(tmp_path):
    kept = [_segment(6, 1, None, 0)[0], _segment(4, 2, None, 6)[0]]  # two segments, as validation cuts a run
    stream = RecordStream(tmp_path / "digen_timeline.jsonl", [], {"run_id": "r", "first_step": 0})
    (a, held_a), (b, held_b) = _segment(6, 1, stream, 0), _segment(4, 2, stream, 6)
    stream.close()
    per_step = len(kept[0].records) / 6
    assert max(held_a + held_b) <= 2 * per_step  # the driver held a window, not the run
    segments = [(0, a), (6, b)]
    restore_segments(stream.path, segments)
    assert a.records == kept[0].records and b.records == kept[1].records  # floats survive JSON exactly
    for _, tl in segments:
        check_timeline(tl)
