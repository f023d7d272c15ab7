"""DiffusionNFT's run pieces (algo/diffusion_nft.py, the clean-only rollout, the planner): the rollout is a plain
ODE that keeps only clean samples; the trainer's noised rows are each sample's own (any sub-batch builds the same
rows); the planner prices the old copy's and the reference's forwards on every trained row."""

from __future__ import annotations

import pytest
import torch

from verl_digen.algo.diffusion_nft import noised_rows
from verl_digen.algo.selection import StepSelection
from verl_digen.config.schema import compose
from verl_digen.models import build_tiny_model
from verl_digen.rollout.sampler import SamplerConfig, initial_noise, sample_trajectories


@pytest.fixture(scope="module")
def rollout():
    torch.set_num_threads(1)
    model = build_tiny_model("flux", dtype=torch.float64, latent_size=8)
    sampler = SamplerConfig(num_steps=5, selection=StepSelection("random_k", k=3), decode=False, clean_only=True)
    prompts = ["a cat", "a dog"]
    cond = model.encode_prompts(prompts).repeat_interleave(2)
    traj = sample_trajectories(model, cond, [p for p in prompts for _ in range(2)], [0, 0, 1, 1], [0, 1, 0, 1],
                               sampler, seed=3, step=2, version=0)
    return model, cond, sampler, traj


def test_the_rollout_is_an_ode_that_keeps_only_clean_samples(rollout):
    model, cond, sampler, traj = rollout
    assert traj.states.shape[:2] == (4, 0) and traj.log_probs.shape == (4, 0)  # nothing per step leaves it
    sigmas = sampler.sigmas(torch.float64)
    x = initial_noise(tuple(model.latent_shape), [0, 0, 1, 1], [0, 1, 0, 1], 3, 2, torch.float64)
    with torch.no_grad():
        for i in range(sampler.num_steps):  # Euler on the flow ODE, written out
            s = sigmas[i].expand(4)
            x = x + (sigmas[i + 1] - sigmas[i]) * model.velocity(x, s, cond, 1.0)
    torch.testing.assert_close(traj.final_latents, x, rtol=0, atol=1e-12)
    torch.testing.assert_close(traj.sigmas, sigmas[traj.step_indices], rtol=0, atol=0)
    assert len({tuple(r) for r in traj.step_indices.tolist()}) > 1  # random_k: each sample its own steps


def test_noised_rows_are_each_samples_own(rollout):
    _, _, _, traj = rollout
    whole = noised_rows(traj, seed=7)
    part = noised_rows(traj.index([3, 1]), seed=7)
    torch.testing.assert_close(part.states, whole.states[[3, 1]], rtol=0, atol=0)
    t = traj.sigmas[..., None, None, None]
    eps = (whole.states - (1 - t) * whole.next_states) / t  # every t > 0: the schedule ends at 0, never trained
    assert float((whole.next_states - traj.final_latents[:, None]).abs().max()) == 0.0
    assert abs(float(eps.std()) - 1.0) < 0.2 and not torch.allclose(eps[:, 0], eps[:, 1])
    assert not torch.equal(noised_rows(traj, seed=8).states, whole.states)


def test_the_planner_prices_the_old_and_reference_forwards_of_every_row():
    from verl_digen.schedule import presets

    model = presets.get("qwen-image-20b-16").model
    share = model.baselines.recompute_share
    costs = {}
    for name, extra in (("grpo", []), ("nft", ["algorithm.name=diffusion_nft"]),
                        ("nft_ref", ["algorithm.name=diffusion_nft", "actor.kl_coef=0.01"])):
        cfg = compose(["data.train_batch_size=4", "rollout.n=4", "rollout.micro_batch_size=4", *extra])
        costs[name] = cfg.schedule_config().stage_costs(model, 1)
    assert costs["nft"].generate == costs["grpo"].generate  # T forwards, ODE or SDE
    assert costs["nft"].update == pytest.approx(costs["grpo"].update * (1 + share))
    assert costs["nft_ref"].update == pytest.approx(costs["grpo"].update * (1 + 2 * share))


def test_the_memory_plan_counts_the_old_copy_on_the_trainer():
    from verl_digen.config.memory import memory_plan

    def trainer(*extra):
        return next(p for p in memory_plan(compose(list(extra))).pools if p.pool == "trainer").parts

    nft, grpo = trainer("algorithm.name=diffusion_nft"), trainer()
    assert "old policy" not in grpo and nft["old policy"] == nft["grads"] > 0  # one copy of the trained tensors
