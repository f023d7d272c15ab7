"""A single-process GRPO loop: rollout, reward, group advantages, TSP update, in one Python process.

This is the algorithm with no distribution at all: the reference the distributed runtime is held
against, the proof that the RL math learns, and the embedded default run on a laptop.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from verl_digen import dtypes
from verl_digen.algo.advantages import AdvantageConfig, group_advantages
from verl_digen.algo.loss import LossConfig
from verl_digen.algo.tsp import TrainMetrics, tsp_backward
from verl_digen.data import PromptDataset
from verl_digen.models.base import DiffusionModel
from verl_digen.rewards import DEFAULT_LEARNABLE_REWARD, Rows, build_reward
from verl_digen.rollout.sampler import SamplerConfig, sample_trajectories


@dataclass
class LocalRunConfig:
    """Settings of a single-process run (names follow the distributed config where they can)."""

    arch: str = "flux"
    steps: int = 10
    prompts_per_step: int = 4
    group_size: int = 4
    micro_batch_size: int = 8
    tsp_degree: int | None = None
    lr: float = 3e-3
    grad_clip: float = 1.0
    seed: int = 0
    dtype: str = "float32"
    reward: str = DEFAULT_LEARNABLE_REWARD
    lora_rank: int = 0
    sampler: SamplerConfig = field(default_factory=SamplerConfig)  # the run config's defaults
    loss: LossConfig = field(default_factory=LossConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)

    def validate(self) -> None:
        self.sampler.validate()
        batch = self.prompts_per_step * self.group_size
        for name in ("steps", "prompts_per_step", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for GRPO advantages, got {self.group_size}")
        if batch % self.micro_batch_size:
            raise ValueError(
                f"micro_batch_size={self.micro_batch_size} must divide the step batch "
                f"prompts_per_step x group_size = {batch}"
            )
        dtypes.canonical(self.dtype)  # ValueError naming the accepted spellings
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


def build_policy(cfg: LocalRunConfig) -> DiffusionModel:
    """The tiny random-weight model of ``cfg.arch`` (with LoRA when ``lora_rank > 0``)."""
    from verl_digen.models import apply_lora, build_tiny_model

    model = build_tiny_model(cfg.arch, dtype=getattr(torch, dtypes.canonical(cfg.dtype)), seed=cfg.seed)
    if cfg.lora_rank > 0:
        apply_lora(model, rank=cfg.lora_rank, alpha=2 * cfg.lora_rank)
    return model


def _rollout(cfg: LocalRunConfig, dataset: PromptDataset, model, reward, step: int):
    """Step ``step``'s trajectories, scored and with their group advantages; and when generation ended."""
    ids, prompts = dataset.batch(step * cfg.prompts_per_step, cfg.prompts_per_step)
    prompt_ids = [i for i in ids for _ in range(cfg.group_size)]
    sample_ids = [j for _ in ids for j in range(cfg.group_size)]
    rows_prompts = [p for p in prompts for _ in range(cfg.group_size)]
    model.transformer.eval()
    cond = model.encode_prompts(prompts).repeat_interleave(cfg.group_size)
    traj = sample_trajectories(model, cond, rows_prompts, prompt_ids, sample_ids, cfg.sampler,
                               cfg.seed, step, version=step)
    t_gen = time.perf_counter()
    with torch.no_grad():
        rows = Rows("train", tuple(prompt_ids))
        traj.rewards = reward(traj.images, traj.prompts, traj.final_latents, rows=rows).to(torch.float64)
    traj.advantages, _ = group_advantages(traj.rewards, traj.prompt_ids, cfg.advantage)
    return traj, t_gen


def run_local(
    cfg: LocalRunConfig, dataset: PromptDataset | None = None, log=print
) -> list[dict[str, float]]:
    """Train for ``cfg.steps`` global steps; returns one metrics dict per step."""
    cfg.validate()
    torch.manual_seed(cfg.seed)
    dataset = dataset or PromptDataset.synthetic()
    model = build_policy(cfg)
    reward = build_reward(cfg.reward)
    params = [p for p in model.transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    train_cfg = cfg.sampler.train_config(cfg.loss)
    batch = cfg.prompts_per_step * cfg.group_size
    k = cfg.sampler.validate()
    history = []
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        traj, t_gen = _rollout(cfg, dataset, model, reward, step)
        t_score = time.perf_counter()
        model.transformer.train()
        optimizer.zero_grad(set_to_none=True)
        metrics = TrainMetrics()
        for start in range(0, batch, cfg.micro_batch_size):
            mb = traj.index(list(range(start, start + cfg.micro_batch_size)))
            metrics.merge(tsp_backward(model, mb, train_cfg, scale=1.0 / (batch * k), degree=cfg.tsp_degree))
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        t_end = time.perf_counter()
        row = {
            "step": step,
            "reward_mean": float(traj.rewards.mean()),
            "reward_std": float(traj.rewards.std()),
            "grad_norm": float(grad_norm),
            "gen_s": t_gen - t0,
            "score_s": t_score - t_gen,
            "update_s": t_end - t_score,
            "step_s": t_end - t0,
            **metrics.summary(),
        }
        history.append(row)
        log(
            f"step {step + 1}/{cfg.steps}  reward {row['reward_mean']:+.4f} ± {row['reward_std']:.4f}  "
            f"loss {row['loss']:+.4f}  clip {row['clip_frac']:.2f}  kl {row['approx_kl']:.2e}  "
            f"{row['step_s']:.2f}s"
        )
    return history


def summarize(history: list[dict[str, float]], samples_per_step: int) -> str:
    """The closing table: throughput and reward at start vs end."""
    if not history:
        return "no steps were run"
    first = history[: max(1, len(history) // 4)]
    last = history[-max(1, len(history) // 4):]
    mean = lambda rows, key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    step_s = mean(history, "step_s")
    lines = [
        f"{'metric':<28}{'value':>14}",
        f"{'steps':<28}{len(history):>14d}",
        f"{'mean step time (s)':<28}{step_s:>14.3f}",
        f"{'samples / second':<28}{samples_per_step / step_s:>14.2f}",
        f"{'gen / score / update (s)':<28}"
        f"{mean(history, 'gen_s'):>6.2f}/{mean(history, 'score_s'):.2f}/{mean(history, 'update_s'):.2f}",
        f"{'reward (first quarter)':<28}{mean(first, 'reward_mean'):>14.4f}",
        f"{'reward (last quarter)':<28}{mean(last, 'reward_mean'):>14.4f}",
    ]
    if any(math.isnan(r["reward_mean"]) for r in history):
        lines.append("warning: NaN rewards were produced")
    return "\n".join(lines)
