"""DiffusionNFT's training path in one process (no Ray): the trainer's mini-batch updates and its old-policy copy
against a reference written here from the formulas (algo/diffusion_nft.py's docstring), float64, 1e-10.

The reference shares no training code with the trainer: it noises each clean sample itself (the documented
stream: K draws from the sample's ``nft`` generator, in the order of its trained steps), takes one forward per
row (no TSP stacking), writes the loss out, keeps the old policy as a second model moved by hand (it samples
the rollouts too, as verl-omni's ``rollout_adapter=old``), and steps torch's AdamW after torch's clipping. The
rollout is the ODE sampler of the runtime (``clean_only``)."""

from __future__ import annotations

import copy

import pytest
import torch
from workers_helpers import local_batch

from verl_digen.algo.diffusion_nft import NFTConfig
from verl_digen.algo.loss import LossConfig
from verl_digen.algo.seeding import sample_generator
from verl_digen.algo.selection import StepSelection
from verl_digen.rollout.sampler import SamplerConfig
from verl_digen.workers import policy as P
from verl_digen.workers.actor import TSPActorWorker
from verl_digen.workers.config import OptimConfig, PolicyConfig, WorkerConfig

K, N, PROMPTS, REF_KL = 2, 3, 2, 0.05


def nft_cfg(nft: NFTConfig) -> WorkerConfig:
    return WorkerConfig(
        policy=PolicyConfig(arch="flux", dtype="float64", latent_size=8, seed=0),
        sampler=SamplerConfig(num_steps=4, selection=StepSelection("random_k", k=K), clean_only=True),
        loss=LossConfig(kl_coef=REF_KL, mode="diffusion_nft", nft=nft),
        optim=OptimConfig(lr=1e-2, grad_clip=1.0), reward="latent_mean", seed=1)


@pytest.fixture
def env(monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29534"}.items():
        monkeypatch.setenv(key, value)


def _row_loss(model, old, ref, traj, i: int, j: int, eps: torch.Tensor, nft: NFTConfig) -> torch.Tensor:
    """Row (sample i, trained step j), from the formulas."""
    x0 = traj.final_latents[i:i + 1]
    t = traj.sigmas[i, j]
    xt = (1 - t) * x0 + t * eps
    cond = traj.cond.index(torch.tensor([i]))
    sig = t.reshape(1)
    with torch.no_grad():
        v_old = old.velocity(xt, sig, cond, 1.0)
        v_ref = ref.velocity(xt, sig, cond, 1.0)
    v = model.velocity(xt, sig, cond, 1.0)
    c, beta = nft.adv_clip_max, nft.mix_beta
    r = min(max(float(traj.advantages[i]), -c), c) / (2 * c) + 0.5
    x0_pos = xt - t * (beta * v + (1 - beta) * v_old)
    x0_neg = xt - t * ((1 + beta) * v_old - beta * v)
    w_pos = max(float((x0_pos - x0).detach().abs().mean()), nft.adaptive_weight_min)
    w_neg = max(float((x0_neg - x0).detach().abs().mean()), nft.adaptive_weight_min)
    policy = c * (r * ((x0_pos - x0) ** 2).mean() / w_pos + (1 - r) * ((x0_neg - x0) ** 2).mean() / w_neg) / beta
    return policy + REF_KL * ((v - v_ref) ** 2).mean()


def _reference(cfg: WorkerConfig, nft: NFTConfig, steps: int):
    """(the rollouts, the trained parameters, the old copy's) of ``steps`` global steps of two mini-batches."""
    model = P.build_policy(cfg)
    model.transformer.train()
    old, ref = copy.deepcopy(model), copy.deepcopy(model)
    params = [p for p in model.transformer.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.optim.lr, betas=tuple(cfg.optim.betas), weight_decay=cfg.optim.weight_decay)
    batches = []
    for step in range(steps):
        traj = local_batch(old, cfg, step, step, list(range(PROMPTS)), N)  # the old policy samples
        batches.append(traj)
        for half in range(2):  # one prompt (its N samples) per mini-batch
            rows = range(half * N, (half + 1) * N)
            loss = 0.0
            for i in rows:
                p, s = int(traj.prompt_ids[i]), int(traj.sample_ids[i])
                g = sample_generator(cfg.seed, step, p, s, "nft")
                eps = torch.randn((K, *traj.final_latents.shape[1:]), generator=g, dtype=torch.float64)
                for j in range(K):
                    loss = loss + _row_loss(model, old, ref, traj, i, j, eps[j:j + 1], nft)
            (loss / (N * K)).backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
        global_step = step + 1
        if global_step % nft.old_policy_update_interval == 0:
            d = nft.old_policy_decay if nft.old_policy_decay is not None else 0.0
            with torch.no_grad():
                for po, pm in zip(old.transformer.parameters(), model.transformer.parameters(), strict=True):
                    po.copy_(d * po + (1 - d) * pm)
    named = dict(model.transformer.named_parameters())
    olds = dict(old.transformer.named_parameters())
    return batches, {n: named[n].detach() for n in named}, {n: olds[n].detach() for n in olds}


@pytest.mark.slow
@pytest.mark.parametrize("nft", [
    NFTConfig(mix_beta=0.3, old_policy_decay=0.4),
    NFTConfig(mix_beta=0.7, old_policy_decay_schedule="copy", old_policy_update_interval=2)],
                         ids=["decay0.4-every-step", "copy-every-2nd-step"])
def test_mini_batches_and_old_copy_equal_the_formulas(env, nft):
    cfg = nft_cfg(nft)
    batches, want, want_old = _reference(cfg, nft, steps=2)
    worker = TSPActorWorker(cfg)
    worker.init_model()
    for traj in batches:
        assert traj.states.shape[1] == 0 and traj.sigmas.shape == (PROMPTS * N, K)  # clean samples only
        for half in range(2):
            part = traj.index(list(range(half * N, (half + 1) * N)))
            worker.update(part, 1.0 / (N * K))
            assert not worker.optimizer_step(ends_step=half == 1)["skipped"]
    got = dict(worker.named_params)
    assert want.keys() == got.keys() == worker.old.keys() and want
    for name in want:
        torch.testing.assert_close(got[name].detach(), want[name], rtol=0, atol=1e-10, msg=name)
        torch.testing.assert_close(worker.old[name], want_old[name], rtol=0, atol=1e-10, msg=f"old {name}")
    moved = max(float((got[n].detach() - worker.old[n]).abs().max()) for n in want)
    if nft.old_policy_decay is not None:  # a moving average lags the weights (else v_old's role goes unseen)
        assert moved > 1e-6, "the old copy equals the trained weights"
    else:  # a copy at step 2 (step 2 itself trained against the initial weights as v_old)
        assert moved == 0.0


@pytest.mark.parametrize("interval, schedule, step, want", [
    (1, "copy", 5, 0.0), (2, "copy", 3, None), (2, "linear_to_0_5", 4, 0.004), (1, "linear_to_0_5", 900, 0.5),
    (1, "delayed_linear_to_0_999", 74, 0.0), (1, "delayed_linear_to_0_999", 80, 0.0375),
    (1, "delayed_linear_to_0_999", 500, 0.999)])
def test_old_policy_decay_schedule(interval, schedule, step, want):
    got = NFTConfig(old_policy_decay_schedule=schedule, old_policy_update_interval=interval).old_decay(step)
    assert got == pytest.approx(want) if want is not None else got is None


def test_a_checkpoint_carries_the_old_copy(env, tmp_path):
    """The old copy lags the weights after a step with a decay; a resumed trainer gets it back, not the weights."""
    cfg = nft_cfg(NFTConfig(old_policy_decay=0.5))
    worker = TSPActorWorker(cfg)
    worker.init_model()
    traj = local_batch(P.build_policy(cfg), cfg, 0, 0, [0], N)
    worker.update(traj, 1.0 / (N * K))
    worker.optimizer_step()
    assert any(not torch.equal(worker.old[n], p) for n, p in worker.named_params)
    path = str(tmp_path / "global_step_1")
    worker.save_checkpoint(path, {"step": 1, "run_id": "r"})
    resumed = TSPActorWorker(cfg)
    resumed.init_model()
    resumed.load_checkpoint(path)
    assert all(torch.equal(resumed.old[n], worker.old[n]) for n in worker.old)
    # the rollout's weights are the old copy (verl-omni's rollout_adapter=old); the trained ones stay in place
    exported = worker.export_weights()
    assert exported.keys() == worker.old.keys() and all(torch.equal(exported[n], worker.old[n]) for n in exported)
    assert any(not torch.equal(exported[n], p) for n, p in worker.named_params)
