"""The executor loop as an iterator of completions (``executor.events``): the caller owns the loop, each
completion comes after the scheduler consumed it, and what an action carries to the backend is attached
just before its launch."""

from verl_digen.schedule.actions import SCORE, UPDATE
from verl_digen.schedule.config import ScheduleConfig
from verl_digen.schedule.costs import uniform_stage_costs
from verl_digen.schedule.executor import SimBackend, events, run
from verl_digen.schedule.scheduler import StepScheduler

COSTS = uniform_stage_costs(generate=1.0, update=2.0, score=0.5, optimizer_step=0.1)


def _sched(steps: int = 2) -> StepScheduler:
    cfg = ScheduleConfig(prompts=2, group_size=2, mb_size=2, steps=steps, mode="digen", policy="never")
    return StepScheduler(cfg, COSTS, 1)


class _Recording(SimBackend):
    """The simulator's backend that keeps what each launch carried."""

    def __init__(self) -> None:
        super().__init__(COSTS)
        self.launched: list[tuple[object, object]] = []

    def launch(self, action, work=None) -> None:
        self.launched.append((action, work))
        super().launch(action, work)


def test_draining_the_iterator_is_the_loop_and_each_completion_is_consumed_before_it_is_yielded():
    sched, backend = _sched(), SimBackend(COSTS)
    seen = []
    for c in events(sched, backend):
        # the scheduler already holds this completion's record
        assert any(r.kind == c.action.kind and r.step == c.action.step and r.end == c.end
                   for r in sched.timeline.records)
        seen.append((c.action.kind, c.action.step, c.end))
    assert sched.done
    reference = run(_sched(), SimBackend(COSTS))
    assert [(r.kind, r.step, r.end) for r in sched.timeline.records] == [
        (r.kind, r.step, r.end) for r in reference.records]
    assert len(seen) == len(reference.records)


def test_prepare_attaches_to_every_action_before_its_launch_what_the_completions_so_far_allow():
    sched, backend = _sched(), _Recording()
    scored: set[tuple[int, int]] = set()

    def prepare(a):
        # an update is prepared only after every score of its micro-batches was yielded to the caller
        if a.kind == UPDATE:
            assert all((a.step, m) in scored for m in a.micro_batches), (a.step, list(a.micro_batches))
        return ("work of", a.kind, a.step, a.mb)

    for c in events(sched, backend, prepare):
        if c.action.kind == SCORE:
            scored.add((c.action.step, c.action.mb))
    assert backend.launched and all(w == ("work of", a.kind, a.step, a.mb) for a, w in backend.launched)
    assert any(a.kind == UPDATE for a, _ in backend.launched)


def test_the_caller_can_stop_between_completions():
    sched = _sched(steps=3)
    it = events(sched, SimBackend(COSTS))
    first = next(it)
    it.close()
    assert first.action is not None and not sched.done
