"""How an update's rows (sample x trained step) are split over the trainer ranks and packed into passes.

The runtime and the cost model both ask here, so the simulator prices exactly the passes the trainer
runs. An update of ``S`` samples with ``K`` trained steps has ``S * K`` rows. They are ordered
step-chunk-major (for each chunk of ``degree`` steps: every sample, then that sample's steps in the
chunk), each rank takes a contiguous, near-equal share of that order (any number of ranks works with
any number of samples), and trains it in passes of at most ``cap`` rows. Every rank runs the same number
of passes, because FSDP's forwards and backwards are collective: a rank with fewer rows runs empty
passes (the trainer gives them one zero-weight row). The loss is a sum of per-row terms, so where a row
is trained does not change the accumulated gradient.

The default ``cap`` (``ceil(S * degree / ranks)``) makes one rank's passes exactly today's TSP passes:
``ceil(K / degree)`` passes of ``S * degree`` rows, in the same order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RowPlan:
    """The passes of one update: ``samples x steps`` rows over ``ranks`` ranks, ``cap`` rows per pass."""

    samples: int
    steps: int
    ranks: int
    degree: int
    cap: int

    def __post_init__(self) -> None:
        for name in ("samples", "steps", "ranks", "degree", "cap"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"RowPlan.{name} must be a positive integer, got {value!r}")
        if self.degree > self.steps:
            raise ValueError(f"RowPlan.degree ({self.degree}) cannot exceed the trained steps ({self.steps})")

    @property
    def rows(self) -> int:
        return self.samples * self.steps

    @property
    def most_rows(self) -> int:
        """Rows of the most-loaded rank (it sets the update's time)."""
        return math.ceil(self.rows / self.ranks)

    @property
    def passes(self) -> int:
        """Passes every rank runs (the most-loaded rank's count)."""
        return math.ceil(self.most_rows / self.cap)

    def pass_rows(self) -> list[int]:
        """Rows per pass on the most-loaded rank (what the cost model prices)."""
        full, rest = divmod(self.most_rows, self.cap)
        return [self.cap] * full + ([rest] if rest else [])

    def order(self) -> list[tuple[int, int]]:
        """Every row as (sample, step index), in the order the ranks' shares are cut from."""
        return [(s, j) for c in range(0, self.steps, self.degree) for s in range(self.samples)
                for j in range(c, min(c + self.degree, self.steps))]

    def share(self, rank: int) -> range:
        """Positions in :meth:`order` that ``rank`` trains (contiguous; shares differ by at most one row)."""
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank {rank} is outside the {self.ranks} trainer ranks")
        base, extra = divmod(self.rows, self.ranks)
        start = rank * base + min(rank, extra)
        return range(start, start + base + (rank < extra))

    def rank_passes(self, rank: int) -> list[range]:
        """``rank``'s passes as positions in :meth:`order`: :attr:`passes` ranges, the last ones possibly
        empty (the rank then runs a zero-weight pass to keep the collectives in step)."""
        mine = self.share(rank)
        out = [range(p, min(p + self.cap, mine.stop)) for p in range(mine.start, mine.stop, self.cap)]
        return out + [range(mine.stop, mine.stop)] * (self.passes - len(out))


def row_plan(samples: int, steps: int, ranks: int, degree: int | None = None, cap: int | None = None) -> RowPlan:
    """The plan for an update: ``degree`` trained steps per chunk (None = all ``steps``), ``cap`` rows per
    rank per pass (None = what ``degree`` gives: ``ceil(samples * degree / ranks)``)."""
    degree = steps if degree is None else min(degree, steps)
    if cap is None:
        cap = max(1, math.ceil(samples * degree / max(ranks, 1)))  # RowPlan refuses ranks < 1
    return RowPlan(samples, steps, ranks, degree, cap)


__all__ = ["RowPlan", "row_plan"]
