"""Online profiler: turns observed action durations into current :class:`StageCosts` estimates.

The scheduler feeds every completed action's duration in (``observe``); BTS re-plans at each bubble
with ``estimate()``. Per action kind the estimate is the running mean of the observations after a
warm-up (the first ``warmup`` observations of a kind are cold-start outliers: compilation, cache
fills) and falls back to the prior until a post-warm-up observation exists. If only warm-up
observations exist, their mean beats a prior of zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .actions import KINDS
from .costs import StageCosts


@dataclass
class _Running:
    seen: int = 0
    n: int = 0
    total: float = 0.0
    warm_total: float = 0.0

    def add(self, value: float, warmup: int) -> None:
        self.seen += 1
        if self.seen <= warmup:
            self.warm_total += value
        else:
            self.n += 1
            self.total += value


@dataclass
class Profiler:
    """Running means with warm-up over a prior; ``version`` changes whenever an estimate changes."""

    prior: StageCosts
    warmup: int = 1
    _stats: dict[str, _Running] = field(default_factory=dict)
    version: int = 0

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")

    def observe(self, kind: str, duration: float) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown action kind {kind!r}")
        if duration < 0:
            raise ValueError(f"negative duration {duration} for {kind!r}")
        self._stats.setdefault(kind, _Running()).add(float(duration), self.warmup)
        self.version += 1

    def mean(self, kind: str) -> float | None:
        s = self._stats.get(kind)
        if s is None:
            return None
        if s.n:
            return s.total / s.n
        prior = self.prior.duration(kind)
        if prior == 0 and s.seen:
            return s.warm_total / s.seen
        return None

    def estimate(self) -> StageCosts:
        updates = {k: m for k in KINDS if (m := self.mean(k)) is not None}
        return replace(self.prior, **updates) if updates else self.prior

    def counts(self) -> dict[str, int]:
        return {k: s.seen for k, s in self._stats.items()}
