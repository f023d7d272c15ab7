"""Bubble-triggered TAG search (BTS, the paper's Algorithm 2).

At a trainer bubble the scheduler hands over a :class:`ModelState` (``StepScheduler.snapshot``): the
rest of the current step compressed into counts and clocks relative to now. :func:`advance` plays the
scheduler's rules forward on it (same rules as :mod:`.scheduler`, micro-batches being
interchangeable apart from their release unit) until the next bubble or the end of the step's
optimizer step. The search tries both branches at each bubble (insert one TAG micro-batch / skip the
bubble) and keeps the smaller end time:

- memoization on the compressed state (counts, queue contents, clocks relative to the bubble,
  rounded to a tiny quantum); values are *remaining* times so equal states met at different absolute
  times share them;
- branch and bound with an admissible lower bound (:func:`lower_bound`: trainer work left vs. the
  generator pool's mandatory work, with the best fractional split of the remaining generations
  between both, solved in closed form);
- an incumbent from greedy rollouts (never / always / threshold) before the search, and a node cap
  after which the best plan found so far is used (reported as not exact).

:func:`exhaustive` enumerates every insert/skip sequence without memo or pruning; tests hold BTS to it.
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
IDLE, GEN, SCORE_CUR, GEN_NEXT, SCORE_NEXT = 0, 1, 2, 3, 4
# trainer task kinds
T_IDLE, T_UPDATE, T_TAG, T_SWG, T_SWT, T_OPT = 0, 1, 2, 3, 4, 5
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

    @classmethod
    def from_costs(cls, costs: StageCosts, micro_batches: int, unit_size: int, gen_workers: int,
                   update_size: int = 1) -> Params:
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
        )


class ModelState:
    """Mutable compressed schedule state; ``copy`` is cheap (a few short lists)."""

    __slots__ = (
        "t", "f", "ge", "gk", "gi", "sq", "sqn", "scored", "uq", "upd_left", "mode",
        "te", "tk", "ti", "stale_left", "next_left", "skipped",
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
        ti: int = -1,
        skipped: bool = False,
    ) -> None:
        self.t, self.f, self.ge, self.gk, self.gi = t, f, ge, gk, gi
        self.sq = sorted(sq)  # a sorted list is a valid heap
        self.sqn, self.scored, self.uq, self.upd_left, self.mode = sqn, scored, uq, upd_left, mode
        self.stale_left, self.next_left = stale_left, next_left
        self.te, self.tk, self.ti, self.skipped = te, tk, ti, skipped

    @classmethod
    def fresh(cls, micro_batches: int, gen_workers: int, stale_budget: int = 0) -> ModelState:
        """A step about to start (all idle, trainer in training mode)."""
        g = gen_workers
        return cls(0.0, 0, [0.0] * g, [IDLE] * g, [-1] * g, [], 0, {}, 0, micro_batches, 0,
                   stale_budget, micro_batches if stale_budget else 0)

    def copy(self) -> ModelState:
        n = ModelState.__new__(ModelState)
        n.t, n.f, n.ge, n.gk, n.gi = self.t, self.f, self.ge[:], self.gk[:], self.gi[:]
        n.sq, n.sqn, n.scored, n.uq = self.sq[:], self.sqn, dict(self.scored), self.uq
        n.upd_left, n.mode, n.stale_left, n.next_left = self.upd_left, self.mode, self.stale_left, self.next_left
        n.te, n.tk, n.ti, n.skipped = self.te, self.tk, self.ti, self.skipped
        return n

    def key(self, q: float) -> tuple:
        t = self.t
        gens = tuple(sorted(
            (round((self.ge[w] - t) / q), self.gk[w], self.gi[w]) for w in range(len(self.gk)) if self.gk[w]
        ))
        return (self.f, gens, tuple(self.sq), self.sqn, tuple(sorted(self.scored.items())), self.uq,
                self.upd_left, self.mode, self.stale_left, self.next_left)


def advance(p: Params, s: ModelState) -> bool:
    """Play the scheduler's rules until a TAG decision is due (False) or the optimizer step ends (True)."""
    M, G = p.M, p.G
    ge, gk, gi = s.ge, s.gk, s.gi
    while True:
        t = s.t
        # generator workers: score first, then generate, then (TCSS) stale next-step work
        for w in range(G):
            if gk[w]:
                continue
            if s.sq:
                gi[w] = heappop(s.sq)
                gk[w] = SCORE_CUR
                ge[w] = t + p.c
            elif s.sqn:
                s.sqn -= 1
                gk[w] = SCORE_NEXT
                gi[w] = -1
                ge[w] = t + p.c
            elif s.f < M:
                gi[w] = s.f
                s.f += 1
                gk[w] = GEN
                ge[w] = t + p.g
            elif s.stale_left and s.next_left:
                s.stale_left -= 1
                s.next_left -= 1
                gk[w] = GEN_NEXT
                gi[w] = -1
                ge[w] = t + p.g
            else:
                break
        # trainer
        if s.tk == T_IDLE:
            if s.ti >= 0:
                s.tk, s.te, s.skipped = T_TAG, t + p.gt, False
            elif s.uq or s.upd_left == 0:
                s.skipped = False
                if s.mode:
                    s.tk, s.te = T_SWT, t + p.swt
                elif s.uq:
                    s.uq -= p.upd
                    s.tk, s.te = T_UPDATE, t + p.u
                else:
                    s.tk, s.te = T_OPT, t + p.opt
            elif s.f < M and not s.skipped:
                return False
        # next completion(s)
        tn = s.te if s.tk else INF
        for w in range(G):
            if gk[w] and ge[w] < tn:
                tn = ge[w]
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
                    heappush(s.sq, gi[w])
                elif kind == SCORE_CUR:
                    unit = gi[w] // p.k
                    n = s.scored.get(unit, 0) + 1
                    if n == p.k:
                        s.scored.pop(unit, None)
                        s.uq += p.k
                    else:
                        s.scored[unit] = n
                elif kind == GEN_NEXT:
                    s.sqn += 1
                gk[w] = IDLE
        if s.tk and s.te <= lim:
            if s.te > tmax:
                tmax = s.te
            tk = s.tk
            s.tk = T_IDLE
            if tk == T_UPDATE:
                s.upd_left -= p.upd
            elif tk == T_TAG:
                heappush(s.sq, s.ti)
                s.ti = -1
            elif tk == T_SWG:
                s.mode = 1
            elif tk == T_SWT:
                s.mode = 0
            else:  # optimizer step: the step is over
                s.t = s.te
                return True
        s.t = tmax


def apply(p: Params, s: ModelState, insert: bool) -> None:
    """Take a TAG decision at a bubble."""
    if not insert:
        s.skipped = True
        return
    s.ti = s.f
    s.f += 1
    s.skipped = False
    if s.mode:
        s.tk, s.te = T_TAG, s.t + p.gt
    else:
        s.tk, s.te = T_SWG, s.t + p.swg


def lower_bound(p: Params, s: ModelState) -> float:
    """Admissible bound on the time left (from ``s.t``) until the optimizer step ends.

    Trainer: every update left, the optimizer step, a switch back to training if needed, plus ``x``
    TAG generations and their switches. Generator pool: in-flight current-step work, the
    ``U - x`` remaining generations and every scoring left, spread perfectly over G workers, then at
    least one update and the optimizer step. Minimized over the integer split ``x``.
    """
    t = s.t
    U = p.M - s.f
    busy = 0.0
    n_score = len(s.sq) + U
    for w in range(p.G):
        kind = s.gk[w]
        if kind == GEN or kind == SCORE_CUR:
            busy += s.ge[w] - t
            if kind == GEN:
                n_score += 1
    tail = p.u + p.opt
    t0 = (s.upd_left // p.upd) * p.u + p.opt
    if s.tk:  # trainer busy (only at non-decision states)
        t0 += max(0.0, s.te - t)
    b0 = t0 + (p.swt if s.mode else 0.0)
    if n_score == 0:
        return b0
    a0 = (busy + U * p.g + n_score * p.c) / p.G + tail
    best = max(a0, b0)
    if U == 0:
        return best
    # x >= 1 TAG micro-batches: trainer pays gt each plus at least a switch in (if training) and out
    b1 = t0 + (0.0 if s.mode else p.swg) + p.swt
    slope_a = p.g / p.G
    denom = slope_a + p.gt
    xs = (1, U)
    if denom > 0:
        xc = (a0 - b1) / denom
        lo = min(max(1, math.floor(xc)), U)
        xs = (1, U, lo, min(lo + 1, U))
    for x in xs:
        v = max(a0 - x * slope_a, b1 + x * p.gt)
        if v < best:
            best = v
    return best


def _rollout(p: Params, s: ModelState, rule: str) -> float:
    """End time of a greedy policy from ``s`` (used as the initial incumbent)."""
    s = s.copy()
    while not advance(p, s):
        if rule == "never":
            ins = False
        elif rule == "always":
            ins = True
        else:
            ins = (p.M - s.f) >= 0.3 * p.M
        apply(p, s, ins)
    return s.t


@dataclass
class SearchStats:
    nodes: int = 0
    memo_hits: int = 0
    pruned: int = 0
    capped: bool = False
    seconds: float = 0.0


@dataclass
class Solver:
    """Memoized branch-and-bound over insert/skip decisions for one set of costs."""

    params: Params
    memo: bool = True
    prune: bool = True
    node_cap: int = 200_000
    exact: dict = field(default_factory=dict)
    lbs: dict = field(default_factory=dict)
    stats: SearchStats = field(default_factory=SearchStats)
    _budget: int = 0

    def solve(self, state: ModelState) -> tuple[float, bool | None]:
        """Best remaining time from ``state`` (at a bubble or before one) and the decision to take
        now (None if no bubble comes before the optimizer step ends)."""
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
            ub = min(_rollout(p, s, r) for r in ("never", "always", "threshold")) - s.t + 1e-7 * (1 + abs(s.t))
        best, decision = INF, False
        for insert in (False, True):
            c = s.copy()
            apply(p, c, insert)
            dt = c.t - s.t
            if advance(p, c):
                v = c.t - s.t
            else:
                v = (c.t - s.t) + self._search(c, min(ub, best) - dt)
            if v < best - EPS:
                best, decision = v, insert
        if best == INF:  # node cap hit before any plan was completed: fall back to the greedy rules
            self.stats.capped = True
            ends = {r: _rollout(p, s, r) for r in ("never", "always")}
            decision = ends["always"] < ends["never"]
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
            key = s.key(p.quantum)
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
        for insert in (True, False):
            c = s.copy()
            apply(p, c, insert)
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
          node_cap: int = 200_000) -> tuple[float, bool | None, SearchStats]:
    """One BTS solve from scratch: (best remaining time, decision now, search statistics)."""
    solver = Solver(params, memo=memo, prune=prune, node_cap=node_cap)
    value, decision = solver.solve(state)
    return value, decision, solver.stats


def exhaustive(params: Params, state: ModelState) -> tuple[float, int]:
    """Minimum over *every* insert/skip sequence (no memo, no pruning): (remaining time, leaves)."""
    leaves = 0

    def rec(s: ModelState) -> float:
        nonlocal leaves
        if advance(params, s):
            leaves += 1
            return s.t
        best = INF
        for insert in (False, True):
            c = s.copy()
            apply(params, c, insert)
            best = min(best, rec(c))
        return best

    s = state.copy()
    return rec(s) - state.t, leaves


def play(params: Params, state: ModelState, decisions) -> float:
    """End time (relative) of a fixed decision rule ``decisions(state) -> bool`` from ``state``."""
    s = state.copy()
    while not advance(params, s):
        apply(params, s, bool(decisions(s)))
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

    def decide(self, ctx: BubbleContext) -> bool:
        params = Params.from_costs(ctx.costs, ctx.micro_batches, ctx.unit_size, ctx.gen_workers,
                                   ctx.update_size)
        if not self.reuse or self._solver is None or self._solver.params != params:
            self._solver = Solver(params, node_cap=self.node_cap)
        before = self._solver.stats.seconds
        value, decision = self._solver.solve(ctx.snapshot())
        self.solve_seconds.append(self._solver.stats.seconds - before)
        self.last_stats = self._solver.stats
        ctx.predicted_end = ctx.now + value
        return bool(decision)
