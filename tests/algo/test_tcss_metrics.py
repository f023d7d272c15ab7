"""The PPO ratio and clip fraction split by TCSS staleness (``actor/ratio_mean_stale`` ...): each mean
runs over its own rows only, and a row is stale when an older policy version sampled it."""

import copy

import pytest
import torch

from verl_digen.algo.loss import LossConfig, LossTerms
from verl_digen.algo.selection import StepSelection
from verl_digen.algo.tsp import TrainMetrics, recompute_log_probs, tsp_backward
from verl_digen.models import build_tiny_model
from verl_digen.rollout.sampler import SamplerConfig, sample_trajectories

D = torch.float64


def _terms(ratio: list[float], clipped: list[float]) -> LossTerms:
    n = len(ratio)
    return LossTerms(loss=torch.tensor(0.0, dtype=D), ratio=torch.tensor(ratio, dtype=D),
                     clipped=torch.tensor(clipped, dtype=D), approx_kl=torch.zeros(n, dtype=D), kl=None)


def test_split_means_run_over_their_own_rows_only():
    m = TrainMetrics()
    # stale rows: ratios 1.5 and 0.5 (one clipped); fresh rows: 1.0, 1.2, 0.9 (none clipped)
    m.add(_terms([1.5, 1.0, 0.5, 1.2], [1.0, 0.0, 0.0, 0.0]), torch.tensor([True, False, True, False]))
    m.add(_terms([0.9], [0.0]), torch.tensor([False]))
    s = m.summary()
    assert s["ratio_mean_stale"] == pytest.approx(1.0) and s["clip_frac_stale"] == pytest.approx(0.5)
    assert s["ratio_mean_fresh"] == pytest.approx((1.0 + 1.2 + 0.9) / 3) and s["clip_frac_fresh"] == 0.0
    assert s["ratio_mean"] == pytest.approx(5.1 / 5) and s["clip_frac"] == pytest.approx(0.2)  # unchanged
    # merged over micro-batches / ranks (the driver folds the workers' sums): still per-row means
    other = TrainMetrics()
    other.add(_terms([3.0], [1.0]), torch.tensor([True]))
    merged = TrainMetrics(**{**vars(m)}).merge(other).summary()
    assert merged["ratio_mean_stale"] == pytest.approx(5.0 / 3) and merged["clip_frac_stale"] == pytest.approx(2 / 3)
    assert merged["ratio_mean_fresh"] == pytest.approx(s["ratio_mean_fresh"])


def test_split_keys_only_for_the_kinds_of_rows_present():
    fresh = TrainMetrics()
    fresh.add(_terms([1.0, 1.0], [0.0, 0.0]), torch.tensor([False, False]))
    assert "ratio_mean_fresh" in fresh.summary() and "ratio_mean_stale" not in fresh.summary()
    unknown = TrainMetrics()  # no version known (single-process loop): neither kind is claimed
    unknown.add(_terms([1.0], [0.0]))
    assert not {k for k in unknown.summary() if k.endswith(("_stale", "_fresh"))}
    with pytest.raises(ValueError, match="stale mask"):
        TrainMetrics().add(_terms([1.0, 2.0], [0.0, 0.0]), torch.tensor([True]))


def test_tsp_backward_marks_rows_of_older_versions_stale():
    """Samples 0 and 2 were sampled by version 3, sample 1 by the trained version 4: the stale means are
    those of the (sample, step) ratios of samples 0 and 2, for TSP passes of any degree."""
    torch.manual_seed(0)
    model = build_tiny_model("flux", dtype=D, latent_size=8)
    cfg = SamplerConfig(num_steps=4, sde="flow_grpo", eta=0.7, selection=StepSelection("first_k", k=3), decode=False)
    prompts = ["a cat", "a cat", "a dog"]
    traj = sample_trajectories(model, model.encode_prompts(prompts), prompts, [0, 0, 1], [0, 1, 0], cfg,
                               seed=1, step=0, version=4)
    traj.versions = torch.tensor([3, 4, 3])
    traj.advantages = torch.tensor([1.0, -0.5, 2.0], dtype=D)
    trained = copy.deepcopy(model)
    with torch.no_grad():  # a different policy, so every row's ratio differs from 1 (and from the others)
        g = torch.Generator().manual_seed(2)
        for p in trained.transformer.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    train = cfg.train_config(LossConfig(clip_range=0.01))
    ratio = torch.exp(recompute_log_probs(trained, traj, train) - traj.log_probs)  # (3 samples, 3 steps)
    stale_rows, fresh_rows = ratio[[0, 2]], ratio[[1]]
    assert float((stale_rows - stale_rows.mean()).abs().max()) > 1e-6  # the rows are told apart
    for degree in (1, 2, None):
        s = tsp_backward(trained, traj, train, 1.0, degree=degree, version=4).summary()
        assert s["ratio_mean_stale"] == pytest.approx(float(stale_rows.mean()), rel=1e-10)
        assert s["ratio_mean_fresh"] == pytest.approx(float(fresh_rows.mean()), rel=1e-10)
        # stale samples have advantages > 0: a row is clipped when its ratio exceeds 1 + clip range
        assert s["clip_frac_stale"] == pytest.approx(float((stale_rows > 1.01).to(D).mean()))
    # no sample is older than the trained version 3: all fresh
    s = tsp_backward(trained, traj, train, 1.0, version=3).summary()
    assert "ratio_mean_stale" not in s and s["ratio_mean_fresh"] == pytest.approx(float(ratio.mean()), rel=1e-10)
