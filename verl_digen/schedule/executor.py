"""The one executor loop: a scheduler's actions out to a backend, completions back in.

Modelled on vLLM v1's EngineCore / Executor split: the scheduler decides, a :class:`Backend` only runs
actions and reports when they finished. The simulator's backend (:class:`SimBackend`) advances a
virtual clock over a cost model; the Ray runtime's (``driver/ray_backend.py``) turns actions into
verl worker calls and their completions into events with wall-clock times. Both run through
:func:`events`, the loop written as an iterator of completions whose caller owns the loop (the driver's
``driver/steps.py``), or :func:`run`, which drains it and checks the timeline's invariants at the end (a
violation raises :class:`~.timeline.TimelineError`).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from .actions import Action
from .costs import StageCosts
from .timeline import Timeline, check_timeline

EPS = 1e-9


@dataclass(frozen=True)
class Completion:
    """One finished action: when it ended and what it produced. ``result`` is the backend's typed
    receipt for the action's kind (the Ray backend's are in ``driver/completions.py``); None on the
    simulator, whose actions produce nothing but time."""

    action: Action
    end: float
    result: object = None


class Scheduler(Protocol):
    """What :func:`run` drives (``StepScheduler`` and ``ColocatedScheduler``)."""

    timeline: Timeline

    @property
    def done(self) -> bool: ...

    def start(self, now: float = 0.0) -> list[Action]: ...

    def next_actions(self, now: float) -> list[Action]: ...

    def on_complete(self, action: Action, end: float, moved: tuple[tuple[str, int], ...] = ()) -> None: ...


class Backend(Protocol):
    """Runs actions. ``launch`` gets an action and what the caller attached to it for its run (``work``:
    the rows, texts and advantages of the driver's actions; None on the simulator); ``wait`` blocks until
    at least one action finished and returns the finished actions' completions and the current time."""

    def now(self) -> float: ...

    def launch(self, action: Action, work: object = None) -> None: ...

    def wait(self) -> tuple[list[Completion], float]: ...


def events(sched: Scheduler, backend: Backend,
           prepare: Callable[[Action], object] | None = None) -> Iterator[Completion]:
    """The loop as an iterator, as vLLM v1's engine core steps: launch what the scheduler decided, wait for
    completions, let the scheduler consume each one, and yield it; the caller owns the loop (it folds, reports
    or stops between completions). ``prepare(action)``: what the action carries to the backend, attached just
    before its launch (after every completion before it was consumed and yielded)."""
    _launch(backend, sched.start(backend.now()), prepare)
    while not sched.done:
        finished, now = backend.wait()
        for c in finished:
            sched.on_complete(c.action, c.end, getattr(c.result, "moved", ()))
            yield c
        _launch(backend, sched.next_actions(now), prepare)


def _launch(backend: Backend, actions: list[Action], prepare: Callable[[Action], object] | None) -> None:
    for a in actions:
        if prepare is None:
            backend.launch(a)
        else:
            backend.launch(a, prepare(a))


def run(sched: Scheduler, backend: Backend, on_complete: Callable[[Completion], None] | None = None,
        check: bool = True) -> Timeline:
    """Drive ``sched`` to completion on ``backend`` (:func:`events`); ``on_complete(completion)`` runs after
    the scheduler consumed each completion. Returns the timeline (checked unless ``check=False``)."""
    for c in events(sched, backend):
        if on_complete is not None:
            on_complete(c)
    if check:
        check_timeline(sched.timeline)
    return sched.timeline


class SimBackend:
    """Virtual clock: an action takes its cost-model duration (optionally with multiplicative
    log-normal noise); completions within 1 ns are delivered together, as a real event loop would.

    ``contention`` (action kind -> c): every process shares one host (a CPU testbed,
    ``CostModel.host_contention``); while N processes are busy, an action of that kind runs 1 + c x (N - 1) times
    slower than alone (processor sharing, re-rated at each launch and completion). ``beside`` ((kind, other kind)
    -> c, ``CostModel.host_contention_beside``): the fraction for an action beside a process running that other
    kind (an action's own processes beyond its first run its own kind), where it differs from ``contention``'s.
    ``processes(action)``: how many processes an action keeps busy (default one per worker it occupies)."""

    def __init__(self, costs: StageCosts, noise: float = 0.0, seed: int = 0,
                 duration: Callable[[Action], float] | None = None, contention: dict[str, float] | None = None,
                 processes: Callable[[Action], int] | None = None,
                 beside: dict[tuple[str, str], float] | None = None) -> None:
        self.costs = costs
        self.noise = noise
        self.rng = random.Random(seed)
        self.duration = duration or (lambda a: costs.duration(a.kind))
        self.contention = {k: c for k, c in (contention or {}).items() if c > 0}
        self.beside = dict(beside or {})
        self.shared = bool(self.contention) or any(c > 0 for c in self.beside.values())
        self.processes = processes or (lambda a: len(a.workers))
        self.clock = 0.0
        self._heap: list[tuple[float, int, Action]] = []
        self._seq = 0
        self._work: dict[int, list] = {}  # shared host: seq -> [action, work left (s alone), processes]
        self._busy = 0  # processes busy

    def now(self) -> float:
        return self.clock

    def launch(self, action: Action, work: object = None) -> None:
        """Start ``action`` on the virtual clock (``work`` is ignored: time is all it produces)."""
        action.issued = self.clock  # a virtual clock dispatches at once
        d = self.duration(action)
        if self.noise:
            d *= math.exp(self.rng.gauss(0.0, self.noise) - self.noise * self.noise / 2)
        if self.shared:
            n = self.processes(action)
            self._work[self._seq] = [action, d, n]
            self._busy += n
        else:
            heapq.heappush(self._heap, (self.clock + d, self._seq, action))
        self._seq += 1

    def _slowdown(self, kind: str, other: str) -> float:
        return self.beside.get((kind, other), self.contention.get(kind, 0.0))

    def _shared_wait(self) -> tuple[list[Completion], float]:
        """To the next end of work at the rates of the processes busy until then; every action's work advances."""
        rate = {}
        for s, (a, _, n) in self._work.items():  # each other process by what it runs, its own by its own kind
            load = max(n - 1, 0) * self._slowdown(a.kind, a.kind) + sum(
                m * self._slowdown(a.kind, b.kind) for t, (b, _, m) in self._work.items() if t != s)
            rate[s] = 1.0 / (1.0 + load)
        dt = min(w / rate[s] for s, (_, w, _) in self._work.items())
        self.clock += dt
        done = []
        for s in sorted(self._work):
            item = self._work[s]
            item[1] -= dt * rate[s]
            if item[1] <= EPS:
                done.append(item[0])
                self._busy -= item[2]
                del self._work[s]
        return [Completion(a, self.clock) for a in done], self.clock

    def wait(self) -> tuple[list[Completion], float]:
        if not self._heap and not self._work:
            raise RuntimeError("scheduler stalled: no action in flight and not done")
        if self.shared:
            return self._shared_wait()
        t, _, a = heapq.heappop(self._heap)
        done = [Completion(a, t)]
        while self._heap and self._heap[0][0] <= t + EPS:
            t2, _, a2 = heapq.heappop(self._heap)
            done.append(Completion(a2, t2))
        self.clock = max(c.end for c in done)
        return done, self.clock
