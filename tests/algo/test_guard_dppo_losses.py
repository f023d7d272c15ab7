"""GRPO-Guard's and Flow-DPPO's losses (algo/grpo_guard.py, algo/flow_dppo.py) against verl-omni's own
``GRPOGuardLoss.compute_loss`` / ``FlowDPPOLoss.compute_loss``, in float64: per-row loss and gradient to 1e-10.

verl-omni's ``diffusion_algos.py`` is imported unmodified from the snapshot (``load_diffusion_algos`` in
tests/verl_omni_helpers.py).
verl-omni's loss is a mean over a micro-batch of one timestep, so one row at a time gives its per-row loss.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from verl_digen.algo.flow_dppo import flow_dppo_loss, flow_dppo_rows
from verl_digen.algo.grpo_guard import grpo_guard_loss, grpo_guard_rows
from verl_digen.algo.loss import LossConfig

D = torch.float64


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    """verl-omni's diffusion_algos module, loaded from the snapshot."""
    from verl_omni_helpers import SKIP_REASON, load_diffusion_algos, tarballs_present

    if not tarballs_present():
        pytest.skip(SKIP_REASON)
    return load_diffusion_algos(tmp_path_factory.mktemp("omni_algos"))


def _config(**loss):
    return SimpleNamespace(diffusion_loss=SimpleNamespace(adv_clip_max=5.0, **loss))


def _rows(seed: int, n: int = 12, shared_step: bool = False):
    """Rows of one SDE step each: log-probs, advantages, new / old transition means, std_t and dt."""
    g = torch.Generator().manual_seed(seed)
    old_log_prob = -1.0 + 0.1 * torch.randn(n, generator=g, dtype=D)
    log_prob = old_log_prob + 0.3 * torch.randn(n, generator=g, dtype=D)
    advantages = 4.0 * torch.tanh(torch.randn(n, generator=g, dtype=D))  # within adv_clip_max: its clamp is idle
    old_mean = torch.randn(n, 4, 2, 2, generator=g, dtype=D)
    mean = old_mean + 0.05 * torch.rand(n, 1, 1, 1, generator=g, dtype=D) * torch.randn(n, 4, 2, 2, generator=g,
                                                                                         dtype=D)
    std_t = 0.3 + torch.rand(n, generator=g, dtype=D)
    dt = 0.02 + 0.1 * torch.rand(n, generator=g, dtype=D)
    if shared_step:
        std_t, dt = std_t[:1].expand(n).clone(), dt[:1].expand(n).clone()
    return log_prob, old_log_prob, advantages, mean, old_mean, std_t, dt


def _grads(loss, *inputs):
    return [g if g is not None else torch.zeros_like(x)
            for g, x in zip(torch.autograd.grad(loss, inputs, allow_unused=True), inputs)]


def _check_rows(theirs, ours, lp, mean):
    """theirs(i) -> (loss, lp_i, mean_i) of row i alone; ours: per-row losses over all rows (lp, mean leaves)."""
    ours_grad = _grads(ours.sum(), lp, mean)
    for i in range(lp.shape[0]):
        loss_i, lp_i, mean_i = theirs(i)
        torch.testing.assert_close(ours[i], loss_i, rtol=0, atol=1e-10)
        g_lp, g_mean = _grads(loss_i, lp_i, mean_i)
        torch.testing.assert_close(ours_grad[0][i], g_lp[0], rtol=0, atol=1e-10)
        torch.testing.assert_close(ours_grad[1][i], g_mean[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_guard_rows_equal_verl_omni(omni, seed):
    log_prob, old_lp, adv, mean, old_mean, std_t, dt = _rows(seed)
    clip = 0.05
    lp, mu = log_prob.clone().requires_grad_(), mean.clone().requires_grad_()
    std = std_t * dt.sqrt()  # the transition's std: verl-omni's std_dev_t * sqrt_dt
    ours, _, clipped = grpo_guard_rows(lp, old_lp, adv, mu, old_mean, std[:, None, None, None], dt, clip)
    assert 0 < int(clipped.sum()) < len(clipped), "the rows must exercise both sides of the clip"

    def theirs(i):
        lp_i, mu_i = log_prob[i:i + 1].clone().requires_grad_(), mean[i:i + 1].clone().requires_grad_()
        loss, _ = omni.GRPOGuardLoss.compute_loss(
            old_log_prob=old_lp[i:i + 1], log_prob=lp_i, advantages=adv[i:i + 1], config=_config(clip_ratio=clip),
            old_prev_sample_mean=old_mean[i:i + 1], prev_sample_mean=mu_i,
            std_dev_t=std_t[i].reshape(1, 1, 1, 1), sqrt_dt=dt[i:i + 1].sqrt())
        return loss, lp_i, mu_i

    _check_rows(theirs, ours, lp, mu)


def test_grpo_guard_batch_of_one_step_equals_verl_omni_mean(omni):
    """A micro-batch at one timestep (verl-omni's unit): its mean loss is verl-digen's scaled row sum."""
    log_prob, old_lp, adv, mean, old_mean, std_t, dt = _rows(2, shared_step=True)
    lp, mu = log_prob.clone().requires_grad_(), mean.clone().requires_grad_()
    cfg = LossConfig(clip_range=0.05, mode="grpo_guard")
    std = (std_t * dt.sqrt())[:, None, None, None]
    ours = grpo_guard_loss(lp, old_lp, adv, mu, old_mean, std, dt, cfg, scale=1.0 / len(lp)).loss
    lp2, mu2 = log_prob.clone().requires_grad_(), mean.clone().requires_grad_()
    theirs, _ = omni.GRPOGuardLoss.compute_loss(
        old_log_prob=old_lp, log_prob=lp2, advantages=adv, config=_config(clip_ratio=0.05),
        old_prev_sample_mean=old_mean, prev_sample_mean=mu2, std_dev_t=std_t.reshape(-1, 1, 1, 1), sqrt_dt=dt.sqrt())
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)
    for a, b in zip(_grads(ours, lp, mu), _grads(theirs, lp2, mu2)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("add_kl_coefficient", [True, False])
def test_flow_dppo_rows_equal_verl_omni(omni, add_kl_coefficient):
    log_prob, old_lp, adv, mean, old_mean, std_t, dt = _rows(3, n=16)
    std = std_t * dt.sqrt()
    gap = (mean - old_mean).pow(2).reshape(len(mean), -1).mean(1)
    kl = gap / (2 * std**2) if add_kl_coefficient else gap / 2
    away = ((log_prob > old_lp) & (adv > 0)) | ((log_prob < old_lp) & (adv < 0))
    # about half the rows past the threshold, one moving away exactly at it (the mask is kl >= threshold)
    threshold = float(kl[away & (kl >= kl.median())].min())
    lp, mu = log_prob.clone().requires_grad_(), mean.clone().requires_grad_()
    ours, _, dropped, our_kl = flow_dppo_rows(lp, old_lp, adv, mu, old_mean, std[:, None, None, None], threshold,
                                              add_kl_coefficient)
    torch.testing.assert_close(our_kl, kl, rtol=0, atol=1e-12)
    high = kl >= threshold
    assert dropped.any() and (high & ~away).any() and (~high & away).any(), "every branch of the mask must run"

    def theirs(i):
        lp_i, mu_i = log_prob[i:i + 1].clone().requires_grad_(), mean[i:i + 1].clone().requires_grad_()
        loss, _ = omni.FlowDPPOLoss.compute_loss(
            old_log_prob=old_lp[i:i + 1], log_prob=lp_i, advantages=adv[i:i + 1],
            config=_config(kl_mask_threshold=threshold, add_kl_coefficient=add_kl_coefficient),
            old_prev_sample_mean=old_mean[i:i + 1], prev_sample_mean=mu_i,
            std_dev_t=std_t[i].reshape(1, 1, 1, 1), sqrt_dt=dt[i:i + 1].sqrt())
        return loss, lp_i, mu_i

    _check_rows(theirs, ours, lp, mu)
    cfg = LossConfig(mode="flow_dppo", kl_mask_threshold=threshold, add_kl_coefficient=add_kl_coefficient)
    total = flow_dppo_loss(lp, old_lp, adv, mu, old_mean, std[:, None, None, None], cfg, scale=0.25)
    torch.testing.assert_close(total.loss, ours.sum() * 0.25, rtol=0, atol=1e-12)
    assert torch.equal(total.clipped, dropped)


def test_noiseless_rows_contribute_nothing():
    """A row of std 0 (the last CPS step) has no density: no loss, no gradient, in both losses."""
    log_prob, old_lp, adv, mean, old_mean, _, dt = _rows(4, n=3)
    std = torch.tensor([0.1, 0.0, 0.2], dtype=D)
    lp = log_prob.clone().requires_grad_()
    guard, _, _ = grpo_guard_rows(lp, old_lp, adv, mean, old_mean, std, dt, 0.2)
    dppo, _, _, _ = flow_dppo_rows(lp, old_lp, adv, mean, old_mean, std, 0.0)
    for rows in (guard, dppo):
        assert rows[1] == 0 and rows[0] != 0
        assert _grads(rows.sum(), lp)[0][1] == 0
