"""Shared pieces of the worker tests: a tiny float64 config, worker groups, local reference batches."""

from __future__ import annotations

import ray
import torch
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

from verl_digen.algo.advantages import AdvantageConfig, group_advantages
from verl_digen.algo.loss import LossConfig
from verl_digen.algo.selection import StepSelection
from verl_digen.algo.trajectory import Trajectories
from verl_digen.rewards import build_reward
from verl_digen.rollout.sampler import SamplerConfig
from verl_digen.workers import policy as P
from verl_digen.workers.config import OptimConfig, PolicyConfig, WorkerConfig

PROMPTS = ["a red cube", "a blue sphere", "a green cone", "a white cat"]


def tiny_cfg(lora_rank: int = 0, kl_coef: float = 0.0, dtype: str = "float64", **kw) -> WorkerConfig:
    return WorkerConfig(
        policy=PolicyConfig(arch="flux", dtype=dtype, latent_size=8, lora_rank=lora_rank, seed=0),
        sampler=SamplerConfig(num_steps=4, eta=0.7, selection=StepSelection("first_k", k=2), decode=True),
        loss=LossConfig(clip_range=0.2, kl_coef=kl_coef),
        optim=OptimConfig(lr=1e-2, grad_clip=1.0),
        reward="latent_mean",
        seed=1,
        **kw,
    )


def rows_of(prompt_ids: list[int], n: int) -> tuple[list[tuple[int, int]], list[str]]:
    """(prompt_id, sample_id) rows of complete groups and each row's prompt text."""
    rows = [(p, s) for p in prompt_ids for s in range(n)]
    return rows, [PROMPTS[p % len(PROMPTS)] for p, _ in rows]


def make_groups(*specs: tuple[type, WorkerConfig, int]) -> list[RayWorkerGroup]:
    """One worker group per ``(cls, cfg, workers)``, their models started side by side as the driver's pools
    start theirs (each actor spends seconds importing verl and building its model)."""
    groups = [RayWorkerGroup(RayResourcePool([n], use_gpu=False, max_colocate_count=1),
                             RayClassWithInitArgs(cls=ray.remote(cls), cfg=cfg), device_name="cpu")
              for cls, cfg, n in specs]
    for refs in [wg.execute_all_async("init_model") for wg in groups]:
        ray.get(refs)
    return groups


def kill_group(wg: RayWorkerGroup) -> None:
    for w in wg.workers:
        ray.kill(w)
    for pg in wg.resource_pool.pgs or []:
        ray.util.remove_placement_group(pg)


def with_advantages(traj: Trajectories) -> Trajectories:
    traj.advantages, _ = group_advantages(traj.rewards, traj.prompt_ids, AdvantageConfig())
    return traj


def local_batch(model, cfg: WorkerConfig, step: int, version: int, prompt_ids: list[int], n: int) -> Trajectories:
    """A scored batch with advantages, generated in this process (the single-process reference)."""
    rows, prompts = rows_of(prompt_ids, n)
    traj = P.generate_rows(model, cfg, step, version, rows, prompts)
    return with_advantages(P.score_trajectories(build_reward(cfg.reward), traj))


def assert_trajectories_equal(a: Trajectories, b: Trajectories, atol: float = 0.0) -> None:
    assert a.prompts == b.prompts and a.global_step == b.global_step
    for name in ("prompt_ids", "sample_ids", "step_indices", "versions"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for name in ("sigmas", "sigmas_next", "states", "next_states", "log_probs", "final_latents"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=atol, msg=name)


def assert_state_equal(a: dict, b: dict, exact: bool = True, tol: float = 0.0) -> None:
    """Compare ``full_state`` dicts (params, grads, optim) tensor by tensor."""
    assert a.keys() == b.keys()
    for part in ("params", "grads", "optim"):
        assert a[part].keys() == b[part].keys(), part
        for name in a[part]:
            x, y = a[part][name], b[part][name]
            pairs = [(name, x, y)] if torch.is_tensor(x) else [(f"{name}.{k}", x[k], y[k]) for k in x]
            if not torch.is_tensor(x):
                assert x.keys() == y.keys(), name
            for label, u, v in pairs:
                if exact:
                    assert torch.equal(u, v), f"{part} {label} differs"
                else:
                    torch.testing.assert_close(u, v, rtol=0, atol=tol, msg=f"{part} {label}")
