"""MixGRPO (algo/mix_grpo.py): the sliding window's schedule against verl-omni's own function, the rollout's ODE
steps outside the window and SDE steps inside it (float64), and the planner pricing the window's rows."""

from __future__ import annotations

import ast
import random

import pytest
import torch

from verl_digen.algo.mix_grpo import MixWindow
from verl_digen.algo.sde import sde_step
from verl_digen.algo.selection import StepSelection
from verl_digen.config.schema import compose
from verl_digen.models import build_tiny_model
from verl_digen.rollout.sampler import SamplerConfig, initial_noise, sample_trajectories

ADAPTER = "verl_omni/pipelines/qwen_image_mix_grpo/vllm_omni_rollout_adapter.py"


@pytest.fixture(scope="module")
def omni_window(tmp_path_factory):
    """verl-omni's ``_maybe_make_progressive_window``, its source as the snapshot has it (the module around it
    imports vLLM-Omni, so the one function is compiled alone, with the ``random`` it imports as ``_random``)."""
    from verl_omni_helpers import SKIP_REASON, snapshot_file, tarballs_present

    if not tarballs_present():
        pytest.skip(SKIP_REASON)
    source = snapshot_file(ADAPTER, tmp_path_factory.mktemp("mix")).read_text()
    fn = next(n for n in ast.walk(ast.parse(source))
              if isinstance(n, ast.FunctionDef) and n.name == "_maybe_make_progressive_window")
    fn.decorator_list = []
    namespace = {"_random": random, "Any": object}
    exec(compile(ast.Module([fn], []), ADAPTER, "exec"), namespace)  # noqa: S102 (verl-omni's own code)
    return namespace["_maybe_make_progressive_window"]


def _omni_start(fn, strategy: str, size: int, lo_hi: list[int], global_steps: int, iters: int, seed: int) -> int:
    """The start verl-omni's rollout uses: the adapter collapses the range, then the base pipeline draws
    ``torch.randint(lo, hi - size + 1)`` from it (one value left)."""
    extra = {"sample_strategy": strategy, "sde_window_size": size, "sde_window_range": list(lo_hi),
             "global_steps": global_steps, "iters_per_group": iters, "sde_window_seed": seed}
    fn(extra, {})
    lo, hi = extra["sde_window_range"]
    return int(torch.randint(lo, hi - size + 1, (1,), generator=torch.Generator().manual_seed(0)).item())


@pytest.mark.parametrize("strategy, size, lo_hi, iters, seed", [
    ("random", 2, [0, 5], 1, 42),  # verl-omni's Qwen-Image example
    ("random", 3, [1, 10], 1, 0),
    ("progressive", 2, [0, 10], 1, 0),
    ("progressive", 4, [0, 50], 25, 0),  # the tuning guide's long trajectory
    ("progressive", 2, [3, 9], 3, 0),
])
def test_window_schedule_equals_verl_omnis_over_many_steps(omni_window, strategy, size, lo_hi, iters, seed):
    sel = StepSelection("window", k=size, window_range=tuple(lo_hi), mix=MixWindow(strategy, iters, seed))
    ours = [sel.window(lo_hi[1], 0, s) for s in range(120)]
    theirs = [_omni_start(omni_window, strategy, size, lo_hi, s + 1, iters, seed) for s in range(120)]
    assert [a for a, _ in ours] == theirs
    assert all(b - a == size for a, b in ours)
    assert len({a for a, _ in ours}) > 1  # the window really slides


def test_progressive_formula_by_hand():
    # T=10, w=2, iters_per_group=3: verl-omni's global step g = s + 1; l = min(2 * (g // 3), 8)
    sel = StepSelection("window", k=2, mix=MixWindow("progressive", 3))
    assert [sel.window(10, 0, s)[0] for s in range(15)] == [0, 0, 2, 2, 2, 4, 4, 4, 6, 6, 6, 8, 8, 8, 8]
    assert sel.select(10, 0, 4, [0, 1], [0, 0]).tolist() == [[2, 3], [2, 3]]
    with pytest.raises(ValueError, match="window_start"):
        StepSelection("window", k=2, window_start=1, mix=MixWindow()).num_trained(10)


def test_rollout_takes_ode_steps_outside_the_window_and_sde_steps_inside_it():
    """float64: the stored window starts where Euler ODE steps from x_T lead, its transitions are SDE steps (log-prob
    of the drawn next state, which the ODE would not reach), and the final latent is the ODE on from the window."""
    model = build_tiny_model("flux", dtype=torch.float64, latent_size=8)
    t, w, step = 8, 3, 1
    sampler = SamplerConfig(num_steps=t, eta=0.7, decode=False,
                            selection=StepSelection("window", k=w, mix=MixWindow("progressive", 2)))
    prompts = ["a cat", "a dog"]
    cond = model.encode_prompts(prompts)
    traj = sample_trajectories(model, cond, prompts, [0, 1], [0, 0], sampler, seed=5, step=step, version=0)
    lo, hi = sampler.selection.window(t, 5, step)
    assert (lo, hi) == (3, 6)  # verl-omni's global step 2: min(3 * (2 // 2), 8 - 3); ODE steps on both sides
    assert traj.step_indices.tolist() == [list(range(lo, hi))] * 2
    sig = sampler.sigmas(torch.float64)

    def euler(x, i):
        v = model.velocity(x, sig[i].expand(2), cond, 1.0)
        return x + (sig[i + 1] - sig[i]) * v

    with torch.no_grad():
        x = initial_noise(tuple(model.latent_shape), [0, 1], [0, 0], 5, step, torch.float64)
        for i in range(lo):
            x = euler(x, i)
        torch.testing.assert_close(traj.states[:, 0], x, rtol=0, atol=1e-12)
        for j, i in enumerate(range(lo, hi)):
            xs, xn = traj.states[:, j], traj.next_states[:, j]
            assert (xn - euler(xs, i)).abs().max() > 1e-3  # noise was injected
            v = model.velocity(xs, sig[i].expand(2), cond, 1.0)
            lp = sde_step("flow_grpo", xs, v, sig[i].expand(2), sig[i + 1].expand(2), 0.7, prev=xn,
                          sigma_max=sig[1]).log_prob
            torch.testing.assert_close(traj.log_probs[:, j], lp, rtol=0, atol=1e-10)
        x = traj.next_states[:, -1]
        for i in range(hi, t):
            x = euler(x, i)
        torch.testing.assert_close(traj.final_latents, x, rtol=0, atol=1e-12)


def test_planner_prices_the_window_rows():
    """A preset re-derived for a mix_grpo run trains K = the window's steps per sample: the update's rows and
    seconds grow with the window, the generation (T forwards, ODE or SDE) does not."""
    from verl_digen.config.plan import cluster

    def model(window: int):
        cfg = compose(["algorithm.name=mix_grpo", "rollout.num_steps=10", f"rollout.train_steps={window}",
                       "digen.profile=qwen-image-20b-16", "resources.generator.workers=8",
                       "resources.trainer.workers=8"])
        return cluster(cfg)[0]

    small, large = model(2), model(4)
    assert (small.steps_trained, large.steps_trained) == (2, 4)
    a, b = small.stage_costs(8), large.stage_costs(8)
    assert a.generate == b.generate
    assert b.update > 1.5 * a.update
