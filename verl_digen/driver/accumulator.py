"""Completions in, one result per global step out: the driver's bookkeeping, free of Ray.

The Ray backend hands each finished action's typed result (``driver/completions.py``) to the executor
loop; the runtime feeds every completion to a :class:`StepAccumulator`. It keeps the rewards of the
steps in flight, gives an update action the group advantages of its prompts when it is launched, and
when a step's optimizer step completes returns that step's :class:`StepResults` and forgets the step,
so what the driver holds stays flat however long the run.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from verl_digen.algo.advantages import AdvantageConfig, group_advantages
from verl_digen.algo.tsp import TrainMetrics
from verl_digen.driver.completions import Receipt, Scored, Stepped, Updated
from verl_digen.reporting import metric_names as names
from verl_digen.schedule.actions import PUBLISH, WEIGHT_SYNC
from verl_digen.schedule.executor import Completion


@dataclass
class StepResults:
    """What one step's completions told the driver (its step report adds times and the schedule's view)."""

    scores: dict[tuple[int, int], float] = field(default_factory=dict)  # (prompt id, sample) -> reward
    train: TrainMetrics = field(default_factory=TrainMetrics)
    optimizer: Stepped = field(default_factory=Stepped)  # the step's optimizer steps, folded (``_fold``)
    optimizer_steps: int = 0  # one per mini-batch
    driver_bytes: int = 0
    retries: int = 0
    restarts: int = 0

    @property
    def rewards(self) -> list[float]:
        """The step's rewards in (prompt id, sample) order, whatever order their scores completed in: a
        resumed run's sums then round as an unstopped run's do (bit-identical metrics)."""
        return [self.scores[k] for k in sorted(self.scores)]

    def metrics(self) -> dict[str, float]:
        """The step report's reward, actor, driver-traffic and fault metrics."""
        r = torch.tensor(self.rewards, dtype=torch.float64)
        out = {
            names.REWARD_MEAN: float(r.mean()),
            names.REWARD_STD: float(r.std()) if r.numel() > 1 else 0.0,
            **{names.actor(k): v for k, v in self.train.summary().items() if k != "rows"},
            names.DRIVER_BYTES: float(self.driver_bytes),
            names.RETRIES: float(self.retries),
            names.RESTARTS: float(self.restarts),
        }
        if self.optimizer.grad_norm is not None:  # the global norm before clipping
            out[names.GRAD_NORM] = float(self.optimizer.grad_norm)
        return out


def _fold(seen: Stepped, new: Stepped, n: int) -> Stepped:
    """``n`` optimizer steps of one global step (its mini-batches') and one more, as one: the mean gradient
    norm (verl's mean over mini-batches), skipped if any was, the first non-finite quantity."""
    if seen.grad_norm is None or new.grad_norm is None:
        norm = new.grad_norm if seen.grad_norm is None else seen.grad_norm
    else:
        norm = (seen.grad_norm * n + new.grad_norm) / (n + 1)
    return Stepped(grad_norm=norm, skipped=seen.skipped or new.skipped,
                   nonfinite=seen.nonfinite or new.nonfinite)


class StepAccumulator:
    """Folds the completions of one scheduler's steps (local step numbers, as its actions carry them)
    into :class:`StepResults`; ``group_size`` samples make a GRPO group."""

    def __init__(self, group_size: int, advantage: AdvantageConfig) -> None:
        self.group_size, self.advantage = group_size, advantage
        self._steps: dict[int, StepResults] = defaultdict(StepResults)
        self._rewards: dict[tuple[int, int, int], float] = {}  # (step, prompt id, sample) -> reward

    def add(self, c: Completion) -> StepResults | None:
        """Fold one completion; returns the step's results (and forgets the step) when ``c`` is its
        optimizer step, else None."""
        a, res = c.action, c.result
        if not isinstance(res, Receipt):  # the simulator's completions carry nothing
            return None
        # weights travel for the step that will use them (version v is step v's): a publish or pickup ends
        # after its own step's optimizer step, which has already been reported and forgotten
        st = self._steps[a.version if a.kind in (PUBLISH, WEIGHT_SYNC) else a.step]
        st.driver_bytes += res.driver_bytes
        st.retries += res.retries
        st.restarts += res.restarts
        if isinstance(res, Scored):
            for p, s, r in zip(res.prompt_ids, res.sample_ids, res.rewards, strict=True):
                self._rewards[(a.step, p, s)] = r
                st.scores[(p, s)] = r
        elif isinstance(res, Updated):
            st.train.merge(res.metrics)
        elif isinstance(res, Stepped):
            st.optimizer = res if not st.optimizer_steps else _fold(st.optimizer, res, st.optimizer_steps)
            st.optimizer_steps += 1
        if not a.ends_step:
            return None
        for key in [k for k in self._rewards if k[0] == a.step]:
            del self._rewards[key]
        return self._steps.pop(a.step)

    def advantages(self, step: int, prompt_ids: list[int]) -> dict[tuple[int, int], float]:
        """Group advantages of every sample of ``prompt_ids`` (complete groups) in step ``step``. With
        ``algorithm.adv_std=batch`` the std spans the step's whole scored batch, whichever of its groups this
        update (one mini-batch) trains, as verl-omni normalizes once before its mini-batch loop (validate
        allows that scope only where the whole batch is scored before any update)."""
        keys = [(step, g, s) for g in prompt_ids for s in range(self.group_size)]
        missing = [k for k in keys if k not in self._rewards]
        if missing:
            raise RuntimeError(f"group incomplete when its update started (missing samples {missing[:4]})")
        scope = keys if self.advantage.std_scope != "batch" else sorted(k for k in self._rewards if k[0] == step)
        r = torch.tensor([self._rewards[k] for k in scope], dtype=torch.float64)
        if not bool(torch.isfinite(r).all()):
            # NaN advantages on purpose: the trainer's NaN guard reads them as a non-finite reward and
            # skips the optimizer step (group normalization could otherwise turn them into zeros)
            return {(k[1], k[2]): float("nan") for k in keys}
        gid = torch.tensor([k[1] for k in scope])
        adv, _ = group_advantages(r, gid, self.advantage)
        by_key = dict(zip(scope, adv.tolist(), strict=True))
        return {(k[1], k[2]): by_key[k] for k in keys}
