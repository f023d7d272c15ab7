"""Every record keeps when its action was issued (the driver's launch, before its Ray call), apart from when the
scheduler decided it and when it ended: the dispatch latency is visible, not folded into the work."""

import pytest

from verl_digen.driver.ray_backend import RayBackend
from verl_digen.schedule.actions import Action
from verl_digen.schedule.config import ScheduleConfig
from verl_digen.schedule.costs import OPTIMIZER_STEP, uniform_stage_costs
from verl_digen.schedule.executor import SimBackend, run
from verl_digen.schedule.scheduler import StepScheduler
from verl_digen.schedule.timeline import TRAINER, Record, Timeline, TimelineError, check_timeline


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _TrainerPool:
    """A worker group stand-in: records the action's issue stamp at the moment the call is made."""

    workers = ["rank0"]

    def __init__(self, action: Action, clock: _Clock) -> None:
        self.action, self.clock, self.seen = action, clock, None

    def execute_all_async(self, method: str, *args):
        self.seen = self.action.issued
        self.clock.t += 5.0  # the Ray call itself takes time: the stamp must be from before it
        return [object()]


def test_the_ray_backend_stamps_the_issue_time_before_the_ray_call():
    clock = _Clock()
    action = Action(OPTIMIZER_STEP, (TRAINER,), 0, 0, start=1.0)
    pool = _TrainerPool(action, clock)
    backend = RayBackend(None, pool, None, rows=lambda g, s: ([], []), advantages=lambda s, p: {}, scale=1.0)
    backend.now = clock  # the backend's wall clock, driven by the test
    clock.t = 3.0  # the driver launches 2 s after the scheduler decided
    backend.launch(action)
    assert pool.seen == 3.0 and action.issued == 3.0


def test_records_carry_the_issue_time_and_the_simulator_issues_at_once():
    cfg = ScheduleConfig(prompts=2, group_size=2, mb_size=2, steps=2, mode="digen", policy="never")
    costs = uniform_stage_costs(generate=1.0, update=2.0, score=0.5, optimizer_step=0.1)
    tl = run(StepScheduler(cfg, costs, 1), SimBackend(costs))
    assert tl.records and all(r.issued == r.start and r.dispatch == 0.0 for r in tl.records)


def test_a_record_issued_outside_its_span_is_refused():
    tl = Timeline([TRAINER], micro_batches=1, steps=1, mode="colocated")
    tl.add(Record(TRAINER, OPTIMIZER_STEP, None, 0, 0, 1.0, 2.0, issued=1.25))
    check_timeline(tl)
    assert tl.records[0].dispatch == pytest.approx(0.25)
    tl.records[0] = Record(TRAINER, OPTIMIZER_STEP, None, 0, 0, 1.0, 2.0, issued=0.5)
    with pytest.raises(TimelineError, match="issued at 0.5"):
        check_timeline(tl)
