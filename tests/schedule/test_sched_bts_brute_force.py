"""BTS through the real scheduler against exhaustive search over the scheduler itself.

The search below knows nothing of BTS's model: it drives ``StepScheduler`` and the virtual-clock backend
directly, and at every event that leaves the trainer in a bubble with a free TAG slot it tries every
decision (0 .. free slots, 0 = skip), copying the whole scheduler and backend for each branch; equal
states at a decision point (every action in flight with its end relative to now, the queues and counts)
share their value. On small instances (at most 12 micro-batches, R = 2 and 4 TAG slots) the step BTS
runs ends exactly where the best decision sequence ends. Before BTS decided again when a TAG slot or a
generator freed, it lost up to 8.3 % on instances like these (7 of 1,600 random ones; four are pinned).
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import random
import types

import pytest
from sched_helpers import random_config, random_costs

from verl_digen.schedule.actions import ends_step
from verl_digen.schedule.config import ScheduleConfigError
from verl_digen.schedule.executor import SimBackend
from verl_digen.schedule.scheduler import StepScheduler
from verl_digen.schedule.simulator import execute

pytestmark = pytest.mark.slow


class _Scripted:
    """Answers ``k`` (clamped by the scheduler) and records that a decision was asked, and its range."""

    name = "scripted"

    def __init__(self) -> None:
        self.k = 0
        self.most: int | None = None

    def decide(self, ctx) -> int:
        self.most = ctx.most
        return self.k


def _key(sched: StepScheduler, backend: SimBackend, now: float) -> tuple:
    st = sched._step(sched.train_step)
    flight = tuple(sorted((round(end - now, 9), a.kind, a.mb, a.workers) for end, _, a in backend._heap))
    return (sched.train_step, sched.trainer_mode, st.next, st.updated, len(st.uq), tuple(sorted(st.scored.items())),
            tuple(sorted(sched._sq[sched.train_step])), flight, st.mini,
            tuple(sorted((c, len(v)) for c, v in st.later.items())))


#: every lambda a snapshot refers to (the backends' duration functions), kept alive so that an id names one
_FUNCTIONS: list = []
_FUNCTION_INDEX: dict[int, int] = {}


def _function(index: int):
    return _FUNCTIONS[index]


class _Pickler(pickle.Pickler):
    """Pickles the scheduler and backend, keeping lambdas by reference (``_FUNCTIONS``). ``reducer_override``
    is asked only about objects that are not plain numbers, strings or containers (``persistent_id`` would be
    asked about every object: most of a snapshot's time)."""

    def reducer_override(self, obj):
        if type(obj) is types.FunctionType and obj.__name__ == "<lambda>":
            index = _FUNCTION_INDEX.get(id(obj))
            if index is None:
                index = _FUNCTION_INDEX[id(obj)] = len(_FUNCTIONS)
                _FUNCTIONS.append(obj)
            return _function, (index,)
        return NotImplemented


def _snapshot(obj) -> bytes:
    """``obj`` pickled (lambdas by reference); ``pickle.loads`` of it is a deep copy, what ``copy.deepcopy``
    gives here, several times faster. Most events offer no decision, so the search keeps the bytes and loads
    them only to branch."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def exhaustive_step_end(cfg, costs, gen_workers: int, ranks: int) -> tuple[float, int]:
    """(best end of the single step's (last) optimizer step over every decision sequence, decision states
    seen)."""
    sched = StepScheduler(cfg, costs, gen_workers, _Scripted(), trainer_ranks=ranks)
    backend = SimBackend(costs)
    memo: dict[tuple, float] = {}

    def events(sched, backend) -> float:  # consume completions until the step's optimizer step ends
        finished, now = backend.wait()
        for a, end in ((c.action, c.end) for c in finished):
            sched.on_complete(a, end)
            if a.ends_step:  # not a mini-batch's: the step's last
                return end
        return act(sched, backend, now)

    def act(sched, backend, now: float) -> float:  # hand out work at ``now``, branching on a decision
        key = _key(sched, backend, now)
        if key in memo:
            return now + memo[key]
        pristine = _snapshot((sched, backend))
        sched.policy.k, sched.policy.most = 0, None
        for a in sched.next_actions(now):
            backend.launch(a)
        most = sched.policy.most
        best = events(sched, backend)  # k = 0 (or no decision at this event)
        if most:
            for k in range(1, most + 1):
                s, b = pickle.loads(pristine)
                s.policy.k, s.policy.most = k, None
                for a in s.next_actions(now):
                    b.launch(a)
                best = min(best, events(s, b))
            memo[key] = best - now
        return best

    sched._started = True  # start() is next_actions at 0 once; act() makes that call itself
    return act(sched, backend, 0.0), len(memo)


def _instances(n: int, seed: int):
    rng = random.Random(seed)
    for i in range(n):
        cfg = random_config(rng, max_mb=12)
        costs = random_costs(rng, ties=i % 2 == 1)
        yield cfg, costs, rng.randint(1, 3), (2, 4)[i % 2]


def _bts_step_end(cfg, costs, G: int, R: int, predicted: list | None = None) -> float:
    sched = StepScheduler(cfg, costs, G, "bts", trainer_ranks=R)
    tl = execute(sched, costs)
    if predicted is not None:
        predicted.extend(d.predicted_end for d in sched.decisions)
    return next(r.end for r in tl.records if ends_step(r.kind, r.mini_batch))


# instances of ``_instances(40, seed)`` where BTS lost before it decided again at every event (old
# rule's step vs the optimum): 1011:0 +8.3 %, 1027:37 +6.3 %, 1025:20 +2.0 %, 1019:10 +0.75 %
LOST_BEFORE = ("1011:0", "1027:37", "1025:20", "1019:10")


@pytest.mark.parametrize("which", LOST_BEFORE)
def test_bts_matches_exhaustive_where_one_decision_per_bubble_lost(which):
    seed, index = map(int, which.split(":"))
    cfg, costs, G, R = list(_instances(40, seed=seed))[index]
    best, _ = exhaustive_step_end(cfg, costs, G, R)
    assert _bts_step_end(cfg, costs, G, R) == pytest.approx(best, rel=1e-9, abs=1e-9), (cfg, costs, G, R)


@pytest.mark.parametrize("seed", range(2))
def test_bts_through_the_scheduler_equals_exhaustive_search_over_every_event(seed):
    decided = 0
    for cfg, costs, G, R in _instances(15, seed=200 + seed):
        best, states = exhaustive_step_end(cfg, costs, G, R)
        assert _bts_step_end(cfg, costs, G, R) == pytest.approx(best, rel=1e-9, abs=1e-9), (cfg, costs, G, R)
        decided += states > 1
    assert decided > 8  # most instances offer more than one decision state


def _mini_batch_instances(n: int, seed: int):
    """Instances whose step has 2 or 3 mini-batches (each of whole updates)."""
    rng = random.Random(seed)
    found = 0
    while found < n:
        cfg = random_config(rng, max_mb=12)
        costs = random_costs(rng, ties=found % 2 == 1)
        G, R = rng.randint(1, 3), (2, 4)[found % 2]
        for mini in (2, 3):
            try:
                cand = dataclasses.replace(cfg, mini_batches=mini)
                cand.check_update_units(G)
            except ScheduleConfigError:
                continue
            found += 1
            yield cand, costs, G, R
            break


def test_bts_with_mini_batches_equals_exhaustive_search():
    """Mini-batches: BTS's model trains them in order and decides only before the first one's optimizer
    step, as the scheduler does; its step ends where the best decision sequence's ends."""
    decided = 0
    for cfg, costs, G, R in _mini_batch_instances(12, seed=300):
        best, states = exhaustive_step_end(cfg, costs, G, R)
        predicted: list[float | None] = []
        end = _bts_step_end(cfg, costs, G, R, predicted)
        assert end == pytest.approx(best, rel=1e-9, abs=1e-9), (cfg, costs, G, R)
        # the model plays the mini-batches as the scheduler runs them: on the virtual clock its prediction
        # at every decision is the step's end
        assert all(p == pytest.approx(end, rel=1e-9, abs=1e-9) for p in predicted if p is not None), predicted
        decided += states > 1
    assert decided > 5
