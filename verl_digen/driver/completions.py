"""The Ray backend's typed results: what each finished action hands back to the driver.

A :class:`~verl_digen.schedule.executor.Completion` carries one of these as ``result``. They hold only
what the driver needs (ids, rewards, metric sums, the optimizer step's verdict) and what fetching it
cost; trajectories stay in Ray's object store, routed by the backend. Every result counts the bytes the
driver fetched for it and the generator retries / restarts it took (``driver/faults.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from verl_digen.algo.tsp import TrainMetrics


@dataclass(frozen=True)
class Receipt:
    """What every action reports: bytes fetched by the driver, retries and actor restarts it took, and the
    bytes the action moved by kind (``schedule/ledger.py``; the timeline records keep them). Weight
    publishes, pickups and context switches report only this."""

    driver_bytes: int = 0
    retries: int = 0
    restarts: int = 0
    moved: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Generated(Receipt):
    """A generated micro-batch (the trajectories stay in the object store)."""

    rows: int = 0


@dataclass(frozen=True)
class Scored(Receipt):
    """A scored micro-batch: per row, its prompt id, sample index and reward."""

    prompt_ids: tuple[int, ...] = ()
    sample_ids: tuple[int, ...] = ()
    rewards: tuple[float, ...] = ()


@dataclass(frozen=True)
class Updated(Receipt):
    """A training pass (forward + backward, gradients accumulated): the ranks' metric sums merged."""

    metrics: TrainMetrics = field(default_factory=TrainMetrics)


@dataclass(frozen=True)
class Stepped(Receipt):
    """An optimizer step. ``skipped``: the NaN guard dropped it (``nonfinite`` names the first bad
    quantity: the weights are unchanged); ``grad_norm``: the global norm before clipping."""

    grad_norm: float | None = None
    skipped: bool = False
    nonfinite: str | None = None
