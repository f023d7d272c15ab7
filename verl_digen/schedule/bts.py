"""Bubble-triggered TAG search (BTS, the paper's Algorithm 2).

At a trainer bubble the scheduler hands over a :class:`ModelState` (``StepScheduler.snapshot``): the
rest of the current step compressed into counts and clocks relative to now. :func:`advance` plays the
scheduler's rules forward on it (same rules as :mod:`.scheduler`, micro-batches being
interchangeable apart from their release unit; generators that still hold the previous version pick
the new one up at their next boundary) until the next bubble or the end of the step's optimizer step.
The search tries every branch at each bubble (start ``k`` TAG micro-batches on ``k`` of the free
trainer slots, ``k = 0 .. min(free, undispatched)``; 0 skips the bubble) and keeps the smallest end:

- memoization on the compressed state (counts, queue contents, clocks relative to the bubble,
  rounded to a tiny quantum); values are *remaining* times so equal states met at different absolute
  times share them;
- branch and bound with an admissible lower bound (:func:`lower_bound`: trainer work left vs. the
  generator pool's mandatory work, with the best fractional split of the remaining generations
  between both, solved in closed form);
- an incumbent from greedy rollouts (never / always / threshold) before the search, and a node cap
  after which the best plan found so far is used (reported as not exact).

:func:`exhaustive` enumerates every decision sequence without memo or pruning; tests hold BTS to it.
The objective is the end of the current step's optimizer step: what happens after (weight sync, the
next step) does not depend on the TAG choices of this step, apart from stale TCSS work, which the
model plays but does not value.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from heapq import heappop, heappush

from .costs import StageCosts
from .policies import BubbleContext

# generator task kinds
IDLE, GEN, SCORE_CUR, GEN_NEXT, SCORE_NEXT, PICKUP = 0, 1, 2, 3, 4, 5
# trainer-unit task kinds (TAG runs on the slots, not on the unit)
T_IDLE, T_UPDATE, T_SWG, T_SWT, T_OPT = 0, 1, 3, 4, 5
EPS = 1e-9
INF = math.inf


@dataclass(frozen=True)
class Params:
    """Everything constant during one search."""

    M: int  # micro-batches in the step
    k: int  # release unit size (micro-batches)
    G: int  # generator workers
    g: float
    gt: float
    c: float
    u: float
    swg: float
    swt: float
    opt: float
    quantum: float
    upd: int = 1  # micro-batches per update action
    R: int = 1  # trainer ranks = TAG slots
    w: float = 0.0  # one generator's weight pickup

    @classmethod
    def from_costs(cls, costs: StageCosts, micro_batches: int, unit_size: int, gen_workers: int,
                   update_size: int = 1, trainer_ranks: int = 1) -> Params:
        scale = max(costs.generate, costs.tag_generate, costs.score, costs.update, 1e-12)
        return cls(
            M=micro_batches,
            k=unit_size,
            G=gen_workers,
            g=costs.generate,
            gt=costs.tag_generate,
            c=costs.score,
            u=costs.update,
            swg=costs.switch_to_gen,
            swt=costs.switch_to_train,
            opt=costs.optimizer_step,
            quantum=scale * 1e-9,
            upd=update_size,
            R=trainer_ranks,
            w=costs.weight_sync,
        )


class ModelState:
    """Mutable compressed schedule state; ``copy`` is cheap (a few short lists).

    Generators: end time ``ge``, kind ``gk``, micro-batch ``gi`` and ``lag`` (holds the previous
    version: picks the new one up when next idle). Trainer unit: ``tk``/``te``, ``mode`` (1 = generation
    mode), ``rsv`` (TAG micro-batches waiting for the switch). TAG slots: ends ``se`` and micro-batches
    ``si`` of the busy ones (``slots`` in all).
    """

    __slots__ = (
        "t", "f", "ge", "gk", "gi", "lag", "sq", "sqn", "scored", "uq", "upd_left", "mode",
        "te", "tk", "stale_left", "next_left", "skipped", "slots", "se", "si", "rsv",
    )

    def __init__(
        self,
        t: float,
        f: int,
        ge: list[float],
        gk: list[int],
        gi: list[int],
        sq: list[int],
        sqn: int,
        scored: dict[int, int],
        uq: int,
        upd_left: int,
        mode: int,
        stale_left: int = 0,
        next_left: int = 0,
        te: float = 0.0,
        tk: int = T_IDLE,
        skipped: bool = False,
        lag: list[bool] | None = None,
        slots: int = 1,
        se: list[float] | None = None,
        si: list[int] | None = None,
        rsv: list[int] | None = None,
    ) -> None:
        self.t, self.f, self.ge, self.gk, self.gi = t, f, ge, gk, gi
        self.lag = lag if lag is not None else [False] * len(gk)
        self.sq = sorted(sq)  # a sorted list is a valid heap
        self.sqn, self.scored, self.uq, self.upd_left, self.mode = sqn, scored, uq, upd_left, mode
        self.stale_left, self.next_left = stale_left, next_left
        self.te, self.tk, self.skipped = te, tk, skipped
        self.slots = slots
        self.se = list(se or [])
        self.si = list(si or [])
        self.rsv = list(rsv or [])

    @classmethod
    def fresh(cls, micro_batches: int, gen_workers: int, stale_budget: int = 0, slots: int = 1,
              lagging: int = 0) -> ModelState:
        """A step about to start (all idle, trainer in training mode); ``lagging`` generators still
        hold the previous version."""
        g = gen_workers
        return cls(0.0, 0, [0.0] * g, [IDLE] * g, [-1] * g, [], 0, {}, 0, micro_batches, 0,
                   stale_budget, micro_batches if stale_budget else 0,
                   lag=[i < lagging for i in range(g)], slots=slots)

    def copy(self) -> ModelState:
        n = ModelState.__new__(ModelState)
        n.t, n.f, n.ge, n.gk, n.gi, n.lag = self.t, self.f, self.ge[:], self.gk[:], self.gi[:], self.lag[:]
        n.sq, n.sqn, n.scored, n.uq = self.sq[:], self.sqn, dict(self.scored), self.uq
        n.upd_left, n.mode, n.stale_left, n.next_left = self.upd_left, self.mode, self.stale_left, self.next_left
        n.te, n.tk, n.skipped = self.te, self.tk, self.skipped
        n.slots, n.se, n.si, n.rsv = self.slots, self.se[:], self.si[:], self.rsv[:]
        return n

    @property
    def free(self) -> int:
        """TAG slots a decision may use now."""
        return self.slots if not self.mode else self.slots - len(self.se)

    def key(self, q: float, units: bool = True) -> tuple:
        """Memo key: counts, queues and clocks relative to now. Without release units of several
        micro-batches (``units=False``) micro-batches are interchangeable, so their indices drop out."""
        t = self.t
        gens = tuple(sorted(
            (round((self.ge[w] - t) / q), self.gk[w], self.gi[w] if units else 0, self.lag[w])
            for w in range(len(self.gk)) if self.gk[w]
        ))
        lagging = sum(1 for w in range(len(self.gk)) if not self.gk[w] and self.lag[w]) if True in self.lag else 0
        slots = tuple(sorted((round((e - t) / q), i if units else 0) for e, i in zip(self.se, self.si))) \
            if self.se else ()
        sq = tuple(self.sq) if units else len(self.sq)
        return (self.f, gens, lagging, sq, self.sqn, tuple(sorted(self.scored.items())), self.uq,
                self.upd_left, self.mode, self.stale_left, self.next_left, slots)


def advance(p: Params, s: ModelState) -> bool:
    """Play the scheduler's rules until a TAG decision is due (False) or the optimizer step ends (True).

    Generators, when idle: score (current step, then next), pick up the new version, generate, (TCSS)
    generate ahead while no TAG is in flight. Trainer: launch reserved TAG after the switch; update /
    switch back / optimizer step; else a decision. The hot loop of the search: state is kept in locals.
    """
    G, M, R = p.G, p.M, p.R
    ge, gk, gi, lag, sq, scored = s.ge, s.gk, s.gi, s.lag, s.sq, s.scored
    se, si = s.se, s.si
    t, f, sqn, uq, upd_left, mode = s.t, s.f, s.sqn, s.uq, s.upd_left, s.mode
    tk, te, skipped, stale_left, next_left = s.tk, s.te, s.skipped, s.stale_left, s.next_left
    c, g, gt, k = p.c, p.g, p.gt, p.k
    done = False
    while True:
        # generators
        if IDLE in gk:
            for w in range(G):
                if gk[w]:
                    continue
                if sq:
                    gi[w] = heappop(sq)
                    gk[w] = SCORE_CUR
                    ge[w] = t + c
                elif sqn:
                    sqn -= 1
                    gk[w], gi[w], ge[w] = SCORE_NEXT, -1, t + c
                elif lag[w]:
                    lag[w] = False
                    gk[w], gi[w], ge[w] = PICKUP, -1, t + p.w
                elif f < M:
                    gi[w] = f
                    f += 1
                    gk[w], ge[w] = GEN, t + g
                elif stale_left and next_left and not se and not s.rsv:
                    stale_left -= 1
                    next_left -= 1
                    gk[w], gi[w], ge[w] = GEN_NEXT, -1, t + g
        # trainer
        if s.rsv and mode:
            for mb in s.rsv:
                se.append(t + gt)
                si.append(mb)
            s.rsv = []
            skipped = True
        if not tk:
            if uq or upd_left == 0:
                if mode:
                    if not se:
                        skipped = False
                        tk, te = T_SWT, t + p.swt
                else:
                    skipped = False
                    if uq:
                        uq -= p.upd
                        tk, te = T_UPDATE, t + p.u
                    else:
                        tk, te = T_OPT, t + p.opt
            elif f < M and not skipped and (not mode or len(se) < R):
                break
        # next completion(s)
        tn = te if tk else INF
        for w in range(G):
            if gk[w] and ge[w] < tn:
                tn = ge[w]
        if se:
            e = min(se)
            if e < tn:
                tn = e
        if tn == INF:
            raise RuntimeError("BTS model deadlocked (no task in flight)")
        lim = tn + EPS
        tmax = tn
        for w in range(G):
            kind = gk[w]
            if kind and ge[w] <= lim:
                if ge[w] > tmax:
                    tmax = ge[w]
                if kind == GEN:
                    heappush(sq, gi[w])
                elif kind == SCORE_CUR:
                    unit = gi[w] // k
                    n = scored.get(unit, 0) + 1
                    if n == k:
                        scored.pop(unit, None)
                        uq += k
                    else:
                        scored[unit] = n
                elif kind == GEN_NEXT:
                    sqn += 1
                gk[w] = IDLE
        if se and min(se) <= lim:
            keep_e, keep_i = [], []
            for e, i in zip(se, si):
                if e <= lim:
                    if e > tmax:
                        tmax = e
                    heappush(sq, i)
                    skipped = False  # a slot came free
                else:
                    keep_e.append(e)
                    keep_i.append(i)
            se[:], si[:] = keep_e, keep_i
        if tk and te <= lim:
            if te > tmax:
                tmax = te
            done_kind = tk
            tk = T_IDLE
            if done_kind == T_UPDATE:
                upd_left -= p.upd
            elif done_kind == T_SWG:
                mode = 1
            elif done_kind == T_SWT:
                mode = 0
            else:  # optimizer step: the step is over
                tmax = te
                done = True
        t = tmax
        if done:
            break
    s.t, s.f, s.sqn, s.uq, s.upd_left, s.mode = t, f, sqn, uq, upd_left, mode
    s.tk, s.te, s.skipped, s.stale_left, s.next_left = tk, te, skipped, stale_left, next_left
    return done


def choices(s: ModelState, M: int) -> range:
    """The decisions open at a bubble: how many TAG micro-batches to start (0 = skip)."""
    return range(min(s.free, M - s.f) + 1)


def apply(p: Params, s: ModelState, k: int) -> None:
    """Take a TAG decision at a bubble: start ``k`` TAG micro-batches (after a switch if training)."""
    k = int(k)
    s.skipped = True
    if k <= 0:
        return
    mbs = range(s.f, s.f + k)
    s.f += k
    if s.mode:
        for mb in mbs:
            s.se.append(s.t + p.gt)
            s.si.append(mb)
    else:
        s.rsv = list(mbs)
        s.tk, s.te = T_SWG, s.t + p.swg


def lower_bound(p: Params, s: ModelState) -> float:
    """Admissible bound on the time left (from ``s.t``) until the optimizer step ends.

    Trainer: every update left, the optimizer step, a switch back to training if needed, plus ``x``
    TAG generations spread perfectly over the slots (and their switches). Generator pool: in-flight
    current-step work, the ``U - x`` remaining generations and every scoring left, spread perfectly
    over G workers, then at least one update and the optimizer step. Minimized over the split ``x``.
    Weight pickups are left out (a generator may do its pickup after the step's last scoring). Called
    at decision states only: the trainer unit is idle and no TAG waits for a switch.
    """
    t = s.t
    U = p.M - s.f
    busy = 0.0
    n_score = len(s.sq) + U + len(s.se)
    for w in range(p.G):
        kind = s.gk[w]
        if kind == GEN or kind == SCORE_CUR:
            busy += s.ge[w] - t
            if kind == GEN:
                n_score += 1
    tail = p.u + p.opt
    t0 = (s.upd_left // p.upd) * p.u + p.opt
    if s.se:
        slot_sum = sum(e - t for e in s.se)
        drain = max(e - t for e in s.se)
    else:
        slot_sum = drain = 0.0
    b0 = t0 + (p.swt if s.mode else 0.0) + max(drain, slot_sum / p.R)
    if n_score == 0:
        return b0
    a0 = (busy + U * p.g + n_score * p.c) / p.G + tail
    best = max(a0, b0)
    if U == 0:
        return best
    # x >= 1 more TAG micro-batches: the slots share x * gt, plus a switch in (if training) and out
    b1 = t0 + (0.0 if s.mode else p.swg) + p.swt
    ga = p.g / p.G
    gr = p.gt / p.R

    def value(x: int) -> float:
        return max(a0 - x * ga, b1 + max(drain, (slot_sum + x * p.gt) / p.R))

    xs = {1, U}
    denom = ga + gr
    if denom > 0:  # crossing with the sloped part, and with the drain floor
        for xc in ((a0 - b1 - slot_sum / p.R) / denom, (a0 - b1 - drain) / ga if ga > 0 else 1):
            lo = min(max(1, math.floor(xc)), U)
            xs.update((lo, min(lo + 1, U)))
    for x in xs:
        v = value(x)
        if v < best:
            best = v
    return best


def _rollout(p: Params, s: ModelState, rule: str) -> float:
    """End time of a greedy policy from ``s`` (used as the initial incumbent)."""
    s = s.copy()
    while not advance(p, s):
        most = min(s.free, p.M - s.f)
        if rule == "never":
            k = 0
        elif rule == "always":
            k = most
        elif rule == "one":
            k = min(1, most)
        else:
            k = most if (p.M - s.f) >= 0.3 * p.M else 0
        apply(p, s, k)
    return s.t


RULES = ("never", "always", "one", "threshold")


@dataclass
class SearchStats:
    nodes: int = 0
    memo_hits: int = 0
    pruned: int = 0
    capped: bool = False
    seconds: float = 0.0


@dataclass
class Solver:
    """Memoized branch-and-bound over TAG decisions for one set of costs."""

    params: Params
    memo: bool = True
    prune: bool = True
    node_cap: int = 200_000
    exact: dict = field(default_factory=dict)
    lbs: dict = field(default_factory=dict)
    stats: SearchStats = field(default_factory=SearchStats)
    _budget: int = 0

    def solve(self, state: ModelState) -> tuple[float, int | None]:
        """Best remaining time from ``state`` (at a bubble or before one) and the decision to take
        now: TAG micro-batches to start (None if no bubble comes before the optimizer step ends)."""
        t_start = time.perf_counter()
        self.stats.capped = False
        self._budget = self.stats.nodes + self.node_cap
        p = self.params
        s = state.copy()
        t0 = s.t
        if advance(p, s):
            self.stats.seconds += time.perf_counter() - t_start
            return s.t - t0, None
        base = s.t - t0
        ub = INF
        if self.prune:
            ub = min(_rollout(p, s, r) for r in RULES) - s.t + 1e-7 * (1 + abs(s.t))
        best, decision = INF, 0
        for k in choices(s, p.M):
            c = s.copy()
            apply(p, c, k)
            dt = c.t - s.t
            if advance(p, c):
                v = c.t - s.t
            else:
                v = (c.t - s.t) + self._search(c, min(ub, best) - dt)
            if v < best - EPS:
                best, decision = v, k
        if best == INF:  # node cap hit before any plan was completed: fall back to the greedy rules
            self.stats.capped = True
            ends = {r: _rollout(p, s, r) for r in ("never", "always")}
            decision = min(s.free, p.M - s.f) if ends["always"] < ends["never"] else 0
            best = min(ends.values()) - s.t
        self.stats.seconds += time.perf_counter() - t_start
        return base + best, decision

    def _search(self, s: ModelState, ub: float) -> float:
        st = self.stats
        st.nodes += 1
        if st.nodes > self._budget:
            st.capped = True
            return INF
        p = self.params
        key = None
        if self.memo:
            key = s.key(p.quantum, p.k > 1)
            v = self.exact.get(key)
            if v is not None:
                st.memo_hits += 1
                return v
            if self.lbs.get(key, -INF) >= ub:
                st.memo_hits += 1
                return INF
        if self.prune and lower_bound(p, s) >= ub:
            st.pruned += 1
            if key is not None:
                self.lbs[key] = max(self.lbs.get(key, -INF), ub)
            return INF
        best = INF
        for k in reversed(choices(s, p.M)):  # the most TAG first: finds a good incumbent early
            c = s.copy()
            apply(p, c, k)
            if advance(p, c):
                v = c.t - s.t
            else:
                dt = c.t - s.t
                v = dt + self._search(c, min(ub, best) - dt)
            if v < best:
                best = v
        if key is not None and not st.capped:
            if best < ub:
                self.exact[key] = best
            else:
                self.lbs[key] = max(self.lbs.get(key, -INF), ub)
        return best


def solve(params: Params, state: ModelState, memo: bool = True, prune: bool = True,
          node_cap: int = 200_000) -> tuple[float, int | None, SearchStats]:
    """One BTS solve from scratch: (best remaining time, decision now, search statistics)."""
    solver = Solver(params, memo=memo, prune=prune, node_cap=node_cap)
    value, decision = solver.solve(state)
    return value, decision, solver.stats


def exhaustive(params: Params, state: ModelState) -> tuple[float, int]:
    """Minimum over *every* decision sequence (no memo, no pruning): (remaining time, leaves)."""
    leaves = 0

    def rec(s: ModelState) -> float:
        nonlocal leaves
        if advance(params, s):
            leaves += 1
            return s.t
        best = INF
        for k in choices(s, params.M):
            c = s.copy()
            apply(params, c, k)
            best = min(best, rec(c))
        return best

    s = state.copy()
    return rec(s) - state.t, leaves


def play(params: Params, state: ModelState, decisions) -> float:
    """End time (relative) of a fixed decision rule ``decisions(state) -> int`` from ``state``
    (``True`` means every free slot, ``False`` none)."""
    s = state.copy()
    while not advance(params, s):
        k = decisions(s)
        if k is True:
            k = min(s.free, params.M - s.f)
        apply(params, s, int(k))
    return s.t - state.t


class BtsPolicy:
    """The ``bts`` TAG policy: re-solve at every bubble with the current cost estimates.

    The memo is kept while the cost estimates stay the same (values are relative times, so later
    bubbles of the step reuse earlier work) and dropped when the profiler changes them.
    """

    name = "bts"

    def __init__(self, node_cap: int = 200_000, reuse: bool = True) -> None:
        self.node_cap = node_cap
        self.reuse = reuse
        self._solver: Solver | None = None
        self.solve_seconds: list[float] = []
        self.last_stats: SearchStats | None = None

    def __str__(self) -> str:
        return "bts"

    def decide(self, ctx: BubbleContext) -> int:
        params = Params.from_costs(ctx.costs, ctx.micro_batches, ctx.unit_size, ctx.gen_workers,
                                   ctx.update_size, ctx.trainer_ranks)
        if not self.reuse or self._solver is None or self._solver.params != params:
            self._solver = Solver(params, node_cap=self.node_cap)
        before = self._solver.stats.seconds
        value, decision = self._solver.solve(ctx.snapshot())
        self.solve_seconds.append(self._solver.stats.seconds - before)
        self.last_stats = self._solver.stats
        ctx.predicted_end = ctx.now + value
        return int(decision or 0)
