"""The validation pass: ``data.val_files`` scored every ``trainer.test_freq`` steps and after the last one.

Validation is a barrier, as in verl's trainer: the run is cut into segments at the validation steps,
each segment runs to its last optimizer step (the pipeline drains), the weights of that version go to
the generators (which the next segment needs anyway), and every generator samples and scores its
contiguous share of the validation prompts, one sample each, on a fixed seed stream
(``policy.VALIDATION_STEP``): two validations of the same weights give the same samples. The colocated
baseline validates on its own ranks. The pass is timed (``val/seconds``) but outside every step's
window, so step times and pool-busy fractions stay those of training.

Outputs: ``val/reward_mean``, ``val/reward_std`` and ``val/<component>_mean`` through verl's Tracking
(and ``<trace_dir>/val/<mode>_val.jsonl``), and a grid of the first ``trainer.log_val_generations``
samples, each captioned with its prompt and reward, as ``<trace_dir>/val/<mode>_step_<N>.png``, a
tensorboard image and a wandb image.
"""

from __future__ import annotations

import math
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from verl_digen.data import load_prompts
from verl_digen.reporting import metric_names as names
from verl_digen.reporting import run_log


def validation_steps(start: int, total: int, freq: int) -> list[int]:
    """Global steps after which validation runs in a run from ``start`` to ``total``: every multiple of
    ``freq`` and the last step (none when ``freq <= 0``)."""
    if freq <= 0 or total <= start:
        return []
    steps = [s for s in range(start + 1, total + 1) if s % freq == 0]
    return steps if steps and steps[-1] == total else [*steps, total]


def segments(start: int, total: int, freq: int) -> list[int]:
    """Step counts of the run's segments (each ends at a validation step or at ``total``)."""
    ends = validation_steps(start, total, freq) or ([total] if total > start else [])
    return [end - begin for begin, end in zip([start, *ends], ends)]


def image_grid(images: torch.Tensor, columns: int | None = None, pad: int = 2) -> torch.Tensor:
    """uint8 (N, H, W, 3) images tiled row-major into one uint8 (H', W', 3) image (white padding)."""
    _check_images(images)
    n, h, w, _ = images.shape
    cols = columns or math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    grid = torch.full((rows * (h + pad) + pad, cols * (w + pad) + pad, 3), 255, dtype=torch.uint8)
    for i in range(n):
        r, c = divmod(i, cols)
        y, x = pad + r * (h + pad), pad + c * (w + pad)
        grid[y:y + h, x:x + w] = images[i]
    return grid


#: a tile's shorter side is at least this many pixels (a tiny model's 16 x 16 sample is scaled up by a
#: whole factor, pixel for pixel, so its caption has room); larger samples keep their resolution
MIN_TILE = 160
PROMPT_LINES = 2  # the prompt's lines under a tile; the reward takes a third
LINE_PX = 12  # PIL's built-in bitmap font: 11 px a line, about 6 px a character


def _check_images(images: torch.Tensor) -> None:
    if images.dim() != 4 or images.shape[-1] != 3 or images.dtype != torch.uint8:
        raise ValueError(f"expected uint8 images of shape (N, H, W, 3), got {images.dtype} {tuple(images.shape)}")


def captioned_grid(images: torch.Tensor, prompts: list[str], rewards: list[float], columns: int | None = None,
                   pad: int = 4) -> torch.Tensor:
    """uint8 (N, H, W, 3) samples as one uint8 (H', W', 3) image: a tile per sample at its own resolution
    (a tiny one scaled up by a whole factor to ``MIN_TILE``) with its prompt and reward written under it,
    tiled by :func:`image_grid`."""
    import numpy as np
    from PIL import Image, ImageDraw

    _check_images(images)
    n, h, w, _ = images.shape
    if not len(prompts) == len(rewards) == n:
        raise ValueError(f"{n} images need as many prompts and rewards, got {len(prompts)} and {len(rewards)}")
    scale = max(1, math.ceil(MIN_TILE / min(h, w)))
    th, tw = h * scale, w * scale
    strip = (PROMPT_LINES + 1) * LINE_PX + 4
    width = max(8, tw // 6)  # characters a line holds
    tiles = []
    for image, prompt, reward in zip(images.repeat_interleave(scale, 1).repeat_interleave(scale, 2), prompts,
                                     rewards, strict=True):
        tile = Image.new("RGB", (tw, th + strip), "white")
        tile.paste(Image.fromarray(image.numpy()), (0, 0))
        lines = textwrap.wrap(prompt, width, max_lines=PROMPT_LINES, placeholder="...") or [""]
        draw = ImageDraw.Draw(tile)
        for j, line in enumerate([*lines, f"reward {reward:+.4f}"]):
            draw.text((0, th + 2 + j * LINE_PX), line, fill="black")
        tiles.append(torch.from_numpy(np.asarray(tile).copy()))
    return image_grid(torch.stack(tiles), columns, pad)


def save_png(grid: torch.Tensor, path: str | Path) -> Path:
    """Write a uint8 (H, W, 3) image as PNG (atomically: a reader never sees half a file)."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    Image.fromarray(grid.numpy()).save(tmp, format="PNG")
    tmp.replace(path)
    return path


def log_images(tracking: Any, grid: torch.Tensor, step: int, caption: str, tag: str = names.VAL_IMAGES) -> list[str]:
    """Send the grid to the image-capable Tracking backends in use (tensorboard, wandb); returns their
    names. Other backends (console, file) get the scalar metrics only."""
    loggers = getattr(tracking, "logger", {}) or {}
    sent = []
    if "tensorboard" in loggers:
        writer = loggers["tensorboard"].writer
        writer.add_image(tag, grid.numpy(), step, dataformats="HWC")
        writer.flush()
        sent.append("tensorboard")
    if "wandb" in loggers:
        wandb = loggers["wandb"]
        wandb.log({tag: [wandb.Image(grid.numpy(), caption=caption)]}, step=step)
        sent.append("wandb")
    return sent


@dataclass
class ValidationResult:
    """One validation pass: its global step, metrics and where its image grid went."""

    step: int
    metrics: dict[str, float]
    rewards: dict[int, float] = field(default_factory=dict)  # validation prompt index -> reward
    png: str | None = None


class Validator:
    """Runs validation passes of one run (see the module docstring)."""

    def __init__(self, cfg: Any, keep_through: int = 0, run_id: str = "") -> None:
        """``keep_through``: the step a resumed run continues from (its earlier rows are kept); ``run_id``
        goes on every row, as on the training metrics'."""
        self.cfg = cfg
        self.prompts = load_prompts(cfg.data.val_files, cfg.data.prompt_key)
        self.keep = max(int(cfg.trainer.log_val_generations), 0)
        t = cfg.trainer
        self.dir = Path(t.trace_dir, "val") if t.trace_dir else None
        self.history = (run_log.MetricsLog(self.dir / f"{t.mode}_val.jsonl", keep_through, run_id=run_id)
                        if self.dir is not None else None)

    def shares(self, workers: int) -> list[tuple[list[tuple[int, int]], list[str], int]]:
        """(rows, texts, images to keep) per worker: contiguous near-equal shares of the prompts, one
        sample each; the first ``log_val_generations`` rows keep their images."""
        n = len(self.prompts)
        bounds = [n * i // workers for i in range(workers + 1)]
        out = []
        for lo, hi in zip(bounds, bounds[1:]):
            rows = [(p, 0) for p in range(lo, hi)]
            out.append((rows, self.prompts[lo:hi], max(0, min(hi, self.keep) - lo)))
        return out

    def run(self, workers: list, step: int, version: int, tracking: Any | None = None) -> ValidationResult:
        """Validate ``version`` (the weights after global step ``step``) on ``workers`` (actor handles
        with a ``validate`` method, holding that version)."""
        import ray

        t0 = time.perf_counter()
        calls = [(w, share) for w, share in zip(workers, self.shares(len(workers))) if share[0]]
        parts = ray.get([w.validate.remote(version, rows, texts, keep) for w, (rows, texts, keep) in calls])
        seconds = time.perf_counter() - t0
        rewards = {p: r for part in parts for p, r in zip(part["prompt_ids"], part["rewards"], strict=True)}
        values = torch.tensor([rewards[p] for p in sorted(rewards)], dtype=torch.float64)
        metrics = {names.VAL_REWARD_MEAN: float(values.mean()),
                   names.VAL_REWARD_STD: float(values.std()) if values.numel() > 1 else 0.0,
                   names.VAL_SAMPLES: float(values.numel()), names.VAL_SECONDS: seconds}
        components = sorted({k for part in parts for k in part["components"]})
        if len(components) > 1:
            for name in components:
                comp = [v for part in parts for v in part["components"].get(name, [])]
                metrics[names.val_component_mean(name)] = sum(comp) / len(comp)
        result = ValidationResult(step, metrics, rewards)
        images = [part["images"] for part in parts if part["images"] is not None]
        if images:
            shown = torch.cat(images)[: self.keep]  # the first prompts' samples, in prompt order
            k = shown.shape[0]
            grid = captioned_grid(shown, self.prompts[:k], [rewards[p] for p in range(k)])
            caption = f"step {step}: first {k} validation prompts, seed {self.cfg.trainer.seed}"
            if self.dir is not None:
                result.png = str(save_png(grid, self.dir / f"{self.cfg.trainer.mode}_step_{step}.png"))
            if tracking is not None:
                log_images(tracking, grid, step, caption)
        if tracking is not None:
            tracking.log(data=metrics, step=step)
        if self.history is not None:
            self.history.append(step, metrics)
        return result


def run_pass(validator: Validator, pools: Any, step: int, tracking: Any | None = None) -> ValidationResult:
    """The validation pass after global step ``step`` on the run's ``RunPools`` (the pipeline has drained):
    the generators get that version first (colocated: the ranks switch to generation and back); with
    ``trainer.val_with_ema`` the EMA stands in for the weights while they are validated."""
    import ray

    from verl_digen.driver.ray_backend import WORKER_METHODS
    from verl_digen.schedule.actions import SWITCH_TO_GEN, SWITCH_TO_TRAIN

    trn_wg, colocated = pools.trn_wg, pools.gen_wg is None
    ema = validator.cfg.trainer.val_with_ema
    if ema:
        ray.get(trn_wg.execute_all_async("use_ema", True))
    if colocated:
        ray.get(trn_wg.execute_all_async(WORKER_METHODS[SWITCH_TO_GEN]))
    else:
        pools.sync.sync(step)
    try:
        return validator.run(trn_wg.workers if colocated else pools.gen_wg.workers, step, step, tracking)
    finally:
        if colocated:
            ray.get(trn_wg.execute_all_async(WORKER_METHODS[SWITCH_TO_TRAIN]))
        if ema:
            ray.get(trn_wg.execute_all_async("use_ema", False))
            if not colocated:  # the generators go on from the trained weights of this version
                pools.sync.sync(step)


def summary(step: int, res: ValidationResult) -> str:
    """The console line of a validation pass."""
    m = res.metrics
    return (f"step {step}: validation reward {m['val/reward_mean']:+.4f} (std {m['val/reward_std']:.4f}, "
            f"{int(m['val/samples'])} prompts, {m['val/seconds']:.2f} s)"
            + (f", samples in {res.png}" if res.png else ""))
