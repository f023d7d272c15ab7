"""``algorithm.name`` selects the SDE and the loss; GRPO-Guard / Flow-DPPO run through TSP with the old mean
of the step's starting weights (float64, tiny model)."""

import copy

import pytest
import torch

from verl_digen.algo.flow_dppo import flow_dppo_loss
from verl_digen.algo.grpo_guard import grpo_guard_loss
from verl_digen.algo.loss import LossConfig
from verl_digen.algo.sde import sde_step
from verl_digen.algo.selection import StepSelection
from verl_digen.algo.tsp import sequential_backward, tsp_backward
from verl_digen.config.schema import compose
from verl_digen.models import build_tiny_model
from verl_digen.rollout.sampler import SamplerConfig, sample_trajectories


@pytest.mark.parametrize("overrides, sde, mode", [
    ([], "flow_grpo", "flow_grpo"),
    (["rollout.sde_type=dance_grpo"], "dance_grpo", "flow_grpo"),  # today's key keeps working
    (["algorithm.name=cps"], "cps", "flow_grpo"),
    (["algorithm.name=dance_grpo"], "dance_grpo", "flow_grpo"),
    (["algorithm.name=grpo_guard"], "flow_grpo", "grpo_guard"),
    (["algorithm.name=flow_dppo", "rollout.sde_type=dance_grpo"], "dance_grpo", "flow_dppo"),
    (["algorithm.name=mix_grpo", "rollout.sde_type=cps"], "cps", "flow_grpo"),
])
def test_algorithm_name_selects_sde_and_loss(overrides, sde, mode):
    cfg = compose(overrides)
    assert cfg.sampler().sde == sde
    assert cfg.worker_config().loss.mode == mode
    mix = cfg.sampler().selection.mix
    assert (mix is not None) == ("algorithm.name=mix_grpo" in overrides)
    assert cfg.sampler().selection.kind == ("window" if mix is not None else "first_k")


def test_old_mean_losses_price_the_step_weights_forward_with_mini_batches():
    base = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "actor.recompute_log_prob=false"]
    assert not compose(base).schedule_config().recompute
    assert compose([*base, "algorithm.name=flow_dppo"]).schedule_config().recompute


def _setup():
    model = build_tiny_model("flux", dtype=torch.float64, latent_size=8)
    sampler = SamplerConfig(num_steps=5, sde="flow_grpo", eta=0.7, selection=StepSelection("first_k", k=4),
                            decode=False)
    prompts = ["a cat", "a dog"]
    cond = model.encode_prompts(prompts).repeat_interleave(2)
    traj = sample_trajectories(model, cond, [p for p in prompts for _ in range(2)], [0, 0, 1, 1], [0, 1, 0, 1],
                               sampler, seed=3, step=0, version=0)
    traj.advantages = torch.linspace(-1.0, 1.5, len(traj), dtype=torch.float64)
    start = copy.deepcopy(model)  # the step's starting weights
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():  # a mini-batch's optimizer step moved the trained weights
        for p in model.transformer.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model, start, traj, sampler


def _reference_loss(model, start, traj, train, scale):
    """The step's loss written out: every (sample, step) row's new and starting-weights transitions."""
    b, k = traj.step_indices.shape
    x, x_next = traj.states.reshape(b * k, *traj.states.shape[2:]), traj.next_states.reshape(b * k, -1)
    sigma, sigma_next = traj.sigmas.reshape(-1), traj.sigmas_next.reshape(-1)
    cond = traj.cond.repeat_interleave(k)
    steps = [sde_step("flow_grpo", x, m.velocity(x, sigma, cond, 1.0), sigma, sigma_next, 0.7,
                      prev=x_next.reshape(x.shape), sigma_max=train.sigma_max) for m in (model, start)]
    new, old = steps
    adv = traj.advantages[:, None].expand(b, k).reshape(-1)
    lp_old = traj.log_probs.reshape(-1)
    if train.loss.mode == "grpo_guard":
        return grpo_guard_loss(new.log_prob, lp_old, adv, new.mean, old.mean, new.std, sigma - sigma_next,
                               train.loss, scale).loss
    return flow_dppo_loss(new.log_prob, lp_old, adv, new.mean, old.mean, new.std, train.loss, scale).loss


@pytest.mark.parametrize("mode", ["grpo_guard", "flow_dppo"])
def test_tsp_reads_the_step_weights_mean_and_equals_sequential(mode):
    model, start, traj, sampler = _setup()
    train = sampler.train_config(LossConfig(clip_range=0.05, mode=mode, kl_mask_threshold=1e-3))
    scale = 1.0 / (len(traj) * traj.num_trained_steps)
    behaviour = lambda x, s, c: start.velocity(x, s, c, 1.0)  # noqa: E731
    with torch.no_grad():
        expected = float(_reference_loss(model, start, traj, train, scale))
    moved = tsp_backward(model, traj, train, scale, degree=3, behaviour=behaviour)
    assert abs(moved.loss - expected) < 1e-12
    # without a kept copy the old mean is the pass's own: a different loss (the old mean is really read)
    model.transformer.zero_grad()
    own = tsp_backward(model, traj, train, scale, degree=3)
    assert abs(own.loss - moved.loss) > 1e-6
    with torch.no_grad():
        assert abs(own.loss - float(_reference_loss(model, model, traj, train, scale))) < 1e-12
    g_tsp = {n: p.grad.clone() for n, p in model.transformer.named_parameters()}
    model.transformer.zero_grad()
    sequential_backward(model, traj, train, scale)
    for n, p in model.transformer.named_parameters():
        torch.testing.assert_close(p.grad, g_tsp[n], rtol=1e-9, atol=1e-12)
