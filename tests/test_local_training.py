"""The single-process GRPO loop learns, and the main entry validates its input."""

import pytest

from verl_digen.main import main, parse_config
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


def test_overrides_parse_and_bad_values_name_the_key():
    cfg = parse_config(["steps=3", "sampler.eta=0.5", "arch=sd3", "sampler.selection.k=2"])
    assert (cfg.steps, cfg.sampler.eta, cfg.arch, cfg.sampler.selection.k) == (3, 0.5, "sd3", 2)
    with pytest.raises(SystemExit, match="micro_batch_size=5"):
        parse_config(["micro_batch_size=5"])
    with pytest.raises(SystemExit, match="group_size"):
        parse_config(["group_size=1"])
    with pytest.raises(SystemExit, match="stepz"):
        parse_config(["stepz=3"])
    with pytest.raises(SystemExit, match="key=value"):
        parse_config(["--steps", "3"])


def test_main_prints_the_summary(capsys):
    main(["steps=2", "prompts_per_step=2", "group_size=2", "micro_batch_size=2"])
    out = capsys.readouterr().out
    assert "step 2/2" in out and "samples / second" in out
