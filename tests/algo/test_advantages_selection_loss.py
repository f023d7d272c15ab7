"""Advantage, step-selection and loss math on hand-computed cases."""

import math

import pytest
import torch

from verl_digen.algo.advantages import AdvantageConfig, group_advantages, multi_reward_advantages
from verl_digen.algo.loss import LossConfig, policy_loss
from verl_digen.algo.selection import StepSelection

D = torch.float64


def test_group_advantages_hand_computed():
    rewards = torch.tensor([1.0, 3.0, 0.0, 0.0, 2.0, 6.0], dtype=D)
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    adv, keep = group_advantages(rewards, groups, AdvantageConfig(eps=0.0, clip=None))
    # group 0: mean 2, std 1 -> -1, +1; group 1 all equal -> 0 / (0 + 0) guarded below; group 2: mean 4, std 2
    assert keep.all()
    torch.testing.assert_close(adv[[0, 1, 4, 5]], torch.tensor([-1.0, 1.0, -1.0, 1.0], dtype=D))


def test_all_equal_group_gets_zero_advantage_and_can_be_dropped():
    rewards = torch.tensor([5.0, 5.0, 5.0, 1.0, 2.0, 3.0], dtype=D)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv, keep = group_advantages(rewards, groups, AdvantageConfig(eps=1e-4))
    assert torch.equal(adv[:3], torch.zeros(3, dtype=D))
    assert keep.all()
    adv, keep = group_advantages(rewards, groups, AdvantageConfig(drop_zero_groups=True))
    assert keep.tolist() == [False] * 3 + [True] * 3


def test_batch_std_and_clip():
    rewards = torch.tensor([0.0, 2.0, 10.0, 14.0], dtype=D)
    groups = torch.tensor([0, 0, 1, 1])
    adv, _ = group_advantages(rewards, groups, AdvantageConfig(std_scope="batch", eps=0.0, clip=None))
    std = rewards.std(unbiased=False)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, -2.0, 2.0], dtype=D) / std)
    adv, _ = group_advantages(rewards, groups, AdvantageConfig(eps=0.0, clip=0.5))
    assert torch.equal(adv, torch.tensor([-0.5, 0.5, -0.5, 0.5], dtype=D))


def test_keep_extremes_keeps_top_and_bottom_of_each_group():
    rewards = torch.tensor([0.1, 0.9, 0.5, 0.4, 0.7, 0.2], dtype=D)
    groups = torch.zeros(6, dtype=torch.long)
    adv, keep = group_advantages(rewards, groups, AdvantageConfig(keep_extremes=4))
    # sorted: 0.1, 0.2, 0.4, 0.5, 0.7, 0.9 -> drop 0.4 and 0.5
    assert keep.tolist() == [True, True, False, False, True, True]
    assert adv[2] == 0 and adv[3] == 0


def test_multi_reward_modes():
    groups = torch.tensor([0, 0, 1, 1])
    a = torch.tensor([0.0, 1.0, 2.0, 4.0], dtype=D)
    b = torch.tensor([10.0, 0.0, 0.0, 0.0], dtype=D)
    cfg = AdvantageConfig(eps=0.0, clip=None)
    summed, _ = multi_reward_advantages({"a": a, "b": b}, {"a": 1.0, "b": 0.5}, groups, "sum_then_normalize", cfg)
    # group 0 total: 5, 1 -> -1, 1 ; group 1 total: 2, 4 -> -1, 1
    torch.testing.assert_close(summed, torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=D))
    # a: [-1, 1, -1, 1]; b: [1, -1, 0, 0] (its group 1 is constant, so eps keeps it at 0)
    per, _ = multi_reward_advantages({"a": a, "b": b}, {"a": 1.0, "b": 0.5}, groups, "normalize_then_sum",
                                     AdvantageConfig(eps=1e-6, clip=None))
    torch.testing.assert_close(per, torch.tensor([-0.5, 0.5, -1.0, 1.0], dtype=D), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="not computed"):
        multi_reward_advantages({"a": a}, {"c": 1.0}, groups)
    with pytest.raises(ValueError, match="multi-reward mode"):
        multi_reward_advantages({"a": a}, {"a": 1.0}, groups, mode="max")


def test_advantage_errors():
    with pytest.raises(ValueError, match="size >= 2"):
        group_advantages(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="std scope"):
        group_advantages(torch.tensor([1.0, 2.0]), torch.tensor([0, 0]), AdvantageConfig(std_scope="global"))
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.ones(2, 2), torch.tensor([0, 0]))


def test_selection_first_k_fraction_random_and_window():
    assert StepSelection("first_k", k=3).select(10, 0, 0, [0, 1], [0, 0]).tolist() == [[0, 1, 2]] * 2
    assert StepSelection("first_k", timestep_fraction=0.6).num_trained(10) == 6
    sel = StepSelection("random_k", k=4)
    a = sel.select(10, seed=7, step=3, prompt_ids=[0, 0, 1], sample_ids=[0, 1, 0])
    assert a.shape == (3, 4)
    assert all(row == sorted(set(row)) for row in a.tolist())
    # placement invariance: a sample's steps do not depend on its batch
    alone = sel.select(10, seed=7, step=3, prompt_ids=[1], sample_ids=[0])
    assert torch.equal(alone[0], a[2])
    assert not torch.equal(a[0], a[1]) or not torch.equal(a[0], a[2])
    win = StepSelection("window", k=3, window_start=2).select(10, 0, 0, [0], [0])
    assert win.tolist() == [[2, 3, 4]]
    start, end = StepSelection("window", k=3).window(10, seed=1, step=5)
    assert 0 <= start and end == start + 3 <= 10


@pytest.mark.parametrize(
    "sel, match",
    [
        (StepSelection("first_k", k=11), "k=11 must lie in"),
        (StepSelection("first_k", k=0), "k=0 must lie in"),
        (StepSelection("best_k", k=2), "unknown step selection"),
        (StepSelection("first_k"), "exactly one of"),
        (StepSelection("first_k", timestep_fraction=1.5), "timestep_fraction"),
        (StepSelection("window", k=4, window_start=8), "window_start"),
    ],
)
def test_selection_errors(sel, match):
    with pytest.raises(ValueError, match=match):
        sel.num_trained(10)


def test_policy_loss_clipping_and_scale():
    cfg = LossConfig(clip_range=0.2)
    old = torch.zeros(4, dtype=D)
    new = torch.log(torch.tensor([1.0, 1.5, 0.5, 1.1], dtype=D))
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=D)
    terms = policy_loss(new, old, adv, cfg, scale=0.25)
    # per row: max(-A r, -A clip(r)): [-1, -1.2, 0.8, 1.1]
    torch.testing.assert_close(terms.loss, torch.tensor((-1 - 1.2 + 0.8 + 1.1) / 4, dtype=D))
    assert terms.clipped.tolist() == [0.0, 1.0, 1.0, 0.0]
    assert abs(float(terms.approx_kl[0])) < 1e-15
    kl = torch.ones(4, dtype=D)
    with_kl = policy_loss(new, old, adv, LossConfig(clip_range=0.2, kl_coef=0.5), scale=0.25, kl=kl)
    torch.testing.assert_close(with_kl.loss - terms.loss, torch.tensor(0.5, dtype=D))
    with pytest.raises(ValueError, match="clip_range"):
        LossConfig(clip_range=0.0)
    with pytest.raises(ValueError, match="one shape"):
        policy_loss(new, old[:2], adv, cfg, 1.0)
    assert math.isclose(float(terms.ratio[1]), 1.5)


def test_unbiased_std_estimator_matches_verl_omnis_formula():
    """verl-omni normalizes by ``torch.std`` (n - 1) plus 1e-4; ``std_estimator=unbiased`` is the same, to the
    last bit, for the group and the batch scope; the population estimator (n) gives larger advantages."""
    rewards = torch.tensor([0.1, 0.7, 0.3, 0.9, 0.2, 0.8, 0.5, 0.4], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    want = torch.empty_like(rewards)
    for g in (0, 1):
        r = rewards[groups == g]
        want[groups == g] = (r - r.mean()) / (torch.std(r) + 1e-4)  # verl-omni's per-group formula
    cfg = AdvantageConfig(std_estimator="unbiased", eps=1e-4, clip=None)
    adv, _ = group_advantages(rewards, groups, cfg)
    assert torch.equal(adv, want)
    batch, _ = group_advantages(rewards, groups, AdvantageConfig(std_scope="batch", std_estimator="unbiased",
                                                                 eps=1e-4, clip=None))
    r0 = rewards[groups == 0]
    assert torch.equal(batch[groups == 0], (r0 - r0.mean()) / (torch.std(rewards) + 1e-4))
    population, _ = group_advantages(rewards, groups, AdvantageConfig(eps=1e-4, clip=None))
    ratio = population[0] / adv[0]  # sqrt(n / (n - 1)) at n = 4, up to eps
    assert float(ratio) == pytest.approx((4 / 3) ** 0.5, rel=1e-3)
    with pytest.raises(ValueError, match="std estimator"):
        group_advantages(rewards, groups, AdvantageConfig(std_estimator="sample"))
