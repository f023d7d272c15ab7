"""Every record keeps when its action was issued (the driver's launch, before its Ray call), apart from when the
scheduler decided it and when it ended: the dispatch latency is visible, not folded into the work."""

import pytest

from verl_digen.driver.ray_backend import RayBackend
from verl_digen.schedule.actions import OPTIMIZER_STEP, Action
from verl_digen.schedule.config import ScheduleConfig
from verl_digen.schedule.costs import uniform_stage_costs
from verl_digen.schedule.executor import SimBackend, run
from verl_digen.schedule.export import chrome_trace
from verl_digen.schedule.scheduler import StepScheduler
from verl_digen.schedule.timeline import TRAINER, Record, Timeline


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
    backend = RayBackend(None, pool, None, scale=1.0)
    backend.now = clock  # the backend's wall clock, driven by the test
    clock.t = 3.0  # the driver launches 2 s after the scheduler decided
    backend.launch(action)
    assert pool.seen == 3.0 and action.issued == 3.0


def test_records_carry_the_issue_time_and_the_simulator_issues_at_once():
    cfg = ScheduleConfig(prompts=2, group_size=2, mb_size=2, steps=2, mode="digen", policy="never")
    costs = uniform_stage_costs(generate=1.0, update=2.0, score=0.5, optimizer_step=0.1)
    tl = run(StepScheduler(cfg, costs, 1), SimBackend(costs))
    assert tl.records and all(r.issued == r.start and r.dispatch == 0.0 for r in tl.records)


def test_a_record_keeps_its_dispatch_apart_from_its_work():
    rec = Record(TRAINER, OPTIMIZER_STEP, None, 0, 0, 1.0, 2.0, issued=1.25)
    assert rec.dispatch == pytest.approx(0.25) and rec.duration == 1.0
    assert Record(TRAINER, OPTIMIZER_STEP, None, 0, 0, 1.0, 2.0).dispatch == 0.0  # a file of an earlier version
    tl = Timeline([TRAINER], micro_batches=1, steps=1, mode="colocated", records=[rec])
    args = chrome_trace(tl)["traceEvents"][-1]["args"]
    assert args["dispatch_s"] == pytest.approx(0.25)
