"""SDE transitions: log-prob against an independently written density, sample moments, edge cases."""

import math

import pytest
import torch

from verl_digen.algo.sde import kl_to_reference, sde_step, transition
from verl_digen.algo.sigmas import flow_sigmas

D = torch.float64


def _reference_flow_grpo(x, v, s, s_next, eta, sigma_max):
    """Flow-GRPO's transition written out per element, from the paper's formulas (as in algo/sde.py's docstring)."""
    s = s.view(-1, 1, 1, 1)
    s_next = s_next.view(-1, 1, 1, 1)
    dt = s_next - s
    den = torch.where(s == 1, torch.full_like(s, sigma_max), s)
    std_t = eta * torch.sqrt(s / (1 - den))
    mean = x * (1 + std_t**2 / (2 * s) * dt) + v * (1 + std_t**2 * (1 - s) / (2 * s)) * dt
    return mean, std_t * torch.sqrt(-dt)


def _normal_log_prob_mean(sample, mean, std):
    dist = torch.distributions.Normal(mean, std.expand_as(mean))
    return dist.log_prob(sample).flatten(1).mean(1)


@pytest.mark.parametrize("kind", ["flow_grpo", "dance_grpo", "cps"])
def test_log_prob_matches_independent_gaussian(kind):
    g = torch.Generator().manual_seed(0)
    b = 6
    x = torch.randn(b, 4, 5, 5, generator=g, dtype=D)
    v = torch.randn(b, 4, 5, 5, generator=g, dtype=D)
    sig = flow_sigmas(10, shift=3.0)
    idx = torch.tensor([0, 1, 3, 5, 7, 8])  # rows at different timesteps, including sigma == 1
    s, s_next = sig[idx], sig[idx + 1]
    prev = torch.randn(b, 4, 5, 5, generator=g, dtype=D)
    eta = 0.7
    out = sde_step(kind, x, v, s, s_next, eta, prev=prev, sigma_max=float(sig[1]))
    if kind == "flow_grpo":
        mean, std = _reference_flow_grpo(x, v, s, s_next, eta, float(sig[1]))
    elif kind == "dance_grpo":
        sv, snv = s.view(-1, 1, 1, 1), s_next.view(-1, 1, 1, 1)
        x0 = x - sv * v
        score = -(x - x0 * (1 - sv)) / sv**2
        mean = x + (v - 0.5 * eta**2 * score) * (snv - sv)
        std = eta * torch.sqrt(sv - snv)
    else:
        sv, snv = s.view(-1, 1, 1, 1), s_next.view(-1, 1, 1, 1)
        std = snv * math.sin(eta * math.pi / 2)
        mean = (x - sv * v) * (1 - snv) + (x + (1 - sv) * v) * torch.sqrt(snv**2 - std**2)
    torch.testing.assert_close(out.mean, mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.log_prob, _normal_log_prob_mean(prev, mean, std), rtol=1e-12, atol=1e-12)


def _scalar_reference(kind, x, v, s, s_next, eta):
    """Mean and std of one transition for scalar inputs, straight from the papers' formulas."""
    dt = s_next - s
    if kind == "cps":
        std = s_next * math.sin(eta * math.pi / 2)
        return (x - s * v) * (1 - s_next) + (x + (1 - s) * v) * math.sqrt(s_next**2 - std**2), std
    std_t = eta * math.sqrt(s / (1 - s)) if kind == "flow_grpo" else eta
    return x + (v + std_t**2 / (2 * s) * (x + (1 - s) * v)) * dt, std_t * math.sqrt(-dt)


@pytest.mark.parametrize("kind", ["flow_grpo", "dance_grpo", "cps"])
def test_sample_moments_match_stated_mean_and_std(kind):
    """All n elements of a row share x and v, so they are i.i.d. draws of one stated Gaussian."""
    g = torch.Generator().manual_seed(1)
    n = 200_000
    xs, vs, ss, sns = [0.3, -1.2], [0.8, 0.5], [0.8, 0.5], [0.7, 0.4]
    x = torch.tensor(xs, dtype=D).view(2, 1, 1, 1).expand(2, n, 1, 1)
    v = torch.tensor(vs, dtype=D).view(2, 1, 1, 1).expand(2, n, 1, 1)
    noise = torch.randn(2, n, 1, 1, generator=g, dtype=D)
    out = sde_step(kind, x, v, torch.tensor(ss, dtype=D), torch.tensor(sns, dtype=D), 0.5, noise=noise)
    for row in range(2):
        mean, std = _scalar_reference(kind, xs[row], vs[row], ss[row], sns[row], 0.5)
        draws = out.prev[row].flatten()
        assert abs(float(draws.mean()) - mean) < 5 * std / math.sqrt(n)
        assert abs(float(draws.std()) / std - 1) < 0.01


def test_dance_grpo_equals_flow_grpo_form_with_constant_std():
    g = torch.Generator().manual_seed(2)
    x, v = torch.randn(2, 3, 4, 4, generator=g, dtype=D), torch.randn(2, 3, 4, 4, generator=g, dtype=D)
    s, s_next = torch.tensor([0.9, 0.4], dtype=D), torch.tensor([0.8, 0.3], dtype=D)
    mean, std = transition("dance_grpo", x, v, s, s_next, 0.3)
    sv, dt = s.view(-1, 1, 1, 1), (s_next - s).view(-1, 1, 1, 1)
    torch.testing.assert_close(mean, x + (v + 0.09 / (2 * sv) * (x + (1 - sv) * v)) * dt)
    torch.testing.assert_close(std, 0.3 * torch.sqrt(-dt))


def test_zero_noise_level_is_the_ode_step_with_zero_log_prob():
    x, v = torch.ones(2, 1, 2, 2, dtype=D), torch.full((2, 1, 2, 2), 2.0, dtype=D)
    s, s_next = torch.tensor([0.5, 0.5], dtype=D), torch.tensor([0.25, 0.25], dtype=D)
    for kind in ("flow_grpo", "dance_grpo", "cps", "ode"):
        out = sde_step(kind, x, v, s, s_next, 0.0, noise=torch.randn(2, 1, 2, 2, dtype=D))
        torch.testing.assert_close(out.prev, x + v * (-0.25))
        assert torch.equal(out.log_prob, torch.zeros(2, dtype=D))


def test_flow_grpo_at_sigma_one_needs_sigma_max():
    x = torch.zeros(1, 1, 2, 2, dtype=D)
    with pytest.raises(ValueError, match="sigma_max"):
        transition("flow_grpo", x, x, torch.ones(1, dtype=D), torch.tensor([0.9], dtype=D), 0.7)
    mean, std = transition("flow_grpo", x, x, torch.ones(1, dtype=D), torch.tensor([0.9], dtype=D), 0.7, 0.9)
    assert torch.isfinite(std).all() and torch.isfinite(mean).all()


def test_kl_is_zero_for_identical_means_and_scales_with_the_variance():
    mean = torch.randn(3, 2, 2, 2, dtype=D)
    std = torch.full((3, 1, 1, 1), 0.5, dtype=D)
    assert torch.equal(kl_to_reference(mean, mean, std), torch.zeros(3, dtype=D))
    kl = kl_to_reference(mean, mean + 1.0, std)
    torch.testing.assert_close(kl, torch.full((3,), 1.0 / (2 * 0.25), dtype=D))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x: sde_step("euler_maruyama", x, x, torch.ones(1), torch.zeros(1), 0.5, noise=x), "unknown SDE kind"),
        (lambda x: sde_step("flow_grpo", x, x, torch.ones(1), torch.zeros(1), -0.1, noise=x), "eta must be"),
        (lambda x: sde_step("flow_grpo", x, x[:, :1], torch.ones(1), torch.zeros(1), 0.5, noise=x), "one shape"),
        (lambda x: sde_step("flow_grpo", x, x, torch.ones(2), torch.zeros(2), 0.5, noise=x), "per-row sigmas"),
        (lambda x: sde_step("flow_grpo", x, x, torch.ones(1), torch.zeros(1), 0.5), "exactly one of"),
        (lambda x: sde_step("cps", x, x, torch.ones(1), torch.zeros(1), 1.5, noise=x), "cps noise level"),
        (lambda x: sde_step("cps", x, x, torch.ones(1), torch.zeros(1), 0.5, noise=x, log_prob="l2"),
         "unknown log-prob form"),
        (lambda x: sde_step("flow_grpo", x, x, torch.ones(1), torch.zeros(1), 0.5, noise=x,
                            log_prob="squared_error"), "CPS convention"),
        # ascending sigmas: the flow_grpo std would be sqrt(negative) = NaN and the log-prob a silent 0
        (lambda x: sde_step("flow_grpo", x, x, torch.full((1,), 0.3), torch.full((1,), 0.5), 0.5, noise=x),
         "descending sigmas"),
        (lambda x: sde_step("dance_grpo", x, x, torch.full((1,), 0.3), torch.full((1,), 0.5), 0.5, noise=x),
         "descending sigmas"),
    ],
)
def test_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.zeros(1, 2, 2, 2))


def test_sigma_schedule():
    s = flow_sigmas(4)
    torch.testing.assert_close(s, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0], dtype=D))
    shifted = flow_sigmas(4, shift=3.0)
    assert shifted[0] == 1 and shifted[-1] == 0 and (shifted[1:-1] > s[1:-1]).all()
    with pytest.raises(ValueError, match="num_steps"):
        flow_sigmas(0)


def test_cps_squared_error_log_prob_is_the_upstream_form_and_rescales_the_log_ratio():
    """flow_grpo / verl-omni's CPS log-prob: -(x - mean)^2 averaged. Its log-ratio between two policies
    times 1 / (2 std^2) is the Gaussian log-ratio (the normalizer cancels)."""
    g = torch.Generator().manual_seed(3)
    sig = flow_sigmas(10, shift=3.0)
    idx = torch.tensor([0, 2, 5, 8])
    s, s_next = sig[idx], sig[idx + 1]
    x, v, v2, prev = (torch.randn(4, 2, 3, 3, generator=g, dtype=D) for _ in range(4))
    eta = 0.7
    sq = sde_step("cps", x, v, s, s_next, eta, prev=prev, log_prob="squared_error")
    mean, std = transition("cps", x, v, s, s_next, eta)
    torch.testing.assert_close(sq.log_prob, (-((prev - mean) ** 2)).flatten(1).mean(1))
    sq2 = sde_step("cps", x, v2, s, s_next, eta, prev=prev, log_prob="squared_error")
    ga = sde_step("cps", x, v, s, s_next, eta, prev=prev)
    ga2 = sde_step("cps", x, v2, s, s_next, eta, prev=prev)
    scale = 1 / (2 * std.reshape(-1) ** 2)
    torch.testing.assert_close(ga2.log_prob - ga.log_prob, (sq2.log_prob - sq.log_prob) * scale)
    assert not torch.allclose(ga.log_prob, sq.log_prob)


def test_kl_of_a_deterministic_row_is_zero_with_no_gradient():
    """The last CPS step (sigma_next = 0) has std 0: no density, no PPO term, so no KL pull either."""
    mean = torch.randn(2, 2, 2, 2, dtype=D, requires_grad=True)
    ref = torch.randn(2, 2, 2, 2, dtype=D)
    std = torch.tensor([0.5, 0.0], dtype=D).reshape(2, 1, 1, 1)
    kl = kl_to_reference(mean, ref, std)
    torch.testing.assert_close(kl[0], ((mean[0] - ref[0]) ** 2 / (2 * 0.25)).mean())
    assert kl[1].item() == 0.0
    kl.sum().backward()
    assert torch.equal(mean.grad[1], torch.zeros_like(mean.grad[1]))
    assert mean.grad[0].abs().sum() > 0
