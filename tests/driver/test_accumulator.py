"""The driver's step accumulator: typed completions in, one result per step out (no Ray)."""

from __future__ import annotations

import math

import pytest
import torch

from verl_digen.algo.advantages import AdvantageConfig, group_advantages
from verl_digen.algo.tsp import TrainMetrics
from verl_digen.driver.accumulator import StepAccumulator
from verl_digen.driver.completions import Generated, Receipt, Scored, Stepped, Updated
from verl_digen.schedule.actions import GENERATE, OPTIMIZER_STEP, PUBLISH, SCORE, UPDATE, WEIGHT_SYNC, Action
from verl_digen.schedule.executor import Completion

N = 2  # samples per prompt


def _scored(step: int, rows: list[tuple[int, int, float]], nbytes: int = 10, retries: int = 0) -> Completion:
    return Completion(Action(SCORE, ("gen0",), step, step), 1.0,
                      Scored(driver_bytes=nbytes, retries=retries, prompt_ids=tuple(p for p, _, _ in rows),
                             sample_ids=tuple(s for _, s, _ in rows), rewards=tuple(r for _, _, r in rows)))


def _stepped(step: int, **kw) -> Completion:
    return Completion(Action(OPTIMIZER_STEP, ("trainer",), step, step), 2.0, Stepped(**kw))


def test_advantages_are_the_groups_of_the_update_normalized_together():
    acc = StepAccumulator(N, AdvantageConfig(std_scope="batch", eps=0.0, clip=None))
    acc.add(_scored(0, [(7, 0, 1.0), (7, 1, 3.0)]))
    acc.add(_scored(0, [(9, 0, 0.0), (9, 1, 8.0)]))
    adv = acc.advantages(0, [7, 9])
    ref, _ = group_advantages(torch.tensor([1.0, 3.0, 0.0, 8.0], dtype=torch.float64), torch.tensor([7, 7, 9, 9]),
                              AdvantageConfig(std_scope="batch", eps=0.0, clip=None))
    assert [adv[k] for k in [(7, 0), (7, 1), (9, 0), (9, 1)]] == ref.tolist()
    # batch scope spans the step's whole scored batch: an update (mini-batch) of one group gets the same numbers
    # as verl-omni's one normalization before its mini-batch loop, not its own group's std
    assert acc.advantages(0, [7]) == {(7, 0): adv[(7, 0)], (7, 1): adv[(7, 1)]}
    alone, _ = group_advantages(torch.tensor([1.0, 3.0], dtype=torch.float64), torch.tensor([7, 7]),
                                AdvantageConfig(std_scope="batch", eps=0.0, clip=None))
    assert alone.tolist() != [adv[(7, 0)], adv[(7, 1)]]
    # the next step's rewards are not in this step's batch
    acc.add(_scored(1, [(3, 0, 100.0), (3, 1, -50.0)]))
    assert acc.advantages(0, [9]) == {(9, 0): adv[(9, 0)], (9, 1): adv[(9, 1)]}
    # group scope: each group by itself
    grp = StepAccumulator(N, AdvantageConfig(std_scope="group", eps=0.0, clip=None))
    grp.add(_scored(0, [(7, 0, 1.0), (7, 1, 3.0)]))
    grp.add(_scored(0, [(9, 0, 0.0), (9, 1, 8.0)]))
    assert grp.advantages(0, [7]) == {k: v for k, v in grp.advantages(0, [7, 9]).items() if k[0] == 7}


def test_an_incomplete_group_or_a_non_finite_reward_is_never_normalized_away():
    acc = StepAccumulator(N, AdvantageConfig())
    acc.add(_scored(0, [(1, 0, 1.0)]))
    with pytest.raises(RuntimeError, match="group incomplete"):
        acc.advantages(0, [1])
    acc.add(_scored(0, [(1, 1, float("nan"))]))
    assert all(math.isnan(a) for a in acc.advantages(0, [1]).values())


def test_a_step_is_reported_once_with_everything_its_completions_said():
    acc = StepAccumulator(N, AdvantageConfig())
    gen = Completion(Action(GENERATE, ("gen0",), 0, 0, mb=0, samples=((0, 0), (0, 1))), 0.5,
                     Generated(rows=2, retries=1, restarts=1))
    assert acc.add(gen) is None
    acc.add(_scored(0, [(0, 0, 1.0), (0, 1, 2.0)], nbytes=100, retries=2))
    acc.add(_scored(1, [(5, 0, 9.0)], nbytes=7))  # the next step's early work stays with it
    part = TrainMetrics(rows=2, loss=0.5, ratio_sum=2.0, ratio_max=1.0, ratio_min=1.0)
    acc.add(Completion(Action(UPDATE, ("trainer",), 0, 0, mb=0), 1.5, Updated(driver_bytes=30, metrics=part)))
    acc.add(Completion(Action(UPDATE, ("trainer",), 0, 0, mb=1), 1.6, Updated(driver_bytes=30, metrics=part)))
    # weights published after step 0 are version 1: their bytes belong to step 1
    acc.add(Completion(Action(PUBLISH, ("trainer",), 0, 1), 2.5, Receipt(driver_bytes=1000)))
    acc.add(Completion(Action(WEIGHT_SYNC, ("gen0",), 0, 1), 2.6, Receipt(driver_bytes=50)))
    done = acc.add(_stepped(0, driver_bytes=3, grad_norm=0.25))
    assert done is not None
    assert done.rewards == [1.0, 2.0]
    assert done.train.rows == 4 and done.train.loss == 1.0
    m = done.metrics()
    assert m["reward/mean"] == 1.5 and m["reward/std"] == pytest.approx(math.sqrt(0.5))
    assert m["perf/driver_bytes"] == 100 + 30 + 30 + 3
    assert m["fault/retries"] == 3 and m["fault/restarts"] == 1
    assert m["actor/grad_norm"] == 0.25 and m["actor/loss"] == 1.0 and m["actor/ratio_mean"] == 1.0
    assert "actor/rows" not in m
    # the step is forgotten: its rewards are gone, and the next step has what was its own
    with pytest.raises(RuntimeError, match="group incomplete"):
        acc.advantages(0, [0])
    nxt = acc.add(_stepped(1, skipped=True, nonfinite="loss"))
    assert nxt.rewards == [9.0] and nxt.driver_bytes == 7 + 1000 + 50 and nxt.optimizer.skipped
    assert "actor/grad_norm" not in nxt.metrics()


def test_what_the_driver_holds_stays_flat_over_many_steps():
    acc = StepAccumulator(N, AdvantageConfig())
    for step in range(200):
        acc.add(_scored(step, [(step, 0, 1.0), (step, 1, 0.0)]))
        acc.add(_scored(step + 1, [(step + 1, 0, 1.0)]))  # the next step's first score arrives early
        acc.advantages(step, [step])
        acc.add(_stepped(step))
        # the new version is published and picked up after the step was reported
        acc.add(Completion(Action(PUBLISH, ("trainer",), step, step + 1), 3.0, Receipt(driver_bytes=5)))
        acc.add(Completion(Action(WEIGHT_SYNC, ("gen0",), step, step + 1), 3.1, Receipt(driver_bytes=5, retries=1)))
    assert len(acc._rewards) <= 2 and len(acc._steps) <= 2


def test_simulator_completions_carry_nothing_to_fold():
    acc = StepAccumulator(N, AdvantageConfig())
    assert acc.add(Completion(Action(OPTIMIZER_STEP, ("trainer",), 0, 0), 1.0)) is None


def test_a_step_of_several_mini_batches_is_reported_at_its_last_optimizer_step():
    """actor.ppo_mini_batch_size: a mini-batch's optimizer step (mb = its index) does not end the step; the
    report has the mean gradient norm (verl's mean over mini-batches) and is skipped if any step was."""
    acc = StepAccumulator(N, AdvantageConfig())
    acc.add(_scored(0, [(0, 0, 1.0), (0, 1, 2.0)]))
    mid = Completion(Action(OPTIMIZER_STEP, ("trainer",), 0, 0, mini_batch=0), 1.0, Stepped(grad_norm=1.0))
    assert acc.add(mid) is None
    assert acc.add(Completion(Action(OPTIMIZER_STEP, ("trainer",), 0, 0, mini_batch=1), 1.5,
                              Stepped(grad_norm=2.0, skipped=True, nonfinite="loss"))) is None
    done = acc.add(_stepped(0, grad_norm=6.0))
    assert done is not None and done.optimizer_steps == 3
    assert done.optimizer.grad_norm == pytest.approx(3.0) and done.metrics()["actor/grad_norm"] == pytest.approx(3.0)
    assert done.optimizer.skipped and done.optimizer.nonfinite == "loss"


def test_a_steps_metrics_are_bit_identical_whatever_order_its_scores_completed_in():
    """A resumed run's scores complete in another order than an unstopped run's: the reward sums must not
    depend on it (the sum is taken in (prompt, sample) order)."""
    # magnitudes far apart: a float64 sum of these rounds differently in another order
    rewards = [0.1, 1e8, 0.2, -1e8, 0.3, 0.7, 1e-3, 3.3, 0.05, 0.9]
    rows = [(p, s, rewards[p * N + s]) for p in range(5) for s in range(N)]
    parts = [rows[i:i + N] for i in range(0, len(rows), N)]

    def metrics(order: list[int]) -> dict[str, float]:
        acc = StepAccumulator(N, AdvantageConfig())
        for i in order:
            acc.add(_scored(0, parts[i]))
        return acc.add(_stepped(0, grad_norm=1.0)).metrics()

    forward = metrics([0, 1, 2, 3, 4])
    for order in ([4, 3, 2, 1, 0], [2, 0, 4, 1, 3], [1, 3, 0, 4, 2]):
        other = metrics(order)
        assert {k: v.hex() for k, v in other.items()} == {k: v.hex() for k, v in forward.items()}
