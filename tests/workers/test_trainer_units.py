"""A trainer rank's pieces in one process, without Ray: the exact-state snapshot the bit-identity tests and
checkpoints read (``TSPActorWorker.full_state``), the mode guard, the KL reference, the memory config's FSDP2
decision, the process group a rank joins and gradient clipping (workers/actor.py, actor_memory.py, config.py,
fsdp.py). Float64 tiny models."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
import torch
from workers_helpers import local_batch, tiny_cfg

from verl_digen.workers import actor_memory, fsdp
from verl_digen.workers import policy as P
from verl_digen.workers.actor import TSPActorWorker
from verl_digen.workers.config import ActorMemoryConfig

CFG = tiny_cfg()
K = CFG.sampler.selection.k


def _one_rank(monkeypatch, port: int) -> None:
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def worker(monkeypatch):
    _one_rank(monkeypatch, 29541)
    w = TSPActorWorker(CFG)
    w.init_model()
    return w


# -- full_state ------------------------------------------------------------------------------------------------
def test_full_state_is_a_detached_copy_of_params_grads_and_optimizer_state(worker):
    gen = P.build_policy(CFG)
    worker.update(local_batch(gen, CFG, 0, 0, [0, 1], 2), 1.0 / (4 * K))
    worker.optimizer_step()
    worker.update(local_batch(gen, CFG, 1, 0, [0, 1], 2), 1.0 / (4 * K))  # a gradient pending
    name0, p0 = worker.named_params[0]
    worker.optimizer.state[p0]["note"] = 3  # a Python scalar in the state (a resumed foreign optimizer's)
    state = worker.full_state()
    assert set(state) == {"params", "grads", "optim", "version", "ema"} and state["version"] == 1
    assert state["ema"] is None  # no actor.ema_decay; no DiffusionNFT old copy: no "old" key at all
    for name, p in worker.named_params:
        assert torch.equal(state["params"][name], p.detach()) and state["params"][name].data_ptr() != p.data_ptr()
        assert torch.equal(state["grads"][name], p.grad) and state["grads"][name].data_ptr() != p.grad.data_ptr()
        live = worker.optimizer.state[p]
        assert set(state["optim"][name]) == set(live) >= {"step", "exp_avg", "exp_avg_sq"}
        for k, v in live.items():
            if torch.is_tensor(v):  # copies, not the live tensors the next step changes in place
                assert torch.equal(state["optim"][name][k], v) and state["optim"][name][k].data_ptr() != v.data_ptr()
    assert state["optim"][name0]["note"] == 3
    worker.dist_rank = 1  # only rank 0 returns the gathered state
    assert worker.full_state() is None


def test_full_state_carries_the_ema_and_diffusion_nfts_old_copy(worker):
    worker.ema = {n: p.detach() * 2 for n, p in worker.named_params}
    worker.old = {n: p.detach() * 3 for n, p in worker.named_params}
    state = worker.full_state()
    for name, p in worker.named_params:
        assert torch.equal(state["ema"][name], p.detach() * 2) and torch.equal(state["old"][name], p.detach() * 3)


# -- guards and the KL reference -------------------------------------------------------------------------------
def test_calls_before_init_model_or_in_generation_mode_are_refused(monkeypatch):
    _one_rank(monkeypatch, 29542)
    w = TSPActorWorker(CFG)
    with pytest.raises(RuntimeError, match="init_model"):
        w._require()
    w.init_model()
    assert w.sync_counters() == {"sent": 0, "received": 0}  # no sync group joined yet
    with pytest.raises(RuntimeError, match="join_sync_group must be called"):
        w.send_weights_to(1, 0)
    w._sync = object()  # joined, but nothing staged
    with pytest.raises(RuntimeError, match="version 0 is not staged"):
        w.send_weights_to(1, 0)

    class Group:  # records the serve of a staged version
        def serve(self, dst, version, plan, bucket, **kw):
            self.served = (dst, version, plan, bucket(0, 0), kw)
            return {"device_to_device": 8}

    w._sync, w._staged = Group(), (1, "plan", ["bucket 0"])
    with pytest.raises(RuntimeError, match=r"version 0 is not staged \(staged: 1\)"):
        w.send_weights_to(1, 0)
    assert w.send_weights_to(2, 1) == {"version": 1, "moved": {"device_to_device": 8}}
    assert w._sync.served == (2, 1, "plan", "bucket 0", {"source": 0, "sources": 1, "verify_payload": False})
    w.dist_rank, w.dist_world, w.cfg = 1, 2, replace(w.cfg, sync_verify_payload=True)  # this rank's share, checked
    w.send_weights_to(0, 1)
    assert w._sync.served[-1] == {"source": 1, "sources": 2, "verify_payload": True}
    w._mode = "generate"
    with pytest.raises(RuntimeError, match="switch_to_train"):
        w._require()
    w._require("generate")  # a generation-mode call is fine there


def test_a_fresh_ranks_first_non_finite_loss_is_named_and_skipped(worker):
    gen = P.build_policy(CFG)
    traj = local_batch(gen, CFG, 0, 0, [0, 1], 2)
    traj = replace(traj, advantages=torch.full_like(traj.advantages, float("nan")))
    worker.update(traj, 1.0 / (4 * K))
    out = worker.optimizer_step()
    assert out["skipped"] and out["nonfinite"] == "loss"


def test_a_kl_reference_is_the_frozen_initial_policy_for_any_positive_coefficient(monkeypatch):
    _one_rank(monkeypatch, 29543)
    cfg = tiny_cfg(kl_coef=0.5)
    cfg = replace(cfg, sampler=replace(cfg.sampler, guidance_scale=3.0))  # the reference under the run's guidance
    w = TSPActorWorker(cfg)
    w.init_model()
    ref = w._reference()
    assert ref is not None and w.ref_model is not None
    base = P.build_policy(cfg)
    x = torch.randn(2, *base.latent_shape, dtype=torch.float64)
    s = torch.full((2,), 0.5, dtype=torch.float64)
    cond = base.encode_prompts(["a red cube", "two cats"])
    g = w.train_cfg.guidance_scale
    assert g == 3.0 and torch.equal(ref(x, s, cond), base.velocity(x, s, cond, g))
    assert actor_memory.reference_policy(cfg, torch.device("cpu"), 1, False) is not None
    for off in (tiny_cfg(kl_coef=0.0), tiny_cfg(kl_coef=0.5, lora_rank=2)):  # no KL; LoRA: adapters off, no copy
        assert actor_memory.reference_policy(off, torch.device("cpu"), 1, False) is None


def test_the_trainer_stores_its_policy_in_the_master_dtype():
    cfg = replace(tiny_cfg(dtype="float32"), memory=ActorMemoryConfig(master_dtype="float64"))
    model = actor_memory.trainer_policy(cfg, torch.device("cpu"), 1, sharded=False)
    assert {p.dtype for p in model.transformer.parameters()} == {torch.float64}
    assert model.transformer.training


def test_the_kl_reference_is_built_in_the_compute_dtype():
    cfg = replace(tiny_cfg(kl_coef=0.5), memory=ActorMemoryConfig(param_dtype="float32"))
    ref = actor_memory.reference_policy(cfg, torch.device("cpu"), 1, sharded=False)
    assert {p.dtype for p in ref.transformer.parameters()} == {torch.float32}


@pytest.mark.parametrize("memory,dtype,mixed,fsdp_needed", [
    (ActorMemoryConfig(), "float32", False, False),
    (ActorMemoryConfig(param_dtype="bfloat16"), "float32", True, True),  # computes in another dtype only
    (ActorMemoryConfig(reduce_dtype="bfloat16"), "float32", True, True),  # reduces in another dtype only
    (ActorMemoryConfig(param_dtype="bfloat16"), "bfloat16", False, False),  # the model's own dtype: no cast
    (ActorMemoryConfig(param_offload=True), "float32", False, True),  # offload is an FSDP2 policy too
])
def test_fsdp2_is_needed_for_mixed_precision_or_offload(memory, dtype, mixed, fsdp_needed):
    assert memory.mixed(dtype) is mixed and memory.needs_fsdp(dtype) is fsdp_needed


# -- the process group -----------------------------------------------------------------------------------------
@pytest.fixture
def recorded_init(monkeypatch):
    calls = []
    monkeypatch.setattr(fsdp.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(fsdp.dist, "init_process_group", lambda **kw: calls.append(kw))
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    return calls


def test_a_one_rank_pool_joins_no_group_unless_forced(recorded_init):
    assert fsdp.init_distributed(torch.device("cpu")) == (0, 1) and recorded_init == []
    assert fsdp.init_distributed(torch.device("cpu"), timeout_s=7.0, force=True) == (0, 1)
    ((kw),) = recorded_init  # a one-rank group on an in-process store: no port, no rendezvous
    assert kw["backend"] == "gloo" and kw["rank"] == 0 and kw["world_size"] == 1
    assert kw["timeout"] == timedelta(seconds=7.0) and isinstance(kw["store"], torch.distributed.HashStore)


def test_a_rank_joins_the_pools_group_from_the_environment(recorded_init, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert fsdp.init_distributed(torch.device("cpu"), timeout_s=9.0) == (2, 3)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert fsdp.init_distributed(torch.device("cpu"), timeout_s=9.0) == (2, 2)  # two ranks need a group too
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert fsdp.init_distributed(torch.device("cuda")) == (2, 3)  # a GPU pool: NCCL (the call is recorded)
    assert recorded_init == [dict(backend="gloo", rank=2, world_size=3, timeout=timedelta(seconds=9.0)),
                             dict(backend="gloo", rank=2, world_size=2, timeout=timedelta(seconds=9.0)),
                             dict(backend="nccl", rank=2, world_size=3, timeout=timedelta(seconds=600.0))]
    monkeypatch.setattr(fsdp.dist, "is_initialized", lambda: True)  # already in a group: left alone
    assert fsdp.init_distributed(torch.device("cpu")) == (2, 3) and len(recorded_init) == 3


# -- gradient clipping -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_norm", [0.5, 1.0, 4.0, 0.0, None, -1.0])
def test_clip_grad_norm_returns_the_norm_and_clips_to_a_positive_bound_only(max_norm):
    torch.manual_seed(0)
    params = [torch.zeros(3, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    params[0].grad, params[1].grad = torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64), torch.full(
        (3,), 0.0, dtype=torch.float64)
    params[1].grad[0] = 4.0  # norms 3 and 4: total 5; the third parameter has no gradient
    want = [p.grad.clone() for p in params[:2]]
    total = fsdp.clip_grad_norm(params, max_norm, torch.device("cpu"))
    assert total == 5.0 and params[2].grad is None
    scale = min(1.0, max_norm / (5.0 + 1e-6)) if max_norm and max_norm > 0 else 1.0
    for p, g in zip(params[:2], want):
        torch.testing.assert_close(p.grad, g * scale, rtol=1e-15, atol=0)


def test_full_tensor_is_a_detached_cpu_copy():
    t = torch.arange(3.0, dtype=torch.float64, requires_grad=True)
    c = fsdp.full_tensor(t)
    assert torch.equal(c, t.detach()) and not c.requires_grad and c.device.type == "cpu"
    assert c.data_ptr() != t.data_ptr()  # a copy: the snapshot survives the next in-place step

