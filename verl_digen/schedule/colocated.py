"""The colocated baseline as a scheduler: every GPU of both pools generates its share, scores it,
then all train data-parallel (what verl-omni users run today).

It speaks the same protocol as :class:`~.scheduler.StepScheduler`, so the one executor loop
(:func:`.executor.run`) runs it in the simulator and on Ray. Each phase is one action occupying every
worker; ``samples`` holds the whole batch (the Ray backend splits it over the ranks), or one
mini-batch's for the update with several (``config.mini_batches``: an update and an optimizer step per
mini-batch, the optimizer step's ``mini_batch`` its index, None for the last, as in verl's PPO loop).
"""

from __future__ import annotations

from .actions import GENERATE, OPTIMIZER_STEP, SCORE, SWITCH_TO_GEN, SWITCH_TO_TRAIN, UPDATE, Action
from .config import COLOCATED, ScheduleConfig
from .costs import IDEAL, CostModel, StageCosts
from .timeline import Record, Timeline

PHASES = (SWITCH_TO_GEN, GENERATE, SCORE, SWITCH_TO_TRAIN, UPDATE, OPTIMIZER_STEP)  # a step of one mini-batch


def step_phases(mini_batches: int = 1) -> list[tuple[str, int | None]]:
    """A step's phases as (kind, mini-batch): an update and an optimizer step per mini-batch."""
    head = [(kind, None) for kind in PHASES[:4]]
    return head + [pair for c in range(mini_batches)
                   for pair in ((UPDATE, c), (OPTIMIZER_STEP, c if c < mini_batches - 1 else None))]


def colocated_costs(model: CostModel, batch: int, tsp_degree: int = 1, baseline: str = IDEAL,
                    mini_batches: int = 1, rows_per_pass: int | None = None) -> StageCosts:
    """Each colocated phase's duration as StageCosts (one 'micro-batch' = the whole batch; an update
    trains one of ``mini_batches``; ``rows_per_pass``: the colocated run's memory cap on a pass)."""
    ph = model.colocated_phases(batch, tsp_degree, baseline, rows_per_pass)
    return StageCosts(generate=ph[GENERATE], tag_generate=0.0, score=ph[SCORE], update=ph[UPDATE] / mini_batches,
                      switch_to_gen=ph[SWITCH_TO_GEN], switch_to_train=ph[SWITCH_TO_TRAIN],
                      optimizer_step=ph[OPTIMIZER_STEP])


class ColocatedScheduler:
    """Phases of ``config.steps`` colocated steps, one after another, on ``workers``."""

    def __init__(self, config: ScheduleConfig, workers: list[str]) -> None:
        if config.mode != COLOCATED:
            raise ValueError(f"ColocatedScheduler runs mode 'colocated', not {config.mode!r}")
        if not workers:
            raise ValueError("colocated mode needs at least one worker")
        self.config = config
        self.workers = tuple(workers)
        self.phases = step_phases(config.mini_batches)
        self.samples = tuple((p, s) for p in range(config.prompts) for s in range(config.group_size))
        per = len(self.samples) // config.mini_batches
        self.mini_samples = [self.samples[c * per:(c + 1) * per] for c in range(config.mini_batches)]
        self.timeline = Timeline(list(workers), 1, config.steps, COLOCATED)
        self._next = 0  # index into steps x phases
        self._running: Action | None = None

    @property
    def done(self) -> bool:
        return self._running is None and self._next >= self.config.steps * len(self.phases)

    def start(self, now: float = 0.0) -> list[Action]:
        return self.next_actions(now)

    def next_actions(self, now: float) -> list[Action]:
        if self._running is not None or self.done:
            return []
        step, i = divmod(self._next, len(self.phases))
        self._next += 1
        kind, mini = self.phases[i]
        if kind == UPDATE:
            a = Action(kind, self.workers, step, step, 0, self.mini_samples[mini], start=now)
        elif kind in (GENERATE, SCORE):
            a = Action(kind, self.workers, step, step, 0, self.samples, start=now)
        else:
            a = Action(kind, self.workers, step, step, start=now, mini_batch=mini)
        self._running = a
        return [a]

    def on_complete(self, action: Action, end: float, moved: tuple[tuple[str, int], ...] = ()) -> None:
        if action is not self._running:
            raise ValueError(f"{action!r} is not the running phase")
        self._running = None
        for i, w in enumerate(action.workers):  # the action's bytes on its first worker's record: counted once
            self.timeline.add(Record(w, action.kind, action.mb, action.step, action.version, action.start, end,
                                     samples=len(action.samples), moved=moved if i == 0 else (),
                                     mini_batch=action.mini_batch, issued=action.issued))
