"""The single-process GRPO loop learns, and the main entry validates its input."""

import pytest

from verl_digen.trainer.local import LocalRunConfig, run_local, summarize


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mini_grpo_raises_the_learnable_reward(seed):
    cfg = LocalRunConfig(steps=8, seed=seed)
    history = run_local(cfg, log=lambda _: None)
    start = sum(r["reward_mean"] for r in history[:2]) / 2
    end = sum(r["reward_mean"] for r in history[-2:]) / 2
    noise = max(r["reward_std"] for r in history)
    # the rise must be far beyond the within-step spread of the reward
    assert end - start > 4 * noise, (start, end, noise)
    assert all(abs(r["ratio_mean"] - 1) < 0.05 for r in history)


def test_lora_run_learns_with_adapters_only():
    # LoRA B starts at zero, so adapters need a larger step size than full fine-tuning
    history = run_local(LocalRunConfig(steps=6, lora_rank=4, lr=0.1, tsp_degree=2), log=lambda _: None)
    assert history[-1]["reward_mean"] - history[0]["reward_mean"] > 4 * history[0]["reward_std"]
    assert "reward (last quarter)" in summarize(history, 16)
