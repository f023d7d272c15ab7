"""Which denoising steps of a trajectory are trained (and so stored by the rollout).

Every strategy returns, for each sample, K sorted step indices in [0, T) with the same K for every
sample, so (sample, step) rows stack into one TSP batch. Step i is the transition sigma_i -> sigma_{i+1}.

- ``first_k``  (Flow-GRPO): the first ``k`` steps, or ``int(T * timestep_fraction)`` of them.
- ``random_k`` (DanceGRPO): ``k`` steps drawn without replacement per sample, seeded placement-invariantly.
- ``window``   (Flow-GRPO-Fast / MixGRPO): a contiguous SDE window of ``k`` steps; the sampler runs the
  ODE outside it, and only window steps are stored and trained. The window start is fixed
  (``window_start``) or drawn per global step from ``[0, T - k]``, or from ``[lo, hi - k]`` when a
  ``window_range`` (lo, hi) bounds the window (same for every sample of that step). With ``mix``
  (``algorithm.name=mix_grpo``) MixGRPO's schedule places it instead (``algo.mix_grpo``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl_digen.algo.mix_grpo import MixWindow
from verl_digen.algo.seeding import sample_generator, sample_seed
from verl_digen.defaults import SELECTION_KINDS
from verl_digen.schedule.costs import trained_steps

if TYPE_CHECKING:  # torch only where indices are drawn (select): K and the window are plain arithmetic
    import torch


@dataclass(frozen=True)
class StepSelection:
    """How to pick trained steps: kind, how many (``k`` or ``timestep_fraction``), window placement."""

    kind: str = "first_k"
    k: int | None = None
    timestep_fraction: float | None = None
    window_start: int | None = None
    window_range: tuple[int, int] | None = None  # (lo, hi): the window lies inside steps [lo, hi)
    mix: MixWindow | None = None  # MixGRPO's sliding schedule of the window (``window`` kind only)

    def num_trained(self, num_steps: int) -> int:
        """K, validated against the number of sampling steps T."""
        if self.kind not in SELECTION_KINDS:
            raise ValueError(f"unknown step selection {self.kind!r}; expected one of {', '.join(SELECTION_KINDS)}")
        if (self.k is None) == (self.timestep_fraction is None):
            raise ValueError("step selection needs exactly one of k or timestep_fraction")
        if self.k is not None:
            k = self.k
        else:
            if not 0.0 < self.timestep_fraction <= 1.0:
                raise ValueError(f"timestep_fraction must lie in (0, 1], got {self.timestep_fraction}")
            k = trained_steps(num_steps, self.timestep_fraction)
        if not 1 <= k <= num_steps:
            raise ValueError(f"number of trained steps k={k} must lie in [1, {num_steps}] (the sampling steps)")
        if self.kind == "window" and self.window_start is not None:
            if not 0 <= self.window_start <= num_steps - k:
                raise ValueError(f"window_start={self.window_start} must lie in [0, {num_steps - k}] for k={k}")
        if self.mix is not None:
            if self.kind != "window" or self.window_start is not None:
                raise ValueError("MixGRPO slides a window: it needs the window kind and no fixed window_start")
            self.mix.check()
        if self.kind == "window" and self.window_range is not None:
            lo, hi = self.window_range
            if not 0 <= lo <= hi - k or hi > num_steps:
                raise ValueError(f"window_range={list(self.window_range)} must satisfy 0 <= lo <= hi - k and "
                                 f"hi <= {num_steps} for k={k}")
        return k

    def window(self, num_steps: int, seed: int, step: int) -> tuple[int, int]:
        """[start, end) of the SDE window for a global step (``window`` kind only)."""
        k = self.num_trained(num_steps)
        if self.window_start is not None:
            return self.window_start, self.window_start + k
        lo, hi = self.window_range if self.window_range is not None else (0, num_steps)
        if self.mix is not None:
            start = self.mix.start(k, lo, hi, step)
            return start, start + k
        start = lo + sample_seed(seed, step, -1, -1, "window") % (hi - k - lo + 1)
        return start, start + k

    def select(
        self, num_steps: int, seed: int, step: int, prompt_ids: list[int], sample_ids: list[int]
    ) -> torch.Tensor:
        """(B, K) long tensor of sorted trained-step indices for the given samples."""
        import torch

        k = self.num_trained(num_steps)
        if self.kind == "first_k":
            row = torch.arange(k)
            return row.expand(len(prompt_ids), k).clone()
        if self.kind == "window":
            start, end = self.window(num_steps, seed, step)
            return torch.arange(start, end).expand(len(prompt_ids), k).clone()
        rows = []
        for p, s in zip(prompt_ids, sample_ids, strict=True):
            g = sample_generator(seed, step, p, s, "steps")
            rows.append(torch.randperm(num_steps, generator=g)[:k].sort().values)
        return torch.stack(rows) if rows else torch.empty(0, k, dtype=torch.long)
