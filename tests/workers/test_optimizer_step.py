"""The trainer's optimizer step, in one process (no Ray): each global step's gradient is that step's alone.

Two global steps of ``TSPActorWorker.update`` + ``optimizer_step`` against a reference written here that
accumulates each step's gradient from zero, clips it and steps AdamW. Gradients carried over between steps
(a missing ``zero_grad``) make the second step differ.
"""

from __future__ import annotations

import pytest
import torch
from workers_helpers import local_batch, tiny_cfg

from verl_digen.algo.tsp import tsp_backward
from verl_digen.workers import policy as P
from verl_digen.workers.actor import TSPActorWorker

CFG = tiny_cfg()
K = CFG.sampler.selection.k


@pytest.fixture
def worker(monkeypatch):
    """A one-rank trainer built in this process (verl's Worker reads its rank from the environment)."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29533"}.items():
        monkeypatch.setenv(key, value)
    w = TSPActorWorker(CFG)
    w.init_model()
    return w


def _reference_steps(batches) -> dict[str, torch.Tensor]:
    """The global steps written out: zero the gradient, accumulate the step's rows, clip, step AdamW."""
    model = P.build_policy(CFG)
    model.transformer.train()
    params = [p for p in model.transformer.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=CFG.optim.lr, betas=tuple(CFG.optim.betas),
                            weight_decay=CFG.optim.weight_decay)
    for traj in batches:
        for p in params:
            p.grad = None
        tsp_backward(model, traj, CFG.sampler.train_config(CFG.loss), 1.0 / (len(traj) * K), degree=1)
        torch.nn.utils.clip_grad_norm_(params, CFG.optim.grad_clip)
        opt.step()
    return {n: p.detach().clone() for n, p in model.transformer.named_parameters() if p.requires_grad}


def test_each_optimizer_step_uses_only_its_own_steps_gradient(worker):
    gen = P.build_policy(CFG)  # the batches are sampled by the initial weights (the second one is stale)
    batches = [local_batch(gen, CFG, step, 0, [0, 1], 4) for step in range(2)]
    for traj in batches:
        worker.update(traj, 1.0 / (len(traj) * K))
        out = worker.optimizer_step()
        assert not out["skipped"]
    want = _reference_steps(batches)
    got = dict(worker.named_params)
    assert want.keys() == got.keys() and want
    for name, value in want.items():
        torch.testing.assert_close(got[name].detach(), value, rtol=0, atol=1e-12, msg=name)
    assert out["version"] == 2


def test_ema_equals_its_closed_form_and_travels_through_checkpoint_validation_and_export(monkeypatch, tmp_path):
    """actor.ema_decay: after n optimizer steps the EMA is d^n theta_0 + (1 - d) sum_i d^(n-i) theta_i over
    the saved parameter history; use_ema swaps it in and back bit-identically; a checkpoint carries it to a
    resumed trainer and to `digen export --ema` (and export_on_save writes both exports into the checkpoint)."""
    from dataclasses import replace

    import diffusers

    from verl_digen.config import checks, compose
    from verl_digen.workers.export import export_checkpoint

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29534"}.items():
        monkeypatch.setenv(key, value)
    decay = 0.7
    cfg = replace(CFG, optim=replace(CFG.optim, ema_decay=decay))
    worker = TSPActorWorker(cfg)
    worker.init_model()
    history = [{n: p.detach().clone() for n, p in worker.named_params}]
    gen = P.build_policy(cfg)
    for step in range(3):
        traj = local_batch(gen, cfg, step, 0, [0, 1], 4)
        worker.update(traj, 1.0 / (len(traj) * K))
        worker.optimizer_step()
        history.append({n: p.detach().clone() for n, p in worker.named_params})
    n = len(history) - 1
    for name in history[0]:
        closed = decay ** n * history[0][name] + (1 - decay) * sum(
            decay ** (n - i) * history[i][name] for i in range(1, n + 1))
        torch.testing.assert_close(worker.ema[name], closed, rtol=0, atol=1e-12, msg=name)
    assert any(not torch.equal(worker.ema[k], history[-1][k]) for k in history[0])  # it lags the weights

    worker.use_ema(True)
    assert all(torch.equal(p, worker.ema[name]) for name, p in worker.named_params)
    worker.use_ema(False)
    assert all(torch.equal(p, history[-1][name]) for name, p in worker.named_params)

    run_cfg = compose(["model.dtype=float64", "model.latent_size=8", "actor.ema_decay=0.7"])
    path = str(tmp_path / "global_step_3")
    worker.save_checkpoint(path, {"step": 3, "run_id": "r", "config": checks.fingerprint(run_cfg)}, export=True)
    resumed = TSPActorWorker(cfg)
    resumed.init_model()
    resumed.load_checkpoint(path)
    assert all(torch.equal(resumed.ema[k], worker.ema[k]) for k in worker.ema)
    export_checkpoint(path, tmp_path / "ema_out", ema=True)
    for out, want in ((tmp_path / "ema_out", worker.ema), (tmp_path / "global_step_3" / "export" / "ema", worker.ema),
                      (tmp_path / "global_step_3" / "export", history[-1])):
        loaded = diffusers.FluxTransformer2DModel.from_pretrained(out / "transformer", torch_dtype=torch.float64)
        state = dict(loaded.named_parameters())
        assert all(torch.equal(state[k], want[k]) for k in want), out


def _one_rank(monkeypatch, port: int) -> None:
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)


def test_every_mini_batch_recomputes_old_log_probs_with_the_steps_starting_weights_and_guidance(monkeypatch):
    """actor.recompute_log_prob with three mini-batches under guidance 3: the rows were sampled by the step's
    starting weights at guidance 3, so the old log-probs recomputed for mini-batches 2 and 3 (after one and
    two optimizer steps) must equal the rollout's exactly. Behaviour weights re-captured after each mini-batch,
    or a behaviour velocity without the configured guidance, make them differ."""
    from dataclasses import replace

    _one_rank(monkeypatch, 29535)
    cfg = replace(CFG, sampler=replace(CFG.sampler, guidance_scale=3.0),
                  loss=replace(CFG.loss, recompute_old_log_prob=True))
    worker = TSPActorWorker(cfg)
    worker.init_model()
    gen = P.build_policy(cfg)
    mini_batches = [local_batch(gen, cfg, 0, 0, [p], 4) for p in range(3)]
    diffs = []
    for i, traj in enumerate(mini_batches):
        out = worker.update(traj, 1.0 / (3 * len(traj) * K))
        diffs.append((out["rollout_diff_rows"], out["rollout_diff_max"]))
        step = worker.optimizer_step(ends_step=i == 2)
        assert not step["skipped"] and step["grad_norm"] > 0
    assert all(rows > 0 for rows, _ in diffs) and [d for _, d in diffs] == [0.0, 0.0, 0.0], diffs


def test_a_skipped_step_leaves_the_ema_where_it_was(monkeypatch):
    """A step skipped for a non-finite loss leaves the weights as they were, and so their EMA: an EMA updated
    anyway would move towards the (lagged-behind) weights."""
    from dataclasses import replace

    _one_rank(monkeypatch, 29536)
    cfg = replace(CFG, optim=replace(CFG.optim, ema_decay=0.7))
    worker = TSPActorWorker(cfg)
    worker.init_model()
    gen = P.build_policy(cfg)
    worker.update(local_batch(gen, cfg, 0, 0, [0, 1], 4), 1.0 / (8 * K))
    assert not worker.optimizer_step()["skipped"]
    ema = {n: e.clone() for n, e in worker.ema.items()}
    params = {n: p.detach().clone() for n, p in worker.named_params}
    assert any(not torch.equal(ema[n], params[n]) for n in ema)  # the EMA lags: an update would move it
    traj = local_batch(gen, cfg, 1, 0, [0, 1], 4)
    traj = replace(traj, advantages=torch.full_like(traj.advantages, float("nan")))
    worker.update(traj, 1.0 / (8 * K))
    out = worker.optimizer_step()
    assert out["skipped"] and out["nonfinite"] == "loss"
    assert all(torch.equal(p, params[n]) for n, p in worker.named_params)
    assert all(torch.equal(worker.ema[n], ema[n]) for n in ema)
