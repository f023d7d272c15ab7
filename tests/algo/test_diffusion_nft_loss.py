"""DiffusionNFT's loss maths (algo/diffusion_nft.py) against verl-omni's own ``DiffusionNFTLoss`` in float64:
per-row loss and gradient to 1e-10, and the advantage -> optimality-probability map of every adv_mode."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from verl_digen.algo.diffusion_nft import ADV_MODES, nft_rows, reward_prob

D = torch.float64


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    from verl_omni_helpers import SKIP_REASON, load_diffusion_algos, tarballs_present

    if not tarballs_present():
        pytest.skip(SKIP_REASON)
    return load_diffusion_algos(tmp_path_factory.mktemp("omni_algos"))


def _rows(seed: int, n: int = 8):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(n, 4, 2, 2, generator=g, dtype=D)
    eps = torch.randn(n, 4, 2, 2, generator=g, dtype=D)
    t = (0.05 + 0.9 * torch.rand(n, generator=g, dtype=D)).reshape(n, 1, 1, 1)
    xt = (1 - t) * x0 + t * eps
    old_v = eps - x0 + 0.3 * torch.randn(n, 4, 2, 2, generator=g, dtype=D)
    v = old_v + 0.1 * torch.randn(n, 4, 2, 2, generator=g, dtype=D)
    ref_v = old_v + 0.1 * torch.randn(n, 4, 2, 2, generator=g, dtype=D)
    adv = 3.0 * torch.randn(n, generator=g, dtype=D)  # some past adv_clip_max: the map clamps them
    return v, old_v, ref_v, x0, xt, t, adv


@pytest.mark.parametrize("mode", ADV_MODES)
def test_reward_prob_equals_verl_omni(omni, mode):
    adv = torch.tensor([-7.0, -5.0, -1.5, 0.0, 0.2, 2.5, 5.0, 9.0], dtype=D)
    theirs = omni.DiffusionNFTLoss._advantage_to_reward_prob(adv, adv_clip_max=5.0, adv_mode=mode)
    torch.testing.assert_close(reward_prob(adv, 5.0, mode), theirs, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed, beta, kl, w_min", [(0, 0.5, 0.0, 1e-5), (1, 0.3, 0.1, 1e-5), (2, 1.0, 0.05, 0.15)])
def test_nft_rows_equal_verl_omni(omni, seed, beta, kl, w_min):
    """Per row (verl-omni's loss on that row alone) and over the batch (its mean = the scaled row sum)."""
    v, old_v, ref_v, x0, xt, t, adv = _rows(seed)
    prob = reward_prob(adv, 5.0)
    cfg = SimpleNamespace(diffusion_loss=SimpleNamespace(mix_beta=beta, adv_clip_max=5.0, ref_kl_coef=kl,
                                                         adaptive_weight_min=w_min))
    ours_v = v.clone().requires_grad_()
    ours = nft_rows(ours_v, old_v, ref_v, x0, xt, t, prob, beta, 5.0, w_min, kl)
    (ours_grad,) = torch.autograd.grad(ours.sum(), ours_v)

    def theirs(rows):
        v_i = v[rows].clone().requires_grad_()
        loss, _ = omni.DiffusionNFTLoss.compute_loss(
            forward_prediction=v_i, old_prediction=old_v[rows], ref_forward_prediction=ref_v[rows], x0=x0[rows],
            xt=xt[rows], t_expanded=t[rows], reward_prob=prob[rows], config=cfg)
        return loss, torch.autograd.grad(loss, v_i)[0]

    for i in range(len(v)):
        loss_i, grad_i = theirs(slice(i, i + 1))
        torch.testing.assert_close(ours[i], loss_i, rtol=0, atol=1e-10)
        torch.testing.assert_close(ours_grad[i:i + 1], grad_i, rtol=0, atol=1e-10)
    loss, grad = theirs(slice(None))
    torch.testing.assert_close(ours.sum() / len(v), loss, rtol=0, atol=1e-10)
    torch.testing.assert_close(ours_grad / len(v), grad, rtol=0, atol=1e-10)
    if w_min == 0.15:  # the floor binds on some rows and not others: both branches of the weight run
        w = (xt - t * (beta * v + (1 - beta) * old_v) - x0).abs().flatten(1).mean(1)
        assert (w < w_min).any() and (w > w_min).any()
