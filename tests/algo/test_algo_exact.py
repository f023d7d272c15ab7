"""The RL math against hand-computed values and independent re-derivations (not the code's own helpers)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from verl_digen.algo.advantages import AdvantageConfig, group_advantages, multi_reward_advantages
from verl_digen.algo.loss import LossConfig, LossTerms, policy_loss
from verl_digen.algo.selection import StepSelection
from verl_digen.algo.tsp import TrainMetrics, tsp_backward
from verl_digen.models import build_tiny_model
from verl_digen.rollout.sampler import SamplerConfig, sample_trajectories

torch.set_num_threads(1)
D = torch.float64


def test_advantage_is_centered_reward_over_std_plus_eps():
    r = torch.tensor([0.0, 2.0], dtype=D)
    adv, keep = group_advantages(r, torch.tensor([0, 0]), AdvantageConfig(eps=1.0, clip=None))
    torch.testing.assert_close(adv, torch.tensor([-0.5, 0.5], dtype=D))  # std 1, (r - 1) / (1 + 1)
    assert keep.all()
    # batch scope: the batch std (of [0, 2, 4, 4]: sqrt(2.75)) over two groups' own means
    r = torch.tensor([0.0, 2.0, 4.0, 4.0], dtype=D)
    adv, _ = group_advantages(r, torch.tensor([0, 0, 1, 1]), AdvantageConfig(std_scope="batch", eps=0.0, clip=None))
    s = math.sqrt(2.75)
    torch.testing.assert_close(adv, torch.tensor([-1 / s, 1 / s, 0.0, 0.0], dtype=D))
    adv, _ = group_advantages(torch.tensor([0.0, 100.0], dtype=D), torch.tensor([0, 0]), AdvantageConfig(clip=0.7))
    torch.testing.assert_close(adv, torch.tensor([-0.7, 0.7], dtype=D))


@pytest.mark.parametrize("scope", ["group", "batch"])
def test_constant_group_with_eps_zero_has_zero_advantage_not_nan(scope):
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 3.0], dtype=D)
    ids = torch.tensor([0, 0, 0, 1, 1])
    adv, _ = group_advantages(r, ids, AdvantageConfig(eps=0.0, std_scope=scope, clip=None))
    assert torch.isfinite(adv).all()
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    adv, _ = group_advantages(torch.full((3,), 2.0, dtype=D), torch.zeros(3, dtype=torch.long),
                              AdvantageConfig(eps=0.0, std_scope=scope))
    assert adv.tolist() == [0.0, 0.0, 0.0]
    # a non-finite reward is not hidden as a zero advantage: the trainer's non-finite guard must see it
    adv, _ = group_advantages(torch.tensor([1.0, float("nan"), 0.0, 2.0], dtype=D), torch.tensor([0, 0, 1, 1]),
                              AdvantageConfig(eps=0.0, std_scope=scope, clip=None))
    assert torch.isnan(adv[:2]).all()


def test_multi_reward_modes_use_the_weights():
    ids = torch.tensor([0, 0, 0, 0])
    a = torch.tensor([1.0, 0.0, 3.0, 2.0], dtype=D)
    b = torch.tensor([0.0, 4.0, 1.0, 1.0], dtype=D)
    cfg = AdvantageConfig(clip=None)
    adv, _ = multi_reward_advantages({"a": a, "b": b}, {"a": 1.0, "b": 0.5}, ids, "sum_then_normalize", cfg)
    torch.testing.assert_close(adv, group_advantages(a + 0.5 * b, ids, cfg)[0])
    assert not torch.allclose(adv, group_advantages(a + b, ids, cfg)[0])
    adv, _ = multi_reward_advantages({"a": a, "b": b}, {"a": 1.0, "b": 0.5}, ids, "normalize_then_sum", cfg)
    torch.testing.assert_close(adv, group_advantages(a, ids, cfg)[0] + 0.5 * group_advantages(b, ids, cfg)[0])


def test_policy_loss_row_by_row():
    log_ratio = torch.tensor([-0.5, 0.2, 1.0, 0.0], dtype=D)
    old = torch.tensor([0.3, -1.0, 2.0, 0.5], dtype=D)
    adv = torch.tensor([1.0, -1.0, 2.0, 3.0], dtype=D)
    t = policy_loss(old + log_ratio, old, adv, LossConfig(clip_range=0.1), scale=0.25)
    rows = []
    for lr, a in zip(log_ratio.tolist(), adv.tolist()):
        ratio = math.exp(lr)
        rows.append(max(-a * ratio, -a * min(max(ratio, 0.9), 1.1)))
    assert float(t.loss) == pytest.approx(0.25 * sum(rows), rel=1e-12)
    torch.testing.assert_close(t.ratio, torch.exp(log_ratio))
    # a row counts as clipped when the clipped term wins the max: only e^1 > 1.1 with A > 0 here (e^-0.5
    # with A > 0 and e^0.2 with A < 0 keep their unclipped, more pessimistic term; r = 1 never clips)
    assert t.clipped.tolist() == [0.0, 0.0, 1.0, 0.0]
    want_kl = [math.exp(-lr) - 1 + lr for lr in log_ratio.tolist()]  # k3 estimator, every row
    torch.testing.assert_close(t.approx_kl, torch.tensor(want_kl, dtype=D))
    kl = torch.tensor([0.5, 0.0, 1.0, 2.0], dtype=D)
    tk = policy_loss(old + log_ratio, old, adv, LossConfig(clip_range=0.1, kl_coef=0.2), scale=0.25, kl=kl)
    assert float(tk.loss) == pytest.approx(0.25 * (sum(rows) + 0.2 * 3.5), rel=1e-12)


def test_train_metrics_are_means_over_rows():
    def terms(clipped, kl):
        n = len(clipped)
        return LossTerms(loss=torch.tensor(1.0), ratio=torch.ones(n), clipped=torch.tensor(clipped),
                         approx_kl=torch.tensor(kl), kl=None)

    m = TrainMetrics()
    m.add(terms([1.0, 0.0, 1.0, 0.0], [0.1, 0.3, 0.0, 0.0]))
    s = m.summary()
    assert s["clip_frac"] == 0.5 and s["approx_kl"] == pytest.approx(0.1) and s["rows"] == 4.0
    other = TrainMetrics()
    other.add(terms([1.0, 1.0], [0.2, 0.2]))
    s = m.merge(other).summary()
    assert s["clip_frac"] == pytest.approx(4 / 6) and s["loss"] == 2.0


def test_sde_window_covers_every_start_and_k_equal_t():
    assert StepSelection("window", k=6).window(6, seed=0, step=3) == (0, 6)
    starts = {StepSelection("window", k=2).window(5, seed=1, step=s)[0] for s in range(300)}
    assert starts == {0, 1, 2, 3}
    ranged = {StepSelection("window", k=2, window_range=(1, 5)).window(10, seed=1, step=s)[0] for s in range(300)}
    assert ranged == {1, 2, 3}


def test_random_k_draws_per_sample():
    sel = StepSelection("random_k", k=3).select(10, 7, 0, [4] * 8, list(range(8)))
    assert sel.shape == (8, 3)
    assert len({tuple(r.tolist()) for r in sel}) > 1  # eight samples of one prompt train different steps
    again = StepSelection("random_k", k=3).select(10, 7, 0, [4], [5])
    assert torch.equal(again[0], sel[5])


def _dance_reference(x, v, s, s_next, eta):
    """DanceGRPO's SDE step written out here (not through verl_digen.algo.sde)."""
    dt = s_next - s
    mean = x + (v + eta**2 / (2 * s) * (x + (1 - s) * v)) * dt
    return mean, eta * math.sqrt(-dt)


@pytest.fixture(scope="module")
def rollout():
    model = build_tiny_model("flux", dtype=D, latent_size=8)
    cfg = SamplerConfig(num_steps=4, sde="dance_grpo", eta=0.8, selection=StepSelection("first_k", k=3),
                        decode=False)
    prompts = ["a cat", "a cat", "a dog"]
    traj = sample_trajectories(model, model.encode_prompts(prompts), prompts, [0, 0, 1], [0, 1, 0], cfg,
                               seed=4, step=2, version=0)
    return model, cfg, traj


def test_rollout_log_probs_are_gaussian_densities_of_the_stored_steps(rollout):
    model, cfg, traj = rollout
    for j in range(3):
        x, nxt = traj.states[:, j], traj.next_states[:, j]
        for i in range(len(traj)):
            s, s_next = float(traj.sigmas[i, j]), float(traj.sigmas_next[i, j])
            one = slice(i, i + 1)
            v = model.velocity(x[one], traj.sigmas[one, j], traj.cond.index(one), cfg.guidance_scale)
            mean, std = _dance_reference(x[i:i + 1], v, s, s_next, cfg.eta)
            lp = (-(nxt[i:i + 1] - mean) ** 2 / (2 * std**2) - math.log(std) - 0.5 * math.log(2 * math.pi)).mean()
            assert float(traj.log_probs[i, j]) == pytest.approx(float(lp), rel=1e-9, abs=1e-12)


def test_step_noise_is_not_the_initial_noise(rollout):
    model, cfg, traj = rollout
    x_t, x1 = traj.states[:, 0], traj.next_states[:, 0]
    v = model.velocity(x_t, traj.sigmas[:, 0], traj.cond, cfg.guidance_scale)
    s, s_next = float(traj.sigmas[0, 0]), float(traj.sigmas_next[0, 0])
    mean, std = _dance_reference(x_t, v, s, s_next, cfg.eta)
    noise = ((x1 - mean) / std).flatten()
    corr = torch.corrcoef(torch.stack([noise, x_t.flatten()]).detach())[0, 1]
    assert abs(float(corr)) < 0.2  # independent streams; the same stream would give exactly 1


def test_tsp_loss_equals_an_independent_per_row_loss(rollout):
    model, cfg, traj = rollout
    model = copy.deepcopy(model)  # perturbed below; the fixture's model stays the sampling policy
    traj.advantages = torch.tensor([1.0, -0.5, 2.0], dtype=D)
    with torch.no_grad():  # move off the sampling policy so ratios differ from 1 and clipping bites
        g = torch.Generator().manual_seed(2)
        for p in model.transformer.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    clip, scale = 0.05, 1.0 / 9
    want = 0.0
    for i in range(len(traj)):
        for j in range(3):
            x, nxt = traj.states[i:i + 1, j], traj.next_states[i:i + 1, j]
            v = model.velocity(x, traj.sigmas[i:i + 1, j], traj.cond.index(slice(i, i + 1)), cfg.guidance_scale)
            mean, std = _dance_reference(x, v, float(traj.sigmas[i, j]), float(traj.sigmas_next[i, j]), cfg.eta)
            lp = float((-(nxt - mean) ** 2 / (2 * std**2) - math.log(std) - 0.5 * math.log(2 * math.pi)).mean())
            ratio, a = math.exp(lp - float(traj.log_probs[i, j])), float(traj.advantages[i])
            want += max(-a * ratio, -a * min(max(ratio, 1 - clip), 1 + clip))
    model.transformer.zero_grad()
    got = tsp_backward(model, traj, cfg.train_config(LossConfig(clip_range=clip)), scale, degree=2)
    assert got.summary()["loss"] == pytest.approx(scale * want, rel=1e-9)
    assert got.summary()["rows"] == 9.0


def test_train_metrics_accumulate_every_add():
    def terms(ratio, clipped, approx, kl):
        return LossTerms(loss=torch.tensor(0.5), ratio=torch.tensor(ratio), clipped=torch.tensor(clipped),
                         approx_kl=torch.tensor(approx), kl=torch.tensor(kl))

    m = TrainMetrics()
    m.add(terms([1.0, 3.0], [1.0, 0.0], [0.1, 0.1], [0.2, 0.4]))
    m.add(terms([2.0], [1.0], [0.4], [0.6]))
    s = m.summary()
    assert s["rows"] == 3.0 and s["loss"] == 1.0
    assert s["ratio_mean"] == pytest.approx(2.0) and s["ratio_max"] == 3.0 and s["ratio_min"] == 1.0
    assert s["clip_frac"] == pytest.approx(2 / 3) and s["approx_kl"] == pytest.approx(0.2)
    assert s["kl"] == pytest.approx(0.4)
    one = TrainMetrics()
    one.add(terms([4.0], [0.0], [0.0], [0.0]))
    assert one.summary()["ratio_mean"] == 4.0  # one row: divided by 1
    merged = TrainMetrics().merge(m).merge(one).summary()
    assert (merged["ratio_max"], merged["ratio_min"], merged["rows"]) == (4.0, 1.0, 4.0)


def test_kl_enters_the_loss_only_with_a_coefficient():
    lp = torch.tensor([0.1, -0.2], dtype=D)
    old = torch.zeros(2, dtype=D)
    adv = torch.tensor([1.0, -1.0], dtype=D)
    plain = policy_loss(lp, old, adv, LossConfig(clip_range=0.5), scale=1.0)
    with_coef_no_kl = policy_loss(lp, old, adv, LossConfig(clip_range=0.5, kl_coef=0.3), scale=1.0)
    assert float(with_coef_no_kl.loss) == float(plain.loss)
    kl = torch.tensor([1.0, 3.0], dtype=D)
    assert float(policy_loss(lp, old, adv, LossConfig(clip_range=0.5), 1.0, kl=kl).loss) == float(plain.loss)
    assert float(policy_loss(lp, old, adv, LossConfig(clip_range=0.5, kl_coef=0.3), 1.0, kl=kl).loss) == \
        pytest.approx(float(plain.loss) + 1.2)


def test_advantages_are_float64_whatever_the_reward_dtype():
    r = torch.tensor([0.1, 0.2, 0.4, 0.4], dtype=torch.float32)
    adv, _ = group_advantages(r, torch.tensor([0, 0, 1, 1]))
    assert adv.dtype == D
    # computed in float64 from the float32 inputs' values
    assert float(adv[0]) == pytest.approx((float(r[0]) - (float(r[0]) + float(r[1])) / 2)
                                          / (abs(float(r[1]) - float(r[0])) / 2 + 1e-4), rel=1e-12)
    total, _ = multi_reward_advantages({"a": r}, {"a": 2.0}, torch.tensor([0, 0, 1, 1]))
    assert total.dtype == D


def test_advantage_input_checks():
    ok = torch.tensor([0, 0])
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 1), ok)
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2), torch.tensor([0, 0, 0]))
    with pytest.raises(ValueError, match="clip"):
        group_advantages(torch.zeros(2), ok, AdvantageConfig(clip=0.0))
    with pytest.raises(ValueError, match="eps"):
        group_advantages(torch.zeros(2), ok, AdvantageConfig(eps=-1.0))
    for bad in (3, 1):
        with pytest.raises(ValueError, match="keep_extremes"):
            group_advantages(torch.zeros(4), torch.zeros(4, dtype=torch.long), AdvantageConfig(keep_extremes=bad))
    # keep_extremes = 2 is allowed; a group of exactly keep_extremes keeps everyone
    _, keep = group_advantages(torch.tensor([0.0, 1.0]), ok, AdvantageConfig(keep_extremes=2))
    assert keep.all()
    _, keep = group_advantages(torch.tensor([0.0, 1.0, 5.0, 2.0]), torch.zeros(4, dtype=torch.long),
                               AdvantageConfig(keep_extremes=2))
    assert keep.tolist() == [True, False, True, False]


def test_window_range_and_start_bounds():
    assert StepSelection("window", k=2, window_start=0).num_trained(5) == 2
    assert StepSelection("window", k=2, window_start=3).num_trained(5) == 2
    with pytest.raises(ValueError, match="window_start"):
        StepSelection("window", k=2, window_start=4).num_trained(5)
    assert StepSelection("window", k=2, window_range=(0, 5)).num_trained(5) == 2
    assert StepSelection("window", k=2, window_range=(3, 5)).num_trained(5) == 2  # lo = hi - k
    for bad in ((4, 5), (0, 6), (-1, 3)):
        with pytest.raises(ValueError, match="window_range"):
            StepSelection("window", k=2, window_range=bad).num_trained(5)
    assert StepSelection("first_k", k=2, window_range=(4, 5)).num_trained(5) == 2  # only windows use it
    assert StepSelection("first_k", timestep_fraction=1.0).num_trained(7) == 7
    with pytest.raises(ValueError, match="timestep_fraction"):
        StepSelection("first_k", timestep_fraction=0.0).num_trained(7)


def test_sample_seed_is_the_documented_hash():
    import hashlib

    from verl_digen.algo.seeding import sample_generator, sample_seed

    key = b"1/2/3/4/sde"
    want = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1
    assert sample_seed(1, 2, 3, 4, "sde") == want  # part of the reproducibility contract of a resumed run
    g = sample_generator(1, 2, 3, 4, "sde")
    assert torch.equal(torch.randn(3, generator=g), torch.randn(3, generator=torch.Generator().manual_seed(want)))
    seeds = {sample_seed(*args) for args in [(1, 2, 3, 4, "x"), (9, 2, 3, 4, "x"), (1, 9, 3, 4, "x"),
                                              (1, 2, 9, 4, "x"), (1, 2, 3, 9, "x"), (1, 2, 3, 4, "y")]}
    assert len(seeds) == 6  # every field matters


def test_selection_is_seeded_by_every_field_and_checks_lengths():
    sel = StepSelection("random_k", k=5)
    base = sel.select(30, 1, 2, [3], [4])
    for other in (sel.select(30, 9, 2, [3], [4]), sel.select(30, 1, 9, [3], [4]), sel.select(30, 1, 2, [9], [4]),
                  sel.select(30, 1, 2, [3], [9])):
        assert not torch.equal(base, other)  # seed, step, prompt and sample each change the draw
    with pytest.raises(ValueError):
        sel.select(10, 1, 2, [3, 4], [4])
    empty = sel.select(10, 1, 2, [], [])
    assert empty.shape == (0, 5) and empty.dtype == torch.long
    w = StepSelection("window", k=3)
    assert len({int(w.select(10, s, 5, [0], [0])[0, 0]) for s in range(40)}) > 1  # depends on the seed
    assert len({int(w.select(10, 5, t, [0], [0])[0, 0]) for t in range(40)}) > 1  # and on the step


def test_flow_sigmas_bounds_and_dtype():
    from verl_digen.algo.sigmas import flow_sigmas

    s = flow_sigmas(1, 1.0)
    assert s.tolist() == [1.0, 0.0] and s.dtype == D
    s32 = flow_sigmas(4, 3.0, torch.float32)
    assert s32.dtype == torch.float32
    t = 1 / 3  # not a float32 number: the shift is computed in float64
    assert float(flow_sigmas(3, 3.0)[2]) == pytest.approx(3 * t / (1 + 2 * t), rel=1e-14)
    with pytest.raises(ValueError, match="num_steps"):
        flow_sigmas(0)
    with pytest.raises(ValueError, match="shift"):
        flow_sigmas(4, 0.0)


def test_rollout_next_state_is_mean_plus_std_times_the_sde_stream(rollout):
    from verl_digen.algo.seeding import sample_generator

    model, cfg, traj = rollout
    x_t, x1 = traj.states[:1, 0], traj.next_states[:1, 0]
    v = model.velocity(x_t, traj.sigmas[:1, 0], traj.cond.index(slice(0, 1)), cfg.guidance_scale)
    mean, std = _dance_reference(x_t, v, float(traj.sigmas[0, 0]), float(traj.sigmas_next[0, 0]), cfg.eta)
    g = sample_generator(4, 2, 0, 0, "sde")  # seed 4, step 2, prompt 0, sample 0: the first draw
    noise = torch.randn(tuple(model.latent_shape), generator=g, dtype=D)
    torch.testing.assert_close(x1[0], (mean + std * noise)[0].detach(), rtol=1e-10, atol=1e-12)


def _moved_away_from_a_reference(model, seed: int, guidance_scale: float):
    """A frozen copy of ``model`` (the reference policy) and its velocity function; ``model``'s weights are
    then moved by small random steps, so the two policies' means differ."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for p in model.transformer.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))

    def reference(x, sigma, cond):
        return ref.velocity(x, sigma, cond, guidance_scale)

    return ref, reference


def test_tsp_loss_with_cfg_and_kl_to_a_reference_equals_an_independent_loss():
    model = build_tiny_model("sd3", dtype=D, latent_size=8)
    assert not model.guidance_distilled
    cfg = SamplerConfig(num_steps=3, sde="dance_grpo", eta=0.8, guidance_scale=2.5,
                        selection=StepSelection("first_k", k=2), decode=False)
    prompts = ["a cat", "a cat"]
    traj = sample_trajectories(model, model.encode_prompts(prompts), prompts, [0, 0], [0, 1], cfg,
                               seed=1, step=0, version=0)
    traj.advantages = torch.tensor([0.7, -0.7], dtype=D)
    ref, reference = _moved_away_from_a_reference(model, 5, cfg.guidance_scale)

    clip, coef, scale = 0.05, 0.1, 0.25
    want = 0.0
    for i in range(2):
        one = slice(i, i + 1)
        for j in range(2):
            x, nxt, sig = traj.states[one, j], traj.next_states[one, j], traj.sigmas[one, j]
            s, s_next = float(traj.sigmas[i, j]), float(traj.sigmas_next[i, j])
            mean, std = _dance_reference(x, model.velocity(x, sig, traj.cond.index(one), 2.5), s, s_next, cfg.eta)
            ref_mean, _ = _dance_reference(x, ref.velocity(x, sig, traj.cond.index(one), 2.5), s, s_next, cfg.eta)
            lp = float((-(nxt - mean) ** 2 / (2 * std**2) - math.log(std) - 0.5 * math.log(2 * math.pi)).mean())
            ratio, a = math.exp(lp - float(traj.log_probs[i, j])), float(traj.advantages[i])
            kl = float(((mean - ref_mean) ** 2 / (2 * std**2)).mean())
            want += max(-a * ratio, -a * min(max(ratio, 1 - clip), 1 + clip)) + coef * kl
    train = cfg.train_config(LossConfig(clip_range=clip, kl_coef=coef))
    got = tsp_backward(model, traj, train, scale, degree=1, reference=reference)
    assert got.summary()["loss"] == pytest.approx(scale * want, rel=1e-9)
    assert got.summary()["kl"] > 0


def _verl_omni_sde_mean_and_std(x, v, s, s_next, eta, sigma_max):
    """verl-omni's Flow-GRPO step (flow_match_sde.py, sde_type=sde), written out: the mean and its std_dev_t
    (the step's real std is std_dev_t sqrt(|dt|)); sigma = 1 takes sigma_max in the std, as there."""
    dt = s_next - s
    std_t = math.sqrt(s / (1 - (sigma_max if s == 1 else s))) * eta
    mean = x * (1 + std_t**2 / (2 * s) * dt) + v * (1 + std_t**2 * (1 - s) / (2 * s)) * dt
    return mean, std_t


def test_dt_weighted_kl_equals_verl_omnis_flow_grpo_kl_on_a_shifted_schedule():
    """With actor.kl_dt_weighted (what the converter sets for verl-omni's sde), the loss's KL is verl-omni's
    |mu - mu_ref|^2 / (2 std_t^2), row by row, on a shift-3 schedule whose |dt| differs at every step."""
    model = build_tiny_model("sd3", dtype=D, latent_size=8)
    cfg = SamplerConfig(num_steps=4, shift=3.0, sde="flow_grpo", eta=0.7, selection=StepSelection("first_k", k=3),
                        decode=False)
    prompts = ["a cat", "a cat"]
    traj = sample_trajectories(model, model.encode_prompts(prompts), prompts, [0, 0], [0, 1], cfg,
                               seed=2, step=0, version=0)
    traj.advantages = torch.tensor([0.0, 0.0], dtype=D)  # zero advantages: the loss is the KL term alone
    ref, reference = _moved_away_from_a_reference(model, 6, cfg.guidance_scale)

    sigma_max = float(cfg.sigmas(D)[1])
    dts, want = set(), 0.0
    for i in range(2):
        one = slice(i, i + 1)
        for j in range(3):
            x, sig = traj.states[one, j], traj.sigmas[one, j]
            s, s_next = float(traj.sigmas[i, j]), float(traj.sigmas_next[i, j])
            mean, std_t = _verl_omni_sde_mean_and_std(x, model.velocity(x, sig, traj.cond.index(one), 1.0), s, s_next,
                                                      cfg.eta, sigma_max)
            ref_mean, _ = _verl_omni_sde_mean_and_std(x, ref.velocity(x, sig, traj.cond.index(one), 1.0), s, s_next,
                                                      cfg.eta, sigma_max)
            want += float(((mean - ref_mean) ** 2).mean().detach()) / (2 * std_t**2)
            dts.add(round(s - s_next, 12))
    assert len(dts) == 3  # the shift makes every trained step's |dt| different
    coef, scale = 0.1, 0.5
    weighted = cfg.train_config(LossConfig(kl_coef=coef, kl_dt_weighted=True))
    got = tsp_backward(model, traj, weighted, scale, degree=1, reference=reference)
    assert got.summary()["loss"] == pytest.approx(scale * coef * want, rel=1e-9)
    model.transformer.zero_grad()
    plain = tsp_backward(model, traj, cfg.train_config(LossConfig(kl_coef=coef)), scale, degree=1, reference=reference)
    assert plain.summary()["loss"] != pytest.approx(scale * coef * want, rel=1e-3)  # the Gaussian KL differs
    model.transformer.zero_grad()


def test_ode_and_full_noise_transitions():
    from verl_digen.algo.sde import check_sde, transition

    x = torch.tensor([[1.0, -2.0]], dtype=D)
    v = torch.tensor([[0.5, 0.25]], dtype=D)
    s, s_next = torch.tensor([0.6], dtype=D), torch.tensor([0.4], dtype=D)
    mean, std = transition("ode", x, v, s, s_next, eta=0.7)  # an ODE ignores eta
    torch.testing.assert_close(mean, x + v * (-0.2))
    assert std.abs().max() == 0
    mean, std = transition("dance_grpo", x, v, s, s_next, eta=1.0)
    ref_mean, ref_std = _dance_reference(x, v, 0.6, 0.4, 1.0)
    torch.testing.assert_close(mean, ref_mean)
    assert float(std.flatten()[0]) == pytest.approx(ref_std)
    check_sde("cps", 1.0)  # eta = 1 is the edge of cps's range, allowed
    with pytest.raises(ValueError, match="cps"):
        check_sde("cps", 1.01)


def test_trajectories_index_and_cat_keep_every_field(rollout):
    _, _, traj = rollout
    t = copy.copy(traj)
    t.rewards = torch.tensor([1.0, 2.0, 3.0], dtype=D)
    t.reward_components = {"a": torch.tensor([4.0, 5.0, 6.0], dtype=D)}
    t.advantages = torch.tensor([0.1, 0.2, 0.3], dtype=D)
    sub = t.index([2, 0])
    assert sub.prompts == [t.prompts[2], t.prompts[0]] and sub.global_step == t.global_step
    for name in ("prompt_ids", "sample_ids", "states", "next_states", "log_probs", "rewards", "advantages",
                 "final_latents", "versions", "step_indices", "sigmas"):
        assert torch.equal(getattr(sub, name), getattr(t, name)[[2, 0]]), name
    assert torch.equal(sub.reward_components["a"], torch.tensor([6.0, 4.0], dtype=D))
    assert sub.images is None
    back = type(t).cat([t.index([0]), t.index([1, 2])])
    assert back.prompts == t.prompts and back.global_step == t.global_step
    for name in ("states", "log_probs", "rewards", "advantages", "versions"):
        assert torch.equal(getattr(back, name), getattr(t, name)), name
    assert torch.equal(back.reward_components["a"], t.reward_components["a"]) and back.images is None
    alone = type(t).cat([t])  # one part (a generator that produced a whole step's share)
    assert alone.global_step == t.global_step and torch.equal(alone.reward_components["a"], t.reward_components["a"])


def test_tsp_without_a_reference_ignores_the_kl_coefficient(rollout):
    model, cfg, traj = rollout
    traj = copy.copy(traj)
    traj.advantages = torch.tensor([1.0, -0.5, 2.0], dtype=D)
    plain = tsp_backward(model, traj, cfg.train_config(LossConfig(clip_range=0.05)), 1.0)
    with_coef = tsp_backward(model, traj, cfg.train_config(LossConfig(clip_range=0.05, kl_coef=0.3)), 1.0)
    assert with_coef.summary()["loss"] == pytest.approx(plain.summary()["loss"], rel=1e-12)
    model.transformer.zero_grad()


def test_normalize_then_sum_drops_a_sample_any_reward_drops():
    ids = torch.tensor([0, 0, 1, 1])
    a = torch.tensor([1.0, 1.0, 0.0, 2.0], dtype=D)  # group 0 constant in a: dropped
    b = torch.tensor([0.0, 3.0, 1.0, 1.0], dtype=D)  # group 1 constant in b: dropped
    adv, keep = multi_reward_advantages({"a": a, "b": b}, {"a": 1.0, "b": 1.0}, ids, "normalize_then_sum",
                                        AdvantageConfig(drop_zero_groups=True, clip=None))
    assert keep.tolist() == [False, False, False, False] and adv.abs().max() == 0
    adv, keep = multi_reward_advantages({"b": b, "a": a}, {"b": 1.0, "a": 1.0}, ids, "normalize_then_sum",
                                        AdvantageConfig(drop_zero_groups=True, clip=None))
    assert not keep.any()
