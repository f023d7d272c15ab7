"""The single-process GRPO loop learns, and the main entry validates its input.

Why the learning tests are paired: one run's reward curve depends on the seed for reasons unrelated
to the update (the model's random init, which noise a step draws), so a threshold on one run's rise
is seed-dependent; the old test's ``rise > 4 x spread`` failed on seeds 0 and 1 after a harmless
change of the seed hash's separator. Here each seed trains twice from the same weights with the same
noise streams: once rewarded for a larger final-latent mean, once for a smaller one. Step 0 of the two
runs is then identical (checked exactly), so the gap that opens between them is caused by the updates
alone, and it is twice one run's effect. The gap is judged against its standard error, computed
conservatively (the runs treated as independent, a prompt's samples as one observation), with a wide
margin: over seeds 0..4 and with a changed seed separator the smallest gap measured was 31 standard
errors (full fine-tuning, 8 steps) against the 10 required (docs/testing.md).
"""

import math

import pytest

from verl_digen.driver.local import LocalRunConfig, run_local, summarize

pytestmark = pytest.mark.slow

GAP_Z = 10.0  # the up/down gap over its standard error
DIRECTION_Z = 5.0  # each run's own reward, last two steps vs first two, over its standard error


def _mean(xs):
    return sum(xs) / len(xs)


def _se(rows, prompts):
    """Standard error of the mean reward over ``rows`` (steps), one observation per prompt."""
    return math.sqrt(sum(r["reward_std"] ** 2 / prompts for r in rows)) / len(rows)


def paired_learning(seed: int, **overrides) -> dict:
    """Train up (reward = latent mean) and down (reward = -latent mean) from one seed; the statistics."""
    up_cfg = LocalRunConfig(seed=seed, **overrides)
    down_cfg = LocalRunConfig(seed=seed, reward={"latent_mean": -1.0}, **overrides)
    up = run_local(up_cfg, log=lambda _: None)
    down = run_local(down_cfg, log=lambda _: None)
    n = up_cfg.prompts_per_step
    latent_up = [r["reward_mean"] for r in up]
    latent_down = [-r["reward_mean"] for r in down]
    gap = [a - b for a, b in zip(latent_up, latent_down)]
    end = up[-2:] + down[-2:]
    out = {
        "up": up,
        "down": down,
        "gap": gap,
        # (mean of two up rows) - (mean of two down rows): twice the standard error of the four rows' mean
        "gap_z": _mean(gap[-2:]) / (2 * _se(end, n)),
    }
    for name, h in (("up", up), ("down", down)):
        rise = _mean([r["reward_mean"] for r in h[-2:]]) - _mean([r["reward_mean"] for r in h[:2]])
        out[f"{name}_z"] = rise / math.hypot(_se(h[:2], n), _se(h[-2:], n))
    return out


def check_learned(stats: dict, gap_z: float = GAP_Z, direction_z: float | None = DIRECTION_Z) -> None:
    assert stats["gap"][0] == 0.0, "the paired runs must share step 0 (same weights, same noise)"
    assert stats["gap_z"] > gap_z, stats["gap"]
    if direction_z is not None:
        assert stats["up_z"] > direction_z and stats["down_z"] > direction_z, (stats["up_z"], stats["down_z"])
    # one update per step on fresh samples: the PPO ratio stays near 1
    assert all(abs(r["ratio_mean"] - 1) < 0.05 for r in stats["up"] + stats["down"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mini_grpo_moves_the_latent_the_way_it_is_rewarded(seed):
    check_learned(paired_learning(seed, steps=8))


def test_lora_run_learns_with_adapters_only():
    # LoRA B starts at zero, so adapters need a larger step size than full fine-tuning. Adam's first
    # steps move every B entry by ~lr whatever its gradient's signal, so one direction alone is noisy:
    # with 4 prompts a step some seeds did not learn at all, and with 8 one direction of one seed still
    # stalled (z -1.2) while the paired gap stayed >= 9.5 standard errors (seeds 0, 1 x two separators).
    # So: 8 prompts a step, and the drift-free gap only, at z > 5.
    stats = paired_learning(0, steps=6, lora_rank=4, lr=0.1, tsp_degree=2, prompts_per_step=8)
    check_learned(stats, gap_z=5.0, direction_z=None)
    assert "reward (last quarter)" in summarize(stats["up"], 32)
