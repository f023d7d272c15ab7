"""The colocated baseline as a scheduler: every GPU of both pools generates its share, scores it,
then all train data-parallel (what verl-omni users run today).

It speaks the same protocol as :class:`~.scheduler.StepScheduler`, so the one executor loop
(:func:`.executor.run`) runs it in the simulator and on Ray. Each phase is one action occupying every
worker; ``samples`` holds the whole batch (the Ray backend splits it over the ranks).
"""

from __future__ import annotations

from .actions import Action
from .config import COLOCATED, ScheduleConfig
from .costs import (
    GENERATE,
    IDEAL,
    OPTIMIZER_STEP,
    SCORE,
    SWITCH_TO_GEN,
    SWITCH_TO_TRAIN,
    UPDATE,
    CostModel,
    StageCosts,
)
from .timeline import Record, Timeline

PHASES = (SWITCH_TO_GEN, GENERATE, SCORE, SWITCH_TO_TRAIN, UPDATE, OPTIMIZER_STEP)


def colocated_costs(model: CostModel, batch: int, tsp_degree: int = 1, baseline: str = IDEAL) -> StageCosts:
    """Each colocated phase's duration as StageCosts (one 'micro-batch' = the whole batch)."""
    ph = model.colocated_phases(batch, tsp_degree, baseline)
    return StageCosts(generate=ph[GENERATE], tag_generate=0.0, score=ph[SCORE], update=ph[UPDATE],
                      switch_to_gen=ph[SWITCH_TO_GEN], switch_to_train=ph[SWITCH_TO_TRAIN],
                      optimizer_step=ph[OPTIMIZER_STEP])


class ColocatedScheduler:
    """Phases of ``config.steps`` colocated steps, one after another, on ``workers``."""

    def __init__(self, config: ScheduleConfig, workers: list[str], phases: tuple[str, ...] = PHASES) -> None:
        if config.mode != COLOCATED:
            raise ValueError(f"ColocatedScheduler runs mode 'colocated', not {config.mode!r}")
        if not workers:
            raise ValueError("colocated mode needs at least one worker")
        self.config = config
        self.workers = tuple(workers)
        self.phases = phases
        self.samples = tuple((p, s) for p in range(config.prompts) for s in range(config.group_size))
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
        kind = self.phases[i]
        data = kind in (GENERATE, SCORE, UPDATE)
        a = Action(kind, self.workers, step, step, 0 if data else None, self.samples if data else (), start=now)
        self._running = a
        return [a]

    def on_complete(self, action: Action, end: float) -> None:
        if action is not self._running:
            raise ValueError(f"{action!r} is not the running phase")
        self._running = None
        for w in action.workers:
            self.timeline.add(Record(w, action.kind, action.mb, action.step, action.version, action.start, end,
                                     samples=len(action.samples)))
