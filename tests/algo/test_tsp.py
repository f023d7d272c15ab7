"""TSP gradient == sequential per-step gradient, for every tiny architecture, full fine-tune and LoRA."""

import pytest
import torch

from verl_digen.algo.loss import LossConfig
from verl_digen.algo.selection import StepSelection
from verl_digen.algo.tsp import recompute_log_probs, sequential_backward, tsp_backward
from verl_digen.models import apply_lora, build_tiny_model, disable_adapters, known_archs
from verl_digen.rollout.sampler import SamplerConfig, sample_trajectories

ARCHS = known_archs()


def _rollout(model, sde="flow_grpo", guidance=1.0, selection=None, prompts=("a cat", "a dog")):
    cfg = SamplerConfig(
        num_steps=5, sde=sde, eta=0.7, guidance_scale=guidance,
        selection=selection or StepSelection("first_k", k=4), decode=False,
    )
    n = 2
    cond = model.encode_prompts(list(prompts)).repeat_interleave(n)
    ids = [i for i in range(len(prompts)) for _ in range(n)]
    sids = [j for _ in prompts for j in range(n)]
    rows = [p for p in prompts for _ in range(n)]
    traj = sample_trajectories(model, cond, rows, ids, sids, cfg, seed=3, step=0, version=0)
    traj.advantages = torch.linspace(-1.0, 1.5, len(traj), dtype=torch.float64)
    return traj, cfg


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.transformer.named_parameters() if p.grad is not None}


def _perturb(model, scale=0.05):
    """Move the trainable weights off the sampling policy so ratios differ from 1 and clipping bites."""
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.transformer.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def _sequential_reference(model, traj, cfg):
    """(train config, scale, metrics, gradients) of the per-step reference loop; leaves the grads zeroed."""
    train = cfg.train_config(LossConfig(clip_range=0.05))
    scale = 1.0 / (len(traj) * traj.num_trained_steps)
    model.transformer.zero_grad()
    seq = sequential_backward(model, traj, train, scale)
    grads = _grads(model)
    model.transformer.zero_grad()
    return train, scale, seq, grads


def _assert_same_grads(a, b, rtol, atol):
    assert a.keys() == b.keys() and a, "no gradients were produced"
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=rtol, atol=atol, msg=f"gradient of {name} differs")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("degree", [None, 3])
def test_tsp_gradient_equals_sequential_float64(arch, degree):
    model = build_tiny_model(arch, dtype=torch.float64, latent_size=8)
    guidance = 1.0 if model.guidance_distilled else 2.0  # exercise CFG on the models that have it
    traj, cfg = _rollout(model, guidance=guidance)
    _perturb(model)
    train, scale, seq, g_seq = _sequential_reference(model, traj, cfg)
    tsp = tsp_backward(model, traj, train, scale, degree=degree)
    g_tsp = _grads(model)
    _assert_same_grads(g_seq, g_tsp, rtol=1e-9, atol=1e-12)
    assert seq.clipped == tsp.clipped and seq.rows == tsp.rows == len(traj) * 4
    assert abs(seq.loss - tsp.loss) < 1e-12


@pytest.mark.parametrize("arch", ["flux", "sd3"])
def test_tsp_gradient_equals_sequential_float32(arch):
    model = build_tiny_model(arch, dtype=torch.float32, latent_size=8)
    traj, cfg = _rollout(model, sde="dance_grpo", selection=StepSelection("random_k", k=3))
    _perturb(model)
    train = cfg.train_config(LossConfig(clip_range=0.2))
    model.transformer.zero_grad()
    sequential_backward(model, traj, train, 0.1)
    g_seq = _grads(model)
    model.transformer.zero_grad()
    tsp_backward(model, traj, train, 0.1, degree=2)
    _assert_same_grads(g_seq, _grads(model), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_tsp_lora_gradient_matches_and_only_adapters_learn(arch):
    model = build_tiny_model(arch, dtype=torch.float64, latent_size=8)
    apply_lora(model, rank=2, alpha=4, init_lora_weights=False)  # non-zero B so adapters act
    traj, cfg = _rollout(model)
    _perturb(model)
    train = cfg.train_config(LossConfig(clip_range=0.05, kl_coef=0.1))

    def reference(x, s, c):
        with disable_adapters(model):
            return model.velocity(x, s, c, train.guidance_scale)

    scale = 1.0 / (len(traj) * traj.num_trained_steps)
    model.transformer.zero_grad()
    seq = sequential_backward(model, traj, train, scale, reference=reference)
    g_seq = _grads(model)
    model.transformer.zero_grad()
    tsp_backward(model, traj, train, scale, degree=2, reference=reference)
    g_tsp = _grads(model)
    _assert_same_grads(g_seq, g_tsp, rtol=1e-9, atol=1e-12)
    assert all("lora" in name for name in g_tsp), sorted(n for n in g_tsp if "lora" not in n)
    frozen = [n for n, p in model.transformer.named_parameters() if "lora" not in n and p.requires_grad]
    assert not frozen
    assert seq.kl > 0  # the adapters moved the policy away from the base (reference) model


@pytest.mark.parametrize("arch", ARCHS)
def test_recomputed_log_prob_of_on_policy_trajectory_equals_rollout(arch):
    model = build_tiny_model(arch, dtype=torch.float64, latent_size=8)
    traj, cfg = _rollout(model, selection=StepSelection("random_k", k=3))
    lp = recompute_log_probs(model, traj, cfg.train_config(LossConfig()))
    assert torch.equal(lp, traj.log_probs), (lp - traj.log_probs).abs().max()
    assert torch.equal(torch.exp(lp - traj.log_probs), torch.ones_like(lp))


@pytest.mark.parametrize("log_prob", ["gaussian", "squared_error"])
def test_cps_log_prob_form_reaches_the_trainer(log_prob):
    """The trainer recomputes the rollout's CPS log-probs in the form the sampler used."""
    model = build_tiny_model("flux", dtype=torch.float64, latent_size=8)
    cfg = SamplerConfig(num_steps=5, sde="cps", eta=0.7, selection=StepSelection("first_k", k=3),
                        decode=False, log_prob=log_prob)
    cond = model.encode_prompts(["a cat"]).repeat_interleave(2)
    traj = sample_trajectories(model, cond, ["a cat"] * 2, [0, 0], [0, 1], cfg, seed=3, step=0, version=0)
    train = cfg.train_config(LossConfig())
    assert train.log_prob == log_prob
    torch.testing.assert_close(recompute_log_probs(model, traj, train), traj.log_probs, rtol=1e-12, atol=1e-15)
    if log_prob == "squared_error":  # -(x - mean)^2 is never positive; the Gaussian density here is
        assert bool((traj.log_probs <= 0).all())


def test_tsp_errors():
    model = build_tiny_model("flux", dtype=torch.float64, latent_size=8)
    traj, cfg = _rollout(model)
    train = cfg.train_config(LossConfig())
    with pytest.raises(ValueError, match="degree must be >= 1"):
        tsp_backward(model, traj, train, 1.0, degree=0)
    traj.advantages = None
    with pytest.raises(ValueError, match="no advantages"):
        tsp_backward(model, traj, train, 1.0)


@pytest.mark.parametrize("world,degree,cap", [(3, None, None), (3, 1, None), (5, 3, 2), (20, None, None), (2, 2, 3)])
def test_rows_split_over_ranks_sum_to_the_single_process_gradient(world, degree, cap):
    """Each rank trains its share of the (sample x step) rows (``schedule.rows``), whatever the rank count:
    the ranks' gradients sum to the sequential one at float64, every row is counted once in the metrics,
    and every rank runs the same number of forwards (FSDP's collectives stay in step; a rank with fewer
    rows pads with zero-weight passes, e.g. 20 ranks for 16 rows)."""
    model = build_tiny_model("flux", dtype=torch.float64, latent_size=8)
    traj, cfg = _rollout(model)  # 4 samples x 4 trained steps = 16 rows
    _perturb(model)
    train, scale, seq, want = _sequential_reference(model, traj, cfg)
    forward, calls = model.velocity, []
    model.velocity = lambda *a, **k: calls.append(1) or forward(*a, **k)
    total, rows, clipped, per_rank = 0.0, 0, 0.0, []
    for rank in range(world):
        before = len(calls)
        m = tsp_backward(model, traj, train, scale, degree=degree, rank=rank, world=world, cap=cap)
        per_rank.append(len(calls) - before)
        total, rows, clipped = total + m.loss, rows + m.rows, clipped + m.clipped
    _assert_same_grads(want, _grads(model), rtol=0, atol=1e-12)
    assert rows == seq.rows == 16 and clipped == seq.clipped and abs(total - seq.loss) < 1e-12
    assert len(set(per_rank)) == 1, f"ranks ran different numbers of passes: {per_rank}"


@pytest.mark.parametrize("arch", ["flux", "wan"])
def test_recompute_in_the_loss_pass_equals_a_separate_recompute_pass(arch):
    """actor.recompute_log_prob: taking the old log-probs from the loss pass (detached) trains exactly as
    verl's recompute does (a no-grad pass with the same weights first, then the loss against it), TSP and
    the per-step loop alike; the ratio is 1 and the rollout's gap to it is what the metrics report."""
    from dataclasses import replace

    model = build_tiny_model(arch, dtype=torch.float64, latent_size=8)
    traj, cfg = _rollout(model)
    _perturb(model)  # the trainer's weights are not the rollout's: the two log-probs differ
    scale = 1.0 / (len(traj) * traj.num_trained_steps)
    separate = recompute_log_probs(model, traj, cfg.train_config(LossConfig()))
    gap = (traj.log_probs - separate).abs()
    assert float(gap.min()) > 0

    model.transformer.zero_grad()
    tsp_backward(model, replace(traj, log_probs=separate), cfg.train_config(LossConfig(clip_range=0.05)), scale,
                 degree=2)
    want = _grads(model)
    recompute = cfg.train_config(LossConfig(clip_range=0.05, recompute_old_log_prob=True))
    for train in (lambda: tsp_backward(model, traj, recompute, scale, degree=2),
                  lambda: sequential_backward(model, traj, recompute, scale)):
        model.transformer.zero_grad()
        got = train()
        _assert_same_grads(want, _grads(model), rtol=1e-10, atol=1e-13)
        s = got.summary()
        assert s["ratio_mean"] == s["ratio_max"] == s["ratio_min"] == 1.0 and s["clip_frac"] == 0.0
        assert s["rollout_logprob_diff_max"] == pytest.approx(float(gap.max()), rel=1e-9)
        assert s["rollout_logprob_diff_mean"] == pytest.approx(float(gap.mean()), rel=1e-9)
    model.transformer.zero_grad()
    rollout = tsp_backward(model, traj, cfg.train_config(LossConfig(clip_range=0.05)), scale, degree=2)
    assert "rollout_logprob_diff_mean" not in rollout.summary() and rollout.clipped > 0  # off: the rollout's
