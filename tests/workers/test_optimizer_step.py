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
