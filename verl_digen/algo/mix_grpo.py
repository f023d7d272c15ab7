"""MixGRPO's sliding SDE window: where a global step's window of stochastic steps lies.

MixGRPO (arXiv:2507.21802) samples a trajectory of T steps (step i: sigma_i -> sigma_{i+1}) with the SDE
only inside a contiguous window [l, l + w) and the deterministic ODE (Euler, noise level 0) elsewhere. Only
window steps have a log-prob, are stored and are trained (FlowGRPO's clipped loss and group advantages, as
they are); outside the window a step is the same transformer forward as inside, but no row is trained. A
scheduler moves l across training iterations so every part of the trajectory is trained in turn.

Options (verl-omni's names; verl-digen's key in brackets):

- ``sde_window_size`` w (``rollout.train_steps``), ``sde_window_range`` [lo, hi] (``rollout.window_range``;
  null: [0, T]): the window lies in steps [lo, hi), so l in [lo, hi - w].
- ``sample_strategy`` (``rollout.sample_strategy``), at verl-digen's global step s (0-based; verl-omni's
  ``global_steps`` is s + 1, counted from 1):

  * ``random``: l = ``random.Random(sde_window_seed + s + 1).randint(lo, hi - w)`` (Python's Mersenne
    Twister, both ends included): one fresh start per global step, the same on every rank and sample.
  * ``progressive``: l = min(lo + floor((s + 1) / iters_per_group) * w, hi - w): the window advances by
    its own size every ``iters_per_group`` global steps and then stays at the end of the range.

- ``iters_per_group`` (``rollout.iters_per_group``, progressive only), ``sde_window_seed``
  (``rollout.sde_window_seed``, random only; independent of ``trainer.seed`` as in verl-omni).

Where verl-omni differs from the paper's code, verl-omni's is kept, so a converted verl-omni script trains
the same windows on the same steps (docs/architecture.md, "MixGRPO"):

- the paper's progressive schedule starts at l = lo on the first iteration and holds each position for
  ``iters_per_group`` iterations; verl-omni counts global steps from 1, so its first position lasts
  ``iters_per_group - 1`` steps (none at ``iters_per_group=1``: the first window is [lo + w, lo + 2w));
- the paper can stride by less than w (``prog_overlap_step``) and, past the end, shrinks the window or rolls
  back to the start; verl-omni strides by w and keeps the window whole at the end (l = hi - w);
- the paper draws a random start with NumPy's generator over [0, T - w]; verl-omni with Python's ``random``
  seeded by ``sde_window_seed + global_steps`` over its range.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

STRATEGIES = ("random", "progressive")


@dataclass(frozen=True)
class MixWindow:
    """MixGRPO's window schedule (verl-omni's ``sample_strategy``, ``iters_per_group``, ``sde_window_seed``)."""

    sample_strategy: str = "random"
    iters_per_group: int = 1
    sde_window_seed: int = 0

    def check(self) -> None:
        if self.sample_strategy not in STRATEGIES:
            raise ValueError(f"sample_strategy={self.sample_strategy!r}; expected one of {', '.join(STRATEGIES)}")
        if isinstance(self.iters_per_group, bool) or not isinstance(self.iters_per_group, int) \
                or self.iters_per_group < 1:
            raise ValueError(f"iters_per_group={self.iters_per_group!r}; expected an integer >= 1")

    def start(self, size: int, lo: int, hi: int, step: int) -> int:
        """l, the first SDE step of global step ``step`` (0-based) for a window of ``size`` in steps [lo, hi)."""
        self.check()
        if not 0 <= lo <= hi - size:
            raise ValueError(f"a window of {size} steps does not fit in steps [{lo}, {hi})")
        global_steps = step + 1  # verl-omni's trainer counts from 1
        if self.sample_strategy == "random":
            return random.Random(self.sde_window_seed + global_steps).randint(lo, hi - size)
        return min(lo + (global_steps // self.iters_per_group) * size, hi - size)
