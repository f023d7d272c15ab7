"""Trajectory sampling: placement invariance, stored steps, versions, errors."""

import pytest
import torch

from verl_digen.algo.selection import StepSelection
from verl_digen.algo.trajectory import Trajectories
from verl_digen.models import build_tiny_model
from verl_digen.rollout.sampler import SamplerConfig, initial_noise, sample_trajectories

PROMPTS = ["a red car", "a cat", "a lake", "a robot"]


@pytest.fixture(scope="module")
def model():
    return build_tiny_model("flux", dtype=torch.float64, latent_size=8)


def _sample(model, rows, cfg, step=0, version=0, seed=5):
    """rows: list of (prompt index, sample index)."""
    prompts = [PROMPTS[p] for p, _ in rows]
    cond = model.encode_prompts(prompts)
    return sample_trajectories(model, cond, prompts, [p for p, _ in rows], [s for _, s in rows], cfg,
                               seed=seed, step=step, version=version)


def test_one_sample_alone_equals_the_same_sample_inside_a_batch_of_8(model):
    cfg = SamplerConfig(num_steps=4, selection=StepSelection("random_k", k=2))
    batch_rows = [(p, s) for p in range(4) for s in range(2)]
    batch = _sample(model, batch_rows, cfg)
    alone = _sample(model, [(2, 1)], cfg)
    i = batch_rows.index((2, 1))
    # the random streams are bit-identical wherever the sample runs
    assert torch.equal(alone.step_indices[0], batch.step_indices[i])
    assert torch.equal(initial_noise(model.latent_shape, [2], [1], 5, 0, torch.float64)[0],
                       initial_noise(model.latent_shape, [0, 2], [0, 1], 5, 0, torch.float64)[1])
    # the trajectory agrees up to BLAS reassociation across batch sizes (~1e-15 in float64)
    for field in ("states", "next_states", "log_probs", "final_latents", "sigmas"):
        torch.testing.assert_close(getattr(alone, field)[0], getattr(batch, field)[i], rtol=0, atol=1e-12)
    # and is bit-identical for the same batch composition in another order (another worker's batch)
    shuffled_rows = batch_rows[::-1]
    shuffled = _sample(model, shuffled_rows, cfg)
    j = shuffled_rows.index((2, 1))
    assert torch.equal(shuffled.final_latents[j], batch.final_latents[i])


def test_samples_differ_across_samples_steps_and_seeds(model):
    cfg = SamplerConfig(num_steps=3, selection=StepSelection("first_k", k=2))
    a = _sample(model, [(0, 0), (0, 1)], cfg)
    assert not torch.equal(a.final_latents[0], a.final_latents[1])
    b = _sample(model, [(0, 0)], cfg, step=1)
    assert not torch.equal(a.final_latents[0], b.final_latents[0])
    c = _sample(model, [(0, 0)], cfg, seed=6)
    assert not torch.equal(a.final_latents[0], c.final_latents[0])


def test_shared_group_noise_gives_one_initial_noise_per_prompt(model):
    cfg = SamplerConfig(num_steps=3, selection=StepSelection("first_k", k=1), shared_group_noise=True)
    t = _sample(model, [(1, 0), (1, 1), (2, 0)], cfg)
    assert torch.equal(t.states[0, 0], t.states[1, 0])  # step 0 input is x_T
    assert not torch.equal(t.states[0, 0], t.states[2, 0])
    assert not torch.equal(t.final_latents[0], t.final_latents[1])  # SDE noise still differs


def test_stored_steps_chain_and_match_selection(model):
    cfg = SamplerConfig(num_steps=6, selection=StepSelection("first_k", k=3))
    t = _sample(model, [(0, 0), (1, 0)], cfg, version=7)
    assert t.states.shape == (2, 3, *model.latent_shape)
    assert torch.equal(t.next_states[:, 0], t.states[:, 1])  # consecutive trained steps chain
    sig = cfg.sigmas(torch.float64)
    assert torch.equal(t.sigmas[0], sig[:3]) and torch.equal(t.sigmas_next[0], sig[1:4])
    assert t.versions.tolist() == [7, 7] and t.global_step == 0
    assert t.images.shape == (2, 3, 16, 16) and 0 <= float(t.images.min()) and float(t.images.max()) <= 1
    assert (t.log_probs != 0).all()


def test_window_runs_ode_outside_and_stores_only_window_steps(model):
    cfg = SamplerConfig(num_steps=6, selection=StepSelection("window", k=2, window_start=2), decode=False)
    t = _sample(model, [(0, 0), (0, 1)], cfg)
    assert t.step_indices.tolist() == [[2, 3], [2, 3]]
    assert t.states.shape[1] == 2
    # before the window the sampler is deterministic: both samples' paths differ only by x_T, and
    # a sample's step-2 input equals the ODE integration of its initial noise
    x = initial_noise(model.latent_shape, [0], [0], 5, 0, torch.float64)
    sig = cfg.sigmas(torch.float64)
    cond = model.encode_prompts([PROMPTS[0]])
    with torch.no_grad():
        for i in range(2):
            x = x + model.velocity(x, sig[i].expand(1), cond) * (sig[i + 1] - sig[i])
    torch.testing.assert_close(t.states[0, 0], x[0], rtol=0, atol=1e-12)
    assert t.images is None


def test_trajectories_index_and_cat_roundtrip(model):
    cfg = SamplerConfig(num_steps=3, selection=StepSelection("first_k", k=2), decode=False)
    t = _sample(model, [(0, 0), (0, 1), (1, 0), (1, 1)], cfg)
    t.rewards = torch.arange(4, dtype=torch.float64)
    back = Trajectories.cat([t.index([0, 1]), t.index([2, 3])])
    for name in ("states", "log_probs", "rewards", "prompt_ids", "versions"):
        assert torch.equal(getattr(back, name), getattr(t, name))
    assert back.prompts == t.prompts and back.images is None
    assert torch.equal(back.cond.tensors["prompt_embeds"], t.cond.tensors["prompt_embeds"])
    other = _sample(model, [(0, 0)], cfg, step=1)
    with pytest.raises(ValueError, match="different global steps"):
        Trajectories.cat([t, other])


@pytest.mark.parametrize(
    "cfg, match",
    [
        (SamplerConfig(sde="ode"), "deterministically"),
        (SamplerConfig(eta=0.0), "deterministically"),
        (SamplerConfig(sde="langevin"), "unknown SDE kind"),
        (SamplerConfig(eta=-1.0), "eta must be"),
        (SamplerConfig(num_steps=4, selection=StepSelection("first_k", k=5)), "k=5 must lie in"),
        (SamplerConfig(guidance_scale=0.5), "guidance_scale"),
    ],
)
def test_sampler_config_errors(model, cfg, match):
    with pytest.raises(ValueError, match=match):
        _sample(model, [(0, 0)], cfg)


def test_row_count_mismatch_is_an_error(model):
    cfg = SamplerConfig(num_steps=2, selection=StepSelection("first_k", k=1))
    cond = model.encode_prompts(["a"])
    with pytest.raises(ValueError, match="one row per sample"):
        sample_trajectories(model, cond, ["a", "b"], [0, 1], [0, 0], cfg, 0, 0, 0)
