"""Bubble-triggered TAG search (BTS, the paper's Algorithm 2).

At a trainer bubble the scheduler hands over a neutral :class:`.tag_policy.SchedulerView`
(``StepScheduler.snapshot``); :meth:`ModelState.from_view` compresses it into the state searched here:
the rest of the current step as counts and clocks relative to now. :func:`advance` plays the
scheduler's rules forward on it (same rules as :mod:`.scheduler`, micro-batches being
interchangeable apart from their release unit; generators that still hold the previous version pick
the new one up at their next boundary) until the next bubble or the end of the step's optimizer step.
The scheduler asks at every event that leaves the trainer in a bubble with a free TAG slot (once per
event: after a skip it asks again when a generator, a TAG slot or the trainer frees), and the model
decides at the same points. The search tries the branches at each decision (start ``k`` TAG
micro-batches on ``k`` of the free trainer slots, ``k = 0 .. min(free, undispatched)``; 0 skips) and
keeps the smallest end:

- memoization on the compressed state (counts, queue contents, clocks relative to the bubble,
  rounded to a tiny quantum); values are *remaining* times so equal states met at different absolute
  times share them;
- branch and bound with an admissible lower bound (:func:`lower_bound`: trainer work left vs. the
  generator pool's mandatory work, with the best fractional split of the remaining generations
  between both, solved in closed form);
- an incumbent from greedy rollouts (split / never / always / one / threshold; ``split`` starts what
  the bound's best split says) from each decision open now, which also orders the search (the
  decision with the best rollout first);
- the last solve's best plan, replayed as one more incumbent (kept across a change of the cost
  estimates, which drops the memo): where the caps bind, a re-solve might not find that plan again,
  and the predicted end would get worse from one decision to the next.

Caps bound one solve (:class:`Solver`; None lifts one). The *fan-out cap* (``DEFAULT_FAN_OUT`` = 5)
tries at most 5 counts per decision: all of them while at most 4 slots can start, else 0, all, the
bound's best split and evenly spaced counts (:func:`choices`). The *work cap* (``DEFAULT_WORK_CAP``)
bounds the events played (rollouts included) to about 7 ms on a 2-core machine, at any split; past it
the best plan found, or the best rollout's first move if better, is used (``SearchStats.capped``:
not proven best). Where neither binds (at most 4 free slots, small steps) the solve is exact; the
decision space per event is at most ``fan_out``, the depth the number of events left in the step.

:func:`exhaustive` enumerates every decision sequence without memo or pruning; tests hold BTS to it.
With several mini-batches (``Params.mini_batches``) the model trains them in order, each followed by an
optimizer step, and takes no decision after the first (the scheduler asks none: TAG would sample with
weights the step has moved). The objective is the end of the current step's last optimizer step: what
happens after (weight sync, the next step) does not depend on the TAG choices of this step, apart from
stale TCSS work, which the model plays but does not value.
"""

from __future__ import annotations

import math
import time
from array import array
from dataclasses import dataclass, field
from heapq import heappop, heappush

from .actions import GENERATE, SCORE, WEIGHT_SYNC
from .costs import StageCosts
from .tag_policy import BubbleContext, SchedulerView, register_tag_policy

# generator task kinds
IDLE, GEN, SCORE_CUR, GEN_NEXT, SCORE_NEXT, PICKUP = 0, 1, 2, 3, 4, 5
# trainer-unit task kinds (TAG runs on the slots, not on the unit)
T_IDLE, T_UPDATE, T_SWITCH_TO_GEN, T_SWITCH_TO_TRAIN, T_OPT = 0, 1, 3, 4, 5
EPS = 1e-9
INF = math.inf
# Search work (the unit of the work cap), calibrated on the 2-core CI machine: one unit is about
# 0.13 us. Each ``advance`` call costs CALL_WORK (with the copy, memo key and bound around it in the
# search) plus, per event it plays, EVENT_WORK + one per generator.
CALL_WORK, EVENT_WORK = 140, 6


@dataclass(frozen=True)
class Params:
    """Everything constant during one search: the step's shape and one duration per action kind
    (the :class:`.StageCosts` names)."""

    micro_batches: int  # micro-batches in the step
    unit_size: int  # release unit (micro-batches whose scoring completes a GRPO unit)
    gen_workers: int
    generate: float
    tag_generate: float
    score: float
    update: float
    switch_to_gen: float
    switch_to_train: float
    optimizer_step: float
    quantum: float  # clock rounding of memo keys
    update_size: int = 1  # micro-batches per update action
    trainer_ranks: int = 1  # = TAG slots
    weight_sync: float = 0.0  # one generator's weight pickup
    mini_batches: int = 1  # optimizer steps in the step (each after its mini-batch's updates)

    @property
    def mini_mbs(self) -> int:
        """Micro-batches per mini-batch."""
        return self.micro_batches // self.mini_batches

    @classmethod
    def from_costs(cls, costs: StageCosts, micro_batches: int, unit_size: int, gen_workers: int,
                   update_size: int = 1, trainer_ranks: int = 1, mini_batches: int = 1) -> Params:
        scale = max(costs.generate, costs.tag_generate, costs.score, costs.update, 1e-12)
        return cls(
            micro_batches=micro_batches,
            unit_size=unit_size,
            gen_workers=gen_workers,
            generate=costs.generate,
            tag_generate=costs.tag_generate,
            score=costs.score,
            update=costs.update,
            switch_to_gen=costs.switch_to_gen,
            switch_to_train=costs.switch_to_train,
            optimizer_step=costs.optimizer_step,
            quantum=scale * 1e-9,
            update_size=update_size,
            trainer_ranks=trainer_ranks,
            weight_sync=costs.weight_sync,
            mini_batches=mini_batches,
        )


class ModelState:
    """Mutable compressed schedule state; ``copy`` is cheap (a few short lists).

    Step: ``dispatched`` micro-batches handed out, ``score_queue`` (micro-batch indices, a heap),
    ``scored`` (release unit -> micro-batches scored), ``update_queue`` and ``not_updated`` (counts).
    Generators (one list entry each): ``gen_end``, ``gen_task`` (``IDLE``, ``GEN`` ...), ``gen_mb``
    and ``gen_lagging`` (holds the previous version: picks the new one up when next idle). Next step
    (TCSS): ``next_score_queue`` (generated, waiting to be scored), ``next_undispatched``,
    ``stale_left`` (budget). Trainer unit: ``trainer_task`` / ``trainer_end``, ``generating`` (1 =
    generation mode), ``reserved`` (TAG micro-batches waiting for the switch), ``decided`` (the decision
    of this event is taken; the next comes at the next event). TAG slots:
    ``slot_end`` and ``slot_mb`` of the busy ones (``slots`` in all). Mini-batches: ``mini`` (those whose
    optimizer step ran) and ``later`` (per mini-batch, released micro-batches waiting for its turn; the
    current one's are in ``update_queue``). Clocks are absolute (``now``).
    """

    __slots__ = (
        "now", "dispatched", "gen_end", "gen_task", "gen_mb", "gen_lagging", "score_queue",
        "next_score_queue", "scored", "update_queue", "not_updated", "generating", "trainer_end",
        "trainer_task", "stale_left", "next_undispatched", "decided", "slots", "slot_end", "slot_mb",
        "reserved", "work", "mini", "later",
    )

    def __init__(
        self,
        now: float,
        dispatched: int,
        gen_end: list[float],
        gen_task: list[int],
        gen_mb: list[int],
        score_queue: list[int],
        next_score_queue: int,
        scored: dict[int, int],
        update_queue: int,
        not_updated: int,
        generating: int,
        stale_left: int = 0,
        next_undispatched: int = 0,
        trainer_end: float = 0.0,
        trainer_task: int = T_IDLE,
        decided: bool = False,
        gen_lagging: list[bool] | None = None,
        slots: int = 1,
        slot_end: list[float] | None = None,
        slot_mb: list[int] | None = None,
        reserved: list[int] | None = None,
        later: list[int] | None = None,
    ) -> None:
        self.now, self.dispatched = now, dispatched
        self.gen_end, self.gen_task, self.gen_mb = gen_end, gen_task, gen_mb
        self.gen_lagging = gen_lagging if gen_lagging is not None else [False] * len(gen_task)
        self.score_queue = sorted(score_queue)  # a sorted list is a valid heap
        self.next_score_queue, self.scored = next_score_queue, scored
        self.update_queue, self.not_updated, self.generating = update_queue, not_updated, generating
        self.stale_left, self.next_undispatched = stale_left, next_undispatched
        self.trainer_end, self.trainer_task, self.decided = trainer_end, trainer_task, decided
        self.slots = slots
        self.slot_end = list(slot_end or [])
        self.slot_mb = list(slot_mb or [])
        self.reserved = list(reserved or [])
        self.work = 0  # search work spent playing this state forward (events x workers), for the budget
        self.mini = 0
        self.later = list(later or [])

    @classmethod
    def fresh(cls, micro_batches: int, gen_workers: int, stale_budget: int = 0, slots: int = 1,
              lagging: int = 0) -> ModelState:
        """A step about to start (all idle, trainer in training mode); ``lagging`` generators still
        hold the previous version."""
        g = gen_workers
        return cls(0.0, 0, [0.0] * g, [IDLE] * g, [-1] * g, [], 0, {}, 0, micro_batches, 0,
                   stale_budget, micro_batches if stale_budget else 0,
                   gen_lagging=[i < lagging for i in range(g)], slots=slots)

    @classmethod
    def from_view(cls, view: SchedulerView) -> ModelState:
        """The state BTS searches, built from the scheduler's neutral view at a bubble (clocks
        relative to the bubble: ``now`` = 0)."""
        gen_end, gen_task, gen_mb, lagging = [], [], [], []
        for g in view.generators:
            if g.task is None:
                kind = IDLE
            elif g.task == WEIGHT_SYNC:
                kind = PICKUP
            elif g.task == GENERATE:
                kind = GEN_NEXT if g.next_step else GEN
            elif g.task == SCORE:
                kind = SCORE_NEXT if g.next_step else SCORE_CUR
            else:
                raise ValueError(f"BTS cannot model a generator running {g.task!r}")
            gen_task.append(kind)
            gen_end.append(g.remaining if kind != IDLE else 0.0)
            gen_mb.append(g.micro_batch if kind in (GEN, SCORE_CUR) and g.micro_batch is not None else -1)
            lagging.append(g.lagging)
        return cls(
            now=0.0,
            dispatched=view.dispatched,
            gen_end=gen_end,
            gen_task=gen_task,
            gen_mb=gen_mb,
            score_queue=list(view.scoring_queue),
            next_score_queue=view.next_step_scoring,
            scored=dict(view.scored_per_unit),
            update_queue=view.update_queue,
            not_updated=view.not_updated,
            generating=1 if view.trainer_generating else 0,
            stale_left=view.stale_budget_left,
            next_undispatched=view.next_step_undispatched,
            gen_lagging=lagging,
            slots=view.tag_slots,
            slot_end=[e for e, _ in view.busy_slots],
            slot_mb=[mb for _, mb in view.busy_slots],
            later=[0, *view.later_ready] if view.later_ready else None,
        )

    def copy(self) -> ModelState:
        n = ModelState.__new__(ModelState)
        n.now, n.dispatched = self.now, self.dispatched
        n.gen_end, n.gen_task, n.gen_mb, n.gen_lagging = (self.gen_end[:], self.gen_task[:], self.gen_mb[:],
                                                          self.gen_lagging[:])
        n.score_queue, n.next_score_queue, n.scored = self.score_queue[:], self.next_score_queue, dict(self.scored)
        n.update_queue, n.not_updated, n.generating = self.update_queue, self.not_updated, self.generating
        n.stale_left, n.next_undispatched = self.stale_left, self.next_undispatched
        n.trainer_end, n.trainer_task, n.decided = self.trainer_end, self.trainer_task, self.decided
        n.slots, n.slot_end, n.slot_mb, n.reserved = self.slots, self.slot_end[:], self.slot_mb[:], self.reserved[:]
        n.work, n.mini, n.later = self.work, self.mini, self.later[:]
        return n

    @property
    def free(self) -> int:
        """TAG slots a decision may use now."""
        return self.slots if not self.generating else self.slots - len(self.slot_end)

    def key(self, q: float, units: bool = True) -> tuple:
        """Memo key: counts, queues and clocks relative to now. Without release units of several
        micro-batches (``units=False``) micro-batches are interchangeable, so their indices drop out.
        Only taken at decision states, where no idle generator lags (``advance`` starts its pickup
        first), so the busy generators carry every lagging flag."""
        now, task, lag = self.now, self.gen_task, self.gen_lagging
        gens = tuple(sorted(
            (round((self.gen_end[w] - now) / q), task[w], self.gen_mb[w] if units else 0, lag[w])
            for w in range(len(task)) if task[w]
        ))
        slots = tuple(sorted((round((e - now) / q), i if units else 0) for e, i in zip(self.slot_end, self.slot_mb))) \
            if self.slot_end else ()
        sq = tuple(self.score_queue) if units else len(self.score_queue)
        return (self.dispatched, gens, sq, self.next_score_queue, tuple(sorted(self.scored.items())),
                self.update_queue, self.not_updated, self.generating, self.stale_left, self.next_undispatched,
                slots, self.mini, tuple(self.later))


def advance(p: Params, s: ModelState) -> bool:
    """Play the scheduler's rules until a TAG decision is due (False) or the optimizer step ends (True).

    Generators, when idle: score (current step, then next), pick up the new version, generate, (TCSS)
    generate ahead while no TAG is in flight. Trainer: launch reserved TAG after the switch; update /
    optimizer step; else a decision (in generation mode with updates waiting: once every slot is free,
    and a skip switches back). The hot loop of the search: state is kept in locals.
    """
    n_gen, n_mb, ranks = p.gen_workers, p.micro_batches, p.trainer_ranks
    gen_end, gen_task, gen_mb, lagging = s.gen_end, s.gen_task, s.gen_mb, s.gen_lagging
    score_queue, scored = s.score_queue, s.scored
    slot_end, slot_mb = s.slot_end, s.slot_mb
    now, dispatched, next_scoring = s.now, s.dispatched, s.next_score_queue
    update_queue, not_updated, generating = s.update_queue, s.not_updated, s.generating
    trainer_task, trainer_end, decided = s.trainer_task, s.trainer_end, s.decided
    stale_left, next_undispatched = s.stale_left, s.next_undispatched
    score, generate, tag_generate, unit_size = p.score, p.generate, p.tag_generate, p.unit_size
    mini_mbs = p.mini_mbs
    if len(s.later) < p.mini_batches:
        s.later.extend([0] * (p.mini_batches - len(s.later)))
    done = False
    events = 0
    while True:
        events += 1
        # generators
        if IDLE in gen_task:
            for w in range(n_gen):
                if gen_task[w]:
                    continue
                if score_queue:
                    gen_mb[w] = heappop(score_queue)
                    gen_task[w] = SCORE_CUR
                    gen_end[w] = now + score
                elif next_scoring:
                    next_scoring -= 1
                    gen_task[w], gen_mb[w], gen_end[w] = SCORE_NEXT, -1, now + score
                elif lagging[w]:
                    lagging[w] = False
                    gen_task[w], gen_mb[w], gen_end[w] = PICKUP, -1, now + p.weight_sync
                elif dispatched < n_mb:
                    gen_mb[w] = dispatched
                    dispatched += 1
                    gen_task[w], gen_end[w] = GEN, now + generate
                elif stale_left and next_undispatched and not slot_end and not s.reserved:
                    stale_left -= 1
                    next_undispatched -= 1
                    gen_task[w], gen_mb[w], gen_end[w] = GEN_NEXT, -1, now + generate
        # trainer
        if s.reserved and generating:
            for mb in s.reserved:
                slot_end.append(now + tag_generate)
                slot_mb.append(mb)
            s.reserved = []
        if not trainer_task:
            ready = update_queue or not_updated == n_mb - (s.mini + 1) * mini_mbs
            if generating:  # a free slot; with training work waiting, only once every slot is free
                due = not slot_end if ready else len(slot_end) < ranks
            else:
                due = not ready
            if due and dispatched < n_mb and not decided and not s.mini:
                break
            if ready:
                if generating:
                    if not slot_end:
                        trainer_task, trainer_end = T_SWITCH_TO_TRAIN, now + p.switch_to_train
                elif update_queue:
                    update_queue -= p.update_size
                    trainer_task, trainer_end = T_UPDATE, now + p.update
                else:
                    trainer_task, trainer_end = T_OPT, now + p.optimizer_step
        # next completion(s)
        t_next = trainer_end if trainer_task else INF
        for w in range(n_gen):
            if gen_task[w] and gen_end[w] < t_next:
                t_next = gen_end[w]
        if slot_end:
            e = min(slot_end)
            if e < t_next:
                t_next = e
        if t_next == INF:
            raise RuntimeError("BTS model deadlocked (no task in flight)")
        lim = t_next + EPS
        t_max = t_next
        for w in range(n_gen):
            kind = gen_task[w]
            if kind and gen_end[w] <= lim:
                if gen_end[w] > t_max:
                    t_max = gen_end[w]
                if kind == GEN:
                    heappush(score_queue, gen_mb[w])
                elif kind == SCORE_CUR:
                    unit = gen_mb[w] // unit_size
                    n = scored.get(unit, 0) + 1
                    if n == unit_size:
                        scored.pop(unit, None)
                        mini = unit * unit_size // mini_mbs
                        if mini == s.mini:
                            update_queue += unit_size
                        else:
                            s.later[mini] += unit_size
                    else:
                        scored[unit] = n
                elif kind == GEN_NEXT:
                    next_scoring += 1
                gen_task[w] = IDLE
        if slot_end and min(slot_end) <= lim:
            keep_end, keep_mb = [], []
            for e, i in zip(slot_end, slot_mb):
                if e <= lim:
                    if e > t_max:
                        t_max = e
                    heappush(score_queue, i)
                else:
                    keep_end.append(e)
                    keep_mb.append(i)
            slot_end[:], slot_mb[:] = keep_end, keep_mb
        if trainer_task and trainer_end <= lim:
            if trainer_end > t_max:
                t_max = trainer_end
            done_kind = trainer_task
            trainer_task = T_IDLE
            if done_kind == T_UPDATE:
                not_updated -= p.update_size
            elif done_kind == T_SWITCH_TO_GEN:
                generating = 1
            elif done_kind == T_SWITCH_TO_TRAIN:
                generating = 0
            elif s.mini + 1 < p.mini_batches:  # a mini-batch's optimizer step: the next one's updates are due
                s.mini += 1
                update_queue += s.later[s.mini]
                s.later[s.mini] = 0
            else:  # the last optimizer step: the step is over
                t_max = trainer_end
                done = True
        now = t_max
        decided = False  # a new event: a decision is due again (at most one per event)
        if done:
            break
    s.now, s.dispatched, s.next_score_queue = now, dispatched, next_scoring
    s.update_queue, s.not_updated, s.generating = update_queue, not_updated, generating
    s.trainer_task, s.trainer_end, s.decided = trainer_task, trainer_end, decided
    s.stale_left, s.next_undispatched = stale_left, next_undispatched
    s.work += CALL_WORK + events * (n_gen + EVENT_WORK)
    return done


def choices(s: ModelState, micro_batches: int, fan_out: int | None = None, hint: int = 1) -> list[int]:
    """The decisions open at a bubble: how many TAG micro-batches to start (0 = skip), ascending.

    Every count ``0 .. most`` (``most`` = min(free slots, undispatched)) while ``most + 1 <= fan_out``
    (or ``fan_out`` is None). Beyond that the fan-out cap keeps ``fan_out`` of them: 0, ``most``, ``hint``
    (the lower bound's best number of TAG micro-batches, clamped to ``1 .. most``), then evenly spaced
    counts in between."""
    most = min(s.free, micro_batches - s.dispatched)
    if fan_out is None or most + 1 <= fan_out:
        return list(range(most + 1))
    keep = {0, most, min(max(1, hint), most)}
    for k in [round(most * i / (fan_out - 1)) for i in range(1, fan_out - 1)] + list(range(1, most)):
        if len(keep) >= fan_out:
            break
        keep.add(k)
    return sorted(keep)


def apply(p: Params, s: ModelState, k: int) -> None:
    """Take a TAG decision at a bubble: start ``k`` TAG micro-batches (after a switch if training)."""
    k = int(k)
    s.decided = True
    if k <= 0:
        return
    mbs = range(s.dispatched, s.dispatched + k)
    s.dispatched += k
    if s.generating:
        for mb in mbs:
            s.slot_end.append(s.now + p.tag_generate)
            s.slot_mb.append(mb)
    else:
        s.reserved = list(mbs)
        s.trainer_task, s.trainer_end = T_SWITCH_TO_GEN, s.now + p.switch_to_gen


def lower_bound(p: Params, s: ModelState) -> float:
    """Admissible bound on the time left until the optimizer step ends (:func:`bound_and_split`)."""
    return bound_and_split(p, s)[0]


def bound_and_split(p: Params, s: ModelState) -> tuple[float, int]:
    """(bound, x): an admissible bound on the time left (from ``s.now``) until the optimizer step ends.

    Trainer: every update left, the optimizer step, a switch back to training if needed, plus ``x``
    TAG generations spread perfectly over the slots (and their switches). Generator pool: in-flight
    current-step work, the ``U - x`` remaining generations and every scoring left, spread perfectly
    over G workers, then at least one update and the optimizer step. Minimized over the split ``x``.
    Weight pickups are left out (a generator may do its pickup after the step's last scoring). ``x``:
    the number of further TAG micro-batches at which the bound is smallest (0: none); the fan-out cap
    keeps it among the choices. Called at decision states only: the trainer unit is idle and no TAG waits
    for a switch.
    """
    now = s.now
    n_gen, ranks = p.gen_workers, p.trainer_ranks
    undispatched = p.micro_batches - s.dispatched
    busy = 0.0
    n_score = len(s.score_queue) + undispatched + len(s.slot_end)
    for w in range(n_gen):
        kind = s.gen_task[w]
        if kind == GEN or kind == SCORE_CUR:
            busy += s.gen_end[w] - now
            if kind == GEN:
                n_score += 1
    tail = p.update + p.optimizer_step
    train_left = (s.not_updated // p.update_size) * p.update + (p.mini_batches - s.mini) * p.optimizer_step
    if s.slot_end:
        slot_sum = sum(e - now for e in s.slot_end)
        drain = max(e - now for e in s.slot_end)
    else:
        slot_sum = drain = 0.0
    trainer_no_tag = train_left + (p.switch_to_train if s.generating else 0.0) + max(drain, slot_sum / ranks)
    if n_score == 0:
        return trainer_no_tag, 0
    pool_no_tag = (busy + undispatched * p.generate + n_score * p.score) / n_gen + tail
    best, best_x = max(pool_no_tag, trainer_no_tag), 0
    if undispatched == 0:
        return best, 0
    # x >= 1 more TAG micro-batches: the slots share x * tag_generate, plus a switch in (if training) and out
    trainer_with_tag = train_left + (0.0 if s.generating else p.switch_to_gen) + p.switch_to_train
    pool_saving = p.generate / n_gen  # pool time saved per micro-batch moved to TAG
    slot_cost = p.tag_generate / ranks  # slot time added per TAG micro-batch

    def value(x: int) -> float:
        return max(pool_no_tag - x * pool_saving,
                   trainer_with_tag + max(drain, (slot_sum + x * p.tag_generate) / ranks))

    xs = {1, undispatched}
    denom = pool_saving + slot_cost
    if denom > 0:  # crossing with the sloped part, and with the drain floor
        for xc in ((pool_no_tag - trainer_with_tag - slot_sum / ranks) / denom,
                   (pool_no_tag - trainer_with_tag - drain) / pool_saving if pool_saving > 0 else 1):
            lo = min(max(1, math.floor(xc)), undispatched)
            xs.update((lo, min(lo + 1, undispatched)))
    for x in sorted(xs):
        v = value(x)
        if v < best:
            best, best_x = v, x
    return best, best_x


RULES = ("split", "never", "always", "one", "threshold")
#: a decision sequence as a linked list: (TAG micro-batches to start at the next decision, the rest)
Plan = tuple | None


def _rollout(p: Params, s: ModelState, rule: str, plan: Plan = None) -> tuple[float, int, int, Plan]:
    """A greedy policy played from ``s`` (a decision state; the incumbent): (end time, first decision,
    search work spent, its decisions). ``rule="plan"`` replays ``plan`` (clamped to what is open; the
    rule ``never`` once it runs out)."""
    s = s.copy()
    work, first, taken = s.work, None, []
    while first is None or not advance(p, s):
        most = min(s.free, p.micro_batches - s.dispatched)
        if rule == "plan":
            k, plan = (min(plan[0], most), plan[1]) if plan is not None else (0, None)
        elif rule == "never":
            k = 0
        elif rule == "always":
            k = most
        elif rule == "one":
            k = min(1, most)
        elif rule == "split":
            k = min(most, bound_and_split(p, s)[1]) if most else 0
        else:
            k = most if (p.micro_batches - s.dispatched) >= 0.3 * p.micro_batches else 0
        if first is None:
            first = k
        taken.append(k)
        apply(p, s, k)
    path = None
    for k in reversed(taken):
        path = (k, path)
    return s.now, first, s.work - work, path


DEFAULT_FAN_OUT = 5  # decisions tried per bubble: exact while at most 4 TAG slots are free
DEFAULT_WORK_CAP = 60_000  # search work per solve (rollouts included): about 7 ms on the 2-core CI machine
DEFAULT_NODE_CAP = 200_000


@dataclass
class SearchStats:
    nodes: int = 0  # searched states, for the node cap
    capped: bool = False  # the last solve hit its node or work cap: its plan is the best found, not proven best
    seconds: float = 0.0
    work: int = 0  # search work (CALL_WORK, EVENT_WORK), rollouts included
    fanned_out: int = 0  # bubbles where the fan-out cap left decisions out (the solve may be inexact)


@dataclass
class Solver:
    """Memoized branch-and-bound over TAG decisions for one set of costs.

    Caps (None lifts one): ``fan_out`` decisions tried per bubble (:func:`choices`), ``work_cap`` units
    of search work and ``node_cap`` nodes per solve; past a cap the best plan found so far, or the best
    greedy rollout if that is better, is used (``stats.capped``). Where no cap binds the solve is exact."""

    params: Params
    memo: bool = True
    prune: bool = True
    node_cap: int | None = DEFAULT_NODE_CAP
    work_cap: int | None = DEFAULT_WORK_CAP
    fan_out: int | None = DEFAULT_FAN_OUT
    exact: dict = field(default_factory=dict)  # memo: state key -> (remaining time, its best plan)
    lbs: dict = field(default_factory=dict)
    stats: SearchStats = field(default_factory=SearchStats)
    plan: Plan = None  # the last solve's best plan from its next decision on (replayed as an incumbent)
    _plan_dispatched: int = 0
    _path: Plan = None  # the plan behind the value ``_search`` last returned
    _node_budget: float = INF
    _work_budget: float = INF

    def _choices(self, s: ModelState, hint: int) -> list[int]:
        ks = choices(s, self.params.micro_batches, self.fan_out, hint)
        if self.fan_out is not None and len(ks) < min(s.free, self.params.micro_batches - s.dispatched) + 1:
            self.stats.fanned_out += 1
        return ks

    def solve(self, state: ModelState) -> tuple[float, int | None]:
        """Best remaining time from ``state`` (at a bubble or before one) and the decision to take
        now: TAG micro-batches to start (None if no bubble comes before the optimizer step ends)."""
        t_start = time.perf_counter()
        st = self.stats
        st.capped = False
        self._node_budget = INF if self.node_cap is None else st.nodes + self.node_cap
        work0 = st.work
        self._work_budget = INF if self.work_cap is None else work0 + self.work_cap
        p = self.params
        s = state.copy()
        t0 = s.now
        done = advance(p, s)
        st.work += s.work - state.work
        if done:
            self.plan = None
            st.seconds += time.perf_counter() - t_start
            return s.now - t0, None
        base = s.now - t0
        # the last solve's plan goes on from here (a new step starts with nothing dispatched: drop it)
        plan = self.plan if s.dispatched >= self._plan_dispatched else None
        # the decisions open now, each played to the next decision; then greedy rollouts from each (the
        # incumbent, and the order in which they are searched: the best rollout first)
        kids = []  # [best rollout value (exact if the step ended), k, child state, time to it, step ended, plan]
        ks = self._choices(s, bound_and_split(p, s)[1])
        if plan is not None and plan[0] not in ks and plan[0] <= min(s.free, p.micro_batches - s.dispatched):
            ks = sorted([*ks, plan[0]])
        for k in ks:
            c = s.copy()
            apply(p, c, k)
            done = advance(p, c)
            st.work += c.work - s.work
            kids.append([c.now - s.now if done else INF, k, c, c.now - s.now, done, None])
        if self.prune:
            rules = [("plan", kid) for kid in kids if plan is not None and kid[1] == plan[0]]
            rules += [(r, kid) for r in RULES for kid in kids]
            for r, kid in rules:  # on a huge step the rollouts alone could eat the budget: keep half for the search
                if self.work_cap is not None and st.work - work0 > self.work_cap / 2 and kid[0] < INF:
                    continue
                if not kid[4]:
                    end, _, work, path = _rollout(p, kid[2], r, plan[1] if r == "plan" else None)
                    st.work += work
                    if end - s.now < kid[0]:
                        kid[0], kid[5] = end - s.now, path
        incumbent = min(((kid[0], kid[1], kid[5]) for kid in kids), default=(INF, 0, None))
        ub = incumbent[0] + 1e-7 * (1 + abs(s.now)) if self.prune else INF
        best, decision, rest = INF, 0, None
        for _rolled, k, c, dt, done, _path in sorted(kids, key=lambda kid: (kid[0], kid[1])):
            v = dt if done else dt + self._search(c, min(ub, best) - dt)
            if v < best - EPS:
                best, decision, rest = v, k, None if done else self._path
        if st.capped and incumbent[0] < best - EPS:
            best, decision, rest = incumbent  # the search stopped short of the best rollout
        if best == INF:  # capped before any plan was completed (no rollouts): fall back to the greedy rules
            st.capped = True
            ends = {r: _rollout(p, s, r)[0] for r in ("never", "always")}
            decision = min(s.free, p.micro_batches - s.dispatched) if ends["always"] < ends["never"] else 0
            best, rest = min(ends.values()) - s.now, None
        self.plan, self._plan_dispatched = rest, s.dispatched
        st.seconds += time.perf_counter() - t_start
        return base + best, decision

    def _search(self, s: ModelState, ub: float) -> float:
        """Best remaining time from ``s`` (INF: not below ``ub``, or capped); its plan in ``_path``."""
        st = self.stats
        st.nodes += 1
        self._path = None
        if st.nodes > self._node_budget or st.work > self._work_budget:
            st.capped = True
            return INF
        p = self.params
        key = None
        if self.memo:
            key = s.key(p.quantum, p.unit_size > 1)
            hit = self.exact.get(key)
            if hit is not None:
                v, self._path = hit
                return v
            if self.lbs.get(key, -INF) >= ub:
                return INF
        if self.prune or self.fan_out is not None:
            lb, hint = bound_and_split(p, s)
        else:
            lb, hint = -INF, 1
        if self.prune and lb >= ub:
            if key is not None:
                self.lbs[key] = max(self.lbs.get(key, -INF), ub)
            return INF
        best, path = INF, None
        for k in reversed(self._choices(s, hint)):  # the most TAG first: finds a good incumbent early
            c = s.copy()
            apply(p, c, k)
            done = advance(p, c)
            st.work += c.work - s.work
            if done:
                v, rest = c.now - s.now, None
            else:
                dt = c.now - s.now
                v = dt + self._search(c, min(ub, best) - dt)
                rest = self._path
            if v < best:
                best, path = v, (k, rest)
        if key is not None and not st.capped:
            if best < ub:
                self.exact[key] = (best, path)
            else:
                self.lbs[key] = max(self.lbs.get(key, -INF), ub)
        self._path = path
        return best


def solve(params: Params, state: ModelState, memo: bool = True, prune: bool = True,
          node_cap: int | None = DEFAULT_NODE_CAP, work_cap: int | None = DEFAULT_WORK_CAP,
          fan_out: int | None = DEFAULT_FAN_OUT) -> tuple[float, int | None, SearchStats]:
    """One BTS solve from scratch: (best remaining time, decision now, search statistics). Pass
    ``work_cap=None, fan_out=None`` (and a large ``node_cap``) for a search that is exact everywhere."""
    solver = Solver(params, memo=memo, prune=prune, node_cap=node_cap, work_cap=work_cap, fan_out=fan_out)
    value, decision = solver.solve(state)
    return value, decision, solver.stats


def exhaustive(params: Params, state: ModelState) -> tuple[float, int]:
    """Minimum over *every* decision sequence (no memo, no pruning): (remaining time, leaves)."""
    leaves = 0

    def rec(s: ModelState) -> float:
        nonlocal leaves
        if advance(params, s):
            leaves += 1
            return s.now
        best = INF
        for k in choices(s, params.micro_batches):
            c = s.copy()
            apply(params, c, k)
            best = min(best, rec(c))
        return best

    s = state.copy()
    return rec(s) - state.now, leaves


def play(params: Params, state: ModelState, decisions) -> float:
    """End time (relative) of a fixed decision rule ``decisions(state) -> int`` from ``state``
    (``True`` means every free slot, ``False`` none)."""
    s = state.copy()
    while not advance(params, s):
        k = decisions(s)
        if k is True:
            k = min(s.free, params.micro_batches - s.dispatched)
        apply(params, s, int(k))
    return s.now - state.now


class SolveLog:
    """BTS's per-solve figures in bounded memory: totals over the run (solves, capped solves, the
    slowest) and the last ``window`` solves' times and cap flags, oldest first. A run makes several solves a
    step for as long as it runs; a log of every one grew the driver by about 0.08 KB a step
    (docs/benchmarks.md, "Soak"). The window is a ring of flat arrays allocated whole up front: a ring of
    Python floats (a ``deque``) still grew the driver by a float and a slot per solve until it filled, some
    0.1 KB a step over the first ~350 steps of the tiny run, which is the soak's whole measuring window."""

    WINDOW = 1024

    def __init__(self, window: int = WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.count = 0
        self.capped = 0
        self.max_seconds = 0.0
        self._seconds = array("d", bytes(8 * window))  # ring: solve i lives at i % window
        self._capped = array("b", bytes(window))  # 1: the solve hit a cap

    def add(self, seconds: float, capped: bool) -> None:
        i = self.count % len(self._seconds)
        self._seconds[i] = seconds
        self._capped[i] = bool(capped)
        self.count += 1
        self.capped += bool(capped)
        self.max_seconds = max(self.max_seconds, seconds)

    def __len__(self) -> int:
        return self.count

    def _recent(self, ring: array) -> array:
        """The ring's held values, oldest first (a copy)."""
        n = len(ring)
        if self.count <= n:
            return ring[:self.count]
        head = self.count % n
        return ring[head:] + ring[:head]

    @property
    def recent_seconds(self) -> array:
        """Seconds of the last ``window`` solves (all of them in a shorter run), oldest first."""
        return self._recent(self._seconds)

    @property
    def recent_capped(self) -> array:
        """Whether each of the last ``window`` solves hit a cap (1) or not (0), oldest first."""
        return self._recent(self._capped)


@register_tag_policy("bts")
class BtsPolicy:
    """The ``bts`` TAG policy: re-solve at every decision point (each event that leaves the trainer in
    a bubble with a free TAG slot) with the current cost estimates.

    The memo is kept while the cost estimates stay the same (values are relative times, so later
    decisions of the step reuse earlier work) and dropped when the profiler changes them. The caps
    (:class:`Solver`) bound each solve; ``solves`` (:class:`SolveLog`) counts the solves and those
    that hit a cap, in bounded memory however long the run.
    """

    name = "bts"

    def __init__(self, node_cap: int | None = DEFAULT_NODE_CAP, reuse: bool = True,
                 work_cap: int | None = DEFAULT_WORK_CAP, fan_out: int | None = DEFAULT_FAN_OUT) -> None:
        self.node_cap = node_cap
        self.work_cap = work_cap
        self.fan_out = fan_out
        self.reuse = reuse
        self._solver: Solver | None = None
        self.solves = SolveLog()
        self.last_stats: SearchStats | None = None

    def __str__(self) -> str:
        return "bts"

    def decide(self, ctx: BubbleContext) -> int:
        params = Params.from_costs(ctx.costs, ctx.micro_batches, ctx.unit_size, ctx.gen_workers,
                                   ctx.update_size, ctx.trainer_ranks, ctx.mini_batches)
        if not self.reuse or self._solver is None or self._solver.params != params:
            old = self._solver
            self._solver = Solver(params, node_cap=self.node_cap, work_cap=self.work_cap, fan_out=self.fan_out)
            if old is not None:  # new costs void the memo, not the plan: it stays an incumbent to replay
                self._solver.plan, self._solver._plan_dispatched = old.plan, old._plan_dispatched
        before = self._solver.stats.seconds
        value, decision = self._solver.solve(ModelState.from_view(ctx.snapshot()))
        self.solves.add(self._solver.stats.seconds - before, self._solver.stats.capped)
        self.last_stats = self._solver.stats
        ctx.predicted_end = ctx.now + value
        return int(decision or 0)
